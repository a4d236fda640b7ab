//! Forwarding questions outside the cluster zone to upstream resolvers, with a cache that
//! honours record TTLs and negative TTLs (RFC 2308: the SOA's minimum, bounded by its TTL).
//!
//! UDP first; a truncated UDP answer is retried over TCP. Upstreams are tried in order until one
//! answers. The cache key is (lower-case name, type, class); entries age, so a cached answer is
//! served with TTLs decremented by the time it spent in the cache.
//!
//! [`ForwarderOptions`] set what CoreDNS's `forward` and `cache` plugins set for NodeLocal
//! DNSCache: `force_tcp` (every question over TCP, so no UDP conntrack entry is made per
//! question), the caps on positive and negative TTLs (`cache { success N 30; denial N 5 }`) and
//! `prefetch` ([`Prefetch`]: a popular answer is asked again before it expires).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Longest time any answer is cached (CoreDNS `cache` default).
const MAX_TTL: u32 = 3600;
/// Longest time a negative answer is cached (CoreDNS `cache` default).
const MAX_NEGATIVE_TTL: u32 = 1800;
/// Entries kept before the cache drops expired ones (and then everything, if still full).
const MAX_ENTRIES: usize = 10_000;

/// Why forwarding failed; the client gets SERVFAIL (or REFUSED when there is no upstream).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No upstream is configured (or all were removed to avoid a loop).
    #[error("no upstream resolver configured")]
    NoUpstream,
    /// Every upstream failed or timed out.
    #[error("every upstream failed; last error: {0}")]
    AllFailed(String),
}

/// An upstream answer as the client should see it.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub message: Message,
    /// Whether it came from the cache.
    pub cached: bool,
    /// The cache entry's popularity, with [`ForwarderOptions::prefetch`] on.
    pub popular: Option<Popular>,
    /// This hit made the entry due for a prefetch: whoever holds the forwarder should run
    /// [`Forwarder::prefetch`] with `popular` (in a task of its own; the client need not wait).
    pub prefetch_due: bool,
}

/// CoreDNS's `cache { prefetch AMOUNT [DURATION] [PERCENTAGE%] }`: an answer asked for from
/// the cache `amount` times in a row, each question within `duration` of the one before
/// ("popular"), is asked again upstream once its remaining TTL is at most `percentage` % of the
/// TTL it was kept for (rounded up, so at the latest in its last second), and the fresh answer
/// replaces it: a popular name is never a miss. Hits are counted as CoreDNS's `freq` counts
/// them (a gap of `duration` or more starts again at one) and carried over to the fresh entry.
/// One prefetch at a time per entry; a failed one is tried again on the next hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    pub amount: u32,
    pub duration: Duration,
    /// 10 to 90, as CoreDNS accepts.
    pub percentage: u8,
}

impl Prefetch {
    /// The remaining TTL at or under which an entry kept for `ttl` seconds is prefetched.
    fn threshold(&self, ttl: u32) -> u64 {
        (u64::from(self.percentage) * u64::from(ttl)).div_ceil(100)
    }
}

/// How often one cache entry was asked for, for [`Prefetch`].
#[derive(Debug)]
struct Popularity {
    key: Key,
    stored: Instant,
    ttl: u32,
    /// Hits in a row and the last one's time.
    freq: Mutex<(u32, Instant)>,
    prefetching: AtomicBool,
}

/// A cached answer's popularity (shared by the node-local replay of that answer).
#[derive(Debug, Clone)]
pub struct Popular(Arc<Popularity>);

/// The same entry's.
impl PartialEq for Popular {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Popular {}

impl Popular {
    fn new(key: Key, stored: Instant, ttl: u32, hits: u32) -> Self {
        Popular(Arc::new(Popularity {
            key,
            stored,
            ttl,
            freq: Mutex::new((hits, stored)),
            prefetching: AtomicBool::new(false),
        }))
    }

    fn hits(&self) -> u32 {
        self.0.freq.lock().map_or(0, |f| f.0)
    }

