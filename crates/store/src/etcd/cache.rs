//! The watch cache: kube-apiserver's `Cacher` (`staging/src/k8s.io/apiserver/pkg/storage/cacher`)
//! for [`EtcdStore`]. Without it every client watch is its own etcd watch stream, preceded by a
//! read that checks its revision is not compacted: a thousand node proxies watching Services
//! are a thousand etcd watchers, each event is sent, decoded and translated a thousand times,
//! and a watch's start waits for two etcd round trips.
//!
//! With it, each API server process keeps **one etcd watch per resource** (`/registry/pods/`,
//! `/registry/services/specs/`, …), opened by the first client watch of that resource from the
//! revision current then, resumed through member failures ([`Upstream`]), and never closed
//! while the store lives. Why per resource and not one on the whole `/registry/` prefix: a
//! client watch is always within one resource, so a per-resource history wakes only that
//! resource's watchers for an event and a busy resource (Events, Leases) cannot push a quiet
//! one's events out of a shared count-bounded history; it is also upstream's shape and what its
//! `--watch-cache-sizes` (per resource) means. A resource nobody watches costs nothing.
//!
//! Each upstream watch's events are translated once and kept in a ring of the last N
//! (`--default-watch-cache-size`, per resource `--watch-cache-sizes`); the ring covers every
//! event of the resource after its `start` revision. A client watch from revision R within that
//! window (R ≥ start) is served from memory: it takes the ring's events after R that match its
//! own prefix, then waits for the head to move (a `tokio::sync::watch` of the head revision is
//! the broadcast), so its start costs no etcd round trip and an event is decoded once for all
//! watchers. The hub never waits for a watcher: one that falls so far behind that the ring
//! dropped events it has not taken, and every watcher of a hub whose upstream failed for good,
//! goes on with its own etcd watch from the last revision it passed on (where upstream answers
//! 410), which answers [`StoreError::Gone`] only when etcd itself compacted that revision away.
//! A watch from below the window, of a resource whose size is 0, of a prefix that is not one
//! resource's, or with the cache off, is such a direct etcd watch from the start.
//!
//! Lists: a hub starts with a list of its resource at one revision and keeps every object of
//! the resource as of its head, so a list of the latest state (a whole resource or one
//! namespace) is served from memory, without reading and decoding every object from etcd, as
//! kube-apiserver's consistent list from the cache does. It stays a consistent read: one
//! cheap etcd transaction proves that nothing under the list's prefix changed between the
//! cache's head and etcd's current revision, or the list waits (at most 3 s, then reads etcd)
//! until the cache has the change ([`WatchCache::list`]). `list_at` (paged lists' later pages,
//! `resourceVersionMatch=Exact`) reads etcd.
//!
//! Compaction: the ring decides, as kube-apiserver's cacher does (`watch_cache.go`: a watch is
//! "too old" only below its oldest event, or its list's revision while nothing was evicted). A
//! watch from a revision the ring covers is served from memory even after etcd compacted that
//! revision away: the ring holds every event after it, so nothing is missed, and a client whose
//! resource was quiet since its list (every node proxy's Services, a namespace's objects)
//! resumes its watch instead of re-listing after every compaction (etcd: each 5 minutes). A
//! watch from below the ring goes to etcd, which answers 410 once it has compacted there; so
//! does a cached watch that lagged out of the ring. The watch's progress
//! ([`EventStream::progress`]) moves past the events of other keys of the resource, so a
//! bookmark names a revision the ring still covers.
//!
//! **Architecture Invariant:** a cached client watch sees what its own etcd watch would (had
//! etcd not compacted): every event of its prefix after its revision, once, in revision order,
//! with the same objects; the ring only ever holds a gap-free suffix of the resource's events;
//! a cached list is etcd's list at the revision it reports, which is no older than etcd's
//! revision when the list began.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use super::watch::{Upstream, direct, translate_response};
use super::{EtcdStore, KeyLayout, backend, decode, prefix_end, to_i64};
use crate::{
    Event, EventStream, EventType, ListResult, Progress, StoreError, WatchCacheOptions,
    WatchCacheStats,
};

/// How long a list waits for the cache to catch up with etcd before it reads etcd instead
/// (kube-apiserver's consistent list from the cache waits up to 3 s).
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(3);

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) etcd_watches: AtomicU64,
    pub(super) upstreams: AtomicU64,
    pub(super) cached: AtomicU64,
    pub(super) direct: AtomicU64,
    pub(super) fallbacks: AtomicU64,
    pub(super) lists_cached: AtomicU64,
    pub(super) lists_etcd: AtomicU64,
    pub(super) gets_cached: AtomicU64,
}

