//! Every Service validation rule, with the message a real API server prints.

#![allow(clippy::unwrap_used)] // tests may unwrap (RULES.md)

mod common;

use common::*;
use serde_json::{Value, json};
use svcnet_admission::{FieldErrorKind, admit_create};

/// Creates `obj` and asserts the exact list of error messages.
fn rejects(obj: Value, want: &[&str]) {
    let mut a = allocs();
    let before = a.clone();
    let errs =
        admit_create("Service", obj, &mut a).expect_err("admission accepted an invalid service");
    assert_eq!(messages(&errs), want);
    assert_eq!(a, before, "a refused create changed the allocators");
}

#[test]
fn names() {
    rejects(
        service("default", "My_Svc", |_| {}),
        &[
            "metadata.name: Invalid value: \"My_Svc\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
        ],
    );
    rejects(
        service("default", "1svc", |_| {}),
        &[
            "metadata.name: Invalid value: \"1svc\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
        ],
    );
    rejects(
        service("default", "x", |s| {
            s["metadata"] = json!({"namespace": "default"})
        }),
        &["metadata.name: Required value: name or generateName is required"],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "metadata.labels", json!({"bad key!": "v"}))
        }),
        &[
            "metadata.labels: Invalid value: \"bad key!\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        ],
    );
}

#[test]
fn ports() {
    rejects(
        service("default", "x", |s| set(s, "spec.ports.0.port", json!(0))),
        // targetPort defaults to port, so upstream reports both.
        &[
            "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
            "spec.ports[0].targetPort: Invalid value: 0: must be between 1 and 65535, inclusive",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(
                s,
                "spec.ports.0",
                json!({"port": 70000, "targetPort": 8080}),
            )
        }),
        &["spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive"],
    );
    rejects(
        service("default", "x", |s| set(s, "spec.ports", json!([]))),
        &["spec.ports: Required value"],
    );
    rejects(
        service("default", "x", |s| {
            set(
                s,
                "spec.ports",
                json!([{"name": "http", "port": 80}, {"port": 443}]),
            )
        }),
        &["spec.ports[1].name: Required value"],
    );
    rejects(
        service("default", "x", |s| {
            set(
                s,
                "spec.ports",
                json!([{"name": "http", "port": 80}, {"name": "http", "port": 443}]),
            )
        }),
        &["spec.ports[1].name: Duplicate value: \"http\""],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.ports.0.name", json!("Web"))
        }),
        &[
            "spec.ports[0].name: Invalid value: \"Web\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.ports.0.protocol", json!("ICMP"))
        }),
        &[
            "spec.ports[0].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(
                s,
                "spec.ports",
                json!([{"name": "a", "port": 80}, {"name": "b", "port": 80}]),
            )
        }),
        &[
            "spec.ports[1]: Duplicate value: core.ServicePort{Name:\"\", Protocol:\"TCP\", AppProtocol:(*string)(nil), Port:80, TargetPort:intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}, NodePort:0}",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.ports.0.targetPort", json!("Http_Port"))
        }),
        &[
            "spec.ports[0].targetPort: Invalid value: \"Http_Port\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.ports.0.targetPort", json!(65536))
        }),
        &["spec.ports[0].targetPort: Invalid value: 65536: must be between 1 and 65535, inclusive"],
    );
    // The same port number with two protocols is fine (DNS).
    let mut a = allocs();
    let ok = service("default", "dns", |s| {
        set(
            s,
            "spec.ports",
            json!([{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53}]),
        )
    });
    admit_create("Service", ok, &mut a).unwrap();
}

#[test]
fn types_and_type_specific_fields() {
    rejects(
        service("default", "x", |s| set(s, "spec.type", json!("Foo"))),
        &[
            "spec.type: Unsupported value: \"Foo\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.ports.0.nodePort", json!(30080))
        }),
        &["spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.externalTrafficPolicy", json!("Local"))
        }),
        &[
            "spec.externalTrafficPolicy: Invalid value: \"Local\": may only be set for externally-accessible services",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.type", json!("NodePort"));
            set(s, "spec.externalTrafficPolicy", json!("Nearest"));
        }),
        &[
            "spec.externalTrafficPolicy: Unsupported value: \"Nearest\": supported values: \"Cluster\", \"Local\"",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.type", json!("NodePort"));
            set(s, "spec.clusterIP", json!("None"));
        }),
        &[
            "spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.type", json!("NodePort"));
            set(s, "spec.healthCheckNodePort", json!(30500));
        }),
        &[
            "spec.healthCheckNodePort: Invalid value: 30500: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.type", json!("NodePort"));
            set(
                s,
                "spec.ports",
                json!([{"name": "a", "port": 80, "nodePort": 30080}, {"name": "b", "port": 81, "nodePort": 30080}]),
            );
        }),
        &["spec.ports[1].nodePort: Duplicate value: 30080"],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.loadBalancerSourceRanges", json!(["10.0.0.0/8"]))
        }),
        &[
            "spec.loadBalancerSourceRanges: Forbidden: may only be used when `type` is 'LoadBalancer'",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.type", json!("LoadBalancer"));
            set(s, "spec.loadBalancerSourceRanges", json!(["10.0.0.0/33"]));
        }),
        &[
            "spec.loadBalancerSourceRanges[0]: Invalid value: \"10.0.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.loadBalancerClass", json!("example.com/lb"))
        }),
        &["spec.loadBalancerClass: Forbidden: may only be used when `type` is 'LoadBalancer'"],
    );
}

