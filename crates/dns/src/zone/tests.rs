//! The zone's rules as data: one `check("name TYPE", expect)` per case. Sections are printed
//! sorted (they are sets). `UPDATE_EXPECT=1 cargo test -p svcnet-dns` refreshes the snapshots.

use std::sync::Arc;

use expect_test::{Expect, expect};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::{Objects, Outcome, PodMode, Zone, ZoneConfig};
use crate::fixtures::*;

fn world() -> Objects {
    Objects {
        services: vec![
            cluster_ip(
                "default",
                "kubernetes",
                &["10.96.0.1"],
                &[("https", "TCP", 443)],
            ),
            cluster_ip(
                "default",
                "myapp",
                &["10.96.221.214"],
                &[("http", "TCP", 80)],
            ),
            headless("default", "myapp-headless", &[("", "TCP", 80)]),
            headless("default", "nginx", &[("web", "TCP", 80)]),
            headless("default", "peers", &[("peer", "TCP", 2380)]).publish_not_ready(),
            headless("default", "empty-headless", &[("web", "TCP", 80)]),
            external("default", "my-service-1", "www.baidu.com"),
            external("default", "alias", "MyApp.default.svc.cluster.local"),
            external("default", "dangling", "nothing.default.svc.cluster.local"),
            external("default", "loop-a", "loop-b.default.svc.cluster.local"),
            external("default", "loop-b", "loop-a.default.svc.cluster.local"),
            cluster_ip(
                "default",
                "dual",
                &["10.96.0.50", "fd00:10:96::50"],
                &[("http", "TCP", 80), ("", "UDP", 53)],
            ),
            cluster_ip(
                "kube-system",
                "kube-dns",
                &["10.96.0.10"],
                &[("dns", "UDP", 53), ("dns-tcp", "TCP", 53)],
            ),
        ],
        endpoint_slices: vec![
            slice("default", "myapp", "myapp-1", &[("http", "TCP", 8080)])
                .ep("172.18.236.167", None, true)
                .ep("172.18.236.168", None, true)
                .ep("172.18.235.168", None, true)
                .ep("172.18.235.200", None, false),
            slice("default", "myapp-headless", "mh-1", &[("", "TCP", 80)])
                .ep("172.18.236.167", None, true)
                .ep("172.18.236.168", None, true)
                .ep("172.18.235.168", None, true),
            slice("default", "nginx", "nginx-1", &[("web", "TCP", 8080)])
                .ep("10.244.1.10", Some("web-0"), true)
                .ep("10.244.1.11", Some("web-1"), true)
                .ep("10.244.1.12", Some("web-2"), false),
            slice("default", "peers", "peers-1", &[("peer", "TCP", 2380)])
                .ep("10.244.2.1", Some("etcd-0"), true)
                .ep("10.244.2.2", Some("etcd-1"), false),
            slice("default", "empty-headless", "eh-1", &[("web", "TCP", 80)]).ep(
                "10.244.3.1",
                None,
                false,
            ),
        ],
        pods: vec![pod("default", "web-0", "10.244.1.10")],
        namespaces: vec![
            namespace("default"),
            namespace("kube-system"),
            namespace("quiet"),
        ],
    }
}

fn zone_with(pods: PodMode) -> Zone {
    let mut config = ZoneConfig::new("cluster.local").unwrap();
    config.pods = pods;
    Zone::build(Arc::new(config), &world(), 1700000000)
}

fn answer_text(zone: &Zone, query: &str) -> String {
    let (name, qtype) = query.rsplit_once(' ').unwrap();
    let name = Name::from_ascii(name).unwrap();
    let qtype: RecordType = qtype.parse().unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    match zone.lookup(&name, qtype, DNSClass::IN, &mut rng) {
        Outcome::Forward => "forward\n".to_string(),
        Outcome::Answer(r) => r.to_string(),
    }
}

fn check_with(zone: &Zone, query: &str, expect: Expect) {
    expect.assert_eq(&answer_text(zone, query));
}

/// Every query gets the same answer text, checked once against `expect`.
fn check_all(queries: &[&str], expect: Expect) {
    let zone = zone_with(PodMode::Insecure);
    let first = answer_text(&zone, queries[0]);
    for q in &queries[1..] {
        assert_eq!(
            answer_text(&zone, q),
            first,
            "{q} differs from {}",
            queries[0]
        );
    }
    expect.assert_eq(&first);
}

