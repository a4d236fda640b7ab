//! The dataplane's state read back from a node, as a [`Rendered`]: the virtual and real
//! servers (netlink), the addresses on the dummy, the ipsets' members (`ipset save`) and, from
//! the companion rules (`iptables-save`), the firewall marks, the persistent mark servers' port
//! translations and the service CIDRs. `svcnet trace` follows a packet through it with the
//! tracer the shared packet-flow table checks against the render ([`crate::trace`]), so what it
//! explains is what the kernel holds now, not what the proxy meant to write.
//!
//! The parsers are pure (tested against the render's own text); [`read`] does the I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_proxy::IpFamily;

use crate::Ipvs;
use crate::dataplane::{SyncError, open_socket, parse_addresses, run_tool};
use crate::render::{DUMMY, Dst, MarkRule, PortDnat, Rendered, Set, Source, VirtualServer};
use crate::rules::{FORWARD, MARK_CHAIN, PORTS};
use crate::types::{Dest, Protocol, Service};

/// Why a read-back state could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {line}")]
pub struct ReadError {
    pub what: String,
    pub line: String,
}

fn bad(what: &str, line: &str) -> ReadError {
    ReadError {
        what: what.to_string(),
        line: line.to_string(),
    }
}

fn protocol(name: &str) -> Option<Protocol> {
    match name {
        "tcp" => Some(Protocol::Tcp),
        "udp" => Some(Protocol::Udp),
        "sctp" => Some(Protocol::Sctp),
        _ => None,
    }
}

/// A mark or mask as iptables-save prints it (`0x53000001`, decimal accepted).
fn number(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// An address of `-d`/`-s`, with the `/32` (`/128`) iptables-save adds to a host.
fn host(text: &str) -> Option<IpAddr> {
    match text.parse::<IpNet>() {
        Ok(net) if net.prefix_len() == net.max_prefix_len() => Some(net.addr()),
        Ok(_) => None,
        Err(_) => text.parse().ok(),
    }
}

/// The value after `flag` in a rule's words.
fn after<'a>(words: &[&'a str], flag: &str) -> Option<&'a str> {
    words
        .iter()
        .position(|w| *w == flag)
        .and_then(|i| words.get(i + 1).copied())
}

/// The words of every `-A chain …` rule of `chain` in `iptables-save` text.
fn rules_of<'a>(save: &'a str, chain: &str) -> Vec<(&'a str, Vec<&'a str>)> {
    save.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("-A ")?;
            let (c, args) = rest.split_once(' ')?;
            (c == chain).then(|| (line, args.split_whitespace().collect()))
        })
        .collect()
}

/// The firewall-mark rules of the mangle chain, in order (inverse of `rules::mark_args`).
pub fn parse_marks(save: &str, family: IpFamily) -> Result<Vec<MarkRule>, ReadError> {
    let node_ips = Set::NodeIps.name(family);
    let cluster = Set::ClusterCidrs.name(family);
    rules_of(save, MARK_CHAIN)
        .into_iter()
        .map(|(line, w)| {
            let sets: Vec<(&str, &str)> = w
                .iter()
                .enumerate()
                .filter(|(_, x)| **x == "--match-set")
                .filter_map(|(i, _)| Some((*w.get(i + 1)?, *w.get(i + 2)?)))
                .collect();
            let dst = match after(&w, "-d") {
                Some(d) => Dst::Addr(host(d).ok_or_else(|| bad("a mark rule's address", line))?),
                None if sets.contains(&(node_ips.as_str(), "dst")) => Dst::NodeIps,
                None => return Err(bad("a mark rule without a destination", line)),
            };
            let source = if sets.contains(&(cluster.as_str(), "src")) {
                Source::ClusterCidrs
            } else if after(&w, "--src-type") == Some("LOCAL") {
                Source::Local
            } else {
                Source::Any
            };
            let protocol = after(&w, "-p")
                .and_then(protocol)
                .ok_or_else(|| bad("a mark rule's protocol", line))?;
            let port = after(&w, "--dport")
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| bad("a mark rule's port", line))?;
            let mark = after(&w, "--set-xmark")
                .or_else(|| after(&w, "--set-mark"))
                .and_then(|m| number(m.split('/').next().unwrap_or(m)))
                .ok_or_else(|| bad("a mark rule's mark", line))?;
            Ok(MarkRule {
                dst,
                protocol,
                port,
                source,
                mark,
            })
        })
        .collect()
}

/// The persistent mark servers' port translations (the nat `PORTS` chain).
pub fn parse_port_dnats(save: &str) -> Result<Vec<PortDnat>, ReadError> {
    rules_of(save, PORTS)
        .into_iter()
        .map(|(line, w)| {
            let protocol = after(&w, "-p").and_then(protocol);
            let mark = after(&w, "--mark").and_then(|m| number(m.split('/').next().unwrap_or(m)));
            let port = after(&w, "--to-destination")
                .and_then(|d| d.strip_prefix(':'))
                .and_then(|p| p.parse().ok());
            match (protocol, mark, port) {
                (Some(protocol), Some(mark), Some(port)) => Ok(PortDnat {
                    mark,
                    protocol,
                    port,
                }),
                _ => Err(bad("a port translation", line)),
            }
        })
        .collect()
}

/// The service CIDRs (the forward chain drops what no service holds in them).
pub fn parse_service_cidrs(save: &str) -> Result<Vec<IpNet>, ReadError> {
    rules_of(save, FORWARD)
        .into_iter()
        .map(|(line, w)| {
            after(&w, "-d")
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| bad("a service CIDR", line))
        })
        .collect()
}

