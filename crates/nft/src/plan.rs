//! From desired state to transactions: full syncs (everything, optionally recreating the
//! table) and partial syncs, which in the data-only table are element updates (`delete` and
//! `add element`) in one transaction; only a dispatch group coming into or going out of use
//! rewrites the small dispatch chains, and only round-robin services add or flush a chain.
//!
//! The [`Renderer`] remembers what was last applied successfully, with a reference count per
//! shared element (a cluster IP of several ports, a hairpin pair of a pod behind several
//! services) and per group. A plan is computed without changing that memory; only
//! [`Renderer::commit`] after a successful apply does. So a failed apply leaves both the
//! kernel and the memory at the previous state, and the caller retries with a full sync.

use std::collections::{BTreeMap, BTreeSet};

use svcnet_lb::Fallback;
use svcnet_proxy::{
    DesiredFamily, DesiredNode, DesiredServicePort, NamespacedName, ServicePortName,
};

use crate::names::{AFFINITY_RECORD_CHAIN, SERVICES_CHAIN, TABLE};
use crate::render::{
    AffinityPair, Base, Element, Fragment, Group, base, base_sets, is_dynamic, service_fragment,
    standing_groups,
};
use crate::tx::{BaseChain, Family, Op, SetDef, SetKind, Transaction};

/// How a full sync treats the existing table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullMode {
    /// Delete and recreate the table in the same transaction: used on the first sync and after
    /// a failure, when the kernel's state is unknown. Drops affinity state.
    Recreate,
    /// Re-assert every object (add, flush, re-add) and delete stale ones: used by the periodic
    /// resync; repairs drift while keeping the affinity maps.
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
    /// Affinity entries that may pin a client to an endpoint this plan takes away (from the
    /// frontend, or altogether): once the transaction is live the dataplane deletes the
    /// entries holding them (`affinity::purge`), so no client stays pinned to a removed pod.
    pub affinity_purge: BTreeSet<AffinityPair>,
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
    },
}

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

type ElementId = (String, String);

fn id(e: &Element) -> ElementId {
    (e.set.clone(), e.key.clone())
}

/// The nft dataplane's memory of one family's table.
#[derive(Debug)]
pub struct Renderer {
    family: Family,
    table: String,
    node: Option<DesiredNode>,
    applied: BTreeMap<ServicePortName, Fragment>,
    /// Every element in the table with the number of ports holding it.
    refs: BTreeMap<ElementId, (Element, usize)>,
    /// Every group in use with the number of ports needing it.
    groups: BTreeMap<Group, usize>,
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
            refs: BTreeMap::new(),
            groups: BTreeMap::new(),
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

    /// The dispatch groups in the table: those in use and the standing ones.
    pub fn groups(&self) -> BTreeSet<Group> {
        self.groups
            .keys()
            .copied()
            .chain(standing_groups())
            .collect()
    }