/// The cache of one [`EtcdStore`] (see the module's notes).
pub(super) struct WatchCache {
    options: WatchCacheOptions,
    /// One hub per resource, by the resource's etcd prefix; a failed hub is replaced by the
    /// next watch. A tokio mutex: starting a hub takes two etcd round trips, and the watches
    /// that arrive meanwhile wait for it rather than start another.
    hubs: tokio::sync::Mutex<HashMap<String, Arc<Hub>>>,
    pub(super) counters: Arc<Counters>,
}

impl WatchCache {
    pub(super) fn new(options: WatchCacheOptions) -> Self {
        WatchCache {
            options,
            hubs: tokio::sync::Mutex::new(HashMap::new()),
            counters: Arc::new(Counters::default()),
        }
    }

    pub(super) fn stats(&self) -> WatchCacheStats {
        let c = &self.counters;
        WatchCacheStats {
            etcd_watches: c.etcd_watches.load(Ordering::Relaxed),
            upstreams: c.upstreams.load(Ordering::Relaxed),
            cached: c.cached.load(Ordering::Relaxed),
            direct: c.direct.load(Ordering::Relaxed),
            fallbacks: c.fallbacks.load(Ordering::Relaxed),
            lists_cached: c.lists_cached.load(Ordering::Relaxed),
            lists_etcd: c.lists_etcd.load(Ordering::Relaxed),
            gets_cached: c.gets_cached.load(Ordering::Relaxed),
        }
    }

    /// A client watch: from the cache when its revision is within the window of its
    /// resource's history, else its own etcd watch.
    pub(super) async fn watch(
        &self,
        store: &EtcdStore,
        prefix: &str,
        from_revision: u64,
    ) -> Result<EventStream, StoreError> {
        let eprefix = store.inner.layout.prefix(prefix)?;
        let Some((group, plural)) = resource_of(prefix) else {
            return direct(store, prefix, from_revision).await;
        };
        let size = self.options.size_for(group, plural);
        if size == 0 {
            return direct(store, prefix, from_revision).await;
        }
        let store_prefix = format!("/{group}/{plural}/");
        let resource = store.inner.layout.prefix(&store_prefix)?;
        let hub = match self.hub(store, &resource, &store_prefix, size).await {
            Ok(hub) => hub,
            Err(e) => {
                tracing::debug!("watch cache for {resource} not started ({e}); watching etcd");
                return direct(store, prefix, from_revision).await;
            }
        };
        let Some(rx) = hub.shared.attach(from_revision) else {
            return direct(store, prefix, from_revision).await;
        };
        self.counters.cached.fetch_add(1, Ordering::Relaxed);
        let progress = Progress::new(from_revision);
        let watcher = Watcher {
            hub: Some(hub),
            store: store.clone(),
            prefix: prefix.to_string(),
            eprefix,
            last: from_revision,
            rx,
            pending: VecDeque::new(),
            direct: None,
            progress: progress.clone(),
        };
        Ok(EventStream::with_progress(
            progress,
            futures::stream::unfold(Some(watcher), step),
        ))
    }

