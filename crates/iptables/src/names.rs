//! Names of svcnet's iptables chains. Per-service chains are named as kube-proxy names them:
//! a prefix plus the first 16 characters of the base32 SHA-256 of the port name and protocol
//! (and, for endpoint chains, the endpoint), so they are deterministic, fit iptables' 28
//! character limit and, with the `KUBE-` prefix swapped in, equal kube-proxy's own names.

use std::net::IpAddr;

use sha2::{Digest, Sha256};
use svcnet_proxy::{DesiredEndpoint, ServicePortName};

/// Every chain svcnet creates starts with this; svcnet never touches any other chain
/// except for its jump rules in the built-in chains.
pub const PREFIX: &str = "SVCNET-";

/// nat and filter: the entry chain for service frontends (kube-proxy's `KUBE-SERVICES`).
pub const SERVICES: &str = "SVCNET-SERVICES";
/// filter: rejects/drops for external frontends without (local) endpoints.
pub const EXTERNAL_SERVICES: &str = "SVCNET-EXTERNAL-SERVICES";
/// filter: the node-wide verdicts for service-CIDR traffic no frontend DNATed: reject an
/// allocated cluster IP (unknown port), then drop the rest of the service CIDR.
pub const CLUSTER_IPS: &str = "SVCNET-CLUSTER-IPS";
/// nat: node ports; filter: health-check node ports.
pub const NODEPORTS: &str = "SVCNET-NODEPORTS";
/// nat: masquerades marked packets.
pub const POSTROUTING: &str = "SVCNET-POSTROUTING";
/// nat: sets the masquerade mark.
pub const MARK_MASQ: &str = "SVCNET-MARK-MASQ";
/// nat: masquerades traffic from outside every cluster CIDR (several CIDRs cannot be negated
/// in one rule).
pub const MASQ_OFF_CLUSTER: &str = "SVCNET-MASQ-OFF-CLUSTER";
/// filter: forwarding rules (INVALID drop, accept marked and established traffic).
pub const FORWARD: &str = "SVCNET-FORWARD";
/// filter: drops load-balancer traffic not accepted by a `SVCNET-FW-` chain.
pub const PROXY_FIREWALL: &str = "SVCNET-PROXY-FIREWALL";
/// mangle, nat and filter: an empty chain whose disappearance means someone flushed the
/// tables, so a full resync is due.
pub const CANARY: &str = "SVCNET-PROXY-CANARY";

/// The packet-mark bit that asks `SVCNET-POSTROUTING` to masquerade, formatted as
/// kube-proxy formats it (`%#08x`).
pub const MASQUERADE_MARK: &str = "0x00004000";

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// The first 16 characters of the standard base32 encoding of SHA-256(`s`) (80 bits).
pub fn hash16(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    let bits = u128::from_be_bytes([
        0, 0, 0, 0, 0, 0, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9],
    ]);
    (0..16)
        .map(|i| BASE32[((bits >> (75 - 5 * i)) & 31) as usize] as char)
        .collect()
}

/// kube-proxy's `ServicePortName.String()`: `ns/name` plus `:port` when the port is named.
/// Used in comments and hashes.
pub fn port_name(spn: &ServicePortName) -> String {
    if spn.port.is_empty() {
        spn.service.to_string()
    } else {
        format!("{}:{}", spn.service, spn.port)
    }
}

fn base(spn: &ServicePortName) -> String {
    hash16(&format!("{}{}", port_name(spn), spn.protocol.as_str()))
}

/// Chain choosing among the Cluster-policy endpoints.
pub fn service_chain(spn: &ServicePortName) -> String {
    format!("SVCNET-SVC-{}", base(spn))
}

/// Chain choosing among this node's endpoints (Local policies).
pub fn local_chain(spn: &ServicePortName) -> String {
    format!("SVCNET-SVL-{}", base(spn))
}

/// Chain for external traffic (node ports, external IPs, load-balancer IPs).
pub fn external_chain(spn: &ServicePortName) -> String {
    format!("SVCNET-EXT-{}", base(spn))
}

/// Chain enforcing `loadBalancerSourceRanges`.
pub fn firewall_chain(spn: &ServicePortName) -> String {
    format!("SVCNET-FW-{}", base(spn))
}

/// `ip:port` (`[ip]:port` for IPv6): the DNAT destination and the endpoint in hashes.
pub fn endpoint_string(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// Chain DNATing to one endpoint; also the name of its `recent` list (affinity).
pub fn endpoint_chain(spn: &ServicePortName, ep: &DesiredEndpoint) -> String {
    format!(
        "SVCNET-SEP-{}",
        hash16(&format!(
            "{}{}{}",
            port_name(spn),
            spn.protocol.as_str(),
            endpoint_string(ep.ip, ep.port)
        ))
    )
}

/// The `recent` list of ClientIP affinity pins to `ep` under the core's affinity key (the
/// service port: `svcnet_proxy::Affinity`). Every pool chain of the port checks it and the
/// endpoint chain sets it, whatever frontend the connection came through, so a pin is per
/// service port; it is named as the endpoint chain, and goes with it (xt_recent drops a list
/// once no rule names it), so no client stays pinned to a removed endpoint.
pub fn affinity_list(key: &ServicePortName, ep: &DesiredEndpoint) -> String {
    endpoint_chain(key, ep)
}

/// Whether a chain is one of svcnet's per-service chains (the ones partial syncs rewrite and
/// stale-chain cleanup deletes).
pub fn is_service_chain(name: &str) -> bool {
    [
        "SVCNET-SVC-",
        "SVCNET-SVL-",
        "SVCNET-EXT-",
        "SVCNET-FW-",
        "SVCNET-SEP-",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcnet_proxy::Protocol;

    fn ep(ip: &str, port: u16) -> DesiredEndpoint {
        DesiredEndpoint {
            ip: ip.parse().unwrap(),
            port,
            weight: 1,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
        }
    }

    /// The hashes equal kube-proxy's (values from `pkg/proxy/iptables/proxier_test.go`).
    #[test]
    fn hashes_match_kube_proxy() {
        let spn = ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp);
        assert_eq!(service_chain(&spn), "SVCNET-SVC-XPGD46QRK7WJZT7O");
        assert_eq!(
            endpoint_chain(&spn, &ep("10.180.0.1", 80)),
            "SVCNET-SEP-SXIVWICOYRO3J4NJ"
        );
        assert!(service_chain(&spn).len() <= 28);
    }

    #[test]
    fn names_are_deterministic_and_distinct() {
        let a = ServicePortName::new("ns", "svc", "", Protocol::Tcp);
        let b = ServicePortName::new("ns", "svc", "", Protocol::Udp);
        assert_eq!(port_name(&a), "ns/svc");
        assert_ne!(service_chain(&a), service_chain(&b));
        assert_eq!(service_chain(&a), service_chain(&a.clone()));
        assert_eq!(&service_chain(&a)[11..], &external_chain(&a)[11..]);
        assert!(is_service_chain(&firewall_chain(&a)));
        assert!(!is_service_chain(SERVICES));
    }
}
