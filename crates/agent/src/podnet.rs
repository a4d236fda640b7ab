//! flanneld's share of a node for the VXLAN backend: it watches Node objects and keeps this
//! node's VTEP entries (neighbour, FDB, onlink route) equal to the VXLAN leases the other Nodes
//! announce (flannel's kube subnet manager: `spec.podCIDR`, `flannel.alpha.coreos.com/public-ip`
//! and `backend-data`'s `VtepMAC`, on Nodes with `kube-subnet-manager: "true"` and
//! `backend-type: vxlan`). A Node added while running gets its entries; a Node deleted (or no
//! longer a VXLAN lease) loses them. The kernel programming itself is [`VxlanPeer`]'s.
//! [`udp`] does the same for the UDP backend's peer table.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;
use kube::Client;

use crate::routes::{FLANNEL_ANNOTATION_PREFIX, VxlanPeer};
use crate::topology::NodeTopology;

pub mod bgp;
pub mod condition;
pub mod daemon;
pub mod ipip;
pub mod speaker;
pub mod udp;
pub mod watch;

pub use watch::NodeWatch;

/// The annotation `key` (without flannel's prefix) of `node`.
fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a String> {
    node.metadata
        .annotations
        .as_ref()?
        .get(&format!("{FLANNEL_ANNOTATION_PREFIX}{key}"))
}

/// The pod CIDR and public IP of the lease a Node announces for `backend_type` (every flannel
/// backend's common part): `Ok(None)` when it announces none (another backend, or no flannel
/// annotations yet), an error naming what is malformed.
pub fn lease(node: &Node, backend_type: &str) -> Result<Option<(Ipv4Net, Ipv4Addr)>, String> {
    if annotation(node, "kube-subnet-manager").map(String::as_str) != Some("true")
        || annotation(node, "backend-type").map(String::as_str) != Some(backend_type)
    {
        return Ok(None);
    }
    let pod_cidr = node
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidr.as_deref())
        .ok_or("no spec.podCIDR")?
        .parse()
        .map_err(|e| format!("spec.podCIDR: {e}"))?;
    let public_ip = annotation(node, "public-ip")
        .ok_or("no public-ip annotation")?
        .parse()
        .map_err(|e| format!("public-ip: {e}"))?;
    Ok(Some((pod_cidr, public_ip)))
}

/// The VXLAN lease a Node announces: `Ok(None)` when it announces none (another backend, or no
/// flannel annotations yet), an error naming what is malformed.
pub fn vxlan_lease(node: &Node) -> Result<Option<VxlanPeer>, String> {
    let Some((pod_cidr, public_ip)) = lease(node, "vxlan")? else {
        return Ok(None);
    };
    let data: serde_json::Value =
        serde_json::from_str(annotation(node, "backend-data").ok_or("no backend-data")?)
            .map_err(|e| format!("backend-data: {e}"))?;
    let vtep_mac = data
        .get("VtepMAC")
        .and_then(|m| m.as_str())
        .filter(|m| is_mac(m))
        .ok_or("backend-data: no valid VtepMAC")?
        .to_ascii_lowercase();
    Ok(Some(VxlanPeer {
        pod_cidr,
        public_ip,
        vtep_mac,
    }))
}

/// A Node's `spec.podCIDR`, or what is wrong with it.
pub(crate) fn spec_pod_cidr(node: &Node) -> Result<ipnet::Ipv4Net, String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidr.as_deref())
        .ok_or("no spec.podCIDR")?
        .parse()
        .map_err(|e| format!("spec.podCIDR: {e}"))
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The peers of `self_name` among `nodes` (pure): every other Node's VXLAN lease, by name.
/// Malformed leases are skipped with a warning, as flannel skips them.
pub fn desired_peers<'a>(
    self_name: &str,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> BTreeMap<String, VxlanPeer> {
    peers_by(self_name, nodes, vxlan_lease)
}

/// Every other Node's lease as `parse` reads it, by name; malformed ones skipped with a warning.
pub fn peers_by<'a, P>(
    self_name: &str,
    nodes: impl IntoIterator<Item = &'a Node>,
    parse: impl Fn(&Node) -> Result<Option<P>, String>,
) -> BTreeMap<String, P> {
    nodes
        .into_iter()
        .filter_map(|node| {
            let name = node.metadata.name.clone()?;
            if name == self_name {
                return None;
            }
            match parse(node) {
                Ok(lease) => lease.map(|l| (name, l)),
                Err(e) => {
                    tracing::warn!(node = %name, "ignoring its flannel lease: {e}");
                    None
                }
            }
        })
        .collect()
}

