//! Health-check node ports: for every `externalTrafficPolicy: Local` load balancer with a
//! `healthCheckNodePort`, an HTTP server on that port of the node answers whether this node has
//! local endpoints for the service, so the cloud load balancer only sends traffic to nodes that
//! can serve it without a second hop (which would lose the client IP).
//!
//! The answer is upstream kube-proxy's (`pkg/proxy/healthcheck/service_health.go`), byte for
//! byte: any path, `Content-Type: application/json`, `X-Content-Type-Options: nosniff`,
//! `X-Load-Balancing-Endpoint-Weight: <local endpoints>`, 200 when there is at least one local
//! endpoint and the proxy itself is healthy, else 503, and a tab-indented JSON body
//! `{"service":{"namespace","name"},"localEndpoints":N,"serviceProxyHealthy":bool}`.
//!
//! [`HealthCheckServers`] reconciles the listeners after each sync: new ports are bound (inside
//! the node's network namespace when the proxy programs one: the listening socket is made on a
//! thread that entered the namespace, and a socket keeps its namespace), ports that went away
//! are closed, and count changes are published without rebinding. A port that cannot be bound
//! is logged, counted and reported as a Warning Event (`FailedToStartServiceHealthcheck`, as
//! upstream) and retried on the next sync; it never stops the proxy.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use socket2::{Domain, Protocol, Socket, Type};
use svcnet_proxy::{NamespacedName, ProxyState};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::serve::{Health, Metrics};

/// Reason of the Warning Event emitted when a health-check port cannot be opened (upstream's).
pub const EVENT_REASON: &str = "FailedToStartServiceHealthcheck";

/// One health-check server the node should run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub service: NamespacedName,
    pub port: u16,
    /// Endpoints of the service on this node (the answer's `localEndpoints`).
    pub local_endpoints: usize,
}

impl HealthCheck {
    /// The health checks the core's current state asks for.
    pub fn from_state(state: &ProxyState) -> Vec<Self> {
        state
            .health_checks()
            .into_iter()
            .map(|(service, port, local_endpoints)| Self {
                service,
                port,
                local_endpoints,
            })
            .collect()
    }
}

/// A health-check answer, before it is written to the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckResponse {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// What a health-check server answers for `service` (pure; upstream's exact shape).
pub fn response(
    service: &NamespacedName,
    local_endpoints: usize,
    proxy_healthy: bool,
) -> HealthCheckResponse {
    let status = if local_endpoints != 0 && proxy_healthy {
        200
    } else {
        503
    };
    // Upstream prints the names with Go's %q: for Kubernetes names (DNS labels) that is the
    // same as a JSON string, which is what serde_json writes.
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        quote(&service.namespace),
        quote(&service.name),
    );
    HealthCheckResponse {
        status,
        headers: vec![
            ("content-type", "application/json".to_string()),
            ("x-content-type-options", "nosniff".to_string()),
            (
                "x-load-balancing-endpoint-weight",
                local_endpoints.to_string(),
            ),
        ],
        body,
    }
}

impl IntoResponse for HealthCheckResponse {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let mut resp = (status, self.body).into_response();
        for (name, value) in self.headers {
            if let Ok(v) = HeaderValue::from_str(&value) {
                resp.headers_mut().insert(HeaderName::from_static(name), v);
            }
        }
        resp
    }
}

/// A port that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("node {node} failed to start healthcheck \"{service}\" on port {port}: {source}")]
pub struct BindError {
    pub node: String,
    pub service: NamespacedName,
    pub port: u16,
    pub source: io::Error,
}

/// What one server's handler reads on each request.
struct Served {
    service: NamespacedName,
    local_endpoints: AtomicUsize,
    health: Arc<Mutex<Health>>,
}

async fn handle(State(s): State<Arc<Served>>) -> HealthCheckResponse {
    let healthy = s
        .health
        .lock()
        .map(|h| h.is_healthy(SystemTime::now()))
        .unwrap_or(false);
    response(
        &s.service,
        s.local_endpoints.load(Ordering::Relaxed),
        healthy,
    )
}

