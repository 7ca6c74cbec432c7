//! Clocks across hosts.
//!
//! Every time on the wire is on the **scheduler's clock**. A node estimates the
//! offset between its own monotonic clock and the scheduler's with ping/pong probes
//! (NTP's rule): it sends `Ping{sent = t0}` on its clock, the scheduler answers with
//! its clock `t1` at receipt, the node receives at `t2`. Then
//! `offset = t1 - (t0 + t2) / 2`, exact when both directions take equally long and
//! wrong by at most `rtt / 2` otherwise. The node keeps the sample with the smallest
//! round trip among the last [`WINDOW`] probes (queuing only ever adds delay, so the
//! fastest probe is the most trustworthy) and probes every heartbeat, so the estimate
//! follows drift.
//!
//! **Accuracy assumed:** the error is at most half the best recent round trip: tens
//! of microseconds over loopback or one switch. The scheduler folds the measured
//! round trips into d_ctrl (see [`super::scheduler`]), so a plan reaches its backend
//! early enough even with that error. Across hosts the monotonic clocks must not
//! drift faster than the probes correct (any NTP-disciplined host is fine).

use crate::core::{Dur, Time};
use crate::runtime::clock::Clock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Probes kept for the offset estimate.
pub const WINDOW: usize = 32;

/// A node's view of the scheduler's clock: its own clock plus an estimated offset.
#[derive(Clone, Debug)]
pub struct SchedClock {
    local: Clock,
    offset_ns: Arc<AtomicI64>,
    err_ns: Arc<AtomicI64>,
}

impl SchedClock {
    /// The scheduler's own clock (offset 0, exact).
    pub fn exact(local: Clock) -> SchedClock {
        SchedClock {
            local,
            offset_ns: Arc::new(AtomicI64::new(0)),
            err_ns: Arc::new(AtomicI64::new(0)),
        }
    }

    /// The node's own clock.
    pub fn local(&self) -> Clock {
        self.local
    }

    /// Now, on the scheduler's clock.
    #[inline]
    pub fn now(&self) -> Time {
        Time(self.local.now().0 + self.offset_ns.load(Ordering::Relaxed))
    }

    /// Scheduler time `t` on this node's clock.
    #[inline]
    pub fn to_local(&self, t: Time) -> Time {
        Time(t.0 - self.offset_ns.load(Ordering::Relaxed))
    }

    /// This node's time `t` on the scheduler's clock.
    #[inline]
    pub fn from_local(&self, t: Time) -> Time {
        Time(t.0 + self.offset_ns.load(Ordering::Relaxed))
    }

    /// The local instant of scheduler time `t`.
    pub fn instant_of(&self, t: Time) -> Instant {
        self.local.instant_of(self.to_local(t))
    }

    pub fn offset(&self) -> Dur {
        Dur(self.offset_ns.load(Ordering::Relaxed))
    }

    /// Bound on the offset's error (half the round trip of the sample used).
    pub fn error_bound(&self) -> Dur {
        Dur(self.err_ns.load(Ordering::Relaxed))
    }

    pub fn set(&self, offset: i64, err: i64) {
        self.offset_ns.store(offset, Ordering::Relaxed);
        self.err_ns.store(err, Ordering::Relaxed);
    }
}

/// Keeps the recent probes and sets a [`SchedClock`] from the best of them.
#[derive(Debug, Default)]
pub struct OffsetEstimator {
    /// (round trip, offset) of the last probes.
    samples: VecDeque<(i64, i64)>,
}

impl OffsetEstimator {
    pub fn new() -> OffsetEstimator {
        OffsetEstimator::default()
    }

    /// Adds the probe sent at `t0` (local), stamped `t1` by the scheduler, received
    /// at `t2` (local); updates `clock`; returns the probe's round trip.
    pub fn add(&mut self, t0: Time, t1: Time, t2: Time, clock: &SchedClock) -> Dur {
        let rtt = self.push(t0, t1, t2);
        let (off, err) = self.best().expect("just pushed");
        clock.set(off.0, err.0);
        rtt
    }

    /// Adds a probe without a clock to update (what the cluster simulator's nodes
    /// do); returns its round trip.
    pub fn push(&mut self, t0: Time, t1: Time, t2: Time) -> Dur {
        // Saturating: the times come from the wire (a pong echoes what we sent,
        // but a broken peer may echo anything).
        let rtt = t2.0.saturating_sub(t0.0).max(0);
        let offset = t1.0.saturating_sub(t0.0.saturating_add(rtt / 2));
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back((rtt, offset));
        Dur(rtt)
    }

    /// The offset of the fastest recent probe and its error bound (half its round
    /// trip); None before the first probe.
    pub fn best(&self) -> Option<(Dur, Dur)> {
        self.samples
            .iter()
            .min_by_key(|s| s.0)
            .map(|&(rtt, off)| (Dur(off), Dur(rtt / 2)))
    }

    pub fn samples(&self) -> usize {
        self.samples.len()
    }
}

/// The last `cap` values of a measurement, for percentiles.
#[derive(Debug, Clone)]
pub struct Recent {
    vals: VecDeque<i64>,
    cap: usize,
}

impl Recent {
    pub fn new(cap: usize) -> Recent {
        Recent {
            vals: VecDeque::with_capacity(cap),
            cap: cap.max(1),
        }
    }
    pub fn push(&mut self, v: i64) {
        if self.vals.len() == self.cap {
            self.vals.pop_front();
        }
        self.vals.push_back(v);
    }
    pub fn len(&self) -> usize {
        self.vals.len()
    }
    pub fn is_empty(&self) -> bool {
        self.vals.is_empty()
    }
    /// The `q` quantile (nearest rank), 0 when empty.
    pub fn quantile(&self, q: f64) -> i64 {
        if self.vals.is_empty() {
            return 0;
        }
        let mut v: Vec<i64> = self.vals.iter().copied().collect();
        v.sort_unstable();
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_from_the_fastest_probe() {
        let c = SchedClock::exact(Clock::new());
        let mut e = OffsetEstimator::new();
        // True offset +1000; a slow probe with asymmetric delay, then a fast one.
        e.add(Time(0), Time(1000 + 900), Time(1000), &c);
        assert_eq!(c.offset(), Dur(1400));
        e.add(Time(5000), Time(6000 + 10), Time(5020), &c);
        assert_eq!(c.offset(), Dur(1000));
        assert_eq!(c.error_bound(), Dur(10));
        // A later slow probe does not displace the fast one.
        e.add(Time(9000), Time(10_000 + 4000), Time(13_000), &c);
        assert_eq!(c.offset(), Dur(1000));
        assert_eq!(c.to_local(Time(7000)), Time(6000));
        assert_eq!(c.from_local(Time(6000)), Time(7000));
    }

    #[test]
    fn recent_quantiles() {
        let mut r = Recent::new(100);
        assert_eq!(r.quantile(0.99), 0);
        for v in 1..=200 {
            r.push(v);
        }
        assert_eq!(r.len(), 100);
        assert_eq!(r.quantile(0.5), 150);
        assert_eq!(r.quantile(0.99), 199);
        assert_eq!(r.quantile(1.0), 200);
    }
}
