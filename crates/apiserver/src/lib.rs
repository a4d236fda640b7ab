//! A Kubernetes-compatible API server over the embedded store, driven by unmodified `kubectl`
//! and kube-rs clients: discovery, OpenAPI v3 (enough for `kubectl apply` with validation on),
//! get/list/watch/create/update/patch/delete with resourceVersion semantics, Status errors,
//! Table output, garbage collection and namespace deletion, over HTTPS with client-certificate
//! and ServiceAccount-token authentication and RBAC authorization.
//!
//! Entry points: [`start`] binds, bootstraps and serves, returning a [`RunningServer`];
//! [`build_state`] + [`router`] give the same handlers in-process without TLS or
//! authentication (for tests that hand the router to `kube::Client::new`; such in-process
//! callers are trusted as `system:masters`).
//!
//! **Architecture Invariant:** every write goes through one atomic store read-modify-write
//! (`AppState::write`); a Service write also claims its cluster IPs and node ports in the
//! store's allocation ranges (compare-and-swap) before the Service is written and releases what
//! it gave up only after (`allocations`), so API servers sharing a store never hand out one
//! address twice. This crate never talks to the network beyond its own listener.
//!
//! Layout: `request` parses each HTTP request into a typed [`request::ApiRequest`];
//! `handlers`/`watch` implement the verbs; `logs` serves `pods/log` from
//! the files a [`LogSource`] locates; `protobuf` decodes kubectl's protobuf
//! bodies into JSON; `objects` owns metadata rules; `machinery` and
//! `admission` are the seams to the pure crates; `deletion` decides what a DELETE does
//! (finalizers, graceful pod deletion); `gc` deletes orphans and empties terminating
//! namespaces; `metrics` counts requests for `GET /metrics` and `metered` times the store's
//! operations; `bootstrap` creates the default namespaces and the `kubernetes` service; `tls`
//! makes the PKI and kubeconfig; `server` is the HTTPS front; `auth` authenticates,
//! impersonates and authorizes every request (tokens, RBAC, the default roles, the
//! `default` ServiceAccounts and the self-subject reviews).

mod admission;
mod allocations;
mod attach;
mod auth;
mod bootstrap;
mod config;
mod conversion;
mod deletion;
mod discovery;
mod exec;
mod execspdy;
mod gc;
mod handlers;
mod logformat;
mod logs;
mod machinery;
mod masterleases;
mod metered;
mod metrics;
mod objects;
mod openapi;
mod openapi_schemas;
mod ownership;
mod paging;
mod portforward;
mod protobuf;
mod registry;
pub mod request;
mod server;
mod spdy;
mod spdyconn;
mod state;
mod status;
mod tls;
mod watch;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use svcnet_store::{RedbStore, Store, StoreOptions};

pub use config::{AttachSource, AttachStarter, AttachTarget, Attached};
pub use config::{
    ConnectionLimits, ExecProcess, ExecSource, ExecStarter, ExecTarget, LogLocator, LogSource,
    LogTarget, PortDialer, PortForwardSource, PortForwardTarget, ServerConfig, Storage,
};
pub use registry::{RESOURCES, ResourceInfo};
pub use state::{AppState, SharedState};
pub use status::{ApiError, Cause};
#[cfg(feature = "etcd")]
pub use svcnet_store::{EtcdOptions, EtcdTls};

use request::ApiRequest;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("store: {0}")]
    Store(String),
    #[error("certificates: {0}")]
    Pki(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("bootstrap objects: {0}")]
    Bootstrap(String),
    #[error("server task: {0}")]
    Task(String),
}

