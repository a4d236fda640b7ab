//! Server-side apply with field ownership: `metadata.managedFields`, as
//! `sigs.k8s.io/structured-merge-diff` and kube-apiserver's field manager keep it.
//!
//! Every write records who set which fields. An **Update** (create, replace, a non-apply
//! patch) takes the fields it added or changed, from everyone else too. An **Apply** owns
//! exactly the fields of its configuration; setting a field another manager owns to a
//! different value is a conflict unless forced (then ownership moves), the same value is
//! shared ownership, and fields the applier owned in its previous configuration that it no
//! longer applies are removed from the object unless another manager owns them.
//!
//! Objects here are JSON values without their `managedFields` (the caller takes them out and
//! puts the result back). List keys and atomic types come from [`schema`]; `metadata` fields
//! the server owns are never owned by a manager (upstream's `stripMeta`), and the part of the
//! object a request may not write ([`Part`]) is never owned through it. Not modelled:
//! conversion between versions (every served kind has one).

mod entries;
pub mod fieldpath;
pub mod last_applied;
pub mod schema;
pub mod walk;

#[cfg(test)]
mod tests;

use serde_json::{Value, json};

pub use entries::{ANCIENT_CHANGES, MAX_UPDATE_MANAGERS, decode, encode, is_reset, validate};
pub use fieldpath::{FieldSet, Path, PathElement};

/// `Apply` or `Update`, as written in an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Who writes: the identity an entry is merged under (upstream's manager identifier:
/// manager, operation, subresource, and the apiVersion for Updates only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerId {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub subresource: String,
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: ManagerId,
    pub time: Option<String>,
    pub fields: FieldSet,
}

impl ManagerId {
    fn same(&self, other: &ManagerId) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
            && (self.operation == Operation::Apply || self.api_version == other.api_version)
    }

    /// Upstream's `printManager`: `"name"`, plus `with subresource "s"`, plus `using v` for
    /// Updates.
    pub fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s = format!("{s} with subresource {:?}", self.subresource);
        }
        if self.operation == Operation::Update {
            s = format!("{s} using {}", self.api_version);
        }
        s
    }
}

/// Which part of the object a request writes; the rest is never owned through it (upstream's
/// reset fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The main resource; `status` is apart when the kind has a status subresource.
    Main {
        status_apart: bool,
    },
    Status,
    Scale,
}

impl Part {
    fn owns(self, p: &Path) -> bool {
        let first = match p.0.first() {
            Some(PathElement::Field(f)) => f.as_str(),
            _ => return false,
        };
        match self {
            Part::Main { status_apart } => !(status_apart && first == "status"),
            Part::Status => first == "status",
            Part::Scale => {
                p.0.len() == 2 && first == "spec" && p.0[1] == PathElement::Field("replicas".into())
            }
        }
    }

    /// The subresource name entries written through this part carry.
    pub fn subresource(self) -> &'static str {
        match self {
            Part::Main { .. } => "",
            Part::Status => "status",
            Part::Scale => "scale",
        }
    }
}

/// Metadata the server owns: never in a manager's set (upstream's `stripMeta`).
fn server_owned(p: &Path) -> bool {
    let names: Vec<&str> =
        p.0.iter()
            .map(|pe| match pe {
                PathElement::Field(f) => f.as_str(),
                _ => "",
            })
            .collect();
    matches!(
        names.as_slice(),
        ["apiVersion" | "kind" | "metadata"]
            | [
                "metadata",
                "name"
                    | "namespace"
                    | "creationTimestamp"
                    | "selfLink"
                    | "uid"
                    | "clusterName"
                    | "generation"
                    | "managedFields"
                    | "resourceVersion"
            ]
    )
}

fn ownable(part: Part, set: &FieldSet) -> FieldSet {
    set.filter(&|p| part.owns(p) && !server_owned(p))
}

/// The manager that owns what an object held before its first apply.
pub const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// A refused apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyError {
    /// The configuration does not fit the schema (a list item without its key, duplicates).
    Invalid(String),
    /// Fields another manager owns would change.
    Conflicts(Vec<Conflict>),
}

