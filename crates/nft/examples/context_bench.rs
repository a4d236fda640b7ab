//! One-element changes at N services (default 30,000) through the long-lived libnftables
//! context (`NftExecutor`, what the proxy runs) against a fresh `nft -f -` process per change
//! (what it ran before), in one run, interleaved, inside a fresh network namespace (removed
//! afterwards; the host's ruleset is never touched).
//!
//! Two tables, measured one after the other in their own namespace:
//!
//! * `data`: the data-only shape of `shared/notes/nft-data-maps.md` (design bN: a `backends`
//!   map keyed `daddr . l4proto . dport . slot`, 2 endpoints per service, a hairpin pair set,
//!   a handful of chains). The change is one endpoint replaced: delete + add of one `backends`
//!   element and its hairpin pair, one transaction (the deletion is what makes a one-shot `nft`
//!   wait in its final `close()`).
//! * `current`: svcnet-nft's own renderer (since v2 the data-only table; before it, a chain per
//!   service and endpoint, which the README's `current` row measured), loaded by a full
//!   sync through the context; the change is one endpoint replaced as the syncer's partial
//!   plan writes it. Its commit is dominated by the kernel's validation of the table.
//!
//! Arms per change, in rotation: `context` (`NftExecutor::apply`), `nft -f` (the `nft` binary
//! started inside the namespace by `nsenter --net`, as a proxy in the host namespace ran it) and
//! `ip netns exec nft -f` (what the proxy ran for a named namespace). Times are from the call
//! to the change being committed (the process's exit for the binary); p50/p99 nearest-rank.
//!
//! Usage (root): `cargo run --release -p svcnet-nft --example context_bench -- [N] [--changes K]
//! [--only data|current]`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svcnet_netns::{NetNs, unique_name};
use svcnet_nft::{Family, FullMode, NftExecutor, Renderer, Transaction};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};

fn ip(base: [u8; 4], i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::from(base)) + i as u32)
}

fn svc_ip(i: usize) -> Ipv4Addr {
    ip([10, 96, 0, 0], i)
}

fn ep_ip(i: usize, j: usize) -> Ipv4Addr {
    ip([10, 128, 0, 0], i * 2 + j)
}

/// The arms, in the order they take turns.
const ARMS: [&str; 3] = ["context", "nft -f", "ip netns exec nft -f"];

