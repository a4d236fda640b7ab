//! Names of the table's objects. Sets and per-policy chains are named after a hash of what
//! they stand for (a selector and its namespace scope, an `ipBlock`, a port name, a policy's
//! namespace/name), never after a position: adding a policy does not rename anything else,
//! so a change touches only the objects it is about, and a set's name fixes its contents'
//! meaning (a label change moves set elements, it never rewrites a rule).

use svcnet_libnft::Family;

/// The table, in the `ip` family (svcnet's pod network is IPv4) and, for pods with IPv6
/// addresses, in the `ip6` family beside it.
pub const TABLE: &str = "svcnet-netpol";
/// The IPv4 table's family.
pub const FAMILY: Family = Family::Ip;

/// Verdict map: each local pod isolated for ingress (some policy selects it with `Ingress`)
/// to a jump to its namespace's ingress chain.
pub const INGRESS_ISOLATED: &str = "ingress-isolated";
/// Verdict map: each local pod isolated for egress to its namespace's egress chain.
pub const EGRESS_ISOLATED: &str = "egress-isolated";

/// Base chain: the egress side of forwarded traffic (from a local pod).
pub const EGRESS_FORWARD: &str = "egress-forward";
/// Base chain: the egress side of traffic from a local pod to the node itself.
pub const EGRESS_INPUT: &str = "egress-input";
/// Base chain: the ingress side of forwarded traffic (to a local pod).
pub const INGRESS_FORWARD: &str = "ingress-forward";
/// Base chain: the egress side of a local pod's connection the node sends on from its output
/// hook (IPVS, which DNATs at input).
pub const EGRESS_OUTPUT: &str = "egress-output";
/// Base chain: the ingress side of what the node sends to a local pod on another's behalf
/// (IPVS); the node's own traffic is let through.
pub const INGRESS_OUTPUT: &str = "ingress-output";

/// A namespace's dispatch for one direction, `in-ns-<hash>` / `out-ns-<hash>`: a jump to
/// the chain of each of its policies isolating that direction (for the pods it selects),
/// then deny. Policies isolate only pods of their own namespace, so creating or deleting one
/// rewrites its namespace's dispatch, not the cluster's.
pub fn namespace_chain(ingress: bool, namespace: &str) -> String {
    format!(
        "{}-ns-{}",
        if ingress { "in" } else { "out" },
        hash(namespace)
    )
}

/// 48 bits of FNV-1a 64 as 12 hex digits: enough to keep thousands of names apart, short
/// enough for readable rules.
pub fn hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:012x}", h >> 16)
}

/// The address set of a selector peer (or a policy's `podSelector`): `pods-<hash>`.
pub fn pods_set(key: &str) -> String {
    format!("pods-{}", hash(key))
}

/// The interval set of an `ipBlock`: `block-<hash>`.
pub fn block_set(key: &str) -> String {
    format!("block-{}", hash(key))
}

/// The `address . protocol . port` set a port name resolves to: `port-<hash>`.
pub fn port_set(name: &str) -> String {
    format!("port-{}", hash(name))
}

/// A policy's chain for one direction: `in-<hash>` / `out-<hash>` of `namespace/name`.
pub fn policy_chain(ingress: bool, id: &str) -> String {
    format!("{}-{}", if ingress { "in" } else { "out" }, hash(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_distinct() {
        assert_eq!(hash("x/a"), hash("x/a"));
        assert_ne!(hash("x/a"), hash("x/b"));
        assert_eq!(pods_set("k").len(), "pods-".len() + 12);
        assert_ne!(policy_chain(true, "x/p"), policy_chain(false, "x/p"));
    }
}
