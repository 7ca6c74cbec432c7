//! The runtime's clock: the OS monotonic clock converted to the core's [`Time`].
//!
//! **This is the only place the OS clock enters the runtime.** Every other runtime
//! component reads time through a [`Clock`] and hands the resulting [`Time`] to the
//! scheduling core, which never reads a clock itself. Keeping the conversion here means
//! there is one epoch per run, one rounding rule, and one place to swap the time source
//! (for instance to a shared-memory clock across processes).
//!
//! A [`Clock`] is `Copy`: every thread of a run gets a copy of the same clock, so all
//! threads agree on the epoch and their [`Time`]s are comparable.

use crate::core::{Dur, Time};
use std::time::{Duration, Instant};

/// The run's clock: nanoseconds of the OS monotonic clock ([`Instant`]) since a fixed
/// epoch, as the core's [`Time`].
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: Instant,
}

impl Clock {
    /// A clock whose epoch ([`Time::ZERO`]) is the current instant.
    pub fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
        }
    }

    /// A clock whose epoch ([`Time::ZERO`]) is `epoch`.
    pub fn with_epoch(epoch: Instant) -> Clock {
        Clock { epoch }
    }

    /// The instant that [`Time::ZERO`] stands for.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// The current time: nanoseconds elapsed since the epoch. Monotonic (never goes
    /// backwards); saturates at `i64::MAX` nanoseconds (about 292 years).
    #[inline]
    pub fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    /// The [`Time`] of `instant`. Instants before the epoch map to [`Time::ZERO`].
    #[inline]
    pub fn time_of(&self, instant: Instant) -> Time {
        let ns = instant.saturating_duration_since(self.epoch).as_nanos();
        Time(i64::try_from(ns).unwrap_or(i64::MAX))
    }

    /// The [`Instant`] that `t` stands for; the inverse of [`Clock::now`] to the
    /// nanosecond. Times before the epoch clamp to the epoch; times beyond what
    /// [`Instant`] can represent saturate at the largest representable instant.
    pub fn instant_of(&self, t: Time) -> Instant {
        let Ok(ns) = u64::try_from(t.0) else {
            return self.epoch;
        };
        let mut d = Duration::from_nanos(ns);
        // `Instant + Duration` panics on overflow; halve until it fits. On the common
        // platforms even `i64::MAX` ns fits, so this loop runs once.
        loop {
            if let Some(i) = self.epoch.checked_add(d) {
                return i;
            }
            d /= 2;
        }
    }

    /// How long ago `t` was: `now() - t` (negative when `t` is in the future).
    #[inline]
    pub fn since(&self, t: Time) -> Dur {
        self.now() - t
    }
}

impl Default for Clock {
    /// Same as [`Clock::new`]: the epoch is the current instant.
    fn default() -> Clock {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic() {
        let c = Clock::new();
        let mut last = c.now();
        assert!(last >= Time::ZERO);
        for _ in 0..10_000 {
            let t = c.now();
            assert!(t >= last, "{t:?} < {last:?}");
            last = t;
        }
        std::thread::sleep(Duration::from_millis(2));
        assert!(c.now() - last >= Dur::from_ms(2));
    }

    #[test]
    fn round_trip_within_one_microsecond() {
        let c = Clock::new();
        std::thread::sleep(Duration::from_millis(1));
        for _ in 0..1_000 {
            let t = c.now();
            let back = c.time_of(c.instant_of(t));
            assert!((back - t).ns().abs() < 1_000, "{t:?} -> {back:?}");
            let i = Instant::now();
            let t = c.time_of(i);
            let d = c.instant_of(t);
            let err = if d > i { d - i } else { i - d };
            assert!(err < Duration::from_micros(1), "{err:?}");
        }
    }

    #[test]
    fn before_epoch_clamps_and_far_future_saturates() {
        let c = Clock::new();
        assert_eq!(c.instant_of(Time(-5)), c.epoch());
        assert_eq!(c.instant_of(Time::EPOCH_MIN), c.epoch());
        assert!(c.instant_of(Time::NEVER) > c.instant_of(c.now()));
        // Must not panic.
        let _ = c.instant_of(Time(i64::MAX));
        let later = Clock::new();
        assert_eq!(later.time_of(c.epoch()), Time::ZERO);
    }

    #[test]
    fn since_measures_elapsed_time() {
        let c = Clock::new();
        let t = c.now();
        std::thread::sleep(Duration::from_millis(1));
        assert!(c.since(t) >= Dur::from_ms(1));
        assert!(c.since(c.now() + Dur::from_ms(100)) < Dur::ZERO);
    }

    #[test]
    fn copies_share_the_epoch() {
        let a = Clock::new();
        let b = a;
        let h = std::thread::spawn(move || b.now());
        let tb = h.join().expect("clock thread");
        assert!(a.now() >= tb);
    }
}
