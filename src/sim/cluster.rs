//! The deterministic cluster simulator (`fermata sim cluster`): N frontends, M
//! backends and the scheduler over a simulated network, all from one seed.
//!
//! What runs is production code: the scheduler is the sans-IO protocol machine
//! ([`crate::node::proto::sched`]) beside the scheduling core
//! ([`crate::core::Dispatcher`]); each frontend keeps its requests in the
//! production [`RequestLedger`] and checks SLOs with [`check::slo`]; each
//! backend runs the production [`BackendProto`] (clock sync, registration,
//! models matched by id, the checks on plans), queues plans in the production
//! [`PlanQueue`] and ends each batch with the production [`cut_batch`] and
//! [`settle`]. What is modelled: the GPUs (a batch runs for the profile's l(b)
//! with a little noise; a load succeeds at once) and the input pulls (an input
//! is there while its frontend is connected and still holds the request; a
//! GPU's pulls run one batch at a time from each plan's arrival, overlapping
//! the batch before it, and take what [`SimPull`] says; each backend fits its
//! pull cost with the production [`PullEstimator`] and reports it in pings, so
//! the scheduler's pull budget is the one a live cluster would set).
//!
//! The network delays every message (delay plus jitter, in order on each
//! connection as TCP keeps it, in any order across connections); a lost
//! message breaks its connection, as a TCP connection breaks. Faults come from
//! the same seed: process crashes (a supervisor restarts the process after a
//! while as a new node), pauses (a stopped process: its events wait), GPU hangs
//! (a backend's batches end only after the hang while it goes on answering
//! pings: the scheduler's plan watchdog must take it out), partitions (every
//! connection between a node and the scheduler breaks), and each node's clock
//! has its own skew and drift. With `standby`, a second scheduler follows the
//! first with the production [`StandbyProto`], the nodes know both addresses,
//! and the serving scheduler itself crashes too: the standby takes over, and
//! the crashed one comes back on its address as the next standby. With
//! `rogue`, a peer forges results for the frontends' latest tasks. Faults and
//! message losses end when the clients stop sending; the drain that follows
//! shows every node back in service.
//!
//! After every event the simulator checks:
//! - every request ends exactly once at its client (good, late, dropped or
//!   failed; at the end of a run none is left without an end);
//! - no GPU is planned to run two batches at once (a plan never starts before
//!   the GPU's previous plan is due to finish or reported done);
//! - no plan runs a model its backend has not loaded;
//! - no backend is sent a model it was not assigned;
//! - no result ends a request without its task's capability (a forged one),
//!   and no real result is refused.
//!
//! A violation stops the run with a [`Violation`] whose `replay` is the one-line
//! command that runs exactly that seed again.

use crate::core::{Dispatcher, Dur, GpuId, ModelId, NetBudget, PlanId, PullEstimator, Time};
use crate::node::proto::backend::{
    self as be_proto, cut_batch, settle, BackendProto, PlanMsg, PlanQueue,
};
use crate::node::proto::check;
use crate::node::proto::fence::Fencer;
use crate::node::proto::ledger::{Answer, Ended, Orphan, RequestLedger};
use crate::node::proto::member::{self, Member};
use crate::node::proto::sched::{plan_msg, plan_tasks, Action, SchedConfig, SchedProto};
use crate::node::proto::standby::{Action as StandbyAction, StandbyProto};
use crate::node::proto::subclusters::SubClusters;
use crate::transport::{ConnId, InputRef};
use crate::wire::{task_owner, GpuInfo, ModelInfo, Msg, NodeId, PlanStatus, RegionInfo, Role};
use crate::workload::Workload;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

mod paused_primary;

/// Which faults a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Faults {
    None,
    /// Process crashes and restarts, and pauses.
    Crash,
    /// Network partitions between nodes and the scheduler, and lost messages.
    Partition,
    /// All of them.
    All,
}

impl Faults {
    fn crash(self) -> bool {
        matches!(self, Faults::Crash | Faults::All)
    }
    fn partition(self) -> bool {
        matches!(self, Faults::Partition | Faults::All)
    }
    fn name(self) -> &'static str {
        match self {
            Faults::None => "none",
            Faults::Crash => "crash",
            Faults::Partition => "partition",
            Faults::All => "all",
        }
    }
}

/// A bug planted on purpose, to show that the checks catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Planted {
    /// Backends confirm every model with `ModelLoaded` but skip loading the last.
    SkipLoad,
    /// A standby takes over under the term it saw (no new term) and fences
    /// no one: a resumed primary serves on beside it.
    NoFencing,
}

/// What a batch's input pull takes in the simulator: `fixed + per_input × b +
/// per_mib × bytes / MiB`, scaled by a uniform factor in `[1, 1 + jitter]`,
/// plus `stall` in a `stall_p` share of batches (a stall costs its batch once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimPull {
    pub fixed: Dur,
    pub per_input: Dur,
    pub per_mib: Dur,
    pub jitter: f64,
    pub stall_p: f64,
    pub stall: Dur,
}

impl Default for SimPull {
    fn default() -> Self {
        SimPull {
            fixed: Dur::ZERO,
            per_input: Dur::from_us(2),
            per_mib: Dur::ZERO,
            jitter: 0.0,
            stall_p: 0.0,
            stall: Dur::ZERO,
        }
    }
}

/// One batch's pull as the simulator recorded it: its size, what the pull
/// took, and the pull budget the scheduler had for a batch of that size when
/// the plan reached its backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PullRecord {
    pub at: Time,
    pub bs: u32,
    pub took: Dur,
    pub budget: Dur,
}

/// What one batch's pull takes under `p` (draws from `rng` only when `p` has
/// jitter or stalls).
fn sim_pull(p: &SimPull, rng: &mut Xoshiro256PlusPlus, bs: u32, bytes: u64) -> Dur {
    let base = p.fixed.0 as f64
        + p.per_input.0 as f64 * bs as f64
        + p.per_mib.0 as f64 * bytes as f64 / (1u64 << 20) as f64;
    let scale = if p.jitter > 0.0 {
        1.0 + rng.gen_range(0.0..p.jitter)
    } else {
        1.0
    };
    let stall = if p.stall_p > 0.0 && rng.gen::<f64>() < p.stall_p {
        p.stall
    } else {
        Dur::ZERO
    };
    Dur((base * scale).round() as i64) + stall
}

/// One run's settings.
#[derive(Debug, Clone)]
pub struct ClusterSimOpts {
    pub seed: u64,
    pub frontends: u32,
    pub backends: u32,
    pub gpus_per_backend: u32,
    pub rate_rps: f64,
    /// Simulated time clients send for (the run then drains).
    pub duration: Dur,
    pub faults: Faults,
    /// One-way network delay and its jitter (uniform on top).
    pub delay: Dur,
    pub jitter: Dur,
    /// Probability that a message is lost (its connection breaks), with partition
    /// faults.
    pub loss: f64,
    /// Mean time between stalls (none when zero): a live process — a frontend,
    /// a backend or the scheduler — stops for 0.5 to 8 ms, as an OS scheduling
    /// hiccup or a page fault stops one; its events wait. Any fault setting.
    pub stall_every: Dur,
    pub planted: Option<Planted>,
    /// The workload file given on the command line, for the replay line.
    pub workload_path: Option<String>,
    /// A hot-standby scheduler follows the primary (the production
    /// [`StandbyProto`]); nodes know both addresses; with crash faults the
    /// serving scheduler crashes too, and comes back as the new standby.
    pub standby: bool,
    /// A rogue peer sends the frontends forged results (the ids of their
    /// latest tasks, guessed capabilities) every 5 ms while clients send: no
    /// request may end by one.
    pub rogue: bool,
    /// Backends are told to drain and leave now and then (as an autoscaler
    /// scales in) and come back later as new nodes: no request may fail for
    /// it, and no plan may follow the scheduler's `Drained`.
    pub drain: bool,
    /// Sub-clusters of the scheduler (a dispatcher each; the models start
    /// round-robin). With more than one, models move between them live now
    /// and then: no request may be lost or answered twice for it, and no
    /// plan may reach a backend that has not loaded its model.
    pub subclusters: u32,
    /// What input pulls take.
    pub pull: SimPull,
    /// With `standby`: the serving scheduler pauses once past its standby's
    /// takeover, then resumes (see `paused_primary.rs`): no node may follow
    /// two primaries at once.
    pub paused_primary: bool,
    /// Members come and go all the time: a frontend or backend crashes every
    /// 20 ms on average (its supervisor restarts it as a new node 10 to 50 ms
    /// later), on top of the faults (see [`super::churn`]).
    pub churn: bool,
}

impl Default for ClusterSimOpts {
    fn default() -> Self {
        ClusterSimOpts {
            seed: 1,
            frontends: 2,
            backends: 2,
            gpus_per_backend: 2,
            rate_rps: 1000.0,
            duration: Dur::from_ms(2000),
            faults: Faults::All,
            delay: Dur::from_us(50),
            jitter: Dur::from_us(100),
            loss: 1e-5,
            stall_every: Dur::ZERO,
            planted: None,
            workload_path: None,
            standby: false,
            rogue: false,
            drain: false,
            subclusters: 1,
            pull: SimPull::default(),
            paused_primary: false,
            churn: false,
        }
    }
}

impl ClusterSimOpts {
    /// The command that runs this seed again.
    pub fn replay(&self) -> String {
        let mut s = format!(
            "fermata sim cluster --seed {} --faults {} --frontends {} --backends {} --gpus-per-backend {} --rate {} --duration-ms {} --delay-us {} --jitter-us {} --loss {}",
            self.seed,
            self.faults.name(),
            self.frontends,
            self.backends,
            self.gpus_per_backend,
            self.rate_rps,
            self.duration.0 / 1_000_000,
            self.delay.0 / 1_000,
            self.jitter.0 / 1_000,
            self.loss
        );
        if self.stall_every > Dur::ZERO {
            s += &format!(" --stall-every-ms {}", self.stall_every.as_ms_f64());
        }
        if let Some(w) = &self.workload_path {
            s += &format!(" --workload {w}");
        }
        match self.planted {
            Some(Planted::SkipLoad) => s += " --plant skip-load",
            Some(Planted::NoFencing) => s += " --plant no-fencing",
            None => {}
        }
        if self.standby {
            s += " --standby";
        }
        if self.rogue {
            s += " --rogue";
        }
        if self.churn {
            s += " --churn";
        }
        if self.drain {
            s += " --drain";
        }
        if self.subclusters > 1 {
            s += &format!(" --subclusters {}", self.subclusters);
        }
        if self.paused_primary {
            s += " --paused-primary";
        }
        s
    }
}

/// A broken invariant.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Violation {
    pub at: Time,
    pub what: String,
    /// The command that replays the run.
    pub replay: String,
}

