//! The TCP data path on Linux: svcnet's own event loops, one thread each, edge-triggered
//! epoll, as nginx and HAProxy run theirs. tokio's reactor did the same job with more
//! system calls per request: it re-arms nothing, but deregisters every socket before closing
//! it, wakes every worker for each connection on a shared listener (it offers no
//! `EPOLLEXCLUSIVE`), and blocks in `epoll_wait` about twice per keep-alive request where
//! nginx blocks once. Here:
//!
//! - every loop registers each route's one listening socket with `EPOLLEXCLUSIVE`, so a new
//!   connection wakes one loop, and accepts one connection per event with `accept4`
//!   (non-blocking, with the peer address, one call);
//! - a connection lives on the loop that accepted it; its two sockets are registered once,
//!   edge-triggered for reading, writing and the peer's half-close, and closing them is what
//!   deregisters them;
//! - endpoints are chosen, retried on connect failure or timeout, and marked down exactly as
//!   on the portable path ([`crate::tcp::choose`]);
//! - bytes move as in [`crate::relay`]: small messages through the loop's scratch buffer,
//!   bulk streams by `splice(2)` through pooled pipes, half-close passed on;
//! - each loop's `epoll_wait` timeout is its earliest connect deadline, or a tick that also
//!   closes connections to endpoints whose drain timeout has passed.
//!
//! Listeners come and go by commands sent over a channel, with an eventfd to wake the loop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{SpliceFFlags, splice};
use nix::libc;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::MsgFlags;
use slab::Slab;
use socket2::{Domain, SockRef, Socket, Type};
use svcnet_lb::Flow;
use svcnet_proxy::Protocol;

use crate::admission::{UpstreamSource, bind_source};
use crate::proxy::Shared;
use crate::relay::{Pipe, SCRATCH_SIZE, give_pipe, take_pipe};
use crate::state::{EndpointState, Route};
use crate::table::RouteKey;
use crate::tcp::{Active, MAX_TRIED, choose, connect_failed, flow, pin, reset};

/// The longest a loop sleeps: the period of its drain check.
const TICK: Duration = Duration::from_millis(200);
/// Events taken per `epoll_wait`.
const EVENTS: usize = 256;
/// After an accept error other than "nothing to accept" (EMFILE, ENFILE, ENOBUFS), the
/// listener rests this long instead of waking the loop again at once.
const ACCEPT_REST: Duration = Duration::from_millis(20);
/// The most one `splice` is asked to move; the pipe's capacity is the real bound.
const CHUNK: usize = 1 << 20;

/// Token layout: an index shifted left by two, and what it indexes in the low bits.
const CLIENT: u64 = 0;
const UPSTREAM: u64 = 1;
const LISTENER: u64 = 2;
const WAKE: u64 = 3;

fn token(index: usize, kind: u64) -> u64 {
    ((index as u64) << 2) | kind
}

/// Connection sockets: edge-triggered, for reading, writing and the peer's half-close.
fn relay_interest() -> EpollFlags {
    EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET
}

/// Listening sockets: level-triggered (a backlog left after a batch wakes the loop again),
/// and exclusive (one waiting loop is woken per connection, not all of them).
fn listen_interest() -> EpollFlags {
    EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE
}

enum Command {
    Listen {
        id: u64,
        route: RouteKey,
        socket: TcpListener,
    },
    Unlisten {
        id: u64,
    },
    /// An endpoint's drain timeout passed: close its connections now, not at the next tick.
    Sweep,
}

#[derive(Clone)]
struct LoopHandle {
    commands: mpsc::Sender<Command>,
    wake: Arc<EventFd>,
}

impl LoopHandle {
    fn send(&self, c: Command) {
        if self.commands.send(c).is_ok() {
            let _ = self.wake.write(1);
        }
    }
}

