//! A direct encoder for the two answer shapes that make up most cluster DNS traffic: positive
//! A/AAAA answers owned by the question name (service and headless lookups) and negative
//! answers carrying only the zone's SOA (the misses of `ndots:5` search expansion).
//!
//! Every answer owner is written as a compression pointer to the question (offset 12), so an
//! answer of 100 A records costs 16 bytes and a copy each; hickory's general encoder searches
//! its compression table for every name and stops compressing after 120 names. Anything else
//! (SRV, PTR, CNAME chains, additionals, forwarded answers) returns `None` and goes through
//! hickory. The tests compare both encoders' decoded messages.

use std::net::IpAddr;

use hickory_proto::op::Edns;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use hickory_server::zone_handler::MessageRequest;

use super::cache::{AddressRegion, address_record};
use super::handler::{Reply, response_edns};

/// Byte offset of the question name in a message.
const QUESTION: usize = 12;

/// Encode `reply` for UDP when its shape allows; `raw` is the request as received.
#[cfg(test)]
pub(crate) fn encode_fast(raw: &[u8], request: &MessageRequest, reply: &Reply) -> Option<Vec<u8>> {
    encode_fast_region(raw, request, reply).map(|(bytes, _)| bytes)
}

/// [`encode_fast`], also saying where the records of `reply.addresses` are (they follow the
/// question, one fixed-size record each, owners pointing at the question).
pub(crate) fn encode_fast_region(
    raw: &[u8],
    request: &MessageRequest,
    reply: &Reply,
) -> Option<(Vec<u8>, Option<AddressRegion>)> {
    if request.queries.len() != 1 {
        return None;
    }
    let asked = Asked {
        raw,
        op_code: u8::from(request.metadata.op_code),
        recursion_desired: request.metadata.recursion_desired,
        checking_disabled: request.metadata.checking_disabled,
        payload: response_edns(request).as_ref().map(Edns::max_payload),
    };
    encode_asked(&asked, reply)
}

/// What the direct encoder needs of a request with one question.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked<'a> {
    /// The request as received.
    pub(crate) raw: &'a [u8],
    pub(crate) op_code: u8,
    pub(crate) recursion_desired: bool,
    pub(crate) checking_disabled: bool,
    /// Our EDNS payload size when the request had EDNS (the client's, within 512..=4096).
    pub(crate) payload: Option<u16>,
}

/// A plain query (one question, uncompressed, no records but an OPT without options, opcode
/// QUERY, class IN, EDNS version 0) taken apart without hickory's parser: the question name,
/// its type, and what the encoder needs. `None` for anything else, which takes the general path.
pub(crate) fn plain_query(raw: &[u8]) -> Option<(Name, RecordType, Asked<'_>)> {
    if raw.len() < QUESTION || raw[2] & 0x80 != 0 || (raw[2] >> 3) & 0x0f != 0 {
        return None;
    }
    if !super::cache::plain_question(raw) {
        return None;
    }
    let end = question_end(raw)?;
    let class = u16::from_be_bytes([raw[end - 2], raw[end - 1]]);
    if class != u16::from(DNSClass::IN) {
        return None;
    }
    let qtype = RecordType::from(u16::from_be_bytes([raw[end - 4], raw[end - 3]]));
    if !matches!(
        qtype,
        RecordType::A
            | RecordType::AAAA
            | RecordType::SRV
            | RecordType::PTR
            | RecordType::TXT
            | RecordType::CNAME
            | RecordType::MX
            | RecordType::NS
            | RecordType::SOA
    ) {
        return None;
    }
    let payload = if end == raw.len() {
        None
    } else {
        // OPT (checked by `plain_question`): root owner, type, class = payload size, TTL =
        // extended rcode, version, flags; then rdlength, which must be 0 (options are parsed,
        // and judged, by the general path).
        let opt = raw.get(end..end + 11)?;
        if opt[5] != 0 || opt[6] != 0 || opt[9] != 0 || opt[10] != 0 {
            return None;
        }
        let client = u16::from_be_bytes([opt[3], opt[4]]);
        Some(client.clamp(512, super::handler::MAX_UDP_PAYLOAD))
    };
    let mut decoder = BinDecoder::new(raw.get(QUESTION..end - 4)?);
    let name = Name::read(&mut decoder).ok()?;
    let asked = Asked {
        raw,
        op_code: 0,
        recursion_desired: raw[2] & 0x01 != 0,
        checking_disabled: raw[3] & 0x10 != 0,
        payload,
    };
    Some((name, qtype, asked))
}

