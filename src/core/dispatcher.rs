//! The central dispatcher: every model's state plus the rank state (GPU free times,
//! model timers, the ranking of schedulable candidates) of one sub-cluster.
//!
//! # Call order
//! The dispatcher is a pure state machine (quinn-proto style):
//! * feed inputs with [`Dispatcher::handle_request`], [`Dispatcher::handle_timeout`]
//!   and [`Dispatcher::handle_gpu_report`], each with the current time `now`;
//!   `now` must never go backwards;
//! * after every input, drain [`Dispatcher::poll_output`] until it returns `None`;
//! * call [`Dispatcher::handle_timeout`] no later than [`Dispatcher::next_timeout`].
//!
//! # Algorithm
//! Algorithm 1 of the Symphony paper with the Appendix D extensions. A model's
//! candidate is *pending* until its send time `exec_at - delay(bs)`; then it asks for
//! the lowest-id GPU free by `exec_at`. If none is free it becomes *schedulable* and
//! is ranked by `latest` (earliest first); the earliest-free GPU takes the top-ranked
//! candidate `delay(bs)` before it becomes free. A schedulable candidate whose
//! `latest` passes is re-gathered (a smaller batch, or the head is dropped), so the
//! ranking never holds a batch that can no longer meet its deadline.
//!
//! Every event costs O(log M + log G) (Shepherd's preemption scan is O(G)).

use super::ids::{GpuId, ModelId, PlanId};
use super::model::{Candidate, DropReason, ModelSpec, ModelState, Task};
use super::policy::{Gather, NetBudget, Policy};
use super::structs::{IndexedHeap, MinTree};
use super::time::{Dur, Time};
use std::collections::VecDeque;

/// A batch plan: run `tasks` of `model` on `gpu` starting at `exec_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub id: PlanId,
    pub model: ModelId,
    pub gpu: GpuId,
    pub exec_at: Time,
    /// exec_at + l(|tasks|): when the GPU is expected to be free again.
    pub finish_at: Time,
    pub tasks: Vec<Task>,
}

/// What the dispatcher asks the world to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Dispatch(Plan),
    Drop {
        model: ModelId,
        task: Task,
        reason: DropReason,
    },
    /// Cancel plan `plan` on `gpu` (Shepherd); its tasks went back to the queue.
    Preempt {
        gpu: GpuId,
        plan: PlanId,
        requeued: u32,
    },
}

/// Configuration of one dispatcher.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub policy: Policy,
    pub gather: Gather,
    pub net: NetBudget,
    pub gpus: u32,
    /// Bound on each model's queue; a request beyond it is dropped as `QueueFull`.
    pub queue_max: usize,
    /// Check the invariants after every event (cheap, O(1); on in debug builds and
    /// in the simulator).
    pub check_invariants: bool,
    /// Deferred only: once the model's rate is measured, make the batch schedulable
    /// at once when fewer than this many more requests are expected before its
    /// frontrun moment (0 = pure Symphony frontrun). Low-rate models then stop
    /// waiting for requests that will not come and risking a busy cluster.
    pub min_expected_gain: f64,
}

impl DispatcherConfig {
    pub fn new(policy: Policy, gpus: u32) -> Self {
        DispatcherConfig {
            policy,
            gather: Gather::Lazy,
            net: NetBudget::default(),
            gpus,
            queue_max: 1 << 20,
            check_invariants: cfg!(debug_assertions),
            min_expected_gain: DEFAULT_MIN_EXPECTED_GAIN,
        }
    }
}

/// Counters of what happened to requests; `received == queued + dispatched + dropped`
/// at all times (dispatched tasks then end at the backend as good or late).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub received: u64,
    pub queued: u64,
    pub dispatched: u64,
    pub dropped: u64,
    pub plans: u64,
    pub preemptions: u64,
}

#[derive(Debug, Clone)]
struct Booking {
    plan: PlanId,
    model: ModelId,
    start: Time,
    end: Time,
    tasks: Vec<Task>,
}

/// Ranking key of a schedulable candidate: smallest first.
type RankKey = (i64, i64);

