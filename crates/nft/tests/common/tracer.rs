//! The shared table's `Tracer` over svcnet-nft's production tracer (`svcnet_nft::trace`): the
//! rules come from a `FakeNft` or from the kernel's own listing of the table (`nft list
//! table`, parsed), so the component tier and the kernel tier check the same interpreter
//! against the same expectations. A rule it cannot interpret fails the test.

use std::net::{IpAddr, SocketAddr};

use svcnet_flows::{Distribution, Outcome, Packet, Tracer};
use svcnet_nft::FakeNft;
use svcnet_nft::trace::{self, Ruleset};

/// What the nft dataplane's tracer knows: the rules (with the affinity maps' entries) and the
/// node's addresses.
pub struct NftTracer {
    pub rules: Ruleset,
    pub local_addrs: Vec<IpAddr>,
}

impl NftTracer {
    pub fn over_fake(fake: &FakeNft, local_addrs: Vec<IpAddr>) -> Self {
        Self {
            rules: Ruleset::from_fake(fake),
            local_addrs,
        }
    }

    /// Over the kernel's listing (`nft list table ip svcnet` output).
    ///
    /// # Panics
    /// When the listing does not parse.
    pub fn over_listing(listing: &str, local_addrs: Vec<IpAddr>) -> Self {
        Self {
            rules: Ruleset::parse_listing(listing).unwrap_or_else(|e| panic!("{e}\n{listing}")),
            local_addrs,
        }
    }
}

impl NftTracer {
    /// The production tracer's branches (a rule it cannot interpret fails the test).
    fn branches(&self, pkt: &Packet) -> Vec<trace::Branch> {
        trace::Tracer::new(&self.rules, self.local_addrs.clone())
            .trace(&packet(pkt))
            .unwrap_or_else(|e| panic!("tracing {pkt:?}: {e}"))
    }
}

pub fn packet(pkt: &Packet) -> trace::Packet {
    pkt.to_trace()
}

impl Tracer for NftTracer {
    fn name(&self) -> &'static str {
        "nftables"
    }

    /// The first connection's branch to `endpoint` records the client in the maps its
    /// record rules name; with those entries (as the kernel lists them, `client : endpoint`)
    /// the packet is traced again.
    fn trace_after(&self, first: &Packet, endpoint: SocketAddr, pkt: &Packet) -> Distribution {
        let branches = self.branches(first);
        let mut rules = self.rules.clone();
        let to_endpoint = branches
            .iter()
            .filter(|b| matches!(b.outcome, trace::Outcome::Endpoint { to, .. } if to == endpoint));
        for b in to_endpoint {
            for map in &b.records_affinity {
                let entry = format!("{} : {} . {}", first.src, endpoint.ip(), endpoint.port());
                rules.sets.entry(map.clone()).or_default().push(entry);
            }
        }
        let after = NftTracer {
            rules,
            local_addrs: self.local_addrs.clone(),
        };
        after.trace(pkt)
    }

    fn trace(&self, pkt: &Packet) -> Distribution {
        let branches = self.branches(pkt);
        let mut out = Distribution::new();
        for b in branches {
            let o = match b.outcome {
                trace::Outcome::Endpoint { to, masquerade } => Outcome::Endpoint { to, masquerade },
                trace::Outcome::Pass => Outcome::Pass,
                trace::Outcome::Listener { port } => {
                    panic!("svcnet's nft table redirected {pkt:?} to port {port}")
                }
                trace::Outcome::Drop => Outcome::Drop,
                trace::Outcome::Reject => Outcome::Reject,
            };
            *out.entry(o).or_default() += b.share;
        }
        out
    }
}
