//! Background garbage collection: dependents whose owners are all gone are deleted, and
//! terminating namespaces are emptied and then removed. Runs after every delete (debounced)
//! and periodically, so a crash between an owner's delete and its dependents' is repaired.
//!
//! It runs in every API server, also when several share one etcd, and that is safe because
//! every step is idempotent and conditional: a dependent is deleted with a UID precondition
//! through the client's delete path (a second server's delete of the same object finds it gone
//! or terminating and moves on), and a namespace is removed by a read-modify-write that
//! deletes it only while it is still terminating. Two servers sweeping at once do the same
//! work twice at worst, never a different thing. It stays in the API server rather than in the
//! leader-elected controller-manager (upstream's home for it) so that a cluster of API servers
//! alone, or `svcnet up` with its controllers disabled, still empties deleted namespaces.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use svcnet_store::Mutation;

use crate::deletion::{DeleteOptions, delete_one};
use crate::objects::{is_terminating, meta_str, name_of};
use crate::registry::{self, ResourceInfo};
use crate::state::SharedState;
use crate::status::ApiError;

const PERIOD: Duration = Duration::from_secs(30);
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Runs until shutdown.
pub async fn run(state: SharedState) {
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = state.gc.notified() => {}
            _ = tokio::time::sleep(PERIOD) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        // Repeat while a pass deletes something: dependents of dependents go next.
        for _ in 0..16 {
            match sweep(&state).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("garbage collection: {e}");
                    break;
                }
            }
        }
    }
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn resource_of(obj: &Value) -> Option<&'static ResourceInfo> {
    let api_version = obj.get("apiVersion")?.as_str()?;
    let kind = obj.get("kind")?.as_str()?;
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    registry::by_kind(group, kind)
}

/// One pass; returns how many objects it deleted.
async fn sweep(state: &SharedState) -> Result<usize, ApiError> {
    let all = state.store.list("/").await?.items;
    let uids: HashSet<&str> = all.iter().filter_map(|o| meta_str(o, "uid")).collect();
    let terminating: HashSet<&str> = all
        .iter()
        .filter(|o| o.get("kind").and_then(Value::as_str) == Some("Namespace") && is_terminating(o))
        .map(name_of)
        .collect();
    let mut deleted = 0;
    let mut remaining_in: HashSet<String> = HashSet::new();
    for obj in &all {
        let Some(res) = resource_of(obj) else {
            continue;
        };
        let ns = meta_str(obj, "namespace");
        let in_terminating = ns.is_some_and(|n| terminating.contains(n));
        let owners = owner_uids(obj);
        let orphaned = !owners.is_empty() && owners.iter().all(|u| !uids.contains(u.as_str()));
        if !(in_terminating || orphaned) {
            continue;
        }
        if let Some(n) = ns {
            remaining_in.insert(n.to_string());
        }
        if is_terminating(obj) {
            continue; // already waiting for its finalizers
        }
        // The same path as a client's DELETE: pods bound to a node terminate gracefully.
        let opts = DeleteOptions {
            uid: meta_str(obj, "uid").map(str::to_string),
            ..Default::default()
        };
        match delete_one(state, res, ns, name_of(obj), &opts).await {
            Ok(_) => deleted += 1,
            Err(ApiError::NotFound { .. } | ApiError::Conflict { .. }) => {}
            Err(e) => tracing::warn!("deleting {} {}: {e}", res.qualified(), name_of(obj)),
        }
    }
    // A terminating namespace with nothing left in it goes away.
    let nsres = registry::lookup("", "v1", "namespaces")
        .ok_or_else(|| ApiError::Internal("namespaces are not registered".into()))?;
    for ns in terminating {
        if remaining_in.contains(ns) {
            continue;
        }
        let result = state
            .write(nsres, &nsres.key(None, ns), false, |cur| match cur {
                Some(n) if is_terminating(n) => Ok(Mutation::Delete),
                _ => Ok(Mutation::Keep),
            })
            .await;
        match result {
            Ok(_) => deleted += 1,
            Err(ApiError::NotFound { .. }) => {}
            Err(e) => tracing::warn!("removing namespace {ns}: {e}"),
        }
    }
    Ok(deleted)
}

/// `propagationPolicy: Orphan`: dependents of the deleted object lose their reference to it.
pub async fn orphan_dependents(state: &SharedState, owner: &Value) {
    let Some(uid) = meta_str(owner, "uid").map(str::to_string) else {
        return;
    };
    let all = match state.store.list("/").await {
        Ok(l) => l.items,
        Err(e) => {
            tracing::warn!("orphaning dependents: {e}");
            return;
        }
    };
    for obj in all.iter().filter(|o| owner_uids(o).contains(&uid)) {
        let Some(res) = resource_of(obj) else {
            continue;
        };
        let uid = uid.clone();
        let key = res.object_key(obj);
        let _ = state
            .write(res, &key, false, move |cur| {
                let Some(cur) = cur else {
                    return Ok(Mutation::Keep);
                };
                let mut next = cur.clone();
                if let Some(refs) = next
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r.get("uid") != Some(&json!(uid)));
                }
                Ok(Mutation::Put(next))
            })
            .await;
    }
}
