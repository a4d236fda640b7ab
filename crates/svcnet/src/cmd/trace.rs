//! `svcnet trace [--node N] SRC DST:PORT [--proto tcp|udp|icmp] [-o text|json]
//! [--explain-ping]`: which rules a connection's first packet hits on a node, and why. It reads
//! the rules as the kernel holds them now, inside the node's network namespace (`nft list
//! table`, or `iptables-save` of the back end holding svcnet's chains, or IPVS's virtual servers
//! with the IPVS mode's ipsets, companion rules and dummy addresses, or the userspace
//! proxy's redirect table, whose trace ends at its listener: `trace_userspace` adds the
//! endpoints the proxy relays to), walks them with the
//! dataplane's own tracer (`svcnet_nft::trace`, `svcnet_iptables::trace`,
//! `svcnet_ipvs::trace`) and prints the hook
//! and chain path, the frontend that matched, each endpoint that can be chosen with its share,
//! whether and why the packet is masqueraded, the verdict when nothing takes it, and, when
//! NetworkPolicies exist, the evaluator's verdict for each destination after DNAT (which
//! policies isolate each end, which rule let it in; the objects are read from the API with
//! the data dir's kubeconfig). Nodes of
//! `svcnet up` are found in the data dir's topology (`<prefix>-node<i>` namespaces); `--netns`
//! names any other namespace (`""`: the current one). Needs root (it enters namespaces and
//! reads the rules).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context, bail};
use svcnet_proxy::Protocol;
use svcnet_proxy::trace::{Branch, Explanation, Outcome, Packet};

/// Flags of `svcnet trace`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The client's address (a pod IP, an outside address, or one of the node's own).
    pub src: String,
    /// The destination, `IP:PORT` (`[IPv6]:PORT`); the port may be left out for ICMP.
    pub dst: String,
    /// The node whose rules to read (default: the first node of `svcnet up`).
    #[arg(long)]
    pub node: Option<String>,
    /// Read the rules in this network namespace instead (`""`: the current one).
    #[arg(long)]
    pub netns: Option<String>,
    /// The protocol of the packet.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "udp", "sctp", "icmp"])]
    pub proto: String,
    /// Output format.
    #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// Trace an ICMP echo and say why a ClusterIP does not answer ping.
    #[arg(long)]
    pub explain_ping: bool,
    /// The data dir of `svcnet up`.
    #[arg(long, default_value = "svcnet-data", env = "SVCNET_DATA_DIR", long_help = crate::cmd::DATA_DIR_HELP)]
    pub data_dir: PathBuf,
}

const PING: &str = "A cluster IP is not an address of any interface: in nftables and iptables \
mode it exists only as rules that DNAT TCP, UDP or SCTP to the service's ports (nft: `ip daddr . \
meta l4proto . th dport @svc-n2 dnat ip to … map @backends-tcp`; iptables: `-d IP -p tcp --dport PORT` in \
SVCNET-SERVICES). An ICMP echo has no port, so no service rule takes it and no endpoint sees it; \
svcnet then answers for the cluster IP as kube-proxy's nftables mode does: an allocated cluster IP \
rejects what no port matches (ping prints \"Destination Port Unreachable\"), an unallocated \
address of the service CIDR is dropped (ping times out). Test a service with its protocol \
instead: `curl IP:PORT`, `nc -vz IP PORT`, or `dig @IP` for DNS.";

const PING_IPVS: &str = "In IPVS mode every cluster IP (and external and load-balancer IP) is \
an address of the dummy interface svcnet-ipvs0 in each node, so the node itself answers ping for \
it, as with kube-proxy's IPVS mode: a reply says nothing about the service's endpoints. Test a \
service with its protocol instead: `curl IP:PORT`, `nc -vz IP PORT`, or `dig @IP` for DNS.";

