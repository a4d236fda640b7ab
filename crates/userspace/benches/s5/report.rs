//! What a run prints from its samples: each round's line per subject, then the medians per
//! subject, the goals as ratios against the best peer (and, for the kernel path, against
//! direct), each paired round by round with a bootstrap interval, and the zero-cost ceilings.

use std::collections::BTreeMap;

/// One round's figures for one subject (`None`: not measured for this subject).
#[derive(Default, Clone)]
pub(crate) struct Sample {
    pub(crate) ka_rps: f64,
    pub(crate) nc_rps: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) gbps: Option<f64>,
    /// CPU seconds of the proxy's own processes per GB relayed (iperf3 run).
    pub(crate) cpu_s_per_gb: Option<f64>,
    /// CPU seconds of the whole machine (all processes, softirq included) per GB.
    pub(crate) machine_cpu_s_per_gb: Option<f64>,
    pub(crate) udp_rps: Option<f64>,
    pub(crate) udp_p50_us: Option<f64>,
    pub(crate) udp_p99_us: Option<f64>,
    /// Proxy CPU µs per keep-alive request and per new connection (diagnostics: less
    /// sensitive to the machine's other load than the rates).
    pub(crate) cpu_us_per_req: Option<f64>,
    pub(crate) cpu_us_per_conn: Option<f64>,
    /// Whole-machine busy CPU µs per keep-alive request and per new connection (client,
    /// backend, proxy, softirq and kernel workers together), and how busy the machine was
    /// during the keep-alive run (1.0: every CPU).
    pub(crate) machine_us_per_req: Option<f64>,
    pub(crate) machine_us_per_conn: Option<f64>,
    pub(crate) machine_busy_ka: Option<f64>,
    /// The proxy's user-mode CPU µs per keep-alive request and per new connection: its own
    /// code, without the kernel's TCP work done in its system calls.
    pub(crate) user_us_per_req: Option<f64>,
    pub(crate) user_us_per_conn: Option<f64>,
}

impl Sample {
    /// The `round …` line of one subject, on stderr.
    pub(crate) fn print_round(&self, round: usize, name: &str) {
        let f = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |x| format!("{x:.d$}"));
        eprintln!(
            "round {round} {name}: ka {:.0}/s ({} cpu us/req, {} user, machine {} us/req, {} busy) new-conn {:.0}/s ({} cpu us/conn, {} user, machine {} us/conn) p50 {:.0}us p99 {:.0}us {} Gbit/s cpu {} s/GB (machine {}) udp {}/s p50 {}us p99 {}us",
            self.ka_rps,
            f(self.cpu_us_per_req, 1),
            f(self.user_us_per_req, 1),
            f(self.machine_us_per_req, 1),
            f(self.machine_busy_ka, 2),
            self.nc_rps,
            f(self.cpu_us_per_conn, 1),
            f(self.user_us_per_conn, 1),
            f(self.machine_us_per_conn, 1),
            self.p50_us,
            self.p99_us,
            f(self.gbps, 2),
            f(self.cpu_s_per_gb, 3),
            f(self.machine_cpu_s_per_gb, 3),
            f(self.udp_rps, 0),
            f(self.udp_p50_us, 0),
            f(self.udp_p99_us, 0),
        );
    }
}

