use super::*;
use crate::fixtures::*;
use expect_test::{Expect, expect};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn zones() -> NodeZones {
    node_zones(&[node("node-a", Some("zone-a")), node("node-b", None)])
}

/// Applies a plan the way an API server would: generated names, fresh resourceVersions.
fn apply(existing: &[EndpointSlice], plan: &SlicePlan, counter: &mut u32) -> Vec<EndpointSlice> {
    let mut out: BTreeMap<String, EndpointSlice> = existing
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap(), s.clone()))
        .collect();
    for s in &plan.delete {
        assert!(
            out.remove(s.metadata.name.as_ref().unwrap()).is_some(),
            "delete of unknown slice"
        );
    }
    for s in &plan.update {
        let name = s.metadata.name.clone().unwrap();
        let old = out.get(&name).expect("update of unknown slice");
        assert_eq!(
            old.metadata.resource_version, s.metadata.resource_version,
            "stale update"
        );
        assert_eq!(old.address_type, s.address_type, "addressType is immutable");
        let mut s = s.clone();
        *counter += 1;
        s.metadata.resource_version = Some(counter.to_string());
        out.insert(name, s);
    }
    for s in &plan.create {
        assert!(s.metadata.name.is_none());
        *counter += 1;
        let mut s = s.clone();
        s.metadata.name = Some(format!(
            "{}{:05}",
            s.metadata.generate_name.clone().unwrap(),
            counter
        ));
        s.metadata.resource_version = Some(counter.to_string());
        out.insert(s.metadata.name.clone().unwrap(), s);
    }
    out.into_values().collect()
}

fn run(svc: &Service, pods: &[Pod], existing: &[EndpointSlice], max: usize) -> SlicePlan {
    let pods: Vec<&Pod> = pods.iter().collect();
    let existing: Vec<&EndpointSlice> = existing.iter().collect();
    plan(svc, &pods, &zones(), &existing, max)
}

/// Plans, applies, and checks that planning again is a no-op (the controller converges).
fn converge(
    svc: &Service,
    pods: &[Pod],
    existing: &[EndpointSlice],
    counter: &mut u32,
) -> (SlicePlan, Vec<EndpointSlice>) {
    let p = run(svc, pods, existing, 100);
    let after = apply(existing, &p, counter);
    let again = run(svc, pods, &after, 100);
    assert!(again.is_empty(), "not converged: {again:#?}");
    (p, after)
}

