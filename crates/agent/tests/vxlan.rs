//! flannel's VXLAN backend against the real kernel (root): two node namespaces on the
//! topology's own underlay bridge, a `flannel.1` VTEP each, pods on both reaching each other
//! with their source addresses kept, the traffic carried by the VTEPs (no host-gw route), a
//! transfer far larger than one MTU at pod MTU 1450, and a peer's entries removed and restored
//! as flannel does when a Node goes and comes back.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::net::{IpAddr, SocketAddr, TcpListener};

use svcnet_agent::cni::{self, Invocation};
use svcnet_agent::ip;
use svcnet_agent::routes::{PodNetwork, VXLAN_DEVICE, VxlanPeer, vtep_mac};
use svcnet_agent::test_support::{
    Slot, TestPod, ask_tcp, link_json, link_packets, pod_netconf, program_vxlan_peers,
    tcp_transfer, transfer_byte,
};
use svcnet_agent::topology::Topology;
use svcnet_netns::NetNs;
use svcnet_netns::test_support::serve_tcp;

fn link(netns: &str, dev: &str) -> serde_json::Value {
    link_json(netns, dev).unwrap()
}

fn packets(netns: &str, dev: &str, dir: &str) -> u64 {
    link_packets(netns, dev, dir).unwrap()
}

