//! Applying transactions to the kernel with `nft -f -` (atomic: the whole text is one netlink
//! batch), optionally inside a named network namespace (`ip netns exec`). The only I/O in
//! this crate.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::tx::{Family, Transaction};

/// Why an apply failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The `nft` (or `ip`) binary is missing.
    #[error("{program} not found; install it (Debian/Ubuntu: `apt-get install {package}`)")]
    NotInstalled {
        program: String,
        package: &'static str,
    },
    /// nft rejected the transaction; nothing was changed.
    #[error("nft rejected the transaction (exit {status}): {stderr}")]
    Rejected { status: i32, stderr: String },
    #[error("running nft: {0}")]
    Io(#[from] std::io::Error),
}

impl ApplyError {
    /// Whether retrying (with a full sync) may help; a missing binary will not fix itself.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::NotInstalled { .. })
    }
}

/// Runs `nft`, in the current or a named network namespace.
#[derive(Clone, Debug, Default)]
pub struct NftExecutor {
    netns: Option<String>,
}

impl NftExecutor {
    pub fn new(netns: Option<String>) -> Self {
        Self { netns }
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    fn command(&self, args: &[&str]) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "nft"]).args(args);
                c
            }
            None => {
                let mut c = Command::new("nft");
                c.args(args);
                c
            }
        }
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, ApplyError> {
        let mut cmd = self.command(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                let (program, package) = if self.netns.is_some() {
                    ("ip", "iproute2")
                } else {
                    ("nft", "nftables")
                };
                ApplyError::NotInstalled {
                    program: program.into(),
                    package,
                }
            }
            _ => ApplyError::Io(e),
        })?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            if stderr.contains("exec of \"nft\" failed") || stderr.contains("exec of nft failed") {
                return Err(ApplyError::NotInstalled {
                    program: "nft".into(),
                    package: "nftables",
                });
            }
            return Err(ApplyError::Rejected {
                status: out.status.code().unwrap_or(-1),
                stderr,
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Checks that nft can run (for a clear error at start-up).
    pub fn check(&self) -> Result<(), ApplyError> {
        self.run(&["--version"], None).map(|_| ())
    }

    /// Applies a transaction atomically. An empty transaction is a no-op.
    pub fn apply(&self, tx: &Transaction) -> Result<(), ApplyError> {
        if tx.is_empty() {
            return Ok(());
        }
        self.run(&["-f", "-"], Some(&tx.to_string())).map(|_| ())
    }

    /// `nft list table`; `Ok(None)` when the table does not exist.
    pub fn list_table(&self, family: Family, table: &str) -> Result<Option<String>, ApplyError> {
        match self.run(&["list", "table", family.as_str(), table], None) {
            Ok(s) => Ok(Some(s)),
            Err(ApplyError::Rejected { stderr, .. }) if stderr.contains("No such file") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `nft list map` (or set); `Ok(None)` when it does not exist.
    pub fn list_map(
        &self,
        family: Family,
        table: &str,
        map: &str,
    ) -> Result<Option<String>, ApplyError> {
        match self.run(&["list", "map", family.as_str(), table, map], None) {
            Ok(s) => Ok(Some(s)),
            Err(ApplyError::Rejected { stderr, .. }) if stderr.contains("No such file") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes svcnet's table (`--cleanup`); `Ok(false)` when it did not exist.
    pub fn delete_table(&self, family: Family, table: &str) -> Result<bool, ApplyError> {
        match self.run(&["delete", "table", family.as_str(), table], None) {
            Ok(_) => Ok(true),
            Err(ApplyError::Rejected { stderr, .. }) if stderr.contains("No such file") => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
