//! Applications served by a frontend: an ensemble of the model repository
//! ([`crate::triton_ensemble`]) checked against the models the scheduler
//! serves ([`ServedApp`]), and the thin driver of [`crate::app::AppRun`] that
//! runs one application request ([`ServedApp::run`]).
//!
//! Each module request is an ordinary task handed to the frontend's loop
//! ([`FrontendHandle::infer`]) with its own deadline from the application's
//! deadline rule: its input bytes go to the frontend's region, from which the
//! backend planned for it pulls them like any input. A step's output comes
//! back to the frontend, which builds the next step's inputs from it (one row
//! per item on a fan-out edge). The state machine decides which tasks run,
//! when the request ends (once) and in which order its outputs are assembled;
//! this driver only moves bytes and reports completions.

use super::frontend::stats::ModelStats;
use super::frontend::{Ended, FrontendHandle, InferDone};
use crate::app::{
    AppRun, Budgets, DeadlineRule, DriftConfig, EdgeKind, EdgeSpec, Graph, LatencySeen, NewPlan,
    Outcome, Replanner, Step, StepProfile, TaskKey, TaskSpec, MAX_LATENCY_RATIO, MIN_LATENCY_RATIO,
};
use crate::core::{Dur, LatencyProfile, Time};
use crate::repo::{DType, ModelMeta};
use crate::triton_ensemble::{self as ens, EnsembleConfig, FanoutCount, Rule, Source, Wiring};
use crate::wire::{AppCounters, DropReason, ModelInfo};
use anyhow::{anyhow, bail, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// An application a frontend serves.
pub struct ServedApp {
    pub config: EnsembleConfig,
    /// Its tensors as a model's: what clients see (metadata, configuration,
    /// request decoding).
    pub meta: ModelMeta,
    graph: Arc<Graph>,
    /// The budgets new requests get: the configuration's, until a re-plan
    /// installs others ([`ServedApp::install`]); a request keeps the ones it
    /// started with.
    budgets: RwLock<Budgets>,
    rule: DeadlineRule,
    /// Per step: its model's latency profile (batch, seconds), for the planner.
    profiles: Vec<StepProfile>,
    /// Application requests started (one per sample).
    requests: AtomicU64,
    /// The plan in force: per graph edge the fan-out it assumes (`None` on
    /// whole edges), and the re-plans installed.
    planned_fanout: Mutex<Vec<Option<f64>>>,
    replans: AtomicU64,
    /// Module requests sent again with their last deadline after the first
    /// expired (`latest-useful`).
    resends: AtomicU64,
    wiring: Wiring,
    /// Per step: its model's index in the frontend's models, and metadata.
    models: Vec<(usize, ModelMeta)>,
    /// Per graph edge: how a fan-out edge's item count is read.
    fanout: Vec<Option<FanoutCount>>,
    /// The least time an answer takes: the l(1) of the longest path's steps.
    pub min_latency: Duration,
    /// The application's statistics (Triton's statistics extension).
    pub stats: ModelStats,
    /// Per graph edge: the parent outputs seen on it and the items they
    /// carried (fan-out edges only; the measured fan-out a re-plan needs).
    fanout_seen: Vec<(AtomicU64, AtomicU64)>,
    /// Per step: its model's latency profile (None when it cannot be read),
    /// and the run times of the batches its answers ran in against what
    /// that profile gives for them (ns) and the answers counted
    /// ([`latency_sample`]; the measured latency ratio a re-plan needs).
    step_latency: Vec<Option<LatencyProfile>>,
    latency_seen: Vec<[AtomicU64; 3]>,
    /// Per step: the observed/profiled latency ratio the plan in force
    /// assumes.
    planned_ratio: Mutex<Vec<f64>>,
    /// The application's counters over every frontend that serves it, as
    /// the scheduler last answered them (what the re-planner plans on).
    totals: Mutex<Option<Totals>>,
}

/// An application's counters summed over every frontend that serves it
/// (the scheduler's [`Msg::AppTotals`](crate::wire::Msg::AppTotals)), as one
/// frontend last heard them.
#[derive(Debug, Clone, PartialEq)]
pub struct Totals {
    /// The sums: per graph edge, parent outputs and items (zero on whole
    /// edges); per step, run times against the profile; requests received.
    pub counters: AppCounters,
    /// The frontends the sums are over.
    pub frontends: u32,
    /// When they came, and their number (from 1) at this frontend.
    pub at: Instant,
    pub seq: u64,
}

/// One answer's sample of its model's latency ratio: its batch's run time
/// `run` on the GPU against the latency `profile` gives for a batch of
/// `batch`, as (observed ns, profiled ns). None for an answer that did not
/// run, a batch outside the profile, or a ratio outside
/// [`MIN_LATENCY_RATIO`]..=[`MAX_LATENCY_RATIO`] (the run time comes from a
/// backend's report: one that far off is not a measurement to plan on).
pub fn latency_sample(profile: &LatencyProfile, run: Duration, batch: u32) -> Option<(u64, u64)> {
    if batch == 0 || batch > profile.max_batch() {
        return None;
    }
    let profiled = u64::try_from(profile.latency(batch).0)
        .ok()
        .filter(|&p| p > 0)?;
    let observed = u64::try_from(run.as_nanos()).ok().filter(|&o| o > 0)?;
    let ratio = observed as f64 / profiled as f64;
    (MIN_LATENCY_RATIO..=MAX_LATENCY_RATIO)
        .contains(&ratio)
        .then_some((observed, profiled))
}

/// What the frontend measured on one fan-out edge of an application.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FanoutSeen {
    /// The parent and child steps.
    pub from: String,
    pub to: String,
    /// Parent outputs counted and the items they carried.
    pub outputs: u64,
    pub items: u64,
}

