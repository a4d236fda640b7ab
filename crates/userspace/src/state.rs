//! Live state the data path reads and updates without locks: per-endpoint counters and
//! back-off marks, per-service counters, and the immutable route table swapped on every sync.
//!
//! Counters and marks live in `Arc`s kept in a registry across syncs, so a new table keeps an
//! endpoint's active-connection count (which lc/sed/nq need) and its back-off mark.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use svcnet_lb::{Algorithm, Balancer, EndpointView};
use svcnet_proxy::{NoEndpointsVerdict, ServicePortName};
use tokio::sync::watch;

use crate::table::{Class, RouteKey};

/// Milliseconds since the process's first call (a monotonic clock that fits an atomic).
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// One endpoint of one service port: counters, back-off mark, removal/drain state.
#[derive(Debug)]
pub struct EndpointState {
    pub addr: SocketAddr,
    pub active: AtomicU64,
    pub total: AtomicU64,
    pub connect_failures: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Marked down until this time (`now_ms`), after a failed connect.
    down_until: AtomicU64,
    /// Not in the current table: new flows avoid it; UDP flows to it move at once.
    pub removed: AtomicBool,
    /// Becomes true when the drain timeout after removal passes: live connections close.
    evicted: watch::Sender<bool>,
}

impl EndpointState {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            active: AtomicU64::new(0),
            total: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            down_until: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            evicted: watch::channel(false).0,
        }
    }

    pub fn is_down(&self, now: u64) -> bool {
        self.down_until.load(Ordering::Relaxed) > now
    }

    pub fn mark_down(&self, backoff: Duration) {
        self.down_until
            .store(now_ms() + backoff.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn evict(&self) {
        self.evicted.send_replace(true);
    }

    pub fn restore(&self) {
        self.removed.store(false, Ordering::Relaxed);
        self.evicted.send_replace(false);
    }

    /// Whether the drain timeout after removal has passed.
    pub fn is_evicted(&self) -> bool {
        *self.evicted.borrow()
    }

    /// A receiver that resolves when the endpoint is evicted.
    pub fn eviction(&self) -> watch::Receiver<bool> {
        self.evicted.subscribe()
    }
}

/// Counters of one service port (both classes together).
#[derive(Debug, Default)]
pub struct ServiceStats {
    pub active: AtomicU64,
    pub total: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub connect_failures: AtomicU64,
    /// Connections that found no usable endpoint at all (refused).
    pub refused: AtomicU64,
    /// Per-service ticket counter for rr/wrr and tie rotation.
    pub ticket: AtomicU64,
}

/// ClientIP session affinity: client address → (endpoint, last use in `now_ms`).
#[derive(Debug, Default)]
pub struct Affinity {
    map: Mutex<HashMap<IpAddr, (SocketAddr, u64)>>,
}

impl Affinity {
    /// The endpoint a client is pinned to, if the pin is younger than `timeout`. The lock is
    /// held only for the map access, never across I/O.
    pub fn get(&self, client: IpAddr, timeout: Duration, now: u64) -> Option<SocketAddr> {
        let mut map = self.map.lock().ok()?;
        match map.get(&client) {
            Some((ep, at)) if now.saturating_sub(*at) < timeout.as_millis() as u64 => Some(*ep),
            Some(_) => {
                map.remove(&client);
                None
            }
            None => None,
        }
    }

    pub fn set(&self, client: IpAddr, endpoint: SocketAddr, now: u64) {
        if let Ok(mut map) = self.map.lock() {
            map.insert(client, (endpoint, now));
        }
    }

    /// Drops expired pins (called on sync, so the map stays bounded by active clients).
    pub fn expire(&self, timeout: Duration, now: u64) {
        if let Ok(mut map) = self.map.lock() {
            map.retain(|_, (_, at)| now.saturating_sub(*at) < timeout.as_millis() as u64);
        }
    }
}

/// Per-service state kept across syncs.
#[derive(Debug, Default)]
pub struct ServiceState {
    pub stats: ServiceStats,
    pub affinity: Affinity,
}

/// One immutable route: what a listener consults for each new connection.
#[derive(Debug)]
pub struct Route {
    pub key: RouteKey,
    pub balancer: Balancer,
    /// Aligned with `balancer.backends()`.
    pub endpoints: Vec<Arc<EndpointState>>,
    pub no_endpoints: Option<NoEndpointsVerdict>,
    pub affinity: Option<Duration>,
    pub service: Arc<ServiceState>,
    /// Unprivileged mode only (privileged mode splits sources in the kernel rules): the route
    /// that serves this one's clients that are pods or this host itself.
    pub short_circuit: Option<ShortCircuit>,
}

/// The core's `externalTrafficPolicy: Local` short-circuit, applied per connection where one
/// socket serves every source (unprivileged mode).
#[derive(Debug)]
pub struct ShortCircuit {
    /// Pod sources (the cluster CIDRs).
    pub pods: Vec<IpNet>,
    pub route: Arc<Route>,
}

impl Route {
    /// The route that serves a client at `peer` on this route's socket: the short-circuit
    /// route for pods and for this host (a loopback source, or the connection's own local
    /// address, which is what a host connecting to one of its addresses sends from); this
    /// route otherwise. `local` is only asked when there is a short-circuit.
    pub fn for_client(
        self: Arc<Self>,
        peer: IpAddr,
        local: impl FnOnce() -> Option<IpAddr>,
    ) -> Arc<Route> {
        match &self.short_circuit {
            Some(sc)
                if sc.pods.iter().any(|n| n.contains(&peer))
                    || peer.is_loopback()
                    || local() == Some(peer) =>
            {
                sc.route.clone()
            }
            _ => self,
        }
    }

    pub fn name(&self) -> &ServicePortName {
        &self.key.service
    }

    pub fn class(&self) -> Class {
        self.key.class
    }

    pub fn algorithm(&self) -> Algorithm {
        self.balancer.algorithm()
    }

    pub fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.endpoints.iter().position(|e| e.addr == addr)
    }
}