/// Encode `reply` to the question in `asked` when its shape allows.
pub(crate) fn encode_asked(
    asked: &Asked<'_>,
    reply: &Reply,
) -> Option<(Vec<u8>, Option<AddressRegion>)> {
    let mut out = Vec::with_capacity(64 + reply.answers.len() * 28);
    let region = encode_asked_into(asked, reply, &mut out)?;
    Some((out, region))
}

/// [`encode_asked`] into `out` (cleared first; left unspecified when the shape does not
/// allow), so that the UDP loop reuses one buffer per answer slot.
pub(crate) fn encode_asked_into(
    asked: &Asked<'_>,
    reply: &Reply,
    out: &mut Vec<u8>,
) -> Option<Option<AddressRegion>> {
    out.clear();
    let raw = asked.raw;
    if !reply.additionals.is_empty() {
        return None;
    }
    if reply.rcode.high() != 0 {
        return None;
    }
    let rcode = reply.rcode.low();
    let question_end = question_end(raw)?;
    let question = &raw[QUESTION..question_end];
    // Owners were checked by the zone (comparing 100 names here would cost more than the
    // whole encoding).
    if !reply.answers.is_empty() && !reply.owned_by_question {
        return None;
    }
    if reply.addresses.is_some() && (!reply.answers.is_empty() || !reply.owned_by_question) {
        return None;
    }
    for r in &reply.answers {
        if !matches!(r.data, RData::A(_) | RData::AAAA(_)) || r.dns_class != DNSClass::IN {
            return None;
        }
    }
    let soa = match reply.authorities.as_slice() {
        [] => None,
        [soa]
            if matches!(soa.data, RData::SOA(_))
                && reply.answers.is_empty()
                && reply.addresses.is_none() =>
        {
            Some(soa)
        }
        _ => return None,
    };

    let max = usize::from(asked.payload.unwrap_or(512));
    let opt_len = if asked.payload.is_some() { 11 } else { 0 };

    out.extend_from_slice(&raw[0..2]);
    let mut flags = [0u8; 2];
    flags[0] = 0x80 | ((asked.op_code & 0x0f) << 3);
    if reply.authoritative {
        flags[0] |= 0x04;
    }
    if asked.recursion_desired {
        flags[0] |= 0x01;
    }
    flags[1] = 0x80 | rcode; // RA
    if asked.checking_disabled {
        flags[1] |= 0x10;
    }
    out.extend_from_slice(&flags);
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(asked.payload.is_some())]);
    out.extend_from_slice(question);

    let mut answers: u16 = 0;
    let mut truncated = reply.truncated;
    let records = reply.answers.iter().map(|r| match &r.data {
        RData::A(a) => Some((IpAddr::V4(a.0), r.ttl)),
        RData::AAAA(a) => Some((IpAddr::V6(a.0), r.ttl)),
        _ => None,
    });
    let mut region = None;
    let mut cut = false;
    for item in records {
        let (ip, ttl) = item?;
        if !push_address(out, ip, ttl, opt_len, max) {
            cut = true;
            break;
        }
        answers += 1;
    }
    if let Some(a) = reply.addresses.as_deref().filter(|_| !cut) {
        let at = out.len();
        let mut shown = 0;
        for ip in &a.ips {
            if !push_address(out, *ip, a.ttl, opt_len, max) {
                cut = true;
                break;
            }
            shown += 1;
        }
        answers += u16::try_from(shown).ok()?;
        region = Some(AddressRegion { at, shown });
    }
    truncated |= cut;

    let mut authorities: u16 = 0;
    if let Some(soa) = soa {
        let start = out.len();
        if write_soa(out, raw, question_end, soa).is_some() && out.len() + opt_len <= max {
            authorities = 1;
        } else {
            out.truncate(start);
            truncated = true;
        }
    }

    if let Some(payload) = asked.payload {
        out.push(0); // root owner
        out.extend_from_slice(&41u16.to_be_bytes()); // OPT
        out.extend_from_slice(&payload.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // ext-rcode, version, flags, rdlength
    }
    out[6..8].copy_from_slice(&answers.to_be_bytes());
    out[8..10].copy_from_slice(&authorities.to_be_bytes());
    if truncated {
        out[2] |= 0x02;
    }
    Some(region)
}