    /// Plans a full sync of `desired`.
    pub fn plan_full(&self, desired: &DesiredFamily, mode: FullMode) -> Plan {
        let mut tx = Transaction::new(self.family, self.table.clone());
        let fragments: BTreeMap<ServicePortName, Fragment> = desired
            .services
            .iter()
            .map(|(k, d)| (k.clone(), service_fragment(self.family, d, &desired.node)))
            .collect();
        let groups: BTreeSet<Group> = fragments
            .values()
            .flat_map(|f| &f.groups)
            .copied()
            .chain(standing_groups())
            .collect();
        let base: Base = base(self.family, &desired.node, &groups);
        let elements: BTreeMap<ElementId, &Element> = fragments
            .values()
            .flat_map(|f| &f.elements)
            .map(|e| (id(e), e))
            .collect();
        let comment = Some("svcnet service proxy".to_string());
        let mut affinity_purge = BTreeSet::new();
        match mode {
            FullMode::Recreate => {
                tx.push(Op::AddTable { comment: None });
                tx.push(Op::DeleteTable);
                tx.push(Op::AddTable { comment });
                push_base(&mut tx.ops, &base, &fragments, false);
                push_elements(&mut tx.ops, elements.values().copied());
            }
            FullMode::Reassert => {
                tx.push(Op::AddTable { comment });
                push_base(&mut tx.ops, &base, &fragments, true);
                push_elements(&mut tx.ops, elements.values().copied());
                // Stale round-robin chains (their verdict-map elements are flushed above) and
                // group sets (no rule names them any more) go.
                let current: BTreeSet<&str> = base.sets.iter().map(|s| s.name.as_str()).collect();
                let stale_sets: BTreeMap<String, SetKind> = self
                    .groups
                    .keys()
                    .map(|g| (g.set_name(), set_kind(g)))
                    .filter(|(n, _)| !current.contains(n.as_str()))
                    .collect();
                for (name, kind) in stale_sets {
                    tx.push(Op::DeleteSet { name, kind });
                }
                let new_chains: BTreeSet<&String> =
                    fragments.values().flat_map(|f| f.chains.keys()).collect();
                for c in self.applied.values().flat_map(|f| f.chains.keys()) {
                    if !new_chains.contains(c) {
                        tx.push(Op::FlushChain(c.clone()));
                        tx.push(Op::DeleteChain(c.clone()));
                    }
                }
                // Stale port-owned maps (affinity), once no chain names them.
                let new_sets: BTreeSet<&String> =
                    fragments.values().flat_map(|f| f.sets.keys()).collect();
                for s in self.applied.values().flat_map(|f| f.sets.values()) {
                    if !new_sets.contains(&s.name) {
                        tx.push(Op::DeleteSet {
                            name: s.name.clone(),
                            kind: s.kind,
                        });
                    }
                }
                let old: BTreeSet<&AffinityPair> =
                    self.applied.values().flat_map(|f| &f.affinity).collect();
                let new: BTreeSet<&AffinityPair> =
                    fragments.values().flat_map(|f| &f.affinity).collect();
                affinity_purge = old
                    .difference(&new)
                    .filter(|p| new_sets.contains(&p.map))
                    .map(|p| (*p).clone())
                    .collect();
            }
        }
        Plan {
            tx,
            fallbacks: fallbacks(&fragments),
            affinity_purge,
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
            // The service's ports, found by range (ports sort by service first): a scan
            // of every applied port made each partial sync O(services).
            let first = ServicePortName {
                service: svc.clone(),
                port: String::new(),
                protocol: svcnet_proxy::Protocol::Tcp,
            };
            let held = self
                .applied
                .range(first..)
                .take_while(|(k, _)| &k.service == svc);
            for (spn, old) in held {
                updates.insert(spn.clone(), (Some(old), None));
            }
            for d in ports {
                let new = service_fragment(self.family, d, node);
                updates.entry(d.name.clone()).or_insert((None, None)).1 = Some(new);
            }
        }
        let empty = Fragment::default();
        // Reference deltas of elements and groups, and each element's new form.
        let mut delta: BTreeMap<ElementId, (isize, Option<&Element>)> = BTreeMap::new();
        let mut group_delta: BTreeMap<Group, isize> = BTreeMap::new();
        let (mut old_chains, mut new_chains) = (BTreeMap::new(), BTreeMap::new());
        // Port-owned maps, by name (cloned: the plan outlives `updates`).
        let (mut old_owned, mut new_owned): (BTreeMap<String, SetDef>, BTreeMap<String, SetDef>) =
            (BTreeMap::new(), BTreeMap::new());
        let mut affinity_purge = BTreeSet::new();
        for (old, new) in updates.values() {
            let old = old.unwrap_or(&empty);
            let new = new.as_ref().unwrap_or(&empty);
            if old == new {
                continue;
            }
            for e in &old.elements {
                delta.entry(id(e)).or_default().0 -= 1;
            }
            for e in &new.elements {
                let d = delta.entry(id(e)).or_default();
                d.0 += 1;
                d.1 = Some(e);
            }
            for g in &old.groups {
                *group_delta.entry(*g).or_default() -= 1;
            }
            for g in &new.groups {
                *group_delta.entry(*g).or_default() += 1;
            }
            old_chains.extend(old.chains.iter());
            new_chains.extend(new.chains.iter());
            old_owned.extend(old.sets.clone());
            new_owned.extend(new.sets.clone());
            affinity_purge.extend(old.affinity.difference(&new.affinity).cloned());
        }
        let mut groups = self.groups();
        for (g, d) in &group_delta {
            let n = self.groups.get(g).copied().unwrap_or(0) as isize + d;
            if n > 0 {
                groups.insert(*g);
            } else {
                groups.remove(g);
            }
        }
        groups.extend(standing_groups());
        let old_groups = self.groups();
        let mut tx = Transaction::new(self.family, self.table.clone());
        let group_sets = |gs: &BTreeSet<Group>| -> BTreeMap<String, Group> {
            gs.iter().map(|g| (g.set_name(), *g)).collect()
        };
        let (old_sets, new_sets) = (group_sets(&old_groups), group_sets(&groups));
        let declared: BTreeMap<String, SetDef> = base(self.family, node, &groups)
            .sets
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        // 1. Deleted and changed elements.
        let (mut deletes, mut adds) = (Vec::new(), Vec::new());
        for (eid, (d, new_form)) in &delta {
            let (current, n) = match self.refs.get(eid) {
                Some((e, n)) => (Some(e), *n as isize),
                None => (None, 0),
            };
            let want = if n + d > 0 {
                new_form.or(current)
            } else {
                None
            };
            if current == want {
                continue;
            }
            if let Some(c) = current
                && old_sets
                    .get(&c.set)
                    .is_none_or(|_| new_sets.contains_key(&c.set))
            {
                deletes.push(Op::DeleteElement {
                    set: c.set.clone(),
                    key: c.key.clone(),
                });
            }
            if let Some(w) = want {
                adds.push(w);
            }
        }
        tx.ops.extend(deletes);
        // 2. New group sets and every set receiving elements, declared (idempotent), so
        // elements go in declaration form; every set when the dispatch chains are rewritten,
        // since `nft` compiles their rules without loading its cache of the table.
        let receiving: BTreeSet<&str> = adds.iter().map(|e| e.set.as_str()).collect();
        let rewrite = groups != old_groups;
        for (name, def) in &declared {
            if rewrite
                || receiving.contains(name.as_str())
                || (new_sets.contains_key(name) && !old_sets.contains_key(name))
            {
                tx.push(Op::AddSet(def.clone()));
            }
        }
        // 3. Port-owned maps (affinity), then chains (round robin, affinity): new ones
        // created, changed ones refilled.
        for (name, def) in &new_owned {
            if old_owned.get(name) != Some(def) {
                tx.push(Op::AddSet(def.clone()));
            }
        }
        for (name, rules) in &new_chains {
            match old_chains.get(name) {
                Some(old) if old == rules => continue,
                Some(_) => tx.push(Op::FlushChain((*name).clone())),
                None => tx.push(Op::AddChain {
                    name: (*name).clone(),
                    base: None,
                }),
            }
            for r in rules.iter() {
                tx.push(Op::AddRule {
                    chain: (*name).clone(),
                    rule: r.clone(),
                });
            }
        }
        // 4. Added elements, grouped by set.
        adds.sort_by(|a, b| a.set.cmp(&b.set));
        push_elements(&mut tx.ops, adds);
        // 5. The dispatch chains when the groups in use change, then the unused group sets.
        if rewrite {
            let b = base(self.family, node, &groups);
            for (name, _, rules) in &b.chains {
                if name == SERVICES_CHAIN || name == AFFINITY_RECORD_CHAIN {
                    tx.push(Op::FlushChain(name.clone()));
                    for r in rules {
                        tx.push(Op::AddRule {
                            chain: name.clone(),
                            rule: r.clone(),
                        });
                    }
                }
            }
        }
        // Unused group sets first: a round-robin map's elements name the chains.
        for (name, g) in &old_sets {
            if !new_sets.contains_key(name) {
                tx.push(Op::DeleteSet {
                    name: name.clone(),
                    kind: set_kind(g),
                });
            }
        }
        for name in old_chains.keys() {
            if !new_chains.contains_key(*name) {
                tx.push(Op::FlushChain((*name).clone()));
                tx.push(Op::DeleteChain((*name).clone()));
            }
        }
        for (name, def) in &old_owned {
            if !new_owned.contains_key(name) {
                tx.push(Op::DeleteSet {
                    name: name.clone(),
                    kind: def.kind,
                });
            }
        }
        let fragments: BTreeMap<ServicePortName, Option<Fragment>> =
            updates.into_iter().map(|(k, (_, new))| (k, new)).collect();
        // A pair a changed port still has (another port's elements moved) is no purge.
        let kept: BTreeSet<&AffinityPair> = fragments
            .values()
            .flatten()
            .flat_map(|f| &f.affinity)
            .collect();
        // Nor is a pair of a map this plan deletes (its entries go with it).
        let deleted = |map: &String| old_owned.contains_key(map) && !new_owned.contains_key(map);
        affinity_purge.retain(|p| !kept.contains(p) && !deleted(&p.map));
        let fallbacks = fallbacks(fragments.iter().filter_map(|(k, f)| Some((k, f.as_ref()?))));
        Some(Plan {
            tx,
            fallbacks,
            affinity_purge,
            update: Update::Partial { fragments },
        })
    }

