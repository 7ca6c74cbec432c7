//! The epoch partitioner: which sub-cluster serves each model (Symphony Section 4.4
//! and Appendix A).
//!
//! Every epoch the models are split over L sub-clusters so that request rate and
//! static memory are balanced. Appendix A's MILP, with x_ij = 1 when model i is in
//! sub-cluster j, r_i its rate, s_i its static memory and d_i its largest dynamic
//! memory (activations of its largest batch):
//!
//! ```text
//! minimise   ΔR + w·ΔS
//! subject to Σ_i r_i x_ij ≤ R_max                      (rate bound)
//!            Σ_i s_i x_ij + max_i d_i x_ij ≤ S_max       (memory bound)
//!            |Σ_i r_i x_ij − R̄| ≤ ΔR,  |Σ_i s_i x_ij − S̄| ≤ ΔS
//!            Σ_j x_ij = 1                               (one sub-cluster each)
//!            Σ_ij c_ij |x_ij − x'_ij| ≤ C_max           (moves, equation 10)
//! ```
//!
//! R̄ and S̄ are the averages (Σ r / L, Σ s / L). Here rates and memory are divided
//! by those averages, so ΔR and ΔS are fractions of the average and the weight w
//! trades one relative deviation against the other. The max over d_i is
//! linearised with one variable D_j ≥ d_i x_ij per sub-cluster. With a current
//! assignment x' the move term is linear without the paper's y_ij (x' is a
//! constant): a model that leaves its sub-cluster adds 1 − x_ij; `max_moves` bounds
//! the number of models that change sub-cluster (each is one load and one unload).
//!
//! [`solve_milp`] hands that model to HiGHS (the `highs` crate) with a time limit
//! and a greedy incumbent (largest-first placement, or the current assignment),
//! returning the best solution found when the limit strikes. [`solve_random`] is
//! the baseline: random assignments for the same time, the best feasible one kept.
//! [`explain_infeasible`] names the constraint that cannot hold.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One model to place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartModel {
    pub name: String,
    /// Request rate (requests/s).
    pub rate_rps: f64,
    /// Static memory on a GPU: weights and buffers that stay loaded (MB).
    pub memory_mb: f64,
    /// Dynamic memory of its largest batch (activations, workspace) (MB).
    #[serde(default)]
    pub dynamic_memory_mb: f64,
}

/// A partitioning instance.
#[derive(Debug, Clone)]
pub struct Instance {
    pub models: Vec<PartModel>,
    /// L, the number of sub-clusters.
    pub subclusters: usize,
    /// R_max: the most requests/s one sub-cluster may take (infinite: no bound).
    pub rate_max_rps: f64,
    /// S_max: a GPU's memory for models (MB; infinite: no bound).
    pub memory_max_mb: f64,
    /// w: the weight of memory balance against rate balance.
    pub weight: f64,
    /// The current assignment (sub-cluster of each model; None: a model not placed
    /// yet, which may go anywhere without counting as a move).
    pub current: Option<Vec<Option<usize>>>,
    /// C_max: how many placed models may change sub-cluster (with `current`).
    pub max_moves: Option<usize>,
}

/// Which constraint made an instance infeasible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    RateBound,
    MemoryBound,
    MoveBound,
    /// No single constraint: the rate and memory bounds (and the move bound)
    /// together.
    Combined,
}

/// Why no assignment satisfies the instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Infeasible {
    pub constraint: Constraint,
    pub reason: String,
}

impl std::fmt::Display for Infeasible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.constraint {
            Constraint::RateBound => "rate bound (R_max)",
            Constraint::MemoryBound => "memory bound (S_max)",
            Constraint::MoveBound => "move bound (C_max, --max-moves)",
            Constraint::Combined => "rate, memory and move bounds together",
        };
        write!(f, "infeasible: the {name} cannot hold: {}", self.reason)
    }
}

impl std::error::Error for Infeasible {}

/// An assignment judged against its instance.
#[derive(Debug, Clone, Serialize)]
pub struct Eval {
    /// Requests/s per sub-cluster.
    pub load_rps: Vec<f64>,
    /// Static memory per sub-cluster (MB).
    pub static_mb: Vec<f64>,
    /// Static plus the largest dynamic memory per sub-cluster (MB): what a GPU needs.
    pub gpu_mb: Vec<f64>,
    /// (max − min) / avg of the load.
    pub load_imbalance: f64,
    /// (max − min) / avg of the static memory.
    pub memory_imbalance: f64,
    /// ΔR + w·ΔS, each a fraction of its average.
    pub objective: f64,
    /// Placed models that changed sub-cluster (with a current assignment).
    pub moves: usize,
    /// The first constraint the assignment breaks, if any.
    pub violation: Option<String>,
}

/// How a solve ended.
#[derive(Debug, Clone, Serialize)]
pub struct Solution {
    pub solver: &'static str,
    /// Sub-cluster of each model, in the instance's order.
    pub assignment: Vec<usize>,
    pub eval: Eval,
    /// "optimal", "time limit", "gap reached", ...
    pub status: String,
    pub solve_s: f64,
    /// Candidates the random solver drew (0 for the MILP).
    pub tries: u64,
    /// The objective of the incumbent HiGHS started from (greedy placement or the
    /// current assignment, then local search); None without one.
    pub start_objective: Option<f64>,
}

fn imbalance(v: &[f64]) -> f64 {
    let n = v.len() as f64;
    let sum: f64 = v.iter().sum();
    if sum <= 0.0 {
        return 0.0;
    }
    let max = v.iter().cloned().fold(f64::MIN, f64::max);
    let min = v.iter().cloned().fold(f64::MAX, f64::min);
    (max - min) / (sum / n)
}

impl Instance {
    /// Checks the instance itself: numbers, names, the current assignment.
    pub fn validate(&self) -> Result<()> {
        if self.subclusters == 0 {
            bail!("the number of sub-clusters must be at least 1");
        }
        if self.subclusters > 4096 {
            bail!("at most 4096 sub-clusters (got {})", self.subclusters);
        }
        if self.models.is_empty() {
            bail!("no models to partition");
        }
        if self.models.len() > 100_000 {
            bail!("at most 100000 models (got {})", self.models.len());
        }
        let mut names = std::collections::HashSet::new();
        for m in &self.models {
            if m.name.is_empty() {
                bail!("a model has an empty name");
            }
            if !names.insert(m.name.as_str()) {
                bail!("model {:?} is listed twice", m.name);
            }
            for (what, v) in [
                ("rate_rps", m.rate_rps),
                ("memory_mb", m.memory_mb),
                ("dynamic_memory_mb", m.dynamic_memory_mb),
            ] {
                if !v.is_finite() || v < 0.0 {
                    bail!(
                        "model {:?}: {what} must be a finite number >= 0 (got {v})",
                        m.name
                    );
                }
            }
        }
        if self.models.iter().all(|m| m.rate_rps == 0.0) {
            bail!("every model's rate is 0: nothing to balance");
        }
        for (what, v) in [
            ("rate_max_rps", self.rate_max_rps),
            ("memory_max_mb", self.memory_max_mb),
        ] {
            if v.is_nan() || v <= 0.0 {
                bail!("{what} must be > 0 (got {v})");
            }
        }
        if !self.weight.is_finite() || self.weight < 0.0 {
            bail!(
                "the memory weight w must be a finite number >= 0 (got {})",
                self.weight
            );
        }
        if let Some(cur) = &self.current {
            if cur.len() != self.models.len() {
                bail!(
                    "the current assignment has {} entries for {} models",
                    cur.len(),
                    self.models.len()
                );
            }
            for (m, j) in self.models.iter().zip(cur) {
                if let Some(j) = j {
                    if *j >= self.subclusters {
                        bail!(
                            "the current assignment puts {:?} in sub-cluster {j}, but there are {} (0..{})",
                            m.name,
                            self.subclusters,
                            self.subclusters - 1
                        );
                    }
                }
            }
        }
        if self.max_moves.is_some() && self.current.is_none() {
            bail!("a move bound (--max-moves) needs the current assignment (--current)");
        }
        Ok(())
    }

