//! Calico's BGP pod network (`--pod-network bgp`): no encapsulation; every node runs a real BGP
//! speaker, BIRD 2 (Debian's `bird2`, the daemon Calico itself ships), inside its namespace, in
//! a full iBGP mesh (AS 64512) announcing its own pod CIDR. Pod routes come from BGP: the
//! kernel routes to the other nodes' pods are installed by BIRD (`proto bird`), never by svcnet,
//! so stopping a node's speaker withdraws its routes from the others and restarting it brings
//! them back.
//!
//! svcnet's share is confd's: [`bird_config`] is a pure function (this node, the nodes with
//! their underlay addresses and pod CIDRs, the AS and the pool) → `bird.conf`, shaped like
//! Calico's `confd/etc/calico/confd/templates/bird.cfg.template` (router id, a kernel protocol
//! with `learn` and an export filter that programs only pod routes learnt over BGP, the device
//! and direct protocols, a blackhole static route for this node's block, a `bgp` template with
//! Calico's timers, one `Mesh_<a_b_c_d>` session per other node, passive towards the higher
//! address so each pair peers one way). [`run_bgp`] watches the Nodes (Calico's
//! `projectcalico.org/IPv4Address` annotation and `spec.podCIDR`), rewrites the config when
//! they change and reloads BIRD through its control socket (`birdc configure`).
//!
//! Each [`Speaker`] is a child of the process that starts it (`svcnet up`), killed with it;
//! its config, control socket, pid file and log live in `<data dir>/bird/<node>/`, so
//! [`cleanup_speakers`] (`svcnet down`) finds leftovers after a `kill -9` and removes their
//! routes. The distribution's own `bird.service` is never used.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;
use kube::Client;

pub use super::speaker::{
    BIRD, BIRD_DIR, BIRDC, BgpError, Speaker, SpeakerCleanup, SpeakerPaths, cleanup_speakers,
};
use crate::podnet::NodeWatch;
use crate::topology::NodeTopology;

/// Calico's default AS number (`BGPConfiguration.asNumber`).
pub const CALICO_AS: u32 = 64512;
/// Calico's node annotation prefix.
pub const CALICO_ANNOTATION_PREFIX: &str = "projectcalico.org/";
/// The node's underlay address with its prefix length, as calico-node writes it
/// (`projectcalico.org/IPv4Address: 172.30.0.2/24`).
pub const CALICO_IPV4_ADDRESS: &str = "projectcalico.org/IPv4Address";
/// The node's IPIP tunnel address (`tunl0`'s), for Calico's IPIP mode.
pub const CALICO_IPIP_TUNNEL_ADDR: &str = "projectcalico.org/IPv4IPIPTunnelAddr";

/// A node as the BGP mesh sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BgpNode {
    pub name: String,
    /// The underlay address: router id, session source and next hop.
    pub ip: Ipv4Addr,
    /// The block it announces.
    pub pod_cidr: Ipv4Net,
}

impl BgpNode {
    pub fn of(node: &NodeTopology) -> Self {
        Self {
            name: node.name.clone(),
            ip: node.internal_ip,
            pod_cidr: node.pod_cidr,
        }
    }
}

/// The mesh's settings (Calico's `BGPConfiguration` and IPPool, and BIRD's timers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpSettings {
    pub as_number: u32,
    /// The pod network (Calico's IPPool): only blocks inside it are announced, accepted and
    /// programmed.
    pub pool: Ipv4Net,
    /// How long peers keep a vanished speaker's routes (graceful restart): Calico's 120 s;
    /// tests make it short.
    pub graceful_restart_secs: u32,
    /// Calico's IPIP mode over BGP (`ipipMode: Always`): learnt routes go through `tunl0`,
    /// onlink to the peer's address, instead of plainly via it.
    pub ipip: bool,
}

impl BgpSettings {
    /// Calico's defaults for `pool`.
    pub fn calico(pool: Ipv4Net) -> Self {
        Self {
            as_number: CALICO_AS,
            pool,
            graceful_restart_secs: 120,
            ipip: false,
        }
    }
}

/// `Mesh_172_30_0_3`, Calico's protocol name for the session with a peer.
fn mesh_name(ip: Ipv4Addr) -> String {
    format!("Mesh_{}", ip.to_string().replace('.', "_"))
}

