//! The UDP backend's per-peer table (flanneld's `find_route`): remote pod CIDR → the remote
//! node's UDP endpoint. Pure; the encapsulation loop reads an immutable snapshot of it.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use ipnet::Ipv4Net;

/// flannel's UDP port (`pkg/backend/udp`, `defaultPort`).
pub const UDP_PORT: u16 = 8285;

/// What a node needs of a remote node to reach its pods over the UDP backend: exactly what
/// flannel reads from the remote Node (`spec.podCIDR`, `public-ip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct UdpPeer {
    pub pod_cidr: Ipv4Net,
    pub public_ip: Ipv4Addr,
}

/// Remote pod CIDRs and where their packets go, longest prefix first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerTable {
    entries: Vec<(Ipv4Net, SocketAddrV4)>,
}

impl PeerTable {
    /// The table for `peers`, each reached on `port` at its public address.
    pub fn new<'a>(peers: impl IntoIterator<Item = &'a UdpPeer>, port: u16) -> Self {
        let mut entries: Vec<(Ipv4Net, SocketAddrV4)> = peers
            .into_iter()
            .map(|p| (p.pod_cidr, SocketAddrV4::new(p.public_ip, port)))
            .collect();
        entries.sort_by(|a, b| b.0.prefix_len().cmp(&a.0.prefix_len()).then(a.0.cmp(&b.0)));
        entries.dedup_by_key(|e| e.0);
        Self { entries }
    }

    /// The peer whose pod CIDR holds `dst` (longest prefix wins), if any.
    pub fn lookup(&self, dst: Ipv4Addr) -> Option<SocketAddrV4> {
        self.entries
            .iter()
            .find(|(net, _)| net.contains(&dst))
            .map(|(_, to)| *to)
    }

    /// Whether `from` is one of the peers (datagrams from anyone else are dropped).
    pub fn knows(&self, from: Ipv4Addr) -> bool {
        self.entries.iter().any(|(_, to)| *to.ip() == from)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl fmt::Display for PeerTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (net, to) in &self.entries {
            writeln!(f, "{net} -> {to}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn peer(cidr: &str, ip: [u8; 4]) -> UdpPeer {
        UdpPeer {
            pod_cidr: cidr.parse().unwrap(),
            public_ip: ip.into(),
        }
    }

    #[test]
    fn longest_prefix_wins_and_unknown_goes_nowhere() {
        let peers = [
            peer("10.244.2.0/24", [172, 30, 0, 3]),
            peer("10.244.0.0/16", [172, 30, 0, 9]),
            peer("10.244.3.0/24", [172, 30, 0, 4]),
        ];
        let table = PeerTable::new(&peers, UDP_PORT);
        expect![[r#"
            10.244.2.0/24 -> 172.30.0.3:8285
            10.244.3.0/24 -> 172.30.0.4:8285
            10.244.0.0/16 -> 172.30.0.9:8285
        "#]]
        .assert_eq(&table.to_string());
        assert_eq!(
            table.lookup([10, 244, 3, 7].into()),
            Some(SocketAddrV4::new([172, 30, 0, 4].into(), 8285))
        );
        assert_eq!(
            table.lookup([10, 244, 9, 7].into()),
            Some(SocketAddrV4::new([172, 30, 0, 9].into(), 8285))
        );
        assert_eq!(table.lookup([10, 245, 0, 1].into()), None);
        assert!(table.knows([172, 30, 0, 3].into()));
        assert!(!table.knows([172, 30, 0, 5].into()));
        assert!(PeerTable::new(&[], UDP_PORT).is_empty());
    }
}
