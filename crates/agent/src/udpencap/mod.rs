//! flannel's UDP backend, svcnet's own encapsulation loop: a multi-queue TUN `flannel0` in the
//! node's namespace (MTU 1472, the `.0/32` of the node's pod CIDR, one route for the whole
//! cluster pod CIDR), and per queue one UDP socket on port 8285 (`SO_REUSEPORT`) with two
//! threads: TUN → peer and peer → TUN.
//!
//! ```text
//!  pod eth0 ─ veth ─ cni0 ─(route 10.244.0.0/16 dev flannel0)─ flannel0 ─ read ─┐
//!                                                       PeerTable: dst → peer:8285 │ sendmsg(UDP_SEGMENT)
//!  other node: eth0:8285 ─ recvmmsg(UDP_GRO) ─ coalesce TCP ─ write ─ flannel0 ─ cni0 ─ pod
//! ```
//!
//! As fast as user space allows: the TUN hands over TSO/USO super-packets (`IFF_VNET_HDR`,
//! `TUNSETOFFLOAD`), which are split into MTU-sized inner packets and sent in one `sendmsg`
//! with `UDP_SEGMENT`; the receiver takes GRO batches (`UDP_GRO`, `recvmmsg`) and writes
//! in-order TCP segments back to the TUN as one GSO super-packet. Each offload falls back when
//! the kernel lacks it (then: one packet per read, `sendmmsg` batches, one packet per write).
//!
//! **One flow, one queue, on both nodes.** Every datagram between two nodes carries the same
//! outer addresses and ports (8285 → 8285, as flanneld sends), so the kernel's `SO_REUSEPORT`
//! hash would hand all of a peer's traffic to one socket, and since a multi-queue TUN sends a
//! flow out of the queue that last wrote its other direction, one queue would carry everything
//! both ways. A classic BPF program on the socket group ([`tun::steer_by_inner_flow`]) picks the
//! socket by a symmetric hash of the inner packet's addresses and ports instead: a flow's
//! datagrams arrive on queue `q` of both nodes, its packets are written to the TUN from queue
//! `q`, and so the TUN hands its next packets to queue `q`'s reader. The wire format is
//! flannel's unchanged.
//!
//! **Where it runs:** threads of the process that calls [`UdpEncap::start`] — `svcnet up`'s
//! agent, one [`UdpEncap`] per node namespace. The TUN is not persistent: it, its address and
//! its route vanish when the last queue closes, so they die with `up` (also on `kill -9`) and
//! are made afresh on the next start. Nothing outlives the process but the node namespace,
//! which `svcnet down` removes.

pub mod packet;
pub mod table;

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use ipnet::Ipv4Net;
use svcnet_netns::tun;

use crate::topology::{NodeTopology, Step, TopologyError};
use packet::{Coalescer, F_NEEDS_CSUM, GSO_NONE, VNET_HDR_LEN, VnetHdr};
pub use table::{PeerTable, UDP_PORT, UdpPeer};

/// flannel's TUN name (`flannel%d` → `flannel0`).
pub const UDP_DEVICE: &str = "flannel0";
/// Bytes the UDP backend adds: outer IPv4 20 + UDP 8 (flannel: "20 bytes IP hdr + 8 bytes UDP
/// hdr").
pub const UDP_OVERHEAD: u32 = 28;

/// The device's address, MTU and the cluster route (pure; run once the first queue made the
/// device).
pub fn device_steps(node: &NodeTopology, cluster_cidr: Ipv4Net, mtu: u32) -> Vec<Step> {
    let ns = Some(node.netns.as_str());
    vec![
        Step::ip(
            ns,
            &[
                "addr",
                "add",
                &format!("{}/32", node.pod_cidr.network()),
                "dev",
                UDP_DEVICE,
            ],
        ),
        Step::ip(
            ns,
            &["link", "set", UDP_DEVICE, "mtu", &mtu.to_string(), "up"],
        ),
        Step::ip(
            ns,
            &["route", "add", &cluster_cidr.to_string(), "dev", UDP_DEVICE],
        ),
    ]
}

