//! The profiler: measures a model's batch latency l(b) on an executor and fits the
//! line l(b) = alpha * b + beta that the scheduler plans with (`fermata profile`).
//!
//! For each batch size it first runs `warmup` batches (first runs of a real runtime
//! allocate, pick kernels and fill caches). Then it measures every batch size two
//! ways:
//!
//! * **same shape**: `repeats` runs of that one size back to back (what a
//!   benchmark of one shape sees);
//! * **mixed**: all sizes' `repeats` runs in one seeded random order (what serving
//!   sees: deferred batching changes the batch size from batch to batch, and a
//!   runtime that re-tunes on a shape change is slow there and only there).
//!
//! The mixed numbers are the profile; both are printed, and a size whose two
//! medians differ by more than [`SHAPE_CHANGE_TOLERANCE`] gets a warning (a
//! runtime keeping per-shape state for one shape only: see
//! [`crate::node::onnx`]'s shape-stable execution). Each point is the median of its
//! repeats (p99 is reported too); the fit is ordinary least squares over the mixed
//! medians, with its RMSE, largest relative error and R² in the profile file.
//!
//! What is timed is [`Executor::run`] on requests in the wire layout: the same call,
//! with the same gather and split, that a backend makes for a batch.

use crate::metrics::sorted_quantile as quantile;
use crate::node::exec::Executor;
use crate::repo::{fit_linear, LinearFit, ModelMeta, ProfileFile};
use crate::wire::ModelInfo;
use anyhow::{bail, Context, Result};
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct ProfileOpts {
    pub batch_sizes: Vec<u32>,
    /// Timed runs per batch size.
    pub repeats: u32,
    /// Untimed runs per batch size before any timed one.
    pub warmup: u32,
}

/// Parses a batch-size list: `A..B` (every size from A to B), `A..B:pow2` (powers
/// of two from A, then B), or a comma-separated list (`1,8,32`); sorted, deduped.
pub fn parse_batch_sizes(s: &str) -> Result<Vec<u32>> {
    let num = |t: &str| -> Result<u32> {
        let v: u32 = t
            .trim()
            .parse()
            .with_context(|| format!("`--batch-sizes`: {t:?} is not a batch size"))?;
        if v == 0 {
            bail!("`--batch-sizes`: batch sizes start at 1");
        }
        Ok(v)
    };
    let mut v: Vec<u32> = if let Some((a, b)) = s.split_once("..") {
        let (b, pow2) = match b.split_once(':') {
            Some((b, "pow2")) => (b, true),
            Some((_, k)) => bail!("`--batch-sizes`: unknown step {k:?} (only `pow2`)"),
            None => (b, false),
        };
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            bail!("`--batch-sizes`: {a}..{b} is empty");
        }
        if pow2 {
            let mut out = Vec::new();
            let mut x = a;
            while x < b {
                out.push(x);
                x = x.saturating_mul(2);
            }
            out.push(b);
            out
        } else {
            (a..=b).collect()
        }
    } else {
        s.split(',').map(num).collect::<Result<_>>()?
    };
    v.sort_unstable();
    v.dedup();
    if v.len() < 2 {
        bail!("`--batch-sizes`: a fit needs at least two batch sizes, got {v:?}");
    }
    Ok(v)
}

/// One batch size's measurements (ms): inside the mixed sequence (`median_ms`,
/// `p99_ms`, `min_ms`) and with the same shape repeated (`same_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub batch: u32,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub min_ms: f64,
    pub same_median_ms: f64,
    pub same_p99_ms: f64,
}

/// Mixed and same-shape medians further apart than this (relative) are warned
/// about.
pub const SHAPE_CHANGE_TOLERANCE: f64 = 0.20;

/// ... and further apart than this (ms): below it, a difference is timer and cache
/// noise of microsecond runs, not a runtime re-tuning itself.
pub const SHAPE_CHANGE_FLOOR_MS: f64 = 0.05;

impl Point {
    /// Mixed median over same-shape median.
    pub fn mixed_over_same(&self) -> f64 {
        self.median_ms / self.same_median_ms
    }
}

