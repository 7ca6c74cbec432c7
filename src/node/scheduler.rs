//! The scheduler process: the real-time scheduler ([`RtScheduler`]) behind a
//! transport. Nodes (backends and frontends) connect, register and heartbeat; tasks
//! come in `Submit` messages; batch plans go out to the backend owning the GPU, drop
//! notices to the frontend owning the task.
//!
//! # Registration
//! * A **backend** sends `Register` with its GPUs. The scheduler answers with a
//!   `LoadModel` per model and a `FrontendUp` per frontend; when each model id is
//!   confirmed by a `ModelLoaded`, it sends `RegisterAck` with the GPUs' global ids
//!   and only then puts the GPUs in service, so no plan reaches a backend before
//!   its models.
//!
//! Membership, health, the network budget and the checks on what nodes send are
//! the sans-IO machine [`super::proto::sched::SchedProto`]; this file is its
//! driver (threads, sockets, the OS clock) and the dispatch path of the core.
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
use super::proto::plans::PlanLedger;
use super::proto::sched::{plan_msg, plan_tasks, Action, SchedConfig, SchedProto};
use crate::core::{DropReason, Dur, GpuId, ModelId, ModelSpec, Plan, Task, Time};
use crate::metrics::{Counter, Gauge, Histogram, Kind, Registry, BATCH_BUCKETS};
use crate::runtime::clock::Clock;
use crate::runtime::sched::{GpuReporter, Outlet, RtConfig, RtReport, RtScheduler, Submitter};
use crate::transport::{Conn, ConnId, Event, Listener, Transport};
use crate::wire::{ModelInfo, Msg, NodeId};
use crate::workload::Workload;
use anyhow::Result;
use crossbeam_channel::RecvTimeoutError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The window of the GPU busy fractions in the metrics.
pub const BUSY_WINDOW: Duration = Duration::from_secs(10);

pub use crate::wire::{task_owner, TASK_SEQ_BITS};

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

pub use super::proto::sched::SchedReport;

struct GpuRoute {
    conn: Arc<dyn Conn>,
    backend: NodeId,
}

