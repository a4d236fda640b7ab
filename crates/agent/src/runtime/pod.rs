//! One pod's life on the node, owned by one task: sandbox (namespace + CNI ADD + resolv.conf
//! and hosts), containers as processes with restarts and back-off, probes, status reports,
//! and termination (SIGTERM, grace period, SIGKILL, CNI DEL, namespace removed, and the pod
//! object deleted with grace 0 when the API server waits for that).

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::AgentConfig;
use super::output;
use super::probe::{
    ExecContext, ProbeAction, ProbeSpec, ProbeTracker, exec_probe, run_network_probe,
};
use super::process::{self, PodSandbox, remove_netns};
use super::spec::{self, Launch, PodContext};
use super::status::{CState, Conditions, ContainerView, PodView, pod_status};
use super::volumes;
use crate::cni::{self, Invocation};
use crate::ip;

/// What the agent loop tells a worker.
#[derive(Debug)]
pub enum PodEvent {
    Update(Box<Pod>),
    Deleted,
    Shutdown,
}

#[derive(Debug)]
enum Internal {
    Exited {
        idx: usize,
        generation: u64,
        code: Option<i32>,
        signal: Option<i32>,
    },
    Probe {
        idx: usize,
        generation: u64,
        liveness: bool,
        ok: bool,
    },
    RestartDue {
        idx: usize,
        generation: u64,
    },
}

/// The record `svcnet exec` reads: `<pods dir>/<ns>_<name>/pod.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub pod_ip: Option<Ipv4Addr>,
    pub sandbox: PodSandbox,
    /// (container name, its environment).
    pub containers: Vec<(String, Vec<(String, String)>)>,
    /// Each container's volume mounts, by container name (`svcnet exec` sees them too).
    #[serde(default)]
    pub mounts: std::collections::BTreeMap<String, Vec<volumes::Mount>>,
}

struct Ctr {
    spec: Container,
    /// Its volume mounts, set when it is first started.
    mounts: Vec<volumes::Mount>,
    generation: u64,
    pgid: Option<u32>,
    state: CState,
    last_state: Option<CState>,
    restart_count: i32,
    ready: bool,
    readiness: Option<(ProbeSpec, ProbeTracker)>,
    liveness: Option<(ProbeSpec, ProbeTracker)>,
    tasks: Vec<JoinHandle<()>>,
    backoff: Duration,
    started_at: Option<Instant>,
    env: Vec<(String, String)>,
}

impl Ctr {
    fn view(&self, policy: &str) -> ContainerView {
        let will_restart = match &self.state {
            CState::Terminated { exit_code, .. } => {
                policy == "Always" || (policy == "OnFailure" && *exit_code != 0)
            }
            _ => true,
        };
        ContainerView {
            name: self.spec.name.clone(),
            state: self.state.clone(),
            last_state: self.last_state.clone(),
            restart_count: self.restart_count,
            ready: self.ready,
            will_restart,
        }
    }

    fn stop_tasks(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

/// The task that owns one pod.
pub struct PodWorker {
    client: Client,
    cfg: Arc<AgentConfig>,
    pod: Pod,
    ns: String,
    name: String,
    uid: String,
    dir: PathBuf,
    sandbox: PodSandbox,
    volumes: volumes::Volumes,
    ip: Option<Ipv4Addr>,
    sandbox_error: Option<String>,
    started: Timestamp,
    ctrs: Vec<Ctr>,
    conditions: Conditions,
    last_sent: Option<serde_json::Value>,
    tx: mpsc::UnboundedSender<Internal>,
    rx: mpsc::UnboundedReceiver<Internal>,
}

impl PodWorker {
    pub fn new(client: Client, cfg: Arc<AgentConfig>, pod: Pod) -> Self {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = crate::logs::pod_dir(&cfg.pods_dir(), &ns, &name, &uid);
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        // A hostNetwork pod shares the node's network (and, as with a kubelet, its name).
        let sandbox = PodSandbox {
            netns: if host_network {
                cfg.node_netns.clone()
            } else {
                cfg.pod_netns(&uid)
            },
            host_network,
            resolv_conf: dir.join("resolv.conf"),
            hosts: dir.join("hosts"),
            hostname: if host_network {
                cfg.node_name.clone()
            } else {
                spec::hostname(&pod)
            },
        };
        let ctrs = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| Ctr {
                spec: c.clone(),
                mounts: Vec::new(),
                generation: 0,
                pgid: None,
                state: CState::Waiting {
                    reason: "ContainerCreating".into(),
                    message: None,
                },
                last_state: None,
                restart_count: 0,
                ready: false,
                readiness: None,
                liveness: None,
                tasks: Vec::new(),
                backoff: cfg.backoff,
                started_at: None,
                env: Vec::new(),
            })
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            client,
            cfg,
            pod,
            ns,
            name,
            uid,
            dir,
            sandbox,
            volumes: volumes::Volumes::new(),
            ip: None,
            sandbox_error: None,
            started: Timestamp::now(),
            ctrs,
            conditions: Conditions::default(),
            last_sent: None,
            tx,
            rx,
        }
    }

