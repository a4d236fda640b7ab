//! A node-local DNS cache, as Kubernetes' NodeLocal DNSCache (`node-cache`, CoreDNS with the
//! `cache` and `forward` plugins) runs it on every node.
//!
//! It listens on a few addresses of the node (the link-local 169.254.20.10 and the cluster DNS
//! service IP) and answers every question from its cache or by asking:
//! - names in the cluster domain, over TCP only (upstream's `force_tcp`), the cluster DNS at its
//!   real listener address (the service IP is the cache's own on the node), kept at most
//!   `success_ttl` (30 s by default) when positive and `denial_ttl` (5 s) when negative, as
//!   upstream's `cache { success 9984 30; denial 9984 5 }`;
//! - reverse names (`in-addr.arpa.`, `ip6.arpa.`), the cluster DNS over TCP too, kept at most
//!   30 s (upstream's `cache 30`);
//! - everything else, the upstream resolvers (UDP, TCP when truncated), kept at most 30 s.
//!
//! Each of the three is a [`Forwarder`] of `server::forward`, with its own cache. Prefetch is
//! off by default, as in upstream's Corefile: an entry is asked again on the first question
//! after it expires. With [`NodeLocalConfig::prefetch`] (CoreDNS's `cache { prefetch AMOUNT
//! DURATION PERCENTAGE% }`, see [`Prefetch`]) a popular entry is asked again in a task of its
//! own once little of its TTL is left, while its hits are still answered from the cache, so a
//! name asked for often is never a miss. A UDP question a forwarder's cache answered
//! once is answered again from the encoded bytes (`replay`), its ID and TTLs rewritten, with no
//! parsing or encoding, until the answer's smallest TTL runs out. Network setup (addresses, `notrack` rules)
//! is the caller's (`svcnet node-local-dns`); this module only serves.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::Name;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinSet;

use crate::replay::{Kept, ReplayCache};
use crate::server::forward::is_negative;
use crate::server::udp::{BATCH, MAX_REQUEST, next_batch, send_batch};
use crate::server::{
    DnsError, ForwardError, Forwarder, ForwarderOptions, Popular, Prefetch, Upstream,
};

/// Upstream's cap for the reverse zones and everything outside the cluster (`cache 30`).
const OTHER_TTL: u32 = 30;
/// How long an idle TCP client connection is kept.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Largest UDP answer sent, whatever the client advertises.
const MAX_UDP_PAYLOAD: u16 = 4096;

/// What a node-local cache serves and where it asks.
#[derive(Debug, Clone)]
pub struct NodeLocalConfig {
    /// Addresses to listen on (UDP and TCP each).
    pub listen: Vec<IpAddr>,
    /// Port on every address (53; 0 picks a free one per address, for tests).
    pub port: u16,
    /// The cluster DNS at its real listener address, asked over TCP.
    pub cluster_dns: SocketAddr,
    /// Resolvers for names outside the cluster domain and the reverse zones.
    pub upstreams: Vec<SocketAddr>,
    /// The cluster domain (`cluster.local`).
    pub cluster_domain: String,
    /// Cap on how long a positive cluster answer is kept (upstream: 30 s).
    pub success_ttl: u32,
    /// Cap on how long a negative cluster answer is kept (upstream: 5 s).
    pub denial_ttl: u32,
    /// How long one upstream gets to answer.
    pub timeout: Duration,
    /// Ask popular answers again before they expire (every zone's cache; `None`: off).
    pub prefetch: Option<Prefetch>,
}

/// Which forwarder a question goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Cluster,
    Reverse,
    Other,
}

impl Route {
    const ALL: [Route; 3] = [Route::Cluster, Route::Reverse, Route::Other];
}

struct Shared {
    cluster_domain: Name,
    forwarders: [Forwarder; 3],
    targets: [String; 3],
    requests: [AtomicU64; 2],
    /// UDP answers the forwarders' caches gave, as bytes (see `replay`).
    replay: ReplayCache,
}

