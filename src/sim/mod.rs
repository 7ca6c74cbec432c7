//! The discrete-event simulator: runs a scheduling core in virtual time with emulated
//! GPUs that take exactly l(b) (optionally with jitter), network delays, arrival
//! processes, popularity and rate traces. One seed reproduces a run.
//!
//! The simulator drives the production core (the same [`Dispatcher`] the real-time
//! runtime uses), never a copy of it.

pub mod arrivals;
pub mod cluster;

use crate::core::nexus::NexusCore;
use crate::core::{
    Dispatcher, DispatcherConfig, Dur, GpuId, ModelId, Output, Plan, PlanId, Policy, Scheduler,
    Task, TaskId, Time,
};
use crate::workload::{Arrival, Workload};
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Options of one simulation run (the workload gives the rest).
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub policy: Policy,
    pub rate_rps: f64,
    pub arrival: Arrival,
    pub seed: u64,
    pub warmup: Dur,
    pub duration: Dur,
    /// Check the core's and the simulator's invariants after every event.
    pub check: bool,
    /// Keep every dispatched plan (for traces and tests).
    pub record_plans: bool,
}

impl SimOptions {
    pub fn from_workload(w: &Workload) -> SimOptions {
        SimOptions {
            policy: w.policy,
            rate_rps: w.rate_rps,
            arrival: w.arrival,
            seed: w.seed,
            warmup: w.warmup,
            duration: w.duration,
            check: true,
            record_plans: false,
        }
    }
}

/// One dispatched plan as the simulator saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRecord {
    pub plan: PlanId,
    pub model: ModelId,
    pub gpu: GpuId,
    /// When the scheduler sent it.
    pub sent_at: Time,
    pub exec_at: Time,
    pub tasks: Vec<TaskId>,
    /// Set when Shepherd preempted it.
    pub preempted: bool,
}

/// Per-model results over the measured window.
#[derive(Debug, Clone)]
pub struct ModelResult {
    pub name: String,
    /// Requests that arrived in the measured window.
    pub offered: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    /// `batch_requests[b]`: requests that ran in a batch of size b (b >= 1).
    pub batch_requests: Vec<u64>,
    /// Arrival to batch start, in microseconds.
    pub queuing_us: Histogram<u64>,
}

impl ModelResult {
    /// No requests yet.
    pub fn new(name: &str) -> ModelResult {
        ModelResult {
            name: name.to_string(),
            offered: 0,
            good: 0,
            late: 0,
            dropped: 0,
            batch_requests: Vec::new(),
            queuing_us: new_hist(),
        }
    }

    pub fn bad(&self) -> u64 {
        self.late + self.dropped
    }
    pub fn bad_rate(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            self.bad() as f64 / self.offered as f64
        }
    }
    /// The batch size at quantile `q` over requests.
    pub fn batch_quantile(&self, q: f64) -> u32 {
        quantile_of_counts(&self.batch_requests, q)
    }
}

/// The `q` quantile of a histogram given as counts per value.
pub fn quantile_of_counts(counts: &[u64], q: f64) -> u32 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    let target = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut acc = 0;
    for (b, c) in counts.iter().enumerate() {
        acc += c;
        if acc >= target {
            return b as u32;
        }
    }
    (counts.len() - 1) as u32
}

/// Results of one run.
#[derive(Debug, Clone)]
pub struct SimResult {
    pub policy: Policy,
    pub rate_rps: f64,
    pub models: Vec<ModelResult>,
    /// Busy fraction of each GPU over the measured window.
    pub gpu_busy: Vec<f64>,
    /// All requests simulated (warm-up and drain included).
    pub sim_requests: u64,
    pub wall_secs: f64,
    pub plans: Vec<PlanRecord>,
    pub preemptions: u64,
    pub window: Dur,
}

impl SimResult {
    pub fn offered(&self) -> u64 {
        self.models.iter().map(|m| m.offered).sum()
    }
    pub fn good(&self) -> u64 {
        self.models.iter().map(|m| m.good).sum()
    }
    pub fn bad_rate(&self) -> f64 {
        let o = self.offered();
        if o == 0 {
            0.0
        } else {
            (o - self.good()) as f64 / o as f64
        }
    }
    /// The worst model's bad rate (goodput requires every model <= 1%).
    pub fn max_model_bad_rate(&self) -> f64 {
        self.models.iter().map(|m| m.bad_rate()).fold(0.0, f64::max)
    }
    pub fn goodput_rps(&self) -> f64 {
        self.good() as f64 / self.window.as_secs_f64()
    }
    pub fn gpu_busy_fraction(&self) -> f64 {
        if self.gpu_busy.is_empty() {
            0.0
        } else {
            self.gpu_busy.iter().sum::<f64>() / self.gpu_busy.len() as f64
        }
    }
    pub fn batch_requests(&self) -> Vec<u64> {
        let n = self
            .models
            .iter()
            .map(|m| m.batch_requests.len())
            .max()
            .unwrap_or(0);
        let mut v = vec![0; n];
        for m in &self.models {
            for (b, c) in m.batch_requests.iter().enumerate() {
                v[b] += c;
            }
        }
        v
    }
    pub fn queuing_us(&self) -> Histogram<u64> {
        let mut h = new_hist();
        for m in &self.models {
            h.add(&m.queuing_us).expect("same bounds");
        }
        h
    }
    pub fn sim_requests_per_sec(&self) -> f64 {
        self.sim_requests as f64 / self.wall_secs.max(1e-9)
    }
}

pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

#[derive(Debug, Clone)]
struct InFlight {
    plan: PlanId,
    model: ModelId,
    start: Time,
    finish: Time,
    tasks: Vec<Task>,
}

/// The outcome state of each request, to check that each ends exactly once.
const PENDING: u8 = 0;
const ENDED: u8 = 1;

struct Engine<'w> {
    w: &'w Workload,
    opt: SimOptions,
    win_start: Time,
    win_end: Time,
    models: Vec<ModelResult>,
    gpu_free: Vec<Time>,
    gpu_busy_ns: Vec<i64>,
    inflight: Vec<VecDeque<InFlight>>,
    completions: BinaryHeap<Reverse<(Time, u32, u64)>>,
    jitter: Option<(Normal<f64>, Xoshiro256PlusPlus)>,
    state: Vec<u8>,
    plans: Vec<PlanRecord>,
    ended: u64,
    preemptions: u64,
}

impl Engine<'_> {
    fn end_task(&mut self, t: &Task) {
        if self.opt.check {
            let s = &mut self.state[t.id.0 as usize];
            assert_eq!(*s, PENDING, "request {} ended twice", t.id.0);
            *s = ENDED;
        }
        self.ended += 1;
    }

    #[inline]
    fn in_window(&self, t: &Task) -> bool {
        t.arrival >= self.win_start && t.arrival < self.win_end
    }

    fn busy(&mut self, g: usize, from: Time, to: Time) {
        let a = from.max(self.win_start);
        let b = to.min(self.win_end);
        if b > a {
            self.gpu_busy_ns[g] += (b - a).0;
        }
    }

    fn on_output(&mut self, now: Time, out: Output) {
        match out {
            Output::Dispatch(p) => self.on_plan(now, p),
            Output::Drop { model, task, .. } => {
                self.end_task(&task);
                if self.in_window(&task) {
                    self.models[model.idx()].dropped += 1;
                }
            }
            Output::Preempt { gpu, plan, .. } => {
                self.preemptions += 1;
                let g = gpu.idx();
                if let Some(pos) = self.inflight[g].iter().position(|f| f.plan == plan) {
                    let f = self.inflight[g].remove(pos).expect("present");
                    if f.start < now {
                        self.busy(g, f.start, now);
                    }
                    // Later plans on this GPU were booked after it; they start on time.
                    self.gpu_free[g] = self.inflight[g].back().map_or(now, |x| x.finish);
                }
                if let Some(r) = self.plans.iter_mut().rev().find(|r| r.plan == plan) {
                    r.preempted = true;
                }
            }
        }
    }

    fn on_plan(&mut self, now: Time, p: Plan) {
        let g = p.gpu.idx();
        let bs = p.tasks.len() as u32;
        let spec = &self.w.models[p.model.idx()].spec;
        // The plan reaches the backend and its inputs are pulled; then it waits for
        // its exec time and for the GPU.
        let ready = now + self.w.net.delay(bs);
        let start = p.exec_at.max(ready).max(self.gpu_free[g]);
        let mut dur = spec.profile.latency(bs);
        if let Some((n, rng)) = &mut self.jitter {
            let f = n.sample(rng).clamp(0.5, 2.0);
            dur = Dur((dur.0 as f64 * f) as i64);
        }
        let finish = start + dur;
        self.gpu_free[g] = finish;
        if self.opt.record_plans {
            self.plans.push(PlanRecord {
                plan: p.id,
                model: p.model,
                gpu: p.gpu,
                sent_at: now,
                exec_at: start,
                tasks: p.tasks.iter().map(|t| t.id).collect(),
                preempted: false,
            });
        }
        self.completions.push(Reverse((finish, g as u32, p.id.0)));
        self.inflight[g].push_back(InFlight {
            plan: p.id,
            model: p.model,
            start,
            finish,
            tasks: p.tasks,
        });
    }

    fn on_completion<S: Scheduler>(&mut self, now: Time, g: usize, plan: PlanId, core: &mut S) {
        let Some(pos) = self.inflight[g].iter().position(|f| f.plan == plan) else {
            return; // preempted
        };
        let f = self.inflight[g].remove(pos).expect("present");
        debug_assert_eq!(f.finish, now);
        self.busy(g, f.start, f.finish);
        let bs = f.tasks.len();
        let resp = self.w.net.resp;
        let mi = f.model.idx();
        for t in &f.tasks {
            self.end_task(t);
            if self.in_window(t) {
                let m = &mut self.models[mi];
                if f.finish + resp <= t.deadline {
                    m.good += 1;
                } else {
                    m.late += 1;
                }
                if m.batch_requests.len() <= bs {
                    m.batch_requests.resize(bs + 1, 0);
                }
                m.batch_requests[bs] += 1;
                let q = (f.start - t.arrival).as_us_f64().max(1.0) as u64;
                m.queuing_us.saturating_record(q);
            }
        }
        if self.jitter.is_some() {
            core.handle_gpu_report(now, GpuId(g as u32), plan, now);
        }
    }
}

