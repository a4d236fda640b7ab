//! The harness of the end-to-end tests: a real `svcnet up` and the real `kubectl` against it.
#![allow(clippy::unwrap_used, dead_code)] // test harness: a failure here is a test failure

pub mod bulk;
pub mod walkthrough;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33";

/// A running `svcnet up` in a temporary data dir; killed (and waited for) on drop.
pub struct Up {
    pub child: Child,
    pub data_dir: tempfile::TempDir,
    pub api: std::net::SocketAddr,
    /// The `--prefix` it was started with, for `svcnet down` on drop.
    pub prefix: Option<String>,
    /// Its flags beyond the data dir and API address.
    pub extra: Vec<String>,
}

fn spawn(data_dir: &Path, api: std::net::SocketAddr, extra: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .arg("up")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--api-listen")
        .arg(api.to_string())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

impl Up {
    pub fn start(extra: &[&str]) -> Up {
        let up = Up::spawn(extra);
        up.wait_ready();
        up
    }

    /// Starts `svcnet up` with `extra` and returns at once (it may still be starting).
    pub fn spawn(extra: &[&str]) -> Up {
        let data_dir = tempfile::tempdir().unwrap();
        let api = free_port();
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let child = spawn(data_dir.path(), api, &extra);
        let prefix = extra
            .iter()
            .position(|a| a == "--prefix")
            .and_then(|i| extra.get(i + 1))
            .cloned();
        Up {
            child,
            data_dir,
            api,
            prefix,
            extra,
        }
    }

    /// Stops it (SIGTERM) and starts it again with the same flags on the same data dir.
    pub fn restart(&mut self) {
        let status = self.stop();
        assert!(status.success(), "svcnet up exited with {status}");
        self.child = spawn(self.data_dir.path(), self.api, &self.extra);
        self.wait_ready();
    }

    /// Starts it again with `extra` on the same data dir after it exited (a crash, `kill -9`).
    pub fn respawn(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_some(),
            "respawn: svcnet up is still running"
        );
        self.child = spawn(self.data_dir.path(), self.api, &self.extra);
        self.wait_ready();
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir.path().join("kubeconfig")
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.kubeconfig().exists() {
                let out = self.kubectl(&["get", "--raw", "/readyz"]);
                if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "svcnet up did not become ready at {}",
                self.api
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(KUBECTL)
            .env("KUBECONFIG", self.kubeconfig())
            .args(args)
            .output()
            .unwrap()
    }

    /// Runs kubectl and returns stdout, failing the test with stderr when it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Up {
    /// `svcnet trace --node NODE ARGS… -o json` on this cluster, parsed (fails the test when
    /// the trace fails).
    #[allow(dead_code)] // not every e2e binary traces
    pub fn trace_json(&self, node: &str, args: &[&str]) -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_svcnet"))
            .arg("trace")
            .arg("--data-dir")
            .arg(self.data_dir.path())
            .args(["--node", node, "-o", "json"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "svcnet trace {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Applies `manifest` (pods `a` and `b`, as [`pods_a_b`] makes them), waits until both are
    /// Ready and returns their IPs.
    #[allow(dead_code)] // not every e2e binary runs pods a and b
    pub fn start_pods_a_b(&self, manifest: &str) -> (String, String) {
        let path = self.data_dir.path().join("pods.yaml");
        std::fs::write(&path, manifest).unwrap();
        self.ok(&["apply", "-f", path.to_str().unwrap()]);
        self.ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/a",
            "pod/b",
            "--timeout=60s",
        ]);
        let ip = |pod: &str| self.ok(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"]);
        (ip("a"), ip("b"))
    }

    /// `svcnet exec POD -- sh -c CMD` on this cluster: its output, whether or not it succeeded.
    #[allow(dead_code)] // not every e2e binary execs
    pub fn exec_sh(&self, pod: &str, cmd: &str) -> Output {
        self.exec_sh_in("default", pod, cmd)
    }

    /// [`Up::exec_sh`] for a pod in `namespace`.
    #[allow(dead_code)] // not every e2e binary execs
    pub fn exec_sh_in(&self, namespace: &str, pod: &str, cmd: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_svcnet"))
            .args(["exec", "--data-dir"])
            .arg(self.data_dir.path())
            .args(["-n", namespace, pod, "--", "sh", "-c", cmd])
            .output()
            .unwrap()
    }

    /// Stops `svcnet up` the way Ctrl-C does (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "svcnet up did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        // Stop it the graceful way first (it removes its namespaces), then make sure: kill it
        // and run `svcnet down`, which also cleans up after a crash.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(prefix) = &self.prefix {
            let _ = Command::new(env!("CARGO_BIN_EXE_svcnet"))
                .args(["down", "--prefix", prefix, "--data-dir"])
                .arg(self.data_dir.path())
                .stdout(Stdio::null())
                .status();
        }
    }
}

