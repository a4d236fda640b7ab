//! Rendering the desired state into nft objects: the fixed base chains, sets and maps
//! ([`base`]) and one [`Fragment`] per service port ([`service_fragment`]). Pure.
//!
//! Layout (see README.md for the hook contract): `nat-prerouting`/`nat-output` jump to
//! `services`, which dispatches through the `service-ips` verdict map keyed by
//! `daddr . l4proto . dport` and, for local destinations, the `service-nodeports` map keyed by
//! `l4proto . dport`. Each service port has a `service-…` chain (Cluster policy) and/or a
//! `local-…` chain (Local policy) choosing an `endpoint-…` chain with the port's algorithm
//! (`numgen random` by default; `numgen inc` or `jhash` slot maps, see `endpoint_choice`); the
//! endpoint chain marks hairpin traffic for masquerade and DNATs. External traffic goes
//! through `external-…` (masquerade for Cluster policy, short-circuits for Local policy).
//! Services without endpoints are rejected or dropped in filter hooks via the
//! `no-endpoint-*` maps; `firewall-ips` enforces source ranges before DNAT.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_lb::{Algorithm, Dataplane, Fallback, Resolution};
use svcnet_proxy::{
    Capability, DesiredEndpoint, DesiredNode, DesiredServicePort, Frontend, Masquerade,
    NODE_VERDICTS, NoEndpointsVerdict, Pool, Route, ServiceGraph, ServicePortName, Target, lower,
};

use crate::choice::{algorithm_plan, policy_chain};
use crate::names::*;
use crate::tx::{BaseChain, Family, Op, SetDef, SetKind};

/// An element of a named set or map owned by one service port: in a shared map, or in the
/// port's own endpoints map.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Element {
    pub set: Cow<'static, str>,
    pub key: String,
    pub value: Option<String>,
}

/// Everything one service port contributes to the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragment {
    /// Regular chains owned by the port and their rules.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Sets and maps owned by the port: affinity sets (dynamic; never flushed, so affinity
    /// survives resyncs) and endpoints verdict maps (flushed on resync).
    pub sets: BTreeMap<String, SetDef>,
    /// Elements in the shared maps and sets, and in the port's endpoints maps.
    pub elements: BTreeSet<Element>,
    /// The port's load-balancing algorithm could not be expressed; endpoints are chosen at
    /// random instead, and the runtime reports this (log and Event), never silently.
    pub fallback: Option<Fallback>,
}

/// The base (service-independent) part of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    /// Chains in creation order, with their hook (if a base chain) and rules.
    pub chains: Vec<(String, Option<BaseChain>, Vec<String>)>,
    pub sets: Vec<SetDef>,
}

pub(crate) fn ip_kw(family: Family) -> &'static str {
    family.as_str()
}

pub(crate) fn nets(list: &[IpNet]) -> String {
    let v: Vec<String> = list.iter().map(|n| n.to_string()).collect();
    format!("{{ {} }}", v.join(", "))
}

pub(crate) fn ip_literal(ip: IpAddr) -> String {
    ip.to_string()
}

fn hook(kind: &'static str, hook: &'static str, priority: i32) -> Option<BaseChain> {
    Some(BaseChain {
        kind,
        hook,
        priority,
    })
}

/// Up to this many endpoints a service chain picks one with a `numgen` cascade; above it, with
/// one `numgen random mod N vmap @<chain>-endpoints` lookup (O(1) per new connection for large
/// services) in a named map: an anonymous one would cost O(sets in the table) to load.
pub const CASCADE_MAX: usize = 8;

