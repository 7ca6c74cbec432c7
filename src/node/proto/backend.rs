//! The backend's node protocol as pure state machines: its membership and
//! health ([`BackendProto`]: clock sync, registration, models loaded matched by
//! id, frontends attached, heartbeats, the checks on plans), its per-GPU plan
//! queue ([`PlanQueue`]), its input-pull tracking ([`pull_requests`],
//! [`pull_budget`], [`classify_input`]) and how a batch ends ([`cut_batch`],
//! [`settle`]). The real driver ([`crate::node::backend`]) and the cluster
//! simulator run the same code.
//!
//! # Membership
//! Clock sync, `Register`, heartbeats and reconnecting after the scheduler is
//! lost are the shared [`Member`] machine. Each `LoadModel` goes to every GPU
//! ([`Action::Load`]); when every GPU confirmed it, the scheduler hears
//! `ModelLoaded` with the largest device footprint. A model the GPUs still hold
//! from before a rejoin, with the same description, is confirmed at once. On
//! `RegisterAck` the backend is ready ([`Action::Ready`]). When the scheduler is
//! lost ([`Action::Lost`]) the session's plans are void (the driver fails the
//! queued ones at their frontends), every frontend is detached (the scheduler
//! announces them again), and the backend rejoins.
//!
//! # Checks on plans
//! A plan is queued ([`Action::Queue`]) only if it is for one of this backend's
//! GPUs, for a model every GPU has loaded, and starts within [`check::MAX_SLO`]
//! of now. Otherwise its tasks end as `Failed` at their frontends and, when the
//! GPU is ours, the scheduler hears `PlanDone{Failed}`: a plan is never lost
//! silently.

use super::check;
use super::member::{self, Member, MemberCounts};
use crate::core::{Dur, GpuId, LatencyProfile, ModelId, PlanId, PullFit, TaskId, Time};
use crate::node::clock::{Delays, Recent};
use crate::transport::{ConnId, InputRef, ReadError, ReadReq, SlotHeader, SLOT_HEADER};
use crate::wire::{
    task_owner, DropReason, GpuInfo, ModelInfo, Msg, NodeId, PlanStatus, PlanTask, RegionInfo,
    Role, TaskResult, TaskStatus, MAX_NODE_ID, NET_QUANTILE,
};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

pub use super::member::{DEFAULT_HEARTBEAT, SYNC_MAX, SYNC_PING, SYNC_SAMPLES};
/// Plan delays kept for the control delay (bursts count once: [`Delays`]).
pub const PLAN_DELAYS_MAX: usize = 4096;
/// Plan delays measured before they alone make the control delay (until then the
/// ping round trips stand in).
pub const PLAN_DELAYS_MIN: usize = 64;

/// A plan as the backend keeps it (times on the scheduler's clock; `gpu` is the
/// global id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanMsg {
    pub id: PlanId,
    pub model: ModelId,
    pub gpu: GpuId,
    pub exec_at: Time,
    /// The run time the scheduler planned (its `finish_at - exec_at`): l(b) of
    /// the profile it planned the model with ([`planned_profile`]).
    pub span: Dur,
    pub tasks: Vec<PlanTask>,
}

/// What the driver must do.
#[derive(Debug, Clone)]
pub enum Action {
    /// Open a connection to the scheduler at this address; report it with
    /// [`BackendProto::handle_sched_connected`] or
    /// [`BackendProto::handle_sched_connect_failed`].
    Connect(String),
    /// Send a message on a connection (the scheduler's or a frontend's).
    Send(ConnId, Msg),
    /// Close a connection (this machine has already forgotten it).
    Close(ConnId, String),
    /// The offset of the scheduler's clock from ours changed (and its error bound).
    SetClock { offset: Dur, error: Dur },
    /// Load a model on every GPU; report each GPU's result with
    /// [`BackendProto::handle_loaded`].
    Load(ModelInfo, LatencyProfile),
    /// A model still loaded from before a rejoin: have every GPU's worker
    /// confirm it once it is free (done with what it runs now, so a GPU stuck in
    /// a batch does not come back into service before it is free); report each
    /// with [`BackendProto::handle_loaded`].
    Confirm(ModelId),
    /// Unload a model from every GPU.
    Unload(ModelId),
    /// Attach a frontend's region and connect to it; report the connection with
    /// [`BackendProto::handle_connected`].
    Attach {
        node: NodeId,
        ctrl_addr: String,
        region: RegionInfo,
    },
    /// Detach a frontend's region and close its connection, if any.
    Detach { node: NodeId, conn: Option<ConnId> },
    /// Dial frontend `node`'s control address again, off the event loop (its
    /// connection closed while it is announced up, [`super::redial`]);
    /// report with [`BackendProto::handle_connected`] when
    /// [`BackendProto::wants_frontend`], else with
    /// [`BackendProto::handle_frontend_dial_failed`].
    Redial { node: NodeId, ctrl_addr: String },
    /// Pull the plan's inputs and queue it on local GPU `gpu`.
    Queue { gpu: usize, plan: PlanMsg },
    /// Registered (again): these are our GPUs' global ids, in local order;
    /// `away`: how long the backend was out of service before this rejoin.
    Ready { gpus: Vec<GpuId>, away: Option<Dur> },
    /// The scheduler answered our `Drain`: no plan follows, none it sent is
    /// unreported; finish what is queued and leave.
    Drained,
    /// The scheduler is lost: every plan queued so far is void (fail its tasks
    /// at their frontends, report nothing to the scheduler); the backend
    /// reconnects on its own.
    Lost(String),
}

