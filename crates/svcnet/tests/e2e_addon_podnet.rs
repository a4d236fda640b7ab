//! End to end (needs root): the add-on's pod network. `svcnet up --nodes 2 --disable
//! proxy,dns,pod-network` leaves the nodes without inter-node pod routes; `deploy/svcnet.yaml`
//! applied unchanged with the real kubectl then runs flanneld's job from the `svcnet-cni`
//! DaemonSet's pods (VXLAN, its default): both Nodes carry flannel's annotations with their
//! VTEP's MAC and `NetworkUnavailable=False`; each node namespace has `flannel.1` with the
//! other node's neighbour, FDB and onlink route entries; a Node added while running gets its
//! entries, and loses them when deleted; pods (at the backend's MTU, 1450) on node 1 reach a pod
//! on node 2 by pod IP with their source address kept, with a transfer of many MTUs byte-exact,
//! and through its Service (programmed by the add-on's proxy pods); `kubectl delete -f` leaves
//! neither node a `flannel.1` or a route through it, and no CNI files on the machine.
//!
//! The prefix, underlay, pod CIDR and load-balancer pool are this test's own. The service CIDR
//! is 10.96.0.0/16, because the manifest's `kube-dns` Service is at 10.96.0.10; that range's
//! host route and the CNI DaemonSet's hostPath files (`/opt/cni/bin/svcnet`,
//! `/etc/cni/net.d/10-svcnet.conflist`, on this machine as on a node) are shared with
//! `e2e_addon` and `readme`, so nextest runs the three one at a time (`.config/nextest.toml`).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{Net, free_udp_port, ip_in, is_root, wait_for};

use common::{CNI_CONFLIST as CONFLIST, CNI_PLUGIN as PLUGIN};
const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/svcnet.yaml");

const NET: Net = Net {
    prefix: "e2ean",
    underlay: "172.29.77.0/24",
    pods: "10.231.0.0/16",
    services: "10.96.0.0/16",
    lb: "10.232.0.0/24",
};

/// A Node that is not one of svcnet's: only its VXLAN lease.
const GHOST: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: e2ean-ghost
  annotations:
    flannel.alpha.coreos.com/backend-type: vxlan
    flannel.alpha.coreos.com/backend-data: '{"VNI":1,"VtepMAC":"0e:f1:00:00:00:64"}'
    flannel.alpha.coreos.com/public-ip: 172.29.77.99
    flannel.alpha.coreos.com/kube-subnet-manager: "true"
spec:
  podCIDR: 10.231.9.0/24
"#;

