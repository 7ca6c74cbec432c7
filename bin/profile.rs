//! `fermata profile`: measures a model's l(b) on an executor, fits alpha/beta and
//! writes the profile file the scheduler loads (see `fermata::profiler`).

use anyhow::{bail, Context, Result};
use clap::Args;
use fermata::node::exec::executor_factory;
use fermata::profiler::{self, ProfileOpts};
use fermata::repo;
use fermata::wire::{ModelInfo, WireProfile};
use std::path::PathBuf;

#[derive(Args)]
pub struct ProfileArgs {
    /// The model's ONNX file; its metadata (`STEM.json`) must sit next to it.
    #[arg(long)]
    model: PathBuf,
    /// onnx (ONNX Runtime, CPU) or cuda (ONNX Runtime, CUDA; `--features cuda`).
    #[arg(long, default_value = "onnx")]
    executor: String,
    /// Batch sizes: `A..B` (every size), `A..B:pow2` (powers of two, then B) or a
    /// list `1,8,32`. Default: powers of two up to the model's max_batch.
    #[arg(long)]
    batch_sizes: Option<String>,
    /// Timed runs per batch size.
    #[arg(long, default_value_t = 30)]
    repeats: u32,
    /// Untimed runs per batch size first.
    #[arg(long, default_value_t = 5)]
    warmup: u32,
    /// Which GPU (the executor's device index).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Where to write the profile. Default: next to the model,
    /// STEM.profile-cpu.json (onnx) or STEM.profile-cuda.json (cuda).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Measure and print, but write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the profile as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: ProfileArgs) -> Result<()> {
    if a.executor == "emulated" {
        bail!(
            "the emulated executor only replays a profile it is given; measure a real \
             executor: --executor onnx (CPU) or --executor cuda"
        );
    }
    let meta = repo::load_meta(&a.model)?;
    let dir = a
        .model
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| PathBuf::from("."));
    let batch_sizes = match &a.batch_sizes {
        Some(s) => profiler::parse_batch_sizes(s)?,
        None => profiler::parse_batch_sizes(&format!("1..{}:pow2", meta.max_batch.max(2)))?,
    };
    if let Some(&b) = batch_sizes.iter().find(|&&b| b > meta.max_batch) {
        bail!(
            "batch size {b} exceeds the model's max_batch {} (in {})",
            meta.max_batch,
            a.model.with_extension("json").display()
        );
    }
    let factory = executor_factory(&a.executor, &dir)?;
    let mut exec =
        factory(a.gpu).with_context(|| format!("starting the {} executor", a.executor))?;
    // The executor plans nothing with this profile; it is a placeholder until the
    // measured one exists.
    let info = ModelInfo {
        id: 0,
        name: meta.name.clone(),
        slo_ns: (meta.slo_ms * 1e6) as i64,
        profile: WireProfile::Linear {
            alpha_ns: 0,
            beta_ns: 1,
            max_batch: meta.max_batch,
        },
        input_bytes: meta.input_bytes() as u32,
        meta_json: serde_json::to_string(&meta)?,
    };
    exec.load(&info)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let opts = ProfileOpts {
        batch_sizes,
        repeats: a.repeats,
        warmup: a.warmup,
    };
    eprintln!(
        "profiling {} on {} (batch sizes {:?}, {} warm-up + {} timed runs each)",
        meta.name, a.executor, opts.batch_sizes, opts.warmup, opts.repeats
    );
    let pts = profiler::measure(exec.as_mut(), &info, &meta, &opts)?;
    let device = match a.executor.as_str() {
        "onnx" => format!(
            "{}, ONNX Runtime CPU provider, {} intra-op thread(s) ({})",
            profiler::cpu_name(),
            fermata::node::onnx::threads_from_env()?,
            fermata::node::onnx::THREADS_ENV
        ),
        other => format!("{other} device {}", a.gpu),
    };
    let prof = profiler::to_profile(&meta, &a.executor, &device, &pts, a.repeats)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&prof)?);
    } else {
        println!(
            "{:>6} {:>11} {:>11} {:>11} {:>9}",
            "batch", "median ms", "p99 ms", "fit ms", "resid %"
        );
        for p in &pts {
            let f = prof.fit.alpha_ms * p.batch as f64 + prof.fit.beta_ms;
            println!(
                "{:>6} {:>11.4} {:>11.4} {:>11.4} {:>+9.2}",
                p.batch,
                p.median_ms,
                p.p99_ms,
                f,
                100.0 * (p.median_ms - f) / p.median_ms
            );
        }
        println!(
            "least squares: l(b) = {:.4} ms * b + {:.4} ms   (rmse {:.4} ms, max error {:.1}%, R^2 {:.5})",
            prof.fit.alpha_ms,
            prof.fit.beta_ms,
            prof.fit.rmse_ms,
            100.0 * prof.fit.max_rel_err,
            prof.fit.r2
        );
        println!(
            "scheduler's profile: l(b) = {:.4} ms * b + {:.4} ms   (intercept raised to the highest median)",
            prof.alpha_ms, prof.beta_ms
        );
    }
    if !a.dry_run {
        let out = a
            .out
            .unwrap_or_else(|| repo::profile_path(&dir, &meta.name, &a.executor));
        prof.save(&out)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}
