//! A closed-loop UDP DNS load generator that keeps the server, not itself, the bottleneck:
//! the second client of S6 beside dnsperf.
//!
//! dnsperf makes two system calls per question (one `sendto`, one `recvmsg`), so on these two
//! cores one dnsperf thread tops out near 150k questions/s, and a server that answers faster
//! than that is measured at dnsperf's speed (its rounds show fewer questions outstanding than
//! allowed: the server was waiting for the client). This client asks the same questions
//! (dnsperf's input file, each with RD and an EDNS0 OPT record of 4096 bytes, as `dnsperf -e`
//! sends them) from `SOCKETS` sockets, each keeping up to `WINDOW` questions outstanding, sent
//! with `sendmmsg` and taken with `recvmmsg` (up to 64 per call), all in one thread: a few
//! hundred nanoseconds per question of its own, so each server runs at its own limit.
//!
//! An answer counts when its ID matches an outstanding question of its socket; a question
//! unanswered for a second counts as lost and frees its slot. The figures: answers per second,
//! the mean and standard deviation of the round-trip time, lost questions.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Sockets (dnsperf's `-c 4`).
pub const SOCKETS: usize = 4;
/// Questions outstanding per socket (dnsperf's `-q 64` is for all its sockets together).
pub const WINDOW: usize = 32;
/// How long a question may wait for its answer before it counts as lost.
const LOST_AFTER: Duration = Duration::from_secs(1);

/// What one run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    pub answered: u64,
    pub lost: u64,
    pub secs: f64,
    pub mean_us: f64,
    pub stddev_us: f64,
    /// The round trip 99 % of answers beat (to the 1.1× step of the histogram below it).
    pub p99_us: f64,
    pub max_us: f64,
    /// Answers that took 10 ms or more.
    pub slow: u64,
}

/// Round trips by 10 % steps from 1 µs (bucket `i` holds ≥ 1.1^i µs).
const BUCKETS: usize = 200;

fn bucket(us: f64) -> usize {
    ((us.max(1.0).ln() / 1.1f64.ln()) as usize).min(BUCKETS - 1)
}

/// The questions of a dnsperf input file (`name TYPE` per line), encoded with ID 0.
pub fn questions(input: &str) -> Vec<Vec<u8>> {
    input
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = Name::from_ascii(words.next()?).ok()?;
            let qtype: RecordType = words.next().unwrap_or("A").parse().ok()?;
            let mut m = Message::new(0, MessageType::Query, OpCode::Query);
            m.metadata.recursion_desired = true;
            m.add_query(Query::query(name, qtype));
            let mut edns = Edns::new();
            edns.set_max_payload(4096);
            m.set_edns(edns);
            m.to_vec().ok()
        })
        .collect()
}

/// Latency sums of one socket's answers.
struct Sums {
    answered: u64,
    lost: u64,
    us: f64,
    us2: f64,
    max_us: f64,
    histogram: [u64; BUCKETS],
}

impl Default for Sums {
    fn default() -> Self {
        Sums {
            answered: 0,
            lost: 0,
            us: 0.0,
            us2: 0.0,
            max_us: 0.0,
            histogram: [0; BUCKETS],
        }
    }
}

/// Asks `server` the `questions` (round robin) for `secs` seconds.
pub async fn run(server: SocketAddr, questions: &[Vec<u8>], secs: f64) -> std::io::Result<Outcome> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..SOCKETS {
        let socket = UdpSocket::bind("127.0.0.1:0").await?;
        // Each socket starts at its own place in the list, so together they ask every name.
        let offset = s * questions.len() / SOCKETS;
        tasks.push(one_socket(socket, server, questions, offset, deadline));
    }
    let mut total = Sums::default();
    for sums in futures::future::join_all(tasks).await {
        let sums = sums?;
        total.answered += sums.answered;
        total.lost += sums.lost;
        total.us += sums.us;
        total.us2 += sums.us2;
        total.max_us = total.max_us.max(sums.max_us);
        for (t, b) in total.histogram.iter_mut().zip(sums.histogram) {
            *t += b;
        }
    }
    let mut below = 0;
    let p99 = total
        .histogram
        .iter()
        .position(|b| {
            below += b;
            below as f64 >= 0.99 * total.answered as f64
        })
        .map_or(0.0, |i| 1.1f64.powi(i as i32));
    let elapsed = start.elapsed().as_secs_f64();
    let n = total.answered.max(1) as f64;
    let mean = total.us / n;
    Ok(Outcome {
        answered: total.answered,
        lost: total.lost,
        secs: elapsed,
        mean_us: mean,
        stddev_us: (total.us2 / n - mean * mean).max(0.0).sqrt(),
        p99_us: p99,
        max_us: total.max_us,
        slow: total.histogram[bucket(10_000.0)..].iter().sum(),
    })
}