/// The running servers of one service: one per address family, stopped on drop.
struct Instance {
    port: u16,
    served: Arc<Served>,
    addrs: Vec<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        // A keep-alive connection that outlives the listener answers "no endpoints".
        self.served.local_endpoints.store(0, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The health-check servers of one node.
pub struct HealthCheckServers {
    node: String,
    netns: Option<String>,
    health: Arc<Mutex<Health>>,
    instances: BTreeMap<NamespacedName, Instance>,
    binds: u64,
}

impl HealthCheckServers {
    /// Servers for `node`, listening inside the named network namespace when one is given.
    pub fn new(node: impl Into<String>, netns: Option<String>, health: Arc<Mutex<Health>>) -> Self {
        Self {
            node: node.into(),
            netns,
            health,
            instances: BTreeMap::new(),
            binds: 0,
        }
    }

    /// Makes the running servers match `desired`; returns the ports that could not be opened
    /// (they are retried on the next call). Must run inside a tokio runtime.
    pub async fn sync(&mut self, desired: &[HealthCheck]) -> Vec<BindError> {
        let wanted: BTreeMap<&NamespacedName, &HealthCheck> =
            desired.iter().map(|h| (&h.service, h)).collect();
        // Close servers of services that went away or moved to another port first, so a port
        // handed from one service to another can be rebound in the same sync.
        self.instances
            .retain(|name, inst| wanted.get(name).is_some_and(|h| h.port == inst.port));
        let mut to_bind = Vec::new();
        for hc in wanted.values() {
            match self.instances.get(&hc.service) {
                Some(inst) => inst
                    .served
                    .local_endpoints
                    .store(hc.local_endpoints, Ordering::Relaxed),
                None => to_bind.push((*hc).clone()),
            }
        }
        if to_bind.is_empty() {
            return Vec::new();
        }
        let ports: Vec<u16> = to_bind.iter().map(|h| h.port).collect();
        let netns = self.netns.clone();
        let bound = tokio::task::spawn_blocking(move || bind_in(netns.as_deref(), &ports))
            .await
            .unwrap_or_else(|e| Err(io::Error::other(format!("bind task failed: {e}"))));
        let results = match bound {
            Ok(r) => r,
            Err(e) => to_bind
                .iter()
                .map(|_| Err(io::Error::new(e.kind(), e.to_string())))
                .collect(),
        };
        let mut errors = Vec::new();
        for (hc, result) in to_bind.into_iter().zip(results) {
            match result.and_then(|ls| self.start(&hc, ls)) {
                Ok(inst) => {
                    tracing::info!(service = %hc.service, port = hc.port, addrs = ?inst.addrs, "health check server listening");
                    self.binds += 1;
                    self.instances.insert(hc.service.clone(), inst);
                }
                Err(source) => errors.push(BindError {
                    node: self.node.clone(),
                    service: hc.service,
                    port: hc.port,
                    source,
                }),
            }
        }
        errors
    }

    fn start(
        &self,
        hc: &HealthCheck,
        listeners: Vec<std::net::TcpListener>,
    ) -> io::Result<Instance> {
        let served = Arc::new(Served {
            service: hc.service.clone(),
            local_endpoints: AtomicUsize::new(hc.local_endpoints),
            health: self.health.clone(),
        });
        let mut inst = Instance {
            port: hc.port,
            served: served.clone(),
            addrs: Vec::new(),
            tasks: Vec::new(),
        };
        for l in listeners {
            let listener = tokio::net::TcpListener::from_std(l)?;
            let addr = listener.local_addr()?;
            let router = Router::new().fallback(handle).with_state(served.clone());
            let service = hc.service.clone();
            inst.addrs.push(addr);
            inst.tasks.push(tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, router).await {
                    tracing::warn!(%service, "health check server on {addr}: {e}");
                }
            }));
        }
        Ok(inst)
    }

    /// The addresses each service's server listens on.
    pub fn listening(&self) -> BTreeMap<NamespacedName, Vec<SocketAddr>> {
        self.instances
            .iter()
            .map(|(k, i)| (k.clone(), i.addrs.clone()))
            .collect()
    }

    /// How many servers were opened so far (a count update must not open one).
    pub fn binds(&self) -> u64 {
        self.binds
    }
}

