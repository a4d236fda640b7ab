//! The proxy's observed world (services, endpoint slices, this node), fed by watch events,
//! and the change sets that drive full and partial syncs.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::categorize::NodeTopology;
use crate::desired::{
    CoreConfig, DesiredFamily, DesiredNode, DesiredServicePort, desired_service_ports,
};
use crate::endpoints::{Names, ServiceEndpoints, merge_slices, slice_service};
use crate::names::{IpFamily, NamespacedName, Protocol};
use crate::service::{ServiceError, ServiceInfo, service_info};
use crate::tracker::ChangeTracker;

/// Node label carrying the node's zone, used for zone topology hints.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The net change of one service (its spec and/or its endpoints) since the last sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceChange {
    pub previous: Option<(ServiceInfo, Arc<ServiceEndpoints>)>,
    pub current: Option<(ServiceInfo, Arc<ServiceEndpoints>)>,
}

/// What changed since the last sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeSet {
    pub services: BTreeMap<NamespacedName, ServiceChange>,
    /// The node's topology changed: every service must be recomputed (a full sync).
    pub node_changed: bool,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && !self.node_changed
    }
}

/// UDP conntrack entries to delete so clients stop black-holing (DNS, statsd): entries NATed to
/// an endpoint no longer reachable through a frontend, and, when a UDP service port goes from
/// no endpoints to some ("newly active", upstream's `NewlyActiveUDPServices`), every entry to
/// its frontends, which may have been made while nothing DNATed them (a node port delivered
/// locally, say) and would otherwise keep bypassing the new rules until they time out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StaleConntrack {
    pub family: IpFamily,
    /// Original destination: a frontend IP and its port, or (IP `None`) a node port.
    pub frontend_ip: Option<IpAddr>,
    pub frontend_port: u16,
    /// The endpoint the entries were NATed to; `None`: every entry to the frontend.
    pub endpoint: Option<IpAddr>,
}

/// One slice of a service: its name and its endpoints.
type SliceDigest = (Box<str>, Arc<ServiceEndpoints>);

/// Observed state plus change trackers. Pure: feed it objects, read desired state out.
///
/// Every node's proxy holds every Service and endpoint of the cluster, so what is held once
/// per Service is shared rather than copied: the service's name (one `Arc` for every map, its
/// digest and the trackers), a service's endpoints (the merged set *is* its one slice's digest
/// when it has one slice, the common case) and the strings endpoints repeat ([`Names`]).
#[derive(Debug, Default)]
pub struct ProxyState {
    config: CoreConfig,
    node: NodeTopology,
    services: BTreeMap<Arc<NamespacedName>, ServiceInfo>,
    /// Per service, its slices' digests, sorted by slice name.
    slices: BTreeMap<Arc<NamespacedName>, Vec<SliceDigest>>,
    /// Slice `namespace/name` → owning service (a slice's label could change).
    slice_owner: BTreeMap<NamespacedName, Arc<NamespacedName>>,
    /// Per service, its slices merged.
    endpoints: BTreeMap<Arc<NamespacedName>, Arc<ServiceEndpoints>>,
    service_changes: ChangeTracker<Arc<NamespacedName>, ServiceInfo>,
    endpoint_changes: ChangeTracker<Arc<NamespacedName>, Arc<ServiceEndpoints>>,
    names: Names,
    node_changed: bool,
}

impl ProxyState {
    pub fn new(config: CoreConfig) -> Self {
        let node = NodeTopology {
            name: config.node_name.clone(),
            zone: None,
        };
        Self {
            config,
            node,
            ..Default::default()
        }
    }

    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    /// The one shared copy of a service's name: the copy a map already holds, else a new one.
    fn shared(&self, key: NamespacedName) -> Arc<NamespacedName> {
        let held = (self.services.get_key_value(&key).map(|(k, _)| k))
            .or_else(|| self.endpoints.get_key_value(&key).map(|(k, _)| k))
            .or_else(|| self.slices.get_key_value(&key).map(|(k, _)| k));
        held.cloned().unwrap_or_else(|| Arc::new(key))
    }

    /// Records a created or updated Service. A service the proxy cannot program is treated as
    /// absent (its rules are removed) and the error returned for logging.
    pub fn update_service(&mut self, svc: &Service) -> Result<(), ServiceError> {
        let key = self.shared(NamespacedName::new(
            svc.metadata.namespace.clone().unwrap_or_default(),
            svc.metadata.name.clone().unwrap_or_default(),
        ));
        let (info, result) = match service_info(svc) {
            Ok(info) => (info, Ok(())),
            Err(e) => (None, Err(e)),
        };
        let info = info.map(|i| ServiceInfo {
            name: key.clone(),
            ..i
        });
        self.set_service(&key, info);
        result
    }

