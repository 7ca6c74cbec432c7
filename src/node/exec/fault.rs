//! Fault injection for tests of failure handling with real processes: the
//! environment variable `FERMATA_FAULT` (read once, when a backend makes its
//! executors) wraps each GPU's executor so that it misbehaves on purpose.
//!
//! * `gpu-hang:AFTER:MS` — after AFTER batches, the next batch blocks its GPU
//!   for MS milliseconds (once), while the process goes on answering pings:
//!   what the scheduler's plan watchdog is for.
//! * `slow-load:MS` — every model load takes MS milliseconds more (on the
//!   thread that loads it): what keeping loads off the GPU's worker is for.
//! * `slow-model:NAME:FACTOR` — every batch of model NAME takes FACTOR (more
//!   than 1, at most 16) times as long: after each, the GPU's worker holds
//!   the GPU for FACTOR - 1 times the batch's run. A model slower than its
//!   profile, on any executor: what the scheduler's latency scaling and the
//!   re-planning on measured latency are for.
//!
//! Unset (the default) it costs nothing: executors are not wrapped. A value
//! that does not parse stops the backend at start with the reason.

use super::{Executor, Loader, Prepared};
use crate::core::ModelId;
use crate::wire::ModelInfo;
use std::sync::Arc;
use std::time::Duration;

/// The environment variable that asks for a fault.
pub const FAULT_ENV: &str = "FERMATA_FAULT";

/// A fault to inject.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// After `after` batches, the next one blocks for `hold`.
    GpuHang { after: u64, hold: Duration },
    /// Every load takes `hold` more.
    SlowLoad { hold: Duration },
    /// Every batch of `model` takes `factor` times as long.
    SlowModel { model: String, factor: f64 },
}

/// The largest `slow-model` factor.
pub const MAX_SLOW_FACTOR: f64 = 16.0;

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Fault, String> {
        let bad = || {
            format!(
                "{FAULT_ENV}={s:?}: expected gpu-hang:AFTER_BATCHES:MS, slow-load:MS or \
                 slow-model:NAME:FACTOR (FACTOR above 1, at most {MAX_SLOW_FACTOR})"
            )
        };
        let ms = |v: Option<&str>| -> Result<Duration, String> {
            match v.and_then(|v| v.parse::<u64>().ok()) {
                Some(ms) if ms <= 600_000 => Ok(Duration::from_millis(ms)),
                _ => Err(bad()),
            }
        };
        let mut it = s.split(':');
        let f = match it.next() {
            Some("gpu-hang") => {
                let after = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
                Fault::GpuHang {
                    after,
                    hold: ms(it.next())?,
                }
            }
            Some("slow-load") => Fault::SlowLoad {
                hold: ms(it.next())?,
            },
            Some("slow-model") => {
                let model = it.next().filter(|m| !m.is_empty()).ok_or_else(bad)?;
                let factor = it
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|k| *k > 1.0 && *k <= MAX_SLOW_FACTOR)
                    .ok_or_else(bad)?;
                Fault::SlowModel {
                    model: model.to_string(),
                    factor,
                }
            }
            _ => return Err(bad()),
        };
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(f)
    }
}

/// The fault the environment asks for, if any.
pub fn from_env() -> anyhow::Result<Option<Fault>> {
    match std::env::var(FAULT_ENV) {
        Err(_) => Ok(None),
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => v.parse().map(Some).map_err(anyhow::Error::msg),
    }
}

/// An executor that injects `fault` into `inner`.
pub struct Faulty {
    inner: Box<dyn Executor>,
    fault: Fault,
    batches: u64,
    /// The scheduler's id of the `slow-model` model, once loaded.
    slowed: Option<ModelId>,
}

impl Faulty {
    pub fn new(inner: Box<dyn Executor>, fault: Fault) -> Faulty {
        tracing::warn!(?fault, "backend: fault injection on ({FAULT_ENV})");
        Faulty {
            inner,
            fault,
            batches: 0,
            slowed: None,
        }
    }

    /// The extra time a load takes.
    fn load_hold(&self) -> Option<Duration> {
        match self.fault {
            Fault::SlowLoad { hold } => Some(hold),
            Fault::GpuHang { .. } | Fault::SlowModel { .. } => None,
        }
    }

    /// Notes the id of the `slow-model` model when it is loaded.
    fn loaded(&mut self, model: &ModelInfo) {
        if let Fault::SlowModel { model: name, .. } = &self.fault {
            if *name == model.name {
                self.slowed = Some(model.id);
            }
        }
    }

    /// Before a batch: the hang, when it is due.
    fn before_batch(&mut self) {
        self.batches += 1;
        if let Fault::GpuHang { after, hold } = self.fault {
            if self.batches == after + 1 {
                tracing::warn!(
                    hold_ms = hold.as_millis() as u64,
                    "backend: injected GPU hang"
                );
                std::thread::sleep(hold);
            }
        }
    }

    /// How long the GPU is held after a batch of `model` that ran for `ran`.
    fn hold_after(&self, model: ModelId, ran: Duration) -> Duration {
        match self.fault {
            Fault::SlowModel { factor, .. } if self.slowed == Some(model) => {
                ran.mul_f64(factor - 1.0)
            }
            _ => Duration::ZERO,
        }
    }

    /// Runs a batch of `model` on the inner executor (`run`) with the
    /// faults around it: the hang before, when due, and the slowdown's hold
    /// after.
    fn batch<T>(&mut self, model: ModelId, run: impl FnOnce(&mut dyn Executor) -> T) -> T {
        self.before_batch();
        let t0 = std::time::Instant::now();
        let r = run(&mut *self.inner);
        let hold = self.hold_after(model, t0.elapsed());
        if !hold.is_zero() {
            std::thread::sleep(hold);
        }
        r
    }
}