/// A running node-local cache; stops when [`NodeLocalCache::shutdown`] is called or dropped.
pub struct NodeLocalCache {
    tasks: JoinSet<()>,
    local_addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NodeLocalCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLocalCache")
            .field("local_addrs", &self.local_addrs)
            .finish()
    }
}

impl NodeLocalCache {
    /// Bind every address (UDP and TCP) and serve. The sockets are made in the calling
    /// thread's network namespace.
    pub async fn start(config: NodeLocalConfig) -> Result<NodeLocalCache, DnsError> {
        let tcp_only = |max_ttl, max_negative_ttl| ForwarderOptions {
            timeout: config.timeout,
            force_tcp: true,
            max_ttl,
            max_negative_ttl,
            prefetch: config.prefetch,
        };
        let forwarders = [
            Forwarder::with_options(
                vec![config.cluster_dns],
                None,
                tcp_only(config.success_ttl, config.denial_ttl),
            ),
            Forwarder::with_options(
                vec![config.cluster_dns],
                None,
                tcp_only(OTHER_TTL, OTHER_TTL),
            ),
            Forwarder::with_options(
                config.upstreams.clone(),
                None,
                ForwarderOptions {
                    timeout: config.timeout,
                    force_tcp: false,
                    max_ttl: OTHER_TTL,
                    max_negative_ttl: OTHER_TTL,
                    prefetch: config.prefetch,
                },
            ),
        ];
        let mut cluster_domain = Name::from_ascii(&config.cluster_domain).map_err(|e| {
            DnsError::Serve(format!(
                "cluster domain {:?} is not a DNS name: {e}",
                config.cluster_domain
            ))
        })?;
        cluster_domain.set_fqdn(true);
        let targets = [
            format!("{} (tcp)", config.cluster_dns),
            format!("{} (tcp)", config.cluster_dns),
            config
                .upstreams
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ];
        let shared = Arc::new(Shared {
            cluster_domain: cluster_domain.to_lowercase(),
            forwarders,
            targets,
            requests: [AtomicU64::new(0), AtomicU64::new(0)],
            replay: ReplayCache::default(),
        });
        let mut tasks = JoinSet::new();
        let mut local_addrs = Vec::new();
        for ip in &config.listen {
            let (udp, tcp) = crate::server::bind_pair(SocketAddr::new(*ip, config.port)).await?;
            let addr = udp.local_addr().map_err(|source| DnsError::Bind {
                addr: SocketAddr::new(*ip, config.port),
                proto: "udp",
                source,
            })?;
            local_addrs.push(addr);
            tasks.spawn(serve_udp(Arc::new(udp), shared.clone()));
            tasks.spawn(serve_tcp(tcp, shared.clone()));
        }
        Ok(NodeLocalCache {
            tasks,
            local_addrs,
            shared,
        })
    }

    /// The bound addresses, in the order of `listen`.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// A cheap handle that renders the metrics (for the HTTP endpoint).
    pub fn observer(&self) -> NodeLocalObserver {
        NodeLocalObserver(self.shared.clone())
    }

    /// Stop serving.
    pub async fn shutdown(mut self) {
        self.tasks.shutdown().await;
    }
}

/// Reads a running cache's metrics.
#[derive(Clone)]
pub struct NodeLocalObserver(Arc<Shared>);

impl std::fmt::Debug for NodeLocalObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeLocalObserver")
    }
}

