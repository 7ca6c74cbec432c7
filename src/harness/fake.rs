//! In-process fakes around the real-time scheduler: frontends that generate load from
//! the same workload files and arrival processes as the simulator, and backends that
//! run each plan on an emulated GPU and check that no two plans overlap on a GPU.
//!
//! [`run_realtime`] runs one workload at one rate in real time and returns the same
//! [`RunResult`] the simulator returns (so the goodput search and reports are shared),
//! plus the runtime's own measurements.
//!
//! Every request ends exactly once, as good, late, dropped or failed; the [`Ledger`]
//! checks it (one flag per request id, set once).

use crate::arrivals::{model_gens, MergedArrivals};
use crate::core::{DropReason, Dur, ModelId, Outcome, Plan, Task, TaskId, Time};
use crate::run::{ModelResult, RunOptions, RunResult};
use crate::runtime::clock::Clock;
use crate::runtime::sched::{
    balance, new_hist, GpuReporter, Outlet, Routed, RtConfig, RtReport, RtScheduler,
};
use crate::runtime::wait::Waiter;
use crate::workload::Workload;
use anyhow::Result;
use crossbeam_channel::{unbounded, Receiver, Sender};
use crossbeam_utils::sync::Unparker;
use hdrhistogram::Histogram;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

#[derive(Default)]
struct Tally {
    offered: AtomicU64,
    good: AtomicU64,
    late: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

/// Accounting shared by generator, scheduler outlet and backends.
pub struct Ledger {
    flags: Vec<AtomicU8>,
    duplicates: AtomicU64,
    unchecked: AtomicU64,
    ended: AtomicU64,
    win_start: Time,
    win_end: Time,
    models: Vec<Tally>,
}

impl Ledger {
    /// The exactly-once flags for `capacity` request ids (allocate them before the
    /// run's clock starts: zeroing millions of bytes takes milliseconds).
    pub fn flags(capacity: usize) -> Vec<AtomicU8> {
        let mut v: Vec<AtomicU8> = (0..capacity).map(|_| AtomicU8::new(0)).collect();
        // Touch every page now rather than in the middle of the run.
        for i in (0..v.len()).step_by(4096) {
            *v[i].get_mut() = 0;
        }
        v
    }

    /// A ledger over `flags` (see [`Ledger::flags`]; empty disables the check).
    pub fn with_flags(
        flags: Vec<AtomicU8>,
        models: usize,
        win_start: Time,
        win_end: Time,
    ) -> Ledger {
        Ledger {
            flags,
            duplicates: AtomicU64::new(0),
            unchecked: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            win_start,
            win_end,
            models: (0..models).map(|_| Tally::default()).collect(),
        }
    }

    #[inline]
    fn in_window(&self, t: &Task) -> bool {
        t.arrival >= self.win_start && t.arrival < self.win_end
    }

