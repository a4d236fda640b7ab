//! Pod facts the endpoint controllers share: readiness, terminal/terminating state, IPs,
//! named-port resolution and the hostname rule. One definition, used by every controller, as
//! upstream's `k8s.io/endpointslice/util` and `pkg/api/v1/pod` helpers.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The pod's `Ready` condition is `True`.
/// Whether a pod's labels satisfy `selector` (no labels: the empty set).
pub(crate) fn labels_match(
    selector: &svcnet_apimachinery::selector::LabelSelector,
    pod: &Pod,
) -> bool {
    match &pod.metadata.labels {
        Some(labels) => selector.matches(labels),
        None => selector.matches(&std::collections::BTreeMap::new()),
    }
}

pub(crate) fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The pod is `Running` and `Ready` (what StatefulSet ordering waits for).
pub(crate) fn is_running_and_ready(pod: &Pod) -> bool {
    phase(pod) == "Running" && is_ready(pod)
}

pub(crate) fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// `Succeeded` or `Failed`: the pod will never run again.
pub(crate) fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

/// Deletion has been requested (`metadata.deletionTimestamp` is set).
pub(crate) fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Active pods count towards a workload's replicas: not terminal, not being deleted.
pub(crate) fn is_active(pod: &Pod) -> bool {
    !is_terminal(pod) && !is_terminating(pod)
}

/// The pod's IPs: `status.podIPs`, or `status.podIP` when the list is empty (servers that do
/// not default the list from the single field).
pub(crate) fn pod_ips(pod: &Pod) -> Vec<String> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let list: Vec<String> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    if !list.is_empty() {
        return list;
    }
    status
        .pod_ip
        .iter()
        .filter(|ip| !ip.is_empty())
        .cloned()
        .collect()
}

/// Upstream's `ShouldPodBeInEndpoints`: terminal pods and pods without an IP never are; pods
/// being deleted only when `include_terminating`.
pub(crate) fn should_be_endpoint(pod: &Pod, include_terminating: bool) -> bool {
    if is_terminal(pod) || pod_ips(pod).is_empty() {
        return false;
    }
    include_terminating || !is_terminating(pod)
}

/// `Some(true)` for an IPv6 address, `Some(false)` for IPv4, `None` when it does not parse.
pub(crate) fn is_ipv6(ip: &str) -> Option<bool> {
    ip.parse::<IpAddr>().ok().map(|a| a.is_ipv6())
}

/// The address in canonical text form (upstream re-stringifies parsed IPs).
pub(crate) fn canonical_ip(ip: &str) -> Option<String> {
    ip.parse::<IpAddr>().ok().map(|a| a.to_string())
}

pub(crate) fn protocol(sp: &ServicePort) -> String {
    sp.protocol.clone().unwrap_or_else(|| "TCP".to_string())
}

/// Upstream's `FindPort`: a numeric `targetPort` is used as is (defaulting to `port`); a named
/// one is looked up by name and protocol in the pod's containers, then in its sidecar
/// (`restartPolicy: Always`) init containers. `None` when the pod does not expose it.
pub(crate) fn find_port(pod: &Pod, sp: &ServicePort) -> Option<i32> {
    match &sp.target_port {
        None => Some(sp.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            // A numeric string is a number (the API server normally converts it).
            if let Ok(n) = name.parse::<i32>() {
                return Some(n);
            }
            let proto = protocol(sp);
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == proto
                })
                .map(|p| p.container_port)
        }
    }
}

/// Upstream's `ShouldSetHostname`: the pod has a hostname and its subdomain names this
/// service in the pod's namespace.
pub(crate) fn should_set_hostname(pod: &Pod, svc: &Service) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let hostname = spec.hostname.as_deref().unwrap_or("");
    !hostname.is_empty()
        && spec.subdomain.as_deref() == svc.metadata.name.as_deref()
        && pod.metadata.namespace == svc.metadata.namespace
}

/// The service has a cluster IP (it is not headless and not ExternalName without one).
pub(crate) fn is_service_ip_set(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// The service's selector, if it has a non-empty one. Services without a selector get no
/// controller-managed endpoints: their Endpoints are the user's.
pub(crate) fn service_selector(
    svc: &Service,
) -> Option<&std::collections::BTreeMap<String, String>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
}