/// Keeps `node`'s VTEP entries equal to the other Nodes' VXLAN leases until `shutdown`.
/// (The VTEP itself is made with the topology; it goes with the node's namespace.)
pub async fn run_vxlan(client: Client, node: NodeTopology, shutdown: impl Future<Output = ()>) {
    run_vxlan_with(client, node, false, shutdown).await;
}

/// [`run_vxlan`] with flannel's `DirectRouting` option when `direct_routing`: peers on this
/// node's underlay subnet get a host-gw route instead of VXLAN entries.
pub async fn run_vxlan_with(
    client: Client,
    node: NodeTopology,
    direct_routing: bool,
    shutdown: impl Future<Output = ()>,
) {
    let mut watch = NodeWatch::new(client, &node.name);
    let mut applied = AppliedPeers::new();
    // flanneld recreates a deleted VTEP (`watchVXLANDevice`); svcnet checks on a timer.
    let mut check = tokio::time::interval(VTEP_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        let desired = tokio::select! {
            () = &mut shutdown => break,
            _ = check.tick() => {
                if !recreate_vtep_if_gone(&node).await {
                    continue;
                }
                // Its entries went with it: program every peer again.
                applied = AppliedPeers::new();
                desired_peers(&node.name, watch.nodes().values())
            }
            nodes = watch.changed() => match nodes {
                None => break,
                Some(nodes) => desired_peers(&node.name, nodes.values()),
            },
        };
        if applied.iter().all(|(p, (l, _))| desired.get(p) == Some(l))
            && applied.len() == desired.len()
        {
            continue;
        }
        let job_node = node.clone();
        let job = move || sync_vxlan_peers(&job_node, applied, &desired, direct_routing);
        applied = match tokio::task::spawn_blocking(job).await {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(node = %node.name, "vxlan reconcile task: {e}");
                AppliedPeers::new()
            }
        };
    }
}

/// How often the VTEP's presence is checked.
const VTEP_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// Makes `node`'s VTEP again if someone deleted it; whether it did.
async fn recreate_vtep_if_gone(node: &NodeTopology) -> bool {
    let node = node.clone();
    let job = move || {
        let links = crate::ip::link_names(Some(&node.netns)).ok()?;
        if links.iter().any(|l| l == crate::routes::VXLAN_DEVICE) {
            return Some(false);
        }
        match crate::routes::Vxlan::device_steps(&node)
            .iter()
            .try_for_each(|s| s.run())
        {
            Ok(()) => tracing::info!(node = %node.name, "vxlan: flannel.1 was deleted; recreated"),
            Err(e) => tracing::warn!(node = %node.name, "vxlan: recreating flannel.1: {e}"),
        }
        Some(true)
    };
    matches!(tokio::task::spawn_blocking(job).await, Ok(Some(true)))
}

/// The VXLAN peers programmed on a node, each with whether it got the direct (host-gw) route.
pub type AppliedPeers = BTreeMap<String, (VxlanPeer, bool)>;

/// flannel's `DirectRouting` test (`pkg/ip` `DirectRouting`): the route to a peer's public IP
/// is exactly one route without a gateway, so the peer is on this node's own subnet.
pub fn is_direct(route_get: &[serde_json::Value]) -> bool {
    route_get.len() == 1 && route_get[0].get("gateway").is_none()
}

