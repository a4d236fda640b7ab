//! The embedded topology against the real kernel (root): what it creates, that traffic flows
//! host ↔ nodes and node ↔ node (host-gw), and that destroy / cleanup after a "crash" leave
//! nothing behind.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use svcnet_agent::ip;
use svcnet_agent::test_support::Slot;
use svcnet_agent::topology::{Topology, cleanup};
use svcnet_netns::NetNs;
use svcnet_netns::test_support::{serve_tcp, tcp_ask};

fn ours(prefix: &str) -> (Vec<String>, Vec<String>) {
    let ns = ip::netns_list()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect();
    let links = ip::link_names(None)
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect();
    (ns, links)
}

fn host_routes() -> String {
    ip::ip(None, &["route", "show"]).unwrap()
}

/// Host routes are global and other tests add their own concurrently: every route that was
/// there before and belongs to no test bridge (`t…`) must still be there, and none may mention
/// this test's bridge or subnets.
fn assert_host_routes_restored(before: &str, bridge: &str, slot: &Slot) {
    let after = host_routes();
    for line in before.lines().filter(|l| !l.contains(" dev t")) {
        assert!(
            after.lines().any(|a| a == line),
            "route {line:?} vanished:\n{after}"
        );
    }
    let mine = [
        format!("dev {bridge} "),
        format!("198.18.{}.", slot.index),
        format!("10.{}.", 160 + slot.index),
    ];
    for line in after.lines() {
        assert!(
            !mine.iter().any(|m| line.contains(m.as_str())),
            "route {line:?} left behind:\n{after}"
        );
    }
}

#[test]
fn create_routes_traffic_and_destroy_leaves_nothing() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = slot.config(2, data.path().to_path_buf());
    let prefix = config.prefix.clone();
    let routes_before = host_routes();
    let topo = Topology::create(config).unwrap();

    let (ns, links) = ours(&prefix);
    assert_eq!(ns.len(), 2, "{ns:?}");
    assert_eq!(links.len(), 3, "bridge + 2 veths: {links:?}");
    assert!(data.path().join("topology.json").exists());
    let n1 = topo.nodes()[0].clone();
    let n2 = topo.nodes()[1].clone();
    assert_eq!(n1.name, format!("{prefix}-node1"));
    assert_eq!(n1.internal_ip.octets()[3], 2);
    assert_eq!(
        n2.pod_cidr.to_string(),
        format!("10.{}.2.0/24", 160 + slot.index)
    );
    for node in [&n1, &n2] {
        let routes = ip::ip(Some(&node.netns), &["route", "show"]).unwrap();
        assert!(
            !routes.contains("default"),
            "{} must have no default route:\n{routes}",
            node.name
        );
        let fwd = NetNs::open(&node.netns)
            .unwrap()
            .exec(&["sysctl", "-n", "net.ipv4.ip_forward"])
            .unwrap();
        assert_eq!(fwd.trim(), "1");
    }
    let host = host_routes();
    assert!(
        host.contains(&format!(
            "{} via {} dev {}",
            n2.pod_cidr,
            n2.internal_ip,
            topo.bridge()
        )),
        "{host}"
    );

    // Host → node 1 (underlay), and node 1 → node 2's pod gateway through the host-gw route.
    let node1 = NetNs::open(&n1.netns).unwrap();
    let node2 = NetNs::open(&n2.netns).unwrap();
    let _s1 = serve_tcp(&node1, 7001, "node1").unwrap();
    let _s2 = serve_tcp(&node2, 7002, "node2").unwrap();
    let reply = tcp_ask(
        SocketAddr::new(IpAddr::V4(n1.internal_ip), 7001),
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(reply.identity, "node1");
    assert_eq!(reply.client, IpAddr::V4(topo.host_ip()));
    let gw2 = SocketAddr::new(IpAddr::V4(n2.gateway), 7002);
    let reply = node1
        .run(move || tcp_ask(gw2, Duration::from_secs(2)))
        .unwrap()
        .unwrap();
    assert_eq!(reply.identity, "node2");
    assert_eq!(
        reply.client,
        IpAddr::V4(n1.internal_ip),
        "host-gw routes without NAT"
    );
    // The host reaches a node's pod subnet through its route.
    let gw1 = SocketAddr::new(IpAddr::V4(n1.gateway), 7001);
    assert_eq!(
        tcp_ask(gw1, Duration::from_secs(2)).unwrap().identity,
        "node1"
    );
    drop((_s1, _s2, node1, node2));

    let report = topo.destroy().unwrap();
    assert_eq!(report.namespaces.len(), 2, "{report:?}");
    assert_eq!(ours(&prefix), (vec![], vec![]));
    assert_host_routes_restored(&routes_before, &format!("{prefix}0"), &slot);
    assert!(!data.path().join("topology.json").exists());
}

#[test]
fn cleanup_after_a_crash_finds_everything_by_record_and_name() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = slot.config(2, data.path().to_path_buf());
    let prefix = config.prefix.clone();
    let routes_before = host_routes();
    let topo = Topology::create(config).unwrap();
    // A process left running inside a node (as a crashed agent would leave a container).
    let mut child = svcnet_netns::command(Some(&topo.nodes()[0].netns), "sleep")
        .arg("300")
        .spawn()
        .unwrap();
    // A crash: no destroy, no drop.
    std::mem::forget(topo);
    assert_eq!(ours(&prefix).0.len(), 2);

    let report = cleanup(data.path(), &prefix).unwrap();
    assert!(report.links.contains(&format!("{prefix}0")), "{report:?}");
    assert!(
        !report.killed.is_empty(),
        "the process inside the node is killed: {report:?}"
    );
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert_eq!(ours(&prefix), (vec![], vec![]));
    assert_host_routes_restored(&routes_before, &format!("{prefix}0"), &slot);
    // Running it again is a no-op.
    let again = cleanup(data.path(), &prefix).unwrap();
    assert_eq!(again, Default::default());
}

#[test]
fn create_refuses_leftovers_and_cleans_up_a_failed_create() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = slot.config(1, data.path().to_path_buf());
    let prefix = config.prefix.clone();
    // A namespace that collides with node 1's name: create fails and leaves nothing of its own.
    let squatter = NetNs::create(&format!("{prefix}-node1")).unwrap();
    let err = Topology::create(config).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    let (_, links) = ours(&prefix);
    assert!(links.is_empty(), "{links:?}");
    // cleanup() also removed the squatter (it is named like ours); dropping it is harmless.
    drop(squatter);
    assert_eq!(ours(&prefix), (vec![], vec![]));
}
