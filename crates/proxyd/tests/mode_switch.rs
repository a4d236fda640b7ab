//! Switching `--proxy-mode` on a running node, under traffic, against the real kernel (root):
//! svcnet's real API server, a backend pod, and a client pod that opens new connections to
//! the service without pause, plus one connection held open across the switch. The proxy of
//! the old mode is replaced by one of the new mode (a restart; from the userspace mode the new
//! proxy starts before the old one stops, since the old one holds the relayed connections):
//! every new connection succeeds, the long-lived one still answers, and only the new mode's
//! rules are left.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::PostParams;
use svcnet_netns::test_support::{Lab, Session, tcp_ask};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxyd::{ProxyConfig, ProxyMode, RunningProxy};

const VIP: &str = "10.96.0.50:80";

struct Env {
    _dir: tempfile::TempDir,
    server: svcnet_apiserver::RunningServer,
    client: kube::Client,
    lab: Lab,
}

async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let server = svcnet_apiserver::start(svcnet_apiserver::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    })
    .await
    .unwrap();
    let kc = kube::config::Kubeconfig::read_from(server.kubeconfig_path()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let mut lab = Lab::new().expect("needs root");
    lab.add_pod().unwrap();
    lab.add_pod().unwrap();
    lab.serve_tcp(1, 8080, "b1").unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = service("default", "web", |s| {
        s.cluster_ip(&["10.96.0.50"]).port("http", "TCP", 80);
    });
    services.create(&PostParams::default(), &svc).await.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let ip = lab.pod(1).ipv4.to_string();
    let s1 = slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080).endpoint(&ip, "n1", |_| {});
    });
    slices.create(&PostParams::default(), &s1).await.unwrap();
    Env {
        _dir: dir,
        server,
        client,
        lab,
    }
}

async fn start(e: &Env, mode: ProxyMode) -> RunningProxy {
    svcnet_proxyd::start(
        ProxyConfig {
            node_name: "n1".into(),
            mode,
            netns: Some(e.lab.node.name().to_string()),
            min_sync_period: svcnet_proxyd::MinSyncPeriod::Fixed(Duration::from_millis(50)),
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            ..Default::default()
        },
        e.client.clone(),
    )
    .await
    .unwrap()
}

/// Waits until the proxy has synced and removed the other modes' rules (generously: the
/// iptables tools wait for the host-wide xtables lock, which other tests may hold).
async fn wait_retired(p: &RunningProxy) {
    let mut stats = p.stats();
    tokio::time::timeout(Duration::from_secs(60), stats.wait_for(|s| s.retired))
        .await
        .expect("the new mode never finished its first sync")
        .unwrap();
}

