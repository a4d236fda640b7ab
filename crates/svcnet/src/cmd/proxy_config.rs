//! `svcnet proxy --config FILE`: kube-proxy's configuration file (`KubeProxyConfiguration`,
//! `kubeproxy.config.k8s.io/v1alpha1`, YAML or JSON), so the ConfigMap of a kube-proxy
//! DaemonSet carries over. The fields svcnet acts on are read into the flags; a flag given on
//! the command line wins over the file. Fields of upstream's type that svcnet does not act on
//! (conntrack, featureGates, logging, …) are named once in the log; a key that is not in
//! upstream's type at all is an error, as upstream's strict decoding makes it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::Value;

use super::proxy::{Args, parse_bind, parse_duration, parse_seconds};

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

/// The part of upstream's `KubeProxyConfiguration` svcnet acts on.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub mode: Option<String>,
    /// Comma-separated, as upstream's.
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub hostname_override: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub client_connection: Option<ClientConnection>,
    /// The common sync settings (upstream 1.30+); a mode's own section wins.
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    pub iptables: Option<ModeSection>,
    pub nftables: Option<ModeSection>,
    pub ipvs: Option<IpvsSection>,
    /// Everything else of upstream's type: accepted, not acted on.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: Option<String>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeSection {
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpvsSection {
    pub scheduler: Option<String>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    pub tcp_timeout: Option<String>,
    pub tcp_fin_timeout: Option<String>,
    pub udp_timeout: Option<String>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Top-level fields of upstream's type that svcnet reads but does not act on.
const UPSTREAM_ONLY: &[&str] = &[
    "bindAddress",
    "bindAddressHardFail",
    "configSyncPeriod",
    "conntrack",
    "detectLocal",
    "detectLocalMode",
    "enableProfiling",
    "featureGates",
    "logging",
    "oomScoreAdj",
    "portRange",
    "showHiddenMetricsForVersion",
    "winkernel",
    "windowsRunAsService",
    "linux",
];

impl KubeProxyConfiguration {
    /// Reads and checks the file (YAML or JSON).
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the proxy configuration {}", path.display()))?;
        Self::parse(&text)
            .with_context(|| format!("invalid proxy configuration {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let cfg: Self = serde_saphyr::from_str(text)?;
        if cfg.kind.as_deref().is_some_and(|k| k != KIND) {
            bail!(
                "kind must be {KIND}, not {:?}",
                cfg.kind.unwrap_or_default()
            );
        }
        if let Some(v) = cfg.api_version.as_deref()
            && v != API_VERSION
        {
            bail!("apiVersion must be {API_VERSION}, not {v:?}");
        }
        if let Some(unknown) = cfg
            .other
            .keys()
            .find(|k| !UPSTREAM_ONLY.contains(&k.as_str()))
        {
            bail!("unknown field {unknown:?} (not a field of {KIND})");
        }
        Ok(cfg)
    }

    /// Upstream's fields in the file that svcnet does not act on, for one log line.
    pub fn ignored(&self) -> Vec<String> {
        let nested = |section: &str, other: &BTreeMap<String, Value>| {
            other
                .keys()
                .map(|k| format!("{section}.{k}"))
                .collect::<Vec<_>>()
        };
        let mut out: Vec<String> = self.other.keys().cloned().collect();
        if let Some(c) = &self.client_connection {
            out.extend(nested("clientConnection", &c.other));
        }
        if let Some(s) = &self.iptables {
            out.extend(nested("iptables", &s.other));
        }
        if let Some(s) = &self.nftables {
            out.extend(nested("nftables", &s.other));
        }
        if let Some(s) = &self.ipvs {
            out.extend(nested("ipvs", &s.other));
        }
        out
    }

    /// Writes the file's values into `args` where the command line did not set the flag
    /// (`explicit(id)` says whether it did, by the flag's clap id).
    pub fn apply(&self, args: &mut Args, explicit: impl Fn(&str) -> bool) -> anyhow::Result<()> {
        let set = |id: &str| !explicit(id);
        if let Some(mode) = self
            .mode
            .as_deref()
            .filter(|m| !m.is_empty() && set("mode"))
        {
            args.mode = mode.parse().map_err(|e| anyhow::anyhow!("mode: {e}"))?;
        }
        let mode = args.mode.as_str();
        if let Some(cidrs) = self.cluster_cidr.as_deref().filter(|_| set("cluster_cidr")) {
            args.cluster_cidr = cidrs
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(|c| {
                    c.parse()
                        .with_context(|| format!("clusterCIDR: {c:?} is not a CIDR"))
                })
                .collect::<anyhow::Result<_>>()?;
        }
        if let Some(name) = self
            .hostname_override
            .as_deref()
            .filter(|n| !n.is_empty() && set("node_name"))
        {
            args.node_name = Some(name.to_string());
        }
        if let Some(a) = self
            .healthz_bind_address
            .as_deref()
            .filter(|_| set("healthz_bind_address"))
        {
            args.healthz_bind_address =
                parse_bind(a).map_err(|e| anyhow::anyhow!("healthzBindAddress: {e}"))?;
        }
        if let Some(a) = self
            .metrics_bind_address
            .as_deref()
            .filter(|_| set("metrics_bind_address"))
        {
            args.metrics_bind_address =
                parse_bind(a).map_err(|e| anyhow::anyhow!("metricsBindAddress: {e}"))?;
        }
        if let Some(list) = self
            .node_port_addresses
            .as_ref()
            .filter(|_| set("nodeport_addresses"))
        {
            args.nodeport_addresses = list
                .iter()
                .map(|c| {
                    c.parse()
                        .with_context(|| format!("nodePortAddresses: {c:?} is not a CIDR"))
                })
                .collect::<anyhow::Result<_>>()?;
        }
        if let Some(k) = self
            .client_connection
            .as_ref()
            .and_then(|c| c.kubeconfig.as_deref())
            .filter(|k| !k.is_empty() && set("kubeconfig"))
        {
            args.kubeconfig = Some(k.into());
        }
        // The mode's own section, then the common fields.
        let (masquerade_all, sync, min_sync) = match mode {
            "iptables" | "nftables" => {
                let s = if mode == "iptables" {
                    &self.iptables
                } else {
                    &self.nftables
                };
                let s = s.as_ref();
                (
                    s.and_then(|s| s.masquerade_all),
                    s.and_then(|s| s.sync_period.clone()),
                    s.and_then(|s| s.min_sync_period.clone()),
                )
            }
            "ipvs" => {
                let s = self.ipvs.as_ref();
                (
                    None,
                    s.and_then(|s| s.sync_period.clone()),
                    s.and_then(|s| s.min_sync_period.clone()),
                )
            }
            _ => (None, None, None),
        };
        if let Some(m) = masquerade_all.filter(|_| set("masquerade_all")) {
            args.masquerade_all = m;
        }
        let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
        if let Some(p) =
            nonempty(sync.or_else(|| self.sync_period.clone())).filter(|_| set("sync_period"))
        {
            args.sync_period =
                parse_duration(&p).map_err(|e| anyhow::anyhow!("syncPeriod: {e}"))?;
        }
        if let Some(p) = nonempty(min_sync.or_else(|| self.min_sync_period.clone()))
            .filter(|_| set("min_sync_period"))
        {
            args.min_sync_period = p
                .parse()
                .map_err(|e| anyhow::anyhow!("minSyncPeriod: {e}"))?;
        }
        if let Some(ipvs) = &self.ipvs {
            if let Some(s) = ipvs
                .scheduler
                .as_deref()
                .filter(|s| !s.is_empty() && set("scheduler"))
            {
                args.scheduler = Some(
                    s.parse()
                        .map_err(|e| anyhow::anyhow!("ipvs.scheduler: {e}"))?,
                );
            }
            for (value, id, field, target) in [
                (
                    &ipvs.tcp_timeout,
                    "ipvs_tcp_timeout",
                    "ipvs.tcpTimeout",
                    &mut args.ipvs.ipvs_tcp_timeout,
                ),
                (
                    &ipvs.tcp_fin_timeout,
                    "ipvs_tcpfin_timeout",
                    "ipvs.tcpFinTimeout",
                    &mut args.ipvs.ipvs_tcpfin_timeout,
                ),
                (
                    &ipvs.udp_timeout,
                    "ipvs_udp_timeout",
                    "ipvs.udpTimeout",
                    &mut args.ipvs.ipvs_udp_timeout,
                ),
            ] {
                if let Some(v) = value.as_deref().filter(|v| !v.is_empty() && set(id)) {
                    *target = parse_seconds(v).map_err(|e| anyhow::anyhow!("{field}: {e}"))?;
                }
            }
            if let Some(strict) = ipvs.strict_arp.filter(|_| set("ipvs_strict_arp")) {
                args.ipvs.ipvs_strict_arp = strict;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(argv: &[&str]) -> (Args, clap::ArgMatches) {
        let mut full = vec!["proxy"];
        full.extend_from_slice(argv);
        let matches = <Cli as clap::CommandFactory>::command().get_matches_from(&full);
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        (cli.args, matches)
    }

    const KUBEADM: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 5
clusterCIDR: 10.244.0.0/16,fd00::/56
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  masqueradeAll: true
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  scheduler: "wrr"
  strictARP: true
  tcpTimeout: 900s
metricsBindAddress: 127.0.0.1:10249
mode: "ipvs"
nodePortAddresses: ["172.30.0.0/24"]
"#;

    #[test]
    fn kubeadm_shaped_file_fills_the_flags_and_flags_win() {
        let cfg = KubeProxyConfiguration::parse(KUBEADM).unwrap();
        let (mut a, m) = args(&["--min-sync-period", "0s"]);
        let explicit =
            |id: &str| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        cfg.apply(&mut a, explicit).unwrap();
        assert_eq!(a.mode.as_str(), "ipvs");
        assert_eq!(a.cluster_cidr.len(), 2);
        assert_eq!(
            a.kubeconfig.as_deref(),
            Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
        );
        assert_eq!(a.scheduler.map(|s| s.to_string()).as_deref(), Some("wrr"));
        assert!(a.ipvs.ipvs_strict_arp);
        assert_eq!(a.ipvs.ipvs_tcp_timeout, 900);
        assert_eq!(a.nodeport_addresses.len(), 1);
        // The iptables section is not ipvs mode's: its masqueradeAll does not apply.
        assert!(!a.masquerade_all);
        // The command line's --min-sync-period 0s stands.
        assert_eq!(a.min_sync_period, "0s".parse().unwrap());
        let mut ignored = cfg.ignored();
        ignored.sort();
        assert!(ignored.contains(&"conntrack".to_string()), "{ignored:?}");
        assert!(
            ignored.contains(&"clientConnection.qps".to_string()),
            "{ignored:?}"
        );
    }

    #[test]
    fn mode_sections_and_common_fields() {
        let cfg = KubeProxyConfiguration::parse(
            "kind: KubeProxyConfiguration\nmode: nftables\nsyncPeriod: 10s\nnftables: {masqueradeAll: true, minSyncPeriod: 250ms}\nhostnameOverride: node-7\n",
        )
        .unwrap();
        let (mut a, _) = args(&[]);
        cfg.apply(&mut a, |_| false).unwrap();
        assert_eq!(a.mode.as_str(), "nftables");
        assert!(a.masquerade_all);
        assert_eq!(a.sync_period, std::time::Duration::from_secs(10));
        assert_eq!(a.min_sync_period, "250ms".parse().unwrap());
        assert_eq!(a.node_name.as_deref(), Some("node-7"));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let err = |text: &str| format!("{:#}", KubeProxyConfiguration::parse(text).unwrap_err());
        assert!(err("kind: KubeletConfiguration").contains("kind must be KubeProxyConfiguration"));
        assert!(err("apiVersion: v1").contains("apiVersion must be"));
        assert!(err("modee: ipvs").contains("unknown field \"modee\""));
        let cfg = KubeProxyConfiguration::parse("mode: turbo").unwrap();
        let (mut a, _) = args(&[]);
        let e = format!("{:#}", cfg.apply(&mut a, |_| false).unwrap_err());
        assert!(e.starts_with("mode: "), "{e}");
        let cfg = KubeProxyConfiguration::parse("ipvs: {tcpTimeout: 1.5s}").unwrap();
        let e = format!("{:#}", cfg.apply(&mut a, |_| false).unwrap_err());
        assert!(e.contains("ipvs.tcpTimeout"), "{e}");
    }
}
