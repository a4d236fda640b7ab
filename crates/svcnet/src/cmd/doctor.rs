//! `svcnet doctor [svc/NAME | -A]`: checks Services and what they depend on for the mistakes
//! people make (see `svcnet-doctor`), explains each with its fix, and exits non-zero when one
//! is an error, so it works in scripts.
//!
//! Beside the objects it reads the node proxies' status Leases (are they running, are their
//! rules as new as each service) and looks every ExternalName target up: a name in the
//! cluster domain as the Service it names, any other through the resolvers the cluster DNS
//! forwards to (this machine's resolv.conf, or `--nameserver`), as pods would.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, Name, RecordType};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;
use svcnet_dns::server::{Forwarder, parse_resolv_conf};
use svcnet_doctor::{Cluster, Finding, Resolution, Severity, Snapshot, diagnose};
use svcnet_proxy::status::{self, ProxyStatus};

/// Flags of `svcnet doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// One service to check (`svc/NAME` or `NAME`); default: every service of the namespace.
    pub target: Option<String>,
    /// The namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Every namespace.
    #[arg(short = 'A', long, conflicts_with = "target")]
    pub all_namespaces: bool,
    /// Kubeconfig of the API server (`svcnet up` writes one into its data dir).
    #[arg(long, env = "KUBECONFIG", default_value = "svcnet-data/kubeconfig")]
    pub kubeconfig: PathBuf,
    /// `text` or `json`.
    #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// The cluster's node port range, FIRST-LAST.
    #[arg(long, default_value = "30000-32767")]
    pub node_port_range: String,
    /// The cluster's DNS domain: ExternalName targets under `svc.DOMAIN` are checked as the
    /// Services they name.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Look other ExternalName targets up at this resolver (IP:PORT) instead of the ones in
    /// /etc/resolv.conf (those the cluster DNS forwards to).
    #[arg(long)]
    pub nameserver: Option<SocketAddr>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let (first, last) = args
        .node_port_range
        .split_once('-')
        .and_then(|(a, b)| Some((a.parse::<i32>().ok()?, b.parse::<i32>().ok()?)))
        .filter(|(a, b)| a <= b)
        .with_context(|| {
            format!(
                "--node-port-range {:?}: expected FIRST-LAST",
                args.node_port_range
            )
        })?;
    let only = match args.target.as_deref() {
        None => None,
        Some(t) => {
            let name = t
                .strip_prefix("svc/")
                .or_else(|| t.strip_prefix("service/"))
                .or_else(|| t.strip_prefix("services/"))
                .unwrap_or(t);
            if name.is_empty() || name.contains('/') {
                anyhow::bail!("{t:?} is not a service: give svc/NAME or NAME");
            }
            Some(name.to_string())
        }
    };
    let client = super::kubeconfig::client_from_kubeconfig(&args.kubeconfig).await?;
    let ns = (!args.all_namespaces).then_some(args.namespace.as_str());
    let cluster = Cluster {
        node_port_range: first..=last,
    };
    let only_key = only.as_deref().map(|n| (args.namespace.as_str(), n));
    let mut snap = snapshot(&client, ns).await?;
    if let Some(name) = &only
        && !snap
            .services
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some(name))
    {
        anyhow::bail!("service {}/{name} not found", args.namespace);
    }
    snap.external_names = resolve_targets(&client, &snap, only.as_deref(), &args).await;
    let mut findings = diagnose(&snap, &cluster, only_key);
    // A proxy may be a moment behind a change made just now: look again before saying so
    // (the objects and the proxies' leases; the names were just looked up).
    if findings.iter().any(stale) {
        tokio::time::sleep(STALE_RECHECK).await;
        let mut again = snapshot(&client, ns).await?;
        again.external_names = std::mem::take(&mut snap.external_names);
        findings = diagnose(&again, &cluster, only_key);
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    if args.output == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&findings).context("encoding the findings")?
        );
    } else {
        for f in &findings {
            println!("{f}");
        }
        let warnings = findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .count();
        println!(
            "{} service(s) checked: {errors} error(s), {warnings} warning(s)",
            only.as_ref().map_or(snap.services.len(), |_| 1)
        );
    }
    if errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// How long doctor waits before it says a proxy's rules are stale.
const STALE_RECHECK: Duration = Duration::from_secs(3);

fn stale(f: &Finding) -> bool {
    f.check == "proxy-rules-stale"
}