/// How to run the loop.
#[derive(Debug, Clone)]
pub struct UdpEncapConfig {
    pub cluster_cidr: Ipv4Net,
    pub port: u16,
    /// Queues (= socket and thread pair each); 0 = one per core.
    pub queues: usize,
    /// Take TSO/USO super-packets from the TUN (split and checksummed here, one read per 64 KiB)
    /// instead of letting the kernel segment and checksum before the TUN (one read per packet).
    /// The default is on in optimised builds; in unoptimised (`dev`) builds the user-space
    /// splitting costs more than the reads it saves (measured: 140 against 300 MB/s), so it is
    /// off there. Receiving always coalesces.
    pub tun_offload: bool,
    pub mtu: u32,
}

impl UdpEncapConfig {
    pub fn new(cluster_cidr: Ipv4Net) -> Self {
        Self {
            cluster_cidr,
            port: UDP_PORT,
            queues: 0,
            tun_offload: !cfg!(debug_assertions),
            mtu: crate::routes::UNDERLAY_MTU - UDP_OVERHEAD,
        }
    }
}

/// What the running loop found the kernel can do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offloads {
    pub queues: usize,
    pub tun_offload: u32,
    pub udp_gso: bool,
    pub udp_gro: bool,
    /// Datagrams go to the queue of their inner flow (`SO_ATTACH_REUSEPORT_CBPF`), not by the
    /// kernel's hash of the outer header.
    pub steering: bool,
}

#[derive(Debug)]
struct Shared {
    table: RwLock<Arc<PeerTable>>,
    generation: AtomicU64,
    stop: AtomicBool,
    /// Each loop thread's id and name (`flannel0-tx0`, ...), for its CPU time.
    tids: Mutex<Vec<(u32, String)>>,
    counters: Vec<QueueCounters>,
}

/// What one queue's two threads moved, counted once per batch (relaxed atomics: figures for
/// people and benches, not for logic).
#[derive(Debug, Default)]
struct QueueCounters {
    tun_reads: AtomicU64,
    sent_datagrams: AtomicU64,
    sent_bytes: AtomicU64,
    receives: AtomicU64,
    receive_calls: AtomicU64,
    received_datagrams: AtomicU64,
    received_bytes: AtomicU64,
    tun_writes: AtomicU64,
}

/// A snapshot of one queue's counters: TUN reads and the datagrams and bytes (inner packets)
/// its socket sent; `recvmmsg` calls that returned data and all `recvmmsg` calls (the
/// difference found nothing), the datagrams and bytes its socket received, and its TUN writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub tun_reads: u64,
    pub sent_datagrams: u64,
    pub sent_bytes: u64,
    pub receives: u64,
    pub receive_calls: u64,
    pub received_datagrams: u64,
    pub received_bytes: u64,
    pub tun_writes: u64,
}

impl QueueCounters {
    fn snapshot(&self) -> QueueStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        QueueStats {
            tun_reads: get(&self.tun_reads),
            sent_datagrams: get(&self.sent_datagrams),
            sent_bytes: get(&self.sent_bytes),
            receives: get(&self.receives),
            receive_calls: get(&self.receive_calls),
            received_datagrams: get(&self.received_datagrams),
            received_bytes: get(&self.received_bytes),
            tun_writes: get(&self.tun_writes),
        }
    }
}

fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

impl Shared {
    fn snapshot(&self) -> Arc<PeerTable> {
        self.table
            .read()
            .map(|t| Arc::clone(&t))
            .unwrap_or_default()
    }
}

/// A running encapsulation loop for one node; stopped (threads joined, TUN closed) by
/// [`UdpEncap::stop`] or on drop.
#[derive(Debug)]
pub struct UdpEncap {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    offloads: Offloads,
}