    pub fn delete_service(&mut self, key: &NamespacedName) {
        let key = self.shared(key.clone());
        self.set_service(&key, None);
    }

    fn set_service(&mut self, key: &Arc<NamespacedName>, info: Option<ServiceInfo>) {
        let previous = match &info {
            Some(i) => self.services.insert(key.clone(), i.clone()),
            None => self.services.remove(key),
        };
        self.service_changes.record(key, previous, info);
    }

    /// Records a created or updated EndpointSlice.
    pub fn update_slice(&mut self, slice: &EndpointSlice) {
        let slice_key = NamespacedName::new(
            slice.metadata.namespace.clone().unwrap_or_default(),
            slice.metadata.name.clone().unwrap_or_default(),
        );
        let owner = slice_service(slice);
        if let Some(old) = self.slice_owner.get(&slice_key).cloned()
            && Some(&*old) != owner.as_ref()
        {
            self.remove_slice_from(&old, &slice_key.name);
        }
        let Some(owner) = owner else {
            self.slice_owner.remove(&slice_key);
            return;
        };
        let owner = self.shared(owner);
        let digest = Arc::new(merge_slices([slice], &mut self.names));
        let list = self.slices.entry(owner.clone()).or_default();
        match list.binary_search_by(|(n, _)| (**n).cmp(slice_key.name.as_str())) {
            Ok(i) => list[i].1 = digest,
            Err(i) => {
                list.insert(i, (slice_key.name.as_str().into(), digest));
                list.shrink_to_fit();
            }
        }
        self.slice_owner.insert(slice_key, owner.clone());
        self.refresh_endpoints(&owner);
    }

    pub fn delete_slice(&mut self, namespace: &str, name: &str) {
        let slice_key = NamespacedName::new(namespace, name);
        if let Some(owner) = self.slice_owner.remove(&slice_key) {
            self.remove_slice_from(&owner, name);
        }
    }

    fn remove_slice_from(&mut self, owner: &Arc<NamespacedName>, slice_name: &str) {
        if let Some(list) = self.slices.get_mut(owner) {
            list.retain(|(n, _)| **n != *slice_name);
            if list.is_empty() {
                self.slices.remove(owner);
            }
        }
        self.refresh_endpoints(owner);
    }

    fn refresh_endpoints(&mut self, owner: &Arc<NamespacedName>) {
        let merged = match self.slices.get(owner).map(Vec::as_slice) {
            None | Some([]) => None,
            // A slice's digest is already merged and sorted: it is the service's endpoints.
            Some([(_, one)]) => Some(one.clone()),
            Some(many) => Some(Arc::new(ServiceEndpoints::merge(
                many.iter().map(|(_, d)| &**d),
            ))),
        };
        let current = merged.filter(|m| !m.is_empty());
        let previous = match &current {
            Some(c) => self.endpoints.insert(owner.clone(), c.clone()),
            None => self.endpoints.remove(owner),
        };
        self.endpoint_changes.record(owner, previous, current);
    }

