//! [`RedbStore`]: the embedded [`Store`] on redb.
//!
//! Layout: table `objects` maps a key to the object's JSON; table `events` maps a revision to the
//! JSON of the [`Event`] committed at it (the watch history); table `meta` holds the current
//! and the compacted revision. One redb write transaction per write keeps the three in step.

use std::path::Path;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::{
    BoxFuture, Event, EventStream, EventType, ListPage, ListResult, Mutation, Outcome, PrefixStats,
    Store, StoreError, UpdateFn, deleted, if_exists, stamp, written,
};

const OBJECTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("objects");
const EVENTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("events");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const META_REVISION: &str = "revision";
const META_COMPACTED: &str = "compacted";
/// The total size of the retained watch history, in bytes of its stored events.
const META_HISTORY_BYTES: &str = "history_bytes";

/// How many events are buffered per live watcher before it falls back to reading history.
const BROADCAST_CAPACITY: usize = 1024;

/// Tuning of a [`RedbStore`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How many of the latest events the watch history keeps. Older ones are compacted away in
    /// batches of a tenth of this, inside ordinary writes.
    pub history: u64,
    /// How many bytes of events the watch history keeps at most: large objects written again
    /// and again (a 1 MiB ConfigMap created and deleted in a loop) must not grow the history,
    /// the file and the process without bound. Past it the oldest events are compacted away,
    /// down to nine tenths of it; the latest event always stays.
    pub history_bytes: u64,
    /// redb's page cache, in bytes.
    pub cache_bytes: usize,
    /// Whether each commit is fsynced before it is acknowledged. Only tests of unrelated logic
    /// may turn this off.
    pub durable: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            history: 10_000,
            history_bytes: 128 << 20,
            cache_bytes: 64 << 20,
            durable: true,
        }
    }
}

/// The embedded store. Cheap to clone; all clones share one database.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    db: Database,
    /// The database file (its size is reported as the storage size).
    path: std::path::PathBuf,
    /// Serialises writers so that events are published in revision order.
    write_lock: Mutex<()>,
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    options: StoreOptions,
}

/// One chunk of watch history.
pub(crate) struct HistoryChunk {
    pub(crate) events: Vec<Event>,
    /// Every revision up to this one has been looked at.
    pub(crate) scanned: u64,
    /// Whether `scanned` reached the head revision of the read.
    pub(crate) at_head: bool,
}

impl RedbStore {
    /// Opens (or creates) the store in the file at `path`.
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Self, StoreError> {
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create(path.as_ref())?;
        let txn = db.begin_write()?;
        {
            txn.open_table(OBJECTS)?;
            let events = txn.open_table(EVENTS)?;
            let mut meta = txn.open_table(META)?;
            // Stores written before the byte bound was kept: count the history once.
            if meta.get(META_HISTORY_BYTES)?.is_none() {
                let mut bytes = 0u64;
                for entry in events.iter()? {
                    bytes += entry?.1.value().len() as u64;
                }
                meta.insert(META_HISTORY_BYTES, bytes)?;
            }
        }
        txn.commit()?;
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        Ok(RedbStore {
            inner: Arc::new(Inner {
                db,
                path: path.as_ref().to_path_buf(),
                write_lock: Mutex::new(()),
                events,
                options,
            }),
        })
    }

    /// The oldest revision a watch may start from.
    pub fn compacted_revision(&self) -> Result<u64, StoreError> {
        self.inner.meta(META_COMPACTED)
    }

    /// The bytes of events the watch history holds now (see [`StoreOptions::history_bytes`]).
    pub fn history_bytes(&self) -> Result<u64, StoreError> {
        self.inner.meta(META_HISTORY_BYTES)
    }

    /// Drops history so that only the latest `keep` events remain; returns the new compacted
    /// revision. Writes also compact on their own (see [`StoreOptions::history`]).
    pub fn compact(&self, keep: u64) -> Result<u64, StoreError> {
        let _guard = self.inner.lock();
        let txn = self.inner.db.begin_write()?;
        let compacted = {
            let mut meta = txn.open_table(META)?;
            let mut events = txn.open_table(EVENTS)?;
            compact_in(&mut meta, &mut events, keep, 0, u64::MAX)?
        };
        txn.commit()?;
        Ok(compacted)
    }

    /// The synchronous core of every write (exposed for callers without a runtime).
    pub fn apply_blocking(
        &self,
        key: &str,
        update: &mut (dyn FnMut(Option<&Value>) -> Result<Mutation, StoreError> + Send),
    ) -> Result<Outcome, StoreError> {
        self.inner.apply(key, update)
    }

    fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let inner = self.inner.clone();
        Box::pin(async move { tokio::task::spawn_blocking(move || f(&inner)).await? })
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // A panic while holding the lock cannot leave redb half-written (the transaction is
        // simply dropped), so a poisoned lock is safe to reuse.
        self.write_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn meta(&self, name: &str) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        Ok(meta.get(name)?.map(|v| v.value()).unwrap_or(0))
    }

    pub(crate) fn get(&self, key: &str) -> Result<Option<Value>, StoreError> {
        let txn = self.db.begin_read()?;
        let objects = txn.open_table(OBJECTS)?;
        match objects.get(key)? {
            Some(bytes) => Ok(Some(serde_json::from_slice(bytes.value())?)),
            None => Ok(None),
        }
    }

    pub(crate) fn list(&self, prefix: &str) -> Result<ListResult, StoreError> {
        let page = self.list_page(prefix, prefix, 0, None)?;
        Ok(ListResult {
            items: page.items,
            revision: page.revision,
        })
    }

    /// Counts the objects under `prefix` and their bytes, without decoding them.
    pub(crate) fn stats(&self, prefix: &str) -> Result<PrefixStats, StoreError> {
        let txn = self.db.begin_read()?;
        let objects = txn.open_table(OBJECTS)?;
        let mut stats = PrefixStats::default();
        for entry in objects.range(prefix..)? {
            let (key, value) = entry?;
            if !key.value().starts_with(prefix) {
                break;
            }
            stats.objects += 1;
            stats.bytes += value.value().len() as u64;
        }
        Ok(stats)
    }

    /// The objects under `prefix` at `revision` ([`Inner::list_page`] without a limit).
    pub(crate) fn list_at(&self, prefix: &str, revision: u64) -> Result<ListResult, StoreError> {
        let page = self.list_page(prefix, prefix, 0, Some(revision))?;
        Ok(ListResult {
            items: page.items,
            revision: page.revision,
        })
    }

    /// [`Store::list_page`], in one read transaction. At the head revision the page is read
    /// from the objects table and the keys after it are counted. At an older one the keys
    /// from `from` on are today's with every later event under the prefix undone, newest first
    /// (an addition removed, a change or deletion put back to the object before it), and
    /// only the page's objects are decoded.
    pub(crate) fn list_page(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
        revision: Option<u64>,
    ) -> Result<ListPage, StoreError> {
        let txn = self.db.begin_read()?;
        let objects = txn.open_table(OBJECTS)?;
        let meta = txn.open_table(META)?;
        let head = meta.get(META_REVISION)?.map(|v| v.value()).unwrap_or(0);
        let start = from.max(prefix);
        let take = if limit == 0 { usize::MAX } else { limit };
        let under = objects.range(start..)?.map_while(|entry| match entry {
            Ok((key, value)) => key.value().starts_with(prefix).then(|| Ok((key, value))),
            Err(e) => Some(Err(e)),
        });
        let Some(revision) = revision.filter(|r| *r != head) else {
            let (mut items, mut remaining) = (Vec::new(), 0);
            for entry in under {
                let (_, value) = entry?;
                if items.len() < take {
                    items.push(serde_json::from_slice(value.value())?);
                } else {
                    remaining += 1;
                }
            }
            return Ok(ListPage {
                items,
                revision: head,
                remaining,
            });
        };
        let compacted = meta.get(META_COMPACTED)?.map(|v| v.value()).unwrap_or(0);
        if revision > head {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: head,
            });
        }
        if revision < compacted {
            return Err(StoreError::Gone {
                requested: revision,
                compacted,
            });
        }
        // Each key as of `revision`: `None` is today's object, `Some` the one an event put back.
        let mut at: std::collections::BTreeMap<String, Option<Value>> =
            std::collections::BTreeMap::new();
        for entry in under {
            at.insert(entry?.0.value().to_string(), None);
        }
        let events = txn.open_table(EVENTS)?;
        for entry in events.range(revision.saturating_add(1)..)?.rev() {
            let (_, bytes) = entry?;
            let event: Event = serde_json::from_slice(bytes.value())?;
            if !event.key.starts_with(prefix) || event.key.as_str() < start {
                continue;
            }
            match (event.kind, event.prev_object) {
                (EventType::Added, _) => {
                    at.remove(&event.key);
                }
                (_, Some(prev)) => {
                    at.insert(event.key, Some(prev));
                }
                (_, None) => {
                    return Err(StoreError::InvalidObject {
                        key: event.key,
                        reason: format!(
                            "the history event at revision {} has no previous object",
                            event.revision
                        ),
                    });
                }
            }
        }
        let remaining = at.len().saturating_sub(take);
        let mut items = Vec::with_capacity(at.len() - remaining);
        for (key, held) in at.into_iter().take(take) {
            items.push(match held {
                Some(object) => object,
                None => {
                    let bytes = objects.get(key.as_str())?.ok_or_else(|| {
                        StoreError::Backend(format!("{key} vanished inside a read transaction"))
                    })?;
                    serde_json::from_slice(bytes.value())?
                }
            });
        }
        Ok(ListPage {
            items,
            revision,
            remaining,
        })
    }

    /// Reads up to `limit` history events after `after`, keeping those under `prefix`.
    pub(crate) fn history(
        &self,
        prefix: &str,
        after: u64,
        limit: usize,
    ) -> Result<HistoryChunk, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        let head = meta.get(META_REVISION)?.map(|v| v.value()).unwrap_or(0);
        let compacted = meta.get(META_COMPACTED)?.map(|v| v.value()).unwrap_or(0);
        if after < compacted {
            return Err(StoreError::Gone {
                requested: after,
                compacted,
            });
        }
        let table = txn.open_table(EVENTS)?;
        let mut events = Vec::new();
        let mut scanned = after;
        let mut seen = 0;
        for entry in table.range(after.saturating_add(1)..)? {
            let (revision, bytes) = entry?;
            scanned = revision.value();
            seen += 1;
            let event: Event = serde_json::from_slice(bytes.value())?;
            if event.key.starts_with(prefix) {
                events.push(event);
            }
            if seen >= limit {
                break;
            }
        }
        let at_head = seen < limit || scanned >= head;
        if at_head {
            scanned = scanned.max(head);
        }
        Ok(HistoryChunk {
            events,
            scanned,
            at_head,
        })
    }

    fn apply(
        &self,
        key: &str,
        update: &mut (dyn FnMut(Option<&Value>) -> Result<Mutation, StoreError> + Send),
    ) -> Result<Outcome, StoreError> {
        check_key(key)?;
        let _guard = self.lock();
        let mut txn = self.db.begin_write()?;
        if !self.options.durable {
            txn.set_durability(redb::Durability::None)?;
        }
        let (outcome, event) = {
            let mut objects = txn.open_table(OBJECTS)?;
            let mut events = txn.open_table(EVENTS)?;
            let mut meta = txn.open_table(META)?;
            let current: Option<Value> = match objects.get(key)? {
                Some(bytes) => Some(serde_json::from_slice(bytes.value())?),
                None => None,
            };
            let revision = meta.get(META_REVISION)?.map(|v| v.value()).unwrap_or(0) + 1;
            let (kind, object) = match update(current.as_ref())? {
                Mutation::Keep => return Ok(Outcome::Unchanged(current)),
                Mutation::Put(mut object) => {
                    stamp(key, &mut object, revision)?;
                    objects.insert(key, serde_json::to_vec(&object)?.as_slice())?;
                    let kind = if current.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    };
                    (kind, object)
                }
                Mutation::Delete => {
                    let Some(mut object) = current.clone() else {
                        return Err(StoreError::NotFound { key: key.into() });
                    };
                    stamp(key, &mut object, revision)?;
                    objects.remove(key)?;
                    (EventType::Deleted, object)
                }
            };
            let event = Event {
                revision,
                kind,
                key: key.to_string(),
                object,
                prev_object: current,
            };
            let encoded = serde_json::to_vec(&event)?;
            events.insert(revision, encoded.as_slice())?;
            meta.insert(META_REVISION, revision)?;
            let bytes = meta
                .get(META_HISTORY_BYTES)?
                .map(|v| v.value())
                .unwrap_or(0);
            meta.insert(META_HISTORY_BYTES, bytes + encoded.len() as u64)?;
            let history = self.options.history.max(1);
            compact_in(
                &mut meta,
                &mut events,
                history,
                (history / 10).max(1),
                self.options.history_bytes,
            )?;
            let outcome = match kind {
                EventType::Deleted => Outcome::Deleted(event.object.clone()),
                _ => Outcome::Written(event.object.clone()),
            };
            (outcome, event)
        };
        txn.commit()?;
        // Published under the write lock, so watchers receive events in revision order.
        let _ = self.events.send(Arc::new(event));
        Ok(outcome)
    }
}

