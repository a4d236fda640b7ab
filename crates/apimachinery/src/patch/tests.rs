use expect_test::{Expect, expect};
use serde_json::{Value, json};

use super::*;

#[test]
fn content_types() {
    let cases = [
        ("application/json-patch+json", Some(PatchType::Json)),
        ("application/merge-patch+json", Some(PatchType::Merge)),
        (
            "application/strategic-merge-patch+json",
            Some(PatchType::StrategicMerge),
        ),
        ("application/apply-patch+yaml", Some(PatchType::Apply)),
        (
            "application/merge-patch+json; charset=utf-8",
            Some(PatchType::Merge),
        ),
        ("Application/JSON-Patch+JSON ;x=y", Some(PatchType::Json)),
        ("application/json", None),
        ("", None),
    ];
    for (ct, want) in cases {
        assert_eq!(PatchType::from_content_type(ct), want, "{ct}");
    }
    for t in PatchType::ALL {
        assert_eq!(PatchType::from_content_type(t.content_type()), Some(t));
    }
}

fn service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "myapp", "namespace": "default", "labels": {"app": "myapp", "tier": "web"}},
        "spec": {
            "selector": {"app": "myapp"},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
            "clusterIP": "10.96.0.20", "type": "ClusterIP"
        }
    })
}

#[test]
fn json_patch() {
    let body = br#"[{"op":"replace","path":"/spec/ports/0/port","value":81},
                    {"op":"add","path":"/metadata/labels/new","value":"x"},
                    {"op":"remove","path":"/metadata/labels/tier"}]"#;
    let out = apply("Service", &service(), PatchType::Json, body).unwrap();
    assert_eq!(out["spec"]["ports"][0]["port"], 81);
    assert_eq!(
        out["metadata"]["labels"],
        json!({"app": "myapp", "new": "x"})
    );

    let ok_test = br#"[{"op":"test","path":"/spec/type","value":"ClusterIP"},
                       {"op":"replace","path":"/spec/type","value":"NodePort"}]"#;
    let out = apply("Service", &service(), PatchType::Json, ok_test).unwrap();
    assert_eq!(out["spec"]["type"], "NodePort");

    let failed_test = br#"[{"op":"test","path":"/spec/type","value":"NodePort"}]"#;
    let err = apply("Service", &service(), PatchType::Json, failed_test).unwrap_err();
    assert_eq!(
        err,
        PatchError::TestFailed {
            path: "/spec/type".into()
        }
    );
    assert_eq!(err.http_status(), 422);

    let missing = br#"[{"op":"remove","path":"/spec/nothing"}]"#;
    let err = apply("Service", &service(), PatchType::Json, missing).unwrap_err();
    assert!(matches!(err, PatchError::Unprocessable(_)), "{err:?}");
    assert_eq!(err.http_status(), 422);

    for bad in [&b"{"[..], b"{}", br#"[{"op":"frobnicate","path":"/a"}]"#] {
        let err = apply("Service", &service(), PatchType::Json, bad).unwrap_err();
        assert!(err.is_malformed(), "{err:?}");
        assert_eq!(err.http_status(), 400);
    }
}

#[test]
fn merge_patch() {
    let body = br#"{"metadata":{"labels":{"tier":null,"new":"x"}},
                    "spec":{"ports":[{"port":90}]}}"#;
    let out = apply("Service", &service(), PatchType::Merge, body).unwrap();
    assert_eq!(
        out["metadata"]["labels"],
        json!({"app": "myapp", "new": "x"})
    );
    // RFC 7386 replaces lists whole.
    assert_eq!(out["spec"]["ports"], json!([{"port": 90}]));
    for bad in [&b"[1]"[..], b"nope", b"\"s\""] {
        assert!(
            apply("Service", &service(), PatchType::Merge, bad)
                .unwrap_err()
                .is_malformed()
        );
    }
}