/// `bird.conf` for `this` node in a full mesh with `nodes` (which may include `this`; nodes
/// without an address or duplicates of `this` are the caller's to drop). Pure.
pub fn bird_config(settings: &BgpSettings, this: &BgpNode, nodes: &[BgpNode]) -> String {
    let BgpSettings {
        as_number,
        pool,
        graceful_restart_secs,
        ipip,
    } = settings;
    let program = if *ipip {
        // Upstream BIRD's `onlink` (2.0.12) instead of the `krt_tunnel` of Calico's fork. The
        // order matters: `ifname` drops the gateway, and a gateway set before `onlink` is
        // resolved to eth0 again.
        format!(
            r#"  if source = RTS_BGP && net ~ {pool} then {{
    ifname = "{tunl}";
    onlink = true;
    gw = bgp_next_hop;
    accept;
  }}"#,
            tunl = super::ipip::IPIP_DEVICE
        )
    } else {
        format!("  if source = RTS_BGP && net ~ {pool} then accept;")
    };
    let (me, block) = (this.ip, this.pod_cidr);
    let mut peers: Vec<&BgpNode> = nodes.iter().filter(|n| n.ip != this.ip).collect();
    peers.sort_by_key(|n| n.ip);
    peers.dedup_by_key(|n| n.ip);
    let mut c = String::new();
    // `write!` into a String cannot fail.
    let _ = write!(
        c,
        r#"# bird.conf for node {name}, written by svcnet (Calico confd's bird.cfg.template). Do not edit:
# svcnet rewrites it when Nodes change and reloads BIRD with `birdc configure`.
log stderr {{ info, remote, warning, error, auth, fatal, bug }};
router id {me};

# Only pod routes learnt over BGP reach the kernel (calico_kernel_programming).
filter svcnet_kernel_programming {{
{program}
  reject;
}}

# Announce this node's block, exactly, and nothing else (calico_aggr and the pool filter).
filter svcnet_export_to_bgp_peers {{
  if proto = "svcnet_block" && net = {block} then accept;
  reject;
}}

# Accept other nodes' blocks inside the pool; never this node's own.
filter svcnet_import_from_bgp_peers {{
  if net = {block} then reject;
  if net ~ {pool} then accept;
  reject;
}}

# No `persist` (unlike Calico): a stopped speaker takes its learnt routes with it, so a node
# that leaves the mesh leaves nothing behind.
protocol kernel {{
  learn;
  scan time 2;
  ipv4 {{ import all; export filter svcnet_kernel_programming; }};
  graceful restart;
  merge paths on;
}}

protocol device {{ scan time 2; }}

# Connected routes resolve the peers' next hops (`gateway recursive`).
protocol direct {{
  ipv4;
  interface -"cni*", -"veth*", -"tunl*", -"flannel*", "*";
}}

# This node's block as a blackhole: announced while the speaker runs; the kernel keeps the
# more specific connected route on cni0 for its own pods.
protocol static svcnet_block {{
  ipv4;
  route {block} blackhole;
}}

template bgp svcnet_mesh {{
  local {me} as {as_number};
  multihop;
  ipv4 {{
    import filter svcnet_import_from_bgp_peers;
    export filter svcnet_export_to_bgp_peers;
    gateway recursive;
    add paths on;
  }};
  graceful restart;
  graceful restart time {graceful_restart_secs};
  connect delay time 1;
  connect retry time 3;
  error wait time 5, 60;
}}

# The node-to-node mesh: passive towards higher addresses, so each pair has one session.
"#,
        name = this.name,
    );
    if peers.is_empty() {
        c.push_str("# (no other nodes yet)\n");
    }
    for peer in peers {
        let _ = writeln!(
            c,
            "protocol bgp {} from svcnet_mesh {{ neighbor {} as {as_number}; source address {me}; passive {}; description \"{}\"; }}",
            mesh_name(peer.ip),
            peer.ip,
            if peer.ip > me { "on" } else { "off" },
            peer.name,
        );
    }
    c
}