/// What the backend's protocol counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProtoCounts {
    pub plans_received: u64,
    /// Plans refused by the checks (their tasks failed).
    pub plans_refused: u64,
    /// Of those, plans for a model not loaded here (the scheduler must never
    /// send one: the cluster simulator checks it).
    pub refused_not_loaded: u64,
    /// Models the GPUs held from before a rejoin that the new session's
    /// scheduler did not ask for, unloaded at its `RegisterAck`.
    pub stale_unloaded: u64,
    /// Messages of a kind the backend does not expect, ignored or closed on.
    pub unexpected: u64,
}

/// A model being loaded on every GPU.
struct Loading {
    /// Its description, kept once every GPU has it.
    info: ModelInfo,
    /// GPUs that have not confirmed it yet.
    gpus_left: u32,
    /// The largest device footprint reported so far.
    bytes: u64,
}

/// The backend's membership, health and plan checks (see the module docs).
/// Times passed in are on the backend's own clock.
pub struct BackendProto {
    member: Member,
    gpus: Vec<GpuInfo>,
    /// Global GPU id -> local index (as the current registration numbered them).
    gpu_map: HashMap<GpuId, usize>,
    plan_delay: Delays,
    /// The models being loaded.
    loading: HashMap<ModelId, Loading>,
    /// The models every GPU holds, as they were described, with their footprint
    /// (kept across rejoins: the GPUs keep them).
    loaded: HashMap<ModelId, (ModelInfo, u64)>,
    /// The models the current registration's scheduler asked for (`LoadModel` since the
    /// last `Register`): at the `RegisterAck` the GPUs drop every other model
    /// they still hold from before a rejoin.
    asked: BTreeSet<ModelId>,
    /// Largest input of the models loaded (bytes).
    max_input: u32,
    frontends: HashMap<NodeId, ConnId>,
    fe_conns: HashMap<ConnId, NodeId>,
    redials: super::redial::Redials,
    /// The pull cost per batch and what a pull holds a GPU's puller (fitted
    /// by the driver's [`crate::core::PullEstimator`]).
    pull: PullFit,
    hold: PullFit,
    counts: ProtoCounts,
    out: VecDeque<Action>,
}

