//! Rendering the decided graph into nft objects, data-only: the fixed base ([`base`]: sets,
//! maps and the few base chains, whose dispatch rules depend only on the node and on which
//! [`Group`]s are in use) and one [`Fragment`] per service port ([`service_fragment`]): the
//! elements it puts into the shared sets and maps. Pure.
//!
//! A new connection to a frontend (`daddr . l4proto . dport`, or `l4proto . dport` for node
//! ports) is DNATed by one rule per group, `<frontend> @<group set> dnat to <frontend> .
//! <slot> map @backends`, where the group fixes the slot expression and its modulus
//! (`numgen random mod n` for n endpoints; `jhash …` for sh/dh/maglev) and `backends` maps
//! `frontend . slot` to the endpoint. Masquerade, refusals, source ranges, hairpin and
//! affinity are data sets looked up by fixed rules. Only round robin keeps a chain per
//! service port (see `choice.rs`). So a service or endpoint change is element updates, and
//! only a group coming into or out of use rewrites the (small) dispatch chains.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use svcnet_lb::{Algorithm, Dataplane, Fallback, Resolution};
use svcnet_proxy::{
    Affinity, Capability, DesiredEndpoint, DesiredNode, DesiredServicePort, Frontend, Pool,
    ServiceGraph, Target, lower,
};

pub use crate::base::{Base, base, base_sets, is_dynamic, key_expr};
use crate::base::{key_type, local_source_set, map, masquerade_set, plain, refusal_set};
use crate::choice::{Slot, algorithm_plan, choose};
use crate::names::*;
use crate::tx::{Family, SetDef};

/// Where a frontend's choice is dispatched: its key form and backends map, and for the
/// `externalTrafficPolicy: Local` short-circuit, the source conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// IP frontends (cluster, external, load-balancer IPs): key `daddr . l4proto . dport`.
    Service,
    /// Node ports: key `l4proto . dport` on the node's node-port addresses.
    NodePort,
    /// IP frontends' short-circuit (pods and the node to the cluster pool).
    ShortCircuit,
    /// Node ports' short-circuit.
    NodePortShortCircuit,
}

impl Scope {
    pub const ALL: [Scope; 4] = [
        Scope::ShortCircuit,
        Scope::NodePortShortCircuit,
        Scope::Service,
        Scope::NodePort,
    ];

    pub fn prefix(self) -> &'static str {
        match self {
            Scope::Service => "svc",
            Scope::NodePort => "np",
            Scope::ShortCircuit => "sc",
            Scope::NodePortShortCircuit => "np-sc",
        }
    }

    pub fn is_node_port(self) -> bool {
        matches!(self, Scope::NodePort | Scope::NodePortShortCircuit)
    }

    pub(crate) fn is_short_circuit(self) -> bool {
        matches!(self, Scope::ShortCircuit | Scope::NodePortShortCircuit)
    }

    /// The map `frontend . slot → endpoint address . port` of this scope and protocol.
    pub fn backends(self, proto: &str) -> String {
        match self {
            Scope::Service => format!("backends-{proto}"),
            s => format!("{}-backends-{proto}", s.prefix()),
        }
    }

    /// The verdict map `frontend → goto <round-robin chain>` of this scope.
    pub fn round_robin_map(self) -> String {
        format!("{}-rr", self.prefix())
    }

    /// The verdict map `frontend → jump <affinity lookup chain>` of this scope: the lookup
    /// chain of the pool this scope's route uses.
    pub fn affinity_map(self) -> String {
        format!("{}-aff", self.prefix())
    }

    /// The verdict-map key type of this scope's frontends.
    pub(crate) fn verdict_key(self, family: Family) -> String {
        if self.is_node_port() {
            "inet_proto . inet_service : verdict".to_string()
        } else {
            format!(
                "{} . inet_proto . inet_service : verdict",
                family.addr_type()
            )
        }
    }
}

/// A dispatch rule in use: present in the table while some service port needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    /// `meta l4proto <proto> <scope key> @<set> dnat to <key> . <slot expr mod len> map
    /// @<backends-proto>` (the set is shared by the protocols).
    Choice {
        scope: Scope,
        slot: Slot,
        len: usize,
        proto: &'static str,
    },
    /// `<scope key> vmap @<scope>-rr`: per-service round-robin chains.
    RoundRobin(Scope),
    /// Records new connections of affinity frontends of this protocol (after DNAT, keyed by
    /// the original frontend) through `aff-record` / `np-aff-record`.
    Affinity {
        node_port: bool,
        proto: &'static str,
    },
}

impl Group {
    /// The set or map the group's rule looks up.
    pub fn set_name(&self) -> String {
        match self {
            Group::Choice {
                scope, slot, len, ..
            } => format!("{}-{}{len}", scope.prefix(), slot.short()),
            Group::RoundRobin(scope) => scope.round_robin_map(),
            Group::Affinity { node_port, .. } => affinity_record_map(*node_port).to_string(),
        }
    }

