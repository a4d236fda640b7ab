//! The elector's loop against a fake lock and a fake clock: every branch of
//! `tryAcquireOrRenew`, the acquire and renew loops' timing, and release.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::jiff::Timestamp;

use super::clock::FakeClock;
use super::*;

/// The Lease as a fake API server keeps it: a record and a resourceVersion.
#[derive(Default)]
struct Store {
    lease: Option<(LeaseSpec, u64)>,
    next_rv: u64,
    /// Every write, in order: (writer, record).
    writes: Vec<(String, LeaseSpec)>,
    /// From this time on (by the fake clock) every call fails with 503.
    fail_from: Option<Instant>,
    /// From this time on every call hangs (an API server that stopped answering).
    hang_from: Option<Instant>,
    /// Written by "other" at the first call from this time on (a takeover).
    takeover_from: Option<(Instant, LeaseSpec)>,
    /// Written by "racer" between the next update's read and its write.
    race: Option<LeaseSpec>,
}

#[derive(Clone)]
struct FakeLeases {
    store: Arc<Mutex<Store>>,
    clock: FakeClock,
}

impl FakeLeases {
    fn new(clock: &FakeClock) -> Self {
        Self {
            store: Arc::default(),
            clock: clock.clone(),
        }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self, who: &str) -> FakeLock {
        FakeLock {
            leases: self.clone(),
            who: who.into(),
            read_rv: None,
        }
    }

    /// Another candidate (not an elector here) writes the record.
    fn write_as(&self, who: &str, spec: LeaseSpec) {
        let mut st = self.st();
        st.next_rv += 1;
        let rv = st.next_rv;
        st.lease = Some((spec.clone(), rv));
        st.writes.push((who.into(), spec));
    }

    fn current(&self) -> Option<LeaseSpec> {
        self.st().lease.as_ref().map(|(s, _)| s.clone())
    }

    fn rv(&self) -> u64 {
        self.st().lease.as_ref().map_or(0, |(_, rv)| *rv)
    }

    fn writes(&self) -> Vec<(String, LeaseSpec)> {
        self.st().writes.clone()
    }
}

struct FakeLock {
    leases: FakeLeases,
    who: String,
    read_rv: Option<u64>,
}

impl FakeLock {
    /// Fails or hangs as the store is set to at this time.
    async fn api(&self) -> Result<(), LeaseError> {
        let now = self.leases.clock.now();
        let takeover = {
            let mut st = self.leases.st();
            match &st.takeover_from {
                Some((t, _)) if now >= *t => st.takeover_from.take(),
                _ => None,
            }
        };
        if let Some((_, spec)) = takeover {
            self.leases.write_as("other", spec);
        }
        let (fail, hang) = {
            let st = self.leases.st();
            (
                st.fail_from.is_some_and(|t| now >= t),
                st.hang_from.is_some_and(|t| now >= t),
            )
        };
        if hang {
            std::future::pending::<()>().await;
        }
        if fail {
            return Err(LeaseError::Api {
                lease: self.describe(),
                action: "get",
                source: kube::Error::Api(Box::new(kube::core::Status {
                    code: 503,
                    message: "unavailable".into(),
                    ..Default::default()
                })),
            });
        }
        Ok(())
    }
}

impl LeaseLock for FakeLock {
    async fn get(&mut self) -> Result<Option<LeaseSpec>, LeaseError> {
        self.api().await?;
        let st = self.leases.st();
        self.read_rv = st.lease.as_ref().map(|(_, rv)| *rv);
        Ok(st.lease.as_ref().map(|(s, _)| s.clone()))
    }

    async fn create(&mut self, spec: LeaseSpec) -> Result<(), LeaseError> {
        self.api().await?;
        if self.leases.current().is_some() {
            return Err(LeaseError::Conflict {
                lease: self.describe(),
            });
        }
        self.leases.write_as(&self.who, spec);
        self.read_rv = Some(self.leases.rv());
        Ok(())
    }

