//! Node proxy runtime (`svcnet proxy`, and the proxy inside `svcnet up`).
//!
//! The I/O around the pure core: kube-rs watchers for Services, EndpointSlices and this Node
//! ([`watchers`]) feed `svcnet_proxy::ProxyState`; a rate-limited sync loop ([`sync`]) renders
//! the desired state with a dataplane and applies it (full syncs first, after failures and
//! every `sync_period`; partial syncs otherwise), deletes stale UDP conntrack entries, and
//! publishes health and Prometheus metrics ([`serve`]). Policy lives in the core, rendering in
//! the dataplane crates; this crate only moves data between them.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use svcnet_nft::{Family, NftExecutor};
use svcnet_proxy::CoreConfig;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

pub mod healthcheck;
pub mod serve;
mod sync;
pub mod watchers;

/// Which dataplane programs the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    #[default]
    Nftables,
    Iptables,
    Userspace,
}

impl std::str::FromStr for ProxyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nftables" => Ok(Self::Nftables),
            "iptables" => Ok(Self::Iptables),
            "userspace" => Ok(Self::Userspace),
            other => Err(format!(
                "unknown proxy mode {other:?} (nftables, iptables, userspace)"
            )),
        }
    }
}

/// Everything the proxy runtime needs.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// This node's name (endpoint locality, topology, the Node watch).
    pub node_name: String,
    pub mode: ProxyMode,
    /// Program this named network namespace instead of the current one.
    pub netns: Option<String>,
    /// Changes are batched: at most one sync per `min_sync_period`.
    pub min_sync_period: Duration,
    /// A full re-assert of the ruleset every `sync_period` repairs drift.
    pub sync_period: Duration,
    pub masquerade_all: bool,
    pub cluster_cidrs: Vec<IpNet>,
    pub service_cidrs: Vec<IpNet>,
    pub nodeport_addresses: Vec<IpNet>,
    /// `/healthz` and `/livez` (`None`: off).
    pub healthz_bind: Option<SocketAddr>,
    /// `/metrics` (`None`: off).
    pub metrics_bind: Option<SocketAddr>,
    /// The nft table name (`svcnet`; tests may pick another).
    pub table: String,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        let core = CoreConfig::default();
        Self {
            node_name: String::new(),
            mode: ProxyMode::Nftables,
            netns: None,
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            masquerade_all: false,
            cluster_cidrs: Vec::new(),
            service_cidrs: core.service_cidrs,
            nodeport_addresses: Vec::new(),
            healthz_bind: None,
            metrics_bind: None,
            table: svcnet_nft::names::TABLE.to_string(),
        }
    }
}

impl ProxyConfig {
    /// The pure core's part of the configuration.
    pub fn core(&self) -> CoreConfig {
        CoreConfig {
            node_name: self.node_name.clone(),
            masquerade_all: self.masquerade_all,
            cluster_cidrs: self.cluster_cidrs.clone(),
            service_cidrs: self.service_cidrs.clone(),
            nodeport_addresses: self.nodeport_addresses.clone(),
            ..CoreConfig::default()
        }
    }
}

/// Why the proxy could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("--node-name is required")]
    NoNodeName,
    #[error("proxy mode {0:?} is not available in this build yet; use nftables")]
    ModeUnavailable(ProxyMode),
    #[error(
        "network namespace {name:?} does not exist (create it first, e.g. `ip netns add {name}`)"
    )]
    NoSuchNetns { name: String },
    #[error("the nftables dataplane cannot run: {0}")]
    Nft(#[from] svcnet_nft::ApplyError),
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Counters a caller (or test) can watch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub syncs: u64,
    pub full_syncs: u64,
    pub failures: u64,
    /// Service ports programmed, summed over both families.
    pub service_ports: usize,
}

/// A running proxy.
pub struct RunningProxy {
    tasks: JoinSet<()>,
    stop: watch::Sender<bool>,
    stats: watch::Receiver<SyncStats>,
    healthz: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
}

impl RunningProxy {
    /// Sync counters, updated after every sync.
    pub fn stats(&self) -> watch::Receiver<SyncStats> {
        self.stats.clone()
    }
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz
    }
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
    }
    /// Stops watching and syncing. The rules stay in place (a restarted proxy takes over).
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        self.tasks.shutdown().await;
    }
}

