//! A cache of encoded UDP answers that belongs to one published zone snapshot.
//!
//! A question the zone answers without I/O is answered the same way every time for the life of
//! a snapshot, except for its ID and the order of a headless service's addresses. So the first
//! answer to a datagram is kept, keyed by the datagram's bytes after the ID (flags, question as
//! sent, EDNS record), and later identical questions get a copy with their own ID. The key keeps
//! the question's case: hickory compresses names case-sensitively, so an answer's bytes (an SRV
//! target written as a pointer into the question or in full) depend on how the question was
//! spelled; with the exact bytes as the key a hit is byte for byte what a fresh answer would be.
//! Clients that randomise case (0x20) simply miss and take the general path.
//!
//! Address answers that the zone shuffled are kept with all their records pre-encoded (16 bytes
//! for A, 28 for AAAA, owners are pointers to the question); each hit draws a fresh random
//! selection and order of them with a partial Fisher–Yates shuffle, which is what the zone's
//! shuffle followed by truncation would give. Any other answer that drew randomness (SRV of a
//! headless service) is not kept.
//!
//! **Architecture Invariant:** a cache lives inside the snapshot it was filled from
//! ([`Served`]); publishing a zone publishes a new, empty cache with it, atomically, so a cached
//! answer never outlives the data it came from.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rand::RngCore;

use super::wire::SoaWire;
use crate::zone::Zone;

/// Shards of the cache (each its own lock and byte budget).
const SHARDS: usize = 16;
/// Bytes one shard may hold before it is emptied: 4 MiB for the whole cache, ~13k answers of
/// ~300 bytes (a larger budget let a churning cache add ~20 MB of RSS in the bench).
const SHARD_BUDGET: usize = 1 << 18;
/// Longest datagram whose answer is kept (a key is the datagram minus its ID).
pub(crate) const MAX_KEY_PACKET: usize = 512;
/// Bookkeeping bytes charged per entry on top of its data.
const ENTRY_OVERHEAD: usize = 96;
/// Slots of the admission filter (8 bytes each, 512 KiB, zero pages until touched).
const DOORKEEPER: usize = 1 << 16;

/// A published zone and the answers computed from it.
#[derive(Debug)]
pub(crate) struct Served {
    pub(crate) zone: Arc<Zone>,
    pub(crate) cache: AnswerCache,
    /// The cluster zone's SOA ([`Zone::soa`]), taken apart once for the negative answers
    /// (`None` if it cannot be written: those answers then leave it out, with TC).
    pub(crate) soa: Option<Box<SoaWire>>,
}

impl Served {
    pub(crate) fn new(zone: Arc<Zone>) -> Self {
        Served {
            soa: SoaWire::new(&zone.soa()).map(Box::new),
            zone,
            cache: AnswerCache::default(),
        }
    }
}

/// Encoded answers keyed by the question datagram without its ID.
///
/// A question's answer is kept the second time it misses: the first miss only leaves the
/// question's hash in a slot of the admission filter (the "doorkeeper"), so questions asked once
/// (random or mistyped names, an NXDOMAIN flood) cost no allocation and never push out the
/// answers that are asked again and again.
pub(crate) struct AnswerCache {
    hasher: RandomState,
    shards: [RwLock<Shard>; SHARDS],
    doorkeeper: Box<[AtomicU64]>,
}

impl std::fmt::Debug for AnswerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (entries, bytes) = self.stats();
        f.debug_struct("AnswerCache")
            .field("entries", &entries)
            .field("bytes", &bytes)
            .finish()
    }
}

