//! The structure server-side apply needs of the served kinds: which lists are associative
//! (and by which keys), which are sets, which maps and structs are atomic. This is the one
//! table of it.
//!
//! Taken from the `+listType`/`+listMapKey`/`+mapType`/`+structType` markers of `k8s.io/api`
//! (published by kube-apiserver as `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//! `x-kubernetes-map-type`), and, where a field has only `patchStrategy:"merge"` with a
//! `patchMergeKey` (env, volumes), the associative list upstream's schema converter derives
//! from them. k8s-openapi's schemas carry none of these. Anything not listed is a granular
//! map/struct, and a list without an entry is atomic, as upstream treats a list with no list
//! type (EndpointSlice `endpoints` and `ports`, tolerations, Endpoints `subsets`, a
//! container's `command`/`args`/`envFrom`, a Service's `clusterIPs`/`ipFamilies`).

/// A position in an object's type tree, as far as ownership cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// Nothing special below: maps are granular, lists atomic.
    Any,
    /// A top-level object of a kind with no listed fields besides metadata and status.
    Object,
    ObjectMeta,
    Status,
    Pod,
    PodSpec,
    Container,
    /// Deployment, ReplicaSet, StatefulSet, DaemonSet, Job: a spec with a pod template.
    Workload,
    WorkloadSpec,
    /// A `PodTemplate` object, or a workload's `spec.template`.
    PodTemplateHolder,
    PodTemplateSpec,
    Service,
    ServiceSpec,
    Node,
    NodeSpec,
    NetworkPolicy,
    NetworkPolicySpec,
}

/// How a list field's items are identified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType {
    /// Owned as a whole (`x-kubernetes-list-type: atomic`, or no list type).
    Atomic,
    /// Scalars identified by value (`set`).
    Set,
    /// Objects identified by their key fields (`map`); a key may have a default value that
    /// upstream's schema supplies when the item omits it.
    Map(&'static [(&'static str, Option<&'static str>)]),
}

/// What a field is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The type of the field's value (of its items, for lists).
    pub ty: Ty,
    /// For lists, how items are identified.
    pub list: ListType,
    /// A map or struct owned as a whole (`mapType`/`structType: atomic`).
    pub atomic: bool,
}

const fn of(ty: Ty) -> Field {
    Field {
        ty,
        list: ListType::Atomic,
        atomic: false,
    }
}

const fn keyed(ty: Ty, keys: &'static [(&'static str, Option<&'static str>)]) -> Field {
    Field {
        ty,
        list: ListType::Map(keys),
        atomic: false,
    }
}

const ATOMIC: Field = Field {
    ty: Ty::Any,
    list: ListType::Atomic,
    atomic: true,
};
const SET: Field = Field {
    ty: Ty::Any,
    list: ListType::Set,
    atomic: false,
};

const NAME: &[(&str, Option<&str>)] = &[("name", None)];
const TYPE: &[(&str, Option<&str>)] = &[("type", None)];
const IP: &[(&str, Option<&str>)] = &[("ip", None)];

impl Ty {
    /// The root type of an object of `kind`.
    pub fn for_kind(kind: &str) -> Ty {
        match kind {
            "Pod" => Ty::Pod,
            "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Job" => Ty::Workload,
            "PodTemplate" => Ty::PodTemplateHolder,
            "Service" => Ty::Service,
            "Node" => Ty::Node,
            "NetworkPolicy" => Ty::NetworkPolicy,
            _ => Ty::Object,
        }
    }

    fn is_root(self) -> bool {
        matches!(
            self,
            Ty::Object
                | Ty::Pod
                | Ty::Workload
                | Ty::PodTemplateHolder
                | Ty::Service
                | Ty::Node
                | Ty::NetworkPolicy
        )
    }

    /// What `name` is inside a value of this type.
    pub fn field(self, name: &str) -> Field {
        match (self, name) {
            (t, "metadata") if t.is_root() || t == Ty::PodTemplateSpec => of(Ty::ObjectMeta),
            (t, "status") if t.is_root() => of(Ty::Status),
            (Ty::ObjectMeta, "finalizers") => SET,
            (Ty::ObjectMeta, "ownerReferences") => keyed(Ty::Any, &[("uid", None)]),

            (Ty::Status, "conditions" | "addresses") => keyed(Ty::Any, TYPE),
            (Ty::Status, "podIPs" | "hostIPs") => keyed(Ty::Any, IP),

            (Ty::Pod, "spec") | (Ty::PodTemplateSpec, "spec") => of(Ty::PodSpec),
            (Ty::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => {
                keyed(Ty::Container, NAME)
            }
            (
                Ty::PodSpec,
                "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims",
            ) => keyed(Ty::Any, NAME),
            (Ty::PodSpec, "hostAliases") => keyed(Ty::Any, IP),
            (Ty::PodSpec, "topologySpreadConstraints") => keyed(
                Ty::Any,
                &[("topologyKey", None), ("whenUnsatisfiable", None)],
            ),
            (Ty::PodSpec, "nodeSelector") => ATOMIC,
            (Ty::Container, "ports") => keyed(
                Ty::Any,
                &[("containerPort", None), ("protocol", Some("\"TCP\""))],
            ),
            (Ty::Container, "env") => keyed(Ty::Any, NAME),
            (Ty::Container, "volumeMounts") => keyed(Ty::Any, &[("mountPath", None)]),
            (Ty::Container, "volumeDevices") => keyed(Ty::Any, &[("devicePath", None)]),

            (Ty::Workload, "spec") => of(Ty::WorkloadSpec),
            (Ty::WorkloadSpec, "template") | (Ty::PodTemplateHolder, "template") => {
                of(Ty::PodTemplateSpec)
            }
            // LabelSelector is `structType=atomic`.
            (Ty::WorkloadSpec, "selector") => ATOMIC,

            (Ty::Service, "spec") => of(Ty::ServiceSpec),
            (Ty::ServiceSpec, "ports") => {
                keyed(Ty::Any, &[("port", None), ("protocol", Some("\"TCP\""))])
            }
            (Ty::ServiceSpec, "selector") => ATOMIC,

            (Ty::Node, "spec") => of(Ty::NodeSpec),
            (Ty::NodeSpec, "podCIDRs") => SET,

            (Ty::NetworkPolicy, "spec") => of(Ty::NetworkPolicySpec),
            (Ty::NetworkPolicySpec, "podSelector") => ATOMIC,

            _ => of(Ty::Any),
        }
    }
}