#[test]
fn external_name() {
    let ext = |f: &dyn Fn(&mut Value)| {
        service("default", "x", |s| {
            s["spec"] = json!({"type": "ExternalName", "externalName": "db.example.com"});
            f(s);
        })
    };
    rejects(
        ext(&|s| s["spec"].as_object_mut().unwrap().clear()),
        &["spec.ports: Required value"],
    );
    rejects(
        ext(&|s| set(s, "spec.externalName", json!(""))),
        &["spec.externalName: Required value"],
    );
    rejects(
        ext(&|s| set(s, "spec.externalName", json!("Bad_Name"))),
        &[
            "spec.externalName: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ],
    );
    rejects(
        ext(&|s| set(s, "spec.clusterIP", json!("10.96.0.5"))),
        &["spec.clusterIPs: Forbidden: may not be set for ExternalName services"],
    );
    // A trailing dot marks a fully qualified name.
    let mut a = allocs();
    admit_create(
        "Service",
        ext(&|s| set(s, "spec.externalName", json!("db.example.com."))),
        &mut a,
    )
    .unwrap();
}

#[test]
fn selectors_affinity_ips() {
    rejects(
        service("default", "x", |s| {
            set(s, "spec.selector", json!({"app": "my app"}))
        }),
        &[
            "spec.selector: Invalid value: \"my app\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.sessionAffinity", json!("Cookie"))
        }),
        &[
            "spec.sessionAffinity: Unsupported value: \"Cookie\": supported values: \"ClientIP\", \"None\"",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.sessionAffinity", json!("ClientIP"));
            set(
                s,
                "spec.sessionAffinityConfig",
                json!({"clientIP": {"timeoutSeconds": 86401}}),
            );
        }),
        &[
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 86401: must be greater than 0 and less than 86400",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.sessionAffinity", json!("ClientIP"));
            set(
                s,
                "spec.sessionAffinityConfig",
                json!({"clientIP": {"timeoutSeconds": 0}}),
            );
        }),
        &[
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 0: must be greater than 0 and less than 86400",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.externalIPs", json!(["1.2.3.999", "127.0.0.1"]))
        }),
        &[
            "spec.externalIPs[0]: Invalid value: \"1.2.3.999\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            "spec.externalIPs[1]: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.clusterIP", json!("10.96.0.300"))
        }),
        &[
            "spec.clusterIPs[0]: Invalid value: \"10.96.0.300\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.ipFamilyPolicy", json!("RequireDualStack"))
        }),
        &[
            "spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services",
        ],
    );
    rejects(
        service("default", "x", |s| {
            set(s, "spec.internalTrafficPolicy", json!("Nearby"))
        }),
        &[
            "spec.internalTrafficPolicy: Unsupported value: \"Nearby\": supported values: \"Cluster\", \"Local\"",
        ],
    );
}

#[test]
fn several_errors_are_all_reported_with_reasons() {
    let mut a = allocs();
    let errs = admit_create(
        "Service",
        service("default", "x", |s| {
            set(s, "spec.type", json!("Foo"));
            set(s, "spec.ports.0", json!({"port": 0, "targetPort": 80}));
        }),
        &mut a,
    )
    .unwrap_err();
    let kinds: Vec<(&str, &str)> = errs
        .iter()
        .map(|e| (e.field.as_str(), e.kind.reason()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("spec.type", "FieldValueNotSupported"),
            ("spec.ports[0].port", "FieldValueInvalid")
        ]
    );
    assert_eq!(errs[1].kind, FieldErrorKind::Invalid);
    assert_eq!(
        errs[1].body(),
        "Invalid value: 0: must be between 1 and 65535, inclusive"
    );
}

#[test]
fn undecodable_bodies_are_decode_errors() {
    let mut a = allocs();
    let errs = admit_create(
        "Service",
        service("default", "x", |s| set(s, "spec.ports.0.port", json!("80"))),
        &mut a,
    )
    .unwrap_err();
    assert!(errs[0].is_decode_error(), "{errs:?}");
    assert!(
        errs[0]
            .to_string()
            .starts_with("Service in version \"v1\" cannot be handled as a Service: "),
        "{}",
        errs[0]
    );
}
