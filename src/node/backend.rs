//! The backend process: registers its GPUs, loads models when told, pulls each
//! plan's inputs one-sided from the frontends that hold them, runs the batch at the
//! planned time and pushes the outputs to the frontends and the actual finish time
//! to the scheduler.
//!
//! Threads: one network loop (scheduler and frontend connections, heartbeats), and
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

use super::clock::{OffsetEstimator, Recent, SchedClock};
use super::exec::{profile_of, Executor, ExecutorFactory};
use super::scheduler::task_owner;
use crate::core::{LatencyProfile, Time};
use crate::metrics::{Histogram, Kind, Registry, BATCH_BUCKETS, LATENCY_BUCKETS};
use crate::runtime::clock::Clock;
use crate::transport::{
    Conn, ConnId, Event, InputRef, ReadError, ReadReq, RegionReader, SlotHeader, Transport,
    SLOT_HEADER,
};
use crate::wire::{
    DropCode, GpuInfo, ModelInfo, Msg, NodeId, PlanStatus, PlanTask, Role, TaskResult, TaskStatus,
    NET_QUANTILE,
};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use std::collections::{BTreeMap, HashMap};
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
    Load(ModelInfo, Sender<(u32, Result<Option<u64>, String>)>),
    Unload(u32),
    Run(PlanMsg, Vec<Option<Input>>),
}

/// A plan with its inputs pulled (None: could not be read).
type Pulled = (PlanMsg, Vec<Option<Input>>);

/// An input as read: the whole slot, header first, and the payload's length.
struct Input {
    slot: Vec<u8>,
    len: usize,
}

impl Input {
    fn bytes(&self) -> &[u8] {
        &self.slot[SLOT_HEADER..SLOT_HEADER + self.len]
    }
}

