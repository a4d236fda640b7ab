//! What the proxy needs from EndpointSlices: per service port, the endpoints with their
//! conditions and topology, merged across all slices of a service.
//!
//! Every node's proxy holds every endpoint of the cluster, so the digest is kept small: the
//! strings endpoints repeat (node names, zones, hints, port names) are shared through
//! [`Names`], a port's endpoints are an exact-size boxed slice, and a service's ports a sorted
//! boxed slice rather than a map (one or two ports is the common case).

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::names::{NamespacedName, Protocol};

/// Label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One endpoint as the slice reports it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndpointInfo {
    pub ip: IpAddr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    /// `hints.forZones`; `None` when the endpoint carries no zone hints.
    pub zone_hints: Option<Arc<[Arc<str>]>>,
    /// `hints.forNodes`; `None` when the endpoint carries no node hints.
    pub node_hints: Option<Arc<[Arc<str>]>>,
}

/// Key of one port within a service's endpoints: the port name and protocol.
pub type PortKey = (Arc<str>, Protocol);

/// All endpoints of one service, by port, merged across its slices and sorted (so equal
/// contents compare equal whatever the slice layout).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceEndpoints {
    /// Sorted by key, one entry per key, no empty list.
    ports: Box<[(PortKey, Box<[EndpointInfo]>)]>,
}

impl ServiceEndpoints {
    /// The endpoints of the port named `name` with `protocol` (empty when there is none).
    pub fn get(&self, name: &str, protocol: Protocol) -> &[EndpointInfo] {
        self.ports
            .binary_search_by(|((n, p), _)| (&**n, *p).cmp(&(name, protocol)))
            .map_or(&[], |i| &self.ports[i].1)
    }

    /// Every port with its endpoints, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&PortKey, &[EndpointInfo])> {
        self.ports.iter().map(|(k, v)| (k, &**v))
    }

    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// Sorts each port's endpoints and keeps one entry per IP:port, preferring the ready copy
    /// (the same address listed by two slices is possible while a controller moves endpoints
    /// between slices); ports left without endpoints are dropped.
    fn normalized(ports: BTreeMap<PortKey, Vec<EndpointInfo>>) -> Self {
        let ports = ports
            .into_iter()
            .filter_map(|(key, mut list)| {
                // Ready before not-ready for the same address, then dedup keeps the first.
                list.sort_by_key(|e| (e.ip, e.port, !e.ready));
                list.dedup_by(|b, a| a.ip == b.ip && a.port == b.port);
                (!list.is_empty()).then(|| (key, list.into_boxed_slice()))
            })
            .collect();
        Self { ports }
    }

    /// Merges the endpoints of several slices' digests into one (see [`Self::normalized`]).
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a ServiceEndpoints>) -> Self {
        let mut ports: BTreeMap<PortKey, Vec<EndpointInfo>> = BTreeMap::new();
        for part in parts {
            for (key, list) in part.iter() {
                ports
                    .entry(key.clone())
                    .or_default()
                    .extend_from_slice(list);
            }
        }
        Self::normalized(ports)
    }
}

/// Shares equal strings among the endpoints one proxy holds: a cluster has a few node names,
/// zones and port names, and each is repeated by many endpoints.
#[derive(Debug, Default)]
pub struct Names {
    set: HashSet<Arc<str>>,
    /// Size after the last prune; the next prune waits until the set has doubled.
    kept: usize,
}

impl Names {
    /// The shared copy of `s`.
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.set.get(s) {
            return shared.clone();
        }
        if self.set.len() >= 2 * self.kept + 64 {
            // Forget names nothing holds any more (nodes that left), amortised over growth.
            self.set.retain(|n| Arc::strong_count(n) > 1);
            self.kept = self.set.len();
        }
        let shared: Arc<str> = Arc::from(s);
        self.set.insert(shared.clone());
        shared
    }

    fn list(&mut self, names: impl Iterator<Item = impl AsRef<str>>) -> Arc<[Arc<str>]> {
        names.map(|n| self.get(n.as_ref())).collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.set.len()
    }
}

/// The service an EndpointSlice belongs to, from its `kubernetes.io/service-name` label.
pub fn slice_service(slice: &EndpointSlice) -> Option<NamespacedName> {
    let ns = slice.metadata.namespace.clone().unwrap_or_default();
    let svc = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(NamespacedName::new(ns, svc.clone()))
}

/// Adds one slice's endpoints to `out`. FQDN slices and malformed entries are skipped (the
/// proxy can only program IPs); an endpoint uses its first address, as upstream does.
fn add_slice(
    out: &mut BTreeMap<PortKey, Vec<EndpointInfo>>,
    slice: &EndpointSlice,
    names: &mut Names,
) {
    if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
        return;
    }
    for port in slice.ports.iter().flatten() {
        let Some(protocol) = Protocol::from_api(port.protocol.as_deref()) else {
            continue;
        };
        let Some(number) = port
            .port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
        else {
            continue;
        };
        let key = (
            names.get(port.name.as_deref().unwrap_or_default()),
            protocol,
        );
        let list = out.entry(key).or_default();
        for ep in &slice.endpoints {
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            let cond = ep.conditions.as_ref();
            // Unset `ready` means ready; unset `serving` follows `ready` (API semantics).
            let ready = cond.and_then(|c| c.ready).unwrap_or(true);
            let hints = ep.hints.as_ref();
            list.push(EndpointInfo {
                ip,
                port: number,
                ready,
                serving: cond.and_then(|c| c.serving).unwrap_or(ready),
                terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
                node_name: ep.node_name.as_deref().map(|n| names.get(n)),
                zone: ep.zone.as_deref().map(|z| names.get(z)),
                zone_hints: hints
                    .and_then(|h| h.for_zones.as_ref())
                    .map(|z| names.list(z.iter().map(|z| &z.name))),
                node_hints: hints
                    .and_then(|h| h.for_nodes.as_ref())
                    .map(|n| names.list(n.iter().map(|n| &n.name))),
            });
        }
    }
}

/// Merges all slices of one service, its strings shared through `names`. The same IP:port
/// listed by two slices is kept once, preferring the ready copy.
pub fn merge_slices<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    names: &mut Names,
) -> ServiceEndpoints {
    let mut out = BTreeMap::new();
    for slice in slices {
        add_slice(&mut out, slice, names);
    }
    ServiceEndpoints::normalized(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_shared_and_forgotten_when_nothing_holds_them() {
        let mut names = Names::default();
        let a = names.get("node-1");
        let b = names.get("node-1");
        assert!(Arc::ptr_eq(&a, &b), "one copy of a repeated name");
        // Names of nodes that left are forgotten once the set has grown enough to look.
        for i in 0..200 {
            drop(names.get(&format!("gone-{i}")));
        }
        assert!(names.len() < 100, "{} names held", names.len());
        assert!(Arc::ptr_eq(&a, &names.get("node-1")), "a held name stays");
    }
}
