//! How pod traffic crosses nodes: a [`PodRouteBackend`] turns the topology into the steps that
//! program each node. [`HostGw`] is flannel's host-gw mode from the seeds: every node routes
//! each other node's pod /24 directly via that node's underlay address (they share one L2
//! segment, svcnet's host bridge). A VXLAN backend would implement the same trait with a
//! `vxlan` device and routes via it.

use crate::topology::{NodeTopology, Step};

/// Programs inter-node pod routes. Pure: returns steps, does no I/O.
pub trait PodRouteBackend: std::fmt::Debug + Send + Sync {
    /// A short name for plans and logs (`host-gw`, `vxlan`).
    fn name(&self) -> &'static str;
    /// The steps, run after `node`'s namespace, underlay link and `cni0` exist, that make
    /// traffic from `node` reach the pod CIDR of every node in `peers` (which excludes `node`).
    fn node_steps(&self, node: &NodeTopology, peers: &[&NodeTopology]) -> Vec<Step>;
}

/// Direct routes via the peers' underlay addresses (flannel host-gw).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostGw;

impl PodRouteBackend for HostGw {
    fn name(&self) -> &'static str {
        "host-gw"
    }

    fn node_steps(&self, node: &NodeTopology, peers: &[&NodeTopology]) -> Vec<Step> {
        peers
            .iter()
            .map(|peer| {
                Step::ip(
                    Some(&node.netns),
                    &[
                        "route",
                        "add",
                        &peer.pod_cidr.to_string(),
                        "via",
                        &peer.internal_ip.to_string(),
                        "dev",
                        crate::topology::NODE_UNDERLAY_IF,
                    ],
                )
            })
            .collect()
    }
}
