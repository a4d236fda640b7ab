//! Between the API server's JSON and k8s-openapi's typed objects.
//!
//! Admission decodes into the typed object, which prunes unknown fields the
//! way a real API server does, and encodes the result back. A body that does
//! not decode is reported as a [`FieldError`] with an empty `field`
//! ([`FieldError::is_decode_error`]), which the API server turns into 400.

use k8s_openapi::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{FieldError, FieldErrorKind};

pub(crate) fn decode<T: DeserializeOwned + Resource>(mut obj: Value) -> Result<T, Vec<FieldError>> {
    if let Value::Object(m) = &mut obj {
        m.entry("apiVersion")
            .or_insert_with(|| Value::String(T::API_VERSION.to_string()));
        m.entry("kind")
            .or_insert_with(|| Value::String(T::KIND.to_string()));
    }
    serde_json::from_value(obj).map_err(|e| {
        vec![FieldError {
            kind: FieldErrorKind::Invalid,
            field: String::new(),
            value: None,
            detail: format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: {e}",
                kind = T::KIND,
                version = T::VERSION
            ),
        }]
    })
}

pub(crate) fn encode<T: Serialize>(obj: &T) -> Result<Value, Vec<FieldError>> {
    serde_json::to_value(obj).map_err(|e| {
        vec![FieldError {
            kind: FieldErrorKind::Invalid,
            field: String::new(),
            value: None,
            detail: format!("cannot encode the admitted object: {e}"),
        }]
    })
}

/// `namespace/name`, the owner recorded with each allocation.
pub(crate) fn owner_key(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}