impl UdpEncap {
    /// Creates `flannel0` in `node`'s namespace, configures it and starts the loops.
    pub fn start(node: &NodeTopology, cfg: &UdpEncapConfig) -> Result<Self, TopologyError> {
        let queues = match cfg.queues {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
            n => n,
        };
        let io = |what: &str| {
            let what = format!("{what} in {}", node.netns);
            move |source| TopologyError::Io { what, source }
        };
        let local = SocketAddrV4::new(node.internal_ip, cfg.port);
        let want = if cfg.tun_offload {
            tun::TUN_F_CSUM | tun::TUN_F_TSO4 | tun::TUN_F_TSO6 | tun::TUN_F_USO4 | tun::TUN_F_USO6
        } else {
            0
        };
        let open = move || -> io::Result<(Vec<(File, UdpSocket)>, Offloads)> {
            let mut offloads = Offloads {
                queues,
                ..Offloads::default()
            };
            let mut out = Vec::new();
            for q in 0..queues {
                let file = tun::open_tun_queue(UDP_DEVICE, true)?;
                if q == 0 {
                    // Newest first: USO needs 6.2, TSO and checksum are old.
                    for flags in [want, want & !(tun::TUN_F_USO4 | tun::TUN_F_USO6), 0] {
                        if tun::set_offload(&file, flags).is_ok() {
                            offloads.tun_offload = flags;
                            break;
                        }
                    }
                } else {
                    tun::set_offload(&file, offloads.tun_offload)?;
                }
                let sock = tun::udp_socket(local, true)?;
                if q == 0 {
                    offloads.udp_gso = tun::udp_gso_supported(&sock);
                    offloads.udp_gro = tun::set_udp_gro(&sock, true).is_ok();
                } else if offloads.udp_gro {
                    tun::set_udp_gro(&sock, true)?;
                }
                out.push((file, sock));
            }
            // Every datagram between two nodes has the same outer addresses and ports (8285 to
            // 8285, as flanneld sends), so the kernel's reuseport hash would put all of a peer's
            // traffic on one socket: one receiving thread, and, since the TUN sends a flow out
            // of the queue that last wrote its other direction, one sending thread too. Steer
            // by the inner flow instead (both directions alike), so the flows spread over the
            // queues and each stays on one.
            if let Some((_, first)) = out.first() {
                offloads.steering = tun::steer_by_inner_flow(first, queues as u32).is_ok();
            }
            Ok((out, offloads))
        };
        let opened = match crate::ip::entered(Some(&node.netns)) {
            // A node add-on's daemon runs in its node's namespace already: no setns (which
            // would need CAP_SYS_ADMIN).
            None => open(),
            Some(name) => svcnet_netns::NetNs::open(name)
                .map_err(|e| io("open namespace")(io::Error::other(e)))?
                .run(open)
                .map_err(|e| io("open flannel0")(io::Error::other(e)))?,
        }
        .map_err(io("open flannel0 queues and UDP sockets"))?;
        let (queues_open, offloads) = opened;
        // The device exists while the queues are open: give it its address, MTU and route.
        device_steps(node, cfg.cluster_cidr, cfg.mtu)
            .iter()
            .try_for_each(Step::run)?;
        let shared = Arc::new(Shared {
            table: RwLock::new(Arc::new(PeerTable::default())),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            tids: Mutex::new(Vec::new()),
            counters: (0..queues_open.len())
                .map(|_| QueueCounters::default())
                .collect(),
        });
        let mut threads = Vec::new();
        for (q, (file, sock)) in queues_open.into_iter().enumerate() {
            let (file, sock) = (Arc::new(file), Arc::new(sock));
            for dir in ["tx", "rx"] {
                let (file, sock, shared) = (file.clone(), sock.clone(), shared.clone());
                let name = format!("flannel0-{dir}{q}");
                let spawned = std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        record_tid(&shared, name);
                        let counters = &shared.counters[q];
                        let result = if dir == "tx" {
                            tx_loop(&file, &sock, &shared, counters, offloads)
                        } else {
                            rx_loop(&file, &sock, &shared, counters)
                        };
                        if let Err(e) = result {
                            tracing::warn!("udp backend {dir} loop: {e}");
                        }
                    });
                threads.push(spawned.map_err(io("spawn the UDP loop"))?);
            }
        }
        tracing::info!(node = %node.name, ?offloads, "udp backend: flannel0 up, port {}", cfg.port);
        Ok(Self {
            shared,
            threads,
            offloads,
        })
    }

    /// Replaces the peer table (the loops pick it up at their next packet).
    pub fn set_peers(&self, table: PeerTable) {
        if let Ok(mut t) = self.shared.table.write() {
            *t = Arc::new(table);
        }
        self.shared.generation.fetch_add(1, Ordering::Release);
    }

    pub fn peers(&self) -> Arc<PeerTable> {
        self.shared.snapshot()
    }

    pub fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// CPU seconds (user + system) the loop's threads used so far.
    pub fn cpu_seconds(&self) -> f64 {
        self.thread_cpu_seconds().iter().map(|(_, s)| s).sum()
    }

    /// Each loop thread's name (`flannel0-tx0`, `flannel0-rx0`, ...) and the CPU seconds it
    /// used so far.
    pub fn thread_cpu_seconds(&self) -> Vec<(String, f64)> {
        let tids = self
            .shared
            .tids
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default();
        tids.into_iter()
            .map(|(tid, name)| (name, thread_cpu_seconds(tid)))
            .collect()
    }

    /// Each queue's counters so far (index = queue).
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        self.shared
            .counters
            .iter()
            .map(QueueCounters::snapshot)
            .collect()
    }

    /// Stops the loops and closes the TUN (which removes `flannel0` and its route).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for UdpEncap {
    fn drop(&mut self) {
        self.halt();
    }
}

