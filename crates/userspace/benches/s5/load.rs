//! The load generators: wrk (keep-alive and new connections), iperf3 (one bulk stream), a
//! sequential connect+GET latency probe and a UDP request/response loop.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use svcnet_netns::NetNs;

/// A UDP request/response loop: `clients` threads in `ns`, each with its own socket (one flow
/// each), send a 32-byte datagram and wait for the answer, for `secs`. Returns requests/s and
/// p50/p99 round-trip µs; a reply missing after 200 ms counts as lost (not as a latency).
pub(crate) fn udp_loop(ns: &NetNs, addr: SocketAddr, clients: usize, secs: u64) -> (f64, f64, f64) {
    let (mut lat, lost) = ns
        .run(move || {
            std::thread::scope(|sc| {
                let threads: Vec<_> = (0..clients)
                    .map(|_| {
                        sc.spawn(move || {
                            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                            s.connect(addr).unwrap();
                            s.set_read_timeout(Some(Duration::from_millis(200)))
                                .unwrap();
                            let (mut lat, mut lost) = (Vec::new(), 0u32);
                            let mut buf = [0u8; 512];
                            let end = Instant::now() + Duration::from_secs(secs);
                            while Instant::now() < end && lost < 50 {
                                let t = Instant::now();
                                if s.send(&[b'q'; 32]).is_err() {
                                    lost += 1;
                                    continue;
                                }
                                match s.recv(&mut buf) {
                                    Ok(_) => lat.push(t.elapsed().as_secs_f64() * 1e6),
                                    Err(_) => lost += 1,
                                }
                            }
                            (lat, lost)
                        })
                    })
                    .collect();
                threads.into_iter().fold((Vec::new(), 0), |(mut v, l), t| {
                    let (lat, lost) = t.join().unwrap();
                    v.extend(lat);
                    (v, l + lost)
                })
            })
        })
        .unwrap();
    if lost > 0 {
        eprintln!("udp {addr}: {lost} requests lost");
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let k = lat.len().max(1);
    (
        lat.len() as f64 / secs as f64,
        lat.get(k / 2).copied().unwrap_or(f64::NAN),
        lat.get(k * 99 / 100).copied().unwrap_or(f64::NAN),
    )
}

pub(crate) fn wrk(ns: &str, url: &str, conns: u32, secs: u64, close: bool) -> f64 {
    let (c, d) = (conns.to_string(), format!("{secs}s"));
    let mut args = vec!["wrk", "-t1", "-c", &c, "-d", &d];
    if close {
        args.extend(["-H", "Connection: close"]);
    }
    args.push(url);
    let out = svcnet_netns::command(Some(ns), "wrk")
        .args(&args[1..])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("wrk output: {text}"))
}

pub(crate) fn iperf(ns: &str, host: IpAddr, port: u16, secs: u64) -> Option<f64> {
    let out = svcnet_netns::command(Some(ns), "iperf3")
        .args(["-c", &host.to_string(), "-p", &port.to_string(), "-t"])
        .arg(secs.to_string())
        .args(["-f", "g"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "[  5]   0.00-2.00   sec  1.2 GBytes  5.1 Gbits/sec  receiver"
    text.lines()
        .filter(|l| l.contains("receiver"))
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|w| *w == "Gbits/sec")?;
            f.get(i - 1)?.parse().ok()
        })
}

/// Unloaded latency: sequential new connection + HTTP request + full response.
pub(crate) fn probe(ns: &NetNs, addr: SocketAddr, n: usize) -> (f64, f64) {
    let mut v = ns
        .run(move || {
            let mut v = Vec::with_capacity(n);
            let mut buf = [0u8; 1024];
            let mut errors = 0;
            for _ in 0..n {
                let t = Instant::now();
                let ok = (|| -> std::io::Result<()> {
                    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    s.write_all(b"GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")?;
                    while s.read(&mut buf)? > 0 {}
                    Ok(())
                })();
                match ok {
                    Ok(()) => v.push(t.elapsed().as_secs_f64() * 1e6),
                    Err(_) => errors += 1,
                }
            }
            if errors > 0 {
                eprintln!("probe {addr}: {errors} of {n} requests failed");
            }
            v
        })
        .unwrap();
    v.sort_by(|a, b| a.total_cmp(b));
    let k = v.len().max(1);
    (
        v.get(k / 2).copied().unwrap_or(f64::NAN),
        v.get(k * 99 / 100).copied().unwrap_or(f64::NAN),
    )
}
