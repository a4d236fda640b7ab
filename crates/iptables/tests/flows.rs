//! The packet-flow table run through the test-only tracer on the rendered rules (applied to
//! `FakeIptables`, hooks included): every statistic branch is followed, so endpoint shares are
//! checked exactly (1/n within 1e-9), as are DNAT targets, masquerade, reject and drop.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::tracer::{Env, IptablesTracer, Packet, Verdict, trace};
use common::*;
use svcnet_iptables::{FakeIptables, Family, KernelChains, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{IpFamily, NamespacedName, ProxyState};

fn env() -> Env {
    Env {
        local_addrs: node_addrs(),
        recent: Default::default(),
    }
}

fn applied(state: &ProxyState) -> (Renderer, FakeIptables) {
    let mut r = Renderer::new(Family::V4);
    let mut fake = FakeIptables::new();
    let plan = r.plan_full(&state.desired(IpFamily::V4), Some(&KernelChains::new()));
    fake.apply(&plan.payload).unwrap();
    for h in &plan.hooks {
        fake.ensure_hook(h).unwrap();
    }
    r.commit(plan);
    (r, fake)
}

fn packet(c: &Case) -> Packet {
    Packet {
        src: c.from.ip(),
        dst: c.to.0.into(),
        proto: c.proto.as_str(),
        dport: c.to.1,
        from_node: c.from == Client::Node,
    }
}

/// Checks one case's traced distribution against its expectation (the shared kit's check).
fn check(fake: &FakeIptables, c: &Case, env: &Env) {
    let tracer = IptablesTracer::over_fake(fake, env.clone());
    if let Err(e) = svcnet_flows::check(&tracer, c) {
        panic!("{e}");
    }
}

/// The shared packet-flow table (the same cases and expectations as nft's and userspace's).
#[test]
fn packet_flow_table() {
    let (_, fake) = applied(&world());
    let tracer = IptablesTracer::over_fake(&fake, env());
    svcnet_flows::run_table(&tracer, &cases());
}

/// 1/n, 1/(n-1), …, as kube-proxy formats them, give every endpoint exactly 1/n.
#[test]
fn statistic_cascade_is_uniform_for_1_to_12_endpoints() {
    for n in 1..=12usize {
        let mut s = ProxyState::new(config());
        s.update_service(&service("default", "many", |b| {
            b.cluster_ip(&["10.96.1.1"]).port("", "TCP", 80);
        }))
        .unwrap();
        s.update_slice(&slice("default", "many-1", "many", |b| {
            b.port("", "TCP", 8080);
            for i in 0..n {
                b.endpoint(
                    &format!("10.244.{}.{}", 10 + i / 200, 10 + i % 200),
                    "n2",
                    |_| {},
                );
            }
        }));
        let (_, fake) = applied(&s);
        let pkt = Packet {
            src: pod_ip(4).into(),
            dst: "10.96.1.1".parse().unwrap(),
            proto: "tcp",
            dport: 80,
            from_node: false,
        };
        let got = trace(&fake, &pkt, &env());
        assert_eq!(got.len(), n);
        for p in got.values() {
            assert!((p - 1.0 / n as f64).abs() < 1e-9, "n={n}: {got:?}");
        }
    }
}

/// `sh` (`-m cluster`): each client address goes to exactly one endpoint, the slot its hash
/// picks (the same slot as nftables' `sh`), and 300 clients spread over all three.
#[test]
fn source_hashing_sends_each_client_to_one_endpoint() {
    let state = world();
    let (_, fake) = applied(&state);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..300u32 {
        let src = std::net::Ipv4Addr::new(10, 244, 100 + (i / 250) as u8, (i % 250) as u8 + 2);
        let pkt = Packet {
            src: src.into(),
            dst: "10.96.0.22".parse().unwrap(),
            proto: "tcp",
            dport: 80,
            from_node: false,
        };
        // The slot `-m cluster` picks is the one nftables' `jhash ip saddr` picks (svcnet-lb
        // computes that one): both dataplanes send a client to the same endpoint.
        assert_eq!(
            cluster_slot(src, svcnet_lb::hash::SEED_SOURCE, 3),
            svcnet_lb::hash::nft_jhash(&src.octets(), svcnet_lb::hash::SEED_SOURCE, 3)
        );
        let got = trace(&fake, &pkt, &env());
        assert_eq!(got.len(), 1, "{src}: {got:?}");
        let (verdict, p) = got.into_iter().next().unwrap();
        assert!((p - 1.0).abs() < 1e-9);
        *counts.entry(format!("{verdict:?}")).or_default() += 1;
    }
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(counts.values().all(|n| *n > 60), "{counts:?}");
}

/// ClientIP affinity: the endpoint chain records the client in its `recent` list; a client
/// found in a list goes straight to that endpoint.
#[test]
fn affinity_records_and_follows_the_recent_list() {
    let (_, fake) = applied(&world());
    let c = cases()
        .into_iter()
        .find(|c| c.name.starts_with("affinity"))
        .unwrap();
    let got = trace(&fake, &packet(&c), &env());
    let mut lists = Vec::new();
    for v in got.keys() {
        let Verdict::Accept { recent_set, .. } = v else {
            panic!("{v:?}")
        };
        assert_eq!(recent_set.len(), 1, "{v:?}");
        lists.push(recent_set[0].clone());
    }
    // Now the client is in the second endpoint's list: it always goes there.
    let mut env = env();
    env.recent.insert(lists[1].clone());
    let again = trace(&fake, &packet(&c), &env);
    assert_eq!(again.len(), 1, "{again:?}");
    let (v, p) = again.into_iter().next().unwrap();
    assert!((p - 1.0).abs() < 1e-12);
    let Verdict::Accept { recent_set, .. } = v else {
        panic!()
    };
    assert_eq!(recent_set, [lists[1].clone()]);
}

/// Traffic from the node itself to an eTP=Local external IP is masqueraded and reaches every
/// endpoint (upstream's short-circuit for LOCAL sources).
#[test]
fn node_sourced_traffic_to_local_policy_external_ip() {
    let (_, fake) = applied(&world());
    let pkt = Packet {
        src: NODE_IP.into(),
        dst: "198.51.100.9".parse().unwrap(),
        proto: "tcp",
        dport: 80,
        from_node: true,
    };
    let got = trace(&fake, &pkt, &env());
    assert_eq!(got.len(), 2, "{got:?}");
    for v in got.keys() {
        assert!(
            matches!(
                v,
                Verdict::Accept {
                    masquerade: true,
                    dnat: true,
                    ..
                }
            ),
            "{v:?}"
        );
    }
}

/// Partial syncs (scale up, scale to zero, delete) keep the flow table true and converge to
/// exactly what a fresh full sync produces.
#[test]
fn partial_syncs_keep_flows_and_converge() {
    let mut state = world();
    state.take_changes();
    let (mut r, mut fake) = applied(&state);
    let step = |state: &mut ProxyState, r: &mut Renderer, fake: &mut FakeIptables| {
        let changes = state.take_changes();
        let desired = state.desired_for(IpFamily::V4, changes.services.keys());
        let plan = r
            .plan_partial(&state.node_state(IpFamily::V4), &desired)
            .unwrap();
        assert!(plan.hooks.is_empty());
        fake.apply(&plan.payload).unwrap();
        r.commit(plan);
        let (_, fresh) = applied(state);
        assert_eq!(
            normalized(&fake.dump()),
            normalized(&fresh.dump()),
            "partial sync did not converge"
        );
    };
    // web loses an endpoint.
    state.update_slice(&slice("default", "web-1", "web", |b| {
        b.port("http", "TCP", 8080)
            .endpoint(&pod_ip(1).to_string(), NODE, |_| {})
            .endpoint(&pod_ip(2).to_string(), "n2", |_| {});
    }));
    step(&mut state, &mut r, &mut fake);
    let web = cases().into_iter().next().unwrap();
    check(
        &fake,
        &Case {
            expect: Expect::Spread(&[1, 2], Masq::No),
            ..web.clone()
        },
        &env(),
    );
    // np loses all endpoints: now rejected.
    state.delete_slice("default", "np-1");
    step(&mut state, &mut r, &mut fake);
    let np = cases()
        .into_iter()
        .find(|c| c.name == "node port from outside")
        .unwrap();
    check(
        &fake,
        &Case {
            expect: Expect::Reject,
            ..np
        },
        &env(),
    );
    // sticky is deleted: its cluster IP is unallocated and dropped.
    state.delete_service(&NamespacedName::new("default", "sticky"));
    step(&mut state, &mut r, &mut fake);
    let sticky = cases()
        .into_iter()
        .find(|c| c.name.starts_with("affinity"))
        .unwrap();
    check(
        &fake,
        &Case {
            expect: Expect::Drop,
            ..sticky
        },
        &env(),
    );
    assert!(!fake.dump().contains("default/sticky"));
}

/// A full sync after someone flushed everything restores the flows; one with unknown kernel
/// state deletes svcnet chains the desired state no longer has.
#[test]
fn full_sync_repairs_flush_and_deletes_stale_kernel_chains() {
    let state = world();
    let (r, mut fake) = applied(&state);
    fake.tamper_flush_all();
    let plan = r.plan_full(&state.desired(IpFamily::V4), Some(&fake.kernel_chains()));
    fake.apply(&plan.payload).unwrap();
    for h in &plan.hooks {
        fake.ensure_hook(h).unwrap();
    }
    let env = env();
    for c in cases() {
        check(&fake, &c, &env);
    }
    // A restarted proxy with an empty state finds the old chains and deletes them all.
    let empty = ProxyState::new(config());
    let fresh = Renderer::new(Family::V4);
    let plan = fresh.plan_full(&empty.desired(IpFamily::V4), Some(&fake.kernel_chains()));
    fake.apply(&plan.payload).unwrap();
    assert!(!fake.dump().contains("SVCNET-SVC-"));
    assert!(!fake.dump().contains("SVCNET-SEP-"));
}

#[test]
fn fake_rejects_dangling_jumps_and_nat_drops() {
    let mut fake = FakeIptables::new();
    let err = fake
        .restore("*nat\n:SVCNET-X - [0:0]\n-A SVCNET-X -j SVCNET-NOWHERE\nCOMMIT\n")
        .unwrap_err();
    assert_eq!(err.message, "dangling reference to chain SVCNET-NOWHERE");
    assert!(
        fake.table(svcnet_iptables::Table::Nat)
            .get("SVCNET-X")
            .is_none(),
        "failed commit changed nothing"
    );
    let err = fake
        .restore("*nat\n:SVCNET-X - [0:0]\n-A SVCNET-X -j DROP\nCOMMIT\n")
        .unwrap_err();
    assert!(err.message.contains("not intended for filtering"), "{err}");
    fake.restore("*nat\n:SVCNET-X - [0:0]\n:SVCNET-Y - [0:0]\n-A SVCNET-X -j SVCNET-Y\nCOMMIT\n")
        .unwrap();
    let err = fake.restore("*nat\n-X SVCNET-Y\nCOMMIT\n").unwrap_err();
    assert!(err.message.contains("still referenced"), "{err}");
}

/// `svcnet trace`'s words for the shared cases (frontend, masquerade reason, verdict), the
/// same as nft's tracer gives.
#[test]
fn explanations_match_the_shared_table() {
    let (_, fake) = applied(&world());
    let rules = svcnet_iptables::trace::Ruleset::from_fake(&fake);
    svcnet_flows::check_explanations(&|p| {
        let t = svcnet_iptables::trace::Tracer::new(&rules, node_addrs());
        t.trace(&common::tracer::production(&packet_of(p)))
            .unwrap()
            .into_iter()
            .map(|b| {
                let e = svcnet_iptables::trace::explain(&b);
                (b, e)
            })
            .collect()
    });
}

fn packet_of(p: &svcnet_flows::Packet) -> Packet {
    Packet {
        src: p.src,
        dst: p.dst,
        proto: p.proto.as_str(),
        dport: p.dport,
        from_node: p.from == Client::Node,
    }
}