#[test]
fn apply_body_yaml_and_json() {
    let yaml = b"apiVersion: v1\nkind: Service\nmetadata:\n  name: myapp\n  labels:\n    extra: \"yes\"\nspec:\n  ports:\n  - port: 443\n    targetPort: 8443\n    name: https\n";
    let out = apply("Service", &service(), PatchType::Apply, yaml).unwrap();
    assert_eq!(
        out["metadata"]["labels"],
        json!({"app": "myapp", "tier": "web", "extra": "yes"})
    );
    // Service ports merge by `port`: the applied port is added beside the live one.
    assert_eq!(
        out["spec"]["ports"],
        json!([
            {"name": "https", "port": 443, "targetPort": 8443},
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
        ])
    );
    let json_body = br#"{"spec":{"type":"NodePort"}}"#;
    let out = apply("Service", &service(), PatchType::Apply, json_body).unwrap();
    assert_eq!(out["spec"]["type"], "NodePort");
    for bad in [&b"- a\n- b\n"[..], b"a: [unclosed", b"\xff\xfe"] {
        assert!(
            apply("Service", &service(), PatchType::Apply, bad)
                .unwrap_err()
                .is_malformed()
        );
    }
}

fn check(kind: &str, original: Value, patch: Value, want: Expect) {
    let out =
        strategic_merge(kind, &original, &patch).unwrap_or_else(|e| panic!("patch failed: {e}"));
    // The result must not carry any directive.
    let text = serde_json::to_string_pretty(&sorted(out)).unwrap();
    assert!(!text.contains("\"$"), "directive left in result: {text}");
    want.assert_eq(&text);
}

/// Rebuilds objects with sorted keys so snapshots do not depend on serde_json's
/// `preserve_order` feature, which another crate in the workspace may turn on.
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut pairs: Vec<(String, Value)> = m.into_iter().collect();
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(pairs.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "finalizers": ["a", "b", "c"]},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {"name": "web", "image": "nginx:1.25",
                         "ports": [{"containerPort": 80, "protocol": "TCP"}],
                         "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                        {"name": "sidecar", "image": "busybox", "command": ["sleep", "inf"]}
                    ],
                    "volumes": [{"name": "data", "emptyDir": {}}]
                }
            }
        }
    })
}

/// `kubectl apply` of a Service manifest whose port changed from 80 to 8080: kubectl sends
/// the new item, a delete for the old one and the new order.
#[test]
fn smp_kubectl_apply_changes_service_port() {
    check(
        "Service",
        service(),
        json!({
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}\n"}},
            "spec": {
                "$setElementOrder/ports": [{"port": 8080}],
                "ports": [
                    {"name": "http", "port": 8080, "protocol": "TCP", "targetPort": 8080},
                    {"$patch": "delete", "port": 80}
                ]
            }
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "annotations": {
                  "kubectl.kubernetes.io/last-applied-configuration": "{...}\n"
                },
                "labels": {
                  "app": "myapp",
                  "tier": "web"
                },
                "name": "myapp",
                "namespace": "default"
              },
              "spec": {
                "clusterIP": "10.96.0.20",
                "ports": [
                  {
                    "name": "http",
                    "port": 8080,
                    "protocol": "TCP",
                    "targetPort": 8080
                  }
                ],
                "selector": {
                  "app": "myapp"
                },
                "type": "ClusterIP"
              }
            }"#]],
    );
}

/// `kubectl apply` after a label was removed from the manifest, and a port added.
#[test]
fn smp_kubectl_apply_removes_label_adds_port() {
    check(
        "Service",
        service(),
        json!({
            "metadata": {"labels": {"tier": null}},
            "spec": {
                "$setElementOrder/ports": [{"port": 443}, {"port": 80}],
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443}]
            }
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "labels": {
                  "app": "myapp"
                },
                "name": "myapp",
                "namespace": "default"
              },
              "spec": {
                "clusterIP": "10.96.0.20",
                "ports": [
                  {
                    "name": "https",
                    "port": 443,
                    "protocol": "TCP",
                    "targetPort": 8443
                  },
                  {
                    "name": "http",
                    "port": 80,
                    "protocol": "TCP",
                    "targetPort": 8080
                  }
                ],
                "selector": {
                  "app": "myapp"
                },
                "type": "ClusterIP"
              }
            }"#]],
    );
}

