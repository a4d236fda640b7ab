//! End to end: what a new NetworkPolicy does to a connection it now denies that is already
//! established. Without `--network-policy-cut-existing` (upstream's intent) the connection
//! lives on; with it, the node deletes the flow's conntrack entry and the connection's next
//! packet is judged as new and refused. The connection is held from inside the `other` pod's
//! network namespace (keep-alive HTTP to the test server by pod IP).
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
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
kind: Pod
metadata: {name: other, labels: {app: other}}
spec:
  containers: [{name: c, image: test-server}]
"#;

/// Only `client` pods may reach the server: `other` is denied from now on.
const POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-client}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
"#;

fn apply(up: &Up, manifest: &str) {
    let path = up.data_dir.path().join("netpol-cut-test.yaml");
    std::fs::write(&path, manifest).unwrap();
    up.ok(&["apply", "-f", path.to_str().unwrap()]);
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
    for cut in [false, true] {
        let mut extra = vec!["--proxy-mode", "nftables"];
        if cut {
            extra.push("--network-policy-cut-existing");
        }
        let mut up = net.up_with("1", free_udp_port(), &extra);
        apply(&up, PODS);
        up.ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/server",
            "pod/other",
            "--timeout=60s",
        ]);
        let ip = up.ok(&["get", "pod", "server", "-o", "jsonpath={.status.podIP}"]);
        let to = SocketAddr::new(ip.trim().parse().unwrap(), 80);
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
                "with --network-policy-cut-existing the established connection was kept: {after:?}"
            );
        } else {
            assert!(
                after.as_ref().is_ok_and(|b| b.contains("pod=server")),
                "without the option the established connection was cut: {after:?}"
            );
            // And it stays usable.
            assert!(held.ask().is_ok());
        }
        drop(held);
        net.stop(&mut up);
    }
}
