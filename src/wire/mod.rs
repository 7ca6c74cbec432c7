//! The wire protocol between Fermata's processes: one versioned enum of messages
//! ([`Msg`]) and its compact binary encoding ([`codec`]).
//!
//! # Framing
//! Every message travels as one frame:
//!
//! ```text
//! u32 LE  body length (bytes after this field; at most MAX_FRAME)
//! u16 LE  protocol version (PROTOCOL_VERSION)
//! u8      message tag
//! ...     the message's fields
//! ```
//!
//! # Encoding of the fields
//! Fields follow in declaration order, with no padding and nothing else between them:
//!
//! - `u32`, `u64`, `i64` (and [`NodeId`]): little endian, 4 or 8 bytes. The typed
//!   ids and times are their integer: [`ModelId`], [`GpuId`] u32; [`TaskId`],
//!   [`PlanId`] u64; [`Time`], [`Dur`] i64 nanoseconds.
//! - `bool`: u8 0 or 1.
//! - `String`: u32 LE byte length, then the UTF-8 bytes; at most [`MAX_STR`] bytes.
//! - `Vec<u8>` (inputs, outputs): u32 LE length, then the bytes; bounded by the frame.
//! - other `Vec<T>`: u32 LE count, then the items; at most [`MAX_ITEMS`] items.
//! - `Option<T>`: u8 0 (None) or 1 (Some) followed by the value.
//! - structs ([`GpuInfo`], [`DeviceCounts`], [`ModelStateItem`], [`ModelInfo`], [`RegionInfo`], [`SubmitTask`],
//!   [`PlanTask`], [`TaskResult`], [`AppCounters`], [`StepLatency`]): their fields in
//!   declaration order; the pair of `Msg::Dropped` is the u64 then the
//!   [`DropReason`]; the pair of `Msg::Margins` is the model id then the duration;
//!   the pairs of [`AppCounters::fanout`] are two u64.
//! - enums: a u8 tag, in declaration order from 0, then the variant's fields:
//!   [`Role`] (Backend 0, Frontend 1), [`PlanStatus`] (Ran 0, TooLate 1, Failed 2),
//!   [`Outcome`] (Good 0, Late 1, Dropped 2, Failed 3), [`DeviceKind`] (Gpu 0,
//!   Cpu 1, Emulated 2), [`ModelAvailability`] (Unavailable 0, Loading 1,
//!   Ready 2, Unloading 3), [`DropReason`] (Expired 0
//!   ... UnknownModel 8, NoGpu 9), [`TaskStatus`] (Ok 0, Dropped 1 followed by its DropReason
//!   tag, InputMissing 2, Failed 3), [`WireProfile`] (Linear 0 with `alpha_ns`,
//!   `beta_ns`, `max_batch`; Table 1 with `lat_ns`).
//!
//! Message tags follow the declaration order of [`Msg`] from 1: Register 1,
//! RegisterAck 2, Unregister 3, LoadModel 4, UnloadModel 5, ModelLoaded 6,
//! FrontendUp 7, FrontendDown 8, Submit 9, Plan 10, PlanDone 11, Results 12,
//! Dropped 13, Ping 14, Pong 15, Infer 16, InferReply 17, ListModels 18, Models 19,
//! Error 20, Capacity 21, Margins 22, Drain 23, Drained 24, Follow 25, Assignment 26,
//! Fence 27, ModelControl 28, ModelStates 29, AppCounts 30, AppTotals 31, LatencyScales 32. A new message takes the next tag; changing a layout bumps
//! [`PROTOCOL_VERSION`].
//!
//! A decoder checks every length against its limit and then against what is left of
//! the frame (a count times the smallest encoding of one item) before it allocates,
//! so a hostile or corrupt frame costs at most one error, never a crash or a huge
//! allocation. Unknown tags, bad UTF-8 and bytes left over after the message are
//! errors too. Encoders do not check the limits: senders keep within them.
//!
//! # Times
//! Every time on the wire is nanoseconds on the **scheduler's clock** (its epoch is
//! the scheduler's start). Nodes convert with their estimated clock offset
//! (see [`crate::node::clock`]).

pub mod codec;

