//! Event → key mapping, the per-controller workers, and the apply step of every plan.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet,
};
use k8s_openapi::api::core::v1::{Binding, Endpoints, Node, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use svcnet_apimachinery::selector::LabelSelector;
use tracing::{debug, warn};

use super::events::{self, Recorder, Regarding};
use super::informers::Informers;
use super::queue::{Expectations, Key, WorkQueue};
use super::{
    CONTROLLER_MANAGER, ControllerError, ControllerOptions, SCHEDULER_MANAGER, patch_params,
    post_params,
};

mod workload_sync;
use crate::endpoints::EndpointsPlan;
use crate::endpointslice::{self, SlicePlan};
use crate::workloads::PodPlan;
use crate::{
    ENDPOINTSLICE_CONTROLLER_NAME, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MIRRORING_CONTROLLER_NAME,
    mirroring, podutil, scheduler, workloads,
};

/// The controllers this crate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    EndpointSlices,
    Endpoints,
    Mirroring,
    Deployments,
    ReplicaSets,
    StatefulSets,
    DaemonSets,
    Scheduler,
}

impl Kind {
    pub const ALL: &'static [Kind] = &[
        Kind::EndpointSlices,
        Kind::Endpoints,
        Kind::Mirroring,
        Kind::Deployments,
        Kind::ReplicaSets,
        Kind::StatefulSets,
        Kind::DaemonSets,
        Kind::Scheduler,
    ];

    /// The resources (plural names) this controller reads.
    fn reads(self) -> &'static [&'static str] {
        match self {
            Kind::EndpointSlices => &["services", "pods", "nodes", "endpointslices"],
            Kind::Endpoints => &["services", "pods", "endpoints"],
            Kind::Mirroring => &["services", "endpoints", "endpointslices"],
            Kind::Deployments => &["deployments", "replicasets", "pods"],
            Kind::ReplicaSets => &["replicasets", "pods"],
            Kind::StatefulSets => &["statefulsets", "controllerrevisions", "pods"],
            Kind::DaemonSets => &["daemonsets", "nodes", "pods"],
            Kind::Scheduler => &["pods"],
        }
    }
}

const SHORT_RETRY: Duration = Duration::from_millis(200);
const ERROR_RETRY: Duration = Duration::from_secs(2);
const MISSING_NODE_RETRY: Duration = Duration::from_secs(5);

pub(crate) struct Controllers {
    client: kube::Client,
    opts: ControllerOptions,
    queues: HashMap<Kind, Arc<WorkQueue>>,
    expectations: HashMap<Kind, Expectations>,
    /// Services each pod matched when last seen, so a relabelled pod also updates the
    /// services it left.
    pod_services: Mutex<HashMap<Key, Vec<Key>>>,
    /// Zone of each known node, so node heartbeats do not requeue every service.
    node_zones: Mutex<HashMap<String, Option<String>>>,
    /// How many pods the scheduler has bound, so the next one goes to the next node.
    scheduled: std::sync::atomic::AtomicUsize,
    /// Services the Endpoints worker has seen exist: when one of them is gone, it was
    /// deleted, and its Endpoints go with it.
    services_seen: Mutex<HashSet<Key>>,
    /// The Events the controllers record (`kubectl describe` shows them).
    events: Recorder,
}

fn key_of<K: Resource>(o: &K) -> Key {
    Key::new(
        o.meta().namespace.clone().unwrap_or_default(),
        o.meta().name.clone().unwrap_or_default(),
    )
}

fn get<K>(store: &kube::runtime::reflector::Store<K>, key: &Key) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store.get(&ObjectRef::new(&key.name).within(&key.namespace))
}

