//! A sync of one family as a value: the IPVS operations, the dummy's address changes, the
//! `ipset restore` text and the iptables payload that take the kernel (or the applied model)
//! to the rendered state. Pure: [`diff_servers`] and [`ipset_text`] compare two states.
//!
//! Graceful termination (kube-proxy's `GracefulDeleteRS`): a real server leaving a TCP or
//! SCTP virtual server that stays is not deleted but given weight 0, so established
//! connections continue and new ones go elsewhere; the dataplane deletes it once its
//! connections are gone (or a bound passes). UDP real servers are deleted at once
//! (`expire_nodest_conn=1` moves their flows to the new real servers on the next packet).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use svcnet_iptables::Payload;
use svcnet_lb::Fallback;
use svcnet_proxy::{IpFamily, ServicePortName};

use crate::render::{Rendered, Set, VirtualServer};
use crate::types::{DestKey, Op, Protocol, ServiceKey};

/// One family's sync.
#[derive(Clone, Debug)]
pub struct Plan {
    pub family: IpFamily,
    pub full: bool,
    pub ops: Vec<Op>,
    pub addr_add: Vec<IpAddr>,
    pub addr_del: Vec<IpAddr>,
    /// `ipset restore` input (empty: nothing to change).
    pub ipset: String,
    /// The iptables payload (`None`: the rules stay as they are).
    pub iptables: Option<Payload>,
    /// The state after the plan is applied (the rendered one plus real servers draining).
    pub rendered: Rendered,
    /// Real servers given weight 0 by this plan, to delete once drained.
    pub drains: Vec<(ServiceKey, DestKey)>,
    pub fallbacks: Vec<(ServicePortName, Fallback)>,
    /// A partial plan's renderer memory (marks handed out, ports rendered), kept on commit.
    pub renderer: Option<crate::render::Renderer>,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.full { "full" } else { "partial" };
        writeln!(f, "# ipvs {kind} sync of {}", self.family)?;
        for op in &self.ops {
            writeln!(f, "{op}")?;
        }
        for a in &self.addr_add {
            writeln!(f, "# address add {a} dev {}", crate::render::DUMMY)?;
        }
        for a in &self.addr_del {
            writeln!(f, "# address del {a} dev {}", crate::render::DUMMY)?;
        }
        f.write_str(&self.ipset)?;
        if let Some(p) = &self.iptables {
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// The operations of a diff, the servers after them (draining real servers at weight 0) and
/// the real servers newly draining.
pub type ServerDiff = (
    Vec<Op>,
    BTreeMap<ServiceKey, VirtualServer>,
    Vec<(ServiceKey, DestKey)>,
);

/// The operations taking `observed` to `desired`; returns them, the state afterwards (with
/// draining real servers at weight 0) and the real servers newly draining.
pub fn diff_servers(
    observed: &BTreeMap<ServiceKey, VirtualServer>,
    desired: &BTreeMap<ServiceKey, VirtualServer>,
) -> ServerDiff {
    let mut ops = Vec::new();
    let mut after = desired.clone();
    let mut drains = Vec::new();
    for k in observed.keys() {
        if !desired.contains_key(k) {
            ops.push(Op::DelService(*k));
        }
    }
    for (k, vs) in desired {
        let Some(o) = observed.get(k) else {
            ops.push(Op::AddService(vs.service.clone()));
            ops.extend(vs.dests.values().map(|d| Op::AddDest(*k, d.clone())));
            continue;
        };
        if !vs.service.same_config(&o.service) {
            ops.push(Op::EditService(vs.service.clone()));
        }
        for (dk, d) in &vs.dests {
            match o.dests.get(dk) {
                None => ops.push(Op::AddDest(*k, d.clone())),
                Some(od)
                    if od.weight != d.weight
                        || od.forward != d.forward
                        || od.upper_threshold != d.upper_threshold
                        || od.lower_threshold != d.lower_threshold =>
                {
                    ops.push(Op::EditDest(*k, d.clone()))
                }
                Some(_) => {}
            }
        }
        for (dk, od) in &o.dests {
            if vs.dests.contains_key(dk) {
                continue;
            }
            if vs.protocol == Protocol::Udp {
                ops.push(Op::DelDest(*k, *dk));
                continue;
            }
            let mut drained = od.clone();
            if drained.weight != 0 {
                drained.weight = 0;
                ops.push(Op::EditDest(*k, drained.clone()));
                drains.push((*k, *dk));
            }
            if let Some(v) = after.get_mut(k) {
                v.dests.insert(*dk, drained);
            }
        }
    }
    (ops, after, drains)
}

fn family_name(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "inet",
        IpFamily::V6 => "inet6",
    }
}

/// The `ipset restore` text taking the sets from `old` to `new` (`None`: unknown, rebuild
/// every set atomically: fill a temporary one and swap it in).
pub fn ipset_text(family: IpFamily, old: Option<&Rendered>, new: &Rendered) -> String {
    let mut out = String::new();
    let empty = BTreeSet::new();
    for set in Set::ALL {
        let name = set.name(family);
        let members = new.members.get(&set).unwrap_or(&empty);
        let create = |name: &str| {
            format!(
                "create {name} {} family {} -exist\n",
                set.kind(),
                family_name(family)
            )
        };
        match old {
            None => {
                let tmp = format!("{name}-T");
                out.push_str(&create(&name));
                out.push_str(&create(&tmp));
                out.push_str(&format!("flush {tmp}\n"));
                for m in members {
                    out.push_str(&format!("add {tmp} {m} -exist\n"));
                }
                out.push_str(&format!("swap {name} {tmp}\ndestroy {tmp}\n"));
            }
            Some(old) => {
                let before = old.members.get(&set).unwrap_or(&empty);
                for m in before.difference(members) {
                    out.push_str(&format!("del {name} {m} -exist\n"));
                }
                for m in members.difference(before) {
                    out.push_str(&format!("add {name} {m} -exist\n"));
                }
            }
        }
    }
    out
}
