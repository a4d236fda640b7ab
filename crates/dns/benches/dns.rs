//! Scenarios S6 and S7 of `shared/notes/performance.md`, side by side with unbound in one run:
//!
//! `cargo bench -p svcnet-dns --bench dns` (needs `dnsperf` and `unbound` from Debian; the
//! peer is skipped with a note when missing). Each scenario alternates three dnsperf rounds per
//! subject; `SVCNET_BENCH_SECS` sets a round's length (default 2), `SVCNET_BENCH_ROUNDS` the
//! rounds (default 3). Everything runs on 127.0.0.1.
//!
//! Two clients ask the questions, each in its own process: dnsperf (`client=dnsperf`), and
//! this bench's batching load generator (`client=batch`, `support/loadgen.rs`), which asks the
//! same questions from 4 sockets with 64 outstanding each using `sendmmsg`/`recvmmsg`, so the
//! server and not the client is the limit (one dnsperf thread stops near 150k questions/s on
//! these cores, and a server faster than that is measured at dnsperf's speed).
//! `SVCNET_BENCH_CLIENTS=dnsperf` or `=batch` runs one of them.
//!
//! The servers run on the second core and the clients on the first (`taskset`; this bench
//! starts itself again pinned, with svcnet's server inside): where the scheduler put the
//! client and the server, the same core or not, moved a round by up to 1.7x before.
//! `SVCNET_BENCH_PIN=0` leaves them to the scheduler; the competing process of the
//! contended rounds may always run on both.
//!
//! Loads 10,000 services in 100 namespaces (100 headless ones with 100 endpoints each, the rest
//! with 4 endpoints each: 49,600 endpoints), then measures zone rebuild time, query throughput
//! and latency for five query mixes against svcnet and unbound (same names as `local-data`, one
//! thread each), quiet and with a CPU-bound process competing for the cores
//! (`SVCNET_BENCH_CONTENDED=0` skips that half) with each server process's user and system CPU
//! time per answered query, the change→answer latency, and memory: resident
//! memory of the process holding the watch state and the zone as the watcher builds them (API
//! objects are made one at a time and dropped, as the watcher's relist does), and the heap bytes
//! that state and zone hold per service and per endpoint, counted by this bench's allocator.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use svcnet_dns::fixtures::*;
use svcnet_dns::zone::ZoneState;
use svcnet_dns::{DnsServer, Objects, Zone, ZoneConfig};

const NAMESPACES: usize = 100;
const PER_NAMESPACE: usize = 100;

/// The system allocator, counting the bytes live on the heap (for the per-service and
/// per-endpoint figures; RSS alone mixes in the allocator's free lists).
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is only
// arithmetic on the sizes the caller passes.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which we pass on.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

fn cluster_ip_of(ns: usize, svc: usize) -> String {
    let n = ns * PER_NAMESPACE + svc;
    format!("10.96.{}.{}", n / 250, 1 + n % 250)
}

/// Service `svc` of namespace `ns` and its one EndpointSlice (`with_endpoints`: 100 endpoints
/// for the headless `svc-0`, 4 for the others; otherwise none).
fn service_objects(
    ns: usize,
    svc: usize,
    with_endpoints: bool,
) -> (
    Arc<k8s_openapi::api::core::v1::Service>,
    Arc<k8s_openapi::api::discovery::v1::EndpointSlice>,
) {
    let nsn = format!("ns-{ns}");
    let name = format!("svc-{svc}");
    let ports = [("http", "TCP", 80)];
    let (service, eps) = if svc == 0 {
        (headless(&nsn, &name, &ports), 100)
    } else {
        (
            cluster_ip(&nsn, &name, &[&cluster_ip_of(ns, svc)], &ports),
            4,
        )
    };
    let mut s = slice(&nsn, &name, &format!("{name}-1"), &[("http", "TCP", 8080)]);
    for e in 0..if with_endpoints { eps } else { 0 } {
        let n = (ns * PER_NAMESPACE + svc) * 4 + e;
        s = s.ep(
            &format!("10.{}.{}.{}", 128 + n / 62500, (n / 250) % 250, 1 + n % 250),
            None,
            true,
        );
    }
    (service, s)
}