/// The lines after the rounds: medians per subject, the goals and the ceilings.
pub(crate) fn goals(samples: &BTreeMap<&str, Vec<Sample>>, rounds: usize, subjects: &[&str]) {
    let opt_median = |v: Vec<Option<f64>>| v.into_iter().collect::<Option<Vec<f64>>>().map(median);
    let med = |name: &str| {
        let v = samples.get(name).cloned().unwrap_or_default();
        Sample {
            ka_rps: median(v.iter().map(|s| s.ka_rps).collect()),
            nc_rps: median(v.iter().map(|s| s.nc_rps).collect()),
            p50_us: median(v.iter().map(|s| s.p50_us).collect()),
            p99_us: median(v.iter().map(|s| s.p99_us).collect()),
            gbps: opt_median(v.iter().map(|s| s.gbps).collect()),
            cpu_s_per_gb: opt_median(v.iter().map(|s| s.cpu_s_per_gb).collect()),
            machine_cpu_s_per_gb: opt_median(v.iter().map(|s| s.machine_cpu_s_per_gb).collect()),
            udp_rps: opt_median(v.iter().map(|s| s.udp_rps).collect()),
            udp_p50_us: opt_median(v.iter().map(|s| s.udp_p50_us).collect()),
            udp_p99_us: opt_median(v.iter().map(|s| s.udp_p99_us).collect()),
            cpu_us_per_req: opt_median(v.iter().map(|s| s.cpu_us_per_req).collect()),
            cpu_us_per_conn: opt_median(v.iter().map(|s| s.cpu_us_per_conn).collect()),
            machine_us_per_req: opt_median(v.iter().map(|s| s.machine_us_per_req).collect()),
            machine_busy_ka: opt_median(v.iter().map(|s| s.machine_busy_ka).collect()),
            user_us_per_req: opt_median(v.iter().map(|s| s.user_us_per_req).collect()),
            machine_us_per_conn: opt_median(v.iter().map(|s| s.machine_us_per_conn).collect()),
            user_us_per_conn: opt_median(v.iter().map(|s| s.user_us_per_conn).collect()),
        }
    };
    let direct = med("direct");
    let opt = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |x| format!("{x:.d$}"));
    for name in subjects {
        let s = med(name);
        println!(
            "S5 subject={name} ka_rps={:.0} newconn_rps={:.0} p50_us={:.0} p99_us={:.0} added_p50_us={:.0} added_p99_us={:.0} gbps={} cpu_s_per_gb={} machine_cpu_s_per_gb={} udp_rps={} udp_p50_us={} udp_p99_us={} added_udp_p50_us={} cpu_us_per_req={} cpu_us_per_conn={} machine_us_per_req={} machine_busy_ka={} user_us_per_req={} machine_us_per_conn={} user_us_per_conn={}",
            s.ka_rps,
            s.nc_rps,
            s.p50_us,
            s.p99_us,
            s.p50_us - direct.p50_us,
            s.p99_us - direct.p99_us,
            opt(s.gbps, 2),
            opt(s.cpu_s_per_gb, 3),
            opt(s.machine_cpu_s_per_gb, 3),
            opt(s.udp_rps, 0),
            opt(s.udp_p50_us, 0),
            opt(s.udp_p99_us, 0),
            opt(s.udp_p50_us.zip(direct.udp_p50_us).map(|(a, b)| a - b), 0),
            opt(s.cpu_us_per_req, 1),
            opt(s.cpu_us_per_conn, 1),
            opt(s.machine_us_per_req, 1),
            opt(s.machine_busy_ka, 2),
            opt(s.user_us_per_req, 1),
            opt(s.machine_us_per_conn, 1),
            opt(s.user_us_per_conn, 1),
        );
    }
    // The goals: userspace against the best peer on every metric (≥ 1.0 is met; for latencies
    // and costs the ratio is best peer / ours, so ≥ 1.0 always means "at least as good"), and
    // the kernel path against direct.
    let ours = med("svcnet-userspace");
    let peers = [
        ("haproxy-tcp", med("haproxy-tcp")),
        ("nginx-stream", med("nginx-stream")),
    ];
    type Metric = (&'static str, fn(&Sample, &Sample) -> Option<f64>, bool);
    let metrics: [Metric; 9] = [
        ("keepalive_rps", |s, _| Some(s.ka_rps), true),
        ("newconn_rps", |s, _| Some(s.nc_rps), true),
        ("p50_us", |s, _| Some(s.p50_us), false),
        ("p99_us", |s, _| Some(s.p99_us), false),
        ("gbps", |s, _| s.gbps, true),
        ("cpu_s_per_gb", |s, _| s.cpu_s_per_gb, false),
        ("udp_rps", |s, _| s.udp_rps, true),
        ("udp_p50_us", |s, _| s.udp_p50_us, false),
        ("udp_p99_us", |s, _| s.udp_p99_us, false),
    ];
    for (metric, get, higher_better) in metrics {
        let Some(us) = get(&ours, &direct) else {
            continue;
        };
        let best = peers
            .iter()
            .filter_map(|(n, p)| get(p, &direct).filter(|v| *v > 0.0).map(|v| (*n, v)))
            .reduce(|a, b| {
                let better = if higher_better { b.1 > a.1 } else { b.1 < a.1 };
                if better { b } else { a }
            });
        let Some((peer, best)) = best else { continue };
        // Latencies are compared as totals: the direct path's latency is the same offset in
        // both, so "ours adds no more than the peer" is "ours ≤ the peer's total".
        let ratio = if higher_better { us / best } else { best / us };
        // Paired per round: ours against the best peer of the same round, which cancels much
        // of the machine's drifting load. Median and range over rounds.
        let empty = Vec::new();
        let rows = |n: &str| samples.get(n).unwrap_or(&empty);
        let paired: Vec<f64> = (0..rounds)
            .filter_map(|r| {
                let d = rows("direct").get(r)?;
                let u = get(rows("svcnet-userspace").get(r)?, d).filter(|v| *v > 0.0)?;
                let b = ["haproxy-tcp", "nginx-stream"]
                    .iter()
                    .filter_map(|n| get(rows(n).get(r)?, d).filter(|v| *v > 0.0))
                    .reduce(|a, b| if higher_better { a.max(b) } else { a.min(b) })?;
                Some(if higher_better { u / b } else { b / u })
            })
            .collect();
        let (paired_median, range) = summary(paired);
        println!(
            "S5 goal userspace metric={metric} ours={us:.3} best_peer={peer} best_peer_value={best:.3} ratio={ratio:.2} paired_ratio_median={paired_median:.2} paired_range={range} met={}",
            if ratio >= 1.0 { "yes" } else { "no" }
        );
    }
    // What any proxy could gain over each peer: on a busy machine throughput follows machine
    // CPU per request, and a proxy whose own code cost nothing would save only the peer's
    // user-mode share of it (the kernel's TCP work for the proxy's two sockets stays).
    type Per = fn(&Sample) -> Option<f64>;
    let shares: [(&str, Per, Per); 2] = [
        (
            "keepalive_rps",
            |s| s.machine_us_per_req,
            |s| s.user_us_per_req,
        ),
        (
            "newconn_rps",
            |s| s.machine_us_per_conn,
            |s| s.user_us_per_conn,
        ),
    ];
    for (metric, machine, user) in shares {
        let ceilings: Vec<String> = std::iter::once(("svcnet-userspace", &ours))
            .chain(peers.iter().map(|(n, p)| (*n, p)))
            .filter_map(|(n, s)| {
                let (m, u) = (machine(s)?, user(s)?);
                Some(format!(
                    "{n}: user {u:.1} of {m:.1} us, zero-cost ceiling {:.2}x",
                    m / (m - u)
                ))
            })
            .collect();
        if !ceilings.is_empty() {
            println!("S5 ceiling metric={metric} {}", ceilings.join("; "));
        }
    }
    let (kpath, floor_row) = (med("svcnet-nftables"), med("dnat-floor"));
    for (metric, get, _) in [metrics[0], metrics[1], metrics[4], metrics[6]] {
        if let (Some(k), Some(d)) = (get(&kpath, &direct), get(&direct, &direct))
            && k.is_finite()
            && d > 0.0
        {
            // The same ratio round by round (each subject ran seconds after direct).
            let empty = Vec::new();
            let rows = |n: &str| samples.get(n).unwrap_or(&empty);
            let paired = |subject: &str| -> Vec<f64> {
                (0..rounds)
                    .filter_map(|r| {
                        let dr = rows("direct").get(r)?;
                        let x = get(rows(subject).get(r)?, dr)?;
                        let dd = get(dr, dr).filter(|v| *v > 0.0)?;
                        Some(x / dd)
                    })
                    .collect()
            };
            let (paired_median, range) = summary(paired("svcnet-nftables"));
            let floor =
                get(&floor_row, &direct)
                    .filter(|f| f.is_finite())
                    .map_or("-".to_string(), |f| {
                        format!(
                            "{:.2} (paired {:.2})",
                            f / d,
                            summary(paired("dnat-floor")).0
                        )
                    });
            println!(
                "S5 goal nftables metric={metric} ours={k:.3} direct={d:.3} ratio={:.2} paired_ratio_median={paired_median:.2} paired_range={range} dnat_floor_ratio={floor} met={}",
                k / d,
                if k / d >= 0.95 { "yes" } else { "no" }
            );
        }
    }
}

/// Median and range of per-round ratios, the range written `lo..hi` followed by the 95 %
/// bootstrap interval of the median (`ci95=lo..hi`: 2000 resamples of the rounds with a fixed
/// seed, so a run prints the same interval for the same rounds).
pub(crate) fn summary(mut v: Vec<f64>) -> (f64, String) {
    v.sort_by(|a, b| a.total_cmp(b));
    let range = match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{lo:.2}..{hi:.2}"),
        _ => "-".into(),
    };
    let ci = bootstrap_ci(&v).map_or("-".into(), |(lo, hi)| format!("{lo:.2}..{hi:.2}"));
    (median(v), format!("{range} paired_ci95={ci}"))
}

/// The 95 % bootstrap interval of the median of `v`.
fn bootstrap_ci(v: &[f64]) -> Option<(f64, f64)> {
    if v.len() < 3 {
        return None;
    }
    // xorshift64*: a fixed, dependency-free stream of resampling indices.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    };
    let mut medians: Vec<f64> = (0..2000)
        .map(|_| median((0..v.len()).map(|_| v[next(v.len())]).collect()))
        .collect();
    medians.sort_by(|a, b| a.total_cmp(b));
    Some((medians[50], medians[1949]))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
