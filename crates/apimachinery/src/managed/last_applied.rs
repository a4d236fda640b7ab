//! The upgrade from client-side to server-side apply, as upstream's `lastAppliedManager` and
//! `lastAppliedUpdater` do it for the `kubectl` manager only: fields whose values are still
//! those of the `kubectl.kubernetes.io/last-applied-configuration` annotation do not stop
//! `kubectl apply --server-side` (it takes them over), and once it applied, the annotation is
//! rewritten to the applied configuration so a later client-side `kubectl apply` agrees.

use serde_json::Value;

use super::walk;
use super::{FieldSet, compare};

/// The annotation client-side `kubectl apply` keeps its configuration in.
pub const ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// The only manager the upgrade applies to (others opt out by choosing another name).
pub const MANAGER: &str = "kubectl";

fn annotation(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/annotations")?
        .get(ANNOTATION)?
        .as_str()
        .filter(|s| !s.is_empty())
}

/// The fields of the last-applied configuration that hold the same values in `live`.
pub fn allowed_conflicts(kind: &str, live: &Value) -> FieldSet {
    let Some(text) = annotation(live) else {
        return FieldSet::new();
    };
    let Ok(last) = serde_json::from_str::<Value>(text) else {
        return FieldSet::new();
    };
    let root = walk::root(kind);
    let (Ok(last), Ok(live)) = (
        walk::leaves(&last, root, false),
        walk::leaves(live, root, false),
    ) else {
        return FieldSet::new();
    };
    let cmp = compare(&last, &live);
    walk::field_set(&last)
        .difference(&cmp.modified)
        .difference(&cmp.added)
        .difference(&cmp.removed)
}

/// Rewrites the annotation of `merged` to `config` (without the annotation itself) when the
/// object had one.
pub fn sync_annotation(merged: &mut Value, config: &Value) {
    if annotation(merged).is_none() {
        return;
    }
    let mut applied = config.clone();
    if let Some(meta) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
        let emptied = match meta.get_mut("annotations").and_then(Value::as_object_mut) {
            Some(a) => {
                a.remove(ANNOTATION);
                a.is_empty()
            }
            None => false,
        };
        if emptied {
            meta.remove("annotations");
        }
    }
    if let Some(a) = merged
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.insert(ANNOTATION.into(), Value::String(applied.to_string()));
    }
}
