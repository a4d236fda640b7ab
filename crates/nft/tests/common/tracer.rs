//! A test-only packet tracer over `FakeNft` (the nft twin of svcnet-iptables' tracer). It
//! interprets exactly the rule shapes svcnet's renderer emits (any other expression or
//! statement panics, so a new shape cannot slip past the tests uninterpreted) and follows EVERY
//! branch of `numgen` with its probability mass, so a trace returns the exact distribution of
//! outcomes: which endpoint, masqueraded or not, rejected or dropped.
//!
//! Netfilter order modelled (IPv4): a forwarded or delivered packet takes the prerouting base
//! chains in priority order, then (after routing on the possibly DNATed destination) input or
//! forward, then postrouting when it leaves; a packet the node sends takes output, then
//! postrouting, then input when its destination is local. Conntrack state is always new.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_flows::{Client, Distribution, Outcome, Packet, Tracer};
use svcnet_nft::FakeNft;

#[derive(Clone, Debug)]
struct St {
    dst: IpAddr,
    dport: u16,
    dnat: bool,
    mark: u32,
    masquerade: bool,
    p: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    /// Fell off the end of the chain or `return`.
    Return,
    Accept,
    Drop,
    Reject,
}

/// What the nft dataplane's tracer knows: the rules, the node's addresses and which affinity
/// sets hold the packet's source.
pub struct NftTracer<'a> {
    pub fake: &'a FakeNft,
    pub local_addrs: Vec<IpAddr>,
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
fn inline(group: &str) -> Vec<String> {
    let inner = group
        .strip_prefix('{')
        .and_then(|g| g.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not a group: {group}"));
    inner
        .split(',')
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect()
}

fn contains(spec: &str, ip: IpAddr) -> bool {
    match spec.parse::<IpNet>() {
        Ok(n) => n.contains(&ip),
        Err(_) => {
            spec.parse::<IpAddr>()
                .unwrap_or_else(|_| panic!("bad address {spec}"))
                == ip
        }
    }
}

fn parse_u32(s: &str) -> u32 {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|_| panic!("bad number {s}"))
}

/// A rule's effect on one state: the branches it splits into, each with the verdict it ends in
/// (`None`: the rule did not end the chain for it).
type Branches = Vec<(St, Option<Verdict>)>;

#[derive(Clone, Debug)]
enum Verdict {
    Jump(String),
    Goto(String),
    End(End),
}