    /// Counts a hit at `now`; whether it makes the entry due (then marked in flight).
    fn hit(&self, p: &Prefetch, now: Instant) -> bool {
        let p0 = &self.0;
        let hits = match p0.freq.lock() {
            Ok(mut f) => {
                f.0 = if now.duration_since(f.1) < p.duration {
                    f.0.saturating_add(1)
                } else {
                    1
                };
                f.1 = now;
                f.0
            }
            Err(_) => return false,
        };
        let age = now.duration_since(p0.stored).as_secs();
        let remaining = u64::from(p0.ttl).saturating_sub(age);
        hits >= p.amount
            && remaining <= p.threshold(p0.ttl)
            && !p0.prefetching.swap(true, Ordering::AcqRel)
    }
}

/// How a [`Forwarder`] talks to its upstreams and how long it keeps their answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwarderOptions {
    /// How long one upstream gets to answer.
    pub timeout: Duration,
    /// Ask over TCP only (CoreDNS `forward … { force_tcp }`).
    pub force_tcp: bool,
    /// Longest time a positive answer is kept (CoreDNS `cache { success _ TTL }`).
    pub max_ttl: u32,
    /// Longest time a negative answer (NXDOMAIN, NODATA) is kept (`cache { denial _ TTL }`).
    pub max_negative_ttl: u32,
    /// Ask popular answers again before they expire (`cache { prefetch … }`; off by default,
    /// as in CoreDNS and upstream's node-local Corefile).
    pub prefetch: Option<Prefetch>,
}

impl Default for ForwarderOptions {
    fn default() -> Self {
        ForwarderOptions {
            timeout: Duration::from_secs(2),
            force_tcp: false,
            max_ttl: MAX_TTL,
            max_negative_ttl: MAX_NEGATIVE_TTL,
            prefetch: None,
        }
    }
}

/// What a forwarder did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForwarderStats {
    /// Questions answered from the cache, positive answers.
    pub hits_success: u64,
    /// Questions answered from the cache, negative answers.
    pub hits_denial: u64,
    /// Questions that missed the cache.
    pub misses: u64,
    /// Questions sent to an upstream (each attempt, each upstream), prefetches included.
    pub upstream_queries: u64,
    /// Prefetches started ([`Prefetch`]).
    pub prefetches: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits_success: AtomicU64,
    hits_denial: AtomicU64,
    misses: AtomicU64,
    upstream_queries: AtomicU64,
    prefetches: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    message: Message,
    stored: Instant,
    ttl: u32,
    /// With prefetch on.
    popular: Option<Popular>,
}

type Key = (Name, RecordType, DNSClass);

/// Upstream resolvers plus a shared answer cache.
#[derive(Debug)]
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    options: ForwarderOptions,
    cache: Mutex<HashMap<Key, Entry>>,
    counters: Counters,
}

impl Forwarder {
    /// Forward to `upstreams`, dropping any equal to `own` (our listen address), so that a
    /// resolv.conf naming this server never makes it forward to itself.
    pub fn new(upstreams: Vec<SocketAddr>, own: Option<SocketAddr>, timeout: Duration) -> Self {
        Self::with_options(
            upstreams,
            own,
            ForwarderOptions {
                timeout,
                ..ForwarderOptions::default()
            },
        )
    }

