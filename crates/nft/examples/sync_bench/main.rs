//! S1/S2 for the nftables dataplane, side by side with a model of upstream kube-proxy's
//! nftables ruleset, in one run, as ratios (`shared/notes/performance.md` S1–S2).
//!
//! For each N (services, one TCP port each) and each endpoint count (2 and 10), inside a fresh
//! network namespace (removed afterwards; the host's ruleset is never touched), rounds
//! interleave the two subjects, each loading from an empty ruleset:
//!
//! * A `svcnet-nft`: render (desired state → full `Recreate` plan → nft text) + `nft -f -` of
//!   it, exactly the text `NftExecutor::apply` pipes; time, peak RSS of the `nft` process, and
//!   the growth of this process's peak RSS while rendering;
//! * B `kube-proxy`: `nft -f -` of the ruleset upstream's nftables proxier would load on its
//!   first full sync for the same services and endpoints (a model, see `kube_proxy.rs`),
//!   generated before the rounds and not timed (upstream's Go-side work is not counted); time
//!   and peak RSS of the `nft` process.
//!
//! `nft` runs as `/usr/bin/time -f %M -o <file> ip netns exec <ns> nft -f -` (rusage of the
//! child). Each table is deleted (untimed) after its measurement. Reported: medians, and A/B.
//! S2 (after the 2-endpoint rows; `--s2-only` skips S1; `s2.rs`): five kinds of one-service
//! change (endpoint replaced, service added, service deleted, endpoint count changed,
//! affinity changed), `--s2-runs` (50) of each, p50/p99 from the change handed to the
//! dataplane to the rules live in the kernel, beside `nft -f` of the same change in the
//! kube-proxy model's shape (in its own namespace holding its full ruleset).
//!
//! Usage (root): `cargo run --release -p svcnet-nft --example sync_bench -- [N …] [--quick]
//! [--rounds R] [--endpoints 2,10] [--dump] [--s2-only] [--s2-runs K (0: no S2)] [--kube-max N]`.
//! Default N = 1000 10000 30000 (`--quick`: 1000 10000); default rounds 3. The kube-proxy
//! model runs up to `--kube-max` services (10000; above, its load takes minutes and is
//! reported as "> cap"). `--dump` prints both rulesets for 2 services × 2 endpoints and exits.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

mod kube_proxy;
mod s2;

use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svcnet_netns::{NetNs, unique_name};
use svcnet_nft::{Family, FullMode, Renderer};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};

const CLUSTER_CIDR: &str = "10.128.0.0/9";
const SERVICE_CIDR: &str = "10.96.0.0/12";
const NAMESPACE: &str = "bench";

fn svc_ip(i: usize) -> String {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i as u32).to_string()
}

/// Endpoint `j` of service `i`: unique across services, inside the cluster CIDR.
fn ep_ip(i: usize, j: usize, eps: usize) -> String {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i * eps + j) as u32).to_string()
}

/// svcnet's input: N ClusterIP services, port `http` 80/TCP → 8080, `eps` ready endpoints each,
/// spread over nodes n1…n5 (Cluster policy: all are used from node n1).
fn state(n: usize, eps: usize) -> ProxyState {
    let mut s = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
        service_cidrs: vec![SERVICE_CIDR.parse().unwrap()],
        ..Default::default()
    });
    for i in 0..n {
        let name = format!("svc{i}");
        s.update_service(&service(NAMESPACE, &name, |b| {
            b.cluster_ip(&[&svc_ip(i)]).port("http", "TCP", 80);
        }))
        .unwrap();
        s.update_slice(&slice(NAMESPACE, &format!("{name}-1"), &name, |b| {
            b.port("http", "TCP", 8080);
            for j in 0..eps {
                b.endpoint(&ep_ip(i, j, eps), &format!("n{}", 1 + j % 5), |_| {});
            }
        }));
    }
    s.take_changes();
    s
}

/// The same services for the kube-proxy model.
fn kp_services(n: usize, eps: usize) -> Vec<kube_proxy::ServicePort> {
    (0..n)
        .map(|i| kube_proxy::ServicePort {
            namespace: NAMESPACE.into(),
            name: format!("svc{i}"),
            port_name: "http".into(),
            cluster_ip: svc_ip(i),
            port: 80,
            endpoints: (0..eps).map(|j| (ep_ip(i, j, eps), 8080)).collect(),
            affinity: false,
        })
        .collect()
}

/// One `nft -f -` run: wall time, user and system CPU seconds, peak RSS (KiB); `capped` when it
/// was killed at the cap (then `wall` is a lower bound and CPU/RSS are unknown).
#[derive(Clone, Copy)]
struct NftRun {
    wall: Duration,
    cpu_user: f64,
    cpu_sys: f64,
    kib: u64,
    capped: bool,
}