    pub(crate) fn set_def(&self, family: Family) -> SetDef {
        match self {
            Group::Choice { scope, .. } => plain(self.set_name(), key_type(family, *scope)),
            Group::RoundRobin(scope) => map(self.set_name(), scope.verdict_key(family)),
            Group::Affinity { node_port, .. } => map(
                self.set_name(),
                scope_of(*node_port, false).verdict_key(family),
            ),
        }
    }
}

/// Endpoint counts whose random-choice groups stay in the table while no service port uses
/// them (for TCP and UDP service IPs): a service whose endpoint count moves within 1..=this
/// changes elements only. A group coming into use rewrites the dispatch chain, and a commit
/// that adds a DNAT rule makes the kernel validate the whole table (about 30 ms at 30k
/// services); each standing group costs a new connection one more rule to pass (a protocol
/// compare and a lookup in an empty set, S3).
pub const STANDING_LEN: usize = 8;

/// The groups kept in use whatever the services: random choice over 1..=[`STANDING_LEN`]
/// endpoints of TCP and UDP service IPs, and the affinity record rules of TCP and UDP (IP
/// frontends and node ports), so the first service to switch ClientIP affinity on adds its
/// own chains and elements only (its rewrite of the dispatch chains took 30–90 ms at 30k).
/// A record rule costs a new DNATed connection one lookup in the `aff-record` verdict map.
pub fn standing_groups() -> impl Iterator<Item = Group> {
    let choices = (1..=STANDING_LEN).flat_map(|len| {
        ["tcp", "udp"].map(|proto| Group::Choice {
            scope: Scope::Service,
            slot: Slot::Random,
            len,
            proto,
        })
    });
    let records = [false, true]
        .into_iter()
        .flat_map(|node_port| ["tcp", "udp"].map(|proto| Group::Affinity { node_port, proto }));
    choices.chain(records)
}

/// The verdict map `original frontend → jump <affinity record chain>`.
pub fn affinity_record_map(node_port: bool) -> &'static str {
    if node_port {
        NP_AFFINITY_RECORD
    } else {
        AFFINITY_RECORD
    }
}

pub(crate) fn scope_of(node_port: bool, short_circuit: bool) -> Scope {
    match (node_port, short_circuit) {
        (false, false) => Scope::Service,
        (true, false) => Scope::NodePort,
        (false, true) => Scope::ShortCircuit,
        (true, true) => Scope::NodePortShortCircuit,
    }
}

/// An element of a shared set or map. A comment (nft keeps it in the kernel and lists it)
/// names the frontend on group elements, so `svcnet trace` can say which service it is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Element {
    pub set: String,
    pub key: String,
    pub comment: Option<String>,
    pub value: Option<String>,
}

impl Element {
    /// The key as `add element` writes it (with the comment).
    pub fn key_text(&self) -> String {
        match &self.comment {
            Some(c) => format!("{} comment \"{c}\"", self.key),
            None => self.key.clone(),
        }
    }
}

/// A client pinned by ClientIP affinity to `endpoint` lives in the service port's `map` (one
/// per pool); the dataplane deletes such entries once the pair is gone (see `affinity.rs`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AffinityPair {
    pub map: String,
    pub endpoint: String,
}

/// Everything one service port contributes to the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragment {
    /// Chains owned by the port and their rules: round robin's, and affinity's lookup and
    /// record chains.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Maps owned by the port: its affinity maps (dynamic, kept across resyncs).
    pub sets: BTreeMap<String, SetDef>,
    /// Elements of the shared sets and maps (shared ones, e.g. `cluster-ips`, `hairpin`,
    /// are reference-counted by the planner).
    pub elements: BTreeSet<Element>,
    /// The dispatch groups the port needs.
    pub groups: BTreeSet<Group>,
    /// Affinity frontends with each endpoint they may pin a client to.
    pub affinity: BTreeSet<AffinityPair>,
    /// The port's load-balancing algorithm could not be expressed; endpoints are chosen at
    /// random instead, and the runtime reports this (log and Event), never silently.
    pub fallback: Option<Fallback>,
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

fn pool_word(pool: Pool) -> &'static str {
    match pool {
        Pool::Cluster => "cluster",
        Pool::Local => "local",
    }
}

/// The frontend's key and how `svcnet trace` names it.
fn frontend_key(proto: &str, fe: &Frontend<'_>) -> (bool, String, &'static str) {
    let tuple = |ip: &IpAddr, port: &u16| format!("{ip} . {proto} . {port}");
    match fe {
        Frontend::ClusterIp(ip, port) => (false, tuple(ip, port), "cluster IP"),
        Frontend::ExternalIp(ip, port) => (false, tuple(ip, port), "external IP"),
        Frontend::LoadBalancer {
            ip,
            port,
            source_ranges,
        } => (
            false,
            tuple(ip, port),
            if source_ranges.is_empty() {
                "load-balancer IP"
            } else {
                "load-balancer IP (with loadBalancerSourceRanges)"
            },
        ),
        Frontend::NodePort(np) => (true, format!("{proto} . {np}"), "node port"),
    }
}