    async fn update(&mut self, spec: LeaseSpec) -> Result<(), LeaseError> {
        self.api().await?;
        let race = self.leases.st().race.take();
        if let Some(theirs) = race {
            self.leases.write_as("racer", theirs);
        }
        let Some(read) = self.read_rv else {
            return Err(LeaseError::NotRead {
                lease: self.describe(),
            });
        };
        if self.leases.rv() != read {
            return Err(LeaseError::Conflict {
                lease: self.describe(),
            });
        }
        self.leases.write_as(&self.who, spec);
        self.read_rv = Some(self.leases.rv());
        Ok(())
    }

    fn describe(&self) -> String {
        "kube-system/test".into()
    }
}

fn config(identity: &str) -> ElectionConfig {
    ElectionConfig::new(identity)
}

fn elector(
    clock: &FakeClock,
    leases: &FakeLeases,
    who: &str,
    jitter: f64,
) -> LeaderElector<FakeLock, FakeClock> {
    LeaderElector::with_clock(
        config(who),
        leases.lock(who),
        clock.clone(),
        Box::new(move || jitter),
    )
    .expect("valid config")
}

/// A lease held by "other" (after `transitions` transitions) and "me" a candidate for it.
fn against_other(
    clock: &FakeClock,
    transitions: i32,
) -> (FakeLeases, LeaderElector<FakeLock, FakeClock>) {
    let leases = FakeLeases::new(clock);
    leases.write_as("other", theirs(clock.wall(), transitions));
    let me = elector(clock, &leases, "me", 0.0);
    (leases, me)
}

/// Another holder's record, renewed at `renew` by *its* clock.
fn theirs(renew: Timestamp, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        lease_transitions: Some(transitions),
        ..record::fresh("other", 15, renew)
    }
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

#[tokio::test]
async fn an_absent_lease_is_created() {
    let clock = FakeClock::manual();
    let leases = FakeLeases::new(&clock);
    let mut me = elector(&clock, &leases, "me", 0.0);
    assert!(matches!(me.try_acquire_or_renew().await, Attempt::Leading));
    let lease = leases.current().expect("created");
    assert_eq!(holder(&lease), "me");
    assert_eq!(lease.lease_duration_seconds, Some(15));
    assert_eq!(lease.lease_transitions, Some(0));
    assert!(me.is_leader());
}

