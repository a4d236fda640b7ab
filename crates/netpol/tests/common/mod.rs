//! upstream's e2e model (`test/e2e/network/netpol/model.go`): namespaces x, y, z with pods
//! a, b, c, each serving TCP and UDP on 80 and 81 with container ports `serve-<port>-<proto>`,
//! and the truth table (`reachability.go`, `truthtable.go`) printed with `.` / `X`.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use svcnet_netpol::{Cluster, Connection, Endpoint, Policy, Protocol};

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];

/// `x/a`, ... in upstream's order.
pub fn all_pods() -> Vec<(String, String)> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| (ns.to_string(), p.to_string())))
        .collect()
}

/// The pod's address: 10.244.<ns index>.<pod index + 10>.
pub fn pod_ip(ns: &str, pod: &str) -> IpAddr {
    let n = NAMESPACES.iter().position(|x| *x == ns).unwrap();
    let p = PODS.iter().position(|x| *x == pod).unwrap();
    format!("10.244.{n}.{}", p + 10).parse().unwrap()
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The model with no policies.
pub fn model() -> Cluster {
    svcnet_netpol::upstream::model(|ns, pod| (pod_ip(ns, pod), None))
}

/// A policy `name` in `ns` from its spec, through the API type (so the conversion with its
/// defaulting is what is tested).
pub fn policy(ns: &str, name: &str, spec: Value) -> Policy {
    let np: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))
    .unwrap();
    Policy::from_k8s(&np).unwrap()
}

/// Expected or observed connectivity between every ordered pair of pods.
#[derive(Clone, PartialEq, Eq)]
pub struct Reachability {
    cells: BTreeMap<(String, String), bool>,
}

/// `x/a`, `x/*`, `*/a` or `*`.
fn matches(pattern: &str, (ns, pod): &(String, String)) -> bool {
    if pattern == "*" {
        return true;
    }
    let (pns, ppod) = pattern.split_once('/').unwrap();
    (pns == "*" || pns == ns) && (ppod == "*" || ppod == pod)
}

impl Reachability {
    pub fn new(default: bool) -> Self {
        let mut cells = BTreeMap::new();
        for from in all_pods() {
            for to in all_pods() {
                cells.insert((key(&from), key(&to)), default);
            }
        }
        Reachability { cells }
    }

    /// upstream `ExpectPeer`: every pair from `from` to `to` is `v`.
    pub fn expect(&mut self, from: &str, to: &str, v: bool) -> &mut Self {
        for f in all_pods() {
            for t in all_pods() {
                if matches(from, &f) && matches(to, &t) {
                    self.cells.insert((key(&f), key(&t)), v);
                }
            }
        }
        self
    }

    /// upstream `ExpectAllIngress`.
    pub fn ingress(&mut self, to: &str, v: bool) -> &mut Self {
        self.expect("*", to, v)
    }

    /// upstream `ExpectAllEgress`.
    pub fn egress(&mut self, from: &str, v: bool) -> &mut Self {
        self.expect(from, "*", v)
    }

    /// Asks the evaluator about every pair, to the destination pod's `port`/`protocol`.
    pub fn observe(c: &Cluster, protocol: Protocol, port: u16) -> Self {
        let mut cells = BTreeMap::new();
        for from in all_pods() {
            for to in all_pods() {
                let conn = Connection {
                    src: Endpoint::pod(&from.0, &from.1),
                    dst: Endpoint::pod(&to.0, &to.1),
                    protocol,
                    port,
                };
                cells.insert((key(&from), key(&to)), c.allowed(&conn));
            }
        }
        Reachability { cells }
    }

    /// Cells that differ, loopback (a pod to itself) left out as upstream does.
    pub fn mismatches(&self, other: &Reachability) -> usize {
        self.cells
            .iter()
            .filter(|((f, t), v)| f != t && other.cells.get(&(f.clone(), t.clone())) != Some(v))
            .count()
    }
}

fn key((ns, pod): &(String, String)) -> String {
    format!("{ns}/{pod}")
}

/// upstream's truth table: rows are sources, `.` connected, `X` blocked.
impl std::fmt::Display for Reachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = all_pods().iter().map(key).collect();
        write!(f, "-  ")?;
        for n in &names {
            write!(f, " {n}")?;
        }
        writeln!(f)?;
        for from in &names {
            write!(f, "{from}")?;
            for to in &names {
                let v = self.cells[&(from.clone(), to.clone())];
                write!(f, "  {} ", if v { '.' } else { 'X' })?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Reachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The one helper every case goes through: `policies` on the model (after `edit`), probed
/// on `protocol`/`port`, against `expected`.
pub fn check_on(c: &Cluster, protocol: Protocol, port: u16, expected: &Reachability) {
    let observed = Reachability::observe(c, protocol, port);
    let n = expected.mismatches(&observed);
    assert!(
        n == 0,
        "{n} mismatches on {protocol:?}/{port}\nexpected:\n{expected}\nobserved:\n{observed}\npolicies: {:#?}",
        c.policies
    );
}

/// [`check_on`] with TCP 80, upstream's default probe.
pub fn check(policies: Vec<Policy>, expected: &Reachability) {
    let mut c = model();
    c.policies = policies;
    check_on(&c, Protocol::Tcp, 80, expected);
}
