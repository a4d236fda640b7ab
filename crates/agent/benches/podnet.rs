//! S11: cross-node pod-to-pod traffic, host-gw against flannel's VXLAN and UDP backends and
//! Calico's BGP (routes learnt by a BIRD per node), in alternating rounds on the same kind of
//! topology (two node namespaces on their own bridge, one pod each, made by the agent's topology
//! and CNI plugin), printed side by side as ratios to host-gw. Per round: TCP throughput of one
//! stream and of 4 streams at once, TCP request/response latency with 64-byte messages on one
//! connection (p50/p99), UDP request/response latency (p50/p99, and the requests lost), and CPU
//! seconds per GB of the one-stream transfer, for UDP against VXLAN (this process's CPU from
//! `/proc/self/stat`: the transfer's sender and receiver threads, whose system time holds the
//! kernel's encapsulation, plus for UDP the encapsulation loop's threads, also shown alone).
//! The request/response figures come twice: plain (blocking sockets: on an idle VM each round
//! trip also wakes halted vCPUs, which can dwarf the path) and busy-polling (both ends spin on
//! non-blocking sockets, as netperf's busy-poll mode, so the figure is the path's own latency).
//! For UDP rounds it also prints, during the 4 streams, each loop thread's CPU use and how many
//! datagrams each queue sent and received (how the loop spreads over the cores).
//! BGP's rounds include no convergence time: the transfer starts once both nodes have learnt
//! the other's block.
//! Needs root; traffic stays in the namespaces it creates, which are removed after each round
//! (also on failure: the topology is dropped).
//!
//!     cargo bench -p svcnet-agent --bench podnet [-- ROUNDS MIB [BACKENDS]]
//!
//! (default 4 rounds, 256 MiB, `host-gw,vxlan,udp,bgp`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a failure is a failed run

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use svcnet_agent::cni::{self, Invocation};
use svcnet_agent::podnet::bgp::{BgpSettings, Speaker, mesh_configs};
use svcnet_agent::routes::PodNetwork;
use svcnet_agent::test_support::{
    Slot, pod_netconf, program_vxlan_peers, start_udp_backends, tcp_transfer,
};
use svcnet_agent::topology::Topology;
use svcnet_netns::NetNs;

/// This process's CPU seconds so far (user + system; USER_HZ is 100).
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

/// What one round measured.
struct Round {
    mbps: f64,
    /// CPU seconds per GB: the whole process, and the UDP loop's threads alone.
    cpu_per_gb: f64,
    loop_per_gb: f64,
    /// 4 streams at once, MB/s of the whole, and the process's CPU seconds per second meanwhile
    /// (2.0 = both of two cores busy).
    mbps4: f64,
    cores4: f64,
    /// For udp: during the 4 streams, each loop thread's CPU seconds per second and each
    /// receiving queue's share of the datagrams.
    udp_detail: Option<String>,
    /// Request/response round trips, plain (`[0]`) and busy-polling (`[1]`).
    rr: [Rr; 2],
}

/// Request/response round trips in microseconds: TCP p50, p99; UDP p50, p99; and the UDP
/// requests that got no answer within 200 ms.
#[derive(Debug, Clone, Copy)]
struct Rr {
    tcp: (f64, f64),
    udp: (f64, f64),
    lost: usize,
}

const WAITS: [Wait; 2] = [Wait::Block, Wait::Spin];

/// Request/response round trips per measurement (after 200 unmeasured ones).
const RR_COUNT: usize = 5000;
const RR_SIZE: usize = 64;

/// p50 and p99 of round trips, in microseconds.
fn percentiles(mut us: Vec<f64>) -> (f64, f64) {
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q) as usize];
    (at(0.50), at(0.99))
}

