//! Health-check node ports against the real kernel: the servers listen inside the node's
//! network namespace, answer upstream's JSON, follow the local endpoint count without
//! rebinding, report ports they cannot open, and close when the service goes. The end-to-end
//! case drives them through svcnet's real API server and probes them from an "external"
//! namespace, as a cloud load balancer would. Needs root (CI runs as root).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use svcnet_netns::NetNs;
use svcnet_netns::test_support::{Lab, NODE_IP};
use svcnet_proxy::NamespacedName;
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxyd::healthcheck::{EVENT_REASON, HealthCheck, HealthCheckServers};
use svcnet_proxyd::serve::Health;

/// A parsed HTTP/1.1 answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
}

fn get(addr: SocketAddr) -> std::io::Result<Answer> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no header end: {raw:?}")))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {raw:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_string(),
    })
}

fn get_in(ns: &NetNs, addr: SocketAddr) -> std::io::Result<Answer> {
    ns.run(move || get(addr)).unwrap()
}

fn healthy() -> Arc<Mutex<Health>> {
    Arc::new(Mutex::new(Health {
        last_updated: Some(SystemTime::now()),
        queued_since: None,
        node_eligible: true,
        timeout: Duration::from_secs(60),
    }))
}

fn hc(name: &str, port: u16, local_endpoints: usize) -> HealthCheck {
    HealthCheck {
        service: NamespacedName::new("default", name),
        port,
        local_endpoints,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_follow_the_desired_ports_inside_the_namespace() {
    let ns = NetNs::create(&svcnet_netns::unique_name("hc")).expect("needs root");
    let health = healthy();
    let mut servers = HealthCheckServers::new("n1", Some(ns.name().to_string()), health.clone());
    let v4: SocketAddr = "127.0.0.1:31001".parse().unwrap();
    let v6: SocketAddr = "[::1]:31001".parse().unwrap();

    assert!(servers.sync(&[hc("a", 31001, 2)]).await.is_empty());
    for addr in [v4, v6] {
        let a = get_in(&ns, addr).unwrap();
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.header("content-type"), Some("application/json"));
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(a.header("x-load-balancing-endpoint-weight"), Some("2"));
        assert_eq!(
            a.json(),
            serde_json::json!({"service": {"namespace": "default", "name": "a"},
                "localEndpoints": 2, "serviceProxyHealthy": true})
        );
    }
    // The listener lives in the namespace, not on the host (nothing the host could reach).
    assert!(servers.listening()[&NamespacedName::new("default", "a")].len() == 2);

    // Count changes are published without rebinding.
    let binds = servers.binds();
    assert!(servers.sync(&[hc("a", 31001, 0)]).await.is_empty());
    assert_eq!(servers.binds(), binds);
    let a = get_in(&ns, v4).unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.json()["localEndpoints"], 0);
    assert_eq!(a.header("x-load-balancing-endpoint-weight"), Some("0"));

    // A proxy that does not keep up with its changes is not a healthy target either.
    assert!(servers.sync(&[hc("a", 31001, 1)]).await.is_empty());
    health.lock().unwrap().queued_since = Some(SystemTime::now() - Duration::from_secs(120));
    let a = get_in(&ns, v4).unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.json()["serviceProxyHealthy"], false);
    health.lock().unwrap().queued_since = None;

    // A port someone else holds is reported, the other services still get their servers, and
    // the port is retried on the next sync once it is free.
    let squatter = ns
        .run(|| std::net::TcpListener::bind("0.0.0.0:31002").unwrap())
        .unwrap();
    let errors = servers
        .sync(&[hc("a", 31001, 1), hc("b", 31002, 1), hc("c", 31003, 1)])
        .await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].port, 31002);
    assert_eq!(errors[0].source.kind(), ErrorKind::AddrInUse);
    assert!(
        errors[0]
            .to_string()
            .contains("failed to start healthcheck \"default/b\" on port 31002"),
        "{}",
        errors[0]
    );
    assert_eq!(
        get_in(&ns, "127.0.0.1:31003".parse().unwrap())
            .unwrap()
            .status,
        200
    );
    drop(squatter);
    assert!(
        servers
            .sync(&[hc("a", 31001, 1), hc("b", 31002, 1), hc("c", 31003, 1)])
            .await
            .is_empty()
    );
    let b = get_in(&ns, "127.0.0.1:31002".parse().unwrap()).unwrap();
    assert_eq!(b.json()["service"]["name"], "b");

    // A service moving to another port, and services going away: their ports close.
    assert!(servers.sync(&[hc("a", 31004, 1)]).await.is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    for port in [31001, 31002, 31003] {
        let err = get_in(&ns, SocketAddr::from(([127, 0, 0, 1], port))).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::ConnectionRefused,
            "port {port}: {err}"
        );
    }
    assert_eq!(
        get_in(&ns, "127.0.0.1:31004".parse().unwrap())
            .unwrap()
            .status,
        200
    );
    assert!(servers.sync(&[]).await.is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = get_in(&ns, "127.0.0.1:31004".parse().unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
}

async fn client(kubeconfig: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// Polls the health-check port from the external namespace until `check` accepts the result.
async fn wait_for(
    lab: &mut Lab,
    addr: SocketAddr,
    what: &str,
    check: impl Fn(&std::io::Result<Answer>) -> bool,
) -> std::io::Result<Answer> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = get_in(lab.external().unwrap(), addr);
        if check(&got) {
            return got;
        }
        assert!(Instant::now() < deadline, "{what}: last answer {got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_load_balancer_health_check_through_the_api() {
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
    lab.add_pod().unwrap();
    lab.external().unwrap();

    let proxy = svcnet_proxyd::start(
        svcnet_proxyd::ProxyConfig {
            node_name: "n1".into(),
            netns: Some(lab.node.name().to_string()),
            min_sync_period: svcnet_proxyd::MinSyncPeriod::Fixed(Duration::from_millis(100)),
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            ..Default::default()
        },
        client.clone(),
    )
    .await
    .unwrap();

    // The port is held inside the node namespace at first: the proxy reports it (log, metric,
    // Warning Event) and keeps running; once free, the next sync opens it.
    let squatter = lab
        .node
        .run(|| std::net::TcpListener::bind("0.0.0.0:32100").unwrap())
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = service("default", "lb", |s| {
        s.type_("LoadBalancer")
            .port("http", "TCP", 80)
            .external_local()
            .health_check_node_port(32100);
    });
    let created = services.create(&PostParams::default(), &svc).await.unwrap();
    let spec = created.spec.unwrap();
    assert_eq!(spec.health_check_node_port, Some(32100));
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(15);
    let warning = loop {
        let list = events.list(&ListParams::default()).await.unwrap();
        if let Some(e) = list
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(EVENT_REASON))
        {
            break e;
        }
        assert!(Instant::now() < deadline, "no {EVENT_REASON} event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let regarding = warning.regarding.unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("Service"), Some("lb"))
    );
    assert!(
        warning.note.unwrap_or_default().contains("on port 32100"),
        "event note names the port"
    );
    drop(squatter);

    // One endpoint on this node: 200 with one local endpoint, from outside the node.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let pod_ip = lab.pod(0).ipv4.to_string();
    let s1 = slice("default", "lb-1", "lb", |s| {
        s.port("http", "TCP", 8080).endpoint(&pod_ip, "n1", |_| {});
    });
    slices.create(&PostParams::default(), &s1).await.unwrap();
    let addr = SocketAddr::from((NODE_IP, 32100));
    let a = wait_for(
        &mut lab,
        addr,
        "200 with one local endpoint",
        |r| matches!(r, Ok(a) if a.status == 200),
    )
    .await
    .unwrap();
    assert_eq!(
        a.json(),
        serde_json::json!({"service": {"namespace": "default", "name": "lb"},
            "localEndpoints": 1, "serviceProxyHealthy": true})
    );
    assert_eq!(a.header("x-load-balancing-endpoint-weight"), Some("1"));
    assert_eq!(a.header("content-type"), Some("application/json"));

    // The endpoint moves to another node: 503, no local endpoints.
    let s2 = slice("default", "lb-1", "lb", |s| {
        s.port("http", "TCP", 8080).endpoint(&pod_ip, "n2", |_| {});
    });
    let patch = serde_json::json!({ "endpoints": s2.endpoints });
    slices
        .patch("lb-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let a = wait_for(
        &mut lab,
        addr,
        "503 without local endpoints",
        |r| matches!(r, Ok(a) if a.status == 503),
    )
    .await
    .unwrap();
    assert_eq!(a.json()["localEndpoints"], 0);
    assert_eq!(a.json()["serviceProxyHealthy"], true);

    // The service is deleted: the port closes.
    services.delete("lb", &Default::default()).await.unwrap();
    wait_for(
        &mut lab,
        addr,
        "connection refused",
        |r| matches!(r, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
    )
    .await
    .unwrap_err();

    proxy.shutdown().await;
    svcnet_proxyd::cleanup(Some(lab.node.name()), "svcnet").unwrap();
    server.shutdown().await.unwrap();
}
