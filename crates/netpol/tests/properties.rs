//! Properties of the evaluator over generated policies on upstream's 3×3 model: order does
//! not matter, allows only add within one isolation state, rule-less policies only take
//! away, and pods no policy selects are never restricted.
#![allow(clippy::unwrap_used)]

mod common;

use common::{NAMESPACES, PODS, all_pods, model, pod_ip};
use proptest::prelude::*;
use svcnet_netpol::{
    Cluster, Connection, Endpoint, IpBlock, Op, Peer, Policy, Port, PortMatch, Protocol, Rule,
    Selector,
};

fn pod_selector() -> impl Strategy<Value = Selector> {
    prop_oneof![
        Just(Selector::everything()),
        prop::sample::select(&PODS[..]).prop_map(|p| Selector::labels([("pod", p)])),
        prop::sample::subsequence(&PODS[..], 1..3).prop_map(|ps| Selector {
            exprs: vec![(
                "pod".into(),
                Op::In(ps.iter().map(|p| p.to_string()).collect())
            )],
            ..Selector::default()
        }),
        prop::sample::select(&PODS[..]).prop_map(|p| Selector {
            exprs: vec![("pod".into(), Op::NotIn(vec![p.to_string()]))],
            ..Selector::default()
        }),
    ]
}

fn ns_selector() -> impl Strategy<Value = Selector> {
    prop_oneof![
        Just(Selector::everything()),
        prop::sample::select(&NAMESPACES[..]).prop_map(|n| Selector::labels([("ns", n)])),
    ]
}

fn peer() -> impl Strategy<Value = Peer> {
    let block = (
        prop::sample::select(&NAMESPACES[..]),
        prop::sample::select(&PODS[..]),
        any::<bool>(),
    )
        .prop_map(|(ns, pod, wide)| {
            let ip = pod_ip(ns, pod);
            if wide {
                IpBlock {
                    cidr: "10.244.0.0/16".parse().unwrap(),
                    except: vec![format!("{ip}/32").parse().unwrap()],
                }
            } else {
                IpBlock {
                    cidr: format!("{ip}/32").parse().unwrap(),
                    except: vec![],
                }
            }
        });
    prop_oneof![
        (
            prop::option::of(pod_selector()),
            prop::option::of(ns_selector())
        )
            .prop_filter("a peer must specify something", |(p, n)| p.is_some()
                || n.is_some())
            .prop_map(|(pods, namespaces)| Peer::Pods { pods, namespaces }),
        block.prop_map(Peer::Block),
    ]
}

fn port() -> impl Strategy<Value = Port> {
    let protocol = prop::sample::select(vec![Protocol::Tcp, Protocol::Udp]);
    let port = prop_oneof![
        Just(PortMatch::Any),
        (80u16..=82, 0u16..=1).prop_map(|(p, extra)| PortMatch::Range(p, p + extra)),
        prop::sample::select(vec!["serve-80-tcp", "serve-81-udp", "nope"])
            .prop_map(|n| PortMatch::Named(n.to_string())),
    ];
    (protocol, port).prop_map(|(protocol, port)| Port { protocol, port })
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        prop::collection::vec(peer(), 0..3),
        prop::collection::vec(port(), 0..3),
    )
        .prop_map(|(peers, ports)| Rule { peers, ports })
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        prop::sample::select(&NAMESPACES[..]),
        pod_selector(),
        (any::<bool>(), any::<bool>()).prop_filter("some policy type", |(i, e)| *i || *e),
        prop::collection::vec(rule(), 0..3),
        prop::collection::vec(rule(), 0..3),
        0u32..1000,
    )
        .prop_map(|(ns, sel, (i, e), ingress, egress, n)| Policy {
            namespace: ns.to_string(),
            name: format!("p{n}"),
            pod_selector: sel,
            isolates_ingress: i,
            isolates_egress: e,
            ingress,
            egress,
        })
}

/// Every pod pair on TCP/UDP 80–82.
fn connections() -> Vec<Connection> {
    let mut out = Vec::new();
    for from in all_pods() {
        for to in all_pods() {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                for port in 80..=82 {
                    out.push(Connection {
                        src: Endpoint::pod(&from.0, &from.1),
                        dst: Endpoint::pod(&to.0, &to.1),
                        protocol,
                        port,
                    });
                }
            }
        }
    }
    out
}

