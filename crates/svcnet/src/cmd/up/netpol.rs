//! NetworkPolicy enforcement on one node: watches NetworkPolicies, pods and namespaces,
//! builds the evaluator's model from them (`svcnet-netpol`), renders the node's table
//! (`svcnet-netpol-nft`) and applies each change as one incremental transaction in the
//! node's namespace. The agent calls [`NodeNetpol`]'s [`BeforeStart`] hook between a pod's
//! sandbox and its first container: the pod's address is put in the model at once and the
//! hook returns once a sync holding it is live, so a pod a policy selects is never open.
//!
//! Under the userspace proxy, which relays a Service connection from its own socket on the
//! node, the proxy judges each connection (client → the endpoint it chose) with
//! [`ProxyJudge`], from the model of the last applied sync, and the node's table leaves the
//! proxy's two legs to it (`Options::proxy_sources`: every node's `cni0` address, which the
//! proxies' upstream connections into the pod network leave from).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use svcnet_agent::{BeforeStart, NodeTopology};
use svcnet_libnft::NftExecutor;
use svcnet_netpol::{Cluster, Protocol, Verdict};
use svcnet_netpol_nft::{Enforcer, Options, Renderer, conntrack};
use svcnet_userspace::Admission;
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
    /// Userspace proxy mode: the addresses the nodes' proxies connect from (else empty).
    proxy_sources: Vec<IpAddr>,
    /// The node's addresses, for the node exception when existing flows are judged: its
    /// InternalIP and its `cni0` address (the source of its own connections to its pods).
    own: Vec<(String, IpAddr)>,
    /// What the userspace proxy asks; fed by every applied sync.
    judge: Arc<ProxyJudge>,
    /// Pods whose address the agent reported before the API shows it, by uid.
    admitted: Mutex<HashMap<String, (svcnet_netpol::Pod, Instant)>>,
    /// Bumped by every admission; the loop publishes the highest one its sync included.
    wanted: AtomicU64,
    applied: watch::Sender<u64>,
    wake: Notify,
}