/// Removes the entries of peers that went or changed, then adds the new and changed ones
/// (flannel's order per peer; with `direct_routing`, a host-gw route for a peer on the node's
/// subnet). Blocking. Returns what is now programmed.
pub fn sync_vxlan_peers(
    node: &NodeTopology,
    applied: AppliedPeers,
    desired: &BTreeMap<String, VxlanPeer>,
    direct_routing: bool,
) -> AppliedPeers {
    let (netns, name) = (&node.netns, &node.name);
    let mut now = applied;
    let gone: Vec<String> = now
        .iter()
        .filter(|(peer, (lease, _))| desired.get(*peer) != Some(lease))
        .map(|(peer, _)| peer.clone())
        .collect();
    for peer in gone {
        if let Some((lease, direct)) = now.remove(&peer) {
            let steps = if direct {
                lease.direct_del_steps(netns, &node.underlay_if)
            } else {
                lease.del_steps(netns)
            };
            // As flannel: errors deleting are logged, not fatal (an entry may be gone).
            for step in steps {
                if let Err(e) = step.run() {
                    tracing::debug!(node = %name, %peer, "{step}: {e}");
                }
            }
            tracing::info!(node = %name, %peer, "vxlan peer removed");
        }
    }
    for (peer, lease) in desired {
        if now.contains_key(peer) {
            continue;
        }
        let direct = direct_routing
            && crate::ip::ip_json(Some(netns), &["route", "get", &lease.public_ip.to_string()])
                .is_ok_and(|r| is_direct(&r));
        let steps = if direct {
            lease.direct_add_steps(netns, &node.underlay_if)
        } else {
            lease.add_steps(netns)
        };
        match steps.iter().try_for_each(|s| s.run()) {
            Ok(()) => {
                tracing::info!(node = %name, %peer, pod_cidr = %lease.pod_cidr, direct, "vxlan peer added");
                now.insert(peer.clone(), (lease.clone(), direct));
            }
            // Retried at the next Node event (leases are re-sent on every watch relist).
            Err(e) => tracing::warn!(node = %name, %peer, "vxlan peer: {e}"),
        }
    }
    now
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::{PodNetwork, vtep_mac};

    fn node(name: &str, i: u8, network: PodNetwork) -> Node {
        let topo = NodeTopology {
            name: name.into(),
            netns: name.into(),
            internal_ip: [172, 30, 0, i + 1].into(),
            pod_cidr: format!("10.244.{i}.0/24").parse().unwrap(),
            gateway: [10, 244, i, 1].into(),
            host_link: format!("svcnetn{i}"),
            underlay_if: "eth0".into(),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "annotations": network.node_annotations(&topo).into_iter().collect::<BTreeMap<_, _>>(),
            },
            "spec": { "podCIDR": topo.pod_cidr.to_string() },
        }))
        .unwrap()
    }

    #[test]
    fn peers_are_the_other_nodes_vxlan_leases() {
        let nodes = [
            node("n1", 1, PodNetwork::Vxlan),
            node("n2", 2, PodNetwork::Vxlan),
            node("n3", 3, PodNetwork::HostGw),
        ];
        let peers = desired_peers("n1", &nodes);
        assert_eq!(peers.keys().collect::<Vec<_>>(), ["n2"]);
        let n2 = &peers["n2"];
        assert_eq!(n2.pod_cidr.to_string(), "10.244.2.0/24");
        assert_eq!(n2.public_ip.to_string(), "172.30.0.3");
        assert_eq!(n2.vtep_mac, vtep_mac([172, 30, 0, 3].into()));
    }

    #[test]
    fn direct_routing_needs_one_route_without_a_gateway() {
        let j = |s: &str| serde_json::from_str::<Vec<serde_json::Value>>(s).unwrap();
        assert!(is_direct(&j(
            r#"[{"dst":"172.30.0.3","dev":"eth0","prefsrc":"172.30.0.2"}]"#
        )));
        assert!(!is_direct(&j(
            r#"[{"dst":"10.9.0.1","gateway":"172.30.0.1","dev":"eth0"}]"#
        )));
        assert!(!is_direct(&[]));
    }

    #[test]
    fn malformed_leases_name_the_problem() {
        let mut n = node("n2", 2, PodNetwork::Vxlan);
        let key = format!("{FLANNEL_ANNOTATION_PREFIX}backend-data");
        n.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(key.clone(), r#"{"VNI":1,"VtepMAC":"zz"}"#.into());
        assert!(vxlan_lease(&n).unwrap_err().contains("VtepMAC"));
        n.metadata.annotations.as_mut().unwrap().remove(&key);
        assert!(vxlan_lease(&n).unwrap_err().contains("backend-data"));
        n.spec = None;
        assert!(vxlan_lease(&n).unwrap_err().contains("podCIDR"));
        assert!(desired_peers("n1", [&n]).is_empty());
    }
}