fn with(policies: Vec<Policy>) -> Cluster {
    let mut c = model();
    c.policies = policies;
    c
}

/// Is each end isolated (egress of the source, ingress of the destination)?
fn isolation(c: &Cluster, conn: &Connection) -> (bool, bool) {
    let v = c.check(conn).unwrap();
    (
        !v.egress.isolated_by.is_empty(),
        !v.ingress.isolated_by.is_empty(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn no_policies_allow_everything(_x in 0..1u8) {
        let c = with(vec![]);
        prop_assert!(connections().iter().all(|conn| c.allowed(conn)));
    }

    #[test]
    fn order_does_not_matter(policies in prop::collection::vec(policy(), 0..5)) {
        let a = with(policies.clone());
        let b = with(policies.into_iter().rev().collect());
        for conn in connections() {
            prop_assert_eq!(a.allowed(&conn), b.allowed(&conn), "{:?}", conn);
        }
    }

    #[test]
    fn allows_only_add_within_one_isolation_state(
        policies in prop::collection::vec(policy(), 0..4),
        extra in policy(),
    ) {
        let before = with(policies.clone());
        let mut all = policies;
        all.push(extra);
        let after = with(all);
        for conn in connections() {
            if before.allowed(&conn) && isolation(&before, &conn) == isolation(&after, &conn) {
                prop_assert!(after.allowed(&conn), "{:?} lost: {}", conn, after.check(&conn).unwrap());
            }
        }
    }

    #[test]
    fn rule_less_policies_only_take_away(
        policies in prop::collection::vec(policy(), 0..4),
        mut extra in policy(),
    ) {
        extra.ingress.clear();
        extra.egress.clear();
        let before = with(policies.clone());
        let mut all = policies;
        all.push(extra);
        let after = with(all);
        for conn in connections() {
            prop_assert!(!after.allowed(&conn) || before.allowed(&conn), "{:?}", conn);
        }
    }

    #[test]
    fn unselected_ends_are_never_restricted(policies in prop::collection::vec(policy(), 0..5)) {
        let c = with(policies);
        for conn in connections() {
            let v = c.check(&conn).unwrap();
            prop_assert_eq!(v.allowed(), v.egress.allowed() && v.ingress.allowed());
            if v.egress.isolated_by.is_empty() && v.ingress.isolated_by.is_empty() {
                prop_assert!(v.allowed());
            }
        }
    }
}

#[test]
fn pods_and_namespaces_convert_from_api_objects() {
    use k8s_openapi::api::core::v1::{Namespace as K8sNamespace, Pod as K8sPod};
    use svcnet_netpol::{NamedPort, Namespace, Pod};
    let pod: K8sPod = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "x", "name": "a", "labels": {"pod": "a"}},
        "spec": {"nodeName": "node1", "containers": [{"name": "c", "ports": [
            {"name": "serve-80-udp", "containerPort": 80, "protocol": "UDP"},
            {"containerPort": 81},
            {"name": "serve-81-tcp", "containerPort": 81},
        ]}]},
        "status": {"phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}]},
    }))
    .unwrap();
    let m = Pod::from_k8s(&pod).unwrap();
    assert_eq!(
        m.ips,
        vec!["10.244.1.5".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(m.node.as_deref(), Some("node1"));
    assert_eq!(
        m.ports,
        vec![
            NamedPort {
                name: "serve-80-udp".into(),
                port: 80,
                protocol: Protocol::Udp
            },
            NamedPort {
                name: "serve-81-tcp".into(),
                port: 81,
                protocol: Protocol::Tcp
            },
        ]
    );
    let mut host = pod.clone();
    host.spec.as_mut().unwrap().host_network = Some(true);
    assert_eq!(Pod::from_k8s(&host), None);
    let mut done = pod;
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert_eq!(Pod::from_k8s(&done), None);
    let ns: K8sNamespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "y", "labels": {"kubernetes.io/metadata.name": "y"}},
    }))
    .unwrap();
    assert_eq!(
        Namespace::from_k8s(&ns).labels["kubernetes.io/metadata.name"],
        "y"
    );
}
