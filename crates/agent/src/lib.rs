//! The node agent: the embedded cluster's topology, a CNI-style bridge plugin, and pods run as
//! processes in their own network namespaces (the kubelet's and the CNI plugin's share of a
//! node's job). It never pulls images or runs a container runtime: a container with a
//! `command` runs that command; one without runs svcnet's built-in test server.
//!
//! Entry points, in the order `svcnet up` uses them:
//! - [`topology::Topology::create`] builds the node namespaces, the host bridge and the routes
//!   (and [`topology::cleanup`] removes them, also after a crash: `svcnet down`).
//! - [`run`] runs the agent for one node against any API server through kube-rs, with an
//!   [`AgentConfig`] made by [`AgentConfig::for_node`].
//! - [`testserver::run_if_requested`] must be called first thing in the binary's `main`: the
//!   agent re-executes the binary (`/proc/self/exe`) to run the built-in test server.
//! - [`exec::exec_command`] builds the command `svcnet exec` runs inside a pod.
//! - [`logs::find_log`] finds a container's captured stdout/stderr (for a `pods/log`
//!   subresource: `kubectl logs [-c C] [--previous]`).
//!
//! It never touches the host's networking beyond the bridge, veths and routes for svcnet's own
//! CIDRs, and never gives a namespace a default route out of the machine.

pub mod cni;
pub mod exec;
pub mod ip;
pub mod logs;
pub mod podnet;
pub mod routes;
pub mod runtime;
pub mod test_support;
pub mod testserver;
pub mod topology;
pub mod udpencap;

pub use runtime::{AgentConfig, AgentError, BeforeStart, run};
pub use topology::{NodeTopology, Topology, TopologyConfig, TopologyError};
