//! The bench's processes and CPU accounting: peers and load generators started in network
//! namespaces and stopped on drop, CPU time of processes and of the whole machine.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use svcnet_netns::NetNs;

/// A child process stopped (SIGTERM, then SIGKILL) on drop.
pub(crate) struct Proc(pub(crate) Child, &'static str);
impl Drop for Proc {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
        eprintln!("{} needed SIGKILL", self.1);
    }
}

pub(crate) fn spawn(ns: &str, argv: &[&str], name: &'static str) -> Proc {
    let child = svcnet_netns::command(Some(ns), argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    Proc(child, name)
}

pub(crate) fn wait_listening(ns: &NetNs, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if ns
            .run(move || TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
            .unwrap()
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{addr} is not listening");
}

/// CPU spent while `f` ran: the proxy's processes (user + system, and user alone) and the
/// whole machine, in seconds.
pub(crate) fn cpu_during<T>(pids: &[u32], f: impl FnOnce() -> T) -> (T, [f64; 3]) {
    let (p0, busy0) = (proc_times(pids), machine_busy());
    let out = f();
    let (p, busy) = (proc_times(pids), machine_busy());
    let user = p[0] - p0[0];
    (out, [user + p[1] - p0[1], user, busy - busy0])
}

/// User and system CPU seconds of processes (all their threads).
pub(crate) fn proc_times(pids: &[u32]) -> [f64; 2] {
    let tick = 100.0; // USER_HZ on Linux
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .map(|stat| {
            // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let t = |i: usize| {
                f.get(i - 3)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            [t(14) / tick, t(15) / tick]
        })
        .fold([0.0; 2], |a, b| [a[0] + b[0], a[1] + b[1]])
}

/// CPUs the machine has.
pub(crate) fn cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// Busy CPU seconds of the whole machine so far (every CPU, minus idle and iowait).
pub(crate) fn machine_busy() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = f.iter().take(8).sum();
    (total - f.get(3).unwrap_or(&0.0) - f.get(4).unwrap_or(&0.0)) / 100.0
}

/// Child processes of `pid` (nginx's workers).
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

pub(crate) fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}
