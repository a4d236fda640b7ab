//! NetworkPolicies: upstream's defaulting (`policyTypes`, port protocol) and one case per
//! validation rule of `pkg/apis/networking/validation`, with upstream's message.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use common::*;
use serde_json::{Value, json};
use svcnet_admission::{admit_create, admit_update};

fn policy(spec: Value) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "np", "namespace": "default"},
        "spec": spec,
    })
}

fn admitted(spec: Value) -> Value {
    admit_create("NetworkPolicy", policy(spec), &mut allocs())
        .unwrap_or_else(|e| panic!("refused: {:?}", messages(&e)))
}

fn rejects(spec: Value, want: &[&str]) {
    let errs = admit_create("NetworkPolicy", policy(spec), &mut allocs()).expect_err("accepted");
    assert_eq!(messages(&errs), want);
}

#[test]
fn policy_types_default_as_upstream() {
    // Ingress always, even without ingress rules (that is default-deny ingress).
    let got = admitted(json!({}));
    assert_eq!(
        got["spec"],
        json!({"podSelector": {}, "policyTypes": ["Ingress"]})
    );
    // Egress only when egress rules exist.
    let got = admitted(json!({"podSelector": {}, "egress": [{}]}));
    assert_eq!(got["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let got = admitted(json!({"podSelector": {}, "egress": []}));
    assert_eq!(got["spec"]["policyTypes"], json!(["Ingress"]));
    // Given types are kept as written.
    let got = admitted(json!({"podSelector": {}, "policyTypes": ["Egress"]}));
    assert_eq!(got["spec"]["policyTypes"], json!(["Egress"]));
    // A missing spec is stored as upstream stores its zero value.
    let mut bare = policy(json!({}));
    bare.as_object_mut().unwrap().remove("spec");
    let got = admit_create("NetworkPolicy", bare, &mut allocs()).unwrap();
    assert_eq!(got["spec"]["podSelector"], json!({}));
}

#[test]
fn port_protocol_defaults_to_tcp() {
    let got = admitted(json!({
        "podSelector": {},
        "ingress": [{"ports": [{"port": 80}, {"port": "http", "protocol": "UDP"}, {}]}],
        "egress": [{"ports": [{"port": 53, "endPort": 60}]}],
    }));
    assert_eq!(
        got["spec"]["ingress"][0]["ports"],
        json!([{"port": 80, "protocol": "TCP"}, {"port": "http", "protocol": "UDP"}, {"protocol": "TCP"}])
    );
    assert_eq!(
        got["spec"]["egress"][0]["ports"],
        json!([{"port": 53, "endPort": 60, "protocol": "TCP"}])
    );
}

#[test]
fn a_peer_must_specify_something() {
    rejects(
        json!({"ingress": [{"from": [{}]}]}),
        &["spec.ingress[0].from[0]: Required value: must specify a peer"],
    );
    rejects(
        json!({"egress": [{"to": [{"podSelector": {}}, {}]}]}),
        &["spec.egress[0].to[1]: Required value: must specify a peer"],
    );
}

#[test]
fn ip_block_is_not_combined_with_selectors() {
    rejects(
        json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
        &["spec.ingress[0].from[0]: Forbidden: may not specify both ipBlock and another peer"],
    );
    rejects(
        json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}}]}]}),
        &["spec.egress[0].to[0]: Forbidden: may not specify both ipBlock and another peer"],
    );
    // Both selectors together are one peer (AND), not an error.
    admitted(json!({"ingress": [{"from": [{"podSelector": {}, "namespaceSelector": {}}]}]}));
}

#[test]
fn except_is_strictly_inside_cidr() {
    let block = |cidr: &str, except: &[&str]| json!({"ingress": [{"from": [{"ipBlock": {"cidr": cidr, "except": except}}]}]});
    admitted(block("10.0.0.0/8", &["10.1.0.0/16", "10.2.3.4/32"]));
    // Host bits are accepted, as in the API's own example `192.168.1.1/24`.
    admitted(block("192.168.1.1/24", &["192.168.1.128/25"]));
    rejects(
        block("10.0.0.0/8", &["11.0.0.0/16"]),
        &[
            r#"spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: "11.0.0.0/16": must be a strict subset of `cidr`"#,
        ],
    );
    rejects(
        block("10.0.0.0/8", &["10.0.0.0/8"]),
        &[
            r#"spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: "10.0.0.0/8": must be a strict subset of `cidr`"#,
        ],
    );
    rejects(
        block("10.0.0.0/16", &["10.0.0.0/8"]),
        &[
            r#"spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: "10.0.0.0/8": must be a strict subset of `cidr`"#,
        ],
    );
    rejects(
        block("10.0.0.0/8", &["fd00::/64"]),
        &[
            r#"spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: "fd00::/64": must be a strict subset of `cidr`"#,
        ],
    );
}

#[test]
fn cidrs_are_valid() {
    rejects(
        json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0"}}]}]}),
        &[
            r#"spec.egress[0].to[0].ipBlock.cidr: Invalid value: "10.0.0.0": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"#,
        ],
    );
    rejects(
        json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["nope"]}}]}]}),
        &[
            r#"spec.egress[0].to[0].ipBlock.except[0]: Invalid value: "nope": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"#,
        ],
    );
    rejects(
        json!({"egress": [{"to": [{"ipBlock": {"cidr": ""}}]}]}),
        &["spec.egress[0].to[0].ipBlock.cidr: Required value"],
    );
}

