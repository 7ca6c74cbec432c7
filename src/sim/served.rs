//! Plans served in the simulator: the whole machines at which a plan keeps its
//! application within the SLO, and the choice among several candidate plans
//! of the one that is cheapest once served.
//!
//! A planner's cost model (fractional machines, a worst case per module) is
//! not what serving costs: machines are whole, fan-outs come in bursts, and
//! the runtime drops or delays tasks the model says fit. [`serve`] plans the
//! application with `fermata` and takes every candidate plan (`fermata`'s own,
//! `fermata-integral`'s and every plan of `fermata`'s portfolio: Harpagon's
//! and its ablations, Piccolo's, Scrooge's, InferLine's, Clipper's), serves
//! each in the simulator ([`crate::sim::apps`]) with the deferred dispatcher
//! and the latest-useful deadline rule at the application's rate, Poisson
//! fan-outs with each edge's mean, and searches ([`fit`]) the cheapest whole
//! machine counts of its allocation lines that keep at least
//! [`ServeOptions::target_good`] of the requests within the SLO. The cheapest
//! candidate served wins. The simulator is seeded ([`ServeOptions::seed`]), so
//! the answer depends only on the application and the options.
//!
//! [`fit`]'s search: a machine set reaches the target when it does in each of
//! [`ServeOptions::runs`] runs with independent seeds (a margin for the noise
//! of one run). From the plan's counts rounded up, while the target is
//! missed, more machines on each module in turn (on its line of the most
//! throughput per price; a quarter more while the good share is more than 5
//! points short, one near it), keeping the step that raises the good share
//! most per price (the cheapest that reaches the target, when one does); then machines
//! removed, most expensive first, while the target holds (a line that missed
//! it with one machine fewer is not tried again).

use crate::app::{Budgets, DeadlineRule, EdgeSpec, Graph, Step};
use crate::core::{Dur, LatencyProfile, Policy};
use crate::plan::app::{App, Config, Plan};
use crate::sim::apps::{simulate_app, AppSim, AppSimOptions, FanoutDist, Runtime, SubCluster};
use std::sync::Arc;

/// One allocation line of a plan: machines of one configuration for one module.
#[derive(Debug, Clone, Copy)]
pub struct Line {
    pub module: usize,
    pub config: Config,
    /// The plan's count, rounded up.
    pub machines: u32,
}

pub fn lines(plan: &Plan) -> Vec<Line> {
    let mut out = Vec::new();
    for (v, m) in plan.modules.iter().enumerate() {
        for a in &m.allocs {
            let n = (a.count - 1e-9).ceil().max(0.0) as u32;
            if n > 0 {
                out.push(Line {
                    module: v,
                    config: a.config,
                    machines: n,
                });
            }
        }
    }
    out
}

/// The latency of one batch of b (1..=the largest profiled batch) on one lane of
/// hardware `hw` with `e` lanes, interpolated linearly between profiled batches.
pub fn lane_profile(app: &App, module: usize, hw: usize, e: u32) -> Result<LatencyProfile, String> {
    let mut pts: Vec<(u32, f64)> = app.modules[module]
        .configs
        .iter()
        .filter(|c| c.hw == hw && c.concurrency == e)
        .map(|c| (c.batch, c.latency))
        .collect();
    pts.sort_by_key(|p| p.0);
    pts.dedup_by_key(|p| p.0);
    let Some(&(max_b, _)) = pts.last() else {
        return Err(format!(
            "{}: no profile on hardware {hw} at concurrency {e}",
            app.modules[module].name
        ));
    };
    let lat = (1..=max_b)
        .map(|b| {
            let i = pts.partition_point(|p| p.0 < b);
            let s = if i == 0 {
                pts[0].1 * f64::from(b) / f64::from(pts[0].0)
            } else if pts[i].0 == b {
                pts[i].1
            } else {
                let (b0, l0) = pts[i - 1];
                let (b1, l1) = pts[i];
                l0 + (l1 - l0) * f64::from(b - b0) / f64::from(b1 - b0)
            };
            Dur::from_secs_f64(s)
        })
        .collect();
    LatencyProfile::table(lat).map_err(|e| format!("{}: {e:?}", app.modules[module].name))
}

