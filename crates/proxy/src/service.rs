//! What the proxy needs from a `Service`: a validated, comparable digest (`ServiceInfo`).
//!
//! The change tracker compares digests, not raw objects, so a change the proxy does not care
//! about (a label, an annotation, a status condition) is a no-op and never triggers a sync.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

use crate::names::{IpFamily, NamespacedName, Protocol};

/// Label naming the proxy that owns a service; services carrying it are skipped (KEP-2447).
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Session-affinity timeout when `sessionAffinityConfig` leaves it unset: 3 hours.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

/// A service the proxy cannot program, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("service {service}: field {field}: {message}")]
pub struct ServiceError {
    pub service: NamespacedName,
    pub field: String,
    pub message: String,
}

/// `Cluster` or `Local` (internal and external traffic policies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// One port of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortInfo {
    /// The port's `name` (empty for a single unnamed port).
    pub name: Box<str>,
    pub protocol: Protocol,
    pub port: u16,
    pub node_port: Option<u16>,
}

/// A service's cluster IPs, at most one per family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterIps {
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
}

impl ClusterIps {
    /// The cluster IP of `family`.
    pub fn get(&self, family: IpFamily) -> Option<IpAddr> {
        match family {
            IpFamily::V4 => self.v4.map(IpAddr::V4),
            IpFamily::V6 => self.v6.map(IpAddr::V6),
        }
    }

    /// Sets the cluster IP of `ip`'s family; `false` (and nothing changed) when that family
    /// already has one.
    pub fn insert(&mut self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) if self.v4.is_none() => self.v4 = Some(v4),
            IpAddr::V6(v6) if self.v6.is_none() => self.v6 = Some(v6),
            _ => return false,
        }
        true
    }
}

/// The proxy's digest of one Service (only services the proxy programs have one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Shared with the proxy state's keys (one copy per service).
    pub name: Arc<NamespacedName>,
    pub cluster_ips: ClusterIps,
    pub ports: Box<[ServicePortInfo]>,
    pub external_ips: Box<[IpAddr]>,
    /// Load-balancer ingress IPs; `ipMode: Proxy` ingresses are not short-circuited (KEP-1860)
    /// and so never appear here.
    pub load_balancer_ips: Box<[IpAddr]>,
    pub load_balancer_source_ranges: Box<[IpNet]>,
    /// `Some(timeout seconds)` for `sessionAffinity: ClientIP`.
    pub affinity_timeout: Option<u32>,
    pub internal_policy: TrafficPolicy,
    pub external_policy: TrafficPolicy,
    pub health_check_node_port: Option<u16>,
    /// The `svcnet.io/lb-algorithm` annotation; `None` when absent or not an algorithm (see
    /// [`crate::algorithm`]).
    pub lb_algorithm: Option<svcnet_lb::Algorithm>,
}

fn err(service: &NamespacedName, field: &str, message: impl Into<String>) -> ServiceError {
    ServiceError {
        service: service.clone(),
        field: field.to_string(),
        message: message.into(),
    }
}

fn port_u16(service: &NamespacedName, field: &str, value: i32) -> Result<u16, ServiceError> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            err(
                service,
                field,
                format!("{value} is not a port number (1-65535)"),
            )
        })
}

fn parse_ip(service: &NamespacedName, field: &str, value: &str) -> Result<IpAddr, ServiceError> {
    value
        .parse()
        .map_err(|_| err(service, field, format!("{value:?} is not an IP address")))
}

fn parse_policy(
    service: &NamespacedName,
    field: &str,
    value: Option<&str>,
) -> Result<TrafficPolicy, ServiceError> {
    match value {
        None | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(err(
            service,
            field,
            format!("{other:?} is neither Cluster nor Local"),
        )),
    }
}

