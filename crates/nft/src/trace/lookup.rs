//! The expressions of a rule the tracer evaluates: words and inline sets, listed elements
//! (key, comment, value; interval keys), concatenation fields with every slot of a `numgen`
//! or the one of a `jhash`, and the lookups of a DNAT map or verdict map.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{Branches, End, Packet, St, TraceError, Tracer, Verdict};

/// Splits a rule into words, keeping each `{ … }` group (nested ones too) as one token.
pub(super) fn tokens(rule: &str) -> Vec<String> {
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
pub(super) fn inline(group: &str) -> Option<Vec<String>> {
    let inner = group.strip_prefix('{')?.strip_suffix('}')?;
    Some(
        inner
            .split(',')
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect(),
    )
}

pub(super) fn contains(spec: &str, ip: IpAddr) -> Option<bool> {
    match spec.parse::<IpNet>() {
        Ok(n) => Some(n.contains(&ip)),
        Err(_) => spec.parse::<IpAddr>().ok().map(|a| a == ip),
    }
}

pub(super) fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Splits a listed element `key [comment "c"] [: value]` into its key, comment and value.
pub fn split_element(e: &str) -> (&str, Option<&str>, Option<&str>) {
    let (head, value) = match e.split_once(" : ") {
        Some((h, v)) => (h, Some(v.trim())),
        None => (e, None),
    };
    match head.split_once(" comment \"") {
        Some((k, c)) => (k.trim(), Some(c.trim_end_matches('"')), value),
        None => (head.trim(), None, value),
    }
}

/// Whether a listed key (`10.0.0.1 . tcp . 80 . 192.168.0.0/16`) holds `values`, component
/// by component: equal, or inside a prefix or range (interval sets).
pub(super) fn key_matches(key: &str, values: &[String]) -> bool {
    let parts: Vec<&str> = key.split(" . ").map(str::trim).collect();
    parts.len() == values.len()
        && parts.iter().zip(values).all(|(p, v)| {
            if *p == v {
                return true;
            }
            let Ok(ip) = v.parse::<IpAddr>() else {
                return false;
            };
            match p.split_once('-') {
                Some((lo, hi)) => match (lo.parse::<IpAddr>(), hi.parse::<IpAddr>()) {
                    (Ok(lo), Ok(hi)) => lo <= ip && ip <= hi,
                    _ => false,
                },
                None => contains(p, ip).unwrap_or(false),
            }
        })
}

/// Every slot of `0..n`, each with its share.
pub(super) fn spread(n: usize) -> Vec<(Option<String>, f64)> {
    let n = n.max(1);
    (0..n)
        .map(|s| (Some(s.to_string()), 1.0 / n as f64))
        .collect()
}

/// One field of a concatenation, as nft prints it.
#[derive(Clone, Debug)]
pub(super) enum Field {
    Value(Option<String>),
    /// `numgen random|inc mod n`: each slot 1/n.
    Numgen(usize),
    /// `jhash … mod n seed s` over bytes known from the packet, or (`None`: the source
    /// port, which the trace does not fix) spread over every slot.
    Jhash(Option<Vec<u8>>, u32, u32),
}

impl Tracer<'_> {
    /// Parses the field at `w[i..]`; returns it and the words it took.
    pub(super) fn field(&self, pkt: &Packet, st: &St, w: &[&str]) -> Option<(Field, usize)> {
        let v = |s: String| Some(Field::Value(Some(s)));
        let port = |p: u16| {
            if pkt.proto.is_none() {
                Some(Field::Value(None))
            } else {
                Some(Field::Value(Some(p.to_string())))
            }
        };
        let (f, n) = match w {
            ["ip" | "ip6", "daddr", ..] => (v(st.dst.to_string()), 2),
            ["ip" | "ip6", "saddr", ..] => (v(pkt.src.to_string()), 2),
            ["meta", "l4proto", ..] => (v(pkt.proto_name().to_string()), 2),
            ["th", "dport", ..] => (port(st.dport), 2),
            // nft's listing names the port by the protocol the rule depends on.
            [proto @ ("tcp" | "udp" | "sctp"), "dport", ..] => {
                if *proto == pkt.proto_name() {
                    (port(st.dport), 2)
                } else {
                    (Some(Field::Value(None)), 2)
                }
            }
            ["ct", "original", "ip" | "ip6", "daddr", ..] => (v(pkt.dst.to_string()), 4),
            ["ct", "original", "proto-dst", ..] => (port(pkt.dport), 3),
            ["numgen", "random" | "inc", "mod", n, ..] => (Some(Field::Numgen(n.parse().ok()?)), 4),
            ["jhash", rest @ ..] => {
                let m = rest.iter().position(|x| *x == "mod")?;
                let (n, seed) = (rest.get(m + 1)?, rest.get(m + 3)?);
                let bytes = match &rest[..m] {
                    ["ip" | "ip6", "saddr"] => Some(
                        svcnet_lb::hash::FlowKeyBytes::addr(pkt.src)
                            .as_bytes()
                            .to_vec(),
                    ),
                    ["ip" | "ip6", "daddr", ".", "th", "dport"] => Some(
                        svcnet_lb::hash::FlowKeyBytes::addr_port(st.dst, st.dport)
                            .as_bytes()
                            .to_vec(),
                    ),
                    ["ip" | "ip6", "saddr", ".", "th", "sport"] => None,
                    _ => return None,
                };
                let f = Field::Jhash(bytes, n.parse().ok()?, parse_u32(seed)?);
                (Some(f), m + 5)
            }
            _ => return None,
        };
        Some((f?, n))
    }

    /// A concatenation at `w[..]`: its alternatives (values with their probability factor)
    /// and the words it took; `None` when `w` does not start with a field.
    #[allow(clippy::type_complexity)]
    pub(super) fn concat(
        &self,
        pkt: &Packet,
        st: &St,
        w: &[&str],
    ) -> Option<(Vec<(Vec<Option<String>>, f64)>, usize)> {
        let mut alts: Vec<(Vec<Option<String>>, f64)> = vec![(Vec::new(), 1.0)];
        let mut i = 0;
        loop {
            let (f, n) = self.field(pkt, st, &w[i..])?;
            i += n;
            let choices: Vec<(Option<String>, f64)> = match f {
                Field::Value(v) => vec![(v, 1.0)],
                Field::Numgen(n) => spread(n),
                Field::Jhash(None, n, _) => spread(n as usize),
                Field::Jhash(Some(bytes), n, seed) => vec![(
                    Some(svcnet_lb::hash::nft_jhash(&bytes, seed, n).to_string()),
                    1.0,
                )],
            };
            alts = alts
                .into_iter()
                .flat_map(|(vals, p)| {
                    choices.iter().map(move |(c, q)| {
                        let mut v = vals.clone();
                        v.push(c.clone());
                        (v, p * q)
                    })
                })
                .collect();
            if w.get(i) != Some(&".") {
                return Some((alts, i));
            }
            i += 1;
        }
    }

    /// `dnat [ip] to …`: an address and port, or a concatenation looked up in a map (each
    /// slot a branch; a slot the map lacks does not match, and its branch goes on).
    pub(super) fn dnat(
        &self,
        chain: &str,
        rule: &str,
        st: St,
        pkt: &Packet,
        rest: &[&str],
    ) -> Result<Branches, TraceError> {
        let bad = |message: &str| TraceError {
            chain: chain.to_string(),
            rule: rule.to_string(),
            message: message.to_string(),
        };
        let rest = match rest {
            ["ip" | "ip6", "to", r @ ..] | ["to", r @ ..] => r,
            _ => return Err(bad("unknown dnat form")),
        };
        let ended = |mut s: St, to: &str| -> Result<St, TraceError> {
            let (ip, port) = match to.split_once(" . ") {
                Some((ip, port)) => (ip.to_string(), port.to_string()),
                None => {
                    let (ip, port) = to
                        .rsplit_once(':')
                        .ok_or_else(|| bad("dnat without port"))?;
                    (ip.trim_matches(['[', ']']).to_string(), port.to_string())
                }
            };
            s.dst = ip.trim().parse().map_err(|_| bad("bad dnat address"))?;
            s.dport = port.trim().parse().map_err(|_| bad("bad dnat port"))?;
            s.dnat = true;
            let note = s
                .frontend
                .as_ref()
                .map_or(String::new(), |c| format!(" # {c}"));
            s.ended_by = Some((chain.to_string(), format!("{rule}{note}")));
            Ok(s)
        };
        if let [to] = rest {
            return Ok(vec![(ended(st, to)?, Some(Verdict::End(End::Accept)))]);
        }
        let (alts, n) = self
            .concat(pkt, &st, rest)
            .ok_or_else(|| bad("unknown dnat key"))?;
        let ["map", map] = &rest[n..] else {
            return Err(bad("a dnat key without a map"));
        };
        let name = map.trim_start_matches('@');
        let mut out = Vec::new();
        for (values, p) in alts {
            let mut s = st.clone();
            s.p *= p;
            let hit = values
                .into_iter()
                .collect::<Option<Vec<String>>>()
                .and_then(|v| self.lookup(name, &v))
                .and_then(|e| split_element(e).2);
            match hit {
                Some(to) => out.push((ended(s, to)?, Some(Verdict::End(End::Accept)))),
                None => out.push((s, None)),
            }
        }
        Ok(out)
    }

    /// `values` looked up in the verdict map `map` (a named map or an inline one).
    pub(super) fn vmap(
        &self,
        chain: &str,
        rule: &str,
        mut st: St,
        values: &[String],
        map: &str,
    ) -> Result<Branches, TraceError> {
        let bad = |message: &str| TraceError {
            chain: chain.to_string(),
            rule: rule.to_string(),
            message: message.to_string(),
        };
        let entries: Vec<String> = match map.strip_prefix('@') {
            Some(name) => self.elements(name).to_vec(),
            None => inline(map).ok_or_else(|| bad("bad map"))?,
        };
        let hit = entries
            .iter()
            .map(|e| split_element(e))
            .find(|(k, _, _)| key_matches(k, values));
        match hit {
            Some((_, comment, Some(v))) => {
                if let Some(c) = comment {
                    st.frontend = Some(c.to_string());
                }
                let verdict = Self::value_verdict(v).ok_or_else(|| bad("bad verdict"))?;
                Ok(vec![(st, Some(verdict))])
            }
            Some((_, _, None)) => Err(bad("a verdict map element without a verdict")),
            None => Ok(vec![(st, None)]),
        }
    }
}
