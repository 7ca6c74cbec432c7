//! The discrete-event simulator: runs a scheduling core in virtual time with emulated
//! GPUs that take exactly l(b) (optionally with jitter), network delays, arrival
//! processes, popularity and rate traces. One seed reproduces a run.
//!
//! The simulator drives the production core (the same [`Dispatcher`] the real-time
//! runtime uses), never a copy of it.

pub use crate::arrivals;
pub mod apps;
pub mod churn;
pub mod cluster;
pub mod served;
pub mod tc;

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

impl<'w> Engine<'w> {
    /// An engine for `w`'s GPUs counting the window [`win_start`, `win_end`),
    /// without execution jitter.
    fn new(w: &'w Workload, opt: &RunOptions, win_start: Time, win_end: Time) -> Engine<'w> {
        let gpus = w.gpus as usize;
        Engine {
            w,
            opt: opt.clone(),
            win_start,
            win_end,
            models: w
                .models
                .iter()
                .map(|m| ModelResult::new(&m.spec.name))
                .collect(),
            gpu_free: vec![Time::EPOCH_MIN; gpus],
            gpu_busy_ns: vec![0; gpus],
            inflight: vec![VecDeque::new(); gpus],
            completions: BinaryHeap::new(),
            jitter: None,
            state: Vec::new(),
            plans: Vec::new(),
            ended: 0,
            preemptions: 0,
        }
    }

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
    let mut e = Engine::new(w, opt, win_start, win_end);
    e.jitter = (w.exec_jitter > 0.0).then(|| {
        (
            Normal::new(1.0, w.exec_jitter).expect("valid jitter"),
            Xoshiro256PlusPlus::seed_from_u64(opt.seed ^ 0x5151),
        )
    });
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
/// dispatcher starts with `start_gpus`; every `interval` the signals over the
/// last `epoch` (the idle fraction and the bad rate since the GPUs last
/// changed, as the scheduler keeps them; the load's demand and its trend)
/// give the advice ([`crate::plan::autoscale::advise`]), and the same
/// [`crate::plan::autoscale::Controller`] that `fermata autoscale` runs
/// decides: added GPUs enter the core after `provisioning`; released ones (the
/// highest ids) leave it at once and finish what they run. One record per
/// `epoch`.
#[derive(Debug, Clone)]
pub struct AutoscaleSimOpts {
    pub start_gpus: u32,
    pub controller: crate::plan::autoscale::ControllerConfig,
    pub advice: crate::plan::autoscale::AdviceConfig,
    /// The signals' window and the records' span.
    pub epoch: Dur,
    /// How often the loop decides (at most `epoch`; `epoch` a multiple of it).
    pub interval: Dur,
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
    /// GPUs in the core at the epoch's end (after its decisions).
    pub gpus: u32,
    /// GPUs in the core over the epoch, time-averaged: the GPUs that served
    /// its load (an add arrives after the provisioning delay, a release acts
    /// at once).
    pub gpus_mean: f64,
    /// The most GPUs in the core at any moment of the epoch.
    pub gpus_max: u32,
    /// The load's demand in GPUs ([`crate::plan::autoscale::demand_gpus`]),
    /// averaged over the loop's decisions in the epoch.
    pub demand_gpus: f64,
    /// Requests that ended in the epoch, and the bad ones among them.
    pub ended: u64,
    pub bad: u64,
    /// Idle share of the GPU time in service over the epoch.
    pub idle_fraction: f64,
    /// The GPUs the loop launched and drained in the epoch ("add K",
    /// "release D", both, or "hold").
    pub decision: String,
}

/// Counters of an autoscaled run at one of the loop's ticks.
#[derive(Clone)]
struct Snap {
    t: Time,
    bad: u64,
    ended: u64,
    offered: Vec<u64>,
    busy: Vec<i64>,
}

/// Runs `w` (the central dispatcher; `opt.rate_rps` times the trace) with the
/// autoscaling loop; every request still ends exactly once.
pub fn simulate_autoscaled(
    w: &Workload,
    opt: &RunOptions,
    a: &AutoscaleSimOpts,
) -> Vec<EpochRecord> {
    use crate::plan::autoscale::{
        advise, Controller, Decision, DemandTrend, GpuOwner, Signals, DEMAND_WINDOW_S,
        SIGNAL_WINDOW_S, TREND_SPAN_S,
    };
    let mut ww = w.clone();
    ww.gpus = a.start_gpus.max(1);
    let mut core = Dispatcher::new(dispatcher_config(&ww, opt.policy, opt.check), ww.specs());
    let end = Time::ZERO + opt.warmup + opt.duration;
    let mut arrivals = arrivals::MergedArrivals::new(
        arrivals::model_gens(&ww, opt.arrival, opt.rate_rps, opt.seed, Some(&a.trace)),
        end,
    );
    let mut e = Engine::new(&ww, opt, Time::ZERO, end + Dur::from_secs_f64(3600.0));
    let interval = Dur(a.interval.0.clamp(1, a.epoch.0.max(1)));
    let per_epoch = (a.epoch.0 / interval.0).max(1);
    let window = Dur(interval.0 * per_epoch);
    let mut active: Vec<u32> = (0..ww.gpus).collect();
    let mut pending_adds: Vec<Time> = Vec::new();
    let mut ctl = Controller::new(a.controller.clone()).expect("valid controller settings");
    let mut ticks: i64 = 0;
    let mut next_tick = Time::ZERO + interval;
    let mut out = Vec::new();
    let mut trend = DemandTrend::default();
    let mut next_id: u64 = 0;
    let mut clock = Time::EPOCH_MIN;
    let snap = |e: &Engine, t: Time| Snap {
        t,
        bad: e.models.iter().map(|m| m.late + m.dropped).sum(),
        ended: e.models.iter().map(|m| m.good + m.late + m.dropped).sum(),
        offered: e.models.iter().map(|m| m.offered).collect(),
        busy: e.gpu_busy_ns.clone(),
    };
    // A GPU added after a snapshot was not busy before it.
    let busy_at = |s: &Snap, g: usize| s.busy.get(g).copied().unwrap_or(0);
    // The loop's snapshots over the last window, the epoch's start, and when
    // the GPUs in service last changed (the bad rate and the idle fraction
    // start over then, as in the scheduler).
    let mut snaps: VecDeque<Snap> = VecDeque::from([snap(&e, Time::ZERO)]);
    let mut epoch_start = snap(&e, Time::ZERO);
    let mut changed = Time::ZERO;
    // GPUs launched and drained in the epoch.
    let (mut launched, mut drained) = (0u32, 0usize);
    // GPU-nanoseconds in service since the epoch started, up to `gpus_since`.
    let (mut gpu_ns, mut gpus_since) = (0u128, Time::ZERO);
    let mut gpus_max = active.len() as u32;
    let mut demand_sum = 0.0;
    loop {
        let ta = arrivals.peek().map(|(_, t)| t).unwrap_or(Time::NEVER);
        let tc = core.next_timeout().unwrap_or(Time::NEVER);
        let td = e.completions.peek().map(|r| r.0 .0).unwrap_or(Time::NEVER);
        let tp = pending_adds.iter().copied().min().unwrap_or(Time::NEVER);
        let te = if next_tick <= end {
            next_tick
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
            gpu_ns += active.len() as u128 * (now - gpus_since).0.max(0) as u128;
            gpus_since = now;
            // GPU ids are never reused (an add takes the next one), so the
            // engine's per-GPU tables grow with the adds.
            for _ in 0..due {
                let id = core.add_gpu();
                if e.gpu_free.len() <= id.0 as usize {
                    e.gpu_free.resize(id.0 as usize + 1, Time::EPOCH_MIN);
                    e.gpu_busy_ns.resize(id.0 as usize + 1, 0);
                    e.inflight.resize(id.0 as usize + 1, VecDeque::new());
                }
                active.push(id.0);
                changed = now;
            }
            gpus_max = gpus_max.max(active.len() as u32);
        } else if te == next {
            ticks += 1;
            next_tick += interval;
            gpu_ns += active.len() as u128 * (now - gpus_since).0.max(0) as u128;
            gpus_since = now;
            let cur = snap(&e, now);
            // The first snapshot at or after `from`.
            let base = |from: Time| snaps.iter().find(|s| s.t >= from).unwrap_or(&cur);
            // The demand and its trend over the spans the scheduler uses,
            // scaled from its signal window to this one.
            let scale = window.as_secs_f64() / SIGNAL_WINDOW_S;
            let d0 = base(now - Dur::from_secs_f64(DEMAND_WINDOW_S * scale));
            let dspan = (now - d0.t).as_secs_f64();
            let demand =
                crate::plan::autoscale::demand_gpus(ww.models.iter().enumerate().map(|(m, x)| {
                    let rate = if dspan > 0.0 {
                        cur.offered[m].saturating_sub(d0.offered[m]) as f64 / dspan
                    } else {
                        0.0
                    };
                    (rate, &x.spec.profile, x.spec.slo)
                }));
            let rise = trend.push(now.as_secs_f64(), demand, TREND_SPAN_S * scale);
            demand_sum += demand;
            // The bad rate and the idle fraction over the window, since the
            // GPUs last changed.
            let s0 = base((now - window).max(changed));
            let span = (now - s0.t).as_secs_f64();
            let n = active.len() as u32;
            let busy: f64 = active
                .iter()
                .map(|&g| (cur.busy[g as usize] - busy_at(s0, g as usize)) as f64 / 1e9)
                .sum();
            let (tasks, bad) = (cur.ended - s0.ended, cur.bad - s0.bad);
            let idle = if n == 0 || span <= 0.0 {
                0.0
            } else {
                (1.0 - busy / (n as f64 * span)).clamp(0.0, 1.0)
            };
            let sig = Signals {
                demand_gpus: Some(demand),
                demand_rise_per_s: rise,
                demand_window_s: dspan,
                ..Signals::new(span, n, idle, tasks, bad)
            };
            let owners: Vec<GpuOwner> = active
                .iter()
                .map(|&g| GpuOwner {
                    gpu: g,
                    node: g as u64,
                    name: format!("gpu{g}"),
                    device: 0,
                    lanes: 1,
                })
                .collect();
            let advice = advise(&sig, &owners, &a.advice);
            // Backends = GPUs here; those being added count as starting.
            let backends: Vec<u64> = active.iter().map(|&g| g as u64).collect();
            let t_s = (now - Time::ZERO).as_secs_f64();
            match ctl.step(t_s, &advice, &backends) {
                Decision::Launch(k) => {
                    for _ in 0..k {
                        pending_adds.push(now + a.provisioning);
                    }
                    launched += k;
                }
                Decision::Drain(list) => {
                    for (g, _) in &list {
                        core.remove_gpu(now, GpuId(*g as u32));
                        active.retain(|x| *x as u64 != *g);
                    }
                    changed = now;
                    drained += list.len();
                }
                Decision::Hold(_) => {}
            }
            snaps.push_back(cur);
            while snaps.len() > 1 && snaps[0].t < now - window {
                snaps.pop_front();
            }
            if ticks % per_epoch == 0 {
                let cur = snaps.back().expect("just pushed");
                let secs = (now - epoch_start.t).as_secs_f64();
                let busy: i64 = (0..cur.busy.len())
                    .map(|g| cur.busy[g] - busy_at(&epoch_start, g))
                    .sum();
                let offered: u64 =
                    cur.offered.iter().sum::<u64>() - epoch_start.offered.iter().sum::<u64>();
                out.push(EpochRecord {
                    t_s,
                    offered_rps: offered as f64 / secs,
                    gpus: active.len() as u32,
                    gpus_mean: gpu_ns as f64 / (now - epoch_start.t).0 as f64,
                    gpus_max,
                    demand_gpus: demand_sum / per_epoch as f64,
                    ended: cur.ended - epoch_start.ended,
                    bad: cur.bad - epoch_start.bad,
                    idle_fraction: if gpu_ns == 0 {
                        0.0
                    } else {
                        (1.0 - busy as f64 / gpu_ns as f64).clamp(0.0, 1.0)
                    },
                    decision: match (launched, drained) {
                        (0, 0) => "hold".into(),
                        (k, 0) => format!("add {k}"),
                        (0, d) => format!("release {d}"),
                        (k, d) => format!("add {k}, release {d}"),
                    },
                });
                (launched, drained) = (0, 0);
                gpus_max = active.len() as u32;
                demand_sum = 0.0;
                gpu_ns = 0;
                epoch_start = cur.clone();
            }
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
