//! API errors and the `Status` objects they are served as.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::registry::ResourceInfo;

/// One field cause of a 422 (or 400) error.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, ...
    pub reason: String,
    pub field: String,
    pub message: String,
}

/// Everything a request can fail with; each is served as a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: String, name: String },
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: String, name: String },
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {detail}")]
    Conflict {
        resource: String,
        name: String,
        detail: String,
    },
    /// 409 from server-side apply: fields other managers own would change.
    #[error("{message}")]
    ApplyConflict { message: String, causes: Vec<Cause> },
    /// 422: the object failed validation.
    #[error("{message}")]
    Invalid {
        kind: String,
        group: String,
        name: String,
        message: String,
        causes: Vec<Cause>,
    },
    #[error("{0}")]
    BadRequest(String),
    /// 410: the requested resourceVersion is older than the retained history.
    #[error("{0}")]
    Gone(String),
    /// 410 for a paged list whose revision is compacted: upstream's "inconsistent continue",
    /// with a token that continues the list at the latest revision in the Status's metadata.
    #[error("{message}")]
    ExpiredContinue { message: String, token: String },
    /// 504: the requested resourceVersion is newer than the store (upstream's
    /// `ResourceVersionTooLarge`).
    #[error("{0}")]
    TooLargeResourceVersion(String),
    #[error("Unauthorized")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    /// 403 from authorization (upstream's `NewForbidden`): the details name the group,
    /// resource and object the user was refused.
    #[error("{message}")]
    Denied {
        group: String,
        resource: String,
        name: String,
        message: String,
    },
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("the server could not find the requested resource")]
    NoRoute,
    #[error("request entity too large: limit is {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn not_found(res: &ResourceInfo, name: &str) -> Self {
        ApiError::NotFound {
            resource: res.qualified(),
            name: name.into(),
        }
    }
    pub fn already_exists(res: &ResourceInfo, name: &str) -> Self {
        ApiError::AlreadyExists {
            resource: res.qualified(),
            name: name.into(),
        }
    }
    pub fn conflict(res: &ResourceInfo, name: &str) -> Self {
        ApiError::Conflict {
            resource: res.qualified(),
            name: name.into(),
            detail: "the object has been modified; please apply your changes to the latest version and try again".into(),
        }
    }

    /// A 422 for `kind "name"`, with upstream's message shape.
    pub fn invalid(res: &ResourceInfo, name: &str, causes: Vec<Cause>) -> Self {
        let parts: Vec<String> = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect();
        let joined = if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("[{}]", parts.join(", "))
        };
        ApiError::Invalid {
            kind: res.kind.into(),
            group: res.group.into(),
            name: name.into(),
            message: format!("{} \"{}\" is invalid: {}", res.kind, name, joined),
            causes,
        }
    }

    pub fn code(&self) -> u16 {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => 404,
            ApiError::AlreadyExists { .. }
            | ApiError::Conflict { .. }
            | ApiError::ApplyConflict { .. } => 409,
            ApiError::Invalid { .. } => 422,
            ApiError::BadRequest(_) => 400,
            ApiError::Gone(_) | ApiError::ExpiredContinue { .. } => 410,
            ApiError::TooLargeResourceVersion(_) => 504,
            ApiError::Unauthorized => 401,
            ApiError::Forbidden(_) | ApiError::Denied { .. } => 403,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::TooLarge(_) => 413,
            ApiError::UnsupportedMediaType(_) => 415,
            ApiError::Internal(_) => 500,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => "NotFound",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => "Conflict",
            ApiError::Invalid { .. } => "Invalid",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Gone(_) | ApiError::ExpiredContinue { .. } => "Expired",
            ApiError::TooLargeResourceVersion(_) => "Timeout",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::Forbidden(_) | ApiError::Denied { .. } => "Forbidden",
            ApiError::MethodNotAllowed(_) => "MethodNotAllowed",
            ApiError::TooLarge(_) => "RequestEntityTooLarge",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            ApiError::Internal(_) => "InternalError",
        }
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if let ApiError::ExpiredContinue { token, .. } = self {
            status["metadata"]["continue"] = json!(token);
        }
        let details = match self {
            ApiError::NotFound { resource, name }
            | ApiError::AlreadyExists { resource, name }
            | ApiError::Conflict { resource, name, .. } => {
                let (kind, group) = match resource.split_once('.') {
                    Some((k, g)) => (k, g),
                    None => (resource.as_str(), ""),
                };
                let mut d = json!({"name": name, "kind": kind});
                if !group.is_empty() {
                    d["group"] = json!(group);
                }
                Some(d)
            }
            ApiError::Invalid {
                kind,
                group,
                name,
                causes,
                ..
            } => {
                let mut d = json!({"name": name, "kind": kind, "causes": causes_json(causes)});
                if !group.is_empty() {
                    d["group"] = json!(group);
                }
                Some(d)
            }
            ApiError::Denied {
                group,
                resource,
                name,
                ..
            } => {
                let mut d = json!({});
                if !name.is_empty() {
                    d["name"] = json!(name);
                }
                if !group.is_empty() {
                    d["group"] = json!(group);
                }
                if !resource.is_empty() {
                    d["kind"] = json!(resource);
                }
                Some(d)
            }
            // Upstream's `NewApplyConflict`: causes only.
            ApiError::ApplyConflict { causes, .. } => Some(json!({"causes": causes_json(causes)})),
            // Clients read `details` of every 404 (kubectl debug takes an empty name as "this
            // subresource is not served"); upstream always sends it.
            ApiError::NoRoute => Some(json!({})),
            ApiError::TooLargeResourceVersion(_) => Some(json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            })),
            _ => None,
        };
        if let Some(d) = details {
            status["details"] = d;
        }
        status
    }
}

fn causes_json(causes: &[Cause]) -> Vec<Value> {
    causes
        .iter()
        .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
        .collect()
}

impl From<svcnet_store::StoreError> for ApiError {
    fn from(e: svcnet_store::StoreError) -> Self {
        match e {
            svcnet_store::StoreError::Gone {
                requested,
                compacted,
            } => ApiError::Gone(format!(
                "too old resource version: {requested} ({compacted})"
            )),
            svcnet_store::StoreError::FutureRevision { requested, current } => {
                ApiError::TooLargeResourceVersion(format!(
                    "Too large resource version: {requested}, current: {current}"
                ))
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.status().to_string();
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}
