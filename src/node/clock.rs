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
    /// Raises the newest value to at least `v` (pushes `v` when empty).
    pub fn raise_last(&mut self, v: i64) {
        match self.vals.back_mut() {
            Some(last) => *last = (*last).max(v),
            None => self.vals.push_back(v),
        }
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
        nearest_rank(self.vals.iter().copied().collect(), q)
    }
    /// The `q` quantile (nearest rank) of the values at most `max`; `max` when
    /// none is.
    pub fn quantile_within(&self, q: f64, max: i64) -> i64 {
        let v: Vec<i64> = self.vals.iter().copied().filter(|&x| x <= max).collect();
        if v.is_empty() {
            return max;
        }
        nearest_rank(v, q)
    }
}

/// The `q` quantile (nearest rank) of non-empty `v`.
fn nearest_rank(mut v: Vec<i64>, q: f64) -> i64 {
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    *v.select_nth_unstable(i).1
}

/// The recent distribution of a delay, for the network budget: the last `cap`
/// samples, where a burst — samples that arrive within [`BURST`] of the burst's
/// first one, as the messages that queued up behind a stall of the process or
/// the network do — counts as one sample, its largest.
///
/// Why: the budget is a high quantile of the delay (p99.9), and a stall of a few
/// milliseconds releases every message it held at once, each with a large delay.
/// Counted one by one they fill the top of the distribution and the budget jumps
/// to its cap on a single stall, then falls back when they age out: the
/// oscillation measured as d_ctrl swinging between 242 µs and 1,246 µs from run to
/// run. Counted as one, a stall is one slow message among `cap`, and the budget
/// moves only when stalls are frequent enough to be part of the distribution.
#[derive(Debug, Clone)]
pub struct Delays {
    recent: Recent,
    /// When the open burst began (`None`: no sample yet).
    burst_at: Option<Time>,
}

/// Whether a measured budget `now` moved far enough from `last` to be worth
/// applying: by more than a tenth of `last`, and at least a tenth of `floor`
/// (so that tiny budgets do not churn on noise). The network budget and the
/// response margins change the core's plans only on such moves.
pub fn moved(now: Dur, last: Dur, floor: Dur) -> bool {
    (now - last).0.saturating_abs().saturating_mul(10) > last.0.max(floor.0)
}

/// Samples that arrive this close to the first of a burst count as one.
pub const BURST: Dur = Dur(200_000);

/// A budget read once a period that rises only on two readings in a row: what
/// it gives is the lower of the latest reading and the one before (the first
/// reading gives nothing).
///
/// Why: [`Delays`] counts a stall's queued-up samples once, but a stall of the
/// host that slows every hand-off for a few hundred milliseconds is many
/// samples spread over time, and at thousands of requests per second they
/// fill the window: the response margin rose from 3.5 ms to its 5 ms cap in the
/// second of such a stall, and every queued request's budget shrank by the
/// difference while it lasted (the front door's bursts, docs/results.md). The
/// stall's answers are late whatever the margin; raising it then only costs
/// the requests after it. A lasting rise still comes through one period later,
/// and a fall at once.
#[derive(Debug, Clone, Default)]
pub struct RiseFilter {
    prev: Option<Dur>,
}

impl RiseFilter {
    /// The budget to go by after reading `now`.
    pub fn next(&mut self, now: Dur) -> Option<Dur> {
        let out = self.prev.map(|p| p.min(now));
        self.prev = Some(now);
        out
    }
}

/// Quantiles of the body of a delay distribution and how far beyond each its
/// tail may reach ([`Delays::tail`]): an exponential delay has p99.9 = 3 × p90
/// = 1.5 × p99, and a constant part only lowers the ratios.
pub const TAIL_BOUNDS: [(f64, f64); 2] = [(0.9, 3.0), (0.99, 1.5)];

impl Delays {
    pub fn new(cap: usize) -> Delays {
        Delays {
            recent: Recent::new(cap),
            burst_at: None,
        }
    }

    /// A delay `v` (ns) measured on a message that arrived at `at`.
    pub fn push(&mut self, at: Time, v: i64) {
        match self.burst_at {
            Some(b) if at >= b && at - b < BURST => self.recent.raise_last(v),
            _ => {
                self.recent.push(v);
                self.burst_at = Some(at);
            }
        }
    }

    /// Samples kept (bursts count once).
    pub fn len(&self) -> usize {
        self.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }

    /// The `q` quantile (nearest rank), 0 when empty.
    pub fn quantile(&self, q: f64) -> i64 {
        self.recent.quantile(q)
    }

