//! `fermata`: the cheapest plan Fermata can find, fast.
//!
//! 1. Per module, candidate plans as points (worst case, cost):
//!    * its exact cost step function over PLANNERS.md's plan shapes
//!      (distinct configurations in `t/p` order, whole full counts, one final
//!      partial machine or a dummy that fills it) as far as the cheapest
//!      choice below step 4's best plan needs it: `exact`'s list search,
//!      asked lazily at the budgets the cheapest choice leaves each module
//!      ([`super::exact::lists_below`], within [`LISTS_NODES`] nodes in
//!      all); where those nodes run out, [`module::frontier`]
//!      searched by branch and bound within [`FERMATA_NODES`] nodes per
//!      module (when the bound is hit, the points found so far and the best
//!      list of the interrupted search are kept), with the lists found;
//!    * plans outside those shapes, on the grid of budgets `k · SLO/100` and at
//!      every breakpoint: Algorithm 1 with Harpagon's dummy (`t − u`) and with
//!      Piccolo's (`b/(L − d) − u`: a partial machine padded to any size), and
//!      Nexus's saturated-plus-residual plan on each hardware type (its duty
//!      cycle pads the residual too), each evaluated under throughput-cost
//!      dispatch (never worse than round robin for the same machines);
//!    * every configuration alone with every machine full, so that a plan exists
//!      whenever the application file's SLO check passes;
//!    * every point so far with its partial machine made full (the extra
//!      capacity as dummies), a lower worst case at a little more cost;
//!    * every module plan of step 4's plans (which run first), evaluated under
//!      throughput-cost dispatch: step 2 then costs at most each of them, and
//!      can combine one peer's plan for a module with another's for the next.
//! 2. One point per module, every path within the SLO, lowest total fractional
//!    cost: [`choose_points`] (a min-plus DP on forests, HiGHS otherwise).
//! 3. Budgets raised into the slack left on their paths; at each final budget,
//!    Algorithm 1 with either dummy where it is cheaper; then the slack
//!    exchange (`exchange`): a module takes a faster point and another the
//!    cheapest plan at the budget that frees, where the total falls; on a
//!    chain, a fill ([`fill`]): one module's cheapest plan at the time every
//!    combination of the others' points leaves it.
//! 4. A portfolio: `harpagon`, `piccolo`, `scrooge`, `inferline`, `clipper` and
//!    every one of Harpagon's ablations ([`ablations`]: round robin, one or two
//!    configurations, no dummies, no reassignment, the throughput-based and the
//!    quantised splits at 0.1 and 0.01 of the SLO) also plan the application;
//!    the cheapest plan that passes [`Plan::verify`], step 3's included, is
//!    returned ([`Plan::origin`] names who built it). Nexus
//!    needs no run: its per-module plans are among the points of step 1, so
//!    step 2 is at most its cost (`nexus` does run where a module declares a
//!    prefix: its prefix batching merges modules).
//! 5. Where step 1 did not search the lists (`lists_nodes` 0): `exact`'s
//!    search ([`super::exact::below`]) for a choice of lists of the brute
//!    force's shape cheaper than the best plan so far, within [`EXACT_NODES`]
//!    nodes. Where it finds one, its module plans join step 1's points and
//!    steps 2 and 3 run again.
//!
//! Costs are compared by fractional cost (the papers' headline metric). With
//! [`Objective::Integral`] (the planner `fermata-integral`) they are compared
//! by integral cost, the machines rented once partial machines are placed
//! together: step 1 keeps the points that rent cheaply too, step 2 is the MILP
//! of [`super::integral`], step 3 keeps a module's cheaper plan only where the
//! integral cost does not rise, and step 4 also weighs the fractional
//! objective's own plan; ties go to the lower fractional cost.

use super::module::{self, Budget, Configs, Dummies, Point};
use super::planners::{ablations, choose_points, l_max, module_plan, plan_from_points, prices};
use super::{alloc_cost, integral_cost, worst_case, Alloc, App, Config, Dispatch, Plan, EPS};

/// Branch-and-bound nodes per module of `fermata`'s exact step function.
pub const FERMATA_NODES: u64 = 20_000;

/// Branch-and-bound nodes, in all, of step 5's search below the best plan.
pub const EXACT_NODES: u64 = 200_000;

