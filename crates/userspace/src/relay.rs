//! Relaying an established TCP connection in both directions, with half-close: when one side
//! ends its stream, the other side's write half is shut down, and the opposite direction keeps
//! running until it ends too.
//!
//! On Linux, small messages (requests, short responses) are copied through one scratch buffer
//! per worker thread: a `read` and a `send` each, with no per-connection buffer. Once a read
//! fills that buffer the direction carries a bulk stream, and from then on its bytes never
//! enter the process: `splice(2)` moves them from the source socket into a pipe and from the
//! pipe into the destination socket (HAProxy's `splice-auto`), with no user-space copy. Pipes
//! come from a per-thread pool and go back to it when the direction ends with its pipe empty. Elsewhere (macOS, for the unprivileged
//! mode), or with `Config::splice` off, tokio's buffered `copy_bidirectional` does the job.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::TcpStream;

/// Bytes moved by a relay so far: client → endpoint and endpoint → client.
#[derive(Debug, Default)]
pub(crate) struct Moved {
    pub(crate) to_endpoint: AtomicU64,
    pub(crate) to_client: AtomicU64,
}

/// Per-direction buffer of the copying path.
const BUFFER: usize = 64 * 1024;

/// Relays until both directions have ended (or either fails). With `splice` (Linux) the byte
/// counts in `moved` are kept up to date as data flows, so they are right even when the relay
/// is cancelled; the copying path adds them when it ends.
pub(crate) async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    moved: &Moved,
    splice: bool,
) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if splice {
        return imp::relay(client, upstream, moved).await;
    }
    let _ = splice;
    let (a, b) = tokio::io::copy_bidirectional_with_sizes(client, upstream, BUFFER, BUFFER).await?;
    moved.to_endpoint.fetch_add(a, Ordering::Relaxed);
    moved.to_client.fetch_add(b, Ordering::Relaxed);
    Ok(())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) use imp::{Pipe, SCRATCH_SIZE, give as give_pipe, take as take_pipe};

#[cfg(any(target_os = "linux", target_os = "android"))]
mod imp {
    use std::cell::RefCell;
    use std::io;
    use std::net::Shutdown;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use nix::fcntl::{OFlag, SpliceFFlags, splice};
    use nix::sys::socket::MsgFlags;
    use socket2::SockRef;
    use tokio::io::Interest;
    use tokio::net::TcpStream;

    use super::Moved;

    /// The most one `splice` is asked to move; the pipe's capacity is the real bound.
    const CHUNK: usize = 1 << 20;
    /// Pipes kept per worker thread for later connections.
    const POOL_MAX: usize = 256;

    /// A pipe for `splice`, from the calling thread's pool.
    pub(crate) struct Pipe {
        pub(crate) read: OwnedFd,
        pub(crate) write: OwnedFd,
    }

    /// Scratch buffer per worker thread for small messages; a read that fills it switches the
    /// direction to splicing.
    pub(crate) const SCRATCH_SIZE: usize = 16 * 1024;

