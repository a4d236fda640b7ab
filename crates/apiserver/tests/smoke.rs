#![allow(clippy::unwrap_used)]
mod common;

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, ListParams, PostParams};

#[tokio::test]
async fn smoke() {
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    let ns: Api<Namespace> = Api::all(client.clone());
    let names: Vec<_> = ns
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert!(names.contains(&"default".to_string()), "{names:?}");
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let k = svcs.get("kubernetes").await.unwrap();
    assert_eq!(k.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.1"));
    let s: Service = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .unwrap();
    svcs.create(&PostParams::default(), &s).await.unwrap();
    ts.stop().await;
}
