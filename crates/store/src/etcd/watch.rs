//! Watches on etcd: `Watch(prefix, start_revision = from + 1, prev_kv, progress_notify)` turned
//! into store events as kube-apiserver's watcher does (`etcd3/event.go` `parseEvent`): a PUT whose
//! `create_revision` equals its `mod_revision` is `ADDED`, another PUT `MODIFIED` (with the
//! previous object from `prev_kv`), a DELETE is `DELETED` with the last state from `prev_kv`
//! stamped with the deletion revision.
//!
//! [`Upstream`] is one etcd watch that resumes by itself when its member goes away or loses its
//! leader: it opens the watch again (through any member) from the last revision it received,
//! and drops anything at or below it (etcd 3.4.23 can repeat events, fixed in 3.4.24), so its
//! reader sees no gap and no duplicate. A watch whose history was compacted away ends with
//! [`StoreError::Gone`]. The watch cache (`cache.rs`) runs one per resource; [`direct`] gives
//! one to a single client, for what the cache does not serve.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, EventType as EtcdEventType, GetOptions, WatchOptions, WatchResponse, WatchStream,
};

use super::cache::Counters;
use super::{EtcdStore, KeyLayout, MAX_MESSAGE, backend, compact, decode, to_i64};
use crate::{Event, EventStream, EventType, StoreError, stamp};

/// How long a watch keeps trying to reopen before it gives up with a backend error.
const RESUME_FOR: Duration = Duration::from_secs(30);

/// One etcd watch on a prefix, resumed after member failures (see the module's notes).
pub(super) struct Upstream {
    client: Client,
    counters: Arc<Counters>,
    key: String,
    /// The highest revision received (or the watch's start).
    last: u64,
    stream: Option<WatchStream>,
    /// When the current run of failed reopen attempts began.
    failing_since: Option<Instant>,
}

impl Upstream {
    /// Opens a watch on the prefix `key` for revisions after `after`.
    pub(super) async fn open(
        client: Client,
        counters: Arc<Counters>,
        key: &str,
        after: u64,
    ) -> Result<Self, StoreError> {
        let mut up = Upstream {
            client,
            counters,
            key: key.to_string(),
            last: after,
            stream: None,
            failing_since: None,
        };
        up.stream = Some(up.connect().await?);
        Ok(up)
    }

    /// The highest revision received so far.
    pub(super) fn last(&self) -> u64 {
        self.last
    }

    async fn connect(&self) -> Result<WatchStream, StoreError> {
        let options = WatchOptions::new()
            .with_start_revision(to_i64(self.last.saturating_add(1)))
            .with_prev_key()
            .with_progress_notify()
            .with_prefix();
        self.counters.etcd_watches.fetch_add(1, Ordering::Relaxed);
        self.client
            .watch_client()
            .max_decoding_message_size(MAX_MESSAGE)
            .watch(self.key.as_str(), Some(options))
            .await
            .map_err(backend)
    }

    /// The next response that carries events, and the revision its events must be newer than
    /// to be new (older ones are repeats). Resumes through member failures; fails with
    /// [`StoreError::Gone`] when etcd compacted the history it needs, with a backend error
    /// when reopening kept failing for [`RESUME_FOR`].
    pub(super) async fn next(&mut self) -> Result<(WatchResponse, u64), StoreError> {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                match self.connect().await {
                    Ok(stream) => self.stream = Some(stream),
                    Err(e) => self.wait_before_retry(e).await?,
                }
                continue;
            };
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        self.stream = None;
                        if resp.compact_revision() > 0 {
                            let compacted = u64::try_from(resp.compact_revision() - 1).unwrap_or(0);
                            return Err(StoreError::Gone {
                                requested: self.last,
                                compacted,
                            });
                        }
                        // Cancelled for another reason (its member lost the leader): resume.
                        let reason = format!("watch cancelled: {}", resp.cancel_reason());
                        self.wait_before_retry(StoreError::Backend(reason)).await?;
                        continue;
                    }
                    self.failing_since = None;
                    if resp.events().is_empty() {
                        continue;
                    }
                    let after = self.last;
                    for ev in resp.events() {
                        if let Some(kv) = ev.kv() {
                            let revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
                            self.last = self.last.max(revision);
                        }
                    }
                    if self.last > after {
                        return Ok((resp, after));
                    }
                }
                Ok(None) => self.stream = None,
                Err(e) => {
                    self.stream = None;
                    self.wait_before_retry(backend(e)).await?;
                }
            }
        }
    }

    /// Sleeps a little before the next attempt, or gives `err` back once attempts have failed
    /// for longer than allowed.
    async fn wait_before_retry(&mut self, err: StoreError) -> Result<(), StoreError> {
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() > RESUME_FOR {
            return Err(err);
        }
        tracing::debug!("etcd watch on {} resuming after: {err}", self.key);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(())
    }
}

