//! Answering one question from a [`Zone`].
//!
//! Names are parsed from the zone apex down, as the specification lays them out:
//! `[<endpoint>.]<svc>.<ns>.svc.<zone>`, `_<port>._<proto>.<svc>.<ns>.svc.<zone>`,
//! `<dashed-ip>.<ns>.pod.<zone>`, `dns-version.<zone>`, `ns.dns.<zone>`, and the apex itself.
//! Answer owners keep the question's case; comparisons ignore case.

use std::convert::Infallible;
use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use rand::Rng;
use rand::seq::SliceRandom;

use super::names::{is_reverse, parse_dashed_ip, relative_labels, reverse_apex, reverse_ip};
use super::{
    Addresses, DNS_SCHEMA_VERSION, Outcome, PodMode, PortEntry, Response, ServiceEntry,
    ServiceKind, Zone,
};

/// TTL of `dns-version.<zone>` (CoreDNS's value).
const DNS_VERSION_TTL: u32 = 28800;
/// Longest in-zone CNAME chain followed in one answer.
const MAX_CHASE: usize = 8;

/// What one name holds for one type. `M` is what a caller without the question's [`Name`] gets
/// back for an answer whose records need it as their owner ([`Node::Unnamed`]); callers with the
/// name use `Infallible`.
enum Node<M = Infallible> {
    NxDomain,
    NoData,
    Records {
        answers: Vec<Record>,
        additionals: Vec<Record>,
    },
    Cname(Box<Record>, Name),
    /// A/AAAA answers at the owner, filtered by type and shuffled.
    Addresses(Vec<IpAddr>),
    /// Records owned by the question name, which the caller did not pass.
    Unnamed(M),
}

/// The question name, for [`Zone::node`]: `Ok` with it, or `Err` from a caller that has only
/// the question's labels ([`Zone::lookup_labels`]).
type Owner<'a, M> = Result<&'a Name, M>;

/// Returned by [`Zone::lookup_labels`]'s [`Zone::node`] for an answer that needs the name.
#[derive(Debug, Clone, Copy)]
struct NoName;

/// An answer [`Zone::lookup_labels`] gives without the question's [`Name`]: the shapes that
/// make up most cluster DNS traffic and all of a search path's misses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Quick {
    /// NXDOMAIN (`true`) or NODATA (`false`), with the cluster zone's SOA ([`Zone::soa`]) as
    /// the only authority record.
    Negative { nxdomain: bool },
    /// A/AAAA answers at the question name, already shuffled, TTL [`ZoneConfig::ttl`](super::ZoneConfig::ttl)
    /// (what [`Response::addresses`] holds for the same question).
    Addresses(Vec<IpAddr>),
}

impl Zone {
    /// Answer `name`/`qtype`/`qclass`, or say it belongs to the upstream. `rng` shuffles
    /// multi-record answers (headless services), so clients never rely on an order.
    pub fn lookup<R: Rng + ?Sized>(
        &self,
        name: &Name,
        qtype: RecordType,
        qclass: DNSClass,
        rng: &mut R,
    ) -> Outcome {
        let outcome = self.lookup_here(name, qtype, qclass, rng);
        // `fallthrough`: an NXDOMAIN of ours for a name in a fallthrough zone is the
        // upstream's question (a CNAME chain that ends in NXDOMAIN is still our answer).
        match &outcome {
            Outcome::Answer(r)
                if r.rcode == ResponseCode::NXDomain
                    && r.answers.is_empty()
                    && self.config.options.falls_through(name) =>
            {
                Outcome::Forward
            }
            _ => outcome,
        }
    }

    /// [`Zone::lookup`] of a class-IN question given as its labels (leftmost first, without
    /// the root, lower-case ASCII), for the UDP loop that reads them straight from the
    /// datagram: the same answer when it is one of [`Quick`]'s shapes, `None` when it is
    /// anything else (a name outside the cluster domain, records owned by the question name,
    /// `fallthrough` configured), which the caller then asks [`Zone::lookup`] with a `Name`.
    /// Draws from `rng` only when it answers.
    pub(crate) fn lookup_labels<R: Rng + ?Sized>(
        &self,
        labels: &[&str],
        qtype: RecordType,
        rng: &mut R,
    ) -> Option<Quick> {
        // `fallthrough` may send an NXDOMAIN upstream; zone transfers are refused.
        if self.config.options.fallthrough.is_some()
            || matches!(qtype, RecordType::AXFR | RecordType::IXFR)
        {
            return None;
        }
        let domain = &self.domain_labels;
        let relative = labels.len().checked_sub(domain.len())?;
        if labels[relative..]
            .iter()
            .zip(domain.iter())
            .any(|(l, d)| *l != &**d)
        {
            return None;
        }
        match self.node(&labels[..relative], Err(NoName), qtype, rng) {
            Node::NxDomain => Some(Quick::Negative { nxdomain: true }),
            Node::NoData => Some(Quick::Negative { nxdomain: false }),
            Node::Addresses(ips) => Some(Quick::Addresses(ips)),
            Node::Records { .. } | Node::Cname(..) | Node::Unnamed(NoName) => None,
        }
    }

