//! Real test topologies in fresh network namespaces (for this workspace's tests and benches).
//!
//! A [`Lab`] is a "node" namespace (IP forwarding on, no route anywhere else) plus "pod"
//! namespaces, each joined to the node by its own veth pair and routed through it (pod `i`
//! has `10.244.i.2/24` and `fd00:244:i::2/64`, the node `…1`), and optionally an "external"
//! namespace outside the cluster CIDR (`192.168.50.2`, the node's address there `192.168.50.1`
//! is the node IP, and the node's default route points there, like an uplink). Echo servers reply to each line with their identity and the client
//! address they saw. Everything is removed on drop, also when a test panics; names are unique
//! per process and call.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{NetNs, NetnsError, unique_name};

/// The node's address on the external link: the "node IP" for node ports.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
pub const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 1);
/// The external client's address.
pub const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);

/// A pod namespace.
#[derive(Debug)]
pub struct Pod {
    pub ns: NetNs,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
    /// The node-side veth name.
    pub host_link: String,
}

/// A node namespace with pods and an optional external client.
#[derive(Debug)]
pub struct Lab {
    prefix: String,
    servers: Vec<Server>,
    pods: Vec<Pod>,
    external: Option<NetNs>,
    /// Dropped last: destroying it destroys every veth.
    pub node: NetNs,
}

