//! The answer cache seen through the UDP packet path: a hit is what a fresh answer would be,
//! answers are kept from a question's second miss, headless answers are drawn afresh,
//! publishing a zone empties it.

use std::collections::HashSet;
use std::sync::Arc;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, RecordType};

use super::cache::FastRng;
use super::handler::{Handler, ZoneHandle};
use super::test_support::query;
use super::udp::{Packet, answer_packet};
use crate::fixtures::*;
use crate::zone::{Objects, Zone, ZoneConfig};

fn objects(myapp_ip: &str) -> Objects {
    let mut web = slice("default", "web", "web-1", &[("web", "TCP", 80)]);
    for i in 0..100 {
        web = web.ep(&format!("10.244.1.{}", i + 1), None, true);
    }
    Objects {
        services: vec![
            cluster_ip("default", "myapp", &[myapp_ip], &[("http", "TCP", 80)]),
            headless("default", "web", &[("web", "TCP", 80)]),
            external("default", "ext", "example.org"),
        ],
        endpoint_slices: vec![web],
        pods: vec![],
        namespaces: vec![namespace("default")],
    }
}

fn handler(zone: Option<&Objects>) -> Handler {
    let config = Arc::new(ZoneConfig::new("cluster.local").unwrap());
    let handle = ZoneHandle::default();
    if let Some(objects) = zone {
        handle.publish(Zone::build(config.clone(), objects, 1));
    }
    Handler::offline(config, handle)
}

fn ask(h: &Handler, packet: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut rng = FastRng::new();
    match answer_packet(
        h,
        packet,
        "127.0.0.1:5353".parse().unwrap(),
        &mut out,
        &mut rng,
    ) {
        Packet::Reply | Packet::Cached => Some(out),
        _ => None,
    }
}

#[test]
fn hits_are_byte_for_byte_fresh_answers() {
    let objects = objects("10.96.0.5");
    let cases = [
        ("myapp.default.svc.cluster.local.", RecordType::A, None),
        (
            "MyApp.Default.svc.cluster.local.",
            RecordType::A,
            Some(1232),
        ),
        ("myapp.default.svc.cluster.local.", RecordType::AAAA, None),
        (
            "_http._tcp.myapp.default.svc.cluster.local.",
            RecordType::SRV,
            None,
        ),
        (
            "_HTTP._tcp.MYAPP.default.svc.cluster.local.",
            RecordType::SRV,
            Some(4096),
        ),
        (
            "nosuch.default.svc.cluster.local.",
            RecordType::A,
            Some(4096),
        ),
        ("5.0.96.10.in-addr.arpa.", RecordType::PTR, None),
        ("ext.default.svc.cluster.local.", RecordType::CNAME, None),
        ("dns-version.cluster.local.", RecordType::TXT, None),
    ];
    for (name, qtype, edns) in cases {
        // A fresh handler answers each case uncached; a second one answers it twice.
        let fresh = ask(&handler(Some(&objects)), &query(7, name, qtype, edns)).unwrap();
        let warm = handler(Some(&objects));
        let first = ask(&warm, &query(1, name, qtype, edns)).unwrap();
        assert_eq!(
            warm.zone.cache_stats().0,
            0,
            "{name} {qtype}: asked once, not kept"
        );
        let second = ask(&warm, &query(2, name, qtype, edns)).unwrap();
        assert_eq!(
            warm.zone.cache_stats().0,
            1,
            "{name} {qtype}: asked twice, kept"
        );
        assert_eq!(first[2..], second[2..]);
        let hit = ask(&warm, &query(7, name, qtype, edns)).unwrap();
        assert_eq!(hit, fresh, "{name} {qtype}");
        assert_eq!(first[2..], hit[2..]);
        let m = Message::from_vec(&hit).unwrap();
        assert_eq!(m.metadata.id, 7);
        for record in m.answers.iter().filter(|r| r.record_type() == qtype) {
            assert_eq!(
                record.name.to_string(),
                name,
                "owners keep the question's case"
            );
        }
    }
}

#[test]
fn negative_answers_keep_the_soa_from_the_cache() {
    let h = handler(Some(&objects("10.96.0.5")));
    for (name, rcode) in [
        ("nosuch.default.svc.cluster.local.", ResponseCode::NXDomain),
        ("myapp.default.svc.cluster.local.", ResponseCode::NoError),
    ] {
        let packet = query(3, name, RecordType::AAAA, Some(1232));
        for _ in 0..3 {
            let m = Message::from_vec(&ask(&h, &packet).unwrap()).unwrap();
            assert_eq!(m.metadata.response_code, rcode);
            assert!(m.answers.is_empty());
            assert!(matches!(m.authorities.as_slice(), [soa] if matches!(soa.data, RData::SOA(_))));
        }
    }
}

#[test]
fn publishing_a_zone_empties_the_cache() {
    let h = handler(Some(&objects("10.96.0.5")));
    let packet = query(9, "myapp.default.svc.cluster.local.", RecordType::A, None);
    let ip = |bytes: Vec<u8>| {
        Message::from_vec(&bytes).unwrap().answers[0]
            .data
            .to_string()
    };
    assert_eq!(ip(ask(&h, &packet).unwrap()), "10.96.0.5");
    assert_eq!(ip(ask(&h, &packet).unwrap()), "10.96.0.5");
    let config = h.config.clone();
    h.zone
        .publish(Zone::build(config, &objects("10.96.0.6"), 2));
    assert_eq!(h.zone.cache_stats(), (0, 0));
    assert_eq!(ip(ask(&h, &packet).unwrap()), "10.96.0.6");
}

