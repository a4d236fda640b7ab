//! Rendering the desired state into iptables rules: the fixed chains, hooks and rules
//! ([`base`], [`hooks`]) and one [`Fragment`] per service port ([`service_fragment`]). Pure.
//!
//! Layout (kube-proxy's, see README.md): nat `SVCNET-SERVICES` (from PREROUTING and OUTPUT)
//! holds one rule per frontend — cluster IP → `SVCNET-SVC-…` (or `SVCNET-SVL-…` for
//! `internalTrafficPolicy: Local`), external IP → `SVCNET-EXT-…`, load-balancer IP →
//! `SVCNET-FW-…` (with source ranges) or `SVCNET-EXT-…` — and, last, a jump to
//! `SVCNET-NODEPORTS` for local destinations. A policy chain picks an endpoint chain
//! `SVCNET-SEP-…` with `-m statistic --mode random --probability` 1/n, 1/(n-1), …, after
//! `-m recent --rcheck` rules for ClientIP affinity; the endpoint chain marks hairpin traffic
//! and DNATs. Nothing is dropped in nat: frontends without endpoints are not DNATed and are
//! rejected or dropped by the filter table's `SVCNET-SERVICES` / `SVCNET-EXTERNAL-SERVICES`
//! (which see the post-DNAT destination, so only un-DNATed packets match), and source-range
//! misses by `SVCNET-PROXY-FIREWALL`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_proxy::{
    Capability, DesiredEndpoint, DesiredNode, DesiredServicePort, Frontend, Masquerade,
    NODE_VERDICTS, NoEndpointsVerdict, Pool, ServiceGraph, Target, lower,
};

use svcnet_lb::{Algorithm, Dataplane, Fallback, Resolution};

use crate::names::*;
use crate::payload::{Family, Hook, Rule, Table};

/// Everything one service port contributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragment {
    /// nat chains owned by the port (`SVC`, `SVL`, `EXT`, `FW`, `SEP`) and their rules.
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// Rules in the shared chains (`SVCNET-SERVICES`, `SVCNET-NODEPORTS`, …), per table.
    pub shared: Vec<(Table, Rule)>,
    /// The port's algorithm could not be expressed (the graph's fallback): its rules choose
    /// at random, and the runtime reports this once per render.
    pub fallback: Option<Fallback>,
}

