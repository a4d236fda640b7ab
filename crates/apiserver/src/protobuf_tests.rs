//! The protobuf codec against hand-encoded messages (a module of `protobuf.rs`).

use super::*;

/// A tiny encoder for the tests: fields as (number, value).
enum P {
    S(u64, &'static str),
    I(u64, u64),
    M(u64, Vec<P>),
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn enc(fields: &[P]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in fields {
        match p {
            P::S(n, s) => {
                varint(n << 3 | 2, &mut out);
                varint(s.len() as u64, &mut out);
                out.extend_from_slice(s.as_bytes());
            }
            P::I(n, v) => {
                varint(n << 3, &mut out);
                varint(*v, &mut out);
            }
            P::M(n, inner) => {
                let b = enc(inner);
                varint(n << 3 | 2, &mut out);
                varint(b.len() as u64, &mut out);
                out.extend_from_slice(&b);
            }
        }
    }
    out
}

fn envelope(api_version: &'static str, kind: &'static str, raw: Vec<P>) -> Vec<u8> {
    let mut body = MAGIC.to_vec();
    let raw = enc(&raw);
    let mut unknown = enc(&[P::M(1, vec![P::S(1, api_version), P::S(2, kind)])]);
    varint(2 << 3 | 2, &mut unknown);
    varint(raw.len() as u64, &mut unknown);
    unknown.extend_from_slice(&raw);
    body.extend(unknown);
    body
}

#[test]
fn decodes_a_service_like_kubectl_create_service() {
    use P::*;
    let body = envelope(
        "v1",
        "Service",
        vec![
            M(
                1,
                vec![
                    S(1, "web"),
                    S(3, ""),
                    M(8, vec![]),
                    M(11, vec![S(1, "app"), S(2, "web")]),
                ],
            ),
            M(
                2,
                vec![
                    M(
                        1,
                        vec![
                            S(1, "80-80"),
                            S(2, "TCP"),
                            I(3, 80),
                            M(4, vec![I(1, 0), I(2, 8080)]),
                            I(5, 0),
                        ],
                    ),
                    M(2, vec![S(1, "app"), S(2, "web")]),
                    S(3, ""),
                    S(4, "ClusterIP"),
                    I(12, 0),
                    I(13, 0),
                ],
            ),
            M(3, vec![M(1, vec![])]),
        ],
    );
    let got = decode(&body).unwrap();
    assert_eq!(
        got,
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "labels": {"app": "web"}},
               "spec": {"ports": [{"name": "80-80", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                        "selector": {"app": "web"}, "type": "ClusterIP"}})
    );
}

#[test]
fn keeps_pointer_zeros_and_named_ports() {
    use P::*;
    let body = envelope(
        "apps/v1",
        "Deployment",
        vec![
            M(1, vec![S(1, "d")]),
            M(
                2,
                vec![
                    I(1, 0),
                    M(2, vec![M(1, vec![S(1, "app"), S(2, "d")])]),
                    M(
                        3,
                        vec![M(
                            2,
                            vec![M(2, vec![S(1, "c"), S(2, "nginx"), M(8, vec![]), I(16, 0)])],
                        )],
                    ),
                    M(4, vec![M(2, vec![M(1, vec![I(1, 1), S(3, "25%")])])]),
                ],
            ),
        ],
    );
    let got = decode(&body).unwrap();
    assert_eq!(
        got["spec"]["replicas"], 0,
        "an explicit replicas: 0 survives"
    );
    assert_eq!(got["spec"]["selector"]["matchLabels"]["app"], "d");
    assert_eq!(
        got["spec"]["template"]["spec"]["containers"],
        json!([{"name": "c", "image": "nginx"}])
    );
    assert_eq!(
        got["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        "25%"
    );
}

/// A NetworkPolicy as a typed client-go writer sends it: an empty pod selector (every pod),
/// an ingress rule from an empty namespace selector (every namespace) on a named port, an
/// egress rule to an ipBlock on a port range, and an allow-all ingress rule (`{}`).
#[test]
fn decodes_a_network_policy_from_client_go() {
    use P::*;
    let body = envelope(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        vec![
            M(1, vec![S(1, "np"), S(3, "default")]),
            M(
                2,
                vec![
                    M(1, vec![]),
                    M(
                        2,
                        vec![
                            M(1, vec![S(1, "TCP"), M(2, vec![I(1, 1), S(3, "http")])]),
                            M(2, vec![M(2, vec![])]),
                        ],
                    ),
                    M(2, vec![]),
                    M(
                        3,
                        vec![
                            M(
                                1,
                                vec![S(1, "UDP"), M(2, vec![I(1, 0), I(2, 5000)]), I(3, 5010)],
                            ),
                            M(2, vec![M(3, vec![S(1, "10.0.0.0/8"), S(2, "10.1.0.0/16")])]),
                        ],
                    ),
                    S(4, "Ingress"),
                    S(4, "Egress"),
                ],
            ),
        ],
    );
    let got = decode(&body).unwrap();
    assert_eq!(
        got,
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "np", "namespace": "default"},
               "spec": {
                   "ingress": [
                       {"ports": [{"protocol": "TCP", "port": "http"}], "from": [{"namespaceSelector": {}}]},
                       {},
                   ],
                   "egress": [{"ports": [{"protocol": "UDP", "port": 5000, "endPort": 5010}],
                               "to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]}],
                   "policyTypes": ["Ingress", "Egress"]}})
    );
}

#[test]
fn refuses_what_it_cannot_represent() {
    use P::*;
    // An unknown field with a value is refused, one with its zero value skipped.
    let body = envelope(
        "v1",
        "Namespace",
        vec![M(1, vec![S(1, "n"), S(4, "")]), M(2, vec![S(9, "x")])],
    );
    let err = decode(&body).unwrap_err().to_string();
    assert!(err.contains("field 9 of Namespace.spec"), "{err}");
    let ok = envelope("v1", "Namespace", vec![M(1, vec![S(1, "n"), S(4, "")])]);
    assert_eq!(decode(&ok).unwrap()["metadata"], json!({"name": "n"}));
    let err = decode(&envelope("v1", "Secret", vec![]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("Secret (v1) are not supported"), "{err}");
    assert!(decode(b"{}").is_err());
    let mut truncated = envelope("v1", "Namespace", vec![M(1, vec![S(1, "name")])]);
    truncated.truncate(truncated.len() - 2);
    assert!(decode(&truncated).is_err());
}
