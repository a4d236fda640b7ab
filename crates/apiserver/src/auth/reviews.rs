//! The reviews a user asks about themself: `SelfSubjectAccessReview` (`kubectl auth can-i`),
//! `SelfSubjectRulesReview` (`kubectl auth can-i --list`) and `SelfSubjectReview`
//! (`kubectl auth whoami`). kubectl sends them as protobuf; they are answered in JSON.

use serde_json::{Value, json};

use super::UserInfo;
use super::rbac::{self, Attributes};
use crate::state::SharedState;
use crate::status::ApiError;

fn s<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path).and_then(Value::as_str).unwrap_or("")
}

/// `SelfSubjectAccessReview` or, with `rules`, `SelfSubjectRulesReview`.
pub async fn self_review(
    state: &SharedState,
    user: &UserInfo,
    body: &[u8],
    rules: bool,
) -> Result<Value, ApiError> {
    let kind = if rules {
        "SelfSubjectRulesReview"
    } else {
        "SelfSubjectAccessReview"
    };
    let mut review = super::decode_body(kind, body)?;
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!(kind);
    if review.get("metadata").is_none() {
        review["metadata"] = json!({});
    }
    if rules {
        review["status"] = rules_status(state, user, s(&review, "/spec/namespace")).await?;
        return Ok(review);
    }
    let attrs = if let Some(r) = review
        .pointer("/spec/resourceAttributes")
        .filter(|r| r.is_object())
    {
        let mut a = Attributes::impersonate(
            user,
            s(r, "/group"),
            s(r, "/resource"),
            Some(s(r, "/namespace")),
            s(r, "/name"),
        );
        a.verb = s(r, "/verb").into();
        a.subresource = s(r, "/subresource").into();
        a
    } else if let Some(n) = review
        .pointer("/spec/nonResourceAttributes")
        .filter(|r| r.is_object())
    {
        let mut a = Attributes::impersonate(user, "", "", None, "");
        a.resource_request = false;
        a.verb = s(n, "/verb").into();
        a.path = s(n, "/path").into();
        a
    } else {
        return Err(ApiError::Invalid {
            kind: kind.into(),
            group: "authorization.k8s.io".into(),
            name: String::new(),
            message: format!(
                "{kind}.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified"
            ),
            causes: vec![crate::status::Cause {
                reason: "FieldValueInvalid".into(),
                field: "spec.resourceAttributes".into(),
                message: "Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified".into(),
            }],
        });
    };
    review["status"] = match rbac::decide(state, &attrs).await? {
        Some(reason) => json!({"allowed": true, "reason": reason}),
        None => json!({"allowed": false}),
    };
    Ok(review)
}

/// The rules RBAC gives `user` at cluster scope and in `namespace`.
async fn rules_status(
    state: &SharedState,
    user: &UserInfo,
    namespace: &str,
) -> Result<Value, ApiError> {
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for g in rbac::grants(state, user, namespace).await? {
        for r in g.rules {
            if r.get("nonResourceURLs")
                .and_then(Value::as_array)
                .is_some_and(|u| !u.is_empty())
            {
                non_resource_rules
                    .push(json!({"verbs": r["verbs"], "nonResourceURLs": r["nonResourceURLs"]}));
            } else {
                resource_rules.push(r);
            }
        }
    }
    Ok(json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": false,
    }))
}

/// `SelfSubjectReview`: who the server takes the client for.
pub fn whoami(user: &UserInfo, body: &[u8]) -> Result<Value, ApiError> {
    let mut review = super::decode_body("SelfSubjectReview", body)?;
    review["apiVersion"] = json!("authentication.k8s.io/v1");
    review["kind"] = json!("SelfSubjectReview");
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = json!({"userInfo": user.to_json()});
    Ok(review)
}