fn bridge_fdb(netns: &str) -> String {
    let out = Command::new("bridge")
        .args(["-n", netns, "fdb", "show", "dev", "flannel.1"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The tests of this file share the CNI files and the prefix: one at a time, also under
/// `cargo test`'s threads (nextest runs them one at a time anyway).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_addon_runs_the_vxlan_pod_network() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let _installed = common::CniFiles::claim();
    let mut up = NET.up_with(
        "2",
        free_udp_port(),
        &["--disable", "proxy,dns,pod-network"],
    );
    let (n1, n2) = ("e2ean-node1", "e2ean-node2");
    // svcnet up routes nothing between the nodes and publishes no lease.
    let routes = ip_in(n1, &["route", "show"]);
    assert!(!routes.contains("10.231.2.0/24"), "{routes}");
    assert!(ip_in(n1, &["link", "show", "flannel.1"]).is_empty());
    let nodes = up.ok(&["get", "nodes", "-o", "yaml"]);
    assert!(!nodes.contains("flannel.alpha.coreos.com"), "{nodes}");

    // The add-on, unchanged.
    up.ok(&["apply", "-f", MANIFEST]);
    for what in ["ds/svcnet-cni", "ds/svcnet-proxy"] {
        up.ok(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            what,
            "--timeout=120s",
        ]);
    }

    // flannel's leases, with each VTEP's MAC, and the condition.
    let yaml = wait_for("both nodes with their VXLAN leases", || {
        let yaml = up.ok(&["get", "nodes", "-o", "yaml"]);
        (yaml
            .matches("flannel.alpha.coreos.com/backend-type: vxlan")
            .count()
            == 2)
            .then_some(yaml)
    });
    for (node, ip) in [(n1, "172.29.77.2"), (n2, "172.29.77.3")] {
        let mac = svcnet_agent::ip::link_mac(Some(node), "flannel.1").unwrap();
        let data =
            format!(r#"flannel.alpha.coreos.com/backend-data: '{{"VNI":1,"VtepMAC":"{mac}"}}'"#);
        assert!(yaml.contains(&data), "{data} in\n{yaml}");
        assert!(
            yaml.contains(&format!("flannel.alpha.coreos.com/public-ip: {ip}")),
            "{yaml}"
        );
    }
    let conditions = up.ok(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="NetworkUnavailable")].status}/{.status.conditions[?(@.type=="NetworkUnavailable")].reason} {end}"#,
    ]);
    assert_eq!(conditions.trim(), "False/FlannelIsUp False/FlannelIsUp");

    // Each node: its VTEP, and the other node's entries in flannel's shape.
    let peers = [(n1, n2, "172.29.77.3", 2), (n2, n1, "172.29.77.2", 1)];
    for (node, peer, peer_ip, j) in peers {
        let vtep = ip_in(node, &["-d", "link", "show", "flannel.1"]);
        assert!(
            vtep.contains("mtu 1450") && vtep.contains("vxlan id 1"),
            "{vtep}"
        );
        assert!(
            vtep.contains("dstport 8472") && vtep.contains("nolearning"),
            "{vtep}"
        );
        let peer_mac = svcnet_agent::ip::link_mac(Some(peer), "flannel.1").unwrap();
        wait_for(&format!("{node}'s entries for {peer}"), || {
            let routes = ip_in(node, &["route", "show"]);
            let neigh = ip_in(node, &["neigh", "show", "dev", "flannel.1"]);
            let fdb = bridge_fdb(node);
            (routes.contains(&format!(
                "10.231.{j}.0/24 via 10.231.{j}.0 dev flannel.1 onlink"
            )) && neigh.contains(&format!("10.231.{j}.0 lladdr {peer_mac} PERMANENT"))
                && fdb.contains(&format!("{peer_mac} dst {peer_ip} self permanent")))
            .then_some(routes)
        });
    }
    let conflist = std::fs::read_to_string(CONFLIST).unwrap();
    assert!(conflist.contains("\"mtu\": 1450"), "{conflist}");

    // A Node added while running: its lease reaches both nodes; deleted: its entries go.
    let ghost = up.data_dir.path().join("ghost.yaml");
    std::fs::write(&ghost, GHOST).unwrap();
    up.ok(&["apply", "-f", ghost.to_str().unwrap()]);
    for node in [n1, n2] {
        wait_for(&format!("the new node's entries on {node}"), || {
            let routes = ip_in(node, &["route", "show"]);
            let neigh = ip_in(node, &["neigh", "show", "dev", "flannel.1"]);
            (routes.contains("10.231.9.0/24 via 10.231.9.0 dev flannel.1 onlink")
                && neigh.contains("10.231.9.0 lladdr 0e:f1:00:00:00:64 PERMANENT"))
            .then_some(routes)
        });
    }
    up.ok(&["delete", "node", "e2ean-ghost"]);
    wait_for("the deleted node's entries gone", || {
        let left: Vec<String> = [n1, n2]
            .iter()
            .flat_map(|node| {
                [
                    ip_in(node, &["route", "show"]),
                    ip_in(node, &["neigh", "show", "dev", "flannel.1"]),
                    bridge_fdb(node),
                ]
            })
            .filter(|t| t.contains("10.231.9.") || t.contains("0e:f1:00:00:00:64"))
            .collect();
        left.is_empty().then_some(String::new())
    });

    // Pods on both nodes, attached at the add-on's MTU.
    let (ip_a, ip_b) = up.start_pods_a_b(&common::pods_a_b("e2ean"));
    assert!(
        ip_a.starts_with("10.231.1.") && ip_b.starts_with("10.231.2."),
        "{ip_a} {ip_b}"
    );
    let exec_in = |pod: &str, cmd: &str| -> String {
        String::from_utf8_lossy(&up.exec_sh(pod, cmd).stdout)
            .trim()
            .to_string()
    };
    let link = exec_in("a", "ip -o link show eth0");
    assert!(link.contains("mtu 1450"), "{link}");

    // Pod to pod across nodes over the VTEPs, source kept.
    let rx_before = ip_in(n2, &["-s", "-j", "link", "show", "flannel.1"]);
    let direct = exec_in("a", &format!("curl -s -m 3 http://{ip_b}/"));
    assert!(direct.starts_with("pod=b "), "{direct}");
    assert!(
        direct.contains(&format!("client={ip_a}:")),
        "source kept: {direct}"
    );
    // A transfer of many MTUs each way, byte-exact: 3 MB sent to b's `/echo` and back.
    let payload = up.data_dir.path().join("payload");
    let bytes: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&payload, &bytes).unwrap();
    let want = sha256(&bytes);
    let got = exec_in(
        "a",
        &format!(
            "curl -s -m 20 --data-binary @{} http://{ip_b}/echo | sha256sum",
            payload.display()
        ),
    );
    assert!(
        got.starts_with(&want),
        "sha256 {want} of 3 MB sent, of what came back: {got}"
    );
    let rx_after = ip_in(n2, &["-s", "-j", "link", "show", "flannel.1"]);
    assert_ne!(rx_before, rx_after, "node2's VTEP carried the traffic");

    // Through the Service, whose only endpoint is on the other node (the add-on's proxy on
    // node 1 programs it on its own schedule: retry).
    let cluster_ip = up.ok(&["get", "svc", "b", "-o", "jsonpath={.spec.clusterIP}"]);
    wait_for("the Service from the other node", || {
        let reply = exec_in("a", &format!("curl -s -m 3 http://{cluster_ip}:8080/"));
        reply.starts_with("pod=b ").then_some(reply)
    });

    // A rolling update of the CNI DaemonSet keeps each VTEP (the new pod adopts it: same
    // interface index) and its entries, and traffic keeps flowing.
    let vtep_index = |node: &str| -> String {
        let link = ip_in(node, &["-j", "link", "show", "flannel.1"]);
        let v: serde_json::Value = serde_json::from_str(&link).unwrap();
        v[0]["ifindex"].to_string()
    };
    let cni_pods = || {
        up.ok(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "k8s-app=svcnet-cni",
            "-o",
            "name",
        ])
    };
    let (indexes, old_pods) = ([vtep_index(n1), vtep_index(n2)], cni_pods());
    up.ok(&["-n", "kube-system", "rollout", "restart", "ds/svcnet-cni"]);
    up.ok(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "ds/svcnet-cni",
        "--timeout=120s",
    ]);
    let new_pods = cni_pods();
    assert!(
        old_pods.lines().all(|p| !new_pods.contains(p)),
        "the CNI pods were not replaced:\n{old_pods}\n{new_pods}"
    );
    assert_eq!(
        [vtep_index(n1), vtep_index(n2)],
        indexes,
        "a VTEP was made anew"
    );
    let routes = ip_in(n1, &["route", "show"]);
    assert!(
        routes.contains("10.231.2.0/24 via 10.231.2.0 dev flannel.1 onlink"),
        "{routes}"
    );
    let direct = exec_in("a", &format!("curl -s -m 3 http://{ip_b}/"));
    assert!(direct.starts_with("pod=b "), "after the update: {direct}");

    // Deleting the add-on removes the VTEPs and the routes through them, and the CNI files.
    // (The CNI pods' logs are followed, for the failure message: they go with the pods.)
    let followed: Vec<(std::path::PathBuf, std::process::Child)> = new_pods
        .lines()
        .map(|pod| {
            let file = up.data_dir.path().join(pod.replace('/', "_") + ".log");
            let out = std::fs::File::create(&file).unwrap();
            let child = Command::new(common::KUBECTL)
                .env("KUBECONFIG", up.kubeconfig())
                .args(["-n", "kube-system", "logs", "-f", pod])
                .stdout(out)
                .spawn()
                .unwrap();
            (file, child)
        })
        .collect();
    up.ok(&["delete", "-f", MANIFEST, "--wait=true"]);
    wait_for("the add-on's pods gone", || {
        let out = up.ok(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "--no-headers",
            "-o",
            "name",
        ]);
        (!out.contains("svcnet-")).then_some(out)
    });
    let left_behind = || {
        let mut left: Vec<String> = Vec::new();
        for node in [n1, n2] {
            if ip_in(node, &["link", "show"]).contains("flannel.1") {
                left.push(format!("{node}: flannel.1"));
            }
            for route in ip_in(node, &["route", "show"]).lines() {
                let peer_route = ["10.231.1.0/24 via", "10.231.2.0/24 via"]
                    .iter()
                    .any(|r| route.contains(r));
                if route.contains("flannel") || peer_route {
                    left.push(format!("{node}: {route}"));
                }
            }
        }
        left.extend(
            [PLUGIN, CONFLIST]
                .iter()
                .filter(|p| Path::new(p).exists())
                .map(|p| p.to_string()),
        );
        left
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut left = left_behind();
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        left = left_behind();
    }
    let logs: String = followed
        .into_iter()
        .map(|(file, mut child)| {
            let _ = child.kill();
            let _ = child.wait();
            std::fs::read_to_string(file).unwrap_or_default()
        })
        .collect();
    assert!(
        left.is_empty(),
        "left after the add-on's deletion: {left:?}; the CNI pods' logs:\n{logs}"
    );
    NET.stop(&mut up);
}

