//! The agent against the real API server (in-process, over HTTPS with kube-rs) and the real
//! kernel: pods get namespaces, addresses, the test server, env vars, resolv.conf and hosts;
//! readiness probes drive Ready; crashing containers restart; deletion sends SIGTERM, waits
//! the grace period, SIGKILLs, and releases the namespace and the address.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::json;
use svcnet_agent::runtime::pod::PodRecord;
use svcnet_agent::test_support::Slot;
use svcnet_agent::topology::Topology;
use svcnet_agent::{AgentConfig, ip};

struct Env {
    server: svcnet_apiserver::RunningServer,
    client: Client,
    topo: Option<Topology>,
    cfg: AgentConfig,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    agent: Option<tokio::task::JoinHandle<()>>,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    _slot: Slot,
}

async fn client_for(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

impl Env {
    async fn start() -> Env {
        let slot = Slot::acquire().unwrap();
        let api_dir = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let server = svcnet_apiserver::start(svcnet_apiserver::ServerConfig {
            data_dir: api_dir.path().to_path_buf(),
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Default::default()
        })
        .await
        .unwrap();
        let client = client_for(server.kubeconfig_path()).await;
        let tcfg = slot.config(1, data.path().to_path_buf());
        let topo = tokio::task::spawn_blocking(move || Topology::create(tcfg))
            .await
            .unwrap()
            .unwrap();
        let mut cfg = AgentConfig::for_node(&topo, &topo.nodes()[0], data.path());
        cfg.test_server = env!("CARGO_BIN_EXE_svcnet-testserver").into();
        cfg.backoff = Duration::from_millis(200);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(svcnet_agent::run(client.clone(), cfg.clone(), async move {
            let _ = rx.await;
        }));
        let agent = tokio::spawn(async move { agent.await.unwrap().unwrap() });
        Env {
            server,
            client,
            topo: Some(topo),
            cfg,
            stop: Some(tx),
            agent: Some(agent),
            _dirs: (api_dir, data),
            _slot: slot,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, name: &str, spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = json!(self.cfg.node_name);
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
        )
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    /// Polls the pod until `f` holds (10 s at most).
    async fn wait_for(&self, name: &str, what: &str, f: impl Fn(&Pod) -> bool) -> Pod {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let pod = self.pods().get_opt(name).await.unwrap();
            if let Some(p) = &pod
                && f(p)
            {
                return p.clone();
            }
            assert!(
                Instant::now() < deadline,
                "pod {name}: timed out waiting for {what}: {:#?}",
                pod.and_then(|p| p.status)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn record(&self, name: &str) -> PodRecord {
        let dirs = svcnet_agent::logs::find_pod_dirs(&self.cfg.data_dir, "default", name);
        let path = dirs[0].join("pod.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// Runs a command inside a pod as `svcnet exec` does.
    fn exec(&self, name: &str, argv: &[&str]) -> String {
        let rec = self.record(name);
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let mounts = rec
            .mounts
            .get(&rec.containers[0].0)
            .cloned()
            .unwrap_or_default();
        let out = rec
            .sandbox
            .command_with(&argv, &rec.containers[0].1, false, false, &mounts, None)
            .unwrap()
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(20), self.agent.take().unwrap())
            .await
            .unwrap()
            .unwrap();
        let prefix = format!("{}-pod-", self.cfg.netns_prefix);
        assert!(
            !ip::netns_list()
                .unwrap()
                .iter()
                .any(|n| n.starts_with(&prefix)),
            "agent shutdown leaves no pod namespace"
        );
        let topo = self.topo.take().unwrap();
        tokio::task::spawn_blocking(move || topo.destroy())
            .await
            .unwrap()
            .unwrap();
    }
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ip(p: &Pod) -> IpAddr {
    p.status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .unwrap()
        .parse()
        .unwrap()
}

fn http_get(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_serve_probe_restart_and_terminate() {
    let env = Env::start().await;
    let node = env.topo.as_ref().unwrap().nodes()[0].clone();
    let host_ip = env.topo.as_ref().unwrap().host_ip();
    let marker = std::env::temp_dir().join(format!("svcnet-ready-{}", env.cfg.netns_prefix));
    let termfile = std::env::temp_dir().join(format!("svcnet-term-{}", env.cfg.netns_prefix));
    let _ = std::fs::remove_file(&marker);

    env.create(
        "web",
        json!({"hostname": "web-0", "subdomain": "nginx", "containers": [{"name": "nginx", "image": "nginx",
            "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}],
            "readinessProbe": {"httpGet": {"port": 80, "path": "/"}, "periodSeconds": 1}}]}),
    )
    .await;
    env.create(
        "client",
        json!({"terminationGracePeriodSeconds": 5, "containers": [{"name": "sh", "image": "busybox",
            "command": ["sh", "-c", format!("trap 'echo $MY_POD > {}; exit 0' TERM; while true; do sleep 0.1; done", termfile.display())],
            "env": [{"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "readinessProbe": {"exec": {"command": ["test", "-f", marker.display().to_string()]}, "periodSeconds": 1, "failureThreshold": 1}}]}),
    )
    .await;
    env.create("crash", json!({"containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "echo boom; exit 3"]}]})).await;

    // The test server answers from the host with the pod's name, IP and the client address.
    let web = env.wait_for("web", "Ready", ready).await;
    let web_ip = pod_ip(&web);
    let st = web.status.as_ref().unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(
        st.host_ip.as_deref(),
        Some(node.internal_ip.to_string().as_str())
    );
    assert!(node.pod_cidr.contains(&match web_ip {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(_) => panic!(),
    }));
    let cs = &st.container_statuses.as_ref().unwrap()[0];
    assert!(cs.ready && cs.state.as_ref().unwrap().running.is_some());
    let body = http_get(SocketAddr::new(web_ip, 80));
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.contains(&format!("pod=web ip={web_ip} client={host_ip}:")),
        "{body}"
    );
    let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    udp.send_to(b"hi", SocketAddr::new(web_ip, 53)).unwrap();
    let mut buf = [0u8; 256];
    let (n, _) = udp.recv_from(&mut buf).unwrap();
    let line = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(
        line.starts_with(&format!("pod=web ip={web_ip} client={host_ip}:")),
        "{line}"
    );
    let hosts = env.exec("web", &["cat", "/etc/hosts"]);
    assert!(
        hosts.contains(&format!(
            "{web_ip}\tweb-0.nginx.default.svc.cluster.local\tweb-0"
        )),
        "{hosts}"
    );
    assert_eq!(env.exec("web", &["hostname"]).trim(), "web-0");

    // The client pod: not ready until its exec probe passes; pod-to-pod traffic; DNS config;
    // environment with service links and the downward API.
    let client = env
        .wait_for("client", "Running", |p| {
            p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
        })
        .await;
    let client_ip = pod_ip(&client);
    assert!(!ready(&client));
    let out = env.exec(
        "client",
        &[
            "curl",
            "-s",
            "--max-time",
            "3",
            &format!("http://{web_ip}/"),
        ],
    );
    assert_eq!(
        out,
        format!(
            "pod=web ip={web_ip} client={client_ip}:{}",
            out.rsplit(':').next().unwrap()
        )
    );
    assert!(out.contains(&format!("client={client_ip}:")), "{out}");
    let resolv = env.exec("client", &["cat", "/etc/resolv.conf"]);
    assert_eq!(
        resolv,
        // The kubelet's layout: search, nameserver, options.
        "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
    );
    let printed = env.exec("client", &["env"]);
    for want in [
        "HOSTNAME=client",
        "MY_POD=client",
        "KUBERNETES_SERVICE_HOST=",
        "KUBERNETES_PORT_443_TCP_PROTO=tcp",
    ] {
        assert!(printed.contains(want), "{want} missing from\n{printed}");
    }
    assert!(
        std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default() != resolv,
        "the host's resolv.conf is untouched"
    );
    std::fs::write(&marker, "").unwrap();
    env.wait_for("client", "Ready after the probe passes", ready)
        .await;
    std::fs::remove_file(&marker).unwrap();
    env.wait_for("client", "not Ready after the probe fails", |p| !ready(p))
        .await;

    // A crashing container restarts with back-off and reports its last state.
    let crash = env
        .wait_for("crash", "two restarts", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|c| c[0].restart_count >= 2)
        })
        .await;
    let cs = &crash
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        cs.last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        3
    );
    assert_eq!(
        crash.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    // What `kubectl logs crash` and `kubectl logs crash --previous` would serve.
    let data = &env.cfg.data_dir;
    let current = svcnet_agent::logs::find_log(data, "default", "crash", None, false).unwrap();
    let previous = svcnet_agent::logs::find_log(data, "default", "crash", None, true).unwrap();
    assert_ne!(current, previous);
    // One CRI log record per line: time, stream, F(ull line), text.
    let record = std::fs::read_to_string(previous).unwrap();
    let fields: Vec<&str> = record.trim_end().splitn(4, ' ').collect();
    assert_eq!(fields[1..], ["stdout", "F", "boom"], "{record:?}");
    assert!(
        fields[0].parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
        "{record:?}"
    );

    // Deletion: SIGTERM reaches the process (its trap runs), then the namespace and the
    // address are released and the pod object is gone.
    let uid = client.metadata.uid.clone().unwrap();
    let netns = env.cfg.pod_netns(&uid);
    assert!(ip::netns_list().unwrap().contains(&netns));
    let started = Instant::now();
    env.pods()
        .delete("client", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ip::netns_list().unwrap().contains(&netns) {
        assert!(Instant::now() < deadline, "namespace {netns} still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the process obeyed SIGTERM; no need to wait the 5 s grace period"
    );
    assert_eq!(std::fs::read_to_string(&termfile).unwrap().trim(), "client");
    let ipam =
        svcnet_agent::cni::Ipam::open(&env.cfg.node_dir(), "svcnet", &env.cfg.netconf().ipam)
            .unwrap();
    assert_eq!(ipam.find(&uid, "eth0").unwrap(), None, "address released");
    // The agent confirms the graceful deletion (a grace-0 delete) after releasing the sandbox.
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.pods().get_opt("client").await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the agent never confirmed the pod's deletion"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone = svcnet_agent::exec::find_pod(&env.cfg.data_dir, "default", "client").unwrap_err();
    assert!(
        gone.to_string().contains("not running on this machine"),
        "{gone}"
    );
    let _ = std::fs::remove_file(&termfile);

    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_ignoring_sigterm_is_killed_after_the_grace_period() {
    let env = Env::start().await;
    env.create(
        "stubborn",
        json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
            "command": ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"]}]}),
    )
    .await;
    let pod = env.wait_for("stubborn", "Ready", ready).await;
    let netns = env.cfg.pod_netns(pod.metadata.uid.as_deref().unwrap());
    let started = Instant::now();
    env.pods()
        .delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    while ip::netns_list().unwrap().contains(&netns) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "namespace {netns} still there"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "killed after the 1 s grace period, took {took:?}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_liveness_probe_restarts_the_container() {
    let env = Env::start().await;
    // Nothing listens on port 1: every liveness check fails and the container is restarted.
    env.create(
        "dead",
        json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "300"],
            "livenessProbe": {"tcpSocket": {"port": 1}, "periodSeconds": 1, "failureThreshold": 1}}]}),
    )
    .await;
    let pod = env
        .wait_for("dead", "a restart", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|c| c[0].restart_count >= 1)
        })
        .await;
    let cs = &pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(
        (last.exit_code, last.signal),
        (143, Some(15)),
        "SIGTERM ended it: {last:?}"
    );
    env.stop().await;
}

/// Volumes on the process runtime: a configMap (items, mode, read-only), an emptyDir, hostPath
/// `DirectoryOrCreate` and `FileOrCreate`, mount points created on the node, `svcnet exec`
/// seeing the mounts, and an unsupported source named in the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_configmap_emptydir_and_hostpath() {
    let env = Env::start().await;
    let base = tempfile::tempdir().unwrap();
    let b = base.path().display().to_string();
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(env.client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "proxy-cfg"},
            "data": {"config.conf": "mode: nftables\n", "unused": "x"}}))
        .unwrap(),
    )
    .await
    .unwrap();
    env.create(
        "vol",
        json!({
            "volumes": [
                {"name": "cfg", "configMap": {"name": "proxy-cfg", "defaultMode": 420,
                    "items": [{"key": "config.conf", "path": "sub/config.conf", "mode": 384}]}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "hostdir", "hostPath": {"path": format!("{b}/host/dir"), "type": "DirectoryOrCreate"}},
                {"name": "lock", "hostPath": {"path": format!("{b}/host/xtables.lock"), "type": "FileOrCreate"}},
            ],
            "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", format!("cp {b}/mnt/cfg/sub/config.conf {b}/mnt/scratch/copy && echo hello > {b}/mnt/hostdir/from-pod && sleep 1000")],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": format!("{b}/mnt/cfg"), "readOnly": true},
                    {"name": "scratch", "mountPath": format!("{b}/mnt/scratch")},
                    {"name": "hostdir", "mountPath": format!("{b}/mnt/hostdir")},
                    {"name": "lock", "mountPath": format!("{b}/mnt/lock")},
                ]}],
        }),
    )
    .await;
    env.wait_for("vol", "Ready", ready).await;
    // The hostPath types created what they name; the pod wrote through its mount.
    assert!(base.path().join("host/dir").is_dir());
    assert!(base.path().join("host/xtables.lock").is_file());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !base.path().join("host/dir/from-pod").exists() {
        assert!(
            Instant::now() < deadline,
            "the pod did not write into its hostPath"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Inside (as svcnet exec sees it): the item at its path with its mode, the copy in the
    // emptyDir, the read-only mount refusing writes.
    let seen = env.exec("vol", &["sh", "-c", &format!(
        "cat {b}/mnt/cfg/sub/config.conf; stat -c %a {b}/mnt/cfg/sub/config.conf; cat {b}/mnt/scratch/copy; ls {b}/mnt/cfg; touch {b}/mnt/cfg/x 2>/dev/null && echo rw || echo ro"
    )]);
    assert_eq!(
        seen, "mode: nftables\n600\nmode: nftables\nsub\nro\n",
        "{seen}"
    );
    // Outside the pod the mount points are empty: the mounts live in the pod's namespace.
    assert!(base.path().join("mnt/cfg").is_dir());
    assert_eq!(
        std::fs::read_dir(base.path().join("mnt/cfg"))
            .unwrap()
            .count(),
        0
    );
    env.pods()
        .delete("vol", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while env.pods().get_opt("vol").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "pod vol not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The host paths stay, as with a kubelet; so do the (empty) mount points it created,
    // which other pods may share.
    assert!(base.path().join("host/dir/from-pod").exists());
    assert_eq!(
        std::fs::read_dir(base.path().join("mnt/cfg"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        std::fs::metadata(base.path().join("mnt/lock"))
            .unwrap()
            .len(),
        0
    );

    // A source the runtime cannot serve: the pod stays Pending and says which and why.
    env.create(
        "unsupported",
        json!({"volumes": [{"name": "s", "secret": {"secretName": "x"}}],
               "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1000"]}]}),
    )
    .await;
    let pod = env
        .wait_for("unsupported", "a sandbox message", |p| {
            p.status.as_ref().and_then(|s| s.message.as_ref()).is_some()
        })
        .await;
    let msg = pod.status.unwrap().message.unwrap();
    assert!(
        msg.contains("volume \"s\"") && msg.contains("secret"),
        "{msg}"
    );
    env.stop().await;
}

/// `hostNetwork: true`: the pod runs in the node's namespace with the node's address (no CNI
/// call), answers there, and its deletion leaves the node's namespace in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_pods_share_the_node() {
    let env = Env::start().await;
    let pod = env
        .create(
            "hostnet",
            json!({"hostNetwork": true, "containers": [{"name": "web", "image": "test-server",
                "ports": [{"containerPort": 18080}],
                "readinessProbe": {"tcpSocket": {"port": 18080}, "periodSeconds": 1}}]}),
        )
        .await;
    let uid = pod.metadata.uid.unwrap();
    let pod = env.wait_for("hostnet", "Ready", ready).await;
    assert_eq!(pod_ip(&pod), IpAddr::V4(env.cfg.node_ip));
    let rec = env.record("hostnet");
    assert!(rec.sandbox.host_network);
    assert_eq!(rec.sandbox.netns, env.cfg.node_netns);
    assert!(!ip::netns_list().unwrap().contains(&env.cfg.pod_netns(&uid)));
    let body = http_get(SocketAddr::new(IpAddr::V4(env.cfg.node_ip), 18080));
    assert!(body.contains(&format!("ip={}", env.cfg.node_ip)), "{body}");
    assert_eq!(env.exec("hostnet", &["hostname"]).trim(), env.cfg.node_name);
    env.pods()
        .delete("hostnet", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while env.pods().get_opt("hostnet").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "pod hostnet not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ip::netns_list().unwrap().contains(&env.cfg.node_netns),
        "the node's namespace survives its hostNetwork pod"
    );
    env.stop().await;
}

/// A projected volume as the API server's ServiceAccount admission writes it: a token of the
/// pod's ServiceAccount bound to the pod (TokenRequest), a ConfigMap and the namespace. The
/// token authenticates as the ServiceAccount (its requests are authorized as it: 403, not 401).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projected_service_account_token_configmap_and_namespace() {
    let env = Env::start().await;
    let base = tempfile::tempdir().unwrap();
    let mnt = base.path().join("sa");
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(env.client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "root-ca"}, "data": {"ca.crt": env.server.ca_pem()}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    env.create(
        "tok",
        json!({
            "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "root-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ]}}],
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1000"],
                "volumeMounts": [{"name": "kube-api-access", "mountPath": mnt.display().to_string(), "readOnly": true}]}],
        }),
    )
    .await;
    env.wait_for("tok", "Ready", ready).await;
    let m = mnt.display();
    let seen = env.exec(
        "tok",
        &[
            "sh",
            "-c",
            &format!("cat {m}/namespace; echo; cat {m}/ca.crt | head -1; ls {m}"),
        ],
    );
    assert_eq!(
        seen, "default\n-----BEGIN CERTIFICATE-----\nca.crt\nnamespace\ntoken\n",
        "{seen}"
    );
    let token = env.exec("tok", &["cat", &format!("{m}/token")]);
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    // The token is the pod's ServiceAccount, bound to the pod.
    let mut kc = Kubeconfig::read_from(env.server.kubeconfig_path()).unwrap();
    for named in &mut kc.auth_infos {
        if let Some(auth) = named.auth_info.as_mut() {
            auth.client_certificate_data = None;
            auth.client_key_data = None;
            auth.token = Some(token.trim().to_string().into());
        }
    }
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let as_sa = Client::try_from(cfg).unwrap();
    let err = Api::<Pod>::namespaced(as_sa, "default")
        .get("tok")
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert!(
                s.message.contains("system:serviceaccount:default:default"),
                "{s:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    env.stop().await;
}

