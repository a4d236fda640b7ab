//! The four PATCH bodies an API server accepts, applied to an object held as JSON:
//! RFC 6902 JSON Patch, RFC 7386 JSON merge patch, Kubernetes strategic merge patch (what
//! client-side `kubectl apply` sends) and server-side apply's configuration.
//!
//! [`apply`] with [`PatchType::Apply`] only merges the configuration (strategic-merge keys,
//! no ownership). The API server applies through [`crate::managed`] instead, which owns
//! fields, detects conflicts and removes fields a manager no longer applies.

mod schema;
mod strategic;

#[cfg(test)]
mod kubectl_tests;
#[cfg(test)]
mod tests;

use serde_json::Value;

pub use strategic::strategic_merge;

/// The patch formats, named by their `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatchType {
    /// `application/json-patch+json` (RFC 6902)
    Json,
    /// `application/merge-patch+json` (RFC 7386)
    Merge,
    /// `application/strategic-merge-patch+json`
    StrategicMerge,
    /// `application/apply-patch+yaml` (server-side apply; with ownership in [`crate::managed`])
    Apply,
}

impl PatchType {
    /// Recognises a request's `Content-Type`, ignoring parameters such as `; charset=utf-8`
    /// and letter case. `None` means 415 Unsupported Media Type.
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        let essence = content_type.split(';').next()?.trim().to_ascii_lowercase();
        match essence.as_str() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::StrategicMerge),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }

    /// The media type, as listed in `Accept-Patch` and in error messages.
    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::Json => "application/json-patch+json",
            PatchType::Merge => "application/merge-patch+json",
            PatchType::StrategicMerge => "application/strategic-merge-patch+json",
            PatchType::Apply => "application/apply-patch+yaml",
        }
    }

    /// Every supported type, for the `Accept-Patch` header of a 415 answer.
    pub const ALL: [PatchType; 4] = [
        PatchType::Json,
        PatchType::Merge,
        PatchType::StrategicMerge,
        PatchType::Apply,
    ];
}

/// Why a patch was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The body is not a patch of its declared type (bad JSON/YAML, wrong shape, a malformed
    /// directive). HTTP 400 BadRequest.
    #[error("{0}")]
    Malformed(String),
    /// A well-formed patch that cannot apply to this object (a JSON Patch path that does not
    /// exist, a list item without its merge key). HTTP 422 Invalid.
    #[error("{0}")]
    Unprocessable(String),
    /// A JSON Patch `test` operation failed. Upstream answers 422 (the JSON patch library's
    /// error goes through `NewGenericServerResponse(422)`); kept apart so callers can tell.
    #[error(
        "the server rejected our request due to an error in our request: test failed at {path}"
    )]
    TestFailed { path: String },
}

impl PatchError {
    /// The HTTP status a real API server answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            PatchError::Malformed(_) => 400,
            PatchError::Unprocessable(_) | PatchError::TestFailed { .. } => 422,
        }
    }

    /// The `Status.reason` that goes with [`Self::http_status`].
    pub fn reason(&self) -> &'static str {
        match self {
            PatchError::Malformed(_) => "BadRequest",
            PatchError::Unprocessable(_) | PatchError::TestFailed { .. } => "Invalid",
        }
    }

    /// True when the client sent a body that can never work (400), false when it fits the
    /// format but not this object (422).
    pub fn is_malformed(&self) -> bool {
        matches!(self, PatchError::Malformed(_))
    }
}

/// Applies a patch body of `patch_type` to `original` (an object of `kind`, e.g. `Service`)
/// and returns the patched object. `kind` selects the strategic-merge list strategies;
/// unknown kinds merge maps and replace lists.
pub fn apply(
    kind: &str,
    original: &Value,
    patch_type: PatchType,
    body: &[u8],
) -> Result<Value, PatchError> {
    match patch_type {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| PatchError::Malformed(format!("invalid JSON Patch: {e}")))?;
            let mut doc = original.clone();
            json_patch::patch(&mut doc, &ops).map_err(|e| match e.kind {
                json_patch::PatchErrorKind::TestFailed => PatchError::TestFailed {
                    path: e.path.to_string(),
                },
                _ => PatchError::Unprocessable(format!("the JSON patch could not be applied: {e}")),
            })?;
            Ok(doc)
        }
        PatchType::Merge => {
            let patch = object_body(body, "merge patch")?;
            let mut doc = original.clone();
            json_patch::merge(&mut doc, &patch);
            Ok(doc)
        }
        PatchType::StrategicMerge => {
            let patch = object_body(body, "strategic merge patch")?;
            strategic_merge(kind, original, &patch)
        }
        PatchType::Apply => {
            let applied = decode_apply_body(body)?;
            strategic_merge(kind, original, &applied)
        }
    }
}

/// Decodes a server-side apply body: YAML (JSON is valid YAML) holding one object.
pub fn decode_apply_body(body: &[u8]) -> Result<Value, PatchError> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return require_object(v, "apply configuration");
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| PatchError::Malformed(format!("apply configuration is not UTF-8: {e}")))?;
    let v: Value = serde_saphyr::from_str(text).map_err(|e| {
        PatchError::Malformed(format!("error decoding YAML apply configuration: {e}"))
    })?;
    require_object(v, "apply configuration")
}

fn object_body(body: &[u8], what: &str) -> Result<Value, PatchError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| PatchError::Malformed(format!("invalid JSON {what}: {e}")))?;
    require_object(v, what)
}

fn require_object(v: Value, what: &str) -> Result<Value, PatchError> {
    if v.is_object() {
        Ok(v)
    } else {
        Err(PatchError::Malformed(format!(
            "the {what} must be a JSON object, not {}",
            type_name(&v)
        )))
    }
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