/// What a packet is traced with: the parsed destination and protocol.
fn parse_packet(args: &Args) -> anyhow::Result<(IpAddr, IpAddr, u16, Option<Protocol>)> {
    let src: IpAddr = args.src.parse().map_err(|_| {
        anyhow::anyhow!(
            "usage: SRC {:?} is not an IP address (svcnet trace SRC DST:PORT, e.g. svcnet trace 10.244.1.5 10.96.0.10:80)",
            args.src
        )
    })?;
    let icmp = args.explain_ping || args.proto == "icmp";
    let proto = match args.proto.as_str() {
        _ if icmp => None,
        "udp" => Some(Protocol::Udp),
        "sctp" => Some(Protocol::Sctp),
        _ => Some(Protocol::Tcp),
    };
    let (dst, port) = match args.dst.parse::<SocketAddr>() {
        Ok(a) => (a.ip(), a.port()),
        Err(_) => match args.dst.parse::<IpAddr>() {
            Ok(ip) if icmp => (ip, 0),
            Ok(_) => bail!(
                "usage: DST {:?} has no port: write DST:PORT (e.g. {}:80), or trace ICMP with --explain-ping",
                args.dst,
                args.dst
            ),
            Err(_) => bail!(
                "usage: DST {:?} is not IP:PORT (e.g. 10.96.0.10:80, [fd00::1]:80)",
                args.dst
            ),
        },
    };
    if src.is_ipv4() != dst.is_ipv4() {
        bail!("usage: SRC {src} and DST {dst} are of different IP families");
    }
    Ok((src, dst, port, proto))
}

/// The namespace to read: `--netns`, or the node's from the topology of `svcnet up`.
fn namespace(args: &Args) -> anyhow::Result<(String, Option<String>)> {
    if let Some(ns) = &args.netns {
        let node = args.node.clone().unwrap_or_else(|| "this node".into());
        return Ok((node, (!ns.is_empty()).then(|| ns.clone())));
    }
    let path = args.data_dir.join(svcnet_agent::topology::RECORD_FILE);
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "no svcnet up topology at {} (start `svcnet up`, give --data-dir, or name a namespace with --netns)",
            path.display()
        )
    })?;
    let record: svcnet_agent::topology::TopologyRecord =
        serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))?;
    let node = match &args.node {
        None => record.nodes.first(),
        Some(n) => record.nodes.iter().find(|x| &x.name == n),
    };
    let Some(node) = node else {
        let names: Vec<&str> = record.nodes.iter().map(|n| n.name.as_str()).collect();
        bail!(
            "usage: unknown node {:?} (the nodes of {} are: {})",
            args.node.clone().unwrap_or_default(),
            args.data_dir.display(),
            names.join(", ")
        );
    };
    Ok((node.name.clone(), Some(node.netns.clone())))
}

/// Runs a command in the namespace (or here); `None` when it fails.
fn run_in(netns: Option<&str>, argv: &[&str]) -> anyhow::Result<Option<String>> {
    match netns {
        Some(ns) => {
            let ns = svcnet_netns::NetNs::open(ns)
                .with_context(|| format!("opening network namespace {ns}"))?;
            Ok(ns.exec(argv).ok())
        }
        None => {
            let (program, rest) = argv.split_first().context("empty command")?;
            let out = std::process::Command::new(program).args(rest).output();
            Ok(out
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned()))
        }
    }
}

/// The node's own addresses (`fib daddr type local`, `addrtype LOCAL`), read from the kernel.
fn local_addrs(netns: Option<&str>) -> anyhow::Result<Vec<IpAddr>> {
    let out = run_in(netns, &["ip", "-o", "addr", "show"])?.unwrap_or_default();
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|x| *x == "inet" || *x == "inet6")?;
            w.next()?.split('/').next()?.parse().ok()
        })
        .collect())
}

/// The `recent` lists (ClientIP affinity) that hold `src` now: the kernel keeps them in
/// `/proc/net/xt_recent/<name>` of the namespace, not in `iptables-save`.
fn recent_lists_holding(
    netns: Option<&str>,
    rules: &svcnet_iptables::trace::Ruleset,
    src: IpAddr,
) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let mut names = std::collections::BTreeSet::new();
    for rule in rules.tables.values().flat_map(|t| t.values()).flatten() {
        if let Some(i) = rule.iter().position(|a| a == "--name")
            && let Some(n) = rule.get(i + 1)
        {
            names.insert(n.clone());
        }
    }
    let needle = format!("src={src} ");
    let mut holding = std::collections::BTreeSet::new();
    for name in names {
        let path = format!("/proc/net/xt_recent/{name}");
        if let Some(text) = run_in(netns, &["cat", &path])?
            && text.lines().any(|l| l.starts_with(&needle))
        {
            holding.insert(name);
        }
    }
    Ok(holding)
}

