//! The BGP speakers of Calico's BGP pod network ([`super::bgp`]): one BIRD 2 process per node,
//! in the node's namespace, a child of the process that starts it (SIGKILLed if that dies), with
//! its config, control socket, pid file and log in `<data dir>/bird/<node>/`; reloaded through
//! its control socket (`birdc configure`); stopped with SIGTERM (a Cease to its peers). What a
//! crash leaves (a live BIRD by pid file, the routes a killed BIRD installed) is removed by
//! [`cleanup_speakers`], `svcnet down`'s part. The distribution's `bird.service` is never used.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The BGP speaker Calico runs (Debian package `bird2`).
pub const BIRD: &str = "bird";
/// BIRD's control client.
pub const BIRDC: &str = "birdc";
/// Where a data dir keeps the speakers' run dirs, one per node.
pub const BIRD_DIR: &str = "bird";

/// A failure of a speaker.
#[derive(Debug, thiserror::Error)]
pub enum BgpError {
    #[error("bgp speaker of {node}: {what}: {source}")]
    Io {
        node: String,
        what: String,
        source: std::io::Error,
    },
    #[error("bgp speaker of {node}: {what}")]
    Failed { node: String, what: String },
}

/// The files of one node's speaker.
#[derive(Debug, Clone)]
pub struct SpeakerPaths {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub control: PathBuf,
    pub pid: PathBuf,
    pub log: PathBuf,
    /// The namespace it runs in (read by [`cleanup_speakers`]).
    pub netns: PathBuf,
}

impl SpeakerPaths {
    pub fn new(data_dir: &Path, node: &str) -> Self {
        let dir = data_dir.join(BIRD_DIR).join(node);
        Self {
            config: dir.join("bird.conf"),
            control: dir.join("bird.ctl"),
            pid: dir.join("bird.pid"),
            log: dir.join("bird.log"),
            netns: dir.join("netns"),
            dir,
        }
    }
}

/// A running BIRD in a node's namespace. Dropping it stops it (SIGTERM: it sends a Cease to
/// its peers, which withdraw its routes at once).
#[derive(Debug)]
pub struct Speaker {
    node: String,
    paths: SpeakerPaths,
    pid: u32,
    waiter: Option<std::thread::JoinHandle<()>>,
}

impl Speaker {
    /// Starts BIRD in `netns` with `config`, in `<data_dir>/bird/<node>/`, and waits until its
    /// control socket answers. A leftover speaker of the same node is stopped first.
    pub fn start(data_dir: &Path, node: &str, netns: &str, config: &str) -> Result<Self, BgpError> {
        let paths = SpeakerPaths::new(data_dir, node);
        let io = |what: &str, source| BgpError::Io {
            node: node.to_string(),
            what: what.to_string(),
            source,
        };
        // A Unix socket path holds at most 107 bytes.
        if paths.control.as_os_str().len() > 107 {
            return Err(BgpError::Failed {
                node: node.into(),
                what: format!(
                    "control socket path {} is longer than a Unix socket allows (107 bytes): use a shorter --data-dir",
                    paths.control.display()
                ),
            });
        }
        stop_leftover(&paths);
        std::fs::create_dir_all(&paths.dir).map_err(|e| io("create run dir", e))?;
        std::fs::write(&paths.netns, netns).map_err(|e| io("write netns file", e))?;
        write_config(&paths, config).map_err(|e| io("write bird.conf", e))?;
        let log = std::fs::File::create(&paths.log).map_err(|e| io("create bird.log", e))?;
        let mut cmd = Command::new(BIRD);
        cmd.arg("-f")
            .arg("-c")
            .arg(&paths.config)
            .arg("-s")
            .arg(&paths.control)
            .arg("-P")
            .arg(&paths.pid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // Its own session (so it can be signalled as a group), in the node's namespace, and
        // SIGKILLed if the thread that started it dies: a dedicated thread that lives exactly
        // as long as BIRD (it waits for it), so a `kill -9` of svcnet takes BIRD along.
        svcnet_netns::sandbox::Sandbox::new()
            .netns(netns)
            .die_with_parent()
            .apply(&mut cmd)
            .map_err(|e| BgpError::Failed {
                node: node.into(),
                what: e.to_string(),
            })?;
        let (tx, rx) = std::sync::mpsc::channel();
        let label = node.to_string();
        let waiter = std::thread::Builder::new()
            .name(format!("bird-{node}"))
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(child.id()));
                    match child.wait() {
                        Ok(status) => tracing::info!(node = %label, %status, "bird exited"),
                        Err(e) => tracing::warn!(node = %label, "waiting for bird: {e}"),
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            })
            .map_err(|e| io("start thread", e))?;
        let pid = match rx.recv() {
            Ok(Ok(pid)) => pid,
            Ok(Err(e)) => {
                let _ = waiter.join();
                let what = if e.kind() == std::io::ErrorKind::NotFound {
                    "start bird (not installed? apt-get install -y bird2)"
                } else {
                    "start bird"
                };
                return Err(io(what, e));
            }
            Err(_) => {
                return Err(BgpError::Failed {
                    node: node.into(),
                    what: "the thread starting bird died".into(),
                });
            }
        };
        let speaker = Speaker {
            node: node.to_string(),
            paths,
            pid,
            waiter: Some(waiter),
        };
        speaker.wait_ready(Duration::from_secs(10))?;
        tracing::info!(node, pid, "bird started");
        Ok(speaker)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn paths(&self) -> &SpeakerPaths {
        &self.paths
    }

