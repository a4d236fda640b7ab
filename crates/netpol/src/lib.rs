//! NetworkPolicy semantics as a pure function: given namespaces, pods and policies, is a
//! connection allowed, and why.
//!
//! The rules (kubernetes.io "Network Policies", `networking/v1` types.go, upstream e2e):
//! a pod is isolated for a direction only when some policy in its namespace selects it and
//! lists that direction in `policyTypes`; an isolated pod accepts in that direction what
//! the union of those policies' rules allows (no order, no deny); a pod-to-pod connection
//! needs both the source's egress and the destination's ingress; traffic from a pod's own
//! node is always let in; named ports resolve on the destination pod; `ipBlock` matches any
//! address, pods' included, inside `cidr` and outside `except`.
//!
//! This crate is the oracle the dataplane is tested against and what explains a verdict:
//! it never does I/O, reads no clock and holds no state beyond its inputs.

mod eval;
mod model;
mod selector;
pub mod upstream;

pub use eval::{Cluster, Connection, Endpoint, IpFamily, SideVerdict, UnknownPod, Verdict};
pub use model::{
    Direction, IpBlock, ModelError, NamedPort, Namespace, Peer, Pod, Policy, Port, PortMatch,
    Protocol, Rule,
};
pub use selector::{Op, Selector};