    /// A list of `prefix` (the latest state) from the cache's objects, as kube-apiserver's
    /// consistent list from the watch cache: `None` when the cache cannot serve it (the
    /// caller reads etcd), which is when the resource is not cached, its hub cannot start or
    /// failed, or the cache does not reach etcd's current revision within [`CATCH_UP`].
    ///
    /// Consistency without trusting etcd's progress notifications (3.4.23 can send one
    /// ahead of events it has not sent, etcd#15220): the cache's items under `prefix` at its
    /// head `h` are taken, then one etcd transaction at the current revision `R` reads the
    /// keys under `prefix` modified after `h` and how many keys `prefix` holds. None modified
    /// and the same count means nothing under `prefix` changed in `(h, R]` (a change there
    /// is a key written after `h`, which the first read finds, or a deletion only, which
    /// lowers the count), so the items are the list at `R`. Otherwise the list waits for
    /// the hub to reach `R` and takes the items then.
    pub(super) async fn list(
        &self,
        store: &EtcdStore,
        prefix: &str,
    ) -> Result<Option<ListResult>, StoreError> {
        let served = self.list_cached(store, prefix).await?;
        let counter = if served.is_some() {
            &self.counters.lists_cached
        } else {
            &self.counters.lists_etcd
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(served)
    }

    async fn list_cached(
        &self,
        store: &EtcdStore,
        prefix: &str,
    ) -> Result<Option<ListResult>, StoreError> {
        let Some((group, plural)) = resource_of(prefix) else {
            return Ok(None);
        };
        let size = self.options.size_for(group, plural);
        if size == 0 {
            return Ok(None);
        }
        let eprefix = store.inner.layout.prefix(prefix)?;
        let store_prefix = format!("/{group}/{plural}/");
        let resource = store.inner.layout.prefix(&store_prefix)?;
        let hub = match self.hub(store, &resource, &store_prefix, size).await {
            Ok(hub) => hub,
            Err(e) => {
                tracing::debug!("watch cache for {resource} not started ({e}); listing etcd");
                return Ok(None);
            }
        };
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        let mut rx = hub.shared.head.subscribe();
        loop {
            let Some((head, items)) = hub.shared.snapshot(&eprefix) else {
                return Ok(None);
            };
            let fence = fence(store, &eprefix, head).await?;
            if fence.newest_change.is_none() && fence.count == items.len() {
                return Ok(Some(ListResult {
                    items,
                    revision: fence.revision.max(head),
                }));
            }
            // Behind: wait for the newest change seen (a deletion alone: for any event).
            let target = fence.newest_change.unwrap_or(head.saturating_add(1));
            let caught_up = tokio::time::timeout_at(deadline, rx.wait_for(|h| *h >= target)).await;
            if !matches!(caught_up, Ok(Ok(_))) {
                return Ok(None);
            }
        }
    }

    /// The object under `key` as its resource's cache holds it (the cache is started if it
    /// does not run yet); `None` when the cache is off for the resource, could not start,
    /// failed, or does not hold the key, so the caller reads etcd. What it returns may be
    /// behind etcd by the events still on their way to the cache.
    pub(super) async fn get(&self, store: &EtcdStore, key: &str) -> Option<Value> {
        let (group, plural) = resource_of(key)?;
        let size = self.options.size_for(group, plural);
        if size == 0 {
            return None;
        }
        let store_prefix = format!("/{group}/{plural}/");
        let resource = store.inner.layout.prefix(&store_prefix).ok()?;
        let ekey = store.inner.layout.key(key).ok()?;
        let hub = self.hub(store, &resource, &store_prefix, size).await.ok()?;
        let ring = hub.shared.ring.read().ok()?;
        let object = (!ring.failed).then(|| ring.objects.get(&ekey).cloned())??;
        self.counters.gets_cached.fetch_add(1, Ordering::Relaxed);
        Some(object)
    }

    /// The running hub of a resource, started (from the current revision) if there is none.
    async fn hub(
        &self,
        store: &EtcdStore,
        resource: &str,
        store_prefix: &str,
        capacity: usize,
    ) -> Result<Arc<Hub>, StoreError> {
        let mut hubs = self.hubs.lock().await;
        if let Some(hub) = hubs.get(resource)
            && !hub.shared.failed()
        {
            return Ok(hub.clone());
        }
        // The resource's objects at one revision, then its events after that revision: the
        // state lists are served from (kube-apiserver's Cacher lists, then watches).
        let (kvs, start) = store.range(resource, None).await?;
        let objects = kvs
            .iter()
            .map(|kv| {
                let ekey = String::from_utf8_lossy(kv.key()).into_owned();
                decode(store_prefix, kv).map(|object| (ekey, object))
            })
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        let upstream = Upstream::open(
            store.inner.client.clone(),
            self.counters.clone(),
            resource,
            start,
        )
        .await?;
        self.counters.upstreams.fetch_add(1, Ordering::Relaxed);
        let (head, _) = watch::channel(start);
        let shared = Arc::new(Shared {
            capacity,
            ring: RwLock::new(Ring {
                events: VecDeque::new(),
                start,
                head: start,
                failed: false,
                objects,
            }),
            head,
        });
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(run_hub(
            shared.clone(),
            upstream,
            store.inner.layout.clone(),
            stopped,
        ));
        let hub = Arc::new(Hub {
            shared,
            _stop: stop,
        });
        hubs.insert(resource.to_string(), hub.clone());
        Ok(hub)
    }
}

/// What etcd holds under a prefix at its current revision, against a cache at `head`.
struct Fence {
    /// The revision etcd read at.
    revision: u64,
    /// The newest revision of a key under the prefix written after `head`, if any.
    newest_change: Option<u64>,
    /// How many keys the prefix holds.
    count: usize,
}

/// One etcd transaction (two reads at one revision) telling whether anything under
/// `eprefix` changed after `head` (see [`WatchCache::list`]).
async fn fence(store: &EtcdStore, eprefix: &str, head: u64) -> Result<Fence, StoreError> {
    let end = prefix_end(eprefix.as_bytes());
    let changed = GetOptions::new()
        .with_range(end.clone())
        .with_keys_only()
        .with_min_mod_revision(to_i64(head.saturating_add(1)));
    let all = GetOptions::new().with_range(end).with_count_only();
    let txn = Txn::new().and_then([
        TxnOp::get(eprefix.as_bytes(), Some(changed)),
        TxnOp::get(eprefix.as_bytes(), Some(all)),
    ]);
    let resp = store.kv().txn(txn).await.map_err(backend)?;
    let revision = resp
        .header()
        .map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0));
    let mut fence = Fence {
        revision,
        newest_change: None,
        count: usize::MAX,
    };
    for (i, op) in resp.op_responses().into_iter().enumerate() {
        let TxnOpResponse::Get(get) = op else {
            continue;
        };
        if i == 0 {
            fence.newest_change = get
                .kvs()
                .iter()
                .filter_map(|kv| u64::try_from(kv.mod_revision()).ok())
                .max();
        } else {
            fence.count = usize::try_from(get.count()).unwrap_or(usize::MAX);
        }
    }
    Ok(fence)
}

