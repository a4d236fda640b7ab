//! The sync loop: applies watch inputs to the pure [`ProxyState`], and syncs the dataplane
//! rate-limited by `min_sync_period`, batching every change that arrived meanwhile. The first
//! sync and the sync after any failure are full (table recreated); a timer re-asserts the
//! whole ruleset every `sync_period` (repairing drift); all other syncs are partial. IPv4 and
//! IPv6 are synced independently: a failure in one family leaves the other untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime};

use svcnet_nft::{Family, FullMode, NftExecutor, Renderer};
use svcnet_proxy::{IpFamily, NamespacedName, ProxyState};
use tokio::sync::{mpsc, watch};
use tokio::time::sleep_until;

use crate::healthcheck::HealthCheck;
use crate::serve::Shared;
use crate::watchers::{Change, Input};
use crate::{ProxyConfig, SyncStats};

/// Per-family dataplane state.
struct FamilyPlane {
    renderer: Renderer,
    /// Next full sync must recreate the table (first sync, after a failure).
    recreate: bool,
}

pub(crate) struct SyncLoop {
    pub cfg: ProxyConfig,
    pub state: ProxyState,
    pub exec: NftExecutor,
    pub shared: Shared,
    pub stats: watch::Sender<SyncStats>,
    planes: BTreeMap<IpFamily, FamilyPlane>,
    synced_kinds: BTreeSet<&'static str>,
    /// Services changed since the last successful sync of each family.
    dirty: BTreeMap<IpFamily, BTreeSet<NamespacedName>>,
    last_sync: Option<Instant>,
    next_full: Instant,
    /// Receives the health-check node ports after every sync (see `healthcheck`).
    health_checks: Option<watch::Sender<Vec<HealthCheck>>>,
}

impl SyncLoop {
    pub fn new(cfg: ProxyConfig, shared: Shared, stats: watch::Sender<SyncStats>) -> Self {
        let state = ProxyState::new(cfg.core());
        let exec = NftExecutor::new(cfg.netns.clone());
        let planes = IpFamily::ALL
            .into_iter()
            .map(|f| {
                (
                    f,
                    FamilyPlane {
                        renderer: Renderer::with_table(Family::from(f), &cfg.table),
                        recreate: true,
                    },
                )
            })
            .collect();
        let next_full = Instant::now() + cfg.sync_period;
        Self {
            cfg,
            state,
            exec,
            shared,
            stats,
            planes,
            synced_kinds: BTreeSet::new(),
            dirty: BTreeMap::new(),
            last_sync: None,
            next_full,
            health_checks: None,
        }
    }

    /// Publishes the health-check node ports to `tx` after every sync.
    pub fn with_health_checks(mut self, tx: watch::Sender<Vec<HealthCheck>>) -> Self {
        self.health_checks = Some(tx);
        self
    }

    fn on_input(&mut self, input: Input) -> bool {
        let before = self.state.pending();
        match input {
            Input::Service(Change::Upsert(s)) => {
                if let Err(e) = self.state.update_service(&s) {
                    tracing::warn!("{e}; the service is not programmed");
                }
            }
            Input::Service(Change::Delete { namespace, name }) => self
                .state
                .delete_service(&NamespacedName::new(namespace, name)),
            Input::Slice(Change::Upsert(s)) => self.state.update_slice(&s),
            Input::Slice(Change::Delete { namespace, name }) => {
                self.state.delete_slice(&namespace, &name)
            }
            Input::Node(Change::Upsert(n)) => {
                let eligible = n.metadata.deletion_timestamp.is_none();
                if let Ok(mut h) = self.shared.health.lock() {
                    h.node_eligible = eligible;
                }
                self.state.update_node(&n);
            }
            Input::Node(Change::Delete { .. }) => {}
            Input::Synced(kind) => {
                self.synced_kinds.insert(kind);
            }
        }
        let after = self.state.pending();
        let m = &self.shared.metrics;
        if after.0 > before.0 {
            m.service_changes.inc();
        }
        if after.1 > before.1 {
            m.endpoint_changes.inc();
        }
        m.service_changes_pending.set(after.0 as i64);
        m.endpoint_changes_pending.set(after.1 as i64);
        let changed = after != before || after != (0, 0);
        if changed && let Ok(mut h) = self.shared.health.lock() {
            h.queued_since.get_or_insert_with(SystemTime::now);
        }
        changed
    }

    fn ready(&self) -> bool {
        self.synced_kinds.len() == 3
    }

