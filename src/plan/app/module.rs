//! One module at one latency budget: which configurations, how many machines.
//!
//! Configurations are taken in descending throughput-cost order `t / p`
//! ([`sorted`]). Under throughput-cost (TC) dispatch a full machine of
//! configuration `i` forms its batches at `w`, the rate of every machine no more
//! cost-efficient than it (the rate left when its configuration's turn comes), so it
//! meets budget `L` iff `d + b / w <= L`; the partial machine, last, forms its
//! batches at its own rate.

use super::{alloc_cost, worst_case, Alloc, Config, Dispatch, EPS};

/// The configurations of a module, best throughput per price first (ties: lower
/// latency first).
pub fn sorted(configs: &[Config], prices: &[f64]) -> Vec<Config> {
    let mut v = configs.to_vec();
    v.sort_by(|a, b| {
        let ra = a.throughput / prices[a.hw];
        let rb = b.throughput / prices[b.hw];
        rb.total_cmp(&ra).then(a.latency.total_cmp(&b.latency))
    });
    v
}

fn ratio(c: &Config, prices: &[f64]) -> f64 {
    c.throughput / prices[c.hw]
}

/// Whether full machines of `c` meet `l` when their batches form at `w`.
fn full_ok(c: &Config, w: f64, l: f64, dispatch: Dispatch) -> bool {
    let wait = match dispatch {
        Dispatch::ThroughputCost => f64::from(c.batch) / w,
        Dispatch::RoundRobin => f64::from(c.batch) / c.throughput,
    };
    c.latency + wait <= l * (1.0 + EPS)
}

fn partial_ok(c: &Config, f: f64, l: f64) -> bool {
    c.latency + f64::from(c.batch) / f <= l * (1.0 + EPS)
}

fn floor_n(r: f64, t: f64) -> f64 {
    (r / t + 1e-9).floor()
}

/// How many configurations a plan may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Configs {
    One,
    /// Nexus's and Scrooge's ⟨c_opt, c_res⟩: full machines of the first
    /// configuration, the residual on one more.
    Two,
    Any,
}

/// A module's plan at one budget.
#[derive(Debug, Clone)]
pub struct ModuleSolution {
    pub allocs: Vec<Alloc>,
    pub dummy: f64,
    pub cost: f64,
}

/// All of rate `r` on configuration `c` alone: full machines and one partial.
fn single(c: &Config, r: f64, l: f64, dispatch: Dispatch) -> Option<Vec<Alloc>> {
    if r <= 0.0 {
        return Some(vec![]);
    }
    if !full_ok(c, r, l, dispatch) {
        return None;
    }
    let n = floor_n(r, c.throughput);
    let rest = r - n * c.throughput;
    if rest > EPS * r && !partial_ok(c, rest, l) {
        return None;
    }
    Some(vec![Alloc {
        config: *c,
        count: n + (rest.max(0.0) / c.throughput),
    }])
}

fn cheapest_single(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    l: f64,
    dispatch: Dispatch,
) -> Option<Vec<Alloc>> {
    cfgs.iter()
        .filter_map(|c| single(c, r, l, dispatch))
        .min_by(|a, b| alloc_cost(a, prices).total_cmp(&alloc_cost(b, prices)))
}

