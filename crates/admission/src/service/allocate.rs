//! What a Service holds in the allocators, on create, update, delete and
//! rebuild. Each function mutates the live allocators; the caller rolls them
//! back on error (see `transactional` in the parent module).

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServiceSpec, ServiceStatus,
};
use serde_json::Value;

use super::defaults::{
    is_headless, needs_cluster_ip, needs_hc_node_port, needs_node_ports, type_of,
};
use crate::alloc::{Allocators, Protocol, family_of};
use crate::codec::owner_key;
use crate::error::FieldError;
use crate::syntax::parse_ip;

/// The `spec.loadBalancerClass` svcnet's built-in load-balancer controller
/// serves (besides services with no class at all).
pub const SVCNET_LB_CLASS: &str = "svcnet.io/load-balancer";

pub(crate) fn ips_of(spec: &ServiceSpec) -> Vec<IpAddr> {
    if !needs_cluster_ip(spec) {
        return Vec::new();
    }
    spec.cluster_ips
        .iter()
        .flatten()
        .filter_map(|s| parse_ip(s))
        .collect()
}

pub(crate) fn node_ports_of(spec: &ServiceSpec) -> BTreeSet<(u16, Protocol)> {
    if !needs_node_ports(spec) {
        return BTreeSet::new();
    }
    spec.ports
        .iter()
        .flatten()
        .filter_map(|p| {
            let np = u16::try_from(p.node_port.unwrap_or(0))
                .ok()
                .filter(|n| *n != 0)?;
            Some((np, Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?))
        })
        .collect()
}

pub(crate) fn hc_of(spec: &ServiceSpec) -> Option<u16> {
    if !needs_hc_node_port(spec) {
        return None;
    }
    u16::try_from(spec.health_check_node_port.unwrap_or(0))
        .ok()
        .filter(|n| *n != 0)
}

pub(crate) fn lb_ips_of(status: Option<&ServiceStatus>) -> Vec<IpAddr> {
    status
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref().and_then(parse_ip))
        .collect()
}

pub(crate) fn served_by_svcnet(spec: &ServiceSpec) -> bool {
    type_of(spec) == "LoadBalancer"
        && spec
            .load_balancer_class
            .as_deref()
            .is_none_or(|c| c == SVCNET_LB_CLASS)
}

pub(super) fn on_create(svc: &mut Service, allocs: &mut Allocators) -> Result<(), Vec<FieldError>> {
    on_update_inner(svc, None, allocs)
}

pub(super) fn on_update(
    svc: &mut Service,
    old: &Service,
    allocs: &mut Allocators,
) -> Result<(), Vec<FieldError>> {
    on_update_inner(svc, Some(old), allocs)
}

fn on_update_inner(
    svc: &mut Service,
    old: Option<&Service>,
    allocs: &mut Allocators,
) -> Result<(), Vec<FieldError>> {
    let owner = owner_key(&svc.metadata);
    let default_spec = ServiceSpec::default();
    let old_spec = old.and_then(|o| o.spec.as_ref());
    let spec = svc.spec.get_or_insert_with(Default::default);
    let mut errs = Vec::new();
    errs.extend(assign_cluster_ips(
        spec,
        old_spec.unwrap_or(&default_spec),
        allocs,
        &owner,
    ));
    errs.extend(assign_node_ports(
        spec,
        old_spec.unwrap_or(&default_spec),
        allocs,
        &owner,
    ));
    if !errs.is_empty() {
        return Err(errs);
    }
    assign_lb(svc, old.and_then(|o| o.status.as_ref()), allocs, &owner);
    Ok(())
}

