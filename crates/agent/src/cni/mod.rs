//! A CNI-style bridge plugin (cni.dev SPEC 1.0): ADD gives a container namespace an `eth0`
//! veth whose other end joins the node's bridge, an address from the node's /24 (host-local
//! IPAM persisted in the data dir), a default route via the bridge and `lo` up; DEL undoes it
//! and is idempotent; CHECK verifies it; VERSION lists the versions.
//!
//! Two entry points: [`invoke`] takes the CNI environment and stdin as a real plugin binary
//! gets them and returns stdout plus the exit code (so a `svcnet cni` subcommand or a separate
//! binary can serve a real kubelet); [`add`], [`del`] and [`check`] are the typed calls the
//! agent uses. The container namespace must exist and be named (`/run/netns/<name>`): creating
//! it is the runtime's job, as in CNI. All calls block (they run `ip`).

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
    /// The container's network namespace name (the file name under `/run/netns`).
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
        format!("{}/{}", svcnet_netns::NETNS_RUN_DIR, self.netns)
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

fn netns_exists(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('/')
        && Path::new(svcnet_netns::NETNS_RUN_DIR).join(name).is_file()
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
    let node = conf.node_netns.as_deref();
    if !ip::link_names(node)?.contains(&conf.bridge) {
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            format!(
                "bridge {} does not exist in namespace {}",
                conf.bridge,
                node.unwrap_or("(host)")
            ),
        ));
    }
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
    match invoke_inner(env, stdin) {
        Ok(out) => (out, 0),
        Err(e) => (e.to_json(&version).to_string(), 1),
    }
}

fn invoke_inner(env: &BTreeMap<String, String>, stdin: &[u8]) -> Result<String, CniError> {
    let var = |k: &str| {
        env.get(k)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| CniError::new(ErrorCode::InvalidEnvironment, format!("{k} is not set")))
    };
    let command = var("CNI_COMMAND")?;
    if command == "VERSION" {
        return Ok(serde_json::json!({"cniVersion": types::DEFAULT_VERSION, "supportedVersions": types::SUPPORTED_VERSIONS}).to_string());
    }
    let conf: NetConf = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(ErrorCode::Decode, "cannot decode the network configuration")
            .with_details(e.to_string())
    })?;
    let netns_path = env.get("CNI_NETNS").cloned().unwrap_or_default();
    let netns = match netns_path.strip_prefix(&format!("{}/", svcnet_netns::NETNS_RUN_DIR)) {
        Some(name) if !name.contains('/') => name.to_string(),
        _ if netns_path.is_empty() && command == "DEL" => String::new(),
        _ => {
            return Err(CniError::new(
                ErrorCode::InvalidEnvironment,
                format!(
                    "CNI_NETNS {netns_path:?} must be a namespace under {}",
                    svcnet_netns::NETNS_RUN_DIR
                ),
            ));
        }
    };
    let inv = Invocation {
        container_id: var("CNI_CONTAINERID")?,
        netns,
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
            format!("CNI_COMMAND {other:?} is not ADD, DEL, CHECK or VERSION"),
        )),
    }
}