/// How one sample of an application request ended.
pub struct AppDone {
    /// Per application output, its rows (one per task, in item order): the
    /// output tensor's bytes of each.
    pub outputs: Vec<Vec<Vec<u8>>>,
    /// The latest module's latency (from the request's receipt), the longest
    /// time a module waited in its queue, the largest batch one ran in.
    pub latency: Duration,
    pub queue: Duration,
    pub batch_size: u32,
}

/// Why an application request failed: its HTTP status and message.
pub type AppFail = (hyper::StatusCode, String);

/// The frontend stopped before the request ended.
#[derive(Debug)]
pub struct AppStopped;

impl ServedApp {
    /// Checks `config` against the models served (`infos`, as the scheduler
    /// announced them) and builds its graph and budgets. Errors name the
    /// configuration file and the field.
    pub fn new(config: EnsembleConfig, infos: &[ModelInfo]) -> Result<ServedApp> {
        let ctx = |e: anyhow::Error| anyhow!("{}: {e:#}", config.file.display());
        let l1 = |m: &ModelInfo| {
            crate::node::exec::profile_of(&m.profile)
                .map(|p| p.latency(1).as_ms_f64())
                .unwrap_or(0.0)
        };
        let lookup = |name: &str| -> Option<(usize, ModelMeta, f64)> {
            let i = infos.iter().position(|m| m.name == name)?;
            let meta = infos[i].meta()?.ok()?;
            Some((i, meta, l1(&infos[i])))
        };
        let wiring = ens::resolve(&config, |n| lookup(n).map(|(_, m, l)| (m, l))).map_err(ctx)?;
        let models: Vec<(usize, ModelMeta)> = config
            .steps
            .iter()
            .map(|s| lookup(&s.model).map(|(i, m, _)| (i, m)).expect("resolved"))
            .collect();
        let steps: Vec<Step> = config
            .steps
            .iter()
            .map(|s| Step::new(&s.name, &s.model))
            .collect();
        let specs: Vec<EdgeSpec> = wiring
            .edges
            .iter()
            .map(|e| {
                let (a, b) = (&config.steps[e.from].name, &config.steps[e.to].name);
                if e.fanout.is_some() {
                    EdgeSpec::fanout(a, b)
                } else {
                    EdgeSpec::whole(a, b)
                }
            })
            .collect();
        let outs: Vec<&str> = wiring
            .outputs
            .iter()
            .map(|&(s, _)| config.steps[s].name.as_str())
            .collect();
        let graph = Graph::new(steps, &specs, &outs)
            .map_err(|e| ctx(anyhow!("ensemble_scheduling: {e}")))?;
        let mut fanout = vec![None; graph.edges().len()];
        for e in &wiring.edges {
            let ei = graph.edge(e.from, e.to).expect("an edge of the wiring");
            fanout[ei] = e.fanout.clone();
        }
        let per_step = wiring
            .budgets_ms
            .iter()
            .map(|&ms| Dur::from_ms_f64(ms))
            .collect();
        // Each step's least latency, a batch of one (the last deadlines of
        // `DeadlineRule::LatestUseful`).
        let least = models
            .iter()
            .map(|&(i, _)| Dur::from_ms_f64(l1(&infos[i]).max(0.0)))
            .collect();
        let budgets = Budgets::new(&graph, per_step, Dur::from_ms_f64(config.slo_ms))
            .and_then(|b| b.with_least(&graph, least))
            .map_err(|e| ctx(anyhow!("budgets: {e}")))?;
        // The longest path by l(1): the least an answer takes.
        let mut upto: Vec<f64> = models.iter().map(|&(i, _)| l1(&infos[i])).collect();
        for &v in graph.topo() {
            for &ei in graph.outs(v) {
                let c = graph.edges()[ei].to;
                upto[c] = upto[c].max(upto[v] + l1(&infos[models[c].0]));
            }
        }
        let min_ms = upto.iter().copied().fold(0.0, f64::max);
        let profiles = models
            .iter()
            .map(|&(i, ref meta)| step_profile(&infos[i], meta.max_batch))
            .collect();
        let step_latency: Vec<Option<LatencyProfile>> = models
            .iter()
            .map(|&(i, _)| crate::node::exec::profile_of(&infos[i].profile).ok())
            .collect();
        let planned_fanout = graph
            .edges()
            .iter()
            .map(|e| (e.kind == EdgeKind::Fanout).then_some(PLANNED_FANOUT))
            .collect();
        let meta = ModelMeta {
            name: config.name.clone(),
            inputs: config.inputs.clone(),
            outputs: config.outputs.clone(),
            slo_ms: config.slo_ms,
            max_batch: config.max_batch,
            description: format!("ensemble {}", config.file.display()),
            batch_buckets: None,
        };
        meta.validate().map_err(ctx)?;
        Ok(ServedApp {
            rule: match config.rule {
                Rule::Static => DeadlineRule::Static,
                Rule::SlackForwarding => DeadlineRule::SlackForwarding,
                Rule::LatestUseful => DeadlineRule::LatestUseful,
            },
            stats: ModelStats::new(config.max_batch),
            config,
            meta,
            graph: Arc::new(graph),
            budgets: RwLock::new(budgets),
            profiles,
            requests: AtomicU64::new(0),
            resends: AtomicU64::new(0),
            planned_fanout: Mutex::new(planned_fanout),
            replans: AtomicU64::new(0),
            wiring,
            models,
            fanout_seen: (0..fanout.len())
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
            fanout,
            min_latency: Duration::from_secs_f64(min_ms.max(0.0) / 1e3),
            latency_seen: (0..step_latency.len())
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            planned_ratio: Mutex::new(vec![1.0; step_latency.len()]),
            step_latency,
            totals: Mutex::new(None),
        })
    }