#[test]
fn servfail_before_sync_and_forwarded_questions_are_not_kept() {
    let h = handler(None);
    let packet = query(9, "myapp.default.svc.cluster.local.", RecordType::A, None);
    let m = Message::from_vec(&ask(&h, &packet).unwrap()).unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    h.zone
        .publish(Zone::build(h.config.clone(), &objects("10.96.0.5"), 1));
    for _ in 0..2 {
        let m = Message::from_vec(&ask(&h, &packet).unwrap()).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    }
    // Out of the zone: needs the upstream, never answered from the cache.
    let out = query(9, "example.com.", RecordType::A, None);
    assert!(ask(&h, &out).is_none());
    assert!(ask(&h, &out).is_none());
    assert_eq!(h.zone.cache_stats().0, 1);
}

fn addresses(bytes: &[u8]) -> (bool, Vec<String>) {
    let m = Message::from_vec(bytes).unwrap();
    let ips = m
        .answers
        .iter()
        .map(|r| {
            assert_eq!(r.name.to_string(), "Web.default.svc.cluster.local.");
            r.data.to_string()
        })
        .collect();
    (m.metadata.truncation, ips)
}

#[test]
fn headless_hits_are_shuffled_afresh() {
    let h = handler(Some(&objects("10.96.0.5")));
    let all: HashSet<String> = (1..=100).map(|i| format!("10.244.1.{i}")).collect();
    let packet = query(
        5,
        "Web.default.svc.cluster.local.",
        RecordType::A,
        Some(4096),
    );
    let mut orders = HashSet::new();
    for _ in 0..20 {
        let (tc, ips) = addresses(&ask(&h, &packet).unwrap());
        assert!(!tc);
        assert_eq!(ips.len(), 100);
        assert_eq!(ips.iter().cloned().collect::<HashSet<_>>(), all);
        orders.insert(ips);
    }
    assert!(orders.len() > 15, "orders repeat: {}", orders.len());
    assert_eq!(h.zone.cache_stats().0, 1, "served from one entry");
    // The first two were fresh answers, the rest came from the cache: all shuffled alike.

    // Without EDNS only a few fit: each answer is a fresh random subset, truncated.
    let packet = query(5, "Web.default.svc.cluster.local.", RecordType::A, None);
    let mut seen = HashSet::new();
    let mut shown = None;
    for _ in 0..50 {
        let (tc, ips) = addresses(&ask(&h, &packet).unwrap());
        assert!(tc);
        let distinct: HashSet<_> = ips.iter().cloned().collect();
        assert_eq!(distinct.len(), ips.len(), "no address twice");
        assert!(distinct.is_subset(&all));
        assert_eq!(*shown.get_or_insert(ips.len()), ips.len());
        seen.extend(ips);
    }
    assert!(
        seen.len() > 3 * shown.unwrap(),
        "subsets vary: {}",
        seen.len()
    );
}

#[test]
fn questions_asked_once_are_not_kept() {
    let h = handler(Some(&objects("10.96.0.5")));
    for i in 0..1000 {
        let name = format!("miss-{i}.default.svc.cluster.local.");
        assert!(ask(&h, &query(1, &name, RecordType::A, None)).is_some());
    }
    assert_eq!(h.zone.cache_stats(), (0, 0));
}

/// Found by the fuzz target: a question name pointing into the header (offset 1, the ID). The
/// answer echoed the question bytes as received, so its pointer read the answer's own header
/// and the answer did not parse; now such questions get FORMERR without a question section, and
/// are never kept (two datagrams equal after the ID could ask different names).
#[test]
fn compressed_questions_get_formerr_and_are_not_kept() {
    let h = handler(Some(&objects("10.96.0.5")));
    // ID 0x12nn, opcode 6 with AA (the fuzzer's), or a standard query; name "5" + pointer to 1.
    for flags in [0x34, 0x01] {
        for id in [0x01, 0x02, 0x01, 0x02] {
            let packet = [
                0x12, id, flags, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'5', 0xc0, 0x01, 0, 1, 0, 1,
            ];
            assert!(!super::cache::plain_question(&packet));
            let bytes = ask(&h, &packet).unwrap();
            let m = Message::from_vec(&bytes).unwrap();
            assert_eq!(m.metadata.id, 0x1200 | u16::from(id));
            assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
            assert!(m.queries.is_empty());
        }
    }
    assert_eq!(h.zone.cache_stats().0, 0);
    assert!(super::cache::plain_question(&query(
        1,
        "a.b.",
        RecordType::A,
        Some(1232)
    )));
    assert!(super::cache::plain_question(&query(
        1,
        "a.b.",
        RecordType::A,
        None
    )));
}

#[test]
fn a_repeated_working_set_is_kept_whole() {
    // Asked in rounds (as a resolver's clients do), 10,000 questions all end up kept: two
    // questions sharing a doorkeeper slot must not keep evicting each other's first miss.
    let h = handler(Some(&objects("10.96.0.5")));
    let packets: Vec<Vec<u8>> = (0..10_000)
        .map(|i| {
            let name = format!("n-{i}.default.svc.cluster.local.");
            query(1, &name, RecordType::A, None)
        })
        .collect();
    for _ in 0..3 {
        for packet in &packets {
            ask(&h, packet).unwrap();
        }
    }
    let (kept, _) = h.zone.cache_stats();
    assert!(kept >= 9_950, "only {kept} of 10000 kept");
}

#[test]
fn the_generator_spreads_evenly() {
    // Each of 10 slots should come first about a tenth of the time.
    let mut rng = FastRng::seeded(42);
    let mut firsts = [0u32; 10];
    for _ in 0..20_000 {
        firsts[rng.below(10)] += 1;
    }
    for count in firsts {
        assert!((1700..2300).contains(&count), "{firsts:?}");
    }
}
