//! A schema-driven fuzz run against a real server: requests are generated from svcnet's own
//! OpenAPI v3 documents (every path and operation they describe, with valid and mutated
//! parameters and bodies; bodies start from a valid object of the kind and are mutated along
//! its schema), sent over HTTPS, and checked: no 5xx (but upstream's 504 for a resourceVersion
//! the store has not reached), no dropped connection or hang, and a refused request (or a
//! `dryRun=All` one) changes nothing: the store's revision stays, and every tenth time the
//! whole store is compared.
//!
//! Bounded: 30 s by default; `SVCNET_FUZZ_SECS=600` runs longer. The seed is printed;
//! `SVCNET_FUZZ_SEED=N` repeats a run.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "fuzz/gen.rs"]
mod fuzzgen;

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use common::raw::Raw;
use fuzzgen::{Generated, Operation};

/// A client without kube-rs's retries, so every answer is seen as sent.
async fn client(ts: &common::TestServer) -> Raw {
    let kc = kube::config::Kubeconfig::read_from(ts.server().kubeconfig_path()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.default_retry = false;
    Raw {
        client: kube::Client::try_from(cfg).unwrap(),
    }
}

/// The store's revision, as a small list reports it.
async fn revision(raw: &Raw) -> String {
    let r = raw.get("/api/v1/nodes").await;
    assert_eq!(r.code, 200, "{}", r.body);
    r.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Waits until background work after an accepted write (the garbage and namespace
/// collectors after a delete, the service-account controller after a namespace create) has
/// stopped moving the revision.
async fn settle(raw: &Raw) {
    let mut last = revision(raw).await;
    let mut stable = 0;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = revision(raw).await;
        stable = if now == last { stable + 1 } else { 0 };
        if stable >= 3 {
            return;
        }
        last = now;
    }
}

/// What one request got back; `None` when the connection failed or it timed out.
async fn send(raw: &Raw, g: &Generated) -> Result<(u16, Value), String> {
    let req = http::Request::builder()
        .method(g.method.as_str())
        .uri(&g.uri)
        .header("content-type", &g.content_type)
        .header("accept", "application/json")
        .body(kube::client::Body::from(g.body.clone()))
        .map_err(|e| format!("building the request: {e}"))?;
    let sent = tokio::time::timeout(Duration::from_secs(20), async {
        let resp = raw.client.send(req).await.map_err(|e| e.to_string())?;
        let code = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok::<_, String>((code, body))
    })
    .await;
    match sent {
        Ok(r) => r,
        Err(_) => Err("no answer within 20 s".into()),
    }
}

/// Namespaces the fuzz works in, each with a valid object of every namespaced kind.
const NAMESPACES: [&str; 2] = ["fz-a", "fz-b"];

async fn fixtures(raw: &Raw, ops: &[Operation]) {
    for ns in NAMESPACES {
        let _ = raw
            .json(
                "POST",
                "/api/v1/namespaces",
                &json!({"metadata": {"name": ns}}),
            )
            .await;
    }
    for op in ops.iter().filter(|o| o.action == "post") {
        for ns in NAMESPACES {
            let path = op.path.replace("{namespace}", ns);
            let _ = raw
                .json("POST", &path, &common::fixtures::fixture(&path))
                .await;
            if !op.path.contains("{namespace}") {
                break;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_driven_fuzz_changes_nothing_it_refuses() {
    let seed: u64 = std::env::var("SVCNET_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let secs: u64 = std::env::var("SVCNET_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    eprintln!("fuzz seed {seed} for {secs} s (SVCNET_FUZZ_SEED={seed} repeats it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let ts = common::TestServer::start().await;
    let raw = client(&ts).await;
    let docs = fuzzgen::documents(&raw).await;
    let ops = fuzzgen::operations(&docs);
    assert!(ops.len() > 100, "only {} operations", ops.len());
    fixtures(&raw, &ops).await;
    settle(&raw).await;

    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut sent, mut refused, mut compared) = (0u64, 0u64, 0u64);
    let mut codes = std::collections::BTreeMap::<u16, u64>::new();
    let mut covered = std::collections::BTreeSet::new();
    while Instant::now() < deadline {
        if sent % 100 == 99 {
            // Put back what accepted deletes took away, so named paths keep finding objects.
            fixtures(&raw, &ops).await;
            settle(&raw).await;
        }
        let op = &ops[rng.random_range(0..ops.len())];
        let g = fuzzgen::generate(op, &docs, &mut rng);
        let full = rng.random_ratio(1, 10);
        let before_world = if full { Some(raw.world().await) } else { None };
        let before = revision(&raw).await;
        let what = format!(
            "seed {seed}, request {sent}: {} {} ({}, {} bytes: {})",
            g.method,
            g.uri,
            g.content_type,
            g.body.len(),
            String::from_utf8_lossy(&g.body)
                .chars()
                .take(300)
                .collect::<String>()
        );
        let (code, body) = send(&raw, &g)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        sent += 1;
        *codes.entry(code).or_default() += 1;
        covered.insert(format!("{} {}", g.method, op.path));
        let too_large_rv = code == 504
            && body["reason"] == "Timeout"
            && body["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Too large resource version"));
        assert!(code < 500 || too_large_rv, "{what}: {code} {body}");
        let accepted = (200..300).contains(&code);
        if !accepted || g.dry_run_all {
            refused += u64::from(!accepted);
            let after = revision(&raw).await;
            assert_eq!(
                before, after,
                "{what}: answered {code} but moved the revision: {body}"
            );
            if let Some(before_world) = before_world {
                compared += 1;
                assert!(
                    before_world == raw.world().await,
                    "{what}: answered {code} but changed stored objects"
                );
            }
        } else if g.method != "GET" {
            // An accepted write may set controllers writing (a namespace gets its
            // ServiceAccount and root CA ConfigMap, a delete its garbage collected).
            settle(&raw).await;
        }
    }
    // The server is still up and serving.
    assert_eq!(raw.get("/readyz").await.code, 200);
    eprintln!(
        "fuzz: {sent} requests over {} of {} operations, {refused} refused (each checked unchanged, {compared} against the whole store); codes {codes:?}",
        covered.len(),
        ops.len()
    );
    ts.stop().await;
}