impl Lab {
    pub fn new() -> Result<Self, NetnsError> {
        let prefix = unique_name("s");
        let node = NetNs::create(&format!("{prefix}n"))?;
        no_dad(&node)?;
        node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        node.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
        Ok(Self {
            prefix,
            servers: Vec::new(),
            pods: Vec::new(),
            external: None,
            node,
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Adds pod number `pods().len() + 1`.
    pub fn add_pod(&mut self) -> Result<&Pod, NetnsError> {
        let i = self.pods.len() + 1;
        let ns = NetNs::create(&format!("{}p{i}", self.prefix))?;
        no_dad(&ns)?;
        let host_link = format!("{}p{i}", self.prefix);
        let (v4, v6) = (
            Ipv4Addr::new(10, 244, i as u8, 2),
            Ipv6Addr::new(0xfd00, 0x244, i as u16, 0, 0, 0, 0, 2),
        );
        self.link(
            &ns,
            &host_link,
            &format!("10.244.{i}.1/24"),
            &format!("fd00:244:{i:x}::1/64"),
        )?;
        ns.exec(&["ip", "addr", "add", &format!("{v4}/24"), "dev", "eth0"])?;
        ns.exec(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            "eth0",
            "nodad",
        ])?;
        ns.exec(&[
            "ip",
            "route",
            "add",
            "default",
            "via",
            &format!("10.244.{i}.1"),
        ])?;
        ns.exec(&[
            "ip",
            "-6",
            "route",
            "add",
            "default",
            "via",
            &format!("fd00:244:{i:x}::1"),
        ])?;
        self.pods.push(Pod {
            ns,
            ipv4: v4,
            ipv6: v6,
            host_link,
        });
        Ok(&self.pods[i - 1])
    }

    /// Creates a veth pair: `host_link` in the node with the given addresses, `eth0` in `peer`.
    fn link(&self, peer: &NetNs, host_link: &str, v4: &str, v6: &str) -> Result<(), NetnsError> {
        self.node.exec(&[
            "ip",
            "link",
            "add",
            host_link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            peer.name(),
        ])?;
        self.node
            .exec(&["ip", "addr", "add", v4, "dev", host_link])?;
        self.node
            .exec(&["ip", "-6", "addr", "add", v6, "dev", host_link, "nodad"])?;
        self.node.exec(&["ip", "link", "set", host_link, "up"])?;
        peer.exec(&["ip", "link", "set", "eth0", "up"])?;
        Ok(())
    }

    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    pub fn pod(&self, i: usize) -> &Pod {
        &self.pods[i]
    }

    /// Adds (once) and returns the external client namespace, routed only via the node.
    pub fn external(&mut self) -> Result<&NetNs, NetnsError> {
        if self.external.is_none() {
            let ns = NetNs::create(&format!("{}x", self.prefix))?;
            no_dad(&ns)?;
            self.link(
                &ns,
                &format!("{}x", self.prefix),
                &format!("{NODE_IP}/24"),
                &format!("{NODE_IP6}/64"),
            )?;
            ns.exec(&[
                "ip",
                "addr",
                "add",
                &format!("{EXTERNAL_IP}/24"),
                "dev",
                "eth0",
            ])?;
            ns.exec(&[
                "ip",
                "-6",
                "addr",
                "add",
                "fd00:50::2/64",
                "dev",
                "eth0",
                "nodad",
            ])?;
            ns.exec(&["ip", "route", "add", "default", "via", &NODE_IP.to_string()])?;
            ns.exec(&[
                "ip",
                "-6",
                "route",
                "add",
                "default",
                "via",
                &NODE_IP6.to_string(),
            ])?;
            // The node's "uplink": like a real node it has a default route, so traffic that
            // the dataplane does not stop would leave through it. The external namespace does
            // not forward, so anything leaking ends there.
            self.node.exec(&[
                "ip",
                "route",
                "add",
                "default",
                "via",
                &EXTERNAL_IP.to_string(),
            ])?;
            self.node
                .exec(&["ip", "-6", "route", "add", "default", "via", "fd00:50::2"])?;
            // Traffic from the external client that the node routes back out of the same
            // link (an unallocated or unknown service address) would make the node send an
            // ICMP redirect first, which uses up the per-peer ICMP rate limit, so the reject
            // that follows would never reach the client. Routers on a shared uplink turn
            // redirects off; the lab's node does too (the setting is `all` OR the link's).
            for conf in ["all".to_string(), format!("{}x", self.prefix)] {
                self.node.exec(&[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv4.conf.{conf}.send_redirects=0"),
                ])?;
            }
            self.external = Some(ns);
        }
        self.external.as_ref().ok_or_else(|| NetnsError::Panicked {
            name: self.prefix.clone(),
        })
    }

    /// Starts a TCP echo server in pod `i` (owned by the lab; stopped on drop).
    pub fn serve_tcp(&mut self, i: usize, port: u16, identity: &str) -> Result<(), NetnsError> {
        let s = serve_tcp(&self.pods[i].ns, port, identity)?;
        self.servers.push(s);
        Ok(())
    }

    /// Starts a UDP echo server in pod `i`.
    pub fn serve_udp(&mut self, i: usize, port: u16, identity: &str) -> Result<Server, NetnsError> {
        serve_udp(&self.pods[i].ns, port, identity)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.servers.clear();
    }
}

/// A running echo server; stopped (and its thread joined) on drop.
#[derive(Debug)]
pub struct Server {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Turns off IPv6 duplicate address detection in a fresh namespace: while link-local
/// addresses are tentative (about a second) neighbour discovery cannot run and the first
/// IPv6 packets are lost.
fn no_dad(ns: &NetNs) -> Result<(), NetnsError> {
    ns.exec(&[
        "sysctl",
        "-qw",
        "net.ipv6.conf.all.accept_dad=0",
        "net.ipv6.conf.default.accept_dad=0",
    ])?;
    Ok(())
}

fn peer_ip(addr: SocketAddr) -> IpAddr {
    addr.ip().to_canonical()
}

/// Starts a dual-stack TCP server in `ns`: for each line received it answers
/// `"<identity> <client ip>\n"`; connections stay open until the client closes them.
pub fn serve_tcp(ns: &NetNs, port: u16, identity: &str) -> Result<Server, NetnsError> {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (flag, id) = (stop.clone(), identity.to_string());
    let handle = ns.spawn(move || {
        let listener = match TcpListener::bind(("::", port))
            .and_then(|l| l.set_nonblocking(true).map(|_| l))
        {
            Ok(l) => l,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let _ = ready_tx.send(Ok(()));
        let mut conns = Vec::new();
        while !flag.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, peer)) => {
                    let (flag, id) = (flag.clone(), id.clone());
                    conns.push(std::thread::spawn(move || {
                        handle_conn(stream, peer, &id, &flag)
                    }));
                }
                // Until a client connects, or 50 ms to look at the stop flag. (A 2 ms sleep
                // here woke each server 500 times a second: a lab's 18 servers took a good
                // part of a core, and all of the QEMU tier's emulated ones.)
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let _ = crate::wait_readable(&listener, 50);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
            conns.retain(|c| !c.is_finished());
        }
        for c in conns {
            let _ = c.join();
        }
    })?;
    wait_ready(ns, ready_rx)?;
    Ok(Server {
        stop,
        handle: Some(handle),
    })
}

fn handle_conn(stream: TcpStream, peer: SocketAddr, id: &str, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                if writer
                    .write_all(format!("{id} {}\n", peer_ip(peer)).as_bytes())
                    .is_err()
                {
                    return;
                }
                line.clear();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// Starts a dual-stack UDP server in `ns` answering each datagram with
/// `"<identity> <client ip>\n"`.
pub fn serve_udp(ns: &NetNs, port: u16, identity: &str) -> Result<Server, NetnsError> {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (flag, id) = (stop.clone(), identity.to_string());
    let handle = ns.spawn(move || {
        let sock = match UdpSocket::bind(("::", port)).and_then(|s| {
            s.set_read_timeout(Some(Duration::from_millis(50)))
                .map(|_| s)
        }) {
            Ok(s) => s,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let _ = ready_tx.send(Ok(()));
        let mut buf = [0u8; 512];
        while !flag.load(Ordering::Relaxed) {
            if let Ok((_, peer)) = sock.recv_from(&mut buf) {
                let _ = sock.send_to(format!("{id} {}\n", peer_ip(peer)).as_bytes(), peer);
            }
        }
    })?;
    wait_ready(ns, ready_rx)?;
    Ok(Server {
        stop,
        handle: Some(handle),
    })
}

fn wait_ready(
    ns: &NetNs,
    rx: std::sync::mpsc::Receiver<std::io::Result<()>>,
) -> Result<(), NetnsError> {
    match rx.recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(NetnsError::Io {
            name: ns.name().to_string(),
            action: "bind server",
            source: e,
        }),
        Err(_) => Err(NetnsError::Panicked {
            name: ns.name().to_string(),
        }),
    }
}

/// An echo server's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub identity: String,
    pub client: IpAddr,
}

fn parse_reply(line: &str) -> std::io::Result<Reply> {
    let bad = || std::io::Error::new(ErrorKind::InvalidData, format!("bad reply {line:?}"));
    let (identity, client) = line.trim().split_once(' ').ok_or_else(bad)?;
    Ok(Reply {
        identity: identity.to_string(),
        client: client.parse().map_err(|_| bad())?,
    })
}

/// An open TCP connection to an echo server (call inside `NetNs::run`).
pub struct Session {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Session {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        let writer = stream.try_clone()?;
        Ok(Self {
            reader: BufReader::new(stream),
            writer,
        })
    }

