//! Upstream's serviceaccounts controller: every namespace that is not terminating has a
//! `default` ServiceAccount, created when the namespace appears and again when it is deleted.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use svcnet_store::EventType;

use crate::objects::{is_terminating, meta_str};
use crate::registry::{self, ResourceInfo};
use crate::state::SharedState;
use crate::status::ApiError;

/// The ServiceAccount every namespace gets.
pub const DEFAULT: &str = "default";

fn res(plural: &str) -> Result<&'static ResourceInfo, ApiError> {
    registry::lookup("", "v1", plural)
        .ok_or_else(|| ApiError::Internal(format!("{plural} are not registered")))
}

/// Creates the namespace's `default` ServiceAccount unless it exists or the namespace is
/// going away.
async fn ensure(state: &SharedState, namespace: &str) -> Result<(), ApiError> {
    let ns = state
        .store
        .get(&res("namespaces")?.key(None, namespace))
        .await?;
    if ns.as_ref().is_none_or(is_terminating) {
        return Ok(());
    }
    let sa = json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": DEFAULT, "namespace": namespace},
    });
    crate::bootstrap::ensure(state, res("serviceaccounts")?, sa, &[], true).await
}

/// One pass: ensures every namespace's account, then follows namespace and ServiceAccount
/// changes until the store's watch ends.
async fn pass(state: &SharedState) -> Result<(), ApiError> {
    let namespaces = res("namespaces")?;
    let accounts = res("serviceaccounts")?;
    let list = state.store.list(&namespaces.prefix()).await?;
    let mut ns_events = state.store.watch(&namespaces.prefix(), list.revision)?;
    let mut sa_events = state.store.watch(&accounts.prefix(), list.revision)?;
    for ns in &list.items {
        ensure(state, meta_str(ns, "name").unwrap_or("")).await?;
    }
    loop {
        let event = tokio::select! {
            _ = state.shutdown.cancelled() => return Ok(()),
            e = ns_events.next() => e,
            e = sa_events.next() => e,
        };
        let Some(event) = event else {
            return Ok(());
        };
        let event = event?;
        let obj: &Value = &event.object;
        let namespace = match (meta_str(obj, "namespace"), meta_str(obj, "name")) {
            // A ServiceAccount: only the removal of a `default` one matters.
            (Some(ns), Some(DEFAULT)) if !ns.is_empty() && event.kind == EventType::Deleted => ns,
            (Some(ns), _) if !ns.is_empty() => continue,
            // A namespace: a new or changed one may need its account.
            (_, Some(name)) if event.kind != EventType::Deleted => name,
            _ => continue,
        };
        ensure(state, namespace).await?;
    }
}

/// Runs until shutdown.
pub async fn run(state: SharedState) {
    while !state.shutdown.is_cancelled() {
        if let Err(e) = pass(&state).await {
            tracing::warn!("serviceaccounts controller: {e}");
        }
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
