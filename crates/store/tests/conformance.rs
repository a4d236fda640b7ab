//! The store conformance suite: the same tests against every [`Store`] implementation
//! (`redb::*` on [`RedbStore`], `etcd::*` on [`EtcdStore`] over a real single-member etcd from
//! Debian's `etcd` binary, with its watch cache started before the test so that every watch
//! within its window is served from memory, and `etcd_direct::*` with the cache off, every
//! watch its own etcd watch). What the API server relies on: key order, revisions, CAS conflicts,
//! retried read-modify-writes under contention, watches with no gap and no duplicate (also with
//! concurrent writers), 410 after compaction, reads at a revision, and durability across a
//! crash. The etcd tests skip with a printed reason when the binary is missing, and fail
//! instead under `SVCNET_REQUIRE_ETCD=1` (the test command sets it).
#![allow(clippy::unwrap_used)] // test: a failure here is a test failure

mod support;
#[path = "conformance/watches.rs"]
mod watches;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::rv;
use svcnet_store::local_etcd::{LocalEtcd, etcd_for_test};
use svcnet_store::{
    EtcdOptions, EtcdStore, Mutation, Outcome, RedbStore, Store, StoreError, StoreOptions,
    UpdateFn, WatchCacheOptions,
};
use watches::{
    compaction_answers_gone, progress_passes_other_keys_only_after_its_own,
    watch_has_no_gap_or_duplicate_under_concurrent_writers, watch_replays_then_follows,
};

/// A store under test and what it needs to compact and crash.
struct Backend {
    kind: Kind,
}

enum Kind {
    Redb {
        dir: tempfile::TempDir,
        /// `None` only while it is being reopened.
        redb: Option<RedbStore>,
    },
    Etcd {
        cluster: LocalEtcd,
        etcd: EtcdStore,
        cached: bool,
    },
}

impl Backend {
    fn redb() -> Backend {
        let dir = tempfile::tempdir().expect("temp dir");
        let redb = Some(open_redb(&dir));
        Backend {
            kind: Kind::Redb { dir, redb },
        }
    }

    /// A one-member etcd; with `cached`, the store's watch cache is on and already follows
    /// the resources the tests watch (so their watches are served from memory), else off.
    async fn etcd(test: &str, cached: bool) -> Option<Backend> {
        let bin = etcd_for_test(test)?;
        let cluster = LocalEtcd::start(&bin, 1).await.expect("starting etcd");
        let etcd = connect(&cluster, cached).await;
        if cached {
            warm(&etcd).await;
        }
        Some(Backend {
            kind: Kind::Etcd {
                cluster,
                etcd,
                cached,
            },
        })
    }

    fn s(&self) -> &dyn Store {
        match &self.kind {
            Kind::Redb { redb, .. } => redb.as_ref().expect("store open"),
            Kind::Etcd { etcd, .. } => etcd,
        }
    }

    /// A handle for tasks.
    fn arc(&self) -> Arc<dyn Store> {
        match &self.kind {
            Kind::Redb { redb, .. } => Arc::new(redb.clone().expect("store open")),
            Kind::Etcd { etcd, .. } => Arc::new(etcd.clone()),
        }
    }

    /// Drops the history before `revision`: afterwards a watch from `revision - 1` or later
    /// works and one from before answers Gone.
    async fn forget_before(&self, revision: u64) {
        match &self.kind {
            Kind::Redb { redb, .. } => {
                let redb = redb.as_ref().expect("store open");
                let head = redb.current_revision().await.expect("head");
                redb.compact(head - (revision - 1)).expect("compact");
            }
            Kind::Etcd { etcd, .. } => etcd.compact(revision).await.expect("compact"),
        }
    }

    /// With the cache on, no watch a test opened fell out of the cache (their revisions were
    /// all within the window).
    fn check_cache_served(&self) {
        if let Kind::Etcd {
            etcd, cached: true, ..
        } = &self.kind
        {
            let stats = etcd.watch_cache_stats();
            assert_eq!(stats.fallbacks, 0, "{stats:?}");
        }
    }