async fn one_socket(
    socket: UdpSocket,
    server: SocketAddr,
    questions: &[Vec<u8>],
    mut next: usize,
    deadline: Instant,
) -> std::io::Result<Sums> {
    let mut sums = Sums::default();
    // When each ID's question left (`None`: not outstanding).
    let mut sent_at: Vec<Option<Instant>> = vec![None; 1 << 16];
    let mut outstanding = 0usize;
    let mut id: u16 = 0;
    // The questions of one send, in buffers kept from send to send.
    let mut batch: Vec<(Vec<u8>, SocketAddr)> = (0..WINDOW)
        .map(|_| (Vec::with_capacity(512), server))
        .collect();
    let mut bufs = vec![[0u8; 4096]; 64];
    let mut got = Vec::with_capacity(64);
    let mut swept = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(sums);
        }
        // Fill the window.
        let mut filled = 0;
        while outstanding + filled < WINDOW {
            id = id.wrapping_add(1);
            if sent_at[usize::from(id)].is_some() {
                // Still waiting for this ID: skip it.
                continue;
            }
            let q = &mut batch[filled].0;
            q.clear();
            q.extend_from_slice(&questions[next % questions.len()]);
            q[..2].copy_from_slice(&id.to_be_bytes());
            next += 1;
            filled += 1;
        }
        let mut at = 0;
        while at < filled {
            match socket.try_io(Interest::WRITABLE, || {
                svcnet_netns::datagrams::send_many(socket.as_fd(), &batch[at..filled])
            }) {
                Ok(n) => {
                    for (q, _) in &batch[at..at + n] {
                        sent_at[usize::from(u16::from_be_bytes([q[0], q[1]]))] = Some(now);
                    }
                    outstanding += n;
                    at += n.max(1);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        // Take the answers there are, waiting at most until the next sweep.
        let wait = tokio::time::timeout(Duration::from_millis(100), socket.readable()).await;
        if let Ok(ready) = wait {
            ready?;
            match socket.try_io(Interest::READABLE, || {
                svcnet_netns::datagrams::recv_many(socket.as_fd(), &mut bufs, &mut got)
            }) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            for (buf, &(len, _)) in bufs.iter().zip(&got) {
                if len < 12 {
                    continue;
                }
                let slot = &mut sent_at[usize::from(u16::from_be_bytes([buf[0], buf[1]]))];
                if let Some(t) = slot.take() {
                    let us = now.duration_since(t).as_secs_f64() * 1e6;
                    sums.answered += 1;
                    sums.us += us;
                    sums.us2 += us * us;
                    sums.max_us = sums.max_us.max(us);
                    sums.histogram[bucket(us)] += 1;
                    outstanding -= 1;
                }
            }
            got.clear();
        }
        // Let the other sockets' tasks take their answers too (each of them is always ready
        // against a fast server, and would otherwise run until tokio's budget stops it).
        tokio::task::yield_now().await;
        let now = Instant::now();
        if now.duration_since(swept) >= Duration::from_millis(100) {
            swept = now;
            for slot in sent_at.iter_mut() {
                if slot.is_some_and(|t| now.duration_since(t) >= LOST_AFTER) {
                    *slot = None;
                    sums.lost += 1;
                    outstanding -= 1;
                }
            }
        }
    }
}

/// One run against `server` with the questions of dnsperf input file `input`, in a process of
/// its own on the clients' core (this bench binary again, with `SVCNET_BENCH_LOADGEN`).
pub fn run_child(server: SocketAddr, input: &Path, secs: u64) -> Option<Outcome> {
    let out = super::on_core(super::CLIENT_CORE, &super::this_bench())
        .env(
            "SVCNET_BENCH_LOADGEN",
            format!("{server}|{}|{secs}", input.to_str()?),
        )
        .output()
        .ok()?;
    let f: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [
        answered,
        lost,
        secs,
        mean_us,
        stddev_us,
        p99_us,
        max_us,
        slow,
    ] = f[..]
    else {
        return None;
    };
    Some(Outcome {
        answered: answered as u64,
        lost: lost as u64,
        secs,
        mean_us,
        stddev_us,
        p99_us,
        max_us,
        slow: slow as u64,
    })
}

/// The child side of [`run_child`]: with `SVCNET_BENCH_LOADGEN` set (`addr|file|secs`), runs
/// and prints the outcome, and returns true (the bench then exits).
pub fn child_main() -> bool {
    let Ok(spec) = std::env::var("SVCNET_BENCH_LOADGEN") else {
        return false;
    };
    let mut parts = spec.split('|');
    let (Some(addr), Some(file), Some(secs)) = (parts.next(), parts.next(), parts.next()) else {
        panic!("SVCNET_BENCH_LOADGEN: want addr|file|secs, got {spec:?}");
    };
    let addr: SocketAddr = addr.parse().expect("SVCNET_BENCH_LOADGEN: an address");
    let secs: f64 = secs.parse().expect("SVCNET_BENCH_LOADGEN: seconds");
    let text = std::fs::read_to_string(file).expect("SVCNET_BENCH_LOADGEN: the input file");
    let questions = questions(&text);
    assert!(!questions.is_empty(), "no questions in {file}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let o = rt
        .block_on(run(addr, &questions, secs))
        .expect("the load generator's sockets");
    println!(
        "{} {} {:.3} {:.1} {:.1} {:.0} {:.0} {}",
        o.answered, o.lost, o.secs, o.mean_us, o.stddev_us, o.p99_us, o.max_us, o.slow
    );
    true
}
