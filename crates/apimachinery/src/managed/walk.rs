//! Walks over objects guided by the schema table: the leaves of an object (what a field set
//! names), the merge of an apply configuration into a live object, and the removal of a path.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::fieldpath::{FieldSet, Path, PathElement};
use super::schema::{Field, ListType, Ty};

/// Every owned path of an object, with the value compared to detect a modification:
/// `Some(value)` for a scalar, an atomic list/map or an empty map; `None` for an
/// associative-list or set item, whose presence alone counts.
pub type Leaves = BTreeMap<Path, Option<Value>>;

/// The field of the root: a granular struct of the kind's type.
pub fn root(kind: &str) -> Field {
    Field {
        ty: Ty::for_kind(kind),
        list: ListType::Atomic,
        atomic: false,
    }
}

/// The leaves of `v`. `strict` (an apply configuration) refuses list items without their
/// keys and duplicate keys, as upstream does; otherwise (a stored or updated object, which
/// validation may have let through) such a list is owned as a whole.
pub fn leaves(v: &Value, field: Field, strict: bool) -> Result<Leaves, String> {
    let mut out = Leaves::new();
    if let Value::Object(m) = v {
        walk_map(m, field.ty, &Path::default(), strict, &mut out)?;
    }
    Ok(out)
}

pub fn field_set(leaves: &Leaves) -> FieldSet {
    FieldSet::from_paths(leaves.keys())
}

fn walk_map(
    m: &Map<String, Value>,
    ty: Ty,
    path: &Path,
    strict: bool,
    out: &mut Leaves,
) -> Result<(), String> {
    for (k, v) in m {
        let p = path.child(PathElement::Field(k.clone()));
        walk_value(v, ty.field(k), p, strict, out)?;
    }
    Ok(())
}

fn walk_value(
    v: &Value,
    f: Field,
    path: Path,
    strict: bool,
    out: &mut Leaves,
) -> Result<(), String> {
    match v {
        Value::Object(m) if !f.atomic && !m.is_empty() => walk_map(m, f.ty, &path, strict, out),
        Value::Array(items) if !items.is_empty() && f.list != ListType::Atomic => {
            match item_elements(items, f.list, &path) {
                Ok(pes) => {
                    for (pe, item) in pes.into_iter().zip(items) {
                        let p = path.child(pe);
                        if let (ListType::Map(_), Value::Object(m)) = (f.list, item) {
                            walk_map(m, f.ty, &p, strict, out)?;
                        }
                        out.insert(p, None);
                    }
                    Ok(())
                }
                Err(e) if strict => Err(e),
                Err(_) => {
                    out.insert(path, Some(v.clone()));
                    Ok(())
                }
            }
        }
        _ => {
            out.insert(path, Some(v.clone()));
            Ok(())
        }
    }
}

/// The path element of each item of a set or associative list, refusing what upstream
/// refuses: items without key fields, duplicates, objects in a set.
pub fn item_elements(
    items: &[Value],
    list: ListType,
    path: &Path,
) -> Result<Vec<PathElement>, String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let pe = match list {
            ListType::Atomic => PathElement::Index(i),
            ListType::Set => {
                if item.is_object() || item.is_array() {
                    return Err(format!(
                        "{path}: element {i}: expected a scalar in a set, got {item}"
                    ));
                }
                PathElement::Value(item.to_string())
            }
            ListType::Map(keys) => {
                key_of(item, keys).map_err(|missing| format!("{path}: element {i}: {missing}"))?
            }
        };
        if !seen.insert(pe.clone()) {
            return Err(format!("{path}: duplicate entries for key {pe}"));
        }
        out.push(pe);
    }
    Ok(out)
}

fn key_of(item: &Value, keys: &[(&str, Option<&str>)]) -> Result<PathElement, String> {
    let Value::Object(m) = item else {
        return Err(format!(
            "expected an object in an associative list, got {item}"
        ));
    };
    let mut kv = Vec::with_capacity(keys.len());
    for (k, default) in keys {
        let v = match (m.get(*k), default) {
            (Some(v), _) if !v.is_null() => v.to_string(),
            (_, Some(d)) => (*d).to_string(),
            _ => {
                return Err(format!(
                    "associative list with keys has an element that omits key field {k:?} (and doesn't have default value)"
                ));
            }
        };
        kv.push(((*k).to_string(), v));
    }
    kv.sort();
    Ok(PathElement::Key(kv))
}

