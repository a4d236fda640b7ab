//! The shared packet-flow table (svcnet-flows) through the test-only tracer on the rendered
//! ruleset applied to `FakeNft`: every `numgen` branch is followed, so endpoint shares are
//! checked exactly (1/n within 1e-9), as are DNAT targets, masquerade, reject and drop. The
//! same cases and expectations run against iptables' and userspace's tracers.
#![allow(clippy::unwrap_used)]

mod common;

use common::tracer::NftTracer;
use svcnet_flows::{Case, Client, Expect, Masq, cases, node_addrs, run_table, world};
use svcnet_proxy::NamespacedName;
use svcnet_proxy::fixtures::*;

fn tracer(fake: &svcnet_nft::FakeNft) -> NftTracer {
    NftTracer::over_fake(fake, node_addrs())
}

#[test]
fn packet_flow_table() {
    let (_, fake, _) = common::full(&world(), None);
    run_table(&tracer(&fake), &cases());
}

/// ClientIP affinity: a client the port's affinity map holds goes straight to its recorded
/// endpoint; another client is spread; the record rule is on every first pick, into the map
/// of the port's pool (one per service port, whatever the frontend).
#[test]
fn affinity_follows_the_map_entry_of_the_client() {
    let (_, mut fake, _) = common::full(&world(), None);
    let c = cases()
        .into_iter()
        .find(|c| c.name.starts_with("affinity service sticks"))
        .unwrap();
    let map = svcnet_nft::names::affinity_object(
        "cluster",
        &svcnet_proxy::ServicePortName {
            service: NamespacedName::new("default", "sticky"),
            port: String::new(),
            protocol: svcnet_proxy::Protocol::Tcp,
        },
    );
    let first =
        svcnet_nft::trace::Tracer::new(&svcnet_nft::trace::Ruleset::from_fake(&fake), node_addrs())
            .trace(&common::tracer::packet(&c.packet()))
            .unwrap();
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first.iter().all(|b| b.records_affinity == [map.clone()]),
        "{first:?}"
    );
    let mut tx = svcnet_nft::Transaction::new(svcnet_nft::Family::Ip, "svcnet");
    tx.push(svcnet_nft::Op::AddElement {
        set: map,
        key: c.packet().src.to_string(),
        value: Some("10.244.2.2 . 8080".into()),
    });
    fake.apply(&tx).unwrap();
    let got = svcnet_flows::Tracer::trace(&tracer(&fake), &c.packet());
    assert_eq!(got.len(), 1, "{got:?}");
    let other = Case {
        from: Client::Pod(3),
        ..c.clone()
    };
    assert_eq!(
        svcnet_flows::Tracer::trace(&tracer(&fake), &other.packet()).len(),
        2
    );
}

/// Partial syncs keep the table true: scale down, lose every endpoint, delete (the cluster
/// IP is then unallocated and dropped).
#[test]
fn partial_syncs_keep_the_table_true() {
    let mut state = world();
    state.take_changes();
    let (mut r, mut fake, _) = common::full(&state, None);
    let web = cases().into_iter().next().unwrap();
    state.update_slice(&slice("default", "web-1", "web", |b| {
        b.port("http", "TCP", 8080)
            .endpoint(&svcnet_flows::pod_ip(1).to_string(), "n1", |_| {})
            .endpoint(&svcnet_flows::pod_ip(2).to_string(), "n2", |_| {});
    }));
    common::partial(&mut state, &mut r, &mut fake, None);
    let scaled = Case {
        expect: Expect::Spread(&[1, 2], Masq::No),
        ..web.clone()
    };
    run_table(&tracer(&fake), &[scaled]);
    state.delete_slice("default", "web-1");
    common::partial(&mut state, &mut r, &mut fake, None);
    let empty = Case {
        expect: Expect::Reject,
        ..web.clone()
    };
    run_table(&tracer(&fake), &[empty]);
    state.delete_service(&NamespacedName::new("default", "web"));
    common::partial(&mut state, &mut r, &mut fake, None);
    let gone = Case {
        expect: Expect::Drop,
        ..web
    };
    let from_node = Case {
        from: Client::Node,
        ..gone.clone()
    };
    run_table(&tracer(&fake), &[gone, from_node]);
    common::assert_converged(&state, &mut r, &mut fake);
}

