//! The fixed part of the table: every set and map of a family, and the base chains whose
//! rules look them up (the dispatch rules in `services` and `affinity-record` depend only on
//! the node and on which [`Group`]s are in use). Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use ipnet::IpNet;
use svcnet_proxy::{DesiredNode, Masquerade, NODE_VERDICTS, NoEndpointsVerdict};

use crate::names::*;
use crate::render::{Group, Scope, scope_of};
use crate::tx::{BaseChain, Family, SetDef, SetKind};

/// The base (service-independent) part of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    /// Chains in creation order, with their hook (if a base chain) and rules.
    pub chains: Vec<(String, Option<BaseChain>, Vec<String>)>,
    pub sets: Vec<SetDef>,
}

pub(crate) fn nets(list: &[IpNet]) -> String {
    let v: Vec<String> = list.iter().map(|n| n.to_string()).collect();
    format!("{{ {} }}", v.join(", "))
}

pub(crate) fn hook(kind: &'static str, hook: &'static str, priority: i32) -> Option<BaseChain> {
    Some(BaseChain {
        kind,
        hook,
        priority,
    })
}

pub(crate) fn plain(name: impl Into<String>, type_: String) -> SetDef {
    SetDef {
        name: name.into(),
        kind: SetKind::Set,
        type_,
        flags: vec![],
        timeout_seconds: None,
        size: None,
        comment: None,
    }
}

pub(crate) fn map(name: impl Into<String>, type_: String) -> SetDef {
    SetDef {
        kind: SetKind::Map,
        ..plain(name, type_)
    }
}

/// The key expression of a scope: `ip daddr . meta l4proto . th dport` or `meta l4proto .
/// th dport`.
pub fn key_expr(family: Family, scope: Scope) -> String {
    if scope.is_node_port() {
        "meta l4proto . th dport".into()
    } else {
        format!("{} daddr . meta l4proto . th dport", family.as_str())
    }
}

pub(crate) fn key_type(family: Family, scope: Scope) -> String {
    format!("typeof {}", key_expr(family, scope))
}

/// Match for destinations that accept node-port traffic: any local address except loopback,
/// narrowed to `--nodeport-addresses` when given.
pub(crate) fn nodeport_daddr(family: Family, node: &DesiredNode) -> String {
    let ip = family.as_str();
    let loopback = match family {
        Family::Ip => "127.0.0.0/8",
        Family::Ip6 => "::1",
    };
    let mut m = format!("fib daddr type local {ip} daddr != {loopback}");
    if !node.nodeport_addresses.is_empty() {
        write!(m, " {ip} daddr {}", nets(&node.nodeport_addresses)).ok();
    }
    m
}

/// A scope's key match with its destination condition (node ports: local addresses).
pub(crate) fn scoped_key(family: Family, node: &DesiredNode, scope: Scope) -> String {
    if scope.is_node_port() {
        format!(
            "{} {}",
            nodeport_daddr(family, node),
            key_expr(family, scope)
        )
    } else {
        key_expr(family, scope)
    }
}

/// Masquerade decisions as data: the set a frontend goes into for each rule.
pub(crate) fn masquerade_set(node_port: bool, m: Masquerade) -> Option<String> {
    let np = if node_port { "np-" } else { "" };
    match m {
        Masquerade::Always => Some(format!("{np}masq-always")),
        Masquerade::OffCluster => Some(format!("{np}masq-off-cluster")),
        Masquerade::Never => None,
    }
}

/// Node-sourced traffic short-circuited under `externalTrafficPolicy: Local`.
pub(crate) fn local_source_set(node_port: bool) -> String {
    format!("{}masq-local-source", if node_port { "np-" } else { "" })
}

/// Refusals as data: `no-endpoint-*` when every source is refused (checked in input, forward
/// and output), `local-refuse-*` when pods and the node are short-circuited first (checked
/// after DNAT only, in input and forward).
pub(crate) fn refusal_set(node_port: bool, for_all: bool, v: NoEndpointsVerdict) -> String {
    let np = if node_port { "np-" } else { "" };
    let kind = if for_all {
        "no-endpoint"
    } else {
        "local-refuse"
    };
    let verdict = match v {
        NoEndpointsVerdict::Reject => "reject",
        NoEndpointsVerdict::Drop => "drop",
    };
    format!("{np}{kind}-{verdict}")
}

pub(crate) const VERDICTS: [NoEndpointsVerdict; 2] =
    [NoEndpointsVerdict::Reject, NoEndpointsVerdict::Drop];

pub(crate) fn verdict_word(v: NoEndpointsVerdict) -> &'static str {
    match v {
        NoEndpointsVerdict::Reject => "reject",
        NoEndpointsVerdict::Drop => "drop",
    }
}

