//! The cases of upstream's `test/e2e/network/netpol/network_policy.go` on its 3×3 model, as
//! truth tables: each builds upstream's policies and expected reachability and runs them
//! through one `check` helper. The "update" cases edit the model between two checks.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;
use svcnet_netpol::{Connection, Endpoint, Protocol};

fn reach() -> Reachability {
    Reachability::new(true)
}

#[test]
fn no_policies_allow_everything() {
    check(vec![], &reach());
}

#[test]
fn default_deny_ingress() {
    let p = policy("x", "deny-ingress", json!({"podSelector": {}}));
    check(vec![p], reach().ingress("x/*", false));
}

#[test]
fn default_deny_all() {
    let p = policy(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    check(vec![p], reach().ingress("x/*", false).egress("x/*", false));
}

#[test]
fn allow_from_pods_in_server_namespace_by_pod_selector() {
    let p = policy(
        "x",
        "x-a-allows-x-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    );
    check(
        vec![p],
        reach().ingress("x/a", false).expect("x/b", "x/a", true),
    );
}

#[test]
fn allow_ingress_for_a_target() {
    let deny = policy("x", "deny-ingress", json!({"podSelector": {}}));
    let allow = policy(
        "x",
        "allow-ingress-target",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"ports": [{"port": 80}]}]}),
    );
    check(
        vec![deny, allow],
        reach().ingress("x/b", false).ingress("x/c", false),
    );
}

#[test]
fn allow_ingress_from_pods_in_all_namespaces() {
    let p = policy(
        "x",
        "allow-from-another-ns",
        json!({"podSelector": {"matchLabels": {}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {}}}]}]}),
    );
    check(vec![p], &reach());
}

#[test]
fn allow_only_from_a_different_namespace_by_namespace_selector() {
    let p = policy(
        "x",
        "allow-client-a-via-ns-selector",
        json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    );
    check(
        vec![p],
        reach().ingress("x/*", false).expect("y/*", "x/*", true),
    );
}

#[test]
fn pod_selector_with_match_expressions() {
    let p = policy(
        "x",
        "x-a-allows-x-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b"]}]}}]}]}),
    );
    check(
        vec![p],
        reach().ingress("x/a", false).expect("x/b", "x/a", true),
    );
}

#[test]
fn namespace_selector_with_match_expressions() {
    let p = policy(
        "x",
        "allow-ns-y-match-selector",
        json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y"]}]}}]}]}),
    );
    check(
        vec![p],
        reach().ingress("x/*", false).expect("y/*", "x/*", true),
    );
}

#[test]
fn pod_selector_or_namespace_selector() {
    let p = policy(
        "x",
        "allow-ns-y-z-pod-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [
            {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]}},
            {"podSelector": {"matchLabels": {"pod": "b"}}},
        ]}]}),
    );
    check(
        vec![p],
        reach()
            .expect("x/*", "x/a", false)
            .expect("x/b", "x/a", true),
    );
}

#[test]
fn pod_selector_and_namespace_selector() {
    let p = policy(
        "x",
        "allow-ns-y-z-pod-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{
            "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]},
            "podSelector": {"matchLabels": {"pod": "b"}},
        }]}]}),
    );
    check(
        vec![p],
        reach()
            .ingress("x/a", false)
            .expect("y/b", "x/a", true)
            .expect("z/b", "x/a", true),
    );
}

#[test]
fn multiple_pod_selectors_and_namespace_selectors() {
    let p = policy(
        "x",
        "allow-ns-y-z-pod-b-c",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{
            "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]},
            "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]},
        }]}]}),
    );
    let mut want = reach();
    want.ingress("x/a", false);
    for from in ["y/b", "y/c", "z/b", "z/c"] {
        want.expect(from, "x/a", true);
    }
    check(vec![p], &want);
}

#[test]
fn any_pod_selectors() {
    let p = policy(
        "x",
        "allow-ns-x-pod-b-c",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}, {"podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
    );
    check(
        vec![p],
        reach()
            .ingress("x/a", false)
            .expect("x/b", "x/a", true)
            .expect("x/c", "x/a", true),
    );
}

#[test]
fn only_from_a_pod_in_a_different_namespace() {
    let p = policy(
        "x",
        "allow-ns-y-pod-a-via-namespace-pod-selector",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
    );
    check(
        vec![p],
        reach().ingress("x/a", false).expect("y/a", "x/a", true),
    );
}

fn ns_y_on_port(name: &str, port: serde_json::Value) -> svcnet_netpol::Policy {
    policy(
        "x",
        name,
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": port}]}]}),
    )
}

