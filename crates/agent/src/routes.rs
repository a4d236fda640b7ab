//! How pod traffic crosses nodes: a [`PodRouteBackend`] turns the topology into the steps that
//! program each node, and [`PodNetwork`] names the backend `svcnet up --pod-network` picks.
//!
//! - [`HostGw`] is flannel's host-gw mode from the seeds: every node routes each other node's
//!   pod /24 directly via that node's underlay address (they share one L2 segment, svcnet's
//!   host bridge). No encapsulation; pods keep the underlay's MTU (1500).
//! - [`Vxlan`] is flannel's VXLAN backend, programmed exactly as flanneld does it
//!   (`pkg/backend/vxlan` at flannel-io/flannel): a VTEP `flannel.1` per node (VNI 1, UDP 8472,
//!   `local` = the node's underlay address, no learning, MTU = underlay MTU − 50, the /32 of its
//!   pod CIDR's `.0`), and per remote node, in flannel's order, the permanent neighbour entry
//!   (remote VTEP address `X.0` → remote VTEP MAC), the FDB entry (VTEP MAC → remote underlay
//!   address) and the onlink route `podCIDR via X.0 dev flannel.1`. Pods get MTU 1450 so
//!   nothing is fragmented.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use ipnet::Ipv4Net;

use crate::topology::{NodeTopology, Step};

/// Programs inter-node pod routes. Pure: returns steps, does no I/O.
pub trait PodRouteBackend: std::fmt::Debug + Send + Sync {
    /// A short name for plans and logs (`host-gw`, `vxlan`).
    fn name(&self) -> &'static str;
    /// The steps, run after `node`'s namespace, underlay link and `cni0` exist, that make
    /// traffic from `node` reach the pod CIDR of every node in `peers` (which excludes `node`).
    fn node_steps(&self, node: &NodeTopology, peers: &[&NodeTopology]) -> Vec<Step>;
}

/// The MTU of the nodes' underlay (veths on svcnet's host bridge keep the kernel default).
pub const UNDERLAY_MTU: u32 = 1500;

/// The pod network backend of a cluster: `svcnet up --pod-network`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PodNetwork {
    /// Plain routes via the peers' underlay addresses (needs layer-2 adjacency, which the
    /// embedded cluster's nodes have on one bridge: its default).
    #[default]
    HostGw,
    /// flannel's VXLAN overlay (works without layer-2 adjacency; 50 bytes per packet).
    Vxlan,
    /// flannel's UDP backend: a TUN `flannel0` and svcnet's user-space loop on UDP 8285
    /// ([`crate::udpencap`]; 28 bytes per packet).
    Udp,
    /// Calico's BGP: no encapsulation, routes learnt from a BIRD per node ([`crate::podnet::bgp`]).
    Bgp,
    /// Calico's IPIP: `tunl0`, 20 bytes per packet ([`crate::podnet::ipip`]).
    Ipip,
}

