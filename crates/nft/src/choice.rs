//! Choosing an endpoint, as data: each algorithm is a slot expression and a slot table. The
//! table becomes `backends` elements (`frontend . slot → endpoint`), the expression's kind and
//! modulus a dispatch [`Group`], so every node computes the same slot for the same flow:
//!
//! | algorithm | slot | form |
//! | --- | --- | --- |
//! | random (default, and every fallback) | `numgen random mod n` (endpoints repeated by weight) | data |
//! | sh | `jhash ip saddr mod L seed 0x53564e01` | data |
//! | dh | `jhash ip daddr . th dport mod L seed 0x53564e02` | data |
//! | maglev | `jhash ip saddr . th sport mod M seed 0x53564e03` (address only with affinity) over the Maglev table | data |
//! | rr, wrr | `numgen inc mod L` over the (weighted) round-robin cycle | a chain per service port |
//!
//! Round robin is the one exception: `numgen inc` keeps its counter in the rule, so one rule
//! shared by every round-robin service of a group would interleave their turns; each keeps a
//! one-rule chain (`rr-…`), reached through a small verdict map. Pure.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use svcnet_lb::hash::{SEED_DESTINATION, SEED_MAGLEV_FLOW, SEED_SOURCE};
use svcnet_lb::kernel_plan;
use svcnet_lb::{Algorithm, Backend, Dataplane, HashInput, KernelPlan, MaglevError, Selector};
use svcnet_proxy::{DesiredEndpoint, ServiceGraph};

use crate::names::round_robin_chain;
use crate::render::{Element, Fragment, Group, Scope, key_expr};
use crate::tx::Family;

/// A data-only slot expression (its modulus is the group's length).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Slot {
    Random,
    SourceHash,
    DestinationHash,
    Maglev,
    /// Maglev hashing the address only (with ClientIP affinity).
    MaglevAddress,
}

impl Slot {
    /// The group set's infix (`svc-n3`, `svc-sh3`, `svc-mg509`).
    pub fn short(self) -> &'static str {
        match self {
            Slot::Random => "n",
            Slot::SourceHash => "sh",
            Slot::DestinationHash => "dh",
            Slot::Maglev => "mg",
            Slot::MaglevAddress => "mga",
        }
    }

    /// The nft expression, the same `svcnet_lb::KernelPlan::expression` writes.
    pub fn expr(self, family: Family, len: usize) -> String {
        let ip = family.as_str();
        let (field, seed) = match self {
            Slot::Random => return format!("numgen random mod {len}"),
            Slot::SourceHash => (format!("{ip} saddr"), SEED_SOURCE),
            Slot::DestinationHash => (format!("{ip} daddr . th dport"), SEED_DESTINATION),
            Slot::Maglev => (format!("{ip} saddr . th sport"), SEED_MAGLEV_FLOW),
            Slot::MaglevAddress => (format!("{ip} saddr"), SEED_MAGLEV_FLOW),
        };
        format!("jhash {field} mod {len} seed 0x{seed:08x}")
    }
}

/// Compiles `algorithm` for nftables over `eps` ([`kernel_plan`]); an error when its lookup
/// table (Maglev's) cannot be built for them.
pub(crate) fn algorithm_plan(
    algorithm: Algorithm,
    eps: &[DesiredEndpoint],
    affinity: bool,
) -> Result<KernelPlan, MaglevError> {
    let backends = eps
        .iter()
        .map(|e| Backend {
            addr: SocketAddr::new(e.ip, e.port),
            weight: e.weight.max(1),
        })
        .collect();
    kernel_plan(Some(algorithm), Dataplane::Nftables, backends, affinity)
}

/// The slot kind (`None`: a counter, i.e. round robin) and the slot table of `eps` under the
/// graph's resolved algorithm (any fallback is already decided and reported there).
fn slot_table<'e>(
    g: &ServiceGraph<'_>,
    eps: &'e [DesiredEndpoint],
) -> (Option<Slot>, Vec<&'e DesiredEndpoint>) {
    let random = || {
        let slots = eps
            .iter()
            .flat_map(|e| std::iter::repeat_n(e, e.weight.max(1) as usize))
            .collect();
        (Some(Slot::Random), slots)
    };
    // The default needs no plan (and most services have it: keep their rendering cheap).
    if g.algorithm == Algorithm::Random {
        return random();
    }
    let Ok(plan) = algorithm_plan(g.algorithm, eps, g.affinity.is_some()) else {
        return random();
    };
    let slot = match plan.selector {
        Selector::Random => return random(),
        Selector::Counter => None,
        Selector::Hash { input, .. } => Some(match (plan.algorithm, input) {
            (Algorithm::Maglev, HashInput::SourceAddr) => Slot::MaglevAddress,
            (Algorithm::Maglev, _) => Slot::Maglev,
            (_, HashInput::SourceAddr) => Slot::SourceHash,
            (_, HashInput::DestinationAddrPort) => Slot::DestinationHash,
            (_, HashInput::SourceAddrPort) => Slot::Maglev,
        }),
    };
    let by_addr: BTreeMap<SocketAddr, &DesiredEndpoint> = eps
        .iter()
        .map(|e| (SocketAddr::new(e.ip, e.port), e))
        .collect();
    let backends = plan.backends();
    let slots: Vec<&DesiredEndpoint> = plan
        .slots
        .iter()
        .filter_map(|i| by_addr.get(&backends.get(*i)?.addr).copied())
        .collect();
    if slots.len() != plan.slots.len() || slots.is_empty() {
        return random();
    }
    (slot, slots)
}

/// Adds the choice among `eps` for the frontend `key` in `scope`: its `backends` elements
/// and its group (or, for round robin, its chain and verdict-map element).
#[allow(clippy::too_many_arguments)]
pub(crate) fn choose(
    family: Family,
    g: &ServiceGraph<'_>,
    eps: &[DesiredEndpoint],
    (scope, proto): (Scope, &'static str),
    pool: &str,
    key: &str,
    comment: &str,
    f: &mut Fragment,
) {
    let (slot, slots) = slot_table(g, eps);
    let ip = family.as_str();
    for (i, ep) in slots.iter().enumerate() {
        f.elements.insert(Element {
            set: scope.backends(proto),
            key: format!("{key} . {i}"),
            comment: None,
            value: Some(format!("{} . {}", ep.ip, ep.port)),
        });
    }
    let len = slots.len();
    match slot {
        Some(slot) => {
            let group = Group::Choice {
                scope,
                slot,
                len,
                proto,
            };
            f.elements.insert(Element {
                set: group.set_name(),
                key: key.to_string(),
                comment: Some(comment.to_string()),
                value: None,
            });
            f.groups.insert(group);
        }
        None => {
            let chain = round_robin_chain(scope.prefix(), pool, &g.port.name);
            f.chains.insert(
                chain.clone(),
                vec![format!(
                    "dnat {ip} to {} . numgen inc mod {len} map @{}",
                    key_expr(family, scope),
                    scope.backends(proto)
                )],
            );
            f.elements.insert(Element {
                set: scope.round_robin_map(),
                key: key.to_string(),
                comment: Some(comment.to_string()),
                value: Some(format!("goto {chain}")),
            });
            f.groups.insert(Group::RoundRobin(scope));
        }
    }
}
