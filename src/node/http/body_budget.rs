//! The total of request bodies a frontend buffers at once, HTTP bodies and
//! gRPC messages together (`--http-max-buffered-bytes`, by default a quarter
//! of the machine's memory).
//!
//! An HTTP body takes its declared length (or its bytes as they come, without
//! one) before it is read, and gives it back when its request is answered; a
//! gRPC message takes its bytes as they come and gives them back once it is
//! whole (it is decoded at once). A body that would pass the total is answered
//! 503 with `Retry-After` (gRPC: UNAVAILABLE) before a byte of it is buffered.
//!
//! Bodies that stopped arriving give way: when a new body finds no room, the
//! budget evicts the bodies that made no progress (no [`PROGRESS_BYTES`] more
//! arrived, and not complete) for at least [`STALL_MIN`], the most bytes held
//! longest first (by bytes × time without progress), until the room freed
//! would fit it, and the new body waits up to [`ROOM_WAIT`] for them to go. An
//! evicted body's request is answered 503 and its connection closed. So
//! clients holding large bodies open without sending them take the budget only
//! until someone needs it, never for the whole body timeout; a client that
//! trickles a byte at a time makes no progress either.
//!
//! The choice of victims ([`victims`]) is pure; [`BodyBudget`] is its thin
//! driver (a lock, the clock, the wake-ups). Written here: no crate bounds
//! the bytes of bodies being received across connections and servers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// A body that received no [`PROGRESS_BYTES`] for this long may be evicted to
/// make room.
pub const STALL_MIN: Duration = Duration::from_secs(1);

/// Bytes a body must receive (or be complete) to count as progressing.
pub const PROGRESS_BYTES: usize = 64 << 10;

/// How long a body that found no room waits for evicted ones to go.
pub const ROOM_WAIT: Duration = Duration::from_millis(250);

/// One body in the budget, as the victim choice sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub id: u64,
    /// Bytes it holds.
    pub bytes: usize,
    /// When it last progressed (from the budget's start).
    pub progressed: Duration,
    /// Complete (being decoded or answered): never evicted.
    pub complete: bool,
    /// Already told to go.
    pub evicted: bool,
}

/// The bodies to evict so that `need` more bytes fit under `limit` with
/// `held` held, at `now`: among those stalled for [`STALL_MIN`] or more (not
/// complete, not already evicted), by bytes × stall, the fewest that make the
/// room. Bytes already being evicted count as room to come. None when even
/// all of them would not make it (then evicting helps no one now).
pub fn victims(
    holders: &[Holder],
    held: usize,
    limit: usize,
    need: usize,
    now: Duration,
) -> Option<Vec<u64>> {
    let coming: usize = holders.iter().filter(|h| h.evicted).map(|h| h.bytes).sum();
    let free = limit.saturating_sub(held).saturating_add(coming);
    if free >= need {
        return Some(Vec::new());
    }
    let mut cands: Vec<&Holder> = holders
        .iter()
        .filter(|h| {
            !h.complete
                && !h.evicted
                && h.bytes > 0
                && now.saturating_sub(h.progressed) >= STALL_MIN
        })
        .collect();
    let weight = |h: &Holder| h.bytes as f64 * now.saturating_sub(h.progressed).as_secs_f64();
    cands.sort_by(|a, b| weight(b).total_cmp(&weight(a)).then(a.id.cmp(&b.id)));
    let (mut out, mut room) = (Vec::new(), free);
    for h in cands {
        if room >= need {
            break;
        }
        room = room.saturating_add(h.bytes);
        out.push(h.id);
    }
    (room >= need).then_some(out)
}

/// How an evicted body learns it must go.
#[derive(Debug, Default)]
struct Evict {
    flag: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Evict {
    fn fire(&self) {
        self.flag.store(true, Ordering::Release);
        if let Some(w) = self.waker.lock().expect("evict lock").take() {
            w.wake();
        }
    }
}

#[derive(Debug)]
struct Entry {
    bytes: usize,
    progressed: Duration,
    since_progress: usize,
    complete: bool,
    evict: Arc<Evict>,
}

#[derive(Debug, Default)]
struct Table {
    held: usize,
    next: u64,
    entries: HashMap<u64, Entry>,
}

/// The budget shared by a frontend's HTTP and gRPC requests.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    start: Instant,
    table: Mutex<Table>,
    /// Woken when bytes are given back.
    freed: tokio::sync::Notify,
    evictions: AtomicU64,
    metrics: Option<BudgetMetrics>,
}

