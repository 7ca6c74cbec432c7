//! The scheduler process: the real-time scheduler ([`RtScheduler`]) behind a
//! transport. Nodes (backends and frontends) connect, register and heartbeat; tasks
//! come in `Submit` messages; batch plans go out to the backend owning the GPU, drop
//! notices to the frontend owning the task.
//!
//! # Registration
//! * A **backend** sends `Register` with its GPUs. The scheduler answers with a
//!   `LoadModel` per model and a `FrontendUp` per frontend; when every model is
//!   loaded (`ModelLoaded`), it sends `RegisterAck` with the GPUs' global ids and only
//!   then puts the GPUs in service, so no plan reaches a backend before its models.
//! * A **frontend** sends `Register` with its input region; it gets `RegisterAck` with
//!   the models, then `Capacity` (the GPUs in service), and every backend gets
//!   `FrontendUp`. Every frontend gets a new `Capacity` whenever the number of GPUs
//!   in service changes; a task submitted while none is in service is dropped at
//!   once as `NoGpu`.
//!
//! # Failures
//! * A node whose connection ends, or that sends no `Ping` for `node_timeout`, is
//!   removed. A backend's GPUs leave service at once and every plan it had not
//!   reported done ends as `Dropped(BackendLost)` at the tasks' frontends.
//! * A frontend that is gone has its tasks dropped where they are next seen: plans
//!   leave its tasks out (a plan left empty frees its GPU at once) and drop notices for
//!   it are not sent. Backends get `FrontendDown` and stop reading its region.
//! * A malformed frame closes that connection (the transport logs why); a message a
//!   node's role should not send closes that node's connection with a logged reason.
//!
//! # Network budget (Appendix D)
//! d_ctrl and d_data are measured, not guessed: backends report the p99.9
//! ([`crate::wire::NET_QUANTILE`]) of their recent control delay (the larger of
//! the plans' one-way delay, measured from the plan's send time on the
//! scheduler's clock, and half the ping round trip) and of their input pull time
//! per task; every `net_update` (200 ms) the scheduler sets d_ctrl = max(floor,
//! that + 10%) and d_data = max(floor, that of the pull time per task), over its
//! backends, and hands it to every ModelThread. Results travel one hop back to the
//! frontend, so the response budget (`resp`) gets the same value as d_ctrl. A
//! backend's measurements from its pings before registering apply as soon as its
//! GPUs enter service. The floors are the workload's
//! `[network]` values;
//! the measured parts are capped (`max_ctrl`, `max_data`, default 2 ms and 500 us)
//! so that a burst of slow probes cannot make every request unschedulable.
//!
//! # Metrics
//! [`SchedulerNode::metrics`] has the scheduler's Prometheus series: tasks, plans
//! and batch sizes per model, drops per reason, the network budget, and per GPU its
//! busy seconds and busy fraction over the last [`BUSY_WINDOW`] (from the start and
//! finish times backends report in `PlanDone`), with the mean over the
//! sub-cluster. One scheduler is one sub-cluster: its GPUs carry
//! `subcluster="0"`.

