//! Upstream's serviceaccounts controller and root-ca-cert-publisher: every namespace that is not
//! terminating has a `default` ServiceAccount and the ConfigMap `kube-root-ca.crt` with the
//! cluster CA, created when the namespace appears and again when they are deleted.
//!
//! It wakes on every write of a Namespace or ServiceAccount (`AppState::accounts`) and every
//! [`PERIOD`], and then reconciles all namespaces. It never cancels a store call midway, so a
//! shutdown leaves no store read running behind it.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use crate::objects::{is_terminating, meta_str};
use crate::registry::{self, ResourceInfo};
use crate::state::SharedState;
use crate::status::ApiError;

/// The ServiceAccount every namespace gets.
pub const DEFAULT: &str = "default";
/// The ConfigMap of the cluster CA every namespace gets.
pub const ROOT_CA: &str = "kube-root-ca.crt";
/// A full pass at least this often (a missed wake-up is repaired).
const PERIOD: Duration = Duration::from_secs(30);

fn res(plural: &str) -> Result<&'static ResourceInfo, ApiError> {
    registry::lookup("", "v1", plural)
        .ok_or_else(|| ApiError::Internal(format!("{plural} are not registered")))
}

/// Creates the `default` ServiceAccount of every live namespace that lacks one.
pub(crate) async fn reconcile(state: &SharedState) -> Result<(), ApiError> {
    let accounts = res("serviceaccounts")?;
    let have: HashSet<String> = state
        .store
        .list(&accounts.prefix())
        .await?
        .items
        .iter()
        .filter(|sa| meta_str(sa, "name") == Some(DEFAULT))
        .filter_map(|sa| meta_str(sa, "namespace").map(str::to_string))
        .collect();
    let namespaces = state.store.list(&res("namespaces")?.prefix()).await?;
    // Upstream's root-ca-cert-publisher: the cluster CA as `kube-root-ca.crt` in every
    // namespace, which the pods' `kube-api-access-…` volumes project as `ca.crt`.
    let ca = std::fs::read_to_string(state.cfg.data_dir.join("pki").join("ca.crt")).ok();
    for ns in namespaces.items.iter().filter(|ns| !is_terminating(ns)) {
        let name = meta_str(ns, "name").unwrap_or("");
        if name.is_empty() {
            continue;
        }
        if let Some(ca) = &ca {
            let cm = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": ROOT_CA, "namespace": name},
                "data": {"ca.crt": ca},
            });
            crate::bootstrap::ensure(state, res("configmaps")?, cm, &["data"], true).await?;
        }
        if have.contains(name) {
            continue;
        }
        let sa = json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT, "namespace": name},
        });
        crate::bootstrap::ensure(state, accounts, sa, &[], true).await?;
    }
    Ok(())
}

/// Runs until shutdown.
pub async fn run(state: SharedState) {
    while !state.shutdown.is_cancelled() {
        if let Err(e) = reconcile(&state).await {
            tracing::warn!("serviceaccounts controller: {e}");
        }
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = state.accounts.notified() => {}
            _ = tokio::time::sleep(PERIOD) => {}
        }
    }
}
