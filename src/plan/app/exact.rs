//! `exact`: PLANNERS.md's brute force (choice 10). Per module, every ordered
//! list of distinct configurations in `t / p` order with integer full counts and
//! one final partial machine (or a dummy that makes it full), every machine
//! meeting its worst case; per application, one list per module with every
//! path within the SLO, at the lowest total fractional cost.
//!
//! [`exact_simple`] enumerates every list and every combination as written.
//! [`exact`] reaches the same optimum with the enumeration pruned, each cut
//! sound for that definition:
//!
//! * **An incumbent.** A cost `U` that some choice of lists of the brute
//!   force's shape reaches: `fermata`'s exact step functions searched within
//!   [`FERMATA_NODES`] nodes per module and one point per module chosen by
//!   [`choose_points`]. The optimum costs at most `U`, so a list of module `v`
//!   dearer than `U − Σ_{u≠v} min_u` (`min_u`: module `u`'s cheapest list at its
//!   loosest budget) is in no optimal choice, and neither is a combination
//!   dearer than `U`. Should nothing be found under `U` (it can only be that
//!   `U` was below the optimum by rounding), the search is run again without it.
//! * **Lists.** Each module's Pareto lists (worst case, cost) are found one
//!   at a time, cheapest first: the cheapest list within the loosest budget,
//!   then the cheapest within just below its worst case, and so on until the
//!   cheapest passes the module's cap. Each is a branch and bound over the
//!   lists: a prefix is extended only where it can still end in a list that
//!   meets the budget (full machines of a configuration batch at most at the
//!   rate left plus the largest dummy, so their worst case cannot fall below
//!   `d + b / that`) and costs at most the cheapest so far. The rest must
//!   take at least the rate left and, for each of the prefix's
//!   configurations, `b / (L − d)` less the prefix's machines no more
//!   cost-efficient than it (their batches form at that rate plus all of the
//!   rest's, its dummy included); it costs at least that at the best price
//!   per throughput still available.
//! * **Combinations.** Modules in topological order, each module's points
//!   cheapest first; a point is skipped where the smallest worst cases of the
//!   modules after it already break the SLO, and the search stops where the
//!   cheapest completion passes the best total so far.

use super::fermata::{points, FermataOptions, Objective, FERMATA_NODES};
use super::module::{self, Budget, Point};
use super::planners::{choose_points, l_max, plan_from_points, prices};
use super::{alloc_cost, worst_case, Alloc, App, Config, Plan, EPS};

/// `exact`: `Ok(None)` when `stop` ended it first.
pub fn exact(app: &App, stop: &mut dyn FnMut() -> bool) -> Result<Option<Plan>, String> {
    let mut budget = Budget::new(u64::MAX, stop);
    let incumbent = incumbent(app);
    if let Some(u) = incumbent {
        match search(app, u * (1.0 + 1e-7), &mut budget)? {
            Found::Plan(p) => return Ok(Some(p)),
            Found::Stopped => return Ok(None),
            Found::Nothing => {}
        }
    }
    match search(app, f64::INFINITY, &mut budget)? {
        Found::Plan(p) => Ok(Some(p)),
        Found::Stopped => Ok(None),
        Found::Nothing => Err("no choice of budgets fits the SLO".into()),
    }
}

/// The cheapest choice of lists of the brute force's shape costing less than
/// `cost`: [`exact`]'s search with `cost` as its incumbent, within `nodes`
/// branch-and-bound nodes in all. `None` where there is none, or where the
/// nodes ran out first.
pub fn below(app: &App, cost: f64, nodes: u64) -> Option<Plan> {
    let mut never = || false;
    let mut budget = Budget::new(nodes, &mut never);
    match search(app, cost * (1.0 - 1e-9), &mut budget) {
        Ok(Found::Plan(p)) => Some(p),
        _ => None,
    }
}

/// The cost of a choice of lists of the brute force's shape whose paths are
/// within the SLO (`None` if the bounded search finds none).
fn incumbent(app: &App) -> Option<f64> {
    let o = FermataOptions {
        nodes: FERMATA_NODES,
        grid: false,
        portfolio: false,
        exact_nodes: 0,
        lists_nodes: 0,
        objective: Objective::Fractional,
    };
    let pts = points(app, &o).ok()?;
    let pick = choose_points(app, &pts)?;
    let lat: Vec<f64> = pick
        .iter()
        .enumerate()
        .map(|(v, &k)| pts[v][k].worst)
        .collect();
    (app.longest_path(&lat).0 <= app.slo * (1.0 + EPS))
        .then(|| pick.iter().enumerate().map(|(v, &k)| pts[v][k].cost).sum())
}