#[tokio::test]
async fn a_fresh_lease_held_by_another_is_not_written() {
    let clock = FakeClock::manual();
    let (leases, mut me) = against_other(&clock, 0);
    for _ in 0..8 {
        let a = me.try_acquire_or_renew().await;
        assert!(matches!(&a, Attempt::HeldBy(h) if h == "other"), "{a:?}");
        clock.advance(Duration::from_millis(1_875));
    }
    // 14 s without a change: still held.
    assert_eq!(leases.writes().len(), 1, "only the holder's own write");
    assert_eq!(me.leader(), Some("other"));
    assert!(!me.is_leader());
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_with_a_transition() {
    let clock = FakeClock::manual();
    let (leases, mut me) = against_other(&clock, 4);
    assert!(matches!(
        me.try_acquire_or_renew().await,
        Attempt::HeldBy(_)
    ));
    clock.advance(Duration::from_secs(15));
    assert!(matches!(me.try_acquire_or_renew().await, Attempt::Leading));
    let lease = leases.current().expect("lease");
    assert_eq!(holder(&lease), "me");
    assert_eq!(lease.lease_transitions, Some(5));
}

#[tokio::test]
async fn a_renewal_seen_by_the_candidate_restarts_its_wait() {
    let clock = FakeClock::manual();
    let (leases, mut me) = against_other(&clock, 0);
    assert!(matches!(
        me.try_acquire_or_renew().await,
        Attempt::HeldBy(_)
    ));
    clock.advance(Duration::from_secs(10));
    leases.write_as("other", theirs(clock.wall(), 0));
    assert!(matches!(
        me.try_acquire_or_renew().await,
        Attempt::HeldBy(_)
    ));
    clock.advance(Duration::from_secs(14));
    assert!(
        matches!(me.try_acquire_or_renew().await, Attempt::HeldBy(_)),
        "24 s after start but only 14 s after the renewal was seen"
    );
    clock.advance(Duration::from_secs(1));
    assert!(matches!(me.try_acquire_or_renew().await, Attempt::Leading));
}

#[tokio::test]
async fn skewed_remote_clocks_do_not_matter() {
    // The holder's clock is a year ahead, then a year behind: its renewTime says nothing
    // about expiry, only when the candidate saw the record change.
    for skew_secs in [365 * 86_400, -365 * 86_400] {
        let clock = FakeClock::manual();
        let leases = FakeLeases::new(&clock);
        let skewed = clock
            .wall()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(skew_secs))
            .expect("in range");
        leases.write_as("other", theirs(skewed, 0));
        let mut me = elector(&clock, &leases, "me", 0.0);
        assert!(
            matches!(me.try_acquire_or_renew().await, Attempt::HeldBy(_)),
            "skew {skew_secs}"
        );
        clock.advance(Duration::from_millis(14_999));
        assert!(
            matches!(me.try_acquire_or_renew().await, Attempt::HeldBy(_)),
            "skew {skew_secs}"
        );
        clock.advance(Duration::from_millis(1));
        assert!(
            matches!(me.try_acquire_or_renew().await, Attempt::Leading),
            "skew {skew_secs}"
        );
    }
}

#[tokio::test]
async fn the_leader_renews_its_own_lease() {
    let clock = FakeClock::manual();
    let leases = FakeLeases::new(&clock);
    let mut me = elector(&clock, &leases, "me", 0.0);
    assert!(matches!(me.try_acquire_or_renew().await, Attempt::Leading));
    let first = leases.current().expect("lease");
    clock.advance(Duration::from_secs(2));
    assert!(matches!(me.try_acquire_or_renew().await, Attempt::Leading));
    let renewed = leases.current().expect("lease");
    assert_eq!(renewed.acquire_time, first.acquire_time);
    assert_eq!(renewed.lease_transitions, Some(0));
    assert_ne!(renewed.renew_time, first.renew_time);
    assert_eq!(leases.writes().len(), 2);
}

#[tokio::test]
async fn a_conflicting_update_loses_the_race() {
    let clock = FakeClock::manual();
    let (leases, mut me) = against_other(&clock, 0);
    assert!(matches!(
        me.try_acquire_or_renew().await,
        Attempt::HeldBy(_)
    ));
    clock.advance(Duration::from_secs(16));
    // Another candidate takes the expired lease between this one's read and its write.
    leases.st().race = Some(LeaseSpec {
        lease_transitions: Some(1),
        ..record::fresh("racer", 15, clock.wall())
    });
    let a = me.try_acquire_or_renew().await;
    assert!(matches!(&a, Attempt::Failed(e) if e.is_conflict()), "{a:?}");
    assert!(!me.is_leader());
    assert_eq!(holder(&leases.current().expect("lease")), "racer");
    // The next try sees the racer's fresh record and waits for it.
    assert!(matches!(me.try_acquire_or_renew().await, Attempt::HeldBy(h) if h == "racer"));
}

#[tokio::test]
async fn a_create_race_is_lost_too() {
    let clock = FakeClock::manual();
    let leases = FakeLeases::new(&clock);
    let mut a = elector(&clock, &leases, "a", 0.0);
    let mut b = elector(&clock, &leases, "b", 0.0);
    // b reads "absent", then a creates, then b's create conflicts.
    let mut b_lock = leases.lock("b");
    assert_eq!(b_lock.get().await.expect("get"), None);
    assert!(matches!(a.try_acquire_or_renew().await, Attempt::Leading));
    let err = b_lock
        .create(record::fresh("b", 15, clock.wall()))
        .await
        .expect_err("exists");
    assert!(err.is_conflict());
    assert!(matches!(b.try_acquire_or_renew().await, Attempt::HeldBy(h) if h == "a"));
}

