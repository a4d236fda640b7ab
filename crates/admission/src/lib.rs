//! Pure admission: defaulting, validation and IP/port allocation for API
//! objects, as a Kubernetes API server does it.
//!
//! The API server hands every create and update to [`admit_create`] /
//! [`admit_update`] with the object's `kind`; admission returns the object to
//! store (defaulted, with cluster IPs, node ports and load-balancer ingress
//! filled in) or the list of [`FieldError`]s a 422 `Status` carries, with
//! upstream's messages. Services take their addresses from [`Allocators`], a
//! working copy the API server loads from the stored allocation ranges
//! ([`Allocators::load_range`], kube's `RangeAllocation` objects) for each
//! Service write; it stores what changed itself, and its repair loop
//! [`Allocators::rebuild`]s the ranges from the stored services.
//!
//! This crate never does I/O, never reads the clock and never spawns: it is
//! a function of its inputs, which is what lets it be tested exhaustively.
//! Objects are decoded into k8s-openapi types, which prunes unknown fields
//! the way a real API server does.

mod alloc;
mod apps;
mod codec;
mod endpoints;
mod error;
mod misc;
mod networkpolicy;
mod pod;
mod rbac;
mod service;
pub mod syntax;

use serde_json::Value;

pub use alloc::{
    AdmissionConfig, AllocError, Allocation, Allocators, DEFAULT_DNS_IP, DEFAULT_LB_POOL,
    DEFAULT_SERVICE_CIDR, LB_IPS, MAX_RANGE_BITS, NODE_PORTS, Protocol, SECONDARY_SERVICE_IPS,
    SERVICE_IPS, StoredRangeError, family_of,
};
pub use endpoints::{MAX_SLICE_ADDRESSES, MAX_SLICE_ENDPOINTS, MAX_SLICE_PORTS};
pub use error::{BadValue, ConfigError, FieldError, FieldErrorKind};
pub use misc::{MAX_CONFIGMAP_BYTES, NAMESPACE_NAME_LABEL};
pub use pod::{default_pull_policy, qos_class};
pub use service::SVCNET_LB_CLASS;
pub use service::defaults::DEFAULT_CLIENT_IP_TIMEOUT;
pub use service::validate::MAX_CLIENT_IP_TIMEOUT;

/// Admits a new object of `kind`. Kinds admission does not know pass
/// through unchanged.
pub fn admit_create(
    kind: &str,
    obj: Value,
    allocs: &mut Allocators,
) -> Result<Value, Vec<FieldError>> {
    match kind {
        "Service" => service::admit_create(obj, allocs),
        "Pod" => pod::admit_create(obj),
        "Deployment" => apps::admit_deployment_create(obj),
        "StatefulSet" => apps::admit_statefulset_create(obj),
        "DaemonSet" => apps::admit_daemonset_create(obj),
        "Endpoints" => endpoints::admit_endpoints(obj, allocs.loopback_services()),
        "EndpointSlice" => endpoints::admit_slice_create(obj, allocs.loopback_services()),
        "Namespace" => misc::admit_namespace_create(obj),
        "Node" => misc::admit_node(obj),
        "ConfigMap" => misc::admit_configmap(obj),
        "Event" => misc::admit_event(obj),
        "ControllerRevision" => misc::admit_controller_revision(obj),
        other => admit_plain(other, obj),
    }
}

/// Warnings upstream's strategies give for a written object of `kind` (`WarningsOnCreate` /
/// `WarningsOnUpdate`), sent back as `Warning` headers: the write goes through.
pub fn warnings(kind: &str, obj: &Value) -> Vec<String> {
    match kind {
        "NetworkPolicy" => networkpolicy::warnings(obj),
        _ => Vec::new(),
    }
}

/// Kinds admitted through their typed schema and metadata only. `kind` names the API
/// group where the kind name alone is ambiguous (`events.k8s.io/Event`).
fn admit_plain(kind: &str, obj: Value) -> Result<Value, Vec<FieldError>> {
    use k8s_openapi::api::{apps::v1 as apps, coordination::v1 as coordination};
    use k8s_openapi::api::{core::v1 as core, events::v1 as events};
    match kind {
        "ServiceAccount" => misc::admit_typed::<core::ServiceAccount>(obj, |o| &o.metadata),
        "ReplicaSet" => misc::admit_typed::<apps::ReplicaSet>(obj, |o| &o.metadata),
        "Lease" => misc::admit_typed::<coordination::Lease>(obj, |o| &o.metadata),
        "NetworkPolicy" => networkpolicy::admit(obj),
        "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" => rbac::admit(kind, obj),
        "events.k8s.io/Event" => misc::admit_typed::<events::Event>(obj, |o| &o.metadata),
        _ => Ok(obj),
    }
}

/// Admits a replacement of `old` by `new` (a PUT or the result of a PATCH on
/// the main resource). For Services, allocations follow the change: what
/// the new object no longer uses is released, what it newly needs is
/// allocated, and on failure the allocators are left untouched.
pub fn admit_update(
    kind: &str,
    old: &Value,
    new: Value,
    allocs: &mut Allocators,
) -> Result<Value, Vec<FieldError>> {
    match kind {
        "Service" => service::admit_update(old, new, allocs),
        "Pod" => pod::admit_update(old, new),
        "Deployment" => apps::admit_deployment_update(old, new),
        "StatefulSet" => apps::admit_statefulset_update(old, new),
        "DaemonSet" => apps::admit_daemonset_update(old, new),
        "Endpoints" => endpoints::admit_endpoints(new, allocs.loopback_services()),
        "EndpointSlice" => endpoints::admit_slice_update(old, new, allocs.loopback_services()),
        "Namespace" => misc::admit_namespace_update(old, new),
        "Node" => misc::admit_node(new),
        "ConfigMap" => misc::admit_configmap_update(old, new),
        "Event" => misc::admit_event(new),
        "ControllerRevision" => misc::admit_controller_revision_update(old, new),
        "RoleBinding" | "ClusterRoleBinding" => rbac::admit_binding_update(kind, old, new),
        other => admit_plain(other, new),
    }
}

/// Admits a write to the `status` subresource: the stored spec is kept and
/// only the status is taken from `new` (and validated). Never allocates.
pub fn admit_status_update(kind: &str, old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    match kind {
        "Service" => service::admit_status_update(old, new),
        "Pod" => pod::admit_status_update(old, new),
        "Node" | "Namespace" | "Deployment" | "StatefulSet" => Ok(keep_spec(old, new)),
        _ => Ok(new),
    }
}

/// The stored `spec` over the client's: what a status write may not change.
fn keep_spec(old: &Value, mut new: Value) -> Value {
    if let Value::Object(m) = &mut new {
        match old.get("spec") {
            Some(spec) => {
                m.insert("spec".into(), spec.clone());
            }
            None => {
                m.remove("spec");
            }
        }
    }
    new
}