enum Found {
    Plan(Plan),
    /// `stop` ended the search.
    Stopped,
    /// No choice costs at most the cap.
    Nothing,
}

/// The cheapest choice costing at most `cap`.
fn search(app: &App, cap: f64, budget: &mut Budget) -> Result<Found, String> {
    let (pts, complete) = match walks(app, cap, budget)? {
        Walks::Nothing => return Ok(Found::Nothing),
        Walks::Lists { pts, complete } => (pts, complete),
    };
    if complete < app.modules.len() {
        return Ok(Found::Stopped);
    }
    match combine(app, &pts, cap, budget) {
        _ if budget.exhausted => Ok(Found::Stopped),
        Some(pick) => Ok(Found::Plan(plan_from_points(app, "exact", &pts, &pick))),
        None => Ok(Found::Nothing),
    }
}

/// Each module's Pareto lists that can be in a choice costing at most a cap.
enum Walks {
    /// Per module, its lists; the first `complete` modules' are all there,
    /// the next one's (if any) are those found before the nodes ran out.
    Lists {
        pts: Vec<Vec<Point>>,
        complete: usize,
    },
    /// Some module has no list that can be in a choice within the cap.
    Nothing,
}

/// Each module's configurations in `t/p` order ([`module::sorted`]).
fn sorted_configs(app: &App, p: &[f64]) -> Vec<Vec<Config>> {
    app.modules
        .iter()
        .map(|m| module::sorted(&m.configs, p))
        .collect()
}

/// Each module's least cost at any budget: its rate at the best price per
/// throughput of its configurations (`cfgs[v]`, priced by `p`).
fn rate_bounds(cfgs: &[Vec<Config>], p: &[f64], app: &App) -> Vec<f64> {
    cfgs.iter()
        .zip(&app.rates)
        .map(|(cs, &rate)| {
            cs.iter()
                .map(|c| p[c.hw] / c.throughput)
                .fold(f64::INFINITY, f64::min)
                * rate.max(0.0)
        })
        .collect()
}

/// Each module's Pareto lists (worst case, cost) that can be in a choice
/// costing at most `cap`: each module's cheapest list at its loosest budget
/// (`min_v`), then [`walk`] up to `cap − Σ_{u≠v} min_u`.
fn walks(app: &App, cap: f64, budget: &mut Budget) -> Result<Walks, String> {
    let p = prices(app);
    let n = app.modules.len();
    let cfgs = sorted_configs(app, &p);
    // Each module's cheapest list at its loosest budget.
    let mut mins = vec![0.0f64; n];
    // Lower bounds while the cheapest lists are searched: the rate at the best
    // price per throughput.
    let mut lower = rate_bounds(&cfgs, &p, app);
    let stopped = || Walks::Lists {
        pts: Vec::new(),
        complete: 0,
    };
    for v in 0..n {
        let others: f64 = (0..n).filter(|&u| u != v).map(|u| lower[u]).sum();
        let mut s = Lists::new(&cfgs[v], &p, app.rates[v], l_max(app, v), cap - others);
        s.run(budget);
        if budget.exhausted {
            return Ok(stopped());
        }
        match s.found.first() {
            Some(q) => {
                mins[v] = q.cost;
                lower[v] = q.cost;
            }
            None if cap.is_finite() => return Ok(Walks::Nothing),
            None => {
                return Err(format!(
                    "module {}: no plan within its budget",
                    app.modules[v].name
                ))
            }
        }
    }
    let total_min: f64 = mins.iter().sum();
    let mut pts = Vec::with_capacity(n);
    for v in 0..n {
        let f = walk(
            &cfgs[v],
            &p,
            app.rates[v],
            l_max(app, v),
            cap - (total_min - mins[v]),
            budget,
        );
        if budget.exhausted {
            pts.push(f);
            return Ok(Walks::Lists { pts, complete: v });
        }
        if f.is_empty() {
            return Ok(Walks::Nothing);
        }
        pts.push(f);
    }
    Ok(Walks::Lists { pts, complete: n })
}

