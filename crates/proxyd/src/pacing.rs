//! When the next change-driven sync may start (`--min-sync-period`).
//!
//! kube-proxy's rule is a fixed minimum: at most one sync per period, with a burst of two
//! (its `BoundedFrequencyRunner`, a token bucket). It exists to bound the CPU that syncs take
//! when changes keep coming, and it was sized for iptables syncs of seconds; for a data-only
//! nftables sync of a millisecond it only adds latency: a Deployment whose three pods turn
//! Ready within a second of the Service's creation was served by one pod, or refused, for up
//! to a second after `kubectl rollout status` returned.
//!
//! [`MinSyncPeriod::Auto`] (svcnet's default) bounds the same thing directly: after a sync
//! that took `d`, the next waits `9 × d`, so change-driven syncs use at most a tenth of a core,
//! and never more than [`AUTO_CAP`] (kube-proxy's default period), so a slow dataplane is never
//! paced slower than kube-proxy would pace it. A fixed period keeps kube-proxy's rule exactly.
//! The periodic full resync is paced by its own period and does not count.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The longest wait `Auto` imposes (kube-proxy's default `--min-sync-period`).
pub const AUTO_CAP: Duration = Duration::from_secs(1);
/// `Auto` waits this many times the last sync's duration.
const AUTO_FACTOR: u32 = 9;
/// kube-proxy's burst of syncs before the fixed period applies.
const BURST: f64 = 2.0;

/// `--min-sync-period`: `auto` or a duration (`1s`, `500ms`, `0s`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MinSyncPeriod {
    #[default]
    Auto,
    Fixed(Duration),
}

impl fmt::Display for MinSyncPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(d) => write!(f, "{}ms", d.as_millis()),
        }
    }
}

impl FromStr for MinSyncPeriod {
    type Err = String;

    /// `auto`, or a duration: `1500ms`, `1s`, `2m`, `1h` (or plain seconds).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        parse_duration(s)
            .map(Self::Fixed)
            .map_err(|e| format!("{e}, or auto"))
    }
}

/// Parses `1500ms`, `1s`, `2m`, `1h` (or plain seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (like 500ms, 1s, 2m)");
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// The pacing state of one sync loop, per rule.
#[derive(Debug)]
pub(crate) enum Pacer {
    /// `Auto`: the earliest start of the next change-driven sync.
    Auto { next: Option<Instant> },
    /// A fixed period: kube-proxy's token bucket, `tokens` (at most `BURST`) as of `refilled`.
    Fixed {
        period: Duration,
        tokens: f64,
        refilled: Instant,
    },
    /// `0s`: every change at once.
    Unpaced,
}

impl Pacer {
    pub fn new(rule: MinSyncPeriod, now: Instant) -> Self {
        match rule {
            MinSyncPeriod::Auto => Self::Auto { next: None },
            MinSyncPeriod::Fixed(period) if period.is_zero() => Self::Unpaced,
            MinSyncPeriod::Fixed(period) => Self::Fixed {
                period,
                tokens: BURST,
                refilled: now,
            },
        }
    }

    /// The earliest a change-driven sync may start, seen at `now`.
    pub fn earliest(&self, now: Instant) -> Instant {
        match *self {
            Self::Auto { next } => next.map_or(now, |t| t.max(now)),
            Self::Unpaced => now,
            Self::Fixed {
                period,
                tokens,
                refilled,
            } => {
                let tokens = tokens_at(period, tokens, refilled, now);
                if tokens >= 1.0 {
                    now
                } else {
                    now + period.mul_f64(1.0 - tokens)
                }
            }
        }
    }

    /// A sync ran from `started` to `ended`; `periodic` when the resync timer started it.
    pub fn record(&mut self, started: Instant, ended: Instant, periodic: bool) {
        match self {
            Self::Auto { next } => {
                if !periodic {
                    let took = ended.saturating_duration_since(started);
                    *next = Some(ended + (took * AUTO_FACTOR).min(AUTO_CAP));
                }
            }
            Self::Unpaced => {}
            Self::Fixed {
                period,
                tokens,
                refilled,
            } => {
                // kube-proxy's runner takes a token for every run, the periodic one too.
                *tokens = (tokens_at(*period, *tokens, *refilled, started) - 1.0).max(0.0);
                *refilled = started;
            }
        }
    }
}