/// Algorithm 1 (Piccolo, Harpagon): configurations in descending `t / p`; each
/// that meets the budget at the rate left takes as many full machines as fit;
/// the rest goes to one partial machine of the first configuration that meets
/// the budget at that rest. `None` if no list of this shape meets `l`.
/// `Configs::Two` and `Configs::One` give the papers' restricted baselines.
pub fn algorithm1(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    l: f64,
    limit: Configs,
    dispatch: Dispatch,
) -> Option<Vec<Alloc>> {
    if r <= 0.0 {
        return Some(vec![]);
    }
    match limit {
        Configs::One => cheapest_single(cfgs, prices, r, l, dispatch),
        Configs::Two => {
            // c_opt: the first configuration that meets the budget at the full rate
            // with at least one full machine; the residual on its cheapest one.
            let mut best: Option<Vec<Alloc>> = None;
            if let Some(c) = cfgs
                .iter()
                .find(|c| full_ok(c, r, l, dispatch) && floor_n(r, c.throughput) >= 1.0)
            {
                let n = floor_n(r, c.throughput);
                let rest = r - n * c.throughput;
                let head = Alloc {
                    config: *c,
                    count: n,
                };
                let tail = if rest > EPS * r {
                    cheapest_single(cfgs, prices, rest, l, dispatch)
                } else {
                    Some(vec![])
                };
                if let Some(t) = tail {
                    let mut v = vec![head];
                    v.extend(t);
                    if best
                        .as_ref()
                        .is_none_or(|b| alloc_cost(&v, prices) < alloc_cost(b, prices) - EPS)
                    {
                        best = Some(v);
                    }
                }
            }
            // No configuration takes a full machine: one configuration alone.
            best.or_else(|| {
                if cfgs
                    .iter()
                    .any(|c| full_ok(c, r, l, dispatch) && floor_n(r, c.throughput) >= 1.0)
                {
                    None
                } else {
                    cheapest_single(cfgs, prices, r, l, dispatch)
                }
            })
        }
        Configs::Any => {
            let mut rem = r;
            let mut out: Vec<Alloc> = Vec::new();
            for c in cfgs {
                if rem <= EPS * r {
                    break;
                }
                if !full_ok(c, rem, l, dispatch) {
                    continue;
                }
                let n = floor_n(rem, c.throughput);
                rem -= n * c.throughput;
                let mut a = Alloc {
                    config: *c,
                    count: n,
                };
                if rem > EPS * r && partial_ok(c, rem, l) {
                    a.count += rem / c.throughput;
                    rem = 0.0;
                }
                if a.count > 0.0 {
                    out.push(a);
                }
            }
            if rem > EPS * r {
                None
            } else {
                Some(out)
            }
        }
    }
}

/// Algorithm 1's trace: for each configuration it gives full machines and
/// leaves a leftover `u_i` (the rate after them), the list up to and including
/// those full machines, the configuration and `u_i`.
fn leftovers(
    cfgs: &[Config],
    r: f64,
    l: f64,
    dispatch: Dispatch,
) -> Vec<(Vec<Alloc>, Config, f64)> {
    let mut rem = r;
    let mut out = Vec::new();
    let mut list: Vec<Alloc> = Vec::new();
    for c in cfgs {
        if rem <= EPS * r {
            break;
        }
        if !full_ok(c, rem, l, dispatch) {
            continue;
        }
        let n = floor_n(rem, c.throughput);
        rem -= n * c.throughput;
        if n > 0.0 {
            list.push(Alloc {
                config: *c,
                count: n,
            });
        }
        if rem > EPS * r {
            out.push((list.clone(), *c, rem));
        }
        if rem > EPS * r && partial_ok(c, rem, l) {
            break;
        }
    }
    out
}

/// Why a module has no plan at budget `l`: `"budget"` when no configuration
/// meets it even with every machine full (the split left the module too
/// little), `"residual"` when full machines meet it but no configuration serves
/// the residual rate `f` within it (`d + b / f` too long) and the planner's
/// dummies do not help.
pub fn failure_cause(cfgs: &[Config], r: f64, l: f64, dispatch: Dispatch) -> &'static str {
    let full = cfgs.iter().any(|c| {
        let n = (r / c.throughput).ceil().max(1.0);
        let w = match dispatch {
            Dispatch::ThroughputCost => n * c.throughput,
            Dispatch::RoundRobin => c.throughput,
        };
        c.latency + f64::from(c.batch) / w <= l * (1.0 + EPS)
    });
    if full {
        "residual"
    } else {
        "budget"
    }
}

