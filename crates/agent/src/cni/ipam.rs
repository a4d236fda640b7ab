//! Host-local IPAM persisted in the data dir, as the reference `host-local` plugin does it: one
//! file per allocated address, named by the address and holding `<container id>\n<ifname>`,
//! created with `O_EXCL`. The file system is the lock: two allocations (threads or processes)
//! can never get the same address, and allocations survive restarts. `last_reserved_ip` makes
//! allocation round-robin, so an address just released is not handed out again at once (its
//! old endpoint may still be in someone's cache).

use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::cni::types::{CniError, ErrorCode, IpamConf};

/// The store of one subnet's allocations.
#[derive(Debug, Clone)]
pub struct Ipam {
    dir: PathBuf,
    first: u32,
    last: u32,
    gateway: Ipv4Addr,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> CniError {
    CniError::new(ErrorCode::Io, format!("IPAM: {what} {}", path.display()))
        .with_details(e.to_string())
}

impl Ipam {
    /// Opens (creating) the allocation directory `<data_dir>/ipam/<network>/<subnet>`.
    pub fn open(data_dir: &Path, network: &str, conf: &IpamConf) -> Result<Self, CniError> {
        let subnet = conf.subnet;
        if !subnet.contains(&conf.gateway) {
            return Err(CniError::new(
                ErrorCode::InvalidConfig,
                format!(
                    "ipam.gateway {} is outside ipam.subnet {subnet}",
                    conf.gateway
                ),
            ));
        }
        if subnet.prefix_len() > 30 {
            return Err(CniError::new(
                ErrorCode::InvalidConfig,
                format!("ipam.subnet {subnet} is too small"),
            ));
        }
        let first = conf
            .range_start
            .map(u32::from)
            .unwrap_or(u32::from(subnet.network()) + 1);
        let last = conf
            .range_end
            .map(u32::from)
            .unwrap_or(u32::from(subnet.broadcast()) - 1);
        if first > last
            || !subnet.contains(&Ipv4Addr::from(first))
            || !subnet.contains(&Ipv4Addr::from(last))
        {
            return Err(CniError::new(
                ErrorCode::InvalidConfig,
                format!("ipam.rangeStart/rangeEnd are not a range inside {subnet}"),
            ));
        }
        if network.is_empty() || network.contains('/') || network.starts_with('.') {
            return Err(CniError::new(
                ErrorCode::InvalidConfig,
                format!("network name {network:?} is not usable as a directory name"),
            ));
        }
        let dir = data_dir
            .join("ipam")
            .join(network)
            .join(subnet.to_string().replace('/', "_"));
        fs::create_dir_all(&dir).map_err(|e| io_err("create", &dir, e))?;
        Ok(Self {
            dir,
            first,
            last,
            gateway: conf.gateway,
        })
    }

    /// The address held by `container_id`/`ifname`, if any.
    pub fn find(&self, container_id: &str, ifname: &str) -> Result<Option<Ipv4Addr>, CniError> {
        Ok(self
            .allocations()?
            .into_iter()
            .find(|(_, c, i)| c == container_id && i == ifname)
            .map(|(ip, _, _)| ip))
    }

    /// How many addresses the range can hand out (the gateway excluded).
    pub fn capacity(&self) -> u64 {
        let gateway = u32::from(self.gateway);
        let in_range = (self.first..=self.last).contains(&gateway);
        u64::from(self.last - self.first) + 1 - u64::from(in_range)
    }

