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

    /// A request of model `m` arriving at `t` with task id `id` (counted
    /// offered from the window's start on).
    fn arrive(&mut self, m: usize, t: Time, id: u64) -> Task {
        let task = Task {
            id: TaskId(id),
            arrival: t,
            deadline: t + self.w.models[m].spec.slo,
            tag: 0,
            cap: 0,
        };
        if self.opt.check {
            self.state.push(PENDING);
        }
        if t >= self.win_start {
            self.models[m].offered += 1;
        }
        task
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
            let task = e.arrive(m, t, next_id);
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

/// The autoscaling loop in virtual time (paper Fig. 15): the central
/// dispatcher starts with `start_gpus`; every `epoch` the GPUs' idle fraction and
/// the bad rate over the epoch give the advice ([`crate::plan::autoscale::advise`]),
/// and the same [`crate::plan::autoscale::Controller`] that `fermata autoscale`
/// runs decides: added GPUs enter the core after `provisioning`; released ones
/// (the highest ids) leave it at once and finish what they run.
#[derive(Debug, Clone)]
pub struct AutoscaleSimOpts {
    pub start_gpus: u32,
    pub controller: crate::plan::autoscale::ControllerConfig,
    pub advice: crate::plan::autoscale::AdviceConfig,
    pub epoch: Dur,
    pub provisioning: Dur,
    /// The aggregate rate's multiplier over time: (from, multiplier), sorted.
    pub trace: Vec<(Dur, f64)>,
}

/// One epoch of an autoscaled run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EpochRecord {
    pub t_s: f64,
    /// Requests that arrived in the epoch, per second.
    pub offered_rps: f64,
    /// GPUs in the core at the epoch's end.
    pub gpus: u32,
    /// Requests that ended in the epoch, and the bad ones among them.
    pub ended: u64,
    pub bad: u64,
    pub idle_fraction: f64,
    pub decision: String,
}

