//! The agent loop: watches the pods bound to one node (`fieldSelector=spec.nodeName=<node>`)
//! and runs one [`pod::PodWorker`] task per pod, which owns everything about that pod
//! (sandbox, processes, probes, status). Watch events are forwarded to the worker; a relist
//! that no longer contains a pod counts as its deletion.
//!
//! Files, under `<data_dir>/agent/<node>/`: `ipam/` (the CNI plugin's allocations) and
//! `pods/<ns>_<name>_<uid>/` per pod (see [`crate::logs`]): `pod.json` (the record `svcnet exec` reads), `resolv.conf`,
//! `hosts`, and `logs/<container>/<restartCount>.log` (stdout and stderr, one CRI log record
//! per line, see [`output`]).

pub mod output;
pub mod pod;
pub mod probe;
pub mod process;
pub mod spec;
pub mod status;
pub mod volumes;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;

use crate::cni::{self, Invocation, IpamConf, NetConf};
use crate::topology::{NodeTopology, POD_BRIDGE, Topology};

/// How the agent runs on one node.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    /// The node's network namespace, holding the `cni0` bridge.
    pub node_netns: String,
    /// The node's InternalIP (`status.hostIP` of its pods).
    pub node_ip: Ipv4Addr,
    pub pod_cidr: Ipv4Net,
    pub gateway: Ipv4Addr,
    /// The MTU of pod interfaces (the pod network's: 1450 with VXLAN).
    pub mtu: u32,
    /// The pod network is a node add-on's (`svcnet up --disable pod-network`): as a kubelet
    /// waits for its network plugin, pods (but hostNetwork ones) wait for the Node's
    /// `NetworkUnavailable=False`, and get the MTU of the backend its flannel lease names.
    pub network_from_addon: bool,
    /// Pod namespaces are named `<prefix>-pod-<uid>` (so `svcnet down` finds them).
    pub netns_prefix: String,
    /// The root data dir (the agent uses `<data_dir>/agent/<node>/`).
    pub data_dir: PathBuf,
    /// `nameserver` lines of ClusterFirst pods (default 10.96.0.10).
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// The program that runs the built-in test server, started with `SVCNET_TESTSERVER` set
    /// (default: this executable, which must call [`crate::testserver::run_if_requested`]).
    pub test_server: PathBuf,
    /// First restart back-off (the kubelet's 10 s), doubled per restart up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Called once a pod has its address and before any of its containers starts (the
    /// node's NetworkPolicy enforcement isolates it there, so it is never open).
    pub before_start: Option<Arc<dyn BeforeStart>>,
    /// How the pod network's CNI plugin is run: `svcnet up` executes itself as the plugin
    /// binary (the path a kubelet's runtime takes); the default calls it in process.
    pub cni_plugin: cni::exec::Plugin,
    /// Images this runtime runs as a program of the machine (it pulls none): repository
    /// (no tag) → program. `svcnet up` maps svcnet's own image to its binary, so the add-on
    /// manifests in `deploy/` run unchanged.
    pub images: std::collections::BTreeMap<String, PathBuf>,
}

/// A step between a pod's sandbox (its address) and its first container.
pub trait BeforeStart: Send + Sync + std::fmt::Debug {
    /// Returns when the pod may start; `ip` is its address on the pod network.
    fn before_start<'a>(
        &'a self,
        pod: &'a Pod,
        ip: Ipv4Addr,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
}

impl AgentConfig {
    /// The config for one node of a topology, with Kubernetes' defaults.
    pub fn for_node(topology: &Topology, node: &NodeTopology, data_dir: &Path) -> Self {
        Self {
            node_name: node.name.clone(),
            node_netns: node.netns.clone(),
            node_ip: node.internal_ip,
            pod_cidr: node.pod_cidr,
            gateway: node.gateway,
            mtu: topology.config().pod_network.pod_mtu(),
            network_from_addon: false,
            netns_prefix: topology.config().prefix.clone(),
            data_dir: data_dir.to_path_buf(),
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            test_server: std::env::current_exe()
                .unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(300),
            before_start: None,
            cni_plugin: cni::exec::Plugin::InProcess,
            images: Default::default(),
        }
    }

    /// `<data_dir>/agent/<node>`.
    pub fn node_dir(&self) -> PathBuf {
        self.data_dir.join("agent").join(&self.node_name)
    }

    pub fn pods_dir(&self) -> PathBuf {
        self.node_dir().join("pods")
    }

    /// The CNI network configuration for this node's pods.
    pub fn netconf(&self) -> NetConf {
        self.netconf_with_mtu(self.mtu)
    }

    /// [`Self::netconf`] with the pods' MTU `mtu`.
    pub fn netconf_with_mtu(&self, mtu: u32) -> NetConf {
        NetConf {
            cni_version: "1.0.0".into(),
            name: "svcnet".into(),
            plugin_type: "svcnet".into(),
            bridge: POD_BRIDGE.into(),
            node_netns: Some(self.node_netns.clone()),
            data_dir: self.node_dir(),
            mtu: Some(mtu),
            ipam: IpamConf {
                ipam_type: "svcnet-host-local".into(),
                subnet: self.pod_cidr,
                gateway: self.gateway,
                range_start: None,
                range_end: None,
            },
            prev_result: None,
        }
    }

    /// The network configuration list the agent's pods are attached with (this node's
    /// `netconf` as its one plugin), results cached under `<node_dir>/cni/results`.
    pub fn network_list(&self) -> Result<cni::exec::NetworkList, cni::CniError> {
        self.network_list_with_mtu(self.mtu)
    }

