//! The decision: each end of a connection judged on its own (the source's egress, the
//! destination's ingress), then both must allow.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::model::{Direction, Namespace, Peer, Pod, Policy, PortMatch, Protocol, Rule};

/// One end of a connection. The destination is what the packet reaches after the proxy's
/// DNAT (a pod, not a Service IP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A pod, by namespace and name.
    Pod { namespace: String, name: String },
    /// An address that is no pod (outside the cluster, a load balancer, ...).
    Ip(IpAddr),
    /// A node, by name and the address its traffic carries.
    Node { name: String, ip: IpAddr },
}

impl Endpoint {
    pub fn pod(namespace: &str, name: &str) -> Endpoint {
        Endpoint::Pod {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// A new connection: from, to (after DNAT), protocol and destination port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    pub src: Endpoint,
    pub dst: Endpoint,
    pub protocol: Protocol,
    pub port: u16,
}

/// What one end's policies say: which policies isolate it for this direction, and the first
/// (policy, rule index) that allowed the connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideVerdict {
    pub isolated_by: Vec<String>,
    pub allowed_by: Option<(String, usize)>,
    /// Let in because it comes from the destination pod's own node.
    pub node_exception: bool,
}

impl SideVerdict {
    pub fn allowed(&self) -> bool {
        self.isolated_by.is_empty() || self.allowed_by.is_some() || self.node_exception
    }
}

/// The answer with its reasons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub egress: SideVerdict,
    pub ingress: SideVerdict,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.egress.allowed() && self.ingress.allowed()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |f: &mut fmt::Formatter<'_>, name: &str, s: &SideVerdict| {
            if s.isolated_by.is_empty() {
                write!(f, "{name}: not isolated")
            } else if s.node_exception {
                write!(f, "{name}: from the pod's node")
            } else if let Some((p, i)) = &s.allowed_by {
                write!(f, "{name}: allowed by {p} rule {i}")
            } else {
                write!(
                    f,
                    "{name}: denied (isolated by {})",
                    s.isolated_by.join(", ")
                )
            }
        };
        side(f, "egress", &self.egress)?;
        f.write_str("; ")?;
        side(f, "ingress", &self.ingress)
    }
}

/// The address family a connection is made over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }
}

/// A pod named by an endpoint is not in the cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {namespace}/{name} is unknown")]
pub struct UnknownPod {
    pub namespace: String,
    pub name: String,
}