/// One dispatcher (one sub-cluster): models, GPUs and their matchmaking.
pub struct Dispatcher {
    cfg: DispatcherConfig,
    models: Vec<ModelState>,
    /// Predicted free time of each GPU; `Time::NEVER` for a removed GPU.
    gpus: MinTree,
    /// Last booking per GPU (Shepherd's preemption needs the running batch).
    bookings: Vec<Option<Booking>>,
    /// Pending candidates: their send time; schedulable ones: their expiry.
    model_timers: IndexedHeap<Time>,
    ready: IndexedHeap<RankKey>,
    lookahead: Dur,
    outputs: VecDeque<Output>,
    next_plan: u64,
    counters: Counters,
    last_now: Time,
    /// Models to re-place after a preemption changed their queue.
    dirty: Vec<usize>,
    /// GPUs in service.
    active_gpus: u32,
    /// Adaptive gathering: arrivals since the last rate tick, EWMA rates (r/s).
    arrivals: Vec<u32>,
    rates: Vec<f64>,
    next_tick: Time,
}

/// Default of [`DispatcherConfig::min_expected_gain`]: defer a batch only while at
/// least two more requests are expected before its frontrun moment.
pub const DEFAULT_MIN_EXPECTED_GAIN: f64 = 2.0;

/// Period of the rate estimator behind adaptive gathering.
pub const RATE_TICK: Dur = Dur(100_000_000);
/// EWMA weight of the newest tick.
const RATE_EWMA: f64 = 0.2;

impl Dispatcher {
    pub fn new(cfg: DispatcherConfig, specs: Vec<ModelSpec>) -> Dispatcher {
        assert!(
            cfg.policy != Policy::Nexus,
            "Nexus runs on core::nexus, not on the central dispatcher"
        );
        let lookahead = match cfg.policy {
            Policy::Clockwork { lookahead } => lookahead,
            _ => Dur::ZERO,
        };
        let mut d = Dispatcher {
            gpus: MinTree::new(cfg.gpus as usize, Time::EPOCH_MIN),
            bookings: vec![None; cfg.gpus as usize],
            models: Vec::new(),
            model_timers: IndexedHeap::new(),
            ready: IndexedHeap::new(),
            lookahead,
            outputs: VecDeque::new(),
            next_plan: 0,
            counters: Counters::default(),
            last_now: Time::EPOCH_MIN,
            dirty: Vec::new(),
            active_gpus: cfg.gpus,
            arrivals: Vec::new(),
            rates: Vec::new(),
            next_tick: Time::EPOCH_MIN,
            cfg,
        };
        for s in specs {
            d.add_model(s);
        }
        d
    }

