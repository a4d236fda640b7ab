//! Watches on etcd: `Watch(prefix, start_revision = from + 1, prev_kv, progress_notify)` turned
//! into store events as kube-apiserver's watcher does (`etcd3/event.go` `parseEvent`): a PUT whose
//! `create_revision` equals its `mod_revision` is `ADDED`, another PUT `MODIFIED` (with the
//! previous object from `prev_kv`), a DELETE is `DELETED` with the last state from `prev_kv`
//! stamped with the deletion revision.
//!
//! The stream resumes by itself when its member goes away or loses its leader: it opens the
//! watch again (through any member) from the last revision it passed on, and drops anything at
//! or below it (etcd 3.4.23 can repeat events, fixed in 3.4.24), so the caller sees no gap and
//! no duplicate. A watch whose history was compacted away ends with [`StoreError::Gone`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use etcd_client::{EventType as EtcdEventType, GetOptions, WatchOptions, WatchStream};

use super::{EtcdStore, MAX_MESSAGE, backend, compact, decode, to_i64};
use crate::{Event, EventStream, EventType, StoreError, stamp};

/// How long a watch keeps trying to reopen before it gives up with a backend error.
const RESUME_FOR: Duration = Duration::from_secs(30);

struct State {
    store: EtcdStore,
    /// The etcd prefix watched.
    eprefix: String,
    /// The highest revision passed on (or the watch's start).
    last: u64,
    stream: Option<WatchStream>,
    pending: VecDeque<Event>,
    /// When the current run of failed reopen attempts began.
    failing_since: Option<Instant>,
}

pub(super) async fn watch(
    store: &EtcdStore,
    prefix: &str,
    from_revision: u64,
) -> Result<EventStream, StoreError> {
    let eprefix = store.inner.layout.prefix(prefix)?;
    check_history(store, from_revision).await?;
    let stream = open(store, &eprefix, from_revision).await?;
    let state = State {
        store: store.clone(),
        eprefix,
        last: from_revision,
        stream: Some(stream),
        pending: VecDeque::new(),
        failing_since: None,
    };
    Ok(Box::pin(futures::stream::unfold(Some(state), step)))
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

async fn open(store: &EtcdStore, eprefix: &str, after: u64) -> Result<WatchStream, StoreError> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(to_i64(after.saturating_add(1)))
        .with_prev_key()
        .with_progress_notify();
    store
        .inner
        .client
        .watch_client()
        .max_decoding_message_size(MAX_MESSAGE)
        .watch(eprefix, Some(options))
        .await
        .map_err(backend)
}

type Step = Option<(Result<Event, StoreError>, Option<State>)>;

async fn step(state: Option<State>) -> Step {
    let mut st = state?;
    loop {
        if let Some(event) = st.pending.pop_front() {
            return Some((Ok(event), Some(st)));
        }
        let Some(stream) = st.stream.as_mut() else {
            match open(&st.store, &st.eprefix, st.last).await {
                Ok(stream) => st.stream = Some(stream),
                Err(e) => {
                    if let Err(e) = st.wait_before_retry(e).await {
                        return Some((Err(e), None));
                    }
                }
            }
            continue;
        };
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() {
                    st.stream = None;
                    if resp.compact_revision() > 0 {
                        let compacted = u64::try_from(resp.compact_revision() - 1).unwrap_or(0);
                        let gone = StoreError::Gone {
                            requested: st.last,
                            compacted,
                        };
                        return Some((Err(gone), None));
                    }
                    // Cancelled for another reason (its member lost the leader): resume.
                    let reason = format!("watch cancelled: {}", resp.cancel_reason());
                    if let Err(e) = st.wait_before_retry(StoreError::Backend(reason)).await {
                        return Some((Err(e), None));
                    }
                    continue;
                }
                st.failing_since = None;
                for ev in resp.events() {
                    match st.translate(ev) {
                        Ok(Some(event)) => {
                            st.last = event.revision;
                            st.pending.push_back(event);
                        }
                        Ok(None) => {}
                        Err(e) => return Some((Err(e), None)),
                    }
                }
            }
            Ok(None) => st.stream = None,
            Err(e) => {
                st.stream = None;
                if let Err(e) = st.wait_before_retry(backend(e)).await {
                    return Some((Err(e), None));
                }
            }
        }
    }
}

impl State {
    /// Sleeps a little before the next attempt, or gives `err` back once attempts have failed
    /// for [`RESUME_FOR`].
    async fn wait_before_retry(&mut self, err: StoreError) -> Result<(), StoreError> {
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() > RESUME_FOR {
            return Err(err);
        }
        tracing::debug!("etcd watch on {} resuming after: {err}", self.eprefix);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(())
    }

    fn translate(&self, ev: &etcd_client::Event) -> Result<Option<Event>, StoreError> {
        let Some(kv) = ev.kv() else {
            return Ok(None);
        };
        let revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
        if revision <= self.last {
            return Ok(None);
        }
        let ekey = String::from_utf8_lossy(kv.key());
        let Some(key) = self.store.inner.layout.from_etcd(&ekey) else {
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
                        "{key}: etcd sent the deletion at revision {revision} without the \
                         previous value"
                    )));
                };
                let mut last = prev.clone();
                stamp(&key, &mut last, revision)?;
                (EventType::Deleted, last, Some(prev))
            }
        };
        Ok(Some(Event {
            revision,
            kind,
            key,
            object,
            prev_object,
        }))
    }
}

/// The oldest revision a watch may start from after etcd compacted at or above `probe`
/// (etcd's compact revision minus one), learned from the cancellation of a watch at `probe`.
pub(super) async fn probe_compacted(store: &EtcdStore, probe: u64) -> Option<u64> {
    let options = WatchOptions::new().with_start_revision(to_i64(probe));
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