/// Each module's Pareto lists of the brute force's shape, as far down its
/// step function as the cheapest choice costing less than `cost` needs,
/// within `nodes` branch-and-bound nodes in all. Per module its lists found
/// (cheapest first, worst cases decreasing), and whether they are enough:
/// `true` where the cheapest choice of lists costing less than `cost` (if
/// any) is a choice of points among them.
///
/// Lazily, a module's step function is walked one point at a time (the
/// cheapest list below the last one's worst case, as [`walk`] does) and only
/// where it can pay: each module's unwalked part stands as points, one at
/// each configuration's least worst case in a list (`d + b / (r + t_max)`:
/// its batches formed at the whole rate plus the largest dummy) costing the
/// more of its next list's cost (what every list it has not walked costs at
/// least) and the rate at the best price per throughput among the
/// configurations that can meet that worst case. The cheapest choice of
/// those points
/// ([`choose_points`]) is at most the cheapest choice of all lists; where it
/// picks no unwalked part, it is a choice of lists and the cheapest. Else
/// each module whose unwalked part it picks walks one more point, and the
/// choice is made again. `None` where no choice of lists can cost less than
/// `cost` (or no module has one within its loosest budget).
pub fn lists_below(app: &App, cost: f64, nodes: u64) -> Option<Vec<(Vec<Point>, bool)>> {
    let mut never = || false;
    let mut budget = Budget::new(nodes, &mut never);
    let cap = cost * (1.0 - 1e-9);
    let p = prices(app);
    let n = app.modules.len();
    let cfgs = sorted_configs(app, &p);
    let stopped = |known: Vec<Vec<Point>>| {
        let mut k = known;
        k.resize(n, Vec::new());
        Some(k.into_iter().map(|f| (f, false)).collect())
    };
    // Each module's cheapest list at its loosest budget, as in `walks`.
    let mut lower = rate_bounds(&cfgs, &p, app);
    let mut known: Vec<Vec<Point>> = Vec::with_capacity(n);
    for v in 0..n {
        let others: f64 = (0..n).filter(|&u| u != v).map(|u| lower[u]).sum();
        let mut s = Lists::new(&cfgs[v], &p, app.rates[v], l_max(app, v), cap - others);
        s.run(&mut budget);
        if budget.exhausted {
            return stopped(known);
        }
        let q = s.found.pop()?;
        lower[v] = q.cost;
        known.push(vec![q]);
    }
    let total_min: f64 = lower.iter().sum();
    // A module's lists dearer than this are in no choice below the cap.
    let caps: Vec<f64> = (0..n).map(|v| cap - (total_min - lower[v])).collect();
    // A lower bound on a module's cost at budget `w`, as steps `(w_c, cost)`:
    // a list whose worst case is at most `w` uses only configurations whose
    // machines can meet it when their batches form at the whole rate plus
    // the largest dummy (`d + b / (r + t_max) <= w`), and serves the rate at
    // the best price per throughput among them at best.
    let steps: Vec<Vec<(f64, f64)>> = (0..n)
        .map(|v| {
            let r = app.rates[v];
            if r <= 0.0 {
                return Vec::new();
            }
            let tmax = cfgs[v].iter().map(|c| c.throughput).fold(0.0, f64::max);
            let mut t: Vec<(f64, f64)> = cfgs[v]
                .iter()
                .map(|c| {
                    (
                        c.latency + f64::from(c.batch) / (r + tmax),
                        p[c.hw] / c.throughput,
                    )
                })
                .collect();
            t.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut best = f64::INFINITY;
            for x in t.iter_mut() {
                best = best.min(x.1);
                x.1 = best * r;
            }
            t
        })
        .collect();
    // The next list below the last one walked (`None`: none within the cap).
    let next_of = |v: usize, last: &Point, budget: &mut Budget| -> Option<Point> {
        let l = last.worst * (1.0 - 3e-9);
        if app.rates[v] <= 0.0 || l <= 0.0 {
            return None;
        }
        let mut s = Lists::new(&cfgs[v], &p, app.rates[v], l, caps[v]);
        s.run(budget);
        s.found.pop()
    };
    let mut next: Vec<Option<Point>> = Vec::with_capacity(n);
    for v in 0..n {
        let q = next_of(v, &known[v][0], &mut budget);
        if budget.exhausted {
            return stopped(known);
        }
        next.push(q);
    }
    loop {
        // Each module's walked lists and its unwalked part, last.
        let relaxed: Vec<Vec<Point>> = (0..n)
            .map(|v| {
                let mut f = known[v].clone();
                // The unwalked part: worst cases below the last list's, each
                // costing at least the next list and the bound at its budget.
                if let Some(q) = &next[v] {
                    let last = f.last().map_or(f64::INFINITY, |x| x.worst);
                    for &(w, lb) in steps[v].iter().filter(|x| x.0 < last) {
                        f.push(Point {
                            worst: w,
                            cost: lb.max(q.cost),
                            allocs: Vec::new(),
                            dummy: 0.0,
                        });
                    }
                }
                f
            })
            .collect();
        // The choice's work, as nodes.
        for _ in 0..relaxed.iter().map(Vec::len).sum::<usize>() {
            if !budget.tick() {
                return stopped(known);
            }
        }
        let Some(pick) = choose_points(app, &relaxed) else {
            // No choice fits even with every unwalked part: none below the cap.
            return None;
        };
        let mut walked = false;
        for v in 0..n {
            if next[v].is_some() && pick[v] >= known[v].len() {
                let q = next[v].take().expect("a next list");
                next[v] = next_of(v, &q, &mut budget);
                known[v].push(q);
                walked = true;
                if budget.exhausted {
                    return stopped(known);
                }
            }
        }
        if !walked {
            return Some(known.into_iter().map(|f| (f, true)).collect());
        }
    }
}

