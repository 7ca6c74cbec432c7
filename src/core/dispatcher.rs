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
//!
//! # Structure
//! The dispatcher is the paper's two halves joined by direct calls: a
//! [`ModelShard`] owning every model (the ModelThreads' part) and a [`Ranker`] (the
//! RankThread's part). The real-time runtime runs the same two halves on threads
//! joined by channels; here each message is handled as soon as it is produced, and
//! timers run one at a time, as one thread would.

use super::ids::{GpuId, ModelId, PlanId};
use super::model::{DropReason, ModelSpec, ModelState, Task};
use super::policy::{Gather, NetBudget, Policy};
use super::rank::{RankOutput, Ranker};
use super::shard::ModelShard;
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
    /// Deferred only ("defer only when it pays"): a batch starts at once, rather
    /// than at its frontrun moment, when running it now would cost at most this
    /// fraction of its model's spare GPU time (the GPU time the batch's expected
    /// growth saves, against the model's share of the GPUs less its expected
    /// load). 0 defers every batch that can grow, as the paper's rule
    /// ([`Policy::Symphony`]) does. See `ModelState::waiting_pays`.
    pub eager_cost_max: f64,
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
            eager_cost_max: DEFAULT_EAGER_COST_MAX,
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

impl Counters {
    /// Adds another set of counters (one per ModelThread) into this one.
    pub fn add(&mut self, o: &Counters) {
        self.received += o.received;
        self.queued += o.queued;
        self.dispatched += o.dispatched;
        self.dropped += o.dropped;
        self.plans += o.plans;
        self.preemptions += o.preemptions;
    }
}

/// One dispatcher (one sub-cluster): models, GPUs and their matchmaking.
pub struct Dispatcher {
    shard: ModelShard,
    rank: Ranker,
    outputs: VecDeque<Output>,
    num_models: u32,
}

/// Default of [`DispatcherConfig::eager_cost_max`]: a batch may start at once when
/// that costs at most 2% of its model's spare GPU time.
pub const DEFAULT_EAGER_COST_MAX: f64 = 0.02;

impl Dispatcher {
    pub fn new(cfg: DispatcherConfig, specs: Vec<ModelSpec>) -> Dispatcher {
        Dispatcher::with_plan_ids(cfg, specs, 0, 1)
    }

    /// A dispatcher whose plan ids are `index + k * count`: dispatcher `index`
    /// of `count` sharing one plan id space (the sub-clusters of a scheduler).
    pub fn with_plan_ids(
        cfg: DispatcherConfig,
        specs: Vec<ModelSpec>,
        index: u32,
        count: u32,
    ) -> Dispatcher {
        assert!(
            cfg.policy != Policy::Nexus,
            "Nexus runs on core::nexus, not on the central dispatcher"
        );
        let mut d = Dispatcher {
            rank: Ranker::new(cfg.policy, cfg.gpus),
            shard: ModelShard::new(cfg, index, count),
            outputs: VecDeque::new(),
            num_models: 0,
        };
        for s in specs {
            d.add_model(s);
        }
        d
    }

    pub fn config(&self) -> &DispatcherConfig {
        self.shard.config()
    }
    pub fn counters(&self) -> &Counters {
        self.shard.counters()
    }
    /// The state of model `id` (None once removed).
    pub fn model(&self, id: ModelId) -> Option<&ModelState> {
        self.shard.model(id)
    }
    pub fn num_models(&self) -> usize {
        self.num_models as usize
    }
    pub fn num_gpus(&self) -> usize {
        self.rank.num_gpus()
    }
    /// The predicted free time of `gpu` (`Time::NEVER` once removed).
    pub fn gpu_free_at(&self, gpu: GpuId) -> Time {
        self.rank.gpu_free_at(gpu)
    }
    /// Adds a model; returns its id.
    pub fn add_model(&mut self, spec: ModelSpec) -> ModelId {
        let id = ModelId(self.num_models);
        self.num_models += 1;
        self.shard.add_model(id, spec);
        self.rank.add_model(id);
        id
    }

