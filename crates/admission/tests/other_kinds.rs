//! Pods, Endpoints, EndpointSlices, Namespaces, Nodes, ConfigMaps: defaulting snapshots and
//! validation messages (the workloads are in `workloads.rs`).
//! Refresh snapshots with `UPDATE_EXPECT=1 cargo test -p svcnet-admission`.

#![allow(clippy::unwrap_used)] // tests may unwrap (RULES.md)

mod common;

use common::*;
use expect_test::expect;
use serde_json::{Value, json};
use svcnet_admission::{admit_create, admit_status_update, admit_update};

fn pod(name: &str, f: impl FnOnce(&mut Value)) -> Value {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.25", "ports": [{"containerPort": 80, "name": "http"}]}]}
    });
    f(&mut v);
    v
}

#[test]
fn pod_defaults() {
    check(
        "Pod",
        pod("web-0", |_| {}),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Pod",
              "metadata": {
                "labels": {
                  "app": "web"
                },
                "name": "web-0",
                "namespace": "default"
              },
              "spec": {
                "containers": [
                  {
                    "image": "nginx:1.25",
                    "imagePullPolicy": "IfNotPresent",
                    "name": "web",
                    "ports": [
                      {
                        "containerPort": 80,
                        "name": "http",
                        "protocol": "TCP"
                      }
                    ],
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "volumeMounts": [
                      {
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "name": "kube-api-access-XXXXX",
                        "readOnly": true
                      }
                    ]
                  }
                ],
                "dnsPolicy": "ClusterFirst",
                "enableServiceLinks": true,
                "preemptionPolicy": "PreemptLowerPriority",
                "priority": 0,
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
                "securityContext": {},
                "serviceAccountName": "default",
                "terminationGracePeriodSeconds": 30,
                "tolerations": [
                  {
                    "effect": "NoExecute",
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "tolerationSeconds": 300
                  },
                  {
                    "effect": "NoExecute",
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "tolerationSeconds": 300
                  }
                ],
                "volumes": [
                  {
                    "name": "kube-api-access-XXXXX",
                    "projected": {
                      "defaultMode": 420,
                      "sources": [
                        {
                          "serviceAccountToken": {
                            "expirationSeconds": 3607,
                            "path": "token"
                          }
                        },
                        {
                          "configMap": {
                            "items": [
                              {
                                "key": "ca.crt",
                                "path": "ca.crt"
                              }
                            ],
                            "name": "kube-root-ca.crt"
                          }
                        },
                        {
                          "downwardAPI": {
                            "items": [
                              {
                                "fieldRef": {
                                  "apiVersion": "v1",
                                  "fieldPath": "metadata.namespace"
                                },
                                "path": "namespace"
                              }
                            ]
                          }
                        }
                      ]
                    }
                  }
                ]
              },
              "status": {
                "phase": "Pending",
                "qosClass": "BestEffort"
              }
            }"#]],
    );
}

#[test]
fn pod_qos_classes() {
    let qos = |res: Value| {
        let p = pod("p", |p| set(p, "spec.containers.0.resources", res));
        let got = admit_create("Pod", p, &mut allocs()).unwrap();
        str_at(&got, "/status/qosClass").to_string()
    };
    assert_eq!(qos(json!({})), "BestEffort");
    assert_eq!(qos(json!({"requests": {"cpu": "100m"}})), "Burstable");
    assert_eq!(
        qos(json!({"limits": {"cpu": "1", "memory": "1Gi"}})),
        "Guaranteed"
    );
}

