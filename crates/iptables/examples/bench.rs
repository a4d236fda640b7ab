//! S1–S3 for the iptables dataplane, side by side with svcnet's nftables dataplane and a
//! direct connection, in one run, as ratios. Each subject programs its own lab (fresh network
//! namespaces from `svcnet_netns::test_support`: a node, a client pod, two backend pods), so
//! nothing touches the host's tables. For each N (services × 2 endpoints):
//!
//! * S1: full sync (render + apply) from empty, and the rule count;
//! * S2: one-service changes as partial syncs: adding the target service (the last one), and
//!   replacing one endpoint of a service in the middle (median and max of a few rounds);
//! * S3: new-connection rate and connect latency from the client pod to the target service's
//!   cluster IP (its rule is the last of `SVCNET-SERVICES`), against a direct connection to the
//!   backend pod in a lab without service rules, interleaved over rounds.
//!
//! Usage (root): `cargo run --release -p svcnet-iptables --example bench -- 1000 10000 30000`
//! (`BENCH_SECS` = seconds per S3 sample, default 1; `BENCH_ROUNDS` default 3;
//! `BENCH_COUNTS=1,8,64` for S3's per-count rule scan: one run per number of distinct endpoint
//! counts, the target in the last count's rule, instead of 2 endpoints everywhere;
//! `BENCH_SUBJECTS=iptables-nft,iptables-legacy` to pick subjects, svcnet-nft always runs;
//! `BENCH_STAGING=0` for one nat commit on iptables-nft, as kube-proxy does).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use svcnet_iptables::{Backend, Family, IptablesExecutor, Renderer, Table};
use svcnet_netns::NetNs;
use svcnet_netns::test_support::Lab;
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};

const TARGET_IP: &str = "10.100.0.1";

fn ip(i: usize, base: [u8; 2]) -> String {
    format!("{}.{}.{}.{}", base[0], base[1], (i >> 8) & 255, i & 255)
}

/// How endpoints are spread over the services.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Every service (the target too) has 2 endpoints.
    Two,
    /// `k` distinct endpoint counts (S3's per-count rule scan in the nftables table, one DNAT
    /// rule per count in use): the fillers have 1 endpoint, one marker service each count
    /// 2..k-1, and the target `k`, the last (largest) count, so a new connection to it walks
    /// every count's rule before its own.
    Distinct(usize),
}

impl Shape {
    fn filler_endpoints(self) -> usize {
        match self {
            Shape::Two => 2,
            Shape::Distinct(_) => 1,
        }
    }

    fn target_endpoints(self) -> usize {
        match self {
            Shape::Two => 2,
            Shape::Distinct(k) => k,
        }
    }
}

/// Endpoint `j` of the target: alternately on the two backend pods, their extra addresses
/// from `.3` on (see [`lab`]).
fn target_endpoint(j: usize) -> String {
    format!("10.244.{}.{}", 2 + j % 2, 2 + j / 2)
}

fn filler(s: &mut ProxyState, i: usize, endpoints: usize, first: usize) {
    let name = format!("svc{i}");
    s.update_service(&service("bench", &name, |b| {
        b.cluster_ip(&[&ip(i, [10, 96])]).port("http", "TCP", 80);
    }))
    .unwrap();
    s.update_slice(&slice("bench", &format!("{name}-1"), &name, |b| {
        b.port("http", "TCP", 8080);
        for e in 0..endpoints {
            let node = if e % 2 == 0 { "n1" } else { "n2" };
            b.endpoint(&ip(first + e, [10, 245]), node, |_| {});
        }
    }));
}

fn state(n: usize, shape: Shape) -> ProxyState {
    let mut s = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    });
    let per = shape.filler_endpoints();
    for i in 0..n {
        filler(&mut s, i, per, per * i);
    }
    if let Shape::Distinct(k) = shape {
        // One marker service per count between 1 and the target's.
        for (m, count) in (2..k).enumerate() {
            filler(&mut s, n + m, count, 2 * n + 64 * m);
        }
    }
    s.take_changes();
    s
}

fn add_target(s: &mut ProxyState, shape: Shape) {
    s.update_service(&service("bench", "target", |b| {
        b.cluster_ip(&[TARGET_IP]).port("http", "TCP", 80);
    }))
    .unwrap();
    s.update_slice(&slice("bench", "target-1", "target", |b| {
        b.port("http", "TCP", 8080);
        for j in 0..shape.target_endpoints() {
            let node = if j % 2 == 0 { "n1" } else { "n2" };
            b.endpoint(&target_endpoint(j), node, |_| {});
        }
    }));
}

