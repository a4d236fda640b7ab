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