/// Branch-and-bound nodes, in all, of step 1's lazy search of the lists
/// below the portfolio's best plan ([`super::exact::lists_below`]). The
/// hardest of the benchmark's workloads need under 27,000; each node of the
/// choice costs more on a large application (20 modules of 250
/// configurations: 0.2 s at 50,000 nodes, 1.2 s at 200,000).
pub const LISTS_NODES: u64 = 50_000;

/// Peers whose plans `fermata`'s portfolio considers.
pub const PORTFOLIO: &[&str] = &["harpagon", "piccolo", "scrooge", "inferline", "clipper"];

#[derive(Debug, Clone, Copy)]
pub struct FermataOptions {
    /// Branch-and-bound nodes per module (`u64::MAX`: no bound).
    pub nodes: u64,
    /// Add the plans outside PLANNERS.md's shapes (step 1's grid).
    pub grid: bool,
    /// Step 4.
    pub portfolio: bool,
    /// Step 5's nodes (0: no step 5).
    pub exact_nodes: u64,
    /// Nodes of step 1's lists below the portfolio's best plan (0: the
    /// bounded step functions alone).
    pub lists_nodes: u64,
    pub objective: Objective,
}

/// What `fermata` minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Σ price · machines, partial machines by their fraction.
    Fractional,
    /// The machines rented once partial machines of each hardware type are
    /// placed together ([`super::integral_cost`]).
    Integral,
}

impl Objective {
    /// The planner's name.
    pub fn planner(self) -> &'static str {
        match self {
            Objective::Fractional => "fermata",
            Objective::Integral => "fermata-integral",
        }
    }
}

impl Default for FermataOptions {
    fn default() -> Self {
        FermataOptions {
            nodes: FERMATA_NODES,
            grid: true,
            portfolio: true,
            exact_nodes: EXACT_NODES,
            lists_nodes: LISTS_NODES,
            objective: Objective::Fractional,
        }
    }
}

/// `fermata` with its defaults.
pub fn fermata(app: &App) -> Result<Plan, String> {
    fermata_with(app, &FermataOptions::default())
}

/// The optimum over PLANNERS.md's plan shapes, unbounded (what `exact` finds by
/// brute force), before steps 3's dummies and 4.
pub fn fermata_optimum(app: &App) -> Result<Plan, String> {
    let pts = points(
        app,
        &FermataOptions {
            nodes: u64::MAX,
            grid: false,
            portfolio: false,
            exact_nodes: 0,
            lists_nodes: 0,
            objective: Objective::Fractional,
        },
    )?;
    let pick = choose_points(app, &pts).ok_or("no choice of budgets fits the SLO")?;
    Ok(plan_from_points(app, "fermata", &pts, &pick))
}

fn push_if_fits(out: &mut Vec<Point>, allocs: Vec<Alloc>, dummy: f64, l: f64, prices: &[f64]) {
    let worst = worst_case(&allocs, Dispatch::ThroughputCost, prices);
    if worst <= l * (1.0 + EPS) {
        out.push(Point {
            worst,
            cost: alloc_cost(&allocs, prices),
            allocs,
            dummy,
        });
    }
}

/// Step 1: every module's candidate points (Pareto, worst case decreasing).
pub fn points(app: &App, o: &FermataOptions) -> Result<Vec<Vec<Point>>, String> {
    points_with(app, o, &[])
}

/// [`points`], with every module plan of `peers` (under throughput-cost
/// dispatch, never worse than the plan's own) among them: step 2 then costs
/// at most every peer's plan whose modules have machines of their own.
pub fn points_with(
    app: &App,
    o: &FermataOptions,
    peers: &[Plan],
) -> Result<Vec<Vec<Point>>, String> {
    points_below(app, o, peers).map(|x| x.0)
}

