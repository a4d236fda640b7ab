//! The egress, ipBlock, protocol and port-range cases of upstream's
//! `test/e2e/network/netpol/network_policy.go` on its 3×3 model (the ingress and update
//! cases are in `upstream_e2e.rs`), and the verdict's reasons.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;
use svcnet_netpol::{Connection, Endpoint, Protocol};

fn reach() -> Reachability {
    Reachability::new(true)
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
