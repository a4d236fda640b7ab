//! Indexing one service: from its Service and EndpointSlices to a [`ServiceEntry`].
//!
//! Bad objects never fail a build: each is skipped with a warning naming the object and the
//! field, so one malformed Service cannot take the whole cluster's DNS down.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

use super::names::dashed_ip;
use super::state::ZoneState;
use super::{EndpointEntry, Objects, PortEntry, ServiceEntry, ServiceKind, Zone, ZoneConfig};

/// The label linking an EndpointSlice to its Service.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

impl Zone {
    /// Index `objects` under `config`. `serial` becomes the SOA serial (callers use the build
    /// time in seconds, tests a constant). To follow changes, keep a [`ZoneState`] instead and
    /// take a snapshot after each batch of events.
    pub fn build(config: Arc<ZoneConfig>, objects: &Objects, serial: u32) -> Zone {
        let mut state = ZoneState::new(config);
        state.replace_namespaces(objects.namespaces.iter().cloned());
        state.replace_services(objects.services.iter().cloned());
        state.replace_slices(objects.endpoint_slices.iter().cloned());
        state.replace_pods(objects.pods.iter().cloned());
        state.snapshot(serial)
    }
}

pub(crate) fn service_entry(
    config: &ZoneConfig,
    ns: &str,
    name: &str,
    svc: &Service,
    slices: &[&Arc<EndpointSlice>],
    warnings: &mut Vec<String>,
) -> Option<ServiceEntry> {
    if !config.options.exposes(&ns.to_ascii_lowercase()) {
        // `namespaces`: the service does not exist for DNS, not even for PTR.
        return None;
    }
    let domain = &config.domain;
    let what = format!("Service {ns}/{name}");
    let Some(spec) = &svc.spec else {
        warnings.push(format!("{what}: spec: missing"));
        return None;
    };
    let fqdn = match Name::from_ascii(format!("{name}.{ns}.svc.{domain}")) {
        Ok(n) => n.to_lowercase(),
        Err(e) => {
            warnings.push(format!("{what}: metadata.name: not a DNS label: {e}"));
            return None;
        }
    };

    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        let Some(target) = spec.external_name.as_deref().filter(|t| !t.is_empty()) else {
            warnings.push(format!("{what}: spec.externalName: missing"));
            return None;
        };
        let mut target = match Name::from_ascii(target) {
            Ok(t) => t,
            Err(e) => {
                warnings.push(format!(
                    "{what}: spec.externalName: {target:?} is not a DNS name: {e}"
                ));
                return None;
            }
        };
        target.set_fqdn(true);
        ServiceKind::ExternalName(target)
    } else {
        let ips: Vec<&str> = match &spec.cluster_ips {
            Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
            _ => spec.cluster_ip.as_deref().into_iter().collect(),
        };
        if ips.first() == Some(&"None") {
            ServiceKind::Headless
        } else {
            let mut parsed = Vec::new();
            for ip in ips.into_iter().filter(|ip| !ip.is_empty()) {
                match ip.parse::<IpAddr>() {
                    Ok(ip) => parsed.push(ip),
                    Err(_) => warnings.push(format!(
                        "{what}: spec.clusterIPs: {ip:?} is not an IP address"
                    )),
                }
            }
            ServiceKind::ClusterIp(parsed)
        }
    };

    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            let port = u16::try_from(p.port).ok().filter(|p| *p != 0);
            if port.is_none() {
                warnings.push(format!("{what}: spec.ports: port {} out of range", p.port));
            }
            Some(PortEntry {
                name: p.name.as_deref().unwrap_or_default().to_ascii_lowercase(),
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                port: port?,
            })
        })
        .collect();

    let mut external_ips: Vec<IpAddr> = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let external = spec.external_ips.iter().flatten().map(String::as_str);
    for ip in external.chain(
        ingress
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_deref()),
    ) {
        match ip.parse::<IpAddr>() {
            Ok(ip) if !external_ips.contains(&ip) => external_ips.push(ip),
            Ok(_) => {}
            Err(_) => warnings.push(format!("{what}: external IP {ip:?} is not an IP address")),
        }
    }

    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let mut endpoints = Vec::new();
    if !matches!(kind, ServiceKind::ExternalName(_)) && !config.options.no_endpoints {
        for slice in slices {
            if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
                continue;
            }
            let slice_ports: Arc<Vec<PortEntry>> = Arc::new(
                slice
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|p| {
                        Some(PortEntry {
                            name: p.name.as_deref().unwrap_or_default().to_ascii_lowercase(),
                            protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                            port: u16::try_from(p.port?).ok()?,
                        })
                    })
                    .collect(),
            );
            for ep in &slice.endpoints {
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if !ready && !publish_not_ready {
                    continue;
                }
                // Consumers use only the first address of an endpoint (API contract).
                let Some(addr) = ep.addresses.first() else {
                    continue;
                };
                let Ok(ip) = addr.parse::<IpAddr>() else {
                    let slice_name = slice.metadata.name.as_deref().unwrap_or_default();
                    warnings.push(format!(
                        "EndpointSlice {ns}/{slice_name}: endpoints.addresses: {addr:?} is not an IP address"
                    ));
                    continue;
                };
                let label = endpoint_label(ep, ip, config.options.endpoint_pod_names);
                let Ok(ep_fqdn) = Name::from_ascii(&label).and_then(|l| l.append_domain(&fqdn))
                else {
                    warnings.push(format!(
                        "EndpointSlice for {what}: endpoints.hostname: {label:?} is not a DNS label"
                    ));
                    continue;
                };
                endpoints.push(EndpointEntry {
                    label,
                    fqdn: ep_fqdn,
                    ip,
                    ports: slice_ports.clone(),
                });
            }
        }
    }
    endpoints.sort_by(|a, b| (&a.label, a.ip).cmp(&(&b.label, b.ip)));
    endpoints.dedup_by(|a, b| a.label == b.label && a.ip == b.ip);
    let mut endpoint_ips: Vec<IpAddr> = endpoints.iter().map(|e| e.ip).collect();
    endpoint_ips.sort();
    endpoint_ips.dedup();

    Some(ServiceEntry {
        fqdn,
        kind,
        ports,
        endpoints,
        endpoint_ips,
        external_ips,
    })
}

/// An endpoint's DNS label: its hostname; else, with `endpoint_pod_names`, the name of the pod
/// it targets when that is a DNS label (at most 63 characters, CoreDNS's rule); else its
/// dashed IP.
fn endpoint_label(ep: &Endpoint, ip: IpAddr, pod_names: bool) -> String {
    if let Some(hostname) = ep.hostname.as_deref().filter(|h| !h.is_empty()) {
        return hostname.to_ascii_lowercase();
    }
    let pod = ep
        .target_ref
        .as_ref()
        .filter(|r| pod_names && matches!(r.kind.as_deref(), None | Some("Pod")))
        .and_then(|r| r.name.as_deref())
        .filter(|n| !n.is_empty() && n.len() <= 63 && !n.contains('.'));
    match pod {
        Some(name) => name.to_ascii_lowercase(),
        None => dashed_ip(ip),
    }
}