    fn scales(&self) -> (f64, f64) {
        let l = self.subclusters as f64;
        let r_avg = self.models.iter().map(|m| m.rate_rps).sum::<f64>() / l;
        let s_avg = self.models.iter().map(|m| m.memory_mb).sum::<f64>() / l;
        (r_avg.max(f64::MIN_POSITIVE), s_avg.max(f64::MIN_POSITIVE))
    }

    /// Judges an assignment (sub-cluster per model).
    pub fn evaluate(&self, a: &[usize]) -> Eval {
        let l = self.subclusters;
        let mut load = vec![0.0; l];
        let mut st = vec![0.0; l];
        let mut dy = vec![0.0f64; l];
        for (m, &j) in self.models.iter().zip(a) {
            load[j] += m.rate_rps;
            st[j] += m.memory_mb;
            dy[j] = dy[j].max(m.dynamic_memory_mb);
        }
        let gpu: Vec<f64> = st.iter().zip(&dy).map(|(s, d)| s + d).collect();
        let (r_avg, s_avg) = self.scales();
        let dr = load.iter().map(|x| (x - r_avg).abs()).fold(0.0, f64::max) / r_avg;
        let ds = st.iter().map(|x| (x - s_avg).abs()).fold(0.0, f64::max) / s_avg;
        let moves = self.moves(a);
        let mut violation = None;
        if let Some(j) = (0..l).find(|&j| load[j] > self.rate_max_rps * (1.0 + 1e-9)) {
            violation = Some(format!(
                "sub-cluster {j} takes {:.1} r/s > R_max {:.1}",
                load[j], self.rate_max_rps
            ));
        } else if let Some(j) = (0..l).find(|&j| gpu[j] > self.memory_max_mb * (1.0 + 1e-9)) {
            violation = Some(format!(
                "sub-cluster {j} needs {:.1} MB > S_max {:.1}",
                gpu[j], self.memory_max_mb
            ));
        } else if let Some(c) = self.max_moves.filter(|&c| moves > c) {
            violation = Some(format!("{moves} moves > C_max {c}"));
        }
        Eval {
            load_imbalance: imbalance(&load),
            memory_imbalance: imbalance(&st),
            load_rps: load,
            static_mb: st,
            gpu_mb: gpu,
            objective: dr + self.weight * ds,
            moves,
            violation,
        }
    }

    /// Placed models whose sub-cluster differs from the current assignment.
    pub fn moves(&self, a: &[usize]) -> usize {
        match &self.current {
            None => 0,
            Some(cur) => cur
                .iter()
                .zip(a)
                .filter(|(c, &j)| matches!(c, Some(c) if *c != j))
                .count(),
        }
    }
}

/// The checks that need no solver: one model or the total beyond a bound, or a
/// current assignment whose overfull sub-clusters need more moves than allowed.
pub fn precheck(inst: &Instance) -> Option<Infeasible> {
    let l = inst.subclusters as f64;
    let total_r: f64 = inst.models.iter().map(|m| m.rate_rps).sum();
    if let Some(m) = inst.models.iter().find(|m| m.rate_rps > inst.rate_max_rps) {
        return Some(Infeasible {
            constraint: Constraint::RateBound,
            reason: format!(
                "model {:?} alone takes {} r/s, more than R_max = {} r/s of one sub-cluster",
                m.name, m.rate_rps, inst.rate_max_rps
            ),
        });
    }
    if total_r > l * inst.rate_max_rps {
        return Some(Infeasible {
            constraint: Constraint::RateBound,
            reason: format!(
                "the models take {total_r:.1} r/s in all, more than {} sub-clusters x R_max {} = {:.1} r/s",
                inst.subclusters,
                inst.rate_max_rps,
                l * inst.rate_max_rps
            ),
        });
    }
    if let Some(m) = inst
        .models
        .iter()
        .find(|m| m.memory_mb + m.dynamic_memory_mb > inst.memory_max_mb)
    {
        return Some(Infeasible {
            constraint: Constraint::MemoryBound,
            reason: format!(
                "model {:?} alone needs {} MB static + {} MB dynamic, more than S_max = {} MB",
                m.name, m.memory_mb, m.dynamic_memory_mb, inst.memory_max_mb
            ),
        });
    }
    let total_s: f64 = inst.models.iter().map(|m| m.memory_mb).sum();
    if total_s > l * inst.memory_max_mb {
        return Some(Infeasible {
            constraint: Constraint::MemoryBound,
            reason: format!(
                "the models' static memory is {total_s:.1} MB in all, more than {} sub-clusters x S_max {} = {:.1} MB",
                inst.subclusters,
                inst.memory_max_mb,
                l * inst.memory_max_mb
            ),
        });
    }
    if let (Some(cur), Some(c)) = (&inst.current, inst.max_moves) {
        // Each overfull sub-cluster must shed models; the fewest it can shed is
        // its largest ones first. Their sum is a lower bound on the moves.
        let mut need = 0usize;
        let mut worst = None;
        for j in 0..inst.subclusters {
            let members: Vec<&PartModel> = inst
                .models
                .iter()
                .zip(cur)
                .filter(|(_, c)| **c == Some(j))
                .map(|(m, _)| m)
                .collect();
            let shed = |key: &dyn Fn(&PartModel) -> f64, excess: f64| -> usize {
                if excess <= 0.0 {
                    return 0;
                }
                let mut v: Vec<f64> = members.iter().map(|m| key(m)).collect();
                v.sort_by(|a, b| b.total_cmp(a));
                let mut got = 0.0;
                let mut n = 0;
                for x in v {
                    if got >= excess {
                        break;
                    }
                    got += x;
                    n += 1;
                }
                n
            };
            let r: f64 = members.iter().map(|m| m.rate_rps).sum();
            let s: f64 = members.iter().map(|m| m.memory_mb).sum();
            let d = members
                .iter()
                .map(|m| m.dynamic_memory_mb)
                .fold(0.0, f64::max);
            let nr = shed(&|m| m.rate_rps, r - inst.rate_max_rps);
            // Shedding static memory alone (the dynamic maximum may fall too, so
            // count against S_max minus the smallest possible max: 0).
            let ns = shed(&|m| m.memory_mb, s + d - inst.memory_max_mb - d);
            let n = nr.max(ns);
            if n > 0 {
                worst = Some((j, n, nr >= ns));
            }
            need += n;
        }
        if need > c {
            let (j, n, rate) = worst.unwrap();
            return Some(Infeasible {
                constraint: Constraint::MoveBound,
                reason: format!(
                    "the current assignment breaks the {} bound: its overfull sub-clusters must shed at least {need} models (sub-cluster {j}: {n}), more than C_max = {c} moves",
                    if rate { "rate" } else { "memory" }
                ),
            });
        }
    }
    None
}

