//! Black-box conformance: the real server on a loopback port, fed a static snapshot, driven by
//! `dig` over UDP and TCP. ExternalName targets resolve through a fake upstream on another
//! loopback port; nothing leaves the machine.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use expect_test::{Expect, expect};
use hickory_proto::rr::rdata::{A, CNAME};
use hickory_proto::rr::{Name, RData, Record};
use svcnet_dns::fake_upstream::FakeUpstream;
use svcnet_dns::fixtures::*;
use svcnet_dns::{DnsServer, Objects, Zone, ZoneConfig};

fn seed_world() -> Objects {
    let mut big = slice("default", "big", "big-1", &[("http", "TCP", 80)]);
    for i in 0..200u32 {
        big = big.ep(
            &format!("10.244.{}.{}", 100 + i / 250, 1 + i % 250),
            None,
            true,
        );
    }
    Objects {
        services: vec![
            cluster_ip(
                "default",
                "kubernetes",
                &["10.96.0.1"],
                &[("https", "TCP", 443)],
            ),
            cluster_ip(
                "default",
                "myapp",
                &["10.96.221.214"],
                &[("http", "TCP", 80)],
            ),
            headless("default", "myapp-headless", &[("", "TCP", 80)]),
            headless("default", "nginx", &[("web", "TCP", 80)]),
            headless("default", "big", &[("http", "TCP", 80)]),
            external("default", "my-service-1", "www.baidu.com"),
            external("default", "nowhere", "missing.example.org"),
            cluster_ip(
                "kube-system",
                "kube-dns",
                &["10.96.0.10"],
                &[("dns", "UDP", 53), ("dns-tcp", "TCP", 53)],
            ),
        ],
        endpoint_slices: vec![
            slice("default", "myapp", "myapp-1", &[("http", "TCP", 80)])
                .ep("172.18.236.167", None, true)
                .ep("172.18.236.168", None, true)
                .ep("172.18.235.168", None, true),
            slice("default", "myapp-headless", "mh-1", &[("", "TCP", 80)])
                .ep("172.18.236.167", None, true)
                .ep("172.18.236.168", None, true)
                .ep("172.18.235.168", None, true),
            slice("default", "nginx", "nginx-1", &[("web", "TCP", 80)])
                .ep("10.244.1.10", Some("web-0"), true)
                .ep("10.244.1.11", Some("web-1"), true),
            big,
        ],
        pods: vec![],
        namespaces: vec![namespace("default"), namespace("kube-system")],
    }
}

fn upstream_records() -> Vec<Record> {
    let n = |s: &str| Name::from_ascii(s).unwrap();
    vec![
        Record::from_rdata(
            n("www.baidu.com."),
            60,
            RData::CNAME(CNAME(n("www.a.shifen.com."))),
        ),
        Record::from_rdata(
            n("www.a.shifen.com."),
            60,
            RData::A(A::new(163, 177, 151, 110)),
        ),
        Record::from_rdata(
            n("www.a.shifen.com."),
            60,
            RData::A(A::new(163, 177, 151, 109)),
        ),
        Record::from_rdata(n("example.org."), 120, RData::A(A::new(192, 0, 2, 80))),
    ]
}

struct Fixture {
    server: DnsServer,
    upstream: FakeUpstream,
}

async fn start(synced: bool) -> Fixture {
    let upstream = FakeUpstream::start(upstream_records()).await.unwrap();
    let config = Arc::new(ZoneConfig::new("cluster.local").unwrap());
    let server = DnsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        config.clone(),
        vec![upstream.addr()],
    )
    .await
    .unwrap();
    if synced {
        server
            .zone()
            .publish(Zone::build(config, &seed_world(), 1700000000));
    }
    Fixture { server, upstream }
}

