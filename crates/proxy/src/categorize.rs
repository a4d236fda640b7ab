//! The ONE endpoint-selection function every dataplane uses (upstream's `CategorizeEndpoints`).
//!
//! **Invariant:** no dataplane filters endpoints itself; readiness, terminating fallback,
//! topology and traffic-policy locality are all decided here.

use crate::endpoints::EndpointInfo;

/// This node as endpoint selection sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTopology {
    pub name: String,
    /// `topology.kubernetes.io/zone` of the node, if labelled.
    pub zone: Option<String>,
}

/// Endpoints of one service port, split by how they may be used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized<'a> {
    /// For `Cluster` traffic policy: ready endpoints (narrowed by topology hints when every
    /// ready endpoint has them); if none is ready anywhere, serving-and-terminating ones.
    pub cluster: Vec<&'a EndpointInfo>,
    /// For `Local` traffic policy: this node's ready endpoints; if none, this node's
    /// serving-and-terminating ones. Empty unless `need_local`.
    pub local: Vec<&'a EndpointInfo>,
    /// Whether any usable endpoint exists at all; decides reject (none anywhere) versus drop
    /// (only the local set is empty).
    pub has_any: bool,
}

impl EndpointInfo {
    fn is_local(&self, node: &NodeTopology) -> bool {
        self.node_name.as_deref() == Some(node.name.as_str())
    }
    fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
    /// Whether `hints.forNodes` names `node`.
    fn hinted_for_node(&self, node: &str) -> bool {
        self.node_hints
            .iter()
            .flat_map(|h| h.iter())
            .any(|n| **n == *node)
    }
    /// Whether `hints.forZones` names `zone`.
    fn hinted_for_zone(&self, zone: &str) -> bool {
        self.zone_hints
            .iter()
            .flat_map(|h| h.iter())
            .any(|z| **z == *zone)
    }
}

/// A predicate selecting endpoints for this node's topology.
type Filter<'n> = Box<dyn Fn(&EndpointInfo) -> bool + 'n>;

/// Which topology filter applies, following upstream's all-or-nothing safeguard: a hint kind
/// is honoured only when EVERY ready endpoint carries it and at least one names this node
/// (or its zone); otherwise no filtering at all.
fn topology_filter<'n>(endpoints: &[EndpointInfo], node: &'n NodeTopology) -> Option<Filter<'n>> {
    let ready: Vec<&EndpointInfo> = endpoints.iter().filter(|e| e.ready).collect();
    if ready.is_empty() {
        return None;
    }
    let node_hinted = ready
        .iter()
        .all(|e| e.node_hints.as_ref().is_some_and(|h| !h.is_empty()));
    if node_hinted && ready.iter().any(|e| e.hinted_for_node(&node.name)) {
        return Some(Box::new(|e: &EndpointInfo| e.hinted_for_node(&node.name)));
    }
    let zone = node.zone.as_deref()?;
    let zone_hinted = ready
        .iter()
        .all(|e| e.zone_hints.as_ref().is_some_and(|h| !h.is_empty()));
    if zone_hinted && ready.iter().any(|e| e.hinted_for_zone(zone)) {
        return Some(Box::new(move |e: &EndpointInfo| e.hinted_for_zone(zone)));
    }
    None
}

/// Splits a service port's endpoints into the cluster-policy and local-policy sets.
pub fn categorize_endpoints<'a>(
    endpoints: &'a [EndpointInfo],
    node: &NodeTopology,
    need_local: bool,
) -> Categorized<'a> {
    let mut cluster: Vec<&EndpointInfo> = match topology_filter(endpoints, node) {
        Some(keep) => endpoints.iter().filter(|e| e.ready && keep(e)).collect(),
        None => endpoints.iter().filter(|e| e.ready).collect(),
    };
    if cluster.is_empty() {
        cluster = endpoints
            .iter()
            .filter(|e| e.serving_terminating())
            .collect();
    }
    let mut local = Vec::new();
    if need_local {
        local = endpoints
            .iter()
            .filter(|e| e.ready && e.is_local(node))
            .collect();
        if local.is_empty() {
            local = endpoints
                .iter()
                .filter(|e| e.serving_terminating() && e.is_local(node))
                .collect();
        }
    }
    let has_any = !cluster.is_empty() || !local.is_empty();
    Categorized {
        cluster,
        local,
        has_any,
    }
}