/// Improves a feasible assignment by single moves and pairwise swaps until none
/// helps or `deadline` passes, keeping every bound (the move bound counted against
/// the current assignment). It descends on Σ_j (R_j − 1)² + w·Σ_j (S_j − 1)² (rate
/// and static memory relative to their averages), which pulls every sub-cluster
/// toward the average and so the largest deviation with it; a step that would
/// raise the true objective ΔR + w·ΔS is not taken. Written here rather than
/// left to the solver: HiGHS's branch and bound, facing L symmetric sub-clusters,
/// improves a rough incumbent slowly, and this gives it a close one in
/// milliseconds.
pub fn local_search(inst: &Instance, a: &mut [usize], deadline: Instant) {
    let n = inst.models.len();
    let l = inst.subclusters;
    let (r_avg, s_avg) = inst.scales();
    let w = inst.weight;
    let r: Vec<f64> = inst.models.iter().map(|m| m.rate_rps / r_avg).collect();
    let sm: Vec<f64> = inst.models.iter().map(|m| m.memory_mb / s_avg).collect();
    let rmax = inst.rate_max_rps / r_avg;
    let smax = inst.memory_max_mb / s_avg;
    let dy: Vec<f64> = inst
        .models
        .iter()
        .map(|m| m.dynamic_memory_mb / s_avg)
        .collect();
    let mut load = vec![0.0; l];
    let mut st = vec![0.0; l];
    for i in 0..n {
        load[a[i]] += r[i];
        st[a[i]] += sm[i];
    }
    // The largest dynamic memory per sub-cluster, recomputed after each step.
    let dmax = |a: &[usize], j: usize| {
        (0..n)
            .filter(|&i| a[i] == j)
            .map(|i| dy[i])
            .fold(0.0, f64::max)
    };
    let mut dm: Vec<f64> = (0..l).map(|j| dmax(a, j)).collect();
    let cur: Option<Vec<Option<usize>>> = inst.current.clone();
    let limit = inst.max_moves.unwrap_or(usize::MAX);
    let mut moves = inst.moves(a);
    let moved = |i: usize, j: usize| matches!(&cur, Some(c) if matches!(c[i], Some(c) if c != j));
    let objective = |load: &[f64], st: &[f64]| {
        let dr = load.iter().map(|x| (x - 1.0).abs()).fold(0.0, f64::max);
        let ds = st.iter().map(|x| (x - 1.0).abs()).fold(0.0, f64::max);
        dr + w * ds
    };
    let sq = |x: f64| (x - 1.0) * (x - 1.0);
    let mut obj = objective(&load, &st);
    let eps = 1e-12;
    loop {
        let mut improved = false;
        // Single moves.
        for i in 0..n {
            let from = a[i];
            let mut best: Option<(f64, usize)> = None;
            for to in 0..l {
                if to == from {
                    continue;
                }
                let nl = load[to] + r[i];
                if nl > rmax + eps || st[to] + sm[i] + dm[to].max(dy[i]) > smax + eps {
                    continue;
                }
                let dmv = moves as i64 - moved(i, from) as i64 + moved(i, to) as i64;
                if dmv as usize > limit {
                    continue;
                }
                let delta = sq(load[from] - r[i]) + sq(nl) - sq(load[from]) - sq(load[to])
                    + w * (sq(st[from] - sm[i]) + sq(st[to] + sm[i]) - sq(st[from]) - sq(st[to]));
                if delta < -eps && best.is_none_or(|(b, _)| delta < b) {
                    best = Some((delta, to));
                }
            }
            if let Some((_, to)) = best {
                load[from] -= r[i];
                st[from] -= sm[i];
                load[to] += r[i];
                st[to] += sm[i];
                let o = objective(&load, &st);
                if o > obj + eps {
                    load[from] += r[i];
                    st[from] += sm[i];
                    load[to] -= r[i];
                    st[to] -= sm[i];
                    continue;
                }
                obj = o;
                moves = (moves as i64 - moved(i, from) as i64 + moved(i, to) as i64) as usize;
                a[i] = to;
                dm[from] = dmax(a, from);
                dm[to] = dm[to].max(dy[i]);
                improved = true;
            }
            if i.is_multiple_of(64) && Instant::now() >= deadline {
                return;
            }
        }
        // Pairwise swaps.
        for i in 0..n {
            if Instant::now() >= deadline {
                return;
            }
            for k in (i + 1)..n {
                let (p, q) = (a[i], a[k]);
                if p == q {
                    continue;
                }
                let dr = r[k] - r[i];
                let ds = sm[k] - sm[i];
                let delta = sq(load[p] + dr) + sq(load[q] - dr) - sq(load[p]) - sq(load[q])
                    + w * (sq(st[p] + ds) + sq(st[q] - ds) - sq(st[p]) - sq(st[q]));
                if delta >= -eps {
                    continue;
                }
                if load[p] + dr > rmax + eps
                    || load[q] - dr > rmax + eps
                    || st[p] + ds + dm[p].max(dy[k]) > smax + eps
                    || st[q] - ds + dm[q].max(dy[i]) > smax + eps
                {
                    continue;
                }
                let dmv = moves as i64 - moved(i, p) as i64 - moved(k, q) as i64
                    + moved(i, q) as i64
                    + moved(k, p) as i64;
                if dmv as usize > limit {
                    continue;
                }
                load[p] += dr;
                load[q] -= dr;
                st[p] += ds;
                st[q] -= ds;
                let o = objective(&load, &st);
                if o > obj + eps {
                    load[p] -= dr;
                    load[q] += dr;
                    st[p] -= ds;
                    st[q] += ds;
                    continue;
                }
                obj = o;
                moves = dmv as usize;
                a[i] = q;
                a[k] = p;
                dm[p] = dmax(a, p);
                dm[q] = dmax(a, q);
                improved = true;
            }
        }
        if !improved {
            return;
        }
    }
}

