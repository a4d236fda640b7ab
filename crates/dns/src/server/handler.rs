//! The hickory `RequestHandler`: the cluster zone from the current snapshot, everything else
//! through the forwarder; wire details (EDNS buffer size, truncation, rcodes) are decided here.

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use arc_swap::ArcSwapOption;
use hickory_proto::ProtoError;
use hickory_proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, Record, RecordType};
use hickory_proto::serialize::binary::BinDecoder;
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageRequest, MessageResponseBuilder, Queries};
use tracing::{debug, warn};

use super::cache::{AddressRegion, Served};
use super::forward::{ForwardError, Forwarder};
use super::metrics::{DnsMetrics, Observation, Proto, Source};
use crate::zone::{Addresses, Outcome, Zone, ZoneConfig};
use hickory_server::net::xfer::Protocol;

/// Largest UDP payload we send, whatever the client advertises (DNS flag day 2020 suggests 1232;
/// 4096 keeps big headless answers on UDP for clients that ask for it).
pub(crate) const MAX_UDP_PAYLOAD: u16 = 4096;

/// The published zone: `None` until the first complete sync (questions in the zone then get
/// SERVFAIL). Cloning shares the same slot; [`ZoneHandle::publish`] swaps atomically, together
/// with an empty answer cache for the new zone.
#[derive(Debug, Clone, Default)]
pub struct ZoneHandle {
    inner: Arc<ArcSwapOption<Served>>,
}

impl ZoneHandle {
    /// Make `zone` the answer to every later question.
    pub fn publish(&self, zone: Zone) {
        self.inner
            .store(Some(Arc::new(Served::new(Arc::new(zone)))));
    }

    /// The zone now served, if synced.
    pub fn current(&self) -> Option<Arc<Zone>> {
        self.inner.load().as_ref().map(|s| s.zone.clone())
    }

    /// The zone now served with its answer cache (a cheap guard for the packet path).
    pub(crate) fn served(&self) -> arc_swap::Guard<Option<Arc<Served>>> {
        self.inner.load()
    }

    /// Entries and bytes in the current zone's answer cache.
    pub fn cache_stats(&self) -> (usize, usize) {
        self.inner
            .load()
            .as_ref()
            .map_or((0, 0), |s| s.cache.stats())
    }
}

/// One reply before encoding.
pub(crate) struct Reply {
    pub(crate) rcode: ResponseCode,
    pub(crate) authoritative: bool,
    pub(crate) truncated: bool,
    pub(crate) answers: Vec<Record>,
    pub(crate) authorities: Vec<Record>,
    pub(crate) additionals: Vec<Record>,
    /// Every answer is owned by the question name as asked (see `zone::Response`).
    pub(crate) owned_by_question: bool,
    /// Address answers not yet made records (see `zone::Response::addresses`); the direct
    /// encoder writes them as they are, hickory's paths get [`Reply::address_records`].
    pub(crate) addresses: Option<Box<Addresses>>,
}

impl Reply {
    fn error(rcode: ResponseCode) -> Self {
        Reply {
            rcode,
            authoritative: false,
            truncated: false,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
            owned_by_question: false,
            addresses: None,
        }
    }

    /// `addresses` as records (empty without).
    pub(crate) fn address_records(&self) -> Vec<Record> {
        self.addresses
            .as_ref()
            .map(|a| a.records())
            .unwrap_or_default()
    }
}

/// What a request needs: an answer now, or upstream I/O first.
pub(crate) enum Step {
    Done(Reply),
    /// An in-zone CNAME whose out-of-zone target must be resolved upstream.
    Chase(Reply, Name, RecordType, DNSClass),
    Forward(Name, RecordType, DNSClass),
}

/// Answers DNS requests for the server.
pub struct Handler {
    pub(crate) config: Arc<ZoneConfig>,
    pub(crate) zone: ZoneHandle,
    pub(crate) forwarder: Arc<Forwarder>,
    pub(crate) metrics: Arc<DnsMetrics>,
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let started = std::time::Instant::now();
        let reply = self.finish(self.step(request)).await;
        self.metrics.observe(&Observation {
            proto: if request.protocol() == Protocol::Udp {
                Proto::Udp
            } else {
                Proto::Tcp
            },
            ipv6: request.src().is_ipv6(),
            qtype: request
                .queries
                .queries()
                .first()
                .map(|q| u16::from(q.query_type())),
            rcode: u8::try_from(u16::from(reply.rcode) & 0x0f).unwrap_or(2),
            source: if reply.authoritative {
                Source::Zone
            } else {
                Source::Forward
            },
            elapsed: started.elapsed(),
            sizes: None,
            cached: None,
        });
        let metadata = response_metadata(request, &reply);
        let edns = response_edns(request);
        let addresses = reply.address_records();
        let response = MessageResponseBuilder::new(echoed(request), edns.as_ref()).build(
            metadata,
            reply.answers.iter().chain(&addresses),
            reply.authorities.iter(),
            std::iter::empty(),
            reply.additionals.iter(),
        );
        match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(error) => {
                warn!(%error, "cannot send a DNS response");
                let mut failed = Metadata::response_from_request(&request.metadata);
                failed.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header {
                    metadata: failed,
                    counts: HeaderCounts::default(),
                })
            }
        }
    }
}

