//! The DNS transport: UDP and TCP on one address (hickory-server), answering the cluster zone
//! from the published snapshot and forwarding the rest.

mod cache;
#[cfg(test)]
mod cache_tests;
pub(crate) mod forward;
mod fuzzing;
mod handler;
mod metrics;
#[cfg(test)]
mod test_support;
pub(crate) mod udp;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::Server;
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinSet;

pub use forward::{
    ForwardError, Forwarder, ForwarderOptions, ForwarderStats, Popular, Prefetch, Upstream,
    parse_resolv_conf,
};
pub use fuzzing::PacketPath;
pub use handler::{Handler, ZoneHandle};
pub use udp::UdpStats;

use crate::zone::ZoneConfig;
use metrics::DnsMetrics;

/// How long an idle TCP connection is kept.
const TCP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one upstream gets to answer.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors starting or running the DNS server.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The listen address could not be bound for UDP or TCP.
    #[error("cannot listen on {addr} ({proto}): {source}")]
    Bind {
        addr: SocketAddr,
        proto: &'static str,
        source: std::io::Error,
    },
    /// The server's sockets stopped.
    #[error("DNS server stopped: {0}")]
    Serve(String),
    /// The API server could not be watched.
    #[error("watching {resource}: {message}")]
    Watch {
        resource: &'static str,
        message: String,
    },
}

impl DnsError {
    /// Whether trying again later may succeed (a busy port or a lost API connection may clear).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, DnsError::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrNotAvailable)
    }
}

/// A running DNS server; the zone it serves is published through [`DnsServer::zone`].
pub struct DnsServer {
    server: Server<SharedHandler>,
    udp: JoinSet<()>,
    udp_counters: Arc<udp::UdpCounters>,
    local_addr: SocketAddr,
    zone: ZoneHandle,
    upstreams: Vec<SocketAddr>,
    metrics: Arc<DnsMetrics>,
}

impl DnsServer {
    /// Listen on `listen` (UDP and TCP on the same port; port 0 picks a free one) and serve
    /// `config`'s zone, SERVFAIL in it until a zone is published; forward the rest to
    /// `upstreams` (minus this server itself).
    pub async fn start(
        listen: SocketAddr,
        config: Arc<ZoneConfig>,
        upstreams: Vec<SocketAddr>,
    ) -> Result<DnsServer, DnsError> {
        let (udp, tcp) = bind_pair(listen).await?;
        let local_addr = udp.local_addr().map_err(|source| DnsError::Bind {
            addr: listen,
            proto: "udp",
            source,
        })?;
        let forwarder = Arc::new(Forwarder::new(
            upstreams,
            Some(local_addr),
            UPSTREAM_TIMEOUT,
        ));
        let upstreams = forwarder.upstreams().to_vec();
        let zone = ZoneHandle::default();
        let metrics = Arc::new(DnsMetrics::new(local_addr));
        let handler = Arc::new(Handler {
            config,
            zone: zone.clone(),
            forwarder,
            metrics: metrics.clone(),
        });
        let udp = Arc::new(udp);
        let udp_counters = Arc::new(udp::UdpCounters::default());
        let mut udp_tasks = JoinSet::new();
        // One receive loop per runtime worker (a second loop on one worker only adds a wasted
        // `recvmmsg` per wake-up).
        let loops = tokio::runtime::Handle::current()
            .metrics()
            .num_workers()
            .clamp(1, 4);
        for _ in 0..loops {
            udp_tasks.spawn(udp::serve_udp(
                udp.clone(),
                handler.clone(),
                udp_counters.clone(),
            ));
        }
        let mut server = Server::new(SharedHandler(handler));
        server.register_listener(tcp, TCP_TIMEOUT, 64);
        Ok(DnsServer {
            server,
            udp: udp_tasks,
            udp_counters,
            local_addr,
            zone,
            upstreams,
            metrics,
        })
    }

    /// The server's metrics in CoreDNS's names, as Prometheus text.
    pub fn metrics_text(&self) -> String {
        self.observer().metrics_text()
    }

    /// A cheap handle that renders the metrics (for the HTTP endpoint).
    pub fn observer(&self) -> Observer {
        Observer {
            metrics: self.metrics.clone(),
            zone: self.zone.clone(),
        }
    }

    /// The bound address (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where zone snapshots are published.
    pub fn zone(&self) -> ZoneHandle {
        self.zone.clone()
    }

    /// What the UDP path did so far: datagrams received, answered, dropped, failed to send.
    pub fn udp_stats(&self) -> UdpStats {
        self.udp_counters.stats()
    }

    /// The upstreams actually used (loops to ourselves removed).
    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// Stop listening and wait for in-flight requests.
    pub async fn shutdown(mut self) -> Result<(), DnsError> {
        self.udp.shutdown().await;
        self.server
            .shutdown_gracefully()
            .await
            .map_err(|e| DnsError::Serve(e.to_string()))
    }
}

/// Reads a running server's metrics.
#[derive(Clone, Debug)]
pub struct Observer {
    metrics: Arc<DnsMetrics>,
    zone: ZoneHandle,
}

impl Observer {
    /// The metrics in CoreDNS's names, as Prometheus text.
    pub fn metrics_text(&self) -> String {
        self.metrics.render(self.zone.cache_stats().0)
    }
}

/// The handler shared between the UDP loops and hickory-server's TCP side.
struct SharedHandler(Arc<Handler>);

#[async_trait::async_trait]
impl hickory_server::server::RequestHandler for SharedHandler {
    async fn handle_request<
        R: hickory_server::server::ResponseHandler,
        T: hickory_server::net::runtime::Time,
    >(
        &self,
        request: &hickory_server::server::Request,
        response_handle: R,
    ) -> hickory_server::server::ResponseInfo {
        self.0
            .handle_request::<R, T>(request, response_handle)
            .await
    }
}

/// Bind UDP and TCP to the same address; with port 0, retry until both get the same port.
pub(crate) async fn bind_pair(listen: SocketAddr) -> Result<(UdpSocket, TcpListener), DnsError> {
    let mut last = None;
    for _ in 0..if listen.port() == 0 { 32 } else { 1 } {
        let udp = UdpSocket::bind(listen)
            .await
            .map_err(|source| DnsError::Bind {
                addr: listen,
                proto: "udp",
                source,
            })?;
        let bound = udp.local_addr().map_err(|source| DnsError::Bind {
            addr: listen,
            proto: "udp",
            source,
        })?;
        match TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(source) => {
                last = Some(DnsError::Bind {
                    addr: bound,
                    proto: "tcp",
                    source,
                })
            }
        }
    }
    Err(last.unwrap_or(DnsError::Serve("no bind attempt".into())))
}

/// The nameservers of the host's `/etc/resolv.conf` (empty when unreadable).
pub fn host_upstreams() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .map(|text| parse_resolv_conf(&text))
        .unwrap_or_default()
}
