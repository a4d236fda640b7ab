//! The etcd store's watch cache beyond the conformance suite (which runs with it on and off):
//! a watch within the window opens no etcd watch and sees exactly what its own etcd watch
//! sees; below the window, for an uncached resource or the whole store, it is its own etcd
//! watch; a watcher that stops reading blocks nobody and, once out of the window, goes on
//! from etcd without a gap; after a compaction the window still serves what it holds (a quiet
//! resource's watch resumes from its list's revision), below it etcd answers Gone; a 3-member cluster losing each member in turn, the leader
//! first, under writes goes unnoticed by the cached watchers; a cached read of one object is the
//! cache's or etcd's. Skipped with a printed reason when the
//! `etcd` binary is missing (a failure under `SVCNET_REQUIRE_ETCD=1`).
#![allow(clippy::unwrap_used)] // test: a failure here is a test failure

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use support::{assert_quiet, next, rv};
use svcnet_store::local_etcd::{LocalEtcd, etcd_for_test};
use svcnet_store::{
    EtcdOptions, EtcdStore, Event, EventStream, Store, StoreError, WatchCacheOptions,
    WatchCacheStats,
};

async fn connect(cluster: &LocalEtcd, cache: WatchCacheOptions) -> EtcdStore {
    EtcdStore::connect(EtcdOptions {
        endpoints: cluster.endpoints(),
        request_timeout: Duration::from_secs(2),
        watch_cache: cache,
        ..Default::default()
    })
    .await
    .expect("connecting to etcd")
}

/// The cache with `configmaps` kept to `size` events.
fn configmaps(size: usize) -> WatchCacheOptions {
    WatchCacheOptions {
        sizes: [("configmaps".to_string(), size)].into(),
        ..Default::default()
    }
}

fn off() -> WatchCacheOptions {
    WatchCacheOptions {
        enabled: false,
        ..Default::default()
    }
}

fn cm(name: &str, v: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": v}})
}

/// `n` events of a watch.
async fn take(w: &mut EventStream, n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next(w).await);
    }
    out
}

