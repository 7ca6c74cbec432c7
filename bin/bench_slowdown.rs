//! `fermata bench slowdown`: a model slowed mid-run on emulated GPUs, served
//! in process, with the scheduler's latency scaling on and off.

use anyhow::{bail, Result};
use clap::Args;
use fermata::bench::slowdown::{run, SlowdownOpts, SlowdownRun};
use fermata::node::proto::latency_scale::LatencyScaleConfig;
use std::path::PathBuf;

/// `fermata bench slowdown`: bad % in the window after a model became K
/// times slower than its profile, with `--latency-rescale` on and off.
#[derive(Args)]
pub struct SlowdownArgs {
    /// Workload file (its first model is slowed; default: one model, l(b) =
    /// 1 ms·b + 4 ms, SLO 40 ms, on one GPU).
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Offered load (requests/s).
    #[arg(long, default_value_t = 350.0)]
    rate: f64,
    /// The slowdown factor K.
    #[arg(long, default_value_t = 1.5)]
    factor: f64,
    /// When the model slows, from the cluster's start (s).
    #[arg(long, default_value_t = 1.0)]
    slow_at_s: f64,
    /// Requests arriving this long after the slowdown are not counted (s).
    #[arg(long, default_value_t = 1.0)]
    settle_s: f64,
    /// The measured window after those (s).
    #[arg(long, default_value_t = 3.0)]
    measure_s: f64,
    /// Runs of each (on, off in turn); the medians are printed.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn cmd_bench_slowdown(a: SlowdownArgs) -> Result<()> {
    if !(1..=50).contains(&a.runs) {
        bail!("--runs must be 1 to 50");
    }
    let ok = |v: f64, lo: f64, hi: f64| v.is_finite() && (lo..=hi).contains(&v);
    if !ok(a.rate, 1.0, 1e6)
        || !ok(a.factor, 0.05, 20.0)
        || !ok(a.slow_at_s, 0.0, 600.0)
        || !ok(a.settle_s, 0.0, 600.0)
        || !ok(a.measure_s, 0.1, 3600.0)
    {
        bail!("need --rate 1..1e6, --factor 0.05..20, --slow-at-s and --settle-s 0..600, --measure-s 0.1..3600");
    }
    let mut base = SlowdownOpts::new(LatencyScaleConfig::default())?;
    if let Some(p) = &a.workload {
        base.workload = fermata::workload::Workload::from_file(p)?;
    }
    base.rate_rps = a.rate;
    base.factor = a.factor;
    base.slow_at_s = a.slow_at_s;
    base.settle_s = a.settle_s;
    base.measure_s = a.measure_s;
    let mut runs: Vec<SlowdownRun> = Vec::new();
    for i in 0..a.runs {
        for on in [true, false] {
            let o = SlowdownOpts {
                latency: if on {
                    LatencyScaleConfig::default()
                } else {
                    LatencyScaleConfig::off()
                },
                host: format!("slowdown{i}{on}"),
                seed: a.seed + u64::from(i),
                ..base.clone()
            };
            let r = run(&o)?;
            if !a.json {
                println!(
                    "run {i} rescale {:3}: offered {:5} good {:5} bad {:6.2}% (unanswered {}, failed {}) scale {:.2} batches measured {} (untrusted {}, scale changes {})",
                    if on { "on" } else { "off" },
                    r.offered,
                    r.good,
                    100.0 * r.bad,
                    r.unanswered,
                    r.failed,
                    r.scale,
                    r.latency.samples,
                    r.latency.absurd,
                    r.latency.changes
                );
            }
            runs.push(r);
        }
    }
    let med = |on: bool| {
        median(
            runs.iter()
                .filter(|r| r.rescale == on)
                .map(|r| r.bad)
                .collect(),
        )
    };
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "factor": a.factor,
                "rate_rps": a.rate,
                "bad_on_median": med(true),
                "bad_off_median": med(false),
                "runs": runs,
            })
        );
    } else {
        println!(
            "median bad over the window {:.1}-{:.1} s after a {}x slowdown at {} r/s: rescale on {:.2}%, off {:.2}% ({} runs each)",
            a.settle_s,
            a.settle_s + a.measure_s,
            a.factor,
            a.rate,
            100.0 * med(true),
            100.0 * med(false),
            a.runs
        );
    }
    Ok(())
}
