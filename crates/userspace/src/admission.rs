//! What the proxy asks before it opens a connection on a client's behalf, and where that
//! connection leaves from.
//!
//! In privileged mode a Service connection ends at the proxy's listener on the node and a
//! second one is made from the node to the endpoint. The kernel dataplanes DNAT the client's
//! own packets, so a NetworkPolicy table sees (client pod → endpoint pod) after the proxy; here
//! it would see (client pod → node) and (node → endpoint pod), the node exception letting the
//! second in. So the proxy judges (client → chosen endpoint) itself, through [`Admission`],
//! and the node's policy table leaves the two legs to it (`svcnet-netpol-nft`'s
//! `proxy_sources`). A denied connection is refused as the kernel refuses one: the balancer's
//! choice stands, no other endpoint is tried, the client gets a reset (TCP) or nothing (UDP).
//! Connections already relayed are judged again only when the admission asks for it
//! ([`Admission::rejudge`], NetworkPolicy's option that cuts existing flows): the denied ones
//! are closed, TCP with a reset.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use socket2::SockRef;
use svcnet_proxy::Protocol;

/// Judges a new connection the proxy is about to open for a client.
pub trait Admission: Send + Sync + fmt::Debug {
    /// Whether `client` may reach `endpoint` (the balancer's choice) over `protocol`.
    fn admits(&self, client: IpAddr, endpoint: SocketAddr, protocol: Protocol) -> bool;

    /// Changes whenever the connections already relayed must be judged again (each is
    /// closed if [`Admission::admits`] now denies it); `None`, the default: never, as the
    /// kernel lets an established connection live on.
    fn rejudge(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// Upstream connections to endpoints in `to` leave from `from` (a local address) instead of
/// the address the route would pick, so the nodes that hold those endpoints can tell the
/// proxy's connections from the node's own (svcnet up: the pod network, from the node's
/// `cni0` address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamSource {
    pub to: IpNet,
    pub from: IpAddr,
}

impl UpstreamSource {
    /// The source `rule` gives a connection to `endpoint`, if any.
    pub(crate) fn for_endpoint(rule: Option<Self>, endpoint: SocketAddr) -> Option<IpAddr> {
        rule.filter(|r| r.to.contains(&endpoint.ip()))
            .map(|r| r.from)
    }
}

/// Binds `socket` to the source `rule` gives for `endpoint`, if any. The port is left to
/// `connect` (`IP_BIND_ADDRESS_NO_PORT`), so connections to different endpoints may share
/// one: binding a port first would cap the proxy at one connection per local port.
pub(crate) fn bind_source(
    socket: &impl std::os::fd::AsFd,
    rule: Option<UpstreamSource>,
    endpoint: SocketAddr,
) -> std::io::Result<()> {
    let Some(from) = UpstreamSource::for_endpoint(rule, endpoint) else {
        return Ok(());
    };
    #[cfg(target_os = "linux")]
    if from.is_ipv4() {
        nix::sys::socket::setsockopt(
            socket,
            nix::sys::socket::sockopt::IpBindAddressNoPort,
            &true,
        )?;
    }
    SockRef::from(socket).bind(&SocketAddr::new(from, 0).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_endpoints_inside_the_network_are_bound_and_the_port_is_left_to_connect() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = listener.local_addr().unwrap();
        let rule = UpstreamSource {
            to: "127.0.0.0/8".parse().unwrap(),
            from: "127.0.0.2".parse().unwrap(),
        };
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        bind_source(&socket, Some(rule), target).unwrap();
        let bound = socket.local_addr().unwrap().as_socket().unwrap();
        assert_eq!(
            bound,
            "127.0.0.2:0".parse().unwrap(),
            "no port before connect"
        );
        socket.connect(&target.into()).unwrap();
        let (_, peer) = listener.accept().unwrap();
        assert_eq!(peer.ip(), rule.from);
        assert_ne!(peer.port(), 0);

        let elsewhere = UpstreamSource {
            to: "10.0.0.0/8".parse().unwrap(),
            ..rule
        };
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        bind_source(&socket, Some(elsewhere), target).unwrap();
        socket.connect(&target.into()).unwrap();
        let (_, peer) = listener.accept().unwrap();
        assert_eq!(peer.ip(), target.ip(), "the route's own source");
    }
}
