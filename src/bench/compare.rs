//! Policies compared over workloads and seeds (`fermata bench compare`).
//!
//! One goodput search tells little about two policies a percent apart: on the
//! bursty workloads the same policy's goodput moves by 2-5% from one arrival seed
//! to the next, more than the policies differ. This runs the simulator's goodput
//! search for every (workload, policy, seed) and reports, per workload, each
//! policy's mean goodput and range over the seeds, and how the first policy (the
//! subject) compares with each other one: the ratio of the means and on how many
//! seeds the subject reached at least the other's goodput.

use super::{goodput_search, SearchOptions};
use crate::core::Policy;
use crate::sim::RunOptions;
use crate::workload::Workload;
use anyhow::{bail, Result};
use serde_json::{json, Value};

/// What to compare.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// The first is the subject; every other one is compared with it.
    pub policies: Vec<Policy>,
    /// Seeds per workload: the workload's own seed and the next `seeds - 1`.
    pub seeds: u32,
    pub search: SearchOptions,
}

/// One workload's results.
#[derive(Debug, Clone)]
pub struct WorkloadComparison {
    pub workload: String,
    pub seeds: Vec<u64>,
    /// `goodput[p][s]`: policy `p`'s goodput (r/s) on seed `s`.
    pub goodput: Vec<Vec<f64>>,
}

impl WorkloadComparison {
    pub fn mean(&self, p: usize) -> f64 {
        let g = &self.goodput[p];
        g.iter().sum::<f64>() / g.len().max(1) as f64
    }
    pub fn min(&self, p: usize) -> f64 {
        self.goodput[p]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }
    pub fn max(&self, p: usize) -> f64 {
        self.goodput[p].iter().copied().fold(0.0, f64::max)
    }
    /// The subject's mean over policy `p`'s mean.
    pub fn ratio(&self, p: usize) -> f64 {
        self.mean(0) / self.mean(p).max(1e-9)
    }
    /// Seeds on which the subject's goodput is at least policy `p`'s.
    pub fn wins(&self, p: usize) -> usize {
        self.goodput[0]
            .iter()
            .zip(&self.goodput[p])
            .filter(|(a, b)| a >= b)
            .count()
    }
}

/// Runs the comparison on each workload, with the run options the workload file
/// sets (its arrival process, warm-up and window) and its seed onwards.
pub fn compare(workloads: &[Workload], o: &CompareOptions) -> Result<Vec<WorkloadComparison>> {
    if o.policies.is_empty() {
        bail!("no policy to compare");
    }
    if o.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let mut out = Vec::new();
    for w in workloads {
        let base = RunOptions::from_workload(w);
        let seeds: Vec<u64> = (0..o.seeds as u64)
            .map(|k| base.seed.wrapping_add(k))
            .collect();
        let mut goodput = Vec::new();
        for &p in &o.policies {
            let mut row = Vec::new();
            for &seed in &seeds {
                let mut ro = base.clone();
                ro.policy = p;
                ro.seed = seed;
                row.push(goodput_search(w, &ro, &o.search).goodput_rps);
            }
            goodput.push(row);
        }
        out.push(WorkloadComparison {
            workload: w.name.clone(),
            seeds,
            goodput,
        });
    }
    Ok(out)
}

/// A table: one row per workload, each policy's mean goodput and range, then the
/// subject against each other policy (ratio of means, seeds won); a summary line
/// per other policy.
pub fn table(policies: &[Policy], rows: &[WorkloadComparison]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = write!(s, "{:<38}", "workload");
    for p in policies {
        let _ = write!(s, " {:>26}", format!("{} mean (min-max)", p.name()));
    }
    for p in &policies[1..] {
        let _ = write!(s, " {:>16}", format!("/{} (wins)", p.name()));
    }
    s.push('\n');
    for r in rows {
        let _ = write!(s, "{:<38}", r.workload);
        for p in 0..policies.len() {
            let _ = write!(
                s,
                " {:>26}",
                format!("{:.1} ({:.0}-{:.0})", r.mean(p), r.min(p), r.max(p))
            );
        }
        for p in 1..policies.len() {
            let _ = write!(
                s,
                " {:>16}",
                format!("{:.4} ({}/{})", r.ratio(p), r.wins(p), r.seeds.len())
            );
        }
        s.push('\n');
    }
    for (p, pol) in policies.iter().enumerate().skip(1) {
        let ahead = rows.iter().filter(|r| r.ratio(p) >= 1.0).count();
        let worst = rows
            .iter()
            .map(|r| (r.ratio(p), r.workload.as_str()))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let _ = write!(
            s,
            "{} >= {} on the mean over seeds on {ahead} of {} workload(s)",
            policies[0].name(),
            pol.name(),
            rows.len()
        );
        if let Some((r, w)) = worst {
            let _ = write!(s, "; lowest ratio {r:.4} ({w})");
        }
        s.push('\n');
    }
    s
}

/// The same as JSON: one object per workload.
pub fn json(policies: &[Policy], rows: &[WorkloadComparison]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                let per: Vec<Value> = policies
                    .iter()
                    .enumerate()
                    .map(|(p, pol)| {
                        json!({
                            "policy": pol.name(),
                            "goodput_rps": r.goodput[p],
                            "mean_rps": r.mean(p),
                            "min_rps": r.min(p),
                            "max_rps": r.max(p),
                            "subject_ratio": r.ratio(p),
                            "subject_wins": r.wins(p),
                        })
                    })
                    .collect();
                json!({
                    "workload": r.workload,
                    "seeds": r.seeds,
                    "subject": policies[0].name(),
                    "policies": per,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (workload, policy, seed) gets its own search: the seeds are the
    /// workload's and the next ones, the ratio and wins follow the goodputs, and a
    /// policy compared with itself is a tie on every seed.
    #[test]
    fn compares_each_policy_on_each_seed() {
        let w = Workload::from_toml(
            r#"
name = "tiny"
gpus = 2
arrival = "poisson"
rate_rps = 300
seed = 7
warmup_s = 0.5
duration_s = 2

[[models]]
name = "m"
alpha_ms = 1.0
beta_ms = 5.0
slo_ms = 40
"#,
            None,
        )
        .unwrap();
        let o = CompareOptions {
            policies: vec![Policy::Deferred, Policy::Eager, Policy::Deferred],
            seeds: 2,
            search: SearchOptions {
                rel_tolerance: 0.02,
                ..SearchOptions::default()
            },
        };
        let rows = compare(std::slice::from_ref(&w), &o).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r.seeds, vec![7, 8]);
        assert_eq!(r.goodput.len(), 3);
        assert!(r
            .goodput
            .iter()
            .all(|g| g.len() == 2 && g.iter().all(|&x| x > 0.0)));
        // The simulator is deterministic: the same policy twice is a tie.
        assert_eq!(r.goodput[0], r.goodput[2]);
        assert_eq!(r.ratio(2), 1.0);
        assert_eq!(r.wins(2), 2);
        let expect = r.mean(0) / r.mean(1);
        assert!((r.ratio(1) - expect).abs() < 1e-12);
        let t = table(&o.policies, &rows);
        assert!(t.contains("tiny"), "{t}");
        assert!(
            t.contains("deferred >= eager on the mean over seeds on"),
            "{t}"
        );
        let j = json(&o.policies, &rows);
        assert_eq!(j[0]["seeds"], serde_json::json!([7, 8]));
        assert_eq!(j[0]["policies"][1]["policy"], "eager");
        // Nothing to compare: a clear error.
        let none = CompareOptions {
            seeds: 0,
            ..o.clone()
        };
        assert!(compare(&[w], &none).is_err());
    }
}
