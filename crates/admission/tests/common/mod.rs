//! Fixture builders shared by the admission tests.
#![allow(dead_code)]

use serde_json::{Value, json};
use svcnet_admission::{AdmissionConfig, Allocators, FieldError};

/// A minimal Service (`ns/name`, one TCP port 80, selector app=name), then
/// `f` edits its JSON.
pub fn service(ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Value {
    let mut v = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}
    });
    f(&mut v);
    v
}

/// `v[path...] = value`, creating objects on the way.
pub fn set(v: &mut Value, path: &str, value: Value) {
    let mut cur = v;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i == parts.len() - 1;
        if let Ok(idx) = part.parse::<usize>() {
            cur = &mut cur[idx];
        } else if last {
            cur[*part] = value;
            return;
        } else {
            if cur.get(*part).is_none() {
                cur[*part] = json!({});
            }
            cur = &mut cur[*part];
        }
        if last {
            *cur = value;
            return;
        }
    }
}

pub fn allocs() -> Allocators {
    Allocators::new(AdmissionConfig::default()).unwrap()
}

/// Allocators over a small CIDR, a small node-port range and a /30 pool.
pub fn small_allocs(cidr: &str, ports: std::ops::RangeInclusive<u16>) -> Allocators {
    Allocators::new(AdmissionConfig {
        service_cidrs: vec![cidr.parse().unwrap()],
        node_port_range: ports,
        lb_pool: Some("10.200.0.0/30".parse().unwrap()),
        reserved_ips: vec![],
    })
    .unwrap()
}

pub fn messages(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(|e| e.to_string()).collect()
}

pub fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {ptr} in {v}"))
}

pub fn int_at(v: &Value, ptr: &str) -> i64 {
    v.pointer(ptr)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("no integer at {ptr} in {v}"))
}
