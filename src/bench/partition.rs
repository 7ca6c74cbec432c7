//! `fermata bench partition`: the epoch partitioner's MILP against the random
//! solver (Symphony Fig. 16), and a move-bounded re-partition after the rates drift.

use std::time::Duration;

use anyhow::Result;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use serde::Serialize;

use crate::plan::partition::{
    profile_catalogue, random_instance, solve_milp, solve_random, Instance, MilpOptions,
};

#[derive(Debug, Clone)]
pub struct PartitionBenchOpts {
    pub instances: usize,
    pub models: usize,
    pub subclusters: usize,
    pub time_limit: Duration,
    /// Mean of the exponential rate distribution (requests/s per model).
    pub mean_rps: f64,
    /// The profiles' GPU the memory footprints come from (1080ti or a100).
    pub gpu: String,
    pub seed: u64,
    /// The move bound of the re-partition (models); 0: no re-partition step.
    pub max_moves: usize,
    /// Log-normal drift of each model's rate between the two epochs (sigma).
    pub drift: f64,
    /// Give HiGHS the greedy + local-search incumbent (false: HiGHS alone).
    pub warm_start: bool,
}

/// One instance's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceRow {
    pub seed: u64,
    pub milp_load_imbalance: f64,
    pub milp_memory_imbalance: f64,
    pub milp_solve_s: f64,
    pub milp_status: String,
    /// ΔR + w·ΔS of HiGHS's incumbent (greedy + local search) and of its answer.
    pub milp_start_objective: Option<f64>,
    pub milp_objective: f64,
    pub random_load_imbalance: f64,
    pub random_memory_imbalance: f64,
    pub random_tries: u64,
    pub milp_wins: bool,
    /// After the drift: the move-bounded re-partition...
    pub repart_moves: Option<usize>,
    pub repart_load_imbalance: Option<f64>,
    pub repart_memory_imbalance: Option<f64>,
    pub repart_solve_s: Option<f64>,
    /// ...the drifted rates left where they were (no move)...
    pub stay_load_imbalance: Option<f64>,
    /// ...and an unconstrained solve of the same drifted instance.
    pub free_load_imbalance: Option<f64>,
    pub free_memory_imbalance: Option<f64>,
    pub free_moves: Option<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    pub instances: usize,
    pub models: usize,
    pub subclusters: usize,
    pub time_limit_s: f64,
    /// Fraction of instances where the MILP's imbalance is lower than the random
    /// solver's for load and for memory both.
    pub milp_wins_fraction: f64,
    pub milp_wins_load_fraction: f64,
    pub milp_wins_memory_fraction: f64,
    /// The longest MILP solve (s), the time to build the model included.
    pub max_solve_s: f64,
    pub median_milp_load_imbalance: f64,
    pub median_milp_memory_imbalance: f64,
    pub median_random_load_imbalance: f64,
    pub median_random_memory_imbalance: f64,
    pub max_moves: usize,
    /// Re-partitions whose moves stayed within the bound.
    pub repart_within_bound_fraction: Option<f64>,
    /// Re-partitions whose load and memory imbalance are each at most the
    /// unconstrained solve's plus 10% of the average (imbalance is a fraction of
    /// the average, so 0.10).
    pub repart_within_10pct_fraction: Option<f64>,
    pub median_repart_load_imbalance: Option<f64>,
    pub median_free_load_imbalance: Option<f64>,
    pub median_stay_load_imbalance: Option<f64>,
    pub median_free_moves: Option<f64>,
    pub rows: Vec<InstanceRow>,
}

pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The drifted copy of an instance: every rate times exp(N(0, sigma)).
fn drifted(inst: &Instance, sigma: f64, seed: u64) -> Instance {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x5eed_d51f);
    let n = Normal::new(0.0, sigma).unwrap();
    let mut out = inst.clone();
    for m in &mut out.models {
        m.rate_rps *= n.sample(&mut rng).exp();
    }
    out
}

