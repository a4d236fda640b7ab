//! `svcnet up`: the whole system on this machine.
//!
//! Starts the API server over the embedded store, registers this machine as a Node, and runs the
//! controllers, cluster DNS and (with node namespaces) the proxy in-process. Each component can be
//! switched off with `--disable`. Ctrl-C stops everything cleanly; state in the data dir survives.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context as _;

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
    /// Directory holding the store, certificates and the kubeconfig; survives restarts.
    #[arg(long, default_value = "./svcnet-data")]
    pub data_dir: PathBuf,
    /// Address the Kubernetes API server listens on (HTTPS).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub api_listen: SocketAddr,
    /// Service CIDR(s) cluster IPs are allocated from; comma-separated for dual-stack.
    #[arg(long, value_delimiter = ',', default_value = "10.96.0.0/12")]
    pub service_cidr: Vec<ipnet::IpNet>,
    /// Range node ports are allocated from.
    #[arg(long, default_value = "30000-32767")]
    pub node_port_range: PortRange,
    /// Pool that LoadBalancer services get their ingress IP from (a range svcnet owns).
    #[arg(long, default_value = "10.200.0.0/24")]
    pub lb_pool: ipnet::IpNet,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The pod network; this node owns its first /24.
    #[arg(long, default_value = "10.244.0.0/24")]
    pub pod_cidr: ipnet::IpNet,
    /// Name of the Node this machine registers as.
    #[arg(long)]
    pub node_name: Option<String>,
    /// UDP and TCP address cluster DNS listens on.
    #[arg(long, default_value = "127.0.0.1:1053")]
    pub dns_listen: SocketAddr,
    /// Upstream resolvers for names outside the cluster (repeatable); default: /etc/resolv.conf's.
    #[arg(long = "dns-upstream")]
    pub dns_upstreams: Vec<SocketAddr>,
    /// Components not to start (comma-separated).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub disable: Vec<Component>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let disabled: BTreeSet<Component> = args.disable.iter().copied().collect();
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create the data dir {}", args.data_dir.display()))?;
    let node_name = match &args.node_name {
        Some(name) => name.clone(),
        None => default_node_name(),
    };
    let dns_service_ip = nth_address(&args.service_cidr, 10)?;
    let config = svcnet_apiserver::ServerConfig {
        data_dir: args.data_dir.clone(),
        listen: args.api_listen,
        service_cidrs: args.service_cidr.clone(),
        node_port_range: args.node_port_range.0.clone(),
        lb_pool: Some(args.lb_pool),
        cluster_domain: args.cluster_domain.clone(),
        dns_service_ip,
        ..Default::default()
    };
    let server = svcnet_apiserver::start(config)
        .await
        .context("cannot start the API server")?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let client = client_from_kubeconfig(&kubeconfig).await?;
    register_node(&client, &node_name, &args.pod_cidr).await?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    if !disabled.contains(&Component::Controllers) {
        let opts = svcnet_controllers::ControllerOptions {
            node_name: node_name.clone(),
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
        ensure_kube_dns_service(&client, dns_service_ip).await?;
        let mut zone = svcnet_dns::ZoneConfig::new(&args.cluster_domain)
            .with_context(|| format!("--cluster-domain {:?}", args.cluster_domain))?;
        zone.reverse_cidrs = args
            .service_cidr
            .iter()
            .copied()
            .chain([args.pod_cidr])
            .collect();
        let config = svcnet_dns::DnsConfig {
            listen: args.dns_listen,
            zone,
            upstreams: (!args.dns_upstreams.is_empty()).then(|| args.dns_upstreams.clone()),
            debounce: std::time::Duration::from_millis(5),
        };
        let dns = svcnet_dns::start(config, client.clone())
            .await
            .with_context(|| format!("cannot start cluster DNS on {}", args.dns_listen))?;
        println!("cluster DNS: {} (udp and tcp)", dns.local_addr());
        let stop = stopped(stop_rx.clone());
        tasks.spawn(async move {
            stop.await;
            dns.shutdown().await.context("cluster DNS")
        });
    }

    println!("svcnet is ready: API server https://{}", server.addr());
    println!("kubeconfig: {}", kubeconfig.display());
    println!("  export KUBECONFIG={}", kubeconfig.display());
    tokio::select! {
        res = tokio::signal::ctrl_c() => res.context("cannot wait for Ctrl-C")?,
        Some(res) = tasks.join_next() => {
            let _ = stop_tx.send(true);
            let _ = server.shutdown().await;
            return match res {
                Ok(Ok(())) => Err(anyhow::anyhow!("a component stopped unexpectedly")),
                Ok(Err(err)) => Err(err),
                Err(err) => Err(anyhow::anyhow!("a component panicked: {err}")),
            };
        }
    }
    println!("stopping");
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    server
        .shutdown()
        .await
        .context("API server did not stop cleanly")?;
    Ok(())
}

