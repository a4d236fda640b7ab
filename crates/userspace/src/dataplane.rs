//! The userspace dataplane behind the dataplane contract ([`svcnet_proxy::Dataplane`]). The
//! proxy diffs its listeners and routes itself, so every plan is the whole desired state of
//! one family (there is no partial plan) and applying it syncs the proxy with that family's
//! new state and the other family's last applied one. [`Dataplane::apply`] blocks on the
//! proxy's async sync through the runtime handle given at construction, so it must run on a
//! blocking thread (the syncer runs it there), never on a runtime worker.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use svcnet_lb::Fallback;
use svcnet_proxy::{
    Capability, Changes, Dataplane, DesiredFamily, DesiredNode, FullReason, IpFamily,
    ServicePortName,
};

use crate::error::UserspaceError;
use crate::proxy::{SyncReport, UserspaceProxy};
use crate::table::{Mode, UserspaceCapability, routes};

/// One family's whole desired state; it prints as the routes it gives (computed only when
/// printed: the proxy's sync computes them again anyway).
pub struct UserspacePlan {
    desired: DesiredFamily,
    mode: Mode,
}

impl fmt::Display for UserspacePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in routes(std::slice::from_ref(&self.desired), &self.mode) {
            writeln!(
                f,
                "{} {:?} {} endpoints={} frontends={}",
                r.key.service,
                r.key.class,
                r.algorithm,
                r.endpoints.len(),
                r.frontends.len()
            )?;
        }
        Ok(())
    }
}

/// The userspace dataplane: the proxy and what each family last applied.
pub struct UserspaceDataplane {
    proxy: Arc<UserspaceProxy>,
    runtime: tokio::runtime::Handle,
    applied: BTreeMap<IpFamily, DesiredFamily>,
    /// The report of the last successful apply, until its commit.
    report: Option<SyncReport>,
}

impl UserspaceDataplane {
    pub fn new(proxy: Arc<UserspaceProxy>, runtime: tokio::runtime::Handle) -> Self {
        Self {
            proxy,
            runtime,
            applied: BTreeMap::new(),
            report: None,
        }
    }

    pub fn proxy(&self) -> &Arc<UserspaceProxy> {
        &self.proxy
    }
}

impl Dataplane for UserspaceDataplane {
    type Plan = UserspacePlan;
    type Error = UserspaceError;

    fn name(&self) -> &'static str {
        svcnet_lb::Dataplane::Userspace.as_str()
    }

    fn families(&self) -> Vec<IpFamily> {
        IpFamily::ALL.to_vec()
    }

    fn capability(&self) -> &dyn Capability {
        &UserspaceCapability
    }

    fn plan_full(
        &mut self,
        _family: IpFamily,
        desired: &DesiredFamily,
        _why: FullReason,
    ) -> Result<UserspacePlan, UserspaceError> {
        Ok(UserspacePlan {
            desired: desired.clone(),
            mode: self.proxy.config().mode.clone(),
        })
    }

    /// Never: the proxy diffs its listeners itself, from a family's whole state.
    fn plan_partial(&self, _: IpFamily, _: &DesiredNode, _: &Changes) -> Option<UserspacePlan> {
        None
    }

    fn is_full(_: &UserspacePlan) -> bool {
        true
    }

    fn apply(&mut self, family: IpFamily, plan: &UserspacePlan) -> Result<(), UserspaceError> {
        let mut families: Vec<DesiredFamily> = self
            .applied
            .iter()
            .filter(|(f, _)| **f != family)
            .map(|(_, d)| d.clone())
            .collect();
        families.push(plan.desired.clone());
        let report = self.runtime.block_on(self.proxy.sync(&families))?;
        // Frontends that could not be bound were logged by the proxy (once each, with what
        // to do) and are retried with back-off; the rest applied.
        self.report = Some(report);
        Ok(())
    }

    fn commit(
        &mut self,
        family: IpFamily,
        plan: UserspacePlan,
    ) -> Vec<(ServicePortName, Fallback)> {
        let report = self.report.take().unwrap_or_default();
        let fallbacks = report
            .fallbacks
            .into_iter()
            .filter(|(spn, _)| plan.desired.services.contains_key(spn))
            .collect();
        self.applied.insert(family, plan.desired);
        fallbacks
    }

    /// The proxy keeps serving what it had; the next plan is whole anyway.
    fn invalidate(&mut self, _family: IpFamily) {
        self.report = None;
    }

    fn service_ports(&self, family: IpFamily) -> usize {
        self.applied.get(&family).map_or(0, |d| d.services.len())
    }

    /// Stops the listeners and removes the proxy's kernel rules (blocking, like `apply`).
    fn cleanup(&mut self) -> Result<(), UserspaceError> {
        self.applied.clear();
        self.runtime.block_on(self.proxy.shutdown())
    }

    fn is_retryable(error: &UserspaceError) -> bool {
        error.is_retryable()
    }
}
