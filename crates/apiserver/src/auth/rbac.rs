//! RBAC: a request's attributes (upstream's `RequestInfo`), upstream's rule matching
//! (`rbac/v1/evaluation_helpers.go`), and the authorizer over the stored Roles,
//! ClusterRoles and bindings, with upstream's 403 message.

use axum::http::Method;
use serde_json::Value;

use super::UserInfo;
use crate::registry::{self, ResourceInfo};
use crate::request::{ApiRequest, Subresource, Verb};
use crate::state::SharedState;
use crate::status::ApiError;

/// What a request does, as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: String,
    /// A request on an API resource (else a non-resource path such as `/healthz`).
    pub resource_request: bool,
    pub path: String,
    pub namespace: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

fn verb_name(verb: Verb) -> &'static str {
    match verb {
        Verb::Get => "get",
        Verb::List => "list",
        Verb::Watch => "watch",
        Verb::Create => "create",
        Verb::Update => "update",
        Verb::Patch => "patch",
        Verb::Delete => "delete",
        Verb::DeleteCollection => "deletecollection",
        // Streams need `create` on their subresource, also when opened with a GET (upstream's
        // `AuthorizePodWebsocketUpgradeCreatePermission`, on by default).
        Verb::Connect => "create",
    }
}

pub fn subresource_name(s: Subresource) -> &'static str {
    match s {
        Subresource::Status => "status",
        Subresource::Scale => "scale",
        Subresource::Log => "log",
        Subresource::Exec => "exec",
        Subresource::PortForward => "portforward",
        Subresource::Attach => "attach",
    }
}

/// The single `metadata.name=` of a list or watch's field selector (upstream names the object
/// of such a request by it).
fn selected_name(field_selector: Option<&str>) -> String {
    let Some(sel) = field_selector else {
        return String::new();
    };
    let names: Vec<&str> = sel
        .split(',')
        .filter_map(|t| {
            t.trim()
                .strip_prefix("metadata.name=")
                .or_else(|| t.trim().strip_prefix("metadata.name=="))
        })
        .collect();
    match names.as_slice() {
        [one] => one.to_string(),
        _ => String::new(),
    }
}

impl Attributes {
    fn resource(
        user: &UserInfo,
        verb: &str,
        res: &ResourceInfo,
        ns: &str,
        sub: &str,
        name: &str,
    ) -> Self {
        Attributes {
            user: user.clone(),
            verb: verb.into(),
            resource_request: true,
            path: String::new(),
            namespace: ns.into(),
            group: res.group.into(),
            resource: res.plural.into(),
            subresource: sub.into(),
            name: name.into(),
        }
    }

    /// The attributes of a parsed request.
    pub fn of(user: &UserInfo, method: &Method, path: &str, parsed: &ApiRequest) -> Attributes {
        let named =
            |group: &str, resource: &str, ns: &str, sub: &str, name: &str, verb: &str| Attributes {
                user: user.clone(),
                verb: verb.into(),
                resource_request: true,
                path: path.into(),
                namespace: ns.into(),
                group: group.into(),
                resource: resource.into(),
                subresource: sub.into(),
                name: name.into(),
            };
        match parsed {
            ApiRequest::Resource(r) => {
                let mut name = r.name.clone().unwrap_or_default();
                if matches!(r.verb, Verb::List | Verb::Watch) {
                    name = selected_name(r.query.field_selector.as_deref());
                }
                // `/api/v1/namespaces/{name}` is inside the namespace it names.
                let ns = match (&r.namespace, r.resource.plural, r.resource.group) {
                    (Some(ns), _, _) => ns.clone(),
                    (None, "namespaces", "") => name.clone(),
                    _ => String::new(),
                };
                let sub = r.subresource.map(subresource_name).unwrap_or("");
                let mut a = Self::resource(user, verb_name(r.verb), r.resource, &ns, sub, &name);
                a.path = path.into();
                a
            }
            ApiRequest::TokenRequest { namespace, name } => {
                named("", "serviceaccounts", namespace, "token", name, "create")
            }
            ApiRequest::SelfReview { rules } => named(
                "authorization.k8s.io",
                if *rules {
                    "selfsubjectrulesreviews"
                } else {
                    "selfsubjectaccessreviews"
                },
                "",
                "",
                "",
                "create",
            ),
            ApiRequest::SelfSubjectReview => named(
                "authentication.k8s.io",
                "selfsubjectreviews",
                "",
                "",
                "",
                "create",
            ),
            _ => Attributes {
                user: user.clone(),
                verb: method.as_str().to_ascii_lowercase(),
                resource_request: false,
                path: path.into(),
                namespace: String::new(),
                group: String::new(),
                resource: String::new(),
                subresource: String::new(),
                name: String::new(),
            },
        }
    }