/// The objects and proxy leases the checks look at, read now.
async fn snapshot(client: &kube::Client, ns: Option<&str>) -> anyhow::Result<Snapshot> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), status::NAMESPACE);
    let proxies = leases
        .list(&ListParams::default().labels(status::NODE_LABEL))
        .await
        .context("listing the proxies' status leases")?
        .items
        .iter()
        .filter_map(ProxyStatus::from_lease)
        .collect();
    Ok(Snapshot {
        services: list::<Service>(client, ns).await?,
        pods: list::<Pod>(client, ns).await?,
        statefulsets: list::<StatefulSet>(client, ns).await?,
        slices: list::<EndpointSlice>(client, ns).await?,
        nodes: {
            let api: Api<Node> = Api::all(client.clone());
            api.list(&ListParams::default())
                .await
                .context("listing nodes")?
                .items
        },
        proxies,
        now: Some(k8s_openapi::jiff::Timestamp::now()),
        external_names: BTreeMap::new(),
    })
}

/// What the ExternalName targets of the services in scope (`only`: that one) resolve to.
async fn resolve_targets(
    client: &kube::Client,
    snap: &Snapshot,
    only: Option<&str>,
    args: &Args,
) -> BTreeMap<String, Resolution> {
    let targets: std::collections::BTreeSet<String> = snap
        .services
        .iter()
        .filter(|s| only.is_none_or(|n| s.metadata.name.as_deref() == Some(n)))
        .filter_map(|s| s.spec.as_ref())
        .filter(|s| s.type_.as_deref() == Some("ExternalName"))
        .filter_map(|s| s.external_name.clone())
        .filter(|t| !t.is_empty() && t.parse::<std::net::IpAddr>().is_err())
        .collect();
    let upstreams = match args.nameserver {
        Some(a) => vec![a],
        None => parse_resolv_conf(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default()),
    };
    let forwarder = Forwarder::new(upstreams, None, Duration::from_secs(2));
    let mut resolved = BTreeMap::new();
    for target in targets {
        let r = resolve(client, &forwarder, &args.cluster_domain, &target).await;
        resolved.insert(target, r);
    }
    resolved
}

/// What an ExternalName target resolves to, as a pod would find it.
async fn resolve(
    client: &kube::Client,
    forwarder: &Forwarder,
    cluster_domain: &str,
    target: &str,
) -> Resolution {
    let bare = target.trim_end_matches('.');
    let suffix = format!(".svc.{}", cluster_domain.trim_end_matches('.'));
    if let Some(prefix) = bare.strip_suffix(&suffix) {
        // SERVICE.NS (or HOSTNAME.SERVICE.NS for a StatefulSet's pod): the Service decides.
        let labels: Vec<&str> = prefix.rsplitn(3, '.').collect();
        let (Some(ns), Some(name)) = (labels.first(), labels.get(1)) else {
            return Resolution::NoSuchName(format!(
                "a name under {suffix} needs SERVICE.NAMESPACE before it"
            ));
        };
        let api: Api<Service> = Api::namespaced(client.clone(), ns);
        return match api.get_opt(name).await {
            Ok(Some(s)) => {
                Resolution::Resolves(s.spec.and_then(|s| s.cluster_ip).into_iter().collect())
            }
            Ok(None) => Resolution::NoSuchName(format!("no Service {name} in namespace {ns}")),
            Err(e) => Resolution::Unknown(format!("reading service {ns}/{name}: {e}")),
        };
    }
    let Ok(name) = Name::from_ascii(format!("{bare}.")) else {
        return Resolution::NoSuchName("not a valid DNS name".into());
    };
    let mut addresses = Vec::new();
    let mut nxdomain = false;
    for qtype in [RecordType::A, RecordType::AAAA] {
        match forwarder.resolve(&name, qtype, DNSClass::IN).await {
            Ok(up) => match up.message.response_code {
                ResponseCode::NoError => addresses.extend(
                    up.message
                        .answers
                        .iter()
                        .filter(|r| r.record_type() == qtype)
                        .map(|r| r.data.to_string()),
                ),
                ResponseCode::NXDomain => nxdomain = true,
                other => {
                    return Resolution::Unknown(format!("the resolver answered {other}"));
                }
            },
            Err(e) => return Resolution::Unknown(e.to_string()),
        }
    }
    match (addresses.is_empty(), nxdomain) {
        (false, _) => Resolution::Resolves(addresses),
        (true, true) => Resolution::NoSuchName("NXDOMAIN: the name does not exist".into()),
        (true, false) => Resolution::NoSuchName("the name has no A or AAAA record".into()),
    }
}

async fn list<K>(client: &kube::Client, ns: Option<&str>) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + for<'de> k8s_openapi::serde::Deserialize<'de>
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let plural = K::plural(&Default::default()).to_string();
    Ok(api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing {plural}"))?
        .items)
}
