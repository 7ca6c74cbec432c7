//! The simulator serving applications: requests arrive per application (Poisson
//! at a rate); each drives a [`crate::app::AppRun`]; each step's tasks go to the
//! module's sub-clusters, each a set of machines of one GPU type running up to
//! `lanes` batches at once. A sub-cluster is its own scheduling core (the
//! production [`Dispatcher`], the [`NexusCore`] or throughput-cost dispatch)
//! seeing one GPU per lane, each with the profile d(b, e) of its type and lane
//! count. Fan-out counts are drawn per edge (constant, Poisson or a trace).
//!
//! [`simulate_app_adaptive`] runs in epochs: a [`DriftDetector`] sees every
//! fan-out count and every batch's run time against its module's profile
//! and, when it asks for a re-plan at an epoch's end, the run moves onto the
//! new plan's sub-clusters live (resizing the production dispatchers,
//! starting new ones, draining the ones left out). A module's batches can be
//! made slower than its profile from a point in time on
//! ([`AppSimOptions::slowdown`]): the dispatchers keep planning with the
//! profile they were given until a re-plan gives them one scaled by the
//! measured ratio.
//!
//! With `check`, the run verifies that every application request ends exactly
//! once, that every batch runs on a lane of a sub-cluster planned for its module,
//! and that no lane runs two batches at once.

use super::tc::{TcDispatch, TcLane};
use crate::app::{AppRun, Budgets, DeadlineRule, DriftDetector, Graph, Outcome, Replan, TaskKey};
use crate::core::nexus::NexusCore;
use crate::core::{
    Dispatcher, DispatcherConfig, Dur, Gather, GpuId, LatencyProfile, ModelId, ModelSpec,
    NetBudget, Output, PlanId, Policy, Scheduler, Task, TaskId, Time,
};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp1, Poisson};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

/// Items one output of a fan-out edge carries.
#[derive(Debug, Clone, PartialEq)]
pub enum FanoutDist {
    Const(u32),
    Poisson(f64),
    /// Counts in turn, cycling.
    Trace(Vec<u32>),
}

/// Machines of one GPU type serving one module.
#[derive(Debug, Clone)]
pub struct SubCluster {
    /// The step (module) it serves.
    pub module: usize,
    /// Index into [`AppSim::gpu_types`].
    pub gpu_type: usize,
    pub machines: u32,
    /// Batches one machine runs at once.
    pub lanes: u32,
    /// d(b, e): a batch's latency on one lane with `lanes` lanes busy.
    pub profile: LatencyProfile,
    /// Share of the module's tasks it gets (weighted round robin).
    pub weight: f64,
    /// Throughput-cost dispatch: the batch size and the rank of its machines.
    pub tc_batch: u32,
    pub tc_ratio: f64,
}

/// How sub-clusters schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Runtime {
    /// The production dispatcher with this policy (not `Nexus`).
    Core(Policy),
    /// Nexus's runtime ([`NexusCore`]), planned for the module's rate.
    Nexus,
    /// Throughput-cost dispatch of whole batches ([`TcDispatch`]).
    ThroughputCost,
}

impl Runtime {
    pub fn name(&self) -> String {
        match self {
            Runtime::Core(p) => p.name(),
            Runtime::Nexus => "nexus".into(),
            Runtime::ThroughputCost => "tc".into(),
        }
    }
}

/// One application served on its sub-clusters.
#[derive(Debug, Clone)]
pub struct AppSim {
    pub graph: Arc<Graph>,
    pub budgets: Budgets,
    pub rule: DeadlineRule,
    pub rate_rps: f64,
    /// Per edge; `None` for whole edges.
    pub fanout: Vec<Option<FanoutDist>>,
    pub gpu_types: Vec<String>,
    pub subclusters: Vec<SubCluster>,
    /// Expected task rate of each module (Nexus plans its duty cycles from it).
    pub module_rates: Vec<f64>,
}

#[derive(Debug, Clone)]
pub struct AppSimOptions {
    pub runtime: Runtime,
    pub seed: u64,
    pub warmup: Dur,
    pub duration: Dur,
    pub check: bool,
    /// From this time on, multiply the mean of one edge's fan-out by a factor:
    /// (time, edge, factor).
    pub fanout_jump: Option<(Time, usize, f64)>,
    /// From this time on, batches of one module that start then take a
    /// factor times what its profile gives: (time, module, factor).
    pub slowdown: Option<(Time, usize, f64)>,
}

/// Where one batch ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub module: usize,
    pub subcluster: usize,
    pub gpu_type: usize,
    pub machine: u32,
    pub lane: u32,
    pub start: Time,
    pub finish: Time,
}

