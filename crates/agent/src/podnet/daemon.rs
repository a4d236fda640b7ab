//! flanneld's start-up and shutdown on its own node, for a pod network that runs as a node
//! add-on (the `svcnet-cni` DaemonSet of `deploy/svcnet.yaml`) rather than inside `svcnet up`:
//! the process runs in its node's network namespace (`hostNetwork`), learns the node from its
//! Node object (`spec.podCIDR`, the `InternalIP` address, and the interface holding it), makes
//! the backend's device there, publishes flannel's lease annotations and the
//! `NetworkUnavailable=False` condition through the `nodes/status` subresource (flannel's
//! `AcquireLease` and `CompleteLease`, the only write its ClusterRole allows), and on uninstall
//! removes what it made. Following the other Nodes is [`super::run_vxlan_with`],
//! [`run_host_gw`] and [`super::udp::run_udp`], as for `svcnet up`'s nodes.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::{NodeWatch, lease, peers_by, spec_pod_cidr};
use crate::ip::{self, OWN_NETNS};
use crate::routes::{PodNetwork, VXLAN_DEVICE, VXLAN_PORT, VXLAN_VNI, Vxlan, vtep_mac};
use crate::topology::{NodeTopology, Step, TopologyError};

/// What a node's daemon needs of its Node object: `Ok(None)` while the Node lacks it (its
/// pod CIDR comes from the controller manager after it registers), an error when malformed.
pub fn node_identity(node: &Node) -> Result<Option<(Ipv4Net, Ipv4Addr)>, String> {
    let has_cidr = node
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidr.as_deref())
        .is_some_and(|c| !c.is_empty());
    let internal = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.as_str());
    let (true, Some(internal)) = (has_cidr, internal) else {
        return Ok(None);
    };
    let pod_cidr = spec_pod_cidr(node)?;
    let internal_ip = internal
        .parse()
        .map_err(|e| format!("status.addresses InternalIP {internal:?}: {e}"))?;
    Ok(Some((pod_cidr, internal_ip)))
}

/// The interface holding `addr` in `netns` (the underlay flannel's `--iface` would name).
pub fn interface_with(netns: &str, addr: Ipv4Addr) -> Result<Option<String>, TopologyError> {
    let want = addr.to_string();
    let links = ip::ip_json(Some(netns), &["-4", "addr", "show"])?;
    Ok(links.iter().find_map(|l| {
        let has = l
            .get("addr_info")?
            .as_array()?
            .iter()
            .any(|a| a.get("local").and_then(|v| v.as_str()) == Some(want.as_str()));
        has.then(|| l.get("ifname")?.as_str().map(str::to_string))
            .flatten()
    }))
}

/// This process's node, as the backends take it: its own namespace, the Node's pod CIDR and
/// InternalIP, and the interface holding that address.
pub fn own_node(
    name: &str,
    pod_cidr: Ipv4Net,
    internal_ip: Ipv4Addr,
) -> Result<NodeTopology, TopologyError> {
    let underlay_if =
        interface_with(OWN_NETNS, internal_ip)?.ok_or_else(|| TopologyError::Config {
            field: "InternalIP",
            message: format!(
                "Node {name}'s InternalIP {internal_ip} is on no interface of this network \
                 namespace (is the pod hostNetwork on its node?)"
            ),
        })?;
    let gateway = pod_cidr
        .hosts()
        .next()
        .ok_or_else(|| TopologyError::Config {
            field: "podCIDR",
            message: format!("Node {name}'s spec.podCIDR {pod_cidr} has no host address"),
        })?;
    Ok(NodeTopology {
        name: name.to_string(),
        netns: OWN_NETNS.to_string(),
        internal_ip,
        pod_cidr,
        gateway,
        host_link: String::new(),
        underlay_if,
    })
}

/// Whether `link` (`ip -j -d link show` of the VTEP) is the VTEP `node` wants: kind vxlan,
/// VNI, local address, port and MAC as [`Vxlan::device_steps`] makes them (flanneld keeps a
/// compatible device across restarts and replaces an incompatible one).
pub fn vtep_matches(link: &serde_json::Value, node: &NodeTopology) -> bool {
    let info = link.pointer("/linkinfo/info_data");
    link.pointer("/linkinfo/info_kind").and_then(|k| k.as_str()) == Some("vxlan")
        && info.and_then(|i| i.get("id")).and_then(|v| v.as_u64()) == Some(VXLAN_VNI.into())
        && info.and_then(|i| i.get("local")).and_then(|v| v.as_str())
            == Some(node.internal_ip.to_string().as_str())
        && info.and_then(|i| i.get("port")).and_then(|v| v.as_u64()) == Some(VXLAN_PORT.into())
        && link.get("address").and_then(|v| v.as_str()) == Some(vtep_mac(node.internal_ip).as_str())
}

