//! [`MeteredStore`]: the store as handlers see it, timing every operation into
//! `etcd_request_duration_seconds{operation,type}` as upstream's etcd3 store does (operations
//! `get`, `list`, `create`, `update`, `delete`; `type` the group-resource, `pods` or
//! `deployments.apps`), and the per-resource object counts behind `apiserver_storage_objects`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use svcnet_store::{
    BoxFuture, EventStream, ListPage, ListResult, Mutation, Outcome, PrefixStats, Store,
    StoreError, UpdateFn,
};

use crate::metrics::Metrics;

/// The group-resource a store key or prefix (`/{group|core}/{plural}/...`) belongs to.
pub(crate) fn group_resource(key: &str) -> String {
    let mut parts = key.trim_start_matches('/').split('/');
    match (parts.next(), parts.next()) {
        (Some("core"), Some(plural)) => plural.to_string(),
        (Some(group), Some(plural)) if !plural.is_empty() => format!("{plural}.{group}"),
        _ => String::new(),
    }
}

/// A [`Store`] that records how long each operation took.
pub(crate) struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    pub(crate) fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        MeteredStore { inner, metrics }
    }

    fn timed<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        key: &str,
        f: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        let kind = group_resource(key);
        Box::pin(async move {
            let started = Instant::now();
            let r = f.await;
            self.metrics.storage(operation, kind, started);
            r
        })
    }

    /// A read-modify-write through `call`, labelled by what the update decided, as upstream's
    /// store names its calls: `create` for a new object, `delete`, `update` for a change, and
    /// `get` when it wrote nothing.
    fn labelled_update<'a>(
        &'a self,
        key: &str,
        mut update: UpdateFn,
        call: impl FnOnce(&'a dyn Store, &str, UpdateFn) -> BoxFuture<'a, Result<Outcome, StoreError>>,
    ) -> BoxFuture<'a, Result<Outcome, StoreError>> {
        let decided = Arc::new(std::sync::Mutex::new("get"));
        let slot = decided.clone();
        let update: UpdateFn = Box::new(move |cur| {
            let m = update(cur)?;
            let op = match (&m, cur.is_some()) {
                (Mutation::Put(_), false) => "create",
                (Mutation::Put(_), true) => "update",
                (Mutation::Delete, _) => "delete",
                (Mutation::Keep, _) => "get",
            };
            if let Ok(mut s) = slot.lock() {
                *s = op;
            }
            Ok(m)
        });
        let kind = group_resource(key);
        let f = call(&*self.inner, key, update);
        Box::pin(async move {
            let started = Instant::now();
            let r = f.await;
            let op = decided.lock().map(|s| *s).unwrap_or("update");
            self.metrics.storage(op, kind, started);
            r
        })
    }
}

impl Store for MeteredStore {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Value>, StoreError>> {
        self.timed("get", key, self.inner.get(key))
    }

    fn get_cached(&self, key: &str) -> BoxFuture<'_, Result<Option<Value>, StoreError>> {
        self.timed("get", key, self.inner.get_cached(key))
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<ListResult, StoreError>> {
        self.timed("list", prefix, self.inner.list(prefix))
    }

    fn list_at(
        &self,
        prefix: &str,
        revision: u64,
    ) -> BoxFuture<'_, Result<ListResult, StoreError>> {
        self.timed("list", prefix, self.inner.list_at(prefix, revision))
    }

    fn list_page(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
        revision: Option<u64>,
    ) -> BoxFuture<'_, Result<ListPage, StoreError>> {
        let page = self.inner.list_page(prefix, from, limit, revision);
        self.timed("list", prefix, page)
    }

    fn create(&self, key: &str, object: Value) -> BoxFuture<'_, Result<Value, StoreError>> {
        self.timed("create", key, self.inner.create(key, object))
    }

    fn update(
        &self,
        key: &str,
        object: Value,
        expected_revision: Option<u64>,
    ) -> BoxFuture<'_, Result<Value, StoreError>> {
        self.timed(
            "update",
            key,
            self.inner.update(key, object, expected_revision),
        )
    }

    fn delete(
        &self,
        key: &str,
        expected_revision: Option<u64>,
    ) -> BoxFuture<'_, Result<Value, StoreError>> {
        self.timed("delete", key, self.inner.delete(key, expected_revision))
    }

    /// Labelled by what the update decided ([`MeteredStore::labelled_update`]).
    fn guaranteed_update(
        &self,
        key: &str,
        update: UpdateFn,
    ) -> BoxFuture<'_, Result<Outcome, StoreError>> {
        self.labelled_update(key, update, |inner, key, update| {
            inner.guaranteed_update(key, update)
        })
    }

    fn guaranteed_update_from(
        &self,
        key: &str,
        believed: Option<Value>,
        update: UpdateFn,
    ) -> BoxFuture<'_, Result<Outcome, StoreError>> {
        self.labelled_update(key, update, move |inner, key, update| {
            inner.guaranteed_update_from(key, believed, update)
        })
    }

    fn watch(
        &self,
        prefix: &str,
        from_revision: u64,
    ) -> BoxFuture<'_, Result<EventStream, StoreError>> {
        self.inner.watch(prefix, from_revision)
    }

    fn current_revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.inner.current_revision()
    }

    fn stats(&self, prefix: &str) -> BoxFuture<'_, Result<PrefixStats, StoreError>> {
        self.inner.stats(prefix)
    }

    fn size_bytes(&self) -> Option<u64> {
        self.inner.size_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_group_resource() {
        assert_eq!(group_resource("/core/pods/ns/a"), "pods");
        assert_eq!(group_resource("/core/nodes/"), "nodes");
        assert_eq!(group_resource("/apps/deployments/"), "deployments.apps");
        assert_eq!(group_resource("/"), "");
    }
}