pub(crate) fn response_metadata(request: &MessageRequest, reply: &Reply) -> Metadata {
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.response_code = reply.rcode;
    metadata.authoritative = reply.authoritative;
    metadata.truncation = reply.truncated;
    metadata.recursion_available = true;
    metadata
}

/// No questions, for answers that must not echo the request's (see [`echoed`]).
static NO_QUESTIONS: LazyLock<Option<Queries>> =
    LazyLock::new(|| Queries::read(&mut BinDecoder::new(&[]), 0).ok());

/// The question section an answer echoes: none when a question name holds a compression
/// pointer. A query has no earlier name to point at, and hickory echoes the question bytes as
/// received, so a pointer into the header would read the answer's header instead (an
/// unparseable answer; found by the fuzz target). [`Handler::step`] answers those FORMERR.
pub(crate) fn echoed(request: &MessageRequest) -> &Queries {
    match NO_QUESTIONS.as_ref() {
        Some(none) if compressed_question(request) => none,
        _ => &request.queries,
    }
}

/// Whether a question name, as received, holds a compression pointer.
fn compressed_question(request: &MessageRequest) -> bool {
    let raw = request.queries.as_bytes();
    let mut i = 0;
    for _ in 0..request.queries.len() {
        loop {
            let Some(&len) = raw.get(i) else {
                return true;
            };
            if len == 0 {
                break;
            }
            if len & 0xc0 != 0 {
                return true;
            }
            i += 1 + usize::from(len);
        }
        i += 5;
    }
    false
}

pub(crate) fn response_edns(request: &MessageRequest) -> Option<Edns> {
    request.edns.as_ref().map(|client| {
        let mut ours = Edns::new();
        ours.set_max_payload(client.max_payload().clamp(512, MAX_UDP_PAYLOAD));
        ours
    })
}

/// Encode `reply` to `request` for UDP: at most the client's EDNS buffer size (512 without
/// EDNS), dropping records and setting TC when it does not fit.
pub(crate) fn encode_udp(request: &Request, reply: &Reply) -> Vec<u8> {
    encode_udp_region(request, reply).0
}

/// [`encode_udp`], also saying where `reply.addresses` were written (direct encoder only).
pub(crate) fn encode_udp_region(
    request: &Request,
    reply: &Reply,
) -> (Vec<u8>, Option<AddressRegion>) {
    match super::wire::encode_fast_region(request.as_slice(), request, reply) {
        Some(encoded) => encoded,
        None => (encode_general(request, reply), None),
    }
}

/// The answer to `request` encoded by hickory's general encoder (any record types and
/// sections) within `max` bytes; an error when it cannot be.
pub(crate) fn encode_response(
    request: &MessageRequest,
    reply: &Reply,
    max: u16,
) -> Result<Vec<u8>, ProtoError> {
    let edns = response_edns(request);
    let addresses = reply.address_records();
    let response = MessageResponseBuilder::new(echoed(request), edns.as_ref()).build(
        response_metadata(request, reply),
        reply.answers.iter().chain(&addresses),
        reply.authorities.iter(),
        std::iter::empty(),
        reply.additionals.iter(),
    );
    let mut bytes = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_max_size(max);
    response.destructive_emit(&mut encoder)?;
    Ok(bytes)
}

/// [`encode_udp`] through hickory's general encoder, within the client's EDNS size (512
/// without EDNS).
pub(crate) fn encode_general(request: &MessageRequest, reply: &Reply) -> Vec<u8> {
    let max = response_edns(request)
        .as_ref()
        .map_or(512, Edns::max_payload);
    if let Ok(bytes) = encode_response(request, reply, max) {
        return bytes;
    }
    // Encoding failed: a bare SERVFAIL header.
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.response_code = ResponseCode::ServFail;
    let mut bytes = Vec::with_capacity(12);
    let mut encoder = BinEncoder::new(&mut bytes);
    let header = Header {
        metadata,
        counts: HeaderCounts::default(),
    };
    match header.emit(&mut encoder) {
        Ok(()) => bytes,
        Err(_) => Vec::new(),
    }
}

impl Handler {
    /// A handler with no upstream (forwarded questions fail after 10 ms): for the packet path
    /// of the fuzz target and the tests.
    pub(crate) fn offline(config: Arc<ZoneConfig>, zone: ZoneHandle) -> Handler {
        Handler {
            config,
            zone,
            forwarder: Arc::new(Forwarder::new(
                vec![],
                None,
                std::time::Duration::from_millis(10),
            )),
            metrics: Arc::new(DnsMetrics::new(([127, 0, 0, 1], 0).into())),
        }
    }

    /// Everything that can be decided without I/O, from the zone now published.
    pub(crate) fn step(&self, request: &MessageRequest) -> Step {
        let zone = self.zone.current();
        self.step_in(request, zone.as_deref(), &mut rand::rng())
    }