#[test]
fn ports() {
    let mut c = model();
    c.policies = vec![ns_y_on_port("allow-ingress-on-port-81-ns-x", json!(81))];
    check_on(
        &c,
        Protocol::Tcp,
        81,
        reach().ingress("x/a", false).expect("y/*", "x/a", true),
    );
    check_on(&c, Protocol::Tcp, 80, reach().ingress("x/a", false));
}

#[test]
fn multiple_stacked_policies_with_overlapping_pod_selectors() {
    let mut c = model();
    c.policies = vec![ns_y_on_port("allow-ingress-port-80", json!(80))];
    check_on(&c, Protocol::Tcp, 81, reach().ingress("x/a", false));
    c.policies
        .push(ns_y_on_port("allow-ingress-port-81", json!(81)));
    for port in [80, 81] {
        check_on(
            &c,
            Protocol::Tcp,
            port,
            reach().ingress("x/a", false).expect("y/*", "x/a", true),
        );
    }
}

#[test]
fn allow_all() {
    let p = policy(
        "x",
        "allow-all",
        json!({"podSelector": {}, "ingress": [{}]}),
    );
    check(vec![p], &reach());
}

#[test]
fn ingress_on_one_named_port() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-all",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-81-tcp"}]}]}),
    )];
    check_on(&c, Protocol::Tcp, 81, &reach());
    check_on(&c, Protocol::Tcp, 80, reach().ingress("x/*", false));
}

#[test]
fn ingress_from_namespace_on_one_named_port() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-ns-y-on-named-port",
        json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": "serve-80-tcp"}]}]}),
    )];
    check_on(
        &c,
        Protocol::Tcp,
        80,
        reach().ingress("x/*", false).expect("y/*", "x/*", true),
    );
    check_on(&c, Protocol::Tcp, 81, reach().ingress("x/*", false));
}

#[test]
fn egress_on_one_named_port() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
        "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
    )];
    // The named port resolves on the destination pod, in every namespace.
    check_on(&c, Protocol::Tcp, 80, &reach());
    check_on(&c, Protocol::Tcp, 81, reach().egress("x/*", false));
}

#[test]
fn enforce_updated_policy() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-all-mutate-to-deny-all",
        json!({"podSelector": {}, "ingress": [{}]}),
    )];
    check_on(&c, Protocol::Tcp, 81, &reach());
    c.policies = vec![policy(
        "x",
        "allow-all-mutate-to-deny-all",
        json!({"podSelector": {}, "ingress": []}),
    )];
    check_on(&c, Protocol::Tcp, 81, reach().ingress("x/*", false));
}

#[test]
fn ingress_from_updated_namespace() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-client-a-via-ns-selector",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns2": "updated"}}}]}]}),
    )];
    check_on(&c, Protocol::Tcp, 80, reach().ingress("x/a", false));
    let y = c.namespaces.iter_mut().find(|n| n.name == "y").unwrap();
    y.labels.insert("ns2".into(), "updated".into());
    check_on(
        &c,
        Protocol::Tcp,
        80,
        reach().ingress("x/a", false).expect("y/*", "x/a", true),
    );
}

#[test]
fn ingress_from_updated_pod() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-client-a-via-pod-selector",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod2": "updated"}}}]}]}),
    )];
    check_on(&c, Protocol::Tcp, 80, reach().ingress("x/a", false));
    let b = c
        .pods
        .iter_mut()
        .find(|p| p.namespace == "x" && p.name == "b")
        .unwrap();
    b.labels.insert("pod2".into(), "updated".into());
    check_on(
        &c,
        Protocol::Tcp,
        80,
        reach().ingress("x/a", false).expect("x/b", "x/a", true),
    );
}

#[test]
fn deny_ingress_to_updated_pod() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "deny-ingress-via-label-selector",
        json!({"podSelector": {"matchLabels": {"target": "isolated"}},
        "policyTypes": ["Ingress"]}),
    )];
    check_on(&c, Protocol::Tcp, 80, &reach());
    let a = c
        .pods
        .iter_mut()
        .find(|p| p.namespace == "x" && p.name == "a")
        .unwrap();
    a.labels.insert("target".into(), "isolated".into());
    check_on(&c, Protocol::Tcp, 80, reach().ingress("x/a", false));
}

#[test]
fn deny_ingress_from_pods_in_other_namespaces() {
    let p = policy(
        "x",
        "deny-ns-y",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
    );
    check(
        vec![p],
        reach()
            .expect("y/*", "x/*", false)
            .expect("z/*", "x/*", false),
    );
}

