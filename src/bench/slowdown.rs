//! A model that becomes slower than its profile mid-run, served in process
//! (scheduler, backends and frontends as threads over the in-process
//! transport, on emulated GPUs with `--emulated-slowdown`): the share of bad
//! requests after the scheduler had time to measure it, with the scheduler's
//! latency scaling on or off ([`crate::node::proto::latency_scale`]).
//! `fermata bench slowdown` prints both; `tests/latency_rescale.rs` checks
//! that scaling keeps the requests good and that without it they go late.

use crate::core::Dur;
use crate::harness::loadgen::LoadgenOpts;
use crate::node::exec::slowdown::Slowdown;
use crate::node::proto::latency_scale::{LatencyScaleConfig, LatencyScaleStats};
use crate::node::serve::{serve, ClusterOpts};
use crate::transport::{inproc::InProc, Transport};
use crate::workload::Workload;
use anyhow::Result;
use std::sync::Arc;
use std::time::Duration;

/// The default workload: one model, l(b) = 1 ms·b + 4 ms up to 32, SLO
/// 40 ms, on one GPU. At 350 r/s the GPU is busy enough that many deferred
/// batches wait for their latest start, so a batch that runs 1.5x its
/// profile ends past its head's deadline unless it was planned so; planned
/// with 1.5x, the GPU still keeps up.
pub const WORKLOAD: &str = r#"
name = "slowdown"
gpus = 1
rate_rps = 350
[[models]]
name = "m"
alpha_ms = 1.0
beta_ms = 4.0
slo_ms = 40
max_batch = 32
input_bytes = 64
"#;

/// One run's settings.
#[derive(Debug, Clone)]
pub struct SlowdownOpts {
    /// The workload (default [`WORKLOAD`]); its first model is slowed.
    pub workload: Workload,
    pub rate_rps: f64,
    /// The slowdown: factor, and when from the cluster's start (s).
    pub factor: f64,
    pub slow_at_s: f64,
    /// Requests arriving in the `settle_s` after it are not counted; the
    /// `measure_s` after those are.
    pub settle_s: f64,
    pub measure_s: f64,
    pub latency: LatencyScaleConfig,
    /// The in-process transport's host name (distinct per concurrent run).
    pub host: String,
    pub seed: u64,
}

impl SlowdownOpts {
    pub fn new(latency: LatencyScaleConfig) -> Result<SlowdownOpts> {
        Ok(SlowdownOpts {
            workload: Workload::from_toml(WORKLOAD, None)?,
            rate_rps: 350.0,
            factor: 1.5,
            slow_at_s: 1.0,
            settle_s: 1.0,
            measure_s: 3.0,
            latency,
            host: "slowdown".into(),
            seed: 1,
        })
    }
}

/// What one run measured, over the requests that arrived in the measured
/// window.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlowdownRun {
    pub rescale: bool,
    pub offered: u64,
    pub good: u64,
    /// Bad (late, dropped, failed or unanswered) over offered.
    pub bad: f64,
    pub failed: u64,
    pub unanswered: u64,
    /// The slowed model's latency scale at the end, and what the scheduler
    /// measured of all models' batches.
    pub scale: f64,
    pub latency: LatencyScaleStats,
    /// Tasks the backends finished past their deadline (whole run).
    pub sched_late: u64,
}

/// Serves `o.workload` in process with its first model slowed by `o.factor`
/// from `o.slow_at_s` on.
pub fn run(o: &SlowdownOpts) -> Result<SlowdownRun> {
    let w = &o.workload;
    let model = w
        .models
        .first()
        .ok_or_else(|| anyhow::anyhow!("the workload has no model"))?
        .spec
        .name
        .clone();
    let co = ClusterOpts {
        host: o.host.clone(),
        region_bytes: 64 << 20,
        latency: o.latency,
        emulated_slowdown: vec![Slowdown {
            model: model.clone(),
            factor: o.factor,
            after: Duration::from_secs_f64(o.slow_at_s),
        }],
        ..ClusterOpts::default()
    };
    let mut lo = LoadgenOpts::new(Vec::new(), w);
    lo.rate_rps = o.rate_rps;
    lo.seed = o.seed;
    // The load starts once the cluster is up, after the slowdown's clock
    // started: its warm-up ends at least `settle_s` after the slowdown.
    lo.warmup = Dur::from_secs_f64(o.slow_at_s + o.settle_s);
    lo.duration = Dur::from_secs_f64(o.measure_s);
    lo.drain = Duration::from_secs(2);
    let tr: Arc<dyn Transport> = Arc::new(InProc::global());
    let r = serve(tr, w, &co, &lo)?;
    let offered = r.load.sim.offered();
    let good = r.load.sim.good();
    let bad = r.load.sim.bad_rate();
    let s = &r.cluster.scheduler;
    Ok(SlowdownRun {
        rescale: o.latency.enabled,
        offered,
        good,
        bad,
        failed: r.load.failed,
        unanswered: r.load.unanswered,
        scale: s.model_latency_scale.get(&model).copied().unwrap_or(1.0),
        latency: s.latency,
        sched_late: s.tasks_late,
    })
}
