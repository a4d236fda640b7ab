//! `svcnet cni`: the pod network as a CNI plugin binary (cni.dev SPEC 1.0/1.1), for a kubelet's
//! container runtime or svcnet's own node agent. It reads the `CNI_*` environment and the
//! network configuration on stdin, prints the result (or the SPEC's error object) on stdout and
//! exits 0 (or 1). Installed as `/opt/cni/bin/svcnet`, the runtime starts it with no
//! arguments: `svcnet` with `CNI_COMMAND` set and no arguments is this subcommand.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use ipnet::Ipv4Net;
use svcnet_agent::cni::exec::NetworkList;
use svcnet_agent::cni::{IpamConf, NetConf};

/// The CNI plugin (no options: the SPEC passes everything in the environment and on stdin).
#[derive(Debug, clap::Args)]
#[command(
    long_about = "The pod network as a CNI plugin (SPEC 1.0 and 1.1): ADD, DEL, CHECK, STATUS, GC \
    and VERSION from CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS and CNI_IFNAME, the network \
    configuration on stdin, the result or error object on stdout. A runtime that finds this \
    binary as /opt/cni/bin/svcnet starts it without arguments, which works the same. \
    `svcnet cni install` puts the plugin and its network list on a node and runs the node's \
    pod network backend (the CNI DaemonSet's job, flanneld's): vxlan by default on a real \
    cluster, as flannel's, since it needs no layer-2 adjacency between nodes (`svcnet up`'s \
    own nodes share one bridge and default to host-gw)."
)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Install this binary as the node's CNI plugin and write its network list, with the
    /// node's pod CIDR (`spec.podCIDR`) as the IPAM subnet; then run the node's pod network
    /// backend until stopped (flanneld's job in flannel's DaemonSet), or exit with `--once`.
    Install(InstallArgs),
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Where runtimes look for plugin binaries (the kubelet's `--cni-bin-dir`).
    #[arg(long, default_value = "/opt/cni/bin")]
    pub bin_dir: PathBuf,
    /// Where runtimes read network configurations (the lexically first one is used).
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub conf_dir: PathBuf,
    #[arg(long, default_value = "10-svcnet.conflist")]
    pub conf_name: String,
    /// Where the plugin keeps its IPAM allocations.
    #[arg(long, default_value = "/var/lib/cni/svcnet")]
    pub data_dir: PathBuf,
    /// The bridge pods join (created by the first ADD).
    #[arg(long, default_value = "cni0")]
    pub bridge: String,
    /// MTU of the pods' interfaces; default: the backend's (1450 for vxlan, 1472 for udp,
    /// 1500 for host-gw and none).
    #[arg(long)]
    pub mtu: Option<u32>,
    /// The pod network backend this node runs while the installer stays (flanneld's job):
    /// `vxlan` (the default, as flannel's: a `flannel.1` VTEP, VNI 1, UDP 8472, that needs no
    /// layer-2 adjacency between nodes), `host-gw` (a route per node via its InternalIP: nodes
    /// must share a layer-2 segment), `udp` (a TUN `flannel0` and a user-space loop on UDP
    /// 8285), or `none` (another add-on, or `svcnet up`'s built-in one, routes between nodes).
    /// It publishes flannel's node annotations and `NetworkUnavailable=False`; the node's pods
    /// get its MTU. Not run with `--once`.
    #[arg(long, default_value = "vxlan", value_parser = super::pod_network::parse)]
    pub pod_network: super::pod_network::AddonNetwork,
    /// The cluster's pod network (flannel's net-conf `Network`): the udp backend routes it
    /// into its TUN.
    #[arg(long, default_value = "10.244.0.0/16")]
    pub cluster_cidr: Ipv4Net,
    /// This node's pod CIDR; without it, read from the Node's `spec.podCIDR` through the API.
    #[arg(long)]
    pub pod_cidr: Option<Ipv4Net>,
    /// The Node to read (`NODE_NAME`, from the downward API in the DaemonSet).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Kubeconfig; without it, in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Exit after installing instead of staying until stopped.
    #[arg(long)]
    pub once: bool,
    /// When stopped as a pod of an add-on that is being deleted, remove the plugin and the
    /// network list it installed, and the backend's device and routes (an update or eviction
    /// keeps them, so traffic flows until the next pod takes over); see `svcnet proxy
    /// --cleanup-on-uninstall`.
    #[arg(long)]
    pub remove_on_uninstall: bool,
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so
/// a runtime never reads half a file (or executes half a binary).
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .with_context(|| format!("{} has no directory", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Named per process: installers on nodes that share a file system (`svcnet up`'s) or an
    // old and a new pod during a rolling update must not write one temporary file together.
    let tmp = dir.join(format!(".{name}.{}.svcnet-tmp", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

/// The node's pod CIDR: the flag, or the Node's `spec.podCIDR` (waited for: a node gets it
/// from the controller manager after it registers).
async fn pod_cidr(args: &InstallArgs) -> anyhow::Result<Ipv4Net> {
    if let Some(cidr) = args.pod_cidr {
        return Ok(cidr);
    }
    let node = args
        .node_name
        .clone()
        .context("--pod-cidr or --node-name (NODE_NAME) is required")?;
    let client = super::kubeconfig::client(args.kubeconfig.as_deref()).await?;
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    loop {
        let found = api
            .get_opt(&node)
            .await
            .with_context(|| format!("cannot read Node {node}"))?;
        let cidr = found
            .and_then(|n| n.spec)
            .and_then(|s| s.pod_cidr)
            .filter(|c| !c.is_empty());
        match cidr {
            Some(c) => {
                return c.parse().with_context(|| {
                    format!("Node {node}: spec.podCIDR {c:?} is not an IPv4 CIDR")
                });
            }
            None => {
                tracing::info!(%node, "waiting for the Node's spec.podCIDR");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

/// `svcnet cni install`.
pub async fn install(args: InstallArgs) -> anyhow::Result<()> {
    // Signals count from the start: a pod stopped while it sets up (an update, an uninstall)
    // still gets to keep or remove what it made.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let listener = super::shutdown_listener()?;
    tokio::spawn(async move {
        listener.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // The backend runs while the installer stays: first its device and lease, so that the
    // network list (what tells a runtime the node's network is ready) comes last.
    let backend = match (args.pod_network.0, args.once) {
        (Some(network), false) => {
            let node = args.node_name.clone().context(
                "--pod-network needs the node: --node-name (NODE_NAME), or --pod-network none",
            )?;
            let client = super::kubeconfig::client(args.kubeconfig.as_deref()).await?;
            let identity = tokio::select! {
                found = super::pod_network::wait_node(&client, &node) => found?,
                () = stopped(stop_rx.clone()) => return Ok(()),
            };
            let running = super::pod_network::start(&client, network, &node, identity).await?;
            Some((client, running))
        }
        _ => None,
    };
    let cidr = match &backend {
        Some((_, running)) => running.node.pod_cidr,
        None => tokio::select! {
            cidr = pod_cidr(&args) => cidr?,
            () = stopped(stop_rx.clone()) => return Ok(()),
        },
    };
    let mtu = args.mtu.or(args.pod_network.0.map(|n| n.pod_mtu()));
    let (plugin, conflist) = write_plugin_and_list(&args, cidr, mtu)?;
    tracing::info!(plugin = %plugin.display(), conflist = %conflist.display(), %cidr, ?mtu, "CNI plugin installed");
    if args.once {
        return Ok(());
    }
    // What the backend left, and why it ended if it was not asked to: its Node watch ends when
    // the add-on's credentials are revoked (its ServiceAccount deleted, before its pods), and
    // that too is a stop to judge, so an uninstall still removes the device.
    let (ran, failed) = match backend {
        Some((client, running)) => {
            let cluster_cidr = args.cluster_cidr;
            let stop = stopped(stop_rx.clone());
            let mut task = tokio::spawn(running.run(client, cluster_cidr, stop));
            let ended = tokio::select! {
                () = stopped(stop_rx.clone()) => None,
                res = &mut task => Some(res),
            };
            let (outcome, early) = match ended {
                Some(res) => (res, true),
                None => (task.await, false),
            };
            match outcome.context("pod network task")? {
                Ok(left) if early => (
                    Some(left),
                    Some(anyhow::anyhow!(
                        "the pod network backend stopped unexpectedly"
                    )),
                ),
                Ok(left) => (Some(left), None),
                Err(e) => (None, Some(e)),
            }
        }
        None => {
            stopped(stop_rx).await;
            (None, None)
        }
    };
    if let Some(e) = &failed {
        tracing::warn!("{e:#}");
    }
    if args.remove_on_uninstall {
        let client = crate::cmd::kubeconfig::client(args.kubeconfig.as_deref()).await?;
        match super::addon::why_stopping(&client).await {
            super::addon::Stopping::Uninstall(why) => {
                for path in [&plugin, &conflist] {
                    match std::fs::remove_file(path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => tracing::warn!("cannot remove {}: {e}", path.display()),
                    }
                }
                if let Some((node, left)) = ran {
                    super::pod_network::remove(node, left)
                        .await
                        .context("cannot remove the pod network backend")?;
                }
                tracing::info!(%why, plugin = %plugin.display(), conflist = %conflist.display(), "add-on removed: CNI plugin and pod network removed");
            }
            super::addon::Stopping::Restart(why) => {
                tracing::info!(%why, "CNI plugin and pod network kept");
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Writes the plugin binary and the network list (`cidr` as the IPAM subnet, pods at `mtu`).
fn write_plugin_and_list(
    args: &InstallArgs,
    cidr: Ipv4Net,
    mtu: Option<u32>,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let gateway = cidr
        .hosts()
        .next()
        .with_context(|| format!("pod CIDR {cidr} has no host address"))?;
    let conf = NetConf {
        cni_version: svcnet_agent::cni::types::DEFAULT_VERSION.into(),
        name: "svcnet".into(),
        plugin_type: "svcnet".into(),
        bridge: args.bridge.clone(),
        node_netns: None,
        data_dir: args.data_dir.clone(),
        mtu,
        ipam: IpamConf {
            ipam_type: "svcnet-host-local".into(),
            subnet: cidr,
            gateway,
            range_start: None,
            range_end: None,
        },
        prev_result: None,
    };
    let list = NetworkList::single(&conf, args.data_dir.join("results"))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let binary = std::fs::read(&exe).with_context(|| format!("cannot read {}", exe.display()))?;
    let plugin = args.bin_dir.join("svcnet");
    write_atomically(&plugin, &binary, 0o755)?;
    let conflist = args.conf_dir.join(&args.conf_name);
    let text =
        serde_json::to_string_pretty(&list.to_json()).context("cannot encode the network list")?;
    write_atomically(&conflist, text.as_bytes(), 0o644)?;
    Ok((plugin, conflist))
}

/// True when this process was started the way a runtime starts a CNI plugin: `CNI_COMMAND`
/// set and no arguments.
pub fn started_as_plugin() -> bool {
    std::env::args_os().len() == 1 && std::env::var_os("CNI_COMMAND").is_some()
}

/// Serves one CNI call and returns the exit code. Synchronous: no runtime, no logging on
/// stdout (stdout is the result).
pub fn run() -> ExitCode {
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("CNI_"))
        .collect();
    let mut stdin = Vec::new();
    let (out, code) = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => svcnet_agent::cni::invoke(&env, &stdin),
        Err(e) => {
            let err = svcnet_agent::cni::CniError::new(
                svcnet_agent::cni::ErrorCode::Io,
                "cannot read the network configuration from stdin",
            )
            .with_details(e.to_string());
            let version = svcnet_agent::cni::types::DEFAULT_VERSION;
            (err.to_json(version).to_string(), 1)
        }
    };
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
