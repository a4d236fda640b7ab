//! Service defaulting (upstream `SetDefaults_Service` plus the registry's
//! `PrepareForCreate`/`PrepareForUpdate` normalisation).

use k8s_openapi::api::core::v1::{ClientIPConfig, Service, ServiceSpec, SessionAffinityConfig};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// `DefaultClientIPServiceAffinitySeconds`: three hours.
pub const DEFAULT_CLIENT_IP_TIMEOUT: i32 = 10800;

pub(crate) fn type_of(spec: &ServiceSpec) -> &str {
    spec.type_.as_deref().unwrap_or("ClusterIP")
}

pub(crate) fn externally_accessible(spec: &ServiceSpec) -> bool {
    matches!(type_of(spec), "NodePort" | "LoadBalancer")
        || spec.external_ips.as_ref().is_some_and(|v| !v.is_empty())
}

pub(crate) fn needs_cluster_ip(spec: &ServiceSpec) -> bool {
    type_of(spec) != "ExternalName"
}

pub(crate) fn needs_node_ports(spec: &ServiceSpec) -> bool {
    matches!(type_of(spec), "NodePort" | "LoadBalancer")
}

pub(crate) fn needs_hc_node_port(spec: &ServiceSpec) -> bool {
    type_of(spec) == "LoadBalancer" && spec.external_traffic_policy.as_deref() == Some("Local")
}

pub(crate) fn is_headless(spec: &ServiceSpec) -> bool {
    spec.cluster_ip.as_deref() == Some("None")
}

fn empty(s: &Option<String>) -> bool {
    s.as_deref().unwrap_or("").is_empty()
}

/// The defaults of `pkg/apis/core/v1/defaults.go` for a Service.
pub(crate) fn set_defaults(svc: &mut Service) {
    let spec = svc.spec.get_or_insert_with(Default::default);
    if empty(&spec.session_affinity) {
        spec.session_affinity = Some("None".into());
    }
    match spec.session_affinity.as_deref() {
        Some("None") => spec.session_affinity_config = None,
        Some("ClientIP") => {
            let has_timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .is_some();
            if !has_timeout {
                spec.session_affinity_config = Some(SessionAffinityConfig {
                    client_ip: Some(ClientIPConfig {
                        timeout_seconds: Some(DEFAULT_CLIENT_IP_TIMEOUT),
                    }),
                });
            }
        }
        _ => {}
    }
    if empty(&spec.type_) {
        spec.type_ = Some("ClusterIP".into());
    }
    for p in spec.ports.iter_mut().flatten() {
        if empty(&p.protocol) {
            p.protocol = Some("TCP".into());
        }
        let unset = match &p.target_port {
            None => true,
            Some(IntOrString::Int(0)) => true,
            Some(IntOrString::String(s)) => s.is_empty(),
            Some(IntOrString::Int(_)) => false,
        };
        if unset {
            p.target_port = Some(IntOrString::Int(p.port));
        }
    }
    if externally_accessible(spec) && empty(&spec.external_traffic_policy) {
        spec.external_traffic_policy = Some("Cluster".into());
    }
    if spec.internal_traffic_policy.is_none()
        && matches!(type_of(spec), "ClusterIP" | "NodePort" | "LoadBalancer")
    {
        spec.internal_traffic_policy = Some("Cluster".into());
    }
    if type_of(spec) == "LoadBalancer" && spec.allocate_load_balancer_node_ports.is_none() {
        spec.allocate_load_balancer_node_ports = Some(true);
    }
    let is_lb = type_of(spec) == "LoadBalancer";
    if is_lb {
        let ingress = svc
            .status
            .as_mut()
            .and_then(|s| s.load_balancer.as_mut())
            .and_then(|lb| lb.ingress.as_mut());
        for ing in ingress.into_iter().flatten() {
            if !empty(&ing.ip) && ing.ip_mode.is_none() {
                ing.ip_mode = Some("VIP".into());
            }
        }
    }
}

/// Upstream `NormalizeClusterIPs`: `clusterIPs` mirrors `clusterIP`.
pub(crate) fn normalize_cluster_ips(spec: &mut ServiceSpec, old: Option<&ServiceSpec>) {
    let ip = spec.cluster_ip.clone().unwrap_or_default();
    let ips = spec.cluster_ips.clone().unwrap_or_default();
    // On update, a user who changed only `clusterIP` must not be contradicted
    // by the `clusterIPs` they left as they were.
    if let Some(old) = old {
        let old_ip = old.cluster_ip.clone().unwrap_or_default();
        let old_ips = old.cluster_ips.clone().unwrap_or_default();
        if ip != old_ip && ips == old_ips {
            spec.cluster_ips = if ip.is_empty() { None } else { Some(vec![ip]) };
            return;
        }
    }
    if ip.is_empty() && !ips.is_empty() {
        spec.cluster_ip = Some(ips[0].clone());
    } else if !ip.is_empty() && ips.is_empty() {
        spec.cluster_ips = Some(vec![ip]);
    }
    if spec.cluster_ip.as_deref() == Some("") {
        spec.cluster_ip = None;
    }
    if spec.cluster_ips.as_ref().is_some_and(|v| v.is_empty()) {
        spec.cluster_ips = None;
    }
}