/// [`points_with`], and whether the lists below the best of `peers` (each
/// passes [`Plan::verify`]) were searched: with
/// [`FermataOptions::lists_nodes`] and the fractional objective, each
/// module's step function is its lists below that plan as far as the
/// cheapest choice needs ([`super::exact::lists_below`]) where the search
/// ended within its nodes, and the bounded step function (with the lists
/// found) where it did not. Where it ended, every choice of the brute
/// force's shape cheaper than the best peer costs at least step 2's.
fn points_below(
    app: &App,
    o: &FermataOptions,
    peers: &[Plan],
) -> Result<(Vec<Vec<Point>>, bool), String> {
    let p = prices(app);
    let cap = peers.iter().map(|q| q.cost).fold(f64::INFINITY, f64::min);
    let lists = (o.objective == Objective::Fractional && o.lists_nodes > 0)
        .then(|| super::exact::lists_below(app, cap, o.lists_nodes));
    let listed = lists.is_some();
    let mut lists = lists.flatten();
    // Plans whose prefix batching merges modules are compared whole (step 4).
    let peers: Vec<&Plan> = peers
        .iter()
        .filter(|q| {
            q.modules.len() == app.modules.len() && q.modules.iter().all(|m| m.served_by.is_none())
        })
        .collect();
    let mut pts = Vec::with_capacity(app.modules.len());
    for v in 0..app.modules.len() {
        let cfgs = module::sorted(&app.modules[v].configs, &p);
        let r = app.rates[v];
        let lm = l_max(app, v);
        let mut f = match lists.as_mut().map(|l| std::mem::take(&mut l[v])) {
            Some((f, true)) => f,
            found => {
                let mut never = || false;
                let mut budget = Budget::new(o.nodes, &mut never);
                let mut f = module::frontier(&cfgs, &p, r, lm, true, &mut budget);
                f.extend(found.map(|x| x.0).unwrap_or_default());
                module::pareto(f)
            }
        };
        if o.grid && r > 0.0 {
            let mut extra = Vec::new();
            for c in &cfgs {
                let n = (r / c.throughput - 1e-9).ceil().max(1.0);
                let a = vec![Alloc {
                    config: *c,
                    count: n,
                }];
                push_if_fits(&mut extra, a, n * c.throughput - r, lm, &p);
            }
            let step = app.slo / 100.0;
            let mut budgets: Vec<f64> = f.iter().map(|q| q.worst).collect();
            let mut k = 1.0;
            while k * step <= lm * (1.0 + EPS) {
                budgets.push(k * step);
                k += 1.0;
            }
            for &l in &budgets {
                for d in [Dummies::Harpagon, Dummies::Piccolo] {
                    if let Some(s) = module::plan_module(
                        &cfgs,
                        &p,
                        r,
                        l,
                        Configs::Any,
                        Dispatch::ThroughputCost,
                        d,
                    ) {
                        push_if_fits(&mut extra, s.allocs, s.dummy, l, &p);
                    }
                }
                for s in module::padded_plans(&cfgs, &p, r, l, Dispatch::ThroughputCost) {
                    push_if_fits(&mut extra, s.allocs, s.dummy, l, &p);
                }
                for h in 0..app.hardware.len() {
                    if let Some((a, dummy)) = super::planners::nexus_module(app, v, h, l) {
                        push_if_fits(&mut extra, a, dummy, l, &p);
                    }
                }
            }
            f.extend(extra);
        }
        if r > 0.0 {
            for q in &peers {
                let m = &q.modules[v];
                push_if_fits(&mut f, m.allocs.clone(), m.dummy, lm, &p);
            }
        }
        if o.objective == Objective::Fractional && (o.grid || !peers.is_empty()) {
            if o.grid {
                // Each point with its partial machine made full (the extra
                // capacity as dummies): a lower worst case for a little more.
                let up: Vec<Point> = f
                    .iter()
                    .filter_map(|q| super::integral::rounded_up(q, r, &p))
                    .filter(|q| q.worst <= lm * (1.0 + EPS))
                    .collect();
                f.extend(up);
            }
            f = module::pareto(f);
        }
        if o.objective == Objective::Integral {
            f = super::integral::points(f, r, &p);
        }
        if f.is_empty() {
            return Err(format!(
                "module {}: no plan within its budget",
                app.modules[v].name
            ));
        }
        pts.push(f);
    }
    Ok((pts, listed))
}

/// `fermata` with the integral objective.
pub fn fermata_integral(app: &App) -> Result<Plan, String> {
    fermata_with(
        app,
        &FermataOptions {
            objective: Objective::Integral,
            ..FermataOptions::default()
        },
    )
}

/// Whether `q` is better than `b` under `objective` (the other cost breaks ties).
fn better(q: &Plan, b: &Plan, objective: Objective) -> bool {
    let lt = |x: f64, y: f64| x < y * (1.0 - 1e-9);
    let eq = |x: f64, y: f64| !lt(x, y) && !lt(y, x);
    match objective {
        Objective::Fractional => {
            lt(q.cost, b.cost) || (eq(q.cost, b.cost) && lt(q.integral_cost, b.integral_cost))
        }
        Objective::Integral => {
            lt(q.integral_cost, b.integral_cost)
                || (eq(q.integral_cost, b.integral_cost) && lt(q.cost, b.cost))
        }
    }
}