    fn lookup_here<R: Rng + ?Sized>(
        &self,
        name: &Name,
        qtype: RecordType,
        qclass: DNSClass,
        rng: &mut R,
    ) -> Outcome {
        let domain = &self.config.domain;
        let Some(first_labels) = relative_labels(name, domain) else {
            if let Some(response) = self.external_lookup(name, qtype, qclass) {
                return Outcome::Answer(response);
            }
            return match self.reverse_lookup(name, qtype, qclass) {
                Some(response) => Outcome::Answer(response),
                None => Outcome::Forward,
            };
        };
        if !matches!(qclass, DNSClass::IN | DNSClass::ANY) {
            return Outcome::Answer(Response::empty(ResponseCode::Refused));
        }
        if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            return Outcome::Answer(Response::empty(ResponseCode::Refused));
        }

        let mut response = Response::empty(ResponseCode::NoError);
        let mut owner = name.clone();
        // The question's labels were taken apart above; a CNAME target's are taken here.
        let mut first = Some(first_labels);
        for _ in 0..MAX_CHASE {
            let labels = match first.take() {
                Some(labels) => Some(labels),
                None => relative_labels(&owner, domain),
            };
            let Some(labels) = labels else {
                // The chain left the zone: the transport resolves the rest upstream.
                response.chase = Some(owner);
                return Outcome::Answer(response);
            };
            match self.node::<_, _, Infallible>(&labels, Ok(&owner), qtype, rng) {
                Node::NxDomain => {
                    response.rcode = ResponseCode::NXDomain;
                    response.authorities.push(self.soa());
                    return Outcome::Answer(response);
                }
                Node::NoData => {
                    response.authorities.push(self.soa());
                    return Outcome::Answer(response);
                }
                Node::Records {
                    answers,
                    additionals,
                } => {
                    response.owned_by_question = response.answers.is_empty();
                    response.answers.extend(answers);
                    response.additionals.extend(additionals);
                    return Outcome::Answer(response);
                }
                Node::Addresses(ips) => {
                    if response.answers.is_empty() {
                        response.owned_by_question = true;
                        response.addresses = Some(Box::new(Addresses {
                            owner,
                            ttl: self.config.ttl,
                            ips,
                        }));
                    } else {
                        let records =
                            address_records(&owner, &ips, RecordType::ANY, self.config.ttl);
                        response.answers.extend(records);
                    }
                    return Outcome::Answer(response);
                }
                Node::Unnamed(never) => match never {},
                Node::Cname(record, target) => {
                    response.answers.push(*record);
                    if qtype == RecordType::CNAME {
                        return Outcome::Answer(response);
                    }
                    // Name equality ignores case.
                    let seen = response.answers.iter().any(|r| r.name == target);
                    if seen {
                        break;
                    }
                    owner = target;
                }
            }
        }
        // A CNAME loop inside the zone, or a chain too long.
        response.rcode = ResponseCode::ServFail;
        Outcome::Answer(response)
    }

    /// The SOA of the cluster zone.
    pub fn soa(&self) -> Record {
        self.soa_at(self.config.domain.clone())
    }

    /// What a served zone's apex (`owner`) holds for `qtype`: its SOA, its NS
    /// (`ns.dns.<zone>`) with the address records of that name as glue.
    fn apex_records(&self, owner: &Name, qtype: RecordType) -> (Vec<Record>, Vec<Record>) {
        let ttl = self.config.ttl;
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        if matches!(qtype, RecordType::SOA | RecordType::ANY) {
            answers.push(self.soa_at(owner.clone()));
        }
        if matches!(qtype, RecordType::NS | RecordType::ANY) {
            let ns = prefixed("ns.dns", &self.config.domain);
            answers.push(Record::from_rdata(
                owner.clone(),
                ttl,
                RData::NS(NS(ns.clone())),
            ));
            additionals.extend(address_records(&ns, &self.dns_ips, RecordType::ANY, ttl));
        }
        (answers, additionals)
    }

    pub(super) fn soa_at(&self, owner: Name) -> Record {
        let soa = SOA::new(
            self.soa_names.0.clone(),
            self.soa_names.1.clone(),
            self.serial,
            7200,
            1800,
            86400,
            self.config.ttl,
        );
        Record::from_rdata(owner, self.config.ttl, RData::SOA(soa))
    }

    /// What the name of `labels` (lower-case, below the cluster domain, leftmost first) holds
    /// for `qtype`; `owner` is the question name as asked, when the caller has it.
    fn node<L: AsRef<str>, R: Rng + ?Sized, M>(
        &self,
        labels: &[L],
        owner: Owner<'_, M>,
        qtype: RecordType,
        rng: &mut R,
    ) -> Node<M> {
        let ttl = self.config.ttl;
        // Apex first; names of up to 8 labels (all the zone has) without an allocation.
        let mut short: [&str; 8] = [""; 8];
        let long: Vec<&str>;
        let labels: &[&str] = if labels.len() <= short.len() {
            for (slot, label) in short.iter_mut().zip(labels.iter().rev()) {
                *slot = label.as_ref();
            }
            &short[..labels.len()]
        } else {
            long = labels.iter().rev().map(AsRef::as_ref).collect();
            &long
        };
        match labels {
            [] => {
                let owner = match owner {
                    Ok(owner) => owner,
                    Err(m) => return Node::Unnamed(m),
                };
                let (answers, additionals) = self.apex_records(owner, qtype);
                records(answers, additionals)
            }
            ["dns-version"] => {
                if matches!(qtype, RecordType::TXT | RecordType::ANY) {
                    let owner = match owner {
                        Ok(owner) => owner,
                        Err(m) => return Node::Unnamed(m),
                    };
                    let txt = TXT::new(vec![DNS_SCHEMA_VERSION.to_string()]);
                    let record =
                        Record::from_rdata(owner.clone(), DNS_VERSION_TTL, RData::TXT(txt));
                    records(vec![record], Vec::new())
                } else {
                    Node::NoData
                }
            }
            ["dns"] | ["svc"] | ["pod"] => Node::NoData,
            ["dns", "ns"] => match owner {
                Ok(owner) => records(address_records(owner, &self.dns_ips, qtype, ttl), vec![]),
                Err(m) => Node::Unnamed(m),
            },
            ["svc", ns] | ["pod", ns] => {
                if self.namespace_exists(ns) {
                    Node::NoData
                } else {
                    Node::NxDomain
                }
            }
            ["svc", ns, svc, rest @ ..] => match self.service(ns, svc) {
                None => Node::NxDomain,
                // `ignore empty_service`: as if the service did not exist, so the client's
                // search path goes on (headless and ExternalName services are not affected).
                Some(entry)
                    if self.config.options.ignore_empty_service
                        && matches!(entry.kind, ServiceKind::ClusterIp(_))
                        && entry.endpoints.is_empty() =>
                {
                    Node::NxDomain
                }
                Some(entry) => self.service_node(entry, rest, owner, qtype, rng),
            },
            ["pod", ns, dashed] => self.pod_node(ns, dashed, owner, qtype),
            _ => Node::NxDomain,
        }
    }

    /// Whether namespace `ns` (lower-case) exists and is served: a Namespace object or a
    /// Service in it exists (the index holds only served namespaces).
    pub(super) fn namespace_exists(&self, ns: &str) -> bool {
        self.namespaces.contains_key(ns)
    }

    pub(super) fn service(&self, ns: &str, svc: &str) -> Option<&ServiceEntry> {
        self.namespaces.get(ns)?.services.get(svc).map(|e| &**e)
    }

    /// `rest` holds the labels left of `<svc>.<ns>.svc`, nearest first.
    fn service_node<R: Rng + ?Sized, M>(
        &self,
        entry: &ServiceEntry,
        rest: &[&str],
        owner: Owner<'_, M>,
        qtype: RecordType,
        rng: &mut R,
    ) -> Node<M> {
        let ttl = self.config.ttl;
        match (&entry.kind, rest) {
            (ServiceKind::ExternalName(target), []) => {
                let owner = match owner {
                    Ok(owner) => owner,
                    Err(m) => return Node::Unnamed(m),
                };
                let record =
                    Record::from_rdata(owner.clone(), ttl, RData::CNAME(CNAME(target.clone())));
                Node::Cname(Box::new(record), target.clone())
            }
            (ServiceKind::ExternalName(_), _) => Node::NxDomain,
            (ServiceKind::Headless, []) if entry.endpoints.is_empty() => Node::NxDomain,
            (kind, []) => {
                if qtype == RecordType::SRV {
                    return match owner {
                        Ok(owner) => self.srv(entry, None, owner, rng),
                        Err(m) => Node::Unnamed(m),
                    };
                }
                // Shuffle the addresses; the transport encodes them without building records.
                let all = match kind {
                    ServiceKind::ClusterIp(ips) => ips.as_slice(),
                    _ => &entry.endpoint_ips,
                };
                let mut ips: Vec<IpAddr> = all
                    .iter()
                    .filter(|ip| {
                        matches!(
                            (ip, qtype),
                            (_, RecordType::ANY)
                                | (IpAddr::V4(_), RecordType::A)
                                | (IpAddr::V6(_), RecordType::AAAA)
                        )
                    })
                    .copied()
                    .collect();
                if ips.is_empty() {
                    return Node::NoData;
                }
                ips.shuffle(rng);
                Node::Addresses(ips)
            }
            (_, [label]) => {
                let ips: Vec<IpAddr> = entry
                    .endpoints
                    .iter()
                    .filter(|e| e.is_named(label))
                    .map(|e| e.ip)
                    .collect();
                if !ips.is_empty() {
                    return match owner {
                        Ok(owner) => records(address_records(owner, &ips, qtype, ttl), Vec::new()),
                        Err(m) => Node::Unnamed(m),
                    };
                }
                // `_tcp.<svc>...` is an empty non-terminal when some `_port._tcp` exists below.
                let is_proto = label.starts_with('_')
                    && entry
                        .ports
                        .iter()
                        .any(|p| !p.name.is_empty() && p.protocol == label[1..]);
                if is_proto {
                    Node::NoData
                } else {
                    Node::NxDomain
                }
            }
            (_, [proto, port]) => {
                let (Some(proto), Some(port)) = (proto.strip_prefix('_'), port.strip_prefix('_'))
                else {
                    return Node::NxDomain;
                };
                if !entry
                    .ports
                    .iter()
                    .any(|p| p.name == port && p.protocol == proto)
                {
                    return Node::NxDomain;
                }
                if qtype != RecordType::SRV && qtype != RecordType::ANY {
                    return Node::NoData;
                }
                match owner {
                    Ok(owner) => self.srv(entry, Some((port, proto)), owner, rng),
                    Err(m) => Node::Unnamed(m),
                }
            }
            _ => Node::NxDomain,
        }
    }

    /// SRV records of a service: for one named port (`_<port>._<proto>` names) or for every port
    /// (the bare service name, as CoreDNS answers). Cluster-IP services target the service name
    /// with the service port; headless ones target each endpoint with the endpoint's port. The
    /// targets' addresses go to the additional section.
    fn srv<R: Rng + ?Sized, M>(
        &self,
        entry: &ServiceEntry,
        port: Option<(&str, &str)>,
        owner: &Name,
        rng: &mut R,
    ) -> Node<M> {
        let ttl = self.config.ttl;
        let wanted = |p: &PortEntry| match port {
            Some((name, proto)) => p.name == name && p.protocol == proto,
            None => true,
        };
        let mut targets: Vec<(u16, Name, Vec<IpAddr>)> = Vec::new();
        match &entry.kind {
            ServiceKind::ClusterIp(ips) => {
                for p in entry.ports.iter().filter(|p| wanted(p)) {
                    targets.push((p.port, entry.fqdn.clone(), ips.clone()));
                }
            }
            ServiceKind::Headless => {
                for ep in &entry.endpoints {
                    let mut fqdn = None;
                    for p in ep.ports.iter().filter(|p| wanted(p)) {
                        let fqdn = fqdn.get_or_insert_with(|| ep.fqdn(&entry.fqdn));
                        targets.push((p.port, fqdn.clone(), vec![ep.ip]));
                    }
                }
            }
            ServiceKind::ExternalName(_) => {}
        }
        targets.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        targets.dedup_by(|a, b| {
            a.0 == b.0 && a.1 == b.1 && {
                b.2.append(&mut a.2);
                true
            }
        });
        if targets.is_empty() {
            return Node::NoData;
        }
        let weight = u16::try_from(100 / targets.len()).unwrap_or(0);
        let mut answers = Vec::with_capacity(targets.len());
        let mut additionals = Vec::new();
        let mut glued: Vec<&Name> = Vec::new();
        for (port, target, ips) in &targets {
            answers.push(SRV::new(0, weight, *port, target.clone()));
            if glued.contains(&target) {
                continue;
            }
            glued.push(target);
            let mut ips = ips.clone();
            ips.sort();
            ips.dedup();
            additionals.extend(address_records(target, &ips, RecordType::ANY, ttl));
        }
        answers.shuffle(rng);
        Node::Records {
            answers: answers
                .into_iter()
                .map(|srv| Record::from_rdata(owner.clone(), ttl, RData::SRV(srv)))
                .collect(),
            additionals,
        }
    }

    fn pod_node<M>(
        &self,
        ns: &str,
        dashed: &str,
        owner: Owner<'_, M>,
        qtype: RecordType,
    ) -> Node<M> {
        let Some(ip) = parse_dashed_ip(dashed) else {
            return Node::NxDomain;
        };
        let known = match self.config.pods {
            PodMode::Disabled => false,
            // Any well-formed name in a namespace that exists (CoreDNS's `pods insecure`;
            // kube-dns answered in any namespace).
            PodMode::Insecure => self.namespace_exists(ns),
            PodMode::Verified => {
                self.config.options.exposes(ns) && self.pod_ips.contains(&(ns.to_string(), ip))
            }
        };
        if !known {
            return Node::NxDomain;
        }
        let owner = match owner {
            Ok(owner) => owner,
            Err(m) => return Node::Unnamed(m),
        };
        records(
            address_records(owner, &[ip], qtype, self.config.ttl),
            Vec::new(),
        )
    }

    /// PTR answers for addresses this zone owns, and the reverse zones it serves (their
    /// apexes' SOA and NS, the names between an apex and an address); `None` sends the
    /// question upstream.
    fn reverse_lookup(&self, name: &Name, qtype: RecordType, qclass: DNSClass) -> Option<Response> {
        if !is_reverse(name) {
            return None;
        }
        let Some(ip) = reverse_ip(name) else {
            return self.reverse_partial(name, qtype, qclass);
        };
        let names = self.reverse[super::state::shard_of(&ip)]
            .get(&ip)
            .map(|targets| {
                // A cluster IP names its service alone; otherwise every endpoint with the IP.
                let mut names: Vec<Name> = match targets.iter().find(|t| t.is_service()) {
                    Some(service) => vec![service.name()],
                    None => targets.iter().map(|t| t.name()).collect(),
                };
                names.sort();
                names
            });
        if names.is_none() && !self.config.reverse_cidrs.iter().any(|c| c.contains(&ip)) {
            return None;
        }
        if !matches!(qclass, DNSClass::IN | DNSClass::ANY) {
            return Some(Response::empty(ResponseCode::Refused));
        }
        let mut response = Response::empty(ResponseCode::NoError);
        match names {
            None => {
                response.rcode = ResponseCode::NXDomain;
                response
                    .authorities
                    .push(self.soa_at(self.reverse_zone(ip)));
            }
            Some(names) if matches!(qtype, RecordType::PTR | RecordType::ANY) => {
                response.answers = names
                    .into_iter()
                    .map(|n| Record::from_rdata(name.clone(), self.config.ttl, RData::PTR(PTR(n))))
                    .collect();
            }
            Some(_) => response
                .authorities
                .push(self.soa_at(self.reverse_zone(ip))),
        }
        Some(response)
    }
}

