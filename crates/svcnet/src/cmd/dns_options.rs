//! The options of CoreDNS's `kubernetes` and `k8s_external` plugins as flags, shared by
//! `svcnet dns` and `svcnet up`. Each flag becomes the Corefile line it stands for and is
//! applied by `ZoneConfig::apply_option`, so a flag and its Corefile form cannot drift.

use anyhow::Context;
use svcnet_dns::{PodMode, ZoneConfig};

/// Cluster DNS flags with CoreDNS's semantics.
#[derive(Debug, Clone, clap::Args)]
pub struct DnsOptions {
    /// TTL of every answer, in seconds (0-3600; CoreDNS's `ttl`).
    #[arg(long = "ttl", default_value_t = 30)]
    pub ttl: u32,
    /// Pod records `<dashed-ip>.<ns>.pod.<zone>`: insecure (any address, in a namespace that
    /// exists), verified (a pod's own address) or disabled (CoreDNS's `pods`).
    #[arg(long = "pods", default_value = "insecure")]
    pub pods: PodMode,
    /// Name an endpoint without a hostname after its pod instead of its dashed IP
    /// (CoreDNS's `endpoint_pod_names`).
    #[arg(long)]
    pub endpoint_pod_names: bool,
    /// NXDOMAIN for a service with a cluster IP and no ready endpoint, so a client's search
    /// path goes on (CoreDNS's `ignore empty_service`).
    #[arg(long)]
    pub ignore_empty_service: bool,
    /// Serve only these namespaces, comma-separated; others are NXDOMAIN (CoreDNS's
    /// `namespaces`).
    #[arg(long = "dns-namespaces", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Do not read EndpointSlices: endpoint names and headless services are NXDOMAIN
    /// (CoreDNS's `noendpoints`).
    #[arg(long)]
    pub noendpoints: bool,
    /// Hand an NXDOMAIN of the cluster zones to the upstream instead, in these zones
    /// (comma-separated) or, given without a value, in all (CoreDNS's `fallthrough`).
    #[arg(long, num_args = 0.., value_delimiter = ',')]
    pub fallthrough: Option<Vec<String>>,
    /// Read only Services, EndpointSlices and Pods matching this label selector (CoreDNS's
    /// `labels`).
    #[arg(long = "dns-labels")]
    pub labels: Option<String>,
    /// Answer services' external and LoadBalancer IPs as `<svc>.<ns>.<zone>` under this zone
    /// (repeatable; CoreDNS's `k8s_external`).
    #[arg(long = "k8s-external")]
    pub k8s_external: Vec<String>,
    /// TTL of the `--k8s-external` answers, in seconds.
    #[arg(long = "k8s-external-ttl", default_value_t = 5)]
    pub k8s_external_ttl: u32,
}

impl DnsOptions {
    /// The options as Corefile lines.
    pub fn corefile_lines(&self) -> Vec<String> {
        let mut lines = vec![format!("ttl {}", self.ttl)];
        let pods = match self.pods {
            PodMode::Insecure => "insecure",
            PodMode::Verified => "verified",
            PodMode::Disabled => "disabled",
        };
        lines.push(format!("pods {pods}"));
        if self.endpoint_pod_names {
            lines.push("endpoint_pod_names".into());
        }
        if self.ignore_empty_service {
            lines.push("ignore empty_service".into());
        }
        if !self.namespaces.is_empty() {
            lines.push(format!("namespaces {}", self.namespaces.join(" ")));
        }
        if self.noendpoints {
            lines.push("noendpoints".into());
        }
        if let Some(zones) = &self.fallthrough {
            lines.push(
                format!("fallthrough {}", zones.join(" "))
                    .trim_end()
                    .to_string(),
            );
        }
        if !self.k8s_external.is_empty() {
            lines.push(format!("k8s_external {}", self.k8s_external.join(" ")));
        }
        lines
    }

    /// Applies the flags to `zone`, naming the flag of a bad value.
    pub fn apply(&self, zone: &mut ZoneConfig) -> anyhow::Result<()> {
        for line in self.corefile_lines() {
            zone.apply_option(&line)
                .with_context(|| format!("DNS flag for the Corefile option {line:?}"))?;
        }
        if let Some(external) = zone.external.as_mut() {
            external.ttl = svcnet_dns::parse_ttl(&self.k8s_external_ttl.to_string())
                .map_err(anyhow::Error::msg)
                .context("--k8s-external-ttl")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        dns: DnsOptions,
    }

    fn zone(args: &[&str]) -> anyhow::Result<ZoneConfig> {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))?;
        let mut zone = ZoneConfig::new("cluster.local")?;
        cli.dns.apply(&mut zone)?;
        Ok(zone)
    }

    #[test]
    fn flags_become_the_corefile_options() {
        let z = zone(&[
            "--ttl=5",
            "--pods=verified",
            "--endpoint-pod-names",
            "--ignore-empty-service",
            "--dns-namespaces=default,kube-system",
            "--noendpoints",
            "--fallthrough",
            "--k8s-external=example.org",
            "--k8s-external-ttl=60",
        ])
        .unwrap();
        assert_eq!((z.ttl, z.pods), (5, PodMode::Verified));
        let o = &z.options;
        assert!(o.endpoint_pod_names && o.ignore_empty_service && o.no_endpoints);
        assert_eq!(o.namespaces.len(), 2);
        assert_eq!(o.fallthrough, Some(vec![]));
        assert_eq!(z.external.as_ref().map(|e| e.ttl), Some(60));
        let z = zone(&["--fallthrough=in-addr.arpa,ip6.arpa"]).unwrap();
        assert_eq!(z.options.fallthrough.map(|f| f.len()), Some(2));
        let defaults = zone(&[]).unwrap();
        assert_eq!((defaults.ttl, defaults.pods), (30, PodMode::Insecure));
        assert_eq!(defaults.options, Default::default());
        assert!(defaults.external.is_none());
    }

    #[test]
    fn bad_values_name_the_problem() {
        let err = format!("{:#}", zone(&["--ttl=4000"]).unwrap_err());
        assert!(
            err.contains("ttl 4000") && err.contains("0 to 3600"),
            "{err}"
        );
        let err = format!("{:#}", zone(&["--k8s-external=bad..zone"]).unwrap_err());
        assert!(err.contains("not a DNS name"), "{err}");
        let err = format!(
            "{:#}",
            zone(&["--k8s-external=example.org", "--k8s-external-ttl=9999"]).unwrap_err()
        );
        assert!(err.contains("--k8s-external-ttl"), "{err}");
    }
}
