//! End to end: svcnet's real API server, the proxy runtime programming a test namespace, and
//! real traffic, in each of the four modes (nftables, iptables, userspace; ipvs in the
//! kernel-matrix tier). A Service and an
//! EndpointSlice created through kube-rs make rules appear and traffic flow; changing the
//! endpoints moves the traffic; deleting the service removes its rules. Switching modes
//! removes the previous mode's rules once the new mode's are in (`mode_switch.rs` does it under
//! traffic); an algorithm nftables cannot express is reported as a
//! Warning Event read back from the API server. Needs root (CI runs as root).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use svcnet_netns::test_support::{Lab, tcp_ask};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxyd::{ProxyConfig, ProxyMode, RunningProxy};

async fn client(kubeconfig: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// Polls until a connection from pod 0 to `addr` is answered by `want`.
async fn wait_for_backend(lab: &Lab, addr: SocketAddr, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = lab
            .pod(0)
            .ns
            .run(|| tcp_ask(addr, Duration::from_millis(300)))
            .unwrap();
        if matches!(&got, Ok(r) if r.identity == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "traffic to {addr} never reached {want}; last: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The node namespace's nft ruleset (every table) as text.
fn nft_ruleset(lab: &Lab) -> String {
    lab.node.exec(&["nft", "list", "ruleset"]).unwrap()
}

/// The node namespace's iptables rules on both back ends and both families.
fn iptables_rules(lab: &Lab) -> String {
    [
        "iptables-nft-save",
        "iptables-legacy-save",
        "ip6tables-nft-save",
        "ip6tables-legacy-save",
    ]
    .iter()
    .map(|p| lab.node.exec(&[p]).unwrap_or_default())
    .collect()
}

/// The rules of `mode` in the node namespace, as text.
fn mode_rules(lab: &Lab, mode: ProxyMode) -> String {
    match mode {
        ProxyMode::Nftables => lab
            .node
            .exec(&["nft", "list", "table", "ip", "svcnet"])
            .unwrap_or_default(),
        ProxyMode::Iptables => iptables_rules(lab),
        ProxyMode::Userspace => lab
            .node
            .exec(&["nft", "list", "table", "ip", "svcnet-userspace"])
            .unwrap_or_default(),
        ProxyMode::Ipvs => lab.node.exec(&["ipvsadm", "-Ln"]).unwrap_or_default(),
    }
}

/// How each mode's rules name the service address 10.96.0.50:80.
fn names_vip(mode: ProxyMode, rules: &str) -> bool {
    match mode {
        // The v2 table: the frontend in its group set, named by its comment.
        ProxyMode::Nftables => {
            rules.contains("10.96.0.50 . tcp . 80 comment \"cluster IP of default/web/")
        }
        ProxyMode::Iptables => rules.contains("-d 10.96.0.50/32"),
        ProxyMode::Userspace | ProxyMode::Ipvs => rules.contains("10.96.0.50"),
    }
}

struct Env {
    _dir: tempfile::TempDir,
    server: svcnet_apiserver::RunningServer,
    client: kube::Client,
    lab: Lab,
}

async fn env(pods: usize) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let server = svcnet_apiserver::start(svcnet_apiserver::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = client(server.kubeconfig_path()).await;
    let mut lab = Lab::new().expect("needs root");
    for _ in 0..pods {
        lab.add_pod().unwrap();
    }
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
            min_sync_period: svcnet_proxyd::MinSyncPeriod::Fixed(Duration::from_millis(100)),
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            healthz_bind: Some("127.0.0.1:0".parse().unwrap()),
            metrics_bind: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        },
        e.client.clone(),
    )
    .await
    .unwrap()
}

/// Waits until the proxy's first sync is done and the other modes' rules are removed.
async fn wait_retired(p: &RunningProxy) {
    let mut stats = p.stats();
    tokio::time::timeout(Duration::from_secs(60), stats.wait_for(|s| s.retired))
        .await
        .expect("the other modes' rules were never removed")
        .unwrap();
}

/// Creates service `web` (10.96.0.50:80) with pod `backend`'s port 8080 as its endpoint.
async fn create_web(e: &Env, backend: usize) {
    let services: Api<Service> = Api::namespaced(e.client.clone(), "default");
    let svc = service("default", "web", |s| {
        s.cluster_ip(&["10.96.0.50"]).port("http", "TCP", 80);
    });
    services.create(&PostParams::default(), &svc).await.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(e.client.clone(), "default");
    let ip = e.lab.pod(backend).ipv4.to_string();
    let s1 = slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080).endpoint(&ip, "n1", |_| {});
    });
    slices.create(&PostParams::default(), &s1).await.unwrap();
}

