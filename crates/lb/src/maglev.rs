//! Maglev consistent hashing (Eisenbud et al., NSDI 2016, §3.4): a lookup table of prime size
//! `M` in which every backend owns ⌊M/N⌋ or ⌈M/N⌉ slots (with equal weights), and adding or
//! removing one backend moves few slots besides its own.
//!
//! Each backend's permutation comes from two hashes of its identity (address and port) that
//! this crate controls ([`crate::hash::jhash`] with fixed seeds), so every node, and every
//! dataplane, builds the identical table from the same endpoint set, whatever order the
//! endpoints arrive in. A flow reads slot `jhash(saddr . sport) mod M` (see
//! [`MaglevTable::slot_for`]), which nftables evaluates with the same expression.

use std::net::SocketAddr;

use crate::hash::{
    FlowKeyBytes, SEED_MAGLEV_FLOW, SEED_MAGLEV_OFFSET, SEED_MAGLEV_SKIP, jhash, nft_jhash,
};

/// Table size used by the paper, Envoy and the userspace dataplane: supports ~650 equally
/// weighted backends at ≤ 1 % imbalance (M > 100 · N).
pub const DEFAULT_TABLE_SIZE: u32 = 65_537;
/// Small prime table sizes, for dataplanes that store the table as kernel map elements and
/// for tests; [`table_size_for`] picks the smallest that keeps M > 100 · N.
pub const SMALL_PRIMES: [u32; 7] = [251, 509, 1_021, 2_039, 4_093, 8_191, 16_381];

/// A table that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MaglevError {
    #[error("Maglev table size {0} is not a prime number")]
    NotPrime(u32),
    #[error("Maglev table size {size} is smaller than the {backends} backends it must hold")]
    TooSmall { size: u32, backends: usize },
    #[error("Maglev backend {0} has weight 0 (a weight-0 backend must be left out)")]
    ZeroWeight(SocketAddr),
    #[error("Maglev backend {0} is listed twice")]
    Duplicate(SocketAddr),
}

/// Whether `n` is prime (trial division; table sizes are small).
pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2u32;
    while u64::from(d) * u64::from(d) <= u64::from(n) {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

/// The smallest size from [`SMALL_PRIMES`] (then [`DEFAULT_TABLE_SIZE`]) above `100 · backends`,
/// capped at [`DEFAULT_TABLE_SIZE`].
pub fn table_size_for(backends: usize) -> u32 {
    let want = (backends as u64).saturating_mul(100);
    SMALL_PRIMES
        .into_iter()
        .find(|p| u64::from(*p) > want)
        .unwrap_or(DEFAULT_TABLE_SIZE)
}

/// A backend's identity bytes: address then port, as [`FlowKeyBytes::addr_port`] lays them out.
fn identity(addr: SocketAddr) -> FlowKeyBytes {
    FlowKeyBytes::addr_port(addr.ip(), addr.port())
}

/// A built lookup table: slot → index into the backend slice it was built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaglevTable {
    entries: Vec<u32>,
}

