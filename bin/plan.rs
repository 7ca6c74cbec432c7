//! `fermata plan partition` and `fermata bench partition`: the epoch partitioner
//! (src/plan/partition.rs) from the command line.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use fermata::bench::partition as bp;
use fermata::bench::plot;
use fermata::plan::partition::{self as pp, Instance, MilpOptions, Solution};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum PlanCmd {
    /// Assigns models to L sub-clusters, balancing request rate and static memory
    /// (Symphony Appendix A's MILP, solved by HiGHS within a time limit).
    Partition(PartitionArgs),
    /// Plans a multi-model application (a DAG of modules under one end-to-end
    /// SLO) at the lowest cost: per module its latency budget, configurations
    /// and machine counts, dispatch and dummy requests.
    App(crate::plan_app::AppArgs),
}

#[derive(Args)]
pub struct PartitionArgs {
    /// Models file (TOML): [[models]] with name, rate_rps, memory_mb,
    /// dynamic_memory_mb; optional rate_max_rps, memory_max_mb, weight.
    #[arg(long, conflicts_with = "workload")]
    models: Option<PathBuf>,
    /// A workload file instead: rates from its shares of rate_rps, memory from
    /// its models' memory_mb / dynamic_memory_mb or the paper's profiles.
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Model repository whose ONNX files give the static memory (weights) of
    /// models the models file lists without memory_mb.
    #[arg(long)]
    repository: Option<PathBuf>,
    /// L, the number of sub-clusters.
    #[arg(long)]
    subclusters: usize,
    /// R_max: requests/s one sub-cluster may take (default: the file's, else none).
    #[arg(long)]
    rate_max_rps: Option<f64>,
    /// S_max: a GPU's memory for models in MB (default: the file's, else none).
    #[arg(long)]
    memory_max_mb: Option<f64>,
    /// w: weight of memory balance against rate balance (default: the file's, else 1).
    #[arg(long)]
    weight: Option<f64>,
    /// Time limit of the solve (s); the best assignment found by then is returned.
    #[arg(long, default_value_t = 10.0)]
    time_limit_s: f64,
    /// The current assignment (the TOML --out writes): re-partition from it.
    #[arg(long)]
    current: Option<PathBuf>,
    /// C_max: at most this many models change sub-cluster (needs --current).
    #[arg(long)]
    max_moves: Option<usize>,
    /// milp, random (the baseline) or both (compared).
    #[arg(long, default_value = "milp")]
    solver: String,
    /// Stop once ΔR + w·ΔS is within this of the solver's lower bound.
    #[arg(long, default_value_t = 1e-3)]
    gap: f64,
    /// HiGHS alone: no greedy + local-search incumbent to start from.
    #[arg(long)]
    no_warm_start: bool,
    /// Seed of the random solver.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the assignment here (TOML, readable by --current).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn time_limit(s: f64) -> Result<Duration> {
    if !(s > 0.0 && s <= 86_400.0) {
        bail!("--time-limit-s must be in (0, 86400], got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

fn read(path: &std::path::Path, what: &str) -> Result<String> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    if meta.len() > 64 << 20 {
        bail!("{what} {} is over 64 MiB", path.display());
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {what} {}", path.display()))
}

/// The instance the arguments describe.
fn instance(a: &PartitionArgs) -> Result<Instance> {
    let (models, rate_max, mem_max, weight) = match (&a.models, &a.workload) {
        (Some(p), None) => {
            let f = pp::parse_models_file(&read(p, "models file")?)
                .with_context(|| format!("in {}", p.display()))?;
            if let Some(dir) = &a.repository {
                if !dir.is_dir() {
                    bail!("--repository {} is not a directory", dir.display());
                }
            }
            // A repository model's static memory: the bytes of its weights (the
            // ONNX initializers every session of it shares on the device).
            let lookup = |name: &str| {
                // A model's file is DIR/NAME.onnx: a name that is a path is not one.
                if name.contains(['/', '\\']) || name.starts_with('.') {
                    return None;
                }
                let file = a.repository.as_ref()?.join(format!("{name}.onnx"));
                let bytes: usize = fermata::node::onnx::proto::shareable_initializers(&file)
                    .ok()?
                    .iter()
                    .map(|i| i.bytes.len())
                    .sum();
                Some((bytes as f64 / 1e6, 0.0))
            };
            let models = pp::resolve_models(&f, lookup)?;
            (models, f.rate_max_rps, f.memory_max_mb, f.weight)
        }
        (None, Some(p)) => {
            let w = fermata::workload::Workload::from_file(p)?;
            (pp::models_of_workload(&w)?, None, None, None)
        }
        _ => bail!("give the models with --models FILE or --workload FILE"),
    };
    let subclusters = a.subclusters;
    let current = match &a.current {
        Some(p) => {
            let f: pp::AssignmentFile = toml::from_str(&read(p, "current assignment")?)
                .with_context(|| format!("the current assignment {}", p.display()))?;
            Some(pp::current_from(&f, &models, subclusters)?)
        }
        None => None,
    };
    Ok(Instance {
        models,
        subclusters,
        rate_max_rps: a.rate_max_rps.or(rate_max).unwrap_or(f64::INFINITY),
        memory_max_mb: a.memory_max_mb.or(mem_max).unwrap_or(f64::INFINITY),
        weight: a.weight.or(weight).unwrap_or(1.0),
        current,
        max_moves: a.max_moves,
    })
}

fn print_solution(inst: &Instance, s: &Solution) {
    let e = &s.eval;
    println!(
        "{} solver: {} ({:.2} s{}), objective ΔR + w·ΔS = {:.4}{}",
        s.solver,
        s.status,
        s.solve_s,
        if s.tries > 0 {
            format!(", {} tries", s.tries)
        } else {
            String::new()
        },
        e.objective,
        s.start_objective
            .map_or(String::new(), |o| format!(" (HiGHS started from {o:.4})"))
    );
    println!(
        "imbalance (max - min) / avg: load {:.2}%, static memory {:.2}%{}",
        e.load_imbalance * 100.0,
        e.memory_imbalance * 100.0,
        if inst.current.is_some() {
            format!(", {} models moved", e.moves)
        } else {
            String::new()
        }
    );
    println!(
        "{:>11} {:>7} {:>12} {:>12} {:>12}",
        "sub-cluster", "models", "rate (r/s)", "static (MB)", "GPU (MB)"
    );
    for j in 0..inst.subclusters {
        let n = s.assignment.iter().filter(|&&x| x == j).count();
        println!(
            "{:>11} {:>7} {:>12.1} {:>12.1} {:>12.1}",
            j, n, e.load_rps[j], e.static_mb[j], e.gpu_mb[j]
        );
    }
}

pub fn cmd_plan(c: PlanCmd) -> Result<()> {
    let a = match c {
        PlanCmd::Partition(a) => a,
        PlanCmd::App(a) => return crate::plan_app::cmd_plan_app(a),
    };
    let tl = time_limit(a.time_limit_s)?;
    if !(a.gap.is_finite() && a.gap >= 0.0) {
        bail!("--gap must be >= 0");
    }
    let inst = instance(&a)?;
    let opts = MilpOptions {
        time_limit: tl,
        abs_gap: a.gap,
        warm_start: !a.no_warm_start,
        ..Default::default()
    };
    let mut sols = Vec::new();
    match a.solver.as_str() {
        "milp" => sols.push(pp::solve_milp(&inst, &opts)?),
        "random" => sols.push(pp::solve_random(&inst, tl, a.seed)?),
        "both" => {
            sols.push(pp::solve_milp(&inst, &opts)?);
            sols.push(pp::solve_random(&inst, tl, a.seed)?);
        }
        s => bail!("--solver must be milp, random or both, got {s:?}"),
    }
    if let Some(out) = &a.out {
        let f = pp::AssignmentFile {
            subclusters: inst.subclusters,
            assignment: inst
                .models
                .iter()
                .zip(&sols[0].assignment)
                .map(|(m, &j)| (m.name.clone(), j))
                .collect(),
        };
        std::fs::write(out, toml::to_string(&f)?)
            .with_context(|| format!("cannot write {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    if a.json {
        let v: Vec<serde_json::Value> = sols
            .iter()
            .map(|s| {
                serde_json::json!({
                    "solver": s.solver,
                    "status": s.status,
                    "solve_s": s.solve_s,
                    "tries": s.tries,
                    "start_objective": s.start_objective,
                    "objective": s.eval.objective,
                    "load_imbalance": s.eval.load_imbalance,
                    "memory_imbalance": s.eval.memory_imbalance,
                    "moves": s.eval.moves,
                    "load_rps": s.eval.load_rps,
                    "static_mb": s.eval.static_mb,
                    "gpu_mb": s.eval.gpu_mb,
                    "assignment": inst.models.iter().zip(&s.assignment)
                        .map(|(m, &j)| (m.name.clone(), j)).collect::<std::collections::BTreeMap<_, _>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    println!(
        "{} models, {} sub-clusters, R_max {} r/s, S_max {} MB, w {}",
        inst.models.len(),
        inst.subclusters,
        inst.rate_max_rps,
        inst.memory_max_mb,
        inst.weight
    );
    for s in &sols {
        println!();
        print_solution(&inst, s);
    }
    Ok(())
}

#[derive(Args)]
pub struct BenchPartitionArgs {
    #[arg(long, default_value_t = 50)]
    instances: usize,
    #[arg(long, default_value_t = 800)]
    models: usize,
    #[arg(long, default_value_t = 20)]
    subclusters: usize,
    /// Each solver's time limit per instance (s).
    #[arg(long, default_value_t = 10.0)]
    time_limit_s: f64,
    /// Mean of the exponential distribution the rates are drawn from (r/s).
    #[arg(long, default_value_t = 100.0)]
    mean_rps: f64,
    /// The profiles' GPU the memory footprints come from: 1080ti or a100.
    #[arg(long, default_value = "1080ti")]
    gpu: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The re-partition step's move bound (models; 0: no re-partition step).
    #[arg(long, default_value_t = 40)]
    max_moves: usize,
    /// Log-normal drift (sigma) of each rate before the re-partition.
    #[arg(long, default_value_t = 0.3)]
    drift: f64,
    /// HiGHS alone: no greedy + local-search incumbent to start from.
    #[arg(long)]
    no_warm_start: bool,
    /// Write the imbalance CDFs (SVG) into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Print JSON instead of a summary.
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_partition(a: BenchPartitionArgs) -> Result<()> {
    if a.models > 100_000 || a.subclusters > 4096 || a.instances > 100_000 {
        bail!("--models <= 100000, --subclusters <= 4096, --instances <= 100000");
    }
    if !(a.mean_rps > 0.0 && a.mean_rps.is_finite()) {
        bail!("--mean-rps must be > 0");
    }
    let o = bp::PartitionBenchOpts {
        instances: a.instances,
        models: a.models,
        subclusters: a.subclusters,
        time_limit: time_limit(a.time_limit_s)?,
        mean_rps: a.mean_rps,
        gpu: a.gpu.clone(),
        seed: a.seed,
        max_moves: a.max_moves,
        drift: a.drift,
        warm_start: !a.no_warm_start,
    };
    let json = a.json;
    let r = bp::run(&o, |row| {
        if !json {
            eprintln!(
                "seed {:>4}: milp load {:.3}% mem {:.3}% (objective {:.5} from {:.5}, {:.1} s, {}) | random load {:.2}% mem {:.2}% ({} tries){}",
                row.seed,
                row.milp_load_imbalance * 100.0,
                row.milp_memory_imbalance * 100.0,
                row.milp_objective,
                row.milp_start_objective.unwrap_or(f64::NAN),
                row.milp_solve_s,
                row.milp_status,
                row.random_load_imbalance * 100.0,
                row.random_memory_imbalance * 100.0,
                row.random_tries,
                match (row.repart_moves, row.repart_load_imbalance, row.free_load_imbalance, row.free_moves) {
                    (Some(m), Some(rl), Some(fl), Some(fm)) => format!(
                        " | re-partition {m} moves load {:.3}% (unbounded: {fm} moves, {:.3}%)",
                        rl * 100.0,
                        fl * 100.0
                    ),
                    _ => String::new(),
                }
            );
        }
    })?;
    if let Some(dir) = &a.plots {
        for (what, file, m, rn) in [
            (
                "load",
                "partition_load_imbalance_cdf.svg",
                r.rows
                    .iter()
                    .map(|x| x.milp_load_imbalance * 100.0)
                    .collect::<Vec<_>>(),
                r.rows
                    .iter()
                    .map(|x| x.random_load_imbalance * 100.0)
                    .collect::<Vec<_>>(),
            ),
            (
                "static memory",
                "partition_memory_imbalance_cdf.svg",
                r.rows
                    .iter()
                    .map(|x| x.milp_memory_imbalance * 100.0)
                    .collect(),
                r.rows
                    .iter()
                    .map(|x| x.random_memory_imbalance * 100.0)
                    .collect(),
            ),
        ] {
            let svg = plot::line_chart_svg(
                &format!(
                    "{} imbalance, {} models x {} sub-clusters, {} instances, {} s each",
                    what, r.models, r.subclusters, r.instances, r.time_limit_s
                ),
                "(max - min) / avg (%)",
                "CDF",
                &[
                    plot::Series {
                        name: "MILP (HiGHS)".into(),
                        points: bp::cdf(&m),
                    },
                    plot::Series {
                        name: "random search".into(),
                        points: bp::cdf(&rn),
                    },
                ],
            );
            crate::write_plot(dir, file, svg)?;
        }
    }
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "{} instances, {} models x {} sub-clusters, {} s per solver",
        r.instances, r.models, r.subclusters, r.time_limit_s
    );
    println!(
        "MILP lower imbalance than random for load and memory: {:.0}% of instances (load {:.0}%, memory {:.0}%)",
        r.milp_wins_fraction * 100.0,
        r.milp_wins_load_fraction * 100.0,
        r.milp_wins_memory_fraction * 100.0
    );
    println!(
        "median imbalance: MILP load {:.3}% memory {:.3}% | random load {:.2}% memory {:.2}%; longest MILP solve {:.2} s",
        r.median_milp_load_imbalance * 100.0,
        r.median_milp_memory_imbalance * 100.0,
        r.median_random_load_imbalance * 100.0,
        r.median_random_memory_imbalance * 100.0,
        r.max_solve_s
    );
    if let (Some(wb), Some(w10)) = (
        r.repart_within_bound_fraction,
        r.repart_within_10pct_fraction,
    ) {
        println!(
            "re-partition after a drift (sigma {}) with at most {} moves: within the bound {:.0}%, imbalance within 10 points of an unbounded solve {:.0}%",
            a.drift,
            r.max_moves,
            wb * 100.0,
            w10 * 100.0
        );
        println!(
            "median load imbalance: left as it was {:.2}%, re-partitioned {:.3}%, unbounded {:.3}% ({} moves)",
            r.median_stay_load_imbalance.unwrap_or(f64::NAN) * 100.0,
            r.median_repart_load_imbalance.unwrap_or(f64::NAN) * 100.0,
            r.median_free_load_imbalance.unwrap_or(f64::NAN) * 100.0,
            r.median_free_moves.unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct AutoscaleArgs {
    /// The scheduler's metrics listener (its --metrics-listen, host:port),
    /// where it serves /v1/autoscale.
    #[arg(long)]
    scheduler: String,
    /// Command that starts one backend (run with `sh -c`); placeholders
    /// {name}, {index}, {count}. E.g. `fermata backend --scheduler H:7300
    /// --gpus 1 --name {name} --cluster-secret-file S`, or `kubectl scale
    /// statefulset fermata-backend --replicas={count}`.
    #[arg(long)]
    launch: String,
    /// Command that drains and stops one backend; placeholders {name}, {node},
    /// {pid}, {index}, {count}. Default: SIGTERM to the backend this loop
    /// launched under that name (a `fermata backend` drains, then leaves).
    #[arg(long)]
    stop: Option<String>,
    /// Prefix of the names given to launched backends ({name} = prefix + index).
    #[arg(long, default_value = "autoscaled-")]
    name_prefix: String,
    /// GPUs each launched backend brings.
    #[arg(long, default_value_t = 1)]
    gpus_per_backend: u32,
    #[arg(long, default_value_t = 1)]
    min_backends: u32,
    #[arg(long, default_value_t = 16)]
    max_backends: u32,
    /// After a launch, the next launch waits this long (s).
    #[arg(long, default_value_t = 30.0)]
    up_cooldown_s: f64,
    /// After any scaling step, a drain waits this long (s).
    #[arg(long, default_value_t = 120.0)]
    down_cooldown_s: f64,
    /// A launched backend counts as starting until it is in service or this
    /// passes (s).
    #[arg(long, default_value_t = 60.0)]
    provisioning_s: f64,
    /// How often the advice is read (s).
    #[arg(long, default_value_t = 1.0)]
    interval_s: f64,
    /// Stop after this many seconds (default: until SIGINT/SIGTERM).
    #[arg(long)]
    duration_s: Option<f64>,
    /// Print the decisions, run nothing.
    #[arg(long)]
    dry_run: bool,
    /// On exit, SIGTERM the backends this loop launched (they drain and
    /// leave); by default they keep running. With it, a launch whose loop is
    /// killed outright is sent SIGTERM by the kernel.
    #[arg(long)]
    stop_launched_on_exit: bool,
}

pub fn cmd_autoscale(a: AutoscaleArgs) -> Result<()> {
    use fermata::node::autoscaler::{Autoscaler, AutoscalerOpts};
    if !(a.interval_s >= 0.05 && a.interval_s <= 3600.0) {
        bail!("--interval-s must be between 0.05 and 3600");
    }
    let mut s = Autoscaler::new(AutoscalerOpts {
        scheduler: a.scheduler.clone(),
        launch: a.launch,
        stop: a.stop,
        name_prefix: a.name_prefix,
        interval: Duration::from_secs_f64(a.interval_s),
        controller: fermata::plan::autoscale::ControllerConfig {
            gpus_per_backend: a.gpus_per_backend,
            min_backends: a.min_backends,
            max_backends: a.max_backends,
            up_cooldown_s: a.up_cooldown_s,
            down_cooldown_s: a.down_cooldown_s,
            provisioning_s: a.provisioning_s,
        },
        dry_run: a.dry_run,
        stop_launched_on_exit: a.stop_launched_on_exit,
    })?;
    crate::roles::catch_signals();
    let t0 = std::time::Instant::now();
    let mut last_err: Option<String> = None;
    while !crate::roles::signalled() && a.duration_s.is_none_or(|d| t0.elapsed().as_secs_f64() < d)
    {
        match s.tick() {
            Ok(log) => {
                last_err = None;
                println!("{}", serde_json::to_string(&log)?);
            }
            Err(e) => {
                // Said once per kind of failure, not every interval.
                let msg = format!("{e:#}");
                if last_err.as_deref() != Some(msg.as_str()) {
                    eprintln!("fermata autoscale: {msg} (holding)");
                    last_err = Some(msg);
                }
            }
        }
        std::thread::sleep(s.interval());
    }
    let launched = s.launched();
    if a.stop_launched_on_exit {
        s.stop_launched(Duration::from_secs(35));
    } else if !launched.is_empty() {
        eprintln!(
            "fermata autoscale: leaving {} backend(s) it launched running: {}",
            launched.len(),
            launched
                .iter()
                .map(|(n, p)| format!("{n} (pid {p})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct BenchAutoscaleArgs {
    /// Backends (one emulated GPU each) at the start: the loop's lower bound.
    #[arg(long, default_value_t = 2)]
    start: u32,
    /// The loop's upper bound.
    #[arg(long, default_value_t = 8)]
    max: u32,
    /// The load after the jump, as a multiple of the start's capacity.
    #[arg(long, default_value_t = 1.5)]
    factor: f64,
    /// Seconds of load after the jump.
    #[arg(long, default_value_t = 30.0)]
    secs: f64,
    /// Length of one measured segment (s).
    #[arg(long, default_value_t = 2.0)]
    segment_s: f64,
    /// The scheduler's advice on the load's demand at this utilization (0:
    /// the paper's rule).
    #[arg(long, default_value_t = 0.0)]
    target_utilization: f64,
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_autoscale(a: BenchAutoscaleArgs) -> Result<()> {
    use fermata::bench::autoscale::{run, AutoscaleBenchOpts};
    if a.start == 0 || a.max < a.start || a.max > 64 {
        bail!("need 1 <= --start <= --max <= 64");
    }
    let ok = a.factor > 0.0
        && a.factor <= 10.0
        && (1.0..=3600.0).contains(&a.secs)
        && a.segment_s >= 0.5
        && a.segment_s <= a.secs
        && (0.0..=1.0).contains(&a.target_utilization);
    if !ok {
        bail!("--factor in (0, 10], --secs in [1, 3600], --segment-s in [0.5, --secs], --target-utilization in [0, 1]");
    }
    let o = AutoscaleBenchOpts {
        start: a.start,
        max: a.max,
        factor: a.factor,
        secs: a.secs,
        segment_s: a.segment_s,
        target_utilization: a.target_utilization,
    };
    let r = crate::with_scratch("bench-autoscale", |exe, dir| run(exe, dir, &o))?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "capacity of {} GPUs (simulator goodput): {:.0} r/s; offered {:.0} r/s ({}x) from t = 0",
        a.start, r.capacity_rps, r.offered_rps, a.factor
    );
    println!(
        "{:>7} {:>8} {:>8} {:>10} {:>9}",
        "t (s)", "offered", "bad %", "unanswered", "backends"
    );
    for s in &r.segments {
        println!(
            "{:>7.1} {:>8} {:>8.2} {:>10} {:>9}",
            s.t_s,
            s.offered,
            s.bad_rate * 100.0,
            s.unanswered,
            s.backends
        );
    }
    for (t, d) in &r.decisions {
        println!("  t = {t:>5.1} s: {d}");
    }
    match r.recovered_after_s {
        Some(t) => println!("bad rate under 1% for good {t:.1} s after the jump"),
        None => println!("the bad rate did not stay under 1%"),
    }
    println!(
        "final: {} backends, simulator goodput {:.0} r/s for {:.0} r/s offered",
        r.final_backends, r.final_capacity_rps, r.offered_rps
    );
    Ok(())
}

#[derive(Args)]
pub struct BenchFig15Args {
    /// The most GPUs the loop may use (the paper: 512).
    #[arg(long, default_value_t = 64)]
    max_gpus: u32,
    /// GPUs at the start.
    #[arg(long, default_value_t = 1)]
    start_gpus: u32,
    /// The trace's peak, as a fraction of the simulated capacity of --max-gpus.
    #[arg(long, default_value_t = 0.8)]
    peak_load: f64,
    /// Rate trace (CSV `t_s,multiplier`); default: the generated one
    /// (configs/traces/fig15.csv is that trace, 600 s).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write the generated trace here and exit.
    #[arg(long)]
    write_trace: Option<PathBuf>,
    /// Length of the generated trace (s).
    #[arg(long, default_value_t = 600.0)]
    trace_s: f64,
    /// The loop's epoch (s): signals window and decision interval.
    #[arg(long, default_value_t = 10.0)]
    epoch_s: f64,
    /// How often the loop decides (s; at most --epoch-s, which it must
    /// divide): `fermata autoscale`'s --interval-s.
    #[arg(long, default_value_t = 1.0)]
    interval_s: f64,
    /// Seconds before an added GPU is in service.
    #[arg(long, default_value_t = 5.0)]
    provisioning_s: f64,
    /// After a scaling step, the next release waits this long (s).
    #[arg(long, default_value_t = 5.0)]
    down_cooldown_s: f64,
    /// The advice's bad-rate threshold (add GPUs above it).
    #[arg(long, default_value_t = 0.01)]
    bad_threshold: f64,
    /// The advice's idle threshold (release GPUs above it).
    #[arg(long, default_value_t = 0.15)]
    idle_threshold: f64,
    /// Keep this share of the GPUs' time spare (0: the paper's reactive rule;
    /// see `fermata scheduler --autoscale-headroom`).
    #[arg(long, default_value_t = 0.0)]
    headroom: f64,
    /// Size the GPUs on the load's demand at this utilization (0: off; see
    /// `fermata scheduler --autoscale-target-utilization`).
    #[arg(long, default_value_t = 0.0)]
    target_utilization: f64,
    /// With --target-utilization: size for the demand this far past the
    /// middle of the window it is measured over (half an epoch; s); default:
    /// the time until GPUs the next decision adds are in service, --epoch-s / 4
    /// + --interval-s + --provisioning-s.
    #[arg(long)]
    lookahead_s: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the plots (SVG) into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn cmd_bench_fig15(a: BenchFig15Args) -> Result<()> {
    use fermata::bench::fig15;
    if a.max_gpus == 0 || a.max_gpus > 4096 {
        bail!("--max-gpus must be between 1 and 4096");
    }
    let ok = a.peak_load > 0.0
        && a.peak_load <= 10.0
        && a.epoch_s >= 1.0
        && a.epoch_s <= 3600.0
        && a.provisioning_s >= 0.0
        && a.provisioning_s <= 3600.0
        && a.trace_s >= a.epoch_s
        && a.trace_s <= 86_400.0
        && (0.0..=1.0).contains(&a.bad_threshold)
        && (0.0..=1.0).contains(&a.idle_threshold)
        && (0.0..0.9).contains(&a.headroom)
        && (0.0..=1.0).contains(&a.target_utilization);
    let ratio = a.epoch_s / a.interval_s;
    if !(a.interval_s >= 0.1 && ratio >= 1.0 - 1e-9 && (ratio - ratio.round()).abs() < 1e-6) {
        bail!("--interval-s must be at least 0.1 and divide --epoch-s");
    }
    if !ok {
        bail!("--peak-load in (0, 10], --epoch-s in [1, 3600], --provisioning-s in [0, 3600], --trace-s in [--epoch-s, 86400], thresholds in [0, 1], --headroom in [0, 0.9), --target-utilization in [0, 1]");
    }
    let trace = match &a.trace {
        Some(p) => {
            fig15::parse_trace(&read(p, "trace")?).with_context(|| format!("{}", p.display()))?
        }
        None => fig15::generate_trace(a.trace_s, 10.0, 0.1, 0.05, a.seed),
    };
    if let Some(p) = &a.write_trace {
        std::fs::write(p, fig15::trace_csv(&trace))
            .with_context(|| format!("cannot write {}", p.display()))?;
        eprintln!("wrote {}", p.display());
        return Ok(());
    }
    let r = fig15::run(&fig15::Fig15Opts {
        max_gpus: a.max_gpus,
        start_gpus: a.start_gpus,
        peak_load: a.peak_load,
        trace,
        epoch_s: a.epoch_s,
        interval_s: a.interval_s,
        provisioning_s: a.provisioning_s,
        down_cooldown_s: a.down_cooldown_s.clamp(0.0, 86_400.0),
        seed: a.seed,
        advice: fermata::plan::autoscale::AdviceConfig {
            bad_threshold: a.bad_threshold,
            idle_threshold: a.idle_threshold,
            headroom: a.headroom,
            target_utilization: a.target_utilization,
            lookahead_s: a
                .lookahead_s
                .unwrap_or(a.epoch_s / 4.0 + a.interval_s + a.provisioning_s)
                .clamp(0.0, 3600.0),
            ..Default::default()
        },
    })?;
    if let Some(dir) = &a.plots {
        let pts = |f: &dyn Fn(&fig15::Fig15Row) -> f64| -> Vec<(f64, f64)> {
            r.rows.iter().map(|x| (x.epoch.t_s, f(x))).collect()
        };
        let svg = plot::line_chart_svg(
            &format!(
                "autoscaling in the simulator: 24 models, up to {} GPUs",
                r.max_gpus
            ),
            "time (s)",
            "GPUs",
            &[
                plot::Series {
                    name: "GPUs in use".into(),
                    points: pts(&|x| x.epoch.gpus_mean),
                },
                plot::Series {
                    name: "fewest needed".into(),
                    points: pts(&|x| x.min_gpus as f64),
                },
                plot::Series {
                    name: "offered load (GPUs' worth)".into(),
                    points: pts(&|x| x.epoch.offered_rps / r.per_gpu_rps),
                },
            ],
        );
        crate::write_plot(dir, "fig15_gpus.svg", svg)?;
        let svg = plot::line_chart_svg(
            "bad rate per epoch",
            "time (s)",
            "bad rate (%)",
            &[plot::Series {
                name: "bad rate".into(),
                points: pts(&|x| x.bad_rate * 100.0),
            }],
        );
        crate::write_plot(dir, "fig15_bad_rate.svg", svg)?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "one GPU serves {:.0} r/s of the mix (at {} GPUs); peak {:.0} r/s; up to {} GPUs",
        r.per_gpu_rps, r.max_gpus, r.peak_rps, r.max_gpus
    );
    println!(
        "{:>7} {:>10} {:>6} {:>6} {:>8} {:>7}  decision (GPUs after it)",
        "t (s)", "offered", "GPUs", "min", "bad %", "idle %"
    );
    for x in &r.rows {
        println!(
            "{:>7.0} {:>10.0} {:>6.1} {:>6} {:>8.2} {:>7.1}  {} ({})",
            x.epoch.t_s,
            x.epoch.offered_rps,
            x.epoch.gpus_mean,
            x.min_gpus,
            x.bad_rate * 100.0,
            x.epoch.idle_fraction * 100.0,
            x.epoch.decision,
            x.epoch.gpus
        );
    }
    println!(
        "after the first minute: epochs under the cluster's capacity with bad rate < 1%: {} of {}; GPUs in use (time-averaged) within 15% of the fewest needed: {} of {} (the most at any moment: {}); GPU-seconds {:.0} (fewest needed {:.0})",
        r.under_capacity_good_epochs, r.under_capacity_epochs, r.within_15pct_epochs, r.counted_epochs, r.within_15pct_max_epochs, r.gpu_seconds, r.min_gpu_seconds
    );
    Ok(())
}