/// A module's Pareto lists (worst case, cost) up to budget `l` and cost
/// `cap`: the cheapest list within `l`, then the cheapest within just below
/// its worst case, and so on, until none is left or the cheapest passes
/// `cap`.
fn walk(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    l: f64,
    cap: f64,
    budget: &mut Budget,
) -> Vec<Point> {
    let mut out = Vec::new();
    let mut l = l;
    loop {
        let mut s = Lists::new(cfgs, prices, r, l, cap);
        s.run(budget);
        if budget.exhausted {
            return out;
        }
        let Some(q) = s.found.pop() else {
            break;
        };
        // Just below its worst case: the tolerance of the checks is 1e-9.
        let next = q.worst * (1.0 - 3e-9);
        out.push(q);
        if r <= 0.0 || next <= 0.0 {
            break;
        }
        l = next;
    }
    module::pareto(out)
}

/// The cheapest of one module's lists (the shape of
/// [`module::enumerate_lists`]) within budget `l` and cost `cap`, among equal
/// costs the lowest worst case: their enumeration, pruned.
struct Lists<'a> {
    cfgs: &'a [Config],
    prices: &'a [f64],
    r: f64,
    l: f64,
    /// Subtrees whose lists all cost more than this are cut: the cap
    /// given, then just below the cheapest list so far (a list that only
    /// ties it is not searched for).
    cap: f64,
    /// Lists dearer than this are not kept: the cap given, then the
    /// cheapest list so far (a tie found on the way is kept where its worst
    /// case is lower).
    limit: f64,
    /// Largest throughput among `cfgs[j..]`: the largest dummy a list that
    /// goes on from `j` can end with.
    tmax: Vec<f64>,
    cur: Vec<Alloc>,
    /// Lists found within `l` and the cap at the time.
    found: Vec<Point>,
}

