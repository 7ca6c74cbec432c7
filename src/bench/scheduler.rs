//! The scheduler-only stress benchmark (`fermata bench scheduler`): the real-time
//! scheduler with in-process fake frontends and backends, as in Section 5.5 of the
//! Symphony paper. M equally popular models, G emulated GPUs, a Poisson load of R
//! requests/s; reports whether the rate is sustained (load generator lag p99 < 2 ms and
//! bad rate < 1%), lag, decision latency, dispatch error and CPU use.

use crate::harness::fake::{run_realtime, RtOptions, RtRun};
use crate::sim::RunOptions;
use crate::workload::Workload;
use anyhow::{bail, Result};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Lag p99 limit for a rate to count as sustained.
pub const LAG_P99_LIMIT_US: f64 = 2_000.0;
/// Bad-rate limit for a rate to count as sustained.
pub const BAD_RATE_LIMIT: f64 = 0.01;

/// Settings of the stress benchmark.
#[derive(Debug, Clone)]
pub struct StressOptions {
    pub models: u32,
    pub gpus: u32,
    /// A profile "gpu/Model" of configs/profiles/model_profiles.csv.
    pub profile: String,
    /// SLO override (default: the profile's).
    pub slo_ms: Option<f64>,
    /// The scheduler's control-message budget d_ctrl (the in-process "network").
    pub ctrl_us: f64,
    pub policy: String,
    pub arrival: String,
    pub seed: u64,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub rt: RtOptions,
}

impl Default for StressOptions {
    fn default() -> Self {
        StressOptions {
            models: 64,
            gpus: 1024,
            profile: "a100/ResNet50V2".into(),
            slo_ms: None,
            ctrl_us: 200.0,
            policy: "deferred".into(),
            arrival: "poisson".into(),
            seed: 1,
            warmup_s: 1.0,
            duration_s: 5.0,
            rt: RtOptions::default(),
        }
    }
}

/// The synthetic workload of the stress test.
pub fn stress_workload(o: &StressOptions, rate_rps: f64) -> Result<Workload> {
    if o.models == 0 || o.gpus == 0 {
        bail!("--models and --gpus must be at least 1");
    }
    if !(rate_rps >= 0.0 && rate_rps.is_finite()) {
        bail!("--rate must be a finite number >= 0, got {rate_rps}");
    }
    let slo = o
        .slo_ms
        .map(|s| format!("slo_ms = {s}\n"))
        .unwrap_or_default();
    let text = format!(
        "name = \"stress_{m}m_{g}g\"\ngpus = {g}\narrival = \"{arr}\"\nrate_rps = {rate}\n\
         policy = \"{pol}\"\nseed = {seed}\nwarmup_s = {wu}\nduration_s = {du}\n\
         [network]\nctrl_us = {ctrl}\n\
         [[models]]\nname = \"m\"\nprofile = \"{prof}\"\ncopies = {m}\n{slo}",
        m = o.models,
        g = o.gpus,
        arr = o.arrival,
        rate = rate_rps.max(1.0),
        pol = o.policy,
        seed = o.seed,
        wu = o.warmup_s,
        du = o.duration_s,
        ctrl = o.ctrl_us,
        prof = o.profile,
    );
    Workload::from_toml(&text, None)
}

/// One stress run.
pub fn stress_run(o: &StressOptions, rate_rps: f64) -> Result<RtRun> {
    let w = stress_workload(o, rate_rps)?;
    let mut so = RunOptions::from_workload(&w);
    so.rate_rps = rate_rps;
    run_realtime(&w, &so, &o.rt)
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1e3
    }
}

/// Whether a run sustained its rate.
pub fn sustained(r: &RtRun) -> bool {
    us(&r.lag_ns, 0.99) < LAG_P99_LIMIT_US
        && r.sim.bad_rate() < BAD_RATE_LIMIT
        && r.unended == 0
        && r.duplicates == 0
        && r.backend.overlaps == 0
}

fn round(x: f64, d: i32) -> f64 {
    let k = 10f64.powi(d);
    (x * k).round() / k
}