/// Compacts history to the latest `keep` events once more than `keep + slack` are retained,
/// and, when the retained events hold more than `max_bytes`, the oldest of them down to nine
/// tenths of it (never the latest event).
fn compact_in(
    meta: &mut redb::Table<'_, &str, u64>,
    events: &mut redb::Table<'_, u64, &[u8]>,
    keep: u64,
    slack: u64,
    max_bytes: u64,
) -> Result<u64, StoreError> {
    let head = meta.get(META_REVISION)?.map(|v| v.value()).unwrap_or(0);
    let compacted = meta.get(META_COMPACTED)?.map(|v| v.value()).unwrap_or(0);
    let bytes = meta
        .get(META_HISTORY_BYTES)?
        .map(|v| v.value())
        .unwrap_or(0);
    let mut target = compacted;
    // Drop at least `slack` events at a time, so history is trimmed in batches.
    let by_count = head.saturating_sub(keep);
    if by_count >= compacted + slack.max(1) {
        target = by_count;
    }
    if bytes > max_bytes {
        let low = max_bytes - max_bytes / 10;
        let mut left = bytes;
        for entry in events.range(compacted.saturating_add(1)..head)? {
            if left <= low {
                break;
            }
            let (revision, value) = entry?;
            left = left.saturating_sub(value.value().len() as u64);
            target = target.max(revision.value());
        }
    }
    if target == compacted {
        return Ok(compacted);
    }
    let mut removed = 0u64;
    for entry in events.range(compacted.saturating_add(1)..=target)? {
        removed += entry?.1.value().len() as u64;
    }
    events.retain_in(compacted..=target, |_, _| false)?;
    meta.insert(META_COMPACTED, target)?;
    meta.insert(META_HISTORY_BYTES, bytes.saturating_sub(removed))?;
    Ok(target)
}

