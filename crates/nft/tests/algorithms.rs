//! Load-balancing algorithms in the nftables dataplane: the rendered endpoint choice per
//! algorithm (snapshots, applied to `FakeNft`), the fallback to random for what the kernel
//! cannot express (lc, sed, nq) carried by the plan, and, against the REAL kernel, that `sh`
//! pins one client to one endpoint while `rr` walks the endpoints in order. The kernel test
//! needs root (CI runs as root); its namespaces are removed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::net::SocketAddr;
use std::time::Duration;

use expect_test::{Expect, expect};
use k8s_openapi::api::core::v1::Service;
use svcnet_lb::{ANNOTATION, Algorithm, Dataplane};
use svcnet_netns::test_support::{Lab, tcp_ask};
use svcnet_nft::{FakeNft, Family, FullMode, NftExecutor, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};

fn config(scheduler: Option<Algorithm>) -> CoreConfig {
    CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        scheduler,
        ..Default::default()
    }
}

fn annotated(mut svc: Service, algorithm: &str) -> Service {
    svc.metadata.annotations = Some(
        [(ANNOTATION.to_string(), algorithm.to_string())]
            .into_iter()
            .collect(),
    );
    svc
}

/// A three-endpoint service `web` at 10.96.0.10:80 with the given annotation.
fn state(algorithm: Option<&str>, ips: &[&str]) -> ProxyState {
    let mut s = ProxyState::new(config(None));
    let svc = service("default", "web", |s| {
        s.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
    });
    let svc = match algorithm {
        Some(a) => annotated(svc, a),
        None => svc,
    };
    s.update_service(&svc).unwrap();
    s.update_slice(&slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080);
        for ip in ips {
            s.endpoint(ip, "n2", |_| {});
        }
    }));
    s
}

const IPS: [&str; 3] = ["10.244.3.2", "10.244.1.2", "10.244.2.2"];

/// A dispatch rule of a group no service uses (a standing group: its set is empty).
fn idle_group(fake: &FakeNft, rule: &str) -> bool {
    rule.contains(" dnat ")
        && rule
            .split_whitespace()
            .filter_map(|w| w.strip_prefix('@'))
            .next()
            .is_some_and(|set| fake.elements(set).is_empty())
}

/// The service's choice after a full sync applied to the fake: its dispatch rule (its group's,
/// or its round-robin chain's) and its `backends` slots, `slot → endpoint`.
fn check(algorithm: Option<&str>, want: Expect) {
    let s = state(algorithm, &IPS);
    let plan = Renderer::new(Family::Ip).plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    let mut fake = FakeNft::new();
    fake.apply(&plan.tx).unwrap();
    let mut lines: Vec<String> = fake
        .rules("services")
        .unwrap()
        .into_iter()
        .filter(|r| r.contains("@svc-") && !idle_group(&fake, r))
        .collect();
    for c in fake
        .chain_names()
        .into_iter()
        .filter(|c| c.starts_with("rr-"))
    {
        lines.extend(
            fake.rules(&c)
                .unwrap()
                .into_iter()
                .map(|r| format!("{c}: {r}")),
        );
    }
    lines.extend(
        fake.elements("backends-tcp")
            .into_iter()
            .map(|e| e.replace("10.96.0.10 . tcp . 80 . ", "slot ")),
    );
    let fallbacks: Vec<String> = plan
        .fallbacks
        .iter()
        .map(|(spn, f)| format!("fallback {spn}: {f}"))
        .collect();
    want.assert_eq(&(lines.join("\n") + "\n" + &fallbacks.join("\n")));
}

