//! Watching the API server and publishing zone snapshots; the entry point [`start`]/[`run`].
//!
//! One kube-rs watcher per resource (Services, EndpointSlices, Namespaces, and Pods only for
//! `pods verified`) feeds a shared [`ZoneState`]: each event marks what it changed. The publisher
//! wakes on events, waits a short debounce (a burst of events becomes one snapshot), takes an
//! incremental snapshot (only changed services are re-indexed) and swaps it in. Until every
//! resource has completed its first list nothing is published, so the zone answers SERVFAIL
//! rather than a premature NXDOMAIN.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::server::{DnsError, DnsServer, ZoneHandle, host_upstreams};
use crate::zone::{PodMode, ServiceFacts, SliceFacts, ZoneConfig, ZoneState};

/// Everything `svcnet dns` (and `svcnet up`) configures.
#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// UDP and TCP listen address (`127.0.0.1:1053` in `svcnet up`; port 0 picks one).
    pub listen: SocketAddr,
    /// The zone: domain, TTL, pod mode, owned reverse ranges.
    pub zone: ZoneConfig,
    /// Upstream resolvers; `None` means the host's `/etc/resolv.conf` nameservers.
    pub upstreams: Option<Vec<SocketAddr>>,
    /// How long to gather watch events before rebuilding the zone.
    pub debounce: Duration,
    /// Where to serve `/health`, `/ready` and `/metrics` (CoreDNS's health, ready and
    /// prometheus plugins); `None`: not served.
    pub http: Option<SocketAddr>,
    /// CoreDNS's `labels EXPRESSION`: only Services, EndpointSlices and Pods matching this label
    /// selector are read (the selector goes to the API server with every list and watch).
    pub labels: Option<String>,
}

impl DnsConfig {
    /// Defaults: `cluster.local`, TTL 30, pods insecure, resolv.conf upstreams, 5 ms debounce.
    pub fn new(listen: SocketAddr) -> Self {
        DnsConfig {
            listen,
            // "cluster.local" is a valid name, so this cannot fail; fall back to the root anyway.
            zone: ZoneConfig::new("cluster.local").unwrap_or_else(|_| ZoneConfig {
                domain: hickory_proto::rr::Name::root(),
                ttl: 30,
                pods: PodMode::Insecure,
                reverse_cidrs: Vec::new(),
                dns_service: ("kube-system".into(), "kube-dns".into()),
                options: Default::default(),
                external: None,
            }),
            upstreams: None,
            debounce: Duration::from_millis(5),
            http: None,
            labels: None,
        }
    }
}

/// A DNS server kept in sync with an API server.
pub struct RunningDns {
    server: DnsServer,
    watchers: JoinSet<()>,
    synced: watch::Receiver<bool>,
    http: Option<SocketAddr>,
}

impl RunningDns {
    /// The bound address (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Where `/health`, `/ready` and `/metrics` are served, if they are.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
    }

    /// The published zone (to inspect in tests).
    pub fn zone(&self) -> ZoneHandle {
        self.server.zone()
    }

    /// Wait until the first complete sync has been published.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
    }

    /// Stop the watchers and the server.
    pub async fn shutdown(mut self) -> Result<(), DnsError> {
        self.watchers.shutdown().await;
        self.server.shutdown().await
    }
}

/// Bind the server and start watching through `client`; returns at once (answers are SERVFAIL
/// for the zone until [`RunningDns::wait_synced`] would return).
pub async fn start(config: DnsConfig, client: Client) -> Result<RunningDns, DnsError> {
    let zone_config = Arc::new(config.zone);
    let upstreams = config.upstreams.unwrap_or_else(host_upstreams);
    let server = DnsServer::start(config.listen, zone_config.clone(), upstreams).await?;
    info!(
        listen = %server.local_addr(),
        domain = %zone_config.domain,
        upstreams = ?server.upstreams(),
        "cluster DNS listening"
    );
    let (synced_tx, synced) = watch::channel(false);
    let mut watchers = JoinSet::new();
    watchers.spawn(publish_loop(
        client,
        config.labels,
        zone_config,
        server.zone(),
        config.debounce,
        synced_tx,
    ));
    let http = match config.http {
        Some(listen) => {
            let observer = server.observer();
            let addr = crate::http::serve(listen, observer, synced.clone(), &mut watchers)
                .await
                .map_err(|source| DnsError::Bind {
                    addr: listen,
                    proto: "http",
                    source,
                })?;
            info!(%addr, "cluster DNS /health, /ready and /metrics");
            Some(addr)
        }
        None => None,
    };
    Ok(RunningDns {
        server,
        watchers,
        synced,
        http,
    })
}

