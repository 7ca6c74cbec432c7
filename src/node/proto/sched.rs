//! The scheduler's node protocol as a pure state machine: membership
//! (registration, model loading matched by id, removal), health (heartbeat
//! timeouts), the measured network budget (Appendix D) and the checks on what
//! nodes send. The real driver ([`crate::node::scheduler`]) and the cluster
//! simulator feed it connection events with the scheduler's time and carry out
//! the [`Action`]s it returns; the scheduling core runs beside it (the driver
//! hands it [`Action::Submit`] tasks and GPU changes).
//!
//! # Registration
//! * A **backend** sends `Register` with its GPUs. It is answered with a
//!   `LoadModel` per model and a `FrontendUp` per frontend; when each model id
//!   has been confirmed by a `ModelLoaded` (a duplicate is ignored, an unknown id
//!   is a protocol error), it gets `RegisterAck` with its GPUs' global ids, and
//!   only then do the GPUs go into service ([`Action::GpusUp`]), so no plan
//!   reaches a backend before its models.
//! * A **frontend** sends `Register` with its input region; it gets `RegisterAck`
//!   with the models, then `Capacity`; every backend gets `FrontendUp`.
//!
//! # Checks
//! Every value a node sends goes through [`super::check`] first. A backend may
//! only report plans that are its own, on the GPU they were sent to
//! ([`super::plans::PlanLedger`]); a frontend may only submit tasks that carry its
//! node id, with deadlines within bounds. A violation closes that node's
//! connection with the reason ([`Action::Close`] after an `Error`).
//!
//! # Terms and stepping down
//! The scheduler serves under a term ([`SchedProto::term`]): 1 for a primary
//! started alone, one more than the highest it saw for a standby that took
//! over ([`SchedProto::set_term`]). Every `Pong` and `RegisterAck` carries it;
//! nodes refuse a scheduler of a term older than one they have seen, and
//! everything it sends ([`super::member`]). It **steps down**
//! ([`Action::StepDown`]: an `Error` naming the newer term to every
//! connection, then it serves no more) when it learns of a newer term:
//! - a `Fence` from a scheduler of a newer term, or of its own term (the
//!   standby that replaced it sends one to its address while it serves; at
//!   an equal term it took over before it learnt this one's term, and the
//!   tie goes to it: [`super::fence::on_fence`]), or
//! - a node's `Ping` carrying a newer term, once a standby followed this
//!   scheduler (so one may have replaced it).
//!
//! A scheduler that no standby ever followed cannot have been replaced by a
//! takeover: a node's newer term comes from an earlier cluster whose
//! schedulers are gone (the whole control plane restarted), and it serves on
//! above that term. A `Fence` of an older term is answered with a `Fence` of
//! this one (its sender then steps down).

use super::app_totals::AppTotals;
use super::bounds::{GpuIds, Limits, RefusalLog};
use super::check::{self, Submitted};
use super::control::{Control, ControlMode};
use super::devices::Devices;
use super::latency_scale::{LatencyScaleConfig, LatencyScaleStats, LatencyWatch};
use super::plans::{PlanLedger, Refused};
use super::subclusters::{Move, MoveStats, Phase, SubClusters};
use crate::core::{Dur, GpuId, ModelId, NetBudget, PlanId, PullFit, Task, TaskId, Time};
use crate::node::clock::moved;
use crate::transport::ConnId;
use crate::wire::{
    drops_by_frontend, task_owner, AppCounters, DeviceCounts, DropReason, ModelAvailability,
    ModelInfo, Msg, NodeId, PlanTask, RegionInfo, Role, MAX_NODE_ID,
};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// A plan's tasks as the wire carries them, leaving out those whose frontend
/// is gone (`live` says which are up).
pub fn plan_tasks(plan: &crate::core::Plan, live: impl Fn(NodeId) -> bool) -> Vec<PlanTask> {
    plan.tasks
        .iter()
        .filter(|t| live(task_owner(t.id)))
        .map(|t| PlanTask {
            id: t.id,
            deadline: t.deadline,
            input: t.tag,
            cap: t.cap,
        })
        .collect()
}

/// The `Plan` message of `plan` with its wire `tasks`, sent at `sent`.
pub fn plan_msg(plan: &crate::core::Plan, tasks: Vec<PlanTask>, sent: Time) -> Msg {
    Msg::Plan {
        id: plan.id,
        model: plan.model,
        gpu: plan.gpu,
        exec_at: plan.exec_at,
        finish_at: plan.finish_at,
        sent,
        tasks,
    }
}

/// Response margins move the core's plans only by more than a tenth of this
/// (20 us) or of their last value ([`moved`]).
pub const MARGIN_FLOOR: Dur = Dur(200_000);

/// The fixed part of the pull budget is capped at this many times `max_data`
/// (the cap per task): a run of stalled pulls cannot make every request
/// unschedulable.
pub const DATA_FIXED_CAP: i64 = 10;

/// The scheduler's protocol settings.
#[derive(Debug, Clone)]
pub struct SchedConfig {
    pub models: Vec<ModelInfo>,
    /// How often nodes ping (told to them in `RegisterAck`).
    pub heartbeat: Dur,
    /// A registered node silent this long is removed.
    pub node_timeout: Dur,
    /// The plan watchdog: a backend with a plan not reported done by its
    /// planned end plus `max(plan_grace, l(b))` is removed
    /// ([`super::plans::PlanLedger::overdue`]).
    pub plan_grace: Dur,
    /// How often the measured network budget is recomputed.
    pub net_update: Dur,
    /// The workload's network budget: floors under the measured one.
    pub floors: NetBudget,
    /// Ceilings on the measured d_ctrl and d_data (per task).
    pub max_ctrl: Dur,
    pub max_data: Dur,
    /// Ceiling on a model's response margin as frontends report it.
    pub max_margin: Dur,
    /// The sub-clusters and each model's home at the start
    /// ([`SubClusters::single`]: one dispatcher for every GPU and model).
    pub subclusters: SubClusters,
    /// Members registered at once, and GPUs per backend
    /// ([`super::bounds`]).
    pub limits: Limits,
    /// When a model's profile is planned scaled to its measured latency
    /// ([`super::latency_scale`]).
    pub latency: LatencyScaleConfig,
}

/// What the scheduler counted (also its report when it stops).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SchedReport {
    pub backends_registered: u32,
    pub frontends_registered: u32,
    /// Removed for a failure (connection broken, heartbeat timeout, protocol
    /// error, overdue plan).
    pub backends_lost: u32,
    /// Of those, removed by the plan watchdog.
    pub backends_overdue: u32,
    pub frontends_lost: u32,
    /// Left on purpose (`Unregister`).
    pub backends_left: u32,
    /// Asked to drain (`Drain`).
    pub backends_drained: u32,
    pub frontends_left: u32,
    pub tasks_received: u64,
    pub plans_sent: u64,
    pub plans_done: u64,
    /// `PlanDone`s for plans not in flight (reported twice, or never sent): ignored.
    pub stray_plan_done: u64,
    pub tasks_failed_backend_lost: u64,
    pub tasks_dropped: u64,
    /// Tasks of plans that backends reported finished past the task's deadline
    /// (scheduler time).
    pub tasks_late: u64,
    pub connections_closed_for_errors: u64,
    /// Registrations refused for the limits (members, GPUs per member).
    pub refused_for_limits: u64,
    /// Last applied d_ctrl, and the input pull budget: its fixed part per
    /// batch and its part per task (d_data), microseconds.
    pub d_ctrl_us: f64,
    pub d_data_fixed_us: f64,
    pub d_data_us: f64,
    /// What a batch's pull holds its GPU's puller in use: per batch and per
    /// task, microseconds.
    pub hold_fixed_us: f64,
    pub hold_us: f64,
    /// Backends' last reported control delay at p99.9, and their largest pull
    /// cost per batch: the fixed part and the part per MiB (us).
    pub ctrl_delay_us: f64,
    pub pull_us: f64,
    pub pull_per_mib_us: f64,
    /// The largest response margin given to the core (us).
    pub margin_max_us: f64,
    /// Sub-clusters, and the models' moves between them.
    pub subclusters: u32,
    pub moves: MoveStats,
    /// Each model's latency scale at the end (by name; 1: planned with its
    /// profile as given), and the batches measured for it
    /// ([`super::latency_scale`]).
    pub model_latency_scale: std::collections::BTreeMap<String, f64>,
    pub latency: LatencyScaleStats,
}

