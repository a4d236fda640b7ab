//! flanneld's share of a node for the UDP backend: it starts the node's encapsulation loop
//! ([`UdpEncap`]) and keeps its peer table equal to the UDP leases the other Nodes announce
//! (`spec.podCIDR` and `flannel.alpha.coreos.com/public-ip` on Nodes with
//! `kube-subnet-manager: "true"` and `backend-type: udp`). A Node added while running is
//! reachable at the next table swap; a Node deleted loses its entry, cutting its pods off.

use std::collections::BTreeMap;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;
use kube::Client;

use super::{NodeWatch, lease, peers_by};
use crate::topology::NodeTopology;
use crate::udpencap::{PeerTable, UdpEncap, UdpEncapConfig, UdpPeer};

/// The UDP lease a Node announces (flannel's UDP lease is only its public IP and subnet).
pub fn udp_lease(node: &Node) -> Result<Option<UdpPeer>, String> {
    Ok(lease(node, "udp")?.map(|(pod_cidr, public_ip)| UdpPeer {
        pod_cidr,
        public_ip,
    }))
}

/// The peer table of `self_name` among `nodes` (pure).
pub fn desired_table<'a>(
    self_name: &str,
    nodes: impl IntoIterator<Item = &'a Node>,
    port: u16,
) -> PeerTable {
    let peers: BTreeMap<String, UdpPeer> = peers_by(self_name, nodes, udp_lease);
    PeerTable::new(peers.values(), port)
}

/// Runs `node`'s UDP backend until `shutdown`: the loop (its threads live in this process, so
/// they die with it) and the Node watch that feeds its table. Fails only if the loop cannot
/// start (no `/dev/net/tun`, port 8285 taken).
pub async fn run_udp(
    client: Client,
    node: NodeTopology,
    cluster_cidr: Ipv4Net,
    shutdown: impl Future<Output = ()>,
) -> Result<(), crate::TopologyError> {
    let cfg = UdpEncapConfig::new(cluster_cidr);
    let port = cfg.port;
    let started = node.clone();
    let encap = tokio::task::spawn_blocking(move || UdpEncap::start(&started, &cfg))
        .await
        .map_err(|e| crate::TopologyError::Io {
            what: "udp backend start task".into(),
            source: std::io::Error::other(e),
        })??;
    let mut watch = NodeWatch::new(client, &node.name);
    tokio::pin!(shutdown);
    loop {
        let table = tokio::select! {
            () = &mut shutdown => break,
            nodes = watch.changed() => match nodes {
                None => break,
                Some(nodes) => desired_table(&node.name, nodes.values(), port),
            },
        };
        if *encap.peers() != table {
            tracing::info!(node = %node.name, peers = table.len(), "udp backend peers:\n{table}");
            encap.set_peers(table);
        }
    }
    // Joining the threads waits for their 100 ms poll: off the async workers.
    let _ = tokio::task::spawn_blocking(move || encap.stop()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::PodNetwork;
    use crate::test_support::node_object;
    use expect_test::expect;

    fn topo(i: u8) -> NodeTopology {
        NodeTopology {
            name: format!("n{i}"),
            netns: format!("n{i}"),
            internal_ip: [172, 30, 0, i + 1].into(),
            pod_cidr: format!("10.244.{i}.0/24").parse().unwrap(),
            gateway: [10, 244, i, 1].into(),
            host_link: format!("svcnetn{i}"),
            underlay_if: "eth0".into(),
        }
    }

    #[test]
    fn the_table_is_the_other_nodes_udp_leases() {
        let nodes = [
            node_object(&topo(1), PodNetwork::Udp),
            node_object(&topo(2), PodNetwork::Udp),
            node_object(&topo(3), PodNetwork::Udp),
            node_object(&topo(4), PodNetwork::Vxlan),
        ];
        expect![[r#"
            10.244.2.0/24 -> 172.30.0.3:8285
            10.244.3.0/24 -> 172.30.0.4:8285
        "#]]
        .assert_eq(&desired_table("n1", &nodes, 8285).to_string());
        let mut bad = nodes[1].clone();
        bad.metadata.annotations.as_mut().unwrap().insert(
            "flannel.alpha.coreos.com/public-ip".into(),
            "not-an-ip".into(),
        );
        assert!(udp_lease(&bad).unwrap_err().contains("public-ip"));
        assert_eq!(desired_table("n1", [&bad], 8285).len(), 0);
    }
}
