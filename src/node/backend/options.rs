//! The backend's settings ([`BackendOpts`]): the scheduler to join, the GPUs and
//! how they are described, and the executor that runs them.

use super::lanes::LaneMap;
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
    /// Batches each GPU runs at once (`--lanes`, 1 to
    /// [`super::lanes::MAX_LANES`]): each GPU registers as this many slots.
    pub lanes: u32,
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
            lanes: 1,
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

    /// The emulated executor slows models down as `slow` says
    /// (`--emulated-slowdown`, timed from `slow`'s origin).
    pub fn set_emulated_slowdown(
        &mut self,
        slow: crate::node::exec::slowdown::Slowdowns,
    ) -> anyhow::Result<()> {
        if slow.is_empty() {
            return Ok(());
        }
        if self.device != crate::wire::DeviceKind::Emulated {
            anyhow::bail!("--emulated-slowdown is for --executor emulated");
        }
        self.executor = crate::node::exec::emulated_factory_slowed(slow)?;
        Ok(())
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

    /// Each GPU runs up to `lanes` batches at once (`--lanes`): 1 to
    /// [`super::lanes::MAX_LANES`].
    pub fn set_lanes(&mut self, lanes: u32) -> anyhow::Result<()> {
        self.lane_map_of(lanes)?;
        self.lanes = lanes;
        Ok(())
    }

    fn lane_map_of(&self, lanes: u32) -> anyhow::Result<LaneMap> {
        LaneMap::new(self.gpus, lanes).map_err(anyhow::Error::msg)
    }

    /// The GPU slots the scheduler sees: each GPU's lanes.
    pub(super) fn lane_map(&self) -> anyhow::Result<LaneMap> {
        self.lane_map_of(self.lanes)
    }

    /// What the scheduler is told of each slot: lane `l` of GPU `g` is slot
    /// `g * lanes + l`, of the GPU's type, with an equal share of its memory
    /// (each lane loads the models on its own).
    pub(super) fn gpu_infos(&self) -> Vec<crate::wire::GpuInfo> {
        let lanes = self.lanes.max(1);
        (0..self.gpus * lanes)
            .map(|slot| {
                let g = slot / lanes;
                let (name, mem_bytes) = self
                    .gpu_descs
                    .get(g as usize)
                    .cloned()
                    .unwrap_or_else(|| (self.gpu_name.clone(), self.gpu_mem_bytes));
                crate::wire::GpuInfo {
                    local: slot,
                    name,
                    mem_bytes: mem_bytes / u64::from(lanes),
                    device: self.device,
                    lanes,
                }
            })
            .collect()
    }
}
