//! Leader election on a `coordination.k8s.io/v1` Lease, client-go's `leaderelection`
//! algorithm: of the candidates running the same controllers, only the one holding the
//! Lease acts.
//!
//! A candidate tries to acquire the lease every `retry_period` (jittered by up to 1.2 times
//! it). Each try reads the Lease, creates it when absent, and otherwise remembers each new
//! version of its record together with the *local* time it was first seen; a lease held by
//! someone else whose record has not changed for `leaseDurationSeconds` of local time has
//! expired and is taken over by an update carrying the read's resourceVersion (a 409 means
//! another candidate won). The leader renews the same way every `retry_period`; when it has
//! not managed to for `renew_deadline`, it stops leading, before anyone else may take the
//! lease over (`lease_duration` > `renew_deadline`); it also stops at once when a renewal
//! reads another holder (client-go keeps trying until the deadline).
//!
//! As upstream says of its own, this does not fence: it is tolerant to clock skew between
//! machines (only local observation times count) but not to clocks running at very
//! different rates, and a leader that stalls without noticing can act late. The caller stops
//! acting at once when [`LeaderElector::run`] reports the lease lost (upstream exits).
//!
//! Split the house way: [`record`] is the pure decision, [`lock`] the Lease I/O, [`clock`]
//! the injected time; this module is the loop.

pub mod clock;
pub mod lock;
pub mod record;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, error, info, warn};

pub use clock::{Clock, SystemClock};
pub use lock::{KubeLeaseLock, LeaseError, LeaseLock};
use record::{Decision, Observation};

/// upstream's jitter factor of the acquire loop (`leaderelection.JitterFactor`).
pub const JITTER_FACTOR: f64 = 1.2;

/// How the elector runs (client-go's `LeaderElectionConfig`).
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// This candidate's identity, written as the Lease's `holderIdentity`.
    pub identity: String,
    /// How long others wait, from their last observed change of the record, before taking
    /// the lease over (a whole number of seconds: it is written as `leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// How long the leader keeps retrying a renewal before it gives up leading.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire, and the leader to renew.
    pub retry_period: Duration,
    /// Give the lease up (`leaseDurationSeconds: 1`, no holder) when stopped cleanly, so a
    /// standby takes over at its next try instead of after the lease duration.
    pub release_on_cancel: bool,
}

impl ElectionConfig {
    /// upstream's defaults (component-base `RecommendedDefaultLeaderElectionConfiguration`):
    /// 15 s lease, 10 s renew deadline, 2 s retry period.
    pub fn new(identity: impl Into<String>) -> Self {
        Self {
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_cancel: true,
        }
    }