/// Builds the scheduling core for a policy.
pub enum AnyCore {
    Central(Box<Dispatcher>),
    Nexus(Box<NexusCore>),
}

impl AnyCore {
    pub fn new(w: &Workload, policy: Policy, rate_rps: f64, check: bool) -> AnyCore {
        if policy == Policy::Nexus {
            let rates: Vec<f64> = w.models.iter().map(|m| m.share * rate_rps).collect();
            AnyCore::Nexus(Box::new(NexusCore::new(
                w.specs(),
                &rates,
                w.gpus,
                w.frontends,
                w.net,
            )))
        } else {
            AnyCore::Central(Box::new(Dispatcher::new(
                dispatcher_config(w, policy, check),
                w.specs(),
            )))
        }
    }
}

/// The central dispatcher's configuration for a workload and policy (the simulator
/// and the real-time runtime build it the same way).
pub fn dispatcher_config(w: &Workload, policy: Policy, check: bool) -> DispatcherConfig {
    w.dispatcher_config(policy, check)
}

/// Runs one simulation.
pub fn simulate(w: &Workload, opt: &SimOptions) -> SimResult {
    match AnyCore::new(w, opt.policy, opt.rate_rps, opt.check) {
        AnyCore::Central(mut d) => run(w, opt, d.as_mut()),
        AnyCore::Nexus(mut n) => run(w, opt, n.as_mut()),
    }
}

/// Runs a simulation on any core.
pub fn run<S: Scheduler>(w: &Workload, opt: &SimOptions, core: &mut S) -> SimResult {
    let wall = std::time::Instant::now();
    let win_start = Time::ZERO + opt.warmup;
    let win_end = win_start + opt.duration;
    let mut arrivals = arrivals::MergedArrivals::new(
        arrivals::model_gens(w, opt.arrival, opt.rate_rps, opt.seed, None),
        win_end,
    );
    let mut e = Engine {
        w,
        opt: opt.clone(),
        win_start,
        win_end,
        models: w
            .models
            .iter()
            .map(|m| ModelResult::new(&m.spec.name))
            .collect(),
        gpu_free: vec![Time::EPOCH_MIN; w.gpus as usize],
        gpu_busy_ns: vec![0; w.gpus as usize],
        inflight: vec![VecDeque::new(); w.gpus as usize],
        completions: BinaryHeap::new(),
        jitter: (w.exec_jitter > 0.0).then(|| {
            (
                Normal::new(1.0, w.exec_jitter).expect("valid jitter"),
                Xoshiro256PlusPlus::seed_from_u64(opt.seed ^ 0x5151),
            )
        }),
        state: Vec::new(),
        plans: Vec::new(),
        ended: 0,
        preemptions: 0,
    };
    let mut next_id: u64 = 0;
    let mut clock = Time::EPOCH_MIN;
    let frontends = w.frontends.max(1) as u64;
    loop {
        let ta = arrivals.peek().map(|(_, t)| t).unwrap_or(Time::NEVER);
        let tc = core.next_timeout().unwrap_or(Time::NEVER);
        let td = e.completions.peek().map(|r| r.0 .0).unwrap_or(Time::NEVER);
        let next = ta.min(tc).min(td);
        if next == Time::NEVER {
            break;
        }
        // A timer may be due in the past (e.g. a GPU that has long been free).
        let now = next.max(clock);
        clock = now;
        if td == next {
            let Reverse((t, g, p)) = e.completions.pop().expect("peeked");
            e.on_completion(t, g as usize, PlanId(p), core);
        } else if tc == next {
            core.handle_timeout(now);
        } else {
            let (m, t) = arrivals.pop().expect("peeked");
            let spec = &w.models[m].spec;
            let task = Task {
                id: TaskId(next_id),
                arrival: t,
                deadline: t + spec.slo,
                tag: 0,
            };
            if opt.check {
                e.state.push(PENDING);
            }
            if t >= win_start {
                e.models[m].offered += 1;
            }
            let fe = (next_id % frontends) as u32;
            next_id += 1;
            core.handle_request(t, ModelId(m as u32), task, fe);
        }
        while let Some(out) = core.poll_output() {
            e.on_output(now, out);
        }
    }
    assert_eq!(
        e.ended, next_id,
        "every request ends exactly once ({} of {} ended)",
        e.ended, next_id
    );
    let window_ns = opt.duration.0 as f64;
    SimResult {
        policy: opt.policy,
        rate_rps: opt.rate_rps,
        gpu_busy: e
            .gpu_busy_ns
            .iter()
            .map(|&b| b as f64 / window_ns)
            .collect(),
        models: e.models,
        sim_requests: next_id,
        wall_secs: wall.elapsed().as_secs_f64(),
        plans: e.plans,
        preemptions: e.preemptions,
        window: opt.duration,
    }
}
