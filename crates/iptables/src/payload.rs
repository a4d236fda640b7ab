//! An `iptables-restore` payload as a value: per table, the chains it declares (a declaration
//! creates the chain or flushes it), the rules it appends and the chains it deletes. Its
//! `Display` is the canonical restore text, applied with `--noflush` so that every chain the
//! payload does not mention (other software's, and svcnet's unchanged ones) stays untouched.
//! Each table's section is one atomic commit.

use std::fmt;

/// Address family: `iptables-restore` or `ip6tables-restore`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The command prefix: `iptables` or `ip6tables`.
    pub fn command(self) -> &'static str {
        match self {
            Self::V4 => "iptables",
            Self::V6 => "ip6tables",
        }
    }

    /// The loopback range node ports never accept.
    pub fn loopback(self) -> &'static str {
        match self {
            Self::V4 => "127.0.0.0/8",
            Self::V6 => "::1/128",
        }
    }
}

impl From<svcnet_proxy::IpFamily> for Family {
    fn from(f: svcnet_proxy::IpFamily) -> Self {
        match f {
            svcnet_proxy::IpFamily::V4 => Self::V4,
            svcnet_proxy::IpFamily::V6 => Self::V6,
        }
    }
}

/// The tables svcnet writes to, in the order a payload lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Mangle,
    Filter,
    Nat,
}