#[test]
fn end_port_needs_a_numeric_port_not_above_it() {
    let port = |p: Value| json!({"ingress": [{"ports": [p]}]});
    admitted(port(json!({"port": 32000, "endPort": 32768})));
    admitted(port(json!({"port": 80, "endPort": 80})));
    rejects(
        port(json!({"port": 81, "endPort": 80})),
        &[
            "spec.ingress[0].ports[0].endPort: Invalid value: 80: must be greater than or equal to `port`",
        ],
    );
    rejects(
        port(json!({"port": "http", "endPort": 80})),
        &[
            "spec.ingress[0].ports[0].endPort: Invalid value: 80: may not be specified when `port` is non-numeric",
        ],
    );
    rejects(
        port(json!({"endPort": 80})),
        &[
            "spec.ingress[0].ports[0].endPort: Invalid value: 80: may not be specified when `port` is not specified",
        ],
    );
    rejects(
        port(json!({"port": 80, "endPort": 65536})),
        &[
            "spec.ingress[0].ports[0].endPort: Invalid value: 65536: must be between 1 and 65535, inclusive",
        ],
    );
}

#[test]
fn ports_are_in_range_and_names_are_iana_service_names() {
    let port = |p: Value| json!({"egress": [{"ports": [p]}]});
    rejects(
        port(json!({"port": 0})),
        &["spec.egress[0].ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"],
    );
    rejects(
        port(json!({"port": 65536})),
        &[
            "spec.egress[0].ports[0].port: Invalid value: 65536: must be between 1 and 65535, inclusive",
        ],
    );
    rejects(
        port(json!({"port": "Http_1"})),
        &[
            r#"spec.egress[0].ports[0].port: Invalid value: "Http_1": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"#,
        ],
    );
    rejects(
        port(json!({"port": "a-very-long-port-name"})),
        &[
            r#"spec.egress[0].ports[0].port: Invalid value: "a-very-long-port-name": must be no more than 15 characters"#,
        ],
    );
    rejects(
        port(json!({"port": 80, "protocol": "ICMP"})),
        &[
            r#"spec.egress[0].ports[0].protocol: Unsupported value: "ICMP": supported values: "TCP", "UDP", "SCTP""#,
        ],
    );
}

#[test]
fn label_selectors_are_checked() {
    rejects(
        json!({"podSelector": {"matchLabels": {"bad key!": "x"}}}),
        &[
            r#"spec.podSelector.matchLabels: Invalid value: "bad key!": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"#,
        ],
    );
    rejects(
        json!({"ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In"}]}}]}]}),
        &[
            "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
        ],
    );
    rejects(
        json!({"ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Equals", "values": ["a"]}]}}]}]}),
        &[
            r#"spec.ingress[0].from[0].podSelector.matchExpressions[0].operator: Unsupported value: "Equals": supported values: "DoesNotExist", "Exists", "In", "NotIn""#,
        ],
    );
    rejects(
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["not ok"]}]}}),
        &[
            r#"spec.podSelector.matchExpressions[0].values[0]: Invalid value: "not ok": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"#,
        ],
    );
}

#[test]
fn policy_types_are_ingress_or_egress() {
    rejects(
        json!({"policyTypes": ["Ingress", "Sideways"]}),
        &[
            r#"spec.policyTypes[1]: Unsupported value: "Sideways": supported values: "Ingress", "Egress""#,
        ],
    );
    rejects(
        json!({"policyTypes": ["Ingress", "Egress", "Ingress"]}),
        &[
            r#"spec.policyTypes: Invalid value: ["Ingress","Egress","Ingress"]: may not specify more than two policyTypes"#,
        ],
    );
}

#[test]
fn names_and_updates() {
    let mut bad = policy(json!({}));
    bad["metadata"]["name"] = json!("Not_A_Name");
    let errs = admit_create("NetworkPolicy", bad, &mut allocs()).expect_err("accepted");
    assert!(messages(&errs)[0].starts_with(r#"metadata.name: Invalid value: "Not_A_Name""#));
    // Updates are defaulted and validated as creates are.
    let old = admitted(json!({}));
    let new = policy(json!({"egress": [{"ports": [{"port": 53}]}]}));
    let got = admit_update("NetworkPolicy", &old, new, &mut allocs()).unwrap();
    assert_eq!(got["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let new = policy(json!({"egress": [{"to": [{}]}]}));
    let errs = admit_update("NetworkPolicy", &old, new, &mut allocs()).expect_err("accepted");
    assert_eq!(
        messages(&errs),
        ["spec.egress[0].to[0]: Required value: must specify a peer"]
    );
}

#[test]
fn wrong_types_are_decode_errors() {
    let errs = admit_create(
        "NetworkPolicy",
        policy(json!({"podSelector": "app=web"})),
        &mut allocs(),
    )
    .expect_err("accepted");
    assert!(errs[0].is_decode_error(), "{errs:?}");
}
