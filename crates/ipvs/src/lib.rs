//! IPVS for svcnet: the IPVS generic-netlink message family ([`wire`]), a blocking client
//! ([`IpvsSocket`]) and an in-memory [`FakeIpvs`] that rejects what the kernel rejects, behind
//! one [`Ipvs`] trait; the operations are values ([`Op`]) that print as `ipvsadm-restore`
//! lines. No `ipvsadm` process is run: one netlink socket per node namespace.
//!
//! On top, the IPVS dataplane (`--proxy-mode ipvs`, kube-proxy's IPVS proxier): [`render`]
//! translates the decided graph into virtual servers, dummy-interface addresses, ipset members
//! and firewall-mark rules; [`rules`] is the companion iptables skeleton; [`plan`] diffs
//! states into a sync; [`dataplane`] does the I/O behind the dataplane contract; [`trace`]
//! follows a packet through a rendered state (the shared packet-flow table's tracer).

pub mod dataplane;
pub mod fake;
pub mod plan;
pub mod readback;
pub mod render;
pub mod rules;
pub mod socket;
pub mod trace;
pub mod types;
pub mod wire;

pub use dataplane::{IpvsDataplane, NodeOptions, SyncError, cleanup};
pub use fake::FakeIpvs;
pub use plan::Plan;
pub use render::{IpvsCapability, Renderer};
pub use socket::IpvsSocket;
pub use types::{Dest, DestKey, Forward, Op, Protocol, Rejected, Service, ServiceKey, Timeouts};

/// An IPVS table: the kernel's (through [`IpvsSocket`]) or a fake one.
pub trait Ipvs {
    /// Applies `ops` in order. They are not atomic: on a rejection the others are still
    /// applied (the kernel processes a batch message by message) and the first rejection is
    /// returned.
    fn apply(&mut self, ops: &[Op]) -> Result<(), IpvsError>;
    /// Every virtual service.
    fn services(&mut self) -> Result<Vec<Service>, IpvsError>;
    /// The real servers of one virtual service, with their connection counters.
    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<Dest>, IpvsError>;
}

/// Why an IPVS call failed.
#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    /// The kernel has no IPVS: the generic-netlink family "IPVS" does not exist.
    #[error(
        "the kernel has no IPVS (generic netlink family \"IPVS\" not found): load the ip_vs \
         module (`modprobe ip_vs`; it needs a kernel built with CONFIG_IP_VS) or use another \
         proxy mode"
    )]
    NotAvailable,
    /// The kernel rejected an operation.
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    /// A reply the client could not read.
    #[error("decoding an IPVS reply: {0}")]
    Decode(String),
}
