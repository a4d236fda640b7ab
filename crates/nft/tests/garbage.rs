//! Partial syncs that keep `nft` from loading its cache of the whole ruleset: rules written as
//! chain blocks, elements as set declarations, and deletions deferred to a later batch.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use svcnet_netns::{NetNs, unique_name};
mod common;

use common::{config, full, partial};
use svcnet_nft::{FakeNft, Family, FullMode, GARBAGE_LIMIT, NftExecutor, Op, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{IpFamily, NamespacedName, ProxyState};

fn state() -> ProxyState {
    ProxyState::new(config())
}

fn endpoints(s: &mut ProxyState, svc: &str, ips: &[&str]) {
    s.update_slice(&slice("default", &format!("{svc}-1"), svc, |b| {
        b.port("http", "TCP", 8080);
        for ip in ips {
            b.endpoint(ip, "n1", |_| {});
        }
    }));
}

fn add_service(s: &mut ProxyState, svc: &str, ip: &str) {
    s.update_service(&service("default", svc, |b| {
        b.cluster_ip(&[ip]).port("http", "TCP", 80);
    }))
    .unwrap();
}

fn fresh(s: &ProxyState) -> FakeNft {
    full(s, None).1
}

fn is_delete(op: &Op) -> bool {
    matches!(op, Op::DeleteChain(_) | Op::DeleteSet { .. })
}

#[test]
fn a_removed_endpoint_chain_is_flushed_now_and_reused_when_it_comes_back() {
    let mut s = state();
    add_service(&mut s, "web", "10.96.0.10");
    endpoints(&mut s, "web", &["10.244.1.2", "10.244.2.2"]);
    s.take_changes();
    let (mut r, mut fake, _) = full(&s, None);

    endpoints(&mut s, "web", &["10.244.1.2"]);
    let ops = partial(&mut s, &mut r, &mut fake, None).ops;
    assert!(!ops.iter().any(is_delete), "{ops:?}");
    assert_eq!(r.garbage_len(), 1);
    let gone: Vec<String> = fake
        .chain_names()
        .into_iter()
        .filter(|c| c.contains("10.244.2.2"))
        .collect();
    assert_eq!(gone.len(), 1);
    assert_eq!(fake.rules(&gone[0]).unwrap(), Vec::<String>::new());

    // The endpoint comes back: its (empty) chain is filled again, not deleted later.
    endpoints(&mut s, "web", &["10.244.1.2", "10.244.2.2"]);
    partial(&mut s, &mut r, &mut fake, None);
    assert_eq!(r.garbage_len(), 0);
    assert_eq!(fake.dump(), fresh(&s).dump());
    assert!(r.plan_gc().is_none());
}

#[test]
fn an_endpoints_map_coming_back_from_the_garbage_is_flushed_first() {
    let many: Vec<String> = (1..=10).map(|i| format!("10.244.{i}.2")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let mut s = state();
    add_service(&mut s, "big", "10.96.0.20");
    endpoints(&mut s, "big", &many);
    s.take_changes();
    let (mut r, mut fake, _) = full(&s, None);

    // Down to a cascade (the map goes to the garbage with its ten elements), then back up to
    // nine endpoints: the map must not keep a tenth slot pointing at a garbage chain.
    endpoints(&mut s, "big", &many[..2]);
    partial(&mut s, &mut r, &mut fake, None);
    endpoints(&mut s, "big", &many[..9]);
    partial(&mut s, &mut r, &mut fake, None);
    let live = fresh(&s);
    fake.collect_garbage(&mut r, &live).unwrap();
    assert_eq!(fake.dump(), live.dump());
}

#[test]
fn garbage_past_the_limit_is_deleted_by_the_next_partial_partial() {
    let mut s = state();
    let n = GARBAGE_LIMIT / 3 + 2; // each service leaves a service and two endpoint chains
    for i in 0..n {
        let svc = format!("s{i}");
        add_service(&mut s, &svc, &format!("10.96.{}.{}", i / 250, 1 + i % 250));
        endpoints(&mut s, &svc, &["10.244.1.2", "10.244.2.2"]);
    }
    s.take_changes();
    let (mut r, mut fake, _) = full(&s, None);

    let mut deleted_at = None;
    for i in 0..n {
        s.delete_service(&NamespacedName::new("default", format!("s{i}")));
        let ops = partial(&mut s, &mut r, &mut fake, None).ops;
        if ops.iter().any(is_delete) {
            deleted_at.get_or_insert(i);
        }
        assert!(r.garbage_len() <= GARBAGE_LIMIT, "{}", r.garbage_len());
    }
    // Deletions happen once, when the limit is passed (after 171 services of 3 chains).
    assert_eq!(deleted_at, Some(GARBAGE_LIMIT / 3));
    let live = fresh(&s);
    fake.collect_garbage(&mut r, &live).unwrap();
    assert_eq!(fake.dump(), live.dump());
}

#[test]
fn a_periodic_resync_deletes_the_garbage() {
    let mut s = state();
    add_service(&mut s, "web", "10.96.0.10");
    endpoints(&mut s, "web", &["10.244.1.2", "10.244.2.2"]);
    s.take_changes();
    let (mut r, mut fake, _) = full(&s, None);
    s.delete_service(&NamespacedName::new("default", "web"));
    partial(&mut s, &mut r, &mut fake, None);
    assert_eq!(r.garbage_len(), 3);

    let plan = r.plan_full(&s.desired(IpFamily::V4), FullMode::Reassert);
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);
    assert_eq!(r.garbage_len(), 0);
    assert_eq!(fake.dump(), fresh(&s).dump());
}

/// The commands that make `nft` load its cache of the whole ruleset before compiling.
const CACHE_LOADING: [&str; 6] = [
    "add rule ",
    "add element ",
    "delete element ",
    "delete chain ",
    "delete map ",
    "delete set ",
];

#[test]
fn one_service_changes_write_nothing_that_makes_nft_load_its_cache() {
    let ten: Vec<String> = (1..=10).map(|i| format!("10.244.{i}.2")).collect();
    let ten: Vec<&str> = ten.iter().map(String::as_str).collect();
    let mut s = state();
    add_service(&mut s, "web", "10.96.0.10");
    endpoints(&mut s, "web", &["10.244.1.2", "10.244.2.2"]);
    add_service(&mut s, "big", "10.96.0.20");
    endpoints(&mut s, "big", &ten);
    s.take_changes();
    // The real kernel (a fresh namespace) takes every transaction too.
    let ns = NetNs::create(&unique_name("nftgc")).expect("needs root");
    let kernel = NftExecutor::new(Some(ns.name().to_string()));
    let (mut r, mut fake, _) = full(&s, Some(&kernel));

    let mut texts = Vec::new();
    let mut step = |s: &mut ProxyState, r: &mut Renderer, fake: &mut FakeNft| {
        texts.push(partial(s, r, fake, Some(&kernel)).to_string());
    };
    // An endpoint replaced, in a cascade and in an endpoints map; an endpoint removed from
    // the map; a service added.
    endpoints(&mut s, "web", &["10.244.1.2", "10.244.9.9"]);
    step(&mut s, &mut r, &mut fake);
    let mut replaced = ten.clone();
    replaced[3] = "10.244.99.4";
    endpoints(&mut s, "big", &replaced);
    step(&mut s, &mut r, &mut fake);
    endpoints(&mut s, "big", &replaced[..9]);
    step(&mut s, &mut r, &mut fake);
    add_service(&mut s, "new", "10.96.0.30");
    endpoints(&mut s, "new", &["10.244.7.2", "10.244.8.2"]);
    step(&mut s, &mut r, &mut fake);

    for text in &texts {
        for line in text.lines() {
            assert!(
                !CACHE_LOADING.iter().any(|c| line.starts_with(c)),
                "{line}\nin\n{text}"
            );
        }
    }
    let gc = r.plan_gc().unwrap();
    kernel.apply(&gc.tx).unwrap();
    let live = fresh(&s);
    fake.collect_garbage(&mut r, &live).unwrap();
    assert_eq!(fake.dump(), live.dump());
    // The kernel holds exactly the live chains.
    let listed = kernel.list_table(Family::Ip, "svcnet").unwrap().unwrap();
    let mut kernel_chains: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.trim().strip_prefix("chain "))
        .map(|l| l.trim_end_matches(" {"))
        .collect();
    kernel_chains.sort();
    let mut want = live.chain_names();
    want.sort();
    assert_eq!(kernel_chains, want);
}