impl ServerError {
    /// Whether the listen address was taken (the caller may pick another).
    pub fn is_addr_in_use(&self) -> bool {
        matches!(self, ServerError::Io { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse)
    }
}

/// Opens the store (in `cfg.data_dir`, or the etcd cluster of `cfg.storage`), rebuilds the
/// allocators and creates the bootstrap objects. `addr` is where clients reach the server (for the `kubernetes` service).
pub async fn build_state(cfg: ServerConfig, addr: SocketAddr) -> Result<SharedState, ServerError> {
    std::fs::create_dir_all(&cfg.data_dir).map_err(|source| ServerError::Io {
        what: format!("creating {}", cfg.data_dir.display()),
        source,
    })?;
    #[cfg(feature = "etcd")]
    let mut etcd_compactor: Option<svcnet_store::EtcdStore> = None;
    let storage = cfg.storage.clone();
    let store: Arc<dyn Store> = match &storage {
        Storage::Embedded => {
            let path = cfg.data_dir.join("store.redb");
            let options = StoreOptions {
                history: cfg.watch_history,
                durable: true,
                ..Default::default()
            };
            let store = tokio::task::spawn_blocking(move || RedbStore::open(&path, options))
                .await
                .map_err(|e| ServerError::Task(e.to_string()))?
                .map_err(|e| ServerError::Store(e.to_string()))?;
            Arc::new(store)
        }
        #[cfg(feature = "etcd")]
        Storage::Etcd(options) => {
            let store = svcnet_store::EtcdStore::connect(options.clone())
                .await
                .map_err(|e| ServerError::Store(e.to_string()))?;
            etcd_compactor = Some(store.clone());
            Arc::new(store)
        }
    };
    let state = AppState::new(store, cfg, addr).await?;
    #[cfg(feature = "etcd")]
    if let (Some(store), Storage::Etcd(options)) = (etcd_compactor, &storage)
        && !options.compaction_interval.is_zero()
    {
        // Stops with the server; several servers on one etcd compact once per interval.
        let stop = state.shutdown.clone().cancelled_owned();
        tokio::spawn(store.run_compactor(options.compaction_interval, stop));
    }
    bootstrap::run(&state)
        .await
        .map_err(|e| ServerError::Bootstrap(e.to_string()))?;
    auth::bootstrap::run(&state)
        .await
        .map_err(|e| ServerError::Bootstrap(e.to_string()))?;
    Ok(state)
}

/// The API as an axum router, without TLS or authentication (the caller provides both, or
/// uses it in-process).
pub fn router(state: SharedState) -> Router {
    Router::new().fallback(dispatch).with_state(state)
}

/// A started server. Dropping it does not stop it; call [`RunningServer::shutdown`].
pub struct RunningServer {
    addr: SocketAddr,
    kubeconfig: PathBuf,
    ca_pem: String,
    state: SharedState,
    task: tokio::task::JoinHandle<()>,
    gc: tokio::task::JoinHandle<()>,
    tls: Arc<rustls::ServerConfig>,
    /// The listeners of [`RunningServer::listen_also`].
    also: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningServer {
    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// `data_dir/kubeconfig`, for kubectl and kube-rs.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }
    /// The cluster CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
    /// The shared handler state (for in-process use alongside the HTTPS server).
    pub fn state(&self) -> SharedState {
        self.state.clone()
    }
    /// Stops accepting, ends watches, drains requests, and closes the store.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        self.state.shutdown.cancel();
        self.wait().await
    }
    /// Serves the same API on `addr` too, from now on until the server stops (`svcnet up`:
    /// the host's address on the node underlay, which exists only once the nodes do, so that
    /// pods and host-network pods reach the API). The serving certificate names the address
    /// when it was in [`ServerConfig::extra_sans`] (or is the advertised one).
    pub async fn listen_also(&mut self, addr: SocketAddr) -> Result<SocketAddr, ServerError> {
        let (listener, bound) = bind(addr).await?;
        self.also.push(tokio::spawn(server::serve(
            listener,
            self.tls.clone(),
            self.state.cfg.limits.clone(),
            router(self.state.clone()),
            self.state.shutdown.clone(),
        )));
        tracing::info!("API server also listening on https://{bound}");
        Ok(bound)
    }
    /// Waits until the server stops (after [`RunningServer::shutdown`] from elsewhere, or
    /// a fatal error).
    pub async fn wait(self) -> Result<(), ServerError> {
        let r1 = self.task.await;
        self.state.shutdown.cancel();
        for also in self.also {
            let _ = also.await;
        }
        let r2 = self.gc.await;
        drop(self.state);
        r1.and(r2).map_err(|e| ServerError::Task(e.to_string()))
    }
    /// A token that stops the server when cancelled (for signal handlers).
    pub fn shutdown_token(&self) -> tokio_util::sync::CancellationToken {
        self.state.shutdown.clone()
    }
}

/// A listener on `addr`, and the address it got (the real port for port 0).
async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), ServerError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Io {
            what: format!("binding {addr}"),
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| ServerError::Io {
        what: "reading the bound address".into(),
        source,
    })?;
    Ok((listener, bound))
}

