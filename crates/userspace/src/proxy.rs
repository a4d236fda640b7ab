//! The runtime: [`UserspaceProxy::sync`] turns the desired state into listeners, a new route
//! table (swapped atomically; the data path never locks it) and, in privileged mode, the
//! redirect rules; removed endpoints drain; [`UserspaceProxy::metrics`] reads the counters.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use svcnet_lb::{Backend, Balancer, Fallback};
use svcnet_libnft::NftExecutor;
use svcnet_proxy::{DesiredFamily, IpFamily, Protocol, ServicePortName};
use tokio::task::AbortHandle;

use crate::admission::{Admission, UpstreamSource};
use crate::error::UserspaceError;
use crate::rules;
use crate::socket::SocketFactory;
use crate::state::{
    EndpointMetrics, EndpointState, Route, ServiceMetrics, ServiceState, ShortCircuit, Table, load,
    now_ms,
};
use crate::table::{Class, ListenerKey, Mode, RouteKey, RouteSpec, Sources, routes};

/// Dataplane settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub mode: Mode,
    /// Program this named network namespace (`/run/netns/<name>`) instead of the current one:
    /// every socket and rule lives there.
    pub netns: Option<String>,
    /// Time allowed for one connect attempt.
    pub connect_timeout: Duration,
    /// Endpoints tried per connection before giving up.
    pub max_attempts: usize,
    /// Total time allowed for all attempts of one connection.
    pub connect_budget: Duration,
    /// How long an endpoint whose connect failed is avoided.
    pub backoff: Duration,
    /// How long established connections to a removed endpoint may continue.
    pub drain_timeout: Duration,
    /// A UDP client flow ends after this long without traffic.
    pub udp_idle_timeout: Duration,
    /// Maglev lookup table size (a prime).
    pub maglev_table_size: u32,
    /// Data-path threads, each a single-threaded event loop with its own listeners.
    pub workers: usize,
    /// Relay bulk TCP streams with `splice(2)` through pipes (Linux; no copy into the
    /// process). `false` copies them through the process (the only way elsewhere), for
    /// comparison.
    pub splice: bool,
    /// One `SO_REUSEPORT` listener per worker (the kernel spreads connections by hash)
    /// instead of one listening socket every worker accepts from (the default).
    pub reuseport: bool,
    /// Linux: TCP runs on svcnet's own edge-triggered epoll loops (the default there);
    /// `false` runs it on tokio, the portable path (and the only one elsewhere).
    pub event_loop: bool,
    /// First delay before a frontend that could not be bound is tried again; each failure
    /// doubles it, up to `bind_retry_max`.
    pub bind_retry: Duration,
    pub bind_retry_max: Duration,
    /// Judges each connection before it is opened (privileged mode under NetworkPolicy:
    /// [`crate::admission`]); none admits everything.
    pub admission: Option<Arc<dyn Admission>>,
    /// Where upstream connections into a network leave from ([`UpstreamSource`]).
    pub upstream_source: Option<UpstreamSource>,
}

impl Config {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            netns: None,
            connect_timeout: Duration::from_secs(1),
            max_attempts: 3,
            connect_budget: Duration::from_secs(3),
            backoff: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(60),
            udp_idle_timeout: Duration::from_secs(30),
            maglev_table_size: svcnet_lb::maglev::DEFAULT_TABLE_SIZE,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            splice: true,
            reuseport: false,
            event_loop: cfg!(target_os = "linux"),
            bind_retry: Duration::from_secs(1),
            bind_retry_max: Duration::from_secs(300),
            admission: None,
            upstream_source: None,
        }
    }
}

pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) table: ArcSwap<Table>,
    pub(crate) sockets: SocketFactory,
    /// The admission's [`Admission::rejudge`] (a sender-less channel when it has none).
    pub(crate) rejudge: tokio::sync::watch::Receiver<u64>,
}

