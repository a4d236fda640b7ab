//! The desired table of one node, a pure function of the evaluator's model
//! ([`svcnet_netpol::Cluster`]), the node's name and the family (`ip` or `ip6`).
//!
//! Layout (names in [`crate::names`]):
//!
//! ```text
//! egress-forward   hook forward prio 0: ct established,related accept; saddr vmap @egress-isolated
//! egress-input     hook input prio 110: the same, for a local pod's traffic to the node itself
//! egress-output    hook output  prio 0: the same, for a pod's connection IPVS sends on
//! ingress-forward  hook forward prio 1: ct established,related accept; daddr vmap @ingress-isolated
//! ingress-output   hook output  prio 1: the same after `fib saddr type local accept`
//! egress-/ingress-isolated: verdict maps, local isolated pod → jump out-ns-/in-ns-<its namespace>
//! out-ns-<ns>: saddr @pods-<target> jump out-<policy> ... (the namespace's policies); deny
//! in-ns-<ns>:  daddr @pods-<target> jump in-<policy> ...;  deny
//! out-/in-<policy>: one rule per (rule, peer, port kind): <peer address> <ports> accept
//! ```
//!
//! An `accept` ends only its base chain, so the egress and the ingress side are two base
//! chains and both must pass (NetworkPolicy's "both ends must agree"); a drop or reject in
//! either is final. Every base chain sits after the proxy's DNAT (nftables and iptables:
//! prerouting, priority -100, before forward and input; IPVS: at input, priority 99, and the
//! packet goes on from output), so a connection to a Service IP is judged by its destination
//! pod and target port. Traffic the node itself sends (from one of its own addresses) is let
//! through at output: the node exception. Pods are matched by address: selector sets
//! hold every matching pod of the cluster (a peer may be anywhere), the isolation maps only
//! this node's pods (each node judges its own pods' two sides). A policy isolates pods of its
//! own namespace only, so the dispatch is per namespace: creating a policy rewrites its
//! namespace's chain, a pod's isolation is one map element. The `ip6` table is the same for
//! the pods' IPv6 addresses and IPv6 blocks, with neighbour discovery let through (svcnet's
//! pod network is IPv4; the IPv6 table is proven on dual-stack test pods).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use svcnet_libnft::{BaseChain, Family};
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub deny: DenyAction,
    /// The table's family: `ip` (the pods' IPv4 addresses, IPv4 blocks) or `ip6` (their
    /// IPv6 addresses, IPv6 blocks). A dual-stack node runs one table of each.
    pub family: Family,
    /// Under a proxy that relays Service connections from its own sockets (the userspace
    /// proxy), the addresses the nodes' proxies connect to endpoints from. Such a proxy judges
    /// each connection itself (client → the endpoint it chose, with the evaluator), so the
    /// table leaves both legs to it: the client's leg, redirected to the proxy's listener on
    /// this node (`ct status dnat` at `egress-input`), and the proxy's leg, new connections
    /// from these sources (`ingress-forward`; from this node's own proxy the node exception
    /// already lets them in at `ingress-output`). Empty for the kernel proxies.
    pub proxy_sources: Vec<IpAddr>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            deny: DenyAction::default(),
            family: Family::Ip,
            proxy_sources: Vec::new(),
        }
    }
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    /// `ip` or `ip6`: the table is `<family> svcnet-netpol`.
    pub family: Family,
    pub sets: BTreeMap<String, SetSpec>,
    pub chains: BTreeMap<String, ChainSpec>,
}

/// The type of an address set.
fn addr_type(f: Family) -> &'static str {
    match f {
        Family::Ip => "ipv4_addr",
        Family::Ip6 => "ipv6_addr",
    }
}

/// The type of a named port's set.
fn addr_proto_port(f: Family) -> &'static str {
    match f {
        Family::Ip => "ipv4_addr . inet_proto . inet_service",
        Family::Ip6 => "ipv6_addr . inet_proto . inet_service",
    }
}

/// The addresses of `ips` in family `f`.
fn addrs(ips: &[IpAddr], f: Family) -> impl Iterator<Item = IpAddr> + '_ {
    ips.iter().copied().filter(move |ip| family_of(*ip) == f)
}

