//! Stale UDP conntrack cleanup, the same for every dataplane (nftables, iptables, userspace):
//! deletes the entries that the proxy core lists once per sync
//! (`svcnet_proxy::ProxyState::stale_conntrack`, from the changes of that sync), with the
//! `conntrack` CLI, optionally inside a named network namespace.
//!
//! UDP has no connection teardown, so without this a client that keeps its socket (DNS
//! resolvers, statsd) keeps sending to a removed endpoint until the entry times out; and a
//! client that sent to a service before it had endpoints keeps an un-NATed entry that bypasses
//! the new DNAT rules. kube-proxy keeps the same code apart from its proxiers
//! (`pkg/proxy/conntrack`). This crate never decides which entries are stale; the core does.

use std::process::Stdio;

use svcnet_proxy::{IpFamily, StaleConntrack};

/// Why a cleanup failed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The `conntrack` (or `ip`) binary is missing.
    #[error("{program} not found; install it (Debian/Ubuntu: `apt-get install {package}`)")]
    NotInstalled {
        program: &'static str,
        package: &'static str,
    },
    /// `conntrack -D` failed for another reason than "nothing matched".
    #[error("`conntrack {args}` failed (exit {status}): {stderr}")]
    Failed {
        args: String,
        status: i32,
        stderr: String,
    },
    #[error("running conntrack: {0}")]
    Io(#[from] std::io::Error),
}

impl ConntrackError {
    /// Whether retrying may help; a missing binary will not fix itself.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::NotInstalled { .. })
    }
}

/// The `conntrack -D` arguments deleting one stale entry set (without `--dst-nat` when the
/// entries of a newly active service are cleared whatever they were NATed to).
pub fn delete_args(s: &StaleConntrack) -> Vec<String> {
    let mut args = vec!["-D".to_string()];
    if s.family == IpFamily::V6 {
        args.extend(["-f".into(), "ipv6".into()]);
    }
    args.extend(["-p".into(), "udp".into()]);
    if let Some(ip) = s.frontend_ip {
        args.extend(["--orig-dst".into(), ip.to_string()]);
    }
    args.extend(["--orig-port-dst".into(), s.frontend_port.to_string()]);
    if let Some(ep) = s.endpoint {
        args.extend(["--dst-nat".into(), ep.to_string()]);
    }
    args
}

/// The number of flows `conntrack -D` reports deleted on stderr
/// (`conntrack v1.4.7 (conntrack-tools): 2 flow entries have been deleted.`).
fn deleted_count(stderr: &str) -> Option<usize> {
    let words: Vec<&str> = stderr.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "flow")?.checked_sub(1)?;
    Some(words.get(i)?.parse().unwrap_or(0))
}

/// Deletes the entries; returns how many flows the kernel removed.
pub fn clear_stale(netns: Option<&str>, stale: &[StaleConntrack]) -> Result<usize, ConntrackError> {
    let mut deleted = 0;
    for s in stale {
        let args = delete_args(s);
        let out = svcnet_netns::command(netns, "conntrack")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ConntrackError::NotInstalled {
                    program: if netns.is_some() { "ip" } else { "conntrack" },
                    package: if netns.is_some() {
                        "iproute2"
                    } else {
                        "conntrack"
                    },
                },
                _ => ConntrackError::Io(e),
            })?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // conntrack exits 1 when nothing matched; that is success for us.
        match deleted_count(&stderr) {
            Some(n) => deleted += n,
            None if stderr.contains("exec of \"conntrack\" failed") => {
                return Err(ConntrackError::NotInstalled {
                    program: "conntrack",
                    package: "conntrack",
                });
            }
            None if !out.status.success() => {
                return Err(ConntrackError::Failed {
                    args: args.join(" "),
                    status: out.status.code().unwrap_or(-1),
                    stderr: stderr.trim().to_string(),
                });
            }
            None => {}
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_count_conntrack_prints() {
        assert_eq!(
            deleted_count("conntrack v1.4.7 (conntrack-tools): 2 flow entries have been deleted."),
            Some(2)
        );
        assert_eq!(
            deleted_count("conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted."),
            Some(0)
        );
        assert_eq!(deleted_count("conntrack: unknown option"), None);
    }
}
