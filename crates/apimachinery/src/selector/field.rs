//! Field selectors: the syntax of `k8s.io/apimachinery/pkg/fields` (`f=v`, `f==v`, `f!=v`,
//! comma-separated, `\` escapes in values) and the fields each kind registers upstream.

use std::fmt;

use serde_json::Value;

use super::SelectorError;

/// The operator of one field requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOp {
    /// `f=v` or `f==v`
    Equals,
    /// `f!=v`
    NotEquals,
}

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    pub field: String,
    pub op: FieldOp,
    /// The unescaped value.
    pub value: String,
}

impl FieldRequirement {
    /// Whether the term holds; a field the object does not have counts as the empty string,
    /// as in upstream's `fields.Set`.
    pub fn matches(&self, value: Option<&str>) -> bool {
        let got = value.unwrap_or("");
        match self.op {
            FieldOp::Equals => got == self.value,
            FieldOp::NotEquals => got != self.value,
        }
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            FieldOp::Equals => "=",
            FieldOp::NotEquals => "!=",
        };
        write!(f, "{}{op}{}", self.field, escape_value(&self.value))
    }
}

/// A field selector: the conjunction of its terms. Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses `fields.ParseSelector` syntax. Terms are sorted as upstream sorts them.
    pub fn parse(s: &str) -> Result<FieldSelector, SelectorError> {
        let mut terms = split_terms(s);
        terms.sort();
        let mut requirements = Vec::new();
        for term in terms {
            if term.is_empty() {
                continue;
            }
            let Some((lhs, op, rhs)) = split_term(&term) else {
                return Err(SelectorError::Syntax {
                    selector: s.to_string(),
                    reason: format!("invalid selector: '{s}'; can't understand '{term}'"),
                });
            };
            requirements.push(FieldRequirement {
                field: lhs.trim().to_string(),
                op,
                value: unescape_value(rhs)?,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// `metadata.name=<name>`, what `kubectl delete --wait` watches with.
    pub fn one_term(field: &str, value: &str) -> FieldSelector {
        FieldSelector {
            requirements: vec![FieldRequirement {
                field: field.to_string(),
                op: FieldOp::Equals,
                value: value.to_string(),
            }],
        }
    }

    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether every term holds; `get` returns an object's value for a field name.
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches(get(&r.field).as_deref()))
    }

    /// The first term whose field `kind` does not support, for a 400
    /// `field label not supported: <field>` as upstream answers.
    pub fn unsupported_field(&self, kind: &str) -> Option<&str> {
        let supported = supported_fields(kind);
        self.requirements
            .iter()
            .map(|r| r.field.as_str())
            .find(|f| !supported.contains(f))
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for FieldSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Splits on commas that are not escaped with `\`; escapes stay in the terms.
fn split_terms(s: &str) -> Vec<String> {
    let mut terms = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            cur.push(c);
            escaped = true;
        } else if c == ',' {
            terms.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    terms.push(cur);
    terms
}

/// The first operator in the term, trying `!=`, `==`, `=` at each position (as upstream).
fn split_term(term: &str) -> Option<(&str, FieldOp, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (op, kind) in [
            ("!=", FieldOp::NotEquals),
            ("==", FieldOp::Equals),
            ("=", FieldOp::Equals),
        ] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], kind, value));
            }
        }
    }
    None
}

/// Escapes `\`, `,` and `=` in a value, as `fields.EscapeValue`.
pub fn escape_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Reverses [`escape_value`]; an unknown escape or an unescaped `,`/`=` is an error.
pub fn unescape_value(v: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                _ => {
                    return Err(SelectorError::Syntax {
                        selector: v.to_string(),
                        reason: format!("invalid escape sequence: {v}"),
                    });
                }
            },
            ',' | '=' => {
                return Err(SelectorError::Syntax {
                    selector: v.to_string(),
                    reason: format!("invalid field selector: unescaped character in value: {v}"),
                });
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

const META_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

/// The field selectors each kind accepts, as registered upstream
/// (`pkg/apis/core/v1/conversion.go` `AddFieldLabelConversionFunc`; every other kind gets
/// `metadata.name` and `metadata.namespace`).
pub fn supported_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "Pod" => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
            "spec.host",
        ],
        "Node" => &["metadata.name", "spec.unschedulable"],
        "Namespace" => &["metadata.name", "status.phase"],
        "Service" => &[
            "metadata.name",
            "metadata.namespace",
            "spec.clusterIP",
            "spec.type",
        ],
        "Secret" => &["metadata.name", "metadata.namespace", "type"],
        "ReplicationController" | "ReplicaSet" => {
            &["metadata.name", "metadata.namespace", "status.replicas"]
        }
        "Event" => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        _ => META_FIELDS,
    }
}

fn str_at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(obj, |v, k| v.get(k))
        .and_then(Value::as_str)
}

fn string_at(obj: &Value, path: &[&str]) -> String {
    str_at(obj, path).unwrap_or_default().to_string()
}

/// The value of a selectable field of an object of `kind`, as upstream's `ToSelectableFields`
/// computes it (absent fields are the empty string; booleans print as `true`/`false`).
/// `None` means the kind has no such selectable field.
pub fn field_value(kind: &str, obj: &Value, field: &str) -> Option<String> {
    if !supported_fields(kind).contains(&field) {
        return None;
    }
    let v = match (kind, field) {
        (_, "metadata.name") => string_at(obj, &["metadata", "name"]),
        (_, "metadata.namespace") => string_at(obj, &["metadata", "namespace"]),
        ("Pod", "spec.host") => string_at(obj, &["spec", "nodeName"]),
        ("Pod", "spec.hostNetwork") | ("Node", "spec.unschedulable") => {
            let mut parts = field.split('.');
            let (a, b) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let on = obj
                .get(a)
                .and_then(|s| s.get(b))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            on.to_string()
        }
        ("Pod", "status.podIP") => obj
            .pointer("/status/podIPs/0/ip")
            .and_then(Value::as_str)
            .or_else(|| str_at(obj, &["status", "podIP"]))
            .unwrap_or_default()
            .to_string(),
        ("Pod", "status.podIPs") => obj
            .pointer("/status/podIPs")
            .and_then(Value::as_array)
            .map(|ips| {
                ips.iter()
                    .filter_map(|ip| ip.get("ip").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default(),
        ("Event", "source") => str_at(obj, &["source", "component"])
            .filter(|s| !s.is_empty())
            .or_else(|| str_at(obj, &["reportingComponent"]))
            .unwrap_or_default()
            .to_string(),
        ("ReplicationController" | "ReplicaSet", "status.replicas") => obj
            .pointer("/status/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            .to_string(),
        (_, path) => {
            let parts: Vec<&str> = path.split('.').collect();
            string_at(obj, &parts)
        }
    };
    Some(v)
}
