//! A packet tracer over iptables rules as `iptables-save` prints them (the kernel's tables,
//! parsed by [`Ruleset::parse_save`]) or as [`FakeIptables`] holds them: which built-in chains
//! and `SVCNET-` chains a connection's first packet takes, every `-m statistic` branch with its
//! probability mass, every `-m cluster` hash slot, whether it is DNATed, masqueraded (and by
//! which rule), accepted, rejected or dropped. `svcnet trace` uses it on a node's live
//! tables; the shared packet-flow table checks it against the fake and against the kernel's
//! own `iptables-save` (the same answers as real traffic).
//!
//! It interprets exactly the rule shapes svcnet's renderer emits, in both the renderer's text
//! and `iptables-save`'s normal form (`-p tcp … -m tcp --dport`, `--set-xmark`, `-m recent`
//! options in any order, `REJECT --reject-with …`); any other match, option or target is an
//! error naming the chain and the rule. Netfilter order modelled: nat PREROUTING (or nat
//! OUTPUT for packets the node sends), routing (a local destination → filter INPUT, else
//! filter FORWARD; filter OUTPUT for the node's own), then nat POSTROUTING for packets that
//! leave. Conntrack state is always NEW (the first packet).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ipnet::IpNet;
pub use svcnet_proxy::trace::{Branch, Hop, Outcome, Packet, TraceError};

use crate::fake::FakeIptables;
use crate::payload::{Table, split_args};

/// Linux's `jhash_1word` (include/linux/jhash.h), with which `-m cluster` hashes an IPv4
/// source address.
pub fn jhash_1word(a: u32, seed: u32) -> u32 {
    let init = seed.wrapping_add(0xdead_beef).wrapping_add(1 << 2);
    let (mut a, mut b, mut c) = (a.wrapping_add(init), init, init);
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

/// The slot `-m cluster --cluster-total-nodes total --cluster-hash-seed seed` hashes an IPv4
/// source into (`reciprocal_scale` of the hash of the address as it lies in memory).
pub fn cluster_slot(src: Ipv4Addr, seed: u32, total: u32) -> u32 {
    let h = jhash_1word(u32::from_ne_bytes(src.octets()), seed);
    ((u64::from(h) * u64::from(total)) >> 32) as u32
}

/// Chain name → rules (each rule as its arguments after `-A <chain>`), per table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub tables: BTreeMap<Table, BTreeMap<String, Vec<Vec<String>>>>,
}

/// `iptables-save` text the parser cannot read (names the line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("iptables-save output, line {line}: {message}")]
pub struct SaveError {
    pub line: usize,
    pub message: String,
}

impl Ruleset {
    /// Parses `iptables-save` output (tables other than mangle, filter and nat are skipped).
    pub fn parse_save(text: &str) -> Result<Ruleset, SaveError> {
        let mut rs = Ruleset::default();
        let mut table: Option<Table> = None;
        let mut skipping = false;
        for (i, line) in text.lines().enumerate() {
            let err = |message: String| SaveError {
                line: i + 1,
                message,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                table = Table::ALL.into_iter().find(|t| t.as_str() == name.trim());
                skipping = table.is_none();
                continue;
            }
            if line == "COMMIT" {
                table = None;
                skipping = false;
                continue;
            }
            if skipping {
                continue;
            }
            let Some(t) = table else {
                return Err(err(format!("{line:?} outside a table")));
            };
            let chains = rs.tables.entry(t).or_default();
            if let Some(decl) = line.strip_prefix(':') {
                let name = decl
                    .split_whitespace()
                    .next()
                    .ok_or_else(|| err("a chain without a name".into()))?;
                chains.entry(name.to_string()).or_default();
            } else if line.starts_with("-A ") {
                let mut args = split_args(line);
                if args.len() < 2 {
                    return Err(err("-A without a chain".into()));
                }
                let chain = args.remove(1);
                args.remove(0);
                chains.entry(chain).or_default().push(args);
            } else {
                return Err(err(format!("unexpected {line:?}")));
            }
        }
        Ok(rs)
    }

