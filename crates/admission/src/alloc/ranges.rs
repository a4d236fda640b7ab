//! The stored form of the allocators: one `RangeAllocation` object per range, as
//! kube-apiserver keeps them (`/registry/ranges/serviceips`, `secondaryserviceips`,
//! `servicenodeports`), so that every API server on one store allocates from the same state.
//!
//! An object is `{"apiVersion": "v1", "kind": "RangeAllocation", "metadata": {"name"},
//! "range", "data"}` where `data` is upstream's bitmap: the base64 of a big-endian integer
//! whose bit *i* says whether offset *i* is taken (offset 0 is the first usable address of a
//! CIDR, or the first port of the node-port range). Node ports are unique per protocol here, so
//! their object also carries one bitmap per protocol in `protocols`; `data` is their union,
//! which is what kube-apiserver would read. The load-balancer pool, svcnet's own, is stored
//! the same way under `svcnet-loadbalancerips`.
//!
//! Stored allocations carry no owner: loading marks them held by nobody in particular, and a
//! service about to be written [`adopt`](Allocators::adopt)s what it holds, so admission may
//! keep or release exactly that.

use std::collections::BTreeSet;
use std::net::IpAddr;

use base64::Engine;
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use super::{Allocators, IpRange, Owner, Protocol, to_u128};

/// The range of the primary family's cluster IPs.
pub const SERVICE_IPS: &str = "serviceips";
/// The range of the secondary family's cluster IPs (dual-stack).
pub const SECONDARY_SERVICE_IPS: &str = "secondaryserviceips";
/// The node-port range.
pub const NODE_PORTS: &str = "servicenodeports";
/// svcnet's load-balancer pool.
pub const LB_IPS: &str = "svcnet-loadbalancerips";

/// The owner stored allocations are loaded with: no service's `namespace/name`.
const NOBODY: &str = "";

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// One thing a service holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Allocation {
    ClusterIp(IpAddr),
    NodePort(u16, Protocol),
    LbIp(IpAddr),
}

impl std::fmt::Display for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Allocation::ClusterIp(ip) => write!(f, "cluster IP {ip}"),
            Allocation::NodePort(p, proto) => write!(f, "node port {p}/{}", proto.as_str()),
            Allocation::LbIp(ip) => write!(f, "load-balancer IP {ip}"),
        }
    }
}

/// A stored range object that does not fit this configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("range allocation {name}: {reason}")]
pub struct StoredRangeError {
    pub name: String,
    pub reason: String,
}

fn encode_bits(offsets: impl IntoIterator<Item = u64>) -> String {
    let offsets: Vec<u64> = offsets.into_iter().collect();
    let Some(max) = offsets.iter().max() else {
        return String::new();
    };
    let len = usize::try_from(max / 8 + 1).unwrap_or(usize::MAX);
    let mut bytes = vec![0u8; len];
    for o in offsets {
        if let Ok(i) = usize::try_from(o / 8) {
            bytes[len - 1 - i] |= 1 << (o % 8);
        }
    }
    B64.encode(bytes)
}

fn decode_bits(data: &str) -> Result<Vec<u64>, String> {
    let bytes = B64
        .decode(data)
        .map_err(|e| format!("data is not base64: {e}"))?;
    let mut offsets = Vec::new();
    for (i, b) in bytes.iter().rev().enumerate() {
        for bit in 0..8 {
            if b & (1 << bit) != 0 {
                offsets.push(i as u64 * 8 + bit);
            }
        }
    }
    Ok(offsets)
}

impl IpRange {
    fn offsets(&self) -> impl Iterator<Item = u64> + '_ {
        self.allocated
            .keys()
            .map(|v| u64::try_from(v - self.first).unwrap_or(u64::MAX))
    }

    fn load(&mut self, offsets: &[u64]) -> Result<(), String> {
        let nobody = Owner::from(NOBODY);
        for o in offsets {
            let v = self
                .first
                .checked_add(u128::from(*o))
                .filter(|v| *v <= self.last)
                .ok_or_else(|| format!("offset {o} is outside {}", self.cidr))?;
            self.allocated.entry(v).or_insert_with(|| nobody.clone());
        }
        Ok(())
    }
}

