//! One point per module with every path within the SLO, at the lowest total cost,
//! by a min-plus dynamic program when the application is a forest (every module
//! has at most one parent: chains, forks, trees).
//!
//! `g_v(T)`, the cheapest cost of the subtree of `v` when `v` starts with `T`
//! seconds left, is a step function: a list of (time needed, cost), times
//! increasing, costs decreasing. A module's function is the lower envelope, over
//! its points `(w, c)`, of `c + Σ_children g_c(T − w)`. The DP is exact on the
//! points given; it is what the MILP in [`super::planners::choose_points`] solves,
//! without a solver's set-up time. A DAG with a join, or a DP whose work passes
//! [`DP_WORK`], is left to the MILP.

use super::module::Point;
use super::App;

/// Work bound of the DP (entries built, all modules together).
pub const DP_WORK: usize = 4_000_000;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Time the subtree needs.
    t: f64,
    cost: f64,
    /// The module's point.
    k: usize,
    /// Time left to its children.
    tc: f64,
}

/// The cheapest entry with `t <= limit` (entries: times increasing, costs
/// decreasing).
fn at(g: &[Entry], limit: f64) -> Option<&Entry> {
    let i = g.partition_point(|e| e.t <= limit);
    (i > 0).then(|| &g[i - 1])
}

/// Keeps the entries no other beats (less time and no more cost).
fn envelope(mut v: Vec<Entry>) -> Vec<Entry> {
    v.sort_by(|a, b| a.t.total_cmp(&b.t).then(a.cost.total_cmp(&b.cost)));
    let mut out: Vec<Entry> = Vec::with_capacity(v.len());
    for e in v {
        if out
            .last()
            .is_none_or(|l| e.cost < l.cost - 1e-12 * l.cost.abs().max(1e-12))
        {
            out.push(e);
        }
    }
    out
}

/// `None`: not a forest, or too much work (use the MILP). `Some(None)`: no
/// choice fits. `Some(Some(pick))`: the index of each module's point.
pub fn forest_dp(app: &App, pts: &[Vec<Point>]) -> Option<Option<Vec<usize>>> {
    let n = app.modules.len();
    let mut parent = vec![usize::MAX; n];
    for e in &app.edges {
        if parent[e.to] != usize::MAX {
            return None;
        }
        parent[e.to] = e.from;
    }
    let mut children = vec![Vec::new(); n];
    for e in &app.edges {
        children[e.from].push(e.to);
    }
    let limit = app.slo * (1.0 + 1e-9);
    let order = app.topo();
    let mut g: Vec<Vec<Entry>> = vec![Vec::new(); n];
    let mut work = 0usize;
    for &v in order.iter().rev() {
        // Σ over the children: (time, cost), times increasing, costs decreasing.
        let mut sum: Vec<(f64, f64)> = vec![(0.0, 0.0)];
        for &c in &children[v] {
            if g[c].is_empty() {
                return Some(None);
            }
            let mut ts: Vec<f64> = sum
                .iter()
                .map(|x| x.0)
                .chain(g[c].iter().map(|e| e.t))
                .collect();
            ts.sort_by(f64::total_cmp);
            ts.dedup();
            let mut next: Vec<(f64, f64)> = Vec::with_capacity(ts.len());
            for t in ts {
                let i = sum.partition_point(|x| x.0 <= t);
                let (Some(a), Some(b)) = ((i > 0).then(|| sum[i - 1].1), at(&g[c], t)) else {
                    continue;
                };
                let cost = a + b.cost;
                if next
                    .last()
                    .is_none_or(|l: &(f64, f64)| cost < l.1 - 1e-12 * l.1.abs().max(1e-12))
                {
                    next.push((t, cost));
                }
            }
            work += next.len();
            sum = next;
        }
        let mut cand = Vec::new();
        for (k, q) in pts[v].iter().enumerate() {
            for &(t, c) in &sum {
                let tt = q.worst + t;
                if tt > limit {
                    break;
                }
                cand.push(Entry {
                    t: tt,
                    cost: q.cost + c,
                    k,
                    tc: t,
                });
            }
        }
        work += cand.len();
        if work > DP_WORK {
            return None;
        }
        g[v] = envelope(cand);
        if g[v].is_empty() {
            return Some(None);
        }
    }
    // Every root with the whole SLO; then each child at the time its parent left.
    let mut pick = vec![0usize; n];
    let mut stack: Vec<(usize, f64)> = (0..n)
        .filter(|&v| parent[v] == usize::MAX)
        .map(|v| (v, limit))
        .collect();
    while let Some((v, t)) = stack.pop() {
        let e = *at(&g[v], t)?;
        pick[v] = e.k;
        for &c in &children[v] {
            stack.push((c, e.tc));
        }
    }
    Some(Some(pick))
}