    pub fn config(&self) -> &DispatcherConfig {
        &self.cfg
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    pub fn models(&self) -> &[ModelState] {
        &self.models
    }
    pub fn num_gpus(&self) -> usize {
        self.gpus.len()
    }
    /// The predicted free time of `gpu` (`Time::NEVER` once removed).
    pub fn gpu_free_at(&self, gpu: GpuId) -> Time {
        self.gpus.get(gpu.idx())
    }

    /// Adds a model; returns its id.
    pub fn add_model(&mut self, spec: ModelSpec) -> ModelId {
        let id = ModelId(self.models.len() as u32);
        self.models.push(ModelState::new(
            id,
            spec,
            self.cfg.policy,
            self.cfg.gather,
            self.cfg.net,
            self.cfg.queue_max,
        ));
        self.models[id.idx()].min_expected_gain = self.cfg.min_expected_gain;
        self.arrivals.push(0);
        self.rates.push(0.0);
        id
    }

    /// The measured arrival rate of each model (adaptive gathering only).
    pub fn rates(&self) -> &[f64] {
        &self.rates
    }

    /// Folds the arrivals of the elapsed ticks into the rate estimates and hands each
    /// model its rate and GPU share (shared by demand at the largest batch).
    fn tick(&mut self, now: Time) {
        if self.next_tick == Time::EPOCH_MIN {
            self.next_tick = now + RATE_TICK;
            return;
        }
        let k = 1 + (now - self.next_tick).0 / RATE_TICK.0;
        let decay = (1.0 - RATE_EWMA).powi((k - 1).min(1000) as i32);
        for (r, a) in self.rates.iter_mut().zip(self.arrivals.iter_mut()) {
            *r = ((1.0 - RATE_EWMA) * *r + RATE_EWMA * (*a as f64 / RATE_TICK.as_secs_f64()))
                * decay;
            *a = 0;
        }
        self.next_tick += Dur(RATE_TICK.0 * k);
        let demand: Vec<f64> = self
            .models
            .iter()
            .zip(&self.rates)
            .map(|(m, r)| {
                let b = m.max_batch();
                r * m.spec.profile.latency(b).as_secs_f64() / b as f64
            })
            .collect();
        let total: f64 = demand.iter().sum();
        let n = self.active_gpus as f64;
        for (i, m) in self.models.iter_mut().enumerate() {
            let share = if total > 0.0 {
                n * demand[i] / total
            } else {
                n
            };
            m.observe_rate(self.rates[i], share);
        }
    }

    /// Adds a GPU (free from now on); returns its id.
    pub fn add_gpu(&mut self) -> GpuId {
        self.active_gpus += 1;
        self.gpus.push(Time::EPOCH_MIN);
        self.bookings.push(None);
        GpuId(self.gpus.len() as u32 - 1)
    }

    /// Takes a GPU out of service: nothing new is booked on it. A batch already booked
    /// on it still runs (the backend drains it).
    pub fn remove_gpu(&mut self, now: Time, gpu: GpuId) {
        self.enter(now);
        if self.gpus.get(gpu.idx()) != Time::NEVER {
            self.active_gpus -= 1;
        }
        self.gpus.set(gpu.idx(), Time::NEVER);
        self.check();
    }

    /// A request reached the scheduler.
    pub fn handle_request(&mut self, now: Time, model: ModelId, task: Task) {
        self.enter(now);
        let m = model.idx();
        self.counters.received += 1;
        self.arrivals[m] = self.arrivals[m].saturating_add(1);
        if self.models[m].enqueue(task) {
            self.counters.queued += 1;
            self.refresh(m, now, None);
            self.place(m, now);
            self.settle(now);
        } else {
            self.counters.dropped += 1;
            self.outputs.push_back(Output::Drop {
                model,
                task,
                reason: DropReason::QueueFull,
            });
        }
        self.check();
    }

    /// A backend reports when `gpu` really became (or will become) free after `plan`.
    /// Only the latest plan booked on the GPU moves its free time.
    pub fn handle_gpu_report(&mut self, now: Time, gpu: GpuId, plan: PlanId, free_at: Time) {
        self.enter(now);
        let g = gpu.idx();
        if self.gpus.get(g) == Time::NEVER {
            return;
        }
        if let Some(b) = &mut self.bookings[g] {
            if b.plan == plan {
                b.end = free_at;
                self.gpus.set(g, free_at);
            }
        }
        self.run_timers(now);
        self.check();
    }

    /// Runs every timer due at or before `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        self.enter(now);
        self.run_timers(now);
        self.check();
    }

