//! Watching the API server and publishing zone snapshots; the entry point [`start`]/[`run`].
//!
//! One kube-rs reflector per resource (Services, EndpointSlices, Namespaces, and Pods only for
//! `pods verified`). Every watch event wakes the publisher, which waits a short debounce (so a
//! burst of events becomes one rebuild), builds a new [`Zone`] from the stores off the async
//! threads, and swaps it in. Until every store has completed its first list nothing is
//! published, so the zone answers SERVFAIL rather than a premature NXDOMAIN.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::server::{DnsError, DnsServer, ZoneHandle, host_upstreams};
use crate::zone::{Objects, PodMode, Zone, ZoneConfig};

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
            }),
            upstreams: None,
            debounce: Duration::from_millis(5),
        }
    }
}

/// A DNS server kept in sync with an API server.
pub struct RunningDns {
    server: DnsServer,
    watchers: JoinSet<()>,
    synced: watch::Receiver<bool>,
}

impl RunningDns {
    /// The bound address (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
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
        zone_config,
        server.zone(),
        config.debounce,
        synced_tx,
    ));
    Ok(RunningDns {
        server,
        watchers,
        synced,
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
    config: Arc<ZoneConfig>,
    handle: ZoneHandle,
    debounce: Duration,
    synced: watch::Sender<bool>,
) {
    let notify = Arc::new(Notify::new());
    let mut tasks = JoinSet::new();
    let services = reflect(Api::<Service>::all(client.clone()), &notify, &mut tasks);
    let slices = reflect(
        Api::<EndpointSlice>::all(client.clone()),
        &notify,
        &mut tasks,
    );
    let namespaces = reflect(Api::<Namespace>::all(client.clone()), &notify, &mut tasks);
    let pods = (config.pods == PodMode::Verified)
        .then(|| reflect(Api::<Pod>::all(client.clone()), &notify, &mut tasks));

    let ready = async {
        services.wait_until_ready().await?;
        slices.wait_until_ready().await?;
        namespaces.wait_until_ready().await?;
        if let Some(pods) = &pods {
            pods.wait_until_ready().await?;
        }
        Ok::<_, reflector::store::WriterDropped>(())
    };
    if ready.await.is_err() {
        warn!("a watch ended before its first list; cluster DNS stays unsynced");
        return;
    }
    info!("cluster DNS synced with the API server");

    let mut last_warnings: Vec<String> = Vec::new();
    loop {
        let objects = Objects {
            services: services.state(),
            endpoint_slices: slices.state(),
            namespaces: namespaces.state(),
            pods: pods.as_ref().map(Store::state).unwrap_or_default(),
        };
        let cfg = config.clone();
        let serial = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        let Ok(zone) =
            tokio::task::spawn_blocking(move || Zone::build(cfg, &objects, serial)).await
        else {
            warn!("zone build panicked; keeping the previous zone");
            notify.notified().await;
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
        let _ = synced.send(true);
        notify.notified().await;
        tokio::time::sleep(debounce).await;
    }
}

/// A reflector for `api` whose every event wakes `notify`.
fn reflect<K>(api: Api<K>, notify: &Arc<Notify>, tasks: &mut JoinSet<()>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    let notify = notify.clone();
    tasks.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => notify.notify_one(),
                Err(error) => warn!(
                    kind = std::any::type_name::<K>(),
                    %error,
                    "watch error (retrying)"
                ),
            }
        }
    });
    reader
}
