//! The cluster zone as data: an immutable index built from a snapshot of API objects, and a pure
//! function from a question to an answer.
//!
//! Nothing here does I/O, reads a clock or draws randomness on its own: the snapshot, the SOA
//! serial and the random source (headless answers are shuffled) are all passed in, so every rule
//! of the Kubernetes DNS specification is tested as data (see `tests.rs`). The transport
//! (`crate::server`) owns sockets, upstream forwarding and truncation.
//!
//! **Architecture Invariant:** a [`Zone`] never changes after [`Zone::build`]; watchers publish a
//! new one, so a query never sees a half-applied update.

mod build;
mod external;
mod lookup;
mod names;
mod options;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, SOA};
use hickory_proto::rr::{Name, RData, Record};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

pub use build::{ServiceFacts, SliceFacts};
pub(crate) use lookup::Quick;
pub use names::{dashed_ip, parse_dashed_ip};
pub use options::{EXTERNAL_TTL, parse_ttl};
pub use state::ZoneState;

/// The schema version of the Kubernetes DNS specification this server implements.
pub const DNS_SCHEMA_VERSION: &str = "1.1.0";

/// How `<dashed-ip>.<ns>.pod.<zone>` names are answered (CoreDNS's `pods` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodMode {
    /// Any well-formed dashed IP in an existing namespace resolves to that IP, unchecked.
    #[default]
    Insecure,
    /// Only when a pod with that IP exists in that namespace.
    Verified,
    /// Never: NXDOMAIN.
    Disabled,
}

impl std::str::FromStr for PodMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "insecure" => Ok(PodMode::Insecure),
            "verified" => Ok(PodMode::Verified),
            "disabled" => Ok(PodMode::Disabled),
            other => Err(format!(
                "unknown pods mode {other:?}: expected insecure, verified or disabled"
            )),
        }
    }
}

/// What the zone is and how it answers; fixed for the life of a server.
#[derive(Debug, Clone)]
pub struct ZoneConfig {
    /// The cluster domain, e.g. `cluster.local.` (stored lower-case and fully qualified).
    pub domain: Name,
    /// TTL of every record, and the SOA minimum (negative-caching TTL).
    pub ttl: u32,
    /// Pod record mode.
    pub pods: PodMode,
    /// Reverse lookups for addresses in these networks are answered here (NXDOMAIN when unknown);
    /// reverse lookups for other addresses not in the index go to the upstream.
    pub reverse_cidrs: Vec<IpNet>,
    /// `namespace/name` of the Service whose cluster IPs are the glue of `ns.dns.<zone>`.
    pub dns_service: (String, String),
    /// The options of CoreDNS's `kubernetes` plugin beyond `ttl` and `pods`.
    pub options: PluginOptions,
    /// CoreDNS's `k8s_external` plugin: services' external addresses under other zones.
    pub external: Option<ExternalZones>,
}

/// CoreDNS's `kubernetes` plugin options, with its semantics (see `options.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginOptions {
    /// `endpoint_pod_names`: an endpoint without a hostname is named after its pod (when the
    /// name is a DNS label), not its dashed IP.
    pub endpoint_pod_names: bool,
    /// `ignore empty_service`: a service with a cluster IP and no ready endpoint is NXDOMAIN, so
    /// a client's search path goes on to the next domain.
    pub ignore_empty_service: bool,
    /// `namespaces NS…`: only these are served (lower-case; empty: all).
    pub namespaces: std::collections::BTreeSet<String>,
    /// `noendpoints`: EndpointSlices are not read; endpoint names and headless services are
    /// NXDOMAIN.
    pub no_endpoints: bool,
    /// `fallthrough [ZONES…]`: an NXDOMAIN of the zone for a name under one of these goes to the
    /// upstream instead (`Some(empty)`: every zone served).
    pub fallthrough: Option<Vec<Name>>,
}

impl PluginOptions {
    /// Whether records of namespace `ns` (lower-case) are served.
    pub fn exposes(&self, ns: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.contains(ns)
    }

