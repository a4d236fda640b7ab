//! ClientIP affinity in the REAL kernel through the nftables dataplane (`NftDataplane`, as
//! proxyd drives it): a client is pinned to one endpoint by the affinity map the packet path
//! fills; each new connection refreshes the entry's timeout; when the pinned endpoint goes
//! away, the sync that removes it also deletes the entries pinned to it, so the client's next
//! connection goes to a live endpoint (and is pinned again). Needs root (CI runs as root);
//! the lab's namespaces are removed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::net::SocketAddr;
use std::time::Duration;

use svcnet_netns::test_support::{Lab, tcp_ask};
use svcnet_nft::{NftDataplane, NftExecutor};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, Dataplane, FullReason, IpFamily, ProxyState};

const VIP: &str = "10.96.0.50:80";
const TIMEOUT: i32 = 60;

fn sync(dp: &mut NftDataplane, state: &mut ProxyState, full: bool) {
    sync_why(dp, state, full.then_some(FullReason::Unknown));
}

/// A full sync for `why` (`Periodic`: a reassert that keeps the affinity maps), or partial.
fn sync_why(dp: &mut NftDataplane, state: &mut ProxyState, why: Option<FullReason>) {
    let changes = state.take_changes();
    let family = IpFamily::V4;
    let plan = if let Some(why) = why {
        dp.plan_full(family, &state.desired(family), why).unwrap()
    } else {
        let desired = state.desired_for(family, changes.services.keys());
        dp.plan_partial(family, &state.node_state(family), &desired)
            .unwrap()
    };
    if let Err(e) = dp.apply(family, &plan) {
        panic!("nft rejected:\n{plan}\n{e}");
    }
    dp.commit(family, plan);
}

fn ask(lab: &Lab, n: usize) -> Vec<String> {
    let addr: SocketAddr = VIP.parse().unwrap();
    lab.pod(0)
        .ns
        .run(move || {
            (0..n)
                .map(|_| tcp_ask(addr, Duration::from_millis(1500)).unwrap().identity)
                .collect::<Vec<_>>()
        })
        .unwrap()
}

/// The service port's affinity map of its cluster pool (every frontend records there).
fn map() -> String {
    svcnet_nft::names::affinity_object(
        "cluster",
        &svcnet_proxy::ServicePortName {
            service: svcnet_proxy::NamespacedName::new("default", "sticky"),
            port: "http".into(),
            protocol: svcnet_proxy::Protocol::Tcp,
        },
    )
}

/// The affinity entries (`client : endpoint`) and their remaining time in seconds, as the
/// kernel lists them.
fn entries(lab: &Lab) -> Vec<(String, f64)> {
    let map = map();
    let text = lab
        .node
        .exec(&["nft", "list", "map", "ip", "svcnet", &map])
        .unwrap();
    let rs = svcnet_nft::trace::Ruleset::parse_listing(&text).unwrap();
    let expires: Vec<f64> = text
        .split(" expires ")
        .skip(1)
        .map(|rest| seconds(rest.split_whitespace().next().unwrap_or("")))
        .collect();
    rs.sets
        .get(&map)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .zip(expires)
        .collect()
}

/// `59s880ms`, `1m2s` → seconds.
fn seconds(s: &str) -> f64 {
    let mut total = 0.0;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let v: f64 = num.parse().unwrap_or(0.0);
        num.clear();
        total += match c {
            'h' => v * 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                v / 1000.0
            }
            'm' => v * 60.0,
            's' => v,
            _ => 0.0,
        };
    }
    total
}

#[test]
fn affinity_pins_refreshes_and_forgets_a_removed_endpoint() {
    let mut lab = Lab::new().expect("creating namespaces needs root");
    for _ in 0..3 {
        lab.add_pod().unwrap();
    }
    for i in 1..=2 {
        lab.serve_tcp(i, 8080, &format!("b{i}")).unwrap();
    }
    let ips: Vec<String> = (1..=2).map(|i| lab.pod(i).ipv4.to_string()).collect();
    let mut state = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    });
    state
        .update_service(&service("default", "sticky", |s| {
            s.cluster_ip(&["10.96.0.50"])
                .port("http", "TCP", 80)
                .affinity(Some(TIMEOUT));
        }))
        .unwrap();
    let endpoints = |ips: &[String]| {
        slice("default", "sticky-1", "sticky", |s| {
            s.port("http", "TCP", 8080);
            for ip in ips {
                s.endpoint(ip, "n2", |_| {});
            }
        })
    };
    state.update_slice(&endpoints(&ips));
    let exec = NftExecutor::new(Some(lab.node.name().to_string()));
    let mut dp = NftDataplane::new(exec, "svcnet");
    sync(&mut dp, &mut state, true);

    // Pinned: every connection of the client reaches one endpoint, recorded in the map.
    let got = ask(&lab, 12);
    assert!(got.iter().all(|g| g == &got[0]), "not pinned: {got:?}");
    let pinned = got[0].clone();
    let client = lab.pod(0).ipv4.to_string();
    let e = entries(&lab);
    assert_eq!(e.len(), 1, "{e:?}");
    let pinned_ip = &ips[if pinned == "b1" { 0 } else { 1 }];
    assert_eq!(e[0].0, format!("{client} : {pinned_ip} . 8080"));

    // Each new connection refreshes the timeout (as `recent --set` does).
    std::thread::sleep(Duration::from_millis(2500));
    let before = entries(&lab)[0].1;
    assert!(before < f64::from(TIMEOUT) - 2.0, "{before}");
    ask(&lab, 1);
    let after = entries(&lab)[0].1;
    assert!(
        after > f64::from(TIMEOUT) - 1.0,
        "timeout not refreshed: {before} → {after}"
    );

    // The periodic resync re-asserts every object and keeps the pins.
    sync_why(&mut dp, &mut state, Some(FullReason::Periodic));
    assert_eq!(entries(&lab).len(), 1, "pin lost by the resync");
    assert!(
        ask(&lab, 4).iter().all(|g| *g == pinned),
        "not pinned after the resync"
    );

    // The pinned endpoint goes away: the sync deletes the entry, the client moves on.
    let remaining: Vec<String> = ips.iter().filter(|ip| *ip != pinned_ip).cloned().collect();
    state.update_slice(&endpoints(&remaining));
    sync(&mut dp, &mut state, false);
    assert!(
        entries(&lab).is_empty(),
        "stale entry kept: {:?}",
        entries(&lab)
    );
    let got = ask(&lab, 6);
    assert!(
        got.iter().all(|g| *g != pinned),
        "still sent to the removed endpoint: {got:?}"
    );
    let e = entries(&lab);
    assert_eq!(e.len(), 1, "re-pinned: {e:?}");
    assert!(
        e[0].0.ends_with(&format!(": {} . 8080", remaining[0])),
        "{e:?}"
    );
}
