//! S11: cross-node pod-to-pod traffic, host-gw against flannel's VXLAN and UDP backends and
//! Calico's BGP (routes learnt by a BIRD per node), in alternating rounds on the same kind of
//! topology (two node namespaces on their own bridge, one pod each, made by the agent's topology
//! and CNI plugin), printed side by side as ratios to host-gw. Per round: TCP throughput of one
//! stream and of 4 streams at once, TCP request/response latency with 64-byte messages on one
//! connection (p50/p99), UDP request/response latency (p50/p99, and the requests lost), and CPU
//! seconds per GB of the one-stream transfer, for UDP against VXLAN (this process's CPU from
//! `/proc/self/stat`: the transfer's sender and receiver threads, whose system time holds the
//! kernel's encapsulation, plus for UDP the encapsulation loop's threads, also shown alone).
//! BGP's rounds include no convergence time: the transfer starts once both nodes have learnt
//! the other's block.
//! Needs root; traffic stays in the namespaces it creates, which are removed after each round
//! (also on failure: the topology is dropped).
//!
//!     cargo bench -p svcnet-agent --bench podnet [-- ROUNDS MIB]   (default 4 rounds, 256 MiB)

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
    /// 4 streams at once, MB/s of the whole.
    mbps4: f64,
    /// Request/response round trips in microseconds: TCP p50, p99; UDP p50, p99.
    tcp_rr: (f64, f64),
    udp_rr: (f64, f64),
    /// UDP requests that got no answer within 200 ms.
    udp_lost: usize,
}

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

/// 64-byte requests echoed over one TCP connection (no Nagle on either side).
fn tcp_rr(p1: &NetNs, listener: TcpListener) -> (f64, f64) {
    let to = listener.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_nodelay(true).unwrap();
        let mut buf = [0u8; RR_SIZE];
        while conn.read_exact(&mut buf).is_ok() {
            conn.write_all(&buf).unwrap();
        }
    });
    let mut conn = p1
        .run(move || TcpStream::connect_timeout(&to, Duration::from_secs(2)).unwrap())
        .unwrap();
    conn.set_nodelay(true).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [7u8; RR_SIZE];
    let mut us = Vec::with_capacity(RR_COUNT);
    for i in 0..RR_COUNT + 200 {
        let t = Instant::now();
        conn.write_all(&buf).unwrap();
        conn.read_exact(&mut buf).unwrap();
        if i >= 200 {
            us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(conn);
    echo.join().unwrap();
    percentiles(us)
}

/// 64-byte UDP requests echoed by a socket in `p2`; a request unanswered within 200 ms is lost
/// (not in the percentiles).
fn udp_rr(p1: &NetNs, p2: &NetNs, ip2: Ipv4Addr) -> ((f64, f64), usize) {
    let server = p2
        .run(move || UdpSocket::bind((ip2, 9103)).unwrap())
        .unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((n, from)) = server.recv_from(&mut buf) {
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
    let mut us = Vec::with_capacity(RR_COUNT);
    let mut lost = 0;
    let mut buf = [0u8; 2048];
    for i in 0..RR_COUNT + 200 {
        // Each request carries its number, so a late answer is not taken for the next one.
        let req = [(i as u64).to_be_bytes().as_slice(), &[9u8; RR_SIZE - 8]].concat();
        let t = Instant::now();
        client.send(&req).unwrap();
        let answered = loop {
            match client.recv(&mut buf) {
                Ok(n) if buf[..n] == req[..] => break true,
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
    let mbps4 = multi_stream(&p1, listen(9101), 4, bytes);
    let tcp_rr = tcp_rr(&p1, listen(9102));
    let (udp_rr, udp_lost) = udp_rr(&p1, &p2, ip2);
    drop((udp, p1, p2, _speakers));
    topo.destroy().unwrap();
    Round {
        mbps: bytes as f64 / secs / 1e6,
        cpu_per_gb,
        loop_per_gb,
        mbps4,
        tcp_rr,
        udp_rr,
        udp_lost,
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
    let networks = [
        PodNetwork::HostGw,
        PodNetwork::Vxlan,
        PodNetwork::Udp,
        PodNetwork::Bgp,
    ];
    let mut results: Vec<Vec<Round>> = networks.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        // Rotate which goes first so drift in the machine's load hits all alike.
        for k in 0..networks.len() {
            let i = (k + r) % networks.len();
            let network = networks[i];
            let got = round(network, mib << 20);
            println!(
                "round {r} {network:8} {:8.1} MB/s  4 streams {:8.1} MB/s  cpu {:5.2} s/GB  \
                 (udp loop {:5.2} s/GB)  tcp rr p50/p99 {:.0}/{:.0} us  udp rr {:.0}/{:.0} us \
                 ({} lost)",
                got.mbps,
                got.mbps4,
                got.cpu_per_gb,
                got.loop_per_gb,
                got.tcp_rr.0,
                got.tcp_rr.1,
                got.udp_rr.0,
                got.udp_rr.1,
                got.udp_lost
            );
            results[i].push(got);
        }
    }
    let med = |i: usize, f: fn(&Round) -> f64| median(results[i].iter().map(f).collect());
    let base = med(0, |r| r.mbps);
    for (i, network) in networks.iter().enumerate() {
        let m = med(i, |r| r.mbps);
        println!(
            "median {network:8} {m:8.1} MB/s  {:.2}x host-gw  cpu {:5.2} s/GB  (udp loop {:5.2} s/GB)",
            m / base,
            med(i, |r| r.cpu_per_gb),
            med(i, |r| r.loop_per_gb),
        );
    }
    let base4 = med(0, |r| r.mbps4);
    let base_rr = (med(0, |r| r.tcp_rr.0), med(0, |r| r.udp_rr.0));
    for (i, network) in networks.iter().enumerate() {
        let m4 = med(i, |r| r.mbps4);
        let (t50, t99) = (med(i, |r| r.tcp_rr.0), med(i, |r| r.tcp_rr.1));
        let (u50, u99) = (med(i, |r| r.udp_rr.0), med(i, |r| r.udp_rr.1));
        let lost: usize = results[i].iter().map(|r| r.udp_lost).sum();
        println!(
            "median {network:8} 4 streams {m4:8.1} MB/s {:.2}x host-gw  tcp rr p50/p99 \
             {t50:.0}/{t99:.0} us ({:+.0} us p50 vs host-gw)  udp rr p50/p99 {u50:.0}/{u99:.0} us \
             ({:+.0} us; {lost} of {} lost)",
            m4 / base4,
            t50 - base_rr.0,
            u50 - base_rr.1,
            results[i].len() * RR_COUNT,
        );
    }
    let (v, u) = (med(1, |r| r.mbps), med(2, |r| r.mbps));
    let (vc, uc) = (med(1, |r| r.cpu_per_gb), med(2, |r| r.cpu_per_gb));
    println!(
        "udp/vxlan throughput {:.2}x (goal >= 0.8x; flannel's 0.6x)   cpu per GB udp/vxlan {:.2}x",
        u / v,
        uc / vc
    );
}
