//! The userspace dataplane's per-service and per-endpoint counters on `/metrics`: a
//! Prometheus collector that reads `UserspaceProxy::metrics()` at every scrape (the counters
//! live in the data path as atomics; nothing is copied between scrapes).
//!
//! Families (prefix `kubeproxy_`): `userspace_service_connections_active` (gauge),
//! `userspace_service_connections_total`, `userspace_service_bytes_in_total`,
//! `userspace_service_bytes_out_total`, `userspace_service_connect_failures_total`,
//! `userspace_service_refused_total` (counters), labelled `service` (`ns/name/proto/port`) and
//! `algorithm`; the same with `userspace_endpoint_` and labels `service`, `endpoint`
//! (`ip:port`). `bytes_in` flows client → endpoint, `bytes_out` endpoint → client.
//! Frontends the proxy could not bind: `userspace_frontend_unbound` (gauge, 1 per frontend,
//! labels `address`, `protocol`, `reason`) and `userspace_frontend_bind_failures_total`
//! (failed attempts so far, retried with back-off).

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use svcnet_userspace::{ServiceMetrics, UnboundFrontend, UserspaceProxy};

/// Reads the userspace proxy's counters on each scrape.
pub struct UserspaceCollector(pub Arc<UserspaceProxy>);

impl fmt::Debug for UserspaceCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UserspaceCollector")
    }
}