/// `streams` TCP connections from `p1` to `to` (a listener in `p2`), each moving `bytes /
/// streams` at once; MB/s of the whole, from the first write to the last byte received.
fn multi_stream(p1: &NetNs, listener: TcpListener, streams: usize, bytes: usize) -> f64 {
    let to = listener.local_addr().unwrap();
    let each = bytes / streams;
    let sinks = std::thread::spawn(move || {
        let readers: Vec<_> = (0..streams)
            .map(|_| {
                let (mut conn, _) = listener.accept().unwrap();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    let mut total = 0;
                    loop {
                        let n = conn.read(&mut buf).unwrap();
                        if n == 0 {
                            return total;
                        }
                        total += n;
                    }
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .sum::<usize>()
    });
    let conns: Vec<TcpStream> = p1
        .run(move || {
            (0..streams)
                .map(|_| TcpStream::connect_timeout(&to, Duration::from_secs(2)).unwrap())
                .collect()
        })
        .unwrap();
    let start = Instant::now();
    let writers: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            std::thread::spawn(move || {
                let chunk = vec![0x5au8; 1 << 16];
                let mut sent = 0;
                while sent < each {
                    let n = chunk.len().min(each - sent);
                    conn.write_all(&chunk[..n]).unwrap();
                    sent += n;
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let received = sinks.join().unwrap();
    assert_eq!(received, each * streams, "multi-stream transfer incomplete");
    received as f64 / start.elapsed().as_secs_f64() / 1e6
}

/// How the request/response ends wait for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Blocking reads: the thread sleeps until the packet arrives (its vCPU may halt, and the
    /// wake-up is part of the round trip).
    Block,
    /// Busy-polling, as netperf's busy-poll runs: non-blocking sockets tried again and again
    /// (yielding to any other runnable thread each turn, so the UDP loop's threads still get a
    /// CPU), bounded by a deadline; no thread sleeps, so the round trip is the path's own.
    Spin,
}

impl Wait {
    fn name(self) -> &'static str {
        match self {
            Wait::Block => "plain",
            Wait::Spin => "busy-poll",
        }
    }
}

/// One turn of a busy-poll: `Err(TimedOut)` past `deadline`.
fn spin_turn(deadline: Instant) -> std::io::Result<()> {
    if Instant::now() > deadline {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    std::thread::yield_now();
    Ok(())
}

/// Reads exactly `buf.len()` bytes (busy-polling a non-blocking `conn` with `Wait::Spin`).
fn read_full(
    conn: &mut TcpStream,
    buf: &mut [u8],
    wait: Wait,
    deadline: Instant,
) -> std::io::Result<()> {
    if wait == Wait::Block {
        return conn.read_exact(buf);
    }
    let mut got = 0;
    while got < buf.len() {
        match conn.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => spin_turn(deadline)?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` (busy-polling a non-blocking `conn` with `Wait::Spin`).
fn write_full(
    conn: &mut TcpStream,
    buf: &[u8],
    wait: Wait,
    deadline: Instant,
) -> std::io::Result<()> {
    if wait == Wait::Block {
        return conn.write_all(buf);
    }
    let mut sent = 0;
    while sent < buf.len() {
        match conn.write(&buf[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => spin_turn(deadline)?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// 64-byte requests echoed over one TCP connection (no Nagle on either side); each round trip
/// must finish within 5 s.
fn tcp_rr(p1: &NetNs, listener: TcpListener, wait: Wait) -> (f64, f64) {
    let to = listener.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_nodelay(true).unwrap();
        conn.set_nonblocking(wait == Wait::Spin).unwrap();
        let mut buf = [0u8; RR_SIZE];
        // Ends when the client closes (or stays silent for 30 s).
        let next = || Instant::now() + Duration::from_secs(30);
        while read_full(&mut conn, &mut buf, wait, next()).is_ok() {
            write_full(&mut conn, &buf, wait, next()).unwrap();
        }
    });
    let mut conn = p1
        .run(move || TcpStream::connect_timeout(&to, Duration::from_secs(2)).unwrap())
        .unwrap();
    conn.set_nodelay(true).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.set_nonblocking(wait == Wait::Spin).unwrap();
    let mut buf = [7u8; RR_SIZE];
    let mut us = Vec::with_capacity(RR_COUNT);
    for i in 0..RR_COUNT + 200 {
        let t = Instant::now();
        let deadline = t + Duration::from_secs(5);
        write_full(&mut conn, &buf, wait, deadline).unwrap();
        read_full(&mut conn, &mut buf, wait, deadline).unwrap();
        if i >= 200 {
            us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(conn);
    echo.join().unwrap();
    percentiles(us)
}

/// Receives one datagram on `sock` before `deadline` (busy-polling a non-blocking socket with
/// `Wait::Spin`; a blocking one has its read timeout).
fn recv_until(
    sock: &UdpSocket,
    buf: &mut [u8],
    wait: Wait,
    deadline: Instant,
) -> std::io::Result<(usize, SocketAddr)> {
    loop {
        match sock.recv_from(buf) {
            Err(e) if wait == Wait::Spin && e.kind() == std::io::ErrorKind::WouldBlock => {
                spin_turn(deadline)?
            }
            other => return other,
        }
    }
}

/// 64-byte UDP requests echoed by a socket in `p2`; a request unanswered within 200 ms is lost
/// (not in the percentiles).
fn udp_rr(p1: &NetNs, p2: &NetNs, ip2: Ipv4Addr, wait: Wait) -> ((f64, f64), usize) {
    let server = p2
        .run(move || UdpSocket::bind((ip2, 9103)).unwrap())
        .unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    server.set_nonblocking(wait == Wait::Spin).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let deadline = Instant::now() + Duration::from_millis(500);
                if let Ok((n, from)) = recv_until(&server, &mut buf, wait, deadline) {
                    let _ = server.send_to(&buf[..n], from);
                }
            }
        })
    };
    let client = p1
        .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap())
        .unwrap();
    client.connect(SocketAddr::from((ip2, 9103))).unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    client.set_nonblocking(wait == Wait::Spin).unwrap();
    let mut us = Vec::with_capacity(RR_COUNT);
    let mut lost = 0;
    let mut buf = [0u8; 2048];
    for i in 0..RR_COUNT + 200 {
        // Each request carries its number, so a late answer is not taken for the next one.
        let req = [(i as u64).to_be_bytes().as_slice(), &[9u8; RR_SIZE - 8]].concat();
        let t = Instant::now();
        let deadline = t + Duration::from_millis(200);
        client.send(&req).unwrap();
        let answered = loop {
            match recv_until(&client, &mut buf, wait, deadline) {
                Ok((n, _)) if buf[..n] == req[..] => break true,
                Ok(_) => continue,
                Err(_) => break false,
            }
        };
        if i < 200 {
            continue;
        }
        if answered {
            us.push(t.elapsed().as_secs_f64() * 1e6);
        } else {
            lost += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    echo.join().unwrap();
    (percentiles(us), lost)
}

/// One bounded transfer of `bytes` from a pod on node 1 to a pod on node 2.
fn round(network: PodNetwork, bytes: usize) -> Round {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = slot.config(2, data.path().to_path_buf());
    config.pod_network = network;
    let prefix = config.prefix.clone();
    let topo = Topology::create(config).unwrap();
    let nodes = topo.nodes().to_vec();
    if network == PodNetwork::Vxlan {
        program_vxlan_peers(&nodes).unwrap();
    }
    let _speakers = (network == PodNetwork::Bgp).then(|| start_bgp(&topo, data.path()));
    let udp = match network {
        PodNetwork::Udp => start_udp_backends(&nodes, topo.config().pod_cidr).unwrap(),
        _ => Vec::new(),
    };
    let p1 = NetNs::create(&format!("{prefix}-pod-1")).unwrap();
    let p2 = NetNs::create(&format!("{prefix}-pod-2")).unwrap();
    let c1 = pod_netconf(&nodes[0], data.path(), network.pod_mtu());
    let c2 = pod_netconf(&nodes[1], data.path(), network.pod_mtu());
    cni::add(&c1, &Invocation::new("one", p1.name())).unwrap();
    let ip2 = cni::add(&c2, &Invocation::new("two", p2.name()))
        .unwrap()
        .pod_ip()
        .unwrap();
    let listen = |port: u16| {
        p2.run(move || TcpListener::bind((ip2, port)))
            .unwrap()
            .unwrap()
    };
    let listener = listen(9100);
    let (cpu0, loop0) = (
        process_cpu(),
        udp.iter().map(|u| u.cpu_seconds()).sum::<f64>(),
    );
    let (_, received, took) = tcp_transfer(&p1, listener, bytes).unwrap();
    let gb = bytes as f64 / 1e9;
    let cpu_per_gb = (process_cpu() - cpu0) / gb;
    let loop_per_gb = (udp.iter().map(|u| u.cpu_seconds()).sum::<f64>() - loop0) / gb;
    let secs = took.as_secs_f64();
    assert_eq!(received, bytes, "transfer incomplete");
    let (cpu0, t0) = (process_cpu(), Instant::now());
    let threads0: Vec<Vec<(String, f64)>> = udp.iter().map(|u| u.thread_cpu_seconds()).collect();
    let queues0: Vec<_> = udp.iter().map(|u| u.queue_stats()).collect();
    let mbps4 = multi_stream(&p1, listen(9101), 4, bytes);
    let secs4 = t0.elapsed().as_secs_f64();
    let cores4 = (process_cpu() - cpu0) / secs4;
    let udp_detail = (!udp.is_empty()).then(|| {
        let mut out = String::new();
        for (node, u) in udp.iter().enumerate() {
            let busy: Vec<String> = u
                .thread_cpu_seconds()
                .iter()
                .zip(&threads0[node])
                .map(|((name, s), (_, s0))| format!("{name} {:.2}", (s - s0) / secs4))
                .collect();
            let rx: Vec<u64> = u
                .queue_stats()
                .iter()
                .zip(&queues0[node])
                .map(|(q, q0)| q.received_datagrams - q0.received_datagrams)
                .collect();
            let tx: Vec<u64> = u
                .queue_stats()
                .iter()
                .zip(&queues0[node])
                .map(|(q, q0)| q.sent_datagrams - q0.sent_datagrams)
                .collect();
            out += &format!(
                "\n    node {}: cpu/s {}; datagrams sent per queue {tx:?}, received per queue {rx:?}",
                node + 1,
                busy.join(", ")
            );
        }
        out
    });
    let rr = WAITS.map(|wait| {
        let tcp = tcp_rr(
            &p1,
            listen(if wait == Wait::Block { 9102 } else { 9104 }),
            wait,
        );
        let (udp, lost) = udp_rr(&p1, &p2, ip2, wait);
        Rr { tcp, udp, lost }
    });
    drop((udp, p1, p2, _speakers));
    topo.destroy().unwrap();
    Round {
        mbps: bytes as f64 / secs / 1e6,
        cpu_per_gb,
        loop_per_gb,
        mbps4,
        cores4,
        udp_detail,
        rr,
    }
}

/// A BIRD per node in a full mesh; returns once every node has a BGP route to every other.
fn start_bgp(topo: &Topology, data: &std::path::Path) -> Vec<Speaker> {
    let nodes = topo.nodes();
    let configs = mesh_configs(&BgpSettings::calico(topo.config().pod_cidr), nodes);
    let speakers: Vec<Speaker> = nodes
        .iter()
        .map(|n| Speaker::start(data, &n.name, &n.netns, &configs[&n.name]).unwrap())
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for n in nodes {
        loop {
            let out = std::process::Command::new("ip")
                .args(["-n", &n.netns, "route", "show", "proto", "bird"])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).lines().count() == nodes.len() - 1 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "BGP did not converge");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    speakers
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        eprintln!("podnet bench: skipped (needs root to create namespaces)");
        return;
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(4);
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "S11 pod-to-pod TCP across nodes, {mib} MiB per transfer, {rounds} rounds alternating; loadavg {}",
        load.trim()
    );
    // An optional third argument picks the backends (`host-gw,vxlan,udp,bgp`, the default);
    // ratios are printed for the pairs that ran.
    let networks: Vec<PodNetwork> = match args.get(2) {
        Some(list) => list
            .split(',')
            .map(|n| n.parse().unwrap_or_else(|e| panic!("backend {n:?}: {e}")))
            .collect(),
        None => vec![
            PodNetwork::HostGw,
            PodNetwork::Vxlan,
            PodNetwork::Udp,
            PodNetwork::Bgp,
        ],
    };
    println!(
        "per round: 1 stream of {mib} MiB, then 4 streams of {} MiB at once (MB/s; cores = the \
         bench process's CPU seconds per second meanwhile), then {RR_COUNT} request/response \
         round trips of {RR_SIZE} B over TCP and over UDP, twice:\n  plain: blocking sockets, \
         the usual way; on an idle VM each round trip includes waking halted vCPUs;\n  \
         busy-poll: both ends spin on non-blocking sockets (yielding each turn, bounded by a \
         deadline), so no CPU sleeps and the figure is the path's own added latency",
        mib / 4
    );
    let mut results: Vec<Vec<Round>> = networks.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        // Rotate which goes first so drift in the machine's load hits all alike.
        for k in 0..networks.len() {
            let i = (k + r) % networks.len();
            let network = networks[i];
            let got = round(network, mib << 20);
            let rr: Vec<String> = WAITS
                .iter()
                .zip(&got.rr)
                .map(|(w, rr)| {
                    format!(
                        "{}: tcp rr p50/p99 {:.0}/{:.0} us, udp rr {:.0}/{:.0} us ({} lost)",
                        w.name(),
                        rr.tcp.0,
                        rr.tcp.1,
                        rr.udp.0,
                        rr.udp.1,
                        rr.lost
                    )
                })
                .collect();
            println!(
                "round {r} {:8} {:8.1} MB/s  4 streams {:8.1} MB/s ({:.2} cores)  cpu \
                 {:5.2} s/GB  (udp loop {:5.2} s/GB)\n    {}{}",
                network.to_string(),
                got.mbps,
                got.mbps4,
                got.cores4,
                got.cpu_per_gb,
                got.loop_per_gb,
                rr.join("\n    "),
                got.udp_detail.as_deref().unwrap_or("")
            );
            results[i].push(got);
        }
    }
    let idx = |n: PodNetwork| networks.iter().position(|&m| m == n);
    let med = |i: usize, f: &dyn Fn(&Round) -> f64| median(results[i].iter().map(f).collect());
    let base = idx(PodNetwork::HostGw).unwrap_or(0);
    let base_name = networks[base];
    println!("medians (ratios to {base_name}):");
    for (i, network) in networks.iter().enumerate() {
        let (m, m4) = (med(i, &|r| r.mbps), med(i, &|r| r.mbps4));
        println!(
            "median {:8} 1 stream {m:7.1} MB/s {:.2}x  4 streams {m4:7.1} MB/s {:.2}x \
             ({:.2} cores)  cpu {:5.2} s/GB  (udp loop {:5.2} s/GB)",
            network.to_string(),
            m / med(base, &|r| r.mbps),
            m4 / med(base, &|r| r.mbps4),
            med(i, &|r| r.cores4),
            med(i, &|r| r.cpu_per_gb),
            med(i, &|r| r.loop_per_gb),
        );
    }
    for (w, wait) in WAITS.iter().enumerate() {
        let (bt, bu) = (med(base, &|r| r.rr[w].tcp.0), med(base, &|r| r.rr[w].udp.0));
        for (i, network) in networks.iter().enumerate() {
            let (t50, t99) = (med(i, &|r| r.rr[w].tcp.0), med(i, &|r| r.rr[w].tcp.1));
            let (u50, u99) = (med(i, &|r| r.rr[w].udp.0), med(i, &|r| r.rr[w].udp.1));
            let lost: usize = results[i].iter().map(|r| r.rr[w].lost).sum();
            println!(
                "median {:8} {:9} tcp rr p50/p99 {t50:5.0}/{t99:5.0} us ({:+4.0} us p50)  \
                 udp rr p50/p99 {u50:5.0}/{u99:5.0} us ({:+4.0} us; {lost} of {} lost)",
                network.to_string(),
                wait.name(),
                t50 - bt,
                u50 - bu,
                results[i].len() * RR_COUNT,
            );
        }
    }
    if let (Some(h), Some(v)) = (idx(PodNetwork::HostGw), idx(PodNetwork::Vxlan)) {
        let ratio = |f: &dyn Fn(&Round) -> f64| med(v, f) / med(h, f);
        let plus = |f: &dyn Fn(&Round) -> f64| med(v, f) - med(h, f);
        println!(
            "vxlan/host-gw throughput {:.2}x, 4 streams {:.2}x (goal >= 0.9x); tcp rr p50 {:+.0} us \
             plain, {:+.0} us busy-poll (goal <= +5 us)",
            ratio(&|r| r.mbps),
            ratio(&|r| r.mbps4),
            plus(&|r| r.rr[0].tcp.0),
            plus(&|r| r.rr[1].tcp.0),
        );
    }
    if let (Some(v), Some(u)) = (idx(PodNetwork::Vxlan), idx(PodNetwork::Udp)) {
        let ratio = |f: &dyn Fn(&Round) -> f64| med(u, f) / med(v, f);
        println!(
            "udp/vxlan throughput {:.2}x, 4 streams {:.2}x (goal >= 0.8x; flannel's 0.6x)   cpu \
             per GB udp/vxlan {:.2}x",
            ratio(&|r| r.mbps),
            ratio(&|r| r.mbps4),
            ratio(&|r| r.cpu_per_gb),
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("loadavg at the end {}", load.trim());
}
