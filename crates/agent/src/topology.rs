//! The embedded cluster's topology: one network namespace per node on a host bridge svcnet
//! owns (the nodes' underlay), a `cni0` bridge per node for its pods, host routes for the pod
//! CIDR, service CIDRs and load-balancer pool into the nodes, and inter-node pod routes from a
//! [`PodRouteBackend`].
//!
//! ```text
//!  host ── <prefix>0 bridge 172.30.0.1/24 ──┬── <prefix>n1 ═ eth0 172.30.0.2  [<prefix>-node1]  cni0 10.244.1.1/24
//!   routes: 10.244.1.0/24 via .2            └── <prefix>n2 ═ eth0 172.30.0.3  [<prefix>-node2]  cni0 10.244.2.1/24
//!           10.244.2.0/24 via .3                 node1: 10.244.2.0/24 via 172.30.0.3 (host-gw), no default route
//!           10.96.0.0/12, LB pool via .2
//! ```
//!
//! **Architecture Invariant:** the host is only touched through the bridge `<prefix>0`, the
//! veths `<prefix>n<i>` and routes for svcnet's own CIDRs (all routes use the bridge, so they
//! vanish with it). No namespace gets a default route. Everything created is listed in
//! `<data_dir>/topology.json` *before* it is created, so [`cleanup`] finds it after a crash;
//! it also finds namespaces named `<prefix>-*` and links `<prefix>0`/`<prefix>n<i>` by name.
//!
//! [`plan_create`] is pure (a list of [`Step`]s, printable and snapshot-tested); only
//! [`Topology::create`] and [`cleanup`] do I/O, synchronously (call them from
//! `spawn_blocking` in async code; they take well under a second).

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::ip::{self, IpError};
use crate::routes::{PodNetwork, PodRouteBackend};

/// The underlay interface's name inside each node namespace.
pub const NODE_UNDERLAY_IF: &str = "eth0";
/// The pod bridge's name inside each node namespace.
pub const POD_BRIDGE: &str = "cni0";
/// The record of created objects, in the data dir.
pub const RECORD_FILE: &str = "topology.json";

/// What to build. [`TopologyConfig::default`] is `svcnet up`'s: prefix `svcnet`, 1 node,
/// underlay 172.30.0.0/24, pod CIDR 10.244.0.0/16, service CIDR 10.96.0.0/12.
#[derive(Debug, Clone)]
pub struct TopologyConfig {
    /// Names: namespaces `<prefix>-node<i>` (also the Kubernetes node names) and
    /// `<prefix>-pod-*`, host links `<prefix>0` and `<prefix>n<i>`. At most 11 characters.
    pub prefix: String,
    pub nodes: usize,
    /// The host gets `.1`, node `i` (1-based) gets `.(i+1)` as its InternalIP.
    pub underlay: Ipv4Net,
    /// Node `i` owns the `i`-th /24 of it (`10.244.1.0/24` for node 1); the gateway is `.1`.
    pub pod_cidr: Ipv4Net,
    /// Routed from the host via node 1 (and inside each node onto `cni0`, so processes in the
    /// node namespace have a route for the proxy's DNAT to act on).
    pub service_cidrs: Vec<Ipv4Net>,
    /// Load-balancer ingress pool, routed like the service CIDRs.
    pub lb_pool: Option<Ipv4Net>,
    /// Where the record of created objects is kept.
    pub data_dir: PathBuf,
    /// How pod traffic crosses nodes (host-gw by default: the nodes share one bridge).
    pub pod_network: PodNetwork,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        Self {
            prefix: "svcnet".into(),
            nodes: 1,
            underlay: Ipv4Net::new(Ipv4Addr::new(172, 30, 0, 0), 24).unwrap_or_default(),
            pod_cidr: Ipv4Net::new(Ipv4Addr::new(10, 244, 0, 0), 16).unwrap_or_default(),
            service_cidrs: vec![Ipv4Net::new(Ipv4Addr::new(10, 96, 0, 0), 12).unwrap_or_default()],
            lb_pool: None,
            data_dir: PathBuf::from("svcnet-data"),
            pod_network: PodNetwork::HostGw,
        }
    }
}