    /// The same view of a fake's tables.
    pub fn from_fake(fake: &FakeIptables) -> Ruleset {
        Ruleset {
            tables: Table::ALL
                .into_iter()
                .map(|t| (t, fake.table(t).clone()))
                .collect(),
        }
    }

    fn chain(&self, table: Table, chain: &str) -> Option<&Vec<Vec<String>>> {
        self.tables.get(&table)?.get(chain)
    }
}

#[derive(Clone, Debug)]
struct St {
    dst: IpAddr,
    dport: u16,
    dnat: bool,
    mark: u32,
    masquerade: bool,
    p: f64,
    path: Vec<Hop>,
    masquerade_by: Option<(String, String)>,
    ended_by: Option<(String, String)>,
    records_affinity: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    Return,
    Accept,
    Drop,
    Reject,
}

fn parse_mark(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

fn net_contains(spec: &str, ip: IpAddr) -> Option<bool> {
    match spec.parse::<IpNet>() {
        Ok(n) => Some(n.contains(&ip)),
        Err(_) => spec.parse::<IpAddr>().ok().map(|a| a == ip),
    }
}

/// One rule parsed into what the tracer needs.
struct Parsed {
    /// Deterministic result of every non-statistic match.
    matches: bool,
    probability: Option<f64>,
    recent_set: Option<String>,
    target: Option<(String, Vec<String>)>,
}

/// What the tracer knows: the rules, the node's addresses and which `recent` lists hold the
/// packet's source (ClientIP affinity state).
pub struct Tracer<'a> {
    pub rules: &'a Ruleset,
    pub local_addrs: Vec<IpAddr>,
    pub recent: BTreeSet<String>,
}

