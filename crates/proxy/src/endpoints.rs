//! What the proxy needs from EndpointSlices: per service port, the endpoints with their
//! conditions and topology, merged across all slices of a service.

use std::collections::BTreeMap;
use std::net::IpAddr;

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
    pub node_name: Option<String>,
    pub zone: Option<String>,
    /// `hints.forZones`; `None` when the endpoint carries no zone hints.
    pub zone_hints: Option<Vec<String>>,
    /// `hints.forNodes`; `None` when the endpoint carries no node hints.
    pub node_hints: Option<Vec<String>>,
}

/// Key of one port within a service's endpoints: the port name and protocol.
pub type PortKey = (String, Protocol);

/// All endpoints of one service, by port, merged across its slices and sorted (so equal
/// contents compare equal whatever the slice layout).
pub type ServiceEndpoints = BTreeMap<PortKey, Vec<EndpointInfo>>;

/// The service an EndpointSlice belongs to, from its `kubernetes.io/service-name` label.
pub fn slice_service(slice: &EndpointSlice) -> Option<NamespacedName> {
    let ns = slice.metadata.namespace.clone().unwrap_or_default();
    let svc = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(NamespacedName::new(ns, svc.clone()))
}

/// Adds one slice's endpoints to `out`. FQDN slices and malformed entries are skipped (the
/// proxy can only program IPs); an endpoint uses its first address, as upstream does.
pub fn add_slice(out: &mut ServiceEndpoints, slice: &EndpointSlice) {
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
        let list = out
            .entry((port.name.clone().unwrap_or_default(), protocol))
            .or_default();
        for ep in &slice.endpoints {
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            let cond = ep.conditions.clone().unwrap_or_default();
            // Unset `ready` means ready; unset `serving` follows `ready` (API semantics).
            let ready = cond.ready.unwrap_or(true);
            let hints = ep.hints.as_ref();
            list.push(EndpointInfo {
                ip,
                port: number,
                ready,
                serving: cond.serving.unwrap_or(ready),
                terminating: cond.terminating.unwrap_or(false),
                node_name: ep.node_name.clone(),
                zone: ep.zone.clone(),
                zone_hints: hints
                    .and_then(|h| h.for_zones.as_ref())
                    .map(|z| z.iter().map(|z| z.name.clone()).collect()),
                node_hints: hints
                    .and_then(|h| h.for_nodes.as_ref())
                    .map(|n| n.iter().map(|n| n.name.clone()).collect()),
            });
        }
    }
}

/// Merges all slices of one service. The same IP:port listed by two slices (possible while a
/// controller moves endpoints between slices) is kept once, preferring the ready copy.
pub fn merge_slices<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> ServiceEndpoints {
    let mut out = ServiceEndpoints::new();
    for slice in slices {
        add_slice(&mut out, slice);
    }
    normalize(&mut out);
    out
}

/// Sorts each port's endpoints and keeps one entry per IP:port, preferring the ready copy.
pub(crate) fn normalize(eps: &mut ServiceEndpoints) {
    for list in eps.values_mut() {
        // Ready before not-ready for the same address, then dedup keeps the first.
        list.sort_by_key(|e| (e.ip, e.port, !e.ready));
        list.dedup_by(|b, a| a.ip == b.ip && a.port == b.port);
    }
    eps.retain(|_, l| !l.is_empty());
}
