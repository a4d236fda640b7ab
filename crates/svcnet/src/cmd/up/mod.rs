//! `svcnet up`: the whole system on this machine.
//!
//! Starts the API server over the embedded store, creates one network namespace per node (the
//! agent's topology: a host bridge, node namespaces, routes for svcnet's CIDRs into them), registers
//! the nodes, and runs the controllers, cluster DNS, and on every node the proxy and the agent,
//! all in-process. Each component can be switched off with `--disable`; without the agent there
//! are no node namespaces, so the proxy does not run either and this machine registers as the one
//! node. Ctrl-C (or SIGTERM) stops everything and removes every namespace, link and route; state in
//! the data dir survives.

mod cluster;
mod lease;
mod netpol;
mod node_local;
mod objects;
mod streams;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context as _;
use ipnet::{IpNet, Ipv4Net};

use crate::cmd::kubeconfig::client_from_kubeconfig;
use cluster::ClusterConfig;
use objects::NodeSpec;
pub(crate) use objects::nth_address;

/// Components of `svcnet up` that `--disable` can switch off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Component {
    /// The EndpointSlice, Endpoints, mirroring, Deployment, StatefulSet and scheduling controllers.
    Controllers,
    /// The node proxy (kube-proxy's job).
    Proxy,
    /// Cluster DNS.
    Dns,
    /// The node agent that runs pods in network namespaces.
    Agent,
    /// NetworkPolicy enforcement on every node (nftables, table `ip svcnet-netpol`).
    NetworkPolicy,
    /// The pod network between nodes (`--pod-network`'s routes, devices and daemons, flannel's
    /// node annotations and `NetworkUnavailable=False`), left to an add-on such as
    /// `deploy/svcnet.yaml`'s CNI DaemonSet. The node namespaces, their bridge and underlay and
    /// the pods' attachment stay; pods wait for the add-on's `NetworkUnavailable=False` and
    /// take its backend's MTU.
    PodNetwork,
}

/// An inclusive port range written `FIRST-LAST`, as kube-apiserver's `--service-node-port-range`.
#[derive(Debug, Clone)]
pub struct PortRange(pub std::ops::RangeInclusive<u16>);

impl FromStr for PortRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (first, last) = s.split_once('-').ok_or_else(|| {
            format!("port range {s:?} must be written FIRST-LAST, e.g. 30000-32767")
        })?;
        let first: u16 = first
            .trim()
            .parse()
            .map_err(|e| format!("port range {s:?}: first port: {e}"))?;
        let last: u16 = last
            .trim()
            .parse()
            .map_err(|e| format!("port range {s:?}: last port: {e}"))?;
        if first == 0 || first > last {
            return Err(format!("port range {s:?} must satisfy 1 <= FIRST <= LAST"));
        }
        Ok(PortRange(first..=last))
    }
}