    /// [`Forwarder::new`] with every option.
    pub fn with_options(
        upstreams: Vec<SocketAddr>,
        own: Option<SocketAddr>,
        options: ForwarderOptions,
    ) -> Self {
        let upstreams = upstreams
            .into_iter()
            .filter(|u| match own {
                Some(own) => !is_same_endpoint(*u, own),
                None => true,
            })
            .collect();
        Forwarder {
            upstreams,
            options,
            cache: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    /// Cache hits and misses and upstream questions so far.
    pub fn stats(&self) -> ForwarderStats {
        let c = &self.counters;
        ForwarderStats {
            hits_success: c.hits_success.load(Ordering::Relaxed),
            hits_denial: c.hits_denial.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            upstream_queries: c.upstream_queries.load(Ordering::Relaxed),
            prefetches: c.prefetches.load(Ordering::Relaxed),
        }
    }

    /// Answers kept now (expired ones included until they are swept).
    pub fn cache_len(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.len())
    }

    /// The upstreams in use.
    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// Resolve `name`/`qtype`/`qclass` upstream, from the cache when fresh.
    pub async fn resolve(
        &self,
        name: &Name,
        qtype: RecordType,
        qclass: DNSClass,
    ) -> Result<Upstream, ForwardError> {
        if self.upstreams.is_empty() {
            return Err(ForwardError::NoUpstream);
        }
        if let Some(hit) = self.resolve_cached(name, qtype, qclass) {
            return Ok(hit);
        }
        let key = (name.to_lowercase(), qtype, qclass);
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let (mut message, kept) = self
            .ask_and_keep(name, key, 0)
            .await
            .map_err(ForwardError::AllFailed)?;
        if let Some(ttl) = kept {
            // As CoreDNS's cache: no record outlives the cap, also on a miss.
            clamp_ttls(&mut message, ttl);
        }
        Ok(Upstream {
            message,
            cached: false,
            popular: None,
            prefetch_due: false,
        })
    }

    /// Asks the upstreams for `name` in turn until one answers and keeps that answer under
    /// `key` (see [`Self::store`]): the answer and the TTL kept, if it was; the last error when
    /// none answered. Every question sent is counted.
    async fn ask_and_keep(
        &self,
        name: &Name,
        key: Key,
        hits: u32,
    ) -> Result<(Message, Option<u32>), String> {
        let (qtype, qclass) = (key.1, key.2);
        let mut last_error = String::from("no attempt");
        for upstream in &self.upstreams {
            self.counters
                .upstream_queries
                .fetch_add(1, Ordering::Relaxed);
            match self.exchange(*upstream, name, qtype, qclass).await {
                Ok(message) => {
                    let kept = self.store(key, &message, hits);
                    return Ok((message, kept));
                }
                Err(e) => last_error = format!("{upstream}: {e}"),
            }
        }
        Err(last_error)
    }

    /// The cached answer to `name`/`qtype`/`qclass` if there is a fresh one (counted as a
    /// hit); `None` asks nothing and counts nothing (the caller goes on to [`Self::resolve`]).
    pub fn resolve_cached(
        &self,
        name: &Name,
        qtype: RecordType,
        qclass: DNSClass,
    ) -> Option<Upstream> {
        let (message, popular) = self.cached(&(name.to_lowercase(), qtype, qclass))?;
        self.count_hit(is_negative(&message));
        let prefetch_due = popular.as_ref().is_some_and(|p| self.note_hit(p));
        Some(Upstream {
            message,
            cached: true,
            popular,
            prefetch_due,
        })
    }

    /// Counts a hit of the entry `popular` belongs to (the node-local replay calls it for the
    /// hits it serves from the entry's bytes); whether that makes the entry due for
    /// [`Self::prefetch`].
    pub fn note_hit(&self, popular: &Popular) -> bool {
        self.options
            .prefetch
            .is_some_and(|p| popular.hit(&p, Instant::now()))
    }

    /// Asks the upstreams again for the entry `popular` belongs to and keeps the answer in its
    /// place, with the hits counted so far (CoreDNS's `doPrefetch`). When no upstream gives an
    /// answer to keep, the entry stays as it was and a later hit may try again.
    pub async fn prefetch(&self, popular: &Popular) {
        self.counters.prefetches.fetch_add(1, Ordering::Relaxed);
        let key = popular.0.key.clone();
        match self.ask_and_keep(&key.0, key.clone(), popular.hits()).await {
            Ok((_, Some(_))) => return,
            Ok((_, None)) => {}
            Err(e) => tracing::debug!(name = %key.0, "prefetch: {e}"),
        }
        popular.0.prefetching.store(false, Ordering::Release);
    }

    /// Counts a hit served from a copy of this cache's answer (the node-local replay), so the
    /// hit counters say what clients got from the cache.
    pub(crate) fn count_hit(&self, negative: bool) {
        let counter = if negative {
            &self.counters.hits_denial
        } else {
            &self.counters.hits_success
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn cached(&self, key: &Key) -> Option<(Message, Option<Popular>)> {
        let cache = self.cache.lock().ok()?;
        let entry = cache.get(key)?;
        let age = u32::try_from(entry.stored.elapsed().as_secs()).unwrap_or(u32::MAX);
        if age >= entry.ttl {
            return None;
        }
        let mut message = entry.message.clone();
        for record in message
            .answers
            .iter_mut()
            .chain(message.authorities.iter_mut())
            .chain(message.additionals.iter_mut())
        {
            record.ttl = record.ttl.min(entry.ttl).saturating_sub(age);
        }
        Some((message, entry.popular.clone()))
    }

    /// Keep `message` for its TTL (capped), counted as asked for `hits` times in a row so far
    /// (for prefetch); the TTL kept, if it was.
    fn store(&self, key: Key, message: &Message, hits: u32) -> Option<u32> {
        let ttl = cache_ttl(message)?;
        let cap = if is_negative(message) {
            self.options.max_negative_ttl
        } else {
            self.options.max_ttl
        };
        let ttl = ttl.min(cap);
        if ttl == 0 {
            return None;
        }
        let mut cache = self.cache.lock().ok()?;
        if cache.len() >= MAX_ENTRIES {
            cache.retain(|_, e| e.stored.elapsed() < Duration::from_secs(u64::from(e.ttl)));
            if cache.len() >= MAX_ENTRIES {
                cache.clear();
            }
        }
        let stored = Instant::now();
        let popular = self
            .options
            .prefetch
            .map(|_| Popular::new(key.clone(), stored, ttl, hits));
        cache.insert(
            key,
            Entry {
                message: message.clone(),
                stored,
                ttl,
                popular,
            },
        );
        Some(ttl)
    }

    /// One question to one upstream: UDP, then TCP when truncated.
    async fn exchange(
        &self,
        upstream: SocketAddr,
        name: &Name,
        qtype: RecordType,
        qclass: DNSClass,
    ) -> Result<Message, String> {
        let id: u16 = rand::random();
        let mut query = Message::new(id, MessageType::Query, OpCode::Query);
        query.metadata.recursion_desired = true;
        let mut q = Query::query(name.clone(), qtype);
        q.set_query_class(qclass);
        query.add_query(q);
        let mut edns = Edns::new();
        edns.set_max_payload(4096);
        query.set_edns(edns);
        let bytes = query.to_vec().map_err(|e| e.to_string())?;
        let timeout = self.options.timeout;
        if self.options.force_tcp {
            return tokio::time::timeout(timeout, tcp_exchange(upstream, &bytes, id))
                .await
                .map_err(|_| "timed out over TCP".to_string())?;
        }

        let udp = tokio::time::timeout(timeout, udp_exchange(upstream, &bytes, id, name))
            .await
            .map_err(|_| "timed out over UDP".to_string())??;
        if !udp.metadata.truncation {
            return Ok(udp);
        }
        match tokio::time::timeout(timeout, tcp_exchange(upstream, &bytes, id)).await {
            Ok(Ok(full)) => Ok(full),
            // Keep the truncated answer (its TC bit tells the client) when TCP fails.
            _ => Ok(udp),
        }
    }
}

async fn udp_exchange(
    upstream: SocketAddr,
    bytes: &[u8],
    id: u16,
    name: &Name,
) -> Result<Message, String> {
    let bind: SocketAddr = if upstream.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
    socket.connect(upstream).await.map_err(|e| e.to_string())?;
    socket.send(bytes).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = socket.recv(&mut buf).await.map_err(|e| e.to_string())?;
        // Ignore stray or spoofed datagrams: the ID and the question must match.
        let Ok(message) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let same_question = message.queries.first().map(|q| q.name() == name) == Some(true);
        if message.metadata.id == id
            && message.metadata.message_type == MessageType::Response
            && same_question
        {
            return Ok(message);
        }
    }
}

async fn tcp_exchange(upstream: SocketAddr, bytes: &[u8], id: u16) -> Result<Message, String> {
    let mut stream = TcpStream::connect(upstream)
        .await
        .map_err(|e| e.to_string())?;
    let len = u16::try_from(bytes.len()).map_err(|e| e.to_string())?;
    stream
        .write_all(&len.to_be_bytes())
        .await
        .map_err(|e| e.to_string())?;
    stream.write_all(bytes).await.map_err(|e| e.to_string())?;
    let mut len = [0u8; 2];
    stream
        .read_exact(&mut len)
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream
        .read_exact(&mut buf)
        .await
        .map_err(|e| e.to_string())?;
    let message = Message::from_vec(&buf).map_err(|e| e.to_string())?;
    if message.metadata.id != id {
        return Err("TCP answer with a different ID".into());
    }
    Ok(message)
}

/// How long an upstream answer may be cached: the smallest answer TTL for positive answers;
/// for NXDOMAIN and NODATA the SOA's min(TTL, minimum); nothing for failures, truncated
/// answers, or negative answers without an SOA.
pub(crate) fn cache_ttl(message: &Message) -> Option<u32> {
    if message.metadata.truncation {
        return None;
    }
    let rcode = message.metadata.response_code;
    if rcode == ResponseCode::NoError && !message.answers.is_empty() {
        let ttl = message.answers.iter().map(|r| r.ttl).min()?;
        return (ttl > 0).then_some(ttl.min(MAX_TTL));
    }
    if rcode == ResponseCode::NoError || rcode == ResponseCode::NXDomain {
        let ttl = message.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
            _ => None,
        })?;
        return (ttl > 0).then_some(ttl.min(MAX_NEGATIVE_TTL));
    }
    None
}