/// The bucket's tokens at `now`: `tokens` at `refilled`, one more per `period`, at most `BURST`.
fn tokens_at(period: Duration, tokens: f64, refilled: Instant, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(refilled).as_secs_f64();
    (tokens + elapsed / period.as_secs_f64()).min(BURST)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn parses_auto_and_durations() {
        assert_eq!("auto".parse(), Ok(MinSyncPeriod::Auto));
        assert_eq!(
            "250ms".parse(),
            Ok(MinSyncPeriod::Fixed(Duration::from_millis(250)))
        );
        assert_eq!("0s".parse(), Ok(MinSyncPeriod::Fixed(Duration::ZERO)));
        assert_eq!(
            "2".parse(),
            Ok(MinSyncPeriod::Fixed(Duration::from_secs(2)))
        );
        let err = "soon".parse::<MinSyncPeriod>().unwrap_err();
        assert!(
            err.contains("\"soon\" is not a duration") && err.ends_with("or auto"),
            "{err}"
        );
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1d").is_err());
    }

    #[test]
    fn auto_waits_nine_times_the_last_sync_at_most_a_second() {
        let t0 = Instant::now();
        let mut p = Pacer::new(MinSyncPeriod::Auto, t0);
        assert_eq!(p.earliest(t0), t0, "the first sync is not held");
        // A 2 ms sync: the next may start 18 ms after it ended.
        p.record(t0, t0 + 2 * MS, false);
        assert_eq!(p.earliest(t0 + 3 * MS), t0 + 20 * MS);
        assert_eq!(p.earliest(t0 + 50 * MS), t0 + 50 * MS);
        // A 400 ms sync would mean 3.6 s: capped at kube-proxy's 1 s.
        let t1 = t0 + 100 * MS;
        p.record(t1, t1 + 400 * MS, false);
        assert_eq!(p.earliest(t1 + 400 * MS), t1 + 1400 * MS);
        // The periodic resync does not count: what was allowed stays allowed.
        let t2 = t0 + 5000 * MS;
        p.record(t2, t2 + 1300 * MS, true);
        assert_eq!(p.earliest(t2 + 1300 * MS), t2 + 1300 * MS);
    }

    #[test]
    fn fixed_is_kube_proxys_token_bucket_with_a_burst_of_two() {
        let t0 = Instant::now();
        let period = Duration::from_secs(1);
        let mut p = Pacer::new(MinSyncPeriod::Fixed(period), t0);
        // Two syncs at once, then one per period.
        assert_eq!(p.earliest(t0), t0);
        p.record(t0, t0 + MS, false);
        assert_eq!(p.earliest(t0 + 2 * MS), t0 + 2 * MS);
        p.record(t0 + 2 * MS, t0 + 3 * MS, false);
        let third = p.earliest(t0 + 4 * MS);
        assert!(
            third >= t0 + 999 * MS && third <= t0 + 1001 * MS,
            "the third sync waits for a token: {:?}",
            third - t0
        );
        p.record(third, third + MS, false);
        let fourth = p.earliest(third + MS);
        assert!(fourth >= third + 999 * MS, "{:?}", fourth - third);
        // After a quiet while the burst is back, never more than two.
        let later = t0 + 10_000 * MS;
        p.record(later, later, false);
        assert_eq!(p.earliest(later), later);
        p.record(later, later, false);
        assert!(p.earliest(later) > later);
    }

    #[test]
    fn fixed_zero_never_waits() {
        let t0 = Instant::now();
        let mut p = Pacer::new(MinSyncPeriod::Fixed(Duration::ZERO), t0);
        for i in 0..5 {
            p.record(t0, t0 + 100 * MS, false);
            assert_eq!(p.earliest(t0 + i * MS), t0 + i * MS);
        }
    }
}
