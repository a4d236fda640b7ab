//! End to end: the embedded API server, objects written through kube-rs, and `dig` answers
//! that follow the watch within a bounded time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use svcnet_dns::fixtures::*;
use svcnet_dns::{DnsConfig, ZoneConfig};

/// How long an answer may take to follow a write (generous for a loaded CI machine; the
/// benchmark measures the real figure).
const BOUND: Duration = Duration::from_secs(5);

async fn dig_short(addr: SocketAddr, name: &str, qtype: &str) -> String {
    let out = tokio::process::Command::new("dig")
        .arg(format!("@{}", addr.ip()))
        .args([
            "-p",
            &addr.port().to_string(),
            name,
            qtype,
            "+short",
            "+tries=1",
            "+time=2",
        ])
        .output()
        .await
        .expect("dig");
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines.join(" ")
}

async fn status(addr: SocketAddr, name: &str) -> String {
    let out = tokio::process::Command::new("dig")
        .arg(format!("@{}", addr.ip()))
        .args([
            "-p",
            &addr.port().to_string(),
            name,
            "A",
            "+tries=1",
            "+time=2",
        ])
        .output()
        .await
        .expect("dig");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("?")
        .to_string()
}

/// The embedded API server on a free loopback port over a temporary data dir (kept alive by
/// the returned guard), and a kube-rs client of it.
async fn api_server() -> (
    tempfile::TempDir,
    svcnet_apiserver::RunningServer,
    kube::Client,
) {
    let dir = tempfile::tempdir().unwrap();
    let api = svcnet_apiserver::start(svcnet_apiserver::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    })
    .await
    .unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(api.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    (dir, api, client)
}