#[test]
fn pods_on_two_nodes_reach_each_other_over_flannel_vxlan() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = slot.config(2, data.path().to_path_buf());
    config.pod_network = PodNetwork::Vxlan;
    let prefix = config.prefix.clone();
    // Dropped on every path out (also a failed assertion): namespaces, links and routes go.
    let topo = Topology::create(config).unwrap();
    let (n1, n2) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    // The peers' entries come from their Node objects' flannel annotations (as the watch in
    // `podnet::run_vxlan` learns them).
    program_vxlan_peers(topo.nodes()).unwrap();

    // The VTEP as flannel makes it.
    let vtep = link(&n1.netns, VXLAN_DEVICE);
    assert_eq!(vtep["mtu"], 1450, "{vtep}");
    assert_eq!(vtep["address"], vtep_mac(n1.internal_ip));
    let info = &vtep["linkinfo"]["info_data"];
    assert_eq!(info["id"], 1, "{info}");
    assert_eq!(info["port"], 8472, "{info}");
    assert_eq!(info["local"], n1.internal_ip.to_string(), "{info}");
    assert_eq!(info["learning"], false, "{info}");
    // Per peer: a permanent neighbour, an FDB entry to its underlay address, an onlink route.
    let gw2 = n2.pod_cidr.network().to_string();
    let neigh = ip::ip(Some(&n1.netns), &["neigh", "show", "dev", VXLAN_DEVICE]).unwrap();
    assert!(
        neigh.contains(&format!(
            "{gw2} lladdr {} PERMANENT",
            vtep_mac(n2.internal_ip)
        )),
        "{neigh}"
    );
    let fdb = svcnet_netns::command(None, "bridge")
        .args(["-n", &n1.netns, "fdb", "show", "dev", VXLAN_DEVICE])
        .output()
        .unwrap();
    let fdb = String::from_utf8_lossy(&fdb.stdout);
    assert!(
        fdb.contains(&format!(
            "{} dst {} self permanent",
            vtep_mac(n2.internal_ip),
            n2.internal_ip
        )),
        "{fdb}"
    );
    let routes = ip::ip(Some(&n1.netns), &["route", "show"]).unwrap();
    assert!(
        routes.contains(&format!(
            "{} via {gw2} dev {VXLAN_DEVICE} onlink",
            n2.pod_cidr
        )),
        "{routes}"
    );
    assert!(
        !routes.contains(&format!("via {}", n2.internal_ip)),
        "no host-gw route with vxlan:\n{routes}"
    );

    // Pods at MTU 1450 on both nodes.
    let p1 = NetNs::create(&format!("{prefix}-pod-1")).unwrap();
    let p2 = NetNs::create(&format!("{prefix}-pod-2")).unwrap();
    let mtu = PodNetwork::Vxlan.pod_mtu();
    let (c1, c2) = (
        pod_netconf(&n1, data.path(), mtu),
        pod_netconf(&n2, data.path(), mtu),
    );
    let ip1 = cni::add(&c1, &Invocation::new("one", p1.name()))
        .unwrap()
        .pod_ip()
        .unwrap();
    let ip2 = cni::add(&c2, &Invocation::new("two", p2.name()))
        .unwrap()
        .pod_ip()
        .unwrap();
    assert_eq!(link(p1.name(), "eth0")["mtu"], 1450);

    let _srv = serve_tcp(&p2, 9000, "two").unwrap();
    let to2 = SocketAddr::new(IpAddr::V4(ip2), 9000);
    let tx_before = packets(&n1.netns, VXLAN_DEVICE, "tx");
    let rx_before = packets(&n2.netns, VXLAN_DEVICE, "rx");
    let reply = ask_tcp(&p1, to2).unwrap();
    assert_eq!(
        (reply.identity.as_str(), reply.client),
        ("two", IpAddr::V4(ip1)),
        "no NAT between nodes"
    );
    assert!(packets(&n1.netns, VXLAN_DEVICE, "tx") > tx_before);
    assert!(packets(&n2.netns, VXLAN_DEVICE, "rx") > rx_before);

    // 4 MiB, byte-exact, through full-size segments (no fragmentation needed at 1450).
    let listener = p2
        .run(move || TcpListener::bind((ip2, 9100)))
        .unwrap()
        .unwrap();
    let (kept, total, _) = tcp_transfer(&p1, listener, 4 << 20).unwrap();
    assert_eq!(total, 4 << 20);
    assert!(
        kept.iter().enumerate().all(|(i, b)| *b == transfer_byte(i)),
        "transfer not byte-exact"
    );

    // Node 2's lease goes (flannel's removal): its entries vanish and its pods are unreachable;
    // re-added, traffic flows again.
    let peer = VxlanPeer::of(&n2);
    for step in peer.del_steps(&n1.netns) {
        step.run().unwrap();
    }
    let neigh = ip::ip(Some(&n1.netns), &["neigh", "show", "dev", VXLAN_DEVICE]).unwrap();
    let routes = ip::ip(Some(&n1.netns), &["route", "show", "dev", VXLAN_DEVICE]).unwrap();
    assert!(
        !neigh.contains(&gw2) && !routes.contains(&gw2),
        "{neigh}{routes}"
    );
    assert!(
        ask_tcp(&p1, to2).is_err(),
        "node 2 unreachable without its entries"
    );
    for step in peer.add_steps(&n1.netns) {
        step.run().unwrap();
    }
    assert_eq!(ask_tcp(&p1, to2).unwrap().identity, "two");

    cni::del(&c1, &Invocation::new("one", p1.name())).unwrap();
    cni::del(&c2, &Invocation::new("two", p2.name())).unwrap();
    drop((_srv, p1, p2));
    topo.destroy().unwrap();
    let left: Vec<String> = ip::link_names(None)
        .unwrap()
        .into_iter()
        .filter(|l| l.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// flannel's DirectRouting: the two nodes share the underlay subnet, so each gets a host-gw route
/// to the other instead of the VXLAN entries; pods still reach each other, not through the VTEP.
#[test]
fn direct_routing_gives_same_subnet_peers_a_host_gw_route() {
    use svcnet_agent::podnet::{AppliedPeers, desired_peers, sync_vxlan_peers};
    use svcnet_agent::test_support::node_objects;

    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = slot.config(2, data.path().to_path_buf());
    config.pod_network = PodNetwork::Vxlan;
    let prefix = config.prefix.clone();
    let topo = Topology::create(config).unwrap();
    let (n1, n2) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let objects = node_objects(topo.nodes(), PodNetwork::Vxlan);
    let mut applied = Vec::new();
    for node in [&n1, &n2] {
        let desired = desired_peers(&node.name, &objects);
        applied.push(sync_vxlan_peers(node, AppliedPeers::new(), &desired, true));
    }
    assert!(applied[0][&n2.name].1, "node 2 is on node 1's subnet");
    let routes = ip::ip(Some(&n1.netns), &["route", "show"]).unwrap();
    assert!(
        routes.contains(&format!("{} via {} dev eth0", n2.pod_cidr, n2.internal_ip)),
        "{routes}"
    );
    assert!(!routes.contains(VXLAN_DEVICE), "{routes}");
    let neigh = ip::ip(Some(&n1.netns), &["neigh", "show", "dev", VXLAN_DEVICE]).unwrap();
    assert!(neigh.trim().is_empty(), "{neigh}");

    let mtu = PodNetwork::Vxlan.pod_mtu();
    let p1 = TestPod::add(&n1, data.path(), mtu, &prefix, "one").unwrap();
    let p2 = TestPod::add(&n2, data.path(), mtu, &prefix, "two").unwrap();
    let ip2 = p2.ip;
    let _srv = serve_tcp(&p2.ns, 9000, "two").unwrap();
    let tx_before = packets(&n1.netns, VXLAN_DEVICE, "tx");
    let to2 = SocketAddr::new(IpAddr::V4(ip2), 9000);
    assert_eq!(ask_tcp(&p1.ns, to2).unwrap().identity, "two");
    assert_eq!(
        packets(&n1.netns, VXLAN_DEVICE, "tx"),
        tx_before,
        "not through the VTEP"
    );

    // The peer goes: its direct route goes too.
    let now = sync_vxlan_peers(&n1, applied.remove(0), &Default::default(), true);
    assert!(now.is_empty());
    let routes = ip::ip(Some(&n1.netns), &["route", "show"]).unwrap();
    assert!(!routes.contains(&n2.pod_cidr.to_string()), "{routes}");

    drop((_srv, p1, p2));
    topo.destroy().unwrap();
}
