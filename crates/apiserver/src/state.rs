//! State shared by every request handler.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};

use serde_json::Value;
use svcnet_admission::Allocation;
use svcnet_store::{Mutation, Outcome, Store, StoreError, object_revision};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::allocations;
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
    /// Allocations this server's Service writes are claiming right now: a hint that keeps
    /// concurrent writes here from picking the same free address (compare-and-swap on the
    /// ranges is what keeps every write, here and on other servers, apart).
    pub(crate) inflight: std::sync::Mutex<BTreeSet<Allocation>>,
    pub(crate) shutdown: CancellationToken,
    /// Wakes the garbage collector (after deletes).
    pub(crate) gc: Notify,
    /// The address the server answers on (for discovery and the `kubernetes` service).
    pub(crate) addr: SocketAddr,
    /// What `GET /metrics` reports.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// The ServiceAccount token key: signs TokenRequests, verifies bearer tokens.
    pub(crate) tokens: crate::auth::tokens::Tokens,
    /// Wakes the serviceaccounts controller (after writes of namespaces and ServiceAccounts).
    pub(crate) accounts: Notify,
    /// The allocation repair's leak counts.
    pub(crate) leaks: allocations::LeakCounts,
    /// Concurrent changes of each allocation range, written together.
    pub(crate) batches: allocations::Batches,
    /// Other API servers' endpoint records as this server saw them.
    pub(crate) masterleases: crate::masterleases::Observed,
    /// Watch events encoded once for all the watchers that send them alike.
    pub(crate) watch_lines: crate::watch::EncodedLines,
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
            inflight: Default::default(),
            shutdown: CancellationToken::new(),
            gc: Notify::new(),
            addr,
            metrics,
            tokens,
            accounts: Notify::new(),
            leaks: Default::default(),
            batches: Default::default(),
            masterleases: Default::default(),
            watch_lines: Default::default(),
        });
        let warnings = crate::allocations::repair(&state)
            .await
            .map_err(|e| crate::ServerError::Store(e.to_string()))?;
        for w in warnings {
            tracing::warn!("allocation repair: {w}");
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

    /// One atomic read-modify-write of `key`. A Service write goes through
    /// [`AppState::write_service`], which keeps the allocation ranges in step with it.
    pub(crate) async fn write(
        &self,
        res: &ResourceInfo,
        key: &str,
        dry_run: bool,
        f: impl FnMut(Option<&Value>) -> Result<Mutation, ApiError> + Send + 'static,
    ) -> Result<Outcome, ApiError> {
        self.write_believing(res, key, dry_run, None, f).await
    }

    /// [`AppState::write`] of a key believed free (a create): the store tries the write
    /// without reading first (on etcd one round trip instead of two, as kube-apiserver's
    /// Create); `f` decides again on the stored object if the key is taken.
    pub(crate) async fn write_new(
        &self,
        res: &ResourceInfo,
        key: &str,
        dry_run: bool,
        f: impl FnMut(Option<&Value>) -> Result<Mutation, ApiError> + Send + 'static,
    ) -> Result<Outcome, ApiError> {
        self.write_believing(res, key, dry_run, Some(None), f).await
    }

    /// `believed`: the stored object as the caller believes it is (`Some(None)`: absent), for
    /// [`svcnet_store::Store::guaranteed_update_from`].
    async fn write_believing(
        &self,
        res: &ResourceInfo,
        key: &str,
        dry_run: bool,
        believed: Option<Option<Value>>,
        mut f: impl FnMut(Option<&Value>) -> Result<Mutation, ApiError> + Send + 'static,
    ) -> Result<Outcome, ApiError> {
        let is_service = res.kind == "Service" && res.group.is_empty();
        // The closure sees and returns the served form; the store keeps the stored one.
        let served_res = registry::by_kind(res.group, res.kind).filter(|r| conversion::converts(r));
        let f = move |cur: Option<&Value>| match served_res {
            None => f(cur),
            Some(r) => {
                let served = cur.map(|c| conversion::to_served(r, c.clone()));
                Ok(match f(served.as_ref())? {
                    Mutation::Put(v) => Mutation::Put(conversion::to_stored(r, v)),
                    other => other,
                })
            }
        };
        let result = if is_service {
            self.write_service(key, dry_run, believed, f).await
        } else {
            self.write_plain(key, dry_run, believed, f).await
        };
        if !dry_run
            && result.is_ok()
            && res.group.is_empty()
            && matches!(res.kind, "Namespace" | "ServiceAccount")
        {
            // Committed: the serviceaccounts controller sees it when it wakes.
            self.accounts.notify_one();
        }
        result.map(|o| match served_res {
            None => o,
            Some(r) => match o {
                Outcome::Written(v) => Outcome::Written(conversion::to_served(r, v)),
                Outcome::Deleted(v) => Outcome::Deleted(conversion::to_served(r, v)),
                Outcome::Unchanged(v) => Outcome::Unchanged(v.map(|v| conversion::to_served(r, v))),
            },
        })
    }

    /// A write whose decision the store may retry: `f` runs inside the store's
    /// read-modify-write. A dry run decides and writes nothing.
    async fn write_plain(
        &self,
        key: &str,
        dry_run: bool,
        believed: Option<Option<Value>>,
        mut f: impl FnMut(Option<&Value>) -> Result<Mutation, ApiError> + Send + 'static,
    ) -> Result<Outcome, ApiError> {
        let dry = std::sync::Arc::new(std::sync::Mutex::new(None::<Outcome>));
        let dry_slot = dry.clone();
        let update: svcnet_store::UpdateFn = Box::new(move |cur| {
            let m = f(cur).map_err(StoreError::aborted)?;
            if let Mutation::Put(v) = &m {
                check_size(v).map_err(StoreError::aborted)?;
            }
            if !dry_run {
                return Ok(m);
            }
            if let Ok(mut slot) = dry_slot.lock() {
                *slot = Some(dry_outcome(m, cur));
            }
            Ok(Mutation::Keep)
        });
        let result = match believed {
            Some(b) => self.store.guaranteed_update_from(key, b, update).await,
            None => self.store.guaranteed_update(key, update).await,
        }
        .map_err(api_error)?;
        if dry_run && let Some(o) = dry.lock().ok().and_then(|mut s| s.take()) {
            return Ok(o);
        }
        Ok(result)
    }

    /// A Service write: read the Service and the allocation ranges, admit on a working copy
    /// of the ranges, claim what the new object newly holds, write the Service if it is still
    /// the one admission saw, then release what it gave up (see `crate::allocations`). A lost
    /// race on either step starts over from fresh state.
    ///
    /// The first attempt starts from beliefs: `believed` for the Service (a create believes it
    /// absent) and the ranges as this server last knew them. Both are checked where they
    /// matter (the claim and the Service write compare and swap), so a stale belief costs an
    /// attempt, never a wrong write; on etcd a create is then two transactions (the claim,
    /// shared with concurrent writes, and the Service) with no read before them.
    async fn write_service(
        &self,
        key: &str,
        dry_run: bool,
        mut believed: Option<Option<Value>>,
        mut f: impl FnMut(Option<&Value>) -> Result<Mutation, ApiError> + Send + 'static,
    ) -> Result<Outcome, ApiError> {
        let mut lost_race = false;
        for attempt in 0..MAX_SERVICE_ATTEMPTS {
            // A dry run answers what a write would do now: it reads.
            let from_belief = believed.is_some() && !dry_run;
            let (cur, loaded) = match believed.take().filter(|_| from_belief) {
                Some(cur) => (cur, allocations::load_believed(self).await?),
                None => {
                    let (cur, loaded) = tokio::join!(self.store.get(key), allocations::load(self));
                    (cur?, loaded?)
                }
            };
            let stored = loaded.allocations();
            // Admission and the in-flight hint in one step, so no other write here picks what
            // this one is about to claim.
            let (decision, before, after, claiming) = {
                let mut inflight = self.inflight.lock().unwrap_or_else(PoisonError::into_inner);
                let hint: Vec<Allocation> = inflight.difference(&stored).copied().collect();
                let mut working = loaded;
                // Cannot fail: the hint is what the loaded ranges do not hold.
                let _ = working.apply(&hint, &[]);
                if lost_race {
                    use std::hash::BuildHasher as _;
                    let seed =
                        std::collections::hash_map::RandomState::new().hash_one((key, attempt));
                    working.scan_from(seed);
                }
                if let Some(c) = &cur {
                    working.adopt(c);
                }
                let before = working.allocations();
                let (decision, after) = self.admission.with_working(working, || f(cur.as_ref()));
                let after = after.allocations();
                let add: Vec<Allocation> = after
                    .iter()
                    .filter(|a| !stored.contains(a) && !hint.contains(a))
                    .copied()
                    .collect();
                inflight.extend(add.iter().copied());
                (decision, before, after, Inflight::new(&self.inflight, add))
            };
            let m = match decision {
                // A refusal (an address taken, the name taken) may come from a stale belief:
                // it is given only on what the store holds.
                Err(_) if from_belief => continue,
                d => d?,
            };
            if let Mutation::Put(v) = &m {
                check_size(v)?;
            }
            if dry_run {
                return Ok(dry_outcome(m, cur.as_ref()));
            }
            let (add, give_up) = match &m {
                Mutation::Keep => return Ok(Outcome::Unchanged(cur)),
                Mutation::Put(_) => (
                    claiming.items.clone(),
                    before.difference(&after).copied().collect::<Vec<_>>(),
                ),
                Mutation::Delete => (Vec::new(), Vec::new()),
            };
            match allocations::claim(self, &add).await {
                Ok(()) => {}
                Err(Ok(allocations::Taken(a))) => {
                    tracing::debug!("{key}: {a} was taken concurrently; admitting again");
                    lost_race = true;
                    continue;
                }
                Err(Err(e)) => return Err(e),
            }
            let seen = cur.as_ref().map(|c| object_revision(c).unwrap_or(0));
            // Believing what was read: on etcd the write is one round trip, not a read first.
            let result = self
                .store
                .guaranteed_update_from(
                    key,
                    cur.clone(),
                    Box::new(move |now| {
                        if now.map(|c| object_revision(c).unwrap_or(0)) != seen {
                            return Err(StoreError::aborted(Moved));
                        }
                        Ok(m.clone())
                    }),
                )
                .await;
            let outcome = match result {
                Ok(o) => o,
                Err(e) => match e.into_aborted::<Moved>() {
                    Ok(Moved) => {
                        // Nothing was written: what this attempt claimed is free again.
                        if let Err(e) = allocations::release(self, &add).await {
                            tracing::warn!("{key}: releasing an unused claim: {e}");
                        }
                        continue;
                    }
                    // The write may have committed (a timeout): keep the claim; repair frees
                    // it if no Service holds it.
                    Err(other) => return Err(api_error(other)),
                },
            };
            let give_up = match &outcome {
                Outcome::Deleted(svc) => self
                    .admission
                    .template()
                    .allocations_of(svc)
                    .into_iter()
                    .collect(),
                _ => give_up,
            };
            if let Err(e) = allocations::release(self, &give_up).await {
                tracing::warn!("{key}: releasing what the service gave up (repair will): {e}");
            }
            return Ok(outcome);
        }
        Err(ApiError::Internal(format!(
            "{key}: the allocation ranges kept changing; try again"
        )))
    }
}

