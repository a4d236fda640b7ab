//! [`EtcdStore`]: the [`Store`] on an etcd cluster, the way kube-apiserver's etcd3 storage
//! uses it (`staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go`).
//!
//! - Keys follow kube-apiserver's layout under a prefix ([`KeyLayout`]).
//! - A value is the object's JSON with `apiVersion` and `kind`, without
//!   `metadata.resourceVersion`: the resourceVersion is the key's `mod_revision`, injected on
//!   every read and never stored (etcd cannot know it before the transaction commits).
//! - `create` is `Txn(ModRevision(key) = 0 ? Put)`; `update`, `delete` and
//!   `guaranteed_update` read the key, decide, and write with `Txn(ModRevision(key) = read ?
//!   Put/Delete : Get)`, deciding again on the else-branch's fresh value until the compare
//!   holds (so an [`crate::UpdateFn`] may run more than once).
//! - Lists of the latest state are served from the watch cache (`cache.rs`: one etcd watch per
//!   resource, the resource's objects and a history of its events in memory, kube-apiserver's
//!   `Cacher`), after one etcd read that proves the cache current; otherwise, and for
//!   `list_at`, they are `Range` pages of one revision. Watches are etcd watches from a
//!   revision with `prev_kv` (see `watch.rs`), served through the same cache; history older
//!   than the last compaction answers [`StoreError::Gone`] unless the cache still holds it.
//! - Compaction is the API servers' job, coordinated through `compact_rev_key` as
//!   kube-apiserver does (see `compact.rs` and [`EtcdStore::run_compactor`]).
//!
//! **Architecture Invariant:** a write is acknowledged only after etcd answered its
//! transaction, that is after a quorum of members has it; watch events come from etcd's watch
//! streams, in revision order, never from this process's own writes.

mod cache;
mod compact;
mod layout;
pub mod local;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse,
};
use serde_json::Value;

use crate::{
    BoxFuture, EventStream, ListPage, ListResult, Mutation, Outcome, PrefixStats, Store,
    StoreError, UpdateFn, WatchCacheOptions, WatchCacheStats, deleted, if_exists, object_revision,
    stamp, written,
};

pub use compact::{COMPACT_REV_KEY, CompactorState};
pub use layout::KeyLayout;

/// How many keys one `Range` page reads (kube-apiserver's list pages are at most 10 000).
const PAGE: i64 = 1000;
/// The largest gRPC message accepted from etcd (its own default request limit is 1.5 MiB per
/// value; a page of them needs more than tonic's 4 MiB default).
const MAX_MESSAGE: usize = 256 << 20;

/// Client certificates for an etcd cluster that requires TLS (kube-apiserver's
/// `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// CA bundle that signed the etcd members' serving certificates.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// Client key (PEM), with `cert_file`.
    pub key_file: Option<PathBuf>,
}

/// Where an [`EtcdStore`] finds its cluster and how it uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs of the members (`http://127.0.0.1:2379`, `https://…`); kube-apiserver's
    /// `--etcd-servers`.
    pub endpoints: Vec<String>,
    /// The key prefix (`--etcd-prefix`, default `/registry`).
    pub prefix: String,
    /// Client TLS; `None` for plain `http://` members.
    pub tls: Option<EtcdTls>,
    /// How long one etcd request may take before it fails (and may be retried elsewhere).
    pub request_timeout: Duration,
    /// How often the compactor runs (`--etcd-compaction-interval`, default 5 min); zero turns
    /// it off.
    pub compaction_interval: Duration,
    /// The watch cache (`--watch-cache`, `--default-watch-cache-size`, `--watch-cache-sizes`).
    pub watch_cache: WatchCacheOptions,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/registry".into(),
            tls: None,
            request_timeout: Duration::from_secs(5),
            compaction_interval: Duration::from_secs(300),
            watch_cache: WatchCacheOptions::default(),
        }
    }
}

/// The store on etcd. Cheap to clone; clones share one gRPC channel.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    layout: KeyLayout,
    options: EtcdOptions,
    /// The database size a member last reported (`apiserver_storage_size_bytes`), and when
    /// (milliseconds after `started`); refreshed by [`Store::stats`] at most every
    /// [`SIZE_REFRESH`].
    db_size: AtomicU64,
    db_size_at: AtomicU64,
    started: Instant,
    cache: cache::WatchCache,
}

