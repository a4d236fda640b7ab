//! Indexing one service: its Service and EndpointSlices reduced to their facts as they arrive,
//! and the facts to a [`ServiceEntry`].
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
use super::{
    EndpointEntry, Objects, PortEntry, ServiceBase, ServiceEntry, ServiceKind, Zone, ZoneConfig,
};

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

/// What the zone keeps of a Service: its index key and the parsed parts of its spec and status
/// that answers depend on, or why it cannot be indexed. The API object itself is dropped once
/// this is made (a Service object with its metadata is several times larger).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceFacts {
    key: Key,
    /// `None`: not indexed (not served, or invalid: `warnings` says why).
    base: Option<Arc<ServiceBase>>,
    warnings: Vec<String>,
}

impl ServiceFacts {
    /// The facts of `svc` under `config`; `None` without a namespace and name.
    pub fn new(config: &ZoneConfig, svc: &Service) -> Option<ServiceFacts> {
        let key = key_of(&svc.metadata)?;
        let mut warnings = Vec::new();
        let base = service_base(config, &key.0, &key.1, svc, &mut warnings).map(Arc::new);
        Some(ServiceFacts {
            key,
            base,
            warnings,
        })
    }

    pub(crate) fn key(&self) -> &Key {
        &self.key
    }
}

/// What the zone keeps of an EndpointSlice: the service it belongs to, its ports, and per
/// endpoint the address, readiness and DNS label; everything else of the object is dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceFacts {
    /// (namespace, slice name).
    key: Key,
    /// The service named by its `kubernetes.io/service-name` label.
    service: String,
    ports: Arc<Vec<PortEntry>>,
    endpoints: Vec<EndpointFacts>,
}

#[derive(Debug, Clone, PartialEq)]
struct EndpointFacts {
    ready: bool,
    /// The first address, parsed, or as written when it is not an address.
    address: Result<IpAddr, Box<str>>,
    /// The hostname (or with `endpoint_pod_names` the pod name), lower-case; `None`: the
    /// dashed address.
    name: Option<Box<str>>,
}

impl SliceFacts {
    /// The facts of `slice` under `config`; `None` without a namespace, name or service label.
    pub fn new(config: &ZoneConfig, slice: &EndpointSlice) -> Option<SliceFacts> {
        let key = key_of(&slice.metadata)?;
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))?
            .clone();
        let mut facts = SliceFacts {
            key,
            service,
            ports: Arc::default(),
            endpoints: Vec::new(),
        };
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            return Some(facts);
        }
        facts.ports = Arc::new(
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
            // Consumers use only the first address of an endpoint (API contract).
            let Some(addr) = ep.addresses.first() else {
                continue;
            };
            facts.endpoints.push(EndpointFacts {
                ready: ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
                address: addr.parse::<IpAddr>().map_err(|_| addr.as_str().into()),
                name: endpoint_name(ep, config.options.endpoint_pod_names),
            });
        }
        facts.endpoints.shrink_to_fit();
        Some(facts)
    }

    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    pub(crate) fn service(&self) -> &str {
        &self.service
    }
}

pub(crate) type Key = (String, String);

pub(crate) fn key_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Key> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

/// The parts of a Service answers depend on; `None` (with a warning when invalid) when the
/// service is not indexed.
fn service_base(
    config: &ZoneConfig,
    ns: &str,
    name: &str,
    svc: &Service,
    warnings: &mut Vec<String>,
) -> Option<ServiceBase> {
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

    Some(ServiceBase {
        fqdn,
        kind,
        ports,
        external_ips,
        publish_not_ready: spec.publish_not_ready_addresses.unwrap_or(false),
    })
}

/// Index one service from its facts and its slices' (sorted by slice name); warnings about
/// either go to `warnings`.
pub(crate) fn service_entry(
    config: &ZoneConfig,
    facts: &ServiceFacts,
    slices: &[&SliceFacts],
    warnings: &mut Vec<String>,
) -> Option<ServiceEntry> {
    warnings.extend(facts.warnings.iter().cloned());
    let base = facts.base.clone()?;
    let (ns, name) = &facts.key;
    let what = format!("Service {ns}/{name}");
    // (label, ip, ports) of each published endpoint.
    let mut endpoints: Vec<(String, EndpointEntry)> = Vec::new();
    if !matches!(base.kind, ServiceKind::ExternalName(_)) && !config.options.no_endpoints {
        for slice in slices {
            for ep in &slice.endpoints {
                if !ep.ready && !base.publish_not_ready {
                    continue;
                }
                let ip = match &ep.address {
                    Ok(ip) => *ip,
                    Err(addr) => {
                        let slice_name = &slice.key.1;
                        warnings.push(format!(
                            "EndpointSlice {ns}/{slice_name}: endpoints.addresses: {addr:?} is not an IP address"
                        ));
                        continue;
                    }
                };
                let label = match &ep.name {
                    Some(name) => name.to_string(),
                    None => dashed_ip(ip),
                };
                if Name::from_ascii(&label)
                    .and_then(|l| l.append_domain(&base.fqdn))
                    .is_err()
                {
                    warnings.push(format!(
                        "EndpointSlice for {what}: endpoints.hostname: {label:?} is not a DNS label"
                    ));
                    continue;
                }
                let entry = EndpointEntry {
                    name: ep.name.clone(),
                    ip,
                    ports: slice.ports.clone(),
                };
                endpoints.push((label, entry));
            }
        }
    }
    endpoints.sort_by(|(a, x), (b, y)| (a, x.ip).cmp(&(b, y.ip)));
    endpoints.dedup_by(|(a, x), (b, y)| a == b && x.ip == y.ip);
    let endpoints: Vec<EndpointEntry> = endpoints.into_iter().map(|(_, e)| e).collect();
    // Only a headless service answers with its endpoints' addresses.
    let mut endpoint_ips: Vec<IpAddr> = Vec::new();
    if matches!(base.kind, ServiceKind::Headless) {
        endpoint_ips = endpoints.iter().map(|e| e.ip).collect();
        endpoint_ips.sort();
        endpoint_ips.dedup();
    }

    Some(ServiceEntry {
        base,
        endpoints: endpoints.into_boxed_slice(),
        endpoint_ips: endpoint_ips.into_boxed_slice(),
    })
}

/// An endpoint's DNS name when it is not its dashed IP: its hostname; else, with
/// `endpoint_pod_names`, the name of the pod it targets when that is a DNS label (at most 63
/// characters, CoreDNS's rule). Lower-case.
fn endpoint_name(ep: &Endpoint, pod_names: bool) -> Option<Box<str>> {
    if let Some(hostname) = ep.hostname.as_deref().filter(|h| !h.is_empty()) {
        return Some(hostname.to_ascii_lowercase().into());
    }
    ep.target_ref
        .as_ref()
        .filter(|r| pod_names && matches!(r.kind.as_deref(), None | Some("Pod")))
        .and_then(|r| r.name.as_deref())
        .filter(|n| !n.is_empty() && n.len() <= 63 && !n.contains('.'))
        .map(|name| name.to_ascii_lowercase().into())
}
