//! Names of svcnet's nft objects. Per-service objects carry a short hash (so names stay unique
//! after sanitising) followed by the readable `ns/name/proto/port`, as kube-proxy's do.

use std::net::IpAddr;

use sha2::{Digest, Sha256};
use svcnet_proxy::{DesiredEndpoint, ServicePortName};

/// The table svcnet owns in each family; svcnet never touches any other table.
pub const TABLE: &str = "svcnet";
/// The packet-mark bit that asks `nat-postrouting` to masquerade.
pub const MASQUERADE_MARK: u32 = 0x4000;

pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const FIREWALL_IPS: &str = "firewall-ips";
pub const CLUSTER_IPS: &str = "cluster-ips";
pub const REJECT_CHAIN: &str = "reject-chain";
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";

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

fn per_service(prefix: &str, spn: &ServicePortName) -> String {
    let full = spn.to_string();
    format!("{prefix}-{}-{}", hash8(&full), sanitize(&full))
}

/// Chain choosing among the Cluster-policy endpoints.
pub fn service_chain(spn: &ServicePortName) -> String {
    per_service("service", spn)
}

/// Chain choosing among this node's endpoints (Local policies).
pub fn local_chain(spn: &ServicePortName) -> String {
    per_service("local", spn)
}

/// Chain for external traffic (node ports, external IPs, LB IPs).
pub fn external_chain(spn: &ServicePortName) -> String {
    per_service("external", spn)
}

/// Chain enforcing `loadBalancerSourceRanges`.
pub fn firewall_chain(spn: &ServicePortName) -> String {
    per_service("firewall", spn)
}

/// nft's limit on set and map names (`NFT_SET_MAXNAMELEN` is 256 with the NUL).
const MAX_SET_NAME: usize = 255;

/// Named verdict map of the endpoints of a `service-…`/`local-…` chain that has more endpoints
/// than a cascade handles: `<chain>-endpoints`, or `endpoints-<hash of chain>` should that be
/// longer than nft allows.
pub fn endpoints_map(chain: &str) -> String {
    let name = format!("{chain}-endpoints");
    if name.len() <= MAX_SET_NAME {
        name
    } else {
        format!("endpoints-{}", hash8(chain))
    }
}

fn endpoint_suffix(spn: &ServicePortName, ip: IpAddr, port: u16) -> String {
    format!("{spn}__{ip}/{port}")
}

/// Chain DNATing to one endpoint.
pub fn endpoint_chain(spn: &ServicePortName, ep: &DesiredEndpoint) -> String {
    let full = endpoint_suffix(spn, ep.ip, ep.port);
    format!("endpoint-{}-{}", hash8(&full), sanitize(&full))
}

/// Affinity set of one endpoint: client IPs recently sent there.
pub fn affinity_set(spn: &ServicePortName, ep: &DesiredEndpoint) -> String {
    let full = endpoint_suffix(spn, ep.ip, ep.port);
    format!("affinity-{}-{}", hash8(&full), sanitize(&full))
}