impl BackendProto {
    /// A backend connected to the scheduler at `addrs[0]` on `sched` at `now`
    /// (`addrs`: every scheduler it may join, a standby's too); it starts by
    /// pinging (take the first [`Action`]s with [`BackendProto::poll_action`]).
    pub fn new(
        now: Time,
        sched: ConnId,
        addrs: Vec<String>,
        name: String,
        gpus: Vec<GpuInfo>,
        timeout: Dur,
    ) -> Self {
        let register = Msg::Register {
            role: Role::Backend,
            name,
            gpus: gpus.clone(),
            ctrl_addr: String::new(),
            region: None,
        };
        let mut p = BackendProto {
            member: Member::new(now, sched, addrs, register, timeout),
            gpus,
            gpu_map: HashMap::new(),
            plan_delay: Delays::new(PLAN_DELAYS_MAX),
            loading: HashMap::new(),
            loaded: HashMap::new(),
            asked: BTreeSet::new(),
            max_input: 0,
            frontends: HashMap::new(),
            fe_conns: HashMap::new(),
            redials: Default::default(),
            pull: PullFit::default(),
            hold: PullFit::default(),
            counts: ProtoCounts::default(),
            out: VecDeque::new(),
        };
        p.take_member();
        p
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// When [`BackendProto::handle_timeout`] is next due (our clock).
    pub fn poll_timeout(&self) -> Time {
        self.member.poll_timeout().min(self.redials.next())
    }

    /// Its membership's phase and scheduler address ([`Member::describe`]).
    pub fn describe_member(&self) -> String {
        self.member.describe()
    }

    /// In service: registered, its GPUs acknowledged.
    pub fn is_ready(&self) -> bool {
        self.member.is_ready()
    }

    pub fn counts(&self) -> ProtoCounts {
        self.counts
    }

    /// What the membership counted (joins, scheduler losses).
    pub fn member_counts(&self) -> MemberCounts {
        self.member.counts()
    }

    /// The scheduler's clock minus ours (0 before the first pong).
    pub fn offset(&self) -> Dur {
        self.member.offset()
    }

    /// The scheduler's connection, while there is one.
    pub fn sched_conn(&self) -> Option<ConnId> {
        self.member.conn()
    }

    /// The highest scheduler term seen, and the term of the scheduler on the
    /// connection now ([`Member::term`], [`Member::conn_term`]).
    pub fn terms(&self) -> (u64, Option<u64>) {
        (self.member.term(), self.member.conn_term())
    }

    /// Our connection to frontend `node`, when it is up.
    pub fn frontend(&self, node: NodeId) -> Option<ConnId> {
        self.frontends.get(&node).copied()
    }

    /// The largest input of the models loaded so far (bytes).
    pub fn max_input(&self) -> u32 {
        self.max_input
    }

    /// Whether every GPU has loaded `model`.
    pub fn has_loaded(&self, model: ModelId) -> bool {
        self.loaded.contains_key(&model)
    }

    /// One-way plan delay's tail at [`NET_QUANTILE`] ([`Delays::tail`];
    /// scheduler's send to our receipt).
    pub fn plan_delay(&self) -> Dur {
        Dur(self.plan_delay.tail(NET_QUANTILE))
    }

    /// The plan delays measured so far (scheduler's send to our receipt).
    pub fn plan_delays(&self) -> &Recent {
        self.plan_delay.recent()
    }

    /// The control delay this backend reports (ns, 0 = none yet): once enough
    /// plans came, their one-way delay at [`NET_QUANTILE`] plus the clock
    /// offset's error bound (the delays are measured across the two clocks);
    /// before that, half the ping round trip at the same quantile. Stalls weigh
    /// as one sample each ([`Delays`]), so one does not move the budget.
    pub fn ctrl_delay(&self) -> Dur {
        if self.plan_delay.len() < PLAN_DELAYS_MIN {
            return Dur(self.member.rtt_tail(NET_QUANTILE).0 / 2).max(self.plan_delay());
        }
        let err = self.member.offset_error();
        Dur(self.plan_delay().0.saturating_add(err.0))
    }

    /// The driver's latest fits of the pull cost per batch and of what a
    /// pull holds a GPU's puller (reported in pings).
    pub fn set_pull(&mut self, fit: PullFit, hold: PullFit) {
        self.pull = check::measured_pull(fit);
        self.hold = check::measured_pull(hold);
    }

    /// The driver could not queue `plan` (its GPU's queue is full): it is
    /// refused like a plan that fails a check.
    pub fn handle_queue_full(&mut self, now: Time, plan: PlanMsg) {
        let sched_now = now + self.offset();
        self.refuse(sched_now, plan, true, "the GPU's plan queue is full".into());
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.member
            .set_report(self.ctrl_delay(), self.pull, self.hold);
        self.member.handle_timeout(now);
        self.take_member();
        for (node, ctrl_addr) in self.redials.take_due(now) {
            if self.frontends.contains_key(&node) {
                self.redials.connected(node);
            } else {
                self.out.push_back(Action::Redial { node, ctrl_addr });
            }
        }
    }

    /// Whether a dial of frontend `node` ([`Action::Redial`]) that just
    /// succeeded is still wanted (else the driver closes it).
    pub fn wants_frontend(&self, node: NodeId) -> bool {
        self.redials.wants(node) && !self.frontends.contains_key(&node)
    }

    /// A dial of frontend `node` ([`Action::Redial`]) failed.
    pub fn handle_frontend_dial_failed(&mut self, now: Time, node: NodeId) {
        self.redials.failed(now, node);
    }

    /// The connection to the scheduler asked for by [`Action::Connect`] is up.
    pub fn handle_sched_connected(&mut self, now: Time, conn: ConnId) {
        self.member.handle_connected(now, conn);
        self.take_member();
    }

    /// The connection asked for by [`Action::Connect`] could not be opened.
    pub fn handle_sched_connect_failed(&mut self, now: Time, why: &str) {
        self.member.handle_connect_failed(now, why);
        self.take_member();
    }

    /// A worker finished loading `model` on one GPU (`Ok(bytes)`: its device
    /// footprint when known).
    pub fn handle_loaded(&mut self, model: ModelId, res: Result<Option<u64>, String>) {
        let Some(entry) = self.loading.get_mut(&model) else {
            return;
        };
        match res {
            Err(error) => {
                self.loading.remove(&model);
                self.model_loaded(model, false, error, 0);
            }
            Ok(bytes) => {
                entry.bytes = entry.bytes.max(bytes.unwrap_or(0));
                entry.gpus_left -= 1;
                if entry.gpus_left == 0 {
                    let done = self.loading.remove(&model).expect("entry");
                    self.loaded.insert(model, (done.info, done.bytes));
                    self.model_loaded(model, true, String::new(), done.bytes);
                }
            }
        }
    }

    /// The connection to frontend `node` asked for by [`Action::Attach`] is up.
    pub fn handle_connected(&mut self, node: NodeId, conn: ConnId) {
        self.redials.connected(node);
        if let Some(old) = self.frontends.insert(node, conn) {
            self.fe_conns.remove(&old);
            self.out
                .push_back(Action::Close(old, "frontend reconnected".into()));
        }
        self.fe_conns.insert(conn, node);
    }

    pub fn handle_closed(&mut self, now: Time, conn: ConnId, reason: &str) {
        if self.member.handle_closed(now, conn, reason) {
            return self.take_member();
        }
        if let Some(fe) = self.fe_conns.remove(&conn) {
            self.frontends.remove(&fe);
            self.redials.closed(now, fe);
        }
    }

    pub fn handle_msg(&mut self, now: Time, conn: ConnId, msg: Msg) {
        if Some(conn) != self.member.conn() {
            // Frontends send nothing to backends (and an old scheduler's
            // connection is closed already).
            self.counts.unexpected += 1;
            if let Some(fe) = self.fe_conns.remove(&conn) {
                self.frontends.remove(&fe);
            }
            let why = format!("unexpected {} from a frontend", msg.kind());
            return self.out.push_back(Action::Close(conn, why));
        }
        let msg = self.member.handle_msg(now, msg);
        self.take_member();
        let Some(msg) = msg else {
            return;
        };
        match msg {
            Msg::Plan {
                id,
                model,
                gpu,
                exec_at,
                finish_at,
                sent,
                tasks,
            } => {
                let plan = PlanMsg {
                    id,
                    model,
                    gpu,
                    exec_at,
                    span: (finish_at - exec_at).max(Dur::ZERO),
                    tasks,
                };
                self.plan(now, sent, plan);
            }
            Msg::LoadModel { model } => {
                self.asked.insert(model.id);
                self.load(model)
            }
            Msg::UnloadModel { model } => {
                self.asked.remove(&model);
                self.loaded.remove(&model);
                self.loading.remove(&model);
                self.out.push_back(Action::Unload(model));
            }
            Msg::FrontendUp {
                node,
                ctrl_addr,
                region,
            } => {
                if node == 0 || node > MAX_NODE_ID {
                    self.counts.unexpected += 1;
                } else {
                    self.redials.up(node, &ctrl_addr);
                    self.out.push_back(Action::Attach {
                        node,
                        ctrl_addr,
                        region,
                    });
                }
            }
            Msg::FrontendDown { node } => {
                self.redials.down(node);
                let conn = self.frontends.remove(&node);
                if let Some(c) = conn {
                    self.fe_conns.remove(&c);
                }
                self.out.push_back(Action::Detach { node, conn });
            }
            Msg::Drained => self.out.push_back(Action::Drained),
            _ => self.counts.unexpected += 1,
        }
    }

    /// Carries out what the membership asked for.
    fn take_member(&mut self) {
        while let Some(a) = self.member.poll_action() {
            match a {
                member::Action::Connect(addr) => self.out.push_back(Action::Connect(addr)),
                member::Action::Send(c, m) => self.out.push_back(Action::Send(c, m)),
                member::Action::Close(c, why) => self.out.push_back(Action::Close(c, why)),
                member::Action::SetClock { offset, error } => {
                    self.out.push_back(Action::SetClock { offset, error })
                }
                member::Action::Joined { gpu_ids, away, .. } => self.joined(gpu_ids, away),
                member::Action::Lost(why) => self.lost(why),
            }
        }
    }

    fn joined(&mut self, gpu_ids: Vec<GpuId>, away: Option<Dur>) {
        if gpu_ids.len() != self.gpus.len() {
            // Not an answer to our Register: a broken scheduler.
            self.counts.unexpected += 1;
            tracing::warn!(
                got = gpu_ids.len(),
                have = self.gpus.len(),
                "backend: RegisterAck with the wrong number of GPUs"
            );
        }
        self.gpu_map = gpu_ids.iter().enumerate().map(|(i, &g)| (g, i)).collect();
        // What the GPUs hold from before a rejoin that this scheduler did not
        // ask for (it put the backend in another sub-cluster, or a standby
        // took over with another assignment) would only take device memory:
        // no plan of it can come, the scheduler sends plans only for models it
        // had confirmed.
        let stale: Vec<ModelId> = self
            .loaded
            .keys()
            .filter(|m| !self.asked.contains(m))
            .copied()
            .collect();
        for m in stale {
            tracing::info!(
                model = m.0,
                "backend: unloading a model the scheduler did not ask for"
            );
            self.loaded.remove(&m);
            self.counts.stale_unloaded += 1;
            self.out.push_back(Action::Unload(m));
        }
        self.out.push_back(Action::Ready {
            gpus: gpu_ids,
            away,
        });
    }

    /// The scheduler is lost: the session's GPU ids, plans in flight and
    /// frontends are void; the models stay loaded.
    fn lost(&mut self, why: String) {
        self.gpu_map.clear();
        self.loading.clear();
        self.asked.clear();
        // A new scheduler has a new clock: the delays measured across it are void.
        self.plan_delay = Delays::new(PLAN_DELAYS_MAX);
        let mut fes: Vec<(NodeId, ConnId)> = self.frontends.drain().collect();
        fes.sort_unstable();
        self.fe_conns.clear();
        self.redials.clear();
        self.out.push_back(Action::Lost(why));
        for (node, conn) in fes {
            self.out.push_back(Action::Detach {
                node,
                conn: Some(conn),
            });
        }
    }

    fn send(&mut self, m: Msg) {
        if let Some(c) = self.member.conn() {
            self.out.push_back(Action::Send(c, m));
        }
    }

    fn load(&mut self, model: ModelInfo) {
        if let Some((info, bytes)) = self.loaded.get(&model.id) {
            if *info == model {
                // Still on the GPUs from before a rejoin: not loaded again, but
                // confirmed by each GPU's worker once it is free. It stays in
                // `loaded` meanwhile (the GPUs do hold it), so losing the
                // scheduler again before the confirmations does not make the
                // next rejoin load it anew.
                let loading = Loading {
                    info: info.clone(),
                    gpus_left: self.gpus.len() as u32,
                    bytes: *bytes,
                };
                self.loading.insert(model.id, loading);
                self.out.push_back(Action::Confirm(model.id));
                return;
            }
        }
        match crate::node::exec::profile_of(&model.profile) {
            Err(e) => self.model_loaded(model.id, false, format!("{e:#}"), 0),
            Ok(p) => {
                self.max_input = self.max_input.max(model.input_bytes);
                self.loaded.remove(&model.id);
                let loading = Loading {
                    info: model.clone(),
                    gpus_left: self.gpus.len() as u32,
                    bytes: 0,
                };
                self.loading.insert(model.id, loading);
                self.out.push_back(Action::Load(model, p));
            }
        }
    }

    fn model_loaded(&mut self, model: ModelId, ok: bool, error: String, device_bytes: u64) {
        self.send(Msg::ModelLoaded {
            model,
            ok,
            error,
            device_bytes,
        });
    }

    fn plan(&mut self, now: Time, sent: Time, plan: PlanMsg) {
        self.counts.plans_received += 1;
        let sched_now = now + self.offset();
        self.plan_delay
            .push(now, check::measured(sched_now - sent).0);
        let gpu = self.gpu_map.get(&plan.gpu).copied();
        let why = match gpu {
            None => Some(format!("GPU {} is not this backend's", plan.gpu)),
            Some(_) if !self.loaded.contains_key(&plan.model) => {
                self.counts.refused_not_loaded += 1;
                Some(format!("model {} is not loaded here", plan.model))
            }
            Some(_) if (plan.exec_at - sched_now).0.saturating_abs() > check::MAX_SLO.0 => {
                Some(format!("exec_at {} is out of range", plan.exec_at.0))
            }
            Some(g) => return self.out.push_back(Action::Queue { gpu: g, plan }),
        };
        self.refuse(sched_now, plan, gpu.is_some(), why.unwrap_or_default());
    }

    /// Ends a refused plan's tasks as failed; the scheduler hears of it only when
    /// the GPU is ours (a report for another's GPU would be a protocol error).
    fn refuse(&mut self, now: Time, plan: PlanMsg, ours: bool, why: String) {
        self.counts.plans_refused += 1;
        tracing::warn!(plan = plan.id.0, why = %why, "backend: plan refused; its tasks fail");
        let failed = Settled::failed(&plan, now);
        for (fe, items) in failed.results {
            if let Some(&c) = self.frontends.get(&fe) {
                self.out.push_back(Action::Send(c, Msg::Results { items }));
            }
        }
        if ours {
            self.send(failed.done);
        }
    }
}

/// The plans waiting for one GPU, in `exec_at` order (ties: arrival order).
#[derive(Debug)]
pub struct PlanQueue<T> {
    ready: BTreeMap<(Time, u64), T>,
    seq: u64,
}

impl<T> Default for PlanQueue<T> {
    fn default() -> Self {
        PlanQueue {
            ready: BTreeMap::new(),
            seq: 0,
        }
    }
}

impl<T> PlanQueue<T> {
    pub fn push(&mut self, exec_at: Time, item: T) {
        self.seq += 1;
        self.ready.insert((exec_at, self.seq), item);
    }

