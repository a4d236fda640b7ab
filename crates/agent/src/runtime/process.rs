//! Starting a container's process inside the pod's sandbox: the pod's network namespace, a
//! private mount namespace with the pod's `/etc/resolv.conf` and `/etc/hosts`, its own UTS
//! namespace (hostname), a new session (so the whole process group can be signalled), stdout
//! and stderr as pipes the agent records (see [`super::output`]), and SIGKILL if the agent
//! dies.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use svcnet_netns::sandbox::Sandbox;

use super::volumes::Mount;
use crate::ip;

/// Everything needed to start a process in a pod (also what `svcnet exec` reads back from
/// the pod record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSandbox {
    /// The pod's network namespace; with `host_network`, the node's own.
    pub netns: String,
    /// `hostNetwork: true`: the pod runs in the node's namespace, which it neither created
    /// nor may remove.
    #[serde(default)]
    pub host_network: bool,
    pub resolv_conf: PathBuf,
    pub hosts: PathBuf,
    pub hostname: String,
}

impl PodSandbox {
    /// A `Command` for `argv` in this sandbox with exactly `env` (nothing inherited).
    pub fn command(
        &self,
        argv: &[String],
        env: &[(String, String)],
        die_with_parent: bool,
    ) -> std::io::Result<Command> {
        self.command_with(argv, env, die_with_parent, false, &[], None)
    }

    /// [`PodSandbox::command`], with the program's stdin as its controlling terminal when
    /// `tty` (the caller gives it a pty slave as stdin, stdout and stderr), the container's
    /// volume `mounts`, and, when `caps` is given, only those capabilities (see
    /// [`super::spec::capabilities`]).
    pub fn command_with(
        &self,
        argv: &[String],
        env: &[(String, String)],
        die_with_parent: bool,
        tty: bool,
        mounts: &[Mount],
        caps: Option<u64>,
    ) -> std::io::Result<Command> {
        let (program, args) = argv.split_first().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command")
        })?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir("/");
        let mut sandbox = Sandbox::new()
            .netns(&self.netns)
            .bind(&self.resolv_conf, "/etc/resolv.conf")
            .bind(&self.hosts, "/etc/hosts")
            .hostname(&self.hostname);
        for m in mounts {
            sandbox = if m.read_only {
                sandbox.bind_read_only(&m.source, &m.target)
            } else {
                sandbox.bind(&m.source, &m.target)
            };
        }
        if die_with_parent {
            sandbox = sandbox.die_with_parent();
        }
        if tty {
            sandbox = sandbox.controlling_tty();
        }
        if let Some(keep) = caps {
            sandbox = sandbox.capabilities(keep);
        }
        sandbox
            .apply(&mut cmd)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(cmd)
    }
}

/// How a container's process is started: a piped stdin, a terminal, its volume mounts and its
/// capabilities (`None`: all, see [`super::spec::capabilities`]).
#[derive(Debug, Clone, Copy)]
pub struct SpawnSpec<'a> {
    pub stdin: bool,
    pub tty: bool,
    pub mounts: &'a [Mount],
    pub caps: Option<u64>,
}

/// A started container: the process, its log file opened for appending, and with `tty: true`
/// the master of the terminal it runs on.
pub struct Spawned {
    pub child: tokio::process::Child,
    pub log: std::fs::File,
    pub terminal: Option<std::fs::File>,
}

/// Starts a container process with piped stdout and stderr (and stdin, when `stdin`), or on a
/// new terminal when `tty` (its controlling terminal, as a runtime gives `tty: true`), and
/// opens `log` for appending its records. Call from an async task (not `spawn_blocking`): the
/// child is killed when the thread that started it exits.
pub fn spawn(
    sandbox: &PodSandbox,
    argv: &[String],
    env: &[(String, String)],
    log: &Path,
    how: &SpawnSpec<'_>,
) -> std::io::Result<Spawned> {
    let SpawnSpec {
        stdin,
        tty,
        mounts,
        caps,
    } = *how;
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)?;
    let mut cmd = sandbox.command_with(argv, env, true, tty, mounts, caps)?;
    if tty {
        let pty = svcnet_netns::pty::Pty::open(24, 80)?;
        cmd.stdin(pty.slave.try_clone()?)
            .stdout(pty.slave.try_clone()?)
            .stderr(pty.slave);
        let child = tokio::process::Command::from(cmd).spawn()?;
        // Only the child keeps the slave open (the command held the other copies), so the
        // master reads the end once the child and what it started are gone.
        return Ok(Spawned {
            child,
            log: file,
            terminal: Some(pty.master),
        });
    }
    let input = if stdin { Stdio::piped() } else { Stdio::null() };
    cmd.stdin(input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = tokio::process::Command::from(cmd).spawn()?;
    Ok(Spawned {
        child,
        log: file,
        terminal: None,
    })
}

/// Sends SIGTERM (or SIGKILL when `force`) to a container's process group.
pub fn signal(pgid: u32, force: bool) {
    if let Err(e) = svcnet_netns::sandbox::signal_group(pgid, force) {
        tracing::warn!(pgid, force, "signal: {e}");
    }
}

/// Kills whatever still runs in a pod namespace and removes it (missing is fine).
pub fn remove_netns(netns: &str) {
    if !ip::netns_list()
        .unwrap_or_default()
        .iter()
        .any(|n| n == netns)
    {
        return;
    }
    for pid in ip::netns_pids(netns).unwrap_or_default() {
        let _ = svcnet_netns::sandbox::kill_process(pid);
    }
    if let Err(e) = ip::ip_del(None, &["netns", "del", netns]) {
        tracing::warn!("removing namespace {netns}: {e}");
    }
}
