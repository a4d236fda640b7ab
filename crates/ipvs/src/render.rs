//! The IPVS dataplane's rendering: each service port's decided graph (`svcnet_proxy::lower`)
//! translated into IPVS virtual servers, addresses for the dummy interface, ipset members and
//! firewall-mark rules (kube-proxy's IPVS proxier, with two additions the decided graph asks
//! for and a per-address virtual server cannot give):
//!
//! * ClientIP affinity is per service port, whatever frontend a connection arrives on: a port
//!   with affinity and more than one frontend is one firewall-mark virtual server (marks set
//!   per frontend in mangle), so its persistence templates are shared, not one per address.
//! * The `externalTrafficPolicy: Local` short-circuit (pods and the node itself reach the
//!   cluster pool through an external frontend) marks those sources' connections to a
//!   firewall-mark virtual server over the cluster pool; IPVS looks a marked packet up by its
//!   mark first.
//!
//! Everything else is one virtual server per cluster IP, external IP and load-balancer IP and
//! port, and per node address × node port; refusals, masquerade and source ranges are ipset
//! members read by a constant iptables skeleton (`rules`). Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_lb::{Algorithm, Fallback, Resolution};
use svcnet_proxy::{
    Capability, DesiredEndpoint, DesiredFamily, DesiredNode, DesiredServicePort, Frontend,
    IpFamily, Masquerade, NoEndpointsVerdict, Pool, ServicePortName, Target, lower,
};

use crate::types::{Dest, DestKey, F_SCHED1, F_SCHED2, Protocol, Service, ServiceKey};

/// The dummy interface holding every cluster, external and load-balancer IP (kube-ipvs0),
/// left DOWN with NOARP as upstream leaves it.
pub const DUMMY: &str = "svcnet-ipvs0";
/// Prefix of the dataplane's chains and ipsets (distinct from the iptables dataplane's
/// `SVCNET-`, whose cleanup must not remove them).
pub const PREFIX: &str = "SVCIPVS-";
/// The conntrack mark bit asking for masquerade (a connmark, so that the packet mark stays
/// free for firewall-mark virtual servers, which IPVS matches exactly).
pub const MASQ_MARK: u32 = 0x4000;
/// Firewall marks of svcnet's virtual servers: `FWMARK_BASE | n`.
pub const FWMARK_BASE: u32 = 0x5300_0000;
/// The bits that say a packet carries one of svcnet's firewall marks.
pub const FWMARK_MASK: u32 = 0xff00_0000;

/// The ipsets the companion rules read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Set {
    /// Every address on the dummy (`KUBE-IPVS-IPS`).
    Vips,
    /// Every frontend `ip,proto:port` the dataplane knows (served or refused).
    Frontends,
    /// Frontends whose connections are all masqueraded.
    MasqAll,
    /// Frontends masqueraded for sources outside the cluster CIDRs.
    MasqOffCluster,
    /// Frontends masqueraded for node-sourced connections (the eTP=Local short-circuit).
    MasqLocalSource,
    /// The cluster CIDRs.
    ClusterCidrs,
    /// `endpoint,proto:port,endpoint`: hairpin connections, masqueraded (`KUBE-LOOP-BACK`).
    LoopBack,
    /// Frontends refused with an ICMP error.
    Reject,
    /// Frontends whose connections are dropped.
    Drop,
    /// Load-balancer frontends with source ranges.
    LbFirewall,
    /// `lb ip,proto:port,allowed cidr`.
    LbAllow,
    /// The node addresses node ports are served on.
    NodeIps,
}

impl Set {
    pub const ALL: [Set; 12] = [
        Set::Vips,
        Set::Frontends,
        Set::MasqAll,
        Set::MasqOffCluster,
        Set::MasqLocalSource,
        Set::ClusterCidrs,
        Set::LoopBack,
        Set::Reject,
        Set::Drop,
        Set::LbFirewall,
        Set::LbAllow,
        Set::NodeIps,
    ];