impl MaglevTable {
    /// Builds the table for `backends` (address, weight) with `size` slots. A backend of weight
    /// `w` takes `w` turns per round, so its share is proportional to its weight. The result
    /// does not depend on the order of `backends` (ties are broken by address, not position).
    /// An empty backend list gives an empty table.
    pub fn build(backends: &[(SocketAddr, u32)], size: u32) -> Result<Self, MaglevError> {
        if !is_prime(size) {
            return Err(MaglevError::NotPrime(size));
        }
        if backends.len() > size as usize {
            return Err(MaglevError::TooSmall {
                size,
                backends: backends.len(),
            });
        }
        if backends.is_empty() {
            return Ok(Self {
                entries: Vec::new(),
            });
        }
        // Visit backends in address order so every caller's ordering yields the same table.
        let mut order: Vec<usize> = (0..backends.len()).collect();
        order.sort_by_key(|&i| backends[i].0);
        for pair in order.windows(2) {
            if backends[pair[0]].0 == backends[pair[1]].0 {
                return Err(MaglevError::Duplicate(backends[pair[0]].0));
            }
        }
        if let Some((addr, _)) = backends.iter().find(|(_, w)| *w == 0) {
            return Err(MaglevError::ZeroWeight(*addr));
        }
        let gcd = backends.iter().fold(0u32, |g, (_, w)| gcd(g, *w));
        let m = u64::from(size);
        let perms: Vec<(u64, u64, u32)> = order
            .iter()
            .map(|&i| {
                let key = identity(backends[i].0);
                let offset = u64::from(jhash(key.as_bytes(), SEED_MAGLEV_OFFSET)) % m;
                let skip = u64::from(jhash(key.as_bytes(), SEED_MAGLEV_SKIP)) % (m - 1) + 1;
                (offset, skip, backends[i].1 / gcd)
            })
            .collect();
        const EMPTY: u32 = u32::MAX;
        let mut entries = vec![EMPTY; size as usize];
        // Each backend's position in its permutation, `(offset + k · skip) mod M`, advanced by
        // one addition and a conditional subtraction instead of a multiplication and a modulo.
        let mut pos: Vec<u64> = perms.iter().map(|p| p.0).collect();
        let mut filled = 0usize;
        'fill: loop {
            for (j, &(_, skip, turns)) in perms.iter().enumerate() {
                for _ in 0..turns {
                    // Walk backend j's permutation to its next free slot.
                    while entries[pos[j] as usize] != EMPTY {
                        pos[j] += skip;
                        if pos[j] >= m {
                            pos[j] -= m;
                        }
                    }
                    entries[pos[j] as usize] = order[j] as u32;
                    filled += 1;
                    if filled == entries.len() {
                        break 'fill;
                    }
                }
            }
        }
        Ok(Self { entries })
    }

    /// The number of slots (`M`), 0 for an empty table.
    pub fn size(&self) -> u32 {
        self.entries.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Slot → backend index, in slot order (what a kernel map is filled with).
    pub fn entries(&self) -> &[u32] {
        &self.entries
    }

    /// The slot a flow key reads: `jhash key mod M seed SEED_MAGLEV_FLOW` as nftables computes
    /// it.
    pub fn slot_for(&self, key: &FlowKeyBytes) -> Option<u32> {
        (!self.is_empty()).then(|| nft_jhash(key.as_bytes(), SEED_MAGLEV_FLOW, self.size()))
    }

    /// The backend index for a flow key.
    pub fn lookup(&self, key: &FlowKeyBytes) -> Option<usize> {
        self.slot_for(key)
            .map(|s| self.entries[s as usize] as usize)
    }

    /// Slots owned by each backend index (`count` backends).
    pub fn shares(&self, count: usize) -> Vec<u32> {
        let mut v = vec![0u32; count];
        for e in &self.entries {
            if let Some(c) = v.get_mut(*e as usize) {
                *c += 1;
            }
        }
        v
    }
}

impl MaglevTable {
    /// Rewrites entry `i` to `map[i]` (for callers that built the table over a subset).
    pub(crate) fn remap(mut self, map: &[u32]) -> Self {
        for e in &mut self.entries {
            *e = map[*e as usize];
        }
        self
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes() {
        assert!(is_prime(251) && is_prime(65_537) && is_prime(2));
        assert!(!is_prime(1) && !is_prime(65_536) && !is_prime(255));
        assert!(SMALL_PRIMES.iter().all(|p| is_prime(*p)));
        assert_eq!(table_size_for(2), 251);
        assert_eq!(table_size_for(3), 509);
        assert_eq!(table_size_for(100), 16_381);
        assert_eq!(table_size_for(1_000), DEFAULT_TABLE_SIZE);
    }

    #[test]
    fn rejects_bad_input() {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert_eq!(
            MaglevTable::build(&[(a, 1)], 250),
            Err(MaglevError::NotPrime(250))
        );
        assert_eq!(
            MaglevTable::build(&[(a, 1), (a, 1)], 251),
            Err(MaglevError::Duplicate(a))
        );
        assert_eq!(
            MaglevTable::build(&[(a, 0)], 251),
            Err(MaglevError::ZeroWeight(a))
        );
        assert!(MaglevTable::build(&[], 251).unwrap().is_empty());
    }
}
