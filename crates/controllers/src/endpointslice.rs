//! The EndpointSlice controller's pure core: from a Service, the pods of its namespace, the
//! nodes and the slices already managed for it, compute which slices to create, update and
//! delete. It follows upstream's reconciler (`staging/src/k8s.io/endpointslice/reconciler.go`):
//!
//! 1. one address type per family in `spec.ipFamilies`; slices of other types are deleted;
//! 2. pods are grouped by their resolved ports (a named `targetPort` can differ per pod), and
//!    each group is reconciled on its own;
//! 3. in each group, endpoints already in a slice stay in that slice (updated in place when
//!    their conditions change); leftovers fill the slices that change anyway (fullest first),
//!    then the one unchanged slice they fit best, then new slices of at most
//!    `max_endpoints_per_slice`; a slice that is left empty is deleted;
//! 4. creates are turned into updates of slices that would be deleted, and a service with no
//!    endpoints keeps one empty placeholder slice per address type.
//!
//! An unchanged slice is never rewritten. Endpoint order is deterministic (pods sorted by
//! namespace/name), so plans can be snapshot-tested.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use svcnet_apimachinery::selector::LabelSelector;

use crate::podutil::{self, is_ipv6};
use crate::{
    ENDPOINTSLICE_CONTROLLER_NAME, LABEL_HEADLESS, LABEL_MANAGED_BY, LABEL_SERVICE_NAME,
    LABEL_TOPOLOGY_ZONE,
};

/// Upstream's `--max-endpoints-per-slice` default.
pub const DEFAULT_MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// Node name → the node's zone label, for every node that exists.
pub type NodeZones = BTreeMap<String, Option<String>>;

/// Builds [`NodeZones`] from Node objects.
pub fn node_zones<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> NodeZones {
    nodes
        .into_iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let zone = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
                .filter(|z| !z.is_empty())
                .cloned();
            Some((name, zone))
        })
        .collect()
}

/// What to do to a service's EndpointSlices. Updates carry the existing slice's metadata
/// (name, resourceVersion) so they apply as an optimistic-concurrency replace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlicePlan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<EndpointSlice>,
    /// Nodes named by pods that do not exist; those pods were left out (as upstream does unless
    /// `publishNotReadyAddresses`), and the service should be retried later.
    pub missing_nodes: BTreeSet<String>,
}

impl SlicePlan {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// The slices to delete when the service is gone or no longer has a selector.
pub fn plan_without_service(existing: &[&EndpointSlice]) -> SlicePlan {
    SlicePlan {
        delete: existing.iter().map(|s| (*s).clone()).collect(),
        ..Default::default()
    }
}

/// Computes the plan for `service`. `pods` may be every pod of the namespace: selection
/// happens here. `existing` are the slices labelled with this service's name and this
/// controller's `managed-by`.
pub fn plan(
    service: &Service,
    pods: &[&Pod],
    nodes: &NodeZones,
    existing: &[&EndpointSlice],
    max_endpoints_per_slice: usize,
) -> SlicePlan {
    let Some(selector) = podutil::service_selector(service) else {
        // Upstream leaves the slices of a service that lost its selector in place; we delete
        // them, since the endpoints of a selector-less service are the user's to write.
        return plan_without_service(existing);
    };
    let max = max_endpoints_per_slice.max(1);
    let selector = LabelSelector::from_map(selector);
    let selected: Vec<&Pod> = {
        let mut v: Vec<&Pod> = pods
            .iter()
            .copied()
            .filter(|p| p.metadata.namespace == service.metadata.namespace)
            .filter(|p| podutil::labels_match(&selector, p))
            .collect();
        v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        v
    };
    let families = address_types(service);
    let mut out = SlicePlan::default();
    let mut by_type: BTreeMap<&str, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in existing {
        if families.contains(slice.address_type.as_str()) {
            by_type
                .entry(slice.address_type.as_str())
                .or_default()
                .push(slice);
        } else {
            out.delete.push((*slice).clone());
        }
    }
    for family in &families {
        let existing = by_type.remove(family).unwrap_or_default();
        reconcile_address_type(service, &selected, nodes, &existing, family, max, &mut out);
    }
    out
}

/// The address types the service's slices carry: one per `ipFamilies` entry; without
/// families (old servers), the family of the cluster IP, or both for headless services.
pub(crate) fn address_types(service: &Service) -> BTreeSet<&'static str> {
    let spec = service.spec.as_ref();
    let mut set: BTreeSet<&'static str> = spec
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some("IPv4"),
            "IPv6" => Some("IPv6"),
            _ => None,
        })
        .collect();
    if set.is_empty() {
        if podutil::is_service_ip_set(service) {
            let ip = spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or("");
            set.insert(if is_ipv6(ip) == Some(true) {
                "IPv6"
            } else {
                "IPv4"
            });
        } else {
            set.extend(["IPv4", "IPv6"]);
        }
    }
    set
}