#[derive(Clone)]
struct PlanMsg {
    id: u64,
    model: u32,
    gpu: u32,
    exec_at: Time,
    tasks: Vec<PlanTask>,
}

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
        let (tx, rx) = unbounded();
        let sched = transport
            .connect(&opts.scheduler, tx.clone())
            .with_context(|| format!("cannot reach the scheduler at {}", opts.scheduler))?;
        let clock = SchedClock::exact(Clock::new());
        let registry = Registry::new();
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
        let mut pullers = Vec::new();
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        for g in 0..opts.gpus {
            let exec = (opts.executor)(g)
                .with_context(|| format!("cannot start the executor of GPU {g}"))?;
            let (wtx, wrx) = unbounded::<WorkerMsg>();
            let (ptx, prx) = unbounded::<PlanMsg>();
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
        let (ready_tx, ready) = unbounded();
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
        let mut lp = NetLoop {
            shared: shared.clone(),
            transport,
            events: tx,
            pullers,
            workers,
            gpu_map: HashMap::new(),
            est: OffsetEstimator::new(),
            rtt: Recent::new(256),
            loading: HashMap::new(),
            loaded_bytes: HashMap::new(),
            ready_tx: Some(ready_tx),
            fe_conns: HashMap::new(),
            opts_timeout: opts.scheduler_timeout,
            last_pong: Instant::now(),
            max_input: 0,
        };
        let stop2 = stop.clone();
        let name = opts.name.clone();
        let handle = std::thread::Builder::new()
            .name("backend-net".into())
            .spawn(move || lp.run(rx, &stop2, name, gpus))?;
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

struct NetLoop {
    shared: Arc<Shared>,
    transport: Arc<dyn Transport>,
    events: crate::transport::EventTx,
    pullers: Vec<Sender<PlanMsg>>,
    workers: Vec<Sender<WorkerMsg>>,
    /// Global GPU id -> local index.
    gpu_map: HashMap<u32, usize>,
    est: OffsetEstimator,
    rtt: Recent,
    /// Model -> GPUs still loading it.
    loading: HashMap<u32, u32>,
    /// Model -> the largest device footprint a GPU reported for it so far.
    loaded_bytes: HashMap<u32, u64>,
    ready_tx: Option<Sender<Result<Vec<u32>, String>>>,
    fe_conns: HashMap<ConnId, NodeId>,
    opts_timeout: Duration,
    last_pong: Instant,
    /// Largest input of the models loaded (bytes).
    max_input: u32,
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
        "Batch plans ended on this backend, by outcome (ran, too_late: not started in time, failed).",
        |s| {
            vec![
                ("ran", s.plans_run.load(Ordering::Relaxed)),
                ("too_late", s.plans_too_late.load(Ordering::Relaxed)),
                ("failed", s.plans_failed.load(Ordering::Relaxed)),
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

impl NetLoop {
    fn ping(&self, seq: u64) {
        let _ = self.shared.sched.send(Msg::Ping {
            seq,
            sent_ns: self.shared.clock.local().now().0,
            ctrl_delay_ns: (self.rtt.quantile(NET_QUANTILE) / 2).max(
                self.shared
                    .plan_delay
                    .lock()
                    .expect("lock")
                    .quantile(NET_QUANTILE),
            ),
            pull_ns: self
                .shared
                .pull
                .lock()
                .expect("lock")
                .quantile(NET_QUANTILE),
        });
    }

    fn run(
        &mut self,
        rx: Receiver<Event>,
        stop: &AtomicBool,
        name: String,
        gpus: Vec<GpuInfo>,
    ) -> Result<()> {
        let (ltx, lrx) = unbounded::<(u32, Result<Option<u64>, String>)>();
        // Clock sync first: a few quick probes, then register.
        let mut seq = 0u64;
        let sched_id = self.shared.sched.id();
        let t_sync = Instant::now();
        while self.est.samples() < 8 && t_sync.elapsed() < Duration::from_secs(2) {
            seq += 1;
            self.ping(seq);
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(ev) => self.event(ev, sched_id, &ltx)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => bail!("event channel closed"),
            }
        }
        if self.est.samples() == 0 {
            bail!("the scheduler does not answer pings");
        }
        self.shared
            .sched
            .send(Msg::Register {
                role: Role::Backend,
                name,
                gpus,
                ctrl_addr: String::new(),
                region: None,
            })
            .map_err(|e| anyhow::anyhow!("cannot register: {e}"))?;
        let mut heartbeat = Duration::from_millis(100);
        let mut next_ping = Instant::now() + heartbeat;
        self.last_pong = Instant::now();
        while !stop.load(Ordering::Acquire) {
            let wait = next_ping
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50));
            crossbeam_channel::select! {
                recv(rx) -> ev => match ev {
                    Ok(Event::Msg(_, Msg::RegisterAck { heartbeat_ms, gpu_ids, .. })) => {
                        heartbeat = Duration::from_millis(heartbeat_ms.max(1) as u64);
                        for (i, g) in gpu_ids.iter().enumerate() {
                            self.gpu_map.insert(*g, i);
                        }
                        if let Some(t) = self.ready_tx.take() {
                            let _ = t.send(Ok(gpu_ids));
                        }
                    }
                    Ok(ev) => self.event(ev, sched_id, &ltx)?,
                    Err(_) => bail!("event channel closed"),
                },
                recv(lrx) -> r => {
                    if let Ok((model, res)) = r {
                        self.loaded(model, res);
                    }
                }
                default(wait) => {}
            }
            let now = Instant::now();
            if now >= next_ping {
                next_ping = now + heartbeat;
                seq += 1;
                self.ping(seq);
            }
            if now.duration_since(self.last_pong) > self.opts_timeout {
                self.shared.sched.close("scheduler silent");
                bail!("lost the scheduler: no pong for {:?}", self.opts_timeout);
            }
        }
        Ok(())
    }

    /// Measures the pull cost from a new frontend at once (a few reads of the
    /// largest input's size, off this thread), so d_data is known before the
    /// first plans rather than learned from late ones.
    fn probe_pull(&self, peer: NodeId, region_len: u64) {
        let len = (self.max_input as u64 + SLOT_HEADER as u64).min(region_len) as u32;
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

    fn loaded(&mut self, model: u32, res: Result<Option<u64>, String>) {
        match res {
            Err(e) => {
                self.loading.remove(&model);
                self.loaded_bytes.remove(&model);
                let _ = self.shared.sched.send(Msg::ModelLoaded {
                    model,
                    ok: false,
                    error: e,
                    device_bytes: 0,
                });
            }
            Ok(bytes) => {
                if let Some(b) = bytes {
                    let m = self.loaded_bytes.entry(model).or_insert(0);
                    *m = (*m).max(b);
                }
                if let Some(n) = self.loading.get_mut(&model) {
                    *n -= 1;
                    if *n == 0 {
                        self.loading.remove(&model);
                        let device_bytes = self.loaded_bytes.remove(&model).unwrap_or(0);
                        if device_bytes > 0 {
                            tracing::info!(model, device_bytes, "backend: model loaded");
                        }
                        let _ = self.shared.sched.send(Msg::ModelLoaded {
                            model,
                            ok: true,
                            error: String::new(),
                            device_bytes,
                        });
                    }
                }
            }
        }
    }

    fn event(
        &mut self,
        ev: Event,
        sched_id: ConnId,
        ltx: &Sender<(u32, Result<Option<u64>, String>)>,
    ) -> Result<()> {
        match ev {
            Event::Accepted(c) => c.close("backends accept no connections"),
            Event::Closed(c, reason) => {
                if c == sched_id {
                    if let Some(t) = self.ready_tx.take() {
                        let _ = t.send(Err(reason.clone()));
                    }
                    bail!("lost the scheduler: {reason}");
                }
                if let Some(fe) = self.fe_conns.remove(&c) {
                    self.shared.frontends.write().expect("lock").remove(&fe);
                }
            }
            Event::Msg(c, msg) if c == sched_id => match msg {
                Msg::Pong {
                    echo_ns, sched_ns, ..
                } => {
                    self.last_pong = Instant::now();
                    let t2 = self.shared.clock.local().now();
                    let rtt = self
                        .est
                        .add(Time(echo_ns), Time(sched_ns), t2, &self.shared.clock);
                    self.rtt.push(rtt.0);
                }
                Msg::Plan {
                    id,
                    model,
                    gpu,
                    exec_at_ns,
                    sent_ns,
                    tasks,
                    ..
                } => {
                    self.shared.plans_received.fetch_add(1, Ordering::Relaxed);
                    let delay = (self.shared.clock.now() - Time(sent_ns)).0;
                    self.shared.plan_delay.lock().expect("lock").push(delay);
                    let Some(&g) = self.gpu_map.get(&gpu) else {
                        tracing::warn!(
                            plan = id,
                            gpu,
                            "backend: a plan for a GPU that is not ours; dropped"
                        );
                        return Ok(());
                    };
                    let _ = self.pullers[g].send(PlanMsg {
                        id,
                        model,
                        gpu,
                        exec_at: Time(exec_at_ns),
                        tasks,
                    });
                }
                Msg::LoadModel { model } => {
                    match profile_of(&model.profile) {
                        Ok(p) => {
                            self.shared
                                .profiles
                                .write()
                                .expect("lock")
                                .insert(model.id, p);
                        }
                        Err(e) => {
                            let _ = ltx.send((model.id, Err(format!("{e:#}"))));
                            return Ok(());
                        }
                    }
                    self.max_input = self.max_input.max(model.input_bytes);
                    let h = self.shared.registry.histogram(
                        "fermata_backend_batch_size",
                        "Tasks per batch run on this backend.",
                        &[("backend", &self.shared.name), ("model", &model.name)],
                        Histogram::new(BATCH_BUCKETS, 1.0),
                    );
                    self.shared
                        .batch_sizes
                        .write()
                        .expect("lock")
                        .insert(model.id, h);
                    self.loading.insert(model.id, self.workers.len() as u32);
                    for w in &self.workers {
                        let _ = w.send(WorkerMsg::Load(model.clone(), ltx.clone()));
                    }
                }
                Msg::UnloadModel { model } => {
                    for w in &self.workers {
                        let _ = w.send(WorkerMsg::Unload(model));
                    }
                }
                Msg::FrontendUp {
                    node,
                    ctrl_addr,
                    region,
                } => {
                    match self.shared.reader.attach(node, &region) {
                        Err(e) => tracing::warn!(
                            frontend = node,
                            error = %format!("{e:#}"),
                            "backend: cannot attach a frontend's region"
                        ),
                        Ok(()) => self.probe_pull(node, region.len),
                    }
                    match self.transport.connect(&ctrl_addr, self.events.clone()) {
                        Ok(conn) => {
                            self.fe_conns.insert(conn.id(), node);
                            self.shared
                                .frontends
                                .write()
                                .expect("lock")
                                .insert(node, conn);
                        }
                        Err(e) => {
                            tracing::warn!(frontend = node, addr = %ctrl_addr, error = %format!("{e:#}"), "backend: cannot reach a frontend")
                        }
                    }
                }
                Msg::FrontendDown { node } => {
                    self.shared.reader.detach(node);
                    if let Some(c) = self.shared.frontends.write().expect("lock").remove(&node) {
                        self.fe_conns.remove(&c.id());
                        c.close("frontend down");
                    }
                }
                Msg::Error { message } => {
                    bail!("the scheduler closed us: {message}");
                }
                other => {
                    tracing::debug!(
                        kind = other.kind(),
                        "backend: ignoring an unexpected message from the scheduler"
                    );
                }
            },
            Event::Msg(c, other) => {
                // Frontends send nothing to backends.
                tracing::warn!(
                    kind = other.kind(),
                    conn = c,
                    "backend: unexpected message from a connection; closing it"
                );
                if let Some(fe) = self.fe_conns.remove(&c) {
                    if let Some(conn) = self.shared.frontends.write().expect("lock").remove(&fe) {
                        conn.close("unexpected message");
                    }
                }
            }
        }
        Ok(())
    }
}

/// Pulls each plan's inputs as soon as it arrives, then hands it to the worker.
fn puller(sh: Arc<Shared>, rx: Receiver<PlanMsg>, worker: Sender<WorkerMsg>) {
    while let Ok(plan) = rx.recv() {
        if sh.dead.load(Ordering::Acquire) {
            break;
        }
        let reqs: Vec<ReadReq> = plan
            .tasks
            .iter()
            .map(|t| {
                let r = InputRef::unpack(t.input);
                ReadReq {
                    peer: task_owner(t.id),
                    offset: r.offset,
                    len: r.len,
                }
            })
            .collect();
        // Reads may take until the batch's latest start.
        let now = sh.clock.now();
        sh.lead_arrived
            .lock()
            .expect("lock")
            .push((plan.exec_at - now).0);
        let latest = latest_start(&sh, &plan, plan.tasks.len());
        let budget = Duration::from_nanos((latest - now).0.max(1_000_000) as u64);
        let bufs: Vec<Vec<u8>> = {
            let mut p = sh.pool.lock().expect("lock");
            let k = p.len().saturating_sub(reqs.len());
            p.split_off(k)
        };
        sh.pool_misses
            .fetch_add((reqs.len() - bufs.len()) as u64, Ordering::Relaxed);
        let t0 = Instant::now();
        let got = sh.reader.read_many_into(&reqs, budget, bufs);
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
                let why = match r {
                    Ok(slot) => match SlotHeader::check(&slot, t.id) {
                        Ok(p) => {
                            let len = p.len();
                            return Some(Input { slot, len });
                        }
                        Err(_) => 1,
                    },
                    Err(ReadError::Timeout) => 0,
                    Err(_) => 2,
                };
                sh.missing_why[why].fetch_add(1, Ordering::Relaxed);
                None
            })
            .collect();
        if worker.send(WorkerMsg::Run(plan, inputs)).is_err() {
            break;
        }
    }
}

