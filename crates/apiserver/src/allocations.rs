//! Cluster IPs, node ports and load-balancer IPs held in the store, so that every API server
//! on one store allocates from the same state (upstream's `RangeAllocation` objects at
//! `/registry/ranges/…` on etcd; the same keys in redb).
//!
//! A Service write ([`AppState::write`](crate::state::AppState)) loads the ranges, lets
//! admission work on a copy, then **claims** what the new object newly holds with a
//! compare-and-swap on each range object, writes the Service only if it is still the one
//! admission saw, and **releases** what it gave up after that write committed. A claim that
//! loses a race (another server took the address) starts the write over from fresh state.
//! So an address is marked taken before any Service records it and freed only after no
//! Service records it: a crash in between leaks it, never hands it out twice.
//!
//! [`repair`] (upstream's `repair` controllers) rebuilds the ranges from the stored Services:
//! it adds what a Service holds but a range lost, and frees what no Service holds once it has
//! been seen leaked in [`LEAK_PASSES`] passes in a row (an address claimed by a write still in
//! flight is not a leak). It runs at start, before the server serves, and every
//! [`REPAIR_PERIOD`]; it writes with compare-and-swap only, so any number of API servers may
//! run it at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use svcnet_admission::{Allocation, Allocators};
use svcnet_store::{Mutation, Outcome, StoreError, object_revision};

use crate::registry;
use crate::state::AppState;
use crate::status::ApiError;

/// How often [`repair`] runs after the first pass: kube-apiserver's interval for its cluster-IP
/// and node-port repair controllers (`ServiceClusterIPInterval`, `ServiceNodePortInterval`).
/// A pass reads every Service, so it is not cheap on a large cluster.
pub(crate) const REPAIR_PERIOD: Duration = Duration::from_secs(180);
/// Passes in a row an allocation must be seen leaked before it is freed.
pub(crate) const LEAK_PASSES: u32 = 3;

/// The store key of a range (`/registry/ranges/<name>` on etcd).
pub(crate) fn key(name: &str) -> String {
    format!("/core/ranges//{name}")
}

/// The repair passes' memory: how many passes in a row each leaked allocation was seen.
#[derive(Default)]
pub(crate) struct LeakCounts(Mutex<HashMap<Allocation, u32>>);

/// What one write asks of one range, and where its answer goes.
struct Pending {
    add: Vec<Allocation>,
    remove: Vec<Allocation>,
    done: tokio::sync::oneshot::Sender<Result<(), Change>>,
}

/// Why a change of a range did not happen.
#[derive(Debug, Clone)]
enum Change {
    Taken(Allocation),
    Store(String),
}

/// Concurrent changes of one range are written together: whoever holds `flush` writes every
/// change pending then in one compare-and-swap (group commit), so writes here do not queue on
/// the range key one round trip each.
#[derive(Default)]
struct RangeBatch {
    pending: Mutex<Vec<Pending>>,
    flush: tokio::sync::Mutex<()>,
    /// The range object as this server last read or wrote it: the belief a flush starts
    /// from (`Store::guaranteed_update_from`), so that on etcd a flush is one round trip
    /// while no other server wrote the range.
    last: Mutex<Option<Value>>,
}

/// This server's batch of range `name`.
fn batch_of(state: &AppState, name: &'static str) -> std::sync::Arc<RangeBatch> {
    let mut all = state
        .batches
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    all.entry(name).or_default().clone()
}

/// The per-range batches of this server.
#[derive(Default)]
pub(crate) struct Batches(Mutex<HashMap<&'static str, std::sync::Arc<RangeBatch>>>);

/// A claim lost a race: the allocation is taken now.
#[derive(Debug, thiserror::Error)]
#[error("{0} was taken concurrently")]
pub(crate) struct Taken(pub(crate) Allocation);

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(e.to_string())
}

/// The allocations as this server last read or wrote each range (its belief, which another
/// server's writes may have made stale), reading only the ranges it holds no belief of. A write
/// may admit on this: its claim compares and swaps on the stored range, so an address the
/// belief shows free but another server took fails the claim ([`Taken`]), and the write starts
/// over from [`load`]. On etcd that spares every Service write a read of each range.
pub(crate) async fn load_believed(state: &AppState) -> Result<Allocators, ApiError> {
    let mut allocs = state.admission.template().empty();
    for name in allocs.range_names() {
        let believed = lock(&batch_of(state, name).last).clone();
        match believed {
            Some(obj) => allocs.load_range(name, &obj).map_err(internal)?,
            None => return load(state).await,
        }
    }
    Ok(allocs)
}

