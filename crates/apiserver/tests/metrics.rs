//! `GET /metrics`: kube-apiserver's metric names and labels, counts that move with the
//! requests made, Prometheus text format an independent parser reads, and authentication as
//! on every other path.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::BodyExt;
use prometheus_parse::{Sample, Scrape, Value as PromValue};
use serde_json::json;

use common::raw::{Raw, raw};

/// A scrape through the authenticated client, checked line by line against the text format
/// and parsed by `prometheus-parse`.
async fn scrape(raw: &Raw) -> Scrape {
    let req = http::Request::builder()
        .uri("/metrics")
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = raw.client.send(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(typed.insert(name.into(), kind.into()).is_none(), "{line}");
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        // Every sample belongs to a family declared before it.
        let name = strict_sample(line);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        assert!(typed.contains_key(family), "undeclared sample: {line}");
        samples += 1;
    }
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    // The parser folds a histogram's lines into one sample; count what it read line by line.
    let read: usize = scrape
        .samples
        .iter()
        .map(|s| match &s.value {
            PromValue::Histogram(b) => b.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(read, samples, "lines the parser did not read:\n{text}");
    for s in &scrape.samples {
        if let PromValue::Histogram(buckets) = &s.value {
            let counts: Vec<f64> = buckets.iter().map(|b| b.count).collect();
            assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{}", s.metric);
            assert_eq!(buckets.last().unwrap().less_than, f64::INFINITY);
        }
    }
    scrape
}

/// Checks one sample line against the text format's grammar (`name{label="value",...} value`,
/// values escaped with `\\`, `\"`, `\n`) and returns its metric name.
fn strict_sample(line: &str) -> &str {
    let ident = |c: char, first: bool| {
        c == '_' || c.is_ascii_alphabetic() || (!first && c.is_ascii_digit())
    };
    let end = line
        .char_indices()
        .find(|(i, c)| !(ident(*c, *i == 0) || *c == ':'))
        .map_or(line.len(), |(i, _)| i);
    let (name, mut rest) = line.split_at(end);
    assert!(!name.is_empty(), "no metric name: {line}");
    if let Some(labels) = rest.strip_prefix('{') {
        let mut chars = labels.char_indices().peekable();
        loop {
            let start = chars.peek().map(|(i, _)| *i).unwrap();
            let mut key_end = start;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    key_end = i;
                    break;
                }
                assert!(ident(c, i == start), "bad label name in {line}");
            }
            assert!(key_end > start, "empty label name in {line}");
            assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('\\') => {
                        let e = chars.next().map(|(_, c)| c);
                        assert!(matches!(e, Some('\\' | '"' | 'n')), "bad escape in {line}");
                    }
                    Some('"') => break,
                    Some('\n') | None => panic!("unterminated label value in {line}"),
                    Some(_) => {}
                }
            }
            match chars.next() {
                Some((_, ',')) => continue,
                Some((i, '}')) => {
                    rest = &labels[i + 1..];
                    break;
                }
                other => panic!("{other:?} after a label in {line}"),
            }
        }
    }
    let value = rest
        .strip_prefix(' ')
        .unwrap_or_else(|| panic!("no value: {line}"));
    assert!(
        value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
        "bad value in {line}"
    );
    name
}

fn find<'a>(s: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    s.samples
        .iter()
        .find(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
}

/// A counter or gauge's value (0 when the series does not exist yet).
fn value(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    match find(s, metric, labels).map(|x| &x.value) {
        Some(PromValue::Counter(v) | PromValue::Gauge(v) | PromValue::Untyped(v)) => *v,
        None => 0.0,
        Some(other) => panic!("{metric}: {other:?}"),
    }
}

/// How many observations a histogram series holds (its `+Inf` bucket).
fn observations(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    match find(s, metric, labels).map(|x| &x.value) {
        Some(PromValue::Histogram(b)) => b.last().unwrap().count,
        None => 0.0,
        Some(other) => panic!("{metric}: {other:?}"),
    }
}

const CM: &str = "/api/v1/namespaces/default/configmaps";

fn request(verb: &str, code: &str, scope: &str) -> Vec<(&'static str, String)> {
    vec![
        ("verb", verb.into()),
        ("code", code.into()),
        ("scope", scope.into()),
        ("resource", "configmaps".into()),
        ("group", String::new()),
        ("version", "v1".into()),
        ("subresource", String::new()),
        ("component", "apiserver".into()),
        ("dry_run", String::new()),
    ]
}

