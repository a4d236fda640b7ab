//! The node loop's renderer: it keeps the model and the table it renders to, indexed by
//! what each object depends on, and turns one change (a pod, a policy, a namespace's labels)
//! into the few set elements and chains it affects, recording their names for
//! [`crate::plan::plan_changes`]. A change costs what it touches, never the cluster's size:
//!
//! - a pod: the selector sets confined to its namespace, the sets with a
//!   `namespaceSelector`, the named-port sets and this node's isolation sets, each asked
//!   about that pod only (and about the pods sharing its address);
//! - a policy: its own chains, the sets it starts or stops using (a new set is filled from
//!   its namespace's pods, or those of the namespaces its selector picks), the dispatch
//!   chain of a direction only when its jump there changed (created, deleted, another
//!   `podSelector` or `policyTypes`), the isolation of this node's pods in its namespace
//!   only then too;
//! - a namespace's labels: the sets with a `namespaceSelector`, for that namespace's pods.
//!
//! The table is always what [`render`] gives for the same model (tested after every step of
//! seeded change sequences, and by every kernel test).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use svcnet_netpol::{Cluster, Direction, Namespace, Peer, Pod, Policy};

use crate::names;
use crate::render::{
    ChainSpec, Options, Ruleset, Want, candidates, contribution, dispatch_chain, isolated_name,
    isolation_elements, jump_rule, policy_chain, render,
};

/// The names of the sets and chains changed since they were last taken: what a plan has to
/// compare (a name may also stand for an object created or deleted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub sets: BTreeSet<String>,
    pub chains: BTreeSet<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.chains.is_empty()
    }

    /// Every object of `r`.
    fn all(r: &Ruleset) -> Changes {
        Changes {
            sets: r.sets.keys().cloned().collect(),
            chains: r.chains.keys().cloned().collect(),
        }
    }
}

/// What fills a set a policy uses (owned form of [`Want`]).
#[derive(Debug)]
enum Fill {
    Pods {
        key: String,
        namespace: String,
        peer: Peer,
    },
    Block,
    Port(String),
}

#[derive(Debug)]
struct SetUse {
    fill: Fill,
    /// References from policies' chains; the set goes with the last.
    users: usize,
}

type Key = (String, String);

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Renders one node's table change by change (see the module's documentation).
#[derive(Debug)]
pub struct Renderer {
    node: String,
    opts: Options,
    namespaces: HashMap<String, BTreeMap<String, String>>,
    pods: HashMap<Key, Pod>,
    /// Pod names per namespace.
    by_ns: HashMap<String, BTreeSet<String>>,
    /// The pods holding each address (usually one).
    by_ip: HashMap<IpAddr, Vec<Key>>,
    /// Policies in (namespace, name) order, each with the sets its chains use.
    policies: BTreeMap<Key, (Policy, Vec<String>)>,
    sets: HashMap<String, SetUse>,
    /// Selector sets confined to one namespace (no `namespaceSelector`), by namespace.
    scoped: HashMap<String, BTreeSet<String>>,
    /// Selector sets with a `namespaceSelector`.
    across: BTreeSet<String>,
    /// Named-port sets.
    port_sets: BTreeSet<String>,
    ruleset: Ruleset,
    changes: Changes,
}

impl Renderer {
    /// A renderer of `node`'s table for an empty cluster.
    pub fn new(node: &str, opts: Options) -> Self {
        let ruleset = render(&Cluster::default(), node, &opts);
        Self {
            node: node.to_string(),
            opts,
            namespaces: HashMap::new(),
            pods: HashMap::new(),
            by_ns: HashMap::new(),
            by_ip: HashMap::new(),
            policies: BTreeMap::new(),
            sets: HashMap::new(),
            scoped: HashMap::new(),
            across: BTreeSet::new(),
            port_sets: BTreeSet::new(),
            changes: Changes::all(&ruleset),
            ruleset,
        }
    }

    /// The table for the model as it stands.
    pub fn ruleset(&self) -> &Ruleset {
        &self.ruleset
    }

    /// The names changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Makes the model `cluster`, changing only what differs (pods and policies are told
    /// apart by namespace and name: of two with the same, the later counts).
    pub fn update(&mut self, cluster: &Cluster) {
        let names: HashSet<&str> = cluster.namespaces.iter().map(|n| n.name.as_str()).collect();
        let gone: Vec<String> = (self.namespaces.keys())
            .filter(|n| !names.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            self.remove_namespace(&name);
        }
        for ns in &cluster.namespaces {
            if self.namespaces.get(&ns.name) != Some(&ns.labels) {
                self.set_namespace(ns.clone());
            }
        }
        let gone = missing(
            self.pods.keys(),
            cluster.pods.iter().map(|p| (&p.namespace, &p.name)),
        );
        for (ns, name) in gone {
            self.remove_pod(&ns, &name);
        }
        for pod in &cluster.pods {
            let key = (pod.namespace.clone(), pod.name.clone());
            if self.pods.get(&key) != Some(pod) {
                self.set_pod(pod.clone());
            }
        }
        let policies = cluster.policies.iter().map(|p| (&p.namespace, &p.name));
        for (ns, name) in missing(self.policies.keys(), policies) {
            self.remove_policy(&ns, &name);
        }
        for policy in &cluster.policies {
            let key = (policy.namespace.clone(), policy.name.clone());
            if self.policies.get(&key).map(|(p, _)| p) != Some(policy) {
                self.set_policy(policy.clone());
            }
        }
    }