/// A problem with the configuration or the kernel.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("topology config: {field}: {message}")]
    Config {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Ip(#[from] IpError),
    #[error("topology: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("topology: namespace {name} already exists (run `svcnet down` to remove leftovers)")]
    Exists { name: String },
}

/// One node of the topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTopology {
    /// The Kubernetes node name, equal to its namespace name.
    pub name: String,
    pub netns: String,
    /// The address on the underlay (`InternalIP`).
    pub internal_ip: Ipv4Addr,
    /// `spec.podCIDR`.
    pub pod_cidr: Ipv4Net,
    /// `cni0`'s address: the pods' default gateway.
    pub gateway: Ipv4Addr,
    /// The host end of the node's underlay veth.
    pub host_link: String,
    /// The node's interface holding `internal_ip` (its underlay: the VTEP's and host-gw
    /// routes' device). `eth0` in `svcnet up`'s node namespaces; a real node's own elsewhere.
    #[serde(default = "default_underlay_if")]
    pub underlay_if: String,
}

fn default_underlay_if() -> String {
    NODE_UNDERLAY_IF.to_string()
}

/// One step of a plan: plain data, printed as the command it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    AddNetns(String),
    Ip {
        netns: Option<String>,
        args: Vec<String>,
    },
    Sysctl {
        netns: String,
        key: String,
        value: String,
    },
    /// `bridge -n NETNS args...` (FDB entries).
    Bridge {
        netns: String,
        args: Vec<String>,
    },
}

impl Step {
    pub fn ip(netns: Option<&str>, args: &[&str]) -> Self {
        Step::Ip {
            netns: netns.map(str::to_string),
            args: args.iter().map(|s| s.to_string()).collect(),
        }
    }

    pub fn bridge(netns: &str, args: &[&str]) -> Self {
        Step::Bridge {
            netns: netns.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Runs the step (blocking: a short child process).
    pub fn run(&self) -> Result<(), TopologyError> {
        self.apply()
    }

    fn apply(&self) -> Result<(), TopologyError> {
        match self {
            Step::AddNetns(name) => {
                if ip::netns_list()?.contains(name) {
                    return Err(TopologyError::Exists { name: name.clone() });
                }
                ip::ip(None, &["netns", "add", name])?;
                ip::ip(Some(name), &["link", "set", "lo", "up"])?;
            }
            Step::Ip { netns, args } => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ip::ip(netns.as_deref(), &args)?;
            }
            Step::Sysctl { netns, key, value } => {
                let kv = format!("{key}={value}");
                match ip::entered(Some(netns)) {
                    Some(ns) => self.command("ip", &["netns", "exec", ns, "sysctl", "-qw", &kv])?,
                    None => self.command("sysctl", &["-qw", &kv])?,
                }
            }
            Step::Bridge { netns, args } => {
                let mut full = match ip::entered(Some(netns)) {
                    Some(ns) => vec!["-n", ns],
                    None => Vec::new(),
                };
                full.extend(args.iter().map(String::as_str));
                self.command("bridge", &full)?;
            }
        }
        Ok(())
    }

    /// Runs `program args...` for this step; a failure names the step and the stderr.
    fn command(&self, program: &str, args: &[&str]) -> Result<(), TopologyError> {
        let out = Command::new(program)
            .args(args)
            .output()
            .map_err(|e| TopologyError::Io {
                what: format!("{self}"),
                source: e,
            })?;
        if !out.status.success() {
            return Err(IpError::Failed {
                command: self.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().into(),
            }
            .into());
        }
        Ok(())
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::AddNetns(name) => write!(f, "ip netns add {name}"),
            Step::Ip { netns, args } => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                f.write_str(&ip::render(netns.as_deref(), &args))
            }
            Step::Sysctl { netns, key, value } => match ip::entered(Some(netns)) {
                Some(ns) => write!(f, "ip netns exec {ns} sysctl -w {key}={value}"),
                None => write!(f, "sysctl -w {key}={value}"),
            },
            Step::Bridge { netns, args } => match ip::entered(Some(netns)) {
                Some(ns) => write!(f, "bridge -n {ns} {}", args.join(" ")),
                None => write!(f, "bridge {}", args.join(" ")),
            },
        }
    }
}

/// What [`Topology::create`] made, persisted in `<data_dir>/topology.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyRecord {
    pub prefix: String,
    pub bridge: String,
    pub host_ip: Option<Ipv4Addr>,
    pub nodes: Vec<NodeTopology>,
    pub host_links: Vec<String>,
    pub host_routes: Vec<String>,
}