impl Shared {
    /// Whether the admission still lets `client` reach `endpoint` (always without one).
    pub(crate) fn admits(
        &self,
        client: std::net::IpAddr,
        endpoint: SocketAddr,
        p: Protocol,
    ) -> bool {
        self.config
            .admission
            .as_ref()
            .is_none_or(|a| a.admits(client, endpoint, p))
    }

    /// Resolves once the admission, asked to judge again ([`Admission::rejudge`], seen
    /// through `rx`), denies `client` reaching `endpoint`; never without such a request.
    pub(crate) async fn denied_later(
        &self,
        rx: &mut tokio::sync::watch::Receiver<u64>,
        client: std::net::IpAddr,
        endpoint: SocketAddr,
        p: Protocol,
    ) {
        loop {
            if rx.changed().await.is_err() {
                // No sender: nothing will ask again.
                std::future::pending::<()>().await;
            }
            if !self.admits(client, endpoint, p) {
                return;
            }
        }
    }

    pub(crate) fn privileged(&self) -> bool {
        self.config.mode == Mode::Privileged
    }
}

struct Listener {
    port: u16,
    /// One accept loop per worker (UDP: one).
    tasks: Vec<AbortHandle>,
    /// The id it is registered under with the TCP event loops (Linux).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    looped: Option<u64>,
}

#[derive(Default)]
struct Registry {
    endpoints: HashMap<(ServicePortName, SocketAddr), Arc<EndpointState>>,
    services: HashMap<ServicePortName, Arc<ServiceState>>,
}

/// A wanted listener that could not be bound: retried with back-off, reported once.
#[derive(Clone)]
struct Unbound {
    addr: SocketAddr,
    protocol: &'static str,
    error: String,
    hint: Option<String>,
    attempts: u32,
    since: SystemTime,
    delay: Duration,
    next_try: Instant,
}

/// A frontend the proxy wants but could not bind (`UserspaceProxy::unbound`), for the health
/// and metrics endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnboundFrontend {
    pub addr: SocketAddr,
    pub protocol: &'static str,
    /// The last attempt's error.
    pub error: String,
    /// What to do about it (see `UserspaceError::hint`).
    pub hint: Option<String>,
    /// Failed attempts so far.
    pub attempts: u32,
    /// When the first attempt failed.
    pub since: SystemTime,
    /// Time until the next attempt.
    pub retry_in: Duration,
}

#[derive(Default)]
struct Control {
    listeners: BTreeMap<ListenerKey, Listener>,
    unbound: BTreeMap<ListenerKey, Unbound>,
    /// The families of the last sync, for retrying unbound listeners.
    last: Vec<DesiredFamily>,
    drains: HashMap<(ServicePortName, SocketAddr), AbortHandle>,
    programmed: BTreeSet<IpFamily>,
    next_listener: u64,
}

/// What one sync did that the runtime should report (log lines, Events on the Service).
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Algorithms the dataplane could not honour (never for userspace today).
    pub fallbacks: Vec<(ServicePortName, Fallback)>,
    /// Frontends that could not be bound (unprivileged mode: an address that is not local, a
    /// port below 1024 without the capability, a port in use); the rest of the sync applied.
    /// Only a listener's first failure is here (and logged, once, with its hint); later
    /// attempts, with back-off, show in [`UserspaceProxy::unbound`].
    pub bind_errors: Vec<UserspaceError>,
}

/// The userspace dataplane of one node.
pub struct UserspaceProxy {
    shared: Arc<Shared>,
    /// tokio runtimes: UDP, and TCP when it does not run on the event loops.
    workers: crate::workers::Workers,
    #[cfg(target_os = "linux")]
    loops: Option<crate::evloop::Loops>,
    control: tokio::sync::Mutex<Control>,
    registry: Mutex<Registry>,
    /// The unbound listeners as of the last sync, for readers that must not wait for one.
    unbound: ArcSwap<Vec<Unbound>>,
    /// The long-lived libnftables context of the redirect table (privileged mode), opened on
    /// first use in the configured namespace: no `nft` process per sync.
    nft: NftExecutor,
}