    /// The table for `cluster` ([`Renderer::update`], then a copy of the table).
    pub fn render(&mut self, cluster: &Cluster) -> Ruleset {
        self.update(cluster);
        self.ruleset.clone()
    }

    /// A namespace created or relabelled.
    pub fn set_namespace(&mut self, ns: Namespace) {
        if self.namespaces.get(&ns.name) == Some(&ns.labels) {
            return;
        }
        self.namespaces.insert(ns.name.clone(), ns.labels);
        self.namespace_changed(&ns.name);
    }

    /// A namespace deleted (its pods, if any are left, count as unlabelled).
    pub fn remove_namespace(&mut self, name: &str) {
        if self.namespaces.remove(name).is_some() {
            self.namespace_changed(name);
        }
    }

    /// A pod created or changed (labels, addresses, ports, node).
    pub fn set_pod(&mut self, pod: Pod) {
        let key = (pod.namespace.clone(), pod.name.clone());
        if self.pods.get(&key) == Some(&pod) {
            return;
        }
        let old = self.take_pod(&key);
        for ip in &pod.ips {
            self.by_ip.entry(*ip).or_default().push(key.clone());
        }
        (self.by_ns.entry(key.0.clone()).or_default()).insert(key.1.clone());
        self.pods.insert(key.clone(), pod);
        self.pod_changed(old, Some(&key));
    }

