//! The backend process: registers its GPUs, loads models when told, pulls each
//! plan's inputs one-sided from the frontends that hold them, runs the batch at the
//! planned time and pushes the outputs to the frontends and the actual finish time
//! to the scheduler.
//!
//! The protocol (clock sync, registration, models, checks on plans, the plan
//! queue and how a batch ends) is the sans-IO [`super::proto::backend`]; this
//! module is its driver. Threads: one network loop (scheduler and frontend
//! connections, heartbeats, driving [`BackendProto`]), and
//! per GPU a **puller** (reads a plan's inputs as soon as the plan arrives, so the
//! pull overlaps the previous batch) and a **worker** (takes the pulled plans in
//! `exec_at` order, waits for `exec_at`, runs the executor, reports). When a batch
//! starts later than planned, the tasks that can no longer meet their deadline
//! are left out, earliest deadline first (each one
//! left out shortens the batch and may save the rest); they end as
//! `Dropped(TooLate)`. A plan with none left is not run and the scheduler hears
//! `PlanDone{TooLate}`. Inputs that cannot be read (frontend gone,
//! slot reused, timeout) are left out of the batch and their tasks end as
//! `InputMissing`; the rest of the batch runs.
//!
//! [`BackendNode::metrics`] has its Prometheus series (labelled with the backend's
//! name): plans and tasks by outcome, batch sizes per model, batch start delays.

use super::clock::{Recent, SchedClock};
use super::exec::{Executor, ExecutorFactory};
use super::proto::backend::{
    classify_input, cut_batch, pull_budget, pull_requests, settle, Action, BackendProto, Cut,
    Input, PlanMsg, PlanQueue, Settled,
};
use crate::core::{Dur, LatencyProfile};
use crate::metrics::{Histogram, Kind, Registry, BATCH_BUCKETS, LATENCY_BUCKETS};
use crate::runtime::clock::Clock;
use crate::transport::{Conn, ConnId, Event, ReadReq, RegionReader, Transport, SLOT_HEADER};
use crate::wire::{GpuInfo, ModelInfo, Msg, NodeId, PlanStatus, RegionInfo, NET_QUANTILE};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Nice value of the GPU worker threads (best effort): they sleep until a batch's
/// planned start and must win the CPU then.
const WORKER_NICE: i32 = -10;

/// Most input buffers a backend keeps for reuse (a few batches' worth), and most
/// bytes they may hold together.
const POOL_MAX: usize = 512;
const POOL_MAX_BYTES: usize = 256 << 20;

/// Reads of a new frontend's region to measure the pull cost at start-up.
const PROBE_READS: usize = 8;

/// Most plans waiting for a GPU's puller; beyond, a plan is refused (its tasks
/// fail, the scheduler hears `PlanDone{Failed}`), counted as `refused`.
const PLANS_MAX: usize = 1024;
/// Most messages waiting for a GPU's worker (pulled plans, loads); beyond, the
/// sender waits, counted in `fermata_backend_channel_waits_total`.
const WORKER_MAX: usize = 1024;
/// Most load results waiting for the network loop; beyond, the worker waits
/// (counted as above).
const LOADS_MAX: usize = 256;

/// A worker sleeps until this long before a batch's start, then spins.
const SPIN: Duration = Duration::from_micros(100);

/// Longest wait of the network loop between looks at the stop flag.
const LOOP_WAIT_MAX: Dur = Dur(50_000_000);

/// Backend settings.
pub struct BackendOpts {
    pub scheduler: String,
    pub name: String,
    pub gpus: u32,
    pub gpu_name: String,
    pub gpu_mem_bytes: u64,
    /// Each GPU's name and memory where they differ (CUDA devices); empty: every
    /// GPU is `gpu_name` with `gpu_mem_bytes`.
    pub gpu_descs: Vec<(String, u64)>,
    pub executor: ExecutorFactory,
    /// The scheduler is considered lost after this long without a pong.
    pub scheduler_timeout: Duration,
}

impl BackendOpts {
    /// `gpus` emulated GPUs.
    pub fn emulated(scheduler: &str, gpus: u32) -> BackendOpts {
        BackendOpts {
            scheduler: scheduler.to_string(),
            name: "backend".into(),
            gpus,
            gpu_name: "emulated".into(),
            gpu_mem_bytes: 80 << 30,
            gpu_descs: Vec::new(),
            executor: Box::new(|_| Ok(Box::new(super::exec::EmulatedGpu::new()))),
            scheduler_timeout: Duration::from_millis(2000),
        }
    }