/// `nft -f -` of `text` in `ns`, measured with `/usr/bin/time` (rusage of the nft process).
/// Killed (its process group) after `cap`; the nft batch is atomic, so nothing is half-loaded,
/// but a batch already in the kernel runs to its end first.
fn nft_f(ns: &str, text: &str, cap: Duration) -> NftRun {
    let out = std::env::temp_dir().join(format!("{}.rusage", unique_name("s1b")));
    let t = Instant::now();
    let mut child = Command::new("/usr/bin/time")
        .args(["-f", "%e %U %S %M", "-o"])
        .arg(&out)
        .args(["ip", "netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("/usr/bin/time (Debian package `time`)");
    let pgid = child.id();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let res = child.wait_with_output();
        tx.send(t.elapsed()).ok();
        res
    });
    let (wall, capped) = match rx.recv_timeout(cap.saturating_sub(t.elapsed())) {
        Ok(wall) => (wall, false),
        Err(_) => {
            Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .status()
                .ok();
            (Duration::ZERO, true)
        }
    };
    let res = waiter.join().unwrap().unwrap();
    // A killed nft still finishes a batch the kernel is processing (SIGKILL does not interrupt
    // it), so a capped run reports when the process really exited: a lower bound.
    let wall = if capped { t.elapsed() } else { wall };
    let rusage = std::fs::read_to_string(&out).unwrap_or_default();
    std::fs::remove_file(&out).ok();
    assert!(
        capped || res.status.success(),
        "nft -f failed: {}",
        String::from_utf8_lossy(&res.stderr)
            .lines()
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let f: Vec<f64> = rusage
        .lines()
        .next_back()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let (cpu_user, cpu_sys, kib) = match f.as_slice() {
        [_, u, s, m] if !capped => (*u, *s, *m as u64),
        _ => (0.0, 0.0, 0),
    };
    NftRun {
        wall,
        cpu_user,
        cpu_sys,
        kib,
        capped,
    }
}

/// Deletes `table` in `ns` (untimed); after a capped run it may not exist.
fn delete_table(ns: &str, table: &str, must_exist: bool) {
    let ok = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "delete", "table", "ip", table])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok || !must_exist, "deleting table ip {table} in {ns}");
}

/// A `/proc/self/status` field in KiB.
fn proc_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Median (mean of the middle two for an even count).
fn median(v: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.into_iter().collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Human time: ms below 10 s, else s.
fn human(ms: f64) -> String {
    if ms < 10_000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1e3)
    }
}

/// One measurement of subject A.
struct ARun {
    render: Duration,
    render_kib: u64,
    bytes: usize,
    nft: NftRun,
}

fn run_a(ns: &str, st: &ProxyState, cap: Duration) -> ARun {
    let r = Renderer::new(Family::Ip);
    // Reset this process's peak RSS (VmHWM) so the render's own peak is visible.
    std::fs::write("/proc/self/clear_refs", "5").ok();
    let before = proc_kib("VmRSS:");
    let t = Instant::now();
    let desired = st.desired(IpFamily::V4);
    let plan = r.plan_full(&desired, FullMode::Recreate);
    let text = plan.tx.to_string();
    let render = t.elapsed();
    let render_kib = proc_kib("VmHWM:").saturating_sub(before);
    let nft = nft_f(ns, &text, cap.saturating_sub(render));
    let bytes = text.len();
    drop((text, plan, desired));
    delete_table(ns, svcnet_nft::names::TABLE, !nft.capped);
    ARun {
        render,
        render_kib,
        bytes,
        nft,
    }
}

/// Medians of one (N, endpoints) row.
struct Row {
    n: usize,
    eps: usize,
    rounds: usize,
    a_ms: f64,
    a_render_ms: f64,
    a_cpu: f64,
    a_nft_kib: u64,
    a_render_kib: u64,
    a_capped: bool,
    b_ms: f64,
    b_cpu: f64,
    b_nft_kib: u64,
    b_capped: bool,
}

impl Row {
    fn ratio(&self) -> String {
        match (self.a_capped, self.b_capped) {
            (false, false) => format!("{:.2}", self.a_ms / self.b_ms),
            (false, true) => format!("≤ {:.2}", self.a_ms / self.b_ms),
            (true, false) => format!("≥ {:.2}", self.a_ms / self.b_ms),
            (true, true) => "n/a (both capped)".into(),
        }
    }
    fn time(ms: f64, capped: bool) -> String {
        if capped {
            format!("≥ {} (killed at cap)", human(ms))
        } else {
            human(ms)
        }
    }
    fn cpu(s: f64, capped: bool) -> String {
        if capped {
            "n/a".into()
        } else {
            format!("{s:.1}")
        }
    }
    fn rss(kib: u64, capped: bool) -> String {
        if capped {
            "n/a".into()
        } else {
            format!("{:.0}", mib(kib))
        }
    }
}

