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
    `svcnet cni install` puts the plugin and its network list on a node (the CNI DaemonSet's \
    job)."
)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Install this binary as the node's CNI plugin and write its network list, with the
    /// node's pod CIDR (`spec.podCIDR`) as the IPAM subnet; then stay until stopped (as
    /// flannel's CNI DaemonSet container does), or exit with `--once`.
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
    /// MTU of the pods' interfaces (1450 under VXLAN).
    #[arg(long)]
    pub mtu: Option<u32>,
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
    /// network list it installed (an update or eviction keeps them); see `svcnet proxy
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
    let cidr = pod_cidr(&args).await?;
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
        mtu: args.mtu,
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
    tracing::info!(plugin = %plugin.display(), conflist = %conflist.display(), %cidr, "CNI plugin installed");
    if args.once {
        return Ok(());
    }
    super::shutdown_signal().await?;
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
                tracing::info!(%why, plugin = %plugin.display(), conflist = %conflist.display(), "add-on removed: CNI plugin removed");
            }
            super::addon::Stopping::Restart(why) => {
                tracing::info!(%why, "CNI plugin kept");
            }
        }
    }
    Ok(())
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