/// The dataplane found in the namespace and its trace.
struct Traced {
    dataplane: String,
    source: String,
    branches: Vec<Branch>,
    explain: fn(&Branch) -> Explanation,
}

/// Reads nftables tables back from the kernel through one libnftables context in the
/// namespace (no `nft` process); a missing library reads as no table, remembered for the
/// final message, so an iptables node still traces without it.
struct NftReader {
    exec: svcnet_libnft::NftExecutor,
    family: svcnet_libnft::Family,
    missing: Option<String>,
}

impl NftReader {
    fn list(&mut self, table: &str) -> anyhow::Result<Option<String>> {
        match self.exec.list_table(self.family, table) {
            Ok(listing) => Ok(listing),
            Err(svcnet_libnft::ApplyError::NotInstalled(e)) => {
                self.missing = Some(e.to_string());
                Ok(None)
            }
            Err(e) => {
                Err(e).with_context(|| format!("listing table {} {table}", self.family.as_str()))
            }
        }
    }
}

fn trace_kernel(netns: Option<&str>, pkt: &Packet, local: Vec<IpAddr>) -> anyhow::Result<Traced> {
    let v6 = pkt.dst.is_ipv6();
    let family = if v6 { "ip6" } else { "ip" };
    let mut nft = NftReader {
        exec: svcnet_libnft::NftExecutor::new(netns.map(str::to_string)),
        family: if v6 {
            svcnet_libnft::Family::Ip6
        } else {
            svcnet_libnft::Family::Ip
        },
        missing: None,
    };
    let table = svcnet_nft::names::TABLE;
    if let Some(listing) = nft.list(table)? {
        let rules = svcnet_nft::trace::Ruleset::parse_listing(&listing)?;
        let branches = svcnet_nft::trace::Tracer::new(&rules, local).trace(pkt)?;
        return Ok(Traced {
            dataplane: "nftables".into(),
            source: format!("nft list table {family} {table}"),
            branches,
            explain: svcnet_nft::trace::explain,
        });
    }
    // IPVS mode: the virtual servers, the dummy's addresses, the ipsets and the companion
    // rules, read back into the state the IPVS tracer follows.
    let ipvs_family = if v6 {
        svcnet_proxy::IpFamily::V6
    } else {
        svcnet_proxy::IpFamily::V4
    };
    match svcnet_ipvs::readback::read(netns, ipvs_family) {
        Ok(Some(state)) => {
            return Ok(Traced {
                dataplane: "ipvs".into(),
                source: "the IPVS table (netlink), ipset save, iptables-save, ip addr".into(),
                branches: svcnet_ipvs::trace::branches(&state, pkt),
                explain: svcnet_ipvs::trace::explain,
            });
        }
        Ok(None)
        | Err(
            svcnet_ipvs::SyncError::NotInstalled { .. }
            | svcnet_ipvs::SyncError::Iptables(svcnet_iptables::ApplyError::NotInstalled { .. }),
        ) => {}
        Err(e) => return Err(e).context("reading the IPVS dataplane's state"),
    }
    let fam = if v6 {
        svcnet_iptables::Family::V6
    } else {
        svcnet_iptables::Family::V4
    };
    for backend in [
        svcnet_iptables::Backend::Nft,
        svcnet_iptables::Backend::Legacy,
    ] {
        let program = backend.program(fam, "-save");
        let Some(save) = run_in(netns, &[&program])? else {
            continue;
        };
        if !save.contains(":SVCNET-") {
            continue;
        }
        let rules = svcnet_iptables::trace::Ruleset::parse_save(&save)?;
        let mut tracer = svcnet_iptables::trace::Tracer::new(&rules, local);
        tracer.recent = recent_lists_holding(netns, &rules, pkt.src)?;
        let branches = tracer.trace(pkt)?;
        return Ok(Traced {
            dataplane: "iptables".into(),
            source: program,
            branches,
            explain: svcnet_iptables::trace::explain,
        });
    }
    // The userspace proxy's redirects to its listeners (privileged mode); it picks the
    // endpoint itself, per connection, so the trace ends at its listener.
    let us = svcnet_userspace::rules::TABLE;
    if let Some(listing) = nft.list(us)? {
        let rules = svcnet_nft::trace::Ruleset::parse_listing(&listing)?;
        let branches = svcnet_nft::trace::Tracer::new(&rules, local).trace(pkt)?;
        return Ok(Traced {
            dataplane: "userspace".into(),
            source: format!("nft list table {family} {us}"),
            branches,
            explain: svcnet_nft::trace::explain,
        });
    }
    let unread = nft
        .missing
        .map(|e| format!(" The nftables tables could not be read: {e}."))
        .unwrap_or_default();
    bail!(
        "no svcnet proxy rules in {} (table {family} {table}, SVCNET- chains or table {family} {us}): \
         is the proxy running there? (The unprivileged userspace proxy installs no rules: it \
         listens on each cluster IP itself; its /healthz and /metrics show what it serves.){unread}",
        netns.map_or("this network namespace".to_string(), |n| format!(
            "network namespace {n}"
        ))
    )
}

