//! Deferred deletion: partial syncs flush the chains they no longer need and leave their
//! deletion (which makes `nft` load its cache of the whole ruleset) to a later batch.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use svcnet_nft::{FakeNft, Family, FullMode, GARBAGE_LIMIT, Op, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, IpFamily, NamespacedName, ProxyState};

fn state() -> ProxyState {
    ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    })
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

/// Applies a partial sync of the pending changes; returns its operations.
fn sync(s: &mut ProxyState, r: &mut Renderer, fake: &mut FakeNft) -> Vec<Op> {
    let changes = s.take_changes();
    let desired = s.desired_for(IpFamily::V4, changes.services.keys());
    let plan = r
        .plan_partial(&s.node_state(IpFamily::V4), &desired)
        .unwrap();
    fake.apply(&plan.tx).unwrap();
    let ops = plan.tx.ops.clone();
    r.commit(plan);
    ops
}

fn fresh(s: &ProxyState) -> FakeNft {
    let mut fake = FakeNft::new();
    let plan = Renderer::new(Family::Ip).plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    fake.apply(&plan.tx).unwrap();
    fake
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
    let mut r = Renderer::new(Family::Ip);
    let mut fake = FakeNft::new();
    let plan = r.plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);

    endpoints(&mut s, "web", &["10.244.1.2"]);
    let ops = sync(&mut s, &mut r, &mut fake);
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
    sync(&mut s, &mut r, &mut fake);
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
    let mut r = Renderer::new(Family::Ip);
    let mut fake = FakeNft::new();
    let plan = r.plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);

    // Down to a cascade (the map goes to the garbage with its ten elements), then back up to
    // nine endpoints: the map must not keep a tenth slot pointing at a garbage chain.
    endpoints(&mut s, "big", &many[..2]);
    sync(&mut s, &mut r, &mut fake);
    endpoints(&mut s, "big", &many[..9]);
    sync(&mut s, &mut r, &mut fake);
    let live = fresh(&s);
    fake.collect_garbage(&mut r, &live).unwrap();
    assert_eq!(fake.dump(), live.dump());
}

#[test]
fn garbage_past_the_limit_is_deleted_by_the_next_partial_sync() {
    let mut s = state();
    let n = GARBAGE_LIMIT / 3 + 2; // each service leaves a service and two endpoint chains
    for i in 0..n {
        let svc = format!("s{i}");
        add_service(&mut s, &svc, &format!("10.96.{}.{}", i / 250, 1 + i % 250));
        endpoints(&mut s, &svc, &["10.244.1.2", "10.244.2.2"]);
    }
    s.take_changes();
    let mut r = Renderer::new(Family::Ip);
    let mut fake = FakeNft::new();
    let plan = r.plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);

    let mut deleted_at = None;
    for i in 0..n {
        s.delete_service(&NamespacedName::new("default", format!("s{i}")));
        let ops = sync(&mut s, &mut r, &mut fake);
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
    let mut r = Renderer::new(Family::Ip);
    let mut fake = FakeNft::new();
    let plan = r.plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);
    s.delete_service(&NamespacedName::new("default", "web"));
    sync(&mut s, &mut r, &mut fake);
    assert_eq!(r.garbage_len(), 3);

    let plan = r.plan_full(&s.desired(IpFamily::V4), FullMode::Reassert);
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);
    assert_eq!(r.garbage_len(), 0);
    assert_eq!(fake.dump(), fresh(&s).dump());
}