/// Match for destinations that accept node-port traffic: any local address except loopback,
/// narrowed to `--nodeport-addresses` when given.
fn nodeport_daddr(family: Family, node: &DesiredNode) -> String {
    let ip = ip_kw(family);
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

/// The shared sets and maps of the base (they depend on the family only).
pub fn base_sets(family: Family) -> Vec<SetDef> {
    let addr = family.addr_type();
    let map = |name: &str, type_: String, comment: &str| SetDef {
        name: name.to_string(),
        kind: SetKind::Map,
        type_,
        flags: vec![],
        timeout_seconds: None,
        comment: Some(comment.to_string()),
    };
    vec![
        SetDef {
            name: CLUSTER_IPS.into(),
            kind: SetKind::Set,
            type_: addr.into(),
            flags: vec![],
            timeout_seconds: None,
            comment: Some("active cluster IPs".into()),
        },
        map(
            SERVICE_IPS,
            format!("{addr} . inet_proto . inet_service : verdict"),
            "service IP . proto . port to service chain",
        ),
        map(
            SERVICE_NODEPORTS,
            "inet_proto . inet_service : verdict".into(),
            "proto . node port to external chain",
        ),
        map(
            NO_ENDPOINT_SERVICES,
            format!("{addr} . inet_proto . inet_service : verdict"),
            "service IP . proto . port without endpoints",
        ),
        map(
            NO_ENDPOINT_NODEPORTS,
            "inet_proto . inet_service : verdict".into(),
            "proto . node port without endpoints",
        ),
        map(
            FIREWALL_IPS,
            format!("{addr} . inet_proto . inet_service : verdict"),
            "load-balancer IPs with source ranges",
        ),
    ]
}

/// The base chains, maps and sets of one family.
pub fn base(family: Family, node: &DesiredNode) -> Base {
    let ip = ip_kw(family);
    let sets = base_sets(family);
    let tuple = format!("{ip} daddr . meta l4proto . th dport");
    let np = nodeport_daddr(family, node);
    // The node-wide verdicts, decided in the core: an unknown port on a cluster IP, then an
    // unallocated address of a service CIDR.
    let mut cluster_ips_check = vec![format!(
        "{ip} daddr @{CLUSTER_IPS} {}",
        node_verdict(NODE_VERDICTS.unknown_port)
    )];
    if !node.service_cidrs.is_empty() {
        cluster_ips_check.push(format!(
            "{ip} daddr {} {}",
            nets(&node.service_cidrs),
            node_verdict(NODE_VERDICTS.unallocated_service_ip)
        ));
    }
    let chains = vec![
        (
            MARK_FOR_MASQUERADE.to_string(),
            None,
            vec![format!("meta mark set meta mark | {MASQUERADE_MARK:#x}")],
        ),
        (
            "masquerading".into(),
            None,
            vec![
                format!("meta mark & {MASQUERADE_MARK:#x} == 0 return"),
                format!("meta mark set meta mark ^ {MASQUERADE_MARK:#x}"),
                "masquerade fully-random".into(),
            ],
        ),
        (REJECT_CHAIN.into(), None, vec!["reject".into()]),
        (
            "services".into(),
            None,
            vec![
                format!("{tuple} vmap @{SERVICE_IPS}"),
                format!("{np} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"),
            ],
        ),
        (
            "firewall-check".into(),
            None,
            vec![format!("{tuple} vmap @{FIREWALL_IPS}")],
        ),
        (
            "service-endpoints-check".into(),
            None,
            vec![format!("{tuple} vmap @{NO_ENDPOINT_SERVICES}")],
        ),
        (
            "nodeport-endpoints-check".into(),
            None,
            vec![format!(
                "{np} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
            )],
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
            vec![
                "ct state new jump nodeport-endpoints-check".into(),
                "ct state new jump service-endpoints-check".into(),
            ],
        ),
        (
            "filter-forward".into(),
            hook("filter", "forward", -110),
            vec![
                "ct state invalid drop".into(),
                "ct state new jump service-endpoints-check".into(),
                "ct state new jump cluster-ips-check".into(),
            ],
        ),
        (
            "filter-output".into(),
            hook("filter", "output", -110),
            vec![
                "ct state new jump service-endpoints-check".into(),
                "ct state new jump firewall-check".into(),
            ],
        ),
        (
            "filter-output-post-dnat".into(),
            hook("filter", "output", -90),
            vec!["ct state new jump cluster-ips-check".into()],
        ),
        (
            "nat-prerouting".into(),
            hook("nat", "prerouting", -100),
            vec!["jump services".into()],
        ),
        (
            "nat-output".into(),
            hook("nat", "output", -100),
            vec!["jump services".into()],
        ),
        (
            "nat-postrouting".into(),
            hook("nat", "postrouting", 100),
            vec!["jump masquerading".into()],
        ),
    ];
    Base { chains, sets }
}

/// Ops creating the whole base from scratch (into an empty table).
pub fn base_ops(base: &Base, ops: &mut Vec<Op>, flush: bool) {
    for s in &base.sets {
        ops.push(Op::AddSet(s.clone()));
        if flush {
            ops.push(Op::FlushSet {
                name: s.name.clone(),
                kind: s.kind,
            });
        }
    }
    for (name, hook, rules) in &base.chains {
        ops.push(Op::AddChain {
            name: name.clone(),
            base: hook.clone(),
        });
        if flush {
            ops.push(Op::FlushChain(name.clone()));
        }
        for r in rules {
            ops.push(Op::AddRule {
                chain: name.clone(),
                rule: r.clone(),
            });
        }
    }
}

fn verdict_value(v: NoEndpointsVerdict) -> String {
    match v {
        NoEndpointsVerdict::Reject => format!("goto {REJECT_CHAIN}"),
        NoEndpointsVerdict::Drop => "drop".into(),
    }
}

/// The node-wide verdicts as rule statements (in the filter hooks, `reject` answers at once).
fn node_verdict(v: NoEndpointsVerdict) -> &'static str {
    match v {
        NoEndpointsVerdict::Reject => "reject",
        NoEndpointsVerdict::Drop => "drop",
    }
}