    /// Crashes the store: the etcd member is SIGKILLed (writes in flight fail); redb's SIGKILL
    /// test is kill9.rs, here it is only closed by [`Backend::restart`].
    fn crash(&mut self) {
        if let Kind::Etcd { cluster, .. } = &mut self.kind {
            cluster.kill(0);
        }
    }

    /// Starts the store again on the same data (every other handle must be gone).
    async fn restart(&mut self) {
        match &mut self.kind {
            Kind::Redb { dir, redb } => {
                *redb = None;
                *redb = Some(open_redb(dir));
            }
            Kind::Etcd {
                cluster,
                etcd,
                cached,
            } => {
                cluster.restart(0).await.expect("restart etcd");
                *etcd = connect(cluster, *cached).await;
            }
        }
    }
}

fn small() -> StoreOptions {
    StoreOptions {
        history: 100_000,
        ..Default::default()
    }
}

fn open_redb(dir: &tempfile::TempDir) -> RedbStore {
    RedbStore::open(dir.path().join("s.redb"), small()).expect("open redb")
}

async fn connect(cluster: &LocalEtcd, cached: bool) -> EtcdStore {
    EtcdStore::connect(EtcdOptions {
        endpoints: cluster.endpoints(),
        request_timeout: Duration::from_secs(2),
        watch_cache: WatchCacheOptions {
            enabled: cached,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("connecting to etcd")
}

/// Starts the watch cache of every resource the tests watch, from the current revision.
async fn warm(etcd: &EtcdStore) {
    let head = etcd.current_revision().await.unwrap();
    for prefix in ["/core/pods/", "/core/configmaps/", "/core/namespaces/"] {
        drop(etcd.watch(prefix, head).await.unwrap());
    }
    let stats = etcd.watch_cache_stats();
    assert_eq!((stats.upstreams, stats.cached), (3, 3), "{stats:?}");
}

fn obj(name: &str, v: i64) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": v}})
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod redb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let mut b = super::Backend::redb();
                    super::$name(&mut b).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(mut b) = super::Backend::etcd(stringify!($name), true).await else {
                        return;
                    };
                    super::$name(&mut b).await;
                    b.check_cache_served();
                }
            )*
        }
        mod etcd_direct {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(mut b) = super::Backend::etcd(stringify!($name), false).await else {
                        return;
                    };
                    super::$name(&mut b).await;
                }
            )*
        }
    };
}

conformance!(
    crud_in_key_order,
    cas_conflicts,
    guaranteed_update_retries_under_contention,
    guaranteed_update_from_a_belief,
    watch_replays_then_follows,
    watch_has_no_gap_or_duplicate_under_concurrent_writers,
    compaction_answers_gone,
    progress_passes_other_keys_only_after_its_own,
    list_at_is_the_state_then,
    pages_hold_what_they_return_at_one_revision,
    acknowledged_writes_survive_a_crash,
);

