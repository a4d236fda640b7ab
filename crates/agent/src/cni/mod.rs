//! A CNI-style bridge plugin (cni.dev SPEC 1.0): ADD gives a container namespace an `eth0`
//! veth whose other end joins the node's bridge, an address from the node's /24 (host-local
//! IPAM persisted in the data dir), a default route via the bridge and `lo` up; DEL undoes it
//! and is idempotent; CHECK verifies it; VERSION lists the versions.
//!
//! Two entry points: [`invoke`] takes the CNI environment and stdin as a real plugin binary
//! gets them and returns stdout plus the exit code (so a `svcnet cni` subcommand or a separate
//! binary can serve a real kubelet); [`add`], [`del`] and [`check`] are the typed calls the
//! agent uses. ADD creates the node's bridge with the gateway address when it is missing (the
//! reference plugin's `isGateway`). SPEC 1.1's STATUS and GC (release what no
//! attachment in `cni.dev/valid-attachments` holds) are served too. The container namespace
//! must exist (a name under `/run/netns`, or any namespace file's path, as a kubelet's runtime
//! passes it): creating it is the runtime's job, as in CNI. All calls block (they run `ip`).

pub mod exec;
pub mod ipam;
pub mod types;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use crate::ip::{self, ip as run_ip};
pub use ipam::Ipam;
pub use types::{CniError, CniResult, ErrorCode, Interface, IpConfig, IpamConf, NetConf, Route};

/// Who ADD/DEL/CHECK is for (the `CNI_*` variables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub container_id: String,
    /// The container's network namespace: a name (the file under `/run/netns`) or a path to
    /// a namespace file (`/proc/<pid>/ns/net`, a runtime's bind mount).
    pub netns: String,
    pub ifname: String,
}

impl Invocation {
    pub fn new(container_id: &str, netns: &str) -> Self {
        Self {
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: "eth0".into(),
        }
    }

    fn netns_path(&self) -> String {
        if self.netns.contains('/') {
            self.netns.clone()
        } else {
            format!("{}/{}", svcnet_netns::NETNS_RUN_DIR, self.netns)
        }
    }
}

/// The host-side veth name: `veth` + 8 hex digits of a hash of the container id and ifname
/// (stable, so DEL finds it without state, and ≤ 15 characters).
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in container_id
        .bytes()
        .chain(std::iter::once(b'/'))
        .chain(ifname.bytes())
    {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("veth{h:08x}")
}

fn check_version(conf: &NetConf) -> Result<(), CniError> {
    if types::SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!("cniVersion {:?} is not supported", conf.cni_version),
        )
        .with_details(format!(
            "supported: {}",
            types::SUPPORTED_VERSIONS.join(", ")
        )))
    }
}

/// Whether the namespace `name` (a name under `/run/netns`, or an absolute path) exists.
fn netns_exists(name: &str) -> bool {
    if name.starts_with('/') {
        Path::new(name).exists()
    } else {
        !name.is_empty()
            && !name.contains('/')
            && Path::new(svcnet_netns::NETNS_RUN_DIR).join(name).is_file()
    }
}

/// ADD: sets up `inv.ifname` in the container namespace and returns the result.
pub fn add(conf: &NetConf, inv: &Invocation) -> Result<CniResult, CniError> {
    check_version(conf)?;
    if !netns_exists(&inv.netns) {
        return Err(CniError::new(
            ErrorCode::UnknownContainer,
            format!("network namespace {} does not exist", inv.netns_path()),
        ));
    }
    ensure_bridge(conf)?;
    let ipam = Ipam::open(&conf.data_dir, &conf.name, &conf.ipam)?;
    let addr = ipam.allocate(&inv.container_id, &inv.ifname)?;
    match setup(conf, inv, addr) {
        Ok(result) => Ok(result),
        Err(e) => {
            // Roll back: no half-configured pod and no leaked address.
            let _ = teardown(conf, inv);
            let _ = ipam.release(&inv.container_id, &inv.ifname);
            Err(e)
        }
    }
}

