//! End to end (needs root): the real `kubectl port-forward` against `svcnet up`, to a pod and
//! to a service, over plain SPDY/3.1 (kubectl 1.27 and 1.30) and over SPDY tunnelled in a
//! WebSocket (kubectl 1.33): curl through the forwarded port, two connections at once through
//! one forward, a large upload, a refused port reported as kubectl reports it, and no socket
//! left in the pod once the client goes away. Address ranges and the name prefix are this
//! test's own; local ports are free ones.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Net, Up, free_port, free_udp_port, is_root, wait_for};

const MANIFEST: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: pfweb
  labels: {app: pfweb}
spec:
  containers:
  - name: web
    image: svcnet-testserver
    ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata:
  name: pfweb
spec:
  selector: {app: pfweb}
  ports: [{port: 80, targetPort: 8080}]
"#;

fn kubectl_bin(version: &str) -> String {
    format!("/usr/lib/google-cloud-sdk/bin/kubectl.{version}")
}

/// A running `kubectl port-forward`, killed on drop.
struct Forward {
    child: Child,
    port: u16,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Forward {
    fn start(up: &Up, version: &str, target: &str, remote: u16) -> Forward {
        let port = free_port().port();
        let mut child = Command::new(kubectl_bin(version))
            .env("KUBECONFIG", up.kubeconfig())
            .args([
                "port-forward",
                "--address",
                "127.0.0.1",
                target,
                &format!("{port}:{remote}"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(
            line.starts_with(&format!("Forwarding from 127.0.0.1:{port} -> ")),
            "kubectl {version} port-forward {target}: {line:?}"
        );
        // Keep draining both pipes so kubectl never blocks on them.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let mut err = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0
                    || tx
                        .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                        .is_err()
                {
                    return;
                }
            }
        });
        Forward {
            child,
            port,
            stderr: rx,
        }
    }

    fn stderr_until(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut seen = String::new();
        while !seen.contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "kubectl never said {needle:?}: {seen:?}");
            if let Ok(s) = self.stderr.recv_timeout(left) {
                seen.push_str(&s);
            }
        }
        seen
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP request on an open connection; the response body.
fn ask(conn: &mut TcpStream, body: &[u8]) -> String {
    let head = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut text = vec![0u8; length];
    reader.read_exact(&mut text).unwrap();
    String::from_utf8_lossy(&text).into_owned()
}

fn connect(port: u16) -> TcpStream {
    let c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

fn curl(port: u16) -> String {
    let out = Command::new("curl")
        .args(["-s", "-m", "5", &format!("http://127.0.0.1:{port}/")])
        .output()
        .unwrap();
    assert!(out.status.success(), "curl through port {port}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Established TCP connections to port 8080 inside the pod's network namespace.
fn pod_connections(netns: &str) -> usize {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "ss", "-Htn", "state", "established"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(":8080 "))
        .count()
}

#[test]
fn kubectl_port_forward() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2epf",
        underlay: "172.29.17.0/24",
        pods: "10.162.0.0/16",
        services: "10.163.0.0/16",
        lb: "10.164.0.0/24",
    };
    let mut up = net.up("1", free_udp_port());
    let manifest = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(manifest.path(), MANIFEST).unwrap();
    up.ok(&["apply", "-f", manifest.path().to_str().unwrap()]);
    wait_for("the pod ready", || {
        let ready = up.ok(&[
            "get",
            "pod",
            "pfweb",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (ready == "True").then_some(ready)
    });

    // Discovery names the subresource as upstream does.
    let v1: serde_json::Value = serde_json::from_str(&up.ok(&["get", "--raw", "/api/v1"])).unwrap();
    let entry = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods/portforward")
        .cloned()
        .unwrap_or_default();
    assert_eq!(entry["kind"], "PodPortForwardOptions", "{entry}");
    assert_eq!(
        entry["verbs"],
        serde_json::json!(["create", "get"]),
        "{entry}"
    );

    // To the pod and to the service (kubectl picks the pod and its target port), over plain
    // SPDY (1.27, 1.30) and over the WebSocket tunnel (1.33).
    for (version, target, remote) in [
        ("1.27", "pod/pfweb", 8080),
        ("1.30", "svc/pfweb", 80),
        ("1.33", "pod/pfweb", 8080),
        ("1.33", "svc/pfweb", 80),
    ] {
        let fwd = Forward::start(&up, version, target, remote);
        let answer = curl(fwd.port);
        assert!(
            answer.contains("pod=pfweb") && answer.contains("client=127.0.0.1"),
            "kubectl {version} port-forward {target}: {answer:?}"
        );
    }

    // Two connections at once through one forward, each used twice, and a 300 KB upload
    // (many frames each way in one stream).
    for version in ["1.29", "1.33"] {
        let fwd = Forward::start(&up, version, "pod/pfweb", 8080);
        let (mut a, mut b) = (connect(fwd.port), connect(fwd.port));
        for _ in 0..2 {
            assert!(ask(&mut a, b"a").contains("pod=pfweb"), "kubectl {version}");
            assert!(ask(&mut b, b"b").contains("pod=pfweb"), "kubectl {version}");
        }
        let big = vec![b'x'; 300 * 1024];
        assert!(ask(&mut a, &big).contains("pod=pfweb"), "kubectl {version}");
    }

    // A port nothing listens on: the connection is refused inside the pod and kubectl says so.
    for version in ["1.29", "1.33"] {
        let fwd = Forward::start(&up, version, "pod/pfweb", 9);
        let _ = Command::new("curl")
            .args(["-s", "-m", "5", &format!("http://127.0.0.1:{}/", fwd.port)])
            .output()
            .unwrap();
        let said = fwd.stderr_until("connection refused");
        assert!(
            said.contains("an error occurred forwarding") && said.contains("-> 9"),
            "kubectl {version}: {said:?}"
        );
    }

    // A client that goes away mid-connection leaves no socket in the pod.
    let netns = wait_for("the pod's network namespace", || {
        let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .find(|n| n.starts_with("e2epf") && n.contains("-pod-"))
            .map(str::to_string)
    });
    for version in ["1.29", "1.33"] {
        let mut fwd = Forward::start(&up, version, "pod/pfweb", 8080);
        let mut held = connect(fwd.port);
        assert!(ask(&mut held, b"hold").contains("pod=pfweb"));
        // Both ends of the one connection on the pod's loopback.
        assert_eq!(pod_connections(&netns), 2, "kubectl {version}");
        fwd.child.kill().unwrap();
        let _ = fwd.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while pod_connections(&netns) > 0 {
            assert!(
                Instant::now() < deadline,
                "kubectl {version}: a connection outlived its client"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // An unknown pod is a clear error.
    let out = Command::new(kubectl_bin("1.33"))
        .env("KUBECONFIG", up.kubeconfig())
        .args(["port-forward", "pod/nope", "1:80"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pods \"nope\" not found"),
        "{out:?}"
    );
    net.stop(&mut up);
}
