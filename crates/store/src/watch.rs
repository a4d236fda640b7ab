//! Watch streams: retained history first, then live events, without gaps or duplicates.
//!
//! The stream subscribes to the live broadcast *before* it reads history, so every event is in
//! at least one of the two; it remembers the highest revision it has passed and drops anything
//! at or below it. A watcher that falls behind the broadcast (`Lagged`) goes back to reading
//! history from where it was, so a slow consumer never silently misses events; if that history
//! is gone meanwhile, the stream ends with [`StoreError::Gone`].

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use tokio::sync::broadcast::{self, error::RecvError};

use crate::redb_store::Inner;
use crate::{Event, EventStream, Progress, StoreError};

/// Events read from history per blocking read.
const HISTORY_CHUNK: usize = 512;

enum Mode {
    Replay,
    Live,
}

struct State {
    /// Weak, so an open watch does not keep the database open after the store is dropped.
    inner: Weak<Inner>,
    prefix: String,
    last: u64,
    rx: broadcast::Receiver<Arc<Event>>,
    mode: Mode,
    pending: VecDeque<Event>,
    /// Advanced to `last` whenever nothing of it is pending (see [`EventStream::progress`]).
    progress: Progress,
}

pub(crate) fn watch(
    inner: &Arc<Inner>,
    prefix: &str,
    from_revision: u64,
) -> Result<EventStream, StoreError> {
    let rx = inner.events.subscribe();
    let compacted = inner.compacted()?;
    if from_revision < compacted {
        return Err(StoreError::Gone {
            requested: from_revision,
            compacted,
        });
    }
    let progress = Progress::new(from_revision);
    let state = State {
        inner: Arc::downgrade(inner),
        prefix: prefix.to_string(),
        last: from_revision,
        rx,
        mode: Mode::Replay,
        pending: VecDeque::new(),
        progress: progress.clone(),
    };
    Ok(EventStream::with_progress(
        progress,
        futures::stream::unfold(Some(state), step),
    ))
}

type Step = Option<(Result<Event, StoreError>, Option<State>)>;

async fn step(state: Option<State>) -> Step {
    let mut st = state?;
    loop {
        if let Some(event) = st.pending.pop_front() {
            if st.pending.is_empty() {
                // Every event of the prefix up to `last` is out with this one.
                st.progress.advance(st.last);
            }
            return Some((Ok(event), Some(st)));
        }
        // Nothing pending: what `last` passed was not this prefix's.
        st.progress.advance(st.last);
        match st.mode {
            Mode::Replay => {
                let inner = st.inner.upgrade()?;
                let (prefix, after) = (st.prefix.clone(), st.last);
                let read = tokio::task::spawn_blocking(move || {
                    inner.history(&prefix, after, HISTORY_CHUNK)
                })
                .await;
                let chunk = match read {
                    Ok(Ok(chunk)) => chunk,
                    Ok(Err(e)) => return Some((Err(e), None)),
                    Err(e) => return Some((Err(e.into()), None)),
                };
                st.last = st.last.max(chunk.scanned);
                st.pending.extend(chunk.events);
                if chunk.at_head {
                    st.mode = Mode::Live;
                }
            }
            Mode::Live => match st.rx.recv().await {
                Ok(event) => {
                    if event.revision > st.last {
                        st.last = event.revision;
                        if event.key.starts_with(&st.prefix) {
                            return Some((Ok((*event).clone()), Some(st)));
                        }
                    }
                }
                Err(RecvError::Lagged(_)) => st.mode = Mode::Replay,
                Err(RecvError::Closed) => return None,
            },
        }
    }
}
