//! Name helpers: dashed IPs (`10-244-1-5`, `fd00-10-244--5`), and labels relative to a zone.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::rr::Name;

/// The label CoreDNS and the spec use for an address without a hostname: IPv4 dots and IPv6
/// colons become dashes (`10.244.1.5` → `10-244-1-5`, `fd00::5` → `fd00--5`).
pub fn dashed_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// The inverse of [`dashed_ip`]; `None` for anything that is not exactly a dashed address.
pub fn parse_dashed_ip(label: &str) -> Option<IpAddr> {
    if label.is_empty() || label.len() > 39 {
        return None;
    }
    if label.split('-').count() == 4
        && let Ok(v4) = label.replace('-', ".").parse::<Ipv4Addr>()
    {
        return Some(IpAddr::V4(v4));
    }
    // An IPv4-mapped IPv6 address would contain dots, which a dashed label never has.
    label
        .replace('-', ":")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// The labels of `name` below `origin`, lower-cased (borrowed when already lower-case, as
/// almost every question is), leftmost first; `None` when `name` is not `origin` or below it.
pub(crate) fn relative_labels<'a>(name: &'a Name, origin: &Name) -> Option<Vec<Cow<'a, str>>> {
    // One pass of each label iterator (they know their length; not `num_labels()`, which does
    // not count a leading `*`): the origin's labels against the name's last ones, from the
    // root, then the rest of the name's, leftmost first.
    let mut labels = name.iter();
    let mut origin_labels = origin.iter();
    if labels.len() < origin_labels.len() {
        return None;
    }
    while let Some(o) = origin_labels.next_back() {
        if !labels.next_back()?.eq_ignore_ascii_case(o) {
            return None;
        }
    }
    Some(
        labels
            .map(|l| match std::str::from_utf8(l) {
                Ok(s) if !s.bytes().any(|b| b.is_ascii_uppercase()) => Cow::Borrowed(s),
                _ => Cow::Owned(String::from_utf8_lossy(l).to_ascii_lowercase()),
            })
            .collect(),
    )
}

/// The full address of a complete reverse name (`4.3.2.1.in-addr.arpa.`, 32 nibbles of
/// `ip6.arpa.`); `None` for partial or malformed reverse names.
pub(crate) fn reverse_ip(name: &Name) -> Option<IpAddr> {
    let mut fqdn = name.clone();
    fqdn.set_fqdn(true);
    let net = fqdn.parse_arpa_name().ok()?;
    if net.prefix_len() != net.max_prefix_len() {
        return None;
    }
    Some(net.addr())
}

/// `in-addr.arpa.` or `ip6.arpa.`: the SOA owner for negative reverse answers.
pub(crate) fn reverse_apex(ip: IpAddr) -> Name {
    let text = match ip {
        IpAddr::V4(_) => "in-addr.arpa.",
        IpAddr::V6(_) => "ip6.arpa.",
    };
    Name::from_ascii(text).unwrap_or_else(|_| Name::root())
}

/// Whether `name` lies under `in-addr.arpa.` or `ip6.arpa.`.
pub(crate) fn is_reverse(name: &Name) -> bool {
    let mut labels = name.iter().rev();
    let last = labels.next().map(|l| l.eq_ignore_ascii_case(b"arpa"));
    let second = labels
        .next()
        .map(|l| l.eq_ignore_ascii_case(b"in-addr") || l.eq_ignore_ascii_case(b"ip6"));
    last == Some(true) && second == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dashed_round_trip() {
        for ip in ["10.244.1.5", "fd00::5", "2001:db8:1:2:3:4:5:6", "::1"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(parse_dashed_ip(&dashed_ip(ip)), Some(ip), "{ip}");
        }
        assert_eq!(dashed_ip("fd00::5".parse().unwrap()), "fd00--5");
        for bad in [
            "",
            "10-244-1",
            "10-244-1-5-6",
            "web-0",
            "1-2-3-256",
            "a-b-c-d",
        ] {
            assert_eq!(parse_dashed_ip(bad), None, "{bad}");
        }
    }

    #[test]
    fn reverse_names() {
        let n = Name::from_ascii("12.10.168.192.in-addr.arpa.").unwrap();
        assert_eq!(reverse_ip(&n), Some("192.168.10.12".parse().unwrap()));
        assert!(is_reverse(&n));
        let partial = Name::from_ascii("10.168.192.in-addr.arpa.").unwrap();
        assert_eq!(reverse_ip(&partial), None);
        assert!(!is_reverse(&Name::from_ascii("example.com.").unwrap()));
        let v6 = Name::from_ascii(
            "5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.",
        )
        .unwrap();
        assert_eq!(reverse_ip(&v6), Some("fd00::5".parse().unwrap()));
    }
}
