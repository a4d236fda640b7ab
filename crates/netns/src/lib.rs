//! Network namespaces: the one crate that does namespace syscalls.
//!
//! [`NetNs`] creates a named, persistent network namespace (bind-mounted at
//! `/run/netns/<name>`, exactly like `ip netns add`, so `ip netns exec` and `nft` inside it
//! work), runs closures inside it on a dedicated thread (never switching the caller's thread,
//! and never a tokio worker), and removes it on drop. [`command`] builds a `Command` that runs
//! inside a named namespace. [`test_support`] builds real test topologies (pods, node, external
//! client) with echo servers. Nothing here knows about Kubernetes.
//!
//! Namespaces are Linux's. Elsewhere (macOS) the crate builds, every namespace operation fails
//! with `ENOSYS`, and [`command`] without a namespace runs programs as usual, so code that names
//! no namespace (the userspace proxy, unprivileged) runs there unchanged.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

#[cfg(target_os = "linux")]
pub mod datagrams;
#[cfg(target_os = "linux")]
pub mod pty;
#[cfg(target_os = "linux")]
pub mod sandbox;
pub mod signals;
pub mod test_support;
#[cfg(target_os = "linux")]
pub mod tun;

/// Waits up to `timeout_ms` for `fd` to be readable; `Ok(false)` on timeout.
pub fn wait_readable(fd: &impl std::os::fd::AsFd, timeout_ms: u16) -> std::io::Result<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(timeout_ms)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The namespace system calls: Linux's, or `ENOSYS` elsewhere.
mod sys {
    #[cfg(target_os = "linux")]
    pub(crate) use linux::*;
    #[cfg(not(target_os = "linux"))]
    pub(crate) use other::*;

    #[cfg(target_os = "linux")]
    mod linux {
        use std::fs::File;
        use std::path::Path;

        use nix::mount::{MntFlags, MsFlags, mount, umount2};
        use nix::sched::{CloneFlags, setns, unshare};

        /// Moves the calling thread into a new network namespace and bind-mounts it at `at`.
        pub(crate) fn new_netns_at(at: &Path) -> Result<(), (&'static str, nix::Error)> {
            unshare(CloneFlags::CLONE_NEWNET).map_err(|e| ("unshare", e))?;
            mount(
                Some("/proc/thread-self/ns/net"),
                at,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| ("bind mount", e))
        }

        /// Moves the calling thread into the network namespace open as `file`.
        pub(crate) fn enter(file: &File) -> nix::Result<()> {
            setns(file, CloneFlags::CLONE_NEWNET)
        }

        pub(crate) fn unmount(at: &Path) -> nix::Result<()> {
            umount2(at, MntFlags::MNT_DETACH)
        }
    }

    #[cfg(not(target_os = "linux"))]
    mod other {
        use std::fs::File;
        use std::path::Path;

        use nix::errno::Errno;

        pub(crate) fn new_netns_at(_: &Path) -> Result<(), (&'static str, nix::Error)> {
            Err(("unshare", Errno::ENOSYS))
        }

        pub(crate) fn enter(_: &File) -> nix::Result<()> {
            Err(Errno::ENOSYS)
        }

        pub(crate) fn unmount(_: &Path) -> nix::Result<()> {
            Err(Errno::ENOSYS)
        }
    }
}

/// Where persistent namespaces are bind-mounted (iproute2's convention).
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// A failure creating, entering or removing a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {name}: {action}: {source}")]
    Sys {
        name: String,
        action: &'static str,
        source: nix::Error,
    },
    #[error("network namespace {name}: {action}: {source}")]
    Io {
        name: String,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("network namespace {name}: `{command}` failed: {stderr}")]
    Command {
        name: String,
        command: String,
        stderr: String,
    },
    #[error("network namespace {name}: the helper thread panicked")]
    Panicked { name: String },
}

/// A named, persistent network namespace, deleted on drop (unless [`NetNs::leak`]ed).
#[derive(Debug)]
pub struct NetNs {
    name: String,
    path: PathBuf,
    owned: bool,
}