const VIP: &str = "10.96.0.50:80";

async fn services_and_slices_become_rules_and_traffic(mode: ProxyMode) {
    let mut e = env(3).await;
    e.lab.serve_tcp(1, 8080, "b1").unwrap();
    e.lab.serve_tcp(2, 8080, "b2").unwrap();
    let proxy = start(&e, mode).await;
    // The first full sync has its own bound: inside user-mode Linux (IPVS) it takes 10-20 s
    // (every syscall ~40x dearer; iptables-legacy and ip6tables for the companion rules),
    // which must not eat the 20 s that traffic gets to follow a change.
    wait_retired(&proxy).await;
    create_web(&e, 1).await;
    let vip: SocketAddr = VIP.parse().unwrap();
    wait_for_backend(&e.lab, vip, "b1").await;
    let rules = mode_rules(&e.lab, mode);
    assert!(names_vip(mode, &rules), "{mode:?}: {rules}");

    // The endpoints change: traffic follows (a partial sync in the kernel modes).
    let slices: Api<EndpointSlice> = Api::namespaced(e.client.clone(), "default");
    let b2 = e.lab.pod(2).ipv4.to_string();
    let s2 = slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080).endpoint(&b2, "n1", |_| {});
    });
    let patch = serde_json::json!({ "endpoints": s2.endpoints });
    slices
        .patch("web-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for_backend(&e.lab, vip, "b2").await;
    for _ in 0..10 {
        let r = e
            .lab
            .pod(0)
            .ns
            .run(|| tcp_ask(vip, Duration::from_secs(2)))
            .unwrap()
            .unwrap();
        assert_eq!(r.identity, "b2", "{mode:?}");
    }

    let healthz = proxy.healthz_addr().unwrap();
    let metrics = proxy.metrics_addr().unwrap();
    let (h, m) = tokio::task::spawn_blocking(move || {
        (http_get(healthz, "/healthz"), http_get(metrics, "/metrics"))
    })
    .await
    .unwrap();
    assert!(h.starts_with("HTTP/1.1 200"), "{h}");
    assert!(h.contains("\"nodeEligible\":true"), "{h}");
    assert!(
        m.contains("kubeproxy_sync_proxy_rules_duration_seconds_count"),
        "{m}"
    );
    if mode == ProxyMode::Userspace {
        // Per service and endpoint counters of the relayed connections.
        let total = m
            .lines()
            .find(|l| {
                l.starts_with("kubeproxy_userspace_service_connections_total{")
                    && l.contains("service=\"default/web/tcp/http\"")
            })
            .unwrap_or_else(|| panic!("no userspace service counter in\n{m}"));
        let n: u64 = total.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 11, "{total}");
        let ep = format!("endpoint=\"{b2}:8080\"");
        assert!(
            m.lines().any(
                |l| l.starts_with("kubeproxy_userspace_endpoint_connections_total{")
                    && l.contains(&ep)
            ),
            "{m}"
        );
        assert!(
            m.contains("# TYPE kubeproxy_userspace_service_connections_active gauge"),
            "{m}"
        );
    }

    // Deleting the service removes its rules.
    let services: Api<Service> = Api::namespaced(e.client.clone(), "default");
    services.delete("web", &Default::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while names_vip(mode, &mode_rules(&e.lab, mode)) {
        assert!(
            Instant::now() < deadline,
            "{mode:?}: rules of the deleted service remain"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let stats = proxy.stats().borrow().clone();
    assert!(stats.syncs >= 3 && stats.failures == 0, "{stats:?}");
    if mode != ProxyMode::Userspace {
        assert!(
            stats.syncs > stats.full_syncs,
            "later syncs must be partial: {stats:?}"
        );
    }
    proxy.shutdown().await;
    if mode == ProxyMode::Ipvs {
        // In user-mode Linux, whose kernel has no nf_tables for ip: the IPVS mode's cleanup
        // (the whole --cleanup would fail on the nftables mode's part there).
        let ns = e.lab.node.name().to_string();
        svcnet_ipvs::cleanup(Some(&ns), None).unwrap();
        assert!(!iptables_rules(&e.lab).contains("SVCIPVS-"));
        assert!(
            e.lab
                .node
                .exec(&["ip", "link", "show", "svcnet-ipvs0"])
                .is_err()
        );
        assert_eq!(e.lab.node.exec(&["ipvsadm", "-Sn"]).unwrap(), "");
        e.server.shutdown().await.unwrap();
        return;
    }
    // --cleanup removes every mode's rules.
    let cleaned = svcnet_proxyd::cleanup(Some(e.lab.node.name()), "svcnet").unwrap();
    if mode == ProxyMode::Nftables {
        assert_eq!(cleaned.nft_tables, 2);
    }
    let rest = nft_ruleset(&e.lab);
    assert!(
        !rest.contains("table ip svcnet") && !rest.contains("svcnet-userspace"),
        "{rest}"
    );
    assert!(!iptables_rules(&e.lab).contains("SVCNET-"));
    e.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nftables_services_and_slices_become_rules_and_traffic() {
    services_and_slices_become_rules_and_traffic(ProxyMode::Nftables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iptables_services_and_slices_become_rules_and_traffic() {
    services_and_slices_become_rules_and_traffic(ProxyMode::Iptables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userspace_services_and_slices_become_rules_and_traffic() {
    services_and_slices_become_rules_and_traffic(ProxyMode::Userspace).await;
}

/// The IPVS mode, in the kernel-matrix tier only (user-mode Linux, through
/// `scripts/uml/cargo-runner` with the filter `ipvs_`; skipped on the host, whose kernel has
/// no IPVS): the same service lifecycle through the syncer, the API server and real traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_services_and_slices_become_rules_and_traffic() {
    if !svcnet_netns::test_support::uml_guest() {
        return;
    }
    services_and_slices_become_rules_and_traffic(ProxyMode::Ipvs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_modes_removes_the_previous_modes_rules() {
    let mut e = env(2).await;
    e.lab.serve_tcp(1, 8080, "b1").unwrap();
    create_web(&e, 1).await;
    let vip: SocketAddr = VIP.parse().unwrap();

    let nft = start(&e, ProxyMode::Nftables).await;
    wait_for_backend(&e.lab, vip, "b1").await;
    nft.shutdown().await;
    assert!(nft_ruleset(&e.lab).contains("table ip svcnet {"));

    let ipt = start(&e, ProxyMode::Iptables).await;
    wait_for_backend(&e.lab, vip, "b1").await;
    wait_retired(&ipt).await;
    let ruleset = nft_ruleset(&e.lab);
    assert!(
        !ruleset.contains("table ip svcnet {") && !ruleset.contains("table ip6 svcnet {"),
        "the nftables mode's tables must be gone:\n{ruleset}"
    );
    assert!(iptables_rules(&e.lab).contains("SVCNET-SERVICES"));
    ipt.shutdown().await;

    let us = start(&e, ProxyMode::Userspace).await;
    wait_for_backend(&e.lab, vip, "b1").await;
    wait_retired(&us).await;
    let rules = iptables_rules(&e.lab);
    assert!(
        !rules.contains("SVCNET-"),
        "the iptables mode's chains must be gone:\n{rules}"
    );
    assert!(nft_ruleset(&e.lab).contains("svcnet-userspace"));
    us.shutdown().await;
    // The userspace proxy removes its redirects when it stops (they would lead nowhere).
    assert!(!nft_ruleset(&e.lab).contains("svcnet-userspace"));

    // And back to nftables: nothing of the others is left, traffic flows.
    let nft = start(&e, ProxyMode::Nftables).await;
    wait_for_backend(&e.lab, vip, "b1").await;
    wait_retired(&nft).await;
    assert!(!iptables_rules(&e.lab).contains("SVCNET-"));
    nft.shutdown().await;
    svcnet_proxyd::cleanup(Some(e.lab.node.name()), "svcnet").unwrap();
    e.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_algorithm_nftables_cannot_express_is_a_warning_event() {
    let mut e = env(2).await;
    e.lab.serve_tcp(1, 8080, "b1").unwrap();
    let proxy = start(&e, ProxyMode::Nftables).await;
    let services: Api<Service> = Api::namespaced(e.client.clone(), "default");
    let mut svc = service("default", "counted", |s| {
        s.cluster_ip(&["10.96.0.60"]).port("http", "TCP", 80);
    });
    svc.metadata.annotations = Some(
        [(svcnet_lb::ANNOTATION.to_string(), "lc".to_string())]
            .into_iter()
            .collect(),
    );
    services.create(&PostParams::default(), &svc).await.unwrap();
    let mut typo = service("default", "typo", |s| {
        s.cluster_ip(&["10.96.0.61"]).port("http", "TCP", 80);
    });
    typo.metadata.annotations = Some(
        [(svcnet_lb::ANNOTATION.to_string(), "magelv".to_string())]
            .into_iter()
            .collect(),
    );
    services
        .create(&PostParams::default(), &typo)
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(e.client.clone(), "default");
    let ip = e.lab.pod(1).ipv4.to_string();
    let s1 = slice("default", "counted-1", "counted", |s| {
        s.port("http", "TCP", 8080).endpoint(&ip, "n1", |_| {});
    });
    slices.create(&PostParams::default(), &s1).await.unwrap();
    // The service still works (random), and the fallback is published on it.
    wait_for_backend(&e.lab, "10.96.0.60:80".parse().unwrap(), "b1").await;

    let events: Api<Event> = Api::namespaced(e.client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(15);
    let (fallback, misspelt) = loop {
        let list = events.list(&ListParams::default()).await.unwrap();
        let find = |name: &str| {
            list.items
                .iter()
                .find(|ev| {
                    ev.reason.as_deref() == Some(svcnet_lb::EVENT_REASON)
                        && ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
                .cloned()
        };
        if let (Some(a), Some(b)) = (find("counted"), find("typo")) {
            break (a, b);
        }
        assert!(
            Instant::now() < deadline,
            "no {} events: {:?}",
            svcnet_lb::EVENT_REASON,
            list.items
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(fallback.type_.as_deref(), Some("Warning"));
    let regarding = fallback.regarding.unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Service"));
    let note = fallback.note.unwrap_or_default();
    assert!(
        note.contains(
            "load-balancing algorithm lc (least connections) cannot be expressed by the nftables dataplane"
        ) && note.ends_with("using random instead"),
        "{note}"
    );
    assert_eq!(misspelt.type_.as_deref(), Some("Warning"));
    let note = misspelt.note.unwrap_or_default();
    assert!(
        note.contains("\"magelv\" is not a load-balancing algorithm"),
        "{note}"
    );

    // Once per service and change: more syncs (an endpoint change) add no second event.
    let patch = serde_json::json!({ "metadata": { "labels": { "touched": "yes" } } });
    slices
        .patch("counted-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let list = events.list(&ListParams::default()).await.unwrap();
    let count: i32 = list
        .items
        .iter()
        .filter(|ev| ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("counted"))
        .map(|ev| ev.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert_eq!(count, 1, "{:?}", list.items);
    proxy.shutdown().await;
    svcnet_proxyd::cleanup(Some(e.lab.node.name()), "svcnet").unwrap();
    e.server.shutdown().await.unwrap();
}
