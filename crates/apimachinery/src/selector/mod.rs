//! Label and field selectors, parsed and matched as `k8s.io/apimachinery` does.

mod field;
mod label;
mod validation;

#[cfg(test)]
mod tests;

pub use field::{
    FieldOp, FieldRequirement, FieldSelector, escape_value, field_value, supported_fields,
    unescape_value,
};
pub use label::{LabelOp, LabelRequirement, LabelSelector};

/// Why a selector was rejected; every variant is a client error (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The selector string does not follow the grammar.
    #[error("unable to parse requirement: {reason}")]
    Syntax { selector: String, reason: String },
    /// A label key is not a valid qualified name.
    #[error("unable to parse requirement: key: Invalid value: {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },
    /// A label value is not a valid label value.
    #[error("unable to parse requirement: values[0][{key}]: Invalid value: {value:?}: {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: String,
    },
    /// The operator and values of a requirement do not fit together.
    #[error("unable to parse requirement: {key}: {reason}")]
    Requirement { key: String, reason: String },
}
