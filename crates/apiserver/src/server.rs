//! The HTTPS front: accepts TCP connections, completes TLS (client certificates verified
//! against the cluster CA), requires a verified certificate or a bearer token for everything
//! but the health probes, and serves the router over HTTP/1.1 or HTTP/2. Each request carries
//! an [`crate::auth::Peer`] saying what the TLS layer verified.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config::ConnectionLimits;
use crate::status::ApiError;

/// How long in-flight requests get to finish on shutdown.
const DRAIN: Duration = Duration::from_secs(5);

fn is_probe(path: &str) -> bool {
    ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

/// Serves until `shutdown` fires, then drains connections for up to [`DRAIN`].
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: ConnectionLimits,
    router: Router,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut conns = JoinSet::new();
    let handshakes = Slots::new(limits.max_handshakes);
    let unauthenticated = Slots::new(limits.max_unauthenticated);
    let limits = Arc::new(limits);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Past the bound on handshakes in progress, the oldest one is closed: a real client
        // finishes its handshake in milliseconds, a flood's connections never do.
        let handshake = handshakes.take();
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let shutdown = shutdown.clone();
        let limits = limits.clone();
        let unauthenticated = unauthenticated.clone();
        conns.spawn(async move {
            let accepted = tokio::select! {
                a = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)) => a,
                _ = handshake.evicted() => {
                    tracing::debug!("closing {peer}: too many TLS handshakes in progress");
                    return;
                }
            };
            let tls = match accepted {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!("TLS handshake with {peer}: {e}");
                    return;
                }
                Err(_) => return,
            };
            drop(handshake);
            let cert_user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| crate::auth::user_from_cert(c.as_ref()));
            let authenticated = cert_user.is_some();
            let verified = crate::auth::Peer {
                cert_user,
                promote: CancellationToken::new(),
            };
            let promoted = verified.promote.clone();
            // A client without a certificate can only ask the probes: its connections are
            // counted (past the bound, the oldest is closed), and each lives a bounded time.
            let (slot, lifetime) = if authenticated {
                (None, None)
            } else {
                (
                    Some(unauthenticated.take()),
                    Some(limits.unauthenticated_lifetime),
                )
            };
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let router = router.clone();
                    let verified = verified.clone();
                    async move {
                        // Without a certificate, only the probes and requests bearing a token
                        // (checked by the router) get further.
                        if !authenticated
                            && !is_probe(req.uri().path())
                            && !crate::auth::has_bearer(req.headers())
                        {
                            return Ok::<_, std::convert::Infallible>(
                                ApiError::Unauthorized.into_response(),
                            );
                        }
                        let mut req = req.map(Body::new);
                        req.extensions_mut().insert(verified);
                        router.oneshot(req).await
                    }
                });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // Only clients without a certificate get a header deadline (it also bounds their
            // idle time between requests): an authenticated client's pooled connection must not
            // be closed under it while idle (kube-rs pools for 90 s), which would fail its next
            // request.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout((!authenticated).then_some(limits.header_timeout));
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(limits.http2_keepalive)
                .keep_alive_timeout(limits.http2_keepalive);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::pin!(conn);
            let expired = async {
                match (lifetime, &slot) {
                    (Some(d), Some(slot)) => {
                        tokio::select! {
                            _ = tokio::time::sleep(d) => {}
                            _ = slot.evicted() => {}
                            // A valid bearer token made it a client's connection: it lives
                            // as long as one with a certificate.
                            _ = promoted.cancelled() => std::future::pending::<()>().await,
                        }
                    }
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("connection from {peer}: {e}");
                    }
                }
                _ = expired => {
                    tracing::debug!("closing {peer}: unauthenticated connection lifetime over");
                }
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(DRAIN, conn.as_mut()).await;
                }
            }
        });
    }
    drop(listener);
    let drained =
        tokio::time::timeout(DRAIN, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
}

/// A bounded set of connections in one state (handshaking, unauthenticated). Taking a slot
/// when all are taken evicts the oldest holder: under a flood the newest connections get
/// their chance, so a real client's short handshake is not starved by connections that
/// never finish theirs.
struct Slots {
    cap: usize,
    held: std::sync::Mutex<(u64, std::collections::VecDeque<(u64, CancellationToken)>)>,
}

/// One taken slot; dropping it frees it.
struct Slot {
    slots: Arc<Slots>,
    id: u64,
    evict: CancellationToken,
}

impl Slots {
    fn new(cap: usize) -> Arc<Self> {
        Arc::new(Slots {
            cap: cap.max(1),
            held: std::sync::Mutex::new((0, std::collections::VecDeque::new())),
        })
    }

    fn take(self: &Arc<Self>) -> Slot {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (next, queue) = &mut *held;
        let id = *next;
        *next += 1;
        let evict = CancellationToken::new();
        queue.push_back((id, evict.clone()));
        while queue.len() > self.cap {
            if let Some((_, oldest)) = queue.pop_front() {
                oldest.cancel();
            }
        }
        Slot {
            slots: self.clone(),
            id,
            evict,
        }
    }
}

impl Slot {
    /// Resolves when a newer connection took this slot.
    async fn evicted(&self) {
        self.evict.cancelled().await
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = held.1.iter().position(|(id, _)| *id == self.id) {
            held.1.remove(i);
        }
    }
}
