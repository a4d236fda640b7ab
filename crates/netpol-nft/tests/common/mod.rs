//! Upstream's e2e model (`test/e2e/network/netpol/model.go`) for this crate's tests:
//! namespaces x, y, z with pods a, b, c, each serving TCP and UDP on 80 and 81 with container
//! ports `serve-<port>-<proto>`, and the truth table printed with `.` / `X`.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use svcnet_netpol::{Cluster, Policy};

pub mod lab;

pub use svcnet_netpol::upstream::{NAMESPACES, PODS, PROBES};

/// A listing's sets and chains in name order (nft lists chains in creation order).
pub fn blocks(listing: &str) -> Vec<String> {
    let mut b: Vec<String> = listing
        .split("\n\n")
        .map(|s| s.trim().to_string())
        .collect();
    b.sort();
    b
}

/// `x/a`, ... in upstream's order.
pub fn all_pods() -> Vec<(String, String)> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| (ns.to_string(), p.to_string())))
        .collect()
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The model with no policies; `place` gives each pod its address and node.
pub fn model(place: impl Fn(&str, &str) -> (IpAddr, String)) -> Cluster {
    svcnet_netpol::upstream::model(|ns, pod| {
        let (ip, node) = place(ns, pod);
        (ip, Some(node))
    })
}

/// The snapshot tests' placement: 10.244.<ns index>.<pod index + 10>, all on `node1`.
pub fn fixed(ns: &str, pod: &str) -> (IpAddr, String) {
    let n = NAMESPACES.iter().position(|x| *x == ns).unwrap();
    let p = PODS.iter().position(|x| *x == pod).unwrap();
    (
        format!("10.244.{n}.{}", p + 10).parse().unwrap(),
        "node1".into(),
    )
}

/// A policy `name` in `ns` from its spec, through the API type (so the conversion with its
/// defaulting is what is rendered).
pub fn policy(ns: &str, name: &str, spec: Value) -> Policy {
    let np: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))
    .unwrap();
    Policy::from_k8s(&np).unwrap()
}
