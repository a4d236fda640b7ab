//! IPVS objects as values: virtual services, real servers (destinations) and the operations
//! on them. An [`Op`] prints as the `ipvsadm-restore` line that does the same (for logs, plans
//! and the sync benchmark against `ipvsadm-restore`).

use std::fmt;
use std::net::IpAddr;

/// `IP_VS_SVC_F_PERSISTENT`: a client's connections go to one real server for `timeout`.
pub const F_PERSISTENT: u32 = 0x1;
/// `IP_VS_SVC_F_HASHED`: set by the kernel on every service it holds (dumps only).
pub const F_HASHED: u32 = 0x2;
/// `IP_VS_SVC_F_ONEPACKET`: one-packet scheduling (UDP).
pub const F_ONEPACKET: u32 = 0x4;
/// `IP_VS_SVC_F_SCHED1`: `sh-fallback` / `mh-fallback` (skip real servers of weight 0).
pub const F_SCHED1: u32 = 0x8;
/// `IP_VS_SVC_F_SCHED2`: `sh-port` / `mh-port` (hash the source port too).
pub const F_SCHED2: u32 = 0x10;

/// The flags a caller sets (the kernel adds [`F_HASHED`]).
pub const USER_FLAGS: u32 = F_PERSISTENT | F_ONEPACKET | F_SCHED1 | F_SCHED2;

/// The schedulers of Linux IPVS (`ip_vs_<name>` modules).
pub const SCHEDULERS: [&str; 13] = [
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf",
];

/// The longest scheduler name the kernel takes (`IP_VS_SCHEDNAME_MAXLEN - 1`).
pub const SCHED_NAME_MAX: usize = 15;

/// Transport protocol of a virtual service: the proxy core's.
pub use svcnet_proxy::Protocol;

/// The IP protocol number.
pub fn protocol_number(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// The protocol of an IP protocol number IPVS takes.
pub fn protocol_of(n: u16) -> Option<Protocol> {
    match n {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// ipvsadm's option for a protocol (`-t`, `-u`, `--sctp-service`).
fn ipvsadm_flag(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "-t",
        Protocol::Udp => "-u",
        Protocol::Sctp => "--sctp-service",
    }
}

/// `addr:port`, with brackets for IPv6 (ipvsadm's and URLs' form).
fn endpoint(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// What identifies a virtual service: protocol, address (its family is the service's) and
/// port; or, for a firewall-mark service (`fwmark != 0`), the mark and the family (of `addr`,
/// then unspecified; protocol TCP and port 0, as the kernel reports them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub protocol: Protocol,
    pub addr: IpAddr,
    pub port: u16,
    pub fwmark: u32,
}

impl ServiceKey {
    pub fn new(protocol: Protocol, addr: IpAddr, port: u16) -> Self {
        Self {
            protocol,
            addr,
            port,
            fwmark: 0,
        }
    }

    /// The firewall-mark service `mark` of the IPv6 (`v6`) or IPv4 family.
    pub fn fwmark(v6: bool, mark: u32) -> Self {
        let addr = if v6 {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        };
        Self {
            protocol: Protocol::Tcp,
            addr,
            port: 0,
            fwmark: mark,
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.fwmark != 0 {
            let v6 = if self.addr.is_ipv6() { " -6" } else { "" };
            return write!(f, "-f {}{v6}", self.fwmark);
        }
        let at = endpoint(self.addr, self.port);
        write!(f, "{} {at}", ipvsadm_flag(self.protocol))
    }
}

/// A virtual service as the kernel holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub key: ServiceKey,
    /// Scheduler name (one of [`SCHEDULERS`]).
    pub scheduler: String,
    /// `F_*` flags.
    pub flags: u32,
    /// Persistence timeout in seconds (with [`F_PERSISTENT`]).
    pub timeout: u32,
    /// Persistence granularity: IPv4 a mask (`0xffffffff` = per client address, in network
    /// order as the kernel keeps it), IPv6 a prefix length (128).
    pub netmask: u32,
}

impl Service {
    /// A service without persistence.
    pub fn new(key: ServiceKey, scheduler: &str) -> Self {
        Self {
            key,
            scheduler: scheduler.to_string(),
            flags: 0,
            timeout: 0,
            netmask: Self::host_netmask(key.addr),
        }
    }

    /// Per-client-address persistence granularity for the family of `addr`.
    pub fn host_netmask(addr: IpAddr) -> u32 {
        match addr {
            IpAddr::V4(_) => 0xffff_ffff,
            IpAddr::V6(_) => 128,
        }
    }

    /// With persistence for `timeout` seconds, per client address.
    pub fn persistent(mut self, timeout: u32) -> Self {
        self.flags |= F_PERSISTENT;
        self.timeout = timeout;
        self.netmask = Self::host_netmask(self.key.addr);
        self
    }

    /// Whether two services are the same apart from the flags the kernel adds.
    pub fn same_config(&self, other: &Service) -> bool {
        self.key == other.key
            && self.scheduler == other.scheduler
            && self.flags & USER_FLAGS == other.flags & USER_FLAGS
            && (self.flags & F_PERSISTENT == 0
                || (self.timeout == other.timeout && self.netmask == other.netmask))
    }

    /// ipvsadm's `-b` list for the scheduler flags.
    fn sched_flags(&self) -> Vec<&'static str> {
        let prefix = if self.scheduler == "mh" { "mh" } else { "sh" };
        let mut out = Vec::new();
        if self.flags & F_SCHED1 != 0 {
            out.push(if prefix == "mh" {
                "mh-fallback"
            } else {
                "sh-fallback"
            });
        }
        if self.flags & F_SCHED2 != 0 {
            out.push(if prefix == "mh" { "mh-port" } else { "sh-port" });
        }
        out
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -s {}", self.key, self.scheduler)?;
        let flags = self.sched_flags();
        if !flags.is_empty() {
            write!(f, " -b {}", flags.join(","))?;
        }
        if self.flags & F_PERSISTENT != 0 {
            write!(f, " -p {}", self.timeout)?;
            if self.key.addr.is_ipv6() && self.netmask != 128 {
                write!(f, " -M {}", self.netmask)?;
            }
        }
        if self.flags & F_ONEPACKET != 0 {
            f.write_str(" -o")?;
        }
        Ok(())
    }
}

/// How packets reach a real server; svcnet uses NAT (masquerading) only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// `IP_VS_CONN_F_MASQ` (0): destination NAT.
    Masq,
    /// Any other method, as read from the kernel.
    Other(u32),
}

