//! End to end: NetworkPolicy enforced by `svcnet up`'s node, driven by the real `kubectl`:
//! a policy lets one client in and keeps another out, by pod IP and through the Service IP
//! (judged after the proxy's DNAT); deleting it opens the server again. And what a new policy
//! does to an established connection, with and without `--network-policy-cut-existing`.
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::{Net, Up, free_udp_port, is_root, wait_for};

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: server}}
spec:
  containers:
  - name: web
    image: test-server
    ports: [{name: http, containerPort: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: server}
spec:
  selector: {app: server}
  ports: [{port: 8080, targetPort: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  containers: [{name: c, image: test-server}]
---
apiVersion: v1
kind: Pod
metadata: {name: other, labels: {app: other}}
spec:
  containers: [{name: c, image: test-server}]
"#;

const POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-client}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]
"#;

/// Whether `pod` gets an answer from `url` (curl inside the pod's network namespace).
fn reaches(up: &Up, pod: &str, url: &str) -> bool {
    let out = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .args(["exec", "--data-dir"])
        .arg(up.data_dir.path())
        .args([pod, "--", "curl", "-s", "-m", "2", url])
        .output()
        .unwrap();
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("pod=server")
}

fn apply(up: &Up, manifest: &str) {
    let path = up.data_dir.path().join("netpol-test.yaml");
    std::fs::write(&path, manifest).unwrap();
    up.ok(&["apply", "-f", path.to_str().unwrap()]);
}

#[test]
fn a_policy_lets_one_client_in_and_keeps_another_out_also_through_the_service() {
    scenario(
        &Net {
            prefix: "e2enp",
            underlay: "172.29.29.0/24",
            pods: "10.138.0.0/16",
            services: "10.139.0.0/16",
            lb: "10.137.0.0/24",
        },
        "nftables",
    );
}

/// The same with the iptables proxy: its DNAT (nat PREROUTING) also comes before the policy.
#[test]
fn the_same_with_the_iptables_proxy() {
    scenario(
        &Net {
            prefix: "e2eip",
            underlay: "172.29.30.0/24",
            pods: "10.136.0.0/16",
            services: "10.135.0.0/16",
            lb: "10.134.0.0/24",
        },
        "iptables",
    );
}

/// The same with the IPVS proxy, which DNATs at input and sends the connection on from the
/// output hook (no forward hook): in the QEMU tier (Debian's kernel has ip_vs and nf_tables;
/// this host's kernel has no ip_vs, user-mode Linux no nf_tables for ip); skipped elsewhere.
#[test]
fn ipvs_the_same_with_the_ipvs_proxy() {
    if !svcnet_netns::test_support::vm_guest() {
        return;
    }
    scenario(
        &Net {
            prefix: "e2eiv",
            underlay: "172.29.31.0/24",
            pods: "10.124.0.0/16",
            services: "10.125.0.0/16",
            lb: "10.126.0.0/24",
        },
        "ipvs",
    );
}

/// The same with the userspace proxy, which accepts the client's connection on the node and
/// opens its own to the endpoint: it judges (client → the endpoint it chose) itself.
#[test]
fn the_same_with_the_userspace_proxy() {
    scenario(
        &Net {
            prefix: "e2eus",
            underlay: "172.29.32.0/24",
            pods: "10.224.0.0/16",
            services: "10.225.0.0/16",
            lb: "10.226.0.0/24",
        },
        "userspace",
    );
}

/// `svcnet up` on `net` with `extra` flags, the pods and Service applied and ready.
fn start(net: &Net, extra: &[&str]) -> Up {
    let up = net.up_with("1", free_udp_port(), extra);
    apply(&up, PODS);
    up.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/server",
        "pod/client",
        "pod/other",
        "--timeout=60s",
    ]);
    up
}

fn scenario(net: &Net, mode: &str) {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut up = start(net, &["--proxy-mode", mode]);
    let pod_ip = up.ok(&["get", "pod", "server", "-o", "jsonpath={.status.podIP}"]);
    let svc_ip = up.ok(&["get", "svc", "server", "-o", "jsonpath={.spec.clusterIP}"]);
    let direct = format!("http://{pod_ip}/");
    let service = format!("http://{svc_ip}:8080/");
    let all_reach = |up: &Up, expected: [bool; 4]| {
        [
            reaches(up, "client", &direct),
            reaches(up, "client", &service),
            reaches(up, "other", &direct),
            reaches(up, "other", &service),
        ] == expected
    };
    wait_for("both clients reach the server before any policy", || {
        all_reach(&up, [true; 4]).then_some(String::new())
    });

    apply(&up, POLICY);
    wait_for(
        "only the client reaches the server under the policy",
        || all_reach(&up, [true, true, false, false]).then_some(String::new()),
    );
    // It stays so: the deny is the table's, not a transient.
    assert!(all_reach(&up, [true, true, false, false]));
    // A new pod the policy selects is isolated before it starts: from its first probe on.
    apply(
        &up,
        "{apiVersion: v1, kind: Pod, metadata: {name: server2, labels: {app: server}}, \
         spec: {containers: [{name: web, image: test-server, ports: [{name: http, containerPort: 80}]}]}}",
    );
    up.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/server2",
        "--timeout=60s",
    ]);
    let ip2 = up.ok(&["get", "pod", "server2", "-o", "jsonpath={.status.podIP}"]);
    let url2 = format!("http://{ip2}/");
    let (other, client) = (reaches(&up, "other", &url2), reaches(&up, "client", &url2));
    assert!(!other && client, "server2: other {other}, client {client}");

    // svcnet trace names the policy that let the client in and the one that keeps the
    // other out, for the Service's endpoint (from the rules of each proxy mode, IPVS's virtual
    // servers included).
    trace_names_the_policies(&up, &svc_ip, &pod_ip, mode == "userspace");

    up.ok(&["delete", "networkpolicy", "server-from-client"]);
    wait_for(
        "both clients reach the server once the policy is deleted",
        || all_reach(&up, [true; 4]).then_some(String::new()),
    );
    net.stop(&mut up);
}

