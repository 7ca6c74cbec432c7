//! Application planners. Each returns a [`Plan`] or an error that says why it has
//! none; none reads a clock (a time limit is a `stop` callback the caller owns).
//!
//! * `fermata`: every module's exact cost as a step function of its budget
//!   ([`module::frontier`]), then one point per module chosen by a MILP over the
//!   DAG (HiGHS): binaries per point, start times `s_v >= s_u + l_u` per edge,
//!   `s_v + l_v <= SLO`. Optimal for the plan shape PLANNERS.md's brute force
//!   defines.
//! * `exact`: that brute force ([`super::exact`]): every list of every module
//!   and every combination of one list per module, with cuts that keep its
//!   optimum (an incumbent cost, bounds on each list's cost and worst case,
//!   dominance), until `stop`; [`exact_simple`] is the uncut enumeration.
//! * `harpagon`, `piccolo`: the latency-cost splitter, TC dispatch, Algorithm 1,
//!   dummies; Harpagon with its reassigner, node merger and cost-direct
//!   (R = 3), Piccolo rescaling budgets proportionally. [`HarpagonOptions`] gives
//!   the ablations.
//! * `scrooge`: its MILP (one binary per configuration, rates split across the
//!   chosen ones, worst case `d + b / t`), then the partial-worker refinement.
//! * `nexus`: the latency split on an ε grid (ε = SLO / 100), each module on one
//!   hardware type with saturated machines at `max b: 2 l(b) <= L` and a
//!   residual at `max b: l(b) + b / r <= L` (concurrency 1).
//! * `inferline`: one configuration per module, round robin, the greedy
//!   cost-lowering split. `clipper`: one configuration per module, round robin,
//!   the SLO split evenly along each path.

pub use super::exact::{exact, exact_simple};
pub use super::fermata::{
    fermata, fermata_integral, fermata_optimum, EXACT_NODES, FERMATA_NODES, LISTS_NODES,
};
use super::module::{self, Configs, Dummies, Point};
use super::{worst_case, Alloc, App, Config, Dispatch, ModulePlan, Plan, EPS};

pub const PLANNERS: &[&str] = &[
    "fermata",
    "fermata-integral",
    "exact",
    "harpagon",
    "piccolo",
    "scrooge",
    "nexus",
    "inferline",
    "clipper",
];

pub(super) fn prices(app: &App) -> Vec<f64> {
    app.hardware.iter().map(|h| h.price).collect()
}

/// The largest budget module `v` can use: the SLO less the smallest latencies of
/// the other modules on its longest path.
pub(super) fn l_max(app: &App, v: usize) -> f64 {
    let n = app.modules.len();
    let mut lat: Vec<f64> = (0..n).map(|u| super::file::min_latency(app, u)).collect();
    lat[v] = 0.0;
    // Longest path through v with v at 0.
    let order = app.topo();
    let mut head = vec![0.0f64; n];
    for &u in &order {
        let best = app.parents(u).map(|p| head[p]).fold(0.0, f64::max);
        head[u] = best + lat[u];
    }
    let mut tail = vec![0.0f64; n];
    for &u in order.iter().rev() {
        let best = app.children(u).map(|c| tail[c]).fold(0.0, f64::max);
        tail[u] = best + lat[u];
    }
    (app.slo - head[v] - tail[v]).max(0.0)
}

pub(super) fn module_plan(
    app: &App,
    v: usize,
    budget: f64,
    allocs: Vec<Alloc>,
    dummy: f64,
    dispatch: Dispatch,
) -> ModulePlan {
    let p = prices(app);
    ModulePlan {
        name: app.modules[v].name.clone(),
        budget,
        worst: if app.rates[v] > 0.0 {
            worst_case(&allocs, dispatch, &p)
        } else {
            0.0
        },
        rate: app.rates[v],
        cost: super::alloc_cost(&allocs, &p),
        allocs,
        dispatch,
        dummy,
        served_by: None,
    }
}

/// Raises budgets into the slack left on their paths, module by module in
/// topological order (Harpagon's reassigner; harmless for any plan).
pub(super) fn reassign(app: &App, budgets: &mut [f64]) {
    let order = app.topo();
    let n = app.modules.len();
    for &v in &order {
        let mut head = vec![0.0f64; n];
        for &u in &order {
            head[u] = app.parents(u).map(|p| head[p]).fold(0.0, f64::max) + budgets[u];
        }
        let mut tail = vec![0.0f64; n];
        for &u in order.iter().rev() {
            tail[u] = app.children(u).map(|c| tail[c]).fold(0.0, f64::max) + budgets[u];
        }
        let through = head[v] + tail[v] - budgets[v];
        let slack = app.slo - through;
        if slack > 0.0 {
            budgets[v] += slack;
        }
    }
}

// ---------------------------------------------------------------- fermata, exact