/// Largest-first placement: each model (by rate + w·memory, both relative, largest
/// first) goes to the sub-cluster where the objective grows least, among those
/// whose bounds still hold. None when it paints itself into a corner.
pub fn greedy(inst: &Instance) -> Option<Vec<usize>> {
    let l = inst.subclusters;
    let (r_avg, s_avg) = inst.scales();
    let mut order: Vec<usize> = (0..inst.models.len()).collect();
    let key = |i: usize| {
        let m = &inst.models[i];
        m.rate_rps / r_avg + inst.weight * m.memory_mb / s_avg
    };
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
    let mut load = vec![0.0; l];
    let mut st = vec![0.0; l];
    let mut dy = vec![0.0f64; l];
    let mut a = vec![usize::MAX; inst.models.len()];
    for i in order {
        let m = &inst.models[i];
        let mut best: Option<(f64, usize)> = None;
        for j in 0..l {
            let nl = load[j] + m.rate_rps;
            let ns = st[j] + m.memory_mb;
            if nl > inst.rate_max_rps || ns + dy[j].max(m.dynamic_memory_mb) > inst.memory_max_mb {
                continue;
            }
            // Fill the emptiest (relative) sub-cluster: the increase of the largest
            // relative sum it would produce.
            let score = nl / r_avg + inst.weight * ns / s_avg;
            if best.is_none_or(|(b, _)| score < b) {
                best = Some((score, j));
            }
        }
        let (_, j) = best?;
        a[i] = j;
        load[j] += m.rate_rps;
        st[j] += m.memory_mb;
        dy[j] = dy[j].max(m.dynamic_memory_mb);
    }
    Some(a)
}

/// The current assignment with new models placed greedily (a feasible start for a
/// move-bounded re-partition when it keeps the bounds).
fn current_completed(inst: &Instance) -> Option<Vec<usize>> {
    let cur = inst.current.as_ref()?;
    let l = inst.subclusters;
    let (r_avg, s_avg) = inst.scales();
    let mut a: Vec<usize> = cur.iter().map(|c| c.unwrap_or(usize::MAX)).collect();
    let mut load = vec![0.0; l];
    let mut st = vec![0.0; l];
    for (m, &j) in inst.models.iter().zip(&a) {
        if j != usize::MAX {
            load[j] += m.rate_rps;
            st[j] += m.memory_mb;
        }
    }
    for (ai, m) in a.iter_mut().zip(&inst.models) {
        if *ai == usize::MAX {
            let j = (0..l)
                .min_by(|&x, &y| {
                    let fx = load[x] / r_avg + inst.weight * st[x] / s_avg;
                    let fy = load[y] / r_avg + inst.weight * st[y] / s_avg;
                    fx.total_cmp(&fy)
                })
                .unwrap();
            *ai = j;
            load[j] += m.rate_rps;
            st[j] += m.memory_mb;
        }
    }
    Some(a)
}

/// The most x_ij the MILP is built with (models × sub-clusters): bounds the
/// model's memory (a few hundred bytes per variable in HiGHS).
pub const MAX_BINARIES: usize = 2_000_000;

/// Options of the MILP solve.
#[derive(Debug, Clone)]
pub struct MilpOptions {
    pub time_limit: Duration,
    /// Stop once the objective (ΔR + w·ΔS) is this close to the solver's lower
    /// bound (absolute; the bound is 0 for a perfectly divisible instance).
    pub abs_gap: f64,
    /// Give HiGHS the greedy (or current) assignment as its first incumbent.
    pub warm_start: bool,
    pub threads: Option<u32>,
}

impl Default for MilpOptions {
    fn default() -> Self {
        MilpOptions {
            time_limit: Duration::from_secs(10),
            abs_gap: 1e-3,
            warm_start: true,
            threads: None,
        }
    }
}

/// The HiGHS model of an instance; columns: x (n·L, model-major), D (L, when the
/// memory bound is finite), ΔR, ΔS.
struct Built {
    problem: highs::RowProblem,
    n: usize,
    l: usize,
    has_d: bool,
}

fn build(inst: &Instance, drop: Option<Constraint>) -> Built {
    use highs::RowProblem;
    let n = inst.models.len();
    let l = inst.subclusters;
    let (r_avg, s_avg) = inst.scales();
    let rate_bound = drop != Some(Constraint::RateBound) && inst.rate_max_rps.is_finite();
    let mem_bound = drop != Some(Constraint::MemoryBound) && inst.memory_max_mb.is_finite();
    let move_bound = drop != Some(Constraint::MoveBound);
    let mut pb = RowProblem::default();
    let x: Vec<highs::Col> = (0..n * l)
        .map(|_| pb.add_integer_column(0.0, 0..=1))
        .collect();
    let d: Vec<highs::Col> = if mem_bound {
        (0..l).map(|_| pb.add_column(0.0, 0.0..)).collect()
    } else {
        Vec::new()
    };
    let dr = pb.add_column(1.0, 0.0..);
    let ds = pb.add_column(inst.weight, 0.0..);
    // Each model in exactly one sub-cluster.
    for i in 0..n {
        let row: Vec<(highs::Col, f64)> = (0..l).map(|j| (x[i * l + j], 1.0)).collect();
        pb.add_row(1.0..=1.0, &row);
    }
    for j in 0..l {
        let rate: Vec<(highs::Col, f64)> = (0..n)
            .filter(|&i| inst.models[i].rate_rps > 0.0)
            .map(|i| (x[i * l + j], inst.models[i].rate_rps / r_avg))
            .collect();
        let mem: Vec<(highs::Col, f64)> = (0..n)
            .filter(|&i| inst.models[i].memory_mb > 0.0)
            .map(|i| (x[i * l + j], inst.models[i].memory_mb / s_avg))
            .collect();
        if rate_bound {
            pb.add_row(..=inst.rate_max_rps / r_avg, &rate);
        }
        // |R_j − 1| ≤ ΔR (relative): R_j − ΔR ≤ 1 and R_j + ΔR ≥ 1.
        let mut up = rate.clone();
        up.push((dr, -1.0));
        pb.add_row(..=1.0, &up);
        let mut lo = rate;
        lo.push((dr, 1.0));
        pb.add_row(1.0.., &lo);
        let mut up = mem.clone();
        up.push((ds, -1.0));
        pb.add_row(..=1.0, &up);
        let mut lo = mem.clone();
        lo.push((ds, 1.0));
        pb.add_row(1.0.., &lo);
        if mem_bound {
            // Σ s_i x_ij + D_j ≤ S_max, D_j ≥ d_i x_ij (in MB / S̄).
            let mut row = mem;
            row.push((d[j], 1.0));
            pb.add_row(..=inst.memory_max_mb / s_avg, &row);
            for i in 0..n {
                let di = inst.models[i].dynamic_memory_mb;
                if di > 0.0 {
                    pb.add_row(0.0.., [(d[j], 1.0), (x[i * l + j], -di / s_avg)]);
                }
            }
        }
    }
    if move_bound {
        if let (Some(cur), Some(c)) = (&inst.current, inst.max_moves) {
            // Σ_{i placed} (1 − x_{i,cur(i)}) ≤ C  ⇔  Σ x_{i,cur(i)} ≥ placed − C.
            let row: Vec<(highs::Col, f64)> = cur
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.map(|j| (x[i * l + j], 1.0)))
                .collect();
            let placed = row.len() as f64;
            pb.add_row((placed - c as f64).., &row);
        }
    }
    Built {
        problem: pb,
        n,
        l,
        has_d: mem_bound,
    }
}