    /// The check of one `Impersonate-*` value.
    pub fn impersonate(
        user: &UserInfo,
        group: &str,
        resource: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Attributes {
        let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
        Attributes {
            user: user.clone(),
            verb: "impersonate".into(),
            resource_request: true,
            path: String::new(),
            namespace: ns.unwrap_or("").into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
        }
    }

    /// upstream's `forbiddenMessage` wrapped by `NewForbidden`.
    pub fn forbidden(&self) -> ApiError {
        let user = &self.user.name;
        if !self.resource_request {
            return ApiError::Denied {
                group: String::new(),
                resource: String::new(),
                name: String::new(),
                message: format!(
                    "forbidden: User {user:?} cannot {} path {:?}",
                    self.verb, self.path
                ),
            };
        }
        let mut resource = self.resource.clone();
        if !self.subresource.is_empty() {
            resource = format!("{resource}/{}", self.subresource);
        }
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", self.namespace)
        };
        let why = format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} {scope}",
            self.verb, self.group
        );
        let qualified = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        let message = if self.name.is_empty() {
            format!("{qualified} is forbidden: {why}")
        } else {
            format!("{qualified} {:?} is forbidden: {why}", self.name)
        };
        ApiError::Denied {
            group: self.group.clone(),
            resource: self.resource.clone(),
            name: self.name.clone(),
            message,
        }
    }
}

fn strings<'a>(rule: &'a Value, field: &str) -> Vec<&'a str> {
    rule.get(field)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// upstream `RuleAllows`: whether one PolicyRule (as JSON) allows the request.
pub fn rule_allows(attrs: &Attributes, rule: &Value) -> bool {
    let verbs = strings(rule, "verbs");
    if !verbs.iter().any(|v| *v == "*" || *v == attrs.verb) {
        return false;
    }
    if !attrs.resource_request {
        return strings(rule, "nonResourceURLs").iter().any(|u| {
            *u == "*"
                || *u == attrs.path
                || u.strip_suffix('*')
                    .is_some_and(|p| attrs.path.starts_with(p))
        });
    }
    let groups = strings(rule, "apiGroups");
    if !groups.iter().any(|g| *g == "*" || *g == attrs.group) {
        return false;
    }
    let combined = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let resource_ok = strings(rule, "resources").iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    if !resource_ok {
        return false;
    }
    let names = strings(rule, "resourceNames");
    names.is_empty() || names.contains(&attrs.name.as_str())
}

/// upstream `appliesToUser`: whether a binding's subject is this user. `namespace` is the
/// binding's (the default namespace of a ServiceAccount subject).
pub fn subject_matches(user: &UserInfo, subject: &Value, namespace: &str) -> bool {
    let s = |f: &str| subject.get(f).and_then(Value::as_str).unwrap_or("");
    match s("kind") {
        "User" => user.name == s("name"),
        "Group" => user.groups.iter().any(|g| g == s("name")),
        "ServiceAccount" => {
            let ns = if s("namespace").is_empty() {
                namespace
            } else {
                s("namespace")
            };
            user.name == format!("system:serviceaccount:{ns}:{}", s("name"))
        }
        _ => false,
    }
}

fn rbac_res(plural: &str) -> Result<&'static ResourceInfo, ApiError> {
    registry::lookup("rbac.authorization.k8s.io", "v1", plural)
        .ok_or_else(|| ApiError::Internal(format!("{plural} are not registered")))
}

/// One binding that applies to a user, with the rules of the role it grants.
pub struct Grant {
    /// `ClusterRoleBinding "x" of ClusterRole "y"`, for review reasons.
    pub describe: String,
    pub rules: Vec<Value>,
}