#[test]
fn deny_egress_by_pod_selector() {
    let p = policy(
        "x",
        "deny-egress-pod-a",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"]}),
    );
    check(vec![p], reach().egress("x/a", false));
}

#[test]
fn deny_egress_from_all_pods_in_a_namespace() {
    let p = policy(
        "x",
        "deny-egress-ns-x",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    );
    check(vec![p], reach().egress("x/*", false));
}

#[test]
fn ingress_and_egress_together() {
    // Egress allowed only to UDP 53 (upstream allows DNS), so TCP from x/a is blocked.
    let p = policy(
        "x",
        "allow-client-a-via-pod-selector",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
        "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]}),
    );
    let mut c = model();
    c.policies = vec![p];
    for port in [80, 81] {
        check_on(
            &c,
            Protocol::Tcp,
            port,
            reach()
                .ingress("x/a", false)
                .expect("x/b", "x/a", true)
                .egress("x/a", false),
        );
    }
}

#[test]
fn deny_egress_on_the_client_even_if_the_server_allows() {
    let client = policy(
        "x",
        "deny-egress-from-x-a",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"]}),
    );
    let server = policy(
        "y",
        "allow-all-ingress",
        json!({"podSelector": {}, "ingress": [{}]}),
    );
    check(vec![client, server], reach().egress("x/a", false));
}

#[test]
fn egress_to_a_server_in_another_namespace_by_pod_and_namespace() {
    let p = policy(
        "x",
        "allow-to-ns-y-pod-a",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
    );
    check(
        vec![p],
        reach().egress("x/a", false).expect("x/a", "y/a", true),
    );
}

#[test]
fn any_port_on_a_specific_protocol() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-ingress-by-proto",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"ports": [{"protocol": "TCP"}]}]}),
    )];
    check_on(&c, Protocol::Tcp, 80, &reach());
    check_on(&c, Protocol::Tcp, 81, &reach());
    check_on(&c, Protocol::Udp, 80, reach().ingress("x/a", false));
}

#[test]
fn multiple_ingress_policies_with_allow_all_taking_precedence() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-ingress-port-80",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"ports": [{"port": 80}]}]}),
    )];
    check_on(&c, Protocol::Tcp, 81, reach().ingress("x/a", false));
    c.policies.push(policy(
        "x",
        "allow-all",
        json!({"podSelector": {}, "ingress": [{}]}),
    ));
    check_on(&c, Protocol::Tcp, 81, &reach());
}

#[test]
fn multiple_egress_policies_with_allow_all_taking_precedence() {
    let mut c = model();
    // upstream's egress policies list `Egress` alone (defaulting would add Ingress).
    c.policies = vec![policy(
        "x",
        "allow-egress-port-80",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "policyTypes": ["Egress"], "egress": [{"ports": [{"port": 80}]}]}),
    )];
    check_on(&c, Protocol::Tcp, 81, reach().egress("x/a", false));
    c.policies.push(policy(
        "x",
        "allow-all",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}),
    ));
    check_on(&c, Protocol::Tcp, 81, &reach());
}

#[test]
fn stop_enforcing_after_delete() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    )];
    check_on(
        &c,
        Protocol::Tcp,
        80,
        reach().ingress("x/*", false).egress("x/*", false),
    );
    c.policies.clear();
    check_on(&c, Protocol::Tcp, 80, &reach());
}

#[test]
fn egress_to_a_cidr_block() {
    let p = policy(
        "x",
        "allow-client-a-via-cidr-egress-rule",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": format!("{}/32", pod_ip("x", "b"))}}]}]}),
    );
    check(
        vec![p],
        reach().egress("x/a", false).expect("x/a", "x/b", true),
    );
}

fn except_x_b() -> svcnet_netpol::Policy {
    policy(
        "x",
        "deny-client-a-via-except-cidr-egress-rule",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/16", "except": [format!("{}/32", pod_ip("x", "b"))]}}]}]}),
    )
}

#[test]
fn except_clause_in_a_cidr_block() {
    check(vec![except_x_b()], reach().expect("x/a", "x/b", false));
}

