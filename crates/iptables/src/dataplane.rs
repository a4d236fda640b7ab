//! The iptables dataplane behind the dataplane contract ([`svcnet_proxy::Dataplane`]): per
//! family a [`Renderer`] (memory of what was applied) and one [`IptablesExecutor`]. The
//! syncer decides full or partial; this dataplane adds kube-proxy's canary (a full sync when
//! the `SVCNET-PROXY-CANARY` chain is gone: someone flushed the tables) and lists svcnet's
//! chains before a full sync whose kernel state is unknown, so stale ones are deleted.

use std::collections::BTreeMap;

use svcnet_lb::Fallback;
use svcnet_proxy::{
    Capability, Changes, Dataplane, DesiredFamily, DesiredNode, FullReason, IpFamily,
    ServicePortName,
};

use crate::apply::{ApplyError, Backend, IptablesExecutor};
use crate::payload::Family;
use crate::plan::{Plan, Renderer};
use crate::render::IptablesCapability;

/// Per-service chains per staged commit on the nft back end (see `plan::stage`).
pub const STAGE_CHAINS: usize = 1000;

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
    /// The staging of large payloads every renderer uses.
    staging: Option<usize>,
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
        Self {
            exec,
            renderers,
            staging,
        }
    }

    /// Overrides the staging of large payloads (default: [`STAGE_CHAINS`] on the nft back
    /// end, none on legacy); the next plans use it.
    pub fn set_staging(&mut self, max_chains: Option<usize>) {
        self.staging = max_chains;
        for r in self.renderers.values_mut() {
            r.set_staging(max_chains);
        }
    }

    pub fn executor(&self) -> &IptablesExecutor {
        &self.exec
    }

    fn renderer(&mut self, family: Family) -> &mut Renderer {
        let staging = self.staging;
        self.renderers.entry(family).or_insert_with(|| {
            let mut r = Renderer::new(family);
            r.set_staging(staging);
            r
        })
    }
}

impl Dataplane for IptablesDataplane {
    type Plan = Plan;
    type Error = SyncError;

    fn name(&self) -> &'static str {
        svcnet_lb::Dataplane::Iptables.as_str()
    }

    fn families(&self) -> Vec<IpFamily> {
        self.renderers.keys().map(|f| IpFamily::from(*f)).collect()
    }

    fn capability(&self) -> &dyn Capability {
        &IptablesCapability
    }

    fn needs_full(&mut self, family: IpFamily) -> Result<Option<FullReason>, SyncError> {
        let family = Family::from(family);
        let present = self
            .exec
            .canary_present(family)
            .map_err(|source| SyncError { family, source })?;
        if present {
            return Ok(None);
        }
        tracing::warn!(%family, "svcnet canary chain missing: tables were flushed, resyncing in full");
        Ok(Some(FullReason::Damaged("canary chain missing")))
    }

    fn plan_full(
        &mut self,
        family: IpFamily,
        desired: &DesiredFamily,
        why: FullReason,
    ) -> Result<Plan, SyncError> {
        let family = Family::from(family);
        // Unknown kernel state: list svcnet's chains so stale ones get deleted.
        let kernel = if why == FullReason::Periodic {
            None
        } else {
            Some(
                self.exec
                    .kernel_chains(family)
                    .map_err(|source| SyncError { family, source })?,
            )
        };
        Ok(self.renderer(family).plan_full(desired, kernel.as_ref()))
    }

    fn plan_partial(
        &self,
        family: IpFamily,
        node: &DesiredNode,
        changes: &Changes,
    ) -> Option<Plan> {
        self.renderers
            .get(&Family::from(family))?
            .plan_partial(node, changes)
    }

    fn is_full(plan: &Plan) -> bool {
        plan.is_full()
    }

    fn apply(&mut self, family: IpFamily, plan: &Plan) -> Result<(), SyncError> {
        self.exec.apply(plan).map_err(|source| SyncError {
            family: Family::from(family),
            source,
        })
    }

    fn commit(&mut self, family: IpFamily, mut plan: Plan) -> Vec<(ServicePortName, Fallback)> {
        let fallbacks = std::mem::take(&mut plan.fallbacks);
        self.renderer(Family::from(family)).commit(plan);
        fallbacks
    }

    fn invalidate(&mut self, family: IpFamily) {
        self.renderer(Family::from(family)).invalidate();
    }

    fn service_ports(&self, family: IpFamily) -> usize {
        self.renderers
            .get(&Family::from(family))
            .map_or(0, Renderer::service_ports)
    }

    /// Removes everything this dataplane's back end installed, in every family.
    fn cleanup(&mut self) -> Result<(), SyncError> {
        for (family, r) in self.renderers.iter_mut() {
            r.invalidate();
            self.exec.cleanup(*family).map_err(|source| SyncError {
                family: *family,
                source,
            })?;
        }
        Ok(())
    }

    fn is_retryable(error: &SyncError) -> bool {
        error.is_retryable()
    }
}