/// One point per module minimising the sum of costs with every path within the
/// SLO: the exact min-plus DP on forests ([`super::choose::forest_dp`]), a MILP
/// (HiGHS) otherwise. `None` if no choice fits.
pub fn choose_points(app: &App, pts: &[Vec<Point>]) -> Option<Vec<usize>> {
    if pts.iter().any(|p| p.is_empty()) {
        return None;
    }
    if let Some(r) = super::choose::forest_dp(app, pts) {
        return r;
    }
    choose_points_milp(app, pts)
}

/// [`choose_points`] by the MILP alone.
pub fn choose_points_milp(app: &App, pts: &[Vec<Point>]) -> Option<Vec<usize>> {
    let cost: Vec<Vec<f64>> = pts
        .iter()
        .map(|p| p.iter().map(|q| q.cost).collect())
        .collect();
    choose_points_milp_with(app, pts, &cost, &[], None)
}

/// One integer bin count per hardware type: its price, and each point's
/// partial machine on it (by module, then point).
pub struct Bins {
    pub price: f64,
    pub partial: Vec<Vec<f64>>,
}

/// The MILP of [`choose_points`] with point `k` of module `v` costing
/// `cost[v][k]`, plus, for each of `bins`, an integer count of machines at its
/// price that holds the chosen points' partial machines (`count >= Σ partial`).
/// `start`, a choice with every path within the SLO, is the solver's first
/// incumbent.
pub fn choose_points_milp_with(
    app: &App,
    pts: &[Vec<Point>],
    cost: &[Vec<f64>],
    bins: &[Bins],
    start: Option<&[usize]>,
) -> Option<Vec<usize>> {
    use highs::{HighsModelStatus as S, RowProblem, Sense};
    let n = app.modules.len();
    if pts.iter().any(|p| p.is_empty()) {
        return None;
    }
    // A chain of one point each needs no solver.
    if pts.iter().all(|p| p.len() == 1) {
        let lat: Vec<f64> = pts.iter().map(|p| p[0].worst).collect();
        return (app.longest_path(&lat).0 <= app.slo * (1.0 + EPS)).then(|| vec![0; n]);
    }
    let mut pb = RowProblem::default();
    let scale = cost
        .iter()
        .flatten()
        .copied()
        .chain(bins.iter().map(|b| b.price))
        .fold(1e-12, f64::max);
    let x: Vec<Vec<highs::Col>> = cost
        .iter()
        .map(|p| {
            p.iter()
                .map(|c| pb.add_integer_column(c / scale, 0..=1))
                .collect()
        })
        .collect();
    for b in bins {
        let y = pb.add_integer_column(b.price / scale, 0..);
        // y - Σ x · partial >= 0
        let mut row: Vec<(highs::Col, f64)> = vec![(y, 1.0)];
        for (xv, pv) in x.iter().zip(&b.partial) {
            row.extend(
                xv.iter()
                    .zip(pv)
                    .filter(|(_, p)| **p > 0.0)
                    .map(|(&c, &p)| (c, -p)),
            );
        }
        if row.len() > 1 {
            pb.add_row(-1e-9.., &row);
        }
    }
    let slo = app.slo;
    let s: Vec<highs::Col> = (0..n).map(|_| pb.add_column(0.0, 0.0..=slo)).collect();
    for v in 0..n {
        let row: Vec<(highs::Col, f64)> = x[v].iter().map(|&c| (c, 1.0)).collect();
        pb.add_row(1.0..=1.0, &row);
        // s_v + l_v <= SLO (a tiny tolerance absorbs rounding).
        let mut row: Vec<(highs::Col, f64)> = vec![(s[v], 1.0)];
        row.extend(x[v].iter().zip(&pts[v]).map(|(&c, q)| (c, q.worst)));
        pb.add_row(..=slo * (1.0 + 1e-9), &row);
    }
    for e in &app.edges {
        // s_to - s_from - l_from >= 0
        let mut row: Vec<(highs::Col, f64)> = vec![(s[e.to], 1.0), (s[e.from], -1.0)];
        row.extend(
            x[e.from]
                .iter()
                .zip(&pts[e.from])
                .map(|(&c, q)| (c, -q.worst)),
        );
        pb.add_row(-slo * 1e-9.., &row);
    }
    let mut model = pb.optimise(Sense::Minimise);
    model.make_quiet();
    model.set_option("mip_rel_gap", 0.0);
    model.set_option("mip_abs_gap", 1e-9);
    model.set_option("threads", 1);
    // The feasibility-jump heuristic took a quarter of the solver's time on
    // these models, whose feasible choices the DP finds directly.
    model.set_option("mip_heuristic_run_feasibility_jump", false);
    if let Some(pick) = start.filter(|p| p.len() == n) {
        // Columns in the order added: the points, a count per bin, the start
        // times (each module as early as its parents allow).
        let mut cols: Vec<f64> = Vec::new();
        for (v, xv) in x.iter().enumerate() {
            cols.extend((0..xv.len()).map(|k| if k == pick[v] { 1.0 } else { 0.0 }));
        }
        for b in bins {
            let sum: f64 = (0..n).map(|v| b.partial[v][pick[v]]).sum();
            cols.push((sum - 1e-9).ceil().max(0.0));
        }
        let mut st = vec![0.0f64; n];
        for &v in &app.topo() {
            st[v] = app
                .parents(v)
                .map(|u| st[u] + pts[u][pick[u]].worst)
                .fold(0.0, f64::max);
        }
        cols.extend(st);
        // A start the solver refuses only costs it its own search.
        let _ = model.try_set_solution(Some(&cols), None, None, None);
    }
    let solved = model.try_solve().ok()?;
    if solved.status() != S::Optimal {
        return None;
    }
    let sol = solved.get_solution();
    let cols = sol.columns();
    let mut k = 0;
    let mut out = Vec::with_capacity(n);
    for xv in &x {
        let vals = &cols[k..k + xv.len()];
        out.push(
            (0..xv.len())
                .max_by(|&a, &b| vals[a].total_cmp(&vals[b]))
                .unwrap(),
        );
        k += xv.len();
    }
    Some(out)
}