/// The shared chains, per table, in declaration order. Their rules are rewritten on every
/// sync, as kube-proxy rewrites its top-level chains.
pub fn base_chains() -> Vec<(Table, &'static str)> {
    vec![
        (Table::Mangle, CANARY),
        (Table::Filter, CANARY),
        (Table::Filter, SERVICES),
        (Table::Filter, EXTERNAL_SERVICES),
        (Table::Filter, CLUSTER_IPS),
        (Table::Filter, NODEPORTS),
        (Table::Filter, FORWARD),
        (Table::Filter, PROXY_FIREWALL),
        (Table::Nat, CANARY),
        (Table::Nat, SERVICES),
        (Table::Nat, NODEPORTS),
        (Table::Nat, POSTROUTING),
        (Table::Nat, MARK_MASQ),
        (Table::Nat, MASQ_OFF_CLUSTER),
    ]
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn comment(c: impl Into<String>) -> Vec<String> {
    vec!["-m".into(), "comment".into(), "--comment".into(), c.into()]
}

fn rule(chain: &str, parts: Vec<Vec<String>>) -> Rule {
    Rule::new(chain, parts.concat())
}

/// The jumps from the built-in chains, in the order they end up in each built-in chain.
pub fn hooks() -> Vec<Hook> {
    let new = s(&["-m", "conntrack", "--ctstate", "NEW"]);
    let hook = |table, chain, extra: &[String], text: &str, target: &str| Hook {
        table,
        chain,
        rule: rule(
            "",
            vec![
                extra.to_vec(),
                comment(text),
                vec!["-j".into(), target.into()],
            ],
        ),
    };
    let fw = "svcnet load balancer firewall";
    let portals = "svcnet service portals";
    let external = "svcnet externally-visible service portals";
    vec![
        hook(Table::Filter, "INPUT", &new, fw, PROXY_FIREWALL),
        hook(
            Table::Filter,
            "INPUT",
            &[],
            "svcnet health check service ports",
            NODEPORTS,
        ),
        hook(Table::Filter, "INPUT", &new, external, EXTERNAL_SERVICES),
        hook(Table::Filter, "FORWARD", &new, fw, PROXY_FIREWALL),
        hook(
            Table::Filter,
            "FORWARD",
            &[],
            "svcnet forwarding rules",
            FORWARD,
        ),
        hook(Table::Filter, "FORWARD", &new, portals, SERVICES),
        hook(Table::Filter, "FORWARD", &new, external, EXTERNAL_SERVICES),
        hook(Table::Filter, "OUTPUT", &new, fw, PROXY_FIREWALL),
        hook(Table::Filter, "OUTPUT", &new, portals, SERVICES),
        hook(Table::Nat, "PREROUTING", &[], portals, SERVICES),
        hook(Table::Nat, "OUTPUT", &[], portals, SERVICES),
        hook(
            Table::Nat,
            "POSTROUTING",
            &[],
            "svcnet postrouting rules",
            POSTROUTING,
        ),
    ]
}

/// Rules of the shared chains that do not depend on services and come before the services'
/// rules.
pub fn base_rules(node: &DesiredNode) -> Vec<(Table, Rule)> {
    let mark = format!("{MASQUERADE_MARK}/{MASQUERADE_MARK}");
    let mut out = vec![
        // Without tcp_be_liberal, INVALID packets would reset connections (k/k #74839).
        (
            Table::Filter,
            rule(
                FORWARD,
                vec![s(&[
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "INVALID",
                    "-j",
                    "DROP",
                ])],
            ),
        ),
        (
            Table::Filter,
            rule(
                FORWARD,
                vec![
                    comment("svcnet forwarding rules"),
                    s(&["-m", "mark", "--mark", &mark, "-j", "ACCEPT"]),
                ],
            ),
        ),
        (
            Table::Filter,
            rule(
                FORWARD,
                vec![
                    comment("svcnet forwarding conntrack rule"),
                    s(&[
                        "-m",
                        "conntrack",
                        "--ctstate",
                        "RELATED,ESTABLISHED",
                        "-j",
                        "ACCEPT",
                    ]),
                ],
            ),
        ),
        (
            Table::Nat,
            rule(
                POSTROUTING,
                vec![s(&["-m", "mark", "!", "--mark", &mark, "-j", "RETURN"])],
            ),
        ),
        // Clear the mark so a packet re-traversing the stack is not masqueraded twice.
        (
            Table::Nat,
            rule(
                POSTROUTING,
                vec![s(&["-j", "MARK", "--xor-mark", MASQUERADE_MARK])],
            ),
        ),
        (
            Table::Nat,
            rule(
                POSTROUTING,
                vec![
                    comment("svcnet service traffic requiring SNAT"),
                    s(&["-j", "MASQUERADE", "--random-fully"]),
                ],
            ),
        ),
        (
            Table::Nat,
            rule(
                MARK_MASQ,
                vec![s(&["-j", "MARK", "--or-mark", MASQUERADE_MARK])],
            ),
        ),
    ];
    if node.cluster_cidrs.len() > 1 {
        for cidr in &node.cluster_cidrs {
            out.push((
                Table::Nat,
                rule(
                    MASQ_OFF_CLUSTER,
                    vec![s(&["-s", &cidr.to_string(), "-j", "RETURN"])],
                ),
            ));
        }
        out.push((
            Table::Nat,
            rule(MASQ_OFF_CLUSTER, vec![s(&["-j", MARK_MASQ])]),
        ));
    }
    out
}

/// Rules of the shared chains that must come after every service's rules.
pub fn tail_rules(family: Family, node: &DesiredNode) -> Vec<(Table, Rule)> {
    let mut out = Vec::new();
    let note = comment("svcnet service nodeports; NOTE: this must be the last rule in this chain");
    if node.nodeport_addresses.is_empty() {
        out.push((
            Table::Nat,
            rule(
                SERVICES,
                vec![
                    note,
                    s(&[
                        "-m",
                        "addrtype",
                        "--dst-type",
                        "LOCAL",
                        "!",
                        "-d",
                        family.loopback(),
                    ]),
                    s(&["-j", NODEPORTS]),
                ],
            ),
        ));
    } else {
        for cidr in &node.nodeport_addresses {
            out.push((
                Table::Nat,
                rule(
                    SERVICES,
                    vec![
                        note.clone(),
                        s(&[
                            "-d",
                            &cidr.to_string(),
                            "-m",
                            "addrtype",
                            "--dst-type",
                            "LOCAL",
                        ]),
                        s(&["-j", NODEPORTS]),
                    ],
                ),
            ));
        }
    }
    // Traffic to the service CIDR that no frontend DNATed gets the node-wide verdicts,
    // decided in the core: SVCNET-CLUSTER-IPS rejects the allocated cluster IPs (an unknown
    // port; each service port adds its cluster IP), and drops the rest of the CIDR. It is
    // never routed onward. Only traffic to a service CIDR walks that list (with no CIDR
    // configured, all traffic does).
    let to_check = |dst: Option<&IpNet>| {
        let mut m = vec![comment(
            "svcnet unknown port or unallocated service IP; NOTE: this must be the last rule in this chain",
        )];
        if let Some(cidr) = dst {
            m.push(s(&["-d", &cidr.to_string()]));
        }
        m.push(s(&["-j", CLUSTER_IPS]));
        (Table::Filter, rule(SERVICES, m))
    };
    if node.service_cidrs.is_empty() {
        out.push(to_check(None));
    }
    for cidr in &node.service_cidrs {
        out.push(to_check(Some(cidr)));
        out.push((
            Table::Filter,
            rule(
                CLUSTER_IPS,
                vec![
                    comment("svcnet unallocated service IP"),
                    s(&[
                        "-d",
                        &cidr.to_string(),
                        "-j",
                        verdict_target(NODE_VERDICTS.unallocated_service_ip),
                    ]),
                ],
            ),
        ));
    }
    out
}

fn verdict_target(v: NoEndpointsVerdict) -> &'static str {
    match v {
        NoEndpointsVerdict::Reject => "REJECT",
        NoEndpointsVerdict::Drop => "DROP",
    }
}

