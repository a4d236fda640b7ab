//! The node-local cache against the fake upstream on loopback: TTL caps (positive and
//! negative), force_tcp for the cluster zone, UDP for the rest, and the metrics that count it.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;

use super::{NodeLocalCache, NodeLocalConfig};
use crate::fake_upstream::FakeUpstream;
use crate::server::Prefetch;

fn n(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

async fn ask(addr: SocketAddr, name: &str) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut query = Message::new(7, MessageType::Query, OpCode::Query);
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(n(name), RecordType::A));
    socket
        .send_to(&query.to_vec().unwrap(), addr)
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let (len, _) = tokio::time::timeout(Duration::from_secs(3), socket.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let reply = Message::from_vec(&buf[..len]).unwrap();
    assert_eq!(reply.metadata.id, 7);
    reply
}

async fn start(fake: &FakeUpstream, success_ttl: u32, denial_ttl: u32) -> NodeLocalCache {
    start_with(fake, success_ttl, denial_ttl, None).await
}

async fn start_with(
    fake: &FakeUpstream,
    success_ttl: u32,
    denial_ttl: u32,
    prefetch: Option<Prefetch>,
) -> NodeLocalCache {
    NodeLocalCache::start(NodeLocalConfig {
        listen: vec!["127.0.0.1".parse().unwrap()],
        port: 0,
        cluster_dns: fake.addr(),
        upstreams: vec![fake.addr()],
        cluster_domain: "cluster.local".into(),
        success_ttl,
        denial_ttl,
        timeout: Duration::from_secs(2),
        prefetch,
    })
    .await
    .unwrap()
}

/// The cache's metrics hold every one of `lines`, and say that `forwarded` cluster questions
/// went to `fake` over TCP.
fn assert_metrics(cache: &NodeLocalCache, fake: &FakeUpstream, lines: &[&str], forwarded: usize) {
    let metrics = cache.observer().metrics_text();
    for line in lines {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
    let forwarded = format!(
        "coredns_forward_requests_total{{zone=\"cluster.local.\",to=\"{} (tcp)\"}} {forwarded}",
        fake.addr()
    );
    assert!(metrics.contains(&forwarded), "{metrics}");
}

#[tokio::test]
async fn caps_ttls_and_forces_tcp_for_the_cluster_zone() {
    let fake = FakeUpstream::start(vec![
        Record::from_rdata(
            n("web.default.svc.cluster.local."),
            30,
            RData::A(A::new(10, 96, 0, 20)),
        ),
        Record::from_rdata(n("example.org."), 120, RData::A(A::new(192, 0, 2, 80))),
    ])
    .await
    .unwrap();
    let cache = start(&fake, 2, 1).await;
    let addr = cache.local_addrs()[0];

    // A cluster name: asked over TCP, the record's 30 s capped to 2 s.
    let first = ask(addr, "web.default.svc.cluster.local.").await;
    assert_eq!(first.metadata.response_code, ResponseCode::NoError);
    assert_eq!(first.answers.len(), 1);
    assert!(first.answers[0].ttl <= 2, "{:?}", first.answers[0]);
    assert_eq!((fake.queries(), fake.tcp_queries()), (1, 1));
    // The same question again: from the cache, the fake is not asked.
    let second = ask(addr, "web.default.svc.cluster.local.").await;
    assert_eq!(second.answers, first.answers);
    assert_eq!(fake.queries(), 1);

    // A missing cluster name: NXDOMAIN kept for the 1 s denial cap (the SOA says 5 s).
    let nx = ask(addr, "gone.default.svc.cluster.local.").await;
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    assert!(nx.authorities.iter().all(|r| r.ttl <= 1), "{nx:?}");
    ask(addr, "gone.default.svc.cluster.local.").await;
    assert_eq!((fake.queries(), fake.tcp_queries()), (2, 2));

    // Outside the cluster: UDP to the upstream, capped at 30 s (the record says 120 s).
    let external = ask(addr, "example.org.").await;
    assert_eq!(external.answers.len(), 1);
    assert!(external.answers[0].ttl <= 30);
    assert_eq!((fake.queries(), fake.tcp_queries()), (3, 2));

    // Past the denial cap the NXDOMAIN is asked again; the positive answer is still kept.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ask(addr, "gone.default.svc.cluster.local.").await;
    ask(addr, "web.default.svc.cluster.local.").await;
    assert_eq!(fake.queries(), 4);
    // Past the success cap the positive answer is asked again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    ask(addr, "web.default.svc.cluster.local.").await;
    assert_eq!((fake.queries(), fake.tcp_queries()), (5, 4));

    assert_metrics(
        &cache,
        &fake,
        &[
            "coredns_dns_requests_total{proto=\"udp\"} 8",
            "coredns_cache_hits_total{zone=\"cluster.local.\",type=\"success\"} 2",
            "coredns_cache_hits_total{zone=\"cluster.local.\",type=\"denial\"} 1",
            "coredns_cache_misses_total{zone=\"cluster.local.\"} 4",
            "coredns_cache_misses_total{zone=\".\"} 1",
        ],
        4,
    );
    cache.shutdown().await;
}

#[tokio::test]
async fn reverse_names_go_to_the_cluster_dns_over_tcp() {
    let fake = FakeUpstream::start(vec![]).await.unwrap();
    let cache = start(&fake, 30, 5).await;
    let addr = cache.local_addrs()[0];
    let reply = ask(addr, "10.0.96.10.in-addr.arpa.").await;
    assert_eq!(reply.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!((fake.queries(), fake.tcp_queries()), (1, 1));
    cache.shutdown().await;
}

#[tokio::test]
async fn no_cluster_dns_is_servfail() {
    // A closed port: the cluster DNS is down, the client gets SERVFAIL quickly and nothing
    // is cached.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let cache = NodeLocalCache::start(NodeLocalConfig {
        listen: vec!["127.0.0.1".parse().unwrap()],
        port: 0,
        cluster_dns: addr,
        upstreams: vec![],
        cluster_domain: "cluster.local".into(),
        success_ttl: 30,
        denial_ttl: 5,
        timeout: Duration::from_millis(500),
        prefetch: None,
    })
    .await
    .unwrap();
    let local = cache.local_addrs()[0];
    let reply = ask(local, "web.default.svc.cluster.local.").await;
    assert_eq!(reply.metadata.response_code, ResponseCode::ServFail);
    let reply = ask(local, "example.org.").await;
    assert_eq!(reply.metadata.response_code, ResponseCode::Refused);
    cache.shutdown().await;
}

