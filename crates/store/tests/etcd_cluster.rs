//! EtcdStore beyond the shared conformance suite: what lands in etcd (kube-apiserver's keys and
//! values), the compactor coordinated through `compact_rev_key` between two stores, and a
//! 3-member cluster losing a member (the leader included) under a concurrent write load.
//! Skipped with a printed reason when the `etcd` binary is missing (a failure under
//! `SVCNET_REQUIRE_ETCD=1`).
#![allow(clippy::unwrap_used)] // test: a failure here is a test failure

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use support::rv;
use svcnet_store::local_etcd::{LocalEtcd, LocalTls, etcd_for_test};
use svcnet_store::{COMPACT_REV_KEY, EtcdOptions, EtcdStore, EtcdTls, Store, StoreError};

async fn connect(endpoints: Vec<String>) -> EtcdStore {
    EtcdStore::connect(EtcdOptions {
        endpoints,
        request_timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .await
    .expect("connecting to etcd")
}

fn service(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "uid": "u-1"},
        "spec": {"ports": [{"port": 80}]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_are_kube_apiserver_keys_and_json() {
    let Some(bin) = etcd_for_test("values_are_kube_apiserver_keys_and_json") else {
        return;
    };
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let store = connect(cluster.endpoints()).await;
    let written = store
        .create("/core/services/default/web", service("web"))
        .await
        .unwrap();
    store
        .create(
            "/core/nodes//n1",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        )
        .await
        .unwrap();

    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let resp = raw
        .get("/registry/services/specs/default/web", None)
        .await
        .unwrap();
    let kv = &resp.kvs()[0];
    let value: Value = serde_json::from_slice(kv.value()).unwrap();
    assert_eq!(value["apiVersion"], "v1");
    assert_eq!(value["kind"], "Service");
    assert_eq!(
        value["metadata"].get("resourceVersion"),
        None,
        "the resourceVersion is never stored"
    );
    assert_eq!(
        kv.mod_revision() as u64,
        rv(&written),
        "resourceVersion = mod_revision"
    );
    let node = raw.get("/registry/minions/n1", None).await.unwrap();
    assert_eq!(
        node.kvs().len(),
        1,
        "cluster-scoped keys have no empty segment"
    );

    // A write by someone else (etcdctl, another API server) reads back with its revision.
    let mut other = value.clone();
    other["spec"]["ports"][0]["port"] = json!(8080);
    let put = raw
        .put(
            "/registry/services/specs/default/web",
            serde_json::to_vec(&other).unwrap(),
            None,
        )
        .await
        .unwrap();
    let got = store
        .get("/core/services/default/web")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got["spec"]["ports"][0]["port"], 8080);
    assert_eq!(rv(&got) as i64, put.header().unwrap().revision());

    // The database size (apiserver_storage_size_bytes) is etcd's.
    let status = raw.status().await.unwrap();
    assert!(store.size_bytes().is_some_and(|b| b > 0));
    assert!(status.db_size() > 0);

    // A value that is not JSON (kube-apiserver's default protobuf) is a clear error.
    raw.put(
        "/registry/services/specs/default/pb",
        b"k8s\0\x0a".to_vec(),
        None,
    )
    .await
    .unwrap();
    let err = store.get("/core/services/default/pb").await.unwrap_err();
    assert!(err.to_string().contains("not JSON"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_compactors_coordinate_through_compact_rev_key() {
    let Some(bin) = etcd_for_test("two_compactors_coordinate_through_compact_rev_key") else {
        return;
    };
    let cluster = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let a = connect(cluster.endpoints()).await;
    let b = connect(cluster.endpoints()).await;
    let first = a
        .create("/core/configmaps/ns/first", json!({"metadata": {}}))
        .await
        .unwrap();
    let stop = tokio_util_stop();
    let interval = Duration::from_millis(300);
    let ta = tokio::spawn(a.clone().run_compactor(interval, stop.wait()));
    let tb = tokio::spawn(b.clone().run_compactor(interval, stop.wait()));
    // Writes go on while the compactors run.
    for n in 0..20 {
        a.create(
            &format!("/core/configmaps/ns/c{n}"),
            json!({"metadata": {}}),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.fire();
    ta.await.unwrap();
    tb.await.unwrap();

    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let key = raw.get(COMPACT_REV_KEY, None).await.unwrap();
    let kv = &key.kvs()[0];
    let compacted: u64 = std::str::from_utf8(kv.value()).unwrap().parse().unwrap();
    // About 2 s at 300 ms: ~6 rounds. With one clock, the two stores took turns: the key's
    // version counts successful rounds, not attempts (2 × rounds).
    let rounds = kv.version();
    assert!(
        (3..=8).contains(&rounds),
        "compaction rounds (key version): {rounds}"
    );
    assert!(compacted > rv(&first), "compacted to {compacted}");
    match a.watch("/core/configmaps/", rv(&first)).await {
        Err(StoreError::Gone { compacted: c, .. }) => {
            assert!(c >= rv(&first), "reported compacted {c}");
        }
        Err(e) => panic!("expected Gone, got {e}"),
        Ok(_) => panic!("expected Gone, got a watch"),
    }
    eprintln!("{rounds} coordinated rounds, compacted to {compacted}");
}

/// A one-shot stop signal for several tasks.
struct Stop(tokio::sync::watch::Sender<bool>);

fn tokio_util_stop() -> Stop {
    Stop(tokio::sync::watch::channel(false).0)
}

impl Stop {
    fn wait(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    }
    fn fire(&self) {
        let _ = self.0.send(true);
    }
}

/// Writers create keys through a client on all three members while the leader, then a
/// follower, are SIGKILLed and restarted; a watch runs throughout. No acknowledged write may
/// be lost, the watch sees every one of them in order without a duplicate, and after each kill
/// no stretch without an acknowledged write lasts [`RESUME_BOUND`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_lose_the_leader_under_load() {
    const RESUME_BOUND: Duration = Duration::from_secs(5);
    let Some(bin) = etcd_for_test("three_members_lose_the_leader_under_load") else {
        return;
    };
    let mut cluster = LocalEtcd::start(&bin, 3).await.expect("3-member etcd");
    let store = connect(cluster.endpoints()).await;
    let base = store.current_revision().await.unwrap();
    let mut watch = store.watch("/core/configmaps/", base).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (store, stop, log) = (store.clone(), stop.clone(), log.clone());
        writers.push(tokio::spawn(async move {
            let mut acked = BTreeMap::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("/core/configmaps/w{w}/k{n}");
                let o = json!({"metadata": {"name": format!("k{n}")}, "data": {"n": n}});
                // A create whose answer was lost may have committed: the retry then finds it.
                let result = match store.create(&key, o).await {
                    Ok(v) => Some(v),
                    Err(e) if e.is_already_exists() => store.get(&key).await.ok().flatten(),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                if let Some(v) = result {
                    acked.insert(key, rv(&v));
                    if let Ok(mut l) = log.lock() {
                        l.push(Instant::now());
                    }
                    n += 1;
                }
            }
            acked
        }));
    }

    let mut gaps = Vec::new();
    for round in ["leader", "follower"] {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let leader = cluster.leader().await.expect("a leader");
        let victim = if round == "leader" {
            leader
        } else {
            (leader + 1) % 3
        };
        let killed_at = Instant::now();
        cluster.kill(victim);
        // The longest stretch without an acknowledged write after the kill (a write that was
        // in flight may still be answered at once; what counts is the stall after it).
        let window = RESUME_BOUND + Duration::from_secs(1);
        tokio::time::sleep(window).await;
        let mut times: Vec<Instant> = log
            .lock()
            .map(|l| {
                l.iter()
                    .copied()
                    .filter(|t| *t >= killed_at && *t <= killed_at + window)
                    .collect()
            })
            .unwrap_or_default();
        times.sort_unstable();
        times.push(killed_at + window);
        let mut prev = killed_at;
        let mut gap = Duration::ZERO;
        for t in times {
            gap = gap.max(t - prev);
            prev = t;
        }
        gaps.push((round, gap));
        cluster.restart(victim).await.expect("restart member");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = BTreeMap::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }

    for (key, revision) in &acked {
        let got = store
            .get(key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged write {key} at {revision} lost"));
        assert_eq!(rv(&got), *revision, "{key}");
    }
    let mut expected: Vec<u64> = acked.values().copied().collect();
    expected.sort_unstable();
    let mut seen = Vec::new();
    while seen.len() < expected.len() {
        let e = tokio::time::timeout(Duration::from_secs(20), watch.next())
            .await
            .expect("watch event")
            .expect("watch open")
            .expect("event");
        if let Some(&last) = seen.last() {
            assert!(
                e.revision > last,
                "watch out of order: {} after {last}",
                e.revision
            );
        }
        seen.push(e.revision);
    }
    assert_eq!(
        seen, expected,
        "the watch saw every acknowledged write once"
    );
    for (round, gap) in &gaps {
        eprintln!("writes stalled at most {gap:?} after SIGKILL of the {round}");
        assert!(
            *gap < RESUME_BOUND,
            "writes resumed only {gap:?} after killing the {round}"
        );
    }
    eprintln!("{} acknowledged writes, none lost", acked.len());
}

/// A CA, a serving certificate for 127.0.0.1 and a client certificate, written to `dir`.
fn certificates(dir: &std::path::Path) -> LocalTls {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let write = |name: &str, pem: String| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.clone().self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans).unwrap();
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server, server_key) = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client, client_key) = leaf(vec!["svcnet".into()], ExtendedKeyUsagePurpose::ClientAuth);
    LocalTls {
        ca_file: write("ca.crt", ca_cert.pem()),
        cert_file: write("server.crt", server),
        key_file: write("server.key", server_key),
        client_cert_file: write("client.crt", client),
        client_key_file: write("client.key", client_key),
    }
}

/// kube-apiserver's `--etcd-cafile/--etcd-certfile/--etcd-keyfile` against a member that
/// requires client certificates: with them the store works, without a client certificate or
/// trusting another CA it fails with an error instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    let Some(bin) = etcd_for_test("tls_with_client_certificates") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tls = certificates(dir.path());
    let cluster = LocalEtcd::start_with(&bin, 1, Some(tls.clone()))
        .await
        .expect("etcd with TLS");
    assert!(cluster.endpoint(0).starts_with("https://"));
    let options = |tls: Option<EtcdTls>| EtcdOptions {
        endpoints: cluster.endpoints(),
        tls,
        request_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let store = EtcdStore::connect(options(Some(EtcdTls {
        ca_file: Some(tls.ca_file.clone()),
        cert_file: Some(tls.client_cert_file.clone()),
        key_file: Some(tls.client_key_file.clone()),
    })))
    .await
    .expect("connecting with the client certificate");
    let o = store
        .create("/core/services/default/tls", service("tls"))
        .await
        .unwrap();
    assert_eq!(
        store.get("/core/services/default/tls").await.unwrap(),
        Some(o)
    );

    let without_cert = EtcdStore::connect(options(Some(EtcdTls {
        ca_file: Some(tls.ca_file.clone()),
        ..Default::default()
    })))
    .await;
    assert!(
        without_cert.is_err(),
        "a client without a certificate got in"
    );
    let other_dir = tempfile::tempdir().unwrap();
    let other = certificates(other_dir.path());
    let wrong_ca = EtcdStore::connect(options(Some(EtcdTls {
        ca_file: Some(other.ca_file.clone()),
        cert_file: Some(tls.client_cert_file.clone()),
        key_file: Some(tls.client_key_file.clone()),
    })))
    .await;
    let err = wrong_ca.expect_err("a member with an untrusted certificate was accepted");
    eprintln!("untrusted member: {err}");
}