/// The tracer tells apart what the table checks: a wrong pool, a wrong masquerade and a wrong
/// verdict each fail.
#[test]
fn wrong_expectations_fail() {
    let (_, fake, _) = common::full(&world(), None);
    let t = tracer(&fake);
    let find = |name: &str| {
        cases()
            .into_iter()
            .find(|c| c.name.starts_with(name))
            .unwrap()
    };
    let wrong = [
        Case {
            expect: Expect::Spread(&[1], Masq::No),
            ..find("eTP=Local external IP from a pod")
        },
        Case {
            expect: Expect::Spread(&[1, 2], Masq::No),
            ..find("eTP=Local external IP from the node")
        },
        Case {
            expect: Expect::Reject,
            ..find("unallocated service IP is dropped")
        },
        Case {
            expect: Expect::Spread(&[1, 2, 3], Masq::No),
            ..find("hairpin is masqueraded")
        },
    ];
    for c in &wrong {
        assert!(svcnet_flows::check(&t, c).is_err(), "{} passed", c.name);
    }
}

/// `svcnet trace`'s words for the shared cases (frontend, masquerade reason, verdict), the
/// same as iptables' tracer gives.
#[test]
fn explanations_match_the_shared_table() {
    let (_, fake, _) = common::full(&world(), None);
    let rules = svcnet_nft::trace::Ruleset::from_fake(&fake);
    svcnet_flows::check_explanations(&|p| {
        let t = svcnet_nft::trace::Tracer::new(&rules, node_addrs());
        t.trace(&common::tracer::packet(p))
            .unwrap()
            .into_iter()
            .map(|b| {
                let e = svcnet_nft::trace::explain(&b);
                (b, e)
            })
            .collect()
    });
}

/// A pin is only followed within the pool of the connection's route: an off-cluster client
/// pinned through the cluster IP to a remote endpoint of an `externalTrafficPolicy: Local`
/// port is not sent there through the node port (the local pool), as kube-proxy's local
/// policy chain checks only its local endpoints' `recent` lists; a pin to the local endpoint
/// is followed through both.
#[test]
fn affinity_pins_are_followed_only_within_the_route_pool() {
    use svcnet_flows::{Distribution, Outcome, Packet, Proto, Tracer, pod_ip};
    let mut state = svcnet_proxy::ProxyState::new(svcnet_flows::config());
    state
        .update_service(&service("default", "lp", |b| {
            b.cluster_ip(&["10.96.0.40"])
                .node_port("", "TCP", 80, 30090)
                .external_local()
                .affinity(Some(600));
        }))
        .unwrap();
    state.update_slice(&slice("default", "lp-1", "lp", |b| {
        b.port("", "TCP", 8080)
            .endpoint(&pod_ip(1).to_string(), "n1", |_| {})
            .endpoint(&pod_ip(2).to_string(), "n2", |_| {});
    }));
    let (_, fake, _) = common::full(&state, None);
    let t = tracer(&fake);
    let at = |dst: [u8; 4], dport| Packet {
        src: svcnet_flows::EXTERNAL_IP.into(),
        dst: std::net::Ipv4Addr::from(dst).into(),
        dport,
        proto: Proto::Tcp,
        from: Client::External,
    };
    let via_cluster_ip = at([10, 96, 0, 40], 80);
    let via_node_port = at([192, 168, 50, 1], 30090);
    let ep = |i: usize| std::net::SocketAddr::new(pod_ip(i).into(), svcnet_flows::TCP_PORT);
    let only = |i: usize| -> Distribution {
        [(
            Outcome::Endpoint {
                to: ep(i),
                masquerade: false,
            },
            1.0,
        )]
        .into_iter()
        .collect()
    };
    // Pinned to the remote pod 2 through the cluster IP: the node port keeps to its local pool.
    assert_eq!(
        t.trace_after(&via_cluster_ip, ep(2), &via_node_port),
        only(1)
    );
    // Pinned to the local pod 1: followed through the node port, and back through the
    // cluster IP (masqueraded there: an off-cluster client of a cluster IP).
    assert_eq!(
        t.trace_after(&via_cluster_ip, ep(1), &via_node_port),
        only(1)
    );
    let back = t.trace_after(&via_node_port, ep(1), &via_cluster_ip);
    assert_eq!(
        back.keys().collect::<Vec<_>>(),
        [&Outcome::Endpoint {
            to: ep(1),
            masquerade: true
        }],
        "{back:?}"
    );
}