/// Repeated UDP questions are answered from the kept bytes (`replay`): each with its own ID,
/// TTLs counting down as the forwarder's cache counts them, every one counted as a hit, and
/// none reaching the cluster DNS until the answer expires.
#[tokio::test]
async fn repeated_questions_are_replayed_with_their_own_ids_and_ttls() {
    let fake = FakeUpstream::start(vec![Record::from_rdata(
        n("web.default.svc.cluster.local."),
        30,
        RData::A(A::new(10, 96, 0, 20)),
    )])
    .await
    .unwrap();
    let cache = start(&fake, 2, 1).await;
    let addr = cache.local_addrs()[0];
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let ask_as = |id: u16| {
        let mut query = Message::new(id, MessageType::Query, OpCode::Query);
        query.add_query(Query::query(
            n("web.default.svc.cluster.local."),
            RecordType::A,
        ));
        query.to_vec().unwrap()
    };
    let mut buf = vec![0u8; 4096];
    let mut answers = Vec::new();
    for id in 1..=6u16 {
        socket.send_to(&ask_as(id), addr).await.unwrap();
        let (len, _) = tokio::time::timeout(Duration::from_secs(3), socket.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let reply = Message::from_vec(&buf[..len]).unwrap();
        assert_eq!(reply.metadata.id, id);
        assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
        answers.push(reply.answers);
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    assert_eq!(answers[0][0].ttl, 2, "capped at the 2 s success cap");
    assert_eq!(fake.queries(), 1, "one miss, then the cache");
    let metrics = cache.observer().metrics_text();
    let hits = "coredns_cache_hits_total{zone=\"cluster.local.\",type=\"success\"} 5";
    assert!(metrics.contains(hits), "{metrics}");
    // A second later the TTL is one lower; past the cap the cluster DNS is asked again.
    tokio::time::sleep(Duration::from_millis(1050)).await;
    socket.send_to(&ask_as(7), addr).await.unwrap();
    let (len, _) = socket.recv_from(&mut buf).await.unwrap();
    let reply = Message::from_vec(&buf[..len]).unwrap();
    assert_eq!(reply.answers[0].ttl, 1);
    assert_eq!(fake.queries(), 1);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    socket.send_to(&ask_as(8), addr).await.unwrap();
    let (len, _) = socket.recv_from(&mut buf).await.unwrap();
    let reply = Message::from_vec(&buf[..len]).unwrap();
    assert_eq!(reply.metadata.id, 8);
    assert_eq!(fake.queries(), 2, "expired: asked again");
    cache.shutdown().await;
}

/// With prefetch on (`prefetch 2 1m 50%`, positive answers kept 3 s): a name asked for twice
/// in a row from the cache is asked again upstream once at most half its TTL is left, while
/// that question is still answered from the cache, and after the first answer's TTL has run
/// out it is answered from the fresh one without a miss; the fresh entry keeps the count, so
/// it is prefetched again near its own end. A name asked for only once is not prefetched and
/// is a miss again when it expires.
#[tokio::test]
async fn a_popular_answer_is_asked_again_before_it_expires() {
    let a =
        |name: &str, last: u8| Record::from_rdata(n(name), 30, RData::A(A::new(10, 96, 0, last)));
    let (web, db) = (
        "web.default.svc.cluster.local.",
        "db.default.svc.cluster.local.",
    );
    let fake = FakeUpstream::start(vec![a(web, 20), a(db, 30)])
        .await
        .unwrap();
    let prefetch = Prefetch {
        amount: 2,
        duration: Duration::from_secs(60),
        percentage: 50,
    };
    let cache = start_with(&fake, 3, 1, Some(prefetch)).await;
    let addr = cache.local_addrs()[0];
    let ip = |m: &Message| match &m.answers[0].data {
        RData::A(a) => a.0.octets()[3],
        other => panic!("not an A record: {other:?}"),
    };

    // web: a miss, then two hits (the first from the forwarder's cache, the second replayed),
    // with 3 s left: not due yet (2 s or less is). db: only the miss.
    assert_eq!(ip(&ask(addr, web).await), 20);
    assert_eq!(ip(&ask(addr, db).await), 30);
    assert_eq!(ip(&ask(addr, web).await), 20);
    assert_eq!(ip(&ask(addr, web).await), 20);
    assert_eq!(fake.queries(), 2);
    fake.set_records(vec![a(web, 21), a(db, 31)]);

    // A second on, 2 s left: this hit makes web due. It is answered from the cache (the old
    // address) and the cluster DNS is asked again meanwhile. db, asked once more, is a hit but
    // has been asked for only once in a row before it.
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let due = ask(addr, web).await;
    // The old answer, counted down (2 s left, 1 if this machine stalled a second).
    assert_eq!(ip(&due), 20);
    assert!(due.answers[0].ttl <= 2, "{:?}", due.answers[0]);
    assert_eq!(ip(&ask(addr, db).await), 30);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while fake.queries() < 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.queries(), 3, "web prefetched, db not");
    // More hits before the old answer expires do not start another prefetch.
    ask(addr, web).await;

    // Past the first answers' 3 s: web comes from the prefetched entry with no miss; db's
    // entry expired and is asked again (misses: web once, db twice).
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(ip(&ask(addr, web).await), 21);
    assert_eq!(ip(&ask(addr, db).await), 31);
    // The fresh web entry (kept at about 1 s, 3 s long) kept web's hits: this hit, with 1 s of
    // it left, makes it due again.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while fake.queries() < 5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.queries(), 5, "web prefetched twice, db asked twice");

    assert_metrics(
        &cache,
        &fake,
        &[
            "coredns_cache_prefetch_total{zone=\"cluster.local.\"} 2",
            "coredns_cache_misses_total{zone=\"cluster.local.\"} 3",
            "coredns_cache_hits_total{zone=\"cluster.local.\",type=\"success\"} 6",
        ],
        5,
    );
    cache.shutdown().await;
}