/// Identity of an endpoint across reconciles: what upstream hashes (addresses, hostname and
/// the target's namespace/name). Conditions, zone and node are compared separately.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EndpointKey {
    namespace: String,
    name: String,
    addresses: Vec<String>,
    hostname: String,
}

pub(crate) fn endpoint_key(ep: &Endpoint) -> EndpointKey {
    let mut addresses = ep.addresses.clone();
    addresses.sort();
    let (namespace, name) = ep
        .target_ref
        .as_ref()
        .map(|t| {
            (
                t.namespace.clone().unwrap_or_default(),
                t.name.clone().unwrap_or_default(),
            )
        })
        .unwrap_or_default();
    EndpointKey {
        namespace,
        name,
        addresses,
        hostname: ep.hostname.clone().unwrap_or_default(),
    }
}

/// Port sets are compared as sorted (name, port, protocol, appProtocol) tuples, so the order
/// of a slice's ports does not matter.
pub(crate) type PortKey = Vec<(String, i32, String, String)>;

pub(crate) fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut key: PortKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or_default(),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.app_protocol.clone().unwrap_or_default(),
            )
        })
        .collect();
    key.sort();
    key
}

/// The ports of `service` as exposed by `pod`; service ports the pod does not expose are left
/// out, as upstream's `getEndpointPorts` does.
pub(crate) fn endpoint_ports(service: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    ports
        .iter()
        .filter_map(|sp| {
            let port = podutil::find_port(pod, sp)?;
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(podutil::protocol(sp)),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

/// Upstream's `podToEndpoint` for one address type.
pub(crate) fn pod_to_endpoint(
    pod: &Pod,
    zone: Option<&str>,
    service: &Service,
    address_type: &str,
) -> Endpoint {
    let want_v6 = address_type == "IPv6";
    let addresses = podutil::pod_ips(pod)
        .iter()
        .filter(|ip| is_ipv6(ip) == Some(want_v6))
        .filter_map(|ip| podutil::canonical_ip(ip))
        .collect();
    let serving = podutil::is_ready(pod);
    let terminating = podutil::is_terminating(pod);
    let publish = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let ready = publish || (serving && !terminating);
    let spec = pod.spec.as_ref();
    Endpoint {
        addresses,
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
        node_name: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        zone: zone.map(str::to_string),
        hostname: podutil::should_set_hostname(pod, service)
            .then(|| spec.and_then(|s| s.hostname.clone()))
            .flatten(),
        ..Default::default()
    }
}

/// The labels a managed slice carries: the service's own labels (minus the reserved ones),
/// the headless marker, the service name and `managed-by`.
pub(crate) fn slice_labels(service: &Service) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = service
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                LABEL_SERVICE_NAME | LABEL_MANAGED_BY | LABEL_HEADLESS
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !podutil::is_service_ip_set(service) {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(
        LABEL_SERVICE_NAME.into(),
        service.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(
        LABEL_MANAGED_BY.into(),
        ENDPOINTSLICE_CONTROLLER_NAME.into(),
    );
    labels
}

/// A controller ownerReference (`controller` and `blockOwnerDeletion` true).
pub(crate) fn controller_ref(api_version: &str, kind: &str, meta: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn owned_by(slice: &EndpointSlice, service: &Service) -> bool {
    let uid = service.metadata.uid.as_deref().unwrap_or("");
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.kind == "Service" && o.api_version == "v1")
}

fn new_slice(service: &Service, ports: Vec<EndpointPort>, address_type: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}-",
                service.metadata.name.as_deref().unwrap_or("")
            )),
            namespace: service.metadata.namespace.clone(),
            labels: Some(slice_labels(service)),
            owner_references: Some(vec![controller_ref("v1", "Service", &service.metadata)]),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints: Vec::new(),
        ports: Some(ports),
    }
}