/// How stale the reported database size may be.
const SIZE_REFRESH: Duration = Duration::from_secs(10);

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.options.endpoints)
            .field("prefix", &self.inner.options.prefix)
            .finish()
    }
}

impl EtcdStore {
    /// Connects to the cluster and checks that it answers (a quorum read).
    pub async fn connect(options: EtcdOptions) -> Result<Self, StoreError> {
        let layout = KeyLayout::new(&options.prefix)?;
        if options.endpoints.is_empty() {
            return Err(StoreError::Backend("no etcd endpoints given".into()));
        }
        let mut connect = ConnectOptions::new()
            .with_timeout(options.request_timeout)
            .with_connect_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_require_leader(true);
        if let Some(tls) = &options.tls {
            connect = connect.with_tls(tls_options(tls)?);
        }
        let client = Client::connect(&options.endpoints, Some(connect))
            .await
            .map_err(|e| {
                StoreError::Backend(format!(
                    "connecting to etcd at {}: {e}",
                    options.endpoints.join(",")
                ))
            })?;
        let store = EtcdStore {
            inner: Arc::new(Inner {
                client,
                layout,
                db_size: AtomicU64::new(0),
                db_size_at: AtomicU64::new(0),
                started: Instant::now(),
                cache: cache::WatchCache::new(options.watch_cache.clone()),
                options,
            }),
        };
        store.refresh_db_size().await;
        store.revision().await.map_err(|e| {
            let why = match e {
                StoreError::Backend(why) => why,
                other => other.to_string(),
            };
            StoreError::Backend(format!(
                "etcd at {} does not answer: {why}",
                store.inner.options.endpoints.join(",")
            ))
        })?;
        Ok(store)
    }

    /// The key layout this store writes.
    pub fn layout(&self) -> &KeyLayout {
        &self.inner.layout
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &EtcdOptions {
        &self.inner.options
    }

    /// What the watch cache did so far (etcd watches opened, client watches served from
    /// memory or from etcd).
    pub fn watch_cache_stats(&self) -> WatchCacheStats {
        self.inner.cache.stats()
    }

    fn kv(&self) -> etcd_client::KvClient {
        self.inner
            .client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE)
    }

