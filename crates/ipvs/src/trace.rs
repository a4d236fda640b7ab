//! Follows a new connection's first packet through a rendered IPVS state, as the kernel
//! would: mangle marks, the filter chain (source ranges, refusals, the dummy's other ports),
//! the unallocated-service-IP drop, the IPVS lookup (firewall mark first, then address and
//! port) with each real server's share, and the masquerade decision (connmark sets, hairpin).
//! Pure; the shared packet-flow table's tracer for this dataplane.

use std::net::{IpAddr, SocketAddr};

use svcnet_proxy::trace::{Branch, Explanation, Hop, Outcome};

use crate::render::{Dst, FWMARK_BASE, FWMARK_MASK, MarkRule, Rendered, Set, Source, ip_port};
use crate::rules::{
    FILTER, FORWARD, MARK_CHAIN, MARK_MASQ, OUTPUT, POSTROUTING, SERVICES, not_set, set,
};
use crate::types::{F_PERSISTENT, Protocol, ServiceKey};
use svcnet_proxy::IpFamily;

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

fn family(p: &Packet) -> IpFamily {
    if p.dst.is_ipv6() {
        IpFamily::V6
    } else {
        IpFamily::V4
    }
}

/// A refusal: its verdict and the filter rule that decides it, as `iptables-save` shows it.
type Refusal = (Verdict, String);

/// The filter table's verdict for a packet to a local address (`None`: accepted).
fn filter(r: &Rendered, p: &Packet, mark: Option<u32>) -> Option<Refusal> {
    if mark.is_some_and(|m| m & FWMARK_MASK == FWMARK_BASE) {
        return None;
    }
    let fe = ip_port(p.dst, p.protocol, p.dport);
    let f = family(p);
    // The rule's words as the companion rules write them (`rules::payload`'s filter chain).
    let rule =
        |parts: &[Vec<String>], target: &str| format!("{} -j {target}", parts.concat().join(" "));
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
            let sets = [
                set(Set::LbFirewall, f, "dst,dst"),
                not_set(Set::LbAllow, f, "dst,dst,src"),
            ];
            return Some((Verdict::Drop, rule(&sets, "DROP")));
        }
    }
    if r.has(Set::Reject, &fe) {
        return Some((
            Verdict::Reject,
            rule(&[set(Set::Reject, f, "dst,dst")], "REJECT"),
        ));
    }
    if r.has(Set::Drop, &fe) {
        return Some((Verdict::Drop, rule(&[set(Set::Drop, f, "dst,dst")], "DROP")));
    }
    if r.has(Set::Vips, &p.dst.to_string()) && !r.has(Set::Frontends, &fe) {
        let sets = [
            set(Set::Vips, f, "dst"),
            not_set(Set::Frontends, f, "dst,dst"),
        ];
        return Some((Verdict::Reject, rule(&sets, "REJECT")));
    }
    None
}

/// The set whose rule masquerades the connection (`None`: not masqueraded).
fn masquerade_set(r: &Rendered, p: &Packet, to: SocketAddr) -> Option<Set> {
    let fe = ip_port(p.dst, p.protocol, p.dport);
    let hairpin = format!(
        "{},{}:{},{}",
        to.ip(),
        p.protocol.as_str(),
        to.port(),
        p.src
    );
    if r.has(Set::LoopBack, &hairpin) {
        Some(Set::LoopBack)
    } else if r.has(Set::MasqAll, &fe) {
        Some(Set::MasqAll)
    } else if r.has(Set::MasqOffCluster, &fe) && !in_cidrs(&r.cluster_cidrs, p.src) {
        Some(Set::MasqOffCluster)
    } else if r.has(Set::MasqLocalSource, &fe) && p.local_source {
        Some(Set::MasqLocalSource)
    } else {
        None
    }
}

/// The virtual server taking the packet, if any.
pub fn server_of(r: &Rendered, p: &Packet) -> Option<ServiceKey> {
    let key = match mark_of(r, p) {
        Some(m) => ServiceKey::fwmark(p.dst.is_ipv6(), m),
        None => ServiceKey::new(p.protocol, p.dst, p.dport),
    };
    r.servers.contains_key(&key).then_some(key)
}