impl TopologyConfig {
    fn validate(&self) -> Result<(), TopologyError> {
        let bad = |field, message: String| Err(TopologyError::Config { field, message });
        if self.prefix.is_empty()
            || self.prefix.len() > 11
            || !self.prefix.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return bad(
                "prefix",
                format!(
                    "{:?} must be 1-11 ASCII letters or digits (link names are limited to 15 characters)",
                    self.prefix
                ),
            );
        }
        if self.nodes == 0 || self.nodes > 100 {
            return bad("nodes", format!("{} must be between 1 and 100", self.nodes));
        }
        if self.underlay.prefix_len() > 29
            || (self.nodes as u64 + 2) >= (1u64 << (32 - self.underlay.prefix_len()))
        {
            return bad(
                "underlay",
                format!(
                    "{} has no room for the host and {} nodes",
                    self.underlay, self.nodes
                ),
            );
        }
        if self.pod_cidr.prefix_len() > 23
            || self.nodes as u64 >= (1u64 << (24 - self.pod_cidr.prefix_len()))
        {
            return bad(
                "podCIDR",
                format!(
                    "{} has no room for {} node /24s (node i gets the i-th /24)",
                    self.pod_cidr, self.nodes
                ),
            );
        }
        Ok(())
    }

    /// The nodes this config describes (pure).
    pub fn nodes(&self) -> Result<Vec<NodeTopology>, TopologyError> {
        self.validate()?;
        let base = u32::from(self.underlay.network());
        let pods = u32::from(self.pod_cidr.network());
        (1..=self.nodes)
            .map(|i| {
                let i32_ = i as u32;
                let pod_net = Ipv4Addr::from(pods + (i32_ << 8));
                let pod_cidr = Ipv4Net::new(pod_net, 24).map_err(|e| TopologyError::Config {
                    field: "podCIDR",
                    message: e.to_string(),
                })?;
                let name = format!("{}-node{i}", self.prefix);
                Ok(NodeTopology {
                    netns: name.clone(),
                    name,
                    internal_ip: Ipv4Addr::from(base + 1 + i32_),
                    gateway: Ipv4Addr::from(pods + (i32_ << 8) + 1),
                    pod_cidr,
                    host_link: format!("{}n{i}", self.prefix),
                    underlay_if: NODE_UNDERLAY_IF.to_string(),
                })
            })
            .collect()
    }

    pub fn bridge(&self) -> String {
        format!("{}0", self.prefix)
    }

    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.underlay.network()) + 1)
    }
}

/// The record of what the plan creates (written before it runs).
pub fn record_for(config: &TopologyConfig) -> Result<TopologyRecord, TopologyError> {
    let nodes = config.nodes()?;
    let first = nodes
        .first()
        .map(|n| n.internal_ip.to_string())
        .unwrap_or_default();
    let mut host_routes: Vec<String> = nodes
        .iter()
        .map(|n| format!("{} via {}", n.pod_cidr, n.internal_ip))
        .collect();
    for cidr in config.service_cidrs.iter().chain(config.lb_pool.iter()) {
        host_routes.push(format!("{cidr} via {first}"));
    }
    Ok(TopologyRecord {
        prefix: config.prefix.clone(),
        bridge: config.bridge(),
        host_ip: Some(config.host_ip()),
        host_links: std::iter::once(config.bridge())
            .chain(nodes.iter().map(|n| n.host_link.clone()))
            .collect(),
        nodes,
        host_routes,
    })
}

