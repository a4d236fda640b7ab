//! End to end (needs root): `svcnet up --nodes 2 --pod-network vxlan`. The Nodes carry
//! flannel's annotations; each node has its `flannel.1` VTEP; pods on different nodes reach each
//! other (source address kept) and a Service over VXLAN, at pod MTU 1450; a Node added while
//! running gets its VTEP entries on the other nodes and loses them when deleted; a clean stop
//! leaves nothing. Ranges and prefix are this test's own; traffic stays in its namespaces.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{Net, free_udp_port, ip_in, is_root, wait_for};

/// A Node that is not one of svcnet's: only its VXLAN lease (flannel's annotations).
const GHOST: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: e2evx-ghost
  annotations:
    flannel.alpha.coreos.com/backend-type: vxlan
    flannel.alpha.coreos.com/backend-data: '{"VNI":1,"VtepMAC":"0e:f1:00:00:00:63"}'
    flannel.alpha.coreos.com/public-ip: 172.29.43.99
    flannel.alpha.coreos.com/kube-subnet-manager: "true"
spec:
  podCIDR: 10.131.9.0/24
"#;

#[test]
fn pods_on_two_nodes_talk_over_flannel_vxlan() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2evx",
        underlay: "172.29.43.0/24",
        pods: "10.131.0.0/16",
        services: "10.132.0.0/16",
        lb: "10.133.0.0/24",
    };
    let mut up = net.up_with("2", free_udp_port(), &["--pod-network", "vxlan"]);
    let exec_in = |pod: &str, cmd: &str| -> String {
        String::from_utf8_lossy(&up.exec_sh(pod, cmd).stdout)
            .trim()
            .to_string()
    };

    // flannel's annotations and spec.podCIDR on both Nodes.
    let yaml = wait_for("both nodes with their VXLAN leases", || {
        let yaml = up.ok(&["get", "nodes", "-o", "yaml"]);
        (yaml
            .matches("flannel.alpha.coreos.com/backend-type: vxlan")
            .count()
            == 2)
            .then_some(yaml)
    });
    for (i, ip) in [(1, "172.29.43.2"), (2, "172.29.43.3")] {
        assert!(
            yaml.contains(&format!("flannel.alpha.coreos.com/public-ip: {ip}")),
            "{yaml}"
        );
        assert!(
            yaml.contains(&format!("podCIDR: 10.131.{i}.0/24")),
            "{yaml}"
        );
        let data = format!(
            r#"flannel.alpha.coreos.com/backend-data: '{{"VNI":1,"VtepMAC":"0e:f1:ac:1d:2b:0{}"}}'"#,
            i + 1
        );
        assert!(yaml.contains(&data), "{data} in\n{yaml}");
    }

    // Each node: its VTEP, and the other node's onlink route learned from its Node.
    let vtep = ip_in("e2evx-node1", &["-d", "link", "show", "flannel.1"]);
    assert!(
        vtep.contains("mtu 1450") && vtep.contains("vxlan id 1"),
        "{vtep}"
    );
    assert!(
        vtep.contains("dstport 8472") && vtep.contains("nolearning"),
        "{vtep}"
    );
    wait_for("node1's route to node2's pods via flannel.1", || {
        let routes = ip_in("e2evx-node1", &["route", "show"]);
        routes
            .contains("10.131.2.0/24 via 10.131.2.0 dev flannel.1 onlink")
            .then_some(routes)
    });
    let routes = ip_in("e2evx-node1", &["route", "show"]);
    assert!(
        !routes.contains("via 172.29.43.3"),
        "no host-gw route: {routes}"
    );

    // Pods on both nodes, at MTU 1450.
    let (ip_a, ip_b) = up.start_pods_a_b(&common::pods_a_b("e2evx"));
    assert!(
        ip_a.starts_with("10.131.1.") && ip_b.starts_with("10.131.2."),
        "{ip_a} {ip_b}"
    );
    let link = exec_in("a", "ip -o link show eth0");
    assert!(link.contains("mtu 1450"), "{link}");

    // Pod to pod across nodes, source kept; pod to the Service whose only endpoint is on the
    // other node (each node's proxy programs it on its own schedule: retry).
    let direct = exec_in("a", &format!("curl -s -m 3 http://{ip_b}/"));
    assert!(direct.starts_with("pod=b "), "{direct}");
    assert!(
        direct.contains(&format!("client={ip_a}:")),
        "source kept: {direct}"
    );
    let rx_before = ip_in("e2evx-node2", &["-s", "link", "show", "flannel.1"]);
    wait_for("the Service from the other node", || {
        let reply = exec_in("a", "curl -s -m 3 http://b.default.svc.cluster.local:8080/");
        reply.starts_with("pod=b ").then_some(reply)
    });
    // svcnet trace shows the packet's path: the proxy's DNAT to b, then flannel.1 to node2.
    let cip = up.ok(&["get", "svc", "b", "-o", "jsonpath={.spec.clusterIP}"]);
    let v = up.trace_json("e2evx-node1", &[&ip_a, &format!("{cip}:8080")]);
    let how = v["forwarding"][&ip_b].as_str().unwrap_or_default();
    assert!(
        how.contains("dev flannel.1")
            && how.contains("VXLAN (flannel)")
            && how.contains("UDP 8472 to 172.29.43.3"),
        "{v:#}"
    );
    let big = exec_in(
        "a",
        &format!("head -c 3000000 /dev/zero | curl -s -m 10 --data-binary @- http://{ip_b}/"),
    );
    assert!(big.starts_with("pod=b "), "a transfer of many MTUs: {big}");
    let rx_after = ip_in("e2evx-node2", &["-s", "link", "show", "flannel.1"]);
    assert_ne!(rx_before, rx_after, "node2's VTEP carried the traffic");

    // flannel.1 deleted by hand: recreated with its peers' entries, as flanneld does.
    let gone = Command::new("ip")
        .args(["-n", "e2evx-node1", "link", "del", "flannel.1"])
        .status()
        .unwrap();
    assert!(gone.success());
    wait_for("node1's VTEP and route back", || {
        let routes = ip_in("e2evx-node1", &["route", "show"]);
        routes
            .contains("10.131.2.0/24 via 10.131.2.0 dev flannel.1 onlink")
            .then_some(routes)
    });
    wait_for("pod a to pod b again", || {
        let reply = exec_in("a", &format!("curl -s -m 3 http://{ip_b}/"));
        reply.starts_with("pod=b ").then_some(reply)
    });

    // A Node added while running: its lease reaches the nodes; deleted: its entries go.
    let ghost = up.data_dir.path().join("ghost.yaml");
    std::fs::write(&ghost, GHOST).unwrap();
    up.ok(&["apply", "-f", ghost.to_str().unwrap()]);
    wait_for("the new node's VTEP entries on node1", || {
        let routes = ip_in("e2evx-node1", &["route", "show"]);
        let neigh = ip_in("e2evx-node1", &["neigh", "show", "dev", "flannel.1"]);
        (routes.contains("10.131.9.0/24 via 10.131.9.0 dev flannel.1 onlink")
            && neigh.contains("10.131.9.0 lladdr 0e:f1:00:00:00:63 PERMANENT"))
        .then_some(routes)
    });
    up.ok(&["delete", "node", "e2evx-ghost"]);
    wait_for("the deleted node's VTEP entries gone from node2", || {
        let routes = ip_in("e2evx-node2", &["route", "show"]);
        let neigh = ip_in("e2evx-node2", &["neigh", "show", "dev", "flannel.1"]);
        let fdb = Command::new("bridge")
            .args(["-n", "e2evx-node2", "fdb", "show", "dev", "flannel.1"])
            .output()
            .unwrap();
        let fdb = String::from_utf8_lossy(&fdb.stdout).into_owned();
        (!routes.contains("10.131.9.")
            && !neigh.contains("10.131.9.")
            && !fdb.contains("0e:f1:00:00:00:63"))
        .then_some(routes)
    });

    // Service traffic across nodes over VXLAN with the other proxy modes too.
    common::service_across_nodes_in_each_proxy_mode(&mut up);

    // A clean stop leaves no namespace, link or route.
    net.stop(&mut up);
}