/// The fixed sets and maps of one family.
pub fn base_sets(family: Family) -> Vec<SetDef> {
    let addr = family.addr_type();
    let ip = family.as_str();
    let svc = key_type(family, Scope::Service);
    let np = key_type(family, Scope::NodePort);
    let mut sets = vec![plain(CLUSTER_IPS, addr.into())];
    for (scope, proto) in Scope::ALL
        .into_iter()
        .flat_map(|s| PROTOCOLS.map(|p| (s, p)))
    {
        // `numgen` has no named type; the modulus in `typeof` is only a label, and the same
        // map serves every slot expression (`jhash` yields the same 32-bit integer). One map
        // per protocol: its value is typed `<proto> dport`, which makes every rule looking it
        // up match that protocol; `th dport` would serve all, but nft 1.0.6 cannot compile a
        // rule against such a map once it has loaded its cache ("conflicting protocols
        // specified: ip vs. th"), which any delete or flush makes it do.
        sets.push(map(
            scope.backends(proto),
            format!(
                "{} . numgen random mod 1 : {ip} daddr . {proto} dport",
                key_type(family, scope)
            ),
        ));
    }
    for node_port in [false, true] {
        let key = if node_port { &np } else { &svc };
        for m in [Masquerade::Always, Masquerade::OffCluster] {
            if let Some(name) = masquerade_set(node_port, m) {
                sets.push(plain(name, key.clone()));
            }
        }
        sets.push(plain(local_source_set(node_port), key.clone()));
        for for_all in [true, false] {
            for v in VERDICTS {
                sets.push(plain(refusal_set(node_port, for_all, v), key.clone()));
            }
        }
    }
    sets.push(plain(FIREWALL, svc.clone()));
    let mut allow = plain(FIREWALL_ALLOW, format!("{svc} . {ip} saddr"));
    allow.flags = vec!["interval"];
    sets.push(allow);
    sets.push(plain(HAIRPIN, format!("typeof {ip} saddr . {ip} daddr")));
    for scope in Scope::ALL {
        sets.push(map(scope.affinity_map(), scope.verdict_key(family)));
    }
    sets
}

/// Whether a set is filled from the packet path (kept across resyncs, never flushed).
pub fn is_dynamic(s: &SetDef) -> bool {
    s.flags.contains(&"dynamic")
}

pub(crate) const MARK: &str = "meta mark set meta mark | 0x4000";

/// The dispatch rules of `services` (nat prerouting and output) for the groups in use.
pub(crate) fn services_rules(
    family: Family,
    node: &DesiredNode,
    groups: &BTreeSet<Group>,
) -> Vec<String> {
    let ip = family.as_str();
    let cidrs = (!node.cluster_cidrs.is_empty()).then(|| nets(&node.cluster_cidrs));
    let mut rules = Vec::new();
    for node_port in [false, true] {
        let k = scoped_key(family, node, scope_of(node_port, false));
        if let Some(set) = masquerade_set(node_port, Masquerade::Always) {
            rules.push(format!("{k} @{set} {MARK}"));
        }
        if let (Some(c), Some(set)) = (&cidrs, masquerade_set(node_port, Masquerade::OffCluster)) {
            rules.push(format!("{ip} saddr != {c} {k} @{set} {MARK}"));
        }
        rules.push(format!(
            "fib saddr type local {k} @{} {MARK}",
            local_source_set(node_port)
        ));
    }
    // Short-circuits first: their frontends also sit in their Local pool's groups.
    for scope in Scope::ALL {
        let sources: Vec<String> = if scope.is_short_circuit() {
            cidrs
                .iter()
                .map(|c| format!("{ip} saddr {c} "))
                .chain(["fib saddr type local ".to_string()])
                .collect()
        } else {
            vec![String::new()]
        };
        let k = scoped_key(family, node, scope);
        let bare = key_expr(family, scope);
        // A client pinned by affinity goes to its endpoint (the lookup chain of the port's
        // pool in this scope; only affinity frontends have an element).
        for src in &sources {
            rules.push(format!("{src}{k} vmap @{}", scope.affinity_map()));
        }
        for g in groups {
            let rule = match g {
                Group::Choice {
                    scope: s,
                    slot,
                    len,
                    proto,
                } if *s == scope => format!(
                    "meta l4proto {proto} {k} @{} dnat {ip} to {bare} . {} map @{}",
                    g.set_name(),
                    slot.expr(family, *len),
                    scope.backends(proto)
                ),
                Group::RoundRobin(s) if *s == scope => {
                    format!("{k} vmap @{}", scope.round_robin_map())
                }
                _ => continue,
            };
            for src in &sources {
                rules.push(format!("{src}{rule}"));
            }
        }
    }
    rules
}

/// The affinity record rules: after DNAT, a new connection of an affinity frontend (by its
/// original destination) jumps to its port's record chain, which records (or refreshes) the
/// client's pin.
pub(crate) fn record_rules(family: Family, groups: &BTreeSet<Group>) -> Vec<String> {
    let ip = family.as_str();
    let mut rules = Vec::new();
    for g in groups {
        let Group::Affinity { node_port, proto } = g else {
            continue;
        };
        // `ct original proto-dst` needs the protocol fixed earlier in the rule.
        let head = format!("meta l4proto {proto} ct state new ct status dnat");
        rules.push(if *node_port {
            format!(
                "{head} ct original {ip} daddr != @{CLUSTER_IPS} meta l4proto . ct original proto-dst vmap @{}",
                g.set_name()
            )
        } else {
            format!(
                "{head} ct original {ip} daddr . meta l4proto . ct original proto-dst vmap @{}",
                g.set_name()
            )
        });
    }
    rules
}

