//! S2e, network programming latency as users feel it (SIG scalability's SLI): from a pod
//! turning Ready (its status patch sent to the API server) to its endpoint live in the kernel
//! rules of every node of `svcnet up --nodes 2`, through the EndpointSlice controller, the
//! proxies' watches and their syncers.
//!
//! Root; `cargo bench -p svcnet --bench s2e`. Background: `S2E_SERVICES` (10000) selectorless
//! services with hand-written EndpointSlices of 1, 2 or 3 endpoints each. Measured:
//! `S2E_CHANGES` (200) pods, each behind its own service and bound to a Node object that no
//! agent runs (so nothing but the status patch moves them), turning Ready one after another;
//! an endpoint is live on a node when its hairpin pair is an element of the node's `ip svcnet`
//! table (added in the same transaction as its backend), polled every 100 µs with a one-key
//! netlink lookup from each node's namespace ([`probe`]). Once with `--min-sync-period 0s`, then,
//! each after a restart on the same data, with the default `auto` and with kube-proxy's `1s`
//! (`S2E_PERIODS`, comma-separated).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a failure is the bench failing

#[path = "../../tests/common/mod.rs"]
mod common;
mod probe;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use common::{Net, Up, free_udp_port, is_root};
use probe::ElementProbe;

const NET: Net = Net {
    prefix: "s2e",
    underlay: "172.29.90.0/24",
    pods: "10.170.0.0/16",
    services: "10.172.0.0/16",
    lb: "10.173.0.0/24",
};
/// The Node the measured pods and the background endpoints are bound to; no agent runs it.
const GHOST: &str = "s2e-ghost";
const NODES: [&str; 2] = ["s2e-node1", "s2e-node2"];
/// In-flight API writes while the background is created.
const WRITERS: usize = 32;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn from<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a well-formed object")
}

/// Background endpoint `j` of service `i` (10.171.x.y: outside every range of the cluster).
fn background_ip(i: usize, j: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 171, 0, 0)) + (i * 3 + j) as u32 + 1)
}

/// The address the measured pod `series`/`i` reports (10.174.series.i).
fn measured_ip(series: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 174, 0, 0)) + (series * 1024 + i) as u32 + 1)
}

async fn create_background(client: &Client, services: usize) {
    let started = Instant::now();
    let endpoints = |i: usize| -> Vec<Value> {
        (0..i % 3 + 1)
            .map(|j| {
                json!({"addresses": [background_ip(i, j).to_string()],
                       "conditions": {"ready": true}, "nodeName": GHOST})
            })
            .collect()
    };
    common::bulk::services_with_slices(client, services, WRITERS, |i| format!("bg-{i}"), endpoints)
        .await
        .expect("background objects created");
    eprintln!(
        "s2e: {services} background services and slices created in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Creates the series' services and pods (bound to the ghost node, running, not Ready).
async fn create_series(client: &Client, series: usize, changes: usize) {
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    futures::stream::iter(0..changes)
        .map(|i| {
            let (svcs, pods) = (svcs.clone(), pods.clone());
            async move {
                let name = format!("m{series}-{i}");
                let svc: Service = from(json!({
                    "metadata": {"name": name},
                    "spec": {"selector": {"s2e": name},
                             "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]}
                }));
                svcs.create(&PostParams::default(), &svc).await?;
                let pod: Pod = from(json!({
                    "metadata": {"name": name, "labels": {"s2e": name}},
                    "spec": {"nodeName": GHOST,
                             "containers": [{"name": "c", "image": "svcnet/agnhost"}]}
                }));
                pods.create(&PostParams::default(), &pod).await?;
                pods.patch_status(&name, &PatchParams::default(), &ready(series, i, false))
                    .await?;
                Ok::<(), kube::Error>(())
            }
        })
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<()>>()
        .await
        .expect("measured services and pods created");
}

fn ready(series: usize, i: usize, ready: bool) -> Patch<Value> {
    let ip = measured_ip(series, i).to_string();
    let status = if ready { "True" } else { "False" };
    Patch::Merge(json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status},
                       {"type": "ContainersReady", "status": status}]
    }}))
}

/// Waits until `ip`'s hairpin pair is in every node's table; the time the last node saw it,
/// or the nodes that did not within `limit`.
fn wait_live(
    probes: &[ElementProbe],
    ip: Ipv4Addr,
    since: Instant,
    limit: Duration,
) -> Result<Duration, Vec<&'static str>> {
    let mut slowest = Duration::ZERO;
    let mut missing = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = probes
            .iter()
            .map(|p| {
                s.spawn(move || {
                    loop {
                        // A node whose table is not there yet answers ENOENT too.
                        if p.has_hairpin("svcnet", ip).expect("netlink lookup") {
                            return Some(since.elapsed());
                        }
                        if since.elapsed() > limit {
                            return None;
                        }
                        std::thread::sleep(Duration::from_micros(100));
                    }
                })
            })
            .collect();
        for (h, node) in handles.into_iter().zip(NODES) {
            match h.join().expect("probe thread") {
                Some(seen) => slowest = slowest.max(seen),
                None => missing.push(node),
            }
        }
    });
    if missing.is_empty() {
        Ok(slowest)
    } else {
        Err(missing)
    }
}