pub async fn run(mut args: Args) -> anyhow::Result<()> {
    args.data_dir = crate::cmd::absolute_data_dir(&args.data_dir)?;
    let (src, dst, dport, proto) = parse_packet(&args)?;
    let (node, netns) = namespace(&args)?;
    let ns = netns.clone();
    let (traced, pkt, local) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let local = local_addrs(ns.as_deref())?;
        let pkt = Packet {
            src,
            dst,
            dport,
            proto,
            local_origin: local.contains(&src),
        };
        let traced = trace_kernel(ns.as_deref(), &pkt, local.clone())?;
        Ok((traced, pkt, local))
    })
    .await
    .context("trace task")??;
    // The API's objects (policies, and in userspace mode what the proxy relays to), read
    // with the data dir's kubeconfig when there is one.
    let kubeconfig = args.data_dir.join("kubeconfig");
    let client = if kubeconfig.exists() {
        crate::cmd::kubeconfig::client_from_kubeconfig(&kubeconfig)
            .await
            .map_err(|e| tracing::warn!("the API's part left out: {e:#}"))
            .ok()
    } else {
        None
    };
    // The userspace proxy picks the endpoint past its listener: the ones it can pick.
    let relayed = match &client {
        Some(c) if traced.dataplane == "userspace" => {
            super::trace_userspace::endpoints(c.clone(), &node, &local, &pkt)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!("the userspace proxy's endpoints left out: {e:#}");
                    Vec::new()
                })
        }
        _ => Vec::new(),
    };
    // How the node forwards to each destination: past the proxy's rules, or past its relay.
    let to: Vec<SocketAddr> = destinations(&traced, &pkt)
        .into_iter()
        .chain(relayed.iter().copied())
        .collect();
    let ns = netns.clone();
    let forwarding = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut forwarding = BTreeMap::new();
        for to in to {
            if let Some(l) = super::trace_route::lookup(ns.as_deref(), run_in, to.ip())? {
                forwarding.insert(to.ip().to_string(), super::trace_route::explain(&l));
            }
        }
        Ok(forwarding)
    })
    .await
    .context("trace task")??;
    let policy = match client {
        Some(c) => policy_verdicts(c, &node, &local, &pkt, &traced, &relayed).await,
        None => BTreeMap::new(),
    };
    let ping =
        (args.explain_ping || pkt.proto.is_none()).then_some(if traced.dataplane == "ipvs" {
            PING_IPVS
        } else {
            PING
        });
    let report = Report {
        node: &node,
        netns: netns.as_deref(),
        traced: &traced,
        pkt: &pkt,
        ping,
        policy,
        forwarding,
        relayed,
    };
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report.json())?);
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

struct Report<'a> {
    node: &'a str,
    netns: Option<&'a str>,
    traced: &'a Traced,
    pkt: &'a Packet,
    ping: Option<&'static str>,
    /// NetworkPolicy's verdict per destination (`ip:port` after DNAT), when policies exist.
    policy: BTreeMap<String, String>,
    /// How the node forwards to each destination's address (the pod network's part).
    forwarding: BTreeMap<String, String>,
    /// Userspace mode: the endpoints the proxy relays the connection to (one per connection).
    relayed: Vec<SocketAddr>,
}

