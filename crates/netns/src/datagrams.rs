//! Batches of UDP datagrams on any non-blocking socket: `recvmmsg` and `sendmmsg` over libc,
//! kept here because this is the crate that does syscalls. Nothing here knows what the
//! datagrams mean; cluster DNS's UDP loop takes a batch of questions with [`recv_many`] and
//! sends their answers with one [`send_many`].
//!
//! nix's wrappers are not used: its `sendmmsg` result says how many datagrams left only when
//! iterated, and iterating reads address slots that `sendmmsg` never writes; its headers hold
//! raw pointers, so they cannot be kept in a `Send` task. Here the headers live on the stack of
//! one call (at most [`MAX_BATCH`] datagrams, about 13 KiB) and the count is the kernel's.

use std::io;
use std::mem::MaybeUninit;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::libc;
use nix::sys::socket::{SockaddrLike, SockaddrStorage};

/// Most datagrams one call takes or sends (more are left for the next call).
pub const MAX_BATCH: usize = 64;

/// Takes the datagrams queued on `fd` without waiting, up to one per buffer of `bufs` (and
/// [`MAX_BATCH`]): for each, its length (at most its buffer's; a longer datagram is cut) and
/// its sender when it is an IPv4 or IPv6 address, appended to `out` (cleared first). Returns
/// how many; `WouldBlock` when nothing is queued.
pub fn recv_many<B: AsMut<[u8]>>(
    fd: BorrowedFd<'_>,
    bufs: &mut [B],
    out: &mut Vec<(usize, Option<SocketAddr>)>,
) -> io::Result<usize> {
    out.clear();
    let n = bufs.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_BATCH];
    let mut names = [const { MaybeUninit::<libc::sockaddr_storage>::uninit() }; MAX_BATCH];
    let mut headers = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    for i in 0..n {
        let buf = bufs[i].as_mut();
        iovs[i].write(libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        });
        headers[i].write(header(
            names[i].as_mut_ptr().cast(),
            size_of::<libc::sockaddr_storage>(),
            iovs[i].as_mut_ptr(),
        ));
    }
    // SAFETY: the first `n` headers are initialised; each points at its own iovec (a live,
    // exclusively borrowed buffer of `iov_len` bytes) and its own name slot of `msg_namelen`
    // bytes, all of which outlive the call; the kernel writes at most that much into each.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            headers.as_mut_ptr().cast(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    let received = usize::try_from(rc).map_err(|_| io::Error::last_os_error())?;
    for i in 0..received.min(n) {
        // SAFETY: the kernel filled the first `received` headers (and initialised them before).
        #[allow(unsafe_code)]
        let h = unsafe { headers[i].assume_init_ref() };
        let len = (h.msg_len as usize).min(bufs[i].as_mut().len());
        // SAFETY: the kernel wrote `msg_namelen` bytes of a socket address into this slot,
        // which is large enough for any; `from_raw` checks the family against the length.
        #[allow(unsafe_code)]
        let name = unsafe {
            SockaddrStorage::from_raw(names[i].as_ptr().cast(), Some(h.msg_hdr.msg_namelen))
        };
        out.push((len, name.as_ref().and_then(socket_addr)));
    }
    Ok(out.len())
}

/// Sends each `(datagram, destination)` of `msgs` (up to [`MAX_BATCH`]) with one `sendmmsg`,
/// without waiting. Returns how many left, from the first: fewer than asked when the socket's
/// buffer filled up or a later datagram failed (send the rest again to learn why); an error,
/// `WouldBlock` among them, only when the first did not leave.
pub fn send_many<B: AsRef<[u8]>>(
    fd: BorrowedFd<'_>,
    msgs: &[(B, SocketAddr)],
) -> io::Result<usize> {
    let n = msgs.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_BATCH];
    let mut names = [const { MaybeUninit::<SockaddrStorage>::uninit() }; MAX_BATCH];
    let mut headers = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    for (i, (bytes, to)) in msgs[..n].iter().enumerate() {
        let bytes = bytes.as_ref();
        iovs[i].write(libc::iovec {
            // The kernel only reads through it.
            iov_base: bytes.as_ptr().cast_mut().cast(),
            iov_len: bytes.len(),
        });
        let name = names[i].write(SockaddrStorage::from(*to));
        let (name, name_len) = (name.as_ptr().cast_mut().cast(), name.len());
        headers[i].write(header(name, name_len as usize, iovs[i].as_mut_ptr()));
    }
    // SAFETY: the first `n` headers are initialised; each points at its own iovec (a live
    // datagram of `iov_len` bytes, only read) and its own destination of `msg_namelen` bytes,
    // all of which outlive the call.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            headers.as_mut_ptr().cast(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(rc).map_err(|_| io::Error::last_os_error())
}

