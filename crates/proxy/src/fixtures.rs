//! Builders for test fixtures: `service("ns", "name", |s| ...)`, `slice(...)`, `node(...)`.
//! Public so that dataplane crates reuse them in their tests; pure data, no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, Service, ServicePort,
    ServiceSpec, ServiceStatus, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::endpoints::SERVICE_NAME_LABEL;

fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(ns.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// Builds a Service (type ClusterIP, no ports) and lets `f` customise it.
pub fn service(ns: &str, name: &str, f: impl FnOnce(&mut ServiceBuilder)) -> Service {
    let mut b = ServiceBuilder(Service {
        metadata: meta(ns, name),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            ..Default::default()
        }),
        status: None,
    });
    f(&mut b);
    b.0
}

pub struct ServiceBuilder(pub Service);

impl ServiceBuilder {
    fn spec(&mut self) -> &mut ServiceSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }
    pub fn type_(&mut self, t: &str) -> &mut Self {
        self.spec().type_ = Some(t.into());
        self
    }
    /// Sets the cluster IP(s); several for dual-stack.
    pub fn cluster_ip(&mut self, ips: &[&str]) -> &mut Self {
        self.spec().cluster_ip = ips.first().map(|s| s.to_string());
        self.spec().cluster_ips = Some(ips.iter().map(|s| s.to_string()).collect());
        self
    }
    pub fn port(&mut self, name: &str, protocol: &str, port: i32) -> &mut Self {
        self.spec()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: (!name.is_empty()).then(|| name.into()),
                protocol: Some(protocol.into()),
                port,
                ..Default::default()
            });
        self
    }
    /// Adds a port with a node port (and makes the service a NodePort unless it is a LoadBalancer).
    pub fn node_port(
        &mut self,
        name: &str,
        protocol: &str,
        port: i32,
        node_port: i32,
    ) -> &mut Self {
        if self.spec().type_.as_deref() != Some("LoadBalancer") {
            self.type_("NodePort");
        }
        self.port(name, protocol, port);
        if let Some(p) = self.spec().ports.as_mut().and_then(|p| p.last_mut()) {
            p.node_port = Some(node_port);
        }
        self
    }
    pub fn external_ips(&mut self, ips: &[&str]) -> &mut Self {
        self.spec().external_ips = Some(ips.iter().map(|s| s.to_string()).collect());
        self
    }
    /// Makes it a LoadBalancer with these ingress IPs.
    pub fn lb_ingress(&mut self, ips: &[&str]) -> &mut Self {
        self.type_("LoadBalancer");
        let ingress = ips
            .iter()
            .map(|ip| LoadBalancerIngress {
                ip: Some(ip.to_string()),
                ..Default::default()
            })
            .collect();
        self.0.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(ingress),
            }),
            ..Default::default()
        });
        self
    }
    pub fn source_ranges(&mut self, cidrs: &[&str]) -> &mut Self {
        self.spec().load_balancer_source_ranges =
            Some(cidrs.iter().map(|s| s.to_string()).collect());
        self
    }
    pub fn affinity(&mut self, timeout: Option<i32>) -> &mut Self {
        self.spec().session_affinity = Some("ClientIP".into());
        self.spec().session_affinity_config = timeout.map(|t| SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(t),
            }),
        });
        self
    }
    pub fn external_local(&mut self) -> &mut Self {
        self.spec().external_traffic_policy = Some("Local".into());
        self
    }
    pub fn internal_local(&mut self) -> &mut Self {
        self.spec().internal_traffic_policy = Some("Local".into());
        self
    }
    pub fn health_check_node_port(&mut self, port: i32) -> &mut Self {
        self.spec().health_check_node_port = Some(port);
        self
    }
    pub fn label(&mut self, k: &str, v: &str) -> &mut Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
}

/// Builds an EndpointSlice of `address_type` IPv4 for service `svc`.
pub fn slice(ns: &str, name: &str, svc: &str, f: impl FnOnce(&mut SliceBuilder)) -> EndpointSlice {
    let mut m = meta(ns, name);
    m.labels = Some(BTreeMap::from([(
        SERVICE_NAME_LABEL.to_string(),
        svc.to_string(),
    )]));
    let mut b = SliceBuilder(EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: Vec::new(),
        metadata: m,
        ports: None,
    });
    f(&mut b);
    b.0
}

pub struct SliceBuilder(pub EndpointSlice);

impl SliceBuilder {
    pub fn ipv6(&mut self) -> &mut Self {
        self.0.address_type = "IPv6".into();
        self
    }
    pub fn port(&mut self, name: &str, protocol: &str, port: i32) -> &mut Self {
        self.0
            .ports
            .get_or_insert_with(Vec::new)
            .push(EndpointPort {
                name: Some(name.into()),
                protocol: Some(protocol.into()),
                port: Some(port),
                app_protocol: None,
            });
        self
    }
    /// Adds a ready endpoint on `node`; `f` may change its conditions and hints.
    pub fn endpoint(&mut self, ip: &str, node: &str, f: impl FnOnce(&mut Endpoint)) -> &mut Self {
        let mut ep = Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: Some(node.into()),
            ..Default::default()
        };
        f(&mut ep);
        self.0.endpoints.push(ep);
        self
    }
}

/// Marks an endpoint terminating: not ready, still serving (graceful shutdown).
pub fn terminating(ep: &mut Endpoint) {
    ep.conditions = Some(EndpointConditions {
        ready: Some(false),
        serving: Some(true),
        terminating: Some(true),
    });
}

/// Marks an endpoint not ready and not serving.
pub fn not_ready(ep: &mut Endpoint) {
    ep.conditions = Some(EndpointConditions {
        ready: Some(false),
        serving: Some(false),
        terminating: Some(false),
    });
}

/// Sets zone hints.
pub fn zone_hints(ep: &mut Endpoint, zones: &[&str]) {
    let hints = ep.hints.get_or_insert_with(EndpointHints::default);
    hints.for_zones = Some(
        zones
            .iter()
            .map(|z| ForZone {
                name: z.to_string(),
            })
            .collect(),
    );
}

/// Sets node hints.
pub fn node_hints(ep: &mut Endpoint, nodes: &[&str]) {
    let hints = ep.hints.get_or_insert_with(EndpointHints::default);
    hints.for_nodes = Some(
        nodes
            .iter()
            .map(|n| ForNode {
                name: n.to_string(),
            })
            .collect(),
    );
}

/// Builds a Node, optionally with a zone label.
pub fn node(name: &str, zone: Option<&str>) -> Node {
    let mut m = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    if let Some(z) = zone {
        m.labels = Some(BTreeMap::from([(
            crate::state::ZONE_LABEL.to_string(),
            z.to_string(),
        )]));
    }
    Node {
        metadata: m,
        ..Default::default()
    }
}