impl Zone {
    /// A reverse name shorter than an address (`96.10.in-addr.arpa.`, `0.96.10.in-addr.arpa.`)
    /// inside a served reverse zone: the apex has the zone's SOA and NS; a name below it
    /// exists when an indexed address lies under it (NODATA), else NXDOMAIN; both negative
    /// answers carry the zone's SOA. Names outside every served zone go upstream.
    fn reverse_partial(
        &self,
        name: &Name,
        qtype: RecordType,
        qclass: DNSClass,
    ) -> Option<Response> {
        let mut fqdn = name.clone();
        fqdn.set_fqdn(true);
        let net = fqdn.parse_arpa_name().ok()?;
        let step = if net.addr().is_ipv4() { 8 } else { 4 };
        // The served zone this name is at or under: a CIDR containing it, rounded to labels.
        let apex_len = self
            .config
            .reverse_cidrs
            .iter()
            .filter(|c| c.addr().is_ipv4() == net.addr().is_ipv4())
            .map(|c| (c, c.prefix_len().div_ceil(step) * step))
            .filter(|(c, apex)| net.prefix_len() >= *apex && c.contains(&net.addr()))
            .map(|(_, apex)| apex)
            .max()?;
        if !matches!(qclass, DNSClass::IN | DNSClass::ANY) {
            return Some(Response::empty(ResponseCode::Refused));
        }
        let apex = reverse_zone_of(net.addr(), apex_len);
        let mut response = Response::empty(ResponseCode::NoError);
        if net.prefix_len() == apex_len {
            (response.answers, response.additionals) = self.apex_records(name, qtype);
            if response.answers.is_empty() {
                response.authorities.push(self.soa_at(apex));
            }
            return Some(response);
        }
        let below = self
            .reverse
            .iter()
            .any(|shard| shard.keys().any(|ip| net.contains(ip)));
        if !below {
            response.rcode = ResponseCode::NXDomain;
        }
        response.authorities.push(self.soa_at(apex));
        Some(response)
    }