    /// The planned start of the first plan.
    pub fn next_at(&self) -> Option<Time> {
        self.ready.keys().next().map(|k| k.0)
    }

    /// The first plan if it is due at `now`.
    pub fn pop_due(&mut self, now: Time) -> Option<T> {
        if self.next_at()? <= now {
            self.ready.pop_first().map(|(_, v)| v)
        } else {
            None
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }
}

/// The one-sided reads of a plan's inputs, in task order.
pub fn pull_requests(tasks: &[PlanTask]) -> Vec<ReadReq> {
    tasks
        .iter()
        .map(|t| {
            let r = InputRef::unpack(t.input);
            ReadReq {
                peer: task_owner(t.id),
                offset: r.offset,
                len: r.len,
                cap: t.cap,
            }
        })
        .collect()
}

/// Which of `plan`'s tasks cannot meet their deadlines however soon after
/// `now` its batch starts (never before its planned start): the earliest
/// deadlines that [`too_late_prefix`] leaves out at that start, judged with
/// the profile the scheduler planned with ([`planned_profile`]). A puller
/// does not read their inputs: a read for a task already lost takes the
/// puller's time from the batches after it.
pub fn hopeless(plan: &PlanMsg, prof: Option<&LatencyProfile>, now: Time) -> Vec<bool> {
    let mut mask = vec![false; plan.tasks.len()];
    let Some(p) = prof else {
        return mask;
    };
    let planned = planned_profile(p, plan.tasks.len(), plan.span);
    let mut order: Vec<usize> = (0..plan.tasks.len()).collect();
    order.sort_by_key(|&i| plan.tasks[i].deadline);
    let deadlines: Vec<Time> = order.iter().map(|&i| plan.tasks[i].deadline).collect();
    let cut = too_late_prefix(&deadlines, now.max(plan.exec_at), &planned);
    for &i in &order[..cut] {
        mask[i] = true;
    }
    mask
}

/// How long the pull of `plan`'s inputs, less those `skip` marks, may take
/// from `now`: until the latest start that still meets the earliest deadline
/// with every task pulled (at least 1 ms).
pub fn pull_budget(plan: &PlanMsg, prof: Option<&LatencyProfile>, now: Time, skip: &[bool]) -> Dur {
    let kept = || {
        plan.tasks
            .iter()
            .enumerate()
            .filter(|&(i, _)| !skip.get(i).copied().unwrap_or(false))
            .map(|(_, t)| t)
    };
    let n = kept().count() as u32;
    let l = prof.map_or(Dur::ZERO, |p| p.latency(n.clamp(1, p.max_batch())));
    let dl = kept().map(|t| t.deadline).min();
    let latest = dl.unwrap_or(Time(i64::MAX)) - l;
    (latest - now).max(Dur::from_ms(1))
}

/// Why an input is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    Timeout = 0,
    /// The slot holds another task's input now (the request ended there).
    StaleSlot = 1,
    Error = 2,
}

/// An input as read: the whole slot, header first, and the payload's length.
#[derive(Debug)]
pub struct Input {
    pub slot: Vec<u8>,
    pub len: usize,
}

impl Input {
    pub fn bytes(&self) -> &[u8] {
        &self.slot[SLOT_HEADER..SLOT_HEADER + self.len]
    }
}

/// Checks one read against the task it was for (the slot's header names it
/// and its capability). A read the frontend refused (the request ended and its
/// slot was wiped) is a stale slot too.
pub fn classify_input(
    read: Result<Vec<u8>, ReadError>,
    task: TaskId,
    cap: u64,
) -> Result<Input, Missing> {
    match read {
        Ok(slot) => match SlotHeader::check(&slot, task.0, cap) {
            Ok(p) => {
                let len = p.len();
                Ok(Input { slot, len })
            }
            Err(_) => Err(Missing::StaleSlot),
        },
        Err(ReadError::Timeout) => Err(Missing::Timeout),
        Err(ReadError::Denied) => Err(Missing::StaleSlot),
        Err(_) => Err(Missing::Error),
    }
}

/// [`classify_input`] for a slot whose payload of `payload` bytes was read
/// apart from its header (into its row of a batch's buffer,
/// [`crate::transport::RegionReader::read_many_rows`]): the header must name
/// the task and its capability and say that many bytes. A request for a
/// slot of another size was not read (`OutOfBounds`): an input of another
/// size than the model's cannot be a row of its tensor.
pub fn classify_head(
    read: Result<[u8; SLOT_HEADER], ReadError>,
    task: TaskId,
    cap: u64,
    payload: usize,
) -> Result<(), Missing> {
    match read {
        Ok(head) => match SlotHeader::check_head(&head, task.0, cap) {
            Ok(n) if n == payload => Ok(()),
            Ok(_) => Err(Missing::Error),
            Err(_) => Err(Missing::StaleSlot),
        },
        Err(ReadError::Timeout) => Err(Missing::Timeout),
        Err(ReadError::Denied) => Err(Missing::StaleSlot),
        Err(_) => Err(Missing::Error),
    }
}

/// The profile the scheduler planned a plan of `tasks` tasks and run time
/// `span` with: the given profile times `span / l(tasks)`. The scheduler plans
/// a model that runs slower than its profile with the profile scaled
/// ([`super::latency_scale`]); a backend that judged the plan's tasks by the
/// given profile would run tasks that can no longer make their deadlines. The
/// factor is clamped to `[1, ABSURD_RATIO]`: a plan never makes the judgement
/// more lenient than the given profile, and a span from a scheduler that is
/// not to be trusted changes it by a bounded factor.
pub fn planned_profile(prof: &LatencyProfile, tasks: usize, span: Dur) -> Cow<'_, LatencyProfile> {
    let b = (tasks as u32).clamp(1, prof.max_batch());
    let k = span.0 as f64 / prof.latency(b).0.max(1) as f64;
    // Within a part in a million of 1: the given profile itself (the spans
    // of unscaled plans are l(b) exactly).
    if k.is_nan() || k <= 1.0 + 1e-6 {
        return Cow::Borrowed(prof);
    }
    Cow::Owned(prof.scaled(k.min(super::latency_scale::ABSURD_RATIO)))
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

/// Which of a plan's tasks run, by index: those whose input arrived and that can
/// still meet their deadline when the batch starts at `start`. Earliest
/// deadlines are checked first: leaving one out shortens the batch, which may
/// save the others (on time, none is left out: exec_at <= earliest deadline -
/// l(b)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cut {
    pub too_late: Vec<usize>,
    pub run: Vec<usize>,
    /// Inputs that could not be read (a stale slot, a read refused or
    /// broken): their tasks fail.
    pub missing: Vec<usize>,
    /// Inputs whose read had not finished by the batch's start (see
    /// [`Cut::split_unread`]): their tasks are dropped as too late, a timing
    /// outcome like a task the batch started too late for, not a failure.
    pub unread: Vec<usize>,
}