/// Capabilities as far as a process runtime honours them: a container's bounding,
/// permitted and effective sets are what its `securityContext` gives (the runtime's defaults,
/// `add`, `drop`), `privileged` keeps all, and an unknown name is a
/// `CreateContainerConfigError` naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_follow_the_security_context() {
    let env = Env::start().await;
    let base = tempfile::tempdir().unwrap();
    let b = base.path().display().to_string();
    let pods = [
        (
            "caps-dns",
            json!({"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}),
        ),
        (
            "caps-proxy",
            json!({"capabilities": {"add": ["NET_ADMIN", "SYS_MODULE"]}}),
        ),
        ("caps-priv", json!({"privileged": true})),
    ];
    for (name, sc) in &pods {
        env.create(
            name,
            json!({
                "volumes": [{"name": "out", "hostPath": {"path": format!("{b}/{name}"), "type": "DirectoryOrCreate"}}],
                "containers": [{"name": "c", "image": "busybox", "securityContext": sc,
                    "command": ["sh", "-c", format!("grep -E '^Cap(Bnd|Prm|Eff):' /proc/self/status > {b}/{name}/caps.tmp && mv {b}/{name}/caps.tmp {b}/{name}/caps && sleep 1000")],
                    "volumeMounts": [{"name": "out", "mountPath": format!("{b}/{name}")}]}],
            }),
        )
        .await;
    }
    let read = |name: &str| -> Vec<u64> {
        let text = std::fs::read_to_string(base.path().join(name).join("caps")).unwrap();
        text.lines()
            .map(|l| u64::from_str_radix(l.split_whitespace().nth(1).unwrap(), 16).unwrap())
            .collect()
    };
    for (name, _) in &pods {
        env.wait_for(name, "Ready", ready).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !base.path().join(name).join("caps").exists() {
            assert!(Instant::now() < deadline, "{name} wrote no capabilities");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // CapPrm, CapEff, CapBnd: all the same for a root process.
    let net_bind = 1u64 << 10;
    assert_eq!(read("caps-dns"), vec![net_bind; 3]);
    let proxy = read("caps-proxy");
    let defaults: u64 = [0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31]
        .iter()
        .map(|b| 1u64 << b)
        .sum();
    assert_eq!(proxy, vec![defaults | (1 << 12) | (1 << 16); 3]);
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let own_bnd = own
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(
        read("caps-priv")[2],
        own_bnd,
        "privileged keeps every capability"
    );

    env.create(
        "caps-bad",
        json!({"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1000"],
            "securityContext": {"capabilities": {"add": ["NET_ADMN"]}}}]}),
    )
    .await;
    let pod = env
        .wait_for("caps-bad", "CreateContainerConfigError", |p| {
            p.status.as_ref().is_some_and(|s| {
                s.container_statuses.iter().flatten().any(|c| {
                    c.state
                        .as_ref()
                        .and_then(|st| st.waiting.as_ref())
                        .is_some_and(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
                })
            })
        })
        .await;
    let message = format!("{:?}", pod.status);
    assert!(
        message.contains(
            "spec.containers[c].securityContext.capabilities: unknown capability \\\"NET_ADMN\\\""
        ),
        "{message}"
    );
    env.stop().await;
}
