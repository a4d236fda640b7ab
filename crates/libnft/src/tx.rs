//! An nft transaction as a value: a list of operations whose `Display` is the canonical text
//! that `nft -f -` applies atomically (all or nothing). Nothing here knows about Services:
//! the Service renderer (`svcnet-nft`), the userspace dataplane's redirect table and any
//! other nftables user build on it.

use std::collections::HashMap;
use std::fmt;

/// Address family of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Ip,
    Ip6,
}

impl Family {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ip => "ip",
            Self::Ip6 => "ip6",
        }
    }
    /// The address type of set keys (`ipv4_addr`, `ipv6_addr`).
    pub fn addr_type(self) -> &'static str {
        match self {
            Self::Ip => "ipv4_addr",
            Self::Ip6 => "ipv6_addr",
        }
    }
}

/// Hook of a base chain: `type <kind> hook <hook> priority <priority>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseChain {
    pub kind: &'static str,
    pub hook: &'static str,
    pub priority: i32,
}

/// Whether a set declaration is a plain set or a map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetKind {
    Set,
    Map,
}

/// A set or map declaration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetDef {
    pub name: String,
    pub kind: SetKind,
    /// The `type` clause, e.g. `ipv4_addr . inet_proto . inet_service : verdict`, or a whole
    /// `typeof …` clause (for keys such as `numgen` that have no named type).
    pub type_: String,
    pub flags: Vec<&'static str>,
    pub timeout_seconds: Option<u32>,
    /// The maximum number of elements (`size`): a dynamic set filled from the packet path
    /// needs one, or the kernel caps it at 65,535.
    pub size: Option<u32>,
    pub comment: Option<String>,
}

impl SetDef {
    /// A set or map of `type_` with no flags, timeout, size or comment.
    pub fn new(name: impl Into<String>, kind: SetKind, type_: impl Into<String>) -> SetDef {
        SetDef {
            name: name.into(),
            kind,
            type_: type_.into(),
            flags: vec![],
            timeout_seconds: None,
            size: None,
            comment: None,
        }
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    AddTable {
        comment: Option<String>,
    },
    DeleteTable,
    AddChain {
        name: String,
        base: Option<BaseChain>,
    },
    FlushChain(String),
    DeleteChain(String),
    AddRule {
        chain: String,
        rule: String,
    },
    AddSet(SetDef),
    FlushSet {
        name: String,
        kind: SetKind,
    },
    DeleteSet {
        name: String,
        kind: SetKind,
    },
    AddElement {
        set: String,
        key: String,
        value: Option<String>,
    },
    DeleteElement {
        set: String,
        key: String,
    },
}

/// A transaction on one table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transaction {
    pub family: Family,
    pub table: String,
    pub ops: Vec<Op>,
}

impl Transaction {
    pub fn new(family: Family, table: impl Into<String>) -> Self {
        Self {
            family,
            table: table.into(),
            ops: Vec::new(),
        }
    }
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

fn kind_word(kind: SetKind) -> &'static str {
    match kind {
        SetKind::Set => "set",
        SetKind::Map => "map",
    }
}

