//! Two `svcnet apiserver` processes on one 3-member etcd (Debian's `etcd` on loopback, unique
//! ports and data dirs per test), sharing one data dir's PKI, driven by the real kubectl and by
//! kube-rs:
//!
//! - kubectl through either server sees the same objects at the same resourceVersions;
//! - a watch through server A sees writes made through B, in order;
//! - a paged list continues on the other server (the token is a revision and a key);
//! - 1,000 NodePort services created concurrently through both servers never share a cluster
//!   IP or a node port; an address freed through one server can be asked for through the
//!   other at once;
//! - the `kubernetes` endpoints name both servers, and a killed server's address goes after
//!   its lease TTL;
//! - killing a server mid-watch: the watch resumes on the other from its last resourceVersion,
//!   with no event missed or repeated;
//! - SIGKILL of every svcnet process during concurrent writes, then a restart, in rounds: every
//!   acknowledged service is there with the address it was given, and no address is doubled.
//!
//! Skipped with a printed reason when the `etcd` binary is missing (a failure under
//! `SVCNET_REQUIRE_ETCD=1`).
#![allow(clippy::unwrap_used)] // test: a failure here is a test failure

mod common;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{KUBECTL, free_port};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use svcnet_store::local_etcd::{LocalEtcd, etcd_for_test};

/// The servers' endpoint lease TTL: short, so a killed server's address goes quickly.
const LEASE_TTL: &str = "2s";

/// A 3-member etcd and the data dir (PKI, kubeconfig) the test's API servers share.
struct Cluster {
    _etcd: LocalEtcd,
    endpoints: String,
    data: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// `None` (after printing why) when the `etcd` binary is missing.
    async fn start(test: &str) -> Option<Cluster> {
        let bin = etcd_for_test(test)?;
        let etcd = LocalEtcd::start(&bin, 3).await.expect("etcd");
        let endpoints = etcd.endpoints().join(",");
        let dir = tempfile::tempdir().unwrap();
        Some(Cluster {
            _etcd: etcd,
            endpoints,
            data: dir.path().to_path_buf(),
            _dir: dir,
        })
    }

    /// An API server on this etcd and data dir, listening on `addr`.
    fn server(&self, addr: SocketAddr) -> Server {
        Server::start(&self.data, &self.endpoints, addr)
    }
}

/// One `svcnet apiserver` process; SIGKILLed and reaped on drop.
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