/// NXDOMAIN, or NOERROR without answers (NODATA).
pub(crate) fn is_negative(message: &Message) -> bool {
    message.metadata.response_code == ResponseCode::NXDomain
        || (message.metadata.response_code == ResponseCode::NoError && message.answers.is_empty())
}

/// No record of `message` says it may be kept longer than `ttl`.
fn clamp_ttls(message: &mut Message, ttl: u32) {
    for record in message
        .answers
        .iter_mut()
        .chain(message.authorities.iter_mut())
        .chain(message.additionals.iter_mut())
    {
        record.ttl = record.ttl.min(ttl);
    }
}

/// Whether `upstream` would reach the server listening on `own`: same port, and the same
/// address or `own` listening on every address.
fn is_same_endpoint(upstream: SocketAddr, own: SocketAddr) -> bool {
    if upstream.port() != own.port() {
        return false;
    }
    upstream.ip() == own.ip() || own.ip().is_unspecified()
}

/// The nameservers of a resolv.conf text, port 53.
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            let ip: std::net::IpAddr = words.next()?.split('%').next()?.parse().ok()?;
            Some(SocketAddr::new(ip, 53))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::Record;
    use hickory_proto::rr::rdata::{A, SOA};

    #[test]
    fn loops_to_ourselves_are_removed() {
        let own: SocketAddr = "127.0.0.1:1053".parse().unwrap();
        let f = Forwarder::new(
            vec![
                "127.0.0.1:1053".parse().unwrap(),
                "127.0.0.2:1053".parse().unwrap(),
                "127.0.0.1:53".parse().unwrap(),
                "192.0.2.1:1053".parse().unwrap(),
            ],
            Some(own),
            Duration::from_secs(1),
        );
        assert_eq!(
            f.upstreams(),
            &[
                "127.0.0.2:1053".parse().unwrap(),
                "127.0.0.1:53".parse().unwrap(),
                "192.0.2.1:1053".parse().unwrap()
            ]
        );
    }

    fn key() -> Key {
        (
            Name::from_ascii("web.default.svc.cluster.local.").unwrap(),
            RecordType::A,
            DNSClass::IN,
        )
    }

    /// CoreDNS's rules: hits in a row (a gap of `duration` or more starts again at one), due
    /// once the remaining whole seconds are at most `percentage` % of the TTL rounded up, one
    /// prefetch in flight.
    #[test]
    fn prefetch_is_due_for_popular_entries_near_their_end() {
        let p = Prefetch {
            amount: 3,
            duration: Duration::from_secs(10),
            percentage: 10,
        };
        assert_eq!(
            (p.threshold(30), p.threshold(5), p.threshold(31)),
            (3, 1, 4)
        );
        let popular = Popular::new(key(), Instant::now(), 30, 0);
        let at = |secs: u64| popular.0.stored + Duration::from_millis(secs * 1000 + 500);
        // Three hits early: popular, but 29 s are left.
        assert!(!popular.hit(&p, at(0)) && !popular.hit(&p, at(1)) && !popular.hit(&p, at(2)));
        // A gap of 25 s: counting starts again, so at 3 s left it is not popular enough.
        assert!(!popular.hit(&p, at(27)));
        assert!(!popular.hit(&p, at(27)));
        assert_eq!(popular.hits(), 2);
        // The third in a row, 3 s left: due, once.
        assert!(popular.hit(&p, at(27)));
        assert!(!popular.hit(&p, at(28)));
        assert_eq!(popular.hits(), 4);
        // Hits carried over to a fresh entry count from its start (within a minute here).
        let minute = Prefetch {
            duration: Duration::from_secs(60),
            ..p
        };
        let fresh = Popular::new(key(), Instant::now(), 30, 4);
        assert!(fresh.hit(&minute, fresh.0.stored + Duration::from_secs(27)));
        assert_eq!(fresh.hits(), 5);
    }

    /// A prefetch no upstream answers leaves the entry as it was and lets the next due hit try
    /// again.
    #[tokio::test]
    async fn a_failed_prefetch_is_tried_again() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = closed.local_addr().unwrap();
        drop(closed);
        let f = Forwarder::with_options(
            vec![upstream],
            None,
            ForwarderOptions {
                force_tcp: true,
                prefetch: Some(Prefetch {
                    amount: 1,
                    duration: Duration::from_secs(60),
                    percentage: 90,
                }),
                ..ForwarderOptions::default()
            },
        );
        let (name, qtype, qclass) = key();
        let mut answer = Message::response(1, OpCode::Query);
        answer.add_answer(Record::from_rdata(
            name.clone(),
            5,
            RData::A(A::new(10, 96, 0, 20)),
        ));
        assert_eq!(f.store(key(), &answer, 0), Some(5));
        // 5 s left of 5, 90 %: due at the first hit.
        let hit = f.resolve_cached(&name, qtype, qclass).unwrap();
        let popular = hit.popular.unwrap();
        assert!(hit.prefetch_due);
        assert!(!f.note_hit(&popular), "one prefetch at a time");
        f.prefetch(&popular).await;
        assert_eq!((f.stats().prefetches, f.stats().upstream_queries), (1, 1));
        // Still the old entry, due again.
        let again = f.resolve_cached(&name, qtype, qclass).unwrap();
        assert_eq!(again.popular, Some(popular));
        assert!(again.prefetch_due);
    }

    #[test]
    fn resolv_conf() {
        let text = "# x\nsearch a.b\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\noptions ndots:5\nnameserver bogus\n";
        let parsed = parse_resolv_conf(text);
        assert_eq!(
            parsed,
            vec![
                "10.0.0.2:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
    }

    #[test]
    fn cache_ttls() {
        let name = Name::from_ascii("example.org.").unwrap();
        let mut positive = Message::response(1, OpCode::Query);
        positive.add_answer(Record::from_rdata(
            name.clone(),
            300,
            RData::A(A::new(192, 0, 2, 1)),
        ));
        positive.add_answer(Record::from_rdata(
            name.clone(),
            60,
            RData::A(A::new(192, 0, 2, 2)),
        ));
        assert_eq!(cache_ttl(&positive), Some(60));

        let soa = SOA::new(name.clone(), name.clone(), 1, 1, 1, 1, 20);
        let mut negative = Message::response(1, OpCode::Query);
        negative.metadata.response_code = ResponseCode::NXDomain;
        negative.add_authority(Record::from_rdata(name.clone(), 900, RData::SOA(soa)));
        assert_eq!(cache_ttl(&negative), Some(20));

        let mut no_soa = Message::response(1, OpCode::Query);
        no_soa.metadata.response_code = ResponseCode::NXDomain;
        assert_eq!(cache_ttl(&no_soa), None);

        let mut servfail = Message::response(1, OpCode::Query);
        servfail.metadata.response_code = ResponseCode::ServFail;
        assert_eq!(cache_ttl(&servfail), None);
    }
}
