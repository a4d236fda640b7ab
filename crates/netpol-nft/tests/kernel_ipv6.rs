//! Dual-stack enforcement in the kernel: three dual-stack pods routed by a node (network
//! namespaces this test creates, IPv4 10.244.<i>.2 and IPv6 fd00:244:<i>::2), the `ip` and
//! the `ip6` table rendered incrementally from one model, and every ordered pair probed
//! over both families after each case, compared with the evaluator judging the connection
//! over that family (`Cluster::check_over`: an `ipBlock` matches a pod by its address of
//! the packet's family).
//!
//! svcnet up's pods are IPv4 only (its pod network hands out IPv4 addresses), so this is
//! where the IPv6 table is proven.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::policy;
use serde_json::json;
use svcnet_libnft::{Family, NftExecutor};
use svcnet_netns::test_support::{Lab, tcp_ask};
use svcnet_netpol::{
    Cluster, Connection, Endpoint, IpFamily, NamedPort, Namespace, Pod, Policy, Protocol,
};
use svcnet_netpol_nft::{Enforcer, Options, Renderer, render};

const NODE: &str = "node";
/// (namespace, pod) of lab pod 0, 1, 2.
const PODS: [(&str, &str); 3] = [("x", "a"), ("x", "b"), ("y", "c")];

fn cluster(lab: &Lab) -> Cluster {
    let mut c = Cluster::default();
    for ns in ["x", "y"] {
        c.namespaces.push(Namespace {
            name: ns.into(),
            labels: BTreeMap::from([("ns".to_string(), ns.to_string())]),
        });
    }
    for (i, (ns, name)) in PODS.iter().enumerate() {
        let p = lab.pod(i);
        c.pods.push(Pod {
            namespace: ns.to_string(),
            name: name.to_string(),
            labels: BTreeMap::from([("pod".to_string(), name.to_string())]),
            ips: vec![IpAddr::V4(p.ipv4), IpAddr::V6(p.ipv6)],
            ports: vec![NamedPort {
                name: "http".into(),
                port: 80,
                protocol: Protocol::Tcp,
            }],
            node: Some(NODE.into()),
        });
    }
    c
}

fn cases() -> Vec<(&'static str, Vec<Policy>)> {
    vec![
        (
            "x/a isolated for ingress",
            vec![policy(
                "x",
                "deny-a",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}}),
            )],
        ),
        (
            "x/a from pod b",
            vec![policy(
                "x",
                "a-from-b",
                json!({"podSelector": {"matchLabels": {"pod": "a"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
            )],
        ),
        (
            // Over IPv4 b is in (c is the except), over IPv6 c is in (b is the except).
            "x/a from blocks of both families, each with an except",
            vec![policy(
                "x",
                "a-from-blocks",
                json!({"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [
                    {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.3.0/24"]}},
                    {"ipBlock": {"cidr": "fd00:244::/32", "except": ["fd00:244:2::/64"]}},
                ]}]}),
            )],
        ),
        (
            "y/c egress only to namespace x on the named port",
            vec![policy(
                "y",
                "c-to-x",
                json!({"podSelector": {"matchLabels": {"pod": "c"}},
                       "policyTypes": ["Egress"],
                       "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}],
                                   "ports": [{"port": "http"}]}]}),
            )],
        ),
        (
            "namespace x from namespace y, x/b egress denied",
            vec![
                policy(
                    "x",
                    "x-from-y",
                    json!({"podSelector": {},
                           "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
                ),
                policy(
                    "x",
                    "b-no-egress",
                    json!({"podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Egress"]}),
                ),
            ],
        ),
        ("no policy", vec![]),
    ]
}

#[test]
fn both_families_are_enforced_as_the_evaluator_judges_each() {
    let mut lab = Lab::new().unwrap();
    for (i, (_, name)) in PODS.iter().enumerate() {
        lab.add_pod().unwrap();
        lab.serve_tcp(i, 80, name).unwrap();
    }
    let mut model = cluster(&lab);
    let families = [(Family::Ip, IpFamily::V4), (Family::Ip6, IpFamily::V6)];
    let mut nodes: Vec<(Options, Renderer, Enforcer)> = families
        .iter()
        .map(|(f, _)| {
            let opts = Options {
                family: *f,
                ..Options::default()
            };
            let exec = NftExecutor::new(Some(lab.node.name().to_string()));
            (
                opts.clone(),
                Renderer::new(NODE, opts),
                Enforcer::for_family(exec, *f),
            )
        })
        .collect();
    let mut failures = Vec::new();
    for (name, policies) in cases() {
        model.policies = policies;
        for (opts, renderer, enforcer) in &mut nodes {
            renderer.update(&model);
            let changes = renderer.take_changes();
            assert_eq!(renderer.ruleset(), &render(&model, NODE, opts), "{name}");
            enforcer.sync_changes(renderer.ruleset(), &changes).unwrap();
        }
        let mut table = String::new();
        for (_, family) in families {
            for (i, from) in PODS.iter().enumerate() {
                // A pod reaching itself never leaves its namespace (upstream leaves
                // loopback out of the comparison too).
                for (j, to) in PODS.iter().enumerate().filter(|(j, _)| *j != i) {
                    let ip = match family {
                        IpFamily::V4 => IpAddr::V4(lab.pod(j).ipv4),
                        IpFamily::V6 => IpAddr::V6(lab.pod(j).ipv6),
                    };
                    let addr = SocketAddr::new(ip, 80);
                    let got = lab
                        .pod(i)
                        .ns
                        .run(move || tcp_ask(addr, Duration::from_millis(700)).is_ok())
                        .unwrap();
                    let conn = Connection {
                        src: Endpoint::pod(from.0, from.1),
                        dst: Endpoint::pod(to.0, to.1),
                        protocol: Protocol::Tcp,
                        port: 80,
                    };
                    let want = model.check_over(&conn, family).unwrap().allowed();
                    table.push_str(&format!(
                        "  {family:?} {}/{} -> {}/{}: kernel {got} evaluator {want}{}\n",
                        from.0,
                        from.1,
                        to.0,
                        to.1,
                        if got == want { "" } else { "  MISMATCH" }
                    ));
                    if got != want {
                        failures.push(format!("{name}: {family:?} {from:?} -> {to:?}"));
                    }
                }
            }
        }
        println!("{name}:\n{table}");
    }
    // The tables go with the node's namespace; removing them is checked too.
    for (_, _, enforcer) in &mut nodes {
        assert!(enforcer.cleanup().unwrap());
    }
    assert!(
        failures.is_empty(),
        "kernel and evaluator disagree: {failures:#?}"
    );
}
