//! `svcnet proxy`: the node proxy (kube-proxy's job) for one node against any API server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ipnet::IpNet;
use svcnet_proxyd::{ProxyConfig, ProxyMode};

/// Flags of `svcnet proxy` (in the spirit of kube-proxy's).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// kube-proxy's configuration file (`KubeProxyConfiguration`, YAML or JSON, as a
    /// kube-proxy DaemonSet's ConfigMap holds it): its values fill the flags not given on the
    /// command line.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Kubeconfig of the API server; without it, in-cluster config or $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Name of this node (endpoint locality, topology hints, traffic policies);
    /// `--hostname-override` is kube-proxy's name for it.
    #[arg(long, env = "NODE_NAME", alias = "hostname-override")]
    pub node_name: Option<String>,
    /// Dataplane: nftables (verdict maps), iptables (SVCNET- chains via iptables-restore on the
    /// host's back end), userspace (the proxy relays each connection, retrying endpoints) or
    /// ipvs (IPVS virtual servers over generic netlink, with ipsets and iptables companion
    /// rules; needs a kernel with ip_vs). Starting in one mode removes the other modes' rules.
    #[arg(long, default_value = "nftables")]
    pub mode: ProxyMode,
    /// Load-balancing algorithm for services without a `svcnet.io/lb-algorithm` annotation
    /// (like kube-proxy's --ipvs-scheduler): rr, wrr, random, lc, sed, nq, sh, dh, maglev.
    /// Default: random in nftables and iptables, rr in userspace and ipvs. An algorithm the
    /// dataplane cannot express (lc/sed/nq in nftables) falls back to random (ipvs: random
    /// falls back to rr) with a warning and a Service Event.
    #[arg(long)]
    pub scheduler: Option<svcnet_proxyd::Algorithm>,
    /// With `--mode userspace`: bind every frontend directly instead of redirecting with kernel
    /// rules, so no root is needed (use a loopback service CIDR such as 127.96.0.0/16).
    #[arg(long)]
    pub unprivileged: bool,
    /// Program this named network namespace instead of the current one.
    #[arg(long)]
    pub netns: Option<String>,
    #[command(flatten)]
    pub ipvs: IpvsFlags,
    /// How long changes are batched after a sync. `auto`: nine times the last sync's duration,
    /// at most 1s (syncs take at most a tenth of a core; a millisecond sync holds the next
    /// change 9ms). A duration (1s, 500ms, 0s): kube-proxy's fixed minimum between syncs, with
    /// its burst of two.
    #[arg(long, default_value = "auto")]
    pub min_sync_period: svcnet_proxyd::MinSyncPeriod,
    /// Period of the full resync that repairs drift.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub sync_period: Duration,
    /// Masquerade all traffic to cluster IPs.
    #[arg(long)]
    pub masquerade_all: bool,
    /// Pod CIDRs (comma-separated): traffic from outside them to a cluster IP is masqueraded.
    #[arg(long, value_delimiter = ',')]
    pub cluster_cidr: Vec<IpNet>,
    /// Service CIDRs: traffic to unallocated IPs inside them is dropped.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10.96.0.0/12,fd00:10:96::/112"
    )]
    pub service_cidr: Vec<IpNet>,
    /// CIDRs of node addresses that accept node-port traffic (default: every local address).
    #[arg(long, value_delimiter = ',')]
    pub nodeport_addresses: Vec<IpNet>,
    /// Address of /healthz and /livez ("" disables).
    #[arg(long, default_value = "0.0.0.0:10256", value_parser = parse_bind)]
    pub healthz_bind_address: BindAddress,
    /// Address of /metrics ("" disables).
    #[arg(long, default_value = "127.0.0.1:10249", value_parser = parse_bind)]
    pub metrics_bind_address: BindAddress,
    /// Remove everything svcnet's proxy installed, in every mode (nft table `svcnet`, iptables
    /// SVCNET- chains and hooks on both back ends, the userspace proxy's tables), and exit.
    #[arg(long)]
    pub cleanup: bool,
    /// When stopped as a pod of an add-on that is being deleted (its DaemonSet gone, or its
    /// credentials removed with it), remove the rules as `--cleanup` does; when the pod is
    /// only replaced, keep them for the next proxy (see `deploy/svcnet.yaml`, which sets
    /// `POD_NAME`/`POD_NAMESPACE` from the downward API).
    #[arg(long)]
    pub cleanup_on_uninstall: bool,
}

/// An `address:port` to serve on, or none (`""`). A newtype, not an `Option` field: clap
/// reads an `Option<T>` field as an optional `T` and would panic on a parser returning one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

pub(crate) fn parse_bind(s: &str) -> Result<BindAddress, String> {
    if s.is_empty() {
        return Ok(BindAddress(None));
    }
    s.parse()
        .map(|a| BindAddress(Some(a)))
        .map_err(|_| format!("{s:?} is not an address:port"))
}