fn verdict_comment(name: &str, v: NoEndpointsVerdict) -> String {
    match v {
        NoEndpointsVerdict::Reject => format!("{name} has no endpoints"),
        NoEndpointsVerdict::Drop => format!("{name} has no local endpoints"),
    }
}

/// kube-proxy's probability formatting (`%0.10f`).
pub fn probability(p: f64) -> String {
    format!("{p:.10}")
}

fn addr(ip: IpAddr) -> String {
    ip.to_string()
}

/// Most slots `-m cluster` hashes into (the kernel's `XT_CLUSTER_NODES_MAX`).
pub const CLUSTER_SLOTS: usize = 32;
/// Longest weighted round-robin cycle rendered as an nth cascade (one rule per position);
/// larger weight sums are scaled down.
pub const MAX_CYCLE: u64 = 1024;

fn weights(eps: &[DesiredEndpoint]) -> Vec<u32> {
    eps.iter().map(|e| e.weight).collect()
}

/// What iptables can express: what `svcnet-lb` says, and also random instead of source
/// hashing when a pool has more hash slots than `-m cluster` can tell apart.
pub struct IptablesCapability;

impl Capability for IptablesCapability {
    fn resolve(
        &self,
        requested: Option<Algorithm>,
        pools: &[&[DesiredEndpoint]],
        _affinity: bool,
    ) -> Resolution {
        let r = svcnet_lb::resolve(requested, Dataplane::Iptables);
        let too_many = |eps: &&[DesiredEndpoint]| {
            svcnet_lb::select::hash_slots(&weights(eps)).len() > CLUSTER_SLOTS
        };
        if r.algorithm == Algorithm::SourceHash && pools.iter().any(too_many) {
            return Resolution {
                algorithm: Algorithm::Random,
                fallback: Some(Fallback {
                    requested: Algorithm::SourceHash,
                    used: Algorithm::Random,
                    dataplane: Dataplane::Iptables,
                    why: "-m cluster hashes into at most 32 slots and this service has more endpoints",
                }),
            };
        }
        r
    }
}

