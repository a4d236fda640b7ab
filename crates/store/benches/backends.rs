//! The two store back ends side by side: the same operations through the `Store` trait on
//! `RedbStore` (a file in a temp dir, fsync per commit) and on `EtcdStore` (Debian's etcd, one
//! member on loopback, a fresh data dir), with etcd's figures as a ratio of redb's; a last
//! column has etcd with its watch cache off (every watch its own etcd watch).
//!
//! `cargo bench -p svcnet-store --bench backends` (`SVCNET_BENCH_OPS`, default 500, sets the
//! operations per measurement). Needs the `etcd` binary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use svcnet_store::local_etcd::{LocalEtcd, etcd_binary};
use svcnet_store::{
    EtcdOptions, EtcdStore, Mutation, RedbStore, Store, StoreOptions, WatchCacheOptions,
};

fn service(name: &str, n: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "bench", "labels": {"app": "web"}},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80, "targetPort": n}],
                 "selector": {"app": "web"}}
    })
}

/// p50 and p99 of latencies, in milliseconds.
fn quantiles(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort_unstable();
    let at = |q: f64| {
        let i = ((v.len() as f64 - 1.0) * q).round() as usize;
        v.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    (at(0.5), at(0.99))
}

#[derive(Default)]
struct Figures {
    rows: Vec<(String, f64)>,
}

impl Figures {
    fn push(&mut self, name: &str, value: f64) {
        self.rows.push((name.to_string(), value));
    }
}

async fn measure(store: Arc<dyn Store>, ops: usize) -> Figures {
    let mut f = Figures::default();
    let mut lat = Vec::with_capacity(ops);
    for i in 0..ops {
        let t = Instant::now();
        store
            .create(&format!("/core/services/bench/s{i:05}"), service("s", i))
            .await
            .expect("create");
        lat.push(t.elapsed());
    }
    let (p50, p99) = quantiles(std::mem::take(&mut lat));
    f.push("create p50 ms", p50);
    f.push("create p99 ms", p99);

    for i in 0..ops {
        let t = Instant::now();
        store
            .get(&format!("/core/services/bench/s{i:05}"))
            .await
            .expect("get");
        lat.push(t.elapsed());
    }
    let (p50, p99) = quantiles(std::mem::take(&mut lat));
    f.push("get p50 ms", p50);
    f.push("get p99 ms", p99);

    for i in 0..ops {
        let t = Instant::now();
        store
            .guaranteed_update(
                &format!("/core/services/bench/s{i:05}"),
                Box::new(|cur| {
                    let mut o = cur.cloned().unwrap_or_default();
                    o["metadata"]["labels"]["v"] = json!("2");
                    Ok(Mutation::Put(o))
                }),
            )
            .await
            .expect("update");
        lat.push(t.elapsed());
    }
    let (p50, p99) = quantiles(std::mem::take(&mut lat));
    f.push("read-modify-write p50 ms", p50);
    f.push("read-modify-write p99 ms", p99);

    for _ in 0..20 {
        let t = Instant::now();
        let l = store.list("/core/services/bench/").await.expect("list");
        assert_eq!(l.items.len(), ops);
        lat.push(t.elapsed());
    }
    let (p50, _) = quantiles(std::mem::take(&mut lat));
    f.push(&format!("list of {ops} p50 ms"), p50);

    // Write → watch event, one at a time.
    let head = store.current_revision().await.expect("revision");
    let mut w = store.watch("/core/configmaps/", head).await.expect("watch");
    for i in 0..ops.min(200) {
        let t = Instant::now();
        store
            .create(
                &format!("/core/configmaps/bench/c{i}"),
                json!({"metadata": {"name": "c"}}),
            )
            .await
            .expect("create");
        w.next().await.expect("open").expect("event");
        lat.push(t.elapsed());
    }
    let (p50, p99) = quantiles(std::mem::take(&mut lat));
    f.push("write→watch event p50 ms", p50);
    f.push("write→watch event p99 ms", p99);
    drop(w);

    // Watch start: from the current revision, as a client does after its list.
    let head = store.current_revision().await.expect("revision");
    for _ in 0..ops.min(200) {
        let t = Instant::now();
        let w = store.watch("/core/configmaps/", head).await.expect("watch");
        lat.push(t.elapsed());
        drop(w);
    }
    let (p50, p99) = quantiles(std::mem::take(&mut lat));
    // In microseconds: served from memory it is far below a millisecond.
    f.push("watch start p50 µs", p50 * 1e3);
    f.push("watch start p99 µs", p99 * 1e3);

    // Fan-out: a write until every one of FANOUT watchers has it.
    const FANOUT: usize = 500;
    let head = store.current_revision().await.expect("revision");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let mut watchers = Vec::new();
    for _ in 0..FANOUT {
        let mut w = store.watch("/core/configmaps/", head).await.expect("watch");
        let tx = tx.clone();
        watchers.push(tokio::spawn(async move {
            let mut n = 0;
            while let Some(Ok(_)) = w.next().await {
                if tx.send((n, Instant::now())).is_err() {
                    return;
                }
                n += 1;
            }
        }));
    }
    for i in 0..20 {
        let t = Instant::now();
        store
            .create(
                &format!("/core/configmaps/fan/c{i}"),
                json!({"metadata": {"name": "c"}}),
            )
            .await
            .expect("create");
        let mut last = t;
        for _ in 0..FANOUT {
            let (n, at) = rx.recv().await.expect("watchers run");
            assert_eq!(n, i, "every watcher has every event once");
            last = last.max(at);
        }
        lat.push(last - t);
    }
    for w in watchers {
        w.abort();
    }
    let (p50, p99) = quantiles(std::mem::take(&mut lat));
    f.push(&format!("write→{FANOUT} watchers p50 ms"), p50);
    f.push(&format!("write→{FANOUT} watchers p99 ms"), p99);

    // 16 concurrent writers.
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..ops / 16 {
                store
                    .create(
                        &format!("/core/secrets/bench/w{w}-{i}"),
                        json!({"metadata": {"name": "x"}}),
                    )
                    .await
                    .expect("create");
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    f.push(
        "16 writers, creates/s",
        (ops / 16 * 16) as f64 / t.elapsed().as_secs_f64(),
    );
    f
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let ops: usize = std::env::var("SVCNET_BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let Some(bin) = etcd_binary() else {
        eprintln!("backends bench: no etcd binary on PATH (apt-get install etcd-server)");
        std::process::exit(1);
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let redb =
        RedbStore::open(dir.path().join("bench.redb"), StoreOptions::default()).expect("redb");
    let redb = measure(Arc::new(redb), ops).await;
    let mut runs = Vec::new();
    for cache in [true, false] {
        let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
        let etcd = EtcdStore::connect(EtcdOptions {
            endpoints: cluster.endpoints(),
            watch_cache: WatchCacheOptions {
                enabled: cache,
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .expect("connect");
        runs.push(measure(Arc::new(etcd), ops).await);
    }
    println!("{ops} operations per figure; etcd 3.4.23, one member on loopback");
    println!(
        "{:<28} {:>10} {:>10} {:>9} {:>14}",
        "", "redb", "etcd", "etcd/redb", "etcd no cache"
    );
    for (((name, r), (_, e)), (_, d)) in redb.rows.iter().zip(&runs[0].rows).zip(&runs[1].rows) {
        println!("{name:<28} {r:>10.2} {e:>10.2} {:>9.2} {d:>14.2}", e / r);
    }
}
