//! S5 / S9 benchmark (performance.md): the userspace dataplane against a direct routed
//! connection, HAProxy `mode tcp`, nginx `stream` and svcnet's nftables dataplane, on the same
//! backend (nginx, 1 worker) and load generator (wrk; iperf3 for a bulk stream), in network
//! namespaces, interleaved rounds, medians, printed as ratios; then Maglev table build time
//! and disruption (S9).
//!
//! Run (root): `cargo bench -p svcnet-userspace --bench s5` (env `S5_ROUNDS`, `S5_SECS`;
//! `S5_EVLOOP=0` puts the userspace TCP path on tokio instead of its epoll loops).
//! Bounded: rounds × subjects × (2 wrk runs + iperf3 + a 400-request probe), about 2 minutes.
//!
//! Code map: this file sets the lab up and runs the rounds; [`procs`] starts peers and counts
//! CPU, [`load`] drives wrk, iperf3, the latency probe and the UDP loop, [`report`] prints the
//! rounds, medians, goals and ceilings, [`maglev`] is S9.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Instant;

use svcnet_netns::test_support::Lab;
use svcnet_nft::{FullMode, NftExecutor, Renderer};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};
use svcnet_userspace::{Config, Mode, UserspaceProxy};

mod load;
mod maglev;
mod procs;
mod report;

