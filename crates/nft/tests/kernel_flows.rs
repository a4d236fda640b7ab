//! The shared packet-flow table (svcnet-flows) against the REAL kernel: the world's full sync
//! applied to a fresh lab's node namespace with `nft -f`, then every case with real TCP/UDP
//! connections (the same cases and expectations as the tracers' and as iptables' kernel
//! tier). Needs root (CI runs as root); the lab removes its namespaces on drop.
#![allow(clippy::unwrap_used)]

mod common;

use svcnet_flows::kernel::KernelLab;
use svcnet_flows::{cases, world};
use svcnet_nft::NftExecutor;

#[test]
fn shared_flow_table_on_the_kernel() {
    let kl = KernelLab::start();
    let exec = NftExecutor::new(Some(kl.node().name().to_string()));
    common::full(&world(), Some(&exec));
    kl.run_table(&cases(), true);
}