fn family_of(ip: IpAddr) -> Family {
    match ip {
        IpAddr::V4(_) => Family::Ip,
        IpAddr::V6(_) => Family::Ip6,
    }
}

/// A set a policy's rules use, named after what it stands for.
pub(crate) enum Want<'a> {
    /// The pods a selector peer (or a policy's `podSelector`) of a policy in `namespace` picks.
    Pods {
        key: String,
        namespace: &'a str,
        peer: &'a Peer,
    },
    /// An IPv4 `ipBlock`, as address ranges.
    Block { key: String, block: &'a IpBlock },
    /// Every pod's `address . protocol . port` of a named port.
    Port(&'a str),
}

impl Want<'_> {
    pub(crate) fn name(&self) -> String {
        match self {
            Want::Pods { key, .. } => names::pods_set(key),
            Want::Block { key, .. } => names::block_set(key),
            Want::Port(port) => names::port_set(port),
        }
    }

    /// The set, empty for pods and ports (its filler adds the elements).
    pub(crate) fn spec(&self, f: Family) -> SetSpec {
        match self {
            Want::Pods { key, .. } => SetSpec {
                type_: addr_type(f),
                interval: false,
                comment: key.clone(),
                elements: BTreeSet::new(),
            },
            Want::Block { key, block } => SetSpec {
                type_: addr_type(f),
                interval: true,
                comment: key.clone(),
                elements: block_ranges(block)
                    .into_iter()
                    .map(|(lo, hi)| {
                        if lo == hi {
                            lo.to_string()
                        } else {
                            format!("{lo}-{hi}")
                        }
                    })
                    .collect(),
            },
            Want::Port(port) => SetSpec {
                type_: addr_proto_port(f),
                interval: false,
                comment: format!("port {port}"),
                elements: BTreeSet::new(),
            },
        }
    }
}

/// The table for `node`, from scratch. Every policy of the cluster is rendered, not only
/// those selecting a pod here: a pod arriving on this node, or a label that brings a pod
/// under a policy, is then a set element change, never a new chain.
pub fn render(cluster: &Cluster, node: &str, opts: &Options) -> Ruleset {
    let f = opts.family;
    let mut r = Ruleset {
        family: f,
        sets: BTreeMap::new(),
        chains: BTreeMap::new(),
    };
    for dir in [Direction::Ingress, Direction::Egress] {
        let mut set = isolated_set(dir, f);
        set.elements = cluster
            .pods
            .iter()
            .filter(|p| {
                p.node.as_deref() == Some(node) && cluster.isolating(p, dir).next().is_some()
            })
            .flat_map(|p| isolation_elements(p, dir, f))
            .map(|(_, e)| e)
            .collect();
        r.sets.insert(isolated_name(dir).to_string(), set);
    }
    let mut policies: Vec<&Policy> = cluster.policies.iter().collect();
    policies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut need = |want: Want<'_>| -> String {
        let name = want.name();
        if !r.sets.contains_key(&name) {
            let mut set = want.spec(f);
            for pod in &cluster.pods {
                set.elements.extend(contribution(&want, pod, f, |ns| {
                    cluster.namespace_labels(ns)
                }));
            }
            r.sets.insert(name.clone(), set);
        }
        name
    };
    let mut chains = BTreeMap::new();
    for dir in [Direction::Egress, Direction::Ingress] {
        let mut dispatch: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for policy in policies.iter().filter(|p| p.isolates(dir)) {
            let (jump, chain, rules) = policy_chain(policy, dir, f, &mut need);
            dispatch.entry(&policy.namespace).or_default().push(jump);
            chains.insert(chain, ChainSpec { base: None, rules });
        }
        for (ns, jumps) in dispatch {
            let name = names::namespace_chain(dir == Direction::Ingress, ns);
            chains.insert(name, dispatch_chain(jumps, opts));
        }
    }
    r.chains = chains;
    base_chains(&mut r, opts);
    r
}

pub(crate) fn isolated_name(dir: Direction) -> &'static str {
    match dir {
        Direction::Ingress => names::INGRESS_ISOLATED,
        Direction::Egress => names::EGRESS_ISOLATED,
    }
}

