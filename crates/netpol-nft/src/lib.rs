//! NetworkPolicy enforcement in nftables: one node's share of the cluster's policies,
//! compiled from the evaluator's model ([`svcnet_netpol::Cluster`]) into a table of its own
//! (`ip svcnet-netpol`), and applied incrementally, each change one atomic transaction.
//!
//! The decision lives in `svcnet-netpol`: which pods a selector picks
//! ([`svcnet_netpol::Cluster::peer_selects`]), which policies isolate a pod
//! ([`svcnet_netpol::Cluster::isolating`]) and what a named port resolves to
//! ([`svcnet_netpol::Pod::named_ports`]) are the evaluator's own functions; this crate only
//! turns their answers into sets and rules, and its kernel tests compare the result, packet
//! by packet, with the evaluator.
//!
//! Anatomy as every dataplane: [`render`] (pure: model → [`render::Ruleset`]),
//! [`incremental`] (the node loop's renderer: one change → the objects it touches), [`names`],
//! [`plan`] (pure: last applied + next, or only the changed objects → transaction), [`apply`] (the only I/O, through
//! `svcnet-libnft`'s executor); [`conntrack`] the option that also cuts existing flows a
//! change denies.

pub mod apply;
pub mod conntrack;
pub mod incremental;
pub mod names;
pub mod plan;
pub mod render;

pub use apply::{Enforcer, SyncReport, bridge_netfilter};
pub use incremental::{Changes, Renderer};
pub use plan::{plan, plan_changes, plan_full};
pub use render::{DenyAction, Options, Ruleset, render};