/// The lanes per device a backend registered: one value for all its GPUs,
/// 1 to [`MAX_LANES`](crate::node::backend::lanes::MAX_LANES), dividing their
/// number (each device registers all its lanes).
fn lanes_of(gpu_infos: &[crate::wire::GpuInfo]) -> Result<u32, String> {
    use crate::node::backend::lanes::MAX_LANES;
    let lanes = gpu_infos.first().map_or(1, |g| g.lanes);
    if let Some(g) = gpu_infos.iter().find(|g| g.lanes != lanes) {
        return Err(format!(
            "a backend's GPUs must have one lane count; got {lanes} and {}",
            g.lanes
        ));
    }
    if lanes == 0 || lanes > MAX_LANES {
        return Err(format!(
            "a GPU's lanes must be 1 to {MAX_LANES}, got {lanes}"
        ));
    }
    if !gpu_infos.len().is_multiple_of(lanes as usize) {
        return Err(format!(
            "{} GPU slots are not whole devices of {lanes} lanes",
            gpu_infos.len()
        ));
    }
    Ok(lanes)
}

/// A peer's name as a refusal quotes it: at most 64 characters.
fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

/// What the driver must do.
#[derive(Debug, Clone)]
pub enum Action {
    /// Send a message on a connection.
    Send(ConnId, Msg),
    /// Close a connection (this machine has already forgotten it).
    Close(ConnId, String),
    /// A backend's GPUs enter service, in this order. Their ids are free
    /// ones given again or the next ones past the last (the first GPU ever is
    /// 0); an id given again left service at least
    /// [`super::bounds::GPU_ID_QUARANTINE`] before, with its last holder's
    /// `GpusDown` ([`super::bounds`]).
    GpusUp {
        conn: ConnId,
        backend: NodeId,
        gpus: Vec<GpuId>,
        /// The sub-cluster whose dispatcher plans on them.
        subcluster: u32,
    },
    /// Model `model`'s new tasks go to sub-cluster `subcluster`'s dispatcher
    /// from now on (its GPUs all hold it); those queued at its old one stay
    /// there (see [`super::subclusters`]).
    Route { model: ModelId, subcluster: u32 },
    /// A backend's GPUs leave service (its plans were failed already).
    GpusDown { backend: NodeId, gpus: Vec<GpuId> },
    /// A frontend joined: drops for its tasks go to `conn`.
    FrontendUp { conn: ConnId, node: NodeId },
    /// A frontend is gone: its tasks are dropped where they are next seen.
    FrontendDown { node: NodeId },
    /// Checked tasks for the core.
    Submit(Vec<(ModelId, Task)>),
    /// `plan` on `gpu` finished at `finished`; the GPU ran it for `busy`.
    PlanDone {
        gpu: GpuId,
        plan: PlanId,
        finished: Time,
        busy: Dur,
    },
    /// A new network budget for the core.
    SetNet(NetBudget),
    /// New response margins for the core, per model id (see
    /// [`crate::core::ModelState::set_margin`]).
    SetMargins(Vec<Dur>),
    /// New latency scales for the core, per model id: a model's batches are
    /// planned with its profile times its scale (see
    /// [`crate::core::ModelState::set_latency_scale`] and
    /// [`super::latency_scale`]).
    SetLatencyScales(Vec<f64>),
    /// A backend measured a model's device memory on one GPU.
    DeviceBytes { model: ModelId, bytes: u64 },
    /// A backend drains: its GPUs leave the core (no new plan on them); their
    /// routes stay for the plans in flight.
    GpusDraining { backend: NodeId, gpus: Vec<GpuId> },
    /// A scheduler of a newer term serves: this one was replaced. Every
    /// connection was sent an `Error` and closed; the machine ignores all
    /// input from now on, and its process stops serving (the driver ends it).
    StepDown { term: u64, why: String },
}

/// How long a draining backend's GPUs are out of the core before it may hear
/// `Drained`: a plan the RankThread decided just before it saw the removal is
/// recorded in the ledger well within this.
pub const DRAIN_QUIET: Dur = Dur(100_000_000);

/// A model moving into a sub-cluster whose backends have not all confirmed it
/// this long after the move started (a load that hangs, or a sub-cluster
/// without a GPU in service) stays home: the move is aborted, and another can
/// be tried at the next epoch.
pub const MOVE_LOAD_TIMEOUT: Dur = Dur(120_000_000_000);

#[derive(Debug, Clone)]
enum Peer {
    /// Connected, not registered (may ping to sync its clock).
    New,
    /// A backend loading its models; `missing`: model ids not yet confirmed.
    Loading {
        node: NodeId,
        gpus: u32,
        sub: u32,
        missing: BTreeSet<ModelId>,
        /// What runs its GPUs.
        devices: DeviceCounts,
        /// Lanes per device: its slots `i / lanes` share one.
        lanes: u32,
    },
    Backend {
        node: NodeId,
        gpus: Vec<GpuId>,
        /// Its sub-cluster.
        sub: u32,
        /// What runs its GPUs.
        devices: DeviceCounts,
        /// Lanes per device: `gpus[i / lanes]`'s lanes share one.
        lanes: u32,
        /// Models moving into its sub-cluster that it has not confirmed yet.
        missing: BTreeSet<ModelId>,
        /// Since when it drains (its GPUs out of the core, its plans finishing),
        /// and whether it has heard `Drained`.
        draining: Option<(Time, bool)>,
    },
    Frontend {
        node: NodeId,
        /// The `FrontendUp` that announces it to backends.
        up: Msg,
    },
}

#[derive(Debug)]
struct PeerConn {
    peer: Peer,
    last_seen: Time,
    /// What the node last measured (from its pings, also those before it
    /// registered), clamped: control delay, pull cost per batch and what a
    /// pull holds a GPU's puller.
    ctrl_delay: Dur,
    pull: PullFit,
    hold: PullFit,
    /// A frontend's response margin per model id (empty until it reports).
    margins: Vec<Dur>,
    /// A hot standby following (it sent `Follow`): the version of the
    /// assignment it was last sent ([`SubClusters::version`]),
    follows: Option<u64>,
    /// and that of the latency scales ([`LatencyScaler::changes`]; None:
    /// none sent).
    ///
    /// [`LatencyScaler::changes`]: super::latency_scale::LatencyScaler::changes
    scales_sent: Option<u64>,
}

/// The scheduler's protocol state.
pub struct SchedProto {
    cfg: SchedConfig,
    conns: HashMap<ConnId, PeerConn>,
    frontends: HashMap<NodeId, ConnId>,
    /// Each GPU id's owner, the free ids and those in quarantine.
    gpu_ids: GpuIds,
    /// Warnings about registrations refused for the limits.
    refusals: RefusalLog,
    plans: Arc<Mutex<PlanLedger>>,
    next_node: NodeId,
    gpus_in_service: u32,
    net: NetBudget,
    /// The response margins last given to the core (per model id).
    margins: Vec<Dur>,
    next_check: Time,
    /// When the last heartbeat check ran (a long gap: the scheduler stalled).
    last_check: Time,
    next_net: Time,
    actions: VecDeque<Action>,
    report: SchedReport,
    /// Registered backends' names.
    names: HashMap<NodeId, String>,
    /// Which models are loaded, and the loads and unloads asked
    /// ([`super::control`]).
    control: Control,
    /// Per model: when its load started (a model loading too long fails).
    load_since: HashMap<ModelId, Time>,
    /// Each model's sub-cluster and the moves under way.
    subs: SubClusters,
    /// GPUs in service per sub-cluster.
    sub_gpus: Vec<u32>,
    /// The same by what runs them, and what frontends were told of each
    /// model ([`super::devices`]).
    devices: Devices,
    /// Tasks finished past their deadline, per model id.
    late_by_model: Vec<u64>,
    /// The term it serves under; whether a standby ever followed it; the
    /// newer term it stepped down for.
    term: u64,
    followed: bool,
    stepped_down: Option<u64>,
    /// Backends whose models are loaded, waiting for GPU ids in quarantine.
    waiting: BTreeSet<ConnId>,
    /// The latest time an input brought.
    now: Time,
    /// Each model's measured latency against its profile.
    latency: LatencyWatch,
    /// Applications' counters summed over their frontends.
    apps: AppTotals,
    /// Warnings about application counters refused.
    app_refusals: RefusalLog,
}

/// The sizes of the scheduler's per-member state ([`SchedProto::state_sizes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct StateSizes {
    pub conns: usize,
    pub frontends: usize,
    /// Backends' names (loading or in service).
    pub names: usize,
    /// GPU slots: every table indexed by GPU id is this long.
    pub gpu_slots: usize,
    pub gpus_owned: usize,
    pub gpus_quarantined: usize,
    /// Plans in flight.
    pub plans: usize,
}

