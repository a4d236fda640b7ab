//! S1/S2 figures: full-sync time (render + `nft -f` apply) and one-service partial-sync time
//! for N services × 2 endpoints, in a fresh network namespace. Usage (as root):
//! `cargo run --release -p svcnet-nft --example sync_bench -- 1000 5000 10000`
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use std::time::{Duration, Instant};

use svcnet_netns::{NetNs, unique_name};
use svcnet_nft::{Family, FullMode, NftExecutor, Renderer};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};

fn ip(i: usize, base: [u8; 2]) -> String {
    format!("{}.{}.{}.{}", base[0], base[1], (i >> 8) & 255, i & 255)
}

fn state(n: usize) -> ProxyState {
    let mut s = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    });
    for i in 0..n {
        let name = format!("svc{i}");
        s.update_service(&service("bench", &name, |b| {
            b.cluster_ip(&[&ip(i, [10, 96])]).port("http", "TCP", 80);
        }))
        .unwrap();
        s.update_slice(&slice("bench", &format!("{name}-1"), &name, |b| {
            b.port("http", "TCP", 8080)
                .endpoint(&ip(2 * i, [10, 244]), "n1", |_| {})
                .endpoint(&ip(2 * i + 1, [10, 244]), "n2", |_| {});
        }));
    }
    s.take_changes();
    s
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes are numbers"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 5000, 10000]
    } else {
        sizes
    };
    for n in sizes {
        let ns = NetNs::create(&unique_name("bench")).expect("needs root");
        let exec = NftExecutor::new(Some(ns.name().to_string()));
        let mut st = state(n);
        let mut r = Renderer::new(Family::Ip);

        let t0 = Instant::now();
        let desired = st.desired(IpFamily::V4);
        let plan = r.plan_full(&desired, FullMode::Recreate);
        let render = t0.elapsed();
        let text_len = plan.tx.to_string().len();
        let t1 = Instant::now();
        exec.apply(&plan.tx).unwrap();
        let apply = t1.elapsed();
        r.commit(plan);
        println!(
            "S1 N={n} endpoints=2 subject=svcnet-nft render_ms={:.1} apply_ms={:.1} total_ms={:.1} ops_bytes={text_len}",
            render.as_secs_f64() * 1e3,
            apply.as_secs_f64() * 1e3,
            (render + apply).as_secs_f64() * 1e3
        );

        // S2: one service's endpoints change, 20 rounds.
        let mut times = Vec::new();
        for round in 0..20 {
            let i = (round * 7919) % n;
            let name = format!("svc{i}");
            st.update_slice(&slice("bench", &format!("{name}-1"), &name, |b| {
                b.port("http", "TCP", 8080)
                    .endpoint(&ip(2 * i, [10, 244]), "n1", |_| {})
                    .endpoint(&format!("10.250.{}.{}", round, i & 255), "n2", |_| {});
            }));
            let t = Instant::now();
            let changes = st.take_changes();
            let d = st.desired_for(IpFamily::V4, changes.services.keys());
            let plan = r.plan_partial(&st.node_state(IpFamily::V4), &d).unwrap();
            exec.apply(&plan.tx).unwrap();
            r.commit(plan);
            times.push(t.elapsed());
        }
        println!(
            "S2 N={n} subject=svcnet-nft change=endpoint-replace p50_ms={:.1} p99_ms={:.1}",
            pct(&mut times, 0.5).as_secs_f64() * 1e3,
            pct(&mut times, 0.99).as_secs_f64() * 1e3
        );
    }
}
