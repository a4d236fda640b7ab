//! Unprivileged mode against real sockets (no root needed): each cluster IP in the loopback
//! service CIDR 127.96.0.0/16 is bound directly; backends are tokio echo servers on other
//! loopback addresses.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::*;
use svcnet_proxy::fixtures::*;
use svcnet_userspace::{Admission, Config, Mode, UserspaceProxy};
use tokio::net::{TcpStream, UdpSocket};

struct Setup {
    svc_ip: IpAddr,
    port: u16,
    backends: Vec<SocketAddr>,
    _servers: Vec<tokio::task::JoinHandle<()>>,
}

impl Setup {
    fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.svc_ip, self.port)
    }
}

/// `live` backends with listeners plus `dead` addresses with none, all on one port.
async fn setup(live: usize, dead: usize) -> Setup {
    let svc_ip = unique_ip(96);
    let port = free_port(svc_ip).await;
    let first = unique_ip(1);
    let target = free_port(first).await;
    let mut backends = Vec::new();
    let mut servers = Vec::new();
    for i in 0..live + dead {
        let ip = if i == 0 { first } else { unique_ip(1) };
        let addr = SocketAddr::new(ip, target);
        if i < live {
            servers.push(tcp_backend(addr, &format!("b{i}")).await);
        }
        backends.push(addr);
    }
    Setup {
        svc_ip,
        port,
        backends,
        _servers: servers,
    }
}

fn objects(
    s: &Setup,
    proto: &str,
    endpoints: &[SocketAddr],
    f: impl FnOnce(&mut svcnet_proxy::fixtures::ServiceBuilder),
) -> (
    k8s_openapi::api::core::v1::Service,
    k8s_openapi::api::discovery::v1::EndpointSlice,
) {
    let ip = s.svc_ip.to_string();
    let svc = service("default", "web", |b| {
        b.cluster_ip(&[&ip]).port("p", proto, i32::from(s.port));
        f(b);
    });
    let target = s.backends.first().map_or(1, |b| b.port());
    let sl = slice("default", "web-1", "web", |b| {
        b.port("p", proto, i32::from(target));
        for e in endpoints {
            b.endpoint(&e.ip().to_string(), NODE, |_| {});
        }
    });
    (svc, sl)
}

fn proxy() -> UserspaceProxy {
    proxy_with(|_| {})
}

/// A proxy with the tests' timeouts, then `f`'s changes: `event_loop` picks TCP on svcnet's
/// epoll loops (Linux's default) or on tokio (the portable path, the only one on macOS); the
/// tests of retries, draining and relaying run on both.
fn proxy_with(f: impl FnOnce(&mut Config)) -> UserspaceProxy {
    let mut c = Config::new(Mode::Unprivileged {
        node_port_addresses: vec![],
    });
    c.connect_timeout = Duration::from_millis(500);
    c.drain_timeout = Duration::from_millis(600);
    f(&mut c);
    UserspaceProxy::new(c).unwrap()
}