/// One warning per batch size whose mixed and same-shape medians differ by more
/// than [`SHAPE_CHANGE_TOLERANCE`].
pub fn shape_change_warnings(points: &[Point], bucketed: bool) -> Vec<String> {
    points
        .iter()
        .filter(|p| {
            (p.mixed_over_same() - 1.0).abs() > SHAPE_CHANGE_TOLERANCE
                && (p.median_ms - p.same_median_ms).abs() > SHAPE_CHANGE_FLOOR_MS
        })
        .map(|p| {
            let advice = if bucketed {
                "Each bucket already has a session of its own, so what remains is outside \
                 the runtime's per-shape state (host caches and clocks after a batch of \
                 another size); the profile keeps the mixed number."
            } else {
                "Run each batch size in a session of its own (buckets: --buckets pow2 or \
                 batch_buckets in the model's metadata)."
            };
            format!(
                "WARNING: batch {}: {:.3} ms in a mixed sequence of batch sizes but {:.3} ms with \
                 the same shape repeated ({:.2}x). The executor is slow after a shape change: \
                 serving, whose batch size changes from batch to batch, will see the mixed \
                 number. {advice}",
                p.batch,
                p.median_ms,
                p.same_median_ms,
                p.mixed_over_same()
            )
        })
        .collect()
}

/// Measures l(b) of `model` (already loaded on `exec`) for each batch size.
pub fn measure(
    exec: &mut dyn Executor,
    model: &ModelInfo,
    meta: &ModelMeta,
    opts: &ProfileOpts,
) -> Result<Vec<Point>> {
    measure_lanes(&mut [exec], model, meta, opts)
}

/// One run of the profiler's sequence: a batch size's index, and what its time
/// counts for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Untimed(usize),
    Same(usize),
    Mixed(usize),
}

/// The profiler's sequence of runs: every size's warm-up runs; then per size
/// one untimed run (the first run after a shape change is the mixed sequence's
/// business) and its same-shape runs back to back; then every size `repeats`
/// times in a seeded random order.
fn steps(opts: &ProfileOpts, rng: &mut rand_xoshiro::Xoshiro256PlusPlus) -> Vec<Step> {
    let n = opts.batch_sizes.len();
    let mut v: Vec<Step> = (0..n)
        .flat_map(|i| std::iter::repeat_n(Step::Untimed(i), opts.warmup as usize))
        .collect();
    for i in 0..n {
        v.push(Step::Untimed(i));
        v.extend(std::iter::repeat_n(Step::Same(i), opts.repeats as usize));
    }
    let mut order: Vec<usize> = (0..n)
        .flat_map(|i| std::iter::repeat_n(i, opts.repeats as usize))
        .collect();
    rand::seq::SliceRandom::shuffle(order.as_mut_slice(), rng);
    v.extend(order.into_iter().map(Step::Mixed));
    v
}

/// One lane's timed runs (ms) per batch size: same shape, and mixed.
type LaneTimes = (Vec<Vec<f64>>, Vec<Vec<f64>>);