/// Replaces the last endpoint of a service in the middle (its endpoint count unchanged).
fn replace_endpoint(s: &mut ProxyState, n: usize, round: usize, shape: Shape) {
    let i = n / 2;
    let name = format!("svc{i}");
    let per = shape.filler_endpoints();
    s.update_slice(&slice("bench", &format!("{name}-1"), &name, |b| {
        b.port("http", "TCP", 8080);
        for e in 0..per - 1 {
            b.endpoint(&ip(per * i + e, [10, 245]), "n1", |_| {});
        }
        b.endpoint(&format!("10.250.{round}.1"), "n2", |_| {});
    }));
}

/// A minimal accept-write-close server (no polling, so it never limits the rate measured).
fn serve(ns: &NetNs) {
    let (tx, rx) = std::sync::mpsc::channel();
    ns.spawn(move || {
        let l = TcpListener::bind("0.0.0.0:8080").unwrap();
        tx.send(()).unwrap();
        for mut s in l.incoming().flatten() {
            // Write, then wait for the client's reset: nobody keeps TIME_WAIT state, so
            // ports and conntrack tuples can be reused at once.
            let _ = s.write_all(b"x");
            let _ = s.read(&mut [0u8; 1]);
        }
    })
    .unwrap();
    rx.recv().unwrap();
}

/// New connections per second (connect, read the server's byte, close with a reset) for
/// `secs`, and the median connect latency. Failed connections are counted and reported.
fn conn_rate(ns: &NetNs, addr: SocketAddr, secs: f64) -> (f64, Duration) {
    ns.run(|| {
        let mut lat = Vec::new();
        let mut failed = 0;
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(secs);
        let mut buf = [0u8; 1];
        while Instant::now() < end {
            let t = Instant::now();
            let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
                failed += 1;
                continue;
            };
            lat.push(t.elapsed());
            let linger = nix::libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Linger, &linger)
                .expect("SO_LINGER");
            if s.read_exact(&mut buf).is_err() {
                failed += 1;
            }
        }
        if failed > 0 {
            println!("# {failed} failed connections to {addr}");
        }
        let rate = lat.len() as f64 / start.elapsed().as_secs_f64();
        lat.sort();
        (rate, lat[lat.len() / 2])
    })
    .unwrap()
}

/// A node, a client pod and two backend pods serving on every address they have: the
/// target's endpoints beyond the first two are extra addresses of the backend pods.
fn lab(shape: Shape) -> Lab {
    let mut lab = Lab::new().expect("needs root");
    for _ in 0..3 {
        lab.add_pod().unwrap();
    }
    for j in 2..shape.target_endpoints() {
        let pod = lab.pod(1 + j % 2);
        pod.ns
            .exec(&[
                "ip",
                "addr",
                "add",
                &format!("{}/24", target_endpoint(j)),
                "dev",
                "eth0",
            ])
            .unwrap();
    }
    serve(&lab.pod(1).ns);
    serve(&lab.pod(2).ns);
    lab
}

enum Plane {
    Iptables(Renderer, IptablesExecutor),
    Nft(svcnet_nft::Renderer, svcnet_nft::NftExecutor),
}

struct Subject {
    name: String,
    lab: Lab,
    plane: Plane,
    state: ProxyState,
}

impl Subject {
    /// Full sync from empty: (total, render, apply, rules).
    fn full_sync(&mut self) -> (Duration, Duration, Duration, usize) {
        let t = Instant::now();
        let desired = self.state.desired(IpFamily::V4);
        let (render, apply, rules) = match &mut self.plane {
            Plane::Iptables(r, exec) => {
                let plan = r.plan_full(&desired, None);
                let _text = plan.payload.to_string();
                let rules =
                    plan.payload.rule_count(Table::Nat) + plan.payload.rule_count(Table::Filter);
                let render = t.elapsed();
                // What IptablesDataplane does: list the hooks, insert the missing ones in the
                // same restore.
                exec.apply(&plan).unwrap();
                let apply = t.elapsed() - render;
                let c = Instant::now();
                assert!(exec.canary_present(Family::V4).unwrap());
                println!("# {} canary_check_ms={:.1}", self.name, ms(c.elapsed()));
                r.commit(plan);
                (render, apply, rules)
            }
            Plane::Nft(r, exec) => {
                let plan = r.plan_full(&desired, svcnet_nft::FullMode::Recreate);
                let _text = plan.tx.to_string();
                let rules = plan
                    .tx
                    .ops
                    .iter()
                    .filter(|o| {
                        matches!(
                            o,
                            svcnet_nft::Op::AddRule { .. } | svcnet_nft::Op::AddElement { .. }
                        )
                    })
                    .count();
                let render = t.elapsed();
                exec.apply(&plan.tx).unwrap();
                let apply = t.elapsed() - render;
                r.commit(plan);
                (render, apply, rules)
            }
        };
        (t.elapsed(), render, apply, rules)
    }