    fn offered(&self, model: ModelId, t: &Task) {
        if self.in_window(t) {
            if let Some(m) = self.models.get(model.idx()) {
                m.offered.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Records how `task` ended; a second ending of the same request is counted as a
    /// duplicate (an error).
    #[inline]
    pub fn end(&self, model: ModelId, task: &Task, outcome: Outcome) {
        match self.flags.get(task.id.0 as usize) {
            Some(f) => {
                if f.swap(1, Ordering::Relaxed) != 0 {
                    self.duplicates.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            None => {
                self.unchecked.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.ended.fetch_add(1, Ordering::Relaxed);
        if !self.in_window(task) {
            return;
        }
        let Some(m) = self.models.get(model.idx()) else {
            return;
        };
        let c = match outcome {
            Outcome::Good => &m.good,
            Outcome::Late => &m.late,
            Outcome::Dropped => &m.dropped,
            Outcome::Failed => &m.failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn ended(&self) -> u64 {
        self.ended.load(Ordering::Acquire)
    }
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Acquire)
    }
    pub fn failed(&self) -> u64 {
        self.models
            .iter()
            .map(|m| m.failed.load(Ordering::Acquire))
            .sum()
    }
}

/// The scheduler's outlet in the fake world: plans go to the fake backends, drops to
/// the ledger (the fake frontends' books).
struct FakeOutlet {
    plans: Sender<(Plan, Time)>,
    backend: Unparker,
    ledger: Arc<Ledger>,
}

impl Outlet for FakeOutlet {
    fn dispatch(&self, plan: Plan, sent_at: Time) {
        if self.plans.send((plan, sent_at)).is_ok() {
            self.backend.unpark();
        }
    }
    fn drop_task(&self, model: ModelId, task: Task, reason: DropReason, _at: Time) {
        let o = match reason {
            DropReason::Shutdown => Outcome::Failed,
            _ => Outcome::Dropped,
        };
        self.ledger.end(model, &task, o);
    }
}

/// What the fake backends saw.
#[derive(Debug, Clone)]
pub struct BackendStats {
    pub plans: u64,
    /// Plans booked on a GPU before the previous plan there was planned to finish
    /// (the scheduler booked a GPU twice): must be 0.
    pub overlaps: u64,
    /// With sub-clusters: plans on a GPU outside their model's sub-cluster
    /// (the GPU does not hold the model): must be 0.
    pub misplaced: u64,
    /// Plans that reached the backend after their exec time (started late).
    pub late_starts: u64,
    pub busy_ns: Vec<i64>,
    pub batch_requests: Vec<Vec<u64>>,
    pub queuing_us: Vec<Histogram<u64>>,
    pub cpu: std::time::Duration,
}

struct Running {
    plan: Plan,
    start: Time,
    finish: Time,
}

/// Emulated GPUs: each plan starts at max(exec_at, arrival, GPU free) and takes
/// exactly l(b); the result reaches the frontend `resp` later. Driven by the fake
/// world's thread (see [`run_realtime`]).
struct FakeBackends {
    w: Arc<Workload>,
    rx: Receiver<(Plan, Time)>,
    ledger: Arc<Ledger>,
    /// Per GPU: its sub-cluster's RankThread, and its sub-cluster; per
    /// model: its sub-cluster.
    reporters: Vec<GpuReporter>,
    gpu_sub: Vec<usize>,
    home: Vec<u32>,
    st: BackendStats,
    /// Per GPU: the planned finish of its last plan and when it is really free.
    planned_free: Vec<Time>,
    free: Vec<Time>,
    running: Vec<Option<Running>>,
    spare: Vec<usize>,
    heap: BinaryHeap<Reverse<(Time, usize)>>,
}

impl FakeBackends {
    fn new(
        w: Arc<Workload>,
        rx: Receiver<(Plan, Time)>,
        ledger: Arc<Ledger>,
        (reporters, gpu_sub, home): (Vec<GpuReporter>, Vec<usize>, Vec<u32>),
    ) -> FakeBackends {
        let nm = w.models.len();
        FakeBackends {
            st: BackendStats {
                plans: 0,
                overlaps: 0,
                misplaced: 0,
                late_starts: 0,
                busy_ns: vec![0; w.gpus as usize],
                batch_requests: vec![Vec::new(); nm],
                queuing_us: (0..nm).map(|_| crate::run::new_hist()).collect(),
                cpu: std::time::Duration::ZERO,
            },
            w,
            rx,
            ledger,
            reporters,
            gpu_sub,
            home,
            planned_free: Vec::new(),
            free: Vec::new(),
            running: Vec::new(),
            spare: Vec::new(),
            heap: BinaryHeap::new(),
        }
    }

    /// Takes the plans that arrived and completes the batches finished by `now`.
    fn step(&mut self, now: Time) {
        let (ws, we) = (self.ledger.win_start, self.ledger.win_end);
        while let Ok((p, sent)) = self.rx.try_recv() {
            self.st.plans += 1;
            let g = p.gpu.idx();
            if g >= self.free.len() {
                self.free.resize(g + 1, Time::EPOCH_MIN);
                self.planned_free.resize(g + 1, Time::EPOCH_MIN);
            }
            if g >= self.st.busy_ns.len() {
                self.st.busy_ns.resize(g + 1, 0);
            }
            if p.exec_at < self.planned_free[g] {
                self.st.overlaps += 1;
            }
            let home = self.home.get(p.model.idx()).map(|&h| h as usize);
            if self.gpu_sub.get(g).copied() != home {
                self.st.misplaced += 1;
            }
            self.planned_free[g] = p.finish_at;
            let bs = p.tasks.len() as u32;
            let spec = &self.w.models[p.model.idx()].spec;
            let ready = sent + self.w.net.delay(bs);
            if ready > p.exec_at {
                self.st.late_starts += 1;
            }
            let start = p.exec_at.max(ready).max(self.free[g]);
            let finish = start + spec.profile.latency(bs);
            self.free[g] = finish;
            let (a, b) = (start.max(ws), finish.min(we));
            if b > a {
                self.st.busy_ns[g] += (b - a).0;
            }
            let slot = self.spare.pop().unwrap_or_else(|| {
                self.running.push(None);
                self.running.len() - 1
            });
            self.heap.push(Reverse((finish, slot)));
            self.running[slot] = Some(Running {
                plan: p,
                start,
                finish,
            });
        }
        while let Some(&Reverse((t, slot))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            let r = self.running[slot].take().expect("running plan");
            self.spare.push(slot);
            self.complete(r);
        }
    }

    fn next_finish(&self) -> Option<Time> {
        self.heap.peek().map(|r| r.0 .0)
    }

    fn idle(&self) -> bool {
        self.heap.is_empty() && self.rx.is_empty()
    }

    fn complete(&mut self, r: Running) {
        let st = &mut self.st;
        let p = r.plan;
        let bs = p.tasks.len();
        let m = p.model;
        let resp = self.w.net.resp;
        for t in &p.tasks {
            let o = if r.finish + resp <= t.deadline {
                Outcome::Good
            } else {
                Outcome::Late
            };
            self.ledger.end(m, t, o);
            if self.ledger.in_window(t) {
                let br = &mut st.batch_requests[m.idx()];
                if br.len() <= bs {
                    br.resize(bs + 1, 0);
                }
                br[bs] += 1;
                let q = (r.start - t.arrival).as_us_f64().max(1.0) as u64;
                st.queuing_us[m.idx()].saturating_record(q);
            }
        }
        if r.finish != p.finish_at {
            // The batch started late: tell the scheduler when the GPU is really free.
            if let Some(rep) = self.reporters.get(p.gpu.idx()) {
                rep.report(p.gpu, p.id, r.finish);
            }
        }
    }
}

/// Options of a real-time run.
#[derive(Debug, Clone)]
pub struct RtOptions {
    pub model_threads: usize,
    pub pin_cpus: Option<Vec<usize>>,
    pub rank_spin: Dur,
    /// The load generator hands requests in at least this often (and at most every
    /// arrival): its batching quantum.
    pub gen_quantum: Dur,
    /// Check that every request ends exactly once (one byte per request).
    pub check_exactly_once: bool,
    /// Per-model queue bound.
    pub queue_max: usize,
    /// A ModelThread's poll before it parks (see `RtConfig::model_spin`).
    pub model_spin: Dur,
    /// Capacity of each ModelThread's request channel, in chunks.
    pub request_chunks_max: usize,
    /// Extra time after the last arrival for requests to end before shutdown.
    pub drain: Dur,
    /// Optional rate multiplier over time (from the run's start): overload tests.
    pub rate_steps: Vec<(Dur, f64)>,
    /// Load generator threads. 1: the generator shares the fake world thread
    /// with the backends (so that on a small machine the scheduler gets the
    /// cores); more: each thread generates the arrivals of every K-th model with
    /// its own submitter, so that the generator is not what a run measures.
    pub gen_threads: usize,
    /// Sub-clusters: this many real-time schedulers (a RankThread and
    /// `model_threads` ModelThreads each), each with its share of the GPUs (a
    /// contiguous block) and of the models (balanced by share).
    pub subclusters: usize,
}

impl Default for RtOptions {
    fn default() -> Self {
        RtOptions {
            model_threads: 1,
            pin_cpus: None,
            rank_spin: Dur::from_us(100),
            gen_quantum: Dur::from_us(50),
            check_exactly_once: true,
            queue_max: 65_536,
            model_spin: Dur::from_us(100),
            request_chunks_max: 4096,
            drain: Dur::from_ms(500),
            rate_steps: Vec::new(),
            gen_threads: 1,
            subclusters: 1,
        }
    }
}

/// A real-time run's results.
#[derive(Debug, Clone)]
pub struct RtRun {
    /// The same fields as a simulation (per-model outcomes, batch sizes, GPU busy).
    pub sim: RunResult,
    /// Load generator lag: hand-in time − arrival time, ns.
    pub lag_ns: Histogram<u64>,
    pub generated: u64,
    pub refused: u64,
    pub duplicates: u64,
    /// Requests that never ended (must be 0).
    pub unended: u64,
    pub failed: u64,
    pub scheduler: RtReport,
    pub backend: BackendStats,
    /// CPU of the fake world thread (frontends and backends) while it generated
    /// load; `backend.cpu` is its CPU after that (draining).
    pub generator_cpu: std::time::Duration,
    pub process_cpu: std::time::Duration,
    pub wall_secs: f64,
    /// Seconds from the first arrival to the end of the last.
    pub gen_secs: f64,
}

impl RtRun {
    /// CPU seconds of the scheduler's threads per wall second of load.
    pub fn scheduler_cores(&self) -> f64 {
        self.scheduler.cpu().as_secs_f64() / self.wall_secs.max(1e-9)
    }
}

/// Runs `w` at `opt.rate_rps` on the real-time scheduler with fake frontends and
/// backends, for `opt.warmup + opt.duration` of real time.
///
/// Threads: the scheduler's (one RankThread, K ModelThreads) and one "fake world"
/// thread that plays every frontend (generating arrivals, handing them in every
/// `gen_quantum`) and every backend (emulated GPUs). The fakes share a thread so that
/// on a small machine the scheduler, not the test harness, gets the cores.
pub fn run_realtime(w: &Workload, opt: &RunOptions, rt: &RtOptions) -> Result<RtRun> {
    let start = RunStart {
        wall: std::time::Instant::now(),
        cpu0: crate::runtime::cpu::process_cpu_time(),
    };
    let w = Arc::new(w.clone());
    let clock = Clock::new();
    let (ledger, t0, win_end) = rt_ledger(&w, opt, rt, clock);
    let (plan_tx, plan_rx) = unbounded();
    let world_waiter = Waiter::new(Dur::ZERO);
    let outlet = Arc::new(FakeOutlet {
        plans: plan_tx,
        // Plans are accounted with emulated times: the world thread need not wake
        // for each; it takes them on its next pass (every `gen_quantum` under load).
        backend: world_waiter.unparker(),
        ledger: ledger.clone(),
    });
    let subs = rt
        .subclusters
        .clamp(1, (w.gpus as usize).min(w.models.len()).max(1));
    // Each sub-cluster: a block of GPUs, its models balanced by share; every
    // scheduler knows every GPU id and plans on its own block only.
    let gpu_sub: Vec<usize> = (0..w.gpus as usize)
        .map(|g| g * subs / w.gpus as usize)
        .collect();
    let shares: Vec<f64> = w.models.iter().map(|m| m.share).collect();
    let home = balance(&shares, subs);
    let scheds = (0..subs)
        .map(|j| {
            let mut cfg = rt_config(&w, opt, rt);
            cfg.plan_ids = (j as u32, subs as u32);
            let s = RtScheduler::start(cfg, w.specs(), outlet.clone(), clock)?;
            for (g, &o) in gpu_sub.iter().enumerate() {
                if o != j {
                    s.remove_gpu(crate::core::GpuId(g as u32));
                }
            }
            Ok(s)
        })
        .collect::<Result<Vec<_>>>()?;
    let submitter = || Routed::new(home.clone(), scheds.iter().map(|s| s.submitter()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let reporters = gpu_sub.iter().map(|&j| scheds[j].gpu_reporter()).collect();
    let place = (reporters, gpu_sub.clone(), home.clone());
    let backends = FakeBackends::new(w.clone(), plan_rx, ledger.clone(), place);
    let k = rt.gen_threads.clamp(1, w.models.len().max(1));
    let (gen_tx, gen_rx) = crossbeam_channel::bounded(k);
    // One generator: on the world thread. Several: a thread each.
    let (gen, sub) = if k == 1 {
        (
            Some(LoadGen::new(&w, opt, rt, t0, win_end, (0, 1))),
            Some(submitter()),
        )
    } else {
        for part in 0..k {
            let gen = LoadGen::new(&w, opt, rt, t0, win_end, (part, k));
            let (sub, ledger, tx, quantum) =
                (submitter(), ledger.clone(), gen_tx.clone(), rt.gen_quantum);
            std::thread::Builder::new()
                .name(format!("fermata-gen-{part}"))
                .spawn(move || {
                    let _ = tx.send(gen_thread(gen, sub, &ledger, clock, quantum));
                })?;
        }
        (None, None)
    };
    let world = FakeWorld {
        clock,
        waiter: world_waiter,
        gen,
        sub,
        backends,
        ledger: ledger.clone(),
        stop: stop.clone(),
        quantum: rt.gen_quantum,
        gen_tx,
    };
    let world = std::thread::Builder::new()
        .name("fermata-fake-world".into())
        .spawn(move || world.run())?;
    let mut parts = Vec::with_capacity(k);
    for _ in 0..k {
        parts.push(
            gen_rx
                .recv()
                .map_err(|_| anyhow::anyhow!("a load generator thread died"))?,
        );
    }
    let gen = GenResult::merge(parts);

    // Let what is queued end by itself (every request has a deadline), then shut down.
    wait_drained(&ledger, clock, gen.generated, rt.drain);
    let scheduler = RtReport::merge(scheds.into_iter().map(|s| s.shutdown()).collect());
    stop.store(true, Ordering::Release);
    let mut backend = world.join().expect("the fake world thread panicked");
    if k == 1 {
        // The world thread generated too: its CPU until then was the generator's.
        backend.cpu = backend.cpu.saturating_sub(gen.cpu);
    }
    Ok(rt_run(&w, opt, &ledger, gen, scheduler, backend, start))
}

/// When a real-time run started: the wall clock and the process's CPU time.
struct RunStart {
    wall: std::time::Instant,
    cpu0: std::time::Duration,
}

/// The run's ledger (with a flag per request it may generate, when each must be
/// checked to end exactly once), the run's time 0 and the end of its window.
fn rt_ledger(
    w: &Workload,
    opt: &RunOptions,
    rt: &RtOptions,
    clock: Clock,
) -> (Arc<Ledger>, Time, Time) {
    let expect = opt.rate_rps * (opt.warmup + opt.duration).as_secs_f64();
    let peak = rt.rate_steps.iter().map(|s| s.1).fold(1.0f64, f64::max);
    // Several generator threads number their tasks with a stride: the ids run
    // past the count by as much as the threads' shares differ.
    let spread = if rt.gen_threads > 1 { 1.5 } else { 1.0 };
    let capacity = if rt.check_exactly_once {
        (expect * peak * 1.2 * spread + 100_000.0) as usize
    } else {
        0
    };
    let flags = Ledger::flags(capacity);
    // The run's time 0 is a little after start-up, so the threads are up.
    let t0 = clock.now() + Dur::from_ms(20);
    let win_start = t0 + opt.warmup;
    let win_end = win_start + opt.duration;
    let ledger = Arc::new(Ledger::with_flags(
        flags,
        w.models.len(),
        win_start,
        win_end,
    ));
    (ledger, t0, win_end)
}

/// The real-time scheduler's configuration for the run.
fn rt_config(w: &Workload, opt: &RunOptions, rt: &RtOptions) -> RtConfig {
    let mut dcfg = w.dispatcher_config(opt.policy, false);
    dcfg.queue_max = rt.queue_max;
    let mut cfg = RtConfig::new(dcfg, rt.model_threads);
    cfg.pin_cpus = rt.pin_cpus.clone();
    cfg.rank_spin = rt.rank_spin;
    cfg.model_spin = rt.model_spin;
    cfg.request_chunks_max = rt.request_chunks_max;
    cfg.model_loads = w.models.iter().map(|m| m.share).collect();
    cfg
}

/// Waits (up to `drain`) until all `generated` requests have ended.
fn wait_drained(ledger: &Ledger, clock: Clock, generated: u64, drain: Dur) {
    let drain_until = clock.now() + drain;
    while ledger.ended() < generated && clock.now() < drain_until {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The "fake world" thread: every frontend (the load generator) and every
/// backend (emulated GPUs).
struct FakeWorld {
    clock: Clock,
    waiter: Waiter,
    /// The generator, when it shares this thread (one generator thread).
    gen: Option<LoadGen>,
    /// The generator's submitter; dropped when it is done.
    sub: Option<Routed>,
    backends: FakeBackends,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
    quantum: Dur,
    /// Where the generator's result goes when it is done.
    gen_tx: Sender<GenResult>,
}

impl FakeWorld {
    /// Generates load and runs the backends until the load is done, `stop` is
    /// set and the backends are idle; returns the backends' statistics.
    fn run(mut self) -> BackendStats {
        let mut generating = self.gen.is_some();
        loop {
            let now = self.clock.now();
            let mut wake = None;
            if let (Some(su), Some(gen)) = (self.sub.as_mut(), self.gen.as_mut()) {
                wake = gen.step(now, su, &self.ledger, self.quantum);
                if wake.is_none() {
                    generating = false;
                    gen.cpu = crate::runtime::cpu::thread_cpu_time();
                    // Submitters must go for the scheduler to shut down.
                    self.sub = None;
                    let _ = self.gen_tx.send(gen.result(self.clock));
                }
            }
            self.backends.step(now);
            if !generating && self.stop.load(Ordering::Acquire) && self.backends.idle() {
                break;
            }
            let next = match (wake, self.backends.next_finish()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let deadline = if generating {
                next
            } else {
                // Draining: look at the stop flag every millisecond.
                Some(next.map_or(now + Dur::from_ms(1), |n| n.min(now + Dur::from_ms(1))))
            };
            self.waiter.wait_until(&self.clock, deadline, || false);
        }
        let mut st = self.backends.st;
        st.cpu = crate::runtime::cpu::thread_cpu_time();
        st
    }
}

/// Puts a finished run's results together.
fn rt_run(
    w: &Workload,
    opt: &RunOptions,
    ledger: &Ledger,
    gen: GenResult,
    scheduler: RtReport,
    backend: BackendStats,
    start: RunStart,
) -> RtRun {
    let ended = ledger.ended();
    let window_ns = opt.duration.0 as f64;
    let models = model_results(w, ledger, &backend);
    let mut busy = backend.busy_ns.clone();
    busy.resize(w.gpus as usize, 0);
    let wall_secs = start.wall.elapsed().as_secs_f64();
    RtRun {
        sim: RunResult {
            policy: opt.policy,
            rate_rps: opt.rate_rps,
            models,
            gpu_busy: busy.iter().map(|&b| b as f64 / window_ns).collect(),
            sim_requests: gen.generated,
            wall_secs,
            plans: Vec::new(),
            preemptions: scheduler.counters.preemptions,
            window: opt.duration,
        },
        lag_ns: gen.lag_ns,
        generated: gen.generated,
        refused: gen.refused,
        duplicates: ledger.duplicates(),
        unended: gen.generated.saturating_sub(ended),
        failed: ledger.failed(),
        scheduler,
        backend,
        generator_cpu: gen.cpu,
        process_cpu: crate::runtime::cpu::process_cpu_time().saturating_sub(start.cpu0),
        wall_secs,
        gen_secs: gen.secs,
    }
}

/// Each model's outcomes (from the ledger) and batches (from the backends).
fn model_results(w: &Workload, ledger: &Ledger, backend: &BackendStats) -> Vec<ModelResult> {
    w.models
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let t = &ledger.models[i];
            ModelResult {
                name: m.spec.name.clone(),
                offered: t.offered.load(Ordering::Acquire),
                good: t.good.load(Ordering::Acquire),
                late: t.late.load(Ordering::Acquire),
                dropped: t.dropped.load(Ordering::Acquire) + t.failed.load(Ordering::Acquire),
                batch_requests: backend.batch_requests[i].clone(),
                queuing_us: backend.queuing_us[i].clone(),
            }
        })
        .collect()
}

struct GenResult {
    generated: u64,
    refused: u64,
    lag_ns: Histogram<u64>,
    cpu: std::time::Duration,
    secs: f64,
}

/// A load generator thread: hands in its arrivals until the run is over.
fn gen_thread(
    mut gen: LoadGen,
    mut sub: Routed,
    ledger: &Ledger,
    clock: Clock,
    quantum: Dur,
) -> GenResult {
    let mut waiter = Waiter::new(Dur::ZERO);
    while let Some(next) = gen.step(clock.now(), &mut sub, ledger, quantum) {
        waiter.wait_until(&clock, Some(next), || false);
    }
    gen.cpu = crate::runtime::cpu::thread_cpu_time();
    // The submitter must go for the scheduler to shut down.
    drop(sub);
    gen.result(clock)
}

impl GenResult {
    /// The generator threads' results as one.
    fn merge(parts: Vec<GenResult>) -> GenResult {
        let mut it = parts.into_iter();
        let mut g = it.next().expect("at least one generator");
        for p in it {
            g.generated += p.generated;
            g.refused += p.refused;
            let _ = g.lag_ns.add(&p.lag_ns);
            g.cpu += p.cpu;
            g.secs = g.secs.max(p.secs);
        }
        g
    }
}

/// The fake frontends: per-model arrival processes (seeded as in the simulator),
/// merged in time order and handed in at least every `gen_quantum`.
struct LoadGen {
    slo: Vec<Dur>,
    arrivals: MergedArrivals,
    /// Global model index of each of `arrivals`' generators.
    models: Vec<usize>,
    /// Task ids: `first + k * stride` for the k-th arrival (disjoint per thread).
    first: u64,
    stride: u64,
    t0: Time,
    win_start: Time,
    end: Time,
    lag: Histogram<u64>,
    refused: Vec<(ModelId, Task)>,
    n_refused: u64,
    id: u64,
    last_flush: Time,
    cpu: std::time::Duration,
}

impl LoadGen {
    /// The generator of every `of`-th model from model `part` (all: 0 of 1).
    fn new(
        w: &Workload,
        opt: &RunOptions,
        rt: &RtOptions,
        t0: Time,
        end: Time,
        (part, of): (usize, usize),
    ) -> LoadGen {
        let trace = (!rt.rate_steps.is_empty()).then_some(rt.rate_steps.as_slice());
        let (models, gens): (Vec<usize>, Vec<_>) =
            model_gens(w, opt.arrival, opt.rate_rps, opt.seed, trace)
                .into_iter()
                .enumerate()
                .filter(|(i, _)| i % of == part)
                .unzip();
        LoadGen {
            slo: w.models.iter().map(|m| m.spec.slo).collect(),
            arrivals: MergedArrivals::new(gens, Time::ZERO + (end - t0)),
            models,
            first: part as u64,
            stride: of as u64,
            t0,
            win_start: end - opt.duration,
            end,
            lag: new_hist(),
            refused: Vec::new(),
            n_refused: 0,
            id: 0,
            last_flush: Time::EPOCH_MIN,
            cpu: std::time::Duration::ZERO,
        }
    }

    /// Hands in every arrival due by `now`; returns when to call again (None: the
    /// run is over).
    fn step(&mut self, now: Time, sub: &mut Routed, ledger: &Ledger, quantum: Dur) -> Option<Time> {
        let rel = now - self.t0;
        while let Some((_, t)) = self.arrivals.peek() {
            if t.0 > rel.0 {
                break;
            }
            let (m, t) = self.arrivals.pop().expect("peeked");
            let m = self.models[m];
            let arrival = self.t0 + Dur(t.0);
            let task = Task {
                id: TaskId(self.first + self.id * self.stride),
                arrival,
                deadline: arrival + self.slo[m],
                tag: 0,
                cap: 0,
            };
            self.id += 1;
            let model = ModelId(m as u32);
            ledger.offered(model, &task);
            // Lag is measured over the measured window, like every other figure:
            // the first milliseconds after start-up (threads and pages warming up)
            // belong to the warm-up.
            if arrival >= self.win_start {
                self.lag.saturating_record((now - arrival).0.max(1) as u64);
            }
            sub.push(model, task, &mut self.refused);
        }
        sub.flush(&mut self.refused);
        self.last_flush = now;
        for (m, t) in self.refused.drain(..) {
            self.n_refused += 1;
            ledger.end(m, &t, Outcome::Dropped);
        }
        match self.arrivals.peek() {
            Some((_, t)) => Some((self.t0 + Dur(t.0)).max(now + quantum)),
            // No more arrivals: the frontends stay up (idle) until the run's end.
            None if now < self.end => Some(self.end),
            None => None,
        }
    }

    fn result(&mut self, clock: Clock) -> GenResult {
        GenResult {
            generated: self.id,
            refused: self.n_refused,
            lag_ns: std::mem::replace(&mut self.lag, new_hist()),
            cpu: self.cpu,
            secs: (clock.now() - self.t0).as_secs_f64(),
        }
    }
}
