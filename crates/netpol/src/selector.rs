//! Label selectors as NetworkPolicy uses them: `matchLabels` and `matchExpressions` ANDed,
//! and the empty selector matching everything.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub labels: BTreeMap<String, String>,
    pub exprs: Vec<(String, Op)>,
}

impl Selector {
    /// The empty selector: every object.
    pub fn everything() -> Selector {
        Selector::default()
    }

    /// `k=v` pairs, all required.
    pub fn labels<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Selector {
        Selector {
            labels: pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            exprs: Vec::new(),
        }
    }

    /// The selector of an API object; `Err` carries an operator the API does not define.
    pub fn from_k8s(sel: &LabelSelector) -> Result<Selector, String> {
        let mut exprs = Vec::new();
        for r in sel.match_expressions.iter().flatten() {
            let values = r.values.clone().unwrap_or_default();
            let op = match r.operator.as_str() {
                "In" => Op::In(values),
                "NotIn" => Op::NotIn(values),
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => return Err(other.to_string()),
            };
            exprs.push((r.key.clone(), op));
        }
        Ok(Selector {
            labels: sel.match_labels.clone().unwrap_or_default(),
            exprs,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.exprs.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.exprs.iter().all(|(k, op)| match op {
                Op::In(vals) => labels.get(k).is_some_and(|v| vals.contains(v)),
                Op::NotIn(vals) => labels.get(k).is_none_or(|v| !vals.contains(v)),
                Op::Exists => labels.contains_key(k),
                Op::DoesNotExist => !labels.contains_key(k),
            })
    }
}
