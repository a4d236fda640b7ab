//! From desired state to transactions: full syncs (everything, optionally recreating the
//! table) and partial syncs (only the changed services' chains, sets and elements).
//!
//! The [`Renderer`] remembers what was last applied successfully. A plan is computed without
//! changing that memory; only [`Renderer::commit`] after a successful apply does. So a failed
//! apply leaves both the kernel and the memory at the previous state, and the caller retries
//! with a full sync.

use std::collections::{BTreeMap, BTreeSet};

use svcnet_lb::Fallback;
use svcnet_proxy::{
    DesiredFamily, DesiredNode, DesiredServicePort, NamespacedName, ServicePortName,
};

use crate::names::TABLE;
use crate::render::{Base, Element, Fragment, base, base_ops, base_sets, service_fragment};
use crate::tx::{Family, Op, SetKind, Transaction};

/// How a full sync treats the existing table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullMode {
    /// Delete and recreate the table in the same transaction: used on the first sync and after
    /// a failure, when the kernel's state is unknown. Drops affinity state.
    Recreate,
    /// Re-assert every object (add, flush, re-add) and delete stale ones: used by the periodic
    /// resync; repairs drift while keeping affinity sets.
    Reassert,
}

/// A computed sync: the transaction plus what to remember once it is applied.
#[derive(Debug)]
pub struct Plan {
    pub tx: Transaction,
    /// Service ports of this plan whose load-balancing algorithm nftables cannot express
    /// (they choose at random instead). The runtime reports them (log and Event); a partial
    /// plan lists only the services it re-rendered.
    pub fallbacks: Vec<(ServicePortName, Fallback)>,
    update: Update,
}

#[derive(Debug)]
enum Update {
    Full {
        node: DesiredNode,
        fragments: BTreeMap<ServicePortName, Fragment>,
    },
    Partial {
        fragments: BTreeMap<ServicePortName, Option<Fragment>>,
        garbage: Garbage,
    },
}

/// Chains and sets no longer used, flushed (chains) but not yet deleted, by name. Partial syncs
/// defer deletions (as kube-proxy's nftables proxier does with its stale chains) because `nft`
/// must load its cache of the whole ruleset for a `delete`, which costs more than everything
/// else a one-service change does; a later sync deletes them in a batch.
type Garbage = BTreeMap<String, Option<SetKind>>;

/// Deferred deletions are carried out by the partial sync that finds more than this many
/// (and by every periodic full resync).
pub const GARBAGE_LIMIT: usize = 512;

impl Plan {
    pub fn is_full(&self) -> bool {
        matches!(self.update, Update::Full { .. })
    }
}

/// The transaction, as `nft -f` reads it.
impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.tx.fmt(f)
    }
}

/// The nft dataplane's memory of one family's table.
#[derive(Debug)]
pub struct Renderer {
    family: Family,
    table: String,
    node: Option<DesiredNode>,
    applied: BTreeMap<ServicePortName, Fragment>,
    garbage: Garbage,
}

impl Renderer {
    pub fn new(family: Family) -> Self {
        Self::with_table(family, TABLE)
    }