/// One member as the render writes it: a net part (the last of `hash:ip,port,net`, the only one
/// of `hash:net`) with its prefix, which `ipset save` leaves out for a host.
fn member(set: Set, text: &str) -> Result<String, ReadError> {
    let net = |part: &str| -> Result<String, ReadError> {
        if part.contains('/') {
            part.parse::<IpNet>()
                .map(|n| n.to_string())
                .map_err(|_| bad("an ipset net", text))
        } else {
            part.parse::<IpAddr>()
                .map(|ip| IpNet::from(ip).to_string())
                .map_err(|_| bad("an ipset net", text))
        }
    };
    match set.kind() {
        "hash:net" => net(text),
        "hash:ip,port,net" => {
            let (head, last) = text
                .rsplit_once(',')
                .ok_or_else(|| bad("an ipset member", text))?;
            Ok(format!("{head},{}", net(last)?))
        }
        _ => Ok(text.to_string()),
    }
}

/// The members of this dataplane's sets of `family` in `ipset save` text.
pub fn parse_ipsets(
    save: &str,
    family: IpFamily,
) -> Result<BTreeMap<Set, BTreeSet<String>>, ReadError> {
    let names: BTreeMap<String, Set> = Set::ALL.iter().map(|s| (s.name(family), *s)).collect();
    let mut out = BTreeMap::new();
    for line in save.lines() {
        let Some(rest) = line.strip_prefix("add ") else {
            continue;
        };
        let mut w = rest.split_whitespace();
        let (Some(name), Some(value)) = (w.next(), w.next()) else {
            return Err(bad("an ipset member", line));
        };
        if let Some(set) = names.get(name) {
            out.entry(*set)
                .or_insert_with(BTreeSet::new)
                .insert(member(*set, value)?);
        }
    }
    Ok(out)
}

/// Everything but the servers, from the texts the node's tools print.
pub fn parse(
    family: IpFamily,
    iptables_save: &str,
    ipset_save: &str,
    addresses: &str,
) -> Result<Rendered, ReadError> {
    let members = parse_ipsets(ipset_save, family)?;
    let nets = |set: Set| -> Vec<IpNet> {
        members
            .get(&set)
            .map(|m| m.iter().filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default()
    };
    let cluster_cidrs = nets(Set::ClusterCidrs);
    let node_ips = members
        .get(&Set::NodeIps)
        .map(|m| m.iter().filter_map(|ip| ip.parse().ok()).collect())
        .unwrap_or_default();
    let v6 = family == IpFamily::V6;
    Ok(Rendered {
        servers: BTreeMap::new(),
        addresses: parse_addresses(addresses)
            .into_iter()
            .filter(|(dev, ip)| dev == DUMMY && ip.is_ipv6() == v6)
            .map(|(_, ip)| ip)
            .collect(),
        members,
        marks: parse_marks(iptables_save, family)?,
        port_dnats: parse_port_dnats(iptables_save)?,
        service_cidrs: parse_service_cidrs(iptables_save)?,
        cluster_cidrs,
        node_ips,
    })
}

/// Adds the virtual servers of `family` as the kernel lists them. A firewall-mark server's
/// protocol is its mark rules' (the key of such a server says TCP whatever it carries).
pub fn add_servers(r: &mut Rendered, family: IpFamily, servers: Vec<(Service, Vec<Dest>)>) {
    let v6 = family == IpFamily::V6;
    for (mut service, dests) in servers {
        // The kernel adds its own flags (`F_HASHED`) to what it lists.
        service.flags &= crate::types::USER_FLAGS;
        let key = service.key;
        if key.addr.is_ipv6() != v6 {
            continue;
        }
        let protocol = match key.fwmark {
            0 => key.protocol,
            mark => r
                .marks
                .iter()
                .find(|m| m.mark == mark)
                .map_or(key.protocol, |m| m.protocol),
        };
        let dests = dests.into_iter().map(|d| (d.key(), d)).collect();
        r.servers.insert(
            key,
            VirtualServer {
                service,
                protocol,
                dests,
            },
        );
    }
}

/// The dataplane's state of `family` in the current or the named network namespace; `None`
/// when its companion rules are not there (another proxy mode, or none). IPVS is only asked
/// when they are, so reading never loads `ip_vs`.
pub fn read(netns: Option<&str>, family: IpFamily) -> Result<Option<Rendered>, SyncError> {
    let executor = svcnet_iptables::IptablesExecutor::detect(netns.map(str::to_string))?;
    let save = executor.save(svcnet_iptables::Family::from(family))?;
    if !save.contains(&format!(":{MARK_CHAIN} ")) {
        return Ok(None);
    }
    let ipsets = run_tool(netns, "ipset", &["save"], None, "ipset")?;
    let flag = match family {
        IpFamily::V4 => "-4",
        IpFamily::V6 => "-6",
    };
    let addresses = run_tool(
        netns,
        "ip",
        &[flag, "-o", "addr", "show", "dev", DUMMY],
        None,
        "iproute2",
    )
    .unwrap_or_default();
    let mut r = parse(family, &save, &ipsets, &addresses).map_err(|e| SyncError::Tool {
        program: "reading the IPVS dataplane's state".into(),
        stderr: e.to_string(),
    })?;
    let mut sock = open_socket(netns)?;
    let mut servers = Vec::new();
    for service in sock.services()? {
        let dests = sock.dests(&service.key)?;
        servers.push((service, dests));
    }
    add_servers(&mut r, family, servers);
    Ok(Some(r))
}
