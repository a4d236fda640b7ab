//! `svcnet node-local-dns`: a node-local DNS cache, as Kubernetes' NodeLocal DNSCache
//! (`node-cache`) runs on every node, for one node's network namespace.
//!
//! Like upstream it owns its addresses and rules and gives them back when it stops:
//! 1. the node-local address (169.254.20.10) and the cluster DNS service IP go on the node's
//!    `lo` (upstream uses a dummy interface; `lo` needs no kernel module and is local the same
//!    way), so queries pods send to the service IP arrive on the node itself;
//! 2. the cache listens on both addresses, UDP and TCP port 53 ([`svcnet_dns::nodelocal`]);
//! 3. only then, a table of its own, `ip svcnet-nodelocal`, marks DNS to and from those
//!    addresses `notrack` at raw priority: untracked packets skip the proxy's DNAT (conntrack
//!    never sees them, so the nat hooks do not either) and take no conntrack entry, which is the
//!    point (the UDP conntrack races that make cluster DNS lose answers);
//! 4. on SIGTERM, Ctrl-C or the end of its stdin (`--exit-with-stdin`, how `svcnet up` runs it,
//!    so it never outlives `svcnet up`) it deletes the table and the addresses again: queries to
//!    the service IP are DNATed to the cluster DNS as before, with no change in any pod.
//!
//! If it dies without cleaning up (`kill -9`), whoever supervises it calls [`teardown`] (as
//! `svcnet up` does), which is the same step 4.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;

/// The nftables table holding the `notrack` rules (one per node namespace).
pub const TABLE: &str = "svcnet-nodelocal";

/// Flags of `svcnet node-local-dns`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Network namespace to run in (a node's, from `svcnet up`); default: the current one.
    #[arg(long)]
    pub netns: Option<String>,
    /// Addresses the cache owns and listens on, comma-separated: the node-local address and
    /// the cluster DNS service IP (whose queries it then takes over from the proxy).
    #[arg(
        long = "local-ip",
        value_delimiter = ',',
        default_value = "169.254.20.10"
    )]
    pub local_ips: Vec<Ipv4Addr>,
    /// The cluster DNS at its real listener address (not the service IP): asked over TCP.
    #[arg(long)]
    pub cluster_dns: SocketAddr,
    /// Resolvers for names outside the cluster domain (comma-separated); default: the
    /// cluster DNS (node namespaces of `svcnet up` have no route out).
    #[arg(long = "upstream", value_delimiter = ',')]
    pub upstreams: Vec<SocketAddr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Longest time a positive answer in the cluster domain is cached, in seconds.
    #[arg(long, default_value_t = 30)]
    pub success_ttl: u32,
    /// Longest time a negative answer in the cluster domain is cached, in seconds.
    #[arg(long, default_value_t = 5)]
    pub denial_ttl: u32,
    /// Ask an answer again before it expires once it has been asked for this many times in a
    /// row (CoreDNS's `cache { prefetch AMOUNT }`, every zone); 0, the default as in
    /// upstream's Corefile: off.
    #[arg(long, default_value_t = 0)]
    pub prefetch: u32,
    /// "In a row": no gap this long or longer between two of the questions (CoreDNS's
    /// prefetch DURATION).
    #[arg(long, default_value = "1m", value_parser = super::proxy::parse_duration)]
    pub prefetch_duration: Duration,
    /// Prefetch once the answer's remaining TTL is at most this percentage of the TTL it was
    /// kept for, 10 to 90 (CoreDNS's prefetch PERCENTAGE%).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(10..=90))]
    pub prefetch_percentage: u8,
    /// Port of /health and /metrics on the first local address (upstream's 9253).
    #[arg(long, default_value_t = 9253)]
    pub metrics_port: u16,
    /// Stop when stdin ends (a supervisor holds the other end; it may die without notice).
    #[arg(long, hide = true)]
    pub exit_with_stdin: bool,
}

/// Moves the whole process into `--netns` before the async runtime starts its threads, so
/// every thread, socket and child (`ip`, `nft`) is the node's.
pub fn enter_netns(args: &Args) -> anyhow::Result<()> {
    if let Some(name) = &args.netns {
        svcnet_netns::NetNs::open(name)
            .and_then(|ns| ns.enter())
            .with_context(|| format!("cannot enter the network namespace {name}"))?;
    }
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.local_ips.is_empty(),
        "--local-ip needs at least one address"
    );
    // Whatever happens from here, give the addresses and rules back.
    let result = serve(&args).await;
    let ips = args.local_ips.clone();
    let cleaned = tokio::task::spawn_blocking(move || teardown(None, &ips))
        .await
        .context("teardown task")?;
    result.and(cleaned)
}

async fn serve(args: &Args) -> anyhow::Result<()> {
    let ips = args.local_ips.clone();
    tokio::task::spawn_blocking(move || add_addresses(&ips))
        .await
        .context("address task")??;
    let upstreams = if args.upstreams.is_empty() {
        vec![args.cluster_dns]
    } else {
        args.upstreams.clone()
    };
    let cache =
        svcnet_dns::nodelocal::NodeLocalCache::start(svcnet_dns::nodelocal::NodeLocalConfig {
            listen: args.local_ips.iter().copied().map(IpAddr::V4).collect(),
            port: 53,
            cluster_dns: args.cluster_dns,
            upstreams,
            cluster_domain: args.cluster_domain.clone(),
            success_ttl: args.success_ttl,
            denial_ttl: args.denial_ttl,
            timeout: Duration::from_secs(2),
            prefetch: (args.prefetch > 0).then_some(svcnet_dns::server::Prefetch {
                amount: args.prefetch,
                duration: args.prefetch_duration,
                percentage: args.prefetch_percentage,
            }),
        })
        .await
        .context("cannot start the node-local DNS cache")?;
    let mut tasks = tokio::task::JoinSet::new();
    let http = SocketAddr::new(IpAddr::V4(args.local_ips[0]), args.metrics_port);
    svcnet_dns::nodelocal::serve_http(http, cache.observer(), &mut tasks)
        .await
        .with_context(|| format!("cannot serve /metrics on {http}"))?;
    // Rules last: until the cache listens, queries keep going through the proxy's DNAT.
    let ruleset = notrack_ruleset(&args.local_ips);
    tokio::task::spawn_blocking(move || apply_ruleset(&ruleset))
        .await
        .context("nft task")??;
    println!(
        "node-local DNS cache on {:?}: listening on {:?} :53, cluster DNS {} over TCP, metrics http://{http}/metrics",
        args.netns.as_deref().unwrap_or("this namespace"),
        args.local_ips,
        args.cluster_dns
    );
    wait_for_stop(args.exit_with_stdin).await?;
    tasks.shutdown().await;
    cache.shutdown().await;
    Ok(())
}