/// The stored allocations, all held by nobody in particular. Builds the range objects first
/// (a [`repair`] pass) when one is missing.
pub(crate) async fn load(state: &AppState) -> Result<Allocators, ApiError> {
    for _ in 0..2 {
        let mut allocs = state.admission.template().empty();
        let mut missing = false;
        let names = allocs.range_names();
        let objects =
            futures::future::join_all(names.iter().map(|name| state.store.get(&key(name)))).await;
        for (name, obj) in names.into_iter().zip(objects) {
            match obj? {
                Some(obj) => {
                    allocs.load_range(name, &obj).map_err(internal)?;
                    *lock(&batch_of(state, name).last) = Some(obj);
                }
                None => missing = true,
            }
        }
        if !missing {
            return Ok(allocs);
        }
        for w in repair(state).await? {
            tracing::warn!("allocation repair: {w}");
        }
    }
    Err(ApiError::Internal(
        "the allocation ranges are missing after a repair".into(),
    ))
}

fn by_range(
    template: &Allocators,
    items: &[Allocation],
) -> Result<BTreeMap<&'static str, Vec<Allocation>>, ApiError> {
    let mut map: BTreeMap<&'static str, Vec<Allocation>> = BTreeMap::new();
    for a in items {
        let name = template
            .range_of(a)
            .ok_or_else(|| ApiError::Internal(format!("{a} is in no configured range")))?;
        map.entry(name).or_default().push(*a);
    }
    Ok(map)
}

/// Applies `add` and `remove` to one range object with compare-and-swap, together with the
/// changes other writes of this server asked for meanwhile.
async fn change_range(
    state: &AppState,
    name: &'static str,
    add: Vec<Allocation>,
    remove: Vec<Allocation>,
) -> Result<(), Change> {
    let batch = batch_of(state, name);
    let (done, mut answer) = tokio::sync::oneshot::channel();
    lock(&batch.pending).push(Pending { add, remove, done });
    loop {
        let _flushing = batch.flush.lock().await;
        // A flush that ran while this write waited may have answered it.
        if let Ok(result) = answer.try_recv() {
            return result;
        }
        let pending = std::mem::take(&mut *lock(&batch.pending));
        if pending.is_empty() {
            continue;
        }
        flush(state, name, &batch, pending).await;
    }
}

/// One compare-and-swap of a range with every change in `pending`, in order; each change is
/// answered (a change whose additions are taken is refused alone).
async fn flush(state: &AppState, name: &'static str, batch: &RangeBatch, pending: Vec<Pending>) {
    let template = state.admission.template().empty();
    let changes: Vec<(Vec<Allocation>, Vec<Allocation>)> = pending
        .iter()
        .map(|p| (p.add.clone(), p.remove.clone()))
        .collect();
    let verdicts = std::sync::Arc::new(Mutex::new(Vec::new()));
    let slot = verdicts.clone();
    let believed = lock(&batch.last).clone();
    let update: svcnet_store::UpdateFn = Box::new(move |cur| {
        // Decided again on every try (and first on the belief): the closure may run
        // more than once.
        let mut allocs = template.clone();
        let mut verdict = Vec::with_capacity(changes.len());
        match cur {
            Some(obj) => allocs.load_range(name, obj).map_err(StoreError::aborted)?,
            None => {
                // Nothing to free in a range that is not there; claims wait for repair.
                for (add, _) in &changes {
                    verdict.push(add.first().map_or(Ok(()), |a| Err(Change::Taken(*a))));
                }
                *lock(&slot) = verdict;
                return Ok(Mutation::Keep);
            }
        }
        for (add, remove) in &changes {
            verdict.push(allocs.apply(add, remove).map_err(Change::Taken));
        }
        *lock(&slot) = verdict;
        let obj = allocs.range_object(name).map_err(StoreError::aborted)?;
        if Some(&obj) == cur.map(strip_rv).as_ref() {
            return Ok(Mutation::Keep);
        }
        Ok(Mutation::Put(obj))
    });
    let result = match believed {
        Some(b) => {
            state
                .store
                .guaranteed_update_from(&key(name), Some(b), update)
                .await
        }
        None => state.store.guaranteed_update(&key(name), update).await,
    };
    // What the store answered is the belief now; after a failure, none (the next write reads).
    *lock(&batch.last) = match &result {
        Ok(Outcome::Written(obj) | Outcome::Unchanged(Some(obj))) => Some(obj.clone()),
        _ => None,
    };
    let verdict = std::mem::take(&mut *lock(&verdicts));
    for (i, p) in pending.into_iter().enumerate() {
        let answer = match &result {
            Ok(_) => verdict.get(i).cloned().unwrap_or(Ok(())),
            Err(e) => Err(Change::Store(e.to_string())),
        };
        let _ = p.done.send(answer);
    }
}