pub(crate) fn isolated_set(dir: Direction, f: Family) -> SetSpec {
    SetSpec {
        type_: match f {
            Family::Ip => "ipv4_addr : verdict",
            Family::Ip6 => "ipv6_addr : verdict",
        },
        interval: false,
        comment: format!("this node's pods isolated for {}", dir_word(dir)),
        elements: BTreeSet::new(),
    }
}

/// The elements a local pod isolated for `dir` puts in that direction's verdict map, each
/// with its address: the address to a jump to its namespace's dispatch chain.
pub(crate) fn isolation_elements(pod: &Pod, dir: Direction, f: Family) -> Vec<(IpAddr, String)> {
    let chain = names::namespace_chain(dir == Direction::Ingress, &pod.namespace);
    addrs(&pod.ips, f)
        .map(|ip| (ip, format!("{ip} : jump {chain}")))
        .collect()
}

/// A namespace's dispatch chain: the policies' jumps, then the deny.
pub(crate) fn dispatch_chain(mut rules: Vec<String>, opts: &Options) -> ChainSpec {
    rules.push(match opts.deny {
        // ICMP for TCP too: a reset made after the proxy's DNAT leaves with the pod's
        // address, not the Service's, and the client never matches it (measured: the
        // connection timed out), while the ICMP error is translated with its conntrack entry.
        DenyAction::Reject => match opts.family {
            Family::Ip => "reject with icmp type admin-prohibited".into(),
            Family::Ip6 => "reject with icmpv6 type admin-prohibited".into(),
        },
        DenyAction::Drop => "drop".into(),
    });
    ChainSpec { base: None, rules }
}

/// The input chain's priority: after IPVS's hooks at input (98 and 99, `NF_IP_PRI_NAT_SRC`
/// − 2 and − 1), which take a packet to a virtual server away from the input path. So a pod's
/// connection to a Service IP in IPVS mode is not judged here as traffic to the node (its
/// destination then is still the Service IP); it is judged at output, after IPVS's DNAT.
pub const INPUT_PRIORITY: i32 = 110;

/// The base chains, the same in every table of a family. IPv6 needs neighbour discovery to
/// work at all (a pod resolving its gateway or a neighbour, with its own address as source):
/// it is accepted before any policy, as ARP is never seen by an `ip` table.
///
/// The output chains judge what the node sends on someone else's behalf: IPVS DNATs a
/// connection to a virtual server at input and sends it on from the output hook, so neither
/// end sees the forward hook. There a local pod's source address means the pod's egress is
/// judged, a local pod's destination its ingress, unless the source is one of the node's own
/// addresses (the node's own traffic, the node exception; with IPVS a node's connection to a
/// Service IP leaves with the Service IP, a local address, as its source).
fn base_chains(r: &mut Ruleset, opts: &Options) {
    let f = r.family;
    let proxies: Vec<String> = addrs(&opts.proxy_sources, f)
        .map(|ip| ip.to_string())
        .collect();
    let relayed = !opts.proxy_sources.is_empty();
    let base = |hook, priority, addr: &str, map: &str| {
        let mut rules = vec!["ct state established,related accept".to_string()];
        if f == Family::Ip6 {
            rules.push(
                "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert } accept"
                    .into(),
            );
        }
        if hook == "output" && addr == "daddr" {
            rules.push("fib saddr type local accept".into());
        }
        if relayed && hook == "input" {
            rules.push("ct status dnat accept comment \"to the proxy, which judges it\"".into());
        }
        if hook == "forward" && addr == "daddr" && !proxies.is_empty() {
            rules.push(format!(
                "{} saddr {{ {} }} accept comment \"from a node proxy, which judged it\"",
                f.as_str(),
                proxies.join(", ")
            ));
        }
        rules.push(format!("{} {addr} vmap @{map}", f.as_str()));
        ChainSpec {
            base: Some(BaseChain {
                kind: "filter",
                hook,
                priority,
            }),
            rules,
        }
    };
    let egress = |hook, priority| base(hook, priority, "saddr", names::EGRESS_ISOLATED);
    let ingress = |hook| base(hook, 1, "daddr", names::INGRESS_ISOLATED);
    r.chains
        .insert(names::EGRESS_FORWARD.into(), egress("forward", 0));
    r.chains
        .insert(names::EGRESS_INPUT.into(), egress("input", INPUT_PRIORITY));
    r.chains
        .insert(names::EGRESS_OUTPUT.into(), egress("output", 0));
    r.chains
        .insert(names::INGRESS_FORWARD.into(), ingress("forward"));
    r.chains
        .insert(names::INGRESS_OUTPUT.into(), ingress("output"));
}

