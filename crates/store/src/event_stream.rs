//! What a watch gives its reader: the events of its prefix, in revision order, and how far the
//! watch has got through the store's history, events of other prefixes included.
//!
//! A watch of a quiet prefix sees no event while the store's revision moves on (other
//! resources, other namespaces). If the reader could only name the revision of the last event
//! it got, it would resume from there after a reconnect, and once the store has compacted that
//! revision away (etcd: every 5 minutes) the resumed watch is refused and the reader re-lists
//! everything. So the stream also says its **progress**: a revision through which it has
//! handed out every event of its prefix. kube-apiserver's bookmarks carry the same (its
//! cacher's last processed revision), and so do svcnet's ([`EventStream::progress`]).
//!
//! **Architecture Invariant:** when `progress()` returns P, every event of the prefix with a
//! revision at or below P has already been yielded by this stream (or was at or below the
//! revision the watch started from). A watch resumed from P therefore misses nothing.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;

use crate::{Event, StoreError};

/// A watch's events and its progress (see the module's notes).
pub struct EventStream {
    events: Pin<Box<dyn Stream<Item = Result<Event, StoreError>> + Send>>,
    progress: Progress,
}

impl EventStream {
    /// A stream whose progress is the revision it started from, then the revision of each
    /// event it yields.
    pub fn new(
        from_revision: u64,
        events: impl Stream<Item = Result<Event, StoreError>> + Send + 'static,
    ) -> Self {
        Self::with_progress(Progress::new(from_revision), events)
    }

    /// A stream whose producer also advances `progress` past revisions it skipped (events of
    /// other prefixes), keeping the invariant: it advances only once every event of its prefix
    /// up to there has been yielded.
    pub fn with_progress(
        progress: Progress,
        events: impl Stream<Item = Result<Event, StoreError>> + Send + 'static,
    ) -> Self {
        EventStream {
            events: Box::pin(events),
            progress,
        }
    }

    /// The revision through which every event of the prefix has been yielded.
    pub fn progress(&self) -> u64 {
        self.progress.get()
    }
}

impl Stream for EventStream {
    type Item = Result<Event, StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.events.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Ok(event))) = &polled {
            // Events come in revision order: the ones before this one were yielded already.
            self.progress.advance(event.revision);
        }
        polled
    }
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("progress", &self.progress.get())
            .finish_non_exhaustive()
    }
}

/// A watch's progress, shared between the stream and its producer.
#[derive(Debug, Clone)]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    pub fn new(from_revision: u64) -> Self {
        Progress(Arc::new(AtomicU64::new(from_revision)))
    }

    /// Moves the progress to `revision` if that is further.
    pub fn advance(&self, revision: u64) {
        self.0.fetch_max(revision, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use serde_json::json;

    fn event(revision: u64) -> Result<Event, StoreError> {
        Ok(Event {
            revision,
            kind: crate::EventType::Added,
            key: format!("/core/configmaps/ns/c{revision}"),
            object: json!({}),
            prev_object: None,
        })
    }

    #[tokio::test]
    async fn progress_follows_what_was_yielded() {
        let mut s = EventStream::new(5, futures::stream::iter([event(7), event(9)]));
        assert_eq!(s.progress(), 5, "the start, before anything is yielded");
        s.next().await;
        assert_eq!(s.progress(), 7);
        s.next().await;
        assert_eq!(s.progress(), 9);
        // A producer's skipped revisions move it on; it never goes back.
        let p = Progress::new(3);
        let mut s = EventStream::with_progress(p.clone(), futures::stream::iter([event(4)]));
        p.advance(12);
        s.next().await;
        assert_eq!(s.progress(), 12);
    }
}