/// Where the packet goes after the proxy: each endpoint, or the destination itself when no
/// service rule took it.
fn destinations(traced: &Traced, pkt: &Packet) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = traced
        .branches
        .iter()
        .filter_map(|b| match &b.outcome {
            Outcome::Endpoint { to, .. } => Some(*to),
            Outcome::Pass => Some(SocketAddr::new(pkt.dst, pkt.dport)),
            _ => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// NetworkPolicy's verdict for each destination, from the API's objects through the
/// evaluator (the decision the node's table is compiled from): which policies isolate each
/// end and which rule allowed it. Empty without policies or for ICMP (policies are defined
/// for TCP, UDP and SCTP); not asked without a kubeconfig in the data dir.
async fn policy_verdicts(
    client: kube::Client,
    node: &str,
    local: &[IpAddr],
    pkt: &Packet,
    traced: &Traced,
    relayed: &[SocketAddr],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let protocol = match pkt.proto {
        Some(Protocol::Tcp) => svcnet_netpol::Protocol::Tcp,
        Some(Protocol::Udp) => svcnet_netpol::Protocol::Udp,
        Some(Protocol::Sctp) => svcnet_netpol::Protocol::Sctp,
        None => return out,
    };
    let listed = async {
        let lp = kube::api::ListParams::default();
        let policies =
            kube::Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::all(client.clone())
                .list(&lp)
                .await?
                .items;
        if policies.is_empty() {
            return Ok(None);
        }
        let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::all(client.clone())
            .list(&lp)
            .await?
            .items;
        let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
            .list(&lp)
            .await?
            .items;
        anyhow::Ok(Some(
            svcnet_netpol::Cluster::from_k8s(&policies, &pods, &namespaces).0,
        ))
    };
    let cluster = match listed.await {
        Ok(Some(c)) => c,
        Ok(None) => return out,
        Err(e) => {
            tracing::warn!("NetworkPolicy verdicts left out: {e:#}");
            return out;
        }
    };
    let nodes: Vec<(String, IpAddr)> = local.iter().map(|ip| (node.to_string(), *ip)).collect();
    for to in destinations(traced, pkt)
        .into_iter()
        .chain(relayed.iter().copied())
    {
        let conn = svcnet_netpol::Connection {
            src: cluster.endpoint(pkt.src, &nodes),
            dst: cluster.endpoint(to.ip(), &[]),
            protocol,
            port: to.port(),
        };
        let text = match cluster.check(&conn) {
            Ok(v) if v.allowed() => format!("allowed ({v})"),
            Ok(v) => format!("denied ({v})"),
            Err(e) => format!("unknown ({e})"),
        };
        out.insert(to.to_string(), text);
    }
    out
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn packet_text(p: &Packet) -> String {
    let to = if p.proto.is_none() {
        p.dst.to_string()
    } else {
        SocketAddr::new(p.dst, p.dport).to_string()
    };
    let from = if p.local_origin {
        "sent by the node itself (output hook)"
    } else {
        "arriving from a link (prerouting hook)"
    };
    format!("{} {} -> {to}, {from}", p.proto_name(), p.src)
}

/// Whether the branch went to its endpoint because the client is in its affinity set (nft)
/// or `recent` list (iptables).
fn sticky(b: &Branch) -> bool {
    // nft: the DNAT of a service port's affinity lookup chain (`aff-<pool>-…`).
    let nft_hit = b
        .ended_by
        .as_ref()
        .is_some_and(|(chain, rule)| chain.starts_with("aff-") && rule.contains("saddr map @aff-"));
    nft_hit
        || b.path
            .iter()
            .any(|h| h.via.as_deref().is_some_and(|v| v.contains("--rcheck")))
}

/// The hops of a branch as `chain` lines, base chains with their hook, each jump indented
/// below the chain it came from.
fn path_lines(b: &Branch) -> Vec<String> {
    let mut depth: BTreeMap<&str, usize> = BTreeMap::new();
    b.path
        .iter()
        .map(|h| {
            let d = h
                .from
                .as_deref()
                .and_then(|f| depth.get(f))
                .map_or(0, |d| d + 1);
            depth.insert(&h.chain, d);
            match &h.hook {
                Some(hook) => format!("[{hook}] {}", h.chain),
                None => format!("{}-> {}", "  ".repeat(d), h.chain),
            }
        })
        .collect()
}

impl Report<'_> {
    /// Branches with the same outcome merged (their shares summed), largest first.
    fn merged(&self) -> Vec<(Outcome, f64, &Branch)> {
        let mut m: BTreeMap<Outcome, (f64, &Branch)> = BTreeMap::new();
        for b in &self.traced.branches {
            let e = m.entry(b.outcome.clone()).or_insert((0.0, b));
            e.0 += b.share;
        }
        let mut v: Vec<_> = m.into_iter().map(|(o, (s, b))| (o, s, b)).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    fn text(&self) -> String {
        use std::fmt::Write;
        let t = self.traced;
        let mut out = String::new();
        let ns = self.netns.unwrap_or("the current network namespace");
        let _ = writeln!(
            out,
            "node {} ({}; rules read with `{}` in {ns})",
            self.node, t.dataplane, t.source
        );
        let _ = writeln!(out, "packet: {}", packet_text(self.pkt));
        let merged = self.merged();
        let first = merged.first().map(|(_, _, b)| (t.explain)(b));
        if let Some(f) = first.as_ref().and_then(|e| e.frontend.clone()) {
            let _ = writeln!(out, "frontend: {f}");
        }
        let endpoints: Vec<_> = merged
            .iter()
            .filter(|(o, _, _)| matches!(o, Outcome::Endpoint { .. }))
            .collect();
        let mut header = false;
        for (i, (o, share, b)) in merged.iter().enumerate() {
            let e = (t.explain)(b);
            if i == 0 {
                let _ = writeln!(out, "path:");
                for l in path_lines(b) {
                    let _ = writeln!(out, "  {l}");
                }
            }
            match o {
                Outcome::Endpoint { to, masquerade } => {
                    if !header {
                        header = true;
                        let _ = writeln!(out, "endpoints ({} can be chosen):", endpoints.len());
                    }
                    // The endpoint chain: where the DNAT is.
                    let via = b
                        .ended_by
                        .as_ref()
                        .map(|(chain, _)| format!(" via {chain}"))
                        .unwrap_or_default();
                    let masq = if *masquerade {
                        format!(
                            "masqueraded: {}",
                            e.masquerade.unwrap_or_else(|| "yes".into())
                        )
                    } else {
                        "not masqueraded: the endpoint sees the client's address".into()
                    };
                    let _ = writeln!(out, "  {:>6}  {to}{via}\n          {masq}", percent(*share));
                    if let Some(f) = self.forwarding.get(&to.ip().to_string()) {
                        let _ = writeln!(out, "          forwarded: {f}");
                    }
                    if let Some(p) = self.policy.get(&to.to_string()) {
                        let _ = writeln!(out, "          network policy: {p}");
                    }
                    if sticky(b) {
                        let _ = writeln!(
                            out,
                            "          session affinity: this client is recorded for this endpoint, so it returns to it"
                        );
                    }
                    if !b.records_affinity.is_empty() {
                        let _ = writeln!(
                            out,
                            "          session affinity: records the client in {}",
                            b.records_affinity.join(", ")
                        );
                    }
                }
                _ => {
                    let _ = writeln!(out, "verdict ({}): {}", percent(*share), e.verdict);
                    if let Some((chain, rule)) = &b.ended_by {
                        let _ = writeln!(out, "  by `{rule}` in chain {chain}");
                    }
                    if let (Outcome::Pass, Some(f)) =
                        (o, self.forwarding.get(&self.pkt.dst.to_string()))
                    {
                        let _ = writeln!(out, "  forwarded: {f}");
                    }
                    let dst = SocketAddr::new(self.pkt.dst, self.pkt.dport).to_string();
                    if let (Outcome::Pass, Some(p)) = (o, self.policy.get(&dst)) {
                        let _ = writeln!(out, "  network policy: {p}");
                    }
                    self.relayed_text(&mut out);
                }
            }
        }
        if let Some(p) = self.ping {
            let _ = writeln!(out, "why ping does not answer: {p}");
        }
        out
    }

    /// The userspace proxy's part: the endpoints it relays to, each with how the node
    /// forwards to it and the policy verdict the proxy applies.
    fn relayed_text(&self, out: &mut String) {
        use std::fmt::Write;
        if self.relayed.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "  the userspace proxy relays each connection to one of {} endpoints, from the node:",
            self.relayed.len()
        );
        for to in &self.relayed {
            let _ = writeln!(out, "    {to}");
            if let Some(f) = self.forwarding.get(&to.ip().to_string()) {
                let _ = writeln!(out, "      forwarded: {f}");
            }
            if let Some(p) = self.policy.get(&to.to_string()) {
                let _ = writeln!(out, "      network policy (judged by the proxy): {p}");
            }
        }
    }

    fn json(&self) -> serde_json::Value {
        let t = self.traced;
        let branches: Vec<serde_json::Value> = t
            .branches
            .iter()
            .map(|b| {
                let e = (t.explain)(b);
                let (outcome, endpoint, masquerade) = match &b.outcome {
                    Outcome::Endpoint { to, masquerade } => {
                        ("endpoint", Some(to.to_string()), *masquerade)
                    }
                    Outcome::Listener { port } => ("redirected", Some(format!(":{port}")), false),
                    Outcome::Pass => ("routed", None, false),
                    Outcome::Drop => ("dropped", None, false),
                    Outcome::Reject => ("rejected", None, false),
                };
                serde_json::json!({
                    "share": b.share,
                    "outcome": outcome,
                    "endpoint": endpoint,
                    "masquerade": masquerade,
                    "masqueradeReason": e.masquerade,
                    "frontend": e.frontend,
                    "verdict": e.verdict,
                    "path": b.path.iter().map(|h| serde_json::json!({
                        "chain": h.chain,
                        "hook": h.hook,
                        "from": h.from,
                        "via": h.via,
                    })).collect::<Vec<_>>(),
                    "endedBy": b.ended_by.as_ref().map(|(c, r)| serde_json::json!({"chain": c, "rule": r})),
                    "masqueradedBy": b.masquerade_by.as_ref().map(|(c, r)| serde_json::json!({"chain": c, "rule": r})),
                    "recordsAffinity": b.records_affinity,
                    "affinityHit": sticky(b),
                })
            })
            .collect();
        serde_json::json!({
            "node": self.node,
            "netns": self.netns,
            "dataplane": t.dataplane,
            "rulesFrom": t.source,
            "packet": {
                "src": self.pkt.src.to_string(),
                "dst": self.pkt.dst.to_string(),
                "port": self.pkt.proto.map(|_| self.pkt.dport),
                "protocol": self.pkt.proto_name(),
                "fromNode": self.pkt.local_origin,
            },
            "branches": branches,
            "explainPing": self.ping,
            "relayedTo": self.relayed.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "networkPolicy": self.policy,
            "forwarding": self.forwarding,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(src: &str, dst: &str, proto: &str, ping: bool) -> Args {
        Args {
            src: src.into(),
            dst: dst.into(),
            node: None,
            netns: None,
            proto: proto.into(),
            output: "text".into(),
            explain_ping: ping,
            data_dir: PathBuf::from("svcnet-data"),
        }
    }

    fn err(a: &Args) -> String {
        match parse_packet(a) {
            Ok(p) => panic!("accepted {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn packets_and_usage_errors() {
        let p = parse_packet(&args("10.244.1.5", "10.96.0.10:80", "udp", false)).unwrap();
        assert_eq!(p.2, 80);
        assert_eq!(p.3, Some(Protocol::Udp));
        let p = parse_packet(&args("fd00::5", "[fd00:10:96::a]:53", "tcp", false)).unwrap();
        assert_eq!(p.3, Some(Protocol::Tcp));
        // ICMP needs no port.
        let p = parse_packet(&args("10.244.1.5", "10.96.0.10", "tcp", true)).unwrap();
        assert_eq!(p.3, None);
        let p = parse_packet(&args("10.244.1.5", "10.96.0.10", "icmp", false)).unwrap();
        assert_eq!(p.3, None);
        assert!(
            err(&args("pod-a", "10.96.0.10:80", "tcp", false)).contains("is not an IP address")
        );
        assert!(err(&args("10.244.1.5", "10.96.0.10", "tcp", false)).contains("has no port"));
        assert!(err(&args("10.244.1.5", "web:80", "tcp", false)).contains("is not IP:PORT"));
        assert!(
            err(&args("10.244.1.5", "10.96.0.10:99999", "tcp", false)).contains("is not IP:PORT")
        );
        assert!(
            err(&args("fd00::5", "10.96.0.10:80", "tcp", false)).contains("different IP families")
        );
    }
}