    /// Whether an NXDOMAIN for `name` falls through to the upstream.
    pub fn falls_through(&self, name: &Name) -> bool {
        match &self.fallthrough {
            None => false,
            Some(zones) if zones.is_empty() => true,
            Some(zones) => zones.iter().any(|z| z.zone_of(name)),
        }
    }
}

/// CoreDNS's `k8s_external`: `<svc>.<ns>.<zone>` answers a service's external IPs and
/// LoadBalancer ingress IPs; the apex has an SOA and `ns1.<apex>.<zone>` as its NS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalZones {
    /// The zones (lower-case, fully qualified).
    pub zones: Vec<Name>,
    /// TTL of its records and its SOA minimum (CoreDNS's default: 5).
    pub ttl: u32,
    /// The label of the subdomain holding the name server (`dns`).
    pub apex: String,
}

impl ZoneConfig {
    /// The Kubernetes defaults: `cluster.local`, TTL 30 s, pods insecure, service CIDR
    /// 10.96.0.0/12 and fd00:10:96::/112, pod CIDR 10.244.0.0/16, DNS service kube-system/kube-dns.
    pub fn new(domain: &str) -> Result<Self, ZoneError> {
        let domain = Name::from_ascii(domain)
            .map_err(|e| ZoneError::Domain(domain.to_string(), e.to_string()))?
            .to_lowercase();
        let mut domain = domain;
        domain.set_fqdn(true);
        let reverse_cidrs = ["10.96.0.0/12", "fd00:10:96::/112", "10.244.0.0/16"]
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect();
        Ok(ZoneConfig {
            domain,
            ttl: 30,
            pods: PodMode::Insecure,
            reverse_cidrs,
            dns_service: ("kube-system".into(), "kube-dns".into()),
            options: PluginOptions::default(),
            external: None,
        })
    }
}

impl ZoneConfig {
    /// The SOA for a question under `name` before any zone was built (CoreDNS sends its SOA
    /// with a SERVFAIL before its first sync): the cluster zone's, the served reverse zone's,
    /// or an external zone's, with serial 0; `None` for a name the server does not own.
    pub fn unsynced_soa(&self, name: &Name) -> Option<Record> {
        let record = |owner: Name, mname: Name, rname: Name, ttl: u32| {
            let soa = SOA::new(mname, rname, 0, 7200, 1800, 86400, ttl);
            Record::from_rdata(owner, ttl, RData::SOA(soa))
        };
        let under = |zone: &Name, prefix: &str| {
            Name::from_ascii(prefix)
                .and_then(|p| p.append_domain(zone))
                .unwrap_or_else(|_| zone.clone())
        };
        if self.domain.zone_of(name) {
            let d = &self.domain;
            return Some(record(
                d.clone(),
                under(d, "ns.dns"),
                under(d, "hostmaster"),
                self.ttl,
            ));
        }
        if let Some(external) = &self.external
            && let Some(zone) = external.zones.iter().find(|z| z.zone_of(name))
        {
            let ns = format!("ns1.{}", external.apex);
            let host = format!("hostmaster.{}", external.apex);
            return Some(record(
                zone.clone(),
                under(zone, &ns),
                under(zone, &host),
                external.ttl,
            ));
        }
        let mut fqdn = name.clone();
        fqdn.set_fqdn(true);
        let net = fqdn.parse_arpa_name().ok()?;
        if net.prefix_len() != net.max_prefix_len() {
            return None;
        }
        let ip = net.addr();
        let prefix = self
            .reverse_cidrs
            .iter()
            .filter(|c| c.contains(&ip))
            .map(|c| c.prefix_len())
            .max()?;
        let d = &self.domain;
        let owner = lookup::reverse_zone_of(ip, prefix);
        Some(record(
            owner,
            under(d, "ns.dns"),
            under(d, "hostmaster"),
            self.ttl,
        ))
    }
}

