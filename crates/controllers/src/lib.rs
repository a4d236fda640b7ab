//! Controllers: EndpointSlices, Endpoints, EndpointSlice mirroring, Deployments, ReplicaSets,
//! StatefulSets (with their ControllerRevisions) and a one-node scheduler, driven against any Kubernetes API server through kube-rs.
//!
//! Every controller is split the house way. A pure module computes a plan (a plain value with
//! `Debug`) from a snapshot of API objects: [`endpointslice`], [`endpoints`], [`mirroring`],
//! [`workloads`] and [`scheduler`]. They do no I/O, read no clock and draw no random numbers;
//! time comes in as an argument and pod names use `generateName`. The [`runtime`] module owns
//! all I/O: reflectors (one watch per resource kind, shared by all controllers), a coalescing
//! work queue per controller, expectations that stop a controller from acting on a cache that
//! has not yet seen its own writes, and the apply step (create, replace with resourceVersion,
//! delete; 409 Conflict requeues). [`leader`] elects one of several controller-manager
//! processes through a Lease (client-go's algorithm), so that only the holder runs them.
//!
//! **Architecture Invariant:** this crate never writes an object it does not own: EndpointSlices
//! carry its `managed-by` label, Endpoints belong to services with a selector, pods carry an
//! ownerReference to the ReplicaSet or StatefulSet that created them, ReplicaSets one to
//! their Deployment, ControllerRevisions one to their StatefulSet; the leader-election Lease is
//! written only by [`leader`], each write conditional on the resourceVersion it read.

pub mod endpoints;
pub mod endpointslice;
pub mod leader;
pub mod mirroring;
mod podutil;
pub mod runtime;
pub mod scheduler;
pub mod workloads;

#[cfg(test)]
mod fixtures;

pub use runtime::{
    ControllerError, ControllerOptions, run, run_deployments, run_endpoints, run_endpointslices,
    run_mirroring, run_scheduler, run_statefulsets,
};

/// Label naming the service an EndpointSlice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages an EndpointSlice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Label on Endpoints that the mirroring controller must not mirror.
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Label set (empty value) on Endpoints and EndpointSlices of headless services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Node label holding the node's zone.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// `managed-by` value of slices written by the EndpointSlice controller.
pub const ENDPOINTSLICE_CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// `managed-by` value of slices written by the mirroring controller.
pub const MIRRORING_CONTROLLER_NAME: &str = "endpointslicemirroring-controller.k8s.io";
/// Annotation set on Endpoints truncated to [`endpoints::MAX_ENDPOINTS_ADDRESSES`].
pub const ANNOTATION_OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
/// Annotation recording when the change that triggered an endpoints update happened.
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";
