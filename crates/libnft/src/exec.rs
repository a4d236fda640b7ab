//! Applying transactions (and reading the kernel's tables back) through one long-lived
//! libnftables context ([`Nft`]), in the current or a named network namespace, opened on
//! first use. The context receives exactly the text `Transaction`'s `Display` prints, the
//! text `nft -f -` would read: one atomic netlink batch. Service-neutral: the nftables
//! dataplane, the userspace dataplane's redirect table and `svcnet trace` use it alike.
//!
//! Why a context and not `nft -f -` per sync: an `nft` process pays its start-up and, after
//! any deletion, a wait in its final `close()` for an RCU grace period after the change is
//! already live (4–13 ms at 30k services, `shared/notes/nft-data-maps.md`, finding 4), so a
//! one-element change costs milliseconds where the kernel's commit costs tens of
//! microseconds; figures in README.md (`context_bench`). There is no fallback to the `nft`
//! binary: the library is what the binary runs, so a host with `nft` has it, and one
//! transport keeps one behaviour (a missing library is reported once and not retried in a
//! loop).
//!
//! The context is opened on first use and dropped after any failure ([`NftExecutor::reset`],
//! which the dataplane calls when the syncer invalidates a family): the next sync is full and
//! runs on a fresh context.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::Nft;
use crate::netlink;
use crate::tx::{Family, SetDef, Transaction};

/// Why an apply failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// libnftables is missing: retrying cannot help.
    #[error("{0}")]
    NotInstalled(crate::Error),
    /// nft rejected the transaction (the text is what `nft -f` prints); nothing was changed.
    #[error("nft rejected the transaction: {stderr}")]
    Rejected { stderr: String },
    /// The context died or could not be opened; the next sync opens a new one.
    #[error("nftables context: {0}")]
    Context(crate::Error),
}

impl From<crate::Error> for ApplyError {
    fn from(e: crate::Error) -> Self {
        match e {
            crate::Error::Rejected(stderr) => Self::Rejected { stderr },
            e @ crate::Error::NotInstalled(_) => Self::NotInstalled(e),
            e => Self::Context(e),
        }
    }
}

impl ApplyError {
    /// Whether retrying (with a full sync) may help; a missing library or namespace will not
    /// fix itself.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::NotInstalled(_) => false,
            Self::Rejected { .. } => true,
            Self::Context(e) => e.is_retryable(),
        }
    }
}

/// How a transaction reached the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Nothing to do (an empty transaction).
    None,
    /// Its text, through libnftables.
    Libnftables,
    /// One nf_tables netlink batch ([`netlink::encode`]), libnftables and its cache skipped.
    Netlink,
}

/// Applies transactions in the current or a named network namespace through one context,
/// opened on first use. Clones share the context.
#[derive(Clone, Debug, Default)]
pub struct NftExecutor {
    netns: Option<String>,
    ctx: Arc<Mutex<Option<Nft>>>,
}