impl Tracer<'_> {
    pub fn new(rules: &Ruleset, local_addrs: Vec<IpAddr>) -> Tracer<'_> {
        Tracer {
            rules,
            local_addrs,
            recent: BTreeSet::new(),
        }
    }

    fn parse(
        &self,
        pkt: &Packet,
        st: &St,
        chain: &str,
        args: &[String],
    ) -> Result<Parsed, TraceError> {
        let rule = quoted(args);
        let bad = |message: &str| TraceError {
            chain: chain.to_string(),
            rule: rule.clone(),
            message: message.to_string(),
        };
        let mut p = Parsed {
            matches: true,
            probability: None,
            recent_set: None,
            target: None,
        };
        let mut i = 0;
        let mut neg = false;
        let next = |i: &mut usize| -> Result<&str, TraceError> {
            *i += 1;
            args.get(*i)
                .map(String::as_str)
                .ok_or_else(|| bad("truncated rule"))
        };
        while i < args.len() {
            match args[i].as_str() {
                "!" => {
                    neg = true;
                    i += 1;
                    continue;
                }
                "-m" => match next(&mut i)? {
                    "comment" => {
                        if next(&mut i)? != "--comment" {
                            return Err(bad("comment without --comment"));
                        }
                        next(&mut i)?;
                    }
                    // The protocol's own module (its options follow as separate words).
                    "tcp" | "udp" | "sctp" => {}
                    "statistic" => {
                        if next(&mut i)? != "--mode" {
                            return Err(bad("statistic without --mode"));
                        }
                        let v: f64 = match next(&mut i)? {
                            "random" => {
                                if next(&mut i)? != "--probability" {
                                    return Err(bad("random without --probability"));
                                }
                                next(&mut i)?.parse().map_err(|_| bad("bad probability"))?
                            }
                            // One in every N reaching the rule: a share of 1/N.
                            "nth" => {
                                if next(&mut i)? != "--every" {
                                    return Err(bad("nth without --every"));
                                }
                                let every: u32 =
                                    next(&mut i)?.parse().map_err(|_| bad("bad --every"))?;
                                if next(&mut i)? != "--packet" || next(&mut i)? != "0" || every == 0
                                {
                                    return Err(bad("unknown nth form"));
                                }
                                1.0 / f64::from(every)
                            }
                            _ => return Err(bad("unknown statistic mode")),
                        };
                        if !(0.0..=1.0).contains(&v) {
                            return Err(bad("probability outside 0..1"));
                        }
                        p.probability = Some(v);
                    }
                    // Source hashing: deterministic for a given source address.
                    "cluster" => {
                        let (mut total, mut mask, mut seed) = (None, None, None);
                        for _ in 0..3 {
                            match next(&mut i)? {
                                "--cluster-total-nodes" => total = next(&mut i)?.parse().ok(),
                                "--cluster-local-nodemask" => mask = parse_mark(next(&mut i)?),
                                "--cluster-hash-seed" => seed = parse_mark(next(&mut i)?),
                                _ => return Err(bad("unknown cluster option")),
                            }
                        }
                        let (Some(total), Some(mask), Some(seed)) = (total, mask, seed) else {
                            return Err(bad("incomplete cluster match"));
                        };
                        let IpAddr::V4(src) = pkt.src else {
                            return Err(bad("an IPv4 hash of an IPv6 source"));
                        };
                        let slot = cluster_slot(src, seed, total);
                        p.matches &= slot < 32 && mask & (1 << slot) != 0;
                    }
                    "recent" => {
                        let (mut name, mut check, mut set) = (None, false, false);
                        while let Some(opt) = args.get(i + 1).filter(|a| a.starts_with("--")) {
                            i += 1;
                            match opt.as_str() {
                                "--name" => name = Some(next(&mut i)?.to_string()),
                                "--seconds" | "--mask" | "--hitcount" => {
                                    next(&mut i)?;
                                }
                                "--rcheck" => check = true,
                                "--set" => set = true,
                                "--reap" | "--rsource" => {}
                                _ => return Err(bad("unknown recent option")),
                            }
                        }
                        let name = name.ok_or_else(|| bad("recent without --name"))?;
                        match (check, set) {
                            (true, false) => p.matches &= self.recent.contains(&name),
                            // Recording the client: no effect on this packet's path.
                            (false, true) => p.recent_set = Some(name),
                            _ => return Err(bad("recent needs one of --rcheck, --set")),
                        }
                    }
                    "addrtype" => {
                        let which = next(&mut i)?;
                        if next(&mut i)? != "LOCAL" {
                            return Err(bad("addrtype other than LOCAL"));
                        }
                        let ip = match which {
                            "--dst-type" => st.dst,
                            "--src-type" => pkt.src,
                            _ => return Err(bad("unknown addrtype option")),
                        };
                        p.matches &= self.local_addrs.contains(&ip);
                    }
                    "mark" => {
                        let mut mneg = false;
                        let mut opt = next(&mut i)?;
                        if opt == "!" {
                            mneg = true;
                            opt = next(&mut i)?;
                        }
                        if opt != "--mark" {
                            return Err(bad("mark without --mark"));
                        }
                        let (value, mask) = next(&mut i)?
                            .split_once('/')
                            .ok_or_else(|| bad("mark without a mask"))?;
                        let (v, m) = parse_mark(value)
                            .zip(parse_mark(mask))
                            .ok_or_else(|| bad("bad mark"))?;
                        p.matches &= (st.mark & m == v) != mneg;
                    }
                    "conntrack" => {
                        if next(&mut i)? != "--ctstate" {
                            return Err(bad("conntrack without --ctstate"));
                        }
                        let states = next(&mut i)?;
                        for s in states.split(',') {
                            if !["NEW", "INVALID", "RELATED", "ESTABLISHED"].contains(&s) {
                                return Err(bad("unknown conntrack state"));
                            }
                        }
                        // Every traced packet is the first of its connection.
                        p.matches &= states.split(',').any(|s| s == "NEW") != neg;
                    }
                    _ => return Err(bad("unknown match module")),
                },
                "-p" => p.matches &= (next(&mut i)? == pkt.proto_name()) != neg,
                "--dport" => {
                    let port: u16 = next(&mut i)?.parse().map_err(|_| bad("bad --dport"))?;
                    p.matches &= pkt.proto.is_some() && (port == st.dport) != neg;
                }
                "-d" => {
                    p.matches &=
                        net_contains(next(&mut i)?, st.dst).ok_or_else(|| bad("bad -d"))? != neg
                }
                "-s" => {
                    p.matches &=
                        net_contains(next(&mut i)?, pkt.src).ok_or_else(|| bad("bad -s"))? != neg
                }
                "-j" => {
                    let t = next(&mut i)?.to_string();
                    p.target = Some((t, args[i + 1..].to_vec()));
                    break;
                }
                _ => return Err(bad("unknown rule shape")),
            }
            neg = false;
            i += 1;
        }
        Ok(p)
    }

    /// Runs `chain`, returning every branch's end state.
    fn run(
        &self,
        pkt: &Packet,
        table: Table,
        chain: &str,
        mut st: St,
        from: Option<(&str, &str)>,
        depth: usize,
    ) -> Result<Vec<(St, End)>, TraceError> {
        let via = from.map(|(_, r)| r.to_string());
        let fail = |message: &str| TraceError {
            chain: chain.to_string(),
            rule: via.clone().unwrap_or_default(),
            message: message.to_string(),
        };
        if depth >= 32 {
            return Err(fail("jumps nested 32 deep (a loop?)"));
        }
        let Some(rules) = self.rules.chain(table, chain) else {
            // An empty built-in chain is not listed by every iptables-save.
            if via.is_none() {
                return Ok(vec![(st, End::Return)]);
            }
            return Err(fail("no such chain"));
        };
        st.path.push(Hop {
            chain: chain.to_string(),
            hook: via.is_none().then(|| format!("{table} {chain}")),
            from: from.map(|(c, _)| c.to_string()),
            via: via.clone(),
        });
        let mut live = vec![st];
        let mut done = Vec::new();
        for args in rules {
            let rule = quoted(args);
            let mut next_live = Vec::new();
            for st in live {
                let parsed = self.parse(pkt, &st, chain, args)?;
                if !parsed.matches {
                    next_live.push(st);
                    continue;
                }
                let mut hit = st.clone();
                if let Some(prob) = parsed.probability {
                    let mut miss = st;
                    miss.p *= 1.0 - prob;
                    hit.p *= prob;
                    if miss.p > 0.0 {
                        next_live.push(miss);
                    }
                    if hit.p == 0.0 {
                        continue;
                    }
                }
                if let Some(list) = parsed.recent_set {
                    hit.records_affinity.push(list);
                }
                let Some((target, opts)) = parsed.target else {
                    next_live.push(hit);
                    continue;
                };
                let bad = |message: &str| TraceError {
                    chain: chain.to_string(),
                    rule: rule.clone(),
                    message: message.to_string(),
                };
                match target.as_str() {
                    "ACCEPT" | "DROP" | "REJECT" | "RETURN" => {
                        let end = match target.as_str() {
                            "ACCEPT" => End::Accept,
                            "DROP" => End::Drop,
                            "REJECT" => End::Reject,
                            _ => End::Return,
                        };
                        if matches!(end, End::Drop | End::Reject) {
                            hit.ended_by = Some((chain.to_string(), rule.clone()));
                        }
                        done.push((hit, end));
                    }
                    "DNAT" => {
                        let [flag, to] = opts.as_slice() else {
                            return Err(bad("DNAT without --to-destination"));
                        };
                        if flag != "--to-destination" {
                            return Err(bad("DNAT without --to-destination"));
                        }
                        let (ip, port) = to
                            .rsplit_once(':')
                            .ok_or_else(|| bad("DNAT without a port"))?;
                        hit.dst = ip
                            .trim_matches(['[', ']'])
                            .parse()
                            .map_err(|_| bad("bad DNAT address"))?;
                        hit.dport = port.parse().map_err(|_| bad("bad DNAT port"))?;
                        hit.dnat = true;
                        hit.ended_by = Some((chain.to_string(), rule.clone()));
                        done.push((hit, End::Accept));
                    }
                    "MARK" => {
                        let [how, m] = opts.as_slice() else {
                            return Err(bad("unknown MARK form"));
                        };
                        match how.as_str() {
                            "--or-mark" => {
                                hit.mark |= parse_mark(m).ok_or_else(|| bad("bad mark"))?
                            }
                            "--xor-mark" => {
                                hit.mark ^= parse_mark(m).ok_or_else(|| bad("bad mark"))?
                            }
                            // iptables-save's normal form of both: (mark & !mask) ^ value.
                            "--set-xmark" => {
                                let (v, mask) = m
                                    .split_once('/')
                                    .and_then(|(v, k)| parse_mark(v).zip(parse_mark(k)))
                                    .ok_or_else(|| bad("bad mark"))?;
                                hit.mark = (hit.mark & !mask) ^ v;
                            }
                            _ => return Err(bad("unknown MARK option")),
                        }
                        next_live.push(hit);
                    }
                    "MASQUERADE" => {
                        hit.masquerade = true;
                        done.push((hit, End::Accept));
                    }
                    user => {
                        if !opts.is_empty() {
                            return Err(bad("options after a jump to a chain"));
                        }
                        if user.ends_with("MARK-MASQ") && hit.masquerade_by.is_none() {
                            hit.masquerade_by = Some((chain.to_string(), rule.clone()));
                        }
                        for (st, end) in
                            self.run(pkt, table, user, hit, Some((chain, &rule)), depth + 1)?
                        {
                            match end {
                                End::Return => next_live.push(st),
                                _ => done.push((st, end)),
                            }
                        }
                    }
                }
            }
            live = next_live;
        }
        done.extend(live.into_iter().map(|s| (s, End::Return)));
        Ok(done)
    }

    /// Traces the packet: every branch with its share (they sum to 1).
    pub fn trace(&self, pkt: &Packet) -> Result<Vec<Branch>, TraceError> {
        let st = St {
            dst: pkt.dst,
            dport: pkt.dport,
            dnat: false,
            mark: 0,
            masquerade: false,
            p: 1.0,
            path: Vec::new(),
            masquerade_by: None,
            ended_by: None,
            records_affinity: Vec::new(),
        };
        let nat_hook = if pkt.local_origin {
            "OUTPUT"
        } else {
            "PREROUTING"
        };
        let mut out = Vec::new();
        for (st, end) in self.run(pkt, Table::Nat, nat_hook, st, None, 0)? {
            if matches!(end, End::Drop | End::Reject) {
                out.push(branch(st, end));
                continue;
            }
            let local = self.local_addrs.contains(&st.dst);
            let filter_hook = match (pkt.local_origin, local) {
                (true, _) => "OUTPUT",
                (false, true) => "INPUT",
                (false, false) => "FORWARD",
            };
            for (st, end) in self.run(pkt, Table::Filter, filter_hook, st, None, 0)? {
                if matches!(end, End::Drop | End::Reject) {
                    out.push(branch(st, end));
                    continue;
                }
                if filter_hook == "INPUT" {
                    out.push(branch(st, End::Accept));
                    continue;
                }
                for (st, end) in self.run(pkt, Table::Nat, "POSTROUTING", st, None, 0)? {
                    out.push(branch(st, end));
                }
            }
        }
        Ok(out)
    }
}

