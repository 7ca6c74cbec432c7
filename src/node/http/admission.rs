//! Admission at the door ([`Door`]): whether an inference request is taken
//! before its body is read and decoded, so that under overload the server
//! spends its cores on requests it can serve, not on decoding requests the
//! scheduler will drop by their deadline.
//!
//! A request is refused at once (429 with `Retry-After`), before a byte of its
//! body is read, when
//! - **its deadline cannot be met**: the time it already waited (from its
//!   first byte's arrival, the accept queue and unread socket included)
//!   leaves no more than its model's latency at batch 1 (its profile's l(1),
//!   the least any answer can take) before its model's SLO runs out. (Not the
//!   least time recent good answers took: a deferring scheduler holds
//!   requests on purpose, so that time is no bound, and under overload a door
//!   that learned it from the answers it let in refused everything after and
//!   never learned again);
//! - **its model's queue is ahead of it**: while the model sheds (a request
//!   of it was dropped for its deadline, late or timed out within
//!   [`SHED_MEMORY`]), the requests of the model handed over and not yet
//!   answered would take longer to clear, at the rate of good answers the
//!   model gave recently, than the request has left. Little's law: the
//!   queueing delay ahead is `in flight / good rate`. With no shedding the
//!   check is off: a burst after a quiet spell is never judged by the quiet
//!   spell's rate;
//! - **the backlog is full**: [`Door::max_pending`] requests whose bodies
//!   were read wait for their decoding or are being decoded (the work the
//!   server's cores are behind on), or, from [`BACKLOG_MIN`] of them, they
//!   would take longer to decode than [`BACKLOG_SHARE`] of the request's time
//!   left, at the fastest rate the decoders finished bodies in a tenth of a
//!   second within the last second (what they can do, not what a quiet spell
//!   asked of them; no rate yet, no such check). Decoding runs off the threads
//!   that read heads, so its queue is where the server falls behind under
//!   overload, and a request admitted behind more of it than its deadline
//!   allows would be read and decoded only to be dropped.
//!
//! A request is judged by its model's default SLO (the body, which may carry
//! its own `timeout`, is not read yet); the scheduler judges it again by the
//! deadline it carries.
//!
//! No clock and no I/O: the server passes the times in (from its own start).
//! Written here: the decision needs the scheduler's outcomes of each model,
//! which no generic rate limiter or load-shedding layer (tower's) sees.

use std::collections::VecDeque;
use std::time::Duration;

/// A model sheds while one of its requests was dropped for its deadline
/// within this time.
pub const SHED_MEMORY: Duration = Duration::from_secs(1);

/// Good answers are counted in buckets of this length ...
const BUCKET: Duration = Duration::from_millis(100);
/// ... and the good rate is taken over this many of them.
const BUCKETS: usize = 10;

/// The queue-ahead check refuses only when the queue ahead exceeds the time
/// left by this factor: the estimate is a mean, and a request refused that
/// would have been served costs more than one admitted and dropped.
const AHEAD_MARGIN: f64 = 1.1;

/// The time-based backlog check applies from this many bodies pending ...
pub const BACKLOG_MIN: usize = 16;
/// ... and refuses a request whose wait for decoding would exceed this share
/// of its time left (the rest is for its queue, its batch and its answer).
pub const BACKLOG_SHARE: f64 = 0.1;

/// Why a request was refused at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It waited so long that its deadline cannot be met.
    Deadline,
    /// Its model's queue ahead of it is longer than its time left.
    Queue,
    /// Too many requests are being read or decoded.
    Backlog,
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [Refusal::Deadline, Refusal::Queue, Refusal::Backlog];

    pub fn label(self) -> &'static str {
        match self {
            Refusal::Deadline => "deadline",
            Refusal::Queue => "queue",
            Refusal::Backlog => "backlog",
        }
    }
}

/// How a request handed over ended, as the door counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Good.
    Good,
    /// Dropped for its deadline, late, or timed out: the model sheds.
    Shed,
    /// Anything else (bad request, no GPU, failure): says nothing of load.
    Other,
}