/// The store event of an etcd event, with its etcd key; `None` for a key outside the layout.
/// A watch response's events after revision `after` (etcd 3.4.23 can repeat events across a
/// reopened watch), translated with their etcd keys; an error drops the whole response.
pub(super) fn translate_response(
    layout: &KeyLayout,
    resp: &etcd_client::WatchResponse,
    after: u64,
) -> Result<Vec<(String, Event)>, StoreError> {
    let mut out = Vec::with_capacity(resp.events().len());
    let mut seen = after;
    for ev in resp.events() {
        let revision = ev
            .kv()
            .map_or(0, |kv| u64::try_from(kv.mod_revision()).unwrap_or(0));
        if revision <= seen {
            continue;
        }
        if let Some((ekey, event)) = translate(layout, ev)? {
            seen = event.revision;
            out.push((ekey, event));
        }
    }
    Ok(out)
}

pub(super) fn translate(
    layout: &KeyLayout,
    ev: &etcd_client::Event,
) -> Result<Option<(String, Event)>, StoreError> {
    let Some(kv) = ev.kv() else {
        return Ok(None);
    };
    let revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
    let ekey = String::from_utf8_lossy(kv.key()).into_owned();
    let Some(key) = layout.from_etcd(&ekey) else {
        return Ok(None);
    };
    let prev = ev.prev_kv().map(|p| decode(&key, p)).transpose()?;
    let (kind, object, prev_object) = match ev.event_type() {
        EtcdEventType::Put if kv.create_revision() == kv.mod_revision() => {
            (EventType::Added, decode(&key, kv)?, None)
        }
        EtcdEventType::Put => (EventType::Modified, decode(&key, kv)?, prev),
        EtcdEventType::Delete => {
            let Some(prev) = prev else {
                return Err(StoreError::Backend(format!(
                    "{key}: etcd sent the deletion at revision {revision} without the previous \
                     value"
                )));
            };
            let mut last = prev.clone();
            stamp(&key, &mut last, revision)?;
            (EventType::Deleted, last, Some(prev))
        }
    };
    Ok(Some((
        ekey,
        Event {
            revision,
            kind,
            key,
            object,
            prev_object,
        },
    )))
}

struct State {
    layout: KeyLayout,
    upstream: Upstream,
    pending: VecDeque<Event>,
}

/// A client watch on its own etcd watch: for a prefix the cache does not serve, a revision
/// below the cache's window, or a cached watch that fell out of the window.
pub(super) async fn direct(
    store: &EtcdStore,
    prefix: &str,
    from_revision: u64,
) -> Result<EventStream, StoreError> {
    let eprefix = store.inner.layout.prefix(prefix)?;
    store
        .inner
        .cache
        .counters
        .direct
        .fetch_add(1, Ordering::Relaxed);
    check_history(store, from_revision).await?;
    let upstream = Upstream::open(
        store.inner.client.clone(),
        store.inner.cache.counters.clone(),
        &eprefix,
        from_revision,
    )
    .await?;
    let state = State {
        layout: store.inner.layout.clone(),
        upstream,
        pending: VecDeque::new(),
    };
    Ok(EventStream::new(
        from_revision,
        futures::stream::unfold(Some(state), step),
    ))
}

/// [`StoreError::Gone`] at once when revision `from + 1` is compacted away (a read at it
/// fails exactly when a watch from it would be cancelled); a revision etcd has not reached
/// yet is fine, the watch waits for it.
async fn check_history(store: &EtcdStore, from: u64) -> Result<(), StoreError> {
    let probe = from.saturating_add(1);
    let read = store
        .kv()
        .get(
            store.inner.layout.root(),
            Some(
                GetOptions::new()
                    .with_revision(to_i64(probe))
                    .with_count_only(),
            ),
        )
        .await;
    match read {
        Ok(_) => Ok(()),
        Err(e) => match store.revision_error(&e, probe).await {
            Some(StoreError::Gone { compacted, .. }) => Err(StoreError::Gone {
                requested: from,
                compacted,
            }),
            Some(StoreError::FutureRevision { .. }) => Ok(()),
            _ => Err(backend(e)),
        },
    }
}

type Step = Option<(Result<Event, StoreError>, Option<State>)>;

async fn step(state: Option<State>) -> Step {
    let mut st = state?;
    loop {
        if let Some(event) = st.pending.pop_front() {
            return Some((Ok(event), Some(st)));
        }
        let (resp, after) = match st.upstream.next().await {
            Ok(next) => next,
            Err(e) => return Some((Err(e), None)),
        };
        match translate_response(&st.layout, &resp, after) {
            Ok(events) => st
                .pending
                .extend(events.into_iter().map(|(_, event)| event)),
            Err(e) => return Some((Err(e), None)),
        }
    }
}

/// The oldest revision a watch may start from after etcd compacted at or above `probe`
/// (etcd's compact revision minus one), learned from the cancellation of a watch at `probe`.
pub(super) async fn probe_compacted(store: &EtcdStore, probe: u64) -> Option<u64> {
    let options = WatchOptions::new().with_start_revision(to_i64(probe));
    store
        .inner
        .cache
        .counters
        .etcd_watches
        .fetch_add(1, Ordering::Relaxed);
    let mut stream = store
        .inner
        .client
        .watch_client()
        .watch(compact::COMPACT_REV_KEY, Some(options))
        .await
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(2);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let resp = tokio::time::timeout(left, stream.message())
            .await
            .ok()?
            .ok()??;
        if resp.compact_revision() > 0 {
            return u64::try_from(resp.compact_revision() - 1).ok();
        }
        if resp.canceled() {
            return None;
        }
    }
    None
}
