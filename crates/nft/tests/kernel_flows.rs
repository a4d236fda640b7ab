//! The shared packet-flow table (svcnet-flows) against the REAL kernel: the world's full sync
//! applied to a fresh lab's node namespace with `nft -f`, then every case with real TCP/UDP
//! connections (the same cases and expectations as the tracers' and as iptables' kernel
//! tier), and every case again through the production tracer (`svcnet_nft::trace`) over the
//! table as the kernel lists it, the way `svcnet trace` reads a node. Needs root (CI runs as
//! root); the lab removes its namespaces on drop.
#![allow(clippy::unwrap_used)]

mod common;

use common::tracer::NftTracer;
use svcnet_flows::kernel::KernelLab;
use svcnet_flows::{cases, node_addrs, run_table, world};
use svcnet_nft::{Family, NftExecutor};

#[test]
fn shared_flow_table_on_the_kernel() {
    let kl = KernelLab::start();
    let exec = NftExecutor::new(Some(kl.node().name().to_string()));
    common::full(&world(), Some(&exec));
    // The rules as the kernel holds them, before traffic fills the affinity sets.
    let listing = exec.list_table(Family::Ip, "svcnet").unwrap().unwrap();
    run_table(&NftTracer::over_listing(&listing, node_addrs()), &cases());
    kl.run_table(&cases(), true);
}