impl Cut {
    /// Moves the missing inputs whose read timed out (`timed_out(i)`) to
    /// `unread`.
    pub fn split_unread(&mut self, timed_out: impl Fn(usize) -> bool) {
        let (unread, missing) = self.missing.iter().partition(|&&i| timed_out(i));
        self.unread = unread;
        self.missing = missing;
    }
}

pub fn cut_batch(
    tasks: &[PlanTask],
    present: &[bool],
    start: Time,
    prof: Option<&LatencyProfile>,
) -> Cut {
    let mut have: Vec<usize> = (0..tasks.len()).filter(|&i| present[i]).collect();
    have.sort_by_key(|&i| tasks[i].deadline);
    let deadlines: Vec<Time> = have.iter().map(|&i| tasks[i].deadline).collect();
    let cut = prof.map_or(0, |p| too_late_prefix(&deadlines, start, p));
    let run = have.split_off(cut);
    Cut {
        too_late: have,
        run,
        missing: (0..tasks.len()).filter(|&i| !present[i]).collect(),
        unread: Vec::new(),
    }
}

/// How a batch ended: its status, the results per frontend (by node id) and the
/// scheduler's `PlanDone`.
#[derive(Debug, Clone)]
pub struct Settled {
    pub status: PlanStatus,
    pub results: Vec<(NodeId, Vec<TaskResult>)>,
    pub done: Msg,
    /// Tasks that ran (0 unless `status` is `Ran`).
    pub ran: usize,
}