/// A backend in service, as the autoscaling advice names it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BackendView {
    pub node: NodeId,
    /// The name it registered with.
    pub name: String,
    /// Its GPUs' global ids, in the order of its slots.
    pub gpus: Vec<u32>,
    /// Lanes per device (1 without lanes): `gpus[i]` is a lane of its
    /// device `i / lanes`.
    pub lanes: u32,
    /// Told to drain (its GPUs are out of planning).
    pub draining: bool,
    /// Its sub-cluster.
    pub subcluster: u32,
}

impl SchedProto {
    /// A scheduler starting at `now` with no nodes.
    pub fn new(now: Time, cfg: SchedConfig) -> SchedProto {
        let net = cfg.floors;
        let cfg_models = cfg.models.len();
        let margins = vec![Dur::ZERO; cfg.models.len()];
        let subs = cfg.subclusters.clone();
        let report = SchedReport {
            subclusters: subs.count(),
            model_latency_scale: cfg.models.iter().map(|m| (m.name.clone(), 1.0)).collect(),
            ..SchedReport::default()
        };
        SchedProto {
            latency: LatencyWatch::new(&cfg.models, cfg.latency),
            sub_gpus: vec![0; subs.count() as usize],
            devices: Devices::new(subs.count(), cfg.models.len()),
            late_by_model: vec![0; cfg.models.len()],
            waiting: BTreeSet::new(),
            now,
            subs,
            next_check: now + cfg.heartbeat,
            last_check: now,
            next_net: now + cfg.net_update,
            plans: Arc::new(Mutex::new(PlanLedger::new(cfg.plan_grace))),
            cfg,
            conns: HashMap::new(),
            frontends: HashMap::new(),
            gpu_ids: GpuIds::default(),
            refusals: RefusalLog::default(),
            next_node: 1,
            gpus_in_service: 0,
            net,
            margins,
            actions: VecDeque::new(),
            report,
            names: HashMap::new(),
            control: Control::new(ControlMode::None, cfg_models, |_| true),
            load_since: HashMap::new(),
            term: 1,
            followed: false,
            stepped_down: None,
            apps: AppTotals::new(),
            app_refusals: RefusalLog::default(),
        }
    }

    /// The term it serves under.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Serves under `term` from now on (a standby taking over: one more than
    /// the highest term it saw).
    pub fn set_term(&mut self, term: u64) {
        self.term = term;
    }

    /// The newer term it stepped down for (None while it serves).
    pub fn stepped_down(&self) -> Option<u64> {
        self.stepped_down
    }

    /// The backends in service (loading ones left out), by node id.
    pub fn backends(&self) -> Vec<BackendView> {
        let mut v: Vec<BackendView> = self
            .conns
            .values()
            .filter_map(|pc| match &pc.peer {
                Peer::Backend {
                    node,
                    gpus,
                    draining,
                    sub,
                    lanes,
                    ..
                } => Some(BackendView {
                    node: *node,
                    name: self.names.get(node).cloned().unwrap_or_default(),
                    gpus: gpus.iter().map(|g| g.0).collect(),
                    lanes: *lanes,
                    draining: draining.is_some(),
                    subcluster: *sub,
                }),
                _ => None,
            })
            .collect();
        v.sort_by_key(|b| b.node);
        v
    }

    /// The in-flight plans, shared with the dispatch path (which records each
    /// plan it sends with [`PlanLedger::sent`]).
    pub fn plans(&self) -> Arc<Mutex<PlanLedger>> {
        self.plans.clone()
    }

    pub fn report(&self) -> &SchedReport {
        &self.report
    }

    /// The models' sub-clusters and the moves under way.
    pub fn subclusters(&self) -> &SubClusters {
        &self.subs
    }

    /// Each model's measured latency against its profile, and its scale.
    pub fn latency(&self) -> &LatencyWatch {
        &self.latency
    }

    /// Tasks of plans reported finished past their deadline, per model id.
    pub fn late_by_model(&self) -> &[u64] {
        &self.late_by_model
    }

    /// The backend owning global GPU `gpu`, while it is in service.
    pub fn gpu_owner(&self, gpu: GpuId) -> Option<NodeId> {
        self.gpu_ids.owner(gpu)
    }

    /// The sizes of the per-member state, to check that it stays bounded.
    pub fn state_sizes(&self) -> StateSizes {
        StateSizes {
            conns: self.conns.len(),
            frontends: self.frontends.len(),
            names: self.names.len(),
            gpu_slots: self.gpu_ids.slots(),
            gpus_owned: self.gpu_ids.owned(),
            gpus_quarantined: self.gpu_ids.quarantined(),
            plans: self.plans.lock().expect("plans lock").len(),
        }
    }