/// The node's bridge, created with the gateway address when missing (the reference bridge
/// plugin's `isGateway`; on a kubelet's node the first pod creates it), and up.
fn ensure_bridge(conf: &NetConf) -> Result<(), CniError> {
    let node = conf.node_netns.as_deref();
    if let Some(ns) = node
        && !netns_exists(ns)
    {
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            format!("node network namespace {ns} does not exist"),
        ));
    }
    if ip::link_names(node)?.contains(&conf.bridge) {
        return Ok(());
    }
    let gw = format!("{}/{}", conf.ipam.gateway, conf.ipam.subnet.prefix_len());
    // Two first pods at once: the loser's "File exists" is the winner's bridge.
    match run_ip(node, &["link", "add", &conf.bridge, "type", "bridge"]) {
        Err(e) if !e.is_exists() => return Err(e.into()),
        _ => {}
    }
    match run_ip(node, &["addr", "add", &gw, "dev", &conf.bridge]) {
        Err(e) if !e.is_exists() => return Err(e.into()),
        _ => {}
    }
    if let Some(mtu) = conf.mtu {
        run_ip(
            node,
            &["link", "set", &conf.bridge, "mtu", &mtu.to_string()],
        )?;
    }
    run_ip(node, &["link", "set", &conf.bridge, "up"])?;
    Ok(())
}

fn setup(conf: &NetConf, inv: &Invocation, addr: Ipv4Addr) -> Result<CniResult, CniError> {
    let node = conf.node_netns.as_deref();
    let pod = Some(inv.netns.as_str());
    let veth = host_veth_name(&inv.container_id, &inv.ifname);
    // A leftover from an ADD that was interrupted: start clean.
    ip::ip_del(pod, &["link", "del", &inv.ifname])?;
    ip::ip_del(node, &["link", "del", &veth])?;
    let mtu = conf.mtu.map(|m| m.to_string());
    let mut add = vec!["link", "add", &veth];
    if let Some(mtu) = &mtu {
        add.extend(["mtu", mtu.as_str()]);
    }
    add.extend(["type", "veth", "peer", "name", &inv.ifname]);
    if let Some(mtu) = &mtu {
        add.extend(["mtu", mtu.as_str()]);
    }
    add.extend(["netns", &inv.netns]);
    run_ip(node, &add)?;
    run_ip(node, &["link", "set", &veth, "master", &conf.bridge, "up"])?;
    // Hairpin mode (the bridge plugin's `hairpinMode`, kubelet's hairpin-veth): a pod reaching
    // itself through a service gets its masqueraded packets back out of its own port, which
    // a bridge otherwise never does when br_netfilter sends bridged traffic through iptables.
    run_ip(
        node,
        &[
            "link",
            "set",
            &veth,
            "type",
            "bridge_slave",
            "hairpin",
            "on",
        ],
    )?;
    let cidr = format!("{addr}/{}", conf.ipam.subnet.prefix_len());
    let gw = conf.ipam.gateway.to_string();
    run_ip(pod, &["link", "set", "lo", "up"])?;
    run_ip(pod, &["addr", "add", &cidr, "dev", &inv.ifname])?;
    run_ip(pod, &["link", "set", &inv.ifname, "up"])?;
    run_ip(
        pod,
        &["route", "add", "default", "via", &gw, "dev", &inv.ifname],
    )?;
    let host_mac = ip::link_mac(node, &veth)?;
    let pod_mac = ip::link_mac(pod, &inv.ifname)?;
    Ok(CniResult {
        cni_version: conf.cni_version.clone(),
        interfaces: vec![
            Interface {
                name: veth,
                mac: host_mac,
                sandbox: None,
            },
            Interface {
                name: inv.ifname.clone(),
                mac: pod_mac,
                sandbox: Some(inv.netns_path()),
            },
        ],
        ips: vec![IpConfig {
            address: cidr,
            gateway: conf.ipam.gateway,
            interface: 1,
        }],
        routes: vec![Route {
            dst: "0.0.0.0/0".into(),
            gw: Some(conf.ipam.gateway),
        }],
        dns: Default::default(),
    })
}

fn teardown(conf: &NetConf, inv: &Invocation) -> Result<(), CniError> {
    if netns_exists(&inv.netns) {
        ip::ip_del(Some(&inv.netns), &["link", "del", &inv.ifname])?;
    }
    let node = conf.node_netns.as_deref();
    if node.is_none_or(netns_exists) {
        ip::ip_del(
            node,
            &[
                "link",
                "del",
                &host_veth_name(&inv.container_id, &inv.ifname),
            ],
        )?;
    }
    Ok(())
}

