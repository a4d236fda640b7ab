//! flannel's UDP backend against the real kernel (root): three node namespaces on the
//! topology's own underlay bridge, svcnet's loop on two of them (`flannel0`, UDP 8285), pods
//! reaching each other across nodes over TCP and UDP with their source addresses kept, the
//! traffic carried by the loop (no host-gw route), 10 MiB byte-exact at pod MTU 1472, a peer
//! removed from the table cutting its pods off and coming back, a node started later reachable
//! once the others learn it, and `flannel0` with its route gone when the loop stops.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::Duration;

use svcnet_agent::ip;
use svcnet_agent::routes::PodNetwork;
use svcnet_agent::test_support::{
    Slot, TestPod, ask_tcp, link_json, link_packets, node_objects, tcp_transfer, udp_table,
};
use svcnet_agent::topology::Topology;
use svcnet_agent::udpencap::{PeerTable, UDP_DEVICE, UdpEncap, UdpEncapConfig};
use svcnet_netns::test_support::{serve_tcp, serve_udp, udp_ask};

fn link(netns: &str, dev: &str) -> serde_json::Value {
    link_json(netns, dev).unwrap()
}

fn packets(netns: &str, dev: &str, dir: &str) -> u64 {
    link_packets(netns, dev, dir).unwrap()
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
