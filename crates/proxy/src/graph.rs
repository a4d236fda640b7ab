//! The decided graph: each service port lowered into a value in which every traffic decision
//! is already made, so that a dataplane only translates it (into nft, iptables-restore or its
//! socket table) and never re-derives policy.
//!
//! [`lower`] turns a [`DesiredServicePort`] (the facts: frontends, traffic policies, endpoint
//! sets) into a [`ServiceGraph`]:
//!
//! * its [`Frontend`]s, each carrying internal (cluster IP) or external traffic;
//! * a [`Route`] for internal traffic and one for external traffic: the endpoint [`Pool`]
//!   (cluster or local) with its [`Masquerade`] rule, or a refusal ([`NoEndpointsVerdict`]),
//!   plus the `externalTrafficPolicy: Local` short-circuit;
//! * the pools some route actually uses (the only ones a dataplane programs);
//! * ClientIP affinity ([`Affinity`]: one pin per client for the whole service port, whatever
//!   frontend a connection arrives on), and the load-balancing algorithm as the dataplane's [`Capability`] resolves it,
//!   with the fallback to report.
//!
//! [`NodeVerdicts`] holds the node-wide decisions, the same for every dataplane.
//!
//! **Architecture Invariant:** this module is the one home of the routing graph. A dataplane
//! never reads `internal_policy` / `external_policy` to choose a pool, a masquerade rule or a
//! verdict; it reads the graph.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_lb::{Algorithm, Fallback, Resolution};

use crate::desired::{DesiredEndpoint, DesiredNode, DesiredServicePort, NoEndpointsVerdict};
use crate::names::ServicePortName;
use crate::service::TrafficPolicy;

/// An endpoint set of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    /// [`DesiredServicePort::cluster_endpoints`]: every usable endpoint in the cluster.
    Cluster,
    /// [`DesiredServicePort::local_endpoints`]: this node's endpoints.
    Local,
}

/// When traffic sent to a pool is masqueraded (SNAT to the node), so replies come back
/// through this node. Hairpin traffic (an endpoint reaching itself through the service) is
/// always masqueraded, whatever this says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Masquerade {
    /// Every connection (`--masquerade-all` for cluster IPs; external traffic under
    /// `externalTrafficPolicy: Cluster`).
    Always,
    /// Connections whose source is outside [`DesiredNode::cluster_cidrs`] (off-cluster
    /// clients of a cluster IP).
    OffCluster,
    /// Never (the client address is preserved).
    Never,
}

/// What a route does with a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// DNAT to one endpoint of `pool` (non-empty), masqueraded per `masquerade`.
    Pool { pool: Pool, masquerade: Masquerade },
    /// No endpoint to send it to: reject (the service has no usable endpoint anywhere) or
    /// drop (only this node has none, under a Local policy).
    Refuse(NoEndpointsVerdict),
}

impl Target {
    pub fn pool(self) -> Option<Pool> {
        match self {
            Target::Pool { pool, .. } => Some(pool),
            Target::Refuse(_) => None,
        }
    }

    pub fn refusal(self) -> Option<NoEndpointsVerdict> {
        match self {
            Target::Pool { .. } => None,
            Target::Refuse(v) => Some(v),
        }
    }
}

/// The route of one traffic class (internal or external) of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// kube-proxy's short-circuit for `externalTrafficPolicy: Local`: a connection from a pod
    /// (its source inside [`DesiredNode::cluster_cidrs`]; no pod matches when that list is
    /// empty) or from the node itself (a local source address) goes to this pool instead of
    /// `target`. Pod traffic keeps its address; node-sourced traffic is masqueraded (the node
    /// may not be reachable at its source address from the endpoint's node). Only set when
    /// the pool is non-empty.
    pub short_circuit: Option<Pool>,
    /// What every other connection gets.
    pub target: Target,
}

impl Route {
    /// The pools this route may send traffic to.
    pub fn pools(&self) -> impl Iterator<Item = Pool> + use<> {
        self.short_circuit.into_iter().chain(self.target.pool())
    }

    /// Whether every connection of this class is refused, whatever its source (the dataplane
    /// may then refuse at the frontend, without a route to follow).
    pub fn refused_for_all(&self) -> Option<NoEndpointsVerdict> {
        match self.short_circuit {
            Some(_) => None,
            None => self.target.refusal(),
        }
    }
}

