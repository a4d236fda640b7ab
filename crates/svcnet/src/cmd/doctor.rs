//! `svcnet doctor [svc/NAME | -A]`: checks Services and what they depend on for the mistakes
//! people make (see `svcnet-doctor`), explains each with its fix, and exits non-zero when one
//! is an error, so it works in scripts.

use std::path::PathBuf;

use anyhow::Context;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::Api;
use kube::api::ListParams;
use svcnet_doctor::{Cluster, Severity, Snapshot, diagnose};

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
    let snap = Snapshot {
        services: list::<Service>(&client, ns).await?,
        pods: list::<Pod>(&client, ns).await?,
        statefulsets: list::<StatefulSet>(&client, ns).await?,
        nodes: {
            let api: Api<Node> = Api::all(client.clone());
            api.list(&ListParams::default())
                .await
                .context("listing nodes")?
                .items
        },
    };
    if let Some(name) = &only
        && !snap
            .services
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some(name))
    {
        anyhow::bail!("service {}/{name} not found", args.namespace);
    }
    let cluster = Cluster {
        node_port_range: first..=last,
    };
    let findings = diagnose(
        &snap,
        &cluster,
        only.as_deref().map(|n| (args.namespace.as_str(), n)),
    );
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