fn check(query: &str, expect: Expect) {
    check_with(&zone_with(PodMode::Insecure), query, expect);
}

#[test]
fn cluster_ip_service() {
    check(
        "myapp.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              myapp.default.svc.cluster.local. 30 IN A 10.96.221.214
        "#]],
    );
    // NODATA: the name exists, AAAA does not.
    check(
        "myapp.default.svc.cluster.local. AAAA",
        expect![[r#"
            NOERROR
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    check(
        "dual.default.svc.cluster.local. AAAA",
        expect![[r#"
            NOERROR
            answer:
              dual.default.svc.cluster.local. 30 IN AAAA fd00:10:96::50
        "#]],
    );
}

#[test]
fn case_insensitive_and_keeps_the_question_case() {
    check(
        "MyApp.Default.SVC.Cluster.Local. A",
        expect![[r#"
            NOERROR
            answer:
              MyApp.Default.SVC.Cluster.Local. 30 IN A 10.96.221.214
        "#]],
    );
}

#[test]
fn srv_records() {
    check(
        "_http._tcp.myapp.default.svc.cluster.local. SRV",
        expect![[r#"
            NOERROR
            answer:
              _http._tcp.myapp.default.svc.cluster.local. 30 IN SRV 0 100 80 myapp.default.svc.cluster.local.
            additional:
              myapp.default.svc.cluster.local. 30 IN A 10.96.221.214
        "#]],
    );
    // Headless: one per endpoint, endpoint port, endpoint name; weight 100/N.
    check(
        "_web._tcp.nginx.default.svc.cluster.local. SRV",
        expect![[r#"
            NOERROR
            answer:
              _web._tcp.nginx.default.svc.cluster.local. 30 IN SRV 0 50 8080 web-0.nginx.default.svc.cluster.local.
              _web._tcp.nginx.default.svc.cluster.local. 30 IN SRV 0 50 8080 web-1.nginx.default.svc.cluster.local.
            additional:
              web-0.nginx.default.svc.cluster.local. 30 IN A 10.244.1.10
              web-1.nginx.default.svc.cluster.local. 30 IN A 10.244.1.11
        "#]],
    );
    // The bare service name answers SRV for every port (CoreDNS), dual-stack glue.
    check(
        "dual.default.svc.cluster.local. SRV",
        expect![[r#"
            NOERROR
            answer:
              dual.default.svc.cluster.local. 30 IN SRV 0 50 53 dual.default.svc.cluster.local.
              dual.default.svc.cluster.local. 30 IN SRV 0 50 80 dual.default.svc.cluster.local.
            additional:
              dual.default.svc.cluster.local. 30 IN A 10.96.0.50
              dual.default.svc.cluster.local. 30 IN AAAA fd00:10:96::50
        "#]],
    );
    // Wrong protocol or unknown port name: NXDOMAIN; other types on an SRV name: NODATA.
    check(
        "_http._udp.myapp.default.svc.cluster.local. SRV",
        expect![[r#"
            NXDOMAIN
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    check(
        "_http._tcp.myapp.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    // `_tcp.<svc>` is an empty non-terminal.
    check(
        "_tcp.myapp.default.svc.cluster.local. SRV",
        expect![[r#"
            NOERROR
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
}

#[test]
fn headless_services() {
    // The seed's three pod IPs.
    check(
        "myapp-headless.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              myapp-headless.default.svc.cluster.local. 30 IN A 172.18.235.168
              myapp-headless.default.svc.cluster.local. 30 IN A 172.18.236.167
              myapp-headless.default.svc.cluster.local. 30 IN A 172.18.236.168
        "#]],
    );
    // Ready endpoints only...
    check(
        "nginx.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              nginx.default.svc.cluster.local. 30 IN A 10.244.1.10
              nginx.default.svc.cluster.local. 30 IN A 10.244.1.11
        "#]],
    );
    // ...all of them with publishNotReadyAddresses...
    check(
        "peers.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              peers.default.svc.cluster.local. 30 IN A 10.244.2.1
              peers.default.svc.cluster.local. 30 IN A 10.244.2.2
        "#]],
    );
    // ...and NXDOMAIN when none is ready.
    check(
        "empty-headless.default.svc.cluster.local. A",
        expect![[r#"
            NXDOMAIN
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
}

#[test]
fn endpoint_names() {
    // The StatefulSet name of the seeds.
    check(
        "web-0.nginx.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              web-0.nginx.default.svc.cluster.local. 30 IN A 10.244.1.10
        "#]],
    );
    // Not ready, so not published.
    check(
        "web-2.nginx.default.svc.cluster.local. A",
        expect![[r#"
            NXDOMAIN
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    check(
        "etcd-1.peers.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              etcd-1.peers.default.svc.cluster.local. 30 IN A 10.244.2.2
        "#]],
    );
    // No hostname: the dashed IP.
    check(
        "172-18-236-167.myapp-headless.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              172-18-236-167.myapp-headless.default.svc.cluster.local. 30 IN A 172.18.236.167
        "#]],
    );
}

#[test]
fn external_name() {
    // Out of zone: the CNAME, and the transport chases the target upstream.
    check(
        "my-service-1.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              my-service-1.default.svc.cluster.local. 30 IN CNAME www.baidu.com.
            chase: www.baidu.com.
        "#]],
    );
    check(
        "my-service-1.default.svc.cluster.local. CNAME",
        expect![[r#"
            NOERROR
            answer:
              my-service-1.default.svc.cluster.local. 30 IN CNAME www.baidu.com.
        "#]],
    );
    // In zone: the chain is resolved in the same answer.
    check(
        "alias.default.svc.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              MyApp.default.svc.cluster.local. 30 IN A 10.96.221.214
              alias.default.svc.cluster.local. 30 IN CNAME MyApp.default.svc.cluster.local.
        "#]],
    );
    // The rcode is the last name's.
    check(
        "dangling.default.svc.cluster.local. A",
        expect![[r#"
            NXDOMAIN
            answer:
              dangling.default.svc.cluster.local. 30 IN CNAME nothing.default.svc.cluster.local.
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    check(
        "loop-a.default.svc.cluster.local. A",
        expect![[r#"
            SERVFAIL
            answer:
              loop-a.default.svc.cluster.local. 30 IN CNAME loop-b.default.svc.cluster.local.
              loop-b.default.svc.cluster.local. 30 IN CNAME loop-a.default.svc.cluster.local.
        "#]],
    );
}

#[test]
fn reverse_lookups() {
    check(
        "214.221.96.10.in-addr.arpa. PTR",
        expect![[r#"
            NOERROR
            answer:
              214.221.96.10.in-addr.arpa. 30 IN PTR myapp.default.svc.cluster.local.
        "#]],
    );
    check(
        "0.5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa. PTR",
        expect![[r#"
            NOERROR
            answer:
              0.5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa. 30 IN PTR dual.default.svc.cluster.local.
        "#]],
    );
    // An endpoint IP: every endpoint name with that IP (outside the CIDRs, but in the index).
    check(
        "167.236.18.172.in-addr.arpa. PTR",
        expect![[r#"
            NOERROR
            answer:
              167.236.18.172.in-addr.arpa. 30 IN PTR 172-18-236-167.myapp-headless.default.svc.cluster.local.
              167.236.18.172.in-addr.arpa. 30 IN PTR 172-18-236-167.myapp.default.svc.cluster.local.
        "#]],
    );
    check(
        "10.1.244.10.in-addr.arpa. PTR",
        expect![[r#"
            NOERROR
            answer:
              10.1.244.10.in-addr.arpa. 30 IN PTR web-0.nginx.default.svc.cluster.local.
        "#]],
    );
    // Unknown, inside the service CIDR: ours, NXDOMAIN.
    check(
        "99.99.96.10.in-addr.arpa. PTR",
        expect![[r#"
            NXDOMAIN
            authority:
              in-addr.arpa. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    // Unknown and outside: the upstream's. Partial reverse names too.
    check("8.8.8.8.in-addr.arpa. PTR", expect!["forward\n"]);
    check("96.10.in-addr.arpa. SOA", expect!["forward\n"]);
}

#[test]
fn pod_records() {
    let insecure = zone_with(PodMode::Insecure);
    check_with(
        &insecure,
        "10-244-9-9.default.pod.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              10-244-9-9.default.pod.cluster.local. 30 IN A 10.244.9.9
        "#]],
    );
    check_with(
        &insecure,
        "fd00-10-244--9.default.pod.cluster.local. AAAA",
        expect![[r#"
            NOERROR
            answer:
              fd00-10-244--9.default.pod.cluster.local. 30 IN AAAA fd00:10:244::9
        "#]],
    );
    check_with(
        &insecure,
        "10-244-9-9.nowhere.pod.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              10-244-9-9.nowhere.pod.cluster.local. 30 IN A 10.244.9.9
        "#]],
    );
    check_with(
        &insecure,
        "not-an-ip.default.pod.cluster.local. A",
        expect![[r#"
            NXDOMAIN
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    let verified = zone_with(PodMode::Verified);
    check_with(
        &verified,
        "10-244-1-10.default.pod.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              10-244-1-10.default.pod.cluster.local. 30 IN A 10.244.1.10
        "#]],
    );
    check_with(
        &verified,
        "10-244-9-9.default.pod.cluster.local. A",
        expect![[r#"
            NXDOMAIN
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    let disabled = zone_with(PodMode::Disabled);
    check_with(
        &disabled,
        "10-244-1-10.default.pod.cluster.local. A",
        expect![[r#"
            NXDOMAIN
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
}

#[test]
fn apex_version_and_intermediate_names() {
    check(
        "cluster.local. SOA",
        expect![[r#"
            NOERROR
            answer:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    check(
        "cluster.local. NS",
        expect![[r#"
            NOERROR
            answer:
              cluster.local. 30 IN NS ns.dns.cluster.local.
            additional:
              ns.dns.cluster.local. 30 IN A 10.96.0.10
        "#]],
    );
    check(
        "ns.dns.cluster.local. A",
        expect![[r#"
            NOERROR
            answer:
              ns.dns.cluster.local. 30 IN A 10.96.0.10
        "#]],
    );
    check(
        "dns-version.cluster.local. TXT",
        expect![[r#"
            NOERROR
            answer:
              dns-version.cluster.local. 28800 IN TXT 1.1.0
        "#]],
    );
    check_all(
        &[
            "cluster.local. A",
            "svc.cluster.local. A",
            "default.svc.cluster.local. A",
            "quiet.svc.cluster.local. A",
            "pod.cluster.local. A",
            "dns-version.cluster.local. A",
        ],
        expect![[r#"
            NOERROR
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
    check_all(
        &[
            "nowhere.svc.cluster.local. A",
            "nothing.default.svc.cluster.local. A",
            "foo.cluster.local. A",
            "a.b.web-0.nginx.default.svc.cluster.local. A",
            "x.my-service-1.default.svc.cluster.local. A",
            // Wildcards were removed from CoreDNS in 1.9 (information disclosure): NXDOMAIN.
            "*.default.svc.cluster.local. A",
            "any.default.svc.cluster.local. A",
            "myapp.*.svc.cluster.local. A",
        ],
        expect![[r#"
            NXDOMAIN
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    );
}

#[test]
fn out_of_zone_and_classes() {
    check("www.baidu.com. A", expect!["forward\n"]);
    check("local. SOA", expect!["forward\n"]);
    let zone = zone_with(PodMode::Insecure);
    let name = Name::from_ascii("myapp.default.svc.cluster.local.").unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    match zone.lookup(&name, RecordType::A, DNSClass::CH, &mut rng) {
        Outcome::Answer(r) => expect![[r#"
            REFUSED
        "#]]
        .assert_eq(&r.to_string()),
        Outcome::Forward => panic!("CH in the zone must not be forwarded"),
    }
    check(
        "cluster.local. AXFR",
        expect![[r#"
        REFUSED
    "#]],
    );
}

#[test]
fn headless_answers_are_shuffled() {
    let zone = zone_with(PodMode::Insecure);
    let name = Name::from_ascii("myapp-headless.default.svc.cluster.local.").unwrap();
    let mut rng = StdRng::seed_from_u64(42);
    let mut orders = std::collections::HashSet::new();
    for _ in 0..60 {
        let Outcome::Answer(r) = zone.lookup(&name, RecordType::A, DNSClass::IN, &mut rng) else {
            panic!("forwarded");
        };
        assert_eq!(r.answers.len(), 3);
        orders.insert(
            r.answers
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
              in-addr.arpa. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 2 7200 1800 86400 30
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
              in-addr.arpa. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 2 7200 1800 86400 30
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
        assert_eq!(answer_text(&third, q), answer_text(&full, q), "{q}");
    }
}

#[test]
fn relists_compare_object_versions_not_just_pointers() {
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
    // One new version: dirty again.
    let mut relist: Vec<_> = objects.services.iter().map(|s| versioned(s, "1")).collect();
    relist[0] = versioned(&relist[0], "2");
    state.replace_services(relist);
    assert!(state.is_dirty());
}