impl UserspaceProxy {
    /// Starts an empty dataplane (no listeners, no rules). Call inside a tokio runtime.
    pub fn new(config: Config) -> Result<Self, UserspaceError> {
        let sockets = SocketFactory::new(config.netns.as_deref())?;
        let looped = cfg!(target_os = "linux") && config.event_loop;
        // With TCP on the event loops, tokio is left only UDP, which one runtime serves.
        let runtimes = if looped { 1 } else { config.workers };
        let workers = crate::workers::Workers::start(runtimes, config.netns.as_deref())
            .map_err(|e| UserspaceError::Workers(e.to_string()))?;
        let nft = NftExecutor::new(config.netns.clone());
        let rejudge = config
            .admission
            .as_ref()
            .and_then(|a| a.rejudge())
            .unwrap_or_else(|| tokio::sync::watch::channel(0).1);
        let shared = Arc::new(Shared {
            config,
            table: ArcSwap::from_pointee(Table::default()),
            sockets,
            rejudge,
        });
        #[cfg(target_os = "linux")]
        let loops = looped
            .then(|| crate::evloop::Loops::start(&shared, shared.config.workers))
            .transpose()
            .map_err(|e| UserspaceError::Workers(e.to_string()))?;
        Ok(Self {
            workers,
            #[cfg(target_os = "linux")]
            loops,
            shared,
            control: tokio::sync::Mutex::new(Control::default()),
            registry: Mutex::new(Registry::default()),
            unbound: ArcSwap::from_pointee(Vec::new()),
            nft,
        })
    }