/// Errors in the zone configuration.
#[derive(Debug, thiserror::Error)]
pub enum ZoneError {
    /// The cluster domain is not a valid DNS name.
    #[error("cluster domain {0:?} is not a valid DNS name: {1}")]
    Domain(String, String),
    /// An option in CoreDNS's syntax that is unknown or malformed.
    #[error("option {0:?}: {1}")]
    Option(String, String),
}

/// The API objects a zone is built from (typically the reflector stores' contents).
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub services: Vec<Arc<Service>>,
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    pub pods: Vec<Arc<Pod>>,
    pub namespaces: Vec<Arc<Namespace>>,
}

/// The immutable, indexed cluster zone.
#[derive(Debug)]
pub struct Zone {
    config: Arc<ZoneConfig>,
    serial: u32,
    /// Namespace name → its services (a namespace exists when a Namespace object or a Service
    /// in it exists).
    namespaces: Arc<NameMap<Arc<NamespaceEntry>>>,
    /// IP → PTR targets, sharded by address: the service for a cluster IP, else every endpoint
    /// with that IP.
    reverse: Vec<Arc<state::ReverseShard>>,
    /// (namespace, IP) of every pod with an IP, for `pods verified`.
    pod_ips: Arc<HashSet<(String, IpAddr)>>,
    /// Glue for `ns.dns.<zone>`.
    dns_ips: Vec<IpAddr>,
    /// The SOA's `ns.dns.<zone>` and `hostmaster.<zone>`, made once per snapshot.
    soa_names: (Name, Name),
    /// The cluster domain's labels (lower-case, leftmost first), for [`Zone::lookup_labels`].
    domain_labels: Box<[Box<str>]>,
    /// Objects that could not be indexed, each naming the object and field.
    warnings: Vec<String>,
}

/// A service (by its name) or one of its endpoints, as a PTR target.
#[derive(Debug, Clone)]
struct ReverseTarget {
    service: Arc<ServiceEntry>,
    /// Index into the service's endpoints; `u32::MAX`: the service itself.
    endpoint: u32,
}

impl ReverseTarget {
    fn service(service: &Arc<ServiceEntry>) -> Self {
        ReverseTarget {
            service: service.clone(),
            endpoint: u32::MAX,
        }
    }

    fn endpoint(service: &Arc<ServiceEntry>, index: usize) -> Self {
        ReverseTarget {
            service: service.clone(),
            endpoint: u32::try_from(index).unwrap_or(u32::MAX),
        }
    }

    fn is_service(&self) -> bool {
        self.endpoint == u32::MAX
    }

    fn name(&self) -> Name {
        let endpoint = usize::try_from(self.endpoint)
            .ok()
            .and_then(|i| self.service.endpoints.get(i));
        match endpoint {
            Some(ep) => ep.fqdn(&self.service.fqdn),
            None => self.service.fqdn.clone(),
        }
    }
}

/// The PTR targets of one address: almost always one, kept inline (an address map entry then
/// needs no allocation of its own).
#[derive(Debug, Clone)]
enum ReverseTargets {
    One(ReverseTarget),
    Many(Box<[ReverseTarget]>),
}

impl ReverseTargets {
    fn iter(&self) -> std::slice::Iter<'_, ReverseTarget> {
        match self {
            ReverseTargets::One(t) => std::slice::from_ref(t).iter(),
            ReverseTargets::Many(v) => v.iter(),
        }
    }

    fn push(&mut self, target: ReverseTarget) {
        match self {
            ReverseTargets::One(first) => {
                *self = ReverseTargets::Many(vec![first.clone(), target].into_boxed_slice());
            }
            ReverseTargets::Many(v) => {
                let mut all = v.to_vec();
                all.push(target);
                *v = all.into_boxed_slice();
            }
        }
    }

    /// Keep the targets `keep` accepts; false when none is left.
    fn retain(&mut self, keep: impl Fn(&ReverseTarget) -> bool) -> bool {
        match self {
            ReverseTargets::One(t) => keep(t),
            ReverseTargets::Many(v) => {
                let kept: Vec<ReverseTarget> = v.iter().filter(|t| keep(t)).cloned().collect();
                match kept.as_slice() {
                    [] => false,
                    [one] => {
                        *self = ReverseTargets::One(one.clone());
                        true
                    }
                    _ => {
                        *v = kept.into_boxed_slice();
                        true
                    }
                }
            }
        }
    }
}