/// The running loops; stopped (connections closed, threads joined) on drop.
pub(crate) struct Loops {
    handles: Vec<LoopHandle>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Loops {
    /// Starts `count` loops; with a node namespace each thread enters it first, so the
    /// upstream sockets it makes are born there.
    pub(crate) fn start(shared: &Arc<Shared>, count: usize) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut loops = Self {
            handles: Vec::new(),
            threads: Vec::new(),
            stop: stop.clone(),
        };
        for i in 0..count.max(1) {
            let (tx, rx) = mpsc::channel();
            let wake = Arc::new(EventFd::from_flags(
                EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
            )?);
            let (thread_shared, stop, thread_wake) = (shared.clone(), stop.clone(), wake.clone());
            let ((), thread) = crate::socket::spawn_in(
                format!("svcnet-tcp-{i}"),
                shared.config.netns.as_deref(),
                move || Ok(((), Loop::new(thread_shared, rx, thread_wake, stop)?)),
                |mut l| l.run(),
            )?;
            loops.handles.push(LoopHandle { commands: tx, wake });
            loops.threads.push(thread);
        }
        Ok(loops)
    }

    /// Every loop starts accepting from `socket` (each registers its own duplicate).
    pub(crate) fn listen(&self, id: u64, route: &RouteKey, socket: &TcpListener) -> io::Result<()> {
        for h in &self.handles {
            h.send(Command::Listen {
                id,
                route: route.clone(),
                socket: socket.try_clone()?,
            });
        }
        Ok(())
    }

    /// Every loop stops accepting from listener `id`; its connections live on.
    pub(crate) fn unlisten(&self, id: u64) {
        for h in &self.handles {
            h.send(Command::Unlisten { id });
        }
    }

    /// A handle that makes every loop close connections to evicted endpoints at once.
    pub(crate) fn sweeper(&self) -> Sweeper {
        Sweeper(self.handles.clone())
    }
}

/// Sends [`Command::Sweep`] to every loop (cheap to clone, safe to keep after the loops stop).
#[derive(Clone)]
pub(crate) struct Sweeper(Vec<LoopHandle>);

impl Sweeper {
    pub(crate) fn sweep(&self) {
        for h in &self.0 {
            h.send(Command::Sweep);
        }
    }
}

impl Drop for Loops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in &self.handles {
            let _ = h.wake.write(1);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Listening {
    id: u64,
    route: RouteKey,
    socket: TcpListener,
    /// Resting after an accept error: out of the epoll set until this time.
    resting: Option<Instant>,
}

/// What is known of one socket's readiness (edge-triggered: set by events, cleared when an
/// operation would block).
#[derive(Clone, Copy, Debug, Default)]
struct Ready {
    readable: bool,
    writable: bool,
    /// The peer closed its side (or the socket failed): reads go on until they return 0 or
    /// an error, whatever a short read suggests, since no new edge will come.
    hup: bool,
    /// `EPOLLERR` or `EPOLLHUP` was reported.
    failed: bool,
}

/// One direction of a relayed connection.
#[derive(Default)]
struct Dir {
    /// Read but not yet written (the copying path, when the destination was full).
    pending: Vec<u8>,
    /// Set once a read filled the scratch buffer: the rest is spliced through this pipe.
    pipe: Option<Pipe>,
    /// Bytes in the pipe not yet written out.
    held: usize,
    /// The source ended and its FIN was passed on.
    ended: bool,
    moved: u64,
}

enum Phase {
    Connecting {
        route: Arc<Route>,
        flow: Flow,
        tried: [usize; MAX_TRIED],
        attempts: usize,
        /// Deadline of all attempts together.
        budget: Instant,
        /// Which attempt a deadline in the heap belongs to.
        serial: u64,
    },
    Relaying {
        ep: Arc<EndpointState>,
        active: Active,
        /// For judging the connection again ([`crate::admission::Admission::rejudge`]).
        client: std::net::IpAddr,
    },
    /// Closed in this batch of events; the slot is freed after the batch, so a late event
    /// in the same batch can never reach a connection accepted meanwhile.
    Closed,
}

struct Conn {
    /// `[client, upstream]`.
    socks: [Option<TcpStream>; 2],
    ready: [Ready; 2],
    /// `[client → endpoint, endpoint → client]`: direction `d` reads `socks[d]`.
    dirs: [Dir; 2],
    phase: Phase,
}

struct Loop {
    shared: Arc<Shared>,
    /// Seen at each tick: connections are judged again when it changed.
    rejudge: tokio::sync::watch::Receiver<u64>,
    epoll: Epoll,
    commands: mpsc::Receiver<Command>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    listeners: Slab<Listening>,
    conns: Slab<Conn>,
    /// Freed after the current batch of events.
    closed: Vec<usize>,
    /// Connect deadlines: (when, attempt serial, connection).
    deadlines: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    serial: u64,
    scratch: Box<[u8]>,
    next_tick: Instant,
}

impl Loop {
    fn new(
        shared: Arc<Shared>,
        commands: mpsc::Receiver<Command>,
        wake: Arc<EventFd>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&*wake, EpollEvent::new(EpollFlags::EPOLLIN, token(0, WAKE)))?;
        Ok(Self {
            rejudge: shared.rejudge.clone(),
            shared,
            epoll,
            commands,
            wake,
            stop,
            listeners: Slab::new(),
            conns: Slab::new(),
            closed: Vec::new(),
            deadlines: BinaryHeap::new(),
            serial: 0,
            scratch: vec![0; SCRATCH_SIZE].into_boxed_slice(),
            next_tick: Instant::now() + TICK,
        })
    }

