//! A pod's `/etc/resolv.conf`, as the kubelet (and the container runtime) write it: the pure
//! function the node agent calls for each pod it starts.
//!
//! `dnsPolicy` (default `ClusterFirst`) picks the base: the cluster DNS with the search path
//! `<ns>.svc.<zone> svc.<zone> <zone>` plus the host's searches and `options ndots:5`
//! (`ClusterFirst`, and `ClusterFirstWithHostNet`); the host's own file (`Default`, and
//! `ClusterFirst` for host-network pods); or nothing (`None`). `dnsConfig` is then merged in:
//! nameservers and searches appended without duplicates, options merged by name (the pod's
//! value wins). Limits as the kubelet applies them: 3 nameservers, 32 search domains of at most
//! 2048 characters in all.

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

/// The most nameservers the resolver uses.
pub const MAX_NAMESERVERS: usize = 3;
/// The most search domains the kubelet passes on.
pub const MAX_SEARCHES: usize = 32;
/// The longest search line (sum of the domains and separators) the kubelet passes on.
pub const MAX_SEARCH_CHARS: usize = 2048;

/// A parsed or generated resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    /// `name` or `name:value`.
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parse resolv.conf text (`nameserver`, `search`, `domain`, `options`; the last
    /// `search`/`domain` line wins, as in glibc).
    pub fn parse(text: &str) -> ResolvConf {
        let mut conf = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or_default();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => conf.nameservers.extend(words.next().map(str::to_string)),
                Some("search") | Some("domain") => {
                    conf.searches = words.map(str::to_string).collect();
                }
                Some("options") => {
                    let new: Vec<String> = words.map(str::to_string).collect();
                    conf.options = merge_options(&conf.options, &new);
                }
                _ => {}
            }
        }
        conf
    }
}

/// `search`, `nameserver` lines and `options`, in the order container runtimes write them.
impl fmt::Display for ResolvConf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.searches.is_empty() {
            writeln!(f, "search {}", self.searches.join(" "))?;
        }
        for ns in &self.nameservers {
            writeln!(f, "nameserver {ns}")?;
        }
        if !self.options.is_empty() {
            writeln!(f, "options {}", self.options.join(" "))?;
        }
        Ok(())
    }
}

/// Errors in a pod's DNS settings.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolvError {
    /// `dnsPolicy` is not one of the four Kubernetes values.
    #[error("pod {0}: spec.dnsPolicy: unsupported value {1:?}")]
    Policy(String, String),
    /// `dnsPolicy: None` without any `dnsConfig.nameservers`.
    #[error("pod {0}: spec.dnsConfig.nameservers: required when spec.dnsPolicy is None")]
    NoneWithoutNameservers(String),
}

/// The resolv.conf for `pod`, given the cluster DNS service IPs, the cluster domain and the
/// host's resolv.conf.
pub fn pod_resolv_conf(
    pod: &Pod,
    cluster_dns: &[IpAddr],
    cluster_domain: &str,
    host: &ResolvConf,
) -> Result<ResolvConf, ResolvError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let who = format!("{ns}/{}", pod.metadata.name.as_deref().unwrap_or_default());
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let domain = cluster_domain.trim_end_matches('.');

    let cluster = |host: &ResolvConf| ResolvConf {
        nameservers: cluster_dns.iter().map(IpAddr::to_string).collect(),
        searches: dedup(
            [
                format!("{ns}.svc.{domain}"),
                format!("svc.{domain}"),
                domain.to_string(),
            ]
            .into_iter()
            .chain(host.searches.iter().cloned()),
        ),
        options: vec!["ndots:5".to_string()],
    };
    let mut conf = match policy {
        // Without a cluster DNS the kubelet falls back to the host's settings.
        "ClusterFirstWithHostNet" | "ClusterFirst" if cluster_dns.is_empty() => host.clone(),
        "ClusterFirstWithHostNet" => cluster(host),
        "ClusterFirst" if !host_network => cluster(host),
        "ClusterFirst" | "Default" => host.clone(),
        "None" => ResolvConf::default(),
        other => return Err(ResolvError::Policy(who, other.to_string())),
    };

    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        conf.nameservers = dedup(
            conf.nameservers
                .into_iter()
                .chain(extra.nameservers.iter().flatten().cloned()),
        );
        conf.searches = dedup(
            conf.searches
                .into_iter()
                .chain(extra.searches.iter().flatten().cloned()),
        );
        let pod_options: Vec<String> = extra
            .options
            .iter()
            .flatten()
            .filter_map(|o| {
                let name = o.name.as_deref()?;
                Some(match &o.value {
                    Some(v) => format!("{name}:{v}"),
                    None => name.to_string(),
                })
            })
            .collect();
        conf.options = merge_options(&conf.options, &pod_options);
    }
    if policy == "None" && conf.nameservers.is_empty() {
        return Err(ResolvError::NoneWithoutNameservers(who));
    }

    conf.nameservers.truncate(MAX_NAMESERVERS);
    let mut chars = 0;
    conf.searches = conf
        .searches
        .into_iter()
        .take(MAX_SEARCHES)
        .take_while(|s| {
            chars += s.len() + usize::from(chars > 0);
            chars <= MAX_SEARCH_CHARS
        })
        .collect();
    Ok(conf)
}