    /// A renderer for a differently named table (tests and benchmarks run side by side).
    pub fn with_table(family: Family, table: &str) -> Self {
        Self {
            family,
            table: table.into(),
            node: None,
            applied: BTreeMap::new(),
            garbage: Garbage::new(),
        }
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// Whether a full sync has been committed (partial syncs need one first).
    pub fn has_applied(&self) -> bool {
        self.node.is_some()
    }

    /// Number of service ports currently programmed.
    pub fn service_ports(&self) -> usize {
        self.applied.len()
    }

    /// Number of flushed chains and unused sets waiting for deletion.
    pub fn garbage_len(&self) -> usize {
        self.garbage.len()
    }

    /// Plans a full sync of `desired`.
    pub fn plan_full(&self, desired: &DesiredFamily, mode: FullMode) -> Plan {
        let mut tx = Transaction::new(self.family, self.table.clone());
        let base: Base = base(self.family, &desired.node);
        let fragments: BTreeMap<ServicePortName, Fragment> = desired
            .services
            .iter()
            .map(|(k, d)| (k.clone(), service_fragment(self.family, d, &desired.node)))
            .collect();
        let comment = Some("svcnet service proxy".to_string());
        match mode {
            FullMode::Recreate => {
                tx.push(Op::AddTable { comment: None });
                tx.push(Op::DeleteTable);
                tx.push(Op::AddTable { comment });
                base_ops(&base, &mut tx.ops, false);
                for f in fragments.values() {
                    push_fragment(&mut tx.ops, f, false);
                }
                push_elements(&mut tx.ops, &fragments);
            }
            FullMode::Reassert => {
                tx.push(Op::AddTable { comment });
                base_ops(&base, &mut tx.ops, true);
                let new_chains: BTreeSet<&String> =
                    fragments.values().flat_map(|f| f.chains.keys()).collect();
                let new_sets: BTreeSet<&String> =
                    fragments.values().flat_map(|f| f.sets.keys()).collect();
                let stale_chains: BTreeSet<&String> = self
                    .applied
                    .values()
                    .flat_map(|f| f.chains.keys())
                    .chain(self.garbage.iter().filter(|g| g.1.is_none()).map(|g| g.0))
                    .filter(|c| !new_chains.contains(c))
                    .collect();
                let stale_sets: BTreeMap<&String, SetKind> = self
                    .applied
                    .values()
                    .flat_map(|f| f.sets.values())
                    .map(|s| (&s.name, s.kind))
                    .chain(self.garbage.iter().filter_map(|(n, k)| Some((n, (*k)?))))
                    .filter(|s| !new_sets.contains(s.0))
                    .collect();
                for c in &stale_chains {
                    tx.push(Op::FlushChain((*c).clone()));
                }
                for f in fragments.values() {
                    push_fragment(&mut tx.ops, f, true);
                }
                push_elements(&mut tx.ops, &fragments);
                // Stale maps first: their elements still reference stale chains.
                for (name, kind) in stale_sets {
                    tx.push(Op::DeleteSet {
                        name: name.clone(),
                        kind,
                    });
                }
                for c in stale_chains {
                    tx.push(Op::DeleteChain(c.clone()));
                }
            }
        }
        Plan {
            tx,
            fallbacks: fallbacks(&fragments),
            update: Update::Full {
                node: desired.node.clone(),
                fragments,
            },
        }
    }

    /// Plans a partial sync: `changes` maps each changed service to all of its desired ports
    /// in this family (empty when the service is gone). Returns `None` when no full sync has
    /// been committed yet or the node settings changed, because a full sync is needed then.
    pub fn plan_partial(
        &self,
        node: &DesiredNode,
        changes: &BTreeMap<NamespacedName, Vec<DesiredServicePort>>,
    ) -> Option<Plan> {
        if self.node.as_ref() != Some(node) {
            return None;
        }
        let mut updates: BTreeMap<ServicePortName, (Option<&Fragment>, Option<Fragment>)> =
            BTreeMap::new();
        for (svc, ports) in changes {
            for (spn, old) in self.applied.iter().filter(|(k, _)| &k.service == svc) {
                updates.insert(spn.clone(), (Some(old), None));
            }
            for d in ports {
                let new = service_fragment(self.family, d, node);
                updates.entry(d.name.clone()).or_insert((None, None)).1 = Some(new);
            }
        }
        let empty = Fragment::default();
        let mut tx = Transaction::new(self.family, self.table.clone());
        let mut garbage = self.garbage.clone();
        let (mut head, mut adds, mut rules_add, mut elems_add) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (old, new) in updates.values() {
            let old = old.unwrap_or(&empty);
            let new = new.as_ref().unwrap_or(&empty);
            if old == new {
                continue;
            }
            // The fragment's own maps whose elements change are flushed and refilled (a
            // `delete element` would make `nft` load its cache); elements of a map going to
            // the garbage stay in it (nothing looks it up).
            let refilled: BTreeSet<&str> = old
                .elements
                .symmetric_difference(&new.elements)
                .map(|e| e.set.as_ref())
                .filter(|s| new.sets.contains_key(*s) && old.sets.contains_key(*s))
                .collect();
            let own = |e: &&Element| old.sets.contains_key(e.set.as_ref());
            for e in old.elements.difference(&new.elements).filter(|e| !own(e)) {
                head.push(Op::DeleteElement {
                    set: e.set.to_string(),
                    key: e.key.clone(),
                });
            }
            for name in old.chains.keys() {
                if !new.chains.contains_key(name) {
                    head.push(Op::FlushChain(name.clone()));
                    garbage.insert(name.clone(), None);
                }
            }
            for (name, s) in &old.sets {
                if !new.sets.contains_key(name) {
                    garbage.insert(name.clone(), Some(s.kind));
                }
            }
            // Every set of the fragment is declared (`add` is idempotent), so that `nft` can
            // compile rules naming it without loading its cache of the ruleset.
            for (name, s) in &new.sets {
                adds.push(Op::AddSet(s.clone()));
                if garbage.remove(name).is_some() || refilled.contains(name.as_str()) {
                    adds.push(Op::FlushSet {
                        name: name.clone(),
                        kind: s.kind,
                    });
                }
            }
            for (name, rules) in &new.chains {
                match old.chains.get(name) {
                    Some(old_rules) if old_rules == rules => continue,
                    Some(_) => adds.push(Op::FlushChain(name.clone())),
                    None if garbage.remove(name).is_some() => {
                        adds.push(Op::FlushChain(name.clone()));
                    }
                    None => adds.push(Op::AddChain {
                        name: name.clone(),
                        base: None,
                    }),
                }
                for r in rules {
                    rules_add.push(Op::AddRule {
                        chain: name.clone(),
                        rule: r.clone(),
                    });
                }
            }
            for e in &new.elements {
                if refilled.contains(e.set.as_ref()) || !old.elements.contains(e) {
                    elems_add.push(add_element(e));
                }
            }
        }
        // The shared sets receiving elements are declared too (see `Transaction`'s Display).
        let shared: BTreeSet<&str> = elems_add
            .iter()
            .filter_map(|op| match op {
                Op::AddElement { set, .. } => Some(set.as_str()),
                _ => None,
            })
            .collect();
        if !shared.is_empty() {
            adds.extend(
                base_sets(self.family)
                    .into_iter()
                    .filter(|d| shared.contains(d.name.as_str()))
                    .map(Op::AddSet),
            );
        }
        tx.ops.extend(head);
        tx.ops.extend(adds);
        tx.ops.extend(rules_add);
        tx.ops.extend(elems_add);
        if garbage.len() > GARBAGE_LIMIT {
            push_deletions(&mut tx.ops, &garbage);
            garbage.clear();
        }
        let fragments: BTreeMap<ServicePortName, Option<Fragment>> =
            updates.into_iter().map(|(k, (_, new))| (k, new)).collect();
        let fallbacks = fallbacks(fragments.iter().filter_map(|(k, f)| Some((k, f.as_ref()?))));
        Some(Plan {
            tx,
            fallbacks,
            update: Update::Partial { fragments, garbage },
        })
    }

    /// Plans the deletion of every deferred chain and set; `None` when there are none.
    pub fn plan_gc(&self) -> Option<Plan> {
        if self.garbage.is_empty() || !self.has_applied() {
            return None;
        }
        let mut tx = Transaction::new(self.family, self.table.clone());
        push_deletions(&mut tx.ops, &self.garbage);
        Some(Plan {
            tx,
            fallbacks: Vec::new(),
            update: Update::Partial {
                fragments: BTreeMap::new(),
                garbage: Garbage::new(),
            },
        })
    }

    /// Records that `plan` was applied successfully.
    pub fn commit(&mut self, plan: Plan) {
        match plan.update {
            Update::Full { node, fragments } => {
                self.node = Some(node);
                self.applied = fragments;
                self.garbage.clear();
            }
            Update::Partial { fragments, garbage } => {
                self.garbage = garbage;
                for (k, f) in fragments {
                    match f {
                        Some(f) => self.applied.insert(k, f),
                        None => self.applied.remove(&k),
                    };
                }
            }
        }
    }

    /// Forgets what was applied, so the next sync is a full one (after a failed apply).
    pub fn invalidate(&mut self) {
        self.node = None;
    }
}

/// The fallbacks recorded in `fragments`.
fn fallbacks<'a>(
    fragments: impl IntoIterator<Item = (&'a ServicePortName, &'a Fragment)>,
) -> Vec<(ServicePortName, Fallback)> {
    fragments
        .into_iter()
        .filter_map(|(k, f)| Some((k.clone(), f.fallback.clone()?)))
        .collect()
}

