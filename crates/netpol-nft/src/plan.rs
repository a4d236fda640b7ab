//! From the last applied [`Ruleset`] and the next one to one transaction: the whole table
//! when nothing is known to be applied, otherwise only what changed (a pod joining a
//! selector is one `add element`; a changed policy flushes and refills its own chain).
//! Either way one atomic batch: the kernel never holds half a change.

use std::collections::BTreeSet;

use svcnet_libnft::{Op, SetDef, SetKind, Transaction};

use crate::incremental::Changes;
use crate::names;
use crate::render::{ChainSpec, Ruleset, SetSpec};

/// nft keeps at most 128 bytes of a comment.
const COMMENT_MAX: usize = 120;

/// A verdict map (the isolation maps) or a plain set, by its type.
fn kind(s: &SetSpec) -> SetKind {
    if s.type_.contains(" : ") {
        SetKind::Map
    } else {
        SetKind::Set
    }
}

/// An element's key and value (`10.0.0.1 : jump in-ns-…` in a map).
fn key_value(e: &str) -> (String, Option<String>) {
    match e.split_once(" : ") {
        Some((k, v)) => (k.to_string(), Some(v.to_string())),
        None => (e.to_string(), None),
    }
}

fn add_element(tx: &mut Transaction, set: &str, e: &str) {
    let (key, value) = key_value(e);
    tx.push(Op::AddElement {
        set: set.to_string(),
        key,
        value,
    });
}

/// A set's declaration (what the text path writes, and what the netlink path checks a
/// declaration against).
pub(crate) fn set_def(name: &str, s: &SetSpec) -> SetDef {
    let comment: String = s
        .comment
        .chars()
        .filter(|c| c.is_ascii() && *c != '"')
        .take(COMMENT_MAX)
        .collect();
    SetDef {
        name: name.to_string(),
        kind: kind(s),
        type_: s.type_.to_string(),
        flags: if s.interval { vec!["interval"] } else { vec![] },
        timeout_seconds: None,
        size: None,
        comment: Some(comment),
    }
}

fn add_set(tx: &mut Transaction, name: &str, s: &SetSpec) {
    tx.push(Op::AddSet(set_def(name, s)));
    for e in &s.elements {
        add_element(tx, name, e);
    }
}

fn add_rules(tx: &mut Transaction, name: &str, c: &ChainSpec) {
    for rule in &c.rules {
        tx.push(Op::AddRule {
            chain: name.to_string(),
            rule: rule.clone(),
        });
    }
}

/// The whole table, recreated: whatever was there (a crashed agent's leftovers, a table
/// changed behind svcnet's back) is replaced in the same batch.
pub fn plan_full(next: &Ruleset) -> Transaction {
    let mut tx = Transaction::new(next.family, names::TABLE);
    let comment = Some("svcnet NetworkPolicy enforcement".to_string());
    tx.push(Op::AddTable {
        comment: comment.clone(),
    });
    tx.push(Op::DeleteTable);
    tx.push(Op::AddTable { comment });
    // Every chain exists before any rule or map element jumps to it.
    for (name, c) in &next.chains {
        tx.push(Op::AddChain {
            name: name.clone(),
            base: c.base.clone(),
        });
    }
    for (name, s) in &next.sets {
        add_set(&mut tx, name, s);
    }
    for (name, c) in &next.chains {
        add_rules(&mut tx, name, c);
    }
    tx
}

/// What turns `prev` (applied) into `next`; [`plan_full`] when `prev` is unknown.
pub fn plan(prev: Option<&Ruleset>, next: &Ruleset) -> Transaction {
    let Some(prev) = prev else {
        return plan_full(next);
    };
    let sets: BTreeSet<&str> = (prev.sets.keys().chain(next.sets.keys()))
        .map(String::as_str)
        .collect();
    let chains: BTreeSet<&str> = (prev.chains.keys().chain(next.chains.keys()))
        .map(String::as_str)
        .collect();
    plan_between(prev, next, &sets, &chains)
}