/// One message header: a name slot, one iovec, no control data.
fn header(name: *mut libc::c_void, name_len: usize, iov: *mut libc::iovec) -> libc::mmsghdr {
    // SAFETY: `msghdr` is plain data for which all zeroes is valid (null pointers, zero
    // lengths); the fields that matter are set below.
    #[allow(unsafe_code)]
    let mut msg_hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    msg_hdr.msg_name = name;
    msg_hdr.msg_namelen = name_len as libc::socklen_t;
    msg_hdr.msg_iov = iov;
    msg_hdr.msg_iovlen = 1;
    libc::mmsghdr {
        msg_hdr,
        msg_len: 0,
    }
}

fn socket_addr(address: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = address.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    address
        .as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    use super::*;

    fn pair(addr: &str) -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind(addr).unwrap();
        let b = UdpSocket::bind(addr).unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    /// Datagrams of several sizes and two destinations leave in one call and arrive whole, in
    /// order, with their sender; an empty socket answers `WouldBlock`.
    #[test]
    fn a_batch_goes_and_comes_back() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            if UdpSocket::bind(addr).is_err() {
                continue; // no IPv6 loopback here
            }
            let (a, b) = pair(addr);
            let c = UdpSocket::bind(addr).unwrap();
            let (to_b, to_c) = (b.local_addr().unwrap(), c.local_addr().unwrap());
            let msgs: Vec<(Vec<u8>, SocketAddr)> = (0..70u8)
                .map(|i| {
                    (
                        vec![i; 1 + usize::from(i) * 7],
                        if i % 2 == 0 { to_b } else { to_c },
                    )
                })
                .collect();
            let mut sent = 0;
            while sent < msgs.len() {
                sent += send_many(a.as_fd(), &msgs[sent..]).unwrap();
            }
            let mut bufs = vec![[0u8; 600]; 40];
            let mut got = Vec::new();
            let mut seen = Vec::new();
            while seen.len() < 35 {
                match recv_many(b.as_fd(), &mut bufs, &mut got) {
                    Ok(n) => {
                        for (buf, &(len, from)) in bufs.iter().zip(&got[..n]) {
                            assert_eq!(from, Some(a.local_addr().unwrap()));
                            seen.push(buf[..len].to_vec());
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            }
            let expected: Vec<Vec<u8>> = msgs
                .iter()
                .filter(|(_, to)| *to == to_b)
                .map(|(m, _)| m.clone())
                .collect();
            assert_eq!(seen, expected);
            let err = recv_many(b.as_fd(), &mut bufs, &mut got).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
            assert!(got.is_empty());
        }
    }

    /// A datagram longer than its buffer is cut to the buffer.
    #[test]
    fn a_long_datagram_is_cut() {
        let (a, b) = pair("127.0.0.1:0");
        let to = b.local_addr().unwrap();
        assert_eq!(send_many(a.as_fd(), &[(vec![7u8; 100], to)]).unwrap(), 1);
        let mut bufs = [[0u8; 10]; 1];
        let mut got = Vec::new();
        let n = loop {
            match recv_many(b.as_fd(), &mut bufs, &mut got) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                other => break other.unwrap(),
            }
        };
        assert_eq!(n, 1);
        assert_eq!(got[0].0, 10);
    }
}
