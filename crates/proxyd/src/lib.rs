//! Node proxy runtime (`svcnet proxy`, and the proxy inside `svcnet up`).
//!
//! The I/O around the pure core: kube-rs watchers for Services, EndpointSlices and this Node
//! ([`watchers`]) feed `svcnet_proxy::ProxyState`; a rate-limited sync loop ([`sync`]) renders
//! the desired state with a dataplane and applies it (full syncs first, after failures and
//! every `sync_period`; partial syncs otherwise), deletes stale UDP conntrack entries, keeps
//! the health-check node ports, and publishes health and Prometheus metrics ([`serve`]).
//! Policy lives in the core, rendering in the dataplane crates; this crate only moves data
//! between them.
//!
//! Modes ([`ProxyMode`], [`dataplane`]): `nftables` (default; `svcnet-nft`, one `svcnet` table
//! per family), `iptables` (`svcnet-iptables`, `SVCNET-` chains through `iptables-restore
//! --noflush` on the host's back end, with its canary-triggered full resync) and `userspace`
//! (`svcnet-userspace` in privileged mode: the proxy accepts every service connection itself,
//! retrying another endpoint on connect failure; its per-service and per-endpoint counters are
//! on `/metrics`, see [`usmetrics`]). Switching modes is live: a proxy starting in one mode
//! leaves the other modes' rules in the namespace (a previous proxy's, still serving) until its
//! own first sync has installed its rules, then removes them (`SyncStats::retired`), so no new
//! connection finds no rules and established ones keep their conntrack entries; [`cleanup`]
//! removes all three.
//!
//! Load-balancing algorithms: per service (`svcnet.io/lb-algorithm`) or proxy-wide
//! ([`ProxyConfig::scheduler`], `--scheduler`). An algorithm the dataplane cannot express
//! falls back to random and a misspelt annotation to the proxy-wide choice; both are logged
//! and recorded as a Warning Event on the Service, once per service and change ([`report`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use svcnet_proxy::CoreConfig;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

pub mod dataplane;
pub mod foreign;
pub mod healthcheck;
pub mod pacing;
pub mod report;
pub mod serve;
pub mod status;
mod sync;
pub mod syncer;
pub mod usmetrics;
pub mod watchers;

pub use dataplane::Cleaned;
pub use pacing::MinSyncPeriod;
pub use svcnet_lb::Algorithm;

/// Which dataplane programs the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    #[default]
    Nftables,
    Iptables,
    Userspace,
    /// Linux IPVS (kube-proxy's IPVS mode): needs a kernel with `ip_vs`.
    Ipvs,
}

impl ProxyMode {
    /// The name `--proxy-mode` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nftables => "nftables",
            Self::Iptables => "iptables",
            Self::Userspace => "userspace",
            Self::Ipvs => "ipvs",
        }
    }
}

impl std::str::FromStr for ProxyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nftables" => Ok(Self::Nftables),
            "iptables" => Ok(Self::Iptables),
            "userspace" => Ok(Self::Userspace),
            "ipvs" => Ok(Self::Ipvs),
            other => Err(format!(
                "unknown proxy mode {other:?} (nftables, iptables, userspace, ipvs)"
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
    /// How long changes are batched after a sync (see [`pacing`]).
    pub min_sync_period: MinSyncPeriod,
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
    /// Proxy-wide load-balancing algorithm for services without the `svcnet.io/lb-algorithm`
    /// annotation (`--scheduler`, like kube-proxy's `--ipvs-scheduler`); `None`: the
    /// dataplane's default (random in the kernel modes, rr in userspace).
    pub scheduler: Option<svcnet_lb::Algorithm>,
    /// Userspace mode only: bind every frontend directly instead of redirecting with kernel
    /// rules, so no root is needed (service CIDR on loopback, e.g. 127.96.0.0/16; node ports on
    /// `nodeport_addresses`, default 127.0.0.1). Ports below 1024 still need the capability.
    pub unprivileged: bool,
    /// IPVS mode only: kube-proxy's node-wide IPVS settings (timeouts, strict ARP).
    pub ipvs: svcnet_ipvs::NodeOptions,
    /// Userspace mode only: judges each connection before the proxy relays it (NetworkPolicy
    /// under `svcnet up`, whose policy table leaves the proxy's connections to it).
    pub admission: Option<Arc<dyn svcnet_userspace::Admission>>,
    /// Userspace mode only: where upstream connections into the pod network leave from.
    pub upstream_source: Option<svcnet_userspace::UpstreamSource>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        let core = CoreConfig::default();
        Self {
            node_name: String::new(),
            mode: ProxyMode::Nftables,
            netns: None,
            min_sync_period: MinSyncPeriod::Auto,
            sync_period: Duration::from_secs(30),
            masquerade_all: false,
            cluster_cidrs: Vec::new(),
            service_cidrs: core.service_cidrs,
            nodeport_addresses: Vec::new(),
            healthz_bind: None,
            metrics_bind: None,
            table: svcnet_nft::names::TABLE.to_string(),
            scheduler: None,
            unprivileged: false,
            ipvs: svcnet_ipvs::NodeOptions::default(),
            admission: None,
            upstream_source: None,
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
            scheduler: self.scheduler,
        }
    }
}