/// The steps that build the topology (pure).
pub fn plan_create(
    config: &TopologyConfig,
    backend: &dyn PodRouteBackend,
) -> Result<Vec<Step>, TopologyError> {
    let nodes = config.nodes()?;
    let bridge = config.bridge();
    let len = config.underlay.prefix_len().to_string();
    let host_cidr = format!("{}/{len}", config.host_ip());
    let mut steps = vec![
        Step::ip(None, &["link", "add", &bridge, "type", "bridge"]),
        Step::ip(None, &["addr", "add", &host_cidr, "dev", &bridge]),
        Step::ip(None, &["link", "set", &bridge, "up"]),
    ];
    for node in &nodes {
        let ns = Some(node.netns.as_str());
        steps.push(Step::AddNetns(node.netns.clone()));
        steps.push(Step::Sysctl {
            netns: node.netns.clone(),
            key: "net.ipv4.ip_forward".into(),
            value: "1".into(),
        });
        steps.push(Step::ip(
            None,
            &[
                "link",
                "add",
                &node.host_link,
                "type",
                "veth",
                "peer",
                "name",
                NODE_UNDERLAY_IF,
                "netns",
                &node.netns,
            ],
        ));
        steps.push(Step::ip(
            None,
            &["link", "set", &node.host_link, "master", &bridge, "up"],
        ));
        steps.push(Step::ip(
            ns,
            &[
                "addr",
                "add",
                &format!("{}/{len}", node.internal_ip),
                "dev",
                NODE_UNDERLAY_IF,
            ],
        ));
        steps.push(Step::ip(ns, &["link", "set", NODE_UNDERLAY_IF, "up"]));
        steps.push(Step::ip(ns, &["link", "add", POD_BRIDGE, "type", "bridge"]));
        steps.push(Step::ip(
            ns,
            &[
                "addr",
                "add",
                &format!("{}/24", node.gateway),
                "dev",
                POD_BRIDGE,
            ],
        ));
        steps.push(Step::ip(ns, &["link", "set", POD_BRIDGE, "up"]));
        for cidr in config.service_cidrs.iter().chain(config.lb_pool.iter()) {
            steps.push(Step::ip(
                ns,
                &["route", "add", &cidr.to_string(), "dev", POD_BRIDGE],
            ));
        }
    }
    for node in &nodes {
        let peers: Vec<&NodeTopology> = nodes.iter().filter(|p| p.name != node.name).collect();
        steps.extend(backend.node_steps(node, &peers));
    }
    for node in &nodes {
        steps.push(Step::ip(
            None,
            &[
                "route",
                "add",
                &node.pod_cidr.to_string(),
                "via",
                &node.internal_ip.to_string(),
                "dev",
                &bridge,
            ],
        ));
    }
    if let Some(first) = nodes.first() {
        for cidr in config.service_cidrs.iter().chain(config.lb_pool.iter()) {
            steps.push(Step::ip(
                None,
                &[
                    "route",
                    "add",
                    &cidr.to_string(),
                    "via",
                    &first.internal_ip.to_string(),
                    "dev",
                    &bridge,
                ],
            ));
        }
    }
    Ok(steps)
}

/// A created topology; destroyed by [`Topology::destroy`] or on drop.
#[derive(Debug)]
pub struct Topology {
    config: TopologyConfig,
    record: TopologyRecord,
    backend: &'static str,
    destroyed: bool,
}

impl Topology {
    /// Builds the topology with the config's pod network. On failure everything created so
    /// far is removed.
    pub fn create(config: TopologyConfig) -> Result<Self, TopologyError> {
        let backend = config.pod_network.backend();
        Self::create_with(config, backend)
    }

    pub fn create_with(
        config: TopologyConfig,
        backend: &dyn PodRouteBackend,
    ) -> Result<Self, TopologyError> {
        let record = record_for(&config)?;
        let steps = plan_create(&config, backend)?;
        if ip::link_names(None)?.contains(&record.bridge) {
            return Err(TopologyError::Exists {
                name: record.bridge.clone(),
            });
        }
        write_record(&config.data_dir, &record)?;
        let topo = Topology {
            config,
            record,
            backend: backend.name(),
            destroyed: false,
        };
        for step in &steps {
            tracing::debug!(%step, "topology");
            // On error `topo` is dropped, which removes everything recorded.
            step.apply()?;
        }
        tracing::info!(nodes = topo.record.nodes.len(), bridge = %topo.record.bridge, backend = topo.backend, "topology created");
        Ok(topo)
    }

    pub fn nodes(&self) -> &[NodeTopology] {
        &self.record.nodes
    }

    pub fn node(&self, name: &str) -> Option<&NodeTopology> {
        self.record.nodes.iter().find(|n| n.name == name)
    }

    pub fn config(&self) -> &TopologyConfig {
        &self.config
    }

    /// The host's address on the underlay, reachable from every node and pod (serve cluster
    /// DNS here so the `kube-dns` endpoints can point at it).
    pub fn host_ip(&self) -> Ipv4Addr {
        self.config.host_ip()
    }

    pub fn bridge(&self) -> &str {
        &self.record.bridge
    }

    /// Removes every namespace (killing the processes inside), link and route.
    pub fn destroy(mut self) -> Result<CleanupReport, TopologyError> {
        self.destroyed = true;
        cleanup(&self.config.data_dir, &self.config.prefix)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if !self.destroyed
            && let Err(e) = cleanup(&self.config.data_dir, &self.config.prefix)
        {
            tracing::warn!("topology cleanup: {e}");
        }
    }
}

