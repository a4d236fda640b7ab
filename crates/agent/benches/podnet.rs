//! S11 (first part): cross-node pod-to-pod TCP throughput, host-gw against flannel's VXLAN and
//! UDP backends and Calico's BGP (routes learnt by a BIRD per node), in alternating rounds on
//! the same kind of topology (two node namespaces on their own bridge, one pod each, made by the
//! agent's topology and CNI plugin), printed side by side as ratios to host-gw; and CPU seconds
//! per GB moved, for UDP against VXLAN (this process's CPU from `/proc/self/stat`: the
//! transfer's sender and receiver threads, whose system time holds the kernel's encapsulation,
//! plus for UDP the encapsulation loop's threads, also shown alone). BGP's rounds include no
//! convergence time: the transfer starts once both nodes have learnt the other's block.
//! Needs root; traffic stays in the namespaces it creates, which are removed after each round
//! (also on failure: the topology is dropped).
//!
//!     cargo bench -p svcnet-agent --bench podnet [-- ROUNDS MIB]   (default 4 rounds, 256 MiB)

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a failure is a failed run

use std::net::TcpListener;

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
    let listener = p2
        .run(move || TcpListener::bind((ip2, 9100)))
        .unwrap()
        .unwrap();
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
    drop((udp, p1, p2, _speakers));
    topo.destroy().unwrap();
    Round {
        mbps: bytes as f64 / secs / 1e6,
        cpu_per_gb,
        loop_per_gb,
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
                "round {r} {network:8} {:8.1} MB/s  cpu {:5.2} s/GB  (udp loop {:5.2} s/GB)",
                got.mbps, got.cpu_per_gb, got.loop_per_gb
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
    let (v, u) = (med(1, |r| r.mbps), med(2, |r| r.mbps));
    let (vc, uc) = (med(1, |r| r.cpu_per_gb), med(2, |r| r.cpu_per_gb));
    println!(
        "udp/vxlan throughput {:.2}x (goal >= 0.8x; flannel's 0.6x)   cpu per GB udp/vxlan {:.2}x",
        u / v,
        uc / vc
    );
}
