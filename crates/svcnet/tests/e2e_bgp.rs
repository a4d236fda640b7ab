//! End to end (needs root and `bird2`): `svcnet up --nodes 2 --pod-network bgp`. The Nodes carry
//! Calico's address annotation and `NetworkUnavailable=False` (`CalicoIsUp`); each node runs its
//! own BIRD, and the routes to the other node's pods are BIRD's (`proto bird`); pods on
//! different nodes reach each other (source kept) and a Service; a Node added while running
//! enters every speaker's config (reloaded), deleted leaves it; a clean stop leaves no BIRD and
//! nothing else; after a `kill -9` of `svcnet up`, no BIRD survives and `svcnet down` leaves
//! nothing; restarted with host-gw, no Calico annotation is left. And `--pod-network ipip` on a
//! kernel without `ipip` fails at start, naming the module, having created nothing. Ranges and
//! prefixes are these tests' own.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Net, free_udp_port, is_root, wait_for};

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: a, labels: {app: a}}
spec:
  nodeName: e2ebgp-node1
  containers: [{name: web, image: test-server, ports: [{name: http, containerPort: 80}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: b, labels: {app: b}}
spec:
  nodeName: e2ebgp-node2
  containers: [{name: web, image: test-server, ports: [{name: http, containerPort: 80}]}]
---
apiVersion: v1
kind: Service
metadata: {name: b}
spec:
  selector: {app: b}
  ports: [{port: 8080, targetPort: http}]
"#;

/// A Node that is not one of svcnet's: only its Calico address and block.
const GHOST: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: e2ebgp-ghost
  annotations:
    projectcalico.org/IPv4Address: 172.29.67.99/24
spec:
  podCIDR: 10.117.9.0/24
"#;

const NET: Net = Net {
    prefix: "e2ebgp",
    underlay: "172.29.67.0/24",
    pods: "10.117.0.0/16",
    services: "10.118.0.0/16",
    lb: "10.119.0.0/24",
};

fn ip_in(netns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .arg("-n")
        .arg(netns)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pids of the BIRDs `svcnet up` started under `data_dir` (from their pid files).
fn bird_pids(data_dir: &Path) -> Vec<u32> {
    ["e2ebgp-node1", "e2ebgp-node2"]
        .iter()
        .filter_map(|n| {
            std::fs::read_to_string(data_dir.join("bird").join(n).join("bird.pid")).ok()
        })
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

fn is_bird(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "bird")
}

/// Starts `svcnet up` again, after it stopped, with its (possibly changed) flags and data dir.
fn start_again(up: &mut common::Up) {
    up.child = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .arg("up")
        .arg("--data-dir")
        .arg(up.data_dir.path())
        .arg("--api-listen")
        .arg(up.api.to_string())
        .args(&up.extra)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    up.wait_ready();
}

fn bird_installed() -> bool {
    Command::new("bird").arg("--version").output().is_ok()
}

#[test]
fn pods_on_two_nodes_talk_over_calico_bgp() {
    if !is_root() || !bird_installed() {
        eprintln!("skipped: needs root and bird2 (CI runs as root and installs bird2)");
        return;
    }
    let mut up = NET.up_with("2", free_udp_port(), &["--pod-network", "bgp"]);
    let exec_in = |up: &common::Up, pod: &str, cmd: &str| -> String {
        String::from_utf8_lossy(&up.exec_sh(pod, cmd).stdout)
            .trim()
            .to_string()
    };

    // Calico's annotation and the condition calico-node sets.
    let yaml = wait_for("both nodes with Calico's address", || {
        let yaml = up.ok(&["get", "nodes", "-o", "yaml"]);
        (yaml.matches("projectcalico.org/IPv4Address:").count() == 2).then_some(yaml)
    });
    for ip in ["172.29.67.2/24", "172.29.67.3/24"] {
        assert!(
            yaml.contains(&format!("projectcalico.org/IPv4Address: {ip}")),
            "{yaml}"
        );
    }
    wait_for(
        "NetworkUnavailable=False (CalicoIsUp) on both nodes",
        || {
            let out = up.ok(&[
            "get",
            "nodes",
            "-o",
            r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="NetworkUnavailable")].status}/{.status.conditions[?(@.type=="NetworkUnavailable")].reason} {end}"#,
        ]);
            (out.trim() == "False/CalicoIsUp False/CalicoIsUp").then_some(out)
        },
    );

    // One BIRD per node, in its namespace; the route to the other node's pods is BIRD's.
    let pids = bird_pids(up.data_dir.path());
    assert_eq!(pids.len(), 2, "a speaker per node");
    for pid in &pids {
        assert!(is_bird(*pid), "pid {pid} is bird");
    }
    for (ns, peer_cidr, peer_ip) in [
        ("e2ebgp-node1", "10.117.2.0/24", "172.29.67.3"),
        ("e2ebgp-node2", "10.117.1.0/24", "172.29.67.2"),
    ] {
        wait_for("the peer's block learnt over BGP", || {
            let routes = ip_in(ns, &["route", "show", "proto", "bird"]);
            routes
                .contains(&format!("{peer_cidr} via {peer_ip} dev eth0"))
                .then_some(routes)
        });
    }

    // Pods on both nodes: pod to pod across nodes (source kept), to a Service, many MTUs.
    let (ip_a, ip_b) = up.start_pods_a_b(PODS);
    assert!(
        ip_a.starts_with("10.117.1.") && ip_b.starts_with("10.117.2."),
        "{ip_a} {ip_b}"
    );
    let direct = exec_in(&up, "a", &format!("curl -s -m 3 http://{ip_b}/"));
    assert!(direct.starts_with("pod=b "), "{direct}");
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
    // svcnet trace shows the packet's path: the proxy's DNAT to b, then BIRD's plain route.
    let cip = up.ok(&["get", "svc", "b", "-o", "jsonpath={.spec.clusterIP}"]);
    let v = up.trace_json("e2ebgp-node1", &[&ip_a, &format!("{cip}:8080")]);
    let how = v["forwarding"][&ip_b].as_str().unwrap_or_default();
    assert!(how.contains("BGP (Calico)"), "{v:#}");
    let big = exec_in(
        &up,
        "a",
        &format!("head -c 3000000 /dev/zero | curl -s -m 10 --data-binary @- http://{ip_b}/"),
    );
    assert!(big.starts_with("pod=b "), "a transfer of many MTUs: {big}");

    // A Node added while running enters both speakers' mesh (config rewritten, BIRD reloaded);
    // deleted, it leaves.
    let conf1 = up.data_dir.path().join("bird/e2ebgp-node1/bird.conf");
    let ghost = up.data_dir.path().join("ghost.yaml");
    std::fs::write(&ghost, GHOST).unwrap();
    up.ok(&["apply", "-f", ghost.to_str().unwrap()]);
    let session = "Mesh_172_29_67_99";
    // Node 1's config file and its running BIRD's protocols.
    let node1 = || {
        let conf = std::fs::read_to_string(&conf1).unwrap_or_default();
        let out = Command::new("birdc")
            .arg("-s")
            .arg(conf1.with_file_name("bird.ctl"))
            .args(["show", "protocols"])
            .output()
            .unwrap();
        (conf, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    wait_for("the new node in node1's running BIRD", || {
        let (conf, protocols) = node1();
        (conf.contains("neighbor 172.29.67.99 as 64512") && protocols.contains(session))
            .then_some(protocols)
    });
    up.ok(&["delete", "node", "e2ebgp-ghost"]);
    wait_for("the deleted node out of node1's BIRD", || {
        let (conf, protocols) = node1();
        (!conf.contains("172.29.67.99") && !protocols.contains(session)).then_some(protocols)
    });

    // Service traffic across nodes over BGP's routes with the other proxy modes too (each a
    // restart: the speakers of the last one are the ones that must not outlive the stop).
    common::service_across_nodes_in_each_proxy_mode(&mut up);
    let pids = wait_for("both speakers after the restarts", || {
        let pids = bird_pids(up.data_dir.path());
        (pids.len() == 2 && pids.iter().all(|p| is_bird(*p))).then(|| format!("{pids:?}"))
    });
    let pids: Vec<u32> = serde_json::from_str(&pids).unwrap();

    // A clean stop: no BIRD left, nothing else left.
    NET.stop(&mut up);
    for pid in &pids {
        assert!(!is_bird(*pid), "bird {pid} outlived svcnet up");
    }

    // Again, then `kill -9`: the speakers die with svcnet up; `svcnet down` leaves nothing.
    start_again(&mut up);
    let pids = wait_for("both speakers up again", || {
        let pids = bird_pids(up.data_dir.path());
        (pids.len() == 2 && pids.iter().all(|p| is_bird(*p))).then(|| format!("{pids:?}"))
    });
    up.child.kill().unwrap();
    up.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while bird_pids(up.data_dir.path()).iter().any(|p| is_bird(*p)) {
        assert!(Instant::now() < deadline, "birds {pids} outlived kill -9");
        std::thread::sleep(Duration::from_millis(100));
    }
    let down = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .args(["down", "--prefix", NET.prefix, "--data-dir"])
        .arg(up.data_dir.path())
        .output()
        .unwrap();
    assert!(down.status.success(), "{down:?}");
    let left = NET.leftovers();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!up.data_dir.path().join("bird").exists());

    // Switching backends is a restart on the same data dir: host-gw keeps no Calico annotation.
    up.extra = up
        .extra
        .iter()
        .map(|a| {
            if a == "bgp" {
                "host-gw".into()
            } else {
                a.clone()
            }
        })
        .collect();
    start_again(&mut up);
    let yaml = wait_for("both nodes re-registered with host-gw", || {
        let yaml = up.ok(&["get", "nodes", "-o", "yaml"]);
        (yaml
            .matches("flannel.alpha.coreos.com/backend-type: host-gw")
            .count()
            == 2)
            .then_some(yaml)
    });
    assert!(!yaml.contains("projectcalico.org/"), "{yaml}");
    assert!(
        !up.data_dir.path().join("bird").exists(),
        "no speaker with host-gw"
    );
    NET.stop(&mut up);
}

#[test]
fn ipip_without_the_kernel_module_fails_at_start_naming_it() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    if svcnet_agent::podnet::ipip::kernel_support().is_ok() {
        eprintln!("skipped: this kernel has ipip (the UML tier tests IPIP itself)");
        return;
    }
    let net = Net {
        prefix: "e2eipip",
        underlay: "172.29.68.0/24",
        pods: "10.127.0.0/16",
        services: "10.128.0.0/16",
        lb: "10.129.0.0/24",
    };
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .arg("up")
        .arg("--data-dir")
        .arg(data.path())
        .arg("--api-listen")
        .arg(common::free_port().to_string())
        .args([
            "--nodes",
            "2",
            "--prefix",
            net.prefix,
            "--underlay",
            net.underlay,
            "--pod-cidr",
            net.pods,
            "--service-cidr",
            net.services,
            "--lb-pool",
            net.lb,
            "--dns-listen",
            &free_udp_port().to_string(),
            "--pod-network",
            "ipip",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("svcnet up --pod-network ipip did not fail at start");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("kernel module `ipip`") && stderr.contains("CONFIG_NET_IPIP"),
        "{stderr}"
    );
    let left = net.leftovers();
    assert!(left.is_empty(), "created before failing: {left:?}");
}