impl<'a> Lists<'a> {
    fn new(cfgs: &'a [Config], prices: &'a [f64], r: f64, l: f64, cap: f64) -> Lists<'a> {
        let k = cfgs.len();
        let mut tmax = vec![0.0f64; k + 1];
        for j in (0..k).rev() {
            tmax[j] = tmax[j + 1].max(cfgs[j].throughput);
        }
        Lists {
            cfgs,
            prices,
            r,
            l: l * (1.0 + EPS),
            cap: cap * (1.0 + 1e-9),
            tmax,
            cur: Vec::new(),
            found: Vec::new(),
            limit: cap * (1.0 + 1e-9),
        }
    }

    /// Leaves the cheapest list (if any) in `found`; among costs equal to
    /// 1e-9, the lowest worst case found.
    fn run(&mut self, budget: &mut Budget) {
        if self.r <= 0.0 {
            self.found.push(Point {
                worst: 0.0,
                cost: 0.0,
                allocs: vec![],
                dummy: 0.0,
            });
            return;
        }
        self.rec(0, self.r, 0.0, budget);
        let found = std::mem::take(&mut self.found);
        let least = found.iter().map(|q| q.cost).fold(f64::INFINITY, f64::min);
        let best = found
            .into_iter()
            .filter(|q| q.cost <= least * (1.0 + 1e-9))
            .min_by(|a, b| a.worst.total_cmp(&b.worst).then(a.cost.total_cmp(&b.cost)));
        self.found.extend(best);
    }

    fn emit(&mut self, dummy: f64) {
        let cost = alloc_cost(&self.cur, self.prices);
        if cost > self.limit {
            return;
        }
        let w = worst_case(&self.cur, super::Dispatch::ThroughputCost, self.prices);
        if w > self.l {
            return;
        }
        // Equal costs (to rounding) met on the way stay (`run` keeps the
        // lowest worst case among them); the search goes on only for
        // cheaper lists. Ties cost the same, and the next search below this
        // list's worst case finds the tie below it, if any.
        self.limit = self.limit.min(cost * (1.0 + 1e-9));
        self.cap = self.cap.min(cost * (1.0 - 1e-9));
        self.found.push(Point {
            worst: w,
            cost,
            allocs: self.cur.clone(),
            dummy,
        });
    }

    /// Lists that go on from configuration `from` with rate `rem` left, the
    /// prefix costing `cost`.
    fn rec(&mut self, from: usize, rem: f64, cost: f64, budget: &mut Budget) {
        let r = self.r;
        let k = self.cfgs.len();
        let ratio = |c: &Config| c.throughput / self.prices[c.hw];
        // The prefix's full machines of configuration `a` form their batches
        // at the rate of the prefix's machines no more cost-efficient than
        // them (`s`) plus all the rest's: so the rest must take at least
        // `b / (L − d) − s` (its last machine's dummy included), and at least
        // the rate left. The dummy fills at most that last machine.
        let mut need = (rem - EPS * r).max(0.0);
        for a in &self.cur {
            let room = self.l - a.config.latency;
            if room <= 0.0 {
                return;
            }
            let ra = ratio(&a.config) * (1.0 + EPS);
            let s: f64 = self
                .cur
                .iter()
                .filter(|y| ratio(&y.config) <= ra)
                .map(|y| y.count * y.config.throughput)
                .sum();
            need = need.max(f64::from(a.config.batch) / room * (1.0 - 1e-9) - s);
        }
        if need > rem + self.tmax[from] {
            return;
        }
        // A configuration `i` from here on batches at most at the rate left,
        // the largest dummy from `i` on and the prefix's machines no more
        // cost-efficient than it: configurations whose worst case even then
        // is above the budget serve none of the rest, which costs at least
        // `need` at the best price per throughput among the others from `j`
        // on.
        let mut ppt = vec![f64::INFINITY; k + 1];
        // The largest throughput and the least price among the same.
        let mut tput = vec![0.0f64; k + 1];
        let mut pmin = vec![f64::INFINITY; k + 1];
        for j in (from..k).rev() {
            let c = &self.cfgs[j];
            ppt[j] = ppt[j + 1];
            tput[j] = tput[j + 1];
            pmin[j] = pmin[j + 1];
            let rc = ratio(c) * (1.0 + EPS);
            let ties: f64 = self
                .cur
                .iter()
                .filter(|y| ratio(&y.config) <= rc)
                .map(|y| y.count * y.config.throughput)
                .sum();
            if c.latency + f64::from(c.batch) / (rem + self.tmax[j] + ties) <= self.l {
                ppt[j] = ppt[j].min(self.prices[c.hw] / c.throughput);
                tput[j] = tput[j].max(c.throughput);
                pmin[j] = pmin[j].min(self.prices[c.hw]);
            }
        }
        // The least a rest from configuration `j` on that must take `need`
        // with `left` of the rate left costs: `need` at the best price per
        // throughput; and where `need` passes `left`, its last machine is
        // full (a dummy tops it up), so every machine of the rest is, and
        // it rents at least `need / t_max` machines at the least price.
        let least = |need: f64, left: f64, j: usize| -> f64 {
            let fluid = need * ppt[j];
            if need > left + 1e-9 * r && tput[j] > 0.0 {
                fluid.max((need / tput[j] * (1.0 - 1e-9)).ceil() * pmin[j])
            } else {
                fluid
            }
        };
        for j in from..k {
            if !budget.tick() {
                return;
            }
            // The rest's cost only rises with `j`.
            if cost + least(need, rem, j) > self.cap {
                return;
            }
            let c = self.cfgs[j];
            let ratio = c.throughput / self.prices[c.hw];
            // Earlier machines as cost-efficient as c batch with it.
            let ties: f64 = self
                .cur
                .iter()
                .filter(|a| a.config.throughput / self.prices[a.config.hw] <= ratio * (1.0 + EPS))
                .map(|a| a.count * a.config.throughput)
                .sum();
            // Full machines of c here batch at most at the rate left, the
            // ties and the largest dummy: a worst case above the budget there
            // rules out every list with one.
            let b = f64::from(c.batch);
            let full_ok = c.latency + b / (rem + ties + self.tmax[j]) <= self.l;
            let nmax = (rem / c.throughput + 1e-9).floor();
            if !full_ok && nmax >= 1.0 {
                continue;
            }
            let p = self.prices[c.hw];
            for n in (0..=nmax as u64).rev() {
                let n = n as f64;
                let rest = rem - n * c.throughput;
                if rest <= EPS * r {
                    self.cur.push(Alloc {
                        config: c,
                        count: n,
                    });
                    self.emit(0.0);
                    self.cur.pop();
                    continue;
                }
                if n == nmax {
                    self.cur.push(Alloc {
                        config: c,
                        count: n + rest / c.throughput,
                    });
                    self.emit(0.0);
                    self.cur.last_mut().unwrap().count = n + 1.0;
                    self.emit(c.throughput - rest);
                    self.cur.pop();
                }
                let rest_need = (rest - EPS * r).max(need - n * c.throughput);
                if n >= 1.0 && cost + n * p + least(rest_need.max(0.0), rest, j + 1) <= self.cap {
                    self.cur.push(Alloc {
                        config: c,
                        count: n,
                    });
                    self.rec(j + 1, rest, cost + n * p, budget);
                    self.cur.pop();
                    if budget.exhausted {
                        return;
                    }
                }
            }
        }
    }
}