fn refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_storage_and_watches() {
    let ts = common::TestServer::start().await;
    let raw = raw(&ts).await;
    let before = scrape(&raw).await;

    for name in ["m1", "m2"] {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
        assert_eq!(raw.json("POST", CM, &body).await.code, 201);
    }
    let dry = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m3"}});
    assert_eq!(
        raw.json("POST", &format!("{CM}?dryRun=All"), &dry)
            .await
            .code,
        201
    );
    assert_eq!(raw.get(&format!("{CM}/m1")).await.code, 200);
    assert_eq!(raw.get(&format!("{CM}/absent")).await.code, 404);
    assert_eq!(raw.get(CM).await.code, 200);
    let apply =
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"m1"},"data":{"a":"b"}}"#;
    let r = raw
        .send(
            "PATCH",
            &format!("{CM}/m1?fieldManager=t"),
            "application/apply-patch+yaml",
            apply,
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(
        raw.send("DELETE", &format!("{CM}/m2"), "", b"").await.code,
        200
    );

    let after = scrape(&raw).await;
    let delta = |labels: &[(&'static str, String)]| {
        let l = refs(labels);
        value(&after, "apiserver_request_total", &l) - value(&before, "apiserver_request_total", &l)
    };
    assert_eq!(delta(&request("POST", "201", "namespace")), 2.0);
    let mut dry = request("POST", "201", "namespace");
    dry[8].1 = "All".into();
    assert_eq!(delta(&dry), 1.0);
    assert_eq!(delta(&request("GET", "200", "namespace")), 1.0);
    assert_eq!(delta(&request("GET", "404", "namespace")), 1.0);
    assert_eq!(delta(&request("LIST", "200", "namespace")), 1.0);
    assert_eq!(delta(&request("APPLY", "200", "namespace")), 1.0);
    assert_eq!(delta(&request("DELETE", "200", "namespace")), 1.0);
    // The duration histogram saw each of them (it has no code label).
    let post = request("POST", "", "namespace");
    let post: Vec<_> = refs(&post)
        .into_iter()
        .filter(|(k, _)| *k != "code")
        .collect();
    assert_eq!(
        observations(&after, "apiserver_request_duration_seconds", &post)
            - observations(&before, "apiserver_request_duration_seconds", &post),
        2.0
    );
    // The first scrape is counted as a non-resource request by its path.
    assert!(
        value(
            &after,
            "apiserver_request_total",
            &[
                ("verb", "GET"),
                ("subresource", "/metrics"),
                ("code", "200")
            ]
        ) >= 1.0
    );

    // Storage: the two creates, the apply's update and the delete, by what they did; the
    // dry run wrote nothing (a read).
    let storage = |op: &str| {
        let l = [("operation", op), ("type", "configmaps")];
        observations(&after, "etcd_request_duration_seconds", &l)
            - observations(&before, "etcd_request_duration_seconds", &l)
    };
    assert_eq!(storage("create"), 2.0);
    assert_eq!(storage("update"), 1.0);
    assert_eq!(storage("delete"), 1.0);
    assert!(storage("get") >= 2.0);
    assert!(storage("list") >= 1.0);
    let stored = raw.get(CM).await.body["items"].as_array().unwrap().len();
    let all = raw.get("/api/v1/configmaps").await.body["items"]
        .as_array()
        .unwrap()
        .len();
    assert!(stored >= 1);
    assert_eq!(
        value(
            &after,
            "apiserver_storage_objects",
            &[("resource", "configmaps")]
        ),
        all as f64
    );
    assert!(
        value(
            &after,
            "apiserver_storage_objects",
            &[("resource", "deployments.apps")]
        ) >= 0.0
    );
    assert!(
        find(
            &after,
            "apiserver_storage_objects",
            &[("resource", "deployments.apps")]
        )
        .is_some()
    );
    assert!(value(&after, "apiserver_storage_size_bytes", &[]) > 0.0);
    // The scrape itself is a read in flight.
    assert!(
        value(
            &after,
            "apiserver_current_inflight_requests",
            &[("request_kind", "readOnly")]
        ) >= 1.0
    );
    assert!(
        find(
            &after,
            "apiserver_current_inflight_requests",
            &[("request_kind", "mutating")]
        )
        .is_some()
    );

    // A watch is long-running: counted while open, recorded when it ends.
    let watch = request("WATCH", "200", "namespace");
    let long: Vec<_> = refs(&watch)
        .into_iter()
        .filter(|(k, _)| !["code", "dry_run"].contains(k))
        .collect();
    let req = http::Request::builder()
        .uri(format!("{CM}?watch=true&timeoutSeconds=2"))
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = raw.client.send(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let open = scrape(&raw).await;
    assert_eq!(value(&open, "apiserver_longrunning_requests", &long), 1.0);
    assert_eq!(
        value(
            &open,
            "apiserver_registered_watchers",
            &[("group", ""), ("version", "v1"), ("kind", "ConfigMap")]
        ),
        1.0
    );
    assert_eq!(
        value(&open, "apiserver_request_total", &refs(&watch)),
        value(&before, "apiserver_request_total", &refs(&watch))
    );
    // The watch ends at its timeout; then it is recorded and no longer open.
    let _ = resp.into_body().collect().await;
    let mut closed = scrape(&raw).await;
    for _ in 0..50 {
        if value(&closed, "apiserver_longrunning_requests", &long) == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        closed = scrape(&raw).await;
    }
    assert_eq!(value(&closed, "apiserver_longrunning_requests", &long), 0.0);
    assert_eq!(
        value(&closed, "apiserver_request_total", &refs(&watch))
            - value(&before, "apiserver_request_total", &refs(&watch)),
        1.0
    );
    let w = [("verb", "WATCH"), ("resource", "configmaps")];
    let watched = observations(&closed, "apiserver_request_duration_seconds", &w);
    assert!(watched >= 1.0);
    ts.stop().await;
}

/// /metrics is not a probe: a client without a certificate gets 401, as from kube-apiserver
/// (which serves it to authorized clients only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_authentication() {
    let ts = common::TestServer::start().await;
    let ca = ts.dir.path().join("pki/ca.crt");
    let url = format!("https://{}/metrics", ts.server().addr());
    let out = tokio::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(&ca)
        .arg(&url)
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "401");
    // kubectl reads it with the kubeconfig's certificate.
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(ts.server().kubeconfig_path())
        .args(["get", "--raw", "/metrics"])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("# TYPE apiserver_request_total counter"),
        "{text}"
    );
    ts.stop().await;
}
