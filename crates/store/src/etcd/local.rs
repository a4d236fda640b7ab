//! [`LocalEtcd`]: etcd members started from the `etcd` binary on loopback, for tests (this
//! crate's conformance suite, the API server's and the binary's end-to-end tests).
//!
//! Each cluster gets free loopback ports, a fresh data directory under the system temp dir and
//! a unique cluster token; dropping it SIGKILLs every member and removes the directory, also
//! when a test panics. Members can be killed with SIGKILL and restarted on the same data dir.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::StoreError;

/// Environment variable that makes a missing `etcd` binary a test failure instead of a skip.
pub const REQUIRE_ETCD_ENV: &str = "SVCNET_REQUIRE_ETCD";

/// The `etcd` binary (`$SVCNET_ETCD_BIN`, or `etcd` on `PATH`).
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("SVCNET_ETCD_BIN") {
        return Some(PathBuf::from(bin));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("etcd"))
            .find(|p| p.is_file())
    })
}

/// The `etcd` binary for a test, or `None` after printing why the test is skipped. Panics with
/// the reason instead when [`REQUIRE_ETCD_ENV`] is `1` (the project's test command sets it).
pub fn etcd_for_test(test: &str) -> Option<PathBuf> {
    match etcd_binary() {
        Some(bin) => Some(bin),
        None if std::env::var(REQUIRE_ETCD_ENV).as_deref() == Ok("1") => panic!(
            "{test}: no etcd binary on PATH and {REQUIRE_ETCD_ENV}=1; install Debian's \
             etcd-server (apt-get install etcd-server) or set SVCNET_ETCD_BIN"
        ),
        None => {
            // Written to the process's stderr itself, past the test harness's capture, so
            // that the skip shows in a passing run.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: no etcd binary on PATH (install etcd-server, or set \
                 {REQUIRE_ETCD_ENV}=1 to make this a failure)"
            );
            None
        }
    }
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A local etcd cluster of one or more members.
pub struct LocalEtcd {
    bin: PathBuf,
    dir: PathBuf,
    token: String,
    members: Vec<Member>,
    tls: Option<LocalTls>,
}

/// TLS on the members' client URLs (`https://`), requiring client certificates signed by
/// `ca_file` (etcd's `--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct LocalTls {
    /// The CA the members trust for clients (and clients for the members).
    pub ca_file: PathBuf,
    /// The members' serving certificate (valid for 127.0.0.1) and key.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// A client certificate and key the members accept (used to wait for readiness).
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl LocalEtcd {
    /// Starts `members` members and waits until the cluster serves a quorum read.
    pub async fn start(bin: &Path, members: usize) -> Result<Self, StoreError> {
        Self::start_with(bin, members, None).await
    }

    /// [`LocalEtcd::start`], with TLS and client-certificate authentication when given.
    pub async fn start_with(
        bin: &Path,
        members: usize,
        tls: Option<LocalTls>,
    ) -> Result<Self, StoreError> {
        let unique = format!(
            "svcnet-etcd-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(&unique);
        std::fs::create_dir_all(&dir)
            .map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
        let mut cluster = LocalEtcd {
            bin: bin.to_path_buf(),
            dir,
            token: unique,
            members: Vec::new(),
            tls,
        };
        for i in 0..members {
            cluster.members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                child: None,
            });
        }
        for i in 0..members {
            cluster.spawn(i)?;
        }
        cluster.wait_ready(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    /// Client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Connect options for a client of this cluster (its TLS, when it has some).
    fn connect_options(&self) -> Result<etcd_client::ConnectOptions, StoreError> {
        let options = etcd_client::ConnectOptions::new()
            .with_timeout(Duration::from_secs(1))
            .with_connect_timeout(Duration::from_millis(500));
        Ok(match &self.tls {
            None => options,
            Some(tls) => options.with_tls(super::tls_options(&super::EtcdTls {
                ca_file: Some(tls.ca_file.clone()),
                cert_file: Some(tls.client_cert_file.clone()),
                key_file: Some(tls.client_key_file.clone()),
            })?),
        })
    }

    /// The member that leads the cluster now, if one answers as leader.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            let Ok(options) = self.connect_options() else {
                return None;
            };
            let Ok(mut client) =
                etcd_client::Client::connect([self.endpoint(i)], Some(options)).await
            else {
                continue;
            };
            if let Ok(status) = client.status().await
                && status.leader() != 0
                && status.header().map(|h| h.member_id()) == Some(status.leader())
            {
                return Some(i);
            }
        }
        None
    }

    /// SIGKILLs member `i` (its data dir stays).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data dir and waits until the cluster serves it.
    pub async fn restart(&mut self, i: usize) -> Result<(), StoreError> {
        self.kill(i);
        self.spawn(i)?;
        self.wait_member(i, Duration::from_secs(20)).await
    }

    fn spawn(&mut self, i: usize) -> Result<(), StoreError> {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let m = &self.members[i];
        let data = self.dir.join(&m.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))
            .map_err(|e| StoreError::Backend(format!("etcd log file: {e}")))?;
        let log2 = log
            .try_clone()
            .map_err(|e| StoreError::Backend(format!("etcd log file: {e}")))?;
        let client = self.endpoint(i);
        let m = &self.members[i];
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut command = Command::new(&self.bin);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert_file)
                .arg("--key-file")
                .arg(&tls.key_file)
                .arg("--trusted-ca-file")
                .arg(&tls.ca_file)
                .arg("--client-cert-auth");
        }
        let child = command
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| StoreError::Backend(format!("starting {}: {e}", self.bin.display())))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self, within: Duration) -> Result<(), StoreError> {
        for i in 0..self.members.len() {
            self.wait_member(i, within).await?;
        }
        Ok(())
    }

    /// Waits until member `i` answers a quorum read.
    async fn wait_member(&mut self, i: usize, within: Duration) -> Result<(), StoreError> {
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < within {
            if let Some(child) = self.members[i].child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(StoreError::Backend(format!(
                    "etcd member {} exited ({status}); its log:\n{}",
                    self.members[i].name,
                    self.log(i)
                )));
            }
            let options = self.connect_options()?;
            match etcd_client::Client::connect([self.endpoint(i)], Some(options)).await {
                Ok(mut client) => match client.get("health", None).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(StoreError::Backend(format!(
            "etcd member {} not ready after {within:?} ({last}); its log:\n{}",
            self.members[i].name,
            self.log(i)
        )))
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.members[i].name)))
            .unwrap_or_default()
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> Result<u16, StoreError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| StoreError::Backend(format!("finding a free port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| StoreError::Backend(format!("finding a free port: {e}")))
}
