//! Persistent object store with etcd semantics: one global, monotonic revision, atomic writes,
//! and a watch history window. Objects are JSON values stored under keys shaped like
//! `/{group-or-core}/{resource}/{namespace-or-empty}/{name}`; each write stamps
//! `metadata.resourceVersion` with the revision it committed at.
//!
//! The API server only sees the narrow [`Store`] trait. [`RedbStore`] is the embedded
//! implementation on `redb`; [`EtcdStore`] (cargo feature `etcd`) keeps the objects in an etcd
//! cluster with kube-apiserver's key layout, so that several API servers can share them.
//!
//! **Architecture Invariant:** a write is acknowledged only after its transaction (object +
//! history event + revision counter) is durably committed, and it is published to watchers only
//! after that, in revision order. This crate knows nothing about Kubernetes kinds, validation or
//! HTTP.

mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod event_stream;
mod redb_store;
mod watch;
mod watch_cache;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use error::StoreError;
#[cfg(feature = "etcd")]
pub use etcd::local as local_etcd;
#[cfg(feature = "etcd")]
pub use etcd::{COMPACT_REV_KEY, CompactorState, EtcdOptions, EtcdStore, EtcdTls, KeyLayout};
/// The stream a watch yields, and its progress. It ends after yielding an error (for example
/// [`StoreError::Gone`]).
pub use event_stream::{EventStream, Progress};
pub use redb_store::{RedbStore, StoreOptions};
pub use watch_cache::{DEFAULT_WATCH_CACHE_SIZE, WatchCacheOptions, WatchCacheStats};

/// A boxed, sendable future, so that [`Store`] stays object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The read-modify-write step of [`Store::guaranteed_update`]. It sees the current object (or
/// `None`) and decides what to write. An implementation may call it more than once (an etcd
/// store retries it on a conflicting concurrent write), so it must not have side effects that
/// matter beyond its return value.
pub type UpdateFn = Box<dyn FnMut(Option<&Value>) -> Result<Mutation, StoreError> + Send>;

/// What an [`UpdateFn`] asks the store to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Mutation {
    /// Write this object (an `ADDED` event when the key was absent, `MODIFIED` otherwise).
    Put(Value),
    /// Delete the object (a `DELETED` event). Deleting an absent key is [`StoreError::NotFound`].
    Delete,
    /// Leave everything as it is; no revision is consumed.
    Keep,
}

/// The result of [`Store::guaranteed_update`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The object was written; this is its stored form (with the new resourceVersion).
    Written(Value),
    /// The object was deleted; this is its last state, stamped with the deletion revision.
    Deleted(Value),
    /// Nothing changed; the current object, if any.
    Unchanged(Option<Value>),
}

/// The kind of change a watch event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The wire name Kubernetes uses (`ADDED`, `MODIFIED`, `DELETED`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The revision the change committed at (equal to the object's resourceVersion).
    pub revision: u64,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub key: String,
    /// The object after the change; for `DELETED`, its last state.
    pub object: Value,
    /// The object before the change (`None` for `ADDED`), so that a filtered watch can tell an
    /// object leaving its selector (sent as `DELETED`) from one that never matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_object: Option<Value>,
}

/// A consistent list: every item as of `revision`.
#[derive(Debug, Clone, PartialEq)]
pub struct ListResult {
    /// Items in key order.
    pub items: Vec<Value>,
    /// The store revision the list was read at; a watch from it misses nothing.
    pub revision: u64,
}

/// One page of a list ([`Store::list_page`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage {
    /// Items in key order.
    pub items: Vec<Value>,
    /// The store revision the page was read at.
    pub revision: u64,
    /// How many objects under the prefix come after the page, at that revision.
    pub remaining: usize,
}

/// What a prefix holds, read without decoding the objects (the API server's
/// `apiserver_storage_objects` and size metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// How many objects are stored under the prefix.
    pub objects: u64,
    /// The bytes of their stored encodings.
    pub bytes: u64,
}

