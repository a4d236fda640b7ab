//! TUN queues and batched UDP sockets: the system calls of flannel's UDP backend, kept here
//! because this is the crate that does syscalls. Nothing here knows about pods or peers: the
//! agent's encapsulation loop decides what to read, where to send and how to split.
//!
//! - [`open_tun_queue`] opens one queue of a multi-queue TUN device (`IFF_TUN | IFF_NO_PI |
//!   IFF_MULTI_QUEUE`, optionally `IFF_VNET_HDR`), creating the device in the calling thread's
//!   network namespace if it does not exist. The device lives as long as one queue is open, so
//!   it dies with the process that holds it.
//! - [`set_offload`] is `TUNSETOFFLOAD`: which offloads the kernel may hand to user space
//!   (checksum, TSO, USO), so a read returns a GSO super-packet with its `virtio_net_hdr`.
//! - [`udp_socket`] binds a non-blocking UDP socket (`SO_REUSEPORT` so each loop has its own);
//!   [`steer_by_inner_flow`] attaches the classic BPF program that picks, among those sockets,
//!   the one for a datagram by the flow of the IPv4 packet it carries ([`inner_flow_index`] is
//!   the same choice in Rust);
//!   [`set_udp_gro`] and [`send_gso`] are `UDP_GRO` and `UDP_SEGMENT`; [`RecvBatch`] is
//!   `recvmmsg` with each message's GRO segment size; [`send_batch`] is `sendmmsg`.
//!
//! Every call reports the kernel's error as an `io::Error`; a caller falls back when an offload
//! is missing (an older kernel answers `EINVAL` or `ENOPROTOOPT`).

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::libc;
use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, MultiHeaders, SockFlag,
    SockProtocol, SockType, SockaddrIn, sockopt,
};

/// Offload flags of `TUNSETOFFLOAD` (`linux/if_tun.h`).
pub const TUN_F_CSUM: u32 = 0x01;
pub const TUN_F_TSO4: u32 = 0x02;
pub const TUN_F_TSO6: u32 = 0x04;
pub const TUN_F_TSO_ECN: u32 = 0x08;
pub const TUN_F_USO4: u32 = 0x20;
pub const TUN_F_USO6: u32 = 0x40;