use super::clock::SchedClock;
use super::exec::wire_profile;
use crate::core::{
    DropReason, Dur, GpuId, ModelId, ModelSpec, NetBudget, Plan, Task, TaskId, Time,
};
use crate::metrics::{Counter, Gauge, Histogram, Kind, Registry, BATCH_BUCKETS};
use crate::runtime::clock::Clock;
use crate::runtime::sched::{GpuReporter, Outlet, RtConfig, RtReport, RtScheduler, Submitter};
use crate::transport::{Conn, ConnId, Event, Listener, Transport};
use crate::wire::{DropCode, ModelInfo, Msg, NodeId, PlanTask, Role};
use crate::workload::Workload;
use anyhow::Result;
use crossbeam_channel::{unbounded, RecvTimeoutError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The window of the GPU busy fractions in the metrics.
pub const BUSY_WINDOW: Duration = Duration::from_secs(10);

/// Bits of a task id below the frontend's node id.
pub const TASK_SEQ_BITS: u32 = 40;

/// The node (frontend) that owns a task.
#[inline]
pub fn task_owner(id: u64) -> NodeId {
    (id >> TASK_SEQ_BITS) as NodeId
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct SchedulerOpts {
    pub listen: String,
    pub model_threads: usize,
    /// How often nodes ping (told to them in `RegisterAck`).
    pub heartbeat: Duration,
    /// A node silent this long is removed.
    pub node_timeout: Duration,
    /// How often the measured network budget is applied.
    pub net_update: Duration,
    /// RankThread spin before a timer, and ModelThread poll before parking (see
    /// [`RtConfig`]); 0 saves CPU where the scheduler shares few cores.
    pub rank_spin: Dur,
    pub model_spin: Dur,
    /// Ceilings on the measured d_ctrl and d_data (per task): a burst of slow
    /// probes must not make every request unschedulable.
    pub max_ctrl: Dur,
    pub max_data: Dur,
    /// Floor on the frontrun slack ([`NetBudget::slack`]): how long before its
    /// latest start a deferred batch is planned at the latest, for the timing
    /// error of real threads and networks.
    pub min_slack: Dur,
}

impl Default for SchedulerOpts {
    fn default() -> Self {
        SchedulerOpts {
            listen: "127.0.0.1:0".into(),
            model_threads: 1,
            heartbeat: Duration::from_millis(100),
            node_timeout: Duration::from_millis(1000),
            net_update: Duration::from_millis(200),
            rank_spin: Dur::from_us(100),
            model_spin: Dur::from_us(100),
            max_ctrl: Dur::from_us(2000),
            max_data: Dur::from_us(500),
            min_slack: Dur::from_us(500),
        }
    }
}

/// What a scheduler reports when it stops.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SchedReport {
    pub backends_registered: u32,
    pub frontends_registered: u32,
    /// Removed for a failure (connection broken, heartbeat timeout, protocol error).
    pub backends_lost: u32,
    pub frontends_lost: u32,
    /// Left on purpose (`Unregister`).
    pub backends_left: u32,
    pub frontends_left: u32,
    pub tasks_received: u64,
    pub plans_sent: u64,
    pub plans_done: u64,
    pub tasks_failed_backend_lost: u64,
    pub tasks_dropped: u64,
    pub connections_closed_for_errors: u64,
    /// Last applied d_ctrl / d_data (per task), microseconds.
    pub d_ctrl_us: f64,
    pub d_data_us: f64,
    /// Backends' last reported control delay and pull time per task at p99.9 (us).
    pub ctrl_delay_us: f64,
    pub pull_us: f64,
}

struct GpuRoute {
    conn: Arc<dyn Conn>,
    backend: NodeId,
}

struct InFlight {
    backend: NodeId,
    tasks: Vec<u64>,
}

/// Where plans and drops go; shared by the ModelThreads and the event loop.
struct Routes {
    gpus: RwLock<Vec<Option<GpuRoute>>>,
    frontends: RwLock<HashMap<NodeId, Arc<dyn Conn>>>,
    inflight: Mutex<HashMap<u64, InFlight>>,
    reporter: OnceLock<GpuReporter>,
    clock: Clock,
    plans_sent: AtomicU64,
    lost: AtomicU64,
    dropped: AtomicU64,
    metrics: SchedMetrics,
}

/// The scheduler's hot-path metrics (per model by id, per drop code by tag).
struct SchedMetrics {
    tasks: Vec<Arc<Counter>>,
    plans: Vec<Arc<Counter>>,
    batch: Vec<Arc<Histogram>>,
    drops: Vec<Arc<Counter>>,
    d_ctrl: Arc<Gauge>,
    /// Device memory each model takes on a GPU, as its backends report it.
    device_bytes: Vec<Arc<Gauge>>,
    d_data: Arc<Gauge>,
}

/// The label of a drop code.
pub fn drop_code_label(c: DropCode) -> &'static str {
    match c {
        DropCode::Expired => "expired",
        DropCode::EarlyDrop => "early_drop",
        DropCode::QueueFull => "queue_full",
        DropCode::ModelRemoved => "model_removed",
        DropCode::Overloaded => "overloaded",
        DropCode::Shutdown => "shutdown",
        DropCode::TooLate => "too_late",
        DropCode::BackendLost => "backend_lost",
        DropCode::UnknownModel => "unknown_model",
        DropCode::NoGpu => "no_gpu",
    }
}

impl SchedMetrics {
    fn new(reg: &Registry, models: &[ModelInfo]) -> SchedMetrics {
        let per = |f: &dyn Fn(&str) -> Arc<Counter>| -> Vec<Arc<Counter>> {
            models.iter().map(|m| f(&m.name)).collect()
        };
        SchedMetrics {
            tasks: per(&|m| {
                reg.counter(
                    "fermata_scheduler_tasks_total",
                    "Tasks submitted to the scheduler by frontends.",
                    &[("model", m)],
                )
            }),
            plans: per(&|m| {
                reg.counter(
                    "fermata_scheduler_plans_total",
                    "Batch plans sent to backends.",
                    &[("model", m)],
                )
            }),
            batch: models
                .iter()
                .map(|m| {
                    reg.histogram(
                        "fermata_scheduler_batch_size",
                        "Tasks per batch plan sent (frontends gone are left out).",
                        &[("model", &m.name)],
                        Histogram::new(BATCH_BUCKETS, 1.0),
                    )
                })
                .collect(),
            drops: DropCode::ALL
                .iter()
                .map(|&c| {
                    reg.counter(
                        "fermata_scheduler_dropped_total",
                        "Tasks the scheduler dropped or failed, by reason.",
                        &[("reason", drop_code_label(c))],
                    )
                })
                .collect(),
            device_bytes: models
                .iter()
                .map(|m| {
                    reg.gauge(
                        "fermata_model_device_bytes",
                        "Device memory a model takes on one GPU (all its bucket sessions), as the last backend to load it measured; 0 when not measured.",
                        &[("model", &m.name)],
                    )
                })
                .collect(),
            d_ctrl: reg.gauge(
                "fermata_scheduler_d_ctrl_seconds",
                "The control-delay budget d_ctrl in use (measured, Appendix D).",
                &[],
            ),
            d_data: reg.gauge(
                "fermata_scheduler_d_data_seconds",
                "The input-transfer budget per task d_data in use.",
                &[],
            ),
        }
    }

    fn dropped(&self, c: DropCode, n: u64) {
        self.drops[c.index()].add(n);
    }
}

