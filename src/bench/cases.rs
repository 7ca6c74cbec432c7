//! Case studies from the Symphony paper: Fig. 6a (eager vs deferred as the batching
//! effect grows) and the flat-top behaviour of Section 3.5.

use super::{goodput_search, SearchOptions};
use crate::core::Policy;
use crate::sim::{simulate, RunOptions};
use crate::workload::Workload;
use anyhow::Result;
use serde_json::{json, Value};

/// The Fig. 6a workload: 10 models with alpha = 1 ms and the given beta, SLO = 2 l(8),
/// 32 GPUs, Poisson arrivals, equal popularity.
pub fn fig6a_workload(beta_ms: f64) -> Workload {
    let slo = 2.0 * (8.0 + beta_ms);
    let toml = format!(
        "name = \"fig6a_beta{beta_ms}\"\ngpus = 32\narrival = \"poisson\"\nwarmup_s = 2\nduration_s = 20\n\
         [[models]]\nname = \"m\"\nalpha_ms = 1.0\nbeta_ms = {beta_ms}\nslo_ms = {slo}\ncopies = 10\n"
    );
    Workload::from_toml(&toml, None).expect("valid built-in workload")
}

/// Eager's goodput divided by deferred's for beta in {1, 5, 10, 15} ms.
pub fn fig6a_rows(seed: u64) -> Vec<Value> {
    let mut rows = Vec::new();
    for beta in [1.0, 5.0, 10.0, 15.0] {
        let w = fig6a_workload(beta);
        let mut o = RunOptions::from_workload(&w);
        o.seed = seed;
        let so = SearchOptions::default();
        o.policy = Policy::Deferred;
        let d = goodput_search(&w, &o, &so);
        o.policy = Policy::Eager;
        let e = goodput_search(&w, &o, &so);
        rows.push(json!({
            "beta_ms": beta,
            "slo_ms": 2.0 * (8.0 + beta),
            "deferred_goodput_rps": d.goodput_rps,
            "eager_goodput_rps": e.goodput_rps,
            "eager_over_deferred": e.goodput_rps / d.goodput_rps.max(1e-9),
        }));
    }
    rows
}

pub fn fig6a(seed: u64, as_json: bool) -> Result<()> {
    let rows = fig6a_rows(seed);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("Fig. 6a: 10 models, 32 GPUs, alpha 1 ms, SLO 2*l(8), Poisson");
        for r in &rows {
            println!(
                "beta {:>4} ms: deferred {:>9.1} r/s  eager {:>9.1} r/s  eager/deferred {:.3}",
                r["beta_ms"],
                r["deferred_goodput_rps"].as_f64().unwrap_or(0.0),
                r["eager_goodput_rps"].as_f64().unwrap_or(0.0),
                r["eager_over_deferred"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}

/// Section 3.5: find the goodput p, then run at 1.5 p (goodput should stay near p)
/// and at 0.3 p (the GPU idle fraction should be near (p - o) / p = 0.7, with the
/// idle time on the highest-id GPUs).
pub fn flattop(w: &Workload, base: &RunOptions) -> Value {
    let g = goodput_search(w, base, &SearchOptions::default());
    let p = g.goodput_rps;
    let mut o = base.clone();
    o.rate_rps = 1.5 * p;
    let over = simulate(w, &o);
    o.rate_rps = 0.3 * p;
    let under = simulate(w, &o);
    let idle: Vec<f64> = under.gpu_busy.iter().map(|b| 1.0 - b).collect();
    let mean_idle = idle.iter().sum::<f64>() / idle.len().max(1) as f64;
    let n = idle.len();
    let upper_half_idle: f64 = idle[n / 2..].iter().sum::<f64>();
    let total_idle: f64 = idle.iter().sum::<f64>();
    json!({
        "workload": w.name,
        "policy": base.policy.name(),
        "goodput_rps": p,
        "overload_rate_rps": 1.5 * p,
        "overload_goodput_rps": over.goodput_rps(),
        "overload_goodput_over_peak": over.goodput_rps() / p.max(1e-9),
        "underload_rate_rps": 0.3 * p,
        "underload_bad_rate": under.bad_rate(),
        "underload_mean_idle_fraction": mean_idle,
        "expected_idle_fraction": 0.7,
        "idle_fraction_error": (mean_idle - 0.7).abs(),
        "underload_idle_per_gpu": idle,
        "idle_share_on_upper_half_gpus": upper_half_idle / total_idle.max(1e-9),
    })
}