/// Binds `cfg.listen`, prepares the data dir (store, PKI, kubeconfig) and starts serving.
/// Returns once the listener is bound and the bootstrap objects exist.
pub async fn start(cfg: ServerConfig) -> Result<RunningServer, ServerError> {
    // Installing the process-wide provider is harmless if someone else already did.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (listener, addr) = bind(cfg.listen).await?;
    let advertise = cfg.advertise_ip();
    let data_dir = cfg.data_dir.clone();
    let extra_sans: Vec<IpAddr> = cfg
        .extra_sans
        .iter()
        .copied()
        .chain(cfg.kubernetes_service_ip())
        .collect();
    // The PKI first: the bootstrap publishes the CA (`kube-root-ca.crt`) in every namespace.
    let pki = tls::ensure_pki(
        &data_dir.join("pki"),
        &tls::serving_sans(addr, advertise, &extra_sans),
    )?;
    let state = build_state(cfg, addr).await?;
    let tls_config = tls::server_tls(&pki)?;
    let host = if addr.ip().is_unspecified() {
        advertise
    } else {
        addr.ip()
    };
    let url = format!("https://{}", SocketAddr::new(host, addr.port()));
    let kubeconfig = tls::write_kubeconfig(&data_dir, &url, &pki)?;
    let gc = tokio::spawn({
        let (a, b) = (state.clone(), state.clone());
        async move {
            let (c, d) = (a.clone(), a.clone());
            tokio::join!(
                gc::run(a),
                auth::serviceaccounts::run(b),
                allocations::run(c),
                masterleases::run(d)
            );
        }
    });
    let task = tokio::spawn(server::serve(
        listener,
        tls_config.clone(),
        state.cfg.limits.clone(),
        router(state.clone()),
        state.shutdown.clone(),
    ));
    tracing::info!(
        "API server listening on {url}; kubeconfig at {}",
        kubeconfig.display()
    );
    Ok(RunningServer {
        addr,
        kubeconfig,
        ca_pem: pki.ca_pem,
        state,
        task,
        gc,
        tls: tls_config,
        also: Vec::new(),
    })
}

async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    // Bodies over the limit are read on (and discarded, up to a bound) before the 413 is sent,
    // so that a client still writing its body sees the Status instead of a reset connection.
    const DISCARD_BOUND: usize = 64 << 20;
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::BadRequest(format!("reading the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen <= limit {
                buf.extend_from_slice(&data);
            } else if seen > DISCARD_BOUND {
                break;
            }
        }
    }
    if seen > limit {
        return Err(ApiError::TooLarge(limit));
    }
    Ok(buf.freeze())
}

fn json(v: serde_json::Value) -> Response {
    handlers::json_response(StatusCode::OK, &v, &[])
}

/// Serves one request and records it in the metrics: at once, or for a long-running request
/// (a watch, logs, exec) when its response body ends.
async fn dispatch(State(state): State<SharedState>, req: Request) -> Response {
    let started = std::time::Instant::now();
    let parsed = request::parse(req.method(), req.uri());
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let info =
        metrics::RequestInfo::of(req.method(), req.uri(), content_type, parsed.as_ref().ok());
    if info.long_running {
        let resp = serve(state.clone(), req, parsed).await;
        let code = resp.status().as_u16();
        if !resp.status().is_success() {
            state.metrics.record(&info, code, started);
            return resp;
        }
        let guard = state.metrics.open_long_running(info, code, started);
        let (parts, body) = resp.into_parts();
        // The guard lives as long as the body: dropped when the stream ends or the client
        // goes away.
        let body = Body::from_stream(futures::StreamExt::map(body.into_data_stream(), move |c| {
            let _ = &guard;
            c
        }));
        return Response::from_parts(parts, body);
    }
    let resp = {
        let _inflight = state.metrics.inflight(info.mutating);
        serve(state.clone(), req, parsed).await
    };
    state.metrics.record(&info, resp.status().as_u16(), started);
    resp
}