/// One model's view.
#[derive(Debug, Default)]
struct ModelView {
    /// Samples handed over and not answered yet.
    in_flight: u64,
    /// Good answers per bucket: (bucket index, count).
    good: VecDeque<(u64, u64)>,
    /// The least time an answer takes (the model's l(1)).
    need: Duration,
    last_shed: Option<Duration>,
}

impl ModelView {
    fn good_rate(&self, now: Duration) -> f64 {
        let cur = bucket(now);
        let first = cur.saturating_sub(BUCKETS as u64 - 1);
        let n: u64 = self
            .good
            .iter()
            .filter(|(b, _)| *b >= first)
            .map(|(_, c)| c)
            .sum();
        // Over the buckets covered: the current one counts by its elapsed part.
        let span = (cur - first) as f64 * BUCKET.as_secs_f64()
            + (now.as_secs_f64() - cur as f64 * BUCKET.as_secs_f64());
        n as f64 / span.max(BUCKET.as_secs_f64())
    }
}

fn bucket(t: Duration) -> u64 {
    (t.as_nanos() / BUCKET.as_nanos()) as u64
}

/// Counts one event at `now` in `buckets` ((bucket index, count), the last
/// [`BUCKETS`] kept).
fn count(buckets: &mut VecDeque<(u64, u64)>, now: Duration) {
    let b = bucket(now);
    match buckets.back_mut() {
        Some((last, c)) if *last == b => *c += 1,
        _ => buckets.push_back((b, 1)),
    }
    while buckets.len() > BUCKETS {
        buckets.pop_front();
    }
}

/// The door of one server: every model's view and the backlog.
#[derive(Debug)]
pub struct Door {
    models: Vec<ModelView>,
    pending: usize,
    max_pending: usize,
    /// Bodies that left the backlog (handed over or abandoned) per bucket:
    /// (bucket index, count), the last [`BUCKETS`].
    decoded: VecDeque<(u64, u64)>,
}

impl Door {
    /// A door for models whose latency at batch 1 is `need` (one each), at
    /// most `max_pending` bodies read and not yet decoded.
    pub fn new(need: &[Duration], max_pending: usize) -> Door {
        Door {
            models: need
                .iter()
                .map(|&need| ModelView {
                    need,
                    ..ModelView::default()
                })
                .collect(),
            pending: 0,
            max_pending: max_pending.max(1),
            decoded: VecDeque::new(),
        }
    }

    /// The fastest the backlog drained in one bucket of the last [`BUCKETS`]
    /// (bodies per second; 0 when none drained).
    fn decode_rate(&self, now: Duration) -> f64 {
        let first = bucket(now).saturating_sub(BUCKETS as u64 - 1);
        let peak = self
            .decoded
            .iter()
            .filter(|(b, _)| *b >= first)
            .map(|&(_, c)| c)
            .max()
            .unwrap_or(0);
        peak as f64 / BUCKET.as_secs_f64()
    }

    /// A body left the backlog at `now`.
    fn drained(&mut self, now: Duration) {
        self.pending = self.pending.saturating_sub(1);
        count(&mut self.decoded, now);
    }

    pub fn max_pending(&self) -> usize {
        self.max_pending
    }

    /// Bodies read and not yet decoded now.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// A request of model `m` whose first byte came `waited` ago, with `slo`
    /// to be answered in: Ok, or why it is refused.
    pub fn admit(
        &mut self,
        m: usize,
        waited: Duration,
        slo: Duration,
        now: Duration,
    ) -> Result<(), Refusal> {
        if self.pending >= self.max_pending {
            return Err(Refusal::Backlog);
        }
        let left = slo.saturating_sub(waited);
        if self.pending >= BACKLOG_MIN {
            let rate = self.decode_rate(now);
            if rate > 0.0 && self.pending as f64 / rate > left.as_secs_f64() * BACKLOG_SHARE {
                return Err(Refusal::Backlog);
            }
        }
        if let Some(v) = self.models.get(m) {
            if left <= v.need {
                return Err(Refusal::Deadline);
            }
            let shedding = v
                .last_shed
                .is_some_and(|t| now.saturating_sub(t) < SHED_MEMORY);
            if shedding && v.in_flight > 0 {
                let rate = v.good_rate(now);
                let ahead = if rate > 0.0 {
                    v.in_flight as f64 / rate
                } else {
                    f64::INFINITY
                };
                if ahead > left.as_secs_f64() * AHEAD_MARGIN {
                    return Err(Refusal::Queue);
                }
            }
        }
        Ok(())
    }