#[derive(Debug, Clone, Default)]
pub struct AppSimResult {
    /// Application requests that arrived in the window, and how those ended.
    pub offered: u64,
    pub good: u64,
    pub late: u64,
    pub failed: u64,
    /// Latency of the window's requests that finished (good or late), seconds, sorted.
    pub latencies: Vec<f64>,
    /// Tasks per module handed to its sub-clusters (a task submitted again at
    /// its last deadline counts twice), and those the runtime dropped, less
    /// the drops followed by a last deadline of tasks that reached the module
    /// too late to run alone by their first (after their deadline less the
    /// module's least latency, [`Budgets::least`]): those were late upstream.
    pub tasks: Vec<u64>,
    pub expired: Vec<u64>,
    /// Every request that arrived, in and out of the window.
    pub requests: u64,
    pub ended: u64,
    pub placements: Vec<Placement>,
    /// Per epoch, in an adaptive run ([`simulate_app_adaptive`]); empty otherwise.
    pub epochs: Vec<EpochStat>,
    /// The sub-clusters at the end of the run (after every re-plan).
    pub subclusters: Vec<SubCluster>,
}

impl AppSimResult {
    pub fn good_fraction(&self) -> f64 {
        if self.offered == 0 {
            1.0
        } else {
            self.good as f64 / self.offered as f64
        }
    }
    /// The q-quantile of finished requests' latency (s).
    pub fn latency_quantile(&self, q: f64) -> Option<f64> {
        if self.latencies.is_empty() {
            return None;
        }
        let i = ((self.latencies.len() as f64 * q).ceil() as usize).clamp(1, self.latencies.len());
        Some(self.latencies[i - 1])
    }
}

/// Checks placements against the sub-clusters: each batch on a machine and lane
/// of a sub-cluster of its own module and of that sub-cluster's GPU type, and no
/// lane running two batches at once.
pub fn check_placements(sim: &AppSim, placements: &[Placement]) -> Result<(), String> {
    let mut by_lane: HashMap<(usize, u32, u32), Vec<(Time, Time)>> = HashMap::new();
    for p in placements {
        let sc = sim
            .subclusters
            .get(p.subcluster)
            .ok_or_else(|| format!("batch on unknown sub-cluster {}", p.subcluster))?;
        let step = &sim.graph.steps()[p.module].name;
        if sc.module != p.module {
            return Err(format!(
                "a batch of '{step}' ran on sub-cluster {} planned for '{}'",
                p.subcluster,
                sim.graph.steps()[sc.module].name
            ));
        }
        if sc.gpu_type != p.gpu_type {
            return Err(format!(
                "a batch of '{step}' ran on GPU type {} but was planned on {}",
                sim.gpu_types.get(p.gpu_type).map_or("?", |s| s.as_str()),
                sim.gpu_types[sc.gpu_type]
            ));
        }
        if p.machine >= sc.machines || p.lane >= sc.lanes {
            return Err(format!(
                "a batch of '{step}' ran on machine {} lane {}, outside sub-cluster {} ({} machines x {} lanes)",
                p.machine, p.lane, p.subcluster, sc.machines, sc.lanes
            ));
        }
        by_lane
            .entry((p.subcluster, p.machine, p.lane))
            .or_default()
            .push((p.start, p.finish));
    }
    for ((sc, m, l), mut v) in by_lane {
        v.sort();
        for w in v.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(format!(
                    "sub-cluster {sc} machine {m} lane {l} runs two batches at once ({:?}-{:?} and {:?}-{:?})",
                    w[0].0, w[0].1, w[1].0, w[1].1
                ));
            }
        }
    }
    Ok(())
}

/// Bits of a core task id that hold the task's key within its request.
const KEY_BITS: u32 = 24;

struct Flight {
    /// The core's GPU index (a lane).
    gpu: u32,
    tasks: Vec<Task>,
    /// The batch's module, its run time and what the module's profile (as
    /// first planned, ratio 1) gives for it.
    module: usize,
    ran: Dur,
    profiled: Dur,
}

/// Epochs of a simulation and re-planning on drift.
pub struct Adapt<'a> {
    /// Epoch length; epochs start at time 0.
    pub epoch: Dur,
    /// Fed with every fan-out count and every batch's run time against its
    /// module's profile; asked at the end of each epoch. `None`: epochs are
    /// counted, the plan never changes.
    pub detector: Option<DriftDetector>,
    /// Plans the application for the measured values: the sub-clusters it
    /// answers carry their module's first profile scaled by the `Replan`'s
    /// latency ratio (the run takes them to; a lane runs at the first
    /// profile's speed times the slowdown in force).
    pub replan: &'a mut dyn FnMut(&Replan) -> Result<Replanned, String>,
}