/// What nftables can express: `svcnet_lb`'s table for it, and random when a lookup table
/// (Maglev's) cannot be built for a pool's endpoints.
pub struct NftCapability;

impl Capability for NftCapability {
    fn resolve(
        &self,
        requested: Option<Algorithm>,
        pools: &[&[DesiredEndpoint]],
        affinity: bool,
    ) -> Resolution {
        let r = svcnet_lb::resolve(requested, Dataplane::Nftables);
        if r.algorithm == Algorithm::Random
            || pools
                .iter()
                .all(|eps| algorithm_plan(r.algorithm, eps, affinity).is_ok())
        {
            return r;
        }
        Resolution {
            algorithm: Algorithm::Random,
            fallback: Some(Fallback {
                requested: requested.unwrap_or(Algorithm::Random),
                used: Algorithm::Random,
                dataplane: Dataplane::Nftables,
                why: "its lookup table could not be built for these endpoints",
            }),
        }
    }
}

/// The policy chain of a pool.
fn pool_chain(spn: &ServicePortName, pool: Pool) -> String {
    match pool {
        Pool::Cluster => service_chain(spn),
        Pool::Local => local_chain(spn),
    }
}

/// The key of a frontend in `service-ips` / `no-endpoint-services`, or in
/// `service-nodeports` / `no-endpoint-nodeports`.
fn frontend_element(
    proto: &str,
    fe: &Frontend<'_>,
    to_service: &'static str,
    refused: bool,
) -> (&'static str, String) {
    let tuple = |addr: IpAddr, port: u16| format!("{} . {proto} . {port}", ip_literal(addr));
    match (fe, refused) {
        (Frontend::NodePort(np), false) => (SERVICE_NODEPORTS, format!("{proto} . {np}")),
        (Frontend::NodePort(np), true) => (NO_ENDPOINT_NODEPORTS, format!("{proto} . {np}")),
        (
            Frontend::ClusterIp(ip, port)
            | Frontend::ExternalIp(ip, port)
            | Frontend::LoadBalancer { ip, port, .. },
            refused,
        ) => (
            if refused {
                NO_ENDPOINT_SERVICES
            } else {
                to_service
            },
            tuple(*ip, *port),
        ),
    }
}

/// Rules of a route that is not refused for everyone: the short-circuit for pods and the node
/// (node-sourced traffic masqueraded), then the target (masqueraded when `Always`).
fn route_rules(
    family: Family,
    g: &ServiceGraph<'_>,
    route: &Route,
    node: &DesiredNode,
) -> Vec<String> {
    let ip = ip_kw(family);
    let spn = &g.port.name;
    let mut rules = Vec::new();
    if let Some(pool) = route.short_circuit {
        let chain = pool_chain(spn, pool);
        if !node.cluster_cidrs.is_empty() {
            rules.push(format!(
                "{ip} saddr {} goto {chain}",
                nets(&node.cluster_cidrs)
            ));
        }
        rules.push(format!("fib saddr type local jump {MARK_FOR_MASQUERADE}"));
        rules.push(format!("fib saddr type local goto {chain}"));
    }
    match route.target {
        Target::Pool { pool, masquerade } => {
            match masquerade {
                Masquerade::Always => rules.push(format!("jump {MARK_FOR_MASQUERADE}")),
                Masquerade::OffCluster => rules.push(format!(
                    "{ip} saddr != {} jump {MARK_FOR_MASQUERADE}",
                    nets(&node.cluster_cidrs)
                )),
                Masquerade::Never => {}
            }
            rules.push(format!("goto {}", pool_chain(spn, pool)));
        }
        Target::Refuse(v) => rules.push(verdict_value(v)),
    }
    rules
}

