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
use crate::zone::Quick;

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
#[cfg(test)]
pub(crate) fn plain_query(raw: &[u8]) -> Option<(Name, RecordType, Asked<'_>)> {
    let view = QuestionView::new(raw)?;
    Some((view.name()?, view.qtype, view.asked))
}

/// A plain query (see [`plain_query`]) as it lies in the datagram: its question's labels
/// where they are (lower-cased in a copy when the question has capitals), its type, and what
/// the encoder needs. Only for names of ASCII bytes up to [`MAX_VIEWED_NAME`] bytes; the
/// general path takes the others.
pub(crate) struct QuestionView<'a> {
    pub(crate) asked: Asked<'a>,
    pub(crate) qtype: RecordType,
    /// Where the question's type starts (after the name).
    name_end: usize,
    labels: QuestionLabels,
    /// The name's bytes from offset 12 with ASCII letters lower-cased, when it has capitals.
    lower: Option<[u8; MAX_VIEWED_NAME]>,
}

/// Longest question name (wire bytes, root included) a [`QuestionView`] takes; longer ones go
/// through hickory's parser, which decides whether they are valid.
const MAX_VIEWED_NAME: usize = 250;

impl<'a> QuestionView<'a> {
    /// The view of `raw` when it is a plain query with a name it takes.
    pub(crate) fn new(raw: &'a [u8]) -> Option<QuestionView<'a>> {
        if raw.len() < QUESTION || raw[2] & 0x80 != 0 || (raw[2] >> 3) & 0x0f != 0 {
            return None;
        }
        if !super::cache::plain_question(raw) {
            return None;
        }
        // Where the name's labels start.
        let mut labels = QuestionLabels {
            starts: [0; 128],
            count: 0,
        };
        let mut i = QUESTION;
        loop {
            let len = usize::from(*raw.get(i)?);
            if len == 0 {
                break;
            }
            if len & 0xc0 != 0 || i + 1 + len - QUESTION >= MAX_VIEWED_NAME {
                return None;
            }
            *labels.starts.get_mut(labels.count)? = u16::try_from(i).ok()?;
            labels.count += 1;
            i += 1 + len;
        }
        let name_end = i + 1;
        // Whether it is ASCII and has capitals, in one pass over its bytes (a length byte is
        // below 64, so neither).
        let (mut high, mut upper) = (false, false);
        for &b in raw.get(QUESTION..name_end)? {
            high |= b >= 0x80;
            upper |= b.is_ascii_uppercase();
        }
        if high {
            return None;
        }
        let end = name_end + 4;
        let question = raw.get(name_end..end)?;
        let class = u16::from_be_bytes([question[2], question[3]]);
        if class != u16::from(DNSClass::IN) {
            return None;
        }
        let qtype = RecordType::from(u16::from_be_bytes([question[0], question[1]]));
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
            // extended rcode, version, flags; then rdlength, which must be 0 (options are
            // parsed, and judged, by the general path).
            let opt = raw.get(end..end + 11)?;
            if opt[5] != 0 || opt[6] != 0 || opt[9] != 0 || opt[10] != 0 {
                return None;
            }
            let client = u16::from_be_bytes([opt[3], opt[4]]);
            Some(client.clamp(512, super::handler::MAX_UDP_PAYLOAD))
        };
        let lower = upper.then(|| {
            let mut lower = [0u8; MAX_VIEWED_NAME];
            for (l, b) in lower.iter_mut().zip(&raw[QUESTION..name_end]) {
                *l = b.to_ascii_lowercase();
            }
            lower
        });
        Some(QuestionView {
            asked: Asked {
                raw,
                op_code: 0,
                recursion_desired: raw[2] & 0x01 != 0,
                checking_disabled: raw[3] & 0x10 != 0,
                payload,
            },
            qtype,
            name_end,
            labels,
            lower,
        })
    }