impl Forward {
    pub fn code(self) -> u32 {
        match self {
            Self::Masq => 0,
            Self::Other(c) => c,
        }
    }

    pub fn from_code(c: u32) -> Self {
        if c & 0x7 == 0 {
            Self::Masq
        } else {
            Self::Other(c)
        }
    }
}

/// A real server (destination) of a virtual service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dest {
    pub addr: IpAddr,
    pub port: u16,
    pub forward: Forward,
    /// 0 takes no new connections (graceful termination); at most `i32::MAX`.
    pub weight: u32,
    pub upper_threshold: u32,
    pub lower_threshold: u32,
    /// Counters (dumps only).
    pub active_conns: u32,
    pub inactive_conns: u32,
    pub persist_conns: u32,
}

impl Dest {
    /// A NAT real server with `weight` and no thresholds.
    pub fn masq(addr: IpAddr, port: u16, weight: u32) -> Self {
        Self {
            addr,
            port,
            forward: Forward::Masq,
            weight,
            upper_threshold: 0,
            lower_threshold: 0,
            active_conns: 0,
            inactive_conns: 0,
            persist_conns: 0,
        }
    }

    pub fn key(&self) -> DestKey {
        DestKey {
            addr: self.addr,
            port: self.port,
        }
    }
}

/// What identifies a real server within its service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DestKey {
    pub addr: IpAddr,
    pub port: u16,
}

impl fmt::Display for DestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&endpoint(self.addr, self.port))
    }
}

/// One change to the kernel's IPVS table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    AddService(Service),
    EditService(Service),
    DelService(ServiceKey),
    AddDest(ServiceKey, Dest),
    EditDest(ServiceKey, Dest),
    DelDest(ServiceKey, DestKey),
    /// Removes every service of the namespace.
    Flush,
}

impl fmt::Display for Op {
    /// The `ipvsadm-restore` line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dest = |f: &mut fmt::Formatter<'_>, cmd: &str, svc: &ServiceKey, d: &Dest| {
            write!(f, "{cmd} {svc} -r {} -m -w {}", d.key(), d.weight)?;
            if d.upper_threshold != 0 {
                write!(f, " -x {}", d.upper_threshold)?;
            }
            if d.lower_threshold != 0 {
                write!(f, " -y {}", d.lower_threshold)?;
            }
            Ok(())
        };
        match self {
            Op::AddService(s) => write!(f, "-A {s}"),
            Op::EditService(s) => write!(f, "-E {s}"),
            Op::DelService(k) => write!(f, "-D {k}"),
            Op::AddDest(k, d) => dest(f, "-a", k, d),
            Op::EditDest(k, d) => dest(f, "-e", k, d),
            Op::DelDest(k, d) => write!(f, "-d {k} -r {d}"),
            Op::Flush => f.write_str("-C"),
        }
    }
}

/// An error the kernel (or the fake) returned for an operation: the errno and what it means
/// for IPVS.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {}", describe(*errno))]
pub struct Rejected {
    /// The operation as an `ipvsadm-restore` line.
    pub op: String,
    /// The positive errno.
    pub errno: i32,
}

/// ipvsadm's reading of an errno for IPVS commands.
pub fn describe(errno: i32) -> String {
    let what = match errno {
        libc::EEXIST => "already exists",
        libc::ESRCH => "no such service",
        libc::ENOENT => "no such destination or scheduler",
        libc::EINVAL => "invalid argument",
        libc::ERANGE => "value out of range",
        libc::EPERM => "permission denied (needs CAP_NET_ADMIN)",
        libc::EAFNOSUPPORT => "address family not supported",
        _ => return std::io::Error::from_raw_os_error(errno).to_string(),
    };
    format!("{what} (errno {errno})")
}

/// IPVS's connection timeouts in whole seconds (0 in a request: leave that one as it is):
/// established TCP, TCP after a FIN, UDP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}