fn all_services() -> impl Iterator<Item = (usize, usize)> {
    (0..NAMESPACES).flat_map(|ns| (0..PER_NAMESPACE).map(move |svc| (ns, svc)))
}

fn objects() -> Objects {
    let mut o = Objects::default();
    for ns in 0..NAMESPACES {
        o.namespaces.push(namespace(&format!("ns-{ns}")));
    }
    for (ns, svc) in all_services() {
        let (service, slice) = service_objects(ns, svc, true);
        o.services.push(service);
        o.endpoint_slices.push(slice);
    }
    o
}

/// A watch state loaded as the watcher loads it: each relist's objects arrive one at a time and
/// only what the state keeps of them stays allocated.
fn load_state(config: &Arc<ZoneConfig>, with_endpoints: bool) -> ZoneState {
    let mut state = ZoneState::new(config.clone());
    state.replace_namespaces((0..NAMESPACES).map(|ns| namespace(&format!("ns-{ns}"))));
    state.replace_services(all_services().map(|(ns, svc)| service_objects(ns, svc, false).0));
    state
        .replace_slices(all_services().map(|(ns, svc)| service_objects(ns, svc, with_endpoints).1));
    state
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// The query mixes, each written to a dnsperf input file in `dir` line by line (the bench
/// holds none of them in memory): (scenario name, file).
fn scenarios(dir: &std::path::Path) -> Vec<(&'static str, std::path::PathBuf)> {
    use std::io::Write as _;
    let names = [
        "service-A",
        "headless-A-100",
        "SRV",
        "NXDOMAIN",
        "search-5-step",
        "NXDOMAIN-uncached",
    ];
    let mut files: Vec<_> = names
        .iter()
        .map(|n| {
            let path = dir.join(format!("{n}.txt"));
            let file = std::fs::File::create(&path).unwrap();
            (path, std::io::BufWriter::new(file))
        })
        .collect();
    let pick = |i: usize| (i * 7919 % NAMESPACES, 1 + i * 104729 % (PER_NAMESPACE - 1));
    for i in 0..1000 {
        let (ns, svc) = pick(i);
        let [a, headless, srv, nx, search, _] = &mut files[..] else {
            unreachable!()
        };
        writeln!(a.1, "svc-{svc}.ns-{ns}.svc.cluster.local A").unwrap();
        writeln!(srv.1, "_http._tcp.svc-{svc}.ns-{ns}.svc.cluster.local SRV").unwrap();
        writeln!(nx.1, "nosuch-{i}.ns-{ns}.svc.cluster.local A").unwrap();
        writeln!(headless.1, "svc-0.ns-{ns}.svc.cluster.local A").unwrap();
        // A pod in ns-{own} resolving "svc-{svc}.ns-{ns}" with ndots:5 and the cluster search
        // path: <name>.ns-own.svc.<zone>, <name>.svc.<zone> (hit)... and for an external
        // name the three cluster suffixes miss before the absolute name: here 4 misses + 1 hit.
        let own = (ns + 1) % NAMESPACES;
        let w = &mut search.1;
        writeln!(w, "svc-{svc}.ns-{ns}.ns-{own}.svc.cluster.local A").unwrap();
        writeln!(w, "svc-{svc}.ns-{ns}.svc.cluster.local A").unwrap();
        writeln!(w, "www.example-{i}.com.ns-{own}.svc.cluster.local A").unwrap();
        writeln!(w, "www.example-{i}.com.svc.cluster.local A").unwrap();
        writeln!(w, "www.example-{i}.com.cluster.local A").unwrap();
    }
    // Not one of S6's five: 400k distinct misses, more than a round sends, so almost every
    // question misses svcnet's answer cache (the general path, plus the cache's inserts and
    // resets); unbound answers them from its static local zone as always.
    for i in 0..400_000 {
        writeln!(
            files[5].1,
            "miss-{i}.ns-{}.svc.cluster.local A",
            i % NAMESPACES
        )
        .unwrap();
    }
    names
        .into_iter()
        .zip(files)
        .map(|(n, (path, mut w))| {
            w.flush().unwrap();
            (n, path)
        })
        .collect()
}

/// unbound's configuration, written line by line to `path`.
fn write_unbound_conf(path: &std::path::Path, dir: &std::path::Path, port: u16) {
    use std::io::Write as _;
    let mut c = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(c, "server:\n  interface: 127.0.0.1\n  port: {port}\n  do-daemonize: no\n  num-threads: 1\n  username: \"\"\n  chroot: \"\"\n  directory: \"{}\"\n  pidfile: \"\"\n  use-syslog: no\n  logfile: \"\"\n  verbosity: 0\n  access-control: 127.0.0.0/8 allow\n  do-ip6: no\n  local-zone: \"cluster.local.\" static\n  local-data: \"cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30\"", dir.display()).unwrap();
    for (ns, svc) in all_services() {
        let (svc, slice) = service_objects(ns, svc, true);
        let ns = svc.metadata.namespace.as_deref().unwrap();
        let name = svc.metadata.name.as_deref().unwrap();
        let fqdn = format!("{name}.{ns}.svc.cluster.local.");
        let ip = svc.spec.as_ref().unwrap().cluster_ip.as_deref().unwrap();
        if ip == "None" {
            for ep in &slice.endpoints {
                writeln!(c, "  local-data: \"{fqdn} 30 IN A {}\"", ep.addresses[0]).unwrap();
                writeln!(
                    c,
                    "  local-data: \"_http._tcp.{fqdn} 30 IN SRV 0 1 8080 {}.{fqdn}\"",
                    ep.addresses[0].replace('.', "-")
                )
                .unwrap();
            }
        } else {
            writeln!(c, "  local-data: \"{fqdn} 30 IN A {ip}\"").unwrap();
            writeln!(
                c,
                "  local-data: \"_http._tcp.{fqdn} 30 IN SRV 0 100 80 {fqdn}\""
            )
            .unwrap();
        }
    }
    writeln!(c, "remote-control:\n  control-enable: no").unwrap();
    c.flush().unwrap();
}

struct Perf {
    qps: f64,
    avg_ms: f64,
    stddev_ms: f64,
    lost: String,
    /// The server process's user and system CPU time per answered query, in µs.
    cpu_us: (f64, f64),
}

/// User and system CPU seconds that process `pid` used so far (`/proc/<pid>/stat`'s `utime`
/// and `stime`, in clock ticks of 1/100 s).
fn cpu_secs(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 2..)?
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok().map(|t| t / 100.0);
    Some((ticks(11)?, ticks(12)?))
}

