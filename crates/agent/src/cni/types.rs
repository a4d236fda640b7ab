//! CNI wire types (cni.dev SPEC 1.0): the network configuration read on stdin, the result
//! printed on success, and the error object printed on failure.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// CNI versions this plugin speaks (the result format is the same for all of them).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.4.0", "1.0.0", "1.1.0"];
/// The version of results when the config names none.
pub const DEFAULT_VERSION: &str = "1.0.0";

/// The network configuration (stdin). `bridge`, `nodeNetns`, `dataDir` and `ipam` are this
/// plugin's own keys; `prevResult` is CHECK's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// The bridge (in the node namespace) that pod veths join.
    #[serde(default = "default_bridge")]
    pub bridge: String,
    /// The node's network namespace name (`/run/netns/<name>`); absent: the caller's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_netns: Option<String>,
    /// Where IPAM keeps its allocations.
    pub data_dir: PathBuf,
    /// The MTU of both ends of the pod's veth (the bridge plugin's `mtu`); absent: the
    /// kernel's default (1500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    pub ipam: IpamConf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_result: Option<CniResult>,
}

fn default_bridge() -> String {
    "cni0".into()
}

/// host-local-style IPAM: a subnet, its gateway, and optionally a narrower range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamConf {
    #[serde(rename = "type", default = "default_ipam")]
    pub ipam_type: String,
    pub subnet: Ipv4Net,
    pub gateway: Ipv4Addr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_start: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<Ipv4Addr>,
}

fn default_ipam() -> String {
    "svcnet-host-local".into()
}

/// The success result of ADD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniResult {
    pub cni_version: String,
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    #[serde(default)]
    pub dns: Dns,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    /// The namespace path, for interfaces inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// CIDR notation: `10.244.1.5/24`.
    pub address: String,
    pub gateway: Ipv4Addr,
    /// Index into `interfaces`.
    pub interface: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<Ipv4Addr>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl CniResult {
    /// The container's address (first IP).
    pub fn pod_ip(&self) -> Option<Ipv4Addr> {
        self.ips
            .first()
            .and_then(|ip| ip.address.split('/').next())
            .and_then(|a| a.parse().ok())
    }
}

/// CNI error codes (SPEC "Error" section); 100+ are this plugin's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    UnknownContainer = 3,
    InvalidEnvironment = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    /// STATUS: the plugin cannot serve ADD now (SPEC 1.1).
    PluginNotAvailable = 50,
    /// IPAM has no free address left.
    AddressesExhausted = 100,
    /// CHECK found the container's network differing from what ADD set up.
    CheckFailed = 101,
    /// Programming a link, address or route failed.
    Netlink = 102,
}

impl ErrorCode {
    /// The code a plugin printed; `None` for one this plugin does not define.
    pub fn from_wire(code: u64) -> Option<Self> {
        use ErrorCode::*;
        [
            IncompatibleVersion,
            UnsupportedField,
            UnknownContainer,
            InvalidEnvironment,
            Io,
            Decode,
            InvalidConfig,
            TryAgainLater,
            PluginNotAvailable,
            AddressesExhausted,
            CheckFailed,
            Netlink,
        ]
        .into_iter()
        .find(|c| *c as u64 == code)
    }
}

/// A CNI error: `{cniVersion, code, msg, details}` on stdout and a non-zero exit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CNI error {}: {msg}{}", *code as u32, if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    pub code: ErrorCode,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Whether retrying later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.code,
            ErrorCode::TryAgainLater | ErrorCode::Io | ErrorCode::Netlink
        )
    }

    /// The JSON object the SPEC prescribes.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = serde_json::json!({"cniVersion": cni_version, "code": self.code as u32, "msg": self.msg});
        if !self.details.is_empty() {
            v["details"] = serde_json::Value::String(self.details.clone());
        }
        v
    }
}

impl From<crate::ip::IpError> for CniError {
    fn from(e: crate::ip::IpError) -> Self {
        CniError::new(ErrorCode::Netlink, "programming the pod network failed")
            .with_details(e.to_string())
    }
}
