//! The UDP path: answers from the zone are computed and sent inline on the receiving task, with
//! no task spawn or channel hop per packet; only questions that need the upstream get a task.
//!
//! hickory-server's own UDP loop spawns a task and crosses two channels per packet, which cost
//! about a third of the throughput of a local-data resolver; TCP stays on hickory-server. Each
//! wake-up takes every queued datagram (up to [`BATCH`]) with one `recvmmsg` and sends their
//! answers with one `sendmmsg`. A datagram seen
//! before in the current snapshot is answered from its answer cache (`cache.rs`); otherwise
//! hickory parses it, the zone answers, and `wire.rs` or hickory encodes the answer (EDNS size,
//! truncation with TC).

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::rr::DNSClass;
use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tracing::debug;

use super::cache::{AddressRegion, Entry, FastRng, Noting, Served};
use super::handler::{Handler, Step, encode_udp, encode_udp_region};
use super::metrics::{DnsMetrics, Observation, Proto, Source, question_type, response_flags};
use super::wire;

/// Largest request accepted; a question is far smaller, and EDNS options do not approach it.
pub(crate) const MAX_REQUEST: usize = 4096;
/// Datagrams taken from the socket per `recvmmsg` call.
pub(crate) const BATCH: usize = 16;

/// What the UDP path did with the datagrams it took, for `DnsServer::udp_stats`: once the
/// server is idle, every datagram received was either answered, dropped, or failed to send.
#[derive(Debug, Default)]
pub(crate) struct UdpCounters {
    received: AtomicU64,
    receive_calls: AtomicU64,
    answered: AtomicU64,
    dropped: AtomicU64,
    send_failed: AtomicU64,
}

/// A point-in-time copy of the UDP counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams taken from the socket.
    pub received: u64,
    /// `recvmmsg` calls made, those that found nothing included.
    pub receive_calls: u64,
    /// Answers sent.
    pub answered: u64,
    /// Datagrams not answered on purpose (too short, a response, no source port, nothing to
    /// encode).
    pub dropped: u64,
    /// Answers the socket refused.
    pub send_failed: u64,
}

