//! The userspace dataplane (`svcnet proxy --mode userspace`): the proxy itself accepts each
//! connection for a service frontend and relays it to an endpoint it picks — round robin by
//! default, or the service's algorithm from svcnet-lb — and, unlike the kernel dataplanes,
//! retries another endpoint when a connect fails, marking the failed one down for a while
//! (the seeds' "userspace mode").
//!
//! Two modes ([`Mode`]): *privileged* (root, Linux) — a few nftables rules in svcnet's own
//! `svcnet-userspace` table redirect every frontend (cluster IP, node ports, external and
//! load-balancer IPs) to a listener per route, and the original destination is recovered
//! with `SO_ORIGINAL_DST`; *unprivileged* — with a loopback service CIDR (127.96.0.0/16) each
//! frontend address is bound directly. Sockets are created inside the node's network
//! namespace when one is given, then handed to the data path's threads. Config changes swap
//! an immutable route table ([`arc_swap`]); the data path takes no lock on it.
//!
//! Code map: [`table`] (pure: desired state → routes and listeners), [`rules`] (pure: the
//! nftables transaction), [`state`] (lock-free counters, the route table, metrics), [`socket`]
//! (namespace-aware sockets), `evloop` (Linux's TCP data path: one edge-triggered epoll loop
//! per core, all accepting from each route's listener), `tcp`/`udp` (tokio data paths: TCP
//! where there is no epoll loop, UDP everywhere; `relay` copies small messages and splices
//! bulk streams), `workers` (the tokio runtimes), [`proxy`] (sync, drain, metrics),
//! [`dataplane`] (the proxy behind the dataplane contract, [`svcnet_proxy::Dataplane`]).
//! This crate reads only the core's desired state, never API objects.

pub mod admission;
pub mod dataplane;
pub mod error;
#[cfg(target_os = "linux")]
mod evloop;
pub mod proxy;
mod relay;
pub mod rules;
pub mod socket;
pub mod state;
pub mod table;
mod tcp;
mod udp;
mod workers;

pub use admission::{Admission, UpstreamSource};
pub use dataplane::{UserspaceDataplane, UserspacePlan};
pub use error::UserspaceError;
pub use proxy::{Config, SyncReport, UnboundFrontend, UserspaceProxy, cleanup};
pub use state::{EndpointMetrics, ServiceMetrics};
pub use table::{Class, Mode};
