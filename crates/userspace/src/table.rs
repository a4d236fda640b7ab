//! The pure half of the dataplane: from the desired state, the routes (one per service port
//! and frontend class) and the listeners they need, and the per-route choice of algorithm.
//!
//! A *route* is what a listener serves: internal traffic (the cluster IP) or external traffic
//! (node ports, external IPs, load-balancer IPs), each with its own endpoint set, as the core
//! decided (traffic policies). In privileged mode a route gets one listener on an ephemeral
//! port per family and kernel rules redirect every frontend to it; in unprivileged mode the
//! route binds each frontend address directly.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use svcnet_lb::{Algorithm, Dataplane, Fallback, resolve};
use svcnet_proxy::{
    DesiredEndpoint, DesiredFamily, DesiredServicePort, IpFamily, NoEndpointsVerdict, Protocol,
    ServicePortName,
};

/// Which traffic a route carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// To the cluster IP.
    Internal,
    /// To node ports, external IPs and load-balancer IPs.
    External,
}

/// How the proxy receives a route's traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Root on Linux: nftables rules in the proxy's own table redirect each frontend to a
    /// listener on an ephemeral port, and the original destination is recovered from the
    /// connection (`SO_ORIGINAL_DST`).
    Privileged,
    /// No root: each frontend address is bound directly (a loopback service CIDR such as
    /// 127.96.0.0/16 makes every cluster IP bindable). Node ports are bound on
    /// `node_port_addresses` (e.g. 127.0.0.1); ports below 1024 need `CAP_NET_BIND_SERVICE`.
    Unprivileged { node_port_addresses: Vec<IpAddr> },
}

/// One address a route's traffic arrives on, as the kernel rules match it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Frontend {
    /// `daddr:port` (cluster IP, external IP).
    Addr(IpAddr, u16),
    /// A load-balancer IP, with its allowed source ranges (empty: everyone).
    LoadBalancer(IpAddr, u16, Vec<IpNet>),
    /// A node port on every local address.
    NodePort(u16),
}

/// Where a listener binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bind {
    /// This exact address (unprivileged mode).
    Exact(SocketAddr),
    /// The unspecified address of a family, port chosen by the kernel (privileged mode).
    Ephemeral(IpFamily),
}

impl Bind {
    pub fn socket_addr(self) -> SocketAddr {
        match self {
            Self::Exact(a) => a,
            Self::Ephemeral(IpFamily::V4) => SocketAddr::from(([0, 0, 0, 0], 0)),
            Self::Ephemeral(IpFamily::V6) => SocketAddr::from(([0u16; 8], 0)),
        }
    }
}

/// Identity of a route.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteKey {
    pub service: ServicePortName,
    pub family: IpFamily,
    pub class: Class,
}

/// Identity of a listener: its route and its bind address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerKey {
    pub route: RouteKey,
    pub protocol: Protocol,
    pub bind: Bind,
}

/// Everything the dataplane needs to serve one route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    pub key: RouteKey,
    pub protocol: Protocol,
    pub frontends: Vec<Frontend>,
    pub endpoints: Vec<DesiredEndpoint>,
    /// Set when `endpoints` is empty: refuse (reject) or drop.
    pub no_endpoints: Option<NoEndpointsVerdict>,
    pub affinity_timeout: Option<u32>,
    pub algorithm: Algorithm,
    /// Never set for userspace today (it can express every algorithm); kept so the runtime
    /// reports fallbacks the same way as the kernel dataplanes.
    pub fallback: Option<Fallback>,
    /// Listeners this route needs (none when it has no endpoints: the kernel refuses).
    pub listeners: Vec<ListenerKey>,
}

fn route(
    d: &DesiredServicePort,
    class: Class,
    frontends: Vec<Frontend>,
    mode: &Mode,
) -> Option<RouteSpec> {
    if d.protocol == Protocol::Sctp || frontends.is_empty() {
        // SCTP has no stream splicing in the userspace proxy; the core still programs it in
        // the kernel dataplanes.
        return None;
    }
    let (endpoints, no_endpoints) = match class {
        Class::Internal => (d.internal_endpoints(), d.internal_no_endpoints),
        Class::External => (d.external_endpoints(), d.external_no_endpoints),
    };
    let key = RouteKey {
        service: d.name.clone(),
        family: d.family,
        class,
    };
    let resolution = resolve(d.lb_algorithm, Dataplane::Userspace);
    let listeners = if endpoints.is_empty() {
        Vec::new()
    } else {
        let binds: Vec<Bind> = match mode {
            Mode::Privileged => vec![Bind::Ephemeral(d.family)],
            Mode::Unprivileged {
                node_port_addresses,
            } => frontends
                .iter()
                .flat_map(|f| match f {
                    Frontend::Addr(ip, port) | Frontend::LoadBalancer(ip, port, _) => {
                        vec![SocketAddr::new(*ip, *port)]
                    }
                    Frontend::NodePort(port) => node_port_addresses
                        .iter()
                        .filter(|ip| IpFamily::of(ip) == d.family)
                        .map(|ip| SocketAddr::new(*ip, *port))
                        .collect(),
                })
                .map(Bind::Exact)
                .collect(),
        };
        binds
            .into_iter()
            .map(|bind| ListenerKey {
                route: key.clone(),
                protocol: d.protocol,
                bind,
            })
            .collect()
    };
    Some(RouteSpec {
        key,
        protocol: d.protocol,
        frontends,
        endpoints: endpoints.to_vec(),
        no_endpoints,
        affinity_timeout: d.affinity_timeout,
        algorithm: resolution.algorithm,
        fallback: resolution.fallback,
        listeners,
    })
}

/// The routes of every service port of the given families, in a stable order.
pub fn routes(families: &[DesiredFamily], mode: &Mode) -> Vec<RouteSpec> {
    let mut out = Vec::new();
    for fam in families {
        for d in fam.services.values() {
            out.extend(route(
                d,
                Class::Internal,
                vec![Frontend::Addr(d.cluster_ip, d.port)],
                mode,
            ));
            if d.has_external() {
                let mut fronts: Vec<Frontend> = d
                    .external_ips
                    .iter()
                    .map(|ip| Frontend::Addr(*ip, d.port))
                    .collect();
                fronts.extend(d.load_balancer_ips.iter().map(|ip| {
                    Frontend::LoadBalancer(*ip, d.port, d.load_balancer_source_ranges.clone())
                }));
                fronts.extend(d.node_port.map(Frontend::NodePort));
                out.extend(route(d, Class::External, fronts, mode));
            }
        }
    }
    out
}