fn record_tid(shared: &Shared, name: String) {
    // `/proc/thread-self` links to `<pid>/task/<tid>`.
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok());
    if let (Some(tid), Ok(mut tids)) = (tid, shared.tids.lock()) {
        tids.push((tid, name));
    }
}

fn thread_cpu_seconds(tid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    // USER_HZ is 100 on Linux.
    f.iter().sum::<u64>() as f64 / 100.0
}

/// Keeps a thread's view of the table fresh without taking the lock per packet.
struct TableView<'a> {
    shared: &'a Shared,
    seen: u64,
    table: Arc<PeerTable>,
}

impl<'a> TableView<'a> {
    fn new(shared: &'a Shared) -> Self {
        Self {
            shared,
            seen: shared.generation.load(Ordering::Acquire),
            table: shared.snapshot(),
        }
    }

    fn get(&mut self) -> &PeerTable {
        let now = self.shared.generation.load(Ordering::Acquire);
        if now != self.seen {
            self.seen = now;
            self.table = self.shared.snapshot();
        }
        &self.table
    }
}

/// Datagrams waiting to go to one peer: back to back, all `segment` long but the last, sent
/// with one `UDP_SEGMENT` sendmsg (or `sendmmsg` without UDP GSO).
struct Pending {
    buf: Vec<u8>,
    segment: usize,
    to: Option<SocketAddrV4>,
    closed: bool,
    count: usize,
}

/// `UDP_SEGMENT` limits: at most 64 segments and one IPv4 datagram's worth of payload.
const GSO_MAX_SEGMENTS: usize = 64;
const GSO_MAX_BYTES: usize = 65000;

impl Pending {
    fn fits(&self, len: usize, to: SocketAddrV4) -> bool {
        self.count == 0
            || (self.to == Some(to)
                && !self.closed
                && len <= self.segment
                && self.count < GSO_MAX_SEGMENTS
                && self.buf.len() + len <= GSO_MAX_BYTES)
    }

    fn add(&mut self, pkt: &[u8], to: SocketAddrV4) {
        if self.count == 0 {
            self.segment = pkt.len();
            self.to = Some(to);
            self.closed = false;
        } else if pkt.len() < self.segment {
            self.closed = true;
        }
        self.buf.extend_from_slice(pkt);
        self.count += 1;
    }

    fn flush(&mut self, out: &mut Sender<'_>) {
        if let (Some(to), true) = (self.to, self.count > 0) {
            out.send(&self.buf, self.segment, to);
        }
        self.buf.clear();
        self.count = 0;
        self.to = None;
    }
}

use tun::SendHeaders;

/// One queue's socket and what sending on it needs.
struct Sender<'a> {
    sock: &'a UdpSocket,
    gso: bool,
    headers: SendHeaders,
    counters: &'a QueueCounters,
}

impl Sender<'_> {
    /// Sends `buf` to `to` as datagrams of `segment` bytes (the last may be shorter).
    fn send(&mut self, buf: &[u8], segment: usize, to: SocketAddrV4) {
        let (sock, headers) = (self.sock, &mut self.headers);
        let result = if self.gso && buf.len() > segment {
            let per = (GSO_MAX_BYTES / segment).clamp(1, GSO_MAX_SEGMENTS) * segment;
            buf.chunks(per)
                .try_for_each(|c| tun::send_gso(sock, c, segment as u16, to).map(drop))
        } else {
            buf.chunks(segment * 32).try_for_each(|group| {
                let msgs: Vec<(&[u8], SocketAddrV4)> =
                    group.chunks(segment).map(|d| (d, to)).collect();
                tun::send_batch(sock, headers, &msgs).map(drop)
            })
        };
        match result {
            Ok(()) => {
                add(&self.counters.sent_datagrams, buf.len().div_ceil(segment));
                add(&self.counters.sent_bytes, buf.len());
            }
            // As flanneld: a failed send drops the packets (TCP retransmits).
            Err(e) => tracing::debug!(%to, "udp backend send: {e}"),
        }
    }
}

