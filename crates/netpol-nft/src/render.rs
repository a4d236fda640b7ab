//! The desired table of one node, a pure function of the evaluator's model
//! ([`svcnet_netpol::Cluster`]) and the node's name.
//!
//! Layout (names in [`crate::names`]):
//!
//! ```text
//! egress-forward   hook forward prio 0: ct established,related accept; saddr @egress-isolated jump egress-policies
//! egress-input     hook input   prio 0: the same, for a local pod's traffic to the node itself
//! ingress-forward  hook forward prio 1: ct established,related accept; daddr @ingress-isolated jump ingress-policies
//! egress-policies:  saddr @pods-<target> jump out-<policy> ...; deny
//! ingress-policies: daddr @pods-<target> jump in-<policy> ...;  deny
//! out-/in-<policy>: one rule per (rule, peer, port kind): <peer address> <ports> accept
//! ```
//!
//! An `accept` ends only its base chain, so the egress and the ingress side are two base
//! chains and both must pass (NetworkPolicy's "both ends must agree"); a drop or reject in
//! either is final. Every base chain sits at a forward/input hook, after the proxy's DNAT
//! (prerouting, priority -100), so a connection to a Service IP is judged by its destination
//! pod and target port. Traffic the node itself sends leaves through the output hook, where
//! this table has no chain: the node exception. Pods are matched by address: selector sets
//! hold every matching pod of the cluster (a peer may be anywhere), the isolation sets only
//! this node's pods (each node judges its own pods' two sides). IPv4 only, as svcnet's pod
//! network.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use svcnet_libnft::BaseChain;
use svcnet_netpol::{
    Cluster, Direction, IpBlock, Op, Peer, Pod, Policy, PortMatch, Protocol, Selector,
};

use crate::names;

/// What a denied new connection gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenyAction {
    /// ICMP "administratively prohibited": the client fails at once (`EHOSTUNREACH`).
    #[default]
    Reject,
    /// Silently dropped: the client times out.
    Drop,
}

/// Render options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub deny: DenyAction,
}

/// A set of the table: its type and its elements, in nft's syntax.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    pub type_: &'static str,
    pub interval: bool,
    /// What the set stands for (a selector, a block, a port name).
    pub comment: String,
    pub elements: BTreeSet<String>,
}

/// A chain of the table: its hook (base chains) and its rules, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    pub base: Option<BaseChain>,
    pub rules: Vec<String>,
}

/// The whole desired table of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    pub sets: BTreeMap<String, SetSpec>,
    pub chains: BTreeMap<String, ChainSpec>,
}

const ADDR: &str = "ipv4_addr";
const ADDR_PROTO_PORT: &str = "ipv4_addr . inet_proto . inet_service";

/// The table for `node`. Every policy of the cluster is rendered, not only those selecting a
/// pod here: a pod arriving on this node, or a label that brings a pod under a policy, is
/// then a set element change, never a new chain.
pub fn render(cluster: &Cluster, node: &str, opts: &Options) -> Ruleset {
    render_with(cluster, node, opts, None)
}

/// What an incremental render may reuse: the previous ruleset, rendered for the same node
/// from a cluster with the same namespaces whose pods differ only in `old` (gone or
/// changed) and `new` (added or changed).
struct Reuse<'a> {
    prev: &'a Ruleset,
    old: Vec<&'a Pod>,
    new: Vec<&'a Pod>,
    policies_same: bool,
}

impl Reuse<'_> {
    /// A previous set's elements with the changed pods' old contributions taken out and
    /// their new ones put in (`None`: the set is new).
    fn patch(
        &self,
        name: &str,
        contribution: impl Fn(&Pod) -> Vec<String>,
        counts: impl Fn(&Pod) -> bool,
    ) -> Option<BTreeSet<String>> {
        let mut elements = self.prev.sets.get(name)?.elements.clone();
        for p in &self.old {
            for e in contribution(p) {
                elements.remove(&e);
            }
        }
        for p in self.new.iter().filter(|p| counts(p)) {
            elements.extend(contribution(p));
        }
        Some(elements)
    }
}

