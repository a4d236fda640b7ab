//! A packet tracer over nftables rules as nft prints them (the kernel's listing, parsed by
//! [`listing`], or a `FakeNft`): which hooks and chains a connection's first packet takes,
//! every `numgen` slot with its probability mass and every `jhash` slot, each looked up in
//! the `backends` maps; whether it is DNATed, masqueraded (and by which rule), accepted,
//! rejected or dropped. `svcnet trace` uses it on a node's live table; the shared
//! packet-flow table checks it against FakeNft and against the kernel's own listing (the
//! same answers as real traffic).
//!
//! It interprets exactly the rule shapes svcnet's v2 table and the userspace proxy's redirect
//! table use, in both the renderer's text and nft's normal form: concatenations of packet,
//! conntrack and slot fields looked up in sets (also interval sets), verdict maps and DNAT
//! maps; any other shape is an error naming the chain and the rule, never a guess.
//! Netfilter order modelled (IPv4 and IPv6 alike): a forwarded or delivered packet takes the
//! prerouting base chains in priority order, then (after routing on the possibly DNATed
//! destination) input or forward, then postrouting when it leaves; a packet the node sends
//! takes output, then postrouting, then input when its destination is local. Conntrack
//! state is always new (the trace is of a connection's first packet). A DNAT rule that names
//! its frontend (the comment of the group element it matched) ends with ` # <comment>` in
//! [`Branch::ended_by`], which [`explain`] reads.

mod explain;
pub mod listing;
mod lookup;

use std::net::{IpAddr, SocketAddr};

pub use svcnet_proxy::trace::{Branch, Hop, Outcome, Packet, TraceError};

pub use explain::explain;
pub use listing::{ChainDef, ListingError, Ruleset};
pub use lookup::split_element;
use lookup::{contains, inline, key_matches, parse_u32, tokens};

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
    /// The comment of the last group element matched (the frontend, for `explain`).
    frontend: Option<String>,
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

/// What the tracer knows: the rules (with the affinity maps' entries as the kernel lists
/// them: a client found there goes to its recorded endpoint) and the node's addresses.
pub struct Tracer<'a> {
    pub rules: &'a Ruleset,
    pub local_addrs: Vec<IpAddr>,
}

fn no_match(st: St) -> Branches {
    vec![(st, None)]
}

