//! The ruleset a tracer walks, from either source: `nft list table` text as the kernel holds
//! it ([`Ruleset::parse_listing`]) or a [`FakeNft`]'s table ([`Ruleset::from_fake`]). Both
//! give rules as nft text; the kernel's listing is the renderer's text in nft's normal form
//! (single-element sets without braces, `numgen … mod n 0` without `==`, marks zero-padded),
//! and the walker accepts both forms, so one interpreter serves both sources.

use std::collections::BTreeMap;

use crate::FakeNft;
use crate::tx::BaseChain;

/// A chain: its hook when it is a base chain, and its rules in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainDef {
    pub base: Option<BaseChain>,
    pub rules: Vec<String>,
}

/// One table's chains and its sets' and maps' elements (`key` or `key : value`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub chains: BTreeMap<String, ChainDef>,
    pub sets: BTreeMap<String, Vec<String>>,
}

/// A listing the parser cannot read (names the line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("nft listing, line {line}: {message}")]
pub struct ListingError {
    pub line: usize,
    pub message: String,
}

/// The standard priority names of the `ip`/`ip6`/`inet` families (nft(8), "CHAINS").
fn priority(text: &str) -> Option<i32> {
    let mut words = text.split_whitespace();
    let base = words.next()?;
    let base: i32 = match base {
        "raw" => -300,
        "mangle" => -150,
        "dstnat" => -100,
        "filter" => 0,
        "security" => 50,
        "srcnat" => 100,
        n => n.parse().ok()?,
    };
    match (words.next(), words.next()) {
        (None, _) => Some(base),
        (Some("+"), Some(n)) => Some(base + n.parse::<i32>().ok()?),
        (Some("-"), Some(n)) => Some(base - n.parse::<i32>().ok()?),
        _ => None,
    }
}