impl PodNetwork {
    pub const ALL: [PodNetwork; 5] = [
        PodNetwork::HostGw,
        PodNetwork::Vxlan,
        PodNetwork::Udp,
        PodNetwork::Bgp,
        PodNetwork::Ipip,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PodNetwork::HostGw => "host-gw",
            PodNetwork::Vxlan => "vxlan",
            PodNetwork::Udp => "udp",
            PodNetwork::Bgp => "bgp",
            PodNetwork::Ipip => "ipip",
        }
    }

    /// The backend that programs it.
    pub fn backend(self) -> &'static dyn PodRouteBackend {
        match self {
            PodNetwork::HostGw => &HostGw,
            PodNetwork::Vxlan => &Vxlan,
            PodNetwork::Udp => &Udp,
            PodNetwork::Bgp => &crate::podnet::bgp::Bgp,
            PodNetwork::Ipip => &crate::podnet::ipip::Ipip,
        }
    }

    /// The MTU of the pods' interfaces (the CNI veths): the underlay's minus the encapsulation.
    pub fn pod_mtu(self) -> u32 {
        match self {
            PodNetwork::HostGw | PodNetwork::Bgp => UNDERLAY_MTU,
            PodNetwork::Vxlan => UNDERLAY_MTU - VXLAN_OVERHEAD,
            PodNetwork::Udp => UNDERLAY_MTU - crate::udpencap::UDP_OVERHEAD,
            PodNetwork::Ipip => UNDERLAY_MTU - crate::podnet::ipip::IPIP_OVERHEAD,
        }
    }

    /// The annotations flanneld writes on its Node (`pkg/subnet/kube/annotations.go`), the node's
    /// lease as the other nodes see it.
    pub fn node_annotations(self, node: &NodeTopology) -> Vec<(String, String)> {
        let data = match self {
            PodNetwork::HostGw | PodNetwork::Udp | PodNetwork::Bgp | PodNetwork::Ipip => {
                "null".to_string()
            }
            PodNetwork::Vxlan => serde_json::json!({
                "VNI": VXLAN_VNI,
                "VtepMAC": vtep_mac(node.internal_ip),
            })
            .to_string(),
        };
        [
            ("backend-type", self.name().to_string()),
            ("backend-data", data),
            ("public-ip", node.internal_ip.to_string()),
            ("kube-subnet-manager", "true".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{FLANNEL_ANNOTATION_PREFIX}{k}"), v))
        .collect()
    }
}

/// flannel's default `--kube-annotation-prefix`, with its `/`.
pub const FLANNEL_ANNOTATION_PREFIX: &str = "flannel.alpha.coreos.com/";

impl fmt::Display for PodNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PodNetwork {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PodNetwork::ALL
            .into_iter()
            .find(|n| n.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = PodNetwork::ALL.iter().map(|n| n.name()).collect();
                format!(
                    "unknown pod network {s:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }
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
                        &node.underlay_if,
                    ],
                )
            })
            .collect()
    }
}

/// flannel's VTEP device name (`flannel.<VNI>`).
pub const VXLAN_DEVICE: &str = "flannel.1";
/// flannel's default VNI.
pub const VXLAN_VNI: u32 = 1;
/// The kernel's (and flannel's) default VXLAN port.
pub const VXLAN_PORT: u16 = 8472;
/// Bytes VXLAN adds: outer IPv4 20 + UDP 8 + VXLAN 8 + the inner Ethernet header 14
/// (flannel's `encapOverhead`).
pub const VXLAN_OVERHEAD: u32 = 50;

