//! What a packet trace answers, in every dataplane's words alike: the packet, the branches it
//! can take (each with its share of the probability mass, the chains it passed and the rules
//! that masqueraded or ended it) and how each ends. Each dataplane's tracer (`svcnet_nft::trace`,
//! `svcnet_iptables::trace`) walks its own rules into these values; `svcnet trace` prints them.
//! Plain data, no I/O.

use std::net::{IpAddr, SocketAddr};

use crate::Protocol;

/// The first packet of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dport: u16,
    pub proto: Protocol,
    /// Sent by a process on the node (the output hook) rather than arriving from a link.
    pub local_origin: bool,
}

impl Packet {
    /// The protocol as nft and iptables spell it (`tcp`, `udp`, `sctp`).
    pub fn proto_name(&self) -> &'static str {
        match self.proto {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// How one branch of a trace ends.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// DNATed to `to`, the source rewritten to the node's when `masquerade`.
    Endpoint {
        to: SocketAddr,
        masquerade: bool,
    },
    /// No rule took it: routed (or delivered) as addressed.
    Pass,
    Drop,
    Reject,
}

/// A chain a branch entered and the rule that sent it there (none for a base chain).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hop {
    pub chain: String,
    /// For a base (built-in) chain, the hook it is attached to (`prerouting`, `nat OUTPUT`).
    pub hook: Option<String>,
    pub via: Option<String>,
}

/// One way the packet can go.
#[derive(Clone, Debug, PartialEq)]
pub struct Branch {
    /// Its share of the connections (numgen/statistic branches split it; hashes pick one).
    pub share: f64,
    pub outcome: Outcome,
    pub path: Vec<Hop>,
    /// The chain and rule that marked it for masquerading (when masqueraded).
    pub masquerade_by: Option<(String, String)>,
    /// The chain and rule that ended it: the DNAT, the drop, the reject.
    pub ended_by: Option<(String, String)>,
    /// The affinity sets (nft) or `recent` lists (iptables) that record the client on this
    /// branch (ClientIP session affinity), so its next connections follow it.
    pub records_affinity: Vec<String>,
}

/// A rule a tracer cannot interpret, or a reference to nothing: named, never guessed at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("chain {chain}: {message}: {rule}")]
pub struct TraceError {
    pub chain: String,
    pub rule: String,
    pub message: String,
}