fn check(cfg: &ProxyConfig) -> Result<(), ProxyError> {
    if cfg.node_name.is_empty() {
        return Err(ProxyError::NoNodeName);
    }
    if cfg.mode != ProxyMode::Nftables {
        return Err(ProxyError::ModeUnavailable(cfg.mode));
    }
    if let Some(name) = &cfg.netns
        && svcnet_netns::NetNs::open(name).is_err()
    {
        return Err(ProxyError::NoSuchNetns { name: name.clone() });
    }
    NftExecutor::new(cfg.netns.clone()).check()?;
    Ok(())
}

/// Starts the proxy: watchers, sync loop and HTTP servers; returns once they are running.
pub async fn start(cfg: ProxyConfig, client: kube::Client) -> Result<RunningProxy, ProxyError> {
    check(&cfg)?;
    let mut tasks = JoinSet::new();
    let shared = serve::Shared {
        health: Arc::new(Mutex::new(serve::Health {
            last_updated: None,
            queued_since: None,
            node_eligible: true,
            timeout: (cfg.sync_period * 2).max(Duration::from_secs(10)),
        })),
        metrics: Arc::new(serve::Metrics::default()),
    };
    // One server for both when they name the same fixed address.
    let shared_addr = cfg
        .healthz_bind
        .filter(|a| a.port() != 0 && cfg.metrics_bind == Some(*a));
    let mut healthz = None;
    if let Some(addr) = cfg.healthz_bind {
        let with_metrics = shared_addr.is_some();
        let bound = serve::serve(addr, shared.clone(), with_metrics, &mut tasks)
            .await
            .map_err(|source| ProxyError::Bind {
                what: "healthz",
                addr,
                source,
            })?;
        healthz = Some(bound);
    }
    let mut metrics = shared_addr.and(healthz);
    if let Some(addr) = cfg.metrics_bind.filter(|_| shared_addr.is_none()) {
        let bound = serve::serve(addr, shared.clone(), true, &mut tasks)
            .await
            .map_err(|source| ProxyError::Bind {
                what: "metrics",
                addr,
                source,
            })?;
        metrics = Some(bound);
    }
    let (tx, rx) = mpsc::channel(1024);
    let (hc_tx, hc_rx) = watch::channel(Vec::new());
    tasks.spawn(healthcheck::run(
        healthcheck::HealthCheckServers::new(
            &cfg.node_name,
            cfg.netns.clone(),
            shared.health.clone(),
        ),
        hc_rx,
        shared.metrics.clone(),
        Some(kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "svcnet-proxy".into(),
                instance: Some(cfg.node_name.clone()),
            },
        )),
    ));
    watchers::spawn_watchers(client, &cfg.node_name, tx, &mut tasks);
    let (stop, stop_rx) = watch::channel(false);
    let (stats_tx, stats) = watch::channel(SyncStats::default());
    tracing::info!(node = %cfg.node_name, netns = ?cfg.netns, "node proxy starting (nftables)");
    tasks.spawn(
        sync::SyncLoop::new(cfg, shared, stats_tx)
            .with_health_checks(hc_tx)
            .run(rx, stop_rx),
    );
    Ok(RunningProxy {
        tasks,
        stop,
        stats,
        healthz,
        metrics,
    })
}

/// Runs the proxy until `shutdown` completes.
pub async fn run(
    cfg: ProxyConfig,
    client: kube::Client,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ProxyError> {
    let running = start(cfg, client).await?;
    shutdown.await;
    running.shutdown().await;
    Ok(())
}

/// `--cleanup`: removes everything svcnet's proxy installed (its tables, both families).
/// Returns how many tables existed.
pub fn cleanup(netns: Option<&str>, table: &str) -> Result<usize, ProxyError> {
    let exec = NftExecutor::new(netns.map(str::to_string));
    let mut removed = 0;
    for family in [Family::Ip, Family::Ip6] {
        if exec.delete_table(family, table)? {
            removed += 1;
        }
    }
    Ok(removed)
}