/// `(group, plural)` of a prefix within one resource (`/core/pods/`, `/core/pods/ns/`).
fn resource_of(prefix: &str) -> Option<(&str, &str)> {
    let rest = prefix.strip_prefix('/')?;
    let (group, rest) = rest.split_once('/')?;
    let (plural, _) = rest.split_once('/')?;
    (!group.is_empty() && !plural.is_empty()).then_some((group, plural))
}

/// One resource's upstream watch and history. Dropping the last handle stops its task.
struct Hub {
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

/// What a hub's task and its watchers share.
struct Shared {
    capacity: usize,
    ring: RwLock<Ring>,
    /// The head revision, sent after every batch: the watchers' wake-up.
    head: watch::Sender<u64>,
}

struct Ring {
    /// The resource's events after `start`, in revision order.
    events: VecDeque<Arc<Cached>>,
    /// Every event of the resource after this revision is in `events`.
    start: u64,
    /// The highest revision the upstream watch delivered.
    head: u64,
    /// The upstream watch ended for good; the watchers must leave.
    failed: bool,
    /// Every object of the resource as of `head`, by etcd key: what lists are served from.
    objects: BTreeMap<String, Value>,
}

/// An event as the cache keeps it: with its etcd key, which a watcher's prefix is matched
/// against exactly as etcd would match it.
struct Cached {
    ekey: String,
    event: Event,
}

impl Shared {
    fn failed(&self) -> bool {
        self.ring.read().map_or(true, |r| r.failed)
    }

