//! End to end (needs root): `svcnet up --nodes 2 --pod-network udp`. The Nodes carry flannel's
//! UDP leases; each node has its `flannel0` TUN (MTU 1472, the route for the whole pod CIDR);
//! pods on different nodes reach each other (source kept) and a Service through svcnet's
//! user-space loop, with a transfer of many MTUs; `kill -9` of `up` takes `flannel0` with it,
//! `svcnet down` then leaves nothing; `up` again on the same data dir with `--pod-network
//! vxlan` leaves nothing of the UDP backend; a clean stop leaves nothing. Ranges and prefix are
//! this test's own; traffic stays in its namespaces.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{Net, free_udp_port, ip_in, is_root, wait_for};

#[test]
fn pods_on_two_nodes_talk_over_flannel_udp_and_nothing_is_left() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2eud",
        underlay: "172.29.57.0/24",
        pods: "10.197.0.0/16",
        services: "10.198.0.0/16",
        lb: "10.199.0.0/24",
    };
    let mut up = net.up_with("2", free_udp_port(), &["--pod-network", "udp"]);
    let exec_in = |up: &common::Up, pod: &str, cmd: &str| -> String {
        String::from_utf8_lossy(&up.exec_sh(pod, cmd).stdout)
            .trim()
            .to_string()
    };

    // flannel's UDP leases on both Nodes.
    let yaml = wait_for("both nodes with their UDP leases", || {
        let yaml = up.ok(&["get", "nodes", "-o", "yaml"]);
        (yaml
            .matches("flannel.alpha.coreos.com/backend-type: udp")
            .count()
            == 2)
            .then_some(yaml)
    });
    for (i, ip) in [(1, "172.29.57.2"), (2, "172.29.57.3")] {
        assert!(
            yaml.contains(&format!("flannel.alpha.coreos.com/public-ip: {ip}")),
            "{yaml}"
        );
        assert!(
            yaml.contains(&format!("podCIDR: 10.197.{i}.0/24")),
            "{yaml}"
        );
    }

    // Each node: flannel0 as flannel makes it, and no host-gw route.
    let tun = wait_for("node1's flannel0", || {
        let tun = ip_in("e2eud-node1", &["-d", "link", "show", "flannel0"]);
        tun.contains("mtu 1472").then_some(tun)
    });
    assert!(
        tun.contains("tun type tun") && tun.contains("multi_queue"),
        "{tun}"
    );
    let routes = ip_in("e2eud-node1", &["route", "show"]);
    assert!(routes.contains("10.197.0.0/16 dev flannel0"), "{routes}");
    assert!(
        !routes.contains("via 172.29.57.3"),
        "no host-gw route: {routes}"
    );

    // Pods on both nodes, at MTU 1472.
    let (ip_a, ip_b) = up.start_pods_a_b(&common::pods_a_b("e2eud"));
    assert!(
        ip_a.starts_with("10.197.1.") && ip_b.starts_with("10.197.2."),
        "{ip_a} {ip_b}"
    );
    let link = exec_in(&up, "a", "ip -o link show eth0");
    assert!(link.contains("mtu 1472"), "{link}");

    // Pod to pod across nodes (source kept), the Service whose only endpoint is on the other
    // node, and a transfer of many MTUs, all through the loop.
    let rx_before = ip_in("e2eud-node2", &["-s", "link", "show", "flannel0"]);
    let direct = wait_for("pod a to pod b over the UDP loop", || {
        let reply = exec_in(&up, "a", &format!("curl -s -m 3 http://{ip_b}/"));
        reply.starts_with("pod=b ").then_some(reply)
    });
    assert!(
        direct.contains(&format!("client={ip_a}:")),
        "source kept: {direct}"
    );
    wait_for("the Service from the other node", || {
        let reply = exec_in(
            &up,
            "a",
            "curl -s -m 3 http://b.default.svc.cluster.local:8080/",
        );
        reply.starts_with("pod=b ").then_some(reply)
    });
    // svcnet trace shows the packet's path: the proxy's DNAT to b, then flannel0 (the loop).
    let cip = up.ok(&["get", "svc", "b", "-o", "jsonpath={.spec.clusterIP}"]);
    let v = up.trace_json("e2eud-node1", &[&ip_a, &format!("{cip}:8080")]);
    let how = v["forwarding"][&ip_b].as_str().unwrap_or_default();
    assert!(
        how.contains("dev flannel0") && how.contains("UDP (flannel)"),
        "{v:#}"
    );
    let big = exec_in(
        &up,
        "a",
        &format!("head -c 3000000 /dev/zero | curl -s -m 10 --data-binary @- http://{ip_b}/"),
    );
    assert!(big.starts_with("pod=b "), "a transfer of many MTUs: {big}");
    let rx_after = ip_in("e2eud-node2", &["-s", "link", "show", "flannel0"]);
    assert_ne!(rx_before, rx_after, "node2's flannel0 carried the traffic");

    // Service traffic across nodes over the UDP loop with the other proxy modes too.
    common::service_across_nodes_in_each_proxy_mode(&mut up);

    // kill -9: the loop and its TUN die with the process (the namespaces stay until `down`).
    up.child.kill().unwrap();
    up.child.wait().unwrap();
    let links = ip_in("e2eud-node1", &["link", "show"]);
    assert!(
        !links.contains("flannel0"),
        "flannel0 died with up: {links}"
    );
    let down = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .args(["down", "--prefix", "e2eud", "--data-dir"])
        .arg(up.data_dir.path())
        .output()
        .unwrap();
    assert!(down.status.success(), "{down:?}");
    let left = net.leftovers();
    assert!(left.is_empty(), "left after kill -9 and down: {left:?}");

    // Switching backends is a restart on the same data dir: VXLAN now, nothing of UDP.
    let at = up.extra.iter().position(|a| a == "udp").unwrap();
    up.extra[at] = "vxlan".into();
    up.respawn();
    wait_for("node1's VTEP after the switch", || {
        let links = ip_in("e2eud-node1", &["link", "show"]);
        links.contains("flannel.1").then_some(links)
    });
    // The pods are started again on the new network (with new addresses: read them each time).
    wait_for("pod a to pod b over VXLAN after the switch", || {
        let ip_b = up.ok(&["get", "pod", "b", "-o", "jsonpath={.status.podIP}"]);
        let reply = exec_in(&up, "a", &format!("curl -s -m 3 http://{ip_b}/"));
        reply.starts_with("pod=b ").then_some(reply)
    });
    for node in ["e2eud-node1", "e2eud-node2"] {
        let links = ip_in(node, &["link", "show"]);
        let routes = ip_in(node, &["route", "show"]);
        assert!(
            !links.contains("flannel0") && !routes.contains("flannel0"),
            "{node} keeps nothing of the UDP backend: {links}{routes}"
        );
    }

    // A clean stop leaves no namespace, link or route.
    net.stop(&mut up);
}
