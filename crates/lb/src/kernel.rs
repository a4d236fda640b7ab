//! What a stateless kernel dataplane (nftables) needs to express an algorithm: an expression
//! that yields a slot number per new flow, and the slot → endpoint list to put in the verdict
//! map after it (`<expression> vmap { 0 : goto <endpoint chain>, … }`).
//!
//! | algorithm | expression | slots |
//! |---|---|---|
//! | random | `numgen random mod L` | endpoints repeated by weight |
//! | rr, wrr | `numgen inc mod L` | the weighted round-robin cycle (the userspace order) |
//! | sh | `jhash ip saddr mod L seed 0x53564e01` | endpoints repeated by weight |
//! | dh | `jhash ip daddr . th dport mod L seed 0x53564e02` | endpoints repeated by weight |
//! | maglev | `jhash ip saddr . th sport mod M seed 0x53564e03` (address only with affinity) | the Maglev table, M = [`table_size_for`] |
//! | lc, sed, nq | — | fall back to random, reported ([`crate::Fallback`]) |
//!
//! The hashes are the ones [`crate::Balancer`] computes, so a flow reaches the same endpoint
//! through nftables as through the userspace proxy; `tests/kernel.rs` checks this against the
//! real kernel. Indices in `slots` refer to [`KernelPlan::backends`] (sorted by address).

use crate::algorithm::Algorithm;
use crate::balancer::{Backend, Balancer};
use crate::capability::{Dataplane, Fallback, resolve};
use crate::hash::{SEED_DESTINATION, SEED_MAGLEV_FLOW, SEED_SOURCE};
use crate::maglev::{MaglevError, table_size_for};
use crate::select::hash_slots;

/// The field hashed by a `jhash` selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashInput {
    /// `ip saddr` (sh; Maglev with ClientIP affinity).
    SourceAddr,
    /// `ip saddr . th sport` (Maglev).
    SourceAddrPort,
    /// `ip daddr . th dport` (dh).
    DestinationAddrPort,
}

/// How the kernel computes a flow's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selector {
    /// `numgen random mod L`.
    Random,
    /// `numgen inc mod L`.
    Counter,
    /// `jhash <input> mod L seed <seed>`.
    Hash { input: HashInput, seed: u32 },
}

/// An algorithm compiled for a kernel dataplane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelPlan {
    /// The algorithm actually expressed (after any fallback).
    pub algorithm: Algorithm,
    /// Set when the requested algorithm could not be expressed: log it and record an Event.
    pub fallback: Option<Fallback>,
    pub selector: Selector,
    /// Slot → index into [`KernelPlan::backends`]; its length is the `mod` operand.
    pub slots: Vec<usize>,
    backends: Vec<Backend>,
}

impl KernelPlan {
    /// Endpoints in the order `slots` refers to (sorted by address; weight-0 ones included
    /// but never in a slot).
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The nft expression yielding the slot; `ipv6` selects `ip6` for the address fields.
    /// Empty slots (no endpoint) have no expression: the dataplane rejects/drops instead.
    pub fn expression(&self, ipv6: bool) -> Option<String> {
        if self.slots.is_empty() {
            return None;
        }
        let ip = if ipv6 { "ip6" } else { "ip" };
        let len = self.slots.len();
        Some(match self.selector {
            Selector::Random => format!("numgen random mod {len}"),
            Selector::Counter => format!("numgen inc mod {len}"),
            Selector::Hash { input, seed } => {
                let field = match input {
                    HashInput::SourceAddr => format!("{ip} saddr"),
                    HashInput::SourceAddrPort => format!("{ip} saddr . th sport"),
                    HashInput::DestinationAddrPort => format!("{ip} daddr . th dport"),
                };
                format!("jhash {field} mod {len} seed 0x{seed:08x}")
            }
        })
    }
}