/// DEL: removes the veth pair and releases the address. Succeeds when there is nothing to do
/// (already deleted, namespace gone).
pub fn del(conf: &NetConf, inv: &Invocation) -> Result<(), CniError> {
    check_version(conf)?;
    teardown(conf, inv)?;
    Ipam::open(&conf.data_dir, &conf.name, &conf.ipam)?.release(&inv.container_id, &inv.ifname)?;
    Ok(())
}

/// CHECK: verifies that what ADD set up (and `conf.prevResult`, when given) is still in place.
pub fn check(conf: &NetConf, inv: &Invocation) -> Result<(), CniError> {
    check_version(conf)?;
    let fail = |msg: String| Err(CniError::new(ErrorCode::CheckFailed, msg));
    if !netns_exists(&inv.netns) {
        return Err(CniError::new(
            ErrorCode::UnknownContainer,
            format!("network namespace {} does not exist", inv.netns_path()),
        ));
    }
    let ipam = Ipam::open(&conf.data_dir, &conf.name, &conf.ipam)?;
    let Some(addr) = ipam.find(&inv.container_id, &inv.ifname)? else {
        return fail(format!("container {} holds no address", inv.container_id));
    };
    let cidr = format!("{addr}/{}", conf.ipam.subnet.prefix_len());
    if let Some(prev) = &conf.prev_result
        && !prev.ips.iter().any(|i| i.address == cidr)
    {
        return fail(format!("prevResult has no address {cidr}"));
    }
    let pod = Some(inv.netns.as_str());
    let addrs = ip::ip_json(pod, &["addr", "show", "dev", &inv.ifname]).map_err(|e| {
        CniError::new(ErrorCode::CheckFailed, format!("{} is missing", inv.ifname))
            .with_details(e.to_string())
    })?;
    let has_addr = addrs
        .iter()
        .flat_map(|l| {
            l.get("addr_info")
                .and_then(|a| a.as_array())
                .cloned()
                .unwrap_or_default()
        })
        .any(|a| {
            a.get("local").and_then(|v| v.as_str()) == Some(&addr.to_string())
                && a.get("prefixlen").and_then(|v| v.as_u64())
                    == Some(u64::from(conf.ipam.subnet.prefix_len()))
        });
    if !has_addr {
        return fail(format!(
            "{} in {} lacks address {cidr}",
            inv.ifname, inv.netns
        ));
    }
    let routes = ip::ip_json(pod, &["route", "show", "default"])?;
    if !routes
        .iter()
        .any(|r| r.get("gateway").and_then(|g| g.as_str()) == Some(&conf.ipam.gateway.to_string()))
    {
        return fail(format!(
            "{} has no default route via {}",
            inv.netns, conf.ipam.gateway
        ));
    }
    let veth = host_veth_name(&inv.container_id, &inv.ifname);
    let links =
        ip::ip_json(conf.node_netns.as_deref(), &["link", "show", "dev", &veth]).map_err(|e| {
            CniError::new(
                ErrorCode::CheckFailed,
                format!("host veth {veth} is missing"),
            )
            .with_details(e.to_string())
        })?;
    if links
        .first()
        .and_then(|l| l.get("master"))
        .and_then(|m| m.as_str())
        != Some(conf.bridge.as_str())
    {
        return fail(format!(
            "host veth {veth} is not attached to {}",
            conf.bridge
        ));
    }
    Ok(())
}

/// STATUS (SPEC 1.1): whether ADD can be served now. The node's namespace must be there and
/// IPAM must have a free address; otherwise error 50 ("the plugin is not available"), which
/// tells the runtime to hold pod creation.
pub fn status(conf: &NetConf) -> Result<(), CniError> {
    check_version(conf)?;
    let unavailable = |msg: String| Err(CniError::new(ErrorCode::PluginNotAvailable, msg));
    let node = conf.node_netns.as_deref();
    if let Some(node) = node
        && !netns_exists(node)
    {
        return unavailable(format!("node network namespace {node} does not exist"));
    }
    // A missing bridge is not unavailability: the first ADD creates it.
    let ipam = Ipam::open(&conf.data_dir, &conf.name, &conf.ipam)?;
    if ipam.allocations()?.len() as u64 >= ipam.capacity() {
        return unavailable(format!("no free address left in {}", conf.ipam.subnet));
    }
    Ok(())
}

