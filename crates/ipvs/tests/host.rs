//! On a kernel without IPVS (this project's host), opening the client fails with a message
//! that names the missing module; where IPVS exists it opens.
#![allow(clippy::unwrap_used)]

use svcnet_ipvs::{IpvsError, IpvsSocket};

#[test]
fn opening_without_ipvs_names_the_module() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    match IpvsSocket::open() {
        Ok(_) => eprintln!("this kernel has IPVS"),
        Err(e @ IpvsError::NotAvailable) => {
            let msg = e.to_string();
            assert!(
                msg.contains("modprobe ip_vs") && msg.contains("CONFIG_IP_VS"),
                "{msg}"
            );
        }
        Err(e) => panic!("{e}"),
    }
}

/// `--proxy-mode ipvs` on a kernel without IPVS fails at start, naming the module.
#[test]
fn the_dataplane_does_not_start_without_ipvs() {
    if !nix::unistd::Uid::effective().is_root() {
        return;
    }
    let ns = svcnet_netns::NetNs::create(&svcnet_netns::unique_name("ipn")).unwrap();
    match svcnet_ipvs::IpvsDataplane::new(
        Some(ns.name().to_string()),
        &[svcnet_proxy::IpFamily::V4],
    ) {
        Ok(_) => eprintln!("this kernel has IPVS"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("modprobe ip_vs"), "{msg}");
        }
    }
}