/// Removes a write's claims from the in-flight hint when the attempt ends, however it ends.
struct Inflight<'a> {
    set: &'a std::sync::Mutex<BTreeSet<Allocation>>,
    items: Vec<Allocation>,
}

impl<'a> Inflight<'a> {
    fn new(set: &'a std::sync::Mutex<BTreeSet<Allocation>>, items: Vec<Allocation>) -> Self {
        Inflight { set, items }
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        for a in &self.items {
            set.remove(a);
        }
    }
}

/// How often a Service write starts over after losing a race, before it gives up.
const MAX_SERVICE_ATTEMPTS: usize = 64;

/// The Service changed between admission and its write.
#[derive(Debug, thiserror::Error)]
#[error("the object changed during admission")]
struct Moved;

/// What a dry run reports for a decision.
fn dry_outcome(m: Mutation, cur: Option<&Value>) -> Outcome {
    match m {
        Mutation::Put(v) => Outcome::Written(v),
        Mutation::Delete => Outcome::Deleted(cur.cloned().unwrap_or_default()),
        Mutation::Keep => Outcome::Unchanged(cur.cloned()),
    }
}

fn api_error(e: StoreError) -> ApiError {
    match e.into_aborted::<ApiError>() {
        Ok(api) => api,
        Err(other) => ApiError::from(other),
    }
}