/// The storage interface the API server is written against.
///
/// Revisions are global and strictly increasing across all keys. Every mutating call is atomic
/// and durable when it returns `Ok`.
pub trait Store: Send + Sync + 'static {
    /// The object under `key`, if any.
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Value>, StoreError>>;

    /// The object under `key` as this process's cache of its resource holds it, which may be
    /// behind the store by writes not yet seen there (kube-apiserver's admission reads
    /// namespaces from an informer's lister the same way); the store is read, as by
    /// [`Store::get`], when there is no such cache or it does not hold the key. For checks
    /// that tolerate a moment's staleness only. The default is [`Store::get`].
    fn get_cached(&self, key: &str) -> BoxFuture<'_, Result<Option<Value>, StoreError>> {
        self.get(key)
    }

    /// Every object whose key starts with `prefix`, read at one revision.
    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<ListResult, StoreError>>;

    /// Every object under `prefix` as it was at `revision` (etcd's read at a revision; a
    /// list with `resourceVersionMatch=Exact`). [`StoreError::Gone`] when that revision is
    /// older than the retained history, [`StoreError::FutureRevision`] when it is newer than
    /// the store.
    fn list_at(&self, prefix: &str, revision: u64)
    -> BoxFuture<'_, Result<ListResult, StoreError>>;

    /// One page of the list under `prefix`: the objects whose keys are `from` or later (keys
    /// compare as bytes; `from` before `prefix` starts at its first key), in key order, at
    /// most `limit` of them (0: no limit), read at `revision` (the latest when `None`; the
    /// errors of [`Store::list_at`] otherwise), and how many come after them. A page costs
    /// what it returns: the objects after it are counted, not read (kube-apiserver's paged
    /// lists, an etcd range with a limit).
    fn list_page(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
        revision: Option<u64>,
    ) -> BoxFuture<'_, Result<ListPage, StoreError>>;

    /// Stores a new object; [`StoreError::AlreadyExists`] when the key is taken.
    fn create(&self, key: &str, object: Value) -> BoxFuture<'_, Result<Value, StoreError>>;

    /// Replaces an existing object. With `expected_revision`, fails with
    /// [`StoreError::Conflict`] unless the stored object is at exactly that revision.
    fn update(
        &self,
        key: &str,
        object: Value,
        expected_revision: Option<u64>,
    ) -> BoxFuture<'_, Result<Value, StoreError>>;

    /// Deletes an object and returns its last state (stamped with the deletion revision). With
    /// `expected_revision`, fails with [`StoreError::Conflict`] unless it matches.
    fn delete(
        &self,
        key: &str,
        expected_revision: Option<u64>,
    ) -> BoxFuture<'_, Result<Value, StoreError>>;

    /// Reads the object, lets `update` decide, and writes the decision, atomically.
    fn guaranteed_update(
        &self,
        key: &str,
        update: UpdateFn,
    ) -> BoxFuture<'_, Result<Outcome, StoreError>>;

    /// [`Store::guaranteed_update`] starting from `believed`, the object exactly as the caller
    /// last read it from this store (`None`: believed absent), as kube-apiserver's
    /// GuaranteedUpdate starts from a cached existing object. A back end whose writes compare
    /// and swap on the revision (etcd) decides on the belief and skips its own read, one round
    /// trip fewer; when the belief is stale, the compare fails and it decides again on what it
    /// holds, so the outcome is the same as without a belief. `update` may see the stale
    /// belief first. The default ignores the belief.
    fn guaranteed_update_from(
        &self,
        key: &str,
        believed: Option<Value>,
        update: UpdateFn,
    ) -> BoxFuture<'_, Result<Outcome, StoreError>> {
        let _ = believed;
        self.guaranteed_update(key, update)
    }

    /// Events for keys under `prefix` with a revision greater than `from_revision`: first the
    /// retained history, then live changes, with no gap and no duplicate. Fails with
    /// [`StoreError::Gone`] when `from_revision` is older than the retained history (the
    /// stream itself ends with it when history is compacted while it catches up). The
    /// stream's [`EventStream::progress`] is how far it got through the history, past other
    /// keys' events too: a revision to resume from (what a bookmark carries).
    fn watch(
        &self,
        prefix: &str,
        from_revision: u64,
    ) -> BoxFuture<'_, Result<EventStream, StoreError>>;

    /// The latest committed revision.
    fn current_revision(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// How many objects `prefix` holds and their encoded size. The default lists them; an
    /// implementation that can count without decoding should.
    fn stats(&self, prefix: &str) -> BoxFuture<'_, Result<PrefixStats, StoreError>> {
        let list = self.list(prefix);
        Box::pin(async move {
            let list = list.await?;
            Ok(PrefixStats {
                objects: list.items.len() as u64,
                bytes: list
                    .items
                    .iter()
                    .map(|o| serde_json::to_vec(o).map_or(0, |b| b.len() as u64))
                    .sum(),
            })
        })
    }

    /// The bytes the store's database takes on disk, when it is a file of this process.
    fn size_bytes(&self) -> Option<u64> {
        None
    }
}