#[derive(Debug, Default, Clone)]
struct NamespaceEntry {
    services: NameMap<Arc<ServiceEntry>>,
}

/// The maps every question looks names up in (namespace, then service): foldhash instead of
/// SipHash, about a third of the cost for these short keys. The keys are the API objects'
/// names, which a client does not choose (it only looks them up), and the hasher is randomly
/// seeded, so SipHash's protection against crafted colliding keys is not needed here.
pub(crate) type NameMap<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// One service as the zone sees it: the parts of its Service object (shared with the watch
/// state's facts) and its published endpoints.
#[derive(Debug)]
struct ServiceEntry {
    base: Arc<ServiceBase>,
    /// Endpoints published in DNS (ready, or all with publishNotReadyAddresses), one per
    /// (label, IP), in a stable order.
    endpoints: Box<[EndpointEntry]>,
    /// The distinct endpoint IPs, sorted (the headless answer; empty for other kinds).
    endpoint_ips: Box<[IpAddr]>,
}

/// The entry reads as its Service's parts (`entry.fqdn`, `entry.kind`, ...).
impl std::ops::Deref for ServiceEntry {
    type Target = ServiceBase;
    fn deref(&self) -> &ServiceBase {
        &self.base
    }
}

/// What the zone keeps of a Service object.
#[derive(Debug, PartialEq)]
pub(crate) struct ServiceBase {
    /// `<svc>.<ns>.svc.<zone>.`
    fqdn: Name,
    kind: ServiceKind,
    ports: Vec<PortEntry>,
    /// `spec.externalIPs` then the LoadBalancer ingress IPs, deduplicated (`k8s_external`).
    external_ips: Vec<IpAddr>,
    /// `spec.publishNotReadyAddresses`.
    publish_not_ready: bool,
}

#[derive(Debug)]
enum ServiceKind {
    /// Cluster IPs, primary first.
    ClusterIp(Vec<IpAddr>),
    Headless,
    ExternalName(Name),
}