/// A node's VTEP MAC. flanneld picks a random one and keeps it in its Node's `backend-data`;
/// svcnet derives it from the underlay address (locally administered, unicast), so it is the
/// same across restarts and the plan stays pure.
pub fn vtep_mac(internal_ip: Ipv4Addr) -> String {
    let [a, b, c, d] = internal_ip.octets();
    format!("0e:f1:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// A node's VTEP address: the `.0` of its pod CIDR (flannel's lease subnet IP).
pub fn vtep_addr(pod_cidr: Ipv4Net) -> Ipv4Addr {
    pod_cidr.network()
}

/// What a node needs to know of a remote node to reach its pods over VXLAN: exactly what
/// flannel reads from the remote Node (`spec.podCIDR`, `public-ip`, `backend-data.VtepMAC`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanPeer {
    pub pod_cidr: Ipv4Net,
    pub public_ip: Ipv4Addr,
    pub vtep_mac: String,
}

impl VxlanPeer {
    pub fn of(node: &NodeTopology) -> Self {
        Self {
            pod_cidr: node.pod_cidr,
            public_ip: node.internal_ip,
            vtep_mac: vtep_mac(node.internal_ip),
        }
    }

    /// flannel's `handleSubnetEvents` add, in its order: the neighbour entry, the FDB entry,
    /// then the route ("the kernel would ARP for the Gw IP address if it hadn't already been
    /// set", so the route comes last).
    pub fn add_steps(&self, netns: &str) -> Vec<Step> {
        let gw = vtep_addr(self.pod_cidr).to_string();
        let ns = Some(netns);
        vec![
            Step::ip(
                ns,
                &[
                    "neigh",
                    "replace",
                    &gw,
                    "lladdr",
                    &self.vtep_mac,
                    "dev",
                    VXLAN_DEVICE,
                    "nud",
                    "permanent",
                ],
            ),
            Step::bridge(
                netns,
                &[
                    "fdb",
                    "replace",
                    &self.vtep_mac,
                    "dev",
                    VXLAN_DEVICE,
                    "dst",
                    &self.public_ip.to_string(),
                    "self",
                    "permanent",
                ],
            ),
            Step::ip(
                ns,
                &[
                    "route",
                    "replace",
                    &self.pod_cidr.to_string(),
                    "via",
                    &gw,
                    "dev",
                    VXLAN_DEVICE,
                    "onlink",
                ],
            ),
        ]
    }

    /// flannel's removal of a lease: the neighbour entry, the FDB entry, the route.
    pub fn del_steps(&self, netns: &str) -> Vec<Step> {
        let gw = vtep_addr(self.pod_cidr).to_string();
        let ns = Some(netns);
        vec![
            Step::ip(ns, &["neigh", "del", &gw, "dev", VXLAN_DEVICE]),
            Step::bridge(
                netns,
                &[
                    "fdb",
                    "del",
                    &self.vtep_mac,
                    "dev",
                    VXLAN_DEVICE,
                    "dst",
                    &self.public_ip.to_string(),
                    "self",
                ],
            ),
            Step::ip(
                ns,
                &[
                    "route",
                    "del",
                    &self.pod_cidr.to_string(),
                    "dev",
                    VXLAN_DEVICE,
                ],
            ),
        ]
    }
}

impl VxlanPeer {
    /// flannel's DirectRouting for a peer on the node's own subnet: the host-gw route instead
    /// of the neighbour, FDB and onlink entries.
    /// `dev` is the node's underlay interface.
    pub fn direct_add_steps(&self, netns: &str, dev: &str) -> Vec<Step> {
        let (cidr, via) = (self.pod_cidr.to_string(), self.public_ip.to_string());
        let args = ["route", "replace", &cidr, "via", &via, "dev", dev];
        vec![Step::ip(Some(netns), &args)]
    }

    pub fn direct_del_steps(&self, netns: &str, dev: &str) -> Vec<Step> {
        let (cidr, via) = (self.pod_cidr.to_string(), self.public_ip.to_string());
        let args = ["route", "del", &cidr, "via", &via, "dev", dev];
        vec![Step::ip(Some(netns), &args)]
    }
}

/// flannel's VXLAN backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Vxlan;

impl Vxlan {
    /// The node's VTEP (`createVXLANDevice`, `configureDeviceIPv4IPv6`).
    pub fn device_steps(node: &NodeTopology) -> Vec<Step> {
        let ns = Some(node.netns.as_str());
        let mtu = (UNDERLAY_MTU - VXLAN_OVERHEAD).to_string();
        vec![
            Step::ip(
                ns,
                &[
                    "link",
                    "add",
                    VXLAN_DEVICE,
                    "address",
                    &vtep_mac(node.internal_ip),
                    "mtu",
                    &mtu,
                    "type",
                    "vxlan",
                    "id",
                    &VXLAN_VNI.to_string(),
                    "local",
                    &node.internal_ip.to_string(),
                    "dev",
                    &node.underlay_if,
                    "nolearning",
                    "dstport",
                    &VXLAN_PORT.to_string(),
                ],
            ),
            // A /32, "so that no broadcast routes are created"; the source of host-to-pod traffic.
            Step::ip(
                ns,
                &[
                    "addr",
                    "add",
                    &format!("{}/32", vtep_addr(node.pod_cidr)),
                    "dev",
                    VXLAN_DEVICE,
                ],
            ),
            Step::ip(ns, &["link", "set", VXLAN_DEVICE, "up"]),
        ]
    }
}

impl PodRouteBackend for Vxlan {
    fn name(&self) -> &'static str {
        "vxlan"
    }

    /// Only the VTEP: the peers' entries come from their Node objects, as flannel learns them
    /// ([`crate::podnet::run_vxlan`]), not from the static topology.
    fn node_steps(&self, node: &NodeTopology, _peers: &[&NodeTopology]) -> Vec<Step> {
        Self::device_steps(node)
    }
}

