//! End to end (needs root): `svcnet up --node-local-dns`. A pod keeps the cluster DNS service IP
//! as its nameserver; its queries reach the node's cache (no DNAT: `notrack`), the cache's
//! metrics show the second identical query was not forwarded, a deleted Service is NXDOMAIN
//! within the configured cap, and `kill -9` of the cache falls back to cluster DNS through the
//! proxy until the cache is restarted. With the iptables proxy the cache also prefetches
//! (`--node-local-dns-prefetch`): a name asked for every 300 ms is never a miss past its 3 s cap.
//! Ranges and prefix are this test's own.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Net, example, free_udp_port, is_root, wait_for};

const NODE_LOCAL: &str = "169.254.20.10";

/// The cache's Prometheus text, from inside the node.
fn metrics(node: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", node, "curl", "-s", "-m", "2"])
        .arg(format!("http://{NODE_LOCAL}:9253/metrics"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of the first series starting with `series` (`name{labels` as printed).
fn metric(node: &str, series: &str) -> Option<u64> {
    metrics(node)
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// [`metric`], which must be there.
fn metric_present(node: &str, series: &str) -> u64 {
    metric(node, series).unwrap_or_else(|| panic!("no {series} in {}", metrics(node)))
}

fn has_table(node: &str) -> bool {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            node,
            "nft",
            "list",
            "table",
            "ip",
            "svcnet-nodelocal",
        ])
        .output()
        .unwrap()
        .status
        .success()
}

fn lo_addrs(node: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", node, "-4", "addr", "show", "dev", "lo"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pods_resolve_through_the_node_local_cache_and_fall_back_when_it_dies() {
    check(
        &Net {
            prefix: "e2elcn",
            underlay: "172.29.23.0/24",
            pods: "10.171.0.0/16",
            services: "10.170.0.0/16",
            lb: "10.172.0.0/24",
        },
        "nftables",
        &[],
    );
}

/// The same with the iptables proxy: its DNAT is skipped by the same `notrack` table. Here the
/// cache prefetches names asked for three times in a row once half their TTL is left.
#[test]
fn node_local_cache_with_the_iptables_proxy() {
    check(
        &Net {
            prefix: "e2elci",
            underlay: "172.29.24.0/24",
            pods: "10.174.0.0/16",
            services: "10.173.0.0/16",
            lb: "10.175.0.0/24",
        },
        "iptables",
        &[
            "--node-local-dns-prefetch",
            "3",
            "--node-local-dns-prefetch-percentage",
            "50",
        ],
    );
}

fn check(net: &Net, mode: &str, prefetch: &[&str]) {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let dns = free_udp_port();
    let mut flags = vec![
        "--node-local-dns",
        "--node-local-dns-success-ttl",
        "3",
        "--proxy-mode",
        mode,
    ];
    flags.extend_from_slice(prefetch);
    let mut up = net.up_with("1", dns, &flags);
    // The service CIDR's stem: the DNS service IP is its .0.10, the host bridge the
    // underlay's .1.
    let stem = |cidr: &str| cidr.rsplitn(3, '.').last().unwrap().to_string();
    let service_ip = format!("{}.0.10", stem(net.services));
    let host_ip = format!("{}.1", net.underlay.rsplit_once('.').unwrap().0);
    let node = wait_for("the node", || {
        // kubectl fails the jsonpath while the list is empty: not yet.
        let out = up.kubectl(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
        let out = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!out.is_empty()).then_some(out)
    });
    // The cache owns both addresses and its rules once it listens.
    wait_for("the cache's metrics and rules", || {
        (metric(&node, "coredns_dns_requests_total{proto=\"udp\"}").is_some() && has_table(&node))
            .then_some(String::new())
    });
    let addrs = lo_addrs(&node);
    assert!(
        addrs.contains("169.254.20.10/32") && addrs.contains(&format!("{service_ip}/32")),
        "{addrs}"
    );

    up.ok(&["apply", "-f", &example("myapp.yaml")]);
    let cluster_ip = up.ok(&["get", "svc", "myapp", "-o", "jsonpath={.spec.clusterIP}"]);
    let pod = wait_for("a running myapp pod", || {
        // kubectl fails the jsonpath while the list is empty: not yet.
        let out = up.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=myapp",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ]);
        let out = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!out.is_empty()).then_some(out)
    });
    let exec = |cmd: &str| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_svcnet"))
            .args(["exec", "--data-dir"])
            .arg(up.data_dir.path())
            .args([pod.as_str(), "--", "sh", "-c", cmd])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // Pods keep the service IP as their nameserver: no resolv.conf change.
    assert!(
        exec("cat /etc/resolv.conf").contains(&format!("nameserver {service_ip}")),
        "{}",
        exec("cat /etc/resolv.conf")
    );
    let dig = |name: &str| exec(&format!("dig +short +time=2 +tries=1 {name}"));

    // First question: the cache forwards it to cluster DNS (over TCP); the second identical
    // one is a cache hit and is not forwarded.
    let forwarded = || {
        let series = format!(
            "coredns_forward_requests_total{{zone=\"cluster.local.\",to=\"{host_ip}:53 (tcp)\"}}"
        );
        metric_present(&node, &series)
    };
    let hits = || {
        metric_present(
            &node,
            "coredns_cache_hits_total{zone=\"cluster.local.\",type=\"success\"}",
        )
    };
    assert_eq!(dig("myapp.default.svc.cluster.local"), cluster_ip);
    let (f1, h1) = (forwarded(), hits());
    assert!(f1 >= 1, "the first question was forwarded");
    assert_eq!(dig("myapp.default.svc.cluster.local"), cluster_ip);
    assert_eq!(
        forwarded(),
        f1,
        "the second question did not reach cluster DNS"
    );
    assert_eq!(hits(), h1 + 1);

    if !prefetch.is_empty() {
        // Asked for every 300 ms for longer than the 3 s cap: prefetched (each time 1.5 s or
        // less is left), never a miss.
        let misses =
            || metric_present(&node, "coredns_cache_misses_total{zone=\"cluster.local.\"}");
        let prefetches = || {
            metric(
                &node,
                "coredns_cache_prefetch_total{zone=\"cluster.local.\"}",
            )
            .unwrap_or(0)
        };
        let m0 = misses();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            assert_eq!(dig("myapp.default.svc.cluster.local"), cluster_ip);
            std::thread::sleep(Duration::from_millis(300));
        }
        assert!(prefetches() >= 1, "no prefetch in {}", metrics(&node));
        assert_eq!(misses(), m0, "a miss while prefetching: {}", metrics(&node));
    }

    // A Service change is seen within the 3 s cap (cluster DNS says TTL 30).
    up.ok(&["create", "service", "clusterip", "nlprobe", "--tcp=80"]);
    let probe_ip = up.ok(&["get", "svc", "nlprobe", "-o", "jsonpath={.spec.clusterIP}"]);
    wait_for("nlprobe resolves", || {
        (dig("nlprobe.default.svc.cluster.local") == probe_ip).then_some(String::new())
    });
    let ttl = exec("dig +noall +answer +time=2 +tries=1 nlprobe.default.svc.cluster.local");
    let ttl: u32 = ttl.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(ttl <= 3, "TTL capped: {ttl}");
    up.ok(&["delete", "svc", "nlprobe"]);
    let deleted = Instant::now();
    wait_for("nlprobe gone", || {
        dig("nlprobe.default.svc.cluster.local")
            .is_empty()
            .then_some(String::new())
    });
    assert!(
        deleted.elapsed() < Duration::from_secs(3 + 2),
        "seen after {:?}",
        deleted.elapsed()
    );

    // kill -9: the rules and the service IP come off the node, names resolve through the
    // proxy's DNAT to cluster DNS, and the cache is started again.
    let pid_file = up
        .data_dir
        .path()
        .join("node-local-dns")
        .join(format!("{node}.pid"));
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(
        Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_for("the rules off the node", || {
        (!has_table(&node)).then_some(String::new())
    });
    assert_eq!(
        dig("myapp.default.svc.cluster.local"),
        cluster_ip,
        "fallback through the proxy"
    );
    let restarted = wait_for("the cache restarted", || {
        let now = std::fs::read_to_string(&pid_file).ok()?.trim().to_string();
        (now != pid
            && has_table(&node)
            && metric(&node, "coredns_dns_requests_total{proto=\"udp\"}").is_some())
        .then_some(now)
    });
    assert_eq!(dig("myapp.default.svc.cluster.local"), cluster_ip);
    assert!(
        metric(&node, "coredns_dns_requests_total{proto=\"udp\"}").unwrap() >= 1,
        "the restarted cache serves again"
    );

    // Stopping svcnet up stops the cache and leaves nothing behind.
    net.stop(&mut up);
    assert!(
        !std::path::Path::new(&format!("/proc/{restarted}")).exists(),
        "the cache process {restarted} outlived svcnet up"
    );
    assert!(!pid_file.exists());
}

/// Deletes the namespace on drop, also when the test fails.
struct NsGuard(String);

impl Drop for NsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// `svcnet node-local-dns` alone: it owns its addresses and rules while it runs and gives
/// them back on SIGTERM, as upstream's node-cache does on exit.
#[test]
fn standalone_cache_gives_its_addresses_and_rules_back_on_sigterm() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let ns = format!("e2elcs{:x}", std::process::id());
    assert!(
        Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .unwrap()
            .success()
    );
    let _guard = NsGuard(ns.clone());
    Command::new("ip")
        .args(["-n", &ns, "link", "set", "lo", "up"])
        .status()
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .args(["node-local-dns", "--netns", &ns])
        .args(["--local-ip", "169.254.20.10,10.176.0.10"])
        // A closed port inside the namespace: nothing is asked in this test.
        .args(["--cluster-dns", "127.0.0.1:9"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = wait_for("the standalone cache", || {
        (has_table(&ns) && metric(&ns, "coredns_dns_requests_total").is_some())
            .then(|| lo_addrs(&ns))
    });
    assert!(started.contains("10.176.0.10/32"), "{started}");
    // The cluster DNS is down: the cache answers SERVFAIL (it listens on the service IP).
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns,
            "dig",
            "+time=2",
            "+tries=1",
            "@10.176.0.10",
        ])
        .arg("web.default.svc.cluster.local")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("status: SERVFAIL"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!has_table(&ns), "the notrack table is gone");
    let after = lo_addrs(&ns);
    assert!(
        !after.contains("169.254.20.10") && !after.contains("10.176.0.10"),
        "{after}"
    );
}