/// The simulated application for `plan` with `machines` per line.
pub fn app_sim(
    app: &App,
    plan: &Plan,
    lines: &[Line],
    machines: &[u32],
    rule: DeadlineRule,
) -> Result<AppSim, String> {
    if plan.modules.iter().any(|m| m.served_by.is_some()) {
        return Err("prefix batching is not simulated".into());
    }
    let steps = app
        .modules
        .iter()
        .map(|m| Step::new(&m.name, &m.name))
        .collect();
    let edges: Vec<EdgeSpec> = app
        .edges
        .iter()
        .map(|e| {
            let (a, b) = (&app.modules[e.from].name, &app.modules[e.to].name);
            if e.fanout == 1.0 {
                EdgeSpec::whole(a, b)
            } else {
                EdgeSpec::fanout(a, b)
            }
        })
        .collect();
    let fanout = app
        .edges
        .iter()
        .map(|e| (e.fanout != 1.0).then_some(FanoutDist::Poisson(e.fanout)))
        .collect();
    let sinks: Vec<&str> = (0..app.modules.len())
        .filter(|&v| app.children(v).next().is_none())
        .map(|v| app.modules[v].name.as_str())
        .collect();
    let graph = Arc::new(Graph::new(steps, &edges, &sinks).map_err(|e| e.to_string())?);
    let budgets = Budgets::new(
        &graph,
        plan.modules
            .iter()
            .map(|m| Dur::from_secs_f64(m.budget))
            .collect(),
        Dur::from_secs_f64(app.slo),
    )
    .map_err(|e| e.to_string())?;
    let mut subclusters = Vec::new();
    for (l, &n) in lines.iter().zip(machines) {
        if n == 0 {
            continue;
        }
        let c = l.config;
        subclusters.push(SubCluster {
            module: l.module,
            gpu_type: c.hw,
            machines: n,
            lanes: c.concurrency.max(1),
            profile: lane_profile(app, l.module, c.hw, c.concurrency)?,
            weight: f64::from(n) * c.throughput,
            tc_batch: c.batch,
            tc_ratio: c.throughput / app.price(&c),
        });
    }
    // The least latency of each module: a batch of one on the fastest lane
    // planned for it (the last deadlines of `DeadlineRule::LatestUseful`).
    let least = (0..app.modules.len())
        .map(|v| {
            subclusters
                .iter()
                .filter(|sc| sc.module == v)
                .map(|sc| sc.profile.latency(1))
                .min()
                .unwrap_or(Dur::ZERO)
        })
        .collect();
    let budgets = budgets
        .with_least(&graph, least)
        .map_err(|e| e.to_string())?;
    Ok(AppSim {
        graph,
        budgets,
        rule,
        rate_rps: ingress(app).max(1e-9),
        fanout,
        gpu_types: app.hardware.iter().map(|h| h.name.clone()).collect(),
        subclusters,
        module_rates: app.rates.clone(),
    })
}

/// The ingress rate of a generated application (its roots' rate).
pub fn ingress(app: &App) -> f64 {
    (0..app.modules.len())
        .find(|&v| app.parents(v).next().is_none())
        .map_or(0.0, |v| app.rates[v])
}

/// How plans are served and searched.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The good share (requests within the SLO) a machine set must reach.
    pub target_good: f64,
    /// Application requests each simulation aims to count (its window is
    /// sized from the rate, 2-40 s, after a warm-up of max(1 s, 3 SLOs)).
    pub requests: u64,
    /// Simulations at most per candidate plan (each run counts).
    pub max_sims: usize,
    /// The simulator's seed (arrivals and fan-outs) of the first run.
    pub seed: u64,
    /// Runs with independent seeds (`seed`, `seed + 1`, ...) a machine set
    /// must each reach the target in: a margin for the noise of one run.
    pub runs: u32,
    pub runtime: Runtime,
    pub rule: DeadlineRule,
    /// Print every simulation (the plan's origin, the machines, the good
    /// share) to stderr.
    pub trace: bool,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            target_good: 0.99,
            requests: 2000,
            max_sims: 120,
            seed: 0x5e55_1011,
            runs: 2,
            runtime: Runtime::Core(Policy::Deferred),
            rule: DeadlineRule::LatestUseful,
            trace: false,
        }
    }
}

/// A plan served: the whole machines of each of its allocation lines.
#[derive(Debug, Clone)]
pub struct Served {
    pub plan: Plan,
    pub lines: Vec<Line>,
    /// Machines per line (a line may end at 0 when its module has others).
    pub machines: Vec<u32>,
    /// Σ price × machines.
    pub cost: f64,
    /// The good share at those machines.
    pub good: f64,
    pub sims: usize,
}

/// Σ price × machines of `lines`.
pub fn lines_cost(app: &App, lines: &[Line], machines: &[u32]) -> f64 {
    lines
        .iter()
        .zip(machines)
        .map(|(l, &k)| f64::from(k) * app.price(&l.config))
        .sum()
}

