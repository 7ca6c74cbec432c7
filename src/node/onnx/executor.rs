//! The `onnx` (and `cuda`) executor ([`OnnxExecutor`]): the models a backend
//! GPU has loaded, each an [`OnnxModel`], opened by its [`OnnxLoader`] off the
//! GPU's worker thread and freed there.

use super::{ort_environment, Device, OnnxModel, OnnxOptions};
use crate::node::exec::stage::{StagePool, Staged};
use crate::node::exec::{Executor, Loader, Prepared};
use crate::wire::{ModelId, ModelInfo};
use anyhow::{anyhow, bail, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The `onnx` (and `cuda`) executor: one ONNX Runtime session per loaded model.
/// One executor per backend "GPU"; used by that GPU's worker thread only.
pub struct OnnxExecutor {
    /// What opens its models (off the worker, or in [`Executor::load`]).
    loader: Arc<OnnxLoader>,
    models: HashMap<ModelId, OnnxModel>,
    /// The buffers its puller pulls staged models' inputs into (the batch
    /// tensors themselves): heap memory on the CPU; with `cuda`, page-locked
    /// memory unless `FERMATA_CUDA_STAGE=0` (then none: each batch is
    /// gathered into the model's pinned buffer).
    stage: Option<Arc<StagePool>>,
}

impl OnnxExecutor {
    /// Loads ONNX Runtime (once per process) so a missing library is reported when
    /// the backend starts, not at the first model.
    pub fn new(opts: OnnxOptions) -> Result<OnnxExecutor> {
        ort_environment()?;
        let stage = match opts.device {
            Device::Cpu => Some(StagePool::new()),
            #[cfg(feature = "cuda")]
            Device::Cuda(gpu) => super::cuda_stage_from_env()?
                .then(|| StagePool::with_alloc(super::cuda::pinned_stage_alloc(gpu))),
        };
        Ok(OnnxExecutor {
            loader: Arc::new(OnnxLoader {
                opts,
                stage: stage.clone(),
            }),
            models: HashMap::new(),
            stage,
        })
    }

    /// The model's file: `models_dir/NAME.onnx`, or the version a Triton model
    /// directory `models_dir/NAME/` serves ([`crate::repo::model_file`]).
    pub fn model_file(&self, name: &str) -> Result<PathBuf> {
        crate::repo::model_file(&self.loader.opts.models_dir, name)
    }

    /// Makes `m` the model `id` runs, staged when its layout allows.
    fn put(&mut self, id: ModelId, m: OnnxModel) -> Option<OnnxModel> {
        if let Some(s) = &self.stage {
            match m.stage_layout() {
                Some((row, rows)) => s.enable(id, row, rows),
                None => s.disable(id),
            }
        }
        self.models.insert(id, m)
    }

    /// Forgets model `id`.
    fn take(&mut self, id: ModelId) -> Option<OnnxModel> {
        if let Some(s) = &self.stage {
            s.disable(id);
        }
        self.models.remove(&id)
    }

    /// The loaded model with the scheduler's id `id`.
    pub fn model_mut(&mut self, id: ModelId) -> Option<&mut OnnxModel> {
        self.models.get_mut(&id)
    }
}

impl Executor for OnnxExecutor {
    fn name(&self) -> &'static str {
        device_name(self.loader.opts.device)
    }

    fn load(&mut self, model: &ModelInfo) -> Result<()> {
        let m = self.loader.open(model)?;
        self.put(model.id, m);
        Ok(())
    }

    fn loader(&self) -> Option<Arc<dyn Loader>> {
        Some(self.loader.clone())
    }

    fn detach(&mut self, model: ModelId) -> Option<Prepared> {
        self.take(model).map(|m| Box::new(m) as Prepared)
    }

    fn install(&mut self, model: &ModelInfo, prepared: Prepared) -> Result<()> {
        let m = prepared
            .downcast::<OnnxModel>()
            .map_err(|_| anyhow!("model `{}`: not prepared by this executor", model.name))?;
        if let Some(old) = self.put(model.id, *m) {
            drop(old);
            release_freed_heap();
        }
        Ok(())
    }

    fn unload(&mut self, model: ModelId) {
        if self.take(model).is_some() {
            release_freed_heap();
        }
    }

    fn device_bytes(&self, model: ModelId) -> Option<u64> {
        self.models.get(&model).and_then(|m| m.device_bytes())
    }

    fn buckets(&self, model: ModelId) -> Vec<u32> {
        self.models
            .get(&model)
            .map(|m| m.buckets().to_vec())
            .unwrap_or_default()
    }

    /// Each run gathers the requests' bytes into the model's batch tensors.
    fn copies_inputs(&self) -> bool {
        true
    }

    fn stage_pool(&self) -> Option<Arc<StagePool>> {
        self.stage.clone()
    }

    fn run_staged(
        &mut self,
        model: ModelId,
        staged: &mut Staged,
        n: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let Some(m) = self.models.get_mut(&model) else {
            bail!("model {model} is not loaded on this GPU");
        };
        m.run_staged(staged.bytes_mut(), n)
    }

    fn run(&mut self, model: ModelId, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let Some(m) = self.models.get_mut(&model) else {
            bail!("model {model} is not loaded on this GPU");
        };
        m.run(inputs)
    }
}

/// The `onnx` (and `cuda`) executor's [`Loader`]: opens a model's sessions and
/// warms them up, on the loading thread (for `cuda`, on the executor's device:
/// its batches and the warm-up share the GPU meanwhile), and fills the staging
/// buffers of a model it prepares ([`StagePool::reserve`]).
struct OnnxLoader {
    opts: OnnxOptions,
    stage: Option<Arc<StagePool>>,
}

impl OnnxLoader {
    fn open(&self, model: &ModelInfo) -> Result<OnnxModel> {
        let meta = match model.meta() {
            None => bail!(
                "model `{}` has no metadata (tensors, dtypes); the {} executor runs only models \
                 from a model repository (fermata serve/scheduler with --models DIR)",
                model.name,
                device_name(self.opts.device)
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
        let file = crate::repo::model_file(&self.opts.models_dir, &model.name)?;
        OnnxModel::open(&file, &meta, &self.opts)
    }
}

impl Loader for OnnxLoader {
    fn prepare(&self, model: &ModelInfo) -> Result<Prepared> {
        let m = self.open(model)?;
        if let (Some(s), Some((row, rows))) = (&self.stage, m.stage_layout()) {
            s.reserve(model.id, row, rows);
        }
        Ok(Box::new(m))
    }

    fn discard(&self, prepared: Prepared) {
        drop(prepared);
        release_freed_heap();
    }
}

/// The executor kind's name on `device`.
fn device_name(device: Device) -> &'static str {
    match device {
        Device::Cpu => "onnx",
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => "cuda",
    }
}

/// Gives the C library's freed heap back to the system. ONNX Runtime
/// allocates with the C library's `malloc` (Fermata's own allocator serves
/// Rust only), and glibc keeps what a dropped session freed (its weights, its
/// arenas) in its heap: without a trim an unloaded model stays resident.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the system; it
    // takes no pointers and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