    /// This frontend's counters of the application, as it reports them to
    /// the scheduler.
    pub fn counters(&self) -> AppCounters {
        AppCounters {
            app: self.meta.name.clone(),
            fanout: self.fanout_counts(),
            latency: self.latency_counts(),
            requests: self.requests(),
        }
    }

    /// Takes the scheduler's sums `c` over `frontends` frontends, come at
    /// `at`; an error (nothing kept) when they are not of this
    /// application's shape.
    pub fn take_totals(&self, c: AppCounters, frontends: u32, at: Instant) -> Result<(), String> {
        let (edges, steps) = (self.graph.edges().len(), self.graph.steps().len());
        if (c.fanout.len(), c.latency.len()) != (edges, steps) {
            return Err(format!(
                "the scheduler's sums of application {:?} are for {} edges and {} steps, it has {edges} and {steps}",
                c.app,
                c.fanout.len(),
                c.latency.len()
            ));
        }
        let mut t = self.totals.lock().expect("totals lock");
        let seq = t.as_ref().map_or(1, |t| t.seq + 1);
        *t = Some(Totals {
            counters: c,
            frontends,
            at,
            seq,
        });
        Ok(())
    }

    /// The sums the scheduler last answered (None before any).
    pub fn totals(&self) -> Option<Totals> {
        self.totals.lock().expect("totals lock").clone()
    }