/// Why the proxy could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("--node-name is required")]
    NoNodeName,
    #[error(
        "network namespace {name:?} does not exist (create it first, e.g. `ip netns add {name}`)"
    )]
    NoSuchNetns { name: String },
    #[error("the nftables dataplane cannot run: {0}")]
    Nft(#[from] svcnet_nft::ApplyError),
    #[error("the iptables dataplane cannot run: {0}")]
    Iptables(#[from] svcnet_iptables::ApplyError),
    #[error("the userspace dataplane cannot run: {0}")]
    Userspace(#[from] svcnet_userspace::UserspaceError),
    #[error("the ipvs dataplane cannot run: {0}")]
    Ipvs(#[from] svcnet_ipvs::SyncError),
    #[error("a proxy setup task failed: {0}")]
    Task(String),
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
    /// The other modes' rules were removed, after this mode's first successful sync.
    pub retired: bool,
}

/// A running proxy.
pub struct RunningProxy {
    tasks: JoinSet<()>,
    /// The sync loop, awaited on shutdown so the dataplane stops cleanly.
    sync: tokio::task::JoinHandle<()>,
    /// The status lease's writer, awaited on shutdown so the lease says the proxy stopped.
    status: tokio::task::JoinHandle<()>,
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
        // The sync loop stops the dataplane, which may drain (userspace).
        let bound = Duration::from_secs(10) + dataplane::USERSPACE_DRAIN;
        if tokio::time::timeout(bound, &mut self.sync).await.is_err() {
            self.sync.abort();
        }
        if tokio::time::timeout(Duration::from_secs(3), &mut self.status)
            .await
            .is_err()
        {
            self.status.abort();
        }
        self.tasks.shutdown().await;
    }
}

fn check(cfg: &ProxyConfig) -> Result<(), ProxyError> {
    if cfg.node_name.is_empty() {
        return Err(ProxyError::NoNodeName);
    }
    if let Some(name) = &cfg.netns
        && svcnet_netns::NetNs::open(name).is_err()
    {
        return Err(ProxyError::NoSuchNetns { name: name.clone() });
    }
    Ok(())
}

/// Starts the proxy: watchers, sync loop and HTTP servers; returns once they are running.
pub async fn start(cfg: ProxyConfig, client: kube::Client) -> Result<RunningProxy, ProxyError> {
    check(&cfg)?;
    let plane = dataplane::Plane::new(&cfg).await?;
    let mut metrics = serve::Metrics::default();
    if let Some(p) = plane.userspace() {
        metrics
            .registry
            .register_collector(Box::new(usmetrics::UserspaceCollector(p)));
    }
    let mut tasks = JoinSet::new();
    if let Some(exec) = plane.nft_executor() {
        // Beside the first sync (they take turns on the context), not before it.
        let table = cfg.table.clone();
        tasks.spawn(async move { warn_foreign_chains(exec, &table).await });
    }
    if let Some(p) = plane.userspace() {
        tasks.spawn(retry_unbound(p));
    }
    let shared = serve::Shared {
        userspace: plane.userspace(),
        health: Arc::new(Mutex::new(serve::Health {
            last_updated: None,
            queued_since: None,
            node_eligible: true,
            timeout: (cfg.sync_period * 2).max(Duration::from_secs(10)),
        })),
        metrics: Arc::new(metrics),
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
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "svcnet-proxy".into(),
            instance: Some(cfg.node_name.clone()),
        },
    );
    tasks.spawn(healthcheck::run(
        healthcheck::HealthCheckServers::new(
            &cfg.node_name,
            cfg.netns.clone(),
            shared.health.clone(),
        ),
        hc_rx,
        shared.metrics.clone(),
        Some(recorder.clone()),
    ));
    let (notice_tx, notice_rx) = mpsc::unbounded_channel();
    tasks.spawn(report::publish(notice_rx, Some(recorder)));
    let (status_tx, status_rx) = watch::channel(svcnet_proxy::status::ProxyStatus {
        node: cfg.node_name.clone(),
        mode: cfg.mode.as_str().into(),
        duration_seconds: svcnet_proxy::status::DURATION_SECONDS,
        ..Default::default()
    });
    let status = tokio::spawn(status::publish(client.clone(), status_rx));
    watchers::spawn_watchers(client, &cfg.node_name, tx, &mut tasks);
    let (stop, stop_rx) = watch::channel(false);
    let (stats_tx, stats) = watch::channel(SyncStats::default());
    tracing::info!(node = %cfg.node_name, netns = ?cfg.netns, mode = ?cfg.mode, scheduler = ?cfg.scheduler, "node proxy starting");
    // Switching modes live: the other modes' rules in this namespace (a previous proxy's)
    // keep serving until this mode's first sync has installed its own, then they go. An
    // unprivileged proxy installs no rules and may not read them.
    let retire_others = !cfg.unprivileged;
    let sync = tokio::spawn(
        sync::SyncLoop::new(cfg, plane, shared, stats_tx)
            .retiring_other_modes(retire_others)
            .with_health_checks(hc_tx)
            .with_notices(notice_tx)
            .with_status(status_tx)
            .run(rx, stop_rx),
    );
    Ok(RunningProxy {
        tasks,
        sync,
        status,
        stop,
        stats,
        healthz,
        metrics,
    })
}

/// nftables mode: warns once when other software's chains in the namespace slow every commit
/// (see [`foreign`]).
async fn warn_foreign_chains(exec: svcnet_nft::NftExecutor, table: &str) {
    let own = foreign::own_tables(table);
    match tokio::task::spawn_blocking(move || foreign::check(&exec, &own)).await {
        Ok(Ok(found)) => match foreign::warning(&found, foreign::WARN_ABOVE) {
            Some(w) => tracing::warn!(foreign_chains = found.total, "{w}"),
            None => tracing::debug!(
                foreign_chains = found.total,
                "other software's nftables chains"
            ),
        },
        Ok(Err(e)) => tracing::debug!("counting other software's nftables chains: {e}"),
        Err(e) => tracing::debug!("counting other software's nftables chains: {e}"),
    }
}

/// Userspace mode: tries the frontends that could not be bound again as their back-off
/// passes (a port freed, a capability granted), without waiting for a change or resync.
async fn retry_unbound(proxy: Arc<svcnet_userspace::UserspaceProxy>) {
    loop {
        let wait = match proxy.retry_unbound().await {
            Ok(next) => next.unwrap_or(Duration::from_secs(1)),
            Err(e) => {
                tracing::warn!("retrying unbound frontends: {e}");
                Duration::from_secs(5)
            }
        };
        tokio::time::sleep(wait.clamp(Duration::from_millis(50), Duration::from_secs(1))).await;
    }
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

/// `--cleanup`: removes everything svcnet's proxy installed in the current or the named
/// network namespace, whatever the mode: the nft `table` (both families), the iptables
/// `SVCNET-` chains and hooks (both back ends, both families) and the userspace proxy's
/// `svcnet-userspace` tables. Blocking (runs the tools).
pub fn cleanup(netns: Option<&str>, table: &str) -> Result<Cleaned, ProxyError> {
    dataplane::cleanup_modes(netns, table, None, true)
}