fn render_with(
    cluster: &Cluster,
    node: &str,
    opts: &Options,
    reuse: Option<&Reuse<'_>>,
) -> Ruleset {
    let mut r = Ruleset::default();
    let is_local = |p: &Pod| p.node.as_deref() == Some(node);
    for (name, dir) in [
        (names::INGRESS_ISOLATED, Direction::Ingress),
        (names::EGRESS_ISOLATED, Direction::Egress),
    ] {
        let comment = format!("this node's pods isolated for {}", dir_word(dir));
        let isolated = |p: &Pod| is_local(p) && cluster.isolating(p, dir).next().is_some();
        let patched = reuse
            .filter(|u| u.policies_same)
            .and_then(|u| u.patch(name, ip_strings, isolated));
        let set = match patched {
            Some(elements) => SetSpec {
                type_: ADDR,
                interval: false,
                comment,
                elements,
            },
            None => addresses(comment, cluster.pods.iter().filter(|p| isolated(p))),
        };
        r.sets.insert(name.to_string(), set);
    }
    let deny: Vec<String> = match opts.deny {
        // ICMP for TCP too: a reset made after the proxy's DNAT leaves with the pod's
        // address, not the Service's, and the client never matches it (measured: the
        // connection timed out), while the ICMP error is translated with its conntrack entry.
        DenyAction::Reject => vec!["reject with icmp type admin-prohibited".into()],
        DenyAction::Drop => vec!["drop".into()],
    };
    let mut policies: Vec<&Policy> = cluster.policies.iter().collect();
    policies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    for dir in [Direction::Egress, Direction::Ingress] {
        let mut dispatch = Vec::new();
        for policy in policies.iter().filter(|p| p.isolates(dir)) {
            let id = format!("{}/{}", policy.namespace, policy.name);
            let chain = names::policy_chain(dir == Direction::Ingress, &id);
            let target = Peer::Pods {
                pods: Some(policy.pod_selector.clone()),
                namespaces: None,
            };
            let targets = r.pods_set(cluster, policy, &target, reuse);
            dispatch.push(format!(
                "ip {} @{targets} jump {chain} comment \"{id}\"",
                own_addr(dir)
            ));
            let rules = r.policy_rules(cluster, policy, dir, reuse);
            r.chains.insert(chain, ChainSpec { base: None, rules });
        }
        dispatch.extend(deny.iter().cloned());
        let name = match dir {
            Direction::Egress => names::EGRESS_POLICIES,
            Direction::Ingress => names::INGRESS_POLICIES,
        };
        r.chains.insert(
            name.to_string(),
            ChainSpec {
                base: None,
                rules: dispatch,
            },
        );
    }
    let base = |hook, priority, addr: &str, set: &str, policies: &str| ChainSpec {
        base: Some(BaseChain {
            kind: "filter",
            hook,
            priority,
        }),
        rules: vec![
            "ct state established,related accept".into(),
            format!("ip {addr} @{set} jump {policies}"),
        ],
    };
    let egress = |hook| {
        base(
            hook,
            0,
            "saddr",
            names::EGRESS_ISOLATED,
            names::EGRESS_POLICIES,
        )
    };
    r.chains
        .insert(names::EGRESS_FORWARD.into(), egress("forward"));
    r.chains.insert(names::EGRESS_INPUT.into(), egress("input"));
    r.chains.insert(
        names::INGRESS_FORWARD.into(),
        base(
            "forward",
            1,
            "daddr",
            names::INGRESS_ISOLATED,
            names::INGRESS_POLICIES,
        ),
    );
    r
}