/// The route table swapped atomically on each sync.
#[derive(Debug, Default)]
pub struct Table {
    pub routes: HashMap<RouteKey, Arc<Route>>,
}

/// The balancer's view of a route for one new flow: endpoints already tried for it and those
/// marked down are not eligible (unless every endpoint is down: then all are tried again,
/// rather than refusing a service that may have recovered).
pub struct FlowView<'a> {
    pub route: &'a Route,
    pub tried: &'a [usize],
    pub now: u64,
    pub all_down: bool,
}

impl<'a> FlowView<'a> {
    pub fn new(route: &'a Route, tried: &'a [usize], now: u64) -> Self {
        let all_down = route
            .endpoints
            .iter()
            .enumerate()
            .all(|(i, e)| tried.contains(&i) || e.is_down(now));
        Self {
            route,
            tried,
            now,
            all_down,
        }
    }
}

impl EndpointView for FlowView<'_> {
    fn eligible(&self, i: usize) -> bool {
        !self.tried.contains(&i) && (self.all_down || !self.route.endpoints[i].is_down(self.now))
    }

    fn active(&self, i: usize) -> u32 {
        self.route.endpoints[i].active.load(Ordering::Relaxed) as u32
    }
}

/// A point-in-time copy of one endpoint's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointMetrics {
    pub addr: SocketAddr,
    pub active: u64,
    pub total: u64,
    pub connect_failures: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub down: bool,
}

/// A point-in-time copy of one service port's counters (for the runtime's Prometheus
/// exporter: gauges `active`, counters for the rest, labelled by service and endpoint).
/// `bytes_in` flows client → endpoint, `bytes_out` endpoint → client; TCP bytes are counted
/// when a connection ends, UDP bytes per datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceMetrics {
    pub service: ServicePortName,
    pub algorithm: Algorithm,
    pub active: u64,
    pub total: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub connect_failures: u64,
    pub refused: u64,
    pub endpoints: Vec<EndpointMetrics>,
}

pub(crate) fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// Resolves once the endpoint behind `rx` is evicted (never, if its state is dropped).
pub async fn evicted(mut rx: watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
