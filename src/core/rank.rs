//! The rank state of one sub-cluster: GPU free times, model timers and the ranking of
//! schedulable candidates (the paper's RankThread, Appendix D). Pure: time comes in.
//!
//! # Protocol with the model side ([`super::shard::ModelShard`])
//! * The model side informs the ranker of each model's current candidate
//!   ([`Ranker::handle_candidate`]) and, after every grant, of when the granted GPU is
//!   free again ([`Ranker::handle_gpu_free`]).
//! * The ranker answers with [`RankOutput`]s: `Grant` (a GPU for a model's batch),
//!   `Expired` (a schedulable candidate can no longer start in time: gather again) and
//!   `Preempt` (Shepherd only: a running batch was cancelled, its tasks go back).
//! * After a `Grant` or `Expired` the ranker forgets the model's candidate until the
//!   model side has handled that notice: every notice carries a sequence number and a
//!   candidate informed with an older one is stale and ignored. A granted GPU is
//!   unavailable (free time `NEVER`) until its `GpuFree` comes back. So with any
//!   message delay between the two sides a GPU is never granted twice, and a model
//!   is never granted a GPU for a candidate it has already replaced.
//!
//! The same ranker runs inside the simulator's [`super::Dispatcher`] (the two sides
//! joined by direct calls) and in the real-time runtime's RankThread (joined by
//! channels).
//!
//! Every operation costs O(log M + log G) (Shepherd's preemption scan is O(G)).

use super::ids::{GpuId, ModelId, PlanId};
use super::model::{Candidate, Task};
use super::policy::Policy;
use super::shard::ToRank;
use super::structs::{IndexedHeap, MinTree};
use super::time::{Dur, Time};
use std::collections::VecDeque;

/// `deferred`'s work-conserving spell: for this long after a schedulable
/// candidate expired (it found every GPU busy until its latest start), a GPU
/// that no schedulable candidate takes goes to the waiting candidate ranked
/// first, whose batch then starts at once (`RankOutput::Grant::early`), as
/// eager's would. Only where two models or more share the ranker's GPUs: a lone
/// model gains from waiting for its frontrun moment, and nothing competes with
/// it for the next free GPU.
///
/// Where several models share GPUs near capacity, the models' frontrun moments
/// come at random times, and a batch that finds every GPU busy at its own loses
/// its head although GPUs idled a few milliseconds before; an expiry is the
/// sign of it. Below capacity nothing expires, so deferred keeps its large
/// batches and the idle GPU time the autoscaler reads. One second spans many
/// batches at every SLO the workloads use, and a burst's aftermath.
pub const FILL_WINDOW: Dur = Dur(1_000_000_000);

/// `deferred`: a GPU that a schedulable candidate would take goes instead to
/// the first-ranked waiting candidate when that one is due first (an earlier
/// latest start), is this many of its own start windows (`latest - exec_at`,
/// about one per-request cost l(b+1) - l(b) while it waits) from its start,
/// and the schedulable one can still start on the GPU free next. The waiting
/// batch then starts at once (`RankOutput::Grant::early`).
///
/// A waiting batch has only its start window to find a GPU, while a batch
/// that does not wait (a low-rate model's, too few requests expected) is
/// schedulable from its first request and takes the first free GPU however
/// far its own latest start is. Among many models near capacity that left
/// the waiting batches of the popular models, due sooner, to miss their
/// start and lose their heads (24 models, Zipf 1.1: 14,027 expiries against
/// eager's 11,931, deferred 0.13% of goodput below eager). With five windows
/// deferred is within 0.02% of eager or above on every workload of
/// `configs/workloads/` (`fermata bench compare --seeds 10`; lowest 0.9998).
/// The horizon matters to a few hundredths of a percent, about the seeds'
/// spread on the bursty files: three, four and six windows gave lowest
/// ratios of 0.9982, 0.9993 and 0.9981, fixed horizons of 2, 3, 4 and 6 ms
/// 0.9992, 0.9988, 0.9995 and 0.9975 (a fixed time does not follow the
/// model's cost per request). Handing over whenever the waiting batch is due
/// first (no horizon) cost the mixed workloads their lead (a100_mixed 1.0092
/// to 0.9969).
pub const YIELD_WINDOWS: i64 = 5;

/// What the model side knows about a batch it booked on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Booking {
    pub plan: PlanId,
    pub model: ModelId,
    pub start: Time,
    pub end: Time,
    /// Its start plus what its pull holds the GPU's puller
    /// ([`super::NetBudget::hold`]): a backend pulls one batch at a time per
    /// GPU, so the next batch's pull runs after this one's, which ends about
    /// when this batch starts (taken as the size of this batch). The GPU is
    /// free for the next batch at the later of `end` and `held`.
    pub held: Time,
    /// The batch's tasks (kept for Shepherd's preemption only; empty otherwise).
    pub tasks: Vec<Task>,
}

