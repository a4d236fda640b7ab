//! Building a kube-rs client from a kubeconfig file, shared by the subcommands.

use std::path::Path;

use anyhow::Context as _;

/// A kube client for the current context of the kubeconfig at `path`.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .with_context(|| format!("invalid kubeconfig {}", path.display()))?;
    kube::Client::try_from(config).context("cannot build an API client")
}
