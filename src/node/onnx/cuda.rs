//! The `cuda` executor's CUDA side (cargo feature `cuda`): device discovery and
//! selection, pinned host buffers for the batch tensors, and CUDA-event timing of
//! each batch, through `cudarc` (which loads `libcuda.so` at run time, so the
//! feature builds without a CUDA toolkit).
//!
//! At run time the `cuda` executor needs an NVIDIA driver and GPU, and an ONNX
//! Runtime build with the CUDA execution provider: the `onnxruntime-gpu` wheel
//! with NVIDIA's CUDA 13 and cuDNN 9 wheels, which `bash scripts/setup.sh --gpu`
//! installs into `.deps/gpu`, where [`prepare`] finds and loads them (see
//! [`super::gpulibs`]); `ORT_DYLIB_PATH` still overrides the ONNX Runtime library.
//!
//! Backend GPU `g` is CUDA device `g`, or the g-th of `--cuda-devices`.

use super::{HostBuf, OnnxOptions};
use crate::node::exec::stage::{StageAlloc, StageMem};
use anyhow::{anyhow, bail, Result};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use ort::ep::{ExecutionProvider, CUDA};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::builder::SessionBuilder;
use std::path::Path;
use std::sync::Arc;

/// The cuBLAS workspace per handle the `cuda` executor asks for (one 4 MiB
/// buffer), unless CUBLAS_WORKSPACE_CONFIG is set.
pub const CUBLAS_WORKSPACE: &str = ":4096:1";

/// What to do without a GPU.
pub const NO_CUDA_HINT: &str = "use --executor onnx (ONNX Runtime on the CPU) instead";

/// The number of CUDA devices, or a clear error when there is no driver or device.
pub fn device_count() -> Result<u32> {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        bail!("no CUDA device/driver found (libcuda.so cannot be loaded); {NO_CUDA_HINT}");
    }
    let n = CudaContext::device_count()
        .map_err(|e| anyhow!("no CUDA device/driver found (cuInit: {e:?}); {NO_CUDA_HINT}"))?;
    if n <= 0 {
        bail!("no CUDA device/driver found (the driver reports 0 devices); {NO_CUDA_HINT}");
    }
    Ok(n as u32)
}