    /// `gpus` GPUs run by the executor `kind` (`--executor`: emulated, onnx or
    /// cuda; see [`super::exec::executor_factory`]), real models' files in
    /// `models_dir`. Fails when the executor cannot run here (no ONNX Runtime, no
    /// CUDA device).
    pub fn with_executor(
        scheduler: &str,
        gpus: u32,
        kind: &str,
        models_dir: &std::path::Path,
    ) -> anyhow::Result<BackendOpts> {
        Self::with_executor_on(scheduler, gpus, kind, models_dir, None)
    }

    /// [`Self::with_executor`] with, for `cuda`, the CUDA device of each GPU
    /// (`--cuda-devices`; default: GPU g on device g). Each GPU's name and memory
    /// are read from its device for the scheduler's inventory.
    pub fn with_executor_on(
        scheduler: &str,
        gpus: u32,
        kind: &str,
        models_dir: &std::path::Path,
        cuda_devices: Option<Vec<u32>>,
    ) -> anyhow::Result<BackendOpts> {
        let mut o = BackendOpts::emulated(scheduler, gpus);
        if let Some(v) = &cuda_devices {
            if v.len() != gpus as usize {
                anyhow::bail!(
                    "--cuda-devices lists {} devices but the backend has --gpus {gpus}",
                    v.len()
                );
            }
        }
        #[cfg(feature = "cuda")]
        let devices: Vec<u32> = cuda_devices.clone().unwrap_or_else(|| (0..gpus).collect());
        o.executor = super::exec::executor_factory_on(kind, models_dir, cuda_devices)?;
        o.gpu_name = match kind {
            "onnx" => "onnxruntime-cpu".into(),
            other => other.to_string(),
        };
        #[cfg(feature = "cuda")]
        if kind == "cuda" {
            o.gpu_descs = devices
                .iter()
                .map(|&d| super::onnx::cuda::describe(d))
                .collect::<anyhow::Result<_>>()?;
            if let Some((name, mem)) = o.gpu_descs.first() {
                o.gpu_name = name.clone();
                o.gpu_mem_bytes = *mem;
            }
        }
        Ok(o)
    }
}

/// Counts of what a backend did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct BackendReport {
    pub plans_run: u64,
    /// Plans not run at all: none of their tasks could still meet its deadline.
    pub plans_too_late: u64,
    /// Tasks left out of their batch because it started too late for them.
    pub tasks_too_late: u64,
    pub plans_failed: u64,
    pub tasks_run: u64,
    pub inputs_missing: u64,
    /// Why inputs went missing: no answer within the pull budget, a slot that no
    /// longer held the task (freed or reused at the frontend), an unreachable or
    /// out-of-bounds region.
    pub inputs_missing_timeout: u64,
    pub inputs_missing_stale: u64,
    pub inputs_missing_error: u64,
    /// How late batches started after exec_at, p50/p99 (us).
    pub start_delay_p50_us: f64,
    pub start_delay_p99_us: f64,
    pub pull_p99_us_per_task: f64,
    /// Pull time per input of a batch: median and largest (us).
    pub pull_p50_us_per_task: f64,
    pub pull_max_us_per_task: f64,
    /// Inputs pulled into a fresh buffer because the pool had none.
    pub pull_buffers_allocated: u64,
    /// One-way plan delay from the scheduler, p50 / p99 (us).
    pub plan_delay_p50_us: f64,
    pub plan_delay_p99_us: f64,
    /// exec_at minus the plan's arrival at the backend, 1st percentile and median
    /// (us; negative: it came too late to start on time).
    pub lead_arrived_p1_us: f64,
    pub lead_arrived_p50_us: f64,
    /// exec_at minus the moment its inputs were pulled, 1st percentile (us).
    pub lead_pulled_p1_us: f64,
    pub clock_offset_us: f64,
    pub clock_error_us: f64,
    pub error: Option<String>,
}