/// A new plan for a running application: a sub-cluster of the same module, GPU
/// type and lanes as a running one, planned at the same latency ratio,
/// resizes it; another one starts (so does one whose module's profile the
/// re-plan scaled by another ratio: its dispatcher plans with the new
/// profile); a running one the plan leaves out drains (no new task, its
/// batches finish).
#[derive(Debug, Clone)]
pub struct Replanned {
    pub subclusters: Vec<SubCluster>,
    pub budgets: Budgets,
    pub module_rates: Vec<f64>,
}

/// One epoch of an adaptive run.
#[derive(Debug, Clone, Default)]
pub struct EpochStat {
    pub start: Time,
    /// Requests that arrived in the epoch, and those that ended good.
    pub offered: u64,
    pub good: u64,
    /// Whether the epoch ended with a re-plan.
    pub replanned: bool,
    /// Machines per module once the epoch ended.
    pub machines: Vec<u32>,
    /// Each edge's mean fan-out as the detector measured it at the end of the
    /// epoch, before it decided (its window: this epoch and, with no re-plan
    /// between, the ones before it it still holds; `None`: a whole edge, too
    /// few samples, or no detector).
    pub measured_fanout: Vec<Option<f64>>,
    /// Each module's observed/profiled latency ratio, measured the same way
    /// (`None`: too few batches, or no detector).
    pub measured_latency_ratio: Vec<Option<f64>>,
}

impl EpochStat {
    pub fn bad_fraction(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            (self.offered - self.good) as f64 / self.offered as f64
        }
    }
}

/// The cores serving the application and how its sub-clusters map onto them.
struct Fleet {
    /// The application as now planned (sub-clusters, budgets, rates).
    live: AppSim,
    cores: Vec<Box<dyn Scheduler>>,
    /// `core_lanes[c][g]`: the (sub-cluster, lane) behind core `c`'s GPU `g`.
    core_lanes: Vec<Vec<(usize, usize)>>,
    sc_core: Vec<usize>,
    lane_free: Vec<Vec<Time>>,
    /// Weighted round robin state, per sub-cluster.
    wrr: Vec<f64>,
    /// The sub-clusters that take each module's tasks.
    by_module: Vec<Vec<usize>>,
    /// The most machines each sub-cluster ever had.
    peak: Vec<u32>,
    /// Per sub-cluster: the latency ratio its profile was planned with (its
    /// profile is the module's first one times this).
    sc_ratio: Vec<f64>,
    net: NetBudget,
}

/// The core of sub-cluster `i` (one GPU per lane).
fn sub_core(sim: &AppSim, i: usize, opt: &AppSimOptions, net: NetBudget) -> Box<dyn Scheduler> {
    let sc = &sim.subclusters[i];
    let lanes = (sc.machines * sc.lanes).max(1);
    let spec = ModelSpec {
        name: sim.graph.steps()[sc.module].name.clone(),
        profile: sc.profile.clone(),
        slo: sim.budgets.per_step[sc.module].max(Dur::from_us(1)),
    };
    match opt.runtime {
        Runtime::Core(policy) => {
            let mut cfg = DispatcherConfig::new(policy, lanes);
            cfg.gather = Gather::Adaptive;
            cfg.net = net;
            cfg.check_invariants = opt.check;
            Box::new(Dispatcher::new(cfg, vec![spec]))
        }
        _ => {
            let total: f64 = sim
                .subclusters
                .iter()
                .filter(|s| s.module == sc.module)
                .map(|s| s.weight)
                .sum();
            let rate = sim.module_rates[sc.module] * sc.weight / total.max(1e-12);
            Box::new(NexusCore::new(vec![spec], &[rate], lanes, 1, net))
        }
    }
}

