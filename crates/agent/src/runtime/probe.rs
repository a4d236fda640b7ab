//! Readiness and liveness probes: the spec as the kubelet reads it, a pure threshold tracker,
//! and the three actions (`httpGet`, `tcpSocket`, `exec`). Probes connect from the agent's own
//! namespace (the host) to the pod IP, as the kubelet probes from the node.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::process::{self, PodSandbox};
use super::volumes;

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    Http {
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp {
        port: u16,
    },
    Exec {
        command: Vec<String>,
    },
}

/// A probe with its timing, defaults applied as the API server would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    pub action: ProbeAction,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

fn secs(v: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(u64::try_from(v.unwrap_or(default).max(0)).unwrap_or(0))
}

fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port {p} is out of range")),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("no container port named {name:?}")),
    }
}

impl ProbeSpec {
    /// Reads a probe; the error names what is wrong (the caller adds the field path).
    pub fn from_probe(probe: &Probe, container: &Container) -> Result<Self, String> {
        let action = if let Some(http) = &probe.http_get {
            ProbeAction::Http {
                port: resolve_port(&http.port, container)?,
                path: http
                    .path
                    .clone()
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| "/".into()),
                headers: http
                    .http_headers
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
            }
        } else if let Some(tcp) = &probe.tcp_socket {
            ProbeAction::Tcp {
                port: resolve_port(&tcp.port, container)?,
            }
        } else if let Some(exec) = &probe.exec {
            let command = exec.command.clone().unwrap_or_default();
            if command.is_empty() {
                return Err("exec.command is empty".into());
            }
            ProbeAction::Exec { command }
        } else {
            return Err(
                "one of httpGet, tcpSocket or exec is required (grpc is not supported)".into(),
            );
        };
        Ok(Self {
            action,
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: u32::try_from(probe.success_threshold.unwrap_or(1).max(1))
                .unwrap_or(1),
            failure_threshold: u32::try_from(probe.failure_threshold.unwrap_or(3).max(1))
                .unwrap_or(3),
        })
    }
}

/// Consecutive-result bookkeeping: the result flips to success after `success_threshold`
/// successes in a row and to failure after `failure_threshold` failures in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTracker {
    success_threshold: u32,
    failure_threshold: u32,
    ok_run: u32,
    fail_run: u32,
    result: bool,
}

impl ProbeTracker {
    /// `initial`: readiness starts failed, liveness starts successful.
    pub fn new(spec: &ProbeSpec, initial: bool) -> Self {
        Self {
            success_threshold: spec.success_threshold,
            failure_threshold: spec.failure_threshold,
            ok_run: 0,
            fail_run: 0,
            result: initial,
        }
    }

    pub fn result(&self) -> bool {
        self.result
    }

    /// Records one probe outcome; returns the new result when it changed.
    pub fn record(&mut self, ok: bool) -> Option<bool> {
        if ok {
            self.ok_run += 1;
            self.fail_run = 0;
        } else {
            self.fail_run += 1;
            self.ok_run = 0;
        }
        let next = if !self.result && self.ok_run >= self.success_threshold {
            true
        } else if self.result && self.fail_run >= self.failure_threshold {
            false
        } else {
            self.result
        };
        (next != self.result).then(|| {
            self.result = next;
            next
        })
    }
}

/// Runs an HTTP or TCP probe against the pod (exec probes are run by the caller, which knows
/// the sandbox). True on success: connected, and for HTTP a status in 200..400.
pub async fn run_network_probe(action: &ProbeAction, pod_ip: IpAddr, timeout: Duration) -> bool {
    let attempt = async {
        match action {
            ProbeAction::Tcp { port } => {
                tokio::net::TcpStream::connect(SocketAddr::new(pod_ip, *port))
                    .await
                    .is_ok()
            }
            ProbeAction::Http {
                port,
                path,
                headers,
            } => http_probe(SocketAddr::new(pod_ip, *port), path, headers)
                .await
                .unwrap_or(false),
            ProbeAction::Exec { .. } => false,
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(false)
}

async fn http_probe(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
) -> std::io::Result<bool> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        let read = stream.read(&mut buf[n..]).await?;
        if read == 0 {
            break;
        }
        n += read;
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((200..400).contains(&code))
}

/// Where a container's exec probes run: its sandbox, environment and volume mounts.
pub(super) struct ExecContext {
    pub(super) sandbox: PodSandbox,
    pub(super) env: Vec<(String, String)>,
    pub(super) mounts: Vec<volumes::Mount>,
}

pub(super) async fn exec_probe(
    target: &ExecContext,
    command: &[String],
    timeout: Duration,
) -> bool {
    let Ok(mut cmd) =
        target
            .sandbox
            .command_with(command, &target.env, true, false, &target.mounts, None)
    else {
        return false;
    };
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let Ok(mut child) = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
    else {
        return false;
    };
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => status.success(),
        _ => {
            if let Some(pid) = child.id() {
                process::signal(pid, true);
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(probe: serde_json::Value) -> Result<ProbeSpec, String> {
        let c: Container = serde_json::from_value(
            json!({"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}),
        )
        .unwrap();
        ProbeSpec::from_probe(&serde_json::from_value(probe).unwrap(), &c)
    }

    #[test]
    fn defaults_and_named_ports() {
        let s = spec(json!({"httpGet": {"port": "http"}})).unwrap();
        assert_eq!(
            s.action,
            ProbeAction::Http {
                port: 8080,
                path: "/".into(),
                headers: vec![]
            }
        );
        assert_eq!(
            (
                s.period,
                s.timeout,
                s.success_threshold,
                s.failure_threshold
            ),
            (Duration::from_secs(10), Duration::from_secs(1), 1, 3)
        );
        assert!(
            spec(json!({"tcpSocket": {"port": "nope"}}))
                .unwrap_err()
                .contains("nope")
        );
        assert!(spec(json!({})).is_err());
    }

    #[test]
    fn thresholds_flip_the_result() {
        let s =
            spec(json!({"tcpSocket": {"port": 1}, "successThreshold": 2, "failureThreshold": 2}))
                .unwrap();
        let mut t = ProbeTracker::new(&s, false);
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(true), Some(true));
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), None, "a success resets the failure run");
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), Some(false));
        assert!(!t.result());
    }
}
