//! Names of svcnet's nft objects. The table is data-only: fixed sets and maps, one set per
//! dispatch group (see `render::Group`), and a chain per service only for round robin
//! (`numgen inc` keeps its counter in the rule, so a per-service counter needs a rule of its
//! own). Those chains carry a short hash (unique after sanitising) and the readable
//! `ns/name/proto/port`, as kube-proxy's chains do.

use sha2::{Digest, Sha256};
use svcnet_proxy::ServicePortName;

/// The table svcnet owns in each family; svcnet never touches any other table.
pub const TABLE: &str = "svcnet";
/// The packet-mark bit that asks `nat-postrouting` to masquerade.
pub const MASQUERADE_MARK: u32 = 0x4000;

/// Allocated cluster IPs (the node-wide unknown-port verdict).
pub const CLUSTER_IPS: &str = "cluster-ips";
/// Endpoint pairs `ip . ip`: a pod reaching itself through a service is masqueraded.
pub const HAIRPIN: &str = "hairpin";
/// Load-balancer frontends with `loadBalancerSourceRanges`, and their allowed sources
/// (`frontend . source range`, an interval set).
pub const FIREWALL: &str = "firewall";
pub const FIREWALL_ALLOW: &str = "firewall-allow";
/// The protocols a service port can have, as nft names them.
pub const PROTOCOLS: [&str; 3] = ["tcp", "udp", "sctp"];

/// The verdict maps `frontend → jump <lookup chain>` of ClientIP affinity, one per dispatch
/// scope (see `render::Scope::affinity_map`), and `original frontend → jump <record chain>`.
pub const AFFINITY_RECORD: &str = "aff-record";
pub const NP_AFFINITY_RECORD: &str = "np-aff-record";
/// The explicit size of a service port's affinity map: the clients it can pin at once (a
/// dynamic map without one holds 65,535). The kernel sizes the map's hash table from it
/// (about 128 KiB for 4,096, measured), so it is per service port and modest; kube-proxy's
/// `recent` lists hold 100 clients per endpoint.
pub const AFFINITY_SIZE: u32 = 4096;

/// The objects of one service port's ClientIP affinity: per pool in use, a dynamic map
/// `client → endpoint` and the chain looking it up (`aff-<pool>-…`, the same name for both:
/// nft keeps chains and sets apart), and the chain recording into them after DNAT
/// (`aff-rec-…`). Every frontend of the port reaches the same ones: the pin is per service
/// port, as the core decides (`svcnet_proxy::Affinity`).
pub fn affinity_object(kind: &str, spn: &ServicePortName) -> String {
    let full = format!("{spn}/aff/{kind}");
    format!("aff-{kind}-{}-{}", hash8(&full), sanitize(&spn.to_string()))
}

pub const SERVICES_CHAIN: &str = "services";
pub const AFFINITY_RECORD_CHAIN: &str = "affinity-record";
pub const MASQUERADING_CHAIN: &str = "masquerading";

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// 8 base32 characters of SHA-256: 40 bits, plenty against collisions among one node's chains.
fn hash8(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    let bits = u64::from_be_bytes([0, 0, 0, d[0], d[1], d[2], d[3], d[4]]);
    (0..8)
        .map(|i| BASE32[((bits >> (35 - 5 * i)) & 31) as usize] as char)
        .collect()
}

/// nft identifiers allow letters, digits, `/`, `\`, `_`, `.`, `-`; map anything else to `.`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "/_.-".contains(c) {
                c
            } else {
                '.'
            }
        })
        .collect()
}

/// The round-robin chain of one service port's pool in one dispatch scope
/// (`rr-<scope>-<pool>-<hash>-ns/name/proto/port`).
pub fn round_robin_chain(scope: &str, pool: &str, spn: &ServicePortName) -> String {
    let full = format!("{spn}/{scope}/{pool}");
    format!(
        "rr-{scope}-{pool}-{}-{}",
        hash8(&full),
        sanitize(&spn.to_string())
    )
}
