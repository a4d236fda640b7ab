//! Time as the elector sees it: a monotonic clock for every expiry decision, the wall clock
//! only for the timestamps written into the Lease (which no candidate uses to judge expiry),
//! and sleeping. Injected so that tests drive time instead of waiting for it.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

/// The elector's source of time.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic now: observation times and deadlines are measured with it.
    fn now(&self) -> Instant;
    /// Wall-clock now, written into `renewTime` and `acquireTime`.
    fn wall(&self) -> Timestamp;
    /// Resolves once `d` has passed on this clock.
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send;
}

/// The process's clocks and tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> Timestamp {
        Timestamp::now()
    }

    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

/// A clock that moves only when told to, or (in virtual mode) by exactly as much as a sleep
/// asks for when that sleep is first polled: a single task's loop of sleeps runs in no real
/// time and in a fixed order, and a sleep raced against a future that is ready at once (a
/// fake API call, polled first) never moves the clock.
#[cfg(test)]
#[derive(Debug, Clone)]
pub struct FakeClock {
    inner: std::sync::Arc<std::sync::Mutex<FakeTime>>,
    virtual_sleep: bool,
}

#[cfg(test)]
#[derive(Debug)]
struct FakeTime {
    start: Instant,
    elapsed: Duration,
    wall_start: Timestamp,
    /// The first sleep polled at or after `.0` of elapsed time lasts `.1` longer (the
    /// process was stopped meanwhile).
    stall: Option<(Duration, Duration)>,
}

#[cfg(test)]
impl FakeClock {
    /// A clock at an arbitrary start whose sleeps advance it (virtual time).
    pub fn virtual_time() -> Self {
        Self {
            virtual_sleep: true,
            ..Self::manual()
        }
    }

    /// A clock that only [`FakeClock::advance`] moves (sleeping on it is a test bug).
    pub fn manual() -> Self {
        Self {
            inner: std::sync::Arc::new(std::sync::Mutex::new(FakeTime {
                start: Instant::now(),
                elapsed: Duration::ZERO,
                wall_start: Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH),
                stall: None,
            })),
            virtual_sleep: false,
        }
    }

    /// Makes the first sleep from `at` (elapsed) on last `extra` longer, as if the process
    /// had been stopped (SIGSTOP) during it.
    pub fn stall(&self, at: Duration, extra: Duration) {
        self.lock().stall = Some((at, extra));
    }

    pub fn advance(&self, d: Duration) {
        self.lock().elapsed += d;
    }

    /// Time passed since the clock was made.
    pub fn elapsed(&self) -> Duration {
        self.lock().elapsed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeTime> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn now(&self) -> Instant {
        let t = self.lock();
        t.start + t.elapsed
    }

    fn wall(&self) -> Timestamp {
        let t = self.lock();
        let elapsed = k8s_openapi::jiff::SignedDuration::try_from(t.elapsed)
            .unwrap_or(k8s_openapi::jiff::SignedDuration::ZERO);
        t.wall_start.checked_add(elapsed).unwrap_or(t.wall_start)
    }

    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        let clock = self.clone();
        async move {
            assert!(clock.virtual_sleep, "sleeping on a manual FakeClock");
            let extra = {
                let mut t = clock.lock();
                match t.stall {
                    Some((at, extra)) if t.elapsed >= at => {
                        t.stall = None;
                        extra
                    }
                    _ => Duration::ZERO,
                }
            };
            clock.advance(d + extra);
            // Yield so that a loop of sleeps lets the other futures of a select run.
            tokio::task::yield_now().await;
        }
    }
}