#[test]
fn pod_validation() {
    rejects(
        "Pod",
        pod("p", |p| set(p, "spec.containers", json!([]))),
        &["spec.containers: Required value"],
    );
    rejects(
        "Pod",
        pod("p", |p| {
            set(
                p,
                "spec.containers",
                json!([{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]),
            )
        }),
        &["spec.containers[1].name: Duplicate value: \"a\""],
    );
    rejects(
        "Pod",
        pod("p", |p| set(p, "spec.containers.0.image", json!(""))),
        &["spec.containers[0].image: Required value"],
    );
    rejects(
        "Pod",
        pod("p", |p| {
            set(p, "spec.containers.0.ports.0.containerPort", json!(0))
        }),
        &[
            "spec.containers[0].ports[0].containerPort: Invalid value: 0: must be between 1 and 65535, inclusive",
        ],
    );
    rejects(
        "Pod",
        pod("p", |p| set(p, "spec.hostname", json!("Web_0"))),
        &[
            "spec.hostname: Invalid value: \"Web_0\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ],
    );
    rejects(
        "Pod",
        pod("p", |p| set(p, "spec.subdomain", json!("a.b"))),
        &["spec.subdomain: Invalid value: \"a.b\": must not contain dots"],
    );
    rejects(
        "Pod",
        pod("P", |_| {}),
        &[
            "metadata.name: Invalid value: \"P\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ],
    );
}

#[test]
fn pod_updates() {
    let mut a = allocs();
    let stored = admit_create("Pod", pod("p", |_| {}), &mut a).unwrap();
    // The image may change, and a node may be bound once.
    let mut new = stored.clone();
    set(&mut new, "spec.containers.0.image", json!("nginx:1.26"));
    set(&mut new, "spec.nodeName", json!("node-1"));
    let bound = admit_update("Pod", &stored, new, &mut a).unwrap();
    assert_eq!(str_at(&bound, "/spec/nodeName"), "node-1");
    let mut new = bound.clone();
    set(&mut new, "spec.nodeName", json!("node-2"));
    set(&mut new, "spec.restartPolicy", json!("Never"));
    let errs = admit_update("Pod", &bound, new, &mut a).unwrap_err();
    assert_eq!(
        messages(&errs),
        [
            "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n  changed: spec.nodeName, spec.restartPolicy"
        ]
    );
    // Status writes keep the spec and take the status.
    let mut st = bound.clone();
    set(&mut st, "spec.containers.0.image", json!("evil"));
    set(
        &mut st,
        "status",
        json!({"phase": "Running", "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}]}),
    );
    let got = admit_status_update("Pod", &bound, st).unwrap();
    assert_eq!(str_at(&got, "/spec/containers/0/image"), "nginx:1.26");
    assert_eq!(str_at(&got, "/status/podIP"), "10.244.0.5");
    let mut st = bound.clone();
    set(&mut st, "status", json!({"phase": "Sleeping"}));
    assert_eq!(
        messages(&admit_status_update("Pod", &bound, st).unwrap_err()),
        [
            "status.phase: Unsupported value: \"Sleeping\": supported values: \"Failed\", \"Pending\", \"Running\", \"Succeeded\", \"Unknown\""
        ]
    );
}

#[test]
fn loopback_endpoints_only_with_a_loopback_service_cidr() {
    let ep = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "dev", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": 8080}]}]
    });
    assert!(admit_create("Endpoints", ep.clone(), &mut allocs()).is_err());
    let cfg = svcnet_admission::AdmissionConfig {
        service_cidrs: vec!["127.96.0.0/16".parse().unwrap()],
        ..Default::default()
    };
    let mut dev = svcnet_admission::Allocators::new(cfg).unwrap();
    assert!(dev.loopback_services());
    admit_create("Endpoints", ep, &mut dev).unwrap();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "dev-1", "namespace": "default"},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"]}],
        "ports": [{"port": 8080}]
    });
    assert!(admit_create("EndpointSlice", slice.clone(), &mut allocs()).is_err());
    admit_create("EndpointSlice", slice, &mut dev).unwrap();
}

#[test]
fn endpoints() {
    let ep = |f: &dyn Fn(&mut Value)| {
        let mut v = json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "mysql", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "192.168.1.10"}], "ports": [{"port": 3306}]}]
        });
        f(&mut v);
        v
    };
    let got = admit_create("Endpoints", ep(&|_| {}), &mut allocs()).unwrap();
    assert_eq!(str_at(&got, "/subsets/0/ports/0/protocol"), "TCP");
    rejects(
        "Endpoints",
        ep(&|v| set(v, "subsets.0.addresses.0.ip", json!("127.0.0.1"))),
        &[
            "subsets[0].addresses[0].ip: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
        ],
    );
    rejects(
        "Endpoints",
        ep(&|v| {
            set(
                v,
                "subsets.0.notReadyAddresses",
                json!([{"ip": "169.254.1.1"}]),
            )
        }),
        &[
            "subsets[0].notReadyAddresses[0].ip: Invalid value: \"169.254.1.1\": may not be in the link-local range (169.254.0.0/16, fe80::/10)",
        ],
    );
    rejects(
        "Endpoints",
        ep(&|v| {
            set(
                v,
                "subsets.0.ports",
                json!([{"port": 0, "name": "a"}, {"port": 1}]),
            )
        }),
        &[
            "subsets[0].ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
            "subsets[0].ports[1].name: Required value",
        ],
    );
}

