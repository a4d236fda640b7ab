//! The test kit's view of svcnet-iptables' production tracer (`svcnet_iptables::trace`): the
//! rules come from a `FakeIptables` or from the kernel's own `iptables-save`, so the
//! component tier and the kernel tier check the same interpreter against the same
//! expectations. A rule it cannot interpret fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use svcnet_iptables::FakeIptables;
use svcnet_iptables::trace::{self, Outcome, Ruleset};
use svcnet_proxy::Protocol;

#[derive(Clone, Debug)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: &'static str,
    pub dport: u16,
    /// Sent by a process on the node itself (nat/filter OUTPUT instead of PREROUTING).
    pub from_node: bool,
}

/// What the node knows: its own addresses (`addrtype LOCAL`) and which `recent` lists hold
/// the packet's source (affinity state).
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub local_addrs: Vec<IpAddr>,
    pub recent: BTreeSet<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Delivered to `dst` (`ip:port`, after DNAT if any).
    Accept {
        dst: String,
        dnat: bool,
        masquerade: bool,
        recent_set: Vec<String>,
    },
    Drop,
    Reject,
}

pub fn production(pkt: &Packet) -> trace::Packet {
    trace::Packet {
        src: pkt.src,
        dst: pkt.dst,
        dport: pkt.dport,
        proto: Some(match pkt.proto {
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            _ => Protocol::Tcp,
        }),
        local_origin: pkt.from_node,
    }
}

/// Traces `pkt` through `rules`: the distribution of verdicts (probabilities sum to 1).
pub fn trace_rules(rules: &Ruleset, pkt: &Packet, env: &Env) -> BTreeMap<Verdict, f64> {
    let t = trace::Tracer {
        rules,
        local_addrs: env.local_addrs.clone(),
        recent: env.recent.clone(),
    };
    let branches = t
        .trace(&production(pkt))
        .unwrap_or_else(|e| panic!("tracing {pkt:?}: {e}"));
    let mut out: BTreeMap<Verdict, f64> = BTreeMap::new();
    for b in branches {
        let v = match b.outcome {
            Outcome::Drop => Verdict::Drop,
            Outcome::Reject => Verdict::Reject,
            Outcome::Listener { port } => panic!("iptables redirected {pkt:?} to port {port}"),
            Outcome::Pass => Verdict::Accept {
                dst: std::net::SocketAddr::new(pkt.dst, pkt.dport).to_string(),
                dnat: false,
                masquerade: false,
                recent_set: b.records_affinity,
            },
            Outcome::Endpoint { to, masquerade } => Verdict::Accept {
                dst: to.to_string(),
                dnat: true,
                masquerade,
                recent_set: b.records_affinity,
            },
        };
        *out.entry(v).or_default() += b.share;
    }
    let total: f64 = out.values().sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "probabilities sum to {total}: {out:?}"
    );
    out
}

/// Traces `pkt` through the fake's tables.
pub fn trace(fake: &FakeIptables, pkt: &Packet, env: &Env) -> BTreeMap<Verdict, f64> {
    trace_rules(&Ruleset::from_fake(fake), pkt, env)
}

/// The iptables dataplane's tracer for the shared packet-flow table, over the fake's tables
/// or the kernel's `iptables-save`.
pub struct IptablesTracer {
    pub rules: Ruleset,
    pub env: Env,
}

impl IptablesTracer {
    pub fn over_fake(fake: &FakeIptables, env: Env) -> Self {
        Self {
            rules: Ruleset::from_fake(fake),
            env,
        }
    }

    /// # Panics
    /// When the text does not parse.
    pub fn over_save(save: &str, env: Env) -> Self {
        Self {
            rules: Ruleset::parse_save(save).unwrap_or_else(|e| panic!("{e}\n{save}")),
            env,
        }
    }
}

/// The kit's packet as this tracer takes it.
fn kit_packet(p: &svcnet_flows::Packet) -> Packet {
    Packet {
        src: p.src,
        dst: p.dst,
        proto: p.proto.as_str(),
        dport: p.dport,
        from_node: p.from == svcnet_flows::Client::Node,
    }
}

impl svcnet_flows::Tracer for IptablesTracer {
    fn name(&self) -> &'static str {
        "iptables"
    }

    /// The first connection's branch to `endpoint` sets its `recent` lists; with the client
    /// in them, the packet is traced again.
    fn trace_after(
        &self,
        first: &svcnet_flows::Packet,
        endpoint: std::net::SocketAddr,
        p: &svcnet_flows::Packet,
    ) -> svcnet_flows::Distribution {
        let mut env = self.env.clone();
        for (v, _) in trace_rules(&self.rules, &kit_packet(first), &self.env) {
            if let Verdict::Accept {
                dst, recent_set, ..
            } = v
                && dst == endpoint.to_string()
            {
                env.recent.extend(recent_set);
            }
        }
        let after = IptablesTracer {
            rules: self.rules.clone(),
            env,
        };
        after.trace(p)
    }

    fn trace(&self, p: &svcnet_flows::Packet) -> svcnet_flows::Distribution {
        use svcnet_flows::Outcome;
        let pkt = kit_packet(p);
        let mut out = svcnet_flows::Distribution::new();
        for (v, prob) in trace_rules(&self.rules, &pkt, &self.env) {
            let o = match v {
                Verdict::Drop => Outcome::Drop,
                Verdict::Reject => Outcome::Reject,
                Verdict::Accept { dnat: false, .. } => Outcome::Pass,
                Verdict::Accept {
                    dst, masquerade, ..
                } => Outcome::Endpoint {
                    to: dst.parse().unwrap_or_else(|_| panic!("bad address {dst}")),
                    masquerade,
                },
            };
            *out.entry(o).or_default() += prob;
        }
        out
    }
}
