//! The one syncer every dataplane runs under ([`svcnet_proxy::Dataplane`]): per family it
//! makes kube-proxy's full-or-partial decision ([`full_reason`]: nothing applied yet or the
//! last sync failed, the periodic resync, the node changed; else the dataplane's own
//! [`Dataplane::needs_full`], e.g. iptables' canary; else a partial plan of the services
//! changed since the family's last successful sync, full when the dataplane cannot plan one),
//! applies the plan on a blocking thread, and commits it or invalidates the family. Families
//! are independent: a failure in one never blocks the other, and is retried with a full
//! sync. Fallbacks come out of [`Dataplane::commit`], one channel for every dataplane.
//!
//! Only the dataplane moves to the blocking thread, never the proxy's observed state: a
//! panic inside the dataplane is caught, the family invalidated, and the dataplane kept.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use svcnet_lb::Fallback;
use svcnet_proxy::{
    ChangeSet, Dataplane, FullReason, IpFamily, NamespacedName, ProxyState, ServicePortName,
};

use crate::dataplane::{Outcome, Scope};

/// What the syncer remembers of one family.
#[derive(Debug)]
struct Memory {
    /// Nothing applied yet, or the last sync failed: the kernel's state is unknown.
    unknown: bool,
    /// Services changed since the last successful sync of this family.
    dirty: BTreeSet<NamespacedName>,
}

/// The syncer's own reasons for a full sync (the dataplane may add one: `needs_full`).
pub fn full_reason(unknown: bool, periodic: bool, node_changed: bool) -> Option<FullReason> {
    if unknown {
        Some(FullReason::Unknown)
    } else if periodic {
        Some(FullReason::Periodic)
    } else if node_changed {
        Some(FullReason::NodeChanged)
    } else {
        None
    }
}

/// One dataplane and the syncer's memory of it.
pub struct Syncer<D: Dataplane> {
    /// `None` only while a call runs on a blocking thread (or if that thread was lost).
    dp: Option<D>,
    memory: BTreeMap<IpFamily, Memory>,
}

/// Why one family's sync failed.
enum Failure<E> {
    Dataplane(E),
    /// The dataplane panicked (caught) or its blocking thread was lost.
    Task(String),
}

impl<E: std::fmt::Display> std::fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dataplane(e) => e.fmt(f),
            Self::Task(e) => write!(f, "dataplane task failed: {e}"),
        }
    }
}

impl<D: Dataplane> Syncer<D> {
    pub fn new(dp: D) -> Self {
        let memory = dp
            .families()
            .into_iter()
            .map(|f| {
                (
                    f,
                    Memory {
                        unknown: true,
                        dirty: BTreeSet::new(),
                    },
                )
            })
            .collect();
        Self {
            dp: Some(dp),
            memory,
        }
    }

    pub fn dataplane(&self) -> Option<&D> {
        self.dp.as_ref()
    }