struct Shared {
    clock: SchedClock,
    sched: Arc<dyn Conn>,
    frontends: RwLock<HashMap<NodeId, Arc<dyn Conn>>>,
    profiles: RwLock<HashMap<u32, LatencyProfile>>,
    reader: Arc<dyn RegionReader>,
    pull: Mutex<Recent>,
    /// One-way delay of plans (scheduler's send to our receipt, on the scheduler's
    /// clock; includes the clock offset's error).
    plan_delay: Mutex<Recent>,
    start_delay: Mutex<Recent>,
    /// exec_at minus when the plan reached the backend, and minus when its inputs
    /// were in (negative: too late already).
    lead_arrived: Mutex<Recent>,
    lead_pulled: Mutex<Recent>,
    /// Set when the node stops or crashes: workers send nothing more.
    dead: AtomicBool,
    /// Plans received, and plans done (run, too late or failed).
    plans_received: AtomicU64,
    plans_ended: AtomicU64,
    plans_run: AtomicU64,
    plans_too_late: AtomicU64,
    tasks_too_late: AtomicU64,
    plans_failed: AtomicU64,
    /// Plans refused by the protocol's checks or a full puller queue.
    plans_refused: AtomicU64,
    /// Waits on a full internal channel (worker, load results).
    channel_waits: AtomicU64,
    tasks_run: AtomicU64,
    tasks_failed: AtomicU64,
    /// Missing inputs by reason: [timeout, stale slot, error] (counted when the
    /// pull ends).
    missing_why: [AtomicU64; 3],
    /// Input buffers of finished batches, reused by the pullers (see
    /// [`RegionReader::read_many_into`]); at most [`POOL_MAX`].
    pool: Mutex<Vec<Vec<u8>>>,
    pool_misses: AtomicU64,
    registry: Arc<Registry>,
    /// The backend's name (the metrics' `backend` label).
    name: String,
    /// Batch sizes per model id (added when a model loads).
    batch_sizes: RwLock<HashMap<u32, Arc<Histogram>>>,
    start_delay_hist: Arc<Histogram>,
}

enum WorkerMsg {
    Load(ModelInfo, Sender<Loaded>),
    Unload(u32),
    Run(PlanMsg, Vec<Option<Input>>),
}

/// A plan with its inputs pulled (None: could not be read).
type Pulled = (PlanMsg, Vec<Option<Input>>);

/// A running backend.
pub struct BackendNode {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<Result<()>>>,
    ready: Receiver<Result<Vec<u32>, String>>,
    threads: Vec<JoinHandle<()>>,
}