    /// A pod deleted.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(old) = self.take_pod(&key) {
            self.pod_changed(Some(old), None);
        }
    }

    /// A policy created or changed.
    pub fn set_policy(&mut self, policy: Policy) {
        let key = (policy.namespace.clone(), policy.name.clone());
        if self.policies.get(&key).is_some_and(|(p, _)| *p == policy) {
            return;
        }
        self.policy_changed(key, Some(policy));
    }

    /// A policy deleted.
    pub fn remove_policy(&mut self, namespace: &str, name: &str) {
        self.policy_changed((namespace.to_string(), name.to_string()), None);
    }

    fn ns_labels(&self, name: &str) -> &BTreeMap<String, String> {
        self.namespaces.get(name).unwrap_or(&NO_LABELS)
    }

    fn take_pod(&mut self, key: &Key) -> Option<Pod> {
        let old = self.pods.remove(key)?;
        for ip in &old.ips {
            if let Some(keys) = self.by_ip.get_mut(ip) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.by_ip.remove(ip);
                }
            }
        }
        if let Some(names) = self.by_ns.get_mut(&key.0) {
            names.remove(&key.1);
            if names.is_empty() {
                self.by_ns.remove(&key.0);
            }
        }
        Some(old)
    }

    /// The policies of a namespace.
    fn policies_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a Policy> + 'a {
        (self
            .policies
            .range((namespace.to_string(), String::new())..))
        .take_while(move |((ns, _), _)| ns == namespace)
        .map(|(_, (p, _))| p)
    }

    fn isolated(&self, pod: &Pod, dir: Direction) -> bool {
        pod.node.as_deref() == Some(self.node.as_str())
            && self
                .policies_in(&pod.namespace)
                .any(|p| p.isolates_pod(pod, dir))
    }

    /// What `pod` puts in set `name` as the model stands.
    fn contribution(&self, name: &str, pod: &Pod) -> Vec<String> {
        if let Some(dir) = isolation_map(name) {
            return match self.isolated(pod, dir) {
                true => (isolation_elements(pod, dir, self.opts.family).into_iter())
                    .map(|(_, e)| e)
                    .collect(),
                false => Vec::new(),
            };
        }
        match self.sets.get(name).and_then(|u| u.fill.want()) {
            Some(want) => contribution(&want, pod, self.opts.family, |ns| self.ns_labels(ns)),
            None => Vec::new(),
        }
    }

    /// The elements `pod` could put in set `name`, whether or not it does.
    fn candidates(&self, name: &str, pod: &Pod) -> Vec<(IpAddr, String)> {
        if let Some(dir) = isolation_map(name) {
            return isolation_elements(pod, dir, self.opts.family);
        }
        match self.sets.get(name).and_then(|u| u.fill.want()) {
            Some(want) => candidates(&want, pod, self.opts.family),
            None => Vec::new(),
        }
    }

    /// Makes each candidate element of set `name` present exactly when a pod holding its
    /// address contributes it.
    fn reconcile(&mut self, name: &str, candidates: Vec<(IpAddr, String)>) {
        let mut add = Vec::new();
        let mut remove = Vec::new();
        for (ip, e) in candidates {
            let wanted = self.by_ip.get(&ip).is_some_and(|keys| {
                keys.iter().any(|k| {
                    (self.pods.get(k)).is_some_and(|p| self.contribution(name, p).contains(&e))
                })
            });
            match wanted {
                true => add.push(e),
                false => remove.push(e),
            }
        }
        let Some(set) = self.ruleset.sets.get_mut(name) else {
            return;
        };
        let mut changed = false;
        for e in remove {
            changed |= set.elements.remove(&e);
        }
        for e in add {
            changed |= set.elements.insert(e);
        }
        if changed {
            self.changes.sets.insert(name.to_string());
        }
    }

    /// The sets whose elements may depend on `pod`.
    fn sets_of(&self, pod: &Pod) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        if pod.node.as_deref() == Some(self.node.as_str()) {
            out.extend([Direction::Ingress, Direction::Egress].map(|d| isolated_name(d).into()));
        }
        out.extend(
            self.scoped
                .get(&pod.namespace)
                .into_iter()
                .flatten()
                .cloned(),
        );
        out.extend(self.across.iter().cloned());
        out.extend(self.port_sets.iter().cloned());
        out
    }

    /// Reconciles every set `old` (gone) or the pod at `new` (current) may be in.
    fn pod_changed(&mut self, old: Option<Pod>, new: Option<&Key>) {
        let mut work = Vec::new();
        let new = new.and_then(|k| self.pods.get(k));
        for pod in old.iter().chain(new) {
            for name in self.sets_of(pod) {
                let c = self.candidates(&name, pod);
                work.push((name, c));
            }
        }
        for (name, c) in work {
            self.reconcile(&name, c);
        }
    }

    fn namespace_changed(&mut self, name: &str) {
        let mut work = Vec::new();
        for set in &self.across {
            for pod in self.by_ns.get(name).into_iter().flatten() {
                if let Some(pod) = self.pods.get(&(name.to_string(), pod.clone())) {
                    work.push((set.clone(), self.candidates(set, pod)));
                }
            }
        }
        for (set, c) in work {
            self.reconcile(&set, c);
        }
    }

    /// The set a policy's chain wants, created and filled on its first use.
    fn use_set(&mut self, want: Want<'_>) -> String {
        let name = want.name();
        if let Some(u) = self.sets.get_mut(&name) {
            u.users += 1;
            return name;
        }
        let f = self.opts.family;
        let mut spec = want.spec(f);
        // Only the pods the set can hold are asked: its namespace's, those of the
        // namespaces its selector picks, every pod for a port name.
        let namespaces: Vec<&String> = match &want {
            Want::Pods {
                namespace,
                peer: Peer::Pods {
                    namespaces: None, ..
                },
                ..
            } => self
                .by_ns
                .get_key_value(*namespace)
                .map(|(k, _)| k)
                .into_iter()
                .collect(),
            Want::Pods {
                peer:
                    Peer::Pods {
                        namespaces: Some(sel),
                        ..
                    },
                ..
            } => (self.by_ns.keys())
                .filter(|ns| sel.matches(self.ns_labels(ns)))
                .collect(),
            Want::Port(_) => self.by_ns.keys().collect(),
            Want::Pods { .. } | Want::Block { .. } => Vec::new(),
        };
        for ns in namespaces {
            for pod in self.by_ns.get(ns).into_iter().flatten() {
                if let Some(pod) = self.pods.get(&(ns.clone(), pod.clone())) {
                    spec.elements
                        .extend(contribution(&want, pod, f, |ns| self.ns_labels(ns)));
                }
            }
        }
        let fill = match want {
            Want::Pods {
                key,
                namespace,
                peer,
            } => {
                match peer {
                    Peer::Pods {
                        namespaces: None, ..
                    } => {
                        (self.scoped.entry(namespace.to_string()).or_default())
                            .insert(name.clone());
                    }
                    _ => {
                        self.across.insert(name.clone());
                    }
                }
                Fill::Pods {
                    key,
                    namespace: namespace.to_string(),
                    peer: peer.clone(),
                }
            }
            Want::Block { .. } => Fill::Block,
            Want::Port(port) => {
                self.port_sets.insert(name.clone());
                Fill::Port(port.to_string())
            }
        };
        self.sets.insert(name.clone(), SetUse { fill, users: 1 });
        self.ruleset.sets.insert(name.clone(), spec);
        self.changes.sets.insert(name.clone());
        name
    }

    fn release_set(&mut self, name: &str) {
        let Some(u) = self.sets.get_mut(name) else {
            return;
        };
        u.users -= 1;
        if u.users > 0 {
            return;
        }
        if let Some(SetUse {
            fill: Fill::Pods { namespace, .. },
            ..
        }) = self.sets.remove(name)
            && let Some(names) = self.scoped.get_mut(&namespace)
        {
            names.remove(name);
            if names.is_empty() {
                self.scoped.remove(&namespace);
            }
        }
        self.across.remove(name);
        self.port_sets.remove(name);
        self.ruleset.sets.remove(name);
        self.changes.sets.insert(name.to_string());
    }

    fn policy_changed(&mut self, key: Key, new: Option<Policy>) {
        let old = self.policies.remove(&key);
        let mut used = Vec::new();
        let f = self.opts.family;
        for dir in [Direction::Egress, Direction::Ingress] {
            let id = format!("{}/{}", key.0, key.1);
            let chain = names::policy_chain(dir == Direction::Ingress, &id);
            let rules = match &new {
                Some(p) if p.isolates(dir) => {
                    let mut need = |want: Want<'_>| {
                        let name = self.use_set(want);
                        used.push(name.clone());
                        name
                    };
                    Some(policy_chain(p, dir, f, &mut need).2)
                }
                _ => None,
            };
            match rules {
                Some(rules) => {
                    if self.ruleset.chains.get(&chain).map(|c| &c.rules) != Some(&rules) {
                        let spec = ChainSpec { base: None, rules };
                        self.ruleset.chains.insert(chain.clone(), spec);
                        self.changes.chains.insert(chain);
                    }
                }
                None => {
                    if self.ruleset.chains.remove(&chain).is_some() {
                        self.changes.chains.insert(chain);
                    }
                }
            }
        }
        // What a policy's dispatch rule for a direction depends on.
        fn jump(p: Option<&Policy>, dir: Direction) -> Option<&svcnet_netpol::Selector> {
            p.filter(|p| p.isolates(dir)).map(|p| &p.pod_selector)
        }
        let moved: Vec<Direction> = [Direction::Egress, Direction::Ingress]
            .into_iter()
            .filter(|d| jump(old.as_ref().map(|o| &o.0), *d) != jump(new.as_ref(), *d))
            .collect();
        let old_used = match old {
            Some((_, used)) => used,
            None => Vec::new(),
        };
        if let Some(p) = new {
            self.policies.insert(key.clone(), (p, used));
        }
        for name in old_used {
            self.release_set(&name);
        }
        for dir in &moved {
            let jumps: Vec<String> = (self.policies_in(&key.0))
                .filter(|p| p.isolates(*dir))
                .map(|p| jump_rule(p, *dir, self.opts.family))
                .collect();
            let name = names::namespace_chain(*dir == Direction::Ingress, &key.0);
            if jumps.is_empty() {
                self.ruleset.chains.remove(&name);
            } else {
                let chain = dispatch_chain(jumps, &self.opts);
                self.ruleset.chains.insert(name.clone(), chain);
            }
            self.changes.chains.insert(name);
        }
        if !moved.is_empty() {
            let mut work = Vec::new();
            for pod in self.by_ns.get(&key.0).into_iter().flatten() {
                if let Some(pod) = self.pods.get(&(key.0.clone(), pod.clone()))
                    && pod.node.as_deref() == Some(self.node.as_str())
                {
                    for dir in [Direction::Ingress, Direction::Egress] {
                        let name = isolated_name(dir);
                        work.push((name, isolation_elements(pod, dir, self.opts.family)));
                    }
                }
            }
            for (name, c) in work {
                self.reconcile(name, c);
            }
        }
    }
}

/// The keys of `have` that `keep` does not name.
fn missing<'a>(
    have: impl Iterator<Item = &'a Key>,
    keep: impl Iterator<Item = (&'a String, &'a String)>,
) -> Vec<Key> {
    let keep: HashSet<(&String, &String)> = keep.collect();
    have.filter(|(ns, n)| !keep.contains(&(ns, n)))
        .cloned()
        .collect()
}

/// The direction of an isolation map's name.
fn isolation_map(name: &str) -> Option<Direction> {
    [Direction::Ingress, Direction::Egress]
        .into_iter()
        .find(|d| name == isolated_name(*d))
}

impl Fill {
    /// What the set stands for; `None` for a block (its elements never depend on pods).
    fn want(&self) -> Option<Want<'_>> {
        match self {
            Fill::Pods {
                key,
                namespace,
                peer,
            } => Some(Want::Pods {
                key: key.clone(),
                namespace,
                peer,
            }),
            Fill::Block => None,
            Fill::Port(port) => Some(Want::Port(port)),
        }
    }
}