use load::{iperf, probe, udp_loop, wrk};
use procs::{children, cpu_during, cpus, spawn, wait_listening, write};
use report::Sample;

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
    // The backend closes first (`Connection: close`), so it holds a TIME_WAIT socket per
    // connection. The subjects reach it from the same client address with different ISN and
    // timestamp spaces (the client's destination differs: backend, proxy, service IP), so a
    // port reused by the next subject lands on another subject's TIME_WAIT socket, is refused
    // and waits for a retransmit: measured, DNAT alone 32k connections in 4 s, right after a
    // direct run 746. Keeping no TIME_WAIT sockets at the backend treats every subject alike.
    lab.pod(1)
        .ns
        .exec(&["sysctl", "-qw", "net.ipv4.tcp_max_tw_buckets=0"])
        .unwrap();

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
    let _udp_server = svcnet_netns::test_support::serve_udp(&lab.pod(1).ns, 5353, "u").unwrap();
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
             server {{ listen 9202; proxy_pass {backend}:5201; }}\n\
             server {{ listen 9053 udp; proxy_pass {backend}:5353; proxy_responses 1; }} }}\n"
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
                    .port("bulk", "TCP", 5201)
                    .port("dns", "UDP", 53);
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
                slice("default", "bench-dns", "bench", |s| {
                    s.port("dns", "UDP", 5353)
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
    cfg.splice = env("S5_SPLICE", 1) != 0;
    cfg.reuseport = env("S5_REUSEPORT", 0) != 0;
    cfg.event_loop = env("S5_EVLOOP", 1) != 0;
    if let Some(w) = std::env::var("S5_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.workers = w;
    }
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
    // The kernel path's floor: one static DNAT rule per port in a table of its own, the least
    // any NAT-based dataplane does for a connection (svcnet's rules ride on top of it).
    let floor: IpAddr = "10.96.0.99".parse().unwrap();
    lab.node
        .exec(&[
            "nft",
            &format!(
                "add table ip s5-dnat-floor {{ chain pre {{ type nat hook prerouting priority -100; \
                 ip daddr {floor} tcp dport 80 dnat to {backend}:8080; \
                 ip daddr {floor} tcp dport 5201 dnat to {backend}:5201; \
                 ip daddr {floor} udp dport 53 dnat to {backend}:5353; }}; }}"
            ),
        ])
        .unwrap();

    let me = std::process::id();
    let nginx_pids = {
        let mut v = vec![_nginx.0.id()];
        v.extend(children(_nginx.0.id()));
        v
    };
    let user: IpAddr = "172.30.0.10".parse().unwrap();
    let kernel: IpAddr = "10.96.0.30".parse().unwrap();
    // name, address, HTTP port, bulk port, UDP port (HAProxy has no UDP proxying), the
    // proxy's own processes (none for the kernel paths).
    type Subject = (&'static str, IpAddr, u16, u16, Option<u16>, Vec<u32>);
    let subjects: Vec<Subject> = vec![
        ("direct", backend, 8080, 5201, Some(5353), vec![]),
        ("svcnet-userspace", user, 80, 5201, Some(53), vec![me]),
        (
            "haproxy-tcp",
            gateway,
            9001,
            9201,
            None,
            vec![_haproxy.0.id()],
        ),
        ("nginx-stream", gateway, 9002, 9202, Some(9053), nginx_pids),
        ("svcnet-nftables", kernel, 80, 5201, Some(53), vec![]),
        ("dnat-floor", floor, 80, 5201, Some(53), vec![]),
    ];
    // Filters for quicker A/B runs: S5_SUBJECTS=svcnet-userspace,haproxy-tcp (direct always
    // runs: every ratio needs it), S5_METRICS=ka,nc,lat,bulk,udp.
    let list = |k: &str| {
        std::env::var(k)
            .ok()
            .map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>())
    };
    let (only_subjects, only_metrics) = (list("S5_SUBJECTS"), list("S5_METRICS"));
    let subjects: Vec<Subject> = subjects
        .into_iter()
        .filter(|s| {
            s.0 == "direct"
                || only_subjects
                    .as_ref()
                    .is_none_or(|o| o.iter().any(|n| n == s.0))
        })
        .collect();
    let run = |m: &str| {
        only_metrics
            .as_ref()
            .is_none_or(|o| o.iter().any(|n| n == m))
    };
    for (_, ip, port, ..) in &subjects {
        wait_listening(&lab.pod(0).ns, SocketAddr::new(*ip, *port));
    }
    // Every measurement starts with an empty connection-tracking table in the node namespace,
    // whose hooks see every subject's packets: TIME_WAIT entries (120 s) left by the subject
    // before, from the same client ports, otherwise slow the next one's new connections
    // (measured: the kernel path 0.79× direct with them, 0.91× without; direct itself lost 25 %
    // after the first round).
    let fresh = || {
        let _ = lab.node.exec(&["conntrack", "-F"]);
    };
    let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
    let started = Instant::now();
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut loads = vec![load()];
    for round in 0..rounds {
        // Rotate the order each round so no subject always runs first (or after a given one).
        let mut order: Vec<&Subject> = subjects.iter().collect();
        order.rotate_left(round % subjects.len());
        let mut cur: BTreeMap<&str, Sample> = BTreeMap::new();
        // One metric for every subject, then the next: subjects of a metric run seconds apart.
        for (name, ip, port, _, _, pids) in order.iter().filter(|_| run("ka")) {
            fresh();
            let url = format!("http://{}/", SocketAddr::new(*ip, *port));
            let (rps, [cpu, user, busy]) = cpu_during(pids, || wrk(&client, &url, 32, secs, false));
            let per = |s: f64| s * 1e6 / (rps * secs as f64);
            let c = cur.entry(name).or_default();
            c.ka_rps = rps;
            c.machine_us_per_req = Some(per(busy));
            c.machine_busy_ka = Some(busy / (secs as f64 * cpus()));
            c.user_us_per_req = (!pids.is_empty()).then(|| per(user));
            c.cpu_us_per_req = (!pids.is_empty()).then(|| per(cpu));
        }
        for (name, ip, port, _, _, pids) in order.iter().filter(|_| run("nc")) {
            fresh();
            let url = format!("http://{}/", SocketAddr::new(*ip, *port));
            let (rps, [cpu, user, busy]) = cpu_during(pids, || wrk(&client, &url, 8, secs, true));
            let per = |s: f64| s * 1e6 / (rps * secs as f64);
            let c = cur.entry(name).or_default();
            c.nc_rps = rps;
            c.machine_us_per_conn = Some(per(busy));
            c.user_us_per_conn = (!pids.is_empty()).then(|| per(user));
            c.cpu_us_per_conn = (!pids.is_empty()).then(|| per(cpu));
        }
        for (name, ip, port, ..) in order.iter().filter(|_| run("lat")) {
            fresh();
            let (p50, p99) = probe(&lab.pod(0).ns, SocketAddr::new(*ip, *port), 400);
            let c = cur.entry(name).or_default();
            (c.p50_us, c.p99_us) = (p50, p99);
        }
        if have_iperf && run("bulk") {
            for (name, ip, _, bulk, _, pids) in &order {
                fresh();
                let (g, [cpu, _, busy]) = cpu_during(pids, || iperf(&client, *ip, *bulk, secs));
                let c = cur.entry(name).or_default();
                c.gbps = g;
                if let Some(g) = g {
                    let gb = g * secs as f64 / 8.0;
                    c.cpu_s_per_gb = (!pids.is_empty()).then_some(cpu / gb);
                    c.machine_cpu_s_per_gb = Some(busy / gb);
                }
            }
        }
        for (name, ip, _, _, udp, _) in order.iter().filter(|_| run("udp")) {
            fresh();
            if let Some(u) = udp {
                let (rps, p50, p99) = udp_loop(&lab.pod(0).ns, SocketAddr::new(*ip, *u), 4, secs);
                let c = cur.entry(name).or_default();
                (c.udp_rps, c.udp_p50_us, c.udp_p99_us) = (Some(rps), Some(p50), Some(p99));
            }
        }
        loads.push(load());
        for (name, ..) in &subjects {
            let c = cur.remove(name).unwrap_or_default();
            c.print_round(round, name);
            samples.entry(name).or_default().push(c);
        }
    }
    println!(
        "S5 rounds={rounds} secs={secs} splice={} backend=nginx(1 worker) wrk -t1 (keep-alive -c32, new-conn -c8) probe=400 sequential connect+GET iperf3 1 stream udp=4 clients request/response; medians; took {:.0}s; loadavg per round: {}",
        env("S5_SPLICE", 1) != 0,
        started.elapsed().as_secs_f64(),
        loads
            .iter()
            .map(|l| l.split_whitespace().next().unwrap_or("?"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let names: Vec<&str> = subjects.iter().map(|s| s.0).collect();
    report::goals(&samples, rounds, &names);
    let m = proxy.metrics();
    println!(
        "S5 svcnet-userspace counters: total={} connect_failures={} bytes_in={} bytes_out={}",
        m.iter().map(|s| s.total).sum::<u64>(),
        m.iter().map(|s| s.connect_failures).sum::<u64>(),
        m.iter().map(|s| s.bytes_in).sum::<u64>(),
        m.iter().map(|s| s.bytes_out).sum::<u64>()
    );
    // Connection tracking in the node namespace, summed over CPUs: insert failures and drops
    // there cost retransmits (1 s each) to every subject routed through it.
    if let Ok(stats) = lab.node.exec(&["conntrack", "-S"]) {
        let mut sums: BTreeMap<String, u64> = BTreeMap::new();
        for field in stats.split_whitespace() {
            if let Some((k, v)) = field.split_once('=')
                && let Ok(v) = v.parse::<u64>()
                && k != "cpu"
            {
                *sums.entry(k.to_string()).or_default() += v;
            }
        }
        let line: Vec<String> = sums.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("S5 node conntrack: {}", line.join(" "));
    }
    rt.block_on(proxy.shutdown()).unwrap();
    let _ = nft.delete_table(svcnet_nft::Family::Ip, renderer.table());
    drop(proxy);
    drop(rt);

    maglev::maglev();
}
