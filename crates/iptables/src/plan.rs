//! From desired state to restore payloads: full syncs (every svcnet chain declared and
//! rewritten, stale chains deleted) and partial syncs (only the changed services' chains, as
//! kube-proxy's `MinimizeIPTablesRestore` does, plus `-D`/`-I`/`-A` edits of the shared
//! chains for the changed services' rules).
//!
//! With `--noflush`, a chain the payload does not mention keeps its rules, so a partial sync
//! leaves unchanged services' chains alone. kube-proxy redeclares its shared chains
//! (`KUBE-SERVICES`, …) on every sync, which costs O(all services) per change; svcnet edits
//! them in place instead (a `-D` of a rule that is not there fails the restore, and the next
//! sync is then full, so drift cannot go unnoticed).
//!
//! The [`Renderer`] remembers what was last applied successfully. A plan is computed without
//! changing that memory; only [`Renderer::commit`] after a successful apply does. So a failed
//! apply leaves the memory at the previous state; the caller then [`Renderer::invalidate`]s
//! and the next sync is full.

use std::collections::{BTreeMap, BTreeSet};

use svcnet_lb::Fallback;
use svcnet_proxy::{
    DesiredFamily, DesiredNode, DesiredServicePort, NamespacedName, ServicePortName,
};

use crate::names::{CANARY, CLUSTER_IPS, MARK_MASQ, MASQ_OFF_CLUSTER, PREFIX, SERVICES};
use crate::payload::{Family, Hook, Payload, Rule, Table, TablePayload};
use crate::render::{Fragment, base_chains, base_rules, hooks, service_fragment, tail_rules};

/// svcnet's chains found in the kernel, per table (from `iptables-save`), so a full sync with
/// unknown kernel state (the first one, or after a failure) deletes stale ones.
pub type KernelChains = BTreeMap<Table, BTreeSet<String>>;

/// A computed sync: the payload, the hooks to ensure first, and what to remember once applied.
#[derive(Debug)]
pub struct Plan {
    pub payload: Payload,
    /// Jumps from built-in chains to ensure before the restore (full syncs only).
    pub hooks: Vec<Hook>,
    /// Service ports of this plan whose algorithm iptables cannot express (they choose at
    /// random instead), for the runtime to report; a partial plan lists only the ports it
    /// re-rendered.
    pub fallbacks: Vec<(ServicePortName, Fallback)>,
    update: Update,
}

fn fallbacks<'a>(
    fragments: impl Iterator<Item = (&'a ServicePortName, &'a Fragment)>,
) -> Vec<(ServicePortName, Fallback)> {
    fragments
        .filter_map(|(k, f)| Some((k.clone(), f.fallback.clone()?)))
        .collect()
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

/// The hooks to ensure, then the payload, as `iptables-restore` reads it.
impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for h in &self.hooks {
            writeln!(f, "# hook {h}")?;
        }
        self.payload.fmt(f)
    }
}

/// The iptables dataplane's memory of one family.
#[derive(Debug)]
pub struct Renderer {
    family: Family,
    node: Option<DesiredNode>,
    applied: BTreeMap<ServicePortName, Fragment>,
    stage_chains: Option<usize>,
}

impl Renderer {
    pub fn new(family: Family) -> Self {
        Self {
            family,
            node: None,
            applied: BTreeMap::new(),
            stage_chains: None,
        }
    }