fn dedup(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !item.is_empty() && !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// Options merged by name, later values replacing earlier ones in place.
fn merge_options(base: &[String], later: &[String]) -> Vec<String> {
    let name = |o: &str| o.split(':').next().unwrap_or_default().to_string();
    let mut out: Vec<String> = base.to_vec();
    for o in later {
        match out.iter_mut().find(|e| name(e) == name(o)) {
            Some(existing) => *existing = o.clone(),
            None => out.push(o.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};
    use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(policy: Option<&str>, host_network: bool, dns_config: Option<PodDNSConfig>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("demo".into()),
                name: Some("web-0".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                dns_policy: policy.map(str::to_string),
                host_network: Some(host_network),
                dns_config,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn host() -> ResolvConf {
        ResolvConf::parse(
            "# host\nnameserver 10.255.255.53\nsearch corp.example\noptions timeout:2 attempts:3\n",
        )
    }

    fn check(pod: &Pod, expect: Expect) {
        let dns = ["10.96.0.10".parse().unwrap()];
        let text = match pod_resolv_conf(pod, &dns, "cluster.local", &host()) {
            Ok(conf) => conf.to_string(),
            Err(e) => format!("error: {e}\n"),
        };
        expect.assert_eq(&text);
    }

    #[test]
    fn cluster_first_is_the_default() {
        check(
            &pod(None, false, None),
            expect![[r#"
                search demo.svc.cluster.local svc.cluster.local cluster.local corp.example
                nameserver 10.96.0.10
                options ndots:5
            "#]],
        );
    }

    #[test]
    fn host_network_pods_use_the_host_unless_with_host_net() {
        check(
            &pod(Some("ClusterFirst"), true, None),
            expect![[r#"
                search corp.example
                nameserver 10.255.255.53
                options timeout:2 attempts:3
            "#]],
        );
        check(
            &pod(Some("ClusterFirstWithHostNet"), true, None),
            expect![[r#"
                search demo.svc.cluster.local svc.cluster.local cluster.local corp.example
                nameserver 10.96.0.10
                options ndots:5
            "#]],
        );
        check(
            &pod(Some("Default"), false, None),
            expect![[r#"
                search corp.example
                nameserver 10.255.255.53
                options timeout:2 attempts:3
            "#]],
        );
    }

    #[test]
    fn dns_config_is_merged() {
        let config = PodDNSConfig {
            nameservers: Some(vec!["192.0.2.53".into(), "10.96.0.10".into()]),
            searches: Some(vec![
                "my.dns.search.suffix".into(),
                "svc.cluster.local".into(),
            ]),
            options: Some(vec![
                PodDNSConfigOption {
                    name: Some("ndots".into()),
                    value: Some("2".into()),
                },
                PodDNSConfigOption {
                    name: Some("edns0".into()),
                    value: None,
                },
            ]),
        };
        check(
            &pod(Some("ClusterFirst"), false, Some(config.clone())),
            expect![[r#"
                search demo.svc.cluster.local svc.cluster.local cluster.local corp.example my.dns.search.suffix
                nameserver 10.96.0.10
                nameserver 192.0.2.53
                options ndots:2 edns0
            "#]],
        );
        check(
            &pod(Some("None"), false, Some(config)),
            expect![[r#"
                search my.dns.search.suffix svc.cluster.local
                nameserver 192.0.2.53
                nameserver 10.96.0.10
                options ndots:2 edns0
            "#]],
        );
        check(
            &pod(Some("None"), false, None),
            expect![[r#"
                error: pod demo/web-0: spec.dnsConfig.nameservers: required when spec.dnsPolicy is None
            "#]],
        );
        check(
            &pod(Some("Sometimes"), false, None),
            expect![[r#"
                error: pod demo/web-0: spec.dnsPolicy: unsupported value "Sometimes"
            "#]],
        );
    }

    #[test]
    fn limits() {
        let config = PodDNSConfig {
            nameservers: Some((1..=5).map(|i| format!("192.0.2.{i}")).collect()),
            searches: Some((0..40).map(|i| format!("s{i}.example")).collect()),
            options: None,
        };
        let dns = ["10.96.0.10".parse().unwrap()];
        let conf = pod_resolv_conf(
            &pod(Some("ClusterFirst"), false, Some(config)),
            &dns,
            "cluster.local",
            &ResolvConf::default(),
        )
        .unwrap();
        assert_eq!(conf.nameservers.len(), MAX_NAMESERVERS);
        assert_eq!(conf.searches.len(), MAX_SEARCHES);
    }
}