/// Where a service port's traffic arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frontend<'a> {
    /// `cluster_ip:port`: internal traffic.
    ClusterIp(IpAddr, u16),
    /// `external_ip:port`: external traffic.
    ExternalIp(IpAddr, u16),
    /// `load_balancer_ip:port`: external traffic; sources outside `source_ranges` (when it is
    /// non-empty) are dropped before any route.
    LoadBalancer {
        ip: IpAddr,
        port: u16,
        source_ranges: &'a [IpNet],
    },
    /// `node address:node_port` on every address accepting node ports: external traffic.
    NodePort(u16),
}

impl Frontend<'_> {
    /// Whether the frontend carries external traffic (everything except the cluster IP).
    pub fn is_external(&self) -> bool {
        !matches!(self, Frontend::ClusterIp(..))
    }
}

/// ClientIP session affinity of a service port, decided once for every dataplane: a client's
/// pin is kept per service port, not per frontend, as kube-proxy's are (its cluster IP, node
/// port, external and load-balancer IPs all jump into one service chain, and each `recent`
/// list belongs to an endpoint of that port). So a client pinned to endpoint X through the
/// cluster IP reaches X through the node port too, and the other way round, within
/// `timeout`. A pin may only name an endpoint of [`ServiceGraph::endpoints`]: a dataplane
/// removes the pins to an endpoint that leaves them, so no client stays pinned to a removed
/// pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Affinity<'a> {
    /// Seconds a pin lasts after the client's last new connection.
    pub timeout: u32,
    /// The one key a pin is recorded and looked up under, whatever the frontend or pool: the
    /// service port.
    pub key: &'a ServicePortName,
}

/// A dataplane's ability to express load-balancing algorithms (the arm of
/// `svcnet_lb::support` for it, plus any limit that depends on the endpoints, e.g. iptables'
/// 32 hash slots).
pub trait Capability {
    /// The algorithm used for `requested` (`None`: the dataplane's default) over `pools` (the
    /// used, non-empty endpoint sets), and the fallback to report when it differs.
    fn resolve(
        &self,
        requested: Option<Algorithm>,
        pools: &[&[DesiredEndpoint]],
        affinity: bool,
    ) -> Resolution;
}

/// One service port with every traffic decision made.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceGraph<'a> {
    /// The facts the graph was lowered from (name, protocol, addresses, health-check port).
    pub port: &'a DesiredServicePort,
    /// Cluster IP first, then external IPs, load-balancer IPs and the node port.
    pub frontends: Vec<Frontend<'a>>,
    pub internal: Route,
    /// `None` when the port has no external frontend.
    pub external: Option<Route>,
    /// The non-empty pools some route uses, cluster first. A pool no route uses is absent,
    /// so a dataplane programs exactly these.
    pub pools: Vec<(Pool, &'a [DesiredEndpoint])>,
    /// ClientIP session affinity, per service port.
    pub affinity: Option<Affinity<'a>>,
    /// The algorithm every pool of this port uses in this dataplane.
    pub algorithm: Algorithm,
    /// Set when the requested algorithm could not be expressed: reported once per sync that
    /// renders the port (log and Event), never silently.
    pub fallback: Option<Fallback>,
}

impl<'a> ServiceGraph<'a> {
    /// The route for traffic arriving on `frontend`.
    pub fn route_of(&self, frontend: &Frontend<'_>) -> Route {
        match (frontend.is_external(), self.external) {
            (true, Some(r)) => r,
            _ => self.internal,
        }
    }

    /// The endpoints of a used pool.
    pub fn pool(&self, pool: Pool) -> Option<&'a [DesiredEndpoint]> {
        self.pools.iter().find(|(p, _)| *p == pool).map(|(_, e)| *e)
    }

    /// Every endpoint of the used pools, once each.
    pub fn endpoints(&self) -> BTreeSet<&'a DesiredEndpoint> {
        self.pools.iter().flat_map(|(_, e)| e.iter()).collect()
    }

    /// The pool internal traffic uses and its masquerade rule (the checks a dataplane makes on
    /// cluster-IP traffic in front of that pool's choice).
    pub fn internal_pool(&self) -> Option<(Pool, Masquerade)> {
        match self.internal.target {
            Target::Pool { pool, masquerade } => Some((pool, masquerade)),
            Target::Refuse(_) => None,
        }
    }
}

fn pool_of(policy: TrafficPolicy) -> Pool {
    match policy {
        TrafficPolicy::Cluster => Pool::Cluster,
        TrafficPolicy::Local => Pool::Local,
    }
}

fn endpoints_of(d: &DesiredServicePort, pool: Pool) -> &[DesiredEndpoint] {
    match pool {
        Pool::Cluster => &d.cluster_endpoints,
        Pool::Local => &d.local_endpoints,
    }
}