/// One way a packet goes, with what decided it: [`trace`]'s verdict and share, and the hops and
/// rules [`branches`] shows.
struct Step {
    verdict: Verdict,
    share: f64,
    path: Vec<Hop>,
    /// The rule that refused it (chain, rule), or the virtual server and real server.
    ended_by: Option<(String, String)>,
    /// The chain and rule that masquerade it.
    masquerade_by: Option<(String, String)>,
}

impl Step {
    /// No rule takes it: routed (or delivered) as addressed.
    fn pass(path: Vec<Hop>) -> Step {
        Step {
            verdict: Verdict::Pass,
            share: 1.0,
            path,
            ended_by: None,
            masquerade_by: None,
        }
    }
}

/// Whether `dst` is one of the node's addresses this dataplane serves on (the dummy's, the
/// node ports').
fn is_local(r: &Rendered, dst: IpAddr) -> bool {
    r.addresses.contains(&dst) || r.node_ips.contains(&dst)
}

/// The chain `svcnet trace` names for IPVS's own hook (the virtual server lookup).
pub const IPVS_HOOK: &str = "IPVS";

fn hop(chain: &str, hook: &str) -> Hop {
    Hop {
        chain: chain.to_string(),
        hook: Some(hook.to_string()),
        from: None,
        via: None,
    }
}

/// What kind of frontend the destination is, in the words every tracer uses (`cluster IP of
/// …`), from the addresses the state holds: a node address is a node port, an address in a
/// service CIDR a cluster IP, any other on the dummy an external or load-balancer IP.
fn frontend(r: &Rendered, p: &Packet) -> String {
    let kind = if r.node_ips.contains(&p.dst) {
        "node port"
    } else if in_cidrs(&r.service_cidrs, p.dst) {
        "cluster IP"
    } else {
        "external or load-balancer IP"
    };
    let at = SocketAddr::new(p.dst, p.dport);
    format!("{kind} of {at}/{}", p.protocol.as_str())
}

/// The hooks a packet meets: the node's own connections go through OUTPUT (and meet IPVS
/// there), the others through PREROUTING (and IPVS at LOCAL_IN).
struct Hooks {
    mangle: &'static str,
    nat: &'static str,
    filter: &'static str,
    ipvs: &'static str,
}

fn hooks(p: &Packet) -> Hooks {
    if p.local_source {
        Hooks {
            mangle: "mangle OUTPUT",
            nat: "nat OUTPUT",
            filter: "filter OUTPUT",
            ipvs: "ip_vs LOCAL_OUT",
        }
    } else {
        Hooks {
            mangle: "mangle PREROUTING",
            nat: "nat PREROUTING",
            filter: "filter FORWARD",
            ipvs: "ip_vs LOCAL_IN",
        }
    }
}

/// The drop of an address in a service CIDR that no service holds.
fn unallocated(r: &Rendered, p: &Packet, mut path: Vec<Hop>) -> Step {
    let chain = if p.local_source { OUTPUT } else { FORWARD };
    let net = r.service_cidrs.iter().find(|n| n.contains(&p.dst));
    let rule = format!(
        "-d {} -j DROP",
        net.map(|n| n.to_string()).unwrap_or_default()
    );
    path.push(hop(chain, hooks(p).filter));
    Step {
        verdict: Verdict::Drop,
        share: 1.0,
        path,
        ended_by: Some((chain.to_string(), rule)),
        masquerade_by: None,
    }
}