/// One dnsperf round against `addr` (`-e`: EDNS0, as the load generator asks), and how many
/// questions it got answered.
fn dnsperf(addr: SocketAddr, input: &std::path::Path, secs: u64) -> Option<(Perf, f64)> {
    let d = support::dnsperf(addr, input, secs, true)?;
    let perf = Perf {
        cpu_us: (0.0, 0.0),
        qps: d.qps,
        avg_ms: d.avg_s * 1000.0,
        stddev_ms: d.stddev_s * 1000.0,
        lost: d.lost,
    };
    Some((perf, d.completed))
}

/// One round of the batching load generator against `addr`, and how many questions it got
/// answered.
fn batch_client(addr: SocketAddr, input: &std::path::Path, secs: u64) -> Option<(Perf, f64)> {
    let o = support::loadgen::run_child(addr, input, secs)?;
    let perf = Perf {
        cpu_us: (0.0, 0.0),
        qps: o.answered as f64 / o.secs,
        avg_ms: o.mean_us / 1000.0,
        stddev_ms: o.stddev_us / 1000.0,
        lost: format!(
            "{} p99_us={:.0} max_us={:.0} slow_10ms={}",
            o.lost, o.p99_us, o.max_us, o.slow
        ),
    };
    Some((perf, o.answered as f64))
}