async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn client_from_kubeconfig(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .context("invalid kubeconfig")?;
    kube::Client::try_from(config).context("cannot build an API client")
}

/// Creates `kube-system/kube-dns` (cluster IP: the tenth address of the service CIDR, 10.96.0.10 by
/// default, port 53 over UDP and TCP) unless it exists,
/// so that pods find cluster DNS through the proxy like any other Service.
async fn ensure_kube_dns_service(
    client: &kube::Client,
    ip: std::net::IpAddr,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Service;
    let services: kube::Api<Service> = kube::Api::namespaced(client.clone(), "kube-system");
    if services
        .get_opt("kube-dns")
        .await
        .context("cannot read kube-system/kube-dns")?
        .is_some()
    {
        return Ok(());
    }
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "kube-dns",
            "namespace": "kube-system",
            "labels": { "k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS" },
        },
        "spec": {
            "clusterIP": ip.to_string(),
            "ports": [
                { "name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53 },
                { "name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53 },
            ],
        },
    }))
    .context("kube-dns service object")?;
    services
        .create(&Default::default(), &service)
        .await
        .context("cannot create kube-system/kube-dns")?;
    Ok(())
}

/// Registers (or refreshes) the Node object for this machine: Ready, its addresses and pod CIDR.
async fn register_node(
    client: &kube::Client,
    name: &str,
    pod_cidr: &ipnet::IpNet,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let now = k8s_openapi::jiff::Timestamp::now();
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH,
                "node-role.kubernetes.io/control-plane": "",
            },
        },
        "spec": { "podCIDR": pod_cidr.to_string(), "podCIDRs": [pod_cidr.to_string()] },
    }))
    .context("node object")?;
    let existing = nodes
        .get_opt(name)
        .await
        .with_context(|| format!("cannot read node {name}"))?;
    let mut current = match existing {
        Some(node) => node,
        None => nodes
            .create(&Default::default(), &node)
            .await
            .with_context(|| format!("cannot register node {name}"))?,
    };
    let status = serde_json::json!({
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "SvcnetReady",
            "message": "svcnet node is ready",
            "lastHeartbeatTime": now.to_string(),
            "lastTransitionTime": now.to_string(),
        }],
        "addresses": [
            { "type": "InternalIP", "address": "127.0.0.1" },
            { "type": "Hostname", "address": name },
        ],
        "nodeInfo": {
            "architecture": std::env::consts::ARCH,
            "operatingSystem": "linux",
            "kubeletVersion": concat!("svcnet-", env!("CARGO_PKG_VERSION")),
            "kubeProxyVersion": concat!("svcnet-", env!("CARGO_PKG_VERSION")),
            "containerRuntimeVersion": "svcnet://process",
            "kernelVersion": "", "osImage": "", "machineID": "", "systemUUID": "", "bootID": "",
        },
    });
    current.status = Some(serde_json::from_value(status).context("node status")?);
    nodes
        .replace_status(name, &Default::default(), &current)
        .await
        .with_context(|| format!("cannot update the status of node {name}"))?;
    Ok(())
}

/// The `n`th address of the first service CIDR (kubeadm's convention puts cluster DNS at the tenth).
fn nth_address(cidrs: &[ipnet::IpNet], n: u32) -> anyhow::Result<std::net::IpAddr> {
    let cidr = cidrs
        .first()
        .context("--service-cidr needs at least one CIDR")?;
    let ip = match cidr.network() {
        std::net::IpAddr::V4(net) => std::net::IpAddr::V4((u32::from(net) + n).into()),
        std::net::IpAddr::V6(net) => std::net::IpAddr::V6((u128::from(net) + u128::from(n)).into()),
    };
    anyhow::ensure!(
        cidr.contains(&ip),
        "--service-cidr {cidr} is too small to hold the DNS service IP"
    );
    Ok(ip)
}

fn default_node_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches(|c| c == '-' || c == '.').to_string();
    if name.is_empty() {
        "svcnet-node".to_string()
    } else {
        name
    }
}