    /// The next action for the driver.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`SchedProto::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Time {
        if self.stepped_down.is_some() {
            return Time::NEVER;
        }
        let t = self.next_check.min(self.next_net);
        match self.gpu_ids.next_release() {
            Some(r) if self.waiting_for_ids() => t.min(r),
            _ => t,
        }
    }

    /// A connection was accepted.
    pub fn handle_accept(&mut self, now: Time, c: ConnId) {
        self.now = self.now.max(now);
        if let Some(term) = self.stepped_down {
            let message = format!("this scheduler stepped down for term {term}");
            self.send(c, Msg::Error { message });
            return self
                .actions
                .push_back(Action::Close(c, "stepped down".into()));
        }
        self.conns.insert(
            c,
            PeerConn {
                peer: Peer::New,
                last_seen: now,
                ctrl_delay: Dur::ZERO,
                pull: PullFit::default(),
                hold: PullFit::default(),
                margins: Vec::new(),
                follows: None,
                scales_sent: None,
            },
        );
    }

    /// Sends a following standby on `c` the models' sub-clusters if they
    /// changed since it was last sent them.
    fn send_assignment(&mut self, c: ConnId) {
        let version = self.subs.version();
        let Some(pc) = self.conns.get_mut(&c) else {
            return;
        };
        if pc.follows.is_none_or(|v| v == version) {
            return;
        }
        pc.follows = Some(version);
        let homes = self.subs.homes().to_vec();
        self.send(c, Msg::Assignment { homes });
    }

    /// Sends a following standby on `c` the models' latency scales if they
    /// changed since it was last sent them.
    fn send_scales(&mut self, c: ConnId) {
        let version = self.latency.scaler().changes();
        let Some(pc) = self.conns.get_mut(&c) else {
            return;
        };
        if pc.scales_sent == Some(version) {
            return;
        }
        pc.scales_sent = Some(version);
        let ppm = self.latency.scales_ppm();
        self.send(c, Msg::LatencyScales { ppm });
    }

    /// Plans with a primary's latency scales (`ppm`: millionths, by model
    /// id; a standby taking over): the core gets them, and the scales
    /// measured from now on start from them. An error (nothing changes)
    /// when they are not one per model.
    pub fn adopt_latency_scales(&mut self, ppm: &[u32]) -> Result<(), String> {
        self.latency.adopt_ppm(ppm)?;
        self.scales_changed(self.latency.scaler().scales());
        Ok(())
    }

    /// The models' latency scales are now `k` (by model id): the report
    /// shows them and the core plans with them.
    fn scales_changed(&mut self, k: Vec<f64>) {
        for (m, &k) in self.cfg.models.iter().zip(&k) {
            self.report.model_latency_scale.insert(m.name.clone(), k);
        }
        self.actions.push_back(Action::SetLatencyScales(k));
    }

    /// Starts from a primary's assignment (a standby taking over, before any
    /// node registers with it): every model's home as `homes` says, routed.
    /// Refused (nothing changes) once a backend registered or a model moves,
    /// or when `homes` does not fit this scheduler's models and sub-clusters.
    pub fn adopt_assignment(&mut self, homes: &[u32]) -> Result<usize, String> {
        if self
            .conns
            .values()
            .any(|pc| matches!(pc.peer, Peer::Backend { .. } | Peer::Loading { .. }))
        {
            return Err("backends registered already".into());
        }
        let changed = self.subs.adopt(homes)?;
        for &(model, subcluster) in &changed {
            self.actions.push_back(Action::Route { model, subcluster });
        }
        Ok(changed.len())
    }

    /// A connection ended (the peer closed it or it broke).
    pub fn handle_closed(&mut self, now: Time, c: ConnId, reason: String) {
        self.now = self.now.max(now);
        self.remove(c, reason, false)
    }

    /// Timers: heartbeat timeouts, the network budget.
    pub fn handle_timeout(&mut self, now: Time) {
        self.now = self.now.max(now);
        if self.stepped_down.is_some() {
            return;
        }
        self.gpu_ids.release(now);
        if self.waiting_for_ids() {
            self.ready_waiting(now);
        }
        if now >= self.next_check {
            self.next_check = now + self.cfg.heartbeat;
            self.check_timeouts(now);
            self.check_moves(now);
            self.check_control(now);
        }
        if now >= self.next_net {
            self.next_net = now + self.cfg.net_update;
            self.update_net();
        }
    }

    /// Tells the tasks' frontends that they were dropped (`code`), grouped by
    /// frontend; counted. Tasks of frontends that are gone are left out.
    pub fn notify(&mut self, tasks: impl IntoIterator<Item = TaskId>, code: DropReason) {
        for (fe, items) in drops_by_frontend(tasks, code) {
            if code == DropReason::BackendLost {
                self.report.tasks_failed_backend_lost += items.len() as u64;
            } else {
                self.report.tasks_dropped += items.len() as u64;
            }
            if let Some(&c) = self.frontends.get(&fe) {
                self.actions
                    .push_back(Action::Send(c, Msg::Dropped { items }));
            }
        }
    }

    /// A newer `term` is known to the peer on `c` (a node's ping, or a
    /// scheduler's `Fence`): step down, or — never followed, and told by a
    /// node — serve on above it (see the module docs).
    fn newer_term(&mut self, c: ConnId, term: u64, fence: bool) {
        if fence || self.followed {
            let from = if fence { "a scheduler" } else { "a node" };
            let than = if term == self.term {
                "as new as"
            } else {
                "newer than"
            };
            let why = format!(
                "replaced: {from} serves or follows term {term}, {than} this scheduler's term {}",
                self.term
            );
            return self.step_down(term, why);
        }
        tracing::warn!(
            conn = c,
            term,
            old = self.term,
            "scheduler: a node saw a newer term (of an earlier cluster: no standby ever followed this scheduler); serving above it"
        );
        self.term = term.saturating_add(1);
    }

    /// This scheduler's fencer ([`super::fence`]) heard a scheduler of `term`
    /// answer: a newer one steps this one down.
    pub fn handle_fenced(&mut self, term: u64) {
        if self.stepped_down.is_none() && term > self.term {
            self.newer_term(0, term, true);
        }
    }

    /// Stops serving for a scheduler of a newer term (see the module docs).
    fn step_down(&mut self, term: u64, why: String) {
        tracing::error!(term, reason = %why, "scheduler: stepping down");
        self.stepped_down = Some(term);
        let mut conns: Vec<ConnId> = self.conns.keys().copied().collect();
        conns.sort_unstable();
        let message = format!("this scheduler stepped down: {why}");
        for c in conns {
            self.send(
                c,
                Msg::Error {
                    message: message.clone(),
                },
            );
            self.remove(c, message.clone(), false);
        }
        self.actions.push_back(Action::StepDown { term, why });
    }

    /// A message arrived on `c`.
    pub fn handle_msg(&mut self, now: Time, c: ConnId, msg: Msg) {
        self.now = self.now.max(now);
        if self.stepped_down.is_some() {
            return;
        }
        let Some(pc) = self.conns.get_mut(&c) else {
            return;
        };
        pc.last_seen = now;
        if let Msg::Ping { term, .. } = msg {
            if term > self.term {
                self.newer_term(c, term, false);
                if self.stepped_down.is_some() {
                    return;
                }
            }
        }
        let Some(pc) = self.conns.get_mut(&c) else {
            return;
        };
        match msg {
            Msg::Ping {
                seq,
                sent,
                ctrl_delay,
                pull,
                pull_per_mib,
                pull_hold,
                pull_hold_per_mib,
                ..
            } => {
                pc.ctrl_delay = check::measured(ctrl_delay);
                pc.pull = check::measured_pull(PullFit {
                    fixed: pull,
                    per_mib: pull_per_mib,
                });
                pc.hold = check::measured_pull(PullFit {
                    fixed: pull_hold,
                    per_mib: pull_hold_per_mib,
                });
                let follows = pc.follows.is_some();
                let pong = Msg::Pong {
                    seq,
                    echo: sent,
                    sched: now,
                    term: self.term,
                };
                self.send(c, pong);
                if follows {
                    self.send_assignment(c);
                    self.send_scales(c);
                }
            }
            Msg::Follow => {
                if !matches!(pc.peer, Peer::New) {
                    return self.reject(c, "Follow from a registered node".into());
                }
                pc.follows = Some(u64::MAX);
                self.followed = true;
                self.send_assignment(c);
                self.send_scales(c);
                // The models' states: it takes them over with the assignment.
                let items = self.model_states();
                self.send(c, Msg::ModelStates { items });
            }
            Msg::Fence { term } => {
                if !matches!(pc.peer, Peer::New) {
                    return self.reject(c, "Fence from a registered node".into());
                }
                match super::fence::on_fence(self.term, term) {
                    // As new as this one's, or newer: the fencer took over
                    // from this scheduler (at an equal term, before it
                    // learnt this one's term).
                    super::fence::OnFence::StepDown => {
                        return self.newer_term(c, term, true);
                    }
                    // Its sender serves an older term: it steps down on this.
                    super::fence::OnFence::Answer => self.send(c, Msg::Fence { term: self.term }),
                }
                self.remove(c, format!("fence of term {term} answered"), false);
            }
            Msg::Submit { tasks } => self.submit(now, c, tasks),
            Msg::Margins { items } => self.frontend_margins(c, items),
            Msg::AppCounts { counters } => self.app_counts(c, counters),
            Msg::Register {
                role,
                name,
                gpus,
                ctrl_addr,
                region,
            } => {
                if !matches!(pc.peer, Peer::New) {
                    return self.reject(c, "second Register on one connection".into());
                }
                self.register(c, role, &name, &gpus, ctrl_addr, region);
            }
            Msg::ModelLoaded {
                model,
                ok,
                error,
                device_bytes,
            } => self.model_loaded(now, c, model, ok, error, device_bytes),
            Msg::PlanDone {
                id,
                gpu,
                status,
                started,
                finished,
                missing,
            } => self.plan_done(now, c, id, gpu, (status, missing), started, finished),
            Msg::Unregister { reason } => {
                let why = format!("unregistered: {reason}");
                self.remove(c, why, true);
            }
            Msg::Drain { reason } => self.drain(now, c, reason),
            Msg::ModelControl { model, load } => self.model_control(now, c, model, load),
            other => {
                let k = other.kind();
                self.reject(c, format!("unexpected message {k} at the scheduler"));
            }
        }
    }

    /// A `Register` on a new connection: gives the node an id and registers it
    /// by its role.
    fn register(
        &mut self,
        c: ConnId,
        role: Role,
        name: &str,
        gpu_infos: &[crate::wire::GpuInfo],
        ctrl_addr: String,
        region: Option<RegionInfo>,
    ) {
        let gpus = gpu_infos.len();
        let members = self.names.len() + self.frontends.len();
        let max = self.cfg.limits;
        if members >= max.max_members as usize {
            let why = format!(
                "the scheduler has {members} members registered, its limit (--max-members {})",
                max.max_members
            );
            return self.refuse(c, why);
        }
        if role == Role::Backend && gpus > max.max_gpus_per_member as usize {
            let why = format!(
                "a backend registered {gpus} GPUs; the scheduler takes at most {} per backend (--max-gpus-per-member)",
                max.max_gpus_per_member
            );
            return self.refuse(c, why);
        }
        let Some(node) = self.next_node_id() else {
            return self.reject(c, "out of node ids".into());
        };
        match role {
            Role::Backend => self.register_backend(c, node, name, gpu_infos),
            Role::Frontend => {
                let Some(region) = region else {
                    return self.reject(c, "a frontend must register its input region".into());
                };
                let up = Msg::FrontendUp {
                    node,
                    ctrl_addr,
                    region,
                };
                self.register_frontend(c, node, name, up);
            }
        }
    }

    /// The next node id: ids are given in order and, past [`MAX_NODE_ID`],
    /// from 1 again, skipping those of nodes registered now. An id comes back
    /// only after `MAX_NODE_ID` (2^24 - 1) registrations, long after every
    /// task of its last holder ended (a task id carries its frontend's node
    /// id, and a task lives until its deadline).
    fn next_node_id(&mut self) -> Option<NodeId> {
        for _ in 0..=self.names.len() + self.frontends.len() {
            if self.next_node > MAX_NODE_ID || self.next_node == 0 {
                self.next_node = 1;
            }
            let node = self.next_node;
            self.next_node += 1;
            if !self.names.contains_key(&node) && !self.frontends.contains_key(&node) {
                return Some(node);
            }
        }
        None
    }

    /// Refuses `c`'s registration for a limit: an `Error` with `why`, the
    /// connection closed, a warning at most once per
    /// [`super::bounds::REFUSAL_WARN_PERIOD`] with the count of those not
    /// warned about.
    fn refuse(&mut self, c: ConnId, why: String) {
        self.report.refused_for_limits += 1;
        if let Some(unwarned) = self.refusals.hit(self.now) {
            tracing::warn!(conn = c, reason = %why, refused_since_last_warning = unwarned, refused_total = self.refusals.total, "scheduler: registration refused");
        }
        self.send(
            c,
            Msg::Error {
                message: why.clone(),
            },
        );
        self.remove(c, why, false);
    }

    /// Backends whose models are loaded and that wait for GPU ids.
    fn waiting_for_ids(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Backends waiting for GPU ids get them, in the order they connected,
    /// as far as the free ones go.
    fn ready_waiting(&mut self, now: Time) {
        self.gpu_ids.release(now);
        let waiting: Vec<ConnId> = self.waiting.iter().copied().collect();
        for c in waiting {
            self.backend_ready(c);
            if self.waiting.contains(&c) {
                break;
            }
        }
    }

    /// Closes `c` for a protocol error (an `Error` first) and removes its node.
    pub fn reject(&mut self, c: ConnId, why: String) {
        if !self.conns.contains_key(&c) {
            return;
        }
        tracing::warn!(conn = c, reason = %why, "scheduler: closing connection");
        self.report.connections_closed_for_errors += 1;
        self.send(
            c,
            Msg::Error {
                message: why.clone(),
            },
        );
        self.remove(c, why, false);
    }

    fn send(&mut self, c: ConnId, m: Msg) {
        self.actions.push_back(Action::Send(c, m));
    }

    fn submit(&mut self, now: Time, c: ConnId, tasks: Vec<crate::wire::SubmitTask>) {
        let Some(Peer::Frontend { node, .. }) = self.conns.get(&c).map(|p| &p.peer) else {
            return self.reject(
                c,
                "Submit from a node that is not a registered frontend".into(),
            );
        };
        let node = *node;
        let nm = self.cfg.models.len();
        let (mut ok, mut unknown) = (Vec::with_capacity(tasks.len()), Vec::new());
        for t in &tasks {
            match check::submit_task(now, node, nm, t) {
                Ok(Submitted::Task(m, task)) => ok.push((m, task)),
                Ok(Submitted::UnknownModel(id)) => unknown.push(id),
                // One bad task is a broken frontend: none of the batch is taken.
                Err(why) => return self.reject(c, why),
            }
        }
        self.report.tasks_received += ok.len() as u64;
        if !unknown.is_empty() {
            self.notify(unknown, DropReason::UnknownModel);
        }
        if ok.is_empty() {
            return;
        }
        if self.gpus_in_service == 0 {
            self.notify(ok.iter().map(|(_, t)| t.id), DropReason::NoGpu);
            return;
        }
        if self.control.mode() != ControlMode::None {
            // A model not loaded (or being unloaded) takes no new task.
            let mut gone = Vec::new();
            ok.retain(|(m, t)| {
                let takes = self.control.takes_requests(*m);
                if takes {
                    self.subs.submitted(*m, t.deadline);
                } else {
                    gone.push(t.id);
                }
                takes
            });
            if !gone.is_empty() {
                self.notify(gone, DropReason::ModelRemoved);
            }
            if ok.is_empty() {
                return;
            }
        }
        if self.subs.count() > 1 {
            // A model whose sub-cluster has no GPU in service has nowhere to run.
            let mut none = Vec::new();
            ok.retain(|(m, t)| {
                let home = self.subs.home(*m);
                let up = self.sub_gpus[home as usize] > 0;
                if up {
                    self.subs.submitted(*m, t.deadline);
                } else {
                    none.push(t.id);
                }
                up
            });
            if !none.is_empty() {
                self.notify(none, DropReason::NoGpu);
            }
            if ok.is_empty() {
                return;
            }
        }
        self.actions.push_back(Action::Submit(ok));
    }

    fn register_backend(
        &mut self,
        c: ConnId,
        node: NodeId,
        name: &str,
        gpu_infos: &[crate::wire::GpuInfo],
    ) {
        let gpus = gpu_infos.len();
        if gpus == 0 {
            return self.reject(c, "a backend must register at least one GPU".into());
        }
        let lanes = match lanes_of(gpu_infos) {
            Ok(lanes) => lanes,
            Err(why) => return self.reject(c, why),
        };
        let sub = match self.pick_subcluster(gpu_infos) {
            Ok(sub) => sub,
            Err(why) => return self.reject(c, why),
        };
        let models: Vec<ModelId> = self
            .subs
            .held_by(sub)
            .into_iter()
            .filter(|&m| self.control.held(m))
            .collect();
        for &m in &models {
            let info = self.cfg.models[m.idx()].clone();
            self.send(c, Msg::LoadModel { model: info });
        }
        // Frontends it must know before any plan.
        for up in self.frontend_ups() {
            self.send(c, up);
        }
        if let Some(pc) = self.conns.get_mut(&c) {
            pc.peer = Peer::Loading {
                node,
                gpus: gpus as u32,
                sub,
                missing: models.iter().copied().collect(),
                devices: DeviceCounts::of(gpu_infos),
                lanes,
            };
        }
        // Names are the node's to choose: kept short for the views.
        let name: String = name.chars().take(128).collect();
        self.names.insert(node, name.clone());
        tracing::info!(backend = %name, node, gpus, subcluster = sub, "scheduler: backend registers");
        if models.is_empty() {
            self.backend_ready(c);
        }
    }

    fn register_frontend(&mut self, c: ConnId, node: NodeId, name: &str, up: Msg) {
        if let Some(pc) = self.conns.get_mut(&c) {
            pc.peer = Peer::Frontend {
                node,
                up: up.clone(),
            };
        }
        self.frontends.insert(node, c);
        self.actions.push_back(Action::FrontendUp { conn: c, node });
        self.send(
            c,
            Msg::RegisterAck {
                node,
                gpu_ids: Vec::new(),
                models: self.cfg.models.clone(),
                heartbeat_ms: self.heartbeat_ms(),
                term: self.term,
            },
        );
        self.send(
            c,
            Msg::Capacity {
                gpus: self.gpus_in_service,
            },
        );
        let items = self.model_states();
        self.send(c, Msg::ModelStates { items });
        for b in self.backend_conns() {
            self.send(b, up.clone());
        }
        self.report.frontends_registered += 1;
        tracing::info!(frontend = %name, node, "scheduler: frontend registered");
    }

    fn heartbeat_ms(&self) -> u32 {
        (self.cfg.heartbeat.0 / 1_000_000).clamp(1, u32::MAX as i64) as u32
    }

    fn model_loaded(
        &mut self,
        now: Time,
        c: ConnId,
        model: ModelId,
        ok: bool,
        error: String,
        device_bytes: u64,
    ) {
        let served = self.cfg.models.iter().any(|m| m.id == model);
        let (missing, in_service, sub) = match self.conns.get_mut(&c).map(|p| &mut p.peer) {
            Some(Peer::Loading { missing, sub, .. }) => (missing, false, *sub),
            Some(Peer::Backend { missing, sub, .. }) => (missing, true, *sub),
            _ => return self.reject(c, "ModelLoaded from a node that is not loading".into()),
        };
        if !served {
            return self.reject(
                c,
                format!("ModelLoaded for model {model}, which is not served"),
            );
        }
        let asked = missing.contains(&model);
        if in_service && !ok {
            if !asked {
                return;
            }
            missing.remove(&model);
            if self.control.state(model) == ModelAvailability::Loading {
                // A load a client asked for failed: the model stays
                // unavailable, with the backend's reason.
                tracing::warn!(model = model.0, subcluster = sub, %error, "scheduler: a backend failed to load a model asked for");
                return self.fail_load(model, format!("failed to load: {error}"));
            }
            // A model moving in failed to load: the move is off (a backend in
            // service keeps serving what it has).
            tracing::warn!(model = model.0, subcluster = sub, %error, "scheduler: a backend failed to load a model moving in; the move is aborted");
            return self.abort_move(model);
        }
        if !ok {
            return self.reject(c, format!("backend failed to load model {model}: {error}"));
        }
        // A duplicate confirmation changes nothing.
        missing.remove(&model);
        let done = missing.is_empty();
        if device_bytes > 0 {
            self.actions.push_back(Action::DeviceBytes {
                model,
                bytes: device_bytes,
            });
        }
        if in_service {
            if asked {
                self.check_moves(now);
                self.check_control(now);
            }
        } else if done {
            self.backend_ready(c);
        }
    }

    #[allow(clippy::too_many_arguments)] // the report's fields
    fn plan_done(
        &mut self,
        now: Time,
        c: ConnId,
        plan: PlanId,
        gpu: GpuId,
        (status, missing): (crate::wire::PlanStatus, u32),
        started: Time,
        finished: Time,
    ) {
        let Some(Peer::Backend { node, gpus, .. }) = self.conns.get(&c).map(|p| &p.peer) else {
            return self.reject(c, "PlanDone from a node that is not a backend".into());
        };
        let node = *node;
        if !gpus.contains(&gpu) {
            return self.reject(
                c,
                format!("PlanDone on GPU {}, which is not this backend's", gpu.0),
            );
        }
        let res = self
            .plans
            .lock()
            .expect("plans lock")
            .done(node, plan, gpu, finished);
        match res {
            Ok(mut d) => {
                self.report.tasks_late += d.late as u64;
                if let Some(l) = self.late_by_model.get_mut(d.model.idx()) {
                    *l += d.late as u64;
                }
                let w = &mut self.latency;
                if let Some(k) = w.on_done(&mut d, (status, missing), (started, finished)) {
                    self.scales_changed(k);
                }
                self.report.latency = self.latency.scaler().stats();
            }
            Err(Refused::Unknown) => {
                self.report.stray_plan_done += 1;
                return;
            }
            Err(Refused::NotYours(why)) => return self.reject(c, why),
        }
        self.report.plans_done += 1;
        // The GPU is free now that the report is here, whatever time it names.
        let busy = check::batch_span(started, finished);
        let finished = finished.min(now).max(now - check::MAX_BATCH_SPAN);
        self.actions.push_back(Action::PlanDone {
            gpu,
            plan,
            finished,
            busy,
        });
    }

    fn frontend_ups(&self) -> Vec<Msg> {
        let mut v: Vec<(NodeId, Msg)> = self
            .conns
            .values()
            .filter_map(|c| match &c.peer {
                Peer::Frontend { node, up } => Some((*node, up.clone())),
                _ => None,
            })
            .collect();
        v.sort_by_key(|(n, _)| *n);
        v.into_iter().map(|(_, m)| m).collect()
    }

    /// Connections of backends (in service or loading), in a stable order.
    fn backend_conns(&self) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.peer, Peer::Backend { .. } | Peer::Loading { .. }))
            .map(|(&id, _)| id)
            .collect();
        v.sort_unstable();
        v
    }

    fn frontend_conns(&self) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self.frontends.values().copied().collect();
        v.sort_unstable();
        v
    }

    fn send_capacity(&mut self) {
        let gpus = self.gpus_in_service;
        for c in self.frontend_conns() {
            self.send(c, Msg::Capacity { gpus });
        }
    }

    /// A backend confirmed every model: its GPUs go into service.
    fn backend_ready(&mut self, c: ConnId) {
        let Some(Peer::Loading {
            node,
            gpus,
            sub,
            devices,
            lanes,
            ..
        }) = self.conns.get(&c).map(|p| p.peer.clone())
        else {
            return;
        };
        // Backends that wait for ids go first, in the order they came.
        let queued = !self.waiting.is_empty() && !self.waiting.contains(&c);
        let ids = if queued {
            None
        } else {
            self.gpu_ids.take(self.now, node, gpus as usize)
        };
        let Some(ids) = ids else {
            // The ids of backends that left moments ago do: it waits for them
            // rather than growing every table indexed by GPU id.
            if self.waiting.insert(c) {
                tracing::info!(
                    node,
                    gpus,
                    "scheduler: backend waits for GPU ids in quarantine"
                );
            }
            return;
        };
        self.waiting.remove(&c);
        let first = ids.first().map_or(0, |g| g.0);
        // The driver installs the routes before it sends the ack, and the GPUs
        // enter the core after it: a plan can only follow the ack.
        self.actions.push_back(Action::GpusUp {
            conn: c,
            backend: node,
            gpus: ids.clone(),
            subcluster: sub,
        });
        self.send(
            c,
            Msg::RegisterAck {
                node,
                gpu_ids: ids.clone(),
                models: self.cfg.models.clone(),
                heartbeat_ms: self.heartbeat_ms(),
                term: self.term,
            },
        );
        if let Some(pc) = self.conns.get_mut(&c) {
            pc.peer = Peer::Backend {
                node,
                gpus: ids,
                sub,
                devices,
                lanes,
                missing: BTreeSet::new(),
                draining: None,
            };
        }
        self.report.backends_registered += 1;
        self.gpus_in_service += gpus;
        self.sub_gpus[sub as usize] += gpus;
        self.devices.up(sub, devices);
        // Frontends hear what runs the models before they hear the GPUs
        // (once ready, a frontend's model configurations are right).
        self.tell_states();
        self.send_capacity();
        tracing::info!(
            node,
            first_gpu = first,
            gpus,
            "scheduler: backend in service"
        );
        // Its measurements so far (from pings before it registered) count at once.
        self.update_net();
    }

    /// Connection `c`'s node is gone; `graceful` when it said goodbye.
    fn remove(&mut self, c: ConnId, reason: String, graceful: bool) {
        let Some(pc) = self.conns.remove(&c) else {
            return;
        };
        self.actions.push_back(Action::Close(c, reason.clone()));
        self.waiting.remove(&c);
        match pc.peer {
            Peer::New => {}
            Peer::Loading { node, .. } => {
                self.names.remove(&node);
                tracing::warn!(node, %reason, "scheduler: backend lost while loading");
            }
            Peer::Backend {
                node,
                gpus,
                draining,
                sub,
                devices,
                ..
            } => {
                self.names.remove(&node);
                self.gpu_ids.give_back(self.now, node, &gpus);
                if draining.is_none() {
                    self.gpus_in_service -= gpus.len() as u32;
                    self.sub_gpus[sub as usize] -= gpus.len() as u32;
                    self.devices.down(sub, devices);
                    self.tell_states();
                }
                let lost = self.plans.lock().expect("plans lock").take_backend(node);
                let n = lost.len();
                self.notify(lost, DropReason::BackendLost);
                self.actions.push_back(Action::GpusDown {
                    backend: node,
                    gpus: gpus.clone(),
                });
                self.send_capacity();
                if graceful {
                    self.report.backends_left += 1;
                    tracing::info!(node, gpus = gpus.len(), %reason, "scheduler: backend left");
                } else {
                    self.report.backends_lost += 1;
                    tracing::warn!(
                        node,
                        gpus = gpus.len(),
                        failed_tasks = n,
                        %reason,
                        "scheduler: backend removed; its GPUs are out of service and its in-flight tasks failed"
                    );
                }
            }
            Peer::Frontend { node, .. } => {
                self.frontends.remove(&node);
                self.apps.frontend_gone(node);
                if !pc.margins.is_empty() {
                    self.update_margins();
                }
                self.actions.push_back(Action::FrontendDown { node });
                for b in self.backend_conns() {
                    self.send(b, Msg::FrontendDown { node });
                }
                if graceful {
                    self.report.frontends_left += 1;
                    tracing::info!(node, %reason, "scheduler: frontend left");
                } else {
                    self.report.frontends_lost += 1;
                    tracing::warn!(node, %reason, "scheduler: frontend removed; its tasks are dropped");
                }
            }
        }
    }

    /// A frontend's `Margins`: each model id must be served; each margin is
    /// clamped to `[0, max_margin]`. The core gets, per model, the largest over
    /// the frontends.
    fn frontend_margins(&mut self, c: ConnId, items: Vec<(ModelId, Dur)>) {
        let nm = self.cfg.models.len();
        let max = self.cfg.max_margin;
        let Some(pc) = self.conns.get_mut(&c) else {
            return;
        };
        if !matches!(pc.peer, Peer::Frontend { .. }) {
            return self.reject(
                c,
                "Margins from a node that is not a registered frontend".into(),
            );
        }
        if let Some((m, _)) = items.iter().find(|(m, _)| m.idx() >= nm) {
            let why = format!("Margins for model id {} (the scheduler serves {nm})", m.0);
            return self.reject(c, why);
        }
        pc.margins.resize(nm, Dur::ZERO);
        for (m, d) in items {
            pc.margins[m.idx()] = Dur(d.0.clamp(0, max.0));
        }
        self.update_margins();
    }

    /// A frontend's counters of an application: answered with the sums over
    /// every frontend that reported it ([`super::app_totals`]). Counters the
    /// sums refuse (another shape, past a size or a count bound) are answered
    /// with nothing and warned about, rate-limited.
    fn app_counts(&mut self, c: ConnId, counters: AppCounters) {
        let Some(Peer::Frontend { node, .. }) = self.conns.get(&c).map(|p| &p.peer) else {
            return self.reject(
                c,
                "AppCounts from a node that is not a registered frontend".into(),
            );
        };
        let node = *node;
        match self.apps.report(node, counters) {
            Ok((counters, frontends)) => self.send(
                c,
                Msg::AppTotals {
                    counters,
                    frontends,
                },
            ),
            Err(why) => {
                if let Some(unwarned) = self.app_refusals.hit(self.now) {
                    tracing::warn!(node, reason = %why, refused_since_last_warning = unwarned, refused_total = self.app_refusals.total, "scheduler: application counters refused");
                }
            }
        }
    }

    /// Recomputes the models' response margins over the frontends; a change of
    /// more than 10% (or 20 us) goes to the core.
    fn update_margins(&mut self) {
        let mut next = vec![Dur::ZERO; self.cfg.models.len()];
        for pc in self.conns.values() {
            if let Peer::Frontend { .. } = pc.peer {
                for (n, &m) in next.iter_mut().zip(&pc.margins) {
                    *n = (*n).max(m);
                }
            }
        }
        let changed = next
            .iter()
            .zip(&self.margins)
            .any(|(&a, &b)| moved(a, b, MARGIN_FLOOR));
        if changed {
            tracing::info!(margins_us = ?next.iter().map(|d| d.as_us_f64()).collect::<Vec<_>>(), "scheduler: response margins changed");
            self.margins = next.clone();
            let top = next.iter().map(|d| d.as_us_f64()).fold(0.0, f64::max);
            self.report.margin_max_us = self.report.margin_max_us.max(top);
            self.actions.push_back(Action::SetMargins(next));
        }
    }

    /// A backend asks to leave without failing a request: its GPUs leave the
    /// core now (no new plan), its plans in flight finish, and once none is left
    /// (and [`DRAIN_QUIET`] has passed, so that a plan the core decided just
    /// before is recorded too) it hears `Drained` from [`Self::check_drains`].
    fn drain(&mut self, now: Time, c: ConnId, reason: String) {
        let Some(pc) = self.conns.get_mut(&c) else {
            return;
        };
        match &mut pc.peer {
            Peer::Backend {
                node,
                gpus,
                draining,
                sub,
                devices,
                ..
            } => {
                if draining.is_some() {
                    return;
                }
                *draining = Some((now, false));
                let (node, gpus, sub, devices) = (*node, gpus.clone(), *sub, *devices);
                self.gpus_in_service -= gpus.len() as u32;
                self.sub_gpus[sub as usize] -= gpus.len() as u32;
                self.devices.down(sub, devices);
                self.tell_states();
                self.report.backends_drained += 1;
                tracing::info!(node, gpus = gpus.len(), %reason, "scheduler: backend draining");
                self.actions.push_back(Action::GpusDraining {
                    backend: node,
                    gpus,
                });
                self.send_capacity();
            }
            // Nothing of it in service yet (a rejoin while it drains): it
            // leaves now, so that it never enters service.
            Peer::Loading { .. } => {
                self.remove(c, format!("drained while loading: {reason}"), true)
            }
            _ => self.reject(c, "Drain from a node that is not a backend".into()),
        }
    }

    /// The sub-cluster a new backend joins: of those of its GPUs' type (any,
    /// untyped), the one with the fewest GPUs (in service or loading; the
    /// lowest id on a tie). The partitioner balances load across sub-clusters,
    /// so their GPUs are kept even. With typed sub-clusters, a backend whose
    /// GPUs are of several types or of a type no sub-cluster has is refused.
    fn pick_subcluster(&self, gpu_infos: &[crate::wire::GpuInfo]) -> Result<u32, String> {
        let allowed = if self.subs.types().is_empty() {
            (0..self.subs.count()).collect()
        } else {
            let first = gpu_infos.first().map(|g| g.name.as_str()).unwrap_or("");
            if let Some(other) = gpu_infos
                .iter()
                .find(|g| !super::subclusters::same_gpu_type(&g.name, first))
            {
                return Err(format!(
                    "a backend's GPUs must be of one type when sub-clusters are typed; got {:?} and {:?}",
                    short(first),
                    short(&other.name)
                ));
            }
            let subs = self.subs.of_type(first);
            if subs.is_empty() {
                return Err(format!(
                    "no sub-cluster takes GPUs of type {:?} (the scheduler's --subcluster-types: {}); start the backend with --gpu-type naming one",
                    short(first),
                    self.subs.types().join(",")
                ));
            }
            subs
        };
        let mut gpus = vec![0u32; self.subs.count() as usize];
        for pc in self.conns.values() {
            match &pc.peer {
                Peer::Loading { gpus: n, sub, .. } => gpus[*sub as usize] += n,
                Peer::Backend {
                    gpus: g,
                    sub,
                    draining: None,
                    ..
                } => gpus[*sub as usize] += g.len() as u32,
                _ => {}
            }
        }
        Ok(allowed
            .into_iter()
            .min_by_key(|&s| (gpus[s as usize], s))
            .unwrap_or(0))
    }

    /// Backend connections of sub-cluster `sub` (loading or in service,
    /// draining ones too), in a stable order.
    fn sub_conns(&self, sub: u32) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, pc)| match &pc.peer {
                Peer::Loading { sub: s, .. } | Peer::Backend { sub: s, .. } => *s == sub,
                _ => false,
            })
            .map(|(&c, _)| c)
            .collect();
        v.sort_unstable();
        v
    }

    /// Starts moving the models whose sub-cluster in `target` (by model id)
    /// differs from their home; a model already moving is left alone. Returns
    /// how many moves started. The epoch partitioner's answer comes here.
    pub fn repartition(&mut self, now: Time, target: &[u32]) -> usize {
        let mut n = 0;
        for (m, &to) in target.iter().enumerate() {
            if self.move_model(now, ModelId(m as u32), to) {
                n += 1;
            }
        }
        n
    }

    /// Starts moving `model` to sub-cluster `to` (see [`super::subclusters`]):
    /// `to`'s backends load it. False when it is there already, is moving, or
    /// either is unknown.
    pub fn move_model(&mut self, now: Time, model: ModelId, to: u32) -> bool {
        self.now = self.now.max(now);
        // Only a loaded model that takes requests moves.
        if !self.control.takes_requests(model) || !self.subs.start(now, model, to) {
            return false;
        }
        let name = &self.cfg.models[model.idx()].name;
        tracing::info!(model = %name, from = self.subs.home(model), to, "scheduler: model moves");
        self.load_on(to, model);
        // (check_moves brings the report's move counts up to date.)
        self.check_moves(now);
        true
    }

    /// Sub-cluster `sub`'s backends (in service or loading) load `model`,
    /// each waiting for its confirmation.
    fn load_on(&mut self, sub: u32, model: ModelId) {
        let info = self.cfg.models[model.idx()].clone();
        for c in self.sub_conns(sub) {
            if let Some(pc) = self.conns.get_mut(&c) {
                match &mut pc.peer {
                    Peer::Loading { missing, .. } | Peer::Backend { missing, .. } => {
                        missing.insert(model);
                    }
                    _ => continue,
                }
            }
            self.send(
                c,
                Msg::LoadModel {
                    model: info.clone(),
                },
            );
        }
    }

    /// A move before its switch is off: the target's backends unload the model.
    fn abort_move(&mut self, model: ModelId) {
        let Some(mv) = self.subs.abort(model) else {
            return;
        };
        self.report.moves = self.subs.stats;
        self.unload(mv.to, model);
    }

    /// Sub-cluster `sub`'s backends unload `model` (loading ones stop waiting
    /// for it).
    fn unload(&mut self, sub: u32, model: ModelId) {
        let mut ready = Vec::new();
        for c in self.sub_conns(sub) {
            if let Some(pc) = self.conns.get_mut(&c) {
                match &mut pc.peer {
                    Peer::Loading { missing, .. } => {
                        missing.remove(&model);
                        if missing.is_empty() {
                            ready.push(c);
                        }
                    }
                    Peer::Backend { missing, .. } => {
                        missing.remove(&model);
                    }
                    _ => continue,
                }
            }
            self.send(c, Msg::UnloadModel { model });
        }
        for c in ready {
            self.backend_ready(c);
        }
    }

    /// Moves forward: a model whose target's backends in service all hold it
    /// is switched there; a switched model whose source has no task of it
    /// left (past the latest deadline it was given, and no plan of it in
    /// flight there) is unloaded from the source.
    fn check_moves(&mut self, now: Time) {
        for (m, mv) in self.subs.moves() {
            match mv.phase {
                Phase::Loading => {
                    if self.sub_gpus[mv.to as usize] == 0 || self.sub_missing(mv.to, m) {
                        if now - mv.since > MOVE_LOAD_TIMEOUT {
                            tracing::warn!(model = m.0, from = mv.from, to = mv.to, "scheduler: a model moving in was not loaded in time; the move is aborted");
                            self.abort_move(m);
                        }
                        continue;
                    }
                    self.subs.switch(m);
                    tracing::info!(
                        model = m.0,
                        from = mv.from,
                        to = mv.to,
                        "scheduler: model switched; new tasks go to its new sub-cluster"
                    );
                    self.actions.push_back(Action::Route {
                        model: m,
                        subcluster: mv.to,
                    });
                    // Its frontends hear what runs its new home.
                    self.tell_states();
                }
                Phase::Switched { drain_until } => {
                    if now < drain_until + DRAIN_QUIET || self.in_flight(mv, m) > 0 {
                        continue;
                    }
                    self.subs.finish(m);
                    tracing::info!(
                        model = m.0,
                        from = mv.from,
                        to = mv.to,
                        "scheduler: model moved; unloaded from its old sub-cluster"
                    );
                    self.unload(mv.from, m);
                }
            }
        }
        self.report.moves = self.subs.stats;
    }

    /// Whether a backend in service of `sub` has not confirmed `model`.
    fn sub_missing(&self, sub: u32, model: ModelId) -> bool {
        self.conns.values().any(|pc| {
            matches!(&pc.peer, Peer::Backend { sub: s, missing, draining: None, .. }
                if *s == sub && missing.contains(&model))
        })
    }

    /// Plans of `model` in flight on the source of move `mv`.
    fn in_flight(&self, mv: Move, model: ModelId) -> usize {
        let source: BTreeSet<NodeId> = self
            .conns
            .values()
            .filter_map(|pc| match &pc.peer {
                Peer::Backend { node, sub, .. } if *sub == mv.from => Some(*node),
                _ => None,
            })
            .collect();
        self.plans
            .lock()
            .expect("plans lock")
            .model_plans(model, |b| source.contains(&b))
    }

    /// Draining backends with no plan left in flight hear `Drained`.
    fn check_drains(&mut self, now: Time) {
        let mut done = Vec::new();
        {
            let plans = self.plans.lock().expect("plans lock");
            for (&c, pc) in &self.conns {
                if let Peer::Backend {
                    node,
                    draining: Some((since, false)),
                    ..
                } = pc.peer
                {
                    if now - since >= DRAIN_QUIET && plans.backend_plans(node) == 0 {
                        done.push(c);
                    }
                }
            }
        }
        done.sort_unstable();
        for c in done {
            if let Some(PeerConn {
                peer:
                    Peer::Backend {
                        draining: Some((_, told)),
                        ..
                    },
                ..
            }) = self.conns.get_mut(&c)
            {
                *told = true;
            }
            self.send(c, Msg::Drained);
        }
    }

    /// Removes registered nodes that stopped pinging, and backends with a plan
    /// overdue (the watchdog); answers draining backends that are done.
    fn check_timeouts(&mut self, now: Time) {
        self.check_drains(now);
        // After a stall of the scheduler itself, reports may wait unread in its
        // queues: the watchdog looks again at the next check instead.
        let gap = now - self.last_check;
        let stalled = gap > self.cfg.heartbeat * 2;
        self.last_check = now;
        if stalled {
            // Nor does the time the scheduler was away count as its nodes'
            // silence: their pings of that time may wait unread in its
            // queues, and a node removed for it loses every request it has in
            // flight (a frontend goes on submitting until it sees the close,
            // and what it submits meanwhile is ignored).
            let away = gap - self.cfg.heartbeat;
            for pc in self.conns.values_mut() {
                pc.last_seen = (pc.last_seen + away).min(now);
            }
        }
        let overdue = if stalled {
            Vec::new()
        } else {
            self.plans.lock().expect("plans lock").overdue(now)
        };
        for o in overdue {
            let conn = self.conns.iter().find_map(|(&c, pc)| match pc.peer {
                Peer::Backend { node, .. } if node == o.backend => Some(c),
                _ => None,
            });
            let Some(c) = conn else {
                continue;
            };
            self.report.backends_overdue += 1;
            let why = format!(
                "plan {} on GPU {} not reported done {:.0} ms past its planned end and grace",
                o.plan.0,
                o.gpu.0,
                o.late.as_ms_f64()
            );
            self.remove(c, why, false);
        }
        let mut dead: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, pc)| {
                matches!(pc.peer, Peer::Backend { .. } | Peer::Frontend { .. })
                    && now - pc.last_seen > self.cfg.node_timeout
            })
            .map(|(&c, _)| c)
            .collect();
        dead.sort_unstable();
        for c in dead {
            let why = format!(
                "no heartbeat for {} ms",
                self.cfg.node_timeout.0 / 1_000_000
            );
            self.remove(c, why, false);
        }
    }

    /// Recomputes d_ctrl and the pull budget from the backends' measurements
    /// (never below the floors, never above the caps); a change of more than
    /// 10% goes to the core. The pull budget of a batch of b is the largest
    /// fitted cost over the backends, `fixed + per_mib × b × input`, with the
    /// largest input of the models; what a pull holds a GPU's puller is taken
    /// the same way, under the same caps.
    fn update_net(&mut self) {
        let (mut rtt, mut pull, mut hold, mut n) =
            (Dur::ZERO, PullFit::default(), PullFit::default(), 0);
        for pc in self.conns.values() {
            if let Peer::Backend { .. } = pc.peer {
                rtt = rtt.max(pc.ctrl_delay);
                pull = pull.max(pc.pull);
                hold = hold.max(pc.hold);
                n += 1;
            }
        }
        if n == 0 {
            // Nothing measured: keep the last budget.
            return;
        }
        self.report.ctrl_delay_us = rtt.as_us_f64();
        self.report.pull_us = pull.fixed.as_us_f64();
        self.report.pull_per_mib_us = pull.per_mib.as_us_f64();
        let ctrl = (rtt + Dur(rtt.0 / 10)).min(self.cfg.max_ctrl);
        let f = self.cfg.floors;
        let input = self
            .cfg
            .models
            .iter()
            .map(|m| m.input_bytes as u64)
            .max()
            .unwrap_or(0);
        // A fit's fixed part and part per request, under the caps.
        let capped = |fit: PullFit| {
            (
                fit.fixed.min(Dur(self.cfg.max_data.0 * DATA_FIXED_CAP)),
                fit.per_request(input).min(self.cfg.max_data),
            )
        };
        let ((data_fixed, data_per_req), (hold_fixed, hold_per_req)) = (capped(pull), capped(hold));
        let net = NetBudget {
            ctrl: f.ctrl.max(ctrl),
            data_fixed: f.data_fixed.max(data_fixed),
            data_per_req: f.data_per_req.max(data_per_req),
            // Results travel one hop (backend to frontend), like a plan.
            resp: f.resp.max(ctrl),
            slack: f.slack,
            hold_fixed,
            hold_per_req,
        };
        let changed = |a: Dur, b: Dur| moved(a, b, Dur::from_us(1));
        // The pull budget holds a quantile: a rise of more than 1% applies at
        // once (a budget held 10% low would leave that many more pulls late),
        // a fall only past 10%.
        let rose = |a: Dur, b: Dur| a.0 > b.0 + (b.0 / 100).max(100);
        if changed(net.ctrl, self.net.ctrl)
            || changed(net.data_fixed, self.net.data_fixed)
            || changed(net.data_per_req, self.net.data_per_req)
            || rose(net.data_fixed, self.net.data_fixed)
            || rose(net.data_per_req, self.net.data_per_req)
            || changed(net.resp, self.net.resp)
            || changed(net.hold_fixed, self.net.hold_fixed)
            || changed(net.hold_per_req, self.net.hold_per_req)
        {
            tracing::info!(
                d_ctrl_us = net.ctrl.as_us_f64(),
                d_data_fixed_us = net.data_fixed.as_us_f64(),
                d_data_us = net.data_per_req.as_us_f64(),
                hold_fixed_us = net.hold_fixed.as_us_f64(),
                hold_us = net.hold_per_req.as_us_f64(),
                "scheduler: network budget changed"
            );
            self.net = net;
            self.actions.push_back(Action::SetNet(net));
        }
        self.report.d_ctrl_us = self.net.ctrl.as_us_f64();
        self.report.d_data_fixed_us = self.net.data_fixed.as_us_f64();
        self.report.d_data_us = self.net.data_per_req.as_us_f64();
        self.report.hold_fixed_us = self.net.hold_fixed.as_us_f64();
        self.report.hold_us = self.net.hold_per_req.as_us_f64();
    }
}

#[path = "sched_control.rs"]
mod control_ops;

#[cfg(test)]
#[path = "sched_tests.rs"]
pub(super) mod tests;