pub fn fermata_with(app: &App, o: &FermataOptions) -> Result<Plan, String> {
    let peers = if o.portfolio {
        portfolio(app)
    } else {
        Vec::new()
    };
    // Whether step 1 searched the lists below the portfolio's best plan.
    let mut listed = false;
    let own = own_plan(app, o, &peers).map(|(q, l)| {
        listed = l;
        q
    });
    let mut best = own.as_ref().ok().filter(|p| p.verify(app).is_ok()).cloned();
    if o.objective == Objective::Integral {
        // The fractional objective's own plan can rent for less than the
        // integral MILP's, whose packing bound BFD may not reach.
        let f = FermataOptions {
            objective: Objective::Fractional,
            ..*o
        };
        if let Ok((q, _)) = own_plan(app, &f, &peers) {
            if q.verify(app).is_ok() && best.as_ref().is_none_or(|b| better(&q, b, o.objective)) {
                best = Some(q);
            }
        }
    }
    for q in &peers {
        if best.as_ref().is_none_or(|b| better(q, b, o.objective)) {
            best = Some(q.clone());
        }
    }
    if o.objective == Objective::Fractional && o.exact_nodes > 0 && !listed {
        // Step 5: `exact`'s search below the best plan so far.
        if let Some(q) = best
            .as_ref()
            .and_then(|b| super::exact::below(app, b.cost, o.exact_nodes))
        {
            let mut with = peers;
            with.push(q);
            // Its module plans join step 1's points: steps 2 and 3 cost at
            // most it (on a tie, that plan is kept).
            let again = own_plan(
                app,
                &FermataOptions {
                    lists_nodes: 0,
                    ..*o
                },
                &with,
            )
            .ok()
            .map(|x| x.0);
            for q in again.into_iter().chain(with.pop()) {
                if q.verify(app).is_ok() && best.as_ref().is_none_or(|b| better(&q, b, o.objective))
                {
                    best = Some(q);
                }
            }
        }
    }
    match best {
        Some(mut b) => {
            b.planner = o.objective.planner().into();
            Ok(b)
        }
        None => Err(own.err().unwrap_or_else(|| "no feasible plan".into())),
    }
}

/// Step 4's plans: the peers of [`PORTFOLIO`] (and `nexus` where a module
/// declares a prefix: its prefix batching merges modules, outside step 1's
/// points) and every one of Harpagon's ablations ([`ablations`]), those that
/// pass [`Plan::verify`].
pub fn portfolio(app: &App) -> Vec<Plan> {
    let mut never = || false;
    let nexus = app.modules.iter().any(|m| m.prefix.is_some());
    use super::planners::HarpagonOptions;
    // Harpagon's variants share their latency-cost splits.
    let mut family = vec![
        ("harpagon", HarpagonOptions::harpagon()),
        ("piccolo", HarpagonOptions::piccolo()),
        ("inferline", HarpagonOptions::inferline()),
    ];
    family.extend(ablations());
    let mut plans = super::planners::harpagon_family(app, &family);
    plans.extend(
        PORTFOLIO
            .iter()
            .filter(|name| !family.iter().any(|(f, _)| f == *name))
            .chain(nexus.then_some(&"nexus"))
            .map(|name| super::planners::run(app, name, &mut never)),
    );
    plans
        .into_iter()
        .filter_map(Result::ok)
        .filter(|q| q.verify(app).is_ok())
        .collect()
}

