//! The real-time scheduler of one sub-cluster: the pure core's two halves on threads.
//!
//! * **K ModelThreads**, each owning a [`ModelShard`] (its models' queues and
//!   candidates). Models are spread over the threads by expected load (longest
//!   processing time first), not by hash.
//! * **One RankThread** owning the [`Ranker`] (GPU free times, model and GPU timers).
//!
//! They talk over bounded crossbeam channels, in batches: in each pass a ModelThread
//! sends the RankThread one message with every candidate that changed and every GPU it
//! booked or gave back; the RankThread sends each ModelThread one message with its
//! grants and expiry notices. Several schedulers (sub-clusters) can run in one process:
//! each [`RtScheduler`] owns its threads and channels and shares nothing global.
//!
//! # Limits and what happens at them
//! * Requests enter through a [`Submitter`] in chunks; each ModelThread's request
//!   channel holds `request_chunks_max` chunks. A chunk that does not fit is refused
//!   and its requests are handed back to the caller, who ends them as `Overloaded`.
//! * Each model's queue holds `queue_max` requests; a request beyond it is dropped as
//!   `QueueFull` (through the [`Outlet`]).
//! * The RankThread never blocks: its channel to each ModelThread holds one message
//!   per pass and it waits (sends block) only if a ModelThread is that far behind,
//!   which cannot deadlock because ModelThreads never wait on the RankThread's
//!   answers. ModelThread → RankThread messages block the ModelThread while the
//!   RankThread's inbox is full: back-pressure, not loss.
//!
//! # Time
//! The OS clock enters only through [`Clock`]; the core sees `Time`.

use super::clock::Clock;
use super::pin::pin_current_thread;
use super::wait::{WaitOutcome, Waiter};
use crate::core::rank::{RankOutput, Ranker};
use crate::core::shard::{ModelShard, ToRank};
use crate::core::{
    Counters, DispatcherConfig, DropReason, Dur, GpuId, ModelId, ModelSpec, NetBudget, Output,
    Plan, PlanId, Task, Time,
};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError, TrySendError};
use crossbeam_utils::sync::Unparker;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Where the scheduler's decisions go: batch plans to backends, drop notices to
/// frontends. Called from the ModelThreads, concurrently.
pub trait Outlet: Send + Sync + 'static {
    /// A batch plan leaves the scheduler for the backend that owns `plan.gpu`.
    fn dispatch(&self, plan: Plan, sent_at: Time);
    /// The scheduler gave up on `task`.
    fn drop_task(&self, model: ModelId, task: Task, reason: DropReason, at: Time);
}

/// Configuration of one real-time scheduler.
#[derive(Debug, Clone)]
pub struct RtConfig {
    pub dispatcher: DispatcherConfig,
    /// Number of ModelThreads (K >= 1).
    pub model_threads: usize,
    /// CPUs to pin to: the RankThread to the first, ModelThreads to the next ones
    /// (round-robin over the list). None: no pinning.
    pub pin_cpus: Option<Vec<usize>>,
    /// The RankThread spins this long before each timer instead of parking (see
    /// [`super::wait`]); ModelThreads only park (grants wake them).
    pub rank_spin: Dur,
    /// Capacity of each ModelThread's request channel, in chunks.
    pub request_chunks_max: usize,
    /// A ModelThread that just did some work polls its inboxes this long before it
    /// parks (0: park at once). Bounds decision latency under steady load at the
    /// price of up to this much CPU per pass.
    pub model_spin: Dur,
    /// Expected relative load of each model (for balancing; empty = equal).
    pub model_loads: Vec<f64>,
    /// This scheduler is number `.0` of `.1` sharing one plan id space (the
    /// sub-clusters of one process): its plan ids never collide with theirs.
    pub plan_ids: (u32, u32),
}

impl RtConfig {
    pub fn new(dispatcher: DispatcherConfig, model_threads: usize) -> RtConfig {
        RtConfig {
            dispatcher,
            model_threads,
            pin_cpus: None,
            rank_spin: Dur::from_us(100),
            request_chunks_max: 4096,
            model_spin: Dur::from_us(100),
            model_loads: Vec::new(),
            plan_ids: (0, 1),
        }
    }
}

/// Requests handed in together.
struct Chunk {
    handed_in: Time,
    tasks: Vec<(ModelId, Task)>,
}

/// Largest chunk a [`Submitter`] builds before handing it in.
pub const CHUNK_MAX: usize = 256;