impl Table {
    pub const ALL: [Table; 3] = [Table::Mangle, Table::Filter, Table::Nat];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mangle => "mangle",
            Self::Filter => "filter",
            Self::Nat => "nat",
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rule: the chain it is appended to and its arguments after `-A <chain>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    pub chain: String,
    pub args: Vec<String>,
}

/// Quotes an argument for the restore parser when it contains spaces (comments do).
fn quote(arg: &str) -> String {
    if arg.is_empty() || arg.contains([' ', '"', '\'']) {
        format!("\"{}\"", arg.replace('"', "'"))
    } else {
        arg.to_string()
    }
}

impl Rule {
    pub fn new(chain: &str, args: Vec<String>) -> Self {
        Self {
            chain: chain.to_string(),
            args,
        }
    }

    /// The rule specification (after `-A <chain>`), quoted as the restore parser reads it;
    /// comments are always quoted (`--comment "ns/svc:port"`), as `iptables-save` prints them.
    pub fn spec(&self) -> String {
        let mut prev = "";
        let mut out = Vec::with_capacity(self.args.len());
        for a in &self.args {
            if prev == "--comment" && !a.contains('"') {
                out.push(format!("\"{a}\""));
            } else {
                out.push(quote(a));
            }
            prev = a;
        }
        out.join(" ")
    }

    /// The `-j`/`-g` target of the rule, if any.
    pub fn target(&self) -> Option<&str> {
        self.args
            .iter()
            .position(|a| a == "-j" || a == "-g")
            .and_then(|i| self.args.get(i + 1))
            .map(String::as_str)
    }
}

/// What one table's commit does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TablePayload {
    /// Chains declared (`:NAME - [0:0]`): created if missing, flushed otherwise.
    pub chains: Vec<String>,
    /// Rules appended, in order.
    pub rules: Vec<Rule>,
    /// Chains deleted (`-X`), after the rules; each must also be declared (so it is empty).
    pub deletes: Vec<String>,
    /// Rules inserted at the head of a chain (`-I <chain> 1`): missing hooks (in the commit
    /// that declares their targets), and partial syncs' new rules in chains whose last rule
    /// must stay last. Inserted in list order, so the last one ends up first.
    pub inserts: Vec<Rule>,
    /// Rules deleted by specification (`-D <chain> …`) from chains the payload does not
    /// declare: partial syncs' edits of the shared chains. Applied before everything else
    /// in the section except declarations.
    pub removes: Vec<Rule>,
}

impl TablePayload {
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
            && self.rules.is_empty()
            && self.deletes.is_empty()
            && self.inserts.is_empty()
            && self.removes.is_empty()
    }
}

/// A whole payload for one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload {
    pub family: Family,
    pub tables: Vec<(Table, TablePayload)>,
}

impl Payload {
    pub fn new(family: Family) -> Self {
        Self {
            family,
            tables: Vec::new(),
        }
    }

    /// The section of `table`, created (in [`Table::ALL`] order) when missing.
    pub fn table(&mut self, table: Table) -> &mut TablePayload {
        let pos = match self.tables.iter().position(|(t, _)| *t == table) {
            Some(p) => p,
            None => {
                let at = self.tables.iter().take_while(|(t, _)| *t < table).count();
                self.tables.insert(at, (table, TablePayload::default()));
                at
            }
        };
        &mut self.tables[pos].1
    }

    /// The last section of `table`, created (in [`Table::ALL`] order) when missing.
    pub fn last_mut(&mut self, table: Table) -> &mut TablePayload {
        match self.tables.iter().rposition(|(t, _)| *t == table) {
            Some(p) => &mut self.tables[p].1,
            None => self.table(table),
        }
    }

    /// The last section of `table` (the only one unless the payload is staged).
    pub fn get(&self, table: Table) -> Option<&TablePayload> {
        self.tables
            .iter()
            .rev()
            .find(|(t, _)| *t == table)
            .map(|(_, p)| p)
    }

    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(|(_, t)| t.is_empty())
    }

    /// Number of rules the payload appends or inserts (per table, over all its sections),
    /// for metrics and benchmarks.
    pub fn rule_count(&self, table: Table) -> usize {
        self.sections(table)
            .map(|t| t.rules.len() + t.inserts.len())
            .sum()
    }

    /// Every section of `table` (a staged payload has several nat sections, committed in
    /// order; see `plan::stage`).
    pub fn sections(&self, table: Table) -> impl Iterator<Item = &TablePayload> {
        self.tables
            .iter()
            .filter(move |(t, _)| *t == table)
            .map(|(_, p)| p)
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (table, t) in &self.tables {
            if t.is_empty() {
                continue;
            }
            writeln!(f, "*{table}")?;
            for c in &t.chains {
                writeln!(f, ":{c} - [0:0]")?;
            }
            for r in &t.removes {
                writeln!(f, "-D {} {}", r.chain, r.spec())?;
            }
            for r in &t.rules {
                writeln!(f, "-A {} {}", r.chain, r.spec())?;
            }
            for r in &t.inserts {
                writeln!(f, "-I {} 1 {}", r.chain, r.spec())?;
            }
            for c in &t.deletes {
                writeln!(f, "-X {c}")?;
            }
            writeln!(f, "COMMIT")?;
        }
        Ok(())
    }
}

/// A jump from a built-in chain into svcnet's chains, installed with `-I <chain> 1` when
/// `-C` does not find it (kube-proxy's `EnsureRule`). Hooks are not part of restore payloads:
/// a restore cannot add a rule only when it is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    pub table: Table,
    /// The built-in chain (`PREROUTING`, `INPUT`, …).
    pub chain: &'static str,
    pub rule: Rule,
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "-t {} -I {} 1 {}",
            self.table,
            self.chain,
            self.rule.spec()
        )
    }
}

/// Splits a restore line into arguments, honouring double quotes (the inverse of `spec`).
pub fn split_args(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

impl From<Family> for svcnet_proxy::IpFamily {
    fn from(f: Family) -> Self {
        match f {
            Family::V4 => Self::V4,
            Family::V6 => Self::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_restore_text_and_quotes_round_trip() {
        let mut p = Payload::new(Family::V4);
        p.table(Table::Nat).chains.push("SVCNET-X".into());
        let args: Vec<String> = [
            "-m",
            "comment",
            "--comment",
            "ns/a:b cluster IP",
            "-j",
            "ACCEPT",
        ]
        .map(String::from)
        .to_vec();
        p.table(Table::Nat)
            .rules
            .push(Rule::new("SVCNET-X", args.clone()));
        p.table(Table::Filter).deletes.push("SVCNET-Y".into());
        assert_eq!(
            p.to_string(),
            "*filter\n-X SVCNET-Y\nCOMMIT\n*nat\n:SVCNET-X - [0:0]\n-A SVCNET-X -m comment --comment \"ns/a:b cluster IP\" -j ACCEPT\nCOMMIT\n"
        );
        assert_eq!(split_args(&Rule::new("X", args.clone()).spec()), args);
    }
}