    /// The question name as hickory reads it (`None` when it does not).
    pub(crate) fn name(&self) -> Option<Name> {
        let mut decoder = BinDecoder::new(self.asked.raw.get(QUESTION..self.name_end)?);
        Name::read(&mut decoder).ok()
    }

    /// The question's labels, lower-cased, leftmost first, in `buf`; `None` when there are
    /// more than it holds.
    pub(crate) fn labels<'s>(&'s self, buf: &'s mut [&'s str]) -> Option<&'s [&'s str]> {
        if self.labels.count > buf.len() {
            return None;
        }
        let bytes = match &self.lower {
            Some(lower) => &lower[..self.name_end - QUESTION],
            None => self.asked.raw.get(QUESTION..self.name_end)?,
        };
        let text = std::str::from_utf8(bytes).ok()?;
        for (slot, &start) in buf.iter_mut().zip(&self.labels.starts[..self.labels.count]) {
            let at = usize::from(start) - QUESTION;
            let len = usize::from(bytes[at]);
            *slot = text.get(at + 1..at + 1 + len)?;
        }
        Some(&buf[..self.labels.count])
    }
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
    if !reply.additionals.is_empty() {
        return None;
    }
    if reply.rcode.high() != 0 {
        return None;
    }
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
    let question_end = question_end(asked.raw)?;
    // The SOA's names, taken apart here (the UDP loop's plain questions use the snapshot's,
    // taken apart once); one that cannot be written is left out, with TC, as one that does
    // not fit.
    let soa = soa.map(|soa| {
        let labels = QuestionLabels::new(asked.raw, question_end)?;
        Some((SoaWire::new(soa)?, labels))
    });
    let parts = Parts {
        rcode: reply.rcode.low(),
        authoritative: reply.authoritative,
        truncated: reply.truncated,
        answers: &reply.answers,
        addresses: reply
            .addresses
            .as_deref()
            .map(|a| (a.ips.as_slice(), a.ttl)),
    };
    let soa = soa
        .as_ref()
        .map(|s| s.as_ref().map(|(soa, labels)| (soa, labels, false)));
    encode_parts(asked, question_end, &parts, soa, out)
}

/// [`encode_asked_into`] of the answers [`Zone::lookup_labels`] gives, to the question of
/// `view`, with `soa` (the snapshot's SOA, encoded once) for a negative one: the same bytes as
/// the zone's `Response` for the same question would be encoded to.
pub(crate) fn encode_quick_into(
    view: &QuestionView<'_>,
    quick: &Quick,
    ttl: u32,
    soa: Option<&SoaWire>,
    out: &mut Vec<u8>,
) -> Option<Option<AddressRegion>> {
    out.clear();
    let (rcode, addresses, soa) = match quick {
        Quick::Negative { nxdomain } => {
            let rcode = if *nxdomain { 3 } else { 0 };
            // The zone answered the name as one under the cluster domain, the SOA's owner.
            (rcode, None, Some(soa.map(|soa| (soa, &view.labels, true))))
        }
        Quick::Addresses(ips) => (0, Some((ips.as_slice(), ttl)), None),
    };
    let parts = Parts {
        rcode,
        authoritative: true,
        truncated: false,
        answers: &[],
        addresses,
    };
    encode_parts(&view.asked, view.name_end + 4, &parts, soa, out)
}

/// An answer's header flags and answer section, for [`encode_parts`].
struct Parts<'r> {
    /// The low four bits of the rcode.
    rcode: u8,
    authoritative: bool,
    truncated: bool,
    /// A/AAAA records owned by the question name (checked by the caller).
    answers: &'r [Record],
    /// Addresses owned by the question name, and their TTL.
    addresses: Option<(&'r [IpAddr], u32)>,
}