/// Everything a decision reads.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub policies: Vec<Policy>,
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl Cluster {
    /// The model of API objects, with the policies that cannot be converted (they bypassed
    /// admission) left out and returned beside it.
    pub fn from_k8s(
        policies: &[k8s_openapi::api::networking::v1::NetworkPolicy],
        pods: &[k8s_openapi::api::core::v1::Pod],
        namespaces: &[k8s_openapi::api::core::v1::Namespace],
    ) -> (Cluster, Vec<crate::ModelError>) {
        let mut errors = Vec::new();
        let cluster = Cluster {
            namespaces: namespaces.iter().map(Namespace::from_k8s).collect(),
            pods: pods.iter().filter_map(Pod::from_k8s).collect(),
            policies: policies
                .iter()
                .filter_map(|p| Policy::from_k8s(p).map_err(|e| errors.push(e)).ok())
                .collect(),
        };
        (cluster, errors)
    }

    /// The endpoint an address stands for: the pod holding it, else a node of `nodes`
    /// (name, address), else the bare address.
    pub fn endpoint(&self, ip: IpAddr, nodes: &[(String, IpAddr)]) -> Endpoint {
        if let Some(pod) = self.pods.iter().find(|p| p.ips.contains(&ip)) {
            return Endpoint::pod(&pod.namespace, &pod.name);
        }
        match nodes.iter().find(|(_, a)| *a == ip) {
            Some((name, _)) => Endpoint::Node {
                name: name.clone(),
                ip,
            },
            None => Endpoint::Ip(ip),
        }
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }

    /// The labels of namespace `name` (none when the namespace is unknown).
    pub fn namespace_labels(&self, name: &str) -> &BTreeMap<String, String> {
        self.namespaces
            .iter()
            .find(|n| n.name == name)
            .map_or(&NO_LABELS, |n| &n.labels)
    }

    fn resolve<'a>(&'a self, e: &Endpoint) -> Result<Option<&'a Pod>, UnknownPod> {
        match e {
            Endpoint::Pod { namespace, name } => {
                self.pod(namespace, name)
                    .map(Some)
                    .ok_or_else(|| UnknownPod {
                        namespace: namespace.clone(),
                        name: name.clone(),
                    })
            }
            Endpoint::Ip(_) | Endpoint::Node { .. } => Ok(None),
        }
    }

    /// The policies that isolate `pod` for `dir`.
    pub fn isolating(&self, pod: &Pod, dir: Direction) -> impl Iterator<Item = &Policy> {
        self.policies
            .iter()
            .filter(move |p| p.isolates_pod(pod, dir))
    }

    /// Is `conn` allowed, and why. Between two pods with addresses of both families, an
    /// `ipBlock` matches a pod by any of its addresses; [`Cluster::check_over`] judges the
    /// connection as made over one family.
    pub fn check(&self, conn: &Connection) -> Result<Verdict, UnknownPod> {
        self.check_family(conn, None)
    }

    /// [`Cluster::check`] for a connection made over IPv4 or IPv6: an `ipBlock` matches a
    /// peer pod by its address of that family (the packet's), as a dataplane sees it.
    pub fn check_over(&self, conn: &Connection, family: IpFamily) -> Result<Verdict, UnknownPod> {
        self.check_family(conn, Some(family))
    }

    fn check_family(
        &self,
        conn: &Connection,
        family: Option<IpFamily>,
    ) -> Result<Verdict, UnknownPod> {
        let src = self.resolve(&conn.src)?;
        let dst = self.resolve(&conn.dst)?;
        let egress = match src {
            Some(pod) => self.side(pod, Direction::Egress, &conn.dst, dst, conn, family),
            None => SideVerdict::default(),
        };
        let ingress = match dst {
            Some(pod) => {
                let mut v = self.side(pod, Direction::Ingress, &conn.src, src, conn, family);
                if let Endpoint::Node { name, .. } = &conn.src {
                    v.node_exception =
                        !v.isolated_by.is_empty() && pod.node.as_deref() == Some(name);
                }
                v
            }
            None => SideVerdict::default(),
        };
        Ok(Verdict { egress, ingress })
    }

    /// A connection a node's relaying proxy (the userspace proxy) opens to `endpoint` for
    /// `client`, judged as a kernel proxy's DNAT leaves it: the client is the pod holding its
    /// address, else node `node` when `own` says the address is the node's (the node
    /// exception then lets it into the node's own pods), else an address; the destination is
    /// the pod (or address) at `endpoint`, its port the target port.
    pub fn check_relayed(
        &self,
        node: &str,
        own: impl Fn(IpAddr) -> bool,
        client: IpAddr,
        endpoint: SocketAddr,
        protocol: Protocol,
    ) -> Verdict {
        let src = match self.endpoint(client, &[]) {
            Endpoint::Ip(ip) if own(ip) => Endpoint::Node {
                name: node.to_string(),
                ip,
            },
            other => other,
        };
        let conn = Connection {
            src,
            dst: self.endpoint(endpoint.ip(), &[]),
            protocol,
            port: endpoint.port(),
        };
        // Both ends were resolved from this model: no pod is unknown.
        self.check_over(&conn, IpFamily::of(endpoint.ip()))
            .unwrap_or_else(|_| Verdict {
                egress: SideVerdict::default(),
                ingress: SideVerdict {
                    isolated_by: vec!["(unknown pod)".into()],
                    ..SideVerdict::default()
                },
            })
    }

    /// Shorthand for [`Cluster::check`] that treats unknown pods as denied.
    pub fn allowed(&self, conn: &Connection) -> bool {
        self.check(conn).is_ok_and(|v| v.allowed())
    }

    /// One end: `pod` judged for `dir` with `peer` at the other end; the port is always the
    /// destination's.
    fn side(
        &self,
        pod: &Pod,
        dir: Direction,
        peer: &Endpoint,
        peer_pod: Option<&Pod>,
        conn: &Connection,
        family: Option<IpFamily>,
    ) -> SideVerdict {
        let dst_pod = match dir {
            Direction::Ingress => Some(pod),
            Direction::Egress => peer_pod,
        };
        let mut v = SideVerdict::default();
        for policy in self.isolating(pod, dir) {
            let id = format!("{}/{}", policy.namespace, policy.name);
            if v.allowed_by.is_none()
                && let Some(i) = policy.rules(dir).iter().position(|r| {
                    self.rule_allows(policy, r, peer, peer_pod, family)
                        && port_allows(r, dst_pod, conn)
                })
            {
                v.allowed_by = Some((id.clone(), i));
            }
            v.isolated_by.push(id);
        }
        v
    }

    fn rule_allows(
        &self,
        policy: &Policy,
        rule: &Rule,
        peer: &Endpoint,
        peer_pod: Option<&Pod>,
        family: Option<IpFamily>,
    ) -> bool {
        rule.peers.is_empty()
            || rule
                .peers
                .iter()
                .any(|p| self.peer_matches(policy, p, peer, peer_pod, family))
    }

    fn peer_matches(
        &self,
        policy: &Policy,
        p: &Peer,
        peer: &Endpoint,
        peer_pod: Option<&Pod>,
        family: Option<IpFamily>,
    ) -> bool {
        match p {
            Peer::Block(b) => match (peer, peer_pod) {
                (_, Some(pod)) => pod
                    .ips
                    .iter()
                    .filter(|ip| family.is_none_or(|f| IpFamily::of(**ip) == f))
                    .any(|ip| b.contains(*ip)),
                (Endpoint::Ip(ip) | Endpoint::Node { ip, .. }, None) => b.contains(*ip),
                (Endpoint::Pod { .. }, None) => false,
            },
            Peer::Pods { .. } => peer_pod.is_some_and(|pod| self.peer_selects(policy, p, pod)),
        }
    }

    /// Whether a selector peer (`podSelector` and/or `namespaceSelector`) of `policy`
    /// selects `pod`; an `ipBlock` peer selects no pod by label (it matches addresses). The
    /// dataplane fills its per-selector address sets with this, so a set holds exactly the
    /// pods the evaluator would match.
    pub fn peer_selects(&self, policy: &Policy, peer: &Peer, pod: &Pod) -> bool {
        peer.selects(
            &policy.namespace,
            pod,
            self.namespace_labels(&pod.namespace),
        )
    }
}

/// `ports` of a rule against the connection; named ports need a destination pod with a
/// container port of that name, protocol and number.
fn port_allows(rule: &Rule, dst: Option<&Pod>, conn: &Connection) -> bool {
    rule.ports.is_empty()
        || rule.ports.iter().any(|p| {
            p.protocol == conn.protocol
                && match &p.port {
                    PortMatch::Any => true,
                    PortMatch::Range(lo, hi) => (*lo..=*hi).contains(&conn.port),
                    PortMatch::Named(name) => dst.is_some_and(|pod| {
                        pod.named_ports(name, conn.protocol)
                            .any(|port| port == conn.port)
                    }),
                }
        })
}