/// Measures d(b, e) of `model` (already loaded on each executor) for each batch
/// size, with e = `execs.len()` lanes on one device: every lane runs the same
/// sequence on a thread of its own, and each run starts on all lanes at once
/// (a barrier), so each timed batch of size b runs while the other e - 1 lanes
/// run one of size b too. Every lane's times count; with one executor this is
/// l(b).
pub fn measure_lanes(
    execs: &mut [&mut dyn Executor],
    model: &ModelInfo,
    meta: &ModelMeta,
    opts: &ProfileOpts,
) -> Result<Vec<Point>> {
    if opts.repeats == 0 {
        bail!("`--repeats` must be at least 1");
    }
    if execs.is_empty() {
        bail!("no executor to measure on");
    }
    let Some(&largest) = opts.batch_sizes.iter().max() else {
        bail!("no batch sizes to measure");
    };
    // Distinct inputs, so nothing is cached across the requests of a batch.
    let mut rng = <rand_xoshiro::Xoshiro256PlusPlus as rand::SeedableRng>::seed_from_u64(1);
    let inputs: Vec<Vec<u8>> = (0..largest).map(|_| meta.sample_input(&mut rng)).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let seq = steps(opts, &mut rng);
    let n = opts.batch_sizes.len();
    let lanes = execs.len();
    let barrier = std::sync::Barrier::new(lanes);
    // A lane that fails keeps meeting the others at the barrier (running
    // nothing), so none waits for it forever.
    let failed = std::sync::atomic::AtomicBool::new(false);
    let lane = |exec: &mut dyn Executor| -> Result<LaneTimes> {
        let mut same = vec![Vec::new(); n];
        let mut mixed = vec![Vec::new(); n];
        let mut err = None;
        for &st in &seq {
            if lanes > 1 {
                barrier.wait();
            }
            if err.is_some() || failed.load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            let (Step::Untimed(i) | Step::Same(i) | Step::Mixed(i)) = st;
            match run_once(exec, model, meta, &refs[..opts.batch_sizes[i] as usize]) {
                Ok(ms) => match st {
                    Step::Same(_) => same[i].push(ms),
                    Step::Mixed(_) => mixed[i].push(ms),
                    Step::Untimed(_) => {}
                },
                Err(e) => {
                    failed.store(true, std::sync::atomic::Ordering::Release);
                    err = Some(e);
                }
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok((same, mixed)),
        }
    };
    let per_lane: Vec<Result<LaneTimes>> = if lanes == 1 {
        vec![lane(&mut *execs[0])]
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = execs
                .iter_mut()
                .map(|e| {
                    let lane = &lane;
                    s.spawn(move || lane(&mut **e))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a lane's thread panicked")))
                })
                .collect()
        })
    };
    let mut same = vec![Vec::new(); n];
    let mut mixed = vec![Vec::new(); n];
    for r in per_lane {
        let (s, m) = r?;
        for i in 0..n {
            same[i].extend(&s[i]);
            mixed[i].extend(&m[i]);
        }
    }
    let stats = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        (quantile(&t, 0.5), quantile(&t, 0.99), t[0])
    };
    Ok(opts
        .batch_sizes
        .iter()
        .zip(mixed)
        .zip(same)
        .map(|((&batch, t), sm)| {
            let (median_ms, p99_ms, min_ms) = stats(t);
            let (same_median_ms, same_p99_ms, _) = stats(sm);
            Point {
                batch,
                median_ms,
                p99_ms,
                min_ms,
                same_median_ms,
                same_p99_ms,
            }
        })
        .collect())
}

/// Runs one batch of `batch` on `exec` and checks its outputs; its time (ms).
///
/// A model the executor stages ([`Executor::stage_pool`]) is timed as it
/// runs when served: from the buffer its inputs were pulled into. The backend
/// pulls them there before the batch's start, overlapped with the batch
/// before, so the copy into the buffer is made here before the clock starts.
fn run_once(
    exec: &mut dyn Executor,
    model: &ModelInfo,
    meta: &ModelMeta,
    batch: &[&[u8]],
) -> Result<f64> {
    let b = batch.len();
    let staged = exec
        .stage_pool()
        .and_then(|p| p.take(model.id, b))
        .filter(|st| batch.iter().all(|x| x.len() == st.row_bytes()));
    let (out, el) = match staged {
        Some(mut st) => {
            for (k, x) in batch.iter().enumerate() {
                st.row_mut(k).copy_from_slice(x);
            }
            let t0 = Instant::now();
            let out = exec.run_staged(model.id, &mut st, b);
            (out, t0.elapsed())
        }
        None => {
            let t0 = Instant::now();
            let out = exec.run(model.id, batch);
            (out, t0.elapsed())
        }
    };
    let out = out.with_context(|| format!("running a batch of {b}"))?;
    let el = el.as_secs_f64() * 1e3;
    if out.len() != batch.len() {
        bail!(
            "the executor returned {} outputs for a batch of {b}",
            out.len()
        );
    }
    let want = meta.output_bytes();
    if let Some(o) = out.iter().find(|o| o.len() != want) {
        bail!("an output is {} bytes; the metadata says {want}", o.len());
    }
    Ok(el)
}

