//! The allocators for cluster IPs, node ports and load-balancer IPs.
//!
//! Every allocation records its owner (`namespace/name` of the service), so
//! a release can only free what that service holds: a stale or duplicated
//! object can never free another service's address. The allocators are plain
//! values (`Clone + Eq`): admission takes a snapshot before a Service write
//! and puts it back when the write is refused, so a failed create or update
//! leaves them exactly as they were. They hold no I/O; the API server
//! persists the services and calls [`Allocators::rebuild`] from them.
//!
//! Dynamic cluster IPs are handed out by a sequential scan that starts in the
//! upper part of the range and wraps to the lower part, like upstream's
//! `ServiceIPStaticSubrange` (the lower band, 16–256 addresses, is left for
//! users who request a fixed IP). The first usable address (`.1`, the
//! `kubernetes` service) and `reserved_ips` (cluster DNS) are only given to
//! services that ask for them explicitly. Node ports follow the same scheme
//! over the node-port range (a lower band of 16–128 ports).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;

use ipnet::IpNet;

use crate::error::ConfigError;

mod ranges;

pub use ranges::{
    Allocation, LB_IPS, NODE_PORTS, SECONDARY_SERVICE_IPS, SERVICE_IPS, StoredRangeError,
};

/// The most addresses a service CIDR or the LB pool may hold: its allocations are stored as
/// one bitmap (upstream's limit: an IPv6 service range needs a prefix of at least /108).
pub const MAX_RANGE_BITS: u32 = 20;

/// Where services get their addresses from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// One CIDR per IP family; the first is the primary family.
    pub service_cidrs: Vec<IpNet>,
    pub node_port_range: RangeInclusive<u16>,
    /// The pool svcnet's built-in load-balancer controller takes ingress IPs
    /// from (`None`: LoadBalancer services stay pending, as on a cluster
    /// without a cloud provider).
    pub lb_pool: Option<IpNet>,
    /// Addresses inside the service CIDRs that are never handed out
    /// dynamically (the cluster DNS service IP); a service may still request
    /// them explicitly.
    pub reserved_ips: Vec<IpAddr>,
}

/// The default load-balancer pool: 10.200.0.0/24, a range svcnet owns and
/// routes only into its own namespaces.
pub const DEFAULT_LB_POOL: &str = "10.200.0.0/24";
/// The default service CIDR, Kubernetes' own.
pub const DEFAULT_SERVICE_CIDR: &str = "10.96.0.0/12";
/// The cluster DNS service IP, reserved by default.
pub const DEFAULT_DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            service_cidrs: vec![IpNet::V4(ipnet::Ipv4Net::new_assert(
                Ipv4Addr::new(10, 96, 0, 0),
                12,
            ))],
            node_port_range: 30000..=32767,
            lb_pool: Some(IpNet::V4(ipnet::Ipv4Net::new_assert(
                Ipv4Addr::new(10, 200, 0, 0),
                24,
            ))),
            reserved_ips: vec![IpAddr::V4(DEFAULT_DNS_IP)],
        }
    }
}

/// IP family of an address, spelled as in the API.
pub fn family_of(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// Node-port protocols, ordered so they can key a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

/// Why one allocation failed; the `Display` text is upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("the provided IP ({ip}) is not in the valid range. The range of valid IPs is {range}")]
    IpNotInRange { ip: IpAddr, range: String },
    #[error("provided IP is already allocated")]
    IpAllocated,
    #[error("provided port is not in the valid range. The range of valid ports is {range}")]
    PortNotInRange { range: String },
    #[error("provided port is already allocated")]
    PortAllocated,
    #[error("range is full")]
    Full,
}

/// How far past the first free address or port a seeded scan may start.
const SCAN_WINDOW: u16 = 256;

