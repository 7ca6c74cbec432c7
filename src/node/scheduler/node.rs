//! [`SchedulerNode`], a running scheduler process: start-up (the real-time
//! scheduler and its configuration, the protocol machine, the metrics, the
//! listener and the event loop's thread) and stop.

use super::epoch::{self, EpochPlanner};
use super::event_loop::EventLoop;
use super::metrics::{
    register_autoscale_metrics, register_gpu_metrics, AutoscaleView, BusySnaps, SchedMetrics,
};
use super::options::SchedulerOpts;
use super::repo_poll;
use super::routes::Routes;
use super::standby::{Standby, StandbyStatus};
use crate::core::{Dur, ModelSpec, NetBudget};
use crate::metrics::Registry;
use crate::node::clock::SchedClock;
use crate::node::proto::control::ControlMode;
use crate::node::proto::sched::{SchedConfig, SchedProto, SchedReport};
use crate::node::proto::subclusters::SubClusters;
use crate::plan::partition::PartModel;
use crate::runtime::clock::Clock;
use crate::runtime::sched::{RtConfig, RtScheduler};
use crate::transport::Transport;
use crate::wire::ModelInfo;
use crate::workload::Workload;
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A running scheduler process (its event loop thread and the real-time scheduler).
pub struct SchedulerNode {
    addr: String,
    standby: Option<Arc<StandbyStatus>>,
    metrics: Arc<Registry>,
    autoscale: Arc<Mutex<AutoscaleView>>,
    stop: Arc<AtomicBool>,
    stepped_down: Arc<Mutex<Option<String>>>,
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
        check_policy(workload)?;
        let clock = Clock::new();
        let (rcfg, floors) = rt_config(workload, &opts);
        let specs: Vec<ModelSpec> = workload.models.iter().map(|m| m.spec.clone()).collect();
        let models = crate::node::exec::model_infos(workload);
        let part_models = partition_models(workload);
        let model_types: Vec<Option<String>> =
            workload.models.iter().map(|m| m.gpu_type.clone()).collect();
        let homes = epoch::initial(&part_models, &model_types, &opts.epoch)?;
        let subs = SubClusters::new(opts.epoch.subclusters, homes.clone())
            .and_then(|s| s.with_types(opts.epoch.types.clone()))
            .map_err(|e| anyhow::anyhow!(e))?;
        if subs.count() > 1 {
            tracing::info!(subclusters = subs.count(), homes = ?homes, "scheduler: models' sub-clusters");
        }
        let mut proto = SchedProto::new(
            SchedClock::exact(clock).now(),
            sched_config(&opts, models.clone(), floors, subs),
        );
        let loaded = model_control(&opts.control, &models)?;
        proto.set_model_control(opts.control.mode, &loaded);
        let registry = Registry::new();
        let metrics = SchedMetrics::new(&registry, &models);
        let routes = Arc::new(Routes::new(proto.plans(), clock, metrics));
        let busy: BusySnaps = Arc::new(Mutex::new(Vec::new()));
        register_gpu_metrics(&registry, busy.clone());
        let autoscale = Arc::new(Mutex::new(AutoscaleView::default()));
        register_autoscale_metrics(&registry, autoscale.clone());
        // One real-time scheduler (a RankThread and its ModelThreads) per
        // sub-cluster, sharing the plan id space.
        let n = opts.epoch.subclusters;
        let rts = (0..n)
            .map(|j| {
                let mut c = rcfg.clone();
                c.plan_ids = (j, n);
                RtScheduler::start(c, specs.clone(), routes.clone(), clock)
            })
            .collect::<Result<Vec<_>>>()?;
        let _ = routes
            .reporters
            .set(rts.iter().map(|rt| rt.gpu_reporter()).collect());
        let (tx, rx) = crate::node::event_channel(&registry, "scheduler");
        let (standby, status) = match &opts.standby_of {
            Some(primary) => {
                let status = Arc::new(StandbyStatus::default());
                let sb = Standby::follow(
                    SchedClock::exact(clock).now(),
                    primary,
                    transport.clone(),
                    tx.clone(),
                    opts.heartbeat,
                    status.clone(),
                )?;
                (Some(sb), Some(status))
            }
            None => (None, None),
        };
        let listener = transport.listen(&opts.listen, tx)?;
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let planner = EpochPlanner::new(opts.epoch.clone(), std::time::Instant::now());
        let stepped_down = Arc::new(Mutex::new(None));
        let mut ev = EventLoop::new(
            rts,
            routes,
            SchedClock::exact(clock),
            proto,
            busy,
            listener,
            standby,
            (autoscale.clone(), opts.advice),
            (planner, part_models),
            workload.models.iter().map(|m| m.spec.clone()).collect(),
            stepped_down.clone(),
        );
        if let (ControlMode::Poll, Some(dir)) = (opts.control.mode, &opts.control.repository) {
            let names = models.iter().map(|m| m.name.clone()).collect();
            let every = opts.control.poll_every;
            ev.poll_repository(repo_poll::spawn(dir.clone(), names, every, stop.clone())?);
        }
        let submitter = ev.submitters();
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("sched-net".into())
            .spawn(move || ev.run(rx, submitter, &stop2))?;
        Ok(SchedulerNode {
            addr,
            standby: status,
            metrics: registry,
            autoscale,
            stop,
            stepped_down,
            handle: Some(handle),
        })
    }

    /// Where nodes connect.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// A standby's state (None: started as a primary).
    pub fn standby(&self) -> Option<&StandbyStatus> {
        self.standby.as_deref()
    }

    /// Why it stepped down, once a scheduler of a newer term replaced it
    /// (its event loop has ended then: it serves no more; the process
    /// should stop). See [`crate::node::proto::sched`].
    pub fn stepped_down(&self) -> Option<String> {
        self.stepped_down.lock().expect("step-down lock").clone()
    }

    /// The scheduler's Prometheus metrics.
    pub fn metrics(&self) -> Arc<Registry> {
        self.metrics.clone()
    }

    /// The autoscaling signals and advice, as JSON (refreshed every second);
    /// what `GET /v1/autoscale` answers.
    pub fn autoscale_json(&self) -> impl Fn() -> String + Send + Sync + 'static {
        let v = self.autoscale.clone();
        move || serde_json::to_string(&*v.lock().expect("autoscale lock")).unwrap_or_default()
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