/// Fits the line through the medians and makes the profile file.
///
/// `fit` is the ordinary least-squares line. The line the scheduler plans with
/// (`alpha_ms`, `beta_ms`) keeps its slope (0 if negative) but raises the
/// intercept until no measured median lies above it: a profile that promises a
/// batch sooner than it runs makes the scheduler miss deadlines, one that is a
/// little slow only costs a little batch size. With a straight-line model the two
/// coincide up to noise; with a curved one (fixed costs that a large batch
/// amortises) the raise is what keeps small batches honest.
pub fn to_profile(
    meta: &ModelMeta,
    executor: &str,
    device: &str,
    points: &[Point],
    repeats: u32,
    buckets: &[u32],
) -> Result<ProfileFile> {
    let x: Vec<f64> = points.iter().map(|p| p.batch as f64).collect();
    let y: Vec<f64> = points.iter().map(|p| p.median_ms).collect();
    let fit: LinearFit = fit_linear(&x, &y)?;
    let max_batch = points.iter().map(|p| p.batch).max().unwrap_or(1);
    let alpha_ms = fit.alpha_ms.max(0.0);
    let beta_ms = points
        .iter()
        .map(|p| p.median_ms - alpha_ms * p.batch as f64)
        .fold(fit.beta_ms, f64::max)
        .max(0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(ProfileFile {
        model: meta.name.clone(),
        executor: executor.to_string(),
        device: device.to_string(),
        alpha_ms,
        beta_ms,
        max_batch,
        batch_sizes: points.iter().map(|p| p.batch).collect(),
        median_ms: y,
        p99_ms: points.iter().map(|p| p.p99_ms).collect(),
        repeats,
        fit,
        measured_at: format!("{now} (seconds since the Unix epoch)"),
        buckets: buckets.to_vec(),
        same_shape_median_ms: points.iter().map(|p| p.same_median_ms).collect(),
        lanes: 1,
    })
}

/// A short description of this machine's CPU (from /proc/cpuinfo), for profiles.
pub fn cpu_name() -> String {
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{name} ({cores} cores available)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::exec::EmulatedGpu;
    use crate::repo::{DType, TensorMeta};
    use crate::wire::{Dur, ModelId, WireProfile};

    #[test]
    fn batch_size_lists() {
        assert_eq!(parse_batch_sizes("1..4").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(
            parse_batch_sizes("1..48:pow2").unwrap(),
            vec![1, 2, 4, 8, 16, 32, 48]
        );
        assert_eq!(parse_batch_sizes("32, 1,8,8").unwrap(), vec![1, 8, 32]);
        for bad in ["0..4", "4..1", "1", "a,b", "1..8:odd", ""] {
            assert!(parse_batch_sizes(bad).is_err(), "{bad}");
        }
    }

    /// An executor that is slow for `penalty` after every change of batch size,
    /// as ONNX Runtime's CUDA convolutions are when one session sees many shapes.
    struct ShapeSensitive {
        inner: EmulatedGpu,
        last: usize,
        penalty: std::time::Duration,
    }

    impl Executor for ShapeSensitive {
        fn name(&self) -> &'static str {
            "shape-sensitive"
        }
        fn load(&mut self, m: &ModelInfo) -> Result<()> {
            self.inner.load(m)
        }
        fn unload(&mut self, m: ModelId) {
            self.inner.unload(m)
        }
        fn run(&mut self, m: ModelId, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
            if inputs.len() != self.last {
                std::thread::sleep(self.penalty);
                self.last = inputs.len();
            }
            self.inner.run(m, inputs)
        }
    }

    /// A model the emulated GPU runs in exactly alpha_ns * b + 1 ms.
    fn lin_model(alpha_ns: i64) -> (ModelMeta, ModelInfo) {
        let meta = ModelMeta {
            name: "lin".into(),
            inputs: vec![TensorMeta {
                name: "x".into(),
                datatype: DType::F32,
                shape: vec![-1, 4],
                range: None,
            }],
            // The emulated GPU's output: length and checksum, 16 bytes.
            outputs: vec![TensorMeta {
                name: "y".into(),
                datatype: DType::I64,
                shape: vec![-1, 2],
                range: None,
            }],
            slo_ms: 50.0,
            max_batch: 16,
            description: String::new(),
            batch_buckets: None,
        };
        let info = ModelInfo {
            id: ModelId(0),
            name: "lin".into(),
            slo: Dur(50_000_000),
            profile: WireProfile::Linear {
                alpha_ns,
                beta_ns: 1_000_000,
                max_batch: 16,
            },
            input_bytes: 16,
            meta_json: serde_json::to_string(&meta).unwrap(),
        };
        (meta, info)
    }

    #[test]
    fn warns_when_a_shape_change_is_slow() {
        let (meta, info) = lin_model(100_000);
        let opts = ProfileOpts {
            batch_sizes: vec![1, 4, 16],
            repeats: 8,
            warmup: 1,
        };
        // 3 ms after every change of shape, on runs of 1.1 to 2.6 ms: the mixed
        // sequence changes shape on most runs, the same-shape runs never do.
        let mut slow = ShapeSensitive {
            inner: EmulatedGpu::new(),
            last: 0,
            penalty: std::time::Duration::from_millis(3),
        };
        slow.load(&info).unwrap();
        let pts = measure(&mut slow, &info, &meta, &opts).unwrap();
        let w = shape_change_warnings(&pts, false);
        assert!(!w.is_empty(), "{pts:?}");
        assert!(
            w[0].contains("mixed sequence") && w[0].contains("buckets"),
            "{w:?}"
        );
        let w = shape_change_warnings(&pts, true);
        assert!(w[0].contains("already has a session"), "{w:?}");
        // Every size ran after a change of shape at least once in the mixed
        // sequence: its slowest mixed run carries the 3 ms. (Medians are not
        // compared per size: where half of a size's 8 mixed runs followed a
        // change its median is an unpenalised run, and on a loaded machine the
        // same-shape median can exceed it.)
        for p in &pts {
            assert!(p.p99_ms > p.min_ms + 2.0, "{p:?}");
        }
        // The profile is the mixed numbers, with the same-shape ones beside them.
        let prof = to_profile(&meta, "t", "t", &pts, 8, &[1, 4, 16]).unwrap();
        assert_eq!(
            prof.median_ms,
            pts.iter().map(|p| p.median_ms).collect::<Vec<_>>()
        );
        assert_eq!(
            prof.same_shape_median_ms,
            pts.iter().map(|p| p.same_median_ms).collect::<Vec<_>>()
        );
        assert_eq!(prof.buckets, vec![1, 4, 16]);
        prof.validate().unwrap();

        // The same executor without the penalty: quiet.
        let mut fine = EmulatedGpu::new();
        fine.load(&info).unwrap();
        let pts = measure(&mut fine, &info, &meta, &opts).unwrap();
        assert!(shape_change_warnings(&pts, false).is_empty(), "{pts:?}");
    }

    /// The whole profiler on an executor whose l(b) is known: the emulated GPU
    /// waits exactly 0.4 ms * b + 1 ms.
    #[test]
    fn profiles_a_known_line() {
        let (meta, info) = lin_model(400_000);
        let mut g = EmulatedGpu::new();
        g.load(&info).unwrap();
        let opts = ProfileOpts {
            batch_sizes: vec![1, 4, 16],
            repeats: 5,
            warmup: 1,
        };
        let pts = measure(&mut g, &info, &meta, &opts).unwrap();
        assert_eq!(pts.len(), 3);
        for p in &pts {
            let want = 0.4 * p.batch as f64 + 1.0;
            // Never faster than l(b); a loaded machine may add a little.
            assert!(p.min_ms >= want - 1e-3, "{p:?}");
            assert!(p.median_ms < want + 2.0, "{p:?}");
            assert!(p.p99_ms >= p.median_ms);
        }
        let prof = to_profile(&meta, "emulated", "test", &pts, 5, &[]).unwrap();
        // Medians a little above the line fit a line a little above it.
        assert!((prof.alpha_ms - 0.4).abs() < 0.15, "{prof:?}");
        assert!(prof.beta_ms > 0.5 && prof.beta_ms < 3.0, "{prof:?}");
        assert_eq!(prof.max_batch, 16);
        assert_eq!(prof.batch_sizes, vec![1, 4, 16]);
        prof.validate().unwrap();
        // The planning line is never below a measured median.
        for p in &pts {
            assert!(prof.alpha_ms * p.batch as f64 + prof.beta_ms >= p.median_ms - 1e-12);
        }
        assert!(prof.beta_ms >= prof.fit.beta_ms);
        // A batch larger than the model allows is an error, not a measurement.
        let too_big = ProfileOpts {
            batch_sizes: vec![1, 17],
            repeats: 1,
            warmup: 0,
        };
        let e = measure(&mut g, &info, &meta, &too_big).unwrap_err();
        assert!(format!("{e:#}").contains("batch of 17"), "{e:#}");
    }

    /// An executor that stages the model: `run` (inputs gathered) pays
    /// `gather` first, `run_staged` runs the rows the profiler filled.
    struct Stager {
        inner: EmulatedGpu,
        pool: std::sync::Arc<crate::node::exec::stage::StagePool>,
        gather: std::time::Duration,
        runs: (usize, usize),
    }

    impl Executor for Stager {
        fn name(&self) -> &'static str {
            "stager"
        }
        fn load(&mut self, m: &ModelInfo) -> Result<()> {
            self.inner.load(m)
        }
        fn unload(&mut self, m: ModelId) {
            self.inner.unload(m)
        }
        fn run(&mut self, m: ModelId, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
            self.runs.0 += 1;
            std::thread::sleep(self.gather);
            self.inner.run(m, inputs)
        }
        fn stage_pool(&self) -> Option<std::sync::Arc<crate::node::exec::stage::StagePool>> {
            Some(self.pool.clone())
        }
        fn run_staged(
            &mut self,
            m: ModelId,
            st: &mut crate::node::exec::stage::Staged,
            n: usize,
        ) -> Result<Vec<Vec<u8>>> {
            self.runs.1 += 1;
            let rows: Vec<&[u8]> = (0..n).map(|k| st.row(k)).collect();
            self.inner.run(m, &rows)
        }
    }

    #[test]
    fn a_staged_model_is_timed_from_its_buffer_as_it_runs_when_served() {
        let (meta, info) = lin_model(100_000);
        let opts = ProfileOpts {
            batch_sizes: vec![1, 4],
            repeats: 3,
            warmup: 1,
        };
        let pool = crate::node::exec::stage::StagePool::new();
        pool.enable(info.id, meta.input_bytes(), 16);
        let mut g = Stager {
            inner: EmulatedGpu::new(),
            pool: pool.clone(),
            gather: std::time::Duration::from_millis(30),
            runs: (0, 0),
        };
        g.load(&info).unwrap();
        let pts = measure(&mut g, &info, &meta, &opts).unwrap();
        assert_eq!(g.runs.0, 0, "every run from the staged buffer");
        assert!(g.runs.1 > 0);
        for p in &pts {
            // l(b) = 0.1 ms * b + 1 ms, outputs checked (the rows held the
            // inputs), and no gather paid.
            let want = 0.1 * p.batch as f64 + 1.0;
            assert!(p.min_ms >= want - 1e-3, "{p:?}");
            assert!(p.min_ms < 30.0, "{p:?}");
        }
        // Not staged (the model left the pool): gathered, its cost timed.
        pool.disable(info.id);
        let pts = measure(&mut g, &info, &meta, &opts).unwrap();
        assert!(g.runs.0 > 0);
        assert!(pts.iter().all(|p| p.min_ms >= 30.0), "{pts:?}");
    }

    /// Lanes of one device: each run waits until `lanes` runs are in progress
    /// (failing after a generous timeout, so runs not started together fail
    /// the measurement), then takes `lanes` times the single-lane time.
    struct Rendezvous {
        inner: EmulatedGpu,
        lanes: usize,
        state: std::sync::Arc<(std::sync::Mutex<(usize, usize)>, std::sync::Condvar)>,
        timeout: std::time::Duration,
    }

    impl Executor for Rendezvous {
        fn name(&self) -> &'static str {
            "rendezvous"
        }
        fn load(&mut self, m: &ModelInfo) -> Result<()> {
            self.inner.load(m)
        }
        fn unload(&mut self, m: ModelId) {
            self.inner.unload(m)
        }
        fn run(&mut self, m: ModelId, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
            let (lock, cv) = &*self.state;
            let mut g = lock.lock().unwrap();
            // (runs in progress, most seen at once)
            g.0 += 1;
            g.1 = g.1.max(g.0);
            let (mut g, t) = cv
                .wait_timeout_while(g, self.timeout, |g| g.1 < self.lanes)
                .unwrap();
            if t.timed_out() {
                bail!("the lanes' runs did not start together");
            }
            cv.notify_all();
            drop(g);
            let mut out = Vec::new();
            for _ in 0..self.lanes {
                out = self.inner.run(m, inputs)?;
            }
            g = lock.lock().unwrap();
            g.0 -= 1;
            if g.0 == 0 {
                g.1 = 0;
            }
            cv.notify_all();
            Ok(out)
        }
    }

    #[test]
    fn lanes_run_each_batch_at_once_and_measure_d_b_e() {
        let (meta, info) = lin_model(100_000);
        let opts = ProfileOpts {
            batch_sizes: vec![1, 8],
            repeats: 3,
            warmup: 1,
        };
        let state = std::sync::Arc::new((std::sync::Mutex::new((0, 0)), std::sync::Condvar::new()));
        let mut execs: Vec<Rendezvous> = (0..3)
            .map(|_| Rendezvous {
                inner: EmulatedGpu::new(),
                lanes: 3,
                state: state.clone(),
                timeout: std::time::Duration::from_secs(30),
            })
            .collect();
        for e in &mut execs {
            e.load(&info).unwrap();
        }
        let mut lanes: Vec<&mut dyn Executor> =
            execs.iter_mut().map(|e| e as &mut dyn Executor).collect();
        let pts = measure_lanes(&mut lanes, &info, &meta, &opts).unwrap();
        for p in &pts {
            // Three times l(b) = 0.1 ms * b + 1 ms: the lane's d(b, 3).
            let want = 3.0 * (0.1 * p.batch as f64 + 1.0);
            assert!(p.min_ms >= want - 1e-3, "{p:?}");
        }
        let mut prof = to_profile(&meta, "t", "t", &pts, 3, &[]).unwrap();
        prof.lanes = 3;
        prof.validate().unwrap();
        let back: ProfileFile =
            serde_json::from_str(&serde_json::to_string(&prof).unwrap()).unwrap();
        assert_eq!(back.lanes, 3);

        // One lane alone never meets two others: the runs fail, and so does
        // the measurement, without waiting on the other lanes forever.
        let state = std::sync::Arc::new((std::sync::Mutex::new((0, 0)), std::sync::Condvar::new()));
        let mut two: Vec<Rendezvous> = (0..2)
            .map(|_| Rendezvous {
                inner: EmulatedGpu::new(),
                lanes: 3,
                state: state.clone(),
                timeout: std::time::Duration::from_millis(100),
            })
            .collect();
        for e in &mut two {
            e.load(&info).unwrap();
        }
        let quick = ProfileOpts {
            batch_sizes: vec![1, 2],
            repeats: 1,
            warmup: 0,
        };
        let mut lanes: Vec<&mut dyn Executor> =
            two.iter_mut().map(|e| e as &mut dyn Executor).collect();
        let e = measure_lanes(&mut lanes, &info, &meta, &quick).unwrap_err();
        assert!(format!("{e:#}").contains("did not start together"), "{e:#}");
    }
}
