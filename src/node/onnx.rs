//! The ONNX Runtime executor: runs real models (`models/NAME.onnx`) with ONNX
//! Runtime's CPU provider (kind `onnx`) or, with the `cuda` cargo feature, its CUDA
//! provider (kind `cuda`, see [`cuda`]). A model opened is an [`OnnxModel`]; a
//! backend GPU's models are its [`OnnxExecutor`] (`executor.rs`), which opens
//! and frees them off the GPU's worker thread.
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
//! ([`crate::repo`]). ONNX Runtime wants one contiguous `[b, ...]` tensor per
//! input. A model whose request is one input tensor is *staged*
//! ([`OnnxModel::stage_layout`], [`crate::node::exec::stage`]): the backend's
//! puller copies each request straight into its row of a buffer the executor
//! lends (page-locked for `cuda`), and [`OnnxModel::run_staged`] hands that
//! buffer to ONNX Runtime as the batch's tensor, with no further copy.
//! Otherwise (several input tensors, or `cuda` with `FERMATA_CUDA_STAGE=0`,
//! whose tensors are then its pinned buffers) the pulled
//! inputs sit in separate buffers (one region slot each), and
//! [`OnnxModel::run`] does exactly **one gather copy** of each request's
//! bytes, into a buffer per input tensor that is allocated once at load (for
//! `max_batch` samples) and reused. Either way the tensor handed to ONNX
//! Runtime is a view of that buffer (`CreateTensorWithDataAsOrtValue`), not a
//! further copy. Outputs are allocated by ONNX Runtime; each request's slice of
//! each output is copied once into that request's output bytes (the executor
//! interface returns one `Vec<u8>` per request).
//!
//! # Shape-stable execution
//! ONNX Runtime's CUDA kernels keep their tuned state (cuDNN's convolution
//! algorithms above all) for the last input shape only, so a session whose batch
//! size changes from run to run is one to two orders of magnitude slower than one
//! that always sees the same shape. A model is therefore run in *buckets* of batch
//! sizes ([`crate::repo::BucketPolicy`]): one session per bucket, its batch
//! dimension fixed to the bucket's size (`AddFreeDimensionOverrideByName`), and a
//! batch of b runs in the smallest bucket >= b, padded. The padding rows of the
//! input buffer hold whatever the buffer held (zeros, or earlier requests of this
//! model); their outputs are dropped, and each request gets exactly its own row.
//! The sessions of one model share its weights ([`proto`]: the file's
//! floating-point initializers are read once and handed to every session with
//! `AddInitializer`, in device memory on a GPU) and, on a GPU, one memory arena
//! registered with the environment, so N buckets cost about one session's memory
//! ([`Sharing`]).

use crate::repo::{BucketPolicy, DType, ModelMeta, TensorMeta};
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
mod executor;
pub mod gpulibs;
pub mod proto;
pub use executor::OnnxExecutor;

/// What to do when ONNX Runtime cannot be found or loaded.
pub const ORT_SETUP_HINT: &str = "run scripts/setup.sh (it installs the onnxruntime wheel into \
     .deps/py) or set ORT_DYLIB_PATH to a libonnxruntime.so of ONNX Runtime 1.31 or newer";

/// Where the setup script puts the library, relative to the checkout.
const DEPS_CAPI: &str = ".deps/py/onnxruntime/capi";

/// Environment variable: intra-op threads of each ONNX Runtime session (default 1:
/// every "GPU" of a backend already has its own worker thread).
pub const THREADS_ENV: &str = "FERMATA_ORT_THREADS";

/// Environment variable: the bucket policy of every model (`auto`, `exact`,
/// `pow2` or a list `1,4,16,64`; default `auto`: the model's `batch_buckets`, else
/// the device's default).
pub const BUCKETS_ENV: &str = "FERMATA_BUCKETS";

/// Environment variable: what the sessions of one model share ([`Sharing`]:
/// `none`, `weights` or `all`, the default).
pub const SHARING_ENV: &str = "FERMATA_ORT_SHARING";

/// Environment variable: `1` or unset makes the `cuda` executor lend page-locked
/// host buffers to its GPU's puller, so a single-tensor model's inputs are pulled
/// straight into the buffer the device copies from ([`crate::node::exec::stage`]);
/// `0`: each batch is gathered into the model's pinned buffer (slower: docs/gpu.md).
pub const CUDA_STAGE_ENV: &str = "FERMATA_CUDA_STAGE";

/// `FERMATA_CUDA_STAGE` (on when unset).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn cuda_stage_from_env() -> Result<bool> {
    parse_cuda_stage(std::env::var(CUDA_STAGE_ENV).ok().as_deref())
}

fn parse_cuda_stage(v: Option<&str>) -> Result<bool> {
    match v.map(str::trim) {
        Some("0") => Ok(false),
        None | Some("") | Some("1") => Ok(true),
        Some(s) => bail!("{CUDA_STAGE_ENV} must be 0 or 1, got {s:?}"),
    }
}

/// What the bucket sessions of one model share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Nothing: each session loads its own weights and has its own arena.
    None,
    /// One copy of the weights (and, on the CPU, of their prepacked forms).
    Weights,
    /// The weights, and on a GPU one memory arena for all sessions on it (they
    /// run one at a time on that GPU's worker, so one arena holds any run).
    All,
}

impl Sharing {
    pub fn parse(s: &str) -> Result<Sharing> {
        match s.trim() {
            "none" => Ok(Sharing::None),
            "weights" => Ok(Sharing::Weights),
            "all" => Ok(Sharing::All),
            other => bail!("sharing must be none, weights or all, got {other:?}"),
        }
    }
}

