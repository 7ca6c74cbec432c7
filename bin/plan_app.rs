//! `fermata plan app` and `fermata bench planners`: the application planners
//! (src/plan/app/) from the command line.

use anyhow::{bail, Context, Result};
use clap::Args;
use fermata::bench::planners as bp;
use fermata::plan::app::{file, planners, Plan};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct AppArgs {
    /// Application file (TOML; see docs/planning.md).
    #[arg(long)]
    app: PathBuf,
    /// fermata, fermata-integral, exact, harpagon, piccolo, scrooge, nexus,
    /// inferline or clipper.
    #[arg(long, default_value = "fermata")]
    planner: String,
    /// Run every planner on the file, side by side.
    #[arg(long)]
    compare: bool,
    /// Time limit of `exact` (s).
    #[arg(long, default_value_t = 60.0)]
    exact_limit_s: f64,
    /// Serve the plan in the simulator before answering (`fermata` only): the
    /// cheapest of `fermata`'s candidate plans (its own, `fermata-integral`'s,
    /// its portfolio's) once each is served by the deferred dispatcher with
    /// the latest-useful deadline rule at the application's rate, in whole
    /// machines that keep 99% of requests within the SLO.
    #[arg(long)]
    serve: bool,
    /// The simulator's seed with --serve.
    #[arg(long, default_value_t = 0x5e55_1011)]
    serve_seed: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn run_one(
    app: &fermata::plan::app::App,
    name: &str,
    limit: Duration,
) -> (Result<Plan, String>, f64) {
    let t0 = Instant::now();
    let mut stop = move || t0.elapsed() > limit;
    let r = planners::run(app, name, &mut stop);
    (r, t0.elapsed().as_secs_f64() * 1e3)
}

fn plan_json(p: &Plan, ms: f64) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    v["plan_ms"] = json!(ms);
    v
}

fn print_plan(app: &fermata::plan::app::App, p: &Plan, ms: f64) {
    println!(
        "planner {} on {} (SLO {:.1} ms){}",
        p.planner,
        app.name,
        app.slo * 1e3,
        if p.origin != p.planner {
            format!(": the plan {} built, cheaper than its own", p.origin)
        } else {
            String::new()
        }
    );
    println!(
        "{:<24} {:>9} {:>10} {:>10} {:>9} {:<15} configurations (hardware b x e: machines)",
        "module", "rate/s", "budget ms", "worst ms", "dummy/s", "dispatch"
    );
    for m in &p.modules {
        let mut cfgs: Vec<String> = m
            .allocs
            .iter()
            .map(|a| {
                format!(
                    "{} {}x{}: {:.3}",
                    app.hardware[a.config.hw].name, a.config.batch, a.config.concurrency, a.count
                )
            })
            .collect();
        if let Some(lead) = &m.served_by {
            cfgs.push(format!("prefix-batched on {lead}'s machines"));
        }
        println!(
            "{:<24} {:>9.1} {:>10.2} {:>10.2} {:>9.2} {:<15} {}",
            m.name,
            m.rate,
            m.budget * 1e3,
            m.worst * 1e3,
            m.dummy,
            match m.dispatch {
                fermata::plan::app::Dispatch::ThroughputCost => "throughput-cost",
                fermata::plan::app::Dispatch::RoundRobin => "round-robin",
            },
            cfgs.join(", ")
        );
    }
    println!(
        "worst case {:.2} ms (path {}), cost {:.4}/h fractional, {:.4}/h integral, planned in {:.2} ms",
        p.worst * 1e3,
        p.critical_path.join(" -> "),
        p.cost,
        p.integral_cost,
        ms
    );
}