    /// Records this node (its zone label feeds topology hints).
    pub fn update_node(&mut self, node: &Node) {
        let zone = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL))
            .cloned();
        if zone != self.node.zone {
            self.node.zone = zone;
            self.node_changed = true;
        }
    }

    /// Number of services and endpoint sets with pending changes (for metrics).
    pub fn pending(&self) -> (usize, usize) {
        (self.service_changes.len(), self.endpoint_changes.len())
    }

    /// Takes the pending changes, coalesced per service.
    pub fn take_changes(&mut self) -> ChangeSet {
        let svc = self.service_changes.take();
        let eps = self.endpoint_changes.take();
        let keys: BTreeSet<&Arc<NamespacedName>> = svc.keys().chain(eps.keys()).collect();
        let mut services = BTreeMap::new();
        for key in keys {
            let (prev_info, cur_info) = match svc.get(key) {
                Some(c) => (c.previous.clone(), c.current.clone()),
                None => (
                    self.services.get(key).cloned(),
                    self.services.get(key).cloned(),
                ),
            };
            let (prev_eps, cur_eps) = match eps.get(key) {
                Some(c) => (c.previous.clone(), c.current.clone()),
                None => (
                    self.endpoints.get(key).cloned(),
                    self.endpoints.get(key).cloned(),
                ),
            };
            let previous = prev_info.map(|i| (i, prev_eps.unwrap_or_default()));
            let current = cur_info.map(|i| (i, cur_eps.unwrap_or_default()));
            // A change to the endpoints of a service the proxy does not program is no change.
            if previous != current {
                services.insert((**key).clone(), ServiceChange { previous, current });
            }
        }
        ChangeSet {
            services,
            node_changed: std::mem::take(&mut self.node_changed),
        }
    }

    pub fn node_state(&self, family: IpFamily) -> DesiredNode {
        DesiredNode::new(family, &self.config)
    }

    /// The full desired state of one family.
    pub fn desired(&self, family: IpFamily) -> DesiredFamily {
        let node = self.node_state(family);
        let mut services = BTreeMap::new();
        for (key, info) in &self.services {
            let endpoints = self.endpoints.get(key).map(|e| &**e);
            for d in desired_service_ports(info, endpoints, family, &self.node, &node) {
                services.insert(d.name.clone(), d);
            }
        }
        DesiredFamily { node, services }
    }

    /// The desired ports of the given services in one family (empty for a deleted service):
    /// the input of a partial sync.
    pub fn desired_for<'a>(
        &self,
        family: IpFamily,
        keys: impl IntoIterator<Item = &'a NamespacedName>,
    ) -> BTreeMap<NamespacedName, Vec<DesiredServicePort>> {
        let node = self.node_state(family);
        keys.into_iter()
            .map(|key| {
                let ports = match self.services.get(key) {
                    Some(info) => desired_service_ports(
                        info,
                        self.endpoints.get(key).map(|e| &**e),
                        family,
                        &self.node,
                        &node,
                    ),
                    None => Vec::new(),
                };
                (key.clone(), ports)
            })
            .collect()
    }

    /// UDP conntrack entries made stale by a change set: for every UDP port, each endpoint
    /// reachable before and not after, crossed with each of the port's previous frontends.
    pub fn stale_conntrack(&self, changes: &ChangeSet) -> Vec<StaleConntrack> {
        let mut out = BTreeSet::new();
        for change in changes.services.values() {
            for family in IpFamily::ALL {
                let node = self.node_state(family);
                let ports = |side: &Option<(ServiceInfo, Arc<ServiceEndpoints>)>| match side {
                    Some((i, e)) => desired_service_ports(i, Some(e), family, &self.node, &node),
                    None => Vec::new(),
                };
                let before = ports(&change.previous);
                let after = ports(&change.current);
                for old in before.iter().filter(|p| p.protocol == Protocol::Udp) {
                    let new = after.iter().find(|p| p.name == old.name);
                    let still: BTreeSet<IpAddr> = new
                        .into_iter()
                        .flat_map(|n| n.reachable_endpoints().map(|e| e.ip))
                        .collect();
                    for ep in old.reachable_endpoints().filter(|e| !still.contains(&e.ip)) {
                        stale_for(&mut out, family, old, Some(ep.ip));
                    }
                }
                // Newly active: no reachable endpoint before (or no such port), some now.
                for new in after.iter().filter(|p| p.protocol == Protocol::Udp) {
                    let was_active = before
                        .iter()
                        .find(|p| p.name == new.name)
                        .is_some_and(|p| p.reachable_endpoints().next().is_some());
                    if !was_active && new.reachable_endpoints().next().is_some() {
                        stale_for(&mut out, family, new, None);
                    }
                }
            }
        }
        out.into_iter().collect()
    }

    /// Number of local endpoints per `externalTrafficPolicy: Local` service with a health-check
    /// node port, for the health-check servers: (service, port, local endpoint count).
    pub fn health_checks(&self) -> Vec<(NamespacedName, u16, usize)> {
        let mut out = Vec::new();
        for (key, info) in &self.services {
            let Some(hc) = info.health_check_node_port else {
                continue;
            };
            let mut local = BTreeSet::new();
            for family in IpFamily::ALL {
                let node = self.node_state(family);
                let endpoints = self.endpoints.get(key).map(|e| &**e);
                for p in desired_service_ports(info, endpoints, family, &self.node, &node) {
                    local.extend(p.local_endpoints.iter().map(|e| e.ip));
                }
            }
            out.push(((**key).clone(), hc, local.len()));
        }
        out
    }
}

/// The entries of every frontend of `port` (cluster IP, external and load-balancer IPs, node
/// port) NATed to `endpoint` (`None`: all of them).
fn stale_for(
    out: &mut BTreeSet<StaleConntrack>,
    family: IpFamily,
    port: &DesiredServicePort,
    endpoint: Option<IpAddr>,
) {
    let frontends = std::iter::once(port.cluster_ip)
        .chain(port.external_ips.iter().copied())
        .chain(port.load_balancer_ips.iter().copied());
    for ip in frontends {
        out.insert(StaleConntrack {
            family,
            frontend_ip: Some(ip),
            frontend_port: port.port,
            endpoint,
        });
    }
    if let Some(np) = port.node_port {
        out.insert(StaleConntrack {
            family,
            frontend_ip: None,
            frontend_port: np,
            endpoint,
        });
    }
}