/// The refusal checks (filter hooks): `for_all` only, or the Local-policy ones too.
pub(crate) fn refusal_rules(family: Family, node: &DesiredNode, local_too: bool) -> Vec<String> {
    let mut rules = Vec::new();
    for node_port in [false, true] {
        let k = scoped_key(family, node, scope_of(node_port, false));
        for for_all in [true, false] {
            if !for_all && !local_too {
                continue;
            }
            for v in VERDICTS {
                rules.push(format!(
                    "{k} @{} {}",
                    refusal_set(node_port, for_all, v),
                    verdict_word(v)
                ));
            }
        }
    }
    rules
}

/// The base chains, maps and sets of one family, with the dispatch rules of `groups`.
pub fn base(family: Family, node: &DesiredNode, groups: &BTreeSet<Group>) -> Base {
    let ip = family.as_str();
    let mut sets = base_sets(family);
    let mut group_sets: BTreeMap<String, SetDef> = BTreeMap::new();
    for g in groups {
        group_sets
            .entry(g.set_name())
            .or_insert_with(|| g.set_def(family));
    }
    sets.extend(group_sets.into_values());
    let svc = key_expr(family, Scope::Service);
    // The node-wide verdicts, decided in the core: an unknown port on a cluster IP, then an
    // unallocated address of a service CIDR.
    let mut cluster_ips_check = vec![format!(
        "{ip} daddr @{CLUSTER_IPS} {}",
        verdict_word(NODE_VERDICTS.unknown_port)
    )];
    if !node.service_cidrs.is_empty() {
        cluster_ips_check.push(format!(
            "{ip} daddr {} {}",
            nets(&node.service_cidrs),
            verdict_word(NODE_VERDICTS.unallocated_service_ip)
        ));
    }
    let chains = vec![
        (
            MASQUERADING_CHAIN.to_string(),
            None,
            vec![
                format!("meta mark & {MASQUERADE_MARK:#x} == 0 return"),
                format!("meta mark set meta mark ^ {MASQUERADE_MARK:#x}"),
                "masquerade fully-random".into(),
            ],
        ),
        (
            SERVICES_CHAIN.into(),
            None,
            services_rules(family, node, groups),
        ),
        (
            AFFINITY_RECORD_CHAIN.into(),
            None,
            record_rules(family, groups),
        ),
        (
            "firewall-check".into(),
            None,
            vec![format!(
                "{svc} @{FIREWALL} {svc} . {ip} saddr != @{FIREWALL_ALLOW} drop"
            )],
        ),
        (
            "endpoints-check".into(),
            None,
            refusal_rules(family, node, true),
        ),
        (
            "output-endpoints-check".into(),
            None,
            refusal_rules(family, node, false),
        ),
        ("cluster-ips-check".into(), None, cluster_ips_check),
        (
            "filter-prerouting".into(),
            hook("filter", "prerouting", -110),
            vec!["ct state new jump firewall-check".into()],
        ),
        (
            "filter-input".into(),
            hook("filter", "input", -110),
            vec!["ct state new jump endpoints-check".into()],
        ),
        (
            "filter-forward".into(),
            hook("filter", "forward", -110),
            vec![
                "ct state invalid drop".into(),
                "ct state new jump endpoints-check".into(),
                "ct state new jump cluster-ips-check".into(),
            ],
        ),
        (
            "filter-output".into(),
            hook("filter", "output", -110),
            vec![
                "ct state new jump output-endpoints-check".into(),
                "ct state new jump firewall-check".into(),
            ],
        ),
        (
            "filter-output-post-dnat".into(),
            hook("filter", "output", -90),
            vec!["ct state new jump cluster-ips-check".into()],
        ),
        (
            "affinity-prerouting".into(),
            hook("filter", "prerouting", -99),
            vec![format!("jump {AFFINITY_RECORD_CHAIN}")],
        ),
        (
            "affinity-output".into(),
            hook("filter", "output", -99),
            vec![format!("jump {AFFINITY_RECORD_CHAIN}")],
        ),
        (
            "nat-prerouting".into(),
            hook("nat", "prerouting", -100),
            vec![format!("jump {SERVICES_CHAIN}")],
        ),
        (
            "nat-output".into(),
            hook("nat", "output", -100),
            vec![format!("jump {SERVICES_CHAIN}")],
        ),
        (
            "nat-postrouting".into(),
            hook("nat", "postrouting", 100),
            vec![
                format!("jump {MASQUERADING_CHAIN}"),
                format!(
                    "ct status dnat {ip} saddr . {ip} daddr @{HAIRPIN} masquerade fully-random"
                ),
            ],
        ),
    ];
    Base { chains, sets }
}