impl Controllers {
    pub fn new(client: kube::Client, opts: ControllerOptions, kinds: &[Kind]) -> Self {
        let queues = kinds
            .iter()
            .map(|k| (*k, Arc::new(WorkQueue::default())))
            .collect();
        let expectations = kinds
            .iter()
            .map(|k| (*k, Expectations::new(Duration::from_secs(15))))
            .collect();
        let events = Recorder::new(client.clone());
        Self {
            client,
            opts,
            queues,
            expectations,
            pod_services: Mutex::new(HashMap::new()),
            node_zones: Mutex::new(HashMap::new()),
            scheduled: std::sync::atomic::AtomicUsize::new(0),
            services_seen: Mutex::new(HashSet::new()),
            events,
        }
    }

    pub fn needed_kinds(&self) -> BTreeSet<&'static str> {
        self.queues
            .keys()
            .flat_map(|k| k.reads().iter().copied())
            .collect()
    }

    fn enqueue(&self, kind: Kind, key: Key) {
        if let Some(q) = self.queues.get(&kind) {
            q.add(key);
        }
    }

    fn resync(&self, kind: Kind, key: Key) {
        if let Some(q) = self.queues.get(&kind) {
            q.add_resync(key);
        }
    }

    fn enqueue_service(&self, key: &Key) {
        self.enqueue(Kind::EndpointSlices, key.clone());
        self.enqueue(Kind::Endpoints, key.clone());
        self.enqueue(Kind::Mirroring, key.clone());
    }

    // ---- event handlers -------------------------------------------------------------

    pub fn on_service(&self, _inf: &Informers, svc: &Service) {
        self.enqueue_service(&key_of(svc));
    }

    /// `present`: the event left the pod in place (not a deletion).
    pub fn on_pod(&self, inf: &Informers, pod: &Pod, present: bool) {
        let key = key_of(pod);
        inf.pods_by_namespace
            .record(Key::new(key.namespace.clone(), ""), &key.name, present);
        let now: Vec<Key> = inf
            .services
            .state()
            .iter()
            .filter(|s| s.metadata.namespace == pod.metadata.namespace)
            .filter(|s| {
                podutil::service_selector(s)
                    .is_some_and(|sel| podutil::labels_match(&LabelSelector::from_map(sel), pod))
            })
            .map(|s| key_of(s.as_ref()))
            .collect();
        let before = {
            let mut map = self.pod_services.lock().unwrap_or_else(|e| e.into_inner());
            // A deleted pod's entry goes with it.
            if present {
                map.insert(key.clone(), now.clone()).unwrap_or_default()
            } else {
                map.remove(&key).unwrap_or_default()
            }
        };
        for svc in now.iter().chain(before.iter()) {
            self.enqueue(Kind::EndpointSlices, svc.clone());
            self.enqueue(Kind::Endpoints, svc.clone());
        }
        for owner in pod
            .owner_references()
            .iter()
            .filter(|o| o.controller == Some(true))
        {
            let k = Key::new(key.namespace.clone(), owner.name.clone());
            match owner.kind.as_str() {
                "ReplicaSet" => {
                    // A Recreate rollout waits for the old pods to be gone: their owner's
                    // Deployment hears of it.
                    if let Some(rs) = get(&inf.replicasets, &k) {
                        self.enqueue_owner_deployment(&key.namespace, rs.as_ref());
                    }
                    self.enqueue(Kind::ReplicaSets, k);
                }
                "StatefulSet" => self.enqueue(Kind::StatefulSets, k),
                "DaemonSet" => self.enqueue(Kind::DaemonSets, k),
                // Made by svcnet before Deployments had ReplicaSets; see `legacy_pods`.
                "Deployment" => self.enqueue(Kind::Deployments, k),
                _ => {}
            }
        }
        if crate::workloads::controller_uid(&pod.metadata).is_none() {
            // An orphan: the ReplicaSets that select it may adopt it.
            for rs in inf.replicasets.state() {
                if rs.metadata.namespace == pod.metadata.namespace
                    && rs.spec.as_ref().is_some_and(|s| {
                        LabelSelector::from_k8s(&s.selector)
                            .is_ok_and(|sel| podutil::labels_match(&sel, pod))
                    })
                {
                    self.enqueue(Kind::ReplicaSets, key_of(rs.as_ref()));
                }
            }
        }
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_none_or(str::is_empty)
        {
            self.enqueue(Kind::Scheduler, key);
        }
    }

    pub fn on_node(&self, inf: &Informers, node: &Node) {
        // A node added, removed, relabelled or (un)tainted may change where daemon pods run.
        for d in inf.daemonsets.state() {
            self.enqueue(Kind::DaemonSets, key_of(d.as_ref()));
        }
        let name = node.name_any();
        let exists = get(&inf.nodes, &Key::new("", &name)).is_some();
        let zone = endpointslice::node_zones([node]).remove(&name).flatten();
        let changed = {
            let mut map = self.node_zones.lock().unwrap_or_else(|e| e.into_inner());
            if exists {
                map.insert(name, zone.clone()) != Some(zone)
            } else {
                map.remove(&name).is_some()
            }
        };
        if changed {
            for svc in inf.services.state() {
                self.enqueue(Kind::EndpointSlices, key_of(svc.as_ref()));
            }
        }
    }

    /// `present`: the event left the slice in place (not a deletion).
    pub fn on_slice(&self, inf: &Informers, slice: &EndpointSlice, present: bool) {
        let labels = slice.labels();
        let Some(svc) = labels.get(LABEL_SERVICE_NAME) else {
            return;
        };
        let key = Key::new(slice.namespace().unwrap_or_default(), svc.clone());
        inf.slices_by_service
            .record(key.clone(), &slice.name_any(), present);
        match labels.get(LABEL_MANAGED_BY).map(String::as_str) {
            Some(ENDPOINTSLICE_CONTROLLER_NAME) => self.enqueue(Kind::EndpointSlices, key),
            Some(MIRRORING_CONTROLLER_NAME) => self.enqueue(Kind::Mirroring, key),
            _ => {}
        }
    }

    pub fn on_endpoints(&self, _inf: &Informers, ep: &Endpoints) {
        self.enqueue(Kind::Endpoints, key_of(ep));
        self.enqueue(Kind::Mirroring, key_of(ep));
    }

    pub fn on_deployment(&self, _inf: &Informers, d: &Deployment) {
        self.enqueue(Kind::Deployments, key_of(d));
    }

    pub fn on_statefulset(&self, _inf: &Informers, s: &StatefulSet) {
        self.enqueue(Kind::StatefulSets, key_of(s));
    }

    pub fn on_daemonset(&self, _inf: &Informers, d: &DaemonSet) {
        self.enqueue(Kind::DaemonSets, key_of(d));
    }

    pub fn on_replicaset(&self, _inf: &Informers, rs: &ReplicaSet) {
        self.enqueue(Kind::ReplicaSets, key_of(rs));
        self.enqueue_owner_deployment(&rs.namespace().unwrap_or_default(), rs);
    }

    pub fn on_revision(&self, _inf: &Informers, r: &ControllerRevision) {
        for owner in r
            .owner_references()
            .iter()
            .filter(|o| o.controller == Some(true))
        {
            let kind = match owner.kind.as_str() {
                "StatefulSet" => Kind::StatefulSets,
                "DaemonSet" => Kind::DaemonSets,
                _ => continue,
            };
            let ns = r.namespace().unwrap_or_default();
            self.enqueue(kind, Key::new(ns, owner.name.clone()));
        }
    }

    fn enqueue_owner_deployment(&self, namespace: &str, rs: &ReplicaSet) {
        for owner in rs
            .owner_references()
            .iter()
            .filter(|o| o.controller == Some(true) && o.kind == "Deployment")
        {
            self.enqueue(Kind::Deployments, Key::new(namespace, owner.name.clone()));
        }
    }

    /// Queues every object for its controllers behind every changed key (see `WorkQueue`).
    pub fn resync_all(&self, inf: &Informers) {
        for s in inf.services.state() {
            for kind in [Kind::EndpointSlices, Kind::Endpoints, Kind::Mirroring] {
                self.resync(kind, key_of(s.as_ref()));
            }
        }
        for e in inf.endpoints.state() {
            self.resync(Kind::Mirroring, key_of(e.as_ref()));
        }
        for d in inf.deployments.state() {
            self.resync(Kind::Deployments, key_of(d.as_ref()));
        }
        for s in inf.statefulsets.state() {
            self.resync(Kind::StatefulSets, key_of(s.as_ref()));
        }
        for rs in inf.replicasets.state() {
            self.resync(Kind::ReplicaSets, key_of(rs.as_ref()));
        }
        for d in inf.daemonsets.state() {
            self.resync(Kind::DaemonSets, key_of(d.as_ref()));
        }
        for p in inf.pods.state() {
            if p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_none_or(str::is_empty)
            {
                self.resync(Kind::Scheduler, key_of(p.as_ref()));
            }
        }
    }

    // ---- workers --------------------------------------------------------------------

    pub async fn worker(self: Arc<Self>, kind: Kind, inf: Arc<Informers>) {
        let Some(queue) = self.queues.get(&kind).cloned() else {
            return;
        };
        debug!(?kind, "worker started");
        loop {
            // One key at a time gives the runtime back: a resync backlog must not hold a
            // thread the API server and the node proxies share.
            tokio::task::yield_now().await;
            let key = queue.next().await;
            let result = match kind {
                Kind::EndpointSlices => self.sync_endpointslices(&key, &inf).await,
                Kind::Endpoints => self.sync_endpoints(&key, &inf).await,
                Kind::Mirroring => self.sync_mirroring(&key, &inf).await,
                Kind::Deployments => self.sync_deployment(&key, &inf).await,
                Kind::ReplicaSets => self.sync_replicaset(&key, &inf).await,
                Kind::StatefulSets => self.sync_statefulset(&key, &inf).await,
                Kind::DaemonSets => self.sync_daemonset(&key, &inf).await,
                Kind::Scheduler => self.sync_scheduler(&key, &inf).await,
            };
            match result {
                Ok(None) => {}
                Ok(Some(delay)) => queue.add_after(key, delay),
                Err(e) if e.is_conflict() => {
                    debug!(?kind, %key, error = %e, "conflict; requeued");
                    self.expectations[&kind].forget(&key);
                    queue.add_after(key, SHORT_RETRY);
                }
                Err(e) if e.is_retryable() => {
                    warn!(?kind, %key, error = %e, "sync failed; retrying");
                    self.expectations[&kind].forget(&key);
                    queue.add_after(key, ERROR_RETRY);
                }
                Err(e) => warn!(?kind, %key, error = %e, "sync failed"),
            }
        }
    }

    fn pods_in(inf: &Informers, ns: &str) -> Vec<Arc<Pod>> {
        inf.pods_by_namespace
            .names(&Key::new(ns, ""))
            .into_iter()
            .filter_map(|name| get(&inf.pods, &Key::new(ns, name)))
            .collect()
    }

    fn slices_of(inf: &Informers, key: &Key, managed_by: &str) -> Vec<Arc<EndpointSlice>> {
        inf.slices_by_service
            .names(key)
            .into_iter()
            .filter_map(|name| get(&inf.slices, &Key::new(key.namespace.clone(), name)))
            .filter(|s| {
                let l = s.labels();
                l.get(LABEL_SERVICE_NAME) == Some(&key.name)
                    && l.get(LABEL_MANAGED_BY).map(String::as_str) == Some(managed_by)
            })
            .collect()
    }

    fn slice_present(inf: &Informers, ns: &str) -> impl Fn(&str) -> bool {
        move |name| get(&inf.slices, &Key::new(ns, name)).is_some()
    }

    async fn sync_endpointslices(
        &self,
        key: &Key,
        inf: &Informers,
    ) -> Result<Option<Duration>, ControllerError> {
        let exp = &self.expectations[&Kind::EndpointSlices];
        if !exp.satisfied(key, Self::slice_present(inf, &key.namespace)) {
            return Ok(Some(SHORT_RETRY));
        }
        let existing = Self::slices_of(inf, key, ENDPOINTSLICE_CONTROLLER_NAME);
        let existing: Vec<&EndpointSlice> = existing.iter().map(AsRef::as_ref).collect();
        let plan = match get(&inf.services, key) {
            Some(svc) => {
                let pods = Self::pods_in(inf, &key.namespace);
                let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
                let nodes = inf.nodes.state();
                let zones = endpointslice::node_zones(nodes.iter().map(AsRef::as_ref));
                endpointslice::plan(
                    &svc,
                    &pods,
                    &zones,
                    &existing,
                    self.opts.max_endpoints_per_slice,
                )
            }
            None => endpointslice::plan_without_service(&existing),
        };
        let missing = !plan.missing_nodes.is_empty();
        self.apply_slices(Kind::EndpointSlices, key, plan).await?;
        Ok(missing.then_some(MISSING_NODE_RETRY))
    }

    async fn sync_mirroring(
        &self,
        key: &Key,
        inf: &Informers,
    ) -> Result<Option<Duration>, ControllerError> {
        let exp = &self.expectations[&Kind::Mirroring];
        if !exp.satisfied(key, Self::slice_present(inf, &key.namespace)) {
            return Ok(Some(SHORT_RETRY));
        }
        let existing = Self::slices_of(inf, key, MIRRORING_CONTROLLER_NAME);
        let existing: Vec<&EndpointSlice> = existing.iter().map(AsRef::as_ref).collect();
        let ep = get(&inf.endpoints, key);
        let svc = get(&inf.services, key);
        let plan = mirroring::plan(ep.as_deref(), svc.as_deref(), &existing);
        self.apply_slices(Kind::Mirroring, key, plan).await?;
        Ok(None)
    }

    async fn apply_slices(
        &self,
        kind: Kind,
        key: &Key,
        plan: SlicePlan,
    ) -> Result<(), ControllerError> {
        if plan.is_empty() {
            return Ok(());
        }
        debug!(?kind, %key, create = plan.create.len(), update = plan.update.len(), delete = plan.delete.len(), "applying slice plan");
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &key.namespace);
        let mut created = Vec::new();
        let mut deleted = Vec::new();
        let mut result = Ok(());
        for s in &plan.create {
            match api.create(&post_params(CONTROLLER_MANAGER), s).await {
                Ok(o) => created.push(o.name_any()),
                Err(e) => {
                    result = Err(ControllerError::api(
                        format!("create EndpointSlice for {key}"),
                        e,
                    ));
                    break;
                }
            }
        }
        if result.is_ok() {
            for s in &plan.update {
                let name = s.name_any();
                if let Err(e) = api
                    .replace(&name, &post_params(CONTROLLER_MANAGER), s)
                    .await
                {
                    result = Err(ControllerError::api(
                        format!("update EndpointSlice {}/{name}", key.namespace),
                        e,
                    ));
                    break;
                }
            }
        }
        if result.is_ok() {
            for s in &plan.delete {
                let name = s.name_any();
                match delete_ignoring_missing(&api, &name).await {
                    Ok(()) => deleted.push(name),
                    Err(e) => {
                        result = Err(ControllerError::api(
                            format!("delete EndpointSlice {}/{name}", key.namespace),
                            e,
                        ));
                        break;
                    }
                }
            }
        }
        self.expectations[&kind].expect(key, created, deleted);
        result
    }

    async fn sync_endpoints(
        &self,
        key: &Key,
        inf: &Informers,
    ) -> Result<Option<Duration>, ControllerError> {
        let existing = get(&inf.endpoints, key);
        let service = get(&inf.services, key);
        let plan = {
            let mut seen = self.services_seen.lock().unwrap_or_else(|e| e.into_inner());
            match &service {
                Some(svc) => {
                    seen.insert(key.clone());
                    let pods = Self::pods_in(inf, &key.namespace);
                    let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
                    crate::endpoints::plan(svc, &pods, existing.as_deref())
                }
                None => {
                    crate::endpoints::plan_without_service(existing.as_deref(), seen.contains(key))
                }
            }
        };
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &key.namespace);
        match plan {
            EndpointsPlan::Nothing => {}
            EndpointsPlan::Create(ep) => {
                api.create(&post_params(CONTROLLER_MANAGER), &ep)
                    .await
                    .map_err(|e| ControllerError::api(format!("create Endpoints {key}"), e))?;
            }
            EndpointsPlan::Update(ep) => {
                api.replace(&key.name, &post_params(CONTROLLER_MANAGER), &ep)
                    .await
                    .map_err(|e| ControllerError::api(format!("update Endpoints {key}"), e))?;
            }
            EndpointsPlan::Delete { name, .. } => {
                delete_ignoring_missing(&api, &name)
                    .await
                    .map_err(|e| ControllerError::api(format!("delete Endpoints {key}"), e))?;
            }
        }
        if service.is_none() {
            // Handled (deleted, or nothing to delete): a later Endpoints of that name is new.
            self.services_seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
        }
        Ok(None)
    }

    async fn sync_scheduler(
        &self,
        key: &Key,
        inf: &Informers,
    ) -> Result<Option<Duration>, ControllerError> {
        let Some(pod) = get(&inf.pods, key) else {
            return Ok(None);
        };
        let single = [self.opts.node_name.clone()];
        let nodes: &[String] = if self.opts.schedulable_nodes.is_empty() {
            &single
        } else {
            &self.opts.schedulable_nodes
        };
        let turn = self.scheduled.load(std::sync::atomic::Ordering::Relaxed);
        for b in scheduler::plan(&[pod.as_ref()], nodes, turn) {
            bind(&self.client, &b).await?;
            let message = events::scheduled_message(&b.namespace, &b.name, &b.node);
            self.events
                .normal(
                    events::SCHEDULER,
                    &Regarding::of(pod.as_ref()),
                    "Scheduled",
                    message,
                )
                .await;
            self.scheduled
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(None)
    }
}