impl Tracer<'_> {
    pub fn new(rules: &Ruleset, local_addrs: Vec<IpAddr>) -> Tracer<'_> {
        Tracer { rules, local_addrs }
    }

    fn elements(&self, set: &str) -> &[String] {
        self.rules.sets.get(set).map_or(&[], Vec::as_slice)
    }

    /// The element of `set` holding `values`, if any.
    fn lookup(&self, set: &str, values: &[String]) -> Option<&String> {
        self.elements(set)
            .iter()
            .find(|e| key_matches(split_element(e).0, values))
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        self.local_addrs.contains(&ip)
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
        let t = tokens(rule);
        let w: Vec<&str> = t.iter().map(String::as_str).collect();
        self.words(pkt, chain, rule, st, &w)
    }

    /// Evaluates the rest `w` of a rule on one state.
    fn words(
        &self,
        pkt: &Packet,
        chain: &str,
        rule: &str,
        mut st: St,
        w: &[&str],
    ) -> Result<Branches, TraceError> {
        let bad = |message: &str| TraceError {
            chain: chain.to_string(),
            rule: rule.to_string(),
            message: message.to_string(),
        };
        let mut i = 0;
        while i < w.len() {
            match &w[i..] {
                ["ct", "state", s, ..] => {
                    // Every traced packet is the first of its connection.
                    if *s != "new" {
                        return Ok(no_match(st));
                    }
                    i += 3;
                }
                ["ct", "status", "dnat", ..] => {
                    if !st.dnat {
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
                ["meta", "mark", "&", mask, op @ ("==" | "!="), v, ..] => {
                    let (m, v) = parse_u32(mask)
                        .zip(parse_u32(v))
                        .ok_or_else(|| bad("bad mark"))?;
                    if (st.mark & m == v) != (*op == "==") {
                        return Ok(no_match(st));
                    }
                    i += 6;
                }
                ["meta", "mark", "set", "meta", "mark", op, v, ..] => {
                    let v = parse_u32(v).ok_or_else(|| bad("bad mark"))?;
                    match *op {
                        "|" => {
                            st.mark |= v;
                            if st.masquerade_by.is_none() {
                                st.masquerade_by = Some((chain.to_string(), rule.to_string()));
                            }
                        }
                        "^" => st.mark ^= v,
                        _ => return Err(bad("unknown mark operation")),
                    }
                    i += 7;
                }
                ["dnat", rest @ ..] => return self.dnat(chain, rule, st, pkt, rest),
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
                    if st.masquerade_by.is_none() {
                        st.masquerade_by = Some((chain.to_string(), rule.to_string()));
                    }
                    return Ok(vec![(st, Some(Verdict::End(End::Accept)))]);
                }
                ["update", set, _elem] if set.starts_with('@') => {
                    st.records_affinity
                        .push(set.trim_start_matches('@').to_string());
                    return Ok(vec![(st, None)]);
                }
                v @ [
                    "jump" | "goto" | "drop" | "accept" | "return" | "reject",
                    ..,
                ] => {
                    let verdict = Self::verdict(v).ok_or_else(|| bad("unknown verdict"))?;
                    return Ok(vec![(st, Some(verdict))]);
                }
                rest => {
                    let (alts, n) = self
                        .concat(pkt, &st, rest)
                        .ok_or_else(|| bad("unknown rule shape"))?;
                    let [(values, _)] = alts.as_slice() else {
                        return Err(bad("a slot expression outside a map lookup"));
                    };
                    let Some(values) = values.iter().cloned().collect::<Option<Vec<String>>>()
                    else {
                        // A port-keyed match never matches a packet without ports.
                        return Ok(no_match(st));
                    };
                    let after = &rest[n..];
                    let (neg, after) = match after {
                        ["!=", a @ ..] => (true, a),
                        a => (false, a),
                    };
                    match after {
                        ["vmap", map, ..] => return self.vmap(chain, rule, st, &values, map),
                        [set, ..] if set.starts_with('@') => {
                            let name = set.trim_start_matches('@');
                            let hit = self.lookup(name, &values);
                            if let Some((_, Some(c), _)) = hit.map(|e| split_element(e)) {
                                st.frontend = Some(c.to_string());
                            }
                            if hit.is_some() == neg {
                                return Ok(no_match(st));
                            }
                        }
                        [lit, ..] if lit.starts_with('{') && values.len() > 1 => {
                            // An inline set of concatenations (`{ a . b, c . d }`).
                            let entries = inline(lit).ok_or_else(|| bad("bad inline set"))?;
                            let hit = entries.iter().any(|e| key_matches(e, &values));
                            if hit == neg {
                                return Ok(no_match(st));
                            }
                        }
                        [lit, ..] => {
                            let [value] = values.as_slice() else {
                                return Err(bad("a literal compared to a concatenation"));
                            };
                            let hit = match (lit.starts_with('{'), value.parse::<IpAddr>()) {
                                (true, Ok(ip)) => {
                                    let mut any = false;
                                    for n in inline(lit).ok_or_else(|| bad("bad inline set"))? {
                                        any |=
                                            contains(&n, ip).ok_or_else(|| bad("bad address"))?;
                                    }
                                    any
                                }
                                (false, Ok(ip)) => {
                                    contains(lit, ip).ok_or_else(|| bad("bad address"))?
                                }
                                (_, Err(_)) => *lit == value,
                            };
                            if hit == neg {
                                return Ok(no_match(st));
                            }
                        }
                        [] => return Err(bad("a match without a value")),
                    }
                    i += n + usize::from(neg) + 1;
                }
            }
        }
        Ok(vec![(st, None)])
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
            frontend: None,
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
