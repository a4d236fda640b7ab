//! The pure half of the dataplane: from the core's decided graph of each service port, the
//! routes (one per service port and traffic class) and the listeners they need, and the
//! per-route algorithm.
//!
//! A *route* is what a listener serves: internal traffic (the cluster IP), external traffic
//! (node ports, external IPs, load-balancer IPs), or, for `externalTrafficPolicy: Local`, the
//! external traffic of pods and of the node itself, which the core sends to the cluster pool
//! (kube-proxy's short-circuit, [`Class::ShortCircuit`]). Each carries the pool and refusal
//! the graph decided; nothing here re-derives them from traffic policies. In privileged mode a
//! route gets one listener on an ephemeral port per family and kernel rules redirect every
//! frontend to it (choosing the short-circuit route by source, as nft and iptables do); in
//! unprivileged mode the route binds each frontend address directly, and the data path hands
//! pods and this host's own connections to the short-circuit route.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use svcnet_lb::{Algorithm, Dataplane, Fallback, Resolution, resolve};
use svcnet_proxy::{
    Capability, DesiredEndpoint, DesiredFamily, DesiredNode, IpFamily, NoEndpointsVerdict,
    Protocol, Route, ServiceGraph, ServicePortName, Target, lower,
};

/// Which traffic a route carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// To the cluster IP.
    Internal,
    /// External traffic from pods (sources inside [`RouteSpec::sources`]'s cluster CIDRs) and
    /// from the node itself, when the core routes it apart from the rest: the short-circuit
    /// of `externalTrafficPolicy: Local`.
    ShortCircuit,
    /// To node ports, external IPs and load-balancer IPs (all of it, or what the
    /// short-circuit route does not take).
    External,
}

/// Which sources a route serves (the kernel rules match them in privileged mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sources {
    /// Every source.
    Any,
    /// Pods (inside these cluster CIDRs; none when empty) and the node itself.
    PodsAndNode(Vec<IpNet>),
    /// Every source except pods (inside these CIDRs) and the node: a short-circuit route of
    /// the same port takes those.
    NotPodsOrNode(Vec<IpNet>),
}

/// What the userspace proxy can express: every algorithm (it chooses in its own code).
pub struct UserspaceCapability;

impl Capability for UserspaceCapability {
    fn resolve(
        &self,
        requested: Option<Algorithm>,
        _pools: &[&[DesiredEndpoint]],
        _affinity: bool,
    ) -> Resolution {
        resolve(requested, Dataplane::Userspace)
    }
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
    pub sources: Sources,
    pub endpoints: Vec<DesiredEndpoint>,
    /// Set when `endpoints` is empty: refuse (reject) or drop.
    pub no_endpoints: Option<NoEndpointsVerdict>,
    /// ClientIP affinity as the core decided it: `(timeout in seconds, key)`. Every route with
    /// the same key shares one pin table (`state::ServiceState`), so a client pinned through
    /// the cluster IP keeps its endpoint through the node port, external and load-balancer
    /// IPs; a pin is followed only to an endpoint of the route's own pool.
    pub affinity: Option<(u32, ServicePortName)>,
    pub algorithm: Algorithm,
    /// Never set for userspace today (it can express every algorithm); kept so the runtime
    /// reports fallbacks the same way as the kernel dataplanes.
    pub fallback: Option<Fallback>,
    /// Listeners this route needs (none when it has no endpoints: the kernel refuses).
    pub listeners: Vec<ListenerKey>,
}

fn route(
    g: &ServiceGraph<'_>,
    class: Class,
    decided: &Route,
    frontends: Vec<Frontend>,
    node: &DesiredNode,
    mode: &Mode,
) -> Option<RouteSpec> {
    let d = g.port;
    if d.protocol == Protocol::Sctp || frontends.is_empty() {
        // SCTP has no stream splicing in the userspace proxy; the core still programs it in
        // the kernel dataplanes.
        return None;
    }
    let pods = || node.cluster_cidrs.clone();
    let (target, sources) = match class {
        Class::ShortCircuit => (
            Target::Pool {
                pool: decided.short_circuit?,
                masquerade: svcnet_proxy::Masquerade::Always,
            },
            Sources::PodsAndNode(pods()),
        ),
        _ if decided.short_circuit.is_some() => (decided.target, Sources::NotPodsOrNode(pods())),
        _ => (decided.target, Sources::Any),
    };
    let (endpoints, no_endpoints) = match target {
        Target::Pool { pool, .. } => (g.pool(pool).unwrap_or_default(), None),
        Target::Refuse(v) => (&[][..], Some(v)),
    };
    let key = RouteKey {
        service: d.name.clone(),
        family: d.family,
        class,
    };
    // In unprivileged mode one socket per address serves every source: the port's external
    // route binds the frontends (even with no local endpoint, for the clients it hands to the
    // short-circuit route; the rest are refused) and the short-circuit route binds nothing.
    // Privileged mode's kernel rules tell the sources apart instead.
    let unprivileged = matches!(mode, Mode::Unprivileged { .. });
    let unbindable = class == Class::ShortCircuit && unprivileged;
    let hands_over = class == Class::External && unprivileged && decided.short_circuit.is_some();
    let listeners = if (endpoints.is_empty() && !hands_over) || unbindable {
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
        sources,
        endpoints: endpoints.to_vec(),
        no_endpoints,
        affinity: g.affinity.map(|a| (a.timeout, a.key.clone())),
        algorithm: g.algorithm,
        fallback: g.fallback.clone(),
        listeners,
    })
}

/// The routes of every service port of the given families, in a stable order (a port's
/// short-circuit route before its external route: the kernel rules take pods and the node
/// first).
pub fn routes(families: &[DesiredFamily], mode: &Mode) -> Vec<RouteSpec> {
    let mut out = Vec::new();
    for fam in families {
        for d in fam.services.values() {
            let g = lower(d, &fam.node, &UserspaceCapability);
            let mut external = Vec::new();
            for fe in &g.frontends {
                match *fe {
                    svcnet_proxy::Frontend::ClusterIp(..) => {}
                    svcnet_proxy::Frontend::ExternalIp(ip, port) => {
                        external.push(Frontend::Addr(ip, port))
                    }
                    svcnet_proxy::Frontend::LoadBalancer {
                        ip,
                        port,
                        source_ranges,
                    } => external.push(Frontend::LoadBalancer(ip, port, source_ranges.to_vec())),
                    svcnet_proxy::Frontend::NodePort(port) => {
                        external.push(Frontend::NodePort(port))
                    }
                }
            }
            out.extend(route(
                &g,
                Class::Internal,
                &g.internal,
                vec![Frontend::Addr(d.cluster_ip, d.port)],
                &fam.node,
                mode,
            ));
            if let Some(ext) = &g.external {
                for class in [Class::ShortCircuit, Class::External] {
                    out.extend(route(&g, class, ext, external.clone(), &fam.node, mode));
                }
            }
        }
    }
    out
}