/// Run until `shutdown` completes: what `svcnet dns` does, and what `svcnet up` embeds.
pub async fn run(
    config: DnsConfig,
    client: Client,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DnsError> {
    let running = start(config, client).await?;
    shutdown.await;
    running.shutdown().await
}

async fn publish_loop(
    client: Client,
    labels: Option<String>,
    config: Arc<ZoneConfig>,
    handle: ZoneHandle,
    debounce: Duration,
    synced: watch::Sender<bool>,
) {
    let state = Arc::new(Mutex::new(ZoneState::new(config.clone())));
    let notify = Arc::new(Notify::new());
    let mut tasks = JoinSet::new();
    let selected = match &labels {
        Some(selector) => watcher::Config::default().labels(selector),
        None => watcher::Config::default(),
    };
    let mut listed = vec![
        track::<Service>(&client, selected.clone(), &state, &notify, &mut tasks),
        track::<Namespace>(
            &client,
            watcher::Config::default(),
            &state,
            &notify,
            &mut tasks,
        ),
    ];
    // `noendpoints`: CoreDNS does not watch endpoints at all.
    if !config.options.no_endpoints {
        listed.push(track::<EndpointSlice>(
            &client,
            selected.clone(),
            &state,
            &notify,
            &mut tasks,
        ));
    }
    if config.pods == PodMode::Verified {
        listed.push(track::<Pod>(&client, selected, &state, &notify, &mut tasks));
    }

    let mut last_warnings: Vec<String> = Vec::new();
    let mut announced = false;
    loop {
        notify.notified().await;
        tokio::time::sleep(debounce).await;
        // Nothing is published before every resource has completed its first list.
        if !listed.iter().all(|l| l.load(Ordering::Acquire)) {
            continue;
        }
        let serial = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
            .unwrap_or(1);
        let shared = state.clone();
        // The first snapshot indexes everything: keep it off the async threads.
        let Ok(Some(zone)) = tokio::task::spawn_blocking(move || {
            let mut state = shared.lock().ok()?;
            Some(state.snapshot(serial))
        })
        .await
        else {
            warn!("zone snapshot failed; keeping the previous zone");
            continue;
        };
        if zone.warnings() != last_warnings.as_slice() {
            for w in zone.warnings() {
                if !last_warnings.contains(w) {
                    warn!("{w}");
                }
            }
            last_warnings = zone.warnings().to_vec();
        }
        handle.publish(zone);
        if !announced {
            info!("cluster DNS synced with the API server");
            announced = true;
        }
        let _ = synced.send(true);
    }
}

/// How each watched kind feeds the state. Each object is reduced to what the state keeps of it
/// as it arrives (a relist's objects too), so whole API objects are never held beyond one.
trait Tracked:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    type Kept: Send + 'static;
    fn keep(config: &ZoneConfig, obj: Self) -> Option<Self::Kept>;
    fn upsert(state: &mut ZoneState, kept: Self::Kept);
    fn delete(state: &mut ZoneState, obj: &Self);
    fn replace(state: &mut ZoneState, all: Vec<Self::Kept>);
}

impl Tracked for Service {
    type Kept = ServiceFacts;
    fn keep(config: &ZoneConfig, obj: Self) -> Option<ServiceFacts> {
        ServiceFacts::new(config, &obj)
    }
    fn upsert(state: &mut ZoneState, kept: ServiceFacts) {
        state.upsert_service_facts(kept);
    }
    fn delete(state: &mut ZoneState, obj: &Self) {
        state.delete_service(obj);
    }
    fn replace(state: &mut ZoneState, all: Vec<ServiceFacts>) {
        state.replace_service_facts(all);
    }
}