/// Makes `node`'s VTEP, keeping one a previous run left if it matches (its peers' entries
/// then keep carrying traffic across a restart of the daemon, as flanneld's do).
pub fn ensure_vtep(node: &NodeTopology) -> Result<(), TopologyError> {
    let ns = Some(node.netns.as_str());
    if ip::link_names(ns)?.iter().any(|l| l == VXLAN_DEVICE) {
        let link = ip::ip_json(ns, &["-d", "link", "show", "dev", VXLAN_DEVICE])?;
        if link.first().is_some_and(|l| vtep_matches(l, node)) {
            let addr = format!("{}/32", crate::routes::vtep_addr(node.pod_cidr));
            Step::ip(ns, &["addr", "replace", &addr, "dev", VXLAN_DEVICE]).run()?;
            return Step::ip(ns, &["link", "set", VXLAN_DEVICE, "up"]).run();
        }
        tracing::info!(node = %node.name, "replacing an incompatible {VXLAN_DEVICE}");
        ip::ip_del(ns, &["link", "del", VXLAN_DEVICE])?;
    }
    Vxlan::device_steps(node).iter().try_for_each(Step::run)
}

/// Removes `node`'s VTEP; its neighbour and FDB entries and the routes through it go with it.
pub fn remove_vtep(node: &NodeTopology) -> Result<(), TopologyError> {
    Ok(ip::ip_del(
        Some(&node.netns),
        &["link", "del", VXLAN_DEVICE],
    )?)
}

/// flannel's lease annotations for `node` as a `nodes/status` patch (flannel's `AcquireLease`
/// patches them through the status subresource).
pub fn lease_patch(network: PodNetwork, node: &NodeTopology) -> serde_json::Value {
    let annotations: BTreeMap<String, String> =
        network.node_annotations(node).into_iter().collect();
    serde_json::json!({ "metadata": { "annotations": annotations } })
}

/// The `NetworkUnavailable=False` condition as a `nodes/status` patch (flannel's
/// `CompleteLease`; the strategic merge keeps the other conditions).
pub fn available_patch(network: PodNetwork) -> serde_json::Value {
    let (reason, message) = super::condition::reason(network);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    serde_json::json!({ "status": { "conditions": [{
        "type": "NetworkUnavailable",
        "status": "False",
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }]}})
}

/// Publishes `node`'s lease, then (once its backend is up) the condition: two `nodes/status`
/// patches, as flanneld sends them.
pub async fn publish_lease(
    client: &Client,
    network: PodNetwork,
    node: &NodeTopology,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let params = PatchParams::default();
    api.patch_status(
        &node.name,
        &params,
        &Patch::Strategic(lease_patch(network, node)),
    )
    .await?;
    api.patch_status(
        &node.name,
        &params,
        &Patch::Strategic(available_patch(network)),
    )
    .await?;
    Ok(())
}

/// A host-gw lease: the peer's pod CIDR and underlay address.
pub type HostGwPeers = BTreeMap<String, (Ipv4Net, Ipv4Addr)>;

fn host_gw_route(node: &NodeTopology, verb: &str, cidr: Ipv4Net, via: Ipv4Addr) -> Step {
    let (cidr, via) = (cidr.to_string(), via.to_string());
    let args = ["route", verb, &cidr, "via", &via, "dev", &node.underlay_if];
    Step::ip(Some(&node.netns), &args)
}

/// Makes `node`'s host-gw routes equal `desired` (blocking); returns what is now programmed.
pub fn sync_host_gw(
    node: &NodeTopology,
    applied: HostGwPeers,
    desired: &HostGwPeers,
) -> HostGwPeers {
    let mut now = applied;
    let gone: Vec<String> = now
        .iter()
        .filter(|(peer, lease)| desired.get(*peer) != Some(lease))
        .map(|(peer, _)| peer.clone())
        .collect();
    for peer in gone {
        if let Some((cidr, via)) = now.remove(&peer) {
            if let Err(e) = host_gw_route(node, "del", cidr, via).run() {
                tracing::debug!(node = %node.name, %peer, "host-gw route: {e}");
            }
            tracing::info!(node = %node.name, %peer, "host-gw peer removed");
        }
    }
    for (peer, &(cidr, via)) in desired {
        if now.contains_key(peer) {
            continue;
        }
        match host_gw_route(node, "replace", cidr, via).run() {
            Ok(()) => {
                tracing::info!(node = %node.name, %peer, pod_cidr = %cidr, "host-gw peer added");
                now.insert(peer.clone(), (cidr, via));
            }
            Err(e) => tracing::warn!(node = %node.name, %peer, "host-gw peer: {e}"),
        }
    }
    now
}

