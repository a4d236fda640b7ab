//! Encoded answers replayed: the node-local cache's hit path without parsing or encoding.
//!
//! A question the forwarder's cache answers gets the same answer, bytes and all, until the
//! entry expires, except for its ID and its TTLs, which count down. So the encoded answer to a
//! datagram is kept, keyed by the datagram's bytes after the ID (flags, question as sent,
//! EDNS), with the offsets of its records' TTL fields; a later identical datagram gets a copy
//! with its own ID and every TTL lowered by the seconds since it was kept, as the forwarder
//! would have lowered them. An entry lives as long as its smallest TTL, which the forwarder
//! clamped to its own entry's lifetime, so a replayed answer never outlives the cached one it
//! copies. Only answers that came from the forwarder's cache are kept (the forwarder decided
//! they may be cached), and only those with a record to count down. The EDNS record's TTL
//! field holds flags, not a TTL, and is left alone. Clients that randomise case (0x20) miss
//! and take the general path.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Instant;

use crate::server::forward::Popular;

/// Shards (each its own lock and byte budget).
const SHARDS: usize = 16;
/// Bytes one shard may hold before it is emptied (4 MiB in all).
const SHARD_BUDGET: usize = 1 << 18;
/// Longest datagram whose answer is kept.
const MAX_KEY_PACKET: usize = 512;
/// Bookkeeping bytes charged per entry on top of its data.
const ENTRY_OVERHEAD: usize = 96;
/// The OPT pseudo-record's type.
const OPT: u16 = 41;

/// What a replayed answer is, for the forwarder's hit counters and prefetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    /// Which forwarder's cache it copies.
    pub route: usize,
    /// NXDOMAIN or NODATA.
    pub negative: bool,
    /// The forwarder entry's popularity (with prefetch on), so a replayed hit counts too.
    pub popular: Option<Popular>,
}

#[derive(Debug)]
struct Entry {
    reply: Box<[u8]>,
    /// Offset of each TTL field and its value when kept.
    ttls: Box<[(usize, u32)]>,
    stored: Instant,
    /// Seconds it may be replayed: its smallest TTL.
    lifetime: u32,
    kept: Kept,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Box<[u8]>, Entry>,
    bytes: usize,
}

/// Encoded answers by question datagram.
#[derive(Debug)]
pub(crate) struct ReplayCache {
    shards: Vec<Mutex<Shard>>,
    hasher: RandomState,
}

impl Default for ReplayCache {
    fn default() -> Self {
        ReplayCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl ReplayCache {
    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        let i = (self.hasher.hash_one(key) as usize) % SHARDS;
        &self.shards[i]
    }

    /// The kept answer to `packet`, with its ID and TTLs as of now.
    #[cfg(test)]
    pub(crate) fn get(&self, packet: &[u8]) -> Option<(Vec<u8>, Kept)> {
        let mut reply = Vec::new();
        let kept = self.get_into(packet, &mut reply)?;
        Some((reply, kept))
    }

    /// [`ReplayCache::get`] into `reply` (replaced; left unspecified on a miss), so that the
    /// UDP loop reuses one buffer per answer of a batch.
    pub(crate) fn get_into(&self, packet: &[u8], reply: &mut Vec<u8>) -> Option<Kept> {
        let (id, key) = split(packet)?;
        let mut shard = self.shard(key).lock().ok()?;
        let entry = shard.map.get(key)?;
        let age = u32::try_from(entry.stored.elapsed().as_secs()).unwrap_or(u32::MAX);
        if age >= entry.lifetime {
            if let Some(gone) = shard.map.remove(key) {
                shard.bytes = shard.bytes.saturating_sub(cost(key, &gone));
            }
            return None;
        }
        reply.clear();
        reply.extend_from_slice(&entry.reply);
        reply[..2].copy_from_slice(id);
        for &(at, ttl) in entry.ttls.iter() {
            reply[at..at + 4].copy_from_slice(&ttl.saturating_sub(age).to_be_bytes());
        }
        Some(entry.kept.clone())
    }

    /// Keeps `reply`, the answer to `packet`, if it has a record whose TTL bounds it.
    pub(crate) fn put(&self, packet: &[u8], reply: &[u8], kept: Kept) {
        let Some((_, key)) = split(packet) else {
            return;
        };
        let Some(ttls) = ttl_fields(reply) else {
            return;
        };
        let Some(lifetime) = ttls.iter().map(|&(_, t)| t).min().filter(|t| *t > 0) else {
            return;
        };
        let entry = Entry {
            reply: reply.into(),
            ttls: ttls.into(),
            stored: Instant::now(),
            lifetime,
            kept,
        };
        let Ok(mut shard) = self.shard(key).lock() else {
            return;
        };
        let added = cost(key, &entry);
        if shard.bytes + added > SHARD_BUDGET {
            shard.map.clear();
            shard.bytes = 0;
        }
        if let Some(old) = shard.map.insert(key.into(), entry) {
            shard.bytes = shard.bytes.saturating_sub(cost(key, &old));
        }
        shard.bytes += added;
    }

    /// Answers kept now (expired ones included until they are asked for).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.map.len()))
            .sum()
    }
}

