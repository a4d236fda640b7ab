//! `svcnet up --node-local-dns`: one `svcnet node-local-dns` process per node namespace,
//! supervised. A process (not a task) so that it can die alone, as upstream's DaemonSet pod
//! can: when it exits for any reason its `notrack` rules and addresses are taken off the node
//! ([`teardown`](crate::cmd::node_local_dns::teardown)), so pods' queries to the cluster DNS
//! service IP go through the proxy's DNAT again, and it is started again after a second.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::Command;

use crate::cmd::node_local_dns::teardown;

/// How long a stopped cache stays down before it is started again.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// Flags of `svcnet up` for the node-local DNS cache.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeLocalDnsOptions {
    /// Run a node-local DNS cache (NodeLocal DNSCache) on every node: it takes over the
    /// cluster DNS service IP on the node (pods keep their nameserver) and asks cluster DNS
    /// over TCP; if it stops, queries fall back to cluster DNS through the proxy.
    #[arg(long)]
    pub node_local_dns: bool,
    /// The cache's link-local address on every node.
    #[arg(long, default_value = "169.254.20.10")]
    pub node_local_dns_ip: Ipv4Addr,
    /// Longest time the cache keeps a positive cluster answer, in seconds (upstream: 30).
    #[arg(long, default_value_t = 30)]
    pub node_local_dns_success_ttl: u32,
    /// Longest time the cache keeps a negative cluster answer, in seconds (upstream: 5).
    #[arg(long, default_value_t = 5)]
    pub node_local_dns_denial_ttl: u32,
    /// The cache asks an answer again before it expires once it has been asked for this many
    /// times in a row (CoreDNS's `cache { prefetch AMOUNT }`); 0 (upstream's default): off.
    #[arg(long, default_value_t = 0)]
    pub node_local_dns_prefetch: u32,
    /// "In a row": no gap this long or longer between two of the questions.
    #[arg(long, default_value = "1m", value_parser = crate::cmd::proxy::parse_duration)]
    pub node_local_dns_prefetch_duration: Duration,
    /// Prefetch once the remaining TTL is at most this percentage of the TTL kept (10 to 90).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(10..=90))]
    pub node_local_dns_prefetch_percentage: u8,
}

/// One node's cache as `svcnet up` starts it.
#[derive(Debug, Clone)]
pub struct NodeCache {
    pub node: String,
    pub netns: String,
    /// The node-local address and the cluster DNS service IP.
    pub ips: Vec<Ipv4Addr>,
    /// The cluster DNS's pod-facing listener.
    pub cluster_dns: SocketAddr,
    pub cluster_domain: String,
    /// Where the running process's id is written (`<data dir>/node-local-dns/<node>.pid`).
    pub pid_file: PathBuf,
}

impl NodeCache {
    fn args(&self, opts: &NodeLocalDnsOptions) -> Vec<String> {
        let ips: Vec<String> = self.ips.iter().map(ToString::to_string).collect();
        vec![
            "node-local-dns".into(),
            "--exit-with-stdin".into(),
            "--netns".into(),
            self.netns.clone(),
            "--local-ip".into(),
            ips.join(","),
            "--cluster-dns".into(),
            self.cluster_dns.to_string(),
            "--cluster-domain".into(),
            self.cluster_domain.clone(),
            "--success-ttl".into(),
            opts.node_local_dns_success_ttl.to_string(),
            "--denial-ttl".into(),
            opts.node_local_dns_denial_ttl.to_string(),
            "--prefetch".into(),
            opts.node_local_dns_prefetch.to_string(),
            "--prefetch-duration".into(),
            format!("{}ms", opts.node_local_dns_prefetch_duration.as_millis()),
            "--prefetch-percentage".into(),
            opts.node_local_dns_prefetch_percentage.to_string(),
        ]
    }
}

/// Runs `cache` until `stop`, restarting it whenever it exits; its rules and addresses are
/// off the node whenever it is not running, and when this returns.
pub async fn supervise(
    cache: NodeCache,
    opts: NodeLocalDnsOptions,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the svcnet binary")?;
    if let Some(dir) = cache.pid_file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    tokio::pin!(stop);
    loop {
        // stdin stays open while we run: the cache exits when we are gone, whatever the way.
        let mut child = Command::new(&exe)
            .args(cache.args(&opts))
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the node-local DNS cache on {}", cache.node))?;
        if let Some(pid) = child.id() {
            let _ = std::fs::write(&cache.pid_file, format!("{pid}\n"));
        }
        // Held here: `Child::wait` would close it first.
        let stdin = child.stdin.take();
        let exited = tokio::select! {
            status = child.wait() => Some(status),
            () = &mut stop => None,
        };
        match exited {
            None => {
                // Closing stdin asks it to clean up and exit; kill it if it does not.
                drop(stdin);
                if tokio::time::timeout(Duration::from_secs(5), child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.kill().await;
                }
                let _ = std::fs::remove_file(&cache.pid_file);
                return clean(&cache).await;
            }
            Some(status) => {
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                tracing::warn!(
                    node = %cache.node,
                    %status,
                    "node-local DNS cache stopped; queries go to cluster DNS through the proxy \
                     until it is back"
                );
                if let Err(err) = clean(&cache).await {
                    tracing::warn!(node = %cache.node, "{err:#}");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RESTART_DELAY) => {}
            () = &mut stop => return Ok(()),
        }
    }
}

async fn clean(cache: &NodeCache) -> anyhow::Result<()> {
    let (netns, ips) = (cache.netns.clone(), cache.ips.clone());
    tokio::task::spawn_blocking(move || teardown(Some(&netns), &ips))
        .await
        .context("teardown task")?
        .with_context(|| format!("node-local DNS cache on {}", cache.node))
}

/// With `--node-local-dns`, a supervised cache on every node of `topology` in `tasks`.
pub fn start_all(
    args: &super::Args,
    topology: Option<&svcnet_agent::Topology>,
    dns_service_ip: std::net::IpAddr,
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let opts = &args.node_local;
    if !opts.node_local_dns {
        return Ok(());
    }
    let Some(topology) = topology else {
        anyhow::bail!("--node-local-dns runs in the node namespaces: it needs the agent");
    };
    anyhow::ensure!(
        !args.disable.contains(&super::Component::Dns),
        "--node-local-dns needs cluster DNS (do not --disable dns)"
    );
    // The userspace proxy binds the cluster IPs itself; the cache takes the DNS one.
    anyhow::ensure!(
        args.proxy_mode != svcnet_proxyd::ProxyMode::Userspace,
        "--node-local-dns needs --proxy-mode nftables or iptables"
    );
    let std::net::IpAddr::V4(service_ip) = dns_service_ip else {
        anyhow::bail!(
            "--node-local-dns needs an IPv4 cluster DNS service IP, not {dns_service_ip}"
        );
    };
    for node in topology.nodes() {
        let cache = NodeCache {
            node: node.name.clone(),
            netns: node.netns.clone(),
            ips: vec![opts.node_local_dns_ip, service_ip],
            cluster_dns: SocketAddr::new(topology.host_ip().into(), 53),
            cluster_domain: args.cluster_domain.clone(),
            pid_file: args
                .data_dir
                .join("node-local-dns")
                .join(format!("{}.pid", node.name)),
        };
        println!(
            "node {}: node-local DNS cache on {} and {service_ip}",
            node.name, opts.node_local_dns_ip
        );
        let mut stop = stop.clone();
        tasks.spawn(supervise(cache, opts.clone(), async move {
            let _ = stop.wait_for(|stop| *stop).await;
        }));
    }
    Ok(())
}
