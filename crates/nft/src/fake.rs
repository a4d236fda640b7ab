//! `FakeNft`: an in-memory nft table that applies the same transaction values as the kernel,
//! atomically, and rejects what the kernel would reject: rules or elements referencing a chain
//! or set that does not exist (dangling references), deleting a chain or set still referenced,
//! adding to or deleting from objects that do not exist. Its `dump` is canonical text for
//! snapshot tests. Modelled on knftables' fake.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::tx::{BaseChain, Op, SetDef, Transaction};

/// Why the fake refused a transaction (the kernel would refuse it too).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("op {index} ({op}): {message}")]
pub struct FakeError {
    pub index: usize,
    pub op: String,
    pub message: String,
}

#[derive(Clone, Debug, Default)]
struct Chain {
    base: Option<BaseChain>,
    rules: Vec<String>,
}

/// An element's value and comment, by key.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Value {
    value: Option<String>,
    comment: Option<String>,
}

#[derive(Clone, Debug)]
struct Set {
    def: SetDef,
    elements: BTreeMap<String, Value>,
}

/// Splits `key comment "c"` into the key and its comment.
fn split_comment(key: &str) -> (String, Option<String>) {
    match key.split_once(" comment \"") {
        Some((k, c)) => (k.to_string(), Some(c.trim_end_matches('"').to_string())),
        None => (key.to_string(), None),
    }
}

/// An element as `nft list` prints it: `key [comment "c"] [: value]`.
fn element_text(key: &str, v: &Value) -> String {
    let mut out = key.to_string();
    if let Some(c) = &v.comment {
        out.push_str(&format!(" comment \"{c}\""));
    }
    if let Some(value) = &v.value {
        out.push_str(&format!(" : {value}"));
    }
    out
}

#[derive(Clone, Debug, Default)]
struct Table {
    comment: Option<String>,
    chains: BTreeMap<String, Chain>,
    sets: BTreeMap<String, Set>,
}

/// A fake nft holding one table.
#[derive(Clone, Debug, Default)]
pub struct FakeNft {
    table: Option<Table>,
}

/// Chains (`jump`/`goto` targets) and sets (`@name`) a rule or element value references.
fn references(text: &str) -> (Vec<String>, Vec<String>) {
    let mut chains = Vec::new();
    let mut sets = Vec::new();
    let mut words = text.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if (w == "jump" || w == "goto")
            && let Some(target) = words.peek()
        {
            chains.push(target.trim_end_matches([',', '}']).to_string());
        } else if let Some(name) = w.strip_prefix('@') {
            sets.push(name.trim_end_matches([',', '}']).to_string());
        }
    }
    (chains, sets)
}

impl Table {
    fn check_refs(&self, text: &str) -> Result<(), String> {
        let (chains, sets) = references(text);
        if let Some(c) = chains.iter().find(|c| !self.chains.contains_key(*c)) {
            return Err(format!("dangling reference to chain {c}"));
        }
        if let Some(s) = sets.iter().find(|s| !self.sets.contains_key(*s)) {
            return Err(format!("dangling reference to set {s}"));
        }
        Ok(())
    }

    fn all_texts(&self) -> impl Iterator<Item = &String> {
        self.chains.values().flat_map(|c| c.rules.iter()).chain(
            self.sets
                .values()
                .flat_map(|s| s.elements.values().filter_map(|v| v.value.as_ref())),
        )
    }

    fn chain_referenced(&self, name: &str) -> bool {
        self.all_texts()
            .any(|t| references(t).0.iter().any(|c| c == name))
    }

    fn set_referenced(&self, name: &str) -> bool {
        self.all_texts()
            .any(|t| references(t).1.iter().any(|s| s == name))
    }
}

impl FakeNft {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies a transaction atomically: on error nothing changes.
    pub fn apply(&mut self, tx: &Transaction) -> Result<(), FakeError> {
        let mut table = self.table.clone();
        for (index, op) in tx.ops.iter().enumerate() {
            let fail = |message: String| FakeError {
                index,
                op: Transaction {
                    family: tx.family,
                    table: tx.table.clone(),
                    ops: vec![op.clone()],
                }
                .to_string()
                .trim_end()
                .to_string(),
                message,
            };
            if let Op::AddTable { comment } = op {
                let t = table.get_or_insert_with(Table::default);
                if comment.is_some() {
                    t.comment = comment.clone();
                }
                continue;
            }
            if let Op::DeleteTable = op {
                if table.take().is_none() {
                    return Err(fail("no such table".into()));
                }
                continue;
            }
            let Some(t) = table.as_mut() else {
                return Err(fail("no such table".into()));
            };
            apply_op(t, op).map_err(fail)?;
        }
        self.table = table;
        Ok(())
    }