fn drop_code(r: DropReason) -> DropCode {
    match r {
        DropReason::Expired => DropCode::Expired,
        DropReason::EarlyDrop => DropCode::EarlyDrop,
        DropReason::QueueFull => DropCode::QueueFull,
        DropReason::ModelRemoved => DropCode::ModelRemoved,
        DropReason::Overloaded => DropCode::Overloaded,
        DropReason::Shutdown => DropCode::Shutdown,
    }
}

impl Routes {
    /// Tells the tasks' frontends they were dropped.
    fn notify(&self, tasks: impl IntoIterator<Item = u64>, code: DropCode) {
        let mut by_fe: HashMap<NodeId, Vec<(u64, DropCode)>> = HashMap::new();
        let mut n = 0;
        for t in tasks {
            by_fe.entry(task_owner(t)).or_default().push((t, code));
            n += 1;
        }
        self.metrics.dropped(code, n);
        let fes = self.frontends.read().expect("routes lock");
        for (fe, items) in by_fe {
            if let Some(c) = fes.get(&fe) {
                let _ = c.send(Msg::Dropped { items });
            }
        }
    }

    /// Ends every in-flight plan of `backend` as BackendLost.
    fn fail_backend(&self, backend: NodeId) -> u64 {
        let lost: Vec<InFlight> = {
            let mut inf = self.inflight.lock().expect("inflight lock");
            let ids: Vec<u64> = inf
                .iter()
                .filter(|(_, f)| f.backend == backend)
                .map(|(&id, _)| id)
                .collect();
            ids.iter().filter_map(|id| inf.remove(id)).collect()
        };
        let n: u64 = lost.iter().map(|f| f.tasks.len() as u64).sum();
        self.lost.fetch_add(n, Ordering::Relaxed);
        self.notify(
            lost.into_iter().flat_map(|f| f.tasks),
            DropCode::BackendLost,
        );
        n
    }
}

impl Outlet for Routes {
    fn dispatch(&self, plan: Plan, sent_at: Time) {
        let tasks: Vec<PlanTask> = {
            let fes = self.frontends.read().expect("routes lock");
            plan.tasks
                .iter()
                .filter(|t| fes.contains_key(&task_owner(t.id.0)))
                .map(|t| PlanTask {
                    id: t.id.0,
                    deadline_ns: t.deadline.0,
                    input: t.tag,
                })
                .collect()
        };
        let route = {
            let g = self.gpus.read().expect("routes lock");
            g.get(plan.gpu.idx())
                .and_then(|r| r.as_ref())
                .map(|r| (r.conn.clone(), r.backend))
        };
        let Some((conn, backend)) = route else {
            // The GPU's backend is gone (its GPUs are leaving service).
            self.lost.fetch_add(tasks.len() as u64, Ordering::Relaxed);
            self.notify(tasks.iter().map(|t| t.id), DropCode::BackendLost);
            return;
        };
        if tasks.is_empty() {
            // Every task's frontend is gone: the GPU is free again now.
            if let Some(r) = self.reporter.get() {
                r.report(plan.gpu, plan.id, self.clock.now());
            }
            return;
        }
        let ids: Vec<u64> = tasks.iter().map(|t| t.id).collect();
        let ntasks = ids.len();
        self.inflight.lock().expect("inflight lock").insert(
            plan.id.0,
            InFlight {
                backend,
                tasks: ids,
            },
        );
        let msg = Msg::Plan {
            id: plan.id.0,
            model: plan.model.0,
            gpu: plan.gpu.0,
            exec_at_ns: plan.exec_at.0,
            finish_at_ns: plan.finish_at.0,
            sent_ns: sent_at.0,
            tasks,
        };
        self.plans_sent.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.metrics.plans.get(plan.model.idx()) {
            c.inc();
            self.metrics.batch[plan.model.idx()].observe(ntasks as u64);
        }
        if conn.send(msg).is_err() {
            let f = self
                .inflight
                .lock()
                .expect("inflight lock")
                .remove(&plan.id.0);
            if let Some(f) = f {
                self.lost.fetch_add(f.tasks.len() as u64, Ordering::Relaxed);
                self.notify(f.tasks, DropCode::BackendLost);
            }
        }
    }

    fn drop_task(&self, _model: ModelId, task: Task, reason: DropReason, _at: Time) {
        // Called once per dropped task from the ModelThreads: straight to its
        // frontend, without `notify`'s grouping.
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.metrics.dropped(drop_code(reason), 1);
        let fes = self.frontends.read().expect("routes lock");
        if let Some(c) = fes.get(&task_owner(task.id.0)) {
            let _ = c.send(Msg::Dropped {
                items: vec![(task.id.0, drop_code(reason))],
            });
        }
    }
}

/// A running scheduler process (its event loop thread and the real-time scheduler).
pub struct SchedulerNode {
    addr: String,
    metrics: Arc<Registry>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<SchedReport>>>,
}

