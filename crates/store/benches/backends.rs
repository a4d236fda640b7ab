//! The two store back ends side by side: the same operations through the `Store` trait on
//! `RedbStore` (a file in a temp dir, fsync per commit) and on `EtcdStore` (Debian's etcd, one
//! member on loopback, a fresh data dir), with etcd's figures as a ratio of redb's.
//!
//! `cargo bench -p svcnet-store --bench backends` (`SVCNET_BENCH_OPS`, default 500, sets the
//! operations per measurement). Needs the `etcd` binary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use svcnet_store::local_etcd::{LocalEtcd, etcd_binary};
use svcnet_store::{EtcdOptions, EtcdStore, Mutation, RedbStore, Store, StoreOptions};

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
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let etcd = EtcdStore::connect(EtcdOptions {
        endpoints: cluster.endpoints(),
        ..Default::default()
    })
    .await
    .expect("connect");
    let etcd = measure(Arc::new(etcd), ops).await;
    println!("{ops} operations per figure; etcd 3.4.23, one member on loopback");
    println!(
        "{:<28} {:>10} {:>10} {:>8}",
        "", "redb", "etcd", "etcd/redb"
    );
    for ((name, r), (_, e)) in redb.rows.iter().zip(&etcd.rows) {
        println!("{name:<28} {r:>10.2} {e:>10.2} {:>8.2}", e / r);
    }
}