impl Tracked for EndpointSlice {
    /// The facts, or the slice's namespace and name when it no longer names a service.
    type Kept = Result<SliceFacts, (String, String)>;
    fn keep(config: &ZoneConfig, obj: Self) -> Option<Self::Kept> {
        match SliceFacts::new(config, &obj) {
            Some(facts) => Some(Ok(facts)),
            None => Some(Err((
                obj.metadata.namespace.clone()?,
                obj.metadata.name.clone()?,
            ))),
        }
    }
    fn upsert(state: &mut ZoneState, kept: Self::Kept) {
        match kept {
            Ok(facts) => state.upsert_slice_facts(facts),
            Err((ns, name)) => state.forget_slice(&ns, &name),
        }
    }
    fn delete(state: &mut ZoneState, obj: &Self) {
        state.delete_slice(obj);
    }
    fn replace(state: &mut ZoneState, all: Vec<Self::Kept>) {
        state.replace_slice_facts(all.into_iter().filter_map(Result::ok));
    }
}

impl Tracked for Namespace {
    type Kept = Arc<Namespace>;
    fn keep(_: &ZoneConfig, obj: Self) -> Option<Self::Kept> {
        Some(Arc::new(obj))
    }
    fn upsert(state: &mut ZoneState, obj: Arc<Self>) {
        state.upsert_namespace(&obj);
    }
    fn delete(state: &mut ZoneState, obj: &Self) {
        state.delete_namespace(obj);
    }
    fn replace(state: &mut ZoneState, all: Vec<Arc<Self>>) {
        state.replace_namespaces(all);
    }
}

impl Tracked for Pod {
    type Kept = Arc<Pod>;
    fn keep(_: &ZoneConfig, obj: Self) -> Option<Self::Kept> {
        Some(Arc::new(obj))
    }
    fn upsert(state: &mut ZoneState, obj: Arc<Self>) {
        state.upsert_pod(&obj);
    }
    fn delete(state: &mut ZoneState, obj: &Self) {
        state.delete_pod(obj);
    }
    fn replace(state: &mut ZoneState, all: Vec<Arc<Self>>) {
        state.replace_pods(all);
    }
}

/// Watch every `K`, applying each event to `state` and waking `notify`. A relist (initial or
/// after a lost watch) is applied atomically at its end, so a snapshot never sees half a list.
/// The returned flag turns true after the first complete list.
fn track<K: Tracked>(
    client: &Client,
    watch_config: watcher::Config,
    state: &Arc<Mutex<ZoneState>>,
    notify: &Arc<Notify>,
    tasks: &mut JoinSet<()>,
) -> Arc<AtomicBool> {
    let listed = Arc::new(AtomicBool::new(false));
    let stream = watcher(Api::<K>::all(client.clone()), watch_config).default_backoff();
    let (state, notify, flag) = (state.clone(), notify.clone(), listed.clone());
    let config = state.lock().map(|s| s.config().clone()).ok();
    tasks.spawn(async move {
        let Some(config) = config else { return };
        let mut stream = std::pin::pin!(stream);
        let mut relist: Vec<K::Kept> = Vec::new();
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    warn!(kind = std::any::type_name::<K>(), %error, "watch error (retrying)");
                    continue;
                }
            };
            let Ok(mut st) = state.lock() else { return };
            match event {
                watcher::Event::Init => relist.clear(),
                watcher::Event::InitApply(obj) => relist.extend(K::keep(&config, obj)),
                watcher::Event::InitDone => {
                    K::replace(&mut st, std::mem::take(&mut relist));
                    flag.store(true, Ordering::Release);
                }
                watcher::Event::Apply(obj) => {
                    if let Some(kept) = K::keep(&config, obj) {
                        K::upsert(&mut st, kept);
                    }
                }
                watcher::Event::Delete(obj) => K::delete(&mut st, &obj),
            }
            drop(st);
            notify.notify_one();
        }
    });
    listed
}
