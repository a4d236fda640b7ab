//! Health (`/healthz`, `/livez`, upstream's JSON shape) and Prometheus (`/metrics`) servers,
//! and the metrics themselves (named as kube-proxy's, prefix `kubeproxy_`).

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The proxy's metrics.
pub struct Metrics {
    pub registry: Registry,
    pub sync_duration: Histogram,
    pub sync_full_duration: Histogram,
    pub sync_partial_duration: Histogram,
    pub last_sync_timestamp: Gauge<f64, AtomicU64>,
    pub last_queued_timestamp: Gauge<f64, AtomicU64>,
    pub sync_failures: Counter,
    pub service_changes: Counter,
    pub endpoint_changes: Counter,
    pub service_changes_pending: Gauge,
    pub endpoint_changes_pending: Gauge,
    pub conntrack_deleted: Counter,
    /// Health-check node ports that could not be opened (see `healthcheck`).
    pub healthcheck_bind_failures: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kubeproxy");
        let hist = || Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let m = Self {
            registry: Registry::default(),
            sync_duration: hist(),
            sync_full_duration: hist(),
            sync_partial_duration: hist(),
            last_sync_timestamp: Gauge::default(),
            last_queued_timestamp: Gauge::default(),
            sync_failures: Counter::default(),
            service_changes: Counter::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            endpoint_changes_pending: Gauge::default(),
            conntrack_deleted: Counter::default(),
            healthcheck_bind_failures: Counter::default(),
        };
        registry.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency",
            m.sync_duration.clone(),
        );
        registry.register(
            "sync_full_proxy_rules_duration_seconds",
            "Full sync latency",
            m.sync_full_duration.clone(),
        );
        registry.register(
            "sync_partial_proxy_rules_duration_seconds",
            "Partial sync latency",
            m.sync_partial_duration.clone(),
        );
        registry.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "Last successful sync",
            m.last_sync_timestamp.clone(),
        );
        registry.register(
            "sync_proxy_rules_last_queued_timestamp_seconds",
            "Last queued change",
            m.last_queued_timestamp.clone(),
        );
        registry.register(
            "sync_proxy_rules_nftables_sync_failures",
            "Failed nft transactions",
            m.sync_failures.clone(),
        );
        registry.register(
            "sync_proxy_rules_service_changes",
            "Service changes",
            m.service_changes.clone(),
        );
        registry.register(
            "sync_proxy_rules_endpoint_changes",
            "Endpoint changes",
            m.endpoint_changes.clone(),
        );
        registry.register(
            "sync_proxy_rules_service_changes_pending",
            "Pending service changes",
            m.service_changes_pending.clone(),
        );
        registry.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "Pending endpoint changes",
            m.endpoint_changes_pending.clone(),
        );
        registry.register(
            "conntrack_stale_udp_entries_deleted",
            "Stale UDP conntrack entries deleted",
            m.conntrack_deleted.clone(),
        );
        registry.register(
            "service_healthcheck_bind_failures",
            "Health-check node ports that could not be opened",
            m.healthcheck_bind_failures.clone(),
        );
        Self { registry, ..m }
    }
}

/// What `/healthz` reports.
#[derive(Debug, Clone)]
pub struct Health {
    pub last_updated: Option<SystemTime>,
    /// When the oldest change not yet applied was queued.
    pub queued_since: Option<SystemTime>,
    /// False when the node is being deleted (so load balancers drain it).
    pub node_eligible: bool,
    /// A queued change older than this makes the proxy unhealthy.
    pub timeout: Duration,
}

impl Health {
    /// Whether the proxy keeps up with its changes (`/livez`; node eligibility not considered).
    pub fn is_healthy(&self, now: SystemTime) -> bool {
        let stale = self
            .queued_since
            .is_some_and(|q| now.duration_since(q).unwrap_or_default() > self.timeout);
        !stale && self.last_updated.is_some()
    }
}

/// Shared state of the HTTP servers.
#[derive(Clone)]
pub struct Shared {
    pub health: Arc<Mutex<Health>>,
    pub metrics: Arc<Metrics>,
    /// Userspace mode: its frontends that could not be bound show in the health answer.
    pub userspace: Option<Arc<svcnet_userspace::UserspaceProxy>>,
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The health answer's `unboundFrontends`: each frontend the userspace proxy could not bind,
/// with the error, what to do and its back-off (an empty list in the other modes).
fn unbound_json(s: &Shared) -> serde_json::Value {
    let Some(p) = &s.userspace else {
        return serde_json::Value::Array(Vec::new());
    };
    p.unbound()
        .into_iter()
        .map(|u| {
            serde_json::json!({
                "address": u.addr.to_string(),
                "protocol": u.protocol,
                "error": u.error,
                "hint": u.hint,
                "attempts": u.attempts,
                "since": rfc3339(u.since),
                "retryInSeconds": u.retry_in.as_secs_f64(),
            })
        })
        .collect()
}

fn health_response(
    s: &Shared,
    check_node: bool,
    unbound: serde_json::Value,
) -> impl IntoResponse + use<> {
    let h = s
        .health
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|p| p.into_inner().clone());
    let now = SystemTime::now();
    let healthy = h.is_healthy(now) && (!check_node || h.node_eligible);
    let body = serde_json::json!({
        "lastUpdated": h.last_updated.map(rfc3339).unwrap_or_default(),
        "currentTime": rfc3339(now),
        "nodeEligible": h.node_eligible,
        "unboundFrontends": unbound,
    });
    let code = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn healthz(State(s): State<Shared>) -> impl IntoResponse {
    health_response(&s, true, unbound_json(&s))
}

async fn livez(State(s): State<Shared>) -> impl IntoResponse {
    health_response(&s, false, unbound_json(&s))
}

async fn metrics(State(s): State<Shared>) -> impl IntoResponse {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &s.metrics.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}

/// Binds and serves `/healthz`, `/livez` (and `/metrics` when `with_metrics`) until the task is
/// aborted. Returns the bound address (port 0 picks one).
pub async fn serve(
    bind: SocketAddr,
    shared: Shared,
    with_metrics: bool,
    tasks: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<SocketAddr> {
    let mut router = Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez));
    if with_metrics {
        router = router.route("/metrics", get(metrics));
    }
    let router = router.with_state(shared);
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    tasks.spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::warn!("HTTP server on {addr}: {e}");
        }
    });
    Ok(addr)
}
