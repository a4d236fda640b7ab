//! Builders for the API objects the zone reads, for tests, benchmarks and examples:
//! `cluster_ip("default", "myapp", &["10.96.0.5"], &[("http", "TCP", 80)])`,
//! `slice("default", "myapp", "myapp-1", &ports).ep("10.244.1.5", Some("web-0"), true)`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Namespace, ObjectReference, Pod, PodIP, PodStatus,
    Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `(name, protocol, port)`; an empty name is an unnamed port.
pub type Port<'a> = (&'a str, &'a str, i32);

fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(ns.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

fn service_ports(ports: &[Port<'_>]) -> Option<Vec<ServicePort>> {
    Some(
        ports
            .iter()
            .map(|(name, proto, port)| ServicePort {
                name: (!name.is_empty()).then(|| name.to_string()),
                protocol: Some(proto.to_string()),
                port: *port,
                ..Default::default()
            })
            .collect(),
    )
}

/// A ClusterIP service with these cluster IPs (primary first).
pub fn cluster_ip(ns: &str, name: &str, ips: &[&str], ports: &[Port<'_>]) -> Arc<Service> {
    Arc::new(Service {
        metadata: meta(ns, name),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: ips.first().map(|s| s.to_string()),
            cluster_ips: Some(ips.iter().map(|s| s.to_string()).collect()),
            ports: service_ports(ports),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// A headless service (`clusterIP: None`).
pub fn headless(ns: &str, name: &str, ports: &[Port<'_>]) -> Arc<Service> {
    cluster_ip(ns, name, &["None"], ports)
}

/// An ExternalName service.
pub fn external(ns: &str, name: &str, target: &str) -> Arc<Service> {
    Arc::new(Service {
        metadata: meta(ns, name),
        spec: Some(ServiceSpec {
            type_: Some("ExternalName".into()),
            external_name: Some(target.into()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Builder methods on a service fixture.
pub trait ServiceFixture {
    /// Sets `spec.publishNotReadyAddresses: true`.
    fn publish_not_ready(self) -> Self;
    /// Sets `spec.externalIPs` and the LoadBalancer ingress IPs (`status.loadBalancer`).
    fn external_ips(self, spec: &[&str], ingress: &[&str]) -> Self;
}

impl ServiceFixture for Arc<Service> {
    fn external_ips(mut self, spec_ips: &[&str], ingress: &[&str]) -> Self {
        let svc = Arc::make_mut(&mut self);
        if let Some(spec) = svc.spec.as_mut() {
            spec.external_ips = Some(spec_ips.iter().map(|s| s.to_string()).collect());
        }
        svc.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(
                    ingress
                        .iter()
                        .map(|ip| LoadBalancerIngress {
                            ip: Some(ip.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
        self
    }

    fn publish_not_ready(mut self) -> Self {
        let svc = Arc::make_mut(&mut self);
        if let Some(spec) = svc.spec.as_mut() {
            spec.publish_not_ready_addresses = Some(true);
        }
        self
    }
}

/// An EndpointSlice of `svc` (address type from the first endpoint added; IPv4 when empty).
pub fn slice(ns: &str, svc: &str, name: &str, ports: &[Port<'_>]) -> Arc<EndpointSlice> {
    let mut metadata = meta(ns, name);
    metadata.labels = Some(BTreeMap::from([(
        "kubernetes.io/service-name".to_string(),
        svc.to_string(),
    )]));
    Arc::new(EndpointSlice {
        metadata,
        address_type: "IPv4".into(),
        endpoints: Vec::new(),
        ports: Some(
            ports
                .iter()
                .map(|(name, proto, port)| EndpointPort {
                    name: Some(name.to_string()),
                    protocol: Some(proto.to_string()),
                    port: Some(*port),
                    ..Default::default()
                })
                .collect(),
        ),
    })
}

/// Builder methods on a slice fixture.
pub trait SliceFixture {
    /// Adds an endpoint with one address, an optional hostname and a ready condition.
    fn ep(self, ip: &str, hostname: Option<&str>, ready: bool) -> Self;
    /// Adds a ready endpoint without a hostname whose targetRef is pod `pod`.
    fn pod_ep(self, ip: &str, pod: &str) -> Self;
}

impl SliceFixture for Arc<EndpointSlice> {
    fn ep(mut self, ip: &str, hostname: Option<&str>, ready: bool) -> Self {
        let slice = Arc::make_mut(&mut self);
        if slice.endpoints.is_empty() && ip.contains(':') {
            slice.address_type = "IPv6".into();
        }
        slice.endpoints.push(Endpoint {
            addresses: vec![ip.into()],
            hostname: hostname.map(str::to_string),
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(ready),
                terminating: Some(false),
            }),
            ..Default::default()
        });
        self
    }

    fn pod_ep(self, ip: &str, pod: &str) -> Self {
        let mut out = self.ep(ip, None, true);
        let slice = Arc::make_mut(&mut out);
        if let Some(ep) = slice.endpoints.last_mut() {
            ep.target_ref = Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                namespace: slice.metadata.namespace.clone(),
                ..Default::default()
            });
        }
        out
    }
}

/// A running pod with one IP.
pub fn pod(ns: &str, name: &str, ip: &str) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: meta(ns, name),
        status: Some(PodStatus {
            pod_ip: Some(ip.into()),
            pod_ips: Some(vec![PodIP { ip: ip.into() }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// A namespace.
pub fn namespace(name: &str) -> Arc<Namespace> {
    Arc::new(Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    })
}
