//! What the DNS benches share: the cores clients and servers run on, a dnsperf round, and the
//! batching load generator ([`loadgen`]) run as a process of its own.

pub mod loadgen;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

/// The cores of the clients and of the servers.
pub const CLIENT_CORE: &str = "0";
pub const SERVER_CORE: &str = "1";

/// Whether clients and servers run on cores of their own (`SVCNET_BENCH_PIN`, default on;
/// off with fewer than two cores or without `taskset`). Children started by [`on_core`] get
/// their own cores, also from a bench pinned by [`pin_self`].
pub fn pinned() -> bool {
    // The bench started again on the servers' core sees only that core.
    if std::env::var("SVCNET_BENCH_PINNED").is_ok() {
        return true;
    }
    std::env::var("SVCNET_BENCH_PIN").as_deref() != Ok("0")
        && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
        && Command::new("taskset")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// `program` to run on `cores` (`taskset -c`) when pinning, else as it is.
pub fn on_core(cores: &str, program: &str) -> Command {
    if !pinned() {
        return Command::new(program);
    }
    let mut c = Command::new("taskset");
    c.args(["-c", cores, program]);
    c
}

/// This bench binary, to start again.
pub fn this_bench() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(str::to_string))
        .unwrap_or_default()
}

/// A bench that serves in its own process runs again on the servers' core (when pinning and
/// not yet there), and exits with that run's status; otherwise this returns. Prints where the
/// cores went.
pub fn pin_self(tag: &str) {
    if pinned() && std::env::var("SVCNET_BENCH_PINNED").is_err() {
        let status = on_core(SERVER_CORE, &this_bench())
            .args(std::env::args().skip(1))
            .env("SVCNET_BENCH_PINNED", "1")
            .status();
        std::process::exit(status.ok().and_then(|s| s.code()).unwrap_or(1));
    }
    let placement = if pinned() {
        "clients on core 0, servers on core 1"
    } else {
        "as the scheduler places them"
    };
    println!("{tag} cores: {placement}");
}

/// What a dnsperf round printed.
#[allow(dead_code)] // each bench compiles this module; the nodelocal bench reads `qps` only
pub struct Dnsperf {
    pub qps: f64,
    pub completed: f64,
    pub avg_s: f64,
    pub stddev_s: f64,
    pub lost: String,
}

/// One dnsperf round of `secs` against `server` on the clients' core: the questions of
/// `input`, 4 sockets, 64 outstanding (`-c 4 -q 64`), with EDNS0 when `edns` (`-e`).
pub fn dnsperf(server: SocketAddr, input: &Path, secs: u64, edns: bool) -> Option<Dnsperf> {
    let out = on_core(CLIENT_CORE, "dnsperf")
        .args([
            "-s",
            &server.ip().to_string(),
            "-p",
            &server.port().to_string(),
        ])
        .args(["-d", input.to_str()?, "-l", &secs.to_string()])
        .args(["-c", "4", "-q", "64"])
        .args(edns.then_some("-e"))
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| -> Option<String> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key).map(|v| v.trim().to_string()))
    };
    let num = |s: String| s.split_whitespace().next()?.parse::<f64>().ok();
    Some(Dnsperf {
        qps: num(field("Queries per second:")?)?,
        completed: num(field("Queries completed:")?)?,
        avg_s: num(field("Average Latency (s):")?)?,
        stddev_s: num(field("Latency StdDev (s):")?)?,
        lost: field("Queries lost:")?,
    })
}