pub(super) fn plan_from_points(app: &App, name: &str, pts: &[Vec<Point>], pick: &[usize]) -> Plan {
    let mut budgets: Vec<f64> = pick
        .iter()
        .enumerate()
        .map(|(v, &k)| pts[v][k].worst)
        .collect();
    reassign(app, &mut budgets);
    let mods = (0..app.modules.len())
        .map(|v| {
            let p = &pts[v][pick[v]];
            module_plan(
                app,
                v,
                budgets[v],
                p.allocs.clone(),
                p.dummy,
                Dispatch::ThroughputCost,
            )
        })
        .collect();
    Plan::assemble(name, app, mods)
}

// ---------------------------------------------------------------- harpagon, piccolo

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Split {
    /// The latency-cost splitter.
    LatencyCost,
    /// Budgets proportional to each module's latency at its best throughput per
    /// price, scaled so the longest path is the SLO.
    Throughput,
    /// The cheapest split with budgets on a grid of this fraction of the SLO.
    Quantised(f64),
}

#[derive(Debug, Clone, Copy)]
pub struct HarpagonOptions {
    pub dispatch: Dispatch,
    pub configs: Configs,
    pub dummies: Dummies,
    pub reassign: bool,
    pub split: Split,
    pub merger: bool,
    /// Cost-direct: redo the last this many moves by absolute saving.
    pub cost_direct: usize,
    /// Piccolo: rescale budgets proportionally to the SLO at the end.
    pub rescale: bool,
}

impl HarpagonOptions {
    pub fn harpagon() -> Self {
        HarpagonOptions {
            dispatch: Dispatch::ThroughputCost,
            configs: Configs::Any,
            dummies: Dummies::Harpagon,
            reassign: true,
            split: Split::LatencyCost,
            merger: true,
            cost_direct: 3,
            rescale: false,
        }
    }
    pub fn piccolo() -> Self {
        HarpagonOptions {
            dummies: Dummies::Piccolo,
            reassign: false,
            merger: false,
            cost_direct: 0,
            rescale: true,
            ..Self::harpagon()
        }
    }
    pub fn inferline() -> Self {
        HarpagonOptions {
            dispatch: Dispatch::RoundRobin,
            configs: Configs::One,
            dummies: Dummies::None,
            reassign: false,
            merger: false,
            cost_direct: 0,
            ..Self::harpagon()
        }
    }
}

/// The splitter's model of a module on one configuration: all its rate there,
/// worst case `d + b / r` (TC) or `d + b / t` (round robin), cost `p r / t`.
fn lc_point(c: &Config, r: f64, price: f64, dispatch: Dispatch) -> (f64, f64) {
    let wait = match dispatch {
        Dispatch::ThroughputCost => f64::from(c.batch) / r.max(1e-12),
        Dispatch::RoundRobin => f64::from(c.batch) / c.throughput,
    };
    (c.latency + wait, price * r / c.throughput)
}

/// Latency-cost efficiency of moving a module from configuration `a` to `b`:
/// cost saved per second of latency added.
pub fn lc(a: &Config, b: &Config, r: f64, prices: &[f64], dispatch: Dispatch) -> f64 {
    let (la, ca) = lc_point(a, r, prices[a.hw], dispatch);
    let (lb, cb) = lc_point(b, r, prices[b.hw], dispatch);
    (ca - cb) / (lb - la)
}

