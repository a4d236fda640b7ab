//! NetworkPolicy enforcement on one node: watches NetworkPolicies, pods and namespaces,
//! builds the evaluator's model from them (`svcnet-netpol`), renders the node's table
//! (`svcnet-netpol-nft`) and applies each change as one incremental transaction in the
//! node's namespace. The agent calls [`NodeNetpol`]'s [`BeforeStart`] hook between a pod's
//! sandbox and its first container: the pod's address is put in the model at once and the
//! hook returns once a sync holding it is live, so a pod a policy selects is never open.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use svcnet_agent::BeforeStart;
use svcnet_libnft::NftExecutor;
use svcnet_netpol::Cluster;
use svcnet_netpol_nft::{Enforcer, Options, Renderer, conntrack};
use tokio::sync::{Notify, watch};

/// How long a pod waits for its isolation before starting anyway (enforcement is broken:
/// the failure is logged on every sync).
const ADMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Admitted pods the API has not shown yet are forgotten after this.
const ADMITTED_TTL: Duration = Duration::from_secs(60);

/// One node's enforcement, shared by its sync loop and the agent's pod workers.
#[derive(Debug)]
pub struct NodeNetpol {
    node: String,
    netns: String,
    /// Also cut existing flows a change denies (conntrack).
    cut_existing: bool,
    /// Pods whose address the agent reported before the API shows it, by uid.
    admitted: Mutex<HashMap<String, (svcnet_netpol::Pod, Instant)>>,
    /// Bumped by every admission; the loop publishes the highest one its sync included.
    wanted: AtomicU64,
    applied: watch::Sender<u64>,
    wake: Notify,
}

impl NodeNetpol {
    pub fn new(node: &str, netns: &str, cut_existing: bool) -> Arc<Self> {
        Arc::new(Self {
            node: node.to_string(),
            netns: netns.to_string(),
            cut_existing,
            admitted: Mutex::default(),
            wanted: AtomicU64::new(0),
            applied: watch::channel(0).0,
            wake: Notify::new(),
        })
    }

    fn admitted(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (svcnet_netpol::Pod, Instant)>> {
        self.admitted.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BeforeStart for NodeNetpol {
    fn before_start<'a>(
        &'a self,
        pod: &'a Pod,
        ip: Ipv4Addr,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            let Some(mut model) = svcnet_netpol::Pod::from_k8s(pod) else {
                return;
            };
            model.ips = vec![IpAddr::V4(ip)];
            model.node = Some(self.node.clone());
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            self.admitted().insert(uid, (model, Instant::now()));
            let generation = self.wanted.fetch_add(1, Ordering::SeqCst) + 1;
            self.wake.notify_one();
            let mut applied = self.applied.subscribe();
            let live =
                tokio::time::timeout(ADMIT_TIMEOUT, applied.wait_for(|g| *g >= generation)).await;
            if !matches!(live, Ok(Ok(_))) {
                tracing::warn!(
                    node = %self.node,
                    pod = %format!("{}/{}", model_ns(pod), pod.metadata.name.as_deref().unwrap_or("")),
                    "NetworkPolicy enforcement did not confirm the pod's isolation in time; starting it"
                );
            }
        })
    }
}