pub use codec::{
    decode, decode_shared, encode, encode_split, encode_to_vec, DecodeError, FrameReader,
    SHARE_FROM,
};

/// The typed values the wire carries: ids ([`TaskId`], [`ModelId`], [`GpuId`],
/// [`PlanId`]) and times ([`Time`] on the scheduler's clock unless said otherwise,
/// [`Dur`]) are the core's own types, encoded as their integer.
pub use crate::core::{Dur, GpuId, ModelId, PlanId, TaskId, Time};

/// Version of the protocol this build speaks. A peer with another version is refused
/// at its first frame.
pub const PROTOCOL_VERSION: u16 = 13;
/// Largest frame body accepted (inputs and outputs travel inside frames).
pub const MAX_FRAME: usize = 64 << 20;
/// Largest string field (names, addresses, messages).
pub const MAX_STR: usize = 64 << 10;
/// Largest number of items in one vector field (tasks of a submit or plan, GPUs...).
pub const MAX_ITEMS: usize = 1 << 16;

/// The percentile of measured delays that backends report for the network budget.
/// A batch whose plan or inputs arrive later than budgeted is late or dropped as a
/// whole, and goodput allows 1% bad requests, so p99 would spend the whole
/// allowance on network tails alone: p99.9.
pub const NET_QUANTILE: f64 = 0.999;

/// A node's id, given by the scheduler at registration.
pub type NodeId = u32;

/// Bits of a task id below its frontend's node id. A task id is
/// `frontend node id << TASK_SEQ_BITS | sequence number`: the one place that
/// knows it is here ([`task_id`], [`task_owner`]).
pub const TASK_SEQ_BITS: u32 = 40;

/// Largest node id a task id can carry (the scheduler gives no larger one).
pub const MAX_NODE_ID: NodeId = (1 << (64 - TASK_SEQ_BITS)) - 1;

/// The task id of frontend `node`'s `seq`-th task (the sequence wraps at
/// 2^[`TASK_SEQ_BITS`]).
#[inline]
pub fn task_id(node: NodeId, seq: u64) -> TaskId {
    TaskId(((node as u64) << TASK_SEQ_BITS) | (seq & ((1 << TASK_SEQ_BITS) - 1)))
}

/// The node (frontend) that owns a task.
#[inline]
pub fn task_owner(id: TaskId) -> NodeId {
    (id.0 >> TASK_SEQ_BITS) as NodeId
}

/// `tasks` dropped for `code`, grouped by the frontend that owns them (in node
/// order): the items of one `Msg::Dropped` per frontend.
pub fn drops_by_frontend(
    tasks: impl IntoIterator<Item = TaskId>,
    code: DropReason,
) -> Vec<(NodeId, Vec<(TaskId, DropReason)>)> {
    let mut by_fe: std::collections::BTreeMap<NodeId, Vec<(TaskId, DropReason)>> =
        Default::default();
    for t in tasks {
        by_fe.entry(task_owner(t)).or_default().push((t, code));
    }
    by_fe.into_iter().collect()
}

/// What a registering node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Backend,
    Frontend,
}

/// Where a model stands under model control (Triton's model states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelAvailability {
    /// Not loaded anywhere (never loaded, unloaded, or its load failed).
    Unavailable,
    /// Its sub-cluster's backends are loading it.
    Loading,
    /// Every backend in service of its sub-cluster holds it: requests are taken.
    Ready,
    /// No new request is taken; those taken finish, then it is unloaded.
    Unloading,
}

impl ModelAvailability {
    /// Triton's name of the state (the repository index's `state`).
    pub fn triton_name(self) -> &'static str {
        match self {
            ModelAvailability::Unavailable => "UNAVAILABLE",
            ModelAvailability::Loading => "LOADING",
            ModelAvailability::Ready => "READY",
            ModelAvailability::Unloading => "UNLOADING",
        }
    }
}

/// One model's state as the scheduler tells frontends (`reason`: why it is
/// unavailable, e.g. a failed load; empty otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelStateItem {
    pub model: ModelId,
    pub state: ModelAvailability,
    pub reason: String,
    /// The GPUs in service of the model's sub-cluster, by what runs them:
    /// where its batches run (or will, once it is loaded). All zero: none
    /// in service.
    pub devices: DeviceCounts,
}

