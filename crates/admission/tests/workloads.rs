//! Deployments, StatefulSets, DaemonSets and ControllerRevisions: defaulting snapshots,
//! validation messages and what an update may change.
//! Refresh snapshots with `UPDATE_EXPECT=1 cargo test -p svcnet-admission`.

#![allow(clippy::unwrap_used)] // tests may unwrap (RULES.md)

mod common;

use common::*;
use expect_test::expect;
use serde_json::{Value, json};
use svcnet_admission::{admit_create, admit_update};

fn deployment(name: &str, f: impl FnOnce(&mut Value)) -> Value {
    let mut v = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "app", "image": "nginx"}]}}
        }
    });
    f(&mut v);
    v
}

#[test]
fn deployment_defaults() {
    check(
        "Deployment",
        deployment("myapp", |_| {}),
        expect![[r#"
        {
          "apiVersion": "apps/v1",
          "kind": "Deployment",
          "metadata": {
            "generation": 1,
            "name": "myapp",
            "namespace": "default"
          },
          "spec": {
            "progressDeadlineSeconds": 600,
            "replicas": 1,
            "revisionHistoryLimit": 10,
            "selector": {
              "matchLabels": {
                "app": "myapp"
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
                  "app": "myapp"
                }
              },
              "spec": {
                "containers": [
                  {
                    "image": "nginx",
                    "imagePullPolicy": "Always",
                    "name": "app",
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File"
                  }
                ],
                "dnsPolicy": "ClusterFirst",
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
                "securityContext": {},
                "terminationGracePeriodSeconds": 30
              }
            }
          },
          "status": {}
        }"#]],
    );
}

#[test]
fn deployment_validation() {
    rejects(
        "Deployment",
        deployment("d", |d| {
            set(d, "spec.template.metadata.labels", json!({"app": "other"}))
        }),
        &[
            "spec.template.metadata.labels: Invalid value: {\"app\":\"other\"}: `selector` does not match template `labels`",
        ],
    );
    rejects(
        "Deployment",
        deployment("d", |d| {
            d["spec"].as_object_mut().unwrap().remove("selector");
        }),
        &["spec.selector: Required value"],
    );
    rejects(
        "Deployment",
        deployment("d", |d| set(d, "spec.replicas", json!(-1))),
        &["spec.replicas: Invalid value: -1: must be greater than or equal to 0"],
    );
    rejects(
        "Deployment",
        deployment("d", |d| {
            set(
                d,
                "spec.strategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "0%"}}),
            )
        }),
        &[
            "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0",
        ],
    );
    rejects(
        "Deployment",
        deployment("d", |d| {
            set(d, "spec.template.spec.restartPolicy", json!("Never"))
        }),
        &[
            "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
        ],
    );
    let mut a = allocs();
    let stored = admit_create("Deployment", deployment("d", |_| {}), &mut a).unwrap();
    assert_eq!(int_at(&stored, "/metadata/generation"), 1);
    // Scaling bumps the generation; changing the selector is refused.
    let mut scaled = stored.clone();
    set(&mut scaled, "spec.replicas", json!(3));
    let scaled = admit_update("Deployment", &stored, scaled, &mut a).unwrap();
    assert_eq!(int_at(&scaled, "/metadata/generation"), 2);
    let relabel = deployment("d", |d| {
        set(d, "spec.selector.matchLabels", json!({"app": "x"}));
        set(d, "spec.template.metadata.labels", json!({"app": "x"}));
    });
    assert_eq!(
        messages(&admit_update("Deployment", &stored, relabel, &mut a).unwrap_err()),
        [
            "spec.selector: Invalid value: \"{\\\"matchLabels\\\":{\\\"app\\\":\\\"x\\\"}}\": field is immutable"
        ]
    );
}

#[test]
fn statefulset_defaults_and_updates() {
    let sts = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "serviceName": "nginx", "replicas": 2,
            "selector": {"matchLabels": {"app": "nginx"}},
            "template": {"metadata": {"labels": {"app": "nginx"}}, "spec": {"containers": [{"name": "nginx", "image": "nginx:1.25"}]}}
        }
    });
    check(
        "StatefulSet",
        sts.clone(),
        expect![[r#"
        {
          "apiVersion": "apps/v1",
          "kind": "StatefulSet",
          "metadata": {
            "generation": 1,
            "name": "web",
            "namespace": "default"
          },
          "spec": {
            "persistentVolumeClaimRetentionPolicy": {
              "whenDeleted": "Retain",
              "whenScaled": "Retain"
            },
            "podManagementPolicy": "OrderedReady",
            "replicas": 2,
            "revisionHistoryLimit": 10,
            "selector": {
              "matchLabels": {
                "app": "nginx"
              }
            },
            "serviceName": "nginx",
            "template": {
              "metadata": {
                "labels": {
                  "app": "nginx"
                }
              },
              "spec": {
                "containers": [
                  {
                    "image": "nginx:1.25",
                    "imagePullPolicy": "IfNotPresent",
                    "name": "nginx",
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File"
                  }
                ],
                "dnsPolicy": "ClusterFirst",
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
                "securityContext": {},
                "terminationGracePeriodSeconds": 30
              }
            },
            "updateStrategy": {
              "rollingUpdate": {
                "partition": 0
              },
              "type": "RollingUpdate"
            }
          },
          "status": {
            "replicas": 0
          }
        }"#]],
    );
    let mut a = allocs();
    let stored = admit_create("StatefulSet", sts, &mut a).unwrap();
    let mut renamed = stored.clone();
    set(&mut renamed, "spec.serviceName", json!("other"));
    assert_eq!(
        messages(&admit_update("StatefulSet", &stored, renamed, &mut a).unwrap_err()),
        [
            "spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
        ]
    );
    let mut bad = stored.clone();
    set(&mut bad, "spec.podManagementPolicy", json!("Random"));
    assert_eq!(
        messages(&admit_update("StatefulSet", &stored, bad, &mut a).unwrap_err()),
        [
            "spec.podManagementPolicy: Unsupported value: \"Random\": supported values: \"OrderedReady\", \"Parallel\"",
            "spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
        ]
    );
}

#[test]
fn daemonset_defaults_validation_and_updates() {
    let ds = |f: &dyn Fn(&mut Value)| {
        let mut v = deployment("agent", |_| {});
        v["kind"] = json!("DaemonSet");
        f(&mut v);
        v
    };
    let mut a = allocs();
    let stored = admit_create("DaemonSet", ds(&|_| {}), &mut a).unwrap();
    assert_eq!(
        stored["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
    );
    assert_eq!(stored["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(
        stored["spec"]["template"]["spec"]["restartPolicy"],
        "Always"
    );
    assert_eq!(stored["metadata"]["generation"], 1);
    rejects(
        "DaemonSet",
        ds(&|d| set(d, "spec.template.spec.restartPolicy", json!("Never"))),
        &[
            "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
        ],
    );
    rejects(
        "DaemonSet",
        ds(&|d| {
            set(
                d,
                "spec.updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}}),
            )
        }),
        &[
            "spec.updateStrategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0",
        ],
    );
    rejects(
        "DaemonSet",
        ds(&|d| set(d, "spec.updateStrategy", json!({"type": "Recreate"}))),
        &[
            "spec.updateStrategy.type: Unsupported value: \"Recreate\": supported values: \"OnDelete\", \"RollingUpdate\"",
        ],
    );
    // The selector is immutable; a template change bumps the generation.
    let mut moved = stored.clone();
    set(
        &mut moved,
        "spec.selector",
        json!({"matchLabels": {"app": "other"}}),
    );
    set(
        &mut moved,
        "spec.template.metadata.labels",
        json!({"app": "other"}),
    );
    let errs = messages(&admit_update("DaemonSet", &stored, moved, &mut a).unwrap_err());
    assert!(
        errs.iter()
            .any(|e| e.starts_with("spec.selector: Invalid value")
                && e.ends_with("field is immutable")),
        "{errs:?}"
    );
    let mut rolled = stored.clone();
    set(
        &mut rolled,
        "spec.template.spec.containers.0.image",
        json!("nginx:2"),
    );
    let updated = admit_update("DaemonSet", &stored, rolled, &mut a).unwrap();
    assert_eq!(updated["metadata"]["generation"], 2);
}

#[test]
fn controller_revisions_keep_their_data() {
    let obj = json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                     "metadata": {"name": "web-7b4f9", "namespace": "default"},
                     "revision": 1, "data": {"spec": {"template": {"$patch": "replace"}}}});
    let good = admit_create("ControllerRevision", obj.clone(), &mut allocs())
        .unwrap_or_else(|e| panic!("{:?}", messages(&e)));
    // A rollback renumbers a revision: allowed.
    let mut renumbered = good.clone();
    renumbered["revision"] = json!(3);
    let out = admit_update("ControllerRevision", &good, renumbered, &mut allocs()).unwrap();
    assert_eq!(out["revision"], 3);
    // Its data never changes.
    let mut changed = good.clone();
    changed["data"] = json!({"spec": {}});
    let errs = admit_update("ControllerRevision", &good, changed, &mut allocs()).unwrap_err();
    assert_eq!(
        messages(&errs),
        vec![r#"data: Invalid value: {"spec":{}}: field is immutable"#]
    );
    let mut no_data = obj.clone();
    no_data.as_object_mut().unwrap().remove("data");
    let errs = admit_create("ControllerRevision", no_data, &mut allocs()).unwrap_err();
    assert_eq!(
        messages(&errs),
        vec!["data: Required value: data is mandatory"]
    );
    let mut negative = obj.clone();
    negative["revision"] = json!(-1);
    let errs = admit_create("ControllerRevision", negative, &mut allocs()).unwrap_err();
    assert_eq!(
        messages(&errs),
        vec!["revision: Invalid value: -1: must be greater than or equal to 0"]
    );
    let mut wrong = obj;
    wrong["revision"] = json!("two");
    let errs = admit_create("ControllerRevision", wrong, &mut allocs()).unwrap_err();
    assert!(errs[0].is_decode_error(), "{:?}", messages(&errs));
}