/// Flags of `svcnet up`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory holding the store, certificates, the kubeconfig, IP allocations and pod logs.
    #[arg(long, default_value = "svcnet-data", env = "SVCNET_DATA_DIR", long_help = crate::cmd::DATA_DIR_HELP)]
    pub data_dir: PathBuf,
    /// Address the Kubernetes API server listens on (HTTPS).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub api_listen: SocketAddr,
    /// Service CIDR(s) cluster IPs are allocated from; comma-separated for dual-stack.
    #[arg(long, value_delimiter = ',', default_value = "10.96.0.0/12")]
    pub service_cidr: Vec<IpNet>,
    /// Range node ports are allocated from.
    #[arg(long, default_value = "30000-32767")]
    pub node_port_range: PortRange,
    /// Pool that LoadBalancer services get their ingress IP from (a range svcnet owns and routes).
    #[arg(long, default_value = "10.200.0.0/24")]
    pub lb_pool: IpNet,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The pod network; node i owns its i-th /24.
    #[arg(long, default_value = "10.244.0.0/16")]
    pub pod_cidr: Ipv4Net,
    /// Number of nodes (network namespaces), each with its own proxy and agent.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=16))]
    pub nodes: u8,
    /// The nodes' underlay: the host bridge gets .1, node i gets .(i+1) as its InternalIP.
    #[arg(long, default_value = "172.30.0.0/24")]
    pub underlay: Ipv4Net,
    /// How pod traffic crosses nodes: `host-gw` (flannel's host-gw: a route per node via its
    /// underlay address; the default here, since the embedded nodes share one bridge), `vxlan`
    /// (flannel's VXLAN: a `flannel.1` VTEP per node, VNI 1, UDP 8472, pod MTU 1450; needs no
    /// layer-2 adjacency, hence flannel's own default and the one for a real cluster), `udp`
    /// (flannel's UDP: a TUN `flannel0` per node and svcnet's user-space loop on UDP 8285, pod
    /// MTU 1472), `bgp` (Calico's: no encapsulation, a BIRD 2 per node in a full iBGP mesh, AS
    /// 64512, announcing its pod CIDR; needs `bird2`) or `ipip` (Calico's: `tunl0`, pod MTU 1480;
    /// needs the kernel's `ipip` module). Nodes carry flannel's annotations, and Calico's for
    /// bgp/ipip. With `--disable pod-network` an add-on routes between nodes instead (the CNI
    /// DaemonSet of `deploy/svcnet.yaml` defaults to vxlan; `svcnet cni install
    /// --pod-network` picks another).
    #[arg(long, default_value = "host-gw")]
    pub pod_network: svcnet_agent::routes::PodNetwork,
    /// With `--pod-network vxlan`: flannel's DirectRouting. Peers on a node's own underlay
    /// subnet get a host-gw route (`<podCIDR> via <InternalIP> dev eth0`) instead of the VXLAN
    /// entries; the others keep VXLAN. (The embedded nodes share one bridge, so all go direct.)
    #[arg(long)]
    pub vxlan_direct_routing: bool,
    /// Prefix of every namespace and link svcnet creates (at most 11 characters).
    #[arg(long, default_value = "svcnet")]
    pub prefix: String,
    /// The proxy's dataplane on every node. Without the agent (no node namespaces), only
    /// `userspace` runs: unprivileged on this machine, binding each cluster IP directly, for a
    /// loopback service CIDR such as 127.96.0.0/16 (no root needed).
    #[arg(long, default_value = "nftables")]
    pub proxy_mode: svcnet_proxyd::ProxyMode,
    /// Load-balancing algorithm for services without a `svcnet.io/lb-algorithm` annotation
    /// (rr, wrr, random, lc, sed, nq, sh, dh, maglev); default: the dataplane's own.
    #[arg(long)]
    pub scheduler: Option<svcnet_proxyd::Algorithm>,
    /// How long the node proxies batch changes after a sync (`svcnet proxy`'s): `auto` (nine
    /// times the last sync's duration, at most 1s), or kube-proxy's fixed minimum (`1s`; `0s`
    /// syncs every change at once).
    #[arg(long, default_value = "auto")]
    pub min_sync_period: svcnet_proxyd::MinSyncPeriod,
    /// The node proxies' full resync period, which repairs drift.
    #[arg(long, default_value = "30s", value_parser = super::proxy::parse_duration)]
    pub sync_period: std::time::Duration,
    /// kube-proxy's IPVS settings for every node proxy (with `--proxy-mode ipvs`).
    #[command(flatten)]
    pub ipvs: super::proxy::IpvsFlags,
    /// Name of the Node this machine registers as when the agent is disabled.
    #[arg(long)]
    pub node_name: Option<String>,
    /// UDP and TCP address cluster DNS listens on for the host.
    #[arg(long, default_value = "127.0.0.1:1053")]
    pub dns_listen: SocketAddr,
    /// Upstream resolvers for names outside the cluster (repeatable, or comma-separated in
    /// SVCNET_DNS_UPSTREAM); default: /etc/resolv.conf's.
    #[arg(
        long = "dns-upstream",
        env = "SVCNET_DNS_UPSTREAM",
        value_delimiter = ','
    )]
    pub dns_upstreams: Vec<SocketAddr>,
    /// Where cluster DNS serves /health, /ready and /metrics (CoreDNS's names); not served
    /// without it.
    #[arg(long)]
    pub dns_http_listen: Option<SocketAddr>,
    /// Cluster DNS options (CoreDNS's kubernetes and k8s_external plugins).
    #[command(flatten)]
    pub dns: crate::cmd::dns_options::DnsOptions,
    /// The node-local DNS cache (NodeLocal DNSCache).
    #[command(flatten)]
    pub node_local: node_local::NodeLocalDnsOptions,
    /// When a NetworkPolicy change denies connections that are already open, cut them too
    /// (their conntrack entries are deleted); by default a change applies to new connections
    /// only, as upstream intends.
    #[arg(long)]
    pub network_policy_cut_existing: bool,
    /// Components not to start (comma-separated).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub disable: Vec<Component>,
    /// Run containers of image REPOSITORY (no tag) as the program PATH of this machine
    /// (repeatable; there is no image runtime). svcnet's own image, `ghcr.io/svcnet/svcnet`, is
    /// always this binary, so the add-on manifests in `deploy/` run unchanged.
    #[arg(long = "image", value_name = "REPOSITORY=PATH", value_parser = parse_image)]
    pub images: Vec<(String, PathBuf)>,
    /// Where the API server keeps the objects (redb in the data dir, or etcd).
    #[command(flatten)]
    pub etcd: crate::cmd::etcd_flags::EtcdFlags,
}