/// Applies `text` with arm `arm`; returns the time until it is committed.
fn apply(
    arm: usize,
    ns: &NetNs,
    exec: &NftExecutor,
    tx: Option<&Transaction>,
    text: &str,
) -> Duration {
    let t = Instant::now();
    match arm {
        0 => match tx {
            Some(tx) => exec.apply(tx).unwrap(),
            None => {
                exec.command(text).unwrap();
            }
        },
        _ => {
            let mut cmd = if arm == 1 {
                // nsenter, not a pre_exec setns: a pre_exec closure makes std fork this large
                // process (page tables copied) instead of posix_spawn, which would be timed.
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{}", ns.name())).arg("nft");
                c
            } else {
                svcnet_netns::command(Some(ns.name()), "nft")
            };
            let mut child = cmd
                .args(["-f", "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("nft (Debian package nftables)");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "nft -f: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    t.elapsed()
}

/// After a full load the context frees libnftables' cache of it and gives the memory back
/// (about 2 s at 30k, off the critical path); the proxy's next change comes at least
/// `--min-sync-period` (1 s) later. Changes measured here start once that is done.
fn settle() {
    std::thread::sleep(Duration::from_secs(3));
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e3
}

fn report(shape: &str, n: usize, samples: &mut [Vec<Duration>; 3]) {
    let mut line = format!("shape={shape} N={n} changes_per_arm={}", samples[0].len());
    // Where the slowest change of each arm was (the first after a load may pay extra).
    for (arm, s) in ARMS.iter().zip(samples.iter()) {
        if let Some((i, d)) = s.iter().enumerate().max_by_key(|(_, d)| **d) {
            line.push_str(&format!(
                " [{arm} slowest: change {i}, {:.1} ms]",
                d.as_secs_f64() * 1e3
            ));
        }
    }
    let p50_ctx = pct(&mut samples[0], 0.5);
    for (arm, s) in ARMS.iter().zip(samples.iter_mut()) {
        let (p50, p99) = (pct(s, 0.5), pct(s, 0.99));
        line.push_str(&format!(" | {arm}: p50 {p50:.2} ms p99 {p99:.2} ms"));
        if *arm != "context" {
            line.push_str(&format!(" ({:.1}x context)", p50 / p50_ctx));
        }
    }
    println!("{line}");
}

fn vm_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The data-only table (design bN, 2 endpoints per service).
fn data_table(n: usize) -> String {
    let keys: Vec<String> = (0..n)
        .map(|i| format!("{} . tcp . 80", svc_ip(i)))
        .collect();
    let backends: Vec<String> = (0..n)
        .flat_map(|i| (0..2).map(move |j| (i, j)))
        .map(|(i, j)| format!("{} . tcp . 80 . {j} : {} . 8080", svc_ip(i), ep_ip(i, j)))
        .collect();
    let hairpin: Vec<String> = (0..n)
        .flat_map(|i| (0..2).map(move |j| ep_ip(i, j)))
        .map(|e| format!("{e} . {e}"))
        .collect();
    let key = "typeof ip daddr . meta l4proto . th dport";
    format!(
        "add table ip bench\n\
         add set ip bench services {{ {key} ; elements = {{ {k} }} ; }}\n\
         add set ip bench svc-n2 {{ {key} ; elements = {{ {k} }} ; }}\n\
         add map ip bench backends {{ typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport ; elements = {{ {b} }} ; }}\n\
         add set ip bench hairpin {{ type ipv4_addr . ipv4_addr ; elements = {{ {h} }} ; }}\n\
         add chain ip bench services {{ ip daddr . meta l4proto . th dport @svc-n2 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends ; }}\n\
         add chain ip bench nat-output {{ type nat hook output priority -100 ; }}\n\
         add chain ip bench nat-output {{ jump services ; }}\n\
         add chain ip bench nat-postrouting {{ type nat hook postrouting priority 100 ; }}\n\
         add chain ip bench nat-postrouting {{ ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random ; }}\n",
        k = keys.join(", "),
        b = backends.join(", "),
        h = hairpin.join(", "),
    )
}

fn data(n: usize, changes: usize) {
    let ns = NetNs::create(&unique_name("ctxb")).unwrap();
    let exec = NftExecutor::new(Some(ns.name().to_string()));
    let t = Instant::now();
    exec.command(&data_table(n)).unwrap();
    println!(
        "shape=data N={n}: loaded through the context in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    settle();
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for c in 0..changes * ARMS.len() {
        // A different service each time, its slot 1 moved to a new address.
        let i = (c * 7919) % n;
        let (old, new) = (ep_ip(i, 1), ip([10, 192, 0, 0], c));
        let s = svc_ip(i);
        let text = format!(
            "delete element ip bench backends {{ {s} . tcp . 80 . 1 }}\n\
             delete element ip bench hairpin {{ {old} . {old} }}\n\
             add element ip bench backends {{ {s} . tcp . 80 . 1 : {new} . 8080 }}\n\
             add element ip bench hairpin {{ {new} . {new} }}\n"
        );
        let arm = c % ARMS.len();
        samples[arm].push(apply(arm, &ns, &exec, None, &text));
    }
    report("data", n, &mut samples);
}

fn current(n: usize, changes: usize) {
    let ns = NetNs::create(&unique_name("ctxb")).unwrap();
    let exec = NftExecutor::new(Some(ns.name().to_string()));
    let mut st = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.128.0.0/9".parse().unwrap()],
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
        ..Default::default()
    });
    for i in 0..n {
        let name = format!("svc{i}");
        st.update_service(&service("bench", &name, |b| {
            b.cluster_ip(&[&svc_ip(i).to_string()])
                .port("http", "TCP", 80);
        }))
        .unwrap();
        st.update_slice(&slice("bench", &format!("{name}-1"), &name, |b| {
            b.port("http", "TCP", 8080);
            for j in 0..2 {
                b.endpoint(&ep_ip(i, j).to_string(), "n1", |_| {});
            }
        }));
    }
    st.take_changes();
    let mut r = Renderer::new(Family::Ip);
    let plan = r.plan_full(&st.desired(IpFamily::V4), FullMode::Recreate);
    let rss = vm_kib("VmRSS:");
    let t = Instant::now();
    exec.apply(&plan.tx).unwrap();
    let took = t.elapsed();
    let after = vm_kib("VmRSS:");
    // The context frees its cache and trims malloc's free memory after a big command, once
    // it has answered.
    std::thread::sleep(Duration::from_secs(3));
    println!(
        "shape=current N={n}: full sync through the context in {:.2} s; this process's RSS {} MiB before, {} MiB right after, {} MiB 3 s later",
        took.as_secs_f64(),
        rss / 1024,
        after / 1024,
        vm_kib("VmRSS:") / 1024
    );
    r.commit(plan);
    settle();
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for c in 0..changes * ARMS.len() {
        let i = (c * 7919) % n;
        let name = format!("svc{i}");
        st.update_slice(&slice("bench", &format!("{name}-1"), &name, |b| {
            b.port("http", "TCP", 8080)
                .endpoint(&ep_ip(i, 0).to_string(), "n1", |_| {})
                .endpoint(&ip([10, 192, 0, 0], c).to_string(), "n1", |_| {});
        }));
        let changed = st.take_changes();
        let d = st.desired_for(IpFamily::V4, changed.services.keys());
        let plan = r.plan_partial(&st.node_state(IpFamily::V4), &d).unwrap();
        let text = plan.tx.to_string();
        let arm = c % ARMS.len();
        samples[arm].push(apply(arm, &ns, &exec, Some(&plan.tx), &text));
        r.commit(plan);
    }
    report("current", n, &mut samples);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut n = 30_000;
    let mut changes = 30;
    let mut only = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--changes" => changes = it.next().and_then(|v| v.parse().ok()).expect("--changes K"),
            "--only" => only = it.next().cloned(),
            v => n = v.parse().expect("N"),
        }
    }
    if only.as_deref() != Some("current") {
        data(n, changes);
    }
    if only.as_deref() != Some("data") {
        current(n, changes);
    }
}