impl NftExecutor {
    pub fn new(netns: Option<String>) -> Self {
        Self {
            netns,
            ctx: Arc::default(),
        }
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    fn slot(&self) -> MutexGuard<'_, Option<Nft>> {
        self.ctx.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs nft commands through the context (opening it if needed); a context that died is
    /// dropped, so the next call opens a new one.
    fn run(&self, commands: &str) -> Result<String, ApplyError> {
        let mut slot = self.slot();
        let nft = match &mut *slot {
            Some(nft) => nft,
            empty => empty.insert(Nft::open(self.netns.as_deref())?),
        };
        match nft.run(commands) {
            Ok(out) => Ok(out),
            Err(e) => {
                if matches!(e, crate::Error::Gone) {
                    *slot = None;
                }
                Err(e.into())
            }
        }
    }

    /// Checks that a context can be opened (the library loads, the namespace can be entered),
    /// for a clear error at start-up; keeps it for the first sync.
    pub fn check(&self) -> Result<(), ApplyError> {
        let mut slot = self.slot();
        if slot.is_none() {
            *slot = Some(Nft::open(self.netns.as_deref())?);
        }
        Ok(())
    }

    /// Drops the context; the next call opens a new one (after a failed sync, so that the
    /// full sync that follows starts from a fresh context).
    pub fn reset(&self) {
        *self.slot() = None;
    }

    /// Fault injection for tests: the context's thread ends as if it had died, unknown to
    /// the caller; the next apply fails (retryably) and the one after opens a new context.
    pub fn kill_context(&self) {
        if let Some(nft) = &*self.slot() {
            nft.kill();
        }
    }

    /// Applies a transaction atomically. An empty transaction is a no-op.
    pub fn apply(&self, tx: &Transaction) -> Result<(), ApplyError> {
        if tx.is_empty() {
            return Ok(());
        }
        self.run(&tx.to_string()).map(|_| ())
    }

    /// Applies a transaction atomically as [`NftExecutor::apply`] does, except that one which
    /// libnftables could only run after loading every chain and set of the namespace (it
    /// deletes: [`netlink::needs_cache`]) is sent as one netlink batch when
    /// [`netlink::encode`] knows all its operations; `known` gives the declaration of each
    /// set the kernel holds. Either way one kernel transaction.
    pub fn apply_known(
        &self,
        tx: &Transaction,
        known: &dyn Fn(&str) -> Option<SetDef>,
    ) -> Result<Transport, ApplyError> {
        if tx.is_empty() {
            return Ok(Transport::None);
        }
        if tx.ops.iter().any(netlink::needs_cache) {
            match netlink::encode(tx, known) {
                Ok(batch) => {
                    self.send_batch(batch)?;
                    return Ok(Transport::Netlink);
                }
                Err(why) => tracing::debug!("through libnftables: {why}"),
            }
        }
        self.apply(tx)?;
        Ok(Transport::Libnftables)
    }

    /// Sends a batch on the context's netlink socket (opening the context if needed).
    fn send_batch(&self, batch: netlink::Batch) -> Result<(), ApplyError> {
        let mut slot = self.slot();
        let nft = match &mut *slot {
            Some(nft) => nft,
            empty => empty.insert(Nft::open(self.netns.as_deref())?),
        };
        match nft.send_batch(batch) {
            Ok(()) => Ok(()),
            Err(e) => {
                if matches!(e, crate::Error::Gone) {
                    *slot = None;
                }
                Err(e.into())
            }
        }
    }

    /// The namespace's nf_tables generation (one per committed transaction).
    pub fn generation(&self) -> Result<u32, ApplyError> {
        let mut slot = self.slot();
        let nft = match &mut *slot {
            Some(nft) => nft,
            empty => empty.insert(Nft::open(self.netns.as_deref())?),
        };
        Ok(nft.generation()?)
    }

    /// Runs nft commands as written (a listing's text comes back): for readers of the kernel's
    /// state beside transactions (`list table`, counting chains at start-up).
    pub fn command(&self, commands: &str) -> Result<String, ApplyError> {
        self.run(commands)
    }

    /// `nft list table`; `Ok(None)` when the table does not exist.
    pub fn list_table(&self, family: Family, table: &str) -> Result<Option<String>, ApplyError> {
        match self.run(&format!("list table {} {table}", family.as_str())) {
            Ok(s) => Ok(Some(s)),
            Err(ApplyError::Rejected { stderr }) if stderr.contains("No such file") => Ok(None),
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
        match self.run(&format!("list map {} {table} {map}", family.as_str())) {
            Ok(s) => Ok(Some(s)),
            Err(ApplyError::Rejected { stderr }) if stderr.contains("No such file") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes svcnet's table (`--cleanup`); `Ok(false)` when it did not exist.
    pub fn delete_table(&self, family: Family, table: &str) -> Result<bool, ApplyError> {
        match self.run(&format!("delete table {} {table}", family.as_str())) {
            Ok(_) => Ok(true),
            Err(ApplyError::Rejected { stderr }) if stderr.contains("No such file") => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_not_retried_a_refusal_or_a_dead_context_is() {
        let missing = ApplyError::from(crate::Error::NotInstalled("no file".into()));
        assert!(!missing.is_retryable());
        assert!(
            missing.to_string().contains("apt-get install libnftables1"),
            "{missing}"
        );
        let refused = ApplyError::from(crate::Error::Rejected("Error: …".into()));
        assert!(refused.is_retryable());
        assert!(matches!(refused, ApplyError::Rejected { .. }));
        assert!(ApplyError::from(crate::Error::Gone).is_retryable());
    }
}