pub fn free_port() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// A loopback port free for UDP and for TCP at once (DNS listens on both: a UDP port whose
/// number a TCP connection was using made `svcnet up` fail to start its DNS).
pub fn free_udp_port() -> std::net::SocketAddr {
    loop {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
}

pub fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

pub fn wait_for(what: &str, mut check: impl FnMut() -> Option<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `curl -s -m 3 URL`: the body when the request succeeded.
pub fn curl(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "-m", "3", url])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `dig +short` (A records) against svcnet's DNS on `dns`, answers sorted.
pub fn dig_sorted(dns: std::net::SocketAddr, name: &str) -> Vec<String> {
    let out = Command::new("dig")
        .args([
            "+short",
            "+time=2",
            "+tries=1",
            "-p",
            &dns.port().to_string(),
            "@127.0.0.1",
            name,
        ])
        .output()
        .unwrap();
    let mut answers: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    answers.sort();
    answers
}

/// One test's own name prefix and address ranges, so tests run in parallel.
pub struct Net {
    pub prefix: &'static str,
    pub underlay: &'static str,
    pub pods: &'static str,
    pub services: &'static str,
    pub lb: &'static str,
}

impl Net {
    /// Starts `svcnet up` on these ranges (nothing of them may be on the host yet), with DNS
    /// on `dns` and a closed upstream.
    pub fn up(&self, nodes: &str, dns: std::net::SocketAddr) -> Up {
        self.up_with(nodes, dns, &[])
    }

    /// [`Net::up`] with more flags (`--proxy-mode iptables`, …).
    pub fn up_with(&self, nodes: &str, dns: std::net::SocketAddr, extra: &[&str]) -> Up {
        let up = self.spawn_with(nodes, dns, extra);
        up.wait_ready();
        up
    }

    /// [`Net::up_with`] without waiting for it to be ready.
    pub fn spawn_with(&self, nodes: &str, dns: std::net::SocketAddr, extra: &[&str]) -> Up {
        let before = self.leftovers();
        assert!(before.is_empty(), "leftovers before the test: {before:?}");
        let upstream = free_udp_port(); // closed: nothing leaves the machine
        let dns = dns.to_string();
        let upstream = upstream.to_string();
        let mut args = vec![
            "--nodes",
            nodes,
            "--prefix",
            self.prefix,
            "--underlay",
            self.underlay,
            "--pod-cidr",
            self.pods,
            "--service-cidr",
            self.services,
            "--lb-pool",
            self.lb,
            "--dns-listen",
            &dns,
            "--dns-upstream",
            &upstream,
        ];
        args.extend_from_slice(extra);
        Up::spawn(&args)
    }

    /// Stops `svcnet up` as Ctrl-C does and checks it removed everything it made.
    pub fn stop(&self, up: &mut Up) {
        let status = up.stop();
        assert!(status.success(), "svcnet up exited with {status}");
        let after = self.leftovers();
        assert!(after.is_empty(), "left behind: {after:?}");
    }

    /// Namespaces, links and routes of this test still on the host.
    pub fn leftovers(&self) -> Vec<String> {
        let stems: Vec<String> = [self.underlay, self.pods, self.services, self.lb]
            .iter()
            .map(|cidr| {
                // The whole octets of the network part: "172.29.8." for a /24, "10.152." for a /16.
                let (addr, len) = cidr.split_once('/').unwrap();
                let whole: usize = len.parse::<usize>().unwrap() / 8;
                let octets: Vec<&str> = addr.split('.').take(whole).collect();
                format!("{}.", octets.join("."))
            })
            .collect();
        let mut found = Vec::new();
        for (args, what) in [
            (&["netns", "list"][..], "netns"),
            (&["-o", "link"][..], "link"),
            (&["route"][..], "route"),
        ] {
            let out = Command::new("ip").args(args).output().unwrap();
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if line.contains(self.prefix) || stems.iter().any(|s| line.contains(s.as_str())) {
                    found.push(format!("{what}: {line}"));
                }
            }
        }
        found
    }
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Pod `a` on `<prefix>-node1`, pod `b` on `<prefix>-node2` (the test server, port `http` = 80)
/// and Service `b` (8080 → `http`): the pod network tests' manifest.
pub fn pods_a_b(prefix: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: a, labels: {{app: a}}}}
spec:
  nodeName: {prefix}-node1
  containers: [{{name: web, image: test-server, ports: [{{name: http, containerPort: 80}}]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: b, labels: {{app: b}}}}
spec:
  nodeName: {prefix}-node2
  containers: [{{name: web, image: test-server, ports: [{{name: http, containerPort: 80}}]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: b}}
spec:
  selector: {{app: b}}
  ports: [{{port: 8080, targetPort: http}}]
"#
    )
}

