//! Helpers for tests that build real topologies: a unique name prefix per test, and a
//! machine-wide *slot* that gives each concurrently running test its own CIDRs (host routes are
//! global, so two tests, or a test and a running `svcnet up`, must never use the same ones).

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use ipnet::Ipv4Net;

use crate::topology::TopologyConfig;

/// A prefix unique to this process and call, ≤ 11 characters: `t<pid hex>k<n>`.
pub fn unique_prefix() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{:x}k{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A slot held through an exclusive lock on a file (released when dropped or the process dies).
#[derive(Debug)]
pub struct Slot {
    pub index: u8,
    _lock: File,
}

impl Slot {
    /// Takes a free slot out of 32, waiting if all are taken.
    pub fn acquire() -> std::io::Result<Slot> {
        let dir = PathBuf::from("/tmp/svcnet-agent-test-slots");
        std::fs::create_dir_all(&dir)?;
        loop {
            for index in 0..32u8 {
                let file = File::options()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(dir.join(index.to_string()))?;
                if file.try_lock().is_ok() {
                    return Ok(Slot { index, _lock: file });
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// A topology config in this slot: underlay 198.18.<slot>.0/24 (RFC 2544 benchmarking
    /// space), pod CIDR 10.<160+slot>.0.0/16, service CIDR 10.<224+slot>.0.0/16, LB pool
    /// 198.19.<slot>.0/28. None of these is svcnet up's default.
    pub fn config(&self, nodes: usize, data_dir: PathBuf) -> TopologyConfig {
        let i = self.index;
        let net = |a, b, c, len| Ipv4Net::new(Ipv4Addr::new(a, b, c, 0), len).unwrap_or_default();
        TopologyConfig {
            prefix: unique_prefix(),
            nodes,
            underlay: net(198, 18, i, 24),
            pod_cidr: net(10, 160 + i, 0, 16),
            service_cidrs: vec![net(10, 224 + i, 0, 16)],
            lb_pool: Some(net(198, 19, i, 28)),
            data_dir,
            pod_network: crate::routes::PodNetwork::HostGw,
        }
    }
}
