//! The pure part of client-go's `tryAcquireOrRenew`: what a candidate remembers about the
//! Lease, and what it writes next, given the Lease it just read and the time on its own
//! clock. No I/O and no clock of its own: time comes in as arguments.
//!
//! Expiry is judged only by local observation: a candidate notes *when it first saw* each
//! new version of the record (by its own monotonic clock) and treats the lease as expired
//! once `leaseDurationSeconds` have passed since then without a change. The `renewTime`
//! written by the holder is never compared with the local clock, so skew between machines'
//! clocks does not matter (a difference in their *rates* does; see the module docs).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// What a candidate has seen of the Lease (client-go's `observedRecord`, `observedTime`
/// and `observedRawRecord`).
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// The record last read or written, and when (local monotonic time).
    record: Option<(LeaseSpec, Instant)>,
    /// The record as last read from the API: a read equal to it is no news and does not
    /// move the observation time.
    last_read: Option<LeaseSpec>,
}

/// What to do after reading the Lease.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Someone else holds the lease and, by the local clock, it has not expired: wait.
    HeldBy {
        holder: String,
        /// Time left until this candidate may take the lease over.
        expires_in: Duration,
    },
    /// Write this record over the one read (conditional on the read's resourceVersion).
    Write {
        spec: LeaseSpec,
        /// Whether this write takes the lease over from another holder (or from nobody).
        takeover: bool,
    },
}

impl Observation {
    /// The holder of the record last seen, if any.
    pub fn holder(&self) -> Option<&str> {
        self.record
            .as_ref()
            .and_then(|(r, _)| r.holder_identity.as_deref())
            .filter(|h| !h.is_empty())
    }

    /// Whether `me` holds the record last seen.
    pub fn is_leader(&self, me: &str) -> bool {
        self.holder() == Some(me)
    }

    /// Whether the record last seen is still valid at `now`: its `leaseDurationSeconds` have
    /// not yet passed since it was seen.
    pub fn is_valid(&self, now: Instant) -> bool {
        self.valid_for(now) > Duration::ZERO
    }

    /// How long the record last seen stays valid after `now` (zero when it has expired).
    fn valid_for(&self, now: Instant) -> Duration {
        let Some((record, seen)) = &self.record else {
            return Duration::ZERO;
        };
        let secs = record.lease_duration_seconds.unwrap_or(0).max(0);
        let until = *seen + Duration::from_secs(u64::from(secs.unsigned_abs()));
        until.saturating_duration_since(now)
    }

    /// Remembers `spec` as the current record, seen at `now` (after a successful write).
    pub fn set(&mut self, spec: LeaseSpec, now: Instant) {
        self.record = Some((spec, now));
    }

    /// Steps 3 and 4 of `tryAcquireOrRenew`: `read` is the Lease's spec just read, at `now`.
    pub fn decide(
        &mut self,
        me: &str,
        duration_seconds: i32,
        now: Instant,
        wall: Timestamp,
        read: &LeaseSpec,
    ) -> Decision {
        if self.last_read.as_ref() != Some(read) {
            self.record = Some((read.clone(), now));
            self.last_read = Some(read.clone());
        }
        if let Some(holder) = self.holder()
            && holder != me
            && self.is_valid(now)
        {
            return Decision::HeldBy {
                holder: holder.to_string(),
                expires_in: self.valid_for(now),
            };
        }
        let mut spec = fresh(me, duration_seconds, wall);
        let takeover = !self.is_leader(me);
        if takeover {
            spec.lease_transitions = Some(read.lease_transitions.unwrap_or(0).saturating_add(1));
        } else {
            spec.acquire_time = read.acquire_time.clone();
            spec.lease_transitions = read.lease_transitions;
        }
        Decision::Write { spec, takeover }
    }

    /// The record that gives the lease up (client-go's `release`): no holder, a one-second
    /// duration so that the others take over at their next try; `None` when `me` does not
    /// hold it.
    pub fn release(&self, me: &str, wall: Timestamp) -> Option<LeaseSpec> {
        let (record, _) = self.record.as_ref().filter(|_| self.is_leader(me))?;
        let time = micro_time(wall);
        Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(time.clone()),
            renew_time: Some(time),
            lease_transitions: record.lease_transitions,
            ..LeaseSpec::default()
        })
    }
}

/// The record of `me` holding the lease from `wall` on (what a create writes).
pub fn fresh(me: &str, duration_seconds: i32, wall: Timestamp) -> LeaseSpec {
    let time = micro_time(wall);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(duration_seconds),
        acquire_time: Some(time.clone()),
        renew_time: Some(time),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    }
}