fn model_ns(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Runs the node's enforcement until `shutdown`; the table stays (it dies with the node's
/// namespace, and a restart replaces it in its first transaction).
pub async fn run(
    client: Client,
    np: Arc<NodeNetpol>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut watches = tokio::task::JoinSet::new();
    let policies = start_store::<NetworkPolicy>(&client, &np, &mut watches);
    let pods = start_store::<Pod>(&client, &np, &mut watches);
    let namespaces = start_store::<Namespace>(&client, &np, &mut watches);
    // The watches end with this function (the JoinSet aborts them when dropped).
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut shutdown => return Ok(()),
        r = async {
            policies.wait_until_ready().await?;
            pods.wait_until_ready().await?;
            namespaces.wait_until_ready().await
        } => r?,
    }
    let netns = np.netns.clone();
    if let Err(e) =
        tokio::task::spawn_blocking(move || svcnet_netpol_nft::bridge_netfilter(Some(&netns)))
            .await?
    {
        tracing::warn!(node = %np.node, "{e}");
    }
    // The renderer keeps the model and its table and hands the enforcer only what each
    // change touched; both live in the blocking task's hands, one sync at a time.
    let node = Arc::new(Mutex::new((
        Renderer::new(&np.node, Options::default()),
        Enforcer::new(NftExecutor::new(Some(np.netns.clone()))),
    )));
    loop {
        let generation = np.wanted.load(Ordering::SeqCst);
        let cluster = model(&policies, &pods, &namespaces, &np);
        let (state, netns, name, cut) = (
            node.clone(),
            np.netns.clone(),
            np.node.clone(),
            np.cut_existing,
        );
        let synced = tokio::task::spawn_blocking(move || {
            let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
            let (renderer, enforcer) = &mut *state;
            renderer.update(&cluster);
            let changes = renderer.take_changes();
            let report = enforcer
                .sync_changes(renderer.ruleset(), &changes)
                .map_err(|err| err.to_string())?;
            if cut && report.ops > 0 {
                let flows = conntrack::list(Some(&netns)).map_err(|err| err.to_string())?;
                let denied = conntrack::denied(&cluster, &name, &[], &flows);
                conntrack::delete(Some(&netns), &denied).map_err(|err| err.to_string())?;
            }
            Ok::<_, String>(report)
        })
        .await?;
        match synced {
            Ok(report) => {
                if report.ops > 0 {
                    tracing::debug!(node = %np.node, ops = report.ops, full = report.full, took = ?report.took, "network policies synced");
                }
                np.applied.send_replace(generation);
            }
            Err(e) => {
                tracing::warn!(node = %np.node, "network policies: {e}; retrying with a full sync");
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = np.wake.notified() => {}
        }
        // Coalesce a burst of events (a namespace relabelled, a deployment scaled) into
        // one transaction.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A reflector store of `K` kept by a task that wakes the loop on every event.
fn start_store<K>(
    client: &Client,
    np: &Arc<NodeNetpol>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let api: Api<K> = Api::all(client.clone());
    let np = np.clone();
    tasks.spawn(async move {
        let mut events = reflector::reflector(
            writer,
            watcher::watcher(api, watcher::Config::default()).default_backoff(),
        )
        .boxed();
        while let Some(ev) = events.next().await {
            if let Err(e) = ev {
                tracing::debug!(node = %np.node, "network policy watch: {e}");
            }
            np.wake.notify_one();
        }
    });
    store
}

/// The evaluator's model from the stores, plus the pods the agent admitted before the API
/// shows their address.
fn model(
    policies: &Store<NetworkPolicy>,
    pods: &Store<Pod>,
    namespaces: &Store<Namespace>,
    np: &NodeNetpol,
) -> Cluster {
    let mut cluster = Cluster {
        namespaces: namespaces
            .state()
            .iter()
            .map(|n| svcnet_netpol::Namespace::from_k8s(n))
            .collect(),
        ..Cluster::default()
    };
    for p in policies.state() {
        match svcnet_netpol::Policy::from_k8s(&p) {
            Ok(policy) => cluster.policies.push(policy),
            Err(e) => tracing::warn!(node = %np.node, "skipping NetworkPolicy: {e}"),
        }
    }
    let mut admitted = np.admitted();
    let mut seen = std::collections::HashSet::new();
    for p in pods.state() {
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let Some(mut model) = svcnet_netpol::Pod::from_k8s(&p) else {
            admitted.remove(&uid);
            continue;
        };
        seen.insert(uid.clone());
        if model.ips.is_empty() {
            if let Some((early, _)) = admitted.get(&uid) {
                model.ips = early.ips.clone();
            }
        } else {
            admitted.remove(&uid);
        }
        cluster.pods.push(model);
    }
    // Admitted before the watch delivered the pod: kept for a while, then forgotten (the pod
    // was deleted before the API showed its address).
    admitted.retain(|uid, (_, at)| seen.contains(uid) || at.elapsed() < ADMITTED_TTL);
    for (uid, (model, _)) in admitted.iter() {
        if !seen.contains(uid) {
            cluster.pods.push(model.clone());
        }
    }
    cluster
}