/// Restarts `up` in each other proxy mode (iptables, then userspace) on the same data dir and
/// pod network, and checks pod `a` (node 1) reaches Service `b` (its pod on node 2) through
/// it: the pod network carries every dataplane's service traffic (`pods_a_b`'s objects).
#[allow(dead_code)] // not every e2e binary runs pods a and b
pub fn service_across_nodes_in_each_proxy_mode(up: &mut Up) {
    for mode in ["iptables", "userspace"] {
        match up.extra.iter().position(|a| a == "--proxy-mode") {
            Some(at) => up.extra[at + 1] = mode.into(),
            None => up.extra.extend(["--proxy-mode".into(), mode.into()]),
        }
        up.restart();
        wait_for(&format!("pod a to Service b across nodes ({mode})"), || {
            let out = up.exec_sh("a", "curl -s -m 3 http://b.default.svc.cluster.local:8080/");
            let reply = String::from_utf8_lossy(&out.stdout).trim().to_string();
            reply.starts_with("pod=b ").then_some(reply)
        });
    }
}

/// `ip -n NETNS args...`'s stdout (empty when it fails).
pub fn ip_in(netns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .arg("-n")
        .arg(netns)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The files the add-on's CNI DaemonSet installs on this machine (its hostPath volumes).
#[allow(dead_code)] // only the add-on tests install them
pub const CNI_PLUGIN: &str = "/opt/cni/bin/svcnet";
#[allow(dead_code)] // only the add-on tests install them
pub const CNI_CONFLIST: &str = "/etc/cni/net.d/10-svcnet.conflist";

/// Claims the add-on's CNI files for one test: they must be absent at the start (no other CNI
/// install on this machine) and are removed when this is dropped, whatever happened.
#[allow(dead_code)] // only the add-on tests install them
pub struct CniFiles;

#[allow(dead_code)] // only the add-on tests install them
impl CniFiles {
    pub fn claim() -> CniFiles {
        for path in [CNI_PLUGIN, CNI_CONFLIST] {
            assert!(
                !Path::new(path).exists(),
                "{path} exists: another CNI install is on this machine"
            );
        }
        CniFiles
    }
}

impl Drop for CniFiles {
    fn drop(&mut self) {
        for path in [CNI_PLUGIN, CNI_CONFLIST] {
            let _ = std::fs::remove_file(path);
        }
    }
}