/// The chain choosing among `eps`: the masquerade check for cluster-IP traffic (`internal`:
/// this pool serves internal traffic, with this rule), affinity checks, then the choice, by
/// the port's resolved algorithm:
///
/// - random (the default): the statistic cascade; endpoint `i` of `n` is taken with
///   probability w_i / (w_i + … + w_n), so each gets w_i / Σw (1/n for equal weights);
/// - `rr` and `wrr`: one rule per position of the (weighted) round-robin cycle, each taking
///   one in every `len - position` new connections that reach it by its own counter
///   (`--mode nth --every …`), so connections follow the cycle exactly;
/// - `sh`: `-m cluster`, which hashes the connection's source address into the slots of
///   [`svcnet_lb::select::hash_slots`]; each endpoint's rule matches its slots.
///
/// The last rule matches unconditionally.
fn policy_chain(
    chain: &str,
    g: &ServiceGraph<'_>,
    node: &DesiredNode,
    eps: &[DesiredEndpoint],
    internal: Option<Masquerade>,
) -> Vec<Rule> {
    let d = g.port;
    let name = port_name(&d.name);
    let proto = d.protocol.as_str();
    let mut rules = Vec::new();
    let m = || {
        vec![
            comment(format!("{name} cluster IP")),
            s(&["-m", proto, "-p", proto, "-d", &addr(d.cluster_ip)]),
            s(&["--dport", &d.port.to_string()]),
        ]
    };
    match internal {
        Some(Masquerade::Always) => {
            rules.push(rule(chain, [m(), vec![s(&["-j", MARK_MASQ])]].concat()))
        }
        Some(Masquerade::OffCluster) => {
            let tail = match node.cluster_cidrs.as_slice() {
                [one] => s(&["!", "-s", &one.to_string(), "-j", MARK_MASQ]),
                _ => s(&["-j", MASQ_OFF_CLUSTER]),
            };
            rules.push(rule(chain, [m(), vec![tail]].concat()));
        }
        Some(Masquerade::Never) | None => {}
    }
    if let Some(a) = g.affinity {
        for ep in eps {
            let sep = endpoint_chain(&d.name, ep);
            let list = affinity_list(a.key, ep);
            rules.push(rule(
                chain,
                vec![
                    comment(format!("{name} -> {}", endpoint_string(ep.ip, ep.port))),
                    s(&["-m", "recent", "--name", &list, "--rcheck", "--seconds"]),
                    s(&[&a.timeout.to_string(), "--reap", "-j", &sep]),
                ],
            ));
        }
    }
    // Each endpoint's rule in order, with the match that takes its share; the last rule
    // drops its match and takes whatever reaches it.
    let random = || -> Vec<(usize, Vec<String>)> {
        let shares: Vec<u64> = eps.iter().map(|e| u64::from(e.weight.max(1))).collect();
        (0..eps.len())
            .map(|i| {
                let rest: u64 = shares[i..].iter().sum();
                let p = probability(shares[i] as f64 / rest as f64);
                let m = s(&["-m", "statistic", "--mode", "random", "--probability", &p]);
                (i, m)
            })
            .collect()
    };
    let choices: Vec<(usize, Vec<String>)> = match g.algorithm {
        a @ (Algorithm::RoundRobin | Algorithm::WeightedRoundRobin) => {
            let cycle = if a == Algorithm::RoundRobin {
                (0..eps.len()).collect()
            } else {
                svcnet_lb::select::wrr_schedule_within(&weights(eps), MAX_CYCLE)
            };
            // Each rule counts the new connections that reach it and takes one in every
            // len - k of them: connection j of every len goes to cycle[j], in turn.
            let len = cycle.len();
            cycle
                .into_iter()
                .enumerate()
                .map(|(k, i)| {
                    let every = (len - k).to_string();
                    let m = s(&[
                        "-m",
                        "statistic",
                        "--mode",
                        "nth",
                        "--every",
                        &every,
                        "--packet",
                        "0",
                    ]);
                    (i, m)
                })
                .collect()
        }
        Algorithm::SourceHash => {
            let slots = svcnet_lb::select::hash_slots(&weights(eps));
            // nftables' `sh` seed: `-m cluster` computes the same jhash of the source address
            // and scales it the same way, so both dataplanes pick the same endpoint for a
            // client.
            let seed = format!("{:#010x}", svcnet_lb::hash::SEED_SOURCE);
            (0..eps.len())
                .filter(|i| slots.contains(i))
                .map(|i| {
                    let mask: u32 = slots
                        .iter()
                        .enumerate()
                        .filter(|(_, owner)| **owner == i)
                        .fold(0, |m, (slot, _)| m | (1 << slot));
                    let m = s(&[
                        "-m",
                        "cluster",
                        "--cluster-total-nodes",
                        &slots.len().to_string(),
                        "--cluster-local-nodemask",
                        &format!("{mask:#x}"),
                        "--cluster-hash-seed",
                        &seed,
                    ]);
                    (i, m)
                })
                .collect()
        }
        _ => random(),
    };
    // No endpoint with a weight leaves a cycle or hash slots empty: the random cascade then.
    let choices = if choices.is_empty() {
        random()
    } else {
        choices
    };
    let last = choices.len().saturating_sub(1);
    for (k, (i, m)) in choices.into_iter().enumerate() {
        let ep = &eps[i];
        let mut parts = vec![comment(format!(
            "{name} -> {}",
            endpoint_string(ep.ip, ep.port)
        ))];
        if k < last {
            parts.push(m);
        }
        parts.push(s(&["-j", &endpoint_chain(&d.name, ep)]));
        rules.push(rule(chain, parts));
    }
    rules
}

