//! `fermata profile`: measures a model's l(b) on an executor, fits alpha/beta and
//! writes the profile file the scheduler loads (see `fermata::profiler`).

use anyhow::{bail, Context, Result};
use clap::Args;
use fermata::node::exec::executor_factory;
use fermata::profiler::{self, ProfileOpts};
use fermata::repo;
use fermata::wire::{Dur, ModelId, ModelInfo, WireProfile};
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
    /// Measure d(b, E): E executors (lanes) on the one device, each with its
    /// own sessions (and, on a GPU, streams), every batch run on all E at once.
    /// The profile for backends started with `--lanes E`.
    #[arg(long, default_value_t = 1)]
    lanes: u32,
    /// Batch-size buckets: auto (the model's batch_buckets, else pow2 on a GPU and
    /// exact on the CPU), exact, pow2 or a list 1,4,16,64. Sets FERMATA_BUCKETS
    /// for the executor. Default: $FERMATA_BUCKETS, else auto.
    #[arg(long)]
    buckets: Option<String>,
    /// What the bucket sessions share: none, weights or all (weights and, on a
    /// GPU, one arena). Sets FERMATA_ORT_SHARING. Default: $FERMATA_ORT_SHARING,
    /// else all.
    #[arg(long)]
    sharing: Option<String>,
    /// Load the model, report its device memory (GPU) and buckets, and measure
    /// nothing.
    #[arg(long)]
    memory_only: bool,
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
    // The executor finds the model by name in its repository: the directory of
    // a NAME.onnx, or the one above a Triton model directory.
    let dir = a
        .model
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| PathBuf::from("."));
    let profile_dir = repo::profile_dir_of(&a.model);
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
    // The executor reads its bucket policy and sharing from the environment;
    // check the values here so a typo is reported as this command's flag.
    if let Some(b) = &a.buckets {
        repo::BucketPolicy::parse(b).context("--buckets")?;
        std::env::set_var(fermata::node::onnx::BUCKETS_ENV, b);
    }
    if let Some(s) = &a.sharing {
        fermata::node::onnx::Sharing::parse(s).context("--sharing")?;
        std::env::set_var(fermata::node::onnx::SHARING_ENV, s);
    }
    if a.lanes == 0 || a.lanes > fermata::node::backend::lanes::MAX_LANES {
        bail!(
            "--lanes must be 1 to {}, got {}",
            fermata::node::backend::lanes::MAX_LANES,
            a.lanes
        );
    }
    let factory = executor_factory(&a.executor, &dir)?;
    let mut execs = (0..a.lanes)
        .map(|_| factory(a.gpu).with_context(|| format!("starting the {} executor", a.executor)))
        .collect::<Result<Vec<_>>>()?;
    // The executor plans nothing with this profile; it is a placeholder until the
    // measured one exists.
    let info = ModelInfo {
        id: ModelId(0),
        name: meta.name.clone(),
        slo: Dur::from_ms_f64(meta.slo_ms),
        profile: WireProfile::Linear {
            alpha_ns: 0,
            beta_ns: 1,
            max_batch: meta.max_batch,
        },
        input_bytes: meta.input_bytes() as u32,
        meta_json: serde_json::to_string(&meta)?,
    };
    for exec in &mut execs {
        exec.load(&info)
            .with_context(|| format!("loading {}", a.model.display()))?;
    }
    let buckets = execs[0].buckets(info.id);
    let device_bytes = execs[0].device_bytes(info.id);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let say = |line: String| {
        if a.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    say(format!(
        "model {}: buckets {}, device memory {}",
        meta.name,
        if buckets.is_empty() {
            "none (exact batch sizes)".to_string()
        } else {
            format!("{buckets:?}")
        },
        device_bytes.map_or("not measured (CPU)".to_string(), |b| format!(
            "{:.1} MiB (sharing: {})",
            mib(b),
            std::env::var(fermata::node::onnx::SHARING_ENV).unwrap_or_else(|_| "all".into())
        ))
    ));
    if a.memory_only {
        return Ok(());
    }
    // With buckets, each bucket is measured (the scheduler's step profile needs
    // them all); other sizes run padded to theirs.
    let batch_sizes = if buckets.is_empty() || a.batch_sizes.is_some() {
        batch_sizes
    } else {
        buckets.clone()
    };
    let unmeasured: Vec<u32> = buckets
        .iter()
        .copied()
        .filter(|b| !batch_sizes.contains(b))
        .collect();
    if !unmeasured.is_empty() && !a.dry_run {
        bail!(
            "the model runs in buckets {buckets:?} and the scheduler's step profile needs each \
             of them measured; --batch-sizes leaves out {unmeasured:?} (leave --batch-sizes out \
             to measure the buckets, or add --dry-run)"
        );
    }
    let opts = ProfileOpts {
        batch_sizes,
        repeats: a.repeats,
        warmup: a.warmup,
    };
    eprintln!(
        "profiling {} on {} (batch sizes {:?}, {} warm-up + {} timed runs each, same shape and mixed{})",
        meta.name,
        a.executor,
        opts.batch_sizes,
        opts.warmup,
        opts.repeats,
        if a.lanes > 1 {
            format!("; {} lanes, every batch on all at once: d(b, {})", a.lanes, a.lanes)
        } else {
            String::new()
        }
    );
    let mut lanes: Vec<&mut dyn fermata::node::exec::Executor> =
        execs.iter_mut().map(|e| e.as_mut() as _).collect();
    let pts = profiler::measure_lanes(&mut lanes, &info, &meta, &opts)?;
    let device = match a.executor.as_str() {
        "onnx" => format!(
            "{}, ONNX Runtime CPU provider, {} intra-op thread(s) ({})",
            profiler::cpu_name(),
            fermata::node::onnx::threads_from_env()?,
            fermata::node::onnx::THREADS_ENV
        ),
        #[cfg(feature = "cuda")]
        "cuda" => {
            let (name, mem) = fermata::node::onnx::cuda::describe(a.gpu)?;
            format!(
                "{name} ({} GiB, CUDA device {}), ONNX Runtime CUDA provider",
                mem >> 30,
                a.gpu
            )
        }
        other => format!("{other} device {}", a.gpu),
    };
    let mut prof = profiler::to_profile(&meta, &a.executor, &device, &pts, a.repeats, &buckets)?;
    prof.lanes = a.lanes;
    let warnings = profiler::shape_change_warnings(&pts, !buckets.is_empty());
    if a.json {
        println!("{}", serde_json::to_string_pretty(&prof)?);
    } else {
        println!(
            "{:>6} {:>12} {:>11} {:>12} {:>11} {:>11} {:>11} {:>9}",
            "batch",
            "mixed ms",
            "mixed p99",
            "same ms",
            "same p99",
            "mixed/same",
            "fit ms",
            "resid %"
        );
        for p in &pts {
            let f = prof.fit.alpha_ms * p.batch as f64 + prof.fit.beta_ms;
            println!(
                "{:>6} {:>12.4} {:>11.4} {:>12.4} {:>11.4} {:>11.3} {:>11.4} {:>+9.2}",
                p.batch,
                p.median_ms,
                p.p99_ms,
                p.same_median_ms,
                p.same_p99_ms,
                p.mixed_over_same(),
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
        if buckets.is_empty() {
            println!(
                "scheduler's profile: l(b) = {:.4} ms * b + {:.4} ms   (intercept raised to the highest median)",
                prof.alpha_ms, prof.beta_ms
            );
        } else {
            println!(
                "scheduler's profile: the step function l(bucket(b)) over buckets {buckets:?} (mixed medians)"
            );
        }
        let suggest = repo::buckets_for_waste(
            |b| prof.fit.alpha_ms.max(0.0) * b as f64 + prof.fit.beta_ms.max(1e-6),
            meta.max_batch,
            0.1,
        );
        println!(
            "buckets with at most 10% padding waste by the fitted line: {suggest:?} \
             (set \"batch_buckets\" in {} to use them)",
            a.model.with_extension("json").display()
        );
    }
    for w in &warnings {
        eprintln!("{w}");
    }
    if !a.dry_run {
        let out = a
            .out
            .unwrap_or_else(|| repo::profile_path(&profile_dir, &meta.name, &a.executor));
        prof.save(&out)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}
