//! Errors at the dataplane's boundary.

use std::net::SocketAddr;

use svcnet_netns::NetnsError;

/// A failed sync or setup step; the previous rules and listeners stay in place.
#[derive(Debug, thiserror::Error)]
pub enum UserspaceError {
    #[error("cannot bind {protocol} {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        protocol: &'static str,
        source: std::io::Error,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The redirect table could not be applied through the libnftables context (refused,
    /// the context died, or the library is missing).
    #[error("nftables{}: {source}", netns.as_ref().map(|n| format!(" in network namespace {n}")).unwrap_or_default())]
    Nft {
        netns: Option<String>,
        source: svcnet_libnft::ApplyError,
    },
    #[error("cannot start the userspace proxy's worker threads: {0}")]
    Workers(String),
    #[error("service {service}: Maglev table: {source}")]
    Maglev {
        service: String,
        source: svcnet_lb::MaglevError,
    },
}

impl UserspaceError {
    pub(crate) fn bind(addr: SocketAddr, protocol: &'static str, source: std::io::Error) -> Self {
        Self::Bind {
            addr,
            protocol,
            source,
        }
    }

    /// What an operator can do about a bind failure: the capability or sysctl behind a
    /// privileged port, the process holding a port, a frontend address that is not local.
    pub fn hint(&self) -> Option<String> {
        let Self::Bind { addr, source, .. } = self else {
            return None;
        };
        let port = addr.port();
        match source.kind() {
            std::io::ErrorKind::PermissionDenied => Some(format!(
                "port {port} is below net.ipv4.ip_unprivileged_port_start: grant the proxy \
                 CAP_NET_BIND_SERVICE (`sudo setcap cap_net_bind_service=+ep \"$(command -v \
                 svcnet)\"`, or AmbientCapabilities=CAP_NET_BIND_SERVICE in a systemd unit), or \
                 lower the limit (`sudo sysctl net.ipv4.ip_unprivileged_port_start={port}`)"
            )),
            std::io::ErrorKind::AddrInUse => Some(format!(
                "another socket holds {addr} (`ss -ltnup 'sport = :{port}'` shows which)"
            )),
            std::io::ErrorKind::AddrNotAvailable => Some(format!(
                "{} is not an address of this host: without root the service CIDR must be \
                 local, a loopback range such as 127.96.0.0/16",
                addr.ip()
            )),
            _ => None,
        }
    }

    /// Whether retrying the same sync later may succeed (a port in use may be freed; a missing
    /// libnftables or a bad Maglev input will not change by themselves).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Nft { source, .. } => source.is_retryable(),
            other => matches!(other, Self::Bind { .. } | Self::Netns(_)),
        }
    }
}