impl NftTracer<'_> {
    fn set_has(&self, set: &str, key: &str) -> bool {
        self.fake
            .elements(set)
            .iter()
            .any(|e| e == key || e.split(" : ").next() == Some(key))
    }

    /// The value of a map element, if the key is there.
    fn map_get(&self, map: &str, key: &str) -> Option<String> {
        self.fake.elements(map).into_iter().find_map(|e| {
            let (k, v) = e.split_once(" : ")?;
            (k == key).then(|| v.to_string())
        })
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        self.local_addrs.contains(&ip)
    }

    /// A field of a selector or concatenation.
    fn field(&self, pkt: &Packet, st: &St, a: &str, b: &str) -> String {
        match (a, b) {
            ("ip", "daddr") => st.dst.to_string(),
            ("ip", "saddr") => pkt.src.to_string(),
            ("meta", "l4proto") => pkt.proto.as_str().to_string(),
            ("th", "dport") => st.dport.to_string(),
            other => panic!("unknown field {other:?}"),
        }
    }

    fn verdict(words: &[&str]) -> Verdict {
        match words {
            ["jump", c] => Verdict::Jump(c.to_string()),
            ["goto", c] => Verdict::Goto(c.to_string()),
            ["drop"] => Verdict::End(End::Drop),
            ["accept"] => Verdict::End(End::Accept),
            ["return"] => Verdict::End(End::Return),
            ["reject", ..] => Verdict::End(End::Reject),
            other => panic!("unknown verdict {other:?}"),
        }
    }

    /// Evaluates one rule on one state.
    fn rule(&self, pkt: &Packet, st: St, rule: &str) -> Branches {
        let t = tokens(rule);
        let w: Vec<&str> = t.iter().map(String::as_str).collect();
        let mut i = 0;
        let mut st = st;
        while i < w.len() {
            match &w[i..] {
                ["ct", "state", s, ..] => {
                    // Every traced packet is the first of its connection.
                    if *s != "new" {
                        return no_match(st);
                    }
                    i += 3;
                }
                ["fib", dir @ ("daddr" | "saddr"), "type", rest @ ..] => {
                    let (neg, n) = match rest {
                        ["!=", "local", ..] => (true, 5),
                        ["local", ..] => (false, 4),
                        _ => panic!("fib in {rule}"),
                    };
                    let ip = if *dir == "daddr" { st.dst } else { pkt.src };
                    if self.is_local(ip) == neg {
                        return no_match(st);
                    }
                    i += n;
                }
                ["ip", a @ ("daddr" | "saddr"), ".", ..] => {
                    // A concatenation, looked up in a verdict map.
                    let mut key = vec![self.field(pkt, &st, "ip", a)];
                    i += 2;
                    while w.get(i) == Some(&".") {
                        key.push(self.field(pkt, &st, w[i + 1], w[i + 2]));
                        i += 3;
                    }
                    return self.vmap(st, &key.join(" . "), &w[i..], rule);
                }
                ["meta", "l4proto", ".", ..] => {
                    let mut key = vec![pkt.proto.as_str().to_string()];
                    i += 2;
                    while w.get(i) == Some(&".") {
                        key.push(self.field(pkt, &st, w[i + 1], w[i + 2]));
                        i += 3;
                    }
                    return self.vmap(st, &key.join(" . "), &w[i..], rule);
                }
                ["ip", a @ ("daddr" | "saddr"), rest @ ..] => {
                    let ip = if *a == "daddr" { st.dst } else { pkt.src };
                    let (neg, value) = match rest {
                        ["!=", v, ..] => (true, *v),
                        [v, ..] => (false, *v),
                        [] => panic!("truncated {rule}"),
                    };
                    let hit = if let Some(set) = value.strip_prefix('@') {
                        if *a == "saddr" && set.starts_with("affinity-") {
                            self.affinity.contains(set)
                        } else {
                            self.set_has(set, &ip.to_string())
                        }
                    } else if value.starts_with('{') {
                        inline(value).iter().any(|n| contains(n, ip))
                    } else {
                        contains(value, ip)
                    };
                    if hit == neg {
                        return no_match(st);
                    }
                    i += if neg { 4 } else { 3 };
                }
                ["meta", "l4proto", proto, "dnat", "to", to] => {
                    assert_eq!(*proto, pkt.proto.as_str(), "{rule}");
                    let (ip, port) = to.rsplit_once(':').unwrap_or_else(|| panic!("{rule}"));
                    st.dst = ip
                        .trim_matches(['[', ']'])
                        .parse()
                        .unwrap_or_else(|_| panic!("{rule}"));
                    st.dport = port.parse().unwrap_or_else(|_| panic!("{rule}"));
                    st.dnat = true;
                    return vec![(st, Some(Verdict::End(End::Accept)))];
                }
                [proto @ ("tcp" | "udp" | "sctp"), "dport", port, ..] => {
                    if *proto != pkt.proto.as_str() || port.parse::<u16>().ok() != Some(st.dport) {
                        return no_match(st);
                    }
                    i += 3;
                }
                ["meta", "mark", "&", mask, "==", v, ..] => {
                    if st.mark & parse_u32(mask) != parse_u32(v) {
                        return no_match(st);
                    }
                    i += 6;
                }
                ["meta", "mark", "set", "meta", "mark", op, v] => {
                    match *op {
                        "|" => st.mark |= parse_u32(v),
                        "^" => st.mark ^= parse_u32(v),
                        other => panic!("mark op {other} in {rule}"),
                    }
                    return vec![(st, None)];
                }
                ["masquerade", ..] => {
                    st.masquerade = true;
                    return vec![(st, Some(Verdict::End(End::Accept)))];
                }
                ["update", set, _elem] => {
                    assert!(set.starts_with('@'), "{rule}");
                    return vec![(st, None)];
                }
                ["numgen", kind @ ("random" | "inc"), "mod", n, rest @ ..] => {
                    let n: usize = n.parse().unwrap_or_else(|_| panic!("{rule}"));
                    match rest {
                        // The cascade: taken with probability 1/n.
                        ["==", "0", v @ ..] => {
                            assert_eq!(*kind, "random", "{rule}");
                            let mut hit = st.clone();
                            let mut miss = st;
                            hit.p /= n as f64;
                            miss.p *= 1.0 - 1.0 / n as f64;
                            let mut out = vec![(hit, Some(Self::verdict(v)))];
                            if miss.p > 0.0 {
                                out.push((miss, None));
                            }
                            return out;
                        }
                        // Every slot 1/n (a counter walks them all in turn).
                        ["vmap", map] => {
                            let entries = self.map_entries(map);
                            assert_eq!(entries.len(), n, "{rule}");
                            return entries
                                .into_iter()
                                .map(|(_, v)| {
                                    let mut s = st.clone();
                                    s.p /= n as f64;
                                    (s, Some(Self::verdict(&v.split(' ').collect::<Vec<_>>())))
                                })
                                .collect();
                        }
                        other => panic!("numgen {other:?} in {rule}"),
                    }
                }
                ["jhash", "ip", "saddr", "mod", n, "seed", seed, "vmap", map] => {
                    let IpAddr::V4(src) = pkt.src else {
                        panic!("the tracer hashes IPv4 sources only: {rule}");
                    };
                    let n: u32 = n.parse().unwrap_or_else(|_| panic!("{rule}"));
                    let slot = svcnet_lb::hash::nft_jhash(&src.octets(), parse_u32(seed), n);
                    let v = self
                        .map_entries(map)
                        .into_iter()
                        .find(|(k, _)| *k == slot.to_string())
                        .map(|(_, v)| v)
                        .unwrap_or_else(|| panic!("slot {slot} missing in {rule}"));
                    return vec![(st, Some(Self::verdict(&v.split(' ').collect::<Vec<_>>())))];
                }
                v @ [
                    "jump" | "goto" | "drop" | "accept" | "return" | "reject",
                    ..,
                ] => {
                    return vec![(st, Some(Self::verdict(v)))];
                }
                other => panic!("unknown rule shape at {other:?} in {rule}"),
            }
        }
        vec![(st, None)]
    }

    /// `key` looked up in the verdict map after `vmap` (a named map or an inline one).
    fn vmap(&self, st: St, key: &str, rest: &[&str], rule: &str) -> Branches {
        let ["vmap", map] = rest else {
            panic!("a concatenation without vmap in {rule}");
        };
        let value = match map.strip_prefix('@') {
            Some(name) => self.map_get(name, key),
            None => self
                .map_entries(map)
                .into_iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v),
        };
        match value {
            Some(v) => vec![(st, Some(Self::verdict(&v.split(' ').collect::<Vec<_>>())))],
            None => vec![(st, None)],
        }
    }

    fn map_entries(&self, map: &str) -> Vec<(String, String)> {
        let raw: Vec<String> = match map.strip_prefix('@') {
            Some(name) => self.fake.elements(name),
            None => inline(map),
        };
        raw.into_iter()
            .map(|e| {
                let (k, v) = e
                    .split_once(" : ")
                    .unwrap_or_else(|| panic!("not a map entry: {e}"));
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    /// Runs `chain`, returning every branch's end state.
    fn run(&self, pkt: &Packet, chain: &str, st: St, depth: usize) -> Vec<(St, End)> {
        assert!(depth < 32, "jump loop at {chain}");
        let rules = self
            .fake
            .rules(chain)
            .unwrap_or_else(|| panic!("no chain {chain}"));
        let mut live = vec![st];
        let mut done = Vec::new();
        for r in &rules {
            let mut next = Vec::new();
            for st in live {
                for (st, v) in self.rule(pkt, st, r) {
                    match v {
                        None => next.push(st),
                        Some(Verdict::End(e)) => done.push((st, e)),
                        Some(Verdict::Jump(c)) => {
                            for (st, e) in self.run(pkt, &c, st, depth + 1) {
                                match e {
                                    End::Return => next.push(st),
                                    e => done.push((st, e)),
                                }
                            }
                        }
                        // A goto's return ends this chain too.
                        Some(Verdict::Goto(c)) => done.extend(self.run(pkt, &c, st, depth + 1)),
                    }
                }
            }
            live = next;
        }
        done.extend(live.into_iter().map(|s| (s, End::Return)));
        done
    }

    /// Runs every base chain of `hook` in priority order; returns the surviving states and
    /// the final (drop/reject) ones.
    fn hook(&self, pkt: &Packet, hook: &str, states: Vec<St>) -> (Vec<St>, Vec<(St, End)>) {
        let mut chains: Vec<_> = self
            .fake
            .base_chains()
            .into_iter()
            .filter(|(_, b)| b.hook == hook)
            .collect();
        chains.sort_by_key(|(_, b)| b.priority);
        let mut live = states;
        let mut finals = Vec::new();
        for (name, _) in chains {
            let mut next = Vec::new();
            for st in live {
                for (st, e) in self.run(pkt, &name, st, 0) {
                    match e {
                        End::Return | End::Accept => next.push(st),
                        End::Drop | End::Reject => finals.push((st, e)),
                    }
                }
            }
            live = next;
        }
        (live, finals)
    }
}

fn no_match(st: St) -> Branches {
    vec![(st, None)]
}

impl Tracer for NftTracer<'_> {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn trace(&self, pkt: &Packet) -> Distribution {
        let st = St {
            dst: pkt.dst,
            dport: pkt.dport,
            dnat: false,
            mark: 0,
            masquerade: false,
            p: 1.0,
        };
        let mut finals = Vec::new();
        let mut delivered = Vec::new();
        if pkt.from == Client::Node {
            let (live, f) = self.hook(pkt, "output", vec![st]);
            finals.extend(f);
            let (live, f) = self.hook(pkt, "postrouting", live);
            finals.extend(f);
            let (local, out): (Vec<St>, Vec<St>) =
                live.into_iter().partition(|s| self.is_local(s.dst));
            let (live, f) = self.hook(pkt, "input", local);
            finals.extend(f);
            delivered.extend(live);
            delivered.extend(out);
        } else {
            let (live, f) = self.hook(pkt, "prerouting", vec![st]);
            finals.extend(f);
            let (local, fwd): (Vec<St>, Vec<St>) =
                live.into_iter().partition(|s| self.is_local(s.dst));
            let (live, f) = self.hook(pkt, "input", local);
            finals.extend(f);
            delivered.extend(live);
            let (live, f) = self.hook(pkt, "forward", fwd);
            finals.extend(f);
            let (live, f) = self.hook(pkt, "postrouting", live);
            finals.extend(f);
            delivered.extend(live);
        }
        let mut out = Distribution::new();
        for (st, e) in finals {
            let o = if e == End::Reject {
                Outcome::Reject
            } else {
                Outcome::Drop
            };
            *out.entry(o).or_default() += st.p;
        }
        for st in delivered {
            let o = if st.dnat {
                Outcome::Endpoint {
                    to: std::net::SocketAddr::new(st.dst, st.dport),
                    masquerade: st.masquerade,
                }
            } else {
                Outcome::Pass
            };
            *out.entry(o).or_default() += st.p;
        }
        out
    }
}
