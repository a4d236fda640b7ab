//! The packet path under random and mutated input (a fuzz target that runs on stable Rust in
//! every test run; `PROPTEST_CASES=100000` for a longer campaign).

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