fn assign_cluster_ips(
    spec: &mut ServiceSpec,
    old: &ServiceSpec,
    allocs: &mut Allocators,
    owner: &str,
) -> Vec<FieldError> {
    let old_ips = ips_of(old);
    let mut kept: Vec<IpAddr> = Vec::new();
    let mut errs = Vec::new();
    if needs_cluster_ip(spec) {
        let policy = spec.ip_family_policy.clone().unwrap_or_else(|| {
            if is_headless(spec) && spec.selector.as_ref().is_none_or(|s| s.is_empty()) {
                "RequireDualStack".into()
            } else {
                "SingleStack".into()
            }
        });
        let requested: Vec<String> = spec.cluster_ips.clone().unwrap_or_default();
        let mut families: Vec<String> = spec.ip_families.clone().unwrap_or_default();
        for (i, ip) in requested.iter().enumerate() {
            if let Some(addr) = parse_ip(ip)
                && families.get(i).is_none()
            {
                let fam = family_of(addr);
                if !allocs.families().contains(&fam) {
                    errs.push(FieldError::invalid(
                        format!("spec.clusterIPs[{i}]"),
                        &requested,
                        format!("{fam} is not configured on this cluster"),
                    ));
                }
                families.push(fam.to_string());
            }
        }
        if families.is_empty() {
            families.push(allocs.primary_family().to_string());
        }
        if is_headless(spec) {
            // Headless: no addresses, only families (selectorless headless
            // services are dual-stack unless told otherwise, as upstream).
            if policy != "SingleStack" && families.len() < 2 {
                let other = if families[0] == "IPv4" {
                    "IPv6"
                } else {
                    "IPv4"
                };
                if is_headless(spec) && spec.selector.as_ref().is_none_or(|s| s.is_empty())
                    || allocs.families().contains(&other)
                {
                    families.push(other.to_string());
                }
            }
        } else {
            if policy == "RequireDualStack" && !allocs.is_dual_stack() {
                errs.push(FieldError::invalid(
                    "spec.ipFamilyPolicy",
                    policy.as_str(),
                    "this cluster is not configured for dual-stack services",
                ));
            }
            if policy != "SingleStack" && families.len() < 2 && allocs.is_dual_stack() {
                let other = allocs
                    .families()
                    .into_iter()
                    .find(|f| *f != families[0])
                    .unwrap_or("IPv6");
                families.push(other.to_string());
            }
            if !errs.is_empty() {
                return errs;
            }
            let mut result = Vec::new();
            for (i, fam) in families.iter().enumerate() {
                match requested.get(i).and_then(|s| parse_ip(s)) {
                    Some(ip) => {
                        if !old_ips.contains(&ip)
                            && let Err(e) = allocs.allocate_ip(ip, owner)
                        {
                            errs.push(FieldError::invalid(
                                "spec.clusterIPs",
                                &requested,
                                format!("failed to allocate IP {ip}: {e}"),
                            ));
                            continue;
                        }
                        result.push(ip);
                    }
                    None => match allocs.allocate_next_ip(fam, owner) {
                        Ok(ip) => result.push(ip),
                        Err(e) => errs.push(FieldError::forbidden(
                            "spec.clusterIPs",
                            format!("failed to allocate a serviceIP: {e}"),
                        )),
                    },
                }
            }
            if !errs.is_empty() {
                return errs;
            }
            kept = result.clone();
            let texts: Vec<String> = result.iter().map(|ip| ip.to_string()).collect();
            spec.cluster_ip = texts.first().cloned();
            spec.cluster_ips = Some(texts);
        }
        spec.ip_families = Some(families);
        spec.ip_family_policy = Some(policy);
    }
    for ip in old_ips {
        if !kept.contains(&ip) {
            allocs.release_ip(ip, owner);
        }
    }
    errs
}

