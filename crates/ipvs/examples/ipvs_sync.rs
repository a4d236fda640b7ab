//! Sync cost of IPVS programming, netlink against `ipvsadm-restore`, in relative terms (run it
//! inside user-mode Linux, whose clock and CPU are not for absolute figures; this host's
//! kernel has no IPVS):
//!
//! ```sh
//! CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/scripts/uml/cargo-runner \
//!   cargo run -p svcnet-ipvs --example ipvs_sync -- 1000 10000
//! ```
//!
//! For each size N, in a fresh network namespace: a full sync of N virtual servers with two
//! real servers each (3N operations) through svcnet's generic-netlink client (batched on one
//! socket) and through `ipvsadm-restore` of the same operations (their `Display` is its
//! input), each from an empty table; then the latency of a one-service change (a real server
//! added) through each (one netlink request; one `ipvsadm` process). Prints the times and
//! the ratios ipvsadm / netlink.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use svcnet_ipvs::{Dest, Ipvs, IpvsSocket, Op, Protocol, Service, ServiceKey};
use svcnet_netns::NetNs;

fn ops(n: u32) -> Vec<Op> {
    let mut ops = Vec::with_capacity(3 * n as usize);
    for i in 0..n {
        let addr = std::net::Ipv4Addr::new(10, 96 + (i >> 16) as u8, (i >> 8) as u8, i as u8);
        let k = ServiceKey::new(Protocol::Tcp, addr.into(), 80);
        ops.push(Op::AddService(Service::new(k, "rr")));
        for pod in 1..=2u8 {
            let ep = std::net::Ipv4Addr::new(10, 244, pod, 2);
            ops.push(Op::AddDest(k, Dest::masq(ep.into(), 8080, 1)));
        }
    }
    ops
}

fn ipvsadm_restore(ns: &NetNs, text: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut child = svcnet_netns::command(Some(ns.name()), "ipvsadm-restore")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("ipvsadm-restore: {e} (apt-get install ipvsadm)"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(t.elapsed())
}

fn run() -> Result<(), String> {
    let sizes: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| a.parse().map_err(|_| format!("not a size: {a}")))
        .collect::<Result<_, _>>()?;
    let sizes = if sizes.is_empty() { vec![1000] } else { sizes };
    if std::env::var_os("UML_GUEST").is_none() {
        eprintln!("note: not inside user-mode Linux; figures are for this kernel");
    }
    println!(
        "| services | netlink full sync | ipvsadm-restore | ratio | netlink 1 change | ipvsadm 1 change | ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for n in sizes {
        let ns = NetNs::create(&svcnet_netns::unique_name("ipbench")).map_err(|e| e.to_string())?;
        let all = ops(n);
        let text: String = all.iter().map(|o| format!("{o}\n")).collect();
        let (netlink, one_netlink) = ns
            .run(|| -> Result<(Duration, Duration), String> {
                let mut s = IpvsSocket::open().map_err(|e| e.to_string())?;
                let t = Instant::now();
                s.apply(&all).map_err(|e| e.to_string())?;
                let full = t.elapsed();
                let k = ServiceKey::new(
                    Protocol::Tcp,
                    std::net::Ipv4Addr::new(10, 96, 0, 0).into(),
                    80,
                );
                let d = Dest::masq(std::net::Ipv4Addr::new(10, 244, 3, 2).into(), 8080, 1);
                let t = Instant::now();
                s.apply(&[Op::AddDest(k, d)]).map_err(|e| e.to_string())?;
                let one = t.elapsed();
                s.apply(&[Op::Flush]).map_err(|e| e.to_string())?;
                Ok((full, one))
            })
            .map_err(|e| e.to_string())??;
        let restore = ipvsadm_restore(&ns, &text)?;
        let one = Op::AddDest(
            ServiceKey::new(
                Protocol::Tcp,
                std::net::Ipv4Addr::new(10, 96, 0, 0).into(),
                80,
            ),
            Dest::masq(std::net::Ipv4Addr::new(10, 244, 3, 2).into(), 8080, 1),
        );
        let one_line = one.to_string();
        let args: Vec<&str> = one_line.split_whitespace().collect();
        let t = Instant::now();
        let st = svcnet_netns::command(Some(ns.name()), "ipvsadm")
            .args(&args)
            .status()
            .map_err(|e| e.to_string())?;
        let one_ipvsadm = t.elapsed();
        if !st.success() {
            return Err(format!("ipvsadm {one_line} failed"));
        }
        println!(
            "| {n} | {:.0} ms | {:.0} ms | {:.1}× | {:.2} ms | {:.1} ms | {:.0}× |",
            netlink.as_secs_f64() * 1e3,
            restore.as_secs_f64() * 1e3,
            restore.as_secs_f64() / netlink.as_secs_f64(),
            one_netlink.as_secs_f64() * 1e3,
            one_ipvsadm.as_secs_f64() * 1e3,
            one_ipvsadm.as_secs_f64() / one_netlink.as_secs_f64(),
        );
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}
