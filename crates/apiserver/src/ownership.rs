//! The API server's seam to field ownership (`svcnet_apimachinery::managed`): who a write is
//! by, the `managedFields` it records, and apply conflicts as upstream's Status.
//!
//! **Architecture Invariant:** every create, update and patch stores the `managedFields` the
//! pure module computed; a client's `managedFields` are only taken when they decode (else the
//! stored ones stay, as upstream does, so a client that does not know them cannot wipe them).

use axum::http::{HeaderMap, header};
use serde_json::Value;
use svcnet_apimachinery::managed::{self, ApplyError, Entry, ManagerId, Operation, Part, Write};

use crate::objects::now;
use crate::registry::ResourceInfo;
use crate::request::{ResourceRequest, Subresource};
use crate::status::{ApiError, Cause};

/// The manager and part of the object a request writes.
#[derive(Debug, Clone)]
pub struct Writer {
    kind: &'static str,
    id: ManagerId,
    part: Part,
}

impl Writer {
    /// A write by `req`: its `fieldManager`, or (for Updates) upstream's default from the
    /// User-Agent.
    pub fn new(req: &ResourceRequest, headers: &HeaderMap, operation: Operation) -> Writer {
        let res = req.resource;
        let manager = match req.query.field_manager.as_deref() {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => managed::manager_from_user_agent(
                headers
                    .get(header::USER_AGENT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or(""),
            ),
        };
        let part = match req.subresource {
            Some(Subresource::Status) => Part::Status,
            Some(Subresource::Scale) => Part::Scale,
            _ => Part::Main {
                status_apart: res.has_status(),
            },
        };
        Writer::of(res, manager, operation, part)
    }

    /// An Update of the main resource by the server itself (its bootstrap objects).
    pub fn internal(res: &ResourceInfo, manager: &str) -> Writer {
        let part = Part::Main {
            status_apart: res.has_status(),
        };
        Writer::of(res, manager.to_string(), Operation::Update, part)
    }

    fn of(res: &ResourceInfo, manager: String, operation: Operation, part: Part) -> Writer {
        Writer {
            kind: res.kind,
            id: ManagerId {
                manager,
                operation,
                api_version: res.api_version(),
                subresource: part.subresource().to_string(),
            },
            part,
        }
    }

    fn write<'a>(&'a self, now: &'a str) -> Write<'a> {
        Write {
            kind: self.kind,
            part: self.part,
            manager: &self.id,
            now,
        }
    }

    /// Records an Update that turned `live` (`None` on create) into `next`, whose own
    /// `managedFields` are replaced. `sent` are the entries the client sent, if they decoded
    /// and are not empty (see [`sent_entries`]); otherwise the live object's count.
    pub fn record_update(&self, live: Option<&Value>, next: &mut Value, sent: Option<Vec<Entry>>) {
        let base = match sent {
            Some(s) if self.part.subresource().is_empty() => s,
            _ => stored_entries(live),
        };
        let live = live.map_or(Value::Null, without_managed_fields);
        let new = without_managed_fields(next);
        let now = now();
        let entries = managed::update(&self.write(&now), &live, &new, base);
        set_managed_fields(next, &entries);
    }

    /// Applies `config` to `live` (`None` when the object does not exist): the merged object
    /// with its new `managedFields`, or 409 with upstream's conflict message, or 400 for a
    /// configuration the schema refuses.
    pub fn apply(
        &self,
        res: &ResourceInfo,
        live: Option<&Value>,
        config: &Value,
        force: bool,
    ) -> Result<Value, ApiError> {
        let entries = stored_entries(live);
        let live_obj = live.map_or(Value::Null, without_managed_fields);
        let now = now();
        match managed::apply(&self.write(&now), &live_obj, config, entries, force) {
            Ok((mut merged, entries)) => {
                set_managed_fields(&mut merged, &entries);
                Ok(merged)
            }
            Err(ApplyError::Invalid(m)) => {
                let meta = |f: &str| {
                    config
                        .pointer(&format!("/metadata/{f}"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                Err(ApiError::BadRequest(format!(
                    "failed to create typed patch object ({}/{}; {}, Kind={}): {m}",
                    meta("namespace"),
                    meta("name"),
                    res.api_version(),
                    res.kind
                )))
            }
            Err(ApplyError::Conflicts(c)) => Err(ApiError::ApplyConflict {
                message: managed::conflict_message(&c),
                causes: c
                    .iter()
                    .map(|c| Cause {
                        reason: "FieldManagerConflict".into(),
                        field: c.path.to_string(),
                        message: c.cause_message(),
                    })
                    .collect(),
            }),
        }
    }
}

/// The entries stored on an object; an undecodable value counts as none (a managedFields value
/// never makes an object unwritable).
fn stored_entries(obj: Option<&Value>) -> Vec<Entry> {
    managed::decode(obj.and_then(|o| o.pointer("/metadata/managedFields"))).unwrap_or_default()
}

/// The `managedFields` a client sent with a create, update or non-apply patch, as upstream
/// treats them: `[{}]` resets them (`Some(empty)`); entries that decode replace the stored
/// ones; absent, empty or undecodable ones leave the stored entries (`None`), so a client
/// that does not know them cannot wipe them. Entries that decode but name a manager over
/// 128 bytes are 422, as upstream's validation.
pub fn sent_entries(res: &ResourceInfo, obj: &Value) -> Result<Option<Vec<Entry>>, ApiError> {
    let Some(sent) = obj.pointer("/metadata/managedFields") else {
        return Ok(None);
    };
    if managed::is_reset(sent) {
        return Ok(Some(Vec::new()));
    }
    let Ok(entries) = managed::decode(Some(sent)) else {
        return Ok(None);
    };
    if entries.is_empty() {
        return Ok(None);
    }
    let errors = managed::validate(sent);
    if !errors.is_empty() {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let causes = errors
            .into_iter()
            .map(|(field, _, message)| Cause {
                reason: "FieldValueTooLong".into(),
                field,
                message,
            })
            .collect();
        return Err(ApiError::invalid(res, name, causes));
    }
    Ok(Some(entries))
}

/// Upstream refuses an apply configuration that carries managedFields.
pub fn check_apply_configuration(config: &Value) -> Result<(), ApiError> {
    match config.pointer("/metadata/managedFields") {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(ApiError::BadRequest(
            "metadata.managedFields must be nil".into(),
        )),
    }
}

/// Copies the `managedFields` computed on `from` (an applied object) onto `to` (the same
/// object after the server filled in and admitted it).
pub fn carry(from: &Value, to: &mut Value) {
    let Some(meta) = to.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match from.pointer("/metadata/managedFields") {
        Some(v) => meta.insert("managedFields".into(), v.clone()),
        None => meta.remove("managedFields"),
    };
}

/// `view` (a Scale of `obj`) carrying `obj`'s entries, so an apply to the scale subresource
/// sees who owns `.spec.replicas`.
pub fn with_entries_of(obj: &Value, mut view: Value) -> Value {
    carry(obj, &mut view);
    view
}

fn without_managed_fields(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    o
}

fn set_managed_fields(obj: &mut Value, entries: &[Entry]) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match managed::encode(entries) {
        Some(v) => meta.insert("managedFields".into(), v),
        None => meta.remove("managedFields"),
    };
}