pub use svcnet_proxyd::pacing::parse_duration;

/// kube-proxy's IPVS flags (used with `--mode ipvs`), shared by `svcnet proxy` and `svcnet up`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct IpvsFlags {
    /// IPVS timeout of idle established TCP connections, whole seconds (`0s`: the kernel's, 15m).
    #[arg(long, default_value = "0s", value_parser = parse_seconds)]
    pub ipvs_tcp_timeout: u32,
    /// IPVS timeout of TCP connections after a FIN, whole seconds (`0s`: the kernel's, 2m).
    #[arg(long, default_value = "0s", value_parser = parse_seconds)]
    pub ipvs_tcpfin_timeout: u32,
    /// IPVS timeout of UDP flows, whole seconds (`0s`: the kernel's, 5m).
    #[arg(long, default_value = "0s", value_parser = parse_seconds)]
    pub ipvs_udp_timeout: u32,
    /// Strict ARP (`arp_ignore=1`, `arp_announce=2`): the node does not answer ARP for the
    /// service addresses on its IPVS dummy interface.
    #[arg(long)]
    pub ipvs_strict_arp: bool,
}

impl IpvsFlags {
    pub fn options(&self) -> svcnet_ipvs::NodeOptions {
        svcnet_ipvs::NodeOptions {
            timeouts: svcnet_ipvs::Timeouts {
                tcp: self.ipvs_tcp_timeout,
                tcp_fin: self.ipvs_tcpfin_timeout,
                udp: self.ipvs_udp_timeout,
            },
            strict_arp: self.ipvs_strict_arp,
        }
    }
}

/// A duration in whole seconds (IPVS counts its timeouts in seconds).
pub fn parse_seconds(s: &str) -> Result<u32, String> {
    let d = parse_duration(s)?;
    if d.subsec_nanos() != 0 {
        return Err(format!("{s:?}: IPVS timeouts are whole seconds"));
    }
    u32::try_from(d.as_secs()).map_err(|_| format!("{s:?} is too long"))
}

/// `matches` are the subcommand's own (for `--config`: a flag on the command line wins).
pub async fn run(mut args: Args, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    if let Some(path) = args.config.clone() {
        let file = super::proxy_config::KubeProxyConfiguration::read(&path)?;
        let explicit = |id: &str| {
            matches.is_some_and(|m| {
                m.try_get_raw(id).is_ok()
                    && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
            })
        };
        file.apply(&mut args, explicit)
            .with_context(|| format!("invalid proxy configuration {}", path.display()))?;
        let ignored = file.ignored();
        if !ignored.is_empty() {
            tracing::info!(file = %path.display(), fields = ?ignored, "configuration fields svcnet does not act on");
        }
    }
    if args.cleanup {
        let c = svcnet_proxyd::cleanup(args.netns.as_deref(), svcnet_nft::names::TABLE)?;
        eprintln!(
            "removed {} svcnet nft table(s), svcnet iptables rules from {} back end/family pair(s), and the userspace proxy's tables",
            c.nft_tables, c.iptables
        );
        return Ok(());
    }
    let node_name = args
        .node_name
        .context("--node-name (or $NODE_NAME) is required")?;
    let client = crate::cmd::kubeconfig::client(args.kubeconfig.as_deref()).await?;
    let cfg = ProxyConfig {
        node_name,
        mode: args.mode,
        netns: args.netns,
        min_sync_period: args.min_sync_period,
        sync_period: args.sync_period,
        masquerade_all: args.masquerade_all,
        cluster_cidrs: args.cluster_cidr,
        service_cidrs: args.service_cidr,
        nodeport_addresses: args.nodeport_addresses,
        healthz_bind: args.healthz_bind_address.0,
        metrics_bind: args.metrics_bind_address.0,
        scheduler: args.scheduler,
        unprivileged: args.unprivileged,
        ipvs: args.ipvs.options(),
        ..Default::default()
    };
    let shutdown = async {
        if let Err(e) = super::shutdown_signal().await {
            tracing::warn!("{e:#}; stopping");
        }
    };
    let netns = cfg.netns.clone();
    svcnet_proxyd::run(cfg, client.clone(), shutdown)
        .await
        .context("node proxy")?;
    if args.cleanup_on_uninstall {
        match super::addon::why_stopping(&client).await {
            super::addon::Stopping::Uninstall(why) => {
                let c = svcnet_proxyd::cleanup(netns.as_deref(), svcnet_nft::names::TABLE)?;
                tracing::info!(%why, nft_tables = c.nft_tables, iptables = c.iptables, "add-on removed: rules removed");
            }
            super::addon::Stopping::Restart(why) => {
                tracing::info!(%why, "rules kept for the next proxy");
            }
        }
    }
    Ok(())
}
