//! flannel's UDP backend against the real kernel (root): three node namespaces on the
//! topology's own underlay bridge, svcnet's loop on two of them (`flannel0`, UDP 8285), pods
//! reaching each other across nodes over TCP and UDP with their source addresses kept, the
//! traffic carried by the loop (no host-gw route), 10 MiB byte-exact at pod MTU 1472, a peer
//! removed from the table cutting its pods off and coming back, a node started later reachable
//! once the others learn it, and `flannel0` with its route gone when the loop stops. Each TCP
//! flow keeps to the one queue its inner addresses and ports name, in both directions on both
//! nodes, and flows spread over the queues.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use svcnet_agent::ip;
use svcnet_agent::routes::PodNetwork;
use svcnet_agent::test_support::{
    Slot, TestPod, ask_tcp, link_json, link_packets, node_objects, tcp_transfer, udp_table,
};
use svcnet_agent::topology::Topology;
use svcnet_agent::udpencap::{PeerTable, UDP_DEVICE, UdpEncap, UdpEncapConfig};
use svcnet_netns::test_support::{serve_tcp, serve_udp, udp_ask};
use svcnet_netns::tun::inner_flow_index;

fn link(netns: &str, dev: &str) -> serde_json::Value {
    link_json(netns, dev).unwrap()
}

fn packets(netns: &str, dev: &str, dir: &str) -> u64 {
    link_packets(netns, dev, dir).unwrap()
}

/// The first bytes of a TCP/IPv4 packet from `src:sport` to `dst:dport` (what the steering reads).
fn tcp_header(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x45;
    p[9] = 6;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&dport.to_be_bytes());
    p
}

