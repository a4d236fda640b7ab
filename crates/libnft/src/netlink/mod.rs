//! A transaction as one nf_tables netlink batch (`NFNL_MSG_BATCH_BEGIN`, the messages,
//! `NFNL_MSG_BATCH_END`: one kernel transaction, all or nothing), for the transactions that
//! delete. Pure: bytes out, no socket ([`crate::nlsock`] sends them).
//!
//! Why: libnftables 1.0.6 loads its cache before any `delete` or `flush set` command, and
//! that cache is every chain and every set of the namespace (`nft_cache_evaluate` asks for
//! tables, chains, sets, objects and flowtables on `CMD_DELETE`, unfiltered), fetched again
//! after each commit because the generation id moved. At a thousand policies a one-element
//! delete costs that dump (7–10 ms) where the kernel's commit costs tens of microseconds;
//! additions in declaration form need no cache. So deleting transactions skip the library
//! when every operation is one this encoder knows, and all others keep the text path.
//!
//! What it knows is deliberately small, what deleting transactions are made of: element
//! additions and deletions (keys of `ipv4_addr`, `ipv6_addr` and their concatenations with
//! `inet_proto` and `inet_service`; data a verdict), flushing a chain, deleting a chain or a
//! set, and rules of a closed vocabulary (`ip daddr @set jump chain comment "…"`, `reject
//! with icmp type admin-prohibited`, `drop`, `accept`). A set declaration is accepted only
//! for a set the kernel already holds with the same type (the text path declares sets so
//! that nft need not look them up; here it is a no-op). Anything else (creating tables,
//! chains or sets, interval elements, other rules) is [`Unsupported`], and the caller sends
//! the text instead. The last request asks for an acknowledgement: nfnetlink reports every
//! failed message whether asked or not and goes on to the end of the batch, so a batch is
//! applied exactly when no error and that acknowledgement come back (one answer, however
//! large the batch: no acknowledgement floods the socket's buffer).

use std::collections::HashMap;
use std::fmt;

use crate::tx::{Family, Op, SetDef, Transaction};

mod rules;
mod writer;

use rules::{Rule, Shape, Verdict};
use writer::{NFTA_LIST_ELEM, Writer};

/// nfnetlink subsystem of nf_tables.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;

const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;

const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

// Attributes (linux/netfilter/nf_tables.h).
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;

/// Why a transaction is left to libnftables: the operation the encoder does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not encodable as a netlink batch: {}", self.0)
    }
}

/// One encoded batch: the bytes, where each message starts (its sequence number is written
/// when sent) and what each message is (for errors, and for tests to see what is sent).
#[derive(Clone, PartialEq, Eq)]
pub struct Batch {
    bytes: Vec<u8>,
    starts: Vec<usize>,
    what: Vec<String>,
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("bytes", &self.bytes.len())
            .field("messages", &self.what)
            .finish()
    }
}

impl Batch {
    /// The messages, begin and end included, each as `TYPE table object` (`NEWSETELEM ip
    /// svcnet-netpol pods-… (2)`): the whole of what is sent, no request to read anything.
    pub fn messages(&self) -> &[String] {
        &self.what
    }

    /// Sets the sequence numbers, `first` upwards, and returns the bytes to send.
    pub fn with_seq(&mut self, first: u32) -> &[u8] {
        for (i, &start) in self.starts.iter().enumerate() {
            let seq = first.wrapping_add(u32::try_from(i).unwrap_or(u32::MAX));
            self.bytes[start + 8..start + 12].copy_from_slice(&seq.to_ne_bytes());
        }
        &self.bytes
    }

    /// What the message sent with sequence number `seq` was, when `first` was the first.
    pub fn describe(&self, first: u32, seq: u32) -> Option<&str> {
        let i = usize::try_from(seq.wrapping_sub(first)).ok()?;
        self.what.get(i).map(String::as_str)
    }

    /// Messages between begin and end.
    pub fn requests(&self) -> usize {
        self.starts.len().saturating_sub(2)
    }

    /// The sequence number of the last request (the acknowledged one), when `first` was
    /// the first.
    pub fn last_request(&self, first: u32) -> u32 {
        let n = u32::try_from(self.requests()).unwrap_or(u32::MAX);
        first.wrapping_add(n)
    }
}

/// Whether `op` is one libnftables 1.0.6 cannot run without loading the namespace's chains
/// and sets first (so the transaction is worth encoding).
pub fn needs_cache(op: &Op) -> bool {
    matches!(
        op,
        Op::DeleteElement { .. }
            | Op::DeleteChain(_)
            | Op::DeleteSet { .. }
            | Op::DeleteTable
            | Op::FlushSet { .. }
    )
}