    /// Asks a member for the database size, at most every [`SIZE_REFRESH`] (the first time
    /// always); a failure keeps the last figure.
    async fn refresh_db_size(&self) {
        let inner = &self.inner;
        let now = u64::try_from(inner.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = inner.db_size_at.load(Ordering::Relaxed);
        let fresh = inner.db_size.load(Ordering::Relaxed) > 0
            && now.saturating_sub(last) < SIZE_REFRESH.as_millis() as u64;
        if fresh {
            return;
        }
        inner.db_size_at.store(now, Ordering::Relaxed);
        if let Ok(status) = inner.client.maintenance_client().status().await {
            let size = u64::try_from(status.db_size()).unwrap_or(0);
            inner.db_size.store(size, Ordering::Relaxed);
        }
    }

    /// The cluster's current revision (the header of a quorum read).
    async fn revision(&self) -> Result<u64, StoreError> {
        let resp = self
            .kv()
            .get(
                self.inner.layout.root(),
                Some(GetOptions::new().with_count_only()),
            )
            .await
            .map_err(backend)?;
        Ok(header_revision(resp.header()))
    }

    /// Every kv under `etcd_prefix`, page by page at one revision (the first page's, or
    /// `at`), and that revision.
    async fn range(
        &self,
        etcd_prefix: &str,
        at: Option<u64>,
    ) -> Result<(Vec<KeyValue>, u64), StoreError> {
        let (kvs, revision, _) = self
            .range_from(etcd_prefix.as_bytes().to_vec(), etcd_prefix, at, 0)
            .await?;
        Ok((kvs, revision))
    }

    /// The keys from `start` to the end of `etcd_prefix`, at most `limit` of them (0: all), in
    /// requests of at most [`PAGE`] keys at one revision (`at`, or the first request's); with
    /// that revision and how many keys of the range come after the ones read.
    async fn range_from(
        &self,
        mut start: Vec<u8>,
        etcd_prefix: &str,
        at: Option<u64>,
        limit: usize,
    ) -> Result<(Vec<KeyValue>, u64, usize), StoreError> {
        let end = prefix_end(etcd_prefix.as_bytes());
        let mut kvs = Vec::new();
        let mut revision = at.map_or(0, to_i64);
        // Keys in the range at the first request (etcd counts them whatever the limit).
        let mut total = None;
        loop {
            let want = match limit {
                0 => PAGE,
                _ => PAGE.min(i64::try_from(limit - kvs.len()).unwrap_or(PAGE)),
            };
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(want);
            if revision > 0 {
                opts = opts.with_revision(revision);
            }
            let mut resp = match self.kv().get(start.clone(), Some(opts)).await {
                Ok(resp) => resp,
                Err(e) => {
                    if let Some(at) = at
                        && let Some(err) = self.revision_error(&e, at).await
                    {
                        return Err(err);
                    }
                    return Err(backend(e));
                }
            };
            if revision == 0 {
                revision = to_i64(header_revision(resp.header()));
            }
            total.get_or_insert(resp.count());
            let more = resp.more();
            let page = resp.take_kvs();
            if let Some(last) = page.last() {
                start = last.key().to_vec();
                start.push(0);
            }
            kvs.extend(page);
            if !more || (limit > 0 && kvs.len() >= limit) {
                break;
            }
        }
        let total = usize::try_from(total.unwrap_or(0)).unwrap_or(0);
        let after = total.saturating_sub(kvs.len());
        Ok((kvs, u64::try_from(revision).unwrap_or(0), after))
    }

    /// What a failed read at `revision` means: [`StoreError::Gone`] when etcd compacted it
    /// away, [`StoreError::FutureRevision`] when etcd has not reached it.
    async fn revision_error(&self, e: &etcd_client::Error, revision: u64) -> Option<StoreError> {
        let etcd_client::Error::GRpcStatus(status) = e else {
            return None;
        };
        // etcd's ErrCompacted and ErrFutureRev (gRPC OutOfRange), told apart by their text as
        // kube-apiserver's storage does.
        if status
            .message()
            .contains("required revision has been compacted")
        {
            let compacted = compact::compacted_floor(self, revision).await;
            return Some(StoreError::Gone {
                requested: revision,
                compacted,
            });
        }
        if status
            .message()
            .contains("required revision is a future revision")
        {
            let current = self.revision().await.unwrap_or(0);
            return Some(StoreError::FutureRevision {
                requested: revision,
                current,
            });
        }
        None
    }

    /// The read-modify-write core: decide on the current object (read linearizably, or
    /// `known` when the caller already knows or believes it: the object and its
    /// `mod_revision`, `None` for absent), then write with a compare on that `mod_revision`;
    /// when another writer came first (or the belief was stale), decide again on the object
    /// the else-branch returned. A decision that writes nothing (`Keep`, a deletion of
    /// nothing, an error) is only taken on a read object: on a belief it reads and decides
    /// again, as kube-apiserver's GuaranteedUpdate does with a cached object.
    async fn apply(
        &self,
        key: &str,
        known: Option<Option<(Value, i64)>>,
        update: &mut (dyn FnMut(Option<&Value>) -> Result<Mutation, StoreError> + Send),
    ) -> Result<Outcome, StoreError> {
        let ekey = self.inner.layout.key(key)?;
        let read_now = async || -> Result<Option<(Value, i64)>, StoreError> {
            self.get_kv(&ekey)
                .await?
                .map(|kv| decoded(key, &kv))
                .transpose()
        };
        let (mut current, mut verified) = match known {
            Some(c) => (c, false),
            None => (read_now().await?, true),
        };
        loop {
            let read = current.as_ref().map_or(0, |(_, r)| *r);
            let decision = update(current.as_ref().map(|(o, _)| o));
            let writes = matches!(&decision, Ok(Mutation::Put(_)))
                || (matches!(&decision, Ok(Mutation::Delete)) && current.is_some());
            if !writes && !verified {
                current = read_now().await?;
                verified = true;
                continue;
            }
            let (op, put) = match decision? {
                Mutation::Keep => return Ok(Outcome::Unchanged(current.map(|(o, _)| o))),
                Mutation::Put(new) => {
                    let op = TxnOp::put(ekey.clone(), encode(key, &new)?, None);
                    (op, Some(new))
                }
                Mutation::Delete => {
                    if current.is_none() {
                        return Err(StoreError::NotFound { key: key.into() });
                    }
                    (TxnOp::delete(ekey.clone(), None), None)
                }
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(ekey.clone(), CompareOp::Equal, read)])
                .and_then([op])
                .or_else([TxnOp::get(ekey.clone(), None)]);
            let resp = self.kv().txn(txn).await.map_err(backend)?;
            if resp.succeeded() {
                let revision = header_revision(resp.header());
                return match (put, current) {
                    (Some(mut w), _) => {
                        stamp(key, &mut w, revision)?;
                        Ok(Outcome::Written(w))
                    }
                    (None, Some((mut last, _))) => {
                        stamp(key, &mut last, revision)?;
                        Ok(Outcome::Deleted(last))
                    }
                    (None, None) => Err(StoreError::NotFound { key: key.into() }),
                };
            }
            current = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
                    _ => None,
                })
                .map(|kv| decoded(key, &kv))
                .transpose()?;
            verified = true;
        }
    }

    async fn get_kv(&self, ekey: &str) -> Result<Option<KeyValue>, StoreError> {
        let mut resp = self.kv().get(ekey, None).await.map_err(backend)?;
        Ok(resp.take_kvs().into_iter().next())
    }
}