/// A Node's place in the mesh: its Calico address annotation and `spec.podCIDR`. `Ok(None)`
/// when it carries no Calico address (not a BGP node); an error names what is malformed.
pub fn bgp_node(node: &Node) -> Result<Option<BgpNode>, String> {
    let Some(addr) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CALICO_IPV4_ADDRESS))
    else {
        return Ok(None);
    };
    let name = node.metadata.name.clone().ok_or("no metadata.name")?;
    // calico-node writes the address with its prefix length; a bare address is accepted too.
    let ip = addr
        .split('/')
        .next()
        .unwrap_or_default()
        .parse()
        .map_err(|e| format!("{CALICO_IPV4_ADDRESS} {addr:?}: {e}"))?;
    let pod_cidr = super::spec_pod_cidr(node)?;
    Ok(Some(BgpNode { name, ip, pod_cidr }))
}

/// The mesh among `nodes` (pure): every Node with a valid Calico address, by name; malformed
/// ones are skipped with a warning, as confd skips them.
pub fn mesh_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Vec<BgpNode> {
    nodes
        .into_iter()
        .filter_map(|node| match bgp_node(node) {
            Ok(n) => n,
            Err(e) => {
                let name = node.metadata.name.as_deref().unwrap_or("?");
                tracing::warn!(node = %name, "ignoring it in the BGP mesh: {e}");
                None
            }
        })
        .collect()
}

/// Calico's annotations for a node whose underlay is `underlay` (for its prefix length).
pub fn calico_annotations(
    node: &NodeTopology,
    underlay: Ipv4Net,
    ipip: bool,
) -> Vec<(String, String)> {
    let mut out = vec![(
        CALICO_IPV4_ADDRESS.to_string(),
        format!("{}/{}", node.internal_ip, underlay.prefix_len()),
    )];
    if ipip {
        out.push((
            CALICO_IPIP_TUNNEL_ADDR.to_string(),
            super::ipip::tunnel_addr(node.pod_cidr).to_string(),
        ));
    }
    out
}

/// Calico's BGP as a topology backend: nothing to program; the routes come from the speakers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bgp;

impl crate::routes::PodRouteBackend for Bgp {
    fn name(&self) -> &'static str {
        "bgp"
    }

    fn node_steps(
        &self,
        _node: &NodeTopology,
        _peers: &[&NodeTopology],
    ) -> Vec<crate::topology::Step> {
        Vec::new()
    }
}

impl crate::routes::PodNetwork {
    /// Calico's Node annotations for the Calico backends (none for flannel's).
    pub fn calico_annotations(
        self,
        node: &NodeTopology,
        underlay: Ipv4Net,
    ) -> Vec<(String, String)> {
        use crate::routes::PodNetwork;
        match self {
            PodNetwork::Bgp | PodNetwork::Ipip => {
                calico_annotations(node, underlay, self == PodNetwork::Ipip)
            }
            _ => Vec::new(),
        }
    }

    /// What this backend needs of the host beyond iproute2, checked before anything is
    /// created: BIRD for bgp, the `ipip` module for ipip. The error says what is missing.
    pub fn check_host(self) -> Result<(), String> {
        use crate::routes::PodNetwork;
        match self {
            PodNetwork::Bgp => {
                for tool in [BIRD, BIRDC] {
                    if Command::new(tool).arg("--version").output().is_err() {
                        return Err(format!(
                            "--pod-network bgp runs BIRD 2 in every node namespace and needs `{tool}`: \
                             apt-get install -y bird2"
                        ));
                    }
                }
                Ok(())
            }
            PodNetwork::Ipip => super::ipip::kernel_support(),
            _ => Ok(()),
        }
    }
}