#[test]
fn pods_on_three_nodes_reach_each_other_over_the_udp_backend() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = slot.config(3, data.path().to_path_buf());
    config.pod_network = PodNetwork::Udp;
    let (prefix, cluster) = (config.prefix.clone(), config.pod_cidr);
    // Dropped on every path out (also a failed assertion): namespaces, links and routes go.
    let topo = Topology::create(config).unwrap();
    let nodes = topo.nodes().to_vec();
    let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
    // Nodes 1 and 2 first; node 3 joins later. Dropped (threads joined, TUN closed) on any exit.
    // Node 1 splits TSO super-packets itself, node 2 lets the kernel segment: both paths run.
    let objects = node_objects(&nodes, PodNetwork::Udp);
    let first: Vec<UdpEncap> = nodes[..2]
        .iter()
        .zip([true, false])
        .map(|(node, tun_offload)| {
            let mut cfg = UdpEncapConfig::new(cluster);
            cfg.tun_offload = tun_offload;
            let encap = UdpEncap::start(node, &cfg).unwrap();
            encap.set_peers(udp_table(node, &objects[..2]));
            encap
        })
        .collect();

    // The TUN as flannel makes it: MTU 1472, the pod CIDR's .0/32, one route for the cluster.
    let tun = link(&n1.netns, UDP_DEVICE);
    assert_eq!(tun["mtu"], 1472, "{tun}");
    let info = &tun["linkinfo"]["info_data"];
    assert_eq!(info["type"], "tun", "{info}");
    assert_eq!(info["vnet_hdr"], true, "{info}");
    assert_eq!(info["multi_queue"], true, "{info}");
    let addrs = ip::ip(Some(&n1.netns), &["-4", "addr", "show", "dev", UDP_DEVICE]).unwrap();
    assert!(
        addrs.contains(&format!("inet {}/32", n1.pod_cidr.network())),
        "{addrs}"
    );
    let routes = ip::ip(Some(&n1.netns), &["route", "show"]).unwrap();
    assert!(
        routes.contains(&format!("{cluster} dev {UDP_DEVICE}")),
        "{routes}"
    );
    assert!(
        !routes.contains(&format!("via {}", n2.internal_ip)),
        "no host-gw route with udp:\n{routes}"
    );
    let offloads = first[0].offloads();
    eprintln!("udp backend offloads on this kernel: {offloads:?}");
    assert!(offloads.queues >= 1);
    assert!(offloads.steering, "datagrams steered by their inner flow");
    assert_eq!(
        first[1].offloads().tun_offload,
        0,
        "node 2: the kernel segments"
    );

    // Pods at MTU 1472 on all three nodes.
    let mtu = PodNetwork::Udp.pod_mtu();
    let pods: Vec<TestPod> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| TestPod::add(n, data.path(), mtu, &prefix, &(i + 1).to_string()).unwrap())
        .collect();
    let ips: Vec<_> = pods.iter().map(|p| p.ip).collect();
    // The pod's eth0, its host-side veth and cni0 all at 1472: nothing needs fragmenting.
    assert_eq!(link(pods[0].ns.name(), "eth0")["mtu"], 1472);
    assert_eq!(link(&n1.netns, "cni0")["mtu"], 1472);
    let ports = ip::ip_json(Some(&n1.netns), &["link", "show", "master", "cni0"]).unwrap();
    assert!(!ports.is_empty());
    assert!(ports.iter().all(|p| p["mtu"] == 1472), "{ports:?}");

    let _srv2 = serve_tcp(&pods[1].ns, 9000, "two").unwrap();
    let _udp2 = serve_udp(&pods[1].ns, 9001, "two-udp").unwrap();
    let _srv3 = serve_tcp(&pods[2].ns, 9000, "three").unwrap();
    let to2 = SocketAddr::new(IpAddr::V4(ips[1]), 9000);
    let to3 = SocketAddr::new(IpAddr::V4(ips[2]), 9000);
    let tx_before = packets(&n1.netns, UDP_DEVICE, "tx");
    let rx_before = packets(&n2.netns, UDP_DEVICE, "rx");
    let reply = ask_tcp(&pods[0].ns, to2).unwrap();
    assert_eq!(
        (reply.identity.as_str(), reply.client),
        ("two", IpAddr::V4(ips[0])),
        "no NAT between nodes"
    );
    let udp_to2 = SocketAddr::new(IpAddr::V4(ips[1]), 9001);
    let reply = pods[0]
        .ns
        .run(move || udp_ask(udp_to2, Duration::from_secs(2)))
        .unwrap()
        .unwrap();
    assert_eq!(
        (reply.identity.as_str(), reply.client),
        ("two-udp", IpAddr::V4(ips[0]))
    );
    // Through the loop: flannel0 sent on node 1 (into user space) and received on node 2.
    assert!(packets(&n1.netns, UDP_DEVICE, "tx") > tx_before);
    assert!(packets(&n2.netns, UDP_DEVICE, "rx") > rx_before);

    // Lone datagrams, one round trip at a time: each wake-up of a receiving loop is one
    // `recvmmsg` that returns it, with no second call that finds the socket empty.
    let calls = |e: &UdpEncap| {
        e.queue_stats()
            .iter()
            .fold((0, 0), |(r, c), q| (r + q.receives, c + q.receive_calls))
    };
    let before: Vec<_> = first.iter().map(calls).collect();
    for _ in 0..10 {
        pods[0]
            .ns
            .run(move || udp_ask(udp_to2, Duration::from_secs(2)))
            .unwrap()
            .unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    for (node, (encap, (r0, c0))) in first.iter().zip(before).enumerate() {
        let (r, c) = calls(encap);
        let (receives, empty) = (r - r0, (c - c0) - (r - r0));
        assert!(
            receives >= 10 && empty <= 2,
            "node {}: {receives} receives, {empty} receive calls that found nothing",
            node + 1
        );
    }

    // 10 MiB, every byte checked, in both directions (the transfer fails on any difference).
    for (from, to, ip) in [(0, 1, ips[1]), (1, 0, ips[0])] {
        let listener = pods[to]
            .ns
            .run(move || TcpListener::bind((ip, 9100)))
            .unwrap()
            .unwrap();
        let (_, total, took) = tcp_transfer(&pods[from].ns, listener, 10 << 20).unwrap();
        assert_eq!(total, 10 << 20);
        eprintln!("10 MiB node {} -> node {}: {took:?}", from + 1, to + 1);
    }

    // Each flow on one queue, the same on both nodes and in both directions: the one
    // `inner_flow_index` names. Connections one at a time (the others idle), until every queue
    // has carried one.
    let queues = offloads.queues as u32;
    let ip2 = ips[1];
    let listener = pods[1]
        .ns
        .run(move || TcpListener::bind((ip2, 9200)))
        .unwrap()
        .unwrap();
    let server = std::thread::spawn(move || {
        // Per connection: take 1 MiB, answer one byte; keep it open until the test ends.
        let mut open = Vec::new();
        while let Ok((mut conn, _)) = listener.accept() {
            let mut buf = vec![0u8; 1 << 20];
            if conn.read_exact(&mut buf).is_err() || conn.write_all(b"k").is_err() {
                break;
            }
            open.push(conn);
        }
    });
    let mut used = vec![false; queues as usize];
    let mut conns = Vec::new();
    for _ in 0..64 {
        if used.iter().all(|u| *u) {
            break;
        }
        let before: Vec<_> = first.iter().map(|e| e.queue_stats()).collect();
        let to = SocketAddr::new(IpAddr::V4(ips[1]), 9200);
        let mut conn = pods[0]
            .ns
            .run(move || TcpStream::connect_timeout(&to, Duration::from_secs(2)))
            .unwrap()
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(&vec![7u8; 1 << 20]).unwrap();
        let mut k = [0u8; 1];
        conn.read_exact(&mut k).unwrap();
        let sport = conn.local_addr().unwrap().port();
        let want = inner_flow_index(&tcp_header(ips[0], ips[1], sport, 9200), queues).unwrap();
        used[want as usize] = true;
        for (node, encap) in first.iter().enumerate() {
            let got: Vec<u64> = encap
                .queue_stats()
                .iter()
                .zip(&before[node])
                .map(|(a, b)| a.received_datagrams - b.received_datagrams)
                .collect();
            // The flow's datagrams (1 MiB of segments one way, their ACKs the other) all on
            // its queue; a stray one or two of the earlier transfers' teardown may be elsewhere.
            let elsewhere: u64 = got
                .iter()
                .enumerate()
                .filter(|(q, _)| *q != want as usize)
                .map(|(_, n)| n)
                .sum();
            assert!(
                got[want as usize] >= 20 && elsewhere <= 2,
                "node {}: flow from port {sport} received per queue {got:?}, want queue {want}",
                node + 1
            );
        }
        conns.push(conn);
    }
    assert!(used.iter().all(|u| *u), "flows on every queue: {used:?}");
    // A connection that sends nothing ends the server.
    let to = SocketAddr::new(IpAddr::V4(ips[1]), 9200);
    drop(
        pods[0]
            .ns
            .run(move || TcpStream::connect_timeout(&to, Duration::from_secs(2))),
    );
    server.join().unwrap();
    drop(conns);

    // Node 3 is not running its loop and not in the others' tables: unreachable.
    let t = std::time::Instant::now();
    assert!(ask_tcp(&pods[0].ns, to3).is_err(), "node 3 has no loop yet");
    eprintln!("unreachable after {:?}", t.elapsed());
    // It starts; the others learn its lease (a Node added): reachable both ways.
    let third = UdpEncap::start(n3, &UdpEncapConfig::new(cluster)).unwrap();
    third.set_peers(udp_table(n3, &objects));
    for (node, encap) in nodes.iter().zip(&first) {
        encap.set_peers(udp_table(node, &objects));
    }
    assert_eq!(ask_tcp(&pods[0].ns, to3).unwrap().identity, "three");
    assert_eq!(ask_tcp(&pods[1].ns, to3).unwrap().identity, "three");

    // Node 2's lease goes from node 1's table: its pods are cut off from node 1 (and only
    // them); re-added, traffic flows again.
    let without2: Vec<_> = objects
        .iter()
        .filter(|o| o.metadata.name.as_deref() != Some(&n2.name))
        .cloned()
        .collect();
    first[0].set_peers(udp_table(n1, &without2));
    assert!(ask_tcp(&pods[0].ns, to2).is_err(), "node 2 cut off");
    assert_eq!(ask_tcp(&pods[0].ns, to3).unwrap().identity, "three");
    first[0].set_peers(udp_table(n1, &objects));
    assert_eq!(ask_tcp(&pods[0].ns, to2).unwrap().identity, "two");

    // Stopping the loop closes the TUN: the device and its route are gone with it.
    third.stop();
    assert!(
        !ip::link_names(Some(&n3.netns))
            .unwrap()
            .contains(&UDP_DEVICE.to_string()),
        "flannel0 goes with its loop"
    );
    let routes = ip::ip(Some(&n3.netns), &["route", "show"]).unwrap();
    assert!(!routes.contains(UDP_DEVICE), "{routes}");
    assert_ne!(*first[0].peers(), PeerTable::default());

    drop((_srv2, _udp2, _srv3, pods, first));
    topo.destroy().unwrap();
    let left: Vec<String> = ip::link_names(None)
        .unwrap()
        .into_iter()
        .filter(|l| l.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