    fn partial_sync(&mut self) -> Duration {
        let t = Instant::now();
        let changes = self.state.take_changes();
        let node = self.state.node_state(IpFamily::V4);
        let desired = self
            .state
            .desired_for(IpFamily::V4, changes.services.keys());
        match &mut self.plane {
            Plane::Iptables(r, exec) => {
                let plan = r.plan_partial(&node, &desired).unwrap();
                exec.apply(&plan).unwrap();
                r.commit(plan);
            }
            Plane::Nft(r, exec) => {
                let plan = r.plan_partial(&node, &desired).unwrap();
                exec.apply(&plan.tx).unwrap();
                r.commit(plan);
            }
        }
        t.elapsed()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn legacy_works() -> bool {
    let ns = NetNs::create(&svcnet_netns::unique_name("blg")).unwrap();
    ns.exec(&["iptables-legacy-restore", "--noflush"]).is_ok()
        && ns.exec(&["iptables-legacy", "-t", "nat", "-S"]).is_ok()
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes are numbers"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 10000]
    } else {
        sizes
    };
    // BENCH_SUBJECTS=iptables-nft,iptables-legacy,svcnet-nft (default: all).
    let only: Option<Vec<String>> = std::env::var("BENCH_SUBJECTS")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let staging = std::env::var("BENCH_STAGING").map_or(true, |v| v != "0");
    if !staging {
        println!("# iptables-nft: one commit per table (kube-proxy's way), no staging");
    }
    let wanted = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut backends = vec![Backend::Nft];
    if legacy_works() {
        backends.push(Backend::Legacy);
    } else {
        println!("# iptables-legacy-restore does not work here; legacy subject skipped");
    }
    // BENCH_COUNTS=1,8,64: S3's per-count rule scan, one run per number of distinct
    // endpoint counts (default: every service with 2 endpoints).
    let shapes: Vec<Shape> = match std::env::var("BENCH_COUNTS") {
        Ok(v) => v
            .split(',')
            .map(|k| Shape::Distinct(k.parse().expect("BENCH_COUNTS are numbers")))
            .collect(),
        Err(_) => vec![Shape::Two],
    };
    let direct = lab(Shape::Two);
    let client_direct = &direct.pod(0).ns;
    let backend: SocketAddr = "10.244.2.2:8080".parse().unwrap();
    for (n, shape) in sizes
        .iter()
        .flat_map(|n| shapes.iter().map(move |s| (*n, *s)))
    {
        let label = match shape {
            Shape::Two => "endpoints=2".to_string(),
            Shape::Distinct(k) => format!("distinct_counts={k}"),
        };
        let mut subjects: Vec<Subject> = Vec::new();
        for b in backends
            .iter()
            .filter(|b| wanted(&format!("iptables-{}", b.as_str())))
        {
            let lab = lab(shape);
            let exec = IptablesExecutor::new(Some(lab.node.name().to_string()), *b);
            // As IptablesDataplane does: staged commits on the nft back end (BENCH_STAGING=0
            // measures kube-proxy's single commit instead).
            let mut r = Renderer::new(Family::V4);
            if *b == Backend::Nft && staging {
                r.set_staging(Some(svcnet_iptables::dataplane::STAGE_CHAINS));
            }
            subjects.push(Subject {
                name: format!("iptables-{}", b.as_str()),
                lab,
                plane: Plane::Iptables(r, exec),
                state: state(n, shape),
            });
        }
        let lab = lab(shape);
        let exec = svcnet_nft::NftExecutor::new(Some(lab.node.name().to_string()));
        // svcnet-nft is the reference of the ratios, so it always runs.
        subjects.push(Subject {
            name: "svcnet-nft".into(),
            lab,
            plane: Plane::Nft(svcnet_nft::Renderer::new(svcnet_nft::Family::Ip), exec),
            state: state(n, shape),
        });

        // S1 and S2.
        let mut s1 = Vec::new();
        for s in &mut subjects {
            let (full, render, apply, rules) = s.full_sync();
            add_target(&mut s.state, shape);
            let add = s.partial_sync();
            let mut changes: Vec<Duration> = (0..5)
                .map(|round| {
                    replace_endpoint(&mut s.state, n, round, shape);
                    s.partial_sync()
                })
                .collect();
            changes.sort();
            // A periodic full resync: partial syncs insert new services' frontend rules at
            // the head of SVCNET-SERVICES; the resync restores the sorted order, which puts
            // the target ("bench/target" sorts after "bench/svc…") last, as S3 wants.
            let (resync, _, _, _) = s.full_sync();
            println!(
                "S1 N={n} {label} subject={} periodic_full_resync_ms={:.0}",
                s.name,
                ms(resync)
            );
            s1.push((
                s.name.clone(),
                full,
                rules,
                add,
                changes[changes.len() / 2],
                changes[changes.len() - 1],
                render,
                apply,
            ));
        }
        let nft_full = s1
            .iter()
            .find(|r| r.0 == "svcnet-nft")
            .map(|r| r.1)
            .unwrap();
        #[allow(clippy::type_complexity)]
        let _: &Vec<(
            String,
            Duration,
            usize,
            Duration,
            Duration,
            Duration,
            Duration,
            Duration,
        )> = &s1;
        let nft_add = s1
            .iter()
            .find(|r| r.0 == "svcnet-nft")
            .map(|r| r.3)
            .unwrap();
        for (name, full, rules, add, p50, max, render, apply) in &s1 {
            println!(
                "S1 N={n} {label} subject={name} full_sync_ms={:.0} render_ms={:.0} apply_ms={:.0} rules={rules} ratio_vs_svcnet_nft={:.2}",
                ms(*full),
                ms(*render),
                ms(*apply),
                full.as_secs_f64() / nft_full.as_secs_f64()
            );
            println!(
                "S2 N={n} {label} subject={name} add_service_ms={:.1} endpoint_change_p50_ms={:.1} endpoint_change_max_ms={:.1} add_ratio_vs_svcnet_nft={:.1}",
                ms(*add),
                ms(*p50),
                ms(*max),
                add.as_secs_f64() / nft_add.as_secs_f64()
            );
        }

        // S3, interleaved: direct, then each subject, per round.
        let target: SocketAddr = format!("{TARGET_IP}:80").parse().unwrap();
        let mut rates: Vec<(String, Vec<f64>, Vec<Duration>)> =
            vec![("direct".into(), vec![], vec![])];
        for s in &subjects {
            rates.push((s.name.clone(), vec![], vec![]));
            rates.push((format!("{}-node-direct", s.name), vec![], vec![]));
        }
        for _ in 0..rounds {
            let (r, l) = conn_rate(client_direct, backend, secs);
            rates[0].1.push(r);
            rates[0].2.push(l);
            for (i, s) in subjects.iter().enumerate() {
                let (r, l) = conn_rate(&s.lab.pod(0).ns, target, secs);
                rates[2 * i + 1].1.push(r);
                rates[2 * i + 1].2.push(l);
                // The backend directly, through the same loaded node (conntrack on, every new
                // connection still walks nat PREROUTING).
                let (r, l) = conn_rate(&s.lab.pod(0).ns, backend, secs);
                rates[2 * i + 2].1.push(r);
                rates[2 * i + 2].2.push(l);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let mut med: Vec<(String, f64, Duration)> = rates
            .into_iter()
            .map(|(name, mut r, mut l)| {
                l.sort();
                (name, median(&mut r), l[l.len() / 2])
            })
            .collect();
        let direct_rate = med[0].1;
        let nft_rate = med
            .iter()
            .find(|m| m.0 == "svcnet-nft")
            .map(|m| m.1)
            .unwrap();
        for s in &subjects {
            if let Plane::Nft(r, _) = &s.plane {
                println!(
                    "# N={n} {label} svcnet-nft dispatch groups in use: {}",
                    r.groups().len()
                );
            }
        }
        let by_name: std::collections::BTreeMap<String, f64> =
            med.iter().map(|m| (m.0.clone(), m.1)).collect();
        for (name, rate, lat) in med.drain(..) {
            // A subject against the backend reached directly through its own loaded node.
            let node_direct = by_name
                .get(&format!("{name}-node-direct"))
                .map_or(String::new(), |d| {
                    format!(" ratio_node_direct={:.3}", rate / d)
                });
            println!(
                "S3 N={n} {label} subject={name} newconn_rps={rate:.0} connect_p50_us={:.0} ratio_direct={:.2} ratio_svcnet_nft={:.2}{node_direct}",
                lat.as_secs_f64() * 1e6,
                rate / direct_rate,
                rate / nft_rate
            );
        }
    }
}