impl SchedulerNode {
    /// Starts serving `workload`'s models at `opts.listen`, with no GPUs until
    /// backends register.
    pub fn start(
        transport: Arc<dyn Transport>,
        workload: &Workload,
        opts: SchedulerOpts,
    ) -> Result<SchedulerNode> {
        if matches!(
            workload.policy,
            crate::core::Policy::Nexus | crate::core::Policy::Shepherd { .. }
        ) {
            anyhow::bail!(
                "policy `{}` is simulator-only; the distributed runtime runs deferred, eager or timeout",
                workload.policy
            );
        }
        let clock = Clock::new();
        let mut dcfg = crate::sim::dispatcher_config(workload, workload.policy, false);
        dcfg.gpus = 0;
        dcfg.net.slack = dcfg.net.slack.max(opts.min_slack);
        let floors = dcfg.net;
        let mut rcfg = RtConfig::new(dcfg, opts.model_threads);
        rcfg.rank_spin = opts.rank_spin;
        rcfg.model_spin = opts.model_spin;
        rcfg.model_loads = workload
            .models
            .iter()
            .map(|m| m.share * m.spec.profile.latency(1).as_secs_f64())
            .collect();
        let specs: Vec<ModelSpec> = workload.models.iter().map(|m| m.spec.clone()).collect();
        let models: Vec<ModelInfo> = workload
            .models
            .iter()
            .enumerate()
            .map(|(i, m)| ModelInfo {
                id: i as u32,
                name: m.spec.name.clone(),
                slo_ns: m.spec.slo.0,
                profile: wire_profile(&m.spec.profile),
                input_bytes: m.input_bytes,
                meta_json: m
                    .meta
                    .as_ref()
                    .map(|x| serde_json::to_string(x).expect("metadata serializes"))
                    .unwrap_or_default(),
            })
            .collect();
        let registry = Registry::new();
        let routes = Arc::new(Routes {
            gpus: RwLock::new(Vec::new()),
            frontends: RwLock::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            reporter: OnceLock::new(),
            clock,
            plans_sent: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            metrics: SchedMetrics::new(&registry, &models),
        });
        let busy = Arc::new(Mutex::new(Vec::<GpuSnap>::new()));
        register_gpu_metrics(&registry, busy.clone());
        let rt = RtScheduler::start(rcfg, specs, routes.clone(), clock)?;
        let _ = routes.reporter.set(rt.gpu_reporter());
        let (tx, rx) = unbounded();
        let listener = transport.listen(&opts.listen, tx)?;
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let reporter = rt.gpu_reporter();
        let ev = EventLoop {
            reporter,
            opts,
            rt: Some(rt),
            routes,
            clock: SchedClock::exact(clock),
            models,
            floors,
            net: floors,
            conns: HashMap::new(),
            next_node: 1,
            report: SchedReport::default(),
            gpus_in_service: 0,
            busy: Vec::new(),
            busy_snap: busy,
            _listener: listener,
        };
        let submitter = ev.rt.as_ref().expect("rt").submitter();
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("sched-net".into())
            .spawn(move || ev.run(rx, submitter, &stop2))?;
        Ok(SchedulerNode {
            addr,
            metrics: registry,
            stop,
            handle: Some(handle),
        })
    }

    /// Where nodes connect.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The scheduler's Prometheus metrics.
    pub fn metrics(&self) -> Arc<Registry> {
        self.metrics.clone()
    }

    /// Stops: queued tasks end as `Shutdown` drops at their frontends, every
    /// connection closes.
    pub fn stop(mut self) -> Result<SchedReport> {
        self.stop.store(true, Ordering::Release);
        let h = self.handle.take().expect("joined once");
        h.join()
            .map_err(|_| anyhow::anyhow!("the scheduler's event loop panicked"))?
    }
}

impl Drop for SchedulerNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

enum NodeState {
    /// Connected, not registered (may ping to sync its clock).
    New,
    /// A backend loading its models.
    Loading {
        node: NodeId,
        gpus: u32,
        pending: u32,
    },
    Backend {
        node: NodeId,
        gpus: Vec<GpuId>,
    },
    Frontend {
        node: NodeId,
        /// The `FrontendUp` that announces it to backends.
        up: Msg,
    },
}

struct ConnState {
    conn: Arc<dyn Conn>,
    state: NodeState,
    last_seen: Instant,
    /// What the node last measured (from its pings, also those sent before it
    /// registered): control delay and pull time per task, ns.
    ctrl_delay: i64,
    pull: i64,
}

struct EventLoop {
    opts: SchedulerOpts,
    rt: Option<RtScheduler>,
    routes: Arc<Routes>,
    clock: SchedClock,
    models: Vec<ModelInfo>,
    floors: NetBudget,
    net: NetBudget,
    conns: HashMap<ConnId, ConnState>,
    next_node: NodeId,
    report: SchedReport,
    reporter: GpuReporter,
    /// GPUs in service (what frontends learn in `Capacity`).
    gpus_in_service: u32,
    /// Per global GPU id: busy time, for the metrics.
    busy: Vec<GpuBusy>,
    busy_snap: Arc<Mutex<Vec<GpuSnap>>>,
    _listener: Box<dyn Listener>,
}

/// A GPU's busy time as backends report it.
#[derive(Default)]
struct GpuBusy {
    in_service: bool,
    /// Sum of (finish - start) of its batches, ns.
    total_ns: i64,
    /// total_ns over the last BUSY_WINDOW.
    window: crate::metrics::Window<i64>,
}

/// What the metrics show of a GPU (refreshed every second).
#[derive(Clone, Copy)]
struct GpuSnap {
    gpu: u32,
    in_service: bool,
    busy_s: f64,
    /// Busy fraction over the last BUSY_WINDOW (or since it entered service).
    ratio: f64,
}