/// `struct ifreq` as `TUNSETIFF` reads it: the name and the flags (the union's first member),
/// padded to the kernel's 40 bytes.
#[repr(C)]
struct IfReqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens one queue of the multi-queue TUN device `name` (created in the calling thread's
/// network namespace if absent). With `vnet_hdr`, every read and write starts with a
/// 10-byte `virtio_net_hdr`.
pub fn open_tun_queue(name: &str, vnet_hdr: bool) -> io::Result<File> {
    if name.is_empty() || name.len() > 15 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("TUN name {name:?} must be 1-15 bytes"),
        ));
    }
    let file = File::options()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = IfReqFlags {
        name: [0; 16],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_MULTI_QUEUE) as libc::c_short,
        _pad: [0; 22],
    };
    if vnet_hdr {
        req.flags |= libc::IFF_VNET_HDR as libc::c_short;
    }
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`; `req` has its layout and size and
    // lives across the call; the fd is open.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    set_nonblocking(&file)?;
    Ok(file)
}

/// `TUNSETOFFLOAD`: the offloads (`TUN_F_*`) the kernel may leave to the reader of `tun`.
pub fn set_offload(tun: &File, flags: u32) -> io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes its argument by value; the fd is open.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::ioctl(
            tun.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(flags),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = fcntl(fd.as_fd(), FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(())
}

pub use crate::wait_readable;

/// A UDP socket bound to `addr` in the calling thread's network namespace, with `SO_REUSEPORT`
/// when `reuse_port` (so one socket per loop can share the port). Sends block when the socket
/// buffer is full (back-pressure); [`RecvBatch::recv`] never blocks.
pub fn udp_socket(addr: SocketAddrV4, reuse_port: bool) -> io::Result<UdpSocket> {
    let fd: OwnedFd = socket::socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Udp,
    )?;
    if reuse_port {
        socket::setsockopt(&fd, sockopt::ReusePort, &true)?;
    }
    // Room for bursts of 64 KiB GSO/GRO super-datagrams.
    let _ = socket::setsockopt(&fd, sockopt::RcvBuf, &(4 << 20));
    let _ = socket::setsockopt(&fd, sockopt::SndBuf, &(4 << 20));
    socket::bind(fd.as_raw_fd(), &SockaddrIn::from(addr))?;
    Ok(UdpSocket::from(fd))
}

/// `SO_ATTACH_REUSEPORT_CBPF` (`asm-generic/socket.h`; the libc crate has it for Android only).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// The multiplier of [`inner_flow_index`]'s hash (Knuth's golden ratio, 2^32 / phi).
const FLOW_MIX: u32 = 0x9e37_79b1;

/// The `SO_REUSEPORT` socket (`0..sockets`, in bind order) for a datagram whose payload is
/// `inner`, as the program of [`steer_by_inner_flow`] picks it: a hash of the inner IPv4
/// packet's addresses and, for an unfragmented TCP or UDP packet, its ports, symmetric (sums,
/// so a flow's two directions get the same socket). Fibonacci hashing (the top bits of the sum
/// times 2^32/phi, scaled to `sockets`) spreads neighbouring keys, such as the consecutive
/// source ports of connections to one server, evenly. `None` for a payload that is not IPv4
/// (the kernel then uses its own hash of the outer addresses and ports).
pub fn inner_flow_index(inner: &[u8], sockets: u32) -> Option<u32> {
    if inner.len() < 20 || inner[0] >> 4 != 4 || sockets == 0 {
        return None;
    }
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(inner.get(at..at + 4)?.try_into().ok()?))
    };
    let mut h = word(12)?.wrapping_add(word(16)?);
    let fragment = u16::from_be_bytes([inner[6], inner[7]]) & 0x3fff != 0;
    if !fragment && (inner[9] == 6 || inner[9] == 17) {
        // A load past the end makes the kernel's program return 0: socket 0.
        let Some(ports) = word(usize::from(inner[0] & 0x0f) * 4) else {
            return Some(0);
        };
        h = h.wrapping_add((ports >> 16).wrapping_add(ports) & 0xffff);
    }
    Some(((h.wrapping_mul(FLOW_MIX) >> 16).wrapping_mul(sockets)) >> 16)
}

/// The classic BPF program of [`inner_flow_index`] for a group of `sockets` (run by the kernel
/// with the datagram's UDP payload at offset 0; an answer outside `0..sockets` makes it fall
/// back to its hash).
fn inner_flow_program(sockets: u32) -> Vec<libc::sock_filter> {
    use libc::{
        BPF_A, BPF_ABS, BPF_ADD, BPF_ALU, BPF_AND, BPF_B, BPF_H, BPF_IND, BPF_JA, BPF_JEQ, BPF_JMP,
        BPF_JSET, BPF_K, BPF_LD, BPF_LDX, BPF_MEM, BPF_MISC, BPF_MSH, BPF_MUL, BPF_RET, BPF_RSH,
        BPF_ST, BPF_TAX, BPF_W, BPF_X,
    };
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let s = |code: u32, k: u32| op(code, 0, 0, k);
    vec![
        /* 0 */ s(BPF_LD | BPF_B | BPF_ABS, 0),
        /* 1 */ s(BPF_ALU | BPF_AND | BPF_K, 0xf0),
        /* 2 */ op(BPF_JMP | BPF_JEQ | BPF_K, 0, 26, 0x40), // not IPv4: 29
        /* 3 */ s(BPF_LD | BPF_W | BPF_ABS, 12),
        /* 4 */ s(BPF_MISC | BPF_TAX, 0),
        /* 5 */ s(BPF_LD | BPF_W | BPF_ABS, 16),
        /* 6 */ s(BPF_ALU | BPF_ADD | BPF_X, 0),
        /* 7 */ s(BPF_ST, 0), // M[0] = saddr + daddr
        /* 8 */ s(BPF_LD | BPF_H | BPF_ABS, 6),
        /* 9 */ op(BPF_JMP | BPF_JSET | BPF_K, 13, 0, 0x3fff), // a fragment: 23
        /* 10 */ s(BPF_LD | BPF_B | BPF_ABS, 9),
        /* 11 */ op(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 6), // TCP: 13
        /* 12 */ op(BPF_JMP | BPF_JEQ | BPF_K, 0, 10, 17), // neither TCP nor UDP: 23
        /* 13 */ s(BPF_LDX | BPF_B | BPF_MSH, 0), // X = header length
        /* 14 */ s(BPF_LD | BPF_W | BPF_IND, 0), // A = sport << 16 | dport
        /* 15 */ s(BPF_MISC | BPF_TAX, 0),
        /* 16 */ s(BPF_ALU | BPF_RSH | BPF_K, 16),
        /* 17 */ s(BPF_ALU | BPF_ADD | BPF_X, 0),
        /* 18 */ s(BPF_ALU | BPF_AND | BPF_K, 0xffff), // sport + dport (mod 2^16)
        /* 19 */ s(BPF_MISC | BPF_TAX, 0),
        /* 20 */ s(BPF_LD | BPF_MEM, 0),
        /* 21 */ s(BPF_ALU | BPF_ADD | BPF_X, 0),
        /* 22 */ s(BPF_JMP | BPF_JA, 1), // 24
        /* 23 */ s(BPF_LD | BPF_MEM, 0),
        /* 24 */ s(BPF_ALU | BPF_MUL | BPF_K, FLOW_MIX),
        /* 25 */ s(BPF_ALU | BPF_RSH | BPF_K, 16),
        /* 26 */ s(BPF_ALU | BPF_MUL | BPF_K, sockets),
        /* 27 */ s(BPF_ALU | BPF_RSH | BPF_K, 16),
        /* 28 */ s(BPF_RET | BPF_A, 0),
        /* 29 */ s(BPF_RET | BPF_K, u32::MAX),
    ]
}

/// Attaches to `sock`'s `SO_REUSEPORT` group (of `sockets` sockets, bound in order) the
/// program that sends each datagram to the socket [`inner_flow_index`] names: every datagram
/// of one inner flow, in both directions, to one socket, whatever the outer addresses and
/// ports (flannel sends every datagram from port 8285 to port 8285, so the kernel's own hash of
/// the outer header would put all of a peer's traffic on one socket).
pub fn steer_by_inner_flow(sock: &UdpSocket, sockets: u32) -> io::Result<()> {
    if sockets == 0 || sockets > 1 << 16 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a reuseport group of {sockets} sockets (the program takes 1-65536)"),
        ));
    }
    let mut program = inner_flow_program(sockets);
    let fprog = libc::sock_fprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: SO_ATTACH_REUSEPORT_CBPF reads a `struct sock_fprog` of `optlen` bytes whose
    // `filter` points at `len` instructions; both live across the call (the kernel copies them).
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&raw const fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `UDP_GRO`: the kernel may hand this socket several datagrams of one flow as one buffer (the
/// segment size comes with each message, see [`RecvBatch`]).
pub fn set_udp_gro(sock: &UdpSocket, on: bool) -> io::Result<()> {
    socket::setsockopt(sock, sockopt::UdpGroSegment, &on).map_err(io::Error::from)
}

/// Whether this kernel takes `UDP_SEGMENT` on `sock` (probed by setting the socket default 0).
pub fn udp_gso_supported(sock: &UdpSocket) -> bool {
    socket::setsockopt(sock, sockopt::UdpGsoSegment, &0).is_ok()
}

/// Sends `buf` to `to` as datagrams of `seg_size` bytes each (the last may be shorter): one
/// `sendmsg` with `UDP_SEGMENT`.
pub fn send_gso(
    sock: &UdpSocket,
    buf: &[u8],
    seg_size: u16,
    to: SocketAddrV4,
) -> io::Result<usize> {
    let iov = [IoSlice::new(buf)];
    let cmsg = [ControlMessage::UdpGsoSegments(&seg_size)];
    socket::sendmsg(
        sock.as_raw_fd(),
        &iov,
        &cmsg,
        MsgFlags::empty(),
        Some(&SockaddrIn::from(to)),
    )
    .map_err(io::Error::from)
}

/// `sendmmsg` of `msgs` (each a datagram and its destination); returns how many were sent.
pub fn send_batch(
    sock: &UdpSocket,
    headers: &mut SendHeaders,
    msgs: &[(&[u8], SocketAddrV4)],
) -> io::Result<usize> {
    let slices: Vec<[IoSlice<'_>; 1]> = msgs.iter().map(|(b, _)| [IoSlice::new(b)]).collect();
    let addrs: Vec<Option<SockaddrIn>> = msgs.iter().map(|(_, a)| Some((*a).into())).collect();
    let none: [ControlMessage<'_>; 0] = [];
    let sent = socket::sendmmsg(
        sock.as_raw_fd(),
        headers,
        &slices,
        &addrs,
        none,
        MsgFlags::empty(),
    )?;
    Ok(sent.count())
}

/// Preallocated `sendmmsg` headers.
pub type SendHeaders = MultiHeaders<SockaddrIn>;

/// Headers for [`send_batch`] of up to `n` messages.
pub fn send_headers(n: usize) -> SendHeaders {
    MultiHeaders::preallocate(n, None)
}

/// One received message: its length, its GRO segment size (its length when not coalesced)
/// and its sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    pub segment: usize,
    pub from: Option<SocketAddrV4>,
}

/// `recvmmsg` into a fixed set of buffers, with each message's `UDP_GRO` segment size.
pub struct RecvBatch {
    headers: MultiHeaders<SockaddrIn>,
    pub bufs: Vec<Vec<u8>>,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RecvBatch({} x {})",
            self.bufs.len(),
            self.bufs.first().map_or(0, Vec::len)
        )
    }
}

impl RecvBatch {
    pub fn new(messages: usize, size: usize) -> Self {
        Self {
            headers: MultiHeaders::preallocate(messages, Some(nix::cmsg_space!(libc::c_int))),
            bufs: vec![vec![0; size]; messages],
        }
    }

    /// Receives what is queued without blocking (`WouldBlock` when nothing is).
    pub fn recv(&mut self, sock: &UdpSocket, out: &mut Vec<Received>) -> io::Result<usize> {
        out.clear();
        // Fresh headers per call: the kernel shrinks each header's `msg_controllen` to what it
        // used and nix's `recvmmsg` does not restore it, so a message without a GRO cmsg would
        // leave its slot unable to receive one ever after.
        self.headers =
            MultiHeaders::preallocate(self.bufs.len(), Some(nix::cmsg_space!(libc::c_int)));
        let mut slices: Vec<[IoSliceMut<'_>; 1]> =
            self.bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
        let results = socket::recvmmsg(
            sock.as_raw_fd(),
            &mut self.headers,
            slices.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        )?;
        for msg in results {
            let mut segment = msg.bytes;
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::UdpGroSegments(size) = c
                        && size > 0
                    {
                        segment = size as usize;
                    }
                }
            }
            out.push(Received {
                len: msg.bytes,
                segment,
                from: msg.address.map(|a: SockaddrIn| SocketAddrV4::from(a)),
            });
        }
        Ok(out.len())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    /// An IPv4 header (`ihl` words, protocol `proto`, fragment field `frag`) and 8 bytes of L4
    /// header with the given ports.
    fn inner(
        src: [u8; 4],
        dst: [u8; 4],
        proto: u8,
        ports: (u16, u16),
        frag: u16,
        ihl: u8,
    ) -> Vec<u8> {
        let mut p = vec![0u8; usize::from(ihl) * 4 + 8];
        p[0] = 0x40 | ihl;
        p[6..8].copy_from_slice(&frag.to_be_bytes());
        p[9] = proto;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        let l4 = usize::from(ihl) * 4;
        p[l4..l4 + 2].copy_from_slice(&ports.0.to_be_bytes());
        p[l4 + 2..l4 + 4].copy_from_slice(&ports.1.to_be_bytes());
        p
    }

    fn reversed(p: &[u8]) -> Vec<u8> {
        let mut r = p.to_vec();
        r[12..16].copy_from_slice(&p[16..20]);
        r[16..20].copy_from_slice(&p[12..16]);
        let l4 = usize::from(p[0] & 0x0f) * 4;
        r[l4..l4 + 2].copy_from_slice(&p[l4 + 2..l4 + 4]);
        r[l4 + 2..l4 + 4].copy_from_slice(&p[l4..l4 + 2]);
        r
    }

    /// Both directions of a flow pick one socket; the ports count for TCP and UDP only, and
    /// not in fragments; what is not IPv4 is left to the kernel.
    #[test]
    fn the_inner_flow_index_is_symmetric_and_reads_ports_of_tcp_and_udp_only() {
        let (a, b) = ([10, 244, 1, 2], [10, 244, 2, 3]);
        for proto in [6, 17, 1] {
            for sport in 30000..30064 {
                let p = inner(a, b, proto, (sport, 9101), 0, 5);
                assert_eq!(inner_flow_index(&p, 4), inner_flow_index(&reversed(&p), 4));
            }
        }
        let spread = |proto: u8, frag: u16| -> std::collections::BTreeSet<u32> {
            (30000..30064)
                .filter_map(|sport| inner_flow_index(&inner(a, b, proto, (sport, 80), frag, 5), 4))
                .collect()
        };
        assert_eq!(spread(6, 0).len(), 4, "TCP flows spread over the sockets");
        assert_eq!(spread(17, 0).len(), 4, "UDP flows spread over the sockets");
        assert_eq!(spread(1, 0).len(), 1, "no ports in ICMP");
        assert_eq!(
            spread(6, 0x2000).len(),
            1,
            "no ports in a first fragment (MF)"
        );
        assert_eq!(spread(6, 0x0010).len(), 1, "no ports in a later fragment");
        assert_eq!(inner_flow_index(&[0x60; 40], 4), None, "IPv6");
        assert_eq!(inner_flow_index(&[0x45; 19], 4), None, "short");
        // Options move the ports: the header length is read, the options are not.
        let with_options = inner(a, b, 6, (40000, 80), 0, 6);
        let mut moved = with_options.clone();
        moved[20..24].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(
            inner_flow_index(&with_options, 4),
            inner_flow_index(&moved, 4)
        );
    }

    /// The kernel runs the attached program as [`inner_flow_index`] says: each datagram lands
    /// on the socket the Rust function names (loopback only).
    #[test]
    fn the_kernel_steers_each_datagram_to_the_socket_inner_flow_index_names() {
        let first = udp_socket(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), true).unwrap();
        let port = first.local_addr().unwrap().port();
        let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        let mut group = vec![first];
        for _ in 1..3 {
            group.push(udp_socket(to, true).unwrap());
        }
        steer_by_inner_flow(&group[0], 3).unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, b) = ([10, 244, 1, 2], [10, 244, 2, 3]);
        let mut payloads = Vec::new();
        for sport in 40000..40048 {
            let p = inner(a, b, 6, (sport, 9101), 0, 5);
            payloads.push(reversed(&p));
            payloads.push(p);
        }
        payloads.push(inner(a, b, 17, (53, 5353), 0, 7));
        payloads.push(inner(a, b, 1, (0x0800, 0), 0, 5));
        payloads.push(inner(a, b, 6, (1, 2), 0x2000, 5));
        let take = |sock: &UdpSocket| -> Option<Vec<u8>> {
            let mut batch = RecvBatch::new(1, 256);
            let mut out = Vec::new();
            batch.recv(sock, &mut out).ok()?;
            Some(batch.bufs[0][..out[0].len].to_vec())
        };
        let mut seen = [0usize; 3];
        for (n, p) in payloads.iter().enumerate() {
            // A tag after the headers says which datagram arrived.
            let tag = (n as u32).to_be_bytes();
            let datagram = [p.as_slice(), &tag].concat();
            client.send_to(&datagram, to).unwrap();
            let want = inner_flow_index(p, 3).unwrap() as usize;
            // Loopback delivers within the sending call; wait a little anyway.
            let mut got = None;
            for _ in 0..200 {
                got = take(&group[want]);
                if got.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(
                got.as_deref(),
                Some(datagram.as_slice()),
                "datagram {n} on socket {want}"
            );
            for (i, sock) in group.iter().enumerate() {
                assert_eq!(take(sock), None, "datagram {n}: socket {i} got one too");
            }
            seen[want] += 1;
        }
        assert!(seen.iter().all(|&s| s > 0), "{seen:?}");
    }

    #[test]
    fn an_empty_or_huge_group_is_refused() {
        let sock = udp_socket(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), true).unwrap();
        assert!(steer_by_inner_flow(&sock, 0).is_err());
        assert!(steer_by_inner_flow(&sock, (1 << 16) + 1).is_err());
    }

    /// Connections to one server from consecutive source ports (as `connect` picks them, in
    /// steps of 2) spread evenly: 4 of them over 2 sockets, 2 and 2.
    #[test]
    fn consecutive_source_ports_spread_evenly() {
        let (a, b) = ([10, 244, 1, 2], [10, 244, 2, 3]);
        let mut uneven = 0;
        for first in (32768..60000).step_by(2) {
            let mut per = [0; 2];
            for i in 0..4 {
                let p = inner(a, b, 6, (first + 2 * i, 9101), 0, 5);
                per[inner_flow_index(&p, 2).unwrap() as usize] += 1;
            }
            if per != [2, 2] {
                uneven += 1;
            }
        }
        // Random placement leaves 4 flows uneven 10 times in 16; this, about 1 in 9.
        assert!(
            uneven * 8 < 13616,
            "{uneven} of 13616 runs of 4 ports uneven"
        );
    }
}
