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
    #[error("nft -f failed{}: {stderr}", netns.as_ref().map(|n| format!(" in network namespace {n}")).unwrap_or_default())]
    Nft {
        netns: Option<String>,
        stderr: String,
    },
    #[error("cannot run nft (install the `nftables` package): {0}")]
    NftMissing(std::io::Error),
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

    /// Whether retrying the same sync later may succeed (a port in use may be freed; a missing
    /// `nft` binary or a bad Maglev input will not change by themselves).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Bind { .. } | Self::Nft { .. } | Self::Netns(_))
    }
}