/// What one run counted.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ClusterSimReport {
    pub seed: u64,
    pub requests: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    pub failed: u64,
    pub plans: u64,
    pub events: u64,
    pub crashes: u64,
    pub restarts: u64,
    pub pauses: u64,
    pub hangs: u64,
    /// Backends the scheduler's plan watchdog took out of service.
    pub backends_overdue: u32,
    pub stalls: u64,
    pub partitions: u64,
    pub broken_connections: u64,
    pub backends_registered: u32,
    pub frontends_registered: u32,
    pub sim_seconds: f64,
    /// Plans that reached their backend too late to start (their tasks dropped).
    pub plans_too_late: u64,
    /// The network budget: d_ctrl at the end, its largest value after the first
    /// simulated second, and how often the scheduler changed the budget.
    pub d_ctrl_us: f64,
    pub d_ctrl_us_max: f64,
    pub budget_changes: u64,
    /// Nodes that lost the scheduler and came back into service, and how long
    /// each was out of service (ms), from the loss to the ack.
    pub rejoins: u64,
    pub rejoin_ms: Vec<f64>,
    /// With a standby: the serving scheduler's crashes, and the standby's
    /// takeovers.
    pub scheduler_crashes: u64,
    pub takeovers: u64,
    /// Takeovers that started from the primary's assignment of models to
    /// sub-clusters (`Assignment`), the models whose home that changed from
    /// the standby's start-up one, and the models whose home differed from
    /// the crashed primary's (a switch in its last heartbeat).
    pub assignments_adopted: u64,
    pub homes_changed_at_takeover: u64,
    pub homes_stale_at_takeover: u64,
    /// With a rogue peer: forged results sent, and those the frontends
    /// refused while their task was pending (the rest named ended tasks).
    pub forged_sent: u64,
    pub forged_refused: u64,
    /// Requests held over a lost scheduler and submitted to the next one.
    pub retried: u64,
    /// Backends told to drain, and those that then left (drained).
    pub drains: u64,
    pub drained_left: u64,
    /// With sub-clusters: model moves started (over the serving schedulers),
    /// and finished (unloaded from the source) by the one serving at the end.
    pub moves_started: u64,
    pub moves_done: u64,
    /// With the paused-primary fault: the pauses, the frontends started with
    /// the paused primary's address first, the fences the schedulers that
    /// took over sent, the schedulers that stepped down, and the schedulers
    /// nodes refused for an older term (over the nodes alive at the end).
    pub primary_pauses: u64,
    pub late_frontends: u64,
    pub fences_sent: u64,
    pub step_downs: u64,
    pub fenced_refusals: u64,
    /// Models that backends alive at the end unloaded at a rejoin because
    /// the scheduler they joined did not ask for them (another sub-cluster).
    pub stale_unloaded: u64,
    /// The serving scheduler's GPU slots (the length of every table indexed
    /// by GPU id) and GPUs owned by backends, each at its largest over the
    /// run, and its per-member state at the end.
    pub gpu_slots_max: usize,
    pub gpus_owned_max: usize,
    pub sched_state: crate::node::proto::sched::StateSizes,
    /// Every batch's pull against its budget (not in the JSON).
    #[serde(skip)]
    pub pulls: Vec<PullRecord>,
    /// The network budget in force (not in the JSON).
    #[serde(skip)]
    pub net: NetBudget,
    pub violation: Option<Violation>,
}

type Pid = usize;

/// The scheduler's address as the nodes know it (every connection reaches the
/// one scheduler process), and the standby's.
const SCHED_ADDR: &str = "sched";
const STANDBY_ADDR: &str = "standby";

#[derive(Debug)]
enum Ev {
    Deliver {
        conn: ConnId,
        to: Pid,
        msg: Msg,
    },
    Closed {
        conn: ConnId,
        to: Pid,
        why: String,
    },
    Wake {
        pid: Pid,
    },
    Arrival,
    /// A paused process may resume: it handles its held events in order.
    Resume {
        pid: Pid,
    },
    /// The serving scheduler moves a random model to another sub-cluster.
    Move,
    /// A client's request reaches frontend `pid`.
    Request {
        pid: Pid,
        client: u64,
        model: usize,
    },
    /// A GPU's next plan may be due to start.
    Start {
        pid: Pid,
        gpu: u32,
    },
    BatchDone {
        pid: Pid,
        gpu: u32,
    },
    Crash,
    Pause,
    /// A backend's GPUs stop finishing batches for a while (it still pings).
    Hang,
    Stall,
    Partition,
    Restart {
        role: Role,
        slot: usize,
    },
    /// The serving scheduler crashes (with a standby).
    SchedCrash,
    /// A scheduler starts again at `addr`, as the standby of the serving one.
    SchedRestart {
        addr: &'static str,
    },
    /// The rogue peer sends a frontend forged results.
    Forge,
    /// A backend is told to drain and leave.
    Drain,
    /// The serving scheduler pauses past its standby's takeover.
    PausePrimary,
    /// A frontend starts with `addr` first.
    LateFrontend {
        addr: &'static str,
    },
    /// One node in service loses its scheduler's connection.
    Nudge,
}

struct Link {
    ends: [Pid; 2],
    open: bool,
    /// Last delivery time per direction (0: ends[0] -> ends[1]).
    last: [Time; 2],
}

/// A node's clock: local = true * (1 + drift) + skew.
#[derive(Clone, Copy)]
struct NodeClock {
    skew: i64,
    drift: f64,
}

impl NodeClock {
    fn local(&self, t: Time) -> Time {
        Time(t.0 + self.skew + (t.0 as f64 * self.drift) as i64)
    }
    /// The true time at which the local clock shows `l`.
    fn true_of(&self, l: Time) -> Time {
        Time(((l.0 - self.skew) as f64 / (1.0 + self.drift)) as i64)
    }
}

struct Fe {
    clock: NodeClock,
    /// The production membership machine (sync, register, heartbeats, rejoin).
    member: Member,
    node: Option<NodeId>,
    models: Vec<ModelInfo>,
    ledger: RequestLedger<u64>,
    gpus: u32,
    /// Requests held over a lost scheduler, with their arrival and deadline
    /// on this node's clock (the production frontend's rule).
    orphans: Vec<(Orphan<u64>, Time, Time)>,
    /// The scheduler was lost and none has had GPUs in service since: new
    /// requests are held with the orphans (the production frontend's rule).
    away: bool,
}

impl Fe {
    /// Now on the scheduler's clock, as this frontend estimates it.
    fn sched_now(&self, now: Time) -> Time {
        self.clock.local(now) + self.member.offset()
    }
}

/// A queued plan's pull, as the simulated puller did it.
struct Pulled {
    /// When its inputs are in (true time).
    done: Time,
    took: Dur,
    /// The bytes it read.
    bytes: u64,
    /// The budget the scheduler had for a batch of its size.
    budget: Dur,
    /// Per task: its input was not read (skipped, or not read by the
    /// batch's latest start).
    unread: Vec<bool>,
}

struct GpuRun {
    busy: bool,
    queue: PlanQueue<PlanMsg>,
    /// When the GPU's puller is done with the plans it has (true time).
    pull_free: Time,
    /// Per queued plan: its pull.
    pulled: HashMap<PlanId, Pulled>,
    /// Models to confirm loaded (a rejoin) when the running batch ends.
    confirms: Vec<ModelId>,
}

struct Be {
    clock: NodeClock,
    proto: BackendProto,
    /// The models the (modelled) GPUs really hold.
    loaded: HashSet<ModelId>,
    /// Frontend node -> its pid.
    fe_pids: HashMap<NodeId, Pid>,
    run: Vec<GpuRun>,
    /// The pending wake-up for the protocol's timeout (true time).
    wake: Option<Time>,
    /// A hang fault: batches running or starting before this (true time) end
    /// only then, while the process goes on answering pings.
    hung_until: Time,
    /// Told to drain (it sent `Drain`), and answered (`Drained`).
    draining: bool,
    drained: bool,
    /// The production estimator of the pull cost, fed every batch pulled.
    pull_est: PullEstimator,
}

struct Sched {
    proto: SchedProto,
    /// One dispatcher per sub-cluster (each knows every model and GPU id,
    /// plans on its own GPUs), each model's home, each GPU's sub-cluster.
    cores: Vec<Dispatcher>,
    home: Vec<u32>,
    gpu_sub: HashMap<u32, u32>,
    gpu_conn: HashMap<u32, ConnId>,
    fe_nodes: HashSet<NodeId>,
    /// Per GPU: the latest plan booked, and when the GPU is due free.
    gpu_free: HashMap<u32, (u64, Time)>,
    /// Its pending wake-up (one at a time: the earliest needed).
    wake: Option<Time>,
    /// Once it took over as a standby: the production fencing of its old
    /// primary's address.
    fencer: Option<Fencer>,
    /// GPUs its backends own, and the most they owned at once.
    owned: usize,
    owned_max: usize,
}

/// A hot standby: a whole scheduler that does not serve yet, and the
/// production machine that decides when it takes over.
struct StandbySim {
    sched: Sched,
    proto: StandbyProto,
    wake: Option<Time>,
}

enum Proc {
    Sched(Box<Sched>),
    Standby(Box<StandbySim>),
    Fe(Box<Fe>),
    Be(Box<Be>),
    Dead,
}

/// A client request: which frontend process has it and whether it ended.
struct Client {
    ended: bool,
}

/// One simulated cluster.
pub struct ClusterSim {
    opts: ClusterSimOpts,
    w: Workload,
    models: Vec<ModelInfo>,
    rng: Xoshiro256PlusPlus,
    pull_rng: Xoshiro256PlusPlus,
    now: Time,
    seq: u64,
    queue: BinaryHeap<Reverse<(Time, u64, usize)>>,
    evs: HashMap<usize, Ev>,
    procs: Vec<Proc>,
    paused: Vec<Time>,
    /// Per process: its events held while it is paused, in arrival order
    /// (handled in that order when it resumes, [`Ev::Resume`]).
    held: Vec<std::collections::VecDeque<Ev>>,
    links: HashMap<ConnId, Link>,
    next_conn: ConnId,
    sched_pid: Pid,
    /// Scheduler addresses and the process at each (the primary's and, with a
    /// standby, the standby's).
    sched_addrs: Vec<(&'static str, Pid)>,
    /// The rogue peer (a process id with no process: it only sends) and its
    /// connection to each frontend.
    rogue: Option<Pid>,
    rogue_links: HashMap<Pid, ConnId>,
    /// The models' homes at the serving scheduler's last crash.
    crashed_homes: Option<Vec<u32>>,
    fe_slots: Vec<Pid>,
    be_slots: Vec<Pid>,
    next_client: u64,
    clients: HashMap<u64, Client>,
    rr: usize,
    heartbeat: Dur,
    sched_timeout: Dur,
    /// A running batch's results, its scheduler connection and its report,
    /// sent when it finishes.
    pending_out: HashMap<(Pid, u32), BatchOut>,
    report: ClusterSimReport,
    violation: Option<Violation>,
    /// Scheduler connections on which `Drained` was sent: no plan may follow.
    drained_conns: HashSet<ConnId>,
    /// The address a starting frontend is given first (None: the serving
    /// scheduler's).
    first_addr: Option<&'static str>,
    /// Per node: the newest scheduler generation it took messages from.
    node_terms: HashMap<Pid, usize>,
    /// The schedulers in the order they began serving (the simulator's own
    /// knowledge, independent of the protocol's terms): a scheduler's
    /// generation is its place here.
    generations: Vec<Pid>,
}

type BatchOut = (Vec<(ConnId, Msg)>, Option<ConnId>, Msg);

impl ClusterSim {
    pub fn new(w: &Workload, opts: ClusterSimOpts) -> ClusterSim {
        let models = crate::node::exec::model_infos(w);
        let mut sim = ClusterSim {
            rng: Xoshiro256PlusPlus::seed_from_u64(opts.seed),
            // Pulls draw from their own stream: a pull model with jitter
            // leaves every other draw of the seed as it was.
            pull_rng: Xoshiro256PlusPlus::seed_from_u64(opts.seed ^ 0x9e37_79b9_7f4a_7c15),
            report: ClusterSimReport {
                seed: opts.seed,
                ..Default::default()
            },
            opts,
            w: w.clone(),
            models,
            now: Time::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            evs: HashMap::new(),
            procs: Vec::new(),
            paused: Vec::new(),
            held: Vec::new(),
            links: HashMap::new(),
            next_conn: 1,
            sched_pid: 0,
            sched_addrs: Vec::new(),
            rogue: None,
            crashed_homes: None,
            rogue_links: HashMap::new(),
            fe_slots: Vec::new(),
            be_slots: Vec::new(),
            next_client: 0,
            clients: HashMap::new(),
            rr: 0,
            heartbeat: Dur::from_ms(100),
            sched_timeout: Dur::from_ms(1000),
            pending_out: HashMap::new(),
            violation: None,
            drained_conns: HashSet::new(),
            first_addr: None,
            node_terms: HashMap::new(),
            generations: Vec::new(),
        };
        sim.start_scheduler();
        if sim.opts.standby {
            sim.start_standby(STANDBY_ADDR);
        }
        for slot in 0..sim.opts.backends as usize {
            sim.be_slots.push(usize::MAX);
            sim.start_backend(slot);
        }
        for slot in 0..sim.opts.frontends as usize {
            sim.fe_slots.push(usize::MAX);
            sim.start_frontend(slot);
        }
        // Clients start once the cluster had time to form.
        sim.at(Time(Dur::from_ms(50).0), Ev::Arrival);
        if sim.opts.rogue {
            sim.rogue = Some(sim.new_pid(Proc::Dead));
            sim.at(Time(Dur::from_ms(60).0), Ev::Forge);
        }
        if sim.opts.faults != Faults::None
            || sim.opts.drain
            || sim.opts.churn
            || sim.opts.subclusters > 1
        {
            sim.schedule_faults();
        }
        if sim.opts.paused_primary && sim.opts.standby {
            sim.schedule_paused_primary();
        }
        sim.next_stall();
        sim
    }

