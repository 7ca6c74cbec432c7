//! The profiler: measures a model's batch latency l(b) on an executor and fits the
//! line l(b) = alpha * b + beta that the scheduler plans with (`fermata profile`).
//!
//! For each batch size it first runs `warmup` batches (first runs of a real runtime
//! allocate, pick kernels and fill caches), then `repeats` timed batches. The timed
//! runs go round-robin over the batch sizes, so a slow spell of the machine spreads
//! over all of them instead of bending one point. Each point is the median of its
//! repeats (p99 is reported too); the fit is ordinary least squares over the
//! medians, with its RMSE, largest relative error and R² in the profile file.
//!
//! What is timed is [`Executor::run`] on requests in the wire layout: the same call,
//! with the same gather and split, that a backend makes for a batch.

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

/// One batch size's measurements (ms).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub batch: u32,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub min_ms: f64,
}

/// The `q` quantile (nearest rank) of `v`, which is sorted.
fn quantile(v: &[f64], q: f64) -> f64 {
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Measures l(b) of `model` (already loaded on `exec`) for each batch size.
pub fn measure(
    exec: &mut dyn Executor,
    model: &ModelInfo,
    meta: &ModelMeta,
    opts: &ProfileOpts,
) -> Result<Vec<Point>> {
    if opts.repeats == 0 {
        bail!("`--repeats` must be at least 1");
    }
    let Some(&largest) = opts.batch_sizes.iter().max() else {
        bail!("no batch sizes to measure");
    };
    // Distinct inputs, so nothing is cached across the requests of a batch.
    let mut rng = <rand_xoshiro::Xoshiro256PlusPlus as rand::SeedableRng>::seed_from_u64(1);
    let inputs: Vec<Vec<u8>> = (0..largest).map(|_| meta.sample_input(&mut rng)).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let run = |exec: &mut dyn Executor, b: u32| -> Result<f64> {
        let batch = &refs[..b as usize];
        let t0 = Instant::now();
        let out = exec
            .run(model.id, batch)
            .with_context(|| format!("running a batch of {b}"))?;
        let el = t0.elapsed().as_secs_f64() * 1e3;
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
    };
    for &b in &opts.batch_sizes {
        for _ in 0..opts.warmup {
            run(exec, b)?;
        }
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); opts.batch_sizes.len()];
    for _ in 0..opts.repeats {
        for (i, &b) in opts.batch_sizes.iter().enumerate() {
            times[i].push(run(exec, b)?);
        }
    }
    Ok(opts
        .batch_sizes
        .iter()
        .zip(times)
        .map(|(&batch, mut t)| {
            t.sort_by(f64::total_cmp);
            Point {
                batch,
                median_ms: quantile(&t, 0.5),
                p99_ms: quantile(&t, 0.99),
                min_ms: t[0],
            }
        })
        .collect())
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
    use crate::wire::WireProfile;

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

    /// The whole profiler on an executor whose l(b) is known: the emulated GPU
    /// waits exactly 0.4 ms * b + 1 ms.
    #[test]
    fn profiles_a_known_line() {
        let meta = ModelMeta {
            name: "lin".into(),
            inputs: vec![TensorMeta {
                name: "x".into(),
                datatype: DType::F32,
                shape: vec![-1, 4],
            }],
            // The emulated GPU's output: length and checksum, 16 bytes.
            outputs: vec![TensorMeta {
                name: "y".into(),
                datatype: DType::I64,
                shape: vec![-1, 2],
            }],
            slo_ms: 50.0,
            max_batch: 16,
            description: String::new(),
        };
        let info = ModelInfo {
            id: 0,
            name: "lin".into(),
            slo_ns: 50_000_000,
            profile: WireProfile::Linear {
                alpha_ns: 400_000,
                beta_ns: 1_000_000,
                max_batch: 16,
            },
            input_bytes: 16,
            meta_json: serde_json::to_string(&meta).unwrap(),
        };
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
        let prof = to_profile(&meta, "emulated", "test", &pts, 5).unwrap();
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
}