/// The splitter: every module starts at batch 1 on its most expensive hardware;
/// moves that lower cost without adding latency first, then the move with the
/// largest LC that keeps every path within the SLO. Returns each module's
/// configuration index.
fn lc_split(app: &App, o: &HarpagonOptions) -> Result<Vec<usize>, String> {
    let p = prices(app);
    let n = app.modules.len();
    let mut cur = Vec::with_capacity(n);
    for m in &app.modules {
        let top = m.configs.iter().map(|c| p[c.hw]).fold(0.0, f64::max);
        let k = (0..m.configs.len())
            .filter(|&k| p[m.configs[k].hw] >= top && m.configs[k].batch == 1)
            .min_by(|&a, &b| m.configs[a].latency.total_cmp(&m.configs[b].latency))
            .or_else(|| {
                (0..m.configs.len())
                    .min_by(|&a, &b| m.configs[a].latency.total_cmp(&m.configs[b].latency))
            })
            .unwrap();
        cur.push(k);
    }
    // Every (module, configuration)'s point, computed once: the moves below
    // ask for them many times.
    let table: Vec<Vec<(f64, f64)>> = app
        .modules
        .iter()
        .zip(&app.rates)
        .map(|(m, &r)| {
            m.configs
                .iter()
                .map(|c| lc_point(c, r, p[c.hw], o.dispatch))
                .collect()
        })
        .collect();
    let point = |v: usize, k: usize| table[v][k];
    let order = app.topo();
    let parents: Vec<Vec<usize>> = (0..n).map(|v| app.parents(v).collect()).collect();
    // The longest path's length (as `App::longest_path`, without the path).
    let path_len = |lat: &[f64]| -> f64 {
        let mut dist = vec![0.0f64; n];
        let mut len = f64::NEG_INFINITY;
        for &v in &order {
            let best = parents[v].iter().map(|&u| dist[u]).fold(0.0, f64::max);
            dist[v] = best + lat[v];
            len = len.max(dist[v]);
        }
        len
    };
    let lat_of = |cur: &[usize]| -> Vec<f64> {
        (0..n)
            .map(|v| {
                if app.rates[v] > 0.0 {
                    point(v, cur[v]).0
                } else {
                    0.0
                }
            })
            .collect()
    };
    // Start: the fastest configuration of every module if batch 1 on the most
    // expensive hardware does not fit.
    if path_len(&lat_of(&cur)) > app.slo * (1.0 + EPS) {
        for (v, k) in cur.iter_mut().enumerate() {
            *k = (0..app.modules[v].configs.len())
                .min_by(|&a, &b| point(v, a).0.total_cmp(&point(v, b).0))
                .unwrap();
        }
        if path_len(&lat_of(&cur)) > app.slo * (1.0 + EPS) {
            return Err(
                "start: the splitter's starting point (every module at its fastest configuration) misses the SLO"
                    .into(),
            );
        }
    }
    // Groups: modules with the same parents and children move together.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for v in 0..n {
        let key = |u: usize| {
            let mut a: Vec<usize> = app.parents(u).collect();
            let mut b: Vec<usize> = app.children(u).collect();
            a.sort();
            b.sort();
            (a, b)
        };
        match groups.iter_mut().find(|g| o.merger && key(g[0]) == key(v)) {
            Some(g) => g.push(v),
            None => groups.push(vec![v]),
        }
    }
    // Candidate latencies of each group: every configuration latency of its
    // members.
    let cands: Vec<Vec<f64>> = groups
        .iter()
        .map(|g| {
            let mut c: Vec<f64> = g
                .iter()
                .flat_map(|&v| table[v].iter().map(|x| x.0))
                .collect();
            c.sort_by(|a, b| a.total_cmp(b));
            c.dedup();
            c
        })
        .collect();
    let mut history: Vec<Vec<usize>> = vec![cur.clone()];
    // by_saving: pick the largest absolute saving instead of the largest LC.
    let step = |cur: &[usize], by_saving: bool| -> Option<Vec<usize>> {
        let lat = lat_of(cur);
        let mut best: Option<(bool, f64, Vec<usize>)> = None;
        let offer = |free: bool,
                     score: f64,
                     next: Vec<usize>,
                     best: &mut Option<(bool, f64, Vec<usize>)>| {
            let better = match best {
                None => true,
                Some((bf, bs, _)) => (free && !*bf) || (free == *bf && score > *bs),
            };
            if better {
                *best = Some((free, score, next));
            }
        };
        for (gi, g) in groups.iter().enumerate() {
            // Candidate latencies: every configuration latency of the members.
            let old_max = g.iter().map(|&v| lat[v]).fold(0.0, f64::max);
            let old_cost: f64 = g.iter().map(|&v| point(v, cur[v]).1).sum();
            for &target in &cands[gi] {
                let mut next = cur.to_vec();
                let mut changed = false;
                for &v in g {
                    if app.rates[v] <= 0.0 {
                        continue;
                    }
                    let bestk = if g.len() == 1 {
                        None
                    } else {
                        (0..app.modules[v].configs.len())
                            .filter(|&k| point(v, k).0 <= target * (1.0 + EPS))
                            .min_by(|&a, &b| point(v, a).1.total_cmp(&point(v, b).1))
                    };
                    let k = match bestk {
                        Some(k) => k,
                        None => match (0..app.modules[v].configs.len())
                            .filter(|&k| (point(v, k).0 - target).abs() <= target * EPS)
                            .min_by(|&a, &b| point(v, a).1.total_cmp(&point(v, b).1))
                        {
                            Some(k) => k,
                            None => continue,
                        },
                    };
                    if point(v, k).1 < point(v, cur[v]).1 - 1e-12 {
                        next[v] = k;
                        changed = true;
                    }
                }
                if !changed {
                    continue;
                }
                let new_cost: f64 = g.iter().map(|&v| point(v, next[v]).1).sum();
                let dc = old_cost - new_cost;
                if dc <= 1e-12 {
                    continue;
                }
                let new_lat = lat_of(&next);
                if path_len(&new_lat) > app.slo * (1.0 + EPS) {
                    continue;
                }
                let new_max = g.iter().map(|&v| new_lat[v]).fold(0.0, f64::max);
                let dl = new_max - old_max;
                let free = dl <= 0.0;
                let score = if by_saving || free { dc } else { dc / dl };
                offer(free, score, next, &mut best);
            }
        }
        best.map(|b| b.2)
    };
    while let Some(next) = step(&cur, false) {
        cur = next;
        history.push(cur.clone());
        if history.len() > 100_000 {
            break;
        }
    }
    if o.cost_direct > 0 && history.len() > 1 {
        let back = history.len().saturating_sub(o.cost_direct + 1);
        let mut alt = history[back].clone();
        while let Some(next) = step(&alt, true) {
            alt = next;
        }
        let cost = |c: &[usize]| (0..n).map(|v| point(v, c[v]).1).sum::<f64>();
        if cost(&alt) < cost(&cur) - 1e-12 {
            cur = alt;
        }
    }
    Ok(cur)
}