    /// Splits large payloads into staged commits of at most about `max_chains` per-service
    /// chains each, before the commit of the shared chains (see [`stage`]). `None` (the
    /// default) keeps one commit per table.
    pub fn set_staging(&mut self, max_chains: Option<usize>) {
        self.stage_chains = max_chains;
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// Whether a full sync has been committed (partial syncs need one first).
    pub fn has_applied(&self) -> bool {
        self.node.is_some()
    }

    /// Number of service ports currently programmed.
    pub fn service_ports(&self) -> usize {
        self.applied.len()
    }

    /// Plans a full sync of `desired`. `kernel` lists svcnet chains present in the kernel
    /// (read when the kernel state is unknown); chains there or in memory that the desired
    /// state no longer has are deleted.
    pub fn plan_full(&self, desired: &DesiredFamily, kernel: Option<&KernelChains>) -> Plan {
        let fragments: BTreeMap<ServicePortName, Fragment> = desired
            .services
            .iter()
            .map(|(k, d)| (k.clone(), service_fragment(d, &desired.node)))
            .collect();
        let mut payload = Payload::new(self.family);
        shared_chains(&mut payload, self.family, &desired.node, &fragments, true);
        let mut wanted: BTreeSet<&str> = base_chains().iter().map(|(_, c)| *c).collect();
        for f in fragments.values() {
            wanted.extend(f.chains.keys().map(String::as_str));
            write_chains(&mut payload, f.chains.iter());
        }
        let mut stale: BTreeMap<Table, BTreeSet<String>> = BTreeMap::new();
        for f in self.applied.values() {
            for c in f.chains.keys().filter(|c| !wanted.contains(c.as_str())) {
                stale.entry(Table::Nat).or_default().insert(c.clone());
            }
        }
        for (table, chains) in kernel.into_iter().flatten() {
            for c in chains {
                if c.starts_with(PREFIX) && !wanted.contains(c.as_str()) {
                    stale.entry(*table).or_default().insert(c.clone());
                }
            }
        }
        for (table, chains) in stale {
            let t = payload.table(table);
            for c in chains {
                t.chains.push(c.clone());
                t.deletes.push(c);
            }
        }
        if let Some(max) = self.stage_chains {
            let groups = fragments
                .values()
                .map(|f| f.chains.keys().cloned().collect())
                .collect();
            payload = stage(payload, groups, &desired.node, max);
        }
        Plan {
            payload,
            hooks: hooks(),
            fallbacks: fallbacks(fragments.iter()),
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
        let mut updates: BTreeMap<ServicePortName, Option<Fragment>> = BTreeMap::new();
        for (svc, ports) in changes {
            for spn in self.applied.keys().filter(|k| &k.service == svc) {
                updates.insert(spn.clone(), None);
            }
            for d in ports {
                updates.insert(d.name.clone(), Some(service_fragment(d, node)));
            }
        }
        // The shared chains are edited, not rewritten: the changed services' old rules are
        // deleted (`-D`) and their new ones added, so the sync is O(changed) however many
        // services exist. (kube-proxy redeclares its top-level chains in full; that is 1.2 s
        // at 10k and 22 s at 30k services on iptables-nft here.)
        let mut payload = Payload::new(self.family);
        let empty = Fragment::default();
        for (spn, new) in &updates {
            let old = self.applied.get(spn).unwrap_or(&empty);
            let new = new.as_ref().unwrap_or(&empty);
            for (table, rule) in old.shared.iter().filter(|r| !new.shared.contains(r)) {
                payload.table(*table).removes.push(rule.clone());
            }
            for (table, rule) in new.shared.iter().filter(|r| !old.shared.contains(r)) {
                let t = payload.table(*table);
                if has_tail(*table, &rule.chain) {
                    t.inserts.push(rule.clone());
                } else {
                    t.rules.push(rule.clone());
                }
            }
        }
        let mut deletes = Vec::new();
        for (spn, new) in &updates {
            let old = self.applied.get(spn).unwrap_or(&empty);
            let new = new.as_ref().unwrap_or(&empty);
            let changed = new
                .chains
                .iter()
                .filter(|(c, rules)| old.chains.get(*c) != Some(rules));
            write_chains(&mut payload, changed);
            deletes.extend(
                old.chains
                    .keys()
                    .filter(|c| !new.chains.contains_key(*c))
                    .cloned(),
            );
        }
        let nat = payload.table(Table::Nat);
        for c in deletes {
            nat.chains.push(c.clone());
            nat.deletes.push(c);
        }
        if let Some(max) = self.stage_chains {
            let groups = updates
                .values()
                .flatten()
                .map(|f| f.chains.keys().cloned().collect())
                .collect();
            payload = stage(payload, groups, node, max);
        }
        Some(Plan {
            payload,
            hooks: Vec::new(),
            fallbacks: fallbacks(updates.iter().filter_map(|(k, f)| Some((k, f.as_ref()?)))),
            update: Update::Partial { fragments: updates },
        })
    }

    /// Records that `plan` was applied successfully.
    pub fn commit(&mut self, plan: Plan) {
        match plan.update {
            Update::Full { node, fragments } => {
                self.node = Some(node);
                self.applied = fragments;
            }
            Update::Partial { fragments } => {
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

fn shared_chains(
    payload: &mut Payload,
    family: Family,
    node: &DesiredNode,
    fragments: &BTreeMap<ServicePortName, Fragment>,
    full: bool,
) {
    let list: Vec<&Fragment> = fragments.values().collect();
    shared_chains_from(payload, family, node, &list, full);
}

/// Declares the shared chains (the canaries only on full syncs, so a partial sync never
/// re-creates a canary someone removed) and writes their rules: fixed ones first, then each
/// service's in service order, then the rules that must come last.
fn shared_chains_from(
    payload: &mut Payload,
    family: Family,
    node: &DesiredNode,
    fragments: &[&Fragment],
    full: bool,
) {
    let chains = base_chains();
    for (table, chain) in &chains {
        if full || *chain != CANARY {
            payload.table(*table).chains.push(chain.to_string());
        }
    }
    let mut by_chain: BTreeMap<(Table, &str), Vec<Rule>> = BTreeMap::new();
    let base = base_rules(node);
    let tail = tail_rules(family, node);
    let services = fragments.iter().flat_map(|f| f.shared.iter());
    for (table, rule) in base.iter().chain(services).chain(tail.iter()) {
        by_chain
            .entry((*table, chain_key(&chains, &rule.chain)))
            .or_default()
            .push(rule.clone());
    }
    for (table, chain) in &chains {
        if let Some(rules) = by_chain.remove(&(*table, *chain)) {
            payload.table(*table).rules.extend(rules);
        }
    }
}

/// Whether a shared chain ends with rules that must stay last (nat `SVCNET-SERVICES`: the
/// node-port jump; filter `SVCNET-SERVICES`: the jump to the service-CIDR checks; filter
/// `SVCNET-CLUSTER-IPS`: the service-CIDR drop), so service rules are inserted at its head.
fn has_tail(table: Table, chain: &str) -> bool {
    (chain == SERVICES && matches!(table, Table::Nat | Table::Filter))
        || (chain == CLUSTER_IPS && table == Table::Filter)
}

fn chain_key(chains: &[(Table, &'static str)], name: &str) -> &'static str {
    chains
        .iter()
        .map(|(_, c)| *c)
        .find(|c| *c == name)
        .unwrap_or("")
}

fn write_chains<'a>(
    payload: &mut Payload,
    chains: impl Iterator<Item = (&'a String, &'a Vec<Rule>)>,
) {
    let nat = payload.table(Table::Nat);
    let mut rules = Vec::new();
    for (name, r) in chains {
        nat.chains.push(name.clone());
        rules.extend(r.iter().cloned());
    }
    nat.rules.extend(rules);
}

/// Moves the per-service chains of a payload into staged nat commits that come before the
/// commit of the shared chains, `max_chains` chains (whole services) per stage.
///
/// Why: `iptables-nft-restore --noflush` (iptables 1.8.9) spends time quadratic in the number
/// of distinct chains that receive rules within one commit (it de-duplicates its cache
/// requirements by a linear search): 10k services × 2 endpoints (30k chains) took 120 s in
/// one commit and a few seconds staged. Correctness: a staged commit only creates or rewrites
/// the chains of whole services (each service's chains in one stage, so every rewritten chain
/// jumps only to chains of the same commit or to the masquerade chains, which a prelude commit
/// writes first). New chains stay unreferenced until the last commit rewrites the shared
/// chains and deletes stale ones atomically, so traffic sees each service either before or
/// after its change — as with a series of partial syncs. If a stage fails, the next (full)
/// sync deletes the unreferenced leftovers as stale.
pub fn stage(
    payload: Payload,
    groups: Vec<Vec<String>>,
    node: &DesiredNode,
    max_chains: usize,
) -> Payload {
    let Some(pos) = payload.tables.iter().position(|(t, _)| *t == Table::Nat) else {
        return payload;
    };
    let nat = &payload.tables[pos].1;
    let declared: BTreeSet<&str> = nat.chains.iter().map(String::as_str).collect();
    let deleted: BTreeSet<&str> = nat.deletes.iter().map(String::as_str).collect();
    let groups: Vec<Vec<String>> = groups
        .into_iter()
        .map(|g| {
            g.into_iter()
                .filter(|c| declared.contains(c.as_str()) && !deleted.contains(c.as_str()))
                .collect::<Vec<_>>()
        })
        .filter(|g| !g.is_empty())
        .collect();
    let total: usize = groups.iter().map(Vec::len).sum();
    if total <= max_chains.max(1) {
        return payload;
    }
    let mut chunks: Vec<BTreeSet<String>> = vec![BTreeSet::new()];
    for g in groups {
        let full = chunks.last().is_some_and(|c| c.len() >= max_chains.max(1));
        if full {
            chunks.push(BTreeSet::new());
        }
        if let Some(c) = chunks.last_mut() {
            c.extend(g);
        }
    }
    // One pass over the rules: each chain's stage (1-based; 0 = the final commit).
    let stage_of: BTreeMap<&str, usize> = chunks
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.iter().map(move |name| (name.as_str(), i + 1)))
        .collect();
    let which = |chain: &str| stage_of.get(chain).copied().unwrap_or(0);
    let mut staged: Vec<TablePayload> = (0..=chunks.len())
        .map(|_| TablePayload::default())
        .collect();
    for c in &nat.chains {
        staged[which(c)].chains.push(c.clone());
    }
    for r in &nat.rules {
        staged[which(&r.chain)].rules.push(r.clone());
    }
    staged[0].deletes = nat.deletes.clone();
    staged[0].removes = nat.removes.clone();
    staged[0].inserts = nat.inserts.clone();
    let last = staged.remove(0);
    let mut sections: Vec<TablePayload> = Vec::new();
    // Prelude: the masquerade chains per-service rules jump to (tiny, rewritten atomically).
    let prelude_chains = [MARK_MASQ, MASQ_OFF_CLUSTER];
    let mut prelude = TablePayload {
        chains: prelude_chains.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    };
    prelude.rules = base_rules(node)
        .into_iter()
        .filter(|(t, r)| *t == Table::Nat && prelude_chains.contains(&r.chain.as_str()))
        .map(|(_, r)| r)
        .collect();
    sections.push(prelude);
    sections.extend(staged);
    sections.push(last);
    let mut out = Payload::new(payload.family);
    for (i, (t, section)) in payload.tables.into_iter().enumerate() {
        if i == pos {
            out.tables
                .extend(sections.drain(..).map(|s| (Table::Nat, s)));
        } else {
            out.tables.push((t, section));
        }
    }
    out
}