/// One application's counters (cumulative): as a frontend counts them since
/// it started ([`Msg::AppCounts`]), or as the scheduler sums them over every
/// frontend that reported the application ([`Msg::AppTotals`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AppCounters {
    /// The application's name (its ensemble's).
    pub app: String,
    /// Per edge of the application's graph, in its order: the parent outputs
    /// counted and the items they carried (zero on a whole edge).
    pub fanout: Vec<(u64, u64)>,
    /// Per step, in its order: what its module answers measured.
    pub latency: Vec<StepLatency>,
    /// Application requests received.
    pub requests: u64,
}

/// One step's measured latency, cumulative: its module answers' batch run
/// times and what the model's profile gives for batches of those sizes
/// (nanoseconds), and how many answers those sums cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepLatency {
    pub observed_ns: u64,
    pub profiled_ns: u64,
    pub samples: u64,
}

/// What runs a backend's GPU (its `--executor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceKind {
    /// A real GPU (ONNX Runtime's CUDA provider).
    Gpu,
    /// The CPU (ONNX Runtime's CPU provider): the "GPU" is a worker thread.
    Cpu,
    /// An emulated GPU (waits each batch's profiled latency; no device).
    #[default]
    Emulated,
}

/// GPUs counted by what runs them ([`DeviceKind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCounts {
    pub gpu: u32,
    pub cpu: u32,
    pub emulated: u32,
}

impl DeviceCounts {
    /// A backend's GPUs, counted by kind.
    pub fn of(gpus: &[GpuInfo]) -> DeviceCounts {
        let mut c = DeviceCounts::default();
        for g in gpus {
            *c.slot(g.device) += 1;
        }
        c
    }

    fn slot(&mut self, k: DeviceKind) -> &mut u32 {
        match k {
            DeviceKind::Gpu => &mut self.gpu,
            DeviceKind::Cpu => &mut self.cpu,
            DeviceKind::Emulated => &mut self.emulated,
        }
    }

    /// `self + o` (saturating: counts come from untrusted registrations).
    pub fn plus(self, o: DeviceCounts) -> DeviceCounts {
        DeviceCounts {
            gpu: self.gpu.saturating_add(o.gpu),
            cpu: self.cpu.saturating_add(o.cpu),
            emulated: self.emulated.saturating_add(o.emulated),
        }
    }

    /// `self - o` (saturating).
    pub fn minus(self, o: DeviceCounts) -> DeviceCounts {
        DeviceCounts {
            gpu: self.gpu.saturating_sub(o.gpu),
            cpu: self.cpu.saturating_sub(o.cpu),
            emulated: self.emulated.saturating_sub(o.emulated),
        }
    }

    pub fn total(self) -> u64 {
        self.gpu as u64 + self.cpu as u64 + self.emulated as u64
    }
}

/// One GPU of a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Index on its backend (0..).
    pub local: u32,
    pub name: String,
    pub mem_bytes: u64,
    /// What runs it.
    pub device: DeviceKind,
    /// Batches its device runs at once (`--lanes`; 1 without): a backend's
    /// slots `local / lanes` are the lanes of one device.
    pub lanes: u32,
}

/// A model's latency profile l(b).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireProfile {
    Linear {
        alpha_ns: i64,
        beta_ns: i64,
        max_batch: u32,
    },
    /// `lat_ns[b - 1]` = l(b).
    Table { lat_ns: Vec<i64> },
}

/// A model as the scheduler serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// The scheduler's dense model id.
    pub id: ModelId,
    pub name: String,
    /// Default SLO.
    pub slo: Dur,
    pub profile: WireProfile,
    /// Size of one input in bytes (what the load generator sends).
    pub input_bytes: u32,
    /// The model's [`crate::repo::ModelMeta`] as JSON (tensors, for executors and
    /// the HTTP frontend); empty for profile-only (emulated) models.
    pub meta_json: String,
}

impl ModelInfo {
    /// The model's tensors and SLO, when it is a real model.
    pub fn meta(&self) -> Option<Result<crate::repo::ModelMeta, String>> {
        if self.meta_json.is_empty() {
            return None;
        }
        Some(crate::repo::ModelMeta::from_json(&self.meta_json).map_err(|e| format!("{e:#}")))
    }
}