    /// The reverse zone an address belongs to, as CoreDNS serves a CIDR: the served range's
    /// prefix rounded up to a whole label (octets for IPv4, nibbles for IPv6), so 10.96.0.0/12
    /// is served as `96.10.in-addr.arpa.` … `111.10.in-addr.arpa.`. An indexed address outside
    /// every served range (an endpoint elsewhere) answers under `in-addr.arpa.`/`ip6.arpa.`.
    pub(super) fn reverse_zone(&self, ip: IpAddr) -> Name {
        let prefix = self
            .config
            .reverse_cidrs
            .iter()
            .filter(|c| c.contains(&ip))
            .map(|c| c.prefix_len())
            .max();
        match prefix {
            Some(prefix) => reverse_zone_of(ip, prefix),
            None => reverse_apex(ip),
        }
    }
}

/// `<labels of ip's first ⌈prefix/step⌉ labels>.in-addr.arpa.` (or `ip6.arpa.`).
pub(super) fn reverse_zone_of(ip: IpAddr, prefix: u8) -> Name {
    let full = reverse_name_labels(ip);
    let step = if ip.is_ipv4() { 8 } else { 4 };
    let keep = usize::from(prefix.div_ceil(step));
    // `full` is most significant last; keep the last `keep` labels.
    let labels = &full[full.len() - keep.min(full.len())..];
    let mut text = labels.join(".");
    if !text.is_empty() {
        text.push('.');
    }
    text.push_str(&reverse_apex(ip).to_ascii());
    Name::from_ascii(&text).unwrap_or_else(|_| reverse_apex(ip))
}