impl BackendNode {
    /// Connects to the scheduler, syncs the clock and registers; returns at once
    /// (see [`BackendNode::wait_ready`]).
    pub fn start(transport: Arc<dyn Transport>, opts: BackendOpts) -> Result<BackendNode> {
        if opts.gpus == 0 {
            bail!("a backend needs at least one GPU (--gpus)");
        }
        let registry = Registry::new();
        let (tx, rx) = super::event_channel(&registry, "backend");
        let sched = transport
            .connect(&opts.scheduler, tx.clone())
            .with_context(|| format!("cannot reach the scheduler at {}", opts.scheduler))?;
        let clock = SchedClock::exact(Clock::new());
        let shared = Arc::new(Shared {
            clock,
            sched,
            frontends: RwLock::new(HashMap::new()),
            profiles: RwLock::new(HashMap::new()),
            reader: transport.reader()?,
            pull: Mutex::new(Recent::new(512)),
            plan_delay: Mutex::new(Recent::new(1024)),
            start_delay: Mutex::new(Recent::new(2048)),
            lead_arrived: Mutex::new(Recent::new(2048)),
            lead_pulled: Mutex::new(Recent::new(2048)),
            dead: AtomicBool::new(false),
            plans_received: AtomicU64::new(0),
            plans_ended: AtomicU64::new(0),
            plans_run: AtomicU64::new(0),
            plans_too_late: AtomicU64::new(0),
            tasks_too_late: AtomicU64::new(0),
            plans_failed: AtomicU64::new(0),
            plans_refused: AtomicU64::new(0),
            channel_waits: AtomicU64::new(0),
            tasks_run: AtomicU64::new(0),
            tasks_failed: AtomicU64::new(0),
            missing_why: Default::default(),
            pool: Mutex::new(Vec::new()),
            pool_misses: AtomicU64::new(0),
            start_delay_hist: registry.histogram(
                "fermata_backend_start_delay_seconds",
                "How late batches started after their planned exec_at.",
                &[("backend", &opts.name)],
                Histogram::seconds(LATENCY_BUCKETS),
            ),
            registry,
            name: opts.name.clone(),
            batch_sizes: RwLock::new(HashMap::new()),
        });
        register_counters(&shared);
        register_waits(&shared);
        let mut pullers = Vec::new();
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        for g in 0..opts.gpus {
            let exec = (opts.executor)(g)
                .with_context(|| format!("cannot start the executor of GPU {g}"))?;
            let (wtx, wrx) = bounded::<WorkerMsg>(WORKER_MAX);
            let (ptx, prx) = bounded::<PlanMsg>(PLANS_MAX);
            let sh = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("gpu{g}-worker"))
                    .spawn(move || {
                        crate::runtime::pin::set_timer_slack_ns(1);
                        crate::runtime::pin::set_thread_nice(WORKER_NICE);
                        worker(sh, exec, wrx)
                    })?,
            );
            let sh = shared.clone();
            let wtx2 = wtx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("gpu{g}-pull"))
                    .spawn(move || puller(sh, prx, wtx2))?,
            );
            pullers.push(ptx);
            workers.push(wtx);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready) = bounded(1);
        let gpus: Vec<GpuInfo> = (0..opts.gpus)
            .map(|g| {
                let (name, mem_bytes) = opts
                    .gpu_descs
                    .get(g as usize)
                    .cloned()
                    .unwrap_or_else(|| (opts.gpu_name.clone(), opts.gpu_mem_bytes));
                GpuInfo {
                    local: g,
                    name,
                    mem_bytes,
                }
            })
            .collect();
        let now = shared.clock.local().now();
        let sched_id = shared.sched.id();
        let proto = BackendProto::new(
            now,
            sched_id,
            opts.name.clone(),
            gpus,
            Dur::from_std(opts.scheduler_timeout),
        );
        let mut lp = NetLoop {
            shared: shared.clone(),
            transport,
            events: tx,
            proto,
            pullers,
            workers,
            fe_conns: HashMap::new(),
            ready_tx: Some(ready_tx),
        };
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("backend-net".into())
            .spawn(move || {
                let r = lp.run(rx, &stop2);
                // The plan delays measured by the protocol, for the report.
                *lp.shared.plan_delay.lock().expect("lock") = lp.proto.plan_delays().clone();
                r
            })?;
        Ok(BackendNode {
            stop,
            shared,
            handle: Some(handle),
            ready,
            threads,
        })
    }

    /// Waits until the scheduler put the GPUs in service; returns their global ids.
    pub fn wait_ready(&self, timeout: Duration) -> Result<Vec<u32>> {
        match self.ready.recv_timeout(timeout) {
            Ok(Ok(ids)) => Ok(ids),
            Ok(Err(e)) => bail!("backend registration failed: {e}"),
            Err(_) => bail!("backend not registered within {timeout:?}"),
        }
    }

    fn report(&self) -> BackendReport {
        let s = &self.shared;
        let q = |r: &Mutex<Recent>, p: f64| r.lock().expect("lock").quantile(p) as f64 / 1e3;
        BackendReport {
            plans_run: s.plans_run.load(Ordering::Relaxed),
            plans_too_late: s.plans_too_late.load(Ordering::Relaxed),
            tasks_too_late: s.tasks_too_late.load(Ordering::Relaxed),
            plans_failed: s.plans_failed.load(Ordering::Relaxed),
            tasks_run: s.tasks_run.load(Ordering::Relaxed),
            inputs_missing: s.inputs_missing(),
            inputs_missing_timeout: s.missing_why[0].load(Ordering::Relaxed),
            inputs_missing_stale: s.missing_why[1].load(Ordering::Relaxed),
            inputs_missing_error: s.missing_why[2].load(Ordering::Relaxed),
            start_delay_p50_us: q(&s.start_delay, 0.5),
            start_delay_p99_us: q(&s.start_delay, 0.99),
            pull_p99_us_per_task: q(&s.pull, 0.99),
            pull_p50_us_per_task: q(&s.pull, 0.5),
            pull_max_us_per_task: q(&s.pull, 1.0),
            pull_buffers_allocated: s.pool_misses.load(Ordering::Relaxed),
            plan_delay_p50_us: q(&s.plan_delay, 0.5),
            plan_delay_p99_us: q(&s.plan_delay, 0.99),
            lead_arrived_p1_us: q(&s.lead_arrived, 0.01),
            lead_arrived_p50_us: q(&s.lead_arrived, 0.5),
            lead_pulled_p1_us: q(&s.lead_pulled, 0.01),
            clock_offset_us: s.clock.offset().as_us_f64(),
            clock_error_us: s.clock.error_bound().as_us_f64(),
            error: None,
        }
    }

    /// The backend's Prometheus metrics.
    pub fn metrics(&self) -> Arc<Registry> {
        self.shared.registry.clone()
    }

    /// Plans received and not yet ended (pulling, waiting or running).
    pub fn plans_in_flight(&self) -> u64 {
        let s = &self.shared;
        s.plans_received
            .load(Ordering::Relaxed)
            .saturating_sub(s.plans_ended.load(Ordering::Relaxed))
    }

    /// Whether the network loop has ended (scheduler lost, or stopped).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Stops: says goodbye to the scheduler, lets running batches finish.
    pub fn stop(mut self) -> BackendReport {
        let _ = self.shared.sched.send(Msg::Unregister {
            reason: "backend stopping".into(),
        });
        self.finish()
    }

    /// Dies abruptly (for failure tests): every connection drops, nothing more is
    /// sent, no goodbye.
    pub fn crash(mut self) -> BackendReport {
        self.shared.dead.store(true, Ordering::Release);
        self.shared.sched.close("backend crashed");
        for c in self.shared.frontends.read().expect("lock").values() {
            c.close("backend crashed");
        }
        self.finish()
    }

    /// Runs until the network loop ends (the scheduler is lost or closes us).
    pub fn join(mut self) -> BackendReport {
        let mut r = match self.handle.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => Some(format!("{e:#}")),
            Some(Err(_)) => Some("the backend's network loop panicked".to_string()),
            _ => None,
        };
        let mut rep = self.finish();
        rep.error = r.take();
        rep
    }

    fn finish(&mut self) -> BackendReport {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.shared.dead.store(true, Ordering::Release);
        let rep = self.report();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        rep
    }
}