/// [`ConfigError::CidrTooLarge`] for a range whose bitmap would exceed [`MAX_RANGE_BITS`].
fn check_size(cidr: IpNet) -> Result<(), ConfigError> {
    let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
    if host_bits > MAX_RANGE_BITS {
        return Err(ConfigError::CidrTooLarge {
            cidr,
            min_prefix: cidr.max_prefix_len() - MAX_RANGE_BITS as u8,
        });
    }
    Ok(())
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// Who holds an allocation (`namespace/name`, or [`ranges`]' nobody for one loaded from a stored
/// range): shared, so that copying the allocators (admission works on a copy per write) and
/// loading a range of thousands of allocations copy pointers, not strings.
pub(crate) type Owner = std::sync::Arc<str>;

/// One contiguous range of addresses (a service CIDR or the LB pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IpRange {
    cidr: IpNet,
    first: u128,
    last: u128,
    /// Dynamic allocation starts here and wraps around to `first`.
    dynamic_start: u128,
    /// Given only on explicit request.
    reserved: BTreeSet<u128>,
    allocated: BTreeMap<u128, Owner>,
}

impl IpRange {
    fn new(cidr: IpNet, static_band: bool) -> Option<Self> {
        let net = to_u128(cidr.network());
        let bcast = to_u128(cidr.broadcast());
        let (first, last) = match cidr {
            // The network and broadcast addresses are never usable.
            IpNet::V4(_) => (net.checked_add(1)?, bcast.checked_sub(1)?),
            // IPv6 has no broadcast; only the subnet-router anycast address is skipped.
            IpNet::V6(_) => (net.checked_add(1)?, bcast),
        };
        if first > last {
            return None;
        }
        let size = bcast - net + 1;
        let offset = if !static_band || size <= 16 {
            0
        } else {
            (size / 16).clamp(16, 256)
        };
        let dynamic_start = (net + offset).clamp(first, last);
        Some(Self {
            cidr,
            first,
            last,
            dynamic_start,
            reserved: BTreeSet::new(),
            allocated: BTreeMap::new(),
        })
    }

    fn to_ip(&self, v: u128) -> IpAddr {
        match self.cidr {
            IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(v as u32)),
            IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(v)),
        }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(&ip) && (self.first..=self.last).contains(&to_u128(ip))
    }

    fn allocate(&mut self, ip: IpAddr, owner: &str) -> Result<(), AllocError> {
        if !self.contains(ip) {
            return Err(AllocError::IpNotInRange {
                ip,
                range: self.cidr.to_string(),
            });
        }
        let v = to_u128(ip);
        match self.allocated.get(&v) {
            Some(o) if **o == *owner => Ok(()),
            Some(_) => Err(AllocError::IpAllocated),
            None => {
                self.allocated.insert(v, Owner::from(owner));
                Ok(())
            }
        }
    }

    /// The first address from `lo` to `hi` that is neither allocated nor reserved: the
    /// allocated ones are walked in order alongside (a step each, not a lookup each).
    fn free_in(&self, lo: u128, hi: u128) -> Option<u128> {
        if lo > hi {
            return None;
        }
        let mut taken = self.allocated.range(lo..=hi).map(|(v, _)| *v).peekable();
        let mut c = lo;
        loop {
            if taken.next_if_eq(&c).is_none() && !self.reserved.contains(&c) {
                return Some(c);
            }
            if c == hi {
                return None;
            }
            c += 1;
        }
    }

    fn allocate_next(&mut self, owner: &str, seed: Option<u64>) -> Result<IpAddr, AllocError> {
        // Without a seed the upper band is scanned from its start; with one, from a point the
        // seed picks in the window past its first free address (then wrapping), which spreads
        // concurrent writers while the stored bitmap stays short.
        let from = match (seed, self.free_in(self.dynamic_start, self.last)) {
            (Some(s), Some(first_free)) => {
                (first_free + u128::from(s) % u128::from(SCAN_WINDOW)).min(self.last)
            }
            _ => self.dynamic_start,
        };
        let found = self
            .free_in(from, self.last)
            .or_else(|| {
                (from > self.dynamic_start)
                    .then(|| self.free_in(self.dynamic_start, from - 1))
                    .flatten()
            })
            .or_else(|| {
                if self.dynamic_start > self.first {
                    self.free_in(self.first, self.dynamic_start - 1)
                } else {
                    None
                }
            });
        let v = found.ok_or(AllocError::Full)?;
        self.allocated.insert(v, Owner::from(owner));
        Ok(self.to_ip(v))
    }

    fn release(&mut self, ip: IpAddr, owner: &str) -> bool {
        let v = to_u128(ip);
        if self.allocated.get(&v).is_some_and(|o| **o == *owner) {
            self.allocated.remove(&v);
            true
        } else {
            false
        }
    }

    fn owner(&self, ip: IpAddr) -> Option<&str> {
        if !self.cidr.contains(&ip) {
            return None;
        }
        self.allocated.get(&to_u128(ip)).map(|o| &**o)
    }
}