    fn at(&mut self, t: Time, ev: Ev) {
        self.seq += 1;
        let k = self.seq as usize;
        self.evs.insert(k, ev);
        self.queue.push(Reverse((t.max(self.now), self.seq, k)));
    }

    fn schedule_faults(&mut self) {
        let end = self.opts.duration.0;
        let n = 1 + (end / 500_000_000) as usize;
        for _ in 0..n {
            let t = Time(self.rng.gen_range(100_000_000..end.max(100_000_001)));
            if self.opts.faults.crash() {
                self.at(t, Ev::Crash);
                let t2 = Time(self.rng.gen_range(100_000_000..end.max(100_000_001)));
                self.at(t2, Ev::Pause);
                let t4 = Time(self.rng.gen_range(100_000_000..end.max(100_000_001)));
                self.at(t4, Ev::Hang);
            }
            if self.opts.faults.partition() {
                let t3 = Time(self.rng.gen_range(100_000_000..end.max(100_000_001)));
                self.at(t3, Ev::Partition);
            }
        }
        if self.opts.churn {
            // A member crashes every 20 ms on average.
            for _ in 0..end / 20_000_000 {
                let t = Time(self.rng.gen_range(100_000_000..end.max(100_000_001)));
                self.at(t, Ev::Crash);
            }
        }
        if self.opts.drain {
            for _ in 0..n {
                let t = Time(self.rng.gen_range(100_000_000..end.max(100_000_001)));
                self.at(t, Ev::Drain);
            }
        }
        if self.opts.subclusters > 1 {
            // A move every 100 ms on average.
            for _ in 0..1 + end / 100_000_000 {
                let t = Time(self.rng.gen_range(100_000_000..end.max(100_000_001)));
                self.at(t, Ev::Move);
            }
        }
        if self.opts.standby && self.opts.faults.crash() {
            // The serving scheduler crashes once or twice a run.
            for _ in 0..1 + n / 3 {
                let t = Time(self.rng.gen_range(100_000_000..end.max(100_000_001)));
                self.at(t, Ev::SchedCrash);
            }
        }
    }

    fn new_pid(&mut self, p: Proc) -> Pid {
        self.procs.push(p);
        self.paused.push(Time::EPOCH_MIN);
        self.held.push(std::collections::VecDeque::new());
        self.procs.len() - 1
    }

    fn node_clock(&mut self) -> NodeClock {
        NodeClock {
            skew: self.rng.gen_range(-5_000_000i64..5_000_000),
            drift: self.rng.gen_range(-50e-6..50e-6),
        }
    }

    fn new_sched(&self) -> Sched {
        let dcfg = {
            let mut c = self.w.dispatcher_config(self.w.policy, true);
            c.gpus = 0;
            c
        };
        let specs: Vec<_> = self.w.models.iter().map(|m| m.spec.clone()).collect();
        let n = self.opts.subclusters.max(1);
        let home: Vec<u32> = (0..self.models.len() as u32).map(|m| m % n).collect();
        let proto = SchedProto::new(
            self.now,
            SchedConfig {
                models: self.models.clone(),
                heartbeat: self.heartbeat,
                node_timeout: Dur::from_ms(1000),
                plan_grace: crate::node::proto::plans::PLAN_GRACE,
                net_update: Dur::from_ms(200),
                floors: dcfg.net,
                max_ctrl: Dur::from_us(2000),
                max_data: Dur::from_us(500),
                max_margin: Dur::from_us(5000),
                // The limits take the simulated members whatever their size
                // (a restarted node may register before its last
                // registration is gone).
                limits: {
                    let d = crate::node::proto::bounds::Limits::default();
                    let o = &self.opts;
                    crate::node::proto::bounds::Limits {
                        max_gpus_per_member: d.max_gpus_per_member.max(o.gpus_per_backend),
                        max_members: d
                            .max_members
                            .max(2 * o.backends.saturating_add(o.frontends)),
                    }
                },
                subclusters: SubClusters::new(n, home.clone()).expect("sub-clusters"),
                latency: Default::default(),
            },
        );
        Sched {
            proto,
            cores: (0..n)
                .map(|j| Dispatcher::with_plan_ids(dcfg.clone(), specs.clone(), j, n))
                .collect(),
            home,
            gpu_sub: HashMap::new(),
            gpu_conn: HashMap::new(),
            fe_nodes: HashSet::new(),
            gpu_free: HashMap::new(),
            wake: None,
            fencer: None,
            owned: 0,
            owned_max: 0,
        }
    }

    fn start_scheduler(&mut self) {
        let s = self.new_sched();
        self.sched_pid = self.new_pid(Proc::Sched(Box::new(s)));
        self.sched_addrs = vec![(SCHED_ADDR, self.sched_pid)];
        self.generations.push(self.sched_pid);
    }

    /// Starts a standby scheduler at `addr` following the serving one.
    fn start_standby(&mut self, addr: &'static str) {
        let sched = self.new_sched();
        let pid = self.new_pid(Proc::Dead);
        let primary = self.addr_of(self.sched_pid);
        let c = self.connect(pid, self.sched_pid);
        let proto = StandbyProto::new(self.now, primary, c, self.heartbeat);
        self.procs[pid] = Proc::Standby(Box::new(StandbySim {
            sched,
            proto,
            wake: None,
        }));
        match self.sched_addrs.iter_mut().find(|(a, _)| *a == addr) {
            Some(e) => e.1 = pid,
            None => self.sched_addrs.push((addr, pid)),
        }
        self.at(self.now, Ev::Wake { pid });
    }

    /// The address of scheduler process `pid`.
    fn addr_of(&self, pid: Pid) -> &'static str {
        self.sched_addrs
            .iter()
            .find(|(_, p)| *p == pid)
            .map_or(SCHED_ADDR, |(a, _)| *a)
    }

    /// The scheduler process at `addr`.
    fn pid_at(&self, addr: &str) -> Pid {
        self.sched_addrs
            .iter()
            .find(|(a, _)| *a == addr)
            .map_or(self.sched_pid, |(_, p)| *p)
    }

    /// The scheduler addresses a starting node is given: the serving one
    /// first (the one it connects to), then the standby's.
    fn node_addrs(&self) -> Vec<String> {
        let first = self
            .first_addr
            .unwrap_or_else(|| self.addr_of(self.sched_pid));
        let mut v = vec![first.to_string()];
        v.extend(
            self.sched_addrs
                .iter()
                .filter(|(a, _)| *a != first)
                .map(|(a, _)| a.to_string()),
        );
        v
    }

    /// Opens a connection from `from` to `to`; the accepting side hears of it
    /// (the scheduler's protocol machine) at once.
    fn connect(&mut self, from: Pid, to: Pid) -> ConnId {
        let c = self.next_conn;
        self.next_conn += 1;
        let ok = !matches!(self.procs[to], Proc::Dead);
        self.links.insert(
            c,
            Link {
                ends: [from, to],
                open: ok,
                last: [self.now; 2],
            },
        );
        if !ok {
            self.at(
                self.now,
                Ev::Closed {
                    conn: c,
                    to: from,
                    why: "connection refused".into(),
                },
            );
        } else if let Proc::Sched(s) = &mut self.procs[to] {
            s.proto.handle_accept(self.now, c);
        } else if let Proc::Standby(sb) = &mut self.procs[to] {
            sb.sched.proto.handle_accept(self.now, c);
        }
        c
    }

    fn start_backend(&mut self, slot: usize) {
        let clock = self.node_clock();
        let gpus = self.opts.gpus_per_backend;
        let pid = self.new_pid(Proc::Dead);
        let sched = self.connect(pid, self.sched_pid);
        let gpu_infos = (0..gpus)
            .map(|i| GpuInfo {
                local: i,
                name: "sim".into(),
                mem_bytes: 80 << 30,
                device: crate::wire::DeviceKind::Emulated,
                lanes: 1,
            })
            .collect();
        let proto = BackendProto::new(
            clock.local(self.now),
            sched,
            self.node_addrs(),
            format!("be{slot}"),
            gpu_infos,
            self.sched_timeout,
        );
        self.procs[pid] = Proc::Be(Box::new(Be {
            clock,
            proto,
            loaded: HashSet::new(),
            fe_pids: HashMap::new(),
            run: (0..gpus)
                .map(|_| GpuRun {
                    busy: false,
                    queue: PlanQueue::default(),
                    pull_free: Time::EPOCH_MIN,
                    pulled: HashMap::new(),
                    confirms: Vec::new(),
                })
                .collect(),
            wake: None,
            hung_until: Time::EPOCH_MIN,
            draining: false,
            drained: false,
            pull_est: PullEstimator::new(512),
        }));
        self.be_slots[slot] = pid;
        self.be_apply(pid);
    }

    fn start_frontend(&mut self, slot: usize) {
        let clock = self.node_clock();
        let pid = self.new_pid(Proc::Dead);
        let to = self.first_addr.map_or(self.sched_pid, |a| self.pid_at(a));
        let sched = self.connect(pid, to);
        let register = Msg::Register {
            role: Role::Frontend,
            name: format!("fe{slot}"),
            gpus: vec![],
            ctrl_addr: format!("fe{pid}"),
            region: Some(RegionInfo {
                addr: format!("fe{pid}"),
                region: pid as u32,
                len: 1 << 30,
                rkey: 0,
                base: 0,
            }),
        };
        let member = Member::new(
            clock.local(self.now),
            sched,
            self.node_addrs(),
            register,
            self.sched_timeout,
        );
        self.procs[pid] = Proc::Fe(Box::new(Fe {
            clock,
            member,
            node: None,
            models: Vec::new(),
            ledger: RequestLedger::new(0, Dur::from_ms(3000)),
            gpus: 0,
            orphans: Vec::new(),
            away: false,
        }));
        self.fe_slots[slot] = pid;
        self.fe_apply(pid);
        self.at(self.now + self.heartbeat, Ev::Wake { pid });
    }