#[derive(Debug)]
struct BudgetMetrics {
    held: crate::metrics::Gauge,
    evicted: crate::metrics::Counter,
}

/// The bytes one body holds of the budget, given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<BodyBudget>,
    id: u64,
    bytes: usize,
    evict: Arc<Evict>,
}

impl BodyBudget {
    pub fn new(limit: usize) -> Arc<BodyBudget> {
        Self::build(limit, None)
    }

    /// A budget whose bytes held and evictions are series of `reg`.
    pub fn with_metrics(limit: usize, reg: &crate::metrics::Registry) -> Arc<BodyBudget> {
        let m = BudgetMetrics {
            held: reg.gauge(
                "fermata_http_buffered_bytes",
                "Bytes of request bodies (HTTP bodies and gRPC messages) the frontend buffers now, against --http-max-buffered-bytes.",
                &[],
            ),
            evicted: reg.counter(
                "fermata_http_bodies_evicted_total",
                "Request bodies (HTTP or gRPC) that stopped arriving and were dropped to make room in the buffered-bytes budget for others.",
                &[],
            ),
        };
        Self::build(limit, Some(m))
    }

    fn build(limit: usize, metrics: Option<BudgetMetrics>) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            limit,
            start: Instant::now(),
            table: Mutex::new(Table::default()),
            freed: tokio::sync::Notify::new(),
            evictions: AtomicU64::new(0),
            metrics,
        })
    }

    /// The bytes held changed to `held`.
    fn set_held(&self, held: usize) {
        if let Some(m) = &self.metrics {
            m.held.set(held as f64);
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Nothing held yet, for one body.
    pub fn hold(self: &Arc<Self>) -> Held {
        let evict = Arc::new(Evict::default());
        let now = self.now();
        let mut t = self.table.lock().expect("budget lock");
        let id = t.next;
        t.next += 1;
        t.entries.insert(
            id,
            Entry {
                bytes: 0,
                progressed: now,
                since_progress: 0,
                complete: false,
                evict: evict.clone(),
            },
        );
        Held {
            budget: self.clone(),
            id,
            bytes: 0,
            evict,
        }
    }

    /// The bytes held by all bodies now.
    pub fn held(&self) -> usize {
        self.table.lock().expect("budget lock").held
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bodies evicted so far to make room.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Whether `n` more bytes fit now, or after evicting stalled bodies and
    /// waiting for them to go (at most [`ROOM_WAIT`]).
    pub async fn room_for(self: Arc<Self>, n: usize) -> bool {
        let end = tokio::time::Instant::now() + ROOM_WAIT;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.limit.saturating_sub(self.held()) >= n {
                return true;
            }
            if !self.make_room(n) || tokio::time::timeout_at(end, freed).await.is_err() {
                return self.limit.saturating_sub(self.held()) >= n;
            }
        }
    }

    /// Evicts stalled bodies so that `need` more bytes would fit; whether
    /// they will (false: no room to be made now).
    fn make_room(&self, need: usize) -> bool {
        let now = self.now();
        let t = self.table.lock().expect("budget lock");
        let holders: Vec<Holder> = t
            .entries
            .iter()
            .map(|(&id, e)| Holder {
                id,
                bytes: e.bytes,
                progressed: e.progressed,
                complete: e.complete,
                evicted: e.evict.flag.load(Ordering::Acquire),
            })
            .collect();
        let Some(out) = victims(&holders, t.held, self.limit, need, now) else {
            return false;
        };
        for id in &out {
            if let Some(e) = t.entries.get(id) {
                e.evict.fire();
                self.evictions.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.metrics {
                    m.evicted.inc();
                }
            }
        }
        if !out.is_empty() {
            tracing::debug!(
                evicted = out.len(),
                need,
                "http: evicted stalled request bodies to make room"
            );
        }
        true
    }
}

impl Held {
    /// Takes `n` more bytes; false (nothing taken) when the total would pass
    /// the limit. Bytes taken count as bytes received.
    pub fn take(&mut self, n: usize) -> bool {
        let b = &self.budget;
        let now = b.now();
        let mut t = b.table.lock().expect("budget lock");
        let Some(next) = t.held.checked_add(n).filter(|&x| x <= b.limit) else {
            return false;
        };
        t.held = next;
        self.bytes += n;
        if let Some(e) = t.entries.get_mut(&self.id) {
            e.bytes = self.bytes;
            note(e, n, now);
        }
        b.set_held(next);
        true
    }

    /// [`Self::take`], and when there is no room, evicts stalled bodies and
    /// waits up to [`ROOM_WAIT`] for them to go ([`BodyBudget::room_for`]).
    pub async fn take_or_wait(&mut self, n: usize) -> bool {
        if self.take(n) {
            return true;
        }
        let b = self.budget.clone();
        b.room_for(n).await && self.take(n)
    }

    /// The budget this body holds of.
    pub fn budget(&self) -> &Arc<BodyBudget> {
        &self.budget
    }

    /// `n` bytes arrived that were taken before (a declared length).
    pub fn received(&self, n: usize) {
        let b = &self.budget;
        let now = b.now();
        if let Some(e) = b
            .table
            .lock()
            .expect("budget lock")
            .entries
            .get_mut(&self.id)
        {
            note(e, n, now);
        }
    }

    /// The body is whole: it is never evicted from now on.
    pub fn complete(&self) {
        if let Some(e) = self
            .budget
            .table
            .lock()
            .expect("budget lock")
            .entries
            .get_mut(&self.id)
        {
            e.complete = true;
        }
    }

    /// Gives back `n` of the bytes held (a gRPC message made whole).
    pub fn give_back(&mut self, n: usize) {
        let n = n.min(self.bytes);
        if n == 0 {
            return;
        }
        self.bytes -= n;
        {
            let mut t = self.budget.table.lock().expect("budget lock");
            t.held = t.held.saturating_sub(n);
            if let Some(e) = t.entries.get_mut(&self.id) {
                e.bytes = self.bytes;
            }
            self.budget.set_held(t.held);
        }
        self.budget.freed.notify_waiters();
    }

    /// The bytes this body holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the budget told this body to go.
    pub fn is_evicted(&self) -> bool {
        self.evict.flag.load(Ordering::Acquire)
    }

    /// Polls for eviction: ready once the budget told this body to go.
    pub fn poll_evicted(&self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.is_evicted() {
            return Poll::Ready(());
        }
        *self.evict.waker.lock().expect("evict lock") = Some(cx.waker().clone());
        if self.is_evicted() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Ready once the budget told this body to go.
    pub fn evicted(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_evicted(cx))
    }
}

/// `n` bytes arrived for `e` at `now`: progress once [`PROGRESS_BYTES`] came.
fn note(e: &mut Entry, n: usize, now: Duration) {
    e.since_progress = e.since_progress.saturating_add(n);
    if e.since_progress >= PROGRESS_BYTES {
        e.since_progress = 0;
        e.progressed = now;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        {
            let mut t = self.budget.table.lock().expect("budget lock");
            t.held = t.held.saturating_sub(self.bytes);
            t.entries.remove(&self.id);
            self.budget.set_held(t.held);
        }
        if self.bytes > 0 {
            self.budget.freed.notify_waiters();
        }
    }
}

/// The budget by default: a quarter of the machine's memory (`MemTotal`),
/// at least 256 MiB (1 GiB when it cannot be read).
pub fn default_buffered_bytes() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb.saturating_mul(1024));
    match total {
        Some(b) => ((b / 4) as usize).max(256 << 20),
        None => 1 << 30,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_up_to_the_limit_and_gives_back_on_drop() {
        let b = BodyBudget::new(100);
        let mut a = b.hold();
        assert!(a.take(60));
        let mut c = b.hold();
        assert!(!c.take(41), "over the limit: nothing taken");
        assert_eq!(b.held(), 60);
        assert!(c.take(40));
        assert!(!a.take(1));
        drop(a);
        assert_eq!(b.held(), 40);
        assert!(c.take(60));
        c.give_back(30);
        assert_eq!((b.held(), c.bytes()), (70, 70));
        drop(c);
        assert_eq!(b.held(), 0);
        assert!(!b.hold().take(usize::MAX));
        assert!(default_buffered_bytes() >= 256 << 20);
    }

    fn h(id: u64, bytes: usize, progressed_ms: u64) -> Holder {
        Holder {
            id,
            bytes,
            progressed: Duration::from_millis(progressed_ms),
            complete: false,
            evicted: false,
        }
    }

    #[test]
    fn the_most_bytes_held_longest_without_progress_give_way_first() {
        let now = Duration::from_secs(10);
        let hs = [
            h(1, 60, 9_500), // progressed 0.5 s ago: not stalled
            h(2, 10, 0),     // 10 bytes x 10 s = 100
            h(3, 30, 7_000), // 30 x 3 s = 90
            h(4, 40, 5_000), // 40 x 5 s = 200
            Holder {
                complete: true,
                ..h(5, 90, 0)
            },
        ];
        let held = 60 + 10 + 30 + 40 + 90;
        // Room for 5 needs 5 - (250 - 230) < 0: nothing to do.
        assert_eq!(victims(&hs, held, 250, 5, now), Some(vec![]));
        // 40 more bytes: the 40-byte body stalled 5 s goes alone.
        assert_eq!(victims(&hs, held, 250, 40, now), Some(vec![4]));
        // 70: it, then the 10-byte one stalled longest.
        assert_eq!(victims(&hs, held, 250, 70, now), Some(vec![4, 2]));
        // More than the stalled ones hold: no one is evicted.
        assert_eq!(victims(&hs, held, 250, 110, now), None);
        // Bodies already told to go count as room to come.
        let mut hs2 = hs;
        hs2[3].evicted = true;
        assert_eq!(victims(&hs2, held, 250, 40, now), Some(vec![]));
        assert_eq!(victims(&hs2, held, 250, 70, now), Some(vec![2]));
    }

    #[tokio::test]
    async fn a_stalled_body_is_evicted_for_a_new_one_and_a_progressing_one_is_not() {
        let b = BodyBudget::new(1 << 20);
        let mut stuck = b.hold();
        assert!(stuck.take(1 << 20));
        let mut busy = b.hold();
        // A new body finds no room; the stuck one has not stalled long yet.
        assert!(!busy.take_or_wait(10).await);
        assert!(!stuck.is_evicted());
        tokio::time::sleep(STALL_MIN + Duration::from_millis(50)).await;
        // Now it has: it is told to go, and the new body gets its room once
        // it went.
        let waiter = tokio::spawn(async move {
            let mut n = busy;
            let ok = n.take_or_wait(10).await;
            (ok, n)
        });
        stuck.evicted().await;
        assert_eq!(b.evictions(), 1);
        drop(stuck);
        let (ok, n) = waiter.await.unwrap();
        assert!(ok);
        assert_eq!(b.held(), 10);
        // A complete body, or one that keeps receiving, is never evicted.
        let mut done = b.hold();
        assert!(done.take((1 << 20) - 10));
        done.complete();
        tokio::time::sleep(STALL_MIN + Duration::from_millis(50)).await;
        let mut other = b.hold();
        assert!(!other.take_or_wait(100).await);
        assert!(!done.is_evicted());
        drop(n);
        drop(done);
        let mut flowing = b.hold();
        assert!(flowing.take(1 << 19));
        let t0 = Instant::now();
        while t0.elapsed() < STALL_MIN + Duration::from_millis(100) {
            flowing.received(PROGRESS_BYTES);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!other.take_or_wait(1 << 20).await);
        assert!(!flowing.is_evicted());
    }
}