/// The column values of an assignment, for HiGHS's incumbent.
fn columns_of(inst: &Instance, b: &Built, a: &[usize]) -> Vec<f64> {
    let (n, l) = (b.n, b.l);
    let mut v = vec![0.0; n * l + if b.has_d { l } else { 0 } + 2];
    let mut dmax = vec![0.0f64; l];
    let (r_avg, s_avg) = inst.scales();
    for (i, &j) in a.iter().enumerate() {
        v[i * l + j] = 1.0;
        dmax[j] = dmax[j].max(inst.models[i].dynamic_memory_mb / s_avg);
    }
    if b.has_d {
        v[n * l..n * l + l].copy_from_slice(&dmax);
    }
    let e = inst.evaluate(a);
    let dr = e
        .load_rps
        .iter()
        .map(|x| (x / r_avg - 1.0).abs())
        .fold(0.0, f64::max);
    let ds = e
        .static_mb
        .iter()
        .map(|x| (x / s_avg - 1.0).abs())
        .fold(0.0, f64::max);
    let k = v.len();
    v[k - 2] = dr;
    v[k - 1] = ds;
    v
}

enum Outcome {
    Solved(Vec<usize>, String),
    Infeasible,
    NoSolution(String),
}

fn run_highs(
    inst: &Instance,
    drop: Option<Constraint>,
    opts: &MilpOptions,
    start: Option<&[usize]>,
) -> Result<Outcome> {
    use highs::{HighsModelStatus as S, HighsSolutionStatus, Sense};
    let t0 = Instant::now();
    let b = build(inst, drop);
    let (n, l) = (b.n, b.l);
    let start_cols = start.map(|a| columns_of(inst, &b, a));
    let mut model = b.problem.optimise(Sense::Minimise);
    model.make_quiet();
    let left = opts
        .time_limit
        .saturating_sub(t0.elapsed())
        .as_secs_f64()
        .max(0.05);
    model.set_option("time_limit", left);
    model.set_option("mip_abs_gap", opts.abs_gap);
    model.set_option("mip_rel_gap", 0.0);
    if let Some(t) = opts.threads.and_then(std::num::NonZeroU32::new) {
        model.set_threads(t);
    }
    if let Some(cols) = &start_cols {
        // An incumbent HiGHS will not take (it checks feasibility) is only a lost
        // head start, not an error.
        let _ = model.try_set_solution(Some(cols), None, None, None);
    }
    let solved = model
        .try_solve()
        .map_err(|e| anyhow::anyhow!("HiGHS failed: {e:?}"))?;
    let status = solved.status();
    let status_s = match status {
        S::Optimal => "optimal (within the gap)".to_string(),
        S::ReachedTimeLimit => "time limit".to_string(),
        other => format!("{other:?}"),
    };
    match status {
        S::Infeasible => return Ok(Outcome::Infeasible),
        S::Optimal
        | S::ReachedTimeLimit
        | S::ObjectiveBound
        | S::ObjectiveTarget
        | S::ReachedIterationLimit
        | S::ReachedSolutionLimit => {}
        other => return Ok(Outcome::NoSolution(format!("HiGHS ended with {other:?}"))),
    }
    if solved.primal_solution_status() != HighsSolutionStatus::Feasible {
        return Ok(Outcome::NoSolution(format!(
            "HiGHS found no feasible assignment ({status_s})"
        )));
    }
    let sol = solved.get_solution();
    let cols = sol.columns();
    let mut a = vec![0usize; n];
    for (i, ai) in a.iter_mut().enumerate() {
        let row = &cols[i * l..(i + 1) * l];
        *ai = (0..l).max_by(|&p, &q| row[p].total_cmp(&row[q])).unwrap();
    }
    Ok(Outcome::Solved(a, status_s))
}

/// Solves the instance with HiGHS within `opts.time_limit` (the best assignment
/// found); an infeasible instance is explained.
pub fn solve_milp(inst: &Instance, opts: &MilpOptions) -> Result<Solution> {
    inst.validate()?;
    let binaries = inst.models.len() * inst.subclusters;
    if binaries > MAX_BINARIES {
        bail!(
            "{} models x {} sub-clusters is {binaries} binary variables, more than the MILP takes ({MAX_BINARIES}); use fewer sub-clusters, or --solver random",
            inst.models.len(),
            inst.subclusters
        );
    }
    if let Some(why) = precheck(inst) {
        return Err(why.into());
    }
    let t0 = Instant::now();
    let mut start = if !opts.warm_start {
        None
    } else if inst.current.is_some() {
        current_completed(inst).filter(|a| inst.evaluate(a).violation.is_none())
    } else {
        greedy(inst).filter(|a| inst.evaluate(a).violation.is_none())
    };
    if let Some(a) = &mut start {
        // At most a fifth of the time limit; HiGHS gets the rest.
        local_search(inst, a, t0 + opts.time_limit / 5);
        debug_assert!(inst.evaluate(a).violation.is_none());
    }
    let start_objective = start.as_ref().map(|a| inst.evaluate(a).objective);
    match run_highs(inst, None, opts, start.as_deref())? {
        Outcome::Solved(a, status) => {
            let mut a = a;
            let mut status = status;
            let mut eval = inst.evaluate(&a);
            // HiGHS's own incumbent can only be as good as the start it was given;
            // keep the better of the two (rounding can leave the solver's a hair worse).
            if let Some(s) = &start {
                let es = inst.evaluate(s);
                if es.violation.is_none()
                    && (eval.violation.is_some() || es.objective < eval.objective)
                {
                    a = s.clone();
                    eval = es;
                    status.push_str(", start kept");
                }
            }
            if let Some(v) = &eval.violation {
                bail!("HiGHS returned an assignment that breaks a bound ({v}); this is a bug");
            }
            Ok(Solution {
                solver: "milp",
                assignment: a,
                eval,
                status,
                solve_s: t0.elapsed().as_secs_f64(),
                tries: 0,
                start_objective,
            })
        }
        Outcome::Infeasible => Err(explain_infeasible(inst, opts).into()),
        Outcome::NoSolution(why) => {
            if let Some(a) = start {
                let eval = inst.evaluate(&a);
                return Ok(Solution {
                    solver: "milp",
                    assignment: a,
                    eval,
                    status: format!("{why}; the greedy start is returned"),
                    solve_s: t0.elapsed().as_secs_f64(),
                    tries: 0,
                    start_objective,
                });
            }
            bail!(
                "no assignment found within {:.1} s: {why}",
                opts.time_limit.as_secs_f64()
            )
        }
    }
}

