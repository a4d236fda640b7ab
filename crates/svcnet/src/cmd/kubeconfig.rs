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

/// A kube client from `--kubeconfig` when given, else as client-go's in-cluster rules say:
/// `$KUBECONFIG`, `~/.kube/config`, or a pod's service account
/// (`KUBERNETES_SERVICE_HOST`/`PORT` and `/var/run/secrets/kubernetes.io/serviceaccount`).
pub async fn client(path: Option<&Path>) -> anyhow::Result<kube::Client> {
    match path {
        Some(path) => client_from_kubeconfig(path).await,
        None => kube::Client::try_default()
            .await
            .context("no --kubeconfig, and no $KUBECONFIG, ~/.kube/config or in-cluster config"),
    }
}
