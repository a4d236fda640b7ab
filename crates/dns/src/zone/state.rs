//! Incremental zone state: API objects in (one change at a time, or a whole relist), reduced at
//! once to the facts the zone reads of them; immutable [`Zone`] snapshots out.
//!
//! A change marks its service dirty; [`ZoneState::snapshot`] re-indexes only dirty services and
//! updates the shared maps copy-on-write (`Arc::make_mut`): the namespace that holds the
//! service and the reverse shards of its old and new addresses are copied, everything else is
//! shared with the previous snapshot. A change is thus O(size of its namespace + one shard),
//! not O(cluster), which keeps the change→answer latency flat at 10k services.
//!
//! **Architecture Invariant:** a published [`Zone`] is never mutated; `make_mut` copies any map
//! a snapshot still holds.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::build::{Key, ServiceFacts, SliceFacts, key_of, service_entry};
use super::{
    NameMap, NamespaceEntry, ReverseTarget, ReverseTargets, ServiceEntry, ServiceKind, Zone,
    ZoneConfig,
};

/// Number of reverse-index shards (a change copies one or two of them).
pub(crate) const REVERSE_SHARDS: usize = 64;

pub(crate) type ReverseShard = HashMap<IpAddr, ReverseTargets>;

pub(crate) fn shard_of(ip: &IpAddr) -> usize {
    let n = match ip {
        IpAddr::V4(v4) => u128::from(u32::from(*v4)),
        IpAddr::V6(v6) => u128::from(*v6),
    };
    (n % REVERSE_SHARDS as u128) as usize
}

/// What the zone keeps of the objects seen so far (their facts, not the objects), and the index
/// derived from them.
#[derive(Debug)]
pub struct ZoneState {
    config: Arc<ZoneConfig>,
    services: HashMap<Key, ServiceFacts>,
    /// (namespace, service) → slice name → slice.
    slices: HashMap<Key, HashMap<String, SliceFacts>>,
    /// (namespace, slice) → the service it belongs to.
    slice_owner: HashMap<Key, String>,
    namespace_objects: HashSet<String>,
    pods: HashMap<Key, Vec<IpAddr>>,

    entries: HashMap<Key, Arc<ServiceEntry>>,
    /// Warnings of the services that have any.
    warnings: HashMap<Key, Vec<String>>,
    index: Arc<NameMap<Arc<NamespaceEntry>>>,
    reverse: Vec<Arc<ReverseShard>>,
    pod_ips: Arc<HashSet<(String, IpAddr)>>,

    dirty: HashSet<Key>,
    namespaces_dirty: bool,
    pods_dirty: bool,
}