    /// Sends `msg` from `from` on `conn`: delivered after the network's delay, in
    /// order on the connection; lost (the connection breaks) with the loss rate.
    fn send(&mut self, from: Pid, conn: ConnId, msg: Msg) {
        let loss = if self.opts.faults.partition() {
            self.opts.loss
        } else {
            0.0
        };
        // Losses end with the clients' sending, as the other faults do, so
        // that the drain shows every node back in service (the draw is made
        // all the same: a run replays as before up to then).
        let lost =
            loss > 0.0 && self.rng.gen_bool(loss.min(1.0)) && self.now.0 < self.opts.duration.0;
        let jitter = if self.opts.jitter.0 > 0 {
            self.rng.gen_range(0..=self.opts.jitter.0)
        } else {
            0
        };
        match &msg {
            Msg::Drained => {
                self.drained_conns.insert(conn);
            }
            Msg::Plan { id, .. } if self.drained_conns.contains(&conn) => {
                self.violate(format!(
                    "plan {} sent on connection {conn} after Drained",
                    id.0
                ));
            }
            _ => {}
        }
        let Some(l) = self.links.get_mut(&conn) else {
            return;
        };
        if !l.open {
            return;
        }
        if lost {
            self.break_link(conn, "message lost: connection reset");
            return;
        }
        let dir = usize::from(l.ends[0] != from);
        let to = l.ends[1 - dir];
        let t = (self.now + self.opts.delay + Dur(jitter)).max(l.last[dir]);
        l.last[dir] = t;
        self.at(t, Ev::Deliver { conn, to, msg });
    }

    /// Breaks a connection: both ends hear `Closed` after the network delay.
    fn break_link(&mut self, conn: ConnId, why: &str) {
        let Some(l) = self.links.get_mut(&conn) else {
            return;
        };
        if !l.open {
            return;
        }
        l.open = false;
        self.report.broken_connections += 1;
        let ends = l.ends;
        let last = l.last;
        for (i, &to) in ends.iter().enumerate() {
            // After whatever was already on its way to that end.
            let t = (self.now + self.opts.delay).max(last[1 - i]);
            self.at(
                t,
                Ev::Closed {
                    conn,
                    to,
                    why: why.to_string(),
                },
            );
        }
    }

    fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation {
                at: self.now,
                what,
                replay: self.opts.replay(),
            });
        }
    }

    /// Runs to the end (or the first violation).
    pub fn run(mut self) -> ClusterSimReport {
        let end = Time(self.opts.duration.0) + Dur::from_ms(4000);
        while let Some(Reverse((t, _, k))) = self.queue.pop() {
            if t > end || self.violation.is_some() {
                break;
            }
            self.now = t;
            let ev = self.evs.remove(&k).expect("event");
            self.report.events += 1;
            self.event(ev);
        }
        self.now = end;
        self.report.fenced_refusals = self.fenced_refusals();
        if let Proc::Sched(s) = &self.procs[self.sched_pid] {
            self.report.moves_done = s.proto.report().moves.done;
        }
        for p in &self.procs {
            if let Proc::Be(b) = p {
                self.report.stale_unloaded += b.proto.counts().stale_unloaded;
            }
        }
        self.one_primary_at_the_end();
        // Every request must have ended by now: deadline + grace is < 4 s.
        let open = self.clients.values().filter(|c| !c.ended).count();
        if open > 0 && self.violation.is_none() {
            self.violate(format!("{open} requests never ended at their clients"));
        }
        // Every node that is up is back in service: faults end with the clients'
        // sending, and a node rejoins well within the drain.
        let nodes: Vec<Pid> = self
            .fe_slots
            .iter()
            .chain(&self.be_slots)
            .copied()
            .collect();
        for pid in nodes {
            let (ready, state) = match &self.procs[pid] {
                Proc::Fe(f) => (f.member.is_ready(), f.member.describe()),
                Proc::Be(b) => (b.proto.is_ready(), b.proto.describe_member()),
                _ => (true, String::new()),
            };
            if !ready {
                let scheds: Vec<String> = self
                    .sched_addrs
                    .iter()
                    .map(|&(a, p)| {
                        let k = match &self.procs[p] {
                            Proc::Sched(_) => "serving",
                            Proc::Standby(_) => "standby",
                            Proc::Dead => "dead",
                            _ => "?",
                        };
                        format!("{a}: {k}")
                    })
                    .collect();
                self.violate(format!(
                    "node {pid} is not back in service at the end ({state}; schedulers: {})",
                    scheds.join(", ")
                ));
            }
        }
        self.report.sim_seconds = self.now.as_secs_f64();
        self.report.d_ctrl_us_max = self.report.d_ctrl_us_max.max(self.report.d_ctrl_us);
        self.report.violation = self.violation.take();
        if let Proc::Sched(s) = &self.procs[self.sched_pid] {
            let r = s.proto.report();
            self.report.backends_registered = r.backends_registered;
            self.report.frontends_registered = r.frontends_registered;
            self.report.backends_overdue = r.backends_overdue;
        }
        self.report
    }

    fn pid_of(&self, ev: &Ev) -> Option<Pid> {
        match ev {
            Ev::Deliver { to, .. } | Ev::Closed { to, .. } => Some(*to),
            Ev::Wake { pid }
            | Ev::BatchDone { pid, .. }
            | Ev::Start { pid, .. }
            | Ev::Request { pid, .. } => Some(*pid),
            _ => None,
        }
    }

    fn event(&mut self, ev: Ev) {
        if let Some(pid) = self.pid_of(&ev) {
            // A paused process handles its events when it resumes, in the
            // order they came (also when its pause is extended meanwhile: a
            // connection delivers in order).
            if self.paused[pid] > self.now || !self.held[pid].is_empty() {
                if self.held[pid].is_empty() {
                    let t = self.paused[pid].max(self.now);
                    self.at(t, Ev::Resume { pid });
                }
                self.held[pid].push_back(ev);
                return;
            }
        }
        self.handle_event(ev)
    }

    /// A paused process's turn: still paused, it waits on; else it handles
    /// what it holds, in order, until it is paused again.
    fn resume(&mut self, pid: Pid) {
        while let Some(ev) = self.held[pid].pop_front() {
            if self.paused[pid] > self.now {
                self.held[pid].push_front(ev);
                let t = self.paused[pid];
                self.at(t, Ev::Resume { pid });
                return;
            }
            self.handle_event(ev);
            if self.violation.is_some() {
                return;
            }
        }
    }

    fn handle_event(&mut self, ev: Ev) {
        if let Some(pid) = self.pid_of(&ev) {
            if matches!(self.procs[pid], Proc::Dead) {
                // A request that reaches a dead frontend: connection refused.
                if let Ev::Request { client, .. } = ev {
                    self.client_end(client, Ended::Failed);
                }
                return;
            }
        }
        match ev {
            Ev::Resume { pid } => self.resume(pid),
            Ev::Deliver { conn, to, msg } => self.deliver(conn, to, msg),
            Ev::Closed { conn, to, why } => self.closed(conn, to, why),
            Ev::Wake { pid } => self.wake(pid),
            Ev::Arrival => self.arrival(),
            Ev::Request { pid, client, model } => self.infer(pid, client, model),
            Ev::BatchDone { pid, gpu } => self.batch_done(pid, gpu),
            Ev::Start { pid, gpu } => self.be_next(pid, gpu),
            Ev::Crash => self.crash(),
            Ev::Pause => self.pause(),
            Ev::Hang => self.hang(),
            Ev::Drain => self.drain_one(),
            Ev::Move => self.move_one(),
            Ev::Stall => self.stall(),
            Ev::Partition => self.partition(),
            Ev::SchedCrash => self.sched_crash(),
            Ev::Forge => self.forge(),
            Ev::SchedRestart { addr } => self.sched_restart(addr),
            Ev::PausePrimary => self.pause_primary(),
            Ev::LateFrontend { addr } => self.late_frontend(addr),
            Ev::Nudge => self.nudge(),
            Ev::Restart { role, slot } => match role {
                Role::Backend => {
                    self.report.restarts += 1;
                    self.start_backend(slot)
                }
                Role::Frontend => {
                    self.report.restarts += 1;
                    self.start_frontend(slot)
                }
            },
        }
    }

    // ------------------------------------------------------------ standby

    /// Carries out what standby `pid`'s machine decided, then sets its
    /// wake-up; at a takeover it becomes the serving scheduler.
    fn standby_apply(&mut self, pid: Pid) {
        loop {
            let now = self.now;
            let Proc::Standby(sb) = &mut self.procs[pid] else {
                return;
            };
            let Some(a) = sb.proto.poll_action() else {
                break;
            };
            match a {
                StandbyAction::Connect(addr) => {
                    let c = self.connect(pid, self.pid_at(&addr));
                    if let Proc::Standby(sb) = &mut self.procs[pid] {
                        sb.proto.handle_connected(now, c);
                    }
                }
                StandbyAction::Send(c, m) => self.send(pid, c, m),
                StandbyAction::Close(c, why) => self.break_link(c, &why),
                StandbyAction::Refuse(c, why) => {
                    self.send(pid, c, Msg::Error { message: why });
                }
                StandbyAction::TakeOver {
                    held,
                    assignment,
                    states,
                    scales,
                    term,
                    ..
                } => {
                    let Proc::Standby(mut sb) = std::mem::replace(&mut self.procs[pid], Proc::Dead)
                    else {
                        return;
                    };
                    self.begin_term(pid, &mut sb, term);
                    if let Some(k) = scales {
                        // The same models as its primary's: they always fit.
                        sb.sched
                            .proto
                            .adopt_latency_scales(&k)
                            .unwrap_or_else(|e| panic!("the primary's latency scales: {e}"));
                    }
                    if let Some(h) = assignment {
                        // Before any node registers: it always fits.
                        let n = sb
                            .sched
                            .proto
                            .adopt_assignment(&h)
                            .unwrap_or_else(|e| panic!("the primary's assignment: {e}"));
                        self.report.assignments_adopted += 1;
                        self.report.homes_changed_at_takeover += n as u64;
                        if let Some(c) = self.crashed_homes.take() {
                            self.report.homes_stale_at_takeover +=
                                c.iter().zip(&h).filter(|(a, b)| a != b).count() as u64;
                        }
                    }
                    if !states.is_empty() {
                        // Before any node registers, of the same models: it fits.
                        sb.sched
                            .proto
                            .adopt_model_states(&states)
                            .unwrap_or_else(|e| panic!("the primary's model states: {e}"));
                    }
                    self.procs[pid] = Proc::Sched(Box::new(sb.sched));
                    self.sched_pid = pid;
                    self.report.takeovers += 1;
                    for (c, m) in held {
                        if self.links.get(&c).is_some_and(|l| l.open) {
                            self.sched_msg(pid, c, m);
                        }
                    }
                    self.sched_apply(pid);
                    return;
                }
            }
        }
        let Proc::Standby(sb) = &mut self.procs[pid] else {
            return;
        };
        let t = sb.proto.poll_timeout().max(self.now);
        if t != Time::NEVER && sb.wake.is_none_or(|w| t < w) {
            sb.wake = Some(t);
            self.at(t, Ev::Wake { pid });
        }
    }

    /// The serving scheduler crashes while a standby follows it; a supervisor
    /// starts it again later, on its address, as the next standby.
    fn sched_crash(&mut self) {
        let following = self
            .sched_addrs
            .iter()
            .any(|&(_, p)| matches!(self.procs[p], Proc::Standby(_)));
        if !following || !matches!(self.procs[self.sched_pid], Proc::Sched(_)) {
            return;
        }
        let addr = self.addr_of(self.sched_pid);
        if let Proc::Sched(sc) = &self.procs[self.sched_pid] {
            self.crashed_homes = Some(sc.proto.subclusters().homes().to_vec());
        }
        self.report.scheduler_crashes += 1;
        self.kill(self.sched_pid, "process crashed");
        let back = self.now + Dur(self.rng.gen_range(200_000_000..600_000_000));
        self.at(back, Ev::SchedRestart { addr });
    }

    /// The crashed scheduler is back at `addr`: the standby of the serving one
    /// (later, while the standby has not taken over yet).
    fn sched_restart(&mut self, addr: &'static str) {
        if !matches!(self.procs[self.sched_pid], Proc::Sched(_)) {
            self.at(self.now + Dur::from_ms(100), Ev::SchedRestart { addr });
            return;
        }
        self.report.restarts += 1;
        self.start_standby(addr);
    }

    /// The rogue peer sends one frontend results for its 16 latest task ids,
    /// each with a guessed capability, then comes back in 5 ms.
    fn forge(&mut self) {
        let Some(rogue) = self.rogue else {
            return;
        };
        if self.now.0 >= self.opts.duration.0 {
            return;
        }
        self.at(self.now + Dur::from_ms(5), Ev::Forge);
        let fes: Vec<Pid> = self
            .fe_slots
            .iter()
            .copied()
            .filter(|&p| matches!(&self.procs[p], Proc::Fe(f) if f.node.is_some()))
            .collect();
        if fes.is_empty() {
            return;
        }
        let fe = fes[self.rng.gen_range(0..fes.len())];
        let Proc::Fe(f) = &self.procs[fe] else {
            return;
        };
        let next = f.ledger.next_id().0;
        let ids: Vec<u64> = (1..=16u64).filter_map(|k| next.checked_sub(k)).collect();
        let items: Vec<crate::wire::TaskResult> = ids
            .into_iter()
            .map(|id| crate::wire::TaskResult {
                id: crate::core::TaskId(id),
                status: crate::wire::TaskStatus::Ok,
                started: self.now,
                finished: self.now,
                batch_size: 1,
                output: vec![0xEE],
                cap: self.rng.gen(),
            })
            .collect();
        self.report.forged_sent += items.len() as u64;
        let conn = match self.rogue_links.get(&fe) {
            Some(&c) if self.links.get(&c).is_some_and(|l| l.open) => c,
            _ => {
                let c = self.connect(rogue, fe);
                self.rogue_links.insert(fe, c);
                c
            }
        };
        self.send(rogue, conn, Msg::Results { items });
    }

    // ------------------------------------------------------------ faults

    fn crash(&mut self) {
        let be = self.rng.gen_bool(0.5);
        let slots = if be { &self.be_slots } else { &self.fe_slots };
        let slot = self.rng.gen_range(0..slots.len());
        let pid = slots[slot];
        if matches!(self.procs[pid], Proc::Dead) {
            return;
        }
        self.report.crashes += 1;
        self.kill(pid, "process crashed");
        let role = if be { Role::Backend } else { Role::Frontend };
        self.restart_later(role, slot);
    }

    /// A supervisor starts the process of `slot` again, as a new node, 0.2 to
    /// 0.6 s from now (with churn, 10 to 50 ms).
    fn restart_later(&mut self, role: Role, slot: usize) {
        let (lo, hi) = if self.opts.churn {
            (10_000_000, 50_000_000)
        } else {
            (200_000_000, 600_000_000)
        };
        let back = self.now + Dur(self.rng.gen_range(lo..hi));
        self.at(back, Ev::Restart { role, slot });
    }

    /// A live frontend or backend, picked at random.
    fn live_node(&mut self) -> Option<Pid> {
        let pids: Vec<Pid> = self
            .be_slots
            .iter()
            .chain(&self.fe_slots)
            .copied()
            .filter(|&p| !matches!(self.procs[p], Proc::Dead))
            .collect();
        if pids.is_empty() {
            return None;
        }
        Some(pids[self.rng.gen_range(0..pids.len())])
    }

    fn pause(&mut self) {
        let Some(pid) = self.live_node() else {
            return;
        };
        self.report.pauses += 1;
        // Some pauses outlast the heartbeat timeout, most do not.
        let len = Dur(self.rng.gen_range(10_000_000..1_500_000_000));
        self.paused[pid] = self.now + len;
    }

    /// A live backend in service is told to drain (as `fermata backend` on
    /// SIGTERM): it sends `Drain` and leaves once answered and idle. Only
    /// while another backend is in service and none drains, so that the
    /// cluster keeps a GPU (a drain must fail no request).
    /// The serving scheduler starts moving a random model to a random other
    /// sub-cluster (as an epoch's re-partition would).
    fn move_one(&mut self) {
        let now = self.now;
        let n = self.opts.subclusters;
        let models = self.models.len() as u32;
        let (m, k) = (self.rng.gen_range(0..models), self.rng.gen_range(1..n));
        let sp = self.sched_pid;
        let Proc::Sched(s) = &mut self.procs[sp] else {
            return;
        };
        let to = (s.proto.subclusters().home(ModelId(m)) + k) % n;
        if s.proto.move_model(now, ModelId(m), to) {
            self.report.moves_started += 1;
        }
        self.sched_apply(sp);
    }

    fn drain_one(&mut self) {
        let in_service: Vec<Pid> = self
            .be_slots
            .iter()
            .copied()
            .filter(|&p| matches!(&self.procs[p], Proc::Be(b) if b.proto.sched_conn().is_some() && !b.draining))
            .collect();
        let draining = self
            .be_slots
            .iter()
            .any(|&p| matches!(&self.procs[p], Proc::Be(b) if b.draining));
        if in_service.len() < 2 || draining {
            return;
        }
        let pid = in_service[self.rng.gen_range(0..in_service.len())];
        let Proc::Be(b) = &mut self.procs[pid] else {
            return;
        };
        let Some(c) = b.proto.sched_conn() else {
            return;
        };
        b.draining = true;
        self.report.drains += 1;
        self.send(
            pid,
            c,
            Msg::Drain {
                reason: "scale in".into(),
            },
        );
    }

    /// A drained backend with nothing queued or running unregisters and
    /// exits; a supervisor starts it again later as a new node. True when it
    /// left.
    fn maybe_leave(&mut self, pid: Pid) -> bool {
        let Proc::Be(b) = &self.procs[pid] else {
            return false;
        };
        let idle = b.run.iter().all(|r| !r.busy && r.queue.is_empty());
        if !(b.drained && idle) {
            return false;
        }
        if let Some(c) = b.proto.sched_conn() {
            self.send(
                pid,
                c,
                Msg::Unregister {
                    reason: "drained".into(),
                },
            );
        }
        let slot = self.be_slots.iter().position(|&p| p == pid);
        self.report.drained_left += 1;
        self.kill(pid, "drained: left");
        if let Some(slot) = slot {
            self.restart_later(Role::Backend, slot);
        }
        true
    }

    /// A live backend's GPUs hang for 0.3 to 1.5 s: the batches they run end
    /// only after it, while the process answers pings (the plan watchdog's
    /// case).
    fn hang(&mut self) {
        let pids: Vec<Pid> = self
            .be_slots
            .iter()
            .copied()
            .filter(|&p| matches!(self.procs[p], Proc::Be(_)))
            .collect();
        if pids.is_empty() {
            return;
        }
        let pid = pids[self.rng.gen_range(0..pids.len())];
        let len = Dur(self.rng.gen_range(300_000_000..1_500_000_000));
        let until = self.now + len;
        if let Proc::Be(b) = &mut self.procs[pid] {
            b.hung_until = b.hung_until.max(until);
            self.report.hangs += 1;
        }
    }

    /// A short stop of a live process (the scheduler too), then the next stall.
    fn stall(&mut self) {
        let mut pids: Vec<Pid> = (0..self.procs.len())
            .filter(|&p| !matches!(self.procs[p], Proc::Dead))
            .collect();
        pids.sort_unstable();
        if !pids.is_empty() {
            let pid = pids[self.rng.gen_range(0..pids.len())];
            let len = Dur(self.rng.gen_range(500_000..8_000_000));
            self.paused[pid] = self.paused[pid].max(self.now + len);
            self.report.stalls += 1;
        }
        self.next_stall();
    }

    /// Stalls come as a Poisson process while clients send.
    fn next_stall(&mut self) {
        let mean = self.opts.stall_every.0 as f64;
        if mean <= 0.0 {
            return;
        }
        let gap = -mean * (1.0 - self.rng.gen::<f64>()).ln();
        let t = self.now + Dur(gap as i64);
        if t.0 < self.opts.duration.0 {
            self.at(t, Ev::Stall);
        }
    }

    fn partition(&mut self) {
        let Some(pid) = self.live_node() else {
            return;
        };
        self.report.partitions += 1;
        let sched = match &self.procs[pid] {
            Proc::Fe(f) => f.member.conn(),
            Proc::Be(b) => b.proto.sched_conn(),
            _ => return,
        };
        if let Some(c) = sched {
            self.break_link(c, "network partition");
        }
    }

    /// A process dies: its connections break; its clients' requests end (their
    /// connections close); a supervisor restarts it.
    fn kill(&mut self, pid: Pid, why: &str) {
        let conns: Vec<ConnId> = self
            .links
            .iter()
            .filter(|(_, l)| l.open && l.ends.contains(&pid))
            .map(|(&c, _)| c)
            .collect();
        let mut conns = conns;
        conns.sort_unstable();
        for c in conns {
            self.break_link(c, why);
        }
        if let Proc::Fe(f) = &mut self.procs[pid] {
            let now = f.clock.local(self.now);
            let mut gone: Vec<u64> = f
                .ledger
                .fail_all(now, Ended::NoScheduler, why)
                .into_iter()
                .map(|d| d.client)
                .collect();
            gone.extend(f.orphans.drain(..).map(|(o, _, _)| o.client));
            for client in gone {
                self.client_end(client, Ended::Failed);
            }
        }
        self.procs[pid] = Proc::Dead;
    }

    // ------------------------------------------------------------ clients

    fn arrival(&mut self) {
        if self.now.0 >= self.opts.duration.0 {
            return;
        }
        let gap = -(1.0 - self.rng.gen::<f64>()).ln() / self.opts.rate_rps;
        self.at(self.now + Dur::from_secs_f64(gap), Ev::Arrival);
        self.report.requests += 1;
        let client = self.next_client;
        self.next_client += 1;
        self.clients.insert(client, Client { ended: false });
        let slot = self.rr % self.fe_slots.len();
        self.rr += 1;
        let pid = self.fe_slots[slot];
        let mi = self.rng.gen_range(0..self.models.len());
        let Proc::Fe(_) = &self.procs[pid] else {
            // Connection refused: the client sees a failure at once.
            return self.client_end(client, Ended::Failed);
        };
        // Clients reach the frontend after the network delay.
        let t = self.now + self.opts.delay;
        self.at(
            t,
            Ev::Request {
                pid,
                client,
                model: mi,
            },
        );
    }

    fn client_end(&mut self, client: u64, ended: Ended) {
        let Some(c) = self.clients.get_mut(&client) else {
            return self.violate(format!("an end for unknown client request {client}"));
        };
        if c.ended {
            return self.violate(format!("client request {client} ended twice"));
        }
        c.ended = true;
        match ended {
            Ended::Good => self.report.good += 1,
            Ended::Late => self.report.late += 1,
            Ended::Dropped(_) => self.report.dropped += 1,
            _ => self.report.failed += 1,
        }
    }

    fn infer(&mut self, pid: Pid, client: u64, mi: usize) {
        let now = self.now;
        let Proc::Fe(f) = &mut self.procs[pid] else {
            return;
        };
        let sched_now = f.sched_now(now);
        let refused = if f.away {
            None
        } else if !f.member.is_ready() || f.node.is_none() {
            Some(Ended::NoScheduler)
        } else if f.gpus == 0 {
            Some(Ended::Dropped(crate::wire::DropReason::NoGpu))
        } else {
            None
        };
        if let Some(e) = refused {
            return self.client_end(client, e);
        }
        let m = &f.models[mi];
        let slo = match check::slo(Dur::ZERO, m.slo) {
            Ok(s) => s,
            Err(_) => return self.client_end(client, Ended::BadRequest),
        };
        let input = InputRef {
            offset: (client % (1 << 20)) * 64,
            len: 64,
        };
        // Each task's capability (a fixed function of the client: reproducible).
        let cap = client.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        if f.away {
            // No scheduler to submit it to: held for the next one.
            let local = f.clock.local(now);
            let o = f.ledger.hold(sched_now, mi, slo, client, input, cap);
            f.orphans.push((o, local, local + slo));
            return;
        }
        let task = f.ledger.admit(sched_now, mi, m.id, slo, client, input, cap);
        if let Some(sched) = f.member.conn() {
            self.send(pid, sched, Msg::Submit { tasks: vec![task] });
        }
    }

    // ------------------------------------------------------------ delivery

    fn deliver(&mut self, conn: ConnId, to: Pid, msg: Msg) {
        if !self.links.get(&conn).is_some_and(|l| l.open) {
            return;
        }
        match &self.procs[to] {
            Proc::Sched(s) if s.fencer.as_ref().is_some_and(|f| f.is_conn(conn)) => {
                self.fencer_msg(to, conn, msg)
            }
            Proc::Sched(_) => self.sched_msg(to, conn, msg),
            Proc::Standby(_) => {
                if let Proc::Standby(sb) = &mut self.procs[to] {
                    sb.proto.handle_msg(self.now, conn, msg);
                }
                self.standby_apply(to);
            }
            Proc::Fe(_) | Proc::Be(_) => {
                let kind = msg.kind();
                let term = self.term_before(to, conn, &msg);
                if matches!(self.procs[to], Proc::Fe(_)) {
                    self.fe_msg(to, conn, msg);
                } else {
                    self.be_msg(to, conn, msg);
                }
                if let Some(t) = term {
                    self.check_term(to, conn, t, kind);
                }
            }
            Proc::Dead => {}
        }
    }

    fn closed(&mut self, conn: ConnId, to: Pid, why: String) {
        match &mut self.procs[to] {
            Proc::Sched(s) => {
                if let Some(f) = s.fencer.as_mut().filter(|f| f.is_conn(conn)) {
                    f.handle_closed(self.now, conn);
                    return self.fencer_apply(to);
                }
                s.proto.handle_closed(self.now, conn, why);
                self.sched_apply(to);
            }
            Proc::Standby(sb) => {
                if !sb.proto.is_primary_conn(conn) {
                    // A node's connection: the waiting scheduler knows it.
                    sb.sched.proto.handle_closed(self.now, conn, why.clone());
                }
                sb.proto.handle_closed(self.now, conn, &why);
                self.standby_apply(to);
            }
            Proc::Fe(f) => {
                let local = f.clock.local(self.now);
                if f.member.handle_closed(local, conn, &why) {
                    self.fe_apply(to);
                }
            }
            Proc::Be(b) => {
                // A backend that loses its scheduler rejoins (see be_action).
                let local = b.clock.local(self.now);
                b.proto.handle_closed(local, conn, &why);
                self.be_apply(to);
            }
            Proc::Dead => {}
        }
    }

    /// Carries out what a frontend's membership asked for.
    fn fe_apply(&mut self, pid: Pid) {
        loop {
            let now = self.now;
            let Proc::Fe(f) = &mut self.procs[pid] else {
                return;
            };
            let Some(a) = f.member.poll_action() else {
                return;
            };
            match a {
                member::Action::Connect(addr) => {
                    let c = self.connect(pid, self.pid_at(&addr));
                    if let Proc::Fe(f) = &mut self.procs[pid] {
                        f.member.handle_connected(f.clock.local(now), c);
                    }
                }
                member::Action::Send(c, m) => self.send(pid, c, m),
                member::Action::Close(c, why) => self.break_link(c, &why),
                member::Action::SetClock { .. } => {}
                member::Action::Joined {
                    node, models, away, ..
                } => {
                    f.node = Some(node);
                    f.ledger.set_node(node);
                    f.models = models;
                    if let Some(d) = away {
                        self.report.rejoins += 1;
                        self.report.rejoin_ms.push(d.as_ms_f64());
                    }
                }
                member::Action::Lost(_) => {
                    // Held for the next scheduler, on the node's own clock.
                    f.gpus = 0;
                    // Away only once joined: before, it has no models to hold for.
                    f.away = f.node.is_some();
                    let off = f.member.offset();
                    for o in f.ledger.orphan_all() {
                        let (a, d) = (o.arrival - off, o.deadline - off);
                        f.orphans.push((o, a, d));
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------ scheduler

    fn sched_msg(&mut self, sp: Pid, conn: ConnId, msg: Msg) {
        if let Msg::PlanDone {
            status: PlanStatus::TooLate,
            ..
        } = msg
        {
            self.report.plans_too_late += 1;
        }
        let now = self.now;
        let Proc::Sched(s) = &mut self.procs[sp] else {
            return;
        };
        s.proto.handle_msg(now, conn, msg);
        self.sched_apply(sp);
    }

    /// Carries out the protocol machine's actions and the core's outputs.
    fn sched_apply(&mut self, sp: Pid) {
        loop {
            let Proc::Sched(s) = &mut self.procs[sp] else {
                return;
            };
            let acts = sched_take_actions(s, &mut self.report, self.now);
            if !self.sched_add_gpus(sp, acts.up) || !self.sched_check_state(sp) {
                return;
            }
            let Proc::Sched(s) = &mut self.procs[sp] else {
                return;
            };
            let plans = sched_core_plans(s);
            let mut more = !plans.is_empty();
            for p in plans {
                more |= self.dispatch(sp, p);
            }
            for (c, m) in acts.sends {
                self.send(sp, c, m);
            }
            for c in acts.closes {
                self.break_link(c, "closed by the scheduler");
            }
            if let Some(term) = acts.step_down {
                return self.sched_step_down(sp, term);
            }
            if !self.sched_rearm(sp) || !more {
                return;
            }
        }
    }

    /// Adds the GPUs that went into service to the core under the protocol's
    /// ids, checking that none of them is in service there; false on a
    /// violation.
    fn sched_add_gpus(&mut self, sp: Pid, up: Vec<(GpuId, u32)>) -> bool {
        let now = self.now;
        let Proc::Sched(s) = &mut self.procs[sp] else {
            return false;
        };
        for (g, sub) in up {
            // Every sub-cluster's dispatcher takes the id; only its own plans on it.
            for (j, core) in s.cores.iter_mut().enumerate() {
                if !core.add_gpu_at(now, g, j == sub as usize) {
                    let what = format!("GPU {g:?} given while core {j} has it in service");
                    self.violate(what);
                    return false;
                }
            }
            s.gpu_sub.insert(g.0, sub);
        }
        true
    }

    /// The scheduler's per-member state is that of the members present: its
    /// GPU slots never above the most GPUs owned at once (ids of departed
    /// backends are given again); false on a violation.
    fn sched_check_state(&mut self, sp: Pid) -> bool {
        let Proc::Sched(s) = &mut self.procs[sp] else {
            return false;
        };
        let st = s.proto.state_sizes();
        // (owned_max counts every GpusUp as it came: several may come and
        // go between two checks.)
        s.owned_max = s.owned_max.max(st.gpus_owned);
        let owned_max = s.owned_max;
        self.report.gpu_slots_max = self.report.gpu_slots_max.max(st.gpu_slots);
        self.report.gpus_owned_max = self.report.gpus_owned_max.max(owned_max);
        self.report.sched_state = st;
        if st.gpu_slots > owned_max {
            let what = format!(
                "the scheduler holds {} GPU slots, more than the {owned_max} GPUs ever owned at once ({st:?})",
                st.gpu_slots
            );
            self.violate(what);
            return false;
        }
        true
    }

    /// Sets the scheduler's wake-up for its earliest timeout; false when the
    /// scheduler is gone.
    fn sched_rearm(&mut self, sp: Pid) -> bool {
        let now = self.now;
        let Proc::Sched(s) = &mut self.procs[sp] else {
            return false;
        };
        let t = s.proto.poll_timeout();
        let t = s
            .cores
            .iter()
            .filter_map(|c| c.next_timeout())
            .fold(t, Time::min)
            .min(s.fencer.as_ref().map_or(Time::NEVER, |f| f.poll_timeout()))
            .max(now);
        // One wake-up pending at a time (the earliest needed).
        if s.wake.is_none_or(|w| t < w) {
            s.wake = Some(t);
            self.at(t, Ev::Wake { pid: sp });
        }
        true
    }

    /// Sends a plan the core made (as the real scheduler's dispatch path does);
    /// true when the protocol machine has new actions.
    fn dispatch(&mut self, sp: Pid, p: crate::core::Plan) -> bool {
        let now = self.now;
        let Proc::Sched(s) = &mut self.procs[sp] else {
            return false;
        };
        // Invariant: the GPU is not planned to run two batches at once.
        if let Some(&(prev, free)) = s.gpu_free.get(&p.gpu.0) {
            if p.exec_at < free {
                let what = format!(
                    "plan {} starts on GPU {} at {} before plan {prev} frees it at {}",
                    p.id.0, p.gpu.0, p.exec_at, free
                );
                self.violate(what);
                return false;
            }
        }
        s.gpu_free.insert(p.gpu.0, (p.id.0, p.finish_at));
        let tasks = plan_tasks(&p, |fe| s.fe_nodes.contains(&fe));
        let Some(&conn) = s.gpu_conn.get(&p.gpu.0) else {
            s.proto.notify(
                tasks.iter().map(|t| t.id),
                crate::wire::DropReason::BackendLost,
            );
            return true;
        };
        if tasks.is_empty() {
            if let Some(f) = s.gpu_free.get_mut(&p.gpu.0) {
                f.1 = now;
            }
            sched_report(s, now, p.gpu, p.id, now);
            return true;
        }
        let backend = s.proto.gpu_owner(p.gpu).unwrap_or(0);
        s.proto.plans().lock().expect("plans").sent(
            &p,
            backend,
            tasks.iter().map(|t| (t.id, t.deadline)),
        );
        self.report.plans += 1;
        let msg = plan_msg(&p, tasks, now);
        self.send(sp, conn, msg);
        false
    }

    // ------------------------------------------------------------ timers

    fn wake(&mut self, pid: Pid) {
        let now = self.now;
        match &mut self.procs[pid] {
            Proc::Standby(sb) => {
                if sb.wake.is_some_and(|w| w <= now) {
                    sb.wake = None;
                }
                if now >= sb.proto.poll_timeout() {
                    sb.proto.handle_timeout(now);
                }
                self.standby_apply(pid);
            }
            Proc::Sched(s) => {
                if s.wake.is_some_and(|w| w <= now) {
                    s.wake = None;
                }
                if now >= s.proto.poll_timeout() {
                    s.proto.handle_timeout(now);
                }
                for c in &mut s.cores {
                    c.handle_timeout(now);
                }
                if let Some(f) = s.fencer.as_mut().filter(|f| now >= f.poll_timeout()) {
                    f.handle_timeout(now);
                    self.fencer_apply(pid);
                }
                self.sched_apply(pid);
            }
            Proc::Fe(f) => {
                let local = f.clock.local(now);
                let mut done = f.ledger.handle_timeout(f.sched_now(now));
                // Held requests whose deadline passed with no scheduler.
                let (late, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut f.orphans)
                    .into_iter()
                    .partition(|(_, _, d)| *d <= local);
                f.orphans = keep;
                for (o, a, _) in late {
                    let why = "no scheduler until its deadline";
                    done.push(f.ledger.end_orphan(o, Ended::NoScheduler, why, local - a));
                }
                if local >= f.member.poll_timeout() {
                    f.member.handle_timeout(local);
                }
                for d in done {
                    self.client_end(d.client, d.ended);
                }
                self.fe_apply(pid);
                self.at(now + Dur::from_ms(20), Ev::Wake { pid });
            }
            Proc::Be(b) => {
                if b.wake.is_some_and(|w| w <= now) {
                    b.wake = None;
                }
                let local = b.clock.local(now);
                if local >= b.proto.poll_timeout() {
                    b.proto.handle_timeout(local);
                }
                self.be_apply(pid);
            }
            Proc::Dead => {}
        }
    }

    // ------------------------------------------------------------ frontend

    fn fe_msg(&mut self, pid: Pid, conn: ConnId, msg: Msg) {
        let now = self.now;
        let Proc::Fe(f) = &mut self.procs[pid] else {
            return;
        };
        let sched_now = f.sched_now(now);
        let mut ended = Vec::new();
        let msg = if f.member.conn() == Some(conn) {
            let m = f.member.handle_msg(f.clock.local(now), msg);
            self.fe_apply(pid);
            let Some(m) = m else {
                return;
            };
            m
        } else {
            msg
        };
        let Proc::Fe(f) = &mut self.procs[pid] else {
            return;
        };
        let from_sched = f.member.conn() == Some(conn);
        let from_rogue = self
            .rogue
            .is_some_and(|r| self.links.get(&conn).is_some_and(|l| l.ends.contains(&r)));
        let mut forged_ended = None;
        let mut resubmit = None;
        match msg {
            Msg::Capacity { gpus } if from_sched => {
                f.gpus = gpus;
                let back = gpus > 0 && f.member.is_ready();
                if back {
                    f.away = false;
                }
                if back && !f.orphans.is_empty() {
                    // Held requests go to the new scheduler under new ids.
                    let local = f.clock.local(now);
                    let off = f.member.offset();
                    let mut tasks = Vec::new();
                    for (o, a, d) in std::mem::take(&mut f.orphans) {
                        if d <= local {
                            ended.push(f.ledger.end_orphan(
                                o,
                                Ended::NoScheduler,
                                "no scheduler until its deadline",
                                local - a,
                            ));
                            continue;
                        }
                        let model_id = f.models[o.model].id;
                        tasks.push(f.ledger.readmit(o, model_id, a + off, d + off));
                    }
                    if let (Some(c), false) = (f.member.conn(), tasks.is_empty()) {
                        resubmit = Some((c, tasks));
                    }
                }
            }
            Msg::Dropped { items } if from_sched => {
                for (id, code) in items {
                    ended.extend(f.ledger.finish(sched_now, id, Answer::of_drop(code)));
                }
            }
            Msg::Results { items } if from_rogue => {
                // A forged result must end nothing.
                for r in items {
                    let id = r.id;
                    let before = f.ledger.counts().forged_results;
                    if let Some(d) = f.ledger.result(sched_now, r) {
                        forged_ended = Some(id);
                        ended.push(d);
                    }
                    self.report.forged_refused += f.ledger.counts().forged_results - before;
                }
            }
            Msg::Results { items } if !from_sched => {
                let before = f.ledger.counts().forged_results;
                for r in items {
                    ended.extend(f.ledger.result(sched_now, r));
                }
                // Every result comes from the backend its task was planned on,
                // with the capability the scheduler handed on.
                if f.ledger.counts().forged_results > before {
                    self.violate(format!(
                        "frontend {pid} refused a result: its capability was not its task's"
                    ));
                }
            }
            _ => {}
        }
        if let Some((c, tasks)) = resubmit {
            self.report.retried += tasks.len() as u64;
            self.send(pid, c, Msg::Submit { tasks });
        }
        if let Some(id) = forged_ended {
            self.violate(format!(
                "frontend {pid} ended request {} with a forged result",
                id.0
            ));
        }
        for d in ended {
            self.client_end(d.client, d.ended);
        }
    }

    // ------------------------------------------------------------ backend

    fn be_msg(&mut self, pid: Pid, conn: ConnId, msg: Msg) {
        if let Msg::LoadModel { model } = &msg {
            // Invariant: a backend is only sent the models it is assigned (every
            // model of the workload, by id and name).
            let assigned = self
                .models
                .get(model.id.idx())
                .is_some_and(|m| m.name == model.name);
            if !assigned {
                let what = format!(
                    "backend got model {} `{}`, not assigned",
                    model.id, model.name
                );
                return self.violate(what);
            }
        }
        let now = self.now;
        let Proc::Be(b) = &mut self.procs[pid] else {
            return;
        };
        b.proto.handle_msg(b.clock.local(now), conn, msg);
        // Invariant: no plan reaches a backend that has not loaded its model
        // (models move between sub-clusters; the backend would refuse it and
        // fail its tasks).
        if b.proto.counts().refused_not_loaded > 0 {
            return self.violate(format!(
                "backend {pid} was sent a plan for a model it has not loaded"
            ));
        }
        self.be_apply(pid);
    }

    /// Carries out what a backend's protocol asked for, then sets its wake-up.
    fn be_apply(&mut self, pid: Pid) {
        loop {
            let Proc::Be(b) = &mut self.procs[pid] else {
                return;
            };
            let Some(a) = b.proto.poll_action() else {
                break;
            };
            if !self.be_action(pid, a) {
                return;
            }
        }
        if self.maybe_leave(pid) {
            return;
        }
        self.be_rearm(pid);
    }

    /// Carries out one action of a backend's protocol; false when the backend
    /// exited.
    fn be_action(&mut self, pid: Pid, a: be_proto::Action) -> bool {
        let skip_last = self.opts.planted == Some(Planted::SkipLoad);
        let nmodels = self.models.len() as u32;
        let Proc::Be(b) = &mut self.procs[pid] else {
            return false;
        };
        match a {
            be_proto::Action::Send(c, m) => self.send(pid, c, m),
            be_proto::Action::Close(c, why) => self.break_link(c, &why),
            be_proto::Action::SetClock { .. } => {}
            be_proto::Action::Ready { away, .. } => {
                if let Some(d) = away {
                    self.report.rejoins += 1;
                    self.report.rejoin_ms.push(d.as_ms_f64());
                }
            }
            be_proto::Action::Connect(addr) => {
                let c = self.connect(pid, self.pid_at(&addr));
                if let Proc::Be(b) = &mut self.procs[pid] {
                    let local = b.clock.local(self.now);
                    b.proto.handle_sched_connected(local, c);
                }
            }
            be_proto::Action::Load(model, _) => {
                // The planted bug: the GPUs skip the last model but confirm it.
                be_load(b, model.id, skip_last && model.id.0 + 1 == nmodels);
            }
            be_proto::Action::Confirm(model) => {
                // As a worker does: at once when free, else after its batch.
                for g in 0..b.run.len() {
                    if b.run[g].busy {
                        b.run[g].confirms.push(model);
                    } else {
                        b.proto.handle_loaded(model, Ok(None));
                    }
                }
            }
            be_proto::Action::Unload(model) => {
                b.loaded.remove(&model);
            }
            be_proto::Action::Attach {
                node, ctrl_addr, ..
            } => self.be_attach(pid, node, &ctrl_addr),
            // A dial here is done at once: the simulated link comes up, or
            // breaks if the frontend is gone, as an attach's does.
            be_proto::Action::Redial { node, ctrl_addr } => self.be_attach(pid, node, &ctrl_addr),
            be_proto::Action::Detach { node, conn } => {
                b.fe_pids.remove(&node);
                if let Some(c) = conn {
                    self.break_link(c, "frontend down");
                }
            }
            be_proto::Action::Queue { gpu, plan } => {
                // The GPU's puller starts on the plan once it is done with
                // those before it. As a backend's puller, it skips the
                // inputs of tasks already lost and stops at the batch's
                // latest start: what it has not read by then is unread.
                let Proc::Be(b) = &self.procs[pid] else {
                    return false;
                };
                let from = b.run[gpu].pull_free.max(self.now);
                let from_sched = b.clock.local(from) + b.proto.offset();
                let prof = &self.w.models[plan.model.idx()].spec.profile;
                let mut unread = be_proto::hopeless(&plan, Some(prof), from_sched);
                let limit = be_proto::pull_budget(&plan, Some(prof), from_sched, &unread);
                let input = self
                    .models
                    .get(plan.model.idx())
                    .map_or(0, |m| m.input_bytes as u64);
                let n = unread.iter().filter(|&&u| !u).count() as u64;
                let full = sim_pull(&self.opts.pull, &mut self.pull_rng, n as u32, n * input);
                let took = full.min(limit);
                if took < full {
                    // Reads end in task order, evenly over the pull.
                    let read = (n as f64 * took.0 as f64 / full.0.max(1) as f64) as u64;
                    let mut seen = 0;
                    for u in unread.iter_mut().filter(|u| !**u) {
                        seen += 1;
                        *u = seen > read;
                    }
                }
                let bytes = unread.iter().filter(|&&u| !u).count() as u64 * input;
                let budget = self.report.net.data(plan.tasks.len() as u32);
                let Proc::Be(b) = &mut self.procs[pid] else {
                    return false;
                };
                let run = &mut b.run[gpu];
                let done = from + took;
                run.pull_free = done;
                run.pulled.insert(
                    plan.id,
                    Pulled {
                        done,
                        took,
                        bytes,
                        budget,
                        unread,
                    },
                );
                run.queue.push(plan.exec_at, plan);
                self.be_next(pid, gpu as u32);
            }
            be_proto::Action::Drained => {
                b.drained = true;
            }
            be_proto::Action::Lost(_) => {
                // The plans queued for the lost scheduler are void (a running
                // batch finishes; its report goes nowhere).
                for run in &mut b.run {
                    while run.queue.pop_due(Time::NEVER).is_some() {}
                }
                // A draining backend with no scheduler has nothing to wait for
                // (as `BackendNode::drain`): it leaves once idle.
                if b.draining {
                    b.drained = true;
                }
            }
        }
        true
    }

    /// Connects a backend to the frontend whose control address it was given
    /// (`fe<pid>`) and reports the connection to its protocol.
    fn be_attach(&mut self, pid: Pid, node: NodeId, ctrl_addr: &str) {
        let fe_pid: Pid = ctrl_addr
            .trim_start_matches("fe")
            .parse()
            .unwrap_or(usize::MAX);
        if fe_pid < self.procs.len() {
            let c = self.connect(pid, fe_pid);
            if let Proc::Be(b) = &mut self.procs[pid] {
                b.fe_pids.insert(node, fe_pid);
                b.proto.handle_connected(node, c);
            }
        }
    }

    /// Sets a backend's wake-up for its protocol's next deadline.
    fn be_rearm(&mut self, pid: Pid) {
        let now = self.now;
        let Proc::Be(b) = &mut self.procs[pid] else {
            return;
        };
        let due = b.proto.poll_timeout();
        if due >= Time::NEVER {
            return;
        }
        // A microsecond after the local deadline, so the rounding of the clock
        // model never wakes it just before.
        let t = (b.clock.true_of(due) + Dur::from_us(1)).max(now);
        if b.wake.is_none_or(|w| t < w) {
            b.wake = Some(t);
            self.at(t, Ev::Wake { pid });
        }
    }

    /// Starts the next plan on a free GPU at its planned time.
    fn be_next(&mut self, pid: Pid, gpu: u32) {
        let now = self.now;
        let Some((plan, sched_now)) = self.be_take_due(pid, gpu) else {
            return;
        };
        // The batch starts when due and its inputs are in.
        let pulled = match &mut self.procs[pid] {
            Proc::Be(b) => b.run[gpu as usize].pulled.remove(&plan.id),
            _ => return,
        };
        let (pull, unread) = match pulled {
            Some(p) => {
                if let Proc::Be(b) = &mut self.procs[pid] {
                    // As a backend's puller, a pull that read nothing (every
                    // task already lost) is no sample.
                    if p.unread.iter().any(|&u| !u) {
                        b.pull_est.observe(p.bytes, p.took);
                    }
                    if let Some(fit) = b.pull_est.fit() {
                        b.proto.set_pull(fit, b.pull_est.hold().unwrap_or_default());
                    }
                }
                self.report.pulls.push(PullRecord {
                    at: now,
                    bs: plan.tasks.len() as u32,
                    took: p.took,
                    budget: p.budget,
                });
                ((p.done - now).max(Dur::ZERO), p.unread)
            }
            None => (Dur::ZERO, Vec::new()),
        };
        let is_unread = |i: usize| unread.get(i).copied().unwrap_or(false);
        let Proc::Be(b) = &self.procs[pid] else {
            return;
        };
        let present: Vec<bool> = inputs_present(b, &self.procs, &plan)
            .into_iter()
            .enumerate()
            .map(|(i, p)| p && !is_unread(i))
            .collect();
        let hung = b.hung_until;
        let prof = &self.w.models[plan.model.idx()].spec.profile;
        let start = sched_now + pull;
        let planned = be_proto::planned_profile(prof, plan.tasks.len(), plan.span);
        let mut cut = cut_batch(&plan.tasks, &present, start, Some(&planned));
        cut.split_unread(is_unread);
        let span = self.batch_span(plan.model, cut.run.len());
        let outputs = vec![Some(vec![1u8]); cut.run.len()];
        let settled = settle(&plan, &cut, start, start + span, Ok(outputs));
        if self.be_hold_results(pid, gpu, settled) {
            self.at((now + pull + span).max(hung), Ev::BatchDone { pid, gpu });
        }
    }

    /// Takes a free GPU's next plan if it is due (else sets the event for its
    /// start), with the time on the scheduler's clock; checks its model is
    /// loaded.
    fn be_take_due(&mut self, pid: Pid, gpu: u32) -> Option<(PlanMsg, Time)> {
        let now = self.now;
        let Proc::Be(b) = &mut self.procs[pid] else {
            return None;
        };
        let offset = b.proto.offset();
        let run = &mut b.run[gpu as usize];
        if run.busy {
            return None;
        }
        let at = run.queue.next_at()?;
        // The planned start on this node's clock, in true time.
        let start_true = b.clock.true_of(at - offset);
        if start_true > now {
            self.at(start_true, Ev::Start { pid, gpu });
            return None;
        }
        let sched_now = b.clock.local(now) + offset;
        let plan = run.queue.pop_due(Time::NEVER).expect("peeked");
        run.busy = true;
        // Invariant: no plan runs a model its backend has not loaded.
        if !b.loaded.contains(&plan.model) {
            let what = format!(
                "plan {} runs model {} on a backend that has not loaded it",
                plan.id, plan.model
            );
            self.violate(what);
            return None;
        }
        Some((plan, sched_now))
    }

    /// How long the modelled GPU runs a batch of `n`: the profile's l(n) with
    /// a little noise (one draw from the run's generator).
    fn batch_span(&mut self, model: ModelId, n: usize) -> Dur {
        let prof = &self.w.models[model.idx()].spec.profile;
        let n = n as u32;
        let l = if n > 0 {
            prof.latency(n.clamp(1, prof.max_batch()))
        } else {
            Dur::ZERO
        };
        let noise = 1.0 + self.rng.gen_range(-0.02..0.05);
        Dur((l.0 as f64 * noise) as i64)
    }

    /// Keeps a batch's results and report to send when it finishes; false when
    /// the backend is gone.
    fn be_hold_results(&mut self, pid: Pid, gpu: u32, settled: be_proto::Settled) -> bool {
        let Proc::Be(b) = &mut self.procs[pid] else {
            return false;
        };
        let pending: Vec<(ConnId, Msg)> = settled
            .results
            .into_iter()
            .filter_map(|(node, items)| {
                let c = b.proto.frontend(node)?;
                Some((c, Msg::Results { items }))
            })
            .collect();
        let sched = b.proto.sched_conn();
        // Results and the report go out when the batch finishes.
        self.pending_out
            .insert((pid, gpu), (pending, sched, settled.done));
        true
    }

    fn batch_done(&mut self, pid: Pid, gpu: u32) {
        let Some((results, sched, done)) = self.pending_out.remove(&(pid, gpu)) else {
            return;
        };
        for (c, m) in results {
            self.send(pid, c, m);
        }
        if let Some(sched) = sched {
            self.send(pid, sched, done);
        }
        if let Proc::Be(b) = &mut self.procs[pid] {
            let run = &mut b.run[gpu as usize];
            run.busy = false;
            let confirms = std::mem::take(&mut run.confirms);
            if !confirms.is_empty() {
                for m in confirms {
                    b.proto.handle_loaded(m, Ok(None));
                }
                self.be_apply(pid);
            }
        }
        if self.maybe_leave(pid) {
            return;
        }
        self.be_next(pid, gpu);
    }
}

/// The scheduler protocol's actions left for the simulator once a pass over
/// them is done.
struct SchedActions {
    /// GPUs that went into service, in order (the core must give the same
    /// ids), with their sub-clusters.
    up: Vec<(GpuId, u32)>,
    sends: Vec<(ConnId, Msg)>,
    closes: Vec<ConnId>,
    /// It stepped down for this newer term.
    step_down: Option<u64>,
}

/// Drains the scheduler protocol's actions: carries out those on the
/// scheduler's own state (and counts budget changes), returns the rest.
fn sched_take_actions(s: &mut Sched, report: &mut ClusterSimReport, now: Time) -> SchedActions {
    let mut acts = SchedActions {
        up: Vec::new(),
        sends: Vec::new(),
        closes: Vec::new(),
        step_down: None,
    };
    while let Some(a) = s.proto.poll_action() {
        match a {
            Action::Send(c, m) => acts.sends.push((c, m)),
            Action::Close(c, _) => acts.closes.push(c),
            Action::GpusUp {
                conn,
                gpus,
                subcluster,
                ..
            } => {
                for g in &gpus {
                    s.gpu_conn.insert(g.0, conn);
                }
                s.owned += gpus.len();
                s.owned_max = s.owned_max.max(s.owned);
                acts.up.extend(gpus.into_iter().map(|g| (g, subcluster)));
            }
            Action::Route { model, subcluster } => {
                if let Some(h) = s.home.get_mut(model.idx()) {
                    *h = subcluster;
                }
            }
            Action::GpusDown { gpus, .. } => {
                s.owned = s.owned.saturating_sub(gpus.len());
                for g in gpus {
                    s.gpu_conn.remove(&g.0);
                    for c in &mut s.cores {
                        c.remove_gpu(now, g);
                    }
                }
            }
            // Out of the core; the connection stays for the plans in flight.
            Action::GpusDraining { gpus, .. } => {
                for g in gpus {
                    for c in &mut s.cores {
                        c.remove_gpu(now, g);
                    }
                }
            }
            Action::FrontendUp { node, .. } => {
                s.fe_nodes.insert(node);
            }
            Action::FrontendDown { node } => {
                s.fe_nodes.remove(&node);
            }
            Action::Submit(tasks) => {
                for (m, t) in tasks {
                    let h = s.home.get(m.idx()).copied().unwrap_or(0) as usize;
                    s.cores[h].handle_request(now, m, t);
                }
            }
            Action::PlanDone {
                gpu,
                plan,
                finished,
                ..
            } => sched_plan_done(s, now, gpu, plan, finished),
            Action::SetNet(net) => {
                for c in &mut s.cores {
                    c.set_net(net);
                }
                count_budget_change(report, now, net);
            }
            Action::SetMargins(m) => {
                for c in &mut s.cores {
                    c.set_margins(&m);
                }
            }
            Action::SetLatencyScales(k) => {
                for c in &mut s.cores {
                    c.set_latency_scales(&k);
                }
            }
            Action::DeviceBytes { .. } => {}
            Action::StepDown { term, .. } => acts.step_down = Some(term),
        }
    }
    acts
}

/// A GPU reported a plan done: the GPU is free from `finished` (if that plan
/// is its latest), and the core hears of it.
fn sched_plan_done(s: &mut Sched, now: Time, gpu: GpuId, plan: PlanId, finished: Time) {
    if let Some(f) = s.gpu_free.get_mut(&gpu.0) {
        if f.0 == plan.0 {
            f.1 = finished;
        }
    }
    sched_report(s, now, gpu, plan, finished);
}

/// The GPU's sub-cluster's dispatcher hears that it is free.
fn sched_report(s: &mut Sched, now: Time, gpu: GpuId, plan: PlanId, free: Time) {
    let j = s.gpu_sub.get(&gpu.0).copied().unwrap_or(0) as usize;
    if let Some(c) = s.cores.get_mut(j) {
        c.handle_gpu_report(now, gpu, plan, free);
    }
}

/// Counts a change of the network budget and tracks d_ctrl's largest value
/// after the first simulated second.
fn count_budget_change(r: &mut ClusterSimReport, now: Time, net: NetBudget) {
    r.budget_changes += 1;
    if now >= Time(Dur::from_ms(1000).0) {
        // The budget in force until now counts too.
        r.d_ctrl_us_max = r.d_ctrl_us_max.max(r.d_ctrl_us);
    }
    r.d_ctrl_us = net.ctrl.as_us_f64();
    r.net = net;
}

/// Takes the core's outputs: tells the protocol of the drops and returns the
/// plans to dispatch.
fn sched_core_plans(s: &mut Sched) -> Vec<crate::core::Plan> {
    let mut plans = Vec::new();
    let mut drops = Vec::new();
    for c in &mut s.cores {
        while let Some(o) = c.poll_output() {
            match o {
                crate::core::Output::Dispatch(p) => plans.push(p),
                crate::core::Output::Drop { task, reason, .. } => drops.push((task.id, reason)),
                crate::core::Output::Preempt { .. } => {}
            }
        }
    }
    for (id, code) in drops {
        s.proto.notify([id], code);
    }
    plans
}

/// Marks a backend's (modelled) GPUs loaded with a model, unless `skip`, and
/// confirms the load on each GPU.
fn be_load(b: &mut Be, model: ModelId, skip: bool) {
    // The modelled GPUs load at once.
    if !skip {
        b.loaded.insert(model);
    }
    for _ in 0..b.run.len() {
        b.proto.handle_loaded(model, Ok(None));
    }
}

/// Which of a plan's inputs a backend can pull: its frontend is connected and
/// still holds the request.
fn inputs_present(b: &Be, procs: &[Proc], plan: &PlanMsg) -> Vec<bool> {
    plan.tasks
        .iter()
        .map(|t| {
            let fe = task_owner(t.id);
            let connected = b.proto.frontend(fe).is_some();
            b.fe_pids
                .get(&fe)
                .copied()
                .filter(|_| connected)
                .is_some_and(|p| match &procs[p] {
                    Proc::Fe(f) => f.ledger.contains(t.id),
                    _ => false,
                })
        })
        .collect()
}
