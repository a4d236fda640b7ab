//! S12 (data path): new connections/s and requests/s between two pods on one node with 100
//! policies in force against no policy, interleaved rounds in the same run, inside fresh
//! network namespaces (a node routing two pods; removed afterwards). The destination pod is
//! selected by one policy that allows the client, and 99 more policies (each with its own
//! selector sets and chain) select other, fake pods. Three arms, rotated each round: the
//! policies with the proxy's NAT table, the proxy's table alone (what a node without policies
//! has: the goal's "no policy"), and a bare namespace (no connection tracking at all).
//!
//! Usage (root): `cargo run [--release] -p svcnet-netpol-nft --example s12_data -- [SECONDS]
//! [ROUNDS]`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use svcnet_libnft::NftExecutor;
use svcnet_netns::test_support::{Lab, Session, tcp_ask};
use svcnet_netpol::{
    Cluster, Namespace, Peer, Pod, Policy, Port, PortMatch, Protocol, Rule, Selector,
};
use svcnet_netpol_nft::{Enforcer, Options, render};

const NODE: &str = "node";

fn pod(ns: &str, name: &str, app: &str, ip: Ipv4Addr) -> Pod {
    Pod {
        namespace: ns.into(),
        name: name.into(),
        labels: BTreeMap::from([("app".to_string(), app.to_string())]),
        ips: vec![IpAddr::V4(ip)],
        ports: vec![],
        node: Some(NODE.into()),
    }
}

fn cluster(client: Ipv4Addr, server: Ipv4Addr) -> Cluster {
    let mut c = Cluster {
        namespaces: vec![Namespace {
            name: "bench".into(),
            labels: BTreeMap::new(),
        }],
        ..Cluster::default()
    };
    c.pods.push(pod("bench", "client", "client", client));
    c.pods.push(pod("bench", "server", "server", server));
    for i in 0..99u32 {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 99, 0, 0)) + i);
        c.pods
            .push(pod("bench", &format!("fake-{i}"), &format!("app-{i}"), ip));
    }
    for i in 0..100u32 {
        let (target, peer) = if i == 0 {
            ("server".to_string(), "client".to_string())
        } else {
            (format!("app-{}", i - 1), format!("app-{}", i % 99))
        };
        c.policies.push(Policy {
            namespace: "bench".into(),
            name: format!("p{i}"),
            pod_selector: Selector::labels([("app", target.as_str())]),
            isolates_ingress: true,
            isolates_egress: i % 2 == 1,
            ingress: vec![Rule {
                peers: vec![Peer::Pods {
                    pods: Some(Selector::labels([("app", peer.as_str())])),
                    namespaces: None,
                }],
                ports: vec![Port {
                    protocol: Protocol::Tcp,
                    port: PortMatch::Range(8000, 8100),
                }],
            }],
            egress: vec![Rule::default()],
        });
    }
    c
}

/// (new connections/s, requests/s) for `secs` from the client pod.
fn measure(lab: &Lab, to: SocketAddr, secs: f64) -> (f64, f64) {
    lab.pod(0)
        .ns
        .run(move || {
            let t = Instant::now();
            let mut conns = 0u64;
            while t.elapsed().as_secs_f64() < secs {
                tcp_ask(to, Duration::from_secs(2)).expect("a connection the policy allows");
                conns += 1;
            }
            let cps = conns as f64 / t.elapsed().as_secs_f64();
            let mut s = Session::connect(to, Duration::from_secs(2)).unwrap();
            let t = Instant::now();
            let mut reqs = 0u64;
            while t.elapsed().as_secs_f64() < secs {
                s.ask().unwrap();
                reqs += 1;
            }
            (cps, reqs as f64 / t.elapsed().as_secs_f64())
        })
        .unwrap()
}

/// What the node has besides the pods' routes in one arm of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    /// The policy table with 100 policies (and the proxy's table).
    Policies,
    /// The proxy's table only: a DNAT rule for a Service IP no probe uses, as every svcnet
    /// node has one (it turns connection tracking on in the namespace, as any proxy's NAT does).
    Proxy,
    /// Nothing at all (no connection tracking either).
    Bare,
}

const PROXY_TABLE: &str = "add table ip s12-proxy
add chain ip s12-proxy pre { type nat hook prerouting priority -100 ; }
add rule ip s12-proxy pre ip daddr 10.96.0.1 tcp dport 80 dnat to 10.98.0.1:8080
";

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let mut lab = Lab::new().expect("network namespaces (root)");
    lab.add_pod().unwrap();
    lab.add_pod().unwrap();
    lab.serve_tcp(1, 8080, "server").unwrap();
    // The client reuses its ports in TIME_WAIT for new connections: otherwise, after a few
    // thousand connections to one server, each connect() scans a port range full of
    // TIME_WAIT sockets (kernel time, milliseconds per connection: what the earlier figures
    // measured once the first round had filled it).
    lab.pod(0)
        .ns
        .exec(&["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])
        .unwrap();
    let (client, server) = (lab.pod(0).ipv4, lab.pod(1).ipv4);
    let to = SocketAddr::new(IpAddr::V4(server), 8080);
    let c = cluster(client, server);
    let exec = NftExecutor::new(Some(lab.node.name().to_string()));
    let proxy = NftExecutor::new(Some(lab.node.name().to_string()));
    let mut enforcer = Enforcer::new(exec);
    let arms = [Arm::Policies, Arm::Proxy, Arm::Bare];
    let mut results: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for round in 0..rounds {
        for k in 0..arms.len() {
            let arm = arms[(round + k) % arms.len()];
            let _ = proxy.command("delete table ip s12-proxy\n");
            if arm == Arm::Bare {
                enforcer.cleanup().unwrap();
            } else {
                proxy.command(PROXY_TABLE).unwrap();
                if arm == Arm::Policies {
                    enforcer
                        .sync(render(&c, NODE, &Options::default()))
                        .unwrap();
                } else {
                    enforcer.cleanup().unwrap();
                }
            }
            let name = match arm {
                Arm::Policies => "100 policies",
                Arm::Proxy => "proxy only",
                Arm::Bare => "bare",
            };
            results
                .entry(name)
                .or_default()
                .push(measure(&lab, to, secs));
        }
    }
    let _ = proxy.command("delete table ip s12-proxy\n");
    enforcer.cleanup().unwrap();
    let median = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        let n = x.len();
        if n % 2 == 1 {
            x[n / 2]
        } else {
            (x[n / 2 - 1] + x[n / 2]) / 2.0
        }
    };
    for (name, v) in &results {
        println!("rounds, {name} (conn/s, req/s): {v:.0?}");
    }
    let m = |name: &str| {
        let v = &results[name];
        (median(v, |x| x.0), median(v, |x| x.1))
    };
    let (cw, rw) = m("100 policies");
    for base in ["proxy only", "bare"] {
        let (cn, rn) = m(base);
        println!(
            "S12 data path, {rounds} rounds of {secs} s, medians: new connections/s {cw:.0} with 100 policies vs {cn:.0} {base} ({:.2}x); requests/s {rw:.0} vs {rn:.0} ({:.2}x)",
            cw / cn,
            rw / rn
        );
    }
}