/// Lowers one service port: see the module documentation for what is decided.
///
/// * Internal traffic goes to the `internalTrafficPolicy` pool, masqueraded per
///   `--masquerade-all` (always) or the cluster CIDRs (off-cluster sources only; never when
///   none is known).
/// * External traffic under `externalTrafficPolicy: Cluster` goes to the cluster pool, always
///   masqueraded; under `Local`, to the local pool with the client address kept, except for
///   the short-circuit of pod- and node-sourced traffic to the cluster pool.
/// * An empty pool refuses: `Reject` when the service has no usable endpoint anywhere, `Drop`
///   when only this node has none.
pub fn lower<'a>(
    d: &'a DesiredServicePort,
    node: &DesiredNode,
    capability: &dyn Capability,
) -> ServiceGraph<'a> {
    let any_endpoint = !d.cluster_endpoints.is_empty() || !d.local_endpoints.is_empty();
    let target = |pool: Pool, masquerade: Masquerade| {
        if endpoints_of(d, pool).is_empty() {
            Target::Refuse(if any_endpoint {
                NoEndpointsVerdict::Drop
            } else {
                NoEndpointsVerdict::Reject
            })
        } else {
            Target::Pool { pool, masquerade }
        }
    };
    let internal_masquerade = if node.masquerade_all {
        Masquerade::Always
    } else if !node.cluster_cidrs.is_empty() {
        Masquerade::OffCluster
    } else {
        Masquerade::Never
    };
    let internal = Route {
        short_circuit: None,
        target: target(pool_of(d.internal_policy), internal_masquerade),
    };
    let external = d.has_external().then(|| match d.external_policy {
        TrafficPolicy::Cluster => Route {
            short_circuit: None,
            target: target(Pool::Cluster, Masquerade::Always),
        },
        TrafficPolicy::Local => Route {
            short_circuit: (!d.cluster_endpoints.is_empty()).then_some(Pool::Cluster),
            target: target(Pool::Local, Masquerade::Never),
        },
    });
    let used: BTreeSet<Pool> = internal
        .pools()
        .chain(external.iter().flat_map(Route::pools))
        .collect();
    let pools: Vec<(Pool, &[DesiredEndpoint])> =
        used.into_iter().map(|p| (p, endpoints_of(d, p))).collect();
    let mut frontends = vec![Frontend::ClusterIp(d.cluster_ip, d.port)];
    if external.is_some() {
        frontends.extend(
            d.external_ips
                .iter()
                .map(|ip| Frontend::ExternalIp(*ip, d.port)),
        );
        frontends.extend(d.load_balancer_ips.iter().map(|ip| Frontend::LoadBalancer {
            ip: *ip,
            port: d.port,
            source_ranges: &d.load_balancer_source_ranges,
        }));
        frontends.extend(d.node_port.map(Frontend::NodePort));
    }
    let sets: Vec<&[DesiredEndpoint]> = pools.iter().map(|(_, e)| *e).collect();
    let Resolution {
        algorithm,
        fallback,
    } = capability.resolve(d.lb_algorithm, &sets, d.affinity_timeout.is_some());
    ServiceGraph {
        port: d,
        frontends,
        internal,
        external,
        pools,
        affinity: d.affinity_timeout.map(|timeout| Affinity {
            timeout,
            key: &d.name,
        }),
        algorithm,
        fallback,
    }
}

/// The node-wide verdicts, decided once for every dataplane. They are kube-proxy's nftables
/// mode's (its `cluster-ips-check` chain): a new connection to an allocated cluster IP on a
/// port no service port serves is rejected (the address exists, so the client fails fast, as
/// for a closed port), and one to an address inside a service CIDR that no service holds is
/// dropped (nothing is there; it must never be routed onward, out of the node). kube-proxy's
/// iptables mode rejects both; svcnet's iptables dataplane follows the nftables choice, so
/// every dataplane answers the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeVerdicts {
    /// To an address inside [`DesiredNode::service_cidrs`] that is no service's cluster IP.
    pub unallocated_service_ip: NoEndpointsVerdict,
    /// To an allocated cluster IP on a port (or protocol) none of its service ports has.
    pub unknown_port: NoEndpointsVerdict,
}

/// The node-wide verdicts (see [`NodeVerdicts`]).
pub const NODE_VERDICTS: NodeVerdicts = NodeVerdicts {
    unallocated_service_ip: NoEndpointsVerdict::Drop,
    unknown_port: NoEndpointsVerdict::Reject,
};