fn render_slice(s: &EndpointSlice) -> String {
    let mut out = format!(
        "{} {} ports=[{}]\n",
        s.metadata
            .name
            .as_deref()
            .or(s.metadata.generate_name.as_deref())
            .unwrap_or("?"),
        s.address_type,
        s.ports
            .iter()
            .flatten()
            .map(|p| format!(
                "{}:{}/{}",
                p.name.as_deref().unwrap_or(""),
                p.port.unwrap_or(0),
                p.protocol.as_deref().unwrap_or("")
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    for ep in &s.endpoints {
        let c = ep.conditions.clone().unwrap_or_default();
        let flag = |b: Option<bool>| if b == Some(true) { "1" } else { "0" };
        out += &format!(
            "  {} ready={} serving={} terminating={} node={} zone={} host={} pod={}\n",
            ep.addresses.join(","),
            flag(c.ready),
            flag(c.serving),
            flag(c.terminating),
            ep.node_name.as_deref().unwrap_or("-"),
            ep.zone.as_deref().unwrap_or("-"),
            ep.hostname.as_deref().unwrap_or("-"),
            ep.target_ref
                .as_ref()
                .and_then(|t| t.name.as_deref())
                .unwrap_or("-"),
        );
    }
    out
}

fn render(p: &SlicePlan) -> String {
    let mut out = String::new();
    for (verb, list) in [
        ("create", &p.create),
        ("update", &p.update),
        ("delete", &p.delete),
    ] {
        for s in list {
            out += &format!("{verb} {}", render_slice(s));
        }
    }
    if !p.missing_nodes.is_empty() {
        out += &format!("missing nodes: {:?}\n", p.missing_nodes);
    }
    out
}

fn check(svc: &Service, pods: &[Pod], expect: Expect) {
    let mut n = 0;
    let (p, _) = converge(svc, pods, &[], &mut n);
    expect.assert_eq(&render(&p));
}

fn web(name: &str, ip: &str) -> Pod {
    pod("default", name, |p| {
        p.ip(ip);
    })
}

fn web_svc() -> Service {
    service("default", "web", |_| {})
}

#[test]
fn new_slice_has_upstream_metadata() {
    let p = run(&web_svc(), &[web("web-1", "10.244.0.5")], &[], 100);
    assert_eq!(p.create.len(), 1);
    let s = &p.create[0];
    assert_eq!(s.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(s.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        s.metadata.labels,
        Some(map(&[
            (LABEL_MANAGED_BY, ENDPOINTSLICE_CONTROLLER_NAME),
            (LABEL_SERVICE_NAME, "web")
        ]))
    );
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        ("v1", "Service", "web")
    );
    assert_eq!(owner.uid, "uid-web");
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    let ep = &s.endpoints[0];
    let t = ep.target_ref.as_ref().unwrap();
    assert_eq!(
        (
            t.kind.as_deref(),
            t.namespace.as_deref(),
            t.name.as_deref(),
            t.uid.as_deref()
        ),
        (
            Some("Pod"),
            Some("default"),
            Some("web-1"),
            Some("uid-web-1")
        )
    );
}

#[test]
fn conditions_table() {
    // (pod ready, pod deleting, publishNotReadyAddresses) -> (ready, serving, terminating)
    let cases = [
        ((true, false, false), (true, true, false)),
        ((false, false, false), (false, false, false)),
        ((true, true, false), (false, true, true)),
        ((false, true, false), (false, false, true)),
        ((false, false, true), (true, false, false)),
        ((true, true, true), (true, true, true)),
        ((false, true, true), (true, false, true)),
    ];
    for ((ready, deleting, publish), want) in cases {
        let svc = service("default", "web", |s| {
            if publish {
                s.publish_not_ready();
            }
        });
        let pod = pod("default", "p", |p| {
            p.ip("10.244.0.9").ready(ready);
            if deleting {
                p.deleting();
            }
        });
        let plan = run(&svc, &[pod], &[], 100);
        let c = plan.create[0].endpoints[0].conditions.clone().unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(want.0), Some(want.1), Some(want.2)),
            "case ready={ready} deleting={deleting} publish={publish}"
        );
    }
}

#[test]
fn pods_left_out() {
    check(
        &web_svc(),
        &[
            web("a-ok", "10.244.0.1"),
            pod("default", "b-no-ip", |_| {}),
            pod("default", "c-succeeded", |p| {
                p.ip("10.244.0.3").phase("Succeeded");
            }),
            pod("default", "d-failed", |p| {
                p.ip("10.244.0.4").phase("Failed");
            }),
            pod("default", "e-other-app", |p| {
                p.ip("10.244.0.5").labels(&[("app", "db")]);
            }),
            pod("other", "f-other-ns", |p| {
                p.ip("10.244.0.6");
            }),
            pod("default", "g-pending-unready", |p| {
                p.ip("10.244.0.7").phase("Pending").ready(false);
            }),
        ],
        expect![[r#"
            create web- IPv4 ports=[http:8080/TCP]
              10.244.0.1 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=- pod=a-ok
              10.244.0.7 ready=0 serving=0 terminating=0 node=node-a zone=zone-a host=- pod=g-pending-unready
        "#]],
    );
}

#[test]
fn named_ports_resolve_per_pod() {
    let svc = service("default", "web", |s| {
        s.ports(&[("http", 80, IntOrString::String("web".into()))]);
    });
    check(
        &svc,
        &[
            pod("default", "old", |p| {
                p.ip("10.244.0.1").container_port("web", 8080);
            }),
            pod("default", "new", |p| {
                p.ip("10.244.0.2").container_port("web", 9090);
            }),
            pod("default", "also-new", |p| {
                p.ip("10.244.0.3").container_port("web", 9090);
            }),
            // A pod without the named port is an endpoint with no ports (upstream's behaviour).
            pod("default", "none", |p| {
                p.ip("10.244.0.4").container_port("metrics", 9100);
            }),
        ],
        expect![[r#"
            create web- IPv4 ports=[]
              10.244.0.4 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=- pod=none
            create web- IPv4 ports=[http:8080/TCP]
              10.244.0.1 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=- pod=old
            create web- IPv4 ports=[http:9090/TCP]
              10.244.0.3 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=- pod=also-new
              10.244.0.2 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=- pod=new
        "#]],
    );
}

#[test]
fn dual_stack_one_slice_per_family() {
    let svc = service("default", "web", |s| {
        s.families(&["IPv6", "IPv4"]);
    });
    check(
        &svc,
        &[
            pod("default", "both", |p| {
                p.ips(&["10.244.0.1", "fd00:10:244::0001"]);
            }),
            pod("default", "v4-only", |p| {
                p.ip("10.244.0.2");
            }),
        ],
        expect![[r#"
            create web- IPv4 ports=[http:8080/TCP]
              10.244.0.1 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=- pod=both
              10.244.0.2 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=- pod=v4-only
            create web- IPv6 ports=[http:8080/TCP]
              fd00:10:244::1 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=- pod=both
        "#]],
    );
}

#[test]
fn family_removed_deletes_its_slices() {
    let mut n = 0;
    let dual = service("default", "web", |s| {
        s.families(&["IPv4", "IPv6"]);
    });
    let pods = [pod("default", "p", |p| {
        p.ips(&["10.244.0.1", "fd00::1"]);
    })];
    let (_, slices) = converge(&dual, &pods, &[], &mut n);
    assert_eq!(slices.len(), 2);
    let (p, slices) = converge(&web_svc(), &pods, &slices, &mut n);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 0, 1));
    assert_eq!(p.delete[0].address_type, "IPv6");
    assert_eq!(slices.len(), 1);
}

#[test]
fn hostname_zone_and_missing_nodes() {
    let svc = service("default", "web", |s| {
        s.headless();
    });
    check(
        &svc,
        &[
            pod("default", "web-0", |p| {
                p.ip("10.244.0.1").hostname("web-0", "web");
            }),
            pod("default", "web-1", |p| {
                p.ip("10.244.0.2")
                    .hostname("web-1", "other-svc")
                    .node("node-b");
            }),
            pod("default", "web-2", |p| {
                p.ip("10.244.0.3").node("gone-node");
            }),
        ],
        expect![[r#"
            create web- IPv4 ports=[http:8080/TCP]
              10.244.0.1 ready=1 serving=1 terminating=0 node=node-a zone=zone-a host=web-0 pod=web-0
              10.244.0.2 ready=1 serving=1 terminating=0 node=node-b zone=- host=- pod=web-1
            missing nodes: {"gone-node"}
        "#]],
    );
    let p = run(&svc, &[], &[], 100);
    assert_eq!(
        p.create[0]
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get(LABEL_HEADLESS)
            .map(String::as_str),
        Some("")
    );
    // With publishNotReadyAddresses the pod on an unknown node is published anyway.
    let mut svc = svc;
    svc.publish_not_ready();
    let p = run(
        &svc,
        &[pod("default", "x", |p| {
            p.ip("10.244.0.3").node("gone-node");
        })],
        &[],
        100,
    );
    assert!(p.missing_nodes.is_empty());
    assert_eq!(p.create[0].endpoints.len(), 1);
}

fn many(n: usize) -> Vec<Pod> {
    (0..n)
        .map(|i| {
            pod("default", &format!("web-{i:04}"), |p| {
                p.ip(&format!("10.244.{}.{}", i / 200, i % 200 + 1));
            })
        })
        .collect()
}

#[test]
fn split_at_max_and_minimise_churn() {
    let mut n = 0;
    let svc = web_svc();
    let (p, slices) = converge(&svc, &many(250), &[], &mut n);
    let mut sizes: Vec<usize> = p.create.iter().map(|s| s.endpoints.len()).collect();
    sizes.sort();
    assert_eq!(sizes, vec![50, 100, 100]);

    // One more pod: only the partly-full slice changes.
    let (p, slices) = converge(&svc, &many(251), &slices, &mut n);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
    assert_eq!(p.update[0].endpoints.len(), 51);

    // One pod becomes unready: only its slice changes, in place.
    let mut pods = many(251);
    pods[7].ready(false);
    let (p, slices) = converge(&svc, &pods, &slices, &mut n);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
    assert!(
        p.update[0]
            .endpoints
            .iter()
            .any(|e| e.target_ref.as_ref().unwrap().name.as_deref() == Some("web-0007"))
    );

    // Removing the 100 pods of one full slice deletes that slice and touches nothing else.
    let victim = slices
        .iter()
        .find(|s| s.endpoints.len() == 100)
        .unwrap()
        .clone();
    let gone: BTreeSet<String> = victim
        .endpoints
        .iter()
        .map(|e| e.target_ref.clone().unwrap().name.unwrap())
        .collect();
    let remaining: Vec<Pod> = pods
        .into_iter()
        .filter(|p| !gone.contains(p.metadata.name.as_ref().unwrap()))
        .collect();
    let (p, slices) = converge(&svc, &remaining, &slices, &mut n);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 0, 1));
    assert_eq!(p.delete[0].metadata.name, victim.metadata.name);
    assert_eq!(slices.iter().map(|s| s.endpoints.len()).sum::<usize>(), 151);

    // Ten new pods fit in the unchanged slice closest to full.
    let mut more = remaining.clone();
    more.extend(many(1000).into_iter().skip(990));
    let (p, _) = converge(&svc, &more, &slices, &mut n);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
    assert_eq!(p.update[0].endpoints.len(), 61);
}

#[test]
fn empty_service_keeps_one_placeholder() {
    let mut n = 0;
    let svc = web_svc();
    let (p, slices) = converge(&svc, &[], &[], &mut n);
    expect![[r#"
        create web- IPv4 ports=[]
    "#]]
    .assert_eq(&render(&p));
    // Pods appear: the placeholder is deleted and a real slice created; planned as one update.
    let (p, slices) = converge(&svc, &[web("a", "10.244.0.1")], &slices, &mut n);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
    assert_eq!(slices.len(), 1);
    // All pods gone again: the slice is recycled as the placeholder.
    let (p, slices) = converge(&svc, &[], &slices, &mut n);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
    assert!(slices[0].endpoints.is_empty());
}

#[test]
fn service_labels_and_selector_changes() {
    let mut n = 0;
    let pods = [web("a", "10.244.0.1")];
    let (_, slices) = converge(&web_svc(), &pods, &[], &mut n);
    let labelled = service("default", "web", |s| {
        s.metadata.labels = Some(map(&[("team", "blue"), (LABEL_MANAGED_BY, "someone-else")]));
    });
    let (p, slices) = converge(&labelled, &pods, &slices, &mut n);
    assert_eq!(p.update.len(), 1);
    let labels = p.update[0].metadata.labels.clone().unwrap();
    assert_eq!(labels.get("team").map(String::as_str), Some("blue"));
    assert_eq!(
        labels.get(LABEL_MANAGED_BY).map(String::as_str),
        Some(ENDPOINTSLICE_CONTROLLER_NAME)
    );
    // Selector removed: our slices go away.
    let selectorless = service("default", "web", |s| {
        s.no_selector();
    });
    let refs: Vec<&EndpointSlice> = slices.iter().collect();
    let p = plan(&selectorless, &[], &zones(), &refs, 100);
    assert_eq!(p.delete.len(), 1);
}

#[test]
fn slices_of_a_previous_service_with_the_same_name_are_replaced() {
    let mut n = 0;
    let pods = [web("a", "10.244.0.1")];
    let (_, slices) = converge(&web_svc(), &pods, &[], &mut n);
    let reborn = service("default", "web", |s| {
        s.metadata.uid = Some("uid-web-2".into());
    });
    let (p, slices) = converge(&reborn, &pods, &slices, &mut n);
    // Not owned, so not recycled: deleted, and a new slice created.
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (1, 0, 1));
    assert_eq!(
        slices[0].metadata.owner_references.as_ref().unwrap()[0].uid,
        "uid-web-2"
    );
}
