//! Server-side apply creates a missing object and updates an existing one, as upstream
//! (kube-rs `Patch::Apply` and the real `kubectl apply --server-side`).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33";

fn code(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn apply_creates_then_updates() {
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PatchParams::apply("test-manager");
    let cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "fresh"},
                     "spec": {"selector": {"app": "fresh"}, "ports": [{"port": 80}]}});
    let created = svcs.patch("fresh", &pp, &Patch::Apply(&cfg)).await.unwrap();
    let spec = created.spec.unwrap();
    assert!(
        spec.cluster_ip.unwrap().starts_with("10."),
        "admitted like a create"
    );
    assert_eq!(
        spec.ports.unwrap()[0].target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(80))
    );
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());

    let mut again = cfg.clone();
    again["metadata"]["labels"] = json!({"tier": "web"});
    let updated = svcs
        .patch("fresh", &pp, &Patch::Apply(&again))
        .await
        .unwrap();
    assert_eq!(updated.metadata.uid, created.metadata.uid);
    assert_eq!(updated.metadata.labels.unwrap()["tier"], "web");

    // Mismatched names, a missing namespace and a missing kind are refused.
    let err = svcs
        .patch("other", &pp, &Patch::Apply(&cfg))
        .await
        .unwrap_err();
    assert_eq!(code(err).0, 400);
    let missing: Api<Service> = Api::namespaced(client.clone(), "nowhere");
    let err = missing
        .patch("fresh", &pp, &Patch::Apply(&cfg))
        .await
        .unwrap_err();
    assert_eq!(code(err), (404, "namespaces \"nowhere\" not found".into()));
    let wrong = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
    let err = svcs
        .patch("x", &pp, &Patch::Apply(&wrong))
        .await
        .unwrap_err();
    assert_eq!(code(err).0, 400);
    assert!(svcs.get_opt("x").await.unwrap().is_none());
    // Other patch types still need the object.
    let err = svcs
        .patch("x", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .unwrap_err();
    assert_eq!(code(err).0, 404);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_server_side_creates() {
    assert!(Path::new(KUBECTL).exists(), "{KUBECTL} is missing");
    let ts = common::TestServer::start().await;
    let kc = ts.server().kubeconfig_path().to_path_buf();
    let manifest = ts.dir.path().join("ssa.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: ssa
spec:
  replicas: 2
  selector:
    matchLabels: {app: ssa}
  template:
    metadata:
      labels: {app: ssa}
    spec:
      containers:
      - {name: web, image: nginx}
---
apiVersion: v1
kind: Service
metadata:
  name: ssa
spec:
  selector: {app: ssa}
  ports:
  - {port: 80}
"#,
    )
    .unwrap();
    let m = manifest.clone();
    let k = kc.clone();
    tokio::task::spawn_blocking(move || {
        for _ in 0..2 {
            let out = Command::new(KUBECTL)
                .args(["apply", "--server-side", "-f"])
                .arg(&m)
                .env("KUBECONFIG", &k)
                .env("HOME", k.parent().unwrap())
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "{text}");
            assert!(
                text.contains("deployment.apps/ssa serverside-applied"),
                "{text}"
            );
            assert!(text.contains("service/ssa serverside-applied"), "{text}");
        }
    })
    .await
    .unwrap();
    let client = ts.client().await;
    let d: Api<Deployment> = Api::namespaced(client.clone(), "default");
    assert_eq!(d.get("ssa").await.unwrap().spec.unwrap().replicas, Some(2));
    let s: Api<Service> = Api::namespaced(client, "default");
    assert!(
        s.get("ssa")
            .await
            .unwrap()
            .spec
            .unwrap()
            .cluster_ip
            .is_some()
    );
    ts.stop().await;
}
