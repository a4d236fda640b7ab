//! The dataplane-neutral desired state: the facts every dataplane renders, through the
//! decided graph of [`crate::graph`]. A dataplane never reads API objects; it reads only these
//! types and the graph lowered from them.
//!
//! Per family (IPv4 and IPv6 are independent), the state holds node-level settings
//! ([`DesiredNode`]) and one [`DesiredServicePort`] per service port with a cluster IP of that
//! family: its frontends (cluster IP, node port, external and load-balancer IPs, source
//! ranges), its traffic policies, affinity, requested algorithm, and its endpoints as the one
//! selection function chose them ([`DesiredServicePort::cluster_endpoints`] under the Cluster
//! policy, [`DesiredServicePort::local_endpoints`] under Local). Which of them a connection
//! reaches, whether it is masqueraded and when it is refused is decided by
//! [`crate::graph::lower`], once, for every dataplane.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::categorize::{NodeTopology, categorize_endpoints};
use crate::endpoints::{EndpointInfo, ServiceEndpoints};
use crate::names::{IpFamily, Protocol, ServicePortName};
use crate::service::{ServiceInfo, TrafficPolicy};

/// Node-wide proxy settings (the pure part of the proxy configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreConfig {
    pub node_name: String,
    /// Masquerade all traffic to cluster IPs (`--masquerade-all`).
    pub masquerade_all: bool,
    /// Pod CIDRs (`--cluster-cidr`); traffic from outside them to a cluster IP is masqueraded.
    pub cluster_cidrs: Vec<IpNet>,
    /// Service CIDRs: traffic to an unallocated IP inside them is refused (see
    /// [`crate::graph::NODE_VERDICTS`]), never routed on.
    pub service_cidrs: Vec<IpNet>,
    /// Addresses that accept node-port traffic (`--nodeport-addresses`); empty means every
    /// local address of the node except loopback.
    pub nodeport_addresses: Vec<IpNet>,
    /// Proxy-wide load-balancing algorithm (`--scheduler`) for services without the
    /// `svcnet.io/lb-algorithm` annotation; `None` leaves the dataplane's default.
    pub scheduler: Option<svcnet_lb::Algorithm>,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            masquerade_all: false,
            cluster_cidrs: Vec::new(),
            service_cidrs: vec![
                IpNet::V4(ipnet::Ipv4Net::new_assert([10, 96, 0, 0].into(), 12)),
                IpNet::V6(ipnet::Ipv6Net::new_assert(
                    [0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0].into(),
                    112,
                )),
            ],
            nodeport_addresses: Vec::new(),
            scheduler: None,
        }
    }
}

/// Verdict for traffic to a frontend whose endpoint set is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoEndpointsVerdict {
    /// The service has no usable endpoint anywhere: refuse fast (TCP RST / ICMP unreachable).
    Reject,
    /// Endpoints exist, but not on this node and the policy is Local: drop silently.
    Drop,
}

/// One selected endpoint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DesiredEndpoint {
    pub ip: IpAddr,
    pub port: u16,
    /// Relative weight; Kubernetes endpoints are all equal, so 1 today.
    pub weight: u32,
    /// Whether the endpoint runs on this node.
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

/// Desired state of one service port in one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredServicePort {
    pub name: ServicePortName,
    pub family: IpFamily,
    pub protocol: Protocol,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    /// Allowed sources for load-balancer IPs (this family only); empty = everyone.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// ClientIP session affinity timeout in seconds.
    pub affinity_timeout: Option<u32>,
    pub internal_policy: TrafficPolicy,
    pub external_policy: TrafficPolicy,
    pub health_check_node_port: Option<u16>,
    /// Endpoints under the Cluster policy (ready, topology, terminating fallback).
    pub cluster_endpoints: Vec<DesiredEndpoint>,
    /// This node's endpoints, for Local policies (empty when no policy is Local).
    pub local_endpoints: Vec<DesiredEndpoint>,
    /// Load-balancing algorithm requested for this service: its annotation, else
    /// `--scheduler`; `None` means the dataplane's default. Each dataplane resolves it with
    /// `svcnet_lb::resolve` and reports when it must fall back.
    pub lb_algorithm: Option<svcnet_lb::Algorithm>,
}

impl DesiredServicePort {
    /// Whether the port has any external frontend.
    pub fn has_external(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }

    /// Every endpoint some traffic may reach (for conntrack cleanup and health checks).
    pub fn reachable_endpoints(&self) -> impl Iterator<Item = &DesiredEndpoint> {
        let mut all: Vec<&DesiredEndpoint> = self
            .cluster_endpoints
            .iter()
            .chain(&self.local_endpoints)
            .collect();
        all.sort();
        all.dedup();
        all.into_iter()
    }
}

/// Node-level state of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredNode {
    pub family: IpFamily,
    pub cluster_cidrs: Vec<IpNet>,
    pub service_cidrs: Vec<IpNet>,
    pub nodeport_addresses: Vec<IpNet>,
    pub masquerade_all: bool,
    /// `--scheduler`, see [`CoreConfig::scheduler`].
    pub scheduler: Option<svcnet_lb::Algorithm>,
}

impl DesiredNode {
    pub fn new(family: IpFamily, config: &CoreConfig) -> Self {
        let pick = |nets: &[IpNet]| {
            nets.iter()
                .filter(|n| IpFamily::of_net(n) == family)
                .copied()
                .collect()
        };
        Self {
            family,
            cluster_cidrs: pick(&config.cluster_cidrs),
            service_cidrs: pick(&config.service_cidrs),
            nodeport_addresses: pick(&config.nodeport_addresses),
            masquerade_all: config.masquerade_all,
            scheduler: config.scheduler,
        }
    }
}

/// The whole desired state of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFamily {
    pub node: DesiredNode,
    pub services: BTreeMap<ServicePortName, DesiredServicePort>,
}

fn to_desired(ep: &EndpointInfo, node: &NodeTopology) -> DesiredEndpoint {
    DesiredEndpoint {
        ip: ep.ip,
        port: ep.port,
        weight: 1,
        is_local: ep.node_name.as_deref() == Some(node.name.as_str()),
        ready: ep.ready,
        serving: ep.serving,
        terminating: ep.terminating,
    }
}

/// Computes the desired state of every port of one service in one family. The service is
/// absent from the family (empty result) if it has no cluster IP of that family.
pub fn desired_service_ports(
    info: &ServiceInfo,
    endpoints: Option<&ServiceEndpoints>,
    family: IpFamily,
    node: &NodeTopology,
    node_state: &DesiredNode,
) -> Vec<DesiredServicePort> {
    let Some(cluster_ip) = info.cluster_ips.get(family) else {
        return Vec::new();
    };
    let same_family = |ip: &&IpAddr| IpFamily::of(ip) == family;
    let external_ips: Vec<IpAddr> = info
        .external_ips
        .iter()
        .filter(same_family)
        .copied()
        .collect();
    let load_balancer_ips: Vec<IpAddr> = info
        .load_balancer_ips
        .iter()
        .filter(same_family)
        .copied()
        .collect();
    let ranges: Vec<IpNet> = info
        .load_balancer_source_ranges
        .iter()
        .filter(|n| IpFamily::of_net(n) == family)
        .copied()
        .collect();
    let need_local = info.internal_policy == TrafficPolicy::Local
        || info.external_policy == TrafficPolicy::Local;
    info.ports
        .iter()
        .map(|p| {
            let all: &[EndpointInfo] = endpoints.map_or(&[], |e| e.get(&p.name, p.protocol));
            // Only endpoints of this family can be programmed in this family's table.
            let family_eps: Vec<EndpointInfo> = all
                .iter()
                .filter(|e| IpFamily::of(&e.ip) == family)
                .cloned()
                .collect();
            let cat = categorize_endpoints(&family_eps, node, need_local);
            DesiredServicePort {
                name: ServicePortName {
                    service: (*info.name).clone(),
                    port: p.name.to_string(),
                    protocol: p.protocol,
                },
                family,
                protocol: p.protocol,
                cluster_ip,
                port: p.port,
                node_port: p.node_port,
                external_ips: external_ips.clone(),
                load_balancer_ips: load_balancer_ips.clone(),
                load_balancer_source_ranges: ranges.clone(),
                affinity_timeout: info.affinity_timeout,
                internal_policy: info.internal_policy,
                external_policy: info.external_policy,
                health_check_node_port: info.health_check_node_port,
                cluster_endpoints: cat.cluster.iter().map(|e| to_desired(e, node)).collect(),
                local_endpoints: cat.local.iter().map(|e| to_desired(e, node)).collect(),
                lb_algorithm: info.lb_algorithm.or(node_state.scheduler),
            }
        })
        .collect()
}