impl Fleet {
    fn new(sim: &AppSim, opt: &AppSimOptions) -> Fleet {
        let n_steps = sim.graph.steps().len();
        let net = NetBudget::default();
        let lanes_of = |sc: &SubCluster| (sc.machines * sc.lanes) as usize;
        // The cores: one per sub-cluster, or with throughput-cost dispatch one per
        // module over all its sub-clusters' lanes (machines ranked across types).
        let mut cores: Vec<Box<dyn Scheduler>> = Vec::new();
        let mut core_lanes: Vec<Vec<(usize, usize)>> = Vec::new();
        let mut sc_core = vec![usize::MAX; sim.subclusters.len()];
        if opt.runtime == Runtime::ThroughputCost {
            for m in 0..n_steps {
                let mut lanes = Vec::new();
                let mut map = Vec::new();
                for (i, sc) in sim.subclusters.iter().enumerate() {
                    if sc.module != m {
                        continue;
                    }
                    sc_core[i] = cores.len();
                    for l in 0..lanes_of(sc) {
                        lanes.push(TcLane {
                            batch: sc.tc_batch.max(1),
                            profile: sc.profile.clone(),
                            ratio: sc.tc_ratio,
                        });
                        map.push((i, l));
                    }
                }
                if lanes.is_empty() {
                    continue;
                }
                cores.push(Box::new(TcDispatch::new(ModelId(0), lanes)));
                core_lanes.push(map);
            }
        } else {
            for (i, slot) in sc_core.iter_mut().enumerate() {
                let lanes = lanes_of(&sim.subclusters[i]).max(1);
                *slot = cores.len();
                cores.push(sub_core(sim, i, opt, net));
                core_lanes.push((0..lanes).map(|l| (i, l)).collect());
            }
        }
        // Weighted round robin (smooth) over each module's sub-clusters.
        let by_module: Vec<Vec<usize>> = (0..n_steps)
            .map(|m| {
                (0..sim.subclusters.len())
                    .filter(|&s| sim.subclusters[s].module == m)
                    .collect()
            })
            .collect();
        for (m, v) in by_module.iter().enumerate() {
            assert!(
                !v.is_empty(),
                "step '{}' has no sub-cluster",
                sim.graph.steps()[m].name
            );
        }
        Fleet {
            live: sim.clone(),
            cores,
            core_lanes,
            sc_core,
            lane_free: sim
                .subclusters
                .iter()
                .map(|sc| vec![Time::EPOCH_MIN; (sc.machines * sc.lanes).max(1) as usize])
                .collect(),
            wrr: vec![0.0; sim.subclusters.len()],
            by_module,
            peak: sim.subclusters.iter().map(|s| s.machines).collect(),
            sc_ratio: vec![1.0; sim.subclusters.len()],
            net,
        }
    }

    /// Submits tasks to their modules' sub-clusters.
    fn submit(
        &mut self,
        now: Time,
        req: u64,
        specs: Vec<crate::app::TaskSpec>,
        res: &mut AppSimResult,
    ) {
        for t in specs {
            let cands = &self.by_module[t.step];
            let subs = &self.live.subclusters;
            let total: f64 = cands.iter().map(|&s| subs[s].weight).sum();
            for &s in cands {
                self.wrr[s] += subs[s].weight;
            }
            let wrr = &self.wrr;
            let &sc = cands
                .iter()
                .max_by(|&&a, &&b| wrr[a].total_cmp(&wrr[b]).then(b.cmp(&a)))
                .expect("a sub-cluster");
            self.wrr[sc] -= total;
            res.tasks[t.step] += 1;
            let task = Task {
                id: TaskId((req << KEY_BITS) | u64::from(t.key.0)),
                arrival: now,
                deadline: t.deadline,
                tag: 0,
                cap: 0,
            };
            self.cores[self.sc_core[sc]].handle_request(now, ModelId(0), task, 0);
        }
    }

    /// Machines per module now.
    fn machines(&self) -> Vec<u32> {
        let mut v = vec![0; self.live.graph.steps().len()];
        for s in &self.live.subclusters {
            v[s.module] += s.machines;
        }
        v
    }

    /// Resizes sub-cluster `i` to `n` machines: the highest leave service (their
    /// booked batches still run), new ones enter free from now.
    fn resize(&mut self, now: Time, i: usize, n: u32) {
        let (n0, l) = (
            self.live.subclusters[i].machines,
            self.live.subclusters[i].lanes,
        );
        let c = self.sc_core[i];
        let d = self.cores[c]
            .dispatcher_mut()
            .expect("re-planning runs the production dispatcher");
        for m in n..n0 {
            for k in 0..l {
                d.remove_gpu(now, GpuId(m * l + k));
            }
        }
        for m in n0..n {
            for k in 0..l {
                let g = m * l + k;
                d.add_gpu_at(now, GpuId(g), true);
                if g as usize >= self.core_lanes[c].len() {
                    self.core_lanes[c].push((i, g as usize));
                    self.lane_free[i].push(Time::EPOCH_MIN);
                }
            }
        }
        self.live.subclusters[i].machines = n;
        self.peak[i] = self.peak[i].max(n);
    }