#[test]
fn endpoint_slices() {
    let slice = |f: &dyn Fn(&mut Value)| {
        let mut v = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.5"], "conditions": {"ready": true}}],
            "ports": [{"port": 80}]
        });
        f(&mut v);
        v
    };
    let got = admit_create("EndpointSlice", slice(&|_| {}), &mut allocs()).unwrap();
    assert_eq!(
        got["ports"],
        json!([{"name": "", "port": 80, "protocol": "TCP"}])
    );
    rejects(
        "EndpointSlice",
        slice(&|v| set(v, "addressType", json!(""))),
        &["addressType: Required value"],
    );
    rejects(
        "EndpointSlice",
        slice(&|v| set(v, "addressType", json!("IPX"))),
        &[
            "addressType: Unsupported value: \"IPX\": supported values: \"FQDN\", \"IPv4\", \"IPv6\"",
        ],
    );
    rejects(
        "EndpointSlice",
        slice(&|v| set(v, "endpoints.0.addresses", json!(["fd00::1"]))),
        &["endpoints[0].addresses[0]: Invalid value: \"fd00::1\": must be a valid IPv4 address"],
    );
    rejects(
        "EndpointSlice",
        slice(&|v| set(v, "endpoints.0.addresses", json!([]))),
        &["endpoints[0].addresses: Required value: must contain at least 1 address"],
    );
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"addresses": [format!("10.1.{}.{}", i / 250, i % 250 + 1)]}))
        .collect();
    rejects(
        "EndpointSlice",
        slice(&|v| set(v, "endpoints", Value::Array(many.clone()))),
        &["endpoints: Too many: 1001: must have at most 1000 items"],
    );
    let addrs: Vec<String> = (0..101).map(|i| format!("10.2.0.{}", i + 1)).collect();
    rejects(
        "EndpointSlice",
        slice(&|v| set(v, "endpoints.0.addresses", json!(addrs))),
        &["endpoints[0].addresses: Too many: 101: must have at most 100 items"],
    );
    let ports: Vec<Value> = (0..101)
        .map(|i| json!({"name": format!("p{i}"), "port": 1000 + i}))
        .collect();
    rejects(
        "EndpointSlice",
        slice(&|v| set(v, "ports", Value::Array(ports.clone()))),
        &["ports: Too many: 101: must have at most 100 items"],
    );
    let got = admit_create(
        "EndpointSlice",
        slice(&|v| {
            set(v, "addressType", json!("FQDN"));
            set(v, "endpoints.0.addresses", json!(["db.example.com"]));
        }),
        &mut allocs(),
    );
    assert!(got.is_ok());
    let mut a = allocs();
    let stored = admit_create("EndpointSlice", slice(&|_| {}), &mut a).unwrap();
    let v6 = slice(&|v| {
        set(v, "addressType", json!("IPv6"));
        set(v, "endpoints.0.addresses", json!(["fd00::5"]));
    });
    assert_eq!(
        messages(&admit_update("EndpointSlice", &stored, v6, &mut a).unwrap_err()),
        ["addressType: Invalid value: \"IPv6\": field is immutable"]
    );
}

#[test]
fn namespaces_nodes_configmaps() {
    check(
        "Namespace",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
        expect![[r#"
        {
          "apiVersion": "v1",
          "kind": "Namespace",
          "metadata": {
            "labels": {
              "kubernetes.io/metadata.name": "team-a"
            },
            "name": "team-a"
          },
          "spec": {
            "finalizers": [
              "kubernetes"
            ]
          },
          "status": {
            "phase": "Active"
          }
        }"#]],
    );
    rejects(
        "Namespace",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a.b"}}),
        &["metadata.name: Invalid value: \"a.b\": must not contain dots"],
    );
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1.example"}});
    assert!(admit_create("Node", node, &mut allocs()).is_ok());
    rejects(
        "Node",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "namespace": "default"}}),
        &["metadata.namespace: Forbidden: not allowed on this type"],
    );
    rejects(
        "ConfigMap",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"}, "data": {"a b": "x"}}),
        &[
            "data[a b]: Invalid value: \"a b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
        ],
    );
    // Unknown kinds pass through untouched.
    let obj = json!({"kind": "Widget", "anything": [1, 2]});
    assert_eq!(
        admit_create("Widget", obj.clone(), &mut allocs()).unwrap(),
        obj
    );
}