impl NodeNetpol {
    /// `proxy_sources`: under the userspace proxy, every node's proxy source address.
    pub fn new(node: &NodeTopology, cut_existing: bool, proxy_sources: Vec<IpAddr>) -> Arc<Self> {
        Arc::new(Self {
            node: node.name.clone(),
            netns: node.netns.clone(),
            cut_existing,
            proxy_sources,
            own: [node.internal_ip, node.gateway]
                .into_iter()
                .map(|ip| (node.name.clone(), IpAddr::V4(ip)))
                .collect(),
            judge: Arc::new(ProxyJudge {
                node: node.name.clone(),
                internal_ip: IpAddr::V4(node.internal_ip),
                pod_cidr: node.pod_cidr,
                model: RwLock::default(),
                rejudge: cut_existing.then(|| watch::channel(0).0),
            }),
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

    /// The userspace proxy's judge for this node.
    pub fn judge(&self) -> Arc<ProxyJudge> {
        self.judge.clone()
    }
}

/// The userspace proxy's [`Admission`] on one node: the evaluator over the model of the node's
/// last applied sync, so the proxy and the kernel table decide from the same state. Before the
/// first sync it admits everything, as the node without its table does.
#[derive(Debug)]
pub struct ProxyJudge {
    node: String,
    internal_ip: IpAddr,
    /// The node's own pod range: `cni0`'s address and a tunnel device's are in it.
    pod_cidr: Ipv4Net,
    model: RwLock<Option<Arc<Cluster>>>,
    /// With the option that cuts existing flows: bumped by every published model that
    /// changed the table, so the proxy judges its relayed connections again (as the node's
    /// conntrack pass judges its flows).
    rejudge: Option<watch::Sender<u64>>,
}

impl ProxyJudge {
    fn publish(&self, cluster: Arc<Cluster>, changed: bool) {
        *self.model.write().unwrap_or_else(PoisonError::into_inner) = Some(cluster);
        if let Some(tx) = self.rejudge.as_ref().filter(|_| changed) {
            tx.send_modify(|g| *g += 1);
        }
    }

    /// The node's own addresses: loopback, its InternalIP, its pod range (`cni0`'s address,
    /// a tunnel's; a pod's address is a pod first).
    fn own(&self, ip: IpAddr) -> bool {
        ip.is_loopback()
            || ip == self.internal_ip
            || matches!(ip, IpAddr::V4(v4) if self.pod_cidr.contains(&v4))
    }

    /// The verdict on `client` reaching `endpoint`, `None` before the first sync.
    pub fn verdict(
        &self,
        client: IpAddr,
        endpoint: SocketAddr,
        protocol: svcnet_proxy::Protocol,
    ) -> Option<Verdict> {
        let cluster = self
            .model
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        let protocol = match protocol {
            svcnet_proxy::Protocol::Tcp => Protocol::Tcp,
            svcnet_proxy::Protocol::Udp => Protocol::Udp,
            svcnet_proxy::Protocol::Sctp => Protocol::Sctp,
        };
        Some(cluster.check_relayed(&self.node, |ip| self.own(ip), client, endpoint, protocol))
    }
}

impl Admission for ProxyJudge {
    fn admits(
        &self,
        client: IpAddr,
        endpoint: SocketAddr,
        protocol: svcnet_proxy::Protocol,
    ) -> bool {
        self.verdict(client, endpoint, protocol)
            .is_none_or(|v| v.allowed())
    }

    fn rejudge(&self) -> Option<watch::Receiver<u64>> {
        self.rejudge.as_ref().map(watch::Sender::subscribe)
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
        Renderer::new(
            &np.node,
            Options {
                proxy_sources: np.proxy_sources.clone(),
                ..Options::default()
            },
        ),
        Enforcer::new(NftExecutor::new(Some(np.netns.clone()))),
    )));
    loop {
        let generation = np.wanted.load(Ordering::SeqCst);
        let cluster = Arc::new(model(&policies, &pods, &namespaces, &np));
        let (own, proxies) = (np.own.clone(), np.proxy_sources.clone());
        let (state, netns, name, cut, applied) = (
            node.clone(),
            np.netns.clone(),
            np.node.clone(),
            np.cut_existing,
            cluster.clone(),
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
                let denied = conntrack::denied(&cluster, &name, &own, &proxies, &flows);
                conntrack::delete(Some(&netns), &denied).map_err(|err| err.to_string())?;
            }
            Ok::<_, String>(report)
        })
        .await?;
        match synced {
            Ok(report) => {
                np.judge.publish(applied, report.ops > 0);
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

#[cfg(test)]
mod tests {
    use super::*;
    use svcnet_proxy::Protocol::{Tcp, Udp};

    fn pod(name: &str, app: &str, ip: &str, node: &str) -> svcnet_netpol::Pod {
        svcnet_netpol::Pod {
            namespace: "default".into(),
            name: name.into(),
            labels: [("app".to_string(), app.to_string())].into(),
            ips: vec![ip.parse().unwrap()],
            node: Some(node.into()),
            ..Default::default()
        }
    }

    /// node1 (InternalIP 172.30.0.2, pods 10.244.1.0/24) holds the server and both clients; a
    /// second server runs on node2. A policy lets only `app=client` into `app=server` on TCP 80.
    fn judge() -> Arc<ProxyJudge> {
        let node: NodeTopology = serde_json::from_value(serde_json::json!({
            "name": "node1", "netns": "node1", "internal_ip": "172.30.0.2",
            "pod_cidr": "10.244.1.0/24", "gateway": "10.244.1.1", "host_link": "n1",
        }))
        .unwrap();
        let np = NodeNetpol::new(&node, false, vec![]);
        let judge = np.judge();
        let policy: k8s_openapi::api::networking::v1::NetworkPolicy =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "server-from-client", "namespace": "default"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "server"}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                 "ports": [{"port": 80}]}],
                },
            }))
            .unwrap();
        assert!(
            judge.admits(ip("10.244.1.9"), sock("10.244.1.5:80"), Tcp),
            "no model yet"
        );
        judge.publish(
            Arc::new(Cluster {
                namespaces: vec![svcnet_netpol::Namespace {
                    name: "default".into(),
                    labels: Default::default(),
                }],
                pods: vec![
                    pod("server", "server", "10.244.1.5", "node1"),
                    pod("server2", "server", "10.244.2.5", "node2"),
                    pod("client", "client", "10.244.1.7", "node1"),
                    pod("other", "other", "10.244.1.9", "node1"),
                ],
                policies: vec![svcnet_netpol::Policy::from_k8s(&policy).unwrap()],
            }),
            true,
        );
        judge
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sock(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// The proxy judges the client pod against the endpoint it chose, on either node, by
    /// protocol and target port; the node's own connections (its addresses, loopback, its
    /// pod range) keep the node exception for its own pods and only for them.
    #[test]
    fn the_proxy_judges_the_client_against_the_endpoint_it_chose() {
        let j = judge();
        for server in ["10.244.1.5:80", "10.244.2.5:80"] {
            assert!(
                j.admits(ip("10.244.1.7"), sock(server), Tcp),
                "client → {server}"
            );
            assert!(
                !j.admits(ip("10.244.1.9"), sock(server), Tcp),
                "other → {server}"
            );
        }
        assert!(
            !j.admits(ip("10.244.1.7"), sock("10.244.1.5:81"), Tcp),
            "port 81"
        );
        assert!(
            !j.admits(ip("10.244.1.7"), sock("10.244.1.5:80"), Udp),
            "UDP 80"
        );
        let v = j
            .verdict(ip("10.244.1.9"), sock("10.244.1.5:80"), Tcp)
            .unwrap();
        assert_eq!(
            v.to_string(),
            "egress: not isolated; ingress: denied (isolated by default/server-from-client)"
        );
        // Not isolated: anyone.
        assert!(j.admits(ip("10.244.1.9"), sock("10.244.1.7:80"), Tcp));
        for node in ["172.30.0.2", "127.0.0.1", "10.244.1.1", "10.244.1.0"] {
            assert!(
                j.admits(ip(node), sock("10.244.1.5:80"), Tcp),
                "{node} → own pod"
            );
            assert!(
                !j.admits(ip(node), sock("10.244.2.5:80"), Tcp),
                "{node} → node2's pod"
            );
        }
        // An address outside the cluster is judged as an address.
        assert!(!j.admits(ip("192.0.2.1"), sock("10.244.1.5:80"), Tcp));
    }
}