    /// The delay's tail at quantile `q`, for the budget: the `q` quantile of the
    /// samples within every one of [`TAIL_BOUNDS`]: 3 × p90 and 1.5 × p99. A
    /// network whose tail is no heavier than exponential lies within them and
    /// is covered as measured; what lies farther out are stalls (a descheduled
    /// thread, a page fault), which a budget cannot cover at a price worth
    /// paying — several milliseconds on every batch — and which the few hundred
    /// samples a backend has would otherwise make the quantile. The p90 of a
    /// hundred samples is the tenth largest: a handful of stalls cannot move
    /// it; the p99 bound is the tighter one once samples are many. Stalls are
    /// left out rather than clamped to the bound: with 200 samples, p99.9 is
    /// the largest, and a single stall would otherwise lift the budget from the
    /// largest real delay to the bound (3 × p90 is about 1.8 × the largest
    /// sample of a jittery link).
    pub fn tail(&self, q: f64) -> i64 {
        let bound = TAIL_BOUNDS
            .iter()
            .map(|&(bq, k)| (self.quantile(bq) as f64 * k) as i64)
            .min()
            .unwrap_or(i64::MAX);
        self.recent.quantile_within(q, bound)
    }

    /// The samples, for reports.
    pub fn recent(&self) -> &Recent {
        &self.recent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-period spike is not given; a lasting rise is, a period late; a
    /// fall is given at once.
    #[test]
    fn a_budget_rises_on_two_readings_in_a_row() {
        let mut f = RiseFilter::default();
        let us = Dur::from_us;
        assert_eq!(f.next(us(5000)), None);
        assert_eq!(f.next(us(1200)), Some(us(1200)));
        assert_eq!(f.next(us(5000)), Some(us(1200)));
        assert_eq!(f.next(us(1300)), Some(us(1300)));
        assert_eq!(f.next(us(2000)), Some(us(1300)));
        assert_eq!(f.next(us(2100)), Some(us(2000)));
        assert_eq!(f.next(us(900)), Some(us(900)));
    }

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

    #[test]
    fn a_burst_counts_once() {
        let mut d = Delays::new(4000);
        // 1999 ordinary messages 1 ms apart with delays of 100..=199 us.
        for i in 0..1999i64 {
            d.push(Time(i * 1_000_000), 100_000 + (i % 100) * 1_000);
        }
        let before = d.quantile(0.999);
        assert!(before < 200_000, "{before}");
        // One stall releases nine messages within 50 us, each 5 ms late.
        let t = 1999 * 1_000_000;
        for k in 0..9 {
            d.push(Time(t + k * 5_000), 5_000_000 - k * 10_000);
        }
        assert_eq!(d.len(), 2000);
        assert_eq!(d.quantile(1.0), 5_000_000);
        assert_eq!(d.quantile(0.999), before, "one stall moved the p99.9");
        // Counted one by one, the same stall takes over the p99.9.
        let mut r = Recent::new(4000);
        for v in d.recent().vals.iter().take(1999) {
            r.push(*v);
        }
        for k in 0..9 {
            r.push(5_000_000 - k * 10_000);
        }
        assert!(r.quantile(0.999) > 4_000_000);
        // Few samples: a stall is the p99.9 and the p99 of them, but the tail
        // leaves what lies beyond three times the p90 out: it is the largest
        // real delay, as without the stalls.
        let mut few = Delays::new(1000);
        for i in 0..300i64 {
            few.push(Time(i * 1_000_000), 100_000 + (i % 100) * 1_000);
        }
        for k in 0..4 {
            few.push(Time((301 + k) * 1_000_000), 5_000_000);
        }
        assert_eq!(few.quantile(0.99), 5_000_000);
        assert_eq!(few.quantile(0.999), 5_000_000);
        let p90 = few.quantile(0.9);
        assert!((100_000..200_000).contains(&p90), "{p90}");
        assert_eq!(few.tail(0.999), 199_000);
        // A tail as heavy as the bounds allow is covered as measured: delays
        // spread evenly up to 2.5 x their p90 are no stalls.
        let mut even = Delays::new(1000);
        for i in 0..1000i64 {
            even.push(Time(i * 1_000_000), 100_000 + i * 1_000);
        }
        assert_eq!(even.tail(0.999), even.quantile(0.999));
        // A burst spans at most BURST from its first sample: a steady stream of
        // close messages is not one endless burst.
        let mut s = Delays::new(100);
        for i in 0..10i64 {
            s.push(Time(i * 150_000), 1);
        }
        assert_eq!(s.len(), 5);
    }
}