/// A probe per node, once the node namespaces exist (after a restart they are made anew).
fn open_probes() -> Vec<ElementProbe> {
    let deadline = Instant::now() + Duration::from_secs(60);
    NODES
        .iter()
        .map(|n| {
            loop {
                match ElementProbe::open(n) {
                    Ok(p) => break p,
                    Err(e) if Instant::now() > deadline => panic!("no netlink socket in {n}: {e}"),
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        })
        .collect()
}

/// When a watcher (the same API watch the proxies use) first saw each measured service's
/// EndpointSlice with a ready endpoint: the controller's share of a change's latency.
type SliceSeen = Arc<Mutex<HashMap<String, Instant>>>;

fn watch_slices(rt: &tokio::runtime::Runtime, client: &Client) -> SliceSeen {
    let seen = SliceSeen::default();
    let api: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    let out = seen.clone();
    rt.spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
        while let Some(event) = events.next().await {
            let Ok(slice) = event else { continue };
            let service = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"))
                .filter(|n| n.starts_with('m'));
            let ready = slice
                .endpoints
                .iter()
                .any(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true));
            if let (Some(service), true) = (service, ready) {
                let mut seen = out.lock().expect("slice map");
                seen.entry(service.clone()).or_insert_with(Instant::now);
            }
        }
    });
    seen
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

fn main() {
    if !is_root() {
        eprintln!("s2e: needs root (network namespaces); not run");
        return;
    }
    let services = env_usize("S2E_SERVICES", 10_000);
    let changes = env_usize("S2E_CHANGES", 200).min(1000);
    let periods: Vec<String> = std::env::var("S2E_PERIODS")
        .unwrap_or_else(|_| "0s,auto,1s".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let dns = free_udp_port();
    let mut up: Up = NET.up_with("2", dns, &["--min-sync-period", &periods[0]]);
    let client = rt.block_on(async {
        let kubeconfig = kube::config::Kubeconfig::read_from(up.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        Client::try_from(config).unwrap()
    });
    let nodes: Api<Node> = Api::all(client.clone());
    rt.block_on(nodes.create(
        &PostParams::default(),
        &from(json!({"metadata": {"name": GHOST}})),
    ))
    .expect("ghost node created");
    rt.block_on(create_background(&client, services));
    let mut probes = open_probes();

    let slices = watch_slices(&rt, &client);
    let mut rows = Vec::new();
    for (series, period) in periods.iter().enumerate() {
        if series > 0 {
            let flag = up
                .extra
                .iter()
                .position(|a| a == "--min-sync-period")
                .unwrap();
            up.extra[flag + 1] = period.clone();
            up.restart();
            probes = open_probes(); // the namespaces were made anew
        }
        // Every node has programmed the whole background before the series starts.
        let last = background_ip(services - 1, (services - 1) % 3);
        let synced = wait_live(&probes, last, Instant::now(), Duration::from_secs(600))
            .unwrap_or_else(|nodes| panic!("the background is not live on {nodes:?}"));
        eprintln!(
            "s2e: min-sync-period {period}: background live on both nodes after {:.1} s",
            synced.as_secs_f64()
        );
        rt.block_on(create_series(&client, series, changes));
        std::thread::sleep(Duration::from_secs(3)); // the not-Ready slices settle
        let pods: Api<Pod> = Api::default_namespaced(client.clone());
        let (mut lat, mut ctrl) = (Vec::with_capacity(changes), Vec::with_capacity(changes));
        for i in 0..changes {
            let since = Instant::now();
            rt.block_on(pods.patch_status(
                &format!("m{series}-{i}"),
                &PatchParams::default(),
                &ready(series, i, true),
            ))
            .expect("status patched");
            let ip = measured_ip(series, i);
            match wait_live(&probes, ip, since, Duration::from_secs(30)) {
                Ok(d) => {
                    lat.push(d);
                    let name = format!("m{series}-{i}");
                    let at = slices.lock().expect("slice map").get(&name).copied();
                    // A slice the watcher saw after the rules were live counts as the whole.
                    ctrl.push(at.map_or(d, |t| t.saturating_duration_since(since).min(d)));
                }
                Err(nodes) => {
                    // Where it stuck: the pod, its slice, and what the proxies last synced.
                    let name = format!("m{series}-{i}");
                    let label = format!("kubernetes.io/service-name={name}");
                    for args in [
                        &["get", "pod", &name, "-o", "yaml"][..],
                        &["get", "endpointslices", "-l", &label, "-o", "yaml"],
                        &["get", "leases", "-n", "kube-system", "-o", "yaml"],
                    ] {
                        let out = up.kubectl(args);
                        eprintln!(
                            "$ kubectl {}\n{}",
                            args.join(" "),
                            String::from_utf8_lossy(&out.stdout)
                        );
                    }
                    panic!("{ip} not live on {nodes:?} within 30 s");
                }
            }
        }
        let mut slowest: Vec<(usize, Duration)> = lat.iter().copied().enumerate().collect();
        slowest.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
        let slowest: Vec<String> = slowest
            .iter()
            .take(5)
            .map(|(i, d)| {
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                format!("#{i} {:.1} ms (slice seen at {:.1})", ms(*d), ms(ctrl[*i]))
            })
            .collect();
        eprintln!(
            "s2e: min-sync-period {period}: slowest changes {}",
            slowest.join(", ")
        );
        lat.sort();
        ctrl.sort();
        rows.push((period.clone(), lat, ctrl));
    }
    NET.stop(&mut up);

    println!(
        "S2e: pod Ready (status patch) -> endpoint live on both nodes of `svcnet up --nodes 2`, \
         {services} background services, {changes} changes each"
    );
    println!(
        "| min-sync-period | p50 ms | p90 ms | p99 ms | max ms | of which patch -> slice seen, \
         p50 / p99 / max ms |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (period, lat, ctrl) in &rows {
        println!(
            "| {period} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} / {:.1} |",
            pct(lat, 0.50),
            pct(lat, 0.90),
            pct(lat, 0.99),
            pct(lat, 1.0),
            pct(ctrl, 0.50),
            pct(ctrl, 0.99),
            pct(ctrl, 1.0)
        );
    }
}