/// The simulator's options for `app` under `o`.
pub fn sim_options(
    app: &App,
    requests: u64,
    runtime: Runtime,
    seed: u64,
    max_s: f64,
) -> AppSimOptions {
    let rate = ingress(app).max(1e-9);
    AppSimOptions {
        runtime,
        seed,
        warmup: Dur::from_secs_f64(1.0_f64.max(3.0 * app.slo)),
        duration: Dur::from_secs_f64((requests as f64 / rate).clamp(2.0, max_s)),
        check: false,
        fanout_jump: None,
        slowdown: None,
    }
}

/// The good share of `plan` at `machines`: the least over `o.runs` runs,
/// stopping at the first that misses the target; and the simulations run.
fn good_at(
    app: &App,
    plan: &Plan,
    lines: &[Line],
    machines: &[u32],
    o: &ServeOptions,
    opt: &AppSimOptions,
) -> Result<(f64, usize), String> {
    let sim = app_sim(app, plan, lines, machines, o.rule)?;
    let mut good = f64::INFINITY;
    let mut n = 0;
    for k in 0..o.runs.max(1) {
        let opt = AppSimOptions {
            seed: opt.seed.wrapping_add(u64::from(k)),
            ..opt.clone()
        };
        good = good.min(simulate_app(&sim, &opt).good_fraction());
        n += 1;
        if good < o.target_good {
            break;
        }
    }
    if o.trace {
        let m: Vec<String> = lines
            .iter()
            .zip(machines)
            .map(|(l, k)| {
                let hw = &app.hardware[l.config.hw].name;
                format!("{}:{k}x{hw}", app.modules[l.module].name)
            })
            .collect();
        eprintln!(
            "{} serve {} cost {:.2} good {:.4}: {}",
            app.name,
            plan.origin,
            lines_cost(app, lines, machines),
            good,
            m.join(" ")
        );
    }
    Ok((good, n))
}

/// The cheapest whole machine counts of `plan`'s allocation lines at which the
/// simulator keeps `o.target_good` of the requests within the SLO, searched as
/// the module's text says. `Ok(None)`: not reached within `o.max_sims`
/// simulations; `Err`: the plan cannot be simulated (prefix batching).
pub fn fit(app: &App, plan: &Plan, o: &ServeOptions) -> Result<Option<Served>, String> {
    let ls = lines(plan);
    if ls.is_empty() {
        return Err("a plan without machines".into());
    }
    let opt = sim_options(app, o.requests, o.runtime, o.seed, 40.0);
    let mut m: Vec<u32> = ls.iter().map(|l| l.machines).collect();
    let n_mod = app.modules.len();
    // Each module's line of the most throughput per price (where it grows).
    let grow_line: Vec<Option<usize>> = (0..n_mod)
        .map(|v| {
            (0..ls.len())
                .filter(|&i| ls[i].module == v)
                .max_by(|&a, &b| {
                    let r = |i: usize| ls[i].config.throughput / app.price(&ls[i].config);
                    r(a).total_cmp(&r(b)).then(b.cmp(&a))
                })
        })
        .collect();
    let (mut good, mut sims) = good_at(app, plan, &ls, &m, o, &opt)?;
    let ok = |g: f64| g >= o.target_good;
    while !ok(good) {
        // More machines on each module in turn (a quarter more while far
        // from the target, one near it); the best per price.
        let far = good < o.target_good - 0.05;
        let mut best: Option<(usize, u32, f64, f64)> = None; // (line, added, good, score)
        for &i in grow_line.iter().flatten() {
            if sims >= o.max_sims {
                break;
            }
            let module = ls[i].module;
            let has: u32 = (0..ls.len())
                .filter(|&j| ls[j].module == module)
                .map(|j| m[j])
                .sum();
            let k = if far { has.div_ceil(4).max(1) } else { 1 };
            m[i] += k;
            let (g, n) = good_at(app, plan, &ls, &m, o, &opt)?;
            m[i] -= k;
            sims += n;
            let price = f64::from(k) * app.price(&ls[i].config);
            // Reaching the target beats any gain; among those the cheapest.
            let score = if ok(g) {
                f64::MAX / 2.0 - price
            } else {
                (g - good) / price
            };
            if best.is_none_or(|b| score > b.3) {
                best = Some((i, k, g, score));
            }
        }
        match best {
            Some((i, k, g, _)) if sims < o.max_sims || ok(g) => {
                m[i] += k;
                good = g;
            }
            _ => return Ok(None),
        }
    }
    // Remove machines, most expensive first, while the target holds.
    let mut order: Vec<usize> = (0..ls.len()).collect();
    order.sort_by(|&a, &b| {
        app.price(&ls[b].config)
            .total_cmp(&app.price(&ls[a].config))
            .then(a.cmp(&b))
    });
    // A line that missed the target with one machine fewer is not tried
    // again: removing machines elsewhere does not make it spare one.
    let mut spare = vec![true; ls.len()];
    'outer: while sims < o.max_sims {
        for &i in &order {
            let module = ls[i].module;
            let left: u32 = (0..ls.len())
                .filter(|&j| ls[j].module == module)
                .map(|j| m[j])
                .sum();
            if !spare[i] || m[i] == 0 || left <= 1 || sims >= o.max_sims {
                continue;
            }
            m[i] -= 1;
            let (g, n) = good_at(app, plan, &ls, &m, o, &opt)?;
            sims += n;
            if ok(g) {
                good = g;
                continue 'outer;
            }
            m[i] += 1;
            spare[i] = false;
        }
        break;
    }
    Ok(Some(Served {
        plan: plan.clone(),
        cost: lines_cost(app, &ls, &m),
        lines: ls,
        machines: m,
        good,
        sims,
    }))
}