fn write_record(data_dir: &Path, record: &TopologyRecord) -> Result<(), TopologyError> {
    let io = |what: &str, source| TopologyError::Io {
        what: format!("{what} {}", data_dir.display()),
        source,
    };
    std::fs::create_dir_all(data_dir).map_err(|e| io("create", e))?;
    let json = serde_json::to_vec_pretty(record).map_err(|e| io("encode record", e.into()))?;
    let tmp = data_dir.join(format!("{RECORD_FILE}.tmp"));
    std::fs::write(&tmp, json).map_err(|e| io("write record in", e))?;
    std::fs::rename(&tmp, data_dir.join(RECORD_FILE)).map_err(|e| io("rename record in", e))
}

/// What [`cleanup`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CleanupReport {
    pub killed: Vec<u32>,
    pub namespaces: Vec<String>,
    pub links: Vec<String>,
    pub routes: Vec<String>,
}

impl fmt::Display for CleanupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "removed {} namespaces, {} links, {} routes; killed {} processes",
            self.namespaces.len(),
            self.links.len(),
            self.routes.len(),
            self.killed.len()
        )
    }
}

/// Whether `link` is a host link svcnet created under `prefix` (`<prefix>0`, `<prefix>n<i>`).
fn is_our_link(prefix: &str, link: &str) -> bool {
    match link.strip_prefix(prefix) {
        Some("0") => true,
        Some(rest) => rest
            .strip_prefix('n')
            .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit())),
        None => false,
    }
}

