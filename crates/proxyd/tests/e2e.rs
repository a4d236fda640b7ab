//! End to end: svcnet's real API server, the proxy runtime programming a test namespace, and
//! real traffic. A Service and an EndpointSlice created through kube-rs make rules appear and
//! traffic flow; changing the endpoints moves the traffic.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use svcnet_netns::test_support::{Lab, tcp_ask};
use svcnet_proxy::fixtures::{service, slice};

async fn client(kubeconfig: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// Polls until a connection from pod 0 to `addr` is answered by `want`.
async fn wait_for_backend(lab: &Lab, addr: SocketAddr, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_slices_through_the_api_become_rules_and_traffic() {
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
    for _ in 0..3 {
        lab.add_pod().unwrap();
    }
    lab.serve_tcp(1, 8080, "b1").unwrap();
    lab.serve_tcp(2, 8080, "b2").unwrap();

    let proxy = svcnet_proxyd::start(
        svcnet_proxyd::ProxyConfig {
            node_name: "n1".into(),
            netns: Some(lab.node.name().to_string()),
            min_sync_period: Duration::from_millis(100),
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            healthz_bind: Some("127.0.0.1:0".parse().unwrap()),
            metrics_bind: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        },
        client.clone(),
    )
    .await
    .unwrap();

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = service("default", "web", |s| {
        s.cluster_ip(&["10.96.0.50"]).port("http", "TCP", 80);
    });
    services.create(&PostParams::default(), &svc).await.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let (b1, b2) = (lab.pod(1).ipv4.to_string(), lab.pod(2).ipv4.to_string());
    let s1 = slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080).endpoint(&b1, "n1", |_| {});
    });
    slices.create(&PostParams::default(), &s1).await.unwrap();
    let vip: SocketAddr = "10.96.0.50:80".parse().unwrap();
    wait_for_backend(&lab, vip, "b1").await;
    let rules = lab
        .node
        .exec(&["nft", "list", "table", "ip", "svcnet"])
        .unwrap();
    assert!(
        rules.contains("10.96.0.50 . tcp . 80 : goto service-"),
        "{rules}"
    );

    // The endpoints change: traffic follows (a partial sync).
    let s2 = slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080).endpoint(&b2, "n1", |_| {});
    });
    let patch = serde_json::json!({ "endpoints": s2.endpoints });
    slices
        .patch("web-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for_backend(&lab, vip, "b2").await;
    for _ in 0..10 {
        let r = lab
            .pod(0)
            .ns
            .run(|| tcp_ask(vip, Duration::from_secs(1)))
            .unwrap()
            .unwrap();
        assert_eq!(r.identity, "b2");
    }

    // Deleting the service: connections are dropped (an unallocated service-CIDR address).
    services.delete("web", &Default::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lab
        .node
        .exec(&["nft", "list", "table", "ip", "svcnet"])
        .unwrap()
        .contains("10.96.0.50")
    {
        assert!(
            Instant::now() < deadline,
            "rules of the deleted service remain"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let stats = proxy.stats().borrow().clone();
    assert!(stats.syncs >= 3 && stats.failures == 0, "{stats:?}");
    assert!(
        stats.syncs > stats.full_syncs,
        "later syncs must be partial: {stats:?}"
    );
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

    proxy.shutdown().await;
    // --cleanup removes the tables.
    assert_eq!(
        svcnet_proxyd::cleanup(Some(lab.node.name()), "svcnet").unwrap(),
        2
    );
    server.shutdown().await.unwrap();
}