/// What turns `prev` (applied) into `next` when they can differ only in the objects named
/// by `changes` (what [`crate::Renderer`] recorded): [`plan`]'s transaction, without
/// comparing the rest of the table.
pub fn plan_changes(prev: &Ruleset, next: &Ruleset, changes: &Changes) -> Transaction {
    let sets: BTreeSet<&str> = changes.sets.iter().map(String::as_str).collect();
    let chains: BTreeSet<&str> = changes.chains.iter().map(String::as_str).collect();
    plan_between(prev, next, &sets, &chains)
}

/// The transaction for the sets and chains named (each may exist in either or both).
fn plan_between(
    prev: &Ruleset,
    next: &Ruleset,
    sets: &BTreeSet<&str>,
    chains: &BTreeSet<&str>,
) -> Transaction {
    // A set's name fixes its type; a differing one means a renderer change: start over.
    let retyped = sets
        .iter()
        .any(|name| match (prev.sets.get(*name), next.sets.get(*name)) {
            (Some(p), Some(s)) => (p.type_, p.interval) != (s.type_, s.interval),
            _ => false,
        });
    let rebased =
        chains.iter().any(
            |name| match (prev.chains.get(*name), next.chains.get(*name)) {
                (Some(p), Some(c)) => p.base != c.base,
                _ => false,
            },
        );
    if retyped || rebased {
        return plan_full(next);
    }
    let changed: Vec<(&str, &ChainSpec)> = chains
        .iter()
        .filter_map(|name| Some((*name, next.chains.get(*name)?)))
        .filter(|(name, c)| prev.chains.get(*name).is_none_or(|p| p.rules != c.rules))
        .collect();
    let removed: Vec<&str> = chains
        .iter()
        .copied()
        .filter(|name| prev.chains.contains_key(*name) && !next.chains.contains_key(*name))
        .collect();
    // nft compiles a chain block without loading its cache of the table, so every set the
    // written rules use is declared in the batch (idempotent for an existing set); so is
    // every set receiving elements, which then go in declaration form.
    let referenced: BTreeSet<&str> = changed
        .iter()
        .flat_map(|(_, c)| c.rules.iter())
        .flat_map(|r| r.split_whitespace())
        .filter_map(|w| w.strip_prefix('@'))
        .collect();
    let mut tx = Transaction::new(next.family, names::TABLE);
    // New chains first (empty): map elements and rules may jump to them.
    for (name, c) in &changed {
        if !prev.chains.contains_key(*name) {
            tx.push(Op::AddChain {
                name: name.to_string(),
                base: c.base.clone(),
            });
        }
    }
    for name in sets {
        if let (Some(old), Some(s)) = (prev.sets.get(*name), next.sets.get(*name)) {
            for e in old.elements.difference(&s.elements) {
                tx.push(Op::DeleteElement {
                    set: name.to_string(),
                    key: key_value(e).0,
                });
            }
        }
    }
    for name in sets.union(&referenced) {
        let Some(s) = next.sets.get(*name) else {
            continue;
        };
        let Some(old) = prev.sets.get(*name) else {
            add_set(&mut tx, name, s);
            continue;
        };
        let added: Vec<&String> = match sets.contains(name) {
            true => s.elements.difference(&old.elements).collect(),
            false => Vec::new(),
        };
        if added.is_empty() && !referenced.contains(name) {
            continue;
        }
        tx.push(Op::AddSet(set_def(name, s)));
        for e in added {
            add_element(&mut tx, name, e);
        }
    }
    // Rules that jump to a removed chain or use a removed set go before those are deleted.
    let rewritten = changed
        .iter()
        .filter(|(n, _)| prev.chains.contains_key(*n))
        .map(|(n, _)| *n);
    for name in rewritten.chain(removed.iter().copied()) {
        tx.push(Op::FlushChain(name.to_string()));
    }
    for (name, c) in changed {
        add_rules(&mut tx, name, c);
    }
    for name in removed {
        tx.push(Op::DeleteChain(name.to_string()));
    }
    for name in sets {
        if let (Some(old), None) = (prev.sets.get(*name), next.sets.get(*name)) {
            tx.push(Op::DeleteSet {
                name: name.to_string(),
                kind: kind(old),
            });
        }
    }
    tx
}