impl Drop for BackendNode {
    fn drop(&mut self) {
        if self.handle.is_some() {
            self.finish();
        }
    }
}

impl Shared {
    /// Inputs that could not be pulled, whatever the reason.
    fn inputs_missing(&self) -> u64 {
        self.missing_why
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }
}

/// The plan and task counters (read from the backend's atomics at scrape time).
fn register_counters(sh: &Arc<Shared>) {
    outcome_counter(
        sh,
        "fermata_backend_plans_total",
        "Batch plans ended on this backend, by outcome (ran, too_late: not started in time, failed, refused: failed a check or found the GPU's queue full).",
        |s| {
            vec![
                ("ran", s.plans_run.load(Ordering::Relaxed)),
                ("too_late", s.plans_too_late.load(Ordering::Relaxed)),
                ("failed", s.plans_failed.load(Ordering::Relaxed)),
                ("refused", s.plans_refused.load(Ordering::Relaxed)),
            ]
        },
    );
    outcome_counter(
        sh,
        "fermata_backend_tasks_total",
        "Tasks ended on this backend, by outcome (ran, too_late, input_missing, failed).",
        |s| {
            vec![
                ("ran", s.tasks_run.load(Ordering::Relaxed)),
                ("too_late", s.tasks_too_late.load(Ordering::Relaxed)),
                ("input_missing", s.inputs_missing()),
                ("failed", s.tasks_failed.load(Ordering::Relaxed)),
            ]
        },
    );
}

/// Waits on a full internal channel (see [`WORKER_MAX`], [`LOADS_MAX`]).
fn register_waits(sh: &Arc<Shared>) {
    let name = sh.name.clone();
    let w = Arc::downgrade(sh);
    sh.registry.collector(
        "fermata_backend_channel_waits_total",
        "Times a backend thread found an internal channel full (WORKER_MAX, LOADS_MAX) and waited.",
        Kind::Counter,
        move || {
            w.upgrade().map_or_else(Vec::new, |s| {
                let v = s.channel_waits.load(Ordering::Relaxed) as f64;
                vec![(vec![("backend".to_string(), name.clone())], v)]
            })
        },
    );
}