impl Default for AnswerCache {
    fn default() -> Self {
        AnswerCache {
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| RwLock::new(Shard::default())),
            doorkeeper: (0..DOORKEEPER).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

#[derive(Debug, Default)]
struct Shard {
    /// Keyed by the datagram after its ID, hashed once per datagram by the cache's keyed
    /// SipHash ([`Key`]): the map takes that hash as it is instead of hashing the bytes again.
    entries: HashMap<Key, Entry, BuildHasherDefault<KnownHash>>,
    bytes: usize,
}

/// A kept question's bytes with their hash (from [`AnswerCache::hasher`]).
#[derive(Debug)]
struct Key {
    hash: u64,
    bytes: Box<[u8]>,
}

/// A question's bytes and hash, borrowed: what the map is probed with (through
/// `dyn AsProbe`, which both [`Key`] and `Probe` are).
#[derive(Clone, Copy)]
struct Probe<'a> {
    hash: u64,
    bytes: &'a [u8],
}

trait AsProbe {
    fn probe(&self) -> Probe<'_>;
}

impl AsProbe for Key {
    fn probe(&self) -> Probe<'_> {
        Probe {
            hash: self.hash,
            bytes: &self.bytes,
        }
    }
}

impl AsProbe for Probe<'_> {
    fn probe(&self) -> Probe<'_> {
        *self
    }
}

impl<'a> Borrow<dyn AsProbe + 'a> for Key {
    fn borrow(&self) -> &(dyn AsProbe + 'a) {
        self
    }
}

impl Hash for dyn AsProbe + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.probe().hash);
    }
}

impl PartialEq for dyn AsProbe + '_ {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.probe(), other.probe());
        a.hash == b.hash && a.bytes == b.bytes
    }
}

impl Eq for dyn AsProbe + '_ {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn AsProbe).hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn AsProbe) == (other as &dyn AsProbe)
    }
}

impl Eq for Key {}

/// The map's hasher: the hash a [`Key`] carries, as it is (it is already a keyed SipHash).
#[derive(Default)]
struct KnownHash(u64);

impl Hasher for KnownHash {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is called (by `Key`'s `Hash`); anything else still hashes.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// One kept answer.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The whole answer as first sent (its ID is overwritten on every hit).
    bytes: Box<[u8]>,
    shuffle: Option<Shuffle>,
}

/// Address records drawn afresh on every hit.
#[derive(Debug)]
struct Shuffle {
    /// Offset of the first address record in `bytes`.
    at: usize,
    /// How many records the answer holds (fewer than `records` when it was truncated).
    shown: usize,
    /// Size of one record (all of one family).
    size: usize,
    /// Every address record the zone gave, encoded.
    records: Box<[u8]>,
}

/// Where an encoded answer holds its address records (see `wire::encode_fast`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AddressRegion {
    pub(crate) at: usize,
    pub(crate) shown: usize,
}

impl Entry {
    /// An entry for `bytes`. `shuffled` holds the addresses the zone shuffled, with where
    /// `bytes` has them; `None` when the answer drew no randomness. Returns `None` when the
    /// answer cannot be replayed (mixed address families).
    pub(crate) fn new(
        bytes: &[u8],
        shuffled: Option<((&[IpAddr], u32), AddressRegion)>,
    ) -> Option<Entry> {
        let shuffle = match shuffled {
            None => None,
            Some(((ips, ttl), region)) => {
                let first = ips.first()?;
                let v4 = first.is_ipv4();
                if ips.iter().any(|ip| ip.is_ipv4() != v4) {
                    return None;
                }
                let size = if v4 { 16 } else { 28 };
                let mut records = Vec::with_capacity(ips.len() * size);
                for ip in ips {
                    address_record(&mut records, *ip, ttl);
                }
                if region.shown > ips.len() || region.at + region.shown * size > bytes.len() {
                    return None;
                }
                Some(Shuffle {
                    at: region.at,
                    shown: region.shown,
                    size,
                    records: records.into_boxed_slice(),
                })
            }
        };
        Some(Entry {
            bytes: bytes.into(),
            shuffle,
        })
    }

    fn cost(&self, key: &[u8]) -> usize {
        key.len()
            + self.bytes.len()
            + self.shuffle.as_ref().map_or(0, |s| s.records.len())
            + ENTRY_OVERHEAD
    }

