//! Services with more endpoints than the `numgen` cascade handles (`CASCADE_MAX`): the service
//! chain picks an endpoint with one `numgen random mod N vmap { … }` lookup. Snapshots of the
//! rendered rules, applied to `FakeNft` (which rejects dangling references), and partial syncs
//! that cross the limit both ways converging to a fresh full sync.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::{config, full};
use expect_test::{Expect, expect};
use svcnet_nft::names::endpoints_map;
use svcnet_nft::render::CASCADE_MAX;
use svcnet_nft::{FakeNft, FullMode, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{IpFamily, ProxyState};

/// `big` with endpoints 10.244.1.2 … 10.244.n.2 on port 8080.
fn big_slice(n: usize) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    slice("default", "big-1", "big", |s| {
        s.port("http", "TCP", 8080);
        for i in 1..=n {
            s.endpoint(&format!("10.244.{i}.2"), "n2", |_| {});
        }
    })
}

fn big_state(n: usize) -> ProxyState {
    let mut s = ProxyState::new(config());
    s.update_service(&service("default", "big", |s| {
        s.cluster_ip(&["10.96.0.100"]).port("http", "TCP", 80);
    }))
    .unwrap();
    s.update_slice(&big_slice(n));
    s
}

/// The name of the one `service-…` chain in the fake.
fn service_chain(fake: &FakeNft) -> String {
    let chains: Vec<String> = fake
        .chain_names()
        .into_iter()
        .filter(|c| c.starts_with("service-") && c.contains('/'))
        .collect();
    assert_eq!(chains.len(), 1, "{chains:?}");
    chains[0].clone()
}

/// The service chain's rules, one per line, with the endpoint chains' hashes elided so the
/// snapshot shows the structure.
fn service_rules(fake: &FakeNft) -> String {
    let elide = |r: &str| -> String {
        let elided: Vec<String> = r
            .split(' ')
            .map(|w| match w.strip_prefix("endpoint-") {
                Some(rest) => format!("endpoint-*{}", &rest[rest.find('/').unwrap_or(0)..]),
                None => w.to_string(),
            })
            .collect();
        elided.join(" ")
    };
    let rules = fake.rules(&service_chain(fake)).unwrap();
    let mut out = String::new();
    for r in rules {
        out.push_str(&elide(&r));
        out.push('\n');
        // A named endpoints map: its elements, indented under the rule.
        if let Some((_, map)) = r.split_once("vmap @") {
            for e in fake.elements(map) {
                out.push_str(&format!("  {}\n", elide(&e)));
            }
        }
    }
    out
}