#[test]
fn ip_in_both_cidr_and_except_is_allowed_by_a_second_policy() {
    let mut c = model();
    c.policies = vec![except_x_b()];
    check_on(&c, Protocol::Tcp, 80, reach().expect("x/a", "x/b", false));
    c.policies.push(policy("x", "allow-client-a-via-cidr-egress-rule", json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": format!("{}/32", pod_ip("x", "b"))}}]}]})));
    check_on(&c, Protocol::Tcp, 80, &reach());
}

#[test]
fn ingress_and_egress_are_controlled_independently() {
    // "should enforce policies to check ingress and egress policies can be controlled
    // independently based on PodSelector": x/a may not reach x/b, though x/b accepts all.
    let egress = policy(
        "x",
        "deny-egress-to-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["b"]}]}}]}]}),
    );
    let mut want = reach();
    // Egress to pods in other namespaces: the peer's podSelector only looks in x.
    want.egress("x/a", false)
        .expect("x/a", "x/a", true)
        .expect("x/a", "x/c", true);
    check(vec![egress], &want);
}

#[test]
fn sctp_is_not_treated_as_tcp() {
    let p = policy(
        "x",
        "allow-only-sctp-ingress-on-port-80",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"ports": [{"protocol": "SCTP", "port": 80}]}]}),
    );
    check(vec![p], reach().ingress("x/a", false));
}

#[test]
fn udp_only_policy_does_not_allow_tcp() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-only-udp-ingress-on-port-81",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"ports": [{"protocol": "UDP", "port": 81}]}]}),
    )];
    check_on(&c, Protocol::Tcp, 81, reach().ingress("x/a", false));
    check_on(&c, Protocol::Udp, 81, &reach());
}

#[test]
fn namespace_selector_on_the_default_namespace_label() {
    let p = policy(
        "x",
        "allow-client-a-via-ns-selector-match-labels",
        json!({"podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]}]}),
    );
    check(
        vec![p],
        reach().ingress("x/*", false).expect("y/*", "x/*", true),
    );
}

#[test]
fn namespace_match_expressions_on_the_default_namespace_label() {
    let p = policy(
        "x",
        "allow-client-a-via-ns-selector-match-expressions",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["y"]}]}}]}]}),
    );
    check(
        vec![p],
        reach().egress("x/a", false).expect("x/a", "y/*", true),
    );
}

#[test]
fn udp_cases() {
    let mut c = model();
    c.policies = vec![policy("x", "deny-all", json!({"podSelector": {}}))];
    check_on(&c, Protocol::Udp, 80, reach().ingress("x/*", false));
    c.policies = vec![policy(
        "x",
        "allow-ingress-on-port-81-ns-x",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"protocol": "UDP", "port": 81}]}]}),
    )];
    check_on(
        &c,
        Protocol::Udp,
        81,
        reach().ingress("x/a", false).expect("y/*", "x/a", true),
    );
    check_on(&c, Protocol::Udp, 80, reach().ingress("x/a", false));
    c.policies = vec![policy(
        "x",
        "allow-ns-y-pod-a",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
    )];
    check_on(
        &c,
        Protocol::Udp,
        80,
        reach().ingress("x/a", false).expect("y/a", "x/a", true),
    );
}

#[test]
fn end_port_ranges() {
    let mut c = model();
    c.policies = vec![policy(
        "x",
        "allow-80-81",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 81}]}]}),
    )];
    check_on(&c, Protocol::Tcp, 80, &reach());
    check_on(&c, Protocol::Tcp, 81, &reach());
    check_on(&c, Protocol::Tcp, 82, reach().ingress("x/*", false));
}

#[test]
fn verdicts_say_why() {
    let mut c = model();
    c.policies = vec![
        policy("x", "deny-all", json!({"podSelector": {}})),
        policy(
            "x",
            "allow-y",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}, {"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
        ),
    ];
    let conn = |from: Endpoint| Connection {
        src: from,
        dst: Endpoint::pod("x", "a"),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let v = c.check(&conn(Endpoint::pod("y", "c"))).unwrap();
    assert!(v.allowed());
    assert_eq!(
        v.to_string(),
        "egress: not isolated; ingress: allowed by x/allow-y rule 1"
    );
    let v = c.check(&conn(Endpoint::pod("z", "c"))).unwrap();
    assert_eq!(
        v.to_string(),
        "egress: not isolated; ingress: denied (isolated by x/deny-all, x/allow-y)"
    );
    // An address outside the cluster matches only ipBlocks; the pod's node is always let in.
    assert!(!c.allowed(&conn(Endpoint::Ip("192.0.2.1".parse().unwrap()))));
    c.pods
        .iter_mut()
        .for_each(|p| p.node = Some("node-1".into()));
    let node = |name: &str| Endpoint::Node {
        name: name.into(),
        ip: "192.0.2.2".parse().unwrap(),
    };
    let v = c.check(&conn(node("node-1"))).unwrap();
    assert!(v.allowed() && v.ingress.node_exception, "{v}");
    assert!(!c.allowed(&conn(node("node-2"))));
    // Unknown pods are an error, not a silent allow.
    assert!(c.check(&conn(Endpoint::pod("x", "nosuch"))).is_err());
}
