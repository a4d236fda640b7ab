//! One watch and reflector store per resource kind, shared by every controller; each event is
//! handed to [`Controllers`] to be mapped onto controller keys.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet,
};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector as reflect};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tracing::warn;

use super::queue::Key;
use super::reconcile::Controllers;

/// Names of one kind's objects grouped by something derived from each (a slice's service, a
/// pod's namespace), so a controller reads a service's slices or a namespace's pods without
/// scanning the whole cache: a scan per key made a resync of 10k services 3 × 10k × 10k
/// label compares (tens of seconds of a runtime thread, during which the node proxies in the
/// same process stopped receiving their watch events). Kept by the watch task after the store
/// has applied each event; an entry may be stale (an object's labels changed, or it went
/// during a re-list), so readers fetch each name from the store and check it again.
#[derive(Default)]
pub(crate) struct NameIndex {
    groups: Mutex<HashMap<Key, BTreeSet<String>>>,
}

impl NameIndex {
    /// Records that `name` is (`present`) or is no longer in `group`.
    pub fn record(&self, group: Key, name: &str, present: bool) {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if present {
            groups.entry(group).or_default().insert(name.to_string());
        } else if let Some(names) = groups.get_mut(&group) {
            names.remove(name);
            if names.is_empty() {
                groups.remove(&group);
            }
        }
    }

    /// The names recorded in `group`.
    pub fn names(&self, group: &Key) -> Vec<String> {
        let groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups
            .get(group)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Read handles on the shared caches.
pub(crate) struct Informers {
    pub services: Store<Service>,
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub slices: Store<EndpointSlice>,
    pub endpoints: Store<Endpoints>,
    pub deployments: Store<Deployment>,
    pub statefulsets: Store<StatefulSet>,
    pub daemonsets: Store<DaemonSet>,
    pub replicasets: Store<ReplicaSet>,
    pub revisions: Store<ControllerRevision>,
    /// EndpointSlices by `namespace/<kubernetes.io/service-name>`.
    pub slices_by_service: NameIndex,
    /// Pods by namespace (`namespace/`).
    pub pods_by_namespace: NameIndex,
}

type Writer<K> = reflector::store::Writer<K>;

impl Informers {
    /// Starts the watches. Handlers run on each watch's task, in event order.
    pub fn start(
        client: kube::Client,
        controllers: Arc<Controllers>,
    ) -> (Arc<Self>, Vec<JoinHandle<()>>) {
        let (services, w_services) = reflector::store::<Service>();
        let (pods, w_pods) = reflector::store::<Pod>();
        let (nodes, w_nodes) = reflector::store::<Node>();
        let (slices, w_slices) = reflector::store::<EndpointSlice>();
        let (endpoints, w_endpoints) = reflector::store::<Endpoints>();
        let (deployments, w_deployments) = reflector::store::<Deployment>();
        let (statefulsets, w_statefulsets) = reflector::store::<StatefulSet>();
        let (daemonsets, w_daemonsets) = reflector::store::<DaemonSet>();
        let (replicasets, w_replicasets) = reflector::store::<ReplicaSet>();
        let (revisions, w_revisions) = reflector::store::<ControllerRevision>();
        let inf = Arc::new(Self {
            services,
            pods,
            nodes,
            slices,
            endpoints,
            deployments,
            statefulsets,
            daemonsets,
            replicasets,
            revisions,
            slices_by_service: NameIndex::default(),
            pods_by_namespace: NameIndex::default(),
        });
        let need = controllers.needed_kinds();
        let mut tasks = Vec::new();
        // `present`: the handler also learns whether the event left the object in place (during
        // a list, the store is swapped only once the list is whole, so it cannot be asked).
        macro_rules! watch {
            ($writer:expr, $ty:ty, $name:literal, $method:ident) => {
                watch!($writer, $ty, $name, |c, i, o, _present| c.$method(i, o))
            };
            ($writer:expr, $ty:ty, $name:literal, |$c:ident, $i:ident, $o:ident, $p:ident| $call:expr) => {
                if need.contains($name) {
                    let $c = Arc::clone(&controllers);
                    let inf = Arc::clone(&inf);
                    tasks.push(spawn_watch::<$ty>(
                        client.clone(),
                        $writer,
                        $name,
                        move |$o, $p| {
                            let $i = &inf;
                            $call
                        },
                    ));
                }
            };
        }
        watch!(w_services, Service, "services", on_service);
        watch!(w_pods, Pod, "pods", |c, i, o, present| c
            .on_pod(i, o, present));
        watch!(w_nodes, Node, "nodes", on_node);
        watch!(
            w_slices,
            EndpointSlice,
            "endpointslices",
            |c, i, o, present| c.on_slice(i, o, present)
        );
        watch!(w_endpoints, Endpoints, "endpoints", on_endpoints);
        watch!(w_deployments, Deployment, "deployments", on_deployment);
        watch!(w_statefulsets, StatefulSet, "statefulsets", on_statefulset);
        watch!(w_daemonsets, DaemonSet, "daemonsets", on_daemonset);
        watch!(w_replicasets, ReplicaSet, "replicasets", on_replicaset);
        watch!(
            w_revisions,
            ControllerRevision,
            "controllerrevisions",
            on_revision
        );
        (inf, tasks)
    }
}

impl Informers {
    /// Waits, one store after the other, until every store in `kinds` has listed once.
    /// (Concurrent waits on one store from several tasks were seen to hang.)
    pub async fn wait_ready(
        &self,
        kinds: &std::collections::BTreeSet<&'static str>,
    ) -> Result<(), String> {
        for what in kinds {
            let ready = match *what {
                "services" => self.services.wait_until_ready().await,
                "pods" => self.pods.wait_until_ready().await,
                "nodes" => self.nodes.wait_until_ready().await,
                "endpointslices" => self.slices.wait_until_ready().await,
                "endpoints" => self.endpoints.wait_until_ready().await,
                "deployments" => self.deployments.wait_until_ready().await,
                "replicasets" => self.replicasets.wait_until_ready().await,
                "controllerrevisions" => self.revisions.wait_until_ready().await,
                "daemonsets" => self.daemonsets.wait_until_ready().await,
                _ => self.statefulsets.wait_until_ready().await,
            };
            ready.map_err(|_| format!("the {what} watch ended before its first list"))?;
            tracing::debug!(resource = what, "cache synced");
        }
        Ok(())
    }
}

fn spawn_watch<K>(
    client: kube::Client,
    writer: Writer<K>,
    what: &'static str,
    handler: impl Fn(&K, bool) + Send + 'static,
) -> JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let api: Api<K> = Api::all(client);
    let stream =
        reflect(writer, watcher::watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Apply(o) | Event::InitApply(o)) => handler(&o, true),
                Ok(Event::Delete(o)) => handler(&o, false),
                Ok(Event::Init | Event::InitDone) => {}
                Err(e) => warn!(resource = what, error = %e, "watch failed; retrying"),
            }
        }
    })
}
