//! The Node condition a pod network reports once it is up: `NetworkUnavailable=False`, as
//! flanneld (`FlannelIsUp`, `pkg/subnet/kube/kube.go`) and calico-node (`CalicoIsUp`) set it.

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::{Api, Client};

use crate::routes::PodNetwork;

/// The reason and message the backend's own daemon writes.
pub fn reason(network: PodNetwork) -> (&'static str, &'static str) {
    match network {
        PodNetwork::Bgp | PodNetwork::Ipip => ("CalicoIsUp", "Calico is running on this node"),
        _ => ("FlannelIsUp", "Flannel is running on this node"),
    }
}

/// Sets `NetworkUnavailable=False` on Node `name` (other conditions untouched; retried on a
/// write conflict).
pub async fn report_network_available(
    client: &Client,
    name: &str,
    network: PodNetwork,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let (reason, message) = reason(network);
    let mut attempt = 0;
    loop {
        let mut node = api.get_status(name).await?;
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let conditions = node
            .status
            .get_or_insert_default()
            .conditions
            .get_or_insert_default();
        conditions.retain(|c| c.type_ != "NetworkUnavailable");
        conditions.push(NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
        match api.replace_status(name, &Default::default(), &node).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}
