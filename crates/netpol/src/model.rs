//! The evaluator's input: namespaces, pods and policies in a form made for deciding, and
//! the conversion from `networking.k8s.io/v1` objects (with the API server's defaulting, so
//! an object that skipped admission means the same).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1 as api;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::selector::Selector;

/// Why an object cannot be turned into the model. The API server refuses all of these, so
/// they mean an object that bypassed admission; the caller skips it and says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("policy {policy}: {field}: unknown selector operator {op:?}")]
    Operator {
        policy: String,
        field: String,
        op: String,
    },
    #[error("policy {policy}: {field}: invalid CIDR {cidr:?}")]
    Cidr {
        policy: String,
        field: String,
        cidr: String,
    },
    #[error("policy {policy}: {field}: unknown protocol {protocol:?}")]
    Protocol {
        policy: String,
        field: String,
        protocol: String,
    },
}

/// The transport protocols NetworkPolicy is defined for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The API's spelling (`TCP`), which is also how container ports name it.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// A named container port of a pod: what a policy's named port resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ips: Vec<IpAddr>,
    pub ports: Vec<NamedPort>,
    /// The node the pod runs on: traffic from it is always let in (the node exception).
    pub node: Option<String>,
}

impl Namespace {
    /// The model of a namespace object: its name and labels.
    pub fn from_k8s(ns: &k8s_openapi::api::core::v1::Namespace) -> Namespace {
        Namespace {
            name: ns.metadata.name.clone().unwrap_or_default(),
            labels: ns.metadata.labels.clone().unwrap_or_default(),
        }
    }
}

impl Pod {
    /// The model of a pod object; `None` for what policies never select: host-network pods
    /// (their traffic is the node's, as most implementations treat it) and finished pods
    /// (their address may already be another pod's). A pod without an address yet has no
    /// `ips`.
    pub fn from_k8s(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Pod> {
        let spec = pod.spec.as_ref();
        if spec.and_then(|s| s.host_network).unwrap_or(false) {
            return None;
        }
        let status = pod.status.as_ref();
        if matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ) {
            return None;
        }
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if ips.is_empty()
            && let Some(ip) = status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok())
        {
            ips.push(ip);
        }
        let ports = spec
            .into_iter()
            .flat_map(|s| s.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some(NamedPort {
                    name: p.name.clone()?,
                    port: u16::try_from(p.container_port).ok()?,
                    protocol: Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?,
                })
            })
            .collect();
        Some(Pod {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ips,
            ports,
            node: spec.and_then(|s| s.node_name.clone()),
        })
    }

    /// The numbers a named port resolves to on this pod: its container ports of that name
    /// and protocol (a named port never matches a non-pod destination).
    pub fn named_ports<'a>(
        &'a self,
        name: &'a str,
        protocol: Protocol,
    ) -> impl Iterator<Item = u16> + 'a {
        self.ports
            .iter()
            .filter(move |cp| cp.name == name && cp.protocol == protocol)
            .map(|cp| cp.port)
    }
}

/// Which end of a connection a peer list describes, and which policies isolate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

/// `ipBlock`: an address is in it when inside `cidr` and outside every `except`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpBlock {
    pub cidr: IpNet,
    pub except: Vec<IpNet>,
}

impl IpBlock {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(&ip) && !self.except.iter().any(|e| e.contains(&ip))
    }
}

/// One entry of `from`/`to`. Selectors `None` are absent; both present means AND.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    Pods {
        pods: Option<Selector>,
        namespaces: Option<Selector>,
    },
    Block(IpBlock),
}

impl Peer {
    /// Whether this peer of a policy in `namespace` selects `pod`, whose namespace carries
    /// `namespace_labels`; an `ipBlock` peer selects no pod by label (it matches addresses).
    pub fn selects(
        &self,
        namespace: &str,
        pod: &Pod,
        namespace_labels: &BTreeMap<String, String>,
    ) -> bool {
        match self {
            Peer::Block(_) => false,
            // Both absent is refused by validation; match nothing rather than everything.
            Peer::Pods {
                pods: None,
                namespaces: None,
            } => false,
            // Cheapest test first (a dataplane asks this for every pod and selector): the
            // namespace's name, the pod's labels, then the namespace's labels.
            Peer::Pods { pods, namespaces } => {
                (namespaces.is_some() || pod.namespace == namespace)
                    && pods.as_ref().is_none_or(|s| s.matches(&pod.labels))
                    && namespaces
                        .as_ref()
                        .is_none_or(|sel| sel.matches(namespace_labels))
            }
        }
    }
}

/// One entry of `ports`: a protocol and either every port, a range, or a named port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortMatch {
    Any,
    Range(u16, u16),
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub protocol: Protocol,
    pub port: PortMatch,
}

/// A rule allows a connection whose peer matches one of `peers` (any peer when empty) on
/// one of `ports` (any port and protocol when empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub peers: Vec<Peer>,
    pub ports: Vec<Port>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub pod_selector: Selector,
    /// `policyTypes` contains `Ingress` / `Egress`.
    pub isolates_ingress: bool,
    pub isolates_egress: bool,
    pub ingress: Vec<Rule>,
    pub egress: Vec<Rule>,
}