/// Poll until `check` holds; returns how long it took.
async fn until<F, Fut>(what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < BOUND, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_follow_the_api_server() {
    let (_dir, api, client) = api_server().await;

    let mut dns_config = DnsConfig::new("127.0.0.1:0".parse().unwrap());
    dns_config.zone = ZoneConfig::new("cluster.local").unwrap();
    dns_config.upstreams = Some(vec![]);
    let dns = svcnet_dns::start(dns_config, client.clone()).await.unwrap();
    tokio::time::timeout(BOUND, dns.wait_synced())
        .await
        .expect("first sync");
    let addr = dns.local_addr();

    // The API server's own service.
    let kubernetes = dig_short(addr, "kubernetes.default.svc.cluster.local", "A").await;
    assert_eq!(kubernetes, "10.96.0.1");

    // A ClusterIP service: the allocated IP appears.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut myapp = (*cluster_ip("default", "myapp", &[], &[("http", "TCP", 80)])).clone();
    if let Some(spec) = myapp.spec.as_mut() {
        spec.cluster_ip = None;
        spec.cluster_ips = None;
    }
    let created = services
        .create(&PostParams::default(), &myapp)
        .await
        .unwrap();
    let ip = created.spec.unwrap().cluster_ip.unwrap();
    let took = until("myapp's A record", || async {
        dig_short(addr, "myapp.default.svc.cluster.local", "A").await == ip
    })
    .await;
    eprintln!("service create → answer: {took:?}");

    // A headless service with StatefulSet-style endpoints written as an EndpointSlice.
    services
        .create(
            &PostParams::default(),
            &headless("default", "nginx", &[("web", "TCP", 80)]),
        )
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice = slice("default", "nginx", "nginx-abc", &[("web", "TCP", 80)])
        .ep("10.244.1.10", Some("web-0"), true)
        .ep("10.244.1.11", Some("web-1"), true)
        .ep("10.244.1.12", Some("web-2"), false);
    slices.create(&PostParams::default(), &slice).await.unwrap();
    until("web-0.nginx", || async {
        dig_short(addr, "web-0.nginx.default.svc.cluster.local", "A").await == "10.244.1.10"
    })
    .await;
    assert_eq!(
        dig_short(addr, "nginx.default.svc.cluster.local", "A").await,
        "10.244.1.10 10.244.1.11"
    );
    assert_eq!(
        status(addr, "web-2.nginx.default.svc.cluster.local").await,
        "NXDOMAIN"
    );

    // publishNotReadyAddresses publishes the unready one too.
    let mut peers =
        (*headless("default", "peers", &[("peer", "TCP", 2380)]).publish_not_ready()).clone();
    peers.metadata.namespace = Some("default".into());
    services
        .create(&PostParams::default(), &peers)
        .await
        .unwrap();
    slices
        .create(
            &PostParams::default(),
            &slice_of("peers", "peers-abc")
                .ep("10.244.2.1", Some("etcd-0"), true)
                .ep("10.244.2.2", Some("etcd-1"), false),
        )
        .await
        .unwrap();
    until("peers with the unready member", || async {
        dig_short(addr, "peers.default.svc.cluster.local", "A").await == "10.244.2.1 10.244.2.2"
    })
    .await;

    // Deleting the service removes its names.
    services
        .delete("myapp", &DeleteParams::default())
        .await
        .unwrap();
    let took = until("myapp NXDOMAIN", || async {
        status(addr, "myapp.default.svc.cluster.local").await == "NXDOMAIN"
    })
    .await;
    eprintln!("service delete → NXDOMAIN: {took:?}");

    dns.shutdown().await.unwrap();
    api.shutdown().await.unwrap();
}

fn slice_of(svc: &str, name: &str) -> std::sync::Arc<EndpointSlice> {
    slice("default", svc, name, &[("peer", "TCP", 2380)])
}

/// CoreDNS's `labels` selector goes to the API server with the watch (an unlabelled service is
/// never read), and `k8s_external` answers what the API server allocated to a LoadBalancer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_selector_and_k8s_external_follow_the_api_server() {
    let (_dir, api, client) = api_server().await;

    let mut dns_config = DnsConfig::new("127.0.0.1:0".parse().unwrap());
    let mut zone = ZoneConfig::new("cluster.local").unwrap();
    zone.apply_option("k8s_external example.org").unwrap();
    dns_config.zone = zone;
    dns_config.upstreams = Some(vec![]);
    dns_config.labels = Some("dns=public".into());
    let dns = svcnet_dns::start(dns_config, client.clone()).await.unwrap();
    tokio::time::timeout(BOUND, dns.wait_synced())
        .await
        .expect("first sync");
    let addr = dns.local_addr();

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let lb = |name: &str, labelled: bool| -> Service {
        let mut svc = (*cluster_ip("default", name, &[], &[("http", "TCP", 80)])).clone();
        if let Some(spec) = svc.spec.as_mut() {
            spec.type_ = Some("LoadBalancer".into());
            spec.cluster_ip = None;
            spec.cluster_ips = None;
            spec.external_ips = Some(vec!["192.0.2.7".into()]);
        }
        if labelled {
            svc.metadata.labels = Some([("dns".to_string(), "public".to_string())].into());
        }
        svc
    };
    let public = services
        .create(&PostParams::default(), &lb("public", true))
        .await
        .unwrap();
    services
        .create(&PostParams::default(), &lb("hidden", false))
        .await
        .unwrap();
    let cluster_ip = public.spec.and_then(|s| s.cluster_ip).unwrap();
    until("the labelled service", || async {
        dig_short(addr, "public.default.svc.cluster.local", "A").await == cluster_ip
    })
    .await;
    // Its LoadBalancer ingress IP, from the API server's pool, comes with the status write.
    let started = Instant::now();
    let ingress = loop {
        let svc = services.get("public").await.unwrap();
        let ip = svc
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .and_then(|i| i.into_iter().next())
            .and_then(|i| i.ip);
        if let Some(ip) = ip {
            break ip;
        }
        assert!(started.elapsed() < BOUND, "no LoadBalancer ingress IP");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut want = ["192.0.2.7".to_string(), ingress];
    want.sort();
    let want = want.join(" ");
    until("public.default.example.org", || async {
        dig_short(addr, "public.default.example.org", "A").await == want
    })
    .await;
    // The unlabelled service was never read: NXDOMAIN in both zones.
    assert_eq!(
        status(addr, "hidden.default.svc.cluster.local").await,
        "NXDOMAIN"
    );
    assert_eq!(status(addr, "hidden.default.example.org").await, "NXDOMAIN");
    assert_eq!(status(addr, "default.example.org").await, "NOERROR");

    dns.shutdown().await.unwrap();
    api.shutdown().await.unwrap();
}

/// `GET path` on a loopback HTTP/1.1 server: (status, body).
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// A counter's value from Prometheus text, by its full series name and labels.
fn series(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// CoreDNS's health, ready and prometheus endpoints: /health and /ready answer OK once synced,
/// and the counters move with real questions (UDP and TCP, hits of the answer cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_and_metrics_in_coredns_names() {
    let (_dir, api, client) = api_server().await;
    let mut dns_config = DnsConfig::new("127.0.0.1:0".parse().unwrap());
    dns_config.upstreams = Some(vec![]);
    dns_config.http = Some("127.0.0.1:0".parse().unwrap());
    let dns = svcnet_dns::start(dns_config, client).await.unwrap();
    let http = dns.http_addr().unwrap();
    assert_eq!(http_get(http, "/health").await, (200, "OK".to_string()));
    tokio::time::timeout(BOUND, dns.wait_synced())
        .await
        .expect("first sync");
    assert_eq!(http_get(http, "/ready").await, (200, "OK".to_string()));

    // Start-up may publish more than one snapshot (the resources' first lists, the API
    // server's own bootstrap writes), and each publish starts an empty answer cache: count
    // hits only once the zone has stayed the same for a while.
    let zone = dns.zone();
    let same = |a: &Option<std::sync::Arc<svcnet_dns::Zone>>,
                b: &Option<std::sync::Arc<svcnet_dns::Zone>>| match (a, b) {
        (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
        _ => false,
    };
    let mut last = zone.current();
    tokio::time::timeout(BOUND, async {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = zone.current();
            if same(&last, &now) {
                break;
            }
            last = now;
        }
    })
    .await
    .expect("the zone settles");
    let addr = dns.local_addr();
    for _ in 0..3 {
        // Without a cookie, so the three datagrams are the same after the ID (a cookie
        // differs per query, and the answer cache is keyed by the bytes).
        let out = tokio::process::Command::new("dig")
            .args([&format!("@{}", addr.ip()), "-p", &addr.port().to_string()])
            .args([
                "kubernetes.default.svc.cluster.local",
                "A",
                "+short",
                "+nocookie",
            ])
            .output()
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "10.96.0.1");
    }
    assert_eq!(
        status(addr, "nothing.default.svc.cluster.local").await,
        "NXDOMAIN"
    );
    let out = tokio::process::Command::new("dig")
        .args([&format!("@{}", addr.ip()), "-p", &addr.port().to_string()])
        .args([
            "kubernetes.default.svc.cluster.local",
            "SRV",
            "+tcp",
            "+short",
        ])
        .output()
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("443"));

    let (code, text) = http_get(http, "/metrics").await;
    assert_eq!(code, 200);
    let server = format!("server=\"dns://{addr}\",zone=\".\",view=\"\"");
    let a = format!("coredns_dns_requests_total{{{server},proto=\"udp\",family=\"1\",type=\"A\"}}");
    assert_eq!(series(&text, &a), 4, "{text}");
    let srv =
        format!("coredns_dns_requests_total{{{server},proto=\"tcp\",family=\"1\",type=\"SRV\"}}");
    assert_eq!(series(&text, &srv), 1, "{text}");
    let noerror =
        format!("coredns_dns_responses_total{{{server},rcode=\"NOERROR\",plugin=\"kubernetes\"}}");
    assert_eq!(series(&text, &noerror), 4, "{text}");
    let nx =
        format!("coredns_dns_responses_total{{{server},rcode=\"NXDOMAIN\",plugin=\"kubernetes\"}}");
    assert_eq!(series(&text, &nx), 1, "{text}");
    // The third identical question is answered from the cache (kept on its second miss).
    assert!(
        same(&last, &zone.current()),
        "the zone was published again meanwhile"
    );
    assert_eq!(series(&text, "coredns_cache_hits_total{"), 1, "{text}");
    assert_eq!(series(&text, "coredns_cache_misses_total{"), 3, "{text}");
    let count = format!("coredns_dns_request_duration_seconds_count{{{server}}}");
    assert_eq!(series(&text, &count), 5, "{text}");

    dns.shutdown().await.unwrap();
    api.shutdown().await.unwrap();
}
