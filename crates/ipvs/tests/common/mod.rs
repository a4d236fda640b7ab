//! Shared by the pure tests: a renderer with the flows lab's node addresses.
#![allow(dead_code)]

use std::net::IpAddr;

use svcnet_ipvs::render::Renderer;
use svcnet_proxy::IpFamily;

/// An IPv4 renderer whose node ports are served on the flows lab's node addresses (loopback
/// excluded, as node ports never are there).
pub fn renderer() -> Renderer {
    let mut r = Renderer::new(IpFamily::V4);
    let ips: Vec<IpAddr> = svcnet_flows::node_addrs()
        .into_iter()
        .filter(|a| !a.is_loopback())
        .collect();
    r.set_node_ips(ips);
    r
}
