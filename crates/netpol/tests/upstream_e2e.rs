//! The cases of upstream's `test/e2e/network/netpol/network_policy.go` on its 3×3 model, as
//! truth tables: each builds upstream's policies and expected reachability and runs them
//! through one `check` helper. The "update" cases edit the model between two checks.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;
use svcnet_netpol::Protocol;

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