/// Now, to the second (what API timestamps hold).
fn now() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

fn unsupported(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 405)
}

/// Writes a workload's status through the `status` subresource; servers that do not serve it
/// get a plain replace.
async fn write_status<K>(api: &Api<K>, obj: &K, key: &Key) -> Result<(), ControllerError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    match api
        .replace_status(&key.name, &post_params(CONTROLLER_MANAGER), obj)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if unsupported(&e) => api
            .replace(&key.name, &post_params(CONTROLLER_MANAGER), obj)
            .await
            .map(|_| ())
            .map_err(|e| ControllerError::api(format!("update status of {key}"), e)),
        Err(e) => Err(ControllerError::api(format!("update status of {key}"), e)),
    }
}

/// Binds through `pods/binding` like kube-scheduler; servers without that subresource get a
/// merge patch of `spec.nodeName`.
async fn bind(client: &kube::Client, b: &scheduler::Binding) -> Result<(), ControllerError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &b.namespace);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(b.name.clone()),
            namespace: Some(b.namespace.clone()),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(b.node.clone()),
            ..Default::default()
        },
    };
    let what = || format!("bind pod {}/{} to node {}", b.namespace, b.name, b.node);
    match api
        .create_subresource::<Binding, serde_json::Value>(
            "binding",
            &b.name,
            &post_params(SCHEDULER_MANAGER),
            &binding,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if unsupported(&e) => {
            let patch = serde_json::json!({ "spec": { "nodeName": b.node } });
            api.patch(
                &b.name,
                &patch_params(SCHEDULER_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|e| ControllerError::api(what(), e))
        }
        Err(e) => Err(ControllerError::api(what(), e)),
    }
}
