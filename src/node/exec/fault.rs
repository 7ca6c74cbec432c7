//! Fault injection for tests of failure handling with real processes: the
//! environment variable `FERMATA_FAULT` (read once, when a backend makes its
//! executors) wraps each GPU's executor so that it misbehaves on purpose.
//!
//! * `gpu-hang:AFTER:MS` — after AFTER batches, the next batch blocks its GPU
//!   for MS milliseconds (once), while the process goes on answering pings:
//!   what the scheduler's plan watchdog is for.
//! * `slow-load:MS` — every model load takes MS milliseconds more (on the
//!   thread that loads it): what keeping loads off the GPU's worker is for.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// After `after` batches, the next one blocks for `hold`.
    GpuHang { after: u64, hold: Duration },
    /// Every load takes `hold` more.
    SlowLoad { hold: Duration },
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Fault, String> {
        let bad =
            || format!("{FAULT_ENV}={s:?}: expected gpu-hang:AFTER_BATCHES:MS or slow-load:MS");
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
}

impl Faulty {
    pub fn new(inner: Box<dyn Executor>, fault: Fault) -> Faulty {
        tracing::warn!(?fault, "backend: fault injection on ({FAULT_ENV})");
        Faulty {
            inner,
            fault,
            batches: 0,
        }
    }
}

impl Faulty {
    /// The extra time a load takes.
    fn load_hold(&self) -> Option<Duration> {
        match self.fault {
            Fault::SlowLoad { hold } => Some(hold),
            Fault::GpuHang { .. } => None,
        }
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
        self.inner.run(model, inputs)
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
                e.contains("gpu-hang:AFTER_BATCHES:MS or slow-load:MS"),
                "{e}"
            );
        }
    }
}