/// Harpagon, Piccolo and their ablations.
pub fn harpagon_with(app: &App, name: &str, o: &HarpagonOptions) -> Result<Plan, String> {
    harpagon_split_by(app, name, o, &mut |o| lc_split(app, o))
}

/// Several of Harpagon's variants on one application: the latency-cost
/// splitter runs once per setting it depends on (dispatch, node merger,
/// cost-direct), shared by the variants that agree on them. Each result is
/// what [`harpagon_with`] returns.
pub fn harpagon_family(app: &App, runs: &[(&str, HarpagonOptions)]) -> Vec<Result<Plan, String>> {
    type Key = (Dispatch, bool, usize);
    let mut cache: Vec<(Key, Result<Vec<usize>, String>)> = Vec::new();
    let mut split = |o: &HarpagonOptions| {
        let key = (o.dispatch, o.merger, o.cost_direct);
        if let Some((_, r)) = cache.iter().find(|(k, _)| *k == key) {
            return r.clone();
        }
        let r = lc_split(app, o);
        cache.push((key, r.clone()));
        r
    };
    runs.iter()
        .map(|(name, o)| harpagon_split_by(app, name, o, &mut split))
        .collect()
}

fn harpagon_split_by(
    app: &App,
    name: &str,
    o: &HarpagonOptions,
    lc_split: &mut dyn FnMut(&HarpagonOptions) -> Result<Vec<usize>, String>,
) -> Result<Plan, String> {
    let p = prices(app);
    let n = app.modules.len();
    let mut budgets: Vec<f64> = match o.split {
        Split::LatencyCost => {
            let cur = lc_split(o)?;
            (0..n)
                .map(|v| {
                    let c = &app.modules[v].configs[cur[v]];
                    if app.rates[v] > 0.0 {
                        lc_point(c, app.rates[v], p[c.hw], o.dispatch).0
                    } else {
                        0.0
                    }
                })
                .collect()
        }
        Split::Throughput => {
            let mut b: Vec<f64> = (0..n)
                .map(|v| {
                    let c = module::sorted(&app.modules[v].configs, &p)[0];
                    lc_point(&c, app.rates[v].max(1e-9), p[c.hw], o.dispatch).0
                })
                .collect();
            let len = app.longest_path(&b).0;
            for x in &mut b {
                *x *= app.slo / len;
            }
            b
        }
        Split::Quantised(q) => {
            let step = q * app.slo;
            let mut pts = Vec::new();
            for v in 0..n {
                let cfgs = module::sorted(&app.modules[v].configs, &p);
                let mut f = Vec::new();
                let mut k = 1.0;
                while k * step <= l_max(app, v) * (1.0 + EPS) {
                    let l = k * step;
                    if let Some(s) = module::plan_module(
                        &cfgs,
                        &p,
                        app.rates[v],
                        l,
                        o.configs,
                        o.dispatch,
                        o.dummies,
                    ) {
                        f.push(Point {
                            worst: l,
                            cost: s.cost,
                            allocs: s.allocs,
                            dummy: s.dummy,
                        });
                    }
                    k += 1.0;
                }
                pts.push(module::pareto(f));
            }
            let pick =
                choose_points(app, &pts).ok_or("split: no split on the grid fits the SLO")?;
            (0..n).map(|v| pts[v][pick[v]].worst).collect()
        }
    };
    if o.rescale {
        let len = app.longest_path(&budgets).0;
        if len > 0.0 {
            for b in &mut budgets {
                *b *= app.slo / len;
            }
        }
    } else if o.reassign {
        reassign(app, &mut budgets);
    }
    let mut mods = Vec::with_capacity(n);
    for (v, &budget) in budgets.iter().enumerate() {
        let cfgs = module::sorted(&app.modules[v].configs, &p);
        let s = module::plan_module(
            &cfgs,
            &p,
            app.rates[v],
            budget,
            o.configs,
            o.dispatch,
            o.dummies,
        )
        .ok_or_else(|| {
            format!(
                "{}: module {}: no plan within its budget {:.3} ms",
                module::failure_cause(&cfgs, app.rates[v], budget, o.dispatch),
                app.modules[v].name,
                budget * 1e3
            )
        })?;
        mods.push(module_plan(app, v, budget, s.allocs, s.dummy, o.dispatch));
    }
    Ok(Plan::assemble(name, app, mods))
}

