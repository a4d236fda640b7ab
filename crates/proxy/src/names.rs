//! Identifiers shared by the core and every dataplane.

use std::fmt;
use std::net::IpAddr;

/// `namespace/name` of a Kubernetes object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}

impl NamespacedName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// L4 protocol of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses the API spelling (`TCP`, `UDP`, `SCTP`); `None` (unset) means TCP, as the API defaults it.
    pub fn from_api(value: Option<&str>) -> Option<Self> {
        match value.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// Lower-case name, as nft and chain names spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// IP family; each family is handled independently (a failure in one never blocks the other).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    pub fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    pub fn of_net(net: &ipnet::IpNet) -> Self {
        match net {
            ipnet::IpNet::V4(_) => Self::V4,
            ipnet::IpNet::V6(_) => Self::V6,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        })
    }
}

/// One port of one service: the unit every dataplane programs (kube-proxy's `ServicePortName`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub service: NamespacedName,
    /// The port's `name` (empty for a single unnamed port).
    pub port: String,
    pub protocol: Protocol,
}

impl ServicePortName {
    pub fn new(namespace: &str, name: &str, port: &str, protocol: Protocol) -> Self {
        Self {
            service: NamespacedName::new(namespace, name),
            port: port.to_string(),
            protocol,
        }
    }
}

impl fmt::Display for ServicePortName {
    /// `ns/name/proto/port`, the form used in nft chain names and logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.service, self.protocol, self.port)
    }
}
