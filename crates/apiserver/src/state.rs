//! State shared by every request handler.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::Value;
use svcnet_store::{Mutation, Outcome, Store, StoreError};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::config::ServerConfig;
use crate::conversion;
use crate::registry::{self, ResourceInfo};
use crate::status::ApiError;

/// The largest object stored, encoded: etcd's default request limit (`--max-request-bytes`,
/// 1.5 MiB), which bounds every object of a real cluster; kinds have tighter bounds of their
/// own (a ConfigMap's data: 1 MiB).
pub const MAX_OBJECT_BYTES: usize = 1024 * 1024 * 3 / 2;

fn check_size(obj: &Value) -> Result<(), ApiError> {
    let len = serde_json::to_vec(obj)
        .map(|b| b.len())
        .unwrap_or(usize::MAX);
    if len > MAX_OBJECT_BYTES {
        return Err(ApiError::TooLarge(MAX_OBJECT_BYTES));
    }
    Ok(())
}

/// Everything handlers share. Build one with [`crate::AppState::new`].
pub struct AppState {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) cfg: ServerConfig,
    pub(crate) admission: Admission,
    /// Serialises service writes, so admission's allocations and the store write that
    /// persists them happen as one step.
    pub(crate) service_lock: tokio::sync::Mutex<()>,
    pub(crate) shutdown: CancellationToken,
    /// Wakes the garbage collector (after deletes).
    pub(crate) gc: Notify,
    /// The address the server answers on (for discovery and the `kubernetes` service).
    pub(crate) addr: SocketAddr,
    /// Snapshots of paged lists (`limit` / `continue`).
    pub(crate) cursors: crate::paging::Cursors,
    /// What `GET /metrics` reports.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// The ServiceAccount token key: signs TokenRequests, verifies bearer tokens.
    pub(crate) tokens: crate::auth::tokens::Tokens,
    /// Wakes the serviceaccounts controller (after writes of namespaces and ServiceAccounts).
    pub(crate) accounts: Notify,
}

/// The handle handlers receive.
pub type SharedState = Arc<AppState>;

impl AppState {
    /// State over an opened store; the allocators are rebuilt from the stored services.
    pub async fn new(
        store: Arc<dyn Store>,
        cfg: ServerConfig,
        addr: SocketAddr,
    ) -> Result<SharedState, crate::ServerError> {
        let admission = Admission::new(&cfg).map_err(crate::ServerError::Config)?;
        let tokens =
            crate::auth::tokens::Tokens::load_or_create(&cfg.data_dir, &cfg.cluster_domain)?;
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let store: Arc<dyn Store> =
            Arc::new(crate::metered::MeteredStore::new(store, metrics.clone()));
        let state = Arc::new(AppState {
            store,
            cfg,
            admission,
            service_lock: tokio::sync::Mutex::new(()),
            shutdown: CancellationToken::new(),
            gc: Notify::new(),
            addr,
            cursors: crate::paging::Cursors::default(),
            metrics,
            tokens,
            accounts: Notify::new(),
        });
        let warnings = state
            .rebuild_allocators()
            .await
            .map_err(|e| crate::ServerError::Store(e.to_string()))?;
        for w in warnings {
            tracing::warn!("allocator rebuild: {w}");
        }
        Ok(state)
    }

    /// The `GET /metrics` exposition, with the stored objects counted now.
    pub(crate) async fn render_metrics(&self) -> String {
        let mut objects = Vec::new();
        for r in registry::RESOURCES {
            let count = match self.store.stats(&r.prefix()).await {
                Ok(s) => i64::try_from(s.objects).unwrap_or(i64::MAX),
                Err(_) => -1,
            };
            objects.push((r.qualified(), count));
        }
        objects.sort();
        objects.dedup_by(|a, b| a.0 == b.0);
        self.metrics.render(&objects, self.store.size_bytes())
    }

    pub(crate) async fn rebuild_allocators(&self) -> Result<Vec<String>, ApiError> {
        let services = registry::lookup("", "v1", "services")
            .ok_or_else(|| ApiError::Internal("services are not registered".into()))?;
        let list = self.store.list(&services.prefix()).await?;
        Ok(self.admission.rebuild(&list.items))
    }

    /// One atomic read-modify-write of `key`. Service writes hold the service lock, and any
    /// failure (or a dry run) rebuilds the allocators from the store, so an allocation made by
    /// admission is either persisted with its object or forgotten.
    pub(crate) async fn write(
        &self,
        res: &ResourceInfo,
        key: &str,
        dry_run: bool,
        mut f: impl FnMut(Option<&Value>) -> Result<Mutation, ApiError> + Send + 'static,
    ) -> Result<Outcome, ApiError> {
        let is_service = res.kind == "Service" && res.group.is_empty();
        let _guard = if is_service {
            Some(self.service_lock.lock().await)
        } else {
            None
        };
        // The closure sees and returns the served form; the store keeps the stored one.
        let served_res = registry::by_kind(res.group, res.kind).filter(|r| conversion::converts(r));
        let mut f = move |cur: Option<&Value>| match served_res {
            None => f(cur),
            Some(r) => {
                let served = cur.map(|c| conversion::to_served(r, c.clone()));
                Ok(match f(served.as_ref())? {
                    Mutation::Put(v) => Mutation::Put(conversion::to_stored(r, v)),
                    other => other,
                })
            }
        };
        let dry = std::sync::Arc::new(std::sync::Mutex::new(None::<Outcome>));
        let dry_slot = dry.clone();
        let result = self
            .store
            .guaranteed_update(
                key,
                Box::new(move |cur| {
                    let m = f(cur).map_err(StoreError::aborted)?;
                    if let Mutation::Put(v) = &m {
                        check_size(v).map_err(StoreError::aborted)?;
                    }
                    if !dry_run {
                        return Ok(m);
                    }
                    let outcome = match m {
                        Mutation::Put(v) => Outcome::Written(v),
                        Mutation::Delete => Outcome::Deleted(cur.cloned().unwrap_or_default()),
                        Mutation::Keep => Outcome::Unchanged(cur.cloned()),
                    };
                    if let Ok(mut slot) = dry_slot.lock() {
                        *slot = Some(outcome);
                    }
                    Ok(Mutation::Keep)
                }),
            )
            .await;
        let result = match result {
            Ok(o) => Ok(o),
            Err(e) => Err(match e.into_aborted::<ApiError>() {
                Ok(api) => api,
                Err(other) => ApiError::from(other),
            }),
        };
        if is_service
            && (result.is_err() || dry_run)
            && let Err(e) = self.rebuild_allocators().await
        {
            tracing::error!("rebuilding allocators after a failed write: {e}");
        }
        if is_service
            && !dry_run
            && let Ok(Outcome::Deleted(svc)) = &result
        {
            self.admission.release(svc);
        }
        if !dry_run
            && result.is_ok()
            && res.group.is_empty()
            && matches!(res.kind, "Namespace" | "ServiceAccount")
        {
            // Committed: the serviceaccounts controller sees it when it wakes.
            self.accounts.notify_one();
        }
        let result = match dry_run && result.is_ok() {
            true => match dry.lock().ok().and_then(|mut s| s.take()) {
                Some(o) => Ok(o),
                None => result,
            },
            false => result,
        };
        result.map(|o| match served_res {
            None => o,
            Some(r) => match o {
                Outcome::Written(v) => Outcome::Written(conversion::to_served(r, v)),
                Outcome::Deleted(v) => Outcome::Deleted(conversion::to_served(r, v)),
                Outcome::Unchanged(v) => Outcome::Unchanged(v.map(|v| conversion::to_served(r, v))),
            },
        })
    }
}