impl Ruleset {
    /// The rules of one policy's chain for `dir`: each (rule, peer, port kind) an `accept`.
    fn policy_rules(
        &mut self,
        cluster: &Cluster,
        policy: &Policy,
        dir: Direction,
        reuse: Option<&Reuse<'_>>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for rule in policy.rules(dir) {
            let peers: Vec<String> = if rule.peers.is_empty() {
                vec![String::new()]
            } else {
                rule.peers
                    .iter()
                    .filter_map(|peer| self.peer_match(cluster, policy, peer, dir, reuse))
                    .collect()
            };
            let ports = self.port_matches(cluster, &rule.ports, reuse);
            for peer in &peers {
                for port in &ports {
                    let parts: Vec<&str> = [peer.as_str(), port.as_str(), "accept"]
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect();
                    out.push(parts.join(" "));
                }
            }
        }
        out
    }

    /// The match on the other end's address; `None` when the peer can match no IPv4 packet
    /// (an IPv6 block, a peer with neither selector).
    fn peer_match(
        &mut self,
        cluster: &Cluster,
        policy: &Policy,
        peer: &Peer,
        dir: Direction,
        reuse: Option<&Reuse<'_>>,
    ) -> Option<String> {
        let addr = match dir {
            Direction::Ingress => "saddr",
            Direction::Egress => "daddr",
        };
        let set = match peer {
            Peer::Pods {
                pods: None,
                namespaces: None,
            } => return None,
            Peer::Pods { .. } => self.pods_set(cluster, policy, peer, reuse),
            Peer::Block(b) => self.block_set(b)?,
        };
        Some(format!("ip {addr} @{set}"))
    }

    /// The port matches of a rule, each alternative one entry (`""`: any port): numbered and
    /// protocol-only entries in one anonymous set, each named port on its own (it resolves
    /// per destination pod, through that name's set).
    fn port_matches(
        &mut self,
        cluster: &Cluster,
        ports: &[svcnet_netpol::Port],
        reuse: Option<&Reuse<'_>>,
    ) -> Vec<String> {
        if ports.is_empty() {
            return vec![String::new()];
        }
        let mut numbered: BTreeMap<Protocol, Vec<(u16, u16)>> = BTreeMap::new();
        let mut out = Vec::new();
        for p in ports {
            match &p.port {
                PortMatch::Any => numbered.entry(p.protocol).or_default().push((0, 65535)),
                PortMatch::Range(lo, hi) => {
                    numbered.entry(p.protocol).or_default().push((*lo, *hi))
                }
                PortMatch::Named(name) => {
                    let set = self.port_set(cluster, name, reuse);
                    out.push(format!(
                        "meta l4proto {} ip daddr . meta l4proto . th dport @{set}",
                        proto_word(p.protocol)
                    ));
                }
            }
        }
        // An interval set refuses overlapping elements: ranges are merged per protocol.
        let elements: Vec<String> = numbered
            .into_iter()
            .flat_map(|(proto, ranges)| {
                merge(ranges).into_iter().map(move |(lo, hi)| {
                    let proto = proto_word(proto);
                    if lo == hi {
                        format!("{proto} . {lo}")
                    } else {
                        format!("{proto} . {lo}-{hi}")
                    }
                })
            })
            .collect();
        if !elements.is_empty() {
            out.insert(
                0,
                format!("meta l4proto . th dport {{ {} }}", elements.join(", ")),
            );
        }
        out
    }

    /// The set of the pods a selector peer of `policy` selects (created on first use).
    fn pods_set(
        &mut self,
        cluster: &Cluster,
        policy: &Policy,
        peer: &Peer,
        reuse: Option<&Reuse<'_>>,
    ) -> String {
        let Peer::Pods { pods, namespaces } = peer else {
            return String::new();
        };
        let key = format!(
            "{}, {}",
            match namespaces {
                None => format!("namespace {}", policy.namespace),
                Some(sel) => format!("namespaces {}", describe(sel)),
            },
            match pods {
                None => "all pods".to_string(),
                Some(sel) => format!("pods {}", describe(sel)),
            }
        );
        let name = names::pods_set(&key);
        if !self.sets.contains_key(&name) {
            let selects = |pod: &Pod| cluster.peer_selects(policy, peer, pod);
            let set = match reuse.and_then(|u| u.patch(&name, ip_strings, selects)) {
                Some(elements) => SetSpec {
                    type_: ADDR,
                    interval: false,
                    comment: key,
                    elements,
                },
                None => addresses(key, cluster.pods.iter().filter(|p| selects(p))),
            };
            self.sets.insert(name.clone(), set);
        }
        name
    }

    /// The interval set of an IPv4 `ipBlock` (`cidr` minus `except`); `None` for IPv6.
    fn block_set(&mut self, b: &IpBlock) -> Option<String> {
        let IpNet::V4(cidr) = b.cidr else {
            return None;
        };
        let excepts: Vec<String> = b.except.iter().map(ToString::to_string).collect();
        let key = if excepts.is_empty() {
            cidr.to_string()
        } else {
            format!("{cidr} except {}", excepts.join(" "))
        };
        let name = names::block_set(&key);
        if !self.sets.contains_key(&name) {
            let elements = ranges(b)
                .into_iter()
                .map(|(lo, hi)| {
                    if lo == hi {
                        lo.to_string()
                    } else {
                        format!("{lo}-{hi}")
                    }
                })
                .collect();
            self.sets.insert(
                name.clone(),
                SetSpec {
                    type_: ADDR,
                    interval: true,
                    comment: key,
                    elements,
                },
            );
        }
        Some(name)
    }

    /// The set `pod address . protocol . port` of every pod's container port called `port`.
    fn port_set(&mut self, cluster: &Cluster, port: &str, reuse: Option<&Reuse<'_>>) -> String {
        let name = names::port_set(port);
        if !self.sets.contains_key(&name) {
            let entries = |pod: &Pod| {
                let mut out = Vec::new();
                for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                    for number in pod.named_ports(port, protocol) {
                        for ip in v4(&pod.ips) {
                            out.push(format!("{ip} . {} . {number}", proto_word(protocol)));
                        }
                    }
                }
                out
            };
            let elements = match reuse.and_then(|u| u.patch(&name, entries, |_| true)) {
                Some(elements) => elements,
                None => cluster.pods.iter().flat_map(entries).collect(),
            };
            self.sets.insert(
                name.clone(),
                SetSpec {
                    type_: ADDR_PROTO_PORT,
                    interval: false,
                    comment: format!("port {port}"),
                    elements,
                },
            );
        }
        name
    }
}

