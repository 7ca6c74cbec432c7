//! The simulator serving applications: requests arrive per application (Poisson
//! at a rate); each drives a [`crate::app::AppRun`]; each step's tasks go to the
//! module's sub-clusters, each a set of machines of one GPU type running up to
//! `lanes` batches at once. A sub-cluster is its own scheduling core (the
//! production [`Dispatcher`], the [`NexusCore`] or throughput-cost dispatch)
//! seeing one GPU per lane, each with the profile d(b, e) of its type and lane
//! count. Fan-out counts are drawn per edge (constant, Poisson or a trace).
//!
//! With `check`, the run verifies that every application request ends exactly
//! once, that every batch runs on a lane of a sub-cluster planned for its module,
//! and that no lane runs two batches at once.

use super::tc::{TcDispatch, TcLane};
use crate::app::{AppRun, Budgets, DeadlineRule, Graph, Outcome, TaskKey};
use crate::core::nexus::NexusCore;
use crate::core::{
    Dispatcher, DispatcherConfig, Dur, Gather, LatencyProfile, ModelId, ModelSpec, NetBudget,
    Output, PlanId, Policy, Scheduler, Task, TaskId, Time,
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
    /// Tasks per module, and those that expired.
    pub tasks: Vec<u64>,
    pub expired: Vec<u64>,
    /// Every request that arrived, in and out of the window.
    pub requests: u64,
    pub ended: u64,
    pub placements: Vec<Placement>,
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
}

/// Runs one application simulation.
pub fn simulate_app(sim: &AppSim, opt: &AppSimOptions) -> AppSimResult {
    let n_steps = sim.graph.steps().len();
    assert!(
        sim.graph.max_tasks() < (1 << KEY_BITS),
        "the task bound must fit the simulator's task ids"
    );
    let net = NetBudget::default();
    let lanes_of = |sc: &SubCluster| (sc.machines * sc.lanes) as usize;
    // The cores: one per sub-cluster, or with throughput-cost dispatch one per
    // module over all its sub-clusters' lanes (machines ranked across types).
    // `core_lanes[c][g]` is the (sub-cluster, lane) behind core `c`'s GPU `g`.
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
        for (i, sc) in sim.subclusters.iter().enumerate() {
            let lanes = lanes_of(sc).max(1) as u32;
            let spec = ModelSpec {
                name: sim.graph.steps()[sc.module].name.clone(),
                profile: sc.profile.clone(),
                slo: sim.budgets.per_step[sc.module].max(Dur::from_us(1)),
            };
            let core: Box<dyn Scheduler> = match opt.runtime {
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
            };
            sc_core[i] = cores.len();
            cores.push(core);
            core_lanes.push((0..lanes as usize).map(|l| (i, l)).collect());
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
    let mut wrr = vec![0.0f64; sim.subclusters.len()];
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
    let mut lane_free: Vec<Vec<Time>> = sim
        .subclusters
        .iter()
        .map(|sc| vec![Time::EPOCH_MIN; (sc.machines * sc.lanes).max(1) as usize])
        .collect();
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

    // Submits tasks to their modules' sub-clusters.
    let submit = |now: Time,
                  req: u64,
                  specs: Vec<crate::app::TaskSpec>,
                  cores: &mut Vec<Box<dyn Scheduler>>,
                  wrr: &mut Vec<f64>,
                  res: &mut AppSimResult| {
        for t in specs {
            let cands = &by_module[t.step];
            let total: f64 = cands.iter().map(|&s| sim.subclusters[s].weight).sum();
            for &s in cands {
                wrr[s] += sim.subclusters[s].weight;
            }
            let &sc = cands
                .iter()
                .max_by(|&&a, &&b| wrr[a].total_cmp(&wrr[b]).then(b.cmp(&a)))
                .expect("a sub-cluster");
            wrr[sc] -= total;
            let core = sc_core[sc];
            res.tasks[t.step] += 1;
            let task = Task {
                id: TaskId((req << KEY_BITS) | u64::from(t.key.0)),
                arrival: now,
                deadline: t.deadline,
                tag: 0,
                cap: 0,
            };
            cores[core].handle_request(now, ModelId(0), task, 0);
        }
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
        let (tc, ci) = cores
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.next_timeout().map(|t| (t, i)))
            .min()
            .unwrap_or((Time::NEVER, 0));
        let td = completions.peek().map_or(Time::NEVER, |r| r.0 .0);
        let next = ta.min(tc).min(td);
        if next == Time::NEVER {
            break;
        }
        let now = next.max(clock);
        clock = now;
        let mut touched: Vec<usize> = Vec::new();
        if td == next {
            let Reverse((t, c, plan)) = completions.pop().expect("peeked");
            let f = flights.remove(&(c, plan)).expect("in flight");
            cores[c].handle_gpu_report(t, crate::core::GpuId(f.gpu), PlanId(plan), t);
            touched.push(c);
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
                let p = run
                    .done(key, t, &counts)
                    .expect("a task in flight reports once");
                if p.discard {
                    if cancelled_all_reported(run) {
                        runs.remove(&req);
                    }
                    continue;
                }
                for s in p.tasks.iter().flat_map(|x| by_module[x.step].iter()) {
                    touched.push(sc_core[*s]);
                }
                submit(t, req, p.tasks, &mut cores, &mut wrr, &mut res);
                if let Some(end) = p.end {
                    finish(req, end, t, &mut runs, &mut ended_state, &mut res);
                }
            }
        } else if tc == next {
            cores[ci].handle_timeout(now);
            touched.push(ci);
        } else {
            let req = next_req;
            next_req += 1;
            res.requests += 1;
            ended_state.push(false);
            if now >= win_start && now < win_end {
                res.offered += 1;
            }
            let (run, specs) = AppRun::start(&sim.graph, &sim.budgets, sim.rule, now);
            runs.insert(req, run);
            for s in specs.iter().flat_map(|x| by_module[x.step].iter()) {
                touched.push(sc_core[*s]);
            }
            submit(now, req, specs, &mut cores, &mut wrr, &mut res);
            next_arrival = now + gap(&mut rng);
        }
        touched.sort_unstable();
        touched.dedup();
        for c in touched {
            while let Some(out) = cores[c].poll_output() {
                match out {
                    Output::Dispatch(p) => {
                        let (sc, lane) = core_lanes[c][p.gpu.idx()];
                        let prof = &sim.subclusters[sc].profile;
                        let start = p.exec_at.max(now).max(lane_free[sc][lane]);
                        let end = start + prof.latency(p.tasks.len() as u32);
                        lane_free[sc][lane] = end;
                        if opt.check {
                            let s = &sim.subclusters[sc];
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
                        res.expired[step] += 1;
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
    if opt.check {
        assert_eq!(
            res.ended, res.requests,
            "every application request ends exactly once"
        );
        assert!(ended_state.iter().all(|&e| e));
        if let Err(e) = check_placements(sim, &res.placements) {
            panic!("{e}");
        }
    }
    res.latencies.sort_by(f64::total_cmp);
    res
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