/// Harpagon's ablations, named as the paper does.
pub fn ablations() -> Vec<(&'static str, HarpagonOptions)> {
    let h = HarpagonOptions::harpagon();
    vec![
        (
            "round-robin",
            HarpagonOptions {
                dispatch: Dispatch::RoundRobin,
                ..h
            },
        ),
        (
            "one-config",
            HarpagonOptions {
                configs: Configs::One,
                ..h
            },
        ),
        (
            "two-configs",
            HarpagonOptions {
                configs: Configs::Two,
                ..h
            },
        ),
        (
            "no-dummies",
            HarpagonOptions {
                dummies: Dummies::None,
                ..h
            },
        ),
        (
            "no-reassign",
            HarpagonOptions {
                reassign: false,
                ..h
            },
        ),
        (
            "throughput-split",
            HarpagonOptions {
                split: Split::Throughput,
                ..h
            },
        ),
        (
            "quantised-0.1",
            HarpagonOptions {
                split: Split::Quantised(0.1),
                ..h
            },
        ),
        (
            "quantised-0.01",
            HarpagonOptions {
                split: Split::Quantised(0.01),
                ..h
            },
        ),
    ]
}

// ---------------------------------------------------------------- clipper

pub fn clipper(app: &App) -> Result<Plan, String> {
    let p = prices(app);
    let n = app.modules.len();
    // Even split: each module gets SLO / (modules on the longest path through it).
    let ones = vec![1.0; n];
    let order = app.topo();
    let mut head = vec![0.0f64; n];
    for &u in &order {
        head[u] = app.parents(u).map(|q| head[q]).fold(0.0, f64::max) + ones[u];
    }
    let mut tail = vec![0.0f64; n];
    for &u in order.iter().rev() {
        tail[u] = app.children(u).map(|c| tail[c]).fold(0.0, f64::max) + ones[u];
    }
    let mut mods = Vec::new();
    for v in 0..n {
        let budget = app.slo / (head[v] + tail[v] - 1.0);
        let cfgs = module::sorted(&app.modules[v].configs, &p);
        let s = module::plan_module(
            &cfgs,
            &p,
            app.rates[v],
            budget,
            Configs::One,
            Dispatch::RoundRobin,
            Dummies::None,
        )
        .ok_or_else(|| {
            format!(
                "{}: module {}: no configuration meets {:.3} ms",
                module::failure_cause(&cfgs, app.rates[v], budget, Dispatch::RoundRobin),
                app.modules[v].name,
                budget * 1e3
            )
        })?;
        mods.push(module_plan(
            app,
            v,
            budget,
            s.allocs,
            0.0,
            Dispatch::RoundRobin,
        ));
    }
    Ok(Plan::assemble("clipper", app, mods))
}

// ---------------------------------------------------------------- nexus