/// Renders one service port from its decided graph.
pub fn service_fragment(family: Family, d: &DesiredServicePort, node: &DesiredNode) -> Fragment {
    let g = lower(d, node, &NftCapability);
    let proto = d.protocol.as_str();
    let mut f = Fragment {
        fallback: g.fallback.clone(),
        ..Fragment::default()
    };
    let elem = |f: &mut Fragment, set: String, key: String, value: Option<String>| {
        f.elements.insert(Element {
            set,
            key,
            comment: None,
            value,
        });
    };
    elem(&mut f, CLUSTER_IPS.into(), d.cluster_ip.to_string(), None);
    for ep in g.endpoints() {
        elem(&mut f, HAIRPIN.into(), format!("{0} . {0}", ep.ip), None);
    }
    for fe in &g.frontends {
        let (node_port, key, kind) = frontend_key(proto, fe);
        let route = g.route_of(fe);
        let comment = format!("{kind} of {}", d.name);
        if let Frontend::LoadBalancer { source_ranges, .. } = fe
            && !source_ranges.is_empty()
        {
            elem(&mut f, FIREWALL.into(), key.clone(), None);
            for r in source_ranges.iter() {
                elem(&mut f, FIREWALL_ALLOW.into(), format!("{key} . {r}"), None);
            }
        }
        if let Some(v) = route.refused_for_all() {
            elem(&mut f, refusal_set(node_port, true, v), key, None);
            continue;
        }
        let mut pools = Vec::new();
        match route.target {
            Target::Pool { pool, masquerade } => {
                if let Some(set) = masquerade_set(node_port, masquerade) {
                    elem(&mut f, set, key.clone(), None);
                }
                pools.push((scope_of(node_port, false), pool));
            }
            Target::Refuse(v) => elem(&mut f, refusal_set(node_port, false, v), key.clone(), None),
        }
        if let Some(pool) = route.short_circuit {
            elem(&mut f, local_source_set(node_port), key.clone(), None);
            pools.push((scope_of(node_port, true), pool));
        }
        for (scope, pool) in pools {
            let Some(eps) = g.pool(pool) else { continue };
            choose(
                family,
                &g,
                eps,
                (scope, proto),
                pool_word(pool),
                &key,
                &comment,
                &mut f,
            );
            if let Some(a) = g.affinity {
                let lookup = affinity_object(pool_word(pool), a.key);
                elem(
                    &mut f,
                    scope.affinity_map(),
                    key.clone(),
                    Some(format!("jump {lookup}")),
                );
            }
        }
        if let Some(a) = g.affinity {
            let record = affinity_object("rec", a.key);
            let set = affinity_record_map(node_port).to_string();
            elem(&mut f, set, key.clone(), Some(format!("jump {record}")));
            f.groups.insert(Group::Affinity { node_port, proto });
        }
    }
    if let Some(a) = g.affinity {
        affinity_objects(family, &g, a, &mut f);
    }
    f
}

/// The port's affinity objects (see `names::affinity_object`): per pool in use, its map and
/// lookup chain; and the record chain, which records a new connection's endpoint into the map
/// of every pool holding that endpoint, so a pin is only ever followed to an endpoint of the
/// pool the connection's route uses (as kube-proxy's `recent` checks in each pool chain).
fn affinity_objects(family: Family, g: &ServiceGraph<'_>, a: Affinity<'_>, f: &mut Fragment) {
    let ip = family.as_str();
    let proto = g.port.protocol.as_str();
    let mut record = Vec::new();
    for (pool, eps) in &g.pools {
        let name = affinity_object(pool_word(*pool), a.key);
        let mut m = map(
            name.clone(),
            format!("typeof {ip} saddr : {ip} daddr . {proto} dport"),
        );
        m.flags = vec!["dynamic", "timeout"];
        m.size = Some(AFFINITY_SIZE);
        f.sets.insert(name.clone(), m);
        f.chains.insert(
            name.clone(),
            vec![format!(
                "meta l4proto {proto} dnat {ip} to {ip} saddr map @{name}"
            )],
        );
        let members: BTreeSet<String> = eps
            .iter()
            .map(|e| format!("{} . {}", e.ip, e.port))
            .collect();
        record.push(format!(
            "meta l4proto {proto} {ip} daddr . th dport {{ {} }} update @{name} {{ {ip} saddr timeout {}s : {ip} daddr . th dport }}",
            members.iter().cloned().collect::<Vec<_>>().join(", "),
            a.timeout
        ));
        for endpoint in members {
            f.affinity.insert(AffinityPair {
                map: name.clone(),
                endpoint,
            });
        }
    }
    f.chains.insert(affinity_object("rec", a.key), record);
}
