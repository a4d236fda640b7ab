//! nftables dataplane: renders the proxy's desired state into atomic nft transactions.
//!
//! kube-proxy's nftables mode, in svcnet's shape: [`render`] turns each
//! [`svcnet_proxy::DesiredServicePort`] into a fragment of one table per family (`ip svcnet`,
//! `ip6 svcnet`) with O(1) verdict-map dispatch; [`plan`] turns desired state into full or
//! partial [`Transaction`]s (values, whose `Display` is the nft text); [`apply`] sends that
//! text to one long-lived libnftables context (`svcnet-libnft`; the only I/O here); [`fake`] applies the same values in memory and rejects
//! dangling references; [`dataplane`] is all of it behind the dataplane contract
//! ([`svcnet_proxy::Dataplane`]). This crate never reads API objects and never decides policy: every
//! decision (which endpoints, reject or drop, masquerade, which algorithm) comes from the
//! proxy core. Each service port picks its endpoint with its load-balancing algorithm as
//! `svcnet_lb::kernel_plan` compiles it: random (default; a `numgen random` cascade), rr/wrr
//! (`numgen inc`), sh/dh/maglev (`jhash` into a slot verdict map); lc/sed/nq cannot be
//! expressed statelessly and fall back to random, reported in [`Plan::fallbacks`].
//! Hooks and priorities are documented in README.md as a contract for other software.

pub mod apply;
mod choice;
pub mod dataplane;
pub mod fake;
pub mod names;
pub mod plan;
pub mod render;
pub mod trace;
pub mod tx;

pub use apply::{ApplyError, NftExecutor};
pub use dataplane::NftDataplane;
pub use fake::{FakeError, FakeNft};
pub use plan::{FullMode, GARBAGE_LIMIT, Plan, Renderer};
pub use tx::{Family, Op, Transaction};