/// No inter-node pod routes: the pod network is left to an add-on (`svcnet up --disable
/// pod-network`), which programs the node namespaces itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRoutes;

impl PodRouteBackend for NoRoutes {
    fn name(&self) -> &'static str {
        "none"
    }

    fn node_steps(&self, _node: &NodeTopology, _peers: &[&NodeTopology]) -> Vec<Step> {
        Vec::new()
    }
}

/// flannel's UDP backend: nothing in the topology plan. The TUN, its address and route are made
/// by the loop that holds the device open ([`crate::udpencap::UdpEncap::start`]), and the peers
/// come from the Node objects ([`crate::podnet::udp::run_udp`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Udp;

impl PodRouteBackend for Udp {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn node_steps(&self, _node: &NodeTopology, _peers: &[&NodeTopology]) -> Vec<Step> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    #[test]
    fn vxlan_peer_steps_in_flannels_order() {
        let peer = VxlanPeer {
            pod_cidr: "10.244.2.0/24".parse().unwrap(),
            public_ip: [172, 30, 0, 3].into(),
            vtep_mac: vtep_mac([172, 30, 0, 3].into()),
        };
        let text: String = peer
            .add_steps("n1")
            .iter()
            .chain(&peer.del_steps("n1"))
            .chain(&peer.direct_add_steps("n1", "eth0"))
            .chain(&peer.direct_del_steps("n1", "eth0"))
            .map(|s| format!("{s}\n"))
            .collect();
        expect![[r#"
            ip -n n1 neigh replace 10.244.2.0 lladdr 0e:f1:ac:1e:00:03 dev flannel.1 nud permanent
            bridge -n n1 fdb replace 0e:f1:ac:1e:00:03 dev flannel.1 dst 172.30.0.3 self permanent
            ip -n n1 route replace 10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink
            ip -n n1 neigh del 10.244.2.0 dev flannel.1
            bridge -n n1 fdb del 0e:f1:ac:1e:00:03 dev flannel.1 dst 172.30.0.3 self
            ip -n n1 route del 10.244.2.0/24 dev flannel.1
            ip -n n1 route replace 10.244.2.0/24 via 172.30.0.3 dev eth0
            ip -n n1 route del 10.244.2.0/24 via 172.30.0.3 dev eth0
        "#]]
        .assert_eq(&text);
    }

    #[test]
    fn pod_network_names_and_mtus() {
        assert_eq!("vxlan".parse::<PodNetwork>(), Ok(PodNetwork::Vxlan));
        assert_eq!("host-gw".parse::<PodNetwork>(), Ok(PodNetwork::HostGw));
        assert_eq!("udp".parse::<PodNetwork>(), Ok(PodNetwork::Udp));
        assert_eq!("bgp".parse::<PodNetwork>(), Ok(PodNetwork::Bgp));
        assert_eq!("ipip".parse::<PodNetwork>(), Ok(PodNetwork::Ipip));
        let err = "geneve".parse::<PodNetwork>().unwrap_err();
        assert!(err.contains("host-gw, vxlan, udp, bgp, ipip"), "{err}");
        assert_eq!(PodNetwork::Bgp.pod_mtu(), 1500);
        assert_eq!(PodNetwork::Ipip.pod_mtu(), 1480);
        assert_eq!(PodNetwork::Vxlan.pod_mtu(), 1450);
        assert_eq!(PodNetwork::Udp.pod_mtu(), 1472);
        assert_eq!(PodNetwork::HostGw.pod_mtu(), 1500);
    }
}
