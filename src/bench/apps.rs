//! `fermata bench apps`: the cost to serve generated applications, measured in the
//! simulator rather than computed from a latency model.
//!
//! For each application of the planner benchmark's generator
//! ([`super::planners::workload`]) and each setup (a planner, a runtime and a
//! deadline rule), the search starts from the plan's machines (each allocation
//! line of a module becomes a sub-cluster of its GPU type and concurrency, its
//! count rounded up) and finds the cheapest machine counts at which the simulator
//! serves the application at its rate with at least 99% of its requests within
//! the SLO: machines are removed, most expensive first, while the target holds;
//! when the plan's counts miss it, machines are added to the module whose tasks
//! expire most (or, with none expiring, the busiest) until it holds. Costs are
//! Σ price × machines (whole machines: partial ones are not shared between
//! modules). Fan-outs are Poisson with the edge's mean (edges of fan-out exactly
//! 1 pass outputs whole).
//!
//! It also reports whose latency model holds: each planner's predicted worst case
//! against the simulated p99 of application latency at the plan's machines and
//! rate (requests that expire count as infinitely late).

use super::planners::{profiles, workload};
use crate::app::DeadlineRule;
use crate::core::Policy;
use crate::plan::app::{planners, App, Plan};
use crate::sim::apps::{simulate_app, AppSimOptions, Runtime};
use crate::sim::served::{self, lines_cost as cost, ServeOptions};
pub use crate::sim::served::{app_sim, ingress, lane_profile, lines, Line};
use serde::Serialize;

/// The good share a GPU set must reach.
pub const TARGET_GOOD: f64 = 0.99;

#[derive(Debug, Clone)]
pub struct Options {
    pub apps: usize,
    pub seed: u64,
    /// Price of the 1080Ti over the A100's.
    pub price_ratio: f64,
    /// Application requests each simulation aims to count (its window is sized
    /// from the rate, 2-20 s).
    pub requests: u64,
    /// Simulations at most per application and setup.
    pub max_sims: usize,
    /// Print each simulation of the search to stderr.
    pub trace: bool,
    /// How the setups that serve their plan first ([`Setup::serve`]) do so.
    pub serve: ServeOptions,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            apps: 100,
            seed: 1,
            price_ratio: 0.35,
            requests: 1000,
            max_sims: 30,
            trace: false,
            serve: ServeOptions::default(),
        }
    }
}

/// A planner, the runtime that serves its plan and the deadline rule.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub name: &'static str,
    pub planner: &'static str,
    pub runtime: Runtime,
    pub rule: DeadlineRule,
    /// The plan served as users get it ([`served::serve`]): the cheapest of the
    /// planner's candidate plans once served in the simulator, searched from
    /// the machines it was served at.
    pub serve: bool,
}

/// The compared setups; the reference (`harpagon+tc`) is third.
pub fn setups() -> Vec<Setup> {
    vec![
        Setup {
            name: "fermata+deferred",
            planner: "fermata",
            runtime: Runtime::Core(Policy::Deferred),
            rule: DeadlineRule::LatestUseful,
            serve: true,
        },
        Setup {
            name: "fermata+static",
            planner: "fermata",
            runtime: Runtime::Core(Policy::Deferred),
            rule: DeadlineRule::Static,
            serve: false,
        },
        Setup {
            name: "harpagon+tc",
            planner: "harpagon",
            runtime: Runtime::ThroughputCost,
            rule: DeadlineRule::Static,
            serve: false,
        },
        Setup {
            name: "nexus+nexus",
            planner: "nexus",
            runtime: Runtime::Nexus,
            rule: DeadlineRule::Static,
            serve: false,
        },
    ]
}

/// One simulation's verdict.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Trial {
    pub good: f64,
    /// p99 of application latency (s); infinite when more than 1% did not finish.
    pub p99_s: f64,
}