/// Drops `null` fields from a configuration (an applied `null` names no value to own).
pub fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// The live object with the configuration merged in: maps field by field, associative lists
/// item by item (by key), sets by value; atomic values and scalars are replaced.
pub fn merge(live: &Value, config: &Value, field: Field) -> Value {
    merge_value(Some(live), config, field, &Path::default())
}

fn merge_value(live: Option<&Value>, cfg: &Value, f: Field, path: &Path) -> Value {
    match (live, cfg) {
        (Some(Value::Object(l)), Value::Object(c)) if !f.atomic => {
            let mut out = l.clone();
            for (k, v) in c {
                let p = path.child(PathElement::Field(k.clone()));
                out.insert(k.clone(), merge_value(l.get(k), v, f.ty.field(k), &p));
            }
            Value::Object(out)
        }
        (Some(Value::Array(l)), Value::Array(c)) if f.list != ListType::Atomic => {
            let (Ok(lk), Ok(ck)) = (
                item_elements(l, f.list, path),
                item_elements(c, f.list, path),
            ) else {
                return cfg.clone();
            };
            let item_field = Field {
                ty: f.ty,
                list: ListType::Atomic,
                atomic: false,
            };
            let mut out: Vec<Value> = Vec::with_capacity(l.len() + c.len());
            for (pe, item) in lk.iter().zip(l) {
                match ck.iter().position(|k| k == pe) {
                    Some(i) => out.push(merge_value(Some(item), &c[i], item_field, path)),
                    None => out.push(item.clone()),
                }
            }
            for (pe, item) in ck.iter().zip(c) {
                if !lk.contains(pe) {
                    out.push(item.clone());
                }
            }
            Value::Array(out)
        }
        _ => cfg.clone(),
    }
}

/// Removes the value at `path` from `v`; true when something was removed. Key fields of an
/// associative-list item are never removed on their own (the item would lose its identity).
pub fn remove(v: &mut Value, path: &[PathElement], field: Field) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    match (first, v) {
        (PathElement::Field(name), Value::Object(m)) => {
            if rest.is_empty() {
                return m.remove(name).is_some();
            }
            let f = field.ty.field(name);
            match m.get_mut(name) {
                Some(child) => remove(child, rest, f),
                None => false,
            }
        }
        (pe @ (PathElement::Key(_) | PathElement::Value(_)), Value::Array(items)) => {
            let Ok(pes) = item_elements(items, field.list, &Path::default()) else {
                return false;
            };
            let Some(i) = pes.iter().position(|p| p == pe) else {
                return false;
            };
            if rest.is_empty() {
                items.remove(i);
                return true;
            }
            if let (ListType::Map(keys), [PathElement::Field(name)]) = (field.list, rest)
                && keys.iter().any(|(k, _)| k == name)
            {
                return false;
            }
            let item_field = Field {
                ty: field.ty,
                list: ListType::Atomic,
                atomic: false,
            };
            remove(&mut items[i], rest, item_field)
        }
        _ => false,
    }
}

/// The value at `path`, if any.
pub fn get<'a>(v: &'a Value, path: &[PathElement], field: Field) -> Option<&'a Value> {
    let Some((first, rest)) = path.split_first() else {
        return Some(v);
    };
    match (first, v) {
        (PathElement::Field(name), Value::Object(m)) => {
            get(m.get(name)?, rest, field.ty.field(name))
        }
        (pe @ (PathElement::Key(_) | PathElement::Value(_)), Value::Array(items)) => {
            let pes = item_elements(items, field.list, &Path::default()).ok()?;
            let i = pes.iter().position(|p| p == pe)?;
            let item_field = Field {
                ty: field.ty,
                list: ListType::Atomic,
                atomic: false,
            };
            get(&items[i], rest, item_field)
        }
        _ => None,
    }
}