/// Where a frontend's input region can be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// Transport address of the region server (TCP: host:port; in-process: a name).
    pub addr: String,
    /// Region id on that server.
    pub region: u32,
    /// Region length in bytes.
    pub len: u64,
    /// Remote key (RDMA rkey; 0 elsewhere).
    pub rkey: u32,
    /// Remote virtual address of byte 0 (RDMA; 0 elsewhere).
    pub base: u64,
}

/// A task as a frontend submits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmitTask {
    /// Globally unique: the frontend's node id in the top 24 bits ([`task_id`]).
    pub id: TaskId,
    pub model: ModelId,
    pub arrival: Time,
    pub deadline: Time,
    /// Where the input is: [`crate::transport::InputRef`] packed.
    pub input: u64,
    /// The task's capability: a random secret of the frontend's that the
    /// scheduler hands only to the backend it plans the task on. Reading the
    /// input and answering the task both need it (docs/security.md).
    pub cap: u64,
}

/// A task inside a batch plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanTask {
    pub id: TaskId,
    pub deadline: Time,
    pub input: u64,
    /// The task's capability ([`SubmitTask::cap`]): the backend reads the input
    /// with it and returns it with the result.
    pub cap: u64,
}

/// How a plan ended on its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanStatus {
    /// Ran; `missing` inputs could not be read and their tasks failed.
    Ran,
    /// Not started: it could not start in time (its tasks end as dropped).
    TooLate,
    /// The executor failed (its tasks end as failed).
    Failed,
}

/// How one task ended, as its frontend learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// Output attached.
    Ok,
    /// The scheduler dropped it (code: [`DropReason`]).
    Dropped(DropReason),
    /// Its input could not be read by the backend.
    InputMissing,
    /// The backend could not run it (executor error, backend lost).
    Failed,
}

/// Why a task was dropped: the core's [`DropReason`], the one type for it.
pub use crate::core::DropReason;

/// One result pushed by a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskResult {
    pub id: TaskId,
    pub status: TaskStatus,
    /// When the batch started and finished (scheduler clock).
    pub started: Time,
    pub finished: Time,
    /// Size of the batch it ran in (0 when it did not run).
    pub batch_size: u32,
    pub output: Vec<u8>,
    /// The task's capability ([`SubmitTask::cap`]): a result without the right
    /// one is refused by the frontend.
    pub cap: u64,
}

/// How a client request ended, as the frontend replies it: the core's
/// [`Outcome`], the one end-of-request type.
pub use crate::core::Outcome;