/// Names the constraint that makes a proven-infeasible instance so: the one whose
/// removal makes it feasible (each tried with a short solve).
pub fn explain_infeasible(inst: &Instance, opts: &MilpOptions) -> Infeasible {
    if let Some(why) = precheck(inst) {
        return why;
    }
    let short = MilpOptions {
        time_limit: opts.time_limit.min(Duration::from_secs(5)),
        warm_start: false,
        ..opts.clone()
    };
    let candidates = [
        (Constraint::MoveBound, inst.max_moves.is_some()),
        (Constraint::MemoryBound, inst.memory_max_mb.is_finite()),
        (Constraint::RateBound, inst.rate_max_rps.is_finite()),
    ];
    for (c, present) in candidates {
        if !present {
            continue;
        }
        if let Ok(Outcome::Solved(..)) = run_highs(inst, Some(c.clone()), &short, None) {
            let reason = match c {
                Constraint::MoveBound => format!(
                    "every assignment within the rate and memory bounds moves more than C_max = {} models",
                    inst.max_moves.unwrap_or(0)
                ),
                Constraint::MemoryBound => format!(
                    "the models' static memory plus each sub-cluster's largest dynamic memory cannot be packed into {} sub-clusters of S_max = {} MB",
                    inst.subclusters, inst.memory_max_mb
                ),
                _ => format!(
                    "the models' rates cannot be packed into {} sub-clusters of R_max = {} r/s",
                    inst.subclusters, inst.rate_max_rps
                ),
            };
            return Infeasible {
                constraint: c,
                reason,
            };
        }
    }
    Infeasible {
        constraint: Constraint::Combined,
        reason: "no single bound is to blame: dropping any one of them still leaves no assignment"
            .into(),
    }
}

/// The baseline: uniformly random assignments (with a current assignment and a
/// move bound: up to C_max random models moved to random sub-clusters) until the
/// time limit, the best feasible one kept.
pub fn solve_random(inst: &Instance, time_limit: Duration, seed: u64) -> Result<Solution> {
    inst.validate()?;
    if let Some(why) = precheck(inst) {
        return Err(why.into());
    }
    let t0 = Instant::now();
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let n = inst.models.len();
    let l = inst.subclusters;
    let base = current_completed(inst);
    let mut best: Option<(Vec<usize>, Eval)> = None;
    let mut tries = 0u64;
    let mut a = vec![0usize; n];
    loop {
        match (&base, inst.max_moves) {
            (Some(base), Some(c)) => {
                a.copy_from_slice(base);
                let k = rng.gen_range(0..=c.min(n));
                for _ in 0..k {
                    let i = rng.gen_range(0..n);
                    a[i] = rng.gen_range(0..l);
                }
            }
            _ => {
                for x in a.iter_mut() {
                    *x = rng.gen_range(0..l);
                }
            }
        }
        tries += 1;
        let e = inst.evaluate(&a);
        if e.violation.is_none() && best.as_ref().is_none_or(|(_, b)| e.objective < b.objective) {
            best = Some((a.clone(), e));
        }
        if tries.is_multiple_of(64) && t0.elapsed() >= time_limit {
            break;
        }
    }
    match best {
        Some((assignment, eval)) => Ok(Solution {
            solver: "random",
            assignment,
            eval,
            status: "time limit".into(),
            solve_s: t0.elapsed().as_secs_f64(),
            tries,
            start_objective: None,
        }),
        None => bail!(
            "the random solver found no assignment within the bounds in {tries} tries ({:.1} s)",
            time_limit.as_secs_f64()
        ),
    }
}

/// Every assignment of a small instance (L^n of them), the best objective's kept:
/// the tests' reference. None when none is feasible.
pub fn brute_force(inst: &Instance) -> Option<(Vec<usize>, Eval)> {
    let n = inst.models.len();
    let l = inst.subclusters;
    assert!(
        (l as f64).powi(n as i32) <= 2e6,
        "instance too large for brute force"
    );
    let mut a = vec![0usize; n];
    let mut best: Option<(Vec<usize>, Eval)> = None;
    loop {
        let e = inst.evaluate(&a);
        if e.violation.is_none()
            && best
                .as_ref()
                .is_none_or(|(_, b)| e.objective < b.objective - 1e-12)
        {
            best = Some((a.clone(), e));
        }
        let mut k = 0;
        loop {
            if k == n {
                return best;
            }
            a[k] += 1;
            if a[k] < l {
                break;
            }
            a[k] = 0;
            k += 1;
        }
    }
}

/// The file `fermata plan partition --models` reads (TOML).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsFile {
    /// Default R_max (requests/s per sub-cluster); absent: no bound.
    pub rate_max_rps: Option<f64>,
    /// Default S_max (MB per GPU); absent: no bound.
    pub memory_max_mb: Option<f64>,
    /// Default w.
    pub weight: Option<f64>,
    #[serde(default)]
    pub models: Vec<FileModel>,
}

/// One model of a models file; memory may come from the model repository instead.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileModel {
    pub name: String,
    pub rate_rps: f64,
    pub memory_mb: Option<f64>,
    pub dynamic_memory_mb: Option<f64>,
}

/// Parses a models file, with a clear error for what is wrong in it.
pub fn parse_models_file(text: &str) -> Result<ModelsFile> {
    let f: ModelsFile = toml::from_str(text).context("the models file")?;
    if f.models.is_empty() {
        bail!("the models file lists no models ([[models]] with name, rate_rps, memory_mb, dynamic_memory_mb)");
    }
    Ok(f)
}

/// A model's (static, dynamic) memory: what its file gives, else what was
/// `found` elsewhere (repository, catalogue), field by field; dynamic defaults
/// to 0. None without a static figure.
fn memory_of(
    static_mb: Option<f64>,
    dynamic_mb: Option<f64>,
    found: Option<(f64, f64)>,
) -> Option<(f64, f64)> {
    let s = static_mb.or(found.map(|f| f.0))?;
    Some((s, dynamic_mb.or(found.map(|f| f.1)).unwrap_or(0.0)))
}

/// The models of a models file, each model's memory from the file or else from
/// `lookup` (the model repository's footprint); a model with neither is an error.
pub fn resolve_models(
    f: &ModelsFile,
    lookup: impl Fn(&str) -> Option<(f64, f64)>,
) -> Result<Vec<PartModel>> {
    f.models
        .iter()
        .map(|m| {
            let Some((mem, dynm)) = memory_of(m.memory_mb, m.dynamic_memory_mb, lookup(&m.name))
            else {
                bail!(
                    "model {:?} has no memory_mb, and no model repository (--repository) has it",
                    m.name
                );
            };
            Ok(PartModel {
                name: m.name.clone(),
                rate_rps: m.rate_rps,
                memory_mb: mem,
                dynamic_memory_mb: dynm,
            })
        })
        .collect()
}