    /// The next moment `handle_timeout` must be called, if any.
    pub fn next_timeout(&self) -> Option<Time> {
        let tm = self.model_timers.peek().map(|(_, t)| t);
        match (tm, self.gpu_timer()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    // ---------------------------------------------------------------- internals

    fn enter(&mut self, now: Time) {
        debug_assert!(now >= self.last_now, "time went backwards");
        self.last_now = now;
        if now >= self.next_tick {
            self.tick(now);
        }
    }

    fn rank_key(&self, c: &Candidate) -> RankKey {
        match self.cfg.policy {
            Policy::Shepherd { .. } => (-(c.bs as i64), c.latest.0),
            _ => (c.latest.0, 0),
        }
    }

    /// When the earliest-free GPU should take the top-ranked schedulable candidate.
    fn gpu_timer(&self) -> Option<Time> {
        let (m, _) = self.ready.peek()?;
        let c = self.models[m].cand?;
        let (_, f) = self.gpus.argmin()?;
        Some(f - self.lookahead - self.models[m].delay(c.bs))
    }

    fn run_timers(&mut self, now: Time) {
        loop {
            let tm = self.model_timers.peek();
            let tg = self.gpu_timer();
            match (tm, tg) {
                (Some((m, t)), g) if t <= now && g.is_none_or(|g| t <= g) => {
                    // A pending candidate reached its send time, or a schedulable one
                    // its expiry: gather again and place it.
                    self.refresh(m, now, None);
                    self.place(m, now);
                    self.settle(now);
                }
                (_, Some(g)) if g <= now => {
                    self.on_gpu_timer(now);
                    self.settle(now);
                }
                _ => break,
            }
        }
    }

    fn on_gpu_timer(&mut self, now: Time) {
        let Some((m, _)) = self.ready.peek() else {
            return;
        };
        let Some((g_first, f)) = self.gpus.argmin() else {
            return;
        };
        let bs = self.models[m].cand.map_or(1, |c| c.bs);
        let g = if self.lookahead == Dur::ZERO {
            let start = (now + self.models[m].delay(bs)).max(f);
            self.gpus.leftmost_le(start).unwrap_or(g_first)
        } else {
            g_first
        };
        self.grant(m, g, now);
        self.place(m, now);
    }

    /// Re-gathers model `m`'s batch (dropping what cannot be served).
    fn refresh(&mut self, m: usize, now: Time, gpu_free: Option<Time>) -> Option<Candidate> {
        let outputs = &mut self.outputs;
        let counters = &mut self.counters;
        let model = ModelId(m as u32);
        self.models[m].update(now, gpu_free, &mut |task, reason| {
            counters.queued -= 1;
            counters.dropped += 1;
            outputs.push_back(Output::Drop {
                model,
                task,
                reason,
            });
        })
    }

    /// Puts model `m`'s current candidate where it belongs: a timer if pending,
    /// a GPU if one is free, else the ranking of schedulable candidates.
    fn place(&mut self, m: usize, now: Time) {
        // Each pass books a GPU, preempts one (Shepherd; a batch booked at this
        // instant is never preempted, so each GPU is freed and booked at most once
        // here), or ends: 2G + 2 passes suffice; the bound only guards against bugs.
        for _ in 0..4 * (self.gpus.len() + 2) {
            self.model_timers.remove(m);
            self.ready.remove(m);
            let Some(c) = self.models[m].cand else {
                return;
            };
            if c.send_at > now {
                self.model_timers.set(m, c.send_at);
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
                    self.grant(m, g, now);
                }
                None => {
                    let key = self.rank_key(&c);
                    self.ready.set(m, key);
                    let expire = c.latest - self.models[m].delay(c.bs) + Dur(1);
                    if let Policy::Shepherd { factor } = self.cfg.policy {
                        if self.preempt_for(m, now, factor) {
                            continue;
                        }
                    }
                    self.model_timers.set(m, expire.max(now + Dur(1)));
                    return;
                }
            }
        }
        debug_assert!(
            false,
            "place() did not settle: policy {:?} model {m} cand {:?} gpus {:?}",
            self.cfg.policy,
            self.models[m].cand,
            (0..self.gpus.len())
                .map(|g| self.gpus.get(g))
                .collect::<Vec<_>>()
        );
    }

    /// Offers GPU `g` to model `m`: re-gathers the batch for the GPU's free time and
    /// books it, or declines (the candidate is re-gathered and stays with the model).
    fn grant(&mut self, m: usize, g: usize, now: Time) -> bool {
        let f = self.gpus.get(g);
        let Some(c) = self.refresh(m, now, Some(f)) else {
            return false;
        };
        let start = (now + self.models[m].delay(c.bs)).max(f);
        if c.exec_at > start {
            // The batch changed (its head expired) and must wait again.
            self.refresh(m, now, None);
            return false;
        }
        let tasks = self.models[m].take(c.bs);
        let bs = tasks.len() as u32;
        let finish_at = c.exec_at + self.models[m].spec.profile.latency(bs);
        assert!(
            c.exec_at >= f,
            "GPU {g} booked twice: batch at {:?} before free at {f:?}",
            c.exec_at
        );
        if self.cfg.check_invariants {
            let resp = self.cfg.net.resp;
            let first = tasks.iter().map(|t| t.deadline).min().expect("bs >= 1");
            assert!(
                finish_at + resp <= first,
                "a batch of model {m} is planned to finish at {finish_at:?}, after its deadline {first:?}"
            );
        }
        let id = PlanId(self.next_plan);
        self.next_plan += 1;
        self.gpus.set(g, finish_at);
        self.counters.queued -= bs as u64;
        self.counters.dispatched += bs as u64;
        self.counters.plans += 1;
        let model = ModelId(m as u32);
        // Only Shepherd needs the running tasks back (preemption); others keep the
        // identity to match reports.
        let kept = if matches!(self.cfg.policy, Policy::Shepherd { .. }) {
            tasks.clone()
        } else {
            Vec::new()
        };
        self.bookings[g] = Some(Booking {
            plan: id,
            model,
            start: c.exec_at,
            end: finish_at,
            tasks: kept,
        });
        self.outputs.push_back(Output::Dispatch(Plan {
            id,
            model,
            gpu: GpuId(g as u32),
            exec_at: c.exec_at,
            finish_at,
            tasks,
        }));
        self.refresh(m, now, None);
        true
    }

    /// Shepherd's Flex: if model `m`'s candidate is at least `factor` times larger
    /// than the smallest running batch, cancel that batch (its tasks go back to their
    /// queue) so the GPU is free now. Returns whether a GPU was freed.
    fn preempt_for(&mut self, m: usize, now: Time, factor: u32) -> bool {
        let Some(c) = self.models[m].cand else {
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
        let victim = b.model.idx();
        self.models[victim].requeue(&b.tasks);
        let n = b.tasks.len() as u64;
        self.counters.dispatched -= n;
        self.counters.queued += n;
        self.counters.preemptions += 1;
        self.outputs.push_back(Output::Preempt {
            gpu: GpuId(g as u32),
            plan: b.plan,
            requeued: n as u32,
        });
        self.gpus.set(g, now);
        // The victim's queue changed: gather again (for `m` itself right away).
        self.refresh(victim, now, None);
        if victim != m {
            self.dirty.push(victim);
        }
        true
    }

    /// Places the models whose queues changed behind their back (preemption victims).
    fn settle(&mut self, now: Time) {
        while let Some(v) = self.dirty.pop() {
            self.refresh(v, now, None);
            self.place(v, now);
        }
    }

    fn check(&self) {
        if !self.cfg.check_invariants {
            return;
        }
        let c = &self.counters;
        assert_eq!(
            c.received,
            c.queued + c.dispatched + c.dropped,
            "every request is queued, dispatched or dropped exactly once: {c:?}"
        );
        debug_assert_eq!(
            c.queued,
            self.models
                .iter()
                .map(|m| m.queue_len() as u64)
                .sum::<u64>()
        );
        // The top schedulable candidate is still valid.
        if let Some((m, _)) = self.ready.peek() {
            let cand = self.models[m].cand.expect("ranked model has a candidate");
            assert!(cand.send_at <= self.last_now + Dur(1) || self.lookahead > Dur::ZERO);
        }
    }

    /// Expensive consistency check for tests: every model's candidate is placed.
    pub fn check_deep(&self) {
        for (m, model) in self.models.iter().enumerate() {
            let q = model.queue();
            for w in q.iter().zip(q.iter().skip(1)) {
                assert!(w.0.deadline <= w.1.deadline, "queue of model {m} unsorted");
            }
            match model.cand {
                None => {
                    assert!(q.is_empty(), "model {m} has tasks but no candidate");
                    assert!(!self.model_timers.contains(m) && !self.ready.contains(m));
                }
                Some(c) => {
                    assert!(c.bs as usize <= q.len());
                    assert!(c.exec_at <= c.latest);
                    assert!(self.model_timers.contains(m), "model {m} has no timer");
                    if self.ready.contains(m) {
                        assert!(c.send_at <= self.last_now);
                    } else {
                        assert_eq!(self.model_timers.get(m), Some(c.send_at));
                    }
                }
            }
        }
    }
}