/// `cidr` minus every `except`, as inclusive address ranges in order (IPv4 blocks only).
pub fn ranges(b: &IpBlock) -> Vec<(Ipv4Addr, Ipv4Addr)> {
    let IpNet::V4(cidr) = b.cidr else {
        return Vec::new();
    };
    let (lo, hi) = (u32::from(cidr.network()), u32::from(cidr.broadcast()));
    let mut holes: Vec<(u32, u32)> = b
        .except
        .iter()
        .filter_map(|e| match e {
            IpNet::V4(e) => Some((u32::from(e.network()), u32::from(e.broadcast()))),
            IpNet::V6(_) => None,
        })
        .collect();
    holes.sort_unstable();
    let mut out = Vec::new();
    let mut next = Some(lo);
    for (hs, he) in holes {
        let Some(start) = next else { break };
        if he < start || hs > hi {
            continue;
        }
        if hs > start {
            out.push((start, hs - 1));
        }
        next = he.checked_add(1).filter(|n| *n <= hi);
    }
    if let Some(start) = next {
        out.push((start, hi));
    }
    out.into_iter()
        .map(|(a, b)| (Ipv4Addr::from(a), Ipv4Addr::from(b)))
        .collect()
}

/// Overlapping or adjacent ranges joined, in order.
fn merge(mut ranges: Vec<(u16, u16)>) -> Vec<(u16, u16)> {
    ranges.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::new();
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if u32::from(lo) <= u32::from(last.1) + 1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

fn ip_strings(p: &Pod) -> Vec<String> {
    v4(&p.ips).map(|ip| ip.to_string()).collect()
}

/// Renders one node's table again and again, reusing the previous render: when only pods
/// changed (the common case: a pod created, deleted, relabelled), each set keeps its elements
/// and only the changed pods are asked about, instead of every pod for every selector. The
/// result is always what [`render`] gives (tested against it).
#[derive(Debug)]
pub struct Renderer {
    node: String,
    opts: Options,
    prev: Option<(Cluster, Ruleset)>,
}

impl Renderer {
    pub fn new(node: &str, opts: Options) -> Self {
        Self {
            node: node.to_string(),
            opts,
            prev: None,
        }
    }

    /// The table for `cluster`.
    pub fn render(&mut self, cluster: &Cluster) -> Ruleset {
        let next = match &self.prev {
            Some((c, r)) if c.namespaces == cluster.namespaces => {
                let before: std::collections::HashMap<(&str, &str), &Pod> = c
                    .pods
                    .iter()
                    .map(|p| ((p.namespace.as_str(), p.name.as_str()), p))
                    .collect();
                let mut old = Vec::new();
                let mut new = Vec::new();
                let mut kept = std::collections::HashSet::new();
                for p in &cluster.pods {
                    let key = (p.namespace.as_str(), p.name.as_str());
                    match before.get(&key) {
                        Some(b) if *b == p => {}
                        Some(b) => {
                            old.push(*b);
                            new.push(p);
                        }
                        None => new.push(p),
                    }
                    kept.insert(key);
                }
                old.extend(
                    c.pods
                        .iter()
                        .filter(|p| !kept.contains(&(p.namespace.as_str(), p.name.as_str()))),
                );
                let reuse = Reuse {
                    prev: r,
                    old,
                    new,
                    policies_same: c.policies == cluster.policies,
                };
                render_with(cluster, &self.node, &self.opts, Some(&reuse))
            }
            _ => render(cluster, &self.node, &self.opts),
        };
        self.prev = Some((cluster.clone(), next.clone()));
        next
    }
}

/// An address set of pods' IPv4 addresses.
fn addresses<'a>(comment: String, pods: impl Iterator<Item = &'a Pod>) -> SetSpec {
    SetSpec {
        type_: ADDR,
        interval: false,
        comment,
        elements: pods
            .flat_map(|p| v4(&p.ips))
            .map(|ip| ip.to_string())
            .collect(),
    }
}