/// The virtual server's choice (`None`: no virtual server takes the packet).
fn ipvs(r: &Rendered, p: &Packet, pinned: Option<SocketAddr>, path: &[Hop]) -> Option<Vec<Step>> {
    let key = server_of(r, p)?;
    let vs = r.servers.get(&key)?;
    let name = match key.fwmark {
        0 => format!(
            "IPVS virtual server {} {} ({})",
            key.protocol.as_str().to_uppercase(),
            SocketAddr::new(key.addr, key.port),
            vs.service.scheduler
        ),
        m => format!(
            "IPVS virtual server fwmark {m:#x} ({})",
            vs.service.scheduler
        ),
    };
    let mut at = hop(IPVS_HOOK, hooks(p).ipvs);
    at.via = Some(frontend(r, p));
    let mut path = path.to_vec();
    path.push(at);
    let f = family(p);
    let to_real = |to: SocketAddr, weight: u32, share: f64| {
        let masq = masquerade_set(r, p, to);
        let mut path = path.clone();
        let masquerade_by = masq.map(|m| {
            let (chain, target) = if m == Set::LoopBack {
                // Postrouting: after IPVS has chosen the real server.
                path.push(hop(POSTROUTING, "nat POSTROUTING"));
                (
                    POSTROUTING,
                    set(m, f, "dst,dst,src").join(" ") + " -j MASQUERADE",
                )
            } else {
                // nat's prerouting (output) chain: right after the mangle marks.
                let at = usize::from(path.first().is_some_and(|h| h.chain == MARK_CHAIN));
                path.insert(at, hop(SERVICES, hooks(p).nat));
                (
                    SERVICES,
                    set(m, f, "dst,dst").join(" ") + &format!(" -j {MARK_MASQ}"),
                )
            };
            (chain.to_string(), target)
        });
        Step {
            verdict: Verdict::Endpoint {
                to,
                masquerade: masq.is_some(),
                server: key,
            },
            share,
            path,
            ended_by: Some((name.clone(), format!("real server {to} weight {weight}"))),
            masquerade_by,
        }
    };
    if let Some(to) = pinned.filter(|_| vs.service.flags & F_PERSISTENT != 0)
        && let Some(d) = vs.dests.get(&crate::DestKey {
            addr: to.ip(),
            port: to.port(),
        })
    {
        return Some(vec![to_real(to, d.weight, 1.0)]);
    }
    let live: Vec<_> = vs.dests.values().filter(|d| d.weight > 0).collect();
    if live.is_empty() {
        // A virtual server without real servers refuses TCP at once.
        let why = "no real server of weight > 0: a new TCP connection is reset".to_string();
        return Some(vec![Step {
            verdict: Verdict::Reject,
            share: 1.0,
            path,
            ended_by: Some((name, why)),
            masquerade_by: None,
        }]);
    }
    let total: f64 = live.iter().map(|d| f64::from(d.weight)).sum();
    Some(
        live.iter()
            .map(|d| {
                let share = f64::from(d.weight) / total;
                to_real(SocketAddr::new(d.addr, d.port), d.weight, share)
            })
            .collect(),
    )
}

/// Where the packet goes, step by step.
fn walk(r: &Rendered, p: &Packet, pinned: Option<SocketAddr>) -> Vec<Step> {
    let mark = mark_of(r, p);
    let local = is_local(r, p.dst);
    let mut path = Vec::new();
    if mark.is_some() {
        path.push(hop(MARK_CHAIN, hooks(p).mangle));
    }
    // The node's own connections meet IPVS in OUTPUT, before the filter's INPUT chain.
    if p.local_source
        && let Some(steps) = ipvs(r, p, pinned, &path)
    {
        return steps;
    }
    if local {
        path.push(hop(FILTER, "filter INPUT"));
        if let Some((verdict, rule)) = filter(r, p, mark) {
            return vec![Step {
                verdict,
                share: 1.0,
                path,
                ended_by: Some((FILTER.to_string(), rule)),
                masquerade_by: None,
            }];
        }
    } else if in_cidrs(&r.service_cidrs, p.dst) {
        return vec![unallocated(r, p, path)];
    }
    ipvs(r, p, pinned, &path).unwrap_or_else(|| vec![Step::pass(path)])
}

/// The outcomes of `p` with their probabilities; `pinned`: the real server an earlier
/// connection of the same client reached through the same persistent virtual server.
pub fn trace(r: &Rendered, p: &Packet, pinned: Option<SocketAddr>) -> Vec<(Verdict, f64)> {
    walk(r, p, pinned)
        .into_iter()
        .map(|s| (s.verdict, s.share))
        .collect()
}