/// Nexus's plan of one module at budget `l`, on hardware type `hw`: saturated
/// machines at `B = max b: 2 l(b) <= l`, the residual at `max b: l(b) + b/r <= l`.
pub fn nexus_module(app: &App, v: usize, hw: usize, l: f64) -> Option<(Vec<Alloc>, f64)> {
    let r = app.rates[v];
    if r <= 0.0 {
        return Some((vec![], 0.0));
    }
    let mut dummy = 0.0;
    let cfgs: Vec<&Config> = app.modules[v]
        .configs
        .iter()
        .filter(|c| c.hw == hw && c.concurrency == 1)
        .collect();
    let sat = cfgs
        .iter()
        .filter(|c| 2.0 * c.latency <= l * (1.0 + EPS))
        .max_by_key(|c| c.batch)?;
    let n = (r / sat.throughput + 1e-9).floor();
    let rest = r - n * sat.throughput;
    let mut out = vec![];
    if n > 0.0 {
        out.push(Alloc {
            config: **sat,
            count: n,
        });
    }
    if rest > EPS * r {
        // The paper's residual batch: the largest b with l(b) + b/r <= L; when
        // none fits (a small rest), a duty cycle D = min(b/r, L - l(b)) >= l(b)
        // that runs more often than the rest fills a batch, occupancy l(b)/D:
        // the lowest occupancy, as the packer does.
        let res = cfgs
            .iter()
            .filter(|c| {
                c.latency + f64::from(c.batch) / rest <= l * (1.0 + EPS) && c.throughput >= rest
            })
            .max_by_key(|c| c.batch);
        match res {
            Some(res) => {
                if res.batch == sat.batch && n > 0.0 {
                    out[0].count += rest / res.throughput;
                } else {
                    out.push(Alloc {
                        config: **res,
                        count: rest / res.throughput,
                    });
                }
            }
            None => {
                let (c, occ) = cfgs
                    .iter()
                    .filter_map(|c| {
                        let d = (f64::from(c.batch) / rest).min(l - c.latency);
                        (d >= c.latency && d > 0.0).then(|| (**c, c.latency / d))
                    })
                    .min_by(|a, b| (a.1 * prices(app)[hw]).total_cmp(&(b.1 * prices(app)[hw])))?;
                // Served at b / D: the machine's extra rate is dummy capacity.
                dummy = occ * c.throughput - rest;
                out.push(Alloc {
                    config: c,
                    count: occ,
                });
            }
        }
    }
    Some((out, dummy))
}

pub fn nexus(app: &App) -> Result<Plan, String> {
    let p = prices(app);
    let n = app.modules.len();
    let step = app.slo / 100.0;
    let mut pts = Vec::new();
    for v in 0..n {
        let mut f = Vec::new();
        let mut k = 1.0;
        while k * step <= l_max(app, v) * (1.0 + EPS) {
            let l = k * step;
            let best = (0..app.hardware.len())
                .filter_map(|h| nexus_module(app, v, h, l))
                .min_by(|a, b| super::alloc_cost(&a.0, &p).total_cmp(&super::alloc_cost(&b.0, &p)));
            if let Some((a, dummy)) = best {
                f.push(Point {
                    worst: l,
                    cost: super::alloc_cost(&a, &p),
                    allocs: a,
                    dummy,
                });
            }
            k += 1.0;
        }
        pts.push(module::pareto(f));
    }
    let pick = choose_points(app, &pts).ok_or("split: no split on Nexus's grid fits the SLO")?;
    let mut mods: Vec<ModulePlan> = (0..n)
        .map(|v| {
            let q = &pts[v][pick[v]];
            module_plan(
                app,
                v,
                q.worst,
                q.allocs.clone(),
                q.dummy,
                Dispatch::RoundRobin,
            )
        })
        .collect();
    super::nexus::merge_prefixes(app, &mut mods);
    Ok(Plan::assemble("nexus", app, mods))
}

// ---------------------------------------------------------------- scrooge

/// Scrooge's MILP: per module, binaries over its configurations, rates split over
/// the chosen ones (Σ = r), each chosen one's worst case `W = d + b / t` within
/// the module's latency; paths within the SLO; minimise Σ price · rate / t.
/// Returns each module's (configuration, rate) list.
///
/// The objective is linear in each module's rate and a configuration's
/// constraint does not depend on its rate, so an optimum puts each module's rate
/// on one configuration: the MILP is solved as a choice of one point
/// (`W`, `price · r / t`) per module by [`choose_points`] (the exact DP on
/// forests, HiGHS on DAGs with joins).
fn scrooge_milp(app: &App) -> Option<Vec<Vec<(Config, f64)>>> {
    let p = prices(app);
    let mut pts = Vec::new();
    let mut which: Vec<Vec<Option<Config>>> = Vec::new();
    for v in 0..app.modules.len() {
        let r = app.rates[v];
        if r <= 0.0 {
            pts.push(vec![Point {
                worst: 0.0,
                cost: 0.0,
                allocs: vec![],
                dummy: 0.0,
            }]);
            which.push(vec![None]);
            continue;
        }
        let mut f: Vec<Point> = app.modules[v]
            .configs
            .iter()
            .map(|c| Point {
                worst: c.latency + f64::from(c.batch) / c.throughput,
                cost: p[c.hw] * r / c.throughput,
                allocs: vec![Alloc {
                    config: *c,
                    count: r / c.throughput,
                }],
                dummy: 0.0,
            })
            .collect();
        f = module::pareto(f);
        which.push(f.iter().map(|q| Some(q.allocs[0].config)).collect());
        pts.push(f);
    }
    let pick = choose_points(app, &pts)?;
    Some(
        (0..app.modules.len())
            .map(|v| match which[v][pick[v]] {
                Some(c) => vec![(c, app.rates[v])],
                None => vec![],
            })
            .collect(),
    )
}

