//! What the proxy core holds per Service and per endpoint: the heap of a `ProxyState` fed
//! `STATE_SERVICES` (10,000) Services with one EndpointSlice each, `STATE_ENDPOINTS` (50,000)
//! endpoints spread evenly over `STATE_NODES` (1,000) node names, shaped as S13's objects
//! (one named TCP port; ready endpoints with a node name), after the changes are taken as a
//! sync takes them. Every node's proxy holds this, so at S13's scale it decides how many
//! hollow nodes one machine can run.
//!
//! Bytes are counted by a global allocator that wraps the system's: requested bytes, the
//! allocations live, and glibc's footprint for them (a chunk is the request plus 8 bytes,
//! rounded up to 16, at least 32). Run: `cargo bench -p svcnet-proxy --bench state_memory`.

// The counting allocator forwards to the system's: the only unsafe code here.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};

struct Counting;

static REQUESTED: AtomicIsize = AtomicIsize::new(0);
static CHUNKS: AtomicIsize = AtomicIsize::new(0);
static LIVE: AtomicIsize = AtomicIsize::new(0);

fn chunk(size: usize) -> isize {
    (((size + 8 + 15) & !15).max(32)) as isize
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters only
// observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        REQUESTED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        CHUNKS.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        LIVE.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        REQUESTED.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        CHUNKS.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        LIVE.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: ptr came from alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        REQUESTED.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        CHUNKS.fetch_add(chunk(new_size) - chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Clone, Copy, Debug)]
struct Heap {
    requested: isize,
    chunks: isize,
    live: isize,
}

fn heap() -> Heap {
    Heap {
        requested: REQUESTED.load(Ordering::Relaxed),
        chunks: CHUNKS.load(Ordering::Relaxed),
        live: LIVE.load(Ordering::Relaxed),
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn service(i: usize) -> Service {
    let ip = format!("10.96.{}.{}", (i >> 8) & 255, i & 255);
    serde_json::from_value(json!({
        "metadata": {"name": format!("s13-{i}"), "namespace": "default"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .expect("a valid Service")
}

fn slice(i: usize, endpoints: usize, first: usize, nodes: usize) -> EndpointSlice {
    let eps: Vec<_> = (0..endpoints)
        .map(|j| {
            let n = (first + j) as u32 + 1;
            json!({"addresses": [format!("10.{}.{}.{}", 171 + (n >> 16), (n >> 8) & 255, n & 255)],
                   "conditions": {"ready": true},
                   "nodeName": format!("s13-node-{}", j % nodes)})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("s13-{i}-1"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": format!("s13-{i}")}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
    .expect("a valid EndpointSlice")
}

fn per(bytes: isize, n: usize) -> f64 {
    bytes as f64 / n.max(1) as f64
}

fn main() {
    let services = env_usize("STATE_SERVICES", 10_000).max(1);
    let endpoints = env_usize("STATE_ENDPOINTS", 50_000);
    let nodes = env_usize("STATE_NODES", 1_000).max(1);
    let config = CoreConfig {
        node_name: "s13-node-0".into(),
        ..Default::default()
    };

    let start = heap();
    let mut state = ProxyState::new(config);
    for i in 0..services {
        state
            .update_service(&service(i))
            .expect("a programmable Service");
    }
    drop(state.take_changes());
    let with_services = heap();
    let mut first = 0;
    for i in 0..services {
        let n = endpoints / services + usize::from(i < endpoints % services);
        state.update_slice(&slice(i, n, first, nodes));
        first += n;
    }
    drop(state.take_changes());
    let full = heap();
    // The state must hold what it was fed (a check that the figures measure a real state).
    let desired = state.desired(IpFamily::V4);
    let held: usize = desired
        .services
        .values()
        .map(|p| p.cluster_endpoints.len())
        .sum();
    assert_eq!(
        desired.services.len(),
        services,
        "every Service port is held"
    );
    assert_eq!(held, endpoints, "every endpoint is held");
    drop(desired);

    let mib = |b: isize| b as f64 / (1024.0 * 1024.0);
    let svc = (
        with_services.requested - start.requested,
        with_services.chunks - start.chunks,
    );
    let eps = (
        full.requested - with_services.requested,
        full.chunks - with_services.chunks,
    );
    println!(
        "proxy core state: {services} Services, {services} EndpointSlices, {endpoints} endpoints on {nodes} node names"
    );
    println!(
        "  whole state: {:.1} MiB requested, {:.1} MiB in malloc chunks, {} allocations",
        mib(full.requested - start.requested),
        mib(full.chunks - start.chunks),
        full.live - start.live
    );
    println!(
        "  per Service (Services alone): {:.0} B requested, {:.0} B in chunks, {:.1} allocations",
        per(svc.0, services),
        per(svc.1, services),
        per(with_services.live - start.live, services)
    );
    println!(
        "  per endpoint (slices added): {:.0} B requested, {:.0} B in chunks, {:.2} allocations",
        per(eps.0, endpoints),
        per(eps.1, endpoints),
        per(full.live - with_services.live, endpoints)
    );
    println!(
        "  per slice: {:.0} B in chunks ({} endpoints each)",
        per(eps.1, services),
        endpoints / services
    );
}
