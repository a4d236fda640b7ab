//! The node-local cache's throughput against unbound configured as a forwarding cache (issue
//! 19): `cargo bench -p svcnet-dns --bench nodelocal` (needs `dnsperf` and `unbound`; skipped
//! with a note otherwise).
//!
//! Both sit in front of the same fake cluster DNS (1,000 service names, TTL 30, over TCP:
//! upstream's `force_tcp`, unbound's `forward-tcp-upstream`), with the same caps (30 s
//! positive, 5 s negative), one thread each on the machine's cores, and are warmed with one
//! pass over the names; then alternating rounds of `SVCNET_BENCH_SECS` (2) seconds measure
//! answers from the cache, asked by dnsperf (`-c 4 -q 64`) and then by the dns bench's batching
//! load generator (`support/loadgen.rs`: 4 sockets, 32 outstanding each, `sendmmsg`/`recvmmsg`),
//! with the same query file. `SVCNET_BENCH_ROUNDS` (3) rounds each; the median round is
//! compared. Clients run on core 0 and the caches on core 1, as in the dns bench
//! (`SVCNET_BENCH_PIN=0`: wherever the scheduler puts them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record};
use svcnet_dns::fake_upstream::FakeUpstream;
use svcnet_dns::nodelocal::{NodeLocalCache, NodeLocalConfig};

const NAMES: usize = 1000;

fn name(i: usize) -> String {
    format!("svc-{i}.ns-{}.svc.cluster.local.", i % 10)
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn unbound_conf(dir: &std::path::Path, port: u16, upstream: SocketAddr) -> String {
    let mut c = String::new();
    writeln!(
        c,
        "server:\n  interface: 127.0.0.1\n  port: {port}\n  do-daemonize: no\n  num-threads: 1\n  \
         username: \"\"\n  chroot: \"\"\n  directory: \"{}\"\n  pidfile: \"\"\n  use-syslog: no\n  \
         logfile: \"\"\n  verbosity: 0\n  access-control: 127.0.0.0/8 allow\n  do-ip6: no\n  \
         do-not-query-localhost: no\n  module-config: \"iterator\"\n  cache-max-ttl: 30\n  \
         cache-max-negative-ttl: 5\n  domain-insecure: \"cluster.local.\"\n\
         forward-zone:\n  name: \"cluster.local.\"\n  forward-addr: {}@{}\n  forward-tcp-upstream: yes\n\
         remote-control:\n  control-enable: no",
        dir.display(),
        upstream.ip(),
        upstream.port()
    )
    .unwrap();
    c
}

/// One client's round against a server: its answers per second.
type Ask<'a> = &'a dyn Fn(SocketAddr) -> Option<f64>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if support::loadgen::child_main() {
        return;
    }
    if Command::new("dnsperf").arg("-h").output().is_err()
        || Command::new("unbound").arg("-h").output().is_err()
    {
        println!("node-local bench skipped: apt-get install dnsperf unbound");
        return;
    }
    // The bench holds svcnet's cache: it runs on the servers' core.
    support::pin_self("node-local");
    let secs: u64 = std::env::var("SVCNET_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let rounds: usize = std::env::var("SVCNET_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let records: Vec<Record> = (0..NAMES)
        .map(|i| {
            Record::from_rdata(
                Name::from_ascii(name(i)).unwrap(),
                30,
                RData::A(A::new(10, 96, (i / 250) as u8, (i % 250) as u8 + 1)),
            )
        })
        .collect();
    let (fake, cache) = rt.block_on(async {
        let fake = FakeUpstream::start(records).await.unwrap();
        let cache = NodeLocalCache::start(NodeLocalConfig {
            listen: vec!["127.0.0.1".parse().unwrap()],
            port: 0,
            cluster_dns: fake.addr(),
            upstreams: vec![fake.addr()],
            cluster_domain: "cluster.local".into(),
            success_ttl: 30,
            denial_ttl: 5,
            timeout: Duration::from_secs(2),
            prefetch: None,
        })
        .await
        .unwrap();
        (fake, cache)
    });
    let ours = cache.local_addrs()[0];
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("unbound.conf");
    std::fs::write(&conf, unbound_conf(dir.path(), port, fake.addr())).unwrap();
    let mut unbound = support::on_core(support::SERVER_CORE, "unbound")
        .args(["-d", "-c"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let theirs: SocketAddr = ([127, 0, 0, 1], port).into();
    std::thread::sleep(Duration::from_millis(500));

    let input = dir.path().join("queries.txt");
    let mut text = String::new();
    for i in 0..NAMES {
        writeln!(text, "{} A", name(i)).unwrap();
    }
    std::fs::write(&input, text).unwrap();
    // Warm both caches: one pass over the names (1 s of dnsperf covers it many times over).
    for addr in [ours, theirs] {
        support::dnsperf(addr, &input, 1, false);
    }
    let dnsperf = |addr| support::dnsperf(addr, &input, secs, false).map(|d| d.qps);
    let batch =
        |addr| support::loadgen::run_child(addr, &input, secs).map(|o| o.answered as f64 / o.secs);
    let clients: [(&str, Ask<'_>); 2] = [("dnsperf", &dnsperf), ("batch", &batch)];
    for (client, ask) in clients {
        let asked_before = fake.queries();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            a.push(ask(ours).unwrap_or(0.0));
            b.push(ask(theirs).unwrap_or(0.0));
        }
        let asked = fake.queries() - asked_before;
        let fmt = |v: &[f64]| {
            v.iter()
                .map(|q| format!("{q:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "node-local client={client} rounds_qps svcnet=[{}] unbound=[{}]",
            fmt(&a),
            fmt(&b)
        );
        let (ma, mb) = (median(a), median(b));
        println!(
            "node-local client={client} median_qps svcnet={ma:.0} unbound={mb:.0} ratio={:.2} (cluster DNS asked {asked} times during the rounds)",
            ma / mb
        );
    }
    let _ = unbound.kill();
    let _ = unbound.wait();
    rt.block_on(cache.shutdown());
}