enum ModelCtl {
    Add(ModelId, ModelSpec),
    Remove(ModelId),
    SetNet(NetBudget),
    SetMargins(Arc<[Dur]>),
    SetLatencyScales(Arc<[f64]>),
    Shutdown,
}

enum RankMsg {
    FromModels(Vec<ToRank>),
    Report {
        gpu: GpuId,
        plan: PlanId,
        free_at: Time,
    },
    AddModel(ModelId, u32),
    /// A GPU id; in service, or known and out of service at once.
    AddGpu(bool),
    /// A given GPU id (reused, or past the last one), in service or not.
    AddGpuAt(GpuId, bool),
    RemoveGpu(GpuId),
    Shutdown,
}

/// State shared by the handle, submitters and threads.
struct Shared {
    owner: Mutex<Vec<u32>>,
    owner_version: AtomicU64,
    /// Per ModelThread: its models' demand (f64 bits), for the GPU shares.
    demand: Vec<AtomicU64>,
    active_gpus: AtomicU32,
    num_gpus: AtomicU32,
    num_models: AtomicU32,
    accepting: AtomicBool,
    /// Load assigned per ModelThread (f64 bits), for placing added models.
    thread_load: Mutex<Vec<f64>>,
}

/// Per-thread measurements, returned at shutdown.
#[derive(Debug, Clone)]
pub struct ThreadStats {
    pub name: String,
    pub cpu: std::time::Duration,
    /// Request handed in → candidate updated (per chunk: its last request), ns.
    pub decision_ns: Histogram<u64>,
    /// Plan sent − planned send time (exec_at − delay), ns; early sends count 0.
    pub dispatch_error_ns: Histogram<u64>,
    pub requests: u64,
    pub plans: u64,
    pub passes: u64,
    pub parks: u64,
}

impl ThreadStats {
    fn new(name: String) -> ThreadStats {
        ThreadStats {
            name,
            cpu: std::time::Duration::ZERO,
            decision_ns: new_hist(),
            dispatch_error_ns: new_hist(),
            requests: 0,
            plans: 0,
            passes: 0,
            parks: 0,
        }
    }
}

pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid bounds")
}

/// What a scheduler did, returned by [`RtScheduler::shutdown`].
#[derive(Debug, Clone)]
pub struct RtReport {
    pub threads: Vec<ThreadStats>,
    pub counters: Counters,
    pub rank: crate::core::rank::RankStats,
}

impl RtReport {
    pub fn decision_ns(&self) -> Histogram<u64> {
        let mut h = new_hist();
        for t in &self.threads {
            h.add(&t.decision_ns).expect("same bounds");
        }
        h
    }
    pub fn dispatch_error_ns(&self) -> Histogram<u64> {
        let mut h = new_hist();
        for t in &self.threads {
            h.add(&t.dispatch_error_ns).expect("same bounds");
        }
        h
    }
    pub fn cpu(&self) -> std::time::Duration {
        self.threads.iter().map(|t| t.cpu).sum()
    }

    /// The reports of several schedulers (sub-clusters) as one: every thread,
    /// the counters and rank statistics added up.
    pub fn merge(reports: Vec<RtReport>) -> RtReport {
        let mut it = reports.into_iter();
        let mut r = it.next().expect("at least one report");
        for (j, o) in it.enumerate() {
            r.threads.extend(o.threads.into_iter().map(|mut t| {
                t.name = format!("{}/{}", j + 1, t.name);
                t
            }));
            r.counters.add(&o.counters);
            r.rank.grants += o.rank.grants;
            r.rank.expiries += o.rank.expiries;
            r.rank.preemptions += o.rank.preemptions;
            r.rank.stale_candidates += o.rank.stale_candidates;
        }
        r
    }
}

/// Hands requests to the ModelThreads in chunks. One per producer thread.
pub struct Submitter {
    shared: Arc<Shared>,
    owner: Vec<u32>,
    version: u64,
    bufs: Vec<Vec<(ModelId, Task)>>,
    txs: Vec<Sender<Chunk>>,
    unparkers: Vec<Unparker>,
    clock: Clock,
}

impl Submitter {
    /// Buffers a request; a full buffer is handed in at once. Requests refused
    /// (overload, or the scheduler is shutting down) are appended to `refused`.
    #[inline]
    pub fn push(&mut self, model: ModelId, task: Task, refused: &mut Vec<(ModelId, Task)>) {
        if self.shared.owner_version.load(Ordering::Acquire) != self.version {
            self.refresh_owner();
        }
        // Unknown models go to thread 0, whose shard ends them as `ModelRemoved`.
        let t = self.owner.get(model.idx()).copied().unwrap_or(0) as usize;
        self.bufs[t].push((model, task));
        if self.bufs[t].len() >= CHUNK_MAX {
            self.send(t, refused);
        }
    }

