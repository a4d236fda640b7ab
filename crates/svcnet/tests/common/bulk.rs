//! Background objects for the benches: many selectorless Services, each with one hand-written
//! EndpointSlice, created concurrently.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

/// Creates `count` Services named `name(i)` (port `http` 80/TCP) in the client's default
/// namespace, each with the EndpointSlice `<name>-1` holding `endpoints(i)` (port `http`
/// 8080/TCP), `writers` requests in flight.
pub async fn services_with_slices(
    client: &Client,
    count: usize,
    writers: usize,
    name: impl Fn(usize) -> String,
    endpoints: impl Fn(usize) -> Vec<Value>,
) -> Result<(), kube::Error> {
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    let objects = (0..count).map(|i| {
        let name = name(i);
        let svc = json!({
            "metadata": {"name": name},
            "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        });
        let slice = json!({
            "metadata": {"name": format!("{name}-1"),
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": endpoints(i),
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        });
        (svc, slice)
    });
    futures::stream::iter(objects)
        .map(|(svc, slice)| {
            let (svcs, slices) = (svcs.clone(), slices.clone());
            async move {
                let svc: Service = serde_json::from_value(svc).map_err(kube::Error::SerdeError)?;
                svcs.create(&PostParams::default(), &svc).await?;
                let slice: EndpointSlice =
                    serde_json::from_value(slice).map_err(kube::Error::SerdeError)?;
                slices.create(&PostParams::default(), &slice).await?;
                Ok::<(), kube::Error>(())
            }
        })
        .buffer_unordered(writers)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
}
