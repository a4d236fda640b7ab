//! `meta.k8s.io/v1` `Table` output (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`),
//! with the columns and cell formats of upstream's printers
//! (`pkg/printers/internalversion/printers.go`), so `kubectl get` and `kubectl get -o wide`
//! print what they print against a real cluster.
//!
//! As a real API server does, every column is always filled (the server prints "wide");
//! kubectl hides columns whose `priority` is above 0 unless asked for `-o wide`.
//! [`to_table`] reads the clock for the AGE column; [`to_table_at`] takes `now` instead.

mod columns;
mod duration;
mod printers;

#[cfg(test)]
mod tests;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

pub use columns::{Column, columns};
pub use duration::human_duration;

/// What each row's `object` holds (`?includeObject=`); kubectl's default is `Metadata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` with the object's `metadata`.
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query parameter (`None`, `Metadata`, `Object`).
    pub fn parse(s: &str) -> Option<IncludeObject> {
        match s {
            "None" => Some(IncludeObject::None),
            "Metadata" => Some(IncludeObject::Metadata),
            "Object" => Some(IncludeObject::Object),
            _ => None,
        }
    }
}

/// Renders objects of `kind` as a `Table`, computing AGE against the current time.
pub fn to_table(kind: &str, items: &[Value], include_object: IncludeObject) -> Value {
    to_table_at(kind, items, include_object, Timestamp::now())
}

/// Renders objects of `kind` as a `Table`, computing AGE against `now`.
/// The caller adds `metadata.resourceVersion` (and `continue`) as for a list.
pub fn to_table_at(
    kind: &str,
    items: &[Value],
    include_object: IncludeObject,
    now: Timestamp,
) -> Value {
    let column_definitions: Vec<Value> = columns(kind)
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.ty,
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|item| {
            let mut row = Map::new();
            row.insert(
                "cells".into(),
                Value::Array(printers::cells(kind, item, now)),
            );
            if let Some(conditions) = printers::row_conditions(kind, item) {
                row.insert("conditions".into(), conditions);
            }
            match include_object {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row.insert("object".into(), partial_object_metadata(item));
                }
                IncludeObject::Object => {
                    row.insert("object".into(), item.clone());
                }
            }
            Value::Object(row)
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": column_definitions,
        "rows": rows,
    })
}

/// The `PartialObjectMetadata` of an object, as a Table row carries it by default.
pub fn partial_object_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}