/// Every binding that applies to `user` at cluster scope and (when given) in `namespace`,
/// with its role's rules. A binding whose role is missing grants nothing.
pub async fn grants(
    state: &SharedState,
    user: &UserInfo,
    namespace: &str,
) -> Result<Vec<Grant>, ApiError> {
    let mut out = Vec::new();
    let crb = rbac_res("clusterrolebindings")?;
    let cr = rbac_res("clusterroles")?;
    let rb = rbac_res("rolebindings")?;
    let role = rbac_res("roles")?;
    let mut bindings: Vec<(Value, &str)> = state
        .store
        .list(&crb.prefix())
        .await?
        .items
        .into_iter()
        .map(|b| (b, ""))
        .collect();
    if !namespace.is_empty() {
        bindings.extend(
            state
                .store
                .list(&rb.ns_prefix(Some(namespace)))
                .await?
                .items
                .into_iter()
                .map(|b| (b, namespace)),
        );
    }
    for (b, ns) in bindings {
        let subjects = b.get("subjects").and_then(Value::as_array);
        if !subjects.is_some_and(|s| s.iter().any(|s| subject_matches(user, s, ns))) {
            continue;
        }
        let r = |f: &str| {
            b.pointer(&format!("/roleRef/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let (role_res, role_ns) = match r("kind") {
            "ClusterRole" => (cr, None),
            "Role" if !ns.is_empty() => (role, Some(ns)),
            _ => continue,
        };
        let Some(role_obj) = state.store.get(&role_res.key(role_ns, r("name"))).await? else {
            continue;
        };
        let rules = role_obj
            .get("rules")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let name = b
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let describe = if ns.is_empty() {
            format!(
                "ClusterRoleBinding {name:?} of {} {:?}",
                r("kind"),
                r("name")
            )
        } else {
            format!(
                "RoleBinding \"{ns}/{name}\" of {} {:?}",
                r("kind"),
                r("name")
            )
        };
        out.push(Grant { describe, rules });
    }
    Ok(out)
}

/// Why the request is allowed (`None`: RBAC has no rule for it).
pub async fn decide(state: &SharedState, attrs: &Attributes) -> Result<Option<String>, ApiError> {
    if attrs.user.is_master() {
        return Ok(Some(format!(
            "the user is in the {:?} group",
            super::MASTERS
        )));
    }
    for g in grants(state, &attrs.user, &attrs.namespace).await? {
        if g.rules.iter().any(|r| rule_allows(attrs, r)) {
            return Ok(Some(format!(
                "RBAC: allowed by {} to User {:?}",
                g.describe, attrs.user.name
            )));
        }
    }
    Ok(None)
}

/// Allows the request or answers upstream's 403.
pub async fn authorize(state: &SharedState, attrs: &Attributes) -> Result<(), ApiError> {
    match decide(state, attrs).await? {
        Some(_) => Ok(()),
        None => Err(attrs.forbidden()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        }
    }

    fn attrs(
        verb: &str,
        group: &str,
        resource: &str,
        sub: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            user: user("u", &[]),
            verb: verb.into(),
            resource_request: true,
            path: String::new(),
            namespace: ns.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
        }
    }

    #[test]
    fn rules_match_as_upstream() {
        let pods = json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]});
        assert!(rule_allows(&attrs("get", "", "pods", "", "ns", "p"), &pods));
        assert!(!rule_allows(
            &attrs("create", "", "pods", "", "ns", ""),
            &pods
        ));
        assert!(!rule_allows(
            &attrs("get", "apps", "pods", "", "ns", "p"),
            &pods
        ));
        // A subresource is matched only by its own name or `*/sub`.
        assert!(!rule_allows(
            &attrs("get", "", "pods", "status", "ns", "p"),
            &pods
        ));
        let status = json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*/status"]});
        assert!(rule_allows(
            &attrs("patch", "apps", "deployments", "status", "", "d"),
            &status
        ));
        assert!(!rule_allows(
            &attrs("patch", "apps", "deployments", "", "", "d"),
            &status
        ));
        let named = json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"]});
        assert!(rule_allows(
            &attrs("get", "", "configmaps", "", "ns", "a"),
            &named
        ));
        assert!(!rule_allows(
            &attrs("get", "", "configmaps", "", "ns", "b"),
            &named
        ));
        assert!(!rule_allows(
            &attrs("list", "", "configmaps", "", "ns", ""),
            &named
        ));
        let all = json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]});
        assert!(rule_allows(
            &attrs("deletecollection", "x.io", "things", "scale", "", ""),
            &all
        ));
        let mut health = attrs("get", "", "", "", "", "");
        health.resource_request = false;
        health.path = "/healthz/etcd".into();
        let urls = json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/healthz/*"]});
        assert!(rule_allows(&health, &urls));
        // Resource rules never match a path, nor path rules a resource.
        assert!(!rule_allows(&health, &all));
        assert!(!rule_allows(&attrs("get", "", "pods", "", "", ""), &urls));
    }

    #[test]
    fn subjects_match_users_groups_and_service_accounts() {
        let sa = user(
            "system:serviceaccount:kube-system:kube-proxy",
            &["system:serviceaccounts"],
        );
        assert!(subject_matches(
            &sa,
            &json!({"kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system"}),
            ""
        ));
        assert!(subject_matches(
            &sa,
            &json!({"kind": "ServiceAccount", "name": "kube-proxy"}),
            "kube-system"
        ));
        assert!(!subject_matches(
            &sa,
            &json!({"kind": "ServiceAccount", "name": "kube-proxy"}),
            "default"
        ));
        assert!(subject_matches(
            &sa,
            &json!({"kind": "Group", "name": "system:serviceaccounts"}),
            ""
        ));
        assert!(!subject_matches(
            &sa,
            &json!({"kind": "User", "name": "kube-proxy"}),
            ""
        ));
    }

    #[test]
    fn forbidden_messages_are_upstreams() {
        let mut a = attrs("list", "", "secrets", "", "other", "");
        a.user = user("system:serviceaccount:ns:sa", &[]);
        assert_eq!(
            a.forbidden().to_string(),
            "secrets is forbidden: User \"system:serviceaccount:ns:sa\" cannot list resource \"secrets\" in API group \"\" in the namespace \"other\""
        );
        let a = attrs("create", "discovery.k8s.io", "endpointslices", "", "", "x");
        assert_eq!(
            a.forbidden().to_string(),
            "endpointslices.discovery.k8s.io \"x\" is forbidden: User \"u\" cannot create resource \"endpointslices\" in API group \"discovery.k8s.io\" at the cluster scope"
        );
        let mut a = attrs("get", "", "", "", "", "");
        a.resource_request = false;
        a.path = "/metrics".into();
        assert_eq!(
            a.forbidden().to_string(),
            "forbidden: User \"u\" cannot get path \"/metrics\""
        );
    }
}