/// Upstream `patchAllocatedValues`: a user who omits the allocated values
/// on update (what `kubectl apply` and `replace` of a manifest do) keeps them.
pub(crate) fn patch_allocated_values(spec: &mut ServiceSpec, old: &ServiceSpec) {
    if needs_cluster_ip(old) && needs_cluster_ip(spec) {
        if empty(&spec.cluster_ip) {
            spec.cluster_ip = old.cluster_ip.clone();
        }
        if spec.cluster_ips.as_ref().is_none_or(|v| v.is_empty())
            && old.cluster_ips.as_ref().is_some_and(|v| !v.is_empty())
        {
            spec.cluster_ips = old.cluster_ips.clone();
        }
    }
    if needs_node_ports(old) && needs_node_ports(spec) {
        let used_by = |s: &ServiceSpec| -> Vec<i32> {
            s.ports
                .iter()
                .flatten()
                .filter_map(|p| p.node_port)
                .filter(|n| *n != 0)
                .collect()
        };
        let new_used = used_by(spec);
        let used: Vec<i32> = used_by(old)
            .into_iter()
            .filter(|n| new_used.contains(n))
            .collect();
        // Matched by port name, as upstream: other properties may have changed.
        let by_name: Vec<(String, i32)> = old
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.node_port.unwrap_or(0)))
            .collect();
        for p in spec.ports.iter_mut().flatten() {
            if p.node_port.unwrap_or(0) == 0 {
                let name = p.name.clone().unwrap_or_default();
                if let Some((_, np)) = by_name.iter().find(|(n, _)| *n == name)
                    && *np != 0
                    && !used.contains(np)
                {
                    p.node_port = Some(*np);
                }
            }
        }
    }
    if needs_hc_node_port(old)
        && needs_hc_node_port(spec)
        && spec.health_check_node_port.unwrap_or(0) == 0
    {
        spec.health_check_node_port = old.health_check_node_port;
    }
}

/// Upstream `dropTypeDependentFields`: on a type change, clear what the user
/// did not touch and the new type cannot have.
pub(crate) fn drop_type_dependent_fields(svc: &mut Service, old: &ServiceSpec) {
    let spec = svc.spec.get_or_insert_with(Default::default);
    if needs_cluster_ip(old) && !needs_cluster_ip(spec) {
        if spec.cluster_ip == old.cluster_ip && spec.cluster_ips == old.cluster_ips {
            spec.cluster_ip = None;
            spec.cluster_ips = None;
        }
        if spec.ip_families == old.ip_families {
            spec.ip_families = None;
        }
        if spec.ip_family_policy == old.ip_family_policy {
            spec.ip_family_policy = None;
        }
    }
    if needs_node_ports(old) && !needs_node_ports(spec) {
        let same = spec
            .ports
            .iter()
            .flatten()
            .map(|p| p.node_port.unwrap_or(0))
            .collect::<Vec<_>>()
            == old
                .ports
                .iter()
                .flatten()
                .map(|p| p.node_port.unwrap_or(0))
                .collect::<Vec<_>>();
        if same {
            for p in spec.ports.iter_mut().flatten() {
                p.node_port = None;
            }
        }
    }
    if needs_hc_node_port(old)
        && !needs_hc_node_port(spec)
        && spec.health_check_node_port == old.health_check_node_port
    {
        spec.health_check_node_port = None;
    }
    if type_of(old) == "LoadBalancer" && type_of(spec) != "LoadBalancer" {
        if spec.allocate_load_balancer_node_ports.is_some()
            && spec.allocate_load_balancer_node_ports == old.allocate_load_balancer_node_ports
        {
            spec.allocate_load_balancer_node_ports = None;
        }
        if spec.load_balancer_class == old.load_balancer_class {
            spec.load_balancer_class = None;
        }
    }
    if externally_accessible(old)
        && !externally_accessible(spec)
        && spec.external_traffic_policy == old.external_traffic_policy
    {
        spec.external_traffic_policy = None;
    }
    // Clearing the status of a service that is no longer a load balancer
    // takes the guess-work out of when its IP may be reused.
    if type_of(spec) != "LoadBalancer"
        && let Some(status) = svc.status.as_mut()
    {
        status.load_balancer = Some(Default::default());
    }
}