/// Creates, updates and deletes under `/core/configmaps/` in two namespaces, with writes to
/// other resources in between; returns the revisions of the configmap writes.
async fn churn(s: &EtcdStore, tag: &str, rounds: u64) -> Vec<u64> {
    let mut revs = Vec::new();
    for n in 0..rounds {
        let ns = if n % 2 == 0 { "a" } else { "b" };
        let key = format!("/core/configmaps/{ns}/{tag}{}", n % 4);
        let o = if n < 4 {
            s.create(&key, cm(&key, n)).await.unwrap()
        } else if n % 5 == 0 {
            match s.delete(&key, None).await {
                Ok(o) => o,
                Err(e) if e.is_not_found() => s.create(&key, cm(&key, n)).await.unwrap(),
                Err(e) => panic!("{e}"),
            }
        } else {
            match s.update(&key, cm(&key, n), None).await {
                Ok(o) => o,
                Err(e) if e.is_not_found() => s.create(&key, cm(&key, n)).await.unwrap(),
                Err(e) => panic!("{e}"),
            }
        };
        revs.push(rv(&o));
        s.create(&format!("/core/pods/a/{tag}{n}"), cm("p", n))
            .await
            .unwrap();
    }
    revs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_within_the_window_opens_no_etcd_watch() {
    let Some(bin) = etcd_for_test("a_watch_within_the_window_opens_no_etcd_watch") else {
        return;
    };
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let s = connect(&cluster, WatchCacheOptions::default()).await;
    let reference = connect(&cluster, off()).await;
    let base = s.current_revision().await.unwrap();
    let mut direct = reference.watch("/core/configmaps/", base).await.unwrap();
    // The first watch of a resource starts its upstream watch, from the current revision:
    // this watch is within the window.
    let mut first = s.watch("/core/configmaps/", base).await.unwrap();
    let started = s.watch_cache_stats();
    assert_eq!(
        (started.upstreams, started.cached, started.direct),
        (1, 1, 0),
        "{started:?}"
    );
    assert_eq!(started.etcd_watches, 1, "{started:?}");

    let revs = churn(&s, "k", 24).await;
    let all = take(&mut direct, revs.len()).await;
    assert_eq!(
        all.iter().map(|e| e.revision).collect::<Vec<_>>(),
        revs,
        "the reference (etcd's own watch) saw every write"
    );
    assert_eq!(take(&mut first, all.len()).await, all);

    // Watches from every revision of the window, of the resource and of one namespace.
    let mut watches = Vec::new();
    for from in std::iter::once(base).chain(revs.iter().copied()) {
        watches.push((
            from,
            "/core/configmaps/",
            s.watch("/core/configmaps/", from).await,
        ));
        watches.push((
            from,
            "/core/configmaps/a/",
            s.watch("/core/configmaps/a/", from).await,
        ));
    }
    let stats = s.watch_cache_stats();
    assert_eq!(
        stats.etcd_watches, started.etcd_watches,
        "no etcd watch was opened: {stats:?}"
    );
    assert_eq!(
        (stats.cached, stats.direct),
        (1 + watches.len() as u64, 0),
        "{stats:?}"
    );
    // Each sees exactly what etcd's own watch saw after its revision, then what comes next.
    s.create("/core/configmaps/a/sentinel", cm("sentinel", 0))
        .await
        .unwrap();
    let sentinel = next(&mut direct).await;
    for (from, prefix, w) in watches {
        let mut w = w.unwrap();
        let expected: Vec<&Event> = all
            .iter()
            .filter(|e| e.revision > from && e.key.starts_with(prefix))
            .collect();
        let got = take(&mut w, expected.len() + 1).await;
        assert_eq!(
            got.iter().collect::<Vec<_>>()[..expected.len()],
            expected[..],
            "{prefix} from {from}"
        );
        assert_eq!(got[expected.len()], sentinel, "{prefix} from {from}");
    }
    assert_eq!(next(&mut first).await, sentinel);
    assert_quiet(&mut first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_below_the_window_goes_to_etcd() {
    let Some(bin) = etcd_for_test("a_watch_below_the_window_goes_to_etcd") else {
        return;
    };
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let mut cache = configmaps(5);
    cache.sizes.insert("pods".into(), 0);
    let s = connect(&cluster, cache).await;
    let early = s
        .create("/core/configmaps/a/early", cm("early", 0))
        .await
        .unwrap();
    let base = s.current_revision().await.unwrap();
    drop(s.watch("/core/configmaps/", base).await.unwrap());
    let revs = churn(&s, "k", 20).await;
    let before = s.watch_cache_stats();

    // The ring keeps the last 5 events: a watch from before them is its own etcd watch.
    let mut below = s.watch("/core/configmaps/", base).await.unwrap();
    let got = take(&mut below, revs.len()).await;
    assert_eq!(got.iter().map(|e| e.revision).collect::<Vec<_>>(), revs);
    // So is one from before the cache started.
    let mut older = s.watch("/core/configmaps/", rv(&early) - 1).await.unwrap();
    assert_eq!(next(&mut older).await.revision, rv(&early));
    let after = s.watch_cache_stats();
    assert_eq!(
        (after.direct - before.direct, after.cached - before.cached),
        (2, 0),
        "{after:?}"
    );
    assert_eq!(after.etcd_watches - before.etcd_watches, 2, "{after:?}");

    // From the oldest revision still in the window: memory again.
    let from = revs[revs.len() - 5];
    let mut inside = s.watch("/core/configmaps/", from).await.unwrap();
    assert_eq!(
        take(&mut inside, 4)
            .await
            .iter()
            .map(|e| e.revision)
            .collect::<Vec<_>>(),
        revs[revs.len() - 4..]
    );
    let now = s.watch_cache_stats();
    assert_eq!(
        (now.cached - after.cached, now.etcd_watches),
        (1, after.etcd_watches),
        "{now:?}"
    );

    // A resource whose size is 0, and a prefix that is not one resource's, go to etcd.
    let head = s.current_revision().await.unwrap();
    let mut pods = s.watch("/core/pods/", head).await.unwrap();
    let mut everything = s.watch("/", head).await.unwrap();
    let p = s.create("/core/pods/b/p", cm("p", 1)).await.unwrap();
    assert_eq!(next(&mut pods).await.revision, rv(&p));
    assert_eq!(next(&mut everything).await.revision, rv(&p));
    let last = s.watch_cache_stats();
    assert_eq!(
        (last.direct - now.direct, last.upstreams),
        (2, 1),
        "{last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_watcher_blocks_nobody_and_loses_nothing() {
    let Some(bin) = etcd_for_test("a_lagging_watcher_blocks_nobody_and_loses_nothing") else {
        return;
    };
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let s = connect(&cluster, configmaps(8)).await;
    let base = s.current_revision().await.unwrap();
    // Never read until the writes are done.
    let mut slow = s.watch("/core/configmaps/", base).await.unwrap();
    let mut fast = s.watch("/core/configmaps/", base).await.unwrap();
    assert_eq!(s.watch_cache_stats().cached, 2);
    const WRITES: usize = 60;
    let reader = tokio::spawn(async move { take(&mut fast, WRITES).await });
    let mut revs = Vec::new();
    for n in 0..WRITES {
        let o = s
            .create(&format!("/core/configmaps/a/k{n}"), cm("k", n as u64))
            .await
            .unwrap();
        revs.push(rv(&o));
    }
    // The reader got everything while the slow watcher read nothing.
    let fast_got = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the fast watcher was not held up")
        .unwrap();
    assert_eq!(
        fast_got.iter().map(|e| e.revision).collect::<Vec<_>>(),
        revs
    );
    // The slow one is 60 events behind an 8-event window: it goes on from etcd, no gap.
    let slow_got = take(&mut slow, WRITES).await;
    assert_eq!(slow_got, fast_got);
    let stats = s.watch_cache_stats();
    assert!(stats.fallbacks >= 1, "{stats:?}");
    // And follows live changes afterwards.
    let late = s
        .create("/core/configmaps/a/late", cm("late", 0))
        .await
        .unwrap();
    assert_eq!(next(&mut slow).await.revision, rv(&late));
    assert_quiet(&mut slow).await;
    eprintln!("after the lag: {stats:?}");
}

/// After a compaction the window still serves the revisions it holds, as kube-apiserver's
/// cacher decides "too old" by its own window: a client of a quiet resource resumes its watch
/// from its list's revision instead of re-listing after every compaction (S13 on etcd at 1,000
/// nodes: each node's Services watch, resumed every ~5 minutes from its list's revision, was
/// refused after each compaction and re-listed 10k Services). Below the window etcd decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_revision_within_the_window_is_served() {
    let Some(bin) = etcd_for_test("a_compacted_revision_within_the_window_is_served") else {
        return;
    };
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let a = connect(&cluster, WatchCacheOptions::default()).await;
    let reference = connect(&cluster, off()).await;
    // A quiet resource is listed (its cache starts); a busy one is watched.
    let listed = a.list("/core/services/").await.unwrap().revision;
    let base = a.current_revision().await.unwrap();
    let mut open = a.watch("/core/configmaps/", base).await.unwrap();
    let revs = churn(&a, "k", 10).await;
    // The coordinated compactor: the first round records the revision, the second compacts.
    let state = a.compact_round(Default::default()).await.unwrap();
    let more = churn(&a, "m", 4).await;
    a.compact_round(state).await.unwrap();
    assert!(state.revision > revs[9], "compacted to {}", state.revision);
    for (prefix, from) in [("/core/services/", listed), ("/core/configmaps/", revs[0])] {
        match reference.watch(prefix, from).await {
            Err(StoreError::Gone { requested, .. }) => assert_eq!(requested, from),
            Err(e) => panic!("expected Gone from etcd, got {e}"),
            Ok(_) => panic!("expected Gone from etcd, got a watch"),
        }
    }
    // From memory, no etcd watch: the quiet resource from its list's revision...
    let opened = a.watch_cache_stats().etcd_watches;
    let mut quiet = a.watch("/core/services/", listed).await.unwrap();
    let late = a.create("/core/services/ns/late", cm("late", 1)).await;
    assert_eq!(next(&mut quiet).await.revision, rv(&late.unwrap()));
    // ... and the busy one from a compacted revision: every event after it.
    let mut w = a.watch("/core/configmaps/", revs[0]).await.unwrap();
    let after: Vec<u64> = revs[1..].iter().chain(&more).copied().collect();
    let got = take(&mut w, after.len()).await;
    assert_eq!(got.iter().map(|e| e.revision).collect::<Vec<_>>(), after);
    assert_eq!(a.watch_cache_stats().etcd_watches, opened);
    // Below the window (a cache started after the compaction): etcd's Gone.
    let c = connect(&cluster, WatchCacheOptions::default()).await;
    match c.watch("/core/configmaps/", revs[0]).await {
        Err(StoreError::Gone { requested, .. }) => assert_eq!(requested, revs[0]),
        Err(e) => panic!("expected Gone, got {e}"),
        Ok(_) => panic!("expected Gone, got a watch"),
    }
    assert_eq!(c.watch_cache_stats().direct, 1);
    // The open watch went on through it all.
    let all: Vec<u64> = revs.iter().chain(&more).copied().collect();
    let got = take(&mut open, all.len()).await;
    assert_eq!(got.iter().map(|e| e.revision).collect::<Vec<_>>(), all);
}

/// Writers on a 3-member cluster while each member in turn, the leader first, is SIGKILLed
/// and restarted; five cached watchers (four on the resource, one on a namespace) run throughout.
/// Each sees every acknowledged write of its prefix once, in order, and none of them noticed:
/// no fallback to a direct watch, one upstream watch (which resumed by itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_under_writes_goes_unnoticed() {
    let Some(bin) = etcd_for_test("a_member_killed_under_writes_goes_unnoticed") else {
        return;
    };
    let mut cluster = LocalEtcd::start(&bin, 3).await.expect("3-member etcd");
    // A history larger than the test writes: this test is about member failures, not lag
    // (a_lagging_watcher_… has that).
    let store = connect(&cluster, configmaps(1_000_000)).await;
    let base = store.current_revision().await.unwrap();
    // The watchers read as they go, until the closing write.
    let mut readers = Vec::new();
    for prefix in [
        "/core/configmaps/",
        "/core/configmaps/",
        "/core/configmaps/",
        "/core/configmaps/",
        "/core/configmaps/w1/",
    ] {
        let mut w = store.watch(prefix, base).await.unwrap();
        readers.push((
            prefix,
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    let e = tokio::time::timeout(Duration::from_secs(30), w.next())
                        .await
                        .expect("an event within 30 s")
                        .expect("watch open")
                        .expect("event");
                    if e.key.ends_with("/end") {
                        return seen;
                    }
                    seen.push(e.revision);
                }
            }),
        ));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..3 {
        let (store, stop) = (store.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut acked = BTreeMap::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("/core/configmaps/w{w}/k{n}");
                // A create whose answer was lost may have committed: the retry then finds it.
                let result = match store.create(&key, cm("k", n)).await {
                    Ok(v) => Some(v),
                    Err(e) if e.is_already_exists() => store.get(&key).await.ok().flatten(),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                if let Some(v) = result {
                    acked.insert(key, rv(&v));
                    n += 1;
                }
            }
            acked
        }));
    }
    // Every member in turn, the leader first, so that the member carrying the upstream watch
    // is certainly among them.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let leader = cluster.leader().await.expect("a leader");
    for victim in [leader, (leader + 1) % 3, (leader + 2) % 3] {
        cluster.kill(victim);
        tokio::time::sleep(Duration::from_secs(3)).await;
        cluster.restart(victim).await.expect("restart member");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = BTreeMap::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    assert!(acked.len() > 50, "{} writes acknowledged", acked.len());
    store
        .create("/core/configmaps/w1/end", cm("end", 0))
        .await
        .unwrap();
    for (prefix, reader) in readers {
        let mut expected: Vec<u64> = acked
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, r)| *r)
            .collect();
        expected.sort_unstable();
        let got = reader.await.unwrap();
        assert_eq!(got, expected, "{prefix}: every acknowledged write once");
    }
    let stats: WatchCacheStats = store.watch_cache_stats();
    assert_eq!(
        (stats.upstreams, stats.cached, stats.direct, stats.fallbacks),
        (1, 5, 0, 0),
        "the watchers did not notice: {stats:?}"
    );
    // Every member died once: the upstream watch was reopened at least once.
    assert!(
        stats.etcd_watches >= 2,
        "the cache's etcd watches were reopened after their members died: {stats:?}"
    );
    eprintln!(
        "{} acknowledged writes seen by 5 cached watchers; {stats:?}",
        acked.len()
    );
}