/// Steps 1 to 3; every module plan of `peers` is a point of step 1 too.
/// Also whether step 1 searched the lists below the best of `peers`
/// ([`points_below`]).
fn own_plan(app: &App, o: &FermataOptions, peers: &[Plan]) -> Result<(Plan, bool), String> {
    let (pts, listed) = points_below(app, o, peers)?;
    let pick = match o.objective {
        Objective::Fractional => choose_points(app, &pts),
        Objective::Integral => super::integral::choose(app, &pts),
    }
    .ok_or("no choice of budgets fits the SLO")?;
    let mut plan = plan_from_points(app, "fermata", &pts, &pick);
    let p = prices(app);
    for v in 0..plan.modules.len() {
        let cfgs = module::sorted(&app.modules[v].configs, &p);
        let budget = plan.modules[v].budget;
        let mut sols: Vec<module::ModuleSolution> = [Dummies::Harpagon, Dummies::Piccolo]
            .into_iter()
            .filter_map(|d| {
                module::plan_module(
                    &cfgs,
                    &p,
                    app.rates[v],
                    budget,
                    Configs::Any,
                    Dispatch::ThroughputCost,
                    d,
                )
            })
            .collect();
        sols.extend(module::padded_plans(
            &cfgs,
            &p,
            app.rates[v],
            budget,
            Dispatch::ThroughputCost,
        ));
        for s in sols {
            let m = &plan.modules[v];
            if s.cost >= m.cost * (1.0 - 1e-9) {
                continue;
            }
            let q = module_plan(
                app,
                v,
                m.budget,
                s.allocs,
                s.dummy,
                Dispatch::ThroughputCost,
            );
            if o.objective == Objective::Integral {
                // Kept only where the machines rented do not cost more.
                let mut mods = plan.modules.clone();
                let before = integral_cost(&mods, &app.hardware);
                mods[v] = q.clone();
                if integral_cost(&mods, &app.hardware) > before * (1.0 + 1e-9) {
                    continue;
                }
            }
            plan.modules[v] = q;
        }
    }
    let mut mods = std::mem::take(&mut plan.modules);
    if o.objective == Objective::Fractional {
        exchange(app, &pts, &mut mods);
    }
    Ok((Plan::assemble(o.objective.planner(), app, mods), listed))
}

/// The cheapest plan of module `v` within budget `l`: its cheapest point
/// there (`pts`: Pareto, costs increasing), or Algorithm 1 at `l` with either
/// dummy, or a padded plan ([`module::padded_plans`]), whose costs fall
/// continuously with `l` where a dummy pads a partial machine to just meet it.
fn cheapest_at(
    cfgs: &[Config],
    prices: &[f64],
    r: f64,
    pts: &[Point],
    l: f64,
) -> Option<(Vec<Alloc>, f64, f64)> {
    let mut best = pts
        .iter()
        .find(|q| q.worst <= l * (1.0 + EPS))
        .map(|q| (q.allocs.clone(), q.dummy, q.cost));
    let mut sols: Vec<module::ModuleSolution> = [Dummies::Harpagon, Dummies::Piccolo]
        .into_iter()
        .filter_map(|d| {
            module::plan_module(
                cfgs,
                prices,
                r,
                l,
                Configs::Any,
                Dispatch::ThroughputCost,
                d,
            )
        })
        .collect();
    sols.extend(module::padded_plans(
        cfgs,
        prices,
        r,
        l,
        Dispatch::ThroughputCost,
    ));
    for s in sols {
        if best.as_ref().is_none_or(|b| s.cost < b.2 * (1.0 - 1e-12))
            && worst_case(&s.allocs, Dispatch::ThroughputCost, prices) <= l * (1.0 + EPS)
        {
            best = Some((s.allocs, s.dummy, s.cost));
        }
    }
    best
}

