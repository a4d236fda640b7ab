//! Entering a running pod from outside the agent (`svcnet exec`): the agent's pod record in
//! the data dir names the pod's network namespace, its resolv.conf/hosts and each container's
//! environment; the command runs in the same kind of sandbox as the containers (pod network
//! namespace, private mount namespace with the pod's files, the pod's hostname).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::runtime::pod::PodRecord;

/// Why a pod cannot be entered.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("pod {namespace}/{name} is not running on this machine (no record under {}/agent/*/pods/<ns>_<name>_<uid>; is `svcnet up` running with this --data-dir?)", dir.display())]
    NotFound {
        namespace: String,
        name: String,
        dir: PathBuf,
    },
    #[error("pod {namespace}/{name}: its record {}: {message}", path.display())]
    BadRecord {
        namespace: String,
        name: String,
        path: PathBuf,
        message: String,
    },
    #[error("pod {namespace}/{name} has no container {container:?} (containers: {})", available.join(", "))]
    NoContainer {
        namespace: String,
        name: String,
        container: String,
        available: Vec<String>,
    },
    #[error(
        "pod {namespace}/{name}: its network namespace {netns} is gone (the pod is being deleted or the agent stopped)"
    )]
    NoSandbox {
        namespace: String,
        name: String,
        netns: String,
    },
    #[error("{0}")]
    Spawn(std::io::Error),
}

/// Finds the record of pod `namespace/name` on any node of the data dir (the running one when
/// a terminating pod of the same name is still there).
pub fn find_pod(data_dir: &Path, namespace: &str, name: &str) -> Result<PodRecord, ExecError> {
    let mut fallback = None;
    for dir in crate::logs::find_pod_dirs(data_dir, namespace, name) {
        let path = dir.join("pod.json");
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let record: PodRecord =
            serde_json::from_slice(&bytes).map_err(|e| ExecError::BadRecord {
                namespace: namespace.into(),
                name: name.into(),
                path,
                message: e.to_string(),
            })?;
        if Path::new(svcnet_netns::NETNS_RUN_DIR)
            .join(&record.sandbox.netns)
            .exists()
        {
            return Ok(record);
        }
        fallback.get_or_insert(record);
    }
    fallback.ok_or_else(|| ExecError::NotFound {
        namespace: namespace.into(),
        name: name.into(),
        dir: data_dir.to_path_buf(),
    })
}

/// The command `argv` inside the pod, with the environment of `container` (default: the
/// first). stdio is inherited; with `tty`, the caller gives it a pty slave as stdio, which
/// becomes its controlling terminal.
pub fn exec_command(
    record: &PodRecord,
    container: Option<&str>,
    argv: &[String],
    tty: bool,
) -> Result<Command, ExecError> {
    let (namespace, name) = (record.namespace.clone(), record.name.clone());
    let env = match container {
        Some(c) => record
            .containers
            .iter()
            .find(|(n, _)| n == c)
            .map(|(_, e)| e.clone())
            .ok_or_else(|| ExecError::NoContainer {
                namespace: namespace.clone(),
                name: name.clone(),
                container: c.into(),
                available: record.containers.iter().map(|(n, _)| n.clone()).collect(),
            })?,
        None => record
            .containers
            .first()
            .map(|(_, e)| e.clone())
            .unwrap_or_default(),
    };
    let mut env = env;
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push((
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ));
    }
    if !Path::new(svcnet_netns::NETNS_RUN_DIR)
        .join(&record.sandbox.netns)
        .exists()
    {
        return Err(ExecError::NoSandbox {
            namespace,
            name,
            netns: record.sandbox.netns.clone(),
        });
    }
    // The container's volume mounts (the first container's without a name, as for env).
    let mounts = container
        .or_else(|| record.containers.first().map(|(n, _)| n.as_str()))
        .and_then(|c| record.mounts.get(c))
        .cloned()
        .unwrap_or_default();
    record
        .sandbox
        .command_with(argv, &env, false, tty, &mounts, None)
        .map_err(ExecError::Spawn)
}

/// How long connecting to a pod's port may take (the kubelet's runtimes give it no limit, but
/// a port that drops SYNs must not hold a forwarded connection forever).
const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A TCP connection to `port` on the loopback of pod `namespace/name`, made from inside its
/// network namespace as the kubelet's runtimes do for `kubectl port-forward`: IPv4 first, then
/// IPv6. The error says what happened for both, in containerd's words.
pub fn dial_port(
    data_dir: &Path,
    namespace: &str,
    name: &str,
    port: u16,
) -> Result<std::net::TcpStream, String> {
    let record = find_pod(data_dir, namespace, name).map_err(|e| e.to_string())?;
    let netns = record.sandbox.netns.clone();
    let ns = svcnet_netns::NetNs::open(&netns).map_err(|_| {
        ExecError::NoSandbox {
            namespace: namespace.into(),
            name: name.into(),
            netns: netns.clone(),
        }
        .to_string()
    })?;
    let dialed = ns
        .run(|| {
            let v4 = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
            let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
            match std::net::TcpStream::connect_timeout(&v4, DIAL_TIMEOUT) {
                Ok(s) => Ok(s),
                Err(e4) => std::net::TcpStream::connect_timeout(&v6, DIAL_TIMEOUT).map_err(|e6| {
                    format!(
                        "IPv4: dial tcp4 {v4}: connect: {} IPv6 dial tcp6 {v6}: connect: {}",
                        go_error(&e4),
                        go_error(&e6)
                    )
                }),
            }
        })
        .map_err(|e| e.to_string())?;
    dialed.map_err(|why| {
        format!(
            "failed to execute portforward in network namespace {netns:?}: failed to connect to localhost:{port} inside namespace {netns:?}, {why}"
        )
    })
}

/// An error as Go's net package words it ("connection refused"), which is what users of
/// kubectl search for, rather than Rust's "Connection refused (os error 111)".
fn go_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::TimedOut => "i/o timeout".into(),
        _ => {
            let text = e.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_string();
            let mut chars = text.chars();
            chars
                .next()
                .map(|c| c.to_lowercase().chain(chars).collect())
                .unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_gos() {
        let refused = std::io::Error::from_raw_os_error(111);
        assert_eq!(go_error(&refused), "connection refused");
        let timeout = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(go_error(&timeout), "i/o timeout");
    }
}