/// Digests a Service. `Ok(None)` means the proxy deliberately ignores it: headless,
/// ExternalName, no cluster IP yet, or owned by another proxy (`service-proxy-name` label).
pub fn service_info(svc: &Service) -> Result<Option<ServiceInfo>, ServiceError> {
    let name = NamespacedName::new(
        svc.metadata.namespace.clone().unwrap_or_default(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    if svc
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL))
    {
        return Ok(None);
    }
    let Some(spec) = &svc.spec else {
        return Ok(None);
    };
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    if type_ == "ExternalName" {
        return Ok(None);
    }
    let mut raw_ips: Vec<&str> = spec
        .cluster_ips
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    if raw_ips.is_empty() {
        raw_ips.extend(spec.cluster_ip.as_deref());
    }
    if raw_ips.is_empty() || raw_ips.iter().any(|ip| *ip == "None" || ip.is_empty()) {
        return Ok(None);
    }
    let mut cluster_ips = ClusterIps::default();
    for (i, raw) in raw_ips.iter().enumerate() {
        let ip = parse_ip(&name, &format!("spec.clusterIPs[{i}]"), raw)?;
        if !cluster_ips.insert(ip) {
            return Err(err(
                &name,
                "spec.clusterIPs",
                "two cluster IPs of the same family",
            ));
        }
    }

    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let protocol = Protocol::from_api(p.protocol.as_deref()).ok_or_else(|| {
            err(
                &name,
                &format!("spec.ports[{i}].protocol"),
                "must be TCP, UDP or SCTP",
            )
        })?;
        let port = port_u16(&name, &format!("spec.ports[{i}].port"), p.port)?;
        let node_port = match p.node_port {
            Some(np) if type_ == "NodePort" || type_ == "LoadBalancer" => {
                Some(port_u16(&name, &format!("spec.ports[{i}].nodePort"), np)?)
            }
            _ => None,
        };
        ports.push(ServicePortInfo {
            name: p.name.as_deref().unwrap_or_default().into(),
            protocol,
            port,
            node_port,
        });
    }

    let mut external_ips = Vec::new();
    for (i, raw) in spec.external_ips.iter().flatten().enumerate() {
        external_ips.push(parse_ip(&name, &format!("spec.externalIPs[{i}]"), raw)?);
    }
    let mut load_balancer_ips = Vec::new();
    if type_ == "LoadBalancer" {
        let ingresses = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        for (i, ing) in ingresses
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .enumerate()
        {
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            if let Some(raw) = &ing.ip {
                let field = format!("status.loadBalancer.ingress[{i}].ip");
                load_balancer_ips.push(parse_ip(&name, &field, raw)?);
            }
        }
    }
    let mut load_balancer_source_ranges = Vec::new();
    for (i, raw) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        let field = format!("spec.loadBalancerSourceRanges[{i}]");
        let net: IpNet = raw
            .trim()
            .parse()
            .map_err(|_| err(&name, &field, format!("{raw:?} is not a CIDR")))?;
        load_balancer_source_ranges.push(net.trunc());
    }

    let affinity_timeout = match spec.session_affinity.as_deref() {
        None | Some("None") => None,
        Some("ClientIP") => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match t {
                None => Some(DEFAULT_AFFINITY_TIMEOUT_SECONDS),
                Some(t) if (1..=86_400).contains(&t) => Some(t.unsigned_abs()),
                Some(t) => {
                    let field = "spec.sessionAffinityConfig.clientIP.timeoutSeconds";
                    return Err(err(&name, field, format!("{t} is not within 1..=86400")));
                }
            }
        }
        Some(other) => {
            let msg = format!("{other:?} is neither None nor ClientIP");
            return Err(err(&name, "spec.sessionAffinity", msg));
        }
    };
    let internal_policy = parse_policy(
        &name,
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
    )?;
    // externalTrafficPolicy only means something for services reachable from outside.
    let externally_reachable =
        type_ == "NodePort" || type_ == "LoadBalancer" || !external_ips.is_empty();
    let external_policy = if externally_reachable {
        parse_policy(
            &name,
            "spec.externalTrafficPolicy",
            spec.external_traffic_policy.as_deref(),
        )?
    } else {
        TrafficPolicy::Cluster
    };
    let health_check_node_port = match spec.health_check_node_port {
        Some(p) if external_policy == TrafficPolicy::Local && type_ == "LoadBalancer" => {
            Some(port_u16(&name, "spec.healthCheckNodePort", p)?)
        }
        _ => None,
    };
    Ok(Some(ServiceInfo {
        name: Arc::new(name),
        cluster_ips,
        ports: ports.into_boxed_slice(),
        external_ips: external_ips.into_boxed_slice(),
        load_balancer_ips: load_balancer_ips.into_boxed_slice(),
        load_balancer_source_ranges: load_balancer_source_ranges.into_boxed_slice(),
        affinity_timeout,
        internal_policy,
        external_policy,
        health_check_node_port,
        lb_algorithm: crate::algorithm::annotated_algorithm(svc).ok().flatten(),
    }))
}