/// `FERMATA_ORT_SHARING`, or all.
pub fn sharing_from_env() -> Result<Sharing> {
    match std::env::var(SHARING_ENV) {
        Err(_) => Ok(Sharing::All),
        Ok(s) => Sharing::parse(&s).with_context(|| SHARING_ENV.to_string()),
    }
}

/// `FERMATA_BUCKETS`, or auto.
pub fn buckets_from_env() -> Result<BucketPolicy> {
    match std::env::var(BUCKETS_ENV) {
        Err(_) => Ok(BucketPolicy::Auto),
        Ok(s) => BucketPolicy::parse(&s).with_context(|| BUCKETS_ENV.to_string()),
    }
}

/// Set by the `cuda` executor before ONNX Runtime is first loaded: prefer the
/// onnxruntime-gpu library in `.deps/gpu`.
static PREFER_GPU_ORT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks [`find_ort_dylib`] to prefer the onnxruntime-gpu build in `.deps/gpu`
/// (only effective before ONNX Runtime is first loaded).
pub fn prefer_gpu_ort() {
    PREFER_GPU_ORT.store(true, std::sync::atomic::Ordering::Relaxed);
}

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
    if PREFER_GPU_ORT.load(std::sync::atomic::Ordering::Relaxed) {
        if let Some(p) = gpulibs::gpu_ort_dylib() {
            return Ok(p);
        }
    }
    let bases = gpulibs::search_bases();
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
        DType::U16 => TensorElementType::Uint16,
        DType::U32 => TensorElementType::Uint32,
        DType::U64 => TensorElementType::Uint64,
        DType::I8 => TensorElementType::Int8,
        DType::I16 => TensorElementType::Int16,
        DType::I32 => TensorElementType::Int32,
        DType::I64 => TensorElementType::Int64,
        DType::F16 => TensorElementType::Float16,
        DType::BF16 => TensorElementType::Bfloat16,
        DType::F32 => TensorElementType::Float32,
        DType::F64 => TensorElementType::Float64,
        DType::Bytes => TensorElementType::String,
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
    /// Which batch sizes get their own session.
    pub buckets: BucketPolicy,
    /// What a model's sessions share.
    pub sharing: Sharing,
    /// Run every bucket once at load (on a GPU: algorithm selection and arena
    /// growth happen then, not in the first batches served).
    pub warm_up: bool,
}

