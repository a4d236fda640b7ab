//! Strategic-merge metadata of the served kinds: which lists merge, and by which key.
//!
//! Taken from the `patchStrategy` / `patchMergeKey` struct tags of `k8s.io/api` (core/v1,
//! apps/v1, discovery/v1, meta/v1), which are also the OpenAPI extensions
//! `x-kubernetes-patch-strategy` / `x-kubernetes-patch-merge-key`. Anything not listed
//! behaves as an untagged field does upstream: maps merge key by key, lists are replaced.
//! `retainKeys` needs no entry: the `$retainKeys` directive in the patch drives it.

/// The type at a position in an object, as far as strategic merge cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    /// No tagged fields below: maps merge, lists replace.
    Any,
    /// A top-level object of a kind without tagged fields besides `metadata`.
    Object,
    ObjectMeta,
    Service,
    ServiceSpec,
    /// A `status` whose only tagged field is `conditions` (merge key `type`).
    ConditionsStatus,
    Pod,
    PodSpec,
    Container,
    PodStatus,
    PodTemplateSpec,
    Deployment,
    DeploymentSpec,
    StatefulSet,
    StatefulSetSpec,
    DaemonSet,
    DaemonSetSpec,
    Node,
    NodeSpec,
    NodeStatus,
    Namespace,
}

/// How a list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListStrategy {
    /// Untagged or atomic: the patch's list replaces the live one.
    Replace,
    /// `patchStrategy:"merge"` on a list of scalars: union, plus `$deleteFromPrimitiveList`.
    MergePrimitive,
    /// `patchStrategy:"merge" patchMergeKey:"<key>"` on a list of objects.
    MergeByKey(&'static str),
}

impl Ty {
    /// The root type for an object of `kind`.
    pub(crate) fn for_kind(kind: &str) -> Ty {
        match kind {
            "Service" => Ty::Service,
            "Pod" => Ty::Pod,
            "Deployment" => Ty::Deployment,
            "StatefulSet" => Ty::StatefulSet,
            "DaemonSet" => Ty::DaemonSet,
            "Node" => Ty::Node,
            "Namespace" => Ty::Namespace,
            "PodTemplate" => Ty::PodTemplateSpec,
            // Endpoints (subsets: untagged), EndpointSlice (endpoints, ports: atomic),
            // ConfigMap, Event and everything else: only metadata is tagged.
            _ => Ty::Object,
        }
    }

    /// The type of `field` inside this type (the element type for lists) and, for lists,
    /// how they merge.
    pub(crate) fn field(self, field: &str) -> (Ty, ListStrategy) {
        use ListStrategy::{MergeByKey, MergePrimitive, Replace};
        match (self, field) {
            (
                Ty::Object
                | Ty::Service
                | Ty::Pod
                | Ty::Deployment
                | Ty::StatefulSet
                | Ty::DaemonSet
                | Ty::Node
                | Ty::Namespace
                | Ty::PodTemplateSpec,
                "metadata",
            ) => (Ty::ObjectMeta, Replace),
            (Ty::ObjectMeta, "finalizers") => (Ty::Any, MergePrimitive),
            (Ty::ObjectMeta, "ownerReferences") => (Ty::Any, MergeByKey("uid")),

            (Ty::Service, "spec") => (Ty::ServiceSpec, Replace),
            (Ty::ServiceSpec, "ports") => (Ty::Any, MergeByKey("port")),
            (
                Ty::Service | Ty::Deployment | Ty::StatefulSet | Ty::DaemonSet | Ty::Namespace,
                "status",
            ) => (Ty::ConditionsStatus, Replace),
            (Ty::ConditionsStatus, "conditions") => (Ty::Any, MergeByKey("type")),

            (Ty::Pod | Ty::PodTemplateSpec, "spec") => (Ty::PodSpec, Replace),
            (Ty::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => {
                (Ty::Container, MergeByKey("name"))
            }
            (
                Ty::PodSpec,
                "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims",
            ) => (Ty::Any, MergeByKey("name")),
            (Ty::PodSpec, "hostAliases") => (Ty::Any, MergeByKey("ip")),
            (Ty::PodSpec, "topologySpreadConstraints") => (Ty::Any, MergeByKey("topologyKey")),
            (Ty::Container, "ports") => (Ty::Any, MergeByKey("containerPort")),
            (Ty::Container, "env") => (Ty::Any, MergeByKey("name")),
            (Ty::Container, "volumeMounts") => (Ty::Any, MergeByKey("mountPath")),
            (Ty::Container, "volumeDevices") => (Ty::Any, MergeByKey("devicePath")),
            (Ty::Pod, "status") => (Ty::PodStatus, Replace),
            (Ty::PodStatus, "conditions") => (Ty::Any, MergeByKey("type")),
            (Ty::PodStatus, "podIPs" | "hostIPs") => (Ty::Any, MergeByKey("ip")),
            (Ty::PodStatus, "resourceClaimStatuses") => (Ty::Any, MergeByKey("name")),

            (Ty::Deployment, "spec") => (Ty::DeploymentSpec, Replace),
            (Ty::StatefulSet, "spec") => (Ty::StatefulSetSpec, Replace),
            (Ty::DaemonSet, "spec") => (Ty::DaemonSetSpec, Replace),
            (Ty::DeploymentSpec | Ty::StatefulSetSpec | Ty::DaemonSetSpec, "template") => {
                (Ty::PodTemplateSpec, Replace)
            }

            (Ty::Node, "spec") => (Ty::NodeSpec, Replace),
            (Ty::NodeSpec, "podCIDRs") => (Ty::Any, MergePrimitive),
            (Ty::Node, "status") => (Ty::NodeStatus, Replace),
            (Ty::NodeStatus, "conditions" | "addresses") => (Ty::Any, MergeByKey("type")),

            _ => (Ty::Any, Replace),
        }
    }
}