/// Where plans and drops go; shared by the ModelThreads and the event loop.
struct Routes {
    gpus: RwLock<Vec<Option<GpuRoute>>>,
    frontends: RwLock<HashMap<NodeId, Arc<dyn Conn>>>,
    /// In flight plans (the protocol machine's ledger).
    plans: Arc<Mutex<PlanLedger>>,
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
pub fn drop_reason_label(c: DropReason) -> &'static str {
    match c {
        DropReason::Expired => "expired",
        DropReason::EarlyDrop => "early_drop",
        DropReason::QueueFull => "queue_full",
        DropReason::ModelRemoved => "model_removed",
        DropReason::Overloaded => "overloaded",
        DropReason::Shutdown => "shutdown",
        DropReason::TooLate => "too_late",
        DropReason::BackendLost => "backend_lost",
        DropReason::UnknownModel => "unknown_model",
        DropReason::NoGpu => "no_gpu",
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
            drops: DropReason::ALL
                .iter()
                .map(|&c| {
                    reg.counter(
                        "fermata_scheduler_dropped_total",
                        "Tasks the scheduler dropped or failed, by reason.",
                        &[("reason", drop_reason_label(c))],
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

    fn dropped(&self, c: DropReason, n: u64) {
        self.drops[c.index()].add(n);
    }
}

impl Routes {
    /// Tells the tasks' frontends they were dropped.
    fn notify(&self, tasks: impl IntoIterator<Item = u64>, code: DropReason) {
        let mut by_fe: HashMap<NodeId, Vec<(u64, DropReason)>> = HashMap::new();
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
}

impl Outlet for Routes {
    fn dispatch(&self, plan: Plan, sent_at: Time) {
        let tasks = {
            let fes = self.frontends.read().expect("routes lock");
            plan_tasks(&plan, |fe| fes.contains_key(&fe))
        };
        // The route lookup and the plan's record happen under the routes' read
        // lock: once a backend's routes are gone (write lock), no plan of it can
        // be recorded after the driver collects the last ones (`gpus_down`).
        let ntasks = tasks.len();
        let conn = {
            let g = self.gpus.read().expect("routes lock");
            let route = g
                .get(plan.gpu.idx())
                .and_then(|r| r.as_ref())
                .map(|r| (r.conn.clone(), r.backend));
            let Some((conn, backend)) = route else {
                drop(g);
                // The GPU's backend is gone (its GPUs are leaving service).
                self.lost.fetch_add(ntasks as u64, Ordering::Relaxed);
                self.notify(tasks.iter().map(|t| t.id), DropReason::BackendLost);
                return;
            };
            if tasks.is_empty() {
                drop(g);
                // Every task's frontend is gone: the GPU is free again now.
                if let Some(r) = self.reporter.get() {
                    r.report(plan.gpu, plan.id, self.clock.now());
                }
                return;
            }
            let ids: Vec<u64> = tasks.iter().map(|t| t.id).collect();
            self.plans
                .lock()
                .expect("plans lock")
                .sent(plan.id, backend, plan.gpu, ids);
            conn
        };
        let msg = plan_msg(&plan, tasks, sent_at);
        self.plans_sent.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.metrics.plans.get(plan.model.idx()) {
            c.inc();
            self.metrics.batch[plan.model.idx()].observe(ntasks as u64);
        }
        if conn.send(msg).is_err() {
            let lost = self.plans.lock().expect("plans lock").unsent(plan.id);
            if !lost.is_empty() {
                self.lost.fetch_add(lost.len() as u64, Ordering::Relaxed);
                self.notify(lost, DropReason::BackendLost);
            }
        }
    }

    fn drop_task(&self, _model: ModelId, task: Task, reason: DropReason, _at: Time) {
        // Called once per dropped task from the ModelThreads: straight to its
        // frontend, without `notify`'s grouping.
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.metrics.dropped(reason, 1);
        let fes = self.frontends.read().expect("routes lock");
        if let Some(c) = fes.get(&task_owner(task.id.0)) {
            let _ = c.send(Msg::Dropped {
                items: vec![(task.id.0, reason)],
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
        let mut dcfg = workload.dispatcher_config(workload.policy, false);
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
        let models = super::exec::model_infos(workload);
        let proto = SchedProto::new(
            SchedClock::exact(clock).now(),
            SchedConfig {
                models: models.clone(),
                heartbeat: Dur(opts.heartbeat.as_nanos() as i64),
                node_timeout: Dur(opts.node_timeout.as_nanos() as i64),
                net_update: Dur(opts.net_update.as_nanos() as i64),
                floors,
                max_ctrl: opts.max_ctrl,
                max_data: opts.max_data,
            },
        );
        let registry = Registry::new();
        let routes = Arc::new(Routes {
            gpus: RwLock::new(Vec::new()),
            frontends: RwLock::new(HashMap::new()),
            plans: proto.plans(),
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
        let (tx, rx) = super::event_channel(&registry, "scheduler");
        let listener = transport.listen(&opts.listen, tx)?;
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let reporter = rt.gpu_reporter();
        let ev = EventLoop {
            reporter,
            rt: Some(rt),
            routes,
            clock: SchedClock::exact(clock),
            proto,
            conns: HashMap::new(),
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

struct EventLoop {
    rt: Option<RtScheduler>,
    routes: Arc<Routes>,
    clock: SchedClock,
    /// Membership, health, the network budget and the checks (sans-IO).
    proto: SchedProto,
    conns: HashMap<ConnId, Arc<dyn Conn>>,
    reporter: GpuReporter,
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
        let mut next_busy = Instant::now();
        let mut refused = Vec::new();
        while !stop.load(Ordering::Acquire) {
            let due = self.proto.poll_timeout();
            let wait = Duration::from_nanos((due - self.clock.now()).0.max(0) as u64);
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
            let now = self.clock.now();
            if now >= self.proto.poll_timeout() {
                self.proto.handle_timeout(now);
                self.apply(&mut sub, &mut refused);
            }
            let now = Instant::now();
            if now >= next_busy {
                next_busy = now + Duration::from_secs(1);
                self.update_busy(now);
            }
        }
        // Stop: close every connection, then drain the scheduler (its drops go to
        // frontends that are already closed: they fail their own pending tasks).
        for c in self.conns.values() {
            c.close("scheduler stopping");
        }
        let rt = self.rt.take().expect("running");
        drop(sub);
        let rep: RtReport = rt.shutdown();
        let mut report = self.proto.report().clone();
        report.tasks_received = rep.counters.received;
        report.plans_sent = self.routes.plans_sent.load(Ordering::Relaxed);
        report.tasks_failed_backend_lost += self.routes.lost.load(Ordering::Relaxed);
        report.tasks_dropped += self.routes.dropped.load(Ordering::Relaxed);
        Ok(report)
    }

    fn refuse(&self, refused: &mut Vec<(ModelId, Task)>) {
        if !refused.is_empty() {
            self.routes
                .dropped
                .fetch_add(refused.len() as u64, Ordering::Relaxed);
            self.routes.notify(
                refused.drain(..).map(|(_, t)| t.id.0),
                DropReason::Overloaded,
            );
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

    fn handle(&mut self, ev: Event, sub: &mut Submitter, refused: &mut Vec<(ModelId, Task)>) {
        let now = self.clock.now();
        match ev {
            Event::Accepted(conn) => {
                let c = conn.id();
                self.conns.insert(c, conn);
                self.proto.handle_accept(now, c);
            }
            Event::Closed(c, reason) => self.proto.handle_closed(now, c, reason),
            Event::Msg(c, msg) => self.proto.handle_msg(now, c, msg),
        }
        self.apply(sub, refused);
    }

    /// Carries out what the protocol machine decided.
    fn apply(&mut self, sub: &mut Submitter, refused: &mut Vec<(ModelId, Task)>) {
        let mut up = Vec::new();
        while let Some(a) = self.proto.poll_action() {
            match a {
                Action::Send(c, m) => {
                    if let Msg::Dropped { items } = &m {
                        for &(_, code) in items {
                            self.routes.metrics.dropped(code, 1);
                        }
                    }
                    if let Some(conn) = self.conns.get(&c) {
                        let _ = conn.send(m);
                    }
                }
                Action::Close(c, why) => {
                    if let Some(conn) = self.conns.remove(&c) {
                        conn.close(&why);
                    }
                }
                Action::GpusUp {
                    conn,
                    backend,
                    gpus,
                } => {
                    // Routes first; the ack follows as the next action; the GPUs
                    // enter the core after it, so a plan can only follow the ack.
                    let Some(conn) = self.conns.get(&conn).cloned() else {
                        continue;
                    };
                    let mut g = self.routes.gpus.write().expect("routes lock");
                    for &id in &gpus {
                        if g.len() <= id.idx() {
                            g.resize_with(id.idx() + 1, || None);
                        }
                        g[id.idx()] = Some(GpuRoute {
                            conn: conn.clone(),
                            backend,
                        });
                    }
                    up.extend(gpus);
                }
                Action::GpusDown { backend, gpus } => self.gpus_down(backend, &gpus),
                Action::FrontendUp { conn, node } => {
                    if let Some(conn) = self.conns.get(&conn).cloned() {
                        self.routes
                            .frontends
                            .write()
                            .expect("routes lock")
                            .insert(node, conn);
                    }
                }
                Action::FrontendDown { node } => {
                    self.routes
                        .frontends
                        .write()
                        .expect("routes lock")
                        .remove(&node);
                }
                Action::Submit(tasks) => {
                    for (m, t) in tasks {
                        if let Some(c) = self.routes.metrics.tasks.get(m.idx()) {
                            c.inc();
                        }
                        sub.push(m, t, refused);
                    }
                }
                Action::PlanDone {
                    gpu,
                    plan,
                    finished,
                    busy,
                } => {
                    if let Some(b) = self.busy.get_mut(gpu.idx()) {
                        b.total_ns = b.total_ns.saturating_add(busy.0);
                    }
                    self.reporter.report(gpu, plan, finished);
                }
                Action::SetNet(net) => {
                    self.rt().set_net(net);
                    self.routes.metrics.d_ctrl.set(net.ctrl.as_secs_f64());
                    self.routes
                        .metrics
                        .d_data
                        .set(net.data_per_req.as_secs_f64());
                }
                Action::DeviceBytes { model, bytes } => {
                    if let Some(g) = self.routes.metrics.device_bytes.get(model as usize) {
                        g.set(bytes as f64);
                    }
                    tracing::info!(model, bytes, "scheduler: model's device footprint");
                }
            }
        }
        if !up.is_empty() {
            let now = Instant::now();
            for id in up {
                let got = self.rt().add_gpu();
                debug_assert_eq!(got, id);
                if self.busy.len() <= id.idx() {
                    self.busy.resize_with(id.idx() + 1, GpuBusy::default);
                }
                let b = &mut self.busy[id.idx()];
                b.in_service = true;
                b.window.clear();
                b.window.push(now, b.total_ns, BUSY_WINDOW);
            }
        }
    }

    /// A backend's GPUs leave service.
    fn gpus_down(&mut self, backend: NodeId, gpus: &[GpuId]) {
        {
            let mut g = self.routes.gpus.write().expect("routes lock");
            for &id in gpus {
                if let Some(r) = g.get_mut(id.idx()) {
                    *r = None;
                }
            }
        }
        for &id in gpus {
            self.rt().remove_gpu(id);
            if let Some(b) = self.busy.get_mut(id.idx()) {
                b.in_service = false;
            }
        }
        // Plans dispatched while the protocol removed the backend (a RankThread
        // holds the routes' read lock from route lookup to recording the plan):
        // with the routes gone none can follow, so these are the last ones.
        let late = self
            .routes
            .plans
            .lock()
            .expect("plans lock")
            .take_backend(backend);
        if !late.is_empty() {
            self.routes
                .lost
                .fetch_add(late.len() as u64, Ordering::Relaxed);
            self.routes.notify(late, DropReason::BackendLost);
        }
    }
}
