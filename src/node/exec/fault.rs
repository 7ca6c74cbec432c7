//! Fault injection for tests of failure handling with real processes: the
//! environment variable `FERMATA_FAULT` (read once, when a backend makes its
//! executors) wraps each GPU's executor so that it misbehaves on purpose.
//!
//! * `gpu-hang:AFTER:MS` — after AFTER batches, the next batch blocks its GPU
//!   for MS milliseconds (once), while the process goes on answering pings:
//!   what the scheduler's plan watchdog is for.
//!
//! Unset (the default) it costs nothing: executors are not wrapped. A value
//! that does not parse stops the backend at start with the reason.

use super::Executor;
use crate::core::ModelId;
use crate::wire::ModelInfo;
use std::time::Duration;

/// The environment variable that asks for a fault.
pub const FAULT_ENV: &str = "FERMATA_FAULT";

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// After `after` batches, the next one blocks for `hold`.
    GpuHang { after: u64, hold: Duration },
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Fault, String> {
        let bad = || format!("{FAULT_ENV}={s:?}: expected gpu-hang:AFTER_BATCHES:MS");
        let mut it = s.split(':');
        match it.next() {
            Some("gpu-hang") => {
                let after = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
                let ms: u64 = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
                if it.next().is_some() || ms > 600_000 {
                    return Err(bad());
                }
                Ok(Fault::GpuHang {
                    after,
                    hold: Duration::from_millis(ms),
                })
            }
            _ => Err(bad()),
        }
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

impl Executor for Faulty {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn load(&mut self, model: &ModelInfo) -> anyhow::Result<()> {
        self.inner.load(model)
    }
    fn unload(&mut self, model: ModelId) {
        self.inner.unload(model)
    }
    fn device_bytes(&self, model: ModelId) -> Option<u64> {
        self.inner.device_bytes(model)
    }
    fn buckets(&self, model: ModelId) -> Vec<u32> {
        self.inner.buckets(model)
    }
    fn run(&mut self, model: ModelId, inputs: &[&[u8]]) -> anyhow::Result<Vec<Vec<u8>>> {
        self.batches += 1;
        let Fault::GpuHang { after, hold } = self.fault;
        if self.batches == after + 1 {
            tracing::warn!(
                hold_ms = hold.as_millis() as u64,
                "backend: injected GPU hang"
            );
            std::thread::sleep(hold);
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
        for bad in [
            "gpu-hang",
            "gpu-hang:x:1",
            "gpu-hang:1:2:3",
            "hang:1:2",
            "gpu-hang:1:9999999",
        ] {
            let e = bad.parse::<Fault>().unwrap_err();
            assert!(e.contains("gpu-hang:AFTER_BATCHES:MS"), "{e}");
        }
    }
}
