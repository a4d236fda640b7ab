//! The zone's rules as data: the cases of `tests/rules.txt` (shared with the `dig` test,
//! `tests/rule_table_dig.rs`) run against the pure zone, plus snapshot behaviour (shuffling,
//! skipped objects, incremental snapshots) checked with `expect!` (`UPDATE_EXPECT=1` refreshes).

use std::sync::Arc;

use expect_test::{Expect, expect};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::{Outcome, PodMode, Zone, ZoneConfig};
use crate::fixtures::*;
use crate::rule_table::{self, answer_text, world};

fn answer(zone: &Zone, query: &str) -> String {
    answer_text(zone, query).unwrap()
}

fn check_with(zone: &Zone, query: &str, expect: Expect) {
    expect.assert_eq(&answer(zone, query));
}

#[test]
fn rule_table_against_the_zone() {
    let cases = rule_table::cases().unwrap();
    assert!(cases.len() >= 40, "only {} cases parsed", cases.len());
    let zones: Vec<_> = rule_table::setups(&cases)
        .into_iter()
        .map(|(mode, options)| {
            let zone = rule_table::zone_with(mode, &options).unwrap();
            ((mode, options), zone)
        })
        .collect();
    let mut failures = Vec::new();
    for case in &cases {
        let setup = (case.pods, case.options.clone());
        let zone = &zones.iter().find(|(s, _)| *s == setup).unwrap().1;
        for q in &case.queries {
            let got = answer(zone, q);
            if got != case.expected {
                failures.push(format!(
                    "tests/rules.txt:{} {q} ({:?})\n--- expected\n{}--- got\n{}",
                    case.line, case.pods, case.expected, got
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_table_parser_reads_every_part_of_a_block() {
    let cases = rule_table::parse(
        "# c\npods: verified\nquery: a. A\nquery: b. A CH\nNOERROR\nwire:\nNXDOMAIN\n\nquery: c. A\nforward\nwire: skip why\n",
    )
    .unwrap();
    expect![[r#"
        [
            Case {
                line: 3,
                pods: Verified,
                options: [],
                queries: [
                    "a. A",
                    "b. A CH",
                ],
                expected: "NOERROR\n",
                wire: Expect(
                    "NXDOMAIN\n",
                ),
            },
            Case {
                line: 9,
                pods: Insecure,
                options: [],
                queries: [
                    "c. A",
                ],
                expected: "forward\n",
                wire: Skip(
                    "why",
                ),
            },
        ]
    "#]]
    .assert_debug_eq(&cases);
    assert!(rule_table::parse("query: a. A\n").is_err());
}

#[test]
fn headless_answers_are_shuffled() {
    let zone = rule_table::zone(PodMode::Insecure).unwrap();
    let name = Name::from_ascii("myapp-headless.default.svc.cluster.local.").unwrap();
    let mut rng = StdRng::seed_from_u64(42);
    let mut orders = std::collections::HashSet::new();
    for _ in 0..60 {
        let Outcome::Answer(r) = zone.lookup(&name, RecordType::A, DNSClass::IN, &mut rng) else {
            panic!("forwarded");
        };
        assert!(r.answers.is_empty() && r.owned_by_question);
        assert_eq!(r.answer_records().len(), 3);
        orders.insert(
            r.answer_records()
                .iter()
                .map(|r| r.data.to_string())
                .collect::<Vec<_>>(),
        );
    }
    // 3! = 6 orders; 60 draws see them all with overwhelming probability (fixed seed anyway).
    assert_eq!(orders.len(), 6);
}

#[test]
fn bad_objects_are_skipped_with_a_named_warning() {
    let mut objects = world();
    objects
        .services
        .push(external("default", "broken", "bad..name"));
    objects
        .services
        .push(cluster_ip("default", "bad-ip", &["10.96.0.999"], &[]));
    let zone = Zone::build(
        Arc::new(ZoneConfig::new("cluster.local").unwrap()),
        &objects,
        1,
    );
    expect![[r#"
        [
            "Service default/bad-ip: spec.clusterIPs: \"10.96.0.999\" is not an IP address",
            "Service default/broken: spec.externalName: \"bad..name\" is not a DNS name: Malformed label: ",
        ]
    "#]]
    .assert_debug_eq(&zone.warnings());
    // The rest of the zone still answers.
    assert_eq!(zone.service_count(), world().services.len() + 1);
}

#[test]
fn incremental_snapshots_share_unchanged_services_and_see_changes() {
    let config = Arc::new(ZoneConfig::new("cluster.local").unwrap());
    let objects = world();
    let mut state = super::ZoneState::new(config);
    state.replace_namespaces(objects.namespaces.clone());
    state.replace_services(objects.services.clone());
    state.replace_slices(objects.endpoint_slices.clone());
    let first = state.snapshot(1);
    assert!(!state.is_dirty());
    let entry = |z: &Zone, ns: &str, svc: &str| z.namespaces[ns].services[svc].clone();

    // Change one service, drop a slice.
    state.upsert_service(cluster_ip(
        "default",
        "myapp",
        &["10.96.1.1"],
        &[("http", "TCP", 80)],
    ));
    let nginx_slice = objects
        .endpoint_slices
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("nginx-1"))
        .unwrap();
    state.delete_slice(nginx_slice);
    let second = state.snapshot(2);

    // Untouched services and namespaces are shared, not copied.
    assert!(Arc::ptr_eq(
        &entry(&first, "default", "kubernetes"),
        &entry(&second, "default", "kubernetes")
    ));
    assert!(Arc::ptr_eq(
        &first.namespaces["kube-system"],
        &second.namespaces["kube-system"]
    ));
    assert!(!Arc::ptr_eq(
        &entry(&first, "default", "myapp"),
        &entry(&second, "default", "myapp")
    ));
    // The first snapshot is unchanged (immutable).
    check_with(
        &first,
        "myapp.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              myapp.default.svc.cluster.local. 30 IN A 10.96.221.214
        "#]],
    );
    check_with(
        &second,
        "myapp.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              myapp.default.svc.cluster.local. 30 IN A 10.96.1.1
        "#]],
    );
    // nginx lost its only slice: a headless service without endpoints is NXDOMAIN.
    check_with(
        &second,
        "web-0.nginx.default.svc.cluster.local. A",
        expect![[r#"
            NXDOMAIN
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 2 7200 1800 86400 30
        "#]],
    );
    // Reverse entries follow: the old IPs are gone, the new one resolves.
    check_with(
        &second,
        "214.221.96.10.in-addr.arpa. PTR",
        expect![[r#"
            NXDOMAIN
            authority:
              96.10.in-addr.arpa. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 2 7200 1800 86400 30
        "#]],
    );
    check_with(
        &second,
        "1.1.96.10.in-addr.arpa. PTR",
        expect![[r#"
            NOERROR
            answer:
              1.1.96.10.in-addr.arpa. 30 IN PTR myapp.default.svc.cluster.local.
        "#]],
    );
    check_with(
        &second,
        "10.1.244.10.in-addr.arpa. PTR",
        expect![[r#"
            NXDOMAIN
            authority:
              244.10.in-addr.arpa. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 2 7200 1800 86400 30
        "#]],
    );

    // Deleting the service removes it; a relist equal to the current objects changes nothing.
    let myapp = second.namespaces["default"].services["myapp"].fqdn.clone();
    state.delete_service(&cluster_ip("default", "myapp", &[], &[]));
    let third = state.snapshot(3);
    assert!(!third.namespaces["default"].services.contains_key("myapp"));
    assert_eq!(myapp.to_string(), "myapp.default.svc.cluster.local.");
    let services: Vec<_> = objects
        .services
        .iter()
        .filter(|s| s.metadata.name.as_deref() != Some("myapp"))
        .cloned()
        .collect();
    state.replace_services(services);
    assert!(
        !state.is_dirty(),
        "a relist of the same objects must not dirty anything"
    );

    // A full rebuild of the final objects answers exactly like the incremental state.
    let mut final_objects = world();
    final_objects
        .services
        .retain(|s| s.metadata.name.as_deref() != Some("myapp"));
    final_objects
        .endpoint_slices
        .retain(|s| s.metadata.name.as_deref() != Some("nginx-1"));
    let full = Zone::build(
        Arc::new(ZoneConfig::new("cluster.local").unwrap()),
        &final_objects,
        3,
    );
    for q in [
        "myapp.default.svc.cluster.local. A",
        "nginx.default.svc.cluster.local. A",
        "myapp-headless.default.svc.cluster.local. A",
        "167.236.18.172.in-addr.arpa. PTR",
        "_http._tcp.myapp.default.svc.cluster.local. SRV",
        "quiet.svc.cluster.local. A",
    ] {
        assert_eq!(answer(&third, q), answer(&full, q), "{q}");
    }
}

#[test]
fn relists_compare_what_the_zone_reads_not_pointers_or_versions() {
    let versioned = |svc: &Arc<k8s_openapi::api::core::v1::Service>, rv: &str| {
        let mut s = (**svc).clone();
        s.metadata.resource_version = Some(rv.into());
        s.metadata.uid = Some(format!("uid-{}", s.metadata.name.clone().unwrap()));
        Arc::new(s)
    };
    let objects = world();
    let v1: Vec<_> = objects.services.iter().map(|s| versioned(s, "1")).collect();
    let mut state = super::ZoneState::new(Arc::new(ZoneConfig::new("cluster.local").unwrap()));
    state.replace_namespaces(objects.namespaces.clone());
    state.replace_services(v1.clone());
    state.replace_slices(objects.endpoint_slices.clone());
    state.snapshot(1);
    // A relist delivers fresh Arcs of the same versions: nothing to re-index.
    state.replace_services(objects.services.iter().map(|s| versioned(s, "1")));
    assert!(!state.is_dirty());
    // A new version that changes nothing DNS reads (a label, an annotation): nothing either.
    let mut relist: Vec<_> = objects.services.iter().map(|s| versioned(s, "1")).collect();
    relist[0] = versioned(&relist[0], "2");
    state.replace_services(relist.clone());
    assert!(!state.is_dirty());
    // A new version with a new port: dirty again.
    let mut changed = (*relist[0]).clone();
    if let Some(spec) = changed.spec.as_mut() {
        spec.ports
            .get_or_insert_default()
            .push(k8s_openapi::api::core::v1::ServicePort {
                name: Some("new".into()),
                port: 4321,
                ..Default::default()
            });
    }
    changed.metadata.resource_version = Some("3".into());
    relist[0] = Arc::new(changed);
    state.replace_services(relist);
    assert!(state.is_dirty());
}
