//! The model side of a sub-cluster: a set of models' queues and candidates (what one
//! ModelThread owns, Appendix D). Pure: time comes in.
//!
//! # Call order
//! * Inputs: [`ModelShard::handle_request`] (frontend), [`ModelShard::handle_grant`],
//!   [`ModelShard::handle_expired`] and [`ModelShard::handle_requeue`] (ranker),
//!   [`ModelShard::handle_timeout`] (the rate tick), each with `now`.
//! * Then call [`ModelShard::flush`], which informs the ranker of every candidate that
//!   changed (one message per model however many requests arrived), and drain
//!   [`ModelShard::poll_rank`] (to the ranker) and [`ModelShard::poll_output`]
//!   (plans to backends, drops to frontends).
//!
//! A shard owns any subset of the sub-cluster's models; model ids are global.

use super::dispatcher::{Counters, DispatcherConfig, Output, Plan};
use super::ids::{GpuId, ModelId, PlanId};
use super::model::{Candidate, DropReason, ModelSpec, ModelState, Task};
use super::policy::{NetBudget, Policy};
use super::rank::{Booking, RankOutput};
use super::time::{Dur, Time};
use std::collections::VecDeque;

/// What the model side tells the ranker.
#[derive(Debug, Clone, PartialEq)]
pub enum ToRank {
    /// `model`'s current candidate, after handling `seq` ranker notices.
    Candidate {
        model: ModelId,
        cand: Option<Candidate>,
        seq: u64,
    },
    /// After a grant: `gpu` is free again at `free_at`; `booking` is None when the
    /// grant was declined.
    GpuFree {
        gpu: GpuId,
        free_at: Time,
        booking: Option<Booking>,
    },
}

struct Entry {
    state: ModelState,
    /// Arrivals since the last rate tick and the EWMA rate (r/s).
    arrivals: u32,
    rate: f64,
    /// The arrivals' variance per tick (for their index of dispersion): an EWMA of
    /// half the squared difference between consecutive ticks' arrivals, which
    /// neither the rate's warm-up nor a slow change of rate inflates; `last`: the
    /// previous tick's arrivals (None before the first tick).
    var: f64,
    last: Option<f64>,
    /// Ranker notices handled.
    seq: u64,
    /// The candidate last sent to the ranker; `force` sends the next one regardless.
    sent: Option<Candidate>,
    force: bool,
    dirty: bool,
}

/// Period of the rate estimator behind adaptive gathering and the expected-gain rule.
pub const RATE_TICK: Dur = Dur(100_000_000);
/// EWMA weight of the newest tick.
const RATE_EWMA: f64 = 0.2;
/// EWMA weight of the newest tick in the variance of the arrivals per tick (slower
/// than the rate's: a variance needs more ticks than a mean).
const VAR_EWMA: f64 = 0.05;

/// A set of models' scheduling state.
pub struct ModelShard {
    cfg: DispatcherConfig,
    /// Indexed by global model id; None for models owned elsewhere or removed.
    models: Vec<Option<Entry>>,
    own: Vec<ModelId>,
    dirty: Vec<u32>,
    to_rank: VecDeque<ToRank>,
    outputs: VecDeque<Output>,
    counters: Counters,
    last_now: Time,
    next_tick: Time,
    /// GPUs in service and the demand of models owned by other shards (GPU-seconds
    /// per second at their largest batch): each model's GPU share is its part of the
    /// total demand.
    active_gpus: f64,
    others_demand: f64,
    local_demand: f64,
    /// Plan ids are `seed + k * stride` so that shards never collide.
    next_plan: u64,
    plan_stride: u64,
}

impl ModelShard {
    /// A shard whose plan ids are `index + k * count` (shard `index` of `count`).
    pub fn new(cfg: DispatcherConfig, index: u32, count: u32) -> ModelShard {
        ModelShard {
            active_gpus: cfg.gpus as f64,
            cfg,
            models: Vec::new(),
            own: Vec::new(),
            dirty: Vec::new(),
            to_rank: VecDeque::new(),
            outputs: VecDeque::new(),
            counters: Counters::default(),
            last_now: Time::EPOCH_MIN,
            next_tick: Time::EPOCH_MIN,
            others_demand: 0.0,
            local_demand: 0.0,
            next_plan: index as u64,
            plan_stride: count.max(1) as u64,
        }
    }