/// Parses a resourceVersion string into a revision.
pub fn parse_revision(resource_version: &str) -> Option<u64> {
    resource_version.parse().ok()
}

/// Reads `metadata.resourceVersion` of an object as a revision.
pub fn object_revision(object: &Value) -> Option<u64> {
    object
        .get("metadata")?
        .get("resourceVersion")?
        .as_str()
        .and_then(parse_revision)
}

/// Sets `metadata.resourceVersion` to the revision; fails unless the object and its metadata
/// are JSON objects (so it also validates what a back end is asked to store).
pub(crate) fn stamp(key: &str, object: &mut Value, revision: u64) -> Result<(), StoreError> {
    let invalid = |reason: &str| StoreError::InvalidObject {
        key: key.into(),
        reason: reason.into(),
    };
    let map = object
        .as_object_mut()
        .ok_or_else(|| invalid("not a JSON object"))?;
    let metadata = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .ok_or_else(|| invalid("metadata is not a JSON object"))?;
    metadata.insert(
        "resourceVersion".into(),
        Value::String(revision.to_string()),
    );
    Ok(())
}

/// The object a `create` or `update` wrote.
pub(crate) fn written(outcome: Outcome, key: &str) -> Result<Value, StoreError> {
    match outcome {
        Outcome::Written(object) => Ok(object),
        _ => Err(StoreError::Backend(format!("{key}: write did not write"))),
    }
}

/// The object a `delete` removed, stamped with the deletion revision.
pub(crate) fn deleted(outcome: Outcome, key: &str) -> Result<Value, StoreError> {
    match outcome {
        Outcome::Deleted(object) => Ok(object),
        _ => Err(StoreError::Backend(format!("{key}: delete did not delete"))),
    }
}

/// What `update` (with `Mutation::Put`) and `delete` (with `Mutation::Delete`) decide: the
/// object must exist (at `expected`, when given), then `mutation`.
pub(crate) fn if_exists(
    key: &str,
    expected: Option<u64>,
    mutation: Mutation,
) -> impl FnMut(Option<&Value>) -> Result<Mutation, StoreError> + Send + use<> {
    let key = key.to_string();
    move |current| {
        let current = current.ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
        check_revision(&key, current, expected)?;
        Ok(mutation.clone())
    }
}

/// [`StoreError::Conflict`] unless `current` is at the `expected` revision (when one is given).
pub(crate) fn check_revision(
    key: &str,
    current: &Value,
    expected: Option<u64>,
) -> Result<(), StoreError> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let actual = object_revision(current).unwrap_or(0);
    if actual != expected {
        return Err(StoreError::Conflict {
            key: key.into(),
            expected,
            actual,
        });
    }
    Ok(())
}
