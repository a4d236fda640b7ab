//! A packet tracer over nftables rules as nft prints them (the kernel's listing, parsed by
//! [`listing`], or a `FakeNft`): which hooks and chains a connection's first packet takes,
//! every `numgen` branch with its probability mass and every `jhash` slot, whether it is
//! DNATed, masqueraded (and by which rule), accepted, rejected or dropped. `svcnet trace`
//! uses it on a node's live table; the shared packet-flow table checks it against FakeNft and
//! against the kernel's own listing (the same answers as real traffic).
//!
//! It interprets exactly the rule shapes svcnet's renderer emits, in both the renderer's text
//! and nft's normal form; any other shape is an error naming the chain and the rule, never a
//! guess. Netfilter order modelled (IPv4 and IPv6 alike): a forwarded or delivered packet
//! takes the prerouting base chains in priority order, then (after routing on the possibly
//! DNATed destination) input or forward, then postrouting when it leaves; a packet the node
//! sends takes output, then postrouting, then input when its destination is local. Conntrack
//! state is always new (the trace is of a connection's first packet).

pub mod listing;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
pub use svcnet_proxy::trace::{Branch, Hop, Outcome, Packet, TraceError};

pub use listing::{ChainDef, ListingError, Ruleset};

#[derive(Clone, Debug)]
struct St {
    dst: IpAddr,
    dport: u16,
    dnat: bool,
    /// Redirected to a local port (`redirect to :port`).
    redirect: bool,
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
    /// Fell off the end of the chain or `return`.
    Return,
    Accept,
    Drop,
    Reject,
}

#[derive(Clone, Debug)]
enum Verdict {
    Jump(String),
    Goto(String),
    End(End),
}

/// A rule's effect on one state: the branches it splits into, each with the verdict it ends in
/// (`None`: the rule did not end the chain for it).
type Branches = Vec<(St, Option<Verdict>)>;

/// What the tracer knows: the rules, the node's addresses and which affinity sets hold the
/// packet's source (a live table's affinity sets hold it when it is among their elements).
pub struct Tracer<'a> {
    pub rules: &'a Ruleset,
    pub local_addrs: Vec<IpAddr>,
    /// Affinity sets (`affinity-…`) taken to hold the source whatever their elements say.
    pub affinity: BTreeSet<String>,
}