    /// Every fan-out edge's counts since the frontend started.
    pub fn fanout_seen(&self) -> Vec<FanoutSeen> {
        let steps = self.graph.steps();
        self.graph
            .edges()
            .iter()
            .zip(&self.fanout_seen)
            .filter(|(e, _)| e.kind == crate::app::EdgeKind::Fanout)
            .map(|(e, (n, items))| FanoutSeen {
                from: steps[e.from].name.clone(),
                to: steps[e.to].name.clone(),
                outputs: n.load(Ordering::Relaxed),
                items: items.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Per graph edge, the cumulative (parent outputs, items) counted (zero
    /// on whole edges), for the re-planner.
    pub fn fanout_counts(&self) -> Vec<(u64, u64)> {
        self.fanout_seen
            .iter()
            .map(|(n, i)| (n.load(Ordering::Relaxed), i.load(Ordering::Relaxed)))
            .collect()
    }

    /// Per step, the cumulative run times measured against its profile
    /// ([`latency_sample`]), for the re-planner.
    pub fn latency_counts(&self) -> Vec<LatencySeen> {
        self.latency_seen
            .iter()
            .map(|[o, p, n]| LatencySeen {
                observed_ns: o.load(Ordering::Relaxed),
                profiled_ns: p.load(Ordering::Relaxed),
                samples: n.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Per step: (name, observed/profiled latency ratio measured since the
    /// frontend started; None before any sample).
    pub fn latency_measured(&self) -> Vec<(String, Option<f64>)> {
        self.graph
            .steps()
            .iter()
            .zip(self.latency_counts())
            .map(|(s, c)| {
                let r = (c.samples > 0 && c.profiled_ns > 0)
                    .then(|| c.observed_ns as f64 / c.profiled_ns as f64);
                (s.name.clone(), r)
            })
            .collect()
    }

    /// Per step: (name, observed/profiled latency ratio the plan in force
    /// assumes).
    pub fn planned_latency_ratio(&self) -> Vec<(String, f64)> {
        let r = self.planned_ratio.lock().expect("plan lock").clone();
        self.graph
            .steps()
            .iter()
            .zip(r)
            .map(|(s, k)| (s.name.clone(), k))
            .collect()
    }

    /// Counts one answer of step `step` that ran `run` in a batch of `batch`.
    fn record_latency(&self, step: usize, run: Duration, batch: u32) {
        let Some(Some(p)) = self.step_latency.get(step) else {
            return;
        };
        if let Some((o, q)) = latency_sample(p, run, batch) {
            let [so, sp, sn] = &self.latency_seen[step];
            so.fetch_add(o, Ordering::Relaxed);
            sp.fetch_add(q, Ordering::Relaxed);
            sn.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Application requests started so far (one per sample).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// A re-planner for this application: its graph, its steps' profiles
    /// and SLO, every fan-out edge planned at [`PLANNED_FANOUT`].
    pub fn replanner(&self, cfg: DriftConfig) -> Result<Replanner, String> {
        let slo = self.budgets.read().expect("budgets lock").slo;
        Replanner::new(&self.graph, &self.profiles, slo, PLANNED_FANOUT, cfg)
    }

    /// Installs a new plan's budgets for the requests that start from now
    /// on (those in flight keep theirs).
    pub fn install(&self, plan: &NewPlan) -> Result<(), String> {
        let mut b = self.budgets.write().expect("budgets lock");
        // The least latencies (the last deadlines of `latest-useful`) are the
        // models' own: a new plan keeps them.
        let new = Budgets::new(&self.graph, plan.budgets.clone(), b.slo)
            .and_then(|n| n.with_least(&self.graph, b.least.clone()))
            .map_err(|e| format!("the new plan's budgets: {e}"))?;
        if plan.fanout.len() != self.graph.edges().len() {
            return Err(format!(
                "the new plan has {} fan-outs for {} edges",
                plan.fanout.len(),
                self.graph.edges().len()
            ));
        }
        if plan.latency_ratio.len() != self.graph.steps().len() {
            return Err(format!(
                "the new plan has {} latency ratios for {} steps",
                plan.latency_ratio.len(),
                self.graph.steps().len()
            ));
        }
        *b = new;
        *self.planned_fanout.lock().expect("plan lock") = plan.fanout.clone();
        *self.planned_ratio.lock().expect("plan lock") = plan.latency_ratio.clone();
        self.replans.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Re-plans installed so far.
    pub fn replans(&self) -> u64 {
        self.replans.load(Ordering::Relaxed)
    }

    /// Module requests sent again with their last deadline (`latest-useful`)
    /// after their first deadline passed.
    pub fn resends(&self) -> u64 {
        self.resends.load(Ordering::Relaxed)
    }

    /// The plan in force: each fan-out edge's (from, to, planned mean
    /// fan-out).
    pub fn planned_fanout(&self) -> Vec<(String, String, f64)> {
        let steps = self.graph.steps();
        let fan = self.planned_fanout.lock().expect("plan lock").clone();
        self.graph
            .edges()
            .iter()
            .zip(fan)
            .filter_map(|(e, f)| {
                f.map(|f| (steps[e.from].name.clone(), steps[e.to].name.clone(), f))
            })
            .collect()
    }

    /// The plan in force: each step's (name, budget).
    pub fn budgets_in_force(&self) -> Vec<(String, Duration)> {
        let b = self.budgets.read().expect("budgets lock");
        self.graph
            .steps()
            .iter()
            .zip(&b.per_step)
            .map(|(s, d)| (s.name.clone(), Duration::from_nanos(d.0.max(0) as u64)))
            .collect()
    }

    /// A model description the APIs list the application under.
    pub fn info(&self) -> ModelInfo {
        ModelInfo {
            id: crate::core::ModelId(u32::MAX),
            name: self.meta.name.clone(),
            slo: Dur::from_ms_f64(self.meta.slo_ms),
            profile: crate::wire::WireProfile::Table { lat_ns: Vec::new() },
            input_bytes: self.meta.input_bytes() as u32,
            meta_json: serde_json::to_string(&self.meta).expect("metadata serializes"),
        }
    }

    /// The frontend's index of each model its steps run (a model used by
    /// several steps more than once).
    pub fn step_models(&self) -> impl Iterator<Item = usize> + '_ {
        self.models.iter().map(|(m, _)| *m)
    }

    /// The steps: (name, model) in order, with each step's input and output
    /// maps (model tensor → ensemble tensor), for the configuration APIs.
    pub fn steps(&self) -> &[ens::EnsembleStep] {
        &self.config.steps
    }

    /// The budgets under an SLO of `slo` (the application's, or a request's
    /// `timeout`): the planned ones scaled by `slo` / the application's SLO.
    fn budgets_for(&self, slo: Dur) -> Budgets {
        let budgets = self.budgets.read().expect("budgets lock").clone();
        if slo == budgets.slo || slo <= Dur::ZERO {
            return budgets;
        }
        let k = slo.0 as f64 / budgets.slo.0 as f64;
        let per = budgets
            .per_step
            .iter()
            .map(|d| Dur((d.0 as f64 * k) as i64))
            .collect();
        Budgets::new(&self.graph, per, slo)
            .and_then(|b| b.with_least(&self.graph, budgets.least.clone()))
            .expect("scaled budgets stay valid")
    }

    /// Runs one sample (`input`: the application's inputs, one after the
    /// other) as one application request whose SLO (`slo`; zero: the
    /// application's) runs from `received`. Ends once: the outputs, or the
    /// status of the module request that ended it.
    pub async fn run(
        &self,
        fe: &FrontendHandle,
        slo: Dur,
        input: &bytes::Bytes,
        received: Instant,
    ) -> Result<Result<AppDone, AppFail>, AppStopped> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let budgets = self.budgets_for(slo);
        let now = || Time(received.elapsed().as_nanos().min(i64::MAX as u128) as i64);
        let (mut run, first) = AppRun::start(&self.graph, &budgets, self.rule, Time(0));
        let mut outputs: HashMap<TaskKey, Vec<u8>> = HashMap::new();
        let mut pending = tokio::task::JoinSet::new();
        let mut sum = AppDone {
            outputs: Vec::new(),
            latency: Duration::ZERO,
            queue: Duration::ZERO,
            batch_size: 0,
        };
        // The module answer that ended the request, for its status.
        let mut ender: Option<(TaskSpec, InferDone)> = None;
        let submit = |specs: Vec<TaskSpec>,
                      outputs: &HashMap<TaskKey, Vec<u8>>,
                      pending: &mut tokio::task::JoinSet<_>| {
            for spec in specs {
                let bytes = self.task_input(&spec, input, outputs);
                let (mi, _) = &self.models[spec.step];
                let model = &fe.models()[*mi].name;
                // The deadline as an SLO from the receipt; one already past
                // is still handed over (and dropped as expired there).
                let slo = Dur(spec.deadline.0.max(1_000));
                let rx = fe.infer(model, slo, bytes, received);
                pending.spawn(async move { (spec, rx.await) });
            }
        };
        submit(first, &outputs, &mut pending);
        loop {
            let Some(joined) = pending.join_next().await else {
                // Every task answered and the request did not end: cannot
                // happen with a consistent state machine; fail it rather
                // than answer nothing.
                let end = run.abort("the application request has no task left to run");
                return Ok(Err(self.fail_message(end.map(|e| e.outcome), None)));
            };
            let Ok((spec, Ok(done))) = joined else {
                run.abort("the frontend stopped");
                return Err(AppStopped);
            };
            let (mi, meta) = &self.models[spec.step];
            fe.record_margins(*mi, std::slice::from_ref(&done));
            self.record_latency(spec.step, done.run, done.batch_size);
            if let Some(s) = fe.stats(*mi) {
                if done.ended == Ended::Good {
                    s.sample(
                        done.queue,
                        done.latency.saturating_sub(done.queue),
                        done.batch_size,
                    );
                }
                s.request(done.ended == Ended::Good, done.latency);
            }
            let at = now();
            // A late answer is still of use by the task's last deadline (later
            // than its deadline only under `latest-useful`).
            let usable = done.ended == Ended::Good
                || (done.ended == Ended::Late && at <= spec.latest && spec.latest > spec.deadline);
            let progress = match done.ended {
                _ if usable && done.output.len() != meta.output_bytes() => {
                    let why = format!(
                        "model `{}` returned {} output bytes; its outputs are {}",
                        meta.name,
                        done.output.len(),
                        meta.output_bytes()
                    );
                    let p = run.failed(spec.key, &why);
                    ender.get_or_insert((spec.clone(), failed_with(done.clone(), why)));
                    p
                }
                _ if usable => match self.counts(&spec, &done.output) {
                    Err(why) => {
                        let p = run.failed(spec.key, &why);
                        ender.get_or_insert((spec.clone(), failed_with(done.clone(), why)));
                        p
                    }
                    Ok(counts) => {
                        for &(e, n) in &counts {
                            let (o, i) = &self.fanout_seen[e];
                            o.fetch_add(1, Ordering::Relaxed);
                            i.fetch_add(u64::from(n), Ordering::Relaxed);
                        }
                        sum.latency = sum.latency.max(done.latency);
                        sum.queue = sum.queue.max(done.queue);
                        sum.batch_size = sum.batch_size.max(done.batch_size);
                        let p = run.done(spec.key, at, &counts);
                        if p.as_ref().is_ok_and(|p| !p.discard) {
                            outputs.insert(spec.key, done.output);
                        }
                        p
                    }
                },
                e => {
                    let p = if expired(e) {
                        let p = run.expired(spec.key);
                        if let Ok(p) = &p {
                            self.resends
                                .fetch_add(p.tasks.len() as u64, Ordering::Relaxed);
                        }
                        p
                    } else {
                        run.failed(spec.key, &done.message)
                    };
                    if p.as_ref().is_ok_and(|p| p.end.is_some()) {
                        ender = Some((spec.clone(), done));
                    }
                    p
                }
            };
            let progress = match progress {
                Ok(p) => p,
                Err(e) => {
                    let end = run.abort(&format!("internal: {e}"));
                    return Ok(Err(self.fail_message(end.map(|e| e.outcome), None)));
                }
            };
            if let Some(end) = progress.end {
                return Ok(match (&end.outcome, end.outputs) {
                    (Outcome::Good, Some(outs)) => {
                        sum.outputs = self.assemble(&outs, &outputs);
                        Ok(sum)
                    }
                    (o, _) => Err(self.fail_message(Some(o.clone()), ender)),
                });
            }
            submit(progress.tasks, &outputs, &mut pending);
        }
    }

    /// The input bytes of task `spec`: each input of its model in order, from
    /// the application's input or its parent task's output (one row of it on
    /// a fan-out edge).
    fn task_input(
        &self,
        spec: &TaskSpec,
        app_in: &bytes::Bytes,
        outs: &HashMap<TaskKey, Vec<u8>>,
    ) -> bytes::Bytes {
        let (_, meta) = &self.models[spec.step];
        if let [si] = self.wiring.step_inputs[spec.step].as_slice() {
            if let Source::AppInput(a) = si.source {
                // A step fed by one input of the request: a view of it.
                let off: usize = self.meta.inputs[..a].iter().map(|t| t.sample_bytes()).sum();
                return app_in.slice(off..off + self.meta.inputs[a].sample_bytes());
            }
        }
        let mut b = Vec::with_capacity(meta.input_bytes());
        for si in &self.wiring.step_inputs[spec.step] {
            match si.source {
                Source::AppInput(a) => {
                    let off: usize = self.meta.inputs[..a].iter().map(|t| t.sample_bytes()).sum();
                    b.extend_from_slice(&app_in[off..off + self.meta.inputs[a].sample_bytes()]);
                }
                Source::Step { step, output } => {
                    let input = spec
                        .inputs
                        .iter()
                        .find(|i| self.graph.edges()[i.edge].from == step)
                        .expect("an input on the edge from the producing step");
                    let pmeta = &self.models[step].1;
                    let off: usize = pmeta.outputs[..output]
                        .iter()
                        .map(|t| t.sample_bytes())
                        .sum();
                    let whole = &outs[&input.task][off..off + pmeta.outputs[output].sample_bytes()];
                    match (si.row, input.item) {
                        (true, Some(item)) => {
                            let rows = pmeta.outputs[output].sample_shape()[0] as usize;
                            let row = whole.len() / rows;
                            let i = item as usize;
                            b.extend_from_slice(&whole[i * row..(i + 1) * row]);
                        }
                        _ => b.extend_from_slice(whole),
                    }
                }
            }
        }
        b.into()
    }

    /// The item count of each fan-out edge out of `spec`'s step, read from
    /// its output; an error when a count is not in 0..=its tensor's rows.
    fn counts(&self, spec: &TaskSpec, out: &[u8]) -> Result<Vec<(usize, u32)>, String> {
        let meta = &self.models[spec.step].1;
        let mut v = Vec::new();
        for ei in self.graph.fanout_outs(spec.step) {
            let f = self.fanout[ei]
                .as_ref()
                .expect("a fan-out edge has its count");
            let n = match f.count {
                None => f.rows as i128,
                Some(c) => {
                    let off: usize = meta.outputs[..c].iter().map(|t| t.sample_bytes()).sum();
                    let t = &meta.outputs[c];
                    read_int(t.datatype, &out[off..off + t.sample_bytes()])
                }
            };
            if !(0..=f.rows as i128).contains(&n) {
                return Err(format!(
                    "model `{}` gave an item count of {n} for output `{}`, which has {} rows",
                    meta.name, meta.outputs[f.output].name, f.rows
                ));
            }
            v.push((ei, n as u32));
        }
        Ok(v)
    }

    /// Per application output, the rows of its tasks in item order.
    fn assemble(
        &self,
        order: &[Vec<TaskKey>],
        outs: &HashMap<TaskKey, Vec<u8>>,
    ) -> Vec<Vec<Vec<u8>>> {
        self.wiring
            .outputs
            .iter()
            .zip(order)
            .map(|(&(step, o), tasks)| {
                let meta = &self.models[step].1;
                let off: usize = meta.outputs[..o].iter().map(|t| t.sample_bytes()).sum();
                let n = meta.outputs[o].sample_bytes();
                tasks
                    .iter()
                    .map(|k| outs[k][off..off + n].to_vec())
                    .collect()
            })
            .collect()
    }

    /// The status and message of a request that did not end good: the module
    /// answer that ended it when there is one.
    fn fail_message(&self, o: Option<Outcome>, ender: Option<(TaskSpec, InferDone)>) -> AppFail {
        use hyper::StatusCode;
        let app = &self.meta.name;
        if let Some((spec, done)) = ender {
            let step = &self.config.steps[spec.step];
            let (mi, _) = &self.models[spec.step];
            let _ = mi;
            let code = super::http::errors::status_of(done.ended);
            let info = ModelInfo {
                slo: Dur(spec.deadline.0),
                ..self.info()
            };
            let msg = super::http::errors::failure_message(&info, done);
            let at = if spec.items.is_empty() {
                String::new()
            } else {
                format!(" item {:?}", spec.items)
            };
            return (
                code,
                format!(
                    "application `{app}`: step `{}` (model `{}`){at}: {msg}",
                    step.name, step.model
                ),
            );
        }
        match o {
            Some(Outcome::Late) => (
                StatusCode::GATEWAY_TIMEOUT,
                format!("application `{app}`: deadline exceeded: its last step finished after the application's deadline"),
            ),
            Some(Outcome::Failed { reason, .. }) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("application `{app}`: {reason}"),
            ),
            other => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("application `{app}`: ended as {other:?}"),
            ),
        }
    }
}

/// The mean fan-out a plan assumes on every fan-out edge before one was
/// measured: one item per parent output.
pub const PLANNED_FANOUT: f64 = 1.0;

/// Model `m`'s latency profile as the planner takes it: its batch sizes 1,
/// 2, 4, ... and its largest (at most `max_batch`), each with its latency (s);
/// empty when the profile cannot be read.
fn step_profile(m: &ModelInfo, max_batch: u32) -> StepProfile {
    let Ok(p) = crate::node::exec::profile_of(&m.profile) else {
        return Vec::new();
    };
    let max = p.max_batch().min(max_batch.max(1));
    let mut out = Vec::new();
    let mut b = 1u32;
    while b < max {
        out.push(b);
        b *= 2;
    }
    out.push(max);
    out.into_iter()
        .map(|b| (b, p.latency(b).as_secs_f64()))
        .filter(|&(_, l)| l > 0.0)
        .collect()
}

/// Whether a module request that ended as `e` expired (it could not finish by
/// its deadline) rather than failed.
fn expired(e: Ended) -> bool {
    matches!(
        e,
        Ended::Late
            | Ended::TimedOut
            | Ended::Dropped(DropReason::Expired | DropReason::EarlyDrop | DropReason::TooLate)
    )
}

/// A good answer that the application cannot use: failed with `why`.
fn failed_with(mut d: InferDone, why: String) -> InferDone {
    d.ended = Ended::Failed;
    d.message = why;
    d
}

/// One little-endian integer of type `dt` (the count tensor's).
fn read_int(dt: DType, b: &[u8]) -> i128 {
    let mut a = [0u8; 8];
    a[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    match dt {
        DType::I8 => a[0] as i8 as i128,
        DType::I16 => i16::from_le_bytes([a[0], a[1]]) as i128,
        DType::I32 => i32::from_le_bytes([a[0], a[1], a[2], a[3]]) as i128,
        DType::I64 => i64::from_le_bytes(a) as i128,
        DType::U8 => a[0] as i128,
        DType::U16 => u16::from_le_bytes([a[0], a[1]]) as i128,
        DType::U32 => u32::from_le_bytes([a[0], a[1], a[2], a[3]]) as i128,
        DType::U64 => u64::from_le_bytes(a) as i128,
        _ => -1,
    }
}

/// Runs each sample of one client request as its own application request,
/// all at once; their ends in order.
pub async fn run_samples(
    app: Arc<ServedApp>,
    fe: FrontendHandle,
    slo: Dur,
    samples: Vec<bytes::Bytes>,
    received: Instant,
) -> Result<Vec<Result<AppDone, AppFail>>, AppStopped> {
    let n = samples.len();
    let mut set = tokio::task::JoinSet::new();
    for (j, s) in samples.into_iter().enumerate() {
        let (app, fe) = (app.clone(), fe.clone());
        set.spawn(async move { (j, app.run(&fe, slo, &s, received).await) });
    }
    let mut out: Vec<Option<Result<AppDone, AppFail>>> = (0..n).map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        let (j, r) = r.map_err(|_| AppStopped)?;
        out[j] = Some(r?);
    }
    Ok(out
        .into_iter()
        .map(|r| r.expect("every sample ended"))
        .collect())
}

/// Resolves every ensemble of `configs` against the models served.
pub fn serve_apps(configs: &[EnsembleConfig], infos: &[ModelInfo]) -> Result<Vec<Arc<ServedApp>>> {
    let mut out: Vec<Arc<ServedApp>> = Vec::new();
    for c in configs {
        if infos.iter().any(|m| m.name == c.name) || out.iter().any(|a| a.meta.name == c.name) {
            bail!(
                "{}: the name {:?} is taken by a model or another application",
                c.file.display(),
                c.name
            );
        }
        out.push(Arc::new(ServedApp::new(c.clone(), infos)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_sample_is_the_run_against_the_profile_and_bounded() {
        // l(b) = 1 ms * b + 4 ms, up to 8.
        let p = LatencyProfile::linear_ms(1.0, 4.0, 8).unwrap();
        let ms = |x: f64| Duration::from_secs_f64(x / 1e3);
        assert_eq!(latency_sample(&p, ms(9.0), 2), Some((9_000_000, 6_000_000)));
        // Not run, outside the profile's batches, or beyond the bounds.
        assert_eq!(latency_sample(&p, ms(9.0), 0), None);
        assert_eq!(latency_sample(&p, ms(9.0), 9), None);
        assert_eq!(latency_sample(&p, Duration::ZERO, 2), None);
        assert_eq!(latency_sample(&p, ms(6.0 * 101.0), 2), None);
        assert_eq!(latency_sample(&p, ms(6.0 / 101.0), 2), None);
        assert!(latency_sample(&p, ms(600.0), 2).is_some());
        assert!(latency_sample(&p, Duration::from_secs(u64::MAX), 2).is_none());
    }
}