/// Upstream's `placeholderSliceCompare`: namespace, labels, owners, ports, endpoints.
fn is_placeholder(existing: &EndpointSlice, placeholder: &EndpointSlice) -> bool {
    existing.metadata.namespace == placeholder.metadata.namespace
        && existing.metadata.labels == placeholder.metadata.labels
        && existing.metadata.owner_references == placeholder.metadata.owner_references
        && existing.address_type == placeholder.address_type
        && existing.endpoints.is_empty()
        && existing.ports.as_deref().unwrap_or_default().is_empty()
}

type DesiredSet = BTreeMap<EndpointKey, Endpoint>;

fn reconcile_address_type(
    service: &Service,
    pods: &[&Pod],
    nodes: &NodeZones,
    existing: &[&EndpointSlice],
    address_type: &str,
    max: usize,
    out: &mut SlicePlan,
) {
    let mut create = Vec::new();
    let mut update = Vec::new();
    let mut delete = Vec::new();
    let mut existing_by_ports: BTreeMap<PortKey, Vec<&EndpointSlice>> = BTreeMap::new();
    let mut sorted: Vec<&EndpointSlice> = existing.to_vec();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for slice in sorted {
        if owned_by(slice, service) {
            let key = port_key(slice.ports.as_deref().unwrap_or_default());
            existing_by_ports.entry(key).or_default().push(slice);
        } else {
            delete.push(slice.clone());
        }
    }

    let publish = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let mut desired: BTreeMap<PortKey, (Vec<EndpointPort>, DesiredSet)> = BTreeMap::new();
    for pod in pods {
        if !podutil::should_be_endpoint(pod, true) {
            continue;
        }
        let ports = endpoint_ports(service, pod);
        let key = port_key(&ports);
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let zone = match nodes.get(&node_name) {
            Some(z) => z.as_deref(),
            None if publish => None,
            None => {
                out.missing_nodes.insert(node_name);
                continue;
            }
        };
        let ep = pod_to_endpoint(pod, zone, service, address_type);
        let group = desired
            .entry(key)
            .or_insert_with(|| (ports, BTreeMap::new()));
        if !ep.addresses.is_empty() {
            group.1.insert(endpoint_key(&ep), ep);
        }
    }

    let labels = slice_labels(service);
    for (key, (ports, set)) in desired.iter_mut() {
        let existing = existing_by_ports
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let (c, u, d) =
            reconcile_port_mapping(service, existing, set, ports, address_type, &labels, max);
        create.extend(c);
        update.extend(u);
        delete.extend(d);
    }
    for (key, slices) in &existing_by_ports {
        if !desired.contains_key(key) {
            delete.extend(slices.iter().map(|s| (*s).clone()));
        }
    }

    if existing.len() == delete.len() && create.is_empty() {
        let placeholder = new_slice(service, Vec::new(), address_type);
        if delete.len() == 1 && is_placeholder(&delete[0], &placeholder) {
            delete.clear();
        } else {
            create.push(placeholder);
        }
    }

    // Recycle: a slice that would be deleted takes the content of one to be created.
    let mut i = 0;
    while i < delete.len() && !create.is_empty() {
        if delete[i].address_type == address_type && owned_by(&delete[i], service) {
            let old = delete.remove(i);
            let mut slice = create.pop().unwrap_or_else(|| unreachable!());
            slice.metadata.generate_name = old.metadata.generate_name.clone();
            slice.metadata.name = old.metadata.name.clone();
            slice.metadata.resource_version = old.metadata.resource_version.clone();
            slice.metadata.uid = old.metadata.uid.clone();
            slice.metadata.annotations = old.metadata.annotations.clone();
            update.push(slice);
        } else {
            i += 1;
        }
    }
    out.create.extend(create);
    out.update.extend(update);
    out.delete.extend(delete);
}