/// What `pod` puts in a wanted set: its addresses when the selector picks it, its named
/// port's entries (pods and ports sets); nothing for blocks.
pub(crate) fn contribution<'a>(
    want: &Want<'_>,
    pod: &Pod,
    f: Family,
    namespace_labels: impl Fn(&str) -> &'a BTreeMap<String, String>,
) -> Vec<String> {
    match want {
        Want::Pods {
            namespace, peer, ..
        } => {
            if peer.selects(namespace, pod, namespace_labels(&pod.namespace)) {
                ip_strings(pod, f)
            } else {
                Vec::new()
            }
        }
        Want::Port(port) => port_entries(pod, port, f),
        Want::Block { .. } => Vec::new(),
    }
}

/// `address . protocol . port` of each of `pod`'s container ports called `port`.
fn port_entries(pod: &Pod, port: &str, f: Family) -> Vec<String> {
    port_candidates(pod, port, f)
        .into_iter()
        .map(|(_, e)| e)
        .collect()
}

fn port_candidates(pod: &Pod, port: &str, f: Family) -> Vec<(IpAddr, String)> {
    let mut out = Vec::new();
    for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
        for number in pod.named_ports(port, protocol) {
            for ip in addrs(&pod.ips, f) {
                let e = format!("{ip} . {} . {number}", proto_word(protocol));
                out.push((ip, e));
            }
        }
    }
    out
}

/// The elements `pod` could put in a set, each with the address it stands for, whether or
/// not the pod is selected: its addresses for an address set, its named port's entries for
/// a port set, nothing for a block.
pub(crate) fn candidates(want: &Want<'_>, pod: &Pod, f: Family) -> Vec<(IpAddr, String)> {
    match want {
        Want::Pods { .. } => addrs(&pod.ips, f).map(|ip| (ip, ip.to_string())).collect(),
        Want::Port(port) => port_candidates(pod, port, f),
        Want::Block { .. } => Vec::new(),
    }
}