/// SIGTERM, Ctrl-C, or (with `--exit-with-stdin`) the end of stdin.
async fn wait_for_stop(with_stdin: bool) -> anyhow::Result<()> {
    let stdin_closed = async {
        if !with_stdin {
            return std::future::pending().await;
        }
        // A plain thread, not `spawn_blocking`: the runtime would wait for it on exit.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let mut sink = [0u8; 512];
            while matches!(std::io::Read::read(&mut std::io::stdin(), &mut sink), Ok(n) if n > 0) {}
            let _ = tx.send(());
        });
        let _ = rx.await;
    };
    tokio::select! {
        res = super::shutdown_signal() => res,
        () = stdin_closed => Ok(()),
    }
}

/// The `notrack` table for `ips`: DNS to them (from pods, in prerouting; from the node itself,
/// in output) and their answers (output), as upstream's raw-table rules.
pub fn notrack_ruleset(ips: &[Ipv4Addr]) -> String {
    let set = ips
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    // Declaring the table first makes the delete valid when it does not exist yet: the whole
    // file replaces the table in one transaction.
    format!(
        "table ip {TABLE} {{}}\n\
         delete table ip {TABLE}\n\
         table ip {TABLE} {{\n\
         \tchain prerouting {{\n\
         \t\ttype filter hook prerouting priority raw; policy accept;\n\
         \t\tip daddr {{ {set} }} meta l4proto {{ tcp, udp }} th dport 53 notrack\n\
         \t}}\n\
         \tchain output {{\n\
         \t\ttype filter hook output priority raw; policy accept;\n\
         \t\tip saddr {{ {set} }} meta l4proto {{ tcp, udp }} th sport 53 notrack\n\
         \t\tip daddr {{ {set} }} meta l4proto {{ tcp, udp }} th dport 53 notrack\n\
         \t}}\n\
         }}\n"
    )
}

fn apply_ruleset(ruleset: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot run nft (apt-get install nftables)")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(ruleset.as_bytes())
            .context("cannot write to nft")?;
    }
    let out = child.wait_with_output().context("nft")?;
    anyhow::ensure!(
        out.status.success(),
        "nft -f failed: {}\n{ruleset}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn add_addresses(ips: &[Ipv4Addr]) -> anyhow::Result<()> {
    for ip in ips {
        let out = std::process::Command::new("ip")
            .args(["addr", "replace", &format!("{ip}/32"), "dev", "lo"])
            .output()
            .context("cannot run ip (apt-get install iproute2)")?;
        anyhow::ensure!(
            out.status.success(),
            "ip addr replace {ip}/32 dev lo: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Deletes the `notrack` table and `ips` from `lo`, in `netns` (or the current namespace):
/// queries to the service IP go through the proxy's DNAT to the cluster DNS again. What is
/// already gone is not an error.
pub fn teardown(netns: Option<&str>, ips: &[Ipv4Addr]) -> anyhow::Result<()> {
    let table = svcnet_netns::command(netns, "nft")
        .args(["delete", "table", "ip", TABLE])
        .output()
        .context("cannot run nft")?;
    let stderr = String::from_utf8_lossy(&table.stderr);
    anyhow::ensure!(
        table.status.success() || stderr.contains("No such file"),
        "nft delete table ip {TABLE}: {}",
        stderr.trim()
    );
    for ip in ips {
        let out = svcnet_netns::command(netns, "ip")
            .args(["addr", "del", &format!("{ip}/32"), "dev", "lo"])
            .output()
            .context("cannot run ip")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            out.status.success()
                || stderr.contains("Cannot assign")
                || stderr.contains("Address not found"),
            "ip addr del {ip}/32 dev lo: {}",
            stderr.trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_marks_dns_to_and_from_both_addresses() {
        let text = notrack_ruleset(&[
            Ipv4Addr::new(169, 254, 20, 10),
            Ipv4Addr::new(10, 96, 0, 10),
        ]);
        expect_test::expect![[r#"
            table ip svcnet-nodelocal {}
            delete table ip svcnet-nodelocal
            table ip svcnet-nodelocal {
            	chain prerouting {
            		type filter hook prerouting priority raw; policy accept;
            		ip daddr { 169.254.20.10, 10.96.0.10 } meta l4proto { tcp, udp } th dport 53 notrack
            	}
            	chain output {
            		type filter hook output priority raw; policy accept;
            		ip saddr { 169.254.20.10, 10.96.0.10 } meta l4proto { tcp, udp } th sport 53 notrack
            		ip daddr { 169.254.20.10, 10.96.0.10 } meta l4proto { tcp, udp } th dport 53 notrack
            	}
            }
        "#]]
        .assert_eq(&text);
    }
}
