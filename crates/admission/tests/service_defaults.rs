//! Service defaulting and allocation, snapshot-tested: the whole admitted
//! object is what `kubectl get svc -o yaml` shows. Refresh with
//! `UPDATE_EXPECT=1 cargo test -p svcnet-admission`.
#![allow(clippy::unwrap_used)] // tests may unwrap (RULES.md)

mod common;

use common::*;
use expect_test::{Expect, expect};
use serde_json::{Value, json};
use svcnet_admission::admit_create;

fn check(obj: Value, want: Expect) {
    let mut a = allocs();
    let got = admit_create("Service", obj, &mut a)
        .unwrap_or_else(|e| panic!("refused: {:?}", messages(&e)));
    want.assert_eq(&serde_json::to_string_pretty(&got).unwrap());
}

#[test]
fn cluster_ip_service() {
    check(
        service("default", "myapp", |s| {
            set(s, "spec.ports.0.targetPort", json!(9376))
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "name": "myapp",
                "namespace": "default"
              },
              "spec": {
                "clusterIP": "10.96.1.0",
                "clusterIPs": [
                  "10.96.1.0"
                ],
                "internalTrafficPolicy": "Cluster",
                "ipFamilies": [
                  "IPv4"
                ],
                "ipFamilyPolicy": "SingleStack",
                "ports": [
                  {
                    "port": 80,
                    "protocol": "TCP",
                    "targetPort": 9376
                  }
                ],
                "selector": {
                  "app": "myapp"
                },
                "sessionAffinity": "None",
                "type": "ClusterIP"
              },
              "status": {
                "loadBalancer": {}
              }
            }"#]],
    );
}

#[test]
fn node_port_service() {
    check(
        service("default", "web", |s| {
            set(s, "spec.type", json!("NodePort"));
            set(
                s,
                "spec.ports",
                json!([{"name": "http", "port": 80, "targetPort": "http"}, {"name": "dns", "port": 53, "protocol": "UDP"}]),
            );
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "name": "web",
                "namespace": "default"
              },
              "spec": {
                "clusterIP": "10.96.1.0",
                "clusterIPs": [
                  "10.96.1.0"
                ],
                "externalTrafficPolicy": "Cluster",
                "internalTrafficPolicy": "Cluster",
                "ipFamilies": [
                  "IPv4"
                ],
                "ipFamilyPolicy": "SingleStack",
                "ports": [
                  {
                    "name": "http",
                    "nodePort": 30086,
                    "port": 80,
                    "protocol": "TCP",
                    "targetPort": "http"
                  },
                  {
                    "name": "dns",
                    "nodePort": 30087,
                    "port": 53,
                    "protocol": "UDP",
                    "targetPort": 53
                  }
                ],
                "selector": {
                  "app": "web"
                },
                "sessionAffinity": "None",
                "type": "NodePort"
              },
              "status": {
                "loadBalancer": {}
              }
            }"#]],
    );
}

#[test]
fn load_balancer_local_with_client_ip_affinity() {
    check(
        service("default", "lb", |s| {
            set(s, "spec.type", json!("LoadBalancer"));
            set(s, "spec.externalTrafficPolicy", json!("Local"));
            set(s, "spec.sessionAffinity", json!("ClientIP"));
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "name": "lb",
                "namespace": "default"
              },
              "spec": {
                "allocateLoadBalancerNodePorts": true,
                "clusterIP": "10.96.1.0",
                "clusterIPs": [
                  "10.96.1.0"
                ],
                "externalTrafficPolicy": "Local",
                "healthCheckNodePort": 30087,
                "internalTrafficPolicy": "Cluster",
                "ipFamilies": [
                  "IPv4"
                ],
                "ipFamilyPolicy": "SingleStack",
                "ports": [
                  {
                    "nodePort": 30086,
                    "port": 80,
                    "protocol": "TCP",
                    "targetPort": 80
                  }
                ],
                "selector": {
                  "app": "lb"
                },
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {
                  "clientIP": {
                    "timeoutSeconds": 10800
                  }
                },
                "type": "LoadBalancer"
              },
              "status": {
                "loadBalancer": {
                  "ingress": [
                    {
                      "ip": "10.200.0.1",
                      "ipMode": "VIP"
                    }
                  ]
                }
              }
            }"#]],
    );
}

