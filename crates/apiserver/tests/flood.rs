//! A local process flooding the API server with connections that never authenticate and never
//! finish a request (half a request line over TLS, or TCP without a handshake) cannot exhaust
//! it: such connections are bounded in number and in lifetime, and authenticated clients are
//! served throughout a flood of half requests.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Established TCP connections the server's side holds (local port = the server's), from
/// the kernel's own table: accepted ones and those still in the accept queue.
fn server_side_connections(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let port = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&port) && f[3] == "01"
        })
        .count()
}

const HALF_REQUEST: &[u8] = b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n";

/// A TLS connection without a client certificate that sends half a request and waits; it
/// reports how long the server kept it open (`None`: still open at `hold`).
async fn half_request(
    addr: std::net::SocketAddr,
    tls: tokio_rustls::TlsConnector,
    hold: Duration,
    started: &std::sync::atomic::AtomicUsize,
) -> Option<Duration> {
    let start = Instant::now();
    let count = || started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let Ok(tcp) = TcpStream::connect(addr).await else {
        count();
        return Some(start.elapsed());
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let connected = tls.connect(name, tcp).await;
    count();
    let mut s = match connected {
        Ok(s) => s,
        Err(_) => return Some(start.elapsed()),
    };
    if s.write_all(HALF_REQUEST).await.is_err() {
        return Some(start.elapsed());
    }
    let mut buf = [0u8; 512];
    match tokio::time::timeout(hold, s.read(&mut buf)).await {
        Ok(_) => Some(start.elapsed()),
        Err(_) => None,
    }
}

/// A TCP connection that never starts TLS; how long the server kept it open.
async fn silent_tcp(addr: std::net::SocketAddr, hold: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut tcp = TcpStream::connect(addr).await.ok()?;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(hold, tcp.read(&mut buf)).await {
        Ok(_) => Some(start.elapsed()),
        Err(_) => None,
    }
}

fn client_tls(ca_pem: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// Connections that never start TLS are bounded by the handshake deadline and, past
/// `max_handshakes`, the oldest is closed; the server serves again as soon as they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_connections_are_bounded_and_closed() {
    let limits = svcnet_apiserver::ConnectionLimits {
        handshake_timeout: Duration::from_secs(2),
        max_handshakes: 128,
        ..Default::default()
    };
    let ts = common::TestServer::start_with(|c| c.limits = limits).await;
    let addr = ts.server().addr();
    let port = addr.port();
    let sampler = tokio::task::spawn_blocking(move || {
        let end = Instant::now() + Duration::from_secs(4);
        let mut most = 0;
        while Instant::now() < end {
            most = most.max(server_side_connections(port));
            std::thread::sleep(Duration::from_millis(20));
        }
        most
    });
    let hold = Duration::from_secs(10);
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..2000 {
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        flood.spawn(async move { silent_tcp(addr, hold).await });
    }
    while let Some(r) = flood.join_next().await {
        let kept = r
            .unwrap()
            .expect("a silent connection was held open for 10 s");
        assert!(
            kept < Duration::from_secs(6),
            "a silent connection lived {kept:?}"
        );
    }
    let most = sampler.await.unwrap();
    assert!(most > 0, "the sampler saw no connection");
    assert!(
        most <= 600,
        "the server held {most} of 2,000 silent connections at once"
    );
    let nss: Api<Namespace> = Api::all(ts.client().await);
    assert!(nss.list(&ListParams::default()).await.is_ok());
    ts.stop().await;
}

/// 1,500 TLS connections without a certificate, each sending half a request and holding on:
/// past 64 the oldest is closed, so once the flood's handshakes are done the server holds 64 of
/// them (the deadlines are longer than the test, so only the bound can explain it), and an
/// authenticated client is served promptly throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_flood_is_bounded_and_authenticated_clients_are_served() {
    let limits = svcnet_apiserver::ConnectionLimits {
        max_unauthenticated: 64,
        header_timeout: Duration::from_secs(60),
        unauthenticated_lifetime: Duration::from_secs(60),
        ..Default::default()
    };
    let ts = common::TestServer::start_with(|c| c.limits = limits).await;
    let addr = ts.server().addr();
    let port = addr.port();
    let tls = client_tls(ts.server().ca_pem());
    let hold = Duration::from_secs(8);
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..1500 {
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (tls, started) = (tls.clone(), started.clone());
        flood.spawn(async move { half_request(addr, tls, hold, &started).await });
    }
    // Meanwhile, an authenticated client is served, promptly, every time.
    let nss: Api<Namespace> = Api::all(ts.client().await);
    for i in 0..20 {
        let list = tokio::time::timeout(Duration::from_secs(5), nss.list(&ListParams::default()))
            .await
            .unwrap_or_else(|_| panic!("request {i} during the flood timed out"))
            .unwrap();
        assert!(list.items.len() >= 3);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(6);
    while started.load(std::sync::atomic::Ordering::SeqCst) < 1500 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = server_side_connections(port);
    // 64 flood connections, the authenticated client's, and a few evictions not yet run.
    assert!(
        held <= 64 + 1 + 16,
        "the server holds {held} connections after the flood"
    );
    let mut still_open = 0;
    while let Some(r) = flood.join_next().await {
        if r.unwrap().is_none() {
            still_open += 1;
        }
    }
    assert!(
        still_open <= 64,
        "{still_open} flood connections stayed open"
    );
    assert!(still_open >= 1, "no flood connection was let in at all");
    assert!(nss.list(&ListParams::default()).await.is_ok());
    // The probes stay open to clients without a certificate.
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut s = tls
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).await.ok();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    ts.stop().await;
}

/// Without a certificate, half a request is closed at the header deadline, and a connection
/// that keeps asking the probes at its lifetime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connections_have_deadlines() {
    let limits = svcnet_apiserver::ConnectionLimits {
        header_timeout: Duration::from_secs(1),
        unauthenticated_lifetime: Duration::from_secs(3),
        ..Default::default()
    };
    let ts = common::TestServer::start_with(|c| c.limits = limits).await;
    let addr = ts.server().addr();
    let tls = client_tls(ts.server().ca_pem());
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let kept = half_request(addr, tls.clone(), Duration::from_secs(10), &started)
        .await
        .expect("half a request is closed");
    assert!(
        kept < Duration::from_millis(2500),
        "half a request was kept {kept:?}"
    );
    // Whole probe requests keep the header deadline at bay, not the lifetime.
    let start = Instant::now();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut s = tls
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let mut answered = 0;
    loop {
        let probe = b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        if s.write_all(probe).await.is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answered += 1,
            _ => break,
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "the lifetime was not enforced"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let lived = start.elapsed();
    assert!(answered >= 3, "only {answered} probes were answered");
    assert!(
        lived >= Duration::from_secs(3) && lived < Duration::from_secs(6),
        "{lived:?}"
    );
    ts.stop().await;
}
