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
mod fuzz {
    use std::sync::Arc;

    use hickory_proto::op::Message;
    use hickory_proto::rr::RecordType;
    use proptest::prelude::*;

    use super::super::handler::ZoneHandle;
    use super::*;
    use crate::fixtures::*;
    use crate::rule_table;
    use crate::zone::{Objects, Zone, ZoneConfig};

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(2000)
    }

    fn handler() -> Handler {
        let config = Arc::new(ZoneConfig::new("cluster.local").unwrap());
        let objects = Objects {
            services: vec![
                cluster_ip("default", "myapp", &["10.96.0.5"], &[("http", "TCP", 80)]),
                headless("default", "web", &[("web", "TCP", 80)]),
                external("default", "ext", "example.org"),
            ],
            endpoint_slices: vec![
                slice("default", "web", "web-1", &[("web", "TCP", 80)])
                    .ep("10.244.0.1", Some("web-0"), true)
                    .ep("10.244.0.2", None, true),
            ],
            pods: vec![],
            namespaces: vec![namespace("default")],
        };
        let zone = ZoneHandle::default();
        zone.publish(Zone::build(config.clone(), &objects, 1));
        Handler::offline(config, zone)
    }

    fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
        super::super::test_support::query(0x4242, name, qtype, edns)
    }

    fn seeds() -> Vec<Vec<u8>> {
        vec![
            query("myapp.default.svc.cluster.local.", RecordType::A, None),
            query("web.default.svc.cluster.local.", RecordType::A, Some(512)),
            query(
                "_web._tcp.web.default.svc.cluster.local.",
                RecordType::SRV,
                Some(4096),
            ),
            query("5.0.96.10.in-addr.arpa.", RecordType::PTR, None),
            query("ext.default.svc.cluster.local.", RecordType::A, None),
            query("nothing.default.svc.cluster.local.", RecordType::AAAA, None),
            query("example.com.", RecordType::MX, None),
        ]
    }

    fn check(h: &Handler, packet: &[u8]) {
        // Twice: the second time may come from the answer cache.
        let first = check_once(h, packet);
        let second = check_once(h, packet);
        match (first, second) {
            (Some(a), Some(b)) => {
                assert_eq!(
                    a.metadata, b.metadata,
                    "a cached answer has the same header"
                );
                assert_eq!(a.queries, b.queries);
                let mut a_answers = a.answers.clone();
                let mut b_answers = b.answers.clone();
                if a.metadata.truncation {
                    // A truncated shuffled answer is a fresh random subset each time.
                    assert_eq!(a_answers.len(), b_answers.len());
                } else {
                    a_answers.sort_by_key(|r| r.to_string());
                    b_answers.sort_by_key(|r| r.to_string());
                    assert_eq!(a_answers, b_answers);
                }
                assert_eq!(a.authorities, b.authorities);
                assert_eq!(a.additionals, b.additionals);
            }
            (a, b) => assert_eq!(a.is_some(), b.is_some()),
        }
    }

    fn check_once(h: &Handler, packet: &[u8]) -> Option<Message> {
        let src = "127.0.0.1:5353".parse().unwrap();
        let mut bytes = Vec::new();
        let mut rng = FastRng::new();
        match answer_packet(h, packet, src, &mut bytes, &mut rng) {
            Packet::Drop => {
                assert!(packet.len() < 12 || packet[2] & 0x80 != 0);
                None
            }
            Packet::Reply | Packet::Cached => {
                assert!(bytes.len() >= 12);
                assert_eq!(bytes[0..2], packet[0..2], "the ID is echoed");
                assert!(bytes[2] & 0x80 != 0, "QR is set");
                assert!(bytes.len() <= 4096);
                // Whatever we send must itself be a well-formed message.
                Some(Message::from_vec(&bytes).expect("our answer parses"))
            }
            Packet::Later(..) => None,
        }
    }

    /// Questions beyond the rule table's for the byte-equality test below: a pod's `ndots:5`
    /// search expansions, names whose labels match the SOA's names (`ns`, `dns`,
    /// `hostmaster`) so the SOA is compressed further, names in the served reverse zones and
    /// outside them, and names around the length where the label path hands over to hickory's
    /// `Name` (250 bytes).
    fn more_questions() -> Vec<(String, RecordType)> {
        let mut out: Vec<(String, RecordType)> = [
            ("myapp.default.default.svc.cluster.local.", RecordType::A),
            ("myapp.default.svc.cluster.local.", RecordType::A),
            ("myapp.default.svc.cluster.local.", RecordType::AAAA),
            ("www.example.com.default.svc.cluster.local.", RecordType::A),
            ("www.example.com.svc.cluster.local.", RecordType::A),
            ("www.example.com.cluster.local.", RecordType::A),
            ("www.example.com.cluster.local.", RecordType::AAAA),
            ("nothing.other.svc.cluster.local.", RecordType::SRV),
            ("nothing.nons.svc.cluster.local.", RecordType::A),
            ("nons.svc.cluster.local.", RecordType::A),
            ("default.svc.cluster.local.", RecordType::TXT),
            ("svc.cluster.local.", RecordType::A),
            ("pod.cluster.local.", RecordType::MX),
            ("ns.dns.cluster.local.", RecordType::AAAA),
            ("ns.dns.cluster.local.", RecordType::A),
            ("x.ns.dns.cluster.local.", RecordType::A),
            ("dns.cluster.local.", RecordType::A),
            ("x.dns.cluster.local.", RecordType::A),
            ("hostmaster.cluster.local.", RecordType::A),
            ("x.hostmaster.cluster.local.", RecordType::NS),
            ("cluster.local.", RecordType::A),
            ("local.", RecordType::A),
            ("dns-version.cluster.local.", RecordType::A),
            ("10-244-1-10.default.pod.cluster.local.", RecordType::AAAA),
            ("10-244-1-10.nons.pod.cluster.local.", RecordType::A),
            ("dual.default.svc.cluster.local.", RecordType::A),
            ("dual.default.svc.cluster.local.", RecordType::AAAA),
            ("nginx.default.svc.cluster.local.", RecordType::A),
            ("web-0.nginx.default.svc.cluster.local.", RecordType::AAAA),
            ("_tcp.nginx.default.svc.cluster.local.", RecordType::A),
            ("_web._tcp.nginx.default.svc.cluster.local.", RecordType::A),
            ("_x._tcp.nginx.default.svc.cluster.local.", RecordType::SRV),
            (
                "a.b.c.d.e.f.g.h.i.default.svc.cluster.local.",
                RecordType::A,
            ),
            ("1.0.96.10.in-addr.arpa.", RecordType::PTR),
            ("2.0.96.10.in-addr.arpa.", RecordType::PTR),
            ("1.0.96.10.in-addr.arpa.", RecordType::A),
            ("9.9.244.10.in-addr.arpa.", RecordType::PTR),
            ("0.96.10.in-addr.arpa.", RecordType::PTR),
            ("1.1.168.192.in-addr.arpa.", RecordType::PTR),
            ("example.org.", RecordType::A),
            ("idle.default.example.org.", RecordType::A),
            ("nothing.default.example.org.", RecordType::A),
        ]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect();
        // More labels than the label path takes (32).
        let many = format!("{}default.svc.cluster.local.", "a.".repeat(36));
        out.push((many, RecordType::A));
        // Names of 237..=253 bytes on the wire (text + 1; the label path reads up to 250).
        let suffix = "default.svc.cluster.local.";
        for text in 236..=252 {
            let mut name = String::new();
            while text - name.len() - suffix.len() > 11 {
                name.push_str("abcdefghi.");
            }
            let fill = text - name.len() - suffix.len() - 1;
            name.push_str(&"x".repeat(fill));
            name.push('.');
            name.push_str(suffix);
            assert_eq!(name.len(), text);
            out.push((name, RecordType::A));
        }
        out
    }

    /// `name`'s letters in alternating case (`mYaPp...`).
    fn mixed_case(name: &str) -> String {
        name.chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    c.to_ascii_lowercase()
                } else {
                    c.to_ascii_uppercase()
                }
            })
            .collect()
    }

    /// The plain-query paths (labels from the datagram, then hickory's `Name`; no hickory
    /// request parse) send exactly the bytes of the general path, for every question of the
    /// rule table and of [`more_questions`], in three spellings and five EDNS sizes, in every
    /// zone setup of the table (pod modes, plugin options, `k8s_external`).
    #[test]
    fn plain_queries_answer_as_the_general_path() {
        let (mut fast_hits, mut quick_hits) = (0, 0);
        let cases = rule_table::cases().unwrap();
        let mut questions: Vec<(String, RecordType)> = Vec::new();
        for case in &cases {
            for q in &case.queries {
                let (name, qtype, class) = rule_table::parse_query(q).unwrap();
                if class == hickory_proto::rr::DNSClass::IN {
                    questions.push((name.to_ascii(), qtype));
                }
            }
        }
        questions.extend(more_questions());
        for (pods, options) in rule_table::setups(&cases) {
            let config = Arc::new(rule_table::zone_config(pods, &options).unwrap());
            let zone = ZoneHandle::default();
            zone.publish(rule_table::zone_with(pods, &options).unwrap());
            let h = Handler::offline(config, zone);
            for (name, qtype) in &questions {
                let spellings = [name.clone(), name.to_ascii_uppercase(), mixed_case(name)];
                for spelled in &spellings {
                    for edns in [None, Some(100), Some(512), Some(1232), Some(4096)] {
                        let packet = query(spelled, *qtype, edns);
                        let what = format!("{spelled} {qtype} {edns:?} {options:?}");
                        let (fast, quick) = check_plain_paths(&h, &packet, &what);
                        fast_hits += usize::from(fast);
                        quick_hits += usize::from(quick);
                    }
                }
            }
        }
        assert!(fast_hits > 1000, "the plain path ran {fast_hits} times");
        assert!(quick_hits > 1000, "the label path ran {quick_hits} times");
    }

    /// Datagrams the label path must leave alone, each answered as the general path answers
    /// it: a compression pointer in the question (FORMERR), a label byte outside ASCII, an
    /// uppercase name of the same bytes otherwise, a name with a `.` inside a label.
    #[test]
    fn unusual_questions_answer_as_the_general_path() {
        let h = handler();
        let plain = query(
            "nothing.default.svc.cluster.local.",
            RecordType::A,
            Some(1232),
        );
        let mut non_ascii = plain.clone();
        non_ascii[13] = 0xe9; // "\233othing"
        let mut dotted = plain.clone();
        dotted[13] = b'.'; // ".othing" as one label
        let mut pointer = query("x.default.svc.cluster.local.", RecordType::A, None);
        // "x" then a pointer to offset 12 (itself): a loop, and a pointer in a query.
        let at = 12 + 2;
        pointer.splice(at.., [0xc0, 12, 0, 1, 0, 1]);
        let mut into_header = query("x.", RecordType::A, None);
        into_header.splice(12.., [1, b'5', 0xc0, 1, 0, 1, 0, 1]);
        for (what, packet) in [
            ("non-ASCII", &non_ascii),
            ("dotted", &dotted),
            ("pointer", &pointer),
            ("pointer into header", &into_header),
        ] {
            let (_, quick) = check_plain_paths(&h, packet, what);
            assert_eq!(quick, what == "dotted", "{what}: label path taken");
        }
        let mut general = Vec::new();
        let served = h.zone.served();
        answer_parsed(
            &h,
            served.as_ref(),
            &pointer,
            "127.0.0.1:5353".parse().unwrap(),
            &mut general,
            &mut FastRng::seeded(7),
        );
        assert_eq!(general[3] & 0x0f, 1, "a pointer in the question: FORMERR");
    }

    /// One datagram through the general path, the hickory-`Name` plain path and the label
    /// path, each with the same seed: whichever of the two plain paths answers sends the
    /// general path's bytes, and the whole packet path does too (a cache hit may redraw a
    /// shuffle, so it is compared when it computed the answer). Returns which plain paths
    /// answered.
    fn check_plain_paths(h: &Handler, packet: &[u8], what: &str) -> (bool, bool) {
        let src = "127.0.0.1:5353".parse().unwrap();
        let mut general = Vec::new();
        let served = h.zone.served();
        let parsed = answer_parsed(
            h,
            served.as_ref(),
            packet,
            src,
            &mut general,
            &mut FastRng::seeded(7),
        );
        let zone = h.zone.current();
        let direct = wire::plain_query(packet).and_then(|(n, t, asked)| {
            let step = h.step_question(
                &n,
                t,
                hickory_proto::rr::DNSClass::IN,
                zone.as_deref(),
                &mut FastRng::seeded(7),
            );
            match step {
                Step::Done(reply) => wire::encode_asked(&asked, &reply),
                _ => None,
            }
        });
        if let Some((bytes, _)) = &direct {
            assert!(matches!(parsed, Packet::Reply), "{what}");
            assert_eq!(*bytes, general, "hickory-name path: {what}");
        }
        let quick = served.as_ref().and_then(|served| {
            let view = wire::QuestionView::new(packet)?;
            let mut buf = [""; 32];
            let labels = view.labels(&mut buf)?;
            let answer = served
                .zone
                .lookup_labels(labels, view.qtype, &mut FastRng::seeded(7))?;
            let mut out = Vec::new();
            let ttl = served.zone.config().ttl;
            wire::encode_quick_into(&view, &answer, ttl, served.soa.as_deref(), &mut out)?;
            Some(out)
        });
        if let Some(bytes) = &quick {
            assert!(matches!(parsed, Packet::Reply), "{what}");
            assert_eq!(*bytes, general, "label path: {what}");
            assert!(direct.is_some(), "the label path answers a subset: {what}");
        }
        // And the whole packet path sends the same (when a plain path answers: otherwise
        // the hickory-name path may have drawn a shuffle before handing over, so the general
        // path in there draws another).
        let mut any = Vec::new();
        let whole = answer_packet(h, packet, src, &mut any, &mut FastRng::seeded(7));
        let sent = |p: &Packet| matches!(p, Packet::Reply | Packet::Cached);
        assert_eq!(sent(&whole), sent(&parsed), "{what}");
        if matches!(whole, Packet::Reply) && direct.is_some() {
            assert_eq!(any, general, "packet path: {what}");
        }
        (direct.is_some(), quick.is_some())
    }

    #[test]
    fn seeds_answer() {
        let h = handler();
        for seed in seeds() {
            check(&h, &seed);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn random_bytes(packet in proptest::collection::vec(any::<u8>(), 0..700)) {
            check(&handler(), &packet);
        }

        #[test]
        fn mutated_queries(
            seed in 0usize..7,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<Option<usize>>(),
        ) {
            let mut packet = seeds()[seed].clone();
            for (at, byte) in flips {
                let i = at % packet.len();
                packet[i] = byte;
            }
            if let Some(cut) = cut {
                packet.truncate(cut % (packet.len() + 1));
            }
            check(&handler(), &packet);
        }
    }
}

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
