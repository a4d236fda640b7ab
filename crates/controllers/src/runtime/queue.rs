//! A coalescing work queue (a key queued twice is processed once) and expectations, which keep
//! a controller from acting on a cache that has not yet seen its own creates and deletes.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// `namespace/name` of the object a controller reconciles.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Which lane a queued key waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Queued by a watch event or a requeue: something changed.
    Event,
    /// Queued by the periodic resync: nothing is known to have changed.
    Resync,
}

#[derive(Default)]
struct QueueState {
    events: VecDeque<Key>,
    resyncs: VecDeque<Key>,
    /// Every queued key and its lane. A key in both deques is queued once: an entry whose
    /// lane does not match is stale and skipped.
    queued: HashMap<Key, Lane>,
}

impl QueueState {
    fn pop(&mut self) -> Option<Key> {
        for lane in [Lane::Event, Lane::Resync] {
            let deque = match lane {
                Lane::Event => &mut self.events,
                Lane::Resync => &mut self.resyncs,
            };
            while let Some(k) = deque.pop_front() {
                if self.queued.get(&k) == Some(&lane) {
                    self.queued.remove(&k);
                    return Some(k);
                }
            }
        }
        None
    }
}

/// A FIFO of keys without duplicates, in two lanes: keys queued by changes are taken before
/// keys queued by the periodic resync, so a change never waits behind a resync of every
/// object (10k services took a single worker 20–30 s, during which new pods stayed out of
/// their services). A key added while it is being processed is queued again, so no change
/// is lost; a key waiting for its resync that changes moves to the event lane.
#[derive(Default)]
pub struct WorkQueue {
    state: Mutex<QueueState>,
    notify: Notify,
}

impl WorkQueue {
    /// Queues a key because something about it changed.
    pub fn add(&self, key: Key) {
        self.push(key, Lane::Event);
    }

    /// Queues a key for the periodic resync (after every changed key).
    pub fn add_resync(&self, key: Key) {
        self.push(key, Lane::Resync);
    }

    fn push(&self, key: Key, lane: Lane) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match (st.queued.get(&key).copied(), lane) {
            (Some(Lane::Event), _) | (Some(Lane::Resync), Lane::Resync) => return,
            _ => {}
        }
        st.queued.insert(key.clone(), lane);
        match lane {
            Lane::Event => st.events.push_back(key),
            Lane::Resync => st.resyncs.push_back(key),
        }
        drop(st);
        self.notify.notify_one();
    }

    pub fn add_after(self: &Arc<Self>, key: Key, delay: Duration) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            me.add(key);
        });
    }

    pub async fn next(&self) -> Key {
        loop {
            if let Some(k) = self.state.lock().unwrap_or_else(|e| e.into_inner()).pop() {
                return k;
            }
            self.notify.notified().await;
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queued
            .len()
    }
}

struct Pending {
    /// (name, should exist)
    names: Vec<(String, bool)>,
    deadline: Instant,
}

/// What a controller wrote and has not yet seen in its cache, per key. Upstream's
/// `ControllerExpectations` counts; we remember names, which the stores can check directly.
pub struct Expectations {
    pending: Mutex<HashMap<Key, Pending>>,
    ttl: Duration,
}

impl Expectations {
    pub fn new(ttl: Duration) -> Self {
        Self {
            pending: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    /// Remember that `created` names should appear and `deleted` ones disappear.
    pub fn expect(&self, key: &Key, created: Vec<String>, deleted: Vec<String>) {
        if created.is_empty() && deleted.is_empty() {
            return;
        }
        let mut map = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(key.clone()).or_insert_with(|| Pending {
            names: Vec::new(),
            deadline: Instant::now(),
        });
        entry.names.extend(created.into_iter().map(|n| (n, true)));
        entry.names.extend(deleted.into_iter().map(|n| (n, false)));
        entry.deadline = Instant::now() + self.ttl;
    }

    /// True when the cache reflects every expected write (or they expired); `present` tells
    /// whether a name is in the cache.
    pub fn satisfied(&self, key: &Key, present: impl Fn(&str) -> bool) -> bool {
        let mut map = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = map.get_mut(key) else {
            return true;
        };
        p.names.retain(|(name, want)| present(name) != *want);
        if p.names.is_empty() || Instant::now() > p.deadline {
            map.remove(key);
            return true;
        }
        false
    }

    pub fn forget(&self, key: &Key) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn coalesces_and_keeps_order() {
        let q = WorkQueue::default();
        q.add(Key::new("a", "1"));
        q.add(Key::new("a", "2"));
        q.add(Key::new("a", "1"));
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Key::new("a", "1"));
        q.add(Key::new("a", "1"));
        assert_eq!(q.next().await, Key::new("a", "2"));
        assert_eq!(q.next().await, Key::new("a", "1"));
    }

    #[tokio::test]
    async fn changes_go_before_the_resync_and_each_key_runs_once() {
        let q = WorkQueue::default();
        for i in 0..1000 {
            q.add_resync(Key::new("bg", i.to_string()));
        }
        q.add(Key::new("a", "changed"));
        // A key waiting for its resync that changes moves ahead, and is taken once.
        q.add(Key::new("bg", "500"));
        q.add_resync(Key::new("bg", "500"));
        q.add_resync(Key::new("a", "changed"));
        assert_eq!(q.len(), 1001);
        assert_eq!(q.next().await, Key::new("a", "changed"));
        assert_eq!(q.next().await, Key::new("bg", "500"));
        let mut rest = Vec::new();
        while q.len() > 0 {
            rest.push(q.next().await);
        }
        assert_eq!(rest.len(), 999);
        assert_eq!(rest.first(), Some(&Key::new("bg", "0")));
        assert!(!rest.contains(&Key::new("bg", "500")));
        // Taken, then queued again by a resync: it runs again (nothing is lost).
        q.add_resync(Key::new("bg", "500"));
        assert_eq!(q.next().await, Key::new("bg", "500"));
    }

    #[test]
    fn expectations_wait_for_the_cache() {
        let e = Expectations::new(Duration::from_secs(60));
        let k = Key::new("ns", "svc");
        assert!(e.satisfied(&k, |_| false));
        e.expect(&k, vec!["new".into()], vec!["old".into()]);
        assert!(!e.satisfied(&k, |n| n == "old"));
        assert!(!e.satisfied(&k, |n| n == "new" || n == "old"));
        assert!(e.satisfied(&k, |n| n == "new"));
        let short = Expectations::new(Duration::ZERO);
        short.expect(&k, vec!["never".into()], vec![]);
        std::thread::sleep(Duration::from_millis(2));
        assert!(short.satisfied(&k, |_| false), "expired");
    }
}
