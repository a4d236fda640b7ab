//! The dataplane contract (kube-proxy's `Provider`, firecracker's `VirtioDevice`): what every
//! dataplane (nftables, iptables, userspace; IPVS next) implements so that one generic syncer
//! (`svcnet-proxyd`'s `Syncer`) drives them all. The syncer makes the full-or-partial decision
//! once; a dataplane only says when its own state is damaged ([`Dataplane::needs_full`]),
//! plans, applies and remembers.
//!
//! Per family (IPv4 and IPv6 are independent: a failure in one never blocks the other):
//!
//! 1. the syncer picks a [`FullReason`] (nothing applied yet or the last sync failed, the
//!    periodic resync, the node changed), else asks [`Dataplane::needs_full`];
//! 2. without a reason it asks for a partial plan of the changed services; `None` means a
//!    full one is needed (the node settings differ from what was applied);
//! 3. [`Dataplane::apply`] is the only I/O that changes anything; on success
//!    [`Dataplane::commit`] records the plan and returns the algorithm fallbacks to report; on
//!    failure [`Dataplane::invalidate`] forgets what was applied, and the next sync is full.
//!
//! This module is pure: it defines the contract, never performs it.

use std::collections::BTreeMap;
use std::fmt;

use svcnet_lb::Fallback;

use crate::desired::{DesiredFamily, DesiredNode, DesiredServicePort};
use crate::graph::Capability;
use crate::names::{IpFamily, NamespacedName, ServicePortName};

/// Why a sync of one family is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullReason {
    /// Nothing was applied yet, or the last sync failed: the kernel's state is unknown.
    Unknown,
    /// The periodic resync (repairs drift).
    Periodic,
    /// The node (its labels or addresses) changed.
    NodeChanged,
    /// The node settings of the desired state differ from those applied.
    NodeSettings,
    /// The dataplane found its own state damaged (iptables: the canary chain is gone).
    Damaged(&'static str),
}

impl fmt::Display for FullReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unknown => "first sync or previous failure",
            Self::Periodic => "periodic resync",
            Self::NodeChanged => "node changed",
            Self::NodeSettings => "node settings changed",
            Self::Damaged(why) => why,
        })
    }
}

/// The changed services of one family: each with all of its desired ports (empty when the
/// service is gone).
pub type Changes = BTreeMap<NamespacedName, Vec<DesiredServicePort>>;

/// One dataplane. Every method except [`Dataplane::needs_full`], [`Dataplane::plan_full`]
/// (which may read the kernel's state), [`Dataplane::apply`] and [`Dataplane::cleanup`] is
/// pure; the syncer runs those four on a blocking thread.
pub trait Dataplane: Send + 'static {
    /// A computed sync: a value that prints as what applying it does (an nft transaction,
    /// iptables-restore payloads, the userspace proxy's routes).
    type Plan: fmt::Display + Send + 'static;
    type Error: std::error::Error + Send + Sync + 'static;

    /// The dataplane's name (`svcnet_lb::Dataplane`'s), for logs.
    fn name(&self) -> &'static str;

    /// The families it programs.
    fn families(&self) -> Vec<IpFamily>;

    /// How it resolves load-balancing algorithms (its arm of `svcnet_lb`'s capability table,
    /// plus its endpoint-dependent limits); the graph it renders is lowered with it.
    fn capability(&self) -> &dyn Capability;

    /// Whether `family` needs a full sync although the syncer has no reason for one; may read
    /// the kernel.
    fn needs_full(&mut self, _family: IpFamily) -> Result<Option<FullReason>, Self::Error> {
        Ok(None)
    }

    /// Plans a full sync of `desired`; may read the kernel (iptables lists its chains when the
    /// state is unknown, so that stale ones are deleted).
    fn plan_full(
        &mut self,
        family: IpFamily,
        desired: &DesiredFamily,
        why: FullReason,
    ) -> Result<Self::Plan, Self::Error>;

    /// Plans a partial sync of `changes`; `None` when a full one is needed.
    fn plan_partial(
        &self,
        family: IpFamily,
        node: &DesiredNode,
        changes: &Changes,
    ) -> Option<Self::Plan>;

    /// Whether `plan` is a full sync.
    fn is_full(plan: &Self::Plan) -> bool;

    /// Applies `plan`: the only I/O that changes the dataplane. On error the previous state
    /// stays in place (the kernel dataplanes apply atomically).
    fn apply(&mut self, family: IpFamily, plan: &Self::Plan) -> Result<(), Self::Error>;

    /// Records an applied plan; returns the service ports whose algorithm it could not
    /// express (reported once per render).
    fn commit(&mut self, family: IpFamily, plan: Self::Plan) -> Vec<(ServicePortName, Fallback)>;

    /// Forgets what was applied to `family` (after a failed apply): the next sync is full.
    fn invalidate(&mut self, family: IpFamily);

    /// Service ports programmed in `family`.
    fn service_ports(&self, family: IpFamily) -> usize;

    /// Removes everything the dataplane installed, in every family.
    fn cleanup(&mut self) -> Result<(), Self::Error>;

    /// Whether retrying after `error` may help. A sync that failed retryably is retried soon
    /// (in full); one that cannot succeed by itself (a missing `nft` binary) is reported and
    /// retried only with the next change or periodic resync, never in a loop.
    fn is_retryable(_error: &Self::Error) -> bool {
        true
    }
}
