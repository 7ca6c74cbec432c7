//! Backend executors: what runs a batch on a GPU.
//!
//! [`Executor`] is the interface; [`EmulatedGpu`] is the default: it computes a
//! checksum of each input as the "output" and takes exactly l(b) of wall time per
//! batch (the model's profile), so a cluster of emulated GPUs behaves like the
//! simulator's. [`super::onnx::OnnxExecutor`] runs real ONNX models with ONNX
//! Runtime (kind `onnx`, CPU; kind `cuda` with the `cuda` cargo feature).

pub mod fault;
pub mod isolate;
pub mod slowdown;
pub mod stage;

use crate::core::{Dur, LatencyProfile, ModelId};
use crate::wire::{ModelInfo, WireProfile};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A model made ready off its GPU's worker thread ([`Loader::prepare`]), for
/// [`Executor::install`] on it.
pub type Prepared = Box<dyn std::any::Any + Send>;

/// Makes models ready for one executor on another thread than the one that
/// runs its batches, so that a GPU goes on running batches of its other models
/// while one loads (a ResNet-50 takes hundreds of milliseconds to open and warm
/// up; on the worker thread every batch due meanwhile would wait for it).
pub trait Loader: Send + Sync {
    /// Opens `model` (everything but making it the executor's).
    fn prepare(&self, model: &ModelInfo) -> anyhow::Result<Prepared>;
    /// Frees a model the executor let go of ([`Executor::detach`]), or one
    /// prepared for nothing (an unload came first).
    fn discard(&self, prepared: Prepared) {
        drop(prepared);
    }
}

/// Runs batches of one GPU. One executor per GPU, used by that GPU's thread only.
pub trait Executor: Send {
    fn name(&self) -> &'static str;
    /// Loads `model` (called before any batch of it).
    fn load(&mut self, model: &ModelInfo) -> anyhow::Result<()>;
    fn unload(&mut self, model: ModelId);
    /// What loads this executor's models off its thread (`None`: [`load`]
    /// runs on it).
    ///
    /// [`load`]: Executor::load
    fn loader(&self) -> Option<std::sync::Arc<dyn Loader>> {
        None
    }
    /// Unloads `model` and hands over what its [`loader`](Executor::loader)
    /// is to free ([`Loader::discard`]; `None`: freed here, by
    /// [`unload`](Executor::unload)).
    fn detach(&mut self, model: ModelId) -> Option<Prepared> {
        self.unload(model);
        None
    }
    /// Makes a model its [`loader`](Executor::loader) prepared the
    /// executor's: quick, no file or device work.
    fn install(&mut self, model: &ModelInfo, _prepared: Prepared) -> anyhow::Result<()> {
        anyhow::bail!(
            "the {} executor loads model `{}` on its own thread only",
            self.name(),
            model.name
        )
    }
    /// Device memory a loaded model takes on this GPU, when the executor knows it.
    fn device_bytes(&self, _model: ModelId) -> Option<u64> {
        None
    }
    /// The batch-size buckets a loaded model runs in (empty: exact sizes).
    fn buckets(&self, _model: ModelId) -> Vec<u32> {
        Vec::new()
    }
    /// Runs one batch; one output per input, in order.
    fn run(&mut self, model: ModelId, inputs: &[&[u8]]) -> anyhow::Result<Vec<Vec<u8>>>;
    /// Whether [`run`](Executor::run) copies the inputs' bytes into a buffer of
    /// its own (the ONNX executors' batch tensors) rather than reading them
    /// where they lie (the emulated GPU): counted as one more copy of every
    /// input byte a batch runs.
    fn copies_inputs(&self) -> bool {
        false
    }
    /// The buffers this executor lends to its GPU's puller, so that staged
    /// models' inputs are pulled straight into the buffer a batch runs from
    /// ([`stage`]; None: no model is staged, inputs go to [`run`](Executor::run)).
    fn stage_pool(&self) -> Option<std::sync::Arc<stage::StagePool>> {
        None
    }
    /// Runs the first `n` rows of `staged` (a buffer of its [`stage_pool`]
    /// the puller filled) as one batch; one output per row, in order.
    ///
    /// [`stage_pool`]: Executor::stage_pool
    fn run_staged(
        &mut self,
        model: ModelId,
        staged: &mut stage::Staged,
        n: usize,
    ) -> anyhow::Result<Vec<Vec<u8>>> {
        let _ = (staged, n);
        anyhow::bail!("the {} executor stages no model ({model})", self.name())
    }
}