/// A list from the cache is the list etcd itself gives at the same revision, also right after
/// another API server's write that the cache has not seen yet (a create, an update, a
/// deletion alone, a write to another resource only), for a whole resource and for one
/// namespace; with the resource's cache off, lists read etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_from_the_cache_are_etcds_lists() {
    let Some(bin) = etcd_for_test("lists_from_the_cache_are_etcds_lists") else {
        return;
    };
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let s = connect(&cluster, WatchCacheOptions::default()).await;
    // Another API server (no cache): its writes reach `s` through etcd only, and its lists
    // are etcd's own.
    let other = connect(&cluster, off()).await;
    churn(&other, "x", 9).await;
    let prefixes = [
        "/core/configmaps/",
        "/core/configmaps/a/",
        "/core/configmaps/b/",
    ];
    let same = |step: &str, cached: &svcnet_store::ListResult, etcd: &svcnet_store::ListResult| {
        assert_eq!(cached.items, etcd.items, "{step}: items");
        assert_eq!(cached.revision, etcd.revision, "{step}: revision");
    };
    for p in prefixes {
        let cached = s.list(p).await.unwrap();
        same(
            &format!("first list of {p}"),
            &cached,
            &other.list(p).await.unwrap(),
        );
    }
    assert_eq!(s.watch_cache_stats().upstreams, 1, "one hub for configmaps");

    for round in 0..40u64 {
        let ns = ["a", "b"][(round % 2) as usize];
        let key = format!("/core/configmaps/{ns}/y{}", round % 3);
        let step = match round % 4 {
            0 => {
                let _ = other.delete(&key, None).await;
                other.create(&key, cm(&key, round)).await.unwrap();
                "create"
            }
            1 => {
                other.update(&key, cm(&key, round), None).await.ok();
                "update"
            }
            2 => {
                // A deletion alone: nothing under the prefix is newer than the cache's head.
                other.delete(&key, None).await.ok();
                "deletion"
            }
            _ => {
                other
                    .create(&format!("/core/pods/a/y{round}"), cm("p", round))
                    .await
                    .unwrap();
                "another resource's write"
            }
        };
        for p in prefixes {
            let cached = s.list(p).await.unwrap();
            let etcd = other.list(p).await.unwrap();
            same(&format!("round {round}, {step}, {p}"), &cached, &etcd);
        }
    }
    let stats = s.watch_cache_stats();
    assert_eq!(
        (stats.lists_cached, stats.lists_etcd),
        (3 + 40 * 3, 0),
        "{stats:?}"
    );

    let uncached = connect(&cluster, configmaps(0)).await;
    let l = uncached.list("/core/configmaps/").await.unwrap();
    same(
        "cache off",
        &l,
        &other.list("/core/configmaps/").await.unwrap(),
    );
    let stats = uncached.watch_cache_stats();
    assert_eq!((stats.lists_cached, stats.lists_etcd), (0, 1), "{stats:?}");
}