    /// Moves the application onto a new plan (see [`Replanned`]) made with
    /// the modules' latency ratios `ratio`.
    fn replan(
        &mut self,
        now: Time,
        new: Replanned,
        ratio: &[f64],
        opt: &AppSimOptions,
    ) -> Result<(), String> {
        if !matches!(opt.runtime, Runtime::Core(_)) {
            return Err("re-planning needs the production dispatcher (Runtime::Core)".into());
        }
        let n_steps = self.live.graph.steps().len();
        if ratio.len() != n_steps || ratio.iter().any(|k| !(k.is_finite() && *k > 0.0)) {
            return Err(format!(
                "the new plan has latency ratios {ratio:?} for {n_steps} steps"
            ));
        }
        if new.budgets.per_step.len() != n_steps || new.module_rates.len() != n_steps {
            return Err(format!(
                "the new plan has {} budgets and {} rates for {n_steps} steps",
                new.budgets.per_step.len(),
                new.module_rates.len()
            ));
        }
        for s in &new.subclusters {
            if s.module >= n_steps || s.gpu_type >= self.live.gpu_types.len() || s.lanes == 0 {
                return Err(format!("the new plan has a bad sub-cluster: {s:?}"));
            }
        }
        for m in 0..n_steps {
            if !new
                .subclusters
                .iter()
                .any(|s| s.module == m && s.machines > 0 && s.weight > 0.0)
            {
                return Err(format!(
                    "the new plan has no machine for step '{}'",
                    self.live.graph.steps()[m].name
                ));
            }
        }
        self.live.budgets = new.budgets;
        self.live.module_rates = new.module_rates;
        let old = self.live.subclusters.len();
        let mut matched = vec![false; old];
        for ns in new.subclusters {
            if ns.machines == 0 || ns.weight <= 0.0 {
                continue;
            }
            let found = (0..old).find(|&i| {
                let s = &self.live.subclusters[i];
                !matched[i]
                    && s.module == ns.module
                    && s.gpu_type == ns.gpu_type
                    && s.lanes == ns.lanes
                    && self.sc_ratio[i] == ratio[ns.module]
            });
            match found {
                Some(i) => {
                    matched[i] = true;
                    self.resize(now, i, ns.machines);
                    let s = &mut self.live.subclusters[i];
                    s.weight = ns.weight;
                    s.tc_batch = ns.tc_batch;
                    s.tc_ratio = ns.tc_ratio;
                }
                None => {
                    let i = self.live.subclusters.len();
                    let lanes = (ns.machines * ns.lanes) as usize;
                    self.peak.push(ns.machines);
                    self.sc_ratio.push(ratio[ns.module]);
                    self.live.subclusters.push(ns);
                    self.sc_core.push(self.cores.len());
                    self.cores.push(sub_core(&self.live, i, opt, self.net));
                    self.core_lanes.push((0..lanes).map(|l| (i, l)).collect());
                    self.lane_free.push(vec![Time::EPOCH_MIN; lanes]);
                    self.wrr.push(0.0);
                }
            }
        }
        for (i, &m) in matched.iter().enumerate() {
            if !m {
                self.resize(now, i, 0);
                self.live.subclusters[i].weight = 0.0;
            }
        }
        let subs = &self.live.subclusters;
        self.by_module = (0..n_steps)
            .map(|m| {
                (0..subs.len())
                    .filter(|&s| {
                        subs[s].module == m && subs[s].machines > 0 && subs[s].weight > 0.0
                    })
                    .collect()
            })
            .collect();
        Ok(())
    }
}

/// Runs one application simulation.
pub fn simulate_app(sim: &AppSim, opt: &AppSimOptions) -> AppSimResult {
    run(sim, opt, None).expect("a run without re-planning cannot fail")
}

/// Runs one application simulation in epochs: the detector sees every fan-out
/// count and, at the end of each epoch, may ask for a re-plan, which moves the
/// application onto the new plan's sub-clusters live. Re-planning needs
/// `Runtime::Core`; an error of the re-planner ends the run with it.
pub fn simulate_app_adaptive(
    sim: &AppSim,
    opt: &AppSimOptions,
    adapt: &mut Adapt,
) -> Result<AppSimResult, String> {
    if adapt.epoch <= Dur::ZERO {
        return Err("the epoch must be positive".into());
    }
    if adapt.detector.is_some() && !matches!(opt.runtime, Runtime::Core(_)) {
        return Err("re-planning needs the production dispatcher (Runtime::Core)".into());
    }
    run(sim, opt, Some(adapt))
}

