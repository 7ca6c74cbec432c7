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
/// Lazily, a module's step function is known at a few budgets, and only
/// where it can pay. Each budget `y` asked gives the cheapest list within
/// it (`C(y)`, [`Lists`]) and the cheapest just below that list's worst
/// case (its next list): the step function is `C(y)` from that worst case
/// up to `y`, and every list between the next budget asked below (or 0) and
/// the next list's worst case costs at least the next list's cost. Those
/// unknown parts stand as points, one at each configuration's least worst
/// case in a list (`d + b / (r + t_max)`: its batches formed at the whole
/// rate plus the largest dummy) within the part and one at its lower end,
/// costing the more of the next list's cost and the rate at the best price
/// per throughput among the configurations that can meet that worst case.
/// The cheapest choice of the lists found and those points
/// ([`choose_points`]) is at most the cheapest choice of all lists; where it
/// picks no unknown part, it is a choice of lists and the cheapest. Else
/// each module whose unknown part it picks is asked at the budget the
/// others' choices leave it (or, where that is the part's lower end, at the
/// middle of the part), and the choice is made again: a module whose step
/// function has hundreds of breakpoints of nearly equal cost (many machines
/// whose last ones trade configurations) is known where the choice needs it
/// after a few budgets, not walked from its loosest budget down. `None`
/// where no choice of lists can cost less than `cost` (or no module has one
/// within its loosest budget).
pub fn lists_below(app: &App, cost: f64, nodes: u64) -> Option<Vec<(Vec<Point>, bool)>> {
    let mut never = || false;
    let mut budget = Budget::new(nodes, &mut never);
    let cap = cost * (1.0 - 1e-9);
    let p = prices(app);
    let n = app.modules.len();
    let cfgs = sorted_configs(app, &p);
    // Each module's lists found: every budget's list and next list.
    let found = |segs: &[Vec<Seg>]| -> Vec<Vec<Point>> {
        let mut out: Vec<Vec<Point>> = segs
            .iter()
            .map(|ss| {
                module::pareto(
                    ss.iter()
                        .flat_map(|x| x.q.iter().chain(x.next.iter()).cloned())
                        .collect(),
                )
            })
            .collect();
        out.resize(n, Vec::new());
        out
    };
    let stopped = |segs: &[Vec<Seg>]| Some(found(segs).into_iter().map(|f| (f, false)).collect());
    // Each module's cheapest list at its loosest budget, as in `walks`.
    let mut lower = rate_bounds(&cfgs, &p, app);
    let mut first: Vec<Point> = Vec::with_capacity(n);
    for v in 0..n {
        let others: f64 = (0..n).filter(|&u| u != v).map(|u| lower[u]).sum();
        let mut s = Lists::new(&cfgs[v], &p, app.rates[v], l_max(app, v), cap - others);
        s.seed();
        s.run(&mut budget);
        if budget.exhausted {
            let segs: Vec<Vec<Seg>> = first
                .into_iter()
                .map(|q| {
                    vec![Seg {
                        budget: 0.0,
                        q: Some(q),
                        next: None,
                    }]
                })
                .collect();
            return stopped(&segs);
        }
        let q = s.found.pop()?;
        lower[v] = q.cost;
        first.push(q);
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
    // The bound at budget `w` (`None`: no configuration can meet it).
    let fluid = |v: usize, w: f64| -> Option<f64> {
        steps[v].iter().take_while(|x| x.0 <= w).last().map(|x| x.1)
    };
    // The cheapest list within budget `l` (`None`: none within the cap).
    let at = |v: usize, l: f64, budget: &mut Budget| -> Option<Point> {
        if app.rates[v] <= 0.0 || l <= 0.0 {
            return None;
        }
        let mut s = Lists::new(&cfgs[v], &p, app.rates[v], l, caps[v]);
        s.seed();
        s.run(budget);
        s.found.pop()
    };
    // The list below a list's worst case.
    let below = |v: usize, q: &Point, budget: &mut Budget| -> Option<Point> {
        at(v, q.worst * (1.0 - 3e-9), budget)
    };
    let mut segs: Vec<Vec<Seg>> = Vec::with_capacity(n);
    for (v, q) in first.into_iter().enumerate() {
        let next = below(v, &q, &mut budget);
        segs.push(vec![Seg {
            budget: l_max(app, v),
            q: Some(q),
            next,
        }]);
        if budget.exhausted {
            return stopped(&segs);
        }
    }
    loop {
        // Each module's lists found and its unknown parts.
        let mut relaxed: Vec<Vec<Point>> = Vec::with_capacity(n);
        // Per module and point: the segment whose unknown part it stands
        // for (`None`: a list).
        let mut part: Vec<Vec<Option<usize>>> = Vec::with_capacity(n);
        for v in 0..n {
            let ss = &segs[v];
            let mut f: Vec<Point> = Vec::new();
            let mut tag: Vec<Option<usize>> = Vec::new();
            for x in ss {
                for q in x.q.iter().chain(x.next.iter()) {
                    f.push(q.clone());
                    tag.push(None);
                }
            }
            let lists = f.len();
            for (i, x) in ss.iter().enumerate() {
                let Some(q) = &x.next else { continue };
                // The part: worst cases from the next budget asked below (or
                // 0) up to the next list's.
                let lo = ss.get(i + 1).map_or(0.0, |y| y.budget);
                if q.worst <= lo {
                    continue;
                }
                let mut piece = |w: f64, c: f64| {
                    // Left out where a list found is as fast and as cheap.
                    if !f[..lists].iter().any(|y| y.worst <= w && y.cost <= c) {
                        f.push(Point {
                            worst: w,
                            cost: c,
                            allocs: Vec::new(),
                            dummy: 0.0,
                        });
                        tag.push(Some(i));
                    }
                };
                for &(w, lb) in steps[v].iter().filter(|y| y.0 > lo && y.0 < q.worst) {
                    piece(w, lb.max(q.cost));
                }
                if lo > 0.0 {
                    if let Some(lb) = fluid(v, lo) {
                        piece(lo, lb.max(q.cost));
                    }
                }
            }
            relaxed.push(f);
            part.push(tag);
        }
        // The choice's work, as nodes.
        for _ in 0..relaxed.iter().map(Vec::len).sum::<usize>() {
            if !budget.tick() {
                return stopped(&segs);
            }
        }
        let Some(pick) = choose_points(app, &relaxed) else {
            // No choice fits even with every unknown part: none below the cap.
            return None;
        };
        let lat: Vec<f64> = (0..n).map(|v| relaxed[v][pick[v]].worst).collect();
        let mut asked = false;
        for v in 0..n {
            let Some(i) = part[v][pick[v]] else { continue };
            let (lo, top) = {
                let ss = &segs[v];
                let q = ss[i].next.as_ref().expect("a next list");
                (ss.get(i + 1).map_or(0.0, |y| y.budget), q.worst)
            };
            // The budget the others' choices leave it.
            let room = app.room_within(app.slo * (1.0 + EPS), &lat, v);
            let y = if room >= top {
                // Its next list fits (a tie): it is taken, and the list
                // below it asked.
                top
            } else if room > lo * (1.0 + 1e-9) {
                room
            } else {
                0.5 * (lo + top)
            };
            let q = if y == top {
                segs[v][i].next.clone()
            } else {
                at(v, y, &mut budget)
            };
            let next = match &q {
                Some(q) if !budget.exhausted => below(v, q, &mut budget),
                _ => None,
            };
            if budget.exhausted {
                return stopped(&segs);
            }
            let b = if y == top {
                segs[v][i].q.as_ref().map_or(y, |x| x.worst * (1.0 - 3e-9))
            } else {
                y
            };
            segs[v].insert(i + 1, Seg { budget: b, q, next });
            asked = true;
        }
        if !asked {
            return Some(found(&segs).into_iter().map(|f| (f, true)).collect());
        }
    }
}

/// A budget asked of one module in [`lists_below`]: the cheapest list within
/// it (`None`: none within the module's cap) and the cheapest list below
/// that one's worst case.
struct Seg {
    budget: f64,
    q: Option<Point>,
    next: Option<Point>,
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

    /// Starts the search with Algorithm 1's lists at the budget (without a
    /// dummy, and with Harpagon's, which fills the last machine) as the
    /// cheapest so far, where they have this shape and are within the budget
    /// and the cap: the cost bound then prunes from the first node.
    fn seed(&mut self) {
        if self.r <= 0.0 {
            return;
        }
        for d in [module::Dummies::None, module::Dummies::Harpagon] {
            let Some(s) = module::plan_module(
                self.cfgs,
                self.prices,
                self.r,
                self.l,
                module::Configs::Any,
                super::Dispatch::ThroughputCost,
                d,
            ) else {
                continue;
            };
            if !self.has_shape(&s.allocs, s.dummy) {
                continue;
            }
            self.cur = s.allocs;
            self.emit(s.dummy);
            self.cur.clear();
        }
    }

    /// Whether `allocs` (with `dummy`) is one of the lists [`Lists::rec`]
    /// enumerates: distinct configurations in the order of `cfgs`, whole
    /// counts but the last, which takes the rate left (as a partial machine,
    /// or whole machines and a dummy that tops the last one up).
    fn has_shape(&self, allocs: &[Alloc], dummy: f64) -> bool {
        let r = self.r;
        let mut at = 0usize;
        let mut rem = r;
        for (i, a) in allocs.iter().enumerate() {
            let Some(j) = (at..self.cfgs.len()).find(|&j| self.cfgs[j] == a.config) else {
                return false;
            };
            at = j + 1;
            let t = a.config.throughput;
            let last = i + 1 == allocs.len();
            if !last {
                let n = a.count.round();
                if n < 1.0 || (a.count - n).abs() > 1e-12 || n * t >= rem - EPS * r {
                    return false;
                }
                rem -= n * t;
                continue;
            }
            let nmax = (rem / t + 1e-9).floor();
            let rest = rem - nmax * t;
            return if rest <= EPS * r {
                dummy == 0.0 && (a.count - nmax).abs() <= 1e-9
            } else if dummy > 0.0 {
                (a.count - (nmax + 1.0)).abs() <= 1e-12 && (dummy - (t - rest)).abs() <= EPS * r
            } else {
                (a.count - (nmax + rest / t)).abs() <= 1e-9
            };
        }
        allocs.is_empty() && rem <= EPS * r
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
