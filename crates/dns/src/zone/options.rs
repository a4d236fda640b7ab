//! The zone's options written as CoreDNS writes them in a Corefile (`ttl 30`, `pods verified`,
//! `endpoint_pod_names`, `ignore empty_service`, `namespaces a b`, `noendpoints`,
//! `fallthrough [ZONES…]`, `k8s_external ZONE…`), so that the rule table and operators moving
//! from CoreDNS can say them the same way. The `svcnet dns` and `svcnet up` flags set the same
//! fields.

use hickory_proto::rr::Name;

use super::{ExternalZones, ZoneConfig, ZoneError};

/// CoreDNS's largest `ttl`.
pub const MAX_TTL: u32 = 3600;

/// `k8s_external`'s default TTL (CoreDNS's).
pub const EXTERNAL_TTL: u32 = 5;

/// A zone name as given (`example.org`, `in-addr.arpa.`): lower-case, fully qualified.
pub fn zone_name(text: &str) -> Result<Name, ZoneError> {
    let mut name = Name::from_ascii(text)
        .map_err(|e| ZoneError::Option(text.to_string(), format!("not a DNS name: {e}")))?
        .to_lowercase();
    name.set_fqdn(true);
    Ok(name)
}

impl ZoneConfig {
    /// Applies one option line in CoreDNS's syntax.
    pub fn apply_option(&mut self, line: &str) -> Result<(), ZoneError> {
        let bad = |why: &str| ZoneError::Option(line.to_string(), why.to_string());
        let mut words = line.split_whitespace();
        let Some(option) = words.next() else {
            return Err(bad("empty"));
        };
        let args: Vec<&str> = words.collect();
        let no_args = |args: &[&str]| {
            if args.is_empty() {
                Ok(())
            } else {
                Err(bad("takes no arguments"))
            }
        };
        match option {
            "ttl" => {
                let [ttl] = args.as_slice() else {
                    return Err(bad("expected ttl SECONDS"));
                };
                self.ttl = parse_ttl(ttl).map_err(|e| bad(&e))?;
            }
            "pods" => {
                let [mode] = args.as_slice() else {
                    return Err(bad("expected pods insecure|verified|disabled"));
                };
                self.pods = mode.parse().map_err(|e: String| bad(&e))?;
            }
            "endpoint_pod_names" => {
                no_args(&args)?;
                self.options.endpoint_pod_names = true;
            }
            "ignore" => {
                if args != ["empty_service"] {
                    return Err(bad("expected ignore empty_service"));
                }
                self.options.ignore_empty_service = true;
            }
            "namespaces" => {
                if args.is_empty() {
                    return Err(bad("expected namespaces NAMESPACE..."));
                }
                self.options
                    .namespaces
                    .extend(args.iter().map(|a| a.to_ascii_lowercase()));
            }
            "noendpoints" => {
                no_args(&args)?;
                self.options.no_endpoints = true;
            }
            "fallthrough" => {
                let zones = args
                    .iter()
                    .map(|z| zone_name(z))
                    .collect::<Result<_, _>>()?;
                self.options.fallthrough = Some(zones);
            }
            "k8s_external" => {
                if args.is_empty() {
                    return Err(bad("expected k8s_external ZONE..."));
                }
                let zones = args
                    .iter()
                    .map(|z| zone_name(z))
                    .collect::<Result<_, _>>()?;
                self.external = Some(ExternalZones {
                    zones,
                    ttl: EXTERNAL_TTL,
                    apex: "dns".into(),
                });
            }
            other => return Err(bad(&format!("unknown option {other:?}"))),
        }
        Ok(())
    }
}

/// A TTL in seconds, 0 to 3600 as CoreDNS allows.
pub fn parse_ttl(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(ttl) if ttl <= MAX_TTL => Ok(ttl),
        _ => Err(format!(
            "TTL {text:?} must be a number of seconds from 0 to {MAX_TTL}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_as_corefile_lines() {
        let mut config = ZoneConfig::new("cluster.local").unwrap();
        for line in [
            "ttl 5",
            "pods verified",
            "endpoint_pod_names",
            "ignore empty_service",
            "namespaces Default kube-system",
            "noendpoints",
            "fallthrough in-addr.arpa ip6.arpa",
            "k8s_external example.org",
        ] {
            config.apply_option(line).unwrap();
        }
        assert_eq!(config.ttl, 5);
        assert_eq!(config.pods, super::super::PodMode::Verified);
        let o = &config.options;
        assert!(o.endpoint_pod_names && o.ignore_empty_service && o.no_endpoints);
        assert!(o.exposes("default") && o.exposes("kube-system") && !o.exposes("other"));
        let name = |s: &str| Name::from_ascii(s).unwrap();
        assert!(o.falls_through(&name("1.0.96.10.in-addr.arpa.")));
        assert!(!o.falls_through(&name("x.default.svc.cluster.local.")));
        let external = config.external.as_ref().unwrap();
        assert_eq!(external.zones, vec![name("example.org.")]);
        assert_eq!(external.ttl, EXTERNAL_TTL);
    }

    #[test]
    fn bad_options_say_what_is_wrong() {
        let mut config = ZoneConfig::new("cluster.local").unwrap();
        for (line, says) in [
            ("", "empty"),
            ("ttl", "expected ttl SECONDS"),
            ("ttl 3601", "from 0 to 3600"),
            ("ttl -1", "from 0 to 3600"),
            ("pods sometimes", "unknown pods mode"),
            ("ignore everything", "expected ignore empty_service"),
            ("namespaces", "expected namespaces"),
            ("noendpoints please", "takes no arguments"),
            ("k8s_external", "expected k8s_external ZONE"),
            ("upstream 1.1.1.1", "unknown option"),
        ] {
            let err = config.apply_option(line).unwrap_err().to_string();
            assert!(err.contains(says), "{line:?}: {err}");
        }
        assert_eq!(config.ttl, 30, "a refused option changes nothing");
    }
}