/// The policy chain of a pool.
fn pool_chain(spn: &svcnet_proxy::ServicePortName, pool: Pool) -> String {
    match pool {
        Pool::Cluster => service_chain(spn),
        Pool::Local => local_chain(spn),
    }
}

/// Renders one service port from its decided graph.
pub fn service_fragment(d: &DesiredServicePort, node: &DesiredNode) -> Fragment {
    let g = lower(d, node, &IptablesCapability);
    let spn = &d.name;
    let name = port_name(spn);
    let proto = d.protocol.as_str();
    let mut f = Fragment {
        fallback: g.fallback.clone(),
        ..Fragment::default()
    };
    let pm = || s(&["-m", proto, "-p", proto]);
    let frontend = |ip: IpAddr, port: u16| s(&["-d", &addr(ip), "--dport", &port.to_string()]);
    let jump = |t: &str| s(&["-j", t]);
    let ext = external_chain(spn);
    let fw = firewall_chain(spn);
    // External traffic is DNATed through the external chain unless everyone is refused; a
    // refusal of the rest (Local policy, no local endpoint) is the filter table's, which sees
    // only what no rule DNATed.
    let ext_used = g.external.is_some_and(|r| r.refused_for_all().is_none());
    let ext_refusal = g.external.and_then(|r| r.target.refusal());
    let refuse = |f: &mut Fragment, chain: &str, m: Vec<Vec<String>>, v: NoEndpointsVerdict| {
        let parts = [
            vec![comment(verdict_comment(&name, v))],
            m,
            vec![jump(verdict_target(v))],
        ];
        f.shared.push((Table::Filter, rule(chain, parts.concat())));
    };

    for fe in &g.frontends {
        match *fe {
            Frontend::ClusterIp(ip, port) => {
                match g.internal.target {
                    Target::Pool { pool, .. } => f.shared.push((
                        Table::Nat,
                        rule(
                            SERVICES,
                            vec![
                                comment(format!("{name} cluster IP")),
                                pm(),
                                frontend(ip, port),
                                jump(&pool_chain(spn, pool)),
                            ],
                        ),
                    )),
                    Target::Refuse(v) => {
                        refuse(&mut f, SERVICES, vec![pm(), frontend(ip, port)], v)
                    }
                }
                // Other ports of this cluster IP: the node-wide verdict.
                f.shared.push((
                    Table::Filter,
                    rule(
                        CLUSTER_IPS,
                        vec![
                            comment(format!("{name} cluster IP, other ports")),
                            s(&["-d", &addr(ip)]),
                            jump(verdict_target(NODE_VERDICTS.unknown_port)),
                        ],
                    ),
                ));
            }
            Frontend::ExternalIp(ip, port) => {
                if ext_used {
                    f.shared.push((
                        Table::Nat,
                        rule(
                            SERVICES,
                            vec![
                                comment(format!("{name} external IP")),
                                pm(),
                                frontend(ip, port),
                                jump(&ext),
                            ],
                        ),
                    ));
                }
                if let Some(v) = ext_refusal {
                    refuse(&mut f, EXTERNAL_SERVICES, vec![pm(), frontend(ip, port)], v);
                }
            }
            Frontend::LoadBalancer {
                ip,
                port,
                source_ranges,
            } => {
                let uses_fw = ext_used && !source_ranges.is_empty();
                if ext_used {
                    let target = if uses_fw { &fw } else { &ext };
                    f.shared.push((
                        Table::Nat,
                        rule(
                            SERVICES,
                            vec![
                                comment(format!("{name} loadbalancer IP")),
                                pm(),
                                frontend(ip, port),
                                jump(target),
                            ],
                        ),
                    ));
                }
                if uses_fw {
                    f.shared.push((
                        Table::Filter,
                        rule(
                            PROXY_FIREWALL,
                            vec![
                                comment(format!("{name} traffic not accepted by {fw}")),
                                pm(),
                                frontend(ip, port),
                                jump("DROP"),
                            ],
                        ),
                    ));
                    // The firewall chain: allowed sources continue to the external chain; the
                    // rest is not DNATed and so is dropped by SVCNET-PROXY-FIREWALL.
                    let mut rules: Vec<Rule> = source_ranges
                        .iter()
                        .map(|r: &IpNet| {
                            rule(
                                &fw,
                                vec![
                                    comment(format!("{name} loadbalancer IP")),
                                    s(&["-s", &r.to_string()]),
                                    jump(&ext),
                                ],
                            )
                        })
                        .collect();
                    rules.push(rule(
                        &fw,
                        vec![comment(format!(
                            "other traffic to {name} will be dropped by {PROXY_FIREWALL}"
                        ))],
                    ));
                    f.chains.insert(fw.clone(), rules);
                }
                if let Some(v) = ext_refusal {
                    refuse(&mut f, EXTERNAL_SERVICES, vec![pm(), frontend(ip, port)], v);
                }
            }
            Frontend::NodePort(np) => {
                let np = np.to_string();
                if ext_used {
                    f.shared.push((
                        Table::Nat,
                        rule(
                            NODEPORTS,
                            vec![
                                comment(name.clone()),
                                pm(),
                                s(&["--dport", &np]),
                                jump(&ext),
                            ],
                        ),
                    ));
                }
                if let Some(v) = ext_refusal {
                    let local = s(&["-m", "addrtype", "--dst-type", "LOCAL"]);
                    refuse(
                        &mut f,
                        EXTERNAL_SERVICES,
                        vec![local, pm(), s(&["--dport", &np])],
                        v,
                    );
                }
            }
        }
    }
    if let Some(hc) = d.health_check_node_port {
        f.shared.push((
            Table::Filter,
            rule(
                NODEPORTS,
                vec![
                    comment(format!("{name} health check node port")),
                    s(&[
                        "-m",
                        "tcp",
                        "-p",
                        "tcp",
                        "--dport",
                        &hc.to_string(),
                        "-j",
                        "ACCEPT",
                    ]),
                ],
            ),
        ));
    }

    if let Some(route) = g.external.filter(|_| ext_used) {
        let mut rules = Vec::new();
        if let Some(pool) = route.short_circuit {
            // Pods and the node itself reach the service through the short-circuit pool;
            // node-sourced traffic is masqueraded.
            let chain = pool_chain(spn, pool);
            for cidr in &node.cluster_cidrs {
                rules.push(rule(
                    &ext,
                    vec![
                        comment(format!("pod traffic for {name} external destinations")),
                        s(&["-s", &cidr.to_string()]),
                        jump(&chain),
                    ],
                ));
            }
            rules.push(rule(
                &ext,
                vec![
                    comment(format!(
                        "masquerade LOCAL traffic for {name} external destinations"
                    )),
                    s(&["-m", "addrtype", "--src-type", "LOCAL"]),
                    jump(MARK_MASQ),
                ],
            ));
            rules.push(rule(
                &ext,
                vec![
                    comment(format!(
                        "route LOCAL traffic for {name} external destinations"
                    )),
                    s(&["-m", "addrtype", "--src-type", "LOCAL"]),
                    jump(&chain),
                ],
            ));
        }
        // A refused rest falls through un-DNATed and is refused by SVCNET-EXTERNAL-SERVICES.
        if let Target::Pool { pool, masquerade } = route.target {
            match masquerade {
                Masquerade::Always => rules.push(rule(
                    &ext,
                    vec![
                        comment(format!(
                            "masquerade traffic for {name} external destinations"
                        )),
                        jump(MARK_MASQ),
                    ],
                )),
                Masquerade::OffCluster => {
                    let tail = match node.cluster_cidrs.as_slice() {
                        [one] => s(&["!", "-s", &one.to_string(), "-j", MARK_MASQ]),
                        _ => s(&["-j", MASQ_OFF_CLUSTER]),
                    };
                    rules.push(rule(&ext, vec![tail]));
                }
                Masquerade::Never => {}
            }
            rules.push(rule(&ext, vec![jump(&pool_chain(spn, pool))]));
        }
        f.chains.insert(ext, rules);
    }

    // Policy chains of the used pools, then their endpoints' chains.
    let internal = g.internal_pool();
    for (pool, eps) in &g.pools {
        let chain = pool_chain(spn, *pool);
        let masquerade = internal.filter(|(p, _)| p == pool).map(|(_, m)| m);
        let rules = policy_chain(&chain, &g, node, eps, masquerade);
        f.chains.insert(chain, rules);
    }
    for ep in g.endpoints() {
        let sep = endpoint_chain(spn, ep);
        let mut rules = vec![rule(
            &sep,
            vec![
                comment(name.clone()),
                s(&["-s", &addr(ep.ip)]),
                jump(MARK_MASQ),
            ],
        )];
        let mut dnat = vec![comment(name.clone())];
        if let Some(a) = g.affinity {
            let list = affinity_list(a.key, ep);
            dnat.push(s(&["-m", "recent", "--name", &list, "--set"]));
        }
        dnat.push(pm());
        dnat.push(s(&[
            "-j",
            "DNAT",
            "--to-destination",
            &endpoint_string(ep.ip, ep.port),
        ]));
        rules.push(rule(&sep, dnat));
        f.chains.insert(sep, rules);
    }
    f
}