/// A wall-clock time as a `MicroTime`, cut to the microseconds the API keeps (so the record
/// written equals the record read back).
fn micro_time(wall: Timestamp) -> MicroTime {
    let micros = wall.as_microsecond();
    MicroTime(Timestamp::from_microsecond(micros).unwrap_or(wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECS: i32 = 15;

    fn wall(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn held_by(holder: &str, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            lease_transitions: Some(transitions),
            ..fresh(holder, SECS, renewed)
        }
    }

    #[test]
    fn a_lease_held_by_another_is_respected_until_it_has_not_changed_for_its_duration() {
        let t0 = Instant::now();
        let mut obs = Observation::default();
        let theirs = held_by("other", wall(0), 3);
        let d = obs.decide("me", SECS, t0, wall(0), &theirs);
        assert_eq!(
            d,
            Decision::HeldBy {
                holder: "other".into(),
                expires_in: Duration::from_secs(15)
            }
        );
        // The same record read again later: no news, the clock of its expiry keeps running.
        let d = obs.decide("me", SECS, t0 + Duration::from_secs(14), wall(14), &theirs);
        assert!(
            matches!(d, Decision::HeldBy { expires_in, .. } if expires_in == Duration::from_secs(1))
        );
        let d = obs.decide("me", SECS, t0 + Duration::from_secs(15), wall(15), &theirs);
        let Decision::Write { spec, takeover } = d else {
            panic!("an expired lease is taken over, got {d:?}");
        };
        assert!(takeover);
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(
            spec.lease_transitions,
            Some(4),
            "a takeover counts a transition"
        );
        assert_eq!(spec.lease_duration_seconds, Some(SECS));
        assert_eq!(spec.acquire_time, Some(micro_time(wall(15))));
    }

    #[test]
    fn a_renewal_by_the_holder_restarts_the_expiry_from_when_it_was_seen() {
        let t0 = Instant::now();
        let mut obs = Observation::default();
        obs.decide("me", SECS, t0, wall(0), &held_by("other", wall(0), 0));
        let renewed = held_by("other", wall(10), 0);
        let d = obs.decide("me", SECS, t0 + Duration::from_secs(10), wall(10), &renewed);
        assert!(matches!(d, Decision::HeldBy { .. }));
        let d = obs.decide("me", SECS, t0 + Duration::from_secs(24), wall(24), &renewed);
        assert!(
            matches!(d, Decision::HeldBy { expires_in, .. } if expires_in == Duration::from_secs(1))
        );
    }

    #[test]
    fn the_holders_clock_does_not_matter_only_when_the_record_changed() {
        // The holder's renewTime is a day in the past, then a day in the future: neither
        // makes the lease look expired or fresher than its last observed change.
        let t0 = Instant::now();
        for skew in [-86_400, 86_400] {
            let mut obs = Observation::default();
            let d = obs.decide("me", SECS, t0, wall(0), &held_by("other", wall(skew), 0));
            assert!(
                matches!(d, Decision::HeldBy { expires_in, .. } if expires_in == Duration::from_secs(15)),
                "skew {skew}: {d:?}"
            );
            let later = t0 + Duration::from_secs(15);
            let d = obs.decide(
                "me",
                SECS,
                later,
                wall(15),
                &held_by("other", wall(skew), 0),
            );
            assert!(
                matches!(d, Decision::Write { takeover: true, .. }),
                "skew {skew}: {d:?}"
            );
        }
    }

    #[test]
    fn the_holder_renews_keeping_acquire_time_and_transitions() {
        let t0 = Instant::now();
        let mut obs = Observation::default();
        let mine = held_by("me", wall(0), 7);
        let d = obs.decide("me", SECS, t0 + Duration::from_secs(2), wall(2), &mine);
        let Decision::Write { spec, takeover } = d else {
            panic!("the holder renews, got {d:?}");
        };
        assert!(!takeover);
        assert_eq!(spec.acquire_time, mine.acquire_time);
        assert_eq!(spec.lease_transitions, Some(7));
        assert_eq!(spec.renew_time, Some(micro_time(wall(2))));
    }

    #[test]
    fn a_lease_without_a_holder_is_taken_at_once() {
        let t0 = Instant::now();
        let mut obs = Observation::default();
        let released = LeaseSpec {
            holder_identity: Some(String::new()),
            ..held_by("x", wall(0), 2)
        };
        let d = obs.decide("me", SECS, t0, wall(0), &released);
        assert!(
            matches!(&d, Decision::Write { takeover: true, spec } if spec.lease_transitions == Some(3)),
            "{d:?}"
        );
        // No holder at all (a lease created by hand).
        let mut obs = Observation::default();
        let d = obs.decide("me", SECS, t0, wall(0), &LeaseSpec::default());
        assert!(
            matches!(&d, Decision::Write { takeover: true, spec } if spec.lease_transitions == Some(1)),
            "{d:?}"
        );
    }

    #[test]
    fn release_gives_up_only_a_lease_held() {
        let t0 = Instant::now();
        let mut obs = Observation::default();
        assert_eq!(obs.release("me", wall(0)), None);
        obs.set(held_by("me", wall(0), 5), t0);
        let spec = obs.release("me", wall(3)).expect("held, so released");
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(5));
        obs.set(held_by("other", wall(0), 5), t0);
        assert_eq!(obs.release("me", wall(3)), None);
    }

    #[test]
    fn micro_time_keeps_microseconds() {
        let t =
            Timestamp::from_nanosecond(1_800_000_000_123_456_789).unwrap_or(Timestamp::UNIX_EPOCH);
        assert_eq!(micro_time(t).0.as_nanosecond(), 1_800_000_000_123_456_000);
    }
}
