//! `fermata bench http`: the front door's open-loop sweep. The client
//! and the sweep are in `fermata::harness::http_load`; this is the command line.

use anyhow::{bail, Context, Result};
use clap::Args;
use fermata::harness::http_load::{self, SweepOpts};
use fermata::harness::stall::{StallSpec, Staller};
use fermata::repo::ModelMeta;
use std::path::PathBuf;
use std::time::Duration;

/// The rates swept when --rates is not given (requests/s).
const DEFAULT_RATES: &str = "200,500,1000,2000,4000,8000";
/// The largest rate accepted (requests/s).
const RATE_MAX: f64 = 1e6;
/// The longest measured window and warm-up (s).
const SECS_MAX: f64 = 3600.0;
const REPS_MAX: u32 = 100;

/// `fermata bench http`.
#[derive(Args)]
pub struct BenchHttpArgs {
    /// The model repository; each run starts `fermata serve --executor onnx
    /// --models DIR --http-port 0` on it.
    #[arg(long, default_value = "models")]
    models: PathBuf,
    /// Offered rates, requests/s, comma-separated (one model at a time).
    #[arg(long, default_value = DEFAULT_RATES, allow_hyphen_values = true)]
    rates: String,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10.0, allow_hyphen_values = true)]
    duration_s: f64,
    /// How arrivals are spaced: poisson, constant (equal gaps: at a low rate,
    /// lone requests) or gamma:SHAPE.
    #[arg(long, default_value = "poisson")]
    arrival: String,
    /// Seconds of warm-up per run (sent, not counted).
    #[arg(long, default_value_t = 2.0, allow_hyphen_values = true)]
    warmup_s: f64,
    /// Repetitions of each (model, rate), each on a fresh server.
    #[arg(long, default_value_t = 1)]
    reps: u32,
    /// The server's scheduling policy (`fermata serve --policy`): deferred,
    /// symphony, eager, timeout:FRAC or clockwork[:MS].
    #[arg(long)]
    policy: Option<String>,
    /// One more argument for every `fermata serve` (repeatable, in order), e.g.
    /// `--serve-arg=--http-threads --serve-arg=2`
    #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
    serve_args: Vec<String>,
    /// Drive only this model or application (repeatable; default: every model
    /// and application of --models).
    #[arg(long = "model", value_name = "NAME")]
    model: Vec<String>,
    /// Seed of the arrivals and the request inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Open this many keep-alive connections before each run's first request
    /// and keep them in the client's pool (as wrk2's -c). By default (0) the
    /// client opens connections as answers are outstanding, so a stall of the
    /// server makes it open hundreds at once, which costs both processes CPU;
    /// warm connections tell that apart from the stall itself.
    #[arg(long, default_value_t = 0)]
    warm_conns: usize,
    /// Inject host stalls into every run's measured window: MS@S stalls every
    /// CPU for MS milliseconds every S seconds (one real-time thread per CPU
    /// spins; needs root or CAP_SYS_NICE), as a hypervisor that deschedules
    /// the machine would. Each run then reports the stalls, so the bad requests
    /// per stall can be compared between builds and settings.
    #[arg(long, value_name = "MS@S")]
    stall: Option<String>,
    /// Restrict every server to these CPUs (`taskset -c` syntax, e.g. 0-7), so
    /// that on a many-core host client and server do not share cores.
    #[arg(long, value_name = "LIST")]
    server_cpus: Option<String>,
    /// Restrict this process, the client, to these CPUs (e.g. 8-15).
    #[arg(long, value_name = "LIST")]
    client_cpus: Option<String>,
    /// Print one JSON document (an array of rows) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `--rates`: positive, finite, at most [`RATE_MAX`].
fn parse_rates(s: &str) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    for part in s.split(',') {
        let p = part.trim();
        if p.is_empty() {
            bail!(
                "--rates {s:?}: an empty rate; give requests/s separated by commas, e.g. 200,1000"
            );
        }
        let r: f64 = p
            .parse()
            .map_err(|_| anyhow::anyhow!("--rates: {p:?} is not a number"))?;
        if !(r > 0.0 && r <= RATE_MAX) {
            bail!("--rates: each rate must be positive and at most {RATE_MAX} requests/s, got {p}");
        }
        v.push(r);
    }
    Ok(v)
}

/// An application (a Triton ensemble) as the client sees it: a model with the
/// ensemble's inputs, outputs and SLO, called at `/v2/models/APP/infer`.
fn app_meta(e: &fermata::triton_ensemble::EnsembleConfig) -> ModelMeta {
    ModelMeta {
        name: e.name.clone(),
        inputs: e.inputs.clone(),
        outputs: e.outputs.clone(),
        slo_ms: e.slo_ms,
        max_batch: e.max_batch,
        description: format!(
            "application: {}",
            e.steps
                .iter()
                .map(|s| s.model.as_str())
                .collect::<Vec<_>>()
                .join(" -> ")
        ),
        batch_buckets: None,
    }
}

