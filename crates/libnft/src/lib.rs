//! libnftables (nftables' own library, the engine of the `nft` command) through its C API:
//! one long-lived nftables context per network namespace, so applying a transaction costs the
//! kernel's commit and the library's parse, not starting an `nft` process, loading its cache
//! and, after a deletion, waiting in its final `close()` for an RCU grace period (measured in
//! `shared/notes/nft-data-maps.md`, finding 4).
//!
//! [`Nft`] keeps a [`ffi::Context`] on a dedicated thread that entered the namespace before
//! creating it: a netlink socket belongs to the namespace it was opened in, and libnftables
//! may open one again later (a reopened socket would land in the caller's namespace if the
//! context moved between threads). Callers send it commands and wait for the answer. The text
//! of a transaction is the interface, exactly what `nft -f` reads, so transactions stay values
//! that print, and the library's error text is what `nft -f` printed.
//!
//! The library is loaded with `dlopen` when the first context is opened
//! ([`Error::NotInstalled`] names the package when it is missing). Nothing here knows about
//! Services: [`tx`] is a transaction as a value (what the text is built from) and [`exec`]
//! the executor every nftables user shares (`svcnet-nft`'s Service renderer, the userspace
//! dataplane's redirect table, `svcnet trace`). [`netlink`] writes a transaction that deletes
//! as one nf_tables netlink batch, which the context's thread sends on a socket of its own
//! (in the same namespace): libnftables 1.0.6 would first dump every chain and set of the
//! namespace.

pub mod exec;
pub mod ffi;
pub mod netlink;
#[cfg(target_os = "linux")]
mod nlsock;
#[cfg(not(target_os = "linux"))]
#[path = "nlsock_elsewhere.rs"]
mod nlsock;
pub mod tx;

use std::sync::mpsc;
use std::thread::JoinHandle;

use svcnet_netns::{NetNs, NetnsError};

pub use exec::{ApplyError, NftExecutor, Transport};
pub use ffi::SONAME;
pub use tx::{BaseChain, Family, Op, SetDef, SetKind, Transaction};

/// Why a context could not be opened or a command not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// libnftables is not installed (or is not libnftables 1.x).
    #[error(
        "{SONAME} cannot be loaded ({0}); install it (Debian/Ubuntu: `apt-get install libnftables1`)"
    )]
    NotInstalled(String),
    /// `nft_ctx_new` failed.
    #[error("creating an nftables context: {0}")]
    Context(String),
    /// The network namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("starting the nftables context's thread: {0}")]
    Thread(std::io::Error),
    /// The context's thread ended (it panicked, or a test killed it); open a new one.
    #[error("the nftables context is gone (its thread ended)")]
    Gone,
    /// The library (or, for a [`netlink::Batch`], the kernel) refused the commands: its
    /// error text (what `nft -f` prints); nothing of the batch was applied.
    #[error("{0}")]
    Rejected(String),
    /// The nf_tables netlink socket could not be opened, or failed sending a batch or
    /// reading its answers.
    #[error("nf_tables netlink: {0}")]
    Netlink(String),
}

impl Error {
    /// Whether trying again (with a new context) may help: not when the library is missing
    /// or the namespace cannot be entered.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::NotInstalled(_) | Self::Netns(_))
    }
}

/// Checks that the library loads.
pub fn available() -> Result<(), Error> {
    ffi::api().map_err(Error::NotInstalled)
}

/// Commands longer than this (full syncs, not one-service changes) are followed, once
/// answered, by a fresh context and [`ffi::trim`].
const FRESH_ABOVE: usize = 1 << 20;

/// Work done on the context thread's netlink socket (or told why there is none); returns
/// whether the socket may be used again.
type SocketWork = Box<dyn FnOnce(Result<&mut nlsock::NfSocket, Error>) -> bool + Send>;

enum Job {
    Run {
        commands: String,
        reply: mpsc::SyncSender<Result<String, String>>,
    },
    /// Work on the thread's nf_tables netlink socket (opened on first use).
    Socket(SocketWork),
    /// Ends the thread (and frees the context).
    Stop,
}

/// A long-lived nftables context in one network namespace, on its own thread.
#[derive(Debug)]
pub struct Nft {
    jobs: mpsc::Sender<Job>,
    thread: Option<JoinHandle<()>>,
    netns: Option<String>,
}

