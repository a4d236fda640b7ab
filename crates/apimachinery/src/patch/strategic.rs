//! Strategic merge patch, as `k8s.io/apimachinery/pkg/util/strategicpatch` applies it on the
//! server (`StrategicMergeMapPatch` with `MergeParallelList` and `IgnoreUnmatchedNulls`).
//!
//! Directives: `null` deletes a field; `$patch: replace | delete | merge` on a map or as a
//! list item; `$retainKeys`; `$deleteFromPrimitiveList/<field>`; `$setElementOrder/<field>`.
//! Values put where the live object had nothing are cleaned the same way (directives
//! resolved, `null`s dropped) so that no directive is ever stored.

use serde_json::{Map, Value};

use super::schema::{ListStrategy, Ty};
use super::{PatchError, type_name};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Applies a strategic merge patch (a JSON object) to `original`, an object of `kind`.
pub fn strategic_merge(kind: &str, original: &Value, patch: &Value) -> Result<Value, PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::Malformed(format!(
            "a strategic merge patch must be a JSON object, not {}",
            type_name(patch)
        )));
    };
    let original = match original {
        Value::Object(m) => m.clone(),
        Value::Null => Map::new(),
        other => {
            return Err(PatchError::Unprocessable(format!(
                "cannot patch {}: the object is not a JSON object",
                type_name(other)
            )));
        }
    };
    merge_map(original, patch.clone(), Ty::for_kind(kind), "").map(Value::Object)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn malformed(path: &str, msg: impl std::fmt::Display) -> PatchError {
    if path.is_empty() {
        PatchError::Malformed(format!("invalid strategic merge patch: {msg}"))
    } else {
        PatchError::Malformed(format!("invalid strategic merge patch at {path}: {msg}"))
    }
}

/// Merges a patch map into a live map of type `ty`.
fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    ty: Ty,
    path: &str,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.remove(DIRECTIVE) {
        match directive.as_str() {
            Some("replace") => return merge_map(Map::new(), patch, ty, path),
            Some("delete") => return Ok(Map::new()),
            Some("merge") => {}
            _ => {
                return Err(malformed(
                    path,
                    format!("unknown patch type {directive} in map"),
                ));
            }
        }
    }

    if let Some(retain) = patch.remove(RETAIN_KEYS) {
        let keys = retain
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
            .ok_or_else(|| malformed(path, "$retainKeys must be a list of strings"))?;
        for (k, v) in &patch {
            if v.is_null()
                || k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
                || k.starts_with(SET_ELEMENT_ORDER)
            {
                continue;
            }
            if !keys.contains(&k.as_str()) {
                return Err(malformed(
                    path,
                    format!("field {k:?} is in the patch but not in $retainKeys"),
                ));
            }
        }
        original.retain(|k, _| keys.contains(&k.as_str()));
    }

    apply_set_element_order(&mut original, &mut patch, ty, path)?;

    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            let Value::Array(remove) = value else {
                return Err(malformed(
                    path,
                    format!("{key} must be a list, not {}", type_name(&value)),
                ));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|item| !remove.iter().any(|r| json_eq(r, item)));
            }
            continue;
        }
        if key.starts_with(SET_ELEMENT_ORDER) {
            continue;
        }
        let field_path = join(path, &key);
        if value.is_null() {
            original.remove(&key);
            continue;
        }
        let (field_ty, strategy) = ty.field(&key);
        let merged = match (original.remove(&key), value) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                Value::Object(merge_map(o, p, field_ty, &field_path)?)
            }
            (Some(Value::Array(o)), Value::Array(p)) => {
                Value::Array(merge_list(o, p, field_ty, strategy, &field_path)?)
            }
            (_, p) => fresh(p, field_ty, strategy, &field_path)?,
        };
        original.insert(key, merged);
    }
    Ok(original)
}

/// A patch value for a place where the live object has nothing (or a value of another
/// type): directives are resolved against emptiness and `null`s dropped.
fn fresh(value: Value, ty: Ty, strategy: ListStrategy, path: &str) -> Result<Value, PatchError> {
    Ok(match value {
        Value::Object(p) => Value::Object(merge_map(Map::new(), p, ty, path)?),
        Value::Array(p) => Value::Array(merge_list(Vec::new(), p, ty, strategy, path)?),
        scalar => scalar,
    })
}

