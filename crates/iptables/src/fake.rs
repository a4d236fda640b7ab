//! `FakeIptables`: in-memory iptables tables that apply the same restore text as
//! `iptables-restore --noflush` (each table's section committed atomically) and reject what
//! the kernel would reject: rules in or jumps to chains that do not exist, deleting a chain
//! that is not empty or still referenced, filtering verdicts in the nat table, NAT targets
//! outside it. Its `dump` is canonical text for snapshot tests, and its tables are what the
//! test-only packet tracer walks. Modelled on kube-proxy's fake iptables and knftables' fake.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::payload::{Hook, Payload, Table, split_args};
use crate::plan::KernelChains;

/// Why the fake refused a restore (the kernel would refuse it too). Tables committed before
/// the failing one stay applied, as with the real `iptables-restore`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line} ({text}): {message}")]
pub struct FakeError {
    pub line: usize,
    pub text: String,
    pub message: String,
}

const BUILTIN: [(Table, &[&str]); 3] = [
    (
        Table::Mangle,
        &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    ),
    (Table::Filter, &["INPUT", "FORWARD", "OUTPUT"]),
    (
        Table::Nat,
        &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
    ),
];
const STANDARD_TARGETS: [&str; 9] = [
    "ACCEPT",
    "DROP",
    "REJECT",
    "RETURN",
    "DNAT",
    "SNAT",
    "MARK",
    "MASQUERADE",
    "LOG",
];

/// One table: chain name → rules (each rule as its arguments after `-A <chain>`).
pub type FakeTable = BTreeMap<String, Vec<Vec<String>>>;

/// Fake tables of one family.
#[derive(Clone, Debug)]
pub struct FakeIptables {
    tables: BTreeMap<Table, FakeTable>,
}

impl Default for FakeIptables {
    fn default() -> Self {
        Self::new()
    }
}