    /// Records that `plan` was applied successfully.
    pub fn commit(&mut self, plan: Plan) {
        match plan.update {
            Update::Full { node, fragments } => {
                self.node = Some(node);
                self.applied = BTreeMap::new();
                self.refs.clear();
                self.groups.clear();
                for (k, f) in fragments {
                    self.hold(&f, 1);
                    self.applied.insert(k, f);
                }
            }
            Update::Partial { fragments } => {
                for (k, f) in fragments {
                    if let Some(old) = self.applied.remove(&k) {
                        self.hold(&old, -1);
                    }
                    if let Some(f) = f {
                        self.hold(&f, 1);
                        self.applied.insert(k, f);
                    }
                }
            }
        }
    }

    fn hold(&mut self, f: &Fragment, d: isize) {
        for e in &f.elements {
            let slot = self.refs.entry(id(e)).or_insert((e.clone(), 0));
            slot.1 = (slot.1 as isize + d).max(0) as usize;
            if d > 0 {
                slot.0 = e.clone();
            }
            if slot.1 == 0 {
                self.refs.remove(&id(e));
            }
        }
        for g in &f.groups {
            let n = self.groups.entry(*g).or_insert(0);
            *n = (*n as isize + d).max(0) as usize;
            if *n == 0 {
                self.groups.remove(g);
            }
        }
    }

