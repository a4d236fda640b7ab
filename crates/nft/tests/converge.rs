//! Partial syncs converge to a fresh full sync, as a seeded sequence property: random changes
//! (endpoints added, removed, replaced, moved to other counts and nodes; affinity and
//! algorithm switched; node ports and `externalTrafficPolicy: Local` toggled; services added
//! and deleted) each applied as one partial sync, with a periodic reassert among them. After
//! every step the fake's canonical dump equals a fresh full sync's; the same transactions are
//! applied to a REAL kernel table, whose listing must in the end equal the listing of a fresh
//! full sync loaded into a second namespace (elements compared as sets). The kernel half needs
//! root (CI runs as root); its namespaces are removed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::collections::BTreeMap;

use svcnet_netns::{NetNs, unique_name};
use svcnet_nft::trace::Ruleset;
use svcnet_nft::{Family, FullMode, NftExecutor};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{IpFamily, NamespacedName, ProxyState};

/// A small deterministic generator (no dependency needed for a seeded sequence).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

const SERVICES: u64 = 6;
const ALGORITHMS: [Option<&str>; 4] = [None, Some("rr"), Some("sh"), Some("maglev")];

/// Service `i`'s current settings.
#[derive(Clone, Copy, Default)]
struct Svc {
    exists: bool,
    udp: bool,
    node_port: bool,
    local: bool,
    affinity: bool,
    algorithm: usize,
}

fn put_service(s: &mut ProxyState, i: u64, v: Svc) {
    let name = format!("s{i}");
    if !v.exists {
        s.delete_service(&NamespacedName::new("default", &name));
        return;
    }
    let mut svc = service("default", &name, |b| {
        b.cluster_ip(&[&format!("10.96.0.{}", 10 + i)]);
        let proto = if v.udp { "UDP" } else { "TCP" };
        if v.node_port {
            b.node_port("p", proto, 80, 30000 + i as i32);
            b.external_ips(&[&format!("198.51.100.{}", 10 + i)]);
        } else {
            b.port("p", proto, 80);
        }
        if v.local {
            b.external_local();
        }
        if v.affinity {
            b.affinity(Some(600));
        }
    });
    if let Some(a) = ALGORITHMS[v.algorithm] {
        svc.metadata.annotations = Some(
            [(
                svcnet_proxy::algorithm::ANNOTATION.to_string(),
                a.to_string(),
            )]
            .into_iter()
            .collect(),
        );
    }
    s.update_service(&svc).unwrap();
}

fn put_endpoints(s: &mut ProxyState, i: u64, v: Svc, eps: &[(u8, bool)]) {
    let name = format!("s{i}");
    let proto = if v.udp { "UDP" } else { "TCP" };
    s.update_slice(&slice("default", &format!("{name}-1"), &name, |b| {
        b.port("p", proto, 8080);
        for (host, local) in eps {
            let node = if *local { "n1" } else { "n2" };
            b.endpoint(&format!("10.244.{}.{host}", i + 1), node, |_| {});
        }
    }));
}

/// A listing as a comparable value: chains and rules as listed, each set's elements sorted.
fn canonical(listing: &str) -> Ruleset {
    let mut rs = Ruleset::parse_listing(listing).unwrap();
    for e in rs.sets.values_mut() {
        e.sort();
    }
    rs
}

#[test]
fn partial_syncs_converge_to_a_fresh_full_sync() {
    let kernel = is_root();
    let ns = kernel.then(|| NetNs::create(&unique_name("nfcv")).expect("needs root"));
    let exec = ns
        .as_ref()
        .map(|n| NftExecutor::new(Some(n.name().to_string())));
    for seed in [1u64, 7, 42] {
        let mut rng = Lcg(seed);
        let mut state = ProxyState::new(common::config());
        let mut svcs: BTreeMap<u64, Svc> = BTreeMap::new();
        let (mut r, mut fake, _) = common::full(&state, exec.as_ref());
        for step in 0..60 {
            let i = rng.next(SERVICES);
            let mut v = svcs.get(&i).copied().unwrap_or_default();
            match rng.next(7) {
                0 => v.exists = !v.exists,
                1 => v.affinity = !v.affinity,
                2 => v.algorithm = rng.next(ALGORITHMS.len() as u64) as usize,
                3 => v.node_port = !v.node_port,
                4 => v.local = !v.local,
                5 => v.udp = !v.udp,
                _ => {}
            }
            if !svcs.contains_key(&i) {
                v.exists = true;
            }
            svcs.insert(i, v);
            put_service(&mut state, i, v);
            let n = rng.next(5) as usize;
            let eps: Vec<(u8, bool)> = (0..n)
                .map(|_| (2 + rng.next(6) as u8, rng.next(2) == 0))
                .collect();
            put_endpoints(&mut state, i, v, &eps);
            if step % 20 == 19 {
                // A periodic resync re-asserts everything (keeping affinity entries).
                state.take_changes();
                let plan = r.plan_full(&state.desired(IpFamily::V4), FullMode::Reassert);
                fake.apply(&plan.tx).unwrap();
                if let Some(e) = &exec
                    && let Err(err) = e.apply(&plan.tx)
                {
                    panic!("seed {seed} step {step}: nft rejected:\n{}\n{err}", plan.tx);
                }
                r.commit(plan);
            } else {
                common::partial(&mut state, &mut r, &mut fake, exec.as_ref());
            }
            let (_, fresh, _) = common::full(&state, None);
            assert_eq!(fake.dump(), fresh.dump(), "seed {seed} step {step}");
        }
        if let (Some(exec), Some(_)) = (&exec, &ns) {
            let fresh_ns = NetNs::create(&unique_name("nfcf")).expect("needs root");
            let fresh_exec = NftExecutor::new(Some(fresh_ns.name().to_string()));
            common::full(&state, Some(&fresh_exec));
            let got = exec.list_table(Family::Ip, "svcnet").unwrap().unwrap();
            let want = fresh_exec
                .list_table(Family::Ip, "svcnet")
                .unwrap()
                .unwrap();
            assert_eq!(canonical(&got), canonical(&want), "seed {seed}");
            exec.delete_table(Family::Ip, "svcnet").unwrap();
        }
    }
}

/// Whether the test runs as root (it then also checks the kernel).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