/// The mean busy fraction of the GPUs in service (None when there is none).
fn mean_busy(v: &[GpuSnap]) -> Option<f64> {
    let (n, sum) = v
        .iter()
        .filter(|g| g.in_service)
        .fold((0usize, 0.0), |(n, s), g| (n + 1, s + g.ratio));
    (n > 0).then(|| sum / n as f64)
}

fn register_gpu_metrics(reg: &Registry, snap: Arc<Mutex<Vec<GpuSnap>>>) {
    let sub = || ("subcluster".to_string(), "0".to_string());
    let s = snap.clone();
    reg.collector(
        "fermata_gpu_busy_seconds_total",
        "Seconds a GPU ran batches (start to finish as its backend reports them).",
        Kind::Counter,
        move || {
            let v = s.lock().expect("busy lock");
            v.iter()
                .map(|g| (vec![("gpu".into(), g.gpu.to_string()), sub()], g.busy_s))
                .collect()
        },
    );
    let s = snap.clone();
    reg.collector(
        "fermata_gpu_busy_ratio",
        "Busy fraction of each GPU in service over the last 10 s (idle = 1 - busy).",
        Kind::Gauge,
        move || {
            let v = s.lock().expect("busy lock");
            v.iter()
                .filter(|g| g.in_service)
                .map(|g| (vec![("gpu".into(), g.gpu.to_string()), sub()], g.ratio))
                .collect()
        },
    );
    let s = snap.clone();
    reg.collector(
        "fermata_subcluster_busy_ratio",
        "Mean busy fraction of the sub-cluster's GPUs in service over the last 10 s.",
        Kind::Gauge,
        move || {
            let mean = mean_busy(&s.lock().expect("busy lock"));
            vec![(vec![sub()], mean.unwrap_or(0.0))]
        },
    );
    let s = snap.clone();
    reg.collector(
        "fermata_subcluster_idle_ratio",
        "Mean idle fraction of the sub-cluster's GPUs in service over the last 10 s.",
        Kind::Gauge,
        move || {
            let mean = mean_busy(&s.lock().expect("busy lock"));
            vec![(vec![sub()], mean.map_or(0.0, |m| 1.0 - m))]
        },
    );
    reg.collector(
        "fermata_subcluster_gpus_in_service",
        "GPUs in service in the sub-cluster.",
        Kind::Gauge,
        move || {
            let v = snap.lock().expect("busy lock");
            let n = v.iter().filter(|g| g.in_service).count();
            vec![(vec![sub()], n as f64)]
        },
    );
}

impl EventLoop {
    fn rt(&self) -> &RtScheduler {
        self.rt.as_ref().expect("running")
    }

