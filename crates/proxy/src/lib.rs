//! Node proxy core: change tracking and the dataplane-neutral desired state.
//!
//! This crate is kube-proxy's brain without its hands: Services, EndpointSlices and this Node
//! go in (as k8s-openapi types), and a [`DesiredFamily`] per IP family comes out, plus the
//! change sets that let a dataplane sync only what changed. It never does I/O, never touches
//! the kernel, tokio or an API client; the runtime (`svcnet-proxyd`) feeds it watch events and
//! the dataplanes (`svcnet-nft`, …) render its output.
//!
//! Code map: [`names`] (identifiers), [`service`] and [`endpoints`] (digests of API objects),
//! [`categorize`] (the one endpoint-selection function), [`tracker`] (coalescing change
//! trackers), [`desired`] (the output types), [`graph`] (every traffic decision of a service
//! port, lowered from the desired state: the one place dataplanes take routes, masquerade,
//! refusals and node-wide verdicts from), [`state`] (observed world and change sets),
//! [`dataplane`] (the contract every dataplane implements and one syncer drives), [`status`]
//! (what a node's proxy publishes about its rules, in a Lease), [`trace`]
//! (what a packet trace answers, in every dataplane's words alike),
//! [`fixtures`] (builders for tests).

pub mod algorithm;
pub mod categorize;
pub mod dataplane;
pub mod desired;
pub mod endpoints;
pub mod fixtures;
pub mod graph;
pub mod names;
pub mod service;
pub mod state;
pub mod status;
pub mod trace;
pub mod tracker;

pub use categorize::{Categorized, NodeTopology, categorize_endpoints};
pub use dataplane::{Changes, Dataplane, FullReason};
pub use desired::{
    CoreConfig, DesiredEndpoint, DesiredFamily, DesiredNode, DesiredServicePort, NoEndpointsVerdict,
};
pub use graph::{
    Affinity, Capability, Frontend, Masquerade, NODE_VERDICTS, NodeVerdicts, Pool, Route,
    ServiceGraph, Target, lower,
};
pub use names::{IpFamily, NamespacedName, Protocol, ServicePortName};
pub use service::{ServiceError, ServiceInfo, TrafficPolicy};
pub use state::{ChangeSet, ProxyState, ServiceChange, StaleConntrack};
pub use svcnet_lb::Algorithm;