/// Merges a patch list into a live list, by the field's strategy.
fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    elem_ty: Ty,
    strategy: ListStrategy,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    let key = match strategy {
        ListStrategy::Replace => {
            return patch
                .into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Object(m) => merge_map(Map::new(), m, elem_ty, &format!("{path}[{i}]"))
                        .map(Value::Object),
                    other => Ok(other),
                })
                .collect();
        }
        ListStrategy::MergePrimitive => None,
        ListStrategy::MergeByKey(k) => Some(k),
    };
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let maps = patch
        .first()
        .or(original.first())
        .is_some_and(Value::is_object);
    if let Some(bad) = original
        .iter()
        .chain(&patch)
        .find(|v| v.is_object() != maps || v.is_array())
    {
        return Err(PatchError::Unprocessable(format!(
            "cannot merge {path}: its items must all be objects or all be scalars, found {}",
            type_name(bad)
        )));
    }
    if !maps {
        let mut merged = original.clone();
        for item in &patch {
            if !merged.iter().any(|m| json_eq(m, item)) {
                merged.push(item.clone());
            }
        }
        let (in_patch, server_only) = partition(merged, &patch, None);
        return Ok(normalize_order(
            in_patch,
            server_only,
            &patch,
            &original,
            None,
        ));
    }
    let Some(key) = key else {
        return Err(PatchError::Unprocessable(format!(
            "cannot merge lists without merge key for {path}"
        )));
    };

    // Special items: `{$patch: delete, key: v}` removes the live item; `{$patch: replace}`
    // makes the rest of the patch list replace the live list.
    let mut working = original.clone();
    let mut items = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let Value::Object(m) = &item else {
            continue;
        };
        match m.get(DIRECTIVE) {
            None => items.push(item),
            Some(d) => match d.as_str() {
                Some("delete") => {
                    let Some(kv) = m.get(key) else {
                        return Err(PatchError::Unprocessable(format!(
                            "{path}: {} does not contain declared merge key: {key}",
                            Value::Object(m.clone())
                        )));
                    };
                    working.retain(|o| !o.get(key).is_some_and(|ov| json_eq(ov, kv)));
                }
                Some("replace") => replace = true,
                Some("merge") => {
                    return Err(malformed(
                        path,
                        "merging lists cannot yet be specified in the patch",
                    ));
                }
                _ => {
                    return Err(malformed(path, format!("unknown patch type {d} in list")));
                }
            },
        }
    }
    if replace {
        working = Vec::new();
    }
    let original_order = if replace { Vec::new() } else { original };

    for item in &items {
        let Value::Object(p) = item else {
            continue;
        };
        let Some(kv) = p.get(key) else {
            return Err(PatchError::Unprocessable(format!(
                "{path}: {item} does not contain declared merge key: {key}"
            )));
        };
        let item_path = format!("{path}[{key}={kv}]");
        match working
            .iter_mut()
            .find(|o| o.get(key).is_some_and(|ov| json_eq(ov, kv)))
        {
            Some(Value::Object(o)) => {
                let merged = merge_map(std::mem::take(o), p.clone(), elem_ty, &item_path)?;
                *o = merged;
            }
            _ => working.push(Value::Object(merge_map(
                Map::new(),
                p.clone(),
                elem_ty,
                &item_path,
            )?)),
        }
    }
    let (in_patch, server_only) = partition(working, &items, Some(key));
    Ok(normalize_order(
        in_patch,
        server_only,
        &items,
        &original_order,
        Some(key),
    ))
}

/// Handles every `$setElementOrder/<field>` of a patch map: merges that field's list now
/// (removing it from the patch) and orders the result as the directive says, with live-only
/// items kept in their live positions relative to the others.
fn apply_set_element_order(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    ty: Ty,
    path: &str,
) -> Result<(), PatchError> {
    let directives: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER))
        .cloned()
        .collect();
    for directive in directives {
        let field = &directive[SET_ELEMENT_ORDER.len()..];
        let Some(Value::Array(order)) = patch.get(&directive).cloned() else {
            return Err(malformed(path, format!("{directive} must be a list")));
        };
        let (elem_ty, strategy) = ty.field(field);
        let key = match strategy {
            ListStrategy::MergeByKey(k) => Some(k),
            _ => None,
        };
        let field_path = join(path, field);
        let live = match original.get(field) {
            Some(Value::Array(l)) => Some(l.clone()),
            _ => None,
        };
        let patch_list = match patch.get(field) {
            Some(Value::Array(l)) => Some(l.clone()),
            _ => None,
        };
        if let Some(p) = &patch_list {
            check_order(p, &order, key, &field_path)?;
        }
        let merged = match (live.clone(), patch_list) {
            (Some(l), None) => l,
            (None, Some(p)) => merge_list(Vec::new(), p, elem_ty, strategy, &field_path)?,
            (Some(l), Some(p)) => merge_list(l, p, elem_ty, strategy, &field_path)?,
            (None, None) => continue,
        };
        patch.remove(field);
        let (in_order, server_only) = partition(merged, &order, key);
        let live = live.unwrap_or_default();
        original.insert(
            field.to_string(),
            Value::Array(normalize_order(in_order, server_only, &order, &live, key)),
        );
    }
    Ok(())
}

/// Every non-delete item of the patch list must appear in `$setElementOrder`, in the same
/// relative order (upstream's `validatePatchWithSetOrderList`).
fn check_order(
    patch: &[Value],
    order: &[Value],
    key: Option<&str>,
    path: &str,
) -> Result<(), PatchError> {
    let mut at = 0;
    for item in patch {
        if item.get(DIRECTIVE).is_some() {
            continue;
        }
        match order[at..].iter().position(|o| same_item(o, item, key)) {
            Some(i) => at += i,
            None => {
                return Err(malformed(
                    path,
                    format!(
                        "the order of {item} in the patch list doesn't match the $setElementOrder list"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn same_item(a: &Value, b: &Value, key: Option<&str>) -> bool {
    match key {
        Some(k) => match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) => json_eq(x, y),
            _ => false,
        },
        None => json_eq(a, b),
    }
}

fn index_of(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    list.iter().position(|l| same_item(l, item, key))
}

/// Splits merged items into those named in `list` and those only the server has.
fn partition(merged: Vec<Value>, list: &[Value], key: Option<&str>) -> (Vec<Value>, Vec<Value>) {
    merged
        .into_iter()
        .partition(|m| index_of(list, m, key).is_some())
}

/// Upstream's `normalizeElementOrder`: patch items in patch order, server-only items in
/// live order, then the two merged so each server-only item keeps its live position
/// relative to the patch items the live list also has.
fn normalize_order(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    patch_items.sort_by_key(|v| index_of(patch_order, v, key).unwrap_or(usize::MAX));
    server_only.sort_by_key(|v| index_of(server_order, v, key).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (index_of(server_order, l, key), index_of(server_order, r, key)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

/// JSON equality where `80` and `80.0` are the same number (Go decodes both to float64).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || (x.as_f64().is_some() && x.as_f64() == y.as_f64())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}
