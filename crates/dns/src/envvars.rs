//! Service environment variables, exactly as the kubelet injects them into containers
//! (`pkg/kubelet/envvars` and `getServiceEnvVarMap`).
//!
//! For every service with a cluster IP in the pod's namespace (only with `enableServiceLinks`,
//! the default) and always for the master service `default/kubernetes`:
//! `{SVC}_SERVICE_HOST`, `{SVC}_SERVICE_PORT` (first port), `{SVC}_SERVICE_PORT_{NAME}` per named
//! port, and the Docker-link variables `{SVC}_PORT`, `{SVC}_PORT_{port}_{PROTO}` and its
//! `_PROTO`, `_PORT`, `_ADDR`. Headless and ExternalName services get none.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Service;

/// The namespace of the master services.
const MASTER_NAMESPACE: &str = "default";
/// Services whose variables every pod gets, whatever its namespace and `enableServiceLinks`.
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// One `NAME=value` variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEnv {
    pub name: String,
    pub value: String,
}

impl fmt::Display for ServiceEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// The variables a pod created now in `namespace` gets, given every service the kubelet sees
/// (any namespace; filtering is done here). Ordered by service name, then as the kubelet builds
/// them per service; the kubelet itself gives no order.
///
/// A service named like a master service in the pod's own namespace replaces the master one, as
/// in the kubelet. Variables the user sets on a container win over these; the caller applies that.
pub fn service_env_vars<'a>(
    namespace: &str,
    services: impl IntoIterator<Item = &'a Service>,
    enable_service_links: bool,
) -> Vec<ServiceEnv> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for svc in services {
        let (Some(ns), Some(name)) = (&svc.metadata.namespace, &svc.metadata.name) else {
            continue;
        };
        if cluster_ip(svc).is_none() {
            continue;
        }
        if ns == MASTER_NAMESPACE && MASTER_SERVICES.contains(&name.as_str()) {
            chosen.entry(name).or_insert(svc);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name, svc);
        }
    }
    let mut out = Vec::new();
    for (name, svc) in chosen {
        from_service(name, svc, &mut out);
    }
    out
}

/// The primary cluster IP, when the service has one (not headless, not ExternalName).
fn cluster_ip(svc: &Service) -> Option<&str> {
    let ip = svc.spec.as_ref()?.cluster_ip.as_deref()?;
    (!ip.is_empty() && ip != "None").then_some(ip)
}

/// Upper case, `-` and `.` become `_`, as the kubelet names variables.
pub fn env_var_name(service_name: &str) -> String {
    service_name.to_ascii_uppercase().replace(['-', '.'], "_")
}