    fn base(self) -> &'static str {
        match self {
            Set::Vips => "VIPS",
            Set::Frontends => "FRONTENDS",
            Set::MasqAll => "MASQ-ALL",
            Set::MasqOffCluster => "MASQ-OFF-CLUSTER",
            Set::MasqLocalSource => "MASQ-LOCAL-SRC",
            Set::ClusterCidrs => "CLUSTER-CIDRS",
            Set::LoopBack => "LOOP-BACK",
            Set::Reject => "REJECT",
            Set::Drop => "DROP",
            Set::LbFirewall => "LB-FW",
            Set::LbAllow => "LB-ALLOW",
            Set::NodeIps => "NODE-IPS",
        }
    }

    /// The set's name in `family` (IPv6 sets carry a `6`, as kube-proxy's `KUBE-6-`).
    pub fn name(self, family: IpFamily) -> String {
        match family {
            IpFamily::V4 => format!("{PREFIX}{}", self.base()),
            IpFamily::V6 => format!("{PREFIX}6-{}", self.base()),
        }
    }

    /// The ipset type.
    pub fn kind(self) -> &'static str {
        match self {
            Set::Vips | Set::NodeIps => "hash:ip",
            Set::ClusterCidrs => "hash:net",
            Set::LoopBack => "hash:ip,port,ip",
            Set::LbAllow => "hash:ip,port,net",
            _ => "hash:ip,port",
        }
    }
}

/// `ip,proto:port`, an ipset member of a `hash:ip,port` set.
pub fn ip_port(ip: IpAddr, proto: Protocol, port: u16) -> String {
    format!("{ip},{}:{port}", proto.as_str())
}

/// Which sources a mark rule takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Any,
    /// Inside the cluster CIDRs (pods).
    ClusterCidrs,
    /// A local address (the node itself).
    Local,
}

/// Which destination addresses a mark rule takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dst {
    Addr(IpAddr),
    /// Any node address (node ports).
    NodeIps,
}

/// A mangle rule: new connections from `source` to `dst:port`/`protocol` get `mark`. Later
/// rules win (the short-circuit marks come after a port's affinity marks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MarkRule {
    pub dst: Dst,
    pub protocol: Protocol,
    pub port: u16,
    pub source: Source,
    pub mark: u32,
}

/// A virtual server and its real servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualServer {
    pub service: Service,
    /// The service port's protocol (a firewall-mark key says TCP whatever it carries).
    pub protocol: Protocol,
    pub dests: BTreeMap<DestKey, Dest>,
}

/// A persistent firewall-mark virtual server's port translation: IPVS keeps the packet's
/// destination port for those (`ip_vs_sched_persist` uses the real server's port only when
/// the packet's equals the virtual server's, and a mark server has none), so new connections
/// with `mark` get their destination port set to the endpoints' `port` in nat first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortDnat {
    pub mark: u32,
    pub protocol: Protocol,
    pub port: u16,
}

/// What one service port renders to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortRender {
    pub servers: Vec<VirtualServer>,
    pub addresses: Vec<IpAddr>,
    pub members: Vec<(Set, String)>,
    pub marks: Vec<MarkRule>,
    pub port_dnats: Vec<PortDnat>,
    pub fallback: Option<Fallback>,
}

/// The whole rendered state of one family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    pub servers: BTreeMap<ServiceKey, VirtualServer>,
    pub addresses: BTreeSet<IpAddr>,
    pub members: BTreeMap<Set, BTreeSet<String>>,
    pub marks: Vec<MarkRule>,
    pub port_dnats: Vec<PortDnat>,
    /// The service CIDRs (unallocated addresses inside are dropped).
    pub service_cidrs: Vec<IpNet>,
    pub cluster_cidrs: Vec<IpNet>,
    pub node_ips: Vec<IpAddr>,
}

