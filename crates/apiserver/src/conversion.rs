//! Resources served in one version and stored in another. `events.k8s.io/v1` Events are
//! core `v1` Events in the store, as upstream keeps both in one registry (storage version
//! core `v1`): an Event written through either API is read through both, with the same name,
//! uid and resourceVersion. Handlers work on the served form; the store sees the stored form
//! (the conversion happens in `SharedState::write` and where objects are rendered).

use serde_json::{Map, Value, json};

use crate::registry::ResourceInfo;

/// `events.k8s.io/v1` field ↔ core `v1` field (upstream's `Convert_v1_Event_To_core_Event`
/// and back); every other field has the same name in both.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("note", "message"),
    ("regarding", "involvedObject"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// Whether objects of `res` are stored as another resource's.
pub fn converts(res: &ResourceInfo) -> bool {
    res.group == "events.k8s.io" && res.plural == "events"
}

/// Where objects of `res` live in the store: `(group, plural)`.
pub fn stored_as(res: &ResourceInfo) -> (&'static str, &'static str) {
    if converts(res) {
        ("", "events")
    } else {
        (res.group, res.plural)
    }
}

fn rename(
    obj: Value,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
    api_version: &str,
) -> Value {
    let Value::Object(mut m) = obj else {
        return obj;
    };
    let mut out = Map::new();
    for (from, to) in pairs {
        if let Some(v) = m.remove(from) {
            out.insert(to.to_string(), v);
        }
    }
    m.extend(out);
    m.insert("apiVersion".into(), json!(api_version));
    m.insert("kind".into(), json!("Event"));
    Value::Object(m)
}

/// The stored object as `res` serves it.
pub fn to_served(res: &ResourceInfo, stored: Value) -> Value {
    if !converts(res) {
        return stored;
    }
    rename(
        stored,
        EVENT_FIELDS.iter().map(|(new, core)| (*core, *new)),
        "events.k8s.io/v1",
    )
}

/// A served object of `res` as the store keeps it.
pub fn to_stored(res: &ResourceInfo, served: Value) -> Value {
    if !converts(res) {
        return served;
    }
    rename(served, EVENT_FIELDS.iter().copied(), "v1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::lookup;

    #[test]
    fn events_round_trip_between_the_two_apis() {
        let new = lookup("events.k8s.io", "v1", "events").unwrap();
        let core = lookup("", "v1", "events").unwrap();
        let served = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "svcnet/proxy", "reportingInstance": "node-1",
            "action": "Sync", "reason": "Failed", "type": "Warning", "note": "it broke",
            "regarding": {"kind": "Service", "name": "web", "namespace": "default"},
            "deprecatedCount": 2, "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z"}
        });
        let stored = to_stored(new, served.clone());
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["message"], "it broke");
        assert_eq!(stored["involvedObject"]["name"], "web");
        assert_eq!(stored["reportingComponent"], "svcnet/proxy");
        assert_eq!(stored["count"], 2);
        assert!(stored.get("note").is_none() && stored.get("regarding").is_none());
        assert_eq!(to_served(new, stored.clone()), served);
        // Core Events are stored as they are.
        assert_eq!(to_served(core, stored.clone()), stored);
        assert_eq!(stored_as(new), ("", "events"));
        assert_eq!(stored_as(core), ("", "events"));
    }
}