/// Calico's BGP for one node until `shutdown`: starts its speaker once the Nodes are listed
/// (then reports the Node's network available), rewrites its config and reloads it whenever the
/// mesh changes, stops it at the end.
pub async fn run_bgp(
    client: Client,
    node: NodeTopology,
    settings: BgpSettings,
    data_dir: PathBuf,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BgpError> {
    let this = BgpNode::of(&node);
    let mut watch = NodeWatch::new(client.clone(), &node.name);
    let mut speaker: Option<std::sync::Arc<Speaker>> = None;
    let mut applied: Option<String> = None;
    tokio::pin!(shutdown);
    loop {
        let config = tokio::select! {
            () = &mut shutdown => break,
            nodes = watch.changed() => match nodes {
                Some(nodes) => bird_config(&settings, &this, &mesh_nodes(nodes.values())),
                None => break,
            },
        };
        if applied.as_deref() == Some(config.as_str()) {
            continue;
        }
        match &speaker {
            None => {
                let (dir, name, netns, text) = (
                    data_dir.clone(),
                    node.name.clone(),
                    node.netns.clone(),
                    config.clone(),
                );
                let started =
                    tokio::task::spawn_blocking(move || Speaker::start(&dir, &name, &netns, &text))
                        .await
                        .map_err(|e| BgpError::Failed {
                            node: node.name.clone(),
                            what: format!("start task: {e}"),
                        })??;
                speaker = Some(std::sync::Arc::new(started));
                let network = crate::routes::PodNetwork::Bgp;
                if let Err(e) =
                    super::condition::report_network_available(&client, &node.name, network).await
                {
                    tracing::warn!(node = %node.name, "cannot report NetworkUnavailable=False: {e}");
                }
            }
            Some(s) => {
                let (s, text) = (s.clone(), config.clone());
                let res = tokio::task::spawn_blocking(move || s.configure(&text)).await;
                match res {
                    Ok(Ok(())) => tracing::info!(node = %node.name, "bird reconfigured"),
                    // The running config stays; retried at the next Node event.
                    Ok(Err(e)) => {
                        tracing::warn!("{e}");
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(node = %node.name, "reconfigure task: {e}");
                        continue;
                    }
                }
            }
        }
        applied = Some(config);
    }
    if let Some(s) = speaker {
        // The only other holders are finished reconfigure tasks.
        let _ = tokio::task::spawn_blocking(move || drop(s)).await;
    }
    Ok(())
}

/// The mesh of a set of topology nodes, as their Node objects announce it (for tests and
/// benches without an API server): name → config.
pub fn mesh_configs(settings: &BgpSettings, nodes: &[NodeTopology]) -> BTreeMap<String, String> {
    let mesh: Vec<BgpNode> = nodes.iter().map(BgpNode::of).collect();
    mesh.iter()
        .map(|n| (n.name.clone(), bird_config(settings, n, &mesh)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn node(i: u8) -> BgpNode {
        BgpNode {
            name: format!("n{i}"),
            ip: [172, 30, 0, i + 1].into(),
            pod_cidr: format!("10.244.{i}.0/24").parse().unwrap(),
        }
    }

    #[test]
    fn bird_config_is_calicos_mesh_for_node_two_of_three() {
        let settings = BgpSettings::calico("10.244.0.0/16".parse().unwrap());
        let nodes = [node(3), node(1), node(2), node(1)];
        expect![[r#"
            # bird.conf for node n2, written by svcnet (Calico confd's bird.cfg.template). Do not edit:
            # svcnet rewrites it when Nodes change and reloads BIRD with `birdc configure`.
            log stderr { info, remote, warning, error, auth, fatal, bug };
            router id 172.30.0.3;

            # Only pod routes learnt over BGP reach the kernel (calico_kernel_programming).
            filter svcnet_kernel_programming {
              if source = RTS_BGP && net ~ 10.244.0.0/16 then accept;
              reject;
            }

            # Announce this node's block, exactly, and nothing else (calico_aggr and the pool filter).
            filter svcnet_export_to_bgp_peers {
              if proto = "svcnet_block" && net = 10.244.2.0/24 then accept;
              reject;
            }

            # Accept other nodes' blocks inside the pool; never this node's own.
            filter svcnet_import_from_bgp_peers {
              if net = 10.244.2.0/24 then reject;
              if net ~ 10.244.0.0/16 then accept;
              reject;
            }

            # No `persist` (unlike Calico): a stopped speaker takes its learnt routes with it, so a node
            # that leaves the mesh leaves nothing behind.
            protocol kernel {
              learn;
              scan time 2;
              ipv4 { import all; export filter svcnet_kernel_programming; };
              graceful restart;
              merge paths on;
            }

            protocol device { scan time 2; }

            # Connected routes resolve the peers' next hops (`gateway recursive`).
            protocol direct {
              ipv4;
              interface -"cni*", -"veth*", -"tunl*", -"flannel*", "*";
            }

            # This node's block as a blackhole: announced while the speaker runs; the kernel keeps the
            # more specific connected route on cni0 for its own pods.
            protocol static svcnet_block {
              ipv4;
              route 10.244.2.0/24 blackhole;
            }

            template bgp svcnet_mesh {
              local 172.30.0.3 as 64512;
              multihop;
              ipv4 {
                import filter svcnet_import_from_bgp_peers;
                export filter svcnet_export_to_bgp_peers;
                gateway recursive;
                add paths on;
              };
              graceful restart;
              graceful restart time 120;
              connect delay time 1;
              connect retry time 3;
              error wait time 5, 60;
            }

            # The node-to-node mesh: passive towards higher addresses, so each pair has one session.
            protocol bgp Mesh_172_30_0_2 from svcnet_mesh { neighbor 172.30.0.2 as 64512; source address 172.30.0.3; passive off; description "n1"; }
            protocol bgp Mesh_172_30_0_4 from svcnet_mesh { neighbor 172.30.0.4 as 64512; source address 172.30.0.3; passive on; description "n3"; }
        "#]]
        .assert_eq(&bird_config(&settings, &node(2), &nodes));
    }

    #[test]
    fn ipip_over_bgp_programs_learnt_routes_through_tunl0() {
        let mut settings = BgpSettings::calico("10.244.0.0/16".parse().unwrap());
        settings.ipip = true;
        let text = bird_config(&settings, &node(1), &[node(1), node(2)]);
        let filter: String = text
            .lines()
            .skip_while(|l| !l.starts_with("filter svcnet_kernel_programming"))
            .take_while(|l| *l != "}")
            .map(|l| format!("{l}\n"))
            .collect();
        expect![[r#"
            filter svcnet_kernel_programming {
              if source = RTS_BGP && net ~ 10.244.0.0/16 then {
                ifname = "tunl0";
                onlink = true;
                gw = bgp_next_hop;
                accept;
              }
              reject;
        "#]]
        .assert_eq(&filter);
    }

    #[test]
    fn a_lone_node_has_no_sessions() {
        let settings = BgpSettings::calico("10.244.0.0/16".parse().unwrap());
        let text = bird_config(&settings, &node(1), &[node(1)]);
        assert!(text.contains("(no other nodes yet)"), "{text}");
        assert!(!text.contains("protocol bgp "), "{text}");
    }

    #[test]
    fn mesh_nodes_come_from_calico_annotations() {
        let topo = NodeTopology {
            name: "n1".into(),
            netns: "n1".into(),
            internal_ip: [172, 30, 0, 2].into(),
            pod_cidr: "10.244.1.0/24".parse().unwrap(),
            gateway: [10, 244, 1, 1].into(),
            host_link: "x".into(),
            underlay_if: "eth0".into(),
        };
        let annotations: BTreeMap<String, String> =
            calico_annotations(&topo, "172.30.0.0/24".parse().unwrap(), true)
                .into_iter()
                .collect();
        assert_eq!(annotations[CALICO_IPV4_ADDRESS], "172.30.0.2/24");
        assert_eq!(annotations[CALICO_IPIP_TUNNEL_ADDR], "10.244.1.0");
        let good: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "annotations": annotations},
            "spec": {"podCIDR": "10.244.1.0/24"},
        }))
        .unwrap();
        assert_eq!(bgp_node(&good).unwrap(), Some(BgpNode::of(&topo)));
        let plain: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        assert_eq!(bgp_node(&plain).unwrap(), None);
        let bad: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "b", "annotations": {CALICO_IPV4_ADDRESS: "nope/24"}},
            "spec": {"podCIDR": "10.244.9.0/24"},
        }))
        .unwrap();
        assert!(bgp_node(&bad).unwrap_err().contains(CALICO_IPV4_ADDRESS));
        let no_cidr: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "annotations": {CALICO_IPV4_ADDRESS: "172.30.0.9/24"}},
        }))
        .unwrap();
        assert!(bgp_node(&no_cidr).unwrap_err().contains("podCIDR"));
        assert_eq!(mesh_nodes([&good, &plain, &bad, &no_cidr]).len(), 1);
    }
}