    /// Write this answer for `packet` (same bytes after the ID) into `out`.
    fn write(&self, packet: &[u8], out: &mut Vec<u8>, rng: &mut FastRng) {
        out.clear();
        match &self.shuffle {
            None => out.extend_from_slice(&self.bytes),
            Some(s) => {
                out.extend_from_slice(&self.bytes[..s.at]);
                let start = out.len();
                out.extend_from_slice(&s.records);
                let n = s.records.len() / s.size;
                let region = &mut out[start..];
                for i in 0..s.shown {
                    let j = i + rng.below(n - i);
                    if j != i {
                        let (low, high) = region.split_at_mut(j * s.size);
                        low[i * s.size..(i + 1) * s.size].swap_with_slice(&mut high[..s.size]);
                    }
                }
                out.truncate(start + s.shown * s.size);
                out.extend_from_slice(&self.bytes[s.at + s.shown * s.size..]);
            }
        }
        out[0..2].copy_from_slice(&packet[0..2]);
    }
}

impl AnswerCache {
    /// Answer `packet` from the cache into `out`; on a miss, the packet's hash for
    /// [`AnswerCache::admit`] (`None`: never kept).
    pub(crate) fn answer(
        &self,
        packet: &[u8],
        out: &mut Vec<u8>,
        rng: &mut FastRng,
    ) -> Result<(), Option<u64>> {
        let Some(key) = packet.get(2..).filter(|_| packet.len() <= MAX_KEY_PACKET) else {
            return Err(None);
        };
        let h = self.hasher.hash_one(key);
        let Ok(shard) = self.shards[shard_index(h)].read() else {
            return Err(None);
        };
        let probe = Probe {
            hash: h,
            bytes: key,
        };
        match shard.entries.get(&probe as &dyn AsProbe) {
            Some(entry) => {
                entry.write(packet, out, rng);
                Ok(())
            }
            None => Err(Some(h)),
        }
    }

    /// Whether an answer to `packet` should be kept: true when it is a plain question (see
    /// [`plain_question`]) that missed before (and its hash is still in the filter).
    pub(crate) fn admit(&self, packet: &[u8]) -> bool {
        let Some(key) = packet.get(2..).filter(|_| packet.len() <= MAX_KEY_PACKET) else {
            return false;
        };
        self.admit_hashed(packet, self.hasher.hash_one(key))
    }

    /// [`AnswerCache::admit`] with the hash [`AnswerCache::answer`] gave on its miss.
    pub(crate) fn admit_hashed(&self, packet: &[u8], h: u64) -> bool {
        if packet.len() > MAX_KEY_PACKET || !plain_question(packet) {
            return false;
        }
        // Two candidate slots, so that two questions sharing one slot do not keep evicting
        // each other's hash forever.
        let first = &self.doorkeeper[(h as usize) % DOORKEEPER];
        let second = &self.doorkeeper[((h >> 32) as usize ^ (h as usize >> 16)) % DOORKEEPER];
        let (a, b) = (
            first.load(Ordering::Relaxed),
            second.load(Ordering::Relaxed),
        );
        if a == h || b == h {
            // Admitted: its answer is about to be kept, the slot is free for others.
            let slot = if a == h { first } else { second };
            let _ = slot.compare_exchange(h, 0, Ordering::Relaxed, Ordering::Relaxed);
            return true;
        }
        let slot = if a == 0 || (b != 0 && h & 1 == 0) {
            first
        } else {
            second
        };
        slot.store(h, Ordering::Relaxed);
        false
    }

    /// Keep `entry` as the answer to datagrams equal to `packet` after the ID.
    pub(crate) fn insert(&self, packet: &[u8], entry: Entry) {
        let Some(key) = packet.get(2..).filter(|_| packet.len() <= MAX_KEY_PACKET) else {
            return;
        };
        let cost = entry.cost(key);
        let hash = self.hasher.hash_one(key);
        let Ok(mut shard) = self.shards[shard_index(hash)].write() else {
            return;
        };
        if shard.bytes + cost > SHARD_BUDGET {
            // Full (many distinct questions, e.g. random names): start over rather than track
            // recency on the read path.
            shard.entries.clear();
            shard.bytes = 0;
        }
        let key = Key {
            hash,
            bytes: key.into(),
        };
        if shard.entries.insert(key, entry).is_none() {
            shard.bytes += cost;
        }
    }