/// The distributed runtime runs the policies of the real-time scheduler only.
fn check_policy(workload: &Workload) -> Result<()> {
    if matches!(
        workload.policy,
        crate::core::Policy::Nexus | crate::core::Policy::Shepherd { .. }
    ) {
        anyhow::bail!(
            "policy `{}` is simulator-only; the distributed runtime runs deferred, symphony, eager or timeout",
            workload.policy
        );
    }
    Ok(())
}

/// The real-time scheduler's configuration (no GPUs until backends register),
/// and the workload's network budget: the floors under the measured one.
fn rt_config(workload: &Workload, opts: &SchedulerOpts) -> (RtConfig, NetBudget) {
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
    (rcfg, floors)
}

/// The protocol machine's configuration.
fn sched_config(
    opts: &SchedulerOpts,
    models: Vec<ModelInfo>,
    floors: NetBudget,
    subclusters: SubClusters,
) -> SchedConfig {
    SchedConfig {
        subclusters,
        models,
        heartbeat: Dur(opts.heartbeat.as_nanos() as i64),
        node_timeout: Dur(opts.node_timeout.as_nanos() as i64),
        plan_grace: Dur(opts.plan_grace.as_nanos() as i64),
        net_update: Dur(opts.net_update.as_nanos() as i64),
        floors,
        max_ctrl: opts.max_ctrl,
        max_data: opts.max_data,
        max_margin: opts.max_margin,
        limits: opts.limits,
        latency: opts.latency,
    }
}

/// The models as the epoch partitioner sees them: the workload's rates, and
/// memory from the workload file or the paper's profiles; a model with neither
/// counts 0 MB until a backend measures it (then only rates are balanced).
/// The models `--load-model` names (by id), checked against the mode.
fn model_control(
    c: &super::options::ModelControlOpts,
    models: &[crate::wire::ModelInfo],
) -> Result<Vec<crate::core::ModelId>> {
    if c.mode != ControlMode::Explicit && !c.load.is_empty() {
        anyhow::bail!("--load-model needs --model-control-mode explicit");
    }
    if c.mode == ControlMode::Poll && c.repository.is_none() {
        anyhow::bail!(
            "--model-control-mode poll needs a model repository to look at: serve one with --models DIR"
        );
    }
    c.load
        .iter()
        .map(|name| {
            models
                .iter()
                .find(|m| &m.name == name)
                .map(|m| m.id)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--load-model {name:?}: no such model (served: {})",
                        models
                            .iter()
                            .map(|m| m.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        })
        .collect()
}

fn partition_models(workload: &Workload) -> Vec<PartModel> {
    crate::plan::partition::models_of_workload(workload).unwrap_or_else(|_| {
        workload
            .models
            .iter()
            .map(|m| PartModel {
                name: m.spec.name.clone(),
                rate_rps: m.share * workload.rate_rps,
                memory_mb: m.memory_mb.unwrap_or(0.0),
                dynamic_memory_mb: m.dynamic_memory_mb.unwrap_or(0.0),
            })
            .collect()
    })
}