fn strip_rv(obj: &Value) -> Value {
    let mut obj = obj.clone();
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    obj
}

/// Marks `items` taken, every range at once. `Err(Ok(Taken))` when one was taken by someone
/// else (nothing of this claim stays taken then); `Err(Err(_))` on a store failure.
pub(crate) async fn claim(
    state: &AppState,
    items: &[Allocation],
) -> Result<(), Result<Taken, ApiError>> {
    let ranges = by_range(state.admission.template(), items).map_err(Err)?;
    let results = futures::future::join_all(
        ranges
            .iter()
            .map(|(name, add)| change_range(state, name, add.clone(), Vec::new())),
    )
    .await;
    let mut failure = None;
    let mut done: Vec<Allocation> = Vec::new();
    for ((_, add), result) in ranges.into_iter().zip(results) {
        match result {
            Ok(()) => done.extend(add),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    let Some(failure) = failure else {
        return Ok(());
    };
    // Give back what this claim took in the other ranges; repair frees it should that fail.
    if let Err(r) = release(state, &done).await {
        tracing::warn!("releasing a partial claim: {r}");
    }
    Err(match failure {
        Change::Taken(a) => Ok(Taken(a)),
        Change::Store(e) => Err(ApiError::Internal(format!("claiming allocations: {e}"))),
    })
}

/// Frees `items` (what a committed write no longer holds).
pub(crate) async fn release(state: &AppState, items: &[Allocation]) -> Result<(), ApiError> {
    let ranges = by_range(state.admission.template(), items)?;
    let results = futures::future::join_all(
        ranges
            .into_iter()
            .map(|(name, remove)| change_range(state, name, Vec::new(), remove)),
    )
    .await;
    for r in results {
        match r {
            Ok(()) | Err(Change::Taken(_)) => {}
            Err(Change::Store(e)) => {
                return Err(ApiError::Internal(format!("releasing allocations: {e}")));
            }
        }
    }
    Ok(())
}

/// One repair pass; returns warnings (Services that hold the same address, values outside
/// the configured ranges, leaks freed).
pub(crate) async fn repair(state: &AppState) -> Result<Vec<String>, ApiError> {
    let services = registry::lookup("", "v1", "services")
        .ok_or_else(|| ApiError::Internal("services are not registered".into()))?;
    let template = state.admission.template();
    'pass: for _ in 0..16 {
        // The ranges first: an address claimed after this read makes the write below fail
        // its compare-and-swap, and the pass starts over.
        let mut stored = Vec::new();
        let mut held = template.empty();
        for name in template.range_names() {
            let obj = state.store.get(&key(name)).await?;
            let mut one = template.empty();
            let readable = match &obj {
                Some(o) => match one.load_range(name, o) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!("allocation repair: {e}; rebuilding it");
                        false
                    }
                },
                None => false,
            };
            let mine = one.allocations().into_iter().collect::<Vec<_>>();
            // Cannot fail: `held` holds other ranges only.
            let _ = held.apply(&mine, &[]);
            stored.push((name, obj.as_ref().and_then(object_revision), readable, mine));
        }
        let list = state.store.list(&services.prefix()).await?;
        let mut rebuilt = template.empty();
        let mut warnings = rebuilt.rebuild(&list.items);
        let wanted = rebuilt.allocations();
        let leaked: Vec<Allocation> = held.allocations().difference(&wanted).copied().collect();
        let mut counts = lock(&state.leaks.0).clone();
        counts.retain(|a, _| leaked.contains(a));
        let mut keep = Vec::new();
        for a in leaked {
            let n = counts.entry(a).or_insert(0);
            *n += 1;
            if *n < LEAK_PASSES {
                keep.push(a);
            } else {
                warnings.push(format!("{a} is held by no service; freed"));
            }
        }
        counts.retain(|_, n| *n < LEAK_PASSES);
        let mut desired = rebuilt;
        // Cannot fail: the kept leaks are exactly what no Service holds.
        let _ = desired.apply(&keep, &[]);
        let desired_set = desired.allocations();
        for (name, revision, readable, mine) in stored {
            let want: BTreeSet<Allocation> = desired_set
                .iter()
                .filter(|a| template.range_of(a) == Some(name))
                .copied()
                .collect();
            if readable && want == mine.into_iter().collect() {
                continue;
            }
            let obj = desired.range_object(name).map_err(internal)?;
            let result = match revision {
                Some(rev) => state.store.update(&key(name), obj, Some(rev)).await,
                None => state.store.create(&key(name), obj).await,
            };
            match result {
                Ok(_) => {}
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => {
                    continue 'pass;
                }
                Err(e) => return Err(e.into()),
            }
        }
        *lock(&state.leaks.0) = counts;
        return Ok(warnings);
    }
    Err(ApiError::Internal(
        "allocation repair: the ranges kept changing".into(),
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Repairs every [`REPAIR_PERIOD`] until shutdown.
pub(crate) async fn run(state: crate::state::SharedState) {
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tokio::time::sleep(REPAIR_PERIOD) => {}
        }
        match repair(&state).await {
            Ok(warnings) => {
                for w in warnings {
                    tracing::warn!("allocation repair: {w}");
                }
            }
            Err(e) => tracing::warn!("allocation repair: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    async fn state(dir: &std::path::Path) -> crate::state::SharedState {
        let cfg = crate::ServerConfig {
            data_dir: dir.to_path_buf(),
            ..Default::default()
        };
        crate::build_state(cfg, "127.0.0.1:6443".parse().unwrap())
            .await
            .unwrap()
    }

    fn ip(s: &str) -> Allocation {
        Allocation::ClusterIp(s.parse().unwrap())
    }

    /// A Service written straight into the store: the ranges do not know its address.
    async fn stored_service(state: &AppState, name: &str, cluster_ip: &str) {
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                     "ports": [{"port": 80, "protocol": "TCP"}]}});
        state
            .store
            .create(&format!("/core/services/default/{name}"), svc)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn repair_restores_what_services_hold_and_frees_leaks_after_three_passes() {
        let dir = tempfile::tempdir().unwrap();
        let state = state(dir.path()).await;
        // The bootstrap's `kubernetes` service holds 10.96.0.1.
        assert!(
            load(&state)
                .await
                .unwrap()
                .allocations()
                .contains(&ip("10.96.0.1"))
        );

        // A range that lost a Service's address gets it back in one pass.
        stored_service(&state, "lost", "10.96.1.7").await;
        assert!(
            !load(&state)
                .await
                .unwrap()
                .allocations()
                .contains(&ip("10.96.1.7"))
        );
        repair(&state).await.unwrap();
        assert!(
            load(&state)
                .await
                .unwrap()
                .allocations()
                .contains(&ip("10.96.1.7"))
        );

        // A claim no Service records (a write that crashed) survives two passes (it may be a
        // write in flight), and the third frees it.
        claim(&state, &[ip("10.96.2.2")]).await.unwrap();
        for pass in 1..=3 {
            let warnings = repair(&state).await.unwrap();
            let held = load(&state).await.unwrap().allocations();
            assert_eq!(held.contains(&ip("10.96.2.2")), pass < 3, "pass {pass}");
            assert_eq!(
                warnings.iter().any(|w| w.contains("10.96.2.2")),
                pass == 3,
                "{warnings:?}"
            );
        }
        assert!(
            load(&state)
                .await
                .unwrap()
                .allocations()
                .contains(&ip("10.96.1.7"))
        );

        // A missing range is rebuilt before anything is allocated from it.
        state
            .store
            .delete(&key(svcnet_admission::SERVICE_IPS), None)
            .await
            .unwrap();
        let held = load(&state).await.unwrap().allocations();
        assert!(held.contains(&ip("10.96.1.7")) && held.contains(&ip("10.96.0.1")));
        state.shutdown.cancel();
    }
}
