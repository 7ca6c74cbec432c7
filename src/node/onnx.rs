//! The ONNX Runtime executor: runs real models (`models/NAME.onnx`) with ONNX
//! Runtime's CPU provider (kind `onnx`) or, with the `cuda` cargo feature, its CUDA
//! provider (kind `cuda`, see [`cuda`]).
//!
//! # Where ONNX Runtime comes from
//! Fermata does not link ONNX Runtime; it loads `libonnxruntime.so` once per process
//! at run time (the `ort` crate's `load-dynamic`), from, in order:
//!
//! 1. `ORT_DYLIB_PATH`, when set;
//! 2. `.deps/py/onnxruntime/capi/libonnxruntime.so*` (what `scripts/setup.sh`
//!    installs from the pinned `onnxruntime` wheel), looked up in the current
//!    directory and in every ancestor of the executable's directory (so
//!    `target/release/fermata` finds the checkout's `.deps`).
//!
//! It must be ONNX Runtime 1.31 or newer (the C API version `ort` 2.0.0-rc.15 uses).
//!
//! # Batches and bytes
//! A request is one sample; its bytes are each input tensor's raw little-endian
//! sample bytes concatenated in the order of the metadata's `inputs`
//! ([`crate::repo`]). The pulled inputs of a batch sit in separate buffers (one
//! region slot each), while ONNX Runtime wants one contiguous `[b, ...]` tensor per
//! input, so [`OnnxModel::run`] does exactly **one gather copy** of each request's
//! bytes, into a buffer per input tensor that is allocated once at load (for
//! `max_batch` samples) and reused. The tensor handed to ONNX Runtime is a view of
//! that buffer (`CreateTensorWithDataAsOrtValue`), not a further copy. Outputs are
//! allocated by ONNX Runtime; each request's slice of each output is copied once
//! into that request's output bytes (the executor interface returns one `Vec<u8>`
//! per request).

use super::exec::Executor;
use crate::repo::{DType, ModelMeta};
use crate::wire::ModelInfo;
use anyhow::{anyhow, bail, Context, Result};
use ort::environment::Environment;
use ort::memory::MemoryInfo;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{
    DynTensorValueType, DynValueTypeMarker, Shape, TensorElementType, TensorRefMut, ValueRefMut,
    ValueType,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[cfg(feature = "cuda")]
pub mod cuda;

/// What to do when ONNX Runtime cannot be found or loaded.
pub const ORT_SETUP_HINT: &str = "run scripts/setup.sh (it installs the onnxruntime wheel into \
     .deps/py) or set ORT_DYLIB_PATH to a libonnxruntime.so of ONNX Runtime 1.31 or newer";

/// Where the setup script puts the library, relative to the checkout.
const DEPS_CAPI: &str = ".deps/py/onnxruntime/capi";

/// Environment variable: intra-op threads of each ONNX Runtime session (default 1:
/// every "GPU" of a backend already has its own worker thread).
pub const THREADS_ENV: &str = "FERMATA_ORT_THREADS";

/// The `libonnxruntime.so*` in `dir`, if any: the unversioned name if present,
/// else the highest version.
fn dylib_in(dir: &Path) -> Option<PathBuf> {
    let rd = std::fs::read_dir(dir).ok()?;
    let mut found: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == "libonnxruntime.so" || n.starts_with("libonnxruntime.so."))
        })
        .collect();
    // "libonnxruntime.so" sorts first; then versions, compared numerically.
    found.sort_by_key(|p| {
        let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let v: Vec<u64> = n
            .trim_start_matches("libonnxruntime.so")
            .split('.')
            .filter_map(|x| x.parse().ok())
            .collect();
        (n != "libonnxruntime.so", std::cmp::Reverse(v))
    });
    found.into_iter().next()
}

