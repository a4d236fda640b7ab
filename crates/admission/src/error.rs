//! Field errors in the shape of apimachinery's `field.Error`, and the
//! configuration error of the allocators.

use std::fmt;

/// Why a field was rejected; one-to-one with upstream's `field.ErrorType`
/// (the subset admission produces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    Required,
    Invalid,
    NotSupported,
    Duplicate,
    Forbidden,
    TooLong,
    TooMany,
}

impl FieldErrorKind {
    /// The `StatusCause.reason` upstream puts into a 422 `Status`.
    pub fn reason(&self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
        }
    }

    /// The human text upstream prints for this kind (`ErrorType.String()`).
    pub fn text(&self) -> &'static str {
        match self {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
        }
    }
}

/// One rejected field. `value` is the offending value already rendered the
/// way upstream renders it (`"http"` quoted, `0` bare, lists as JSON), or
/// `None` when upstream omits it (Required, Forbidden, TooLong).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    pub value: Option<String>,
    pub detail: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Required,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Forbidden,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    pub fn invalid(
        field: impl Into<String>,
        value: impl BadValue,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind: FieldErrorKind::Invalid,
            field: field.into(),
            value: Some(value.render()),
            detail: detail.into(),
        }
    }

    pub fn duplicate(field: impl Into<String>, value: impl BadValue) -> Self {
        Self {
            kind: FieldErrorKind::Duplicate,
            field: field.into(),
            value: Some(value.render()),
            detail: String::new(),
        }
    }

    /// `Unsupported value: "Foo": supported values: "A", "B"`.
    pub fn not_supported(
        field: impl Into<String>,
        value: impl BadValue,
        supported: &[&str],
    ) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self {
            kind: FieldErrorKind::NotSupported,
            field: field.into(),
            value: Some(value.render()),
            detail,
        }
    }

    pub fn too_long(field: impl Into<String>, max_bytes: usize) -> Self {
        Self {
            kind: FieldErrorKind::TooLong,
            field: field.into(),
            value: None,
            detail: format!("may not be more than {max_bytes} bytes"),
        }
    }

    pub fn too_many(field: impl Into<String>, actual: usize, max: usize) -> Self {
        Self {
            kind: FieldErrorKind::TooMany,
            field: field.into(),
            value: Some(actual.to_string()),
            detail: format!("must have at most {max} items"),
        }
    }

    /// True for a body that could not even be decoded into the kind's type:
    /// the API server should answer 400 BadRequest, not 422.
    pub fn is_decode_error(&self) -> bool {
        self.field.is_empty() && self.kind == FieldErrorKind::Invalid && self.value.is_none()
    }

    /// The message without the field path (upstream `ErrorBody()`), which is
    /// what goes into `StatusCause.message`.
    pub fn body(&self) -> String {
        let mut s = self.kind.text().to_string();
        if let Some(v) = &self.value {
            s.push_str(": ");
            s.push_str(v);
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_decode_error() {
            return f.write_str(&self.detail);
        }
        if self.field.is_empty() {
            return f.write_str(&self.body());
        }
        write!(f, "{}: {}", self.field, self.body())
    }
}

impl std::error::Error for FieldError {}

/// Renders a bad value like upstream: strings quoted (Go `%q`), numbers and
/// booleans bare, anything composite as compact JSON.
pub trait BadValue {
    fn render(&self) -> String;
}

impl BadValue for &str {
    fn render(&self) -> String {
        quote(self)
    }
}
impl BadValue for String {
    fn render(&self) -> String {
        quote(self)
    }
}
impl BadValue for &String {
    fn render(&self) -> String {
        quote(self)
    }
}
macro_rules! bare_value {
    ($($t:ty),*) => {$(
        impl BadValue for $t {
            fn render(&self) -> String { self.to_string() }
        }
    )*};
}
bare_value!(i32, i64, u16, u32, usize, bool);

impl BadValue for &[String] {
    fn render(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "[]".into())
    }
}
impl BadValue for &Vec<String> {
    fn render(&self) -> String {
        self.as_slice().render()
    }
}
impl BadValue for &serde_json::Value {
    fn render(&self) -> String {
        match self {
            serde_json::Value::String(s) => quote(s),
            other => other.to_string(),
        }
    }
}
impl BadValue for &std::collections::BTreeMap<String, String> {
    fn render(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}

/// Go's `%q` for the strings we meet (JSON escaping is the same for printable text).
pub(crate) fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A bad [`AdmissionConfig`](crate::AdmissionConfig): the allocators refuse
/// to start rather than hand out addresses they cannot track.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no service CIDR configured")]
    NoServiceCidr,
    #[error("service CIDR {0} is too small (it needs at least 2 usable addresses)")]
    CidrTooSmall(ipnet::IpNet),
    #[error("{cidr} is too large; its prefix must be at least /{min_prefix}")]
    CidrTooLarge { cidr: ipnet::IpNet, min_prefix: u8 },
    #[error("more than one service CIDR per IP family is not supported: {0} and {1}")]
    DuplicateFamily(ipnet::IpNet, ipnet::IpNet),
    #[error("node port range {start}-{end} is empty or starts at 0")]
    BadNodePortRange { start: u16, end: u16 },
    #[error("load balancer pool {0} is too small (it needs at least 1 usable address)")]
    LbPoolTooSmall(ipnet::IpNet),
    #[error("load balancer pool {pool} overlaps the service CIDR {cidr}")]
    LbPoolOverlapsServiceCidr {
        pool: ipnet::IpNet,
        cidr: ipnet::IpNet,
    },
}

impl ConfigError {
    /// Configuration errors never go away by retrying.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_upstream_shapes() {
        let e = FieldError::invalid(
            "spec.ports[0].port",
            0,
            "must be between 1 and 65535, inclusive",
        );
        assert_eq!(
            e.to_string(),
            "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"
        );
        let e = FieldError::duplicate("spec.ports[1].name", "http");
        assert_eq!(
            e.to_string(),
            r#"spec.ports[1].name: Duplicate value: "http""#
        );
        let e = FieldError::not_supported(
            "spec.type",
            "Foo",
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        );
        assert_eq!(
            e.to_string(),
            r#"spec.type: Unsupported value: "Foo": supported values: "ClusterIP", "ExternalName", "LoadBalancer", "NodePort""#
        );
        assert_eq!(
            FieldError::required("spec.ports", "").to_string(),
            "spec.ports: Required value"
        );
        let ips = vec!["10.96.0.5".to_string()];
        let e = FieldError::invalid(
            "spec.clusterIPs",
            &ips,
            "failed to allocate IP 10.96.0.5: provided IP is already allocated",
        );
        assert_eq!(
            e.to_string(),
            r#"spec.clusterIPs: Invalid value: ["10.96.0.5"]: failed to allocate IP 10.96.0.5: provided IP is already allocated"#
        );
        assert_eq!(
            FieldError::too_many("endpoints", 1001, 1000).to_string(),
            "endpoints: Too many: 1001: must have at most 1000 items"
        );
        assert_eq!(FieldErrorKind::TooLong.reason(), "FieldValueTooLong");
    }
}
