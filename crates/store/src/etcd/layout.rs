//! [`KeyLayout`]: svcnet's store keys in kube-apiserver's etcd key layout, and back.
//!
//! svcnet's keys are `/{group-or-core}/{plural}/{namespace-or-empty}/{name}` (a cluster-scoped
//! object has an empty namespace: `/core/namespaces//kube-system`), and the API server lists
//! and watches by the prefixes `/`, `/{group}/{plural}/` and `/{group}/{plural}/{namespace}/`.
//! kube-apiserver keeps the same objects at `{prefix}/{resource}/{namespace}/{name}`, or
//! `{prefix}/{resource}/{name}` when cluster-scoped, with a few legacy resource paths
//! (`services/specs`, `services/endpoints`, `minions`, `controllers`, `ingress`) and
//! `{group}/{plural}` for groups that are not kube's own (its layout for custom resources).
//! The translation is a bijection on those shapes, so the handlers never see etcd keys.

use crate::StoreError;

/// Resource paths that are not simply the plural (kube's `SpecialDefaultResourcePrefixes`
/// and the groups it keeps under their own name): `(group, plural, path)`.
const SPECIAL: &[(&str, &str, &str)] = &[
    ("core", "services", "services/specs"),
    ("core", "endpoints", "services/endpoints"),
    ("core", "nodes", "minions"),
    ("core", "replicationcontrollers", "controllers"),
    ("networking.k8s.io", "ingresses", "ingress"),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "apiextensions.k8s.io/customresourcedefinitions",
    ),
    (
        "apiregistration.k8s.io",
        "apiservices",
        "apiregistration.k8s.io/apiservices",
    ),
];

/// Groups kube-apiserver serves itself: their resources live at `{prefix}/{plural}`.
const KUBE_GROUPS: &[&str] = &[
    "core",
    "apps",
    "batch",
    "autoscaling",
    "policy",
    "discovery.k8s.io",
    "networking.k8s.io",
    "coordination.k8s.io",
    "events.k8s.io",
    "rbac.authorization.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "node.k8s.io",
    "certificates.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "admissionregistration.k8s.io",
    "resource.k8s.io",
    "internal.apiserver.k8s.io",
    "storagemigration.k8s.io",
];

/// The group of a plural at `{prefix}/{plural}` outside the core group, for the way back
/// (the plurals svcnet serves and their neighbours in kube's groups).
const GROUP_OF: &[(&str, &str)] = &[
    ("deployments", "apps"),
    ("statefulsets", "apps"),
    ("replicasets", "apps"),
    ("daemonsets", "apps"),
    ("controllerrevisions", "apps"),
    ("jobs", "batch"),
    ("cronjobs", "batch"),
    ("horizontalpodautoscalers", "autoscaling"),
    ("poddisruptionbudgets", "policy"),
    ("endpointslices", "discovery.k8s.io"),
    ("networkpolicies", "networking.k8s.io"),
    ("ingressclasses", "networking.k8s.io"),
    ("ipaddresses", "networking.k8s.io"),
    ("servicecidrs", "networking.k8s.io"),
    ("leases", "coordination.k8s.io"),
    ("roles", "rbac.authorization.k8s.io"),
    ("rolebindings", "rbac.authorization.k8s.io"),
    ("clusterroles", "rbac.authorization.k8s.io"),
    ("clusterrolebindings", "rbac.authorization.k8s.io"),
    ("priorityclasses", "scheduling.k8s.io"),
    ("storageclasses", "storage.k8s.io"),
    ("csinodes", "storage.k8s.io"),
    ("csidrivers", "storage.k8s.io"),
    ("volumeattachments", "storage.k8s.io"),
    ("runtimeclasses", "node.k8s.io"),
    ("certificatesigningrequests", "certificates.k8s.io"),
    ("flowschemas", "flowcontrol.apiserver.k8s.io"),
    (
        "prioritylevelconfigurations",
        "flowcontrol.apiserver.k8s.io",
    ),
    (
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io",
    ),
    (
        "validatingwebhookconfigurations",
        "admissionregistration.k8s.io",
    ),
];

/// Maps svcnet keys and prefixes to etcd keys under a root (`--etcd-prefix`, default
/// `/registry`) and etcd keys back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    /// The root without a trailing `/` (`/registry`).
    root: String,
}

impl Default for KeyLayout {
    fn default() -> Self {
        KeyLayout {
            root: "/registry".into(),
        }
    }
}

impl KeyLayout {
    /// A layout under `prefix` (kube-apiserver's `--etcd-prefix`); a trailing `/` is ignored.
    pub fn new(prefix: &str) -> Result<Self, StoreError> {
        let root = prefix.trim_end_matches('/');
        if !root.starts_with('/') || root.contains("//") {
            return Err(StoreError::InvalidObject {
                key: prefix.into(),
                reason: "the etcd prefix starts with '/' and has no empty segment".into(),
            });
        }
        Ok(KeyLayout { root: root.into() })
    }

    /// The root every key is under, with its trailing `/` (`/registry/`).
    pub fn root(&self) -> String {
        format!("{}/", self.root)
    }

    /// The etcd path of a resource under the root (`services/specs`, `deployments`,
    /// `example.com/widgets`).
    pub fn resource_path(group: &str, plural: &str) -> String {
        let group = if group.is_empty() { "core" } else { group };
        if let Some((_, _, path)) = SPECIAL.iter().find(|(g, p, _)| *g == group && *p == plural) {
            return (*path).to_string();
        }
        if KUBE_GROUPS.contains(&group) {
            plural.to_string()
        } else {
            format!("{group}/{plural}")
        }
    }