#[tokio::test]
async fn acquire_retries_every_jittered_retry_period() {
    for (jitter, expected_ms) in [(0.0, 16_000), (1.0, 17_600)] {
        let clock = FakeClock::virtual_time();
        let leases = FakeLeases::new(&clock);
        leases.write_as("other", theirs(clock.wall(), 0));
        let mut me = elector(&clock, &leases, "me", jitter);
        me.acquire().await;
        // Tries at 0, 2, 4, … s (or 0, 4.4, 8.8, … s with the full 1.2 jitter); the first
        // at or after 15 s from the first observation takes the lease.
        let off = clock.elapsed().abs_diff(Duration::from_millis(expected_ms));
        assert!(
            off < Duration::from_millis(1),
            "jitter {jitter}: {:?}",
            clock.elapsed()
        );
        assert_eq!(holder(&leases.current().expect("lease")), "me");
    }
}

/// The leader, with renewals failing from `broken_at` on (`hang`: the API stops answering
/// instead of erroring), and when it stopped leading.
async fn lose_lease(hang: bool) -> (Duration, Vec<(String, LeaseSpec)>) {
    let clock = FakeClock::virtual_time();
    let leases = FakeLeases::new(&clock);
    let me = elector(&clock, &leases, "me", 0.0);
    let broken_at = clock.now() + Duration::from_secs(7);
    if hang {
        leases.st().hang_from = Some(broken_at);
    } else {
        leases.st().fail_from = Some(broken_at);
    }
    let ended = me
        .run(std::future::pending(), |_stop| std::future::pending::<()>())
        .await;
    assert!(matches!(ended, Ended::LostLease), "{ended:?}");
    (clock.elapsed(), leases.writes())
}

#[tokio::test]
async fn the_leader_stops_when_renewals_fail_for_the_renew_deadline() {
    let (lost_at, writes) = lose_lease(false).await;
    // Created at 0, renewed at 0, 2, 4 and 6; the round starting at 8 fails until 18.
    assert_eq!(writes.len(), 5);
    assert_eq!(lost_at, Duration::from_secs(18));
    // Others may take over 15 s after they saw the last renewal (at 6 s): 21 s > 18 s.
    assert!(lost_at < Duration::from_secs(6 + 15));
}

#[tokio::test]
async fn a_hanging_api_call_is_bounded_by_the_renew_deadline() {
    let (lost_at, writes) = lose_lease(true).await;
    assert_eq!(writes.len(), 5);
    assert_eq!(lost_at, Duration::from_secs(18));
}

#[tokio::test]
async fn a_leader_that_reads_another_holder_stops_at_once() {
    let clock = FakeClock::virtual_time();
    let leases = FakeLeases::new(&clock);
    let me = elector(&clock, &leases, "me", 0.0);
    // Another candidate writes its record at 5 s (as after this one stalled past the lease).
    leases.st().takeover_from = Some((
        clock.now() + Duration::from_secs(5),
        LeaseSpec {
            lease_transitions: Some(1),
            ..record::fresh("other", 15, clock.wall())
        },
    ));
    let ended = me
        .run(std::future::pending(), |_stop| std::future::pending::<()>())
        .await;
    assert!(matches!(ended, Ended::LostLease), "{ended:?}");
    // The first renewal after the takeover (at 6 s) reads it and stops: no write over it.
    assert_eq!(clock.elapsed(), Duration::from_secs(6));
    assert_eq!(holder(&leases.current().expect("lease")), "other");
}

