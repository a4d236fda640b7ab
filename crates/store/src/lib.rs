//! Persistent object store with monotonic revisions and watch history (redb).