/// Every message of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    // ---- node -> scheduler ----
    /// First message of a node. `clock_ns` is the node's own clock when sent.
    Register {
        role: Role,
        name: String,
        gpus: Vec<GpuInfo>,
        /// Frontends: where backends push results.
        ctrl_addr: String,
        /// Frontends: their input region.
        region: Option<RegionInfo>,
    },
    /// The scheduler's answer: the node's id, global ids of its GPUs (in the order
    /// registered), and the models served.
    RegisterAck {
        node: NodeId,
        gpu_ids: Vec<GpuId>,
        models: Vec<ModelInfo>,
        /// Scheduler's settings the nodes follow.
        heartbeat_ms: u32,
        /// The scheduler's term (see [`Msg::Fence`]): a node refuses an ack of
        /// a term older than one it has seen.
        term: u64,
    },
    /// A node leaves on purpose.
    Unregister {
        reason: String,
    },
    // ---- scheduler -> backend ----
    LoadModel {
        model: ModelInfo,
    },
    UnloadModel {
        model: ModelId,
    },
    /// Backend -> scheduler: a model is (or failed to get) loaded.
    ModelLoaded {
        model: ModelId,
        ok: bool,
        error: String,
        /// Device memory the model takes on each GPU of the backend (the largest
        /// of them), when the executor measures it; 0 otherwise.
        device_bytes: u64,
    },
    /// A frontend joined: where to pull its inputs and push its results.
    FrontendUp {
        node: NodeId,
        ctrl_addr: String,
        region: RegionInfo,
    },
    /// A frontend left: its inputs are gone.
    FrontendDown {
        node: NodeId,
    },
    // ---- frontend -> scheduler ----
    Submit {
        tasks: Vec<SubmitTask>,
    },
    // ---- scheduler -> backend ----
    Plan {
        id: PlanId,
        model: ModelId,
        /// Global GPU id (the backend maps it to its local GPU).
        gpu: GpuId,
        exec_at: Time,
        finish_at: Time,
        /// When the scheduler sent it (the backend measures the control delay).
        sent: Time,
        tasks: Vec<PlanTask>,
    },
    // ---- backend -> scheduler ----
    PlanDone {
        id: PlanId,
        gpu: GpuId,
        status: PlanStatus,
        started: Time,
        finished: Time,
        /// Tasks whose input could not be read.
        missing: u32,
    },
    // ---- backend -> frontend ----
    Results {
        items: Vec<TaskResult>,
    },
    // ---- scheduler -> frontend ----
    Dropped {
        items: Vec<(TaskId, DropReason)>,
    },
    // ---- any node <-> scheduler ----
    /// Liveness and clock probe, sent by nodes. `sent` is on the sender's own
    /// clock; the node's latest measurements ride along.
    Ping {
        seq: u64,
        sent: Time,
        /// Node's recent control delay at a high percentile ([`NET_QUANTILE`])
        /// (zero = none yet): a backend reports its plans' one-way delay (half its
        /// ping round trip until enough plans came).
        ctrl_delay: Dur,
        /// Backend's input pull cost per batch (zero = none yet): the fixed
        /// part of a batch's pull at the quantile the pull budget holds
        /// ([`crate::core::pull`]),
        pull: Dur,
        /// and what each mebibyte of the batch's inputs adds.
        pull_per_mib: Dur,
        /// What a batch's pull typically holds the GPU's puller (zero = none
        /// yet): the fixed part of the line at
        /// [`crate::core::pull::HOLD_QUANTILE`],
        pull_hold: Dur,
        /// and what each mebibyte adds.
        pull_hold_per_mib: Dur,
        /// The highest scheduler term the node has seen (0: none yet): a
        /// scheduler of an older term learns from it that it was replaced.
        term: u64,
    },
    /// Answer to a ping: echoes `sent` (the node's clock), adds the scheduler's
    /// clock at receipt.
    Pong {
        seq: u64,
        echo: Time,
        sched: Time,
        /// The scheduler's term: a node refuses a scheduler whose term is older
        /// than one it has seen, and everything that scheduler sends.
        term: u64,
    },
    // ---- client <-> frontend ----
    /// A client's inference request (`slo` zero: the model's default SLO).
    /// The input is shared, not owned: a client that sends one input many
    /// times, in process, sends it without a copy.
    Infer {
        req: u64,
        model: String,
        slo: Dur,
        input: bytes::Bytes,
    },
    InferReply {
        req: u64,
        status: Outcome,
        /// Time from the frontend's receipt to its reply.
        latency: Dur,
        /// From the frontend's receipt to the batch's start (zero when it did not
        /// run).
        queue: Dur,
        /// Size of the batch it ran in (0 when it did not run).
        batch_size: u32,
        output: Vec<u8>,
        message: String,
    },
    /// Client -> frontend: the models served (answered with `Models`).
    ListModels,
    Models {
        models: Vec<ModelInfo>,
    },
    /// Sent before closing a connection for a protocol error.
    Error {
        message: String,
    },
    // ---- scheduler -> frontend ----
    /// The GPUs in service now: sent to a frontend right after its `RegisterAck`
    /// and to every frontend whenever the number changes, so frontends can answer
    /// readiness checks and refuse requests that nothing could run.
    Capacity {
        gpus: u32,
    },
    // ---- frontend -> scheduler ----
    /// The frontend's measured response margin per model: from a batch's end on
    /// its GPU to its results handed to the clients, at a high percentile
    /// ([`NET_QUANTILE`], stall-robust). Sent when it changes; the scheduler
    /// reserves it in every plan of the model.
    Margins {
        items: Vec<(ModelId, Dur)>,
    },
    // ---- backend -> scheduler ----
    /// The backend wants to leave without failing a request: the scheduler takes
    /// its GPUs out of planning, lets the plans already sent finish, then answers
    /// `Drained`; the backend then finishes what it holds and `Unregister`s.
    Drain {
        reason: String,
    },
    // ---- scheduler -> backend ----
    /// No plan will follow and none the scheduler sent is unreported.
    Drained,
    // ---- standby <-> primary scheduler ----
    /// A hot standby asks its primary for the models' sub-clusters: the primary
    /// sends `Assignment` now and whenever it changes (checked at each of the
    /// standby's pings).
    Follow,
    /// Each model's sub-cluster (`homes[m]`, by model id) as the primary has it,
    /// for a standby to start from when it takes over.
    Assignment {
        homes: Vec<u32>,
    },
    // ---- scheduler <-> scheduler ----
    /// "I serve as the primary of `term`." A standby that took over starts a
    /// new term (one more than the highest it saw) and sends this to its old
    /// primary's address until its own process ends; a scheduler of an older
    /// term that hears it steps down, one of a newer term answers with its
    /// own `Fence` (then the sender steps down).
    Fence {
        term: u64,
    },
    // ---- frontend -> scheduler ----
    /// A client asked to load (`load`) or unload model `model` (Triton's
    /// explicit model control); the scheduler answers every frontend with
    /// `ModelStates` as the model's state changes.
    ModelControl {
        model: ModelId,
        load: bool,
    },
    // ---- scheduler -> frontend ----
    /// Models' states: every model's right after `RegisterAck`, then those
    /// whose state or [`ModelStateItem::devices`] change.
    ModelStates {
        items: Vec<ModelStateItem>,
    },
    // ---- frontend -> scheduler ----
    /// A frontend's counters of one application it serves, sent periodically
    /// (the scheduler answers with `AppTotals`).
    AppCounts {
        counters: AppCounters,
    },
    // ---- scheduler -> frontend ----
    /// The answer to `AppCounts`: the application's counters summed over
    /// every frontend that reported it (those gone included, at their last
    /// report), and how many frontends reported it. A frontend re-plans the
    /// application on these, so every frontend plans on the same whole.
    AppTotals {
        counters: AppCounters,
        frontends: u32,
    },
    // ---- primary scheduler -> standby ----
    /// Each model's latency scale (the factor its profile is planned with,
    /// in millionths, by model id), sent to a following standby with
    /// `Follow`'s answers and at its pings when a scale changed, so that a
    /// standby that takes over plans slow models as the primary did.
    LatencyScales {
        ppm: Vec<u32>,
    },
}