/// Append one address record if it fits in `max` with `reserve` bytes left over.
fn push_address(out: &mut Vec<u8>, ip: IpAddr, ttl: u32, reserve: usize, max: usize) -> bool {
    let len = if ip.is_ipv4() { 16 } else { 28 };
    if out.len() + len + reserve > max {
        return false;
    }
    address_record(out, ip, ttl);
    true
}

/// The end of the (single) question: after its uncompressed name, type and class.
pub(crate) fn question_end(raw: &[u8]) -> Option<usize> {
    let mut i = QUESTION;
    loop {
        let len = usize::from(*raw.get(i)?);
        if len == 0 {
            i += 1;
            break;
        }
        if len & 0xc0 != 0 {
            return None;
        }
        i += 1 + len;
    }
    let end = i + 4;
    (end <= raw.len()).then_some(end)
}

/// Where each label of the question name starts (at most 127 labels in a name).
struct QuestionLabels {
    starts: [u16; 128],
    count: usize,
}

impl QuestionLabels {
    fn new(raw: &[u8], question_end: usize) -> Option<Self> {
        let mut labels = QuestionLabels {
            starts: [0; 128],
            count: 0,
        };
        let mut i = QUESTION;
        while i < question_end - 4 {
            let len = usize::from(raw[i]);
            if len == 0 {
                break;
            }
            *labels.starts.get_mut(labels.count)? = u16::try_from(i).ok()?;
            labels.count += 1;
            i += 1 + len;
        }
        Some(labels)
    }
}

/// Append the SOA record, its names compressed against the question.
fn write_soa(out: &mut Vec<u8>, raw: &[u8], question_end: usize, soa: &Record) -> Option<()> {
    let RData::SOA(data) = &soa.data else {
        return None;
    };
    let question = QuestionLabels::new(raw, question_end)?;
    write_name(out, raw, &question, &soa.name)?;
    out.extend_from_slice(&6u16.to_be_bytes());
    out.extend_from_slice(&u16::from(DNSClass::IN).to_be_bytes());
    out.extend_from_slice(&soa.ttl.to_be_bytes());
    let len_at = out.len();
    out.extend_from_slice(&[0, 0]);
    write_name(out, raw, &question, &data.mname)?;
    write_name(out, raw, &question, &data.rname)?;
    out.extend_from_slice(&data.serial.to_be_bytes());
    out.extend_from_slice(&data.refresh.to_be_bytes());
    out.extend_from_slice(&data.retry.to_be_bytes());
    out.extend_from_slice(&data.expire.to_be_bytes());
    out.extend_from_slice(&data.minimum.to_be_bytes());
    let len = u16::try_from(out.len() - len_at - 2).ok()?;
    out[len_at..len_at + 2].copy_from_slice(&len.to_be_bytes());
    Some(())
}

