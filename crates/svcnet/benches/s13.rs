//! S13, the scale test (kubemark's idea): `S13_NODES` (1000) hollow node proxies — each the real
//! watch stack of `svcnet proxy` (`svcnet_proxyd::watchers`, the Service, EndpointSlice and Node
//! watchers) feeding the real pure state (`svcnet_proxy::ProxyState`, changes taken after every
//! batch as a sync would), with a no-op dataplane that records when it saw a marked change —
//! in this one process on a tokio runtime, sharing `S13_CLIENTS` (4) HTTP client pools per API
//! server, against `S13_SERVICES` (10000) Services and `S13_ENDPOINTS` (50000) endpoints (one
//! EndpointSlice per Service), on (a) one `svcnet apiserver` on redb and (b) two `svcnet
//! apiserver --etcd-servers` on a 3-member etcd (Debian's `etcd`, loopback, temp dir), the
//! hollow nodes split between the two servers.
//!
//! Measured per back end: the time from a Service change (`spec.sessionAffinity` toggled) and
//! from an endpoint change (an EndpointSlice's first endpoint toggling ready, written directly:
//! no controller in the loop) to every hollow proxy having it in its state, `S13_CHANGES` (20)
//! of each, one at a time; the API server processes' RSS (now and peak) and CPU seconds per
//! phase (from `/proc`); full-list latency (`S13_LISTS`, 5 per resource) and watch-start
//! latency (request to response headers, `S13_WATCHES`, 100 per resource); the time a hollow
//! node takes from start to both watches synced (nodes start in waves of `S13_WAVE`, 50).
//! Printed side by side with etcd/redb ratios, beside the goals of issue 17 and
//! kube-apiserver's memory rule of thumb (`--target-ram-mb` = 60 MB × nodes).
//!
//! `cargo bench -p svcnet --bench s13 --profile dev` (no root; a small run:
//! `S13_NODES=100 S13_SERVICES=1000 S13_ENDPOINTS=5000`). `S13_BACKENDS=redb` or `etcd` runs one.
//! With both, each runs in a process of its own (this binary started again with
//! `S13_BACKENDS` set and `S13_FIGURES` naming where it writes its figures), one after the
//! other, and this one prints them side by side.
//! `MALLOC_ARENA_MAX=2` applies to this process only (the hollow nodes: 16 MiB per node at the
//! full object count instead of 18, the difference glibc's per-thread arenas make); the API
//! servers it starts run with the allocator's defaults.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a failure is the bench failing

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams, WatchParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use svcnet_proxy::{NamespacedName, ProxyState};
use svcnet_proxyd::watchers::{Change, Input, spawn_watchers};
use svcnet_store::local_etcd::{LocalEtcd, etcd_binary};

use common::free_port;
use tokio::sync::mpsc;

/// The annotation that marks a measured change; its value names the change.
const PROBE: &str = "s13.svcnet.io/probe";
/// In-flight API writes while the objects are created.
const WRITERS: usize = 32;
/// How long one change may take to reach every hollow node before the bench gives up on it.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone, Copy)]
struct Params {
    nodes: usize,
    services: usize,
    endpoints: usize,
    changes: usize,
    clients: usize,
    wave: usize,
    lists: usize,
    watches: usize,
}

impl Params {
    fn from_env() -> Self {
        Self {
            nodes: env_usize("S13_NODES", 1000),
            services: env_usize("S13_SERVICES", 10_000).max(1),
            endpoints: env_usize("S13_ENDPOINTS", 50_000),
            changes: env_usize("S13_CHANGES", 20).max(1),
            clients: env_usize("S13_CLIENTS", 4).max(1),
            wave: env_usize("S13_WAVE", 50).max(1),
            lists: env_usize("S13_LISTS", 5).max(1),
            // 100, not fewer: a p99 of 20 starts is their slowest one (one scheduling hiccup).
            watches: env_usize("S13_WATCHES", 100).max(1),
        }
    }

    /// Endpoints of service `i` (the total spread evenly).
    fn endpoints_of(&self, i: usize) -> usize {
        self.endpoints / self.services + usize::from(i < self.endpoints % self.services)
    }
}

/// Endpoint `j` of service `i`: 10.171.0.0/16 and up, outside every range of the cluster.
fn endpoint_ip(i: usize, j: usize, p: &Params) -> Ipv4Addr {
    let before = i * (p.endpoints / p.services) + i.min(p.endpoints % p.services);
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 171, 0, 0)) + (before + j) as u32 + 1)
}

