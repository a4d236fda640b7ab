//! The kernel side of privileged mode, as a value: the nftables transaction that redirects
//! every frontend of a route to the route's listener, and refuses (or drops) traffic to
//! frontends without endpoints before it is routed anywhere.
//!
//! svcnet-userspace owns one table per family (`ip svcnet-userspace`, `ip6 svcnet-userspace`)
//! and never touches another. Hooks and priorities (the contract for software sharing the
//! host): `nat prerouting/output priority -100` (dstnat) for the redirects; `filter
//! prerouting/output priority -110` (dstnat - 10) for reject/drop of frontends without
//! endpoints (so a refused connection gets a TCP RST or ICMP port unreachable at once, never
//! a time-out). Priorities are numeric because nft 1.0.6 rejects the name `dstnat` at the
//! output hook.

use std::collections::BTreeMap;
use std::fmt::Write;

use svcnet_proxy::{IpFamily, NoEndpointsVerdict, Protocol};

use crate::table::{Frontend, RouteKey, RouteSpec};

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
/// listener port of each route that has one.
pub fn render(family: IpFamily, routes: &[RouteSpec], ports: &BTreeMap<RouteKey, u16>) -> String {
    let ip = family_kw(family);
    let mut redirects = String::new();
    let mut refusals = String::new();
    for r in routes.iter().filter(|r| r.key.family == family) {
        for fe in &r.frontends {
            let m = match_frontend(family, r.protocol, fe);
            if let Frontend::LoadBalancer(_, _, ranges) = fe
                && !ranges.is_empty()
            {
                let list: Vec<String> = ranges.iter().map(|n| n.to_string()).collect();
                let _ = writeln!(
                    redirects,
                    "\t\t{m} {ip} saddr != {{ {} }} drop",
                    list.join(", ")
                );
            }
            match (ports.get(&r.key), r.no_endpoints) {
                (Some(port), _) => {
                    let _ = writeln!(redirects, "\t\t{m} redirect to :{port}");
                }
                (None, Some(NoEndpointsVerdict::Drop)) => {
                    let _ = writeln!(refusals, "\t\t{m} drop");
                }
                (None, _) => {
                    let verdict = match r.protocol {
                        Protocol::Tcp => "reject with tcp reset",
                        _ => "reject",
                    };
                    let _ = writeln!(refusals, "\t\t{m} {verdict}");
                }
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "table {ip} {TABLE} {{}}");
    let _ = writeln!(out, "flush table {ip} {TABLE}");
    let _ = writeln!(out, "table {ip} {TABLE} {{");
    let _ = writeln!(out, "\tchain frontends {{\n{redirects}\t}}");
    let _ = writeln!(out, "\tchain no-endpoints {{\n{refusals}\t}}");
    for (name, kind, hook, prio) in [
        ("nat-prerouting", "nat", "prerouting", "-100"),
        ("nat-output", "nat", "output", "-100"),
        ("filter-prerouting", "filter", "prerouting", "-110"),
        ("filter-output", "filter", "output", "-110"),
    ] {
        let target = if kind == "nat" {
            "frontends"
        } else {
            "no-endpoints"
        };
        let _ = writeln!(
            out,
            "\tchain {name} {{\n\t\ttype {kind} hook {hook} priority {prio}; policy accept;\n\t\tjump {target}\n\t}}"
        );
    }
    out.push_str("}\n");
    out
}

/// The transaction that removes the table of one family (used by cleanup; it fails when the
/// table does not exist, which cleanup ignores).
pub fn delete(family: IpFamily) -> String {
    format!("delete table {} {TABLE}\n", family_kw(family))
}
