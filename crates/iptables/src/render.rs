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

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_proxy::{
    ClusterIpMasquerade, DesiredEndpoint, DesiredNode, DesiredServicePort, NoEndpointsVerdict,
    TrafficPolicy,
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
}

/// The shared chains, per table, in declaration order. Their rules are rewritten on every
/// sync, as kube-proxy rewrites its top-level chains.
pub fn base_chains() -> Vec<(Table, &'static str)> {
    vec![
        (Table::Mangle, CANARY),
        (Table::Filter, CANARY),
        (Table::Filter, SERVICES),
        (Table::Filter, EXTERNAL_SERVICES),
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
    // Traffic to the service CIDR that no frontend DNATed is refused, never routed onward.
    for cidr in &node.service_cidrs {
        out.push((
            Table::Filter,
            rule(
                SERVICES,
                vec![
                    comment("svcnet unallocated service IP or unknown port"),
                    s(&["-d", &cidr.to_string(), "-j", "REJECT"]),
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

/// The algorithm the rules of `d` use, and the fallback to report: what `svcnet-lb` says
/// iptables can express, and also random instead of source hashing when an endpoint set has
/// more hash slots than `-m cluster` can tell apart.
pub fn resolve_algorithm(d: &DesiredServicePort) -> Resolution {
    let r = svcnet_lb::resolve(d.lb_algorithm, Dataplane::Iptables);
    let too_many = |eps: &[DesiredEndpoint]| {
        svcnet_lb::select::hash_slots(&weights(eps)).len() > CLUSTER_SLOTS
    };
    if r.algorithm == Algorithm::SourceHash
        && (too_many(&d.cluster_endpoints) || too_many(&d.local_endpoints))
    {
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

/// The chain choosing among `eps`: masquerade check for cluster-IP traffic (when this chain
/// serves internal traffic), affinity checks, then the choice, by algorithm:
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
    d: &DesiredServicePort,
    node: &DesiredNode,
    eps: &[DesiredEndpoint],
    internal: bool,
) -> Vec<Rule> {
    let name = port_name(&d.name);
    let proto = d.protocol.as_str();
    let mut rules = Vec::new();
    if internal {
        let m = vec![
            comment(format!("{name} cluster IP")),
            s(&["-m", proto, "-p", proto, "-d", &addr(d.cluster_ip)]),
            s(&["--dport", &d.port.to_string()]),
        ];
        match d.cluster_ip_masquerade {
            ClusterIpMasquerade::All => {
                rules.push(rule(chain, [m, vec![s(&["-j", MARK_MASQ])]].concat()))
            }
            ClusterIpMasquerade::OffCluster => {
                let tail = match node.cluster_cidrs.as_slice() {
                    [one] => s(&["!", "-s", &one.to_string(), "-j", MARK_MASQ]),
                    _ => s(&["-j", MASQ_OFF_CLUSTER]),
                };
                rules.push(rule(chain, [m, vec![tail]].concat()));
            }
            ClusterIpMasquerade::Never => {}
        }
    }
    if let Some(timeout) = d.affinity_timeout {
        for ep in eps {
            let sep = endpoint_chain(&d.name, ep);
            rules.push(rule(
                chain,
                vec![
                    comment(format!("{name} -> {}", endpoint_string(ep.ip, ep.port))),
                    s(&["-m", "recent", "--name", &sep, "--rcheck", "--seconds"]),
                    s(&[&timeout.to_string(), "--reap", "-j", &sep]),
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
    let choices: Vec<(usize, Vec<String>)> = match resolve_algorithm(d).algorithm {
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

/// Renders one service port.
pub fn service_fragment(d: &DesiredServicePort, node: &DesiredNode) -> Fragment {
    let spn = &d.name;
    let name = port_name(spn);
    let proto = d.protocol.as_str();
    let mut f = Fragment::default();
    let pm = || s(&["-m", proto, "-p", proto]);
    let frontend = |ip: IpAddr, port: u16| s(&["-d", &addr(ip), "--dport", &port.to_string()]);
    let jump = |t: &str| s(&["-j", t]);

    // Internal traffic.
    let internal_chain = match d.internal_policy {
        TrafficPolicy::Cluster => service_chain(spn),
        TrafficPolicy::Local => local_chain(spn),
    };
    match d.internal_no_endpoints {
        None => f.shared.push((
            Table::Nat,
            rule(
                SERVICES,
                vec![
                    comment(format!("{name} cluster IP")),
                    pm(),
                    frontend(d.cluster_ip, d.port),
                    jump(&internal_chain),
                ],
            ),
        )),
        Some(v) => f.shared.push((
            Table::Filter,
            rule(
                SERVICES,
                vec![
                    comment(verdict_comment(&name, v)),
                    pm(),
                    frontend(d.cluster_ip, d.port),
                    jump(verdict_target(v)),
                ],
            ),
        )),
    }

    // External traffic: used unless the service has no endpoints at all.
    let ext = external_chain(spn);
    let ext_used = d.has_external() && d.external_no_endpoints != Some(NoEndpointsVerdict::Reject);
    let uses_fw =
        ext_used && !d.load_balancer_source_ranges.is_empty() && !d.load_balancer_ips.is_empty();
    for ip in &d.external_ips {
        if ext_used {
            f.shared.push((
                Table::Nat,
                rule(
                    SERVICES,
                    vec![
                        comment(format!("{name} external IP")),
                        pm(),
                        frontend(*ip, d.port),
                        jump(&ext),
                    ],
                ),
            ));
        }
        if let Some(v) = d.external_no_endpoints {
            f.shared.push((
                Table::Filter,
                rule(
                    EXTERNAL_SERVICES,
                    vec![
                        comment(verdict_comment(&name, v)),
                        pm(),
                        frontend(*ip, d.port),
                        jump(verdict_target(v)),
                    ],
                ),
            ));
        }
    }
    let fw = firewall_chain(spn);
    for ip in &d.load_balancer_ips {
        if ext_used {
            let target = if uses_fw { &fw } else { &ext };
            f.shared.push((
                Table::Nat,
                rule(
                    SERVICES,
                    vec![
                        comment(format!("{name} loadbalancer IP")),
                        pm(),
                        frontend(*ip, d.port),
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
                        frontend(*ip, d.port),
                        jump("DROP"),
                    ],
                ),
            ));
        }
        if let Some(v) = d.external_no_endpoints {
            f.shared.push((
                Table::Filter,
                rule(
                    EXTERNAL_SERVICES,
                    vec![
                        comment(verdict_comment(&name, v)),
                        pm(),
                        frontend(*ip, d.port),
                        jump(verdict_target(v)),
                    ],
                ),
            ));
        }
    }
    if let Some(np) = d.node_port {
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
        if let Some(v) = d.external_no_endpoints {
            f.shared.push((
                Table::Filter,
                rule(
                    EXTERNAL_SERVICES,
                    vec![
                        comment(verdict_comment(&name, v)),
                        s(&["-m", "addrtype", "--dst-type", "LOCAL"]),
                        pm(),
                        s(&["--dport", &np]),
                        jump(verdict_target(v)),
                    ],
                ),
            ));
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

    // The firewall chain: allowed sources continue to the external chain; the rest is not
    // DNATed and so is dropped by SVCNET-PROXY-FIREWALL in the filter table.
    if uses_fw {
        let mut rules: Vec<Rule> = d
            .load_balancer_source_ranges
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

    let svc = service_chain(spn);
    if ext_used {
        let mut rules = Vec::new();
        match d.external_policy {
            TrafficPolicy::Cluster => {
                rules.push(rule(
                    &ext,
                    vec![
                        comment(format!(
                            "masquerade traffic for {name} external destinations"
                        )),
                        jump(MARK_MASQ),
                    ],
                ));
                rules.push(rule(&ext, vec![jump(&svc)]));
            }
            TrafficPolicy::Local => {
                // Pods and the node itself reach the service through all endpoints
                // (upstream's short-circuit); node-sourced traffic is masqueraded.
                if !d.cluster_endpoints.is_empty() {
                    for cidr in &node.cluster_cidrs {
                        rules.push(rule(
                            &ext,
                            vec![
                                comment(format!("pod traffic for {name} external destinations")),
                                s(&["-s", &cidr.to_string()]),
                                jump(&svc),
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
                            jump(&svc),
                        ],
                    ));
                }
                // Without local endpoints the rest falls through un-DNATed and is dropped
                // by SVCNET-EXTERNAL-SERVICES.
                if !d.local_endpoints.is_empty() {
                    rules.push(rule(&ext, vec![jump(&local_chain(spn))]));
                }
            }
        }
        f.chains.insert(ext, rules);
    }

    // Policy chains, only those something jumps to.
    let cluster_used = !d.cluster_endpoints.is_empty()
        && ((d.internal_policy == TrafficPolicy::Cluster && d.internal_no_endpoints.is_none())
            || ext_used);
    let local_used = !d.local_endpoints.is_empty()
        && ((d.internal_policy == TrafficPolicy::Local && d.internal_no_endpoints.is_none())
            || (ext_used && d.external_policy == TrafficPolicy::Local));
    let mut endpoints: BTreeSet<&DesiredEndpoint> = BTreeSet::new();
    if cluster_used {
        let internal = d.internal_policy == TrafficPolicy::Cluster;
        f.chains.insert(
            svc.clone(),
            policy_chain(&svc, d, node, &d.cluster_endpoints, internal),
        );
        endpoints.extend(&d.cluster_endpoints);
    }
    if local_used {
        let svl = local_chain(spn);
        let internal = d.internal_policy == TrafficPolicy::Local;
        f.chains.insert(
            svl.clone(),
            policy_chain(&svl, d, node, &d.local_endpoints, internal),
        );
        endpoints.extend(&d.local_endpoints);
    }
    for ep in endpoints {
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
        if d.affinity_timeout.is_some() {
            dnat.push(s(&["-m", "recent", "--name", &sep, "--set"]));
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
