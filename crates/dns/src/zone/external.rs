//! CoreDNS's `k8s_external` plugin: a service's external IPs and LoadBalancer ingress IPs
//! under an operator's zone, `<svc>.<ns>.<zone>`, so that clients outside the cluster (or
//! inside, by a public name) find what a LoadBalancer got.
//!
//! As CoreDNS answers it: the apex has an SOA (`ns1.<apex>.<zone>`,
//! `hostmaster.<apex>.<zone>`, serial of the cluster zone, minimum = the plugin's TTL) and an
//! NS `ns1.<apex>.<zone>` whose addresses are the DNS service's own external IPs;
//! `<apex>.<zone>` is an empty non-terminal; A and AAAA answer the service's addresses of that
//! family, SRV one record per port (`_<port>._<proto>.<svc>.<ns>.<zone>` for one named port)
//! targeting `<svc>.<ns>.<zone>` with the addresses as glue; a service without external
//! addresses, an unknown service, namespace or a longer name is NXDOMAIN, a namespace alone
//! NODATA, other types NODATA. Every answer carries the SOA of the external zone when it has
//! no records.

use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{NS, SOA, SRV};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::lookup::address_records;
use super::names::relative_labels;
use super::{ExternalZones, Response, Zone};

impl Zone {
    /// The answer for a name under an external zone; `None` for any other name.
    pub(super) fn external_lookup(
        &self,
        name: &Name,
        qtype: RecordType,
        qclass: DNSClass,
    ) -> Option<Response> {
        let external = self.config.external.as_ref()?;
        let (zone, labels) = external
            .zones
            .iter()
            .find_map(|z| relative_labels(name, z).map(|l| (z, l)))?;
        if !matches!(qclass, DNSClass::IN | DNSClass::ANY) {
            return Some(Response::empty(ResponseCode::Refused));
        }
        let labels: Vec<String> = labels.iter().rev().map(|l| l.to_string()).collect();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        let answer = Answer {
            zone: self,
            external,
            apex: zone,
            owner: name,
        };
        Some(match labels.as_slice() {
            [] => answer.apex(qtype),
            [sub, rest @ ..] if *sub == external.apex => answer.sub_apex(rest, qtype),
            [ns] => {
                if self.namespace_exists(ns) {
                    answer.nodata()
                } else {
                    answer.nxdomain()
                }
            }
            [ns, svc, rest @ ..] => answer.service(ns, svc, rest, qtype),
        })
    }
}

struct Answer<'a> {
    zone: &'a Zone,
    external: &'a ExternalZones,
    apex: &'a Name,
    owner: &'a Name,
}

impl Answer<'_> {
    fn soa(&self) -> Record {
        let ttl = self.external.ttl;
        let soa = SOA::new(
            self.prefixed(&["ns1", &self.external.apex]),
            self.prefixed(&["hostmaster", &self.external.apex]),
            self.zone.serial(),
            7200,
            1800,
            86400,
            ttl,
        );
        Record::from_rdata(self.apex.clone(), ttl, RData::SOA(soa))
    }

    /// `<labels>.<zone>`, the zone itself if it would not fit.
    fn prefixed(&self, labels: &[&str]) -> Name {
        Name::from_ascii(labels.join("."))
            .and_then(|p| p.append_domain(self.apex))
            .unwrap_or_else(|_| self.apex.clone())
    }

    fn nodata(&self) -> Response {
        let mut r = Response::empty(ResponseCode::NoError);
        r.authorities.push(self.soa());
        r
    }

    fn nxdomain(&self) -> Response {
        let mut r = Response::empty(ResponseCode::NXDomain);
        r.authorities.push(self.soa());
        r
    }

    /// The name server's addresses: the DNS service's external addresses.
    fn ns_addresses(&self) -> Vec<IpAddr> {
        let (ns, name) = &self.zone.config.dns_service;
        self.zone
            .service(ns, name)
            .map(|e| e.external_ips.clone())
            .unwrap_or_default()
    }

    fn apex(&self, qtype: RecordType) -> Response {
        let ttl = self.external.ttl;
        let mut r = Response::empty(ResponseCode::NoError);
        match qtype {
            RecordType::SOA => r.answers.push(self.soa()),
            RecordType::NS => {
                let ns = self.prefixed(&["ns1", &self.external.apex]);
                r.answers.push(Record::from_rdata(
                    self.apex.clone(),
                    ttl,
                    RData::NS(NS(ns.clone())),
                ));
                r.additionals = address_records(&ns, &self.ns_addresses(), RecordType::ANY, ttl);
            }
            _ => r.authorities.push(self.soa()),
        }
        r
    }

    /// `<apex>.<zone>` (an empty non-terminal) and `ns1.<apex>.<zone>`.
    fn sub_apex(&self, rest: &[&str], qtype: RecordType) -> Response {
        match rest {
            [] => self.nodata(),
            ["ns1"] => {
                let records =
                    address_records(self.owner, &self.ns_addresses(), qtype, self.external.ttl);
                if records.is_empty() {
                    return self.nodata();
                }
                let mut r = Response::empty(ResponseCode::NoError);
                r.answers = records;
                r
            }
            _ => self.nxdomain(),
        }
    }

    fn service(&self, ns: &str, svc: &str, rest: &[&str], qtype: RecordType) -> Response {
        if !self.zone.namespace_exists(ns) {
            return self.nxdomain();
        }
        let port = match rest {
            [] => None,
            [proto, port] => match (proto.strip_prefix('_'), port.strip_prefix('_')) {
                (Some(proto), Some(port)) => Some((port, proto)),
                _ => return self.nxdomain(),
            },
            _ => return self.nxdomain(),
        };
        let Some(entry) = self.zone.service(ns, svc) else {
            return self.nxdomain();
        };
        let ports: Vec<_> = entry
            .ports
            .iter()
            .filter(|p| port.is_none_or(|(name, proto)| p.name == name && p.protocol == proto))
            .collect();
        if entry.external_ips.is_empty() || ports.is_empty() {
            return self.nxdomain();
        }
        let ttl = self.external.ttl;
        let mut r = Response::empty(ResponseCode::NoError);
        match qtype {
            RecordType::A | RecordType::AAAA if port.is_none() => {
                r.answers = address_records(self.owner, &entry.external_ips, qtype, ttl);
            }
            RecordType::SRV => {
                let target = self.prefixed(&[svc, ns]);
                let weight = 100 / (entry.external_ips.len() * ports.len()).max(1);
                let weight = u16::try_from(weight).unwrap_or(1).max(1);
                let mut seen: Vec<u16> = Vec::new();
                for p in ports {
                    if seen.contains(&p.port) {
                        continue;
                    }
                    seen.push(p.port);
                    // CoreDNS gives the SRV records the kubernetes plugin's TTL.
                    r.answers.push(Record::from_rdata(
                        self.owner.clone(),
                        self.zone.config.ttl,
                        RData::SRV(SRV::new(0, weight, p.port, target.clone())),
                    ));
                }
                r.additionals = address_records(&target, &entry.external_ips, RecordType::ANY, ttl);
            }
            _ => {}
        }
        if r.answers.is_empty() {
            r.authorities.push(self.soa());
        }
        r
    }
}