    /// Canonical text of the table (chains, then sets and maps, sorted by name).
    pub fn dump(&self) -> String {
        let Some(t) = &self.table else {
            return String::new();
        };
        let mut out = String::new();
        if let Some(c) = &t.comment {
            writeln!(out, "comment \"{c}\"").ok();
        }
        for (name, s) in &t.sets {
            let flags = if s.def.flags.is_empty() {
                String::new()
            } else {
                format!(" flags {}", s.def.flags.join(","))
            };
            let mut timeout = s
                .def
                .timeout_seconds
                .map(|t| format!(" timeout {t}s"))
                .unwrap_or_default();
            if let Some(size) = s.def.size {
                timeout.push_str(&format!(" size {size}"));
            }
            writeln!(
                out,
                "{:?} {name} [{}{flags}{timeout}]",
                s.def.kind, s.def.type_
            )
            .ok();
            for (k, v) in &s.elements {
                writeln!(out, "  {}", element_text(k, v)).ok();
            }
        }
        for (name, c) in &t.chains {
            match &c.base {
                Some(b) => {
                    writeln!(out, "chain {name} [{} {} {}]", b.kind, b.hook, b.priority).ok()
                }
                None => writeln!(out, "chain {name}").ok(),
            };
            for r in &c.rules {
                writeln!(out, "  {r}").ok();
            }
        }
        out
    }

    /// Number of chains (for assertions about stale-chain removal).
    pub fn chain_names(&self) -> Vec<String> {
        self.table
            .iter()
            .flat_map(|t| t.chains.keys().cloned())
            .collect()
    }

    /// The base chains (name and hook), for tracers that walk the hooks in priority order.
    pub fn base_chains(&self) -> Vec<(String, BaseChain)> {
        self.table
            .iter()
            .flat_map(|t| &t.chains)
            .filter_map(|(name, c)| Some((name.clone(), c.base.clone()?)))
            .collect()
    }

    /// Names of the sets and maps.
    pub fn set_names(&self) -> Vec<String> {
        self.table
            .iter()
            .flat_map(|t| t.sets.keys().cloned())
            .collect()
    }

    /// Elements of a set or map, as `key` or `key : value`.
    pub fn elements(&self, set: &str) -> Vec<String> {
        let Some(s) = self.table.as_ref().and_then(|t| t.sets.get(set)) else {
            return Vec::new();
        };
        s.elements.iter().map(|(k, v)| element_text(k, v)).collect()
    }

    /// Rules of a chain.
    pub fn rules(&self, chain: &str) -> Option<Vec<String>> {
        self.table
            .as_ref()?
            .chains
            .get(chain)
            .map(|c| c.rules.clone())
    }

    /// Simulates someone else deleting a chain behind svcnet's back (drift).
    pub fn tamper_delete_chain(&mut self, chain: &str) {
        if let Some(t) = self.table.as_mut() {
            for c in t.chains.values_mut() {
                c.rules
                    .retain(|r| !references(r).0.iter().any(|x| x == chain));
            }
            t.chains.remove(chain);
        }
    }
}

fn apply_op(t: &mut Table, op: &Op) -> Result<(), String> {
    match op {
        Op::AddTable { .. } | Op::DeleteTable => {}
        Op::AddChain { name, base } => {
            let c = t.chains.entry(name.clone()).or_default();
            if base.is_some() {
                c.base = base.clone();
            }
        }
        Op::FlushChain(name) => t.chains.get_mut(name).ok_or("no such chain")?.rules.clear(),
        Op::DeleteChain(name) => {
            let c = t.chains.get(name).ok_or("no such chain")?;
            if !c.rules.is_empty() {
                return Err("chain is not empty".into());
            }
            if t.chain_referenced(name) {
                return Err("chain is still referenced".into());
            }
            t.chains.remove(name);
        }
        Op::AddRule { chain, rule } => {
            t.check_refs(rule)?;
            t.chains
                .get_mut(chain)
                .ok_or("no such chain")?
                .rules
                .push(rule.clone());
        }
        Op::AddSet(def) => {
            if let Some(existing) = t.sets.get(&def.name) {
                if existing.def.type_ != def.type_ || existing.def.kind != def.kind {
                    return Err("set exists with another type".into());
                }
            } else {
                t.sets.insert(
                    def.name.clone(),
                    Set {
                        def: def.clone(),
                        elements: BTreeMap::new(),
                    },
                );
            }
        }
        Op::FlushSet { name, .. } => t.sets.get_mut(name).ok_or("no such set")?.elements.clear(),
        Op::DeleteSet { name, .. } => {
            if !t.sets.contains_key(name) {
                return Err("no such set".into());
            }
            if t.set_referenced(name) {
                return Err("set is still referenced".into());
            }
            t.sets.remove(name);
        }
        Op::AddElement { set, key, value } => {
            if let Some(v) = value {
                t.check_refs(v)?;
            }
            let s = t.sets.get_mut(set).ok_or("no such set")?;
            let (key, comment) = split_comment(key);
            match s.elements.get(&key) {
                Some(existing) if existing.value != *value => {
                    return Err("element exists with another value".into());
                }
                Some(_) => {}
                None => {
                    let value = value.clone();
                    s.elements.insert(key, Value { value, comment });
                }
            }
        }
        Op::DeleteElement { set, key } => {
            let s = t.sets.get_mut(set).ok_or("no such set")?;
            s.elements.remove(key).ok_or("no such element")?;
        }
    }
    Ok(())
}