/// Equal when every answer would be: an ExternalName target compares with its case (answers
/// carry it as written).
impl PartialEq for ServiceKind {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (ServiceKind::ClusterIp(a), ServiceKind::ClusterIp(b)) => a == b,
            (ServiceKind::Headless, ServiceKind::Headless) => true,
            (ServiceKind::ExternalName(a), ServiceKind::ExternalName(b)) => {
                a.eq_case(b) && a.is_fqdn() == b.is_fqdn()
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PortEntry {
    /// Lower-case port name; empty for an unnamed port.
    name: String,
    /// Lower-case protocol: `tcp`, `udp` or `sctp`.
    protocol: String,
    port: u16,
}

/// One published endpoint: its name is `<label>.<svc>.<ns>.svc.<zone>.`, made when an answer
/// needs it rather than kept (most endpoints are named by their dashed address).
#[derive(Debug)]
struct EndpointEntry {
    /// The hostname (or pod name), lower-case; `None`: the dashed IP is the label.
    name: Option<Box<str>>,
    ip: IpAddr,
    /// The ports of the slice this endpoint came from (shared by the slice's endpoints).
    ports: Arc<Vec<PortEntry>>,
}

impl EndpointEntry {
    /// Whether `label` (lower-case) names this endpoint.
    fn is_named(&self, label: &str) -> bool {
        match &self.name {
            Some(name) => **name == *label,
            None => names::parse_dashed_ip(label) == Some(self.ip) && dashed_ip(self.ip) == label,
        }
    }

    /// `<label>.<service fqdn>` (valid: the build skipped endpoints whose label is not).
    fn fqdn(&self, service: &Name) -> Name {
        let label = match &self.name {
            Some(name) => std::borrow::Cow::Borrowed(&**name),
            None => std::borrow::Cow::Owned(dashed_ip(self.ip)),
        };
        Name::from_ascii(&*label)
            .and_then(|l| l.append_domain(service))
            .unwrap_or_else(|_| service.clone())
    }
}

/// Where a question goes.
#[derive(Debug)]
pub enum Outcome {
    /// The question is not in the cluster zone nor in a reverse range it owns: ask the upstream.
    Forward,
    /// The zone answers it.
    Answer(Response),
}

/// An authoritative answer, before wire encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub rcode: ResponseCode,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
    /// An ExternalName target outside the zone: the transport resolves it through the upstream
    /// and appends its answer (and rcode and truncation) after `answers`.
    pub chase: Option<Name>,
    /// Every answer record is owned by the question name exactly as asked (no CNAME was
    /// followed), which lets the transport encode owners as pointers to the question.
    pub owned_by_question: bool,
    /// A/AAAA answers kept as addresses (a headless service answers with hundreds; a hickory
    /// `Record` each would cost 272 bytes and a name copy). Set only when `answers` is empty;
    /// [`Response::answer_records`] gives them as records.
    pub addresses: Option<Box<Addresses>>,
}

/// Address answers owned by the question name: each IP is the record
/// `<owner> <ttl> IN A|AAAA <ip>`, in this (already shuffled) order.
#[derive(Debug, Clone, PartialEq)]
pub struct Addresses {
    pub owner: Name,
    pub ttl: u32,
    pub ips: Vec<IpAddr>,
}

impl Addresses {
    /// The addresses as hickory records.
    pub fn records(&self) -> Vec<Record> {
        self.ips
            .iter()
            .map(|ip| {
                let data = match ip {
                    IpAddr::V4(v4) => RData::A(A(*v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                };
                Record::from_rdata(self.owner.clone(), self.ttl, data)
            })
            .collect()
    }
}

impl Response {
    pub(crate) fn empty(rcode: ResponseCode) -> Self {
        Response {
            rcode,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
            chase: None,
            owned_by_question: false,
            addresses: None,
        }
    }

    /// The answer section as records: `answers`, then `addresses`.
    pub fn answer_records(&self) -> Vec<Record> {
        let mut out = self.answers.clone();
        if let Some(addresses) = &self.addresses {
            out.extend(addresses.records());
        }
        out
    }
}

/// Canonical text: rcode, then each section's records sorted (sections are sets; order within
/// them is not part of the contract), then the out-of-zone target if any.
impl fmt::Display for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", rcode_text(self.rcode))?;
        let answers = self.answer_records();
        for (title, records) in [
            ("answer", &answers),
            ("authority", &self.authorities),
            ("additional", &self.additionals),
        ] {
            if records.is_empty() {
                continue;
            }
            writeln!(f, "{title}:")?;
            let mut lines: Vec<String> = records.iter().map(|r| r.to_string()).collect();
            lines.sort();
            for line in lines {
                writeln!(f, "  {line}")?;
            }
        }
        if let Some(target) = &self.chase {
            writeln!(f, "chase: {target}")?;
        }
        Ok(())
    }
}

/// The rcode as `dig` prints it (`NOERROR`, `NXDOMAIN`, ...).
pub fn rcode_text(rcode: ResponseCode) -> String {
    match rcode {
        ResponseCode::NoError => "NOERROR".into(),
        ResponseCode::FormErr => "FORMERR".into(),
        ResponseCode::ServFail => "SERVFAIL".into(),
        ResponseCode::NXDomain => "NXDOMAIN".into(),
        ResponseCode::NotImp => "NOTIMP".into(),
        ResponseCode::Refused => "REFUSED".into(),
        other => format!("{other:?}").to_ascii_uppercase(),
    }
}

impl Zone {
    /// The configuration this zone was built with.
    pub fn config(&self) -> &ZoneConfig {
        &self.config
    }

    /// The SOA serial.
    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// Objects skipped while building, each as "kind ns/name: field: problem".
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Number of services indexed.
    pub fn service_count(&self) -> usize {
        self.namespaces.values().map(|n| n.services.len()).sum()
    }
}