/// flanneld's host-gw backend on `node` (`pkg/backend/route_network.go`): a route to every
/// other Node's host-gw lease via its public IP, following the Nodes until `shutdown`.
/// Returns the routes left programmed, for an uninstall to remove.
pub async fn run_host_gw(
    client: Client,
    node: NodeTopology,
    shutdown: impl Future<Output = ()>,
) -> HostGwPeers {
    let mut watch = NodeWatch::new(client, &node.name);
    let mut applied = HostGwPeers::new();
    tokio::pin!(shutdown);
    loop {
        let desired: HostGwPeers = tokio::select! {
            () = &mut shutdown => break,
            nodes = watch.changed() => match nodes {
                None => break,
                Some(nodes) => peers_by(&node.name, nodes.values(), |n| lease(n, "host-gw")),
            },
        };
        if desired == applied {
            continue;
        }
        let job_node = node.clone();
        let job = move || sync_host_gw(&job_node, applied, &desired);
        applied = match tokio::task::spawn_blocking(job).await {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(node = %node.name, "host-gw reconcile task: {e}");
                HostGwPeers::new()
            }
        };
    }
    applied
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn node() -> NodeTopology {
        NodeTopology {
            name: "n1".into(),
            netns: OWN_NETNS.into(),
            internal_ip: [172, 30, 0, 2].into(),
            pod_cidr: "10.244.1.0/24".parse().unwrap(),
            gateway: [10, 244, 1, 1].into(),
            host_link: String::new(),
            underlay_if: "ens3".into(),
        }
    }

    /// In its own namespace the daemon runs plain commands on its node's underlay interface.
    #[test]
    fn own_namespace_steps_enter_no_namespace() {
        let mut text: String = Vxlan::device_steps(&node())
            .iter()
            .map(|s| format!("{s}\n"))
            .collect();
        text.push_str(&format!(
            "{}\n",
            host_gw_route(
                &node(),
                "replace",
                "10.244.2.0/24".parse().unwrap(),
                [172, 30, 0, 3].into()
            )
        ));
        let peer = crate::routes::VxlanPeer {
            pod_cidr: "10.244.2.0/24".parse().unwrap(),
            public_ip: [172, 30, 0, 3].into(),
            vtep_mac: vtep_mac([172, 30, 0, 3].into()),
        };
        for s in peer.add_steps(OWN_NETNS) {
            text.push_str(&format!("{s}\n"));
        }
        expect![[r#"
            ip link add flannel.1 address 0e:f1:ac:1e:00:02 mtu 1450 type vxlan id 1 local 172.30.0.2 dev ens3 nolearning dstport 8472
            ip addr add 10.244.1.0/32 dev flannel.1
            ip link set flannel.1 up
            ip route replace 10.244.2.0/24 via 172.30.0.3 dev ens3
            ip neigh replace 10.244.2.0 lladdr 0e:f1:ac:1e:00:03 dev flannel.1 nud permanent
            bridge fdb replace 0e:f1:ac:1e:00:03 dev flannel.1 dst 172.30.0.3 self permanent
            ip route replace 10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink
        "#]]
        .assert_eq(&text);
    }

    #[test]
    fn the_lease_is_flannels_annotations_and_condition() {
        let lease = lease_patch(PodNetwork::Vxlan, &node());
        expect![[r#"{"metadata":{"annotations":{"flannel.alpha.coreos.com/backend-data":"{\"VNI\":1,\"VtepMAC\":\"0e:f1:ac:1e:00:02\"}","flannel.alpha.coreos.com/backend-type":"vxlan","flannel.alpha.coreos.com/kube-subnet-manager":"true","flannel.alpha.coreos.com/public-ip":"172.30.0.2"}}}"#]]
        .assert_eq(&lease.to_string());
        let cond = available_patch(PodNetwork::Vxlan);
        let c = &cond["status"]["conditions"][0];
        assert_eq!(
            (&c["type"], &c["status"], &c["reason"]),
            (
                &serde_json::json!("NetworkUnavailable"),
                &serde_json::json!("False"),
                &serde_json::json!("FlannelIsUp")
            )
        );
    }

    #[test]
    fn identity_needs_the_pod_cidr_and_internal_ip() {
        let node = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        let full = node(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {"addresses": [
                {"type": "Hostname", "address": "n1"},
                {"type": "InternalIP", "address": "172.30.0.2"},
            ]},
        }));
        assert_eq!(
            node_identity(&full).unwrap(),
            Some(("10.244.1.0/24".parse().unwrap(), [172, 30, 0, 2].into()))
        );
        let waiting = node(serde_json::json!({"metadata": {"name": "n1"}, "spec": {}}));
        assert_eq!(node_identity(&waiting).unwrap(), None);
        let bad = node(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "nope"}]},
        }));
        assert!(node_identity(&bad).unwrap_err().contains("InternalIP"));
    }

    #[test]
    fn a_vtep_is_kept_only_when_it_matches() {
        let link = |port: u64| {
            serde_json::json!({
                "ifname": "flannel.1",
                "address": "0e:f1:ac:1e:00:02",
                "linkinfo": {"info_kind": "vxlan", "info_data": {"id": 1, "local": "172.30.0.2", "port": port}},
            })
        };
        assert!(vtep_matches(&link(8472), &node()));
        assert!(!vtep_matches(&link(4789), &node()));
    }
}