/// All allocation state of the cluster: cluster IPs, node ports (unique per
/// protocol) and load-balancer ingress IPs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocators {
    cfg: AdmissionConfig,
    ranges: Vec<IpRange>,
    node_ports: BTreeMap<(u16, Protocol), Owner>,
    node_port_dynamic_start: u16,
    lb: Option<IpRange>,
    /// Where dynamic allocation starts scanning (see [`Allocators::scan_from`]).
    seed: Option<u64>,
}

impl Allocators {
    /// Whether every service CIDR is loopback (the unprivileged development mode): then
    /// endpoints on loopback are allowed too.
    pub fn loopback_services(&self) -> bool {
        self.cfg
            .service_cidrs
            .iter()
            .all(|c| c.addr().is_loopback())
    }

    pub fn new(cfg: AdmissionConfig) -> Result<Self, ConfigError> {
        if cfg.service_cidrs.is_empty() {
            return Err(ConfigError::NoServiceCidr);
        }
        let mut ranges: Vec<IpRange> = Vec::new();
        for cidr in &cfg.service_cidrs {
            let cidr = cidr.trunc();
            if let Some(other) = ranges
                .iter()
                .find(|r| r.cidr.network().is_ipv4() == cidr.network().is_ipv4())
            {
                return Err(ConfigError::DuplicateFamily(other.cidr, cidr));
            }
            check_size(cidr)?;
            let mut r = IpRange::new(cidr, true).ok_or(ConfigError::CidrTooSmall(cidr))?;
            if r.last == r.first {
                return Err(ConfigError::CidrTooSmall(cidr));
            }
            // The first address belongs to the `kubernetes` service.
            r.reserved.insert(r.first);
            for ip in &cfg.reserved_ips {
                if r.contains(*ip) {
                    r.reserved.insert(to_u128(*ip));
                }
            }
            ranges.push(r);
        }
        let (start, end) = (*cfg.node_port_range.start(), *cfg.node_port_range.end());
        if start == 0 || start > end {
            return Err(ConfigError::BadNodePortRange { start, end });
        }
        let size = u32::from(end) - u32::from(start) + 1;
        let offset = if size <= 16 {
            0
        } else {
            (size / 32).clamp(16, 128)
        };
        let node_port_dynamic_start = (u32::from(start) + offset).min(u32::from(end)) as u16;
        let lb = match cfg.lb_pool {
            None => None,
            Some(pool) => {
                let pool = pool.trunc();
                if let Some(r) = ranges
                    .iter()
                    .find(|r| r.cidr.contains(&pool.network()) || pool.contains(&r.cidr.network()))
                {
                    return Err(ConfigError::LbPoolOverlapsServiceCidr { pool, cidr: r.cidr });
                }
                check_size(pool)?;
                Some(IpRange::new(pool, false).ok_or(ConfigError::LbPoolTooSmall(pool))?)
            }
        };
        Ok(Self {
            cfg,
            ranges,
            node_ports: BTreeMap::new(),
            node_port_dynamic_start,
            lb,
            seed: None,
        })
    }

    /// Dynamic allocation scans from a point that `seed` picks within a window past the first
    /// free address or port instead of from that address (upstream scans from a random point
    /// of the whole range). An API server sets a random seed when a write lost a race for an
    /// address to another server, so that servers writing at once stop reaching for the same
    /// next free one; alone, a server keeps the predictable order.
    pub fn scan_from(&mut self, seed: u64) {
        self.seed = Some(seed);
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.cfg
    }

