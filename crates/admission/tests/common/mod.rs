//! Fixture builders shared by the admission tests.
#![allow(dead_code)]

use expect_test::Expect;
use serde_json::{Value, json};
use svcnet_admission::{AdmissionConfig, Allocators, FieldError, admit_create};

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

/// Admits `obj` as a new `kind` and compares the stored object with a snapshot.
pub fn check(kind: &str, obj: Value, want: Expect) {
    let got = admit_create(kind, obj, &mut allocs())
        .unwrap_or_else(|e| panic!("refused: {:?}", messages(&e)));
    want.assert_eq(&stable(&serde_json::to_string_pretty(&got).unwrap()));
}

/// The ServiceAccount volume's random suffix as `XXXXX`, so a snapshot holds still.
pub fn stable(text: &str) -> String {
    const PREFIX: &str = "kube-api-access-";
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(PREFIX) {
        out.push_str(&rest[..i + PREFIX.len()]);
        out.push_str("XXXXX");
        rest = rest.get(i + PREFIX.len() + 5..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

/// Admits `obj` as a new `kind`, which must be refused with exactly these messages.
pub fn rejects(kind: &str, obj: Value, want: &[&str]) {
    let errs = admit_create(kind, obj, &mut allocs()).expect_err("accepted");
    assert_eq!(messages(&errs), want);
}