struct Opts {
    sizes: Vec<usize>,
    endpoints: Vec<usize>,
    explicit_endpoints: bool,
    rounds: usize,
    row_budget: Duration,
    cap: Duration,
    dump: bool,
    s2_only: bool,
    s2_runs: usize,
    s2_kube_max: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        sizes: Vec::new(),
        endpoints: vec![2, 10],
        explicit_endpoints: false,
        rounds: 3,
        row_budget: Duration::from_secs(60),
        cap: Duration::from_secs(120),
        dump: false,
        s2_only: false,
        s2_runs: 50,
        s2_kube_max: 10_000,
    };
    let mut quick = false;
    let mut args = std::env::args().skip(1);
    let num = |args: &mut dyn Iterator<Item = String>, what: &str| -> u64 {
        args.next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{what} needs a number"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--dump" => o.dump = true,
            "--s2-only" => o.s2_only = true,
            "--s2-runs" => o.s2_runs = num(&mut args, "--s2-runs") as usize,
            "--kube-max" => o.s2_kube_max = num(&mut args, "--kube-max") as usize,
            "--rounds" => o.rounds = num(&mut args, "--rounds") as usize,
            "--row-budget" => o.row_budget = Duration::from_secs(num(&mut args, "--row-budget")),
            "--cap" => o.cap = Duration::from_secs(num(&mut args, "--cap")),
            "--endpoints" => {
                o.explicit_endpoints = true;
                o.endpoints = args
                    .next()
                    .expect("--endpoints 2,10")
                    .split(',')
                    .map(|e| e.parse().expect("--endpoints takes numbers"))
                    .collect()
            }
            n => o.sizes.push(n.parse().expect("sizes are numbers")),
        }
    }
    if o.sizes.is_empty() {
        o.sizes = if quick {
            vec![1000, 10000]
        } else {
            vec![1000, 10000, 30000]
        };
    }
    o
}