impl NodeLocalObserver {
    /// Prometheus text in CoreDNS's names: requests per protocol, and per zone the cache's
    /// hits (`success`/`denial`), misses and entries and the questions forwarded (`to`).
    pub fn metrics_text(&self) -> String {
        use std::fmt::Write as _;
        let shared = &self.0;
        let mut out = String::new();
        let _ = writeln!(out, "# TYPE coredns_dns_requests_total counter");
        for (proto, n) in ["udp", "tcp"].iter().zip(&shared.requests) {
            let _ = writeln!(
                out,
                "coredns_dns_requests_total{{proto=\"{proto}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        let zone = |route: Route| match route {
            Route::Cluster => shared.cluster_domain.to_string(),
            Route::Reverse => "arpa.".to_string(),
            Route::Other => ".".to_string(),
        };
        let stats: Vec<_> = Route::ALL
            .iter()
            .map(|r| (zone(*r), &shared.forwarders[*r as usize]))
            .collect();
        let _ = writeln!(out, "# TYPE coredns_cache_hits_total counter");
        for (zone, f) in &stats {
            let s = f.stats();
            for (kind, n) in [("success", s.hits_success), ("denial", s.hits_denial)] {
                let _ = writeln!(
                    out,
                    "coredns_cache_hits_total{{zone=\"{zone}\",type=\"{kind}\"}} {n}"
                );
            }
        }
        // A series with one value per zone.
        let per_zone = |out: &mut String, name: &str, kind: &str, value: fn(&Forwarder) -> u64| {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (zone, f) in &stats {
                let _ = writeln!(out, "{name}{{zone=\"{zone}\"}} {}", value(f));
            }
        };
        per_zone(&mut out, "coredns_cache_misses_total", "counter", |f| {
            f.stats().misses
        });
        per_zone(&mut out, "coredns_cache_entries", "gauge", |f| {
            f.cache_len() as u64
        });
        per_zone(&mut out, "coredns_cache_prefetch_total", "counter", |f| {
            f.stats().prefetches
        });
        let _ = writeln!(out, "# TYPE coredns_forward_requests_total counter");
        for (route, (zone, f)) in Route::ALL.iter().zip(&stats) {
            let _ = writeln!(
                out,
                "coredns_forward_requests_total{{zone=\"{zone}\",to=\"{}\"}} {}",
                shared.targets[*route as usize],
                f.stats().upstream_queries
            );
        }
        out
    }
}

impl Shared {
    fn route(&self, name: &Name) -> Route {
        let name = name.to_lowercase();
        if self.cluster_domain.zone_of(&name) {
            return Route::Cluster;
        }
        let arpa = |zone: &str| Name::from_ascii(zone).is_ok_and(|z| z.zone_of(&name));
        if arpa("in-addr.arpa.") || arpa("ip6.arpa.") {
            return Route::Reverse;
        }
        Route::Other
    }