/// A field another manager owns that an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: ManagerId,
    pub path: Path,
}

impl Conflict {
    /// The `details.causes[].message` upstream sends.
    pub fn cause_message(&self) -> String {
        format!("conflict with {}", self.manager.describe())
    }
}

/// Upstream's message for a conflicted apply.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            c.manager.describe(),
            c.path
        );
    }
    let mut by_manager: Vec<(String, Vec<String>)> = Vec::new();
    for c in conflicts {
        let m = c.manager.describe();
        match by_manager.iter_mut().find(|(n, _)| *n == m) {
            Some((_, paths)) => paths.push(c.path.to_string()),
            None => by_manager.push((m, vec![c.path.to_string()])),
        }
    }
    by_manager.sort();
    let mut lines = Vec::new();
    for (m, paths) in by_manager {
        lines.push(format!("conflicts with {m}:"));
        lines.extend(paths.into_iter().map(|p| format!("- {p}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// What changed between two objects, as paths.
struct Comparison {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

fn compare(old: &walk::Leaves, new: &walk::Leaves) -> Comparison {
    let mut added = FieldSet::new();
    let mut modified = FieldSet::new();
    let mut removed = FieldSet::new();
    for (p, v) in new {
        match old.get(p) {
            None => added.insert(p),
            Some(ov) if ov != v => modified.insert(p),
            Some(_) => {}
        }
    }
    for p in old.keys() {
        if !new.contains_key(p) {
            removed.insert(p);
        }
    }
    Comparison {
        added,
        modified,
        removed,
    }
}

/// One write: the object's kind, the part of it written, by whom and when (RFC 3339).
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    pub kind: &'a str,
    pub part: Part,
    pub manager: &'a ManagerId,
    pub now: &'a str,
}

/// Records an Update by `id` that turned `live` into `new` (`live` is `Null` on create):
/// the writer takes every field it added or changed, from every other manager too, and
/// fields that disappeared are nobody's.
pub fn update(w: &Write<'_>, live: &Value, new: &Value, mut entries: Vec<Entry>) -> Vec<Entry> {
    let Write {
        kind,
        part,
        manager: id,
        now,
    } = *w;
    // An existing object nobody manages stays unmanaged until its first apply (upstream's
    // skip-non-applied manager): objects from before ownership, or reset with `[{}]`.
    if entries.is_empty() && live.is_object() {
        return entries;
    }
    let root = walk::root(kind);
    let old = walk::leaves(live, root, false).unwrap_or_default();
    let next = walk::leaves(new, root, false).unwrap_or_default();
    let cmp = compare(&old, &next);
    let taken = ownable(part, &cmp.added.union(&cmp.modified));
    for e in entries.iter_mut() {
        e.fields = e.fields.difference(&cmp.removed);
        if !e.id.same(id) {
            e.fields = e.fields.difference(&taken);
        }
    }
    if !taken.is_empty() {
        match entries.iter_mut().find(|e| e.id.same(id)) {
            Some(e) => {
                e.fields = e.fields.union(&taken);
                e.time = Some(now.to_string());
            }
            None => entries.push(Entry {
                id: id.clone(),
                time: Some(now.to_string()),
                fields: taken,
            }),
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    entries::cap_updates(entries)
}

/// Applies `config` by `id` to `live` (`Null` when the object does not exist yet): returns
/// the merged object (with fields the applier gave up removed) and the new entries.
pub fn apply(
    w: &Write<'_>,
    live: &Value,
    config: &Value,
    mut entries: Vec<Entry>,
    force: bool,
) -> Result<(Value, Vec<Entry>), ApplyError> {
    let Write {
        kind,
        part,
        manager: id,
        now,
    } = *w;
    if entries.is_empty() && live.is_object() {
        // The first apply to an unmanaged object: what it holds is owned by
        // `before-first-apply` first, so changing it conflicts.
        let before = ManagerId {
            manager: BEFORE_FIRST_APPLY.into(),
            operation: Operation::Update,
            api_version: id.api_version.clone(),
            subresource: String::new(),
        };
        let w = Write {
            manager: &before,
            ..*w
        };
        entries = update(&w, &Value::Null, live, Vec::new());
    }
    let root = walk::root(kind);
    let config = walk::without_nulls(config);
    let config_leaves = walk::leaves(&config, root, true).map_err(ApplyError::Invalid)?;
    let applied = ownable(part, &walk::field_set(&config_leaves));
    let merged_input = if live.is_object() {
        live.clone()
    } else {
        json!({})
    };
    let mut merged = walk::merge(&merged_input, &config, root);

    // Remove what the applier applied last time and no longer applies, unless someone
    // (another manager, or this configuration below it) still owns it or something below it.
    let previous = entries
        .iter()
        .find(|e| e.id.same(id))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others = entries
        .iter()
        .filter(|e| !e.id.same(id))
        .fold(FieldSet::new(), |acc, e| acc.union(&e.fields));
    let owned = others.union(&applied);
    let mut removed_paths = Vec::new();
    for p in previous.difference(&applied).paths() {
        if owned.has_prefix(&p) {
            continue;
        }
        if walk::remove(&mut merged, &p.0, root) {
            removed_paths.push(p);
        }
    }
    prune_emptied(&mut merged, &removed_paths, &owned, root);

    let old = walk::leaves(live, root, false).unwrap_or_default();
    let next = walk::leaves(&merged, root, false).unwrap_or_default();
    let cmp = compare(&old, &next);
    let changed = ownable(part, &cmp.added.union(&cmp.modified));
    let mut conflicts = Vec::new();
    for e in &entries {
        if e.id.same(id) {
            continue;
        }
        for p in e.fields.intersection(&changed).paths() {
            conflicts.push(Conflict {
                manager: e.id.clone(),
                path: p,
            });
        }
    }
    if id.manager == last_applied::MANAGER && !conflicts.is_empty() {
        let allowed = last_applied::allowed_conflicts(kind, live);
        conflicts.retain(|c| !allowed.has(&c.path));
    }
    if !force && !conflicts.is_empty() {
        return Err(ApplyError::Conflicts(conflicts));
    }
    let object_changed = merged != merged_input || !live.is_object();
    for e in entries.iter_mut() {
        if !e.id.same(id) {
            e.fields = e.fields.difference(&cmp.removed).difference(&changed);
        }
    }
    match entries.iter_mut().find(|e| e.id.same(id)) {
        Some(e) => {
            e.fields = applied;
            e.id.api_version = id.api_version.clone();
            if object_changed {
                e.time = Some(now.to_string());
            }
        }
        None => entries.push(Entry {
            id: id.clone(),
            time: object_changed.then(|| now.to_string()),
            fields: applied,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    let entries = entries::cap_updates(entries);
    if id.manager == last_applied::MANAGER {
        last_applied::sync_annotation(&mut merged, &config);
    }
    Ok((merged, entries))
}

/// After removals, drops maps and lists the removals left empty, unless someone owns them
/// or something below them.
fn prune_emptied(merged: &mut Value, removed: &[Path], owned: &FieldSet, root: schema::Field) {
    for p in removed {
        let mut prefix = p.0.clone();
        while prefix.len() > 1 {
            prefix.pop();
            let parent = Path(prefix.clone());
            let empty = match walk::get(merged, &prefix, root) {
                Some(Value::Object(m)) => m.is_empty(),
                Some(Value::Array(a)) => a.is_empty(),
                _ => false,
            };
            if !empty || owned.has_prefix(&parent) || server_owned(&parent) {
                break;
            }
            walk::remove(merged, &prefix, root);
        }
    }
}

/// Upstream's default manager of an Update without `fieldManager`: the User-Agent up to its
/// first `/`, at most 128 bytes.
pub fn manager_from_user_agent(user_agent: &str) -> String {
    let prefix = user_agent.split('/').next().unwrap_or("");
    let mut end = prefix.len().min(128);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    prefix[..end].to_string()
}