/// `svcnet trace` from the client and from the other pod to the Service: the policy that lets
/// the first in, the one that keeps the second out.
fn trace_names_the_policies(up: &Up, svc_ip: &str, pod_ip: &str, userspace: bool) {
    let trace = |from: &str| {
        let ip = up.ok(&["get", "pod", from, "-o", "jsonpath={.status.podIP}"]);
        let out = Command::new(env!("CARGO_BIN_EXE_svcnet"))
            .args(["trace", "--data-dir"])
            .arg(up.data_dir.path())
            .args([ip.as_str(), &format!("{svc_ip}:8080")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The userspace proxy's part follows its listener: the endpoint it relays to, with the
    // verdict it applies.
    let label = if userspace {
        "network policy (judged by the proxy)"
    } else {
        "network policy"
    };
    let allowed = trace("client");
    if userspace {
        assert!(
            allowed.contains("relays each connection to one of 2 endpoints, from the node:")
                && allowed.contains(&format!("\n    {pod_ip}:80\n")),
            "{allowed}"
        );
    }
    assert!(
        allowed.contains(&format!("{label}: allowed (egress: not isolated; ingress: allowed by default/server-from-client rule 0)")),
        "{allowed}"
    );
    let denied = trace("other");
    assert!(
        denied.contains(&format!("{label}: denied (egress: not isolated; ingress: denied (isolated by default/server-from-client))")),
        "{denied}"
    );
}

/// A keep-alive HTTP connection opened from inside pod `default/<pod>`'s network namespace.
struct Held {
    reader: BufReader<TcpStream>,
}

impl Held {
    fn open(up: &Up, pod: &str, to: SocketAddr) -> std::io::Result<Held> {
        let record = svcnet_agent::exec::find_pod(up.data_dir.path(), "default", pod).unwrap();
        let ns = svcnet_netns::NetNs::open(&record.sandbox.netns).unwrap();
        let stream = ns
            .run(|| TcpStream::connect_timeout(&to, Duration::from_secs(2)))
            .unwrap()?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(Held {
            reader: BufReader::new(stream),
        })
    }

    /// One request on the connection; `Err` says how it failed.
    fn ask(&mut self) -> Result<String, String> {
        self.reader
            .get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: server\r\n\r\n")
            .map_err(|e| format!("write: {e}"))?;
        let mut length = 0;
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("closed".into());
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().map_err(|e| format!("length: {e}"))?;
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        std::io::Read::read_exact(&mut self.reader, &mut body).map_err(|e| format!("body: {e}"))?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

/// What a new policy does to an established connection it now denies: without
/// `--network-policy-cut-existing` (upstream's intent) the connection lives on; with it, the
/// node deletes the flow's conntrack entry and the connection's next packet is judged as new
/// and refused. The connection is held from inside the `other` pod's network namespace
/// (keep-alive HTTP to the server by pod IP).
#[test]
fn an_established_connection_a_new_policy_denies_is_cut_only_with_the_option() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2ecx",
        underlay: "172.29.41.0/24",
        pods: "10.221.0.0/16",
        services: "10.222.0.0/16",
        lb: "10.223.0.0/24",
    };
    // With the nftables proxy, a connection to the pod IP (the node's conntrack pass cuts
    // it); with the userspace proxy, one through the Service IP, which the proxy relays (it
    // judges its connections again and closes the denied ones).
    for (mode, cut) in [
        ("nftables", false),
        ("nftables", true),
        ("userspace", false),
        ("userspace", true),
    ] {
        let mut extra = vec!["--proxy-mode", mode];
        if cut {
            extra.push("--network-policy-cut-existing");
        }
        let mut up = start(&net, &extra);
        let to = if mode == "userspace" {
            let ip = up.ok(&["get", "svc", "server", "-o", "jsonpath={.spec.clusterIP}"]);
            SocketAddr::new(ip.trim().parse().unwrap(), 8080)
        } else {
            let ip = up.ok(&["get", "pod", "server", "-o", "jsonpath={.status.podIP}"]);
            SocketAddr::new(ip.trim().parse().unwrap(), 80)
        };
        let mut held = Held::open(&up, "other", to).unwrap();
        let first = held.ask().unwrap();
        assert!(first.contains("pod=server"), "{first}");

        apply(&up, POLICY);
        // The policy is live once a new connection from `other` is refused.
        wait_for("a new connection from other is refused", || {
            let refused = Held::open(&up, "other", to).map_or(true, |mut h| h.ask().is_err());
            refused.then_some(String::new())
        });
        // Give the sync's conntrack pass (it follows the table's transaction) a moment.
        std::thread::sleep(Duration::from_millis(500));
        let after = held.ask();
        if cut {
            assert!(
                after.is_err(),
                "{mode}: with --network-policy-cut-existing the established connection was kept: {after:?}"
            );
        } else {
            assert!(
                after.as_ref().is_ok_and(|b| b.contains("pod=server")),
                "{mode}: without the option the established connection was cut: {after:?}"
            );
            // And it stays usable.
            assert!(held.ask().is_ok());
        }
        drop(held);
        net.stop(&mut up);
    }
}
