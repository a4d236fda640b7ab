//! Calico's IPIP pod network (`--pod-network ipip`): pod packets to another node are wrapped
//! in an outer IPv4 header (protocol 4, 20 bytes) by `tunl0`, the per-namespace fallback device
//! of the kernel's `ipip` module ("remote any, local any"), with one route per remote block as
//! Felix programs it (`felix/dataplane/linux/ipip_mgr.go`): `block via <nodeIP> dev tunl0
//! onlink`. `tunl0` gets MTU 1480 (the underlay's 1500 − 20) and the first address of the
//! node's block as a /32 (Calico's `IPv4IPIPTunnelAddr`, the source of host-to-pod traffic);
//! pods get MTU 1480 too, so nothing needs fragmenting.
//!
//! CrossSubnet (Calico's `ipipMode: CrossSubnet`): peers on this node's own underlay subnet get
//! a plain route via their address on `eth0`; only peers elsewhere are encapsulated. The
//! embedded cluster's nodes all share one underlay subnet (CrossSubnet would be host-gw there),
//! so `svcnet up` uses Always; the plan takes the mode for nodes on real networks.
//!
//! The plan is pure ([`plan`]); the kernel must have `ipip` ([`kernel_support`] says so before
//! anything is created). This machine's kernel has none: IPIP is tested in the user-mode Linux
//! tier (`crates/agent/tests/uml_ipip.rs`).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::routes::{PodRouteBackend, UNDERLAY_MTU};
use crate::topology::{NodeTopology, Step};

/// The fallback device of the `ipip` module, in every namespace.
pub const IPIP_DEVICE: &str = "tunl0";
/// The kernel module that provides it.
pub const IPIP_MODULE: &str = "ipip";
/// Bytes IPIP adds: the outer IPv4 header.
pub const IPIP_OVERHEAD: u32 = 20;

/// When a peer's traffic is encapsulated (Calico's IPPool `ipipMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpipMode {
    Always,
    /// Only towards peers outside this node's underlay subnet.
    CrossSubnet,
}

/// `tunl0`'s address: the first address of the node's block (as Calico's IPAM gives it).
pub fn tunnel_addr(pod_cidr: Ipv4Net) -> Ipv4Addr {
    pod_cidr.network()
}

/// `node`'s `tunl0`: MTU, /32 tunnel address, up.
pub fn device_steps(node: &NodeTopology) -> Vec<Step> {
    let ns = Some(node.netns.as_str());
    let mtu = (UNDERLAY_MTU - IPIP_OVERHEAD).to_string();
    vec![
        Step::ip(ns, &["link", "set", IPIP_DEVICE, "mtu", &mtu]),
        Step::ip(
            ns,
            &[
                "addr",
                "add",
                &format!("{}/32", tunnel_addr(node.pod_cidr)),
                "dev",
                IPIP_DEVICE,
            ],
        ),
        Step::ip(ns, &["link", "set", IPIP_DEVICE, "up"]),
    ]
}

/// The route on `node` to `peer`'s block: through `tunl0`, or plain when CrossSubnet and the
/// peer is on `node_subnet`.
pub fn peer_route(
    node: &NodeTopology,
    node_subnet: Ipv4Net,
    peer: &NodeTopology,
    mode: IpipMode,
) -> Step {
    let (cidr, via) = (peer.pod_cidr.to_string(), peer.internal_ip.to_string());
    let ns = Some(node.netns.as_str());
    if mode == IpipMode::CrossSubnet && node_subnet.contains(&peer.internal_ip) {
        Step::ip(
            ns,
            &["route", "add", &cidr, "via", &via, "dev", &node.underlay_if],
        )
    } else {
        Step::ip(
            ns,
            &[
                "route",
                "add",
                &cidr,
                "via",
                &via,
                "dev",
                IPIP_DEVICE,
                "onlink",
            ],
        )
    }
}

/// Everything IPIP programs on `node` (pure): its `tunl0`, then a route per peer.
pub fn plan(
    node: &NodeTopology,
    node_subnet: Ipv4Net,
    peers: &[&NodeTopology],
    mode: IpipMode,
) -> Vec<Step> {
    let mut steps = device_steps(node);
    steps.extend(
        peers
            .iter()
            .map(|peer| peer_route(node, node_subnet, peer, mode)),
    );
    steps
}

/// Calico's IPIP, Always mode (every peer encapsulated).
#[derive(Debug, Clone, Copy, Default)]
pub struct Ipip;