fn run(
    sim: &AppSim,
    opt: &AppSimOptions,
    mut adapt: Option<&mut Adapt>,
) -> Result<AppSimResult, String> {
    let n_steps = sim.graph.steps().len();
    assert!(
        sim.graph.max_tasks() < (1 << KEY_BITS),
        "the task bound must fit the simulator's task ids"
    );
    let mut fleet = Fleet::new(sim, opt);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(opt.seed);
    let mut fan_rng = Xoshiro256PlusPlus::seed_from_u64(opt.seed ^ 0xfa17);
    let mut trace_pos = vec![0usize; sim.graph.edges().len()];
    let win_start = Time::ZERO + opt.warmup;
    let win_end = win_start + opt.duration;
    let mut res = AppSimResult {
        tasks: vec![0; n_steps],
        expired: vec![0; n_steps],
        ..AppSimResult::default()
    };
    let epoch_len = adapt.as_ref().map(|a| a.epoch);
    let mut next_epoch = match epoch_len {
        Some(e) => {
            res.epochs.push(EpochStat {
                start: Time::ZERO,
                ..EpochStat::default()
            });
            Time::ZERO + e
        }
        None => Time::NEVER,
    };
    let mut runs: HashMap<u64, AppRun> = HashMap::new();
    let mut ended_state: Vec<bool> = Vec::new();
    let mut flights: HashMap<(usize, u64), Flight> = HashMap::new();
    let mut completions: BinaryHeap<Reverse<(Time, usize, u64)>> = BinaryHeap::new();
    let mut next_arrival = Time::ZERO;
    let mut next_req: u64 = 0;
    let mut clock = Time::EPOCH_MIN;
    let gap = |rng: &mut Xoshiro256PlusPlus| {
        let x: f64 = Exp1.sample(rng);
        Dur::from_secs_f64(x / sim.rate_rps.max(1e-9))
    };
    next_arrival += gap(&mut rng);
    let epoch_of = |t: Time| -> Option<usize> {
        epoch_len.map(|e| ((t - Time::ZERO).0.max(0) / e.0.max(1)) as usize)
    };

    // Ends a request (once) and counts it.
    let finish = |req: u64,
                  end: crate::app::End,
                  now: Time,
                  runs: &mut HashMap<u64, AppRun>,
                  ended_state: &mut Vec<bool>,
                  res: &mut AppSimResult| {
        let run = runs.get(&req).expect("a live request");
        let arrival = run.arrival();
        if opt.check {
            assert!(!ended_state[req as usize], "request {req} ended twice");
        }
        ended_state[req as usize] = true;
        res.ended += 1;
        if matches!(end.outcome, Outcome::Good) {
            if let Some(s) = epoch_of(arrival).and_then(|i| res.epochs.get_mut(i)) {
                s.good += 1;
            }
        }
        if arrival >= win_start && arrival < win_end {
            match end.outcome {
                Outcome::Good => res.good += 1,
                Outcome::Late | Outcome::Expired { .. } => res.late += 1,
                Outcome::Failed { .. } => res.failed += 1,
            }
            if matches!(end.outcome, Outcome::Good | Outcome::Late) {
                res.latencies.push((now - arrival).as_secs_f64());
            }
        }
        // A request whose cancelled tasks are still queued stays until they report.
        if end.cancelled.is_empty() {
            runs.remove(&req);
        }
    };

    loop {
        let ta = if next_arrival < win_end {
            next_arrival
        } else {
            Time::NEVER
        };
        let (tc, ci) = fleet
            .cores
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.next_timeout().map(|t| (t, i)))
            .min()
            .unwrap_or((Time::NEVER, 0));
        let td = completions.peek().map_or(Time::NEVER, |r| r.0 .0);
        let te = if next_epoch <= win_end {
            next_epoch
        } else {
            Time::NEVER
        };
        let next = ta.min(tc).min(td).min(te);
        if next == Time::NEVER {
            break;
        }
        let now = next.max(clock);
        clock = now;
        let mut touched: Vec<usize> = Vec::new();
        if te == next {
            // The end of an epoch: the detector decides; a re-plan moves modules.
            let a = adapt.as_deref_mut().expect("epochs only when adapting");
            let mut replanned = false;
            if let Some(d) = a.detector.as_mut() {
                let measured = d.measured();
                if let Some(r) = d.end_epoch() {
                    let new = (a.replan)(&r)?;
                    fleet.replan(now, new, &r.latency_ratio, opt)?;
                    replanned = true;
                    touched.extend(0..fleet.cores.len());
                }
                if let Some(s) = res.epochs.last_mut() {
                    s.measured_fanout = measured.fanout;
                    s.measured_latency_ratio = measured.latency_ratio;
                }
            }
            let machines = fleet.machines();
            if let Some(s) = res.epochs.last_mut() {
                s.replanned = replanned;
                s.machines = machines;
            }
            if next_epoch < win_end {
                res.epochs.push(EpochStat {
                    start: next_epoch,
                    ..EpochStat::default()
                });
            }
            next_epoch += a.epoch;
        } else if td == next {
            let Reverse((t, c, plan)) = completions.pop().expect("peeked");
            let f = flights.remove(&(c, plan)).expect("in flight");
            fleet.cores[c].handle_gpu_report(t, crate::core::GpuId(f.gpu), PlanId(plan), t);
            touched.push(c);
            if let Some(d) = adapt.as_deref_mut().and_then(|a| a.detector.as_mut()) {
                // A batch whose profile has no latency is not a measurement.
                let _ = d.record_latency(f.module, f.ran, f.profiled);
            }
            for task in f.tasks {
                let req = task.id.0 >> KEY_BITS;
                let key = TaskKey((task.id.0 & ((1 << KEY_BITS) - 1)) as u32);
                let Some(run) = runs.get_mut(&req) else {
                    continue;
                };
                let step = run.task(key).expect("known task").step;
                let graph = Arc::clone(run.graph());
                let counts: Vec<(usize, u32)> = graph
                    .fanout_outs(step)
                    .map(|e| {
                        let mut dist = sim.fanout[e].clone().unwrap_or(FanoutDist::Const(1));
                        if let Some((at, edge, k)) = opt.fanout_jump {
                            if edge == e && t >= at {
                                dist = scale(&dist, k);
                            }
                        }
                        (e, draw(&dist, &mut fan_rng, &mut trace_pos[e]))
                    })
                    .collect();
                if let Some(d) = adapt.as_deref_mut().and_then(|a| a.detector.as_mut()) {
                    for &(e, n) in &counts {
                        // Edges the detector plans as whole are not measured.
                        let _ = d.record_fanout(e, n);
                    }
                }
                let p = run
                    .done(key, t, &counts)
                    .expect("a task in flight reports once");
                if p.discard {
                    if cancelled_all_reported(run) {
                        runs.remove(&req);
                    }
                    continue;
                }
                for s in p.tasks.iter().flat_map(|x| fleet.by_module[x.step].iter()) {
                    touched.push(fleet.sc_core[*s]);
                }
                fleet.submit(t, req, p.tasks, &mut res);
                if let Some(end) = p.end {
                    finish(req, end, t, &mut runs, &mut ended_state, &mut res);
                }
            }
        } else if tc == next {
            fleet.cores[ci].handle_timeout(now);
            touched.push(ci);
        } else {
            let req = next_req;
            next_req += 1;
            res.requests += 1;
            ended_state.push(false);
            if now >= win_start && now < win_end {
                res.offered += 1;
            }
            if let Some(s) = epoch_of(now).and_then(|i| res.epochs.get_mut(i)) {
                s.offered += 1;
            }
            let (run, specs) = AppRun::start(&sim.graph, &fleet.live.budgets, sim.rule, now);
            runs.insert(req, run);
            for s in specs.iter().flat_map(|x| fleet.by_module[x.step].iter()) {
                touched.push(fleet.sc_core[*s]);
            }
            fleet.submit(now, req, specs, &mut res);
            next_arrival = now + gap(&mut rng);
        }
        // Cores with outputs to read; a task dropped and submitted again (a
        // last deadline) may add another core, read in a further round.
        while !touched.is_empty() {
            touched.sort_unstable();
            touched.dedup();
            for c in std::mem::take(&mut touched) {
                while let Some(out) = fleet.cores[c].poll_output() {
                    match out {
                        Output::Dispatch(p) => {
                            let (sc, lane) = fleet.core_lanes[c][p.gpu.idx()];
                            let s = &fleet.live.subclusters[sc];
                            let start = p.exec_at.max(now).max(fleet.lane_free[sc][lane]);
                            let planned = s.profile.latency(p.tasks.len() as u32);
                            let (ran, profiled) =
                                run_time(planned, fleet.sc_ratio[sc], s.module, start, opt);
                            let end = start + ran;
                            fleet.lane_free[sc][lane] = end;
                            if opt.check {
                                assert!(
                                    (lane as u32) < s.machines * s.lanes,
                                    "a batch on lane {lane} of sub-cluster {sc}, out of service"
                                );
                                res.placements.push(Placement {
                                    module: s.module,
                                    subcluster: sc,
                                    gpu_type: s.gpu_type,
                                    machine: lane as u32 / s.lanes,
                                    lane: lane as u32 % s.lanes,
                                    start,
                                    finish: end,
                                });
                            }
                            completions.push(Reverse((end, c, p.id.0)));
                            flights.insert(
                                (c, p.id.0),
                                Flight {
                                    gpu: p.gpu.0,
                                    tasks: p.tasks,
                                    module: s.module,
                                    ran,
                                    profiled,
                                },
                            );
                        }
                        Output::Drop { task, .. } => {
                            let req = task.id.0 >> KEY_BITS;
                            let key = TaskKey((task.id.0 & ((1 << KEY_BITS) - 1)) as u32);
                            let Some(run) = runs.get_mut(&req) else {
                                continue;
                            };
                            let step = run.task(key).expect("known task").step;
                            let p = run.expired(key).expect("a queued task reports once");
                            if p.discard {
                                if cancelled_all_reported(run) {
                                    runs.remove(&req);
                                }
                                continue;
                            }
                            // A drop that ends the request counts against its module;
                            // one the rule gives a last deadline counts only when the
                            // task reached the module in time to run alone (one that
                            // came after its deadline less its least latency was
                            // late upstream).
                            let least = fleet.live.budgets.least[step];
                            if p.tasks.is_empty() || task.arrival + least <= task.deadline {
                                res.expired[step] += 1;
                            }
                            for s in p.tasks.iter().flat_map(|x| fleet.by_module[x.step].iter()) {
                                touched.push(fleet.sc_core[*s]);
                            }
                            fleet.submit(now, req, p.tasks, &mut res);
                            if let Some(end) = p.end {
                                finish(req, end, now, &mut runs, &mut ended_state, &mut res);
                            }
                        }
                        Output::Preempt { .. } => {
                            unreachable!("no application runtime preempts")
                        }
                    }
                }
            }
        }
    }
    if opt.check {
        assert_eq!(
            res.ended, res.requests,
            "every application request ends exactly once"
        );
        assert!(ended_state.iter().all(|&e| e));
        // Every sub-cluster that ever ran, at the most machines it had.
        let mut seen = fleet.live.clone();
        for (s, &p) in seen.subclusters.iter_mut().zip(&fleet.peak) {
            s.machines = p;
        }
        if let Err(e) = check_placements(&seen, &res.placements) {
            panic!("{e}");
        }
    }
    res.latencies.sort_by(f64::total_cmp);
    res.subclusters = fleet.live.subclusters;
    Ok(res)
}