#[test]
fn random_is_numgen_random_over_the_backends_map() {
    check(
        None,
        expect![[r#"
            ip daddr . meta l4proto . th dport vmap @svc-aff
            meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-tcp
            meta l4proto udp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-udp
            slot 0 : 10.244.1.2 . 8080
            slot 1 : 10.244.2.2 . 8080
            slot 2 : 10.244.3.2 . 8080
        "#]],
    );
    check(
        Some("random"),
        expect![[r#"
            ip daddr . meta l4proto . th dport vmap @svc-aff
            meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-tcp
            meta l4proto udp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-udp
            slot 0 : 10.244.1.2 . 8080
            slot 1 : 10.244.2.2 . 8080
            slot 2 : 10.244.3.2 . 8080
        "#]],
    );
}

#[test]
fn round_robin_is_an_incrementing_counter_per_service() {
    check(
        Some("rr"),
        expect![[r#"
            ip daddr . meta l4proto . th dport vmap @svc-aff
            ip daddr . meta l4proto . th dport vmap @svc-rr
            rr-svc-cluster-MIPVSHLX-default/web/tcp/http: dnat ip to ip daddr . meta l4proto . th dport . numgen inc mod 3 map @backends-tcp
            slot 0 : 10.244.1.2 . 8080
            slot 1 : 10.244.2.2 . 8080
            slot 2 : 10.244.3.2 . 8080
        "#]],
    );
}

#[test]
fn hashes_are_jhash_slots_in_the_backends_map() {
    check(
        Some("sh"),
        expect![[r#"
            ip daddr . meta l4proto . th dport vmap @svc-aff
            meta l4proto tcp ip daddr . meta l4proto . th dport @svc-sh3 dnat ip to ip daddr . meta l4proto . th dport . jhash ip saddr mod 3 seed 0x53564e01 map @backends-tcp
            slot 0 : 10.244.1.2 . 8080
            slot 1 : 10.244.2.2 . 8080
            slot 2 : 10.244.3.2 . 8080
        "#]],
    );
    check(
        Some("dh"),
        expect![[r#"
            ip daddr . meta l4proto . th dport vmap @svc-aff
            meta l4proto tcp ip daddr . meta l4proto . th dport @svc-dh3 dnat ip to ip daddr . meta l4proto . th dport . jhash ip daddr . th dport mod 3 seed 0x53564e02 map @backends-tcp
            slot 0 : 10.244.1.2 . 8080
            slot 1 : 10.244.2.2 . 8080
            slot 2 : 10.244.3.2 . 8080
        "#]],
    );
}

#[test]
fn maglev_is_a_lookup_table_of_prime_size() {
    let s = state(Some("maglev"), &IPS);
    let plan = Renderer::new(Family::Ip).plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    FakeNft::new().apply(&plan.tx).unwrap();
    let text = plan.tx.to_string();
    assert!(
        text.contains(
            "ip daddr . meta l4proto . th dport @svc-mg509 dnat ip to ip daddr . meta l4proto . th dport . jhash ip saddr . th sport mod 509 seed 0x53564e03 map @backends-tcp"
        ),
        "{text}"
    );
    // Every slot maps to an endpoint, each endpoint owns ⌊509/3⌋ or ⌈509/3⌉ of them.
    let mut fake = FakeNft::new();
    fake.apply(&plan.tx).unwrap();
    let slots = fake.elements("backends-tcp");
    assert_eq!(slots.len(), 509);
    for ip in ["10.244.1.2", "10.244.2.2", "10.244.3.2"] {
        let owned = slots
            .iter()
            .filter(|e| e.ends_with(&format!(": {ip} . 8080")))
            .count();
        assert!((169..=170).contains(&owned), "{ip} owns {owned} slots");
    }
    assert!(plan.fallbacks.is_empty());
}

#[test]
fn counting_algorithms_fall_back_to_random_and_say_so() {
    for (name, alg) in [
        ("lc", Algorithm::LeastConnection),
        ("sed", Algorithm::ShortestExpectedDelay),
        ("nq", Algorithm::NeverQueue),
    ] {
        let s = state(Some(name), &IPS);
        let r = Renderer::new(Family::Ip);
        let plan = r.plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
        assert_eq!(plan.fallbacks.len(), 1, "{name}");
        let (spn, f) = &plan.fallbacks[0];
        assert_eq!(spn.port, "http");
        assert_eq!(spn.service.name, "web");
        assert_eq!(
            (f.requested, f.used, f.dataplane),
            (alg, Algorithm::Random, Dataplane::Nftables)
        );
        // Same rules as random.
        assert!(
            plan.tx
                .to_string()
                .contains("numgen random mod 3 map @backends-tcp")
        );
    }
    check(
        Some("lc"),
        expect![[r#"
            ip daddr . meta l4proto . th dport vmap @svc-aff
            meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-tcp
            meta l4proto udp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-udp
            slot 0 : 10.244.1.2 . 8080
            slot 1 : 10.244.2.2 . 8080
            slot 2 : 10.244.3.2 . 8080
            fallback default/web/tcp/http: load-balancing algorithm lc (least connections) cannot be expressed by the nftables dataplane: it needs live per-endpoint connection counts, which stateless kernel rules do not keep; using random instead"#]],
    );
}

#[test]
fn scheduler_applies_without_annotation_and_partial_syncs_report_changed_services() {
    let mut s = ProxyState::new(config(Some(Algorithm::SourceHash)));
    s.update_service(&service("default", "web", |s| {
        s.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
    }))
    .unwrap();
    s.update_slice(&slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080)
            .endpoint("10.244.1.2", "n2", |_| {});
    }));
    s.take_changes();
    let mut r = Renderer::new(Family::Ip);
    let mut fake = FakeNft::new();
    let plan = r.plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    assert!(plan.tx.to_string().contains("jhash ip saddr mod 1 seed"));
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);
    // The annotation switches the service to lc: the partial plan reports it and renders random.
    s.update_service(&annotated(
        service("default", "web", |s| {
            s.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
        }),
        "lc",
    ))
    .unwrap();
    let changes = s.take_changes();
    let plan = r
        .plan_partial(
            &s.node_state(IpFamily::V4),
            &s.desired_for(IpFamily::V4, changes.services.keys()),
        )
        .unwrap();
    fake.apply(&plan.tx).unwrap();
    assert_eq!(plan.fallbacks.len(), 1);
    assert!(!plan.tx.to_string().contains("jhash"), "{}", plan.tx);
    r.commit(plan);
}

/// `n` sequential connections from pod 0 to `addr`: the identities, in order.
fn ask_n(lab: &Lab, addr: SocketAddr, n: usize) -> Vec<String> {
    lab.pod(0)
        .ns
        .run(move || {
            (0..n)
                .map(|_| tcp_ask(addr, Duration::from_millis(1500)).unwrap().identity)
                .collect::<Vec<_>>()
        })
        .unwrap()
}

#[test]
fn kernel_source_hash_pins_a_client_and_round_robin_cycles() {
    let mut lab = Lab::new().expect("creating namespaces needs root");
    for _ in 0..4 {
        lab.add_pod().unwrap();
    }
    for i in 1..=3 {
        lab.serve_tcp(i, 8080, &format!("b{i}")).unwrap();
    }
    let ips: Vec<String> = (1..=3).map(|i| lab.pod(i).ipv4.to_string()).collect();
    let mut s = ProxyState::new(config(None));
    for (name, vip, alg) in [
        ("hashed", "10.96.0.20", "sh"),
        ("cycled", "10.96.0.21", "rr"),
    ] {
        let svc = service("default", name, |s| {
            s.cluster_ip(&[vip]).port("http", "TCP", 80);
        });
        s.update_service(&annotated(svc, alg)).unwrap();
        s.update_slice(&slice("default", &format!("{name}-1"), name, |s| {
            s.port("http", "TCP", 8080);
            for ip in &ips {
                s.endpoint(ip, "n2", |_| {});
            }
        }));
    }
    let exec = NftExecutor::new(Some(lab.node.name().to_string()));
    let plan = Renderer::new(Family::Ip).plan_full(&s.desired(IpFamily::V4), FullMode::Recreate);
    assert!(plan.fallbacks.is_empty());
    if let Err(e) = exec.apply(&plan.tx) {
        panic!("nft rejected:\n{}\n{e}", plan.tx);
    }

    // sh: every connection of the one client lands on the same endpoint.
    let hashed = ask_n(&lab, "10.96.0.20:80".parse().unwrap(), 30);
    assert!(
        hashed.iter().all(|id| id == &hashed[0]),
        "source hashing must pin the client: {hashed:?}"
    );

    // rr: the counter walks the endpoints in address order, so 12 connections go
    // b(x) b(y) b(z) repeated, each endpoint exactly 4 times and never twice in a row.
    let cycled = ask_n(&lab, "10.96.0.21:80".parse().unwrap(), 12);
    let first: Vec<&String> = cycled[..3].iter().collect();
    let mut distinct = first.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "one full cycle first: {cycled:?}");
    for (i, id) in cycled.iter().enumerate() {
        assert_eq!(
            id,
            first[i % 3],
            "round robin order broken at {i}: {cycled:?}"
        );
    }
    // Address order: pods are numbered in address order, so the cycle is b1, b2, b3 rotated.
    let pos = |id: &str| first.iter().position(|f| f.as_str() == id).unwrap();
    assert_eq!((pos("b2") + 3 - pos("b1")) % 3, 1, "{cycled:?}");
    assert_eq!((pos("b3") + 3 - pos("b2")) % 3, 1, "{cycled:?}");
}