/// A counter labelled by backend and outcome, read by `values` at scrape time.
fn outcome_counter(
    sh: &Arc<Shared>,
    metric: &str,
    help: &str,
    values: fn(&Shared) -> Vec<(&'static str, u64)>,
) {
    let name = sh.name.clone();
    let w = Arc::downgrade(sh);
    sh.registry.collector(metric, help, Kind::Counter, move || {
        let Some(s) = w.upgrade() else {
            return Vec::new();
        };
        values(&s)
            .into_iter()
            .map(|(o, v)| {
                (
                    vec![
                        ("backend".to_string(), name.clone()),
                        ("outcome".to_string(), o.to_string()),
                    ],
                    v as f64,
                )
            })
            .collect()
    });
}

/// A GPU's load result: (model, its device footprint or the error).
type Loaded = (u32, Result<Option<u64>, String>);

/// The network loop: the driver of [`BackendProto`] (connections, the OS clock,
/// the pullers and workers).
struct NetLoop {
    shared: Arc<Shared>,
    transport: Arc<dyn Transport>,
    events: crate::transport::EventTx,
    proto: BackendProto,
    pullers: Vec<Sender<PlanMsg>>,
    workers: Vec<Sender<WorkerMsg>>,
    /// Frontend connections by id.
    fe_conns: HashMap<ConnId, Arc<dyn Conn>>,
    ready_tx: Option<Sender<Result<Vec<u32>, String>>>,
}

impl NetLoop {
    fn run(&mut self, rx: Receiver<Event>, stop: &AtomicBool) -> Result<()> {
        let (ltx, lrx) = bounded::<Loaded>(LOADS_MAX);
        let local = self.shared.clock.local();
        while !stop.load(Ordering::Acquire) {
            self.apply(&ltx)?;
            let wait = (self.proto.poll_timeout() - local.now()).clamp(Dur::ZERO, LOOP_WAIT_MAX);
            crossbeam_channel::select! {
                recv(rx) -> ev => match ev {
                    Ok(ev) => self.event(ev),
                    Err(_) => bail!("event channel closed"),
                },
                recv(lrx) -> r => {
                    if let Ok((model, res)) = r {
                        self.proto.handle_loaded(model, res);
                    }
                }
                default(Duration::from_nanos(wait.0 as u64)) => {}
            }
            let now = local.now();
            if now >= self.proto.poll_timeout() {
                let pull = self
                    .shared
                    .pull
                    .lock()
                    .expect("lock")
                    .quantile(NET_QUANTILE);
                self.proto.set_pull_ns(pull);
                self.proto.handle_timeout(now);
            }
        }
        Ok(())
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Accepted(c) => c.close("backends accept no connections"),
            Event::Closed(c, reason) => {
                self.forget(c);
                self.proto.handle_closed(c, &reason);
            }
            Event::Msg(c, msg) => {
                let now = self.shared.clock.local().now();
                self.proto.handle_msg(now, c, msg);
            }
        }
    }

    /// Carries out what the protocol asked for.
    fn apply(&mut self, ltx: &Sender<Loaded>) -> Result<()> {
        let refused = self.proto.counts().plans_refused;
        self.shared.plans_refused.store(refused, Ordering::Relaxed);
        while let Some(a) = self.proto.poll_action() {
            match a {
                Action::Send(c, m) => {
                    let conn = self.conn(c);
                    if let Some(conn) = conn {
                        let _ = conn.send(m);
                    }
                }
                Action::Close(c, why) => {
                    if let Some(conn) = self.conn(c) {
                        conn.close(&why);
                    }
                    self.forget(c);
                }
                Action::SetClock { offset, error } => self.shared.clock.set(offset.0, error.0),
                Action::Load(model, prof) => self.load(model, prof, ltx),
                Action::Unload(model) => {
                    for w in &self.workers {
                        send_counted(w, WorkerMsg::Unload(model), &self.shared.channel_waits);
                    }
                }
                Action::Attach {
                    node,
                    ctrl_addr,
                    region,
                } => self.attach(node, &ctrl_addr, &region),
                Action::Detach { node, conn } => {
                    self.shared.reader.detach(node);
                    if let Some(c) = self.shared.frontends.write().expect("lock").remove(&node) {
                        c.close("frontend down");
                    }
                    if let Some(c) = conn {
                        self.fe_conns.remove(&c);
                    }
                }
                Action::Queue { gpu, plan } => match self.pullers[gpu].try_send(plan) {
                    Ok(()) => {
                        self.shared.plans_received.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(TrySendError::Full(plan)) => {
                        let now = self.shared.clock.local().now();
                        self.proto.handle_queue_full(now, plan);
                    }
                    Err(TrySendError::Disconnected(_)) => {}
                },
                Action::Ready(ids) => {
                    if let Some(t) = self.ready_tx.take() {
                        let _ = t.send(Ok(ids));
                    }
                }
                Action::Exit(why) => {
                    if let Some(t) = self.ready_tx.take() {
                        let _ = t.send(Err(why.clone()));
                    }
                    bail!("{why}");
                }
            }
        }
        Ok(())
    }

    fn conn(&self, c: ConnId) -> Option<Arc<dyn Conn>> {
        if c == self.shared.sched.id() {
            return Some(self.shared.sched.clone());
        }
        self.fe_conns.get(&c).cloned()
    }

    /// Drops a frontend connection from the maps (the workers stop using it).
    fn forget(&mut self, c: ConnId) {
        if self.fe_conns.remove(&c).is_some() {
            self.shared
                .frontends
                .write()
                .expect("lock")
                .retain(|_, conn| conn.id() != c);
        }
    }

    fn load(&mut self, model: ModelInfo, prof: LatencyProfile, ltx: &Sender<Loaded>) {
        let sh = &self.shared;
        sh.profiles.write().expect("lock").insert(model.id, prof);
        let h = sh.registry.histogram(
            "fermata_backend_batch_size",
            "Tasks per batch run on this backend.",
            &[("backend", &sh.name), ("model", &model.name)],
            Histogram::new(BATCH_BUCKETS, 1.0),
        );
        sh.batch_sizes.write().expect("lock").insert(model.id, h);
        for w in &self.workers {
            send_counted(
                w,
                WorkerMsg::Load(model.clone(), ltx.clone()),
                &sh.channel_waits,
            );
        }
    }

    fn attach(&mut self, node: NodeId, ctrl_addr: &str, region: &RegionInfo) {
        match self.shared.reader.attach(node, region) {
            Err(e) => tracing::warn!(
                frontend = node,
                error = %format!("{e:#}"),
                "backend: cannot attach a frontend's region"
            ),
            Ok(()) => self.probe_pull(node, region.len),
        }
        match self.transport.connect(ctrl_addr, self.events.clone()) {
            Ok(conn) => {
                let id = conn.id();
                self.fe_conns.insert(id, conn.clone());
                let old = self
                    .shared
                    .frontends
                    .write()
                    .expect("lock")
                    .insert(node, conn);
                if let Some(old) = old {
                    self.fe_conns.remove(&old.id());
                    old.close("frontend reconnected");
                }
                self.proto.handle_connected(node, id);
            }
            Err(e) => {
                tracing::warn!(frontend = node, addr = %ctrl_addr, error = %format!("{e:#}"), "backend: cannot reach a frontend")
            }
        }
    }

    /// Measures the pull cost from a new frontend at once (a few reads of the
    /// largest input's size, off this thread), so d_data is known before the
    /// first plans rather than learned from late ones.
    fn probe_pull(&self, peer: NodeId, region_len: u64) {
        let len = (self.proto.max_input() as u64 + SLOT_HEADER as u64).min(region_len) as u32;
        let sh = self.shared.clone();
        let _ = std::thread::Builder::new()
            .name("pull-probe".into())
            .spawn(move || {
                for _ in 0..PROBE_READS {
                    let t0 = Instant::now();
                    let r = sh.reader.read_many(
                        &[ReadReq {
                            peer,
                            offset: 0,
                            len,
                        }],
                        Duration::from_secs(1),
                    );
                    if r[0].is_err() {
                        break;
                    }
                    sh.pull
                        .lock()
                        .expect("lock")
                        .push(t0.elapsed().as_nanos() as i64);
                }
            });
    }
}

/// Sends on a bounded channel, waiting when it is full (the wait counted in
/// `waits`); false when the receiver is gone.
fn send_counted<T>(tx: &Sender<T>, v: T, waits: &AtomicU64) -> bool {
    match tx.try_send(v) {
        Ok(()) => true,
        Err(TrySendError::Disconnected(_)) => false,
        Err(TrySendError::Full(v)) => {
            waits.fetch_add(1, Ordering::Relaxed);
            tx.send(v).is_ok()
        }
    }
}

/// Pulls each plan's inputs as soon as it arrives, then hands it to the worker.
fn puller(sh: Arc<Shared>, rx: Receiver<PlanMsg>, worker: Sender<WorkerMsg>) {
    while let Ok(plan) = rx.recv() {
        if sh.dead.load(Ordering::Acquire) {
            break;
        }
        let reqs = pull_requests(&plan.tasks);
        // Reads may take until the batch's latest start.
        let now = sh.clock.now();
        sh.lead_arrived
            .lock()
            .expect("lock")
            .push((plan.exec_at - now).0);
        let prof = sh.profiles.read().expect("lock").get(&plan.model).cloned();
        let budget = pull_budget(&plan, prof.as_ref(), now);
        let bufs: Vec<Vec<u8>> = {
            let mut p = sh.pool.lock().expect("lock");
            let k = p.len().saturating_sub(reqs.len());
            p.split_off(k)
        };
        sh.pool_misses
            .fetch_add((reqs.len() - bufs.len()) as u64, Ordering::Relaxed);
        let t0 = Instant::now();
        let got = sh
            .reader
            .read_many_into(&reqs, Duration::from_nanos(budget.0 as u64), bufs);
        let el = t0.elapsed();
        sh.lead_pulled
            .lock()
            .expect("lock")
            .push((plan.exec_at - sh.clock.now()).0);
        if !plan.tasks.is_empty() {
            sh.pull
                .lock()
                .expect("lock")
                .push(el.as_nanos() as i64 / plan.tasks.len() as i64);
        }
        // Each input stays in the slot it was read into (header first): no copy.
        let inputs: Vec<Option<Input>> = got
            .into_iter()
            .zip(&plan.tasks)
            .map(|(r, t)| {
                classify_input(r, t.id)
                    .map_err(|why| sh.missing_why[why as usize].fetch_add(1, Ordering::Relaxed))
                    .ok()
            })
            .collect();
        if !send_counted(&worker, WorkerMsg::Run(plan, inputs), &sh.channel_waits) {
            break;
        }
    }
}

/// Runs one GPU: plans in `exec_at` order ([`PlanQueue`]; a plan that arrives
/// while the worker waits for a later one goes first), loads and unloads between
/// batches. It sleeps until just before a plan's start, then spins.
fn worker(sh: Arc<Shared>, mut exec: Box<dyn Executor>, rx: Receiver<WorkerMsg>) {
    let mut queue: PlanQueue<Pulled> = PlanQueue::default();
    loop {
        let msg = match queue.next_at() {
            None => match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => break,
            },
            Some(at) => {
                let wake = sh
                    .clock
                    .instant_of(at)
                    .checked_sub(SPIN)
                    .unwrap_or(Instant::now());
                match rx.recv_deadline(wake) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
                        None
                    }
                }
            }
        };
        if let Some(m) = msg {
            for m in std::iter::once(m).chain(rx.try_iter()) {
                match m {
                    WorkerMsg::Load(model, ack) => {
                        let r = exec
                            .load(&model)
                            .map(|()| exec.device_bytes(model.id))
                            .map_err(|e| format!("{e:#}"));
                        send_counted(&ack, (model.id, r), &sh.channel_waits);
                    }
                    WorkerMsg::Unload(model) => exec.unload(model),
                    WorkerMsg::Run(plan, inputs) => queue.push(plan.exec_at, (plan, inputs)),
                }
            }
            continue;
        }
        if let Some(at) = queue.next_at() {
            let at = sh.clock.instant_of(at);
            while Instant::now() < at {
                std::hint::spin_loop();
            }
        }
        if let Some((plan, inputs)) = queue.pop_due(sh.clock.now()) {
            if !sh.dead.load(Ordering::Acquire) {
                run_plan(&sh, exec.as_mut(), plan, inputs);
            }
        }
    }
}