fn v4(ips: &[IpAddr]) -> impl Iterator<Item = Ipv4Addr> + '_ {
    ips.iter().filter_map(|ip| match ip {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    })
}

fn own_addr(dir: Direction) -> &'static str {
    match dir {
        Direction::Ingress => "daddr",
        Direction::Egress => "saddr",
    }
}

fn dir_word(dir: Direction) -> &'static str {
    match dir {
        Direction::Ingress => "ingress",
        Direction::Egress => "egress",
    }
}

fn proto_word(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// A selector in kubectl's syntax (`pod=a,ns in (x,y),!gone`), `{}` for the empty one.
fn describe(sel: &Selector) -> String {
    let mut parts: Vec<String> = sel.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for (k, op) in &sel.exprs {
        parts.push(match op {
            Op::In(vals) => format!("{k} in ({})", vals.join(",")),
            Op::NotIn(vals) => format!("{k} notin ({})", vals.join(",")),
            Op::Exists => k.clone(),
            Op::DoesNotExist => format!("!{k}"),
        });
    }
    if parts.is_empty() {
        "{}".into()
    } else {
        parts.join(",")
    }
}

impl fmt::Display for Ruleset {
    /// Canonical text (sets, then chains, by name), for snapshots and logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, s) in &self.sets {
            let flags = if s.interval { " flags interval ;" } else { "" };
            let elements: Vec<&str> = s.elements.iter().map(String::as_str).collect();
            writeln!(
                f,
                "set {name} {{ type {} ;{flags} # {}\n  {{ {} }}\n}}",
                s.type_,
                s.comment,
                elements.join(", ")
            )?;
        }
        for (name, c) in &self.chains {
            write!(f, "chain {name} {{")?;
            if let Some(b) = &c.base {
                write!(
                    f,
                    " type {} hook {} priority {} ;",
                    b.kind, b.hook, b.priority
                )?;
            }
            writeln!(f)?;
            for rule in &c.rules {
                writeln!(f, "  {rule}")?;
            }
            writeln!(f, "}}")?;
        }
        Ok(())
    }
}