/// Dummy requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dummies {
    None,
    /// `min(b / (L - d), t) - u`: just enough that the leftover meets the
    /// budget, at most a full machine.
    Piccolo,
    /// `t - u`: the leftover's machine runs full.
    Harpagon,
}

/// Algorithm 1 with the dummy generator: each configuration's leftover is topped
/// up by the policy's amount; a dummy is adopted only when the cost falls.
pub fn plan_module(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    l: f64,
    limit: Configs,
    dispatch: Dispatch,
    dummies: Dummies,
) -> Option<ModuleSolution> {
    let base = algorithm1(cfgs, prices, r, l, limit, dispatch).map(|a| ModuleSolution {
        cost: alloc_cost(&a, prices),
        allocs: a,
        dummy: 0.0,
    });
    if dummies == Dummies::None || r <= 0.0 {
        return base;
    }
    let mut best = base;
    for (head, c, u) in leftovers(cfgs, r, l, dispatch) {
        let dum = match dummies {
            Dummies::Harpagon => c.throughput - u,
            Dummies::Piccolo => {
                if l <= c.latency {
                    continue;
                }
                // The leftover's machine at the rate that just meets the budget,
                // at most full: past `t` the dummy would add a machine and leave
                // the same leftover (Theorem 2 has `u < t`), while a full
                // machine joins its configuration's batches and meets the
                // budget there.
                (f64::from(c.batch) / (l - c.latency)).min(c.throughput) - u
            }
            Dummies::None => unreachable!(),
        };
        if dum <= EPS * r {
            continue;
        }
        let a = if limit == Configs::Any {
            // The papers' dummy: the leftover `u_i` and the dummy run on one
            // more machine of `c_i` itself, after the configurations before it
            // (Theorem 2: the leftover needs at most one more machine of c_i).
            let mut a = head;
            match a.last_mut() {
                Some(x) if x.config == c => x.count += (u + dum) / c.throughput,
                _ => a.push(Alloc {
                    config: c,
                    count: (u + dum) / c.throughput,
                }),
            }
            let ok = worst_case(&a, dispatch, prices) <= l * (1.0 + EPS);
            ok.then_some(a)
        } else {
            // One or two configurations: the restricted algorithm at the
            // padded rate.
            algorithm1(cfgs, prices, r + dum, l, limit, dispatch)
        };
        if let Some(a) = a {
            let cost = alloc_cost(&a, prices);
            if best.as_ref().is_none_or(|b| cost < b.cost - 1e-9) {
                best = Some(ModuleSolution {
                    allocs: a,
                    dummy: dum,
                    cost,
                });
            }
        }
    }
    best
}

/// Plans with a dummy outside the papers' shape, for `fermata`'s candidates:
/// for each leftover's dummy (both policies), Algorithm 1 (any number of
/// configurations, and one) run again at the padded rate, the rest of the
/// padded rate on a partial machine.
pub fn padded_plans(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    l: f64,
    dispatch: Dispatch,
) -> Vec<ModuleSolution> {
    let mut out = Vec::new();
    if r <= 0.0 {
        return out;
    }
    for (_, c, u) in leftovers(cfgs, r, l, dispatch) {
        let mut dums = vec![c.throughput - u];
        if l > c.latency {
            dums.push((f64::from(c.batch) / (l - c.latency)).min(c.throughput) - u);
        }
        for dum in dums {
            if dum <= EPS * r {
                continue;
            }
            for limit in [Configs::Any, Configs::One] {
                if let Some(a) = algorithm1(cfgs, prices, r + dum, l, limit, dispatch) {
                    out.push(ModuleSolution {
                        cost: alloc_cost(&a, prices),
                        allocs: a,
                        dummy: dum,
                    });
                }
            }
        }
    }
    out
}

/// A point of a module's cost as a function of its budget: the cheapest plan
/// whose worst case is at most `worst`.
#[derive(Debug, Clone)]
pub struct Point {
    pub worst: f64,
    pub cost: f64,
    pub allocs: Vec<Alloc>,
    pub dummy: f64,
}