    /// [`Handler::step`] against `zone` (`None`: not synced yet), shuffling with `rng`.
    pub(crate) fn step_in<R: rand::Rng + ?Sized>(
        &self,
        request: &MessageRequest,
        zone: Option<&Zone>,
        rng: &mut R,
    ) -> Step {
        if compressed_question(request) {
            return Step::Done(Reply::error(ResponseCode::FormErr));
        }
        if request.metadata.op_code != OpCode::Query {
            return Step::Done(Reply::error(ResponseCode::NotImp));
        }
        let [query] = request.queries.queries() else {
            return Step::Done(Reply::error(ResponseCode::FormErr));
        };
        let query = query.original();
        let (name, qtype, qclass) = (query.name(), query.query_type(), query.query_class());
        self.step_question(name, qtype, qclass, zone, rng)
    }

    /// [`Handler::step_in`] for a well-formed query's one question.
    pub(crate) fn step_question<R: rand::Rng + ?Sized>(
        &self,
        name: &Name,
        qtype: RecordType,
        qclass: DNSClass,
        zone: Option<&Zone>,
        rng: &mut R,
    ) -> Step {
        let outcome = match zone {
            Some(zone) => zone.lookup(name, qtype, qclass, rng),
            None if self.owns(name) => {
                debug!(%name, "not synced yet: SERVFAIL");
                // As CoreDNS before its first sync: authoritative, with the zone's SOA.
                let mut reply = Reply::error(ResponseCode::ServFail);
                reply.authoritative = true;
                reply.authorities.extend(self.config.unsynced_soa(name));
                return Step::Done(reply);
            }
            None => Outcome::Forward,
        };
        match outcome {
            Outcome::Answer(response) => {
                let reply = Reply {
                    rcode: response.rcode,
                    authoritative: true,
                    truncated: false,
                    answers: response.answers,
                    authorities: response.authorities,
                    additionals: response.additionals,
                    owned_by_question: response.owned_by_question && response.chase.is_none(),
                    addresses: response.addresses,
                };
                match response.chase {
                    Some(target) => Step::Chase(reply, target, qtype, qclass),
                    None => Step::Done(reply),
                }
            }
            Outcome::Forward => Step::Forward(name.clone(), qtype, qclass),
        }
    }

    /// Complete a step, doing its upstream I/O.
    pub(crate) async fn finish(&self, step: Step) -> Reply {
        match step {
            Step::Done(reply) => reply,
            Step::Chase(mut reply, target, qtype, qclass) => {
                self.chase(&mut reply, &target, qtype, qclass).await;
                reply
            }
            Step::Forward(name, qtype, qclass) => {
                match self.forwarder.resolve(&name, qtype, qclass).await {
                    Ok(upstream) => {
                        let m = upstream.message;
                        Reply {
                            rcode: m.metadata.response_code,
                            authoritative: false,
                            truncated: m.metadata.truncation,
                            answers: m.answers,
                            authorities: m.authorities,
                            additionals: m.additionals,
                            owned_by_question: false,
                            addresses: None,
                        }
                    }
                    Err(ForwardError::NoUpstream) => Reply::error(ResponseCode::Refused),
                    Err(error) => {
                        debug!(%name, %error, "forwarding failed");
                        Reply::error(ResponseCode::ServFail)
                    }
                }
            }
        }
    }

    /// Resolve an out-of-zone ExternalName target upstream and append it to the CNAME.
    async fn chase(&self, reply: &mut Reply, target: &Name, qtype: RecordType, qclass: DNSClass) {
        match self.forwarder.resolve(target, qtype, qclass).await {
            Ok(upstream) => {
                let m = upstream.message;
                reply.rcode = m.metadata.response_code;
                reply.truncated |= m.metadata.truncation;
                reply.answers.extend(m.answers);
                if reply.rcode != ResponseCode::NoError || reply.answers.len() == 1 {
                    reply.authorities.extend(m.authorities);
                }
            }
            Err(error) => {
                // The CNAME itself is still correct; the client may resolve the target itself.
                debug!(%target, %error, "cannot resolve ExternalName target");
                reply.rcode = ResponseCode::ServFail;
            }
        }
    }

    /// Whether the name is one the zone answers (cluster domain, or an owned reverse range), so
    /// that before the first sync it gets SERVFAIL instead of a forwarded NXDOMAIN.
    fn owns(&self, name: &Name) -> bool {
        if self.config.domain.zone_of(name) {
            return true;
        }
        if let Some(external) = &self.config.external
            && external.zones.iter().any(|z| z.zone_of(name))
        {
            return true;
        }
        let mut fqdn = name.clone();
        fqdn.set_fqdn(true);
        match fqdn.parse_arpa_name() {
            Ok(net) if net.prefix_len() == net.max_prefix_len() => {
                let ip: IpAddr = net.addr();
                self.config.reverse_cidrs.iter().any(|c| c.contains(&ip))
            }
            _ => false,
        }
    }
}