/// Runs the comparison; `progress` sees each instance's row as it completes.
pub fn run(
    o: &PartitionBenchOpts,
    mut progress: impl FnMut(&InstanceRow),
) -> Result<PartitionReport> {
    if o.instances == 0 || o.models == 0 || o.subclusters == 0 {
        anyhow::bail!("--instances, --models and --subclusters must be at least 1");
    }
    if !(o.drift.is_finite() && o.drift >= 0.0) {
        anyhow::bail!("--drift must be >= 0");
    }
    let catalogue = profile_catalogue(&o.gpu)?;
    let milp_opts = MilpOptions {
        time_limit: o.time_limit,
        warm_start: o.warm_start,
        ..Default::default()
    };
    let mut rows = Vec::new();
    for k in 0..o.instances {
        let seed = o.seed + k as u64;
        let inst = random_instance(o.models, o.subclusters, o.mean_rps, &catalogue, seed);
        let m = solve_milp(&inst, &milp_opts)?;
        let r = solve_random(&inst, o.time_limit, seed)?;
        let mut row = InstanceRow {
            seed,
            milp_load_imbalance: m.eval.load_imbalance,
            milp_memory_imbalance: m.eval.memory_imbalance,
            milp_solve_s: m.solve_s,
            milp_status: m.status.clone(),
            milp_start_objective: m.start_objective,
            milp_objective: m.eval.objective,
            random_load_imbalance: r.eval.load_imbalance,
            random_memory_imbalance: r.eval.memory_imbalance,
            random_tries: r.tries,
            milp_wins: m.eval.load_imbalance < r.eval.load_imbalance
                && m.eval.memory_imbalance < r.eval.memory_imbalance,
            repart_moves: None,
            repart_load_imbalance: None,
            repart_memory_imbalance: None,
            repart_solve_s: None,
            stay_load_imbalance: None,
            free_load_imbalance: None,
            free_memory_imbalance: None,
            free_moves: None,
        };
        if o.max_moves > 0 {
            let mut next = drifted(&inst, o.drift, seed);
            next.current = Some(m.assignment.iter().map(|&j| Some(j)).collect());
            let stay = next.evaluate(&m.assignment);
            let free = solve_milp(
                &Instance {
                    current: None,
                    max_moves: None,
                    ..next.clone()
                },
                &milp_opts,
            )?;
            next.max_moves = Some(o.max_moves);
            let rp = solve_milp(&next, &milp_opts)?;
            row.repart_moves = Some(rp.eval.moves);
            row.repart_load_imbalance = Some(rp.eval.load_imbalance);
            row.repart_memory_imbalance = Some(rp.eval.memory_imbalance);
            row.repart_solve_s = Some(rp.solve_s);
            row.stay_load_imbalance = Some(stay.load_imbalance);
            row.free_load_imbalance = Some(free.eval.load_imbalance);
            row.free_memory_imbalance = Some(free.eval.memory_imbalance);
            row.free_moves = Some(next.moves(&free.assignment));
        }
        progress(&row);
        rows.push(row);
    }
    let n = rows.len() as f64;
    let frac = |f: &dyn Fn(&InstanceRow) -> bool| rows.iter().filter(|r| f(r)).count() as f64 / n;
    let med = |f: &dyn Fn(&InstanceRow) -> f64| median(&mut rows.iter().map(f).collect::<Vec<_>>());
    let opt_med = |f: &dyn Fn(&InstanceRow) -> Option<f64>| {
        let mut v: Vec<f64> = rows.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    let rep = o.max_moves > 0;
    Ok(PartitionReport {
        instances: rows.len(),
        models: o.models,
        subclusters: o.subclusters,
        time_limit_s: o.time_limit.as_secs_f64(),
        milp_wins_fraction: frac(&|r| r.milp_wins),
        milp_wins_load_fraction: frac(&|r| r.milp_load_imbalance < r.random_load_imbalance),
        milp_wins_memory_fraction: frac(&|r| r.milp_memory_imbalance < r.random_memory_imbalance),
        max_solve_s: rows
            .iter()
            .flat_map(|r| [Some(r.milp_solve_s), r.repart_solve_s])
            .flatten()
            .fold(0.0, f64::max),
        median_milp_load_imbalance: med(&|r| r.milp_load_imbalance),
        median_milp_memory_imbalance: med(&|r| r.milp_memory_imbalance),
        median_random_load_imbalance: med(&|r| r.random_load_imbalance),
        median_random_memory_imbalance: med(&|r| r.random_memory_imbalance),
        max_moves: o.max_moves,
        repart_within_bound_fraction: rep
            .then(|| frac(&|r| r.repart_moves.is_some_and(|m| m <= o.max_moves))),
        repart_within_10pct_fraction: rep.then(|| {
            frac(&|r| {
                r.repart_load_imbalance.unwrap() <= r.free_load_imbalance.unwrap() + 0.10
                    && r.repart_memory_imbalance.unwrap() <= r.free_memory_imbalance.unwrap() + 0.10
            })
        }),
        median_repart_load_imbalance: opt_med(&|r| r.repart_load_imbalance),
        median_free_load_imbalance: opt_med(&|r| r.free_load_imbalance),
        median_stay_load_imbalance: opt_med(&|r| r.stay_load_imbalance),
        median_free_moves: opt_med(&|r| r.free_moves.map(|m| m as f64)),
        rows,
    })
}

/// The empirical CDF of `v` as (value, fraction ≤ value) points.
pub fn cdf(v: &[f64]) -> Vec<(f64, f64)> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len() as f64;
    s.iter()
        .enumerate()
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bench_runs_and_counts() {
        let o = PartitionBenchOpts {
            instances: 2,
            models: 30,
            subclusters: 3,
            time_limit: Duration::from_millis(300),
            mean_rps: 100.0,
            gpu: "1080ti".into(),
            seed: 1,
            max_moves: 3,
            drift: 0.3,
            warm_start: true,
        };
        let r = run(&o, |_| {}).unwrap();
        assert_eq!(r.rows.len(), 2);
        for row in &r.rows {
            assert!(row.repart_moves.unwrap() <= 3);
        }
        assert_eq!(r.repart_within_bound_fraction, Some(1.0));
        let c = cdf(&[3.0, 1.0, 2.0]);
        assert_eq!(c, vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]);
    }
}