impl Rendered {
    pub fn has(&self, set: Set, member: &str) -> bool {
        self.members.get(&set).is_some_and(|m| m.contains(member))
    }
}

/// How IPVS resolves algorithms: its scheduler for every svcnet algorithm but random.
pub struct IpvsCapability;

impl Capability for IpvsCapability {
    fn resolve(
        &self,
        requested: Option<Algorithm>,
        _pools: &[&[DesiredEndpoint]],
        _affinity: bool,
    ) -> Resolution {
        svcnet_lb::resolve(requested, svcnet_lb::Dataplane::Ipvs)
    }
}

/// The IPVS scheduler and flags of an algorithm: sh with sh-fallback (draining real servers
/// of weight 0 are skipped); maglev as mh hashing the source port too, with mh-fallback.
pub fn scheduler(a: Algorithm) -> (&'static str, u32) {
    match a {
        Algorithm::RoundRobin | Algorithm::Random => ("rr", 0),
        Algorithm::WeightedRoundRobin => ("wrr", 0),
        Algorithm::LeastConnection => ("lc", 0),
        Algorithm::ShortestExpectedDelay => ("sed", 0),
        Algorithm::NeverQueue => ("nq", 0),
        Algorithm::SourceHash => ("sh", F_SCHED1),
        Algorithm::DestinationHash => ("dh", 0),
        Algorithm::Maglev => ("mh", F_SCHED1 | F_SCHED2),
    }
}

/// Renders service ports, remembering the firewall marks it handed out (stable across
/// syncs for a service port and pool).
#[derive(Debug, Clone)]
pub struct Renderer {
    family: IpFamily,
    node_ips: Vec<IpAddr>,
    marks: BTreeMap<(ServicePortName, Pool), u32>,
    ports: BTreeMap<ServicePortName, PortRender>,
    node: Option<DesiredNode>,
}

impl Renderer {
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            node_ips: Vec::new(),
            marks: BTreeMap::new(),
            ports: BTreeMap::new(),
            node: None,
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The node addresses node ports are served on (re-read by each full sync).
    pub fn set_node_ips(&mut self, ips: Vec<IpAddr>) {
        self.node_ips = ips;
    }

    pub fn node_ips(&self) -> &[IpAddr] {
        &self.node_ips
    }

    /// The node settings the last render used.
    pub fn node(&self) -> Option<&DesiredNode> {
        self.node.as_ref()
    }

    fn mark(&mut self, spn: &ServicePortName, pool: Pool) -> u32 {
        if let Some(m) = self.marks.get(&(spn.clone(), pool)) {
            return *m;
        }
        let used: BTreeSet<u32> = self.marks.values().copied().collect();
        let m = (1..)
            .map(|n| FWMARK_BASE | n)
            .find(|m| !used.contains(m))
            .unwrap_or(FWMARK_BASE | 1);
        self.marks.insert((spn.clone(), pool), m);
        m
    }

    /// Renders every service port of `desired` (a full sync).
    pub fn render_all(&mut self, desired: &DesiredFamily) -> Rendered {
        self.node = Some(desired.node.clone());
        self.ports.clear();
        for d in desired.services.values() {
            let r = self.render_port(d, &desired.node);
            self.ports.insert(d.name.clone(), r);
        }
        self.marks
            .retain(|(spn, _), _| desired.services.contains_key(spn));
        self.union()
    }

    /// Re-renders the changed services (each with all of its desired ports; none when gone).
    pub fn render_changes(
        &mut self,
        node: &DesiredNode,
        changes: &svcnet_proxy::Changes,
    ) -> Rendered {
        for (svc, ports) in changes {
            self.ports.retain(|spn, _| &spn.service != svc);
            self.marks.retain(|(spn, _), _| &spn.service != svc);
            for d in ports {
                let r = self.render_port(d, node);
                self.ports.insert(d.name.clone(), r);
            }
        }
        self.union()
    }

