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

use super::bounds::{GpuIds, Limits, RefusalLog};
use super::check::{self, Submitted};
use super::control::{Control, ControlMode, Decision};
use super::plans::{PlanLedger, Refused};
use super::subclusters::{Move, MoveStats, Phase, SubClusters};
use crate::core::{Dur, GpuId, ModelId, NetBudget, PlanId, PullFit, Task, TaskId, Time};
use crate::node::clock::moved;
use crate::transport::ConnId;
use crate::wire::{
    drops_by_frontend, task_owner, DropReason, ModelAvailability, ModelInfo, Msg, NodeId, PlanTask,
    RegionInfo, Role, MAX_NODE_ID,
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
    },
    Backend {
        node: NodeId,
        gpus: Vec<GpuId>,
        /// Its sub-cluster.
        sub: u32,
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
    /// registered), clamped: control delay and pull cost per batch.
    ctrl_delay: Dur,
    pull: PullFit,
    /// A frontend's response margin per model id (empty until it reports).
    margins: Vec<Dur>,
    /// A hot standby following (it sent `Follow`): the version of the
    /// assignment it was last sent ([`SubClusters::version`]).
    follows: Option<u64>,
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
    /// Its GPUs' global ids.
    pub gpus: Vec<u32>,
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
            ..SchedReport::default()
        };
        SchedProto {
            sub_gpus: vec![0; subs.count() as usize],
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
        }
    }

    /// Model control: `mode`, and with `explicit` the models loaded at
    /// start (before any node registers; see [`super::control`]).
    pub fn set_model_control(&mut self, mode: ControlMode, loaded: &[ModelId]) {
        self.control = Control::new(mode, self.cfg.models.len(), |m| loaded.contains(&m));
    }

    /// The models' states under model control.
    pub fn model_states(&self) -> Vec<crate::wire::ModelStateItem> {
        self.control.all()
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
                    ..
                } => Some(BackendView {
                    node: *node,
                    name: self.names.get(node).cloned().unwrap_or_default(),
                    gpus: gpus.iter().map(|g| g.0).collect(),
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
                margins: Vec::new(),
                follows: None,
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
                ..
            } => {
                pc.ctrl_delay = check::measured(ctrl_delay);
                pc.pull = check::measured_pull(PullFit {
                    fixed: pull,
                    per_mib: pull_per_mib,
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
                }
            }
            Msg::Follow => {
                if !matches!(pc.peer, Peer::New) {
                    return self.reject(c, "Follow from a registered node".into());
                }
                pc.follows = Some(u64::MAX);
                self.followed = true;
                self.send_assignment(c);
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
                started,
                finished,
                ..
            } => self.plan_done(now, c, id, gpu, started, finished),
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
        self.send(
            c,
            Msg::ModelStates {
                items: self.control.all(),
            },
        );
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

    fn plan_done(
        &mut self,
        now: Time,
        c: ConnId,
        plan: PlanId,
        gpu: GpuId,
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
            Ok(d) => {
                self.report.tasks_late += d.late as u64;
                if let Some(l) = self.late_by_model.get_mut(d.model.idx()) {
                    *l += d.late as u64;
                }
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
            node, gpus, sub, ..
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
                missing: BTreeSet::new(),
                draining: None,
            };
        }
        self.report.backends_registered += 1;
        self.gpus_in_service += gpus;
        self.sub_gpus[sub as usize] += gpus;
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
                ..
            } => {
                self.names.remove(&node);
                self.gpu_ids.give_back(self.now, node, &gpus);
                if draining.is_none() {
                    self.gpus_in_service -= gpus.len() as u32;
                    self.sub_gpus[sub as usize] -= gpus.len() as u32;
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
                ..
            } => {
                if draining.is_some() {
                    return;
                }
                *draining = Some((now, false));
                let (node, gpus, sub) = (*node, gpus.clone(), *sub);
                self.gpus_in_service -= gpus.len() as u32;
                self.sub_gpus[sub as usize] -= gpus.len() as u32;
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

    /// A frontend relays a client's load (`load`) or unload of `model`.
    fn model_control(&mut self, now: Time, c: ConnId, model: ModelId, load: bool) {
        if !matches!(
            self.conns.get(&c).map(|p| &p.peer),
            Some(Peer::Frontend { .. })
        ) {
            return self.reject(c, "ModelControl from a node that is not a frontend".into());
        }
        if model.idx() >= self.cfg.models.len() {
            return self.reject(
                c,
                format!("ModelControl for model {}, which is not served", model.0),
            );
        }
        let name = self.cfg.models[model.idx()].name.clone();
        match self.control.ask(model, load) {
            Decision::Refused(why) => {
                let mut item = self.control.item(model);
                item.reason = why;
                return self.send(c, Msg::ModelStates { items: vec![item] });
            }
            Decision::AsIs => {
                let item = self.control.item(model);
                return self.send(c, Msg::ModelStates { items: vec![item] });
            }
            Decision::Load => {
                tracing::info!(model = %name, "scheduler: model load asked");
                self.load_since.insert(model, now);
                self.load_on(self.subs.home(model), model);
            }
            Decision::KeepLoaded => {
                tracing::info!(model = %name, "scheduler: model load asked while it drained; it stays");
            }
            Decision::Drain => {
                tracing::info!(model = %name, "scheduler: model unload asked; its requests finish first");
            }
            Decision::CancelLoad => {
                tracing::info!(model = %name, "scheduler: model unload asked while it loaded");
                self.load_since.remove(&model);
                let home = self.subs.home(model);
                self.unload(home, model);
            }
        }
        self.check_control(now);
        self.tell_states();
    }

    /// A load asked for failed: its sub-cluster's backends unload it.
    fn fail_load(&mut self, model: ModelId, why: String) {
        self.control.load_failed(model, why);
        self.load_since.remove(&model);
        let home = self.subs.home(model);
        self.unload(home, model);
        self.tell_states();
    }

    /// Every frontend hears the models' states that changed.
    fn tell_states(&mut self) {
        let items = self.control.take_changes();
        if items.is_empty() {
            return;
        }
        for c in self.frontend_conns() {
            self.send(
                c,
                Msg::ModelStates {
                    items: items.clone(),
                },
            );
        }
    }

    /// Loads and unloads forward: a loading model that every backend in
    /// service of its sub-cluster holds is ready (one not loaded in
    /// [`MOVE_LOAD_TIMEOUT`] fails); a draining model with no task left (past
    /// the latest deadline it was given plus [`DRAIN_QUIET`], no plan of it in
    /// flight, no move under way) is unloaded.
    fn check_control(&mut self, now: Time) {
        if self.control.mode() == ControlMode::None {
            return;
        }
        for m in self.control.in_state(ModelAvailability::Loading) {
            if !self.sub_missing(self.subs.home(m), m) {
                self.load_since.remove(&m);
                self.control.loaded(m);
                tracing::info!(model = m.0, "scheduler: model loaded");
            } else if self
                .load_since
                .get(&m)
                .is_some_and(|&t| now - t > MOVE_LOAD_TIMEOUT)
            {
                self.fail_load(m, format!("not loaded within {MOVE_LOAD_TIMEOUT:?}"));
            }
        }
        for m in self.control.in_state(ModelAvailability::Unloading) {
            if let Some(mv) = self.subs.moving(m) {
                if mv.phase == Phase::Loading {
                    self.abort_move(m);
                }
                continue;
            }
            let in_flight = self
                .plans
                .lock()
                .expect("plans lock")
                .model_plans(m, |_| true);
            if now < self.subs.last_deadline(m) + DRAIN_QUIET || in_flight > 0 {
                continue;
            }
            self.control.unloaded(m);
            tracing::info!(model = m.0, "scheduler: model unloaded");
            let home = self.subs.home(m);
            self.unload(home, m);
        }
        self.tell_states();
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
        let stalled = now - self.last_check > self.cfg.heartbeat * 2;
        self.last_check = now;
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
    /// largest input of the models.
    fn update_net(&mut self) {
        let (mut rtt, mut pull, mut n) = (Dur::ZERO, PullFit::default(), 0);
        for pc in self.conns.values() {
            if let Peer::Backend { .. } = pc.peer {
                rtt = rtt.max(pc.ctrl_delay);
                pull = pull.max(pc.pull);
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
        let net = NetBudget {
            ctrl: f.ctrl.max(ctrl),
            data_fixed: f
                .data_fixed
                .max(pull.fixed.min(Dur(self.cfg.max_data.0 * DATA_FIXED_CAP))),
            data_per_req: f
                .data_per_req
                .max(pull.per_request(input).min(self.cfg.max_data)),
            // Results travel one hop (backend to frontend), like a plan.
            resp: f.resp.max(ctrl),
            slack: f.slack,
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
        {
            tracing::info!(
                d_ctrl_us = net.ctrl.as_us_f64(),
                d_data_fixed_us = net.data_fixed.as_us_f64(),
                d_data_us = net.data_per_req.as_us_f64(),
                "scheduler: network budget changed"
            );
            self.net = net;
            self.actions.push_back(Action::SetNet(net));
        }
        self.report.d_ctrl_us = self.net.ctrl.as_us_f64();
        self.report.d_data_fixed_us = self.net.data_fixed.as_us_f64();
        self.report.d_data_us = self.net.data_per_req.as_us_f64();
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::wire::{RegionInfo, WireProfile};

    fn proto() -> SchedProto {
        proto_with(SubClusters::single(2))
    }

    fn proto_with(subclusters: SubClusters) -> SchedProto {
        proto_with_limits(subclusters, crate::node::proto::bounds::Limits::default())
    }

    /// A scheduler of two small models (its per-member limits given); the
    /// bounds tests use it too.
    pub(in crate::node::proto) fn proto_with_limits(
        subclusters: SubClusters,
        limits: crate::node::proto::bounds::Limits,
    ) -> SchedProto {
        // (The fuzz drivers have the same model, but production modules, their
        // tests included, must not import the fuzz drivers: tests/core_purity.rs.)
        let model = |i: u32| ModelInfo {
            id: ModelId(i),
            name: format!("m{i}"),
            slo: Dur::from_ms(100),
            profile: WireProfile::Linear {
                alpha_ns: 1_000_000,
                beta_ns: 5_000_000,
                max_batch: 16,
            },
            input_bytes: 64,
            meta_json: String::new(),
        };
        SchedProto::new(
            Time(0),
            SchedConfig {
                models: vec![model(0), model(1)],
                heartbeat: Dur::from_ms(100),
                node_timeout: Dur::from_ms(1000),
                plan_grace: crate::node::proto::plans::PLAN_GRACE,
                net_update: Dur::from_ms(200),
                floors: NetBudget::default(),
                max_ctrl: Dur::from_us(2000),
                max_data: Dur::from_us(500),
                max_margin: Dur::from_us(5000),
                limits,
                subclusters,
            },
        )
    }

    fn frontend(p: &mut SchedProto, c: ConnId) {
        p.handle_accept(Time(0), c);
        p.handle_msg(
            Time(0),
            c,
            Msg::Register {
                role: Role::Frontend,
                name: format!("fe{c}"),
                gpus: vec![],
                ctrl_addr: "x".into(),
                region: Some(RegionInfo {
                    addr: "r".into(),
                    region: 1,
                    len: 1 << 20,
                    rkey: 0,
                    base: 0,
                }),
            },
        );
    }

    fn margins_set(p: &mut SchedProto) -> Vec<Vec<Dur>> {
        std::iter::from_fn(|| p.poll_action())
            .filter_map(|a| match a {
                Action::SetMargins(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    fn closed(p: &mut SchedProto, c: ConnId) -> bool {
        std::iter::from_fn(|| p.poll_action()).any(|a| matches!(a, Action::Close(x, _) if x == c))
    }

    /// Frontends' response margins reach the core per model, the largest over
    /// the frontends, clamped to the cap; they go when a frontend does.
    #[test]
    fn response_margins_take_the_largest_frontends_clamped() {
        let mut p = proto();
        frontend(&mut p, 1);
        frontend(&mut p, 2);
        margins_set(&mut p);
        let us = Dur::from_us;
        p.handle_msg(
            Time(1),
            1,
            Msg::Margins {
                items: vec![(ModelId(0), us(300))],
            },
        );
        assert_eq!(margins_set(&mut p), vec![vec![us(300), Dur::ZERO]]);
        // Frontend 2 answers slower for model 0, and far beyond the cap for 1.
        let items = vec![(ModelId(0), us(900)), (ModelId(1), Dur::from_ms(60))];
        p.handle_msg(Time(2), 2, Msg::Margins { items });
        assert_eq!(margins_set(&mut p), vec![vec![us(900), us(5000)]]);
        // A change under 10% (and 20 us) is not worth a message to the core.
        p.handle_msg(
            Time(3),
            2,
            Msg::Margins {
                items: vec![(ModelId(0), us(910))],
            },
        );
        assert!(margins_set(&mut p).is_empty());
        // Frontend 2 leaves: frontend 1's margins are what is left.
        p.handle_closed(Time(4), 2, "gone".into());
        assert_eq!(margins_set(&mut p), vec![vec![us(300), Dur::ZERO]]);
    }

    #[test]
    fn margins_from_strangers_or_for_unknown_models_close_the_connection() {
        let mut p = proto();
        // Not registered.
        p.handle_accept(Time(0), 7);
        p.handle_msg(
            Time(0),
            7,
            Msg::Margins {
                items: vec![(ModelId(0), Dur(1))],
            },
        );
        assert!(closed(&mut p, 7));
        // A model id the scheduler does not serve.
        frontend(&mut p, 1);
        let items = vec![(ModelId(0), Dur(5)), (ModelId(2), Dur(1))];
        p.handle_msg(Time(1), 1, Msg::Margins { items });
        assert!(closed(&mut p, 1));
        assert!(margins_set(&mut p).is_empty());
    }

    fn ping(now: Time) -> Msg {
        Msg::Ping {
            seq: 0,
            sent: now,
            ctrl_delay: Dur::ZERO,
            pull: Dur::ZERO,
            pull_per_mib: Dur::ZERO,
            term: 0,
        }
    }

    /// Records plan `id` of model 0 on GPU `gpu` of `backend`, planned
    /// `exec_at`..`finish_at`, with one task (id, deadline), as the dispatch
    /// path does.
    fn in_flight(
        p: &SchedProto,
        backend: NodeId,
        (id, gpu): (u64, u32),
        (exec_at, finish_at): (Time, Time),
        task: (TaskId, Time),
    ) {
        let plan = crate::core::Plan {
            id: PlanId(id),
            model: ModelId(0),
            gpu: GpuId(gpu),
            exec_at,
            finish_at,
            tasks: Vec::new(),
        };
        p.plans().lock().unwrap().sent(&plan, backend, [task]);
    }

    /// A backend's report that plan `id` ran on GPU `gpu`.
    fn ran(id: u64, gpu: u32, started: Time, finished: Time) -> Msg {
        Msg::PlanDone {
            id: PlanId(id),
            gpu: GpuId(gpu),
            status: crate::wire::PlanStatus::Ran,
            started,
            finished,
            missing: 0,
        }
    }

    /// Registers a backend with one GPU on connection `c`; its node id.
    fn backend(p: &mut SchedProto, c: ConnId, now: Time) -> NodeId {
        let mut acts = register(p, c, now);
        for m in 0..2 {
            acts.extend(loaded(p, c, now, m, true));
        }
        acts.into_iter()
            .find_map(|a| match a {
                Action::GpusUp { backend, .. } => Some(backend),
                _ => None,
            })
            .expect("the backend's GPU went into service")
    }

    /// A backend that drains leaves the core at once, hears `Drained` only
    /// when its plan in flight is reported done (and the quiet time passed),
    /// is not counted as a GPU in service meanwhile, and leaves without a task
    /// failed; the count of late tasks comes from the reports.
    #[test]
    fn a_draining_backend_finishes_its_plans_then_hears_drained() {
        let ms = |m: i64| Time(m * 1_000_000);
        let mut p = proto();
        frontend(&mut p, 1);
        let fe = 1;
        let b1 = backend(&mut p, 2, ms(0));
        while p.poll_action().is_some() {}
        assert_eq!(p.backends()[0].name, "be2");
        let t = crate::wire::task_id(fe, 1);
        in_flight(&p, b1, (1, 0), (ms(10), ms(14)), (t, ms(15)));
        p.handle_msg(
            ms(5),
            2,
            Msg::Drain {
                reason: "scale in".into(),
            },
        );
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            acts.iter().any(|a| matches!(a, Action::GpusDraining { backend, gpus } if *backend == b1 && gpus == &vec![GpuId(0)])),
            "{acts:?}"
        );
        assert!(
            acts.iter()
                .any(|a| matches!(a, Action::Send(1, Msg::Capacity { gpus: 0 }))),
            "{acts:?}"
        );
        assert!(p.backends()[0].draining);
        let drained = |p: &mut SchedProto| {
            std::iter::from_fn(|| p.poll_action())
                .any(|a| matches!(a, Action::Send(2, Msg::Drained)))
        };
        // The plan is still in flight: no Drained, however long.
        for k in 1..=3 {
            let now = ms(100 * k + 5);
            p.handle_msg(now, 2, ping(now));
            p.handle_timeout(now);
            assert!(!drained(&mut p));
        }
        // Done, 2 ms past the task's deadline: counted late.
        p.handle_msg(ms(310), 2, ran(1, 0, ms(10), ms(17)));
        assert_eq!(p.report().tasks_late, 1);
        p.handle_msg(ms(405), 2, ping(ms(405)));
        p.handle_timeout(ms(405));
        assert!(drained(&mut p), "told once its plans are done");
        p.handle_timeout(ms(505));
        assert!(!drained(&mut p), "told once");
        // It leaves: nothing fails, nothing is counted twice.
        p.handle_msg(
            ms(510),
            2,
            Msg::Unregister {
                reason: "drained".into(),
            },
        );
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            !acts
                .iter()
                .any(|a| matches!(a, Action::Send(_, Msg::Dropped { .. }))),
            "{acts:?}"
        );
        assert_eq!(p.report().backends_left, 1);
        assert_eq!(p.report().backends_drained, 1);
        assert_eq!(p.report().tasks_failed_backend_lost, 0);
        assert!(p.backends().is_empty());
        // A frontend may not drain.
        p.handle_msg(ms(520), 1, Msg::Drain { reason: "x".into() });
        assert!(closed(&mut p, 1));
    }

    /// The watchdog: a backend that still pings but has not reported a plan
    /// done by its end plus the grace is removed and the plan's tasks fail;
    /// one that reports in time stays; after a stall of the scheduler itself
    /// the watchdog waits one more check.
    #[test]
    fn a_backend_with_an_overdue_plan_is_removed_and_its_tasks_fail() {
        let ms = |m: i64| Time(m * 1_000_000);
        let mut p = proto();
        frontend(&mut p, 1);
        let fe = 1; // the first node id
        let b1 = backend(&mut p, 2, ms(0));
        let b2 = backend(&mut p, 3, ms(0));
        while p.poll_action().is_some() {}
        let t = crate::wire::task_id(fe, 1);
        let u = crate::wire::task_id(fe, 2);
        in_flight(&p, b1, (1, 0), (ms(10), ms(20)), (t, Time::NEVER));
        in_flight(&p, b2, (2, 1), (ms(10), ms(20)), (u, Time::NEVER));
        // b2 reports; both keep pinging; b1 never reports plan 1.
        p.handle_msg(ms(21), 3, ran(2, 1, ms(10), ms(20)));
        let mut acts = Vec::new();
        for k in 1..=6 {
            let now = ms(100 * k + 20);
            for c in [1, 2, 3] {
                p.handle_msg(now, c, ping(now));
            }
            p.handle_timeout(now);
            acts.extend(std::iter::from_fn(|| p.poll_action()));
            if k < 5 {
                assert!(
                    acts.iter().all(|a| !matches!(a, Action::Close(..))),
                    "within the grace (520 ms)"
                );
            }
        }
        assert!(
            acts.iter()
                .any(|a| matches!(a, Action::Close(2, why) if why.contains("plan 1"))),
            "{acts:?}"
        );
        assert!(acts
            .iter()
            .any(|a| matches!(a, Action::GpusDown { backend, .. } if *backend == b1)));
        assert!(acts.iter().any(|a| matches!(a, Action::Send(1, Msg::Dropped { items }) if items.len() == 1 && items[0].0 == t)), "{acts:?}");
        assert!(
            !acts.iter().any(|a| matches!(a, Action::Close(3, _))),
            "b2 reported in time"
        );
        assert_eq!(p.report().backends_overdue, 1);

        // A stall of the scheduler: the first check after it does not act.
        // (b3 joins once b1's GPU id is out of quarantine, and gets it.)
        let b3 = backend(&mut p, 4, ms(1200));
        in_flight(&p, b3, (3, 0), (ms(10), ms(20)), (u, Time::NEVER));
        let now = ms(2000);
        for c in [1, 3, 4] {
            p.handle_msg(now, c, ping(now));
        }
        p.handle_timeout(now);
        assert!(!closed(&mut p, 4), "the check after a stall waits");
        let now = ms(2100);
        for c in [1, 3, 4] {
            p.handle_msg(now, c, ping(now));
        }
        p.handle_timeout(now);
        assert!(closed(&mut p, 4));
    }

    /// A backend with one GPU registers on connection `c`: what follows.
    fn register(p: &mut SchedProto, c: ConnId, now: Time) -> Vec<Action> {
        register_typed(p, c, now, &["g"])
    }

    /// A backend on connection `c` registers one GPU of each type in `types`.
    fn register_typed(p: &mut SchedProto, c: ConnId, now: Time, types: &[&str]) -> Vec<Action> {
        p.handle_accept(now, c);
        p.handle_msg(
            now,
            c,
            Msg::Register {
                role: Role::Backend,
                name: format!("be{c}"),
                gpus: types
                    .iter()
                    .enumerate()
                    .map(|(i, t)| crate::wire::GpuInfo {
                        local: i as u32,
                        name: t.to_string(),
                        mem_bytes: 1 << 30,
                    })
                    .collect(),
                ctrl_addr: String::new(),
                region: None,
            },
        );
        std::iter::from_fn(|| p.poll_action()).collect()
    }

    /// The states frontend connection `c` was told in `acts`.
    fn states(acts: &[Action], c: ConnId) -> Vec<(u32, ModelAvailability, String)> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Send(x, Msg::ModelStates { items }) if *x == c => Some(items),
                _ => None,
            })
            .flatten()
            .map(|i| (i.model.0, i.state, i.reason.clone()))
            .collect()
    }

    fn control(p: &mut SchedProto, now: Time, m: u32, load: bool) -> Vec<Action> {
        p.handle_msg(
            now,
            1,
            Msg::ModelControl {
                model: ModelId(m),
                load,
            },
        );
        std::iter::from_fn(|| p.poll_action()).collect()
    }

    /// Explicit model control: a model not loaded at start is on no backend
    /// and takes no task; a load asked by a client loads it on the backends
    /// and makes it ready once they confirm; an unload stops new tasks at
    /// once and unloads it only after the latest deadline it was given; every
    /// change reaches the frontends.
    #[test]
    fn explicit_model_control_loads_then_drains_before_it_unloads() {
        use ModelAvailability::*;
        let ms = |m: i64| Time(m * 1_000_000);
        let mut p = proto();
        p.set_model_control(ControlMode::Explicit, &[ModelId(0)]);
        frontend(&mut p, 1);
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(
            states(&acts, 1),
            vec![(0, Ready, String::new()), (1, Unavailable, String::new())]
        );
        let acts = register(&mut p, 2, ms(0));
        assert_eq!(loads(&acts, 2), (vec![0], vec![]), "only the loaded model");
        loaded(&mut p, 2, ms(0), 0, true);
        let acts = submit(&mut p, ms(1), 1, 1, ms(50));
        assert!(
            acts.iter().any(|a| matches!(a, Action::Send(1, Msg::Dropped { items }) if items[0].1 == DropReason::ModelRemoved)),
            "{acts:?}"
        );
        // Load model 1.
        let acts = control(&mut p, ms(2), 1, true);
        assert_eq!(loads(&acts, 2), (vec![1], vec![]));
        assert_eq!(states(&acts, 1), vec![(1, Loading, String::new())]);
        let acts = loaded(&mut p, 2, ms(3), 1, true);
        assert_eq!(states(&acts, 1), vec![(1, Ready, String::new())]);
        let acts = control(&mut p, ms(3), 1, true);
        assert_eq!(states(&acts, 1), vec![(1, Ready, String::new())], "as is");
        let acts = submit(&mut p, ms(4), 2, 1, ms(300));
        assert!(
            acts.iter().any(|a| matches!(a, Action::Submit(_))),
            "{acts:?}"
        );
        // Unload it: new tasks are dropped at once, the backend keeps it
        // until the latest deadline given (300 ms) has passed.
        let acts = control(&mut p, ms(5), 1, false);
        assert_eq!(states(&acts, 1), vec![(1, Unloading, String::new())]);
        assert_eq!(loads(&acts, 2), (vec![], vec![]));
        let acts = submit(&mut p, ms(6), 3, 1, ms(400));
        assert!(
            !acts.iter().any(|a| matches!(a, Action::Submit(_))),
            "{acts:?}"
        );
        p.handle_timeout(ms(350));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(
            loads(&acts, 2),
            (vec![], vec![]),
            "still draining: {acts:?}"
        );
        p.handle_timeout(ms(500));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(loads(&acts, 2), (vec![], vec![1]));
        assert_eq!(states(&acts, 1), vec![(1, Unavailable, String::new())]);
        // A failed load: unavailable, with the backend's reason.
        control(&mut p, ms(600), 1, true);
        let acts = loaded(&mut p, 2, ms(601), 1, false);
        let st = states(&acts, 1);
        assert_eq!((st[0].0, st[0].1), (1, Unavailable), "{st:?}");
        assert!(st[0].2.contains("failed to load"), "{st:?}");
        assert_eq!(loads(&acts, 2), (vec![], vec![1]));
        // A model not loaded does not move.
        assert!(!p.move_model(ms(700), ModelId(1), 0));
        // With none, a load is refused with the reason.
        let mut q = proto();
        frontend(&mut q, 1);
        std::iter::from_fn(|| q.poll_action()).for_each(drop);
        let acts = control(&mut q, ms(1), 0, false);
        let st = states(&acts, 1);
        assert!(
            st[0].1 == Ready && st[0].2.contains("model-control-mode none"),
            "{st:?}"
        );
    }

    /// Typed sub-clusters: a backend joins one of its GPUs' type; one of a
    /// type no sub-cluster has, or of mixed types, is refused with the reason;
    /// an epoch's answer never moves a model to another type.
    #[test]
    fn a_backend_joins_a_subcluster_of_its_gpu_type_and_models_stay_on_theirs() {
        let ms = |m: i64| Time(m * 1_000_000);
        let subs = SubClusters::new(2, vec![0, 1])
            .unwrap()
            .with_types(vec!["A100".into(), "T4".into()])
            .unwrap();
        let mut p = proto_with(subs);
        frontend(&mut p, 1);
        // Two T4 backends: both in sub-cluster 1, though 0 has fewer GPUs.
        for c in [2, 3] {
            let acts = register_typed(&mut p, c, ms(0), &["t4"]);
            assert_eq!(loads(&acts, c), (vec![1], vec![]), "{acts:?}");
            loaded(&mut p, c, ms(0), 1, true);
        }
        let acts = register_typed(&mut p, 4, ms(0), &["A100", "A100"]);
        assert_eq!(loads(&acts, 4), (vec![0], vec![]));
        loaded(&mut p, 4, ms(0), 0, true);
        let mut subs: Vec<u32> = p.backends().iter().map(|b| b.subcluster).collect();
        subs.sort_unstable();
        assert_eq!(subs, vec![0, 1, 1]);
        let refused = |acts: &[Action], c: ConnId, what: &str| {
            acts.iter().any(|a| {
                matches!(a, Action::Send(x, Msg::Error { message }) if *x == c && message.contains(what))
            }) && acts.iter().any(|a| matches!(a, Action::Close(x, _) if *x == c))
        };
        let acts = register_typed(&mut p, 5, ms(0), &["H100"]);
        assert!(
            refused(&acts, 5, "no sub-cluster takes GPUs of type \"H100\""),
            "{acts:?}"
        );
        let acts = register_typed(&mut p, 6, ms(0), &["A100", "T4"]);
        assert!(refused(&acts, 6, "of one type"), "{acts:?}");
        assert_eq!(p.backends().len(), 3);
        // Model 1 (T4) cannot be moved to the A100 sub-cluster.
        assert_eq!(p.repartition(ms(1), &[0, 0]), 0);
        assert_eq!(p.subclusters().homes(), &[0, 1]);
    }

    /// Connection `c`'s backend confirms model `m` (or fails to load it).
    fn loaded(p: &mut SchedProto, c: ConnId, now: Time, m: u32, ok: bool) -> Vec<Action> {
        p.handle_msg(
            now,
            c,
            Msg::ModelLoaded {
                model: ModelId(m),
                ok,
                error: if ok {
                    String::new()
                } else {
                    "no memory".into()
                },
                device_bytes: 0,
            },
        );
        std::iter::from_fn(|| p.poll_action()).collect()
    }

    /// The models a list of actions tells connection `c` to load / unload.
    fn loads(acts: &[Action], c: ConnId) -> (Vec<u32>, Vec<u32>) {
        let mut v = (Vec::new(), Vec::new());
        for a in acts {
            match a {
                Action::Send(x, Msg::LoadModel { model }) if *x == c => v.0.push(model.id.0),
                Action::Send(x, Msg::UnloadModel { model }) if *x == c => v.1.push(model.0),
                _ => {}
            }
        }
        v
    }

    fn submit(p: &mut SchedProto, now: Time, seq: u64, model: u32, deadline: Time) -> Vec<Action> {
        p.handle_msg(
            now,
            1,
            Msg::Submit {
                tasks: vec![crate::wire::SubmitTask {
                    id: crate::wire::task_id(1, seq),
                    model: ModelId(model),
                    arrival: now,
                    deadline,
                    input: 0,
                    cap: 1,
                }],
            },
        );
        std::iter::from_fn(|| p.poll_action()).collect()
    }

    /// A model moves live between two sub-clusters: the target's backends load
    /// it while tasks still go to the source; once they confirm, new tasks go
    /// to the target; the source unloads it only after the latest deadline it
    /// was given and once its plans of the model are done.
    #[test]
    fn a_model_moves_live_load_switch_then_unload_after_the_source_drains() {
        let ms = |m: i64| Time(m * 1_000_000);
        let mut p = proto_with(SubClusters::new(2, vec![0, 1]).unwrap());
        frontend(&mut p, 1);
        // Each backend joins the sub-cluster with the fewest GPUs and loads
        // only that sub-cluster's models.
        let acts = register(&mut p, 2, ms(0));
        assert_eq!(loads(&acts, 2), (vec![0], vec![]));
        let acts = loaded(&mut p, 2, ms(0), 0, true);
        assert!(acts
            .iter()
            .any(|a| matches!(a, Action::GpusUp { subcluster: 0, .. })));
        let acts = register(&mut p, 3, ms(0));
        assert_eq!(loads(&acts, 3), (vec![1], vec![]));
        let acts = loaded(&mut p, 3, ms(0), 1, true);
        assert!(acts
            .iter()
            .any(|a| matches!(a, Action::GpusUp { subcluster: 1, .. })));
        let a = p.backends()[0].node;
        assert_eq!(
            p.backends()
                .iter()
                .map(|b| b.subcluster)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );

        let acts = submit(&mut p, ms(1), 1, 0, ms(50));
        assert!(acts.iter().any(|a| matches!(a, Action::Submit(_))));
        assert!(p.move_model(ms(2), ModelId(0), 1));
        assert!(!p.move_model(ms(2), ModelId(0), 1), "one move at a time");
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(loads(&acts, 3), (vec![0], vec![]), "{acts:?}");
        assert_eq!(loads(&acts, 2), (vec![], vec![]));
        assert!(!acts.iter().any(|a| matches!(a, Action::Route { .. })));
        // Still loading: the task goes to the source (its home).
        submit(&mut p, ms(3), 2, 0, ms(60));
        assert_eq!(p.subclusters().home(ModelId(0)), 0);
        // A backend joining the target now loads the moving model too.
        let acts = register(&mut p, 4, ms(3));
        assert_eq!(
            loads(&acts, 4),
            (vec![0], vec![]),
            "fewest GPUs: sub-cluster 0"
        );
        // The target confirms: the switch.
        let acts = loaded(&mut p, 3, ms(4), 0, true);
        assert!(
            acts.iter().any(|a| matches!(
                a,
                Action::Route {
                    model: ModelId(0),
                    subcluster: 1
                }
            )),
            "{acts:?}"
        );
        assert_eq!(p.subclusters().home(ModelId(0)), 1);
        // A plan of model 0 at the source, in flight.
        let task = crate::wire::task_id(1, 2);
        in_flight(&p, a, (7, 0), (ms(40), ms(45)), (task, ms(60)));
        // Past the last deadline (60 ms) and the quiet time, but the plan is in
        // flight: no unload.
        for k in 1..=3 {
            let now = ms(100 * k + 100);
            for c in [2, 3] {
                p.handle_msg(now, c, ping(now));
            }
            p.handle_timeout(now);
            let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
            assert_eq!(loads(&acts, 2), (vec![], vec![]), "{acts:?}");
        }
        p.handle_msg(ms(410), 2, ran(7, 0, ms(40), ms(45)));
        p.handle_timeout(ms(500));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(loads(&acts, 2), (vec![], vec![0]), "{acts:?}");
        assert_eq!(loads(&acts, 4), (vec![], vec![0]), "the loading one too");
        assert_eq!(p.report().moves.done, 1);
        assert!(!p.subclusters().holds(0, ModelId(0)));
    }

    /// What was sent on connection `c`.
    fn sent_on(acts: &[Action], c: ConnId) -> Vec<&Msg> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Send(x, m) if *x == c => Some(m),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_following_standby_is_sent_the_assignment_when_it_changes() {
        let ms = |m: i64| Time(m * 1_000_000);
        let mut p = two_subclusters();
        std::iter::from_fn(|| p.poll_action()).for_each(drop);
        p.handle_accept(ms(1), 9);
        p.handle_msg(ms(1), 9, Msg::Follow);
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(
            sent_on(&acts, 9),
            vec![&Msg::Assignment { homes: vec![0, 1] }]
        );
        // Unchanged: a ping gets its pong only.
        p.handle_msg(ms(2), 9, ping(ms(2)));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            matches!(&sent_on(&acts, 9)[..], [Msg::Pong { .. }]),
            "{acts:?}"
        );
        // A move switches model 0 to sub-cluster 1: the next ping carries it.
        assert!(p.move_model(ms(3), ModelId(0), 1));
        loaded(&mut p, 3, ms(4), 0, true);
        assert_eq!(p.subclusters().home(ModelId(0)), 1);
        std::iter::from_fn(|| p.poll_action()).for_each(drop);
        p.handle_msg(ms(5), 9, ping(ms(5)));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            matches!(&sent_on(&acts, 9)[..], [Msg::Pong { .. }, Msg::Assignment { homes }] if homes == &vec![1, 1]),
            "{acts:?}"
        );
        // Backends are not sent it; a registered node may not follow.
        p.handle_msg(ms(6), 2, ping(ms(6)));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            matches!(&sent_on(&acts, 2)[..], [Msg::Pong { .. }]),
            "{acts:?}"
        );
        p.handle_msg(ms(6), 2, Msg::Follow);
        assert!(closed(&mut p, 2));
    }

    #[test]
    fn a_standby_taking_over_adopts_the_assignment_before_backends_register() {
        let mut p = proto_with(SubClusters::new(2, vec![0, 1]).unwrap());
        frontend(&mut p, 1);
        std::iter::from_fn(|| p.poll_action()).for_each(drop);
        for (bad, why) in [(vec![0], "names 1 models"), (vec![0, 2], "sub-cluster 2")] {
            let e = p.adopt_assignment(&bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        assert_eq!(p.adopt_assignment(&[1, 1]), Ok(1));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            matches!(
                &acts[..],
                [Action::Route {
                    model: ModelId(0),
                    subcluster: 1
                }]
            ),
            "{acts:?}"
        );
        assert_eq!(p.subclusters().homes(), &[1, 1]);
        // Backends joining now load what the adopted homes say.
        let acts = register(&mut p, 2, Time(0));
        assert_eq!(
            loads(&acts, 2),
            (vec![], vec![]),
            "sub-cluster 0 holds none"
        );
        let acts = register(&mut p, 3, Time(0));
        assert_eq!(loads(&acts, 3), (vec![0, 1], vec![]));
        let e = p.adopt_assignment(&[0, 1]).unwrap_err();
        assert!(e.contains("backends registered"), "{e}");
    }

    /// Two sub-clusters, model 0 in the first and model 1 in the second, a
    /// one-GPU backend in each (connections 2 and 3).
    fn two_subclusters() -> SchedProto {
        let mut p = proto_with(SubClusters::new(2, vec![0, 1]).unwrap());
        for (c, m) in [(2, 0), (3, 1)] {
            register(&mut p, c, Time(0));
            loaded(&mut p, c, Time(0), m, true);
        }
        p
    }

    /// A model that fails to load at its target stays home; the backend that
    /// failed stays in service.
    #[test]
    fn a_failed_load_aborts_the_move() {
        let ms = |m: i64| Time(m * 1_000_000);
        let mut p = two_subclusters();
        assert!(p.move_model(ms(1), ModelId(1), 0));
        while p.poll_action().is_some() {}
        let acts = loaded(&mut p, 2, ms(2), 1, false);
        assert_eq!(loads(&acts, 2), (vec![], vec![1]), "{acts:?}");
        assert!(!acts
            .iter()
            .any(|a| matches!(a, Action::Route { .. } | Action::Close(..))));
        assert_eq!(p.subclusters().home(ModelId(1)), 1);
        assert_eq!(p.report().moves.aborted, 1);
        assert_eq!(p.backends().len(), 2);
    }

    /// A load that never confirms: after [`MOVE_LOAD_TIMEOUT`] the move is off.
    #[test]
    fn a_load_that_hangs_aborts_the_move_in_time() {
        let ms = |m: i64| Time(m * 1_000_000);
        let mut p = two_subclusters();
        assert!(p.move_model(ms(1), ModelId(0), 1));
        let step = |p: &mut SchedProto, now: Time| {
            for c in [2, 3] {
                p.handle_msg(now, c, ping(now));
            }
            p.handle_timeout(now);
            std::iter::from_fn(|| p.poll_action()).collect::<Vec<_>>()
        };
        let early = MOVE_LOAD_TIMEOUT - Dur::from_ms(10);
        assert_eq!(loads(&step(&mut p, ms(1) + early), 3).1, Vec::<u32>::new());
        // (The next heartbeat check after the timeout.)
        let acts = step(&mut p, ms(1) + MOVE_LOAD_TIMEOUT + Dur::from_ms(200));
        assert_eq!(loads(&acts, 3), (vec![], vec![0]), "{acts:?}");
        assert_eq!(p.subclusters().home(ModelId(0)), 0);
        assert_eq!(p.report().moves.aborted, 1);
    }

    fn ping_of(term: u64) -> Msg {
        match ping(Time(0)) {
            Msg::Ping {
                seq,
                sent,
                ctrl_delay,
                pull,
                pull_per_mib,
                ..
            } => Msg::Ping {
                seq,
                sent,
                ctrl_delay,
                pull,
                pull_per_mib,
                term,
            },
            _ => unreachable!(),
        }
    }

    fn stepped(acts: &[Action]) -> Option<u64> {
        acts.iter().find_map(|a| match a {
            Action::StepDown { term, .. } => Some(*term),
            _ => None,
        })
    }

    /// Pongs and acks carry the term; a followed scheduler that hears of a
    /// newer term from a node steps down: an `Error` to every connection, and
    /// nothing after (no timers, new connections refused).
    #[test]
    fn a_followed_scheduler_steps_down_on_a_node_s_newer_term() {
        let mut p = proto();
        assert_eq!(p.term(), 1);
        frontend(&mut p, 1);
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            sent_on(&acts, 1)
                .iter()
                .any(|m| matches!(m, Msg::RegisterAck { term: 1, .. })),
            "{acts:?}"
        );
        p.handle_msg(Time(1), 1, ping_of(1));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            matches!(&sent_on(&acts, 1)[..], [Msg::Pong { term: 1, .. }]),
            "{acts:?}"
        );
        // A standby follows it, then a node pings with term 2.
        p.handle_accept(Time(2), 9);
        p.handle_msg(Time(2), 9, Msg::Follow);
        p.handle_accept(Time(3), 5);
        std::iter::from_fn(|| p.poll_action()).for_each(drop);
        p.handle_msg(Time(3), 5, ping_of(2));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(stepped(&acts), Some(2), "{acts:?}");
        for c in [1, 5, 9] {
            assert!(
                matches!(&sent_on(&acts, c)[..], [Msg::Error { message }] if message.contains("term 2")),
                "{c}: {acts:?}"
            );
            assert!(acts
                .iter()
                .any(|a| matches!(a, Action::Close(x, _) if *x == c)));
        }
        assert_eq!(p.stepped_down(), Some(2));
        assert_eq!(p.poll_timeout(), Time::NEVER);
        p.handle_accept(Time(4), 6);
        p.handle_msg(Time(4), 6, ping_of(0));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert!(
            matches!(&sent_on(&acts, 6)[..], [Msg::Error { .. }]),
            "{acts:?}"
        );
    }

    /// No standby ever followed it: a node's newer term is an earlier
    /// cluster's, and it serves on above it (the node gets its pong).
    #[test]
    fn a_never_followed_scheduler_serves_on_above_a_node_s_term() {
        let mut p = proto();
        p.handle_accept(Time(1), 5);
        p.handle_msg(Time(1), 5, ping_of(7));
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(stepped(&acts), None);
        assert_eq!(p.term(), 8);
        assert!(
            matches!(&sent_on(&acts, 5)[..], [Msg::Pong { term: 8, .. }]),
            "{acts:?}"
        );
        // Any term a member sends is taken without overflow.
        p.handle_msg(Time(2), 5, ping_of(u64::MAX));
        assert_eq!(p.term(), u64::MAX);
    }

    /// A `Fence` of a newer term steps any scheduler down; one of an older term
    /// is answered with this scheduler's term (its sender steps down), then
    /// closed; one from a registered node is a protocol error.
    #[test]
    fn fences_step_down_or_are_answered() {
        let mut p = proto();
        p.set_term(3);
        p.handle_accept(Time(1), 5);
        p.handle_msg(Time(1), 5, Msg::Fence { term: 2 });
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(sent_on(&acts, 5), vec![&Msg::Fence { term: 3 }]);
        assert!(acts.iter().any(|a| matches!(a, Action::Close(5, _))));
        assert_eq!(stepped(&acts), None);
        frontend(&mut p, 1);
        std::iter::from_fn(|| p.poll_action()).for_each(drop);
        p.handle_msg(Time(2), 1, Msg::Fence { term: 9 });
        assert!(closed(&mut p, 1), "a node may not fence");
        assert_eq!(p.stepped_down(), None);
        p.handle_accept(Time(3), 6);
        p.handle_msg(Time(3), 6, Msg::Fence { term: 4 });
        let acts: Vec<Action> = std::iter::from_fn(|| p.poll_action()).collect();
        assert_eq!(stepped(&acts), Some(4));
        // A fence of its own term: the fencer took over from it before it
        // learnt this term; the tie goes to the fencer.
        let mut e = proto();
        e.set_term(2);
        e.handle_accept(Time(1), 5);
        e.handle_msg(Time(1), 5, Msg::Fence { term: 2 });
        let acts: Vec<Action> = std::iter::from_fn(|| e.poll_action()).collect();
        assert_eq!(stepped(&acts), Some(2), "{acts:?}");
        assert!(sent_on(&acts, 5)
            .iter()
            .all(|m| !matches!(m, Msg::Fence { .. })));
        // Its own fencer hearing a newer term does the same.
        let mut q = proto();
        q.handle_fenced(1);
        assert_eq!(q.stepped_down(), None, "not newer");
        q.handle_fenced(2);
        assert_eq!(q.stepped_down(), Some(2));
    }
}