    /// Stops a listener's accept loops; its established connections live on.
    fn stop_listener(&self, l: &Listener) {
        for t in &l.tasks {
            t.abort();
        }
        #[cfg(target_os = "linux")]
        if let (Some(loops), Some(id)) = (&self.loops, l.looped) {
            loops.unlisten(id);
        }
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Applies a full desired state (every family the node serves). On an error from the
    /// kernel rules the previous rules and listeners stay in place, and a later sync retries.
    pub async fn sync(&self, families: &[DesiredFamily]) -> Result<SyncReport, UserspaceError> {
        let mut control = self.control.lock().await;
        let specs = routes(families, &self.shared.config.mode);
        let mut report = SyncReport::default();

        // 1. Listeners for new routes (existing ones are kept; their sockets never move).
        // One that failed before is tried again only when its back-off has passed.
        let wanted: BTreeSet<&ListenerKey> = specs.iter().flat_map(|s| &s.listeners).collect();
        control.unbound.retain(|k, _| wanted.contains(k));
        let now = Instant::now();
        for key in &wanted {
            if control.listeners.contains_key(*key)
                || control.unbound.get(*key).is_some_and(|u| now < u.next_try)
            {
                continue;
            }
            control.next_listener += 1;
            match self.listen(key, control.next_listener) {
                Ok(l) => {
                    if let Some(u) = control.unbound.remove(*key) {
                        tracing::info!(
                            "bound {} {} after {} failed attempts",
                            u.protocol,
                            key.bind.socket_addr(),
                            u.attempts
                        );
                    }
                    control.listeners.insert((*key).clone(), l);
                }
                Err(e) => self.bind_failed(&mut control, key, e, now, &mut report),
            }
        }
        self.unbound
            .store(Arc::new(control.unbound.values().cloned().collect()));

        // 2. The new table, reusing endpoint and service state across syncs.
        let table = self.build_table(&specs, &mut report)?;
        self.shared.table.store(Arc::new(table));

        // 3. Kernel rules (privileged): redirect frontends to the listeners' ports.
        if self.shared.privileged() {
            let mut ports: BTreeMap<RouteKey, u16> = BTreeMap::new();
            for (k, l) in &control.listeners {
                if wanted.contains(k) {
                    ports.insert(k.route.clone(), l.port);
                }
            }
            let mut fams: BTreeSet<IpFamily> = families.iter().map(|f| f.node.family).collect();
            fams.extend(control.programmed.iter().copied());
            for family in fams {
                let checks = families
                    .iter()
                    .find(|f| f.node.family == family)
                    .map(rules::NodeChecks::of)
                    .unwrap_or_default();
                let script = rules::render(family, &specs, &ports, &checks);
                nft(&self.nft, script).await?;
                control.programmed.insert(family);
            }
        }
        control.last = families.to_vec();

        // 4. Listeners nobody wants any more close; their established connections live on.
        control.listeners.retain(|k, l| {
            let keep = wanted.contains(k);
            if !keep {
                self.stop_listener(l);
            }
            keep
        });

        // 5. Endpoints gone from every route drain; returning ones are restored.
        self.drain_removed(&mut control, &specs);
        Ok(report)
    }

    /// Records a failed bind: the first failure of a listener is logged once with what to do
    /// and reported; later ones only lengthen its back-off.
    fn bind_failed(
        &self,
        control: &mut Control,
        key: &ListenerKey,
        e: UserspaceError,
        now: Instant,
        report: &mut SyncReport,
    ) {
        let max = self.shared.config.bind_retry_max;
        if let Some(u) = control.unbound.get_mut(key) {
            u.attempts += 1;
            u.delay = (u.delay * 2).min(max);
            u.next_try = now + u.delay;
            u.error = e.to_string();
            tracing::debug!(attempts = u.attempts, retry_in = ?u.delay, "{e}");
            return;
        }
        let delay = self.shared.config.bind_retry.min(max);
        let hint = e.hint();
        match &hint {
            Some(h) => tracing::warn!("{e}: {h}; retrying with back-off"),
            None => tracing::warn!("{e}; retrying with back-off"),
        }
        let protocol = match &e {
            UserspaceError::Bind { protocol, .. } => protocol,
            _ => key.protocol.as_str(),
        };
        control.unbound.insert(
            key.clone(),
            Unbound {
                addr: key.bind.socket_addr(),
                protocol,
                error: e.to_string(),
                hint,
                attempts: 1,
                since: SystemTime::now(),
                delay,
                next_try: now + delay,
            },
        );
        report.bind_errors.push(e);
    }

    /// The frontends wanted but not bound, with their last error and back-off.
    pub fn unbound(&self) -> Vec<UnboundFrontend> {
        let now = Instant::now();
        self.unbound
            .load()
            .iter()
            .map(|u| UnboundFrontend {
                addr: u.addr,
                protocol: u.protocol,
                error: u.error.clone(),
                hint: u.hint.clone(),
                attempts: u.attempts,
                since: u.since,
                retry_in: u.next_try.saturating_duration_since(now),
            })
            .collect()
    }

    /// Tries again the listeners whose back-off has passed (a sync of the last applied
    /// state); returns how long until the next one is due, `None` when every listener is
    /// bound. The runtime calls it on a timer, so retries need no other change.
    pub async fn retry_unbound(&self) -> Result<Option<Duration>, UserspaceError> {
        let now = Instant::now();
        if self.unbound.load().iter().any(|u| u.next_try <= now) {
            let last = self.control.lock().await.last.clone();
            self.sync(&last).await?;
        }
        let now = Instant::now();
        Ok(self
            .unbound
            .load()
            .iter()
            .map(|u| u.next_try.saturating_duration_since(now))
            .min())
    }

    // `id` names the listener to the Linux event loops.
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
    fn listen(&self, key: &ListenerKey, id: u64) -> Result<Listener, UserspaceError> {
        let addr = key.bind.socket_addr();
        let workers = self.workers.handles();
        #[cfg(target_os = "linux")]
        if let Some(loops) = &self.loops
            && key.protocol != Protocol::Udp
        {
            // One listening socket; every loop registers it, exclusively.
            let socket = self
                .shared
                .sockets
                .listen_tcp(addr, 1)?
                .pop()
                .ok_or_else(|| {
                    UserspaceError::bind(addr, "TCP", std::io::Error::other("no socket"))
                })?;
            let port = socket
                .local_addr()
                .map_err(|e| UserspaceError::bind(addr, "TCP", e))?
                .port();
            loops
                .listen(id, &key.route, &socket)
                .map_err(|e| UserspaceError::bind(addr, "TCP", e))?;
            tracing::debug!(route = ?key.route, %addr, port, "listening");
            return Ok(Listener {
                port,
                tasks: Vec::new(),
                looped: Some(id),
            });
        }
        let (port, tasks) = match key.protocol {
            Protocol::Udp => {
                let sock = self.shared.sockets.bind_udp(addr)?;
                let port = sock
                    .local_addr()
                    .map_err(|e| UserspaceError::bind(addr, "UDP", e))?
                    .port();
                let serve = crate::udp::serve(self.shared.clone(), key.route.clone(), sock);
                (port, vec![workers[0].spawn(serve).abort_handle()])
            }
            _ => {
                // One listening socket, registered with every worker's event loop (as nginx
                // and HAProxy share theirs): a connection is accepted by whichever worker is
                // free first, so a worker descheduled by other load on the machine holds up
                // no queue of its own (per-worker SO_REUSEPORT queues measured a worse
                // p50/p99 under load, see the README).
                let listeners = if self.shared.config.reuseport {
                    self.shared.sockets.listen_tcp(addr, workers.len())?
                } else {
                    let shared = self.shared.sockets.listen_tcp(addr, 1)?;
                    let mut v = Vec::with_capacity(workers.len());
                    for l in &shared {
                        for _ in 0..workers.len() {
                            v.push(
                                l.try_clone()
                                    .map_err(|e| UserspaceError::bind(addr, "TCP", e))?,
                            );
                        }
                    }
                    v
                };
                let port = listeners
                    .first()
                    .and_then(|l| l.local_addr().ok())
                    .map_or(addr.port(), |a| a.port());
                let tasks = listeners
                    .into_iter()
                    .zip(workers)
                    .map(|(l, w)| {
                        let serve = crate::tcp::serve(self.shared.clone(), key.route.clone(), l);
                        w.spawn(serve).abort_handle()
                    })
                    .collect();
                (port, tasks)
            }
        };
        tracing::debug!(route = ?key.route, %addr, port, "listening");
        Ok(Listener {
            port,
            tasks,
            looped: None,
        })
    }

    fn build_table(
        &self,
        specs: &[RouteSpec],
        report: &mut SyncReport,
    ) -> Result<Table, UserspaceError> {
        let mut reg = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut table = Table::default();
        let now = now_ms();
        // Unprivileged mode: each port's short-circuit route (listed before its external
        // route), for the external route to hand pods and this host to.
        let unprivileged = matches!(self.shared.config.mode, Mode::Unprivileged { .. });
        let mut short: HashMap<(ServicePortName, IpFamily), Arc<Route>> = HashMap::new();
        for spec in specs {
            if let Some(f) = &spec.fallback {
                report.fallbacks.push((spec.key.service.clone(), f.clone()));
            }
            let backends: Vec<Backend> = spec
                .endpoints
                .iter()
                .map(|e| Backend {
                    addr: SocketAddr::new(e.ip, e.port),
                    weight: e.weight,
                })
                .collect();
            let balancer = Balancer::with_table_size(
                spec.algorithm,
                backends,
                self.shared.config.maglev_table_size,
            )
            .map_err(|source| UserspaceError::Maglev {
                service: spec.key.service.to_string(),
                source,
            })?
            .maglev_by_address_only(spec.affinity.is_some());
            let name = &spec.key.service;
            let endpoints = balancer
                .backends()
                .iter()
                .map(|b| {
                    reg.endpoints
                        .entry((name.clone(), b.addr))
                        .or_insert_with(|| Arc::new(EndpointState::new(b.addr)))
                        .clone()
                })
                .collect();
            // The pins live under the core's affinity key (the service port), shared by all
            // of the port's routes; a pin to an endpoint a route lacks is never followed.
            let state_key = spec.affinity.as_ref().map_or(name, |(_, key)| key);
            let service = reg.services.entry(state_key.clone()).or_default().clone();
            let affinity = spec
                .affinity
                .as_ref()
                .map(|(t, _)| Duration::from_secs(u64::from(*t)));
            if let Some(t) = affinity {
                service.affinity.expire(t, now);
            }
            let short_circuit = match &spec.sources {
                Sources::NotPodsOrNode(pods) if unprivileged => short
                    .get(&(spec.key.service.clone(), spec.key.family))
                    .map(|route| ShortCircuit {
                        pods: pods.clone(),
                        route: route.clone(),
                    }),
                _ => None,
            };
            let route = Arc::new(Route {
                key: spec.key.clone(),
                balancer,
                endpoints,
                no_endpoints: spec.no_endpoints,
                affinity,
                service,
                short_circuit,
            });
            if spec.key.class == Class::ShortCircuit {
                short.insert((spec.key.service.clone(), spec.key.family), route.clone());
            }
            table.routes.insert(spec.key.clone(), route);
        }
        Ok(table)
    }

    fn drain_removed(&self, control: &mut Control, specs: &[RouteSpec]) {
        let live: BTreeSet<(ServicePortName, SocketAddr)> = specs
            .iter()
            .flat_map(|s| {
                s.endpoints
                    .iter()
                    .map(|e| (s.key.service.clone(), SocketAddr::new(e.ip, e.port)))
            })
            .collect();
        let live_services: BTreeSet<&ServicePortName> =
            specs.iter().map(|s| &s.key.service).collect();
        let mut reg = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (key, ep) in &reg.endpoints {
            if live.contains(key) {
                if ep.removed.load(Ordering::Relaxed) {
                    ep.restore();
                }
                if let Some(d) = control.drains.remove(key) {
                    d.abort();
                }
                continue;
            }
            if ep.removed.swap(true, Ordering::Relaxed) {
                continue; // already draining
            }
            let (ep, drain) = (ep.clone(), self.shared.config.drain_timeout);
            #[cfg(target_os = "linux")]
            let sweeper = self.loops.as_ref().map(crate::evloop::Loops::sweeper);
            let task = tokio::spawn(async move {
                tokio::time::sleep(drain).await;
                ep.evict();
                // The event loops check evictions on their tick; tell them now.
                #[cfg(target_os = "linux")]
                if let Some(s) = sweeper {
                    s.sweep();
                }
            });
            control.drains.insert(key.clone(), task.abort_handle());
        }
        // Forget endpoints whose drain has finished (and services with nothing left).
        let finished: Vec<(ServicePortName, SocketAddr)> = control
            .drains
            .iter()
            .filter(|(_, t)| t.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        for k in finished {
            control.drains.remove(&k);
            reg.endpoints.remove(&k);
        }
        let draining: BTreeSet<&ServicePortName> = control.drains.keys().map(|(s, _)| s).collect();
        reg.services
            .retain(|s, _| live_services.contains(s) || draining.contains(s));
    }

    /// Connections being relayed now, over every service and endpoint (draining ones too):
    /// what a stopping proxy waits for (see [`UserspaceProxy::shutdown`]).
    pub fn active_connections(&self) -> u64 {
        let reg = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        reg.endpoints.values().map(|ep| load(&ep.active)).sum()
    }

    /// Counters per service port, with their endpoints (including draining ones).
    pub fn metrics(&self) -> Vec<ServiceMetrics> {
        let table = self.shared.table.load();
        let reg = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut algorithms: BTreeMap<&ServicePortName, svcnet_lb::Algorithm> = BTreeMap::new();
        for r in table.routes.values() {
            algorithms.insert(r.name(), r.algorithm());
        }
        let mut out: BTreeMap<ServicePortName, ServiceMetrics> = BTreeMap::new();
        for (name, svc) in &reg.services {
            let s = &svc.stats;
            out.insert(
                name.clone(),
                ServiceMetrics {
                    service: name.clone(),
                    algorithm: algorithms
                        .get(name)
                        .copied()
                        .unwrap_or(svcnet_lb::Algorithm::RoundRobin),
                    active: load(&s.active),
                    total: load(&s.total),
                    bytes_in: load(&s.bytes_in),
                    bytes_out: load(&s.bytes_out),
                    connect_failures: load(&s.connect_failures),
                    refused: load(&s.refused),
                    endpoints: Vec::new(),
                },
            );
        }
        let now = now_ms();
        for ((name, _), ep) in &reg.endpoints {
            if let Some(m) = out.get_mut(name) {
                m.endpoints.push(EndpointMetrics {
                    addr: ep.addr,
                    active: load(&ep.active),
                    total: load(&ep.total),
                    connect_failures: load(&ep.connect_failures),
                    bytes_in: load(&ep.bytes_in),
                    bytes_out: load(&ep.bytes_out),
                    down: ep.is_down(now),
                });
            }
        }
        out.into_values()
            .map(|mut m| {
                m.endpoints.sort_by_key(|e| e.addr);
                m
            })
            .collect()
    }

    /// The listener port of a route (privileged mode), for diagnostics and tests.
    pub async fn listener_ports(&self) -> BTreeMap<ListenerKey, u16> {
        let control = self.control.lock().await;
        control
            .listeners
            .iter()
            .map(|(k, l)| (k.clone(), l.port))
            .collect()
    }

    /// Stops every listener and removes the kernel rules this dataplane installed. Connections
    /// already relayed go on as long as this proxy lives (the caller may wait for
    /// [`UserspaceProxy::active_connections`] to reach zero: a mode switch drains them).
    pub async fn shutdown(&self) -> Result<(), UserspaceError> {
        let mut control = self.control.lock().await;
        for (_, l) in std::mem::take(&mut control.listeners) {
            self.stop_listener(&l);
        }
        for (_, d) in std::mem::take(&mut control.drains) {
            d.abort();
        }
        self.shared.table.store(Arc::new(Table::default()));
        let programmed = std::mem::take(&mut control.programmed);
        for family in programmed {
            nft(&self.nft, rules::delete(family)).await?;
        }
        Ok(())
    }
}

impl Drop for UserspaceProxy {
    fn drop(&mut self) {
        for l in std::mem::take(&mut self.control.get_mut().listeners).values() {
            self.stop_listener(l);
        }
        let control = self.control.get_mut();
        for d in control.drains.values() {
            d.abort();
        }
        // Best effort when `shutdown` was not called: never leave redirects to closed ports.
        for family in std::mem::take(&mut control.programmed) {
            let _ = nft_blocking(&self.nft, &rules::delete(family));
        }
    }
}

/// Removes svcnet-userspace's tables (`svcnet proxy --cleanup`); absent tables are fine.
pub fn cleanup(netns: Option<&str>) {
    let exec = NftExecutor::new(netns.map(str::to_string));
    for family in IpFamily::ALL {
        let _ = nft_blocking(&exec, &rules::delete(family));
    }
}

/// Runs one batch of the redirect table's commands (atomic, as `nft -f` reads a file).
fn nft_blocking(exec: &NftExecutor, script: &str) -> Result<(), UserspaceError> {
    exec.command(script)
        .map(|_| ())
        .map_err(|source| UserspaceError::Nft {
            netns: exec.netns().map(str::to_string),
            source,
        })
}

async fn nft(exec: &NftExecutor, script: String) -> Result<(), UserspaceError> {
    // Clones share the context; the call blocks on its thread's answer.
    let exec = exec.clone();
    tokio::task::spawn_blocking(move || nft_blocking(&exec, &script))
        .await
        .map_err(|e| UserspaceError::Workers(format!("applying the redirect table: {e}")))?
}
