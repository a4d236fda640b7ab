//! Relaying an established TCP connection in both directions, with half-close: when one side
//! ends its stream, the other side's write half is shut down, and the opposite direction keeps
//! running until it ends too.
//!
//! On Linux the bytes never enter the process: each direction moves them with `splice(2)`
//! from the source socket into a pipe and from the pipe into the destination socket (as
//! HAProxy does), so there is no user-space copy and no per-connection buffer. Pipes come from
//! a per-thread pool and go back to it when the connection ends with the pipe empty, so a
//! short connection costs no `pipe2`/`close` either. Elsewhere (macOS, for the unprivileged
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
mod imp {
    use std::cell::RefCell;
    use std::io;
    use std::net::Shutdown;
    use std::os::fd::OwnedFd;
    use std::sync::atomic::{AtomicU64, Ordering};

    use nix::fcntl::{OFlag, SpliceFFlags, splice};
    use socket2::SockRef;
    use tokio::io::Interest;
    use tokio::net::TcpStream;

    use super::Moved;

    /// The most one `splice` is asked to move; the pipe's capacity is the real bound.
    const CHUNK: usize = 1 << 20;
    /// Pipes kept per worker thread for later connections.
    const POOL_MAX: usize = 256;

    struct Pipe {
        read: OwnedFd,
        write: OwnedFd,
    }

    thread_local! {
        static POOL: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
    }

    fn take() -> io::Result<Pipe> {
        if let Some(p) = POOL.with_borrow_mut(Vec::pop) {
            return Ok(p);
        }
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        Ok(Pipe { read, write })
    }

    /// Returns an empty pipe to the pool (a pipe that still holds bytes is closed instead).
    fn give(p: Pipe) {
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
        tokio::try_join!(
            one_way(client, upstream, &moved.to_endpoint),
            one_way(upstream, client, &moved.to_client),
        )?;
        Ok(())
    }

    fn flags() -> SpliceFFlags {
        SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
    }

    /// One direction: `from` → pipe → `to`, until `from` ends (then `to`'s write half is shut
    /// down) or an error.
    async fn one_way(from: &TcpStream, to: &TcpStream, count: &AtomicU64) -> io::Result<()> {
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
                    // `from` sent FIN: pass the half-close on. `to` may already be gone.
                    let _ = SockRef::from(to).shutdown(Shutdown::Write);
                    return Ok(());
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