    fn run(&mut self) {
        let mut events = vec![EpollEvent::empty(); EVENTS];
        while !self.stop.load(Ordering::Relaxed) {
            let timeout = self.timeout();
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    tracing::error!("a TCP event loop failed: {e}");
                    return;
                }
            };
            for ev in &events[..n] {
                let (index, kind) = ((ev.data() >> 2) as usize, ev.data() & 3);
                match kind {
                    WAKE => self.commands(),
                    LISTENER => self.accept(index),
                    side => self.event(index, side as usize, ev.events()),
                }
            }
            self.timers();
            // After the batch (and the timers), no event can still name a closed slot.
            for i in self.closed.drain(..) {
                self.conns.try_remove(i);
            }
        }
    }

    /// Milliseconds to the earliest connect deadline, at most a tick.
    fn timeout(&self) -> u16 {
        let now = Instant::now();
        let mut until = self.next_tick;
        if let Some(Reverse((d, _, _))) = self.deadlines.peek() {
            until = until.min(*d);
        }
        let left = until.saturating_duration_since(now);
        // Round up, so a deadline is never woken for a millisecond early.
        (left.as_micros().div_ceil(1000)).min(u128::from(u16::MAX)) as u16
    }

    fn commands(&mut self) {
        let _ = self.wake.read();
        while let Ok(c) = self.commands.try_recv() {
            match c {
                Command::Listen { id, route, socket } => {
                    let entry = self.listeners.vacant_entry();
                    let key = entry.key();
                    if let Err(e) = self.epoll.add(
                        &socket,
                        EpollEvent::new(listen_interest(), token(key, LISTENER)),
                    ) {
                        tracing::error!(route = ?route, "cannot watch a listener: {e}");
                        continue;
                    }
                    entry.insert(Listening {
                        id,
                        route,
                        socket,
                        resting: None,
                    });
                }
                Command::Sweep => self.next_tick = Instant::now(),
                Command::Unlisten { id } => {
                    let keys: Vec<usize> = self
                        .listeners
                        .iter()
                        .filter(|(_, l)| l.id == id)
                        .map(|(k, _)| k)
                        .collect();
                    for k in keys {
                        let l = self.listeners.remove(k);
                        if l.resting.is_none() {
                            let _ = self.epoll.delete(&l.socket);
                        }
                    }
                }
            }
        }
    }

    /// Accepts one connection per readiness event, as nginx does by default: the listener
    /// is level-triggered, so a longer backlog returns from the next `epoll_wait` at once,
    /// and no failing `accept4` is spent learning that the backlog is empty (draining until
    /// `EAGAIN` made 0.44 of them per connection under `Connection: close` load).
    fn accept(&mut self, index: usize) {
        let Some(l) = self.listeners.get_mut(index) else {
            return;
        };
        match accept4(&l.socket) {
            Ok((client, peer)) => {
                let route = l.route.clone();
                self.open(&route, client, peer);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO)
                ) => {}
            Err(e) => {
                tracing::warn!(route = ?l.route, "accept failed, resting the listener: {e}");
                if self.epoll.delete(&l.socket).is_ok() {
                    l.resting = Some(Instant::now() + ACCEPT_REST);
                }
            }
        }
    }

    /// A new client connection: choose an endpoint and start connecting.
    fn open(&mut self, key: &RouteKey, client: TcpStream, peer: SocketAddr) {
        let Some(route) = self.shared.table.load().routes.get(key).cloned() else {
            reset(client);
            return;
        };
        let route = route.for_client(peer.ip(), || client.local_addr().ok().map(|a| a.ip()));
        let flow = flow(&self.shared, &route, &client, peer);
        let entry = self.conns.vacant_entry();
        let index = entry.key();
        if let Err(e) = self.epoll.add(
            &client,
            EpollEvent::new(relay_interest(), token(index, CLIENT)),
        ) {
            tracing::warn!("cannot watch a client connection: {e}");
            reset(client);
            return;
        }
        let budget = Instant::now() + self.shared.config.connect_budget;
        entry.insert(Conn {
            socks: [Some(client), None],
            ready: [Ready::default(); 2],
            dirs: [Dir::default(), Dir::default()],
            phase: Phase::Connecting {
                route,
                flow,
                tried: [0; MAX_TRIED],
                attempts: 0,
                budget,
                serial: 0,
            },
        });
        self.attempt(index);
    }

    /// Starts a connect to the next endpoint the balancer offers, or refuses the client when
    /// attempts, time or endpoints have run out.
    fn attempt(&mut self, index: usize) {
        let cfg = &self.shared.config;
        loop {
            let Some(conn) = self.conns.get_mut(index) else {
                return;
            };
            let Phase::Connecting {
                route,
                flow,
                tried,
                attempts,
                budget,
                serial,
            } = &mut conn.phase
            else {
                return;
            };
            let now = Instant::now();
            let left = budget.saturating_duration_since(now);
            let next = if *attempts < cfg.max_attempts.clamp(1, MAX_TRIED) && !left.is_zero() {
                choose(
                    &self.shared,
                    route,
                    flow,
                    &tried[..*attempts],
                    Protocol::Tcp,
                )
            } else {
                None
            };
            let Some(i) = next else {
                route.service.stats.refused.fetch_add(1, Ordering::Relaxed);
                self.close(index, true);
                return;
            };
            tried[*attempts] = i;
            *attempts += 1;
            let addr = route.endpoints[i].addr;
            let started = connect(addr, cfg.upstream_source).and_then(|s| {
                self.epoll.add(
                    &s,
                    EpollEvent::new(relay_interest(), token(index, UPSTREAM)),
                )?;
                Ok(s)
            });
            match started {
                Ok(s) => {
                    self.serial += 1;
                    *serial = self.serial;
                    conn.socks[1] = Some(s);
                    conn.ready[1] = Ready::default();
                    let at = now + cfg.connect_timeout.min(left);
                    self.deadlines.push(Reverse((at, self.serial, index)));
                    return;
                }
                Err(e) => connect_failed(route, i, cfg.backoff, &e),
            }
        }
    }

    fn event(&mut self, index: usize, side: usize, flags: EpollFlags) {
        let Some(conn) = self.conns.get_mut(index) else {
            return;
        };
        let r = &mut conn.ready[side];
        let failed = flags.intersects(EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR);
        if failed || flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP) {
            r.readable = true;
        }
        if failed || flags.contains(EpollFlags::EPOLLOUT) {
            r.writable = true;
        }
        if failed || flags.contains(EpollFlags::EPOLLRDHUP) {
            r.hup = true;
        }
        r.failed |= failed;
        match conn.phase {
            Phase::Connecting { .. } if side == UPSTREAM as usize && r.writable => {
                self.connected(index)
            }
            Phase::Relaying { .. } => self.relay(index),
            _ => {}
        }
    }

    /// The upstream socket became writable while connecting: connected, or failed.
    fn connected(&mut self, index: usize) {
        let Some(conn) = self.conns.get_mut(index) else {
            return;
        };
        let (Phase::Connecting { route, flow, .. }, Some(i)) = (&conn.phase, current(&conn.phase))
        else {
            return;
        };
        // A failed connect always raises EPOLLERR; without it, writable means connected,
        // and the SO_ERROR read (one system call per connection) is skipped.
        let err = match conn.socks[1].as_ref() {
            None => return,
            Some(_) if !conn.ready[1].failed => None,
            Some(s) => Some(match s.take_error() {
                Ok(Some(e)) | Err(e) => e,
                Ok(None) => io::Error::other("the connection failed"),
            }),
        };
        if let Some(e) = err {
            self.retry(index, &e);
            return;
        }
        pin(route, flow, i);
        let ep = route.endpoints[i].clone();
        let active = Active::new(ep.clone(), route.service.clone());
        conn.phase = Phase::Relaying {
            ep,
            active,
            client: flow.client.ip(),
        };
        self.relay(index);
    }

    fn relay(&mut self, index: usize) {
        let Some(conn) = self.conns.get_mut(index) else {
            return;
        };
        let splice = self.shared.config.splice;
        let scratch = &mut self.scratch;
        let r = pump(conn, 0, scratch, splice).and_then(|()| pump(conn, 1, scratch, splice));
        if let Err(e) = &r {
            tracing::trace!("relay ended: {e}");
        }
        if r.is_err() || (conn.dirs[0].ended && conn.dirs[1].ended) {
            self.close(index, false);
        }
    }

    /// Closes both sockets now (which also takes them out of the epoll set); `reset` sends
    /// the client a TCP RST so it fails at once.
    fn close(&mut self, index: usize, reset_client: bool) {
        let Some(conn) = self.conns.get_mut(index) else {
            return;
        };
        if matches!(conn.phase, Phase::Closed) {
            return;
        }
        if let Phase::Relaying { active, .. } = std::mem::replace(&mut conn.phase, Phase::Closed) {
            active.bytes(conn.dirs[0].moved, conn.dirs[1].moved);
        }
        if reset_client && let Some(c) = conn.socks[0].take() {
            reset(c);
        }
        conn.socks = [None, None];
        for d in &mut conn.dirs {
            if let Some(p) = d.pipe.take()
                && d.held == 0
            {
                give_pipe(p);
            }
        }
        self.closed.push(index);
    }

    /// Connect deadlines, resting listeners, and (each tick) connections whose endpoint's
    /// drain timeout has passed.
    fn timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, serial, index))) = self.deadlines.peek().copied() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            // Only the attempt this deadline was set for (the connection may have moved on).
            let current_attempt = self.conns.get(index).is_some_and(
                |c| matches!(c.phase, Phase::Connecting { serial: s, .. } if s == serial),
            );
            if current_attempt {
                self.retry(
                    index,
                    &io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
                );
            }
        }
        for (key, l) in self.listeners.iter_mut() {
            if l.resting.is_some_and(|t| t <= now) {
                let ev = EpollEvent::new(listen_interest(), token(key, LISTENER));
                if self.epoll.add(&l.socket, ev).is_ok() {
                    l.resting = None;
                }
            }
        }
        if now >= self.next_tick {
            self.next_tick = now + TICK;
            let evicted: Vec<usize> = self
                .conns
                .iter()
                .filter(|(_, c)| matches!(&c.phase, Phase::Relaying { ep, .. } if ep.is_evicted()))
                .map(|(k, _)| k)
                .collect();
            for index in evicted {
                tracing::debug!("drain timeout passed, closing a connection");
                self.close(index, false);
            }
            if self.rejudge.has_changed().unwrap_or(false) {
                self.rejudge.mark_unchanged();
                let shared = &self.shared;
                let denied: Vec<usize> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| {
                        matches!(&c.phase, Phase::Relaying { ep, client, .. }
                            if !shared.admits(*client, ep.addr, Protocol::Tcp))
                    })
                    .map(|(k, _)| k)
                    .collect();
                for index in denied {
                    tracing::debug!("now denied, closing a connection");
                    if let Some(s) = self.conns.get_mut(index).and_then(|c| c.socks[1].take()) {
                        reset(s);
                    }
                    self.close(index, true);
                }
            }
        }
    }

    /// The connect in flight failed: count it against its endpoint (marked down), drop the
    /// socket, and try the next endpoint.
    fn retry(&mut self, index: usize, e: &io::Error) {
        let Some(conn) = self.conns.get_mut(index) else {
            return;
        };
        if let (Phase::Connecting { route, .. }, Some(i)) = (&conn.phase, current(&conn.phase)) {
            connect_failed(route, i, self.shared.config.backoff, e);
        }
        conn.socks[1] = None;
        self.attempt(index);
    }
}