/// Removes everything a topology (and the pods on it) created under `prefix`: processes in
/// and namespaces named `<prefix>-*`, the recorded routes, links `<prefix>0`/`<prefix>n<i>`,
/// and the record. Safe to run any number of times, also after a crash.
pub fn cleanup(data_dir: &Path, prefix: &str) -> Result<CleanupReport, TopologyError> {
    let mut report = CleanupReport::default();
    let record: Option<TopologyRecord> = std::fs::read(data_dir.join(RECORD_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|r: &TopologyRecord| r.prefix == prefix);
    let ns_prefix = format!("{prefix}-");
    let mut namespaces: Vec<String> = ip::netns_list()?
        .into_iter()
        .filter(|n| n.starts_with(&ns_prefix))
        .collect();
    // Pods first, then nodes, so every pod veth disappears with its own namespace.
    namespaces.sort_by_key(|n| (n.contains("-node"), n.clone()));
    for ns in &namespaces {
        for pid in ip::netns_pids(ns).unwrap_or_default() {
            if svcnet_netns::sandbox::kill_process(pid).is_ok() {
                report.killed.push(pid);
            }
        }
        ip::ip_del(None, &["netns", "del", ns])?;
        report.namespaces.push(ns.clone());
    }
    let bridge = format!("{prefix}0");
    if let Some(rec) = &record {
        for route in &rec.host_routes {
            let dst = route.split_whitespace().next().unwrap_or_default();
            let present = ip::ip(None, &["route", "show", "exact", dst])
                .map(|o| o.contains(&format!("dev {bridge}")))
                .unwrap_or(false);
            if present {
                ip::ip_del(None, &["route", "del", dst, "dev", &bridge])?;
                report.routes.push(route.clone());
            }
        }
    }
    let mut links: Vec<String> = ip::link_names(None)?
        .into_iter()
        .filter(|l| is_our_link(prefix, l))
        .collect();
    // Veths before the bridge.
    links.sort_by_key(|l| (l == &bridge, l.clone()));
    for link in links {
        ip::ip_del(None, &["link", "del", &link])?;
        report.links.push(link);
    }
    match std::fs::remove_file(data_dir.join(RECORD_FILE)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(TopologyError::Io {
                what: format!("remove {}", data_dir.join(RECORD_FILE).display()),
                source: e,
            });
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::{HostGw, Vxlan};
    use expect_test::expect;

    fn config() -> TopologyConfig {
        TopologyConfig {
            nodes: 2,
            lb_pool: Some("172.30.1.0/28".parse().unwrap()),
            ..TopologyConfig::default()
        }
    }

    #[test]
    fn plan_two_nodes() {
        let steps = plan_create(&config(), &HostGw).unwrap();
        let text: String = steps.iter().map(|s| format!("{s}\n")).collect();
        expect![[r#"
            ip link add svcnet0 type bridge
            ip addr add 172.30.0.1/24 dev svcnet0
            ip link set svcnet0 up
            ip netns add svcnet-node1
            ip netns exec svcnet-node1 sysctl -w net.ipv4.ip_forward=1
            ip link add svcnetn1 type veth peer name eth0 netns svcnet-node1
            ip link set svcnetn1 master svcnet0 up
            ip -n svcnet-node1 addr add 172.30.0.2/24 dev eth0
            ip -n svcnet-node1 link set eth0 up
            ip -n svcnet-node1 link add cni0 type bridge
            ip -n svcnet-node1 addr add 10.244.1.1/24 dev cni0
            ip -n svcnet-node1 link set cni0 up
            ip -n svcnet-node1 route add 10.96.0.0/12 dev cni0
            ip -n svcnet-node1 route add 172.30.1.0/28 dev cni0
            ip netns add svcnet-node2
            ip netns exec svcnet-node2 sysctl -w net.ipv4.ip_forward=1
            ip link add svcnetn2 type veth peer name eth0 netns svcnet-node2
            ip link set svcnetn2 master svcnet0 up
            ip -n svcnet-node2 addr add 172.30.0.3/24 dev eth0
            ip -n svcnet-node2 link set eth0 up
            ip -n svcnet-node2 link add cni0 type bridge
            ip -n svcnet-node2 addr add 10.244.2.1/24 dev cni0
            ip -n svcnet-node2 link set cni0 up
            ip -n svcnet-node2 route add 10.96.0.0/12 dev cni0
            ip -n svcnet-node2 route add 172.30.1.0/28 dev cni0
            ip -n svcnet-node1 route add 10.244.2.0/24 via 172.30.0.3 dev eth0
            ip -n svcnet-node2 route add 10.244.1.0/24 via 172.30.0.2 dev eth0
            ip route add 10.244.1.0/24 via 172.30.0.2 dev svcnet0
            ip route add 10.244.2.0/24 via 172.30.0.3 dev svcnet0
            ip route add 10.96.0.0/12 via 172.30.0.2 dev svcnet0
            ip route add 172.30.1.0/28 via 172.30.0.2 dev svcnet0
        "#]]
        .assert_eq(&text);
    }

    #[test]
    fn plan_vxlan_makes_flannels_vtep_and_no_host_gw_routes() {
        let config = TopologyConfig {
            nodes: 3,
            ..TopologyConfig::default()
        };
        let steps = plan_create(&config, &Vxlan).unwrap();
        let text: String = steps
            .iter()
            .map(|s| s.to_string())
            .filter(|s| s.contains("svcnet-node1 ") && s.contains("flannel.1"))
            .map(|s| format!("{s}\n"))
            .collect();
        expect![[r#"
            ip -n svcnet-node1 link add flannel.1 address 0e:f1:ac:1e:00:02 mtu 1450 type vxlan id 1 local 172.30.0.2 dev eth0 nolearning dstport 8472
            ip -n svcnet-node1 addr add 10.244.1.0/32 dev flannel.1
            ip -n svcnet-node1 link set flannel.1 up
        "#]].assert_eq(&text);
        assert!(
            !steps
                .iter()
                .any(|s| s.to_string().contains("via 172.30.0.")
                    && s.to_string().starts_with("ip -n")),
            "vxlan installs no host-gw route in a node"
        );
    }

    #[test]
    fn bad_configs_name_the_field() {
        let long = TopologyConfig {
            prefix: "averyverylongprefix".into(),
            ..TopologyConfig::default()
        };
        assert!(long.nodes().unwrap_err().to_string().contains("prefix"));
        let many = TopologyConfig {
            nodes: 300,
            ..TopologyConfig::default()
        };
        assert!(many.nodes().unwrap_err().to_string().contains("nodes"));
        let small = TopologyConfig {
            pod_cidr: "10.244.0.0/24".parse().unwrap(),
            ..TopologyConfig::default()
        };
        assert!(small.nodes().unwrap_err().to_string().contains("podCIDR"));
    }

    #[test]
    fn only_our_links_match() {
        assert!(is_our_link("svcnet", "svcnet0"));
        assert!(is_our_link("svcnet", "svcnetn12"));
        assert!(!is_our_link("svcnet", "svcnetn"));
        assert!(!is_our_link("svcnet", "svcnet1"));
        assert!(!is_our_link("svcnet", "eth0"));
        assert!(!is_our_link("svcnet", "svcnetnx"));
    }
}
