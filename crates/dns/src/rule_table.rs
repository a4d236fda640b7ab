//! The rule table shared by the pure zone tests and the over-the-wire `dig` tests: the API
//! objects (`world`), the fake upstream's records, and the cases of `tests/rules.txt`
//! (query → expected answer text), parsed into [`Case`]s.
//!
//! Test support, like [`crate::fixtures`]: nothing in the server uses it.

use std::sync::Arc;

use hickory_proto::rr::rdata::{A, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::fixtures::*;
use crate::zone::{Objects, Outcome, PodMode, Zone, ZoneConfig, ZoneError};

/// The table, as text.
pub const RULES: &str = include_str!("../tests/rules.txt");

/// The SOA serial every table zone is built with.
pub const SERIAL: u32 = 1_700_000_000;

/// One block of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// 1-based line of the block's first query in `tests/rules.txt`.
    pub line: usize,
    pub pods: PodMode,
    /// Options in CoreDNS's syntax (`options: ignore empty_service`), one per line.
    pub options: Vec<String>,
    /// `NAME TYPE [CLASS]`; every one gets `expected`.
    pub queries: Vec<String>,
    /// The zone's answer as [`crate::Response`]'s text, or `forward\n`.
    pub expected: String,
    /// What `dig` sees.
    pub wire: Wire,
}

/// A case's expectation over the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum Wire {
    /// The zone's answer, as is.
    Same,
    /// This text instead (forwarded and chased answers carry the upstream's records).
    Expect(String),
    /// Not run over the wire, for this reason.
    Skip(String),
}

/// A malformed table or query.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("tests/rules.txt line {0}: {1}")]
    Table(usize, String),
    #[error("query {0:?}: {1}")]
    Query(String, String),
    #[error(transparent)]
    Zone(#[from] ZoneError),
}

/// Parses `tests/rules.txt`.
pub fn cases() -> Result<Vec<Case>, RuleError> {
    parse(RULES)
}

/// Parses a table in the format of `tests/rules.txt`.
pub fn parse(text: &str) -> Result<Vec<Case>, RuleError> {
    let mut cases = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while lines.peek().is_some() {
        let mut pods = PodMode::Insecure;
        let mut options = Vec::new();
        let mut queries = Vec::new();
        let mut line = 0;
        let mut expected = String::new();
        let mut wire: Option<String> = None;
        let mut skip = None;
        for (i, l) in lines.by_ref() {
            if l.trim().is_empty() {
                break;
            }
            if l.starts_with('#') {
                continue;
            }
            if let Some(mode) = l.strip_prefix("pods: ") {
                pods = mode.parse().map_err(|e| RuleError::Table(i + 1, e))?;
            } else if let Some(option) = l.strip_prefix("options: ") {
                let mut config = ZoneConfig::new("cluster.local")?;
                config
                    .apply_option(option)
                    .map_err(|e| RuleError::Table(i + 1, e.to_string()))?;
                options.push(option.trim().to_string());
            } else if let Some(q) = l.strip_prefix("query: ") {
                if queries.is_empty() {
                    line = i + 1;
                }
                queries.push(q.trim().to_string());
            } else if let Some(reason) = l.strip_prefix("wire: skip") {
                skip = Some(reason.trim().to_string());
            } else if l == "wire:" {
                wire = Some(String::new());
            } else if let Some(w) = wire.as_mut() {
                w.push_str(l);
                w.push('\n');
            } else {
                expected.push_str(l);
                expected.push('\n');
            }
        }
        if queries.is_empty() {
            if expected.is_empty() && wire.is_none() {
                continue;
            }
            return Err(RuleError::Table(line, "a block without `query:`".into()));
        }
        if expected.is_empty() {
            return Err(RuleError::Table(line, "a case without an answer".into()));
        }
        let wire = match (skip, wire) {
            (Some(reason), _) => Wire::Skip(reason),
            (None, Some(text)) => Wire::Expect(text),
            (None, None) => Wire::Same,
        };
        cases.push(Case {
            line,
            pods,
            options,
            queries,
            expected,
            wire,
        });
    }
    Ok(cases)
}

/// Splits `NAME TYPE [CLASS]`.
pub fn parse_query(query: &str) -> Result<(Name, RecordType, DNSClass), RuleError> {
    let err = |e: &dyn std::fmt::Display| RuleError::Query(query.to_string(), e.to_string());
    let mut parts = query.split_whitespace();
    let (Some(name), Some(qtype)) = (parts.next(), parts.next()) else {
        return Err(err(&"expected NAME TYPE [CLASS]"));
    };
    let name = Name::from_ascii(name).map_err(|e| err(&e))?;
    let qtype: RecordType = qtype.parse().map_err(|e| err(&e))?;
    let class: DNSClass = match parts.next() {
        Some(c) => c.parse().map_err(|e| err(&e))?,
        None => DNSClass::IN,
    };
    Ok((name, qtype, class))
}

/// The configuration of the table's zone in this pod mode, with these options.
pub fn zone_config(pods: PodMode, options: &[String]) -> Result<ZoneConfig, RuleError> {
    let mut config = ZoneConfig::new("cluster.local")?;
    config.pods = pods;
    for option in options {
        config.apply_option(option)?;
    }
    Ok(config)
}

/// The table's zone in this pod mode (no options).
pub fn zone(pods: PodMode) -> Result<Zone, RuleError> {
    zone_with(pods, &[])
}

/// The table's zone in this pod mode, with these options.
pub fn zone_with(pods: PodMode, options: &[String]) -> Result<Zone, RuleError> {
    Ok(Zone::build(
        Arc::new(zone_config(pods, options)?),
        &world(),
        SERIAL,
    ))
}

