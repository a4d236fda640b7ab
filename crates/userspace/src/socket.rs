//! Sockets in the right network namespace. A socket keeps the namespace it was created in for
//! its whole life, whichever thread later uses it, so listeners and upstream sockets are
//! created on a thread that entered the node's namespace (through svcnet-netns) and are then
//! handed to tokio; tokio's own worker threads never switch namespaces. The data path's
//! worker threads (ours, not tokio's) enter the namespace once at start ([`enter`]), so
//! upstream sockets are made right where they are used.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{Domain, Protocol as SockProtocol, Socket, Type};
use svcnet_netns::NetNs;
use tokio::net::{TcpSocket, TcpStream, UdpSocket};
use tokio::sync::oneshot;

use crate::admission::{UpstreamSource, bind_source};
use crate::error::UserspaceError;

type Request = (Domain, Type, oneshot::Sender<io::Result<Socket>>);

thread_local! {
    /// Set on a thread that entered the factory's namespace for good (a data-path worker).
    static IN_NETNS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Moves the calling thread into `ns` for the rest of its life; sockets it makes are born there.
pub(crate) fn enter(ns: &NetNs) -> io::Result<()> {
    ns.enter().map_err(io::Error::other)?;
    IN_NETNS.set(true);
    Ok(())
}

/// Starts a data-path thread named `name`: it enters `netns` (when given) for good, builds its
/// state with `init`, hands the caller the first part, then runs `run` with the second. Returns
/// once `init` is done, with its error if it (or entering the namespace) failed.
pub(crate) fn spawn_in<T: Send + 'static, S: 'static>(
    name: String,
    netns: Option<&str>,
    init: impl FnOnce() -> io::Result<(T, S)> + Send + 'static,
    run: impl FnOnce(S) + Send + 'static,
) -> io::Result<(T, std::thread::JoinHandle<()>)> {
    let ns = netns
        .map(NetNs::open)
        .transpose()
        .map_err(io::Error::other)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let died = io::Error::other(format!("thread {name} died at start"));
    let thread = std::thread::Builder::new().name(name).spawn(move || {
        match ns.map_or(Ok(()), |ns| enter(&ns)).and_then(|()| init()) {
            Ok((t, s)) => {
                let _ = tx.send(Ok(t));
                run(s);
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    })?;
    let t = rx.recv().map_err(|_| died)??;
    Ok((t, thread))
}

fn here() -> bool {
    IN_NETNS.get()
}

/// Unconnected TCP sockets made ahead of time inside the namespace, so that opening an
/// upstream connection does not wait for a round trip to the helper thread.
#[derive(Debug, Default)]
struct Pool {
    v4: Mutex<Vec<Socket>>,
    v6: Mutex<Vec<Socket>>,
}

/// Sockets kept ready per family; the helper refills when a pool falls below half.
const POOL: usize = 64;

impl Pool {
    fn of(&self, domain: Domain) -> &Mutex<Vec<Socket>> {
        if domain == Domain::IPV6 {
            &self.v6
        } else {
            &self.v4
        }
    }

    fn fill(&self) {
        for domain in [Domain::IPV4, Domain::IPV6] {
            let Ok(mut v) = self.of(domain).lock() else {
                continue;
            };
            while v.len() < POOL {
                match Socket::new(domain, Type::STREAM, None) {
                    Ok(s) => v.push(s),
                    Err(_) => break,
                }
            }
        }
    }
}

enum Work {
    Make(Request),
    Refill,
}

/// Creates sockets in the current namespace, or in a named one through a helper thread that
/// lives inside it (TCP sockets come from a pool it keeps filled; others cost one channel
/// round trip instead of one thread per socket).
#[derive(Debug)]
pub struct SocketFactory {
    netns: Option<String>,
    helper: Option<std::sync::mpsc::Sender<Work>>,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Make(_) => "Make",
            Self::Refill => "Refill",
        })
    }
}

