//! The sync loop: applies watch inputs to the pure [`ProxyState`], and syncs the dataplane
//! ([`Plane`]) paced by `min_sync_period` ([`crate::pacing`]), batching every change that
//! arrived meanwhile (the full-or-partial decision is the [`crate::syncer::Syncer`]'s). A failure
//! that retrying may fix is retried soon, in full; one that cannot (a missing `nft`) is
//! reported and retried only with the next change or resync. The first sync and the sync
//! after any failure are full; a timer re-asserts the
//! whole ruleset every `sync_period` (repairing drift); all other syncs are partial (the
//! userspace proxy diffs a full desired state itself). IPv4 and IPv6 are synced
//! independently: a failure in one family leaves the other untouched. After each sync: stale
//! UDP conntrack entries are deleted, health-check node ports reconciled, and algorithm
//! fallbacks reported ([`crate::report`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime};

use svcnet_proxy::status::ProxyStatus;
use svcnet_proxy::{NamespacedName, ProxyState};
use tokio::sync::{mpsc, watch};
use tokio::time::sleep_until;

use crate::dataplane::Plane;
use crate::healthcheck::HealthCheck;
use crate::pacing::Pacer;
use crate::report::{Notice, Notices};
use crate::serve::Shared;
use crate::watchers::{Change, Input};
use crate::{ProxyConfig, SyncStats};

/// How a sync ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Synced {
    Ok,
    /// A family failed; retrying (in full) may help: soon.
    Retry,
    /// A family failed and retrying cannot help by itself: with the next change or resync.
    Failed,
}

pub(crate) struct SyncLoop {
    pub cfg: ProxyConfig,
    pub state: ProxyState,
    pub shared: Shared,
    pub stats: watch::Sender<SyncStats>,
    plane: Plane,
    synced_kinds: BTreeSet<&'static str>,
    last_sync: Option<Instant>,
    pacer: Pacer,
    next_full: Instant,
    /// Receives the health-check node ports after every sync (see `healthcheck`).
    health_checks: Option<watch::Sender<Vec<HealthCheck>>>,
    /// What was reported about algorithms, and where new reports go (see `report`).
    notices: Notices,
    notice_tx: Option<mpsc::UnboundedSender<Notice>>,
    /// The other modes' rules are still to be removed, after the first successful sync.
    retire: bool,
    /// The highest revision received per resource (see `Input::Seen`).
    seen: BTreeMap<&'static str, u64>,
    /// Where the proxy's account of itself goes after every sync (see `crate::status`).
    status: Option<watch::Sender<ProxyStatus>>,
}

impl SyncLoop {
    pub fn new(
        cfg: ProxyConfig,
        plane: Plane,
        shared: Shared,
        stats: watch::Sender<SyncStats>,
    ) -> Self {
        let state = ProxyState::new(cfg.core());
        let next_full = Instant::now() + cfg.sync_period;
        let pacer = Pacer::new(cfg.min_sync_period, Instant::now());
        Self {
            cfg,
            state,
            shared,
            stats,
            plane,
            synced_kinds: BTreeSet::new(),
            last_sync: None,
            pacer,
            next_full,
            health_checks: None,
            notices: Notices::default(),
            notice_tx: None,
            retire: false,
            seen: BTreeMap::new(),
            status: None,
        }
    }

    /// Publishes the proxy's status to `tx` after every sync, and that it stopped at the end.
    pub fn with_status(mut self, tx: watch::Sender<ProxyStatus>) -> Self {
        self.status = Some(tx);
        self
    }

    /// Removes the other modes' rules once this mode's first sync has succeeded (a mode
    /// switch: the previous proxy's rules serve until then).
    pub fn retiring_other_modes(mut self, retire: bool) -> Self {
        self.retire = retire;
        self
    }

