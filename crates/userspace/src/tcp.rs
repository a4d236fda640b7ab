//! The TCP data path: accept, recover the original destination, pick an endpoint (affinity,
//! then the service's algorithm), connect with bounded retries, then relay both directions
//! (`splice(2)` on Linux) with half-close until either side ends or the endpoint's drain
//! timeout passes.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use socket2::SockRef;
use svcnet_lb::Flow;
use svcnet_proxy::Protocol;
use tokio::net::{TcpListener, TcpStream};

use crate::proxy::Shared;
use crate::relay::{Moved, relay};
use crate::state::{EndpointState, FlowView, Route, ServiceState, now_ms};
use crate::table::RouteKey;

/// Endpoints tried per connection at most, whatever `max_attempts` says (kept on the stack).
pub(crate) const MAX_TRIED: usize = 8;

pub(crate) async fn serve(shared: Arc<Shared>, key: RouteKey, listener: std::net::TcpListener) {
    // Registered here, with the reactor of the worker that runs this loop.
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(route = ?key, "cannot register a listener: {e}");
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((client, peer)) => {
                let (shared, key) = (shared.clone(), key.clone());
                tokio::spawn(async move { handle(shared, key, client, peer).await });
            }
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(route = ?key, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Closes a client connection with a TCP RST (so the client fails at once).
pub(crate) fn reset<S: AsFd>(client: S) {
    let _ = SockRef::from(&client).set_linger(Some(Duration::ZERO));
    drop(client);
}

/// The flow a new connection is balanced by. Only destination hashing needs the original
/// destination; the system calls are skipped otherwise.
pub(crate) fn flow(shared: &Shared, route: &Route, client: &impl AsFd, peer: SocketAddr) -> Flow {
    let destination = if route.algorithm() == svcnet_lb::Algorithm::DestinationHash {
        shared
            .privileged()
            .then(|| crate::socket::original_dst(client))
            .flatten()
            .or_else(|| SockRef::from(client).local_addr().ok()?.as_socket())
            .unwrap_or(peer)
    } else {
        peer
    };
    Flow {
        client: peer,
        destination,
    }
}

/// A connect to endpoint `i` succeeded: with ClientIP affinity, the client is pinned to it.
pub(crate) fn pin(route: &Route, flow: &Flow, i: usize) {
    if route.affinity.is_some() {
        route
            .service
            .affinity
            .set(flow.client.ip(), route.endpoints[i].addr, now_ms());
    }
}

/// Counts a failed connect against the endpoint and its service, and marks the endpoint down
/// for `backoff`.
pub(crate) fn connect_failed(route: &Route, i: usize, backoff: Duration, e: &std::io::Error) {
    let ep = &route.endpoints[i];
    ep.connect_failures.fetch_add(1, Ordering::Relaxed);
    route
        .service
        .stats
        .connect_failures
        .fetch_add(1, Ordering::Relaxed);
    ep.mark_down(backoff);
    tracing::debug!(service = %route.name(), endpoint = %ep.addr, "connect failed, trying another endpoint: {e}");
}

/// Picks the next endpoint for a flow ([`balance`]), if the configured [`Admission`] lets the
/// client reach it; `None` when none is left or the pick is denied (then no other endpoint is
/// tried: a kernel dataplane's policy refuses the connection at the endpoint its DNAT chose).
///
/// [`Admission`]: crate::admission::Admission
pub(crate) fn choose(
    shared: &Shared,
    route: &Route,
    flow: &Flow,
    tried: &[usize],
    protocol: Protocol,
) -> Option<usize> {
    let i = balance(route, flow, tried)?;
    let endpoint = route.endpoints[i].addr;
    if !shared.admits(flow.client.ip(), endpoint, protocol) {
        tracing::debug!(client = %flow.client, %endpoint, "denied by network policy");
        return None;
    }
    Some(i)
}

/// The client's affinity pin if still usable, else the balancer's choice among endpoints not
/// yet tried and not marked down.
fn balance(route: &Route, flow: &Flow, tried: &[usize]) -> Option<usize> {
    let now = now_ms();
    if let Some(timeout) = route.affinity
        && let Some(addr) = route.service.affinity.get(flow.client.ip(), timeout, now)
        && let Some(i) = route.index_of(addr)
        && !tried.contains(&i)
        && !route.endpoints[i].is_down(now)
    {
        return Some(i);
    }
    let view = FlowView::new(route, tried, now);
    let ticket = route.service.stats.ticket.fetch_add(1, Ordering::Relaxed);
    route.balancer.pick(flow, ticket, &view, &mut rand::rng())
}

async fn connect(shared: &Shared, route: &Route, flow: &Flow) -> Option<(usize, TcpStream)> {
    let cfg = &shared.config;
    let deadline = Instant::now() + cfg.connect_budget;
    let mut tried = [0usize; MAX_TRIED];
    for k in 0..cfg.max_attempts.clamp(1, MAX_TRIED) {
        let i = choose(shared, route, flow, &tried[..k], Protocol::Tcp)?;
        tried[k] = i;
        let ep = &route.endpoints[i];
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match shared
            .sockets
            .connect_tcp(ep.addr, cfg.upstream_source, cfg.connect_timeout.min(left))
            .await
        {
            Ok(s) => {
                pin(route, flow, i);
                return Some((i, s));
            }
            Err(e) => connect_failed(route, i, cfg.backoff, &e),
        }
    }
    None
}

/// Counts a connection as active while it lives, whatever way it ends.
pub(crate) struct Active {
    ep: Arc<EndpointState>,
    service: Arc<ServiceState>,
}

impl Active {
    pub(crate) fn new(ep: Arc<EndpointState>, service: Arc<ServiceState>) -> Self {
        for c in [&ep.active, &ep.total] {
            c.fetch_add(1, Ordering::Relaxed);
        }
        for c in [&service.stats.active, &service.stats.total] {
            c.fetch_add(1, Ordering::Relaxed);
        }
        Self { ep, service }
    }

    pub(crate) fn bytes(&self, to_endpoint: u64, to_client: u64) {
        self.ep.bytes_in.fetch_add(to_endpoint, Ordering::Relaxed);
        self.ep.bytes_out.fetch_add(to_client, Ordering::Relaxed);
        let s = &self.service.stats;
        s.bytes_in.fetch_add(to_endpoint, Ordering::Relaxed);
        s.bytes_out.fetch_add(to_client, Ordering::Relaxed);
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.ep.active.fetch_sub(1, Ordering::Relaxed);
        self.service.stats.active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn handle(shared: Arc<Shared>, key: RouteKey, mut client: TcpStream, peer: SocketAddr) {
    // TCP_NODELAY: inherited from the listener on Linux; set where it is not.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = client.set_nodelay(true);
    let Some(route) = shared.table.load().routes.get(&key).cloned() else {
        reset(client);
        return;
    };
    let route = route.for_client(peer.ip(), || client.local_addr().ok().map(|a| a.ip()));
    let flow = flow(&shared, &route, &client, peer);
    let Some((i, mut upstream)) = connect(&shared, &route, &flow).await else {
        route.service.stats.refused.fetch_add(1, Ordering::Relaxed);
        reset(client);
        return;
    };
    let ep = route.endpoints[i].clone();
    let active = Active::new(ep.clone(), route.service.clone());
    drop(route);
    let evicted = crate::state::evicted(ep.eviction());
    let mut rx = shared.rejudge.clone();
    let denied = shared.denied_later(&mut rx, peer.ip(), ep.addr, Protocol::Tcp);
    let moved = Moved::default();
    let mut cut = false;
    tokio::select! {
        r = relay(&mut client, &mut upstream, &moved, shared.config.splice) => {
            if let Err(e) = r {
                tracing::trace!(endpoint = %ep.addr, "relay ended: {e}");
            }
        }
        _ = evicted => {
            tracing::debug!(endpoint = %ep.addr, "drain timeout passed, closing a connection");
        }
        () = denied => {
            tracing::debug!(client = %peer, endpoint = %ep.addr, "now denied, closing a connection");
            cut = true;
        }
    }
    active.bytes(
        moved.to_endpoint.load(Ordering::Relaxed),
        moved.to_client.load(Ordering::Relaxed),
    );
    if cut {
        reset(client);
        reset(upstream);
    }
}