    fn policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn grace(&self) -> Duration {
        let secs = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        Duration::from_secs(u64::try_from(secs.max(0)).unwrap_or(0))
    }

    /// Runs the pod until it is deleted or the agent shuts down.
    pub async fn run(mut self, mut events: mpsc::UnboundedReceiver<PodEvent>) {
        tracing::info!(pod = %format!("{}/{}", self.ns, self.name), "starting pod");
        // Set up the sandbox, retrying while it fails, unless the pod goes away first.
        let mut retry = Duration::from_millis(500);
        loop {
            if self.pod.metadata.deletion_timestamp.is_some() {
                return self.finish(true).await;
            }
            match self.setup_sandbox().await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(pod = %self.name, "sandbox: {e}");
                    self.sandbox_error = Some(e);
                    self.publish().await;
                }
            }
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(PodEvent::Update(p)) => self.pod = *p,
                    Some(PodEvent::Deleted) | None => return self.finish(false).await,
                    Some(PodEvent::Shutdown) => return self.finish(false).await,
                },
                () = tokio::time::sleep(retry) => retry = (retry * 2).min(Duration::from_secs(10)),
            }
        }
        self.sandbox_error = None;
        for idx in 0..self.ctrs.len() {
            self.start_container(idx).await;
        }
        self.publish().await;
        let refresh_every = volumes::token_refresh_after(&self.pod);
        let mut refresh_at = refresh_every.map(|d| Instant::now() + d);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(PodEvent::Update(p)) => {
                        let deleting = p.metadata.deletion_timestamp.is_some();
                        self.pod = *p;
                        if deleting {
                            self.terminate_all().await;
                            return self.finish(true).await;
                        }
                    }
                    Some(PodEvent::Deleted) | None => {
                        self.terminate_all().await;
                        return self.finish(false).await;
                    }
                    Some(PodEvent::Shutdown) => {
                        self.terminate_all().await;
                        return self.finish(false).await;
                    }
                },
                Some(internal) = self.rx.recv() => self.handle(internal).await,
                _ = tick.tick() => {
                    // Retry a status report that failed.
                    if self.last_sent.is_none() {
                        self.publish().await;
                    }
                    // Renew projected service-account tokens before they expire.
                    if let (Some(at), Some(every)) = (refresh_at, refresh_every)
                        && Instant::now() >= at
                    {
                        refresh_at = match volumes::refresh_tokens(&self.client, &self.pod, &self.dir).await {
                            Ok(()) => Some(Instant::now() + every),
                            Err(e) => {
                                tracing::warn!(pod = %self.name, "renewing its token: {e}");
                                Some(Instant::now() + Duration::from_secs(10))
                            }
                        };
                    }
                }
            }
            self.publish().await;
        }
    }

    /// With the pod network left to an add-on: waits (an error, retried) until the add-on
    /// made this node ready, and takes its backend's MTU.
    async fn addon_network_mtu(&self) -> Result<u32, String> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.cfg.node_name)
            .await
            .map_err(|e| format!("cannot read node {}: {e}", self.cfg.node_name))?;
        let backend = crate::podnet::condition::network_ready(&node)?;
        Ok(backend.map_or(self.cfg.mtu, |b| b.pod_mtu()))
    }

    async fn setup_sandbox(&mut self) -> Result<(), String> {
        let netns = self.sandbox.netns.clone();
        let pod_ip = if self.sandbox.host_network {
            // The node's namespace and address: no CNI call (a kubelet makes none either).
            self.cfg.node_ip
        } else {
            let mtu = if self.cfg.network_from_addon {
                self.addon_network_mtu().await?
            } else {
                self.cfg.mtu
            };
            let list = self
                .cfg
                .network_list_with_mtu(mtu)
                .map_err(|e| e.to_string())?;
            let plugin = self.cfg.cni_plugin.clone();
            let inv = Invocation::new(&self.uid, &netns);
            let result = tokio::task::spawn_blocking(move || -> Result<cni::CniResult, String> {
                if !ip::netns_list()
                    .map_err(|e| e.to_string())?
                    .contains(&netns)
                {
                    ip::ip(None, &["netns", "add", &netns]).map_err(|e| e.to_string())?;
                }
                list.add(&plugin, &inv).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())??;
            result.pod_ip().ok_or("CNI result has no address")?
        };
        self.ip = Some(pod_ip);
        let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let resolv = spec::resolv_conf(
            &self.pod,
            &self.cfg.cluster_dns,
            &self.cfg.cluster_domain,
            &host,
        )?;
        let hosts = spec::hosts_file(&self.pod, pod_ip, &self.cfg.cluster_domain);
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("create {}: {e}", self.dir.display()))?;
        std::fs::write(&self.sandbox.resolv_conf, resolv)
            .map_err(|e| format!("write resolv.conf: {e}"))?;
        std::fs::write(&self.sandbox.hosts, hosts).map_err(|e| format!("write hosts: {e}"))?;
        self.volumes = volumes::prepare(&self.client, &self.pod, &self.dir).await?;
        self.write_record();
        // NetworkPolicy does not select hostNetwork pods (they are the node).
        if let Some(hook) = self
            .cfg
            .before_start
            .as_ref()
            .filter(|_| !self.sandbox.host_network)
        {
            hook.before_start(&self.pod, pod_ip).await;
        }
        tracing::info!(pod = %format!("{}/{}", self.ns, self.name), ip = %pod_ip, netns = %self.sandbox.netns, "sandbox ready");
        Ok(())
    }

    fn write_record(&self) {
        let record = PodRecord {
            namespace: self.ns.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            pod_ip: self.ip,
            sandbox: self.sandbox.clone(),
            containers: self
                .ctrs
                .iter()
                .map(|c| (c.spec.name.clone(), c.env.clone()))
                .collect(),
            mounts: self
                .ctrs
                .iter()
                .map(|c| (c.spec.name.clone(), c.mounts.clone()))
                .collect(),
        };
        let path = self.dir.join("pod.json");
        if let Err(e) = serde_json::to_vec_pretty(&record)
            .map_err(std::io::Error::from)
            .and_then(|b| std::fs::write(&path, b))
        {
            tracing::warn!("write {}: {e}", path.display());
        }
    }

    async fn services(&self) -> Vec<Service> {
        match Api::<Service>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(pod = %self.name, "listing services for environment variables: {e}");
                Vec::new()
            }
        }
    }

    /// The ConfigMaps the container's environment reads; a failed read (other than not found)
    /// is the container's error, so it is retried with its next start.
    async fn env_config_maps(&self, c: &Container) -> Result<spec::ConfigMapData, String> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns);
        let mut out = spec::ConfigMapData::new();
        for name in spec::env_config_maps(c) {
            let found = api
                .get_opt(&name)
                .await
                .map_err(|e| format!("reading ConfigMap {}/{name}: {e}", self.ns))?;
            if let Some(cm) = found {
                out.insert(name, cm.data.unwrap_or_default());
            }
        }
        Ok(out)
    }

    async fn start_container(&mut self, idx: usize) {
        let Some(pod_ip) = self.ip else { return };
        let services = self.services().await;
        let ctx = PodContext {
            pod: &self.pod,
            pod_ip,
            host_ip: self.cfg.node_ip,
            node_name: &self.cfg.node_name,
        };
        let c = &self.ctrs[idx].spec;
        let config_maps = self.env_config_maps(c).await;
        let prepared = config_maps
            .and_then(|cms| {
                spec::container_env(&ctx, c, &services, &cms).map_err(|e| e.to_string())
            })
            .and_then(|mut env| {
                let mapped = c
                    .image
                    .as_deref()
                    .and_then(|i| self.cfg.images.get(spec::image_repository(i)));
                let argv = match (mapped, spec::launch(c, &env)) {
                    (Some(program), _) => spec::launch_mapped(c, &env, program),
                    (None, Launch::Command(argv)) => argv,
                    (None, Launch::TestServer { ports }) => {
                        env.push((spec::TESTSERVER_ENV.into(), ports));
                        env.push((spec::TESTSERVER_POD_ENV.into(), self.name.clone()));
                        env.push((spec::TESTSERVER_IP_ENV.into(), pod_ip.to_string()));
                        vec![self.cfg.test_server.display().to_string()]
                    }
                };
                let readiness = c
                    .readiness_probe
                    .as_ref()
                    .map(|p| ProbeSpec::from_probe(p, c))
                    .transpose()
                    .map_err(|e| format!("spec.containers[{}].readinessProbe: {e}", c.name))?;
                let liveness = c
                    .liveness_probe
                    .as_ref()
                    .map(|p| ProbeSpec::from_probe(p, c))
                    .transpose()
                    .map_err(|e| format!("spec.containers[{}].livenessProbe: {e}", c.name))?;
                let mounts = volumes::mounts(c, &self.volumes)?;
                volumes::ensure_mount_points(&mounts)?;
                let caps = spec::capabilities(c).map_err(|e| {
                    format!(
                        "spec.containers[{}].securityContext.capabilities: {e}",
                        c.name
                    )
                })?;
                Ok((env, argv, readiness, liveness, mounts, caps))
            });
        let ctr = &mut self.ctrs[idx];
        ctr.generation += 1;
        let generation = ctr.generation;
        let (env, argv, readiness, liveness, mounts, caps) = match prepared {
            Ok(p) => p,
            Err(msg) => {
                ctr.state = CState::Waiting {
                    reason: "CreateContainerConfigError".into(),
                    message: Some(msg),
                };
                return;
            }
        };
        let log = self
            .dir
            .join("logs")
            .join(&ctr.spec.name)
            .join(format!("{}.log", ctr.restart_count));
        let stdin = output::StdinSpec {
            stdin: ctr.spec.stdin.unwrap_or(false),
            stdin_once: ctr.spec.stdin_once.unwrap_or(false),
            tty: ctr.spec.tty.unwrap_or(false),
        };
        ctr.mounts = mounts;
        let how = process::SpawnSpec {
            stdin: stdin.stdin,
            tty: stdin.tty,
            mounts: &ctr.mounts,
            caps,
        };
        match process::spawn(&self.sandbox, &argv, &env, &log, &how) {
            Ok(process::Spawned {
                mut child,
                log,
                terminal,
            }) => {
                output::capture(&mut child, terminal, &self.uid, &ctr.spec.name, log, stdin);
                ctr.pgid = child.id();
                ctr.state = CState::Running {
                    started: Timestamp::now(),
                };
                ctr.started_at = Some(Instant::now());
                ctr.env = env.clone();
                let tx = self.tx.clone();
                ctr.stop_tasks();
                tokio::spawn(async move {
                    let status = child.wait().await;
                    let (code, signal) = match status {
                        Ok(s) => (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)),
                        Err(_) => (None, None),
                    };
                    let _ = tx.send(Internal::Exited {
                        idx,
                        generation,
                        code,
                        signal,
                    });
                });
                ctr.ready = readiness.is_none();
                for (spec, liveness) in readiness
                    .into_iter()
                    .map(|s| (s, false))
                    .chain(liveness.into_iter().map(|s| (s, true)))
                {
                    let tracker = ProbeTracker::new(&spec, liveness);
                    ctr.tasks.push(spawn_probe(
                        spec.clone(),
                        liveness,
                        idx,
                        generation,
                        pod_ip,
                        ExecContext {
                            sandbox: self.sandbox.clone(),
                            env: env.clone(),
                            mounts: ctr.mounts.clone(),
                        },
                        self.tx.clone(),
                    ));
                    if liveness {
                        ctr.liveness = Some((spec, tracker));
                    } else {
                        ctr.readiness = Some((spec, tracker));
                    }
                }
            }
            Err(e) => {
                ctr.state = CState::Waiting {
                    reason: "RunContainerError".into(),
                    message: Some(format!("{}: {e}", argv.join(" "))),
                };
                let policy = self.policy();
                if policy != "Never" {
                    self.schedule_restart(idx);
                }
            }
        }
        self.write_record();
    }

    fn schedule_restart(&mut self, idx: usize) {
        let ctr = &mut self.ctrs[idx];
        // A container that ran for 10 minutes starts over with the initial back-off.
        if ctr
            .started_at
            .is_some_and(|t| t.elapsed() >= Duration::from_secs(600))
        {
            ctr.backoff = self.cfg.backoff;
        }
        let delay = ctr.backoff;
        ctr.backoff = (ctr.backoff * 2).min(self.cfg.max_backoff);
        let generation = ctr.generation;
        let tx = self.tx.clone();
        ctr.tasks.push(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = tx.send(Internal::RestartDue { idx, generation });
        }));
    }

    async fn handle(&mut self, ev: Internal) {
        match ev {
            Internal::Exited {
                idx,
                generation,
                code,
                signal,
            } => {
                let policy = self.policy();
                let ctr = &mut self.ctrs[idx];
                if ctr.generation != generation {
                    return;
                }
                ctr.stop_tasks();
                ctr.pgid = None;
                ctr.ready = false;
                let exit_code = code.unwrap_or_else(|| 128 + signal.unwrap_or(0));
                let started = match &ctr.state {
                    CState::Running { started } => Some(*started),
                    _ => None,
                };
                let reason = if exit_code == 0 { "Completed" } else { "Error" };
                ctr.state = CState::Terminated {
                    exit_code,
                    signal,
                    reason: reason.into(),
                    started,
                    finished: Timestamp::now(),
                };
                tracing::info!(pod = %self.name, container = %ctr.spec.name, exit_code, "container exited");
                let restart = policy == "Always" || (policy == "OnFailure" && exit_code != 0);
                if restart {
                    ctr.last_state = Some(ctr.state.clone());
                    ctr.state = CState::Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: Some(format!(
                            "back-off {:?} restarting failed container",
                            ctr.backoff
                        )),
                    };
                    self.schedule_restart(idx);
                }
            }
            Internal::RestartDue { idx, generation } => {
                if self.ctrs[idx].generation == generation {
                    self.ctrs[idx].restart_count += 1;
                    self.start_container(idx).await;
                }
            }
            Internal::Probe {
                idx,
                generation,
                liveness,
                ok,
            } => {
                let grace = self.grace();
                let ctr = &mut self.ctrs[idx];
                if ctr.generation != generation {
                    return;
                }
                let tracker = if liveness {
                    ctr.liveness.as_mut()
                } else {
                    ctr.readiness.as_mut()
                };
                let Some((_, tracker)) = tracker else { return };
                match (tracker.record(ok), liveness) {
                    (Some(ready), false) => {
                        tracing::info!(pod = %self.name, container = %ctr.spec.name, ready, "readiness changed");
                        ctr.ready = ready;
                    }
                    (Some(false), true) => {
                        tracing::info!(pod = %self.name, container = %ctr.spec.name, "liveness probe failed, restarting");
                        if let Some(pgid) = ctr.pgid {
                            kill_with_grace(pgid, grace);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// SIGTERM to every running container, SIGKILL to those still running after the grace
    /// period; returns when all have exited (or 5 s after SIGKILL).
    async fn terminate_all(&mut self) {
        let grace = self.grace();
        for ctr in &mut self.ctrs {
            ctr.stop_tasks();
            ctr.ready = false;
            if let Some(pgid) = ctr.pgid {
                process::signal(pgid, false);
            }
        }
        self.publish().await;
        let deadline = tokio::time::Instant::now() + grace;
        let mut killed = false;
        while self.ctrs.iter().any(|c| c.pgid.is_some()) {
            let wait_until = if killed {
                deadline + Duration::from_secs(5)
            } else {
                deadline
            };
            match tokio::time::timeout_at(wait_until, self.rx.recv()).await {
                Ok(Some(Internal::Exited {
                    idx,
                    generation,
                    code,
                    signal,
                })) => {
                    let ctr = &mut self.ctrs[idx];
                    if ctr.generation == generation {
                        ctr.pgid = None;
                        let started = match &ctr.state {
                            CState::Running { started } => Some(*started),
                            _ => None,
                        };
                        let exit_code = code.unwrap_or_else(|| 128 + signal.unwrap_or(0));
                        ctr.state = CState::Terminated {
                            exit_code,
                            signal,
                            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
                            started,
                            finished: Timestamp::now(),
                        };
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) if !killed => {
                    for ctr in &self.ctrs {
                        if let Some(pgid) = ctr.pgid {
                            tracing::info!(pod = %self.name, container = %ctr.spec.name, "grace period over, SIGKILL");
                            process::signal(pgid, true);
                        }
                    }
                    killed = true;
                }
                Err(_) => break,
            }
        }
    }

    /// Releases the sandbox and, when the API server waits for it, deletes the pod object.
    async fn finish(self, confirm_delete: bool) {
        let list = self.cfg.network_list();
        let plugin = self.cfg.cni_plugin.clone();
        let inv = Invocation::new(&self.uid, &self.sandbox.netns);
        let netns = self.sandbox.netns.clone();
        let host_network = self.sandbox.host_network;
        let dir = self.dir.clone();
        let released = tokio::task::spawn_blocking(move || {
            // A hostNetwork pod's processes are gone already (terminated by group); the
            // node's namespace stays.
            let r = if host_network {
                Ok(())
            } else {
                let r = list.and_then(|list| list.del(&plugin, &inv));
                remove_netns(&netns);
                r
            };
            let _ = std::fs::remove_dir_all(&dir);
            r
        })
        .await;
        match released {
            Ok(Ok(())) => {
                tracing::info!(pod = %format!("{}/{}", self.ns, self.name), "sandbox released")
            }
            Ok(Err(e)) => tracing::warn!(pod = %self.name, "CNI DEL: {e}"),
            Err(e) => tracing::warn!(pod = %self.name, "release task: {e}"),
        }
        if confirm_delete {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(self.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&self.name, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => tracing::warn!(pod = %self.name, "confirming deletion: {e}"),
            }
        }
    }

    fn view(&self) -> PodView {
        let policy = self.policy();
        PodView {
            pod_ip: self.ip,
            host_ip: self.cfg.node_ip,
            started: self.started,
            containers: self.ctrs.iter().map(|c| c.view(&policy)).collect(),
            sandbox_error: self.sandbox_error.clone(),
        }
    }

    /// Reports the status when it changed since the last successful report.
    async fn publish(&mut self) {
        let status = pod_status(&self.view(), &mut self.conditions, Timestamp::now());
        let Ok(value) = serde_json::to_value(&status) else {
            return;
        };
        if self.last_sent.as_ref() == Some(&value) {
            return;
        }
        self.last_sent = None;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        match api
            .patch_status(
                &self.name,
                // Upstream's kubelet writes pod status as the `kubelet` field manager.
                &PatchParams {
                    field_manager: Some("kubelet".into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(serde_json::json!({ "status": value })),
            )
            .await
        {
            Ok(_) => self.last_sent = Some(value),
            Err(kube::Error::Api(s)) if s.code == 404 => self.last_sent = Some(value),
            Err(e) => tracing::warn!(pod = %self.name, "status update: {e}"),
        }
    }
}

/// SIGTERM now, SIGKILL after `grace` (the process group is gone by then if it obeyed).
fn kill_with_grace(pgid: u32, grace: Duration) {
    process::signal(pgid, false);
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        process::signal(pgid, true);
    });
}

#[allow(clippy::too_many_arguments)]
fn spawn_probe(
    spec: ProbeSpec,
    liveness: bool,
    idx: usize,
    generation: u64,
    pod_ip: Ipv4Addr,
    target: ExecContext,
    tx: mpsc::UnboundedSender<Internal>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(spec.initial_delay).await;
        loop {
            let ok = match &spec.action {
                ProbeAction::Exec { command } => exec_probe(&target, command, spec.timeout).await,
                action => run_network_probe(action, IpAddr::V4(pod_ip), spec.timeout).await,
            };
            if tx
                .send(Internal::Probe {
                    idx,
                    generation,
                    liveness,
                    ok,
                })
                .is_err()
            {
                return;
            }
            tokio::time::sleep(spec.period).await;
        }
    })
}