/// `svcnet trace`'s branches for a packet: [`trace`]'s decisions (no pinned client) with the
/// chains that took the packet, the rule that refused it or the virtual server and real
/// server that forwarded it, and the rule that masquerades it. The last hop of a forwarded
/// branch is [`IPVS_HOOK`], its `via` the frontend.
pub fn branches(r: &Rendered, pkt: &svcnet_proxy::trace::Packet) -> Vec<Branch> {
    let Some(protocol) = pkt.proto else {
        // ICMP has no port: no mark, no virtual server; the dummy's addresses answer it.
        let p = Packet {
            src: pkt.src,
            dst: pkt.dst,
            dport: 0,
            protocol: Protocol::Tcp,
            local_source: pkt.local_origin,
        };
        let step = if !is_local(r, pkt.dst) && in_cidrs(&r.service_cidrs, pkt.dst) {
            unallocated(r, &p, Vec::new())
        } else {
            Step::pass(Vec::new())
        };
        return vec![branch_of(step)];
    };
    let p = Packet {
        src: pkt.src,
        dst: pkt.dst,
        dport: pkt.dport,
        protocol,
        local_source: pkt.local_origin,
    };
    walk(r, &p, None).into_iter().map(branch_of).collect()
}

fn branch_of(s: Step) -> Branch {
    Branch {
        share: s.share,
        outcome: match s.verdict {
            Verdict::Endpoint { to, masquerade, .. } => Outcome::Endpoint { to, masquerade },
            Verdict::Reject => Outcome::Reject,
            Verdict::Drop => Outcome::Drop,
            Verdict::Pass => Outcome::Pass,
        },
        path: s.path,
        masquerade_by: s.masquerade_by,
        ended_by: s.ended_by,
        records_affinity: Vec::new(),
    }
}

/// A branch of [`branches`] in words, as the other dataplanes' tracers give them.
pub fn explain(b: &Branch) -> Explanation {
    use svcnet_proxy::trace::why;
    let frontend = b
        .path
        .iter()
        .rev()
        .find(|h| h.chain == IPVS_HOOK)
        .and_then(|h| h.via.clone());
    let is_cluster_ip = frontend
        .as_deref()
        .is_some_and(|f| f.starts_with("cluster IP"));
    let names = |set: Set| [IpFamily::V4, IpFamily::V6].map(|f| set.name(f));
    let masquerade = b.masquerade_by.as_ref().map(|(_, rule)| {
        let has = |set: Set| {
            names(set)
                .iter()
                .any(|n| rule.contains(&format!("--match-set {n} ")))
        };
        if has(Set::LoopBack) {
            why::HAIRPIN.to_string()
        } else if has(Set::MasqOffCluster) {
            why::OFF_CLUSTER.to_string()
        } else if has(Set::MasqLocalSource) {
            why::LOCAL_SHORT_CIRCUIT.to_string()
        } else if is_cluster_ip {
            "every connection to a cluster IP is masqueraded (--masquerade-all)".to_string()
        } else {
            why::EXTERNAL_CLUSTER.to_string()
        }
    });
    let (chain, rule) = b.ended_by.clone().unwrap_or_default();
    let refused_by = |set: Set| {
        names(set)
            .iter()
            .any(|n| rule.starts_with(&format!("-m set --match-set {n} ")))
    };
    let verdict = match &b.outcome {
        Outcome::Endpoint { to, .. } => {
            format!("forwarded by IPVS to {to} (masquerading forwarding: a DNAT)")
        }
        Outcome::Listener { port } => format!("redirected to a listener on port {port}"),
        Outcome::Pass => why::NOT_A_SERVICE.to_string(),
        _ if chain == FORWARD || chain == OUTPUT => why::UNALLOCATED.to_string(),
        _ if chain.starts_with("IPVS ") => why::NO_ENDPOINTS.to_string(),
        _ if refused_by(Set::LbFirewall) => why::SOURCE_RANGES.to_string(),
        _ if refused_by(Set::Reject) => why::NO_ENDPOINTS.to_string(),
        _ if refused_by(Set::Drop) => why::NO_LOCAL_ENDPOINTS.to_string(),
        _ if refused_by(Set::Vips) => why::UNKNOWN_PORT.to_string(),
        other => format!("{other:?} by `{rule}` in chain {chain}"),
    };
    Explanation {
        frontend,
        masquerade,
        verdict,
    }
}