    /// The etcd key of one object (`/core/services/default/a` →
    /// `/registry/services/specs/default/a`, `/core/namespaces//kube-system` →
    /// `/registry/namespaces/kube-system`).
    pub fn key(&self, key: &str) -> Result<String, StoreError> {
        let invalid = || StoreError::InvalidObject {
            key: key.into(),
            reason: "store keys are /{group}/{resource}/{namespace-or-empty}/{name}".into(),
        };
        let (group, plural, tail) = split(key).ok_or_else(invalid)?;
        let (ns, name) = tail.split_once('/').ok_or_else(invalid)?;
        if name.is_empty() || name.contains('/') || ns.contains('\0') || name.contains('\0') {
            return Err(invalid());
        }
        let path = Self::resource_path(group, plural);
        Ok(if ns.is_empty() {
            format!("{}/{path}/{name}", self.root)
        } else {
            format!("{}/{path}/{ns}/{name}", self.root)
        })
    }

    /// The etcd prefix of a list or watch prefix: `/` (everything under the root),
    /// `/{group}/{plural}/` (one resource) or anything longer (one namespace, or keys starting
    /// with a name).
    pub fn prefix(&self, prefix: &str) -> Result<String, StoreError> {
        if prefix == "/" {
            return Ok(self.root());
        }
        let (group, plural, tail) = split(prefix).ok_or_else(|| StoreError::InvalidObject {
            key: prefix.into(),
            reason: "etcd lists and watches the whole store (/) or within one resource \
                     (/{group}/{resource}/...)"
                .into(),
        })?;
        // A cluster-scoped prefix has the empty namespace segment that etcd keys lack.
        let tail = tail.strip_prefix('/').unwrap_or(tail);
        Ok(format!(
            "{}/{}/{tail}",
            self.root,
            Self::resource_path(group, plural)
        ))
    }

    /// The svcnet key of an etcd key, when it is one of the layout's.
    pub fn from_etcd(&self, etcd_key: &str) -> Option<String> {
        let rest = etcd_key.strip_prefix(&self.root)?.strip_prefix('/')?;
        let (group, plural, tail) = SPECIAL
            .iter()
            .find_map(|(g, p, path)| {
                let tail = rest.strip_prefix(path)?.strip_prefix('/')?;
                Some((g.to_string(), p.to_string(), tail))
            })
            .or_else(|| {
                let (first, after) = rest.split_once('/')?;
                if first.contains('.') {
                    let (plural, tail) = after.split_once('/')?;
                    Some((first.to_string(), plural.to_string(), tail))
                } else {
                    let group = GROUP_OF
                        .iter()
                        .find(|(p, _)| *p == first)
                        .map_or("core", |(_, g)| g);
                    Some((group.to_string(), first.to_string(), after))
                }
            })?;
        if tail.is_empty() {
            return None;
        }
        Some(if tail.contains('/') {
            format!("/{group}/{plural}/{tail}")
        } else {
            format!("/{group}/{plural}//{tail}")
        })
    }
}

/// `/{group}/{plural}/{tail}` → its parts (the group and plural non-empty).
fn split(key: &str) -> Option<(&str, &str, &str)> {
    let rest = key.strip_prefix('/')?;
    let (group, rest) = rest.split_once('/')?;
    let (plural, tail) = rest.split_once('/')?;
    if group.is_empty() || plural.is_empty() {
        return None;
    }
    Some((group, plural, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_kube_apiserver() {
        let l = KeyLayout::default();
        let cases = [
            (
                "/core/services/default/a",
                "/registry/services/specs/default/a",
            ),
            (
                "/core/endpoints/default/a",
                "/registry/services/endpoints/default/a",
            ),
            ("/core/nodes//n1", "/registry/minions/n1"),
            (
                "/core/namespaces//kube-system",
                "/registry/namespaces/kube-system",
            ),
            ("/core/pods/ns/p", "/registry/pods/ns/p"),
            ("/core/events/ns/e", "/registry/events/ns/e"),
            (
                "/discovery.k8s.io/endpointslices/ns/s",
                "/registry/endpointslices/ns/s",
            ),
            ("/apps/deployments/ns/d", "/registry/deployments/ns/d"),
            ("/coordination.k8s.io/leases/ns/l", "/registry/leases/ns/l"),
            (
                "/networking.k8s.io/networkpolicies/ns/p",
                "/registry/networkpolicies/ns/p",
            ),
            (
                "/example.com/widgets/ns/w",
                "/registry/example.com/widgets/ns/w",
            ),
        ];
        for (svcnet, etcd) in cases {
            assert_eq!(l.key(svcnet).unwrap(), etcd, "{svcnet}");
            assert_eq!(l.from_etcd(etcd).as_deref(), Some(svcnet), "{etcd}");
        }
    }

    #[test]
    fn prefixes_and_roots() {
        let l = KeyLayout::new("/svc/").unwrap();
        assert_eq!(l.prefix("/").unwrap(), "/svc/");
        assert_eq!(l.prefix("/core/services/").unwrap(), "/svc/services/specs/");
        assert_eq!(
            l.prefix("/core/services/default/").unwrap(),
            "/svc/services/specs/default/"
        );
        assert_eq!(l.prefix("/core/namespaces/").unwrap(), "/svc/namespaces/");
        assert_eq!(
            l.prefix("/core/namespaces//ku").unwrap(),
            "/svc/namespaces/ku"
        );
        assert!(l.prefix("/core/").is_err());
        assert!(l.key("/core/services/default/").is_err());
        assert!(l.key("/core/services/a").is_err());
        assert!(l.key("/x/a").is_err());
        assert!(KeyLayout::new("registry").is_err());
        assert_eq!(l.from_etcd("/registry/pods/a/b"), None);
        assert_eq!(l.from_etcd("/svc/pods/"), None);
    }
}
