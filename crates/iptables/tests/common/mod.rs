//! Shared by the snapshot, tracer and real-kernel tests: the world of services and the
//! packet-flow case table come from the shared kit (`svcnet-flows`, run against every
//! dataplane's tracer); this adds what only iptables needs (dump normalisation, `-m cluster`'s
//! hash).
#![allow(dead_code, clippy::unwrap_used)]

pub mod tracer;

pub use svcnet_flows::*;

/// A fake's dump with the rules of the shared chains sorted (partial syncs insert and delete
/// their rules in place, so only their set — and the rule that must stay last — matters).
/// Panics when a "must be last" rule is not last.
pub fn normalized(dump: &str) -> String {
    const SHARED: [&str; 5] = [
        "SVCNET-SERVICES",
        "SVCNET-NODEPORTS",
        "SVCNET-EXTERNAL-SERVICES",
        "SVCNET-PROXY-FIREWALL",
        "SVCNET-CLUSTER-IPS",
    ];
    let tail =
        |l: &str| l.contains("must be the last rule") || l.contains("unallocated service IP");
    let mut out: Vec<String> = Vec::new();
    let mut group: Vec<String> = Vec::new();
    let mut group_chain = String::new();
    let flush = |out: &mut Vec<String>, group: &mut Vec<String>, chain: &str| {
        if SHARED.contains(&chain) {
            let tails: Vec<&String> = group.iter().filter(|l| tail(l)).collect();
            if let Some(first_tail) = group.iter().position(|l| tail(l)) {
                assert_eq!(
                    first_tail,
                    group.len() - tails.len(),
                    "{chain}: a last rule is not last: {group:?}"
                );
            }
            let n = group.len() - tails.len();
            group[..n].sort();
        }
        out.append(group);
    };
    for line in dump.lines() {
        let chain = line
            .strip_prefix("-A ")
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or("")
            .to_string();
        if chain != group_chain {
            flush(&mut out, &mut group, &group_chain);
            group_chain = chain;
        }
        group.push(line.to_string());
    }
    flush(&mut out, &mut group, &group_chain);
    out.join("\n")
}

#[allow(unused_imports)] // not every test file hashes
pub use svcnet_iptables::trace::cluster_slot;