    /// The request in `packet` and its one question, or what to send at once (`None`: drop).
    fn parse(&self, packet: &[u8]) -> Result<(Message, Query), Option<Vec<u8>>> {
        let request = match Message::from_vec(packet) {
            Ok(request) => request,
            Err(_) => {
                let id = packet
                    .get(..2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]))
                    .ok_or(None)?;
                let mut reply = Message::response(id, OpCode::Query);
                reply.metadata.response_code = ResponseCode::FormErr;
                return Err(reply.to_vec().ok());
            }
        };
        if request.metadata.message_type != MessageType::Query {
            return Err(None);
        }
        let query = match (request.metadata.op_code, request.queries.as_slice()) {
            (OpCode::Query, [query]) => query.clone(),
            (op_code, _) => {
                let mut reply = skeleton(&request);
                reply.metadata.response_code = if op_code == OpCode::Query {
                    ResponseCode::FormErr
                } else {
                    ResponseCode::NotImp
                };
                return Err(reply.to_vec().ok());
            }
        };
        Ok((request, query))
    }

    /// Asks again, in a task of its own, for the entry of forwarder `route` that a hit just
    /// made due for a prefetch.
    fn prefetch(self: &Arc<Self>, route: usize, popular: Popular) {
        let shared = self.clone();
        tokio::spawn(async move { shared.forwarders[route].prefetch(&popular).await });
    }

    /// Starts the prefetch that the hit `hit` of forwarder `route` made due, if it did.
    fn prefetch_if_due(self: &Arc<Self>, route: usize, hit: &Upstream) {
        if let (true, Some(popular)) = (hit.prefetch_due, &hit.popular) {
            self.prefetch(route, popular.clone());
        }
    }

    /// The answer to one datagram from the cache, without waiting, into `out` (replaced):
    /// `Ok(true)` when there is one to send, `Ok(false)` to drop the datagram, `Err(())` on a
    /// miss.
    fn answer_now(self: &Arc<Self>, packet: &[u8], out: &mut Vec<u8>) -> Result<bool, ()> {
        if let Some(kept) = self.replay.get_into(packet, out) {
            let forwarder = &self.forwarders[kept.route];
            forwarder.count_hit(kept.negative);
            if let Some(popular) = kept.popular
                && forwarder.note_hit(&popular)
            {
                self.prefetch(kept.route, popular);
            }
            return Ok(true);
        }
        let (request, query) = match self.parse(packet) {
            Ok(parsed) => parsed,
            Err(reply) => return Ok(replace(out, reply)),
        };
        let route = self.route(query.name()) as usize;
        let hit = self.forwarders[route]
            .resolve_cached(query.name(), query.query_type(), query.query_class())
            .ok_or(())?;
        let negative = is_negative(&hit.message);
        self.prefetch_if_due(route, &hit);
        let popular = hit.popular.clone();
        let reply = encode(&request, query, Ok(hit), true);
        if let Some(bytes) = &reply {
            let kept = Kept {
                route,
                negative,
                popular,
            };
            self.replay.put(packet, bytes, kept);
        }
        Ok(replace(out, reply))
    }

    /// The answer to one datagram or TCP message; `None` drops it (not a query, or too short
    /// to answer).
    async fn answer(self: &Arc<Self>, packet: &[u8], udp: bool) -> Option<Vec<u8>> {
        let (request, query) = match self.parse(packet) {
            Ok(parsed) => parsed,
            Err(reply) => return reply,
        };
        let route = self.route(query.name()) as usize;
        let result = self.forwarders[route]
            .resolve(query.name(), query.query_type(), query.query_class())
            .await;
        if let Ok(hit) = &result {
            self.prefetch_if_due(route, hit);
        }
        encode(&request, query, result, udp)
    }
}

/// `reply`, if any, as `out` (moved, not copied: it was just allocated); whether there was one.
fn replace(out: &mut Vec<u8>, reply: Option<Vec<u8>>) -> bool {
    match reply {
        Some(reply) => {
            *out = reply;
            true
        }
        None => false,
    }
}

/// A response to `request` with its ID, flags and EDNS, and nothing else yet.
fn skeleton(request: &Message) -> Message {
    let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
    reply.metadata.recursion_desired = request.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    if let Some(edns) = &request.edns {
        let mut ours = Edns::new();
        ours.set_max_payload(edns.max_payload().clamp(512, MAX_UDP_PAYLOAD));
        reply.set_edns(ours);
    }
    reply
}

/// The answer to `request` from what the forwarder gave, within the client's UDP size.
fn encode(
    request: &Message,
    query: Query,
    result: Result<Upstream, ForwardError>,
    udp: bool,
) -> Option<Vec<u8>> {
    let mut reply = skeleton(request);
    let name = query.name().clone();
    reply.add_query(query);
    match result {
        Ok(upstream) => {
            let m = upstream.message;
            reply.metadata.response_code = m.metadata.response_code;
            reply.metadata.authoritative = m.metadata.authoritative;
            reply.metadata.truncation = m.metadata.truncation;
            reply.answers = m.answers;
            reply.authorities = m.authorities;
            reply.additionals = m.additionals;
        }
        Err(ForwardError::NoUpstream) => reply.metadata.response_code = ResponseCode::Refused,
        Err(error) => {
            tracing::debug!(%name, %error, "node-local cache: forwarding failed");
            reply.metadata.response_code = ResponseCode::ServFail;
        }
    }
    let bytes = reply.to_vec().ok()?;
    let limit = if udp {
        request.edns.as_ref().map_or(512, |e| {
            usize::from(e.max_payload().clamp(512, MAX_UDP_PAYLOAD))
        })
    } else {
        usize::from(u16::MAX)
    };
    if bytes.len() <= limit {
        return Some(bytes);
    }
    // Too big for the client's buffer: the question and TC, so it asks again over TCP.
    reply.answers.clear();
    reply.authorities.clear();
    reply.additionals.clear();
    reply.metadata.truncation = true;
    reply.to_vec().ok()
}