/// Each distinct (pod mode, options) the cases ask for, in order of first use.
pub fn setups(cases: &[Case]) -> Vec<(PodMode, Vec<String>)> {
    let mut out: Vec<(PodMode, Vec<String>)> = Vec::new();
    for case in cases {
        let setup = (case.pods, case.options.clone());
        if !out.contains(&setup) {
            out.push(setup);
        }
    }
    out
}

/// The zone's answer to `query` as text (`forward\n` when it goes upstream).
pub fn answer_text(zone: &Zone, query: &str) -> Result<String, RuleError> {
    let (name, qtype, class) = parse_query(query)?;
    let mut rng = StdRng::seed_from_u64(7);
    Ok(match zone.lookup(&name, qtype, class, &mut rng) {
        Outcome::Forward => "forward\n".to_string(),
        Outcome::Answer(r) => r.to_string(),
    })
}

/// The API objects every case is asked against.
pub fn world() -> Objects {
    Objects {
        services: vec![
            cluster_ip(
                "default",
                "kubernetes",
                &["10.96.0.1"],
                &[("https", "TCP", 443)],
            ),
            cluster_ip(
                "default",
                "myapp",
                &["10.96.221.214"],
                &[("http", "TCP", 80)],
            ),
            headless("default", "myapp-headless", &[("", "TCP", 80)]),
            headless("default", "nginx", &[("web", "TCP", 80)]),
            headless("default", "peers", &[("peer", "TCP", 2380)]).publish_not_ready(),
            headless("default", "empty-headless", &[("web", "TCP", 80)]),
            external("default", "my-service-1", "www.baidu.com"),
            external("default", "nowhere", "missing.example.org"),
            external("default", "alias", "MyApp.default.svc.cluster.local"),
            external("default", "dangling", "nothing.default.svc.cluster.local"),
            external("default", "loop-a", "loop-b.default.svc.cluster.local"),
            external("default", "loop-b", "loop-a.default.svc.cluster.local"),
            cluster_ip(
                "default",
                "dual",
                &["10.96.0.50", "fd00:10:96::50"],
                &[("http", "TCP", 80), ("", "UDP", 53)],
            ),
            cluster_ip(
                "kube-system",
                "kube-dns",
                &["10.96.0.10"],
                &[("dns", "UDP", 53), ("dns-tcp", "TCP", 53)],
            )
            .external_ips(&[], &["10.200.0.53"]),
            // No endpoints at all (`ignore empty_service`), external IPs (`k8s_external`).
            cluster_ip(
                "default",
                "idle",
                &["10.96.0.60"],
                &[("http", "TCP", 80), ("dns", "UDP", 53)],
            )
            .external_ips(&["192.0.2.60"], &["10.200.0.60", "fd00:200::60"]),
            cluster_ip("other", "api", &["10.96.0.70"], &[("http", "TCP", 80)]),
            // Endpoints of pods without hostnames (`endpoint_pod_names`).
            headless("default", "pods", &[("http", "TCP", 80)]),
        ],
        endpoint_slices: vec![
            slice("default", "myapp", "myapp-1", &[("http", "TCP", 8080)])
                .ep("172.18.236.167", None, true)
                .ep("172.18.236.168", None, true)
                .ep("172.18.235.168", None, true)
                .ep("172.18.235.200", None, false),
            slice("default", "myapp-headless", "mh-1", &[("", "TCP", 80)])
                .ep("172.18.236.167", None, true)
                .ep("172.18.236.168", None, true)
                .ep("172.18.235.168", None, true),
            slice("default", "nginx", "nginx-1", &[("web", "TCP", 8080)])
                .ep("10.244.1.10", Some("web-0"), true)
                .ep("10.244.1.11", Some("web-1"), true)
                .ep("10.244.1.12", Some("web-2"), false),
            slice("default", "peers", "peers-1", &[("peer", "TCP", 2380)])
                .ep("10.244.2.1", Some("etcd-0"), true)
                .ep("10.244.2.2", Some("etcd-1"), false),
            slice("default", "empty-headless", "eh-1", &[("web", "TCP", 80)]).ep(
                "10.244.3.1",
                None,
                false,
            ),
            slice("other", "api", "api-1", &[("http", "TCP", 8080)]).ep("10.244.4.1", None, true),
            slice("default", "pods", "pods-1", &[("http", "TCP", 80)])
                .pod_ep("10.244.5.1", "pods-7d9f-abcde")
                .pod_ep(
                    "10.244.5.2",
                    "a-pod-name-that-is-longer-than-sixty-three-characters-is-not-a-label",
                )
                .ep("10.244.5.3", Some("named"), true),
        ],
        pods: vec![pod("default", "web-0", "10.244.1.10")],
        namespaces: vec![
            namespace("default"),
            namespace("kube-system"),
            namespace("quiet"),
            namespace("other"),
        ],
    }
}

/// What the fake upstream serves for the table: `www.baidu.com` (a CNAME chain) and
/// `example.org`; everything else is NXDOMAIN with [`crate::fake_upstream::fake_soa`].
pub fn upstream_records() -> Result<Vec<Record>, RuleError> {
    let n = |s: &str| Name::from_ascii(s).map_err(|e| RuleError::Query(s.into(), e.to_string()));
    Ok(vec![
        Record::from_rdata(
            n("www.baidu.com.")?,
            60,
            RData::CNAME(CNAME(n("www.a.shifen.com.")?)),
        ),
        Record::from_rdata(
            n("www.a.shifen.com.")?,
            60,
            RData::A(A::new(163, 177, 151, 110)),
        ),
        Record::from_rdata(
            n("www.a.shifen.com.")?,
            60,
            RData::A(A::new(163, 177, 151, 109)),
        ),
        Record::from_rdata(n("example.org.")?, 120, RData::A(A::new(192, 0, 2, 80))),
    ])
}
