//! `metadata.managedFields` on the wire: decoding (upstream's `DecodeManagedFields`), the
//! validation of what a client sends, encoding in upstream's order, and the cap on Update
//! entries.

use serde_json::{Map, Value, json};

use super::{Entry, FieldSet, ManagerId, Operation};

/// The most Update entries an object keeps (upstream's `DefaultMaxUpdateManagers`).
pub const MAX_UPDATE_MANAGERS: usize = 10;
/// The entry the oldest Updates beyond the cap are merged into.
pub const ANCIENT_CHANGES: &str = "ancient-changes";

fn seconds(e: &Entry) -> i64 {
    e.time
        .as_deref()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second())
}

/// Merges the oldest Update entries into one `ancient-changes` entry per apiVersion until at
/// most [`MAX_UPDATE_MANAGERS`] remain (upstream's `capManagersManager`).
pub(super) fn cap_updates(mut entries: Vec<Entry>) -> Vec<Entry> {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].id.operation == Operation::Update)
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return entries;
    }
    updaters.sort_by(|&a, &b| {
        (seconds(&entries[a]), &entries[a].id.manager)
            .cmp(&(seconds(&entries[b]), &entries[b].id.manager))
    });
    let mut remaining = updaters.len();
    let mut merged_into: Vec<(String, usize)> = Vec::new();
    let mut dropped = Vec::new();
    for &i in &updaters {
        if remaining <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = entries[i].id.api_version.clone();
        match merged_into.iter().find(|(v, _)| *v == version) {
            Some(&(_, bucket)) => {
                let fields = entries[i].fields.clone();
                let time = entries[i].time.clone();
                let b = &mut entries[bucket];
                b.id = ManagerId {
                    manager: ANCIENT_CHANGES.into(),
                    operation: Operation::Update,
                    api_version: version,
                    subresource: String::new(),
                };
                b.fields = b.fields.union(&fields);
                b.time = time;
                dropped.push(i);
                remaining -= 1;
            }
            None => merged_into.push((version, i)),
        }
    }
    let mut i = 0;
    entries.retain(|_| {
        i += 1;
        !dropped.contains(&(i - 1))
    });
    entries
}

/// Decodes `metadata.managedFields` as upstream's `DecodeManagedFields`: every entry needs
/// an operation of `Apply` or `Update`, an apiVersion, `fieldsType: FieldsV1` and a field
/// set that parses; anything else is an error (the caller then keeps the stored entries, as
/// upstream does with a client's undecodable ones).
pub fn decode(v: Option<&Value>) -> Result<Vec<Entry>, String> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    if v.is_null() {
        return Ok(Vec::new());
    }
    let Value::Array(items) = v else {
        return Err("managedFields must be a list".into());
    };
    let mut out: Vec<Entry> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(m) = item else {
            return Err(format!("managed fields entry {i} is not an object"));
        };
        let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let operation = match s("operation").as_str() {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return Err("operation must be `Apply` or `Update`".into()),
        };
        if s("apiVersion").is_empty() {
            return Err("apiVersion must not be empty".into());
        }
        match s("fieldsType").as_str() {
            "FieldsV1" => {}
            "" => return Err(format!("missing fieldsType in managed fields entry {i}")),
            other => {
                return Err(format!(
                    "invalid fieldsType {other:?} in managed fields entry {i}"
                ));
            }
        }
        let fields = match m.get("fieldsV1") {
            None | Some(Value::Null) => FieldSet::new(),
            Some(f) => FieldSet::from_fields_v1(f)
                .map_err(|e| format!("error decoding versioned set from {f}: {e}"))?,
        };
        let time = m
            .get("time")
            .and_then(Value::as_str)
            .filter(|t| t.parse::<jiff::Timestamp>().is_ok())
            .map(str::to_string);
        let id = ManagerId {
            manager: s("manager"),
            operation,
            api_version: s("apiVersion"),
            subresource: s("subresource"),
        };
        // Entries of one manager are one entry (upstream's decoded map).
        match out.iter_mut().find(|e| e.id.same(&id)) {
            Some(e) => e.fields = e.fields.union(&fields),
            None => out.push(Entry { id, time, fields }),
        }
    }
    Ok(out)
}

/// Whether a client's managedFields are the documented reset: a non-empty list of empty
/// entries (`[{}]`), which clears them (upstream's `isResetManagedFields`).
pub fn is_reset(v: &Value) -> bool {
    v.as_array().is_some_and(|a| {
        !a.is_empty() && a.iter().all(|e| e.as_object().is_some_and(Map::is_empty))
    })
}

/// Field errors upstream's `ValidateManagedFields` still finds in entries that decoded:
/// `(field, bad value, message)` — a manager over 128 bytes, a subresource over 256.
pub fn validate(v: &Value) -> Vec<(String, String, String)> {
    let mut errs = Vec::new();
    let Value::Array(items) = v else {
        return errs;
    };
    for (i, item) in items.iter().enumerate() {
        for (field, max) in [("manager", 128), ("subresource", 256)] {
            let value = item.get(field).and_then(Value::as_str).unwrap_or("");
            if value.len() > max {
                errs.push((
                    format!("metadata.managedFields[{i}].{field}"),
                    value.to_string(),
                    format!("Too long: may not be more than {max} bytes"),
                ));
            }
        }
    }
    errs
}

/// The `managedFields` JSON of the entries in upstream's order, or `None` when there are
/// none (the field is then omitted).
pub fn encode(entries: &[Entry]) -> Option<Value> {
    let mut sorted: Vec<&Entry> = entries.iter().filter(|e| !e.fields.is_empty()).collect();
    if sorted.is_empty() {
        return None;
    }
    let secs = seconds;
    sorted.sort_by(|p, q| {
        (
            p.id.operation,
            secs(p),
            &p.id.manager,
            &p.id.api_version,
            &p.id.subresource,
        )
            .cmp(&(
                q.id.operation,
                secs(q),
                &q.id.manager,
                &q.id.api_version,
                &q.id.subresource,
            ))
    });
    let items = sorted
        .into_iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("manager".into(), json!(e.id.manager));
            m.insert("operation".into(), json!(e.id.operation.as_str()));
            m.insert("apiVersion".into(), json!(e.id.api_version));
            if let Some(t) = &e.time {
                m.insert("time".into(), json!(t));
            }
            m.insert("fieldsType".into(), json!("FieldsV1"));
            m.insert("fieldsV1".into(), e.fields.to_fields_v1());
            if !e.id.subresource.is_empty() {
                m.insert("subresource".into(), json!(e.id.subresource));
            }
            Value::Object(m)
        })
        .collect();
    Some(Value::Array(items))
}
