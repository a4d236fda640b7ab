//! `svcnet dns`: cluster DNS (CoreDNS's `kubernetes` plugin) against any API server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use svcnet_dns::{DnsConfig, ZoneConfig};

/// Flags of `svcnet dns`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig of the API server to watch; without it, `$KUBECONFIG` or the pod's service
    /// account (in-cluster), as client-go.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// UDP and TCP listen address.
    #[arg(long, default_value = "127.0.0.1:1053")]
    pub listen: SocketAddr,
    /// The cluster domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Upstream resolvers for names outside the cluster (repeatable); default: the
    /// nameservers of /etc/resolv.conf.
    #[arg(long = "upstream")]
    pub upstreams: Vec<SocketAddr>,
    /// Where to serve /health, /ready and /metrics (CoreDNS's health, ready and prometheus
    /// plugins, on one listener; CoreDNS's metrics port is 9153).
    #[arg(long, default_value = "127.0.0.1:9153")]
    pub http_listen: SocketAddr,
    /// The kubernetes and k8s_external plugins' options.
    #[command(flatten)]
    pub options: super::dns_options::DnsOptions,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = super::kubeconfig::client(args.kubeconfig.as_deref()).await?;
    let mut zone = ZoneConfig::new(&args.cluster_domain)?;
    args.options.apply(&mut zone)?;
    let config = DnsConfig {
        listen: args.listen,
        zone,
        upstreams: (!args.upstreams.is_empty()).then_some(args.upstreams),
        debounce: Duration::from_millis(5),
        labels: args.options.labels.clone(),
        http: Some(args.http_listen),
    };
    let shutdown = async {
        if let Err(e) = super::shutdown_signal().await {
            tracing::warn!("{e:#}; stopping");
        }
    };
    svcnet_dns::run(config, client, shutdown)
        .await
        .context("cluster DNS")
}
