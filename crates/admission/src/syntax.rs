//! Syntax checks with upstream's messages (apimachinery `util/validation`):
//! DNS labels and subdomains, qualified names, label values, IANA port names,
//! IPs and CIDRs, and object metadata.
//!
//! Each `is_*` function returns the list of problems, empty when the value is
//! fine, exactly like upstream's `IsDNS1123Label` and friends.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::FieldError;

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";

/// Upstream's "must be between 1 and 65535, inclusive".
pub const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";
/// Upstream's invalid-IP message.
pub const IP_MSG: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";
/// Upstream's invalid-CIDR message.
pub const CIDR_MSG: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

/// upstream's `GetWarningsForCIDR`, for fields whose legacy validation accepts a CIDR that
/// later releases will not: host bits set beyond the prefix (ambiguous: the network or the one
/// address?), an IPv4-mapped IPv6 prefix, and IPv6 text not in RFC 5952 form. An unparsable
/// value has no warning (validation refuses it).
pub fn cidr_warnings(path: &str, value: &str) -> Vec<String> {
    let Ok(net) = value.parse::<ipnet::IpNet>() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if net.addr() != net.network() {
        let network = net.trunc().to_string();
        let single = format!("{}/{}", net.addr(), net.max_prefix_len());
        out.push(format!(
            "{path}: CIDR value {value:?} is ambiguous in this context (should be {network:?} or {single:?}?)"
        ));
    }
    if let ipnet::IpNet::V6(v6) = net
        && let Some(v4) = v6.network().to_ipv4_mapped()
    {
        let prefix = v6.prefix_len().saturating_sub(96);
        let standard = format!("{v4}/{prefix}");
        out.push(format!(
            "{path}: non-standard CIDR value {value:?} will be considered invalid in a future Kubernetes release: use {standard:?}"
        ));
    }
    if out.is_empty() && net.addr().is_ipv6() && net.to_string() != value {
        out.push(format!(
            "{path}: IPv6 CIDR value {value:?} should be in RFC 5952 canonical format ({:?})",
            net.to_string()
        ));
    }
    out
}

/// Upstream `RegexError`: note the doubled space after each example but the
/// last, which is what a real API server prints.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut s = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            s.push_str(" or ");
        }
        s.push('\'');
        s.push_str(e);
        s.push_str("', ");
    }
    s.push_str("regex used for validation is '");
    s.push_str(fmt);
    s.push_str("')");
    s
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns1123_label)
}

