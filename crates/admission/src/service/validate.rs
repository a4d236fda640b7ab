//! Service validation (upstream `ValidateService`, `ValidateServiceUpdate`),
//! run on the defaulted object before any allocation.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::defaults::{is_headless, needs_hc_node_port, type_of};
use crate::error::FieldError;
use crate::syntax::{self, CIDR_MSG, IP_MSG, NameRule};

const TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];

/// The longest `sessionAffinityConfig.clientIP.timeoutSeconds`: one day.
pub const MAX_CLIENT_IP_TIMEOUT: i32 = 86400;

pub(crate) fn validate_service(svc: &Service, families: &[&str]) -> Vec<FieldError> {
    let mut errs = syntax::validate_object_meta(&svc.metadata, true, NameRule::Dns1035Label);
    let default_spec = ServiceSpec::default();
    let spec = svc.spec.as_ref().unwrap_or(&default_spec);
    let ty = type_of(spec);
    let ports: &[ServicePort] = spec.ports.as_deref().unwrap_or(&[]);

    if ports.is_empty() && !is_headless(spec) && ty != "ExternalName" {
        errs.push(FieldError::required("spec.ports", ""));
    }
    if !TYPES.contains(&ty) {
        errs.push(FieldError::not_supported("spec.type", ty, TYPES));
    }
    match ty {
        "ExternalName" => {
            if spec.cluster_ips.as_ref().is_some_and(|v| !v.is_empty()) {
                errs.push(FieldError::forbidden(
                    "spec.clusterIPs",
                    "may not be set for ExternalName services",
                ));
            }
            if spec.ip_families.as_ref().is_some_and(|v| !v.is_empty()) {
                errs.push(FieldError::forbidden(
                    "spec.ipFamilies",
                    "may not be set for ExternalName services",
                ));
            }
            if spec.ip_family_policy.is_some() {
                errs.push(FieldError::forbidden(
                    "spec.ipFamilyPolicy",
                    "may not be set for ExternalName services",
                ));
            }
            // The name (a CNAME target) may end with a dot to mark it fully qualified.
            let cname = spec.external_name.as_deref().unwrap_or("");
            let cname = cname.strip_suffix('.').unwrap_or(cname);
            if cname.is_empty() {
                errs.push(FieldError::required("spec.externalName", ""));
            } else {
                errs.extend(
                    syntax::is_dns1123_subdomain(cname)
                        .into_iter()
                        .map(|m| FieldError::invalid("spec.externalName", cname, m)),
                );
            }
        }
        "NodePort" | "LoadBalancer" if is_headless(spec) => {
            errs.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                "None",
                format!("may not be set to 'None' for {ty} services"),
            ));
        }
        _ => {}
    }

    errs.extend(validate_cluster_ips(spec));
    errs.extend(validate_ip_families(spec, families));

    let require_name = ports.len() > 1;
    let mut names = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        errs.extend(validate_port(
            p,
            &format!("spec.ports[{i}]"),
            require_name,
            &mut names,
        ));
    }
    // (protocol, port) pairs are unique; upstream prints the internal struct.
    let mut seen = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let proto = p.protocol.clone().unwrap_or_default();
        if !seen.insert((p.port, proto.clone())) {
            errs.push(FieldError {
                kind: crate::FieldErrorKind::Duplicate,
                field: format!("spec.ports[{i}]"),
                value: Some(format!(
                    "core.ServicePort{{Name:\"\", Protocol:{}, AppProtocol:(*string)(nil), Port:{}, TargetPort:intstr.IntOrString{{Type:0, IntVal:0, StrVal:\"\"}}, NodePort:0}}",
                    crate::error::quote(&proto),
                    p.port
                )),
                detail: String::new(),
            });
        }
    }
    // Within one service a node port may repeat only across protocols.
    let mut node_ports = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let np = p.node_port.unwrap_or(0);
        if np == 0 {
            continue;
        }
        // Upstream forbids it for ClusterIP; svcnet also for ExternalName,
        // where a node port would be stored but never allocated.
        if ty == "ClusterIP" || ty == "ExternalName" {
            errs.push(FieldError::forbidden(
                format!("spec.ports[{i}].nodePort"),
                format!("may not be used when `type` is '{ty}'"),
            ));
            continue;
        }
        if !node_ports.insert((np, p.protocol.clone().unwrap_or_default())) {
            errs.push(FieldError::duplicate(
                format!("spec.ports[{i}].nodePort"),
                np,
            ));
        }
    }

    errs.extend(syntax::validate_labels(
        spec.selector.as_ref(),
        "spec.selector",
    ));

    let affinity = spec.session_affinity.as_deref().unwrap_or("");
    match affinity {
        "None" => {
            if spec.session_affinity_config.is_some() {
                errs.push(FieldError::invalid(
                    "spec.sessionAffinityConfig",
                    "{}",
                    "must not be set when session affinity is None",
                ));
            }
        }
        "ClientIP" => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match timeout {
                None => errs.push(FieldError::required(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    "",
                )),
                Some(t) if t <= 0 || t > MAX_CLIENT_IP_TIMEOUT => errs.push(FieldError::invalid(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    t,
                    format!("must be greater than 0 and less than {MAX_CLIENT_IP_TIMEOUT}"),
                )),
                Some(_) => {}
            }
        }
        other => errs.push(FieldError::not_supported(
            "spec.sessionAffinity",
            other,
            &["ClientIP", "None"],
        )),
    }

    errs.extend(validate_load_balancer_fields(spec, ty));

    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        let path = format!("spec.externalIPs[{i}]");
        match syntax::parse_ip(ip) {
            None => errs.push(FieldError::invalid(&path, ip, IP_MSG)),
            Some(addr) => errs.extend(
                syntax::non_special_ip(addr)
                    .into_iter()
                    .map(|m| FieldError::invalid(&path, ip, m)),
            ),
        }
    }

    errs.extend(validate_traffic_policies(spec, ty));
    errs
}

