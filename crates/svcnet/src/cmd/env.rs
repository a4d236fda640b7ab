//! `svcnet env`: the service environment variables a pod created now would get.

use std::path::PathBuf;

use anyhow::Context;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::ListParams;

/// Flags of `svcnet env`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig of the API server.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The pod's namespace.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    /// Behave as a pod with `enableServiceLinks: false` (only the master service's variables).
    #[arg(long)]
    pub no_service_links: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = super::kubeconfig::client_from_kubeconfig(&args.kubeconfig).await?;
    let mut services: Vec<Service> = Vec::new();
    if !args.no_service_links {
        let api: Api<Service> = Api::namespaced(client.clone(), &args.namespace);
        let list = api
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing services in namespace {}", args.namespace))?;
        services.extend(list.items);
    }
    let default: Api<Service> = Api::namespaced(client, "default");
    if let Some(master) = default
        .get_opt("kubernetes")
        .await
        .context("reading service default/kubernetes")?
    {
        services.push(master);
    }
    let vars = svcnet_dns::service_env_vars(&args.namespace, &services, !args.no_service_links);
    for var in vars {
        println!("{var}");
    }
    Ok(())
}
