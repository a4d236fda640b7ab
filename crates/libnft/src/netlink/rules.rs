//! The encoder's vocabulary: set keys by their type ([`Shape`]), verdicts and the dispatch
//! rules ([`Rule`]), each parsed from the text libnftables would be given and written as the
//! expressions it compiles that text to.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::Unsupported;
use super::writer::Writer;
use crate::tx::{Family, SetDef, SetKind};

const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_REJECT_TYPE: u16 = 1;
const NFTA_REJECT_ICMP_CODE: u16 = 2;
const NFT_REJECT_ICMP_UNREACH: u32 = 0;
/// The first 128-bit data register (`reg 1` in nft's debug output).
const NFT_REG_1: u32 = 1;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
/// ICMP "communication administratively prohibited" (`ICMP_PKT_FILTERED`), and ICMPv6's
/// (`ICMPV6_ADM_PROHIBITED`): what `reject with icmp(v6) type admin-prohibited` compiles to.
const ICMP_ADMIN_PROHIBITED: u8 = 13;
const ICMPV6_ADMIN_PROHIBITED: u8 = 1;
/// libnftnl's rule userdata type of a comment.
const NFTNL_UDATA_RULE_COMMENT: u8 = 0;
/// nft refuses longer comments (`NFT_USERDATA_MAXLEN` counts the NUL too).
const COMMENT_MAX: usize = 127;

/// A set's key layout and whether it maps to verdicts.
pub(super) struct Shape {
    fields: Vec<Field>,
    pub(super) verdict: bool,
}

#[derive(Clone, Copy)]
enum Field {
    Ipv4,
    Ipv6,
    Proto,
    Service,
}

