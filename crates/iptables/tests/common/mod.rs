//! Shared by the snapshot, tracer and real-kernel tests: the world of services and the
//! packet-flow case table come from the shared kit (`svcnet-flows`, run against every
//! dataplane's tracer); this adds what only iptables needs (dump normalisation, `-m cluster`'s
//! hash).
#![allow(dead_code, clippy::unwrap_used)]

pub mod tracer;

use std::net::Ipv4Addr;

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

/// Linux's `jhash_1word` (include/linux/jhash.h), with which `-m cluster` hashes an IPv4
/// source address.
pub fn jhash_1word(a: u32, seed: u32) -> u32 {
    let init = seed.wrapping_add(0xdead_beef).wrapping_add(1 << 2);
    let (mut a, mut b, mut c) = (a.wrapping_add(init), init, init);
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

/// The slot `-m cluster --cluster-total-nodes total --cluster-hash-seed seed` hashes an IPv4
/// source into (`reciprocal_scale` of the hash of the address as it lies in memory).
pub fn cluster_slot(src: Ipv4Addr, seed: u32, total: u32) -> u32 {
    let h = jhash_1word(u32::from_ne_bytes(src.octets()), seed);
    ((u64::from(h) * u64::from(total)) >> 32) as u32
}
