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
    /// The destination port (ignored for ICMP).
    pub dport: u16,
    /// `None`: ICMP (an echo request), which has no ports.
    pub proto: Option<Protocol>,
    /// Sent by a process on the node (the output hook) rather than arriving from a link.
    pub local_origin: bool,
}

impl Packet {
    /// The protocol as nft and iptables spell it (`tcp`, `udp`, `sctp`, `icmp`).
    pub fn proto_name(&self) -> &'static str {
        match self.proto {
            Some(Protocol::Tcp) => "tcp",
            Some(Protocol::Udp) => "udp",
            Some(Protocol::Sctp) => "sctp",
            None => "icmp",
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
    /// Redirected to a local listener on `port` (the userspace proxy, which picks the
    /// endpoint itself and connects from the node).
    Listener {
        port: u16,
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
    /// The chain holding the rule that jumped here, and that rule (none for a base chain).
    pub from: Option<String>,
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

/// A branch in words: which frontend it matched, why it is masqueraded, how it ends. Each
/// dataplane's tracer reads these from its own chain names and rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// `cluster IP of default/web/tcp/http`, `node port of …`.
    pub frontend: Option<String>,
    /// Why the endpoint sees the node's address instead of the client's.
    pub masquerade: Option<String>,
    pub verdict: String,
}

/// The masquerade reasons every dataplane gives, so their answers read alike.
pub mod why {
    pub const HAIRPIN: &str = "hairpin: the chosen endpoint is the client itself, so its reply must come back through the node";
    pub const OFF_CLUSTER: &str =
        "the source is outside the cluster CIDR (an off-cluster client of a cluster IP)";
    pub const LOCAL_SHORT_CIRCUIT: &str = "the node itself sends to an externalTrafficPolicy: Local frontend, which is short-circuited to the cluster-wide pool (and masqueraded)";
    pub const EXTERNAL_CLUSTER: &str = "external traffic (node port, external or load-balancer IP) with externalTrafficPolicy: Cluster may go to another node, so replies must return through this one";
    pub const NO_ENDPOINTS: &str = "rejected: the service port has no endpoints (the client gets ICMP port unreachable, TCP sees a reset)";
    pub const NO_LOCAL_ENDPOINTS: &str =
        "dropped: the traffic policy is Local and this node has no ready endpoint of the service";
    pub const UNKNOWN_PORT: &str =
        "rejected: an allocated cluster IP, but no port (or protocol) of its service matches";
    pub const UNALLOCATED: &str = "dropped: an address of the service CIDR that no service holds";
    pub const SOURCE_RANGES: &str =
        "dropped: the source is not in the service's loadBalancerSourceRanges";
    pub const NOT_A_SERVICE: &str =
        "not a service: no svcnet rule matched, the packet is routed as addressed";
}