impl Settled {
    /// Every task of `plan` failed at `now` without running.
    pub fn failed(plan: &PlanMsg, now: Time) -> Settled {
        let cut = Cut {
            run: (0..plan.tasks.len()).collect(),
            ..Cut::default()
        };
        settle(plan, &cut, now, now, Err(()))
    }
}

/// Ends a batch: `outputs` is the executor's answer for the tasks in `cut.run`,
/// one per task (`None`: that task failed alone, see
/// [`crate::node::exec::isolate`]; `Err`, or the wrong number of outputs: they
/// all fail). The plan `Ran` when any task got its output. With nothing to run
/// and some task too late (left out at the start, or its input not read in
/// time), the plan is `TooLate` and the executor is not asked (`outputs` is
/// ignored).
pub fn settle(
    plan: &PlanMsg,
    cut: &Cut,
    start: Time,
    finished: Time,
    outputs: Result<Vec<Option<Vec<u8>>>, ()>,
) -> Settled {
    let mut by_fe: BTreeMap<NodeId, Vec<TaskResult>> = BTreeMap::new();
    let outputs = outputs.ok().filter(|o| o.len() == cut.run.len());
    // Nothing ran and something was too late for its deadline (left out at
    // the start, or not pulled).
    let too_late = cut.run.is_empty() && !(cut.too_late.is_empty() && cut.unread.is_empty());
    let ok = outputs
        .as_ref()
        .map_or(0, |o| o.iter().filter(|x| x.is_some()).count());
    let (status, ran) = match &outputs {
        _ if too_late => (PlanStatus::TooLate, 0),
        Some(_) if ok > 0 || cut.run.is_empty() => (PlanStatus::Ran, ok),
        _ => (PlanStatus::Failed, 0),
    };
    let fin = if too_late { start } else { finished };
    let mut push = |i: usize, status: TaskStatus, fin: Time, output: Vec<u8>| {
        let t = &plan.tasks[i];
        by_fe.entry(task_owner(t.id)).or_default().push(TaskResult {
            id: t.id,
            status,
            started: start,
            finished: fin,
            batch_size: if status == TaskStatus::Ok {
                ran as u32
            } else {
                0
            },
            output,
            cap: t.cap,
        });
    };
    for &i in &cut.too_late {
        push(
            i,
            TaskStatus::Dropped(DropReason::TooLate),
            start,
            Vec::new(),
        );
    }
    match outputs {
        Some(outs) if !too_late => {
            for (&i, o) in cut.run.iter().zip(outs) {
                match o {
                    Some(o) => push(i, TaskStatus::Ok, fin, o),
                    None => push(i, TaskStatus::Failed, fin, Vec::new()),
                }
            }
        }
        _ => {
            for &i in &cut.run {
                push(i, TaskStatus::Failed, fin, Vec::new());
            }
        }
    }
    for &i in &cut.missing {
        push(i, TaskStatus::InputMissing, fin, Vec::new());
    }
    for &i in &cut.unread {
        push(
            i,
            TaskStatus::Dropped(DropReason::TooLate),
            start,
            Vec::new(),
        );
    }
    Settled {
        status,
        results: by_fe.into_iter().collect(),
        done: Msg::PlanDone {
            id: plan.id,
            gpu: plan.gpu,
            status,
            started: start,
            finished: fin,
            missing: (cut.missing.len() + cut.unread.len()) as u32,
        },
        ran,
    }
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;