    /// The configured families, primary first (`"IPv4"`, `"IPv6"`).
    pub fn families(&self) -> Vec<&'static str> {
        self.ranges
            .iter()
            .map(|r| family_of(r.cidr.network()))
            .collect()
    }

    pub fn primary_family(&self) -> &'static str {
        self.families()[0]
    }

    pub fn is_dual_stack(&self) -> bool {
        self.ranges.len() > 1
    }

    /// Every allocated cluster IP with its owner (`namespace/name`).
    pub fn cluster_ips(&self) -> Vec<(IpAddr, String)> {
        self.ranges
            .iter()
            .flat_map(|r| {
                r.allocated
                    .iter()
                    .map(|(v, o)| (r.to_ip(*v), o.to_string()))
            })
            .collect()
    }

    /// Every allocated node port (including health-check node ports, as TCP).
    pub fn node_ports(&self) -> Vec<(u16, Protocol, String)> {
        self.node_ports
            .iter()
            .map(|((p, proto), o)| (*p, *proto, o.to_string()))
            .collect()
    }

    /// Every load-balancer ingress IP handed out.
    pub fn lb_ips(&self) -> Vec<(IpAddr, String)> {
        self.lb
            .iter()
            .flat_map(|r| {
                r.allocated
                    .iter()
                    .map(|(v, o)| (r.to_ip(*v), o.to_string()))
            })
            .collect()
    }

    /// Who holds this cluster IP, if anyone.
    pub fn cluster_ip_owner(&self, ip: IpAddr) -> Option<&str> {
        self.ranges.iter().find_map(|r| r.owner(ip))
    }

    fn range_for_family(&mut self, family: &str) -> Option<&mut IpRange> {
        self.ranges
            .iter_mut()
            .find(|r| family_of(r.cidr.network()) == family)
    }

    pub(crate) fn allocate_ip(&mut self, ip: IpAddr, owner: &str) -> Result<(), AllocError> {
        let range_text = self
            .ranges
            .iter()
            .map(|r| r.cidr.to_string())
            .collect::<Vec<_>>()
            .join(",");
        match self.ranges.iter_mut().find(|r| r.cidr.contains(&ip)) {
            Some(r) => r.allocate(ip, owner),
            None => Err(AllocError::IpNotInRange {
                ip,
                range: range_text,
            }),
        }
    }

    pub(crate) fn allocate_next_ip(
        &mut self,
        family: &str,
        owner: &str,
    ) -> Result<IpAddr, AllocError> {
        let seed = self.seed;
        self.range_for_family(family)
            .ok_or(AllocError::Full)?
            .allocate_next(owner, seed)
    }

    pub(crate) fn release_ip(&mut self, ip: IpAddr, owner: &str) {
        for r in &mut self.ranges {
            r.release(ip, owner);
        }
    }

    fn port_range_text(&self) -> String {
        format!(
            "{}-{}",
            self.cfg.node_port_range.start(),
            self.cfg.node_port_range.end()
        )
    }

    pub(crate) fn allocate_port(
        &mut self,
        port: u16,
        proto: Protocol,
        owner: &str,
    ) -> Result<(), AllocError> {
        if !self.cfg.node_port_range.contains(&port) {
            return Err(AllocError::PortNotInRange {
                range: self.port_range_text(),
            });
        }
        match self.node_ports.get(&(port, proto)) {
            Some(o) if **o == *owner => Ok(()),
            Some(_) => Err(AllocError::PortAllocated),
            None => {
                self.node_ports.insert((port, proto), Owner::from(owner));
                Ok(())
            }
        }
    }

    /// A port free for every protocol in `protos` (ports of one service that
    /// share a port number share their node port, as upstream does).
    pub(crate) fn allocate_next_port(
        &mut self,
        protos: &[Protocol],
        owner: &str,
    ) -> Result<u16, AllocError> {
        let (start, end) = (
            *self.cfg.node_port_range.start(),
            *self.cfg.node_port_range.end(),
        );
        // Prefer a port no protocol uses, so automatic node ports never
        // share a number across protocols; only when none is left take one
        // that is free for the protocols asked for.
        let all = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
        let free_for = |p: u16, protos: &[Protocol]| {
            protos
                .iter()
                .all(|proto| !self.node_ports.contains_key(&(p, *proto)))
        };
        let first_free = (self.node_port_dynamic_start..=end).find(|p| free_for(*p, &all));
        let from = match (self.seed, first_free) {
            (Some(s), Some(p)) => {
                u16::try_from(u64::from(p) + s % u64::from(SCAN_WINDOW)).map_or(end, |f| f.min(end))
            }
            _ => self.node_port_dynamic_start,
        };
        let order = || {
            (from..=end)
                .chain(self.node_port_dynamic_start..from)
                .chain(start..self.node_port_dynamic_start)
        };
        let found = order()
            .find(|p| free_for(*p, &all))
            .or_else(|| order().find(|p| free_for(*p, protos)))
            .ok_or(AllocError::Full)?;
        for proto in protos {
            self.node_ports.insert((found, *proto), Owner::from(owner));
        }
        Ok(found)
    }

    pub(crate) fn release_port(&mut self, port: u16, proto: Protocol, owner: &str) {
        if self
            .node_ports
            .get(&(port, proto))
            .is_some_and(|o| **o == *owner)
        {
            self.node_ports.remove(&(port, proto));
        }
    }

    pub(crate) fn has_lb_pool(&self) -> bool {
        self.lb.is_some()
    }

    pub(crate) fn lb_owner(&self, ip: IpAddr) -> Option<&str> {
        self.lb.as_ref().and_then(|r| r.owner(ip))
    }

    pub(crate) fn allocate_lb(&mut self, requested: Option<IpAddr>, owner: &str) -> Option<IpAddr> {
        let r = self.lb.as_mut()?;
        match requested {
            Some(ip) => r.allocate(ip, owner).ok().map(|()| ip),
            None => r.allocate_next(owner, None).ok(),
        }
    }

    pub(crate) fn release_lb(&mut self, ip: IpAddr, owner: &str) {
        if let Some(r) = self.lb.as_mut() {
            r.release(ip, owner);
        }
    }

    /// Forget every allocation (the start of a rebuild).
    pub(crate) fn clear(&mut self) {
        for r in &mut self.ranges {
            r.allocated.clear();
        }
        self.node_ports.clear();
        if let Some(r) = self.lb.as_mut() {
            r.allocated.clear();
        }
    }

    /// Record an existing allocation during a rebuild; returns who already
    /// held it when it is taken, or why it cannot be recorded.
    pub(crate) fn restore_ip(&mut self, ip: IpAddr, owner: &str) -> Result<(), String> {
        if let Some(o) = self.cluster_ip_owner(ip)
            && o != owner
        {
            return Err(format!("cluster IP {ip} is already allocated to {o}"));
        }
        self.allocate_ip(ip, owner)
            .map_err(|e| format!("cluster IP {ip}: {e}"))
    }

    pub(crate) fn restore_port(
        &mut self,
        port: u16,
        proto: Protocol,
        owner: &str,
    ) -> Result<(), String> {
        if let Some(o) = self.node_ports.get(&(port, proto))
            && **o != *owner
        {
            return Err(format!(
                "node port {port}/{} is already allocated to {o}",
                proto.as_str()
            ));
        }
        self.allocate_port(port, proto, owner)
            .map_err(|e| format!("node port {port}/{}: {e}", proto.as_str()))
    }

    pub(crate) fn restore_lb(&mut self, ip: IpAddr, owner: &str) -> Result<(), String> {
        let Some(r) = self.lb.as_mut() else {
            return Ok(());
        };
        if !r.contains(ip) {
            // Not ours (an ingress another controller wrote): nothing to track.
            return Ok(());
        }
        if let Some(o) = r.owner(ip)
            && o != owner
        {
            return Err(format!("load-balancer IP {ip} is already allocated to {o}"));
        }
        r.allocate(ip, owner)
            .map_err(|e| format!("load-balancer IP {ip}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_free_address_skips_allocated_and_reserved_ones() {
        let mut r = IpRange::new("10.0.0.0/28".parse().unwrap(), false).unwrap();
        for v in [5u128, 6, 8] {
            r.allocated.insert(r.first - 1 + v, Owner::from("ns/a"));
        }
        r.reserved.insert(r.first - 1 + 7);
        let at = |v: u128| r.first - 1 + v;
        assert_eq!(r.free_in(at(5), at(14)), Some(at(9)));
        assert_eq!(r.free_in(at(4), at(14)), Some(at(4)));
        assert_eq!(r.free_in(at(5), at(8)), None);
        assert_eq!(r.free_in(at(9), at(9)), Some(at(9)));
        assert_eq!(r.free_in(at(9), at(8)), None);
        // The last address of an IPv6 range is the largest u128: no overflow past it.
        let mut v6 = IpRange::new("::/124".parse().unwrap(), false).unwrap();
        v6.last = u128::MAX;
        v6.allocated.insert(u128::MAX - 1, Owner::from("ns/a"));
        assert_eq!(v6.free_in(u128::MAX - 1, u128::MAX), Some(u128::MAX));
        v6.allocated.insert(u128::MAX, Owner::from("ns/b"));
        assert_eq!(v6.free_in(u128::MAX - 1, u128::MAX), None);
    }

    fn small(cidr: &str) -> Allocators {
        Allocators::new(AdmissionConfig {
            service_cidrs: vec![cidr.parse().unwrap()],
            node_port_range: 30000..=30004,
            lb_pool: Some("10.200.0.0/30".parse().unwrap()),
            reserved_ips: vec!["10.0.0.2".parse().unwrap()],
        })
        .unwrap()
    }

    /// The next `n` dynamic IPv4 addresses, for owners `ns/s0`, `ns/s1`, …
    fn next_ips(a: &mut Allocators, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                a.allocate_next_ip("IPv4", &format!("ns/s{i}"))
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn slash29_hands_out_the_unreserved_addresses_then_is_full() {
        let mut a = small("10.0.0.0/29");
        let got = next_ips(&mut a, 4);
        // .0 network, .7 broadcast, .1 first address, .2 reserved.
        assert_eq!(got, ["10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]);
        assert_eq!(a.allocate_next_ip("IPv4", "ns/x"), Err(AllocError::Full));
        // Explicit requests still reach the reserved addresses.
        a.allocate_ip("10.0.0.1".parse().unwrap(), "default/kubernetes")
            .unwrap();
        a.allocate_ip("10.0.0.2".parse().unwrap(), "kube-system/kube-dns")
            .unwrap();
        assert_eq!(
            a.allocate_ip("10.0.0.7".parse().unwrap(), "ns/y")
                .unwrap_err()
                .to_string(),
            "the provided IP (10.0.0.7) is not in the valid range. The range of valid IPs is 10.0.0.0/29"
        );
    }

    #[test]
    fn dynamic_allocation_prefers_the_upper_band() {
        let mut a = Allocators::new(AdmissionConfig::default()).unwrap();
        // /12 has 2^20 addresses: the static band is the first 256.
        assert_eq!(
            a.allocate_next_ip("IPv4", "ns/a").unwrap().to_string(),
            "10.96.1.0"
        );
        assert_eq!(
            a.allocate_next_ip("IPv4", "ns/b").unwrap().to_string(),
            "10.96.1.1"
        );
        let mut a = Allocators::new(AdmissionConfig::default()).unwrap();
        assert_eq!(
            a.allocate_next_port(&[Protocol::Tcp], "ns/a").unwrap(),
            30086
        );
    }

    #[test]
    fn a_seed_moves_where_the_scan_starts_and_still_wraps() {
        let mut a = small("10.0.0.0/29");
        a.scan_from(2);
        // The band is .1-.6 (a /29 has no static band; .1 and .2 are reserved): from the
        // seed's point past the first free address (.3 + 2), then wrapping.
        let got = next_ips(&mut a, 4);
        assert_eq!(got, ["10.0.0.5", "10.0.0.6", "10.0.0.3", "10.0.0.4"]);
        assert_eq!(a.allocate_next_ip("IPv4", "ns/x"), Err(AllocError::Full));
        let mut a = Allocators::new(AdmissionConfig::default()).unwrap();
        a.scan_from(1000);
        assert_eq!(
            a.allocate_next_port(&[Protocol::Tcp], "ns/a").unwrap(),
            30086 + 1000 % 256
        );
    }

    #[test]
    fn release_checks_the_owner() {
        let mut a = small("10.0.0.0/29");
        let ip = a.allocate_next_ip("IPv4", "ns/a").unwrap();
        a.release_ip(ip, "ns/b");
        assert_eq!(a.cluster_ip_owner(ip), Some("ns/a"));
        a.release_ip(ip, "ns/a");
        assert_eq!(a.cluster_ip_owner(ip), None);
    }

    #[test]
    fn node_ports_are_unique_per_protocol() {
        let mut a = small("10.0.0.0/29");
        a.allocate_port(30001, Protocol::Tcp, "ns/a").unwrap();
        a.allocate_port(30001, Protocol::Udp, "ns/b").unwrap();
        assert_eq!(
            a.allocate_port(30001, Protocol::Tcp, "ns/c"),
            Err(AllocError::PortAllocated)
        );
        assert_eq!(
            a.allocate_port(80, Protocol::Tcp, "ns/c")
                .unwrap_err()
                .to_string(),
            "provided port is not in the valid range. The range of valid ports is 30000-30004"
        );
        // Automatic ports prefer numbers no protocol uses: 30001 comes last.
        let got: Vec<u16> = (0..3)
            .map(|i| {
                a.allocate_next_port(&[Protocol::Udp], &format!("ns/d{i}"))
                    .unwrap()
            })
            .collect();
        assert_eq!(got, [30000, 30002, 30003]);
        a.allocate_port(30004, Protocol::Tcp, "ns/f").unwrap();
        // No number is unused now: fall back to numbers free for the protocol.
        assert_eq!(a.allocate_next_port(&[Protocol::Sctp], "ns/e"), Ok(30000));
        let tcp: Vec<u16> = (0..3)
            .map(|_| a.allocate_next_port(&[Protocol::Tcp], "ns/e").unwrap())
            .collect();
        assert_eq!(tcp, [30000, 30002, 30003]);
        assert_eq!(
            a.allocate_next_port(&[Protocol::Tcp], "ns/e"),
            Err(AllocError::Full)
        );
        assert_eq!(a.allocate_next_port(&[Protocol::Udp], "ns/e"), Ok(30004));
    }

    #[test]
    fn bad_configs_are_refused() {
        let cfg = AdmissionConfig {
            service_cidrs: vec![],
            ..Default::default()
        };
        assert_eq!(
            Allocators::new(cfg).unwrap_err(),
            ConfigError::NoServiceCidr
        );
        let cfg = AdmissionConfig {
            service_cidrs: vec!["10.0.0.0/31".parse().unwrap()],
            ..Default::default()
        };
        assert!(matches!(
            Allocators::new(cfg),
            Err(ConfigError::CidrTooSmall(_))
        ));
        let cfg = AdmissionConfig {
            node_port_range: 0..=10,
            ..Default::default()
        };
        assert!(matches!(
            Allocators::new(cfg),
            Err(ConfigError::BadNodePortRange { .. })
        ));
        let cfg = AdmissionConfig {
            lb_pool: Some("10.96.5.0/24".parse().unwrap()),
            ..Default::default()
        };
        assert!(matches!(
            Allocators::new(cfg),
            Err(ConfigError::LbPoolOverlapsServiceCidr { .. })
        ));
        let mut cfg = AdmissionConfig::default();
        cfg.service_cidrs.push("10.0.0.0/24".parse().unwrap());
        assert!(matches!(
            Allocators::new(cfg),
            Err(ConfigError::DuplicateFamily(..))
        ));
    }
}