/// TUN → peers: read a packet (or a GSO super-packet), find its peer, send it.
fn tx_loop(
    tun: &File,
    sock: &UdpSocket,
    shared: &Shared,
    counters: &QueueCounters,
    offloads: Offloads,
) -> io::Result<()> {
    let mut table = TableView::new(shared);
    let mut rbuf = vec![0u8; VNET_HDR_LEN + 65536];
    let mut segments = Vec::with_capacity(96 * 1024);
    let mut pending = Pending {
        buf: Vec::with_capacity(GSO_MAX_BYTES + 2048),
        segment: 0,
        to: None,
        closed: false,
        count: 0,
    };
    let mut out = Sender {
        sock,
        gso: offloads.udp_gso,
        headers: tun::send_headers(32),
        counters,
    };
    let mut reader = tun;
    loop {
        let n = match reader.read(&mut rbuf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                pending.flush(&mut out);
                if shared.stop.load(Ordering::Acquire) {
                    return Ok(());
                }
                tun::wait_readable(tun, 100)?;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        add(&counters.tun_reads, 1);
        let Some(hdr) = VnetHdr::parse(&rbuf[..n]) else {
            continue;
        };
        let pkt = &mut rbuf[VNET_HDR_LEN..n];
        let Some(to) = packet::ipv4_dst(pkt).and_then(|d| table.get().lookup(d)) else {
            // No peer for it (flanneld answers net-unreachable; svcnet drops).
            continue;
        };
        if hdr.gso_type != GSO_NONE {
            pending.flush(&mut out);
            segments.clear();
            if let Some(seg) = packet::segment(pkt, &hdr, &mut segments) {
                out.send(&segments, seg, to);
            }
            continue;
        }
        if hdr.flags & F_NEEDS_CSUM != 0 {
            packet::complete_checksum(pkt, hdr.csum_start.into(), hdr.csum_offset.into());
        }
        if !pending.fits(pkt.len(), to) {
            pending.flush(&mut out);
        }
        pending.add(pkt, to);
    }
}

/// Peers → TUN: receive batches, split GRO buffers into the inner packets, coalesce TCP and
/// write to the TUN. Datagrams from addresses that are not peers are dropped.
fn rx_loop(
    tun: &File,
    sock: &UdpSocket,
    shared: &Shared,
    counters: &QueueCounters,
) -> io::Result<()> {
    let mut table = TableView::new(shared);
    let mut batch = tun::RecvBatch::new(8, 65536);
    let mut got = Vec::new();
    let mut coalescer = Coalescer::default();
    let mut writer = tun;
    let mut write = |buf: &mut [u8]| {
        add(&counters.tun_writes, 1);
        if let Err(e) = writer.write(buf) {
            tracing::debug!("udp backend: write to flannel0: {e}");
        }
    };
    // A batch shorter than asked for emptied the socket: the next receive waits for readiness
    // first instead of making a `recvmmsg` that finds nothing (one system call fewer per
    // wake-up; `poll` is level-triggered, so a datagram that came meanwhile is not missed).
    let mut empty = true;
    loop {
        if empty {
            if shared.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            if !tun::wait_readable(sock, 100)? {
                continue;
            }
        }
        add(&counters.receive_calls, 1);
        match batch.recv(sock, &mut got) {
            Ok(n) => empty = n < batch.bufs.len(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                empty = true;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::debug!("udp backend receive: {e}");
                continue;
            }
        }
        add(&counters.receives, 1);
        let table = table.get();
        for (msg, buf) in got.iter().zip(&batch.bufs) {
            let known = msg.from.is_some_and(|f| table.knows(*f.ip()));
            if !known || msg.segment == 0 {
                continue;
            }
            add(&counters.received_datagrams, msg.len.div_ceil(msg.segment));
            add(&counters.received_bytes, msg.len);
            for dgram in buf[..msg.len].chunks(msg.segment) {
                coalescer.push(dgram, &mut write);
            }
        }
        coalescer.flush(&mut write);
    }
}
