//! The embedded cluster's nodes: one network namespace per node (the agent's topology), and on
//! each node the proxy programming that namespace and the agent running its pods.

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;
use ipnet::{IpNet, Ipv4Net};
use svcnet_agent::routes::PodNetwork;
use svcnet_agent::{AgentConfig, Topology, TopologyConfig};

use super::objects::NodeSpec;

/// What the node namespaces are built from.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub prefix: String,
    pub nodes: usize,
    pub underlay: Ipv4Net,
    pub pod_cidr: Ipv4Net,
    pub service_cidrs: Vec<IpNet>,
    pub lb_pool: IpNet,
    /// `None`: the pod network is an add-on's (`--disable pod-network`).
    pub pod_network: Option<PodNetwork>,
}

/// What a `svcnet up` needs on the host beside root and iproute2.
pub struct Needs {
    /// The nftables and userspace proxies program the kernel through libnftables (no `nft`
    /// process).
    pub libnftables: bool,
    /// The `nft` command (the node-local DNS cache's table).
    pub nft: bool,
    pub iptables: bool,
    /// The IPVS proxy: a kernel with `ip_vs`, and `ipset`.
    pub ipvs: bool,
}

/// Fails with what is missing and how to install it, before anything is created.
pub fn check_prerequisites(needs: Needs) -> anyhow::Result<()> {
    anyhow::ensure!(
        is_root(),
        "the node agent and the proxy create network namespaces and need root: run `svcnet up` \
         as root, or `svcnet up --disable agent,proxy` for the control plane and DNS alone"
    );
    let mut missing = Vec::new();
    let mut tools = vec![("ip", "iproute2")];
    if needs.nft {
        tools.push(("nft", "nftables"));
    }
    if needs.iptables {
        tools.push(("iptables-restore", "iptables"));
    }
    if needs.ipvs {
        tools.push(("ipset", "ipset"));
    }
    for (tool, package) in tools {
        let found = Command::new(tool).arg("-V").output().is_ok();
        if !found {
            missing.push((tool, package));
        }
    }
    if needs.libnftables && svcnet_libnft::available().is_err() {
        missing.push((svcnet_libnft::SONAME, "libnftables1"));
    }
    if needs.ipvs {
        // Resolving IPVS loads ip_vs where the kernel has it; fail before anything is created.
        if let Err(e) = svcnet_ipvs::IpvsSocket::open() {
            anyhow::bail!("--proxy-mode ipvs: {e}");
        }
    }
    if !missing.is_empty() {
        let tools: Vec<&str> = missing.iter().map(|(t, _)| *t).collect();
        let packages: Vec<&str> = missing.iter().map(|(_, p)| *p).collect();
        anyhow::bail!(
            "svcnet up needs {} (commands on the PATH, libraries where the loader finds them); install with: apt-get install -y {}",
            tools.join(", "),
            packages.join(" ")
        );
    }
    Ok(())
}

fn is_root() -> bool {
    // SAFETY-free check: the effective uid from /proc, so this crate needs no libc.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|uids| uids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Creates the node namespaces, bridge and routes (blocking work, off the async threads).
pub async fn create_topology(cfg: &ClusterConfig, data_dir: &Path) -> anyhow::Result<Topology> {
    let service_cidrs: Vec<Ipv4Net> = cfg
        .service_cidrs
        .iter()
        .filter_map(|c| match c {
            IpNet::V4(v4) => Some(*v4),
            IpNet::V6(_) => None,
        })
        .collect();
    let lb_pool = match cfg.lb_pool {
        IpNet::V4(v4) => Some(v4),
        IpNet::V6(_) => None,
    };
    let config = TopologyConfig {
        prefix: cfg.prefix.clone(),
        nodes: cfg.nodes,
        underlay: cfg.underlay,
        pod_cidr: cfg.pod_cidr,
        service_cidrs,
        lb_pool,
        data_dir: data_dir.to_path_buf(),
        // The pods' MTU when the pod network is an add-on's comes from its lease.
        pod_network: cfg.pod_network.unwrap_or_default(),
    };
    let backend: &'static dyn svcnet_agent::routes::PodRouteBackend = match cfg.pod_network {
        Some(network) => network.backend(),
        None => &svcnet_agent::routes::NoRoutes,
    };
    tokio::task::spawn_blocking(move || Topology::create_with(config, backend))
        .await
        .context("topology task")?
        .context("cannot create the node namespaces")
}

/// The Node objects of a topology, with flannel's annotations for its pod network (none
/// when the pod network is an add-on's: it publishes its own).
pub fn node_specs(topology: &Topology, pod_network: Option<PodNetwork>) -> Vec<NodeSpec> {
    topology
        .nodes()
        .iter()
        .map(|node| NodeSpec {
            name: node.name.clone(),
            internal_ip: node.internal_ip.into(),
            pod_cidr: node.pod_cidr.into(),
            annotations: pod_network
                .map(|network| {
                    [
                        network.node_annotations(node),
                        network.calico_annotations(node, topology.config().underlay),
                    ]
                    .concat()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// Calico's BGP on one node (its BIRD, configured from the Nodes) until `stop`.
pub async fn run_bgp(
    client: kube::Client,
    node: svcnet_agent::NodeTopology,
    pool: Ipv4Net,
    data_dir: std::path::PathBuf,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let settings = svcnet_agent::podnet::bgp::BgpSettings::calico(pool);
    let name = node.name.clone();
    svcnet_agent::podnet::bgp::run_bgp(client, node, settings, data_dir, stop)
        .await
        .with_context(|| format!("BGP speaker on {name}"))
}

/// The proxy's configuration for one node of the topology.
pub fn proxy_config(
    node: &svcnet_agent::NodeTopology,
    cfg: &ClusterConfig,
    mode: svcnet_proxyd::ProxyMode,
) -> svcnet_proxyd::ProxyConfig {
    svcnet_proxyd::ProxyConfig {
        node_name: node.name.clone(),
        mode,
        netns: Some(node.netns.clone()),
        cluster_cidrs: vec![IpNet::V4(cfg.pod_cidr)],
        service_cidrs: cfg.service_cidrs.clone(),
        ..Default::default()
    }
}

/// The agent's configuration for one node of the topology.
pub fn agent_config(
    topology: &Topology,
    node: &svcnet_agent::NodeTopology,
    data_dir: &Path,
    dns_ip: std::net::IpAddr,
    cluster_domain: &str,
    images: &[(String, std::path::PathBuf)],
) -> AgentConfig {
    let mut cfg = AgentConfig::for_node(topology, node, data_dir);
    cfg.cluster_dns = vec![dns_ip.to_string()];
    cfg.cluster_domain = cluster_domain.to_string();
    // This binary (the agent's default test-server program): pods are attached the way a
    // kubelet's runtime attaches them, with it run as the CNI plugin, a process per call; and
    // svcnet's own image runs as it, before the images the operator mapped.
    let exe = cfg.test_server.clone();
    cfg.cni_plugin = svcnet_agent::cni::exec::Plugin::Binary(exe.clone());
    cfg.images = std::iter::once((super::SVCNET_IMAGE.to_string(), exe))
        .chain(images.iter().cloned())
        .collect();
    cfg
}