/// Takes whatever datagrams are queued (up to `BATCH`) in one `recvmmsg`, as cluster DNS's UDP
/// path does, answers hits inline and sends their answers with one `sendmmsg`; only a miss
/// gets a task of its own.
async fn serve_udp(socket: Arc<UdpSocket>, shared: Arc<Shared>) {
    let mut bufs: Box<[[u8; MAX_REQUEST]; BATCH]> = Box::new([[0u8; MAX_REQUEST]; BATCH]);
    let mut received = Vec::with_capacity(BATCH);
    // The batch's answers, each buffer reused from batch to batch.
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    let mut answers: Vec<(Vec<u8>, SocketAddr)> = (0..BATCH)
        .map(|_| (Vec::with_capacity(512), unspecified))
        .collect();
    loop {
        if let Err(error) = next_batch(&socket, &mut bufs[..], &mut received).await {
            tracing::warn!(%error, "node-local cache: UDP receive failed");
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let mut ready = 0;
        for (buf, &(n, peer)) in bufs.iter().zip(&received) {
            shared.requests[0].fetch_add(1, Ordering::Relaxed);
            let Some(peer) = peer else { continue };
            let packet = &buf[..n];
            let (out, to) = &mut answers[ready];
            match shared.answer_now(packet, out) {
                Ok(true) => {
                    *to = peer;
                    ready += 1;
                    continue;
                }
                Ok(false) => continue,
                Err(()) => {}
            }
            let packet = packet.to_vec();
            let (socket, shared) = (socket.clone(), shared.clone());
            // A miss waits for the cluster DNS; other questions must not wait behind it.
            tokio::spawn(async move {
                if let Some(reply) = shared.answer(&packet, true).await {
                    let _ = socket.send_to(&reply, peer).await;
                }
            });
        }
        send_batch(&socket, &answers[..ready]).await;
    }
}

async fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_tcp_client(stream, shared.clone()));
            }
            Err(error) => {
                tracing::warn!(%error, "node-local cache: TCP accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn serve_tcp_client(mut stream: TcpStream, shared: Arc<Shared>) {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let mut packet = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if stream.read_exact(&mut packet).await.is_err() {
            return;
        }
        shared.requests[1].fetch_add(1, Ordering::Relaxed);
        let Some(reply) = shared.answer(&packet, false).await else {
            return;
        };
        let Ok(n) = u16::try_from(reply.len()) else {
            return;
        };
        if stream.write_all(&n.to_be_bytes()).await.is_err()
            || stream.write_all(&reply).await.is_err()
        {
            return;
        }
    }
}

/// Serve `/health` (200 `OK`) and `/metrics` on `listen` in a task of `tasks`; the bound
/// address comes back.
pub async fn serve_http(
    listen: SocketAddr,
    observer: NodeLocalObserver,
    tasks: &mut JoinSet<()>,
) -> std::io::Result<SocketAddr> {
    use axum::routing::get;
    let router = axum::Router::new()
        .route("/health", get(|| async { "OK" }))
        .route(
            "/metrics",
            get(move || {
                let text = observer.metrics_text();
                async move { text }
            }),
        );
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    tasks.spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%addr, %error, "node-local cache: HTTP endpoint stopped");
        }
    });
    Ok(addr)
}

#[cfg(test)]
#[path = "nodelocal_tests.rs"]
mod tests;