    /// client-go's checks: `lease_duration > renew_deadline > 1.2 × retry_period`, all
    /// positive, a non-empty identity; here also a whole-second lease duration, since that
    /// is what the Lease can say.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        if self.identity.is_empty() {
            return bad("the identity must not be empty".into());
        }
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.is_zero() {
            return bad(format!(
                "the lease duration ({:?}) must be a positive whole number of seconds",
                self.lease_duration
            ));
        }
        if i32::try_from(self.lease_duration.as_secs()).is_err() {
            return bad(format!(
                "the lease duration ({:?}) is too long",
                self.lease_duration
            ));
        }
        if self.retry_period.is_zero() {
            return bad("the retry period must be greater than zero".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return bad(format!(
                "the lease duration ({:?}) must be greater than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.retry_period.as_secs_f64() {
            return bad(format!(
                "the renew deadline ({:?}) must be greater than {JITTER_FACTOR} × the retry \
                 period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }

    fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// An invalid [`ElectionConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid leader election configuration: {0}")]
pub struct ConfigError(String);

/// A candidate identity unique per process, upstream's `hostname + "_" + uuid`, so that two
/// processes on one host never both believe they hold the lease.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let host = if host.is_empty() { "localhost" } else { host };
    format!("{host}_{}", uuid::Uuid::new_v4())
}

/// The outcome of one `tryAcquireOrRenew`.
#[derive(Debug)]
pub enum Attempt {
    /// This candidate holds the lease (just acquired, created or renewed).
    Leading,
    /// Someone else holds it and it has not expired by the local clock.
    HeldBy(String),
    /// The read or the write failed (a [`LeaseError::Conflict`] lost a race).
    Failed(LeaseError),
}

/// How [`LeaderElector::run`] ended.
#[derive(Debug)]
pub enum Ended<T> {
    /// Shutdown came before this candidate ever led.
    Cancelled,
    /// The leading work returned (on its own, or after its stop signal on shutdown); the
    /// lease was then released if so configured.
    Finished(T),
    /// Renewal failed for the renew deadline: the leading work was dropped at once and
    /// this candidate must not act any more.
    LostLease,
}

/// A candidate for one lock.
pub struct LeaderElector<L, C = SystemClock> {
    config: ElectionConfig,
    lock: L,
    clock: Arc<C>,
    /// Draws the jitter fraction in [0, 1) of each acquire wait.
    jitter: Box<dyn FnMut() -> f64 + Send>,
    observed: Observation,
    /// The last leader logged, to log each change once (upstream's `OnNewLeader`).
    reported_leader: Option<String>,
}

impl<L: LeaseLock> LeaderElector<L, SystemClock> {
    /// A candidate on the real clock with random jitter.
    pub fn new(config: ElectionConfig, lock: L) -> Result<Self, ConfigError> {
        Self::with_clock(config, lock, SystemClock, Box::new(rand::random::<f64>))
    }
}

impl<L: LeaseLock, C: Clock> LeaderElector<L, C> {
    /// A candidate on `clock`, drawing jitter fractions from `jitter`.
    pub fn with_clock(
        config: ElectionConfig,
        lock: L,
        clock: C,
        jitter: Box<dyn FnMut() -> f64 + Send>,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            lock,
            clock: Arc::new(clock),
            jitter,
            observed: Observation::default(),
            reported_leader: None,
        })
    }

    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Whether the record last seen names this candidate.
    pub fn is_leader(&self) -> bool {
        self.observed.is_leader(&self.config.identity)
    }

    /// The holder of the record last seen.
    pub fn leader(&self) -> Option<&str> {
        self.observed.holder()
    }

    /// One `tryAcquireOrRenew`: read the lock, create it when absent, or write this
    /// candidate's record over it when it is this candidate's or has expired.
    pub async fn try_acquire_or_renew(&mut self) -> Attempt {
        let me = self.config.identity.clone();
        let secs = self.config.lease_duration_seconds();
        let read = match self.lock.get().await {
            Ok(read) => read,
            Err(e) => return Attempt::Failed(e),
        };
        let now = self.clock.now();
        let wall = self.clock.wall();
        let attempt = match read {
            None => {
                let spec = record::fresh(&me, secs, wall);
                match self.lock.create(spec.clone()).await {
                    Ok(()) => {
                        self.observed.set(spec, self.clock.now());
                        Attempt::Leading
                    }
                    Err(e) => Attempt::Failed(e),
                }
            }
            Some(read) => match self.observed.decide(&me, secs, now, wall, &read) {
                Decision::HeldBy { holder, expires_in } => {
                    debug!(lease = %self.lock.describe(), %holder, ?expires_in, "lease held");
                    Attempt::HeldBy(holder)
                }
                Decision::Write { spec, .. } => match self.lock.update(spec.clone()).await {
                    Ok(()) => {
                        self.observed.set(spec, self.clock.now());
                        Attempt::Leading
                    }
                    Err(e) => Attempt::Failed(e),
                },
            },
        };
        self.report_transition();
        attempt
    }

    fn report_transition(&mut self) {
        let leader = self.observed.holder().map(str::to_string);
        if leader != self.reported_leader {
            if let Some(l) = &leader {
                info!(lease = %self.lock.describe(), leader = %l, "new leader");
            }
            self.reported_leader = leader;
        }
    }

    /// Tries until this candidate holds the lease (client-go's `acquire`, without its
    /// context: callers race it against their shutdown).
    pub async fn acquire(&mut self) {
        let clock = Arc::clone(&self.clock);
        info!(lease = %self.lock.describe(), identity = %self.config.identity, "attempting to acquire the leader lease");
        loop {
            match self.try_acquire_or_renew().await {
                Attempt::Leading => {
                    info!(lease = %self.lock.describe(), identity = %self.config.identity, "acquired the leader lease");
                    return;
                }
                Attempt::HeldBy(_) => {}
                Attempt::Failed(e) if e.is_conflict() => {
                    debug!(error = %e, "lost a race for the lease")
                }
                Attempt::Failed(e) => warn!(error = %e, "cannot acquire the lease"),
            }
            let fraction = (self.jitter)().clamp(0.0, 1.0);
            let wait = self
                .config
                .retry_period
                .mul_f64(1.0 + JITTER_FACTOR * fraction);
            clock.sleep(wait).await;
        }
    }

    /// Renews every retry period until a renewal has not succeeded for the renew deadline,
    /// then returns (client-go's `renew`): from then on this candidate is not leading.
    ///
    /// Each round's deadline is anchored on the last successful renewal (plus the retry
    /// period slept after it), which is client-go's deadline whenever the process runs
    /// normally; a process that was stopped (SIGSTOP, a VM pause) past it gives up at its
    /// first step after waking instead of starting a fresh round.
    pub async fn renew(&mut self) {
        let clock = Arc::clone(&self.clock);
        let mut deadline = clock.now() + self.config.renew_deadline;
        loop {
            if self.renew_round(deadline).await.is_err() {
                return;
            }
            let renewed = clock.now();
            clock.sleep(self.config.retry_period).await;
            deadline = renewed + self.config.retry_period + self.config.renew_deadline;
        }
    }

    /// Tries to renew every retry period until `deadline`; `Err` when it passed first or
    /// someone else took the lease.
    async fn renew_round(&mut self, deadline: std::time::Instant) -> Result<(), ()> {
        let clock = Arc::clone(&self.clock);
        let lost = |me: &Self| {
            error!(lease = %me.lock.describe(), deadline = ?me.config.renew_deadline, "failed to renew the lease within the renew deadline: stopped leading");
            Err(())
        };
        loop {
            let remaining = deadline.saturating_duration_since(clock.now());
            if remaining.is_zero() {
                return lost(self);
            }
            // The attempt itself is bounded by the deadline too: a hanging API call must not
            // keep this candidate leading past it.
            let attempt = tokio::select! {
                biased;
                a = self.try_acquire_or_renew() => Some(a),
                () = clock.sleep(remaining) => None,
            };
            match attempt {
                Some(Attempt::Leading) => return Ok(()),
                Some(Attempt::HeldBy(holder)) => {
                    // Someone else judged this lease expired and took it: they act now.
                    // client-go keeps polling until the renew deadline; stopping at once
                    // shortens the time two candidates both act.
                    error!(lease = %self.lock.describe(), %holder, "the lease was taken over: stopped leading");
                    return Err(());
                }
                Some(Attempt::Failed(e)) => warn!(error = %e, "cannot renew the lease"),
                None => return lost(self),
            }
            let left = deadline.saturating_duration_since(clock.now());
            clock.sleep(self.config.retry_period.min(left)).await;
        }
    }

    /// Gives the lease up if this candidate holds it (client-go's `release`): no holder and
    /// a one-second duration, so a standby takes over at its next try.
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        let Some(spec) = self
            .observed
            .release(&self.config.identity, self.clock.wall())
        else {
            return Ok(());
        };
        self.lock.update(spec.clone()).await?;
        info!(lease = %self.lock.describe(), "released the leader lease");
        self.observed.set(spec, self.clock.now());
        Ok(())
    }

    /// Acquires the lease, then runs `lead` while renewing it (client-go's `Run`).
    ///
    /// `lead` gets a stop signal that resolves when `shutdown` does; after it returns, the
    /// lease is released (with `release_on_cancel`) only then, so nothing it guards runs
    /// past the release. When renewal fails for the renew deadline, the `lead` future is
    /// dropped at once and [`Ended::LostLease`] returned.
    pub async fn run<F, Fut>(
        mut self,
        shutdown: impl Future<Output = ()>,
        lead: F,
    ) -> Ended<Fut::Output>
    where
        F: FnOnce(Stop) -> Fut,
        Fut: Future,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        tokio::select! {
            () = self.acquire() => {}
            () = &mut shutdown => return Ended::Cancelled,
        }
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let outcome = {
            let mut lead = std::pin::pin!(lead(Stop(stop_rx)));
            let mut renew = std::pin::pin!(self.renew());
            let mut stop_tx = Some(stop_tx);
            loop {
                tokio::select! {
                    out = &mut lead => break Ended::Finished(out),
                    () = &mut renew => break Ended::LostLease,
                    () = &mut shutdown, if stop_tx.is_some() => {
                        if let Some(tx) = stop_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                }
            }
        };
        if matches!(outcome, Ended::Finished(_))
            && self.config.release_on_cancel
            && let Err(e) = self.release().await
        {
            warn!(error = %e, "cannot release the leader lease");
        }
        outcome
    }
}

/// The stop signal [`LeaderElector::run`] gives the leading work: resolves on shutdown.
#[derive(Debug)]
pub struct Stop(tokio::sync::oneshot::Receiver<()>);

impl Future for Stop {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        // A dropped sender (the elector gone) also means stop.
        std::pin::Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}