type Labels = Vec<(&'static str, String)>;

/// One metric family: its name, help, type and the value per label set.
struct Family {
    name: &'static str,
    help: &'static str,
    gauge: bool,
    samples: Vec<(Labels, u64)>,
}

/// Why a bind failed, as a label: the error's last words (`permission_denied`, …).
fn reason(error: &str) -> String {
    let text = error.rsplit(": ").next().unwrap_or(error);
    let text = text.split(" (os error").next().unwrap_or(text);
    text.trim()
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The unbound frontends' families.
fn unbound_families(unbound: &[UnboundFrontend]) -> Vec<Family> {
    let labels = |u: &UnboundFrontend| -> Labels {
        vec![
            ("address", u.addr.to_string()),
            ("protocol", u.protocol.to_string()),
        ]
    };
    vec![
        Family {
            name: "userspace_frontend_unbound",
            help: "Frontends the userspace proxy wants but could not bind (retried with back-off)",
            gauge: true,
            samples: unbound
                .iter()
                .map(|u| {
                    let mut l = labels(u);
                    l.push(("reason", reason(&u.error)));
                    (l, 1)
                })
                .collect(),
        },
        Family {
            name: "userspace_frontend_bind_failures",
            help: "Failed attempts to bind a frontend that is still unbound",
            gauge: false,
            samples: unbound
                .iter()
                .map(|u| (labels(u), u64::from(u.attempts)))
                .collect(),
        },
    ]
}

/// The families for `metrics` (pure, so tests need no proxy).
fn families(metrics: &[ServiceMetrics]) -> Vec<Family> {
    type Get<T> = fn(&T) -> u64;
    let svc: [(&'static str, &'static str, bool, Get<ServiceMetrics>); 6] = [
        (
            "userspace_service_connections_active",
            "Open connections (UDP: flows) of a service port",
            true,
            |m| m.active,
        ),
        (
            "userspace_service_connections",
            "Connections (UDP: flows) accepted for a service port",
            false,
            |m| m.total,
        ),
        (
            "userspace_service_bytes_in",
            "Bytes relayed client to endpoint",
            false,
            |m| m.bytes_in,
        ),
        (
            "userspace_service_bytes_out",
            "Bytes relayed endpoint to client",
            false,
            |m| m.bytes_out,
        ),
        (
            "userspace_service_connect_failures",
            "Failed connects to endpoints (each retried on another endpoint)",
            false,
            |m| m.connect_failures,
        ),
        (
            "userspace_service_refused",
            "Connections refused because no endpoint could be reached",
            false,
            |m| m.refused,
        ),
    ];
    let ep: [(
        &'static str,
        &'static str,
        bool,
        Get<svcnet_userspace::EndpointMetrics>,
    ); 5] = [
        (
            "userspace_endpoint_connections_active",
            "Open connections to an endpoint",
            true,
            |e| e.active,
        ),
        (
            "userspace_endpoint_connections",
            "Connections relayed to an endpoint",
            false,
            |e| e.total,
        ),
        (
            "userspace_endpoint_bytes_in",
            "Bytes relayed client to endpoint",
            false,
            |e| e.bytes_in,
        ),
        (
            "userspace_endpoint_bytes_out",
            "Bytes relayed endpoint to client",
            false,
            |e| e.bytes_out,
        ),
        (
            "userspace_endpoint_connect_failures",
            "Failed connects to an endpoint",
            false,
            |e| e.connect_failures,
        ),
    ];
    let mut out = Vec::new();
    for (name, help, gauge, get) in svc {
        let samples = metrics
            .iter()
            .map(|m| {
                let labels = vec![
                    ("service", m.service.to_string()),
                    ("algorithm", m.algorithm.to_string()),
                ];
                (labels, get(m))
            })
            .collect();
        out.push(Family {
            name,
            help,
            gauge,
            samples,
        });
    }
    for (name, help, gauge, get) in ep {
        let samples = metrics
            .iter()
            .flat_map(|m| {
                m.endpoints.iter().map(move |e| {
                    let labels = vec![
                        ("service", m.service.to_string()),
                        ("endpoint", e.addr.to_string()),
                    ];
                    (labels, get(e))
                })
            })
            .collect();
        out.push(Family {
            name,
            help,
            gauge,
            samples,
        });
    }
    out
}

fn encode(families: &[Family], mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
    for f in families {
        let kind = if f.gauge {
            MetricType::Gauge
        } else {
            MetricType::Counter
        };
        let mut metric = encoder.encode_descriptor(f.name, f.help, None, kind)?;
        for (labels, value) in &f.samples {
            let sample = metric.encode_family(labels)?;
            if f.gauge {
                ConstGauge::new(i64::try_from(*value).unwrap_or(i64::MAX)).encode(sample)?;
            } else {
                ConstCounter::new(*value).encode(sample)?;
            }
        }
    }
    Ok(())
}

impl Collector for UserspaceCollector {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let mut all = families(&self.0.metrics());
        all.extend(unbound_families(&self.0.unbound()));
        encode(&all, encoder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;
    use svcnet_lb::Algorithm;
    use svcnet_proxy::{Protocol, ServicePortName};
    use svcnet_userspace::EndpointMetrics;

    #[derive(Debug)]
    struct Fixed(Vec<ServiceMetrics>);
    impl Collector for Fixed {
        fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
            encode(&families(&self.0), encoder)
        }
    }

    #[derive(Debug)]
    struct Unbound(Vec<UnboundFrontend>);
    impl Collector for Unbound {
        fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
            encode(&unbound_families(&self.0), encoder)
        }
    }

    #[test]
    fn unbound_frontends_with_reason_and_attempts() {
        let u = UnboundFrontend {
            addr: "127.96.0.1:443".parse().unwrap(),
            protocol: "TCP",
            error: "cannot bind TCP 127.96.0.1:443: Permission denied (os error 13)".into(),
            hint: None,
            attempts: 4,
            since: std::time::SystemTime::UNIX_EPOCH,
            retry_in: std::time::Duration::from_secs(8),
        };
        let mut registry = Registry::with_prefix("kubeproxy");
        registry.register_collector(Box::new(Unbound(vec![u])));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "kubeproxy_userspace_frontend_unbound{address=\"127.96.0.1:443\",protocol=\"TCP\",reason=\"permission_denied\"} 1",
            "kubeproxy_userspace_frontend_bind_failures_total{address=\"127.96.0.1:443\",protocol=\"TCP\"} 4",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn counters_and_gauges_per_service_and_endpoint() {
        let m = ServiceMetrics {
            service: ServicePortName::new("default", "web", "http", Protocol::Tcp),
            algorithm: Algorithm::RoundRobin,
            active: 2,
            total: 7,
            bytes_in: 100,
            bytes_out: 2000,
            connect_failures: 1,
            refused: 0,
            endpoints: vec![EndpointMetrics {
                addr: "10.244.1.2:8080".parse().unwrap(),
                active: 2,
                total: 6,
                connect_failures: 1,
                bytes_in: 90,
                bytes_out: 1900,
                down: false,
            }],
        };
        let mut registry = Registry::with_prefix("kubeproxy");
        registry.register_collector(Box::new(Fixed(vec![m])));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE kubeproxy_userspace_service_connections_active gauge",
            "kubeproxy_userspace_service_connections_active{service=\"default/web/tcp/http\",algorithm=\"rr\"} 2",
            "# TYPE kubeproxy_userspace_service_connections counter",
            "kubeproxy_userspace_service_connections_total{service=\"default/web/tcp/http\",algorithm=\"rr\"} 7",
            "kubeproxy_userspace_service_bytes_out_total{service=\"default/web/tcp/http\",algorithm=\"rr\"} 2000",
            "kubeproxy_userspace_endpoint_connect_failures_total{service=\"default/web/tcp/http\",endpoint=\"10.244.1.2:8080\"} 1",
            "kubeproxy_userspace_endpoint_bytes_in_total{service=\"default/web/tcp/http\",endpoint=\"10.244.1.2:8080\"} 90",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
