//! The backend's settings ([`BackendOpts`]): the scheduler to join, the GPUs and
//! how they are described, and the executor that runs them.

use crate::node::exec::ExecutorFactory;
use std::time::Duration;

/// Backend settings.
pub struct BackendOpts {
    pub scheduler: String,
    pub name: String,
    pub gpus: u32,
    pub gpu_name: String,
    pub gpu_mem_bytes: u64,
    /// Each GPU's name and memory where they differ (CUDA devices); empty: every
    /// GPU is `gpu_name` with `gpu_mem_bytes`.
    pub gpu_descs: Vec<(String, u64)>,
    pub executor: ExecutorFactory,
    /// What runs the GPUs (the executor's device), told to the scheduler.
    pub device: crate::wire::DeviceKind,
    /// The scheduler is considered lost after this long without a pong.
    pub scheduler_timeout: Duration,
}

impl BackendOpts {
    /// `gpus` emulated GPUs.
    pub fn emulated(scheduler: &str, gpus: u32) -> BackendOpts {
        BackendOpts {
            scheduler: scheduler.to_string(),
            name: "backend".into(),
            gpus,
            gpu_name: "emulated".into(),
            gpu_mem_bytes: 80 << 30,
            gpu_descs: Vec::new(),
            executor: Box::new(|_| Ok(Box::new(crate::node::exec::EmulatedGpu::new()))),
            device: crate::wire::DeviceKind::Emulated,
            scheduler_timeout: Duration::from_millis(2000),
        }
    }

    /// `gpus` GPUs run by the executor `kind` (`--executor`: emulated, onnx or
    /// cuda; see [`crate::node::exec::executor_factory`]), real models' files in
    /// `models_dir`. Fails when the executor cannot run here (no ONNX Runtime, no
    /// CUDA device).
    pub fn with_executor(
        scheduler: &str,
        gpus: u32,
        kind: &str,
        models_dir: &std::path::Path,
    ) -> anyhow::Result<BackendOpts> {
        Self::with_executor_on(scheduler, gpus, kind, models_dir, None)
    }

    /// [`Self::with_executor`] with, for `cuda`, the CUDA device of each GPU
    /// (`--cuda-devices`; default: GPU g on device g). Each GPU's name and memory
    /// are read from its device for the scheduler's inventory.
    pub fn with_executor_on(
        scheduler: &str,
        gpus: u32,
        kind: &str,
        models_dir: &std::path::Path,
        cuda_devices: Option<Vec<u32>>,
    ) -> anyhow::Result<BackendOpts> {
        let mut o = BackendOpts::emulated(scheduler, gpus);
        if let Some(v) = &cuda_devices {
            if v.len() != gpus as usize {
                anyhow::bail!(
                    "--cuda-devices lists {} devices but the backend has --gpus {gpus}",
                    v.len()
                );
            }
        }
        #[cfg(feature = "cuda")]
        let devices: Vec<u32> = cuda_devices.clone().unwrap_or_else(|| (0..gpus).collect());
        o.executor = crate::node::exec::executor_factory_on(kind, models_dir, cuda_devices)?;
        o.device = crate::node::exec::device_kind(kind);
        o.gpu_name = match kind {
            "onnx" => "onnxruntime-cpu".into(),
            other => other.to_string(),
        };
        #[cfg(feature = "cuda")]
        if kind == "cuda" {
            o.gpu_descs = devices
                .iter()
                .map(|&d| crate::node::onnx::cuda::describe(d))
                .collect::<anyhow::Result<_>>()?;
            if let Some((name, mem)) = o.gpu_descs.first() {
                o.gpu_name = name.clone();
                o.gpu_mem_bytes = *mem;
            }
        }
        Ok(o)
    }

    /// Every GPU registers as type `t` (`--gpu-type`): 1 to 128 characters.
    pub fn set_gpu_type(&mut self, t: &str) -> anyhow::Result<()> {
        let t = t.trim();
        if t.is_empty() || t.chars().count() > 128 {
            anyhow::bail!("--gpu-type must be a name of 1 to 128 characters, got {t:?}");
        }
        self.gpu_name = t.to_string();
        for d in &mut self.gpu_descs {
            d.0 = t.to_string();
        }
        Ok(())
    }

    /// What the scheduler is told of each GPU.
    pub(super) fn gpu_infos(&self) -> Vec<crate::wire::GpuInfo> {
        (0..self.gpus)
            .map(|g| {
                let (name, mem_bytes) = self
                    .gpu_descs
                    .get(g as usize)
                    .cloned()
                    .unwrap_or_else(|| (self.gpu_name.clone(), self.gpu_mem_bytes));
                crate::wire::GpuInfo {
                    local: g,
                    name,
                    mem_bytes,
                    device: self.device,
                }
            })
            .collect()
    }
}