impl SocketFactory {
    /// `netns`: the named namespace (`/run/netns/<name>`) to create every socket in.
    pub fn new(netns: Option<&str>) -> Result<Self, UserspaceError> {
        let pool = Arc::new(Pool::default());
        let Some(name) = netns else {
            return Ok(Self {
                netns: None,
                helper: None,
                pool,
            });
        };
        let ns = NetNs::open(name)?;
        let (tx, rx) = std::sync::mpsc::channel::<Work>();
        let filler = pool.clone();
        // The thread ends when the factory (the only sender) is dropped.
        ns.spawn(move || {
            filler.fill();
            while let Ok(work) = rx.recv() {
                match work {
                    Work::Make((domain, ty, reply)) => {
                        let _ = reply.send(Socket::new(domain, ty, None));
                    }
                    Work::Refill => filler.fill(),
                }
            }
        })?;
        Ok(Self {
            netns: Some(name.to_string()),
            helper: Some(tx),
            pool,
        })
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    async fn socket(&self, domain: Domain, ty: Type) -> io::Result<Socket> {
        let Some(helper) = self.helper.as_ref().filter(|_| !here()) else {
            return Socket::new(domain, ty, None);
        };
        if ty == Type::STREAM
            && let Ok(mut v) = self.pool.of(domain).lock()
            && let Some(s) = v.pop()
        {
            if v.len() == POOL / 2 {
                let _ = helper.send(Work::Refill);
            }
            return Ok(s);
        }
        let (tx, rx) = oneshot::channel();
        let gone = || io::Error::other("the network namespace socket helper stopped");
        helper
            .send(Work::Make((domain, ty, tx)))
            .map_err(|_| gone())?;
        let _ = helper.send(Work::Refill);
        rx.await.map_err(|_| gone())?
    }

    /// Connects to an endpoint within `timeout`, with `TCP_NODELAY` (set before connecting).
    pub async fn connect_tcp(
        &self,
        addr: SocketAddr,
        source: Option<UpstreamSource>,
        timeout: Duration,
    ) -> io::Result<TcpStream> {
        let connect = async {
            let s = if self.helper.is_none() || here() {
                // Non-blocking from birth (SOCK_NONBLOCK): no fcntl on this path.
                if addr.is_ipv4() {
                    TcpSocket::new_v4()?
                } else {
                    TcpSocket::new_v6()?
                }
            } else {
                let s = self.socket(Domain::for_address(addr), Type::STREAM).await?;
                s.set_nonblocking(true)?;
                TcpSocket::from_std_stream(s.into())
            };
            s.set_nodelay(true)?;
            bind_source(&s, source, addr)?;
            s.connect(addr).await
        };
        tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
    }

    /// A UDP socket connected to an endpoint (one per client flow).
    pub async fn connect_udp(
        &self,
        addr: SocketAddr,
        source: Option<UpstreamSource>,
    ) -> io::Result<UdpSocket> {
        let s = self.socket(Domain::for_address(addr), Type::DGRAM).await?;
        s.set_nonblocking(true)?;
        let from = UpstreamSource::for_endpoint(source, addr).unwrap_or(if addr.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        });
        s.bind(&SocketAddr::new(from, 0).into())?;
        let sock = UdpSocket::from_std(s.into())?;
        sock.connect(addr).await?;
        Ok(sock)
    }

    fn in_ns<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, UserspaceError> {
        match &self.netns {
            None => Ok(f()),
            Some(name) => Ok(NetNs::open(name)?.run(f)?),
        }
    }

    /// Binds `count` TCP listeners on one address with `SO_REUSEPORT` (inside the namespace),
    /// so each worker accepts its own share; port 0 picks one port for all of them. Accepted
    /// connections inherit the listener's `TCP_NODELAY` (Linux), so it is set once here.
    pub fn listen_tcp(
        &self,
        addr: SocketAddr,
        count: usize,
    ) -> Result<Vec<std::net::TcpListener>, UserspaceError> {
        self.in_ns(|| -> io::Result<Vec<std::net::TcpListener>> {
            let mut out: Vec<std::net::TcpListener> = Vec::new();
            let mut at = addr;
            for _ in 0..count.max(1) {
                let s = Socket::new(
                    Domain::for_address(addr),
                    Type::STREAM,
                    Some(SockProtocol::TCP),
                )?;
                if addr.is_ipv6() {
                    s.set_only_v6(true)?;
                }
                s.set_reuse_address(true)?;
                s.set_reuse_port(true)?;
                s.set_tcp_nodelay(true)?;
                s.bind(&at.into())?;
                s.listen(1024)?;
                s.set_nonblocking(true)?;
                let l: std::net::TcpListener = s.into();
                at = l.local_addr()?;
                out.push(l);
            }
            Ok(out)
        })?
        .map_err(|e| UserspaceError::bind(addr, "TCP", e))
    }

    /// Binds a UDP socket (inside the namespace); the worker that serves it registers it.
    pub fn bind_udp(&self, addr: SocketAddr) -> Result<std::net::UdpSocket, UserspaceError> {
        self.in_ns(|| -> io::Result<std::net::UdpSocket> {
            let s = Socket::new(
                Domain::for_address(addr),
                Type::DGRAM,
                Some(SockProtocol::UDP),
            )?;
            if addr.is_ipv6() {
                s.set_only_v6(true)?;
            }
            s.bind(&addr.into())?;
            s.set_nonblocking(true)?;
            Ok(s.into())
        })?
        .map_err(|e| UserspaceError::bind(addr, "UDP", e))
    }
}

/// The destination the client asked for before the kernel's redirect (`SO_ORIGINAL_DST`,
/// IPv6 `IP6T_SO_ORIGINAL_DST`); `None` when the connection was not redirected.
#[cfg(target_os = "linux")]
pub fn original_dst(stream: &impl std::os::fd::AsFd) -> Option<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    match socket2::SockRef::from(stream)
        .local_addr()
        .ok()?
        .as_socket()?
    {
        SocketAddr::V4(_) => {
            let sin = getsockopt(stream, sockopt::OriginalDst).ok()?;
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        SocketAddr::V6(_) => {
            let sin6 = getsockopt(stream, sockopt::Ip6tOriginalDst).ok()?;
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                0,
                0,
            )))
        }
    }
}

/// Redirects are Linux's (privileged mode); elsewhere no connection was redirected.
#[cfg(not(target_os = "linux"))]
pub fn original_dst(_stream: &impl std::os::fd::AsFd) -> Option<SocketAddr> {
    None
}
