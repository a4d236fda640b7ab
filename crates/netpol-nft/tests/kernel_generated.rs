//! A generated truth table in the spirit of Cyclonus: seeded random policies (pod and
//! namespace selectors with every operator, ipBlocks with and without `except`, numbered,
//! ranged, protocol-only and named ports, both directions, stacked), and random pod labels
//! between rounds, applied incrementally to the kernel; after each round the whole matrix
//! (TCP and UDP 80/81, by pod IP and through a Service IP) must equal the evaluator's.
//!
//! A fixed seed and a few rounds by default; `SVCNET_NETPOL_ROUNDS=<n>` runs more and
//! `SVCNET_NETPOL_SEED=<n>` another seed. A disagreement prints the seed, the round, the
//! policies, the truth tables and the ruleset.
#![allow(clippy::unwrap_used)]

mod common;

use common::lab::{Lab, Via};
use common::{NAMESPACES, PODS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use svcnet_netpol::{IpBlock, Op, Peer, Policy, Port, PortMatch, Protocol, Rule, Selector};

const TIERS: [&str; 2] = ["web", "db"];

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

fn pod_selector(rng: &mut StdRng) -> Selector {
    let one = |v: &&str| vec![v.to_string()];
    match rng.random_range(0..6) {
        0 => Selector::everything(),
        1 => Selector::labels([("pod", *pick(rng, &PODS))]),
        2 => Selector::labels([("tier", *pick(rng, &TIERS))]),
        3 => Selector {
            exprs: vec![(
                "pod".into(),
                Op::In(vec!["a".into(), pick(rng, &PODS).to_string()]),
            )],
            ..Selector::default()
        },
        4 => Selector {
            exprs: vec![("pod".into(), Op::NotIn(one(pick(rng, &PODS))))],
            ..Selector::default()
        },
        _ => Selector {
            exprs: vec![(
                "tier".into(),
                if rng.random_bool(0.5) {
                    Op::Exists
                } else {
                    Op::DoesNotExist
                },
            )],
            ..Selector::default()
        },
    }
}

fn ns_selector(rng: &mut StdRng) -> Selector {
    match rng.random_range(0..3) {
        0 => Selector::everything(),
        1 => Selector::labels([("ns", *pick(rng, &NAMESPACES))]),
        _ => Selector {
            exprs: vec![(
                "kubernetes.io/metadata.name".into(),
                Op::NotIn(vec![pick(rng, &NAMESPACES).to_string()]),
            )],
            ..Selector::default()
        },
    }
}

fn peer(rng: &mut StdRng, lab: &Lab) -> Peer {
    match rng.random_range(0..5) {
        0 => Peer::Pods {
            pods: Some(pod_selector(rng)),
            namespaces: None,
        },
        1 => Peer::Pods {
            pods: None,
            namespaces: Some(ns_selector(rng)),
        },
        2 => Peer::Pods {
            pods: Some(pod_selector(rng)),
            namespaces: Some(ns_selector(rng)),
        },
        _ => {
            let ip = pick(rng, &lab.pods).ip;
            Peer::Block(if rng.random_bool(0.5) {
                IpBlock {
                    cidr: format!("{ip}/32").parse().unwrap(),
                    except: vec![],
                }
            } else {
                IpBlock {
                    cidr: format!("{}/16", lab.node.pod_cidr.network())
                        .parse()
                        .unwrap(),
                    except: vec![format!("{ip}/32").parse().unwrap()],
                }
            })
        }
    }
}

fn port(rng: &mut StdRng) -> Port {
    let protocol = *pick(rng, &[Protocol::Tcp, Protocol::Udp]);
    let port = match rng.random_range(0..5) {
        0 => PortMatch::Any,
        1 => PortMatch::Range(80, 80),
        2 => PortMatch::Range(81, 81),
        3 => PortMatch::Range(79, 80 + rng.random_range(0..2)),
        _ => PortMatch::Named(
            pick(
                rng,
                &["serve-80-tcp", "serve-81-udp", "serve-81-tcp", "nope"],
            )
            .to_string(),
        ),
    };
    Port { protocol, port }
}

fn rules(rng: &mut StdRng, lab: &Lab) -> Vec<Rule> {
    (0..rng.random_range(0..3))
        .map(|_| Rule {
            peers: (0..rng.random_range(0..3))
                .map(|_| peer(rng, lab))
                .collect(),
            ports: (0..rng.random_range(0..3)).map(|_| port(rng)).collect(),
        })
        .collect()
}

fn policy(rng: &mut StdRng, lab: &Lab, n: usize) -> Policy {
    let (isolates_ingress, isolates_egress) = match rng.random_range(0..3) {
        0 => (true, false),
        1 => (false, true),
        _ => (true, true),
    };
    Policy {
        namespace: pick(rng, &NAMESPACES).to_string(),
        name: format!("gen-{n}"),
        pod_selector: pod_selector(rng),
        isolates_ingress,
        isolates_egress,
        ingress: rules(rng, lab),
        egress: rules(rng, lab),
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn generated_policies_in_the_kernel_match_the_evaluator() {
    let seed = env("SVCNET_NETPOL_SEED", 16);
    let rounds = env("SVCNET_NETPOL_ROUNDS", 12);
    rounds_on(Lab::new(), seed, rounds);
}

fn rounds_on(mut lab: Lab, seed: u64, rounds: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    lab.sync();
    for round in 0..rounds {
        // Labels move first (set element changes), then the policies are replaced.
        for pod in &mut lab.model.pods {
            match rng.random_range(0..3) {
                0 => pod.labels.remove("tier"),
                _ => pod
                    .labels
                    .insert("tier".into(), pick(&mut rng, &TIERS).to_string()),
            };
        }
        let n = rng.random_range(1..5);
        let policies: Vec<Policy> = (0..n).map(|i| policy(&mut rng, &lab, i)).collect();
        lab.model.policies = policies;
        lab.sync();
        let name = format!("seed {seed} round {round}");
        lab.check(&name, Via::PodIp);
        lab.check(&name, Via::ServiceIp);
    }
}

/// The same on two nodes: each node's table judges its own pods' side, peers on the other
/// node are matched by address (host-gw routes, no SNAT between nodes).
#[test]
fn generated_policies_across_two_nodes_match_the_evaluator() {
    let seed = env("SVCNET_NETPOL_SEED", 61);
    let rounds = env("SVCNET_NETPOL_ROUNDS", 8);
    rounds_on(Lab::with_nodes(2), seed, rounds);
}
