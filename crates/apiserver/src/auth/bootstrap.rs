//! The default ClusterRoles and ClusterRoleBindings, created at every start as upstream's
//! bootstrap policy (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`), for the
//! kinds svcnet serves: `cluster-admin` (bound to `system:masters`), the user-facing `admin`,
//! `edit` and `view` (with their aggregated rules written out), the discovery roles every
//! authenticated user holds, and the add-ons' roles (`system:node-proxier`, `system:coredns`).
//!
//! Like upstream's reconciler for objects annotated `rbac.authorization.kubernetes.io/
//! autoupdate: "true"`, a start brings their rules and subjects back to these.

use serde_json::{Value, json};

use crate::registry;
use crate::state::SharedState;
use crate::status::ApiError;

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn urls(paths: &[&str], verbs: &[&str]) -> Value {
    json!({"nonResourceURLs": paths, "verbs": verbs})
}

fn meta(name: &str) -> Value {
    json!({
        "name": name,
        "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    })
}

/// `view`: reads of everything in a namespace but Secrets (and RBAC).
fn view_rules() -> Vec<Value> {
    vec![
        rule(
            &[""],
            &[
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "pods",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/status",
            ],
            READ,
        ),
        rule(
            &[""],
            &[
                "bindings",
                "events",
                "limitranges",
                "namespaces/status",
                "pods/log",
                "pods/status",
                "replicationcontrollers/status",
                "resourcequotas",
                "resourcequotas/status",
            ],
            READ,
        ),
        rule(&[""], &["namespaces"], READ),
        rule(&["discovery.k8s.io"], &["endpointslices"], READ),
        rule(
            &["apps"],
            &[
                "controllerrevisions",
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
                "statefulsets",
                "statefulsets/scale",
                "statefulsets/status",
            ],
            READ,
        ),
        rule(
            &["networking.k8s.io"],
            &["ingresses", "ingresses/status", "networkpolicies"],
            READ,
        ),
    ]
}

/// `edit`: `view`, plus writes of the namespace's workloads, services and configuration, and
/// reads of Secrets; no RBAC.
fn edit_rules() -> Vec<Value> {
    let mut rules = vec![
        rule(
            &[""],
            &[
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
                "secrets",
                "services/proxy",
            ],
            READ,
        ),
        rule(&[""], &["serviceaccounts"], &["impersonate"]),
        rule(
            &[""],
            &[
                "pods",
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
            ],
            WRITE,
        ),
        rule(&[""], &["pods/eviction"], &["create"]),
        rule(
            &[""],
            &[
                "configmaps",
                "endpoints",
                "events",
                "persistentvolumeclaims",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "secrets",
                "serviceaccounts",
                "services",
                "services/proxy",
            ],
            WRITE,
        ),
        rule(&[""], &["serviceaccounts/token"], &["create"]),
        rule(&["discovery.k8s.io"], &["endpointslices"], WRITE),
        rule(
            &["apps"],
            &[
                "daemonsets",
                "deployments",
                "deployments/rollback",
                "deployments/scale",
                "replicasets",
                "replicasets/scale",
                "statefulsets",
                "statefulsets/scale",
            ],
            WRITE,
        ),
        rule(
            &["networking.k8s.io"],
            &["ingresses", "networkpolicies"],
            WRITE,
        ),
        rule(&["coordination.k8s.io"], &["leases"], READ),
        rule(&["coordination.k8s.io"], &["leases"], WRITE),
    ];
    rules.extend(view_rules());
    rules
}

/// `admin`: `edit`, plus Roles and RoleBindings of the namespace.
fn admin_rules() -> Vec<Value> {
    let mut rules = vec![
        rule(
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
            &["create"],
        ),
        rule(
            &["rbac.authorization.k8s.io"],
            &["rolebindings", "roles"],
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ],
        ),
    ];
    rules.extend(edit_rules());
    rules
}

/// The default ClusterRoles, by name.
pub fn cluster_roles() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        (
            "cluster-admin",
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
        ),
        ("admin", admin_rules()),
        ("edit", edit_rules()),
        ("view", view_rules()),
        (
            "system:discovery",
            vec![urls(
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
                &["get"],
            )],
        ),
        (
            "system:basic-user",
            vec![
                rule(
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                    &["create"],
                ),
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
            ],
        ),
        (
            "system:public-info-viewer",
            vec![urls(
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
                &["get"],
            )],
        ),
        (
            "system:node-proxier",
            vec![
                rule(&[""], &["endpoints", "services"], &["list", "watch"]),
                rule(&[""], &["nodes"], READ),
                rule(
                    &["", "events.k8s.io"],
                    &["events"],
                    &["create", "patch", "update"],
                ),
                rule(
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                    &["list", "watch"],
                ),
            ],
        ),
        (
            "system:coredns",
            vec![
                rule(
                    &[""],
                    &["endpoints", "services", "pods", "namespaces"],
                    &["list", "watch"],
                ),
                rule(
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                    &["list", "watch"],
                ),
            ],
        ),
    ]
}

/// The default ClusterRoleBindings: (name, role, subjects).
pub fn cluster_role_bindings() -> Vec<(&'static str, &'static str, Vec<Value>)> {
    let group =
        |g: &str| json!({"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": g});
    let user =
        |u: &str| json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u});
    vec![
        (
            "cluster-admin",
            "cluster-admin",
            vec![group(super::MASTERS)],
        ),
        (
            "system:discovery",
            "system:discovery",
            vec![group(super::AUTHENTICATED)],
        ),
        (
            "system:basic-user",
            "system:basic-user",
            vec![group(super::AUTHENTICATED)],
        ),
        (
            "system:public-info-viewer",
            "system:public-info-viewer",
            vec![group(super::AUTHENTICATED), group("system:unauthenticated")],
        ),
        (
            "system:node-proxier",
            "system:node-proxier",
            vec![user("system:kube-proxy")],
        ),
    ]
}

/// Creates (or brings back) the default roles and bindings, and the bootstrap namespaces'
/// `default` ServiceAccounts.
pub async fn run(state: &SharedState) -> Result<(), ApiError> {
    let lookup = |plural: &str| {
        registry::lookup("rbac.authorization.k8s.io", "v1", plural)
            .ok_or_else(|| ApiError::Internal(format!("{plural} are not registered")))
    };
    let roles = lookup("clusterroles")?;
    let bindings = lookup("clusterrolebindings")?;
    for (name, rules) in cluster_roles() {
        let obj = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": meta(name), "rules": rules,
        });
        crate::bootstrap::ensure(state, roles, obj, &["rules"], true).await?;
    }
    for (name, role, subjects) in cluster_role_bindings() {
        let obj = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": meta(name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": subjects,
        });
        crate::bootstrap::ensure(state, bindings, obj, &["subjects"], true).await?;
    }
    // The bootstrap namespaces have their accounts before the server answers.
    super::serviceaccounts::reconcile(state).await
}
