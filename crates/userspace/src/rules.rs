//! The kernel side of privileged mode, as a value: the nftables transaction that redirects
//! every frontend of a route to the route's listener (pods and the node to the short-circuit
//! route first, where the core decided one), refuses (or drops) traffic to frontends without
//! endpoints and load-balancer traffic from outside the source ranges before it is routed
//! anywhere, and applies the core's node-wide verdicts to what no frontend took: an unknown
//! port on a cluster IP is rejected, an unallocated address of a service CIDR dropped.
//!
//! svcnet-userspace owns one table per family (`ip svcnet-userspace`, `ip6 svcnet-userspace`)
//! and never touches another. Hooks and priorities (the contract for software sharing the
//! host): `nat prerouting/output priority -100` (dstnat) for the redirects; `filter
//! prerouting/output priority -110` (dstnat - 10) for source ranges and reject/drop of
//! frontends without endpoints (so a refused connection gets a TCP RST or ICMP port
//! unreachable at once, never a time-out); `filter forward priority -110` and `filter output
//! priority -90` (after the redirects) for the node-wide verdicts, which see only what was
//! not redirected. Priorities are numeric because nft 1.0.6 rejects the name `dstnat` at the
//! output hook.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_proxy::{DesiredFamily, IpFamily, NODE_VERDICTS, NoEndpointsVerdict, Protocol};

use crate::table::{Class, Frontend, RouteKey, RouteSpec, Sources};

/// What the node-wide verdicts of one family need: the allocated cluster IPs and the service
/// CIDRs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeChecks {
    pub cluster_ips: Vec<IpAddr>,
    pub service_cidrs: Vec<IpNet>,
}

impl NodeChecks {
    pub fn of(family: &DesiredFamily) -> Self {
        let mut cluster_ips: Vec<IpAddr> = family.services.values().map(|d| d.cluster_ip).collect();
        cluster_ips.sort();
        cluster_ips.dedup();
        Self {
            cluster_ips,
            service_cidrs: family.node.service_cidrs.clone(),
        }
    }
}

fn list<T: ToString>(items: &[T]) -> String {
    let v: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("{{ {} }}", v.join(", "))
}

fn node_verdict(v: NoEndpointsVerdict) -> &'static str {
    match v {
        NoEndpointsVerdict::Reject => "reject",
        NoEndpointsVerdict::Drop => "drop",
    }
}

/// The table name, in both families.
pub const TABLE: &str = "svcnet-userspace";

fn family_kw(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

fn match_frontend(f: IpFamily, proto: Protocol, fe: &Frontend) -> String {
    let ip = family_kw(f);
    match fe {
        Frontend::Addr(addr, port) | Frontend::LoadBalancer(addr, port, _) => {
            format!("{ip} daddr {addr} {proto} dport {port}")
        }
        Frontend::NodePort(port) => format!("fib daddr type local {proto} dport {port}"),
    }
}

/// Renders the whole table of one family as one `nft -f` transaction. `ports` gives the
/// listener port of each route that has one; `checks` the family's node-wide verdicts.
pub fn render(
    family: IpFamily,
    routes: &[RouteSpec],
    ports: &BTreeMap<RouteKey, u16>,
    checks: &NodeChecks,
) -> String {
    let ip = family_kw(family);
    let mut redirects = String::new();
    let mut refusals = String::new();
    for r in routes.iter().filter(|r| r.key.family == family) {
        for fe in &r.frontends {
            let m = match_frontend(family, r.protocol, fe);
            if let Frontend::LoadBalancer(_, _, ranges) = fe
                && !ranges.is_empty()
                && r.key.class != Class::ShortCircuit
            {
                let _ = writeln!(refusals, "\t\t{m} {ip} saddr != {} drop", list(ranges));
            }
            // The sources this route takes, as rule prefixes (pods, then the node).
            let froms: Vec<String> = match &r.sources {
                Sources::PodsAndNode(pods) => {
                    let mut v = Vec::new();
                    if !pods.is_empty() {
                        v.push(format!("{m} {ip} saddr {}", list(pods)));
                    }
                    v.push(format!("{m} fib saddr type local"));
                    v
                }
                Sources::NotPodsOrNode(pods) if pods.is_empty() => {
                    vec![format!("{m} fib saddr type != local")]
                }
                Sources::NotPodsOrNode(pods) => vec![format!(
                    "{m} {ip} saddr != {} fib saddr type != local",
                    list(pods)
                )],
                Sources::Any => vec![m],
            };
            match (ports.get(&r.key), r.no_endpoints) {
                (Some(port), _) => {
                    for from in &froms {
                        let _ = writeln!(redirects, "\t\t{from} redirect to :{port}");
                    }
                }
                // Only a short-circuit route that could not listen: the rest of the port's
                // external rules apply.
                (None, None) => {}
                (None, Some(NoEndpointsVerdict::Drop)) => {
                    for from in &froms {
                        let _ = writeln!(refusals, "\t\t{from} drop");
                    }
                }
                (None, Some(NoEndpointsVerdict::Reject)) => {
                    let verdict = match r.protocol {
                        Protocol::Tcp => "reject with tcp reset",
                        _ => "reject",
                    };
                    for from in &froms {
                        let _ = writeln!(refusals, "\t\t{from} {verdict}");
                    }
                }
            }
        }
    }
    let mut node_checks = String::new();
    if !checks.cluster_ips.is_empty() {
        let _ = writeln!(
            node_checks,
            "\t\t{ip} daddr {} {}",
            list(&checks.cluster_ips),
            node_verdict(NODE_VERDICTS.unknown_port)
        );
    }
    if !checks.service_cidrs.is_empty() {
        let _ = writeln!(
            node_checks,
            "\t\t{ip} daddr {} {}",
            list(&checks.service_cidrs),
            node_verdict(NODE_VERDICTS.unallocated_service_ip)
        );
    }
    let mut out = String::new();
    let _ = writeln!(out, "table {ip} {TABLE} {{}}");
    let _ = writeln!(out, "flush table {ip} {TABLE}");
    let _ = writeln!(out, "table {ip} {TABLE} {{");
    let _ = writeln!(out, "\tchain frontends {{\n{redirects}\t}}");
    let _ = writeln!(out, "\tchain no-endpoints {{\n{refusals}\t}}");
    let _ = writeln!(out, "\tchain cluster-ips-check {{\n{node_checks}\t}}");
    for (name, kind, hook, prio, target) in [
        ("nat-prerouting", "nat", "prerouting", "-100", "frontends"),
        ("nat-output", "nat", "output", "-100", "frontends"),
        (
            "filter-prerouting",
            "filter",
            "prerouting",
            "-110",
            "no-endpoints",
        ),
        ("filter-output", "filter", "output", "-110", "no-endpoints"),
        (
            "filter-forward",
            "filter",
            "forward",
            "-110",
            "cluster-ips-check",
        ),
        (
            "filter-output-post-dnat",
            "filter",
            "output",
            "-90",
            "cluster-ips-check",
        ),
    ] {
        let _ = writeln!(
            out,
            "\tchain {name} {{\n\t\ttype {kind} hook {hook} priority {prio}; policy accept;\n\t\tjump {target}\n\t}}"
        );
    }
    out.push_str("}\n");
    out
}

/// The transaction that removes the table of one family; it succeeds when the table is
/// already gone.
pub fn delete(family: IpFamily) -> String {
    // `add` first, so that deleting a table that is already gone (another mode's proxy
    // removed it during a mode switch) succeeds.
    let t = format!("{} {TABLE}", family_kw(family));
    format!("add table {t}\ndelete table {t}\n")
}