/// The loader of a [`Faulty`] executor: the inner one's, slowed.
struct SlowLoader {
    inner: Arc<dyn Loader>,
    hold: Duration,
}

impl Loader for SlowLoader {
    fn prepare(&self, model: &ModelInfo) -> anyhow::Result<Prepared> {
        std::thread::sleep(self.hold);
        self.inner.prepare(model)
    }
    fn discard(&self, prepared: Prepared) {
        self.inner.discard(prepared)
    }
}

impl Executor for Faulty {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn load(&mut self, model: &ModelInfo) -> anyhow::Result<()> {
        if let Some(hold) = self.load_hold() {
            std::thread::sleep(hold);
        }
        self.loaded(model);
        self.inner.load(model)
    }
    fn unload(&mut self, model: ModelId) {
        self.inner.unload(model)
    }
    fn loader(&self) -> Option<Arc<dyn Loader>> {
        let inner = self.inner.loader()?;
        Some(match self.load_hold() {
            None => inner,
            Some(hold) => Arc::new(SlowLoader { inner, hold }),
        })
    }
    fn detach(&mut self, model: ModelId) -> Option<Prepared> {
        self.inner.detach(model)
    }
    fn install(&mut self, model: &ModelInfo, prepared: Prepared) -> anyhow::Result<()> {
        self.loaded(model);
        self.inner.install(model, prepared)
    }
    fn device_bytes(&self, model: ModelId) -> Option<u64> {
        self.inner.device_bytes(model)
    }
    fn buckets(&self, model: ModelId) -> Vec<u32> {
        self.inner.buckets(model)
    }
    fn copies_inputs(&self) -> bool {
        self.inner.copies_inputs()
    }
    fn run(&mut self, model: ModelId, inputs: &[&[u8]]) -> anyhow::Result<Vec<Vec<u8>>> {
        self.batch(model, |e| e.run(model, inputs))
    }
    fn stage_pool(&self) -> Option<Arc<super::stage::StagePool>> {
        self.inner.stage_pool()
    }
    fn run_staged(
        &mut self,
        model: ModelId,
        staged: &mut super::stage::Staged,
        n: usize,
    ) -> anyhow::Result<Vec<Vec<u8>>> {
        self.batch(model, |e| e.run_staged(model, staged, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_or_say_what_is_expected() {
        assert_eq!(
            "gpu-hang:20:3000".parse::<Fault>(),
            Ok(Fault::GpuHang {
                after: 20,
                hold: Duration::from_secs(3)
            })
        );
        assert_eq!(
            "slow-load:1500".parse::<Fault>(),
            Ok(Fault::SlowLoad {
                hold: Duration::from_millis(1500)
            })
        );
        for bad in [
            "gpu-hang",
            "gpu-hang:x:1",
            "gpu-hang:1:2:3",
            "hang:1:2",
            "gpu-hang:1:9999999",
            "slow-load",
            "slow-load:1:2",
            "slow-load:-1",
        ] {
            let e = bad.parse::<Fault>().unwrap_err();
            assert!(
                e.contains("gpu-hang:AFTER_BATCHES:MS, slow-load:MS or slow-model:NAME:FACTOR"),
                "{e}"
            );
        }
    }

    #[test]
    fn slow_model_parses_with_a_bounded_factor() {
        assert_eq!(
            "slow-model:resnet50:1.5".parse::<Fault>(),
            Ok(Fault::SlowModel {
                model: "resnet50".into(),
                factor: 1.5
            })
        );
        for bad in [
            "slow-model",
            "slow-model:m",
            "slow-model::2",
            "slow-model:m:1",
            "slow-model:m:0.5",
            "slow-model:m:17",
            "slow-model:m:NaN",
            "slow-model:m:2:3",
        ] {
            let e = bad.parse::<Fault>().unwrap_err();
            assert!(e.contains("FACTOR above 1, at most 16"), "{bad}: {e}");
        }
    }

    /// A model whose batches take 4 ms on the emulated GPU.
    fn model(id: u32, name: &str) -> ModelInfo {
        ModelInfo {
            id: ModelId(id),
            name: name.into(),
            slo: crate::core::Dur(100_000_000),
            profile: crate::wire::WireProfile::Linear {
                alpha_ns: 0,
                beta_ns: 4_000_000,
                max_batch: 8,
            },
            input_bytes: 4,
            meta_json: String::new(),
        }
    }

    #[test]
    fn a_slowed_model_holds_its_gpu_for_the_factor_and_others_do_not() {
        let mut f = Faulty::new(
            Box::new(crate::node::exec::EmulatedGpu::new()),
            "slow-model:slow:3".parse().unwrap(),
        );
        let (slow, fast) = (model(0, "slow"), model(1, "fast"));
        f.load(&slow).unwrap();
        f.load(&fast).unwrap();
        assert_eq!(f.slowed, Some(ModelId(0)));
        let t0 = std::time::Instant::now();
        f.run(ModelId(0), &[b"abcd"]).unwrap();
        // At least three times the 4 ms run: the run, then twice it held.
        assert!(
            t0.elapsed() >= Duration::from_millis(12),
            "{:?}",
            t0.elapsed()
        );
        // Held for twice the run; the other model not at all.
        let s = Duration::from_secs(1);
        assert_eq!(f.hold_after(ModelId(0), s), Duration::from_secs(2));
        assert_eq!(f.hold_after(ModelId(1), s), Duration::ZERO);
        // The wrapper lends the inner executor's staging (none for the emulated GPU).
        assert!(f.stage_pool().is_none());
    }
}