impl Server {
    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Starts a server on `addr` and waits until it answers `/readyz`.
    fn start(data: &Path, etcd: &str, addr: SocketAddr) -> Server {
        let mut server = Server {
            child: Command::new(env!("CARGO_BIN_EXE_svcnet"))
                .arg("apiserver")
                .arg("--data-dir")
                .arg(data)
                .args(["--listen", &addr.to_string(), "--etcd-servers", etcd])
                .args(["--endpoint-lease-ttl", LEASE_TTL])
                .args(["--node-port-range", "30000-32767"])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
            addr,
        };
        let started = Instant::now();
        loop {
            let out = kubectl(data, &server.url(), &["get", "--raw", "/readyz"]);
            if out.status.success() {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("svcnet apiserver on {addr} exited: {status}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "svcnet apiserver on {addr} not ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A kube-rs client for this server.
    async fn client(&self, data: &Path) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(data.join("kubeconfig")).unwrap();
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        config.cluster_url = self.url().parse().unwrap();
        kube::Client::try_from(config).unwrap()
    }
}

fn kubectl(data: &Path, server: &str, args: &[&str]) -> std::process::Output {
    Command::new(KUBECTL)
        .env("KUBECONFIG", data.join("kubeconfig"))
        .arg(format!("--server={server}"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(data: &Path, server: &str, args: &[&str]) -> String {
    let out = kubectl(data, server, args);
    assert!(
        out.status.success(),
        "kubectl {args:?} at {server} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A NodePort service.
fn nodeport(name: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"type": "NodePort", "selector": {"app": name},
                 "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap()
}

/// (cluster IP, node port) of a service.
fn addresses(svc: &Service) -> (String, i32) {
    let spec = svc.spec.as_ref().unwrap();
    let ip = spec.cluster_ip.clone().unwrap();
    let port = spec.ports.as_ref().unwrap()[0].node_port.unwrap();
    (ip, port)
}

/// Every service of the cluster, paged (`limit`), each page through the next server in turn.
async fn list_paged(clients: &[kube::Client]) -> Vec<Service> {
    let mut all = Vec::new();
    let mut token: Option<String> = None;
    let mut revision: Option<String> = None;
    for turn in 0.. {
        let api: Api<Service> = Api::all(clients[turn % clients.len()].clone());
        let mut lp = ListParams::default().limit(150);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await.unwrap();
        match &revision {
            None => revision = page.metadata.resource_version.clone(),
            Some(rv) => assert_eq!(page.metadata.resource_version.as_ref(), Some(rv)),
        }
        all.extend(page.items);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    all
}

/// No two services share a cluster IP or a node port.
fn assert_distinct(services: &[Service]) {
    let mut ips: BTreeMap<String, String> = BTreeMap::new();
    let mut ports: BTreeMap<i32, String> = BTreeMap::new();
    for svc in services {
        let name = format!(
            "{}/{}",
            svc.metadata.namespace.as_deref().unwrap_or(""),
            svc.metadata.name.as_deref().unwrap_or("")
        );
        let spec = svc.spec.as_ref().unwrap();
        if let Some(ip) = spec.cluster_ip.clone().filter(|ip| ip != "None")
            && let Some(other) = ips.insert(ip.clone(), name.clone())
        {
            panic!("{name} and {other} share the cluster IP {ip}");
        }
        for p in spec.ports.iter().flatten() {
            if let Some(np) = p.node_port
                && let Some(other) = ports.insert(np, name.clone())
            {
                panic!("{name} and {other} share the node port {np}");
            }
        }
    }
}

/// The (port, ips) the `kubernetes` Endpoints name.
async fn kubernetes_endpoints(client: &kube::Client) -> Vec<(i32, Vec<String>)> {
    let api: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    let ep = api.get("kubernetes").await.unwrap();
    ep.subsets
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let port = s.ports.unwrap_or_default()[0].port;
            let ips = s
                .addresses
                .unwrap_or_default()
                .into_iter()
                .map(|a| a.ip)
                .collect();
            (port, ips)
        })
        .collect()
}

async fn wait_async<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Names of ADDED events from a watch stream until `count` are seen (failing on anything but
/// ADDED and bookmarks), with the last resourceVersion.
async fn added<S>(stream: &mut S, count: usize) -> (Vec<String>, String)
where
    S: futures::Stream<Item = kube::Result<WatchEvent<Service>>> + Unpin,
{
    let mut names = Vec::new();
    let mut rv = String::new();
    while names.len() < count {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("a watch event in time")
            .expect("the watch stream goes on")
            .unwrap();
        match event {
            WatchEvent::Added(svc) => {
                rv = svc.metadata.resource_version.clone().unwrap();
                names.push(svc.metadata.name.unwrap());
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected watch event {other:?}"),
        }
    }
    (names, rv)
}

/// A watch from the current resourceVersion of `api`'s list.
async fn watch_from_now(
    api: &Api<Service>,
) -> futures::stream::BoxStream<'static, kube::Result<WatchEvent<Service>>> {
    let from = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed()
}

/// NodePort services of these names, one after the other.
async fn create_all(api: &Api<Service>, names: Vec<String>) {
    for n in names {
        api.create(&PostParams::default(), &nodeport(&n))
            .await
            .unwrap();
    }
}

fn names(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i:02}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_apiservers_on_one_etcd_serve_one_cluster() {
    let Some(cluster) = Cluster::start("two_apiservers_on_one_etcd_serve_one_cluster").await else {
        return;
    };
    let data = cluster.data.clone();
    let a = cluster.server(free_port());
    let b_addr = free_port();
    let mut b = Some(cluster.server(b_addr));
    let (ca, cb) = (
        a.client(&data).await,
        b.as_ref().unwrap().client(&data).await,
    );
    let (ua, ub) = (a.url(), b.as_ref().unwrap().url());

    // kubectl through either server: the same object at the same resourceVersion.
    ok(&data, &ub, &["create", "namespace", "multi"]);
    ok(
        &data,
        &ub,
        &[
            "create", "service", "nodeport", "web", "--tcp=80", "-n", "multi",
        ],
    );
    let view = |server: &str| {
        ok(
            &data,
            server,
            &[
                "get",
                "service",
                "web",
                "-n",
                "multi",
                "-o",
                "jsonpath={.metadata.resourceVersion} {.spec.clusterIP} {.spec.ports[0].nodePort}",
            ],
        )
    };
    assert_eq!(view(&ua), view(&ub));
    ok(
        &data,
        &ua,
        &["label", "service", "web", "-n", "multi", "t=1"],
    );
    assert_eq!(view(&ua), view(&ub));

    // A watch through A sees writes made through B, in order.
    let multi_a: Api<Service> = Api::namespaced(ca.clone(), "multi");
    let multi_b: Api<Service> = Api::namespaced(cb.clone(), "multi");
    let mut watch_a = watch_from_now(&multi_a).await;
    create_all(&multi_b, names("b", 0..20)).await;
    assert_eq!(added(&mut watch_a, 20).await.0, names("b", 0..20));
    drop(watch_a);

    // Both servers are in the `kubernetes` endpoints.
    let (pa, pb) = (i32::from(a.addr.port()), i32::from(b_addr.port()));
    wait_async(
        "both servers in the kubernetes endpoints",
        Duration::from_secs(10),
        || {
            let ca = ca.clone();
            async move {
                let eps = kubernetes_endpoints(&ca).await;
                let ports: Vec<i32> = eps.iter().map(|(p, _)| *p).collect();
                (ports.contains(&pa) && ports.contains(&pb)).then_some(())
            }
        },
    )
    .await;

    // Killed mid-watch: the watch resumes on the other server from its last resourceVersion.
    let mut watch_b = watch_from_now(&multi_b).await;
    create_all(&multi_a, names("w", 0..10)).await;
    let (mut seen, last) = added(&mut watch_b, 5).await;
    drop(b.take()); // SIGKILL
    drop(watch_b);
    let mut resumed = multi_a
        .watch(&WatchParams::default(), &last)
        .await
        .unwrap()
        .boxed();
    create_all(&multi_a, names("w", 10..20)).await;
    seen.extend(added(&mut resumed, 15).await.0);
    assert_eq!(seen, names("w", 0..20), "no gap, no repeat across servers");
    drop(resumed);

    // The killed server's address leaves the `kubernetes` endpoints after its lease TTL.
    let started = Instant::now();
    wait_async(
        "the killed server's address to go",
        Duration::from_secs(15),
        || {
            let ca = ca.clone();
            async move {
                let eps = kubernetes_endpoints(&ca).await;
                (eps.len() == 1 && eps[0].0 == pa).then_some(())
            }
        },
    )
    .await;
    eprintln!(
        "the killed server left the kubernetes endpoints {:.1} s after SIGKILL (TTL {LEASE_TTL})",
        started.elapsed().as_secs_f64()
    );

    // 1,000 services created concurrently through both servers (16 in flight): no shared
    // cluster IP or node port.
    let b = cluster.server(b_addr);
    let cb = b.client(&data).await;
    ok(&data, &ua, &["create", "namespace", "load"]);
    let apis = [
        Api::<Service>::namespaced(ca.clone(), "load"),
        Api::<Service>::namespaced(cb.clone(), "load"),
    ];
    let started = Instant::now();
    let created: Vec<Service> = futures::stream::iter(0..1000)
        .map(|i| {
            let api = apis[i % 2].clone();
            async move {
                api.create(&PostParams::default(), &nodeport(&format!("s{i:04}")))
                    .await
            }
        })
        .buffer_unordered(16)
        .try_collect()
        .await
        .unwrap();
    eprintln!(
        "1,000 NodePort services through two API servers: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_distinct(&created);
    // What each create answered is what both servers list; the list is paged across them.
    let listed = list_paged(&[ca.clone(), cb.clone()]).await;
    assert_distinct(&listed);
    let by_name: BTreeMap<String, (String, i32)> = listed
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some("load"))
        .map(|s| (s.metadata.name.clone().unwrap(), addresses(s)))
        .collect();
    assert_eq!(by_name.len(), 1000);
    for svc in &created {
        assert_eq!(
            by_name.get(svc.metadata.name.as_deref().unwrap()),
            Some(&addresses(svc))
        );
    }
    // kubectl agrees through either server, resourceVersions included.
    let table = |server: &str| {
        ok(
            &data,
            server,
            &[
                "get",
                "services",
                "-n",
                "load",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.metadata.resourceVersion}{\"\\n\"}{end}",
            ],
        )
    };
    assert_eq!(table(&ua), table(&b.url()));

    // A server admits a create on the ranges as it last wrote them, which the other server may
    // have changed since: B believes the addresses of `freed` taken after A deleted it, and a
    // create through B that asks for exactly those is still decided on what etcd holds.
    let (load_a, load_b) = (
        apis[0].clone(),
        Api::<Service>::namespaced(cb.clone(), "load"),
    );
    let freed = load_b
        .create(&PostParams::default(), &nodeport("freed"))
        .await
        .unwrap();
    let (ip, port) = addresses(&freed);
    load_a.delete("freed", &Default::default()).await.unwrap();
    let mut again = nodeport("again");
    let spec = again.spec.as_mut().unwrap();
    spec.cluster_ip = Some(ip.clone());
    spec.ports.as_mut().unwrap()[0].node_port = Some(port);
    let again = load_b
        .create(&PostParams::default(), &again)
        .await
        .unwrap_or_else(|e| panic!("{ip} / {port}, freed through A, asked for through B: {e}"));
    assert_eq!(addresses(&again), (ip, port));
    drop(b);
    drop(a);
    drop(cluster);
}

/// Creates services through `servers` in turn (4 in flight) until stopped; records the
/// acknowledged ones with their addresses.
fn writer(
    clients: Vec<kube::Client>,
    round: usize,
    acked: Arc<Mutex<BTreeMap<String, (String, i32)>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = futures::stream::iter(0..)
            .map(|i: usize| {
                let api: Api<Service> =
                    Api::namespaced(clients[i % clients.len()].clone(), "crash");
                let acked = acked.clone();
                async move {
                    let name = format!("r{round}-{i:04}");
                    if let Ok(svc) = api.create(&PostParams::default(), &nodeport(&name)).await {
                        acked.lock().unwrap().insert(name, addresses(&svc));
                    }
                }
            })
            .buffer_unordered(4)
            .take(100_000)
            .collect::<Vec<()>>()
            .await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_of_every_apiserver_during_writes_loses_nothing_and_doubles_nothing() {
    let Some(cluster) = Cluster::start(
        "sigkill_of_every_apiserver_during_writes_loses_nothing_and_doubles_nothing",
    )
    .await
    else {
        return;
    };
    let data = cluster.data.clone();
    let addrs = [free_port(), free_port()];
    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    for round in 0..3 {
        let servers: Vec<Server> = addrs.iter().map(|a| cluster.server(*a)).collect();
        let mut clients = Vec::new();
        for s in &servers {
            clients.push(s.client(&data).await);
        }
        if round == 0 {
            ok(&data, &servers[0].url(), &["create", "namespace", "crash"]);
        }
        // What was acknowledged before is there, at the address it was given.
        let listed = list_paged(&clients).await;
        assert_distinct(&listed);
        let stored: BTreeMap<String, (String, i32)> = listed
            .iter()
            .filter(|s| s.metadata.namespace.as_deref() == Some("crash"))
            .map(|s| (s.metadata.name.clone().unwrap(), addresses(s)))
            .collect();
        for (name, addr) in acked.lock().unwrap().iter() {
            assert_eq!(
                stored.get(name),
                Some(addr),
                "acknowledged {name} after SIGKILL"
            );
        }
        // Write through both, then SIGKILL both mid-write.
        let before = acked.lock().unwrap().len();
        let task = writer(clients, round, acked.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while acked.lock().unwrap().len() < before + 60 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(servers);
        tokio::time::sleep(Duration::from_millis(200)).await;
        task.abort();
        let _ = task.await;
        assert!(
            acked.lock().unwrap().len() >= before + 60,
            "round {round}: writes were acknowledged"
        );
    }
    // After the last crash: everything acknowledged is there, and new services still get
    // addresses no one holds (the ranges were repaired, not reset).
    let servers: Vec<Server> = addrs.iter().map(|a| cluster.server(*a)).collect();
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(s.client(&data).await);
    }
    for i in 0..40 {
        let api: Api<Service> = Api::namespaced(clients[i % 2].clone(), "crash");
        api.create(&PostParams::default(), &nodeport(&format!("after-{i:02}")))
            .await
            .unwrap();
    }
    let listed = list_paged(&clients).await;
    assert_distinct(&listed);
    let stored: HashSet<String> = listed
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    let acked = acked.lock().unwrap();
    assert!(acked.keys().all(|n| stored.contains(n)));
    eprintln!(
        "3 rounds of SIGKILL during writes: {} acknowledged services, all kept, no address doubled",
        acked.len()
    );
    drop(servers);
    drop(cluster);
}

/// A kubeconfig like the data dir's, pointing at `server`.
fn kubeconfig_for(data: &Path, server: &str, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(data.join("kubeconfig")).unwrap();
    let text: String = text
        .lines()
        .map(|l| match l.trim_start().strip_prefix("server:") {
            Some(_) => format!("    server: {server}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = data.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, text).unwrap();
    path
}

/// A controller-manager process (3 s lease) and its log; SIGKILLed and reaped on drop.
struct ControllerManager(Child, PathBuf);

impl Drop for ControllerManager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ControllerManager {
    /// Its candidate identity, from its start-up log line.
    fn identity(&self) -> Option<String> {
        let log = std::fs::read_to_string(&self.1).ok()?;
        let line = log
            .lines()
            .find(|l| l.contains("candidate for the controller-manager lease"))?;
        let rest = &line[line.find("identity=")? + "identity=".len()..];
        Some(rest.split_whitespace().next()?.to_string())
    }
}

/// The ready addresses of `svc`'s EndpointSlices, sorted.
async fn slice_addresses(client: &kube::Client, svc: &str) -> Vec<String> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let mut got: Vec<String> = api
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|s| s.endpoints)
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .filter_map(|e| e.addresses.first().cloned())
        .collect();
    got.sort();
    got
}

/// Waits until `mc-web`'s EndpointSlices list exactly these ready addresses.
async fn wait_slice(client: &kube::Client, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    wait_async(
        &format!("the EndpointSlice to list {want:?}"),
        Duration::from_secs(20),
        || {
            let (client, want) = (client.clone(), want.clone());
            async move { (slice_addresses(&client, "mc-web").await == want).then_some(()) }
        },
    )
    .await;
}

/// A pod, then its status as a kubelet would set it: Running, Ready, with `ip`.
async fn ready_pod(client: &kube::Client, name: &str, ip: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "mc-web"}},
        "spec": {"nodeName": "mc-node", "containers": [{"name": "c", "image": "busybox",
                 "ports": [{"containerPort": 8080}]}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_managers_on_two_apiservers_hand_over_the_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    let Some(cluster) =
        Cluster::start("controller_managers_on_two_apiservers_hand_over_the_lease").await
    else {
        return;
    };
    let data = cluster.data.clone();
    let a = cluster.server(free_port());
    let b = cluster.server(free_port());
    let (ca, cb) = (a.client(&data).await, b.client(&data).await);
    // One controller-manager through each API server.
    let mut cms: Vec<Option<ControllerManager>> = [(&a, "cm-a"), (&b, "cm-b")]
        .iter()
        .map(|(server, name)| {
            let kubeconfig = kubeconfig_for(&data, &server.url(), name);
            let log = data.join(format!("{name}.log"));
            Some(ControllerManager(
                Command::new(env!("CARGO_BIN_EXE_svcnet"))
                    .arg("controller-manager")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["--leader-elect-lease-duration", "3s"])
                    .args(["--leader-elect-renew-deadline", "2s"])
                    .args(["--leader-elect-retry-period", "0.5s"])
                    .env("SVCNET_LOG", "info")
                    .env("NO_COLOR", "1")
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap(),
                log,
            ))
        })
        .collect();
    let leases: Api<Lease> = Api::namespaced(cb.clone(), "kube-system");
    let holder = || {
        let leases = leases.clone();
        async move {
            leases
                .get_opt("svcnet-controller-manager")
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| !h.is_empty())
        }
    };
    let first = wait_async("a leader", Duration::from_secs(20), holder).await;

    // The pods' node (the controllers leave out pods on nodes that do not exist).
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(ca.clone());
    let node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "mc-node"},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let services: Api<Service> = Api::namespaced(ca.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "mc-web"},
        "spec": {"selector": {"app": "mc-web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    ready_pod(&ca, "mc-web-1", "10.244.0.11").await;
    ready_pod(&cb, "mc-web-2", "10.244.0.12").await;
    wait_slice(&cb, &["10.244.0.11", "10.244.0.12"]).await;

    // SIGKILL the leader: the other takes the lease and its controllers follow new pods.
    let ids: Vec<String> = cms
        .iter()
        .map(|c| c.as_ref().and_then(ControllerManager::identity).unwrap())
        .collect();
    let leader = ids.iter().position(|id| *id == first).unwrap();
    let standby = ids[1 - leader].clone();
    let killed = Instant::now();
    drop(cms[leader].take());
    wait_async(
        "the standby to take the lease",
        Duration::from_secs(15),
        || {
            let standby = standby.clone();
            async move { (holder().await? == standby).then_some(()) }
        },
    )
    .await;
    eprintln!(
        "the lease moved to the controller-manager on the other API server {:.1} s after \
         SIGKILL of the leader (lease 3 s)",
        killed.elapsed().as_secs_f64()
    );
    ready_pod(&ca, "mc-web-3", "10.244.0.13").await;
    wait_slice(&ca, &["10.244.0.11", "10.244.0.12", "10.244.0.13"]).await;
    drop(cms);
    drop((a, b));
    drop(cluster);
}