    /// Hands every buffered request in.
    pub fn flush(&mut self, refused: &mut Vec<(ModelId, Task)>) {
        for t in 0..self.bufs.len() {
            if !self.bufs[t].is_empty() {
                self.send(t, refused);
            }
        }
    }

    fn refresh_owner(&mut self) {
        let o = self.shared.owner.lock().expect("owner lock");
        self.version = self.shared.owner_version.load(Ordering::Acquire);
        self.owner.clone_from(&o);
    }

    fn send(&mut self, t: usize, refused: &mut Vec<(ModelId, Task)>) {
        let tasks = std::mem::replace(&mut self.bufs[t], Vec::with_capacity(64));
        if !self.shared.accepting.load(Ordering::Acquire) {
            refused.extend(tasks);
            return;
        }
        let chunk = Chunk {
            handed_in: self.clock.now(),
            tasks,
        };
        match self.txs[t].try_send(chunk) {
            Ok(()) => self.unparkers[t].unpark(),
            Err(TrySendError::Full(c)) | Err(TrySendError::Disconnected(c)) => {
                refused.extend(c.tasks)
            }
        }
    }
}

/// A producer's way into the schedulers of several sub-clusters in one
/// process: each task goes to its model's sub-cluster (its home).
pub struct Routed {
    /// Per model id: its sub-cluster.
    home: Vec<u32>,
    subs: Vec<Submitter>,
}

impl Routed {
    /// `subs[j]` is sub-cluster j's submitter; `home[m]` model m's sub-cluster.
    pub fn new(home: Vec<u32>, subs: Vec<Submitter>) -> Routed {
        assert!(!subs.is_empty(), "at least one sub-cluster");
        Routed { home, subs }
    }

    /// One scheduler: every model's home.
    pub fn single(sub: Submitter) -> Routed {
        Routed {
            home: Vec::new(),
            subs: vec![sub],
        }
    }

    #[inline]
    pub fn push(&mut self, model: ModelId, task: Task, refused: &mut Vec<(ModelId, Task)>) {
        let n = self.subs.len();
        let s = self.home.get(model.idx()).copied().unwrap_or(0) as usize;
        self.subs[s.min(n - 1)].push(model, task, refused);
    }

    pub fn flush(&mut self, refused: &mut Vec<(ModelId, Task)>) {
        for s in &mut self.subs {
            s.flush(refused);
        }
    }

    /// `model`'s tasks go to sub-cluster `sub` from now on (those buffered for
    /// its old one still go there).
    pub fn route(&mut self, model: ModelId, sub: u32) {
        if self.home.len() <= model.idx() {
            self.home.resize(model.idx() + 1, 0);
        }
        self.home[model.idx()] = sub;
    }
}

/// Lets a backend report GPU free times (cloneable, any thread).
#[derive(Clone)]
pub struct GpuReporter {
    tx: Sender<RankMsg>,
    unparker: Unparker,
}

impl GpuReporter {
    /// `gpu` is (or will be) free at `free_at` after `plan`.
    pub fn report(&self, gpu: GpuId, plan: PlanId, free_at: Time) {
        if self.tx.send(RankMsg::Report { gpu, plan, free_at }).is_ok() {
            self.unparker.unpark();
        }
    }
}

/// A running real-time scheduler (one dispatcher / sub-cluster).
pub struct RtScheduler {
    shared: Arc<Shared>,
    clock: Clock,
    req_txs: Vec<Sender<Chunk>>,
    ctl_txs: Vec<Sender<ModelCtl>>,
    model_unparkers: Vec<Unparker>,
    rank_tx: Sender<RankMsg>,
    rank_unparker: Unparker,
    threads: Vec<JoinHandle<(ThreadStats, Counters)>>,
    rank_thread: Option<JoinHandle<(ThreadStats, crate::core::rank::RankStats)>>,
}

