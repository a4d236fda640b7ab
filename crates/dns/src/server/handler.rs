//! The hickory `RequestHandler`: the cluster zone from the current snapshot, everything else
//! through the forwarder; wire details (EDNS buffer size, truncation, rcodes) are decided here.

use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use hickory_proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::{Name, Record};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tracing::{debug, warn};

use super::forward::{ForwardError, Forwarder};
use crate::zone::{Outcome, Zone, ZoneConfig};

/// Largest UDP payload we send, whatever the client advertises (DNS flag day 2020 suggests 1232;
/// 4096 keeps big headless answers on UDP for clients that ask for it).
const MAX_UDP_PAYLOAD: u16 = 4096;

/// The published zone: `None` until the first complete sync (questions in the zone then get
/// SERVFAIL). Cloning shares the same slot; [`ZoneHandle::publish`] swaps atomically.
#[derive(Debug, Clone, Default)]
pub struct ZoneHandle {
    inner: Arc<ArcSwapOption<Zone>>,
}

impl ZoneHandle {
    /// Make `zone` the answer to every later question.
    pub fn publish(&self, zone: Zone) {
        self.inner.store(Some(Arc::new(zone)));
    }

    /// The zone now served, if synced.
    pub fn current(&self) -> Option<Arc<Zone>> {
        self.inner.load_full()
    }
}

/// One reply before encoding.
struct Reply {
    rcode: ResponseCode,
    authoritative: bool,
    truncated: bool,
    answers: Vec<Record>,
    authorities: Vec<Record>,
    additionals: Vec<Record>,
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
        }
    }
}

/// Answers DNS requests for the server.
pub struct Handler {
    pub(crate) config: Arc<ZoneConfig>,
    pub(crate) zone: ZoneHandle,
    pub(crate) forwarder: Arc<Forwarder>,
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let reply = self.reply(request).await;
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = reply.rcode;
        metadata.authoritative = reply.authoritative;
        metadata.truncation = reply.truncated;
        metadata.recursion_available = true;
        let edns = request.edns.as_ref().map(|client| {
            let mut ours = Edns::new();
            ours.set_max_payload(client.max_payload().clamp(512, MAX_UDP_PAYLOAD));
            ours
        });
        let response = MessageResponseBuilder::new(&request.queries, edns.as_ref()).build(
            metadata,
            reply.answers.iter(),
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

impl Handler {
    async fn reply(&self, request: &Request) -> Reply {
        if request.metadata.op_code != OpCode::Query {
            return Reply::error(ResponseCode::NotImp);
        }
        let [query] = request.queries.queries() else {
            return Reply::error(ResponseCode::FormErr);
        };
        let query = query.original();
        let (name, qtype, qclass) = (query.name(), query.query_type(), query.query_class());

        let outcome = match self.zone.current() {
            Some(zone) => zone.lookup(name, qtype, qclass, &mut rand::rng()),
            None if self.owns(name) => {
                debug!(%name, "not synced yet: SERVFAIL");
                return Reply::error(ResponseCode::ServFail);
            }
            None => Outcome::Forward,
        };
        match outcome {
            Outcome::Answer(response) => {
                let mut reply = Reply {
                    rcode: response.rcode,
                    authoritative: true,
                    truncated: false,
                    answers: response.answers,
                    authorities: response.authorities,
                    additionals: response.additionals,
                };
                if let Some(target) = response.chase {
                    self.chase(&mut reply, &target, qtype, qclass).await;
                }
                reply
            }
            Outcome::Forward => match self.forwarder.resolve(name, qtype, qclass).await {
                Ok(upstream) => {
                    let m = upstream.message;
                    Reply {
                        rcode: m.metadata.response_code,
                        authoritative: false,
                        truncated: m.metadata.truncation,
                        answers: m.answers,
                        authorities: m.authorities,
                        additionals: m.additionals,
                    }
                }
                Err(ForwardError::NoUpstream) => Reply::error(ResponseCode::Refused),
                Err(error) => {
                    debug!(%name, %error, "forwarding failed");
                    Reply::error(ResponseCode::ServFail)
                }
            },
        }
    }

    /// Resolve an out-of-zone ExternalName target upstream and append it to the CNAME.
    async fn chase(
        &self,
        reply: &mut Reply,
        target: &Name,
        qtype: hickory_proto::rr::RecordType,
        qclass: hickory_proto::rr::DNSClass,
    ) {
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