/// One policy for `dir` (which it isolates): its dispatch rule, its chain's name and the
/// chain's rules, each (rule, peer, port kind) an `accept`. `need` names (and creates) the
/// sets the rules use.
pub(crate) fn policy_chain(
    policy: &Policy,
    dir: Direction,
    f: Family,
    need: &mut impl FnMut(Want<'_>) -> String,
) -> (String, String, Vec<String>) {
    let id = format!("{}/{}", policy.namespace, policy.name);
    let chain = names::policy_chain(dir == Direction::Ingress, &id);
    let target = Peer::Pods {
        pods: Some(policy.pod_selector.clone()),
        namespaces: None,
    };
    // The dispatch rule's set, named by jump_rule alike.
    need(pods_want(&policy.namespace, &target));
    let jump = jump_rule(policy, dir, f);
    let mut out = Vec::new();
    for rule in policy.rules(dir) {
        let peers: Vec<String> = if rule.peers.is_empty() {
            vec![String::new()]
        } else {
            rule.peers
                .iter()
                .filter_map(|peer| peer_match(policy, peer, dir, f, need))
                .collect()
        };
        let ports = port_matches(&rule.ports, f, need);
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
    (jump, chain, out)
}

/// A policy's rule in the dispatch chain of `dir`: its targets jump to its chain.
pub(crate) fn jump_rule(policy: &Policy, dir: Direction, f: Family) -> String {
    let id = format!("{}/{}", policy.namespace, policy.name);
    let chain = names::policy_chain(dir == Direction::Ingress, &id);
    let target = Peer::Pods {
        pods: Some(policy.pod_selector.clone()),
        namespaces: None,
    };
    let targets = pods_want(&policy.namespace, &target).name();
    format!(
        "{} {} @{targets} jump {chain} comment \"{id}\"",
        f.as_str(),
        own_addr(dir)
    )
}

/// The wanted set of a selector peer of a policy in `namespace`.
fn pods_want<'a>(namespace: &'a str, peer: &'a Peer) -> Want<'a> {
    let (pods, namespaces) = match peer {
        Peer::Pods { pods, namespaces } => (pods, namespaces),
        Peer::Block(_) => (&None, &None),
    };
    let key = format!(
        "{}, {}",
        match namespaces {
            None => format!("namespace {namespace}"),
            Some(sel) => format!("namespaces {}", describe(sel)),
        },
        match pods {
            None => "all pods".to_string(),
            Some(sel) => format!("pods {}", describe(sel)),
        }
    );
    Want::Pods {
        key,
        namespace,
        peer,
    }
}

/// The match on the other end's address; `None` when the peer can match no packet of the
/// table's family (a block of the other family, a peer with neither selector).
fn peer_match(
    policy: &Policy,
    peer: &Peer,
    dir: Direction,
    f: Family,
    need: &mut impl FnMut(Want<'_>) -> String,
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
        Peer::Pods { .. } => need(pods_want(&policy.namespace, peer)),
        Peer::Block(b) => need(block_want(b, f)?),
    };
    Some(format!("{} {addr} @{set}", f.as_str()))
}

/// The port matches of a rule, each alternative one entry (`""`: any port): numbered and
/// protocol-only entries in one anonymous set, each named port on its own (it resolves
/// per destination pod, through that name's set).
fn port_matches(
    ports: &[svcnet_netpol::Port],
    f: Family,
    need: &mut impl FnMut(Want<'_>) -> String,
) -> Vec<String> {
    if ports.is_empty() {
        return vec![String::new()];
    }
    let mut numbered: BTreeMap<Protocol, Vec<(u16, u16)>> = BTreeMap::new();
    let mut out = Vec::new();
    for p in ports {
        match &p.port {
            PortMatch::Any => numbered.entry(p.protocol).or_default().push((0, 65535)),
            PortMatch::Range(lo, hi) => numbered.entry(p.protocol).or_default().push((*lo, *hi)),
            PortMatch::Named(name) => {
                let set = need(Want::Port(name));
                out.push(format!(
                    "meta l4proto {} {} daddr . meta l4proto . th dport @{set}",
                    proto_word(p.protocol),
                    f.as_str()
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

/// The wanted set of an `ipBlock` (`cidr` minus `except`); `None` for a block of the other
/// family.
fn block_want(b: &IpBlock, f: Family) -> Option<Want<'_>> {
    let cidr = b.cidr;
    if family_of(cidr.addr()) != f {
        return None;
    }
    let excepts: Vec<String> = b.except.iter().map(ToString::to_string).collect();
    let key = if excepts.is_empty() {
        cidr.to_string()
    } else {
        format!("{cidr} except {}", excepts.join(" "))
    };
    Some(Want::Block { key, block: b })
}

/// `cidr` minus every `except`, as inclusive address ranges in order (IPv4 blocks only;
/// [`block_ranges`] for either family).
pub fn ranges(b: &IpBlock) -> Vec<(Ipv4Addr, Ipv4Addr)> {
    block_ranges(b)
        .into_iter()
        .filter_map(|r| match r {
            (IpAddr::V4(lo), IpAddr::V4(hi)) => Some((lo, hi)),
            _ => None,
        })
        .collect()
}

/// An address as a number (IPv4 in the low 32 bits).
fn number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// `cidr` minus every `except` (those of its family), as inclusive address ranges in order.
pub fn block_ranges(b: &IpBlock) -> Vec<(IpAddr, IpAddr)> {
    let span = |n: &IpNet| (number(n.network()), number(n.broadcast()));
    let (lo, hi) = span(&b.cidr);
    let f = family_of(b.cidr.addr());
    let mut holes: Vec<(u128, u128)> = b
        .except
        .iter()
        .filter(|e| family_of(e.addr()) == f)
        .map(span)
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
    let addr = |n: u128| match f {
        // In range: n comes from an IPv4 span.
        Family::Ip => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))),
        Family::Ip6 => IpAddr::V6(Ipv6Addr::from(n)),
    };
    out.into_iter().map(|(a, b)| (addr(a), addr(b))).collect()
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

fn ip_strings(p: &Pod, f: Family) -> Vec<String> {
    addrs(&p.ips, f).map(|ip| ip.to_string()).collect()
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