fn sim_options(app: &App, o: &Options, runtime: Runtime, seed: u64) -> AppSimOptions {
    served::sim_options(app, o.requests, runtime, seed, 20.0)
}

/// Simulates `plan` at `machines`; also the module to grow when it misses.
fn trial(
    app: &App,
    plan: &Plan,
    ls: &[Line],
    machines: &[u32],
    setup: &Setup,
    opt: &AppSimOptions,
    trace: bool,
) -> Result<(Trial, usize), String> {
    let sim = app_sim(app, plan, ls, machines, setup.rule)?;
    let r = if trace {
        // With the checks on: each batch's placement.
        let mut o = opt.clone();
        o.check = true;
        simulate_app(&sim, &o)
    } else {
        simulate_app(&sim, opt)
    };
    if trace {
        let per_module: Vec<String> = (0..app.modules.len())
            .map(|v| {
                let m: Vec<String> = ls
                    .iter()
                    .zip(machines)
                    .filter(|(l, _)| l.module == v)
                    .map(|(l, k)| {
                        let c = &l.config;
                        let hw = &app.hardware[c.hw].name;
                        format!("{k}x{hw} b{} e{}", c.batch, c.concurrency)
                    })
                    .collect();
                let batches = r.placements.iter().filter(|p| p.module == v).count();
                format!(
                    "{}[{}; budget {:.1} ms] drop {}/{}, batch mean {:.1}",
                    app.modules[v].name,
                    m.join(" + "),
                    plan.modules[v].budget * 1e3,
                    r.expired[v],
                    r.tasks[v],
                    r.tasks[v].saturating_sub(r.expired[v]) as f64 / batches.max(1) as f64
                )
            })
            .collect();
        eprintln!(
            "{} {} cost {:.2} good {:.4}: {}",
            app.name,
            setup.name,
            cost(app, ls, machines),
            r.good_fraction(),
            per_module.join(", ")
        );
    }
    let n = r.offered.max(1) as usize;
    let idx = ((n as f64 * 0.99).ceil() as usize).clamp(1, n);
    let p99 = r.latencies.get(idx - 1).copied().unwrap_or(f64::INFINITY);
    let n_mod = app.modules.len();
    let expired = |v: usize| r.expired[v] as f64 / r.tasks[v].max(1) as f64;
    let load = |v: usize| {
        let cap: f64 = ls
            .iter()
            .zip(machines)
            .filter(|(l, _)| l.module == v)
            .map(|(l, &k)| f64::from(k) * l.config.throughput)
            .sum();
        app.rates[v] / cap.max(1e-9)
    };
    let grow = if (0..n_mod).any(|v| r.expired[v] > 0) {
        (0..n_mod).max_by(|&a, &b| expired(a).total_cmp(&expired(b)))
    } else {
        (0..n_mod).max_by(|&a, &b| load(a).total_cmp(&load(b)))
    }
    .unwrap_or(0);
    Ok((
        Trial {
            good: r.good_fraction(),
            p99_s: p99,
        },
        grow,
    ))
}

/// What the search found for one application and setup.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    /// The plan's predicted worst case (s) and the cost of its machines rounded up.
    pub predicted_worst_s: f64,
    pub plan_cost: f64,
    /// The simulation at the plan's machines.
    pub at_plan: Trial,
    /// The cheapest cost found that serves the application (`None`: not within
    /// the simulation budget).
    pub cost: Option<f64>,
    pub sims: usize,
}

/// Searches the cheapest serving machine counts for `plan` under `setup`.
pub fn search(
    app: &App,
    plan: &Plan,
    setup: &Setup,
    o: &Options,
    seed: u64,
) -> Result<Found, String> {
    let ls = lines(plan);
    let start: Vec<u32> = ls.iter().map(|l| l.machines).collect();
    search_from(app, plan, &ls, &start, setup, o, seed)
}