pub fn cmd_plan_app(a: AppArgs) -> Result<()> {
    if !(a.exact_limit_s.is_finite() && a.exact_limit_s > 0.0 && a.exact_limit_s <= 86_400.0) {
        bail!("--exact-limit-s must be in (0, 86400]");
    }
    let limit = Duration::from_secs_f64(a.exact_limit_s);
    let meta = std::fs::metadata(&a.app).with_context(|| format!("reading {}", a.app.display()))?;
    if meta.len() > 4 << 20 {
        bail!("{}: over 4 MiB", a.app.display());
    }
    let text =
        std::fs::read_to_string(&a.app).with_context(|| format!("reading {}", a.app.display()))?;
    let app = file::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", a.app.display()))?;
    if a.serve {
        if a.compare || a.planner != "fermata" {
            bail!("--serve serves `fermata`'s plans: leave out --compare and --planner");
        }
        return serve_app(&app, a.serve_seed, a.json);
    }
    let names: Vec<&str> = if a.compare {
        planners::PLANNERS.to_vec()
    } else {
        if !planners::PLANNERS.contains(&a.planner.as_str()) {
            bail!(
                "unknown planner {:?}: one of {}",
                a.planner,
                planners::PLANNERS.join(", ")
            );
        }
        vec![a.planner.as_str()]
    };
    let mut out = Vec::new();
    for n in &names {
        let (r, ms) = run_one(&app, n, limit);
        out.push((n.to_string(), r, ms));
    }
    if !a.compare {
        let (_, r, ms) = out.pop().unwrap();
        let p = r.map_err(|e| anyhow::anyhow!("{}: {e}", a.planner))?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&plan_json(&p, ms))?);
        } else {
            print_plan(&app, &p, ms);
        }
        return Ok(());
    }
    if a.json {
        let v: Vec<serde_json::Value> = out
            .iter()
            .map(|(n, r, ms)| match r {
                Ok(p) => plan_json(p, *ms),
                Err(e) => json!({"planner": n, "error": e, "plan_ms": ms}),
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"app": app.name, "plans": v}))?
        );
        return Ok(());
    }
    for (_, r, ms) in &out {
        if let Ok(p) = r {
            print_plan(&app, p, *ms);
            println!();
        }
    }
    println!(
        "{:<17} {:>12} {:>12} {:>10} {:>10}",
        "planner", "cost/h", "integral/h", "worst ms", "plan ms"
    );
    for (n, r, ms) in &out {
        match r {
            Ok(p) => println!(
                "{:<17} {:>12.4} {:>12.4} {:>10.2} {:>10.2}",
                n,
                p.cost,
                p.integral_cost,
                p.worst * 1e3,
                ms
            ),
            Err(e) => println!("{n:<17} no plan: {e}"),
        }
    }
    Ok(())
}