/// The least cost at which `plan`'s lines can carry each module's rate
/// (fractional machines of each module's line of the most throughput per
/// price): no machine set of those lines that keeps up costs less.
fn carry_bound(app: &App, plan: &Plan) -> f64 {
    plan.modules
        .iter()
        .enumerate()
        .map(|(v, m)| {
            m.allocs
                .iter()
                .map(|a| app.rates[v] * app.price(&a.config) / a.config.throughput)
                .fold(f64::INFINITY, f64::min)
        })
        .filter(|c| c.is_finite())
        .sum()
}

/// The candidate plans of [`serve`]: `fermata`'s, `fermata-integral`'s and
/// `fermata`'s portfolio, those that pass [`Plan::verify`], without
/// duplicates (the same machines and budgets), `fermata`'s first.
pub fn candidates(app: &App) -> Result<Vec<Plan>, String> {
    use crate::plan::app::fermata::{fermata, fermata_integral, portfolio};
    let first = fermata(app)?;
    let mut out = vec![first];
    out.extend(fermata_integral(app).ok());
    out.extend(portfolio(app));
    let key = |p: &Plan| {
        p.modules
            .iter()
            .map(|m| {
                let a: Vec<String> = m
                    .allocs
                    .iter()
                    .map(|a| format!("{:?}:{:.9}", a.config, a.count))
                    .collect();
                format!("{:.9}|{}", m.budget, a.join(","))
            })
            .collect::<Vec<_>>()
            .join(";")
    };
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| p.verify(app).is_ok() && seen.insert(key(p)));
    Ok(out)
}