/// Work left to a search: it ends at `limit` nodes or when `stop` (asked every
/// 4,096 nodes) returns `true`.
pub struct Budget<'a> {
    pub nodes: u64,
    pub limit: u64,
    pub stop: &'a mut dyn FnMut() -> bool,
    pub exhausted: bool,
}

impl<'a> Budget<'a> {
    pub fn new(limit: u64, stop: &'a mut dyn FnMut() -> bool) -> Budget<'a> {
        Budget {
            nodes: 0,
            limit,
            stop,
            exhausted: false,
        }
    }
    pub fn tick(&mut self) -> bool {
        if self.exhausted {
            return false;
        }
        self.nodes += 1;
        if self.nodes >= self.limit {
            self.exhausted = true;
            return false;
        }
        if self.nodes.is_multiple_of(4096) && (self.stop)() {
            self.exhausted = true;
            return false;
        }
        true
    }
}

/// Every list PLANNERS.md's brute force allows: distinct configurations in `t / p`
/// order, integer full counts, one final partial machine or a dummy that makes it
/// full. Calls `emit` with each list and its dummy rate.
pub fn enumerate_lists(
    cfgs: &[Config],
    r: f64,
    budget: &mut Budget,
    emit: &mut dyn FnMut(&[Alloc], f64),
) {
    if r <= 0.0 {
        emit(&[], 0.0);
        return;
    }
    let mut cur = Vec::new();
    rec_all(cfgs, 0, r, r, &mut cur, budget, emit);
}

fn rec_all(
    cfgs: &[Config],
    from: usize,
    rem: f64,
    r: f64,
    cur: &mut Vec<Alloc>,
    budget: &mut Budget,
    emit: &mut dyn FnMut(&[Alloc], f64),
) {
    for (j, c) in cfgs.iter().enumerate().skip(from) {
        if !budget.tick() {
            return;
        }
        let nmax = floor_n(rem, c.throughput);
        for n in (0..=nmax as u64).rev() {
            let n = n as f64;
            let rest = rem - n * c.throughput;
            if rest <= EPS * r {
                cur.push(Alloc {
                    config: *c,
                    count: n,
                });
                emit(cur, 0.0);
                cur.pop();
                continue;
            }
            if n == nmax {
                cur.push(Alloc {
                    config: *c,
                    count: n + rest / c.throughput,
                });
                emit(cur, 0.0);
                cur.last_mut().unwrap().count = n + 1.0;
                emit(cur, c.throughput - rest);
                cur.pop();
            }
            if n >= 1.0 {
                cur.push(Alloc {
                    config: *c,
                    count: n,
                });
                rec_all(cfgs, j + 1, rest, r, cur, budget, emit);
                cur.pop();
            }
        }
    }
}

/// The cheapest list (TC dispatch, dummies that fill the last machine allowed or
/// not) whose worst case is at most `l`, by branch and bound over the lists
/// [`enumerate_lists`] yields; among equal costs the lowest worst case.
pub fn cheapest_list(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    l: f64,
    dummies: bool,
    budget: &mut Budget,
) -> Option<Point> {
    if r <= 0.0 {
        return Some(Point {
            worst: 0.0,
            cost: 0.0,
            allocs: vec![],
            dummy: 0.0,
        });
    }
    // A configuration whose full machines miss `l` even when their batches
    // form at the whole rate plus the largest dummy is in no list that meets
    // `l`: left out, so that the bound below uses the best ratio still usable.
    let tmax = if dummies {
        cfgs.iter().map(|x| x.throughput).fold(0.0, f64::max)
    } else {
        0.0
    };
    let usable: Vec<Config> = cfgs
        .iter()
        .filter(|c| full_ok(c, r + tmax, l, Dispatch::ThroughputCost))
        .copied()
        .collect();
    // Algorithm 1's lists (without a dummy, and with Harpagon's, which fills
    // the last machine) are lists of this shape: the search starts with the
    // cheaper as the best so far, so that its cost bound prunes from the first
    // node on.
    let mut best: Option<Point> = None;
    let seeds = [Dummies::None, Dummies::Harpagon];
    for d in seeds.into_iter().take(if dummies { 2 } else { 1 }) {
        let Some(s) = plan_module(
            &usable,
            prices,
            r,
            l,
            Configs::Any,
            Dispatch::ThroughputCost,
            d,
        ) else {
            continue;
        };
        let w = worst_case(&s.allocs, Dispatch::ThroughputCost, prices);
        if w <= l * (1.0 + EPS)
            && best.as_ref().is_none_or(|b| {
                s.cost < b.cost - 1e-9 * b.cost.max(1e-9)
                    || (s.cost <= b.cost + 1e-9 * b.cost.max(1e-9) && w < b.worst)
            })
        {
            best = Some(Point {
                worst: w,
                cost: s.cost,
                allocs: s.allocs,
                dummy: s.dummy,
            });
        }
    }
    let mut cur = Vec::new();
    bb(
        &usable, prices, 0, r, r, 0.0, l, dummies, &mut cur, &mut best, budget,
    );
    best
}

#[allow(clippy::too_many_arguments)]
fn bb(
    cfgs: &[Config],
    prices: &[f64],
    from: usize,
    rem: f64,
    r: f64,
    cost: f64,
    l: f64,
    dummies: bool,
    cur: &mut Vec<Alloc>,
    best: &mut Option<Point>,
    budget: &mut Budget,
) {
    let consider = |cur: &[Alloc], dummy: f64, best: &mut Option<Point>| {
        let c = alloc_cost(cur, prices);
        // Dearer than the best list: not worth its worst case.
        if best
            .as_ref()
            .is_some_and(|b| c > b.cost + 1e-9 * b.cost.max(1e-9))
        {
            return;
        }
        let w = worst_case(cur, Dispatch::ThroughputCost, prices);
        if w > l * (1.0 + EPS) {
            return;
        }
        let better = match best {
            None => true,
            Some(b) => {
                c < b.cost - 1e-9 * b.cost.max(1e-9)
                    || (c <= b.cost + 1e-9 * b.cost.max(1e-9) && w < b.worst)
            }
        };
        if better {
            *best = Some(Point {
                worst: w,
                cost: c,
                allocs: cur.to_vec(),
                dummy,
            });
        }
    };
    for j in from..cfgs.len() {
        if !budget.tick() {
            return;
        }
        let c = &cfgs[j];
        // Lower bound: the rest at the best ratio still available.
        let lb = cost + rem / ratio(c, prices);
        if let Some(b) = best {
            if lb > b.cost + 1e-9 * b.cost.max(1e-9) {
                return;
            }
        }
        // Full machines of c form batches at least at the rate left (ties with
        // earlier configurations only add to it; the final check is exact).
        let group_w = rem
            + cur
                .iter()
                .filter(|a| ratio(&a.config, prices) <= ratio(c, prices) * (1.0 + EPS))
                .map(|a| a.count * a.config.throughput)
                .sum::<f64>();
        // Dummies add to every earlier machine's batch rate too: the checks that
        // prune use the largest a dummy can add (the final check is exact).
        let w_opt = group_w
            + if dummies {
                cfgs[j..].iter().map(|x| x.throughput).fold(0.0, f64::max)
            } else {
                0.0
            };
        let p = prices[c.hw];
        let nmax = floor_n(rem, c.throughput);
        let rest_max = rem - nmax * c.throughput;
        // Endings (the last configuration takes all it can).
        if full_ok(c, w_opt, l, Dispatch::ThroughputCost) {
            if rest_max <= EPS * r {
                if nmax >= 1.0 {
                    cur.push(Alloc {
                        config: *c,
                        count: nmax,
                    });
                    consider(cur, 0.0, best);
                    cur.pop();
                }
            } else {
                if partial_ok(c, rest_max, l) && full_ok(c, group_w, l, Dispatch::ThroughputCost) {
                    cur.push(Alloc {
                        config: *c,
                        count: nmax + rest_max / c.throughput,
                    });
                    consider(cur, 0.0, best);
                    cur.pop();
                }
                if dummies {
                    cur.push(Alloc {
                        config: *c,
                        count: nmax + 1.0,
                    });
                    consider(cur, c.throughput - rest_max, best);
                    cur.pop();
                }
            }
        }
        // Continue with n full machines of c.
        if full_ok(c, w_opt, l, Dispatch::ThroughputCost) {
            for n in (1..=nmax as u64).rev() {
                let n = n as f64;
                let rest = rem - n * c.throughput;
                if rest <= EPS * r {
                    continue;
                }
                let ncost = cost + n * p;
                if let Some(b) = best {
                    if j + 1 < cfgs.len()
                        && ncost + rest / ratio(&cfgs[j + 1], prices)
                            > b.cost + 1e-9 * b.cost.max(1e-9)
                    {
                        continue;
                    }
                }
                cur.push(Alloc {
                    config: *c,
                    count: n,
                });
                bb(
                    cfgs,
                    prices,
                    j + 1,
                    rest,
                    r,
                    ncost,
                    l,
                    dummies,
                    cur,
                    best,
                    budget,
                );
                cur.pop();
                if budget.exhausted {
                    return;
                }
            }
        }
    }
}

/// A module's cost as a step function of its budget, up to `l_max`: every point
/// (worst case, cheapest cost at that budget), worst cases decreasing, costs
/// increasing. Found by asking [`cheapest_list`] just below the last worst case.
/// When `budget` runs out, the points found so far (the largest budgets) and the
/// best list of the search it interrupted.
pub fn frontier(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    l_max: f64,
    dummies: bool,
    budget: &mut Budget,
) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    let mut l = l_max;
    while let Some(p) = cheapest_list(cfgs, prices, r, l, dummies, budget) {
        if budget.exhausted {
            // The best list found before the work ran out: feasible, perhaps
            // not the cheapest at `l`.
            out.push(p);
            return pareto(out);
        }
        let next = p.worst * (1.0 - 1e-7) - 1e-12;
        if out.last().is_none_or(|q: &Point| p.cost > q.cost + 1e-12) || out.is_empty() {
            out.push(p);
        } else if let Some(q) = out.last_mut() {
            *q = p;
        }
        if r <= 0.0 || next <= 0.0 {
            break;
        }
        l = next;
    }
    out
}

