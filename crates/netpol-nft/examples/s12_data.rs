//! S12 (data path): new connections/s and requests/s between two pods on one node with 100
//! policies in force against no policy table at all, interleaved rounds in the same run,
//! inside fresh network namespaces (a node routing two pods; removed afterwards). The
//! destination pod is selected by one policy that allows the client, and 99 more policies
//! (each with its own selector sets and chain) select other, fake pods.
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

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let mut lab = Lab::new().expect("network namespaces (root)");
    lab.add_pod().unwrap();
    lab.add_pod().unwrap();
    lab.serve_tcp(1, 8080, "server").unwrap();
    let (client, server) = (lab.pod(0).ipv4, lab.pod(1).ipv4);
    let to = SocketAddr::new(IpAddr::V4(server), 8080);
    let c = cluster(client, server);
    let exec = NftExecutor::new(Some(lab.node.name().to_string()));
    let mut enforcer = Enforcer::new(exec);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for policies in [round % 2 == 0, round % 2 == 1] {
            if policies {
                enforcer
                    .sync(render(&c, NODE, &Options::default()))
                    .unwrap();
                with.push(measure(&lab, to, secs));
            } else {
                enforcer.cleanup().unwrap();
                without.push(measure(&lab, to, secs));
            }
        }
    }
    let mean =
        |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let (cw, rw) = (mean(&with, |x| x.0), mean(&with, |x| x.1));
    let (cn, rn) = (mean(&without, |x| x.0), mean(&without, |x| x.1));
    println!("rounds with policies (conn/s, req/s): {with:.0?}\nrounds without: {without:.0?}");
    println!(
        "S12 data path, {rounds} interleaved rounds of {secs} s: new connections/s {cw:.0} with 100 policies vs {cn:.0} without ({:.2}x); requests/s {rw:.0} vs {rn:.0} ({:.2}x)",
        cw / cn,
        rw / rn
    );
}