impl Nft {
    /// Opens a context in the named network namespace (`/run/netns/<name>`) or, with `None`,
    /// in this process's.
    pub fn open(netns: Option<&str>) -> Result<Self, Error> {
        available()?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::sync_channel::<Result<(), String>>(1);
        let body = move || {
            let mut socket: Option<nlsock::NfSocket> = None;
            let mut ctx = match ffi::Context::new() {
                Ok(ctx) => {
                    let _ = ready_tx.send(Ok(()));
                    ctx
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            while let Ok(job) = queue.recv() {
                match job {
                    Job::Run { commands, reply } => {
                        let _ = reply.send(ctx.run(&commands));
                        if commands.len() > FRESH_ABOVE {
                            // libnftables keeps what a command built (after a full sync: the
                            // whole ruleset, every set element) in its cache until the next
                            // command frees it, 0.4-1 s at 30k services that the first
                            // one-element change would pay. Once the full sync is answered,
                            // a fresh context frees it and malloc gives the memory back.
                            drop(ctx);
                            ffi::trim();
                            match ffi::Context::new() {
                                Ok(fresh) => ctx = fresh,
                                Err(e) => {
                                    // The thread ends; the next run says Gone and the owner
                                    // opens a new context.
                                    tracing::warn!("reopening the nftables context: {e}");
                                    return;
                                }
                            }
                        }
                    }
                    Job::Socket(work) => {
                        if socket.is_none() {
                            match nlsock::NfSocket::open() {
                                Ok(s) => socket = Some(s),
                                Err(e) => {
                                    let e = Error::Netlink(format!("opening the socket: {e}"));
                                    work(Err(e));
                                    continue;
                                }
                            }
                        }
                        if let Some(s) = &mut socket
                            && !work(Ok(s))
                        {
                            // A socket in an unknown state is not reused.
                            socket = None;
                        }
                    }
                    Job::Stop => break,
                }
            }
        };
        let thread = match netns {
            Some(name) => NetNs::open(name)?.spawn(body)?,
            None => std::thread::Builder::new()
                .name("nft-context".into())
                .spawn(body)
                .map_err(Error::Thread)?,
        };
        match ready.recv() {
            Ok(Ok(())) => Ok(Self {
                jobs,
                thread: Some(thread),
                netns: netns.map(str::to_string),
            }),
            Ok(Err(e)) => Err(Error::Context(e)),
            Err(_) => Err(Error::Gone),
        }
    }

    /// The namespace this context programs (`None`: the process's own).
    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// Runs `commands` (one atomic batch, as `nft -f` reads a file); returns what the library
    /// printed (listings).
    pub fn run(&self, commands: &str) -> Result<String, Error> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.jobs
            .send(Job::Run {
                commands: commands.to_string(),
                reply,
            })
            .map_err(|_| Error::Gone)?;
        answer
            .recv()
            .map_err(|_| Error::Gone)?
            .map_err(Error::Rejected)
    }

    /// Sends `batch` as one kernel transaction on this context's nf_tables netlink socket
    /// (in the same namespace), without libnftables: see [`netlink`] for when and why.
    pub fn send_batch(&self, batch: netlink::Batch) -> Result<(), Error> {
        self.on_socket(move |s| s.send(batch))
    }

    /// The namespace's nf_tables generation: the kernel counts one per committed
    /// transaction (tests check that a change was one).
    pub fn generation(&self) -> Result<u32, Error> {
        self.on_socket(nlsock::NfSocket::generation)
    }

    fn on_socket<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut nlsock::NfSocket) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let (reply, answer) = mpsc::sync_channel(1);
        let work = move |socket: Result<&mut nlsock::NfSocket, Error>| {
            let out = socket.and_then(f);
            let healthy = !matches!(out, Err(Error::Netlink(_)));
            let _ = reply.send(out);
            healthy
        };
        self.jobs
            .send(Job::Socket(Box::new(work)))
            .map_err(|_| Error::Gone)?;
        answer.recv().map_err(|_| Error::Gone)?
    }

    /// Fault injection for tests: ends the context's thread as if it had died; the next
    /// [`Nft::run`] fails with [`Error::Gone`].
    pub fn kill(&self) {
        let _ = self.jobs.send(Job::Stop);
        // Wait until the thread has stopped taking jobs: a probe's reply channel is dropped
        // unanswered once the queue is gone.
        let (reply, answer) = mpsc::sync_channel(1);
        if self
            .jobs
            .send(Job::Run {
                commands: String::new(),
                reply,
            })
            .is_ok()
        {
            let _ = answer.recv();
        }
    }
}

impl Drop for Nft {
    fn drop(&mut self) {
        let _ = self.jobs.send(Job::Stop);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::warn!("the nftables context's thread panicked");
        }
    }
}
