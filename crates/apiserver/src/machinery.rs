//! The API server's single seam to `svcnet-apimachinery`: selectors, patches, Table output
//! and strict field checks, with their errors turned into API errors.

use std::collections::BTreeMap;

use serde_json::Value;
use svcnet_apimachinery::patch::{self, PatchError, PatchType};
use svcnet_apimachinery::selector::{FieldSelector, LabelSelector, field_value};
use svcnet_apimachinery::{strict, table};

pub use svcnet_apimachinery::table::IncludeObject;

use crate::registry::ResourceInfo;
use crate::status::ApiError;

/// The kind name the pure crates know this resource by. `events.k8s.io` Events share the kind
/// name `Event` with core Events but not its schema, so they are known by their qualified name.
/// Every served kind has one: each is decoded and validated through its typed schema.
pub fn typed_kind(res: &ResourceInfo) -> Option<&'static str> {
    match res.group {
        ""
        | "apps"
        | "discovery.k8s.io"
        | "coordination.k8s.io"
        | "networking.k8s.io"
        | "rbac.authorization.k8s.io" => Some(res.kind),
        "events.k8s.io" => Some("events.k8s.io/Event"),
        _ => None,
    }
}

/// Label and field selectors of a request, parsed once.
#[derive(Debug)]
pub struct Selectors {
    kind: &'static str,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Selectors {
    pub fn parse(
        res: &ResourceInfo,
        label: Option<&str>,
        field: Option<&str>,
    ) -> Result<Self, ApiError> {
        let labels = match label {
            Some(s) => LabelSelector::parse(s).map_err(|e| ApiError::BadRequest(e.to_string()))?,
            None => LabelSelector::everything(),
        };
        let fields = match field {
            Some(s) => FieldSelector::parse(s).map_err(|e| ApiError::BadRequest(e.to_string()))?,
            None => FieldSelector::everything(),
        };
        if let Some(f) = fields.unsupported_field(res.kind) {
            return Err(ApiError::BadRequest(format!(
                "field label not supported: {f}"
            )));
        }
        Ok(Selectors {
            kind: res.kind,
            labels,
            fields,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if !self.labels.is_empty() {
            let labels: BTreeMap<String, String> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default();
            if !self.labels.matches(&labels) {
                return false;
            }
        }
        self.fields.is_empty() || self.fields.matches(|f| field_value(self.kind, obj, f))
    }
}

/// Applies a PATCH body of the given content type to `original` (an object of `kind`).
pub fn apply_patch(
    res: &ResourceInfo,
    kind: &str,
    original: &Value,
    content_type: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let patch_type = patch_type(content_type)?;
    patch::apply(kind, original, patch_type, body).map_err(|e| match e {
        PatchError::Malformed(m) => ApiError::BadRequest(m),
        other => ApiError::Invalid {
            kind: res.kind.into(),
            group: res.group.into(),
            name: String::new(),
            message: other.to_string(),
            causes: Vec::new(),
        },
    })
}

/// Whether a PATCH's Content-Type is server-side apply (which creates a missing object).
pub fn is_apply(content_type: &str) -> bool {
    PatchType::from_content_type(content_type) == Some(PatchType::Apply)
}

/// The object a server-side apply body describes (YAML or JSON), for creating it.
pub fn apply_configuration(body: &[u8]) -> Result<Value, ApiError> {
    patch::decode_apply_body(body).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// The patch type of a Content-Type, or 415.
pub fn patch_type(content_type: &str) -> Result<PatchType, ApiError> {
    PatchType::from_content_type(content_type).ok_or_else(|| {
        let accepted: Vec<&str> = PatchType::ALL.iter().map(|p| p.content_type()).collect();
        ApiError::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format - accepted media types include: {}",
            accepted.join(", ")
        ))
    })
}

/// A `meta.k8s.io/v1` Table of the items (without `metadata.resourceVersion`).
pub fn to_table(res: &ResourceInfo, items: &[Value], include: IncludeObject) -> Option<Value> {
    Some(table::to_table(res.kind, items, include))
}

/// Dotted paths of fields the kind does not define; 400 when the object does not even decode
/// into its type (a wrong type for a known field).
pub fn unknown_fields(res: &ResourceInfo, obj: &Value) -> Result<Vec<String>, ApiError> {
    let Some(kind) = typed_kind(res) else {
        return Ok(Vec::new());
    };
    strict::check(kind, obj).map_err(|e| ApiError::BadRequest(e.to_string()))
}