/// The models of a workload file: each model's rate its share of `rate_rps`, its
/// memory from the file's `memory_mb` / `dynamic_memory_mb` or else, for a model
/// taken from the paper's profiles, from [`profile_catalogue`].
pub fn models_of_workload(w: &crate::workload::Workload) -> Result<Vec<PartModel>> {
    let mut cats: std::collections::HashMap<String, Vec<(String, f64, f64)>> = Default::default();
    let mut out = Vec::new();
    for m in &w.models {
        let from_profile = match &m.profile {
            Some(p) => {
                let gpu = p
                    .split_once('/')
                    .map(|x| x.0.to_ascii_lowercase())
                    .unwrap_or_default();
                if !cats.contains_key(&gpu) {
                    let c = profile_catalogue(&gpu).unwrap_or_default();
                    cats.insert(gpu.clone(), c);
                }
                cats[&gpu]
                    .iter()
                    .find(|c| c.0.eq_ignore_ascii_case(p))
                    .map(|c| (c.1, c.2))
            }
            None => None,
        };
        let Some((s, d)) = memory_of(m.memory_mb, m.dynamic_memory_mb, from_profile) else {
            bail!(
                "workload model {:?} has no memory_mb and is not one of the paper's profiled models",
                m.spec.name
            );
        };
        out.push(PartModel {
            name: m.spec.name.clone(),
            rate_rps: m.share * w.rate_rps,
            memory_mb: s,
            dynamic_memory_mb: d,
        });
    }
    Ok(out)
}

/// The file `--current` reads and `plan partition --out` writes: model name →
/// sub-cluster.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignmentFile {
    pub subclusters: usize,
    pub assignment: std::collections::BTreeMap<String, usize>,
}

/// The current assignment in the instance's model order (unknown names: an error;
/// models it does not list: not placed yet).
pub fn current_from(
    file: &AssignmentFile,
    models: &[PartModel],
    subclusters: usize,
) -> Result<Vec<Option<usize>>> {
    if file.subclusters != subclusters {
        bail!(
            "the current assignment is over {} sub-clusters, this partition over {subclusters} (re-partition with the same L)",
            file.subclusters
        );
    }
    let names: std::collections::HashSet<&str> = models.iter().map(|m| m.name.as_str()).collect();
    if let Some(n) = file.assignment.keys().find(|n| !names.contains(n.as_str())) {
        bail!("the current assignment names model {n:?}, which the models file does not list");
    }
    Ok(models
        .iter()
        .map(|m| file.assignment.get(&m.name).copied())
        .collect())
}

/// Published parameter counts of the profiled models (millions; Keras
/// Applications' table, BERT-base and SSD-MobileNetV2), embedded.
pub const MODEL_PARAMS_CSV: &str = include_str!("../../configs/profiles/model_memory.csv");

/// Memory footprints derived from the paper's profiles, one per model profiled on
/// `gpu`: (profile name, static MB, dynamic MB). Static: the FP32 weights (4 bytes
/// per parameter). Dynamic: an estimate, not a measurement — the activations of the
/// largest batch the SLO allows (l(b) ≤ SLO/2), at 8 MB per sample for ResNet50 and
/// in proportion to the per-sample time α for the others.
pub fn profile_catalogue(gpu: &str) -> Result<Vec<(String, f64, f64)>> {
    let rows = crate::workload::parse_profiles_csv(crate::workload::PAPER_PROFILES_CSV)?;
    let mut params = std::collections::HashMap::new();
    for line in MODEL_PARAMS_CSV.lines().skip(1) {
        let (name, p) = line
            .split_once(',')
            .context("model_memory.csv: a line without a comma")?;
        params.insert(
            name.trim().to_string(),
            p.trim()
                .parse::<f64>()
                .context("model_memory.csv: params_m")?,
        );
    }
    let rows: Vec<_> = rows.into_iter().filter(|r| r.gpu == gpu).collect();
    let anchor = rows
        .iter()
        .find(|r| r.model == "ResNet50")
        .map(|r| r.alpha_ms)
        .context("no ResNet50 profile for that GPU")?;
    let mut out = Vec::new();
    for r in rows {
        let Some(p) = params.get(&r.model) else {
            bail!("model_memory.csv has no parameter count for {}", r.model);
        };
        let b_max = (((r.slo_ms / 2.0 - r.beta_ms) / r.alpha_ms).floor()).max(1.0);
        out.push((
            format!("{gpu}/{}", r.model),
            p * 4.0,
            b_max * 8.0 * r.alpha_ms / anchor,
        ));
    }
    if out.is_empty() {
        bail!("no profiles for GPU {gpu:?} (1080ti or a100)");
    }
    Ok(out)
}