/// One point per module, every path within the SLO, the lowest total cost at
/// most `cap`: modules in topological order, points cheapest first.
fn combine(app: &App, pts: &[Vec<Point>], cap: f64, budget: &mut Budget) -> Option<Vec<usize>> {
    let order = app.topo();
    let n = app.modules.len();
    let slo = app.slo * (1.0 + EPS);
    // Cheapest cost of the modules after position i in `order`.
    let mut rest_min = vec![0.0; n + 1];
    for i in (0..n).rev() {
        let v = order[i];
        rest_min[i] = rest_min[i + 1] + pts[v].iter().map(|q| q.cost).fold(f64::INFINITY, f64::min);
    }
    // The longest path below each module at its descendants' smallest worst
    // cases.
    let wmin: Vec<f64> = pts
        .iter()
        .map(|p| p.iter().map(|q| q.worst).fold(f64::INFINITY, f64::min))
        .collect();
    let mut below = vec![0.0f64; n];
    for &v in order.iter().rev() {
        below[v] = app
            .children(v)
            .map(|c| wmin[c] + below[c])
            .fold(0.0, f64::max);
    }
    // Points cheapest first.
    let by_cost: Vec<Vec<usize>> = pts
        .iter()
        .map(|p| {
            let mut k: Vec<usize> = (0..p.len()).collect();
            k.sort_by(|&a, &b| p[a].cost.total_cmp(&p[b].cost));
            k
        })
        .collect();
    struct S<'s> {
        app: &'s App,
        order: &'s [usize],
        pts: &'s [Vec<Point>],
        by_cost: &'s [Vec<usize>],
        rest_min: &'s [f64],
        below: &'s [f64],
        slo: f64,
        bound: f64,
        pick: Vec<usize>,
        finish: Vec<f64>,
        best: Option<Vec<usize>>,
    }
    fn rec(s: &mut S, i: usize, cost: f64, budget: &mut Budget) {
        if i == s.order.len() {
            if cost <= s.bound {
                s.bound = cost * (1.0 - 1e-12);
                s.best = Some(s.pick.clone());
            }
            return;
        }
        let v = s.order[i];
        let start = s.app.parents(v).map(|u| s.finish[u]).fold(0.0, f64::max);
        for &k in &s.by_cost[v] {
            if !budget.tick() {
                return;
            }
            let q = &s.pts[v][k];
            if cost + q.cost + s.rest_min[i + 1] > s.bound {
                break;
            }
            if start + q.worst + s.below[v] > s.slo {
                continue;
            }
            s.pick[v] = k;
            s.finish[v] = start + q.worst;
            rec(s, i + 1, cost + q.cost, budget);
        }
    }
    let mut s = S {
        app,
        order: &order,
        pts,
        by_cost: &by_cost,
        rest_min: &rest_min,
        below: &below,
        slo,
        bound: if cap.is_finite() {
            cap * (1.0 + 1e-9)
        } else {
            f64::INFINITY
        },
        pick: vec![0; n],
        finish: vec![0.0; n],
        best: None,
    };
    rec(&mut s, 0, 0.0, budget);
    s.best
}