async fn serve(state: SharedState, req: Request, parsed: Result<ApiRequest, ApiError>) -> Response {
    let (parts, body) = req.into_parts();
    let parsed = match parsed {
        Ok(p) => p,
        Err(e) => {
            // Read the body first, so the client is not reset while it is still sending.
            let _ = read_body(body, state.cfg.max_body_bytes).await;
            // A bad credential is a 401 before any route is looked at, as upstream.
            return match auth::authenticate(&state, &parts).await {
                Ok(_) => e.into_response(),
                Err(unauthorized) => unauthorized.into_response(),
            };
        }
    };
    let user = match auth::check(&state, &parts, &parsed).await {
        Ok(u) => u,
        Err(e) => {
            let _ = read_body(body, state.cfg.max_body_bytes).await;
            return e.into_response();
        }
    };
    // A stream (pods/exec) takes the request's parts for its upgrade; it has no body.
    let parsed = match parsed {
        ApiRequest::Resource(r) if r.verb == request::Verb::Connect => {
            let served = match r.subresource {
                Some(request::Subresource::PortForward) => {
                    portforward::serve(state.clone(), *r, parts).await
                }
                Some(request::Subresource::Attach) => attach::serve(state.clone(), *r, parts).await,
                _ => exec::serve(state.clone(), *r, parts).await,
            };
            return served.unwrap_or_else(IntoResponse::into_response);
        }
        other => other,
    };
    let get_only = |v: serde_json::Value| {
        if parts.method == Method::GET {
            json(v)
        } else {
            ApiError::MethodNotAllowed(format!("{} is not allowed here", parts.method))
                .into_response()
        }
    };
    let result: Result<Response, ApiError> = match parsed {
        ApiRequest::Probe => {
            return ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "ok").into_response();
        }
        ApiRequest::Version => Ok(get_only(discovery::version())),
        ApiRequest::CoreVersions => Ok(get_only(discovery::core_versions(&state.addr.to_string()))),
        ApiRequest::GroupList => Ok(get_only(discovery::group_list())),
        ApiRequest::Group(g) => discovery::group(&g).map(get_only),
        ApiRequest::ResourceList { group, version } => {
            discovery::resource_list(&group, &version).map(get_only)
        }
        ApiRequest::OpenApiIndex => Ok(get_only(openapi::index())),
        ApiRequest::Metrics if parts.method == Method::GET => {
            let text = state.render_metrics().await;
            return (
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                text,
            )
                .into_response();
        }
        ApiRequest::Metrics => Err(ApiError::MethodNotAllowed(format!(
            "{} is not allowed here",
            parts.method
        ))),
        ApiRequest::OpenApiGroupVersion { group, version } => {
            openapi::group_version(&group, &version).map(get_only)
        }
        ApiRequest::SelfReview { rules } => match read_body(body, state.cfg.max_body_bytes).await {
            Ok(bytes) => auth::reviews::self_review(&state, &user, &bytes, rules)
                .await
                .map(|v| handlers::json_response(StatusCode::CREATED, &v, &[])),
            Err(e) => Err(e),
        },
        ApiRequest::SelfSubjectReview => match read_body(body, state.cfg.max_body_bytes).await {
            Ok(bytes) => auth::reviews::whoami(&user, &bytes)
                .map(|v| handlers::json_response(StatusCode::CREATED, &v, &[])),
            Err(e) => Err(e),
        },
        ApiRequest::TokenRequest { namespace, name } => {
            match read_body(body, state.cfg.max_body_bytes).await {
                Ok(bytes) => auth::tokens::token_request(&state, &namespace, &name, &bytes)
                    .await
                    .map(|v| handlers::json_response(StatusCode::CREATED, &v, &[])),
                Err(e) => Err(e),
            }
        }
        ApiRequest::Resource(r) => match read_body(body, state.cfg.max_body_bytes).await {
            Ok(bytes) => {
                match auth::escalation::guard(&state, &user, &r, &parts.headers, &bytes).await {
                    Ok(()) => handlers::handle(state.clone(), *r, parts.headers, bytes).await,
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        },
    };
    result.unwrap_or_else(IntoResponse::into_response)
}