    thread_local! {
        static POOL: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
        static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH_SIZE].into_boxed_slice());
    }

    pub(crate) fn take() -> io::Result<Pipe> {
        if let Some(p) = POOL.with_borrow_mut(Vec::pop) {
            return Ok(p);
        }
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        Ok(Pipe { read, write })
    }

    /// Returns an empty pipe to the pool (a pipe that still holds bytes is closed instead).
    pub(crate) fn give(p: Pipe) {
        POOL.with_borrow_mut(|v| {
            if v.len() < POOL_MAX {
                v.push(p);
            }
        });
    }

    pub(super) async fn relay(
        client: &mut TcpStream,
        upstream: &mut TcpStream,
        moved: &Moved,
    ) -> io::Result<()> {
        let (client, upstream) = (&*client, &*upstream);
        let (up_done, down_done) = (AtomicBool::new(false), AtomicBool::new(false));
        tokio::try_join!(
            one_way(client, upstream, &moved.to_endpoint, [&up_done, &down_done]),
            one_way(upstream, client, &moved.to_client, [&down_done, &up_done]),
        )?;
        Ok(())
    }

    fn flags() -> SpliceFFlags {
        SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
    }

    fn would_block() -> io::Error {
        io::ErrorKind::WouldBlock.into()
    }

    /// One direction, until `from` ends (then `to`'s write half is shut down, unless the other
    /// direction has ended too and the connection is about to close anyway) or an error.
    /// `done`: this direction's flag, then the other's.
    async fn one_way(
        from: &TcpStream,
        to: &TcpStream,
        count: &AtomicU64,
        done: [&AtomicBool; 2],
    ) -> io::Result<()> {
        let ended = match copy_small(from, to, count).await? {
            Phase::Ended => true,
            Phase::Bulk => splice_bulk(from, to, count).await?,
        };
        if ended {
            done[0].store(true, Ordering::Relaxed);
            if !done[1].load(Ordering::Relaxed) {
                // `from` sent FIN: pass the half-close on. `to` may already be gone.
                let _ = SockRef::from(to).shutdown(Shutdown::Write);
            }
        }
        Ok(())
    }

    enum Phase {
        Ended,
        Bulk,
    }

    /// Small messages (requests, short responses) go through a per-thread scratch buffer:
    /// one `read` and one `send`, and a short read clears the socket's readiness so no
    /// `EAGAIN` read follows it. A read that fills the buffer means a bulk stream: the rest
    /// of this direction is spliced.
    async fn copy_small(from: &TcpStream, to: &TcpStream, count: &AtomicU64) -> io::Result<Phase> {
        loop {
            from.readable().await?;
            let mut n = 0usize;
            let mut full = false;
            let r = from.try_io(Interest::READABLE, || {
                SCRATCH.with_borrow_mut(|buf| {
                    n = nix::unistd::read(from, buf).map_err(io::Error::from)?;
                    full = n == buf.len();
                    // A short read drained the socket: clear its readiness now (a later
                    // arrival raises a new edge) instead of learning it from an EAGAIN read.
                    if n > 0 && !full {
                        Err(would_block())
                    } else {
                        Ok(())
                    }
                })
            });
            match r {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if n == 0 {
                        continue; // really nothing to read
                    }
                }
                Err(e) => return Err(e),
            }
            if n == 0 {
                return Ok(Phase::Ended);
            }
            // Write at once from the scratch buffer (no await in between, so it still holds
            // this read); whatever the socket does not take now is kept in an owned buffer.
            let mut sent = 0usize;
            let w = to.try_io(Interest::WRITABLE, || {
                SCRATCH.with_borrow(|buf| send(to, &buf[..n]))
            });
            match w {
                Ok(m) => sent = m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            count.fetch_add(sent as u64, Ordering::Relaxed);
            if sent < n {
                let rest: Vec<u8> = SCRATCH.with_borrow(|buf| buf[sent..n].to_vec());
                write_all(to, &rest, count).await?;
            }
            if full {
                return Ok(Phase::Bulk);
            }
        }
    }

    fn send(to: &TcpStream, buf: &[u8]) -> io::Result<usize> {
        nix::sys::socket::send(to.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
    }

    async fn write_all(to: &TcpStream, mut rest: &[u8], count: &AtomicU64) -> io::Result<()> {
        while !rest.is_empty() {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || send(to, rest)) {
                Ok(m) => {
                    rest = &rest[m..];
                    count.fetch_add(m as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Bulk: `from` → pipe → `to` with `splice`, until `from` ends (`Ok(true)`).
    async fn splice_bulk(from: &TcpStream, to: &TcpStream, count: &AtomicU64) -> io::Result<bool> {
        let pipe = take()?;
        // Bytes in the pipe not yet written to `to`. The pipe is filled only when empty, so
        // EAGAIN from the filling splice always means "nothing to read" (never "pipe full"),
        // and the socket's readiness may be cleared on it.
        let mut held = 0usize;
        let result = async {
            loop {
                let n = loop {
                    from.readable().await?;
                    match from.try_io(Interest::READABLE, || {
                        splice(from, None, &pipe.write, None, CHUNK, flags())
                            .map_err(io::Error::from)
                    }) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                };
                if n == 0 {
                    return Ok(true);
                }
                held = n;
                while held > 0 {
                    to.writable().await?;
                    match to.try_io(Interest::WRITABLE, || {
                        splice(&pipe.read, None, to, None, held, flags()).map_err(io::Error::from)
                    }) {
                        Ok(m) => {
                            held -= m;
                            count.fetch_add(m as u64, Ordering::Relaxed);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        .await;
        if held == 0 {
            give(pipe);
        }
        result
    }
}