impl NetNs {
    /// Creates `/run/netns/<name>` holding a fresh network namespace with `lo` up.
    pub fn create(name: &str) -> Result<Self, NetnsError> {
        let io = |action, source| NetnsError::Io {
            name: name.to_string(),
            action,
            source,
        };
        std::fs::create_dir_all(NETNS_RUN_DIR).map_err(|e| io("create /run/netns", e))?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io("create mount point", e))?;
        let ns = NetNs {
            name: name.to_string(),
            path: path.clone(),
            owned: true,
        };
        let thread_path = path.clone();
        let owner = name.to_string();
        // unshare() changes the calling thread only; a throwaway thread keeps the caller clean.
        std::thread::spawn(move || -> Result<(), NetnsError> {
            let sys = |action, source| NetnsError::Sys {
                name: owner.clone(),
                action,
                source,
            };
            sys::new_netns_at(&thread_path).map_err(|(action, e)| sys(action, e))
        })
        .join()
        .map_err(|_| NetnsError::Panicked {
            name: name.to_string(),
        })??;
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Opens an existing named namespace without taking ownership (not deleted on drop).
    pub fn open(name: &str) -> Result<Self, NetnsError> {
        let path = Path::new(NETNS_RUN_DIR).join(name);
        if !path.exists() {
            return Err(NetnsError::Io {
                name: name.to_string(),
                action: "open",
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        Ok(Self {
            name: name.to_string(),
            path,
            owned: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Keeps the namespace after drop.
    pub fn leak(mut self) {
        self.owned = false;
    }

    /// Runs `f` on a dedicated thread inside this namespace and returns its result. Sockets
    /// created in `f` stay in this namespace for their whole life, whichever thread uses them.
    pub fn run<R: Send, F: FnOnce() -> R + Send>(&self, f: F) -> Result<R, NetnsError> {
        std::thread::scope(|s| {
            s.spawn(move || {
                self.enter()?;
                Ok(f())
            })
            .join()
            .map_err(|_| NetnsError::Panicked {
                name: self.name.clone(),
            })?
        })
    }

    /// Moves the calling thread into this namespace for the rest of its life (a data-path
    /// thread that makes its sockets there).
    pub fn enter(&self) -> Result<(), NetnsError> {
        let file = File::open(&self.path).map_err(|e| NetnsError::Io {
            name: self.name.clone(),
            action: "open",
            source: e,
        })?;
        sys::enter(&file).map_err(|e| NetnsError::Sys {
            name: self.name.clone(),
            action: "setns",
            source: e,
        })
    }

    /// Spawns a long-lived thread inside this namespace (servers in tests).
    pub fn spawn<F: FnOnce() + Send + 'static>(
        &self,
        f: F,
    ) -> Result<std::thread::JoinHandle<()>, NetnsError> {
        let file = File::open(&self.path).map_err(|e| NetnsError::Io {
            name: self.name.clone(),
            action: "open",
            source: e,
        })?;
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let entered = sys::enter(&file);
            let ok = entered.is_ok();
            let _ = tx.send(entered);
            if ok {
                f();
            }
        });
        match rx.recv() {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(e)) => Err(NetnsError::Sys {
                name: self.name.clone(),
                action: "setns",
                source: e,
            }),
            Err(_) => Err(NetnsError::Panicked {
                name: self.name.clone(),
            }),
        }
    }

    /// Runs a program inside this namespace and returns its stdout; fails with its stderr.
    pub fn exec(&self, argv: &[&str]) -> Result<String, NetnsError> {
        let (program, args) = argv.split_first().ok_or_else(|| NetnsError::Command {
            name: self.name.clone(),
            command: String::new(),
            stderr: "empty command".into(),
        })?;
        let out = command(Some(&self.name), program)
            .args(args)
            .output()
            .map_err(|e| NetnsError::Io {
                name: self.name.clone(),
                action: "spawn",
                source: e,
            })?;
        if !out.status.success() {
            return Err(NetnsError::Command {
                name: self.name.clone(),
                command: argv.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn remove(&self) -> Result<(), NetnsError> {
        // Try both steps even if the first fails (a half-created namespace has no mount).
        let unmounted = sys::unmount(&self.path).map_err(|e| NetnsError::Sys {
            name: self.name.clone(),
            action: "unmount",
            source: e,
        });
        let removed = std::fs::remove_file(&self.path).map_err(|e| NetnsError::Io {
            name: self.name.clone(),
            action: "remove",
            source: e,
        });
        removed.and(unmounted)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if self.owned
            && let Err(e) = self.remove()
        {
            tracing::warn!("{e}");
        }
    }
}

/// A `Command` for `program`, run inside the named namespace when `netns` is given (through
/// `ip netns exec`, which also gives it a matching /sys).
pub fn command(netns: Option<&str>, program: &str) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
        None => Command::new(program),
    }
}

/// Runs `cmd` with `stdin` written to its standard input (none: `/dev/null`) and collects
/// its status, stdout and stderr. A program that cannot be started is an error of kind
/// `NotFound` (missing) or the spawn's own.
pub fn output_with_input(
    cmd: &mut Command,
    stdin: Option<&str>,
) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    use std::process::Stdio;
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    child.wait_with_output()
}

/// A name unique to this process and call: `<prefix><pid hex><counter hex>`, short enough to
/// derive link names of ≤ 15 characters from.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}{n:x}", std::process::id())
}
