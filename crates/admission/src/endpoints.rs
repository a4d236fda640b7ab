//! `v1/Endpoints` and `discovery.k8s.io/v1` EndpointSlices: port defaults
//! and upstream's limits on addresses and ports.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;

use crate::codec::{decode, encode};
use crate::error::FieldError;
use crate::syntax::{self, IP_MSG, NameRule};

const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
/// Upstream `maxEndpoints` / `maxPorts` / `maxAddresses` for a slice.
pub const MAX_SLICE_ENDPOINTS: usize = 1000;
pub const MAX_SLICE_PORTS: usize = 100;
pub const MAX_SLICE_ADDRESSES: usize = 100;

fn empty(s: &Option<String>) -> bool {
    s.as_deref().unwrap_or("").is_empty()
}

/// Upstream's special-address rule for endpoints, except that loopback endpoints are allowed
/// when the service CIDR itself is loopback (svcnet's unprivileged development mode, where the
/// userspace proxy binds cluster IPs on `lo` and backends listen on loopback too).
fn endpoint_ip_errors(ip: std::net::IpAddr, loopback_ok: bool) -> Vec<String> {
    let mut errs = syntax::non_special_ip(ip);
    if loopback_ok && ip.is_loopback() {
        errs.retain(|m| !m.contains("loopback"));
    }
    errs
}

fn validate_protocol(proto: Option<&str>, path: &str) -> Option<FieldError> {
    match proto.unwrap_or("") {
        "" => Some(FieldError::required(path, "")),
        p if !PROTOCOLS.contains(&p) => Some(FieldError::not_supported(path, p, PROTOCOLS)),
        _ => None,
    }
}

fn validate_endpoint_address(
    a: &EndpointAddress,
    path: &str,
    loopback_ok: bool,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match syntax::parse_ip(&a.ip) {
        None => errs.push(FieldError::invalid(format!("{path}.ip"), &a.ip, IP_MSG)),
        Some(ip) => errs.extend(
            endpoint_ip_errors(ip, loopback_ok)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.ip"), &a.ip, m)),
        ),
    }
    if let Some(h) = a.hostname.as_deref().filter(|h| !h.is_empty()) {
        errs.extend(
            syntax::is_dns1123_label(h)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.hostname"), h, m)),
        );
    }
    if let Some(n) = a.node_name.as_deref().filter(|n| !n.is_empty()) {
        errs.extend(
            syntax::is_dns1123_subdomain(n)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.nodeName"), n, m)),
        );
    }
    errs
}

fn default_endpoints(e: &mut Endpoints) {
    for s in e.subsets.iter_mut().flatten() {
        for p in s.ports.iter_mut().flatten() {
            if empty(&p.protocol) {
                p.protocol = Some("TCP".into());
            }
        }
    }
}

fn validate_endpoints(e: &Endpoints, loopback_ok: bool) -> Vec<FieldError> {
    let mut errs = syntax::validate_object_meta(&e.metadata, true, NameRule::Dns1123Subdomain);
    for (i, s) in e.subsets.iter().flatten().enumerate() {
        let path = format!("subsets[{i}]");
        for (j, a) in s.addresses.iter().flatten().enumerate() {
            errs.extend(validate_endpoint_address(
                a,
                &format!("{path}.addresses[{j}]"),
                loopback_ok,
            ));
        }
        for (j, a) in s.not_ready_addresses.iter().flatten().enumerate() {
            errs.extend(validate_endpoint_address(
                a,
                &format!("{path}.notReadyAddresses[{j}]"),
                loopback_ok,
            ));
        }
        let ports = s.ports.as_deref().unwrap_or(&[]);
        let mut names = BTreeSet::new();
        for (j, p) in ports.iter().enumerate() {
            let pp = format!("{path}.ports[{j}]");
            let name = p.name.as_deref().unwrap_or("");
            if ports.len() > 1 && name.is_empty() {
                errs.push(FieldError::required(format!("{pp}.name"), ""));
            } else if !name.is_empty() {
                errs.extend(
                    syntax::is_dns1123_label(name)
                        .into_iter()
                        .map(|m| FieldError::invalid(format!("{pp}.name"), name, m)),
                );
                if !names.insert(name.to_string()) {
                    errs.push(FieldError::duplicate(format!("{pp}.name"), name));
                }
            }
            errs.extend(
                syntax::is_valid_port_num(p.port)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{pp}.port"), p.port, m)),
            );
            errs.extend(validate_protocol(
                p.protocol.as_deref(),
                &format!("{pp}.protocol"),
            ));
        }
    }
    errs
}