/// Scrooge: its MILP, then the partial-worker refinement. A module whose rate
/// leaves a partial worker at rate `f` gets, for every configuration `c'` of
/// any type, the option of serving `f` on `c'` with `W* = d' + b' / f'` per
/// machine; the MILP is re-run over those options with every other module's
/// configuration fixed (one choice per partial worker, every path within the
/// SLO, the lowest cost), so the refined workers share the slack the MILP left.
pub fn scrooge(app: &App) -> Result<Plan, String> {
    let p = prices(app);
    let n = app.modules.len();
    let alloc =
        scrooge_milp(app).ok_or("milp: Scrooge's MILP found no allocation within the SLO")?;
    let rr = Dispatch::RoundRobin;
    let mut pts: Vec<Vec<Point>> = Vec::with_capacity(n);
    for (module, chosen) in app.modules.iter().zip(&alloc) {
        let point = |allocs: Vec<Alloc>| Point {
            worst: if allocs.is_empty() {
                0.0
            } else {
                worst_case(&allocs, rr, &p)
            },
            cost: super::alloc_cost(&allocs, &p),
            allocs,
            dummy: 0.0,
        };
        let Some(&(c, t)) = chosen.first() else {
            pts.push(vec![point(vec![])]);
            continue;
        };
        let nfull = (t / c.throughput + 1e-9).floor();
        let rest = t - nfull * c.throughput;
        if rest <= EPS * t {
            pts.push(vec![point(vec![Alloc {
                config: c,
                count: nfull,
            }])]);
            continue;
        }
        let mut f = Vec::new();
        for c2 in &module.configs {
            // The partial worker alone on c2 (full machines of c2 first if the
            // rest exceeds one); its worst case is checked by `choose_points`.
            let Some(tail) = module::algorithm1(&[*c2], &p, rest, f64::INFINITY, Configs::One, rr)
            else {
                continue;
            };
            let mut allocs = Vec::new();
            if nfull > 0.0 {
                allocs.push(Alloc {
                    config: c,
                    count: nfull,
                });
            }
            for a in tail {
                match allocs.last_mut() {
                    Some(l) if l.config == a.config && l.partial() == 0.0 => l.count += a.count,
                    _ => allocs.push(a),
                }
            }
            f.push(point(allocs));
        }
        pts.push(module::pareto(f));
    }
    let pick = choose_points(app, &pts).ok_or_else(|| {
        // Name a module whose partial worker cannot meet the budget left to it.
        let lat: Vec<f64> = pts
            .iter()
            .map(|q| q.iter().map(|x| x.worst).fold(f64::INFINITY, f64::min))
            .collect();
        let (len, path) = app.longest_path(&lat);
        format!(
            "residual: no configuration serves the partial workers on path {} within the SLO ({:.3} ms at the least, SLO {:.3} ms)",
            path.iter()
                .map(|&v| app.modules[v].name.as_str())
                .collect::<Vec<_>>()
                .join(" -> "),
            len * 1e3,
            app.slo * 1e3
        )
    })?;
    let mut budgets: Vec<f64> = (0..n).map(|v| pts[v][pick[v]].worst).collect();
    reassign(app, &mut budgets);
    let mods = (0..n)
        .map(|v| module_plan(app, v, budgets[v], pts[v][pick[v]].allocs.clone(), 0.0, rr))
        .collect();
    Ok(Plan::assemble("scrooge", app, mods))
}

/// Runs a planner by name (`exact` with `stop` as its time limit).
pub fn run(app: &App, name: &str, stop: &mut dyn FnMut() -> bool) -> Result<Plan, String> {
    match name {
        "fermata" => fermata(app),
        "fermata-integral" => fermata_integral(app),
        "exact" => {
            exact(app, stop)?.ok_or_else(|| "limit: exact stopped at its time limit".to_string())
        }
        "harpagon" => harpagon_with(app, "harpagon", &HarpagonOptions::harpagon()),
        "piccolo" => harpagon_with(app, "piccolo", &HarpagonOptions::piccolo()),
        "inferline" => harpagon_with(app, "inferline", &HarpagonOptions::inferline()),
        "scrooge" => scrooge(app),
        "nexus" => nexus(app),
        "clipper" => clipper(app),
        other => Err(format!(
            "unknown planner {other:?}: one of {}",
            PLANNERS.join(", ")
        )),
    }
}
