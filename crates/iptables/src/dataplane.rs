//! The iptables dataplane as the proxy runtime drives it: per family a [`Renderer`] (memory
//! of what was applied) and one [`IptablesExecutor`], and the sync decision kube-proxy makes —
//! a full sync on the first run, when forced (the periodic resync), when the node changed,
//! after any failure, or when the canary chain is gone (someone flushed the tables);
//! otherwise a partial sync of the changed services. Families are independent: a failure in
//! one never blocks the other.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use svcnet_lb::Fallback;
use svcnet_proxy::{ChangeSet, IpFamily, ProxyState, ServicePortName};

use crate::apply::{ApplyError, Backend, IptablesExecutor};

/// Per-service chains per staged commit on the nft back end (see `plan::stage`).
pub const STAGE_CHAINS: usize = 1000;
use crate::payload::{Family, Table};
use crate::plan::Renderer;

/// What one family's sync did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncReport {
    pub family: Family,
    pub full: bool,
    /// Why the sync was full (`None` for partial syncs).
    pub full_reason: Option<&'static str>,
    /// Rules written (nat, filter).
    pub rules: (usize, usize),
    pub elapsed: Duration,
    /// Algorithms this sync's rules could not express (see [`crate::Plan::fallbacks`]).
    pub fallbacks: Vec<(ServicePortName, Fallback)>,
    /// Service ports programmed in this family after the sync.
    pub service_ports: usize,
}

/// A failed sync of one family; the next sync of that family is full.
#[derive(Debug, thiserror::Error)]
#[error("iptables sync of {family}: {source}")]
pub struct SyncError {
    pub family: Family,
    #[source]
    pub source: ApplyError,
}

impl SyncError {
    pub fn is_retryable(&self) -> bool {
        self.source.is_retryable()
    }
}

/// The iptables dataplane of one node (or one named network namespace).
#[derive(Debug)]
pub struct IptablesDataplane {
    exec: IptablesExecutor,
    renderers: BTreeMap<Family, Renderer>,
}

impl IptablesDataplane {
    /// A dataplane for both families.
    pub fn new(exec: IptablesExecutor) -> Self {
        Self::with_families(exec, &Family::ALL)
    }

    pub fn with_families(exec: IptablesExecutor, families: &[Family]) -> Self {
        let staging = match exec.backend() {
            Backend::Nft => Some(STAGE_CHAINS),
            // Each legacy commit copies the whole table: staging would only add copies.
            Backend::Legacy => None,
        };
        let renderers = families
            .iter()
            .map(|f| {
                let mut r = Renderer::new(*f);
                r.set_staging(staging);
                (*f, r)
            })
            .collect();
        Self { exec, renderers }
    }

    /// Overrides the staging of large payloads (default: [`STAGE_CHAINS`] on the nft back
    /// end, none on legacy); the next plans use it.
    pub fn set_staging(&mut self, max_chains: Option<usize>) {
        for r in self.renderers.values_mut() {
            r.set_staging(max_chains);
        }
    }

    pub fn executor(&self) -> &IptablesExecutor {
        &self.exec
    }

    /// Syncs every family: `changes` are the changes taken from `state` since the last sync.
    pub fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
        force_full: bool,
    ) -> Vec<Result<SyncReport, SyncError>> {
        let families: Vec<Family> = self.renderers.keys().copied().collect();
        families
            .into_iter()
            .map(|f| self.sync_family(f, state, changes, force_full))
            .collect()
    }

    fn sync_family(
        &mut self,
        family: Family,
        state: &ProxyState,
        changes: &ChangeSet,
        force_full: bool,
    ) -> Result<SyncReport, SyncError> {
        let start = Instant::now();
        let err = |source| SyncError { family, source };
        let ipf = IpFamily::from(family);
        let exec = &self.exec;
        let Some(r) = self.renderers.get_mut(&family) else {
            return Err(err(ApplyError::Rejected {
                program: "svcnet".into(),
                status: -1,
                stderr: format!("family {family} is not managed"),
            }));
        };
        let mut reason = if !r.has_applied() {
            Some("first sync or previous failure")
        } else if force_full {
            Some("periodic resync")
        } else if changes.node_changed {
            Some("node changed")
        } else {
            None
        };
        if reason.is_none() && !exec.canary_present(family).map_err(err)? {
            tracing::warn!(%family, "svcnet canary chain missing: tables were flushed, resyncing in full");
            reason = Some("canary chain missing");
        }
        let plan = match reason {
            None => r.plan_partial(
                &state.node_state(ipf),
                &state.desired_for(ipf, changes.services.keys()),
            ),
            Some(_) => None,
        };
        let plan = match plan {
            Some(p) => p,
            None => {
                reason = reason.or(Some("node settings changed"));
                // Unknown kernel state: list svcnet's chains so stale ones get deleted.
                let kernel = if reason == Some("periodic resync") {
                    None
                } else {
                    Some(exec.kernel_chains(family).map_err(err)?)
                };
                r.plan_full(&state.desired(ipf), kernel.as_ref())
            }
        };
        let rules = (
            plan.payload.rule_count(Table::Nat),
            plan.payload.rule_count(Table::Filter),
        );
        let full = plan.is_full();
        let fallbacks = plan.fallbacks.clone();
        match exec.apply(&plan) {
            Ok(()) => r.commit(plan),
            Err(e) => {
                r.invalidate();
                return Err(err(e));
            }
        }
        Ok(SyncReport {
            family,
            full,
            full_reason: if full { reason } else { None },
            rules,
            elapsed: start.elapsed(),
            fallbacks,
            service_ports: r.service_ports(),
        })
    }

    /// Removes everything this dataplane's back end installed, in every family.
    pub fn cleanup(&mut self) -> Result<(), SyncError> {
        for (family, r) in self.renderers.iter_mut() {
            r.invalidate();
            self.exec.cleanup(*family).map_err(|source| SyncError {
                family: *family,
                source,
            })?;
        }
        Ok(())
    }
}