/// Everything the `cuda` executor needs before its first session: a driver and a
/// device, the NVIDIA libraries (found and loaded from `.deps/gpu`, or an error
/// naming each missing one), and ONNX Runtime (the onnxruntime-gpu build when
/// `.deps/gpu` has it). Returns the number of CUDA devices.
pub fn prepare() -> Result<u32> {
    let n = device_count()?;
    // cuBLAS gives every handle a workspace (32 MiB on Hopper), and ONNX Runtime
    // makes handles per session: with a session per bucket that was most of what
    // the buckets cost beyond one session. 4 MiB each is cuBLAS's documented
    // smaller setting; a user's own CUBLAS_WORKSPACE_CONFIG wins.
    if std::env::var_os("CUBLAS_WORKSPACE_CONFIG").is_none() {
        // SAFETY: set before any CUDA library reads it, while the process has no
        // other thread that reads the environment.
        unsafe { std::env::set_var("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE) };
    }
    super::gpulibs::load()?;
    super::prefer_gpu_ort();
    super::ort_environment()?;
    Ok(n)
}

/// The context of CUDA device `gpu` (the backend's GPU index).
pub fn context(gpu: u32) -> Result<Arc<CudaContext>> {
    let n = device_count()?;
    if gpu >= n {
        bail!(
            "backend GPU {gpu} has no CUDA device: this machine has {n} (devices 0..{n}); \
             give the backend at most --gpus {n}"
        );
    }
    CudaContext::new(gpu as usize).map_err(|e| anyhow!("CUDA device {gpu}: {e:?}"))
}

/// A one-line description of device `gpu` (name, memory), for the GPU inventory.
pub fn describe(gpu: u32) -> Result<(String, u64)> {
    let ctx = context(gpu)?;
    let name = ctx
        .name()
        .map_err(|e| anyhow!("CUDA device {gpu}: {e:?}"))?;
    let mem = ctx
        .total_mem()
        .map_err(|e| anyhow!("CUDA device {gpu}: {e:?}"))?;
    Ok((name, mem as u64))
}

/// CUDA sessions on device `gpu`; checks the device exists first. Buckets and
/// sharing come from the environment ([`super::BUCKETS_ENV`],
/// [`super::SHARING_ENV`]); every bucket is run once at load.
pub fn options(models_dir: &Path, gpu: u32) -> Result<OnnxOptions> {
    context(gpu)?;
    Ok(OnnxOptions {
        models_dir: models_dir.to_path_buf(),
        intra_threads: super::threads_from_env()?,
        device: super::Device::Cuda(gpu),
        buckets: super::buckets_from_env()?,
        sharing: super::sharing_from_env()?,
        warm_up: true,
    })
}

/// Free memory on device `gpu` (bytes).
pub fn free_memory(gpu: u32) -> Result<u64> {
    let ctx = context(gpu)?;
    let (free, _) = ctx
        .mem_get_info()
        .map_err(|e| anyhow!("CUDA device {gpu}: memory info: {e:?}"))?;
    Ok(free as u64)
}

/// How ONNX Runtime is told that a tensor sits in device memory of `gpu`.
pub fn device_memory_info(gpu: u32) -> Result<MemoryInfo<'static>> {
    MemoryInfo::new(
        AllocationDevice::CUDA,
        gpu as i32,
        AllocatorType::Device,
        MemoryType::Default,
    )
    .map_err(|e| anyhow!("device memory info: {e}"))
}

/// Copies `bytes` to new device memory on `stream`'s device and waits for it;
/// returns the allocation and its device address.
pub fn upload(
    stream: &Arc<CudaStream>,
    bytes: &[u8],
) -> Result<(cudarc::driver::CudaSlice<u8>, *mut std::ffi::c_void)> {
    use cudarc::driver::DevicePtr;
    let slice = stream
        .clone_htod(bytes)
        .map_err(|e| anyhow!("copying {} bytes to the GPU: {e:?}", bytes.len()))?;
    stream
        .synchronize()
        .map_err(|e| anyhow!("CUDA stream: {e:?}"))?;
    let ptr = {
        let (p, _sync) = slice.device_ptr(stream);
        p as usize as *mut std::ffi::c_void
    };
    Ok((slice, ptr))
}

/// Registers one arena allocator for CUDA device `gpu` with the ONNX Runtime
/// environment (once per process and device), which sessions built with
/// `with_env_allocators` then share. Returns whether it is registered; a failure is
/// logged and the sessions keep arenas of their own.
pub fn share_arena(env: &ort::environment::Environment, gpu: u32) -> bool {
    use ort::AsPointer;
    use std::collections::HashMap;
    use std::sync::Mutex;
    static DONE: Mutex<Option<HashMap<u32, bool>>> = Mutex::new(None);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    let map = done.get_or_insert_with(HashMap::new);
    if let Some(&ok) = map.get(&gpu) {
        return ok;
    }
    let res = (|| -> Result<()> {
        let api = ort::api();
        let mem = device_memory_info(gpu)?;
        // Grow the arena by what is asked, not to the next power of two: the
        // arena then holds about the largest bucket's run.
        let keys = [c"arena_extend_strategy".as_ptr()];
        let vals: [usize; 1] = [1];
        let mut cfg: *mut ort::sys::OrtArenaCfg = std::ptr::null_mut();
        // SAFETY: one key and value, `cfg` receives a new config released below.
        super::status(unsafe {
            (api.CreateArenaCfgV2)(keys.as_ptr(), vals.as_ptr(), 1, &mut cfg)
        })?;
        let dev = std::ffi::CString::new(gpu.to_string()).expect("digits");
        let okeys = [c"device_id".as_ptr()];
        let ovals = [dev.as_ptr()];
        // SAFETY: valid environment, memory info and config; strings outlive the call.
        let st = unsafe {
            (api.CreateAndRegisterAllocatorV2)(
                env.ptr().cast_mut(),
                c"CUDAExecutionProvider".as_ptr(),
                mem.ptr(),
                cfg,
                okeys.as_ptr(),
                ovals.as_ptr(),
                1,
            )
        };
        // SAFETY: created above.
        unsafe { (api.ReleaseArenaCfg)(cfg) };
        super::status(st)
    })();
    let ok = match res {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                "CUDA device {gpu}: cannot register a shared arena ({e:#}); each session keeps its own"
            );
            false
        }
    };
    map.insert(gpu, ok);
    ok
}

/// Adds the CUDA execution provider on device `gpu`, computing on `timer`'s
/// stream; fails (instead of falling back to the CPU) when ONNX Runtime has no
/// CUDA provider.
pub fn with_cuda_provider(
    mut b: SessionBuilder,
    gpu: u32,
    timer: &BatchTimer,
) -> Result<SessionBuilder> {
    // SAFETY: the stream lives in the model's timer, dropped after its session.
    let ep = unsafe {
        CUDA::default()
            .with_device_id(gpu as i32)
            .with_arena_extend_strategy(ort::ep::ArenaExtendStrategy::SameAsRequested)
            .with_compute_stream(timer.stream.cu_stream() as *mut ())
    };
    if !CUDA::is_available().unwrap_or(false) {
        bail!(
            "this ONNX Runtime has no CUDA execution provider (the onnxruntime CPU wheel); \
             point ORT_DYLIB_PATH at an onnxruntime-gpu build, or {NO_CUDA_HINT}"
        );
    }
    ep.register(&mut b)
        .map_err(|e| anyhow!("cannot add the CUDA execution provider on device {gpu}: {e}"))?;
    Ok(b)
}