/// Deletes deferred garbage: sets first (their elements may reference the chains).
fn push_deletions(ops: &mut Vec<Op>, garbage: &Garbage) {
    for (name, kind) in garbage {
        if let Some(kind) = kind {
            ops.push(Op::DeleteSet {
                name: name.clone(),
                kind: *kind,
            });
        }
    }
    for (name, kind) in garbage {
        if kind.is_none() {
            ops.push(Op::DeleteChain(name.clone()));
        }
    }
}

/// All elements of all fragments, grouped by set so `Display` can batch them into one
/// `add element` command per set (nft parses one big command far faster than many small ones).
fn push_elements(ops: &mut Vec<Op>, fragments: &BTreeMap<ServicePortName, Fragment>) {
    let mut by_set: BTreeMap<&str, Vec<&Element>> = BTreeMap::new();
    for e in fragments.values().flat_map(|f| &f.elements) {
        by_set.entry(e.set.as_ref()).or_default().push(e);
    }
    for e in by_set.into_values().flatten() {
        ops.push(add_element(e));
    }
}

fn add_element(e: &Element) -> Op {
    Op::AddElement {
        set: e.set.to_string(),
        key: e.key.clone(),
        value: e.value.clone(),
    }
}

/// Chain and set creation for one fragment (elements come later, once every chain exists).
/// `flush` flushes the chains and the endpoints maps, never the affinity sets.
fn push_fragment(ops: &mut Vec<Op>, f: &Fragment, flush: bool) {
    for s in f.sets.values() {
        ops.push(Op::AddSet(s.clone()));
        if flush && s.kind == SetKind::Map {
            ops.push(Op::FlushSet {
                name: s.name.clone(),
                kind: s.kind,
            });
        }
    }
    for name in f.chains.keys() {
        ops.push(Op::AddChain {
            name: name.clone(),
            base: None,
        });
        if flush {
            ops.push(Op::FlushChain(name.clone()));
        }
    }
    for (name, rules) in &f.chains {
        for r in rules {
            ops.push(Op::AddRule {
                chain: name.clone(),
                rule: r.clone(),
            });
        }
    }
}
