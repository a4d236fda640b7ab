//! The UDP data path: one flow per client address, each with its own socket connected to the
//! chosen endpoint; replies go back through the listening socket, so the client sees them
//! come from the service address (directly in unprivileged mode; through the redirect's
//! reverse NAT in privileged mode). A flow ends after an idle timeout, and moves to another
//! endpoint at once when its endpoint is removed (the userspace twin of UDP conntrack
//! cleanup).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use svcnet_lb::Flow;
use svcnet_proxy::Protocol;
use tokio::net::UdpSocket;

use crate::proxy::Shared;
use crate::state::{EndpointState, now_ms};
use crate::table::RouteKey;
use crate::tcp::{Active, choose};

struct UdpFlow {
    upstream: Arc<UdpSocket>,
    ep: Arc<EndpointState>,
    active: Arc<Active>,
    last: AtomicU64,
}

type Flows = Arc<Mutex<HashMap<SocketAddr, Arc<UdpFlow>>>>;

pub(crate) async fn serve(shared: Arc<Shared>, key: RouteKey, sock: std::net::UdpSocket) {
    let sock = match UdpSocket::from_std(sock) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::error!(route = ?key, "cannot register a UDP socket: {e}");
            return;
        }
    };
    let flows: Flows = Arc::default();
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, client) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(route = ?key, "UDP receive failed: {e}");
                continue;
            }
        };
        let existing = flows.lock().ok().and_then(|f| f.get(&client).cloned());
        let flow = match existing {
            Some(f) if !f.ep.removed.load(Ordering::Relaxed) => f,
            _ => match open(&shared, &key, &sock, &flows, client).await {
                Some(f) => f,
                None => continue,
            },
        };
        flow.last.store(now_ms(), Ordering::Relaxed);
        if flow.upstream.send(&buf[..n]).await.is_ok() {
            flow.active.bytes(n as u64, 0);
        }
    }
}

async fn open(
    shared: &Arc<Shared>,
    key: &RouteKey,
    sock: &Arc<UdpSocket>,
    flows: &Flows,
    client: SocketAddr,
) -> Option<Arc<UdpFlow>> {
    let destination = sock.local_addr().ok()?;
    let route = shared
        .table
        .load()
        .routes
        .get(key)
        .cloned()?
        .for_client(client.ip(), || Some(destination.ip()));
    let i = choose(
        shared,
        &route,
        &Flow {
            client,
            destination,
        },
        &[],
        Protocol::Udp,
    )?;
    let ep = route.endpoints[i].clone();
    let upstream = match shared
        .sockets
        .connect_udp(ep.addr, shared.config.upstream_source)
        .await
    {
        Ok(u) => Arc::new(u),
        Err(e) => {
            tracing::debug!(endpoint = %ep.addr, "UDP socket failed: {e}");
            return None;
        }
    };
    if route.affinity.is_some() {
        route.service.affinity.set(client.ip(), ep.addr, now_ms());
    }
    let flow = Arc::new(UdpFlow {
        upstream: upstream.clone(),
        ep: ep.clone(),
        active: Arc::new(Active::new(ep, route.service.clone())),
        last: AtomicU64::new(now_ms()),
    });
    if let Ok(mut f) = flows.lock() {
        f.insert(client, flow.clone());
    }
    let (reply_flow, sock, flows) = (flow.clone(), sock.clone(), flows.clone());
    let idle = shared.config.udp_idle_timeout;
    let (mut rx, shared) = (shared.rejudge.clone(), shared.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        let evicted = crate::state::evicted(reply_flow.ep.eviction());
        tokio::pin!(evicted);
        loop {
            tokio::select! {
                r = tokio::time::timeout(idle, reply_flow.upstream.recv(&mut buf)) => match r {
                    Ok(Ok(n)) => {
                        reply_flow.last.store(now_ms(), Ordering::Relaxed);
                        if sock.send_to(&buf[..n], client).await.is_ok() {
                            reply_flow.active.bytes(0, n as u64);
                        }
                    }
                    // ICMP port unreachable from the endpoint and the like: end the flow, the
                    // next datagram opens a new one.
                    Ok(Err(_)) => break,
                    Err(_) => {
                        let quiet = now_ms().saturating_sub(reply_flow.last.load(Ordering::Relaxed));
                        if quiet >= idle.as_millis() as u64 {
                            break;
                        }
                    }
                },
                _ = &mut evicted => break,
                () = shared.denied_later(&mut rx, client.ip(), reply_flow.ep.addr, Protocol::Udp) => break,
            }
        }
        if let Ok(mut f) = flows.lock()
            && f.get(&client).is_some_and(|x| Arc::ptr_eq(x, &reply_flow))
        {
            f.remove(&client);
        }
    });
    Some(flow)
}