/// How ONNX Runtime is told that an input tensor sits in pinned host memory.
pub fn pinned_memory_info() -> Result<MemoryInfo<'static>> {
    MemoryInfo::new(
        AllocationDevice::CUDA_PINNED,
        0,
        AllocatorType::Device,
        MemoryType::CPUInput,
    )
    .map_err(|e| anyhow!("pinned memory info: {e}"))
}

/// A page-locked host buffer of `bytes` on device `gpu`'s context.
pub(super) fn pinned_buffer(gpu: u32, bytes: usize) -> Result<HostBuf> {
    let ctx = context(gpu)?;
    // Rounded up to 8 bytes like the heap buffer; the driver page-aligns it.
    let len = bytes.div_ceil(8).max(1) * 8;
    // SAFETY: the memory is only read after the gather writes the part used.
    let p = unsafe { ctx.alloc_pinned::<u8>(len) }
        .map_err(|e| anyhow!("cannot allocate {len} bytes of pinned memory on GPU {gpu}: {e:?}"))?;
    Ok(HostBuf::Pinned(p))
}

/// Page-locked host memory lent to a GPU's puller ([`pinned_stage_alloc`]).
struct PinnedStage {
    /// Owns the memory; freed (on its context) when dropped.
    _buf: cudarc::driver::PinnedHostSlice<u8>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `ptr` is the address of the memory `_buf` owns (PinnedHostSlice is
// Send); whoever holds the PinnedStage alone reads and writes through it.
unsafe impl Send for PinnedStage {}

impl StageMem for PinnedStage {
    fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// The `cuda` executor's staging allocator ([`crate::node::exec::stage`]):
/// page-locked host memory on device `gpu`'s context, so the provider's
/// host-to-device copy of a staged batch is a DMA from where the puller wrote
/// the inputs. An allocation that fails is logged and leaves that batch to the
/// gather.
pub(super) fn pinned_stage_alloc(gpu: u32) -> StageAlloc {
    Box::new(move |bytes| {
        let r = (|| -> Result<PinnedStage> {
            let ctx = context(gpu)?;
            let len = bytes.div_ceil(8).max(1) * 8;
            // SAFETY: the puller writes the rows a batch runs before the
            // batch reads them; rows past the batch are padding whose outputs
            // are not used.
            let mut buf = unsafe { ctx.alloc_pinned::<u8>(len) }.map_err(|e| {
                anyhow!("cannot allocate {len} bytes of pinned memory on GPU {gpu}: {e:?}")
            })?;
            let ptr = buf
                .as_mut_ptr()
                .map_err(|e| anyhow!("pinned staging buffer: {e:?}"))?;
            Ok(PinnedStage {
                _buf: buf,
                ptr,
                len,
            })
        })();
        match r {
            Ok(m) => Some(Box::new(m) as Box<dyn StageMem>),
            Err(e) => {
                tracing::warn!(
                    gpu,
                    bytes,
                    "cuda: a staging buffer: {e:#}; the batch is gathered"
                );
                None
            }
        }
    })
}

/// Times batches with CUDA events recorded on the provider's compute stream.
pub struct BatchTimer {
    stream: Arc<CudaStream>,
    start: CudaEvent,
    end: CudaEvent,
    last_ms: Option<f64>,
}

impl BatchTimer {
    pub fn new(gpu: u32) -> Result<BatchTimer> {
        let ctx = context(gpu)?;
        let stream = ctx
            .new_stream()
            .map_err(|e| anyhow!("CUDA device {gpu}: new stream: {e:?}"))?;
        let ev = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| anyhow!("CUDA device {gpu}: new event: {e:?}"))
        };
        Ok(BatchTimer {
            start: ev()?,
            end: ev()?,
            stream,
            last_ms: None,
        })
    }

    /// Before the run.
    pub fn start(&mut self) -> Result<()> {
        self.start
            .record(&self.stream)
            .map_err(|e| anyhow!("CUDA event: {e:?}"))
    }

    /// After the run (ONNX Runtime has synchronized its stream by then): waits for
    /// the end event and keeps the elapsed time.
    pub fn stop(&mut self) -> Result<()> {
        self.end
            .record(&self.stream)
            .map_err(|e| anyhow!("CUDA event: {e:?}"))?;
        self.end
            .synchronize()
            .map_err(|e| anyhow!("CUDA event: {e:?}"))?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(|e| anyhow!("CUDA event: {e:?}"))?;
        self.last_ms = Some(ms as f64);
        Ok(())
    }

    pub fn last_ms(&self) -> Option<f64> {
        self.last_ms
    }

    /// The stream the provider computes on.
    pub fn stream(&self) -> Arc<CudaStream> {
        self.stream.clone()
    }
}
