//! nftables dataplane: renders the proxy's desired state into atomic nft transactions.
//!
//! A data-only table per family (`ip svcnet`, `ip6 svcnet`): [`render`] turns each
//! [`svcnet_proxy::DesiredServicePort`]'s decided graph into elements of fixed sets and maps
//! (one `backends` map `frontend . slot → endpoint`, one DNAT rule per group of services
//! with the same slot expression), so service and endpoint changes are element updates;
//! [`plan`] turns desired state into full or
//! partial [`Transaction`]s (values, whose `Display` is the nft text, from `svcnet-libnft`'s
//! Service-neutral half, re-exported as [`tx`]); [`apply`] (`svcnet_libnft::exec`) pipes them
//! to one long-lived libnftables context (the only I/O); [`fake`]
//! applies the same values in memory and rejects
//! dangling references; [`dataplane`] is all of it behind the dataplane contract
//! ([`svcnet_proxy::Dataplane`]). This crate never reads API objects and never decides policy: every
//! decision (which endpoints, reject or drop, masquerade, which algorithm) comes from the
//! proxy core. Each service port picks its endpoint with its load-balancing algorithm as
//! `svcnet_lb::kernel_plan` compiles it ([`choice`]): random (default; `numgen random`),
//! sh/dh/maglev (`jhash`), all as data; rr/wrr (`numgen inc`) through a chain per service
//! port; lc/sed/nq cannot be expressed statelessly and fall back to random, reported in
//! [`Plan::fallbacks`]. [`affinity`] deletes affinity entries pinned to removed endpoints.
//! Hooks and priorities are documented in README.md as a contract for other software.

pub mod affinity;
mod base;
pub mod choice;
pub mod dataplane;
pub mod fake;
pub mod names;
pub mod plan;
pub mod render;
pub mod trace;

pub use dataplane::NftDataplane;
pub use fake::{FakeError, FakeNft};
pub use plan::{FullMode, Plan, Renderer};
pub use svcnet_libnft::{ApplyError, NftExecutor};
/// The Service-neutral transaction value and executor (`svcnet-libnft`), re-exported.
pub use svcnet_libnft::{exec as apply, tx};
pub use tx::{Family, Op, Transaction};

/// The nft family of an IP family.
pub fn family_of(f: svcnet_proxy::IpFamily) -> Family {
    match f {
        svcnet_proxy::IpFamily::V4 => Family::Ip,
        svcnet_proxy::IpFamily::V6 => Family::Ip6,
    }
}
