//! Field paths and field sets, and their `FieldsV1` wire form, as structured-merge-diff's
//! `fieldpath` package defines them.
//!
//! A path is a list of elements: a field of a struct or map (`f:<name>`), an item of an
//! associative list named by its key fields (`k:{"name":"web"}`), an item of a set named by
//! its value (`v:"a"`), or (never for ownership, only for completeness) an index (`i:3`).
//! A set holds paths; it is a tree whose nodes record whether the path itself is a member
//! (serialised as `.`) and which children lie below.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

/// One step of a path. The derived order is upstream's: field names, then keys, then values,
/// then indices.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// A field of a struct or a key of a map.
    Field(String),
    /// An associative-list item: its key fields sorted by name, each value as canonical JSON.
    Key(Vec<(String, String)>),
    /// A set item, as canonical JSON.
    Value(String),
    /// A list index (atomic lists are owned whole, so this appears only in decoded input).
    Index(usize),
}

impl PathElement {
    /// The `FieldsV1` key of this element.
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(f) => format!("f:{f}"),
            PathElement::Key(kv) => {
                let obj: Map<String, Value> = kv
                    .iter()
                    .map(|(k, v)| {
                        let parsed = serde_json::from_str(v).unwrap_or(Value::Null);
                        (k.clone(), parsed)
                    })
                    .collect();
                format!("k:{}", Value::Object(obj))
            }
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a `FieldsV1` key.
    pub fn decode(s: &str) -> Result<PathElement, String> {
        let (tag, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("missing colon: {s:?}"))?;
        match tag {
            "f" => Ok(PathElement::Field(rest.to_string())),
            "k" => {
                let Ok(Value::Object(m)) = serde_json::from_str::<Value>(rest) else {
                    return Err(format!("expected a JSON object after 'k:': {s:?}"));
                };
                if m.is_empty() {
                    return Err("associative list keys must have at least one key".into());
                }
                Ok(PathElement::Key(
                    m.into_iter().map(|(k, v)| (k, v.to_string())).collect(),
                ))
            }
            "v" => {
                let v: Value = serde_json::from_str(rest)
                    .map_err(|e| format!("invalid value after 'v:' in {s:?}: {e}"))?;
                Ok(PathElement::Value(v.to_string()))
            }
            "i" => rest
                .parse()
                .map(PathElement::Index)
                .map_err(|_| format!("invalid index after 'i:' in {s:?}")),
            _ => Err(format!("unknown path element prefix {tag:?} in {s:?}")),
        }
    }
}

impl fmt::Display for PathElement {
    /// Upstream's `PathElement.String()`: `.name`, `[name="web"]`, `[="a"]`, `[3]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(kv) => {
                let parts: Vec<String> = kv.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(v) => write!(f, "[={v}]"),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A path from the object's root.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Path(pub Vec<PathElement>);

impl Path {
    pub fn child(&self, pe: PathElement) -> Path {
        let mut p = self.0.clone();
        p.push(pe);
        Path(p)
    }

    /// Whether `self` is `prefix` or lies below it.
    pub fn starts_with(&self, prefix: &Path) -> bool {
        self.0.starts_with(&prefix.0)
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for pe in &self.0 {
            write!(f, "{pe}")?;
        }
        Ok(())
    }
}

/// A set of paths, held as a tree.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSet {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    pub fn from_paths<'a>(paths: impl IntoIterator<Item = &'a Path>) -> FieldSet {
        let mut s = FieldSet::new();
        for p in paths {
            s.insert(p);
        }
        s
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    pub fn insert(&mut self, path: &Path) {
        let mut node = self;
        let Some((last, init)) = path.0.split_last() else {
            return;
        };
        for pe in init {
            node = node.children.entry(pe.clone()).or_default();
        }
        node.members.insert(last.clone());
    }

    pub fn has(&self, path: &Path) -> bool {
        let Some((last, init)) = path.0.split_last() else {
            return false;
        };
        let mut node = self;
        for pe in init {
            match node.children.get(pe) {
                Some(n) => node = n,
                None => return false,
            }
        }
        node.members.contains(last)
    }

    /// Whether the set holds `path` or any path below it.
    pub fn has_prefix(&self, path: &Path) -> bool {
        let Some((last, init)) = path.0.split_last() else {
            return !self.is_empty();
        };
        let mut node = self;
        for pe in init {
            match node.children.get(pe) {
                Some(n) => node = n,
                None => return false,
            }
        }
        node.members.contains(last) || node.children.contains_key(last)
    }

    /// Every member path, in order.
    pub fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out.sort();
        out
    }

    fn collect(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Path>) {
        for m in &self.members {
            let mut p = prefix.clone();
            p.push(m.clone());
            out.push(Path(p));
        }
        for (pe, child) in &self.children {
            prefix.push(pe.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (pe, child) in &other.children {
            let merged = match out.children.get(pe) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.children.insert(pe.clone(), merged);
        }
        out
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        out.members = self.members.intersection(&other.members).cloned().collect();
        for (pe, child) in &self.children {
            if let Some(theirs) = other.children.get(pe) {
                let i = child.intersection(theirs);
                if !i.is_empty() {
                    out.children.insert(pe.clone(), i);
                }
            }
        }
        out
    }

    /// The member paths of `self` that are not members of `other` (exact paths, not subtrees).
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        out.members = self.members.difference(&other.members).cloned().collect();
        for (pe, child) in &self.children {
            let d = match other.children.get(pe) {
                Some(theirs) => child.difference(theirs),
                None => child.clone(),
            };
            if !d.is_empty() {
                out.children.insert(pe.clone(), d);
            }
        }
        out
    }

    /// The set without the paths `drop` says to drop (`drop` sees each member path).
    pub fn filter(&self, keep: &dyn Fn(&Path) -> bool) -> FieldSet {
        FieldSet::from_paths(self.paths().iter().filter(|p| keep(p)))
    }

    /// The `FieldsV1` JSON of the set.
    pub fn to_fields_v1(&self) -> Value {
        let mut obj = Map::new();
        let mut keys: BTreeSet<&PathElement> = self.members.iter().collect();
        keys.extend(self.children.keys());
        for pe in keys {
            let member = self.members.contains(pe);
            let node = match self.children.get(pe) {
                Some(child) => {
                    let mut inner = match child.to_fields_v1() {
                        Value::Object(m) => m,
                        _ => Map::new(),
                    };
                    if member {
                        inner.insert(".".into(), Value::Object(Map::new()));
                    }
                    Value::Object(inner)
                }
                None => Value::Object(Map::new()),
            };
            obj.insert(pe.encode(), node);
        }
        Value::Object(obj)
    }

    /// Parses `FieldsV1` JSON (upstream's `FieldsToSet`).
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, String> {
        let Value::Object(m) = v else {
            return Err("FieldsV1 must be a JSON object".into());
        };
        let mut out = FieldSet::new();
        for (k, child) in m {
            if k == "." {
                return Err("'.' is only valid below a path element".into());
            }
            let pe = PathElement::decode(k)?;
            let Value::Object(cm) = child else {
                return Err(format!("the value of {k:?} must be a JSON object"));
            };
            let mut sub = Map::new();
            let mut member = cm.is_empty();
            for (ck, cv) in cm {
                if ck == "." {
                    member = true;
                } else {
                    sub.insert(ck.clone(), cv.clone());
                }
            }
            if member {
                out.members.insert(pe.clone());
            }
            if !sub.is_empty() {
                out.children
                    .insert(pe, FieldSet::from_fields_v1(&Value::Object(sub))?);
            }
        }
        Ok(out)
    }
}