    /// Runs until the input channel closes or `stop` fires.
    pub async fn run(mut self, mut inputs: mpsc::Receiver<Input>, mut stop: watch::Receiver<bool>) {
        let mut pending = false;
        let mut retry = false;
        loop {
            let now = Instant::now();
            let earliest = self.last_sync.map_or(now, |t| t + self.cfg.min_sync_period);
            let due = if !self.ready() {
                None
            } else if pending || retry || self.last_sync.is_none() {
                Some(earliest.max(now))
            } else {
                Some(self.next_full.max(earliest))
            };
            let wait = async {
                match due {
                    Some(d) => sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                input = inputs.recv() => match input {
                    Some(i) => {
                        pending |= self.on_input(i);
                        // Drain what is already queued, so a burst becomes one sync.
                        while let Ok(i) = inputs.try_recv() {
                            pending |= self.on_input(i);
                        }
                    }
                    None => return,
                },
                _ = stop.changed() => return,
                _ = wait => {
                    let full = Instant::now() >= self.next_full;
                    retry = !self.sync(full).await;
                    pending = false;
                }
            }
        }
    }

    /// One sync of both families; returns whether every family succeeded.
    async fn sync(&mut self, periodic_full: bool) -> bool {
        let started = Instant::now();
        let changes = self.state.take_changes();
        for family in IpFamily::ALL {
            self.dirty
                .entry(family)
                .or_default()
                .extend(changes.services.keys().cloned());
        }
        let stale = self.state.stale_conntrack(&changes);
        let mut all_ok = true;
        let mut any_full = false;
        for family in IpFamily::ALL {
            let plane = self
                .planes
                .get_mut(&family)
                .map(|p| (p.recreate, &p.renderer));
            let Some((recreate, renderer)) = plane else {
                continue;
            };
            let node = self.state.node_state(family);
            let dirty = self.dirty.get(&family).cloned().unwrap_or_default();
            let partial = if recreate || periodic_full || changes.node_changed {
                None
            } else {
                renderer.plan_partial(&node, &self.state.desired_for(family, dirty.iter()))
            };
            let plan = match partial {
                Some(p) => p,
                None => {
                    let mode = if recreate {
                        FullMode::Recreate
                    } else {
                        FullMode::Reassert
                    };
                    renderer.plan_full(&self.state.desired(family), mode)
                }
            };
            let is_full = plan.is_full();
            any_full |= is_full;
            let exec = self.exec.clone();
            let (plan, result) = match tokio::task::spawn_blocking(move || {
                let r = exec.apply(&plan.tx);
                (plan, r)
            })
            .await
            {
                Ok(x) => x,
                Err(e) => {
                    tracing::error!("sync task failed: {e}");
                    all_ok = false;
                    continue;
                }
            };
            let Some(plane) = self.planes.get_mut(&family) else {
                continue;
            };
            match result {
                Ok(()) => {
                    tracing::debug!(%family, full = is_full, ops = plan.tx.len(), "synced");
                    plane.renderer.commit(plan);
                    plane.recreate = false;
                    self.dirty.insert(family, BTreeSet::new());
                }
                Err(e) => {
                    tracing::warn!(%family, full = is_full, "nft sync failed, will retry with a full sync: {e}");
                    self.shared.metrics.sync_failures.inc();
                    plane.renderer.invalidate();
                    // A reassert that failed (drift: something deleted) is retried by recreating.
                    plane.recreate = true;
                    all_ok = false;
                }
            }
        }
        if !stale.is_empty() {
            let ns = self.cfg.netns.clone();
            match tokio::task::spawn_blocking(move || {
                svcnet_nft::conntrack::clear_stale(ns.as_deref(), &stale)
            })
            .await
            {
                Ok(Ok(n)) => {
                    self.shared.metrics.conntrack_deleted.inc_by(n as u64);
                }
                Ok(Err(e)) => tracing::warn!("deleting stale UDP conntrack entries: {e}"),
                Err(e) => tracing::warn!("conntrack task failed: {e}"),
            }
        }
        if let Some(tx) = &self.health_checks {
            // Every sync, so ports that failed to bind are retried.
            tx.send_replace(HealthCheck::from_state(&self.state));
        }
        let elapsed = started.elapsed().as_secs_f64();
        let m = &self.shared.metrics;
        m.sync_duration.observe(elapsed);
        if any_full {
            m.sync_full_duration.observe(elapsed);
        } else {
            m.sync_partial_duration.observe(elapsed);
        }
        m.service_changes_pending.set(0);
        m.endpoint_changes_pending.set(0);
        self.last_sync = Some(Instant::now());
        if periodic_full || any_full {
            self.next_full = Instant::now() + self.cfg.sync_period;
        }
        if all_ok {
            let now = SystemTime::now();
            m.last_sync_timestamp.set(
                now.duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0),
            );
            if let Ok(mut h) = self.shared.health.lock() {
                h.last_updated = Some(now);
                h.queued_since = None;
            }
        }
        self.stats.send_modify(|s| {
            s.syncs += 1;
            if any_full {
                s.full_syncs += 1;
            }
            if !all_ok {
                s.failures += 1;
            }
            s.service_ports = self
                .planes
                .values()
                .map(|p| p.renderer.service_ports())
                .sum();
        });
        all_ok
    }
}