/// One attachment a runtime still uses (an entry of `cni.dev/valid-attachments`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// GC (SPEC 1.1): releases every address (and its host veth) held for an attachment that is
/// not in `valid`, the runtime's list of what it still uses. Returns what was released.
pub fn gc(conf: &NetConf, valid: &[Attachment]) -> Result<Vec<Ipv4Addr>, CniError> {
    check_version(conf)?;
    let ipam = Ipam::open(&conf.data_dir, &conf.name, &conf.ipam)?;
    let mut released = Vec::new();
    for (addr, container_id, ifname) in ipam.allocations()? {
        if valid
            .iter()
            .any(|a| a.container_id == container_id && a.ifname == ifname)
        {
            continue;
        }
        let inv = Invocation {
            container_id,
            netns: String::new(),
            ifname,
        };
        teardown(conf, &inv)?;
        ipam.release(&inv.container_id, &inv.ifname)?;
        released.push(addr);
    }
    Ok(released)
}

/// The plugin as a binary sees it: `env` holds `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
/// `CNI_IFNAME`; `stdin` the network configuration. Returns (stdout, exit code).
pub fn invoke(env: &BTreeMap<String, String>, stdin: &[u8]) -> (String, i32) {
    let version = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| types::DEFAULT_VERSION.to_string());
    match invoke_inner(env, stdin, &version) {
        Ok(out) => (out, 0),
        Err(e) => (e.to_json(&version).to_string(), 1),
    }
}

/// `CNI_NETNS` as this plugin addresses it: the bare name for a namespace under `/run/netns`
/// (`ip -n` takes it directly), the path itself for any other namespace file.
fn netns_of(command: &str, netns_path: &str) -> Result<String, CniError> {
    let run_dir = format!("{}/", svcnet_netns::NETNS_RUN_DIR);
    match netns_path.strip_prefix(&run_dir) {
        Some(name) if !name.is_empty() && !name.contains('/') => return Ok(name.to_string()),
        _ => {}
    }
    if netns_path.starts_with('/') && !netns_path.ends_with('/') {
        return Ok(netns_path.to_string());
    }
    // DEL may come after the namespace is gone, and the SPEC lets the runtime omit it: DEL
    // then cleans up what it can find outside the namespace.
    if command == "DEL" {
        return Ok(String::new());
    }
    Err(CniError::new(
        ErrorCode::InvalidEnvironment,
        format!("CNI_NETNS {netns_path:?} must be the absolute path of a network namespace"),
    ))
}

fn invoke_inner(
    env: &BTreeMap<String, String>,
    stdin: &[u8],
    version: &str,
) -> Result<String, CniError> {
    let var = |k: &str| {
        env.get(k)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| CniError::new(ErrorCode::InvalidEnvironment, format!("{k} is not set")))
    };
    let command = var("CNI_COMMAND")?;
    if command == "VERSION" {
        // The SPEC: the reply's cniVersion is the one the caller's configuration names.
        let reply = if types::SUPPORTED_VERSIONS.contains(&version) {
            version
        } else {
            types::DEFAULT_VERSION
        };
        return Ok(serde_json::json!({"cniVersion": reply, "supportedVersions": types::SUPPORTED_VERSIONS}).to_string());
    }
    let decode = |e: serde_json::Error| {
        CniError::new(ErrorCode::Decode, "cannot decode the network configuration")
            .with_details(e.to_string())
    };
    let conf: NetConf = serde_json::from_slice(stdin).map_err(decode)?;
    match command.as_str() {
        "STATUS" => return status(&conf).map(|()| String::new()),
        "GC" => {
            #[derive(serde::Deserialize)]
            struct GcConf {
                #[serde(rename = "cni.dev/valid-attachments", default)]
                valid: Vec<Attachment>,
            }
            let gc_conf: GcConf = serde_json::from_slice(stdin).map_err(decode)?;
            return gc(&conf, &gc_conf.valid).map(|_| String::new());
        }
        _ => {}
    }
    let inv = Invocation {
        container_id: var("CNI_CONTAINERID")?,
        netns: netns_of(&command, env.get("CNI_NETNS").map_or("", String::as_str))?,
        ifname: var("CNI_IFNAME")?,
    };
    match command.as_str() {
        "ADD" => serde_json::to_string(&add(&conf, &inv)?).map_err(|e| {
            CniError::new(ErrorCode::Io, "cannot encode the result").with_details(e.to_string())
        }),
        "DEL" => del(&conf, &inv).map(|()| String::new()),
        "CHECK" => check(&conf, &inv).map(|()| String::new()),
        other => Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("CNI_COMMAND {other:?} is not ADD, DEL, CHECK, STATUS, GC or VERSION"),
        )),
    }
}