/// Who asks the questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Dnsperf,
    Batch,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Dnsperf => "dnsperf",
            Client::Batch => "batch",
        }
    }

    /// `SVCNET_BENCH_CLIENTS` (`dnsperf`, `batch`, or both by default).
    fn chosen() -> Vec<Client> {
        let only = std::env::var("SVCNET_BENCH_CLIENTS").unwrap_or_default();
        [Client::Dnsperf, Client::Batch]
            .into_iter()
            .filter(|c| only.is_empty() || only.contains(c.name()))
            .collect()
    }

    /// One round against `addr`, served by process `pid`, with that process's CPU time per
    /// answered question.
    fn round(self, addr: SocketAddr, input: &std::path::Path, secs: u64, pid: u32) -> Option<Perf> {
        let before = cpu_secs(pid)?;
        let (mut perf, answered) = match self {
            Client::Dnsperf => dnsperf(addr, input, secs)?,
            Client::Batch => batch_client(addr, input, secs)?,
        };
        let after = cpu_secs(pid)?;
        let per_query = |after: f64, before: f64| (after - before) * 1e6 / answered.max(1.0);
        perf.cpu_us = (per_query(after.0, before.0), per_query(after.1, before.1));
        Some(perf)
    }
}

/// dnsperf rounds per subject and scenario (`SVCNET_BENCH_ROUNDS`, default 3).
fn rounds() -> usize {
    std::env::var("SVCNET_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

/// The round with the median throughput.
fn median(mut rounds: Vec<Perf>) -> Option<Perf> {
    rounds.sort_by(|a, b| a.qps.total_cmp(&b.qps));
    let mid = rounds.len() / 2;
    (!rounds.is_empty()).then(|| rounds.swap_remove(mid))
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn query_a(addr: SocketAddr, name: &Name) -> Option<String> {
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.ok()?;
    let mut m = Message::new(rand_id(), MessageType::Query, OpCode::Query);
    m.add_query(Query::query(name.clone(), RecordType::A));
    sock.send_to(&m.to_vec().ok()?, addr).await.ok()?;
    let mut buf = [0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(1), sock.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    let r = Message::from_vec(&buf[..n]).ok()?;
    r.answers.iter().find_map(|a| match &a.data {
        RData::A(ip) => Some(ip.to_string()),
        _ => None,
    })
}

fn rand_id() -> u16 {
    (Instant::now().elapsed().subsec_nanos() & 0xffff) as u16 ^ 0x5a5a
}

/// A CPU-bound process competing for the cores (this bench binary run with
/// `SVCNET_BENCH_HOG_SECS`, spinning until killed or for at most that long).
fn spawn_hog() -> Option<std::process::Child> {
    support::on_core("0,1", &support::this_bench())
        .env("SVCNET_BENCH_HOG_SECS", "900")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

fn hog(secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut x = 0u64;
    while Instant::now() < deadline {
        for _ in 0..1_000_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// Alternating rounds of `client` against both subjects on one query file; prints each round,
/// the medians and their ratio under `cores` (the machine's 1-minute load before and after).
fn compare(
    cores: &str,
    client: Client,
    name: &str,
    path: &std::path::Path,
    ours: SocketAddr,
    peer: Option<(SocketAddr, u32)>,
    secs: u64,
) {
    let label = format!("{cores} client={}", client.name());
    let load_before = loadavg();
    let mut mine_rounds = Vec::new();
    let mut their_rounds = Vec::new();
    for _ in 0..rounds() {
        mine_rounds.extend(client.round(ours, path, secs, std::process::id()));
        if let Some((peer, pid)) = peer {
            their_rounds.extend(client.round(peer, path, secs, pid));
        }
    }
    let list = |rounds: &[Perf]| {
        rounds
            .iter()
            .map(|r| format!("{:.0}", r.qps))
            .collect::<Vec<_>>()
            .join(",")
    };
    let load = format!("load={load_before}->{}", loadavg());
    println!(
        "S6 scenario={name} cores={label} {load} rounds_qps svcnet=[{}] unbound=[{}]",
        list(&mine_rounds),
        list(&their_rounds)
    );
    for (subject, rounds) in [("svcnet", &mine_rounds), ("unbound", &their_rounds)] {
        let mid = |f: fn(&Perf) -> f64| {
            let mut v: Vec<f64> = rounds.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        if !rounds.is_empty() {
            println!(
                "S6 scenario={name} cores={label} subject={subject} cpu_us_per_query_median user={:.2} sys={:.2} total={:.2}",
                mid(|r| r.cpu_us.0),
                mid(|r| r.cpu_us.1),
                mid(|r| r.cpu_us.0 + r.cpu_us.1),
            );
        }
    }
    let mine = median(mine_rounds);
    let theirs = median(their_rounds);
    if let Some(m) = &mine {
        println!(
            "S6 scenario={name} cores={label} subject=svcnet qps={:.0} avg_ms={:.3} stddev_ms={:.3} lost={}",
            m.qps, m.avg_ms, m.stddev_ms, m.lost
        );
    }
    if let Some(t) = &theirs {
        println!(
            "S6 scenario={name} cores={label} subject=unbound qps={:.0} avg_ms={:.3} stddev_ms={:.3} lost={}",
            t.qps, t.avg_ms, t.stddev_ms, t.lost
        );
    }
    if let (Some(m), Some(t)) = (&mine, &theirs) {
        println!(
            "S6 scenario={name} cores={label} {load} ratio_svcnet_over_unbound={:.2}",
            m.qps / t.qps
        );
    }
}

/// In-process cost of the UDP packet path (answer cache, parse, zone, encoder) per question:
/// one question repeated (answered from the cache), and distinct misses.
/// `SVCNET_BENCH_MICRO=N` runs only this, N times longer (for a profiler).
fn packet_path_micro(config: &Arc<ZoneConfig>, objects: &Objects) {
    let repeat: usize = std::env::var("SVCNET_BENCH_MICRO")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let query = |name: &str, qtype: RecordType| {
        let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        m.set_edns(hickory_proto::op::Edns::new());
        m.to_vec().unwrap()
    };
    let mut path = svcnet_dns::server::PacketPath::new(
        config.clone(),
        Zone::build(config.clone(), objects, 1),
    );
    let n = 200_000;
    let rounds = repeat;
    // `SVCNET_BENCH_SCENARIO` picks one (e.g. `uncached`), so a profiler counts it alone.
    let only = std::env::var("SVCNET_BENCH_SCENARIO").unwrap_or_default();
    for (label, packets) in [
        (
            "service-A-cached",
            vec![query("svc-7.ns-3.svc.cluster.local.", RecordType::A)],
        ),
        (
            "NXDOMAIN-uncached",
            (0..n)
                .map(|i| {
                    query(
                        &format!("miss-{i}.ns-{}.svc.cluster.local.", i % NAMESPACES),
                        RecordType::A,
                    )
                })
                .collect(),
        ),
    ] {
        if !label.contains(only.as_str()) {
            continue;
        }
        let t = Instant::now();
        let mut bytes = 0;
        for i in 0..n * rounds {
            bytes += path
                .udp_unchecked(&packets[i % packets.len()])
                .map_or(0, <[u8]>::len);
        }
        println!(
            "S6 micro scenario={label} packet_path_ns={:.0} bytes={}",
            t.elapsed().as_nanos() as f64 / (n * rounds) as f64,
            bytes / (n * rounds)
        );
    }
}

fn main() {
    if let Some(secs) = std::env::var("SVCNET_BENCH_HOG_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        hog(secs);
        return;
    }
    if support::loadgen::child_main() {
        return;
    }
    // The bench holds svcnet's server: it runs on the servers' core.
    support::pin_self("S6");
    if std::env::var("SVCNET_BENCH_MICRO").is_ok() {
        let config = Arc::new(ZoneConfig::new("cluster.local").unwrap());
        packet_path_micro(&config, &objects());
        return;
    }
    let secs: u64 = std::env::var("SVCNET_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let contended = std::env::var("SVCNET_BENCH_CONTENDED").as_deref() != Ok("0");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let config = Arc::new(ZoneConfig::new("cluster.local").unwrap());
    let services = NAMESPACES * PER_NAMESPACE;
    let endpoints = NAMESPACES * (100 + (PER_NAMESPACE - 1) * 4);

    // Memory first, before any other phase leaves freed memory in the allocator: the server,
    // then the watch state and its first snapshot, published.
    let server = rt
        .block_on(DnsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            config.clone(),
            vec![],
        ))
        .unwrap();
    let ours = server.local_addr();
    let rss_start = rss_mb();
    let heap_start = live_bytes();
    let mut state = load_state(&config, true);
    server.zone().publish(state.snapshot(1));
    let heap_loaded = live_bytes() - heap_start;
    let rss_loaded = rss_mb();

    let dir = tempfile::tempdir().unwrap();
    let have_dnsperf = Command::new("dnsperf")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let unbound_port = free_port();
    let mut unbound = if have_dnsperf {
        let conf = dir.path().join("unbound.conf");
        write_unbound_conf(&conf, dir.path(), unbound_port);
        support::on_core(support::SERVER_CORE, "unbound")
            .args(["-d", "-c", conf.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
    } else {
        None
    };
    let peer: SocketAddr = ([127, 0, 0, 1], unbound_port).into();
    if unbound.is_some() {
        // Wait for unbound to load its local data.
        let probe = Name::from_ascii("svc-1.ns-1.svc.cluster.local.").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while rt.block_on(query_a(peer, &probe)).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let peer = unbound.as_ref().map(|u| (peer, u.id()));

    if have_dnsperf {
        // `SVCNET_BENCH_SCENARIO=headless` runs only the scenarios whose name contains it.
        let only = std::env::var("SVCNET_BENCH_SCENARIO").unwrap_or_default();
        for (name, path) in scenarios(dir.path()) {
            if !name.contains(only.as_str()) {
                continue;
            }
            // Alternate short rounds so both subjects see the same machine load (other
            // builds share these two cores); each figure is the median round.
            for client in Client::chosen() {
                compare("quiet", client, name, &path, ours, peer, secs);
                if contended && let Some(mut hog) = spawn_hog() {
                    compare("contended", client, name, &path, ours, peer, secs);
                    let _ = hog.kill();
                    let _ = hog.wait();
                }
            }
        }
    } else {
        println!("S6 skipped: dnsperf not installed (apt-get install dnsperf unbound)");
    }
    if let Some(mut child) = unbound.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let rss_served = rss_mb();
    let (cached, cached_bytes) = server.zone().cache_stats();
    let formula = 49.0 + 0.86 * (services + endpoints) as f64 / 1024.0;
    println!(
        "S6 memory subject=svcnet rss_mb_before_load={rss_start:.1} rss_mb_loaded={rss_loaded:.1} rss_mb_after_queries={rss_served:.1} answer_cache_entries={cached} answer_cache_kb={} coredns_formula_mb={formula:.1} ratio_rss_after_queries_over_formula={:.2}",
        cached_bytes / 1024,
        rss_served / formula,
    );

    // Heap held per service and per endpoint: the same services without endpoints, then the
    // difference.
    let heap_before_bare = live_bytes();
    let mut bare = load_state(&config, false);
    let bare_zone = bare.snapshot(1);
    let heap_bare = live_bytes() - heap_before_bare;
    drop((bare, bare_zone));
    println!(
        "S6 memory subject=svcnet services={services} endpoints={endpoints} heap_mb_state_and_zone={:.1} bytes_per_service={:.0} bytes_per_endpoint={:.0}",
        heap_loaded as f64 / (1 << 20) as f64,
        heap_bare as f64 / services as f64,
        heap_loaded.saturating_sub(heap_bare) as f64 / endpoints as f64,
    );

    // S7: a Service change → its answer changes (incremental snapshot + publish + a UDP query).
    let name = Name::from_ascii("svc-5.ns-5.svc.cluster.local.").unwrap();
    let mut latencies = Vec::new();
    let mut builds = Vec::new();
    for round in 0..200u32 {
        let ip = format!("10.97.{}.{}", round / 200, 1 + round % 200);
        let changed = cluster_ip("ns-5", "svc-5", &[&ip], &[("http", "TCP", 80)]);
        let t = Instant::now();
        // As the watcher does: apply the event, take an incremental snapshot, publish.
        state.upsert_service(changed);
        let zone = state.snapshot(2);
        builds.push(t.elapsed());
        server.zone().publish(zone);
        loop {
            if rt.block_on(query_a(ours, &name)).as_deref() == Some(ip.as_str()) {
                break;
            }
        }
        latencies.push(t.elapsed());
    }
    latencies.sort();
    builds.sort();
    let pct = |v: &[Duration], p: f64| v[((v.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e3;
    println!(
        "S7 N={services} subject=svcnet incremental_rebuild_ms p50={:.1} p99={:.1}",
        pct(&builds, 0.5),
        pct(&builds, 0.99)
    );
    println!(
        "S7 N={services} subject=svcnet change_to_answer_ms p50={:.1} p99={:.1} max={:.1} samples={}",
        pct(&latencies, 0.5),
        pct(&latencies, 0.99),
        pct(&latencies, 1.0),
        latencies.len()
    );
    rt.block_on(server.shutdown()).unwrap();
    drop(state);

    // Zone rebuild time, from the objects as one relist.
    let objects = objects();
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let zone = Zone::build(config.clone(), &objects, 1);
        times.push(t.elapsed());
        assert_eq!(zone.service_count(), services);
    }
    times.sort();
    println!(
        "S7 N={services} endpoints={endpoints} subject=svcnet zone_rebuild_ms_median={:.1} min={:.1} max={:.1}",
        times[3].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[6].as_secs_f64() * 1e3
    );

    packet_path_micro(&config, &objects);

    // In-process cost of the pure lookup and of encoding its answer, per question.
    let zone = Zone::build(config.clone(), &objects, 1);
    let mut rng = rand::rng();
    for (label, qname) in [
        ("service-A", "svc-7.ns-3.svc.cluster.local."),
        ("headless-A-100", "svc-0.ns-3.svc.cluster.local."),
        ("NXDOMAIN", "nosuch.ns-3.svc.cluster.local."),
    ] {
        let name = Name::from_ascii(qname).unwrap();
        let n = 20_000;
        let t = Instant::now();
        let mut answers = 0;
        for _ in 0..n {
            if let svcnet_dns::Outcome::Answer(r) = zone.lookup(
                &name,
                RecordType::A,
                hickory_proto::rr::DNSClass::IN,
                &mut rng,
            ) {
                answers += r.answers.len() + r.addresses.as_ref().map_or(0, |a| a.ips.len());
            }
        }
        let lookup_ns = t.elapsed().as_nanos() as f64 / n as f64;
        let svcnet_dns::Outcome::Answer(r) = zone.lookup(
            &name,
            RecordType::A,
            hickory_proto::rr::DNSClass::IN,
            &mut rng,
        ) else {
            unreachable!()
        };
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        m.add_query(Query::query(name.clone(), RecordType::A));
        m.add_answers(r.answer_records());
        m.add_authorities(r.authorities.clone());
        let t = Instant::now();
        let mut bytes = 0;
        for _ in 0..n {
            bytes += m.to_vec().unwrap().len();
        }
        let encode_ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!(
            "S6 micro scenario={label} lookup_ns={lookup_ns:.0} hickory_encode_ns={encode_ns:.0} answers={} bytes={}",
            answers / n,
            bytes / n
        );
    }
}
