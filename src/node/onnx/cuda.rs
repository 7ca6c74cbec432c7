//! The `cuda` executor's CUDA side (cargo feature `cuda`): device discovery and
//! selection, pinned host buffers for the batch tensors, and CUDA-event timing of
//! each batch, through `cudarc` (which loads `libcuda.so` at run time, so the
//! feature builds without a CUDA toolkit).
//!
//! At run time the `cuda` executor needs an NVIDIA driver and GPU, and an ONNX
//! Runtime build with the CUDA execution provider (the `onnxruntime-gpu` wheel's
//! `libonnxruntime.so` and `libonnxruntime_providers_cuda.so`, named by
//! `ORT_DYLIB_PATH`, with the CUDA and cuDNN libraries that build needs on the
//! loader path). The CPU wheel that `scripts/setup.sh` installs has no CUDA
//! provider: opening a session then fails with ONNX Runtime's error.
//!
//! Backend GPU `g` is CUDA device `g`.

use super::{HostBuf, OnnxOptions};
use anyhow::{anyhow, bail, Result};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use ort::ep::{ExecutionProvider, CUDA};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::builder::SessionBuilder;
use std::path::Path;
use std::sync::Arc;

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

/// CUDA sessions on device `gpu`; checks the device exists first.
pub fn options(models_dir: &Path, gpu: u32) -> Result<OnnxOptions> {
    context(gpu)?;
    Ok(OnnxOptions {
        models_dir: models_dir.to_path_buf(),
        intra_threads: super::threads_from_env()?,
        device: super::Device::Cuda(gpu),
    })
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
}
