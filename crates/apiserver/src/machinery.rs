//! The API server's single seam to the pure API machinery (selectors, patches, Table output,
//! strict field checks). Fallback implementations until `svcnet-apimachinery` lands.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::registry::ResourceInfo;
use crate::status::ApiError;

/// Which object a Table row carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// Label and field selectors of a request, parsed once.
#[derive(Debug, Default)]
pub struct Selectors {
    labels: Vec<(String, Op, String)>,
    fields: Vec<(String, Op, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Exists,
    NotExists,
}

fn parse_terms(s: &str, what: &str) -> Result<Vec<(String, Op, String)>, ApiError> {
    let mut out = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let parsed = if let Some((k, v)) = term.split_once("!=") {
            (k.trim().to_string(), Op::Ne, v.trim().to_string())
        } else if let Some((k, v)) = term.split_once("==") {
            (k.trim().to_string(), Op::Eq, v.trim().to_string())
        } else if let Some((k, v)) = term.split_once('=') {
            (k.trim().to_string(), Op::Eq, v.trim().to_string())
        } else if let Some(k) = term.strip_prefix('!') {
            (k.trim().to_string(), Op::NotExists, String::new())
        } else {
            (term.to_string(), Op::Exists, String::new())
        };
        if parsed.0.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "unable to parse requirement: invalid {what} selector {s:?}"
            )));
        }
        out.push(parsed);
    }
    Ok(out)
}

/// Field names a field selector may use on this kind.
fn supported_field(kind: &str, field: &str) -> bool {
    matches!(field, "metadata.name" | "metadata.namespace")
        || match kind {
            "Pod" => matches!(
                field,
                "spec.nodeName"
                    | "spec.restartPolicy"
                    | "spec.schedulerName"
                    | "spec.serviceAccountName"
                    | "spec.hostNetwork"
                    | "status.phase"
                    | "status.podIP"
                    | "status.nominatedNodeName"
            ),
            "Event" => {
                field.starts_with("involvedObject.")
                    || matches!(field, "reason" | "source" | "type" | "reportingComponent")
            }
            "Node" => field == "spec.unschedulable",
            "Namespace" => field == "status.phase",
            "Service" => matches!(field, "spec.clusterIP" | "spec.type"),
            _ => false,
        }
}

/// The string value of a dotted field path (missing fields read as empty, as upstream).
pub fn field_value(obj: &Value, path: &str) -> Option<String> {
    let mut cur = obj;
    for part in path.split('.') {
        cur = cur.get(part)?;
    }
    Some(match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    })
}

impl Selectors {
    pub fn parse(
        res: &ResourceInfo,
        label: Option<&str>,
        field: Option<&str>,
    ) -> Result<Self, ApiError> {
        let labels = match label {
            Some(s) => parse_terms(s, "label")?,
            None => Vec::new(),
        };
        let fields = match field {
            Some(s) => parse_terms(s, "field")?,
            None => Vec::new(),
        };
        for (f, op, _) in &fields {
            if !matches!(op, Op::Eq | Op::Ne) {
                return Err(ApiError::BadRequest(format!(
                    "invalid field selector: {f:?} needs an operator"
                )));
            }
            if !supported_field(res.kind, f) {
                return Err(ApiError::BadRequest(format!(
                    "field label not supported: {f}"
                )));
            }
        }
        Ok(Selectors { labels, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels: BTreeMap<String, String> = obj
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let label_ok = self.labels.iter().all(|(k, op, v)| match op {
            Op::Eq => labels.get(k) == Some(v),
            Op::Ne => labels.get(k) != Some(v),
            Op::Exists => labels.contains_key(k),
            Op::NotExists => !labels.contains_key(k),
        });
        label_ok
            && self.fields.iter().all(|(f, op, v)| {
                let actual = field_value(obj, f).unwrap_or_default();
                match op {
                    Op::Eq => &actual == v,
                    _ => &actual != v,
                }
            })
    }
}

/// Applies a PATCH body of the given content type to `original`.
pub fn apply_patch(
    res: &ResourceInfo,
    original: &Value,
    content_type: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let bad = |e: &dyn std::fmt::Display| ApiError::BadRequest(format!("invalid patch: {e}"));
    let ct = content_type.split(';').next().unwrap_or("").trim();
    let _ = res;
    match ct {
        "application/json-patch+json" => {
            let patch: json_patch::Patch = serde_json::from_slice(body).map_err(|e| bad(&e))?;
            let mut out = original.clone();
            json_patch::patch(&mut out, &patch).map_err(|e| ApiError::Invalid {
                kind: res.kind.into(),
                group: res.group.into(),
                name: String::new(),
                message: format!(
                    "the server rejected our request due to an error in our request: {e}"
                ),
                causes: Vec::new(),
            })?;
            Ok(out)
        }
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let patch: Value = serde_json::from_slice(body).map_err(|e| bad(&e))?;
            let mut out = original.clone();
            json_patch::merge(&mut out, &strip_directives(patch));
            Ok(out)
        }
        other => Err(ApiError::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
        ))),
    }
}

fn strip_directives(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k, strip_directives(v)))
                .collect(),
        ),
        other => other,
    }
}

/// A `meta.k8s.io/v1` Table of the items, or `None` when the kind has no table printer.
pub fn to_table(_res: &ResourceInfo, _items: &[Value], _include: IncludeObject) -> Option<Value> {
    None
}

/// Dotted paths of fields the kind does not define.
pub fn unknown_fields(_res: &ResourceInfo, _obj: &Value) -> Vec<String> {
    Vec::new()
}