/// Runs `w` (the central dispatcher; `opt.rate_rps` times the trace) with the
/// autoscaling loop; every request still ends exactly once.
pub fn simulate_autoscaled(
    w: &Workload,
    opt: &RunOptions,
    a: &AutoscaleSimOpts,
) -> Vec<EpochRecord> {
    use crate::plan::autoscale::{advise, Controller, Decision, GpuOwner, Signals};
    let mut ww = w.clone();
    ww.gpus = a.start_gpus.max(1);
    let mut core = Dispatcher::new(dispatcher_config(&ww, opt.policy, opt.check), ww.specs());
    let max_ids = (a.controller.max_backends as usize * 8).max(64);
    let end = Time::ZERO + opt.warmup + opt.duration;
    let mut arrivals = arrivals::MergedArrivals::new(
        arrivals::model_gens(&ww, opt.arrival, opt.rate_rps, opt.seed, Some(&a.trace)),
        end,
    );
    let mut e = Engine {
        w: &ww,
        opt: opt.clone(),
        win_start: Time::ZERO,
        win_end: end + Dur::from_secs_f64(3600.0),
        models: ww
            .models
            .iter()
            .map(|m| ModelResult::new(&m.spec.name))
            .collect(),
        gpu_free: vec![Time::EPOCH_MIN; max_ids],
        gpu_busy_ns: vec![0; max_ids],
        inflight: vec![VecDeque::new(); max_ids],
        completions: BinaryHeap::new(),
        jitter: None,
        state: Vec::new(),
        plans: Vec::new(),
        ended: 0,
        preemptions: 0,
    };
    let mut active: Vec<u32> = (0..ww.gpus).collect();
    let mut pending_adds: Vec<Time> = Vec::new();
    let mut ctl = Controller::new(a.controller.clone()).expect("valid controller settings");
    let mut next_epoch = Time::ZERO + a.epoch;
    let (mut last_busy, mut last_bad, mut last_ended, mut last_offered) =
        (vec![0i64; max_ids], 0u64, 0u64, 0u64);
    let mut out = Vec::new();
    let mut last_model_offered = vec![0u64; ww.models.len()];
    let mut last_demand: Option<f64> = None;
    let mut next_id: u64 = 0;
    let mut clock = Time::EPOCH_MIN;
    let totals = |e: &Engine| {
        let bad: u64 = e.models.iter().map(|m| m.late + m.dropped).sum();
        let ended: u64 = e.models.iter().map(|m| m.good + m.late + m.dropped).sum();
        let offered: u64 = e.models.iter().map(|m| m.offered).sum();
        (bad, ended, offered)
    };
    loop {
        let ta = arrivals.peek().map(|(_, t)| t).unwrap_or(Time::NEVER);
        let tc = core.next_timeout().unwrap_or(Time::NEVER);
        let td = e.completions.peek().map(|r| r.0 .0).unwrap_or(Time::NEVER);
        let tp = pending_adds.iter().copied().min().unwrap_or(Time::NEVER);
        let te = if next_epoch <= end {
            next_epoch
        } else {
            Time::NEVER
        };
        let next = ta.min(tc).min(td).min(tp).min(te);
        if next == Time::NEVER {
            break;
        }
        let now = next.max(clock);
        clock = now;
        if td == next {
            let Reverse((t, g, p)) = e.completions.pop().expect("peeked");
            e.on_completion(t, g as usize, PlanId(p), &mut core);
        } else if tp == next {
            let due = pending_adds.iter().filter(|&&t| t == tp).count();
            pending_adds.retain(|&t| t != tp);
            for _ in 0..due {
                if core.num_gpus() < max_ids {
                    let id = core.add_gpu();
                    active.push(id.0);
                }
            }
        } else if te == next {
            next_epoch += a.epoch;
            let span = a.epoch.as_secs_f64();
            let (bad, ended, offered) = totals(&e);
            let (db, de, doff) = (bad - last_bad, ended - last_ended, offered - last_offered);
            (last_bad, last_ended, last_offered) = (bad, ended, offered);
            let busy: f64 = active
                .iter()
                .map(|&g| {
                    (e.gpu_busy_ns[g as usize] - last_busy[g as usize]) as f64 / a.epoch.0 as f64
                })
                .map(|b| b.clamp(0.0, 1.0))
                .sum();
            last_busy.copy_from_slice(&e.gpu_busy_ns);
            let n = active.len() as u32;
            let offered_now: Vec<u64> = e.models.iter().map(|m| m.offered).collect();
            let demand =
                crate::plan::autoscale::demand_gpus(ww.models.iter().enumerate().map(|(m, x)| {
                    let rate = offered_now[m].saturating_sub(last_model_offered[m]) as f64 / span;
                    (rate, &x.spec.profile, x.spec.slo)
                }));
            last_model_offered = offered_now;
            let rise = (demand - last_demand.unwrap_or(demand)).max(0.0) / span;
            last_demand = Some(demand);
            let sig = Signals {
                demand_gpus: Some(demand),
                demand_rise_per_s: rise,
                window_s: span,
                gpus: n,
                idle_fraction: if n == 0 { 0.0 } else { 1.0 - busy / n as f64 },
                tasks: de,
                bad: db,
                bad_rate: if de == 0 { 0.0 } else { db as f64 / de as f64 },
            };
            let owners: Vec<GpuOwner> = active
                .iter()
                .map(|&g| GpuOwner {
                    gpu: g,
                    node: g as u64,
                    name: format!("gpu{g}"),
                })
                .collect();
            let advice = advise(&sig, &owners, &a.advice);
            // Backends = GPUs here; those being added count as starting.
            let backends: Vec<u64> = active.iter().map(|&g| g as u64).collect();
            let t_s = (now - Time::ZERO).as_secs_f64();
            let decision = ctl.step(t_s, &advice, &backends);
            let what = match &decision {
                Decision::Launch(k) => {
                    for _ in 0..*k {
                        pending_adds.push(now + a.provisioning);
                    }
                    format!("add {k}")
                }
                Decision::Drain(list) => {
                    for (g, _) in list {
                        core.remove_gpu(now, GpuId(*g as u32));
                        active.retain(|x| *x as u64 != *g);
                    }
                    format!("release {}", list.len())
                }
                Decision::Hold(_) => "hold".to_string(),
            };
            out.push(EpochRecord {
                t_s,
                offered_rps: doff as f64 / span,
                gpus: active.len() as u32,
                ended: de,
                bad: db,
                idle_fraction: sig.idle_fraction,
                decision: what,
            });
        } else if tc == next {
            core.handle_timeout(now);
        } else {
            let (m, t) = arrivals.pop().expect("peeked");
            let task = e.arrive(m, t, next_id);
            next_id += 1;
            core.handle_request(t, ModelId(m as u32), task);
        }
        while let Some(o) = core.poll_output() {
            e.on_output(now, o);
        }
    }
    assert_eq!(e.ended, next_id, "every request ends exactly once");
    out
}
