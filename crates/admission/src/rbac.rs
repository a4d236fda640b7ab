//! `rbac.authorization.k8s.io/v1` Roles, ClusterRoles and their bindings: upstream's
//! defaulting (`SetDefaults_Subject`, the bindings' `roleRef.apiGroup`) and validation
//! (`pkg/apis/rbac/validation`: names are path segments, every rule has verbs and either
//! resources with API groups or non-resource URLs, bindings name a role of a supported kind,
//! subjects are users, groups or ServiceAccounts, `roleRef` never changes).

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use serde_json::Value;

use crate::codec::{decode, encode};
use crate::error::{BadValue, FieldError};
use crate::syntax::{self, NameRule};

/// The API group of RBAC (`rbac.GroupName`).
pub const GROUP: &str = "rbac.authorization.k8s.io";

fn finish<T: serde::Serialize>(obj: &T, errs: Vec<FieldError>) -> Result<Value, Vec<FieldError>> {
    if errs.is_empty() {
        encode(obj)
    } else {
        Err(errs)
    }
}

/// A value upstream prints with Go's `%#v` (a struct, a string slice): shown as given.
struct Raw(String);

impl BadValue for Raw {
    fn render(&self) -> String {
        self.0.clone()
    }
}

/// upstream `ValidatePolicyRule`.
fn validate_rule(rule: &PolicyRule, namespaced: bool, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let len = |v: &Option<Vec<String>>| v.as_ref().map_or(0, Vec::len);
    if rule.verbs.is_empty() {
        errs.push(FieldError::required(
            format!("{path}.verbs"),
            "verbs must contain at least one value",
        ));
    }
    if let Some(urls) = rule.non_resource_urls.as_ref().filter(|u| !u.is_empty()) {
        let quoted: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
        let shown = format!("[]string{{{}}}", quoted.join(", "));
        if namespaced {
            errs.push(FieldError::invalid(
                format!("{path}.nonResourceURLs"),
                Raw(shown.clone()),
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if len(&rule.api_groups) > 0 || len(&rule.resources) > 0 || len(&rule.resource_names) > 0 {
            errs.push(FieldError::invalid(
                format!("{path}.nonResourceURLs"),
                Raw(shown.clone()),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return errs;
    }
    if len(&rule.api_groups) == 0 {
        errs.push(FieldError::required(
            format!("{path}.apiGroups"),
            "resource rules must supply at least one api group",
        ));
    }
    if len(&rule.resources) == 0 {
        errs.push(FieldError::required(
            format!("{path}.resources"),
            "resource rules must supply at least one resource",
        ));
    }
    errs
}

fn validate_rules(rules: &[PolicyRule], namespaced: bool) -> Vec<FieldError> {
    rules
        .iter()
        .enumerate()
        .flat_map(|(i, r)| validate_rule(r, namespaced, &format!("rules[{i}]")))
        .collect()
}

/// upstream `SetDefaults_Subject`: users and groups are RBAC's, ServiceAccounts the core's.
fn default_subjects(subjects: &mut Option<Vec<Subject>>) {
    for s in subjects.iter_mut().flatten() {
        if s.api_group.as_deref().unwrap_or("").is_empty()
            && matches!(s.kind.as_str(), "User" | "Group")
        {
            s.api_group = Some(GROUP.into());
        }
    }
}

fn default_role_ref(r: &mut RoleRef) {
    if r.api_group.is_empty() {
        r.api_group = GROUP.into();
    }
}

/// upstream `ValidateRoleBindingSubject`.
fn validate_subject(s: &Subject, namespaced: bool, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if s.name.is_empty() {
        errs.push(FieldError::required(format!("{path}.name"), ""));
    }
    let group = s.api_group.as_deref().unwrap_or("");
    match s.kind.as_str() {
        "ServiceAccount" => {
            if !s.name.is_empty() {
                for m in syntax::is_dns1123_subdomain(&s.name) {
                    errs.push(FieldError::invalid(
                        format!("{path}.name"),
                        s.name.as_str(),
                        m,
                    ));
                }
            }
            if !group.is_empty() {
                errs.push(FieldError::not_supported(
                    format!("{path}.apiGroup"),
                    group,
                    &[""],
                ));
            }
            if !namespaced && s.namespace.as_deref().unwrap_or("").is_empty() {
                errs.push(FieldError::required(format!("{path}.namespace"), ""));
            }
        }
        "User" | "Group" => {
            if group != GROUP {
                errs.push(FieldError::not_supported(
                    format!("{path}.apiGroup"),
                    group,
                    &[GROUP],
                ));
            }
        }
        other => errs.push(FieldError::not_supported(
            format!("{path}.kind"),
            other,
            &["ServiceAccount", "User", "Group"],
        )),
    }
    errs
}

/// upstream `ValidateRoleBinding` / `ValidateClusterRoleBinding`.
fn validate_binding(r: &RoleRef, subjects: &[Subject], namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if r.api_group != GROUP {
        errs.push(FieldError::not_supported(
            "roleRef.apiGroup",
            r.api_group.as_str(),
            &[GROUP],
        ));
    }
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kinds.contains(&r.kind.as_str()) {
        errs.push(FieldError::not_supported(
            "roleRef.kind",
            r.kind.as_str(),
            kinds,
        ));
    }
    if r.name.is_empty() {
        errs.push(FieldError::required("roleRef.name", ""));
    } else {
        for m in syntax::is_path_segment_name(&r.name) {
            errs.push(FieldError::invalid("roleRef.name", r.name.as_str(), m));
        }
    }
    for (i, s) in subjects.iter().enumerate() {
        errs.extend(validate_subject(s, namespaced, &format!("subjects[{i}]")));
    }
    errs
}

/// Defaults and validates a new (or replaced) RBAC object of `kind`.
pub(crate) fn admit(kind: &str, obj: Value) -> Result<Value, Vec<FieldError>> {
    let meta = |m, namespaced| syntax::validate_object_meta(m, namespaced, NameRule::PathSegment);
    match kind {
        "Role" => {
            let role: Role = decode(obj)?;
            let mut errs = meta(&role.metadata, true);
            errs.extend(validate_rules(
                role.rules.as_deref().unwrap_or_default(),
                true,
            ));
            finish(&role, errs)
        }
        "ClusterRole" => {
            let role: ClusterRole = decode(obj)?;
            let mut errs = meta(&role.metadata, false);
            errs.extend(validate_rules(
                role.rules.as_deref().unwrap_or_default(),
                false,
            ));
            finish(&role, errs)
        }
        "RoleBinding" => {
            let mut b: RoleBinding = decode(obj)?;
            default_subjects(&mut b.subjects);
            default_role_ref(&mut b.role_ref);
            let mut errs = meta(&b.metadata, true);
            errs.extend(validate_binding(
                &b.role_ref,
                b.subjects.as_deref().unwrap_or_default(),
                true,
            ));
            finish(&b, errs)
        }
        _ => {
            let mut b: ClusterRoleBinding = decode(obj)?;
            default_subjects(&mut b.subjects);
            default_role_ref(&mut b.role_ref);
            let mut errs = meta(&b.metadata, false);
            errs.extend(validate_binding(
                &b.role_ref,
                b.subjects.as_deref().unwrap_or_default(),
                false,
            ));
            finish(&b, errs)
        }
    }
}

/// A binding's update: validated as new, and its `roleRef` may not change (upstream
/// `ValidateRoleBindingUpdate`).
pub(crate) fn admit_binding_update(
    kind: &str,
    old: &Value,
    new: Value,
) -> Result<Value, Vec<FieldError>> {
    let admitted = admit(kind, new)?;
    let role_ref = |v: &Value| {
        let mut r: RoleRef = serde_json::from_value(v.get("roleRef").cloned().unwrap_or_default())
            .unwrap_or(RoleRef {
                api_group: String::new(),
                kind: String::new(),
                name: String::new(),
            });
        default_role_ref(&mut r);
        r
    };
    let (before, after) = (role_ref(old), role_ref(&admitted));
    if before != after {
        let shown = format!(
            "rbac.RoleRef{{APIGroup:{:?}, Kind:{:?}, Name:{:?}}}",
            after.api_group, after.kind, after.name
        );
        return Err(vec![FieldError::invalid(
            "roleRef",
            Raw(shown),
            "cannot change roleRef",
        )]);
    }
    Ok(admitted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(r: Result<Value, Vec<FieldError>>) -> Vec<String> {
        r.err()
            .unwrap_or_default()
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn rules_need_verbs_and_resources_or_urls() {
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "r", "namespace": "ns"},
            "rules": [{"verbs": [], "resources": ["pods"]}, {"verbs": ["get"], "nonResourceURLs": ["/x"]}]});
        assert_eq!(
            messages(admit("Role", role)),
            [
                "rules[0].verbs: Required value: verbs must contain at least one value",
                "rules[0].apiGroups: Required value: resource rules must supply at least one api group",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/x\"}: namespaced rules cannot apply to non-resource URLs",
            ]
        );
        let ok = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:x"},
            "rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]});
        assert!(admit("ClusterRole", ok).is_ok());
    }

    #[test]
    fn bindings_are_defaulted_and_checked() {
        let b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "b"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "User", "name": "u"}, {"kind": "ServiceAccount", "name": "sa"}, {"kind": "Robot", "name": "x"}]});
        assert_eq!(
            messages(admit("ClusterRoleBinding", b)),
            [
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[1].namespace: Required value",
                "subjects[2].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
            ]
        );
        let b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "ns"},
            "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "Group", "name": "g"}]});
        let admitted = admit("RoleBinding", b.clone()).unwrap();
        assert_eq!(admitted["roleRef"]["apiGroup"], GROUP);
        assert_eq!(admitted["subjects"][0]["apiGroup"], GROUP);
        let mut changed = b;
        changed["roleRef"]["name"] = json!("edit");
        assert_eq!(
            messages(admit_binding_update("RoleBinding", &admitted, changed)),
            [
                "roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"edit\"}: cannot change roleRef"
            ]
        );
    }
}