/// The image svcnet's add-on manifests (`deploy/`) run.
pub const SVCNET_IMAGE: &str = "ghcr.io/svcnet/svcnet";

fn parse_image(s: &str) -> Result<(String, PathBuf), String> {
    let (repo, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not REPOSITORY=PATH"))?;
    if repo.is_empty() || path.is_empty() {
        return Err(format!("{s:?} is not REPOSITORY=PATH"));
    }
    Ok((repo.to_string(), PathBuf::from(path)))
}

pub async fn run(mut args: Args) -> anyhow::Result<()> {
    // From here on Ctrl-C or SIGTERM stops `up` the graceful way, also while it starts (it is
    // acted on once everything is up, so what was made is removed again).
    let mut shutdown = super::Shutdown::listen()?;
    args.data_dir = crate::cmd::absolute_data_dir(&args.data_dir)?;
    let disabled: BTreeSet<Component> = args.disable.iter().copied().collect();
    let with_agent = !disabled.contains(&Component::Agent);
    let with_proxy = with_agent && !disabled.contains(&Component::Proxy);
    // Without it, the node namespaces carry no inter-node pod routes: an add-on's job.
    let with_pod_network = !disabled.contains(&Component::PodNetwork);
    // Development without root: the userspace proxy binds loopback cluster IPs on this machine.
    let host_proxy = !with_agent
        && !disabled.contains(&Component::Proxy)
        && args.proxy_mode == svcnet_proxyd::ProxyMode::Userspace;
    if !with_agent && !disabled.contains(&Component::Proxy) && !host_proxy {
        tracing::warn!(
            "the kernel dataplanes program the node namespaces the agent creates; with the agent \
             disabled only --proxy-mode userspace runs (unprivileged, loopback service CIDR)"
        );
    }
    if with_agent {
        cluster::check_prerequisites(cluster::Needs {
            libnftables: with_proxy
                && !matches!(
                    args.proxy_mode,
                    svcnet_proxyd::ProxyMode::Iptables | svcnet_proxyd::ProxyMode::Ipvs
                ),
            // The node-local DNS cache installs its notrack table with the `nft` command.
            nft: args.node_local.node_local_dns,
            iptables: with_proxy
                && matches!(
                    args.proxy_mode,
                    svcnet_proxyd::ProxyMode::Iptables | svcnet_proxyd::ProxyMode::Ipvs
                ),
            ipvs: with_proxy && args.proxy_mode == svcnet_proxyd::ProxyMode::Ipvs,
        })?;
        if with_pod_network {
            args.pod_network.check_host().map_err(anyhow::Error::msg)?;
        }
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create the data dir {}", args.data_dir.display()))?;
    let dns_service_ip = objects::nth_address(&args.service_cidr, 10)?;
    // With node namespaces, the API server is also served on the host's underlay address (as
    // `listen_also` once the nodes exist) and advertised there: the `kubernetes` Service's
    // endpoint, which pods and host-network pods reach through their node's proxy.
    let underlay_host = std::net::Ipv4Addr::from(u32::from(args.underlay.network()) + 1);
    let config = svcnet_apiserver::ServerConfig {
        advertise_address: with_agent.then_some(underlay_host.into()),
        extra_sans: if with_agent {
            vec![underlay_host.into()]
        } else {
            Vec::new()
        },
        data_dir: args.data_dir.clone(),
        listen: args.api_listen,
        service_cidrs: args.service_cidr.clone(),
        node_port_range: args.node_port_range.0.clone(),
        lb_pool: Some(args.lb_pool),
        cluster_domain: args.cluster_domain.clone(),
        dns_service_ip,
        log_source: Some(streams::log_source(&args.data_dir)),
        exec_source: with_agent.then(|| streams::exec_source(&args.data_dir)),
        port_forward_source: with_agent.then(|| streams::port_forward_source(&args.data_dir)),
        attach_source: with_agent.then(streams::attach_source),
        storage: args.etcd.storage()?,
        ..Default::default()
    };
    let mut server = svcnet_apiserver::start(config)
        .await
        .context("cannot start the API server")?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let client = client_from_kubeconfig(&kubeconfig).await?;

    let cluster_config = ClusterConfig {
        prefix: args.prefix.clone(),
        nodes: usize::from(args.nodes),
        underlay: args.underlay,
        pod_cidr: args.pod_cidr,
        service_cidrs: args.service_cidr.clone(),
        lb_pool: args.lb_pool,
        pod_network: with_pod_network.then_some(args.pod_network),
    };
    // Dropping the topology removes every namespace, link and route it made, on every path out.
    let topology = if with_agent {
        Some(cluster::create_topology(&cluster_config, &args.data_dir).await?)
    } else {
        None
    };
    if let Some(t) = &topology {
        let addr = SocketAddr::new(t.host_ip().into(), server.addr().port());
        server
            .listen_also(addr)
            .await
            .context("cannot serve the API on the node underlay")?;
    }
    let nodes: Vec<NodeSpec> = match &topology {
        Some(topology) => cluster::node_specs(topology, cluster_config.pod_network),
        None => vec![NodeSpec {
            name: args
                .node_name
                .clone()
                .unwrap_or_else(objects::default_node_name),
            internal_ip: std::net::Ipv4Addr::LOCALHOST.into(),
            pod_cidr: first_subnet(args.pod_cidr).into(),
            annotations: Vec::new(),
        }],
    };
    for node in &nodes {
        objects::register_node(&client, node).await?;
        // The routes of host-gw/vxlan/ipip exist now; bgp's speakers report theirs once up,
        // and an add-on its own.
        if topology.is_some()
            && with_pod_network
            && args.pod_network != svcnet_agent::routes::PodNetwork::Bgp
        {
            svcnet_agent::podnet::condition::report_network_available(
                &client,
                &node.name,
                args.pod_network,
            )
            .await
            .with_context(|| format!("cannot set node {}'s NetworkUnavailable", node.name))?;
        }
    }
    if let Some(t) = &topology
        && !with_proxy
    {
        // The proxy is an add-on (deploy/svcnet.yaml): its pods reach the API directly.
        let addr = SocketAddr::new(t.host_ip().into(), server.addr().port());
        objects::ensure_services_endpoint(&client, addr).await?;
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    // Each registered node heartbeats through its Lease, as a kubelet does.
    {
        let client = client.clone();
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let stop = stopped(stop_rx.clone());
        tasks.spawn(async move {
            lease::run(client, names, stop).await;
            Ok(())
        });
    }
    if !disabled.contains(&Component::Controllers) {
        let opts = svcnet_controllers::ControllerOptions {
            node_name: nodes[0].name.clone(),
            schedulable_nodes: nodes.iter().map(|n| n.name.clone()).collect(),
            ..Default::default()
        };
        let client = client.clone();
        let stop = stopped(stop_rx.clone());
        tasks.spawn(async move {
            svcnet_controllers::run(client, opts, stop)
                .await
                .context("controllers")
        });
    }

    if !disabled.contains(&Component::Dns) {
        // One server for the host user, and with node namespaces one more on the host's bridge
        // address: that one is kube-dns's endpoint, reached by pods through the proxy.
        let pod_facing = topology
            .as_ref()
            .map(|t| SocketAddr::new(t.host_ip().into(), 53));
        objects::ensure_kube_dns(&client, dns_service_ip, pod_facing).await?;
        for listen in std::iter::once(args.dns_listen).chain(pod_facing) {
            let dns = start_dns(&args, listen, &client).await?;
            println!("cluster DNS: {} (udp and tcp)", dns.local_addr());
            let stop = stopped(stop_rx.clone());
            tasks.spawn(async move {
                stop.await;
                dns.shutdown().await.context("cluster DNS")
            });
        }
    }

    // The backend's daemons below run only when the pod network is svcnet up's own.
    let daemons = with_pod_network.then_some(args.pod_network);
    if let Some(topology) = &topology {
        let userspace = args.proxy_mode == svcnet_proxyd::ProxyMode::Userspace;
        // Under the userspace proxy each node's policy table trusts the proxies' connections,
        // which leave from the nodes' cni0 addresses (the proxies judge them).
        let proxy_sources: Vec<std::net::IpAddr> = if userspace && with_proxy {
            topology.nodes().iter().map(|n| n.gateway.into()).collect()
        } else {
            Vec::new()
        };
        for node in topology.nodes() {
            let netpol = (!disabled.contains(&Component::NetworkPolicy)).then(|| {
                netpol::NodeNetpol::new(
                    node,
                    args.network_policy_cut_existing,
                    proxy_sources.clone(),
                )
            });
            if with_proxy {
                let mut cfg = cluster::proxy_config(node, &cluster_config, args.proxy_mode);
                cfg.scheduler = args.scheduler;
                cfg.min_sync_period = args.min_sync_period;
                cfg.sync_period = args.sync_period;
                cfg.ipvs = args.ipvs.options();
                if let Some(np) = netpol.as_ref().filter(|_| userspace) {
                    cfg.admission = Some(np.judge());
                    cfg.upstream_source = Some(svcnet_userspace::UpstreamSource {
                        to: IpNet::V4(args.pod_cidr),
                        from: node.gateway.into(),
                    });
                }
                let client = client.clone();
                let stop = stopped(stop_rx.clone());
                let name = node.name.clone();
                tasks.spawn(async move {
                    svcnet_proxyd::run(cfg, client, stop)
                        .await
                        .with_context(|| format!("proxy on {name}"))
                });
            }
            if daemons == Some(svcnet_agent::routes::PodNetwork::Vxlan) {
                // flanneld's part: this node's VTEP entries follow the other Nodes' leases.
                let client = client.clone();
                let stop = stopped(stop_rx.clone());
                let node = node.clone();
                let direct = args.vxlan_direct_routing;
                tasks.spawn(async move {
                    svcnet_agent::podnet::run_vxlan_with(client, node, direct, stop).await;
                    Ok(())
                });
            }
            if daemons == Some(svcnet_agent::routes::PodNetwork::Bgp) {
                tasks.spawn(cluster::run_bgp(
                    client.clone(),
                    node.clone(),
                    args.pod_cidr,
                    args.data_dir.clone(),
                    stopped(stop_rx.clone()),
                ));
            }
            if daemons == Some(svcnet_agent::routes::PodNetwork::Udp) {
                // flanneld's UDP backend: the loop runs in this process (dies with it) and its
                // peer table follows the other Nodes' leases.
                let client = client.clone();
                let stop = stopped(stop_rx.clone());
                let node = node.clone();
                let cidr = args.pod_cidr;
                tasks.spawn(async move {
                    let name = node.name.clone();
                    svcnet_agent::podnet::udp::run_udp(client, node, cidr, stop)
                        .await
                        .with_context(|| format!("udp backend on {name}"))
                });
            }
            let mut cfg = cluster::agent_config(
                topology,
                node,
                &args.data_dir,
                dns_service_ip,
                &args.cluster_domain,
                &args.images,
            );
            cfg.network_from_addon = !with_pod_network;
            if let Some(np) = netpol {
                cfg.before_start = Some(np.clone());
                let client = client.clone();
                let stop = stopped(stop_rx.clone());
                let name = node.name.clone();
                tasks.spawn(async move {
                    netpol::run(client, np, stop)
                        .await
                        .with_context(|| format!("network policies on {name}"))
                });
            }
            let client = client.clone();
            let stop = stopped(stop_rx.clone());
            let name = node.name.clone();
            tasks.spawn(async move {
                svcnet_agent::run(client, cfg, stop)
                    .await
                    .with_context(|| format!("agent on {name}"))
            });
            println!(
                "node {}: InternalIP {}, pods {}, namespace {}",
                node.name, node.internal_ip, node.pod_cidr, node.netns
            );
        }
    }

    node_local::start_all(
        &args,
        topology.as_ref(),
        dns_service_ip,
        &mut tasks,
        &stop_rx,
    )?;

    if host_proxy {
        let cfg = svcnet_proxyd::ProxyConfig {
            node_name: nodes[0].name.clone(),
            mode: svcnet_proxyd::ProxyMode::Userspace,
            unprivileged: true,
            service_cidrs: args.service_cidr.clone(),
            cluster_cidrs: vec![IpNet::V4(args.pod_cidr)],
            scheduler: args.scheduler,
            min_sync_period: args.min_sync_period,
            sync_period: args.sync_period,
            ..Default::default()
        };
        let client = client.clone();
        let stop = stopped(stop_rx.clone());
        tasks.spawn(async move {
            svcnet_proxyd::run(cfg, client, stop)
                .await
                .context("userspace proxy")
        });
        println!(
            "userspace proxy: cluster IPs of {:?} bound on this machine",
            args.service_cidr
        );
    }

    println!("svcnet is ready: API server https://{}", server.addr());
    println!("kubeconfig: {}", kubeconfig.display());
    println!("  export KUBECONFIG={}", kubeconfig.display());
    let outcome = tokio::select! {
        () = shutdown.requested() => Ok(()),
        Some(res) = tasks.join_next() => match res {
            Ok(Ok(())) => Err(anyhow::anyhow!("a component stopped unexpectedly")),
            Ok(Err(err)) => Err(err),
            Err(err) => Err(anyhow::anyhow!("a component panicked: {err}")),
        },
    };
    println!("stopping");
    let _ = stop_tx.send(true);
    // The agents stop their pods and release their namespaces before the topology goes.
    while let Some(res) = tasks.join_next().await {
        match res {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!("while stopping: {err:#}"),
            Err(err) => tracing::warn!("while stopping: {err}"),
        }
    }
    if let Some(topology) = topology {
        let report = tokio::task::spawn_blocking(move || topology.destroy())
            .await
            .context("topology task")?
            .context("cannot remove the node namespaces")?;
        println!("removed: {report}");
    }
    server
        .shutdown()
        .await
        .context("API server did not stop cleanly")?;
    outcome
}

async fn start_dns(
    args: &Args,
    listen: SocketAddr,
    client: &kube::Client,
) -> anyhow::Result<svcnet_dns::RunningDns> {
    let mut zone = svcnet_dns::ZoneConfig::new(&args.cluster_domain)
        .with_context(|| format!("--cluster-domain {:?}", args.cluster_domain))?;
    zone.reverse_cidrs = args
        .service_cidr
        .iter()
        .copied()
        .chain([IpNet::V4(args.pod_cidr)])
        .collect();
    args.dns.apply(&mut zone)?;
    let config = svcnet_dns::DnsConfig {
        listen,
        zone,
        upstreams: (!args.dns_upstreams.is_empty()).then(|| args.dns_upstreams.clone()),
        debounce: std::time::Duration::from_millis(5),
        labels: args.dns.labels.clone(),
        http: args.dns_http_listen,
    };
    svcnet_dns::start(config, client.clone())
        .await
        .with_context(|| format!("cannot start cluster DNS on {listen}"))
}

/// The first /24 of the pod CIDR: the one node's pods when there is no topology.
fn first_subnet(pod_cidr: Ipv4Net) -> Ipv4Net {
    Ipv4Net::new(pod_cidr.network(), pod_cidr.prefix_len().max(24)).unwrap_or(pod_cidr)
}

/// Ctrl-C or SIGTERM.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Up {
        #[command(flatten)]
        args: super::Args,
    }

    /// The proxies' sync periods are `svcnet up`'s flags too, with `svcnet proxy`'s defaults and
    /// parsing (`auto` by default, `0s` syncs every change at once), and bad values name the
    /// problem.
    #[test]
    fn sync_periods_are_flags_of_up() {
        let up = Up::try_parse_from(["up"]).unwrap();
        assert_eq!(up.args.min_sync_period, svcnet_proxyd::MinSyncPeriod::Auto);
        assert_eq!(up.args.sync_period, std::time::Duration::from_secs(30));
        let up =
            Up::try_parse_from(["up", "--min-sync-period", "0s", "--sync-period", "2m"]).unwrap();
        assert_eq!(
            up.args.min_sync_period,
            svcnet_proxyd::MinSyncPeriod::Fixed(std::time::Duration::ZERO)
        );
        assert_eq!(up.args.sync_period, std::time::Duration::from_secs(120));
        let err = Up::try_parse_from(["up", "--min-sync-period", "soon"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"soon\" is not a duration"), "{err}");
    }

    /// `--disable pod-network` leaves the pod network to an add-on, beside the other parts.
    #[test]
    fn the_pod_network_can_be_left_to_an_add_on() {
        let up = Up::try_parse_from(["up", "--disable", "proxy,dns,pod-network"]).unwrap();
        assert_eq!(
            up.args.disable,
            [
                super::Component::Proxy,
                super::Component::Dns,
                super::Component::PodNetwork
            ]
        );
        let err = Up::try_parse_from(["up", "--disable", "pod-networks"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("pod-network"), "{err}");
    }

    /// kube-proxy's IPVS flags reach every node proxy's options; timeouts are whole seconds.
    #[test]
    fn ipvs_flags_are_kube_proxys() {
        let up = Up::try_parse_from(["up"]).unwrap();
        assert_eq!(up.args.ipvs.options(), svcnet_ipvs::NodeOptions::default());
        let up = Up::try_parse_from([
            "up",
            "--proxy-mode",
            "ipvs",
            "--ipvs-tcp-timeout",
            "15m",
            "--ipvs-tcpfin-timeout",
            "30s",
            "--ipvs-udp-timeout",
            "5",
            "--ipvs-strict-arp",
        ])
        .unwrap();
        let o = up.args.ipvs.options();
        assert_eq!(
            (
                o.timeouts.tcp,
                o.timeouts.tcp_fin,
                o.timeouts.udp,
                o.strict_arp
            ),
            (900, 30, 5, true)
        );
        let err = Up::try_parse_from(["up", "--ipvs-udp-timeout", "1500ms"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("whole seconds"), "{err}");
    }
}
