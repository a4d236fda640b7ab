//! The Node condition a pod network reports once it is up: `NetworkUnavailable=False`, as
//! flanneld (`FlannelIsUp`, `pkg/subnet/kube/kube.go`) and calico-node (`CalicoIsUp`) set it.

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::{Api, Client};

use crate::routes::{FLANNEL_ANNOTATION_PREFIX, PodNetwork};

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

/// Whether a pod network add-on has made `node` ready for pods, as a kubelet asks its runtime
/// before it sets up a pod's sandbox: `NetworkUnavailable=False` set, then the backend its
/// flannel lease names (`None` for one svcnet does not know: the caller keeps its own MTU).
/// The error is the reason pods wait, for their status.
pub fn network_ready(node: &Node) -> Result<Option<PodNetwork>, String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let available = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "NetworkUnavailable"))
        .is_some_and(|c| c.status == "False");
    if !available {
        return Err(format!(
            "network is not ready: node {name}'s pod network add-on has not set \
             NetworkUnavailable=False yet (NetworkPluginNotReady)"
        ));
    }
    Ok(node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{FLANNEL_ANNOTATION_PREFIX}backend-type")))
        .and_then(|t| t.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_wait_for_the_add_on_and_take_its_backend() {
        let node = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        let waiting = node(serde_json::json!({"metadata": {"name": "n1"}}));
        assert!(network_ready(&waiting).unwrap_err().contains("n1"));
        let up = |annotations: serde_json::Value| {
            node(serde_json::json!({
                "metadata": {"name": "n1", "annotations": annotations},
                "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]},
            }))
        };
        let vxlan = up(serde_json::json!({"flannel.alpha.coreos.com/backend-type": "vxlan"}));
        assert_eq!(network_ready(&vxlan), Ok(Some(PodNetwork::Vxlan)));
        assert_eq!(network_ready(&up(serde_json::json!({}))), Ok(None));
    }
}
