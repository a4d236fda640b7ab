//! A many-endpoint choice against the REAL kernel: a service with 10 backends, in the
//! `svc-n10` group (`numgen random mod 10` looked up in the `backends` map), reached from a
//! pod namespace through svcnet's rules in a fresh node namespace. Bounded trials: every
//! backend is reached, each within generous statistical bounds, only ready backends after a
//! partial sync moved the service to `svc-n9` and deleted its tenth slot. Needs root (CI runs as root); namespaces are removed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use svcnet_netns::test_support::{Lab, tcp_ask};
use svcnet_nft::{Family, FullMode, NftExecutor, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};

const BACKENDS: usize = 10;
const PORTS: [u16; 2] = [8080, 8081];

fn sync(state: &mut ProxyState, r: &mut Renderer, exec: &NftExecutor) {
    let changes = state.take_changes();
    let plan = if r.has_applied() {
        let desired = state.desired_for(IpFamily::V4, changes.services.keys());
        r.plan_partial(&state.node_state(IpFamily::V4), &desired)
            .unwrap()
    } else {
        r.plan_full(&state.desired(IpFamily::V4), FullMode::Recreate)
    };
    if let Err(e) = exec.apply(&plan.tx) {
        panic!("nft rejected:\n{}\n{e}", plan.tx);
    }
    r.commit(plan);
}

/// The number of `backends` slots of the cluster IP, as the kernel lists the map.
fn map_slots(lab: &Lab) -> usize {
    let listed = lab
        .node
        .exec(&["nft", "list", "map", "ip", "svcnet", "backends-tcp"])
        .unwrap();
    listed.matches("10.96.0.10 . tcp . 80 . ").count()
}

/// `n` fresh TCP connections from pod 0 to `addr`: replies counted per backend identity.
fn spread(lab: &Lab, addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let replies = lab
        .pod(0)
        .ns
        .run(move || {
            (0..n)
                .map(|_| tcp_ask(addr, Duration::from_millis(1500)))
                .collect::<Vec<_>>()
        })
        .unwrap();
    let mut counts = BTreeMap::new();
    for r in replies {
        let r = r.expect("connection through the backends map failed");
        *counts.entry(r.identity).or_default() += 1;
    }
    counts
}

#[test]
fn ten_backends_are_chosen_uniformly_through_the_backends_map() {
    // Ten endpoints as five backend pods serving two ports each (two slices of one service,
    // as a port rename or a rolling update produces): `{pod IP}:8080` answers "b{i}-8080".
    let mut lab = Lab::new().expect("creating namespaces needs root");
    let pods = BACKENDS / PORTS.len();
    for _ in 0..=pods {
        lab.add_pod().unwrap();
    }
    for i in 1..=pods {
        for port in PORTS {
            lab.serve_tcp(i, port, &format!("b{i}-{port}")).unwrap();
        }
    }
    let mut state = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    });
    let backend_ips: Vec<String> = (1..=pods).map(|i| lab.pod(i).ipv4.to_string()).collect();
    // The slice of one port; `unready` marks that pod index not ready.
    let web_slice = |port: u16, unready: Option<usize>| {
        slice("default", &format!("web-{port}"), "web", |s| {
            s.port("http", "TCP", i32::from(port));
            for (i, ip) in backend_ips.iter().enumerate() {
                if Some(i) == unready {
                    s.endpoint(ip, "n2", not_ready);
                } else {
                    s.endpoint(ip, "n2", |_| {});
                }
            }
        })
    };
    state
        .update_service(&service("default", "web", |s| {
            s.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
        }))
        .unwrap();
    for port in PORTS {
        state.update_slice(&web_slice(port, None));
    }
    let exec = NftExecutor::new(Some(lab.node.name().to_string()));
    let mut r = Renderer::new(Family::Ip);
    sync(&mut state, &mut r, &exec);
    let rules = lab
        .node
        .exec(&["nft", "list", "table", "ip", "svcnet"])
        .unwrap();
    assert!(
        rules.contains("@svc-n10 dnat ip to ")
            && rules.contains(" . numgen random mod 10 map @backends-tcp"),
        "the kernel should pick through the backends map:\n{rules}"
    );
    assert_eq!(map_slots(&lab), 10, "{rules}");

    let vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let n = 500;
    let c = spread(&lab, vip, n);
    assert_eq!(c.len(), BACKENDS, "every backend must be reached: {c:?}");
    assert_eq!(c.values().sum::<usize>(), n);
    for (id, got) in &c {
        // Binomial(500, 0.1): mean 50, sd ≈ 6.7. [20, 85] is more than 4.4 sd either side:
        // a false failure over the 10 backends is below 1e-4, a skewed map fails it.
        assert!((20..=85).contains(got), "{id} got {got} of {n}: {c:?}");
    }

    // A partial sync rewrites the map with 9 slots: the unready backend gets no new connection.
    state.update_slice(&web_slice(PORTS[1], Some(pods - 1)));
    sync(&mut state, &mut r, &exec);
    let rules = lab
        .node
        .exec(&["nft", "list", "table", "ip", "svcnet"])
        .unwrap();
    assert!(
        rules.contains("numgen random mod 9 map @backends-tcp") && !rules.contains("svc-n10"),
        "{rules}"
    );
    assert_eq!(map_slots(&lab), 9, "{rules}");
    let n = 270;
    let c = spread(&lab, vip, n);
    assert_eq!(c.len(), BACKENDS - 1, "{c:?}");
    let gone = format!("b{pods}-{}", PORTS[1]);
    assert!(!c.contains_key(&gone), "{gone} still chosen: {c:?}");
    for (id, got) in &c {
        // Binomial(270, 1/9): mean 30, sd ≈ 5.2.
        assert!((8..=55).contains(got), "{id} got {got} of {n}: {c:?}");
    }
}
