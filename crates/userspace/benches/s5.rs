//! S5 / S9 benchmark (performance.md): the userspace dataplane against a direct routed
//! connection, HAProxy `mode tcp`, nginx `stream` and svcnet's nftables dataplane, on the same
//! backend (nginx, 1 worker) and load generator (wrk; iperf3 for a bulk stream), in network
//! namespaces, interleaved rounds, medians, printed as ratios; then Maglev table build time
//! and disruption (S9).
//!
//! Run (root): `cargo bench -p svcnet-userspace --bench s5` (env `S5_ROUNDS`, `S5_SECS`).
//! Bounded: rounds × subjects × (2 wrk runs + iperf3 + a 400-request probe), about 2 minutes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use svcnet_lb::maglev::MaglevTable;
use svcnet_netns::NetNs;
use svcnet_netns::test_support::Lab;
use svcnet_nft::{FullMode, NftExecutor, Renderer};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};
use svcnet_userspace::{Config, Mode, UserspaceProxy};

/// A child process stopped (SIGTERM, then SIGKILL) on drop.
struct Proc(Child, &'static str);
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

fn spawn(ns: &str, argv: &[&str], name: &'static str) -> Proc {
    let child = svcnet_netns::command(Some(ns), argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    Proc(child, name)
}

fn wait_listening(ns: &NetNs, addr: SocketAddr) {
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

#[derive(Default, Clone)]
struct Sample {
    ka_rps: f64,
    nc_rps: f64,
    p50_us: f64,
    p99_us: f64,
    gbps: Option<f64>,
}

fn wrk(ns: &str, url: &str, conns: u32, secs: u64, close: bool) -> f64 {
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

fn iperf(ns: &str, host: IpAddr, port: u16, secs: u64) -> Option<f64> {
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
fn probe(ns: &NetNs, addr: SocketAddr, n: usize) -> (f64, f64) {
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("S5 needs root (network namespaces); skipped");
        return;
    }
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let rounds = env("S5_ROUNDS", 3) as usize;
    let secs = env("S5_SECS", 2);
    for tool in ["wrk", "nginx", "haproxy"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            eprintln!(
                "S5 needs {tool} (apt-get install wrk nginx-light libnginx-mod-stream haproxy iperf3); skipped"
            );
            return;
        }
    }
    let have_iperf = Command::new("sh")
        .args(["-c", "command -v iperf3"])
        .output()
        .is_ok_and(|o| o.status.success());

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_string_lossy().into_owned();
    let mut lab = Lab::new().unwrap();
    lab.add_pod().unwrap(); // client
    lab.add_pod().unwrap(); // backend
    let client = lab.pod(0).ns.name().to_string();
    let backend_ns = lab.pod(1).ns.name().to_string();
    let backend = IpAddr::V4(lab.pod(1).ipv4);
    let gateway = IpAddr::V4(Ipv4Addr::new(10, 244, 1, 1));
    let node = lab.node.name().to_string();
    // New-connection runs open tens of thousands of connections to one destination: widen the
    // ephemeral range and reuse TIME_WAIT ports on every side alike (client, proxies, backend).
    for ns in [&lab.pod(0).ns, &lab.pod(1).ns, &lab.node] {
        ns.exec(&[
            "sysctl",
            "-qw",
            "net.ipv4.ip_local_port_range=1024 65000",
            "net.ipv4.tcp_tw_reuse=1",
        ])
        .unwrap();
    }

    // Backend: nginx, one worker, a tiny response; iperf3 server.
    let conf = write(
        dir.path(),
        "backend.conf",
        &format!(
            "worker_processes 1; daemon off; pid {d}/backend.pid; error_log {d}/backend.err;\n\
             events {{ worker_connections 8192; }}\n\
             http {{ access_log off; client_body_temp_path {d}/cb; proxy_temp_path {d}/pt;\n\
             keepalive_requests 100000000;\n\
             server {{ listen 8080 backlog=4096; location / {{ return 200 \"ok\\n\"; }} }} }}\n"
        ),
    );
    let _backend = spawn(
        &backend_ns,
        &["nginx", "-c", &conf, "-e", &format!("{d}/b.err")],
        "nginx backend",
    );
    let _iperf_server = have_iperf.then(|| {
        spawn(
            &backend_ns,
            &["iperf3", "-s", "-p", "5201"],
            "iperf3 server",
        )
    });
    wait_listening(&lab.pod(0).ns, SocketAddr::new(backend, 8080));

    // Peers in the node namespace.
    let hconf = write(
        dir.path(),
        "haproxy.cfg",
        &format!(
            "global\n  maxconn 8000\n  nbthread 2\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n\
             frontend http\n  bind 0.0.0.0:9001\n  default_backend http\nbackend http\n  server b {backend}:8080\n\
             frontend bulk\n  bind 0.0.0.0:9201\n  default_backend bulk\nbackend bulk\n  server b {backend}:5201\n"
        ),
    );
    let _haproxy = spawn(&node, &["haproxy", "-db", "-f", &hconf], "haproxy");
    let nconf = write(
        dir.path(),
        "nginx-stream.conf",
        &format!(
            "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n\
             worker_processes 2; daemon off; pid {d}/stream.pid; error_log {d}/stream.err;\n\
             events {{ worker_connections 8000; }}\n\
             stream {{ server {{ listen 9002 backlog=4096; proxy_pass {backend}:8080; }}\n\
             server {{ listen 9202; proxy_pass {backend}:5201; }} }}\n"
        ),
    );
    let _nginx = spawn(
        &node,
        &["nginx", "-c", &nconf, "-e", &format!("{d}/s.err")],
        "nginx stream",
    );

    // svcnet: the same service twice, userspace at 172.30.0.10, nftables at 10.96.0.30.
    let objects = |ip: &str| {
        (
            service("default", "bench", |s| {
                s.cluster_ip(&[ip])
                    .port("http", "TCP", 80)
                    .port("bulk", "TCP", 5201);
            }),
            [
                slice("default", "bench-http", "bench", |s| {
                    s.port("http", "TCP", 8080)
                        .endpoint(&backend.to_string(), "n1", |_| {});
                }),
                slice("default", "bench-bulk", "bench", |s| {
                    s.port("bulk", "TCP", 5201)
                        .endpoint(&backend.to_string(), "n1", |_| {});
                }),
            ],
        )
    };
    let state = |ip: &str| {
        let mut st = ProxyState::new(CoreConfig {
            node_name: "n1".into(),
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            service_cidrs: vec![format!("{ip}/32").parse().unwrap()],
            ..Default::default()
        });
        let (svc, slices) = objects(ip);
        st.update_service(&svc).unwrap();
        for s in &slices {
            st.update_slice(s);
        }
        st
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut cfg = Config::new(Mode::Privileged);
    cfg.netns = Some(node.clone());
    let proxy = rt.block_on(async { UserspaceProxy::new(cfg) }).unwrap();
    let us = state("172.30.0.10");
    rt.block_on(proxy.sync(&[us.desired(IpFamily::V4)]))
        .unwrap();
    let nft = NftExecutor::new(Some(node.clone()));
    let renderer = Renderer::new(svcnet_nft::Family::Ip);
    let plan = renderer.plan_full(
        &state("10.96.0.30").desired(IpFamily::V4),
        FullMode::Recreate,
    );
    nft.apply(&plan.tx).unwrap();

    let subjects: Vec<(&str, IpAddr, u16, u16)> = vec![
        ("direct", backend, 8080, 5201),
        ("svcnet-userspace", "172.30.0.10".parse().unwrap(), 80, 5201),
        ("haproxy-tcp", gateway, 9001, 9201),
        ("nginx-stream", gateway, 9002, 9202),
        ("svcnet-nftables", "10.96.0.30".parse().unwrap(), 80, 5201),
    ];
    for (_, ip, port, _) in &subjects {
        wait_listening(&lab.pod(0).ns, SocketAddr::new(*ip, *port));
    }
    let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
    let started = Instant::now();
    for round in 0..rounds {
        for (name, ip, port, bulk) in &subjects {
            let url = format!("http://{}/", SocketAddr::new(*ip, *port));
            let ka_rps = wrk(&client, &url, 32, secs, false);
            let nc_rps = wrk(&client, &url, 8, secs, true);
            let (p50_us, p99_us) = probe(&lab.pod(0).ns, SocketAddr::new(*ip, *port), 400);
            let gbps = have_iperf
                .then(|| iperf(&client, *ip, *bulk, secs))
                .flatten();
            eprintln!(
                "round {round} {name}: ka {ka_rps:.0}/s new-conn {nc_rps:.0}/s p50 {p50_us:.0}us p99 {p99_us:.0}us {gbps:?} Gbit/s"
            );
            samples.entry(name).or_default().push(Sample {
                ka_rps,
                nc_rps,
                p50_us,
                p99_us,
                gbps,
            });
        }
    }
    let med = |name: &str| {
        let v = &samples[name];
        Sample {
            ka_rps: median(v.iter().map(|s| s.ka_rps).collect()),
            nc_rps: median(v.iter().map(|s| s.nc_rps).collect()),
            p50_us: median(v.iter().map(|s| s.p50_us).collect()),
            p99_us: median(v.iter().map(|s| s.p99_us).collect()),
            gbps: v
                .iter()
                .map(|s| s.gbps)
                .collect::<Option<Vec<f64>>>()
                .map(median),
        }
    };
    let direct = med("direct");
    let peer_best = |f: &dyn Fn(&Sample) -> f64| {
        ["haproxy-tcp", "nginx-stream"]
            .iter()
            .map(|n| f(&med(n)))
            .fold(f64::MIN, f64::max)
    };
    let (best_ka, best_nc) = (peer_best(&|s| s.ka_rps), peer_best(&|s| s.nc_rps));
    let best_gbps = peer_best(&|s| s.gbps.unwrap_or(0.0));
    println!(
        "S5 rounds={rounds} secs={secs} backend=nginx(1 worker) wrk -t1 (keep-alive -c32, new-conn -c8) probe=400 sequential connect+GET; medians; took {:.0}s",
        started.elapsed().as_secs_f64()
    );
    for (name, ..) in &subjects {
        let s = med(name);
        let gb = s
            .gbps
            .map(|g| {
                format!(
                    " gbps={g:.2} gbps_ratio_direct={:.2} gbps_ratio_best_peer={:.2}",
                    g / direct.gbps.unwrap_or(f64::NAN),
                    g / best_gbps
                )
            })
            .unwrap_or_default();
        println!(
            "S5 subject={name} ka_rps={:.0} ka_ratio_direct={:.2} ka_ratio_best_peer={:.2} newconn_rps={:.0} newconn_ratio_direct={:.2} newconn_ratio_best_peer={:.2} p50_us={:.0} p99_us={:.0} added_p50_us={:.0} added_p99_us={:.0}{gb}",
            s.ka_rps,
            s.ka_rps / direct.ka_rps,
            s.ka_rps / best_ka,
            s.nc_rps,
            s.nc_rps / direct.nc_rps,
            s.nc_rps / best_nc,
            s.p50_us,
            s.p99_us,
            s.p50_us - direct.p50_us,
            s.p99_us - direct.p99_us,
        );
    }
    let m = proxy.metrics();
    println!(
        "S5 svcnet-userspace counters: total={} connect_failures={} bytes_in={} bytes_out={}",
        m.iter().map(|s| s.total).sum::<u64>(),
        m.iter().map(|s| s.connect_failures).sum::<u64>(),
        m.iter().map(|s| s.bytes_in).sum::<u64>(),
        m.iter().map(|s| s.bytes_out).sum::<u64>()
    );
    rt.block_on(proxy.shutdown()).unwrap();
    let _ = nft.delete_table(svcnet_nft::Family::Ip, renderer.table());
    drop(proxy);
    drop(rt);

    maglev();
}

/// S9: Maglev build time and disruption.
fn maglev() {
    let addr = |i: usize| {
        SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(10, 244, (i / 250) as u8, (i % 250 + 2) as u8)),
            8080,
        )
    };
    let list = |n: usize| -> Vec<(SocketAddr, u32)> { (0..n).map(|i| (addr(i), 1)).collect() };
    let moved =
        |a: &[(SocketAddr, u32)], ta: &MaglevTable, b: &[(SocketAddr, u32)], tb: &MaglevTable| {
            let m = ta.entries().len();
            (0..m)
                .filter(|&s| a[ta.entries()[s] as usize].0 != b[tb.entries()[s] as usize].0)
                .count() as f64
                / m as f64
        };
    for m in [65_537u32, 655_373] {
        for n in [100usize, 1000] {
            let base = list(n);
            let times: Vec<f64> = (0..if m > 100_000 { 5 } else { 21 })
                .map(|_| {
                    let t = Instant::now();
                    std::hint::black_box(MaglevTable::build(&base, m).unwrap());
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            let tb = MaglevTable::build(&base, m).unwrap();
            let shares = tb.shares(n);
            let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            let grown = list(n + 1);
            let tg = MaglevTable::build(&grown, m).unwrap();
            let add = moved(&base, &tb, &grown, &tg);
            // k = 1 % of the backends fail: slots that move beyond the failed ones' own.
            let k = (n / 100).max(1);
            let survivors: Vec<_> = base[k..].to_vec();
            let ts = MaglevTable::build(&survivors, m).unwrap();
            let own = (0..m as usize)
                .filter(|&s| (tb.entries()[s] as usize) < k)
                .count() as f64
                / m as f64;
            let fail = moved(&base, &tb, &survivors, &ts);
            println!(
                "S9 maglev M={m} N={n} build_ms={:.2} share_min={lo} share_max={hi} (ideal {}..{}) add_one_moved_pct={:.3} (min {:.3}) fail_{k}_moved_pct={:.3} (their own {:.3})",
                median(times),
                m as usize / n,
                (m as usize).div_ceil(n),
                add * 100.0,
                100.0 / (n + 1) as f64,
                fail * 100.0,
                own * 100.0
            );
        }
    }
}