/// Makes the executor of each GPU.
pub type ExecutorFactory = Box<dyn Fn(u32) -> anyhow::Result<Box<dyn Executor>> + Send + Sync>;

/// The executor kinds, as `--executor` names them.
pub const EXECUTOR_KINDS: &[&str] = &["emulated", "onnx", "cuda"];

/// What runs the GPUs of an executor kind (`--executor`): `cuda` real GPUs,
/// `onnx` the CPU, anything else (`emulated`) nothing but a timer.
pub fn device_kind(kind: &str) -> crate::wire::DeviceKind {
    match kind {
        "cuda" => crate::wire::DeviceKind::Gpu,
        "onnx" => crate::wire::DeviceKind::Cpu,
        _ => crate::wire::DeviceKind::Emulated,
    }
}

/// The factory for an executor kind (`--executor`):
///
/// * `emulated` (the default): waits l(b) from the model's profile;
/// * `onnx`: ONNX Runtime on the CPU, one session per model on each "GPU" (which
///   is then one worker thread with its sessions); the models' files are
///   `models_dir/NAME.onnx`;
/// * `cuda` (cargo feature `cuda`): ONNX Runtime's CUDA provider, backend GPU `g`
///   on CUDA device `g`.
///
/// ONNX Runtime is loaded (and, for `cuda`, a CUDA device looked for) here, so a
/// missing library or device is reported before a backend starts.
pub fn executor_factory(
    kind: &str,
    models_dir: &std::path::Path,
) -> anyhow::Result<ExecutorFactory> {
    executor_factory_on(kind, models_dir, None)
}