/// Write the answer: header, the question as asked, the answer records then the addresses
/// (owners as pointers to the question), the SOA if any (`Some(None)`: one that cannot be
/// written, left out with TC as one that does not fit; the flag: the question is under its
/// owner), the OPT record when the question had one; whole records only, within the client's
/// size.
fn encode_parts(
    asked: &Asked<'_>,
    question_end: usize,
    parts: &Parts<'_>,
    soa: Option<Option<(&SoaWire, &QuestionLabels, bool)>>,
    out: &mut Vec<u8>,
) -> Option<Option<AddressRegion>> {
    let raw = asked.raw;
    let question = raw.get(QUESTION..question_end)?;
    let max = usize::from(asked.payload.unwrap_or(512));
    let opt_len = if asked.payload.is_some() { 11 } else { 0 };

    out.extend_from_slice(&raw[0..2]);
    let mut flags = [0u8; 2];
    flags[0] = 0x80 | ((asked.op_code & 0x0f) << 3);
    if parts.authoritative {
        flags[0] |= 0x04;
    }
    if asked.recursion_desired {
        flags[0] |= 0x01;
    }
    flags[1] = 0x80 | parts.rcode; // RA
    if asked.checking_disabled {
        flags[1] |= 0x10;
    }
    out.extend_from_slice(&flags);
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(asked.payload.is_some())]);
    out.extend_from_slice(question);

    let mut answers: u16 = 0;
    let mut truncated = parts.truncated;
    let records = parts.answers.iter().map(|r| match &r.data {
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
    if let Some((ips, ttl)) = parts.addresses.filter(|_| !cut) {
        let at = out.len();
        let mut shown = 0;
        for ip in ips {
            if !push_address(out, *ip, ttl, opt_len, max) {
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
        let written = soa.and_then(|(soa, labels, under)| soa.write(out, raw, labels, under));
        if written.is_some() && out.len() + opt_len <= max {
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
pub(crate) struct QuestionLabels {
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

/// A name in wire form (uncompressed, root included) with where each label starts: an SOA's
/// names taken apart once.
#[derive(Debug, Clone)]
struct WireName {
    bytes: [u8; 256],
    starts: [u8; 128],
    count: usize,
    /// Where the root (the terminating 0) is.
    root: usize,
}

impl WireName {
    /// `None` for a label of 64 bytes or more, or a name that does not fit a message.
    fn new(name: &Name) -> Option<WireName> {
        let mut wire = WireName {
            bytes: [0; 256],
            starts: [0; 128],
            count: 0,
            root: 0,
        };
        let mut at = 0;
        for label in name.iter() {
            let len = u8::try_from(label.len()).ok().filter(|l| *l < 64)?;
            *wire.starts.get_mut(wire.count)? = u8::try_from(at).ok()?;
            wire.count += 1;
            *wire.bytes.get_mut(at)? = len;
            wire.bytes
                .get_mut(at + 1..at + 1 + label.len())?
                .copy_from_slice(label);
            at += 1 + label.len();
        }
        // The root's 0 is the array's.
        (at < wire.bytes.len()).then_some(())?;
        wire.root = at;
        Some(wire)
    }

    fn label(&self, i: usize) -> &[u8] {
        let at = usize::from(self.starts[i]);
        &self.bytes[at + 1..at + 1 + usize::from(self.bytes[at])]
    }

    /// How many of its last labels equal `other`'s last labels (ignoring case).
    fn common_tail(&self, other: &WireName) -> usize {
        let mut common = 0;
        while common < self.count.min(other.count)
            && self
                .label(self.count - 1 - common)
                .eq_ignore_ascii_case(other.label(other.count - 1 - common))
        {
            common += 1;
        }
        common
    }

    /// Append the name, ending in a pointer at the longest of its suffixes found in the
    /// question. `known`: its last `k` labels are known to match the question's, and
    /// whether the labels before them still need comparing (`None`: compare them all).
    ///
    /// A suffix of `k` labels can only match the question's last `k` labels (both end at the
    /// root), and if the last `k` labels match so do the last `k - 1`: so the longest suffix
    /// found is the common tail of the two names, compared label by label from the root.
    fn write(
        &self,
        out: &mut Vec<u8>,
        raw: &[u8],
        question: &QuestionLabels,
        known: Option<(usize, bool)>,
    ) {
        let total = self.count;
        let (known, more) = known.unwrap_or((0, true));
        let mut common = known.min(total).min(question.count);
        while more && common < total.min(question.count) {
            let label = self.label(total - 1 - common);
            let at = usize::from(question.starts[question.count - 1 - common]);
            let len = usize::from(raw[at]);
            if len != label.len() || !raw[at + 1..at + 1 + len].eq_ignore_ascii_case(label) {
                break;
            }
            common += 1;
        }
        // The labels before the common tail, as they are.
        let kept = total - common;
        let end = if kept == total {
            self.root
        } else {
            usize::from(self.starts[kept])
        };
        out.extend_from_slice(&self.bytes[..end]);
        if common > 0 {
            let at = question.starts[question.count - common];
            out.extend_from_slice(&(0xc000 | at).to_be_bytes());
        } else {
            out.push(0);
        }
    }
}

/// An SOA record taken apart for writing: its three names, TTL, and the five numbers of its
/// data as they go on the wire. The UDP loop keeps the zone's with each published snapshot
/// (`cache::Served`), so a negative answer writes it without touching hickory's records.
#[derive(Debug, Clone)]
pub(crate) struct SoaWire {
    owner: WireName,
    mname: WireName,
    rname: WireName,
    /// How many last labels of `mname` and of `rname` are the owner's (`owner.count` for a
    /// name under the owner): for a question under the owner, those match the question's.
    shared: (usize, usize),
    ttl: u32,
    /// Serial, refresh, retry, expire, minimum.
    numbers: [u8; 20],
}

impl SoaWire {
    /// `None` when `soa` is not an SOA record or a name of it has a label of 64 bytes or more.
    pub(crate) fn new(soa: &Record) -> Option<SoaWire> {
        let RData::SOA(data) = &soa.data else {
            return None;
        };
        let mut numbers = [0u8; 20];
        for (slot, n) in numbers.chunks_exact_mut(4).zip([
            data.serial.to_be_bytes(),
            data.refresh.to_be_bytes(),
            data.retry.to_be_bytes(),
            data.expire.to_be_bytes(),
            data.minimum.to_be_bytes(),
        ]) {
            slot.copy_from_slice(&n);
        }
        let owner = WireName::new(&soa.name)?;
        let mname = WireName::new(&data.mname)?;
        let rname = WireName::new(&data.rname)?;
        Some(SoaWire {
            shared: (mname.common_tail(&owner), rname.common_tail(&owner)),
            owner,
            mname,
            rname,
            ttl: soa.ttl,
            numbers,
        })
    }

    /// Append the record, its names compressed against the question. `under_owner`: the
    /// question's name is the owner or below it (ignoring case), so the comparisons of the
    /// labels the names share with the owner are skipped: a name that leaves the owner's
    /// labels before their end cannot match the question further either.
    fn write(
        &self,
        out: &mut Vec<u8>,
        raw: &[u8],
        question: &QuestionLabels,
        under_owner: bool,
    ) -> Option<()> {
        let owner = self.owner.count;
        // How many last labels of a name sharing `shared` with the owner are known to match
        // the question: those; a name that parts from the owner's labels before their end
        // matches no further (its next label differs from the owner's, which is the
        // question's).
        let known = |shared: usize| under_owner.then_some((shared, shared == owner));
        self.owner.write(out, raw, question, known(owner));
        out.extend_from_slice(&6u16.to_be_bytes());
        out.extend_from_slice(&u16::from(DNSClass::IN).to_be_bytes());
        out.extend_from_slice(&self.ttl.to_be_bytes());
        let len_at = out.len();
        out.extend_from_slice(&[0, 0]);
        self.mname.write(out, raw, question, known(self.shared.0));
        self.rname.write(out, raw, question, known(self.shared.1));
        out.extend_from_slice(&self.numbers);
        let len = u16::try_from(out.len() - len_at - 2).ok()?;
        out[len_at..len_at + 2].copy_from_slice(&len.to_be_bytes());
        Some(())
    }
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