/// Assigns models to threads: heaviest first, each to the least loaded thread.
pub fn balance(loads: &[f64], threads: usize) -> Vec<u32> {
    let mut order: Vec<usize> = (0..loads.len()).collect();
    order.sort_by(|&a, &b| loads[b].total_cmp(&loads[a]).then(a.cmp(&b)));
    let mut sum = vec![0.0f64; threads.max(1)];
    let mut owner = vec![0u32; loads.len()];
    for m in order {
        let (t, _) = sum
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(&b.0)))
            .expect("threads >= 1");
        owner[m] = t as u32;
        sum[t] += loads[m];
    }
    owner
}

impl RtScheduler {
    /// Starts the RankThread and the ModelThreads.
    pub fn start(
        cfg: RtConfig,
        specs: Vec<ModelSpec>,
        outlet: Arc<dyn Outlet>,
        clock: Clock,
    ) -> Result<RtScheduler> {
        let k = cfg.model_threads;
        if k == 0 {
            bail!("a scheduler needs at least one ModelThread (got --threads 0)");
        }
        if cfg.dispatcher.policy == crate::core::Policy::Nexus {
            bail!("the real-time scheduler runs the central dispatcher; nexus is simulator-only");
        }
        if cfg.request_chunks_max == 0 {
            bail!("request_chunks_max must be at least 1");
        }
        let (sub, subs) = cfg.plan_ids;
        if sub >= subs {
            bail!("plan id space {sub} of {subs}: out of range");
        }
        let loads: Vec<f64> = if cfg.model_loads.len() == specs.len() {
            cfg.model_loads.clone()
        } else {
            vec![1.0; specs.len()]
        };
        let owner = balance(&loads, k);
        let mut thread_load = vec![0.0; k];
        for (m, &t) in owner.iter().enumerate() {
            thread_load[t as usize] += loads[m];
        }
        let shared = Arc::new(Shared {
            owner: Mutex::new(owner.clone()),
            owner_version: AtomicU64::new(1),
            demand: (0..k).map(|_| AtomicU64::new(0f64.to_bits())).collect(),
            active_gpus: AtomicU32::new(cfg.dispatcher.gpus),
            num_gpus: AtomicU32::new(cfg.dispatcher.gpus),
            num_models: AtomicU32::new(specs.len() as u32),
            accepting: AtomicBool::new(true),
            thread_load: Mutex::new(thread_load),
        });
        let pin = |i: usize| -> Option<usize> {
            cfg.pin_cpus
                .as_ref()
                .filter(|c| !c.is_empty())
                .map(|c| c[i % c.len()])
        };

        // Channels. Rank inbox: a few messages per ModelThread pass plus reports.
        let (rank_tx, rank_rx) = bounded::<RankMsg>(65_536);
        let rank_waiter = Waiter::new(cfg.rank_spin).with_yield_every(0);
        let rank_unparker = rank_waiter.unparker();
        let mut req_txs = Vec::new();
        let mut ctl_txs = Vec::new();
        let mut note_txs = Vec::new();
        let mut model_unparkers = Vec::new();
        let mut threads = Vec::new();
        let mut pending = Vec::new();
        for t in 0..k {
            let (req_tx, req_rx) = bounded::<Chunk>(cfg.request_chunks_max);
            let (ctl_tx, ctl_rx) = bounded::<ModelCtl>(1024);
            let (note_tx, note_rx) = bounded::<Vec<RankOutput>>(65_536);
            let waiter = Waiter::new(Dur::ZERO);
            model_unparkers.push(waiter.unparker());
            req_txs.push(req_tx);
            ctl_txs.push(ctl_tx);
            note_txs.push(note_tx);
            // Plan ids: shard t of scheduler `sub` is slot t * subs + sub of k * subs.
            let mut shard = ModelShard::new(
                cfg.dispatcher.clone(),
                t as u32 * subs + sub,
                k as u32 * subs,
            );
            for (m, spec) in specs.iter().enumerate() {
                if owner[m] as usize == t {
                    shard.add_model(ModelId(m as u32), spec.clone());
                }
            }
            pending.push((t, shard, req_rx, ctl_rx, note_rx, waiter));
        }
        let mut ranker = Ranker::new(cfg.dispatcher.policy, cfg.dispatcher.gpus);
        for m in 0..specs.len() {
            ranker.add_model(ModelId(m as u32));
        }
        let rank = RankThread {
            ranker,
            clock,
            rx: rank_rx,
            note_txs,
            model_unparkers: model_unparkers.clone(),
            owner: owner.clone(),
            waiter: rank_waiter,
            shared: shared.clone(),
        };
        let rank_pin = pin(0);
        let rank_thread = std::thread::Builder::new()
            .name("fermata-rank".into())
            .spawn(move || {
                super::pin::set_timer_slack_ns(1);
                if let Some(c) = rank_pin {
                    if let Err(e) = pin_current_thread(c) {
                        eprintln!("warning: {e:#}");
                    }
                }
                rank.run()
            })
            .context("spawning the RankThread")?;
        for (t, shard, req_rx, ctl_rx, note_rx, waiter) in pending {
            let mt = ModelThread {
                idx: t,
                shard,
                clock,
                req_rx,
                ctl_rx,
                note_rx,
                rank_tx: rank_tx.clone(),
                rank_unparker: rank_unparker.clone(),
                outlet: outlet.clone(),
                spin: cfg.model_spin,
                waiter,
                shared: shared.clone(),
                published_demand: 0f64.to_bits(),
                stats: ThreadStats::new(format!("model-{t}")),
                to_rank: Vec::new(),
            };
            let cpu = pin(1 + t);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("fermata-model-{t}"))
                    .spawn(move || {
                        super::pin::set_timer_slack_ns(1);
                        if let Some(c) = cpu {
                            if let Err(e) = pin_current_thread(c) {
                                eprintln!("warning: {e:#}");
                            }
                        }
                        mt.run()
                    })
                    .context("spawning a ModelThread")?,
            );
        }
        Ok(RtScheduler {
            shared,
            clock,
            req_txs,
            ctl_txs,
            model_unparkers,
            rank_tx,
            rank_unparker,
            threads,
            rank_thread: Some(rank_thread),
        })
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }
    pub fn model_threads(&self) -> usize {
        self.req_txs.len()
    }
    pub fn num_models(&self) -> u32 {
        self.shared.num_models.load(Ordering::Acquire)
    }
    pub fn num_gpus(&self) -> u32 {
        self.shared.num_gpus.load(Ordering::Acquire)
    }

    /// A new submitter for a producer thread.
    pub fn submitter(&self) -> Submitter {
        let owner = self.shared.owner.lock().expect("owner lock").clone();
        Submitter {
            version: self.shared.owner_version.load(Ordering::Acquire),
            owner,
            bufs: vec![Vec::new(); self.req_txs.len()],
            txs: self.req_txs.clone(),
            unparkers: self.model_unparkers.clone(),
            shared: self.shared.clone(),
            clock: self.clock,
        }
    }

    /// A handle for backends to report GPU free times.
    pub fn gpu_reporter(&self) -> GpuReporter {
        GpuReporter {
            tx: self.rank_tx.clone(),
            unparker: self.rank_unparker.clone(),
        }
    }

    fn to_rank(&self, msg: RankMsg) {
        // The RankThread runs until shutdown; a send can only fail after it.
        let _ = self.rank_tx.send(msg);
        self.rank_unparker.unpark();
    }

    /// Adds a model while running; returns its id. `load` is its expected relative
    /// load (the model goes to the least loaded ModelThread).
    pub fn add_model(&self, spec: ModelSpec, load: f64) -> ModelId {
        let id = ModelId(self.shared.num_models.fetch_add(1, Ordering::AcqRel));
        let t = {
            let mut tl = self.shared.thread_load.lock().expect("load lock");
            let (t, _) = tl
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .expect("threads >= 1");
            tl[t] += load;
            t
        };
        // The RankThread learns the owner first, then the ModelThread takes the model,
        // then submitters route to it.
        self.to_rank(RankMsg::AddModel(id, t as u32));
        let _ = self.ctl_txs[t].send(ModelCtl::Add(id, spec));
        self.model_unparkers[t].unpark();
        let mut o = self.shared.owner.lock().expect("owner lock");
        if o.len() <= id.idx() {
            o.resize(id.idx() + 1, 0);
        }
        o[id.idx()] = t as u32;
        self.shared.owner_version.fetch_add(1, Ordering::AcqRel);
        id
    }

    /// Removes a model while running: its queued requests end as `ModelRemoved`
    /// drops; batches already dispatched run; later requests for it are dropped.
    pub fn remove_model(&self, id: ModelId) {
        let t = {
            let o = self.shared.owner.lock().expect("owner lock");
            match o.get(id.idx()) {
                Some(&t) => t as usize,
                None => return,
            }
        };
        let _ = self.ctl_txs[t].send(ModelCtl::Remove(id));
        self.model_unparkers[t].unpark();
    }

    /// Changes the network budget (d_ctrl, d_data, response) of every model.
    pub fn set_net(&self, net: NetBudget) {
        for (t, tx) in self.ctl_txs.iter().enumerate() {
            let _ = tx.send(ModelCtl::SetNet(net));
            self.model_unparkers[t].unpark();
        }
    }

    /// Sets the models' measured response margins (`margins[id]`; see
    /// [`crate::core::ModelState::set_margin`]).
    pub fn set_margins(&self, margins: &[Dur]) {
        let m: Arc<[Dur]> = margins.into();
        for (t, tx) in self.ctl_txs.iter().enumerate() {
            let _ = tx.send(ModelCtl::SetMargins(m.clone()));
            self.model_unparkers[t].unpark();
        }
    }

    /// Plans the models with their profiles times `scales[id]` (see
    /// [`crate::core::ModelState::set_latency_scale`]).
    pub fn set_latency_scales(&self, scales: &[f64]) {
        let k: Arc<[f64]> = scales.into();
        for (t, tx) in self.ctl_txs.iter().enumerate() {
            let _ = tx.send(ModelCtl::SetLatencyScales(k.clone()));
            self.model_unparkers[t].unpark();
        }
    }

    /// Adds a GPU (free from now on); returns its id.
    pub fn add_gpu(&self) -> GpuId {
        // The RankThread publishes the count of GPUs in service after each pass.
        let g = GpuId(self.shared.num_gpus.fetch_add(1, Ordering::AcqRel));
        self.to_rank(RankMsg::AddGpu(true));
        g
    }

    /// Takes the next GPU id without ever planning on it: the sub-clusters
    /// of one process share the GPU ids, and each plans only on its own.
    pub fn skip_gpu(&self) -> GpuId {
        let g = GpuId(self.shared.num_gpus.fetch_add(1, Ordering::AcqRel));
        self.to_rank(RankMsg::AddGpu(false));
        g
    }

    /// Gives GPU id `gpu` to a GPU entering now, in service (this
    /// sub-cluster plans on it) or not (another one's): an id past the last
    /// one grows the table, a known one must be out of service and keeps
    /// nothing of its last holder ([`crate::core::rank::Ranker::add_gpu_at`]).
    /// The caller reuses an id only well after it left service, so that no
    /// plan decided on its last holder is still on its way.
    pub fn add_gpu_at(&self, gpu: GpuId, in_service: bool) {
        self.shared.num_gpus.fetch_max(gpu.0 + 1, Ordering::AcqRel);
        self.to_rank(RankMsg::AddGpuAt(gpu, in_service));
    }

    /// Takes a GPU out of service; its booked batches still run.
    pub fn remove_gpu(&self, gpu: GpuId) {
        // Removing a removed or unknown GPU is a no-op in the ranker.
        self.to_rank(RankMsg::RemoveGpu(gpu));
    }

    /// Stops accepting requests, ends every request still queued or in a channel as
    /// an explicit `Shutdown` drop, and joins the threads. Dispatched plans are the
    /// backends' to finish.
    pub fn shutdown(mut self) -> RtReport {
        self.shared.accepting.store(false, Ordering::Release);
        // Our own senders go, so the channels disconnect once the submitters are gone.
        self.req_txs.clear();
        for (t, tx) in self.ctl_txs.iter().enumerate() {
            let _ = tx.send(ModelCtl::Shutdown);
            self.model_unparkers[t].unpark();
        }
        let mut threads = Vec::new();
        let mut counters = Counters::default();
        for h in self.threads.drain(..) {
            let (st, c) = h.join().expect("a ModelThread panicked");
            threads.push(st);
            counters.add(&c);
        }
        self.to_rank(RankMsg::Shutdown);
        let (rs, rank) = self
            .rank_thread
            .take()
            .expect("running")
            .join()
            .expect("the RankThread panicked");
        threads.insert(0, rs);
        RtReport {
            threads,
            counters,
            rank,
        }
    }
}