async fn tally(addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for _ in 0..n {
        *m.entry(ask(addr).await.unwrap()).or_default() += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_connections_evenly() {
    let s = setup(3, 0).await;
    let (svc, sl) = objects(&s, "TCP", &s.backends, |_| {});
    let p = proxy();
    let report = p.sync(&desired(&[svc], &[sl])).await.unwrap();
    assert!(report.bind_errors.is_empty(), "{:?}", report.bind_errors);
    let t = tally(s.addr(), 30).await;
    assert_eq!(
        t,
        BTreeMap::from([("b0".into(), 10), ("b1".into(), 10), ("b2".into(), 10)])
    );
    let m = &p.metrics()[0];
    assert_eq!((m.total, m.connect_failures), (30, 0));
    assert_eq!(m.endpoints.iter().map(|e| e.total).sum::<u64>(), 30);
    // "?\n" per request, "bN\n" back; counted when each connection ends (they all have).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let m = &p.metrics()[0];
    assert_eq!((m.bytes_in, m.bytes_out, m.active), (60, 90, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_is_retried_transparently_and_marked_down() {
    dead_endpoint_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_is_retried_transparently_and_marked_down_on_tokio() {
    dead_endpoint_case(false).await;
}

async fn dead_endpoint_case(event_loop: bool) {
    let s = setup(2, 1).await;
    let dead = s.backends[2];
    let (svc, sl) = objects(&s, "TCP", &s.backends, |_| {});
    let p = proxy_with(|c| c.event_loop = event_loop);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let t = tally(s.addr(), 20).await;
    assert_eq!(
        t.values().sum::<usize>(),
        20,
        "every request answered: {t:?}"
    );
    let m = &p.metrics()[0];
    let d = m.endpoints.iter().find(|e| e.addr == dead).unwrap();
    // Tried once, then avoided during its back-off.
    assert_eq!((d.connect_failures, d.total), (1, 0));
    assert!(d.down);
    assert_eq!(m.connect_failures, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoints_refuses_at_once() {
    let s = setup(1, 0).await;
    let (svc, sl) = objects(&s, "TCP", &[], |_| {});
    let p = proxy();
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let start = Instant::now();
    let e = ask(s.addr()).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    assert!(start.elapsed() < Duration::from_millis(200));
    // Every endpoint dead: the retries run out and the client gets a reset, fast.
    let s = setup(0, 3).await;
    let (svc, sl) = objects(&s, "TCP", &s.backends, |_| {});
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let start = Instant::now();
    assert!(ask(s.addr()).await.is_err());
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(p.metrics()[0].refused, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_affinity_sticks() {
    let s = setup(3, 0).await;
    let (svc, sl) = objects(&s, "TCP", &s.backends, |b| {
        b.affinity(Some(60));
    });
    let p = proxy();
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let t = tally(s.addr(), 12).await;
    assert_eq!(t.len(), 1, "one client, one endpoint: {t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_affinity_expires_after_its_timeout() {
    let s = setup(3, 0).await;
    let (svc, sl) = objects(&s, "TCP", &s.backends, |b| {
        b.affinity(Some(1));
    });
    let p = proxy();
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let pinned = ask(s.addr()).await.unwrap();
    // Each new connection refreshes the pin, as the kernel dataplanes' timed sets do.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(ask(s.addr()).await.unwrap(), pinned);
    }
    // Idle longer than the timeout: the pin is gone and round robin moves on.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_ne!(ask(s.addr()).await.unwrap(), pinned);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_endpoint_drains_established_connections() {
    drain_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_endpoint_drains_established_connections_on_tokio() {
    drain_case(false).await;
}

async fn drain_case(event_loop: bool) {
    let s = setup(2, 0).await;
    let (svc, sl) = objects(&s, "TCP", &s.backends, |_| {});
    let p = proxy_with(|c| c.event_loop = event_loop);
    p.sync(&desired(std::slice::from_ref(&svc), &[sl]))
        .await
        .unwrap();
    let mut held = Conn::open(s.addr()).await.unwrap();
    let first = held.ask().await.unwrap();
    let idx: usize = first[1..].parse().unwrap();
    let keep = s.backends[1 - idx];
    let (_, sl) = objects(&s, "TCP", &[keep], |_| {});
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    // New connections avoid the removed endpoint at once; the established one continues.
    let t = tally(s.addr(), 6).await;
    assert_eq!(t.keys().collect::<Vec<_>>(), [&format!("b{}", 1 - idx)]);
    assert_eq!(held.ask().await.unwrap(), first);
    // After the drain timeout (600 ms) the proxy closes it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(held.ask().await.is_err(), "drained connection still open");
}

/// A UDP Service on a loopback cluster IP with `n` echo backends answering their names
/// (`u0`, `u1`, …) on one port: its address, the backends, the objects, the servers.
struct UdpSetup {
    service: SocketAddr,
    backends: Vec<SocketAddr>,
    objects: (
        k8s_openapi::api::core::v1::Service,
        k8s_openapi::api::discovery::v1::EndpointSlice,
    ),
    _servers: Vec<tokio::task::JoinHandle<()>>,
}

async fn udp_setup(n: usize) -> UdpSetup {
    let svc_ip = unique_ip(96);
    let port = UdpSocket::bind((svc_ip, 0))
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ips: Vec<IpAddr> = (0..n).map(|_| unique_ip(1)).collect();
    let target = UdpSocket::bind((ips[0], 0))
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut servers = Vec::new();
    let mut backends = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        backends.push(SocketAddr::new(*ip, target));
        servers.push(udp_backend((*ip, target).into(), &format!("u{i}")).await);
    }
    let svc_text = svc_ip.to_string();
    let svc = service("default", "dns", |b| {
        b.cluster_ip(&[&svc_text]).port("d", "UDP", i32::from(port));
    });
    let sl = slice("default", "dns-1", "dns", |b| {
        b.port("d", "UDP", i32::from(target));
        for ip in &ips {
            b.endpoint(&ip.to_string(), NODE, |_| {});
        }
    });
    UdpSetup {
        service: SocketAddr::new(svc_ip, port),
        backends,
        objects: (svc, sl),
        _servers: servers,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_replies_come_from_the_service_address() {
    let u = udp_setup(2).await;
    let (svc, sl) = u.objects.clone();
    let p = proxy();
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let service_addr = u.service;
    let mut seen = BTreeMap::new();
    for _ in 0..4 {
        // A fresh client socket per round: rr gives each new flow the next endpoint.
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        for _ in 0..3 {
            c.send_to(b"?", service_addr).await.unwrap();
            let mut buf = [0u8; 64];
            let (n, from) = tokio::time::timeout(Duration::from_secs(2), c.recv_from(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(from, service_addr, "reply source");
            *seen
                .entry(String::from_utf8_lossy(&buf[..n]).to_string())
                .or_insert(0) += 1;
        }
    }
    // A flow sticks to its endpoint (3 replies each), flows alternate.
    assert_eq!(seen, BTreeMap::from([("u0".into(), 6), ("u1".into(), 6)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_connection_avoids_the_busy_endpoint() {
    let s = setup(2, 0).await;
    let (svc, sl) = objects(&s, "TCP", &s.backends, |_| {});
    let svc = annotate(svc, "lc");
    let p = proxy();
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    // Hold three connections open; lc spreads them 2/1, then the next goes to the lighter.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = Conn::open(s.addr()).await.unwrap();
        let who = c.ask().await.unwrap();
        held.push((c, who));
    }
    let busy = |n: &str| held.iter().filter(|(_, w)| w == n).count();
    let (b0, b1) = (busy("b0"), busy("b1"));
    assert_eq!(b0 + b1, 3);
    assert!(b0.abs_diff(b1) == 1);
    let lighter = if b0 < b1 { "b0" } else { "b1" };
    assert_eq!(ask(s.addr()).await.unwrap(), lighter);
    assert_eq!(
        p.metrics()[0].algorithm,
        svcnet_lb::Algorithm::LeastConnection
    );
}

/// A backend that reads a whole request until the client's FIN, then sends it back and
/// closes: the relay must pass the half-close on and keep the other direction running.
async fn echo_after_eof(addr: SocketAddr) -> tokio::task::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut all = Vec::new();
                if s.read_to_end(&mut all).await.is_ok() {
                    let _ = s.write_all(&all).await;
                }
            });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_and_bulk_bytes_pass_intact() {
    half_close_case(|_| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_and_bulk_bytes_pass_intact_on_tokio() {
    half_close_case(|c| c.event_loop = false).await;
}

/// Bulk streams copied through the process instead of spliced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_and_bulk_bytes_pass_intact_copying() {
    half_close_case(|c| c.splice = false).await;
}

async fn half_close_case(configure: impl FnOnce(&mut Config)) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let svc_ip = unique_ip(96);
    let port = free_port(svc_ip).await;
    let b = unique_ip(1);
    let target = free_port(b).await;
    let _server = echo_after_eof((b, target).into()).await;
    let ip = svc_ip.to_string();
    let svc = service("default", "bulk", |s| {
        s.cluster_ip(&[&ip]).port("p", "TCP", i32::from(port));
    });
    let sl = slice("default", "bulk-1", "bulk", |s| {
        s.port("p", "TCP", i32::from(target));
        s.endpoint(&b.to_string(), NODE, |_| {});
    });
    let p = proxy_with(configure);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    // 3 MiB and a few odd bytes: many pipe fills per direction, a short last one.
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 77)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let s = TcpStream::connect((svc_ip, port)).await.unwrap();
        let (mut r, mut w) = s.into_split();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap(); // FIN: the backend answers only after it
            w
        });
        let mut back = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut back))
            .await
            .unwrap()
            .unwrap();
        drop(writer.await.unwrap());
        rounds.push(back == data);
    }
    assert_eq!(rounds, [true; 3], "bytes came back altered");
    // Counters: every byte each way, once the connections have ended.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = &p.metrics()[0];
        let want = 3 * data.len() as u64;
        if m.active == 0 {
            assert_eq!((m.bytes_in, m.bytes_out), (want, want));
            break;
        }
        assert!(Instant::now() < deadline, "connections still active: {m:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `externalTrafficPolicy: Local` with the only endpoint on another node: this host's own
/// connections to the external IP take the core's short-circuit to the cluster pool (one
/// socket serves every source here, so the proxy tells them apart per connection), on the
/// epoll loops and on tokio; a cluster IP client is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_policy_short_circuits_this_hosts_connections() {
    for event_loop in [true, false] {
        let s = setup(1, 0).await;
        let external = unique_ip(97);
        let svc = service("default", "web", |b| {
            b.cluster_ip(&[&s.svc_ip.to_string()])
                .port("p", "TCP", i32::from(s.port))
                .external_ips(&[&external.to_string()])
                .external_local();
        });
        let sl = slice("default", "web-1", "web", |b| {
            b.port("p", "TCP", i32::from(s.backends[0].port()))
                .endpoint(&s.backends[0].ip().to_string(), "n2", |_| {});
        });
        let p = proxy_with(|c| c.event_loop = event_loop);
        let report = p.sync(&desired(&[svc], &[sl])).await.unwrap();
        assert!(report.bind_errors.is_empty(), "{:?}", report.bind_errors);
        let via_external = SocketAddr::new(external, s.port);
        assert_eq!(
            ask(via_external).await.unwrap(),
            "b0",
            "event_loop={event_loop}"
        );
        assert_eq!(
            ask(s.addr()).await.unwrap(),
            "b0",
            "event_loop={event_loop}"
        );
        p.shutdown().await.unwrap();
    }
}

/// The real thing without root: a cluster IP's port 443 cannot be bound without
/// `CAP_NET_BIND_SERVICE`. The failure is reported once, with what to do, retried with
/// back-off (not at every sync), shown in `unbound()`, and the service's other port serves.
/// As root the test runs itself again as `nobody` (no capabilities) through `setpriv`.
#[test]
fn privileged_port_without_the_capability_is_reported_once_and_retried_with_backoff() {
    const AS_NOBODY: &str = "SVCNET_TEST_AS_NOBODY";
    let start: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024);
    if start <= 443 {
        eprintln!(
            "skipped: net.ipv4.ip_unprivileged_port_start is {start}, 443 needs no capability"
        );
        return;
    }
    // The effective user, from /proc (this test links no libc binding).
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    if root && std::env::var_os(AS_NOBODY).is_none() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ])
            .arg(exe)
            .args([
                "--exact",
                "privileged_port_without_the_capability_is_reported_once_and_retried_with_backoff",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(AS_NOBODY, "1")
            .output()
            .expect("setpriv (util-linux) runs the test as nobody");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "as nobody:\n{text}");
        assert!(text.contains("1 passed"), "as nobody:\n{text}");
        return;
    }
    assert!(!root, "still root under setpriv");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ip = unique_ip(96);
        let open = free_port(ip).await;
        let backend_ip = unique_ip(1);
        let backend = SocketAddr::new(backend_ip, free_port(backend_ip).await);
        let _server = tcp_backend(backend, "b0").await;
        let ips = ip.to_string();
        let svc = service("default", "kubernetes", |b| {
            b.cluster_ip(&[&ips])
                .port("https", "TCP", 443)
                .port("other", "TCP", i32::from(open));
        });
        let sl = slice("default", "kubernetes-1", "kubernetes", |b| {
            b.port("https", "TCP", i32::from(backend.port()))
                .port("other", "TCP", i32::from(backend.port()))
                .endpoint(&backend_ip.to_string(), NODE, |_| {});
        });
        let p = proxy_with(|c| {
            c.bind_retry = Duration::from_millis(100);
            c.bind_retry_max = Duration::from_millis(400);
        });
        let state = desired(&[svc], &[sl]);
        let report = p.sync(&state).await.unwrap();
        assert_eq!(report.bind_errors.len(), 1, "{:?}", report.bind_errors);
        let e = &report.bind_errors[0];
        assert_eq!(
            e.to_string(),
            format!("cannot bind TCP {ip}:443: Permission denied (os error 13)")
        );
        let hint = e.hint().unwrap();
        for word in [
            "CAP_NET_BIND_SERVICE",
            "setcap cap_net_bind_service=+ep",
            "net.ipv4.ip_unprivileged_port_start=443",
        ] {
            assert!(hint.contains(word), "{word} not in {hint}");
        }
        let u = p.unbound();
        assert_eq!(u.len(), 1, "{u:?}");
        assert_eq!(u[0].addr, SocketAddr::new(ip, 443));
        assert_eq!((u[0].protocol, u[0].attempts), ("TCP", 1));
        assert_eq!(u[0].hint.as_deref(), Some(hint.as_str()));
        // The other port applied and serves.
        assert_eq!(ask(SocketAddr::new(ip, open)).await.unwrap(), "b0");
        // Syncs within the back-off neither report nor try again.
        for _ in 0..5 {
            let r = p.sync(&state).await.unwrap();
            assert!(r.bind_errors.is_empty(), "{:?}", r.bind_errors);
        }
        assert_eq!(p.unbound()[0].attempts, 1);
        // The retry timer tries again as the back-off passes: 100, 200, 400, 400 ms …
        let begun = Instant::now();
        while begun.elapsed() < Duration::from_millis(1500) {
            let next = p.retry_unbound().await.unwrap().unwrap();
            assert!(next <= Duration::from_millis(400), "{next:?}");
            tokio::time::sleep(next.max(Duration::from_millis(10))).await;
        }
        let u = p.unbound();
        let attempts = u[0].attempts;
        // About 1 + 1500/400 + 2; never one per loop turn (that would be ~100).
        assert!((4..=8).contains(&attempts), "{attempts} attempts: {u:?}");
        assert!(u[0].retry_in <= Duration::from_millis(400), "{u:?}");
        // Removing the port forgets it.
        let svc = service("default", "kubernetes", |b| {
            b.cluster_ip(&[&ips]).port("other", "TCP", i32::from(open));
        });
        let sl = slice("default", "kubernetes-1", "kubernetes", |b| {
            b.port("other", "TCP", i32::from(backend.port())).endpoint(
                &backend_ip.to_string(),
                NODE,
                |_| {},
            );
        });
        p.sync(&desired(&[svc], &[sl])).await.unwrap();
        assert!(p.unbound().is_empty());
        assert_eq!(p.retry_unbound().await.unwrap(), None);
    });
}

/// An [`Admission`] that denies one endpoint and records what it was asked.
#[derive(Debug)]
struct DenyOne {
    denied: SocketAddr,
    asked: std::sync::Mutex<Vec<(IpAddr, SocketAddr, svcnet_proxy::Protocol)>>,
}

impl Admission for DenyOne {
    fn admits(
        &self,
        client: IpAddr,
        endpoint: SocketAddr,
        protocol: svcnet_proxy::Protocol,
    ) -> bool {
        self.asked
            .lock()
            .unwrap()
            .push((client, endpoint, protocol));
        endpoint != self.denied
    }
}

/// A connection whose balanced endpoint the admission denies is refused, as a kernel
/// dataplane's policy refuses it at the endpoint its DNAT chose: round robin's pick stands,
/// no other endpoint is tried, and the denied endpoint is not marked down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_endpoint_refuses_the_connection_without_trying_another() {
    denied_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_endpoint_refuses_the_connection_without_trying_another_on_tokio() {
    denied_case(false).await;
}

async fn denied_case(event_loop: bool) {
    let s = setup(3, 0).await;
    let judge = std::sync::Arc::new(DenyOne {
        denied: s.backends[1],
        asked: Default::default(),
    });
    let (svc, sl) = objects(&s, "TCP", &s.backends, |_| {});
    let p = proxy_with(|c| {
        c.event_loop = event_loop;
        c.admission = Some(judge.clone());
    });
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let mut answers = BTreeMap::new();
    for _ in 0..30 {
        let a = ask(s.addr()).await.unwrap_or_else(|_| "refused".into());
        *answers.entry(a).or_insert(0) += 1;
    }
    assert_eq!(
        answers,
        BTreeMap::from([("b0".into(), 10), ("b2".into(), 10), ("refused".into(), 10)])
    );
    let asked = judge.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 30, "one question per connection");
    assert!(asked.iter().all(|(client, _, proto)| client.is_loopback()
        && *proto == svcnet_proxy::Protocol::Tcp));
    let m = &p.metrics()[0];
    assert_eq!((m.refused, m.connect_failures), (10, 0));
    assert!(m.endpoints.iter().all(|e| !e.down), "{:?}", m.endpoints);
}

/// UDP: a flow to a denied endpoint gets nothing; the next flow goes on to the next endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_udp_flow_gets_no_answer() {
    let u = udp_setup(2).await;
    let judge = std::sync::Arc::new(DenyOne {
        denied: u.backends[0],
        asked: Default::default(),
    });
    let (svc, sl) = u.objects.clone();
    let p = proxy_with(|c| c.admission = Some(judge.clone()));
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let service_addr = u.service;
    let mut answers = Vec::new();
    for _ in 0..4 {
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.send_to(b"?", service_addr).await.unwrap();
        let mut buf = [0u8; 64];
        let got = tokio::time::timeout(Duration::from_millis(300), c.recv_from(&mut buf)).await;
        answers.push(match got {
            Ok(Ok((n, _))) => String::from_utf8_lossy(&buf[..n]).to_string(),
            _ => "none".into(),
        });
    }
    answers.sort();
    assert_eq!(answers, ["none", "none", "u1", "u1"]);
    let asked = judge.asked.lock().unwrap().clone();
    assert!(
        asked
            .iter()
            .all(|(_, _, proto)| *proto == svcnet_proxy::Protocol::Udp)
    );
}

/// An [`Admission`] switched between allowing and denying everything, which asks for
/// established connections to be judged again when told to.
#[derive(Debug)]
struct Switch {
    deny: std::sync::atomic::AtomicBool,
    rejudge: tokio::sync::watch::Sender<u64>,
}

impl Admission for Switch {
    fn admits(&self, _: IpAddr, _: SocketAddr, _: svcnet_proxy::Protocol) -> bool {
        !self.deny.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn rejudge(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.rejudge.subscribe())
    }
}

/// A connection relayed before a change lives on while nothing asks for it to be judged
/// again (the kernel's `ct state established`); once the admission says to, the one it now
/// denies is closed, and a new one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn established_connections_are_cut_only_when_judged_again() {
    rejudge_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn established_connections_are_cut_only_when_judged_again_on_tokio() {
    rejudge_case(false).await;
}

async fn rejudge_case(event_loop: bool) {
    let s = setup(1, 0).await;
    let judge = std::sync::Arc::new(Switch {
        deny: false.into(),
        rejudge: tokio::sync::watch::channel(0).0,
    });
    let (svc, sl) = objects(&s, "TCP", &s.backends, |_| {});
    let p = proxy_with(|c| {
        c.event_loop = event_loop;
        c.admission = Some(judge.clone());
    });
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let mut held = Conn::open(s.addr()).await.unwrap();
    assert_eq!(held.ask().await.unwrap(), "b0");
    judge.deny.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        held.ask().await.unwrap(),
        "b0",
        "established: not judged again yet"
    );
    assert!(ask(s.addr()).await.is_err(), "a new connection is judged");
    judge.rejudge.send_modify(|g| *g += 1);
    let started = Instant::now();
    let cut = loop {
        match held.ask().await {
            Err(_) => break true,
            Ok(_) if started.elapsed() > Duration::from_secs(3) => break false,
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert!(cut, "the connection now denied was not closed");
}

/// UDP: a flow now denied ends when judged again; the client's next datagram opens a new
/// flow, which is judged (and gets nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_established_udp_flow_is_cut_when_judged_again() {
    let u = udp_setup(1).await;
    let judge = std::sync::Arc::new(Switch {
        deny: false.into(),
        rejudge: tokio::sync::watch::channel(0).0,
    });
    let (svc, sl) = u.objects.clone();
    let p = proxy_with(|c| c.admission = Some(judge.clone()));
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let service_addr = u.service;
    let round = || async {
        c.send_to(b"?", service_addr).await.unwrap();
        let mut buf = [0u8; 64];
        tokio::time::timeout(Duration::from_millis(500), c.recv_from(&mut buf))
            .await
            .is_ok()
    };
    assert!(round().await);
    judge.deny.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(round().await, "the flow lives on until judged again");
    judge.rejudge.send_modify(|g| *g += 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!round().await, "the flow was not cut");
}