impl Shape {
    pub(super) fn of(def: &SetDef, family: Family) -> Result<Shape, Unsupported> {
        let unsupported = || Unsupported(format!("set {} of type {}", def.name, def.type_));
        if !def.flags.is_empty() || def.type_.starts_with("typeof ") {
            // Interval elements are ranges the kernel holds as pairs; not encoded here.
            return Err(unsupported());
        }
        let (key, data) = match def.type_.split_once(" : ") {
            Some((k, "verdict")) => (k, true),
            Some(_) => return Err(unsupported()),
            None => (def.type_.as_str(), false),
        };
        if data != (def.kind == SetKind::Map) {
            return Err(unsupported());
        }
        let fields = key
            .split(" . ")
            .map(|f| match (f, family) {
                ("ipv4_addr", Family::Ip) => Ok(Field::Ipv4),
                ("ipv6_addr", Family::Ip6) => Ok(Field::Ipv6),
                ("inet_proto", _) => Ok(Field::Proto),
                ("inet_service", _) => Ok(Field::Service),
                _ => Err(unsupported()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Shape {
            fields,
            verdict: data,
        })
    }

    /// The key's bytes: each field in network order, padded to 32 bits in a concatenation
    /// (how nft lays out `a . b . c` in registers).
    pub(super) fn key(&self, text: &str) -> Result<Vec<u8>, Unsupported> {
        let bad = || Unsupported(format!("element key {text}"));
        let parts: Vec<&str> = text.split(" . ").map(str::trim).collect();
        if parts.len() != self.fields.len() {
            return Err(bad());
        }
        let mut out = Vec::new();
        for (field, part) in self.fields.iter().zip(parts) {
            match field {
                Field::Ipv4 => {
                    let a: Ipv4Addr = part.parse().map_err(|_| bad())?;
                    out.extend_from_slice(&a.octets());
                }
                Field::Ipv6 => {
                    let a: Ipv6Addr = part.parse().map_err(|_| bad())?;
                    out.extend_from_slice(&a.octets());
                }
                Field::Proto => {
                    let p: u8 = match part {
                        "tcp" => 6,
                        "udp" => 17,
                        "sctp" => 132,
                        n => n.parse().map_err(|_| bad())?,
                    };
                    out.extend_from_slice(&[p, 0, 0, 0]);
                }
                Field::Service => {
                    let p: u16 = part.parse().map_err(|_| bad())?;
                    out.extend_from_slice(&p.to_be_bytes());
                    out.extend_from_slice(&[0, 0]);
                }
            }
        }
        if self.fields.len() == 1 {
            // A single field is its own length (an IPv4 key is 4 bytes, not padded data).
            out.truncate(match self.fields[0] {
                Field::Ipv4 => 4,
                Field::Ipv6 => 16,
                Field::Proto => 1,
                Field::Service => 2,
            });
        }
        Ok(out)
    }
}

/// A verdict: `accept`, `drop`, `jump chain`, `goto chain`.
pub(super) enum Verdict {
    Code(u32),
    To(i32, String),
}

impl Verdict {
    pub(super) fn parse(text: &str) -> Result<Verdict, Unsupported> {
        let words: Vec<&str> = text.split_whitespace().collect();
        match words.as_slice() {
            ["accept"] => Ok(Verdict::Code(NF_ACCEPT)),
            ["drop"] => Ok(Verdict::Code(NF_DROP)),
            ["jump", chain] => Ok(Verdict::To(NFT_JUMP, chain.to_string())),
            ["goto", chain] => Ok(Verdict::To(NFT_GOTO, chain.to_string())),
            _ => Err(Unsupported(format!("verdict {text}"))),
        }
    }
}

/// The rules encoded: the dispatch vocabulary.
pub(super) enum Rule {
    /// `<family> saddr|daddr @set <verdict> [comment "…"]`.
    Lookup {
        offset: u32,
        len: u32,
        set: String,
        verdict: Verdict,
        comment: Option<String>,
    },
    /// `reject with icmp(v6) type admin-prohibited`.
    Reject(u8),
    Verdict(Verdict),
}

impl Rule {
    pub(super) fn parse(text: &str, family: Family) -> Result<Rule, Unsupported> {
        let bad = || Unsupported(format!("rule {text}"));
        let (body, comment) = match text.split_once(" comment \"") {
            Some((body, rest)) => {
                let c = rest.strip_suffix('"').ok_or_else(bad)?;
                if c.contains('"') || c.contains('\\') || c.len() > COMMENT_MAX {
                    return Err(bad());
                }
                (body, Some(c.to_string()))
            }
            None => (text, None),
        };
        let words: Vec<&str> = body.split_whitespace().collect();
        let rule = match (words.as_slice(), family) {
            ([fam, addr, set, verdict @ ..], _) if *fam == family.as_str() => {
                let set = set.strip_prefix('@').ok_or_else(bad)?;
                let (offset, len) = match (family, *addr) {
                    (Family::Ip, "saddr") => (12, 4),
                    (Family::Ip, "daddr") => (16, 4),
                    (Family::Ip6, "saddr") => (8, 16),
                    (Family::Ip6, "daddr") => (24, 16),
                    _ => return Err(bad()),
                };
                Rule::Lookup {
                    offset,
                    len,
                    set: set.to_string(),
                    verdict: Verdict::parse(&verdict.join(" ")).map_err(|_| bad())?,
                    comment,
                }
            }
            (["reject", "with", "icmp", "type", "admin-prohibited"], Family::Ip)
                if comment.is_none() =>
            {
                Rule::Reject(ICMP_ADMIN_PROHIBITED)
            }
            (["reject", "with", "icmpv6", "type", "admin-prohibited"], Family::Ip6)
                if comment.is_none() =>
            {
                Rule::Reject(ICMPV6_ADMIN_PROHIBITED)
            }
            ([v], _) if comment.is_none() => Rule::Verdict(Verdict::parse(v)?),
            _ => return Err(bad()),
        };
        Ok(rule)
    }

    /// The rule's expressions (what `nft --debug=netlink` shows libnftables compile the same
    /// text to) and its comment.
    pub(super) fn write(&self, w: &mut Writer) {
        let list = w.nest(NFTA_RULE_EXPRESSIONS);
        match self {
            Rule::Lookup {
                offset,
                len,
                set,
                verdict,
                comment,
            } => {
                w.expr("payload", |w| {
                    w.u32(NFTA_PAYLOAD_DREG, NFT_REG_1);
                    w.u32(NFTA_PAYLOAD_BASE, NFT_PAYLOAD_NETWORK_HEADER);
                    w.u32(NFTA_PAYLOAD_OFFSET, *offset);
                    w.u32(NFTA_PAYLOAD_LEN, *len);
                });
                w.expr("lookup", |w| {
                    w.u32(NFTA_LOOKUP_SREG, NFT_REG_1);
                    w.str(NFTA_LOOKUP_SET, set);
                });
                w.immediate(verdict);
                w.close(list);
                if let Some(c) = comment {
                    let mut data = vec![NFTNL_UDATA_RULE_COMMENT];
                    // COMMENT_MAX keeps the length (with its NUL) in a byte.
                    data.push(u8::try_from(c.len() + 1).unwrap_or(u8::MAX));
                    data.extend_from_slice(c.as_bytes());
                    data.push(0);
                    w.attr(NFTA_RULE_USERDATA, &data);
                }
                return;
            }
            Rule::Reject(code) => w.expr("reject", |w| {
                w.u32(NFTA_REJECT_TYPE, NFT_REJECT_ICMP_UNREACH);
                w.attr(NFTA_REJECT_ICMP_CODE, &[*code]);
            }),
            Rule::Verdict(v) => w.immediate(v),
        }
        w.close(list);
    }
}
