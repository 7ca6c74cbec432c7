//! The discrete-event simulator: runs a scheduling core in virtual time with emulated
//! GPUs that take exactly l(b) (optionally with jitter), network delays, arrival
//! processes, popularity and rate traces. One seed reproduces a run.
//!
//! The simulator drives the production core (the same [`Dispatcher`] the real-time
//! runtime uses), never a copy of it.

pub use crate::arrivals;
pub mod cluster;

pub use crate::run::{
    new_hist, quantile_of_counts, ModelResult, PlanRecord, RunOptions, RunResult,
};

use crate::core::nexus::NexusCore;
use crate::core::{
    Dispatcher, DispatcherConfig, Dur, GpuId, ModelId, Output, Plan, PlanId, Policy, Scheduler,
    Task, TaskId, Time,
};
use crate::workload::Workload;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

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
    opt: RunOptions,
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
pub fn simulate(w: &Workload, opt: &RunOptions) -> RunResult {
    match AnyCore::new(w, opt.policy, opt.rate_rps, opt.check) {
        AnyCore::Central(mut d) => run(w, opt, d.as_mut()),
        AnyCore::Nexus(mut n) => run(w, opt, n.as_mut()),
    }
}

/// Runs a simulation on any core.
pub fn run<S: Scheduler>(w: &Workload, opt: &RunOptions, core: &mut S) -> RunResult {
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
                cap: 0,
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
    RunResult {
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
