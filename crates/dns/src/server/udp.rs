//! The UDP path: answers from the zone are computed and sent inline on the receiving task, with
//! no task spawn or channel hop per packet; only questions that need the upstream get a task.
//!
//! hickory-server's own UDP loop spawns a task and crosses two channels per packet, which cost
//! about a third of the throughput of a local-data resolver; TCP stays on hickory-server. The
//! parsing and encoding (EDNS size, truncation with TC) are still hickory's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use tokio::net::UdpSocket;
use tracing::debug;

use super::handler::{Handler, Step, encode_udp};

/// Largest request accepted; a question is far smaller, and EDNS options do not approach it.
const MAX_REQUEST: usize = 4096;

/// Serve `socket` until the task is aborted.
pub(crate) async fn serve_udp(socket: Arc<UdpSocket>, handler: Arc<Handler>) {
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let (n, src) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(error) => {
                debug!(%error, "UDP receive error");
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        match answer_packet(&handler, &buf[..n], src) {
            Packet::Drop => {}
            Packet::Reply(bytes) => send(&socket, &bytes, src).await,
            Packet::Later(request, step) => {
                let (socket, handler) = (socket.clone(), handler.clone());
                tokio::spawn(async move {
                    let reply = handler.finish(step).await;
                    send(&socket, &encode_udp(&request, &reply), src).await;
                });
            }
        }
    }
}

/// What to do with one received datagram.
pub(crate) enum Packet {
    /// Not a question we answer (too short, a response, no port to answer to).
    Drop,
    /// The answer, ready to send.
    Reply(Vec<u8>),
    /// The answer needs upstream I/O first.
    Later(Box<Request>, Step),
}

/// Decide on one datagram without I/O: the whole path a hostile packet can reach (the fuzz
/// test drives it directly).
pub(crate) fn answer_packet(handler: &Handler, packet: &[u8], src: SocketAddr) -> Packet {
    // Too short for a header, a response (never answer those: reflection), or no port to
    // answer to: drop silently.
    if packet.len() < 12 || packet[2] & 0x80 != 0 || src.port() == 0 {
        return Packet::Drop;
    }
    let request = match Request::from_bytes(packet.to_vec(), src, Protocol::Udp) {
        Ok(request) => request,
        Err(error) => {
            debug!(%src, %error, "malformed request: FORMERR");
            return Packet::Reply(formerr(packet).to_vec());
        }
    };
    match handler.step(&request) {
        Step::Done(reply) => Packet::Reply(encode_udp(&request, &reply)),
        step => Packet::Later(Box::new(request), step),
    }
}

async fn send(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) {
    if bytes.is_empty() {
        return;
    }
    if let Err(error) = socket.send_to(bytes, to).await {
        debug!(%to, %error, "UDP send error");
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
    use std::time::Duration;

    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    use proptest::prelude::*;

    use super::super::forward::Forwarder;
    use super::super::handler::ZoneHandle;
    use super::*;
    use crate::fixtures::*;
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
        Handler {
            config,
            zone,
            forwarder: Arc::new(Forwarder::new(vec![], None, Duration::from_millis(10))),
        }
    }

    fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
        let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
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
        let src = "127.0.0.1:5353".parse().unwrap();
        match answer_packet(h, packet, src) {
            Packet::Drop => assert!(packet.len() < 12 || packet[2] & 0x80 != 0),
            Packet::Reply(bytes) => {
                assert!(bytes.len() >= 12);
                assert_eq!(bytes[0..2], packet[0..2], "the ID is echoed");
                assert!(bytes[2] & 0x80 != 0, "QR is set");
                assert!(bytes.len() <= 4096);
                // Whatever we send must itself be a well-formed message.
                Message::from_vec(&bytes).expect("our answer parses");
            }
            Packet::Later(..) => {}
        }
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
    use crate::server::forward::Forwarder;
    use crate::server::handler::ZoneHandle;
    use crate::zone::{Objects, Zone, ZoneConfig};
    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    use std::time::{Duration, Instant};

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
        let h = Handler {
            config,
            zone,
            forwarder: Arc::new(Forwarder::new(vec![], None, Duration::from_millis(10))),
        };
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(
            Name::from_ascii("big.default.svc.cluster.local.").unwrap(),
            RecordType::A,
        ));
        let mut e = Edns::new();
        e.set_max_payload(4096);
        m.set_edns(e);
        let packet = m.to_vec().unwrap();
        let src = "127.0.0.1:5353".parse().unwrap();
        let n = 20_000;
        let t = Instant::now();
        let mut bytes = 0;
        for _ in 0..n {
            if let Packet::Reply(b) = answer_packet(&h, &packet, src) {
                bytes += b.len();
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
