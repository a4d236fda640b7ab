//! Deleting stale UDP conntrack entries (the `conntrack` CLI, optionally inside a named
//! namespace). UDP has no connection teardown, so without this a client that keeps its socket
//! (DNS resolvers, statsd) keeps sending to a removed endpoint until the entry times out.

use std::process::Stdio;

use svcnet_proxy::{IpFamily, StaleConntrack};

use crate::apply::ApplyError;

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

/// Deletes the entries; returns how many flows the kernel removed.
pub fn clear_stale(netns: Option<&str>, stale: &[StaleConntrack]) -> Result<usize, ApplyError> {
    let mut deleted = 0;
    for s in stale {
        let out = svcnet_netns::command(netns, "conntrack")
            .args(delete_args(s))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ApplyError::NotInstalled {
                    program: "conntrack".into(),
                    package: "conntrack",
                },
                _ => ApplyError::Io(e),
            })?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // conntrack exits 1 when nothing matched; that is success for us.
        match stderr
            .split_whitespace()
            .position(|w| w == "flow")
            .and_then(|i| i.checked_sub(1))
        {
            Some(i) => {
                deleted += stderr
                    .split_whitespace()
                    .nth(i)
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0)
            }
            None if !out.status.success() => {
                return Err(ApplyError::Rejected {
                    status: out.status.code().unwrap_or(-1),
                    stderr: stderr.into_owned(),
                });
            }
            None => {}
        }
    }
    Ok(deleted)
}