/// The add-on's other backends, picked by the one flag the manifest says to change
/// (`--pod-network=host-gw`, then `udp`, with `--cluster-cidr` this test's pod CIDR): each
/// publishes its lease, gives pods its MTU and carries pod to pod across the nodes with the
/// source kept; its deletion removes its routes (host-gw) or its TUN (udp).
#[test]
fn the_addon_runs_host_gw_or_udp_when_asked() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let _installed = common::CniFiles::claim();
    let mut up = NET.up_with(
        "2",
        free_udp_port(),
        &["--disable", "proxy,dns,pod-network"],
    );
    let (n1, n2) = ("e2ean-node1", "e2ean-node2");
    let original = std::fs::read_to_string(MANIFEST).unwrap();
    for (backend, mtu) in [("host-gw", 1500), ("udp", 1472)] {
        let manifest = up.data_dir.path().join(format!("svcnet-{backend}.yaml"));
        let edited = original
            .replace("--pod-network=vxlan", &format!("--pod-network={backend}"))
            .replace(
                "--cluster-cidr=10.244.0.0/16",
                "--cluster-cidr=10.231.0.0/16",
            );
        assert_ne!(edited, original, "the manifest's flags changed");
        std::fs::write(&manifest, edited).unwrap();
        let manifest = manifest.to_str().unwrap();
        up.ok(&["apply", "-f", manifest]);
        up.ok(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "ds/svcnet-cni",
            "--timeout=120s",
        ]);
        wait_for(&format!("both nodes with their {backend} leases"), || {
            let yaml = up.ok(&["get", "nodes", "-o", "yaml"]);
            let want = format!("flannel.alpha.coreos.com/backend-type: {backend}");
            (yaml.matches(&want).count() == 2).then_some(yaml)
        });
        let (device, route) = match backend {
            "host-gw" => ("", "10.231.2.0/24 via 172.29.77.3 dev eth0"),
            _ => ("flannel0", "10.231.0.0/16 dev flannel0"),
        };
        wait_for(&format!("node1's {backend} route"), || {
            let routes = ip_in(n1, &["route", "show"]);
            routes.contains(route).then_some(routes)
        });
        let (ip_a, ip_b) = up.start_pods_a_b(&common::pods_a_b("e2ean"));
        let exec_in = |pod: &str, cmd: &str| -> String {
            String::from_utf8_lossy(&up.exec_sh(pod, cmd).stdout)
                .trim()
                .to_string()
        };
        let link = exec_in("a", "ip -o link show eth0");
        assert!(link.contains(&format!("mtu {mtu}")), "{backend}: {link}");
        let direct = exec_in("a", &format!("curl -s -m 3 http://{ip_b}/"));
        assert!(
            direct.starts_with("pod=b ") && direct.contains(&format!("client={ip_a}:")),
            "{backend}: pod to pod, source kept: {direct}"
        );
        up.ok(&[
            "delete",
            "-f",
            up.data_dir.path().join("pods.yaml").to_str().unwrap(),
            "--wait=true",
        ]);
        up.ok(&["delete", "-f", manifest, "--wait=true"]);
        wait_for(&format!("{backend}'s routes and device gone"), || {
            let mut left: Vec<String> = Vec::new();
            for node in [n1, n2] {
                for r in ip_in(node, &["route", "show"]).lines() {
                    if r.contains("via 172.29.77.") || r.contains("flannel") {
                        left.push(format!("{node}: {r}"));
                    }
                }
                if !device.is_empty() && ip_in(node, &["link", "show"]).contains(device) {
                    left.push(format!("{node}: {device}"));
                }
            }
            left.extend(
                [PLUGIN, CONFLIST]
                    .iter()
                    .filter(|p| Path::new(p).exists())
                    .map(|p| p.to_string()),
            );
            left.is_empty().then(String::new)
        });
    }
    NET.stop(&mut up);
}