/// `dig` one question; returns the status, flags and sorted sections as text.
async fn dig(addr: SocketAddr, query: &str, extra: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new("dig");
    cmd.arg(format!("@{}", addr.ip()))
        .args(["-p", &addr.port().to_string()])
        .args(query.split_whitespace())
        .args([
            "+noall",
            "+comments",
            "+answer",
            "+authority",
            "+additional",
        ])
        .args(["+tries=1", "+time=3", "+nocookie"])
        .args(extra);
    let out = cmd
        .output()
        .await
        .expect("dig must be installed (bind9-dnsutils)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    normalize(&text)
}

fn normalize(text: &str) -> String {
    let mut status = String::from("?");
    let mut flags = String::new();
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            status = rest.split(',').next().unwrap_or("").to_string();
        } else if let Some(rest) = line.strip_prefix(";; flags: ") {
            flags = rest.split(';').next().unwrap_or("").to_string();
        } else if let Some(title) = line
            .strip_prefix(";; ")
            .and_then(|l| l.strip_suffix(" SECTION:"))
        {
            sections.push((title.to_lowercase(), Vec::new()));
        } else if !line.starts_with(';')
            && !line.trim().is_empty()
            && let Some((_, lines)) = sections.last_mut()
        {
            lines.push(line.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    let mut out = format!("{status} flags: {flags}\n");
    for (title, mut lines) in sections {
        lines.sort();
        out.push_str(&format!("{title}:\n"));
        for l in lines {
            out.push_str(&format!("  {l}\n"));
        }
    }
    out
}

/// The same answer over UDP and TCP, checked against `expect`.
async fn check(f: &Fixture, query: &str, expect: Expect) {
    let udp = dig(f.server.local_addr(), query, &["+notcp"]).await;
    let tcp = dig(f.server.local_addr(), query, &["+tcp"]).await;
    assert_eq!(udp, tcp, "UDP and TCP differ for {query}");
    expect.assert_eq(&udp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_cases_over_udp_and_tcp() {
    let f = start(true).await;
    check(
        &f,
        "myapp.default.svc.cluster.local A",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            answer:
              myapp.default.svc.cluster.local. 30 IN A 10.96.221.214
        "#]],
    )
    .await;
    check(
        &f,
        "myapp-headless.default.svc.cluster.local A",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            answer:
              myapp-headless.default.svc.cluster.local. 30 IN A 172.18.235.168
              myapp-headless.default.svc.cluster.local. 30 IN A 172.18.236.167
              myapp-headless.default.svc.cluster.local. 30 IN A 172.18.236.168
        "#]],
    )
    .await;
    check(
        &f,
        "web-0.nginx.default.svc.cluster.local A",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            answer:
              web-0.nginx.default.svc.cluster.local. 30 IN A 10.244.1.10
        "#]],
    )
    .await;
    check(
        &f,
        "_web._tcp.nginx.default.svc.cluster.local SRV",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            answer:
              _web._tcp.nginx.default.svc.cluster.local. 30 IN SRV 0 50 80 web-0.nginx.default.svc.cluster.local.
              _web._tcp.nginx.default.svc.cluster.local. 30 IN SRV 0 50 80 web-1.nginx.default.svc.cluster.local.
            additional:
              web-0.nginx.default.svc.cluster.local. 30 IN A 10.244.1.10
              web-1.nginx.default.svc.cluster.local. 30 IN A 10.244.1.11
        "#]],
    )
    .await;
    check(
        &f,
        "-x 10.96.221.214",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            answer:
              214.221.96.10.in-addr.arpa. 30 IN PTR myapp.default.svc.cluster.local.
        "#]],
    )
    .await;
    // ExternalName: the CNAME from the zone, then the fake upstream's chain, in one answer.
    check(
        &f,
        "my-service-1.default.svc.cluster.local A",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            answer:
              my-service-1.default.svc.cluster.local. 30 IN CNAME www.baidu.com.
              www.a.shifen.com. 60 IN A 163.177.151.109
              www.a.shifen.com. 60 IN A 163.177.151.110
              www.baidu.com. 60 IN CNAME www.a.shifen.com.
        "#]],
    )
    .await;
    check(
        &f,
        "nowhere.default.svc.cluster.local A",
        expect![[r#"
            NXDOMAIN flags: qr aa rd ra
            answer:
              nowhere.default.svc.cluster.local. 30 IN CNAME missing.example.org.
            authority:
              . 5 IN SOA . . 1 3600 600 86400 5
        "#]],
    )
    .await;
    check(
        &f,
        "dns-version.cluster.local TXT",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            answer:
              dns-version.cluster.local. 28800 IN TXT "1.1.0"
        "#]],
    )
    .await;
    // NXDOMAIN and NODATA carry the SOA.
    check(
        &f,
        "nothing.default.svc.cluster.local A",
        expect![[r#"
            NXDOMAIN flags: qr aa rd ra
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    )
    .await;
    check(
        &f,
        "myapp.default.svc.cluster.local AAAA",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            authority:
              cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1700000000 7200 1800 86400 30
        "#]],
    )
    .await;
    // Case is kept.
    check(
        &f,
        "MyApp.Default.Svc.Cluster.Local A",
        expect![[r#"
            NOERROR flags: qr aa rd ra
            answer:
              MyApp.Default.Svc.Cluster.Local. 30 IN A 10.96.221.214
        "#]],
    )
    .await;
    // Out of zone: forwarded, not authoritative.
    check(
        &f,
        "example.org A",
        expect![[r#"
            NOERROR flags: qr rd ra
            answer:
              example.org. 120 IN A 192.0.2.80
        "#]],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servfail_until_synced_then_answers() {
    let f = start(false).await;
    let before = dig(
        f.server.local_addr(),
        "myapp.default.svc.cluster.local A",
        &[],
    )
    .await;
    // As CoreDNS before its first sync: authoritative, with the zone's SOA (serial 0).
    expect![[r#"
        SERVFAIL flags: qr aa rd ra
        authority:
          cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 0 7200 1800 86400 30
    "#]]
    .assert_eq(&before);
    let reverse = dig(f.server.local_addr(), "-x 10.96.0.99", &["+tcp"]).await;
    expect![[r#"
        SERVFAIL flags: qr aa rd ra
        authority:
          96.10.in-addr.arpa. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 0 7200 1800 86400 30
    "#]]
    .assert_eq(&reverse);
    // Outside the zone still works before sync.
    let outside = dig(f.server.local_addr(), "example.org A", &[]).await;
    assert!(outside.starts_with("NOERROR"), "{outside}");
    let config = Arc::new(ZoneConfig::new("cluster.local").unwrap());
    f.server
        .zone()
        .publish(Zone::build(config, &seed_world(), 1));
    let after = dig(
        f.server.local_addr(),
        "myapp.default.svc.cluster.local A",
        &[],
    )
    .await;
    assert!(after.contains("10.96.221.214"), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_headless_truncates_over_udp_and_is_whole_over_tcp() {
    let f = start(true).await;
    let addr = f.server.local_addr();
    let q = "big.default.svc.cluster.local A";
    let udp = dig(addr, q, &["+notcp", "+ignore", "+bufsize=1232"]).await;
    assert!(udp.lines().next().unwrap().contains(" tc "), "{udp}");
    let plain = dig(addr, q, &["+notcp", "+ignore", "+noedns"]).await;
    assert!(plain.lines().next().unwrap().contains(" tc "), "{plain}");
    let tcp = dig(addr, q, &["+tcp"]).await;
    assert_eq!(
        tcp.lines().filter(|l| l.contains(" IN A ")).count(),
        200,
        "{tcp}"
    );
    // dig's default (retry over TCP on TC) gets the whole answer too.
    let retried = dig(addr, q, &[]).await;
    assert_eq!(
        retried.lines().filter(|l| l.contains(" IN A ")).count(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_answers_are_cached() {
    let f = start(true).await;
    let addr = f.server.local_addr();
    let first = dig(addr, "example.org A", &[]).await;
    let seen = f.upstream.queries();
    let second = dig(addr, "example.org A", &[]).await;
    assert_eq!(
        f.upstream.queries(),
        seen,
        "the second question must come from the cache"
    );
    assert!(first.contains("192.0.2.80") && second.contains("192.0.2.80"));
    // Negative answers are cached as well (SOA minimum 5 s).
    dig(addr, "missing.example.org A", &[]).await;
    let seen = f.upstream.queries();
    let again = dig(addr, "missing.example.org A", &[]).await;
    assert_eq!(f.upstream.queries(), seen);
    assert!(again.starts_with("NXDOMAIN"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_packets_do_not_stop_the_server() {
    let f = start(true).await;
    let addr = f.server.local_addr();
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut packets: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x12],
        vec![0u8; 11],
        // Header claiming 65535 questions and answers, no body.
        vec![0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0],
        // One question whose name is a compression pointer to itself.
        vec![0, 2, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1],
        // A label running past the end.
        vec![0, 3, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 63, b'a', b'b'],
    ];
    let mut seed: u64 = 0x5eed;
    for len in [12usize, 17, 40, 100, 300, 512, 1500] {
        let mut p = Vec::with_capacity(len);
        for _ in 0..len {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            p.push((seed >> 33) as u8);
        }
        packets.push(p);
    }
    for p in &packets {
        sock.send_to(p, addr).await.unwrap();
    }
    // A malformed question with a readable header gets FORMERR.
    let mut buf = [0u8; 512];
    sock.send_to(
        &[0, 9, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1],
        addr,
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut saw_formerr = false;
    while let Ok(Ok((n, _))) = tokio::time::timeout_at(deadline, sock.recv_from(&mut buf)).await {
        if n >= 4 && buf[0..2] == [0, 9] {
            saw_formerr = buf[3] & 0x0f == 1;
            break;
        }
    }
    assert!(saw_formerr, "no FORMERR for a compression loop");
    // Garbage over TCP, too.
    {
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = tcp.write_all(&[0, 40, 1, 2, 3, 4, 5]).await;
        let _ = tcp.write_all(&[0xff; 64]).await;
    }
    let answer = dig(addr, "myapp.default.svc.cluster.local A", &[]).await;
    assert!(answer.contains("10.96.221.214"), "{answer}");
    let tcp = dig(addr, "myapp.default.svc.cluster.local A", &["+tcp"]).await;
    assert!(tcp.contains("10.96.221.214"), "{tcp}");
    // The UDP ledger: the three datagrams shorter than a header were dropped, everything
    // received was either answered or dropped.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut st = f.server.udp_stats();
    while st.answered + st.dropped < st.received && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        st = f.server.udp_stats();
    }
    assert!(
        st.dropped >= 3
            && st.answered >= 2
            && st.received == st.answered + st.dropped
            && st.send_failed == 0,
        "{st:?}"
    );
}

/// Five questions to `f`'s server one at a time, each answered before the next leaves, and
/// then none: no answer comes twice or late. Returns the server's UDP ledger.
async fn lone_questions(f: &Fixture) -> svcnet_dns::server::UdpStats {
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut question = vec![0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in "myapp.default.svc.cluster.local".split('.') {
        question.push(label.len() as u8);
        question.extend_from_slice(label.as_bytes());
    }
    question.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut buf = [0u8; 512];
    for id in 1..=5u8 {
        question[1] = id;
        sock.send_to(&question, f.server.local_addr())
            .await
            .unwrap();
        let n = tokio::time::timeout(Duration::from_secs(3), sock.recv(&mut buf))
            .await
            .expect("an answer within 3 s")
            .unwrap();
        assert_eq!(&buf[..2], &[0, id], "the answer to question {id}");
        assert!(
            n > question.len(),
            "an answer with records: {:?}",
            &buf[..n]
        );
    }
    let extra = tokio::time::timeout(Duration::from_millis(200), sock.recv(&mut buf)).await;
    assert!(extra.is_err(), "an answer nobody asked for: {extra:?}");
    let st = f.server.udp_stats();
    assert_eq!((st.received, st.answered), (5, 5), "{st:?}");
    st
}

#[tokio::test]
async fn a_lone_question_costs_one_receive_call() {
    // One runtime worker, so one receive loop: each wake-up finds one datagram, and the short
    // batch tells the loop the socket is empty, so it waits again without a `recvmmsg` that
    // finds nothing.
    let st = lone_questions(&start(true).await).await;
    assert_eq!(st.receive_calls, st.received, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receive_loops_answer_each_question_once() {
    // Two workers, two loops on the socket: both wake for a datagram, one takes it, and the
    // other must not answer its own previous batch again.
    for _ in 0..10 {
        lone_questions(&start(true).await).await;
    }
}