fn validate_port(
    p: &ServicePort,
    path: &str,
    require_name: bool,
    names: &mut BTreeSet<String>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = p.name.as_deref().unwrap_or("");
    if require_name && name.is_empty() {
        errs.push(FieldError::required(format!("{path}.name"), ""));
    } else if !name.is_empty() {
        errs.extend(
            syntax::is_dns1123_label(name)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.name"), name, m)),
        );
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(format!("{path}.name"), name));
        }
    }
    errs.extend(
        syntax::is_valid_port_num(p.port)
            .into_iter()
            .map(|m| FieldError::invalid(format!("{path}.port"), p.port, m)),
    );
    match p.protocol.as_deref().unwrap_or("") {
        "" => errs.push(FieldError::required(format!("{path}.protocol"), "")),
        proto if !PROTOCOLS.contains(&proto) => errs.push(FieldError::not_supported(
            format!("{path}.protocol"),
            proto,
            PROTOCOLS,
        )),
        _ => {}
    }
    match &p.target_port {
        Some(IntOrString::Int(n)) => errs.extend(
            syntax::is_valid_port_num(*n)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.targetPort"), *n, m)),
        ),
        Some(IntOrString::String(s)) => errs.extend(
            syntax::is_valid_port_name(s)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.targetPort"), s, m)),
        ),
        None => {}
    }
    if let Some(ap) = &p.app_protocol {
        errs.extend(
            syntax::is_qualified_name(ap)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.appProtocol"), ap, m)),
        );
    }
    errs
}

fn validate_cluster_ips(spec: &ServiceSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ips: &[String] = spec.cluster_ips.as_deref().unwrap_or(&[]);
    if let (Some(ip), Some(first)) = (spec.cluster_ip.as_deref(), ips.first())
        && ip != first
    {
        errs.push(FieldError::invalid(
            "spec.clusterIPs",
            &ips.to_vec(),
            "first value must match `clusterIP`",
        ));
    }
    if ips.len() > 2 {
        errs.push(FieldError::invalid(
            "spec.clusterIPs",
            &ips.to_vec(),
            "may only hold up to 2 values",
        ));
    }
    let mut families = BTreeSet::new();
    for (i, ip) in ips.iter().enumerate() {
        let path = format!("spec.clusterIPs[{i}]");
        if ip == "None" {
            if i > 0 || ips.len() > 1 {
                errs.push(FieldError::invalid(
                    &path,
                    ip,
                    "'None' may only be set as the only value",
                ));
            }
            continue;
        }
        match syntax::parse_ip(ip) {
            None => errs.push(FieldError::invalid(&path, ip, IP_MSG)),
            Some(addr) => {
                if !families.insert(addr.is_ipv4()) {
                    errs.push(FieldError::invalid(
                        "spec.clusterIPs",
                        &ips.to_vec(),
                        "may not have more than one IP of the same IP family",
                    ));
                }
                let declared = spec.ip_families.as_ref().and_then(|f| f.get(i));
                if let Some(fam) = declared
                    && fam != crate::alloc::family_of(addr)
                {
                    errs.push(FieldError::invalid(
                        &path,
                        ip,
                        format!("expected an {fam} value as indicated by `ipFamilies[{i}]`"),
                    ));
                }
            }
        }
    }
    errs
}