fn endpoints_json(i: usize, p: &Params, first_ready: bool) -> Vec<Value> {
    (0..p.endpoints_of(i))
        .map(|j| {
            json!({"addresses": [endpoint_ip(i, j, p).to_string()],
                   "conditions": {"ready": j != 0 || first_ready},
                   "nodeName": format!("s13-node-{}", j % p.nodes.max(1))})
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Processes: the API servers and etcd, killed when dropped.

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_apiserver(data_dir: &Path, etcd: Option<&str>) -> Server {
    let addr = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_svcnet"));
    cmd.arg("apiserver")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", &addr.to_string()]);
    if let Some(endpoints) = etcd {
        cmd.args(["--etcd-servers", endpoints]);
    }
    // The API servers run with the allocator's defaults whatever the hollow nodes' process was
    // given (`MALLOC_ARENA_MAX=2` fits 1,000 full-size hollow nodes on a 23 GiB machine).
    let child = cmd
        .env("RUST_LOG", "warn")
        .env_remove("MALLOC_ARENA_MAX")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("svcnet apiserver started");
    Server { child, addr }
}

/// A client for `server`, with the data dir's admin credentials, once it answers.
async fn client_for(data_dir: &Path, server: &mut Server) -> Client {
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("svcnet apiserver exited: {status}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "svcnet apiserver on {} not ready in 60 s",
            server.addr
        );
        if let Ok(client) = try_client(&data_dir.join("kubeconfig"), server.addr).await
            && client.apiserver_version().await.is_ok()
        {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn try_client(kubeconfig: &Path, addr: SocketAddr) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    config.cluster_url = format!("https://{addr}").parse()?;
    config.read_timeout = None;
    Ok(Client::try_from(config)?)
}

/// Resident set (now and peak, MiB) and CPU seconds (user + system) of a process.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    rss_mib: f64,
    peak_mib: f64,
    cpu_s: f64,
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, o: Usage) -> Usage {
        Usage {
            rss_mib: self.rss_mib + o.rss_mib,
            peak_mib: self.peak_mib + o.peak_mib,
            cpu_s: self.cpu_s + o.cpu_s,
        }
    }
}

fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let hz = clock_ticks();
    Usage {
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_mib: kib("VmHWM:") / 1024.0,
        cpu_s: (ticks(11) + ticks(12)) / hz,
    }
}

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> f64 {
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// This process's children named `etcd` (the members `LocalEtcd` started).
fn etcd_children() -> Vec<u32> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            head.ends_with("(etcd") && rest.split_whitespace().nth(1) == Some(me.as_str())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Hollow nodes.

/// When each hollow node first had each marked change in its state.
#[derive(Default)]
struct Seen {
    at: Mutex<HashMap<String, Vec<Instant>>>,
}

impl Seen {
    fn record(&self, probe: &str, now: Instant) {
        self.at
            .lock()
            .unwrap()
            .entry(probe.to_string())
            .or_default()
            .push(now);
    }
    fn count(&self, probe: &str) -> usize {
        self.at.lock().unwrap().get(probe).map_or(0, Vec::len)
    }
    fn take(&self, probe: &str) -> Vec<Instant> {
        self.at.lock().unwrap().remove(probe).unwrap_or_default()
    }
}

fn probe_of<K: Resource>(o: &K) -> Option<String> {
    o.meta().annotations.as_ref()?.get(PROBE).cloned()
}

/// One hollow node: the proxy's watchers feed its pure state; the "dataplane" takes the
/// changes after every batch, as a sync would, and records marked changes. Sends the time both
/// lists were synced on `synced`.
async fn hollow_node(
    client: Client,
    name: String,
    seen: Arc<Seen>,
    synced: mpsc::UnboundedSender<Instant>,
) {
    let cfg = svcnet_proxyd::ProxyConfig {
        node_name: name,
        ..Default::default()
    };
    let mut state = ProxyState::new(cfg.core());
    let (tx, mut rx) = mpsc::channel(1024);
    let mut tasks = tokio::task::JoinSet::new();
    spawn_watchers(client, &cfg.node_name, tx, &mut tasks);
    let mut recorded: HashSet<String> = HashSet::new();
    let mut kinds = HashSet::new();
    let mut synced = Some(synced);
    while let Some(first) = rx.recv().await {
        let mut input = Some(first);
        while let Some(i) = input.take() {
            let probe = match &i {
                Input::Service(Change::Upsert(s)) => probe_of(s.as_ref()),
                Input::Slice(Change::Upsert(s)) => probe_of(s.as_ref()),
                _ => None,
            };
            match i {
                Input::Service(Change::Upsert(s)) => {
                    let _ = state.update_service(&s);
                }
                Input::Service(Change::Delete { namespace, name }) => {
                    state.delete_service(&NamespacedName::new(namespace, name))
                }
                Input::Slice(Change::Upsert(s)) => state.update_slice(&s),
                Input::Slice(Change::Delete { namespace, name }) => {
                    state.delete_slice(&namespace, &name)
                }
                Input::Node(Change::Upsert(n)) => state.update_node(&n),
                Input::Node(Change::Delete { .. }) | Input::Seen(..) => {}
                Input::Synced(kind) => {
                    kinds.insert(kind);
                    if kinds.contains("services")
                        && kinds.contains("endpointslices")
                        && let Some(tx) = synced.take()
                    {
                        let _ = tx.send(Instant::now());
                    }
                }
            }
            if let Some(p) = probe
                && recorded.insert(p.clone())
            {
                seen.record(&p, Instant::now());
            }
            input = rx.try_recv().ok();
        }
        // The no-op dataplane's sync: the batch's changes are consumed.
        let _ = state.take_changes();
    }
}

// ---------------------------------------------------------------------------------------------
// The run on one back end.

/// Figures of one back end, by name, in print order.
type Figures = Vec<(String, f64)>;

fn pct(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Backend {
    servers: Vec<Server>,
    clients: Vec<Client>,
    _etcd: Option<LocalEtcd>,
    /// The data dir (PKI, kubeconfig, store.redb); removed when dropped.
    dir: tempfile::TempDir,
}

impl Backend {
    fn server_usage(&self) -> Usage {
        self.servers
            .iter()
            .map(|s| usage(s.child.id()))
            .fold(Usage::default(), |a, b| a + b)
    }
    fn etcd_usage(&self) -> Usage {
        etcd_children()
            .into_iter()
            .map(usage)
            .fold(Usage::default(), |a, b| a + b)
    }
}

async fn start_redb() -> Backend {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut server = spawn_apiserver(dir.path(), None);
    let client = client_for(dir.path(), &mut server).await;
    Backend {
        servers: vec![server],
        clients: vec![client],
        _etcd: None,
        dir,
    }
}

async fn start_etcd(bin: &Path) -> Backend {
    let dir = tempfile::tempdir().expect("a temp dir");
    let etcd = LocalEtcd::start(bin, 3).await.expect("a 3-member etcd");
    let endpoints = etcd.endpoints().join(",");
    // One after the other: the first creates the data dir's PKI, the second uses it.
    let mut first = spawn_apiserver(dir.path(), Some(&endpoints));
    let c1 = client_for(dir.path(), &mut first).await;
    let mut second = spawn_apiserver(dir.path(), Some(&endpoints));
    let c2 = client_for(dir.path(), &mut second).await;
    Backend {
        servers: vec![first, second],
        clients: vec![c1, c2],
        _etcd: Some(etcd),
        dir,
    }
}

async fn populate(client: &Client, p: &Params) -> Duration {
    let started = Instant::now();
    let name = |i: usize| format!("s13-{i}");
    common::bulk::services_with_slices(client, p.services, WRITERS, name, |i| {
        endpoints_json(i, p, true)
    })
    .await
    .expect("objects created");
    started.elapsed()
}

/// Starts the hollow nodes in waves; returns their tasks and each one's start-to-synced time.
async fn start_nodes(
    pools: &[Client],
    p: &Params,
    seen: &Arc<Seen>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Vec<f64> {
    let mut times = Vec::new();
    let mut next = 0;
    while next < p.nodes {
        let wave = p.wave.min(p.nodes - next);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let started = Instant::now();
        for n in next..next + wave {
            let client = pools[n % pools.len()].clone();
            tasks.spawn(hollow_node(
                client,
                format!("s13-node-{n}"),
                seen.clone(),
                tx.clone(),
            ));
        }
        drop(tx);
        for _ in 0..wave {
            let at = tokio::time::timeout(Duration::from_secs(600), rx.recv())
                .await
                .expect("a hollow node synced within 10 min")
                .expect("hollow nodes run");
            times.push(ms(at - started));
        }
        next += wave;
    }
    times
}

/// Makes the marked changes one at a time; returns, per change, the time to the last hollow
/// node, and every node's time.
async fn changes(client: &Client, p: &Params, seen: &Seen, endpoint: bool) -> (Vec<f64>, Vec<f64>) {
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    let (mut all, mut each) = (Vec::new(), Vec::new());
    for k in 0..p.changes {
        let i = k * p.services / p.changes;
        let probe = format!("{}-{k}", if endpoint { "ep" } else { "svc" });
        let meta = json!({"annotations": {PROBE: probe}});
        let t0 = Instant::now();
        if endpoint {
            let patch = json!({"metadata": meta, "endpoints": endpoints_json(i, p, k % 2 == 1)});
            slices
                .patch(
                    &format!("s13-{i}-1"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .expect("slice patched");
        } else {
            let affinity = if k % 2 == 0 { "ClientIP" } else { "None" };
            let patch = json!({"metadata": meta, "spec": {"sessionAffinity": affinity}});
            svcs.patch(
                &format!("s13-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .expect("service patched");
        }
        while seen.count(&probe) < p.nodes && t0.elapsed() < CHANGE_TIMEOUT {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let times = seen.take(&probe);
        assert_eq!(
            times.len(),
            p.nodes,
            "change {probe} reached {} of {} hollow nodes in {CHANGE_TIMEOUT:?}",
            times.len(),
            p.nodes
        );
        let lat: Vec<f64> = times
            .iter()
            .map(|t| ms(t.saturating_duration_since(t0)))
            .collect();
        all.push(lat.iter().copied().fold(0.0, f64::max));
        each.extend(lat);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (all, each)
}

async fn list_latency<K>(client: &Client, n: usize) -> Vec<f64>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let mut out = Vec::new();
    for _ in 0..n {
        let t0 = Instant::now();
        api.list(&ListParams::default()).await.expect("listed");
        out.push(ms(t0.elapsed()));
    }
    out
}

async fn watch_latency<K>(client: &Client, n: usize) -> Vec<f64>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let rv = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .expect("listed")
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut out = Vec::new();
    for _ in 0..n {
        let t0 = Instant::now();
        let stream = api
            .watch(&WatchParams::default(), &rv)
            .await
            .expect("watching");
        out.push(ms(t0.elapsed()));
        drop(stream);
    }
    out
}

async fn run_backend(name: &str, backend: Backend, p: &Params) -> Figures {
    let mut f: Figures = Vec::new();
    let writer = backend.clients[0].clone();
    let u0 = backend.server_usage();
    let took = populate(&writer, p).await;
    let u1 = backend.server_usage();
    eprintln!(
        "s13 {name}: {} services and slices created in {:.1} s",
        p.services,
        took.as_secs_f64()
    );
    f.push((
        "create: objects/s".into(),
        (2 * p.services) as f64 / took.as_secs_f64(),
    ));

    // Client pools: `clients` per API server, the hollow nodes spread over all of them.
    let mut pools = Vec::new();
    for _ in 0..p.clients {
        for (s, server) in backend.servers.iter().enumerate() {
            pools.push(
                try_client(&backend.dir.path().join("kubeconfig"), server.addr)
                    .await
                    .unwrap_or_else(|e| panic!("client for server {s}: {e}")),
            );
        }
    }
    let seen = Arc::new(Seen::default());
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    let start_times = start_nodes(&pools, p, &seen, &mut tasks).await;
    let u2 = backend.server_usage();
    let me2 = usage(std::process::id());
    eprintln!(
        "s13 {name}: {} hollow nodes synced in {:.1} s",
        p.nodes,
        started.elapsed().as_secs_f64()
    );
    f.push((
        "node start to synced p50 ms".into(),
        pct(start_times.clone(), 0.5),
    ));
    f.push(("node start to synced p99 ms".into(), pct(start_times, 0.99)));

    let (svc_all, svc_each) = changes(&writer, p, &seen, false).await;
    let (ep_all, ep_each) = changes(&writer, p, &seen, true).await;
    let u3 = backend.server_usage();
    let me3 = usage(std::process::id());
    f.push((
        "service change, all nodes p50 ms".into(),
        pct(svc_all.clone(), 0.5),
    ));
    f.push((
        "service change, all nodes p99 ms".into(),
        pct(svc_all, 0.99),
    ));
    f.push((
        "service change, per node p50 ms".into(),
        pct(svc_each.clone(), 0.5),
    ));
    f.push((
        "service change, per node p99 ms".into(),
        pct(svc_each, 0.99),
    ));
    f.push((
        "endpoint change, all nodes p50 ms".into(),
        pct(ep_all.clone(), 0.5),
    ));
    f.push((
        "endpoint change, all nodes p99 ms".into(),
        pct(ep_all, 0.99),
    ));
    f.push((
        "endpoint change, per node p50 ms".into(),
        pct(ep_each.clone(), 0.5),
    ));
    f.push((
        "endpoint change, per node p99 ms".into(),
        pct(ep_each, 0.99),
    ));

    let reader = &pools[pools.len() - 1];
    let lists_s = list_latency::<Service>(reader, p.lists).await;
    let lists_e = list_latency::<EndpointSlice>(reader, p.lists).await;
    f.push(("list services p50 ms".into(), pct(lists_s.clone(), 0.5)));
    f.push(("list services max ms".into(), pct(lists_s, 1.0)));
    f.push((
        "list endpointslices p50 ms".into(),
        pct(lists_e.clone(), 0.5),
    ));
    f.push(("list endpointslices max ms".into(), pct(lists_e, 1.0)));
    let mut watches = watch_latency::<Service>(reader, p.watches).await;
    watches.extend(watch_latency::<EndpointSlice>(reader, p.watches).await);
    f.push(("watch start p50 ms".into(), pct(watches.clone(), 0.5)));
    f.push(("watch start p99 ms".into(), pct(watches, 0.99)));

    let u4 = backend.server_usage();
    f.push(("apiserver CPU s: create".into(), u1.cpu_s - u0.cpu_s));
    f.push(("apiserver CPU s: nodes start".into(), u2.cpu_s - u1.cpu_s));
    f.push(("apiserver CPU s: changes".into(), u3.cpu_s - u2.cpu_s));
    f.push(("apiserver CPU s: whole run".into(), u4.cpu_s));
    f.push(("apiserver RSS MiB (sum, end)".into(), u4.rss_mib));
    f.push(("apiserver RSS MiB (sum, peak)".into(), u4.peak_mib));
    let e = backend.etcd_usage();
    f.push(("etcd members CPU s (sum)".into(), e.cpu_s));
    f.push(("etcd members RSS MiB (sum, peak)".into(), e.peak_mib));
    f.push(("hollow nodes CPU s: changes".into(), me3.cpu_s - me2.cpu_s));
    let me = usage(std::process::id());
    f.push((
        "hollow nodes RSS MiB per node".into(),
        me.rss_mib / p.nodes.max(1) as f64,
    ));
    tasks.shutdown().await;
    drop(backend);
    f
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let p = Params::from_env();
    let which = std::env::var("S13_BACKENDS").unwrap_or_else(|_| "redb,etcd".into());
    let backends: Vec<&str> = ["redb", "etcd"]
        .into_iter()
        .filter(|b| which.contains(b))
        .collect();
    eprintln!("s13: {p:?}; load average before: {}", load());
    if let [one] = backends[..] {
        let figures = run_one(one, &p);
        match std::env::var_os("S13_FIGURES") {
            Some(path) => write_figures(&path, &figures),
            None => report(&p, &figures),
        }
        return;
    }
    // Each back end in a process of its own, one after the other, this binary started again:
    // at the full size the hollow nodes of one back end hold 16 GiB, which the process does
    // not give back for the next one's (glibc keeps most of it mapped).
    let mut results = BTreeMap::new();
    let mut failed = Vec::new();
    for backend in backends {
        match run_child(backend) {
            Ok(figures) => {
                results.extend(figures);
            }
            Err(e) => failed.push(format!("{backend}: {e}")),
        }
    }
    report(&p, &results);
    assert!(failed.is_empty(), "back ends that failed: {failed:?}");
}

/// One back end's run in this process; its figures by back end (none when etcd is missing).
fn run_one(backend: &'static str, p: &Params) -> BTreeMap<&'static str, Figures> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut results = BTreeMap::new();
    runtime.block_on(async {
        if backend == "redb" {
            let b = start_redb().await;
            results.insert("redb", run_backend("redb", b, p).await);
        } else {
            match etcd_binary() {
                Some(bin) => {
                    let b = start_etcd(&bin).await;
                    results.insert("etcd", run_backend("etcd", b, p).await);
                }
                None => eprintln!("s13: no etcd binary on PATH (SVCNET_ETCD_BIN): etcd skipped"),
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    results
}

/// Runs this bench again for `backend` alone and reads the figures it writes.
fn run_child(backend: &str) -> Result<BTreeMap<&'static str, Figures>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("figures");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("S13_BACKENDS", backend)
        .env("S13_FIGURES", &path)
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("its process ended with {status}"));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    let mut results = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split('\t');
        let (Some(name), Some(figure), Some(value)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("a figures line {line:?}"));
        };
        let name = match name {
            "redb" => "redb",
            "etcd" => "etcd",
            other => return Err(format!("a back end {other:?}")),
        };
        let value: f64 = value.parse().map_err(|_| format!("a figure {line:?}"))?;
        results
            .entry(name)
            .or_insert_with(Vec::new)
            .push((figure.to_string(), value));
    }
    Ok(results)
}

/// Figures as `backend<TAB>figure<TAB>value` lines, for the parent run.
fn write_figures(path: &std::ffi::OsStr, results: &BTreeMap<&str, Figures>) {
    let mut text = String::new();
    for (backend, figures) in results {
        for (figure, value) in figures {
            text.push_str(&format!("{backend}\t{figure}\t{value}\n"));
        }
    }
    std::fs::write(path, text).expect("figures written");
}

fn report(p: &Params, results: &BTreeMap<&str, Figures>) {
    let empty = Vec::new();
    let redb = results.get("redb").unwrap_or(&empty);
    let etcd = results.get("etcd").unwrap_or(&empty);
    let rows = if redb.is_empty() { etcd } else { redb };
    println!(
        "\nS13: {} hollow nodes, {} services, {} endpoints; {} changes of each kind; load average now {}",
        p.nodes,
        p.services,
        p.endpoints,
        p.changes,
        load()
    );
    println!(
        "{:<36} {:>12} {:>12} {:>10}",
        "figure", "redb (1)", "etcd (2+3)", "etcd/redb"
    );
    let get = |f: &Figures, k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    for (name, _) in rows {
        let (a, b) = (get(redb, name), get(etcd, name));
        let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let ratio = match (a, b) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.2}", b / a),
            _ => "-".into(),
        };
        println!("{name:<36} {:>12} {:>12} {ratio:>10}", cell(a), cell(b));
    }
    // kube-up's heuristic, `--target-ram-mb=$((NUM_NODES * 60))` (kubernetes
    // cluster/gce/gci/configure-helper.sh; kubernetes#34000: "120GB machines for 2000 nodes ...
    // ~60MB of capacity per node").
    let rule = 60.0 * p.nodes as f64;
    println!(
        "kube-apiserver rule of thumb: --target-ram-mb = 60 MB x {} nodes = {rule:.0} MB (per server)",
        p.nodes
    );
    for (backend, f) in [("redb", redb), ("etcd", etcd)] {
        let Some(peak) = get(f, "apiserver RSS MiB (sum, peak)") else {
            continue;
        };
        let servers = if backend == "etcd" { 2.0 } else { 1.0 };
        let fanout = [
            "service change, all nodes p99 ms",
            "endpoint change, all nodes p99 ms",
        ]
        .iter()
        .filter_map(|k| get(f, k))
        .fold(0.0, f64::max);
        println!(
            "{backend}: p99 fan-out {fanout:.0} ms (goal <= 1000: {}); API server peak RSS {:.0} MiB per server (rule {rule:.0} MB: {})",
            if fanout <= 1000.0 { "met" } else { "missed" },
            peak / servers,
            if peak / servers * 1.048_576 <= rule {
                "within"
            } else {
                "over"
            },
        );
    }
    if !redb.is_empty() && !etcd.is_empty() {
        let over: Vec<&str> = redb
            .iter()
            .filter(|(n, _)| !n.starts_with("etcd members") && !n.starts_with("hollow"))
            .filter_map(|(n, a)| {
                let b = get(etcd, n)?;
                // Higher is better only for the create rate.
                let worse = if n.starts_with("create") {
                    *a > 2.0 * b
                } else {
                    b > 2.0 * a
                };
                worse.then_some(n.as_str())
            })
            .collect();
        println!(
            "etcd within 2x of redb on every figure: {}",
            if over.is_empty() {
                "yes".to_string()
            } else {
                format!("no: {}", over.join("; "))
            }
        );
    }
}