    /// Removes a model: its queued requests are dropped (`ModelRemoved`), batches
    /// already dispatched run.
    pub fn remove_model(&mut self, now: Time, id: ModelId) {
        self.shard.remove_model(now, id);
        self.pump(now);
    }

    /// Changes the network budget (d_ctrl, d_data, response) of every model.
    pub fn set_net(&mut self, net: NetBudget) {
        self.shard.set_net(net);
    }

    /// Sets the models' measured response margins (`margins[id]`), see
    /// [`ModelState::set_margin`].
    pub fn set_margins(&mut self, margins: &[Dur]) {
        self.shard.set_margins(margins);
    }

    /// Plans the models with their profiles times `scales[id]`, see
    /// [`ModelState::set_latency_scale`].
    pub fn set_latency_scales(&mut self, scales: &[f64]) {
        self.shard.set_latency_scales(scales);
    }

    /// Adds a GPU (free from now on); returns its id.
    pub fn add_gpu(&mut self) -> GpuId {
        let g = self.rank.add_gpu();
        self.shard.set_cluster(self.rank.active_gpus(), 0.0);
        g
    }

    /// Gives GPU id `gpu` to a GPU entering now, in service or not (see
    /// [`Ranker::add_gpu_at`]: a known id must be out of service and keeps
    /// nothing of its last holder); false for an id in service.
    pub fn add_gpu_at(&mut self, now: Time, gpu: GpuId, in_service: bool) -> bool {
        let ok = self.rank.add_gpu_at(now, gpu, in_service);
        self.shard.set_cluster(self.rank.active_gpus(), 0.0);
        ok
    }

    /// Takes a GPU out of service: nothing new is booked on it. A batch already booked
    /// on it still runs (the backend drains it).
    pub fn remove_gpu(&mut self, now: Time, gpu: GpuId) {
        self.rank.remove_gpu(now, gpu);
        self.shard.set_cluster(self.rank.active_gpus(), 0.0);
    }

    /// A request reached the scheduler.
    pub fn handle_request(&mut self, now: Time, model: ModelId, task: Task) {
        self.shard.handle_request(now, model, task);
        self.pump(now);
    }

    /// A backend reports when `gpu` really became (or will become) free after `plan`.
    /// Only the latest plan booked on the GPU moves its free time.
    pub fn handle_gpu_report(&mut self, now: Time, gpu: GpuId, plan: PlanId, free_at: Time) {
        self.rank.handle_gpu_report(now, gpu, plan, free_at);
        self.run_timers(now);
    }