/// The endpoint index of the attempt in flight.
fn current(phase: &Phase) -> Option<usize> {
    match phase {
        Phase::Connecting {
            tried, attempts, ..
        } => attempts.checked_sub(1).map(|k| tried[k]),
        _ => None,
    }
}

/// `accept4(2)`: the connection non-blocking and close-on-exec, with its peer, in one call.
fn accept4(listener: &TcpListener) -> io::Result<(TcpStream, SocketAddr)> {
    let (s, peer) = SockRef::from(listener).accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)?;
    let peer = peer
        .as_socket()
        .ok_or_else(|| io::Error::other("accepted a connection without an IP peer"))?;
    Ok((s.into(), peer))
}

/// A non-blocking connect with `TCP_NODELAY` (set before connecting); in progress on return.
fn connect(addr: SocketAddr, source: Option<UpstreamSource>) -> io::Result<TcpStream> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking(), None)?;
    s.set_tcp_nodelay(true)?;
    bind_source(&s, source, addr)?;
    match s.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(s.into())
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

fn send(to: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    nix::sys::socket::send(to.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
}

fn splice_flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
}

/// Moves what can move now in direction `d` (0: client → endpoint, 1: endpoint → client):
/// first what is held for the destination, then new reads, until a side would block or the
/// source ends (then its FIN is passed on, unless the other direction ended already and the
/// connection closes anyway). Without `splice`, bulk streams are copied too.
fn pump(conn: &mut Conn, d: usize, scratch: &mut [u8], use_splice: bool) -> io::Result<()> {
    let o = 1 - d;
    let other_ended = conn.dirs[o].ended;
    let (Some(from), Some(to)) = (&conn.socks[d], &conn.socks[o]) else {
        return Ok(());
    };
    let dir = &mut conn.dirs[d];
    let ready = &mut conn.ready;
    loop {
        if dir.ended {
            return Ok(());
        }
        if !dir.pending.is_empty() {
            if !ready[o].writable {
                return Ok(());
            }
            match send(to, &dir.pending) {
                Ok(m) => {
                    dir.moved += m as u64;
                    dir.pending.drain(..m);
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
            if !dir.pending.is_empty() {
                ready[o].writable = false;
                return Ok(());
            }
        }
        if dir.held > 0
            && let Some(p) = &dir.pipe
        {
            if !ready[o].writable {
                return Ok(());
            }
            match splice(&p.read, None, to, None, dir.held, splice_flags()) {
                Ok(m) => {
                    dir.held -= m;
                    dir.moved += m as u64;
                }
                Err(Errno::EAGAIN) => {}
                Err(e) => return Err(e.into()),
            }
            if dir.held > 0 {
                ready[o].writable = false;
                return Ok(());
            }
        }
        if !ready[d].readable {
            return Ok(());
        }
        let got = match &dir.pipe {
            None => nix::unistd::read(from, scratch),
            // The pipe is filled only when empty, so EAGAIN here always means "nothing to
            // read", never "pipe full".
            Some(p) => splice(from, None, &p.write, None, CHUNK, splice_flags()),
        };
        let n = match got {
            Ok(0) => {
                dir.ended = true;
                if !other_ended {
                    // `from` sent FIN: pass the half-close on. `to` may already be gone.
                    let _ = to.shutdown(Shutdown::Write);
                }
                return Ok(());
            }
            Ok(n) => n,
            Err(Errno::EAGAIN) => {
                ready[d].readable = false;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        if dir.pipe.is_some() {
            dir.held = n;
            continue;
        }
        if n == scratch.len() && use_splice {
            // A full read: a bulk stream; the rest of this direction is spliced.
            dir.pipe = Some(take_pipe()?);
        } else if n < scratch.len() && !ready[d].hup {
            // A short read drained the socket: a later arrival raises a new edge.
            ready[d].readable = false;
        }
        let mut sent = 0;
        if ready[o].writable {
            match send(to, &scratch[..n]) {
                Ok(m) => sent = m,
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        }
        dir.moved += sent as u64;
        if sent < n {
            dir.pending.extend_from_slice(&scratch[sent..n]);
            ready[o].writable = false;
        }
    }
}