impl fmt::Display for Transaction {
    /// One command per line, except that consecutive `add element` operations on the same set
    /// are batched into one command (same effect, much faster for nft to parse), and a regular
    /// chain's `add chain` and the `add rule`s that follow it for that chain are written as
    /// one `add chain … { rule ; … }` block (same effect: the block appends to an existing
    /// chain; `nft` compiles a block without loading its cache of the whole ruleset, while
    /// `add rule` makes it load every chain first). Likewise elements added to a set declared
    /// earlier in the transaction are written as that declaration with `elements = { … }`
    /// (`add element` would make `nft` load its cache).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = format!("{} {}", self.family.as_str(), self.table);
        // The set declarations seen so far, for element blocks.
        let mut declared: HashMap<&str, &SetDef> = HashMap::new();
        let mut i = 0;
        while i < self.ops.len() {
            match &self.ops[i] {
                Op::AddSet(d) => {
                    declared.insert(&d.name, d);
                }
                Op::DeleteSet { name, .. } => {
                    declared.remove(name.as_str());
                }
                Op::DeleteTable => declared.clear(),
                _ => {}
            }
            let block_of = match &self.ops[i] {
                Op::AddChain { name, base: None } => Some((name, i + 1)),
                Op::AddRule { chain, .. } => Some((chain, i)),
                _ => None,
            };
            if let Some((chain, first_rule)) = block_of {
                let mut rules = Vec::new();
                let mut j = first_rule;
                while let Some(Op::AddRule { chain: c, rule }) = self.ops.get(j) {
                    if c != chain {
                        break;
                    }
                    rules.push(rule.as_str());
                    j += 1;
                }
                if rules.is_empty() {
                    writeln!(f, "add chain {t} {chain}")?;
                } else {
                    writeln!(f, "add chain {t} {chain} {{ {} ; }}", rules.join(" ; "))?;
                }
                i = j;
                continue;
            }
            if let Op::AddElement { set, .. } = &self.ops[i] {
                let mut items = Vec::new();
                while let Some(Op::AddElement { set: s, key, value }) = self.ops.get(i) {
                    if s != set {
                        break;
                    }
                    items.push(match value {
                        Some(v) => format!("{key} : {v}"),
                        None => key.clone(),
                    });
                    i += 1;
                }
                match declared.get(set.as_str()) {
                    Some(d) => writeln!(
                        f,
                        "add {} {t} {set} {{ {}elements = {{ {} }} ; }}",
                        kind_word(d.kind),
                        declaration(d),
                        items.join(", ")
                    )?,
                    None => writeln!(f, "add element {t} {set} {{ {} }}", items.join(", "))?,
                }
                continue;
            }
            write_op(f, &t, &self.ops[i])?;
            i += 1;
        }
        Ok(())
    }
}

/// A set's declaration inside braces: `type … ; flags … ; timeout …s ; comment "…" ; `.
fn declaration(s: &SetDef) -> String {
    let type_word = if s.type_.starts_with("typeof ") {
        ""
    } else {
        "type "
    };
    let mut out = format!("{type_word}{} ; ", s.type_);
    if !s.flags.is_empty() {
        out.push_str(&format!("flags {} ; ", s.flags.join(",")));
    }
    if let Some(to) = s.timeout_seconds {
        out.push_str(&format!("timeout {to}s ; "));
    }
    if let Some(size) = s.size {
        out.push_str(&format!("size {size} ; "));
    }
    if let Some(c) = &s.comment {
        out.push_str(&format!("comment \"{c}\" ; "));
    }
    out
}

/// The operations `Transaction`'s Display does not group.
fn write_op(f: &mut fmt::Formatter<'_>, t: &str, op: &Op) -> fmt::Result {
    match op {
        Op::AddTable { comment: Some(c) } => writeln!(f, "add table {t} {{ comment \"{c}\" ; }}")?,
        Op::AddTable { comment: None } => writeln!(f, "add table {t}")?,
        Op::DeleteTable => writeln!(f, "delete table {t}")?,
        Op::AddChain {
            name,
            base: Some(b),
        } => writeln!(
            f,
            "add chain {t} {name} {{ type {} hook {} priority {} ; }}",
            b.kind, b.hook, b.priority
        )?,
        Op::FlushChain(name) => writeln!(f, "flush chain {t} {name}")?,
        Op::DeleteChain(name) => writeln!(f, "delete chain {t} {name}")?,
        Op::AddSet(s) => writeln!(
            f,
            "add {} {t} {} {{ {} }}",
            kind_word(s.kind),
            s.name,
            declaration(s).trim_end()
        )?,
        Op::FlushSet { name, kind } => writeln!(f, "flush {} {t} {name}", kind_word(*kind))?,
        Op::DeleteSet { name, kind } => writeln!(f, "delete {} {t} {name}", kind_word(*kind))?,
        Op::DeleteElement { set, key } => writeln!(f, "delete element {t} {set} {{ {key} }}")?,
        Op::AddChain { base: None, .. } | Op::AddRule { .. } | Op::AddElement { .. } => {
            unreachable!("written by Transaction's Display as chain blocks and element runs")
        }
    }
    Ok(())
}