/// The brute force as PLANNERS.md writes it: every list of every module
/// ([`module::frontier_brute`]), then every combination of points (pruned by
/// path length and cost). `Ok(None)` when `stop` ended it first. The reference
/// [`exact`] is checked against.
pub fn exact_simple(app: &App, stop: &mut dyn FnMut() -> bool) -> Result<Option<Plan>, String> {
    let p = prices(app);
    let mut budget = Budget::new(u64::MAX, stop);
    let mut pts = Vec::new();
    for v in 0..app.modules.len() {
        let cfgs = module::sorted(&app.modules[v].configs, &p);
        let f = module::frontier_brute(&cfgs, &p, app.rates[v], l_max(app, v), &mut budget);
        if budget.exhausted {
            return Ok(None);
        }
        if f.is_empty() {
            return Err(format!(
                "module {}: no plan within its budget",
                app.modules[v].name
            ));
        }
        pts.push(f);
    }
    let order = app.topo();
    let n = app.modules.len();
    // Cheapest cost of the modules after position i in `order`.
    let mut rest_min = vec![0.0; n + 1];
    for i in (0..n).rev() {
        let v = order[i];
        rest_min[i] = rest_min[i + 1] + pts[v].iter().map(|q| q.cost).fold(f64::INFINITY, f64::min);
    }
    let mut best: Option<(f64, Vec<usize>)> = None;
    let mut pick = vec![0usize; n];
    let mut finish = vec![0.0f64; n];
    #[allow(clippy::too_many_arguments)]
    fn rec(
        app: &App,
        order: &[usize],
        pts: &[Vec<Point>],
        rest_min: &[f64],
        i: usize,
        cost: f64,
        pick: &mut [usize],
        finish: &mut [f64],
        best: &mut Option<(f64, Vec<usize>)>,
        budget: &mut Budget,
    ) {
        if i == order.len() {
            if best.as_ref().is_none_or(|b| cost < b.0 - 1e-12) {
                *best = Some((cost, pick.to_vec()));
            }
            return;
        }
        let v = order[i];
        let start = app.parents(v).map(|u| finish[u]).fold(0.0, f64::max);
        for (k, q) in pts[v].iter().enumerate() {
            if !budget.tick() {
                return;
            }
            if start + q.worst > app.slo * (1.0 + EPS) {
                continue;
            }
            if let Some(b) = best {
                if cost + q.cost + rest_min[i + 1] >= b.0 - 1e-12 {
                    continue;
                }
            }
            pick[v] = k;
            finish[v] = start + q.worst;
            rec(
                app,
                order,
                pts,
                rest_min,
                i + 1,
                cost + q.cost,
                pick,
                finish,
                best,
                budget,
            );
        }
    }
    rec(
        app,
        &order,
        &pts,
        &rest_min,
        0,
        0.0,
        &mut pick,
        &mut finish,
        &mut best,
        &mut budget,
    );
    if budget.exhausted {
        return Ok(None);
    }
    let (_, pick) = best.ok_or("no choice of budgets fits the SLO")?;
    Ok(Some(plan_from_points(app, "exact", &pts, &pick)))
}
