//! `fermata bench serve`: the goodput of a model repository served by a real
//! executor (or of a workload on emulated GPUs), next to the simulator's.

use crate::roles::{cuda_devices_of, repository_workload, set_input_bytes, workload_of};
use anyhow::{bail, Context, Result};
use clap::Args;
use fermata::core::Dur;
use fermata::harness::loadgen::LoadgenOpts;
use fermata::node::serve::{self, ClusterOpts};
use fermata::transport::{self, auth::ClusterKey};
use fermata::workload::{Arrival, Workload};
use std::path::PathBuf;
use std::time::Duration;

/// `fermata bench serve`: the goodput of a model repository served by a real
/// executor, next to the simulator's goodput for the same measured profiles.
#[derive(Args)]
pub struct ServeGoodputArgs {
    /// The model repository (every model in it is served, with its profile for
    /// --executor).
    #[arg(long, default_value = "models")]
    models: PathBuf,
    /// onnx (CPU) or cuda (feature `cuda`).
    #[arg(long, default_value = "onnx")]
    executor: String,
    /// GPUs (backend workers).
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// With --executor cuda: the CUDA device of each GPU, e.g. 0,2.
    #[arg(long)]
    cuda_devices: Option<String>,
    /// Batches each GPU runs at once (as `serve --lanes`). Every model's
    /// profile must have been measured with as many lanes (`fermata profile
    /// --lanes E`, d(b, E)); the simulator then has E GPUs of d(b, E) per GPU.
    #[arg(long, default_value_t = 1)]
    lanes: u32,
    /// Measured seconds per probe.
    #[arg(long, default_value_t = 5.0)]
    duration_s: f64,
    /// Warm-up seconds per probe (a fresh cluster each probe).
    #[arg(long, default_value_t = 2.0)]
    warmup_s: f64,
    /// Relative tolerance of the binary searches.
    #[arg(long, default_value_t = 0.03)]
    tolerance: f64,
    /// constant, poisson or gamma:SHAPE (default: poisson).
    #[arg(long)]
    arrival: Option<String>,
    /// Serve a workload file's models on emulated GPUs instead of a model
    /// repository (`default`: the embedded ResNet50 workload); sets
    /// --executor emulated and --gpus to the workload's.
    #[arg(long, value_name = "FILE")]
    workload: Option<PathBuf>,
    /// inproc (default) or tcp (loopback sockets, still one process).
    #[arg(long, default_value = "inproc")]
    transport: String,
    /// Search the goodput twice, in the same run: with the models' own input
    /// size, then with every input B bytes; prints both and their ratio, the
    /// pull budget's accuracy at 0.8 x the second goodput, and the machine's
    /// memory-copy bandwidth with the rate it bounds (two copies per input).
    #[arg(long, value_name = "B")]
    input_bytes: Option<u32>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The CPU one probe used over its measured window.
#[derive(Clone)]
struct CpuUse {
    rate: f64,
    /// CPU seconds over the window (None: the load ended before it did).
    cpu_s: Option<f64>,
    window_s: f64,
}

impl CpuUse {
    /// CPU per request offered in the window, us.
    fn us_per_request(&self) -> f64 {
        self.cpu_s
            .map_or(f64::NAN, |c| 1e6 * c / (self.rate * self.window_s).max(1.0))
    }
    fn cores_used(&self) -> f64 {
        self.cpu_s.map_or(f64::NAN, |c| c / self.window_s.max(1e-9))
    }
}

/// The probe at `rate` (the last one at it, as the search ended there).
fn at_rate(v: &[CpuUse], rate: f64) -> Option<CpuUse> {
    v.iter().rev().find(|c| c.rate == rate).cloned()
}

/// What bounds large inputs on this machine's cores.
struct CpuFigures {
    /// The large inputs' probe at their goodput.
    at_goodput: Option<CpuUse>,
    /// The models' own inputs' probe at their goodput.
    default_at_goodput: Option<CpuUse>,
    /// Large and default inputs at the same rate.
    large: CpuUse,
    default: CpuUse,
}

impl CpuFigures {
    /// The rate at which large inputs would keep every core busy, at the CPU
    /// a request cost at their goodput (NaN without that probe's figure).
    fn bound_rps(&self, cores: usize) -> f64 {
        self.at_goodput
            .as_ref()
            .map_or(f64::NAN, |c| cores as f64 * 1e6 / c.us_per_request())
    }
}

/// The median over the backends of one figure of their reports (0 with none).
fn backend_median(
    bs: &[fermata::node::backend::BackendReport],
    f: fn(&fermata::node::backend::BackendReport) -> f64,
) -> f64 {
    let mut v: Vec<f64> = bs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The batch-size distribution of a run as (batch size, percent of requests),
/// for sizes with at least 0.5% of the requests.
fn batch_distribution(r: &fermata::sim::RunResult) -> Vec<(String, f64)> {
    fermata::bench::batch_bins(r)
        .into_iter()
        .filter(|(_, f)| *f >= 0.005)
        .map(|(b, f)| (b, 100.0 * f))
        .collect()
}

pub fn cmd_bench_serve(a: ServeGoodputArgs) -> Result<()> {
    use fermata::bench::{goodput_search, goodput_search_with, SearchOptions};
    use fermata::sim::RunOptions;
    let devices = cuda_devices_of(&a.cuda_devices)?;
    if let Some(d) = &devices {
        if d.len() != a.gpus as usize {
            bail!(
                "--cuda-devices lists {} devices but --gpus is {}",
                d.len(),
                a.gpus
            );
        }
    }
    if !(a.tolerance > 0.0 && a.tolerance < 0.5) {
        bail!("--tolerance must be in (0, 0.5)");
    }
    if !(a.duration_s > 0.0 && a.duration_s <= 3600.0 && (0.0..=3600.0).contains(&a.warmup_s)) {
        bail!("--duration-s must be in (0, 3600] and --warmup-s in [0, 3600]");
    }
    if a.transport != "inproc" && a.transport != "tcp" {
        bail!("--transport must be inproc or tcp, got {}", a.transport);
    }
    let executor = if a.workload.is_some() {
        "emulated".to_string()
    } else {
        a.executor.clone()
    };
    // The executor first: no ONNX Runtime or no GPU is the error to report.
    let _ = fermata::node::exec::executor_factory_on(&executor, &a.models, devices.clone())
        .with_context(|| format!("--executor {executor}"))?;
    let w = match &a.workload {
        Some(p) if p.as_os_str() == "default" => workload_of(&None)?,
        Some(p) => workload_of(&Some(p.clone()))?,
        None => repository_workload(&a.models, &a.executor, a.gpus, None, a.lanes)?,
    };
    fermata::node::backend::lanes::LaneMap::new(w.gpus, a.lanes).map_err(anyhow::Error::msg)?;
    if a.lanes > 1 && a.workload.is_some() {
        bail!("--lanes needs a model repository whose profiles were measured with as many lanes");
    }
    // What the simulator plans: each lane a GPU of d(b, E).
    let mut w_sim = w.clone();
    w_sim.gpus = w.gpus * a.lanes;
    let mut w_big = w.clone();
    set_input_bytes(&mut w_big, a.input_bytes)?;
    let key = (a.transport == "tcp").then(ClusterKey::generate);
    let mut o = RunOptions::from_workload(&w);
    o.duration = Dur::from_secs_f64(a.duration_s);
    o.warmup = Dur::from_secs_f64(a.warmup_s);
    if let Some(s) = &a.arrival {
        o.arrival = s
            .parse::<Arrival>()
            .map_err(anyhow::Error::msg)
            .context("--arrival")?;
    }
    let so = SearchOptions {
        rel_tolerance: a.tolerance,
        ..SearchOptions::default()
    };
    let sim = goodput_search(&w_sim, &o, &so);
    if !a.json {
        eprintln!(
            "simulator goodput for the measured profiles: {:.1} r/s ({} GPUs of d(b, {})); searching the live cluster ({} executor)",
            sim.goodput_rps, w_sim.gpus, a.lanes, executor
        );
    }
    let co = ClusterOpts {
        executor: executor.clone(),
        models_dir: a.models.clone(),
        cuda_devices: devices,
        lanes: a.lanes,
        host: if a.transport == "tcp" {
            "127.0.0.1".into()
        } else {
            "fermata".into()
        },
        ..ClusterOpts::default()
    };
    let json = a.json;
    let probe = |w: &Workload, o: &RunOptions| -> Result<serve::ServeRun> {
        let mut lo = LoadgenOpts::new(Vec::new(), w);
        lo.rate_rps = o.rate_rps;
        lo.arrival = o.arrival;
        lo.seed = o.seed;
        lo.warmup = o.warmup;
        lo.duration = o.duration;
        lo.verify = false;
        let tr = transport::by_name_keyed(&a.transport, key.clone())
            .with_context(|| format!("--transport {}", a.transport))?;
        let r = serve::serve(tr, w, &co, &lo)?;
        let l = &r.load;
        if !json {
            let s = &r.cluster.scheduler;
            let (over, pulls) = r.cluster.backends.iter().fold((0.0, 0u64), |(o, n), b| {
                (
                    o + b.pull_overrun_share * b.pulls_predicted as f64,
                    n + b.pulls_predicted,
                )
            });
            eprintln!(
                "  probe {:>9.1} r/s: worst model bad {:.3}%, failed {}, latency p50 {:.2} ms p99 {:.2} ms, d_ctrl {:.0} us, d_data {:.0} us per batch + {:.1} us per input, pulls over budget {:.2}%, batch run / profile p50 {:.3} p99 {:.3}, start delay p50 {:.0} us p99 {:.0} us, CPU {:.2} cores",
                o.rate_rps,
                100.0 * l.sim.max_model_bad_rate(),
                l.failed,
                l.latency_us.value_at_quantile(0.5) as f64 / 1e3,
                l.latency_us.value_at_quantile(0.99) as f64 / 1e3,
                s.d_ctrl_us,
                s.d_data_fixed_us,
                s.d_data_us,
                100.0 * over / pulls.max(1) as f64,
                backend_median(&r.cluster.backends, |b| b.run_over_profile_p50),
                backend_median(&r.cluster.backends, |b| b.run_over_profile_p99),
                backend_median(&r.cluster.backends, |b| b.start_delay_p50_us),
                backend_median(&r.cluster.backends, |b| b.start_delay_p99_us),
                r.window_cpu_s.map_or(f64::NAN, |c| c / a.duration_s),
            );
        }
        if l.duplicates > 0 || l.wrong_outputs > 0 {
            bail!(
                "accounting error at {:.0} r/s: {} duplicate answers, {} wrong outputs",
                o.rate_rps,
                l.duplicates,
                l.wrong_outputs
            );
        }
        Ok(r)
    };
    // Each probe's CPU use over its measured window.
    let cpu_of = |r: &serve::ServeRun, rate: f64| CpuUse {
        rate,
        cpu_s: r.window_cpu_s,
        window_s: a.duration_s,
    };
    // A goodput search planned for `planned` whose probes serve `served`,
    // with the CPU of its probe at the goodput.
    let search = |planned: &Workload, served: &Workload| {
        let mut cpus = Vec::new();
        let g = goodput_search_with(planned, &o, &so, |o| {
            let r = probe(served, o)?;
            cpus.push(cpu_of(&r, o.rate_rps));
            Ok(r.load.sim)
        })?;
        let at = at_rate(&cpus, g.goodput_rps);
        anyhow::Ok((g, at))
    };
    let (live, cpu_live) = search(&w_sim, &w)?;
    // The same workload with large inputs, in the same run.
    let big = match a.input_bytes {
        None => None,
        Some(b) => {
            if !json {
                eprintln!(
                    "searching again with {b}-byte inputs (default goodput {:.1} r/s)",
                    live.goodput_rps
                );
            }
            // What the machine copies now, before and after the search (the
            // large inputs' goodput is bounded by it; see bench::copy).
            let bw0 = fermata::bench::copy::copy_bandwidth(b as usize, Duration::from_millis(500));
            let (g, cpu_big) = search(&w_big, &w_big)?;
            let bw1 = fermata::bench::copy::copy_bandwidth(b as usize, Duration::from_millis(500));
            // The pull budget's accuracy at 0.8 x that goodput.
            let mut o8 = o.clone();
            o8.rate_rps = 0.8 * g.goodput_rps;
            let r = probe(&w_big, &o8)?;
            // The CPU a request costs, large inputs against the models' own
            // at the same rate (0.8 x the large inputs' goodput).
            let cpu_small = probe(&w, &o8).map(|s| cpu_of(&s, o8.rate_rps))?;
            let cpu = CpuFigures {
                at_goodput: cpu_big,
                default_at_goodput: cpu_live,
                large: cpu_of(&r, o8.rate_rps),
                default: cpu_small,
            };
            let bs = &r.cluster.backends;
            let pulls: u64 = bs.iter().map(|b| b.pulls_predicted).sum();
            let over: f64 = bs
                .iter()
                .map(|b| b.pull_overrun_share * b.pulls_predicted as f64)
                .sum::<f64>()
                / pulls.max(1) as f64;
            let budget = backend_median(bs, |b| b.pull_predicted_p50_us);
            let actual = backend_median(bs, |b| b.pull_batch_p50_us);
            Some((
                b,
                g,
                o8.rate_rps,
                over,
                budget,
                actual,
                r.load.sim.max_model_bad_rate(),
                0.5 * (bw0 + bw1),
                cpu,
            ))
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ratio = live.goodput_rps / sim.goodput_rps;
    let dist = |g: &fermata::bench::GoodputResult| {
        g.at_goodput
            .as_ref()
            .map(batch_distribution)
            .unwrap_or_default()
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "models": a.models,
                "workload": w.name,
                "executor": executor,
                "transport": a.transport,
                "gpus": w.gpus,
                "lanes": a.lanes,
                "sim_goodput_rps": sim.goodput_rps,
                "input_bytes": big.as_ref().map(|b| b.0),
                "input_bytes_goodput_rps": big.as_ref().map(|b| b.1.goodput_rps),
                "input_bytes_over_default": big.as_ref().map(|b| b.1.goodput_rps / live.goodput_rps),
                "accuracy_rate_rps": big.as_ref().map(|b| b.2),
                "pulls_over_budget": big.as_ref().map(|b| b.3),
                "pull_budget_p50_us": big.as_ref().map(|b| b.4),
                "pull_p50_us": big.as_ref().map(|b| b.5),
                "accuracy_bad_rate": big.as_ref().map(|b| b.6),
                "copy_bytes_per_s": big.as_ref().map(|b| b.7),
                "copy_bound_rps": big.as_ref().map(|b| b.7 / (2.0 * b.0 as f64)),
                "cpu_cores": cores,
                "cpu_us_per_request_default": big.as_ref().map(|b| b.8.default.us_per_request()),
                "cpu_us_per_request_large": big.as_ref().map(|b| b.8.large.us_per_request()),
                "cpu_bound_rps": big.as_ref().map(|b| b.8.bound_rps(cores)),
                "cpu_cores_used_at_goodput": big.as_ref().map(|b| b.8.at_goodput.as_ref().map(CpuUse::cores_used)),
                "cpu_cores_used_at_default_goodput": big.as_ref().map(|b| b.8.default_at_goodput.as_ref().map(CpuUse::cores_used)),
                "live_goodput_rps": live.goodput_rps,
                "ratio": ratio,
                "sim_batch_distribution_pct": dist(&sim),
                "live_batch_distribution_pct": dist(&live),
            }))?
        );
        return Ok(());
    }
    let fmt = |v: Vec<(String, f64)>| {
        v.iter()
            .map(|(b, p)| format!("{b}:{p:.1}%"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "goodput ({} GPUs x {} lanes, {} executor, {}, {}): live {:.1} r/s, simulator {:.1} r/s, live/simulator {:.3}",
        w.gpus, a.lanes, executor, w.name, a.transport, live.goodput_rps, sim.goodput_rps, ratio
    );
    if let Some((b, g, rate, over, budget, actual, bad, bw, cpu)) = &big {
        println!(
            "goodput with {b}-byte inputs: {:.1} r/s, {:.3} of the default inputs' {:.1} r/s",
            g.goodput_rps,
            g.goodput_rps / live.goodput_rps,
            live.goodput_rps
        );
        let bound = bw / (2.0 * *b as f64);
        println!(
            "memory copies now: {:.2} GB/s (one thread, {b}-byte inputs, pools past the caches; mean of before and after the search); two copies per input on the server's path bound the rate at {bound:.1} r/s: the goodput is {:.3} of that bound",
            bw / 1e9,
            g.goodput_rps / bound
        );
        println!(
            "pull budget at {rate:.1} r/s (0.8 x): {:.2}% of batches overran it; median budget {budget:.0} us / median pull {actual:.0} us = {:.2}; bad {:.3}%",
            100.0 * over,
            budget / actual.max(1e-9),
            100.0 * bad
        );
        let used = |c: &Option<CpuUse>| c.as_ref().map_or(f64::NAN, CpuUse::cores_used);
        let bound = cpu.bound_rps(cores);
        println!(
            "CPU of this process (the cluster and the load generator, {cores} cores): at {rate:.1} r/s {:.0} us a request with {b}-byte inputs against {:.0} us with the models' own ({:.2} x); at the goodput {b}-byte inputs kept {:.2} cores busy ({:.0} us a request), so all {cores} busy at that cost is {bound:.1} r/s and the goodput is {:.3} of it (the models' own inputs at their goodput: {:.2} cores busy)",
            cpu.large.us_per_request(),
            cpu.default.us_per_request(),
            cpu.large.us_per_request() / cpu.default.us_per_request(),
            used(&cpu.at_goodput),
            cpu.at_goodput.as_ref().map_or(f64::NAN, CpuUse::us_per_request),
            g.goodput_rps / bound,
            used(&cpu.default_at_goodput),
        );
    }
    println!(
        "batch sizes at goodput, share of requests (live):      {}",
        fmt(dist(&live))
    );
    println!(
        "batch sizes at goodput, share of requests (simulator): {}",
        fmt(dist(&sim))
    );
    if let Some(r) = &live.at_goodput {
        print!("{}", fermata::bench::sim_table(r));
    }
    Ok(())
}