/// Splits a rule into words, keeping each `{ … }` group (nested ones too) as one token.
fn tokens(rule: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0usize;
    for ch in rule.chars() {
        match ch {
            '{' => {
                depth += 1;
                cur.push(ch);
            }
            '}' => {
                depth = depth.saturating_sub(1);
                cur.push(ch);
            }
            c if c.is_whitespace() && depth == 0 => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The entries of an inline `{ a, b }` set or `{ k : v, … }` map.
fn inline(group: &str) -> Option<Vec<String>> {
    let inner = group.strip_prefix('{')?.strip_suffix('}')?;
    Some(
        inner
            .split(',')
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect(),
    )
}

fn contains(spec: &str, ip: IpAddr) -> Option<bool> {
    match spec.parse::<IpNet>() {
        Ok(n) => Some(n.contains(&ip)),
        Err(_) => spec.parse::<IpAddr>().ok().map(|a| a == ip),
    }
}

fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn no_match(st: St) -> Branches {
    vec![(st, None)]
}

impl Tracer<'_> {
    pub fn new(rules: &Ruleset, local_addrs: Vec<IpAddr>) -> Tracer<'_> {
        Tracer {
            rules,
            local_addrs,
            affinity: BTreeSet::new(),
        }
    }

    fn elements(&self, set: &str) -> &[String] {
        self.rules.sets.get(set).map_or(&[], Vec::as_slice)
    }

    fn set_has(&self, set: &str, key: &str) -> bool {
        self.elements(set)
            .iter()
            .any(|e| e == key || e.split(" : ").next() == Some(key))
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        self.local_addrs.contains(&ip)
    }

    /// Runs every branch of the packet through the hooks; the branches' shares sum to 1.
    pub fn trace(&self, pkt: &Packet) -> Result<Vec<Branch>, TraceError> {
        let st = St {
            dst: pkt.dst,
            dport: pkt.dport,
            dnat: false,
            redirect: false,
            mark: 0,
            masquerade: false,
            p: 1.0,
            path: Vec::new(),
            masquerade_by: None,
            ended_by: None,
            records_affinity: Vec::new(),
        };
        let mut finals = Vec::new();
        let mut delivered = Vec::new();
        if pkt.local_origin {
            let (live, f) = self.hook(pkt, "output", vec![st])?;
            finals.extend(f);
            let (live, f) = self.hook(pkt, "postrouting", live)?;
            finals.extend(f);
            let (local, out): (Vec<St>, Vec<St>) = live
                .into_iter()
                .partition(|s| s.redirect || self.is_local(s.dst));
            let (live, f) = self.hook(pkt, "input", local)?;
            finals.extend(f);
            delivered.extend(live);
            delivered.extend(out);
        } else {
            let (live, f) = self.hook(pkt, "prerouting", vec![st])?;
            finals.extend(f);
            let (local, fwd): (Vec<St>, Vec<St>) = live
                .into_iter()
                .partition(|s| s.redirect || self.is_local(s.dst));
            let (live, f) = self.hook(pkt, "input", local)?;
            finals.extend(f);
            delivered.extend(live);
            let (live, f) = self.hook(pkt, "forward", fwd)?;
            finals.extend(f);
            let (live, f) = self.hook(pkt, "postrouting", live)?;
            finals.extend(f);
            delivered.extend(live);
        }
        let mut out = Vec::new();
        for (st, e) in finals {
            let outcome = if e == End::Reject {
                Outcome::Reject
            } else {
                Outcome::Drop
            };
            out.push(branch(st, outcome));
        }
        for st in delivered {
            let outcome = if st.redirect {
                Outcome::Listener { port: st.dport }
            } else if st.dnat {
                Outcome::Endpoint {
                    to: SocketAddr::new(st.dst, st.dport),
                    masquerade: st.masquerade,
                }
            } else {
                Outcome::Pass
            };
            out.push(branch(st, outcome));
        }
        Ok(out)
    }

    /// A field of a selector or concatenation (`Some(None)`: the packet has no such field,
    /// as an ICMP packet has no port, so nothing keyed on it matches).
    fn field(&self, pkt: &Packet, st: &St, a: &str, b: &str) -> Option<Option<String>> {
        if (a, b) == ("th", "dport") && pkt.proto.is_none() {
            return Some(None);
        }
        Some(Some(match (a, b) {
            ("ip" | "ip6", "daddr") => st.dst.to_string(),
            ("ip" | "ip6", "saddr") => pkt.src.to_string(),
            ("meta", "l4proto") => pkt.proto_name().to_string(),
            ("th", "dport") => st.dport.to_string(),
            _ => return None,
        }))
    }

    fn verdict(words: &[&str]) -> Option<Verdict> {
        Some(match words {
            ["jump", c] => Verdict::Jump(c.to_string()),
            ["goto", c] => Verdict::Goto(c.to_string()),
            ["drop"] => Verdict::End(End::Drop),
            ["accept"] => Verdict::End(End::Accept),
            ["return"] => Verdict::End(End::Return),
            ["reject", ..] => Verdict::End(End::Reject),
            _ => return None,
        })
    }

    fn value_verdict(v: &str) -> Option<Verdict> {
        Self::verdict(&v.split_whitespace().collect::<Vec<_>>())
    }

    /// Evaluates one rule on one state.
    fn rule(&self, pkt: &Packet, chain: &str, st: St, rule: &str) -> Result<Branches, TraceError> {
        let bad = |message: &str| TraceError {
            chain: chain.to_string(),
            rule: rule.to_string(),
            message: message.to_string(),
        };
        let t = tokens(rule);
        let w: Vec<&str> = t.iter().map(String::as_str).collect();
        let mut i = 0;
        let mut st = st;
        while i < w.len() {
            match &w[i..] {
                ["ct", "state", s, ..] => {
                    // Every traced packet is the first of its connection.
                    if *s != "new" {
                        return Ok(no_match(st));
                    }
                    i += 3;
                }
                ["fib", dir @ ("daddr" | "saddr"), "type", rest @ ..] => {
                    let (neg, n) = match rest {
                        ["!=", "local", ..] => (true, 5),
                        ["local", ..] => (false, 4),
                        _ => return Err(bad("unknown fib match")),
                    };
                    let ip = if *dir == "daddr" { st.dst } else { pkt.src };
                    if self.is_local(ip) == neg {
                        return Ok(no_match(st));
                    }
                    i += n;
                }
                [
                    "ip" | "ip6" | "meta",
                    a @ ("daddr" | "saddr" | "l4proto"),
                    ".",
                    ..,
                ] => {
                    // A concatenation, looked up in a verdict map.
                    let mut key = vec![
                        self.field(pkt, &st, w[i], a)
                            .ok_or_else(|| bad("unknown field"))?,
                    ];
                    i += 2;
                    while w.get(i) == Some(&".") {
                        let (x, y) = (w.get(i + 1), w.get(i + 2));
                        let f = x
                            .zip(y)
                            .and_then(|(x, y)| self.field(pkt, &st, x, y))
                            .ok_or_else(|| bad("unknown field in a concatenation"))?;
                        key.push(f);
                        i += 3;
                    }
                    let key: Option<Vec<String>> = key.into_iter().collect();
                    let Some(key) = key else {
                        // A port-keyed map never matches a packet without ports.
                        return Ok(no_match(st));
                    };
                    return self.vmap(st, &key.join(" . "), &w[i..], chain, rule);
                }
                ["ip" | "ip6", a @ ("daddr" | "saddr"), rest @ ..] => {
                    let ip = if *a == "daddr" { st.dst } else { pkt.src };
                    let (neg, value) = match rest {
                        ["!=", v, ..] => (true, *v),
                        [v, ..] => (false, *v),
                        [] => return Err(bad("truncated address match")),
                    };
                    let hit = if let Some(set) = value.strip_prefix('@') {
                        if *a == "saddr" && set.starts_with("affinity-") {
                            self.affinity.contains(set) || self.set_has(set, &ip.to_string())
                        } else {
                            self.set_has(set, &ip.to_string())
                        }
                    } else if value.starts_with('{') {
                        let mut any = false;
                        for n in inline(value).ok_or_else(|| bad("bad inline set"))? {
                            any |= contains(&n, ip).ok_or_else(|| bad("bad address"))?;
                        }
                        any
                    } else {
                        contains(value, ip).ok_or_else(|| bad("bad address"))?
                    };
                    if hit == neg {
                        return Ok(no_match(st));
                    }
                    i += if neg { 4 } else { 3 };
                }
                ["meta", "l4proto", proto, "dnat", rest @ ..] => {
                    if *proto != pkt.proto_name() {
                        return Ok(no_match(st));
                    }
                    // `dnat to A:P`, or nft's `dnat ip to A:P` in an inet table.
                    let to = match rest {
                        ["to", to] | ["ip" | "ip6", "to", to] => *to,
                        _ => return Err(bad("unknown dnat form")),
                    };
                    let (ip, port) = to
                        .rsplit_once(':')
                        .ok_or_else(|| bad("dnat without port"))?;
                    st.dst = ip
                        .trim_matches(['[', ']'])
                        .parse()
                        .map_err(|_| bad("bad dnat address"))?;
                    st.dport = port.parse().map_err(|_| bad("bad dnat port"))?;
                    st.dnat = true;
                    st.ended_by = Some((chain.to_string(), rule.to_string()));
                    return Ok(vec![(st, Some(Verdict::End(End::Accept)))]);
                }
                [proto @ ("tcp" | "udp" | "sctp"), "dport", port, ..] => {
                    if *proto != pkt.proto_name() || port.parse::<u16>().ok() != Some(st.dport) {
                        return Ok(no_match(st));
                    }
                    i += 3;
                }
                ["meta", "l4proto", proto, ..] if !proto.starts_with('{') => {
                    if *proto != pkt.proto_name() {
                        return Ok(no_match(st));
                    }
                    i += 3;
                }
                ["meta", "mark", "&", mask, "==", v, ..] => {
                    let (m, v) = parse_u32(mask)
                        .zip(parse_u32(v))
                        .ok_or_else(|| bad("bad mark"))?;
                    if st.mark & m != v {
                        return Ok(no_match(st));
                    }
                    i += 6;
                }
                ["meta", "mark", "set", "meta", "mark", op, v] => {
                    let v = parse_u32(v).ok_or_else(|| bad("bad mark"))?;
                    match *op {
                        "|" => st.mark |= v,
                        "^" => st.mark ^= v,
                        _ => return Err(bad("unknown mark operation")),
                    }
                    return Ok(vec![(st, None)]);
                }
                ["redirect", "to", to] => {
                    let port = to
                        .strip_prefix(':')
                        .and_then(|p| p.parse().ok())
                        .ok_or_else(|| bad("bad redirect port"))?;
                    st.dport = port;
                    st.redirect = true;
                    st.ended_by = Some((chain.to_string(), rule.to_string()));
                    return Ok(vec![(st, Some(Verdict::End(End::Accept)))]);
                }
                ["masquerade", ..] => {
                    st.masquerade = true;
                    return Ok(vec![(st, Some(Verdict::End(End::Accept)))]);
                }
                ["update", set, _elem] if set.starts_with('@') => {
                    st.records_affinity
                        .push(set.trim_start_matches('@').to_string());
                    return Ok(vec![(st, None)]);
                }
                ["numgen", kind @ ("random" | "inc"), "mod", n, rest @ ..] => {
                    let n: usize = n.parse().map_err(|_| bad("bad numgen modulus"))?;
                    if n == 0 {
                        return Err(bad("numgen modulus 0"));
                    }
                    // The cascade (`== 0`, or nft's normal form `0`): taken with probability 1/n.
                    let cascade = match rest {
                        ["==", "0", v @ ..] | ["0", v @ ..] => Some(v),
                        _ => None,
                    };
                    if let Some(v) = cascade {
                        if *kind != "random" {
                            return Err(bad("numgen inc in a cascade"));
                        }
                        let mut hit = st.clone();
                        let mut miss = st;
                        hit.p /= n as f64;
                        miss.p *= 1.0 - 1.0 / n as f64;
                        let mut out = vec![(
                            hit,
                            Some(Self::verdict(v).ok_or_else(|| bad("bad verdict"))?),
                        )];
                        if miss.p > 0.0 {
                            out.push((miss, None));
                        }
                        return Ok(out);
                    }
                    // Every slot 1/n (a counter walks them all in turn).
                    let ["vmap", map] = rest else {
                        return Err(bad("unknown numgen form"));
                    };
                    let entries = self.map_entries(map).ok_or_else(|| bad("bad map"))?;
                    if entries.len() != n {
                        return Err(bad("numgen modulus and map size differ"));
                    }
                    let mut out = Vec::new();
                    for (_, v) in entries {
                        let mut s = st.clone();
                        s.p /= n as f64;
                        out.push((
                            s,
                            Some(Self::value_verdict(&v).ok_or_else(|| bad("bad verdict"))?),
                        ));
                    }
                    return Ok(out);
                }
                ["jhash", "ip", "saddr", "mod", n, "seed", seed, "vmap", map] => {
                    let IpAddr::V4(src) = pkt.src else {
                        return Err(bad("an IPv4 hash of an IPv6 source"));
                    };
                    let n: u32 = n.parse().map_err(|_| bad("bad jhash modulus"))?;
                    let seed = parse_u32(seed).ok_or_else(|| bad("bad jhash seed"))?;
                    let slot = svcnet_lb::hash::nft_jhash(&src.octets(), seed, n);
                    let v = self
                        .map_entries(map)
                        .ok_or_else(|| bad("bad map"))?
                        .into_iter()
                        .find(|(k, _)| *k == slot.to_string())
                        .map(|(_, v)| v)
                        .ok_or_else(|| bad("hash slot missing from the map"))?;
                    return Ok(vec![(
                        st,
                        Some(Self::value_verdict(&v).ok_or_else(|| bad("bad verdict"))?),
                    )]);
                }
                v @ [
                    "jump" | "goto" | "drop" | "accept" | "return" | "reject",
                    ..,
                ] => {
                    let verdict = Self::verdict(v).ok_or_else(|| bad("unknown verdict"))?;
                    return Ok(vec![(st, Some(verdict))]);
                }
                _ => return Err(bad("unknown rule shape")),
            }
        }
        Ok(vec![(st, None)])
    }

    /// `key` looked up in the verdict map after `vmap` (a named map or an inline one).
    fn vmap(
        &self,
        st: St,
        key: &str,
        rest: &[&str],
        chain: &str,
        rule: &str,
    ) -> Result<Branches, TraceError> {
        let bad = |message: &str| TraceError {
            chain: chain.to_string(),
            rule: rule.to_string(),
            message: message.to_string(),
        };
        let ["vmap", map] = rest else {
            return Err(bad("a concatenation without vmap"));
        };
        let value = self
            .map_entries(map)
            .ok_or_else(|| bad("bad map"))?
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v);
        match value {
            Some(v) => {
                let verdict = Self::value_verdict(&v).ok_or_else(|| bad("bad verdict"))?;
                Ok(vec![(st, Some(verdict))])
            }
            None => Ok(vec![(st, None)]),
        }
    }

    fn map_entries(&self, map: &str) -> Option<Vec<(String, String)>> {
        let raw: Vec<String> = match map.strip_prefix('@') {
            Some(name) => self.elements(name).to_vec(),
            None => inline(map)?,
        };
        raw.into_iter()
            .map(|e| {
                let (k, v) = e.split_once(" : ")?;
                Some((k.to_string(), v.to_string()))
            })
            .collect()
    }

    /// Runs `chain`, returning every branch's end state.
    fn run(
        &self,
        pkt: &Packet,
        chain: &str,
        mut st: St,
        from: Option<(&str, &str)>,
        depth: usize,
    ) -> Result<Vec<(St, End)>, TraceError> {
        let via = from.map(|(_, r)| r.to_string());
        let def = self.rules.chains.get(chain).ok_or_else(|| TraceError {
            chain: chain.to_string(),
            rule: via.clone().unwrap_or_default(),
            message: "no such chain".into(),
        })?;
        if depth >= 32 {
            return Err(TraceError {
                chain: chain.to_string(),
                rule: via.unwrap_or_default(),
                message: "jumps nested 32 deep (a loop?)".into(),
            });
        }
        st.path.push(Hop {
            chain: chain.to_string(),
            hook: def.base.as_ref().map(|b| b.hook.to_string()),
            from: from.map(|(c, _)| c.to_string()),
            via: via.clone(),
        });
        let mut live = vec![st];
        let mut done = Vec::new();
        for r in &def.rules {
            let mut next = Vec::new();
            for st in live {
                for (mut st, v) in self.rule(pkt, chain, st, r)? {
                    match v {
                        None => next.push(st),
                        Some(Verdict::End(e)) => {
                            if matches!(e, End::Drop | End::Reject) {
                                st.ended_by = Some((chain.to_string(), r.clone()));
                            }
                            done.push((st, e));
                        }
                        Some(Verdict::Jump(c)) => {
                            if c == "mark-for-masquerade" && st.masquerade_by.is_none() {
                                st.masquerade_by = Some((chain.to_string(), r.clone()));
                            }
                            for (st, e) in self.run(pkt, &c, st, Some((chain, r)), depth + 1)? {
                                match e {
                                    End::Return => next.push(st),
                                    e => done.push((st, e)),
                                }
                            }
                        }
                        // A goto's return ends this chain too.
                        Some(Verdict::Goto(c)) => {
                            done.extend(self.run(pkt, &c, st, Some((chain, r)), depth + 1)?)
                        }
                    }
                }
            }
            live = next;
        }
        done.extend(live.into_iter().map(|s| (s, End::Return)));
        Ok(done)
    }

    /// Runs every base chain of `hook` in priority order; returns the surviving states and
    /// the final (drop/reject) ones.
    #[allow(clippy::type_complexity)]
    fn hook(
        &self,
        pkt: &Packet,
        hook: &str,
        states: Vec<St>,
    ) -> Result<(Vec<St>, Vec<(St, End)>), TraceError> {
        let mut chains: Vec<(&String, i32)> = self
            .rules
            .chains
            .iter()
            .filter_map(|(name, c)| {
                let b = c.base.as_ref()?;
                (b.hook == hook).then_some((name, b.priority))
            })
            .collect();
        chains.sort_by_key(|(_, p)| *p);
        let mut live = states;
        let mut finals = Vec::new();
        for (name, _) in chains {
            let mut next = Vec::new();
            for st in live {
                for (st, e) in self.run(pkt, name, st, None, 0)? {
                    match e {
                        End::Return | End::Accept => next.push(st),
                        End::Drop | End::Reject => finals.push((st, e)),
                    }
                }
            }
            live = next;
        }
        Ok((live, finals))
    }
}