impl OnnxOptions {
    /// CPU sessions; intra-op threads from `FERMATA_ORT_THREADS` (default 1),
    /// buckets from `FERMATA_BUCKETS` and sharing from `FERMATA_ORT_SHARING`.
    pub fn cpu(models_dir: &Path) -> Result<OnnxOptions> {
        Ok(OnnxOptions {
            models_dir: models_dir.to_path_buf(),
            intra_threads: threads_from_env()?,
            device: Device::Cpu,
            buckets: buckets_from_env()?,
            sharing: sharing_from_env()?,
            warm_up: false,
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
    /// samples of `buf`, made at the first run of shape b and reused, so a run only
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

/// The memory behind one shared initializer (host or device), kept alive for the
/// values that describe it.
enum WeightBuf {
    Host(#[allow(dead_code)] Vec<u64>),
    #[cfg(feature = "cuda")]
    Device(#[allow(dead_code)] cudarc::driver::CudaSlice<u8>),
}

/// One copy of a model's floating-point weights, handed to each of its sessions
/// (see the module docs). The values only describe `_mem`, which outlives them.
struct SharedWeights {
    values: Vec<(String, std::sync::Arc<ort::value::DynValue>)>,
    bytes: usize,
    _mem: Vec<WeightBuf>,
}

/// The ONNX element type of an ONNX `TensorProto.DataType` code (the shared ones).
fn onnx_code_type(code: i32) -> Option<ort::sys::ONNXTensorElementDataType> {
    use ort::sys::ONNXTensorElementDataType as T;
    Some(match code {
        proto::FLOAT => T::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
        proto::FLOAT16 => T::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
        proto::DOUBLE => T::ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE,
        proto::BFLOAT16 => T::ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16,
        _ => return None,
    })
}

/// An ONNX Runtime tensor over memory it does not own (`ptr`, `bytes`), as an
/// owned value (what `AddInitializer` takes: "the buffer must be owned by the
/// user").
///
/// # Safety
/// `ptr` must hold `bytes` bytes described by `mem` and outlive the value.
unsafe fn foreign_tensor(
    mem: &MemoryInfo<'static>,
    ptr: *mut std::ffi::c_void,
    bytes: usize,
    dims: &[i64],
    ty: ort::sys::ONNXTensorElementDataType,
) -> Result<ort::value::DynValue> {
    use ort::AsPointer;
    let api = ort::api();
    let mut out: *mut ort::sys::OrtValue = std::ptr::null_mut();
    // SAFETY: as the caller promises; `out` receives a new value.
    let st = unsafe {
        (api.CreateTensorWithDataAsOrtValue)(
            mem.ptr(),
            ptr,
            bytes,
            dims.as_ptr(),
            dims.len(),
            ty,
            &mut out,
        )
    };
    status(st).context("creating a shared initializer")?;
    let nn =
        std::ptr::NonNull::new(out).ok_or_else(|| anyhow!("ONNX Runtime returned no value"))?;
    // SAFETY: a tensor value we own; the allocator is only kept for its lifetime
    // (ONNX Runtime does not free user-owned data).
    Ok(unsafe { ort::value::DynValue::from_ptr(nn, Some(&ort::memory::Allocator::default())) })
}

/// An `OrtStatus` as a Result (and released).
pub(crate) fn status(st: ort::sys::OrtStatusPtr) -> Result<()> {
    if st.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a non-null status from the API, released once here.
    let msg = unsafe {
        let m = (api.GetErrorMessage)(st.0);
        let s = if m.is_null() {
            "unknown error".to_string()
        } else {
            std::ffi::CStr::from_ptr(m).to_string_lossy().into_owned()
        };
        (api.ReleaseStatus)(st.0);
        s
    };
    bail!("{msg}")
}

impl SharedWeights {
    /// Reads `file`'s shareable initializers and places one copy of each where the
    /// sessions run (host memory, or device memory of the CUDA device).
    fn load(
        file: &Path,
        opts: &OnnxOptions,
        #[allow(unused)] stream: Option<&cuda_stream::Stream>,
    ) -> Result<SharedWeights> {
        let inits = proto::shareable_initializers(file)?;
        let mem = match opts.device {
            Device::Cpu => MemoryInfo::default(),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => cuda::device_memory_info(dev)?,
        };
        let mut w = SharedWeights {
            values: Vec::with_capacity(inits.len()),
            bytes: 0,
            _mem: Vec::with_capacity(inits.len()),
        };
        for i in &inits {
            let ty = onnx_code_type(i.data_type).expect("shareable types only");
            let (buf, ptr) = match opts.device {
                Device::Cpu => {
                    // 8-byte aligned, like the input buffers.
                    let mut b = vec![0u64; i.bytes.len().div_ceil(8)];
                    // SAFETY: `b` has at least i.bytes.len() bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            i.bytes.as_ptr(),
                            b.as_mut_ptr().cast::<u8>(),
                            i.bytes.len(),
                        )
                    };
                    let p = b.as_mut_ptr().cast::<std::ffi::c_void>();
                    (WeightBuf::Host(b), p)
                }
                #[cfg(feature = "cuda")]
                Device::Cuda(_) => {
                    let stream = stream.expect("a CUDA stream for device weights");
                    let (slice, p) = cuda::upload(stream, &i.bytes)
                        .with_context(|| format!("initializer `{}`", i.name))?;
                    (WeightBuf::Device(slice), p)
                }
            };
            // SAFETY: `ptr` holds i.bytes.len() bytes where `mem` says; that memory
            // never moves (a heap or device allocation owned by `buf`) and lives in
            // `_mem`, which outlives the values (and the sessions that hold them).
            let v = unsafe { foreign_tensor(&mem, ptr, i.bytes.len(), &i.dims, ty) }
                .with_context(|| format!("initializer `{}`", i.name))?;
            w.bytes += i.bytes.len();
            w.values.push((i.name.clone(), std::sync::Arc::new(v)));
            w._mem.push(buf);
        }
        Ok(w)
    }
}

/// The CUDA stream type the weights are uploaded on (a placeholder without the
/// `cuda` feature).
mod cuda_stream {
    #[cfg(feature = "cuda")]
    pub type Stream = std::sync::Arc<cudarc::driver::CudaStream>;
    #[cfg(not(feature = "cuda"))]
    pub enum Stream {}
}

/// One model opened in ONNX Runtime sessions, ready to run batches.
pub struct OnnxModel {
    pub meta: ModelMeta,
    /// The bucket sizes, one session each (`sessions[i]` runs shape
    /// `buckets[i]`); empty: one session run at each batch's exact size.
    buckets: Vec<u32>,
    sessions: Vec<Session>,
    inputs: Vec<InputPlan>,
    outputs: Vec<OutputPlan>,
    mem: MemoryInfo<'static>,
    /// The weights the sessions share (after `sessions`: dropped after them).
    shared: Option<SharedWeights>,
    /// Device memory the model took at load (sessions, weights, warmed arena), when
    /// measured (on a GPU).
    device_bytes: Option<u64>,
    /// CUDA events around each batch on the provider's stream (after `sessions`,
    /// which use the stream, so it is dropped after them).
    #[cfg(feature = "cuda")]
    timer: Option<cuda::BatchTimer>,
}

/// Whether a session's input dims fit the metadata's: the same rank, the batch
/// dynamic (-1) or fixed to `batch` (a bucket's session), the rest equal where the
/// session knows them.
fn dims_match_batch(session: &[i64], meta: &[i64], batch: Option<u32>) -> bool {
    session.len() == meta.len()
        && (session[0] == -1 || Some(session[0]) == batch.map(i64::from))
        && session[1..]
            .iter()
            .zip(&meta[1..])
            .all(|(&s, &m)| s == -1 || s == m)
}

#[cfg(test)]
fn dims_match(session: &[i64], meta: &[i64]) -> bool {
    dims_match_batch(session, meta, None)
}

fn tensor_of(vt: &ValueType) -> Option<(TensorElementType, Vec<i64>)> {
    match vt {
        ValueType::Tensor { ty, shape, .. } => Some((*ty, shape.iter().copied().collect())),
        _ => None,
    }
}

/// The symbolic names of the inputs' first (batch) dimension, deduplicated.
fn batch_symbols(session: &Session) -> Vec<String> {
    let mut v: Vec<String> = session
        .inputs()
        .iter()
        .filter_map(|o| match o.dtype() {
            ValueType::Tensor {
                dimension_symbols, ..
            } => dimension_symbols.first().cloned().filter(|s| !s.is_empty()),
            _ => None,
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Checks a model's metadata and file, and returns its bucket sizes (empty:
/// exact shapes).
fn checked_buckets(file: &Path, meta: &ModelMeta, opts: &OnnxOptions) -> Result<Vec<u32>> {
    meta.validate()
        .with_context(|| format!("model `{}`: bad metadata", meta.name))?;
    if !file.is_file() {
        bail!(
            "model `{}`: no ONNX file {} (is --models the right directory?)",
            meta.name,
            file.display()
        );
    }
    let gpu = opts.device != Device::Cpu;
    Ok(opts
        .buckets
        .buckets(meta, gpu)
        .with_context(|| format!("model `{}`: buckets", meta.name))?
        .unwrap_or_default())
}

/// The device's free memory before a model loads (None on the CPU).
fn free_device_memory(device: Device) -> Result<Option<u64>> {
    match device {
        Device::Cpu => Ok(None),
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => Ok(Some(cuda::free_memory(dev)?)),
    }
}

/// The weights a model's bucket sessions share, when they share them (more than
/// one bucket and sharing on).
fn shared_weights(
    file: &Path,
    meta: &ModelMeta,
    opts: &OnnxOptions,
    buckets: usize,
    stream: Option<&cuda_stream::Stream>,
) -> Result<Option<SharedWeights>> {
    if opts.sharing != Sharing::None && buckets > 1 {
        Ok(Some(SharedWeights::load(file, opts, stream).with_context(
            || format!("model `{}`: shared weights", meta.name),
        )?))
    } else {
        Ok(None)
    }
}

/// Whether the bucket sessions use one memory arena registered with the
/// environment (sharing all, on a GPU, with more than one bucket).
fn share_env_arena(
    #[allow(unused)] env: &Environment,
    #[allow(unused)] opts: &OnnxOptions,
    #[allow(unused)] buckets: usize,
) -> bool {
    #[allow(unused_mut)]
    let mut env_arena = false;
    #[cfg(feature = "cuda")]
    if let (Device::Cuda(dev), Sharing::All, true) = (opts.device, opts.sharing, buckets > 1) {
        env_arena = cuda::share_arena(env, dev);
    }
    env_arena
}

/// What the sessions of one model are built from.
struct SessionMaker<'a> {
    env: &'a Environment,
    file: &'a Path,
    meta: &'a ModelMeta,
    opts: &'a OnnxOptions,
    /// The sessions use the environment's (shared) allocators.
    env_arena: bool,
    prepacked: ort::session::builder::PrepackedWeights,
    /// The CUDA provider's stream and its batch timer.
    #[cfg(feature = "cuda")]
    timer: Option<&'a cuda::BatchTimer>,
}

impl SessionMaker<'_> {
    /// One session (exact shapes), or one per bucket (with the shared weights
    /// if ONNX Runtime takes them; else `shared` becomes None).
    fn open_all(
        &self,
        buckets: &[u32],
        shared: &mut Option<SharedWeights>,
    ) -> Result<Vec<Session>> {
        if buckets.is_empty() {
            return Ok(vec![self.make(None, None)?]);
        }
        // The batch dimension's name comes from the file; a session per bucket
        // then fixes it to the bucket's size.
        let syms = self.probe_batch_symbols()?;
        let build = |shared: Option<&SharedWeights>| -> Result<Vec<Session>> {
            buckets
                .iter()
                .map(|&size| self.make(Some((&syms, size)), shared))
                .collect()
        };
        match build(shared.as_ref()) {
            Ok(s) => Ok(s),
            // A model whose weights ONNX Runtime will not take as shared
            // initializers still runs, each session with its own copy.
            Err(e) if shared.is_some() => {
                tracing::warn!(
                    model = %self.meta.name,
                    "cannot share weights between bucket sessions ({e:#}); each loads its own"
                );
                *shared = None;
                build(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The symbols of the file's batch dimension, read with a CPU session with
    /// no optimizations (dropped at once).
    fn probe_batch_symbols(&self) -> Result<Vec<String>> {
        let name = &self.meta.name;
        let mut probe = Session::builder(self.env)
            .map_err(|err| anyhow!("model `{name}`: session builder: {err}"))?
            .with_optimization_level(GraphOptimizationLevel::Disable)
            .map_err(|err| anyhow!("model `{name}`: session builder: {err}"))?
            .with_intra_threads(1)
            .map_err(|err| anyhow!("model `{name}`: session builder: {err}"))?;
        let s = probe
            .commit_from_file(self.file)
            .map_err(|err| self.cannot_open(err))?;
        Ok(batch_symbols(&s))
    }

    /// Opens a session: its batch dimension fixed to a size (the symbols and the
    /// size) or not, with the shared weights or not.
    fn make(
        &self,
        fixed: Option<(&[String], u32)>,
        shared: Option<&SharedWeights>,
    ) -> Result<Session> {
        let e = |what: &str| self.err(what);
        let mut b = self.builder()?;
        if let Some((syms, size)) = fixed {
            for s in syms {
                b = b
                    .with_dimension_override(s, size as i64)
                    .map_err(e("batch dimension override"))?;
            }
        }
        if let Some(sw) = shared {
            for (name, v) in &sw.values {
                b = b
                    .with_initializer(name, v.clone())
                    .map_err(e(&format!("shared initializer `{name}`")))?;
            }
            if self.opts.device == Device::Cpu {
                b = b
                    .with_prepacked_weights(&self.prepacked)
                    .map_err(e("shared prepacked weights"))?;
            }
        }
        if self.env_arena {
            b = b.with_env_allocators().map_err(e("shared arena"))?;
        }
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = self.opts.device {
            let t = self.timer.expect("a timer for CUDA");
            b = cuda::with_cuda_provider(b, dev, t)
                .with_context(|| format!("model `{}`", self.meta.name))?;
        }
        b.commit_from_file(self.file)
            .map_err(|err| self.cannot_open(err))
    }

    /// A session builder with the settings of every session.
    fn builder(&self) -> Result<ort::session::builder::SessionBuilder> {
        let e = |what: &str| self.err(what);
        Session::builder(self.env)
            .map_err(|err| anyhow!("model `{}`: session builder: {err}", self.meta.name))?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(e("optimization level"))?
            .with_intra_threads(self.opts.intra_threads)
            .map_err(e("intra-op threads"))?
            .with_inter_threads(1)
            .map_err(e("inter-op threads"))?
            .with_parallel_execution(false)
            .map_err(e("sequential execution"))
    }

    /// Maps a session builder's error to one that names the model and what
    /// failed.
    fn err(
        &self,
        what: &str,
    ) -> impl FnOnce(ort::Error<ort::session::builder::SessionBuilder>) -> anyhow::Error + '_ {
        let what = what.to_string();
        move |err| anyhow!("model `{}`: {what}: {err}", self.meta.name)
    }

    /// The error of a session that cannot be opened from the file.
    fn cannot_open(&self, err: impl std::fmt::Display) -> anyhow::Error {
        anyhow!(
            "model `{}`: cannot open {}: {err}",
            self.meta.name,
            self.file.display()
        )
    }
}

/// Inputs: the session's inputs must be the metadata's (the same set of names,
/// each with the metadata's type and shape); a plan for each, in session order.
fn input_plans(
    session: &Session,
    meta: &ModelMeta,
    device: Device,
    first_bucket: Option<u32>,
) -> Result<Vec<InputPlan>> {
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
        check_input(meta, o.name(), o.dtype(), t, first_bucket)?;
        inputs.push(InputPlan::new(t, offset, meta.max_batch, device)?);
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
    Ok(inputs)
}

/// Checks that the session's input `name` of type `vt` is a tensor of the
/// metadata's element type and shape `t`.
fn check_input(
    meta: &ModelMeta,
    name: &str,
    vt: &ValueType,
    t: &TensorMeta,
    first_bucket: Option<u32>,
) -> Result<()> {
    let Some((ty, shape)) = tensor_of(vt) else {
        bail!("model `{}`: input `{}` is not a tensor", meta.name, name);
    };
    if ty != element_type(t.datatype) {
        bail!(
            "model `{}`: input `{}` is {ty:?} in the ONNX file but {} in the metadata",
            meta.name,
            t.name,
            t.datatype.kserve_name()
        );
    }
    if !dims_match_batch(&shape, &t.shape, first_bucket) {
        bail!(
            "model `{}`: input `{}` has shape {shape:?} in the ONNX file but {:?} in the \
             metadata (the first dimension must be a dynamic batch)",
            meta.name,
            t.name,
            t.shape
        );
    }
    Ok(())
}

impl InputPlan {
    /// The plan of input `t` (its bytes at `offset` in a request's bytes), with
    /// a buffer for `max_batch` samples (pinned host memory on a GPU).
    fn new(t: &TensorMeta, offset: usize, max_batch: u32, device: Device) -> Result<InputPlan> {
        let max_bytes = t.sample_bytes() * max_batch as usize;
        let buf = match device {
            Device::Cpu => HostBuf::heap(max_bytes),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => cuda::pinned_buffer(dev, max_bytes)?,
        };
        Ok(InputPlan {
            name: t.name.clone(),
            dtype: t.datatype,
            offset,
            sample_bytes: t.sample_bytes(),
            sample_shape: t.sample_shape().to_vec(),
            views: (0..=max_batch).map(|_| None).collect(),
            buf,
        })
    }
}

/// Outputs: every metadata output must be a session output of that type (and,
/// where the file knows it, shape); a plan for each, in metadata order.
fn output_plans(
    session: &Session,
    meta: &ModelMeta,
    first_bucket: Option<u32>,
) -> Result<Vec<OutputPlan>> {
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
        if !shape.is_empty() && !dims_match_batch(&shape, &t.shape, first_bucket) {
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
    Ok(outputs)
}

impl OnnxModel {
    /// Opens `file` with its metadata `meta`: one session (exact shapes) or one per
    /// bucket, and checks that the sessions' inputs and outputs are exactly the
    /// metadata's (names, element types, shapes with a batch dimension); an error
    /// names the tensor that differs.
    pub fn open(file: &Path, meta: &ModelMeta, opts: &OnnxOptions) -> Result<OnnxModel> {
        let buckets = checked_buckets(file, meta, opts)?;
        let env = ort_environment()?;
        // The CUDA timer's stream becomes the provider's compute stream, so its
        // events bracket the batch's work; it must outlive the sessions (it is
        // declared after them in `OnnxModel`).
        #[cfg(feature = "cuda")]
        let timer = match opts.device {
            Device::Cuda(dev) => Some(cuda::BatchTimer::new(dev)?),
            Device::Cpu => None,
        };
        let free_before = free_device_memory(opts.device)?;
        #[cfg(feature = "cuda")]
        let stream = timer.as_ref().map(|t| t.stream());
        #[cfg(not(feature = "cuda"))]
        let stream: Option<cuda_stream::Stream> = None;
        let mut shared = shared_weights(file, meta, opts, buckets.len(), stream.as_ref())?;
        let maker = SessionMaker {
            env: &env,
            file,
            meta,
            opts,
            env_arena: share_env_arena(&env, opts, buckets.len()),
            prepacked: ort::session::builder::PrepackedWeights::new(),
            #[cfg(feature = "cuda")]
            timer: timer.as_ref(),
        };
        let sessions = maker.open_all(&buckets, &mut shared)?;
        let mem = match opts.device {
            Device::Cpu => MemoryInfo::default(),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => cuda::pinned_memory_info()?,
        };
        let first_bucket = buckets.first().copied();
        let inputs = input_plans(&sessions[0], meta, opts.device, first_bucket)?;
        let outputs = output_plans(&sessions[0], meta, first_bucket)?;
        let mut m = OnnxModel {
            meta: meta.clone(),
            buckets,
            sessions,
            inputs,
            outputs,
            mem,
            shared,
            device_bytes: None,
            #[cfg(feature = "cuda")]
            timer,
        };
        if opts.warm_up {
            m.warm_up()?;
        }
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(dev), Some(before)) = (opts.device, free_before) {
            m.device_bytes = Some(before.saturating_sub(cuda::free_memory(dev)?));
        }
        let _ = free_before;
        Ok(m)
    }

    /// Runs every bucket (or, with exact shapes, max_batch) once on zeros, the
    /// largest first: an arena shared by the buckets then grows once, to the
    /// largest run, and every smaller run fits in it (smallest first, it would grow
    /// by each bucket's size in turn, in regions it cannot merge).
    pub fn warm_up(&mut self) -> Result<()> {
        let zero = vec![0u8; self.meta.input_bytes()];
        let sizes: Vec<u32> = if self.buckets.is_empty() {
            vec![self.meta.max_batch]
        } else {
            self.buckets.iter().rev().copied().collect()
        };
        for b in sizes {
            let reqs: Vec<&[u8]> = (0..b).map(|_| zero.as_slice()).collect();
            self.run(&reqs)
                .with_context(|| format!("model `{}`: warm-up at batch {b}", self.meta.name))?;
        }
        Ok(())
    }

    /// The bucket sizes (empty: exact shapes).
    pub fn buckets(&self) -> &[u32] {
        &self.buckets
    }

    /// The shape a batch of `n` runs at: its bucket, or n itself.
    pub fn shape_for(&self, n: usize) -> usize {
        if self.buckets.is_empty() {
            return n;
        }
        crate::repo::bucket_of(&self.buckets, n as u32).map_or(n, |b| b as usize)
    }

    /// Bytes of weights the sessions share (0 without sharing).
    pub fn shared_weight_bytes(&self) -> usize {
        self.shared.as_ref().map_or(0, |s| s.bytes)
    }

    /// Device memory the model took at load (all its sessions, warmed), measured
    /// as the drop in the device's free memory; None on the CPU.
    pub fn device_bytes(&self) -> Option<u64> {
        self.device_bytes
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

    /// The (first) session, for callers that run it directly (the overhead
    /// benchmark).
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.sessions[0]
    }

    /// Runs one batch: each request's bytes gathered once into the input tensors
    /// (padded to its bucket), one session run, each output split per request.
    pub fn run(&mut self, requests: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let n = requests.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        self.check_batch(requests)?;
        let (shape, si) = self.bucket_index(n);
        gather(&mut self.inputs, requests)?;
        self.make_views(shape)?;
        let name = &self.meta.name;
        // The BYTES inputs' string tensors, by input index (none: no allocation).
        let strings: Vec<(usize, ort::value::DynValue)> = self
            .inputs
            .iter_mut()
            .enumerate()
            .filter(|(_, p)| p.dtype == DType::Bytes)
            .map(|(i, p)| Ok((i, string_input(p, shape)?)))
            .collect::<Result<_>>()
            .map_err(|e| anyhow!("model `{name}`: {e}"))?;
        let values: Vec<SessionInputValue<'_>> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(i, p)| match strings.iter().find(|(k, _)| *k == i) {
                Some((_, v)) => SessionInputValue::from(v),
                None => SessionInputValue::from(&**p.views[shape].as_ref().expect("made above")),
            })
            .collect();
        let run = SessionRun {
            session: &mut self.sessions[si],
            outputs: &self.outputs,
            #[cfg(feature = "cuda")]
            timer: &mut self.timer,
        };
        run.split(name, &values, shape, n, self.meta.output_bytes())
    }

    /// Checks a batch's size and each request's input length.
    fn check_batch(&self, requests: &[&[u8]]) -> Result<()> {
        let n = requests.len();
        let name = &self.meta.name;
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
        Ok(())
    }

    /// How a batch of this model can be staged ([`crate::node::exec::stage`]):
    /// the bytes of a request and the rows a buffer needs (the largest shape
    /// it runs at), when a request is exactly one input tensor's sample
    /// (None: it is several tensors, or strings, and runs through the gather).
    pub fn stage_layout(&self) -> Option<(usize, usize)> {
        let [p] = &self.inputs[..] else {
            return None;
        };
        let rows = self
            .buckets
            .last()
            .map_or(self.meta.max_batch as usize, |&b| b as usize)
            .max(self.meta.max_batch as usize);
        (p.dtype != DType::Bytes && p.offset == 0 && p.sample_bytes == self.meta.input_bytes())
            .then_some((p.sample_bytes, rows))
    }

    /// Runs the first `n` rows of `buf` (a staged buffer: one request per row,
    /// [`Self::stage_layout`]'s rows) as one batch: the buffer itself is the
    /// input tensor, the pulled bytes are not copied again.
    pub fn run_staged(&mut self, buf: &mut [u8], n: usize) -> Result<Vec<Vec<u8>>> {
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
        let Some((row, rows)) = self.stage_layout() else {
            bail!("model `{name}`: its requests are not one input tensor; it is not staged");
        };
        let (shape, si) = self.bucket_index(n);
        if buf.len() < rows * row || shape > rows || buf.as_ptr().align_offset(8) != 0 {
            bail!("model `{name}`: the staged buffer is not one of this model's");
        }
        let p = &self.inputs[0];
        let mut dims = Vec::with_capacity(1 + p.sample_shape.len());
        dims.push(shape as i64);
        dims.extend_from_slice(&p.sample_shape);
        // SAFETY: `buf` holds rows * row >= shape * sample_bytes bytes, 8-byte
        // aligned, borrowed mutably for this call; the view is dropped before
        // it returns.
        let view = unsafe { tensor_view(&self.mem, p.dtype, buf.as_mut_ptr(), Shape::new(dims)) }
            .map_err(|e| anyhow!("model `{name}`: input `{}`: {e}", p.name))?;
        let values = [SessionInputValue::from(&*view)];
        let run = SessionRun {
            session: &mut self.sessions[si],
            outputs: &self.outputs,
            #[cfg(feature = "cuda")]
            timer: &mut self.timer,
        };
        let res = run.split(name, &values, shape, n, self.meta.output_bytes());
        drop(values);
        drop(view);
        res
    }

    /// The shape a batch of `n` runs at and the index of the session that runs it.
    fn bucket_index(&self, n: usize) -> (usize, usize) {
        if self.buckets.is_empty() {
            (n, 0)
        } else {
            let i = self.buckets.partition_point(|&b| (b as usize) < n);
            (self.buckets[i] as usize, i)
        }
    }

    /// Makes the input tensor views of shape `shape` not made yet.
    fn make_views(&mut self, shape: usize) -> Result<()> {
        let name = &self.meta.name;
        for p in &mut self.inputs {
            if p.views[shape].is_none() && p.dtype != DType::Bytes {
                let mut dims = Vec::with_capacity(1 + p.sample_shape.len());
                dims.push(shape as i64);
                dims.extend_from_slice(&p.sample_shape);
                let ptr = p.buf.as_mut_bytes()?.as_mut_ptr();
                // SAFETY: `ptr` points to max_batch * sample_bytes >= shape * sample_bytes
                // bytes, 8-byte aligned, that never move and outlive the view (see
                // `InputPlan::views`); they are written only between runs.
                let v = unsafe { tensor_view(&self.mem, p.dtype, ptr, Shape::new(dims)) }
                    .map_err(|e| anyhow!("model `{name}`: input `{}`: {e}", p.name))?;
                p.views[shape] = Some(v);
            }
        }
        Ok(())
    }
}

/// Gather: the only copy of the inputs. Rows n..shape (padding) keep what the
/// buffer holds; their outputs are not used. A large gather bypasses the CPU
/// caches (the buffer is read by the device's DMA, not the CPU), so a batch of 64
/// images does not evict what the next, small batch's run needs on the host.
fn gather(inputs: &mut [InputPlan], requests: &[&[u8]]) -> Result<()> {
    let n = requests.len();
    for p in inputs.iter_mut() {
        let sb = p.sample_bytes;
        let dst = p.buf.as_mut_bytes()?;
        let streaming = sb * n >= STREAMING_GATHER_BYTES;
        for (k, r) in requests.iter().enumerate() {
            let (d, s) = (&mut dst[k * sb..(k + 1) * sb], &r[p.offset..p.offset + sb]);
            if streaming {
                copy_streaming(d, s);
            } else {
                d.copy_from_slice(s);
            }
        }
    }
    if inputs
        .iter()
        .any(|p| p.sample_bytes * n >= STREAMING_GATHER_BYTES)
    {
        streaming_fence();
    }
    Ok(())
}

/// One session run of a batch: what [`OnnxModel::run`] and
/// [`OnnxModel::run_staged`] share once their input values are made.
struct SessionRun<'a> {
    session: &'a mut Session,
    outputs: &'a [OutputPlan],
    /// CUDA events around the run (on the GPU).
    #[cfg(feature = "cuda")]
    timer: &'a mut Option<cuda::BatchTimer>,
}

impl SessionRun<'_> {
    /// Runs the session on `values` (a batch of shape `shape` holding `n`
    /// requests) and splits each output into one buffer per request.
    fn split(
        self,
        name: &str,
        values: &[SessionInputValue<'_>],
        shape: usize,
        n: usize,
        per_request: usize,
    ) -> Result<Vec<Vec<u8>>> {
        #[cfg(feature = "cuda")]
        if let Some(t) = self.timer.as_mut() {
            t.start()?;
        }
        let outs = self
            .session
            .run(values)
            .map_err(|e| anyhow!("model `{name}`: ONNX Runtime run failed: {e}"))?;
        #[cfg(feature = "cuda")]
        if let Some(t) = self.timer.as_mut() {
            t.stop()?;
        }
        let mut res: Vec<Vec<u8>> = (0..n).map(|_| Vec::with_capacity(per_request)).collect();
        for o in self.outputs {
            o.split(name, &outs, shape, &mut res)?;
        }
        Ok(res)
    }
}

impl OutputPlan {
    /// Checks this output of a run of shape `shape` (its type and shape) and
    /// appends each request's row to its bytes in `res`.
    fn split(
        &self,
        name: &str,
        outs: &ort::session::SessionOutputs<'_>,
        shape: usize,
        res: &mut [Vec<u8>],
    ) -> Result<()> {
        let o = self;
        let n = res.len();
        let v = outs
            .get(&o.name)
            .ok_or_else(|| anyhow!("model `{name}`: the run returned no output `{}`", o.name))?;
        let t = v
            .view()
            .downcast::<DynTensorValueType>()
            .map_err(|e| anyhow!("model `{name}`: output `{}`: {e}", o.name))?;
        let expect = || std::iter::once(shape as i64).chain(o.sample_shape.iter().copied());
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
        // SAFETY: a CPU-accessible tensor of shape * sample elements of this
        // type (n <= shape rows are read), alive while `outs` is.
        let bytes = unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<u8>(), n * sb) };
        for (k, r) in res.iter_mut().enumerate() {
            r.extend_from_slice(&bytes[k * sb..(k + 1) * sb]);
        }
        Ok(())
    }
}

/// Gathers of at least this many bytes (per input tensor) use streaming stores.
const STREAMING_GATHER_BYTES: usize = 1 << 20;

/// Copies `src` into `dst` (same length) with non-temporal stores where the CPU
/// has them (x86-64: SSE2, always present), so the copy does not fill the caches
/// with bytes no CPU will read again. Hand-written because the standard library
/// has no such copy; the unaligned head and tail use an ordinary one.
fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body = (dst.len() - head) / 16 * 16;
        let (d, s) = (dst[head..].as_mut_ptr(), src[head..].as_ptr());
        let mut i = 0;
        while i < body {
            // SAFETY: i + 16 <= body bytes past `head` in both slices; `d + i` is
            // 16-byte aligned (head aligns it, i is a multiple of 16); the load is
            // unaligned-tolerant.
            unsafe {
                let v = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                _mm_stream_si128(d.add(i).cast::<__m128i>(), v);
            }
            i += 16;
        }
        let tail = head + body;
        dst[tail..].copy_from_slice(&src[tail..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Orders streaming stores before what follows (the device's read of the buffer).
fn streaming_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a store fence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
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
        DType::U16 => view!(u16),
        DType::U32 => view!(u32),
        DType::U64 => view!(u64),
        DType::I8 => view!(i8),
        DType::I16 => view!(i16),
        DType::I32 => view!(i32),
        DType::I64 => view!(i64),
        DType::F16 => view!(half::f16),
        DType::BF16 => view!(half::bf16),
        DType::F32 => view!(f32),
        DType::F64 => view!(f64),
        // A string tensor is made at each run (`string_input`): ONNX Runtime
        // keeps its own copies of the strings.
        DType::Bytes => Err(ort::Error::new("BYTES inputs have no view")),
    }
}

/// An element of a BYTES slot as ONNX Runtime's string data: its bytes as they
/// are (the request decoder refused NUL bytes; ONNX Runtime's strings are byte
/// strings, whatever their encoding). Owned: the tensor constructor takes
/// `'static` elements (it copies them again).
#[derive(Clone)]
struct SlotStr(Vec<u8>);

impl ort::value::Utf8Data for SlotStr {
    fn as_utf8_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The string tensor `[shape, sample_shape...]` of a BYTES input's first
/// `shape` samples in `p.buf` (padding rows hold whatever the buffer holds:
/// slots of earlier runs, or empty strings).
fn string_input(p: &mut InputPlan, shape: usize) -> Result<ort::value::DynValue> {
    let bytes = &p.buf.as_mut_bytes()?[..shape * p.sample_bytes];
    let elems: Vec<SlotStr> = bytes
        .chunks_exact(crate::repo::BYTES_SLOT)
        .map(|c| SlotStr(crate::repo::bytes_of_slot(c).to_vec()))
        .collect();
    let mut dims = Vec::with_capacity(1 + p.sample_shape.len());
    dims.push(shape as i64);
    dims.extend_from_slice(&p.sample_shape);
    let t = ort::value::Tensor::from_string_array((dims, &elems[..]))
        .map_err(|e| anyhow!("input `{}`: {e}", p.name))?;
    Ok(t.into_dyn())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_staging_is_on_unless_turned_off() {
        assert!(parse_cuda_stage(None).unwrap());
        assert!(!parse_cuda_stage(Some("0")).unwrap());
        assert!(!parse_cuda_stage(Some(" 0 ")).unwrap());
        assert!(parse_cuda_stage(Some("")).unwrap());
        assert!(parse_cuda_stage(Some(" 1 ")).unwrap());
        let e = parse_cuda_stage(Some("yes")).unwrap_err().to_string();
        assert!(e.contains("FERMATA_CUDA_STAGE must be 0 or 1"), "{e}");
    }

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
    fn streaming_copy_copies_every_byte() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for (off, len) in [(0, 5000), (1, 4000), (3, 17), (15, 16), (0, 0), (7, 4993)] {
            let mut buf = vec![0u8; 5008];
            let dst = &mut buf[off..off + len];
            copy_streaming(dst, &src[..len]);
            streaming_fence();
            assert_eq!(&buf[off..off + len], &src[..len], "offset {off} len {len}");
            assert!(buf[..off].iter().all(|&b| b == 0));
            assert!(buf[off + len..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn shapes_must_agree_and_batch_be_dynamic() {
        assert!(dims_match(&[-1, 64], &[-1, 64]));
        assert!(dims_match(&[-1, -1], &[-1, 64]));
        assert!(!dims_match(&[1, 64], &[-1, 64]));
        assert!(!dims_match(&[-1, 32], &[-1, 64]));
        assert!(!dims_match(&[-1, 64, 1], &[-1, 64]));
        // A bucket's session has its batch fixed to the bucket's size.
        assert!(dims_match_batch(&[8, 64], &[-1, 64], Some(8)));
        assert!(!dims_match_batch(&[4, 64], &[-1, 64], Some(8)));
    }
}