/// What the ranker asks of the model side.
#[derive(Debug, Clone, PartialEq)]
pub enum RankOutput {
    /// `gpu` (free at `free_at`) is granted to `model`'s candidate: book a batch on it
    /// or give it back, then inform the new candidate with sequence `seq`.
    Grant {
        model: ModelId,
        gpu: GpuId,
        free_at: Time,
        seq: u64,
        /// The candidate was still waiting for its start: the GPU would idle
        /// otherwise, so the batch at hand starts at once.
        early: bool,
    },
    /// `model`'s schedulable candidate passed its latest start: gather again and
    /// inform the new candidate with sequence `seq`.
    Expired { model: ModelId, seq: u64 },
    /// Shepherd: the batch `plan` of `model` running on `gpu` is cancelled; its tasks
    /// go back to the model's queue. The GPU is free now.
    Preempt {
        gpu: GpuId,
        plan: PlanId,
        model: ModelId,
        tasks: Vec<Task>,
    },
}

impl RankOutput {
    /// The model the notice is for (its ModelThread handles it).
    pub fn model(&self) -> ModelId {
        match self {
            RankOutput::Grant { model, .. }
            | RankOutput::Expired { model, .. }
            | RankOutput::Preempt { model, .. } => *model,
        }
    }
}

/// Ranking key of a schedulable candidate: smallest first.
type RankKey = (i64, i64);

/// The rank state of one sub-cluster.
pub struct Ranker {
    policy: Policy,
    lookahead: Dur,
    /// Predicted free time of each GPU; `NEVER` while granted or once removed.
    gpus: MinTree,
    granted: Vec<bool>,
    removed: Vec<bool>,
    /// A GPU id given again ([`Ranker::add_gpu_at`]) while the grant of its
    /// last holder was still out: that grant's `GpuFree` is the next one and
    /// says nothing about the new GPU.
    stale: Vec<bool>,
    /// Last booking per GPU (reports and Shepherd's preemption need it).
    bookings: Vec<Option<Booking>>,
    /// The ranker's copy of each model's candidate (None while a notice is out).
    cands: Vec<Option<Candidate>>,
    /// Notices (grants, expiries) sent per model.
    issued: Vec<u64>,
    /// Pending candidates: their send time; schedulable ones: their expiry.
    model_timers: IndexedHeap<Time>,
    ready: IndexedHeap<RankKey>,
    /// Waiting candidates (before their send time), by rank; kept only while
    /// `fill_window` is on.
    pending: IndexedHeap<RankKey>,
    /// How long after a candidate expired a GPU that would idle takes a waiting
    /// candidate (zero: never). See [`FILL_WINDOW`].
    fill_window: Dur,
    /// When a schedulable candidate last expired (none yet: `None`).
    last_expiry: Option<Time>,
    /// The models this ranker has heard of since it started, and how many.
    known: Vec<bool>,
    models: u32,
    outputs: VecDeque<RankOutput>,
    active_gpus: u32,
    last_now: Time,
    stats: RankStats,
}

/// What the ranker did (for reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankStats {
    pub grants: u64,
    pub expiries: u64,
    pub preemptions: u64,
    pub stale_candidates: u64,
}

impl Ranker {
    pub fn new(policy: Policy, gpus: u32) -> Ranker {
        let lookahead = match policy {
            Policy::Clockwork { lookahead } => lookahead,
            _ => Dur::ZERO,
        };
        Ranker {
            policy,
            lookahead,
            gpus: MinTree::new(gpus as usize, Time::EPOCH_MIN),
            granted: vec![false; gpus as usize],
            removed: vec![false; gpus as usize],
            stale: vec![false; gpus as usize],
            bookings: vec![None; gpus as usize],
            cands: Vec::new(),
            issued: Vec::new(),
            model_timers: IndexedHeap::new(),
            ready: IndexedHeap::new(),
            pending: IndexedHeap::new(),
            known: Vec::new(),
            models: 0,
            fill_window: match policy {
                Policy::Deferred => FILL_WINDOW,
                _ => Dur::ZERO,
            },
            last_expiry: None,
            outputs: VecDeque::new(),
            active_gpus: gpus,
            last_now: Time::EPOCH_MIN,
            stats: RankStats::default(),
        }
    }

    /// Sets how long after a candidate expired an idle GPU takes a waiting
    /// candidate (zero turns it off); `deferred` starts with [`FILL_WINDOW`],
    /// the other policies with zero.
    pub fn set_fill_window(&mut self, window: Dur) {
        self.fill_window = window;
    }

    pub fn num_gpus(&self) -> usize {
        self.gpus.len()
    }
    /// GPUs in service (added and not removed).
    pub fn active_gpus(&self) -> u32 {
        self.active_gpus
    }
    pub fn stats(&self) -> RankStats {
        self.stats
    }
    /// The predicted free time of `gpu` (`NEVER` while granted or once removed).
    pub fn gpu_free_at(&self, gpu: GpuId) -> Time {
        self.gpus.get(gpu.idx())
    }
    pub fn candidate(&self, model: ModelId) -> Option<Candidate> {
        self.cands.get(model.idx()).copied().flatten()
    }

