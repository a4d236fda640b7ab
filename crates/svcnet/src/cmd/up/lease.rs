//! Node heartbeats as the kubelet sends them: a Lease per node in `kube-node-lease`, named
//! after the node, held by it (`holderIdentity`), `leaseDurationSeconds` 40, its `renewTime`
//! renewed every 10 s (a quarter of the duration, upstream's renew interval), owned by the
//! Node so it goes with it. `kubectl describe node` shows it (Lease: HolderIdentity,
//! AcquireTime, RenewTime), and anything that watches node health the way the node lifecycle
//! controller does sees the nodes `svcnet up` runs as alive.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

/// upstream's node lease namespace and duration.
pub const NAMESPACE: &str = "kube-node-lease";
pub const DURATION_SECONDS: i32 = 40;
/// The field manager of node leases: upstream's kubelet writes them.
const FIELD_MANAGER: &str = "kubelet";
/// How often the lease is renewed (upstream: a quarter of the duration).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// The Lease of `node` (whose uid is `uid`) renewed at `now` (an RFC 3339 time with
/// microseconds, a `MicroTime`).
pub fn lease_object(node: &str, uid: &str, now: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node,
                "uid": uid,
            }],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": DURATION_SECONDS,
            "renewTime": now,
        },
    })
}

fn micro_time() -> String {
    // A MicroTime: RFC 3339 with exactly six fractional digits.
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// Creates the node's Lease or renews it (and puts back what someone else changed).
pub async fn renew(client: &kube::Client, node: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let uid = nodes
        .get(node)
        .await
        .with_context(|| format!("reading node {node}"))?
        .uid()
        .unwrap_or_default();
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let wanted = lease_object(node, &uid, &micro_time());
    match leases
        .get_opt(node)
        .await
        .context("reading the node lease")?
    {
        None => {
            let lease: Lease = serde_json::from_value(wanted).context("the node lease")?;
            leases
                .create(
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..PostParams::default()
                    },
                    &lease,
                )
                .await
                .with_context(|| format!("creating the lease of node {node}"))?;
        }
        Some(_) => {
            let patch = json!({"metadata": {"ownerReferences": wanted["metadata"]["ownerReferences"]}, "spec": wanted["spec"]});
            leases
                .patch(
                    node,
                    &PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..PatchParams::default()
                    },
                    &Patch::Merge(&patch),
                )
                .await
                .with_context(|| format!("renewing the lease of node {node}"))?;
        }
    }
    Ok(())
}

/// Renews every node's Lease every [`RENEW_INTERVAL`] until `stop` resolves; a failure is
/// logged and retried at the next renewal, as the kubelet does.
pub async fn run(
    client: kube::Client,
    nodes: Vec<String>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        for node in &nodes {
            if let Err(e) = renew(&client, node).await {
                tracing::warn!("node lease of {node}: {e:#}");
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(RENEW_INTERVAL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_is_the_kubelets() {
        let l = lease_object("node-1", "u-1", "2026-01-01T00:00:00.000000Z");
        let lease: Lease = serde_json::from_value(l).unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("node-1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert!(spec.renew_time.is_some());
        assert_eq!(lease.metadata.namespace.as_deref(), Some("kube-node-lease"));
        let owner = &lease.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "node-1", "u-1")
        );
        let t = micro_time();
        assert_eq!(t.len(), "2026-01-01T00:00:00.000000Z".len(), "{t}");
    }
}