struct RankThread {
    ranker: Ranker,
    clock: Clock,
    rx: Receiver<RankMsg>,
    note_txs: Vec<Sender<Vec<RankOutput>>>,
    model_unparkers: Vec<Unparker>,
    owner: Vec<u32>,
    waiter: Waiter,
    shared: Arc<Shared>,
}

impl RankThread {
    fn run(mut self) -> (ThreadStats, crate::core::rank::RankStats) {
        let mut stats = ThreadStats::new("rank".into());
        let mut out: Vec<Vec<RankOutput>> = vec![Vec::new(); self.note_txs.len()];
        let mut last = Time::EPOCH_MIN;
        'run: loop {
            stats.passes += 1;
            let now = self.clock.now().max(last);
            last = now;
            loop {
                match self.rx.try_recv() {
                    Ok(RankMsg::FromModels(v)) => {
                        for m in v {
                            self.ranker.handle_from_models(now, m);
                        }
                    }
                    Ok(RankMsg::Report { gpu, plan, free_at }) => {
                        self.ranker.handle_gpu_report(now, gpu, plan, free_at)
                    }
                    Ok(RankMsg::AddModel(id, t)) => {
                        if self.owner.len() <= id.idx() {
                            self.owner.resize(id.idx() + 1, 0);
                        }
                        self.owner[id.idx()] = t;
                        self.ranker.add_model(id);
                    }
                    Ok(RankMsg::AddGpu(in_service)) => {
                        let g = self.ranker.add_gpu();
                        if !in_service {
                            // In the same message: no pass sees it free.
                            self.ranker.remove_gpu(now, g);
                        }
                    }
                    Ok(RankMsg::AddGpuAt(g, in_service)) => {
                        if !self.ranker.add_gpu_at(now, g, in_service) {
                            tracing::warn!(
                                gpu = g.0,
                                "scheduler core: GPU id given while in service; ignored"
                            );
                        }
                    }
                    Ok(RankMsg::RemoveGpu(g)) => self.ranker.remove_gpu(now, g),
                    Ok(RankMsg::Shutdown) | Err(TryRecvError::Disconnected) => break 'run,
                    Err(TryRecvError::Empty) => break,
                }
            }
            self.ranker.handle_timeout(now);
            while let Some(o) = self.ranker.poll_output() {
                let t = self.owner.get(o.model().idx()).copied().unwrap_or(0) as usize;
                out[t].push(o);
            }
            for (t, v) in out.iter_mut().enumerate() {
                if !v.is_empty() {
                    let batch = std::mem::take(v);
                    if self.note_txs[t].send(batch).is_ok() {
                        self.model_unparkers[t].unpark();
                    }
                }
            }
            self.shared
                .active_gpus
                .store(self.ranker.active_gpus(), Ordering::Release);
            let rx = &self.rx;
            let deadline = self.ranker.next_timeout();
            self.waiter
                .wait_until(&self.clock, deadline, || !rx.is_empty());
        }
        stats.cpu = super::cpu::thread_cpu_time();
        stats.parks = self.waiter.stats().parks;
        (stats, self.ranker.stats())
    }
}