    fn run(
        mut self,
        rx: crossbeam_channel::Receiver<Event>,
        mut sub: Submitter,
        stop: &AtomicBool,
    ) -> Result<SchedReport> {
        let mut next_check = Instant::now() + self.opts.heartbeat;
        let mut next_net = Instant::now() + self.opts.net_update;
        let mut next_busy = Instant::now();
        let mut refused = Vec::new();
        while !stop.load(Ordering::Acquire) {
            let wait = next_check.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait.min(Duration::from_millis(50))) {
                Ok(ev) => {
                    self.handle(ev, &mut sub, &mut refused);
                    // A bounded batch before flushing the submitter, so heartbeats
                    // and timeouts keep their pace under any load.
                    for _ in 0..256 {
                        match rx.try_recv() {
                            Ok(ev) => self.handle(ev, &mut sub, &mut refused),
                            Err(_) => break,
                        }
                    }
                    sub.flush(&mut refused);
                    self.refuse(&mut refused);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let now = Instant::now();
            if now >= next_check {
                next_check = now + self.opts.heartbeat;
                self.check_timeouts(now);
            }
            if now >= next_net {
                next_net = now + self.opts.net_update;
                self.update_net();
            }
            if now >= next_busy {
                next_busy = now + Duration::from_secs(1);
                self.update_busy(now);
            }
        }
        // Stop: close every connection, then drain the scheduler (its drops go to
        // frontends that are already closed: they fail their own pending tasks).
        for c in self.conns.values() {
            c.conn.close("scheduler stopping");
        }
        let rt = self.rt.take().expect("running");
        drop(sub);
        let rep: RtReport = rt.shutdown();
        self.report.tasks_received = rep.counters.received;
        self.report.plans_sent = self.routes.plans_sent.load(Ordering::Relaxed);
        self.report.tasks_failed_backend_lost = self.routes.lost.load(Ordering::Relaxed);
        self.report.tasks_dropped = self.routes.dropped.load(Ordering::Relaxed);
        Ok(self.report)
    }

    fn refuse(&self, refused: &mut Vec<(ModelId, Task)>) {
        if !refused.is_empty() {
            self.routes
                .dropped
                .fetch_add(refused.len() as u64, Ordering::Relaxed);
            self.routes
                .notify(refused.drain(..).map(|(_, t)| t.id.0), DropCode::Overloaded);
        }
    }

    /// Refreshes the GPUs' busy fractions for the metrics.
    fn update_busy(&mut self, now: Instant) {
        let snap: Vec<GpuSnap> = self
            .busy
            .iter_mut()
            .enumerate()
            .map(|(i, b)| {
                let (t0, n0) = b.window.push(now, b.total_ns, BUSY_WINDOW);
                let span = now.duration_since(t0).as_nanos() as f64;
                let ratio = if span > 0.0 {
                    ((b.total_ns - n0) as f64 / span).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                GpuSnap {
                    gpu: i as u32,
                    in_service: b.in_service,
                    busy_s: b.total_ns as f64 / 1e9,
                    ratio,
                }
            })
            .collect();
        *self.busy_snap.lock().expect("busy lock") = snap;
    }

    /// Tells every frontend (or only `to`) how many GPUs are in service.
    fn send_capacity(&self, to: Option<&Arc<dyn Conn>>) {
        let msg = Msg::Capacity {
            gpus: self.gpus_in_service,
        };
        match to {
            Some(c) => {
                let _ = c.send(msg);
            }
            None => {
                for c in self.routes.frontends.read().expect("routes lock").values() {
                    let _ = c.send(msg.clone());
                }
            }
        }
    }

    /// Closes `c` for a protocol error and removes its node.
    fn reject(&mut self, c: ConnId, why: String) {
        tracing::warn!(conn = c, reason = %why, "scheduler: closing connection");
        self.report.connections_closed_for_errors += 1;
        if let Some(cs) = self.conns.get(&c) {
            let _ = cs.conn.send(Msg::Error {
                message: why.clone(),
            });
            cs.conn.close(&why);
        }
        self.lost(c, why);
    }

    fn handle(&mut self, ev: Event, sub: &mut Submitter, refused: &mut Vec<(ModelId, Task)>) {
        match ev {
            Event::Accepted(conn) => {
                self.conns.insert(
                    conn.id(),
                    ConnState {
                        conn,
                        state: NodeState::New,
                        last_seen: Instant::now(),
                        ctrl_delay: 0,
                        pull: 0,
                    },
                );
            }
            Event::Closed(c, reason) => self.lost(c, reason),
            Event::Msg(c, msg) => {
                let Some(cs) = self.conns.get_mut(&c) else {
                    return;
                };
                cs.last_seen = Instant::now();
                match msg {
                    Msg::Ping {
                        seq,
                        sent_ns,
                        ctrl_delay_ns,
                        pull_ns,
                    } => {
                        cs.ctrl_delay = ctrl_delay_ns;
                        cs.pull = pull_ns;
                        let _ = cs.conn.send(Msg::Pong {
                            seq,
                            echo_ns: sent_ns,
                            sched_ns: self.clock.now().0,
                        });
                    }
                    Msg::Submit { tasks } => {
                        if !matches!(cs.state, NodeState::Frontend { .. }) {
                            return self.reject(
                                c,
                                "Submit from a node that is not a registered frontend".into(),
                            );
                        }
                        let node = match cs.state {
                            NodeState::Frontend { node, .. } => node,
                            _ => unreachable!(),
                        };
                        let nm = self.models.len() as u32;
                        let no_gpu = self.gpus_in_service == 0;
                        let mut unknown = Vec::new();
                        let mut refused_no_gpu = Vec::new();
                        for t in tasks {
                            if task_owner(t.id) != node {
                                return self.reject(
                                    c,
                                    format!(
                                        "task id {} does not carry the frontend's node id {node}",
                                        t.id
                                    ),
                                );
                            }
                            if t.model >= nm {
                                unknown.push(t.id);
                                continue;
                            }
                            self.routes.metrics.tasks[t.model as usize].inc();
                            if no_gpu {
                                refused_no_gpu.push(t.id);
                                continue;
                            }
                            sub.push(
                                ModelId(t.model),
                                Task {
                                    id: TaskId(t.id),
                                    arrival: Time(t.arrival_ns),
                                    deadline: Time(t.deadline_ns),
                                    tag: t.input,
                                },
                                refused,
                            );
                        }
                        if !unknown.is_empty() {
                            self.routes.notify(unknown, DropCode::UnknownModel);
                        }
                        if !refused_no_gpu.is_empty() {
                            self.routes
                                .dropped
                                .fetch_add(refused_no_gpu.len() as u64, Ordering::Relaxed);
                            self.routes.notify(refused_no_gpu, DropCode::NoGpu);
                        }
                    }
                    Msg::Register {
                        role,
                        name,
                        gpus,
                        ctrl_addr,
                        region,
                    } => {
                        if !matches!(cs.state, NodeState::New) {
                            return self.reject(c, "second Register on one connection".into());
                        }
                        let node = self.next_node;
                        if node >= 1 << 24 {
                            return self.reject(c, "out of node ids".into());
                        }
                        self.next_node += 1;
                        match role {
                            Role::Backend => {
                                if gpus.is_empty() {
                                    return self.reject(
                                        c,
                                        "a backend must register at least one GPU".into(),
                                    );
                                }
                                for m in &self.models {
                                    let _ = cs.conn.send(Msg::LoadModel { model: m.clone() });
                                }
                                cs.state = NodeState::Loading {
                                    node,
                                    gpus: gpus.len() as u32,
                                    pending: self.models.len() as u32,
                                };
                                // Frontends it must know before any plan.
                                let conn = cs.conn.clone();
                                for up in self.frontend_ups() {
                                    let _ = conn.send(up);
                                }
                                tracing::info!(
                                    backend = %name,
                                    node,
                                    gpus = gpus.len(),
                                    "scheduler: backend registers"
                                );
                                if self.models.is_empty() {
                                    self.backend_ready(c);
                                }
                            }
                            Role::Frontend => {
                                let Some(region) = region else {
                                    return self.reject(
                                        c,
                                        "a frontend must register its input region".into(),
                                    );
                                };
                                let up = Msg::FrontendUp {
                                    node,
                                    ctrl_addr,
                                    region,
                                };
                                cs.state = NodeState::Frontend {
                                    node,
                                    up: up.clone(),
                                };
                                let conn = cs.conn.clone();
                                self.routes
                                    .frontends
                                    .write()
                                    .expect("routes lock")
                                    .insert(node, conn.clone());
                                let _ = conn.send(Msg::RegisterAck {
                                    node,
                                    gpu_ids: Vec::new(),
                                    models: self.models.clone(),
                                    heartbeat_ms: self.opts.heartbeat.as_millis() as u32,
                                });
                                self.send_capacity(Some(&conn));
                                for other in self.conns.values() {
                                    if matches!(
                                        other.state,
                                        NodeState::Backend { .. } | NodeState::Loading { .. }
                                    ) {
                                        let _ = other.conn.send(up.clone());
                                    }
                                }
                                self.report.frontends_registered += 1;
                                tracing::info!(frontend = %name, node, "scheduler: frontend registered");
                            }
                        }
                    }
                    Msg::ModelLoaded {
                        model,
                        ok,
                        error,
                        device_bytes,
                    } => {
                        let NodeState::Loading { pending, .. } = &mut cs.state else {
                            return self
                                .reject(c, "ModelLoaded from a node that is not loading".into());
                        };
                        if !ok {
                            let why = format!("backend failed to load model {model}: {error}");
                            return self.reject(c, why);
                        }
                        if device_bytes > 0 {
                            if let Some(g) = self.routes.metrics.device_bytes.get(model as usize) {
                                g.set(device_bytes as f64);
                            }
                            tracing::info!(
                                model,
                                device_bytes,
                                "scheduler: model's device footprint"
                            );
                        }
                        *pending = pending.saturating_sub(1);
                        if *pending == 0 {
                            self.backend_ready(c);
                        }
                    }
                    Msg::PlanDone {
                        id,
                        gpu,
                        started_ns,
                        finished_ns,
                        ..
                    } => {
                        if !matches!(cs.state, NodeState::Backend { .. }) {
                            return self
                                .reject(c, "PlanDone from a node that is not a backend".into());
                        }
                        self.report.plans_done += 1;
                        if let Some(b) = self.busy.get_mut(gpu as usize) {
                            b.total_ns += (finished_ns - started_ns).max(0);
                        }
                        self.routes
                            .inflight
                            .lock()
                            .expect("inflight lock")
                            .remove(&id);
                        self.reporter.report(
                            GpuId(gpu),
                            crate::core::PlanId(id),
                            Time(finished_ns),
                        );
                    }
                    Msg::Unregister { reason } => {
                        let conn = cs.conn.clone();
                        conn.close(&format!("unregistered: {reason}"));
                        self.remove_node(c, format!("unregistered: {reason}"), true);
                    }
                    other => {
                        let k = other.kind();
                        self.reject(c, format!("unexpected message {k} at the scheduler"));
                    }
                }
            }
        }
    }
}

impl EventLoop {
    fn frontend_ups(&self) -> Vec<Msg> {
        self.conns
            .values()
            .filter_map(|c| match &c.state {
                NodeState::Frontend { up, .. } => Some(up.clone()),
                _ => None,
            })
            .collect()
    }

    /// A backend loaded every model: its GPUs go into service.
    fn backend_ready(&mut self, c: ConnId) {
        let rt = self.rt.as_ref().expect("running");
        let Some(cs) = self.conns.get_mut(&c) else {
            return;
        };
        let NodeState::Loading { node, gpus, .. } = cs.state else {
            return;
        };
        // Only this thread adds GPUs, so the ids are the next ones in order. Routes
        // first, then the ack, then the GPUs: a plan can only follow the ack.
        let first = rt.num_gpus();
        let ids: Vec<GpuId> = (first..first + gpus).map(GpuId).collect();
        {
            let mut g = self.routes.gpus.write().expect("routes lock");
            if g.len() < (first + gpus) as usize {
                g.resize_with((first + gpus) as usize, || None);
            }
            for &id in &ids {
                g[id.idx()] = Some(GpuRoute {
                    conn: cs.conn.clone(),
                    backend: node,
                });
            }
        }
        let _ = cs.conn.send(Msg::RegisterAck {
            node,
            gpu_ids: ids.iter().map(|g| g.0).collect(),
            models: self.models.clone(),
            heartbeat_ms: self.opts.heartbeat.as_millis() as u32,
        });
        for &id in &ids {
            let got = rt.add_gpu();
            debug_assert_eq!(got, id);
        }
        cs.state = NodeState::Backend {
            node,
            gpus: ids.clone(),
        };
        self.report.backends_registered += 1;
        let now = Instant::now();
        for &id in &ids {
            if self.busy.len() <= id.idx() {
                self.busy.resize_with(id.idx() + 1, GpuBusy::default);
            }
            let b = &mut self.busy[id.idx()];
            b.in_service = true;
            b.window.clear();
            b.window.push(now, b.total_ns, BUSY_WINDOW);
        }
        self.gpus_in_service += gpus;
        self.send_capacity(None);
        tracing::info!(
            node,
            first_gpu = first,
            gpus,
            "scheduler: backend in service"
        );
        // Its measurements so far (from the pings before it registered) count at
        // once, before the first plan.
        self.update_net();
    }

    /// Connection `c` is gone (closed, broken, timed out or rejected).
    fn lost(&mut self, c: ConnId, reason: String) {
        self.remove_node(c, reason, false)
    }

    /// Connection `c`'s node is gone; `graceful` when it said goodbye.
    fn remove_node(&mut self, c: ConnId, reason: String, graceful: bool) {
        let Some(cs) = self.conns.remove(&c) else {
            return;
        };
        cs.conn.close(&reason);
        match cs.state {
            NodeState::New => {}
            NodeState::Loading { node, .. } => {
                tracing::warn!(node, %reason, "scheduler: backend lost while loading");
            }
            NodeState::Backend { node, gpus, .. } => {
                {
                    let mut g = self.routes.gpus.write().expect("routes lock");
                    for &id in &gpus {
                        g[id.idx()] = None;
                    }
                }
                for &id in &gpus {
                    self.rt().remove_gpu(id);
                    if let Some(b) = self.busy.get_mut(id.idx()) {
                        b.in_service = false;
                    }
                }
                self.gpus_in_service -= gpus.len() as u32;
                self.send_capacity(None);
                let n = self.routes.fail_backend(node);
                if graceful {
                    self.report.backends_left += 1;
                } else {
                    self.report.backends_lost += 1;
                }
                if graceful {
                    tracing::info!(node, gpus = gpus.len(), %reason, "scheduler: backend left");
                } else {
                    tracing::warn!(
                        node,
                        gpus = gpus.len(),
                        failed_tasks = n,
                        %reason,
                        "scheduler: backend removed; its GPUs are out of service and its in-flight tasks failed"
                    );
                }
            }
            NodeState::Frontend { node, .. } => {
                self.routes
                    .frontends
                    .write()
                    .expect("routes lock")
                    .remove(&node);
                for other in self.conns.values() {
                    if matches!(
                        other.state,
                        NodeState::Backend { .. } | NodeState::Loading { .. }
                    ) {
                        let _ = other.conn.send(Msg::FrontendDown { node });
                    }
                }
                if graceful {
                    self.report.frontends_left += 1;
                } else {
                    self.report.frontends_lost += 1;
                }
                if graceful {
                    tracing::info!(node, %reason, "scheduler: frontend left");
                } else {
                    tracing::warn!(
                        node,
                        %reason,
                        "scheduler: frontend removed; its tasks are dropped"
                    );
                }
            }
        }
    }

    /// Removes registered nodes that stopped pinging.
    fn check_timeouts(&mut self, now: Instant) {
        let dead: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, cs)| {
                matches!(
                    cs.state,
                    NodeState::Backend { .. } | NodeState::Frontend { .. }
                ) && now.duration_since(cs.last_seen) > self.opts.node_timeout
            })
            .map(|(&c, _)| c)
            .collect();
        for c in dead {
            let why = format!("no heartbeat for {} ms", self.opts.node_timeout.as_millis());
            self.lost(c, why);
        }
    }