fn branch(st: St, outcome: Outcome) -> Branch {
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

/// The `ns/name/proto/port` part of a per-service chain name (`service-HASH-ns/name/tcp/http`).
fn service_of(chain: &str) -> Option<&str> {
    chain.splitn(3, '-').nth(2)
}

/// A branch in words, from svcnet's nft chain names and rules.
pub fn explain(b: &Branch) -> svcnet_proxy::trace::Explanation {
    use svcnet_proxy::trace::why;
    let hop_via = |h: &Hop, what: &str| h.via.as_deref().is_some_and(|v| v.contains(what));
    let frontend = b
        .path
        .iter()
        .find(|h| hop_via(h, "@service-ips") || hop_via(h, "@service-nodeports"))
        .and_then(|h| {
            let svc = service_of(&h.chain)?;
            let firewall = b.path.iter().any(|h| h.chain.starts_with("firewall-"));
            let kind = if hop_via(h, "@service-nodeports") {
                "node port"
            } else if h.chain.starts_with("service-") {
                "cluster IP"
            } else if firewall {
                "load-balancer IP (with loadBalancerSourceRanges)"
            } else {
                "external IP or load-balancer IP"
            };
            Some(format!("{kind} of {svc}"))
        })
        .or_else(|| {
            // The userspace proxy's table: a redirect rule per frontend.
            let (chain, rule) = b.ended_by.as_ref()?;
            let (m, _) = rule.split_once(" redirect to ")?;
            (chain == "frontends").then(|| format!("userspace frontend `{m}`"))
        })
        .or_else(|| {
            let h = b.path.iter().find(|h| h.chain.starts_with("firewall-"))?;
            Some(format!(
                "load-balancer IP (with loadBalancerSourceRanges) of {}",
                service_of(&h.chain)?
            ))
        });
    let masquerade = b.masquerade_by.as_ref().map(|(chain, rule)| {
        if chain.starts_with("endpoint-") {
            why::HAIRPIN.to_string()
        } else if chain.starts_with("service-") && rule.contains("ip saddr !=") {
            why::OFF_CLUSTER.to_string()
        } else if chain.starts_with("external-") && rule.contains("fib saddr type local") {
            why::LOCAL_SHORT_CIRCUIT.to_string()
        } else if chain.starts_with("external-") {
            why::EXTERNAL_CLUSTER.to_string()
        } else {
            format!("marked by `{rule}` in chain {chain}")
        }
    });
    let in_path = |name: &str| b.path.iter().any(|h| h.chain == name);
    let (end_chain, end_rule) = b
        .ended_by
        .clone()
        .unwrap_or_else(|| (String::new(), String::new()));
    let verdict = match &b.outcome {
        Outcome::Endpoint { to, .. } => format!("DNAT to {to}"),
        Outcome::Listener { port } => format!(
            "redirected to the userspace proxy's listener on port {port}: it picks the endpoint \
             with the service's algorithm and connects to it from the node"
        ),
        Outcome::Pass => why::NOT_A_SERVICE.to_string(),
        Outcome::Reject
            if end_rule.contains("@cluster-ips") || end_chain == "cluster-ips-check" =>
        {
            why::UNKNOWN_PORT.to_string()
        }
        Outcome::Reject
            if in_path("service-endpoints-check") || in_path("nodeport-endpoints-check") =>
        {
            why::NO_ENDPOINTS.to_string()
        }
        Outcome::Drop if end_chain.starts_with("firewall-") => why::SOURCE_RANGES.to_string(),
        Outcome::Drop if end_chain == "cluster-ips-check" => why::UNALLOCATED.to_string(),
        Outcome::Drop
            if end_chain.starts_with("external-") || end_chain.ends_with("endpoints-check") =>
        {
            why::NO_LOCAL_ENDPOINTS.to_string()
        }
        Outcome::Reject => format!("rejected by `{end_rule}` in chain {end_chain}"),
        Outcome::Drop => format!("dropped by `{end_rule}` in chain {end_chain}"),
    };
    svcnet_proxy::trace::Explanation {
        frontend,
        masquerade,
        verdict,
    }
}