pub(crate) fn admit_endpoints(obj: Value, loopback_ok: bool) -> Result<Value, Vec<FieldError>> {
    let mut e: Endpoints = decode(obj)?;
    default_endpoints(&mut e);
    let errs = validate_endpoints(&e, loopback_ok);
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&e)
}

fn default_slice(s: &mut EndpointSlice) {
    for p in s.ports.iter_mut().flatten() {
        if p.name.is_none() {
            p.name = Some(String::new());
        }
        if empty(&p.protocol) {
            p.protocol = Some("TCP".into());
        }
    }
}

fn validate_slice(s: &EndpointSlice, loopback_ok: bool) -> Vec<FieldError> {
    let mut errs = syntax::validate_object_meta(&s.metadata, true, NameRule::Dns1123Subdomain);
    const TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
    let ty = s.address_type.as_str();
    if ty.is_empty() {
        errs.push(FieldError::required("addressType", ""));
    } else if !TYPES.contains(&ty) {
        errs.push(FieldError::not_supported("addressType", ty, TYPES));
    }
    if s.endpoints.len() > MAX_SLICE_ENDPOINTS {
        errs.push(FieldError::too_many(
            "endpoints",
            s.endpoints.len(),
            MAX_SLICE_ENDPOINTS,
        ));
    }
    for (i, ep) in s.endpoints.iter().enumerate() {
        let path = format!("endpoints[{i}]");
        if ep.addresses.is_empty() {
            errs.push(FieldError::required(
                format!("{path}.addresses"),
                "must contain at least 1 address",
            ));
        } else if ep.addresses.len() > MAX_SLICE_ADDRESSES {
            errs.push(FieldError::too_many(
                format!("{path}.addresses"),
                ep.addresses.len(),
                MAX_SLICE_ADDRESSES,
            ));
        }
        for (j, a) in ep.addresses.iter().enumerate() {
            let ap = format!("{path}.addresses[{j}]");
            match ty {
                "IPv4" | "IPv6" => match syntax::parse_ip(a) {
                    Some(ip) if (ty == "IPv4") == ip.is_ipv4() => errs.extend(
                        endpoint_ip_errors(ip, loopback_ok)
                            .into_iter()
                            .map(|m| FieldError::invalid(&ap, a, m)),
                    ),
                    _ => errs.push(FieldError::invalid(
                        &ap,
                        a,
                        format!("must be a valid {ty} address"),
                    )),
                },
                "FQDN" => errs.extend(
                    syntax::is_dns1123_subdomain(a)
                        .into_iter()
                        .map(|m| FieldError::invalid(&ap, a, m)),
                ),
                _ => {}
            }
        }
        if let Some(h) = ep.hostname.as_deref() {
            errs.extend(
                syntax::is_dns1123_label(h)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{path}.hostname"), h, m)),
            );
        }
        if let Some(n) = ep.node_name.as_deref() {
            errs.extend(
                syntax::is_dns1123_subdomain(n)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{path}.nodeName"), n, m)),
            );
        }
    }
    let ports = s.ports.as_deref().unwrap_or(&[]);
    if ports.len() > MAX_SLICE_PORTS {
        errs.push(FieldError::too_many("ports", ports.len(), MAX_SLICE_PORTS));
    }
    let mut names = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let pp = format!("ports[{i}]");
        let name = p.name.as_deref().unwrap_or("");
        if !name.is_empty() {
            errs.extend(
                syntax::is_dns1123_label(name)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{pp}.name"), name, m)),
            );
        }
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(format!("{pp}.name"), name));
        }
        if let Some(port) = p.port {
            errs.extend(
                syntax::is_valid_port_num(port)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{pp}.port"), port, m)),
            );
        }
        errs.extend(validate_protocol(
            p.protocol.as_deref(),
            &format!("{pp}.protocol"),
        ));
        if let Some(ap) = &p.app_protocol {
            errs.extend(
                syntax::is_qualified_name(ap)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{pp}.appProtocol"), ap, m)),
            );
        }
    }
    errs
}

pub(crate) fn admit_slice_create(obj: Value, loopback_ok: bool) -> Result<Value, Vec<FieldError>> {
    let mut s: EndpointSlice = decode(obj)?;
    default_slice(&mut s);
    let errs = validate_slice(&s, loopback_ok);
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&s)
}

pub(crate) fn admit_slice_update(
    old: &Value,
    new: Value,
    loopback_ok: bool,
) -> Result<Value, Vec<FieldError>> {
    let old_s: EndpointSlice = decode(old.clone())?;
    let mut s: EndpointSlice = decode(new)?;
    default_slice(&mut s);
    let mut errs = validate_slice(&s, loopback_ok);
    if s.address_type != old_s.address_type {
        errs.push(FieldError::invalid(
            "addressType",
            &s.address_type,
            "field is immutable",
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&s)
}