    /// Forgets what was applied, so the next sync is a full one (after a failed apply).
    pub fn invalidate(&mut self) {
        self.node = None;
    }
}

fn set_kind(g: &Group) -> SetKind {
    match g {
        Group::RoundRobin(_) | Group::Affinity { .. } => SetKind::Map,
        Group::Choice { .. } => SetKind::Set,
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

/// Elements in set order, so `Display` writes one declaration per set.
fn push_elements<'a>(ops: &mut Vec<Op>, elements: impl IntoIterator<Item = &'a Element>) {
    for e in elements {
        ops.push(Op::AddElement {
            set: e.set.clone(),
            key: e.key_text(),
            value: e.value.clone(),
        });
    }
}

/// The sets, the round-robin chains and the base chains with their rules. `flush` (a resync)
/// empties every set but the dynamic affinity maps, and every chain, before re-adding.
fn push_base(
    ops: &mut Vec<Op>,
    base: &Base,
    fragments: &BTreeMap<ServicePortName, Fragment>,
    flush: bool,
) {
    let owned = fragments.values().flat_map(|f| f.sets.values());
    for s in base.sets.iter().chain(owned) {
        ops.push(Op::AddSet(s.clone()));
        if flush && !is_dynamic(s) {
            ops.push(Op::FlushSet {
                name: s.name.clone(),
                kind: s.kind,
            });
        }
    }
    let own: Vec<(&String, Option<BaseChain>, &Vec<String>)> = fragments
        .values()
        .flat_map(|f| &f.chains)
        .map(|(n, r)| (n, None, r))
        .chain(base.chains.iter().map(|(n, h, r)| (n, h.clone(), r)))
        .collect();
    // Every chain exists before any rule jumps to one.
    for (name, hook, _) in &own {
        ops.push(Op::AddChain {
            name: (*name).clone(),
            base: hook.clone(),
        });
        if flush {
            ops.push(Op::FlushChain((*name).clone()));
        }
    }
    for (name, _, rules) in own {
        for r in rules {
            ops.push(Op::AddRule {
                chain: name.clone(),
                rule: r.clone(),
            });
        }
    }
}

/// The base sets of a family (for callers declaring them before element updates).
pub fn shared_sets(family: Family) -> Vec<SetDef> {
    base_sets(family)
}