struct ModelThread {
    idx: usize,
    shard: ModelShard,
    clock: Clock,
    req_rx: Receiver<Chunk>,
    ctl_rx: Receiver<ModelCtl>,
    note_rx: Receiver<Vec<RankOutput>>,
    rank_tx: Sender<RankMsg>,
    rank_unparker: Unparker,
    outlet: Arc<dyn Outlet>,
    spin: Dur,
    waiter: Waiter,
    shared: Arc<Shared>,
    /// The demand last published (f64 bits).
    published_demand: u64,
    stats: ThreadStats,
    to_rank: Vec<ToRank>,
}

/// How long a shutting-down ModelThread keeps draining its request channel.
const SHUTDOWN_GRACE: Dur = Dur(50_000_000);

/// Chunks a ModelThread takes per pass before it looks at grants again.
const CHUNKS_PER_PASS: usize = 8;

impl ModelThread {
    fn run(mut self) -> (ThreadStats, Counters) {
        let mut last = Time::EPOCH_MIN;
        let mut shutdown_at: Option<Time> = None;
        loop {
            let shutting_down = shutdown_at.is_some();
            self.stats.passes += 1;
            let mut now = self.clock.now().max(last);
            let mut worked = false;
            if self.shard.tick_due(now) {
                // The rate tick's GPU shares need the cluster's state: the GPUs in
                // service (published by the RankThread) and the other threads' demand.
                let others = self.others_demand();
                self.shard
                    .set_cluster(self.shared.active_gpus.load(Ordering::Acquire), others);
            }
            // Grants and expiry notices first: they are the latency-critical input.
            while let Ok(notes) = self.note_rx.try_recv() {
                worked = true;
                for n in notes {
                    self.shard.handle_rank_output(now, n);
                }
            }
            for _ in 0..CHUNKS_PER_PASS {
                let Ok(chunk) = self.req_rx.try_recv() else {
                    break;
                };
                worked = true;
                now = self.clock.now().max(now);
                if shutting_down {
                    self.fail(chunk, now);
                    continue;
                }
                self.stats.requests += chunk.tasks.len() as u64;
                for (m, t) in chunk.tasks {
                    self.shard.handle_request(now, m, t);
                }
                let done = self.clock.now();
                self.stats
                    .decision_ns
                    .saturating_record((done - chunk.handed_in).0.max(1) as u64);
            }
            while let Ok(c) = self.ctl_rx.try_recv() {
                now = self.clock.now().max(now);
                match c {
                    ModelCtl::Add(id, spec) => self.shard.add_model(id, spec),
                    ModelCtl::Remove(id) => self.shard.remove_model(now, id),
                    ModelCtl::SetNet(net) => self.shard.set_net(net),
                    ModelCtl::SetMargins(m) => self.shard.set_margins(&m),
                    ModelCtl::SetLatencyScales(k) => self.shard.set_latency_scales(&k),
                    ModelCtl::Shutdown => {
                        shutdown_at = Some(now);
                        self.shard.drain_all(now);
                    }
                }
            }
            now = self.clock.now().max(now);
            last = now;
            if self.shard.next_timeout().is_some_and(|t| t <= now) {
                self.shard.handle_timeout(now);
            }
            // Publish this thread's demand when a rate tick (in any input) changed it.
            let demand = self.shard.local_demand().to_bits();
            if demand != self.published_demand {
                self.published_demand = demand;
                self.shared.demand[self.idx].store(demand, Ordering::Release);
            }
            self.emit(now);
            if let Some(at) = shutdown_at {
                // Stop once every submitter is gone (the channel disconnects), or
                // after a grace period in which no chunk came: a submitter that saw
                // `accepting` just before it flipped may still hand one in.
                match self.req_rx.try_recv() {
                    Ok(chunk) => {
                        self.fail(chunk, now);
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break,
                    Err(TryRecvError::Empty) if now - at > SHUTDOWN_GRACE => break,
                    Err(TryRecvError::Empty) => {}
                }
            }
            let (req, note, ctl) = (&self.req_rx, &self.note_rx, &self.ctl_rx);
            if worked && self.spin > Dur::ZERO {
                let out = self.waiter.spin_until(&self.clock, now + self.spin, || {
                    !note.is_empty() || !req.is_empty() || !ctl.is_empty()
                });
                if out == WaitOutcome::Work {
                    continue;
                }
            }
            let deadline = match shutdown_at {
                Some(at) => Some(at + SHUTDOWN_GRACE + Dur(1)),
                None => self.shard.next_timeout(),
            };
            self.waiter.wait_until(&self.clock, deadline, || {
                !note.is_empty() || !req.is_empty() || !ctl.is_empty()
            });
        }
        self.stats.cpu = super::cpu::thread_cpu_time();
        self.stats.parks = self.waiter.stats().parks;
        (self.stats, self.shard.counters().clone())
    }

    /// Ends a chunk that arrived during shutdown: each request fails explicitly.
    fn fail(&self, chunk: Chunk, now: Time) {
        for (m, t) in chunk.tasks {
            self.outlet.drop_task(m, t, DropReason::Shutdown, now);
        }
    }

    fn others_demand(&self) -> f64 {
        self.shared
            .demand
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.idx)
            .map(|(_, d)| f64::from_bits(d.load(Ordering::Acquire)))
            .sum()
    }

    /// Sends the candidates and GPU bookings to the RankThread, plans to backends and
    /// drops to frontends.
    fn emit(&mut self, now: Time) {
        self.shard.flush();
        while let Some(m) = self.shard.poll_rank() {
            self.to_rank.push(m);
        }
        if !self.to_rank.is_empty() {
            let v = std::mem::take(&mut self.to_rank);
            if self.rank_tx.send(RankMsg::FromModels(v)).is_ok() {
                self.rank_unparker.unpark();
            }
        }
        let delay = self.shard.config().net;
        while let Some(o) = self.shard.poll_output() {
            match o {
                Output::Dispatch(p) => {
                    let sent = self.clock.now();
                    let planned = p.exec_at - delay.delay(p.tasks.len() as u32);
                    self.stats
                        .dispatch_error_ns
                        .saturating_record((sent - planned).0.max(1) as u64);
                    self.stats.plans += 1;
                    self.outlet.dispatch(p, sent);
                }
                Output::Drop {
                    model,
                    task,
                    reason,
                } => self.outlet.drop_task(model, task, reason, now),
                Output::Preempt { .. } => {}
            }
        }
    }
}