fn assign_node_ports(
    spec: &mut ServiceSpec,
    old: &ServiceSpec,
    allocs: &mut Allocators,
    owner: &str,
) -> Vec<FieldError> {
    let old_set = node_ports_of(old);
    let old_hc = hc_of(old);
    let mut errs = Vec::new();
    if needs_node_ports(spec) {
        let automatic =
            type_of(spec) == "NodePort" || spec.allocate_load_balancer_node_ports != Some(false);
        let ports = spec.ports.get_or_insert_with(Vec::new);
        // Explicit node ports first, so automatic ones never take them.
        for (i, p) in ports.iter().enumerate() {
            let np = p.node_port.unwrap_or(0);
            let (Ok(np16), Some(proto)) = (
                u16::try_from(np),
                Protocol::parse(p.protocol.as_deref().unwrap_or("TCP")),
            ) else {
                continue;
            };
            if np16 == 0 || old_set.contains(&(np16, proto)) {
                continue;
            }
            if let Err(e) = allocs.allocate_port(np16, proto, owner) {
                errs.push(FieldError::invalid(
                    format!("spec.ports[{i}].nodePort"),
                    np,
                    e.to_string(),
                ));
            }
        }
        if automatic {
            for i in 0..ports.len() {
                if ports[i].node_port.unwrap_or(0) != 0 {
                    continue;
                }
                // Ports that share a port number share a node port.
                let port = ports[i].port;
                let group: Vec<usize> = (0..ports.len())
                    .filter(|j| ports[*j].port == port && ports[*j].node_port.unwrap_or(0) == 0)
                    .collect();
                let protos: Vec<Protocol> = group
                    .iter()
                    .filter_map(|j| Protocol::parse(ports[*j].protocol.as_deref().unwrap_or("TCP")))
                    .collect();
                let requested = ports
                    .iter()
                    .find(|p| p.port == port && p.node_port.unwrap_or(0) != 0)
                    .and_then(|p| p.node_port);
                let np = match requested {
                    Some(np) => {
                        let mut ok = true;
                        for proto in &protos {
                            let Ok(np16) = u16::try_from(np) else {
                                continue;
                            };
                            if !old_set.contains(&(np16, *proto))
                                && let Err(e) = allocs.allocate_port(np16, *proto, owner)
                            {
                                errs.push(FieldError::invalid(
                                    format!("spec.ports[{i}].nodePort"),
                                    np,
                                    e.to_string(),
                                ));
                                ok = false;
                            }
                        }
                        if !ok {
                            continue;
                        }
                        np
                    }
                    None => match allocs.allocate_next_port(&protos, owner) {
                        Ok(np) => i32::from(np),
                        Err(e) => {
                            errs.push(FieldError::forbidden(
                                format!("spec.ports[{i}].nodePort"),
                                format!("failed to allocate a nodePort: {e}"),
                            ));
                            continue;
                        }
                    },
                };
                for j in group {
                    ports[j].node_port = Some(np);
                }
            }
        }
    }
    let mut new_hc = None;
    if needs_hc_node_port(spec) {
        let hc = spec.health_check_node_port.unwrap_or(0);
        match u16::try_from(hc) {
            Ok(0) => match allocs.allocate_next_port(&[Protocol::Tcp], owner) {
                Ok(p) => {
                    spec.health_check_node_port = Some(i32::from(p));
                    new_hc = Some(p);
                }
                Err(e) => errs.push(FieldError::forbidden(
                    "spec.healthCheckNodePort",
                    format!("failed to allocate a HealthCheck NodePort: {e}"),
                )),
            },
            Ok(p) => {
                if old_hc != Some(p)
                    && let Err(e) = allocs.allocate_port(p, Protocol::Tcp, owner)
                {
                    errs.push(FieldError::invalid(
                        "spec.healthCheckNodePort",
                        hc,
                        format!("failed to allocate requested HealthCheck NodePort {hc}: {e}"),
                    ));
                }
                new_hc = Some(p);
            }
            Err(_) => {}
        }
    }
    if !errs.is_empty() {
        return errs;
    }
    let new_set = node_ports_of(spec);
    for (p, proto) in &old_set {
        let kept_as_hc = new_hc == Some(*p) && *proto == Protocol::Tcp;
        if !new_set.contains(&(*p, *proto)) && !kept_as_hc {
            allocs.release_port(*p, *proto, owner);
        }
    }
    if let Some(p) = old_hc
        && new_hc != Some(p)
        && !new_set.contains(&(p, Protocol::Tcp))
    {
        allocs.release_port(p, Protocol::Tcp, owner);
    }
    errs
}

