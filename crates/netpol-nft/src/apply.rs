//! The only I/O of this crate: applying plans through a long-lived libnftables context in
//! the node's network namespace, remembering what the kernel holds.

use std::time::{Duration, Instant};

use svcnet_libnft::{ApplyError, Family, NftExecutor, SetDef, Transport};

use crate::incremental::Changes;
use crate::names;
use crate::plan::{plan, plan_changes, plan_full, set_def};
use crate::render::Ruleset;

/// What one sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// Operations in the transaction (0: nothing changed, nothing was sent).
    pub ops: usize,
    /// Whether the whole table was (re)created.
    pub full: bool,
    /// How the transaction reached the kernel: a change that deletes goes as a netlink
    /// batch when it can, skipping libnftables' dump of every chain and set.
    pub transport: Transport,
    pub took: Duration,
}

/// Applies `tx` over `applied` (what the kernel holds, whose sets a netlink batch may use).
fn apply(
    exec: &NftExecutor,
    applied: Option<&Ruleset>,
    tx: &svcnet_libnft::Transaction,
) -> Result<Transport, ApplyError> {
    match applied {
        Some(prev) => {
            let known =
                |name: &str| -> Option<SetDef> { prev.sets.get(name).map(|s| set_def(name, s)) };
            exec.apply_known(tx, &known)
        }
        None => exec.apply(tx).map(|()| match tx.is_empty() {
            true => Transport::None,
            false => Transport::Libnftables,
        }),
    }
}

/// Enforces one node's rendered policies: applies the difference to what it applied last, as
/// one transaction; after a failure, the next sync recreates the whole table.
#[derive(Debug)]
pub struct Enforcer {
    exec: NftExecutor,
    family: Family,
    applied: Option<Ruleset>,
}

impl Enforcer {
    /// An enforcer for the named network namespace (`None`: this process's).
    pub fn new(exec: NftExecutor) -> Self {
        Self::for_family(exec, names::FAMILY)
    }

    /// An enforcer of the `family` table (`ip6` beside `ip` on a dual-stack node).
    pub fn for_family(exec: NftExecutor, family: Family) -> Self {
        Self {
            exec,
            family,
            applied: None,
        }
    }

    /// The executor (its namespace's context), for readers of the kernel's table.
    pub fn executor(&self) -> &NftExecutor {
        &self.exec
    }

    /// What was last applied successfully.
    pub fn applied(&self) -> Option<&Ruleset> {
        self.applied.as_ref()
    }

    /// Makes the kernel hold `next`.
    pub fn sync(&mut self, next: Ruleset) -> Result<SyncReport, ApplyError> {
        let start = Instant::now();
        let full = self.applied.is_none();
        let tx = plan(self.applied.as_ref(), &next);
        let ops = tx.len();
        let transport = match apply(&self.exec, self.applied.as_ref(), &tx) {
            Ok(t) => t,
            Err(e) => {
                self.applied = None;
                self.exec.reset();
                return Err(e);
            }
        };
        self.applied = Some(next);
        Ok(SyncReport {
            ops,
            full,
            transport,
            took: start.elapsed(),
        })
    }

    /// Makes the kernel hold `next`, which differs from what was applied last only in the
    /// objects `changes` names (what [`crate::Renderer`] recorded since the last sync):
    /// neither the plan nor the record of the applied table looks at anything else. After a
    /// failure, or the first time, the whole table.
    pub fn sync_changes(
        &mut self,
        next: &Ruleset,
        changes: &Changes,
    ) -> Result<SyncReport, ApplyError> {
        let start = Instant::now();
        let (tx, full) = match &self.applied {
            Some(prev) => (plan_changes(prev, next, changes), false),
            None => (plan_full(next), true),
        };
        let ops = tx.len();
        let known = if full { None } else { self.applied.as_ref() };
        let transport = match apply(&self.exec, known, &tx) {
            Ok(t) => t,
            Err(e) => {
                self.applied = None;
                self.exec.reset();
                return Err(e);
            }
        };
        match &mut self.applied {
            Some(applied) if !full => {
                for name in &changes.sets {
                    match next.sets.get(name) {
                        Some(s) => applied.sets.insert(name.clone(), s.clone()),
                        None => applied.sets.remove(name),
                    };
                }
                for name in &changes.chains {
                    match next.chains.get(name) {
                        Some(c) => applied.chains.insert(name.clone(), c.clone()),
                        None => applied.chains.remove(name),
                    };
                }
            }
            _ => self.applied = Some(next.clone()),
        }
        Ok(SyncReport {
            ops,
            full,
            transport,
            took: start.elapsed(),
        })
    }

    /// Forgets what was applied: the next sync recreates the table (a periodic resync that
    /// repairs changes made behind svcnet's back).
    pub fn invalidate(&mut self) {
        self.applied = None;
    }

    /// Removes the table; `Ok(false)` when it was not there.
    pub fn cleanup(&mut self) -> Result<bool, ApplyError> {
        self.applied = None;
        self.exec.delete_table(self.family, names::TABLE)
    }
}

/// Makes bridged traffic visible to the table: pods on one node talk across its bridge
/// without the node's routing, and only br_netfilter (`net.bridge.bridge-nf-call-iptables`,
/// per network namespace) hands those packets to the forward hook. (IPv4: svcnet's pod
/// network; a bridged dual-stack node would also need `bridge-nf-call-ip6tables`.) Loads the module when
/// the setting does not exist (a kernel where it is a module, not built in).
pub fn bridge_netfilter(netns: Option<&str>) -> Result<(), String> {
    let set = || {
        svcnet_netns::command(netns, "sysctl")
            .args(["-qw", "net.bridge.bridge-nf-call-iptables=1"])
            .output()
            .map_err(|e| format!("running sysctl: {e}"))
    };
    let out = set()?;
    if out.status.success() {
        return Ok(());
    }
    let loaded = std::process::Command::new("modprobe")
        .arg("br_netfilter")
        .output()
        .map_err(|e| format!("running modprobe br_netfilter: {e}"))?;
    let out = set()?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "cannot turn on net.bridge.bridge-nf-call-iptables ({}; modprobe br_netfilter: {}): \
         traffic between pods on one node is not filtered",
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&loaded.stderr).trim()
    ))
}