    pub fn ask(&mut self) -> std::io::Result<Reply> {
        self.writer.write_all(b"?\n")?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        parse_reply(&line)
    }
}

/// One TCP request: connect, ask, close (call inside `NetNs::run`).
pub fn tcp_ask(addr: SocketAddr, timeout: Duration) -> std::io::Result<Reply> {
    Session::connect(addr, timeout)?.ask()
}

/// One UDP request from a fresh socket (call inside `NetNs::run`).
pub fn udp_ask(addr: SocketAddr, timeout: Duration) -> std::io::Result<Reply> {
    let sock = UdpSocket::bind(if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })?;
    udp_ask_with(&sock, addr, timeout)
}

/// One UDP request from a given socket (so the source port stays the same across requests).
pub fn udp_ask_with(
    sock: &UdpSocket,
    addr: SocketAddr,
    timeout: Duration,
) -> std::io::Result<Reply> {
    sock.set_read_timeout(Some(timeout))?;
    sock.send_to(b"?", addr)?;
    let mut buf = [0u8; 512];
    let (n, _) = sock.recv_from(&mut buf)?;
    parse_reply(&String::from_utf8_lossy(&buf[..n]))
}

/// Whether this test runs inside the kernel-matrix tier (user-mode Linux, booted by
/// `scripts/uml/cargo-runner`, which sets `UML_GUEST`). Tests of that tier run only there: on
/// the host they are skipped, unless `SVCNET_UML=1` says the tier was asked for, in which case
/// running outside UML (the runner was not used) is a failure, never a silent pass.
///
/// # Panics
/// When `SVCNET_UML=1` and the test is not inside UML.
pub fn uml_guest() -> bool {
    tier_guest(
        "UML_GUEST",
        "SVCNET_UML",
        "user-mode Linux",
        "scripts/uml/cargo-runner",
    )
}

/// Whether this test runs inside the QEMU tier (Debian's own kernel, booted by
/// `scripts/vm/cargo-runner`, which sets `VM_GUEST`): for what needs both a full netfilter
/// (nf_tables for ip/ip6/inet) and modules this host lacks (ip_vs), which user-mode Linux
/// does not have together. Skipped on the host unless `SVCNET_VM=1`, as [`uml_guest`].
///
/// # Panics
/// When `SVCNET_VM=1` and the test is not inside the QEMU tier.
pub fn vm_guest() -> bool {
    tier_guest(
        "VM_GUEST",
        "SVCNET_VM",
        "the QEMU tier",
        "scripts/vm/cargo-runner",
    )
}

fn tier_guest(guest: &str, asked: &str, tier: &str, runner: &str) -> bool {
    if std::env::var_os(guest).is_some() {
        return true;
    }
    assert!(
        std::env::var(asked).as_deref() != Ok("1"),
        "{asked}=1 but this test is not running inside {tier}: set \
         CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER={runner}"
    );
    eprintln!("skipped: kernel-matrix test (runs inside {tier} via {runner})");
    false
}