#[test]
fn configmap_size_and_immutability() {
    let cm = |data: Value, immutable: Option<bool>| {
        let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "c", "namespace": "default"}, "data": data});
        if let Some(i) = immutable {
            v["immutable"] = json!(i);
        }
        v
    };
    // 1 MiB of data and keys together is the limit (upstream's MaxSecretSize).
    let at_limit = "x".repeat(svcnet_admission::MAX_CONFIGMAP_BYTES - 1);
    assert!(admit_create("ConfigMap", cm(json!({"k": at_limit}), None), &mut allocs()).is_ok());
    let over = "x".repeat(svcnet_admission::MAX_CONFIGMAP_BYTES);
    rejects(
        "ConfigMap",
        cm(json!({"k": over}), None),
        &["Too long: may not be more than 1048576 bytes"],
    );
    let errs = admit_create(
        "ConfigMap",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"},
               "data": {"a": "x".repeat(600 * 1024)},
               "binaryData": {"b": base64_of(600 * 1024)}}),
        &mut allocs(),
    )
    .expect_err("data and binaryData count together");
    assert!(
        !errs[0].is_decode_error(),
        "a size error is a 422, not a decode error"
    );

    // Once immutable, neither the data nor the flag may change; metadata still may.
    let old = admit_create(
        "ConfigMap",
        cm(json!({"a": "1"}), Some(true)),
        &mut allocs(),
    )
    .unwrap();
    let refuse = |new: Value, want: &[&str]| {
        let errs = admit_update("ConfigMap", &old, new, &mut allocs()).expect_err("accepted");
        assert_eq!(messages(&errs), want);
    };
    refuse(
        cm(json!({"a": "2"}), Some(true)),
        &["data: Forbidden: field is immutable when `immutable` is set"],
    );
    refuse(
        cm(json!({"a": "1"}), Some(false)),
        &["immutable: Forbidden: field is immutable when `immutable` is set"],
    );
    refuse(
        cm(json!({"a": "1"}), None),
        &["immutable: Forbidden: field is immutable when `immutable` is set"],
    );
    let mut relabelled = cm(json!({"a": "1"}), Some(true));
    relabelled["metadata"]["labels"] = json!({"x": "y"});
    assert!(admit_update("ConfigMap", &old, relabelled, &mut allocs()).is_ok());
    // A mutable ConfigMap may become immutable, and change on the way.
    let mutable = admit_create("ConfigMap", cm(json!({"a": "1"}), None), &mut allocs()).unwrap();
    assert!(
        admit_update(
            "ConfigMap",
            &mutable,
            cm(json!({"a": "3"}), Some(true)),
            &mut allocs()
        )
        .is_ok()
    );
}

fn base64_of(n: usize) -> String {
    use std::iter::repeat_n;
    // "AAAA" decodes to three zero bytes.
    repeat_n("AAAA", n / 3).collect()
}

#[test]
fn kinds_admitted_through_their_typed_schema() {
    let cases = [
        ("ServiceAccount", "v1", json!({"secrets": "none"})),
        (
            "ReplicaSet",
            "apps/v1",
            json!({"spec": {"replicas": "three"}}),
        ),
        (
            "Lease",
            "coordination.k8s.io/v1",
            json!({"spec": {"leaseDurationSeconds": "ten"}}),
        ),
        (
            "events.k8s.io/Event",
            "events.k8s.io/v1",
            json!({"eventTime": 5}),
        ),
    ];
    for (kind, api_version, bad) in cases {
        let short = kind.rsplit('/').next().unwrap();
        let mut obj = json!({"apiVersion": api_version, "kind": short,
                             "metadata": {"name": "x", "namespace": "default"}});
        let good = admit_create(kind, obj.clone(), &mut allocs())
            .unwrap_or_else(|e| panic!("{kind}: {:?}", messages(&e)));
        assert_eq!(
            (good["apiVersion"].as_str(), good["kind"].as_str()),
            (Some(api_version), Some(short))
        );
        // Blank apiVersion/kind (a merge patch that cleared them) are filled, not stored blank.
        obj["apiVersion"] = json!(api_version);
        let mut blanked = obj.clone();
        blanked.as_object_mut().unwrap().remove("kind");
        let filled = admit_update(kind, &good, blanked, &mut allocs()).unwrap();
        assert_eq!(filled["kind"], short, "{kind}");
        // Wrongly typed fields are a decode error (400), never stored.
        let mut wrong = obj.clone();
        for (k, v) in bad.as_object().unwrap() {
            wrong[k] = v.clone();
        }
        let errs = admit_create(kind, wrong, &mut allocs()).expect_err(kind);
        assert!(errs[0].is_decode_error(), "{kind}: {:?}", messages(&errs));
        // Invalid names are refused.
        let mut named = obj.clone();
        named["metadata"]["name"] = json!("Not_A_Name");
        assert!(admit_create(kind, named, &mut allocs()).is_err(), "{kind}");
    }
}