/// A cached read of one object: what the resource's cache holds (counted), else etcd's object
/// (a key the cache has not seen yet, or no key at all); a write by another API server shows
/// once its event reaches the cache; with the resource's cache off, it is etcd's read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_get_is_the_caches_object_or_etcds() {
    let Some(bin) = etcd_for_test("a_cached_get_is_the_caches_object_or_etcds") else {
        return;
    };
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let s = connect(&cluster, WatchCacheOptions::default()).await;
    let other = connect(&cluster, off()).await;
    let ns = |name: &str, v: u64| {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
               "spec": {"v": v}})
    };
    let a = "/core/namespaces//a";
    other.create(a, ns("a", 0)).await.unwrap();

    // The first read starts the cache from etcd's state: it holds `a`.
    let got = s.get_cached(a).await.unwrap();
    assert_eq!(got, other.get(a).await.unwrap(), "a, from the cache");
    assert_eq!(s.watch_cache_stats().gets_cached, 1);
    assert_eq!(s.watch_cache_stats().upstreams, 1, "one hub for namespaces");

    // A key nobody wrote: etcd answers it, not the cache.
    assert_eq!(s.get_cached("/core/namespaces//none").await.unwrap(), None);
    assert_eq!(s.watch_cache_stats().gets_cached, 1);

    // Another server's writes: a new key reads right away (etcd, until the cache has it), a
    // change shows once its event arrives.
    for round in 1..=20u64 {
        let key = format!("/core/namespaces//n{round}");
        let created = other.create(&key, ns("n", round)).await.unwrap();
        assert_eq!(s.get_cached(&key).await.unwrap(), Some(created), "{key}");
        let updated = other.update(a, ns("a", round), None).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let seen = s.get_cached(a).await.unwrap();
            if seen.as_ref() == Some(&updated) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the cache still holds {seen:?}, etcd {updated:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert!(s.watch_cache_stats().gets_cached >= 21);

    let uncached = connect(
        &cluster,
        WatchCacheOptions {
            sizes: [("namespaces".to_string(), 0)].into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        uncached.get_cached(a).await.unwrap(),
        other.get(a).await.unwrap()
    );
    let stats = uncached.watch_cache_stats();
    assert_eq!((stats.gets_cached, stats.upstreams), (0, 0), "{stats:?}");
}
