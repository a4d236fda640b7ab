//! Shared test helpers: desired state from fixtures, tokio echo backends, clients.
#![allow(clippy::unwrap_used, dead_code)]

pub mod tracer;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcnet_proxy::{CoreConfig, DesiredFamily, IpFamily, ProxyState};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

pub const NODE: &str = "n1";

/// The desired state of both families for these objects.
pub fn desired(services: &[Service], slices: &[EndpointSlice]) -> Vec<DesiredFamily> {
    let mut st = ProxyState::new(CoreConfig {
        node_name: NODE.into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        service_cidrs: vec![
            "127.96.0.0/16".parse().unwrap(),
            "10.96.0.0/12".parse().unwrap(),
        ],
        ..Default::default()
    });
    for s in services {
        st.update_service(s).unwrap();
    }
    for s in slices {
        st.update_slice(s);
    }
    IpFamily::ALL.into_iter().map(|f| st.desired(f)).collect()
}

pub fn annotate(mut svc: Service, algorithm: &str) -> Service {
    svc.metadata.annotations = Some(
        [(svcnet_lb::ANNOTATION.to_string(), algorithm.to_string())]
            .into_iter()
            .collect(),
    );
    svc
}

/// A loopback address unique to this process and call, inside `127.<second>.0.0/16`.
pub fn unique_ip(second: u8) -> IpAddr {
    static N: AtomicU32 = AtomicU32::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    // The low byte of the pid keeps concurrent test processes (nextest) apart; the counter
    // keeps calls within one process apart.
    let pid = std::process::id();
    IpAddr::from([127, second, ((pid >> 8) as u8) ^ (n as u8), pid as u8])
}

/// A TCP port free on `ip` right now.
pub async fn free_port(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0))
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a TCP echo backend answering each line with `"<identity>\n"`.
pub async fn tcp_backend(addr: SocketAddr, identity: &str) -> tokio::task::JoinHandle<()> {
    let l = TcpListener::bind(addr).await.unwrap();
    let id = identity.to_string();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let id = id.clone();
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(_)) = lines.next_line().await {
                    if w.write_all(format!("{id}\n").as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    })
}

/// Starts a UDP echo backend answering each datagram with `"<identity>"`.
pub async fn udp_backend(addr: SocketAddr, identity: &str) -> tokio::task::JoinHandle<()> {
    let s = UdpSocket::bind(addr).await.unwrap();
    let id = identity.to_string();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((_, peer)) = s.recv_from(&mut buf).await {
            let _ = s.send_to(id.as_bytes(), peer).await;
        }
    })
}

/// An open connection through the proxy.
pub struct Conn {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    w: tokio::net::tcp::OwnedWriteHalf,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> std::io::Result<Self> {
        let s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await??;
        let (r, w) = s.into_split();
        Ok(Self {
            lines: BufReader::new(r).lines(),
            w,
        })
    }

    pub async fn ask(&mut self) -> std::io::Result<String> {
        self.w.write_all(b"?\n").await?;
        match tokio::time::timeout(Duration::from_secs(5), self.lines.next_line()).await? {
            Ok(Some(l)) => Ok(l),
            Ok(None) => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Err(e) => Err(e),
        }
    }
}

/// One request on a fresh connection.
pub async fn ask(addr: SocketAddr) -> std::io::Result<String> {
    Conn::open(addr).await?.ask().await
}