/// How many of a batch's tasks (deadlines sorted ascending) must be left out,
/// earliest first, for the rest to finish by their deadlines when the batch starts
/// at `start`.
pub fn too_late_prefix(deadlines: &[Time], start: Time, prof: &LatencyProfile) -> usize {
    let mut cut = 0;
    while cut < deadlines.len() {
        let n = ((deadlines.len() - cut) as u32).clamp(1, prof.max_batch());
        if deadlines[cut] >= start + prof.latency(n) {
            break;
        }
        cut += 1;
    }
    cut
}

/// The last moment `plan` can start with `n` tasks and meet its earliest deadline.
fn latest_start(sh: &Shared, plan: &PlanMsg, n: usize) -> Time {
    let l = sh
        .profiles
        .read()
        .expect("lock")
        .get(&plan.model)
        .map(|p| p.latency((n as u32).clamp(1, p.max_batch())))
        .unwrap_or_default();
    let dl = plan
        .tasks
        .iter()
        .map(|t| t.deadline_ns)
        .min()
        .unwrap_or(i64::MAX);
    Time(dl) - l
}

/// Runs one GPU: plans in `exec_at` order (those waiting are re-sorted before each
/// batch), loads and unloads between batches.
fn worker(sh: Arc<Shared>, mut exec: Box<dyn Executor>, rx: Receiver<WorkerMsg>) {
    let mut ready: BTreeMap<(Time, u64), Pulled> = BTreeMap::new();
    let mut seq = 0u64;
    loop {
        let first = if ready.is_empty() {
            match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => break,
            }
        } else {
            None
        };
        for m in first.into_iter().chain(rx.try_iter()) {
            match m {
                WorkerMsg::Load(model, ack) => {
                    let r = exec
                        .load(&model)
                        .map(|()| exec.device_bytes(model.id))
                        .map_err(|e| format!("{e:#}"));
                    let _ = ack.send((model.id, r));
                }
                WorkerMsg::Unload(model) => exec.unload(model),
                WorkerMsg::Run(plan, inputs) => {
                    seq += 1;
                    ready.insert((plan.exec_at, seq), (plan, inputs));
                }
            }
        }
        if let Some((_, (plan, inputs))) = ready.pop_first() {
            if !sh.dead.load(Ordering::Acquire) {
                run_plan(&sh, exec.as_mut(), plan, inputs);
            }
        }
    }
}

