//! S12 (control path): 1k policies over 10k fake pods (100 namespaces, 10 nodes), the time
//! from a change to the rules being live on one node, four kinds in turn (a pod's label, a
//! policy's port, a policy created, that policy deleted), each delivered as the node's watch
//! does (one object) to the incremental renderer: render (the objects it touches), plan (those
//! objects' difference → transaction) and apply (one transaction: a netlink batch for a change
//! that deletes, libnftables' text otherwise), p50/p99
//! nearest-rank, inside a fresh network namespace (removed afterwards). Ends by checking the
//! incremental table against a full render.
//!
//! Usage (root): `cargo run [--release] -p svcnet-netpol-nft --example s12 -- [CHANGES]`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use svcnet_libnft::{NftExecutor, Transport};
use svcnet_netns::{NetNs, unique_name};
use svcnet_netpol::{
    Cluster, NamedPort, Namespace, Peer, Pod, Policy, Port, PortMatch, Protocol, Rule, Selector,
};
use svcnet_netpol_nft::{Enforcer, Options, Renderer};

const NAMESPACES: usize = 100;
const PODS_PER_NS: usize = 100;
const POLICIES_PER_NS: usize = 10;
const NODES: usize = 10;
const NODE: &str = "node-0";

fn labels(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn cluster() -> Cluster {
    let mut c = Cluster::default();
    for n in 0..NAMESPACES {
        let name = format!("ns-{n}");
        c.namespaces.push(Namespace {
            labels: labels(&[
                ("kubernetes.io/metadata.name", name.clone()),
                ("team", format!("team-{}", n % 10)),
            ]),
            name,
        });
        for p in 0..PODS_PER_NS {
            let i = n * PODS_PER_NS + p;
            c.pods.push(Pod {
                namespace: format!("ns-{n}"),
                name: format!("pod-{p}"),
                labels: labels(&[("app", format!("app-{}", p % 10))]),
                ips: vec![IpAddr::V4(Ipv4Addr::new(
                    10,
                    100 + (i / 65536) as u8,
                    (i / 256 % 256) as u8,
                    (i % 256) as u8,
                ))],
                ports: vec![NamedPort {
                    name: "http".into(),
                    port: 8080,
                    protocol: Protocol::Tcp,
                }],
                node: Some(format!("node-{}", i % NODES)),
            });
        }
        for k in 0..POLICIES_PER_NS {
            c.policies.push(Policy {
                namespace: format!("ns-{n}"),
                name: format!("allow-{k}"),
                pod_selector: Selector::labels([("app", format!("app-{k}").as_str())]),
                isolates_ingress: true,
                isolates_egress: false,
                ingress: vec![Rule {
                    peers: vec![Peer::Pods {
                        pods: Some(Selector::labels([(
                            "app",
                            format!("app-{}", (k + 1) % 10).as_str(),
                        )])),
                        namespaces: Some(Selector::labels([(
                            "team",
                            format!("team-{}", n % 10).as_str(),
                        )])),
                    }],
                    ports: vec![
                        Port {
                            protocol: Protocol::Tcp,
                            port: PortMatch::Range(80, 80),
                        },
                        Port {
                            protocol: Protocol::Tcp,
                            port: PortMatch::Named("http".into()),
                        },
                    ],
                }],
                egress: vec![],
            });
        }
    }
    c
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

const KINDS: [&str; 4] = [
    "pod label",
    "policy port",
    "policy created",
    "policy deleted",
];

fn main() {
    let changes: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    let ns = NetNs::create(&unique_name("s12")).expect("create a network namespace (root)");
    let mut enforcer = Enforcer::new(NftExecutor::new(Some(ns.name().to_string())));
    let mut c = cluster();
    let opts = Options::default();
    let mut renderer = Renderer::new(NODE, opts.clone());
    let t = Instant::now();
    renderer.update(&c);
    let render_full = t.elapsed();
    let changed = renderer.take_changes();
    let r = renderer.ruleset();
    let (sets, chains) = (r.sets.len(), r.chains.len());
    let report = enforcer.sync_changes(r, &changed).unwrap();
    println!(
        "S12: {} policies, {} pods ({} on {NODE}), {sets} sets, {chains} chains; full sync: render {render_full:?}, apply {:?} ({} ops)",
        c.policies.len(),
        c.pods.len(),
        c.pods.len() / NODES,
        report.took,
        report.ops
    );
    let (mut total, mut rendering, mut applying) = (Vec::new(), Vec::new(), Vec::new());
    let mut ops = Vec::new();
    let mut by_kind: Vec<Vec<Duration>> = vec![Vec::new(); KINDS.len()];
    // Changes per kind that went as one netlink batch (the others through libnftables).
    let mut netlink = vec![0usize; KINDS.len()];
    let local = c.pods.len() / NODES;
    for i in 0..changes {
        let kind = i % KINDS.len();
        // The change as the node's watch delivers it: one object, new or gone.
        let t = Instant::now();
        match kind {
            0 => {
                // A local pod's label moves it under another policy and into other peer sets.
                let pod = &mut c.pods[(i * 37 % local) * NODES];
                let app = format!("app-{}", (i / KINDS.len()) % 10);
                pod.labels.insert("app".into(), app);
                renderer.set_pod(pod.clone());
            }
            1 => {
                // A policy's port changes: its own chain is rewritten.
                let n = i * 13 % c.policies.len();
                c.policies[n].ingress[0].ports[0].port = PortMatch::Range(80, 80 + (i % 7) as u16);
                renderer.set_policy(c.policies[n].clone());
            }
            2 => {
                // A new policy in a namespace, with a selector no other policy uses.
                let n = i * 7 % NAMESPACES;
                let mut p = c.policies[n * POLICIES_PER_NS].clone();
                p.name = format!("new-{i}");
                p.pod_selector = Selector::labels([("app", format!("app-{}", i % 10).as_str())]);
                p.pod_selector
                    .labels
                    .insert("tier".into(), format!("tier-{i}"));
                renderer.set_policy(p);
            }
            _ => {
                // The policy created by the previous change is deleted.
                let n = (i - 1) * 7 % NAMESPACES;
                renderer.remove_policy(&format!("ns-{n}"), &format!("new-{}", i - 1));
            }
        }
        let changed = renderer.take_changes();
        let rendered = t.elapsed();
        let report = enforcer.sync_changes(renderer.ruleset(), &changed).unwrap();
        ops.push(report.ops);
        if report.transport == Transport::Netlink {
            netlink[kind] += 1;
        }
        let done = t.elapsed();
        total.push(done);
        rendering.push(rendered);
        applying.push(done - rendered);
        by_kind[kind].push(done);
    }
    ops.sort_unstable();
    println!(
        "{changes} changes ({}, in turn): change→live p50 {:?} p99 {:?}; render p50 {:?} p99 {:?}; plan+apply p50 {:?} p99 {:?}; ops per change p50 {} max {}",
        KINDS.join(" / "),
        pct(total.clone(), 50.0),
        pct(total, 99.0),
        pct(rendering.clone(), 50.0),
        pct(rendering, 99.0),
        pct(applying.clone(), 50.0),
        pct(applying, 99.0),
        ops[ops.len() / 2],
        ops[ops.len() - 1],
    );
    let kinds: Vec<String> = KINDS
        .iter()
        .zip(by_kind)
        .zip(netlink)
        .filter(|((_, v), _)| !v.is_empty())
        .map(|((k, v), n)| {
            format!(
                "{k} p50 {:?} p99 {:?} ({n}/{} as a netlink batch)",
                pct(v.clone(), 50.0),
                pct(v.clone(), 99.0),
                v.len()
            )
        })
        .collect();
    println!("change→live by kind: {}", kinds.join("; "));
    // The incremental table is the full one (every created policy was deleted again).
    assert_eq!(
        renderer.ruleset(),
        &svcnet_netpol_nft::render(&c, NODE, &opts)
    );
}