/// Slack exchanged between modules: module `u` takes a faster point of its
/// own and module `v` a plan at the largest budget the time freed leaves it.
/// Step 2 chooses among points, and the plans whose cost falls continuously
/// with the budget (a partial machine padded by a dummy to just meet it) are
/// points only at the budgets step 1 tried; this finds them at the budget a
/// neighbour's point leaves. Each exchange that lowers the total cost is
/// taken, until none does (at most a few rounds). Then, on a chain, the best
/// [`fill`] that lowers the total, and exchanges again (at most twice).
fn exchange(app: &App, pts: &[Vec<Point>], mods: &mut [super::ModulePlan]) {
    let n = app.modules.len();
    if n < 2 {
        return;
    }
    let p = prices(app);
    let cfgs: Vec<Vec<Config>> = app
        .modules
        .iter()
        .map(|m| module::sorted(&m.configs, &p))
        .collect();
    // The least each module can cost (at its largest budget): what giving it
    // more time can save at most.
    let lb: Vec<f64> = (0..n)
        .map(|v| {
            cheapest_at(&cfgs[v], &p, app.rates[v], &pts[v], l_max(app, v)).map_or(0.0, |x| x.2)
        })
        .collect();
    // The best taker for the budgets `b` (givers changed), the givers' extra
    // cost `extra`.
    let taker = |mods: &[super::ModulePlan], b: &[f64], givers: &[usize], extra: f64| {
        let mut taken: Option<(f64, usize, f64, Vec<Alloc>, f64)> = None;
        for v in 0..n {
            if givers.contains(&v) || app.rates[v] <= 0.0 || mods[v].cost - lb[v] <= extra {
                continue;
            }
            let l = app.room_within(app.slo, b, v);
            if l <= mods[v].worst * (1.0 + 1e-9) {
                continue;
            }
            let Some((allocs, dummy, cost)) = cheapest_at(&cfgs[v], &p, app.rates[v], &pts[v], l)
            else {
                continue;
            };
            let saving = mods[v].cost - cost - extra;
            if saving > 1e-9 * mods[v].cost.max(1e-9) && taken.as_ref().is_none_or(|t| saving > t.0)
            {
                taken = Some((saving, v, l, allocs, dummy));
            }
        }
        taken
    };
    // The faster points of module `u` (costs increasing) with their extra cost.
    let faster = |mods: &[super::ModulePlan], u: usize| -> Vec<(usize, f64)> {
        if app.rates[u] <= 0.0 {
            return Vec::new();
        }
        pts[u]
            .iter()
            .enumerate()
            .filter(|(_, q)| q.worst < mods[u].worst * (1.0 - 1e-9))
            .map(|(k, q)| (k, q.cost - mods[u].cost))
            .collect()
    };
    let mut any = false;
    // One giver: for each module in turn, the first exchange that pays.
    let pairs = |mods: &mut [super::ModulePlan]| {
        let mut any = false;
        for _round in 0..4 {
            let mut improved = false;
            for u in 0..n {
                let most = (0..n)
                    .filter(|&v| v != u)
                    .map(|v| mods[v].cost - lb[v])
                    .fold(0.0, f64::max);
                for (k, extra) in faster(mods, u) {
                    // Points come cost increasing: once no module can save
                    // the extra, no later point pays either.
                    if extra >= most {
                        break;
                    }
                    let mut b: Vec<f64> = mods.iter().map(|m| m.worst).collect();
                    b[u] = pts[u][k].worst;
                    if let Some((_, v, l, allocs, dummy)) = taker(mods, &b, &[u], extra) {
                        mods[v] = module_plan(app, v, l, allocs, dummy, Dispatch::ThroughputCost);
                        let q = &pts[u][k];
                        mods[u] = module_plan(
                            app,
                            u,
                            q.worst,
                            q.allocs.clone(),
                            q.dummy,
                            Dispatch::ThroughputCost,
                        );
                        improved = true;
                        any = true;
                        break;
                    }
                }
            }
            if !improved {
                break;
            }
        }
        any
    };
    any |= pairs(mods);
    // On a chain, one module fills the time the others' points leave.
    for _round in 0..2 {
        let Some(m) = fill(app, pts, mods, &cfgs, &p, &lb) else {
            break;
        };
        mods[m.taker] = module_plan(
            app,
            m.taker,
            m.budget,
            m.allocs,
            m.dummy,
            Dispatch::ThroughputCost,
        );
        for (u, q) in m.givers {
            mods[u] = module_plan(app, u, q.worst, q.allocs, q.dummy, Dispatch::ThroughputCost);
        }
        any = true;
        pairs(mods);
    }
    if !any {
        return;
    }
    // Budgets: each module's worst case, raised into the slack left.
    let mut b: Vec<f64> = mods.iter().map(|m| m.worst).collect();
    super::planners::reassign(app, &mut b);
    for (m, b) in mods.iter_mut().zip(b) {
        m.budget = b;
    }
}

/// A fill: the other modules' new plans, and the filler's plan at the time
/// they leave it.
struct Fill {
    givers: Vec<(usize, Point)>,
    taker: usize,
    budget: f64,
    allocs: Vec<Alloc>,
    dummy: f64,
}

/// Work bound of [`fill`] (envelope entries built per filler).
const FILL_WORK: usize = 200_000;