/// The models and applications to drive: --model's (checked against the
/// repository) or all.
fn models_of(a: &BenchHttpArgs) -> Result<Vec<ModelMeta>> {
    // The profiles too: `serve --executor onnx` refuses a model without one.
    let repo = fermata::repo::load_repository(&a.models, "onnx")?;
    let apps = fermata::triton_ensemble::load_all(&a.models)?;
    let all: Vec<ModelMeta> = repo
        .into_iter()
        .map(|m| m.meta)
        .chain(apps.iter().map(app_meta))
        .collect();
    if a.model.is_empty() {
        return Ok(all);
    }
    let names: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
    let mut out: Vec<ModelMeta> = Vec::new();
    for n in &a.model {
        let Some(m) = all.iter().find(|m| &m.name == n) else {
            bail!(
                "--model {n}: no such model or application in {} (it has {})",
                a.models.display(),
                names.join(", ")
            );
        };
        if !out.iter().any(|o| &o.name == n) {
            out.push(m.clone());
        }
    }
    Ok(out)
}

/// Every flag checked, before any server starts.
fn sweep_opts(a: &BenchHttpArgs) -> Result<SweepOpts> {
    let rates = parse_rates(&a.rates)?;
    if !(a.duration_s > 0.0 && a.duration_s <= SECS_MAX) {
        bail!(
            "--duration-s must be in (0, {SECS_MAX}], got {}",
            a.duration_s
        );
    }
    if !(a.warmup_s >= 0.0 && a.warmup_s <= SECS_MAX) {
        bail!("--warmup-s must be in [0, {SECS_MAX}], got {}", a.warmup_s);
    }
    if !(1..=REPS_MAX).contains(&a.reps) {
        bail!("--reps must be between 1 and {REPS_MAX}, got {}", a.reps);
    }
    if a.warm_conns > http_load::CONNS_MAX {
        bail!(
            "--warm-conns must be at most {} (the client's connection limit), got {}",
            http_load::CONNS_MAX,
            a.warm_conns
        );
    }
    if let Some(p) = &a.policy {
        p.parse::<fermata::core::Policy>()
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("--policy {p}"))?;
    }
    let arrival: fermata::workload::Arrival = a
        .arrival
        .parse()
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("--arrival {}", a.arrival))?;
    Ok(SweepOpts {
        models_dir: a.models.clone(),
        models: models_of(a)?,
        rates,
        arrival,
        warmup: Duration::from_secs_f64(a.warmup_s),
        duration: Duration::from_secs_f64(a.duration_s),
        reps: a.reps,
        policy: a.policy.clone(),
        serve_args: a.serve_args.clone(),
        seed: a.seed,
        warm_conns: a.warm_conns,
        stall: a
            .stall
            .as_deref()
            .map(|s| s.parse::<StallSpec>().map_err(anyhow::Error::msg))
            .transpose()
            .context("--stall")?,
        server_cpus: a
            .server_cpus
            .as_deref()
            .map(cpus_within_allowed)
            .transpose()
            .context("--server-cpus")?,
    })
}

/// A CPU list that this process may use.
fn cpus_within_allowed(s: &str) -> Result<Vec<usize>> {
    let cpus = fermata::runtime::pin::parse_cpu_list(s)?;
    let allowed = fermata::runtime::pin::allowed_cpus();
    if let Some(c) = cpus.iter().find(|c| !allowed.contains(c)) {
        bail!(
            "CPU {c} is not one this process may use (allowed: {})",
            fermata::runtime::pin::format_cpu_list(&allowed)
        );
    }
    Ok(cpus)
}

pub fn cmd_bench_http(a: BenchHttpArgs) -> Result<()> {
    let o = sweep_opts(&a)?;
    if let Some(c) = &a.client_cpus {
        // Before any thread of the client starts: they inherit the mask.
        let cpus = cpus_within_allowed(c).context("--client-cpus")?;
        fermata::runtime::pin::pin_current_thread_to(&cpus).context("--client-cpus")?;
    }
    let exe = std::env::current_exe().context("the path of this binary")?;
    if let Some(spec) = o.stall {
        // Before any server starts: can this process stall the machine at all?
        let now = std::time::Instant::now();
        Staller::start(spec, now, now)?.stop();
    }
    eprintln!(
        "fermata bench http: {} model(s) of {} x {} rate(s) x {} rep(s), {:.1}+{:.1} s each, policy {}, a fresh `fermata serve --executor onnx` per run",
        o.models.len(),
        o.models_dir.display(),
        o.rates.len(),
        o.reps,
        o.warmup.as_secs_f64(),
        o.duration.as_secs_f64(),
        o.policy.as_deref().unwrap_or("(the repository's default)"),
    );
    let rows = http_load::sweep(&exe, &o, |r| {
        eprintln!(
            "  {} at {:.0} r/s (rep {}): ok {}/{} offered ({:.0} good/s), bad {:.3}%, p99 {:.2} ms, refusals {} (p50 {:.2} ms, p99 {:.2} ms), client lag p99 {:.2} ms",
            r.model,
            r.rate_rps,
            r.rep,
            r.counts.ok,
            r.counts.offered,
            r.good_rps,
            r.bad_pct,
            r.latency_p99_ms,
            r.counts.status_429 + r.counts.status_503,
            r.refusal_p50_ms,
            r.refusal_p99_ms,
            r.client_lag_p99_ms
        );
        if let Some(n) = r.stalls {
            eprintln!(
                "    {n} stall(s) injected: {:.1} bad per stall",
                r.bad as f64 / n.max(1) as f64
            );
        }
        if r.bad > 0 {
            eprintln!("{}", http_load::why_bad(r));
        }
    })?;
    let verdicts = http_load::verdicts(&rows);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        for v in &verdicts {
            eprintln!("{v}");
        }
        return Ok(());
    }
    print!("{}", http_load::table(&rows));
    for v in &verdicts {
        println!("{v}");
    }
    Ok(())
}
