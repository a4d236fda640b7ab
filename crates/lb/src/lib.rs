//! Load-balancing algorithms as pure, deterministic units, shared by every dataplane.
//!
//! The seeds list IPVS's schedulers (rr, lc, dh, sh, sed, nq); the issue adds wrr, random and
//! Maglev consistent hashing. Each is a function of an immutable [`Balancer`] (built once per
//! endpoint set), a flow, a ticket from a per-service counter, a view of the endpoints' live
//! state (down / active connections) and an injected RNG, so tests are exact and statistical
//! tests are seeded. The hashes are the Linux kernel's `jhash` exactly as nftables' `jhash`
//! expression evaluates it ([`hash`]), so a kernel dataplane and the userspace proxy send a
//! given flow to the same endpoint, and every node builds the same Maglev table ([`maglev`]).
//! [`capability`] says which dataplane can express which algorithm and what to fall back to;
//! [`kernel`] compiles an algorithm into an nftables slot expression and slot list.
//!
//! This crate never does I/O, never reads the clock and never touches sockets or the kernel.

pub mod algorithm;
pub mod balancer;
pub mod capability;
pub mod hash;
pub mod kernel;
pub mod maglev;
pub mod select;

pub use algorithm::{ANNOTATION, Algorithm, ParseAlgorithmError};
pub use balancer::{Backend, Balancer, EndpointView, Flow, NoLoad};
pub use capability::{Dataplane, EVENT_REASON, Fallback, Resolution, Support, resolve, support};
pub use kernel::{HashInput, KernelPlan, Selector, kernel_plan};
pub use maglev::{MaglevError, MaglevTable};