fn branch(st: St, end: End) -> Branch {
    let outcome = match end {
        End::Drop => Outcome::Drop,
        End::Reject => Outcome::Reject,
        End::Accept | End::Return if st.dnat => Outcome::Endpoint {
            to: SocketAddr::new(st.dst, st.dport),
            masquerade: st.masquerade,
        },
        End::Accept | End::Return => Outcome::Pass,
    };
    let masquerade = matches!(
        outcome,
        Outcome::Endpoint {
            masquerade: true,
            ..
        }
    );
    Branch {
        share: st.p,
        outcome,
        path: st.path,
        masquerade_by: if masquerade { st.masquerade_by } else { None },
        ended_by: st.ended_by,
        records_affinity: st.records_affinity,
    }
}

/// A rule's arguments as `iptables-save` prints them (arguments with spaces quoted).
fn quoted(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if a.contains(char::is_whitespace) || a.is_empty() {
                format!("\"{a}\"")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `--comment` of a rule's text.
fn comment_of(rule: &str) -> Option<String> {
    let args = split_args(rule);
    let i = args.iter().position(|a| a == "--comment")?;
    args.get(i + 1).cloned()
}

/// A branch in words, from svcnet's iptables chain names and rule comments.
pub fn explain(b: &Branch) -> svcnet_proxy::trace::Explanation {
    use svcnet_proxy::trace::why;
    let per_service = |c: &str| {
        ["SVCNET-SVC-", "SVCNET-SVL-", "SVCNET-EXT-", "SVCNET-FW-"]
            .iter()
            .any(|p| c.starts_with(p))
    };
    let frontend = b.path.iter().find_map(|h| {
        if !per_service(&h.chain) {
            return None;
        }
        let c = comment_of(h.via.as_deref()?)?;
        match h.from.as_deref()? {
            "SVCNET-NODEPORTS" => Some(format!("node port of {c}")),
            "SVCNET-SERVICES" | "SVCNET-EXTERNAL-SERVICES" | "SVCNET-PROXY-FIREWALL" => {
                Some(match c.split_once(' ') {
                    Some((svc, kind)) => format!("{kind} of {svc}"),
                    None => c,
                })
            }
            _ => None,
        }
    });
    let masquerade = b.masquerade_by.as_ref().map(|(chain, rule)| {
        if chain.starts_with("SVCNET-SEP-") {
            why::HAIRPIN.to_string()
        } else if rule.contains("--src-type LOCAL") {
            why::LOCAL_SHORT_CIRCUIT.to_string()
        } else if rule.starts_with("! -s") || rule.contains(" ! -s ") {
            why::OFF_CLUSTER.to_string()
        } else if chain.starts_with("SVCNET-EXT-") {
            why::EXTERNAL_CLUSTER.to_string()
        } else {
            format!("marked by `{rule}` in chain {chain}")
        }
    });
    let (end_chain, end_rule) = b
        .ended_by
        .clone()
        .unwrap_or_else(|| (String::new(), String::new()));
    let c = comment_of(&end_rule).unwrap_or_default();
    let verdict = match &b.outcome {
        Outcome::Endpoint { to, .. } => format!("DNAT to {to}"),
        Outcome::Listener { port } => format!("redirected to local port {port}"),
        Outcome::Pass => why::NOT_A_SERVICE.to_string(),
        _ if c.contains("has no local endpoints") => why::NO_LOCAL_ENDPOINTS.to_string(),
        _ if c.contains("has no endpoints") => why::NO_ENDPOINTS.to_string(),
        _ if c.contains("other ports") => why::UNKNOWN_PORT.to_string(),
        _ if c.contains("unallocated service IP") => why::UNALLOCATED.to_string(),
        _ if c.contains("not accepted by") => why::SOURCE_RANGES.to_string(),
        _ if end_chain.starts_with("SVCNET-EXT-") => why::NO_LOCAL_ENDPOINTS.to_string(),
        Outcome::Reject => format!("rejected by `{end_rule}` in chain {end_chain}"),
        Outcome::Drop => format!("dropped by `{end_rule}` in chain {end_chain}"),
    };
    svcnet_proxy::trace::Explanation {
        frontend,
        masquerade,
        verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_save_output_of_both_back_ends() {
        let text = "# Generated by iptables-nft-save v1.8.9
*mangle
:PREROUTING ACCEPT [0:0]
COMMIT
*raw
:PREROUTING ACCEPT [0:0]
-A PREROUTING -j CT --notrack
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:SVCNET-SERVICES - [0:0]
-A PREROUTING -m comment --comment \"svcnet service portals\" -j SVCNET-SERVICES
-A SVCNET-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j DROP
COMMIT
";
        let rs = Ruleset::parse_save(text).unwrap();
        let nat = &rs.tables[&Table::Nat];
        assert_eq!(
            nat["PREROUTING"][0],
            [
                "-m",
                "comment",
                "--comment",
                "svcnet service portals",
                "-j",
                "SVCNET-SERVICES"
            ]
        );
        assert_eq!(nat["SVCNET-SERVICES"].len(), 1);
        assert!(!rs.tables.contains_key(&Table::Filter));
        let t = Tracer::new(&rs, vec![]);
        let pkt = Packet {
            src: "10.244.4.2".parse().unwrap(),
            dst: "10.96.0.10".parse().unwrap(),
            dport: 80,
            proto: Some(svcnet_proxy::Protocol::Tcp),
            local_origin: false,
        };
        let b = t.trace(&pkt).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].outcome, Outcome::Drop);
        assert_eq!(b[0].path[0].hook.as_deref(), Some("nat PREROUTING"));
        assert!(Ruleset::parse_save("-A X -j DROP").is_err());
    }
}
