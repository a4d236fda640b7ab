//! A coalescing work queue (a key queued twice is processed once) and expectations, which keep
//! a controller from acting on a cache that has not yet seen its own creates and deletes.

use std::collections::{HashMap, HashSet, VecDeque};
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

#[derive(Default)]
struct QueueState {
    queue: VecDeque<Key>,
    queued: HashSet<Key>,
}

/// A FIFO of keys without duplicates. A key added while it is being processed is queued
/// again, so no change is lost.
#[derive(Default)]
pub struct WorkQueue {
    state: Mutex<QueueState>,
    notify: Notify,
}

impl WorkQueue {
    pub fn add(&self, key: Key) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.queued.insert(key.clone()) {
            st.queue.push_back(key);
            drop(st);
            self.notify.notify_one();
        }
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
            {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(k) = st.queue.pop_front() {
                    st.queued.remove(&k);
                    return k;
                }
            }
            self.notify.notified().await;
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queue
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
