//! Follows a new connection's first packet through a rendered IPVS state, as the kernel
//! would: mangle marks, the filter chain (source ranges, refusals, the dummy's other ports),
//! the unallocated-service-IP drop, the IPVS lookup (firewall mark first, then address and
//! port) with each real server's share, and the masquerade decision (connmark sets, hairpin).
//! Pure; the shared packet-flow table's tracer for this dataplane.

use std::net::{IpAddr, SocketAddr};

use crate::render::{Dst, FWMARK_BASE, FWMARK_MASK, MarkRule, Rendered, Set, Source, ip_port};
use crate::types::{F_PERSISTENT, Protocol, ServiceKey};

/// The first packet of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dport: u16,
    pub protocol: Protocol,
    /// The node itself sends it (its source is a local address).
    pub local_source: bool,
}

/// Where the packet ends.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Forwarded by the virtual server `server` to a real server.
    Endpoint {
        to: SocketAddr,
        masquerade: bool,
        server: ServiceKey,
    },
    Reject,
    Drop,
    /// No virtual server or rule takes it.
    Pass,
}

fn in_cidrs(nets: &[ipnet::IpNet], ip: IpAddr) -> bool {
    nets.iter().any(|n| n.contains(&ip))
}

fn mark_of(r: &Rendered, p: &Packet) -> Option<u32> {
    let matches = |m: &MarkRule| {
        let dst = match m.dst {
            Dst::Addr(ip) => ip == p.dst,
            Dst::NodeIps => r.node_ips.contains(&p.dst),
        };
        let src = match m.source {
            Source::Any => true,
            Source::ClusterCidrs => in_cidrs(&r.cluster_cidrs, p.src),
            Source::Local => p.local_source,
        };
        dst && src && m.protocol == p.protocol && m.port == p.dport
    };
    r.marks.iter().rev().find(|m| matches(m)).map(|m| m.mark)
}

/// The filter table's verdict for a packet to a local address (`None`: accepted).
fn filter(r: &Rendered, p: &Packet, mark: Option<u32>) -> Option<Verdict> {
    if mark.is_some_and(|m| m & FWMARK_MASK == FWMARK_BASE) {
        return None;
    }
    let fe = ip_port(p.dst, p.protocol, p.dport);
    if r.has(Set::LbFirewall, &fe) {
        let allowed = r.members.get(&Set::LbAllow).is_some_and(|m| {
            m.iter().any(|entry| {
                entry
                    .strip_prefix(&format!("{fe},"))
                    .and_then(|net| net.parse::<ipnet::IpNet>().ok())
                    .is_some_and(|net| net.contains(&p.src))
            })
        });
        if !allowed {
            return Some(Verdict::Drop);
        }
    }
    if r.has(Set::Reject, &fe) {
        return Some(Verdict::Reject);
    }
    if r.has(Set::Drop, &fe) {
        return Some(Verdict::Drop);
    }
    if r.has(Set::Vips, &p.dst.to_string()) && !r.has(Set::Frontends, &fe) {
        return Some(Verdict::Reject);
    }
    None
}

fn masquerade(r: &Rendered, p: &Packet, to: SocketAddr) -> bool {
    let fe = ip_port(p.dst, p.protocol, p.dport);
    let hairpin = format!(
        "{},{}:{},{}",
        to.ip(),
        p.protocol.as_str(),
        to.port(),
        p.src
    );
    r.has(Set::MasqAll, &fe)
        || (r.has(Set::MasqOffCluster, &fe) && !in_cidrs(&r.cluster_cidrs, p.src))
        || (r.has(Set::MasqLocalSource, &fe) && p.local_source)
        || r.has(Set::LoopBack, &hairpin)
}

/// The virtual server taking the packet, if any.
pub fn server_of(r: &Rendered, p: &Packet) -> Option<ServiceKey> {
    let key = match mark_of(r, p) {
        Some(m) => ServiceKey::fwmark(p.dst.is_ipv6(), m),
        None => ServiceKey::new(p.protocol, p.dst, p.dport),
    };
    r.servers.contains_key(&key).then_some(key)
}

fn ipvs(r: &Rendered, p: &Packet, pinned: Option<SocketAddr>) -> Option<Vec<(Verdict, f64)>> {
    let key = server_of(r, p)?;
    let vs = r.servers.get(&key)?;
    let live: Vec<_> = vs.dests.values().filter(|d| d.weight > 0).collect();
    if let Some(to) = pinned.filter(|_| vs.service.flags & F_PERSISTENT != 0)
        && vs.dests.contains_key(&crate::DestKey {
            addr: to.ip(),
            port: to.port(),
        })
    {
        let v = Verdict::Endpoint {
            to,
            masquerade: masquerade(r, p, to),
            server: key,
        };
        return Some(vec![(v, 1.0)]);
    }
    if live.is_empty() {
        // A virtual server without real servers refuses TCP at once.
        return Some(vec![(Verdict::Reject, 1.0)]);
    }
    let total: f64 = live.iter().map(|d| f64::from(d.weight)).sum();
    Some(
        live.iter()
            .map(|d| {
                let to = SocketAddr::new(d.addr, d.port);
                let v = Verdict::Endpoint {
                    to,
                    masquerade: masquerade(r, p, to),
                    server: key,
                };
                (v, f64::from(d.weight) / total)
            })
            .collect(),
    )
}

/// The outcomes of `p` with their probabilities; `pinned`: the real server an earlier
/// connection of the same client reached through the same persistent virtual server.
pub fn trace(r: &Rendered, p: &Packet, pinned: Option<SocketAddr>) -> Vec<(Verdict, f64)> {
    let mark = mark_of(r, p);
    let local = r.addresses.contains(&p.dst) || r.node_ips.contains(&p.dst);
    // The node's own connections meet IPVS in OUTPUT, before the filter's INPUT chain.
    if p.local_source
        && let Some(v) = ipvs(r, p, pinned)
    {
        return v;
    }
    if local {
        if let Some(v) = filter(r, p, mark) {
            return vec![(v, 1.0)];
        }
    } else if in_cidrs(&r.service_cidrs, p.dst) {
        return vec![(Verdict::Drop, 1.0)];
    }
    ipvs(r, p, pinned).unwrap_or_else(|| vec![(Verdict::Pass, 1.0)])
}