/// `fermata plan app --serve`.
fn serve_app(app: &fermata::plan::app::App, seed: u64, json: bool) -> Result<()> {
    use fermata::sim::served;
    let o = served::ServeOptions {
        seed,
        ..served::ServeOptions::default()
    };
    let t0 = Instant::now();
    let s = served::serve(app, &o).map_err(|e| anyhow::anyhow!("{}: {e}", app.name))?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let lines: Vec<serde_json::Value> = s
        .lines
        .iter()
        .zip(&s.machines)
        .map(|(l, &k)| {
            json!({
                "module": app.modules[l.module].name,
                "hardware": app.hardware[l.config.hw].name,
                "batch": l.config.batch,
                "concurrency": l.config.concurrency,
                "machines": k,
            })
        })
        .collect();
    if json {
        let mut v = plan_json(&s.plan, ms);
        v["served"] = json!({
            "machines": lines,
            "cost": s.cost,
            "good": s.good,
            "target_good": o.target_good,
            "sims": s.sims,
            "seed": seed,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_plan(app, &s.plan, ms);
    println!(
        "served (deferred dispatcher, latest-useful deadlines, seed {seed}): {:.1}% of requests within the SLO at cost {:.4}/h in whole machines ({} simulations of this plan); machines:",
        s.good * 100.0,
        s.cost,
        s.sims
    );
    for l in &lines {
        println!(
            "  {:<24} {} b{} e{}: {}",
            l["module"].as_str().unwrap_or(""),
            l["hardware"].as_str().unwrap_or(""),
            l["batch"],
            l["concurrency"],
            l["machines"]
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct BenchPlannersArgs {
    #[arg(long, default_value_t = 200)]
    workloads: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Price of the 1080Ti over the A100's (A100 = 1.0).
    #[arg(long, default_value_t = 0.35)]
    price_ratio: f64,
    /// Time limit of `exact` per workload (s).
    #[arg(long, default_value_t = 60.0)]
    exact_limit_s: f64,
    /// Workload family: symphony (ingress 20-400 req/s) or paper (200-4,000
    /// req/s, several machines per module as in Harpagon's examples).
    #[arg(long, default_value = "symphony")]
    family: String,
    /// Skip Harpagon's ablations.
    #[arg(long)]
    no_ablations: bool,
    /// Branch-and-bound nodes per module of `fermata`'s step functions.
    #[arg(long, default_value_t = planners::FERMATA_NODES)]
    fermata_nodes: u64,
    /// Branch-and-bound nodes of `fermata`'s search below its best plan
    /// (`exact`'s search; 0: none). It runs only with `--fermata-lists-nodes 0`.
    #[arg(long, default_value_t = planners::EXACT_NODES)]
    fermata_exact_nodes: u64,
    /// Branch-and-bound nodes of `fermata`'s lazy search of `exact`'s lists
    /// below its portfolio's best plan (0: none).
    #[arg(long, default_value_t = planners::LISTS_NODES)]
    fermata_lists_nodes: u64,
    /// Also time `fermata` on the scale instance (20 modules, 5 hardware types,
    /// 50 configurations each).
    #[arg(long)]
    scale: bool,
    /// Write the CDF of normalised cost (SVG) to this file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// List each workload where `fermata` planned above another planner or
    /// ablation (seed, modules, the planners below it and by how much).
    #[arg(long)]
    show_misses: bool,
    /// List `fermata`'s N slowest workloads (seed, modules, rates, time, and
    /// who built the plan).
    #[arg(long, default_value_t = 0)]
    show_slowest: usize,
    #[arg(long)]
    json: bool,
}

fn row(s: &bp::PlannerStats) -> String {
    format!(
        "{:<17} {:>5}/{:<4}/{:<4} {:>8.3} {:>8.3} {:>6} {:>9.1}% {:>8.2}% {:>9.2} {:>9.2}",
        s.planner,
        s.planned,
        s.failed,
        s.infeasible,
        s.norm_mean,
        s.norm_max,
        s.below_fermata,
        s.equal_exact * 100.0,
        s.worst_gap * 100.0,
        s.time_p50_ms,
        s.time_p99_ms
    ) + &if s.failures.is_empty() {
        String::new()
    } else {
        format!(
            "  {}",
            s.failures
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

pub fn cmd_bench_planners(a: BenchPlannersArgs) -> Result<()> {
    if a.workloads == 0 || a.workloads > 1_000_000 {
        bail!("--workloads must be in 1..=1000000");
    }
    if !(a.price_ratio.is_finite() && a.price_ratio > 0.0 && a.price_ratio <= 100.0) {
        bail!("--price-ratio must be in (0, 100]");
    }
    if !(a.exact_limit_s.is_finite() && a.exact_limit_s > 0.0 && a.exact_limit_s <= 86_400.0) {
        bail!("--exact-limit-s must be in (0, 86400]");
    }
    let o = bp::Options {
        workloads: a.workloads,
        seed: a.seed,
        price_ratio: a.price_ratio,
        exact_limit: Duration::from_secs_f64(a.exact_limit_s),
        ablations: !a.no_ablations,
        scale: a.scale,
        fermata_nodes: a.fermata_nodes.max(1),
        fermata_exact_nodes: a.fermata_exact_nodes,
        fermata_lists_nodes: a.fermata_lists_nodes,
        family: bp::Family::by_name(&a.family)
            .with_context(|| format!("--family {:?}: symphony or paper", a.family))?,
        slowest: a.show_slowest.min(a.workloads),
    };
    let json = a.json;
    let r = bp::run(&o, |i| {
        if !json && (i + 1) % 50 == 0 {
            eprintln!("{} workloads planned", i + 1);
        }
    });
    if let Some(p) = &a.plot {
        std::fs::write(p, bp::cdf_svg(&r)).with_context(|| format!("writing {}", p.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "{} workloads ({} family, ingress {}-{} req/s), seed {}, price ratio {} (A100 = 1.0); exact finished {} within {} s; fermata at {} nodes per module, {} in its lists, {} below its best plan",
        r.workloads, r.family.name, r.family.ingress.0, r.family.ingress.1, r.seed, r.price_ratio, r.exact_finished, r.exact_limit_s, r.fermata_nodes, r.fermata_lists_nodes, r.fermata_exact_nodes
    );
    println!(
        "{:<17} {:>15} {:>8} {:>8} {:>6} {:>10} {:>9} {:>9} {:>9}",
        "planner", "ok/none/infeas", "norm", "max", "below", "<=exact", "gap", "p50 ms", "p99 ms"
    );
    println!("(then the workloads without a plan, by cause)");
    println!("no plan, by cause: budget (the split leaves a module less than any configuration needs with every machine full), residual (full machines fit but no configuration serves the residual rate f within the budget, d + b/f, and the planner's dummies do not help), start (the splitter's starting point misses the SLO), split (no split on the planner's grid fits), milp (Scrooge's MILP is infeasible), infeasible (a plan that fails the feasibility check)");
    println!("costs: fractional (price x machines, partial machines by their fraction); norm and max: cost / fermata's; below: workloads cheaper than fermata; <=exact and gap: among the workloads exact finished; infeas: plans that fail the feasibility check, counted as no plan; over harpagon: mean of cost / harpagon's cost over the workloads both planned, less 1 (the papers' reference)");
    for s in &r.planners {
        println!("{}  {:+.1}% over harpagon", row(s), s.over_harpagon * 100.0);
    }
    println!(
        "fermata at most every other planner's fractional cost on {:.1}% of workloads ({:.1}% with Harpagon's ablations too; {:.1}% by integral cost); {} of its plans are a peer's (portfolio)",
        r.fermata_cheapest * 100.0,
        r.fermata_cheapest_with_ablations * 100.0,
        r.fermata_cheapest_integral * 100.0,
        r.planners[0].from_peer
    );
    println!(
        "fermata-integral (minimises the integral cost) at most every other planner's and ablation's integral cost, fermata's included, on {:.1}% of workloads",
        r.fermata_integral_cheapest_integral * 100.0
    );
    if !r.ablations.is_empty() {
        println!("Harpagon's ablations (norm: to fermata; +%: mean of cost / harpagon's cost over the workloads both planned, less 1):");
        for s in &r.ablations {
            println!("{}  {:+.1}%", row(s), s.over_harpagon * 100.0);
        }
    }
    if let Some((n, at, gap)) = r.harpagon_vs_grid {
        println!(
            "harpagon at or below the best split on a 0.01 x SLO grid for its own module scheduler (quantised-0.01) on {:.1}% of the {n} workloads both planned, worst gap {:.2}%",
            at * 100.0,
            gap * 100.0
        );
    }
    if let Some(ms) = r.scale_ms {
        println!("scale instance (20 modules, 5 hardware types, 50 configurations each): fermata {ms:.1} ms");
    }
    if a.show_misses {
        println!(
            "workloads where fermata planned above another planner: {}",
            r.misses.len()
        );
        for m in &r.misses {
            println!(
                "  seed {} {} [{}]: fermata {:.6}; below it: {}",
                m.seed,
                m.app,
                m.modules.join(", "),
                m.fermata,
                m.below
                    .iter()
                    .map(|(n, c, g)| format!("{n} {c:.6} (+{:.3}%)", g * 100.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if !r.slowest.is_empty() {
        println!("fermata's slowest workloads:");
        for t in &r.slowest {
            println!(
                "  seed {} {}: {:.1} ms, plan by {} [{}]",
                t.seed,
                t.app,
                t.ms,
                if t.origin.is_empty() {
                    "none"
                } else {
                    &t.origin
                },
                t.modules
                    .iter()
                    .zip(&t.rates)
                    .map(|(m, r)| format!("{m} at {r:.0}/s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct BenchAppsArgs {
    /// Generated applications (the planner benchmark's generator).
    #[arg(long, default_value_t = 100)]
    apps: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Price of the 1080Ti over the A100's (A100 = 1.0).
    #[arg(long, default_value_t = 0.35)]
    price_ratio: f64,
    /// Application requests each simulation aims to count.
    #[arg(long, default_value_t = 1000)]
    requests: u64,
    /// Simulations at most per application and setup.
    #[arg(long, default_value_t = 30)]
    max_sims: usize,
    /// Write the CDF of cost / harpagon+tc's (SVG) to this file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print each simulation of every search to stderr: the cost, the good
    /// share, each module's machines and its drops / tasks.
    #[arg(long)]
    trace: bool,
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_apps(a: BenchAppsArgs) -> Result<()> {
    use fermata::bench::apps as ba;
    if a.apps == 0 || a.apps > 100_000 {
        bail!("--apps must be in 1..=100000");
    }
    if !(a.price_ratio.is_finite() && a.price_ratio > 0.0 && a.price_ratio <= 100.0) {
        bail!("--price-ratio must be in (0, 100]");
    }
    if a.requests == 0 || a.requests > 1_000_000 {
        bail!("--requests must be in 1..=1000000");
    }
    if a.max_sims == 0 || a.max_sims > 10_000 {
        bail!("--max-sims must be in 1..=10000");
    }
    let o = ba::Options {
        apps: a.apps,
        seed: a.seed,
        price_ratio: a.price_ratio,
        requests: a.requests,
        max_sims: a.max_sims,
        trace: a.trace,
        ..ba::Options::default()
    };
    let json = a.json;
    let r = ba::run(&o, |i| {
        if !json && (i + 1) % 10 == 0 {
            eprintln!("{} applications served", i + 1);
        }
    });
    if let Some(p) = &a.plot {
        std::fs::write(p, ba::cdf_svg(&r)).with_context(|| format!("writing {}", p.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "{} applications, seed {}, price ratio {} (A100 = 1.0); cost: the cheapest whole machines (price x count) at which the simulator keeps {}% of requests within the SLO",
        r.apps,
        r.seed,
        r.price_ratio,
        r.target_good * 100.0
    );
    println!(
        "{:<17} {:>7} {:>8} {:>10} {:>9} {:>7} {:>14} {:>14} {:>6}",
        "setup",
        "served",
        "compared",
        "mean/harp",
        "max/harp",
        "above",
        "p99<=predicted",
        "p99/pred p50",
        "sims"
    );
    for s in &r.setups {
        println!(
            "{:<17} {:>7} {:>8} {:>10.3} {:>9.3} {:>7} {:>14} {:>14.3} {:>6}",
            s.setup,
            s.served,
            s.compared,
            s.ratio_mean,
            s.ratio_max,
            s.above_reference,
            s.p99_within_predicted,
            s.p99_over_predicted_median,
            s.sims
        );
    }
    println!("mean/harp, max/harp, above: cost / harpagon+tc's over the applications both served; p99<=predicted: applications whose simulated p99 at the plan's machines is within the plan's predicted worst case (whose latency model holds)");
    Ok(())
}

#[derive(Args)]
pub struct BenchLanesArgs {
    /// Request rates into the application (r/s, comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1000,4000,16000")]
    rates: Vec<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Application requests each simulation aims to count.
    #[arg(long, default_value_t = 2000)]
    requests: u64,
    /// Simulations at most per rate and lane count.
    #[arg(long, default_value_t = 40)]
    max_sims: usize,
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_lanes(a: BenchLanesArgs) -> Result<()> {
    use fermata::bench::{apps as ba, lanes as bl};
    if a.rates.is_empty()
        || a.rates.len() > 100
        || a.rates
            .iter()
            .any(|r| !(r.is_finite() && *r > 0.0 && *r <= 1e6))
    {
        bail!("--rates must be 1 to 100 rates in (0, 1000000]");
    }
    if a.requests == 0 || a.requests > 1_000_000 {
        bail!("--requests must be in 1..=1000000");
    }
    if a.max_sims == 0 || a.max_sims > 10_000 {
        bail!("--max-sims must be in 1..=10000");
    }
    let o = ba::Options {
        apps: 1,
        seed: a.seed,
        price_ratio: 1.0,
        requests: a.requests,
        max_sims: a.max_sims,
        trace: false,
        ..ba::Options::default()
    };
    let r = bl::run(&a.rates, &o).map_err(anyhow::Error::msg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "detect -> classify on an emulated GPU (price 1.0) with d(b, e) = f(e) l(b), f = {:?}; SLO 200 ms; fermata plan + deferred dispatch with slack forwarding; measured: the cheapest whole machines at which the simulator keeps 99% within the SLO",
        r.factors
    );
    println!(
        "{:>8} {:>6} {:>8} {:>10} {:>10} {:>9} {:>10} {:>10}",
        "rate", "lanes", "planned", "predicted", "pred.whole", "measured", "worst ms", "p99 ms"
    );
    for x in &r.rows {
        println!(
            "{:>8} {:>6} {:>8} {:>10.2} {:>10.2} {:>9} {:>10.1} {:>10.1}",
            x.rate_rps,
            x.lanes.map_or("free".to_string(), |e| e.to_string()),
            x.planned_lanes
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("/"),
            x.predicted_cost,
            x.predicted_whole,
            x.measured_cost
                .map_or("-".to_string(), |c| format!("{c:.2}")),
            x.predicted_worst_s * 1e3,
            x.p99_at_plan_s * 1e3
        );
    }
    for (rate, one, e, best) in bl::best_over_one(&r) {
        println!(
            "rate {rate}: measured cost at e = 1 {one:.2}, best e = {e} {best:.2} ({:.3}x)",
            best / one
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct BenchNexusFig16Args {
    /// Mean fan-outs SSD -> Inception (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.1, 1.0, 10.0])]
    gammas: Vec<f64>,
    /// End-to-end SLOs in ms (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![300.0, 400.0, 500.0])]
    slos_ms: Vec<f64>,
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Application requests each simulation aims to count.
    #[arg(long, default_value_t = 2000)]
    requests: u64,
    /// Bisection steps on the rate per case and setup.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_nexus_fig16(a: BenchNexusFig16Args) -> Result<()> {
    use fermata::bench::nexus_fig16 as nf;
    if a.gammas.is_empty() || a.gammas.len() > 100 {
        bail!("--gammas takes 1 to 100 values");
    }
    if a.gammas
        .iter()
        .any(|g| !(g.is_finite() && *g > 0.0 && *g <= 100.0))
    {
        bail!("--gammas must be in (0, 100]");
    }
    if a.slos_ms.is_empty() || a.slos_ms.len() > 100 {
        bail!("--slos-ms takes 1 to 100 values");
    }
    if a.slos_ms
        .iter()
        .any(|s| !(s.is_finite() && *s >= 50.0 && *s <= 10_000.0))
    {
        bail!("--slos-ms must be in [50, 10000]");
    }
    if a.gpus < 2 || a.gpus > 1024 {
        bail!("--gpus must be in 2..=1024");
    }
    if a.requests == 0 || a.requests > 1_000_000 {
        bail!("--requests must be in 1..=1000000");
    }
    if a.steps == 0 || a.steps > 40 {
        bail!("--steps must be in 1..=40");
    }
    let o = nf::Options {
        gammas: a.gammas.clone(),
        slos: a.slos_ms.iter().map(|s| s / 1e3).collect(),
        gpus: a.gpus,
        requests: a.requests,
        steps: a.steps,
        seed: a.seed,
        check: false,
    };
    let json = a.json;
    let r = nf::run(&o, |row| {
        if !json {
            eprintln!("gamma {} SLO {} ms done", row.gamma, row.slo_ms);
        }
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "SSD -> Inception on {} GPUs (1080Ti profiles); throughput: the highest rate (req/s) found by {} bisection steps at which the simulator keeps {}% of requests within the SLO",
        r.gpus,
        r.steps,
        r.target_good * 100.0
    );
    println!(
        "{:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>16} {:>16}",
        "gamma",
        "SLO ms",
        "capacity",
        "fermata",
        "even",
        "nexus",
        "fermata/even",
        "fermata/nexus",
        "fermata split ms",
        "nexus split ms"
    );
    for row in &r.rows {
        let t = |i: usize| row.found[i].throughput_rps;
        let split = |i: usize| {
            row.found[i].at.as_ref().map_or("-".to_string(), |p| {
                format!("{:.0}/{:.0}", p.budgets_ms[0], p.budgets_ms[1])
            })
        };
        println!(
            "{:>6} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>12.3} {:>12.3} {:>16} {:>16}",
            row.gamma,
            row.slo_ms,
            row.capacity_rps,
            t(0),
            t(1),
            t(2),
            t(0) / t(1),
            t(0) / t(2),
            split(0),
            split(2)
        );
    }
    println!("capacity: every GPU at batch 32 in the ideal SSD/Inception proportion; split: the plan's SSD/Inception budgets at the reported rate");
    Ok(())
}

#[derive(Args)]
pub struct BenchAdaptArgs {
    /// Requests/s into the application.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// The planned mean fan-out detect -> classify.
    #[arg(long, default_value_t = 2.0)]
    fanout: f64,
    /// The factor the fan-out's mean jumps by.
    #[arg(long, default_value_t = 3.0)]
    jump: f64,
    /// When it jumps (s from the start).
    #[arg(long, default_value_t = 7.0)]
    jump_at_s: f64,
    /// The factor classify's batches take over its profile from
    /// `--jump-at-s` on (1: as profiled).
    #[arg(long, default_value_t = 1.0)]
    slowdown: f64,
    #[arg(long, default_value_t = 2.0)]
    epoch_s: f64,
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Relative drift of the measured fan-out that triggers a re-plan.
    #[arg(long, default_value_t = 0.25)]
    threshold: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_adapt(a: BenchAdaptArgs) -> Result<()> {
    use fermata::bench::adapt as ad;
    let o = ad::Options {
        rate_rps: a.rate,
        fanout: a.fanout,
        jump: a.jump,
        jump_at_s: a.jump_at_s,
        slowdown: a.slowdown,
        epoch_s: a.epoch_s,
        epochs: a.epochs,
        threshold: a.threshold,
        seed: a.seed,
        check: false,
    };
    o.check().map_err(anyhow::Error::msg)?;
    let r = ad::run(&o).map_err(anyhow::Error::msg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "detect -> classify (Poisson fan-out, mean {}), {} r/s, SLO 200 ms, fermata plan + deferred dispatch with slack forwarding; at {} s the fan-out's mean jumps {}x and classify's batches take {}x its profile; epochs of {} s; bad: requests arriving in the epoch not ended within the SLO",
        o.fanout, o.rate_rps, o.jump_at_s, o.jump, o.slowdown, o.epoch_s
    );
    let ms = |m: &[u32]| {
        m.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("/")
    };
    println!(
        "{:>6} {:>8} {:>10} {:>10} {:>10} {:>14} {:>14} {:>9}",
        "epoch",
        "start s",
        "requests",
        "bad fixed",
        "bad replan",
        "measured fan",
        "cls run/prof",
        "machines"
    );
    for (i, x) in r.rows.iter().enumerate() {
        println!(
            "{:>6} {:>8.1} {:>10} {:>9.2}% {:>9.2}% {:>14} {:>14} {:>9}{}{}",
            i,
            x.start_s,
            x.offered,
            x.bad_fixed * 100.0,
            x.bad_replan * 100.0,
            x.measured_fanout
                .map_or("-".to_string(), |f| format!("{f:.2}")),
            x.measured_ratio
                .map_or("-".to_string(), |f| format!("{f:.3}")),
            ms(&x.machines_replan),
            if i == r.jump_epoch { "  <- jump" } else { "" },
            if x.replanned { "  re-planned" } else { "" },
        );
    }
    let rec = |x: Option<usize>| x.map_or("never".to_string(), |k| format!("{k} epoch(s)"));
    println!(
        "machines (detect/classify) of the first plan: {}; bad under {}% to the end after the jump's epoch: fixed plan {}, re-planning {}",
        ms(&r.machines_fixed),
        ad::BAD_LIMIT * 100.0,
        rec(r.recovered_fixed),
        rec(r.recovered_replan)
    );
    Ok(())
}

#[derive(Args)]
pub struct BenchAdaptProcsArgs {
    /// Requests/s of detect (other runs at twice it, classify at the fan-out
    /// times it).
    #[arg(long, default_value_t = 60.0)]
    unit_rate: f64,
    /// The factor the fan-out jumps by (from 1).
    #[arg(long, default_value_t = 3.0)]
    jump: f64,
    /// When it jumps (s from the start of the load).
    #[arg(long, default_value_t = 3.0)]
    jump_at_s: f64,
    #[arg(long, default_value_t = 12.0)]
    duration_s: f64,
    /// The scheduler's epoch (s), also the report's window.
    #[arg(long, default_value_t = 1.0)]
    epoch_s: f64,
    /// The models' emulated profile l(b) = alpha*b + beta (ms) and SLO (ms).
    #[arg(long, default_value_t = 4.0)]
    alpha_ms: f64,
    #[arg(long, default_value_t = 2.0)]
    beta_ms: f64,
    #[arg(long, default_value_t = 200.0)]
    slo_ms: f64,
    /// Only the run with moves (no baseline with `--max-moves 0`).
    #[arg(long)]
    no_baseline: bool,
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_adapt_procs(a: BenchAdaptProcsArgs) -> Result<()> {
    use fermata::harness::adapt_procs as ap;
    let exe = std::env::current_exe()?;
    let o = ap::Options {
        unit_rps: a.unit_rate,
        jump: a.jump,
        jump_at_s: a.jump_at_s,
        duration_s: a.duration_s,
        epoch_s: a.epoch_s,
        alpha_ms: a.alpha_ms,
        beta_ms: a.beta_ms,
        slo_ms: a.slo_ms,
        moves: true,
    };
    o.check()?;
    let moved = ap::run(&exe, &o)?;
    let fixed = if a.no_baseline {
        None
    } else {
        Some(ap::run(
            &exe,
            &ap::Options {
                moves: false,
                ..o.clone()
            },
        )?)
    };
    if a.json {
        let v = serde_json::json!({ "moves": moved, "no_moves": fixed });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "real processes on loopback: scheduler (--subclusters 2 --epoch-s {}), 2 emulated 1-GPU backends, 1 frontend; detect {} r/s, other {} r/s, classify at the fan-out times detect's rate; l(b) = {} b + {} ms, SLO {} ms; the fan-out jumps 1 -> {} at {} s; bad: requests sent in the window not answered within the SLO",
        o.epoch_s,
        o.unit_rps,
        2.0 * o.unit_rps,
        o.alpha_ms,
        o.beta_ms,
        o.slo_ms,
        o.jump,
        o.jump_at_s
    );
    println!(
        "{:>6} {:>8} {:>7} {:>9} {:>11} {:>14} {:>11}",
        "window", "start s", "fanout", "requests", "bad moves", "bad classify", "bad fixed"
    );
    for (i, w) in moved.windows.iter().enumerate() {
        let f = fixed
            .as_ref()
            .and_then(|f| f.windows.get(i))
            .map_or("-".to_string(), |x| format!("{:.2}%", x.bad * 100.0));
        println!(
            "{:>6} {:>8.1} {:>7} {:>9} {:>10.2}% {:>13.2}% {:>11}",
            i,
            w.start_s,
            w.fanout,
            w.offered,
            w.bad * 100.0,
            w.bad_classify * 100.0,
            f
        );
    }
    let rec = |x: Option<usize>| x.map_or("never".to_string(), |k| format!("{k} window(s)"));
    // Summed over the windows from the second after the jump's to the end.
    let after = |r: &ap::Report| {
        let j = r.windows.iter().position(|w| w.fanout != 1.0)? + 2;
        let ws = r.windows.get(j..).filter(|ws| !ws.is_empty())?;
        let n: u64 = ws.iter().map(|w| w.offered).sum();
        let bad: f64 = ws.iter().map(|w| w.bad * w.offered as f64).sum();
        Some(format!("{:.2}% of {n}", 100.0 * bad / n.max(1) as f64))
    };
    println!(
        "bad from the second window after the jump's to the end: with moves {}, moves off {}",
        after(&moved).unwrap_or("-".into()),
        fixed.as_ref().and_then(after).unwrap_or("-".into())
    );
    println!(
        "moves {}; placement at the end {:?}; failed {}, unanswered {}, duplicates {}",
        moved.moves, moved.placement, moved.failed, moved.unanswered, moved.duplicates
    );
    println!(
        "bad under {}% to the end after the jump's window: with moves {}, moves off {}",
        ap::BAD_LIMIT * 100.0,
        rec(moved.recovered_after),
        fixed
            .as_ref()
            .map_or("-".to_string(), |f| rec(f.recovered_after))
    );
    Ok(())
}

#[derive(Args)]
pub struct BenchAdaptAppsArgs {
    /// The repository holding detector, mlp and detect_classify.
    #[arg(long, default_value = "models/apps")]
    models: std::path::PathBuf,
    /// Application requests/s (Poisson).
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    /// Items per request (patches the detector passes) before and from the jump.
    #[arg(long, default_value_t = 1)]
    items_before: u32,
    #[arg(long, default_value_t = 3)]
    items_after: u32,
    /// When the inputs change (s from the start of the load).
    #[arg(long, default_value_t = 4.0)]
    jump_at_s: f64,
    #[arg(long, default_value_t = 12.0)]
    duration_s: f64,
    /// The frontend's re-planning epoch (s), also the report's window.
    #[arg(long, default_value_t = 1.0)]
    epoch_s: f64,
    /// The application's SLO (ms).
    #[arg(long, default_value_t = 500.0)]
    slo_ms: f64,
    /// Only the run with re-planning (no baseline with the plan fixed).
    #[arg(long)]
    no_baseline: bool,
    /// Frontends serving the application (1-8); the client sends to the
    /// first, the others re-plan on the scheduler's sums of the counters.
    #[arg(long, default_value_t = 1)]
    frontends: u32,
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_adapt_apps(a: BenchAdaptAppsArgs) -> Result<()> {
    use fermata::harness::adapt_apps as aa;
    let exe = std::env::current_exe()?;
    let o = aa::Options {
        models: a.models,
        rate_rps: a.rate,
        items_before: a.items_before,
        items_after: a.items_after,
        jump_at_s: a.jump_at_s,
        duration_s: a.duration_s,
        epoch_s: a.epoch_s,
        slo_ms: a.slo_ms,
        frontends: a.frontends,
        ..aa::Options::default()
    };
    o.check()?;
    let replanned = aa::run(&exe, &o)?;
    let fixed = if a.no_baseline {
        None
    } else {
        Some(aa::run(
            &exe,
            &aa::Options {
                replan: false,
                ..o.clone()
            },
        )?)
    };
    if a.json {
        let v = serde_json::json!({ "replan": replanned, "fixed": fixed });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "real processes on loopback: scheduler (--models), 1 backend (--executor onnx, 1 CPU worker), {} frontend(s) serving {} over HTTP (--replan-every-s {} --replan-confirm {} --replan-min-samples {}), the client to the first; {} r/s, SLO {} ms; items per request {} -> {} at {} s; bad: requests sent in the window not answered 200 within the SLO",
        o.frontends,
        aa::APP,
        o.epoch_s,
        o.confirm,
        o.min_samples,
        o.rate_rps,
        o.slo_ms,
        o.items_before,
        o.items_after,
        o.jump_at_s
    );
    println!(
        "{:>6} {:>8} {:>6} {:>9} {:>12} {:>11}",
        "window", "start s", "items", "requests", "bad replan", "bad fixed"
    );
    for (i, w) in replanned.windows.iter().enumerate() {
        let f = fixed
            .as_ref()
            .and_then(|f| f.windows.get(i))
            .map_or("-".to_string(), |x| format!("{:.2}%", x.bad * 100.0));
        println!(
            "{:>6} {:>8.1} {:>6} {:>9} {:>11.2}% {:>11}",
            i,
            w.start_s,
            w.items,
            w.offered,
            w.bad * 100.0,
            f
        );
    }
    let from = o.jump_at_s + 2.0 * o.epoch_s;
    let after = |r: &aa::Report| {
        let (n, bad) = r.bad_from(from);
        format!("{:.2}% of {n}", bad * 100.0)
    };
    println!(
        "bad from {from} s (two epochs after the jump) on: re-planning {}, plan fixed {}",
        after(&replanned),
        fixed.as_ref().map_or("-".into(), after)
    );
    let show = |r: &aa::Report| {
        format!(
            "re-plans {} ({} before the jump), planned fan-out {:?}, budgets {:?} ms, latency ratio measured {:?} planned {:?}, measured {} items / {} outputs, client {} sent / {} unanswered, frontend success {} + fail {}",
            r.replans,
            r.replans_before_jump,
            r.planned_fanout,
            r.budgets_ms,
            r.latency_ratio,
            r.planned_latency_ratio,
            r.fanout_items,
            r.fanout_outputs,
            r.offered,
            r.unanswered,
            r.server_success,
            r.server_fail
        )
    };
    println!("re-planning: {}", show(&replanned));
    for (i, f) in replanned.idle_frontends.iter().enumerate() {
        println!(
            "frontend {} (no client): {} requests of its own; re-plans {}, planned fan-out {:?}, budgets {:?} ms; last sums over {} frontends, {} requests",
            i + 1,
            f.requests,
            f.replans,
            f.planned_fanout,
            f.budgets_ms,
            f.frontends_summed,
            f.requests_summed
        );
    }
    if let Some(f) = &fixed {
        println!("plan fixed: {}", show(f));
    }
    Ok(())
}
