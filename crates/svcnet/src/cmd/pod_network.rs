//! The pod network backend that `svcnet cni install` runs on its node while it stays (the CNI
//! DaemonSet's second job, flanneld's): from the Node named by `NODE_NAME` it takes the pod
//! CIDR and InternalIP, makes the backend's device in its own (the node's) network namespace,
//! publishes flannel's lease annotations and `NetworkUnavailable=False`, follows the other
//! Nodes until stopped, and on uninstall removes its device and routes.

use std::time::Duration;

use anyhow::Context as _;
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;
use svcnet_agent::NodeTopology;
use svcnet_agent::podnet::daemon;
use svcnet_agent::routes::PodNetwork;

/// The backends the add-on runs: flannel's (Calico's BGP and IPIP run only in `svcnet up`).
pub const ADDON_BACKENDS: [PodNetwork; 3] =
    [PodNetwork::Vxlan, PodNetwork::HostGw, PodNetwork::Udp];

/// `svcnet cni install --pod-network`: one of [`ADDON_BACKENDS`], or `None` for `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddonNetwork(pub Option<PodNetwork>);

/// Parses `--pod-network`: a backend of [`ADDON_BACKENDS`], or `none` (install the plugin only).
pub fn parse(s: &str) -> Result<AddonNetwork, String> {
    parse_backend(s).map(AddonNetwork)
}

fn parse_backend(s: &str) -> Result<Option<PodNetwork>, String> {
    if s == "none" {
        return Ok(None);
    }
    let network: PodNetwork = s.parse()?;
    if !ADDON_BACKENDS.contains(&network) {
        return Err(format!(
            "{s}: the add-on runs flannel's backends (vxlan, host-gw, udp) or none; Calico's \
             bgp and ipip run in `svcnet up --pod-network`"
        ));
    }
    Ok(Some(network))
}

/// Waits for Node `name` to have a pod CIDR and an InternalIP, and returns them.
pub async fn wait_node(
    client: &kube::Client,
    name: &str,
) -> anyhow::Result<(Ipv4Net, std::net::Ipv4Addr)> {
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    loop {
        let node = api
            .get_opt(name)
            .await
            .with_context(|| format!("cannot read Node {name}"))?;
        if let Some(node) = node {
            let found =
                daemon::node_identity(&node).map_err(|e| anyhow::anyhow!("Node {name}: {e}"))?;
            if let Some(found) = found {
                return Ok(found);
            }
        }
        tracing::info!(node = %name, "waiting for the Node's spec.podCIDR and InternalIP");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A backend made ready on this node: its device exists and its lease is published.
pub struct Running {
    pub network: PodNetwork,
    pub node: NodeTopology,
}

/// Makes `network`'s device on node `name` (whose pod CIDR and InternalIP [`wait_node`]
/// found) and publishes the node's lease.
pub async fn start(
    client: &kube::Client,
    network: PodNetwork,
    name: &str,
    (pod_cidr, internal_ip): (Ipv4Net, std::net::Ipv4Addr),
) -> anyhow::Result<Running> {
    let node = {
        let name = name.to_string();
        tokio::task::spawn_blocking(move || -> anyhow::Result<NodeTopology> {
            let node = daemon::own_node(&name, pod_cidr, internal_ip)?;
            if network == PodNetwork::Vxlan {
                daemon::ensure_vtep(&node)?;
            }
            Ok(node)
        })
        .await
        .context("pod network start task")??
    };
    daemon::publish_lease(client, network, &node)
        .await
        .with_context(|| format!("cannot publish Node {name}'s flannel lease"))?;
    tracing::info!(
        node = %name, backend = %network, %pod_cidr, %internal_ip, underlay = %node.underlay_if,
        "pod network up"
    );
    Ok(Running { network, node })
}

/// What the backend left programmed when it stopped.
pub enum Left {
    /// The VTEP: its neighbour and FDB entries and routes go with it.
    Vtep,
    HostGwRoutes(daemon::HostGwPeers),
    /// Nothing: the UDP backend's TUN and its route went with its loop.
    Nothing,
}

impl Running {
    /// Follows the other Nodes until `shutdown`.
    pub async fn run(
        self,
        client: kube::Client,
        cluster_cidr: Ipv4Net,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<(NodeTopology, Left)> {
        let node = self.node.clone();
        let left = match self.network {
            PodNetwork::Vxlan => {
                svcnet_agent::podnet::run_vxlan_with(client, self.node, false, shutdown).await;
                Left::Vtep
            }
            PodNetwork::HostGw => {
                Left::HostGwRoutes(daemon::run_host_gw(client, self.node, shutdown).await)
            }
            PodNetwork::Udp => {
                svcnet_agent::podnet::udp::run_udp(client, self.node, cluster_cidr, shutdown)
                    .await
                    .context("udp backend")?;
                Left::Nothing
            }
            other => anyhow::bail!("the add-on does not run the {other} backend"),
        };
        Ok((node, left))
    }
}

/// Removes what the backend made on this node (an uninstall).
pub async fn remove(node: NodeTopology, left: Left) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        match left {
            Left::Vtep => daemon::remove_vtep(&node)?,
            Left::Nothing => {}
            Left::HostGwRoutes(routes) => {
                let kept = daemon::sync_host_gw(&node, routes, &Default::default());
                anyhow::ensure!(kept.is_empty(), "host-gw routes left: {kept:?}");
            }
        }
        Ok(())
    })
    .await
    .context("pod network removal task")?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_add_on_runs_flannels_backends_or_none() {
        assert_eq!(parse("vxlan"), Ok(AddonNetwork(Some(PodNetwork::Vxlan))));
        assert_eq!(parse("host-gw"), Ok(AddonNetwork(Some(PodNetwork::HostGw))));
        assert_eq!(parse("udp"), Ok(AddonNetwork(Some(PodNetwork::Udp))));
        assert_eq!(parse("none"), Ok(AddonNetwork(None)));
        assert!(parse("bgp").unwrap_err().contains("svcnet up"));
        assert!(parse("geneve").unwrap_err().contains("unknown pod network"));
    }
}