    fn running(&self) -> bool {
        self.waiter.as_ref().is_some_and(|w| !w.is_finished())
    }

    fn wait_ready(&self, timeout: Duration) -> Result<(), BgpError> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.running() {
                return Err(BgpError::Failed {
                    node: self.node.clone(),
                    what: format!("bird exited at start: {}", self.log_tail()),
                });
            }
            if self.birdc(&["show", "status"]).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BgpError::Failed {
                    node: self.node.clone(),
                    what: format!("no answer on {}", self.paths.control.display()),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The end of its log, for error messages.
    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.paths.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Runs `birdc -s <socket> args...`; its output, or an error with it.
    pub fn birdc(&self, args: &[&str]) -> Result<String, BgpError> {
        let out = Command::new(BIRDC)
            .arg("-s")
            .arg(&self.paths.control)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| BgpError::Io {
                node: self.node.clone(),
                what: "run birdc".into(),
                source: e,
            })?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(BgpError::Failed {
                node: self.node.clone(),
                what: format!(
                    "birdc {}: {}{}",
                    args.join(" "),
                    text.trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(text)
    }

    /// Replaces the config and reloads it (`birdc configure`); a config BIRD rejects leaves the
    /// running one in place and is an error naming BIRD's complaint.
    pub fn configure(&self, config: &str) -> Result<(), BgpError> {
        write_config(&self.paths, config).map_err(|e| BgpError::Io {
            node: self.node.clone(),
            what: "write bird.conf".into(),
            source: e,
        })?;
        let out = self.birdc(&["configure"])?;
        if out.contains("Reconfigured") || out.contains("Reconfiguration in progress") {
            Ok(())
        } else {
            Err(BgpError::Failed {
                node: self.node.clone(),
                what: format!("birdc configure: {}", out.trim()),
            })
        }
    }

    /// Stops BIRD (SIGTERM, SIGKILL after 5 s) and waits for it.
    pub fn stop(mut self) {
        self.shutdown(false);
    }

    /// Kills BIRD at once (SIGKILL: no Cease, so peers keep its routes for the graceful restart
    /// time), as a crash would.
    pub fn kill(mut self) {
        self.shutdown(true);
    }

    fn shutdown(&mut self, force: bool) {
        let Some(waiter) = self.waiter.take() else {
            return;
        };
        let _ = svcnet_netns::sandbox::signal_group(self.pid, force);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !waiter.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !waiter.is_finished() {
            let _ = svcnet_netns::sandbox::signal_group(self.pid, true);
        }
        let _ = waiter.join();
        let _ = std::fs::remove_file(&self.paths.pid);
    }
}

impl Drop for Speaker {
    fn drop(&mut self) {
        self.shutdown(false);
    }
}

fn write_config(paths: &SpeakerPaths, config: &str) -> std::io::Result<()> {
    let tmp = paths.config.with_extension("conf.tmp");
    std::fs::write(&tmp, config)?;
    std::fs::rename(&tmp, &paths.config)
}

/// The pid in a speaker's pid file, if that process is still a BIRD.
fn live_bird(pid_file: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == BIRD && pid > 1).then_some(pid)
}

/// Stops the BIRD a pid file names (SIGTERM, then SIGKILL after 2 s); whether there was one.
fn stop_leftover(paths: &SpeakerPaths) -> Option<u32> {
    let pid = live_bird(&paths.pid)?;
    let _ = svcnet_netns::sandbox::signal_group(pid, false);
    let deadline = Instant::now() + Duration::from_secs(2);
    while live_bird(&paths.pid) == Some(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if live_bird(&paths.pid) == Some(pid) {
        let _ = svcnet_netns::sandbox::kill_process(pid);
    }
    Some(pid)
}

/// What [`cleanup_speakers`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SpeakerCleanup {
    pub killed: Vec<u32>,
    /// `node: route` for every BIRD route removed from a node namespace.
    pub routes: Vec<String>,
}

/// `svcnet down`'s part for BGP: stops every speaker left under `<data_dir>/bird/` (by pid
/// file, also after a `kill -9` of `svcnet up`), removes the routes BIRD installed in their
/// namespaces (`proto bird`, which a killed BIRD leaves) and the run dirs. Safe to run any
/// number of times.
pub fn cleanup_speakers(data_dir: &Path) -> std::io::Result<SpeakerCleanup> {
    let mut report = SpeakerCleanup::default();
    let root = data_dir.join(BIRD_DIR);
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let node = entry.file_name().to_string_lossy().into_owned();
        let paths = SpeakerPaths::new(data_dir, &node);
        if let Some(pid) = stop_leftover(&paths) {
            report.killed.push(pid);
        }
        if let Ok(netns) = std::fs::read_to_string(&paths.netns) {
            let netns = netns.trim();
            if crate::ip::netns_list()
                .unwrap_or_default()
                .iter()
                .any(|n| n == netns)
            {
                let routes = crate::ip::ip(Some(netns), &["route", "show", "proto", "bird"])
                    .unwrap_or_default();
                for route in routes.lines().filter(|l| !l.trim().is_empty()) {
                    let dst = route.split_whitespace().next().unwrap_or_default();
                    if crate::ip::ip_del(Some(netns), &["route", "del", dst, "proto", "bird"])
                        .is_ok()
                    {
                        report.routes.push(format!("{node}: {}", route.trim()));
                    }
                }
            }
        }
        std::fs::remove_dir_all(entry.path())?;
    }
    std::fs::remove_dir(&root)?;
    Ok(report)
}