    /// Entries and bytes held (for tests and the bench).
    pub(crate) fn stats(&self) -> (usize, usize) {
        self.shards
            .iter()
            .filter_map(|s| s.read().ok())
            .fold((0, 0), |(n, b), s| (n + s.entries.len(), b + s.bytes))
    }
}

/// A shard from bits of the hash that the shard's map does not use (hashbrown takes its
/// buckets from the low bits and its tags from the top seven).
fn shard_index(h: u64) -> usize {
    (h >> 40) as usize % SHARDS
}

/// Whether `packet` is one question with a name free of compression pointers, and nothing else
/// but an optional OPT record at the end: then its answer depends on its bytes after the ID
/// alone. (A pointer may point into the ID, so two datagrams equal after the ID could then ask
/// different names; the fuzz target found one.)
pub(crate) fn plain_question(packet: &[u8]) -> bool {
    let count = |at: usize| {
        packet
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    if count(4) != Some(1) || count(6) != Some(0) || count(8) != Some(0) {
        return false;
    }
    let Some(end) = super::wire::question_end(packet) else {
        return false;
    };
    match count(10) {
        Some(0) => end == packet.len(),
        // OPT: root owner, type 41, class (payload size), TTL, then its data to the end.
        Some(1) => {
            packet.get(end..end + 3) == Some(&[0, 0, 41][..])
                && count(end + 9).map(|len| end + 11 + usize::from(len)) == Some(packet.len())
        }
        _ => false,
    }
}

/// Append `<pointer to the question> A|AAAA IN <ttl> <ip>`.
pub(crate) fn address_record(out: &mut Vec<u8>, ip: IpAddr, ttl: u32) {
    // Owner: a pointer to the question name at offset 12.
    out.extend_from_slice(&[0xc0, 12]);
    match ip {
        IpAddr::V4(v4) => {
            out.extend_from_slice(&[0, 1, 0, 1]);
            out.extend_from_slice(&ttl.to_be_bytes());
            out.extend_from_slice(&[0, 4]);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.extend_from_slice(&[0, 28, 0, 1]);
            out.extend_from_slice(&ttl.to_be_bytes());
            out.extend_from_slice(&[0, 16]);
            out.extend_from_slice(&v6.octets());
        }
    }
}

/// A small, fast generator (wyrand) for shuffling answers; clients must not rely on the order,
/// nothing here needs to be unpredictable to an attacker beyond that.
#[derive(Debug, Clone)]
pub(crate) struct FastRng(u64);

impl FastRng {
    /// Seeded from the thread's generator.
    pub(crate) fn new() -> Self {
        FastRng(rand::random())
    }

    #[cfg(test)]
    pub(crate) fn seeded(seed: u64) -> Self {
        FastRng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// A number in `0..n` (`n` > 0; Lemire's multiply, bias below 2^-50 for answer sizes).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

impl RngCore for FastRng {
    fn next_u32(&mut self) -> u32 {
        self.next() as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.next()
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.next().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// Passes a generator through and notes whether it was drawn from.
pub(crate) struct Noting<'a, R: RngCore> {
    inner: &'a mut R,
    pub(crate) used: bool,
}

impl<'a, R: RngCore> Noting<'a, R> {
    pub(crate) fn new(inner: &'a mut R) -> Self {
        Noting { inner, used: false }
    }
}

impl<R: RngCore> RngCore for Noting<'_, R> {
    fn next_u32(&mut self) -> u32 {
        self.used = true;
        self.inner.next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.used = true;
        self.inner.next_u64()
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.used = true;
        self.inner.fill_bytes(dst);
    }
}