fn target(args: &[String]) -> Option<&str> {
    args.iter()
        .position(|a| a == "-j" || a == "-g")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn is_builtin(table: Table, chain: &str) -> bool {
    BUILTIN
        .iter()
        .any(|(t, cs)| *t == table && cs.contains(&chain))
}

impl FakeIptables {
    pub fn new() -> Self {
        let tables = BUILTIN
            .iter()
            .map(|(t, cs)| (*t, cs.iter().map(|c| (c.to_string(), Vec::new())).collect()))
            .collect();
        Self { tables }
    }

    /// Applies a payload through its text (so the text itself is what is checked).
    pub fn apply(&mut self, payload: &Payload) -> Result<(), FakeError> {
        self.restore(&payload.to_string())
    }

    /// `iptables-restore --noflush` of `text`.
    pub fn restore(&mut self, text: &str) -> Result<(), FakeError> {
        let mut current: Option<(Table, FakeTable)> = None;
        for (i, line) in text.lines().enumerate() {
            let err = |message: String| FakeError {
                line: i + 1,
                text: line.to_string(),
                message,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                let table = Table::ALL
                    .into_iter()
                    .find(|t| t.as_str() == name)
                    .ok_or_else(|| err(format!("unknown table {name}")))?;
                let copy = self.tables.get(&table).cloned().unwrap_or_default();
                current = Some((table, copy));
                continue;
            }
            let Some((table, work)) = current.as_mut() else {
                return Err(err("line outside a table".into()));
            };
            if line == "COMMIT" {
                if let Some((table, work)) = current.take() {
                    self.tables.insert(table, work);
                }
                continue;
            }
            if let Some(decl) = line.strip_prefix(':') {
                let name = decl.split_whitespace().next().unwrap_or_default();
                if is_builtin(*table, name) {
                    return Err(err("svcnet must not declare built-in chains".into()));
                }
                work.insert(name.to_string(), Vec::new());
                continue;
            }
            let args = split_args(line);
            match args.first().map(String::as_str) {
                Some("-A") => {
                    let chain = args.get(1).cloned().unwrap_or_default();
                    let rest = args[2.min(args.len())..].to_vec();
                    check_rule(*table, work, &rest).map_err(err)?;
                    work.get_mut(&chain)
                        .ok_or_else(|| err(format!("no such chain {chain}")))?
                        .push(rest);
                }
                Some("-I") => {
                    let chain = args.get(1).cloned().unwrap_or_default();
                    if args.get(2).map(String::as_str) != Some("1") {
                        return Err(err("svcnet only inserts at position 1".into()));
                    }
                    let rest = args[3.min(args.len())..].to_vec();
                    check_rule(*table, work, &rest).map_err(err)?;
                    work.get_mut(&chain)
                        .ok_or_else(|| err(format!("no such chain {chain}")))?
                        .insert(0, rest);
                }
                Some("-D") => {
                    let chain = args.get(1).cloned().unwrap_or_default();
                    let rest = args[2.min(args.len())..].to_vec();
                    let rules = work
                        .get_mut(&chain)
                        .ok_or_else(|| err(format!("no such chain {chain}")))?;
                    let pos = rules.iter().position(|r| *r == rest).ok_or_else(|| {
                        err("bad rule (does a matching rule exist in that chain?)".into())
                    })?;
                    rules.remove(pos);
                }
                Some("-X") => {
                    let chain = args.get(1).cloned().unwrap_or_default();
                    match work.get(&chain) {
                        None => return Err(err(format!("no such chain {chain}"))),
                        Some(r) if !r.is_empty() => {
                            return Err(err(format!("chain {chain} is not empty")));
                        }
                        _ => {}
                    }
                    if work
                        .values()
                        .flatten()
                        .any(|r| target(r) == Some(chain.as_str()))
                    {
                        return Err(err(format!("chain {chain} is still referenced")));
                    }
                    work.remove(&chain);
                }
                _ => return Err(err("unsupported restore line".into())),
            }
        }
        if current.is_some() {
            return Err(FakeError {
                line: text.lines().count(),
                text: String::new(),
                message: "missing COMMIT".into(),
            });
        }
        Ok(())
    }

    /// `-C` then `-I <chain> 1` (kube-proxy's `EnsureRule`); `Ok(true)` when it was added.
    pub fn ensure_hook(&mut self, hook: &Hook) -> Result<bool, FakeError> {
        let table = self.tables.entry(hook.table).or_default();
        let err = |message: String| FakeError {
            line: 0,
            text: hook.to_string(),
            message,
        };
        check_rule(hook.table, table, &hook.rule.args).map_err(err)?;
        let chain = table
            .get_mut(hook.chain)
            .ok_or_else(|| err(format!("no such chain {}", hook.chain)))?;
        if chain.contains(&hook.rule.args) {
            return Ok(false);
        }
        chain.insert(0, hook.rule.args.clone());
        Ok(true)
    }

    /// The rules of every chain of a table.
    pub fn table(&self, table: Table) -> &FakeTable {
        static EMPTY: FakeTable = BTreeMap::new();
        self.tables.get(&table).unwrap_or(&EMPTY)
    }

    /// svcnet chains present, per table, as `iptables-save` would list them.
    pub fn kernel_chains(&self) -> KernelChains {
        self.tables
            .iter()
            .map(|(t, chains)| {
                (
                    *t,
                    chains
                        .keys()
                        .filter(|c| c.starts_with(crate::names::PREFIX))
                        .cloned()
                        .collect(),
                )
            })
            .collect()
    }

    /// Someone else removes every chain and rule (`iptables -F; iptables -X` in every
    /// table), as firewall reloads do.
    pub fn tamper_flush_all(&mut self) {
        *self = Self::new();
    }

    /// Canonical text: every chain with its rules, tables in order, chains sorted.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (table, chains) in &self.tables {
            if chains.values().all(Vec::is_empty) && chains.keys().all(|c| is_builtin(*table, c)) {
                continue;
            }
            writeln!(out, "*{table}").ok();
            for name in chains.keys() {
                writeln!(out, ":{name}").ok();
            }
            for (name, rules) in chains {
                for r in rules {
                    let rule = crate::payload::Rule::new(name, r.clone());
                    writeln!(out, "-A {name} {}", rule.spec()).ok();
                }
            }
        }
        out
    }
}

fn check_rule(table: Table, work: &FakeTable, args: &[String]) -> Result<(), String> {
    let Some(t) = target(args) else {
        return Ok(());
    };
    if STANDARD_TARGETS.contains(&t) {
        let nat_only = matches!(t, "DNAT" | "SNAT" | "MASQUERADE");
        let filtering = matches!(t, "DROP" | "REJECT");
        if nat_only && table != Table::Nat {
            return Err(format!("target {t} is only valid in the nat table"));
        }
        if filtering && table == Table::Nat {
            return Err(format!("the nat table is not intended for filtering ({t})"));
        }
        return Ok(());
    }
    if !work.contains_key(t) {
        return Err(format!("dangling reference to chain {t}"));
    }
    Ok(())
}