impl Msg {
    /// Short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Register { .. } => "Register",
            Msg::RegisterAck { .. } => "RegisterAck",
            Msg::Unregister { .. } => "Unregister",
            Msg::LoadModel { .. } => "LoadModel",
            Msg::UnloadModel { .. } => "UnloadModel",
            Msg::ModelLoaded { .. } => "ModelLoaded",
            Msg::FrontendUp { .. } => "FrontendUp",
            Msg::FrontendDown { .. } => "FrontendDown",
            Msg::Submit { .. } => "Submit",
            Msg::Plan { .. } => "Plan",
            Msg::PlanDone { .. } => "PlanDone",
            Msg::Results { .. } => "Results",
            Msg::Dropped { .. } => "Dropped",
            Msg::Ping { .. } => "Ping",
            Msg::Pong { .. } => "Pong",
            Msg::Infer { .. } => "Infer",
            Msg::InferReply { .. } => "InferReply",
            Msg::ListModels => "ListModels",
            Msg::Models { .. } => "Models",
            Msg::Error { .. } => "Error",
            Msg::Capacity { .. } => "Capacity",
            Msg::Margins { .. } => "Margins",
            Msg::Drain { .. } => "Drain",
            Msg::Drained => "Drained",
            Msg::Follow => "Follow",
            Msg::Assignment { .. } => "Assignment",
            Msg::Fence { .. } => "Fence",
            Msg::ModelControl { .. } => "ModelControl",
            Msg::ModelStates { .. } => "ModelStates",
            Msg::AppCounts { .. } => "AppCounts",
            Msg::AppTotals { .. } => "AppTotals",
            Msg::LatencyScales { .. } => "LatencyScales",
        }
    }
}