    /// [`Self::network_list`] with the pods' MTU `mtu`.
    pub fn network_list_with_mtu(&self, mtu: u32) -> Result<cni::exec::NetworkList, cni::CniError> {
        let results = self.node_dir().join("cni").join("results");
        cni::exec::NetworkList::single(&self.netconf_with_mtu(mtu), results)
    }

    /// The network namespace name of the pod with this uid.
    pub fn pod_netns(&self, uid: &str) -> String {
        format!("{}-pod-{uid}", self.netns_prefix)
    }
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent {node}: {what}: {source}")]
    Io {
        node: String,
        what: String,
        source: std::io::Error,
    },
    #[error("agent {node}: releasing the previous run's pods: {source}")]
    Cni { node: String, source: cni::CniError },
}

/// Runs the agent for `cfg.node_name` until `shutdown` resolves. On shutdown every pod's
/// processes are stopped (SIGTERM, grace period, SIGKILL) and their namespaces and addresses
/// released; the pod objects are left alone (the next run restarts them).
pub async fn run(
    client: Client,
    cfg: AgentConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let cfg = Arc::new(cfg);
    let prev = cfg.clone();
    tokio::task::spawn_blocking(move || release_previous(&prev))
        .await
        .map_err(|e| AgentError::Io {
            node: cfg.node_name.clone(),
            what: "cleanup task".into(),
            source: std::io::Error::other(e),
        })??;
    let api: Api<Pod> = Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={}", cfg.node_name));
    let mut events = watcher::watcher(api, wc).default_backoff().boxed();
    let mut workers: HashMap<
        String,
        (
            mpsc::UnboundedSender<pod::PodEvent>,
            tokio::task::JoinHandle<()>,
        ),
    > = HashMap::new();
    let mut relist: Option<HashSet<String>> = None;
    tokio::pin!(shutdown);
    tracing::info!(node = %cfg.node_name, "agent started");
    loop {
        let event = tokio::select! {
            () = &mut shutdown => break,
            ev = events.next() => ev,
        };
        workers.retain(|_, (_, handle)| !handle.is_finished());
        match event {
            None => break,
            Some(Err(e)) => tracing::warn!(node = %cfg.node_name, "pod watch: {e}"),
            Some(Ok(Event::Init)) => relist = Some(HashSet::new()),
            Some(Ok(Event::InitApply(p) | Event::Apply(p))) => {
                let Some(uid) = p.metadata.uid.clone() else {
                    continue;
                };
                if let Some(seen) = relist.as_mut() {
                    seen.insert(uid.clone());
                }
                match workers.get(&uid) {
                    Some((tx, _)) => {
                        let _ = tx.send(pod::PodEvent::Update(Box::new(p)));
                    }
                    None => {
                        let (tx, rx) = mpsc::unbounded_channel();
                        let worker = pod::PodWorker::new(client.clone(), cfg.clone(), p);
                        workers.insert(uid, (tx, tokio::spawn(worker.run(rx))));
                    }
                }
            }
            Some(Ok(Event::Delete(p))) => {
                if let Some((tx, _)) = p.metadata.uid.as_ref().and_then(|u| workers.get(u)) {
                    let _ = tx.send(pod::PodEvent::Deleted);
                }
            }
            Some(Ok(Event::InitDone)) => {
                if let Some(seen) = relist.take() {
                    for (uid, (tx, _)) in &workers {
                        if !seen.contains(uid) {
                            let _ = tx.send(pod::PodEvent::Deleted);
                        }
                    }
                }
            }
        }
    }
    tracing::info!(node = %cfg.node_name, pods = workers.len(), "agent stopping");
    for (tx, _) in workers.values() {
        let _ = tx.send(pod::PodEvent::Shutdown);
    }
    for (_, (_, handle)) in workers {
        let _ = handle.await;
    }
    Ok(())
}

/// Releases everything a previous run of this node's agent left: processes, namespaces,
/// addresses and pod directories (pods are started afresh).
fn release_previous(cfg: &AgentConfig) -> Result<(), AgentError> {
    let conf = cfg.netconf();
    let cni_err = |source| AgentError::Cni {
        node: cfg.node_name.clone(),
        source,
    };
    let list = cfg.network_list().map_err(cni_err)?;
    // The list's file, where a kubelet's runtime would read it: an operator sees what the
    // node's pods are attached with.
    let conf_dir = cfg.node_dir().join("cni").join("net.d");
    std::fs::create_dir_all(&conf_dir)
        .and_then(|()| {
            std::fs::write(
                conf_dir.join("10-svcnet.conflist"),
                serde_json::to_string_pretty(&list.to_json()).unwrap_or_default(),
            )
        })
        .map_err(|source| AgentError::Io {
            node: cfg.node_name.clone(),
            what: "write the CNI network list".into(),
            source,
        })?;
    let io = |what: &str, source| AgentError::Io {
        node: cfg.node_name.clone(),
        what: what.to_string(),
        source,
    };
    let ipam = cni::Ipam::open(&conf.data_dir, &conf.name, &conf.ipam).map_err(cni_err)?;
    for (_, uid, ifname) in ipam.allocations().map_err(cni_err)? {
        let netns = cfg.pod_netns(&uid);
        process::remove_netns(&netns);
        let inv = Invocation {
            container_id: uid,
            netns: String::new(),
            ifname,
        };
        list.del(&cfg.cni_plugin, &inv).map_err(cni_err)?;
    }
    // Namespaces created before their CNI ADD finished hold no address; the records name them.
    for entry in std::fs::read_dir(cfg.pods_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let record = std::fs::read(entry.path().join("pod.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<pod::PodRecord>(&b).ok());
        if let Some(record) = record.filter(|r| !r.sandbox.host_network) {
            process::remove_netns(&record.sandbox.netns);
        }
    }
    match std::fs::remove_dir_all(cfg.pods_dir()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("remove old pod directories", e)),
    }
}
