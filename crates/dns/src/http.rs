//! The HTTP side of cluster DNS, as CoreDNS's `health`, `ready` and `prometheus` plugins serve
//! it (on one listener here): `/health` answers 200 `OK` while the process serves, `/ready`
//! 200 `OK` once the zone has synced with the API server and 503 naming `kubernetes` before,
//! `/metrics` the Prometheus text of `server::metrics`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

use crate::server::Observer;

#[derive(Clone)]
struct Shared {
    observer: Observer,
    synced: watch::Receiver<bool>,
}

async fn health() -> impl IntoResponse {
    (StatusCode::OK, "OK")
}

async fn ready(State(shared): State<Shared>) -> impl IntoResponse {
    if *shared.synced.borrow() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "kubernetes")
    }
}

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        shared.observer.metrics_text(),
    )
}

/// Binds `listen` and serves `/health`, `/ready` and `/metrics` in a task of `tasks` (it ends
/// when they are aborted); the bound address comes back (port 0 picks one).
pub(crate) async fn serve(
    listen: SocketAddr,
    observer: Observer,
    synced: watch::Receiver<bool>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<SocketAddr> {
    let router = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(Shared { observer, synced });
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    tasks.spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%addr, %error, "DNS HTTP endpoint stopped");
        }
    });
    Ok(addr)
}
