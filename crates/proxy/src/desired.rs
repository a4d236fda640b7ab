//! The dataplane-neutral desired state: what every dataplane (nftables, iptables, userspace)
//! renders. A dataplane never reads API objects; it reads only these types.
//!
//! Per family (IPv4 and IPv6 are independent), the state holds node-level settings
//! ([`DesiredNode`]) and one [`DesiredServicePort`] per service port with a cluster IP of that
//! family. The semantics every dataplane must implement:
//!
//! * **Frontends.** Traffic to `cluster_ip:port` is *internal* traffic; traffic to
//!   `node address:node_port`, `external_ips:port` and `load_balancer_ips:port` is *external*.
//! * **Endpoint choice.** Internal traffic goes to [`DesiredServicePort::internal_endpoints`],
//!   external traffic to [`DesiredServicePort::external_endpoints`], uniformly at random
//!   (weighted by [`DesiredEndpoint::weight`]) unless session affinity pins a client IP.
//!   Exception (upstream's short-circuit): external traffic with `externalTrafficPolicy: Local`
//!   whose source is a pod (inside a cluster CIDR) or the node itself uses the internal-cluster
//!   set (`cluster_endpoints`), masquerading node-sourced traffic.
//! * **No endpoints.** When the relevant set is empty the traffic gets
//!   [`DesiredServicePort::internal_no_endpoints`] / `external_no_endpoints`: `Reject` (TCP RST or
//!   ICMP unreachable, so clients fail fast) when the service has no usable endpoint anywhere,
//!   `Drop` when only this node has none (Local policy).
//! * **Source ranges.** Traffic to a load-balancer IP from outside
//!   `load_balancer_source_ranges` (when non-empty) is dropped.
//! * **Masquerade.** Internal traffic per [`ClusterIpMasquerade`]; external traffic when
//!   `masquerade_external`; and always hairpin traffic (an endpoint reaching itself).

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
    /// Service CIDRs: traffic to an unallocated IP inside them is dropped, never routed on.
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

/// How internal (cluster IP) traffic is masqueraded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterIpMasquerade {
    /// `--masquerade-all`.
    All,
    /// Only traffic whose source is outside [`DesiredNode::cluster_cidrs`] (off-cluster clients).
    OffCluster,
    /// Never (no cluster CIDR known and no masquerade-all), except hairpin.
    Never,
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
    pub internal_no_endpoints: Option<NoEndpointsVerdict>,
    pub external_no_endpoints: Option<NoEndpointsVerdict>,
    pub cluster_ip_masquerade: ClusterIpMasquerade,
    pub masquerade_external: bool,
    /// Load-balancing algorithm requested for this service: its annotation, else
    /// `--scheduler`; `None` means the dataplane's default. Each dataplane resolves it with
    /// `svcnet_lb::resolve` and reports when it must fall back.
    pub lb_algorithm: Option<svcnet_lb::Algorithm>,
}

impl DesiredServicePort {
    /// Endpoints that internal (cluster IP) traffic may reach.
    pub fn internal_endpoints(&self) -> &[DesiredEndpoint] {
        match self.internal_policy {
            TrafficPolicy::Cluster => &self.cluster_endpoints,
            TrafficPolicy::Local => &self.local_endpoints,
        }
    }

    /// Endpoints that external (node port, external IP, LB IP) traffic may reach.
    pub fn external_endpoints(&self) -> &[DesiredEndpoint] {
        match self.external_policy {
            TrafficPolicy::Cluster => &self.cluster_endpoints,
            TrafficPolicy::Local => &self.local_endpoints,
        }
    }

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
    let Some(cluster_ip) = info.cluster_ips.get(&family).copied() else {
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
    let cluster_ip_masquerade = if node_state.masquerade_all {
        ClusterIpMasquerade::All
    } else if !node_state.cluster_cidrs.is_empty() {
        ClusterIpMasquerade::OffCluster
    } else {
        ClusterIpMasquerade::Never
    };
    let empty = Vec::new();
    info.ports
        .iter()
        .map(|p| {
            let all: &[EndpointInfo] = endpoints
                .and_then(|e| e.get(&(p.name.port.clone(), p.name.protocol)))
                .unwrap_or(&empty)
                .as_slice();
            // Only endpoints of this family can be programmed in this family's table.
            let family_eps: Vec<EndpointInfo> = all
                .iter()
                .filter(|e| IpFamily::of(&e.ip) == family)
                .cloned()
                .collect();
            let cat = categorize_endpoints(&family_eps, node, need_local);
            let verdict = |set_empty: bool| {
                set_empty.then_some(if cat.has_any {
                    NoEndpointsVerdict::Drop
                } else {
                    NoEndpointsVerdict::Reject
                })
            };
            let mut d = DesiredServicePort {
                name: p.name.clone(),
                family,
                protocol: p.name.protocol,
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
                internal_no_endpoints: None,
                external_no_endpoints: None,
                cluster_ip_masquerade,
                masquerade_external: info.external_policy == TrafficPolicy::Cluster,
                lb_algorithm: info.lb_algorithm.or(node_state.scheduler),
            };
            d.internal_no_endpoints = verdict(d.internal_endpoints().is_empty());
            d.external_no_endpoints = if d.has_external() {
                verdict(d.external_endpoints().is_empty())
            } else {
                None
            };
            d
        })
        .collect()
}