/// A batch's run time on a lane whose profile gives `planned` for it, planned
/// at latency ratio `ratio`, and what the module's first profile (ratio 1)
/// gives: the lane runs at the first profile's speed, times the slowdown in
/// force for `module` at `start`.
fn run_time(
    planned: Dur,
    ratio: f64,
    module: usize,
    start: Time,
    opt: &AppSimOptions,
) -> (Dur, Dur) {
    let slow = match opt.slowdown {
        Some((at, m, k)) if m == module && start >= at => k,
        _ => 1.0,
    };
    if ratio == 1.0 && slow == 1.0 {
        return (planned, planned);
    }
    let base = Dur::from_secs_f64(planned.as_secs_f64() / ratio);
    (Dur::from_secs_f64(base.as_secs_f64() * slow), base)
}

/// Whether every task a request cancelled has reported (its state can go).
fn cancelled_all_reported(run: &AppRun) -> bool {
    run.ended() && run.unreported() == 0
}

fn scale(d: &FanoutDist, k: f64) -> FanoutDist {
    match d {
        FanoutDist::Const(n) => FanoutDist::Poisson(f64::from(*n) * k),
        FanoutDist::Poisson(m) => FanoutDist::Poisson(m * k),
        FanoutDist::Trace(v) => FanoutDist::Trace(
            v.iter()
                .map(|&n| (f64::from(n) * k).round() as u32)
                .collect(),
        ),
    }
}

fn draw(d: &FanoutDist, rng: &mut impl Rng, pos: &mut usize) -> u32 {
    match d {
        FanoutDist::Const(n) => *n,
        FanoutDist::Poisson(m) => {
            if *m <= 0.0 {
                0
            } else {
                let x: f64 = Poisson::new(*m).expect("positive mean").sample(rng);
                x.min(1e6) as u32
            }
        }
        FanoutDist::Trace(v) => {
            if v.is_empty() {
                return 0;
            }
            let n = v[*pos % v.len()];
            *pos += 1;
            n
        }
    }
}

/// The mean of a fan-out distribution.
pub fn fanout_mean(d: &FanoutDist) -> f64 {
    match d {
        FanoutDist::Const(n) => f64::from(*n),
        FanoutDist::Poisson(m) => *m,
        FanoutDist::Trace(v) => {
            if v.is_empty() {
                0.0
            } else {
                v.iter().map(|&n| f64::from(n)).sum::<f64>() / v.len() as f64
            }
        }
    }
}