    /// An admitted request's body was read: it is pending until
    /// [`Door::handed_over`] or [`Door::abandoned`].
    pub fn decoding(&mut self) {
        self.pending += 1;
    }

    /// A pending request ended at `now` before it was handed over (a bad
    /// body).
    pub fn abandoned(&mut self, now: Duration) {
        self.drained(now);
    }

    /// A pending request of model `m` was handed over at `now` as `samples`
    /// tasks.
    pub fn handed_over(&mut self, m: usize, samples: u64, now: Duration) {
        self.drained(now);
        if let Some(v) = self.models.get_mut(m) {
            v.in_flight += samples;
        }
    }

    /// A task of model `m` handed over was answered at `now`.
    pub fn answered(&mut self, m: usize, a: Answer, now: Duration) {
        let Some(v) = self.models.get_mut(m) else {
            return;
        };
        v.in_flight = v.in_flight.saturating_sub(1);
        match a {
            Answer::Good => count(&mut v.good, now),
            Answer::Shed => v.last_shed = Some(now),
            Answer::Other => {}
        }
    }

    /// Model `m`'s estimate of the queueing delay ahead of a new request
    /// (None while it gave no good answer recently).
    #[cfg(test)]
    pub fn ahead(&self, m: usize, now: Duration) -> Option<Duration> {
        let v = self.models.get(m)?;
        let rate = v.good_rate(now);
        (rate > 0.0).then(|| Duration::from_secs_f64(v.in_flight as f64 / rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLO: Duration = Duration::from_millis(100);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Serves `rate` requests/s for `secs` seconds from `t0`, each good.
    fn steady(d: &mut Door, t0: Duration, rate: u64, secs: u64) -> Duration {
        let step = Duration::from_nanos(1_000_000_000 / rate);
        let mut t = t0;
        for _ in 0..rate * secs {
            d.admit(0, ms(1), SLO, t).expect("admitted below capacity");
            d.decoding();
            d.handed_over(0, 1, t);
            d.answered(0, Answer::Good, t);
            t += step;
        }
        t
    }

    #[test]
    fn a_request_that_waited_past_what_its_deadline_allows_is_refused() {
        // The model takes 20 ms at batch 1.
        let mut d = Door::new(&[ms(20)], 8);
        assert_eq!(d.admit(0, SLO, SLO, ms(0)), Err(Refusal::Deadline));
        assert_eq!(d.admit(0, ms(85), SLO, ms(0)), Err(Refusal::Deadline));
        assert_eq!(d.admit(0, ms(75), SLO, ms(0)), Ok(()));
        // Answers that took long (a deferring scheduler held them) do not
        // raise the bar: a request with 25 ms left is still taken.
        d.decoding();
        d.handed_over(0, 1, ms(90));
        d.answered(0, Answer::Good, ms(90));
        assert_eq!(d.admit(0, ms(75), SLO, ms(100)), Ok(()));
        // An unknown model index is not judged by any view.
        assert_eq!(d.admit(7, ms(0), SLO, ms(20)), Ok(()));
    }

    #[test]
    fn the_queue_ahead_refuses_only_while_the_model_sheds() {
        let mut d = Door::new(&[ms(1)], 1 << 20);
        // 1,000 r/s good.
        let mut t = steady(&mut d, ms(0), 1000, 2);
        // 300 requests handed over and not answered: 0.3 s ahead at 1,000/s,
        // past a 100 ms SLO; but nothing was shed, so they are taken.
        for _ in 0..300 {
            d.admit(0, ms(1), SLO, t).expect("no shedding: admitted");
            d.decoding();
            d.handed_over(0, 1, t);
        }
        let ahead = d.ahead(0, t).unwrap();
        assert!(ahead > ms(250) && ahead < ms(350), "{ahead:?}");
        // One is dropped for its deadline: now the queue ahead refuses.
        d.answered(0, Answer::Shed, t);
        assert_eq!(d.admit(0, ms(1), SLO, t), Err(Refusal::Queue));
        // The queue clears (answered good): admitted again while shedding.
        for _ in 0..250 {
            d.answered(0, Answer::Good, t);
            t += ms(1);
        }
        assert_eq!(d.admit(0, ms(1), SLO, t), Ok(()));
        // A shed long ago no longer counts.
        for _ in 0..300 {
            d.handed_over(0, 1, t);
        }
        let later = t + SHED_MEMORY + ms(1);
        assert_eq!(d.pending(), 0);
        // No good answers in the last second: the rate is zero, but with no
        // shedding the request is taken.
        assert_eq!(d.admit(0, ms(1), SLO, later), Ok(()));
        // Shedding with no good answer at all: the queue is ahead for ever.
        d.answered(0, Answer::Shed, later);
        assert_eq!(d.admit(0, ms(1), SLO, later), Err(Refusal::Queue));
        // Other outcomes say nothing of load.
        let mut e = Door::new(&[ms(1)], 8);
        e.handed_over(0, 1, ms(0));
        e.answered(0, Answer::Other, ms(0));
        assert_eq!(e.admit(0, ms(1), SLO, ms(0)), Ok(()));
    }

    #[test]
    fn the_backlog_is_bounded_and_gives_back_on_hand_over_or_abandon() {
        let mut d = Door::new(&[ms(1)], 2);
        assert_eq!(d.admit(0, ms(0), SLO, ms(0)), Ok(()));
        d.decoding();
        assert_eq!(d.admit(0, ms(0), SLO, ms(0)), Ok(()));
        d.decoding();
        assert_eq!(d.admit(0, ms(0), SLO, ms(0)), Err(Refusal::Backlog));
        d.handed_over(0, 4, ms(0));
        assert_eq!(d.admit(0, ms(0), SLO, ms(0)), Ok(()));
        d.abandoned(ms(0));
        assert_eq!(d.pending(), 0);
        assert_eq!(d.max_pending(), 2);
    }

    #[test]
    fn a_backlog_longer_than_a_share_of_the_time_left_refuses() {
        assert_eq!(BACKLOG_SHARE, 0.1, "the numbers below assume a tenth");
        let mut d = Door::new(&[ms(1)], 1 << 20);
        // No body decoded yet: no rate, so a burst is taken whatever its size.
        for _ in 0..1200 {
            assert_eq!(d.admit(0, ms(0), SLO, ms(0)), Ok(()));
            d.decoding();
        }
        // The decoders finish 1,000 bodies in one tenth of a second: 10,000/s.
        let mut t = Duration::ZERO;
        for _ in 0..1000 {
            d.handed_over(0, 1, t);
            t += Duration::from_micros(100);
        }
        assert_eq!(d.decode_rate(t), 10_000.0);
        // 200 pending take 20 ms at that rate, more than a tenth of the 99 ms
        // left: refused.
        assert_eq!(d.admit(0, ms(1), SLO, t), Err(Refusal::Backlog));
        // 20 pending take 2 ms, within a tenth of 99 ms ... but not of the
        // 15 ms a request that already waited 85 ms has left.
        for _ in 0..180 {
            d.handed_over(0, 1, t);
        }
        assert_eq!(d.admit(0, ms(1), SLO, t), Ok(()));
        assert_eq!(d.admit(0, ms(85), SLO, t), Err(Refusal::Backlog));
        // Below BACKLOG_MIN pending the check is off, however little is left.
        for _ in 0..(20 - BACKLOG_MIN + 1) {
            d.abandoned(t);
        }
        assert_eq!(d.pending(), BACKLOG_MIN - 1);
        assert_eq!(d.admit(0, ms(95), SLO, t), Ok(()));
        // The peak bucket counts, not the mean over the last second: a quiet
        // spell after the busy tenth does not lower the rate ...
        assert_eq!(d.decode_rate(t + ms(500)), 10_000.0);
        // ... and a second later the busy tenth is forgotten.
        assert_eq!(d.decode_rate(t + ms(1100)), 0.0);
    }
}
