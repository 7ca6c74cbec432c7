//! A park/spin hybrid waiter for a runtime thread with inboxes and timers.
//!
//! A runtime thread (the scheduler, a backend) owns some inboxes (crossbeam channels it
//! polls with `try_recv`) and its next deadline. When it has
//! nothing to do it calls [`Waiter::wait_until`] with its next timer deadline and a
//! closure that says whether any inbox holds work. Producers hold a clone of the
//! waiter's [`Unparker`] and call [`Unparker::unpark`] after every send.
//!
//! # The trade-off
//!
//! * **Parking** (a futex wait underneath) costs no CPU, but waking up is slow: on Linux
//!   a timed sleep overshoots by the timer slack (50 µs by default) plus the scheduler's
//!   wake-up latency, so the thread typically resumes some 50 µs (and on a loaded
//!   machine much more) after it asked to. For a scheduler whose decisions are due at
//!   exact instants (a batch's frontrun moment), that error is added to every batch.
//! * **Spinning** (polling the clock and the inboxes in a loop) reacts within well under
//!   a microsecond but burns a whole core, and on a machine with fewer cores than busy
//!   threads it steals CPU from the very threads it is waiting for.
//!
//! The hybrid parks until `spin` before the deadline, then spins the rest of the way.
//! A timed wait therefore costs at most about `spin` of CPU and, as long as the park's
//! overshoot stays below `spin`, ends within a microsecond or so of the deadline.
//! While spinning the thread calls [`std::thread::yield_now`] every [`YIELD_EVERY`]
//! iterations so that, on a 2-core machine running more threads than cores, the other
//! threads keep making progress. That fairness has a price under contention: a yield to
//! another runnable thread can cost a whole scheduler time slice (milliseconds). On a
//! 2-core Linux machine with a CPU-bound thread on each core, three runs of 21 timed
//! waits of 2 ms had a median lateness of 2–6 ms when yielding every 64 turns; with
//! yielding off ([`Waiter::with_yield_every`]`(0)`) the median was under 1 µs in two
//! runs and 2 ms in the third. On a quiet machine both are under 1 µs. The spin phase
//! is bounded by `spin` either way, so not yielding cannot starve other threads for
//! longer than that per deadline.
//!
//! Work arriving while the thread is parked wakes it through the futex, so its latency
//! is the futex wake-up (tens of µs); work arriving while it spins is seen at once. With
//! no deadline the thread parks without spinning: an idle thread uses almost no CPU.
//!
//! # No lost wake-ups
//!
//! The [`Parker`] keeps an unpark *token*: an `unpark` that lands between the waiter's
//! last `has_work()` check and its `park` makes that park return at once. Producers must
//! therefore make the work visible (send) *before* they unpark. A token left over from
//! work the thread already consumed only causes one extra loop: the waiter re-checks
//! `has_work()` and parks again.

use super::clock::Clock;
use crate::core::{Dur, Time};
use crossbeam_utils::sync::{Parker, Unparker};

/// Default spin window before a deadline: 150 µs, comfortably above the usual futex
/// wake-up overshoot of ~50 µs on Linux.
pub const DEFAULT_SPIN: Dur = Dur(150_000);

/// Default longest single park: 100 ms. A wait with no deadline (or a far one) returns
/// [`WaitOutcome::Spurious`] after this long, so an idle thread wakes ten times a
/// second at most (negligible CPU) and no missed wake-up can hang it forever.
pub const DEFAULT_MAX_PARK: Dur = Dur(100_000_000);

/// Default yield interval while spinning: [`std::thread::yield_now`] once every this
/// many iterations (see [`Waiter::with_yield_every`]).
pub const YIELD_EVERY: u32 = 64;

/// Why [`Waiter::wait_until`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitOutcome {
    /// `has_work()` returned true: poll the inboxes. Takes precedence over `Deadline`
    /// when both hold.
    Work,
    /// The deadline has passed: run the due timers.
    Deadline,
    /// The safety park timed out with neither work nor the deadline: re-check any state
    /// that does not unpark (a shutdown flag) and wait again.
    Spurious,
}