    /// The other modes' rules go once; errors are logged (a host without, say, the legacy
    /// x_tables modules must still run the nftables mode) and not retried.
    async fn retire_other_modes(&mut self) {
        self.retire = false;
        let (netns, table, mode) = (
            self.cfg.netns.clone(),
            self.cfg.table.clone(),
            self.cfg.mode,
        );
        match tokio::task::spawn_blocking(move || {
            crate::dataplane::cleanup_modes(netns.as_deref(), &table, Some(mode), false)
        })
        .await
        {
            Ok(Ok(cleaned)) if cleaned.nft_tables + cleaned.iptables > 0 => {
                tracing::info!(
                    ?cleaned,
                    "removed the rules of other proxy modes, after installing this mode's"
                );
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("removing the rules of other proxy modes: {e}"),
            Err(e) => tracing::warn!("removing the rules of other proxy modes: {e}"),
        }
        self.stats.send_modify(|s| s.retired = true);
    }

    /// Sends algorithm warnings (fallbacks, misspelt annotations) to `tx` for publishing.
    pub fn with_notices(mut self, tx: mpsc::UnboundedSender<Notice>) -> Self {
        self.notice_tx = Some(tx);
        self
    }

    fn notify(&self, notices: Vec<Notice>) {
        for n in notices {
            tracing::warn!(service = %n.service, "{}", n.message);
            if let Some(tx) = &self.notice_tx {
                let _ = tx.send(n);
            }
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
                let name = NamespacedName::new(
                    s.metadata.namespace.clone().unwrap_or_default(),
                    s.metadata.name.clone().unwrap_or_default(),
                );
                let error = svcnet_proxy::algorithm::annotated_algorithm(&s)
                    .err()
                    .map(|e| e.to_string());
                let new = self.notices.annotation(&name, error);
                self.notify(new);
            }
            Input::Service(Change::Delete { namespace, name }) => {
                let name = NamespacedName::new(namespace, name);
                self.notices.forget(&name);
                self.state.delete_service(&name);
            }
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
            Input::Seen(kind, revision) => {
                let r = self.seen.entry(kind).or_default();
                *r = (*r).max(revision);
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
            let earliest = self.pacer.earliest(now);
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
                    None => break,
                },
                _ = stop.changed() => break,
                _ = wait => {
                    let full = Instant::now() >= self.next_full;
                    // Retried soon only when retrying may help (see `Outcome::retryable`).
                    retry = self.sync(full).await == Synced::Retry;
                    pending = false;
                }
            }
        }
        self.plane.shutdown().await;
        if let Some(tx) = self.status.take() {
            tx.send_modify(|s| s.stopped = Some(k8s_openapi::jiff::Timestamp::now()));
        }
    }

    /// One sync of both families.
    async fn sync(&mut self, periodic_full: bool) -> Synced {
        let started = Instant::now();
        // What the rules will hold: every input received so far.
        let seen = self.seen.clone();
        let changes = self.state.take_changes();
        let stale = self.state.stale_conntrack(&changes);
        let outcome = self.plane.sync(&self.state, &changes, periodic_full).await;
        let (all_ok, any_full) = (outcome.ok, outcome.full);
        if !all_ok {
            self.shared.metrics.sync_failures.inc();
        }
        let new = self.notices.fallbacks(&outcome.scope, &outcome.fallbacks);
        self.notify(new);
        if !stale.is_empty() {
            let ns = self.cfg.netns.clone();
            match tokio::task::spawn_blocking(move || {
                svcnet_conntrack::clear_stale(ns.as_deref(), &stale)
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
        let ended = Instant::now();
        self.pacer.record(started, ended, periodic_full);
        self.last_sync = Some(ended);
        if periodic_full || any_full {
            self.next_full = ended + self.cfg.sync_period;
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
            if let Some(n) = outcome.service_ports {
                s.service_ports = n;
            }
        });
        if let Some(tx) = &self.status {
            tx.send_modify(|s| {
                if all_ok {
                    s.services_revision = seen.get("services").copied();
                    s.slices_revision = seen.get("endpointslices").copied();
                    s.last_sync = Some(k8s_openapi::jiff::Timestamp::now());
                    s.sync_error = None;
                } else {
                    s.sync_error = Some(
                        outcome
                            .error
                            .clone()
                            .unwrap_or_else(|| "the last sync failed".into()),
                    );
                }
            });
        }
        if all_ok && self.retire {
            self.retire_other_modes().await;
        }
        match (all_ok, outcome.retryable) {
            (true, _) => Synced::Ok,
            (false, true) => Synced::Retry,
            (false, false) => Synced::Failed,
        }
    }
}