#[test]
fn headless_and_external_name() {
    check(
        service("default", "nginx", |s| {
            set(s, "spec.clusterIP", json!("None"))
        }),
        expect![[r#"
        {
          "apiVersion": "v1",
          "kind": "Service",
          "metadata": {
            "name": "nginx",
            "namespace": "default"
          },
          "spec": {
            "clusterIP": "None",
            "clusterIPs": [
              "None"
            ],
            "internalTrafficPolicy": "Cluster",
            "ipFamilies": [
              "IPv4"
            ],
            "ipFamilyPolicy": "SingleStack",
            "ports": [
              {
                "port": 80,
                "protocol": "TCP",
                "targetPort": 80
              }
            ],
            "selector": {
              "app": "nginx"
            },
            "sessionAffinity": "None",
            "type": "ClusterIP"
          },
          "status": {
            "loadBalancer": {}
          }
        }"#]],
    );
    check(
        service("default", "mysql", |s| {
            s["spec"] = json!({"type": "ExternalName", "externalName": "mysql.example.com"});
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "name": "mysql",
                "namespace": "default"
              },
              "spec": {
                "externalName": "mysql.example.com",
                "sessionAffinity": "None",
                "type": "ExternalName"
              },
              "status": {
                "loadBalancer": {}
              }
            }"#]],
    );
    // Headless without a selector: upstream makes it dual-stack in spirit.
    check(
        service("default", "ext", |s| {
            set(s, "spec.clusterIP", json!("None"));
            s["spec"].as_object_mut().unwrap().remove("selector");
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "name": "ext",
                "namespace": "default"
              },
              "spec": {
                "clusterIP": "None",
                "clusterIPs": [
                  "None"
                ],
                "internalTrafficPolicy": "Cluster",
                "ipFamilies": [
                  "IPv4",
                  "IPv6"
                ],
                "ipFamilyPolicy": "RequireDualStack",
                "ports": [
                  {
                    "port": 80,
                    "protocol": "TCP",
                    "targetPort": 80
                  }
                ],
                "sessionAffinity": "None",
                "type": "ClusterIP"
              },
              "status": {
                "loadBalancer": {}
              }
            }"#]],
    );
}

#[test]
fn kubernetes_service_gets_the_first_address_on_request() {
    check(
        service("default", "kubernetes", |s| {
            set(s, "spec.clusterIP", json!("10.96.0.1"))
        }),
        expect![[r#"
        {
          "apiVersion": "v1",
          "kind": "Service",
          "metadata": {
            "name": "kubernetes",
            "namespace": "default"
          },
          "spec": {
            "clusterIP": "10.96.0.1",
            "clusterIPs": [
              "10.96.0.1"
            ],
            "internalTrafficPolicy": "Cluster",
            "ipFamilies": [
              "IPv4"
            ],
            "ipFamilyPolicy": "SingleStack",
            "ports": [
              {
                "port": 80,
                "protocol": "TCP",
                "targetPort": 80
              }
            ],
            "selector": {
              "app": "kubernetes"
            },
            "sessionAffinity": "None",
            "type": "ClusterIP"
          },
          "status": {
            "loadBalancer": {}
          }
        }"#]],
    );
}

#[test]
fn unknown_fields_are_pruned_and_status_is_reset() {
    check(
        service("default", "p", |s| {
            set(s, "spec.bogus", json!(1));
            set(s, "status.loadBalancer.ingress", json!([{"ip": "1.2.3.4"}]));
        }),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "Service",
              "metadata": {
                "name": "p",
                "namespace": "default"
              },
              "spec": {
                "clusterIP": "10.96.1.0",
                "clusterIPs": [
                  "10.96.1.0"
                ],
                "internalTrafficPolicy": "Cluster",
                "ipFamilies": [
                  "IPv4"
                ],
                "ipFamilyPolicy": "SingleStack",
                "ports": [
                  {
                    "port": 80,
                    "protocol": "TCP",
                    "targetPort": 80
                  }
                ],
                "selector": {
                  "app": "p"
                },
                "sessionAffinity": "None",
                "type": "ClusterIP"
              },
              "status": {
                "loadBalancer": {}
              }
            }"#]],
    );
}