/// Counters of a [`Waiter`], for benchmark reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Calls to [`Waiter::wait_until`].
    pub waits: u64,
    /// Times the thread parked (blocked in the OS).
    pub parks: u64,
    /// Parks after which work was found (woken by a producer's unpark, usually).
    pub wakeups: u64,
    /// Spin phases entered (one per wait that reached the last `spin` before its
    /// deadline).
    pub spins: u64,
    /// Total wall time spent spinning: the CPU the hybrid burns on top of parking.
    pub spin_time: Dur,
}

/// A park/spin hybrid waiter; see the [module docs](self). Owned by the thread that
/// waits; producers get an [`Unparker`] from [`Waiter::unparker`].
#[derive(Debug)]
pub struct Waiter {
    parker: Parker,
    spin: Dur,
    max_park: Dur,
    yield_every: u32,
    stats: WaitStats,
}

impl Waiter {
    /// A waiter that spins for the last `spin` before each deadline (negative is
    /// treated as zero: park all the way). See [`DEFAULT_SPIN`].
    pub fn new(spin: Dur) -> Waiter {
        Waiter {
            parker: Parker::new(),
            spin: spin.max(Dur::ZERO),
            max_park: DEFAULT_MAX_PARK,
            yield_every: YIELD_EVERY,
            stats: WaitStats::default(),
        }
    }

    /// Sets the longest single park (default [`DEFAULT_MAX_PARK`]; at least 1 µs):
    /// how long a wait without work or a near deadline lasts before it returns
    /// [`WaitOutcome::Spurious`].
    pub fn with_max_park(mut self, max_park: Dur) -> Waiter {
        self.max_park = max_park.max(Dur::from_us(1));
        self
    }

    /// Sets how often the spin loop yields the CPU: once every `n` iterations (default
    /// [`YIELD_EVERY`]); `0` never yields.
    ///
    /// Yielding lets other runnable threads use this core while it spins, which matters
    /// when there are more busy threads than cores. The price: when another thread is
    /// runnable on this core, a yield can hand it a whole scheduler time slice
    /// (milliseconds), and the deadline is missed by that much. When precise deadlines
    /// matter more than fairness, and the short spin window (`spin` per deadline) is an
    /// affordable share of a core, use `0`.
    pub fn with_yield_every(mut self, n: u32) -> Waiter {
        self.yield_every = n;
        self
    }

    /// A handle that wakes this waiter. Clone it into every producer; a producer calls
    /// [`Unparker::unpark`] after each send.
    pub fn unparker(&self) -> Unparker {
        self.parker.unparker().clone()
    }

    /// The spin window before each deadline.
    pub fn spin(&self) -> Dur {
        self.spin
    }

    /// The counters so far.
    pub fn stats(&self) -> WaitStats {
        self.stats
    }

    /// Waits until `has_work()` holds, `deadline` passes, or the safety park times out.
    ///
    /// * Returns [`WaitOutcome::Work`] at once if `has_work()` already holds, and
    ///   [`WaitOutcome::Deadline`] at once if the deadline has already passed.
    /// * With no deadline, parks for up to the max park (re-checking `has_work()` after
    ///   every wake-up), then returns [`WaitOutcome::Spurious`].
    /// * With a deadline farther away than `spin`, parks until `deadline - spin` (or for
    ///   the max park, whichever is sooner; if the max park ends first it returns
    ///   `Spurious`), then spins until the deadline or `has_work()`.
    ///
    /// `Deadline` is never returned before `clock.now() >= deadline`. `has_work` must
    /// be cheap (it runs on every spin iteration), e.g. `!rx.is_empty()` over the inboxes.
    pub fn wait_until(
        &mut self,
        clock: &Clock,
        deadline: Option<Time>,
        mut has_work: impl FnMut() -> bool,
    ) -> WaitOutcome {
        self.stats.waits += 1;
        if has_work() {
            return WaitOutcome::Work;
        }
        let now = clock.now();
        if deadline.is_some_and(|d| now >= d) {
            return WaitOutcome::Deadline;
        }
        let safety_end = now + self.max_park;
        // Park until `park_end`; then spin until `spin_until` if that is set, or else
        // report the safety timeout.
        let (park_end, spin_until) = match deadline {
            Some(d) if d - self.spin <= safety_end => (d - self.spin, Some(d)),
            _ => (safety_end, None),
        };
        while clock.now() < park_end {
            self.stats.parks += 1;
            self.parker.park_deadline(clock.instant_of(park_end));
            if has_work() {
                self.stats.wakeups += 1;
                return WaitOutcome::Work;
            }
        }
        match spin_until {
            Some(d) => self.spin_until(clock, d, has_work),
            None => WaitOutcome::Spurious,
        }
    }