impl Allocators {
    /// The same configuration with nothing allocated.
    pub fn empty(&self) -> Allocators {
        let mut a = self.clone();
        a.clear();
        a
    }

    /// The names of the ranges this configuration stores, in a fixed order.
    pub fn range_names(&self) -> Vec<&'static str> {
        let mut names = vec![SERVICE_IPS];
        if self.ranges.len() > 1 {
            names.push(SECONDARY_SERVICE_IPS);
        }
        names.push(NODE_PORTS);
        if self.lb.is_some() {
            names.push(LB_IPS);
        }
        names
    }

    /// The range an allocation is stored in.
    pub fn range_of(&self, a: &Allocation) -> Option<&'static str> {
        match a {
            Allocation::ClusterIp(ip) => match self.ranges.iter().position(|r| r.contains(*ip)) {
                Some(0) => Some(SERVICE_IPS),
                Some(_) => Some(SECONDARY_SERVICE_IPS),
                None => None,
            },
            Allocation::NodePort(..) => Some(NODE_PORTS),
            Allocation::LbIp(_) => self.lb.as_ref().map(|_| LB_IPS),
        }
    }

    /// Everything allocated, owners aside.
    pub fn allocations(&self) -> BTreeSet<Allocation> {
        let addresses = |r: &IpRange| r.allocated.keys().map(|v| r.to_ip(*v)).collect::<Vec<_>>();
        let mut all: BTreeSet<Allocation> = self
            .ranges
            .iter()
            .flat_map(addresses)
            .map(Allocation::ClusterIp)
            .collect();
        all.extend(
            self.node_ports
                .keys()
                .map(|(p, proto)| Allocation::NodePort(*p, *proto)),
        );
        all.extend(self.lb.iter().flat_map(addresses).map(Allocation::LbIp));
        all
    }

    fn ip_range_mut(&mut self, name: &str) -> Option<&mut IpRange> {
        match name {
            SERVICE_IPS => self.ranges.first_mut(),
            SECONDARY_SERVICE_IPS => self.ranges.get_mut(1),
            LB_IPS => self.lb.as_mut(),
            _ => None,
        }
    }

    fn ip_range(&self, name: &str) -> Option<&IpRange> {
        match name {
            SERVICE_IPS => self.ranges.first(),
            SECONDARY_SERVICE_IPS => self.ranges.get(1),
            LB_IPS => self.lb.as_ref(),
            _ => None,
        }
    }

    fn range_text(&self, name: &str) -> Option<String> {
        match name {
            NODE_PORTS => Some(self.port_range_text()),
            other => self.ip_range(other).map(|r| r.cidr.to_string()),
        }
    }

    /// Adds the allocations of a stored range object (held by nobody in particular). An
    /// object for another range (the configuration changed) is refused.
    pub fn load_range(&mut self, name: &str, obj: &Value) -> Result<(), StoredRangeError> {
        let err = |reason: String| StoredRangeError {
            name: name.to_string(),
            reason,
        };
        let expected = self
            .range_text(name)
            .ok_or_else(|| err("not a range of this configuration".into()))?;
        let stored = obj.get("range").and_then(Value::as_str).unwrap_or("");
        if stored != expected {
            return Err(err(format!(
                "it records the range {stored:?}, this server is configured with {expected:?}"
            )));
        }
        let bits = |v: Option<&Value>| decode_bits(v.and_then(Value::as_str).unwrap_or(""));
        if name == NODE_PORTS {
            let nobody = Owner::from(NOBODY);
            let start = *self.cfg.node_port_range.start();
            let protocols = obj.get("protocols").and_then(Value::as_object);
            for proto in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                // An object kube-apiserver wrote has only `data`: its ports count as TCP.
                let offsets = match protocols {
                    Some(p) => bits(p.get(proto.as_str())).map_err(err)?,
                    None if proto == Protocol::Tcp => bits(obj.get("data")).map_err(err)?,
                    None => Vec::new(),
                };
                for o in offsets {
                    let port = u16::try_from(u64::from(start) + o)
                        .ok()
                        .filter(|p| self.cfg.node_port_range.contains(p))
                        .ok_or_else(|| err(format!("offset {o} is outside the range")))?;
                    self.node_ports
                        .entry((port, proto))
                        .or_insert_with(|| nobody.clone());
                }
            }
            return Ok(());
        }
        let offsets = bits(obj.get("data")).map_err(err)?;
        let range = self
            .ip_range_mut(name)
            .ok_or_else(|| err("not a range of this configuration".into()))?;
        range.load(&offsets).map_err(err)
    }

    /// The stored object of one range.
    pub fn range_object(&self, name: &str) -> Result<Value, StoredRangeError> {
        let range = self.range_text(name).ok_or_else(|| StoredRangeError {
            name: name.to_string(),
            reason: "not a range of this configuration".into(),
        })?;
        let mut obj = json!({
            "apiVersion": "v1",
            "kind": "RangeAllocation",
            "metadata": {"name": name},
            "range": range,
        });
        if name == NODE_PORTS {
            let start = u64::from(*self.cfg.node_port_range.start());
            let offsets = |want: Option<Protocol>| {
                self.node_ports
                    .keys()
                    .filter(move |(_, proto)| want.is_none_or(|w| w == *proto))
                    .map(move |(p, _)| u64::from(*p) - start)
                    .collect::<BTreeSet<u64>>()
            };
            obj["data"] = json!(encode_bits(offsets(None)));
            let mut protocols = serde_json::Map::new();
            for proto in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                let bits = encode_bits(offsets(Some(proto)));
                if !bits.is_empty() {
                    protocols.insert(proto.as_str().into(), json!(bits));
                }
            }
            obj["protocols"] = Value::Object(protocols);
        } else if let Some(r) = self.ip_range(name) {
            obj["data"] = json!(encode_bits(r.offsets()));
        }
        Ok(obj)
    }

    /// Marks what `service` holds as its own, so admission can keep or release it; an
    /// allocation the stored ranges lost is recorded again.
    pub fn adopt(&mut self, service: &Value) {
        let Some((owner, held)) = held_by(service) else {
            return;
        };
        for a in held {
            self.set_owner(a, &owner);
        }
    }

    fn set_owner(&mut self, a: Allocation, owner: &str) {
        match a {
            Allocation::ClusterIp(ip) => {
                if let Some(r) = self.ranges.iter_mut().find(|r| r.contains(ip)) {
                    r.allocated.insert(to_u128(ip), Owner::from(owner));
                }
            }
            Allocation::NodePort(p, proto) => {
                if self.cfg.node_port_range.contains(&p) {
                    self.node_ports.insert((p, proto), Owner::from(owner));
                }
            }
            Allocation::LbIp(ip) => {
                if let Some(r) = self.lb.as_mut().filter(|r| r.contains(ip)) {
                    r.allocated.insert(to_u128(ip), Owner::from(owner));
                }
            }
        }
    }

    /// What a stored service holds, as recorded in its spec and status.
    pub fn allocations_of(&self, service: &Value) -> BTreeSet<Allocation> {
        held_by(service).map(|(_, h)| h).unwrap_or_default()
    }

    /// Applies a change to a loaded state: every addition must be free (the allocation that is
    /// not is returned: someone else took it since), removals always succeed.
    pub fn apply(&mut self, add: &[Allocation], remove: &[Allocation]) -> Result<(), Allocation> {
        let held = self.allocations();
        if let Some(taken) = add.iter().find(|a| held.contains(a)) {
            return Err(*taken);
        }
        for a in add {
            self.set_owner(*a, NOBODY);
        }
        for a in remove {
            match *a {
                Allocation::ClusterIp(ip) => {
                    for r in &mut self.ranges {
                        r.allocated.remove(&to_u128(ip));
                    }
                }
                Allocation::NodePort(p, proto) => {
                    self.node_ports.remove(&(p, proto));
                }
                Allocation::LbIp(ip) => {
                    if let Some(r) = self.lb.as_mut() {
                        r.allocated.remove(&to_u128(ip));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The owner key and the allocations a stored service records.
fn held_by(service: &Value) -> Option<(String, BTreeSet<Allocation>)> {
    let svc: Service = crate::codec::decode(service.clone()).ok()?;
    let owner = crate::codec::owner_key(&svc.metadata);
    let spec = svc.spec.as_ref()?;
    let mut held = BTreeSet::new();
    use crate::service::allocate as h;
    held.extend(h::ips_of(spec).into_iter().map(Allocation::ClusterIp));
    held.extend(
        h::node_ports_of(spec)
            .into_iter()
            .map(|(p, proto)| Allocation::NodePort(p, proto)),
    );
    if let Some(p) = h::hc_of(spec) {
        held.insert(Allocation::NodePort(p, Protocol::Tcp));
    }
    if h::served_by_svcnet(spec) {
        held.extend(
            h::lb_ips_of(svc.status.as_ref())
                .into_iter()
                .map(Allocation::LbIp),
        );
    }
    Some((owner, held))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AdmissionConfig;

    #[test]
    fn bitmaps_use_upstreams_big_endian_encoding() {
        // Offsets 0 and 9: bytes [0b10, 0b1] (the big integer 2^9 + 2^0).
        assert_eq!(encode_bits([0, 9]), B64.encode([0b10u8, 0b1]));
        assert_eq!(decode_bits(&encode_bits([0, 9, 255])).unwrap(), [0, 9, 255]);
        assert_eq!(encode_bits([]), "");
        assert!(decode_bits("").unwrap().is_empty());
        assert!(decode_bits("!").is_err());
    }

    #[test]
    fn ranges_round_trip_and_refuse_a_changed_configuration() {
        let mut a = Allocators::new(AdmissionConfig::default()).unwrap();
        a.allocate_next_ip("IPv4", "ns/a").unwrap();
        a.allocate_ip("10.96.0.1".parse().unwrap(), "default/kubernetes")
            .unwrap();
        a.allocate_port(30001, Protocol::Udp, "ns/a").unwrap();
        a.allocate_next_port(&[Protocol::Tcp], "ns/b").unwrap();
        a.allocate_lb(None, "ns/c").unwrap();
        let mut b = a.empty();
        for name in a.range_names() {
            let obj = a.range_object(name).unwrap();
            b.load_range(name, &obj).unwrap();
        }
        assert_eq!(a.allocations(), b.allocations());
        let ips = a.range_object(SERVICE_IPS).unwrap();
        assert_eq!(ips["range"], "10.96.0.0/12");
        // 10.96.0.1 is offset 0, 10.96.1.0 offset 255.
        assert_eq!(
            decode_bits(ips["data"].as_str().unwrap()).unwrap(),
            [0, 255]
        );
        let mut other = Allocators::new(AdmissionConfig {
            service_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
            ..Default::default()
        })
        .unwrap();
        let e = other.load_range(SERVICE_IPS, &ips).unwrap_err();
        assert_eq!(
            e.to_string(),
            "range allocation serviceips: it records the range \"10.96.0.0/12\", \
             this server is configured with \"10.0.0.0/16\""
        );
    }

    #[test]
    fn apply_refuses_what_is_taken_and_adopt_claims_a_services_holdings() {
        let mut a = Allocators::new(AdmissionConfig::default()).unwrap();
        let ip = Allocation::ClusterIp("10.96.1.0".parse().unwrap());
        let port = Allocation::NodePort(30100, Protocol::Tcp);
        a.apply(&[ip, port], &[]).unwrap();
        assert_eq!(a.apply(&[port], &[]), Err(port));
        a.apply(&[], &[port]).unwrap();
        assert_eq!(a.allocations(), BTreeSet::from([ip]));
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.1.0", "clusterIPs": ["10.96.1.0"],
                     "ports": [{"port": 80, "nodePort": 30100}]}});
        assert_eq!(a.allocations_of(&svc), BTreeSet::from([ip, port]));
        a.adopt(&svc);
        assert_eq!(
            a.cluster_ip_owner("10.96.1.0".parse().unwrap()),
            Some("ns/a")
        );
        assert!(a.allocations().contains(&port));
    }
}
