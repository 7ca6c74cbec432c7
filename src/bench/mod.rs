//! Benchmarks and reports: the goodput search, load sweeps (paper Fig. 2), the
//! eager-vs-deferred case study (Fig. 6a), the flat-top check (Section 3.5), tables,
//! JSON and SVG plots.

pub mod adapt;
pub mod apps;
pub mod autoscale;
pub mod cases;
pub mod compare;
pub mod copy;
pub mod fig15;
pub mod lanes;
pub mod nexus_fig16;
pub mod oracle;
pub mod partition;
pub mod planners;
pub mod plot;
pub mod scheduler;
pub mod slowdown;

use crate::core::Policy;
use crate::sim::{quantile_of_counts, simulate, RunOptions, RunResult};
use crate::workload::{Arrival, Workload};
use serde_json::{json, Value};

/// Bad-rate limit per model for a rate to count as goodput (1%).
pub const BAD_RATE_LIMIT: f64 = 0.01;

/// Settings of a goodput search.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    /// Stop when (hi - lo) / hi is below this.
    pub rel_tolerance: f64,
    pub max_trials: u32,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            rel_tolerance: 0.002,
            max_trials: 40,
        }
    }
}

/// One probed rate.
#[derive(Debug, Clone)]
pub struct Trial {
    pub rate_rps: f64,
    pub max_model_bad_rate: f64,
    pub ok: bool,
}

/// The outcome of a goodput search.
#[derive(Debug, Clone)]
pub struct GoodputResult {
    pub policy: Policy,
    pub arrival: Arrival,
    pub goodput_rps: f64,
    /// The run at the goodput rate (None when no rate passed).
    pub at_goodput: Option<RunResult>,
    pub trials: Vec<Trial>,
    pub sim_requests: u64,
    pub wall_secs: f64,
}

impl GoodputResult {
    pub fn sim_requests_per_sec(&self) -> f64 {
        self.sim_requests as f64 / self.wall_secs.max(1e-9)
    }
}

/// The throughput no schedule can beat: every GPU running every model at its largest
/// batch, weighted by the models' shares.
pub fn throughput_upper_bound(w: &Workload) -> f64 {
    let per_req_s: f64 = w
        .models
        .iter()
        .map(|m| {
            let b = m.spec.profile.max_batch();
            m.share * m.spec.profile.latency(b).as_secs_f64() / b as f64
        })
        .sum();
    w.gpus as f64 / per_req_s
}

/// Whether a run meets the goodput criterion: every model's bad rate <= 1%.
pub fn passes(r: &RunResult) -> bool {
    r.models.iter().all(|m| m.bad_rate() <= BAD_RATE_LIMIT)
}

/// Binary search for the highest aggregate rate at which every model's bad rate is at
/// most 1%, with warm-up and the workload's measured window (>= 20 s by default).
pub fn goodput_search(w: &Workload, base: &RunOptions, so: &SearchOptions) -> GoodputResult {
    goodput_search_with(w, base, so, |o| Ok(simulate(w, o))).expect("the simulator cannot fail")
}

/// The goodput search over any runner of one rate (the simulator, or the real-time
/// scheduler with fake backends).
pub fn goodput_search_with(
    w: &Workload,
    base: &RunOptions,
    so: &SearchOptions,
    mut run: impl FnMut(&RunOptions) -> anyhow::Result<RunResult>,
) -> anyhow::Result<GoodputResult> {
    let wall = std::time::Instant::now();
    let mut trials = Vec::new();
    let mut sim_requests = 0;
    let mut probe = |rate: f64, trials: &mut Vec<Trial>| -> anyhow::Result<RunResult> {
        let mut o = base.clone();
        o.rate_rps = rate;
        let r = run(&o)?;
        sim_requests += r.sim_requests;
        trials.push(Trial {
            rate_rps: rate,
            max_model_bad_rate: r.max_model_bad_rate(),
            ok: passes(&r),
        });
        Ok(r)
    };
    let mut lo = 0.0;
    let mut best: Option<RunResult> = None;
    let mut hi = throughput_upper_bound(w) * 1.05;
    // The bound should fail; if it passes (it cannot with exact profiles), grow it.
    for _ in 0..4 {
        let r = probe(hi, &mut trials)?;
        if passes(&r) {
            lo = hi;
            best = Some(r);
            hi *= 2.0;
        } else {
            break;
        }
    }
    while (trials.len() as u32) < so.max_trials && (hi - lo) / hi > so.rel_tolerance {
        let mid = 0.5 * (lo + hi);
        let r = probe(mid, &mut trials)?;
        if passes(&r) {
            lo = mid;
            best = Some(r);
        } else {
            hi = mid;
        }
    }
    Ok(GoodputResult {
        policy: base.policy,
        arrival: base.arrival,
        goodput_rps: lo,
        at_goodput: best,
        trials,
        sim_requests,
        wall_secs: wall.elapsed().as_secs_f64(),
    })
}

fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

/// JSON for a goodput search (the fields of `run_json` at the goodput rate, plus the
/// search itself).
pub fn goodput_json(w: &Workload, g: &GoodputResult) -> Value {
    let mut v = match &g.at_goodput {
        Some(r) => crate::run::run_json(w, r),
        None => json!({
            "workload": w.name, "policy": g.policy.name(), "bad_rate": 1.0,
            "batch_size_p50": 0, "batch_size_p99": 0, "gpu_busy_fraction": 0.0,
            "queuing_delay_ms_p99": 0.0, "per_model": [],
        }),
    };
    let o = v.as_object_mut().expect("object");
    o.insert("goodput_rps".into(), json!(round(g.goodput_rps, 2)));
    o.insert("arrival".into(), json!(g.arrival.to_string()));
    o.insert("gpus".into(), json!(w.gpus));
    o.insert(
        "upper_bound_rps".into(),
        json!(round(throughput_upper_bound(w), 2)),
    );
    o.insert("sim_requests".into(), json!(g.sim_requests));
    o.insert(
        "sim_requests_per_sec".into(),
        json!(round(g.sim_requests_per_sec(), 0)),
    );
    o.insert("search_wall_s".into(), json!(round(g.wall_secs, 3)));
    o.insert(
        "trials".into(),
        json!(g
            .trials
            .iter()
            .map(|t| json!({"rate_rps": round(t.rate_rps, 2), "max_model_bad_rate": round(t.max_model_bad_rate, 5), "ok": t.ok}))
            .collect::<Vec<_>>()),
    );
    v
}

/// A human-readable table of per-model results.
pub fn sim_table(r: &RunResult) -> String {
    let mut s = format!(
        "{:<24} {:>9} {:>9} {:>8} {:>8} {:>9} {:>6} {:>6} {:>10} {:>10}\n",
        "model",
        "offered",
        "good",
        "late",
        "dropped",
        "bad%",
        "bs50",
        "bs99",
        "qdelay50",
        "qdelay99"
    );
    for m in &r.models {
        s += &format!(
            "{:<24} {:>9} {:>9} {:>8} {:>8} {:>8.3}% {:>6} {:>6} {:>8.3}ms {:>8.3}ms\n",
            truncate(&m.name, 24),
            m.offered,
            m.good,
            m.late,
            m.dropped,
            100.0 * m.bad_rate(),
            m.batch_quantile(0.5),
            m.batch_quantile(0.99),
            m.queuing_us.value_at_quantile(0.5) as f64 / 1e3,
            m.queuing_us.value_at_quantile(0.99) as f64 / 1e3,
        );
    }
    let batches = r.batch_requests();
    s += &format!(
        "total: offered {} good {} bad {:.3}% | goodput {:.1} r/s | batch p50 {} p99 {}",
        r.offered(),
        r.good(),
        100.0 * r.bad_rate(),
        r.goodput_rps(),
        quantile_of_counts(&batches, 0.5),
        quantile_of_counts(&batches, 0.99),
    );
    // A live run measured at the clients (load generator) has no GPU busy times
    // and simulates nothing.
    if !r.gpu_busy.is_empty() {
        s += &format!(
            " | GPU busy {:.1}% | {:.2} M simulated req/s",
            100.0 * r.gpu_busy_fraction(),
            r.sim_requests_per_sec() / 1e6
        );
    }
    s.push('\n');
    s
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

/// The batch-size distribution as (label, fraction of requests) bins.
pub fn batch_bins(r: &RunResult) -> Vec<(String, f64)> {
    let c = r.batch_requests();
    let total: u64 = c.iter().sum();
    c.iter()
        .enumerate()
        .skip(1)
        .map(|(b, &n)| (b.to_string(), n as f64 / total.max(1) as f64))
        .collect()
}
