//! The nftables dataplane behind the dataplane contract ([`svcnet_proxy::Dataplane`]): per
//! family a [`Renderer`] (the memory of what was applied) and one [`NftExecutor`]. A full
//! sync recreates the table when its state is unknown (first sync, after a failure) and
//! re-asserts every object otherwise (periodic resync, node change), keeping the affinity
//! maps; after any plan that takes endpoints away from affinity frontends, `apply` deletes
//! the affinity entries pinning clients to them.

use std::collections::BTreeMap;

use svcnet_lb::Fallback;
use svcnet_proxy::{
    Capability, Changes, Dataplane, DesiredFamily, DesiredNode, FullReason, IpFamily,
    ServicePortName,
};

use crate::affinity;
use crate::apply::{ApplyError, NftExecutor};
use crate::plan::{FullMode, Plan, Renderer};
use crate::render::NftCapability;

/// The nftables dataplane of one node (or one named network namespace).
#[derive(Debug)]
pub struct NftDataplane {
    exec: NftExecutor,
    table: String,
    renderers: BTreeMap<IpFamily, Renderer>,
}

impl NftDataplane {
    /// A dataplane programming `table` in both families.
    pub fn new(exec: NftExecutor, table: &str) -> Self {
        let renderers = IpFamily::ALL
            .into_iter()
            .map(|f| (f, Renderer::with_table(crate::family_of(f), table)))
            .collect();
        Self {
            exec,
            table: table.to_string(),
            renderers,
        }
    }

    pub fn executor(&self) -> &NftExecutor {
        &self.exec
    }

    fn renderer(&mut self, family: IpFamily) -> &mut Renderer {
        self.renderers
            .entry(family)
            .or_insert_with(|| Renderer::with_table(crate::family_of(family), &self.table))
    }
}

impl Dataplane for NftDataplane {
    type Plan = Plan;
    type Error = ApplyError;

    fn name(&self) -> &'static str {
        svcnet_lb::Dataplane::Nftables.as_str()
    }

    fn families(&self) -> Vec<IpFamily> {
        self.renderers.keys().copied().collect()
    }

    fn capability(&self) -> &dyn Capability {
        &NftCapability
    }

    fn plan_full(
        &mut self,
        family: IpFamily,
        desired: &DesiredFamily,
        why: FullReason,
    ) -> Result<Plan, ApplyError> {
        // Unknown kernel state: delete and recreate the table in the same transaction.
        let mode = if why == FullReason::Unknown {
            FullMode::Recreate
        } else {
            FullMode::Reassert
        };
        Ok(self.renderer(family).plan_full(desired, mode))
    }

    fn plan_partial(
        &self,
        family: IpFamily,
        node: &DesiredNode,
        changes: &Changes,
    ) -> Option<Plan> {
        self.renderers.get(&family)?.plan_partial(node, changes)
    }

    fn is_full(plan: &Plan) -> bool {
        plan.is_full()
    }

    fn apply(&mut self, family: IpFamily, plan: &Plan) -> Result<(), ApplyError> {
        self.exec.apply(&plan.tx)?;
        // Once the change is live, no client stays pinned to an endpoint it took away.
        let family = crate::family_of(family);
        for map in affinity::maps(&plan.affinity_purge) {
            let Some(listing) = self.exec.list_map(family, &self.table, map)? else {
                continue;
            };
            let tx = affinity::purge(family, &self.table, map, &listing, &plan.affinity_purge)
                .map_err(|e| ApplyError::Rejected {
                    stderr: format!("reading affinity map {map}: {e}"),
                })?;
            self.exec.apply(&tx)?;
        }
        Ok(())
    }

    fn commit(&mut self, family: IpFamily, mut plan: Plan) -> Vec<(ServicePortName, Fallback)> {
        let fallbacks = std::mem::take(&mut plan.fallbacks);
        self.renderer(family).commit(plan);
        fallbacks
    }

    fn invalidate(&mut self, family: IpFamily) {
        self.renderer(family).invalidate();
        // The full sync that follows runs on a fresh context (a failure may have been the
        // context's own).
        self.exec.reset();
    }

    fn service_ports(&self, family: IpFamily) -> usize {
        self.renderers
            .get(&family)
            .map_or(0, Renderer::service_ports)
    }

    fn cleanup(&mut self) -> Result<(), ApplyError> {
        for family in IpFamily::ALL {
            self.renderer(family).invalidate();
            self.exec
                .delete_table(crate::family_of(family), &self.table)?;
        }
        Ok(())
    }

    fn is_retryable(error: &ApplyError) -> bool {
        error.is_retryable()
    }
}
