//! The packet path without sockets, for the libFuzzer target in `crates/dns/fuzz` and the
//! property tests: the exact function the UDP loop calls on each datagram (answer cache, parse,
//! zone, encoder), and the TCP side's parse–answer–encode, each followed by a check of what
//! would be sent.

use hickory_proto::op::{Message, MessageType};
use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use std::net::SocketAddr;
use std::sync::Arc;

use super::cache::FastRng;
use super::handler::{Handler, Step, ZoneHandle, encode_response};
use super::udp::{Packet, answer_packet};
use crate::fixtures::*;
use crate::zone::{Objects, Zone, ZoneConfig};

/// The source address the questions appear to come from.
const SOURCE: &str = "127.0.0.1:5353";

/// A server's question → answer path over a fixed zone, with no upstreams (questions that need
/// one stop before any I/O).
pub struct PacketPath {
    handler: Handler,
    rng: FastRng,
    out: Vec<u8>,
    source: SocketAddr,
}

impl PacketPath {
    /// The path over `zone`.
    pub fn new(config: Arc<ZoneConfig>, zone: Zone) -> PacketPath {
        let handle = ZoneHandle::default();
        handle.publish(zone);
        PacketPath {
            handler: Handler::offline(config, handle),
            rng: FastRng::new(),
            out: Vec::with_capacity(4096),
            source: SocketAddr::from(([127, 0, 0, 1], 5353)),
        }
    }

    /// Over a small zone with every kind of name: a cluster-IP service with named ports, a
    /// headless service with 120 endpoints (some with hostnames), an ExternalName inside and one
    /// outside the zone, a pod.
    pub fn fixture() -> PacketPath {
        let config = match ZoneConfig::new("cluster.local") {
            Ok(config) => Arc::new(config),
            Err(error) => panic!("the fixture's zone config: {error}"),
        };
        let mut web = slice("default", "web", "web-1", &[("web", "TCP", 80)]);
        for i in 0..120u32 {
            let host = format!("web-{i}");
            web = web.ep(
                &format!("10.244.{}.{}", i / 200, 1 + i % 200),
                (i % 3 == 0).then_some(host.as_str()),
                i % 7 != 0,
            );
        }
        let objects = Objects {
            services: vec![
                cluster_ip(
                    "default",
                    "myapp",
                    &["10.96.0.5"],
                    &[("http", "TCP", 80), ("dns", "UDP", 53)],
                ),
                headless("default", "web", &[("web", "TCP", 80)]),
                external("default", "ext", "example.org"),
                external("default", "inside", "myapp.default.svc.cluster.local"),
            ],
            endpoint_slices: vec![web],
            pods: vec![pod("default", "p", "10.244.9.9")],
            namespaces: vec![namespace("default")],
        };
        let zone = Zone::build(config.clone(), &objects, 1);
        PacketPath::new(config, zone)
    }

    /// What the UDP server sends for `packet` (`None`: dropped, or it needs the upstream), or
    /// what is wrong with that answer.
    pub fn udp(&mut self, packet: &[u8]) -> Result<Option<&[u8]>, String> {
        match self.answer(packet) {
            Packet::Drop => {
                if packet.len() >= 12 && packet[2] & 0x80 == 0 {
                    return Err("a question was dropped".into());
                }
                Ok(None)
            }
            Packet::Later(..) => Ok(None),
            Packet::Reply | Packet::Cached => {
                check_answer(packet, &self.out, 4096)?;
                Ok(Some(&self.out))
            }
        }
    }

    /// What the UDP server sends for `packet`, without checking it (the bench times this).
    pub fn udp_unchecked(&mut self, packet: &[u8]) -> Option<&[u8]> {
        let answer = self.answer(packet);
        matches!(answer, Packet::Reply | Packet::Cached).then_some(&self.out[..])
    }

    /// The UDP loop's decision on `packet`, its answer in `self.out`.
    fn answer(&mut self, packet: &[u8]) -> Packet {
        let (handler, source) = (&self.handler, self.source);
        answer_packet(handler, packet, source, &mut self.out, &mut self.rng)
    }

    /// What the TCP side answers (hickory's parse, the same step, the whole answer with no size
    /// limit), or what is wrong with it; `None` when hickory drops the request or it needs the
    /// upstream.
    pub fn tcp(&self, packet: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let Ok(request) = Request::from_bytes(packet.to_vec(), self.source, Protocol::Tcp) else {
            return Ok(None);
        };
        let Step::Done(reply) = self.handler.step(&request) else {
            return Ok(None);
        };
        let bytes = encode_response(&request, &reply, u16::MAX)
            .map_err(|e| format!("cannot encode the TCP answer: {e}"))?;
        check_answer(packet, &bytes, usize::from(u16::MAX))?;
        Ok(Some(bytes))
    }
}

impl std::fmt::Debug for PacketPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketPath")
            .field("source", &SOURCE)
            .finish()
    }
}

/// An answer must echo the question's ID, be a response, fit `max` and parse as a message.
fn check_answer(question: &[u8], answer: &[u8], max: usize) -> Result<(), String> {
    if answer.len() < 12 {
        return Err(format!("answer of {} bytes", answer.len()));
    }
    if answer[0..2] != question[0..2] {
        return Err("the ID is not echoed".into());
    }
    if answer.len() > max {
        return Err(format!("answer of {} bytes > {max}", answer.len()));
    }
    let message =
        Message::from_vec(answer).map_err(|e| format!("the answer does not parse: {e}"))?;
    if message.metadata.message_type != MessageType::Response {
        return Err("QR is not set".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns, OpCode, Query, ResponseCode};
    use hickory_proto::rr::{Name, RecordType};

    fn query(name: &str, qtype: RecordType) -> Vec<u8> {
        let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        m.set_edns(Edns::new());
        m.to_vec().unwrap()
    }

    #[test]
    fn the_fixture_answers_over_both_paths() {
        let mut path = PacketPath::fixture();
        for (name, qtype, rcode) in [
            (
                "web.default.svc.cluster.local.",
                RecordType::A,
                ResponseCode::NoError,
            ),
            (
                "_web._tcp.web.default.svc.cluster.local.",
                RecordType::SRV,
                ResponseCode::NoError,
            ),
            (
                "inside.default.svc.cluster.local.",
                RecordType::A,
                ResponseCode::NoError,
            ),
            (
                "10-244-9-9.default.pod.cluster.local.",
                RecordType::A,
                ResponseCode::NoError,
            ),
            (
                "nope.default.svc.cluster.local.",
                RecordType::A,
                ResponseCode::NXDomain,
            ),
        ] {
            let packet = query(name, qtype);
            let udp = path.udp(&packet).unwrap().unwrap().to_vec();
            let tcp = path.tcp(&packet).unwrap().unwrap();
            for bytes in [udp, tcp] {
                let m = Message::from_vec(&bytes).unwrap();
                assert_eq!(m.metadata.response_code, rcode, "{name}");
            }
        }
        // Needs the upstream: no answer without I/O.
        assert_eq!(path.udp(&query("example.com.", RecordType::A)), Ok(None));
        assert_eq!(path.udp(&[0u8; 5]), Ok(None));
    }
}