/// `kubectl apply` of a Deployment that adds a container port, changes an image, removes an
/// env var and switches the strategy (with `$retainKeys`).
#[test]
fn smp_kubectl_apply_deployment() {
    check(
        "Deployment",
        deployment(),
        json!({
            "spec": {
                "replicas": 3,
                "strategy": {"$retainKeys": ["type"], "rollingUpdate": null, "type": "Recreate"},
                "template": {"spec": {
                    "$setElementOrder/containers": [{"name": "web"}, {"name": "sidecar"}],
                    "containers": [{
                        "$setElementOrder/env": [{"name": "A"}],
                        "$setElementOrder/ports": [{"containerPort": 80}, {"containerPort": 443}],
                        "env": [{"$patch": "delete", "name": "B"}],
                        "image": "nginx:1.26",
                        "name": "web",
                        "ports": [{"containerPort": 443, "protocol": "TCP"}]
                    }]
                }}
            }
        }),
        expect![[r#"
            {
              "apiVersion": "apps/v1",
              "kind": "Deployment",
              "metadata": {
                "finalizers": [
                  "a",
                  "b",
                  "c"
                ],
                "name": "web",
                "namespace": "default"
              },
              "spec": {
                "replicas": 3,
                "selector": {
                  "matchLabels": {
                    "app": "web"
                  }
                },
                "strategy": {
                  "type": "Recreate"
                },
                "template": {
                  "metadata": {
                    "labels": {
                      "app": "web"
                    }
                  },
                  "spec": {
                    "containers": [
                      {
                        "env": [
                          {
                            "name": "A",
                            "value": "1"
                          }
                        ],
                        "image": "nginx:1.26",
                        "name": "web",
                        "ports": [
                          {
                            "containerPort": 80,
                            "protocol": "TCP"
                          },
                          {
                            "containerPort": 443,
                            "protocol": "TCP"
                          }
                        ]
                      },
                      {
                        "command": [
                          "sleep",
                          "inf"
                        ],
                        "image": "busybox",
                        "name": "sidecar"
                      }
                    ],
                    "volumes": [
                      {
                        "emptyDir": {},
                        "name": "data"
                      }
                    ]
                  }
                }
              }
            }"#]],
    );
}

/// A volume that changes source: `$retainKeys` drops the old source inside the list item.
#[test]
fn smp_retain_keys_in_list_item_and_new_container() {
    check(
        "Deployment",
        deployment(),
        json!({
            "spec": {"template": {"spec": {
                "containers": [{"name": "debug", "image": "busybox", "env": [{"name": "X", "value": null}]}],
                "volumes": [{"$retainKeys": ["configMap", "name"], "configMap": {"name": "cfg"}, "name": "data"}]
            }}}
        }),
        expect![[r#"
            {
              "apiVersion": "apps/v1",
              "kind": "Deployment",
              "metadata": {
                "finalizers": [
                  "a",
                  "b",
                  "c"
                ],
                "name": "web",
                "namespace": "default"
              },
              "spec": {
                "replicas": 2,
                "selector": {
                  "matchLabels": {
                    "app": "web"
                  }
                },
                "strategy": {
                  "rollingUpdate": {
                    "maxSurge": "25%",
                    "maxUnavailable": "25%"
                  },
                  "type": "RollingUpdate"
                },
                "template": {
                  "metadata": {
                    "labels": {
                      "app": "web"
                    }
                  },
                  "spec": {
                    "containers": [
                      {
                        "env": [
                          {
                            "name": "X"
                          }
                        ],
                        "image": "busybox",
                        "name": "debug"
                      },
                      {
                        "env": [
                          {
                            "name": "A",
                            "value": "1"
                          },
                          {
                            "name": "B",
                            "value": "2"
                          }
                        ],
                        "image": "nginx:1.25",
                        "name": "web",
                        "ports": [
                          {
                            "containerPort": 80,
                            "protocol": "TCP"
                          }
                        ]
                      },
                      {
                        "command": [
                          "sleep",
                          "inf"
                        ],
                        "image": "busybox",
                        "name": "sidecar"
                      }
                    ],
                    "volumes": [
                      {
                        "configMap": {
                          "name": "cfg"
                        },
                        "name": "data"
                      }
                    ]
                  }
                }
              }
            }"#]],
    );
}

#[test]
fn smp_primitive_lists() {
    // kubectl apply removing finalizer "b": delete directive plus the new order.
    check(
        "Deployment",
        json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
        json!({"metadata": {
            "$setElementOrder/finalizers": ["a", "c"],
            "$deleteFromPrimitiveList/finalizers": ["b"]
        }}),
        expect![[r#"
            {
              "metadata": {
                "finalizers": [
                  "a",
                  "c"
                ]
              }
            }"#]],
    );
    // Adding to a merge-strategy primitive list is a union; the patch order leads.
    check(
        "Node",
        json!({"spec": {"podCIDRs": ["10.244.0.0/24"], "taints": [{"key": "a", "effect": "NoSchedule"}]}}),
        json!({"spec": {"podCIDRs": ["fd00::/64", "10.244.0.0/24"], "taints": [{"key": "b", "effect": "NoSchedule"}]}}),
        expect![[r#"
            {
              "spec": {
                "podCIDRs": [
                  "fd00::/64",
                  "10.244.0.0/24"
                ],
                "taints": [
                  {
                    "effect": "NoSchedule",
                    "key": "b"
                  }
                ]
              }
            }"#]],
    );
}

#[test]
fn smp_directives_on_maps_and_lists() {
    // `$patch: replace` on a map replaces it whole; `$patch: delete` empties it.
    check(
        "Service",
        service(),
        json!({
            "metadata": {"labels": {"$patch": "replace", "only": "this"}},
            "spec": {"selector": {"$patch": "delete"}}
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "labels": {
                  "only": "this"
                },
                "name": "myapp",
                "namespace": "default"
              },
              "spec": {
                "clusterIP": "10.96.0.20",
                "ports": [
                  {
                    "name": "http",
                    "port": 80,
                    "protocol": "TCP",
                    "targetPort": 8080
                  }
                ],
                "selector": {},
                "type": "ClusterIP"
              }
            }"#]],
    );
    // `{"$patch": "replace"}` as a list item: the rest of the patch list replaces the list.
    check(
        "Service",
        service(),
        json!({"spec": {"ports": [{"$patch": "replace"}, {"port": 9000, "name": "only"}]}}),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "labels": {
                  "app": "myapp",
                  "tier": "web"
                },
                "name": "myapp",
                "namespace": "default"
              },
              "spec": {
                "clusterIP": "10.96.0.20",
                "ports": [
                  {
                    "name": "only",
                    "port": 9000
                  }
                ],
                "selector": {
                  "app": "myapp"
                },
                "type": "ClusterIP"
              }
            }"#]],
    );
}

#[test]
fn smp_atomic_lists_and_status_conditions() {
    // Endpoints subsets and EndpointSlice endpoints are replaced whole.
    check(
        "Endpoints",
        json!({"subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]}),
        json!({"subsets": [{"addresses": [{"ip": "10.0.0.2"}]}]}),
        expect![[r#"
            {
              "subsets": [
                {
                  "addresses": [
                    {
                      "ip": "10.0.0.2"
                    }
                  ]
                }
              ]
            }"#]],
    );
    check(
        "EndpointSlice",
        json!({"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}], "ports": [{"port": 80}]}),
        json!({"endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": true}}]}),
        expect![[r#"
            {
              "addressType": "IPv4",
              "endpoints": [
                {
                  "addresses": [
                    "10.0.0.2"
                  ],
                  "conditions": {
                    "ready": true
                  }
                }
              ],
              "ports": [
                {
                  "port": 80
                }
              ]
            }"#]],
    );
    // Pod status conditions merge by type (what a kubelet-like status patch sends).
    check(
        "Pod",
        json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"}
        ]}}),
        json!({"status": {"phase": "Running", "podIP": "10.244.0.7", "podIPs": [{"ip": "10.244.0.7"}],
                          "conditions": [{"type": "Ready", "status": "True"}]}}),
        expect![[r#"
            {
              "status": {
                "conditions": [
                  {
                    "status": "True",
                    "type": "PodScheduled"
                  },
                  {
                    "status": "True",
                    "type": "Ready"
                  }
                ],
                "phase": "Running",
                "podIP": "10.244.0.7",
                "podIPs": [
                  {
                    "ip": "10.244.0.7"
                  }
                ]
              }
            }"#]],
    );
}

#[test]
fn smp_errors() {
    let cases = [
        (
            json!({"spec": {"ports": [{"name": "x"}]}}),
            false,
            "does not contain declared merge key: port",
        ),
        (
            json!({"spec": {"ports": [{"$patch": "delete"}]}}),
            false,
            "merge key",
        ),
        (
            json!({"spec": {"ports": [{"$patch": "bogus", "port": 80}]}}),
            true,
            "unknown patch type",
        ),
        (
            json!({"spec": {"$patch": "bogus"}}),
            true,
            "unknown patch type",
        ),
        (
            json!({"spec": {"$retainKeys": "type"}}),
            true,
            "$retainKeys must be a list",
        ),
        (
            json!({"spec": {"$retainKeys": ["type"], "clusterIP": "x"}}),
            true,
            "not in $retainKeys",
        ),
        (
            json!({"spec": {"$setElementOrder/ports": [{"port": 1}], "ports": [{"port": 2}]}}),
            true,
            "doesn't match",
        ),
        (
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
            true,
            "must be a list",
        ),
        (
            json!({"spec": {"ports": [80]}}),
            false,
            "must all be objects or all be scalars",
        ),
    ];
    for (patch, malformed, want) in cases {
        let err = strategic_merge("Service", &service(), &patch).unwrap_err();
        assert_eq!(err.is_malformed(), malformed, "{patch}: {err:?}");
        assert!(err.to_string().contains(want), "{patch}: {err}");
    }
    assert!(
        strategic_merge("Service", &service(), &json!([]))
            .unwrap_err()
            .is_malformed()
    );
}

mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    use super::super::strategic_merge;

    /// Nested maps of short strings, with `null`s (deletions) in patches only.
    fn tree(nulls: bool) -> impl Strategy<Value = Value> {
        let leaf = if nulls {
            prop_oneof![3 => "[a-c]".prop_map(Value::from), 1 => Just(Value::Null)].boxed()
        } else {
            "[a-c]".prop_map(Value::from).boxed()
        };
        leaf.prop_recursive(3, 16, 3, |inner| {
            proptest::collection::btree_map("[a-d]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
        })
        .prop_map(|v| match v {
            Value::Object(_) => v,
            other => json!({ "data": other }),
        })
    }

    fn without_nulls(v: Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k, without_nulls(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    proptest! {
        /// Without lists or directives, a strategic merge patch is an RFC 7386 merge patch.
        #[test]
        fn smp_on_maps_is_merge_patch(original in tree(false), patch in tree(true)) {
            let smp = strategic_merge("ConfigMap", &original, &patch).unwrap();
            let mut merged = original.clone();
            json_patch::merge(&mut merged, &patch);
            prop_assert_eq!(without_nulls(smp), without_nulls(merged));
        }

        /// Applying the same port patch twice gives what applying it once gives, and every
        /// port of both lists is present exactly once.
        #[test]
        fn smp_port_merge_idempotent(
            live in proptest::collection::btree_set(1u16..6, 0..4),
            patch in proptest::collection::btree_set(1u16..6, 0..4),
        ) {
            let ports = |set: &std::collections::BTreeSet<u16>, tag: &str| -> Vec<Value> {
                set.iter().map(|p| json!({"port": p, "name": format!("{tag}{p}")})).collect()
            };
            let original = json!({"spec": {"ports": ports(&live, "live")}});
            let p = json!({"spec": {"ports": ports(&patch, "new")}});
            let once = strategic_merge("Service", &original, &p).unwrap();
            let twice = strategic_merge("Service", &once, &p).unwrap();
            prop_assert_eq!(&once, &twice);
            let got: Vec<u64> = once["spec"]["ports"].as_array().unwrap().iter()
                .map(|x| x["port"].as_u64().unwrap()).collect();
            let mut sorted_got = got.clone();
            sorted_got.sort();
            let want: Vec<u64> = live.union(&patch).map(|p| u64::from(*p)).collect();
            prop_assert_eq!(sorted_got, want);
            for item in once["spec"]["ports"].as_array().unwrap() {
                let port = item["port"].as_u64().unwrap() as u16;
                let tag = if patch.contains(&port) { "new" } else { "live" };
                prop_assert_eq!(item["name"].as_str().unwrap(), format!("{tag}{port}"));
            }
        }
    }
}