/// An address's reverse labels, least significant first (`10.96.0.1` → 1, 0, 96, 10).
fn reverse_name_labels(ip: IpAddr) -> Vec<String> {
    match ip {
        IpAddr::V4(v4) => v4.octets().iter().rev().map(|o| o.to_string()).collect(),
        IpAddr::V6(v6) => v6
            .octets()
            .iter()
            .rev()
            .flat_map(|b| [format!("{:x}", b & 0xf), format!("{:x}", b >> 4)])
            .collect(),
    }
}

/// `Records` when there are answers, else NODATA (the name exists: the caller checked).
fn records<M>(answers: Vec<Record>, additionals: Vec<Record>) -> Node<M> {
    if answers.is_empty() {
        Node::NoData
    } else {
        Node::Records {
            answers,
            additionals,
        }
    }
}

/// A and AAAA records for `ips` as `qtype` asks (`ANY` gives both families).
pub(super) fn address_records(
    owner: &Name,
    ips: &[IpAddr],
    qtype: RecordType,
    ttl: u32,
) -> Vec<Record> {
    let mut out = Vec::with_capacity(ips.len());
    out.extend(ips.iter().filter_map(|ip| match (ip, qtype) {
        (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => {
            Some(Record::from_rdata(owner.clone(), ttl, RData::A(A(*v4))))
        }
        (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => Some(Record::from_rdata(
            owner.clone(),
            ttl,
            RData::AAAA(AAAA(*v6)),
        )),
        _ => None,
    }));
    out
}

/// `<prefix>.<domain>`, falling back to the domain when the result would be too long.
fn prefixed(prefix: &str, domain: &Name) -> Name {
    Name::from_ascii(prefix)
        .and_then(|p| p.append_domain(domain))
        .unwrap_or_else(|_| domain.clone())
}