/// Compiles the requested algorithm (`None`: the dataplane's default) over `backends` for a
/// kernel dataplane. `affinity`: the service has ClientIP affinity (Maglev then hashes the
/// address only, so the affinity set and the hash agree).
pub fn kernel_plan(
    requested: Option<Algorithm>,
    dataplane: Dataplane,
    backends: Vec<Backend>,
    affinity: bool,
) -> Result<KernelPlan, MaglevError> {
    let resolution = resolve(requested, dataplane);
    let live = backends.iter().filter(|b| b.weight > 0).count();
    let table_size = table_size_for(live.max(1));
    let balancer = Balancer::with_table_size(resolution.algorithm, backends, table_size)?
        .maglev_by_address_only(affinity);
    let weights: Vec<u32> = balancer.backends().iter().map(|b| b.weight).collect();
    let (selector, slots) = match resolution.algorithm {
        Algorithm::RoundRobin | Algorithm::WeightedRoundRobin => {
            (Selector::Counter, balancer.slots().to_vec())
        }
        Algorithm::SourceHash => (
            Selector::Hash {
                input: HashInput::SourceAddr,
                seed: SEED_SOURCE,
            },
            balancer.slots().to_vec(),
        ),
        Algorithm::DestinationHash => (
            Selector::Hash {
                input: HashInput::DestinationAddrPort,
                seed: SEED_DESTINATION,
            },
            balancer.slots().to_vec(),
        ),
        Algorithm::Maglev => (
            Selector::Hash {
                input: if affinity {
                    HashInput::SourceAddr
                } else {
                    HashInput::SourceAddrPort
                },
                seed: SEED_MAGLEV_FLOW,
            },
            balancer
                .maglev_table()
                .map(|t| t.entries().iter().map(|e| *e as usize).collect())
                .unwrap_or_default(),
        ),
        // random, and the fallback for what a kernel cannot express.
        _ => (Selector::Random, hash_slots(&weights)),
    };
    Ok(KernelPlan {
        algorithm: resolution.algorithm,
        fallback: resolution.fallback,
        selector,
        slots,
        backends: balancer.backends().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(n: u8, weight: u32) -> Backend {
        Backend {
            addr: std::net::SocketAddr::from(([10, 244, n, 2], 8080)),
            weight,
        }
    }

    #[test]
    fn plans_per_algorithm() {
        let list = || vec![b(3, 1), b(1, 2), b(2, 0)];
        let p = kernel_plan(
            Some(Algorithm::WeightedRoundRobin),
            Dataplane::Nftables,
            list(),
            false,
        )
        .unwrap();
        // Sorted: 10.244.1.2 (w2), 10.244.2.2 (w0), 10.244.3.2 (w1).
        assert_eq!(p.slots, [0, 2, 0]);
        assert_eq!(p.expression(false).unwrap(), "numgen inc mod 3");
        let p = kernel_plan(None, Dataplane::Nftables, list(), false).unwrap();
        assert_eq!(
            (p.algorithm, p.slots.clone()),
            (Algorithm::Random, vec![0, 0, 2])
        );
        let p = kernel_plan(Some(Algorithm::Maglev), Dataplane::Nftables, list(), false).unwrap();
        assert_eq!(p.slots.len(), 251);
        assert_eq!(
            p.expression(true).unwrap(),
            "jhash ip6 saddr . th sport mod 251 seed 0x53564e03"
        );
        let p = kernel_plan(Some(Algorithm::Maglev), Dataplane::Nftables, list(), true).unwrap();
        assert_eq!(
            p.expression(false).unwrap(),
            "jhash ip saddr mod 251 seed 0x53564e03"
        );
        let p = kernel_plan(
            Some(Algorithm::DestinationHash),
            Dataplane::Nftables,
            list(),
            false,
        )
        .unwrap();
        assert_eq!(
            p.expression(false).unwrap(),
            "jhash ip daddr . th dport mod 3 seed 0x53564e02"
        );
        let p = kernel_plan(
            Some(Algorithm::NeverQueue),
            Dataplane::Nftables,
            list(),
            false,
        )
        .unwrap();
        assert_eq!(p.algorithm, Algorithm::Random);
        assert!(p.fallback.is_some());
        let p = kernel_plan(Some(Algorithm::Maglev), Dataplane::Nftables, vec![], false).unwrap();
        assert_eq!(p.expression(false), None);
    }
}
