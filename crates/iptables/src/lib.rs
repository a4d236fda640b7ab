//! iptables dataplane: renders the proxy's desired state into `iptables-restore` payloads.
//!
//! kube-proxy's iptables mode, in svcnet's shape and with the `SVCNET-` prefix: nat
//! `SVCNET-SERVICES` (hooked from PREROUTING and OUTPUT) matches each frontend linearly and
//! jumps to a `SVCNET-SVC-…`/`SVCNET-SVL-…` chain per service port, which picks a
//! `SVCNET-SEP-…` endpoint chain with `-m statistic --mode random --probability 1/n, 1/(n-1), …`
//! (rr and wrr: `--mode nth --every len, len-1, …` over the round-robin cycle; sh: `-m cluster`
//! slot masks of the source address's hash) and DNATs; `SVCNET-EXT-…`/`SVCNET-FW-…` handle external traffic and source ranges; the
//! filter table rejects or drops traffic to frontends without endpoints. [`render`] builds
//! per-service [`render::Fragment`]s; [`plan`] turns desired state into full or partial
//! [`Payload`]s (values whose `Display` is the restore text); [`apply`] feeds them to
//! `iptables-restore --noflush` (the only I/O here, on either back end); [`dataplane`] is all
//! of it behind the dataplane contract ([`svcnet_proxy::Dataplane`]; its canary says when a
//! flush calls for a full sync; the syncer decides); [`fake`] applies the
//! same values in memory and rejects dangling references. This crate never reads API objects
//! and never decides policy: every decision comes from the proxy core (`svcnet-proxy`).
//! Hooks, chains, the mark, the three departures from kube-proxy (staged commits on the nft
//! back end, hooks inserted by the restore itself, shared chains edited in place by partial
//! syncs) and the benchmark are in README.md.

pub mod apply;
pub mod dataplane;
pub mod fake;
pub mod names;
pub mod payload;
pub mod plan;
pub mod render;
pub mod trace;

pub use apply::{ApplyError, Backend, IptablesExecutor, cleanup_all};
pub use dataplane::{IptablesDataplane, SyncError};
pub use fake::{FakeError, FakeIptables};
pub use payload::{Family, Hook, Payload, Table};
pub use plan::{KernelChains, Plan, Renderer};