impl Policy {
    pub fn isolates(&self, dir: Direction) -> bool {
        match dir {
            Direction::Ingress => self.isolates_ingress,
            Direction::Egress => self.isolates_egress,
        }
    }

    /// Whether this policy isolates `pod` for `dir`: the pod is in the policy's namespace,
    /// `policyTypes` lists `dir` and `podSelector` matches the pod's labels.
    pub fn isolates_pod(&self, pod: &Pod, dir: Direction) -> bool {
        self.namespace == pod.namespace
            && self.isolates(dir)
            && self.pod_selector.matches(&pod.labels)
    }

    pub fn rules(&self, dir: Direction) -> &[Rule] {
        match dir {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    /// The model of a stored policy. Missing `policyTypes` are defaulted as the API server
    /// does (Ingress, plus Egress when egress rules exist), a missing protocol is TCP.
    pub fn from_k8s(np: &api::NetworkPolicy) -> Result<Policy, ModelError> {
        let namespace = np.metadata.namespace.clone().unwrap_or_default();
        let name = np.metadata.name.clone().unwrap_or_default();
        let id = format!("{namespace}/{name}");
        let spec = np.spec.clone().unwrap_or_default();
        let sel = |s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
                   field: String| {
            Selector::from_k8s(s).map_err(|op| ModelError::Operator {
                policy: id.clone(),
                field,
                op,
            })
        };
        let pod_selector = sel(
            &spec.pod_selector.clone().unwrap_or_default(),
            "spec.podSelector".into(),
        )?;
        let convert_rules =
            |dir: &str,
             rules: Vec<(Vec<api::NetworkPolicyPeer>, Vec<api::NetworkPolicyPort>)>|
             -> Result<Vec<Rule>, ModelError> {
                let mut out = Vec::new();
                for (i, (peers, ports)) in rules.into_iter().enumerate() {
                    let mut rule = Rule::default();
                    for (j, p) in peers.iter().enumerate() {
                        let field = format!("spec.{dir}[{i}].peers[{j}]");
                        rule.peers.push(match &p.ip_block {
                            Some(b) => Peer::Block(ip_block(b, &id, &field)?),
                            None => Peer::Pods {
                                pods: p
                                    .pod_selector
                                    .as_ref()
                                    .map(|s| sel(s, format!("{field}.podSelector")))
                                    .transpose()?,
                                namespaces: p
                                    .namespace_selector
                                    .as_ref()
                                    .map(|s| sel(s, format!("{field}.namespaceSelector")))
                                    .transpose()?,
                            },
                        });
                    }
                    for (j, p) in ports.iter().enumerate() {
                        rule.ports
                            .push(port(p, &id, &format!("spec.{dir}[{i}].ports[{j}]"))?);
                    }
                    out.push(rule);
                }
                Ok(out)
            };
        let ingress = convert_rules(
            "ingress",
            spec.ingress
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.from.unwrap_or_default(), r.ports.unwrap_or_default()))
                .collect(),
        )?;
        let egress = convert_rules(
            "egress",
            spec.egress
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.to.unwrap_or_default(), r.ports.unwrap_or_default()))
                .collect(),
        )?;
        let types = spec.policy_types.unwrap_or_default();
        let (isolates_ingress, isolates_egress) = if types.is_empty() {
            (true, !egress.is_empty())
        } else {
            (
                types.iter().any(|t| t == "Ingress"),
                types.iter().any(|t| t == "Egress"),
            )
        };
        Ok(Policy {
            namespace,
            name,
            pod_selector,
            isolates_ingress,
            isolates_egress,
            ingress,
            egress,
        })
    }
}

fn ip_block(b: &api::IPBlock, policy: &str, field: &str) -> Result<IpBlock, ModelError> {
    let parse = |s: &str, f: String| {
        s.parse::<IpNet>()
            .map(|n| n.trunc())
            .map_err(|_| ModelError::Cidr {
                policy: policy.to_string(),
                field: f,
                cidr: s.to_string(),
            })
    };
    Ok(IpBlock {
        cidr: parse(&b.cidr, format!("{field}.ipBlock.cidr"))?,
        except: b
            .except
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, e)| parse(e, format!("{field}.ipBlock.except[{i}]")))
            .collect::<Result<_, _>>()?,
    })
}

fn port(p: &api::NetworkPolicyPort, policy: &str, field: &str) -> Result<Port, ModelError> {
    let proto = p.protocol.as_deref().unwrap_or("TCP");
    let protocol = Protocol::parse(proto).ok_or_else(|| ModelError::Protocol {
        policy: policy.to_string(),
        field: format!("{field}.protocol"),
        protocol: proto.to_string(),
    })?;
    // Out-of-range numbers cannot pass admission; clamping keeps a bypassing object from
    // matching more than it says.
    let clamp = |n: i32| u16::try_from(n.clamp(0, 65535)).unwrap_or(u16::MAX);
    let port = match &p.port {
        None => PortMatch::Any,
        Some(IntOrString::Int(n)) => {
            let end = p.end_port.unwrap_or(*n).max(*n);
            PortMatch::Range(clamp(*n), clamp(end))
        }
        Some(IntOrString::String(name)) => PortMatch::Named(name.clone()),
    };
    Ok(Port { protocol, port })
}