    /// The fallbacks of the ports last rendered for `services` (`None`: all).
    pub fn fallbacks(
        &self,
        services: Option<&svcnet_proxy::Changes>,
    ) -> Vec<(ServicePortName, Fallback)> {
        self.ports
            .iter()
            .filter(|(spn, _)| services.is_none_or(|c| c.contains_key(&spn.service)))
            .filter_map(|(spn, r)| r.fallback.clone().map(|f| (spn.clone(), f)))
            .collect()
    }

    pub fn service_ports(&self) -> usize {
        self.ports.len()
    }

    fn union(&self) -> Rendered {
        let mut out = Rendered {
            node_ips: self.node_ips.clone(),
            ..Rendered::default()
        };
        if let Some(node) = &self.node {
            out.service_cidrs = node.service_cidrs.clone();
            out.cluster_cidrs = node.cluster_cidrs.clone();
        }
        for set in Set::ALL {
            out.members.insert(set, BTreeSet::new());
        }
        let mut add = |set: Set, m: String| {
            out.members.entry(set).or_default().insert(m);
        };
        for net in &out.cluster_cidrs.clone() {
            add(Set::ClusterCidrs, net.to_string());
        }
        for ip in &self.node_ips {
            add(Set::NodeIps, ip.to_string());
        }
        for r in self.ports.values() {
            for (set, m) in &r.members {
                add(*set, m.clone());
            }
        }
        for r in self.ports.values() {
            for vs in &r.servers {
                out.servers.insert(vs.service.key, vs.clone());
            }
            out.addresses.extend(r.addresses.iter().copied());
            out.marks.extend(r.marks.iter().copied());
            out.port_dnats.extend(r.port_dnats.iter().copied());
        }
        for ip in out.addresses.clone() {
            out.members
                .entry(Set::Vips)
                .or_default()
                .insert(ip.to_string());
        }
        out
    }