/// A random instance like the paper's Fig. 16: `n` models, rates drawn from an
/// exponential distribution (mean `mean_rps`), each model one of the catalogue's
/// (profile-derived) memory footprints at random.
pub fn random_instance(
    n: usize,
    subclusters: usize,
    mean_rps: f64,
    catalogue: &[(String, f64, f64)],
    seed: u64,
) -> Instance {
    use rand_distr::{Distribution, Exp};
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let exp = Exp::new(1.0 / mean_rps).unwrap();
    let models = (0..n)
        .map(|i| {
            let (name, s, d) = &catalogue[rng.gen_range(0..catalogue.len())];
            PartModel {
                name: format!("{name}-{i}"),
                rate_rps: exp.sample(&mut rng),
                memory_mb: *s,
                dynamic_memory_mb: *d,
            }
        })
        .collect();
    Instance {
        models,
        subclusters,
        rate_max_rps: f64::INFINITY,
        memory_max_mb: f64::INFINITY,
        weight: 1.0,
        current: None,
        max_moves: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, r: f64, s: f64, d: f64) -> PartModel {
        PartModel {
            name: name.into(),
            rate_rps: r,
            memory_mb: s,
            dynamic_memory_mb: d,
        }
    }

    fn inst(models: Vec<PartModel>, l: usize) -> Instance {
        Instance {
            models,
            subclusters: l,
            rate_max_rps: f64::INFINITY,
            memory_max_mb: f64::INFINITY,
            weight: 1.0,
            current: None,
            max_moves: None,
        }
    }

    fn opts() -> MilpOptions {
        MilpOptions {
            time_limit: Duration::from_secs(20),
            abs_gap: 1e-9,
            warm_start: false,
            threads: Some(1),
        }
    }

    /// Random small instances: the MILP reaches brute force's optimum (with and
    /// without bounds, a current assignment and a move bound).
    #[test]
    fn milp_matches_brute_force_on_small_instances() {
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
        for case in 0..30 {
            let n = rng.gen_range(3..=7);
            let l = rng.gen_range(2..=3);
            let models: Vec<PartModel> = (0..n)
                .map(|i| {
                    m(
                        &format!("m{i}"),
                        rng.gen_range(1.0..100.0f64).round(),
                        rng.gen_range(10.0..500.0f64).round(),
                        rng.gen_range(0.0..300.0f64).round(),
                    )
                })
                .collect();
            let mut p = inst(models, l);
            p.weight = [0.0, 0.5, 1.0, 2.0][case % 4];
            let tot_r: f64 = p.models.iter().map(|m| m.rate_rps).sum();
            let tot_s: f64 = p.models.iter().map(|m| m.memory_mb).sum();
            if case % 3 == 1 {
                p.rate_max_rps = (tot_r / l as f64 * 1.3).round();
                p.memory_max_mb = (tot_s / l as f64 * 1.5 + 300.0).round();
            }
            if case % 5 == 2 {
                p.current = Some((0..n).map(|i| Some(i % l)).collect());
                p.max_moves = Some(rng.gen_range(0..=2));
            }
            let bf = brute_force(&p);
            match (bf, solve_milp(&p, &opts())) {
                (Some((_, be)), Ok(s)) => {
                    assert!(
                        s.eval.violation.is_none(),
                        "case {case}: {:?}",
                        s.eval.violation
                    );
                    assert!(
                        (s.eval.objective - be.objective).abs() < 1e-6,
                        "case {case}: milp {} vs brute force {}",
                        s.eval.objective,
                        be.objective
                    );
                }
                (None, Err(e)) => {
                    let e = e
                        .downcast::<Infeasible>()
                        .expect("an Infeasible explanation");
                    assert!(!e.reason.is_empty());
                }
                (bf, got) => panic!(
                    "case {case}: brute force {:?}, milp {:?}",
                    bf.map(|b| b.1.objective),
                    got.map(|s| s.eval.objective)
                ),
            }
        }
    }

    #[test]
    fn one_model_over_the_rate_bound_is_named() {
        let mut p = inst(
            vec![m("big", 500.0, 10.0, 0.0), m("small", 5.0, 10.0, 0.0)],
            2,
        );
        p.rate_max_rps = 100.0;
        let e = solve_milp(&p, &opts())
            .unwrap_err()
            .downcast::<Infeasible>()
            .unwrap();
        assert_eq!(e.constraint, Constraint::RateBound);
        assert!(e.reason.contains("\"big\""), "{}", e.reason);
        assert!(e.to_string().contains("R_max"), "{e}");
    }

    #[test]
    fn memory_that_cannot_be_packed_is_named() {
        // Three 60 MB models, two GPUs of 100 MB: each fits alone, the total fits
        // (180 ≤ 200), but two must share a GPU: only the solver can tell.
        let mut p = inst(
            vec![
                m("a", 1.0, 60.0, 0.0),
                m("b", 1.0, 60.0, 0.0),
                m("c", 1.0, 60.0, 0.0),
            ],
            2,
        );
        p.memory_max_mb = 100.0;
        assert!(precheck(&p).is_none());
        let e = solve_milp(&p, &opts())
            .unwrap_err()
            .downcast::<Infeasible>()
            .unwrap();
        assert_eq!(e.constraint, Constraint::MemoryBound, "{e}");
    }

    #[test]
    fn dynamic_memory_counts_once_per_sub_cluster() {
        // Static 40 + 40 plus the larger dynamic (20) = 100 fits S_max 100; the
        // solver may pair them although 40+30 + 40+20 would not if summed.
        let mut p = inst(vec![m("a", 1.0, 40.0, 20.0), m("b", 1.0, 40.0, 10.0)], 1);
        p.memory_max_mb = 100.0;
        let s = solve_milp(&p, &opts()).unwrap();
        assert_eq!(s.eval.gpu_mb, vec![100.0]);
        p.memory_max_mb = 99.0;
        let e = solve_milp(&p, &opts())
            .unwrap_err()
            .downcast::<Infeasible>()
            .unwrap();
        assert_eq!(e.constraint, Constraint::MemoryBound);
    }

    #[test]
    fn move_bound_is_respected_and_named_when_too_tight() {
        // Everything starts in sub-cluster 0; balance needs moves.
        let models: Vec<PartModel> = (0..8)
            .map(|i| m(&format!("m{i}"), 10.0, 10.0, 0.0))
            .collect();
        let mut p = inst(models, 2);
        p.current = Some(vec![Some(0); 8]);
        p.max_moves = Some(2);
        let s = solve_milp(&p, &opts()).unwrap();
        assert_eq!(s.eval.moves, 2);
        let free = solve_milp(
            &Instance {
                max_moves: None,
                ..p.clone()
            },
            &opts(),
        )
        .unwrap();
        assert_eq!(free.eval.load_imbalance, 0.0);
        assert!(s.eval.load_imbalance > 0.0);
        // With a rate bound that sub-cluster 0 breaks, 2 moves are not enough.
        p.rate_max_rps = 45.0;
        let e = solve_milp(&p, &opts())
            .unwrap_err()
            .downcast::<Infeasible>()
            .unwrap();
        assert_eq!(e.constraint, Constraint::MoveBound, "{e}");
    }

    #[test]
    fn malformed_instances_are_refused_clearly() {
        let bad = |p: Instance, want: &str| {
            let e = solve_milp(&p, &opts()).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should mention {want:?}");
        };
        bad(inst(vec![m("a", f64::NAN, 1.0, 0.0)], 2), "rate_rps");
        bad(inst(vec![m("a", 1.0, -1.0, 0.0)], 2), "memory_mb");
        bad(
            inst(vec![m("a", 1.0, 1.0, 0.0), m("a", 1.0, 1.0, 0.0)], 2),
            "twice",
        );
        bad(inst(vec![m("a", 1.0, 1.0, 0.0)], 0), "at least 1");
        bad(inst(vec![], 2), "no models");
        let mut p = inst(vec![m("a", 1.0, 1.0, 0.0)], 2);
        p.max_moves = Some(3);
        bad(p.clone(), "--current");
        p.current = Some(vec![Some(5)]);
        bad(p, "sub-cluster 5");
        let f = parse_models_file("[[models]]\nname = \"a\"\nrate_rps = 1\n").unwrap();
        let e = resolve_models(&f, |_| None).unwrap_err().to_string();
        assert!(e.contains("no memory_mb"), "{e}");
        let got = resolve_models(&f, |n| (n == "a").then_some((5.0, 2.0))).unwrap();
        assert_eq!((got[0].memory_mb, got[0].dynamic_memory_mb), (5.0, 2.0));
        assert!(parse_models_file("rate_max_rps = 3\n").is_err());
        let e = format!(
            "{:#}",
            parse_models_file(
                "[[models]]\nname = \"a\"\nrate_rps = 1\nmemory_mb = 2\ncolour = 3\n"
            )
            .unwrap_err()
        );
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn random_solver_keeps_the_bounds() {
        let mut p = random_instance(
            40,
            4,
            50.0,
            &[("x".into(), 100.0, 50.0), ("y".into(), 20.0, 10.0)],
            3,
        );
        let tot: f64 = p.models.iter().map(|m| m.rate_rps).sum();
        p.rate_max_rps = tot / 4.0 * 1.2;
        let s = solve_random(&p, Duration::from_millis(200), 1).unwrap();
        assert!(s.eval.violation.is_none());
        assert!(s.tries > 10);
        let g = solve_milp(
            &p,
            &MilpOptions {
                time_limit: Duration::from_secs(5),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(g.eval.objective <= s.eval.objective + 1e-9);
    }
}