/// Encodes `tx` as one batch. `known` gives the declaration of each set the kernel holds
/// (what was last applied): element keys are encoded by their set's type, and a set
/// declaration is accepted only for such a set.
pub fn encode(
    tx: &Transaction,
    known: &dyn Fn(&str) -> Option<SetDef>,
) -> Result<Batch, Unsupported> {
    let family = match tx.family {
        Family::Ip => AF_INET,
        Family::Ip6 => AF_INET6,
    };
    let mut w = Writer::default();
    batch_marker(&mut w, NFNL_MSG_BATCH_BEGIN, "BATCH_BEGIN");
    // The sets as the batch leaves them: declared (known, same type) or deleted.
    let mut sets: HashMap<&str, Option<SetDef>> = HashMap::new();
    let t = tx.table.as_str();
    let mut i = 0;
    while i < tx.ops.len() {
        let op = &tx.ops[i];
        match op {
            Op::AddSet(def) => {
                if matches!(sets.get(def.name.as_str()), Some(None)) {
                    return Err(Unsupported(format!("recreates set {}", def.name)));
                }
                let same = known(&def.name).is_some_and(|k| {
                    (k.kind, &k.type_, &k.flags) == (def.kind, &def.type_, &def.flags)
                });
                if !same {
                    return Err(Unsupported(format!("creates set {}", def.name)));
                }
                sets.insert(&def.name, Some(def.clone()));
            }
            Op::AddElement { set, .. } | Op::DeleteElement { set, .. } => {
                let def = match sets.get(set.as_str()) {
                    Some(Some(d)) => d.clone(),
                    Some(None) => return Err(Unsupported(format!("set {set} is deleted"))),
                    None => known(set).ok_or_else(|| Unsupported(format!("unknown set {set}")))?,
                };
                let shape = Shape::of(&def, tx.family)?;
                let adding = matches!(op, Op::AddElement { .. });
                let (kind, name, flags) = match adding {
                    true => (NFT_MSG_NEWSETELEM, "NEWSETELEM", NLM_F_CREATE),
                    false => (NFT_MSG_DELSETELEM, "DELSETELEM", 0),
                };
                // Consecutive operations of the same kind on the same set: one message.
                let mut run = Vec::new();
                while let Some(next) = tx.ops.get(i) {
                    match (next, adding) {
                        (Op::AddElement { set: s, key, value }, true) if s == set => {
                            run.push((key.as_str(), value.as_deref()));
                        }
                        (Op::DeleteElement { set: s, key }, false) if s == set => {
                            run.push((key.as_str(), None));
                        }
                        _ => break,
                    }
                    i += 1;
                }
                let what = format!("{name} {} {t} {set} ({})", tx.family.as_str(), run.len());
                w.begin(
                    (NFNL_SUBSYS_NFTABLES << 8) | kind,
                    NLM_F_REQUEST | flags,
                    family,
                    &what,
                );
                w.str(NFTA_SET_ELEM_LIST_TABLE, t);
                w.str(NFTA_SET_ELEM_LIST_SET, set);
                let list = w.nest(NFTA_SET_ELEM_LIST_ELEMENTS);
                for (key, value) in run {
                    let elem = w.nest(NFTA_LIST_ELEM);
                    let k = w.nest(NFTA_SET_ELEM_KEY);
                    w.attr(NFTA_DATA_VALUE, &shape.key(key)?);
                    w.close(k);
                    match (value, shape.verdict) {
                        (Some(v), true) => {
                            let d = w.nest(NFTA_SET_ELEM_DATA);
                            w.verdict(&Verdict::parse(v)?);
                            w.close(d);
                        }
                        (None, false) => {}
                        // A deletion names the key only.
                        (None, true) if !adding => {}
                        _ => {
                            return Err(Unsupported(format!(
                                "element {key} does not fit {set}'s type"
                            )));
                        }
                    }
                    w.close(elem);
                }
                w.close(list);
                w.end();
                continue;
            }
            Op::FlushChain(chain) => {
                // A rule deletion without a handle empties the chain.
                let what = format!("DELRULE {} {t} {chain} (all)", tx.family.as_str());
                table_object(
                    &mut w,
                    NFT_MSG_DELRULE,
                    family,
                    &what,
                    (NFTA_RULE_TABLE, t),
                    (NFTA_RULE_CHAIN, chain),
                );
            }
            Op::DeleteChain(chain) => {
                let what = format!("DELCHAIN {} {t} {chain}", tx.family.as_str());
                table_object(
                    &mut w,
                    NFT_MSG_DELCHAIN,
                    family,
                    &what,
                    (NFTA_CHAIN_TABLE, t),
                    (NFTA_CHAIN_NAME, chain),
                );
            }
            Op::DeleteSet { name, .. } => {
                let what = format!("DELSET {} {t} {name}", tx.family.as_str());
                table_object(
                    &mut w,
                    NFT_MSG_DELSET,
                    family,
                    &what,
                    (NFTA_SET_TABLE, t),
                    (NFTA_SET_NAME, name),
                );
                sets.insert(name, None);
            }
            Op::AddRule { chain, rule } => {
                let parsed = Rule::parse(rule, tx.family)?;
                if let Rule::Lookup { set, .. } = &parsed
                    && matches!(sets.get(set.as_str()), Some(None))
                {
                    return Err(Unsupported(format!("rule uses deleted set {set}")));
                }
                let what = format!("NEWRULE {} {t} {chain}: {rule}", tx.family.as_str());
                w.begin(
                    (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE,
                    NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND,
                    family,
                    &what,
                );
                w.str(NFTA_RULE_TABLE, t);
                w.str(NFTA_RULE_CHAIN, chain);
                parsed.write(&mut w);
                w.end();
            }
            Op::AddTable { .. } | Op::DeleteTable | Op::AddChain { .. } | Op::FlushSet { .. } => {
                return Err(Unsupported(format!("{op:?}")));
            }
        }
        i += 1;
    }
    if w.starts.len() < 2 {
        return Err(Unsupported("an empty transaction".into()));
    }
    // The last request is acknowledged (see the module's documentation).
    if let Some(&last) = w.starts.last() {
        let flags = u16::from_ne_bytes([w.bytes[last + 6], w.bytes[last + 7]]) | NLM_F_ACK;
        w.bytes[last + 6..last + 8].copy_from_slice(&flags.to_ne_bytes());
    }
    batch_marker(&mut w, NFNL_MSG_BATCH_END, "BATCH_END");
    Ok(Batch {
        bytes: w.bytes,
        starts: w.starts,
        what: w.what,
    })
}

/// `NFNL_MSG_BATCH_BEGIN` or `_END`: nfnetlink's batch header names the subsystem in res_id
/// (big-endian).
fn batch_marker(w: &mut Writer, kind: u16, what: &str) {
    w.begin(kind, NLM_F_REQUEST, AF_UNSPEC, what);
    let at = w.bytes.len() - 2;
    w.bytes[at..].copy_from_slice(&NFNL_SUBSYS_NFTABLES.to_be_bytes());
    w.end();
}

/// A request that names only a table and one object in it (a chain or a set), each a
/// string attribute.
fn table_object(
    w: &mut Writer,
    kind: u16,
    family: u8,
    what: &str,
    table: (u16, &str),
    object: (u16, &str),
) {
    w.begin(
        (NFNL_SUBSYS_NFTABLES << 8) | kind,
        NLM_F_REQUEST,
        family,
        what,
    );
    w.str(table.0, table.1);
    w.str(object.0, object.1);
    w.end();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tx::SetKind;

    fn def(name: &str, kind: SetKind, type_: &str) -> SetDef {
        SetDef::new(name, kind, type_)
    }

    fn known(name: &str) -> Option<SetDef> {
        match name {
            "pods" => Some(def(name, SetKind::Set, "ipv4_addr")),
            "ports" => Some(def(
                name,
                SetKind::Set,
                "ipv4_addr . inet_proto . inet_service",
            )),
            "iso" => Some(def(name, SetKind::Map, "ipv4_addr : verdict")),
            "block" => Some(SetDef {
                flags: vec!["interval"],
                ..def(name, SetKind::Set, "ipv4_addr")
            }),
            _ => None,
        }
    }

    fn tx(ops: Vec<Op>) -> Transaction {
        let mut t = Transaction::new(Family::Ip, "t");
        t.ops = ops;
        t
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The message bodies (after the nfgenmsg header) are the bytes libnftables 1.0.6 sent for
    /// the same commands (`strace -s 4096 nft -f`), less the set id attributes it adds for
    /// sets declared in the same batch (the kernel looks a set up by name first).
    #[test]
    fn messages_are_the_ones_libnftables_sends() {
        let mut b = encode(
            &tx(vec![
                Op::AddElement {
                    set: "iso".into(),
                    key: "10.9.0.2".into(),
                    value: Some("jump c1".into()),
                },
                Op::AddElement {
                    set: "ports".into(),
                    key: "10.9.0.2 . tcp . 8080".into(),
                    value: None,
                },
                Op::AddRule {
                    chain: "d".into(),
                    rule: "ip daddr @s1 jump c1 comment \"a/b\"".into(),
                },
                Op::AddRule {
                    chain: "d".into(),
                    rule: "drop".into(),
                },
            ]),
            &|n| known(n).or_else(|| (n == "s1").then(|| def(n, SetKind::Set, "ipv4_addr"))),
        )
        .unwrap();
        let bytes = b.with_seq(1).to_vec();
        let body = |i: usize| {
            let start = b.starts[i];
            let len = u32::from_ne_bytes(bytes[start..start + 4].try_into().unwrap()) as usize;
            bytes[start + 20..start + len].to_vec()
        };
        let table = b"\x06\x00\x01\x00t\x00\x00\x00".to_vec();
        let cat = |parts: &[&[u8]]| parts.concat();
        assert_eq!(
            body(1),
            cat(&[
                &table,
                b"\x08\x00\x02\x00iso\x00",
                b"\x2c\x00\x03\x80\x28\x00\x01\x80\x0c\x00\x01\x80\x08\x00\x01\x00\x0a\x09\x00\x02\
                  \x18\x00\x02\x80\x14\x00\x02\x80\x08\x00\x01\x00\xff\xff\xff\xfd\x07\x00\x02\x00c1\x00\x00",
            ])
        );
        assert_eq!(
            body(2),
            cat(&[
                &table,
                b"\x0a\x00\x02\x00ports\x00\x00\x00",
                b"\x1c\x00\x03\x80\x18\x00\x01\x80\x14\x00\x01\x80\x10\x00\x01\x00\x0a\x09\x00\x02\
                  \x06\x00\x00\x00\x1f\x90\x00\x00",
            ])
        );
        assert_eq!(
            body(3),
            cat(&[
                &table,
                b"\x06\x00\x02\x00d\x00\x00\x00",
                b"\x94\x00\x04\x80",
                b"\x34\x00\x01\x80\x0c\x00\x01\x00payload\x00\x24\x00\x02\x80\x08\x00\x01\x00\x00\x00\x00\x01\
                  \x08\x00\x02\x00\x00\x00\x00\x01\x08\x00\x03\x00\x00\x00\x00\x10\x08\x00\x04\x00\x00\x00\x00\x04",
                b"\x24\x00\x01\x80\x0b\x00\x01\x00lookup\x00\x00\x14\x00\x02\x80\x08\x00\x02\x00\x00\x00\x00\x01\
                  \x07\x00\x01\x00s1\x00\x00",
                b"\x38\x00\x01\x80\x0e\x00\x01\x00immediate\x00\x00\x00\x24\x00\x02\x80\x08\x00\x01\x00\x00\x00\x00\x00\
                  \x18\x00\x02\x80\x14\x00\x02\x80\x08\x00\x01\x00\xff\xff\xff\xfd\x07\x00\x02\x00c1\x00\x00",
                b"\x0a\x00\x07\x00\x00\x04a/b\x00\x00\x00",
            ])
        );
        assert_eq!(
            body(4),
            cat(&[
                &table,
                b"\x06\x00\x02\x00d\x00\x00\x00",
                b"\x34\x00\x04\x80",
                b"\x30\x00\x01\x80\x0e\x00\x01\x00immediate\x00\x00\x00\x1c\x00\x02\x80\x08\x00\x01\x00\x00\x00\x00\x00\
                  \x10\x00\x02\x80\x0c\x00\x02\x80\x08\x00\x01\x00\x00\x00\x00\x00",
            ])
        );
        // Begin and end name the nf_tables subsystem; the last request asks for an answer.
        assert_eq!(&bytes[16..20], b"\x00\x00\x00\x0a");
        let flags =
            |i: usize| u16::from_ne_bytes(bytes[b.starts[i] + 6..][..2].try_into().unwrap());
        assert!((1..4).all(|i| flags(i) & NLM_F_ACK == 0));
        assert_ne!(flags(4) & NLM_F_ACK, 0);
        assert_eq!(b.last_request(1), 5);
        assert_eq!(b.requests(), 4);
        assert_eq!(
            b.messages(),
            [
                "BATCH_BEGIN",
                "NEWSETELEM ip t iso (1)",
                "NEWSETELEM ip t ports (1)",
                "NEWRULE ip t d: ip daddr @s1 jump c1 comment \"a/b\"",
                "NEWRULE ip t d: drop",
                "BATCH_END"
            ]
        );
        assert_eq!(b.describe(1, 3), Some("NEWSETELEM ip t ports (1)"));
    }

    #[test]
    fn a_pods_move_is_one_batch_of_element_messages() {
        let b = encode(
            &tx(vec![
                Op::DeleteElement {
                    set: "pods".into(),
                    key: "10.0.0.1".into(),
                },
                Op::DeleteElement {
                    set: "pods".into(),
                    key: "10.0.0.2".into(),
                },
                Op::DeleteElement {
                    set: "iso".into(),
                    key: "10.0.0.1".into(),
                },
                Op::AddSet(def(
                    "ports",
                    SetKind::Set,
                    "ipv4_addr . inet_proto . inet_service",
                )),
                Op::AddElement {
                    set: "ports".into(),
                    key: "10.0.0.1 . udp . 53".into(),
                    value: None,
                },
            ]),
            &known,
        )
        .unwrap();
        assert_eq!(
            b.messages(),
            [
                "BATCH_BEGIN",
                "DELSETELEM ip t pods (2)",
                "DELSETELEM ip t iso (1)",
                "NEWSETELEM ip t ports (1)",
                "BATCH_END"
            ]
        );
    }

    #[test]
    fn what_it_does_not_know_is_left_to_libnftables() {
        let unsupported = |ops: Vec<Op>| encode(&tx(ops), &known).unwrap_err().0;
        // A new set, or a declaration that does not match what the kernel holds.
        let new = def("fresh", SetKind::Set, "ipv4_addr");
        assert_eq!(unsupported(vec![Op::AddSet(new)]), "creates set fresh");
        let retyped = def("pods", SetKind::Set, "ipv6_addr");
        assert_eq!(unsupported(vec![Op::AddSet(retyped)]), "creates set pods");
        // Interval elements, elements of unknown or deleted sets, malformed keys.
        let del = |set: &str, key: &str| Op::DeleteElement {
            set: set.into(),
            key: key.into(),
        };
        assert!(unsupported(vec![del("block", "10.0.0.1")]).contains("set block"));
        assert!(unsupported(vec![del("nope", "10.0.0.1")]).contains("unknown set"));
        assert!(unsupported(vec![del("pods", "fd00::1")]).contains("element key"));
        assert!(unsupported(vec![del("ports", "10.0.0.1 . tcp")]).contains("element key"));
        let gone = Op::DeleteSet {
            name: "pods".into(),
            kind: SetKind::Set,
        };
        assert!(unsupported(vec![gone.clone(), del("pods", "10.0.0.1")]).contains("deleted"));
        let again = Op::AddSet(def("pods", SetKind::Set, "ipv4_addr"));
        assert_eq!(unsupported(vec![gone, again]), "recreates set pods");
        // Rules outside the vocabulary, chains and tables.
        let rule = |r: &str| Op::AddRule {
            chain: "c".into(),
            rule: r.into(),
        };
        for r in [
            "ip saddr @pods meta l4proto . th dport { tcp . 80 } accept",
            "ip6 saddr @pods jump c",
            "ct state established,related accept",
            "reject with icmpv6 type admin-prohibited",
            "ip saddr @pods jump c comment \"a\"b\"",
        ] {
            assert!(unsupported(vec![rule(r)]).starts_with("rule"), "{r}");
        }
        assert!(
            unsupported(vec![Op::AddChain {
                name: "c".into(),
                base: None
            }])
            .contains("AddChain")
        );
        assert!(unsupported(vec![Op::DeleteTable]).contains("DeleteTable"));
    }

    #[test]
    fn keys_follow_the_set_type() {
        let shape = |t: &str, f| Shape::of(&def("s", SetKind::Set, t), f).ok().unwrap();
        assert_eq!(
            hex(&shape("ipv4_addr", Family::Ip).key("10.1.2.3").unwrap()),
            "0a010203"
        );
        assert_eq!(
            hex(&shape("ipv6_addr", Family::Ip6).key("fd00::1").unwrap()),
            "fd000000000000000000000000000001"
        );
        assert_eq!(
            hex(
                &(shape("ipv6_addr . inet_proto . inet_service", Family::Ip6))
                    .key("fd00::1 . sctp . 443")
                    .unwrap()
            ),
            "fd00000000000000000000000000000184000000 01bb0000".replace(' ', "")
        );
        // An ipv4 set in an ip6 table is not something svcnet writes.
        assert!(Shape::of(&def("s", SetKind::Set, "ipv4_addr"), Family::Ip6).is_err());
    }
}