fn pod_ips_of(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .filter_map(|ip| ip.parse().ok())
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

/// Every (IP, target) a service entry contributes to the reverse index.
fn reverse_targets(entry: &Arc<ServiceEntry>) -> Vec<(IpAddr, ReverseTarget)> {
    let mut out = Vec::new();
    if let ServiceKind::ClusterIp(ips) = &entry.kind {
        for ip in ips {
            out.push((*ip, ReverseTarget::service(entry)));
        }
    }
    for (index, ep) in entry.endpoints.iter().enumerate() {
        out.push((ep.ip, ReverseTarget::endpoint(entry, index)));
    }
    out
}

impl ZoneState {
    /// An empty state.
    pub fn new(config: Arc<ZoneConfig>) -> Self {
        ZoneState {
            config,
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_owner: HashMap::new(),
            namespace_objects: HashSet::new(),
            pods: HashMap::new(),
            entries: HashMap::new(),
            warnings: HashMap::new(),
            index: Arc::default(),
            reverse: (0..REVERSE_SHARDS).map(|_| Arc::default()).collect(),
            pod_ips: Arc::default(),
            dirty: HashSet::new(),
            namespaces_dirty: true,
            pods_dirty: true,
        }
    }

    /// The configuration facts are made under (see [`ServiceFacts::new`]).
    pub fn config(&self) -> &Arc<ZoneConfig> {
        &self.config
    }

    /// Whether a snapshot would differ from the last one.
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.namespaces_dirty || self.pods_dirty
    }

    /// A Service was added or changed.
    pub fn upsert_service(&mut self, svc: Arc<Service>) {
        if let Some(facts) = ServiceFacts::new(&self.config, &svc) {
            self.upsert_service_facts(facts);
        }
    }

    /// A Service was added or changed, as its facts.
    pub fn upsert_service_facts(&mut self, facts: ServiceFacts) {
        let key = facts.key().clone();
        if self.services.get(&key) != Some(&facts) {
            self.dirty.insert(key.clone());
            self.services.insert(key, facts);
        }
    }

    /// A Service was deleted.
    pub fn delete_service(&mut self, svc: &Service) {
        if let Some(key) = key_of(&svc.metadata) {
            self.services.remove(&key);
            self.dirty.insert(key);
        }
    }

    /// The complete set of Services (after a relist).
    pub fn replace_services(&mut self, all: impl IntoIterator<Item = Arc<Service>>) {
        let config = self.config.clone();
        self.replace_service_facts(
            all.into_iter()
                .filter_map(|svc| ServiceFacts::new(&config, &svc)),
        );
    }

    /// The complete set of Services (after a relist), as their facts. Only services whose facts
    /// changed become dirty.
    pub fn replace_service_facts(&mut self, all: impl IntoIterator<Item = ServiceFacts>) {
        let mut new = HashMap::new();
        for facts in all {
            new.insert(facts.key().clone(), facts);
        }
        for (key, old) in &self.services {
            if new.get(key) != Some(old) {
                self.dirty.insert(key.clone());
            }
        }
        for key in new.keys() {
            if !self.services.contains_key(key) {
                self.dirty.insert(key.clone());
            }
        }
        self.services = new;
    }

    /// An EndpointSlice was added or changed.
    pub fn upsert_slice(&mut self, slice: Arc<EndpointSlice>) {
        if let Some(facts) = SliceFacts::new(&self.config, &slice) {
            self.upsert_slice_facts(facts);
        } else if let Some((ns, name)) = key_of(&slice.metadata) {
            // No longer labelled with a service: it leaves the one it belonged to.
            self.forget_slice(&ns, &name);
        }
    }

    /// An EndpointSlice was added or changed, as its facts.
    pub fn upsert_slice_facts(&mut self, facts: SliceFacts) {
        let (ns, name) = facts.key().clone();
        let unchanged = self
            .slice_owner
            .get(facts.key())
            .and_then(|owner| self.slices.get(&(ns.clone(), owner.clone())))
            .and_then(|group| group.get(&name))
            == Some(&facts);
        if unchanged {
            return;
        }
        self.detach_slice(&ns, &name);
        let svc_key = self.attach_slice(facts);
        self.dirty.insert(svc_key);
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        if let Some((ns, name)) = key_of(&slice.metadata) {
            self.detach_slice(&ns, &name);
        }
    }

    /// EndpointSlice `ns/name` was deleted or no longer belongs to a service.
    pub fn forget_slice(&mut self, ns: &str, name: &str) {
        self.detach_slice(ns, name);
    }

    /// Attach a slice to the service its label names; returns that service's key.
    fn attach_slice(&mut self, facts: SliceFacts) -> Key {
        let (ns, name) = facts.key().clone();
        let owner = facts.service().to_string();
        let svc_key = (ns.clone(), owner.clone());
        self.slices
            .entry(svc_key.clone())
            .or_default()
            .insert(name.clone(), facts);
        self.slice_owner.insert((ns, name), owner);
        svc_key
    }

    /// Detach slice `ns/name` from its service, marking that service dirty.
    fn detach_slice(&mut self, ns: &str, name: &str) {
        let slice_key = (ns.to_string(), name.to_string());
        let Some(owner) = self.slice_owner.remove(&slice_key) else {
            return;
        };
        let svc_key = (ns.to_string(), owner);
        if let Some(group) = self.slices.get_mut(&svc_key) {
            group.remove(name);
            if group.is_empty() {
                self.slices.remove(&svc_key);
            }
        }
        self.dirty.insert(svc_key);
    }

    /// The complete set of EndpointSlices (after a relist).
    pub fn replace_slices(&mut self, all: impl IntoIterator<Item = Arc<EndpointSlice>>) {
        let config = self.config.clone();
        self.replace_slice_facts(
            all.into_iter()
                .filter_map(|slice| SliceFacts::new(&config, &slice)),
        );
    }

    /// The complete set of EndpointSlices (after a relist), as their facts. Only services whose
    /// slices' facts changed become dirty.
    pub fn replace_slice_facts(&mut self, all: impl IntoIterator<Item = SliceFacts>) {
        let old = std::mem::take(&mut self.slices);
        self.slice_owner.clear();
        for facts in all {
            self.attach_slice(facts);
        }
        for key in old.keys().chain(self.slices.keys()) {
            if old.get(key) != self.slices.get(key) {
                self.dirty.insert(key.clone());
            }
        }
    }

    /// A Namespace was added or changed.
    pub fn upsert_namespace(&mut self, ns: &Namespace) {
        if let Some(name) = &ns.metadata.name {
            self.namespaces_dirty |= self.namespace_objects.insert(name.to_ascii_lowercase());
        }
    }

    /// A Namespace was deleted.
    pub fn delete_namespace(&mut self, ns: &Namespace) {
        if let Some(name) = &ns.metadata.name {
            self.namespaces_dirty |= self.namespace_objects.remove(&name.to_ascii_lowercase());
        }
    }

    /// The complete set of Namespaces (after a relist).
    pub fn replace_namespaces(&mut self, all: impl IntoIterator<Item = Arc<Namespace>>) {
        let new: HashSet<String> = all
            .into_iter()
            .filter_map(|n| n.metadata.name.as_ref().map(|s| s.to_ascii_lowercase()))
            .collect();
        if new != self.namespace_objects {
            self.namespace_objects = new;
            self.namespaces_dirty = true;
        }
    }

    /// A Pod was added or changed (its IPs matter for `pods verified`).
    pub fn upsert_pod(&mut self, pod: &Pod) {
        if let Some(key) = key_of(&pod.metadata) {
            let ips = pod_ips_of(pod);
            if self.pods.get(&key) != Some(&ips) {
                self.pods.insert(key, ips);
                self.pods_dirty = true;
            }
        }
    }

    /// A Pod was deleted.
    pub fn delete_pod(&mut self, pod: &Pod) {
        if let Some(key) = key_of(&pod.metadata) {
            self.pods_dirty |= self.pods.remove(&key).is_some();
        }
    }

    /// The complete set of Pods (after a relist).
    pub fn replace_pods(&mut self, all: impl IntoIterator<Item = Arc<Pod>>) {
        self.pods = all
            .into_iter()
            .filter_map(|p| Some((key_of(&p.metadata)?, pod_ips_of(&p))))
            .collect();
        self.pods_dirty = true;
    }

    /// Apply the pending changes and return the zone as it now is.
    pub fn snapshot(&mut self, serial: u32) -> Zone {
        let dirty = std::mem::take(&mut self.dirty);
        let touched_namespaces = !dirty.is_empty() || self.namespaces_dirty;
        let index = Arc::make_mut(&mut self.index);
        for key in dirty {
            let (ns, name) = &key;
            let old = self.entries.remove(&key);
            let new = self.services.get(&key).and_then(|facts| {
                let mut slices: Vec<(&String, &SliceFacts)> = self
                    .slices
                    .get(&key)
                    .map(|group| group.iter().collect())
                    .unwrap_or_default();
                slices.sort_by(|a, b| a.0.cmp(b.0));
                let slices: Vec<&SliceFacts> = slices.into_iter().map(|(_, s)| s).collect();
                let mut warnings = Vec::new();
                let entry = service_entry(&self.config, facts, &slices, &mut warnings);
                if warnings.is_empty() {
                    self.warnings.remove(&key);
                } else {
                    self.warnings.insert(key.clone(), warnings);
                }
                entry.map(Arc::new)
            });
            if new.is_none() && !self.services.contains_key(&key) {
                self.warnings.remove(&key);
            }
            if let Some(old) = &old {
                for (ip, _) in reverse_targets(old) {
                    let shard = Arc::make_mut(&mut self.reverse[shard_of(&ip)]);
                    if let Some(targets) = shard.get_mut(&ip)
                        && !targets.retain(|t| !Arc::ptr_eq(&t.service, old))
                    {
                        shard.remove(&ip);
                    }
                }
            }
            if let Some(new) = &new {
                for (ip, target) in reverse_targets(new) {
                    let shard = Arc::make_mut(&mut self.reverse[shard_of(&ip)]);
                    match shard.entry(ip) {
                        Entry::Occupied(mut e) => e.get_mut().push(target),
                        Entry::Vacant(e) => {
                            e.insert(ReverseTargets::One(target));
                        }
                    }
                }
                self.entries.insert(key.clone(), new.clone());
            }
            let ns_lower = ns.to_ascii_lowercase();
            let name_lower = name.to_ascii_lowercase();
            match &new {
                Some(entry) => {
                    let slot = index.entry(ns_lower).or_default();
                    Arc::make_mut(slot)
                        .services
                        .insert(name_lower, entry.clone());
                }
                None => {
                    if let Some(slot) = index.get_mut(&ns_lower) {
                        Arc::make_mut(slot).services.remove(&name_lower);
                    }
                }
            }
        }
        if touched_namespaces {
            // A namespace exists when a Namespace object or a Service in it exists.
            for ns in &self.namespace_objects {
                if !index.contains_key(ns) && self.config.options.exposes(ns) {
                    index.insert(ns.clone(), Arc::default());
                }
            }
            let objects = &self.namespace_objects;
            let options = &self.config.options;
            index.retain(|ns, entry| {
                options.exposes(ns) && (!entry.services.is_empty() || objects.contains(ns))
            });
            self.namespaces_dirty = false;
        }
        if self.pods_dirty {
            self.pod_ips = Arc::new(
                self.pods
                    .iter()
                    .flat_map(|((ns, _), ips)| ips.iter().map(|ip| (ns.to_ascii_lowercase(), *ip)))
                    .collect(),
            );
            self.pods_dirty = false;
        }

        let (dns_ns, dns_name) = &self.config.dns_service;
        let dns_ips = self
            .index
            .get(dns_ns)
            .and_then(|n| n.services.get(dns_name))
            .map(|e| match &e.kind {
                ServiceKind::ClusterIp(ips) => ips.clone(),
                ServiceKind::Headless => e.endpoint_ips.to_vec(),
                ServiceKind::ExternalName(_) => Vec::new(),
            })
            .unwrap_or_default();
        let mut warnings: Vec<String> = self.warnings.values().flatten().cloned().collect();
        warnings.sort();

        Zone {
            config: self.config.clone(),
            serial,
            namespaces: self.index.clone(),
            reverse: self.reverse.clone(),
            pod_ips: self.pod_ips.clone(),
            dns_ips,
            soa_names: soa_names(&self.config.domain),
            domain_labels: self
                .config
                .domain
                .iter()
                .map(|l| {
                    String::from_utf8_lossy(l)
                        .to_ascii_lowercase()
                        .into_boxed_str()
                })
                .collect(),
            warnings,
        }
    }
}

/// `ns.dns.<zone>` and `hostmaster.<zone>` (the zone itself if a prefix does not fit).
fn soa_names(
    domain: &hickory_proto::rr::Name,
) -> (hickory_proto::rr::Name, hickory_proto::rr::Name) {
    let prefixed = |p: &str| {
        hickory_proto::rr::Name::from_ascii(p)
            .and_then(|p| p.append_domain(domain))
            .unwrap_or_else(|_| domain.clone())
    };
    (prefixed("ns.dns"), prefixed("hostmaster"))
}