fn from_service(name: &str, svc: &Service, out: &mut Vec<ServiceEnv>) {
    let Some(ip) = cluster_ip(svc) else { return };
    let ports: Vec<_> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|p| p.iter().collect())
        .unwrap_or_default();
    let prefix = env_var_name(name);
    let mut push = |name: String, value: String| out.push(ServiceEnv { name, value });

    push(format!("{prefix}_SERVICE_HOST"), ip.to_string());
    // A service with a cluster IP has at least one port (API validation); without one the
    // kubelet would crash, we just stop after the host.
    let Some(first) = ports.first() else { return };
    push(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
    for p in &ports {
        if let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            push(
                format!("{prefix}_SERVICE_PORT_{}", env_var_name(port_name)),
                p.port.to_string(),
            );
        }
    }

    // Docker-link style variables.
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    for (i, p) in ports.iter().enumerate() {
        let proto = p
            .protocol
            .as_deref()
            .filter(|p| !p.is_empty())
            .unwrap_or("TCP");
        let lower = proto.to_ascii_lowercase();
        let url = format!("{lower}://{host}:{}", p.port);
        if i == 0 {
            push(format!("{prefix}_PORT"), url.clone());
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, proto.to_ascii_uppercase());
        push(port_prefix.clone(), url);
        push(format!("{port_prefix}_PROTO"), lower);
        push(format!("{port_prefix}_PORT"), p.port.to_string());
        push(format!("{port_prefix}_ADDR"), ip.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn service(ns: &str, name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, port, proto)| ServicePort {
                            name: (!n.is_empty()).then(|| n.to_string()),
                            port: *port,
                            protocol: (!proto.is_empty()).then(|| proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn cluster() -> Vec<Service> {
        vec![
            service(
                "default",
                "kubernetes",
                "10.96.0.1",
                &[("https", 443, "TCP")],
            ),
            service("demo", "my-app", "192.168.10.12", &[("", 8080, "")]),
            service("demo", "headless", "None", &[("web", 80, "TCP")]),
            service("demo", "external", "", &[]),
            service(
                "demo",
                "dns",
                "10.96.0.10",
                &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")],
            ),
            service("other", "elsewhere", "10.96.9.9", &[("", 80, "")]),
            service("demo", "v6", "fd00:10:96::5", &[("", 80, "")]),
        ]
    }

    fn check(ns: &str, links: bool, expect: Expect) {
        let services = cluster();
        let vars = service_env_vars(ns, &services, links);
        let text: String = vars.iter().map(|v| format!("{v}\n")).collect();
        expect.assert_eq(&text);
    }

    #[test]
    fn seed_my_app_and_master_service() {
        check(
            "demo",
            true,
            expect![[r#"
                DNS_SERVICE_HOST=10.96.0.10
                DNS_SERVICE_PORT=53
                DNS_SERVICE_PORT_DNS=53
                DNS_SERVICE_PORT_DNS_TCP=53
                DNS_PORT=udp://10.96.0.10:53
                DNS_PORT_53_UDP=udp://10.96.0.10:53
                DNS_PORT_53_UDP_PROTO=udp
                DNS_PORT_53_UDP_PORT=53
                DNS_PORT_53_UDP_ADDR=10.96.0.10
                DNS_PORT_53_TCP=tcp://10.96.0.10:53
                DNS_PORT_53_TCP_PROTO=tcp
                DNS_PORT_53_TCP_PORT=53
                DNS_PORT_53_TCP_ADDR=10.96.0.10
                KUBERNETES_SERVICE_HOST=10.96.0.1
                KUBERNETES_SERVICE_PORT=443
                KUBERNETES_SERVICE_PORT_HTTPS=443
                KUBERNETES_PORT=tcp://10.96.0.1:443
                KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443
                KUBERNETES_PORT_443_TCP_PROTO=tcp
                KUBERNETES_PORT_443_TCP_PORT=443
                KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1
                MY_APP_SERVICE_HOST=192.168.10.12
                MY_APP_SERVICE_PORT=8080
                MY_APP_PORT=tcp://192.168.10.12:8080
                MY_APP_PORT_8080_TCP=tcp://192.168.10.12:8080
                MY_APP_PORT_8080_TCP_PROTO=tcp
                MY_APP_PORT_8080_TCP_PORT=8080
                MY_APP_PORT_8080_TCP_ADDR=192.168.10.12
                V6_SERVICE_HOST=fd00:10:96::5
                V6_SERVICE_PORT=80
                V6_PORT=tcp://[fd00:10:96::5]:80
                V6_PORT_80_TCP=tcp://[fd00:10:96::5]:80
                V6_PORT_80_TCP_PROTO=tcp
                V6_PORT_80_TCP_PORT=80
                V6_PORT_80_TCP_ADDR=fd00:10:96::5
            "#]],
        );
    }

    #[test]
    fn service_links_disabled_keeps_only_master_services() {
        check(
            "demo",
            false,
            expect![[r#"
                KUBERNETES_SERVICE_HOST=10.96.0.1
                KUBERNETES_SERVICE_PORT=443
                KUBERNETES_SERVICE_PORT_HTTPS=443
                KUBERNETES_PORT=tcp://10.96.0.1:443
                KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443
                KUBERNETES_PORT_443_TCP_PROTO=tcp
                KUBERNETES_PORT_443_TCP_PORT=443
                KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1
            "#]],
        );
    }

    #[test]
    fn local_service_named_kubernetes_wins() {
        let mut services = cluster();
        services.push(service(
            "demo",
            "kubernetes",
            "10.96.7.7",
            &[("", 6443, "")],
        ));
        let vars = service_env_vars("demo", &services, true);
        let host: Vec<_> = vars
            .iter()
            .filter(|v| v.name == "KUBERNETES_SERVICE_HOST")
            .collect();
        assert_eq!(host.len(), 1);
        assert_eq!(host[0].value, "10.96.7.7");
    }
}