    /// Runs `f` on the dataplane on a blocking thread.
    async fn blocking<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut D) -> R + Send + 'static,
    ) -> Result<R, String> {
        let Some(mut dp) = self.dp.take() else {
            return Err("the dataplane was lost with an earlier task".into());
        };
        let joined = tokio::task::spawn_blocking(move || {
            let r = catch_unwind(AssertUnwindSafe(|| f(&mut dp)));
            (dp, r)
        })
        .await;
        match joined {
            Ok((dp, r)) => {
                self.dp = Some(dp);
                r.map_err(|p| {
                    p.downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "panicked".into())
                })
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Syncs every family with `state`; `changes` were just taken from it.
    pub async fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
        periodic_full: bool,
    ) -> Outcome {
        let mut out = Outcome {
            full: false,
            ok: true,
            retryable: true,
            fallbacks: Vec::new(),
            scope: Scope::Services(BTreeSet::new()),
            service_ports: None,
            error: None,
        };
        let mut all_full = true;
        let families: Vec<IpFamily> = self.memory.keys().copied().collect();
        for family in families {
            if let Some(m) = self.memory.get_mut(&family) {
                m.dirty.extend(changes.services.keys().cloned());
            }
            match self
                .sync_family(family, state, periodic_full, changes.node_changed)
                .await
            {
                Ok((full, fallbacks)) => {
                    out.full |= full;
                    out.fallbacks.extend(fallbacks);
                    all_full &= full;
                    if let Some(m) = self.memory.get_mut(&family) {
                        if let Scope::Services(s) = &mut out.scope {
                            s.extend(std::mem::take(&mut m.dirty));
                        }
                        m.unknown = false;
                    }
                }
                Err(e) => {
                    let name = self.dp.as_ref().map_or("dataplane", |d| d.name());
                    let retryable = match &e {
                        Failure::Dataplane(e) => D::is_retryable(e),
                        Failure::Task(_) => true,
                    };
                    if retryable {
                        tracing::warn!(%family, "{name} sync failed, the next one is full: {e}");
                    } else {
                        tracing::error!(%family, "{name} sync failed and retrying cannot help; retried with the next change or periodic resync: {e}");
                    }
                    out.retryable &= retryable;
                    let what = format!("{name} {family}: {e}");
                    out.error = Some(match out.error.take() {
                        Some(before) => format!("{before}; {what}"),
                        None => what,
                    });
                    if let Some(dp) = self.dp.as_mut() {
                        dp.invalidate(family);
                    }
                    if let Some(m) = self.memory.get_mut(&family) {
                        m.unknown = true;
                    }
                    out.ok = false;
                    all_full = false;
                }
            }
        }
        // Every family rendered in full: the fallbacks speak for every service.
        if out.ok && all_full {
            out.scope = Scope::All;
        }
        if let Some(dp) = &self.dp {
            out.service_ports = Some(self.memory.keys().map(|f| dp.service_ports(*f)).sum());
        }
        out
    }

    /// One family: decide, plan, apply, commit. Returns whether the sync was full and the
    /// fallbacks of what it rendered.
    async fn sync_family(
        &mut self,
        family: IpFamily,
        state: &ProxyState,
        periodic_full: bool,
        node_changed: bool,
    ) -> Result<(bool, Vec<(ServicePortName, Fallback)>), Failure<D::Error>> {
        let unknown = self.memory.get(&family).is_none_or(|m| m.unknown);
        let mut why = full_reason(unknown, periodic_full, node_changed);
        let mut applied = None;
        if why.is_none() {
            // The common case in one blocking call: the dataplane's own check, then a partial
            // plan of the changed services (computed here, O(changed)) and its apply.
            let node = state.node_state(family);
            let dirty = self.memory.get(&family).map(|m| &m.dirty);
            let changes = state.desired_for(family, dirty.into_iter().flatten());
            let partial = self
                .blocking(move |dp| {
                    if let Some(why) = dp.needs_full(family)? {
                        return Ok(Err(why));
                    }
                    match dp.plan_partial(family, &node, &changes) {
                        Some(plan) => dp.apply(family, &plan).map(|()| Ok(plan)),
                        // No partial plan without a reason: the node settings differ from
                        // those applied.
                        None => Ok(Err(FullReason::NodeSettings)),
                    }
                })
                .await
                .map_err(Failure::Task)?
                .map_err(Failure::Dataplane)?;
            match partial {
                Ok(plan) => applied = Some(plan),
                Err(full) => why = Some(full),
            }
        }
        let plan = match (applied, why) {
            (Some(plan), _) => plan,
            (None, why) => {
                let why = why.unwrap_or(FullReason::NodeSettings);
                let desired = state.desired(family);
                self.blocking(move |dp| {
                    let plan = dp.plan_full(family, &desired, why)?;
                    dp.apply(family, &plan)?;
                    Ok(plan)
                })
                .await
                .map_err(Failure::Task)?
                .map_err(Failure::Dataplane)?
            }
        };
        let full = D::is_full(&plan);
        let dp = self
            .dp
            .as_mut()
            .ok_or_else(|| Failure::Task("the dataplane was lost".into()))?;
        tracing::debug!(
            dataplane = dp.name(),
            %family,
            full,
            reason = why.map(|w| w.to_string()),
            "synced"
        );
        Ok((full, dp.commit(family, plan)))
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use svcnet_proxy::fixtures::{service, slice};
    use svcnet_proxy::{
        Capability, Changes, CoreConfig, DesiredEndpoint, DesiredFamily, DesiredNode,
    };

    use super::*;

    /// A dataplane that records what the syncer asks of it.
    #[derive(Default)]
    struct Fake {
        log: Vec<String>,
        /// Families whose next apply fails, once.
        fail: BTreeSet<IpFamily>,
        /// Families whose next apply panics, once.
        panic: BTreeSet<IpFamily>,
        /// Families whose next apply fails as a missing tool would (not retryable), once.
        missing: BTreeSet<IpFamily>,
        /// `needs_full` says the state is damaged, once.
        damaged: bool,
        /// `plan_partial` cannot plan (node settings differ), once.
        no_partial: bool,
        ports: BTreeMap<IpFamily, usize>,
    }

    struct FakePlan {
        full: bool,
        services: Vec<String>,
    }

    impl fmt::Display for FakePlan {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "{} {:?}",
                if self.full { "full" } else { "partial" },
                self.services
            )
        }
    }

    struct Any;
    impl Capability for Any {
        fn resolve(
            &self,
            requested: Option<svcnet_lb::Algorithm>,
            _: &[&[DesiredEndpoint]],
            _: bool,
        ) -> svcnet_lb::Resolution {
            svcnet_lb::resolve(requested, svcnet_lb::Dataplane::Nftables)
        }
    }

    impl Dataplane for Fake {
        type Plan = FakePlan;
        type Error = std::io::Error;

        fn name(&self) -> &'static str {
            "fake"
        }

        fn families(&self) -> Vec<IpFamily> {
            IpFamily::ALL.to_vec()
        }

        fn capability(&self) -> &dyn Capability {
            &Any
        }

        fn needs_full(&mut self, family: IpFamily) -> Result<Option<FullReason>, Self::Error> {
            self.log.push(format!("{family}: needs_full"));
            Ok(std::mem::take(&mut self.damaged).then_some(FullReason::Damaged("canary")))
        }

        fn plan_full(
            &mut self,
            family: IpFamily,
            desired: &DesiredFamily,
            why: FullReason,
        ) -> Result<FakePlan, Self::Error> {
            self.log.push(format!("{family}: full ({why})"));
            Ok(FakePlan {
                full: true,
                services: desired.services.keys().map(|k| k.to_string()).collect(),
            })
        }

        fn plan_partial(
            &self,
            _: IpFamily,
            _: &DesiredNode,
            changes: &Changes,
        ) -> Option<FakePlan> {
            if self.no_partial {
                return None;
            }
            Some(FakePlan {
                full: false,
                services: changes.keys().map(|k| k.to_string()).collect(),
            })
        }

        fn is_full(plan: &FakePlan) -> bool {
            plan.full
        }

        fn apply(&mut self, family: IpFamily, plan: &FakePlan) -> Result<(), Self::Error> {
            self.no_partial = false;
            if self.panic.remove(&family) {
                panic!("boom");
            }
            if self.fail.remove(&family) {
                return Err(std::io::Error::other("rejected"));
            }
            if self.missing.remove(&family) {
                return Err(std::io::ErrorKind::NotFound.into());
            }
            self.log.push(format!("{family}: apply {plan}"));
            Ok(())
        }

        fn commit(&mut self, family: IpFamily, plan: FakePlan) -> Vec<(ServicePortName, Fallback)> {
            self.ports.insert(family, plan.services.len());
            Vec::new()
        }

        fn invalidate(&mut self, family: IpFamily) {
            self.log.push(format!("{family}: invalidate"));
        }

        fn service_ports(&self, family: IpFamily) -> usize {
            self.ports.get(&family).copied().unwrap_or(0)
        }

        fn cleanup(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }

        fn is_retryable(e: &std::io::Error) -> bool {
            e.kind() != std::io::ErrorKind::NotFound
        }
    }

    fn state() -> ProxyState {
        let mut s = ProxyState::new(CoreConfig {
            node_name: "n1".into(),
            ..Default::default()
        });
        for name in ["a", "b"] {
            s.update_service(&service("default", name, |b| {
                b.cluster_ip(&[if name == "a" {
                    "10.96.0.1"
                } else {
                    "10.96.0.2"
                }])
                .port("", "TCP", 80);
            }))
            .unwrap_or_else(|e| panic!("{e}"));
        }
        s
    }

    /// Syncs and returns the log lines of this sync and the outcome's (full, ok).
    async fn step(
        syncer: &mut Syncer<Fake>,
        state: &mut ProxyState,
        periodic: bool,
    ) -> (Vec<String>, bool, bool) {
        let changes = state.take_changes();
        let out = syncer.sync(state, &changes, periodic).await;
        let dp = syncer
            .dp
            .as_mut()
            .unwrap_or_else(|| panic!("dataplane lost"));
        (std::mem::take(&mut dp.log), out.full, out.ok)
    }

    #[tokio::test]
    async fn the_one_full_or_partial_decision() {
        let mut st = state();
        let mut s = Syncer::new(Fake::default());
        // First sync: full, both families.
        let (log, full, ok) = step(&mut s, &mut st, false).await;
        assert!(full && ok);
        assert_eq!(
            log,
            [
                "IPv4: full (first sync or previous failure)",
                r#"IPv4: apply full ["default/a/tcp/", "default/b/tcp/"]"#,
                "IPv6: full (first sync or previous failure)",
                "IPv6: apply full []",
            ]
        );
        // A change: partial, only the changed service, after asking the dataplane.
        st.update_slice(&slice("default", "a-1", "a", |b| {
            b.port("", "TCP", 8080).endpoint("10.244.1.2", "n1", |_| {});
        }));
        let (log, full, ok) = step(&mut s, &mut st, false).await;
        assert!(!full && ok);
        assert_eq!(log[0], "IPv4: needs_full");
        assert_eq!(log[1], r#"IPv4: apply partial ["default/a"]"#);
        // The dataplane reports damage (iptables' canary): full.
        s.dp.as_mut().unwrap_or_else(|| panic!("lost")).damaged = true;
        let (log, full, _) = step(&mut s, &mut st, false).await;
        assert!(full);
        assert_eq!(log[1], "IPv4: full (canary)");
        // Periodic: full without asking.
        let (log, full, _) = step(&mut s, &mut st, true).await;
        assert!(full);
        assert_eq!(log[0], "IPv4: full (periodic resync)");
        // No partial plan possible: full for the node settings.
        s.dp.as_mut().unwrap_or_else(|| panic!("lost")).no_partial = true;
        let (log, full, _) = step(&mut s, &mut st, false).await;
        assert!(full);
        assert_eq!(log[1], "IPv4: full (node settings changed)");
    }

    #[tokio::test]
    async fn a_failed_family_is_retried_in_full_and_never_blocks_the_other() {
        let mut st = state();
        let mut s = Syncer::new(Fake::default());
        step(&mut s, &mut st, false).await;
        st.update_slice(&slice("default", "b-1", "b", |b| {
            b.port("", "TCP", 8080).endpoint("10.244.1.3", "n1", |_| {});
        }));
        s.dp.as_mut()
            .unwrap_or_else(|| panic!("lost"))
            .fail
            .insert(IpFamily::V4);
        let (log, _, ok) = step(&mut s, &mut st, false).await;
        assert!(!ok);
        assert!(log.contains(&"IPv4: invalidate".to_string()), "{log:?}");
        // IPv6 went on with its own (partial) sync.
        assert!(
            log.iter().any(|l| l.starts_with("IPv6: apply partial")),
            "{log:?}"
        );
        // The next sync of IPv4 is full and carries the change that failed; IPv6 is partial.
        let (log, _, ok) = step(&mut s, &mut st, false).await;
        assert!(ok);
        assert_eq!(log[0], "IPv4: full (first sync or previous failure)");
        assert!(
            log.iter().any(|l| l.starts_with("IPv6: apply partial")),
            "{log:?}"
        );
        // A panic inside the dataplane is caught: the dataplane stays, the family is retried.
        s.dp.as_mut()
            .unwrap_or_else(|| panic!("lost"))
            .panic
            .insert(IpFamily::V4);
        let (_, _, ok) = step(&mut s, &mut st, false).await;
        assert!(!ok);
        let (log, full, ok) = step(&mut s, &mut st, false).await;
        assert!(full && ok, "{log:?}");
        assert_eq!(log[0], "IPv4: full (first sync or previous failure)");
    }

    #[test]
    fn full_when_unknown_periodic_or_node_changed_in_that_order() {
        assert_eq!(full_reason(true, true, true), Some(FullReason::Unknown));
        assert_eq!(full_reason(false, true, true), Some(FullReason::Periodic));
        assert_eq!(
            full_reason(false, false, true),
            Some(FullReason::NodeChanged)
        );
        assert_eq!(full_reason(false, false, false), None);
    }

    #[tokio::test]
    async fn failures_say_whether_retrying_can_help() {
        let mut st = state();
        let mut s = Syncer::new(Fake::default());
        let changes = st.take_changes();
        let out = s.sync(&st, &changes, false).await;
        assert!(out.ok && out.retryable);
        s.dp.as_mut()
            .unwrap_or_else(|| panic!("lost"))
            .fail
            .insert(IpFamily::V6);
        let out = s.sync(&st, &ChangeSet::default(), false).await;
        assert!(!out.ok && out.retryable);
        s.dp.as_mut()
            .unwrap_or_else(|| panic!("lost"))
            .missing
            .insert(IpFamily::V4);
        let out = s.sync(&st, &ChangeSet::default(), false).await;
        assert!(!out.ok && !out.retryable);
    }
}