    /// The head revision and the objects under `eprefix` at it, in key order; `None` when
    /// the hub failed.
    fn snapshot(&self, eprefix: &str) -> Option<(u64, Vec<Value>)> {
        let ring = self.ring.read().ok()?;
        if ring.failed {
            return None;
        }
        let items = ring
            .objects
            .range::<str, _>((
                std::ops::Bound::Included(eprefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(eprefix))
            .map(|(_, v)| v.clone())
            .collect();
        Some((ring.head, items))
    }

    /// A wake-up receiver for a watcher from `from`, if the window covers it: the ring holds
    /// every event of the resource after `from`, whether or not etcd still does.
    fn attach(&self, from: u64) -> Option<watch::Receiver<u64>> {
        let ring = self.ring.read().ok()?;
        (!ring.failed && from >= ring.start).then(|| self.head.subscribe())
    }

    /// Appends the events after `last` whose etcd key starts with `eprefix` to `out` and
    /// returns the revision the watcher is now at; `None` when the window no longer covers
    /// `last` (or the hub failed).
    fn since(&self, last: u64, eprefix: &str, out: &mut VecDeque<Arc<Cached>>) -> Option<u64> {
        let ring = self.ring.read().ok()?;
        if ring.failed || last < ring.start {
            return None;
        }
        let first = ring.events.partition_point(|c| c.event.revision <= last);
        out.extend(
            ring.events
                .range(first..)
                .filter(|c| c.ekey.starts_with(eprefix))
                .cloned(),
        );
        Some(last.max(ring.head))
    }

    fn push(&self, batch: Vec<Arc<Cached>>, head: u64) {
        if let Ok(mut ring) = self.ring.write() {
            for cached in &batch {
                match cached.event.kind {
                    EventType::Deleted => ring.objects.remove(&cached.ekey),
                    EventType::Added | EventType::Modified => ring
                        .objects
                        .insert(cached.ekey.clone(), cached.event.object.clone()),
                };
            }
            ring.events.extend(batch);
            ring.head = ring.head.max(head);
            while ring.events.len() > self.capacity {
                if let Some(old) = ring.events.pop_front() {
                    ring.start = old.event.revision;
                }
            }
        }
        self.head.send_replace(head);
    }

    fn fail(&self) {
        if let Ok(mut ring) = self.ring.write() {
            ring.failed = true;
            ring.events.clear();
            ring.objects.clear();
        }
        self.head.send_modify(|_| {});
    }
}

/// A hub's task: the upstream watch's events into the ring, until the hub is dropped or the
/// upstream fails for good.
async fn run_hub(
    shared: Arc<Shared>,
    mut upstream: Upstream,
    layout: KeyLayout,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        let next = tokio::select! {
            _ = &mut stop => return,
            next = upstream.next() => next,
        };
        let (resp, after) = match next {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!("watch cache: upstream watch ended ({e}); its watchers go to etcd");
                shared.fail();
                return;
            }
        };
        let batch = match translate_response(&layout, &resp, after) {
            Ok(events) => events
                .into_iter()
                .map(|(ekey, event)| Arc::new(Cached { ekey, event }))
                .collect(),
            Err(e) => {
                // Each watcher's own etcd watch meets the same event and ends with the
                // same error, as it would have without the cache.
                tracing::warn!("watch cache: {e}; its watchers go to etcd");
                shared.fail();
                return;
            }
        };
        shared.push(batch, upstream.last());
    }
}

/// A client watch served from a hub.
struct Watcher {
    /// `None` once it moved to its own etcd watch.
    hub: Option<Arc<Hub>>,
    store: EtcdStore,
    prefix: String,
    eprefix: String,
    /// The highest revision it passed on, or skipped as not its prefix's.
    last: u64,
    rx: watch::Receiver<u64>,
    pending: VecDeque<Arc<Cached>>,
    direct: Option<EventStream>,
    /// Advanced to `last` whenever nothing of it is pending (see [`EventStream::progress`]).
    progress: Progress,
}

type Step = Option<(Result<Event, StoreError>, Option<Watcher>)>;

async fn step(state: Option<Watcher>) -> Step {
    use futures::StreamExt;
    let mut w = state?;
    loop {
        if let Some(direct) = w.direct.as_mut() {
            return match direct.next().await? {
                Ok(event) => Some((Ok(event), Some(w))),
                Err(e) => Some((Err(e), None)),
            };
        }
        if let Some(cached) = w.pending.pop_front() {
            if w.pending.is_empty() {
                // Every event of the prefix up to `last` is out with this one.
                w.progress.advance(w.last);
            }
            return Some((Ok(cached.event.clone()), Some(w)));
        }
        let hub = w.hub.as_ref()?.clone();
        w.rx.borrow_and_update();
        match hub.shared.since(w.last, &w.eprefix, &mut w.pending) {
            Some(at) => {
                w.last = at;
                if w.pending.is_empty() {
                    // Nothing of this prefix up to the head: the watch has passed it.
                    w.progress.advance(at);
                }
                if w.pending.is_empty() && w.rx.changed().await.is_err() {
                    // The hub's task is gone (cannot happen while this holds the hub); the
                    // next round finds it failed or goes on.
                    tokio::task::yield_now().await;
                }
            }
            None => {
                w.hub = None;
                w.store
                    .inner
                    .cache
                    .counters
                    .fallbacks
                    .fetch_add(1, Ordering::Relaxed);
                match direct(&w.store, &w.prefix, w.last).await {
                    Ok(stream) => w.direct = Some(stream),
                    Err(e) => return Some((Err(e), None)),
                }
            }
        }
    }
}
