//! Property: whatever sequence of creates, updates and deletes clients send,
//! no two stored services share a cluster IP or a (node port, protocol), and
//! the allocators always equal a fresh rebuild from the stored services.

#![allow(clippy::unwrap_used)] // tests may unwrap (RULES.md)

mod common;

use std::collections::BTreeMap;

use common::*;
use proptest::prelude::*;
use serde_json::{Value, json};
use svcnet_admission::{admit_create, admit_update};

#[derive(Debug, Clone)]
struct Params {
    ty: &'static str,
    cluster_ip: Option<&'static str>,
    node_port: Option<u16>,
    second_port: bool,
    proto: &'static str,
    local: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Create(usize, Params),
    Update(usize, Params),
    Delete(usize),
}

fn params() -> impl Strategy<Value = Params> {
    (
        prop::sample::select(vec![
            "ClusterIP",
            "NodePort",
            "LoadBalancer",
            "ExternalName",
        ]),
        prop::option::of(prop::sample::select(vec![
            "10.0.0.2", "10.0.0.3", "10.0.0.9", "10.0.1.1", "None",
        ])),
        prop::option::of(30000u16..30006),
        any::<bool>(),
        prop::sample::select(vec!["TCP", "UDP"]),
        any::<bool>(),
    )
        .prop_map(
            |(ty, cluster_ip, node_port, second_port, proto, local)| Params {
                ty,
                cluster_ip,
                node_port,
                second_port,
                proto,
                local,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..5, params()).prop_map(|(i, p)| Op::Create(i, p)),
        (0usize..5, params()).prop_map(|(i, p)| Op::Update(i, p)),
        (0usize..5).prop_map(Op::Delete),
    ]
}

fn manifest(i: usize, p: &Params) -> Value {
    service("default", &format!("s{i}"), |s| {
        set(s, "spec.type", json!(p.ty));
        if p.ty == "ExternalName" {
            set(s, "spec.externalName", json!("db.example.com"));
        }
        if let Some(ip) = p.cluster_ip {
            set(s, "spec.clusterIP", json!(ip));
        }
        let mut ports = vec![json!({"name": "a", "port": 80, "protocol": p.proto})];
        if let Some(np) = p.node_port {
            ports[0]["nodePort"] = json!(np);
        }
        if p.second_port {
            ports.push(json!({"name": "b", "port": 81, "protocol": "TCP"}));
        }
        set(s, "spec.ports", Value::Array(ports));
        if p.local && p.ty == "LoadBalancer" {
            set(s, "spec.externalTrafficPolicy", json!("Local"));
        }
    })
}

fn check_unique(store: &BTreeMap<usize, Value>) -> Result<(), TestCaseError> {
    let mut ips = BTreeMap::new();
    let mut ports = BTreeMap::new();
    for (i, svc) in store {
        for ip in svc
            .pointer("/spec/clusterIPs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let ip = ip.as_str().unwrap();
            if ip != "None" {
                prop_assert!(
                    ips.insert(ip.to_string(), *i).is_none(),
                    "cluster IP {ip} shared: {store:#?}"
                );
            }
        }
        let ty = svc["spec"]["type"].as_str().unwrap();
        let mut mine = std::collections::BTreeSet::new();
        for p in svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(np) = p.get("nodePort").and_then(Value::as_u64) {
                prop_assert!(
                    ty == "NodePort" || ty == "LoadBalancer",
                    "node port on a {ty}"
                );
                let key = (np, p["protocol"].as_str().unwrap().to_string());
                prop_assert!(
                    mine.insert(key.clone()),
                    "node port {key:?} twice in one service"
                );
                prop_assert!(
                    ports.insert(key.clone(), *i).is_none(),
                    "node port {key:?} shared: {store:#?}"
                );
            }
        }
        if let Some(hc) = svc
            .pointer("/spec/healthCheckNodePort")
            .and_then(Value::as_u64)
        {
            let key = (hc, "TCP".to_string());
            prop_assert!(
                !mine.contains(&key),
                "health-check port {hc} is also a node port"
            );
            prop_assert!(
                ports.insert(key, *i).is_none(),
                "health-check port {hc} shared"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn allocations_stay_unique_and_rebuildable(ops in prop::collection::vec(op(), 1..40)) {
        let mut a = small_allocs("10.0.0.0/28", 30000..=30007);
        let mut store: BTreeMap<usize, Value> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Create(i, p) => {
                    if store.contains_key(&i) {
                        continue; // the API server answers 409 AlreadyExists
                    }
                    let before = a.clone();
                    match admit_create("Service", manifest(i, &p), &mut a) {
                        Ok(v) => { store.insert(i, v); }
                        Err(_) => prop_assert_eq!(&a, &before),
                    }
                }
                Op::Update(i, p) => {
                    let Some(old) = store.get(&i).cloned() else { continue };
                    let before = a.clone();
                    match admit_update("Service", &old, manifest(i, &p), &mut a) {
                        Ok(v) => { store.insert(i, v); }
                        Err(_) => prop_assert_eq!(&a, &before),
                    }
                }
                Op::Delete(i) => {
                    if let Some(old) = store.remove(&i) {
                        a.release(&old);
                    }
                }
            }
            check_unique(&store)?;
            let mut fresh = small_allocs("10.0.0.0/28", 30000..=30007);
            let stored: Vec<Value> = store.values().cloned().collect();
            let warnings = fresh.rebuild(&stored);
            prop_assert!(warnings.is_empty(), "{:?}", warnings);
            prop_assert_eq!(&fresh, &a);
        }
    }
}