fn run_plan(sh: &Shared, exec: &mut dyn Executor, plan: PlanMsg, inputs: Vec<Option<Input>>) {
    // Wait for exec_at: sleep, then spin the last stretch.
    let at = sh.clock.instant_of(plan.exec_at);
    let now = Instant::now();
    let spin = Duration::from_micros(100);
    if at > now + spin {
        std::thread::sleep(at - now - spin);
    }
    while Instant::now() < at {
        std::hint::spin_loop();
    }
    let start = sh.clock.now();
    let delay = (start - plan.exec_at).0.max(0);
    sh.start_delay.lock().expect("lock").push(delay);
    sh.start_delay_hist.observe(delay as u64);
    // The batch that runs: the tasks whose input arrived and that can still meet
    // their deadline if it starts now. Earliest deadlines are checked first:
    // leaving one out shortens the batch, which may save the others. (On time,
    // none is left out: exec_at <= earliest deadline - l(b).)
    let mut present: Vec<usize> = (0..inputs.len()).filter(|&i| inputs[i].is_some()).collect();
    present.sort_by_key(|&i| plan.tasks[i].deadline_ns);
    let missing = (inputs.len() - present.len()) as u32;
    let prof = sh.profiles.read().expect("lock").get(&plan.model).cloned();
    let deadlines: Vec<Time> = present
        .iter()
        .map(|&i| Time(plan.tasks[i].deadline_ns))
        .collect();
    let cut = prof.map_or(0, |p| too_late_prefix(&deadlines, start, &p));
    let (too_late, run) = present.split_at(cut);
    let mut by_fe: HashMap<NodeId, Vec<TaskResult>> = HashMap::new();
    let ran = run.len() as u32;
    let mut push = |id: u64, status: TaskStatus, fin: Time, output: Vec<u8>| {
        let batch_size = if status == TaskStatus::Ok { ran } else { 0 };
        by_fe.entry(task_owner(id)).or_default().push(TaskResult {
            id,
            status,
            started_ns: start.0,
            finished_ns: fin.0,
            batch_size,
            output,
        });
    };
    for &i in too_late {
        push(
            plan.tasks[i].id,
            TaskStatus::Dropped(DropCode::TooLate),
            start,
            Vec::new(),
        );
    }
    sh.tasks_too_late
        .fetch_add(too_late.len() as u64, Ordering::Relaxed);
    let status;
    let finished;
    if run.is_empty() && !too_late.is_empty() {
        status = PlanStatus::TooLate;
        finished = start;
        sh.plans_too_late.fetch_add(1, Ordering::Relaxed);
    } else {
        let refs: Vec<&[u8]> = run
            .iter()
            .map(|&i| inputs[i].as_ref().expect("present").bytes())
            .collect();
        let res = if refs.is_empty() {
            Ok(Vec::new())
        } else {
            exec.run(plan.model, &refs)
        };
        finished = sh.clock.now();
        match res {
            Ok(outs) if outs.len() == refs.len() => {
                status = PlanStatus::Ran;
                sh.plans_run.fetch_add(1, Ordering::Relaxed);
                sh.tasks_run.fetch_add(outs.len() as u64, Ordering::Relaxed);
                if let Some(h) = sh.batch_sizes.read().expect("lock").get(&plan.model) {
                    h.observe(outs.len() as u64);
                }
                for (&i, o) in run.iter().zip(outs) {
                    push(plan.tasks[i].id, TaskStatus::Ok, finished, o);
                }
            }
            other => {
                if let Err(e) = &other {
                    tracing::error!(plan = plan.id, model = plan.model, error = %format!("{e:#}"), "backend: the executor failed a batch");
                } else {
                    tracing::error!(
                        plan = plan.id,
                        model = plan.model,
                        "backend: the executor returned the wrong number of outputs"
                    );
                }
                status = PlanStatus::Failed;
                sh.plans_failed.fetch_add(1, Ordering::Relaxed);
                sh.tasks_failed
                    .fetch_add(run.len() as u64, Ordering::Relaxed);
                for &i in run {
                    push(plan.tasks[i].id, TaskStatus::Failed, finished, Vec::new());
                }
            }
        }
    }
    for (i, t) in plan.tasks.iter().enumerate() {
        if inputs[i].is_none() {
            push(t.id, TaskStatus::InputMissing, finished, Vec::new());
        }
    }
    sh.plans_ended.fetch_add(1, Ordering::Relaxed);
    if sh.dead.load(Ordering::Acquire) {
        return;
    }
    {
        let fes = sh.frontends.read().expect("lock");
        for (fe, items) in by_fe {
            if let Some(c) = fes.get(&fe) {
                let _ = c.send(Msg::Results { items });
            }
        }
    }
    let _ = sh.sched.send(Msg::PlanDone {
        id: plan.id,
        gpu: plan.gpu,
        status,
        started_ns: start.0,
        finished_ns: finished.0,
        missing,
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Dur;

    #[test]
    fn a_late_batch_leaves_out_only_what_it_must() {
        // l(b) = 1 ms * b + 5 ms.
        let p = LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(5), 32).unwrap();
        let ms = |v: i64| Time(v * 1_000_000);
        // Four tasks, deadlines 9, 10, 12, 20 ms; l(4) = 9 ms.
        let d = [ms(9), ms(10), ms(12), ms(20)];
        assert_eq!(too_late_prefix(&d, ms(0), &p), 0, "on time");
        // Starting at 1 ms: 1 + 9 > 9, drop the first; 1 + l(3) = 9 <= 10: keep 3.
        assert_eq!(too_late_prefix(&d, ms(1), &p), 1);
        // Starting at 5 ms: 5 + 8 > 10, 5 + 7 <= 12: keep the last two.
        assert_eq!(too_late_prefix(&d, ms(5), &p), 2);
        assert_eq!(too_late_prefix(&d, ms(16), &p), 4, "none can make it");
        assert_eq!(too_late_prefix(&[], ms(0), &p), 0);
    }
}
