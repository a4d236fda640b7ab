//! `svcnet trace` past the userspace proxy's listener. The kernel's part ends there; the proxy
//! picks an endpoint per connection and, under NetworkPolicy, judges the client against it.
//! The endpoints it can pick for the traced frontend come from the API's Services,
//! EndpointSlices and Nodes through the functions the proxy itself runs: the proxy core
//! (`svcnet_proxy::ProxyState`, this node's desired state) and the userspace proxy's route
//! table (`svcnet_userspace::table::routes`), the route whose frontend and sources take the
//! packet.

use std::net::{IpAddr, SocketAddr};

use anyhow::Context;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcnet_proxy::trace::Packet;
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};
use svcnet_userspace::table::{Frontend, RouteSpec, Sources, routes};

/// The endpoints the userspace proxy on `node` relays `pkt` to, one of them per connection.
pub async fn endpoints(
    client: kube::Client,
    node: &str,
    local: &[IpAddr],
    pkt: &Packet,
) -> anyhow::Result<Vec<SocketAddr>> {
    let lp = kube::api::ListParams::default();
    let services = kube::Api::<Service>::all(client.clone())
        .list(&lp)
        .await?
        .items;
    let slices = kube::Api::<EndpointSlice>::all(client.clone())
        .list(&lp)
        .await?
        .items;
    let nodes = kube::Api::<Node>::all(client)
        .list(&lp)
        .await
        .context("listing nodes")?
        .items;
    Ok(relayed(&services, &slices, &nodes, node, local, pkt))
}

/// [`endpoints`] from the objects: the pure part.
pub fn relayed(
    services: &[Service],
    slices: &[EndpointSlice],
    nodes: &[Node],
    node: &str,
    local: &[IpAddr],
    pkt: &Packet,
) -> Vec<SocketAddr> {
    // Pods are the sources inside the nodes' pod ranges (`svcnet up` gives the proxy its
    // cluster CIDR; the nodes' ranges hold the same pods).
    let cluster_cidrs: Vec<IpNet> = nodes
        .iter()
        .filter_map(|n| n.spec.as_ref()?.pod_cidr.as_deref()?.parse().ok())
        .collect();
    let mut state = ProxyState::new(CoreConfig {
        node_name: node.to_string(),
        cluster_cidrs: cluster_cidrs.clone(),
        ..CoreConfig::default()
    });
    for s in services {
        // A Service the proxy cannot program is one it does not serve either.
        let _ = state.update_service(s);
    }
    for s in slices {
        state.update_slice(s);
    }
    if let Some(n) = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))
    {
        state.update_node(n);
    }
    let family = match pkt.dst {
        IpAddr::V4(_) => IpFamily::V4,
        IpAddr::V6(_) => IpFamily::V6,
    };
    let pod_or_node =
        local.contains(&pkt.src) || cluster_cidrs.iter().any(|c| c.contains(&pkt.src));
    let mut out: Vec<SocketAddr> = routes(
        &[state.desired(family)],
        &svcnet_userspace::Mode::Privileged,
    )
    .into_iter()
    .filter(|r| takes(r, pkt, local, pod_or_node))
    .flat_map(|r| {
        r.endpoints
            .into_iter()
            .map(|e| SocketAddr::new(e.ip, e.port))
    })
    .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether route `r` serves `pkt`: its protocol, one of its frontends, its sources.
fn takes(r: &RouteSpec, pkt: &Packet, local: &[IpAddr], pod_or_node: bool) -> bool {
    let frontend = r.frontends.iter().any(|fe| match fe {
        Frontend::Addr(ip, port) | Frontend::LoadBalancer(ip, port, _) => {
            *ip == pkt.dst && *port == pkt.dport
        }
        Frontend::NodePort(port) => *port == pkt.dport && local.contains(&pkt.dst),
    });
    let sources = match &r.sources {
        Sources::Any => true,
        Sources::PodsAndNode(_) => pod_or_node,
        Sources::NotPodsOrNode(_) => !pod_or_node,
    };
    pkt.proto == Some(r.protocol) && frontend && sources
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcnet_proxy::Protocol;
    use svcnet_proxy::fixtures::{not_ready, service, slice};

    fn packet(src: &str, dst: &str, dport: u16) -> Packet {
        Packet {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            dport,
            proto: Some(Protocol::Tcp),
            local_origin: false,
        }
    }

    /// The ready endpoints of the Service whose cluster IP and port the packet is for, with
    /// their target port; another port, another protocol or another Service's IP gets none.
    #[test]
    fn the_endpoints_of_the_frontend_the_packet_is_for() {
        let svc = service("default", "web", |b| {
            b.cluster_ip(&["10.96.0.20"]).port("http", "TCP", 8080);
        });
        let sl = slice("default", "web-1", "web", |b| {
            b.port("http", "TCP", 80);
            b.endpoint("10.244.1.5", "node1", |_| {});
            b.endpoint("10.244.2.5", "node2", |_| {});
            b.endpoint("10.244.2.6", "node2", not_ready);
        });
        let local: Vec<IpAddr> = vec!["10.244.1.1".parse().unwrap()];
        let got = |p: &Packet| {
            relayed(
                std::slice::from_ref(&svc),
                std::slice::from_ref(&sl),
                &[],
                "node1",
                &local,
                p,
            )
        };
        assert_eq!(
            got(&packet("10.244.1.7", "10.96.0.20", 8080)),
            vec![
                "10.244.1.5:80".parse::<SocketAddr>().unwrap(),
                "10.244.2.5:80".parse().unwrap()
            ]
        );
        assert!(got(&packet("10.244.1.7", "10.96.0.20", 8081)).is_empty());
        assert!(got(&packet("10.244.1.7", "10.96.0.21", 8080)).is_empty());
        let mut udp = packet("10.244.1.7", "10.96.0.20", 8080);
        udp.proto = Some(Protocol::Udp);
        assert!(got(&udp).is_empty());
    }
}