/// [`search`] from `start` machines on the lines `ls` of `plan`.
pub fn search_from(
    app: &App,
    plan: &Plan,
    ls: &[Line],
    start: &[u32],
    setup: &Setup,
    o: &Options,
    seed: u64,
) -> Result<Found, String> {
    let ls = ls.to_vec();
    let opt = sim_options(app, o, setup.runtime, seed);
    let mut m: Vec<u32> = start.to_vec();
    let mut sims = 0usize;
    let (first, mut grow) = trial(app, plan, &ls, &m, setup, &opt, o.trace)?;
    sims += 1;
    let ok = |t: &Trial| t.good >= TARGET_GOOD;
    let mut pass = ok(&first);
    // Grow: one machine at a time on the module that misses most.
    while !pass && sims < o.max_sims {
        let best = (0..ls.len())
            .filter(|&i| ls[i].module == grow)
            .max_by(|&a, &b| {
                let r = |i: usize| ls[i].config.throughput / app.price(&ls[i].config);
                r(a).total_cmp(&r(b))
            })
            .ok_or("a module without machines")?;
        m[best] += 1;
        let (t, g) = trial(app, plan, &ls, &m, setup, &opt, o.trace)?;
        sims += 1;
        pass = ok(&t);
        grow = g;
    }
    if !pass {
        return Ok(Found {
            predicted_worst_s: plan.worst,
            plan_cost: cost(app, &ls, start),
            at_plan: first,
            cost: None,
            sims,
        });
    }
    // Shrink: remove the most expensive machine that the target survives.
    let mut order: Vec<usize> = (0..ls.len()).collect();
    order.sort_by(|&a, &b| {
        app.price(&ls[b].config)
            .total_cmp(&app.price(&ls[a].config))
    });
    'outer: while sims < o.max_sims {
        for &i in &order {
            if m[i] == 0 {
                continue;
            }
            let module = ls[i].module;
            let left: u32 = (0..ls.len())
                .filter(|&j| ls[j].module == module)
                .map(|j| m[j])
                .sum();
            if left <= 1 || sims >= o.max_sims {
                continue;
            }
            m[i] -= 1;
            let (t, _) = trial(app, plan, &ls, &m, setup, &opt, o.trace)?;
            sims += 1;
            if ok(&t) {
                continue 'outer;
            }
            m[i] += 1;
        }
        break;
    }
    Ok(Found {
        predicted_worst_s: plan.worst,
        plan_cost: cost(app, &ls, start),
        at_plan: first,
        cost: Some(cost(app, &ls, &m)),
        sims,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct AppRow {
    pub app: String,
    pub ingress_rps: f64,
    pub slo_s: f64,
    /// Per setup, in [`setups`] order (`None`: the planner gave no plan).
    pub found: Vec<Option<Found>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SetupSummary {
    pub setup: String,
    /// Applications it served within the simulation budget.
    pub served: usize,
    /// Cost / harpagon+tc's over the applications both served.
    pub compared: usize,
    pub ratio_mean: f64,
    pub ratio_max: f64,
    /// Applications where it cost more than harpagon+tc.
    pub above_reference: usize,
    pub ratios: Vec<f64>,
    /// Whose latency model holds: applications where the simulated p99 at the
    /// plan's machines is within the predicted worst case, and the median of
    /// p99 / predicted.
    pub p99_within_predicted: usize,
    pub p99_over_predicted_median: f64,
    pub sims: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub apps: usize,
    pub seed: u64,
    pub price_ratio: f64,
    pub target_good: f64,
    pub setups: Vec<SetupSummary>,
    pub rows: Vec<AppRow>,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Every setup's [`Found`] for one application (`seed`: its generator seed),
/// in [`setups`] order: each planner plans it once; the setups that serve
/// their plan take it from [`served::serve`] (the planner's own simulator
/// seed); every search simulates with the same seed, derived from `seed`.
pub fn measure(app: &App, o: &Options, seed: u64) -> Vec<Option<Found>> {
    let ss = setups();
    let mut plans: Vec<(&str, Option<Plan>)> = Vec::new();
    for s in &ss {
        if plans.iter().any(|(p, _)| *p == s.planner) {
            continue;
        }
        let mut never = || false;
        let p = planners::run(app, s.planner, &mut never)
            .ok()
            .filter(|p| p.verify(app).is_ok());
        plans.push((s.planner, p));
    }
    // The plan as users get it served, once per application (the
    // planner's own simulator seed, not the measurement's).
    let mut served_plan: Option<Option<served::Served>> = None;
    let found: Vec<Option<Found>> = ss
        .iter()
        .map(|s| {
            if s.serve {
                let sv = served_plan
                    .get_or_insert_with(|| {
                        let so = ServeOptions {
                            trace: o.trace,
                            ..o.serve.clone()
                        };
                        served::serve(app, &so).ok()
                    })
                    .as_ref()?;
                return search_from(app, &sv.plan, &sv.lines, &sv.machines, s, o, seed ^ 0xa995)
                    .ok();
            }
            let plan = plans.iter().find(|(p, _)| *p == s.planner)?.1.as_ref()?;
            search(app, plan, s, o, seed ^ 0xa995).ok()
        })
        .collect();
    found
}

pub fn run(o: &Options, mut progress: impl FnMut(usize)) -> Report {
    let profs = profiles();
    let ss = setups();
    let mut rows = Vec::new();
    for i in 0..o.apps {
        let seed = o.seed.wrapping_add(i as u64);
        let app = workload(seed, o.price_ratio, &profs);
        let found = measure(&app, o, seed);
        rows.push(AppRow {
            app: app.name.clone(),
            ingress_rps: ingress(&app),
            slo_s: app.slo,
            found,
        });
        progress(i);
    }
    let reference = 2;
    let setups = ss
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let mut ratios = Vec::new();
            let mut within = 0;
            let mut over = Vec::new();
            let mut sims = 0;
            let mut served = 0;
            for r in &rows {
                let Some(f) = &r.found[k] else { continue };
                sims += f.sims;
                served += usize::from(f.cost.is_some());
                if f.at_plan.p99_s <= f.predicted_worst_s * (1.0 + 1e-9) {
                    within += 1;
                }
                over.push(f.at_plan.p99_s / f.predicted_worst_s);
                if let (Some(c), Some(Some(h))) =
                    (f.cost, r.found[reference].as_ref().map(|h| h.cost))
                {
                    ratios.push(c / h);
                }
            }
            ratios.sort_by(f64::total_cmp);
            SetupSummary {
                setup: s.name.to_string(),
                served,
                compared: ratios.len(),
                ratio_mean: ratios.iter().sum::<f64>() / ratios.len().max(1) as f64,
                ratio_max: ratios.iter().copied().fold(f64::NAN, f64::max),
                above_reference: ratios.iter().filter(|&&x| x > 1.0 + 1e-9).count(),
                p99_within_predicted: within,
                p99_over_predicted_median: median(&mut over),
                ratios,
                sims,
            }
        })
        .collect();
    Report {
        apps: o.apps,
        seed: o.seed,
        price_ratio: o.price_ratio,
        target_good: TARGET_GOOD,
        setups,
        rows,
    }
}

/// CDF plot (SVG) of cost / harpagon+tc's, one line per setup.
pub fn cdf_svg(r: &Report) -> String {
    use super::plot::{line_chart_svg, Series};
    let series: Vec<Series> = r
        .setups
        .iter()
        .map(|s| Series {
            name: s.setup.clone(),
            points: s
                .ratios
                .iter()
                .enumerate()
                .map(|(i, &x)| (x, (i + 1) as f64 / s.ratios.len() as f64))
                .collect(),
        })
        .collect();
    line_chart_svg(
        &format!(
            "Measured cost to serve at {}% good, normalised to harpagon+tc",
            r.target_good * 100.0
        ),
        "cost / harpagon+tc's cost",
        "CDF of applications",
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_profiles_interpolate_between_profiled_batches() {
        let profs = profiles();
        let app = workload(3, 0.35, &profs);
        let v = (0..app.modules.len())
            .find(|&v| {
                app.modules[v]
                    .configs
                    .iter()
                    .any(|c| c.batch == 4 && c.hw == 0)
            })
            .expect("a GPU module");
        let p = lane_profile(&app, v, 0, 1).unwrap();
        let at = |b: u32| {
            app.modules[v]
                .configs
                .iter()
                .find(|c| c.batch == b && c.hw == 0 && c.concurrency == 1)
                .unwrap()
                .latency
        };
        assert_eq!(p.max_batch(), 32);
        assert!((p.latency(4).as_secs_f64() - at(4)).abs() < 1e-6);
        let mid = p.latency(3).as_secs_f64();
        assert!(mid > at(2) && mid < at(4), "{mid}");
        assert!(lane_profile(&app, v, 0, 7).is_err());
    }

    #[test]
    fn a_plan_becomes_subclusters_of_its_types_and_the_search_serves_it() {
        let profs = profiles();
        let o = Options {
            requests: 300,
            max_sims: 6,
            ..Options::default()
        };
        // The first short generated chain that harpagon plans.
        let (app, plan) = (0..60)
            .map(|s| workload(s, 0.35, &profs))
            .filter(|a| a.name.starts_with("chain") && a.modules.len() <= 3)
            .find_map(|a| {
                let p = planners::run(&a, "harpagon", &mut || false).ok()?;
                Some((a, p))
            })
            .expect("a short chain harpagon plans");
        let ls = lines(&plan);
        let m: Vec<u32> = ls.iter().map(|l| l.machines).collect();
        let sim = app_sim(&app, &plan, &ls, &m, DeadlineRule::Static).unwrap();
        assert_eq!(sim.subclusters.len(), ls.len());
        for (sc, l) in sim.subclusters.iter().zip(&ls) {
            assert_eq!(
                (sc.module, sc.gpu_type, sc.lanes),
                (l.module, l.config.hw, l.config.concurrency)
            );
            assert!(
                f64::from(sc.machines) + 1e-9
                    >= plan.modules[l.module]
                        .allocs
                        .iter()
                        .filter(|a| a.config == l.config)
                        .map(|a| a.count)
                        .sum::<f64>()
            );
        }
        let s = setups()[2];
        let f = search(&app, &plan, &s, &o, 5).unwrap();
        assert!(f.sims >= 1 && f.sims <= o.max_sims);
        if let Some(c) = f.cost {
            assert!(c > 0.0);
            // Shrinking only removes machines; growing only when the plan's missed.
            if f.at_plan.good >= TARGET_GOOD {
                assert!(c <= f.plan_cost + 1e-9);
            } else {
                assert!(c > f.plan_cost);
            }
        }
    }

    #[test]
    fn the_served_fermata_plan_costs_no_more_than_harpagon_tc_where_its_own_plan_cost_more() {
        // Generated application 69: served from `fermata`'s own plan, the
        // deferred runtime needed 6.85 against harpagon + TC's 6.40 (a plan
        // whose whole machines cost more once served than predicted).
        let o = Options {
            apps: 1,
            seed: 69,
            ..Options::default()
        };
        let r = run(&o, |_| {});
        let row = &r.rows[0];
        let cost = |k: usize| {
            row.found[k]
                .as_ref()
                .and_then(|f| f.cost)
                .unwrap_or_else(|| panic!("{} not served", r.setups[k].setup))
        };
        assert_eq!(r.setups[0].setup, "fermata+deferred");
        assert_eq!(r.setups[2].setup, "harpagon+tc");
        assert!(cost(0) <= cost(2) + 1e-9, "{} > {}", cost(0), cost(2));
    }
}
