//! Label selector matching for Service selectors (equality maps) and workload selectors
//! (`matchLabels` + `matchExpressions`).
//!
//! A small private matcher: svcnet-apimachinery grows a full selector module in parallel, and
//! this one only covers what the controllers need.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// An equality-based selector, as in `Service.spec.selector`. An empty selector matches every
/// object; callers that want "no selector means nothing" check emptiness first.
pub(crate) fn map_matches(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Why a `LabelSelector` cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SelectorError {
    #[error("matchExpressions[{index}].operator: unsupported value {operator:?}")]
    UnknownOperator { index: usize, operator: String },
    #[error("matchExpressions[{index}].values: must be non-empty for operator {operator}")]
    MissingValues { index: usize, operator: String },
}

/// A `metav1.LabelSelector`: all `matchLabels` and all `matchExpressions` must hold. An empty
/// selector matches everything, as upstream's `LabelSelectorAsSelector` does.
pub(crate) fn label_selector_matches(
    selector: &LabelSelector,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<bool, SelectorError> {
    if let Some(ml) = &selector.match_labels
        && !map_matches(ml, labels)
    {
        return Ok(false);
    }
    for (index, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let value = labels.and_then(|l| l.get(&expr.key));
        let values = expr.values.as_deref().unwrap_or_default();
        let ok = match expr.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    return Err(SelectorError::MissingValues {
                        index,
                        operator: expr.operator.clone(),
                    });
                }
                let contained = value.is_some_and(|v| values.contains(v));
                if expr.operator == "In" {
                    contained
                } else {
                    !contained
                }
            }
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(SelectorError::UnknownOperator {
                    index,
                    operator: other.to_string(),
                });
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_maps() {
        let sel = labels(&[("app", "web")]);
        assert!(map_matches(
            &sel,
            Some(&labels(&[("app", "web"), ("x", "y")]))
        ));
        assert!(!map_matches(&sel, Some(&labels(&[("app", "db")]))));
        assert!(!map_matches(&sel, None));
        assert!(map_matches(&BTreeMap::new(), None));
    }

    #[test]
    fn expressions() {
        let req = |key: &str, op: &str, values: &[&str]| LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|s| s.to_string()).collect()),
        };
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![
                req("tier", "In", &["a", "b"]),
                req("canary", "DoesNotExist", &[]),
                req("env", "NotIn", &["prod"]),
            ]),
        };
        let l = labels(&[("app", "web"), ("tier", "a")]);
        assert_eq!(label_selector_matches(&sel, Some(&l)), Ok(true));
        let l = labels(&[("app", "web"), ("tier", "c")]);
        assert_eq!(label_selector_matches(&sel, Some(&l)), Ok(false));
        let l = labels(&[("app", "web"), ("tier", "a"), ("env", "prod")]);
        assert_eq!(label_selector_matches(&sel, Some(&l)), Ok(false));
        let l = labels(&[("app", "web"), ("tier", "b"), ("canary", "1")]);
        assert_eq!(label_selector_matches(&sel, Some(&l)), Ok(false));
        let bad = LabelSelector {
            match_expressions: Some(vec![req("a", "Near", &["x"])]),
            ..Default::default()
        };
        assert!(matches!(
            label_selector_matches(&bad, None),
            Err(SelectorError::UnknownOperator { index: 0, .. })
        ));
        assert_eq!(
            label_selector_matches(&LabelSelector::default(), None),
            Ok(true)
        );
    }
}