impl Store for EtcdStore {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Value>, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let ekey = self.inner.layout.key(&key)?;
            self.get_kv(&ekey)
                .await?
                .map(|kv| decode(&key, &kv))
                .transpose()
        })
    }

    fn get_cached(&self, key: &str) -> BoxFuture<'_, Result<Option<Value>, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            match self.inner.cache.get(self, &key).await {
                Some(object) => Ok(Some(object)),
                None => self.get(&key).await,
            }
        })
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<ListResult, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            let eprefix = self.inner.layout.prefix(&prefix)?;
            if let Some(list) = self.inner.cache.list(self, &prefix).await? {
                return Ok(list);
            }
            let (kvs, revision) = self.range(&eprefix, None).await?;
            let items = decode_all(&prefix, &kvs)?;
            Ok(ListResult { items, revision })
        })
    }

    fn list_at(
        &self,
        prefix: &str,
        revision: u64,
    ) -> BoxFuture<'_, Result<ListResult, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            let page = self.list_page(&prefix, &prefix, 0, Some(revision)).await?;
            Ok(ListResult {
                items: page.items,
                revision: page.revision,
            })
        })
    }

    fn list_page(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
        revision: Option<u64>,
    ) -> BoxFuture<'_, Result<ListPage, StoreError>> {
        let (prefix, from) = (prefix.to_string(), from.to_string());
        Box::pin(async move {
            let eprefix = self.inner.layout.prefix(&prefix)?;
            // `from` maps as a prefix does (a key, or a key with a byte after it); one past
            // every key under `prefix` leaves nothing to read.
            let start = if from.as_str() <= prefix.as_str() {
                eprefix.clone().into_bytes()
            } else if from.starts_with(prefix.as_str()) {
                self.inner.layout.prefix(&from)?.into_bytes()
            } else {
                prefix_end(eprefix.as_bytes())
            };
            if revision == Some(0) {
                // etcd reads revision 0 as "the latest"; the store has nothing older than 1.
                return Err(StoreError::Gone {
                    requested: 0,
                    compacted: compact::compacted_floor(self, 1).await,
                });
            }
            let (kvs, revision, remaining) =
                self.range_from(start, &eprefix, revision, limit).await?;
            Ok(ListPage {
                items: decode_all(&prefix, &kvs)?,
                revision,
                remaining,
            })
        })
    }

    fn create(&self, key: &str, object: Value) -> BoxFuture<'_, Result<Value, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let mut object = Some(object);
            // kube's Create: no read first, the compare on ModRevision = 0 decides.
            let outcome = self
                .apply(&key, Some(None), &mut |current| match current {
                    Some(_) => Err(StoreError::AlreadyExists { key: key.clone() }),
                    None => object
                        .take()
                        .map(Mutation::Put)
                        .ok_or_else(|| StoreError::AlreadyExists { key: key.clone() }),
                })
                .await?;
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
        Box::pin(async move {
            let mut decide = if_exists(&key, expected_revision, Mutation::Put(object));
            let outcome = self.apply(&key, None, &mut decide).await?;
            written(outcome, &key)
        })
    }

    fn delete(
        &self,
        key: &str,
        expected_revision: Option<u64>,
    ) -> BoxFuture<'_, Result<Value, StoreError>> {
        let key = key.to_string();
        Box::pin(async move {
            let mut decide = if_exists(&key, expected_revision, Mutation::Delete);
            let outcome = self.apply(&key, None, &mut decide).await?;
            deleted(outcome, &key)
        })
    }

    fn guaranteed_update(
        &self,
        key: &str,
        mut update: UpdateFn,
    ) -> BoxFuture<'_, Result<Outcome, StoreError>> {
        let key = key.to_string();
        Box::pin(async move { self.apply(&key, None, &mut *update).await })
    }

    fn guaranteed_update_from(
        &self,
        key: &str,
        believed: Option<Value>,
        mut update: UpdateFn,
    ) -> BoxFuture<'_, Result<Outcome, StoreError>> {
        let key = key.to_string();
        // A believed object without a revision cannot be compared on: read instead.
        let known = match believed {
            None => Some(None),
            Some(o) => object_revision(&o).map(|r| Some((o, to_i64(r)))),
        };
        Box::pin(async move { self.apply(&key, known, &mut *update).await })
    }

    fn watch(
        &self,
        prefix: &str,
        from_revision: u64,
    ) -> BoxFuture<'_, Result<EventStream, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(async move { self.inner.cache.watch(self, &prefix, from_revision).await })
    }

    fn current_revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.revision())
    }

    fn stats(&self, prefix: &str) -> BoxFuture<'_, Result<PrefixStats, StoreError>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            self.refresh_db_size().await;
            let eprefix = self.inner.layout.prefix(&prefix)?;
            let (kvs, _) = self.range(&eprefix, None).await?;
            Ok(PrefixStats {
                objects: kvs.len() as u64,
                bytes: kvs.iter().map(|kv| kv.value().len() as u64).sum(),
            })
        })
    }

    /// The etcd database size a member reported lately (the whole cluster's keyspace, as
    /// kube-apiserver's `apiserver_storage_size_bytes`).
    fn size_bytes(&self) -> Option<u64> {
        match self.inner.db_size.load(Ordering::Relaxed) {
            0 => None,
            size => Some(size),
        }
    }
}