/// Write `name`, ending in a pointer at the longest of its suffixes found in the question.
///
/// A suffix of `k` labels can only match the question's last `k` labels (both end at the
/// root), and if the last `k` labels match so do the last `k - 1`: so the longest suffix found
/// is the common tail of the two names, compared label by label from the root.
fn write_name(out: &mut Vec<u8>, raw: &[u8], question: &QuestionLabels, name: &Name) -> Option<()> {
    // The name's labels, taken once (hickory's label iterator is slow to restart); on the
    // stack for the short names SOA records hold.
    let mut short: [&[u8]; 8] = [&[]; 8];
    let long: Vec<&[u8]>;
    let mut labels_iter = name.iter();
    let labels: &[&[u8]] = if labels_iter.len() <= short.len() {
        let mut n = 0;
        for (slot, label) in short.iter_mut().zip(&mut labels_iter) {
            *slot = label;
            n += 1;
        }
        &short[..n]
    } else {
        long = labels_iter.collect();
        &long
    };
    let total = labels.len();
    let mut common = 0;
    while common < total.min(question.count) {
        let label = labels[total - 1 - common];
        let at = usize::from(question.starts[question.count - 1 - common]);
        let len = usize::from(raw[at]);
        if len != label.len() || !raw[at + 1..at + 1 + len].eq_ignore_ascii_case(label) {
            break;
        }
        common += 1;
    }
    for label in &labels[..total - common] {
        out.push(u8::try_from(label.len()).ok().filter(|l| *l < 64)?);
        out.extend_from_slice(label);
    }
    if common > 0 {
        let at = question.starts[question.count - common];
        out.extend_from_slice(&(0xc000 | at).to_be_bytes());
    } else {
        out.push(0);
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use hickory_proto::op::{Message, ResponseCode};
    use hickory_proto::rr::rdata::{A, AAAA, SOA};
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    use hickory_server::net::xfer::Protocol;
    use hickory_server::server::Request;

    use super::super::handler::{Reply, encode_general};
    use super::*;

    fn request(name: &str, qtype: RecordType, edns: Option<u16>) -> Request {
        Request::from_bytes(
            super::super::test_support::query(0x1234, name, qtype, edns),
            "127.0.0.1:5353".parse().unwrap(),
            Protocol::Udp,
        )
        .unwrap()
    }

    fn reply(rcode: ResponseCode, answers: Vec<Record>, authorities: Vec<Record>) -> Reply {
        Reply {
            rcode,
            authoritative: true,
            truncated: false,
            owned_by_question: false,
            answers,
            authorities,
            additionals: Vec::new(),
            addresses: None,
        }
    }

    fn a_records(owner: &str, n: u32) -> Vec<Record> {
        (0..n)
            .map(|i| {
                let ip = Ipv4Addr::from(0x0af4_0000 + i);
                Record::from_rdata(Name::from_ascii(owner).unwrap(), 30, RData::A(A(ip)))
            })
            .collect()
    }

    fn soa() -> Record {
        let d = Name::from_ascii("cluster.local.").unwrap();
        let soa = SOA::new(
            Name::from_ascii("ns.dns.cluster.local.").unwrap(),
            Name::from_ascii("hostmaster.cluster.local.").unwrap(),
            7,
            7200,
            1800,
            86400,
            30,
        );
        Record::from_rdata(d, 30, RData::SOA(soa))
    }

    /// Both encoders must produce the same message (bytes may differ in compression).
    fn same(req: &Request, reply: &Reply) -> Message {
        let qname = req.queries.queries()[0].original().name();
        let owned = reply.answers.iter().all(|r| r.name.eq_case(qname));
        let reply = &Reply {
            rcode: reply.rcode,
            authoritative: reply.authoritative,
            truncated: reply.truncated,
            answers: reply.answers.clone(),
            authorities: reply.authorities.clone(),
            additionals: reply.additionals.clone(),
            owned_by_question: owned || reply.owned_by_question,
            addresses: reply.addresses.clone(),
        };
        let fast = encode_fast(req.as_slice(), req, reply).expect("fast path applies");
        let general = encode_general(req, reply);
        let (f, g) = (
            Message::from_vec(&fast).unwrap(),
            Message::from_vec(&general).unwrap(),
        );
        assert_eq!(f.metadata, g.metadata);
        assert_eq!(f.metadata.truncation, reply_truncates(&general));
        assert_eq!(f.queries, g.queries);
        if f.metadata.truncation {
            // Both keep whole records; ours may fit more (every owner is a 2-byte pointer).
            assert!(f.answers.len() >= g.answers.len());
            assert_eq!(&f.answers[..g.answers.len()], g.answers.as_slice());
        } else {
            assert_eq!(f.answers, g.answers);
            let mut all = reply.answers.clone();
            all.extend(reply.address_records());
            assert_eq!(f.answers, all);
        }
        assert_eq!(f.authorities, g.authorities);
        assert_eq!(f.additionals, g.additionals);
        assert_eq!(
            f.edns.as_ref().map(|e| e.max_payload()),
            g.edns.as_ref().map(|e| e.max_payload())
        );
        let limit = req
            .edns
            .as_ref()
            .map_or(512, |e| usize::from(e.max_payload().max(512)));
        assert!(fast.len() <= limit, "{} > {limit}", fast.len());
        f
    }

    fn reply_truncates(bytes: &[u8]) -> bool {
        bytes[2] & 0x02 != 0
    }

    #[test]
    fn positive_answers_match_hickory() {
        let name = "MyApp.default.svc.cluster.local.";
        let req = request(name, RecordType::A, None);
        let m = same(
            &req,
            &reply(ResponseCode::NoError, a_records(name, 1), vec![]),
        );
        assert_eq!(m.answers[0].name.to_string(), name);
        let req = request(name, RecordType::AAAA, Some(1232));
        let v6 = Record::from_rdata(
            Name::from_ascii(name).unwrap(),
            30,
            RData::AAAA(AAAA(Ipv6Addr::LOCALHOST)),
        );
        same(&req, &reply(ResponseCode::NoError, vec![v6], vec![]));
    }

    #[test]
    fn large_answers_truncate_like_hickory() {
        let name = "big.default.svc.cluster.local.";
        for edns in [None, Some(1232)] {
            let req = request(name, RecordType::A, edns);
            let m = same(
                &req,
                &reply(ResponseCode::NoError, a_records(name, 200), vec![]),
            );
            assert!(m.metadata.truncation, "{edns:?}");
        }
        // 200 A records fit in 4096 bytes once every owner is a pointer (hickory stops
        // compressing after 120 names and has to truncate).
        let req = request(name, RecordType::A, Some(4096));
        let mut r = reply(ResponseCode::NoError, a_records(name, 200), vec![]);
        r.owned_by_question = true;
        let m = Message::from_vec(&encode_fast(req.as_slice(), &req, &r).unwrap()).unwrap();
        assert!(!m.metadata.truncation);
        assert_eq!(m.answers, r.answers);
    }

    /// Address answers kept as IPs (headless services) encode exactly like the records they
    /// stand for, through hickory.
    #[test]
    fn address_answers_match_hickory_records() {
        use crate::zone::Addresses;
        let name = "Web.default.svc.cluster.local.";
        let mut ips: Vec<IpAddr> = (0..100u32)
            .map(|i| IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + i)))
            .collect();
        ips.push(IpAddr::V6(Ipv6Addr::LOCALHOST));
        for (edns, count) in [(Some(4096), 101), (Some(1232), 101), (None, 3), (None, 0)] {
            let req = request(name, RecordType::A, edns);
            let mut r = reply(ResponseCode::NoError, vec![], vec![]);
            r.owned_by_question = true;
            r.addresses = Some(Box::new(Addresses {
                owner: Name::from_ascii(name).unwrap(),
                ttl: 30,
                ips: ips[ips.len() - count..].to_vec(),
            }));
            let m = same(&req, &r);
            if !m.metadata.truncation {
                assert_eq!(m.answers.len(), count, "{edns:?}");
            }
            assert_eq!(m.metadata.truncation, edns != Some(4096) && count > 3);
            for a in &m.answers {
                assert_eq!(a.name.to_string(), name);
            }
        }
        // Not owned by the question (never made by the zone): hickory's path.
        let req = request(name, RecordType::A, None);
        let mut r = reply(ResponseCode::NoError, vec![], vec![]);
        r.addresses = Some(Box::new(Addresses {
            owner: Name::from_ascii(name).unwrap(),
            ttl: 30,
            ips: ips[..1].to_vec(),
        }));
        assert!(encode_fast(req.as_slice(), &req, &r).is_none());
    }

    #[test]
    fn negative_answers_match_hickory() {
        let req = request(
            "nothing.default.svc.cluster.local.",
            RecordType::A,
            Some(4096),
        );
        same(&req, &reply(ResponseCode::NXDomain, vec![], vec![soa()]));
        let req = request("myapp.default.svc.cluster.local.", RecordType::AAAA, None);
        same(&req, &reply(ResponseCode::NoError, vec![], vec![soa()]));
        // The SOA owner is not a suffix of the question (reverse zone): written in full.
        let req = request("1.0.96.10.in-addr.arpa.", RecordType::PTR, None);
        same(&req, &reply(ResponseCode::NXDomain, vec![], vec![soa()]));
    }

    #[test]
    fn other_shapes_fall_back() {
        let name = "myapp.default.svc.cluster.local.";
        let req = request(name, RecordType::A, None);
        let mut r = reply(
            ResponseCode::NoError,
            a_records("other.example.", 1),
            vec![],
        );
        assert!(encode_fast(req.as_slice(), &req, &r).is_none());
        r.answers = a_records(name, 1);
        r.additionals = a_records(name, 1);
        assert!(encode_fast(req.as_slice(), &req, &r).is_none());
    }
}