    /// Makes room for model `model` (ids are dense and never reused).
    pub fn add_model(&mut self, model: ModelId) {
        let n = model.idx() + 1;
        if self.cands.len() < n {
            self.cands.resize(n, None);
            self.issued.resize(n, 0);
            self.known.resize(n, false);
        }
        if !self.known[model.idx()] {
            self.known[model.idx()] = true;
            self.models += 1;
        }
    }

    /// Adds a GPU (free from now on); returns its id.
    pub fn add_gpu(&mut self) -> GpuId {
        self.active_gpus += 1;
        self.gpus.push(Time::EPOCH_MIN);
        self.granted.push(false);
        self.removed.push(false);
        self.stale.push(false);
        self.bookings.push(None);
        GpuId(self.gpus.len() as u32 - 1)
    }

    /// Gives GPU id `gpu` to a GPU that enters now, in service (free from now
    /// on) or not (known, never planned on). An id past the last one grows the
    /// table (the ids in between are out of service); an id already known
    /// must be out of service and starts over with nothing of its last
    /// holder: no booking, and a grant of it still out is ignored when it
    /// comes back. Returns false (nothing changes) for an id in service.
    pub fn add_gpu_at(&mut self, now: Time, gpu: GpuId, in_service: bool) -> bool {
        self.enter(now);
        let g = gpu.idx();
        while self.gpus.len() <= g {
            let id = self.add_gpu();
            self.remove_gpu(now, id);
        }
        if !self.removed[g] {
            return false;
        }
        self.bookings[g] = None;
        // A grant out for the last holder keeps the GPU unavailable until it
        // comes back (a GPU is never granted twice at once).
        self.stale[g] = self.granted[g];
        if in_service {
            self.removed[g] = false;
            self.active_gpus += 1;
            if !self.granted[g] {
                self.gpus.set(g, Time::EPOCH_MIN);
            }
        }
        true
    }

    /// Takes a GPU out of service: nothing new is booked on it. A batch already
    /// booked on it still runs (the backend drains it); a grant in flight comes back
    /// and is ignored.
    pub fn remove_gpu(&mut self, now: Time, gpu: GpuId) {
        self.enter(now);
        let g = gpu.idx();
        if g >= self.removed.len() || self.removed[g] {
            return;
        }
        self.removed[g] = true;
        self.active_gpus -= 1;
        self.gpus.set(g, Time::NEVER);
    }

    /// The model side's current candidate for `model`, after it handled `seq`
    /// notices. A candidate older than the last notice is stale and ignored.
    pub fn handle_candidate(
        &mut self,
        now: Time,
        model: ModelId,
        cand: Option<Candidate>,
        seq: u64,
    ) {
        self.enter(now);
        let m = model.idx();
        self.add_model(model);
        if seq < self.issued[m] {
            self.stats.stale_candidates += 1;
            return;
        }
        self.cands[m] = cand;
        self.place(m, now);
    }

    /// After a grant: `gpu` is free again at `free_at`; `booking` is the batch booked
    /// on it (None: the grant was declined and `free_at` is the old free time).
    pub fn handle_gpu_free(
        &mut self,
        now: Time,
        gpu: GpuId,
        free_at: Time,
        booking: Option<Booking>,
    ) {
        self.enter(now);
        let g = gpu.idx();
        if g >= self.granted.len() {
            return;
        }
        self.granted[g] = false;
        if self.removed[g] {
            return;
        }
        if std::mem::take(&mut self.stale[g]) {
            // The last holder's grant: the GPU given the id since is free now.
            self.gpus.set(g, Time::EPOCH_MIN);
            return;
        }
        if booking.is_some() {
            self.bookings[g] = booking;
        }
        self.gpus.set(g, free_at);
    }

    /// One message from the model side.
    pub fn handle_from_models(&mut self, now: Time, msg: ToRank) {
        match msg {
            ToRank::Candidate { model, cand, seq } => self.handle_candidate(now, model, cand, seq),
            ToRank::GpuFree {
                gpu,
                free_at,
                booking,
            } => self.handle_gpu_free(now, gpu, free_at, booking),
        }
    }

    /// A backend reports when `gpu` really became (or will become) free after `plan`.
    /// Only the latest plan booked on an idle (not granted) GPU moves its free time.
    pub fn handle_gpu_report(&mut self, now: Time, gpu: GpuId, plan: PlanId, free_at: Time) {
        self.enter(now);
        let g = gpu.idx();
        if g >= self.gpus.len() || self.removed[g] || self.granted[g] {
            return;
        }
        if let Some(b) = &mut self.bookings[g] {
            if b.plan == plan {
                // A batch that ended late started late, its pull with it: the
                // puller's hold moves by as much. One that ended early moves
                // it not at all.
                let late = (free_at - b.end).max(Dur::ZERO);
                b.held += late;
                b.end = free_at;
                self.gpus.set(g, free_at.max(b.held));
            }
        }
    }