/// svcnet acts as the cloud's load-balancer controller: a LoadBalancer
/// service it serves gets one ingress IP from the pool. Running out of pool
/// addresses is not an error: the service stays pending, as in a cloud.
fn assign_lb(
    svc: &mut Service,
    old_status: Option<&ServiceStatus>,
    allocs: &mut Allocators,
    owner: &str,
) {
    let held: Vec<IpAddr> = lb_ips_of(old_status)
        .into_iter()
        .filter(|ip| allocs.lb_owner(*ip) == Some(owner))
        .collect();
    let serve = svc.spec.as_ref().is_some_and(served_by_svcnet) && allocs.has_lb_pool();
    if serve {
        if held.is_empty() {
            let requested = svc
                .spec
                .as_ref()
                .and_then(|s| s.load_balancer_ip.as_deref())
                .and_then(parse_ip);
            if let Some(ip) = allocs.allocate_lb(requested, owner) {
                let status = svc.status.get_or_insert_with(Default::default);
                status.load_balancer = Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(ip.to_string()),
                        ip_mode: Some("VIP".into()),
                        ..Default::default()
                    }]),
                });
            }
        }
    } else {
        for ip in held {
            allocs.release_lb(ip, owner);
        }
    }
}

impl Allocators {
    /// Rebuilds every allocation from the stored services (at startup, and
    /// after a store write failed). Returns one warning per allocation that
    /// could not be restored: duplicates (the first service keeps it) and
    /// values outside the configured ranges.
    pub fn rebuild(&mut self, services: &[Value]) -> Vec<String> {
        self.clear();
        let mut warnings = Vec::new();
        for value in services {
            let svc: Service = match crate::codec::decode(value.clone()) {
                Ok(s) => s,
                Err(e) => {
                    let name = value
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("?");
                    let detail = e.first().map(|e| e.detail.clone()).unwrap_or_default();
                    warnings.push(format!("service {name}: skipped: {detail}"));
                    continue;
                }
            };
            let owner = owner_key(&svc.metadata);
            let Some(spec) = svc.spec.as_ref() else {
                continue;
            };
            let mut warn = |r: Result<(), String>| {
                if let Err(w) = r {
                    warnings.push(format!("service {owner}: {w}; not restored"));
                }
            };
            for ip in ips_of(spec) {
                warn(self.restore_ip(ip, &owner));
            }
            for (p, proto) in node_ports_of(spec) {
                warn(self.restore_port(p, proto, &owner));
            }
            if let Some(p) = hc_of(spec) {
                warn(self.restore_port(p, Protocol::Tcp, &owner));
            }
            if served_by_svcnet(spec) {
                for ip in lb_ips_of(svc.status.as_ref()) {
                    warn(self.restore_lb(ip, &owner));
                }
            }
        }
        warnings
    }

    /// Frees everything a deleted service held (and only what it held).
    pub fn release(&mut self, service: &Value) {
        let Ok(svc) = crate::codec::decode::<Service>(service.clone()) else {
            return;
        };
        let owner = owner_key(&svc.metadata);
        let Some(spec) = svc.spec.as_ref() else {
            return;
        };
        for ip in ips_of(spec) {
            self.release_ip(ip, &owner);
        }
        for (p, proto) in node_ports_of(spec) {
            self.release_port(p, proto, &owner);
        }
        if let Some(p) = hc_of(spec) {
            self.release_port(p, Protocol::Tcp, &owner);
        }
        for ip in lb_ips_of(svc.status.as_ref()) {
            self.release_lb(ip, &owner);
        }
    }
}