fn static_word(w: &str, known: &[&'static str]) -> Option<&'static str> {
    known.iter().copied().find(|k| *k == w)
}

/// `type filter hook prerouting priority dstnat - 10; policy accept;`
fn base_chain(line: &str) -> Option<BaseChain> {
    let decl = line.split(';').next()?;
    let rest = decl.strip_prefix("type ")?;
    let (kind, rest) = rest.split_once(" hook ")?;
    let (hook, prio) = rest.split_once(" priority ")?;
    Some(BaseChain {
        kind: static_word(kind.trim(), &["filter", "nat", "route"])?,
        hook: static_word(
            hook.trim(),
            &["prerouting", "input", "forward", "output", "postrouting"],
        )?,
        priority: priority(prio)?,
    })
}

/// Splits an `elements = { … }` body on its top-level commas; an element's timeout and
/// expiry (`10.244.4.2 timeout 3h expires 2h59m`) are dropped.
fn elements(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    let mut push = |cur: &mut String| {
        let e = std::mem::take(cur);
        // `key timeout 3h expires 2h59m : value`: the value stays.
        let mut words = Vec::new();
        let mut it = e.split_whitespace();
        while let Some(w) = it.next() {
            if w == "timeout" || w == "expires" {
                it.next();
            } else {
                words.push(w);
            }
        }
        let e = words.join(" ");
        if !e.is_empty() {
            out.push(e);
        }
    };
    for ch in body.chars() {
        match ch {
            '{' => {
                depth += 1;
                cur.push(ch);
            }
            '}' => {
                depth = depth.saturating_sub(1);
                cur.push(ch);
            }
            ',' if depth == 0 => push(&mut cur),
            c => cur.push(c),
        }
    }
    push(&mut cur);
    out
}

/// The inside of a `{ … }` body once its braces balance.
fn closed(body: &str) -> Option<&str> {
    if body.matches('{').count() > body.matches('}').count() {
        return None;
    }
    let start = body.find('{')? + 1;
    let end = body.rfind('}')?;
    body.get(start..end)
}

enum Block {
    None,
    Chain(String),
    Set(String),
}

impl Ruleset {
    /// Parses `nft list table <family> <name>` output (one table).
    pub fn parse_listing(text: &str) -> Result<Ruleset, ListingError> {
        let mut rs = Ruleset::default();
        let mut block = Block::None;
        // An `elements = {` body spanning lines, with the set it belongs to.
        let mut pending: Option<(String, String)> = None;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let err = |message: String| ListingError {
                line: i + 1,
                message,
            };
            if let Some((set, mut body)) = pending.take() {
                body.push(' ');
                body.push_str(line);
                match closed(&body) {
                    Some(inner) => rs.sets.entry(set).or_default().extend(elements(inner)),
                    None => pending = Some((set, body)),
                }
                continue;
            }
            if line.is_empty() || line.starts_with("table ") || line.starts_with('#') {
                continue;
            }
            if line == "}" {
                block = Block::None;
                continue;
            }
            if let Some(name) = line.strip_prefix("chain ") {
                let name = name.trim_end_matches('{').trim().to_string();
                rs.chains.entry(name.clone()).or_default();
                block = Block::Chain(name);
                continue;
            }
            if let Some(name) = line
                .strip_prefix("set ")
                .or_else(|| line.strip_prefix("map "))
            {
                let name = name.trim_end_matches('{').trim().to_string();
                rs.sets.entry(name.clone()).or_default();
                block = Block::Set(name);
                continue;
            }
            match &block {
                Block::None => {
                    if !line.starts_with("comment ") && !line.starts_with("flags ") {
                        return Err(err(format!("unexpected {line:?} outside a chain or set")));
                    }
                }
                Block::Chain(name) => {
                    let chain = rs.chains.entry(name.clone()).or_default();
                    if line.starts_with("type ") {
                        chain.base = Some(
                            base_chain(line)
                                .ok_or_else(|| err(format!("unknown base chain {line:?}")))?,
                        );
                    } else if !line.starts_with("comment ") && !line.starts_with("policy ") {
                        chain.rules.push(line.to_string());
                    }
                }
                Block::Set(name) => {
                    if let Some(body) = line.strip_prefix("elements = ") {
                        match closed(body) {
                            Some(inner) => rs
                                .sets
                                .entry(name.clone())
                                .or_default()
                                .extend(elements(inner)),
                            None => pending = Some((name.clone(), body.to_string())),
                        }
                    }
                }
            }
        }
        if pending.is_some() {
            return Err(ListingError {
                line: text.lines().count(),
                message: "unterminated elements".into(),
            });
        }
        Ok(rs)
    }

    /// The same view of a fake's table.
    pub fn from_fake(fake: &FakeNft) -> Ruleset {
        let base: BTreeMap<String, BaseChain> = fake.base_chains().into_iter().collect();
        let chains = fake
            .chain_names()
            .into_iter()
            .map(|name| {
                let def = ChainDef {
                    base: base.get(&name).cloned(),
                    rules: fake.rules(&name).unwrap_or_default(),
                };
                (name, def)
            })
            .collect();
        let sets = fake
            .set_names()
            .into_iter()
            .map(|name| {
                let e = fake.elements(&name);
                (name, e)
            })
            .collect();
        Ruleset { chains, sets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_chains_hooks_and_multiline_elements() {
        let text = "table ip svcnet {
	comment \"svcnet service proxy\"
	set cluster-ips {
		type ipv4_addr
		elements = { 10.96.0.10, 10.96.0.11,
			     10.96.0.12 }
	}

	map m {
		type inet_proto . inet_service : verdict
		elements = { tcp . 30080 : goto external-x, tcp . 1 : drop }
	}
	set affinity-a {
		type ipv4_addr
		flags dynamic,timeout
		timeout 3h
		elements = { 10.244.4.2 timeout 3h expires 2h59m59s }
	}
	map affinity {
		typeof ip saddr . ip daddr . meta l4proto . th dport : ip daddr . th dport
		flags dynamic,timeout
		elements = { 10.0.0.1 . 10.96.0.11 . tcp . 80 timeout 1m40s expires 1m39s996ms : 10.244.1.2 . 8080 }
	}
	chain filter-prerouting {
		type filter hook prerouting priority dstnat - 10; policy accept;
		ct state new jump firewall-check
	}
	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}
}
";
        let rs = Ruleset::parse_listing(text).unwrap();
        assert_eq!(
            rs.sets["cluster-ips"],
            ["10.96.0.10", "10.96.0.11", "10.96.0.12"]
        );
        assert_eq!(
            rs.sets["m"],
            ["tcp . 30080 : goto external-x", "tcp . 1 : drop"]
        );
        assert_eq!(rs.sets["affinity-a"], ["10.244.4.2"]);
        assert_eq!(
            rs.sets["affinity"],
            ["10.0.0.1 . 10.96.0.11 . tcp . 80 : 10.244.1.2 . 8080"]
        );
        let pre = &rs.chains["filter-prerouting"];
        assert_eq!(
            pre.base,
            Some(BaseChain {
                kind: "filter",
                hook: "prerouting",
                priority: -110
            })
        );
        assert_eq!(pre.rules, ["ct state new jump firewall-check"]);
        assert_eq!(
            rs.chains["nat-postrouting"].base.as_ref().unwrap().priority,
            100
        );
        assert!(
            Ruleset::parse_listing("chain x {\n type nat hook nowhere priority 0;\n}").is_err()
        );
    }
}