/// The Pareto points of every list [`enumerate_lists`] yields (the brute force).
pub fn frontier_brute(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    l_max: f64,
    budget: &mut Budget,
) -> Vec<Point> {
    let mut pts: Vec<Point> = Vec::new();
    enumerate_lists(cfgs, r, budget, &mut |a, dummy| {
        let w = worst_case(a, Dispatch::ThroughputCost, prices);
        if w <= l_max * (1.0 + EPS) {
            pts.push(Point {
                worst: w,
                cost: alloc_cost(a, prices),
                allocs: a.to_vec(),
                dummy,
            });
        }
    });
    pareto(pts)
}

/// Pareto points (lower worst case and lower cost), worst case decreasing.
pub fn pareto(mut pts: Vec<Point>) -> Vec<Point> {
    pts.sort_by(|a, b| a.cost.total_cmp(&b.cost).then(a.worst.total_cmp(&b.worst)));
    let mut out: Vec<Point> = Vec::new();
    for p in pts {
        // Costs equal up to rounding: keep the lower worst case.
        while out
            .last()
            .is_some_and(|q| p.cost <= q.cost + 1e-9 * q.cost.max(1e-9) && p.worst <= q.worst)
        {
            out.pop();
        }
        if out.last().is_none_or(|q| p.worst < q.worst * (1.0 - 1e-9)) {
            out.push(p);
        }
    }
    out
}