/// A datagram's ID and the rest, if it is short enough to be a key.
fn split(packet: &[u8]) -> Option<(&[u8], &[u8])> {
    (packet.len() > 2 && packet.len() <= MAX_KEY_PACKET).then(|| packet.split_at(2))
}

fn cost(key: &[u8], e: &Entry) -> usize {
    key.len() + e.reply.len() + e.ttls.len() * 16 + ENTRY_OVERHEAD
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The offset after the name at `at` (labels, ending in the root or a pointer).
fn skip_name(b: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *b.get(at)?;
        match len & 0xC0 {
            0x00 if len == 0 => return Some(at + 1),
            0x00 => at += 1 + usize::from(len),
            0xC0 => return b.get(at + 1).map(|_| at + 2),
            _ => return None,
        }
    }
}

/// Each record's TTL field (offset and value), OPT excluded; `None` if `b` is not a whole
/// message.
fn ttl_fields(b: &[u8]) -> Option<Vec<(usize, u32)>> {
    let questions = u16_at(b, 4)?;
    let records = [6, 8, 10]
        .iter()
        .map(|&at| u16_at(b, at).map(usize::from))
        .sum::<Option<usize>>()?;
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(b, at)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..records {
        at = skip_name(b, at)?;
        let rtype = u16_at(b, at)?;
        at += 4;
        let ttl = u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?);
        if rtype != OPT {
            out.push((at, ttl));
        }
        at += 4;
        at += 2 + usize::from(u16_at(b, at)?);
    }
    (at == b.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
    use hickory_proto::rr::rdata::{A, SOA};
    use hickory_proto::rr::{Name, RData, Record, RecordType};

    use super::*;

    fn question(id: u16, name: &str) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = id;
        m.add_query(Query::query(Name::from_str(name).unwrap(), RecordType::A));
        m.set_edns(Edns::new());
        m.to_vec().unwrap()
    }

    fn answer(question: &[u8], ttls: &[u32]) -> Vec<u8> {
        let q = Message::from_vec(question).unwrap();
        let mut m = Message::response(q.metadata.id, OpCode::Query);
        m.metadata.message_type = MessageType::Response;
        let name = q.queries[0].name().clone();
        m.add_query(q.queries[0].clone());
        for (i, ttl) in ttls.iter().enumerate() {
            let ip = A::new(10, 0, 0, u8::try_from(i).unwrap());
            m.add_answer(Record::from_rdata(name.clone(), *ttl, RData::A(ip)));
        }
        let soa = SOA::new(name.clone(), name.clone(), 1, 2, 3, 4, 5);
        m.add_authority(Record::from_rdata(name, 60, RData::SOA(soa)));
        m.set_edns(Edns::new());
        m.to_vec().unwrap()
    }

    const KEPT: Kept = Kept {
        route: 1,
        negative: false,
        popular: None,
    };

    #[test]
    fn a_replay_is_the_kept_answer_with_the_askers_id() {
        let cache = ReplayCache::default();
        let q = question(7, "web.default.svc.cluster.local.");
        let a = answer(&q, &[30, 20]);
        cache.put(&q, &a, KEPT);
        let again = question(9, "web.default.svc.cluster.local.");
        let (reply, kept) = cache.get(&again).unwrap();
        assert_eq!(kept, KEPT);
        assert_eq!(&reply[..2], &9u16.to_be_bytes());
        assert_eq!(
            &reply[2..],
            &a[2..],
            "same bytes, TTLs unchanged within the second"
        );
        let m = Message::from_vec(&reply).unwrap();
        let ttls: Vec<u32> = m.answers.iter().map(|r| r.ttl).collect();
        assert_eq!(ttls, vec![30, 20]);
        assert!(m.edns.is_some(), "the OPT record survives");
        // Another spelling of the question (0x20) is another key.
        let mut shouted = again.clone();
        let at = shouted.windows(3).position(|w| w == b"web").unwrap();
        shouted[at..at + 3].copy_from_slice(b"WEB");
        assert!(cache.get(&shouted).is_none());
    }

    #[test]
    fn ttls_count_down_and_the_smallest_ends_it() {
        let cache = ReplayCache::default();
        let q = question(1, "a.example.");
        let a = answer(&q, &[3, 2]);
        cache.put(&q, &a, KEPT);
        let ttl_fields = ttl_fields(&a).unwrap();
        assert_eq!(
            ttl_fields.iter().map(|f| f.1).collect::<Vec<_>>(),
            vec![3, 2, 60],
            "answers and authority, not the OPT record"
        );
        // Pretend it was kept a second ago.
        for shard in &cache.shards {
            for e in shard.lock().unwrap().map.values_mut() {
                e.stored -= std::time::Duration::from_secs(1);
            }
        }
        let (reply, _) = cache.get(&q).unwrap();
        let m = Message::from_vec(&reply).unwrap();
        assert_eq!(
            m.answers.iter().map(|r| r.ttl).collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert_eq!(m.authorities[0].ttl, 59);
        for shard in &cache.shards {
            for e in shard.lock().unwrap().map.values_mut() {
                e.stored -= std::time::Duration::from_secs(1);
            }
        }
        assert!(cache.get(&q).is_none(), "expired with its smallest TTL");
        assert_eq!(cache.len(), 0, "and removed");
    }

    #[test]
    fn what_cannot_count_down_is_not_kept() {
        let cache = ReplayCache::default();
        let q = question(1, "a.example.");
        // No record at all (a truncated answer), a zero TTL, a broken message.
        let mut bare = Message::response(1, OpCode::Query);
        bare.metadata.truncation = true;
        cache.put(&q, &bare.to_vec().unwrap(), KEPT);
        cache.put(&q, &answer(&q, &[0]), KEPT);
        let a = answer(&q, &[30]);
        cache.put(&q, &a[..a.len() - 3], KEPT);
        assert_eq!(cache.len(), 0);
        // Questions too long to be keys.
        let long = vec![0u8; MAX_KEY_PACKET + 1];
        cache.put(&long, &a, KEPT);
        assert!(cache.get(&long).is_none());
    }

    #[test]
    fn random_bytes_never_panic_the_walker() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 0..2000usize {
            let bytes: Vec<u8> = (0..len % 300)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let _ = ttl_fields(&bytes);
        }
    }

    #[test]
    fn the_budget_bounds_a_shard() {
        let cache = ReplayCache::default();
        for i in 0..20_000u32 {
            let q = question(1, &format!("n{i}.example."));
            cache.put(&q, &answer(&q, &[30]), KEPT);
        }
        let bytes: usize = cache.shards.iter().map(|s| s.lock().unwrap().bytes).sum();
        assert!(bytes <= SHARDS * SHARD_BUDGET, "{bytes}");
        assert!(cache.len() < 20_000);
    }
}