/// Parses `--cuda-devices`: `0,2` (CUDA device ids, distinct).
pub fn parse_cuda_devices(s: &str) -> anyhow::Result<Vec<u32>> {
    let v: Vec<u32> = s
        .split(',')
        .map(|t| {
            t.trim().parse::<u32>().map_err(|_| {
                anyhow::anyhow!("--cuda-devices: {t:?} is not a CUDA device id (e.g. 0,2)")
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let mut sorted = v.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != v.len() {
        anyhow::bail!("--cuda-devices: a device is listed twice in {s:?}");
    }
    Ok(v)
}

/// [`executor_factory`] with, for `cuda`, the CUDA device of each backend GPU:
/// backend GPU g runs on `cuda_devices[g]` (default: device g).
pub fn executor_factory_on(
    kind: &str,
    models_dir: &std::path::Path,
    cuda_devices: Option<Vec<u32>>,
) -> anyhow::Result<ExecutorFactory> {
    with_faults(executor_factory_of(kind, models_dir, cuda_devices)?)
}

/// `make` wrapped for fault injection in failure tests (FERMATA_FAULT; unset:
/// not wrapped).
fn with_faults(make: ExecutorFactory) -> anyhow::Result<ExecutorFactory> {
    Ok(match fault::from_env()? {
        None => make,
        Some(f) => Box::new(move |g| {
            Ok(Box::new(fault::Faulty::new(make(g)?, f.clone())) as Box<dyn Executor>)
        }),
    })
}

fn executor_factory_of(
    kind: &str,
    models_dir: &std::path::Path,
    cuda_devices: Option<Vec<u32>>,
) -> anyhow::Result<ExecutorFactory> {
    use super::onnx::{OnnxExecutor, OnnxOptions};
    let dir = models_dir.to_path_buf();
    if cuda_devices.is_some() && kind != "cuda" {
        anyhow::bail!("--cuda-devices goes with --executor cuda, not {kind}");
    }
    match kind {
        "emulated" => Ok(Box::new(|_| Ok(Box::new(EmulatedGpu::new())))),
        "onnx" => {
            let opts = OnnxOptions::cpu(&dir)?;
            super::onnx::ort_environment()?;
            Ok(Box::new(move |_| {
                Ok(Box::new(OnnxExecutor::new(opts.clone())?) as Box<dyn Executor>)
            }))
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            let n = super::onnx::cuda::prepare()?;
            if let Some(d) = cuda_devices
                .as_ref()
                .and_then(|v| v.iter().find(|&&d| d >= n))
            {
                anyhow::bail!(
                    "--cuda-devices: CUDA device {d} does not exist (this machine has {n}: 0..{n})"
                );
            }
            Ok(Box::new(move |gpu| {
                let dev = match &cuda_devices {
                    None => gpu,
                    Some(v) => *v.get(gpu as usize).ok_or_else(|| {
                        anyhow::anyhow!(
                            "backend GPU {gpu} has no CUDA device: --cuda-devices lists {}",
                            v.len()
                        )
                    })?,
                };
                let opts = super::onnx::cuda::options(&dir, dev)?;
                Ok(Box::new(OnnxExecutor::new(opts)?) as Box<dyn Executor>)
            }))
        }
        #[cfg(not(feature = "cuda"))]
        "cuda" => {
            let _ = cuda_devices;
            anyhow::bail!(
                "this fermata was built without the `cuda` feature; rebuild with \
                 `cargo build --release --features cuda`, or use --executor onnx"
            )
        }
        other => anyhow::bail!(
            "unknown executor {other:?}; choose one of: {}",
            EXECUTOR_KINDS.join(", ")
        ),
    }
}

/// A model's profile from its wire form.
pub fn profile_of(p: &WireProfile) -> anyhow::Result<LatencyProfile> {
    let prof = match p {
        WireProfile::Linear {
            alpha_ns,
            beta_ns,
            max_batch,
        } => LatencyProfile::linear(Dur(*alpha_ns), Dur(*beta_ns), *max_batch),
        WireProfile::Table { lat_ns } => {
            LatencyProfile::table(lat_ns.iter().map(|&n| Dur(n)).collect())
        }
    };
    prof.map_err(|e| anyhow::anyhow!("bad latency profile: {e}"))
}

/// The least time any answer of a model with profile `p` takes: its l(1)
/// (zero for a profile that cannot be read).
pub fn least_latency(p: &WireProfile) -> Dur {
    profile_of(p).map_or(Dur::ZERO, |p| p.latency(1).max(Dur::ZERO))
}

/// The largest batch model `m` runs in: its metadata's, else its latency
/// profile's (1 when neither can be read).
pub fn max_batch_of(m: &ModelInfo) -> u32 {
    match m.meta() {
        Some(Ok(meta)) => meta.max_batch,
        _ => profile_of(&m.profile).map_or(1, |p| p.max_batch()),
    }
}

/// The wire form of a profile.
/// The models of `w` as the scheduler serves them (ids in workload order).
pub fn model_infos(w: &crate::workload::Workload) -> Vec<crate::wire::ModelInfo> {
    w.models
        .iter()
        .enumerate()
        .map(|(i, m)| crate::wire::ModelInfo {
            id: ModelId(i as u32),
            name: m.spec.name.clone(),
            slo: m.spec.slo,
            profile: wire_profile(&m.spec.profile),
            input_bytes: m.input_bytes,
            meta_json: m
                .meta
                .as_ref()
                .map(|x| serde_json::to_string(x).expect("metadata serializes"))
                .unwrap_or_default(),
        })
        .collect()
}

pub fn wire_profile(p: &LatencyProfile) -> WireProfile {
    match p {
        LatencyProfile::Linear {
            alpha,
            beta,
            max_batch,
        } => WireProfile::Linear {
            alpha_ns: alpha.0,
            beta_ns: beta.0,
            max_batch: *max_batch,
        },
        LatencyProfile::Table { lat } => WireProfile::Table {
            lat_ns: lat.iter().map(|d| d.0).collect(),
        },
    }
}

/// A fast 64-bit checksum of `bytes`: XXH3-64 with seed 0, at memory speed
/// (`fermata bench copy` prints it). A change to any byte or to the length
/// changes it but for a chance of 2^-64. Not cryptographic.
pub fn checksum64(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The emulated GPU's output for `input`: its length and [`checksum64`] (16 bytes,
/// LE).
pub fn emulated_output(input: &[u8]) -> Vec<u8> {
    let mut o = Vec::with_capacity(16);
    o.extend_from_slice(&(input.len() as u64).to_le_bytes());
    o.extend_from_slice(&checksum64(input).to_le_bytes());
    o
}

/// A GPU emulated by waiting: each batch takes exactly l(b) of wall time.
///
/// It sleeps until `spin` (30 us) before the end and spins the rest, so that many
/// emulated GPUs can share a few cores (a pure spin would need a core per GPU) while
/// finishing within microseconds of l(b); the backend sets its GPU threads' timer
/// slack to 1 ns so the sleep ends on time.
///
/// With slowdowns ([`EmulatedGpu::slowed`], `--emulated-slowdown`), a model's
/// batches take their l(b) times the factor in force.
pub struct EmulatedGpu {
    profiles: HashMap<ModelId, LatencyProfile>,
    spin: Duration,
    slow: Option<std::sync::Arc<slowdown::Slowdowns>>,
    /// The names of the models loaded, for the slowdowns.
    names: HashMap<ModelId, String>,
}

impl EmulatedGpu {
    pub fn new() -> EmulatedGpu {
        EmulatedGpu {
            profiles: HashMap::new(),
            spin: Duration::from_micros(30),
            slow: None,
            names: HashMap::new(),
        }
    }

    /// An emulated GPU whose models' batches follow `slow`.
    pub fn slowed(slow: std::sync::Arc<slowdown::Slowdowns>) -> EmulatedGpu {
        EmulatedGpu {
            slow: (!slow.is_empty()).then_some(slow),
            ..EmulatedGpu::new()
        }
    }
}

/// The emulated executor's factory with `slow` (`--emulated-slowdown`;
/// `FERMATA_FAULT` applies as in [`executor_factory_on`]).
pub fn emulated_factory_slowed(slow: slowdown::Slowdowns) -> anyhow::Result<ExecutorFactory> {
    let slow = std::sync::Arc::new(slow);
    with_faults(Box::new(move |_| {
        Ok(Box::new(EmulatedGpu::slowed(slow.clone())))
    }))
}

impl Default for EmulatedGpu {
    fn default() -> Self {
        EmulatedGpu::new()
    }
}

/// The emulated GPU's [`Loader`]: reads the model's profile.
struct EmulatedLoader;

impl Loader for EmulatedLoader {
    fn prepare(&self, model: &ModelInfo) -> anyhow::Result<Prepared> {
        Ok(Box::new(profile_of(&model.profile)?))
    }
}

impl Executor for EmulatedGpu {
    fn name(&self) -> &'static str {
        "emulated"
    }
    fn load(&mut self, model: &ModelInfo) -> anyhow::Result<()> {
        let p = EmulatedLoader.prepare(model)?;
        self.install(model, p)
    }
    fn unload(&mut self, model: ModelId) {
        self.profiles.remove(&model);
        self.names.remove(&model);
    }
    fn loader(&self) -> Option<std::sync::Arc<dyn Loader>> {
        Some(std::sync::Arc::new(EmulatedLoader))
    }
    fn install(&mut self, model: &ModelInfo, prepared: Prepared) -> anyhow::Result<()> {
        let p = prepared.downcast::<LatencyProfile>().map_err(|_| {
            anyhow::anyhow!("model `{}`: not prepared by this executor", model.name)
        })?;
        self.profiles.insert(model.id, *p);
        self.names.insert(model.id, model.name.clone());
        Ok(())
    }
    fn run(&mut self, model: ModelId, inputs: &[&[u8]]) -> anyhow::Result<Vec<Vec<u8>>> {
        let t0 = Instant::now();
        let Some(p) = self.profiles.get(&model) else {
            anyhow::bail!("model {model} is not loaded on this GPU");
        };
        let n = inputs.len() as u32;
        if n > p.max_batch() {
            anyhow::bail!(
                "batch of {n} exceeds the model's max batch {}",
                p.max_batch()
            );
        }
        let k = match (&self.slow, self.names.get(&model)) {
            (Some(s), Some(name)) => s.factor(name, t0),
            _ => 1.0,
        };
        let end = t0
            + Duration::from_nanos(if n == 0 {
                0
            } else {
                (p.latency(n).0.max(0) as f64 * k) as u64
            });
        let out = inputs.iter().map(|i| emulated_output(i)).collect();
        let now = Instant::now();
        if end > now + self.spin {
            std::thread::sleep(end - now - self.spin);
        }
        while Instant::now() < end {
            std::hint::spin_loop();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_device_lists() {
        assert_eq!(parse_cuda_devices("0,2").unwrap(), vec![0, 2]);
        assert_eq!(parse_cuda_devices(" 3 ").unwrap(), vec![3]);
        for (bad, why) in [
            ("0,0", "listed twice"),
            ("0,x", "not a CUDA device id"),
            ("", "not a CUDA device id"),
        ] {
            let e = parse_cuda_devices(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let e = executor_factory_on("emulated", std::path::Path::new("."), Some(vec![0]))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("goes with --executor cuda"), "{e}");
    }

    #[test]
    fn emulated_takes_l_of_b() {
        let mut g = EmulatedGpu::new();
        let m = ModelInfo {
            id: ModelId(3),
            name: "m".into(),
            slo: Dur(100_000_000),
            profile: WireProfile::Linear {
                alpha_ns: 1_000_000,
                beta_ns: 2_000_000,
                max_batch: 8,
            },
            input_bytes: 4,
            meta_json: String::new(),
        };
        g.load(&m).unwrap();
        let t = Instant::now();
        let out = g.run(ModelId(3), &[b"abcd", b"efgh"]).unwrap();
        let el = t.elapsed();
        assert!(el >= Duration::from_millis(4), "{el:?}");
        assert_eq!(out[0], emulated_output(b"abcd"));
        assert_ne!(out[0], out[1]);
        assert!(g.run(ModelId(4), &[b"x"]).is_err());
        // Every byte matters, wherever it is; XXH3-64 as specified.
        assert_eq!(checksum64(b""), 0x2D06_8005_38D3_94C2);
        let a = vec![7u8; 150_528];
        for i in [0, 31, 32, 63, 64, 100_000, 150_527] {
            let mut b = a.clone();
            b[i] ^= 1;
            assert_ne!(checksum64(&a), checksum64(&b), "byte {i}");
        }
        // In a tail shorter than a stripe too, and the length.
        let c = vec![7u8; 1000];
        for i in [959, 960, 999] {
            let mut d = c.clone();
            d[i] ^= 0x80;
            assert_ne!(checksum64(&c), checksum64(&d), "tail byte {i}");
        }
        assert_ne!(checksum64(&c), checksum64(&c[..999]));
        assert!(g.run(ModelId(3), &[&b"x"[..]; 9]).is_err());
        assert_eq!(
            profile_of(&wire_profile(&profile_of(&m.profile).unwrap())).unwrap(),
            profile_of(&m.profile).unwrap()
        );
    }
}