/// Plans `app` and serves it: the cheapest of [`candidates`] once each is
/// served ([`fit`]). Candidates are tried in order of their plans' integral
/// cost; one whose lines cannot carry the rates for less than the cheapest
/// served so far ([`carry_bound`]) is skipped. `Err` when no candidate is
/// served within its simulations.
pub fn serve(app: &App, o: &ServeOptions) -> Result<Served, String> {
    let roots: Vec<usize> = (0..app.modules.len())
        .filter(|&v| app.parents(v).next().is_none())
        .collect();
    let r0 = ingress(app);
    if roots
        .iter()
        .any(|&v| (app.rates[v] - r0).abs() > 1e-9 * r0.max(1.0))
    {
        return Err(
            "roots with different rates: the simulator serves one request rate into every root"
                .into(),
        );
    }
    if !(o.target_good > 0.0 && o.target_good <= 1.0) || o.requests == 0 || o.max_sims == 0 {
        return Err("target_good in (0, 1], requests and max_sims > 0".into());
    }
    let mut cands = candidates(app)?;
    cands.sort_by(|a, b| a.integral_cost.total_cmp(&b.integral_cost));
    let mut best: Option<Served> = None;
    let mut tried = 0usize;
    for p in &cands {
        if best
            .as_ref()
            .is_some_and(|b| carry_bound(app, p) >= b.cost - 1e-9)
        {
            continue;
        }
        tried += 1;
        if let Ok(Some(s)) = fit(app, p, o) {
            if best.as_ref().is_none_or(|b| s.cost < b.cost - 1e-9) {
                best = Some(s);
            }
        }
    }
    best.ok_or_else(|| {
        format!(
            "none of the {tried} candidate plans tried reached {}% good within {} simulations",
            o.target_good * 100.0,
            o.max_sims
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::planners::{profiles, workload};
    use crate::plan::app::planners;

    /// A short generated chain, planned by harpagon.
    fn short_chain() -> (App, Plan) {
        let profs = profiles();
        (0..60)
            .map(|s| workload(s, 0.35, &profs))
            .filter(|a| a.name.starts_with("chain") && a.modules.len() <= 3)
            .find_map(|a| {
                let p = planners::run(&a, "harpagon", &mut || false).ok()?;
                Some((a, p))
            })
            .expect("a short chain harpagon plans")
    }

    fn quick() -> ServeOptions {
        ServeOptions {
            requests: 400,
            max_sims: 25,
            ..ServeOptions::default()
        }
    }

    #[test]
    fn fit_finds_whole_machines_that_reach_the_target_and_is_seeded() {
        let (app, plan) = short_chain();
        let o = quick();
        let s = fit(&app, &plan, &o).unwrap().expect("served");
        assert!(s.good >= o.target_good, "{}", s.good);
        assert!(s.sims >= 1 && s.sims <= o.max_sims);
        assert_eq!(s.lines.len(), s.machines.len());
        assert!((s.cost - lines_cost(&app, &s.lines, &s.machines)).abs() < 1e-9);
        // Every module keeps a machine.
        for v in 0..app.modules.len() {
            let n: u32 = s
                .lines
                .iter()
                .zip(&s.machines)
                .filter(|(l, _)| l.module == v)
                .map(|(_, &k)| k)
                .sum();
            assert!(n >= 1, "module {v} without machines");
        }
        // The answer is the simulator's at those machines, and seeded.
        let sim = app_sim(&app, &plan, &s.lines, &s.machines, o.rule).unwrap();
        for k in 0..u64::from(o.runs) {
            let opt = sim_options(&app, o.requests, o.runtime, o.seed + k, 40.0);
            assert!(simulate_app(&sim, &opt).good_fraction() >= s.good);
        }
        let again = fit(&app, &plan, &o).unwrap().unwrap();
        assert_eq!(again.machines, s.machines);
    }

    #[test]
    fn fit_grows_a_plan_whose_machines_miss_the_target() {
        let (app, plan) = short_chain();
        let o = quick();
        // The plan at a third of its rate's machines: fewer than it needs.
        let mut thin = plan.clone();
        for m in &mut thin.modules {
            for a in &mut m.allocs {
                a.count = (a.count / 3.0).max(0.2);
            }
        }
        let ls = lines(&thin);
        let start: Vec<u32> = ls.iter().map(|l| l.machines).collect();
        let opt = sim_options(&app, o.requests, o.runtime, o.seed, 40.0);
        let (at_start, _) = good_at(&app, &thin, &ls, &start, &o, &opt).unwrap();
        assert!(at_start < o.target_good, "{at_start}");
        let s = fit(&app, &thin, &o).unwrap().expect("served");
        assert!(s.good >= o.target_good);
        assert!(s.cost > lines_cost(&app, &ls, &start));
        // Out of simulations: no answer rather than a wrong one.
        let none = fit(
            &app,
            &thin,
            &ServeOptions {
                max_sims: 1,
                ..o.clone()
            },
        )
        .unwrap();
        assert!(none.is_none());
    }

    #[test]
    fn serve_answers_the_cheapest_candidate_once_served() {
        let (app, _) = short_chain();
        let o = quick();
        let s = serve(&app, &o).unwrap();
        assert!(s.good >= o.target_good);
        let cands = candidates(&app).unwrap();
        assert!(cands.len() >= 2, "fermata's and at least one peer's");
        assert_eq!(cands[0].planner, "fermata");
        assert!(cands.iter().all(|c| c.verify(&app).is_ok()));
        // It is one of the candidates, and no candidate served costs less.
        assert!(cands
            .iter()
            .any(|c| c.origin == s.plan.origin && (c.cost - s.plan.cost).abs() < 1e-9));
        for c in &cands {
            if let Ok(Some(f)) = fit(&app, c, &o) {
                assert!(
                    s.cost <= f.cost + 1e-9,
                    "{} served at {} below the answer's {}",
                    c.origin,
                    f.cost,
                    s.cost
                );
            }
        }
    }

    #[test]
    fn serve_refuses_roots_at_different_rates() {
        let (mut app, _) = short_chain();
        // A second root at another rate.
        let v = app.modules.len() - 1;
        app.edges.retain(|e| e.to != v);
        app.rates[v] = app.rates[0] * 2.0 + 1.0;
        let e = serve(&app, &quick()).unwrap_err();
        assert!(e.contains("different rates"), "{e}");
    }
}
