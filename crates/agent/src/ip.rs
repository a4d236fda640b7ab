//! Running iproute2 (`ip`), the one way this crate programs links, addresses and routes.
//!
//! Why `ip` and not rtnetlink: every object here lives in a named namespace, and `ip -n NAME`
//! enters it in a child process, so no thread of ours (least of all a tokio worker) ever
//! switches namespace; the commands are also exactly what an operator types to inspect or
//! repair the result, and what the plans print. iproute2 is needed at run time anyway (the
//! netns crate and `ip netns exec` use it). Creating a pod costs about ten short commands.

use std::process::Command;

/// An `ip` invocation that failed.
#[derive(Debug, thiserror::Error)]
pub enum IpError {
    #[error(
        "`{command}` could not start: {source} (is iproute2 installed? `apt-get install iproute2`)"
    )]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("`{command}` printed unexpected output: {detail}")]
    Output { command: String, detail: String },
}

impl IpError {
    /// True when the command failed because the object does not exist (deleting it is done).
    pub fn is_not_found(&self) -> bool {
        match self {
            IpError::Failed { stderr, .. } => {
                let s = stderr.to_ascii_lowercase();
                s.contains("cannot find device")
                    || s.contains("no such")
                    || s.contains("does not exist")
                    || s.contains("not found")
                    || s.contains("no such process")
            }
            _ => false,
        }
    }

    /// True when the object already exists.
    pub fn is_exists(&self) -> bool {
        matches!(self, IpError::Failed { stderr, .. } if stderr.contains("File exists"))
    }
}

/// The namespace of the calling process, as a `netns` argument: the commands run without
/// entering any (a node add-on's pod runs in its node's network namespace, which it does not
/// name; `svcnet up`'s nodes are named ones).
pub const OWN_NETNS: &str = "/proc/self/ns/net";

/// `netns` with [`OWN_NETNS`] read as no namespace to enter.
pub fn entered(netns: Option<&str>) -> Option<&str> {
    netns.filter(|n| *n != OWN_NETNS)
}

/// Runs `ip [-n netns] args...` and returns its stdout. `netns` is a namespace name (under
/// `/run/netns`) or, when it holds a `/`, a namespace file's path (`/proc/<pid>/ns/net`, a
/// runtime's bind mount elsewhere), which `ip -n` cannot take: `nsenter --net=PATH ip …` then.
/// [`OWN_NETNS`] is this process's own: plain `ip`.
pub fn ip(netns: Option<&str>, args: &[&str]) -> Result<String, IpError> {
    let netns = entered(netns);
    let mut cmd = match netns {
        Some(path) if path.contains('/') => {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net={path}")).arg("ip");
            cmd
        }
        Some(name) => {
            let mut cmd = Command::new("ip");
            cmd.args(["-n", name]);
            cmd
        }
        None => Command::new("ip"),
    };
    cmd.args(args);
    let command = render(netns, args);
    let out = cmd.output().map_err(|source| IpError::Spawn {
        command: command.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(IpError::Failed {
            command,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`ip`], but a missing object counts as success (for idempotent deletes).
pub fn ip_del(netns: Option<&str>, args: &[&str]) -> Result<(), IpError> {
    match ip(netns, args) {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs `ip -j [-n netns] args...` and parses its JSON array.
pub fn ip_json(netns: Option<&str>, args: &[&str]) -> Result<Vec<serde_json::Value>, IpError> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let out = ip(netns, &full)?;
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(&out).map_err(|e| IpError::Output {
        command: render(netns, &full),
        detail: e.to_string(),
    })
}

/// `ip -n NAME` as text, for messages and plans.
pub fn render(netns: Option<&str>, args: &[&str]) -> String {
    match entered(netns) {
        Some(path) if path.contains('/') => format!("nsenter --net={path} ip {}", args.join(" ")),
        Some(ns) => format!("ip -n {ns} {}", args.join(" ")),
        None => format!("ip {}", args.join(" ")),
    }
}

/// Names of the named network namespaces (`ip netns list`).
pub fn netns_list() -> Result<Vec<String>, IpError> {
    let out = ip(None, &["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Pids of the processes inside a named namespace (`ip netns pids`).
pub fn netns_pids(name: &str) -> Result<Vec<u32>, IpError> {
    let out = ip(None, &["netns", "pids", name])?;
    Ok(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Names of the links in a namespace (or the host).
pub fn link_names(netns: Option<&str>) -> Result<Vec<String>, IpError> {
    Ok(ip_json(netns, &["link", "show"])?
        .iter()
        .filter_map(|l| l.get("ifname").and_then(|n| n.as_str()).map(str::to_string))
        .collect())
}

/// The MAC address of a link.
pub fn link_mac(netns: Option<&str>, link: &str) -> Result<String, IpError> {
    let links = ip_json(netns, &["link", "show", "dev", link])?;
    links
        .first()
        .and_then(|l| l.get("address"))
        .and_then(|a| a.as_str())
        .map(str::to_string)
        .ok_or_else(|| IpError::Output {
            command: render(netns, &["-j", "link", "show", "dev", link]),
            detail: "no address".into(),
        })
}