pub fn is_dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !matches_dns1123_label(s) {
        if matches_dns1123_subdomain(s) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

pub fn is_dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !matches_dns1123_subdomain(s) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

pub fn is_dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_lowercase()
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-');
    if !ok {
        errs.push(regex_error(
            DNS1035_LABEL_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

fn matches_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// Label keys, annotation keys, `loadBalancerClass`, `appProtocol`.
pub fn is_qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    is_dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !matches_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

pub fn is_valid_label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !s.is_empty() && !matches_qualified_name_part(s) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

pub fn is_valid_port_num(p: i32) -> Vec<String> {
    if (1..=65535).contains(&p) {
        Vec::new()
    } else {
        vec![PORT_RANGE_MSG.to_string()]
    }
}

/// IANA_SVC_NAME (RFC 6335), the syntax of named ports.
pub fn is_valid_port_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 15 {
        errs.push(max_len_error(15));
    }
    if !s.bytes().all(|c| is_lower_alnum(c) || c == b'-') {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if s.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if s.starts_with('-') || s.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

pub fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse().ok()
}

pub fn is_valid_cidr(s: &str) -> bool {
    s.parse::<ipnet::IpNet>().is_ok()
}

/// Upstream `ValidateNonSpecialIP`: addresses that can never be an endpoint
/// or an external IP.
pub fn non_special_ip(ip: IpAddr) -> Vec<String> {
    let mut errs = Vec::new();
    if ip.is_unspecified() {
        errs.push(format!("may not be unspecified ({ip})"));
    }
    if ip.is_loopback() {
        errs.push("may not be in the loopback range (127.0.0.0/8, ::1/128)".to_string());
    }
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    if link_local {
        errs.push("may not be in the link-local range (169.254.0.0/16, fe80::/10)".to_string());
    }
    let ll_multicast = match ip {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => (v6.segments()[0] & 0xff0f) == 0xff02,
    };
    if ll_multicast {
        errs.push(
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)".to_string(),
        );
    }
    errs
}

/// Upstream `ValidateLabels`: both bad keys and bad values are reported at
/// the map's path, with the offending key or value.
pub fn validate_labels(labels: Option<&BTreeMap<String, String>>, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in labels.into_iter().flatten() {
        errs.extend(
            is_qualified_name(k)
                .into_iter()
                .map(|m| FieldError::invalid(path, k, m)),
        );
        errs.extend(
            is_valid_label_value(v)
                .into_iter()
                .map(|m| FieldError::invalid(path, v, m)),
        );
    }
    errs
}

const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

pub fn validate_annotations(
    annotations: Option<&BTreeMap<String, String>>,
    path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0;
    for (k, v) in annotations.into_iter().flatten() {
        errs.extend(
            is_qualified_name(&k.to_lowercase())
                .into_iter()
                .map(|m| FieldError::invalid(path, k, m)),
        );
        total += k.len() + v.len();
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    errs
}

/// How an object's name is checked.
#[derive(Debug, Clone, Copy)]
pub enum NameRule {
    Dns1123Subdomain,
    Dns1123Label,
    Dns1035Label,
    /// upstream `ValidatePathSegmentName`: any name usable as one URL path segment (RBAC
    /// objects: `system:node-proxier`).
    PathSegment,
}

impl NameRule {
    fn check(self, name: &str) -> Vec<String> {
        match self {
            NameRule::Dns1123Subdomain => is_dns1123_subdomain(name),
            NameRule::Dns1123Label => is_dns1123_label(name),
            NameRule::Dns1035Label => is_dns1035_label(name),
            NameRule::PathSegment => is_path_segment_name(name),
        }
    }
}

/// upstream `IsValidPathSegmentName`.
pub fn is_path_segment_name(name: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if name == "." || name == ".." {
        errs.push(format!("may not be '{name}'"));
    }
    for c in ["/", "%"] {
        if name.contains(c) {
            errs.push(format!("may not contain '{c}'"));
        }
    }
    errs
}

/// Upstream `ValidateObjectMeta`: name (or generateName), namespace
/// presence, labels and annotations.
pub fn validate_object_meta(
    meta: &ObjectMeta,
    namespaced: bool,
    rule: NameRule,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match meta.name.as_deref() {
        None | Some("") => {
            if meta.generate_name.as_deref().unwrap_or("").is_empty() {
                errs.push(FieldError::required(
                    "metadata.name",
                    "name or generateName is required",
                ));
            }
        }
        Some(name) => {
            errs.extend(
                rule.check(name)
                    .into_iter()
                    .map(|m| FieldError::invalid("metadata.name", name, m)),
            );
        }
    }
    let ns = meta.namespace.as_deref().unwrap_or("");
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else {
            errs.extend(
                is_dns1123_label(ns)
                    .into_iter()
                    .map(|m| FieldError::invalid("metadata.namespace", ns, m)),
            );
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    errs.extend(validate_labels(meta.labels.as_ref(), "metadata.labels"));
    errs.extend(validate_annotations(
        meta.annotations.as_ref(),
        "metadata.annotations",
    ));
    errs.extend(validate_finalizers(
        meta.finalizers.as_deref().unwrap_or_default(),
    ));
    errs.extend(validate_owner_references(
        meta.owner_references.as_deref().unwrap_or_default(),
    ));
    errs
}

/// Finalizers Kubernetes itself defines; any other must be a qualified name with a prefix.
const STANDARD_FINALIZERS: &[&str] = &["kubernetes", "orphan", "foregroundDeletion"];

/// Upstream's `ValidateFinalizers` with core's `validateKubeFinalizerName`.
fn validate_finalizers(finalizers: &[String]) -> Vec<FieldError> {
    let field = "metadata.finalizers";
    let mut errs = Vec::new();
    for f in finalizers {
        let msgs = is_qualified_name(f);
        if !msgs.is_empty() {
            errs.extend(
                msgs.into_iter()
                    .map(|m| FieldError::invalid(field, f.as_str(), m)),
            );
        } else if !f.contains('/') && !STANDARD_FINALIZERS.contains(&f.as_str()) {
            errs.push(FieldError::invalid(
                field,
                f.as_str(),
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
    if finalizers.iter().any(|f| f == "orphan")
        && finalizers.iter().any(|f| f == "foregroundDeletion")
    {
        errs.push(FieldError::invalid(
            field,
            finalizers,
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errs
}

/// Upstream's `ValidateOwnerReferences`: each names an object (version, kind, name, uid),
/// and at most one is the controller.
fn validate_owner_references(
    refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
) -> Vec<FieldError> {
    let field = "metadata.ownerReferences";
    let mut errs = Vec::new();
    for r in refs {
        let version = r.api_version.rsplit('/').next().unwrap_or("");
        if version.is_empty() {
            errs.push(FieldError::invalid(
                format!("{field}.apiVersion"),
                r.api_version.as_str(),
                "version must not be empty",
            ));
        }
        for (sub, value, what) in [
            ("kind", &r.kind, "kind"),
            ("name", &r.name, "name"),
            ("uid", &r.uid, "uid"),
        ] {
            if value.is_empty() {
                errs.push(FieldError::invalid(
                    format!("{field}.{sub}"),
                    "",
                    format!("{what} must not be empty"),
                ));
            }
        }
    }
    let controllers = refs.iter().filter(|r| r.controller == Some(true)).count();
    if controllers > 1 {
        let names: Vec<String> = refs
            .iter()
            .filter(|r| r.controller == Some(true))
            .map(|r| format!("{}/{}", r.kind, r.name))
            .collect();
        errs.push(FieldError::invalid(
            field,
            &names,
            "Only one reference can have Controller set to true",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("my-name").is_empty());
        assert_eq!(
            is_dns1123_label("My_Name"),
            vec![
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        assert_eq!(is_dns1123_label("a.b"), vec!["must not contain dots"]);
        assert_eq!(
            is_dns1123_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters"]
        );
        assert!(is_dns1123_subdomain("db.example.com").is_empty());
        assert_eq!(is_dns1123_subdomain("a..b").len(), 1);
        assert!(is_dns1035_label("abc-123").is_empty());
        assert_eq!(
            is_dns1035_label("1abc"),
            vec![
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
    }

    #[test]
    fn qualified_names_and_label_values() {
        assert!(is_qualified_name("app.kubernetes.io/name").is_empty());
        assert!(is_qualified_name("MyName").is_empty());
        assert_eq!(
            is_qualified_name("/x"),
            vec!["prefix part must be non-empty"]
        );
        assert_eq!(is_qualified_name("a/b/c").len(), 1);
        assert!(is_qualified_name("-x")[0].starts_with("name part must consist of alphanumeric"));
        assert!(is_valid_label_value("").is_empty());
        assert!(is_valid_label_value("my_value").is_empty());
        assert_eq!(is_valid_label_value("bad value").len(), 1);
    }

    #[test]
    fn port_names() {
        assert!(is_valid_port_name("http").is_empty());
        assert!(is_valid_port_name("h2c-web").is_empty());
        assert_eq!(
            is_valid_port_name("80"),
            vec!["must contain at least one letter (a-z)"]
        );
        assert_eq!(
            is_valid_port_name("-a--b"),
            vec![
                "must not contain consecutive hyphens",
                "must not begin or end with a hyphen"
            ]
        );
        assert_eq!(
            is_valid_port_name("abcdefghijklmnop"),
            vec!["must be no more than 15 characters"]
        );
        assert_eq!(
            is_valid_port_name("HTTP"),
            vec![
                "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                "must contain at least one letter (a-z)"
            ]
        );
    }

    #[test]
    fn special_ips() {
        assert!(non_special_ip("10.0.0.1".parse().unwrap()).is_empty());
        assert_eq!(
            non_special_ip("127.0.0.1".parse().unwrap()),
            vec!["may not be in the loopback range (127.0.0.0/8, ::1/128)"]
        );
        assert_eq!(non_special_ip("169.254.1.1".parse().unwrap()).len(), 1);
        assert_eq!(non_special_ip("fe80::1".parse().unwrap()).len(), 1);
        assert_eq!(non_special_ip("224.0.0.5".parse().unwrap()).len(), 1);
        assert_eq!(
            non_special_ip("0.0.0.0".parse().unwrap()),
            vec!["may not be unspecified (0.0.0.0)"]
        );
    }
}

#[cfg(test)]
mod cidr_warning_tests {
    use super::cidr_warnings;

    #[test]
    fn non_standard_cidrs_are_warned_about_as_upstream() {
        let p = "spec.ingress[0].from[0].ipBlock.cidr";
        assert!(cidr_warnings(p, "192.168.1.0/24").is_empty());
        assert!(cidr_warnings(p, "2001:db8::/64").is_empty());
        assert!(
            cidr_warnings(p, "not a cidr").is_empty(),
            "validation's job"
        );
        assert_eq!(
            cidr_warnings(p, "192.168.1.1/24"),
            vec![format!(
                "{p}: CIDR value \"192.168.1.1/24\" is ambiguous in this context (should be \"192.168.1.0/24\" or \"192.168.1.1/32\"?)"
            )]
        );
        assert_eq!(
            cidr_warnings(p, "::ffff:10.0.0.0/104"),
            vec![format!(
                "{p}: non-standard CIDR value \"::ffff:10.0.0.0/104\" will be considered invalid in a future Kubernetes release: use \"10.0.0.0/8\""
            )]
        );
        assert_eq!(
            cidr_warnings(p, "2001:DB8:0::/64"),
            vec![format!(
                "{p}: IPv6 CIDR value \"2001:DB8:0::/64\" should be in RFC 5952 canonical format (\"2001:db8::/64\")"
            )]
        );
    }
}