/// The JSON report of one run.
pub fn run_json(o: &StressOptions, rate: f64, r: &RtRun) -> Value {
    let dec = r.scheduler.decision_ns();
    let dis = r.scheduler.dispatch_error_ns();
    let threads: Vec<Value> = r
        .scheduler
        .threads
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "cpu_s": round(t.cpu.as_secs_f64(), 3),
                "requests": t.requests,
                "plans": t.plans,
                "passes": t.passes,
                "parks": t.parks,
            })
        })
        .collect();
    let batches = r.sim.batch_requests();
    json!({
        "models": o.models,
        "gpus": o.gpus,
        "threads": o.rt.model_threads,
        "profile": o.profile,
        "policy": o.policy,
        "rate_rps": rate,
        "offered_rps": round(r.generated as f64 / r.gen_secs.max(1e-9), 0),
        "sustained": sustained(r),
        "lag_us_p50": round(us(&r.lag_ns, 0.5), 1),
        "lag_us_p99": round(us(&r.lag_ns, 0.99), 1),
        "lag_us_max": round(r.lag_ns.max() as f64 / 1e3, 1),
        "decision_us_p50": round(us(&dec, 0.5), 2),
        "decision_us_p99": round(us(&dec, 0.99), 2),
        "dispatch_error_us_p50": round(us(&dis, 0.5), 2),
        "dispatch_error_us_p99": round(us(&dis, 0.99), 2),
        "bad_rate": round(r.sim.bad_rate(), 5),
        "goodput_rps": round(r.sim.goodput_rps(), 0),
        "batch_p50": crate::sim::quantile_of_counts(&batches, 0.5),
        "requests": r.generated,
        "refused": r.refused,
        "failed": r.failed,
        "unended": r.unended,
        "duplicates": r.duplicates,
        "gpu_overlaps": r.backend.overlaps,
        "late_starts": r.backend.late_starts,
        "plans": r.backend.plans,
        "scheduler_cpu_s": round(r.scheduler.cpu().as_secs_f64(), 3),
        "scheduler_cores": round(r.scheduler_cores(), 3),
        "fake_world_cpu_s": round((r.generator_cpu + r.backend.cpu).as_secs_f64(), 3),
        "process_cpu_s": round(r.process_cpu.as_secs_f64(), 3),
        "wall_s": round(r.wall_secs, 3),
        "thread_cpu": threads,
    })
}

/// A one-line human summary of a run.
pub fn run_line(rate: f64, r: &RtRun) -> String {
    let dec = r.scheduler.decision_ns();
    let dis = r.scheduler.dispatch_error_ns();
    format!(
        "rate {:>10.0} r/s  offered {:>10.0}  {}  lag p50/p99/max {:.0}/{:.0}/{:.0} us  \
         decision p50/p99 {:.1}/{:.1} us  dispatch err p50/p99 {:.1}/{:.1} us  bad {:.3}%  \
         sched cpu {:.2} cores  process cpu {:.2}s/{:.2}s",
        rate,
        r.generated as f64 / r.gen_secs.max(1e-9),
        if sustained(r) {
            "SUSTAINED"
        } else {
            "not sustained"
        },
        us(&r.lag_ns, 0.5),
        us(&r.lag_ns, 0.99),
        r.lag_ns.max() as f64 / 1e3,
        us(&dec, 0.5),
        us(&dec, 0.99),
        us(&dis, 0.5),
        us(&dis, 0.99),
        100.0 * r.sim.bad_rate(),
        r.scheduler_cores(),
        r.process_cpu.as_secs_f64(),
        r.wall_secs,
    )
}

/// The outcome of `--find-max`.
pub struct FindMax {
    pub max_sustained_rps: f64,
    pub probes: Vec<(f64, bool, Value)>,
    /// The run at half the max rate (latency figures are quoted there).
    pub at_half: Option<(f64, Value)>,
}

/// Searches the highest sustained rate: doubling from `start`, then bisection to
/// `tolerance` (relative).
pub fn find_max(
    o: &StressOptions,
    start: f64,
    tolerance: f64,
    mut log: impl FnMut(&str),
) -> Result<FindMax> {
    let mut probes = Vec::new();
    let mut probe = |rate: f64, probes: &mut Vec<(f64, bool, Value)>| -> Result<bool> {
        let r = stress_run(o, rate)?;
        let ok = sustained(&r);
        log(&run_line(rate, &r));
        probes.push((rate, ok, run_json(o, rate, &r)));
        Ok(ok)
    };
    let (mut lo, mut hi) = (0.0, start);
    while probe(hi, &mut probes)? {
        lo = hi;
        hi *= 2.0;
        if hi > 64e6 {
            break;
        }
    }
    while lo > 0.0 && (hi - lo) / hi > tolerance {
        let mid = 0.5 * (lo + hi);
        if probe(mid, &mut probes)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo == 0.0 {
        // Even the start failed: bisect downwards a few times.
        let mut r = start;
        for _ in 0..6 {
            r *= 0.5;
            if probe(r, &mut probes)? {
                lo = r;
                break;
            }
        }
    }
    let at_half = if lo > 0.0 {
        let r = stress_run(o, lo * 0.5)?;
        log(&format!("half max: {}", run_line(lo * 0.5, &r)));
        Some((lo * 0.5, run_json(o, lo * 0.5, &r)))
    } else {
        None
    };
    Ok(FindMax {
        max_sustained_rps: lo,
        probes,
        at_half,
    })
}

/// Idle run: no load for `secs`; returns the scheduler's CPU use in cores.
pub fn idle_cores(o: &StressOptions, secs: f64) -> Result<f64> {
    let mut oo = o.clone();
    oo.warmup_s = 0.0;
    oo.duration_s = secs;
    let r = stress_run(&oo, 0.0)?;
    Ok(r.scheduler.cpu().as_secs_f64() / r.wall_secs.max(1e-9))
}
