//! Building a [`Zone`] from API objects.
//!
//! Bad objects never fail the build: each is skipped with a warning naming the object and the
//! field, so one malformed Service cannot take the whole cluster's DNS down.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::names::dashed_ip;
use super::{
    EndpointEntry, NamespaceEntry, Objects, PortEntry, ServiceEntry, ServiceKind, Zone, ZoneConfig,
};

/// The label linking an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

impl Zone {
    /// Index `objects` under `config`. `serial` becomes the SOA serial (callers use the build
    /// time in seconds, tests a constant).
    pub fn build(config: Arc<ZoneConfig>, objects: &Objects, serial: u32) -> Zone {
        let mut warnings = Vec::new();

        // Slices grouped by the service they belong to.
        let mut slices: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
        for slice in &objects.endpoint_slices {
            let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
            let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
            else {
                continue;
            };
            slices.entry((ns, svc.as_str())).or_default().push(slice);
        }

        let mut namespaces: HashMap<String, NamespaceEntry> = HashMap::new();
        for ns in &objects.namespaces {
            if let Some(name) = &ns.metadata.name {
                namespaces.entry(name.to_ascii_lowercase()).or_default();
            }
        }

        for svc in &objects.services {
            let (Some(ns), Some(name)) = (&svc.metadata.namespace, &svc.metadata.name) else {
                warnings.push("Service without metadata.namespace or metadata.name".to_string());
                continue;
            };
            let own_slices = slices
                .get(&(ns.as_str(), name.as_str()))
                .map(Vec::as_slice)
                .unwrap_or_default();
            match service_entry(&config.domain, ns, name, svc, own_slices, &mut warnings) {
                Some(entry) => {
                    namespaces
                        .entry(ns.to_ascii_lowercase())
                        .or_default()
                        .services
                        .insert(name.to_ascii_lowercase(), Arc::new(entry));
                }
                None => continue,
            }
        }

        // Reverse index: cluster IPs first (one name each), then endpoint IPs (every name).
        let mut reverse: HashMap<IpAddr, Vec<Name>> = HashMap::new();
        for entry in namespaces.values().flat_map(|n| n.services.values()) {
            if let ServiceKind::ClusterIp(ips) = &entry.kind {
                for ip in ips {
                    reverse
                        .entry(*ip)
                        .or_insert_with(|| vec![entry.fqdn.clone()]);
                }
            }
        }
        let cluster_ips: HashSet<IpAddr> = reverse.keys().copied().collect();
        for entry in namespaces.values().flat_map(|n| n.services.values()) {
            for ep in &entry.endpoints {
                if cluster_ips.contains(&ep.ip) {
                    continue;
                }
                let names = reverse.entry(ep.ip).or_default();
                if !names.contains(&ep.fqdn) {
                    names.push(ep.fqdn.clone());
                }
            }
        }
        for names in reverse.values_mut() {
            names.sort();
        }

        let mut pod_ips = HashSet::new();
        for pod in &objects.pods {
            let Some(ns) = &pod.metadata.namespace else {
                continue;
            };
            let Some(status) = &pod.status else { continue };
            let ips = status
                .pod_ips
                .iter()
                .flatten()
                .map(|p| p.ip.as_str())
                .chain(status.pod_ip.as_deref());
            for ip in ips {
                if let Ok(ip) = ip.parse::<IpAddr>() {
                    pod_ips.insert((ns.to_ascii_lowercase(), ip));
                }
            }
        }

        let dns_ips = namespaces
            .get(&config.dns_service.0)
            .and_then(|n| n.services.get(&config.dns_service.1))
            .map(|e| match &e.kind {
                ServiceKind::ClusterIp(ips) => ips.clone(),
                ServiceKind::Headless => e.endpoints.iter().map(|ep| ep.ip).collect(),
                ServiceKind::ExternalName(_) => Vec::new(),
            })
            .unwrap_or_default();

        Zone {
            config,
            serial,
            namespaces,
            reverse,
            pod_ips,
            dns_ips,
            warnings,
        }
    }
}

fn service_entry(
    domain: &Name,
    ns: &str,
    name: &str,
    svc: &Service,
    slices: &[&EndpointSlice],
    warnings: &mut Vec<String>,
) -> Option<ServiceEntry> {
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

    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let mut endpoints = Vec::new();
    if !matches!(kind, ServiceKind::ExternalName(_)) {
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
                let label = match ep.hostname.as_deref().filter(|h| !h.is_empty()) {
                    Some(h) => h.to_ascii_lowercase(),
                    None => dashed_ip(ip),
                };
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

    Some(ServiceEntry {
        fqdn,
        kind,
        ports,
        endpoints,
    })
}
