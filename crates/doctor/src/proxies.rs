//! Whether the node proxies program what the API says: each svcnet proxy publishes a Lease
//! (`svcnet_proxy::status`) with its last sync and the revisions its rules reach. A proxy that
//! stopped, whose lease expired (killed, or cut off from the API server), that fails to sync,
//! or that is missing on a node while other nodes have one, leaves that node's service rules
//! as they were; a service whose EndpointSlices are newer than what a running proxy applied
//! is served from stale rules there.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;
use svcnet_proxy::status::{ProxyStatus, revision};

use crate::{Finding, Severity, Snapshot, ns_name};

fn ago(now: Timestamp, then: Option<Timestamp>) -> String {
    match then {
        Some(t) => format!("{} s ago", (now.as_second() - t.as_second()).max(0)),
        None => "never".into(),
    }
}

/// Findings about the proxies themselves, one set per node (they concern every service).
pub(crate) fn node_proxy_checks(snap: &Snapshot, out: &mut Vec<Finding>) {
    let Some(now) = snap.now else { return };
    let mut push = |node: &str, severity, check, message: String, fix: &str| {
        out.push(Finding {
            severity,
            object: format!("node/{node}"),
            check,
            message,
            fix: fix.into(),
        })
    };
    for p in &snap.proxies {
        let node = p.node.as_str();
        if let Some(at) = p.stopped {
            push(
                node,
                Severity::Error,
                "proxy-not-running",
                format!(
                    "the {} proxy on node {node} stopped {}: the node's service rules stay as they were and no change reaches them",
                    p.mode,
                    ago(now, Some(at))
                ),
                "start the node's proxy again (svcnet proxy, or the svcnet up that ran it)",
            );
        } else if p.expired(now) {
            push(
                node,
                Severity::Error,
                "proxy-not-running",
                format!(
                    "the {} proxy on node {node} last reported {} (its lease expires after {} s): it is not running or cannot reach the API server, so the node's service rules are not updated",
                    p.mode,
                    ago(now, p.renewed),
                    p.duration_seconds
                ),
                "check the node's proxy process and its logs; it renews its lease every 10 s while it runs",
            );
        } else if let Some(e) = &p.sync_error {
            push(
                node,
                Severity::Error,
                "proxy-sync-failing",
                format!(
                    "the {} proxy on node {node} cannot apply its rules: {e} (last successful sync {})",
                    p.mode,
                    ago(now, p.last_sync)
                ),
                "fix what the error names (a missing tool or kernel module, a permission); the proxy retries on its own",
            );
        }
    }
    if snap.proxies.is_empty() {
        return; // svcnet's proxy does not run here (another proxy may): nothing to compare.
    }
    for n in &snap.nodes {
        let name = n.metadata.name.as_deref().unwrap_or("");
        if n.metadata.deletion_timestamp.is_none() && !snap.proxies.iter().any(|p| p.node == name) {
            push(
                name,
                Severity::Warning,
                "proxy-missing",
                format!(
                    "node {name} has no svcnet proxy reporting while other nodes do, so no service rules may be programmed on it"
                ),
                "run the proxy on the node (the svcnet DaemonSet, or svcnet proxy --node-name)",
            );
        }
    }
}

/// The service's rules on each running proxy: stale when its Service or EndpointSlices are
/// newer than what that proxy last applied.
pub(crate) fn service_rule_checks(
    snap: &Snapshot,
    svc: &Service,
    object: &str,
    out: &mut Vec<Finding>,
) {
    let Some(now) = snap.now else { return };
    let (ns, name) = ns_name(&svc.metadata);
    let service_rev = revision(svc.metadata.resource_version.as_deref());
    let slices_rev = snap
        .slices
        .iter()
        .filter(|s| {
            s.metadata.namespace.as_deref().unwrap_or("default") == ns
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .is_some_and(|n| n == name)
        })
        .filter_map(|s| revision(s.metadata.resource_version.as_deref()))
        .max();
    let behind = |have: Option<u64>, want: Option<u64>| match (have, want) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(h), Some(w)) => h < w,
    };
    for p in running(snap, now) {
        let stale_slices = behind(p.slices_revision, slices_rev);
        let stale_service = behind(p.services_revision, service_rev);
        if !stale_slices && !stale_service {
            continue;
        }
        let what = match (stale_service, stale_slices) {
            (true, true) => "the Service and its endpoints",
            (true, false) => "the Service",
            _ => "its endpoints",
        };
        out.push(Finding {
            severity: Severity::Warning,
            object: object.into(),
            check: "proxy-rules-stale",
            message: format!(
                "the rules of the proxy on node {} are older than {what}: it applied services up to revision {} and endpoints up to {}, the Service is at {} and its EndpointSlices at {} (last successful sync {})",
                p.node,
                opt(p.services_revision),
                opt(p.slices_revision),
                opt(service_rev),
                opt(slices_rev),
                ago(now, p.last_sync)
            ),
            fix: "check that proxy's logs and /healthz (lastUpdated); a proxy that keeps up applies a change within its --min-sync-period".into(),
        });
    }
}

fn running(snap: &Snapshot, now: Timestamp) -> impl Iterator<Item = &ProxyStatus> {
    snap.proxies
        .iter()
        .filter(move |p| p.stopped.is_none() && !p.expired(now))
}

fn opt(r: Option<u64>) -> String {
    r.map_or_else(|| "none".into(), |r| r.to_string())
}
