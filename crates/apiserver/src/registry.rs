//! The table of served resources: one row per resource, the only place kinds are listed.

/// One served resource.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceInfo {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Served subresources (`status`, `scale`, `log`).
    pub subresources: &'static [&'static str],
}

const ALL: &[&str] = &["all"];
/// The verbs of every served resource but namespaces.
const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Namespaces have no collection delete (upstream serves none: a namespace is removed only
/// by name).
const NAMESPACE_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

macro_rules! res {
    ($g:expr, $v:expr, $kind:expr, $plural:expr, $singular:expr, $ns:expr, $short:expr, $cat:expr, $sub:expr) => {
        ResourceInfo {
            group: $g,
            version: $v,
            kind: $kind,
            plural: $plural,
            singular: $singular,
            namespaced: $ns,
            short_names: $short,
            categories: $cat,
            subresources: $sub,
        }
    };
}

/// Every served resource. Order is discovery order.
pub static RESOURCES: &[ResourceInfo] = &[
    res!(
        "",
        "v1",
        "Namespace",
        "namespaces",
        "namespace",
        false,
        &["ns"],
        &[],
        &["status"]
    ),
    res!(
        "",
        "v1",
        "Node",
        "nodes",
        "node",
        false,
        &["no"],
        &[],
        &["status"]
    ),
    res!(
        "",
        "v1",
        "Pod",
        "pods",
        "pod",
        true,
        &["po"],
        ALL,
        &["status", "log", "exec", "attach", "portforward"]
    ),
    res!(
        "",
        "v1",
        "Service",
        "services",
        "service",
        true,
        &["svc"],
        ALL,
        &["status"]
    ),
    res!(
        "",
        "v1",
        "Endpoints",
        "endpoints",
        "endpoints",
        true,
        &["ep"],
        &[],
        &[]
    ),
    res!(
        "",
        "v1",
        "Event",
        "events",
        "event",
        true,
        &["ev"],
        &[],
        &[]
    ),
    res!(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        "configmap",
        true,
        &["cm"],
        &[],
        &[]
    ),
    res!(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
        &["sa"],
        &[],
        &[]
    ),
    res!(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &["deploy"],
        ALL,
        &["status", "scale"]
    ),
    res!(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
        &["sts"],
        ALL,
        &["status", "scale"]
    ),
    res!(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &["ds"],
        ALL,
        &["status"]
    ),
    res!(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        &["rs"],
        ALL,
        &["status", "scale"]
    ),
    res!(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        "event",
        true,
        &["ev"],
        &[],
        &[]
    ),
    res!(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        "networkpolicy",
        true,
        &["netpol"],
        &[],
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        "role",
        true,
        &[],
        &[],
        &[]
    ),
];

impl ResourceInfo {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `services` or `deployments.apps`, as Status messages name resources.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn verbs(&self) -> &'static [&'static str] {
        if self.group.is_empty() && self.kind == "Namespace" {
            NAMESPACE_VERBS
        } else {
            VERBS
        }
    }

    /// Whether the resource serves `verb` (one of discovery's verb names).
    pub fn allows(&self, verb: &str) -> bool {
        self.verbs().contains(&verb)
    }

    pub fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }

    /// The store prefix of every object of this resource (`/core/services/`).
    pub fn prefix(&self) -> String {
        let (group, plural) = crate::conversion::stored_as(self);
        let group = if group.is_empty() { "core" } else { group };
        format!("/{group}/{plural}/")
    }

    /// The store prefix of this resource in one namespace (or all, with `None`).
    pub fn ns_prefix(&self, namespace: Option<&str>) -> String {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => format!("{}{ns}/", self.prefix()),
            _ => self.prefix(),
        }
    }

    /// The store key of a list's position given relative to the resource (`namespace/name`
    /// when namespaced, else `name`, as continue tokens carry it; a trailing NUL stays).
    pub fn list_key(&self, relative: &str) -> String {
        if self.namespaced {
            format!("{}{relative}", self.prefix())
        } else {
            format!("{}/{relative}", self.prefix())
        }
    }

    /// The store key of a stored object.
    pub fn object_key(&self, object: &serde_json::Value) -> String {
        self.key(
            crate::objects::meta_str(object, "namespace"),
            crate::objects::name_of(object),
        )
    }

    /// The store key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        let ns = if self.namespaced {
            namespace.unwrap_or("")
        } else {
            ""
        };
        format!("{}{ns}/{name}", self.prefix())
    }
}

/// Looks a resource up by group, version and plural.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Looks a resource up by group and kind.
pub fn by_kind(group: &str, kind: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.kind == kind)
}

/// Served group-versions, in discovery order (core `v1` first).
pub fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_prefixes() {
        let svc = lookup("", "v1", "services").unwrap();
        assert_eq!(svc.key(Some("default"), "a"), "/core/services/default/a");
        assert!(
            svc.key(Some("default"), "a")
                .starts_with(&svc.ns_prefix(Some("default")))
        );
        assert_eq!(svc.ns_prefix(None), "/core/services/");
        let ns = lookup("", "v1", "namespaces").unwrap();
        assert_eq!(
            ns.key(Some("ignored"), "kube-system"),
            "/core/namespaces//kube-system"
        );
        let dep = by_kind("apps", "Deployment").unwrap();
        assert_eq!(dep.qualified(), "deployments.apps");
        assert_eq!(dep.api_version(), "apps/v1");
        assert_eq!(group_versions()[0], ("", "v1"));
    }

    #[test]
    fn plurals_are_unique_per_group_version() {
        for (i, a) in RESOURCES.iter().enumerate() {
            for b in &RESOURCES[i + 1..] {
                assert!(!(a.group == b.group && a.version == b.version && a.plural == b.plural));
            }
        }
    }
}