/// Renders one service port from its decided graph.
pub fn service_fragment(family: Family, d: &DesiredServicePort, node: &DesiredNode) -> Fragment {
    let g = lower(d, node, &NftCapability);
    let ip = ip_kw(family);
    let spn = &d.name;
    let proto = d.protocol.as_str();
    let mut f = Fragment {
        fallback: g.fallback.clone(),
        ..Fragment::default()
    };
    let mut elem = |set: &'static str, key: String, value: Option<String>| {
        f.elements.insert(Element {
            set: Cow::Borrowed(set),
            key,
            value,
        });
    };
    let tuple = |addr: IpAddr, port: u16| format!("{} . {proto} . {port}", ip_literal(addr));

    elem(CLUSTER_IPS, ip_literal(d.cluster_ip), None);

    // Frontends: each to its route, or to its refusal when everyone is refused. Internal
    // traffic goes straight to its pool's chain (whose first rule is the masquerade check);
    // external traffic through the port's external chain.
    let mut external_used = false;
    for fe in &g.frontends {
        let route = g.route_of(fe);
        let (set, key) =
            frontend_element(proto, fe, SERVICE_IPS, route.refused_for_all().is_some());
        let value = match (route.refused_for_all(), fe.is_external()) {
            (Some(v), _) => verdict_value(v),
            (None, false) => match route.target {
                Target::Pool { pool, .. } => format!("goto {}", pool_chain(spn, pool)),
                Target::Refuse(v) => verdict_value(v),
            },
            (None, true) => {
                external_used = true;
                format!("goto {}", external_chain(spn))
            }
        };
        elem(set, key, Some(value));
        if let Frontend::LoadBalancer {
            ip: lb,
            port,
            source_ranges,
        } = fe
            && !source_ranges.is_empty()
        {
            let fw = firewall_chain(spn);
            elem(FIREWALL_IPS, tuple(*lb, *port), Some(format!("goto {fw}")));
            f.chains.insert(
                fw,
                vec![format!("{ip} saddr != {} drop", nets(source_ranges))],
            );
        }
    }
    if external_used && let Some(route) = &g.external {
        f.chains
            .insert(external_chain(spn), route_rules(family, &g, route, node));
    }

    // Policy chains of the used pools, then their endpoints' chains.
    let internal = g.internal_pool();
    for (pool, eps) in &g.pools {
        let chain = pool_chain(spn, *pool);
        let masquerade = internal.filter(|(p, _)| p == pool).map(|(_, m)| m);
        let rules = policy_chain(family, &g, node, eps, masquerade, &chain, &mut f);
        f.chains.insert(chain, rules);
    }
    for ep in g.endpoints() {
        let mut rules = vec![format!(
            "{ip} saddr {} jump {MARK_FOR_MASQUERADE}",
            ip_literal(ep.ip)
        )];
        if let Some(timeout) = g.affinity {
            let set = affinity_set(spn, ep);
            rules.push(format!("update @{set} {{ {ip} saddr }}"));
            f.sets.insert(
                set.clone(),
                SetDef {
                    name: set,
                    kind: SetKind::Set,
                    type_: family.addr_type().into(),
                    flags: vec!["dynamic", "timeout"],
                    timeout_seconds: Some(timeout),
                    comment: None,
                },
            );
        }
        let dest = match ep.ip {
            IpAddr::V4(a) => format!("{a}:{}", ep.port),
            IpAddr::V6(a) => format!("[{a}]:{}", ep.port),
        };
        rules.push(format!("meta l4proto {proto} dnat to {dest}"));
        f.chains.insert(endpoint_chain(spn, ep), rules);
    }
    f
}
