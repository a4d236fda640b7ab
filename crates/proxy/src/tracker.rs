//! Change tracking: every object's changes between two syncs coalesce into one
//! previous/current pair, and pairs that end where they started are dropped.

use std::collections::BTreeMap;

/// The net change of one object since the last sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change<V> {
    /// What the last sync saw (`None`: absent).
    pub previous: Option<V>,
    /// What the next sync must see (`None`: deleted).
    pub current: Option<V>,
}

/// Coalesces changes per key (upstream's `ServiceChangeTracker`/`EndpointsChangeTracker`).
#[derive(Clone, Debug)]
pub struct ChangeTracker<K, V> {
    pending: BTreeMap<K, Change<V>>,
}

impl<K, V> Default for ChangeTracker<K, V> {
    fn default() -> Self {
        Self {
            pending: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, V: PartialEq + Clone> ChangeTracker<K, V> {
    /// Records that `key` went from `previous` to `current`. The earliest `previous` since the
    /// last `take` is kept; if the result is a no-op the key is forgotten. Returns whether a
    /// change is now pending for `key`.
    pub fn record(&mut self, key: &K, previous: Option<V>, current: Option<V>) -> bool {
        let change = self.pending.entry(key.clone()).or_insert_with(|| Change {
            previous,
            current: None,
        });
        change.current = current;
        if change.previous == change.current {
            self.pending.remove(key);
            return false;
        }
        true
    }

    /// Number of keys with a pending change.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes every pending change, leaving the tracker empty.
    pub fn take(&mut self) -> BTreeMap<K, Change<V>> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_to_first_previous_and_last_current() {
        let mut t = ChangeTracker::<&str, u32>::default();
        assert!(t.record(&"a", None, Some(1)));
        assert!(t.record(&"a", Some(1), Some(2)));
        let taken = t.take();
        assert_eq!(
            taken[&"a"],
            Change {
                previous: None,
                current: Some(2)
            }
        );
        assert!(t.is_empty());
    }

    #[test]
    fn drops_changes_that_return_to_the_start() {
        let mut t = ChangeTracker::<&str, u32>::default();
        t.record(&"a", Some(1), Some(2));
        assert!(!t.record(&"a", Some(2), Some(1)));
        t.record(&"b", None, Some(1));
        assert!(!t.record(&"b", Some(1), None));
        assert!(!t.record(&"c", Some(5), Some(5)));
        assert_eq!(t.len(), 0);
    }
}