fn main() {
    let o = opts();
    if o.dump {
        let st = state(2, 2);
        let plan =
            Renderer::new(Family::Ip).plan_full(&st.desired(IpFamily::V4), FullMode::Recreate);
        println!("# A svcnet-nft\n{}", plan.tx);
        let kp = kube_proxy::ruleset(&kp_services(2, 2), CLUSTER_CIDR, SERVICE_CIDR);
        println!("# B kube-proxy (model)\n{kp}");
        return;
    }
    let start = Instant::now();
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for &n in &o.sizes {
        for &eps in &o.endpoints {
            // Both subjects load one anonymous verdict map per service at 10 endpoints, which
            // the kernel handles in time quadratic in their number (~100 s each at 10k): at 30k
            // neither would finish within the cap, so that row runs only when asked for.
            if n * eps > 100_000 && !o.explicit_endpoints {
                skipped.push((n, eps));
                continue;
            }
            let ns = NetNs::create(&unique_name("s1b")).expect("needs root");
            let mut st = state(n, eps);
            if o.s2_only {
                s2::run(&mut st, n, eps, o.s2_runs, n <= o.s2_kube_max, o.cap);
                continue;
            }
            let t = Instant::now();
            let kp = kube_proxy::ruleset(&kp_services(n, eps), CLUSTER_CIDR, SERVICE_CIDR);
            let kp_gen = t.elapsed();
            let (mut a_runs, mut b_runs) = (Vec::new(), Vec::new());
            let row_start = Instant::now();
            // Interleaved rounds A, B, A, B…; a row stops early once it has used its budget.
            for round in 1..=o.rounds {
                if round > 1 && row_start.elapsed() > o.row_budget {
                    break;
                }
                let a = run_a(ns.name(), &st, o.cap);
                eprintln!(
                    "[{:>6.1}s] N={n} eps={eps} round {round} A svcnet-nft: render {:.0} ms + nft -f {:.0} ms{} (cpu {:.1}+{:.1} s), nft {:.0} MiB, render +{:.0} MiB, {} KiB",
                    start.elapsed().as_secs_f64(),
                    ms(a.render),
                    ms(a.nft.wall),
                    if a.nft.capped { " CAPPED" } else { "" },
                    a.nft.cpu_user,
                    a.nft.cpu_sys,
                    mib(a.nft.kib),
                    mib(a.render_kib),
                    a.bytes / 1024
                );
                a_runs.push(a);
                if n > o.s2_kube_max {
                    // Not run: above 10k services the model's load exceeds any useful cap
                    // (quadratic in anonymous vmaps); reported as capped, i.e. "> cap".
                    b_runs.push(NftRun {
                        wall: o.cap,
                        cpu_user: 0.0,
                        cpu_sys: 0.0,
                        kib: 0,
                        capped: true,
                    });
                    continue;
                }
                let b = nft_f(ns.name(), &kp, o.cap);
                delete_table(ns.name(), kube_proxy::TABLE, !b.capped);
                eprintln!(
                    "[{:>6.1}s] N={n} eps={eps} round {round} B kube-proxy: nft -f {:.0} ms{} (cpu {:.1}+{:.1} s), nft {:.0} MiB, {} KiB (generated in {:.0} ms)",
                    start.elapsed().as_secs_f64(),
                    ms(b.wall),
                    if b.capped { " CAPPED" } else { "" },
                    b.cpu_user,
                    b.cpu_sys,
                    mib(b.kib),
                    kp.len() / 1024,
                    ms(kp_gen)
                );
                b_runs.push(b);
            }
            drop(kp);
            let row = Row {
                n,
                eps,
                rounds: a_runs.len(),
                a_ms: median(a_runs.iter().map(|a| ms(a.render + a.nft.wall))),
                a_render_ms: median(a_runs.iter().map(|a| ms(a.render))),
                a_cpu: median(
                    a_runs
                        .iter()
                        .map(|a| a.render.as_secs_f64() + a.nft.cpu_user + a.nft.cpu_sys),
                ),
                a_nft_kib: median(a_runs.iter().map(|a| a.nft.kib as f64)) as u64,
                a_render_kib: median(a_runs.iter().map(|a| a.render_kib as f64)) as u64,
                a_capped: a_runs.iter().any(|a| a.nft.capped),
                b_ms: median(b_runs.iter().map(|b| ms(b.wall))),
                b_cpu: median(b_runs.iter().map(|b| b.cpu_user + b.cpu_sys)),
                b_nft_kib: median(b_runs.iter().map(|b| b.kib as f64)) as u64,
                b_capped: b_runs.iter().any(|b| b.capped),
            };
            println!(
                "S1 N={n} endpoints={eps} subject=svcnet-nft full_sync_ms={:.0} render_ms={:.0} cpu_s={:.1} nft_peak_rss_mib={:.1} render_peak_mib={:.1} capped={} rounds={}",
                row.a_ms,
                row.a_render_ms,
                row.a_cpu,
                mib(row.a_nft_kib),
                mib(row.a_render_kib),
                row.a_capped,
                row.rounds
            );
            println!(
                "S1 N={n} endpoints={eps} subject=kube-proxy-model nft_f_ms={:.0} cpu_s={:.1} nft_peak_rss_mib={:.1} capped={} ratio_time_a_over_b={} ratio_nft_rss_a_over_b={}",
                row.b_ms,
                row.b_cpu,
                mib(row.b_nft_kib),
                row.b_capped,
                row.ratio(),
                if row.a_capped || row.b_capped {
                    "n/a".to_string()
                } else {
                    format!("{:.2}", row.a_nft_kib as f64 / row.b_nft_kib.max(1) as f64)
                }
            );
            if eps == 2 && o.s2_runs > 0 {
                s2::run(&mut st, n, eps, o.s2_runs, n <= o.s2_kube_max, o.cap);
            }
            rows.push(row);
            drop(ns);
        }
    }
    println!(
        "\n| N | endpoints | svcnet-nft full sync (render) | kube-proxy model `nft -f` | time A/B | CPU s A / B | `nft` peak RSS A / B (MiB) | svcnet render peak | rounds |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {} ({:.0} ms) | {} | **{}** | {} / {} | {} / {} | {:.0} MiB | {} |",
            r.n,
            r.eps,
            Row::time(r.a_ms, r.a_capped),
            r.a_render_ms,
            Row::time(r.b_ms, r.b_capped),
            r.ratio(),
            Row::cpu(r.a_cpu, r.a_capped),
            Row::cpu(r.b_cpu, r.b_capped),
            Row::rss(r.a_nft_kib, r.a_capped),
            Row::rss(r.b_nft_kib, r.b_capped),
            mib(r.a_render_kib),
            r.rounds
        );
    }
    for (n, eps) in skipped {
        println!(
            "| {n} | {eps} | skipped: both load one anonymous vmap per service, quadratic in the kernel; run `-- {n} --endpoints {eps} --cap 3600` | | | | | | |"
        );
    }
    eprintln!("total {:.0} s", start.elapsed().as_secs_f64());
}