/// Upstream's `reconcileByPortMapping`, for one group of slices that share a port set.
fn reconcile_port_mapping(
    service: &Service,
    existing: &[&EndpointSlice],
    desired: &mut DesiredSet,
    ports: &[EndpointPort],
    address_type: &str,
    labels: &BTreeMap<String, String>,
    max: usize,
) -> (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<EndpointSlice>) {
    let mut by_name: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut unchanged: BTreeSet<String> = BTreeSet::new();
    let mut to_update: BTreeSet<String> = BTreeSet::new();
    let mut to_delete: BTreeSet<String> = BTreeSet::new();

    // 1. Keep desired endpoints where they are, drop the others, refresh changed ones.
    for slice in existing {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let mut kept = Vec::new();
        let mut changed = false;
        for ep in &slice.endpoints {
            if let Some(want) = desired.remove(&endpoint_key(ep)) {
                changed |= want != *ep;
                kept.push(want);
            }
        }
        let labels_changed = slice.metadata.labels.as_ref() != Some(labels);
        if changed || kept.len() != slice.endpoints.len() {
            if kept.is_empty() {
                to_delete.insert(name.clone());
                by_name.insert(name, (*slice).clone());
            } else {
                let mut s = (*slice).clone();
                s.endpoints = kept;
                s.metadata.labels = Some(labels.clone());
                to_update.insert(name.clone());
                by_name.insert(name, s);
            }
        } else if labels_changed {
            let mut s = (*slice).clone();
            s.metadata.labels = Some(labels.clone());
            to_update.insert(name.clone());
            by_name.insert(name, s);
        } else {
            unchanged.insert(name.clone());
            by_name.insert(name, (*slice).clone());
        }
    }

    // 2. Fill the slices that change anyway, fullest first.
    if !desired.is_empty() && !to_update.is_empty() {
        let mut names: Vec<&String> = to_update.iter().collect();
        names.sort_by_key(|n| std::cmp::Reverse(by_name[*n].endpoints.len()));
        for name in names {
            if let Some(slice) = by_name.get_mut(name) {
                while slice.endpoints.len() < max {
                    let Some((_, ep)) = desired.pop_first() else {
                        break;
                    };
                    slice.endpoints.push(ep);
                }
            }
        }
    }

    // 3. Put the rest into the unchanged slice they fit best, or into new slices.
    let mut create = Vec::new();
    while !desired.is_empty() {
        let mut fill: Option<EndpointSlice> = None;
        if desired.len() < max && !unchanged.is_empty() {
            let candidates = unchanged.iter().map(|n| &by_name[n]);
            fill = slice_to_fill(candidates, desired.len(), max).cloned();
        }
        let mut slice = fill.unwrap_or_else(|| new_slice(service, ports.to_vec(), address_type));
        while slice.endpoints.len() < max {
            let Some((_, ep)) = desired.pop_first() else {
                break;
            };
            slice.endpoints.push(ep);
        }
        match slice.metadata.name.clone() {
            Some(name) => {
                unchanged.remove(&name);
                to_update.insert(name.clone());
                by_name.insert(name, slice);
            }
            None => create.push(slice),
        }
    }

    let take = |names: &BTreeSet<String>, by_name: &BTreeMap<String, EndpointSlice>| {
        names
            .iter()
            .filter_map(|n| by_name.get(n).cloned())
            .collect::<Vec<_>>()
    };
    (
        create,
        take(&to_update, &by_name),
        take(&to_delete, &by_name),
    )
}

/// Upstream's `getSliceToFill`: the slice that ends up closest to full.
fn slice_to_fill<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    n: usize,
    max: usize,
) -> Option<&'a EndpointSlice> {
    let mut best: Option<(&EndpointSlice, usize)> = None;
    for s in slices {
        let used = n + s.endpoints.len();
        if used > max {
            continue;
        }
        let diff = max - used;
        if best.is_none_or(|(_, d)| diff < d) {
            best = Some((s, diff));
            if diff == 0 {
                break;
            }
        }
    }
    best.map(|(s, _)| s)
}

#[cfg(test)]
#[path = "endpointslice_tests.rs"]
mod tests;