/// Runs a due plan (see [`cut_batch`]: late tasks and missing inputs are left
/// out), reports to the frontends and the scheduler, recycles the input buffers.
fn run_plan(sh: &Shared, exec: &mut dyn Executor, plan: PlanMsg, inputs: Vec<Option<Input>>) {
    let start = sh.clock.now();
    let delay = (start - plan.exec_at).0.max(0);
    sh.start_delay.lock().expect("lock").push(delay);
    sh.start_delay_hist.observe(delay as u64);
    let present: Vec<bool> = inputs.iter().map(Option::is_some).collect();
    let prof = sh.profiles.read().expect("lock").get(&plan.model).cloned();
    let cut = cut_batch(&plan.tasks, &present, start, prof.as_ref());
    let outputs = if cut.run.is_empty() {
        Ok(Vec::new())
    } else {
        let refs: Vec<&[u8]> = cut
            .run
            .iter()
            .map(|&i| inputs[i].as_ref().expect("present").bytes())
            .collect();
        match exec.run(plan.model, &refs) {
            Ok(o) if o.len() == refs.len() => Ok(o),
            Ok(_) => {
                tracing::error!(
                    plan = plan.id,
                    model = plan.model,
                    "backend: the executor returned the wrong number of outputs"
                );
                Err(())
            }
            Err(e) => {
                tracing::error!(plan = plan.id, model = plan.model, error = %format!("{e:#}"), "backend: the executor failed a batch");
                Err(())
            }
        }
    };
    let settled = settle(&plan, &cut, start, sh.clock.now(), outputs);
    count(sh, &plan, &cut, &settled);
    sh.plans_ended.fetch_add(1, Ordering::Relaxed);
    if sh.dead.load(Ordering::Acquire) {
        return;
    }
    {
        let fes = sh.frontends.read().expect("lock");
        for (fe, items) in settled.results {
            if let Some(c) = fes.get(&fe) {
                let _ = c.send(Msg::Results { items });
            }
        }
    }
    let _ = sh.sched.send(settled.done);
    // The inputs' buffers go back to the pullers (bounded in count and bytes).
    let mut p = sh.pool.lock().expect("lock");
    let mut bytes: usize = p.iter().map(Vec::capacity).sum();
    for i in inputs.into_iter().flatten() {
        if p.len() >= POOL_MAX || bytes + i.slot.capacity() > POOL_MAX_BYTES {
            break;
        }
        bytes += i.slot.capacity();
        p.push(i.slot);
    }
}

/// Counts a batch's outcome.
fn count(sh: &Shared, plan: &PlanMsg, cut: &Cut, s: &Settled) {
    let add = |a: &AtomicU64, n: usize| a.fetch_add(n as u64, Ordering::Relaxed);
    add(&sh.tasks_too_late, cut.too_late.len());
    match s.status {
        PlanStatus::Ran => {
            add(&sh.plans_run, 1);
            add(&sh.tasks_run, s.ran);
            if let Some(h) = sh.batch_sizes.read().expect("lock").get(&plan.model) {
                h.observe(s.ran as u64);
            }
        }
        PlanStatus::TooLate => {
            add(&sh.plans_too_late, 1);
        }
        PlanStatus::Failed => {
            add(&sh.plans_failed, 1);
            add(&sh.tasks_failed, cut.run.len());
        }
    }
}