/// Binds every port (inside `netns` when given), one result per port.
fn bind_in(
    netns: Option<&str>,
    ports: &[u16],
) -> io::Result<Vec<io::Result<Vec<std::net::TcpListener>>>> {
    let bind_all = || ports.iter().map(|p| bind_port(*p)).collect::<Vec<_>>();
    match netns {
        None => Ok(bind_all()),
        Some(name) => svcnet_netns::NetNs::open(name)
            .and_then(|ns| ns.run(bind_all))
            .map_err(io::Error::other),
    }
}

/// Listens on `0.0.0.0:port` and, where IPv6 is available, `[::]:port` (v6 only, so the two
/// do not collide whatever `net.ipv6.bindv6only` says). IPv4 is required; IPv6 is best effort.
fn bind_port(port: u16) -> io::Result<Vec<std::net::TcpListener>> {
    let mut out = vec![listen(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?];
    match listen(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))) {
        Ok(l) => out.push(l),
        Err(e) if matches!(e.raw_os_error(), Some(97 | 99)) => {
            // EAFNOSUPPORT / EADDRNOTAVAIL: no IPv6 in this namespace.
            tracing::debug!(port, "health check: no IPv6 listener: {e}");
        }
        Err(e) => return Err(e),
    }
    Ok(out)
}

fn listen(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    Ok(socket.into())
}

/// Runs `servers` until `updates` closes: reconciles on every update, counting failures in
/// `metrics` and reporting each as a Warning Event on the service when `recorder` is given.
pub async fn run(
    mut servers: HealthCheckServers,
    mut updates: watch::Receiver<Vec<HealthCheck>>,
    metrics: Arc<Metrics>,
    recorder: Option<Recorder>,
) {
    while updates.changed().await.is_ok() {
        let desired = updates.borrow_and_update().clone();
        for e in servers.sync(&desired).await {
            tracing::warn!("{e}");
            metrics.healthcheck_bind_failures.inc();
            if let Some(r) = &recorder {
                let event = Event {
                    type_: EventType::Warning,
                    reason: EVENT_REASON.into(),
                    note: Some(e.to_string()),
                    action: "Listen".into(),
                    secondary: None,
                };
                let regarding = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Service".into()),
                    namespace: Some(e.service.namespace.clone()),
                    name: Some(e.service.name.clone()),
                    ..Default::default()
                };
                if let Err(err) = r.publish(&event, &regarding).await {
                    tracing::debug!("publishing the {EVENT_REASON} event: {err}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_like_upstream() {
        let svc = NamespacedName::new("shop", "web");
        let r = response(&svc, 2, true);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.headers,
            vec![
                ("content-type", "application/json".to_string()),
                ("x-content-type-options", "nosniff".to_string()),
                ("x-load-balancing-endpoint-weight", "2".to_string()),
            ]
        );
        assert_eq!(
            r.body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "service": {"namespace": "shop", "name": "web"},
                "localEndpoints": 2,
                "serviceProxyHealthy": true,
            })
        );
    }

    #[test]
    fn no_local_endpoints_or_unhealthy_proxy_is_503() {
        let svc = NamespacedName::new("default", "lb");
        let none = response(&svc, 0, true);
        assert_eq!(none.status, 503);
        assert_eq!(none.headers[2].1, "0");
        assert!(
            none.body.contains("\"localEndpoints\": 0,"),
            "{}",
            none.body
        );
        let stale = response(&svc, 3, false);
        assert_eq!(stale.status, 503);
        assert_eq!(stale.headers[2].1, "3");
        assert!(
            stale.body.ends_with("\"serviceProxyHealthy\": false\n}"),
            "{}",
            stale.body
        );
    }

    #[tokio::test]
    async fn into_response_carries_status_headers_and_body() {
        let r = response(&NamespacedName::new("a", "b"), 1, true).into_response();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["content-type"], "application/json");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        assert_eq!(r.headers()["x-load-balancing-endpoint-weight"], "1");
    }
}