impl UdpCounters {
    pub(crate) fn stats(&self) -> UdpStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        UdpStats {
            received: load(&self.received),
            receive_calls: load(&self.receive_calls),
            answered: load(&self.answered),
            dropped: load(&self.dropped),
            send_failed: load(&self.send_failed),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Serve `socket` until the task is aborted: take whatever datagrams are queued (up to
/// [`BATCH`]) in one `recvmmsg`, answer each, and send the answers of the batch with one
/// `sendmmsg` (questions that need the upstream are answered by their own task).
pub(crate) async fn serve_udp(
    socket: Arc<UdpSocket>,
    handler: Arc<Handler>,
    counters: Arc<UdpCounters>,
) {
    let mut bufs: Box<[[u8; MAX_REQUEST]; BATCH]> = Box::new([[0u8; MAX_REQUEST]; BATCH]);
    let mut received = Vec::with_capacity(BATCH);
    // The batch's answers, each buffer reused from batch to batch.
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    let mut answers: Vec<(Vec<u8>, SocketAddr)> = (0..BATCH)
        .map(|_| (Vec::with_capacity(512), unspecified))
        .collect();
    let mut rng = FastRng::new();
    loop {
        match next_batch(&socket, &mut bufs[..], &mut received).await {
            Ok(calls) => {
                counters.receive_calls.fetch_add(calls, Ordering::Relaxed);
            }
            Err(error) => {
                debug!(%error, "UDP receive error");
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        }
        let started = Instant::now();
        let mut ready = 0;
        for (buf, &(n, src)) in bufs.iter().zip(&received) {
            bump(&counters.received);
            let Some(src) = src else {
                bump(&counters.dropped);
                continue;
            };
            let packet = &buf[..n];
            let (out, to) = &mut answers[ready];
            let cached = match answer_packet(&handler, packet, src, out, &mut rng) {
                Packet::Drop => {
                    bump(&counters.dropped);
                    continue;
                }
                Packet::Reply => false,
                Packet::Cached => true,
                Packet::Later(request, step) => {
                    let (socket, handler, counters) =
                        (socket.clone(), handler.clone(), counters.clone());
                    let qtype = question_type(packet);
                    tokio::spawn(async move {
                        let reply = handler.finish(step).await;
                        let bytes = encode_udp(&request, &reply);
                        send(&socket, &bytes, src, &counters).await;
                        let (rcode, zone) = response_flags(&bytes);
                        handler.metrics.observe(&Observation {
                            proto: Proto::Udp,
                            ipv6: src.is_ipv6(),
                            qtype,
                            rcode,
                            source: if zone { Source::Zone } else { Source::Forward },
                            elapsed: started.elapsed(),
                            sizes: Some((n, bytes.len())),
                            cached: None,
                        });
                    });
                    continue;
                }
            };
            if out.is_empty() {
                bump(&counters.dropped);
                continue;
            }
            *to = src;
            observe(&handler.metrics, packet, out, src, started, Some(cached));
            ready += 1;
        }
        let (sent, failed) = send_batch(&socket, &answers[..ready]).await;
        counters.answered.fetch_add(sent, Ordering::Relaxed);
        counters.send_failed.fetch_add(failed, Ordering::Relaxed);
    }
}

/// Sends `answers` with as few `sendmmsg` calls as the socket takes, waiting while its buffer
/// is full; an answer the socket refuses is skipped. Returns how many were sent and how many
/// failed.
pub(crate) async fn send_batch(
    socket: &UdpSocket,
    answers: &[(Vec<u8>, SocketAddr)],
) -> (u64, u64) {
    let (mut sent, mut failed) = (0u64, 0u64);
    let mut at = 0;
    while at < answers.len() {
        let rest = &answers[at..];
        match socket.try_io(Interest::WRITABLE, || {
            svcnet_netns::datagrams::send_many(socket.as_fd(), rest)
        }) {
            Ok(n) => {
                sent += n as u64;
                at += n.max(1);
                if n == 0 {
                    failed += 1;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                if socket.writable().await.is_err() {
                    return (sent, failed + rest.len() as u64);
                }
            }
            Err(error) => {
                failed += 1;
                debug!(to = %rest[0].1, %error, "UDP send error");
                at += 1;
            }
        }
    }
    (sent, failed)
}

/// Counts an answer decided without I/O (`cached`: from the answer cache, or a miss the
/// zone answered; the server's own FORMERR and NOTIMP are neither).
fn observe(
    metrics: &DnsMetrics,
    packet: &[u8],
    response: &[u8],
    src: SocketAddr,
    started: Instant,
    cached: Option<bool>,
) {
    if response.is_empty() {
        return;
    }
    let (rcode, zone) = response_flags(response);
    let source = if zone { Source::Zone } else { Source::Server };
    metrics.observe(&Observation {
        proto: Proto::Udp,
        ipv6: src.is_ipv6(),
        qtype: question_type(packet),
        rcode,
        source,
        elapsed: started.elapsed(),
        sizes: Some((packet.len(), response.len())),
        cached: cached.filter(|_| zone),
    });
}

/// Waits until datagrams are queued on `socket` and takes up to one per buffer of `bufs` with
/// one `recvmmsg` (each one's length and sender in `received`); an error other than "nothing
/// queued after all" is the caller's to report. Returns how many `recvmmsg` calls it made.
///
/// A batch shorter than `bufs` emptied the queue, so the socket's readiness is cleared with
/// it: the next call waits for the next datagram instead of first making a `recvmmsg` that
/// finds nothing (one system call per wake-up saved). The socket is registered
/// edge-triggered, so a datagram that arrives after this `recvmmsg` wakes the next wait, and
/// tokio keeps the readiness when an event newer than the one this call saw was recorded.
pub(crate) async fn next_batch(
    socket: &UdpSocket,
    bufs: &mut [[u8; MAX_REQUEST]],
    received: &mut Vec<(usize, Option<SocketAddr>)>,
) -> std::io::Result<u64> {
    let want = bufs.len();
    let mut calls = 0;
    loop {
        socket.readable().await?;
        // Another loop on the socket may have taken the datagrams and cleared the readiness
        // since: then `try_io` answers `WouldBlock` without calling the closure, and an
        // earlier batch must not look like a new one.
        received.clear();
        match socket.try_io(Interest::READABLE, || {
            calls += 1;
            match svcnet_netns::datagrams::recv_many(socket.as_fd(), bufs, received)? {
                n if n < want => Err(std::io::ErrorKind::WouldBlock.into()),
                _ => Ok(()),
            }
        }) {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                if !received.is_empty() {
                    return Ok(calls);
                }
            }
            other => return other.map(|()| calls),
        }
    }
}

/// What to do with one received datagram.
pub(crate) enum Packet {
    /// Not a question we answer (too short, a response, no port to answer to).
    Drop,
    /// The answer is in the output buffer, ready to send.
    Reply,
    /// The same, taken from the answer cache.
    Cached,
    /// The answer needs upstream I/O first.
    Later(Box<Request>, Step),
}

/// Decide on one datagram without I/O, writing an answer to `out`: the whole path a hostile
/// packet can reach (the fuzz tests and the fuzz target drive it directly).
///
/// A datagram seen before in this zone snapshot (same bytes after the ID) is answered from the
/// snapshot's cache; otherwise it is parsed, answered and, when the answer needs no I/O and is
/// the same every time (up to the shuffle of addresses), kept from its second miss on.
pub(crate) fn answer_packet(
    handler: &Handler,
    packet: &[u8],
    src: SocketAddr,
    out: &mut Vec<u8>,
    rng: &mut FastRng,
) -> Packet {
    // Too short for a header, a response (never answer those: reflection), or no port to
    // answer to: drop silently.
    if packet.len() < 12 || packet[2] & 0x80 != 0 || src.port() == 0 {
        return Packet::Drop;
    }
    let served = handler.zone.served();
    let served = served.as_ref();
    // On a miss, the datagram's hash (for the cache's admission filter).
    let mut hash = None;
    if let Some(served) = served {
        match served.cache.answer(packet, out, rng) {
            Ok(()) => return Packet::Cached,
            Err(h) => hash = h,
        }
    }
    // A plain query in the zone is answered without hickory's parser when the direct encoder
    // can write its answer (the same bytes the general path below would send): from its labels
    // as they lie in the datagram when the answer is a negative one or addresses at the
    // question name, else from hickory's `Name` of it.
    if let Some(served) = served
        && let Some(view) = wire::QuestionView::new(packet)
    {
        if let Some(done) = answer_quick(served, &view, packet, hash, out, rng) {
            return done;
        }
        if let Some(name) = view.name() {
            let mut noting = Noting::new(rng);
            let step = handler.step_question(
                &name,
                view.qtype,
                DNSClass::IN,
                Some(&served.zone),
                &mut noting,
            );
            let drew = noting.used;
            if let Step::Done(reply) = &step
                && let Some(region) = wire::encode_asked_into(&view.asked, reply, out)
            {
                if hash.is_some_and(|h| served.cache.admit_hashed(packet, h)) {
                    let addresses = reply
                        .addresses
                        .as_deref()
                        .map(|a| (a.ips.as_slice(), a.ttl));
                    keep(served, packet, out, drew, addresses, region);
                }
                return Packet::Reply;
            }
        }
    }
    answer_parsed(handler, served, packet, src, out, rng)
}

/// [`answer_packet`] from the question's labels as they lie in the datagram, with no hickory
/// name, record or encoder (`Zone::lookup_labels`, `wire::encode_quick_into`): `None` when the
/// answer is not one of the shapes it writes.
fn answer_quick(
    served: &Served,
    view: &wire::QuestionView<'_>,
    packet: &[u8],
    hash: Option<u64>,
    out: &mut Vec<u8>,
    rng: &mut FastRng,
) -> Option<Packet> {
    // Cluster names have up to 11 labels, search expansions a few more; longer names take
    // the other paths.
    let mut buf = [""; 32];
    let labels = view.labels(&mut buf)?;
    let mut noting = Noting::new(rng);
    let quick = served.zone.lookup_labels(labels, view.qtype, &mut noting)?;
    let drew = noting.used;
    let ttl = served.zone.config().ttl;
    let region = wire::encode_quick_into(view, &quick, ttl, served.soa.as_deref(), out)?;
    if hash.is_some_and(|h| served.cache.admit_hashed(packet, h)) {
        let addresses = match &quick {
            crate::zone::Quick::Addresses(ips) => Some((ips.as_slice(), ttl)),
            crate::zone::Quick::Negative { .. } => None,
        };
        keep(served, packet, out, drew, addresses, region);
    }
    Some(Packet::Reply)
}

/// [`answer_packet`]'s general path: hickory parses the datagram, the handler answers it, the
/// direct encoder or hickory's writes the answer.
fn answer_parsed(
    handler: &Handler,
    served: Option<&Arc<Served>>,
    packet: &[u8],
    src: SocketAddr,
    out: &mut Vec<u8>,
    rng: &mut FastRng,
) -> Packet {
    let request = match Request::from_bytes(packet.to_vec(), src, Protocol::Udp) {
        Ok(request) => request,
        Err(error) => {
            debug!(%src, %error, "malformed request: FORMERR");
            out.clear();
            out.extend_from_slice(&formerr(packet));
            return Packet::Reply;
        }
    };
    let mut noting = Noting::new(rng);
    let step = handler.step_in(&request, served.map(|s| &*s.zone), &mut noting);
    let drew = noting.used;
    match step {
        Step::Done(reply) => {
            let (bytes, region) = encode_udp_region(&request, &reply);
            if let Some(served) = served
                && !bytes.is_empty()
                && served.cache.admit(packet)
            {
                let addresses = reply
                    .addresses
                    .as_deref()
                    .map(|a| (a.ips.as_slice(), a.ttl));
                keep(served, packet, &bytes, drew, addresses, region);
            }
            out.clear();
            out.extend_from_slice(&bytes);
            Packet::Reply
        }
        step => Packet::Later(Box::new(request), step),
    }
}

/// Keep `bytes`, the admitted answer to `packet`, in the snapshot's cache when a copy can
/// reproduce it: it drew no randomness, or only the zone's shuffle of addresses that the cache
/// redraws on every hit (`drew`: randomness was drawn; `region`: where the addresses are).
fn keep(
    served: &Served,
    packet: &[u8],
    bytes: &[u8],
    drew: bool,
    addresses: Option<(&[std::net::IpAddr], u32)>,
    region: Option<AddressRegion>,
) {
    let shuffled = match (drew, addresses, region) {
        (false, _, _) => Some(None),
        (true, Some(addresses), Some(region)) => Some(Some((addresses, region))),
        _ => None,
    };
    if let Some(entry) = shuffled.and_then(|s| Entry::new(bytes, s)) {
        served.cache.insert(packet, entry);
    }
}

async fn send(socket: &UdpSocket, bytes: &[u8], to: SocketAddr, counters: &UdpCounters) {
    if bytes.is_empty() {
        bump(&counters.dropped);
        return;
    }
    match socket.send_to(bytes, to).await {
        Ok(_) => bump(&counters.answered),
        Err(error) => {
            bump(&counters.send_failed);
            debug!(%to, %error, "UDP send error");
        }
    }
}

/// A bare FORMERR header for a request whose header is readable but whose body is not: same ID,
/// opcode and RD, QR and RA set, no sections.
fn formerr(packet: &[u8]) -> [u8; 12] {
    let mut header = [0u8; 12];
    header[0] = packet[0];
    header[1] = packet[1];
    header[2] = 0x80 | (packet[2] & 0x79);
    header[3] = 0x80 | 0x01;
    header
}

/// The packet path under random and mutated input (a fuzz target that runs on stable Rust in
/// every test run; `PROPTEST_CASES=100000` for a longer campaign).
#[cfg(test)]
#[path = "udp_fuzz_tests.rs"]
mod fuzz;

#[cfg(test)]
mod timing {
    use super::*;
    use crate::fixtures::*;
    use crate::server::handler::ZoneHandle;
    use crate::zone::{Objects, Zone, ZoneConfig};
    use hickory_proto::rr::RecordType;
    use std::time::Instant;

    #[test]
    #[ignore = "timing probe: cargo test --release -p svcnet-dns timing -- --ignored --nocapture"]
    fn headless_100_packet_path() {
        let config = Arc::new(ZoneConfig::new("cluster.local").unwrap());
        let mut s = slice("default", "big", "big-1", &[("http", "TCP", 80)]);
        for i in 0..100 {
            s = s.ep(&format!("10.244.1.{}", i + 1), None, true);
        }
        let objects = Objects {
            services: vec![headless("default", "big", &[("http", "TCP", 80)])],
            endpoint_slices: vec![s],
            pods: vec![],
            namespaces: vec![namespace("default")],
        };
        let zone = ZoneHandle::default();
        zone.publish(Zone::build(config.clone(), &objects, 1));
        let h = Handler::offline(config, zone);
        let packet = super::super::test_support::query(
            7,
            "big.default.svc.cluster.local.",
            RecordType::A,
            Some(4096),
        );
        let src = "127.0.0.1:5353".parse().unwrap();
        let n = 20_000;
        let t = Instant::now();
        let mut bytes = 0;
        let mut out = Vec::new();
        let mut rng = FastRng::new();
        for _ in 0..n {
            if let Packet::Reply | Packet::Cached =
                answer_packet(&h, &packet, src, &mut out, &mut rng)
            {
                bytes += out.len();
            }
        }
        let per = t.elapsed() / n;
        let request = Request::from_bytes(packet.clone(), src, Protocol::Udp).unwrap();
        let t = Instant::now();
        for _ in 0..n {
            let _ = std::hint::black_box(h.step(&request));
        }
        let step = t.elapsed() / n;
        eprintln!(
            "answer_packet {per:?} step {step:?} bytes {}",
            bytes / n as usize
        );
    }
}