    /// Every allocation: (address, container id, ifname).
    pub fn allocations(&self) -> Result<Vec<(Ipv4Addr, String, String)>, CniError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(|e| io_err("read", &self.dir, e))? {
            let entry = entry.map_err(|e| io_err("read", &self.dir, e))?;
            let Some(ip) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<Ipv4Addr>().ok())
            else {
                continue;
            };
            let content = fs::read_to_string(entry.path()).unwrap_or_default();
            let mut lines = content.lines();
            let container = lines.next().unwrap_or_default().trim().to_string();
            let ifname = lines.next().unwrap_or_default().trim().to_string();
            out.push((ip, container, ifname));
        }
        out.sort();
        Ok(out)
    }

    /// Allocates an address for `container_id`/`ifname` (the same one again if it already has one).
    pub fn allocate(&self, container_id: &str, ifname: &str) -> Result<Ipv4Addr, CniError> {
        if let Some(ip) = self.find(container_id, ifname)? {
            return Ok(ip);
        }
        let size = self.last - self.first + 1;
        let last_path = self.dir.join("last_reserved_ip");
        let start = fs::read_to_string(&last_path)
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .filter(|ip| (self.first..=self.last).contains(ip))
            .map(|ip| ip - self.first + 1)
            .unwrap_or(0);
        for k in 0..size {
            let ip = Ipv4Addr::from(self.first + (start + k) % size);
            if ip == self.gateway {
                continue;
            }
            let path = self.dir.join(ip.to_string());
            match fs::File::options().write(true).create_new(true).open(&path) {
                Ok(mut file) => {
                    file.write_all(format!("{container_id}\n{ifname}\n").as_bytes())
                        .map_err(|e| io_err("write", &path, e))?;
                    file.sync_all().map_err(|e| io_err("sync", &path, e))?;
                    // Best effort: losing it only makes allocation start over at the first address.
                    let _ = fs::write(&last_path, ip.to_string());
                    return Ok(ip);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create", &path, e)),
            }
        }
        Err(CniError::new(
            ErrorCode::AddressesExhausted,
            format!(
                "no free address in {}..{}",
                Ipv4Addr::from(self.first),
                Ipv4Addr::from(self.last)
            ),
        ))
    }

    /// Releases whatever `container_id`/`ifname` holds; releasing nothing is fine (DEL is idempotent).
    pub fn release(&self, container_id: &str, ifname: &str) -> Result<Option<Ipv4Addr>, CniError> {
        let mut released = None;
        for (ip, c, i) in self.allocations()? {
            if c == container_id && i == ifname {
                let path = self.dir.join(ip.to_string());
                match fs::remove_file(&path) {
                    Ok(()) => released = Some(ip),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("remove", &path, e)),
                }
            }
        }
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(subnet: &str, gw: &str) -> IpamConf {
        IpamConf {
            ipam_type: "svcnet-host-local".into(),
            subnet: subnet.parse().unwrap(),
            gateway: gw.parse().unwrap(),
            range_start: None,
            range_end: None,
        }
    }

    #[test]
    fn allocates_round_robin_skipping_gateway_and_persists() {
        let dir = tempfile::tempdir().unwrap();
        let c = conf("10.9.1.0/29", "10.9.1.1");
        let ipam = Ipam::open(dir.path(), "net", &c).unwrap();
        let a = ipam.allocate("a", "eth0").unwrap();
        let b = ipam.allocate("b", "eth0").unwrap();
        assert_eq!(
            (a, b),
            ("10.9.1.2".parse().unwrap(), "10.9.1.3".parse().unwrap())
        );
        assert_eq!(
            ipam.allocate("a", "eth0").unwrap(),
            a,
            "ADD twice keeps the address"
        );
        assert_eq!(ipam.release("a", "eth0").unwrap(), Some(a));
        assert_eq!(
            ipam.release("a", "eth0").unwrap(),
            None,
            "release is idempotent"
        );
        // A new store over the same directory (a restart) sees b and continues after it.
        let again = Ipam::open(dir.path(), "net", &c).unwrap();
        assert_eq!(again.find("b", "eth0").unwrap(), Some(b));
        assert_eq!(
            again.allocate("c", "eth0").unwrap(),
            "10.9.1.4".parse::<Ipv4Addr>().unwrap()
        );
    }

    #[test]
    fn exhaustion_is_an_error_and_no_address_is_given_twice() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Ipam::open(dir.path(), "net", &conf("10.9.1.0/29", "10.9.1.1")).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let ipam = ipam.clone();
                std::thread::spawn(move || ipam.allocate(&format!("c{i}"), "eth0"))
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mut ok: Vec<Ipv4Addr> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        ok.sort();
        let n = ok.len();
        ok.dedup();
        assert_eq!(ok.len(), n, "duplicate addresses: {results:?}");
        assert_eq!(n, 5, ".2 to .6 of a /29 minus the gateway");
        let err = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert_eq!(err.code, ErrorCode::AddressesExhausted);
    }

    #[test]
    fn bad_config_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let err = Ipam::open(dir.path(), "net", &conf("10.9.1.0/24", "10.9.2.1")).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidConfig);
        assert!(err.msg.contains("ipam.gateway"), "{err}");
    }
}