/// Finds `libonnxruntime.so` (see the module docs for the order).
pub fn find_ort_dylib() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!(
                "ONNX Runtime not found: ORT_DYLIB_PATH is {} but that is not a file; {ORT_SETUP_HINT}",
                p.display()
            );
        }
        return Ok(p);
    }
    let mut bases: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        bases.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        bases.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    bases.dedup();
    for b in &bases {
        if let Some(p) = dylib_in(&b.join(DEPS_CAPI)) {
            return Ok(p);
        }
    }
    bail!(
        "ONNX Runtime not found: no {DEPS_CAPI}/libonnxruntime.so* in the current directory or \
         above the executable ({}); {ORT_SETUP_HINT}",
        bases
            .iter()
            .map(|b| b.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

static ENV: OnceLock<std::result::Result<Environment, String>> = OnceLock::new();

/// The process's ONNX Runtime environment: the library is found and loaded, and
/// the environment created, on the first call; later calls return the same one
/// (or the same error).
pub fn ort_environment() -> Result<Environment> {
    ENV.get_or_init(|| {
        let path = find_ort_dylib().map_err(|e| format!("{e:#}"))?;
        let builder = ort::init_from(&path).map_err(|e| {
            format!(
                "cannot load ONNX Runtime from {}: {e}; {ORT_SETUP_HINT}",
                path.display()
            )
        })?;
        builder
            .with_name("fermata")
            .with_telemetry(false)
            .build()
            .map_err(|e| format!("cannot create the ONNX Runtime environment: {e}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// The ONNX element type of a KServe datatype.
pub fn element_type(d: DType) -> TensorElementType {
    match d {
        DType::Bool => TensorElementType::Bool,
        DType::U8 => TensorElementType::Uint8,
        DType::I8 => TensorElementType::Int8,
        DType::I32 => TensorElementType::Int32,
        DType::I64 => TensorElementType::Int64,
        DType::F16 => TensorElementType::Float16,
        DType::F32 => TensorElementType::Float32,
        DType::F64 => TensorElementType::Float64,
    }
}

/// Where a session runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// ONNX Runtime's CPU provider.
    Cpu,
    /// ONNX Runtime's CUDA provider on this CUDA device (feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(u32),
}

/// Session settings.
#[derive(Debug, Clone)]
pub struct OnnxOptions {
    /// Where `NAME.onnx` files are.
    pub models_dir: PathBuf,
    /// Intra-op threads per session (the CPU provider's parallelism).
    pub intra_threads: usize,
    pub device: Device,
}

impl OnnxOptions {
    /// CPU sessions; intra-op threads from `FERMATA_ORT_THREADS` (default 1).
    pub fn cpu(models_dir: &Path) -> Result<OnnxOptions> {
        Ok(OnnxOptions {
            models_dir: models_dir.to_path_buf(),
            intra_threads: threads_from_env()?,
            device: Device::Cpu,
        })
    }
}

/// `FERMATA_ORT_THREADS`, or 1.
pub fn threads_from_env() -> Result<usize> {
    match std::env::var(THREADS_ENV) {
        Err(_) => Ok(1),
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => bail!("{THREADS_ENV} must be a number of threads in 1..=256, got {s:?}"),
        },
    }
}

/// The reused, contiguous host buffer of one input tensor, sized for `max_batch`
/// samples. 8-byte aligned (any element type can be viewed in place).
enum HostBuf {
    Heap(Vec<u64>),
    /// Page-locked memory from the CUDA driver, so the provider's host-to-device
    /// copy is a plain DMA (feature `cuda`).
    #[cfg(feature = "cuda")]
    Pinned(cudarc::driver::PinnedHostSlice<u8>),
}

impl HostBuf {
    fn heap(bytes: usize) -> HostBuf {
        HostBuf::Heap(vec![0u64; bytes.div_ceil(8).max(1)])
    }
    fn as_mut_bytes(&mut self) -> Result<&mut [u8]> {
        match self {
            HostBuf::Heap(v) => {
                let len = v.len() * 8;
                // SAFETY: any u64 memory is valid as bytes; the slice borrows `v`.
                Ok(unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) })
            }
            #[cfg(feature = "cuda")]
            HostBuf::Pinned(p) => p
                .as_mut_slice()
                .map_err(|e| anyhow!("pinned input buffer: {e:?}")),
        }
    }
}

/// A tensor view of an input buffer (see [`InputPlan::views`]).
type View = ValueRefMut<'static, DynValueTypeMarker>;

/// One input tensor of a loaded model, in the session's input order.
struct InputPlan {
    name: String,
    dtype: DType,
    /// Its bytes' offset in a request's bytes, and their length.
    offset: usize,
    sample_bytes: usize,
    sample_shape: Vec<i64>,
    /// `views[b]`: the ONNX Runtime tensor `[b, sample_shape...]` over the first b
    /// samples of `buf`, made at the first batch of b and reused, so a run only
    /// gathers bytes. Declared before `buf`: dropped before the memory it views
    /// (which never moves: it is allocated once, at load).
    views: Vec<Option<View>>,
    buf: HostBuf,
}

/// One output tensor, in the metadata's order (a request's output layout).
struct OutputPlan {
    name: String,
    dtype: DType,
    sample_bytes: usize,
    sample_shape: Vec<i64>,
}

/// One model opened in an ONNX Runtime session, ready to run batches.
pub struct OnnxModel {
    pub meta: ModelMeta,
    session: Session,
    inputs: Vec<InputPlan>,
    outputs: Vec<OutputPlan>,
    mem: MemoryInfo<'static>,
    /// CUDA events around each batch on the provider's stream (after `session`,
    /// which uses the stream, so it is dropped after it).
    #[cfg(feature = "cuda")]
    timer: Option<cuda::BatchTimer>,
}

fn dims_match(session: &[i64], meta: &[i64]) -> bool {
    // The session's dims: -1 where dynamic (any size is fine, the batch must be).
    session.len() == meta.len()
        && session[0] == -1
        && session[1..]
            .iter()
            .zip(&meta[1..])
            .all(|(&s, &m)| s == -1 || s == m)
}

fn tensor_of(vt: &ValueType) -> Option<(TensorElementType, Vec<i64>)> {
    match vt {
        ValueType::Tensor { ty, shape, .. } => Some((*ty, shape.iter().copied().collect())),
        _ => None,
    }
}

impl OnnxModel {
    /// Opens `file` with its metadata `meta` and checks that the session's inputs
    /// and outputs are exactly the metadata's (names, element types, shapes with a
    /// dynamic batch dimension); an error names the tensor that differs.
    pub fn open(file: &Path, meta: &ModelMeta, opts: &OnnxOptions) -> Result<OnnxModel> {
        meta.validate()
            .with_context(|| format!("model `{}`: bad metadata", meta.name))?;
        if !file.is_file() {
            bail!(
                "model `{}`: no ONNX file {} (is --models the right directory?)",
                meta.name,
                file.display()
            );
        }
        let env = ort_environment()?;
        let e = |what: &str| {
            let what = what.to_string();
            move |err: ort::Error<ort::session::builder::SessionBuilder>| {
                anyhow!("model `{}`: {what}: {err}", meta.name)
            }
        };
        let b = Session::builder(&env)
            .map_err(|err| anyhow!("model `{}`: session builder: {err}", meta.name))?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(e("optimization level"))?
            .with_intra_threads(opts.intra_threads)
            .map_err(e("intra-op threads"))?
            .with_inter_threads(1)
            .map_err(e("inter-op threads"))?
            .with_parallel_execution(false)
            .map_err(e("sequential execution"))?;
        // The CUDA timer's stream becomes the provider's compute stream, so its
        // events bracket the batch's work; it must outlive the session (it is
        // declared after it in `OnnxModel`).
        #[cfg(feature = "cuda")]
        let timer = match opts.device {
            Device::Cuda(gpu) => Some(cuda::BatchTimer::new(gpu)?),
            Device::Cpu => None,
        };
        let (mut b, mem) = match opts.device {
            Device::Cpu => (b, MemoryInfo::default()),
            #[cfg(feature = "cuda")]
            Device::Cuda(gpu) => {
                let t = timer.as_ref().expect("a timer for CUDA");
                let b = cuda::with_cuda_provider(b, gpu, t)
                    .with_context(|| format!("model `{}`", meta.name))?;
                (b, cuda::pinned_memory_info()?)
            }
        };
        let session = b.commit_from_file(file).map_err(|err| {
            anyhow!(
                "model `{}`: cannot open {}: {err}",
                meta.name,
                file.display()
            )
        })?;

        // Inputs: the same set of names, each with the metadata's type and shape.
        let mut offsets = HashMap::new();
        let mut off = 0;
        for t in &meta.inputs {
            offsets.insert(t.name.as_str(), (off, t));
            off += t.sample_bytes();
        }
        let mut inputs = Vec::new();
        for o in session.inputs() {
            let Some(&(offset, t)) = offsets.get(o.name()) else {
                bail!(
                    "model `{}`: the ONNX file has input `{}` that the metadata does not list (it lists: {})",
                    meta.name,
                    o.name(),
                    meta.inputs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
                );
            };
            let Some((ty, shape)) = tensor_of(o.dtype()) else {
                bail!(
                    "model `{}`: input `{}` is not a tensor",
                    meta.name,
                    o.name()
                );
            };
            if ty != element_type(t.datatype) {
                bail!(
                    "model `{}`: input `{}` is {ty:?} in the ONNX file but {} in the metadata",
                    meta.name,
                    t.name,
                    t.datatype.kserve_name()
                );
            }
            if !dims_match(&shape, &t.shape) {
                bail!(
                    "model `{}`: input `{}` has shape {shape:?} in the ONNX file but {:?} in the \
                     metadata (the first dimension must be a dynamic batch)",
                    meta.name,
                    t.name,
                    t.shape
                );
            }
            let max_bytes = t.sample_bytes() * meta.max_batch as usize;
            let buf = match opts.device {
                Device::Cpu => HostBuf::heap(max_bytes),
                #[cfg(feature = "cuda")]
                Device::Cuda(gpu) => cuda::pinned_buffer(gpu, max_bytes)?,
            };
            inputs.push(InputPlan {
                name: t.name.clone(),
                dtype: t.datatype,
                offset,
                sample_bytes: t.sample_bytes(),
                sample_shape: t.sample_shape().to_vec(),
                views: (0..=meta.max_batch).map(|_| None).collect(),
                buf,
            });
        }
        if let Some(t) = meta
            .inputs
            .iter()
            .find(|t| !session.inputs().iter().any(|o| o.name() == t.name))
        {
            bail!(
                "model `{}`: the metadata lists input `{}` but the ONNX file has no such input (it has: {})",
                meta.name,
                t.name,
                session.inputs().iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
            );
        }
        // Outputs: every metadata output must be a session output of that type.
        let mut outputs = Vec::new();
        for t in &meta.outputs {
            let Some(o) = session.outputs().iter().find(|o| o.name() == t.name) else {
                bail!(
                    "model `{}`: the metadata lists output `{}` but the ONNX file has no such output (it has: {})",
                    meta.name,
                    t.name,
                    session.outputs().iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
                );
            };
            let Some((ty, shape)) = tensor_of(o.dtype()) else {
                bail!("model `{}`: output `{}` is not a tensor", meta.name, t.name);
            };
            if ty != element_type(t.datatype) {
                bail!(
                    "model `{}`: output `{}` is {ty:?} in the ONNX file but {} in the metadata",
                    meta.name,
                    t.name,
                    t.datatype.kserve_name()
                );
            }
            // An output's shape may be unknown to the file (-1s); a known rank or
            // dimension must agree. The real shape is checked on every run.
            if !shape.is_empty() && !dims_match(&shape, &t.shape) {
                bail!(
                    "model `{}`: output `{}` has shape {shape:?} in the ONNX file but {:?} in the metadata",
                    meta.name,
                    t.name,
                    t.shape
                );
            }
            outputs.push(OutputPlan {
                name: t.name.clone(),
                dtype: t.datatype,
                sample_bytes: t.sample_bytes(),
                sample_shape: t.sample_shape().to_vec(),
            });
        }
        Ok(OnnxModel {
            meta: meta.clone(),
            session,
            inputs,
            outputs,
            mem,
            #[cfg(feature = "cuda")]
            timer,
        })
    }

    /// With the CUDA provider: the last batch's time on the device (ms), measured
    /// with CUDA events on the provider's stream (host-to-device copies, kernels,
    /// device-to-host copies). None on the CPU provider.
    pub fn last_device_ms(&self) -> Option<f64> {
        #[cfg(feature = "cuda")]
        if let Some(t) = &self.timer {
            return t.last_ms();
        }
        None
    }

    /// The session, for callers that run it directly (the overhead benchmark).
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Runs one batch: each request's bytes gathered once into the input tensors,
    /// one session run, each output split per request.
    pub fn run(&mut self, requests: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let n = requests.len();
        let name = &self.meta.name;
        if n == 0 {
            return Ok(Vec::new());
        }
        if n > self.meta.max_batch as usize {
            bail!(
                "model `{name}`: batch of {n} exceeds its max batch {}",
                self.meta.max_batch
            );
        }
        let want = self.meta.input_bytes();
        if let Some((i, r)) = requests.iter().enumerate().find(|(_, r)| r.len() != want) {
            bail!(
                "model `{name}`: request {i} of the batch has {} input bytes; the model takes {want} \
                 (its inputs' sample bytes, concatenated in metadata order)",
                r.len()
            );
        }
        // Gather: the only copy of the inputs.
        for p in &mut self.inputs {
            let sb = p.sample_bytes;
            let dst = p.buf.as_mut_bytes()?;
            for (k, r) in requests.iter().enumerate() {
                dst[k * sb..(k + 1) * sb].copy_from_slice(&r[p.offset..p.offset + sb]);
            }
        }
        for p in &mut self.inputs {
            if p.views[n].is_none() {
                let mut dims = Vec::with_capacity(1 + p.sample_shape.len());
                dims.push(n as i64);
                dims.extend_from_slice(&p.sample_shape);
                let ptr = p.buf.as_mut_bytes()?.as_mut_ptr();
                // SAFETY: `ptr` points to max_batch * sample_bytes >= n * sample_bytes
                // bytes, 8-byte aligned, that never move and outlive the view (see
                // `InputPlan::views`); they are written only between runs.
                let v = unsafe { tensor_view(&self.mem, p.dtype, ptr, Shape::new(dims)) }
                    .map_err(|e| anyhow!("model `{name}`: input `{}`: {e}", p.name))?;
                p.views[n] = Some(v);
            }
        }
        let values: Vec<SessionInputValue<'_>> = self
            .inputs
            .iter()
            .map(|p| SessionInputValue::from(&**p.views[n].as_ref().expect("made above")))
            .collect();
        #[cfg(feature = "cuda")]
        if let Some(t) = &mut self.timer {
            t.start()?;
        }
        let outs = self
            .session
            .run(&values[..])
            .map_err(|e| anyhow!("model `{name}`: ONNX Runtime run failed: {e}"))?;
        #[cfg(feature = "cuda")]
        if let Some(t) = &mut self.timer {
            t.stop()?;
        }
        let per_request = self.meta.output_bytes();
        let mut res: Vec<Vec<u8>> = (0..n).map(|_| Vec::with_capacity(per_request)).collect();
        for o in &self.outputs {
            let v = outs.get(&o.name).ok_or_else(|| {
                anyhow!("model `{name}`: the run returned no output `{}`", o.name)
            })?;
            let t = v
                .view()
                .downcast::<DynTensorValueType>()
                .map_err(|e| anyhow!("model `{name}`: output `{}`: {e}", o.name))?;
            let expect = || std::iter::once(n as i64).chain(o.sample_shape.iter().copied());
            let good = match t.dtype() {
                ValueType::Tensor { ty, shape, .. } => {
                    *ty == element_type(o.dtype) && shape.iter().copied().eq(expect())
                }
                _ => false,
            };
            if !good {
                bail!(
                    "model `{name}`: output `{}` came back as {:?}; the metadata says {} {:?}",
                    o.name,
                    t.dtype(),
                    o.dtype.kserve_name(),
                    expect().collect::<Vec<_>>()
                );
            }
            if !t.memory_info().is_cpu_accessible() {
                bail!("model `{name}`: output `{}` is not in host memory", o.name);
            }
            let sb = o.sample_bytes;
            // SAFETY: a CPU-accessible tensor of n * sample elements of this type,
            // alive while `outs` is.
            let bytes = unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<u8>(), n * sb) };
            for (k, r) in res.iter_mut().enumerate() {
                r.extend_from_slice(&bytes[k * sb..(k + 1) * sb]);
            }
        }
        Ok(res)
    }
}

/// A tensor of `dtype` with `shape` viewing the memory at `ptr` (no copy).
///
/// # Safety
/// `ptr` must be valid for `shape`'s elements of `dtype`, aligned for it, described
/// by `mem`, and outlive the returned value.
unsafe fn tensor_view(
    mem: &MemoryInfo<'static>,
    dtype: DType,
    ptr: *mut u8,
    shape: Shape,
) -> ort::Result<View> {
    macro_rules! view {
        ($t:ty) => {
            unsafe { TensorRefMut::<'static, $t>::from_raw(mem.clone(), ptr.cast(), shape) }
                .map(|v| v.into_dyn())
        };
    }
    match dtype {
        DType::Bool => view!(bool),
        DType::U8 => view!(u8),
        DType::I8 => view!(i8),
        DType::I32 => view!(i32),
        DType::I64 => view!(i64),
        DType::F16 => view!(half::f16),
        DType::F32 => view!(f32),
        DType::F64 => view!(f64),
    }
}

/// The `onnx` (and `cuda`) executor: one ONNX Runtime session per loaded model.
/// One executor per backend "GPU"; used by that GPU's worker thread only.
pub struct OnnxExecutor {
    opts: OnnxOptions,
    models: HashMap<u32, OnnxModel>,
}

impl OnnxExecutor {
    /// Loads ONNX Runtime (once per process) so a missing library is reported when
    /// the backend starts, not at the first model.
    pub fn new(opts: OnnxOptions) -> Result<OnnxExecutor> {
        ort_environment()?;
        Ok(OnnxExecutor {
            opts,
            models: HashMap::new(),
        })
    }

    /// The model's file: `models_dir/NAME.onnx`.
    pub fn model_file(&self, name: &str) -> PathBuf {
        self.opts.models_dir.join(format!("{name}.onnx"))
    }

    /// The loaded model with the scheduler's id `id`.
    pub fn model_mut(&mut self, id: u32) -> Option<&mut OnnxModel> {
        self.models.get_mut(&id)
    }
}

impl Executor for OnnxExecutor {
    fn name(&self) -> &'static str {
        match self.opts.device {
            Device::Cpu => "onnx",
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => "cuda",
        }
    }

    fn load(&mut self, model: &ModelInfo) -> Result<()> {
        let meta = match model.meta() {
            None => bail!(
                "model `{}` has no metadata (tensors, dtypes); the {} executor runs only models \
                 from a model repository (fermata serve/scheduler with --models DIR)",
                model.name,
                self.name()
            ),
            Some(Err(e)) => bail!("model `{}`: bad metadata: {e}", model.name),
            Some(Ok(m)) => m,
        };
        if meta.name != model.name {
            bail!(
                "model `{}`: its metadata is for `{}`",
                model.name,
                meta.name
            );
        }
        if meta.input_bytes() != model.input_bytes as usize {
            bail!(
                "model `{}`: the scheduler sends {} input bytes per request but the metadata makes {}",
                model.name,
                model.input_bytes,
                meta.input_bytes()
            );
        }
        let file = self.model_file(&model.name);
        let m = OnnxModel::open(&file, &meta, &self.opts)?;
        self.models.insert(model.id, m);
        Ok(())
    }

    fn unload(&mut self, model: u32) {
        self.models.remove(&model);
    }

    fn run(&mut self, model: u32, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let Some(m) = self.models.get_mut(&model) else {
            bail!("model {model} is not loaded on this GPU");
        };
        m.run(inputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dylib_choice_prefers_unversioned_then_newest() {
        let dir = std::env::temp_dir().join(format!("fermata-ortlib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(dylib_in(&dir), None);
        for n in [
            "libonnxruntime.so.1.9.0",
            "libonnxruntime.so.1.31.1",
            "libonnxruntime_providers_shared.so",
        ] {
            std::fs::write(dir.join(n), b"").unwrap();
        }
        assert_eq!(dylib_in(&dir), Some(dir.join("libonnxruntime.so.1.31.1")));
        std::fs::write(dir.join("libonnxruntime.so"), b"").unwrap();
        assert_eq!(dylib_in(&dir), Some(dir.join("libonnxruntime.so")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shapes_must_agree_and_batch_be_dynamic() {
        assert!(dims_match(&[-1, 64], &[-1, 64]));
        assert!(dims_match(&[-1, -1], &[-1, 64]));
        assert!(!dims_match(&[1, 64], &[-1, 64]));
        assert!(!dims_match(&[-1, 32], &[-1, 64]));
        assert!(!dims_match(&[-1, 64, 1], &[-1, 64]));
    }
}
