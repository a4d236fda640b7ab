//! The kernel-matrix tier for iptables (runs inside user-mode Linux, a second kernel version
//! with nf_tables only for the bridge family, through `scripts/uml/cargo-runner`; skipped on
//! the host): the back end is detected as legacy there, with the reason, and the packet-flow
//! table passes with real traffic between the lab's namespaces on that detected back end.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use svcnet_flows::kernel::KernelLab;
use svcnet_iptables::{Backend, Family, IptablesDataplane, IptablesExecutor};
use svcnet_netns::NetNs;
use svcnet_netns::test_support::uml_guest;
use svcnet_proxy::{Dataplane, FullReason};

/// This kernel has no nf_tables for ip/ip6: detection must not pick the nft back end (every
/// restore would fail with `TABLE_ADD failed (Operation not supported)`), and it says why.
#[test]
fn detection_picks_legacy_without_nf_tables() {
    if !uml_guest() {
        return;
    }
    let ns = NetNs::create(&svcnet_netns::unique_name("ubd")).unwrap();
    let exec = IptablesExecutor::detect(Some(ns.name().to_string())).unwrap();
    assert_eq!(exec.backend(), Backend::Legacy, "{:?}", exec.why());
    let why = exec.why().unwrap();
    assert!(why.contains("no nf_tables for ip"), "{why}");
    // The probe left nothing behind in either back end.
    for backend in Backend::ALL {
        let save = ns.exec(&[&backend.program(Family::V4, "-save")]);
        assert!(!save.unwrap_or_default().contains("SVCNET"));
    }
}

/// The packet-flow table with real connections, on the back end detection chose.
#[test]
fn flow_table_on_the_detected_back_end() {
    if !uml_guest() {
        return;
    }
    let kl = KernelLab::start();
    let exec = IptablesExecutor::detect(Some(kl.node().name().to_string())).unwrap();
    assert_eq!(exec.backend(), Backend::Legacy);
    let mut dp = IptablesDataplane::new(exec);
    let state = world();
    for f in dp.families() {
        let plan = dp
            .plan_full(f, &state.desired(f), FullReason::Unknown)
            .unwrap();
        dp.apply(f, &plan).unwrap();
        dp.commit(f, plan);
    }
    kl.run_table(&cases(), true);
}