async fn crud_in_key_order(b: &mut Backend) {
    let s = b.s();
    let base = s.current_revision().await.unwrap();
    let a = s
        .create("/core/configmaps/ns/b", obj("b", 1))
        .await
        .unwrap();
    assert_eq!(rv(&a), base + 1);
    assert_eq!(s.current_revision().await.unwrap(), base + 1);
    s.create("/core/configmaps/ns/a", obj("a", 1))
        .await
        .unwrap();
    s.create("/core/configmaps/ot/c", obj("c", 1))
        .await
        .unwrap();
    // Cluster-scoped keys (empty namespace) and a group that is not kube's own.
    s.create("/core/namespaces//ns", obj("ns", 1))
        .await
        .unwrap();
    s.create("/example.com/widgets/ns/w", obj("w", 1))
        .await
        .unwrap();
    let err = s
        .create("/core/configmaps/ns/a", obj("a", 2))
        .await
        .unwrap_err();
    assert!(err.is_already_exists(), "{err}");

    let got = s.get("/core/configmaps/ns/b").await.unwrap().unwrap();
    assert_eq!(got, a, "get returns what create returned");
    assert_eq!(s.get("/core/configmaps/ns/zz").await.unwrap(), None);
    assert_eq!(
        s.get("/core/namespaces//ns").await.unwrap().unwrap()["data"]["v"],
        1
    );

    let all = s.list("/core/configmaps/").await.unwrap();
    let names: Vec<_> = all
        .items
        .iter()
        .map(|o| o["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("a"), json!("b"), json!("c")], "key order");
    assert_eq!(all.revision, base + 5);
    assert_eq!(s.list("/core/configmaps/ns/").await.unwrap().items.len(), 2);
    assert_eq!(s.list("/core/namespaces/").await.unwrap().items.len(), 1);
    assert_eq!(
        s.list("/example.com/widgets/").await.unwrap().items.len(),
        1
    );
    assert_eq!(s.list("/").await.unwrap().items.len(), 5);

    let up = s
        .update("/core/configmaps/ns/b", obj("b", 2), None)
        .await
        .unwrap();
    assert_eq!(rv(&up), base + 6);
    assert_eq!(up["data"]["v"], 2);
    let err = s
        .update("/core/configmaps/ns/none", obj("none", 1), None)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let gone = s.delete("/core/configmaps/ns/b", None).await.unwrap();
    assert_eq!(
        rv(&gone),
        base + 7,
        "a deletion is stamped with its revision"
    );
    assert_eq!(gone["data"]["v"], 2);
    assert!(
        s.delete("/core/configmaps/ns/b", None)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert_eq!(s.get("/core/configmaps/ns/b").await.unwrap(), None);

    // Bad keys and values are refused, never stored.
    assert!(
        s.create("/core/configmaps/ns/", obj("x", 1))
            .await
            .unwrap_err()
            .is_invalid()
    );
    assert!(
        s.create("/core/configmaps/ns/x", json!(5))
            .await
            .unwrap_err()
            .is_invalid()
    );
    assert!(
        s.create("/core/configmaps/ns/x", json!({"metadata": 1}))
            .await
            .unwrap_err()
            .is_invalid()
    );
    assert_eq!(s.current_revision().await.unwrap(), base + 7);
}

async fn cas_conflicts(b: &mut Backend) {
    let s = b.s();
    let v1 = s
        .create("/core/configmaps/ns/a", obj("a", 1))
        .await
        .unwrap();
    let v2 = s
        .update("/core/configmaps/ns/a", obj("a", 2), Some(rv(&v1)))
        .await
        .unwrap();
    // A writer still holding v1 loses, and learns the current revision.
    match s
        .update("/core/configmaps/ns/a", obj("a", 3), Some(rv(&v1)))
        .await
    {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (rv(&v1), rv(&v2))),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let err = s
        .delete("/core/configmaps/ns/a", Some(rv(&v1)))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(
        s.get("/core/configmaps/ns/a").await.unwrap().unwrap()["data"]["v"],
        2
    );
    let d = s
        .delete("/core/configmaps/ns/a", Some(rv(&v2)))
        .await
        .unwrap();
    assert_eq!(d["data"]["v"], 2);
}

async fn guaranteed_update_retries_under_contention(b: &mut Backend) {
    const TASKS: u64 = 6;
    const EACH: u64 = 15;
    let s = b.arc();
    s.create("/core/configmaps/ns/n", obj("n", 0))
        .await
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (s, calls) = (s.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..EACH {
                let calls = calls.clone();
                s.guaranteed_update(
                    "/core/configmaps/ns/n",
                    Box::new(move |cur| {
                        calls.fetch_add(1, Ordering::Relaxed);
                        let mut o = cur.cloned().expect("exists");
                        let v = o["data"]["v"].as_i64().expect("v");
                        o["data"]["v"] = json!(v + 1);
                        Ok(Mutation::Put(o))
                    }),
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = s.get("/core/configmaps/ns/n").await.unwrap().unwrap();
    assert_eq!(n["data"]["v"], json!(TASKS * EACH), "no increment lost");
    let runs = calls.load(Ordering::Relaxed);
    assert!(runs >= TASKS * EACH);
    eprintln!("{} increments took {runs} UpdateFn runs", TASKS * EACH);

    // Keep writes nothing; Delete of an absent key is NotFound; an aborting fn's error comes back.
    let head = s.current_revision().await.unwrap();
    let out = s
        .guaranteed_update("/core/configmaps/ns/n", Box::new(|_| Ok(Mutation::Keep)))
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Unchanged(Some(_))));
    assert_eq!(s.current_revision().await.unwrap(), head);
    let err = s
        .guaranteed_update(
            "/core/configmaps/ns/none",
            Box::new(|_| Ok(Mutation::Delete)),
        )
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let out = s
        .guaranteed_update("/core/configmaps/ns/n", Box::new(|_| Ok(Mutation::Delete)))
        .await
        .unwrap();
    let Outcome::Deleted(last) = out else {
        panic!("expected a deletion")
    };
    assert_eq!(rv(&last), head + 1);
}

/// An update from a believed object ends as one from a fresh read would, whether the belief
/// is current or stale (an older version, absent when present, present when deleted): it may
/// see the stale belief first, but writes only on the current object, and writes nothing
/// (Keep, nothing to delete, an error) only when the current object says so.
async fn guaranteed_update_from_a_belief(b: &mut Backend) {
    let s = b.s();
    let key = "/core/configmaps/ns/b";
    let v1 = s.create(key, obj("b", 1)).await.unwrap();
    let v2 = s.update(key, obj("b", 2), None).await.unwrap();
    // Increment what it sees, remembering each version it was shown.
    let increment = |seen: Arc<std::sync::Mutex<Vec<i64>>>| -> UpdateFn {
        Box::new(move |cur| {
            let mut o = cur.cloned().expect("exists");
            let v = o["data"]["v"].as_i64().expect("v");
            seen.lock().unwrap().push(v);
            o["data"]["v"] = json!(v + 1);
            Ok(Mutation::Put(o))
        })
    };
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = s
        .guaranteed_update_from(key, Some(v1.clone()), increment(seen.clone()))
        .await
        .unwrap();
    let Outcome::Written(v3) = out else {
        panic!("expected a write, got {out:?}")
    };
    assert_eq!(
        v3["data"]["v"], 3,
        "written on the current object, not the stale belief"
    );
    assert_eq!(seen.lock().unwrap().last(), Some(&2));
    // A current belief.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = s
        .guaranteed_update_from(key, Some(v3.clone()), increment(seen.clone()))
        .await
        .unwrap();
    let Outcome::Written(v4) = out else {
        panic!("expected a write, got {out:?}")
    };
    assert_eq!(
        (v4["data"]["v"].clone(), seen.lock().unwrap().clone()),
        (json!(4), vec![3])
    );

    // A stale belief that alone would decide Keep (v is already 2 there) or fail: the current
    // object (v = 4) decides, and it writes.
    let to_two = |cur: Option<&Value>| -> Result<Mutation, StoreError> {
        let mut o = cur.cloned().expect("exists");
        if o["data"]["v"] == 2 {
            return Ok(Mutation::Keep);
        }
        o["data"]["v"] = json!(2);
        Ok(Mutation::Put(o))
    };
    let out = s
        .guaranteed_update_from(key, Some(v2.clone()), Box::new(to_two))
        .await
        .unwrap();
    assert!(
        matches!(&out, Outcome::Written(o) if o["data"]["v"] == 2),
        "{out:?}"
    );
    let head = s.current_revision().await.unwrap();
    let fails_on_one = |cur: Option<&Value>| -> Result<Mutation, StoreError> {
        let mut o = cur.cloned().expect("exists");
        if o["data"]["v"] == 1 {
            return Err(StoreError::Backend("decided on the stale belief".into()));
        }
        o["data"]["v"] = json!(5);
        Ok(Mutation::Put(o))
    };
    let out = s
        .guaranteed_update_from(key, Some(v1.clone()), Box::new(fails_on_one))
        .await
        .unwrap();
    assert!(
        matches!(&out, Outcome::Written(o) if rv(o) == head + 1),
        "{out:?}"
    );

    // Believed absent while it exists: a create-only decision sees it and keeps it.
    let head = s.current_revision().await.unwrap();
    let create_only = |cur: Option<&Value>| -> Result<Mutation, StoreError> {
        Ok(match cur {
            Some(_) => Mutation::Keep,
            None => Mutation::Put(obj("b", 100)),
        })
    };
    let out = s
        .guaranteed_update_from(key, None, Box::new(create_only))
        .await
        .unwrap();
    assert!(
        matches!(&out, Outcome::Unchanged(Some(o)) if o["data"]["v"] == 5),
        "{out:?}"
    );
    assert_eq!(s.current_revision().await.unwrap(), head, "nothing written");

    // Believed present after its deletion: a deletion finds nothing, a Keep reports absence,
    // a create-only decision creates.
    let last = s.get(key).await.unwrap().unwrap();
    s.delete(key, None).await.unwrap();
    let err = s
        .guaranteed_update_from(key, Some(last.clone()), Box::new(|_| Ok(Mutation::Delete)))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let out = s
        .guaranteed_update_from(key, Some(last.clone()), Box::new(|_| Ok(Mutation::Keep)))
        .await
        .unwrap();
    assert_eq!(out, Outcome::Unchanged(None));
    let out = s
        .guaranteed_update_from(key, Some(last), Box::new(create_only))
        .await
        .unwrap();
    assert!(
        matches!(&out, Outcome::Written(o) if o["data"]["v"] == 100),
        "{out:?}"
    );
}

async fn list_at_is_the_state_then(b: &mut Backend) {
    let s = b.s();
    let a = s
        .create("/core/configmaps/ns/a", obj("a", 1))
        .await
        .unwrap();
    let bb = s
        .create("/core/configmaps/ns/b", obj("b", 1))
        .await
        .unwrap();
    let then = rv(&bb);
    s.update("/core/configmaps/ns/a", obj("a", 2), None)
        .await
        .unwrap();
    s.delete("/core/configmaps/ns/b", None).await.unwrap();
    s.create("/core/configmaps/ns/c", obj("c", 1))
        .await
        .unwrap();
    s.create("/core/pods/ns/p", obj("p", 1)).await.unwrap();

    let at = s.list_at("/core/configmaps/", then).await.unwrap();
    assert_eq!(at.revision, then);
    assert_eq!(at.items, vec![a.clone(), bb.clone()]);
    let at_ns = s.list_at("/core/configmaps/ns/", rv(&a)).await.unwrap();
    assert_eq!(at_ns.items, vec![a]);
    let head = s.current_revision().await.unwrap();
    assert_eq!(
        s.list_at("/core/configmaps/", head).await.unwrap().items,
        s.list("/core/configmaps/").await.unwrap().items
    );
    match s.list_at("/core/configmaps/", head + 10).await {
        Err(StoreError::FutureRevision { requested, current }) => {
            assert_eq!((requested, current), (head + 10, head))
        }
        other => panic!("expected FutureRevision, got {other:?}"),
    }
}

async fn pages_hold_what_they_return_at_one_revision(b: &mut Backend) {
    let s = b.s();
    let mut made = BTreeMap::new();
    for name in ["a", "b", "c", "d", "e"] {
        let o = s
            .create(&format!("/core/configmaps/ns/{name}"), obj(name, 1))
            .await
            .unwrap();
        made.insert(name, o);
    }
    s.create("/core/configmaps/ns2/x", obj("x", 1))
        .await
        .unwrap();
    s.create("/core/pods/ns/p", obj("p", 1)).await.unwrap();
    let at = s.current_revision().await.unwrap();
    let names = |items: &[Value]| -> Vec<String> {
        items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let ns = "/core/configmaps/ns/";
    let first = s.list_page(ns, "", 2, None).await.unwrap();
    assert_eq!(
        (names(&first.items), first.remaining),
        (vec!["a".into(), "b".into()], 3)
    );
    assert_eq!(first.revision, at);
    assert_eq!(first.items, vec![made["a"].clone(), made["b"].clone()]);

    // Changes after the first page: the rest of that list is read at its revision.
    s.update("/core/configmaps/ns/c", obj("c", 2), None)
        .await
        .unwrap();
    s.delete("/core/configmaps/ns/d", None).await.unwrap();
    s.create("/core/configmaps/ns/f", obj("f", 1))
        .await
        .unwrap();
    let after_b = "/core/configmaps/ns/b\u{0}";
    let second = s.list_page(ns, after_b, 2, Some(at)).await.unwrap();
    assert_eq!(second.items, vec![made["c"].clone(), made["d"].clone()]);
    assert_eq!((second.revision, second.remaining), (at, 1));
    let rest = s.list_page(ns, after_b, 0, Some(at)).await.unwrap();
    assert_eq!(names(&rest.items), ["c", "d", "e"]);
    assert_eq!(rest.remaining, 0);
    // At the latest revision: today's objects.
    let now = s.list_page(ns, after_b, 0, None).await.unwrap();
    assert_eq!(names(&now.items), ["c", "e", "f"]);
    assert_eq!(now.items[0]["data"]["v"], 2);
    assert_eq!(now.items, s.list(ns).await.unwrap().items[2..].to_vec());
    // The whole resource, across namespaces; nothing after the prefix's last key.
    let all = s.list_page("/core/configmaps/", "", 3, None).await.unwrap();
    assert_eq!(
        (names(&all.items), all.remaining),
        (vec!["a".into(), "b".into(), "c".into()], 3)
    );
    let past = s
        .list_page(ns, "/core/configmaps/nt", 5, None)
        .await
        .unwrap();
    assert_eq!((past.items.len(), past.remaining), (0, 0));
    let head = s.current_revision().await.unwrap();
    match s.list_page(ns, "", 1, Some(head + 10)).await {
        Err(StoreError::FutureRevision { requested, .. }) => assert_eq!(requested, head + 10),
        other => panic!("expected FutureRevision, got {other:?}"),
    }
}

async fn acknowledged_writes_survive_a_crash(b: &mut Backend) {
    let s = b.arc();
    // Writers run while the crash happens; whatever was acknowledged must be there after.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let (s, stop) = (s.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut acked = BTreeMap::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 2000 {
                let key = format!("/core/configmaps/d{i}/k{n}");
                if let Ok(o) = s.create(&key, obj("k", n)).await {
                    acked.insert(key, rv(&o));
                }
                n += 1;
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.crash();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = BTreeMap::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    drop(s);
    b.restart().await;
    assert!(
        acked.len() > 10,
        "the writers wrote ({} acknowledged)",
        acked.len()
    );
    let s = b.s();
    for (key, revision) in &acked {
        let o = s
            .get(key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged write {key} at {revision} lost"));
        assert_eq!(rv(&o), *revision, "{key}");
    }
    // And the store goes on.
    s.create("/core/configmaps/ns/after", obj("after", 1))
        .await
        .unwrap();
    eprintln!("{} acknowledged writes survived the crash", acked.len());
}