    pub fn config(&self) -> &DispatcherConfig {
        &self.cfg
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// The models this shard owns.
    pub fn own(&self) -> &[ModelId] {
        &self.own
    }
    pub fn model(&self, id: ModelId) -> Option<&ModelState> {
        self.entry(id).map(|e| &e.state)
    }
    pub fn has_model(&self, id: ModelId) -> bool {
        self.entry(id).is_some()
    }
    /// This shard's demand at the last rate tick (GPU-seconds per second).
    pub fn local_demand(&self) -> f64 {
        self.local_demand
    }
    /// Tells the shard the GPUs in service and the other shards' demand (the runtime
    /// passes what the RankThread and the other ModelThreads last published).
    pub fn set_cluster(&mut self, active_gpus: u32, others_demand: f64) {
        self.active_gpus = active_gpus as f64;
        self.others_demand = others_demand;
    }

    /// Changes the network budget of every model (the runtime measures it).
    pub fn set_net(&mut self, net: NetBudget) {
        self.cfg.net = net;
        for e in self.models.iter_mut().flatten() {
            e.state.set_net(net);
        }
    }

    /// Sets each owned model's measured response margin (`margins[id]`; a model
    /// beyond the slice gets none). See [`ModelState::set_margin`].
    pub fn set_margins(&mut self, margins: &[Dur]) {
        for &id in &self.own {
            let m = margins.get(id.idx()).copied().unwrap_or(Dur::ZERO);
            if let Some(e) = self.models[id.idx()].as_mut() {
                e.state.set_margin(m);
            }
        }
    }

    /// Plans each owned model with its profile times `scales[id]` (a model
    /// beyond the slice: 1). See [`ModelState::set_latency_scale`].
    pub fn set_latency_scales(&mut self, scales: &[f64]) {
        for &id in &self.own {
            let k = scales.get(id.idx()).copied().unwrap_or(1.0);
            if let Some(e) = self.models[id.idx()].as_mut() {
                e.state.set_latency_scale(k);
            }
        }
    }

    fn entry(&self, id: ModelId) -> Option<&Entry> {
        self.models.get(id.idx()).and_then(|e| e.as_ref())
    }

    /// Takes ownership of model `id`.
    pub fn add_model(&mut self, id: ModelId, spec: ModelSpec) {
        let c = &self.cfg;
        let mut state = ModelState::new(id, spec, c.policy, c.gather, c.net, c.queue_max);
        state.eager_cost_max = c.eager_cost_max;
        if self.models.len() <= id.idx() {
            self.models.resize_with(id.idx() + 1, || None);
        }
        assert!(self.models[id.idx()].is_none(), "model {id:?} added twice");
        self.models[id.idx()] = Some(Entry {
            state,
            arrivals: 0,
            rate: 0.0,
            var: 0.0,
            last: None,
            seq: 0,
            sent: None,
            force: false,
            dirty: false,
        });
        self.own.push(id);
    }

    /// Removes model `id`: its queued requests are dropped (`ModelRemoved`) and the
    /// ranker is told it has no candidate. A grant that arrives later is declined.
    pub fn remove_model(&mut self, now: Time, id: ModelId) {
        self.enter(now);
        let Some(e) = self.models.get_mut(id.idx()).and_then(|e| e.take()) else {
            return;
        };
        let mut st = e.state;
        self.drop_queued(id, st.drain(), DropReason::ModelRemoved);
        self.own.retain(|&m| m != id);
        self.to_rank.push_back(ToRank::Candidate {
            model: id,
            cand: None,
            seq: e.seq,
        });
        self.check();
    }

    /// Shutdown: every queued request ends as an explicit `Shutdown` drop and every
    /// candidate is withdrawn. Later requests are still accepted (and can be drained
    /// again); the runtime stops feeding the shard first.
    pub fn drain_all(&mut self, now: Time) {
        self.enter(now);
        for i in 0..self.own.len() {
            let id = self.own[i];
            let e = self.models[id.idx()].as_mut().expect("owned");
            let tasks = e.state.drain();
            self.drop_queued(id, tasks, DropReason::Shutdown);
            self.mark(id.idx());
        }
        self.check();
    }

    /// A request for `model` reached the scheduler. A request for a model this shard
    /// does not own is dropped as `ModelRemoved`.
    pub fn handle_request(&mut self, now: Time, model: ModelId, task: Task) {
        self.enter(now);
        self.counters.received += 1;
        let m = model.idx();
        let Some(e) = self.models.get_mut(m).and_then(|e| e.as_mut()) else {
            self.drop_task(model, task, DropReason::ModelRemoved);
            return;
        };
        e.arrivals = e.arrivals.saturating_add(1);
        if e.state.enqueue(task) {
            self.counters.queued += 1;
            self.refresh(m, now, None);
            self.mark(m);
        } else {
            self.drop_task(model, task, DropReason::QueueFull);
        }
        self.check();
    }

    /// The ranker granted `gpu` (free at `free_at`) to `model`: book the batch that
    /// fits it, or give the GPU back.
    pub fn handle_grant(
        &mut self,
        now: Time,
        model: ModelId,
        gpu: GpuId,
        free_at: Time,
        seq: u64,
        early: bool,
    ) {
        self.enter(now);
        let m = model.idx();
        let Some(e) = self.models.get_mut(m).and_then(|e| e.as_mut()) else {
            self.to_rank.push_back(ToRank::GpuFree {
                gpu,
                free_at,
                booking: None,
            });
            return;
        };
        e.seq = e.seq.max(seq);
        e.force = true;
        self.mark(m);
        let booked = self.book(m, gpu, free_at, now, early);
        if !booked {
            self.to_rank.push_back(ToRank::GpuFree {
                gpu,
                free_at,
                booking: None,
            });
        }
        self.check();
    }

    /// The ranker found `model`'s schedulable candidate expired: gather again.
    pub fn handle_expired(&mut self, now: Time, model: ModelId, seq: u64) {
        self.enter(now);
        let m = model.idx();
        let Some(e) = self.models.get_mut(m).and_then(|e| e.as_mut()) else {
            return;
        };
        e.seq = e.seq.max(seq);
        e.force = true;
        self.refresh(m, now, None);
        self.mark(m);
        self.check();
    }

    /// Shepherd: a running batch of `model` was preempted; its tasks go back.
    pub fn handle_requeue(&mut self, now: Time, model: ModelId, tasks: &[Task]) {
        self.enter(now);
        let m = model.idx();
        let n = tasks.len() as u64;
        self.counters.preemptions += 1;
        self.counters.dispatched -= n;
        match self.models.get_mut(m).and_then(|e| e.as_mut()) {
            Some(e) => {
                e.state.requeue(tasks);
                self.counters.queued += n;
                self.refresh(m, now, None);
                self.mark(m);
            }
            None => {
                for &task in tasks {
                    self.drop_task(model, task, DropReason::ModelRemoved);
                }
            }
        }
        self.check();
    }

    /// One notice from the ranker.
    pub fn handle_rank_output(&mut self, now: Time, out: RankOutput) {
        match out {
            RankOutput::Grant {
                model,
                gpu,
                free_at,
                seq,
                early,
            } => self.handle_grant(now, model, gpu, free_at, seq, early),
            RankOutput::Expired { model, seq } => self.handle_expired(now, model, seq),
            RankOutput::Preempt { model, tasks, .. } => self.handle_requeue(now, model, &tasks),
        }
    }

    /// Runs the rate tick if it is due.
    pub fn handle_timeout(&mut self, now: Time) {
        self.enter(now);
    }

    /// Whether the next input at `now` runs the rate tick (the runtime then hands
    /// the shard the cluster's state first, see [`ModelShard::set_cluster`]).
    pub fn tick_due(&self, now: Time) -> bool {
        now >= self.next_tick
    }

    /// The next rate tick, while some model has queued requests (an idle shard ticks
    /// on its next event instead, so an idle scheduler does not wake up).
    pub fn next_timeout(&self) -> Option<Time> {
        (self.next_tick != Time::EPOCH_MIN && self.counters.queued > 0).then_some(self.next_tick)
    }

    /// Informs the ranker of every candidate that changed since the last flush.
    pub fn flush(&mut self) {
        for i in 0..self.dirty.len() {
            let m = self.dirty[i] as usize;
            let Some(e) = self.models[m].as_mut() else {
                continue;
            };
            e.dirty = false;
            let cand = e.state.cand;
            if e.force || cand != e.sent {
                e.force = false;
                e.sent = cand;
                self.to_rank.push_back(ToRank::Candidate {
                    model: ModelId(m as u32),
                    cand,
                    seq: e.seq,
                });
            }
        }
        self.dirty.clear();
    }

    pub fn poll_rank(&mut self) -> Option<ToRank> {
        self.to_rank.pop_front()
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    // ---------------------------------------------------------------- internals

    /// Ends a request that never got queued.
    fn drop_task(&mut self, model: ModelId, task: Task, reason: DropReason) {
        self.counters.dropped += 1;
        self.outputs.push_back(Output::Drop {
            model,
            task,
            reason,
        });
    }

    /// Ends requests taken out of a model's queue.
    fn drop_queued(&mut self, model: ModelId, tasks: Vec<Task>, reason: DropReason) {
        for task in tasks {
            self.counters.queued -= 1;
            self.drop_task(model, task, reason);
        }
    }

    fn mark(&mut self, m: usize) {
        if let Some(e) = self.models[m].as_mut() {
            if !e.dirty {
                e.dirty = true;
                self.dirty.push(m as u32);
            }
        }
    }

    fn enter(&mut self, now: Time) {
        debug_assert!(now >= self.last_now, "time went backwards");
        self.last_now = now;
        if now >= self.next_tick {
            self.tick(now);
        }
    }

    /// Folds the arrivals of the elapsed ticks into the rate estimates and hands each
    /// model its rate and GPU share (shared by demand at the largest batch), then
    /// gathers every candidate again with the new rates.
    fn tick(&mut self, now: Time) {
        if self.next_tick == Time::EPOCH_MIN {
            self.next_tick = now + RATE_TICK;
            return;
        }
        let k = 1 + (now - self.next_tick).0 / RATE_TICK.0;
        let decay = (1.0 - RATE_EWMA).powi((k - 1).min(1000) as i32);
        self.next_tick += Dur(RATE_TICK.0 * k);
        let mut local = 0.0;
        for id in &self.own {
            let e = self.models[id.idx()].as_mut().expect("owned");
            let count = e.arrivals as f64;
            if let Some(last) = e.last {
                let diff = count - last;
                e.var = (1.0 - VAR_EWMA) * e.var + VAR_EWMA * diff * diff / 2.0;
            }
            e.last = Some(count);
            e.rate = ((1.0 - RATE_EWMA) * e.rate + RATE_EWMA * (count / RATE_TICK.as_secs_f64()))
                * decay;
            e.arrivals = 0;
            local += Self::demand(e);
        }
        self.local_demand = local;
        let total = local + self.others_demand;
        let n = self.active_gpus;
        for i in 0..self.own.len() {
            let m = self.own[i].idx();
            let e = self.models[m].as_mut().expect("owned");
            let share = if total > 0.0 {
                n * Self::demand(e) / total
            } else {
                n
            };
            let rate = e.rate;
            let mean = rate * RATE_TICK.as_secs_f64();
            let dispersion = if mean > 0.0 { e.var / mean } else { 1.0 };
            // The EWMA's variance is w / (2 - w) of the per-tick counts'.
            let se = (e.var * RATE_EWMA / (2.0 - RATE_EWMA)).sqrt() / RATE_TICK.as_secs_f64();
            e.state.observe_rate(rate, share);
            e.state.observe_cluster(n, se);
            e.state.observe_dispersion(dispersion);
            if e.state.cand.is_some() {
                self.refresh(m, now, None);
                self.mark(m);
            }
        }
    }

    fn demand(e: &Entry) -> f64 {
        let b = e.state.max_batch();
        e.rate * e.state.spec.profile.latency(b).as_secs_f64() / b as f64
    }

    /// Re-gathers model `m`'s batch (dropping what cannot be served).
    fn refresh(&mut self, m: usize, now: Time, gpu_free: Option<Time>) -> Option<Candidate> {
        self.refresh_for(m, now, gpu_free, false)
    }

    fn refresh_for(
        &mut self,
        m: usize,
        now: Time,
        gpu_free: Option<Time>,
        at_once: bool,
    ) -> Option<Candidate> {
        let outputs = &mut self.outputs;
        let counters = &mut self.counters;
        let model = ModelId(m as u32);
        let e = self.models[m].as_mut()?;
        e.state
            .update_for(now, gpu_free, at_once, &mut |task, reason| {
                counters.queued -= 1;
                counters.dropped += 1;
                outputs.push_back(Output::Drop {
                    model,
                    task,
                    reason,
                });
            })
    }

    /// Gathers model `m`'s batch for a GPU free at `f` and books it; returns false
    /// (the candidate is gathered again and stays with the model) when the batch must
    /// wait after all.
    fn book(&mut self, m: usize, gpu: GpuId, f: Time, now: Time, at_once: bool) -> bool {
        let Some(c) = self.refresh_for(m, now, Some(f), at_once) else {
            return false;
        };
        let st = &self.models[m].as_ref().expect("present").state;
        let start = (now + st.delay(c.bs)).max(f);
        if c.exec_at > start {
            // The batch changed (its head expired) and must wait again.
            self.refresh(m, now, None);
            return false;
        }
        let e = self.models[m].as_mut().expect("present");
        let tasks = e.state.take(c.bs);
        let bs = tasks.len() as u32;
        let finish_at = c.exec_at + e.state.spec.profile.latency(bs);
        assert!(
            c.exec_at >= f,
            "GPU {gpu:?} booked twice: batch at {:?} before free at {f:?}",
            c.exec_at
        );
        if self.cfg.check_invariants {
            let resp = e.state.resp();
            let first = tasks.iter().map(|t| t.deadline).min().expect("bs >= 1");
            assert!(
                finish_at + resp <= first,
                "a batch of model {m} is planned to finish at {finish_at:?}, after its deadline {first:?}"
            );
        }
        let id = PlanId(self.next_plan);
        self.next_plan += self.plan_stride;
        self.counters.queued -= bs as u64;
        self.counters.dispatched += bs as u64;
        self.counters.plans += 1;
        let model = ModelId(m as u32);
        // Only Shepherd needs the running tasks back (preemption).
        let kept = if matches!(self.cfg.policy, Policy::Shepherd { .. }) {
            tasks.clone()
        } else {
            Vec::new()
        };
        // The GPU's puller pulls this batch's inputs before it starts and the
        // next batch's after: where pulls take longer than batches run, the
        // puller sets the GPU's pace. (The next batch is priced at this one's
        // size. Holding the next batch only until a predicted end of the
        // queued pulls, from each plan's arrival, packed the puller tighter
        // and served less in the cluster simulator.)
        let held = c.exec_at + e.state.hold(bs);
        self.to_rank.push_back(ToRank::GpuFree {
            gpu,
            free_at: finish_at.max(held),
            booking: Some(Booking {
                plan: id,
                model,
                start: c.exec_at,
                end: finish_at,
                held,
                tasks: kept,
            }),
        });
        self.outputs.push_back(Output::Dispatch(Plan {
            id,
            model,
            gpu,
            exec_at: c.exec_at,
            finish_at,
            tasks,
        }));
        self.refresh(m, now, None);
        true
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
            self.own
                .iter()
                .map(|id| self.models[id.idx()]
                    .as_ref()
                    .map_or(0, |e| e.state.queue_len()) as u64)
                .sum::<u64>()
        );
    }

    /// Expensive consistency check for tests: queues sorted, candidates within them.
    pub fn check_deep(&self) {
        for id in &self.own {
            let st = &self.models[id.idx()].as_ref().expect("owned").state;
            let q = st.queue();
            for w in q.iter().zip(q.iter().skip(1)) {
                assert!(
                    w.0.deadline <= w.1.deadline,
                    "queue of model {id:?} unsorted"
                );
            }
            match st.cand {
                None => assert!(q.is_empty(), "model {id:?} has tasks but no candidate"),
                Some(c) => {
                    assert!(c.bs as usize <= q.len());
                    assert!(c.exec_at <= c.latest);
                }
            }
        }
    }
}