    /// Applies the measured d_ctrl / d_data (never below the configured floors).
    fn update_net(&mut self) {
        let (mut rtt, mut pull, mut n) = (0i64, 0i64, 0);
        for cs in self.conns.values() {
            if let NodeState::Backend { .. } = cs.state {
                rtt = rtt.max(cs.ctrl_delay);
                pull = pull.max(cs.pull);
                n += 1;
            }
        }
        if n == 0 {
            // Nothing measured: keep the last budget.
            return;
        }
        self.report.ctrl_delay_us = rtt as f64 / 1e3;
        self.report.pull_us = pull as f64 / 1e3;
        let net = NetBudget {
            ctrl: self
                .floors
                .ctrl
                .max(Dur(rtt + rtt / 10).min(self.opts.max_ctrl)),
            data_per_req: self
                .floors
                .data_per_req
                .max(Dur(pull).min(self.opts.max_data)),
            // Results travel one hop (backend to frontend), like a plan.
            resp: self
                .floors
                .resp
                .max(Dur(rtt + rtt / 10).min(self.opts.max_ctrl)),
            slack: self.floors.slack,
        };
        let changed = |a: Dur, b: Dur| (a.0 - b.0).abs() * 10 > b.0.max(1_000);
        if changed(net.ctrl, self.net.ctrl)
            || changed(net.data_per_req, self.net.data_per_req)
            || changed(net.resp, self.net.resp)
        {
            tracing::info!(
                d_ctrl_us = net.ctrl.as_us_f64(),
                d_data_us = net.data_per_req.as_us_f64(),
                "scheduler: network budget changed"
            );
            self.net = net;
            self.rt().set_net(net);
        }
        self.report.d_ctrl_us = self.net.ctrl.as_us_f64();
        self.report.d_data_us = self.net.data_per_req.as_us_f64();
        self.routes.metrics.d_ctrl.set(self.net.ctrl.as_secs_f64());
        self.routes
            .metrics
            .d_data
            .set(self.net.data_per_req.as_secs_f64());
    }
}