    /// Spins (never parks) until `deadline` or `has_work()`, yielding every
    /// `yield_every` turns; returns `Work` or `Deadline`. A thread that just finished
    /// some work polls a little this way before it parks, so work that follows soon
    /// after is picked up without a futex wake-up.
    pub fn spin_until(
        &mut self,
        clock: &Clock,
        deadline: Time,
        mut has_work: impl FnMut() -> bool,
    ) -> WaitOutcome {
        self.stats.spins += 1;
        let start = clock.now();
        let mut turns: u32 = 0;
        let (outcome, end) = loop {
            if has_work() {
                break (WaitOutcome::Work, clock.now());
            }
            let now = clock.now();
            if now >= deadline {
                break (WaitOutcome::Deadline, now);
            }
            turns = turns.wrapping_add(1);
            if self.yield_every != 0 && turns.is_multiple_of(self.yield_every) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        };
        self.stats.spin_time += end - start;
        outcome
    }
}

impl Default for Waiter {
    /// A waiter with [`DEFAULT_SPIN`].
    fn default() -> Waiter {
        Waiter::new(DEFAULT_SPIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::cpu::thread_cpu_time;
    use std::time::Duration;

    #[test]
    fn returns_at_once_with_work_or_a_past_deadline() {
        let clock = Clock::new();
        let mut w = Waiter::default();
        assert_eq!(
            w.wait_until(&clock, Some(clock.now() + Dur::from_ms(50)), || true),
            WaitOutcome::Work
        );
        assert_eq!(w.wait_until(&clock, None, || true), WaitOutcome::Work);
        let past = clock.now();
        assert_eq!(
            w.wait_until(&clock, Some(past), || false),
            WaitOutcome::Deadline
        );
        let s = w.stats();
        assert_eq!((s.waits, s.parks, s.spins), (3, 0, 0));
    }

    /// Rounds of seven waits for a deadline 2 ms ahead with `w`: every wait returns
    /// `Deadline` and never early. Returns the sorted lateness of each round, stopping at
    /// the first round whose median is under `good` (at most five rounds: the machine is
    /// noisy, other tests run alongside).
    fn deadline_rounds(w: &mut Waiter, good: Dur) -> Vec<Vec<Dur>> {
        let clock = Clock::new();
        let mut rounds = Vec::new();
        for _ in 0..5 {
            let mut late = Vec::new();
            for _ in 0..7 {
                let deadline = clock.now() + Dur::from_ms(2);
                let out = w.wait_until(&clock, Some(deadline), || false);
                let at = clock.now();
                assert_eq!(out, WaitOutcome::Deadline);
                assert!(at >= deadline, "returned {:?} early", deadline - at);
                late.push(at - deadline);
            }
            late.sort();
            let median = late[late.len() / 2];
            rounds.push(late);
            if median < good {
                break;
            }
        }
        let s = w.stats();
        assert_eq!(s.spins, s.waits, "{s:?}");
        assert!(s.parks >= s.waits, "{s:?}");
        assert_eq!(s.wakeups, 0);
        rounds
    }

    #[test]
    fn deadline_is_never_early_and_rarely_late() {
        // Without yields the spin keeps its core: within 1 ms even on a busy machine.
        let mut w = Waiter::new(DEFAULT_SPIN).with_yield_every(0);
        let rounds = deadline_rounds(&mut w, Dur::from_ms(1));
        let last = &rounds[rounds.len() - 1];
        assert!(
            last[last.len() / 2] < Dur::from_ms(1),
            "lateness {rounds:?}"
        );
    }

    #[test]
    fn yielding_spin_is_never_early() {
        // With yields (the default) a contended core can cost a scheduler time slice per
        // wait (see the module docs); on a quiet machine it is as precise as above.
        let mut w = Waiter::default();
        let rounds = deadline_rounds(&mut w, Dur::from_ms(1));
        let last = &rounds[rounds.len() - 1];
        assert!(
            last[last.len() / 2] < Dur::from_ms(50),
            "lateness {rounds:?}"
        );
    }

    #[test]
    fn short_deadline_only_spins() {
        let clock = Clock::new();
        let mut w = Waiter::new(Dur::from_ms(5));
        let deadline = clock.now() + Dur::from_us(200);
        assert_eq!(
            w.wait_until(&clock, Some(deadline), || false),
            WaitOutcome::Deadline
        );
        assert!(clock.now() >= deadline);
        let s = w.stats();
        assert_eq!((s.parks, s.spins), (0, 1));
        assert!(s.spin_time > Dur::ZERO);
    }

    #[test]
    fn unpark_after_send_returns_work_quickly() {
        let clock = Clock::new();
        for deadline in [None, Some(clock.now() + Dur::from_ms(5_000))] {
            let mut w = Waiter::default();
            let (tx, rx) = crossbeam_channel::unbounded::<Time>();
            let unparker = w.unparker();
            let producer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                tx.send(clock.now()).expect("receiver alive");
                unparker.unpark();
            });
            let mut out = WaitOutcome::Spurious;
            for _ in 0..50 {
                out = w.wait_until(&clock, deadline, || !rx.is_empty());
                if out != WaitOutcome::Spurious {
                    break;
                }
            }
            assert_eq!(out, WaitOutcome::Work, "deadline {deadline:?}");
            let sent = rx.try_recv().expect("the work is there");
            let latency = clock.since(sent);
            assert!(
                latency < Dur::from_ms(50),
                "woke {latency:?} after the send"
            );
            producer.join().expect("producer thread");
            let s = w.stats();
            assert!(s.wakeups >= 1 && s.parks >= 1, "{s:?}");
            assert_eq!(s.spins, 0, "{s:?}");
        }
    }