    /// Renders one service port from its decided graph.
    pub fn render_port(&mut self, d: &DesiredServicePort, node: &DesiredNode) -> PortRender {
        let g = lower(d, node, &IpvsCapability);
        let proto = d.protocol;
        let (sched, sched_flags) = scheduler(g.algorithm);
        let mut out = PortRender {
            fallback: g.fallback.clone(),
            ..PortRender::default()
        };
        let dests = |eps: &[DesiredEndpoint]| -> BTreeMap<DestKey, Dest> {
            eps.iter()
                .map(|e| {
                    let weight = if g.algorithm == Algorithm::WeightedRoundRobin {
                        e.weight
                    } else {
                        1
                    };
                    let d = Dest::masq(e.ip, e.port, weight);
                    (d.key(), d)
                })
                .collect()
        };
        let service = |key: ServiceKey| {
            let mut s = Service::new(key, sched);
            s.flags |= sched_flags;
            if let Some(a) = g.affinity {
                s = s.persistent(a.timeout);
            }
            s
        };
        // Hairpin: every endpoint reaching itself through the service is masqueraded.
        for e in g.endpoints() {
            out.members.push((
                Set::LoopBack,
                format!("{},{}:{},{}", e.ip, proto.as_str(), e.port, e.ip),
            ));
        }
        // Firewall-mark servers: the port's affinity (shared by all of its frontends) and the
        // short-circuit pool. A persistent one needs one target port for all of its
        // endpoints (see PortDnat); a port whose endpoints differ keeps affinity per frontend.
        let uniform = |eps: &[DesiredEndpoint]| eps.windows(2).all(|w| w[0].port == w[1].port);
        let shared_affinity = g.affinity.is_some()
            && g.frontends.len() > 1
            && g.pools.iter().all(|(_, eps)| uniform(eps));
        let v6 = self.family == IpFamily::V6;
        let mut fwmark_pools: BTreeSet<Pool> = BTreeSet::new();
        let mut short_marks = Vec::new();
        for f in &g.frontends {
            let route = g.route_of(f);
            // The addresses this frontend answers on, and its mark-rule destination.
            let (ips, dst, port): (Vec<IpAddr>, Dst, u16) = match *f {
                Frontend::ClusterIp(ip, port) | Frontend::ExternalIp(ip, port) => {
                    (vec![ip], Dst::Addr(ip), port)
                }
                Frontend::LoadBalancer { ip, port, .. } => (vec![ip], Dst::Addr(ip), port),
                Frontend::NodePort(port) => (self.node_ips.clone(), Dst::NodeIps, port),
            };
            if !matches!(f, Frontend::NodePort(_)) {
                out.addresses.extend(ips.iter().copied());
            }
            for ip in &ips {
                out.members
                    .push((Set::Frontends, ip_port(*ip, proto, port)));
            }
            if let Frontend::LoadBalancer {
                ip, source_ranges, ..
            } = f
                && !source_ranges.is_empty()
            {
                out.members
                    .push((Set::LbFirewall, ip_port(*ip, proto, port)));
                for net in source_ranges.iter().filter(|n| n.addr().is_ipv6() == v6) {
                    out.members
                        .push((Set::LbAllow, format!("{},{net}", ip_port(*ip, proto, port))));
                }
            }
            match route.target {
                Target::Refuse(v) => {
                    let set = match v {
                        NoEndpointsVerdict::Reject => Set::Reject,
                        NoEndpointsVerdict::Drop => Set::Drop,
                    };
                    for ip in &ips {
                        out.members.push((set, ip_port(*ip, proto, port)));
                    }
                }
                Target::Pool { pool, masquerade } => {
                    let masq = match masquerade {
                        Masquerade::Always => Some(Set::MasqAll),
                        Masquerade::OffCluster => Some(Set::MasqOffCluster),
                        Masquerade::Never => None,
                    };
                    for ip in &ips {
                        if let Some(set) = masq {
                            out.members.push((set, ip_port(*ip, proto, port)));
                        }
                    }
                    if shared_affinity {
                        fwmark_pools.insert(pool);
                        let mark = self.mark(&d.name, pool);
                        out.marks.push(MarkRule {
                            dst,
                            protocol: proto,
                            port,
                            source: Source::Any,
                            mark,
                        });
                    } else if let Some(eps) = g.pool(pool) {
                        for ip in &ips {
                            out.servers.push(VirtualServer {
                                service: service(ServiceKey::new(proto, *ip, port)),
                                protocol: proto,
                                dests: dests(eps),
                            });
                        }
                    }
                }
            }
            if let Some(pool) = route.short_circuit {
                fwmark_pools.insert(pool);
                let mark = self.mark(&d.name, pool);
                for source in [Source::ClusterCidrs, Source::Local] {
                    if source == Source::ClusterCidrs && node.cluster_cidrs.is_empty() {
                        continue;
                    }
                    short_marks.push(MarkRule {
                        dst,
                        protocol: proto,
                        port,
                        source,
                        mark,
                    });
                }
                for ip in &ips {
                    out.members
                        .push((Set::MasqLocalSource, ip_port(*ip, proto, port)));
                }
            }
        }
        out.marks.extend(short_marks);
        for pool in fwmark_pools {
            let mark = self.mark(&d.name, pool);
            if let Some(eps) = g.pool(pool) {
                let mut svc = service(ServiceKey::fwmark(v6, mark));
                match eps.first() {
                    Some(e) if g.affinity.is_some() && uniform(eps) => {
                        out.port_dnats.push(PortDnat {
                            mark,
                            protocol: proto,
                            port: e.port,
                        });
                    }
                    _ => {
                        svc.flags &= !crate::types::F_PERSISTENT;
                        svc.timeout = 0;
                    }
                }
                out.servers.push(VirtualServer {
                    service: svc,
                    protocol: proto,
                    dests: dests(eps),
                });
            }
        }
        out
    }
}

impl fmt::Display for MarkRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}",
            crate::rules::mark_args(self, IpFamily::V4).join(" ")
        )
    }
}