pub(crate) fn tls_options(tls: &EtcdTls) -> Result<etcd_client::TlsOptions, StoreError> {
    let read = |path: &PathBuf, what: &str| {
        std::fs::read(path).map_err(|e| {
            StoreError::Backend(format!("reading the etcd {what} {}: {e}", path.display()))
        })
    };
    let mut options = etcd_client::TlsOptions::new();
    if let Some(ca) = &tls.ca_file {
        options = options.ca_certificate(etcd_client::Certificate::from_pem(read(ca, "CA file")?));
    }
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            options = options.identity(etcd_client::Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Backend(
                "--etcd-certfile and --etcd-keyfile go together".into(),
            ));
        }
    }
    Ok(options)
}

/// The object a kv holds, with its `mod_revision` as resourceVersion.
fn decode(key: &str, kv: &KeyValue) -> Result<Value, StoreError> {
    let mut object: Value = serde_json::from_slice(kv.value()).map_err(|e| {
        StoreError::Backend(format!(
            "{key}: the etcd value at {} is not JSON ({e}); kube-apiserver writes JSON only \
             with --storage-media-type=application/json",
            String::from_utf8_lossy(kv.key())
        ))
    })?;
    stamp(
        key,
        &mut object,
        u64::try_from(kv.mod_revision()).unwrap_or(0),
    )?;
    Ok(object)
}

/// An object as [`EtcdStore::apply`] decides on it: decoded, with the `mod_revision` its
/// write compares against.
fn decoded(key: &str, kv: &KeyValue) -> Result<(Value, i64), StoreError> {
    Ok((decode(key, kv)?, kv.mod_revision()))
}

fn decode_all(prefix: &str, kvs: &[KeyValue]) -> Result<Vec<Value>, StoreError> {
    kvs.iter().map(|kv| decode(prefix, kv)).collect()
}

/// The bytes stored for an object: its JSON without `metadata.resourceVersion`.
fn encode(key: &str, object: &Value) -> Result<Vec<u8>, StoreError> {
    let mut object = object.clone();
    // Validates the shape as the embedded store does, then takes the version out again.
    stamp(key, &mut object, 0)?;
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    Ok(serde_json::to_vec(&object)?)
}

/// The first key after every key that starts with `prefix` (etcd's `range_end` of a prefix).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> u64 {
    header.map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0))
}

fn to_i64(revision: u64) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

fn backend(e: etcd_client::Error) -> StoreError {
    StoreError::Backend(format!("etcd: {e}"))
}