impl PodRouteBackend for Ipip {
    fn name(&self) -> &'static str {
        "ipip"
    }

    fn node_steps(&self, node: &NodeTopology, peers: &[&NodeTopology]) -> Vec<Step> {
        // Always mode never looks at the subnet.
        let subnet = Ipv4Net::new(node.internal_ip, 32).unwrap_or_default();
        plan(node, subnet, peers, IpipMode::Always)
    }
}

/// Whether this kernel can do IPIP: the `ipip` module is loaded or loads. The error names the
/// module and what to use instead.
pub fn kernel_support() -> Result<(), String> {
    let loaded = || {
        std::path::Path::new("/sys/module")
            .join(IPIP_MODULE)
            .exists()
    };
    if loaded() {
        return Ok(());
    }
    let tried = match std::process::Command::new("modprobe")
        .arg(IPIP_MODULE)
        .output()
    {
        Ok(out) if out.status.success() && loaded() => return Ok(()),
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(e) => format!("cannot run modprobe: {e}"),
    };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    Err(format!(
        "--pod-network ipip needs the kernel module `{IPIP_MODULE}` (CONFIG_NET_IPIP), which this \
         kernel ({}) does not provide (modprobe {IPIP_MODULE}: {tried}); use --pod-network bgp \
         (Calico's routing without encapsulation) or vxlan",
        release.trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn node(i: u8, underlay: [u8; 3]) -> NodeTopology {
        let [a, b, c] = underlay;
        NodeTopology {
            name: format!("n{i}"),
            netns: format!("n{i}"),
            internal_ip: [a, b, c, i + 1].into(),
            pod_cidr: format!("10.244.{i}.0/24").parse().unwrap(),
            gateway: [10, 244, i, 1].into(),
            host_link: format!("x{i}"),
            underlay_if: "eth0".into(),
        }
    }

    #[test]
    fn topology_plans_route_peers_through_tunl0_for_ipip_and_not_at_all_for_bgp() {
        use crate::topology::{TopologyConfig, plan_create};
        let config = TopologyConfig {
            nodes: 2,
            ..TopologyConfig::default()
        };
        let node_routes = |backend: &dyn PodRouteBackend| -> String {
            plan_create(&config, backend)
                .unwrap()
                .iter()
                .map(|s| s.to_string())
                .filter(|s| s.starts_with("ip -n svcnet-node") && s.contains(" via "))
                .map(|s| format!("{s}\n"))
                .collect()
        };
        expect![[r#"
            ip -n svcnet-node1 route add 10.244.2.0/24 via 172.30.0.3 dev tunl0 onlink
            ip -n svcnet-node2 route add 10.244.1.0/24 via 172.30.0.2 dev tunl0 onlink
        "#]]
        .assert_eq(&node_routes(&Ipip));
        assert_eq!(
            node_routes(&crate::podnet::bgp::Bgp),
            "",
            "bgp's routes are BIRD's"
        );
    }

    #[test]
    fn ipip_plan_always_and_cross_subnet() {
        let n1 = node(1, [172, 30, 0]);
        let same = node(2, [172, 30, 0]);
        let other = node(3, [172, 31, 0]);
        let subnet: Ipv4Net = "172.30.0.0/24".parse().unwrap();
        let text = |mode| -> String {
            plan(&n1, subnet, &[&same, &other], mode)
                .iter()
                .map(|s| format!("{s}\n"))
                .collect()
        };
        expect![[r#"
            ip -n n1 link set tunl0 mtu 1480
            ip -n n1 addr add 10.244.1.0/32 dev tunl0
            ip -n n1 link set tunl0 up
            ip -n n1 route add 10.244.2.0/24 via 172.30.0.3 dev tunl0 onlink
            ip -n n1 route add 10.244.3.0/24 via 172.31.0.4 dev tunl0 onlink
        "#]]
        .assert_eq(&text(IpipMode::Always));
        expect![[r#"
            ip -n n1 link set tunl0 mtu 1480
            ip -n n1 addr add 10.244.1.0/32 dev tunl0
            ip -n n1 link set tunl0 up
            ip -n n1 route add 10.244.2.0/24 via 172.30.0.3 dev eth0
            ip -n n1 route add 10.244.3.0/24 via 172.31.0.4 dev tunl0 onlink
        "#]]
        .assert_eq(&text(IpipMode::CrossSubnet));
        let backend: String = Ipip
            .node_steps(&n1, &[&same])
            .iter()
            .map(|s| format!("{s}\n"))
            .collect();
        assert!(
            backend.ends_with("ip -n n1 route add 10.244.2.0/24 via 172.30.0.3 dev tunl0 onlink\n")
        );
    }
}
