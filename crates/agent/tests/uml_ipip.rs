//! Calico's IPIP backend against a kernel that has `ipip` (the user-mode Linux tier, through
//! `scripts/uml/cargo-runner`; skipped on a host without it, such as the 6.18 kernel svcnet is
//! developed on): two node namespaces on the topology's underlay bridge, `tunl0` at MTU 1480
//! with the node's tunnel address, the plan's onlink routes exactly, pods on both nodes reaching
//! each other over TCP and UDP with their source addresses kept, carried by `tunl0` (its
//! counters move), and a transfer far larger than one MTU, byte-exact. And Calico's IPIP mode
//! over BGP: BIRD in each node (upstream BIRD 2's `onlink`, not Calico's fork) installs the
//! learnt blocks through `tunl0`, and pods reach each other through them.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::time::Duration;

use svcnet_agent::ip;
use svcnet_agent::podnet::bgp::{BgpSettings, Speaker, mesh_configs};
use svcnet_agent::podnet::ipip::{
    IPIP_DEVICE, IpipMode, device_steps, kernel_support, plan, tunnel_addr,
};
use svcnet_agent::routes::PodNetwork;
use svcnet_agent::test_support::{PodPair, Slot, tcp_transfer, transfer_byte};
use svcnet_agent::topology::Topology;
use svcnet_netns::test_support::{serve_tcp, serve_udp, uml_guest};

fn link(netns: &str, dev: &str) -> serde_json::Value {
    ip::ip_json(Some(netns), &["-s", "-d", "link", "show", "dev", dev])
        .unwrap()
        .remove(0)
}

fn packets(netns: &str, dir: &str) -> u64 {
    link(netns, IPIP_DEVICE)["stats64"][dir]["packets"]
        .as_u64()
        .unwrap()
}

/// Two node namespaces with `network`'s plan, in a slot of their own. Bind it as
/// `Lab { _slot, data, topo }`, so the topology, which needs the data dir, is dropped first.
struct Lab {
    topo: Topology,
    data: tempfile::TempDir,
    _slot: Slot,
}

fn lab(network: PodNetwork) -> Lab {
    // Loaded before the namespaces exist, so each gets its fallback `tunl0`.
    kernel_support().unwrap();
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = slot.config(2, data.path().to_path_buf());
    config.pod_network = network;
    Lab {
        topo: Topology::create(config).unwrap(),
        data,
        _slot: slot,
    }
}

#[test]
fn pods_on_two_nodes_reach_each_other_over_calico_ipip() {
    if !uml_guest() {
        return;
    }
    let Lab { _slot, data, topo } = lab(PodNetwork::Ipip);
    let (underlay, prefix) = (topo.config().underlay, topo.config().prefix.clone());
    let (n1, n2) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());

    // The device and the route as planned.
    let tunl = link(&n1.netns, IPIP_DEVICE);
    assert_eq!(tunl["mtu"], 1480, "{tunl}");
    let addrs = ip::ip(Some(&n1.netns), &["-4", "addr", "show", "dev", IPIP_DEVICE]).unwrap();
    assert!(
        addrs.contains(&format!("inet {}/32", tunnel_addr(n1.pod_cidr))),
        "{addrs}"
    );
    let routes = ip::ip(Some(&n1.netns), &["route", "show"]).unwrap();
    let planned = plan(&n1, underlay, &[&n2], IpipMode::Always);
    assert!(
        planned
            .last()
            .unwrap()
            .to_string()
            .ends_with("dev tunl0 onlink")
    );
    assert!(
        routes.contains(&format!(
            "{} via {} dev {IPIP_DEVICE} onlink",
            n2.pod_cidr, n2.internal_ip
        )),
        "{routes}"
    );

    let pods =
        PodPair::attach(&prefix, (&n1, &n2), data.path(), PodNetwork::Ipip.pod_mtu()).unwrap();
    let (p1, p2) = (&pods.p1, &pods.p2);
    assert_eq!(link(p1.name(), "eth0")["mtu"], 1480);

    let _tcp = serve_tcp(p2, 9000, "two").unwrap();
    let _udp = serve_udp(p2, 9001, "two").unwrap();
    let tx_before = packets(&n1.netns, "tx");
    let rx_before = packets(&n2.netns, "rx");
    let direct = pods.direct_reply("two");
    assert_eq!(
        pods.ask_tcp(9000).unwrap(),
        direct,
        "TCP across nodes, no NAT"
    );
    assert_eq!(
        pods.ask_udp(9001).unwrap(),
        direct,
        "UDP across nodes, no NAT"
    );
    assert!(packets(&n1.netns, "tx") > tx_before, "node 1's tunl0 sent");
    assert!(
        packets(&n2.netns, "rx") > rx_before,
        "node 2's tunl0 received"
    );

    let listener = pods.listen_on_pod2(9100).unwrap();
    let (kept, total, _) = tcp_transfer(p1, listener, 4 << 20).unwrap();
    assert_eq!(total, 4 << 20);
    assert!(
        kept.iter().enumerate().all(|(i, b)| *b == transfer_byte(i)),
        "transfer not byte-exact"
    );

    drop((_tcp, _udp, pods));
    topo.destroy().unwrap();
}

#[test]
fn calico_ipip_mode_over_bgp_installs_learnt_routes_through_tunl0() {
    if !uml_guest() {
        return;
    }
    // No static routes: they come from BIRD.
    let Lab { _slot, data, topo } = lab(PodNetwork::Bgp);
    let prefix = topo.config().prefix.clone();
    let settings = BgpSettings {
        ipip: true,
        ..BgpSettings::calico(topo.config().pod_cidr)
    };
    let nodes = topo.nodes().to_vec();
    for n in &nodes {
        for step in device_steps(n) {
            step.run().unwrap();
        }
    }
    let configs = mesh_configs(&settings, &nodes);
    let speakers: Vec<Speaker> = nodes
        .iter()
        .map(|n| Speaker::start(data.path(), &n.name, &n.netns, &configs[&n.name]).unwrap())
        .collect();
    let (n1, n2) = (&nodes[0], &nodes[1]);
    let through_tunl0 = |from: &svcnet_agent::NodeTopology, to: &svcnet_agent::NodeTopology| {
        let want = format!(
            "{} via {} dev {IPIP_DEVICE} proto bird metric 32 onlink",
            to.pod_cidr, to.internal_ip
        );
        ip::ip(Some(&from.netns), &["route", "show"])
            .unwrap()
            .contains(&want)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(through_tunl0(n1, n2) && through_tunl0(n2, n1)) {
        let routes = ip::ip(Some(&n1.netns), &["route", "show"]).unwrap();
        assert!(
            std::time::Instant::now() < deadline,
            "no learnt route through tunl0:\n{routes}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let pods = PodPair::attach(&prefix, (n1, n2), data.path(), PodNetwork::Ipip.pod_mtu()).unwrap();
    let p2 = &pods.p2;
    let _tcp = serve_tcp(p2, 9000, "two").unwrap();
    let tx_before = packets(&n1.netns, "tx");
    assert_eq!(
        pods.ask_tcp(9000).unwrap(),
        pods.direct_reply("two"),
        "TCP across nodes over IPIP routes from BGP"
    );
    assert!(packets(&n1.netns, "tx") > tx_before, "node 1's tunl0 sent");

    drop((_tcp, pods, speakers));
    topo.destroy().unwrap();
}