/// Polls until a connection from pod 0 reaches the backend.
async fn wait_for_backend(lab: &Lab) {
    let vip: SocketAddr = VIP.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = lab
            .pod(0)
            .ns
            .run(|| tcp_ask(vip, Duration::from_millis(300)))
            .unwrap();
        if matches!(&got, Ok(r) if r.identity == "b1") {
            return;
        }
        assert!(Instant::now() < deadline, "never reached b1: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// New connections from pod 0 to the service, one after another, until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(lab: &Lab) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let vip: SocketAddr = VIP.parse().unwrap();
        let (s, o, f) = (stop.clone(), ok.clone(), failures.clone());
        let started = Instant::now();
        let thread = lab
            .pod(0)
            .ns
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    match tcp_ask(vip, Duration::from_secs(2)) {
                        Ok(r) if r.identity == "b1" => {
                            o.fetch_add(1, Ordering::Relaxed);
                        }
                        other => f
                            .lock()
                            .unwrap()
                            .push(format!("at {:?}: {other:?}", started.elapsed())),
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
            .unwrap();
        Self {
            stop,
            ok,
            failures,
            thread: Some(thread),
        }
    }

    /// Stops the loop; returns (successful connections, failures).
    fn finish(mut self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let failures = std::mem::take(&mut *self.failures.lock().unwrap());
        (self.ok.load(Ordering::Relaxed), failures)
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn nft_table(lab: &Lab, table: &str) -> bool {
    lab.node
        .exec(&["nft", "list", "table", "ip", table])
        .is_ok()
}

fn iptables_chains(lab: &Lab) -> bool {
    ["iptables-nft-save", "iptables-legacy-save"]
        .iter()
        .any(|p| lab.node.exec(&[p]).unwrap_or_default().contains("SVCNET-"))
}

fn has_rules(lab: &Lab, mode: ProxyMode) -> bool {
    match mode {
        ProxyMode::Nftables => nft_table(lab, "svcnet"),
        ProxyMode::Iptables => iptables_chains(lab),
        ProxyMode::Userspace => nft_table(lab, svcnet_userspace::rules::TABLE),
        ProxyMode::Ipvs => lab
            .node
            .exec(&["ip", "link", "show", svcnet_ipvs::render::DUMMY])
            .is_ok(),
    }
}

async fn switch(from: ProxyMode, to: ProxyMode) {
    let e = env().await;
    let old = start(&e, from).await;
    wait_for_backend(&e.lab).await;
    assert!(has_rules(&e.lab, from));
    let vip: SocketAddr = VIP.parse().unwrap();
    let mut held = e
        .lab
        .pod(0)
        .ns
        .run(|| Session::connect(vip, Duration::from_secs(2)))
        .unwrap()
        .unwrap();
    assert_eq!(held.ask().unwrap().identity, "b1");

    let traffic = Traffic::start(&e.lab);
    let mut drained = None;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new = if from == ProxyMode::Userspace {
        // The old proxy relays the established connections itself: the new one starts first,
        // and the old one stops once the new rules are in.
        let new = start(&e, to).await;
        wait_retired(&new).await;
        // It drains: the held connection is still relayed after the old proxy stopped
        // accepting, and the old proxy ends once that connection closes.
        let stopping = tokio::spawn(old.shutdown());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!stopping.is_finished(), "the old proxy must drain, not cut");
        assert_eq!(held.ask().unwrap().identity, "b1");
        drained = Some(stopping);
        new
    } else {
        // A restart: the old kernel rules keep serving while no proxy runs.
        old.shutdown().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let new = start(&e, to).await;
        wait_retired(&new).await;
        new
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ok, failures) = traffic.finish();
    assert!(
        failures.is_empty(),
        "{from:?} -> {to:?}: {} of {} new connections failed: {failures:#?}",
        failures.len(),
        ok + failures.len()
    );
    assert!(ok > 20, "too few connections to mean anything: {ok}");
    assert_eq!(
        held.ask()
            .map(|r| r.identity)
            .unwrap_or_else(|e| format!("{e}")),
        "b1",
        "{from:?} -> {to:?}: the long-lived connection broke"
    );
    if let Some(stopping) = drained {
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), stopping)
            .await
            .expect("the old userspace proxy ends once its connections closed")
            .unwrap();
    }
    assert!(has_rules(&e.lab, to), "{to:?}'s rules are missing");
    assert!(!has_rules(&e.lab, from), "{from:?}'s rules are left");
    new.shutdown().await;
    svcnet_proxyd::cleanup(Some(e.lab.node.name()), "svcnet").unwrap();
    e.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nftables_to_iptables_under_traffic() {
    switch(ProxyMode::Nftables, ProxyMode::Iptables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iptables_to_nftables_under_traffic() {
    switch(ProxyMode::Iptables, ProxyMode::Nftables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nftables_to_userspace_under_traffic() {
    switch(ProxyMode::Nftables, ProxyMode::Userspace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userspace_to_nftables_under_traffic() {
    switch(ProxyMode::Userspace, ProxyMode::Nftables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iptables_to_userspace_under_traffic() {
    switch(ProxyMode::Iptables, ProxyMode::Userspace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userspace_to_iptables_under_traffic() {
    switch(ProxyMode::Userspace, ProxyMode::Iptables).await;
}