/// On a chain, the cheapest plan with one module (the filler) at the cheapest
/// plan within the time the others leave it, the others at their points or
/// their current plans: for each filler, the others' lower envelope of total
/// worst case against total cost (a min-plus sum of their step functions),
/// and at each of its steps the filler's cheapest plan at the SLO less that
/// time ([`cheapest_at`], whose padded plans are priced at any budget). The
/// exchange of two modules sees one neighbour's move at a time; a fill sees
/// every combination, so that two modules can change their points (one
/// faster, one slower) while a third pads its partial machine to the time
/// left. `None` unless the best fill costs less than `mods`.
fn fill(
    app: &App,
    pts: &[Vec<Point>],
    mods: &[super::ModulePlan],
    cfgs: &[Vec<Config>],
    p: &[f64],
    lb: &[f64],
) -> Option<Fill> {
    let n = app.modules.len();
    // A chain: one root, every module at most one child and one parent.
    if n < 3
        || app.edges.len() != n - 1
        || (0..n).any(|v| app.parents(v).count() > 1 || app.children(v).count() > 1)
    {
        return None;
    }
    let total: f64 = mods.iter().map(|m| m.cost).sum();
    let slo = app.slo * (1.0 + 1e-9);
    // Each module's options: its points and its current plan.
    let opts: Vec<Vec<Point>> = (0..n)
        .map(|u| {
            let mut o = pts[u].clone();
            o.push(Point {
                worst: mods[u].worst,
                cost: mods[u].cost,
                allocs: mods[u].allocs.clone(),
                dummy: mods[u].dummy,
            });
            o
        })
        .collect();
    let minc: Vec<f64> = opts
        .iter()
        .map(|o| o.iter().map(|q| q.cost).fold(f64::INFINITY, f64::min))
        .collect();
    let mut best: Option<(f64, Fill)> = None;
    for v in 0..n {
        if app.rates[v] <= 0.0 {
            continue;
        }
        // The least time the filler needs.
        let vmin = pts[v].iter().map(|q| q.worst).fold(f64::INFINITY, f64::min);
        // Envelope entries per stage (one stage per other module): (total
        // worst, total cost, entry of the stage before, option), worst
        // increasing, cost decreasing.
        let mut stages: Vec<Vec<(f64, f64, usize, usize)>> = vec![vec![(0.0, 0.0, 0, 0)]];
        let mut work = 0usize;
        // What the modules of the later stages and the filler cost at least:
        // an entry at or above the total less that cannot pay.
        let mut later: f64 = lb[v] + (0..n).filter(|&u| u != v).map(|u| minc[u]).sum::<f64>();
        for (u, ou) in opts.iter().enumerate() {
            if u == v {
                continue;
            }
            later -= minc[u];
            let bar = total * (1.0 - 1e-9) - later;
            let env = stages.last().expect("a stage");
            let mut next: Vec<(f64, f64, usize, usize)> = Vec::with_capacity(env.len() * ou.len());
            for (i, e) in env.iter().enumerate() {
                for (k, q) in ou.iter().enumerate() {
                    let t = e.0 + q.worst;
                    if t + vmin <= slo && e.1 + q.cost < bar {
                        next.push((t, e.1 + q.cost, i, k));
                    }
                }
            }
            work += next.len();
            if work > FILL_WORK {
                return None;
            }
            next.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
            let mut kept: Vec<(f64, f64, usize, usize)> = Vec::with_capacity(next.len());
            for x in next {
                if kept
                    .last()
                    .is_none_or(|l| x.1 < l.1 - 1e-12 * l.1.abs().max(1e-12))
                {
                    kept.push(x);
                }
            }
            stages.push(kept);
        }
        let env = stages.last().expect("a stage");
        let others: Vec<usize> = (0..n).filter(|&u| u != v).collect();
        for (i, &(t, c, _, _)) in env.iter().enumerate() {
            // The filler costs at least its cheapest plan at all.
            let bar = best.as_ref().map_or(total, |b| b.0);
            if c + lb[v] >= bar * (1.0 - 1e-9) {
                continue;
            }
            let l = app.slo - t;
            let Some((allocs, dummy, cost)) = cheapest_at(&cfgs[v], p, app.rates[v], &pts[v], l)
            else {
                continue;
            };
            if c + cost < bar * (1.0 - 1e-9) {
                best = Some((
                    c + cost,
                    Fill {
                        givers: {
                            // Back from the last stage: each other module's
                            // option.
                            let mut g = Vec::with_capacity(others.len());
                            let mut e = i;
                            for (s, &u) in others.iter().enumerate().rev() {
                                let (_, _, prev, k) = stages[s + 1][e];
                                g.push((u, opts[u][k].clone()));
                                e = prev;
                            }
                            g
                        },
                        taker: v,
                        budget: l,
                        allocs,
                        dummy,
                    },
                ));
            }
        }
    }
    best.map(|b| b.1)
}
