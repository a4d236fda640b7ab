//! The shared packet-flow table (svcnet-flows) through the userspace dataplane's route
//! tracer, privileged mode: the same cases and expectations as nft's and iptables' tracers,
//! except that the userspace proxy always connects from the node (its endpoints never see
//! the client address), which the kit applies to every delivered case.
#![allow(clippy::unwrap_used)]

mod common;

use common::tracer::UserspaceTracer;
use svcnet_flows::{cases, node_addrs, run_table, world};
use svcnet_proxy::IpFamily;
use svcnet_userspace::Mode;
use svcnet_userspace::rules::NodeChecks;
use svcnet_userspace::table::routes;

#[test]
fn packet_flow_table() {
    let state = world();
    let v4 = state.desired(IpFamily::V4);
    let tracer = UserspaceTracer {
        routes: routes(std::slice::from_ref(&v4), &Mode::Privileged),
        checks: NodeChecks::of(&v4),
        local_addrs: node_addrs(),
    };
    run_table(&tracer, &cases());
}