fn check_key(key: &str) -> Result<(), StoreError> {
    if !key.starts_with('/') || key.ends_with('/') {
        return Err(StoreError::InvalidObject {
            key: key.into(),
            reason: "keys start with '/' and do not end with '/'".into(),
        });
    }
    Ok(())
}

impl Store for RedbStore {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Value>, StoreError>> {
        let key = key.to_string();
        self.spawn(move |inner| inner.get(&key))
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<ListResult, StoreError>> {
        let prefix = prefix.to_string();
        self.spawn(move |inner| inner.list(&prefix))
    }

    fn list_at(
        &self,
        prefix: &str,
        revision: u64,
    ) -> BoxFuture<'_, Result<ListResult, StoreError>> {
        let prefix = prefix.to_string();
        self.spawn(move |inner| inner.list_at(&prefix, revision))
    }

    fn list_page(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
        revision: Option<u64>,
    ) -> BoxFuture<'_, Result<ListPage, StoreError>> {
        let (prefix, from) = (prefix.to_string(), from.to_string());
        self.spawn(move |inner| inner.list_page(&prefix, &from, limit, revision))
    }

    fn create(&self, key: &str, object: Value) -> BoxFuture<'_, Result<Value, StoreError>> {
        let key = key.to_string();
        self.spawn(move |inner| {
            let mut object = Some(object);
            let outcome = inner.apply(&key, &mut |current| match current {
                Some(_) => Err(StoreError::AlreadyExists { key: key.clone() }),
                None => Ok(Mutation::Put(object.take().unwrap_or_default())),
            })?;
            written(outcome, &key)
        })
    }

    fn update(
        &self,
        key: &str,
        object: Value,
        expected_revision: Option<u64>,
    ) -> BoxFuture<'_, Result<Value, StoreError>> {
        let key = key.to_string();
        self.spawn(move |inner| {
            let outcome = inner.apply(
                &key,
                &mut if_exists(&key, expected_revision, Mutation::Put(object)),
            )?;
            written(outcome, &key)
        })
    }

    fn delete(
        &self,
        key: &str,
        expected_revision: Option<u64>,
    ) -> BoxFuture<'_, Result<Value, StoreError>> {
        let key = key.to_string();
        self.spawn(move |inner| {
            let outcome = inner.apply(
                &key,
                &mut if_exists(&key, expected_revision, Mutation::Delete),
            )?;
            deleted(outcome, &key)
        })
    }

    fn guaranteed_update(
        &self,
        key: &str,
        mut update: UpdateFn,
    ) -> BoxFuture<'_, Result<Outcome, StoreError>> {
        let key = key.to_string();
        self.spawn(move |inner| inner.apply(&key, &mut *update))
    }

    fn watch(
        &self,
        prefix: &str,
        from_revision: u64,
    ) -> BoxFuture<'_, Result<EventStream, StoreError>> {
        Box::pin(std::future::ready(crate::watch::watch(
            &self.inner,
            prefix,
            from_revision,
        )))
    }

    fn current_revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(std::future::ready(self.inner.meta(META_REVISION)))
    }

    fn stats(&self, prefix: &str) -> BoxFuture<'_, Result<PrefixStats, StoreError>> {
        let prefix = prefix.to_string();
        self.spawn(move |inner| inner.stats(&prefix))
    }

    fn size_bytes(&self) -> Option<u64> {
        std::fs::metadata(&self.inner.path).ok().map(|m| m.len())
    }
}

impl Inner {
    pub(crate) fn compacted(&self) -> Result<u64, StoreError> {
        self.meta(META_COMPACTED)
    }
}
