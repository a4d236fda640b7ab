//! Publishes the proxy's account of itself (`svcnet_proxy::status`): its Lease in
//! `kube-system`, written after syncs (at most once a second) and renewed every
//! [`RENEW_SECONDS`] while the proxy runs, so `svcnet doctor` can tell a running proxy with
//! current rules from one that stopped, fails to sync or lags behind. A graceful stop says so
//! at once ([`ProxyStatus::stopped`]); a killed proxy's lease expires.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use svcnet_proxy::status::{NAMESPACE, ProxyStatus, RENEW_SECONDS, lease_name};
use tokio::sync::watch;

/// Writes at most this often when the status changes.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Creates or updates the lease of `status`.
async fn write(api: &Api<Lease>, status: &ProxyStatus) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    let name = lease_name(&status.node);
    match api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(status.merge_patch(now)),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => api
            .create(&PostParams::default(), &status.lease(now))
            .await
            .map(|_| ()),
        other => other.map(|_| ()),
    }
}

/// Keeps the lease current until `status`'s sender is gone; then writes the last status once
/// more (a graceful stop marks it stopped first). Failures are logged once until a write
/// succeeds again, and retried at the next change or renewal.
pub async fn publish(client: Client, mut status: watch::Receiver<ProxyStatus>) {
    let api: Api<Lease> = Api::namespaced(client, NAMESPACE);
    let mut failing = false;
    loop {
        let current = status.borrow_and_update().clone();
        match write(&api, &current).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("proxy status lease written again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(
                    "writing the proxy status lease {NAMESPACE}/{}: {e}; retrying",
                    lease_name(&current.node)
                );
            }
            Err(e) => tracing::debug!("writing the proxy status lease: {e}"),
        }
        let stopping = tokio::select! {
            biased;
            changed = status.changed() => changed.is_err(),
            _ = tokio::time::sleep(Duration::from_secs(RENEW_SECONDS)) => false,
        };
        if stopping {
            return;
        }
        // Once the sender is gone its last value (the stop) is written at once.
        if status.has_changed().is_ok() {
            tokio::time::sleep(MIN_INTERVAL).await;
        }
    }
}
