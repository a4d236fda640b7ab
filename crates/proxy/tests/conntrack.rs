//! Which UDP conntrack entries a change makes stale: entries NATed to endpoints that went
//! away, and every entry to the frontends of a UDP port that goes from no endpoints to some
//! (upstream's "newly active" services), TCP never.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use expect_test::{Expect, expect};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, ProxyState};

fn dns(f: impl FnOnce(&mut ServiceBuilder)) -> k8s_openapi::api::core::v1::Service {
    service("kube-system", "dns", |s| {
        s.cluster_ip(&["10.96.0.10"])
            .node_port("dns", "UDP", 53, 30053)
            .node_port("dns-tcp", "TCP", 53, 30054)
            .external_ips(&["198.51.100.9"]);
        f(s);
    })
}

fn dns_slice(ips: &[&str]) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    slice("kube-system", "dns-1", "dns", |s| {
        s.port("dns", "UDP", 5353).port("dns-tcp", "TCP", 5353);
        for ip in ips {
            s.endpoint(ip, "n1", |_| {});
        }
    })
}

/// Takes the pending changes and lists what they make stale, one entry per line.
fn check(state: &mut ProxyState, expect: Expect) {
    let changes = state.take_changes();
    let text: String = state
        .stale_conntrack(&changes)
        .iter()
        .map(|s| {
            let frontend = match s.frontend_ip {
                Some(ip) => format!("{ip}:{}", s.frontend_port),
                None => format!("nodeport {}", s.frontend_port),
            };
            let ep = s.endpoint.map_or("*".to_string(), |e| e.to_string());
            format!("{:?} {frontend} -> {ep}\n", s.family)
        })
        .collect();
    expect.assert_eq(&text);
}

#[test]
fn zero_to_some_endpoints_clears_every_entry_of_the_frontends() {
    let mut state = ProxyState::new(CoreConfig::default());
    state.update_service(&dns(|_| {})).unwrap();
    check(&mut state, expect![[""]]);

    // 0 -> 1 endpoint: every UDP entry to the cluster IP, external IP and node port goes,
    // whatever it was (or was not) NATed to; the TCP port is left alone.
    state.update_slice(&dns_slice(&["10.244.1.2"]));
    check(
        &mut state,
        expect![[r#"
            V4 nodeport 30053 -> *
            V4 10.96.0.10:53 -> *
            V4 198.51.100.9:53 -> *
        "#]],
    );

    // 1 -> 2: not newly active, nothing went away.
    state.update_slice(&dns_slice(&["10.244.1.2", "10.244.1.3"]));
    check(&mut state, expect![[""]]);

    // 2 -> 0 (endpoints NATed to are stale), then 0 -> 1 again (newly active again).
    state.update_slice(&dns_slice(&[]));
    check(
        &mut state,
        expect![[r#"
            V4 nodeport 30053 -> 10.244.1.2
            V4 nodeport 30053 -> 10.244.1.3
            V4 10.96.0.10:53 -> 10.244.1.2
            V4 10.96.0.10:53 -> 10.244.1.3
            V4 198.51.100.9:53 -> 10.244.1.2
            V4 198.51.100.9:53 -> 10.244.1.3
        "#]],
    );
    state.update_slice(&dns_slice(&["10.244.1.4"]));
    check(
        &mut state,
        expect![[r#"
            V4 nodeport 30053 -> *
            V4 10.96.0.10:53 -> *
            V4 198.51.100.9:53 -> *
        "#]],
    );
}

#[test]
fn a_new_service_with_endpoints_is_newly_active() {
    // The slice arrives first (for a service not yet programmed: no change), then the service.
    let mut state = ProxyState::new(CoreConfig::default());
    state.update_slice(&dns_slice(&["10.244.1.2"]));
    state.update_service(&dns(|_| {})).unwrap();
    check(
        &mut state,
        expect![[r#"
            V4 nodeport 30053 -> *
            V4 10.96.0.10:53 -> *
            V4 198.51.100.9:53 -> *
        "#]],
    );
}

#[test]
fn internal_local_without_local_endpoints_is_not_active() {
    // iTP=Local and the only endpoint is on another node: the cluster IP reaches nothing, so
    // nothing is newly active until an endpoint lands on this node.
    let mut state = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        ..Default::default()
    });
    state
        .update_service(&service("default", "stats", |s| {
            s.cluster_ip(&["10.96.0.20"])
                .port("statsd", "UDP", 8125)
                .internal_local();
        }))
        .unwrap();
    let on = |node: &str| {
        slice("default", "stats-1", "stats", |s| {
            s.port("statsd", "UDP", 8125)
                .endpoint("10.244.2.2", node, |_| {});
        })
    };
    state.update_slice(&on("n2"));
    check(
        &mut state,
        expect![[r#"
        V4 10.96.0.20:8125 -> *
    "#]],
    );
    state.update_slice(&on("n1"));
    check(&mut state, expect![""]);
}