fn validate_ip_families(spec: &ServiceSpec, configured: &[&str]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    const POLICIES: &[&str] = &["PreferDualStack", "RequireDualStack", "SingleStack"];
    if let Some(policy) = spec.ip_family_policy.as_deref()
        && !POLICIES.contains(&policy)
    {
        errs.push(FieldError::not_supported(
            "spec.ipFamilyPolicy",
            policy,
            POLICIES,
        ));
    }
    let fams: &[String] = spec.ip_families.as_deref().unwrap_or(&[]);
    if fams.len() > 2 {
        errs.push(FieldError::invalid(
            "spec.ipFamilies",
            &fams.to_vec(),
            "may specify no more than two IP families",
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, f) in fams.iter().enumerate() {
        let path = format!("spec.ipFamilies[{i}]");
        if f != "IPv4" && f != "IPv6" {
            errs.push(FieldError::not_supported(&path, f, &["IPv4", "IPv6"]));
        } else if !seen.insert(f) {
            errs.push(FieldError::duplicate(&path, f));
        } else if !configured.contains(&f.as_str()) && !is_headless(spec) {
            errs.push(FieldError::invalid(
                &path,
                f,
                "not configured on this cluster",
            ));
        }
    }
    if spec.ip_family_policy.as_deref() == Some("SingleStack") && fams.len() > 1 {
        errs.push(FieldError::invalid(
            "spec.ipFamilyPolicy",
            "SingleStack",
            "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified",
        ));
    }
    errs
}

fn validate_load_balancer_fields(spec: &ServiceSpec, ty: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let lb = ty == "LoadBalancer";
    let only_lb = "may only be used when `type` is 'LoadBalancer'";
    if let Some(ranges) = &spec.load_balancer_source_ranges
        && !ranges.is_empty()
    {
        if !lb {
            errs.push(FieldError::forbidden(
                "spec.loadBalancerSourceRanges",
                only_lb,
            ));
        }
        for (i, r) in ranges.iter().enumerate() {
            if !syntax::is_valid_cidr(r.trim()) {
                errs.push(FieldError::invalid(
                    format!("spec.loadBalancerSourceRanges[{i}]"),
                    r,
                    CIDR_MSG,
                ));
            }
        }
    }
    if let Some(ip) = spec.load_balancer_ip.as_deref().filter(|s| !s.is_empty()) {
        if !lb {
            errs.push(FieldError::forbidden("spec.loadBalancerIP", only_lb));
        } else if syntax::parse_ip(ip).is_none() {
            errs.push(FieldError::invalid("spec.loadBalancerIP", ip, IP_MSG));
        }
    }
    if let Some(class) = &spec.load_balancer_class {
        if !lb {
            errs.push(FieldError::forbidden("spec.loadBalancerClass", only_lb));
        }
        errs.extend(
            syntax::is_qualified_name(class)
                .into_iter()
                .map(|m| FieldError::invalid("spec.loadBalancerClass", class, m)),
        );
    }
    if spec.allocate_load_balancer_node_ports.is_some() && !lb {
        errs.push(FieldError::forbidden(
            "spec.allocateLoadBalancerNodePorts",
            only_lb,
        ));
    }
    if lb && spec.allocate_load_balancer_node_ports.is_none() {
        errs.push(FieldError::required(
            "spec.allocateLoadBalancerNodePorts",
            "",
        ));
    }
    errs
}

fn validate_traffic_policies(spec: &ServiceSpec, ty: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let etp = spec.external_traffic_policy.as_deref().unwrap_or("");
    if !super::defaults::externally_accessible(spec) {
        if !etp.is_empty() {
            errs.push(FieldError::invalid(
                "spec.externalTrafficPolicy",
                etp,
                "may only be set for externally-accessible services",
            ));
        }
    } else if etp.is_empty() {
        errs.push(FieldError::required("spec.externalTrafficPolicy", ""));
    } else if etp != "Cluster" && etp != "Local" {
        errs.push(FieldError::not_supported(
            "spec.externalTrafficPolicy",
            etp,
            &["Cluster", "Local"],
        ));
    }
    let hc = spec.health_check_node_port.unwrap_or(0);
    if !needs_hc_node_port(spec) {
        if hc != 0 {
            errs.push(FieldError::invalid(
                "spec.healthCheckNodePort",
                hc,
                "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
            ));
        }
    } else if !(0..=65535).contains(&hc) {
        errs.push(FieldError::invalid(
            "spec.healthCheckNodePort",
            hc,
            syntax::PORT_RANGE_MSG,
        ));
    }
    if needs_hc_node_port(spec) && hc != 0 {
        // The health-check port and the node ports come from one allocator: a TCP node port
        // may not be the service's own health-check port.
        for (i, p) in spec.ports.iter().flatten().enumerate() {
            let tcp = matches!(p.protocol.as_deref(), None | Some("TCP"));
            if tcp && p.node_port == Some(hc) {
                errs.push(FieldError::invalid(
                    format!("spec.ports[{i}].nodePort"),
                    hc,
                    "provided port is already allocated (it is the service's healthCheckNodePort)",
                ));
            }
        }
    }
    let itp = spec.internal_traffic_policy.as_deref();
    match itp {
        // Only required for the types it is defaulted for: other types were
        // never checked upstream, and stored objects must stay valid.
        None if matches!(ty, "ClusterIP" | "NodePort" | "LoadBalancer") => {
            errs.push(FieldError::required("spec.internalTrafficPolicy", ""))
        }
        None | Some("Cluster" | "Local") => {}
        Some(other) => errs.push(FieldError::not_supported(
            "spec.internalTrafficPolicy",
            other,
            &["Cluster", "Local"],
        )),
    }
    if let Some(td) = spec.traffic_distribution.as_deref()
        && !matches!(td, "PreferClose" | "PreferSameZone" | "PreferSameNode")
    {
        errs.push(FieldError::not_supported(
            "spec.trafficDistribution",
            td,
            &["PreferClose", "PreferSameNode", "PreferSameZone"],
        ));
    }
    errs
}

/// Upstream `ValidateServiceUpdate`: what may not change once set.
pub(crate) fn validate_service_update(new: &ServiceSpec, old: &ServiceSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let (nty, oty) = (type_of(new), type_of(old));
    if nty != "ExternalName" && oty != "ExternalName" && !(is_headless(new) && is_headless(old)) {
        let new_ips: &[String] = new.cluster_ips.as_deref().unwrap_or(&[]);
        let old_ips: &[String] = old.cluster_ips.as_deref().unwrap_or(&[]);
        if new_ips.is_empty() && !old_ips.is_empty() {
            errs.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                &new_ips.to_vec(),
                "primary clusterIP can not be unset",
            ));
        }
        for (i, ip) in old_ips.iter().enumerate() {
            if let Some(n) = new_ips.get(i)
                && n != ip
            {
                errs.push(FieldError::invalid(
                    format!("spec.clusterIPs[{i}]"),
                    &new_ips.to_vec(),
                    "may not change once set",
                ));
            }
        }
        let new_f: &[String] = new.ip_families.as_deref().unwrap_or(&[]);
        let old_f: &[String] = old.ip_families.as_deref().unwrap_or(&[]);
        if let (Some(n), Some(o)) = (new_f.first(), old_f.first())
            && n != o
        {
            errs.push(FieldError::invalid(
                "spec.ipFamilies[0]",
                n,
                "may not change once set",
            ));
        }
    }
    if nty == "LoadBalancer"
        && oty == "LoadBalancer"
        && new.load_balancer_class != old.load_balancer_class
    {
        let v = new.load_balancer_class.clone().unwrap_or_default();
        errs.push(FieldError::invalid(
            "spec.loadBalancerClass",
            v,
            "may not change once set",
        ));
    }
    errs
}