    /// Runs every timer due at or before `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        while self.step_timeout(now) {}
    }

    /// Runs the first timer due at or before `now`, if any; returns whether one ran.
    /// (The simulator's dispatcher runs one at a time so that the model side answers
    /// each grant before the next timer, as a single thread would.)
    pub fn step_timeout(&mut self, now: Time) -> bool {
        self.enter(now);
        let tm = self.model_timers.peek();
        let tg = self.gpu_timer();
        match (tm, tg) {
            (Some((m, t)), g) if t <= now && g.is_none_or(|g| t <= g) => {
                if self.ready.contains(m) {
                    // A schedulable candidate passed its expiry: the model gathers again.
                    self.ready.remove(m);
                    self.model_timers.remove(m);
                    self.cands[m] = None;
                    self.issued[m] += 1;
                    self.stats.expiries += 1;
                    self.last_expiry = Some(now);
                    self.outputs.push_back(RankOutput::Expired {
                        model: ModelId(m as u32),
                        seq: self.issued[m],
                    });
                } else {
                    // A pending candidate reached its send time.
                    self.place(m, now);
                }
                true
            }
            (_, Some(g)) if g <= now => {
                self.on_gpu_timer(now);
                true
            }
            _ => false,
        }
    }

    /// The next moment `handle_timeout` must be called, if any.
    pub fn next_timeout(&self) -> Option<Time> {
        let tm = self.model_timers.peek().map(|(_, t)| t);
        match (tm, self.gpu_timer()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn poll_output(&mut self) -> Option<RankOutput> {
        self.outputs.pop_front()
    }

    // ---------------------------------------------------------------- internals

    fn enter(&mut self, now: Time) {
        debug_assert!(now >= self.last_now, "time went backwards");
        self.last_now = now;
    }

    #[inline]
    fn delay(c: &Candidate) -> Dur {
        c.exec_at - c.send_at
    }

    fn rank_key(&self, c: &Candidate) -> RankKey {
        match self.policy {
            Policy::Shepherd { .. } => (-(c.bs as i64), c.latest.0),
            // Deferred's candidates come with their model's loss bias
            // (`ModelState::loss_bias`); every other policy's is zero.
            _ => ((c.latest - c.bias).0, 0),
        }
    }

    /// When the earliest-free GPU should take the top-ranked schedulable candidate.
    fn gpu_timer(&self) -> Option<Time> {
        let (m, _) = match self.ready.peek() {
            Some(x) => x,
            None if self.fills() => self.pending.peek()?,
            None => return None,
        };
        let c = self.cands[m]?;
        let (_, f) = self.gpus.argmin()?;
        if f >= Time::NEVER {
            return None;
        }
        Some(f - self.lookahead - Self::delay(&c))
    }

    /// Whether a GPU that no schedulable candidate takes goes to a waiting one
    /// (see [`FILL_WINDOW`]): with two models or more, within the window of the
    /// last expiry.
    fn fills(&self) -> bool {
        self.fill_window > Dur::ZERO
            && self.models >= 2
            && self
                .last_expiry
                .is_some_and(|t| self.last_now - t <= self.fill_window)
    }

    fn on_gpu_timer(&mut self, now: Time) {
        let Some((m, _)) = self.ready.peek().or_else(|| {
            if self.fills() {
                self.pending.peek()
            } else {
                None
            }
        }) else {
            return;
        };
        let Some((g_first, f)) = self.gpus.argmin() else {
            return;
        };
        let c = self.cands[m].expect("a ranked model has a candidate");
        let g = if self.lookahead == Dur::ZERO {
            let start = (now + Self::delay(&c)).max(f);
            self.gpus.leftmost_le(start).unwrap_or(g_first)
        } else {
            g_first
        };
        if self.ready.contains(m) {
            if let Some(p) = self.yield_to_waiting(now, m, g) {
                self.grant(p, g);
                return;
            }
        }
        self.grant(m, g);
    }

    /// The earliest free time of the GPUs other than `g` (`NEVER`: none).
    fn next_free_except(&mut self, g: usize) -> Time {
        let f = self.gpus.get(g);
        self.gpus.set(g, Time::NEVER);
        let r = self.gpus.argmin().map(|(_, t)| t).unwrap_or(Time::NEVER);
        self.gpus.set(g, f);
        r
    }

    /// Deferred: the waiting candidate that GPU `g` goes to instead of the
    /// schedulable candidate of model `m` ([`YIELD_WINDOWS`]), if any.
    fn yield_to_waiting(&mut self, now: Time, m: usize, g: usize) -> Option<usize> {
        if self.fill_window == Dur::ZERO || self.models < 2 {
            return None;
        }
        let (p, _) = self.pending.peek()?;
        if p == m {
            return None;
        }
        let (waiting, ready) = (self.cands[p]?, self.cands[m]?);
        let horizon = Dur((waiting.latest - waiting.exec_at)
            .0
            .saturating_mul(YIELD_WINDOWS));
        if waiting.latest >= ready.latest || waiting.exec_at > now + horizon {
            return None;
        }
        (self.next_free_except(g) <= ready.latest - Self::delay(&ready)).then_some(p)
    }

    /// Puts model `m`'s candidate where it belongs: a timer if pending, a GPU if one
    /// is free by its exec time, else the ranking of schedulable candidates.
    fn place(&mut self, m: usize, now: Time) {
        // Each pass grants a GPU (and ends), preempts one (Shepherd; a batch booked
        // at this instant is never preempted), or ends; the bound guards against bugs.
        for _ in 0..2 * (self.gpus.len() + 2) {
            self.model_timers.remove(m);
            self.ready.remove(m);
            self.pending.remove(m);
            let Some(c) = self.cands[m] else {
                return;
            };
            if c.send_at > now {
                self.model_timers.set(m, c.send_at);
                if self.fill_window > Dur::ZERO {
                    let key = self.rank_key(&c);
                    self.pending.set(m, key);
                }
                return;
            }
            let gpu = if self.lookahead == Dur::ZERO {
                self.gpus.leftmost_le(c.exec_at)
            } else {
                self.gpus
                    .argmin()
                    .filter(|&(_, f)| f <= c.exec_at + self.lookahead)
                    .map(|(g, _)| g)
            };
            match gpu {
                Some(g) => {
                    if let Some(p) = self.yield_to_waiting(now, m, g) {
                        self.grant(p, g);
                        continue;
                    }
                    self.grant(m, g);
                    return;
                }
                None => {
                    let key = self.rank_key(&c);
                    self.ready.set(m, key);
                    if let Policy::Shepherd { factor } = self.policy {
                        if self.preempt_for(m, now, factor) {
                            continue;
                        }
                    }
                    let expire = c.latest - Self::delay(&c) + Dur(1);
                    self.model_timers.set(m, expire.max(now + Dur(1)));
                    return;
                }
            }
        }
        debug_assert!(false, "place() did not settle for model {m}");
    }

    /// Grants GPU `g` to model `m`'s candidate.
    fn grant(&mut self, m: usize, g: usize) {
        assert!(
            !self.granted[g] && !self.removed[g],
            "GPU {g} granted while granted or removed"
        );
        let free_at = self.gpus.get(g);
        let early = self.pending.contains(m);
        self.granted[g] = true;
        self.gpus.set(g, Time::NEVER);
        self.cands[m] = None;
        self.ready.remove(m);
        self.pending.remove(m);
        self.model_timers.remove(m);
        self.issued[m] += 1;
        self.stats.grants += 1;
        self.outputs.push_back(RankOutput::Grant {
            model: ModelId(m as u32),
            gpu: GpuId(g as u32),
            free_at,
            seq: self.issued[m],
            early,
        });
    }

    /// Shepherd's Flex: if model `m`'s candidate is at least `factor` times larger
    /// than the smallest running batch, cancel that batch (its tasks go back to their
    /// queue) so the GPU is free now. Returns whether a GPU was freed.
    fn preempt_for(&mut self, m: usize, now: Time, factor: u32) -> bool {
        let Some(c) = self.cands[m] else {
            return false;
        };
        let mut best: Option<(usize, usize)> = None;
        for (g, b) in self.bookings.iter().enumerate() {
            if let Some(b) = b {
                let n = b.tasks.len();
                // Only a batch that is already running (not one booked at this very
                // instant, which would let two candidates preempt each other forever).
                if b.end > now
                    && b.start < now
                    && !self.granted[g]
                    && self.gpus.get(g) == b.end
                    && (n as u64) * (factor as u64) <= c.bs as u64
                    && best.is_none_or(|(_, bn)| n < bn)
                {
                    best = Some((g, n));
                }
            }
        }
        let Some((g, _)) = best else {
            return false;
        };
        let b = self.bookings[g].take().expect("booking exists");
        self.stats.preemptions += 1;
        self.gpus.set(g, now);
        self.outputs.push_back(RankOutput::Preempt {
            gpu: GpuId(g as u32),
            plan: b.plan,
            model: b.model,
            tasks: b.tasks,
        });
        true
    }

    /// Consistency check for tests: timers and ranking agree with the candidates.
    pub fn check_deep(&self) {
        for (m, c) in self.cands.iter().enumerate() {
            match c {
                None => assert!(!self.model_timers.contains(m) && !self.ready.contains(m)),
                Some(c) => {
                    assert!(self.model_timers.contains(m), "model {m} has no timer");
                    if self.ready.contains(m) {
                        assert!(c.send_at <= self.last_now);
                    } else {
                        assert_eq!(self.model_timers.get(m), Some(c.send_at));
                    }
                }
            }
        }
        for g in 0..self.gpus.len() {
            if self.granted[g] || self.removed[g] {
                assert_eq!(self.gpus.get(g), Time::NEVER);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(now: Time) -> Candidate {
        Candidate {
            bs: 1,
            exec_at: now,
            latest: now + Dur::from_ms(50),
            send_at: now,
            bias: Dur::ZERO,
        }
    }

    fn granted(r: &mut Ranker) -> Vec<(ModelId, GpuId)> {
        std::iter::from_fn(|| r.poll_output())
            .filter_map(|o| match o {
                RankOutput::Grant { model, gpu, .. } => Some((model, gpu)),
                _ => None,
            })
            .collect()
    }

    /// A backend's report of when a batch ended moves the GPU's free time,
    /// but never before the puller's hold: a batch that ended late moves the
    /// hold by as much (its pull ended late too); one that ended early
    /// leaves it.
    #[test]
    fn a_report_moves_the_free_time_but_not_before_the_pullers_hold() {
        let mut r = Ranker::new(Policy::Eager, 0);
        let t = Time(1_000_000);
        r.add_gpu();
        r.handle_candidate(t, ModelId(0), Some(cand(t)), 0);
        assert_eq!(granted(&mut r), vec![(ModelId(0), GpuId(0))]);
        let b = Booking {
            plan: PlanId(1),
            model: ModelId(0),
            start: t,
            end: t + Dur::from_ms(2),
            held: t + Dur::from_ms(5),
            tasks: Vec::new(),
        };
        r.handle_gpu_free(t, GpuId(0), b.held, Some(b));
        assert_eq!(r.gpu_free_at(GpuId(0)), t + Dur::from_ms(5));
        // Ended 1 ms early: the hold stands.
        r.handle_gpu_report(t, GpuId(0), PlanId(1), t + Dur::from_ms(1));
        assert_eq!(r.gpu_free_at(GpuId(0)), t + Dur::from_ms(5));
        // Ended 3 ms late (against the end reported last): the hold moves 3 ms.
        r.handle_gpu_report(t, GpuId(0), PlanId(1), t + Dur::from_ms(4));
        assert_eq!(r.gpu_free_at(GpuId(0)), t + Dur::from_ms(8));
    }

    /// An id given again starts over: a grant of its last holder that comes
    /// back afterwards does not free it twice or carry its booking over, and
    /// an id in service is not taken.
    #[test]
    fn a_gpu_id_given_again_keeps_nothing_of_its_last_holder() {
        let mut r = Ranker::new(Policy::Eager, 0);
        let t = Time(1_000_000);
        assert_eq!(r.add_gpu(), GpuId(0));
        assert!(!r.add_gpu_at(t, GpuId(0), true), "in service");
        r.handle_candidate(t, ModelId(0), Some(cand(t)), 0);
        assert_eq!(granted(&mut r), vec![(ModelId(0), GpuId(0))]);
        // The GPU leaves while its grant is out; its id goes to a new GPU.
        r.remove_gpu(t, GpuId(0));
        assert!(r.add_gpu_at(t, GpuId(0), true));
        assert_eq!(r.active_gpus(), 1);
        assert_eq!(
            r.gpu_free_at(GpuId(0)),
            Time::NEVER,
            "its grant is still out"
        );
        // Model 1 waits; the old grant comes back with a booking far ahead.
        r.handle_candidate(t, ModelId(1), Some(cand(t)), 0);
        assert!(granted(&mut r).is_empty());
        let old = Booking {
            plan: PlanId(7),
            model: ModelId(0),
            start: t,
            end: t + Dur::from_ms(10_000),
            held: t,
            tasks: Vec::new(),
        };
        r.handle_gpu_free(t, GpuId(0), old.end, Some(old));
        // The new GPU is free now (not at the old batch's end), once.
        r.handle_timeout(t);
        assert_eq!(granted(&mut r), vec![(ModelId(1), GpuId(0))]);
        r.check_deep();
        // The old plan's report moves nothing.
        r.handle_gpu_free(t, GpuId(0), t + Dur::from_ms(1), None);
        r.handle_gpu_report(t, GpuId(0), PlanId(7), t + Dur::from_ms(20_000));
        assert_eq!(r.gpu_free_at(GpuId(0)), t + Dur::from_ms(1));
    }

    /// An id past the last grows the table; the ids in between are out of
    /// service; an id taken out of service in one sub-cluster stays out.
    #[test]
    fn a_gpu_id_past_the_last_grows_the_table() {
        let mut r = Ranker::new(Policy::Eager, 0);
        let t = Time(0);
        assert!(r.add_gpu_at(t, GpuId(3), true));
        assert_eq!((r.num_gpus(), r.active_gpus()), (4, 1));
        assert_eq!(r.gpu_free_at(GpuId(1)), Time::NEVER);
        assert!(r.add_gpu_at(t, GpuId(1), false));
        assert_eq!((r.num_gpus(), r.active_gpus()), (4, 1));
        r.check_deep();
    }

    /// Candidates waiting for a GPU are ranked by their latest start less
    /// their loss bias: a model that has been losing requests takes the
    /// next free GPU ahead of one whose latest start is a little earlier,
    /// but not ahead of one a bias's length earlier.
    #[test]
    fn a_model_that_loses_takes_the_next_gpu_within_its_bias() {
        let t = Time(1_000_000_000);
        let ms = Dur::from_ms;
        let first = |bias_ms: i64, other_latest_ms: i64| {
            let mut r = Ranker::new(Policy::Deferred, 0);
            r.add_gpu_at(t, GpuId(0), true);
            r.handle_candidate(t, ModelId(2), Some(cand(t)), 0);
            assert_eq!(granted(&mut r), vec![(ModelId(2), GpuId(0))]);
            r.handle_gpu_free(t, GpuId(0), t + ms(5), None);
            let losing = Candidate {
                latest: t + ms(20),
                bias: ms(bias_ms),
                ..cand(t)
            };
            let other = Candidate {
                latest: t + ms(other_latest_ms),
                ..cand(t)
            };
            r.handle_candidate(t, ModelId(0), Some(losing), 0);
            r.handle_candidate(t, ModelId(1), Some(other), 0);
            r.check_deep();
            r.handle_timeout(t + ms(5));
            granted(&mut r)
        };
        assert_eq!(first(0, 18), vec![(ModelId(1), GpuId(0))], "earliest first");
        assert_eq!(
            first(3, 18),
            vec![(ModelId(0), GpuId(0))],
            "within the bias"
        );
        assert_eq!(first(3, 16), vec![(ModelId(1), GpuId(0))], "beyond it");
    }

    /// Grants out of `r` with their `early` flag.
    fn grants(r: &mut Ranker) -> Vec<(ModelId, bool)> {
        std::iter::from_fn(|| r.poll_output())
            .filter_map(|o| match o {
                RankOutput::Grant { model, early, .. } => Some((model, early)),
                _ => None,
            })
            .collect()
    }

    /// Grants made, each (model, early).
    type Grants = Vec<(ModelId, bool)>;

    /// GPU 1 free now, GPU 0 busy for `busy_ms`; model 1 waits for its start
    /// `p_exec_ms` away, its window `p_window_ms` wide; then model 0's batch
    /// (latest start `r_latest_ms` away) becomes schedulable. Returns the
    /// grants made now, then those when GPU 0 frees.
    fn handover(
        policy: Policy,
        p_exec_ms: i64,
        p_window_ms: i64,
        busy_ms: i64,
        r_latest_ms: i64,
    ) -> (Grants, Grants) {
        let ms = Dur::from_ms;
        let mut r = Ranker::new(policy, 0);
        let t = Time(1_000_000_000);
        r.add_gpu_at(t, GpuId(0), true);
        r.add_gpu_at(t, GpuId(1), true);
        r.handle_candidate(t, ModelId(2), Some(cand(t)), 0);
        assert_eq!(grants(&mut r), vec![(ModelId(2), false)]);
        r.handle_gpu_free(t, GpuId(0), t + ms(busy_ms), None);
        let exec = t + ms(p_exec_ms);
        let waiting = Candidate {
            bs: 4,
            exec_at: exec,
            latest: exec + ms(p_window_ms),
            send_at: exec,
            bias: Dur::ZERO,
        };
        r.handle_candidate(t, ModelId(1), Some(waiting), 0);
        let ready = Candidate {
            latest: t + ms(r_latest_ms),
            ..cand(t)
        };
        r.handle_candidate(t, ModelId(0), Some(ready), 0);
        r.check_deep();
        let now = grants(&mut r);
        r.handle_timeout(t + ms(busy_ms));
        (now, grants(&mut r))
    }

    /// `deferred`: a free GPU goes to a waiting batch due first and within
    /// [`YIELD_WINDOWS`] of its start windows, when the schedulable batch can
    /// still start on the GPU free next; otherwise the schedulable one takes it.
    #[test]
    fn a_free_gpu_goes_to_a_waiting_batch_due_first_and_near_its_start() {
        let (m0, m1) = (ModelId(0), ModelId(1));
        // Due at 3-4 ms (within 5 windows of 1 ms), model 0 can wait for 20 ms.
        assert_eq!(
            handover(Policy::Deferred, 3, 1, 20, 30),
            (vec![(m1, true)], vec![(m0, false)])
        );
        // Waiting beyond the horizon: 6 ms away, 5 windows of 1 ms.
        // The schedulable batch could not start on the next GPU (free at 40 ms).
        // The waiting batch is not due first. And the other policies.
        for (policy, p_exec, busy, r_latest) in [
            (Policy::Deferred, 6, 20, 30),
            (Policy::Deferred, 3, 40, 30),
            (Policy::Deferred, 3, 2, 3),
            (Policy::Eager, 3, 20, 30),
            (Policy::Symphony, 3, 20, 30),
        ] {
            let (now, _) = handover(policy, p_exec, 1, busy, r_latest);
            assert_eq!(
                now,
                vec![(m0, false)],
                "{policy:?} {p_exec} {busy} {r_latest}"
            );
        }
        // A wider window widens the horizon: 6 ms away, windows of 2 ms.
        assert_eq!(handover(Policy::Deferred, 6, 2, 20, 30).0, vec![(m1, true)]);
    }

    /// One GPU busy until `free`; model 1's schedulable candidate expires at
    /// t + 2 ms for want of a GPU (unless `expire` is false); model 2 (or model
    /// 0 again, with `lone`) waits for its send time `send`. Returns the ranker
    /// at t + 2 ms, its outputs drained.
    fn spell(policy: Policy, free: Dur, send: Dur, expire: bool, lone: bool) -> (Ranker, Time) {
        let mut r = Ranker::new(policy, 0);
        let t = Time(1_000_000_000);
        r.add_gpu_at(t, GpuId(0), true);
        r.handle_candidate(t, ModelId(0), Some(cand(t)), 0);
        assert_eq!(grants(&mut r), vec![(ModelId(0), false)]);
        r.handle_gpu_free(t, GpuId(0), t + free, None);
        let short = Candidate {
            latest: t + Dur::from_ms(1),
            ..cand(t)
        };
        let (busy, waiting) = if lone {
            (ModelId(0), ModelId(0))
        } else {
            (ModelId(1), ModelId(2))
        };
        // Model 0's next notice is its second (its grant was the first).
        let first = u64::from(lone);
        if expire {
            r.handle_candidate(t, busy, Some(short), first);
        }
        r.handle_timeout(t + Dur::from_ms(2));
        let expired: Vec<_> = std::iter::from_fn(|| r.poll_output()).collect();
        assert_eq!(expired.len(), usize::from(expire), "{expired:?}");
        let later = Candidate {
            bs: 4,
            exec_at: t + send,
            latest: t + send + Dur::from_ms(10),
            send_at: t + send,
            bias: Dur::ZERO,
        };
        let seq = first + u64::from(expire && lone);
        r.handle_candidate(t + Dur::from_ms(2), waiting, Some(later), seq);
        r.check_deep();
        (r, t)
    }

    /// `deferred`'s work-conserving spell: within [`FILL_WINDOW`] of an
    /// expiry, a GPU that would idle goes to a waiting candidate at once;
    /// without an expiry, past the window, for a lone model and for the
    /// other policies it waits for the candidate's send time.
    #[test]
    fn an_idle_gpu_goes_to_a_waiting_candidate_only_after_an_expiry() {
        let (ms10, ms30) = (Dur::from_ms(10), Dur::from_ms(30));
        // After an expiry: the GPU free at 10 ms goes to model 2 then.
        let (mut r, t) = spell(Policy::Deferred, ms10, ms30, true, false);
        r.handle_timeout(t + Dur::from_ms(9));
        assert!(grants(&mut r).is_empty(), "the GPU is busy until 10 ms");
        assert_eq!(r.next_timeout(), Some(t + ms10));
        r.handle_timeout(t + ms10);
        assert_eq!(grants(&mut r), vec![(ModelId(2), true)]);
        r.check_deep();

        // No expiry, the spell off, another policy, a lone model: at 30 ms.
        for (policy, expire, lone, off) in [
            (Policy::Deferred, false, false, false),
            (Policy::Deferred, true, false, true),
            (Policy::Eager, true, false, false),
            (Policy::Deferred, true, true, false),
        ] {
            let (mut r, t) = spell(policy, ms10, ms30, expire, lone);
            if off {
                r.set_fill_window(Dur::ZERO);
            }
            let waiting = if lone { ModelId(0) } else { ModelId(2) };
            r.handle_timeout(t + ms10);
            assert!(
                grants(&mut r).is_empty(),
                "{policy:?} {expire} {lone} {off}"
            );
            r.handle_timeout(t + ms30);
            assert_eq!(grants(&mut r), vec![(waiting, false)]);
        }

        // Past the window: the GPU free 1.5 s after the expiry idles.
        let (mut r, t) = spell(
            Policy::Deferred,
            Dur::from_ms(1_502),
            Dur::from_ms(1_600),
            true,
            false,
        );
        r.handle_timeout(t + Dur::from_ms(1_502));
        assert!(grants(&mut r).is_empty());
        r.handle_timeout(t + Dur::from_ms(1_600));
        assert_eq!(grants(&mut r), vec![(ModelId(2), false)]);
    }
}