    /// Runs every timer due at or before `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        self.run_timers(now);
    }

    /// The next moment `handle_timeout` must be called, if any.
    pub fn next_timeout(&self) -> Option<Time> {
        match (self.rank.next_timeout(), self.shard.next_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    // ---------------------------------------------------------------- internals

    fn run_timers(&mut self, now: Time) {
        if self.shard.next_timeout().is_some_and(|t| t <= now) {
            self.shard.handle_timeout(now);
            self.pump(now);
        }
        while self.rank.step_timeout(now) {
            self.pump(now);
        }
    }

    /// Passes messages between the two halves until both are quiet.
    fn pump(&mut self, now: Time) {
        loop {
            self.shard.flush();
            let mut busy = false;
            while let Some(msg) = self.shard.poll_rank() {
                busy = true;
                self.rank.handle_from_models(now, msg);
            }
            while let Some(out) = self.rank.poll_output() {
                busy = true;
                if let RankOutput::Preempt {
                    gpu, plan, tasks, ..
                } = &out
                {
                    // Outputs so far precede the preemption (the plan's dispatch).
                    while let Some(o) = self.shard.poll_output() {
                        self.outputs.push_back(o);
                    }
                    self.outputs.push_back(Output::Preempt {
                        gpu: *gpu,
                        plan: *plan,
                        requeued: tasks.len() as u32,
                    });
                }
                self.shard.handle_rank_output(now, out);
            }
            if !busy {
                break;
            }
        }
        while let Some(o) = self.shard.poll_output() {
            self.outputs.push_back(o);
        }
    }

    /// Expensive consistency check for tests: every model's candidate is placed, and
    /// the ranker holds exactly the model side's candidates.
    pub fn check_deep(&self) {
        self.shard.check_deep();
        self.rank.check_deep();
        for m in 0..self.num_models {
            let id = ModelId(m);
            let cand = self.shard.model(id).and_then(|s| s.cand);
            assert_eq!(
                cand,
                self.rank.candidate(id),
                "model {m}: the ranker's candidate differs from the model's"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{LatencyProfile, TaskId};

    /// Runs `d`'s timers up to `to`; the dispatched plans, each with the moment
    /// it left.
    fn run_to(d: &mut Dispatcher, to: Time, out: &mut Vec<(Time, Plan)>, now: &mut Time) {
        while let Some(t) = d.next_timeout().filter(|&t| t <= to) {
            *now = t.max(*now);
            d.handle_timeout(*now);
            drain(d, *now, out);
        }
        *now = to;
        d.handle_timeout(to);
        drain(d, to, out);
    }

    fn drain(d: &mut Dispatcher, now: Time, out: &mut Vec<(Time, Plan)>) {
        while let Some(o) = d.poll_output() {
            match o {
                Output::Dispatch(p) => out.push((now, p)),
                o => panic!("unexpected {o:?}"),
            }
        }
    }

    /// One request for model 0 arriving at `now` with `slo`; the plans it
    /// brings go to `out`.
    fn request(d: &mut Dispatcher, now: Time, id: TaskId, slo: Dur, out: &mut Vec<(Time, Plan)>) {
        let t = Task {
            id,
            arrival: now,
            deadline: now + slo,
            tag: 0,
            cap: 0,
        };
        d.handle_request(now, ModelId(0), t);
        drain(d, now, out);
    }

    /// The pull budget enters a batch's start only where the pull cannot
    /// overlap the batch before it on its GPU: a plan for a busy GPU leaves
    /// `d_ctrl + pull` before the GPU frees and starts when it frees (its pull
    /// runs while the GPU runs the batch before), and a plan for a GPU that
    /// frees sooner than the pull takes starts `max(0, pull - overlap)` after
    /// the GPU frees.
    #[test]
    fn the_pull_budget_delays_a_start_only_by_what_cannot_overlap_the_batch_before() {
        // l(b) = 1 ms * b + 5 ms; SLO 100 ms; eager (every batch at its
        // earliest start).
        let spec = ModelSpec {
            name: "m".into(),
            profile: LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(5), 64).unwrap(),
            slo: Dur::from_ms(100),
        };
        let mut cfg = DispatcherConfig::new(Policy::Eager, 1);
        cfg.net = NetBudget {
            ctrl: Dur::from_us(100),
            data_fixed: Dur::from_ms(1),
            data_per_req: Dur::from_us(500),
            resp: Dur::from_us(100),
            slack: Dur::ZERO,
            hold_fixed: Dur::ZERO,
            hold_per_req: Dur::ZERO,
        };
        let net = cfg.net;
        let mut d = Dispatcher::new(cfg, vec![spec]);
        let (mut out, mut now, mut id) = (Vec::new(), Time(1_000_000_000), 0u64);
        let mut req = |d: &mut Dispatcher, now: Time, out: &mut Vec<(Time, Plan)>| {
            id += 1;
            request(d, now, TaskId(id), Dur::from_ms(100), out);
        };
        // An idle GPU: nothing to overlap, the whole pull comes before the start.
        let t0 = now;
        req(&mut d, now, &mut out);
        assert_eq!(out.len(), 1);
        let (sent_a, a) = out[0].clone();
        assert_eq!(sent_a, t0);
        assert_eq!(a.exec_at, t0 + net.delay(1));
        // Four requests while A runs: their plan waits for the GPU and leaves
        // d_ctrl + pull(4) before A ends, so their pull runs during A and the
        // batch starts the moment A ends.
        run_to(&mut d, t0 + Dur::from_ms(2), &mut out, &mut now);
        for _ in 0..4 {
            req(&mut d, now, &mut out);
        }
        run_to(&mut d, a.finish_at + Dur::from_ms(1), &mut out, &mut now);
        assert_eq!(out.len(), 2, "{out:?}");
        let (sent_b, b) = out[1].clone();
        assert_eq!(b.tasks.len(), 4);
        assert_eq!(b.exec_at, a.finish_at, "B starts when A ends");
        assert_eq!(sent_b, a.finish_at - net.delay(4), "B's pull overlaps A");
        assert!(sent_b > a.exec_at, "B's pull runs while A runs");
        // One request 1 ms before B ends: 1 ms of its 1.6 ms pull overlaps B,
        // the other 0.6 ms delays its start past B's end.
        run_to(&mut d, b.finish_at - Dur::from_ms(1), &mut out, &mut now);
        req(&mut d, now, &mut out);
        assert_eq!(out.len(), 3, "{out:?}");
        let (sent_c, c) = out[2].clone();
        assert_eq!(sent_c, b.finish_at - Dur::from_ms(1));
        assert_eq!(c.exec_at, b.finish_at + (net.delay(1) - Dur::from_ms(1)));
    }

    /// Where pulls take longer than batches run, the GPU's puller sets its
    /// pace: a GPU takes its next batch no earlier than what the pull of the
    /// batch before holds the puller after that batch's start
    /// ([`NetBudget::hold`]), however soon the batch itself ends.
    #[test]
    fn a_gpu_takes_its_next_batch_a_pull_after_the_one_before_starts() {
        // l(b) = 0.1 ms * b + 1 ms; a pull holds the puller 1 ms per request
        // (1.5 ms budgeted); eager.
        let spec = ModelSpec {
            name: "m".into(),
            profile: LatencyProfile::linear(Dur::from_us(100), Dur::from_ms(1), 64).unwrap(),
            slo: Dur::from_ms(200),
        };
        let mut cfg = DispatcherConfig::new(Policy::Eager, 1);
        cfg.net = NetBudget {
            ctrl: Dur::from_us(100),
            data_fixed: Dur::ZERO,
            data_per_req: Dur::from_us(1500),
            resp: Dur::from_us(100),
            slack: Dur::ZERO,
            hold_fixed: Dur::from_us(200),
            hold_per_req: Dur::from_ms(1),
        };
        let net = cfg.net;
        let mut d = Dispatcher::new(cfg, vec![spec]);
        let (mut out, mut now, mut id) = (Vec::new(), Time(1_000_000_000), 0u64);
        let mut req = |d: &mut Dispatcher, now: Time, out: &mut Vec<(Time, Plan)>| {
            id += 1;
            request(d, now, TaskId(id), Dur::from_ms(200), out);
        };
        // Twice what the puller carries (one request per 0.5 ms, 1 ms of
        // pull each) for 200 ms.
        let t0 = now;
        for k in 0..400 {
            run_to(&mut d, t0 + Dur::from_us(500 * k), &mut out, &mut now);
            req(&mut d, now, &mut out);
        }
        run_to(&mut d, t0 + Dur::from_ms(600), &mut out, &mut now);
        assert!(out.len() >= 10, "{} plans", out.len());
        let mut bound = 0;
        for w in out.windows(2) {
            let (x, y) = (&w[0].1, &w[1].1);
            let held = x.exec_at + net.hold(x.tasks.len() as u32);
            assert!(
                y.exec_at >= held.max(x.finish_at),
                "a batch at {:?} before the one at {:?} let the GPU go at {:?}",
                y.exec_at,
                x.exec_at,
                held.max(x.finish_at)
            );
            bound += (held > x.finish_at) as usize;
        }
        // The puller, not the GPU, bounds the starts.
        assert!(bound * 2 >= out.len(), "{bound} of {} starts", out.len());
    }
}
