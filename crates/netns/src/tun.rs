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

/// Waits up to `timeout_ms` for `fd` to be readable; `Ok(false)` on timeout.
pub fn wait_readable(fd: &impl AsFd, timeout_ms: u16) -> io::Result<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(timeout_ms)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

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
