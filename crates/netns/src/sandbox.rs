//! Process sandboxes: start a program inside a named network namespace, with a private mount
//! namespace (files bind-mounted over `/etc/resolv.conf`, `/etc/hosts`), its own UTS namespace
//! (hostname) and its own session (so the whole process group can be signalled).
//!
//! This is how the node agent runs a pod's containers and how `svcnet exec` enters a pod. The
//! namespace switching happens in the forked child between `fork` and `exec` (`pre_exec`), so
//! no thread of the caller ever changes namespace. Everything the child needs is prepared
//! before the fork (the namespace file is opened, paths are turned into C strings), because
//! allocating after `fork` in a multi-threaded process is not safe.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::{NETNS_RUN_DIR, NetnsError};

/// Where and how a program runs: a builder, applied to a [`Command`] with [`Sandbox::apply`].
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    netns: Option<String>,
    /// (source, target, read-only)
    binds: Vec<(PathBuf, PathBuf, bool)>,
    hostname: Option<String>,
    die_with_parent: bool,
    controlling_tty: bool,
    /// Capabilities kept in the bounding set (bit n = capability n); `None` keeps them all.
    capabilities: Option<u64>,
}

impl Sandbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the program in the named network namespace (`/run/netns/<name>`).
    pub fn netns(mut self, name: &str) -> Self {
        self.netns = Some(name.to_string());
        self
    }

    /// Bind-mounts `source` over `target` in a private mount namespace of the program.
    pub fn bind(mut self, source: impl Into<PathBuf>, target: impl Into<PathBuf>) -> Self {
        self.binds.push((source.into(), target.into(), false));
        self
    }

    /// [`Sandbox::bind`], read-only (a volume mount's `readOnly: true`).
    pub fn bind_read_only(
        mut self,
        source: impl Into<PathBuf>,
        target: impl Into<PathBuf>,
    ) -> Self {
        self.binds.push((source.into(), target.into(), true));
        self
    }

    /// Gives the program its own UTS namespace with this hostname.
    pub fn hostname(mut self, name: &str) -> Self {
        self.hostname = Some(name.to_string());
        self
    }

    /// Kills the program (SIGKILL) when the thread that started it exits, so a crashed agent
    /// leaves no orphan containers behind.
    pub fn die_with_parent(mut self) -> Self {
        self.die_with_parent = true;
        self
    }

    /// Makes the program's stdin, a terminal (a [`crate::pty`] slave), its controlling
    /// terminal, so the terminal's signals (Ctrl-C) and job control reach it.
    pub fn controlling_tty(mut self) -> Self {
        self.controlling_tty = true;
        self
    }

    /// Limits the program to the capabilities in `keep` (bit n = capability n, as in
    /// `linux/capability.h`): the others are dropped from its bounding set last, after the
    /// namespaces and mounts are made, so a program run as root gets exactly these (a root
    /// process's permitted and effective sets are its bounding set after `exec`).
    pub fn capabilities(mut self, keep: u64) -> Self {
        self.capabilities = Some(keep);
        self
    }

    /// Prepares `cmd` to start inside this sandbox, in a new session (its pid is its process
    /// group id, see [`signal_group`]). Fails if the namespace or a bind source is missing.
    pub fn apply(&self, cmd: &mut Command) -> Result<(), NetnsError> {
        let label = self
            .netns
            .clone()
            .unwrap_or_else(|| "(current)".to_string());
        let io_err = |action, source| NetnsError::Io {
            name: label.clone(),
            action,
            source,
        };
        let netns_file = match &self.netns {
            Some(name) => Some(
                File::open(Path::new(NETNS_RUN_DIR).join(name)).map_err(|e| io_err("open", e))?,
            ),
            None => None,
        };
        let mut binds = Vec::new();
        for (source, target, read_only) in &self.binds {
            if !source.exists() {
                return Err(io_err(
                    "bind source",
                    io::Error::new(io::ErrorKind::NotFound, source.display().to_string()),
                ));
            }
            binds.push((
                c_path(source).map_err(|e| io_err("bind source", e))?,
                c_path(target).map_err(|e| io_err("bind target", e))?,
                *read_only,
            ));
        }
        let root = c_path(Path::new("/")).map_err(|e| io_err("root", e))?;
        let hostname: Option<OsString> = self.hostname.as_ref().map(OsString::from);
        let die_with_parent = self.die_with_parent;
        let controlling_tty = self.controlling_tty;
        let private_mounts = !binds.is_empty();
        // The capabilities to drop, known before the fork (reading a file allocates).
        let drop_caps: Vec<i32> = match self.capabilities {
            None => Vec::new(),
            Some(keep) => (0..=last_capability().map_err(|e| io_err("cap_last_cap", e))?)
                .filter(|c| *c >= 64 || keep & (1u64 << c) == 0)
                .map(|c| c as i32)
                .collect(),
        };
        let closure = move || -> io::Result<()> {
            if die_with_parent {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            }
            nix::unistd::setsid().map_err(io::Error::from)?;
            if controlling_tty {
                crate::pty::make_controlling(0)?;
            }
            if let Some(file) = &netns_file {
                setns(file, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            }
            let mut flags = CloneFlags::empty();
            if private_mounts {
                flags |= CloneFlags::CLONE_NEWNS;
            }
            if hostname.is_some() {
                flags |= CloneFlags::CLONE_NEWUTS;
            }
            if !flags.is_empty() {
                unshare(flags).map_err(io::Error::from)?;
            }
            if private_mounts {
                // Keep our bind mounts from propagating back into the host's mount namespace.
                mount(
                    None::<&std::ffi::CStr>,
                    root.as_c_str(),
                    None::<&std::ffi::CStr>,
                    MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                    None::<&std::ffi::CStr>,
                )
                .map_err(io::Error::from)?;
                for (source, target, read_only) in &binds {
                    mount(
                        Some(source.as_c_str()),
                        target.as_c_str(),
                        None::<&std::ffi::CStr>,
                        MsFlags::MS_BIND | MsFlags::MS_REC,
                        None::<&std::ffi::CStr>,
                    )
                    .map_err(io::Error::from)?;
                    // A bind mount takes MS_RDONLY only on a remount of itself.
                    if *read_only {
                        mount(
                            None::<&std::ffi::CStr>,
                            target.as_c_str(),
                            None::<&std::ffi::CStr>,
                            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                            None::<&std::ffi::CStr>,
                        )
                        .map_err(io::Error::from)?;
                    }
                }
            }
            if let Some(name) = &hostname {
                nix::unistd::sethostname(name).map_err(io::Error::from)?;
            }
            for cap in &drop_caps {
                // SAFETY: prctl with integer arguments only.
                #[allow(unsafe_code)]
                let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, *cap, 0, 0, 0) };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        };
        // SAFETY: the closure only makes system calls (prctl, setsid, ioctl, setns, unshare,
        // mount, sethostname) on values prepared before the fork; it does not allocate or take
        // locks.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(closure);
        }
        Ok(())
    }
}

/// The highest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap`).
fn last_capability() -> io::Result<u32> {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Sends SIGTERM (`force == false`) or SIGKILL to the process group `pgid` (a sandboxed
/// program's pid). A group that no longer exists is not an error.
pub fn signal_group(pgid: u32, force: bool) -> io::Result<()> {
    let pid = i32::try_from(pgid).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    if pid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal process group {pid}"),
        ));
    }
    let signal = if force {
        Signal::SIGKILL
    } else {
        Signal::SIGTERM
    };
    match killpg(Pid::from_raw(pid), signal) {
        Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sends SIGKILL to one process (leftovers found by `ip netns pids`). A process that no longer
/// exists is not an error.
pub fn kill_process(pid: u32) -> io::Result<()> {
    let pid = i32::try_from(pid).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    if pid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to kill process {pid}"),
        ));
    }
    match nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL) {
        Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