    #[test]
    fn stale_unpark_token_does_not_end_the_wait_early() {
        let clock = Clock::new();
        let mut w = Waiter::default();
        w.unparker().unpark(); // a token for work that is not there
        let deadline = clock.now() + Dur::from_ms(2);
        assert_eq!(
            w.wait_until(&clock, Some(deadline), || false),
            WaitOutcome::Deadline
        );
        assert!(clock.now() >= deadline);
        // With no deadline, the stale token leads to a re-park, not an early return.
        let mut w = Waiter::default().with_max_park(Dur::from_ms(20));
        w.unparker().unpark();
        let start = clock.now();
        assert_eq!(w.wait_until(&clock, None, || false), WaitOutcome::Spurious);
        assert!(clock.since(start) >= Dur::from_ms(20));
        assert!(w.stats().parks >= 2);
    }

    #[test]
    fn far_deadline_parks_in_safety_steps() {
        let clock = Clock::new();
        let mut w = Waiter::default().with_max_park(Dur::from_ms(10));
        let start = clock.now();
        let out = w.wait_until(&clock, Some(start + Dur::from_ms(1_000)), || false);
        assert_eq!(out, WaitOutcome::Spurious);
        let waited = clock.since(start);
        assert!(
            waited >= Dur::from_ms(10) && waited < Dur::from_ms(500),
            "{waited:?}"
        );
        assert_eq!(w.stats().spins, 0);
    }

    #[test]
    fn idle_wait_uses_little_cpu() {
        let clock = Clock::new();
        let mut w = Waiter::default();
        let cpu_before = thread_cpu_time();
        let start = clock.now();
        let mut spurious = 0;
        while clock.since(start) < Dur::from_ms(300) {
            assert_eq!(w.wait_until(&clock, None, || false), WaitOutcome::Spurious);
            spurious += 1;
        }
        let used = thread_cpu_time() - cpu_before;
        assert!(
            used < Duration::from_millis(30),
            "idle wait used {used:?} of CPU"
        );
        assert!(
            (3..=6).contains(&spurious),
            "{spurious} safety timeouts in 300 ms"
        );
        assert_eq!(w.stats().spins, 0);
    }
}
