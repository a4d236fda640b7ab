//! How a node add-on's pod tells an uninstall from a restart when it is stopped. A proxy that
//! is replaced (a rolling update, an eviction, a node drain) keeps its rules, as kube-proxy
//! does, so traffic flows until the next one takes them over; a proxy whose add-on is deleted
//! removes them, so that `kubectl delete -f deploy/svcnet.yaml` leaves the nodes clean (the
//! CNI installer likewise removes what it installed). The pod learns who it is from the
//! downward API (`POD_NAME`, `POD_NAMESPACE`) and asks the API server, within a few seconds:
//! - its DaemonSet is gone or being deleted: an uninstall;
//! - its ServiceAccount's credentials are refused (401) or its role is gone (403): the add-on's
//!   ServiceAccounts and roles are deleted with it (before the DaemonSets, in the file's
//!   order), so this is an uninstall too;
//! - its DaemonSet is there: a restart;
//! - anything else (the API unreachable, not in a pod, no DaemonSet owner): it cannot tell,
//!   and it keeps what it installed, which is always safe for traffic.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;

/// Why the add-on's pod is stopping, as far as it can tell, with the reason for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopping {
    Uninstall(String),
    Restart(String),
}

/// The downward API variables the add-on's manifests set.
const POD_NAME: &str = "POD_NAME";
const POD_NAMESPACE: &str = "POD_NAMESPACE";

/// Asks the API server why this pod is stopping (bounded: 5 s in all).
pub async fn why_stopping(client: &kube::Client) -> Stopping {
    let (Ok(name), Ok(ns)) = (std::env::var(POD_NAME), std::env::var(POD_NAMESPACE)) else {
        return Stopping::Restart(format!(
            "not told its pod ({POD_NAME}/{POD_NAMESPACE} unset)"
        ));
    };
    match tokio::time::timeout(Duration::from_secs(5), ask(client, &ns, &name)).await {
        Ok(s) => s,
        Err(_) => Stopping::Restart("the API server did not answer within 5 s".into()),
    }
}

async fn ask(client: &kube::Client, ns: &str, name: &str) -> Stopping {
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
    let pod = match pods.get_opt(name).await {
        Ok(Some(pod)) => pod,
        Ok(None) => return Stopping::Restart(format!("its pod {ns}/{name} is gone")),
        Err(e) => return judge(e, &format!("reading its pod {ns}/{name}")),
    };
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let Some(owner) = owner else {
        return Stopping::Restart(format!("pod {ns}/{name} has no DaemonSet owner"));
    };
    let sets: kube::Api<DaemonSet> = kube::Api::namespaced(client.clone(), ns);
    match sets.get_opt(&owner.name).await {
        Ok(None) => Stopping::Uninstall(format!("DaemonSet {ns}/{} was deleted", owner.name)),
        Ok(Some(ds)) if ds.metadata.uid.as_deref() != Some(owner.uid.as_str()) => {
            // Deleted and created again under the same name: the old add-on is gone, and the
            // new one's pod takes over the node.
            Stopping::Restart(format!("DaemonSet {ns}/{} was re-created", owner.name))
        }
        Ok(Some(ds)) if ds.metadata.deletion_timestamp.is_some() => {
            Stopping::Uninstall(format!("DaemonSet {ns}/{} is being deleted", owner.name))
        }
        Ok(Some(_)) => Stopping::Restart(format!(
            "DaemonSet {ns}/{} remains (an update or an eviction)",
            owner.name
        )),
        Err(e) => judge(e, &format!("reading DaemonSet {ns}/{}", owner.name)),
    }
}

/// A refused request is the add-on's identity deleted with it; any other error says nothing.
fn judge(e: kube::Error, what: &str) -> Stopping {
    match &e {
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => {
            Stopping::Uninstall(format!(
                "{what}: {} ({}): its ServiceAccount or role was removed",
                status.code, status.message
            ))
        }
        _ => Stopping::Restart(format!("{what}: {e}; cannot tell")),
    }
}
