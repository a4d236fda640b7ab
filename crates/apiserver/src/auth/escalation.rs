//! upstream's RBAC escalation check (`pkg/registry/rbac`): a user may write a Role or
//! ClusterRole only with permissions they hold themselves (or the `escalate` verb on it), and a
//! binding only to a role whose permissions they hold (or the `bind` verb on that role).
//! Without it, anyone allowed to write RoleBindings could bind `cluster-admin`.

use serde_json::Value;

use super::UserInfo;
use super::rbac::{self, Attributes};
use super::string_list as strings;
use crate::registry::ResourceInfo;
use crate::state::SharedState;
use crate::status::ApiError;

const GROUP: &str = "rbac.authorization.k8s.io";

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted(items: &[String]) -> String {
    let q: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", q.join(" "))
}

/// One verb on one resource (or path): the unit a rule is covered in.
struct Atom {
    attrs: Attributes,
    describe: String,
}

/// The atoms of a PolicyRule, each with upstream's `CompactString`.
fn atoms(user: &UserInfo, rule: &Value) -> Vec<Atom> {
    let mut out = Vec::new();
    let urls = strings(rule, "nonResourceURLs");
    for verb in strings(rule, "verbs") {
        for url in &urls {
            let mut attrs = Attributes::impersonate(user, "", "", None, "");
            attrs.resource_request = false;
            attrs.verb = verb.clone();
            attrs.path = url.clone();
            let describe = format!(
                "{{NonResourceURLs:{}, Verbs:{}}}",
                go_quoted(std::slice::from_ref(url)),
                go_quoted(std::slice::from_ref(&verb))
            );
            out.push(Atom { attrs, describe });
        }
        for group in strings(rule, "apiGroups") {
            for resource in strings(rule, "resources") {
                let mut names = strings(rule, "resourceNames");
                let all_names = names.is_empty();
                if all_names {
                    names.push(String::new());
                }
                for name in names {
                    let mut attrs = Attributes::impersonate(user, &group, &resource, None, &name);
                    attrs.verb = verb.clone();
                    let names_part = if all_names {
                        String::new()
                    } else {
                        format!(", ResourceNames:{}", go_quoted(std::slice::from_ref(&name)))
                    };
                    let describe = format!(
                        "{{APIGroups:{}, Resources:{}{names_part}, Verbs:{}}}",
                        go_quoted(std::slice::from_ref(&group)),
                        go_quoted(std::slice::from_ref(&resource)),
                        go_quoted(std::slice::from_ref(&verb))
                    );
                    out.push(Atom { attrs, describe });
                }
            }
        }
    }
    out
}

/// The rules a role reference grants (`None` when the role does not exist).
async fn referenced_rules(
    state: &SharedState,
    kind: &str,
    name: &str,
    namespace: &str,
) -> Result<Option<Vec<Value>>, ApiError> {
    let (plural, ns) = match kind {
        "ClusterRole" => ("clusterroles", None),
        _ => ("roles", Some(namespace)),
    };
    let res = crate::registry::lookup(GROUP, "v1", plural)
        .ok_or_else(|| ApiError::Internal(format!("{plural} are not registered")))?;
    Ok(state.store.get(&res.key(ns, name)).await?.map(|r| {
        r.get("rules")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }))
}

/// Refuses `obj` (a Role, ClusterRole or binding about to be written by `user`) when it
/// grants more than `user` holds, as upstream's `ConfirmNoEscalation`.
pub async fn check(
    state: &SharedState,
    user: &UserInfo,
    res: &ResourceInfo,
    obj: &Value,
) -> Result<(), ApiError> {
    if res.group != GROUP || user.is_master() {
        return Ok(());
    }
    let meta = |f: &str| {
        obj.pointer(&format!("/metadata/{f}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (name, namespace) = (meta("name"), meta("namespace"));
    let allowed = |verb: &str, resource: &str, role: &str| {
        let mut a = Attributes::impersonate(user, GROUP, resource, Some(&namespace), role);
        a.verb = verb.into();
        a
    };
    let rules = match res.kind {
        "Role" | "ClusterRole" => {
            if rbac::decide(state, &allowed("escalate", res.plural, &name))
                .await?
                .is_some()
            {
                return Ok(());
            }
            obj.get("rules")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        }
        _ => {
            let kind = obj
                .pointer("/roleRef/kind")
                .and_then(Value::as_str)
                .unwrap_or("");
            let role = obj
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let plural = if kind == "ClusterRole" {
                "clusterroles"
            } else {
                "roles"
            };
            if rbac::decide(state, &allowed("bind", plural, role))
                .await?
                .is_some()
            {
                return Ok(());
            }
            match referenced_rules(state, kind, role, &namespace).await? {
                Some(rules) => rules,
                // upstream's rule resolver: a missing role is a 404.
                None => {
                    let plural = if kind == "ClusterRole" {
                        "clusterroles"
                    } else {
                        "roles"
                    };
                    return Err(ApiError::NotFound {
                        resource: format!("{plural}.{GROUP}"),
                        name: role.into(),
                    });
                }
            }
        }
    };
    let owner: Vec<Value> = rbac::grants(state, user, &namespace)
        .await?
        .into_iter()
        .flat_map(|g| g.rules)
        .collect();
    let missing: Vec<String> = rules
        .iter()
        .flat_map(|r| atoms(user, r))
        .filter(|a| !owner.iter().any(|o| rbac::rule_allows(&a.attrs, o)))
        .map(|a| a.describe)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(forbidden(res, &name, user, &missing))
    }
}

fn forbidden(res: &ResourceInfo, name: &str, user: &UserInfo, missing: &[String]) -> ApiError {
    ApiError::Denied {
        group: res.group.into(),
        resource: res.plural.into(),
        name: name.into(),
        message: format!(
            "{}.{} {name:?} is forbidden: user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
            res.plural,
            res.group,
            user.name,
            go_quoted(&user.groups),
            missing.join("\n")
        ),
    }
}

/// Before a non-master user's write of an RBAC object: the same request as a dry run gives
/// the object the write would store (after defaulting, and after a patch is applied), which
/// is then checked. A request the dry run refuses goes on to be refused the same way.
pub async fn guard(
    state: &SharedState,
    user: &UserInfo,
    req: &crate::request::ResourceRequest,
    headers: &axum::http::HeaderMap,
    body: &bytes::Bytes,
) -> Result<(), ApiError> {
    use crate::request::Verb;
    if req.resource.group != GROUP
        || user.is_master()
        || req.subresource.is_some()
        || !matches!(req.verb, Verb::Create | Verb::Update | Verb::Patch)
    {
        return Ok(());
    }
    let mut dry = req.clone();
    dry.query.dry_run = true;
    dry.query.dry_run_values = vec!["All".into()];
    // The object itself, whatever representation the client asked for.
    let mut headers = headers.clone();
    headers.insert(
        axum::http::header::ACCEPT,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let resp = crate::handlers::handle(state.clone(), dry, headers, body.clone()).await?;
    if !resp.status().is_success() {
        return Ok(());
    }
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map_err(|e| ApiError::Internal(format!("reading a dry run's answer: {e}")))?
        .to_bytes();
    let obj: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::Internal(format!("a dry run's answer: {e}")))?;
    check(state, user, req.resource, &obj).await
}