#[tokio::test]
async fn a_leader_stopped_past_its_renew_deadline_gives_up_on_waking_without_writing() {
    let clock = FakeClock::virtual_time();
    let leases = FakeLeases::new(&clock);
    let me = elector(&clock, &leases, "me", 0.0);
    // Renewed at 0, 2 and 4 s; the sleep after that lasts 20 s more (the process stopped).
    clock.stall(Duration::from_secs(4), Duration::from_secs(20));
    let ended = me
        .run(std::future::pending(), |_stop| std::future::pending::<()>())
        .await;
    assert!(matches!(ended, Ended::LostLease), "{ended:?}");
    assert_eq!(clock.elapsed(), Duration::from_secs(26));
    // Created, renewed at 0, 2, 4: no write after waking, whoever holds the lease now.
    assert_eq!(leases.writes().len(), 4);
}

#[tokio::test]
async fn shutdown_stops_the_work_then_releases_the_lease() {
    let clock = FakeClock::virtual_time();
    let leases = FakeLeases::new(&clock);
    let me = elector(&clock, &leases, "me", 0.0);
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let work_log = Arc::clone(&log);
    let work_leases = leases.clone();
    let run = me.run(
        async {
            let _ = shutdown_rx.await;
        },
        |stop| async move {
            stop.await;
            // What the work saw as the lease when it finished: still held by it.
            let lease = work_leases.current().expect("lease");
            work_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("work done, holder {}", holder(&lease)));
            42
        },
    );
    let run = tokio::spawn(run);
    tokio::task::yield_now().await;
    let _ = shutdown_tx.send(());
    let ended = run.await.expect("run");
    assert!(matches!(ended, Ended::Finished(42)), "{ended:?}");
    assert_eq!(
        *log.lock().unwrap_or_else(|e| e.into_inner()),
        vec!["work done, holder me".to_string()]
    );
    let lease = leases.current().expect("lease");
    assert_eq!(holder(&lease), "");
    assert_eq!(lease.lease_duration_seconds, Some(1));
    // A standby takes it at its next try.
    let mut standby = elector(&clock, &leases, "standby", 0.0);
    assert!(matches!(
        standby.try_acquire_or_renew().await,
        Attempt::Leading
    ));
    assert_eq!(leases.current().expect("lease").lease_transitions, Some(1));
}

#[tokio::test]
async fn shutdown_before_leading_writes_nothing() {
    let clock = FakeClock::virtual_time();
    let (leases, me) = against_other(&clock, 0);
    let ended = me.run(async {}, |_stop| std::future::ready(())).await;
    assert!(matches!(ended, Ended::Cancelled), "{ended:?}");
    assert_eq!(leases.writes().len(), 1);
}

#[test]
fn validation_follows_client_go() {
    let ok = ElectionConfig::new("me");
    assert_eq!(ok.validate(), Ok(()));
    let cases = [
        (15_000, 15_000, 2_000, "greater than the renew deadline"),
        (15_000, 2_400, 2_000, "1.2 × the retry period"),
        (15_500, 10_000, 2_000, "whole number of seconds"),
        (15_000, 10_000, 0, "retry period must be greater than zero"),
    ];
    for (lease, renew, retry, message) in cases {
        let c = ElectionConfig {
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(renew),
            retry_period: Duration::from_millis(retry),
            ..ElectionConfig::new("me")
        };
        let err = c.validate().expect_err("invalid");
        assert!(err.to_string().contains(message), "{err} lacks {message:?}");
    }
    let short = ElectionConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
        ..ElectionConfig::new("me")
    };
    assert_eq!(short.validate(), Ok(()));
    assert!(ElectionConfig::new("").validate().is_err());
}

#[test]
fn identities_are_unique_per_process_and_name_the_host() {
    let a = default_identity();
    let b = default_identity();
    assert_ne!(a, b);
    let (host, uuid) = a.rsplit_once('_').expect("hostname_uuid");
    assert!(!host.is_empty());
    assert_eq!(uuid.len(), 36);
}