#[test]
fn ten_endpoints_pick_with_one_verdict_map() {
    const { assert!(10 > CASCADE_MAX) };
    let (_, fake, text) = full(&big_state(10), None);
    let marker = "add chain ip svcnet nat-postrouting { jump masquerading ; }\n";
    let (_, services) = text.split_once(marker).unwrap();
    let service_lines: String = services
        .lines()
        .filter(|l| l.starts_with("add chain ip svcnet service-") && l.contains('{'))
        .map(|l| format!("{l}\n"))
        .collect();
    expect![[r#"
        add chain ip svcnet service-AOKYFKGZ-default/big/tcp/http { ip daddr 10.96.0.100 tcp dport 80 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade ; numgen random mod 10 vmap @service-AOKYFKGZ-default/big/tcp/http-endpoints ; }
    "#]]
    .assert_eq(&service_lines);
    // Every vmap target exists, once, and is a DNAT chain to its endpoint.
    let endpoint_chains: Vec<String> = fake
        .chain_names()
        .into_iter()
        .filter(|c| c.starts_with("endpoint-"))
        .collect();
    assert_eq!(endpoint_chains.len(), 10, "{endpoint_chains:?}");
    let vmap_rule = &fake.rules(&service_chain(&fake)).unwrap()[1];
    let (_, map) = vmap_rule.split_once("vmap @").unwrap();
    assert_eq!(map, endpoints_map(&service_chain(&fake)));
    let elements = fake.elements(map);
    assert_eq!(elements.len(), 10, "{elements:?}");
    let vmap_rule = elements.join(", ");
    for c in &endpoint_chains {
        assert_eq!(vmap_rule.matches(&format!("goto {c}")).count(), 1, "{c}");
        let ip = c.rsplit("__").next().unwrap().replace('/', ":");
        let rules = fake.rules(c).unwrap();
        assert!(
            rules.iter().any(|r| r.ends_with(&format!("dnat to {ip}"))),
            "{c}: {rules:?}"
        );
    }
    for i in 0..10 {
        assert!(vmap_rule.contains(&format!("{i} : goto ")), "slot {i}");
    }
    assert!(!vmap_rule.contains("10 : goto"));
}

/// A partial sync of the state's changes: checks it converges to a fresh full sync and
/// snapshots the service chain.
fn partial(state: &mut ProxyState, r: &mut Renderer, fake: &mut FakeNft, expect: Expect) {
    common::partial(state, r, fake, None);
    common::assert_converged(state, r, fake);
    expect.assert_eq(&service_rules(fake));
}

#[test]
fn partial_syncs_cross_the_cascade_limit_both_ways() {
    let mut state = big_state(CASCADE_MAX);
    state.take_changes();
    let (mut r, mut fake, _) = full(&state, None);
    expect![[r#"
        ip daddr 10.96.0.100 tcp dport 80 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade
        numgen random mod 8 == 0 goto endpoint-*/big/tcp/http__10.244.1.2/8080
        numgen random mod 7 == 0 goto endpoint-*/big/tcp/http__10.244.2.2/8080
        numgen random mod 6 == 0 goto endpoint-*/big/tcp/http__10.244.3.2/8080
        numgen random mod 5 == 0 goto endpoint-*/big/tcp/http__10.244.4.2/8080
        numgen random mod 4 == 0 goto endpoint-*/big/tcp/http__10.244.5.2/8080
        numgen random mod 3 == 0 goto endpoint-*/big/tcp/http__10.244.6.2/8080
        numgen random mod 2 == 0 goto endpoint-*/big/tcp/http__10.244.7.2/8080
        goto endpoint-*/big/tcp/http__10.244.8.2/8080
    "#]]
    .assert_eq(&service_rules(&fake));

    // One more endpoint: the cascade becomes one verdict map.
    state.update_slice(&big_slice(CASCADE_MAX + 1));
    partial(
        &mut state,
        &mut r,
        &mut fake,
        expect![[r#"
            ip daddr 10.96.0.100 tcp dport 80 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade
            numgen random mod 9 vmap @service-AOKYFKGZ-default/big/tcp/http-endpoints
              0 : goto endpoint-*/big/tcp/http__10.244.1.2/8080
              1 : goto endpoint-*/big/tcp/http__10.244.2.2/8080
              2 : goto endpoint-*/big/tcp/http__10.244.3.2/8080
              3 : goto endpoint-*/big/tcp/http__10.244.4.2/8080
              4 : goto endpoint-*/big/tcp/http__10.244.5.2/8080
              5 : goto endpoint-*/big/tcp/http__10.244.6.2/8080
              6 : goto endpoint-*/big/tcp/http__10.244.7.2/8080
              7 : goto endpoint-*/big/tcp/http__10.244.8.2/8080
              8 : goto endpoint-*/big/tcp/http__10.244.9.2/8080
        "#]],
    );

    // A tenth endpoint: the map grows (its new slot goes to 10.244.10.2, sorted by address).
    state.update_slice(&big_slice(10));
    partial(
        &mut state,
        &mut r,
        &mut fake,
        expect![[r#"
            ip daddr 10.96.0.100 tcp dport 80 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade
            numgen random mod 10 vmap @service-AOKYFKGZ-default/big/tcp/http-endpoints
              0 : goto endpoint-*/big/tcp/http__10.244.1.2/8080
              1 : goto endpoint-*/big/tcp/http__10.244.2.2/8080
              2 : goto endpoint-*/big/tcp/http__10.244.3.2/8080
              3 : goto endpoint-*/big/tcp/http__10.244.4.2/8080
              4 : goto endpoint-*/big/tcp/http__10.244.5.2/8080
              5 : goto endpoint-*/big/tcp/http__10.244.6.2/8080
              6 : goto endpoint-*/big/tcp/http__10.244.7.2/8080
              7 : goto endpoint-*/big/tcp/http__10.244.8.2/8080
              8 : goto endpoint-*/big/tcp/http__10.244.9.2/8080
              9 : goto endpoint-*/big/tcp/http__10.244.10.2/8080
        "#]],
    );

    // Back under the limit: the map is gone, the cascade is back, removed chains deleted.
    state.update_slice(&big_slice(3));
    partial(
        &mut state,
        &mut r,
        &mut fake,
        expect![[r#"
        ip daddr 10.96.0.100 tcp dport 80 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade
        numgen random mod 3 == 0 goto endpoint-*/big/tcp/http__10.244.1.2/8080
        numgen random mod 2 == 0 goto endpoint-*/big/tcp/http__10.244.2.2/8080
        goto endpoint-*/big/tcp/http__10.244.3.2/8080
    "#]],
    );
    assert_eq!(
        fake.chain_names()
            .iter()
            .filter(|c| c.starts_with("endpoint-"))
            .count(),
        3
    );
    assert!(
        !fake.dump().contains(&endpoints_map(&service_chain(&fake))),
        "the endpoints map outlived its last use"
    );
}

#[test]
fn periodic_resyncs_rewrite_and_drop_the_endpoints_map() {
    // 10 endpoints, then 9 (a stale slot) then 3 (no map): each by a full `Reassert`, which
    // must converge to a fresh `Recreate` of the same state.
    let mut state = big_state(10);
    let (mut r, mut fake, _) = full(&state, None);
    let map = endpoints_map(&service_chain(&fake));
    for (n, slots) in [(9, 9), (3, 0)] {
        state.update_slice(&big_slice(n));
        let plan = r.plan_full(&state.desired(IpFamily::V4), FullMode::Reassert);
        fake.apply(&plan.tx).unwrap();
        r.commit(plan);
        let (_, fresh, _) = full(&state, None);
        assert_eq!(fake.dump(), fresh.dump(), "{n} endpoints");
        assert_eq!(fake.elements(&map).len(), slots, "{n} endpoints");
    }
    assert!(!fake.dump().contains(&map));
}
