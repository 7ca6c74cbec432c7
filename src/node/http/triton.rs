//! Triton's documents beside KServe v2: a model's configuration
//! (`GET /v2/models/{m}/config`, Triton's model-config JSON) and its
//! statistics (`GET /v2/models[/{m}]/stats`, Triton's statistics extension),
//! which Triton's clients and `perf_analyzer` read before they send a request.
//!
//! The statistics are kept per model by the HTTP API ([`ModelStats`]: a few
//! relaxed atomic adds per sample answered) from what each answer says: its
//! latency, its time in the queue and its batch's size. What they mean here:
//!
//! * `inference_count`: samples answered good; `success` / `fail`: requests
//!   (a request of N samples counts once) and their time from receipt to answer.
//! * `queue`: per good sample, from its receipt to its batch's start.
//! * `compute_infer`: per good sample, from its batch's start to its answer
//!   (the batch's input pull, run and result push together); `compute_input`
//!   and `compute_output` are not measured apart and stay 0.
//! * `execution_count`, `batch_stats`: batches as this frontend saw them (a
//!   sample in a batch of b counts 1/b of an execution), so with several
//!   frontends each reports its share.

use crate::repo::{DType, ModelMeta};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Triton's model-config name of a datatype.
pub(super) fn config_type(d: DType) -> &'static str {
    match d {
        DType::Bool => "TYPE_BOOL",
        DType::U8 => "TYPE_UINT8",
        DType::I8 => "TYPE_INT8",
        DType::I32 => "TYPE_INT32",
        DType::I64 => "TYPE_INT64",
        DType::F16 => "TYPE_FP16",
        DType::F32 => "TYPE_FP32",
        DType::F64 => "TYPE_FP64",
    }
}

/// The model's configuration in Triton's model-config JSON: a batching model
/// (`max_batch_size` its largest batch, `dims` without the batch dimension)
/// with a dynamic batcher whose queue policy rejects a request at its
/// deadline (the model's SLO by default; a request's `timeout` parameter
/// overrides it). `emulated`: a profile-only model.
pub(super) fn config_json(meta: &ModelMeta, emulated: bool) -> Value {
    let tensors = |ts: &[crate::repo::TensorMeta]| -> Vec<Value> {
        ts.iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "data_type": config_type(t.datatype),
                    "format": "FORMAT_NONE",
                    "dims": t.sample_shape(),
                    "is_shape_tensor": false,
                    "allow_ragged_batch": false,
                    "optional": false,
                })
            })
            .collect()
    };
    let slo_us = (meta.slo_ms * 1e3).round().max(0.0) as u64;
    let (platform, backend) = if emulated {
        ("fermata_emulated", "fermata")
    } else {
        ("onnxruntime_onnx", "onnxruntime")
    };
    json!({
        "name": meta.name,
        "platform": platform,
        "backend": backend,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": meta.max_batch,
        "input": tensors(&meta.inputs),
        "output": tensors(&meta.outputs),
        "batch_input": [],
        "batch_output": [],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": 0,
            "preserve_ordering": true,
            "priority_levels": 0,
            "default_priority_level": 0,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": slo_us,
                "allow_timeout_override": true,
                "max_queue_size": 0,
            },
        },
        "instance_group": [{
            "name": meta.name,
            "kind": if emulated { "KIND_CPU" } else { "KIND_GPU" },
            "count": 1,
        }],
        "parameters": {
            "fermata_slo_ms": {"string_value": meta.slo_ms.to_string()},
            "fermata_scheduling": {"string_value": "deferred batching (Symphony)"},
        },
    })
}

/// A count and its total time (Triton's `StatisticDuration`).
#[derive(Default)]
struct Stat {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Stat {
    fn add(&self, n: u64, d: Duration) {
        self.count.fetch_add(n, Ordering::Relaxed);
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }
    fn json(&self) -> Value {
        json!({
            "count": self.count.load(Ordering::Relaxed),
            "ns": self.ns.load(Ordering::Relaxed),
        })
    }
}

/// Executions are counted in millionths (a sample of a batch of b adds 1/b).
const EXEC_UNIT: u64 = 1_000_000;

/// One model's statistics (see the module docs).
pub(super) struct ModelStats {
    success: Stat,
    fail: Stat,
    queue: Stat,
    compute_infer: Stat,
    inferences: AtomicU64,
    /// Executions × [`EXEC_UNIT`].
    executions: AtomicU64,
    /// Milliseconds since the Unix epoch of the last answer (0: none yet).
    last_ms: AtomicU64,
    /// Per batch size b (index b − 1): executions × [`EXEC_UNIT`] and the
    /// good samples' compute time.
    batches: Vec<(AtomicU64, AtomicU64)>,
}

impl ModelStats {
    /// A model run in batches of at most `max_batch`.
    pub(super) fn new(max_batch: u32) -> ModelStats {
        ModelStats {
            success: Stat::default(),
            fail: Stat::default(),
            queue: Stat::default(),
            compute_infer: Stat::default(),
            inferences: AtomicU64::new(0),
            executions: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            batches: (0..max_batch.clamp(1, 4096))
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
        }
    }

    /// A good sample: its time in the queue, from its batch's start to its
    /// answer, and its batch's size.
    pub(super) fn sample(&self, queue: Duration, compute: Duration, batch: u32) {
        self.inferences.fetch_add(1, Ordering::Relaxed);
        self.queue.add(1, queue);
        self.compute_infer.add(1, compute);
        let b = batch.max(1) as u64;
        self.executions.fetch_add(EXEC_UNIT / b, Ordering::Relaxed);
        let i = (b as usize - 1).min(self.batches.len() - 1);
        let (n, ns) = &self.batches[i];
        n.fetch_add(EXEC_UNIT / b, Ordering::Relaxed);
        ns.fetch_add(
            compute.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// A request answered, good or not, `latency` after its receipt.
    pub(super) fn request(&self, good: bool, latency: Duration) {
        if good {
            self.success.add(1, latency);
        } else {
            self.fail.add(1, latency);
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// The model's entry of Triton's `model_stats`.
    pub(super) fn json(&self, name: &str) -> Value {
        let zero = json!({"count": 0, "ns": 0});
        let execs = |units: u64| (units + EXEC_UNIT / 2) / EXEC_UNIT;
        let batch_stats: Vec<Value> = self
            .batches
            .iter()
            .enumerate()
            .filter(|(_, (n, _))| n.load(Ordering::Relaxed) > 0)
            .map(|(i, (n, ns))| {
                json!({
                    "batch_size": i + 1,
                    "compute_input": {"count": execs(n.load(Ordering::Relaxed)), "ns": 0},
                    "compute_infer": {"count": execs(n.load(Ordering::Relaxed)), "ns": ns.load(Ordering::Relaxed)},
                    "compute_output": {"count": execs(n.load(Ordering::Relaxed)), "ns": 0},
                })
            })
            .collect();
        json!({
            "name": name,
            "version": "1",
            "last_inference": self.last_ms.load(Ordering::Relaxed),
            "inference_count": self.inferences.load(Ordering::Relaxed),
            "execution_count": execs(self.executions.load(Ordering::Relaxed)),
            "inference_stats": {
                "success": self.success.json(),
                "fail": self.fail.json(),
                "queue": self.queue.json(),
                "compute_input": {"count": self.compute_infer.count.load(Ordering::Relaxed), "ns": 0},
                "compute_infer": self.compute_infer.json(),
                "compute_output": {"count": self.compute_infer.count.load(Ordering::Relaxed), "ns": 0},
                "cache_hit": zero,
                "cache_miss": zero,
            },
            "batch_stats": batch_stats,
            "memory_usage": [],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_samples_requests_and_batches() {
        let s = ModelStats::new(8);
        // A request of 2 samples that ran in one batch of 2, and one of 1
        // sample in a batch of 4 (3 of that batch came from elsewhere).
        s.sample(Duration::from_micros(100), Duration::from_micros(900), 2);
        s.sample(Duration::from_micros(100), Duration::from_micros(900), 2);
        s.request(true, Duration::from_millis(1));
        s.sample(Duration::from_micros(50), Duration::from_micros(500), 4);
        s.request(true, Duration::from_millis(1));
        s.request(false, Duration::from_millis(3));
        let j = s.json("m");
        assert_eq!(j["inference_count"], 3);
        assert_eq!(
            j["execution_count"], 1,
            "1 batch of 2 and a quarter of one of 4"
        );
        assert_eq!(j["inference_stats"]["success"]["count"], 2);
        assert_eq!(j["inference_stats"]["success"]["ns"], 2_000_000);
        assert_eq!(j["inference_stats"]["fail"]["count"], 1);
        assert_eq!(j["inference_stats"]["queue"]["ns"], 250_000);
        assert_eq!(j["inference_stats"]["compute_infer"]["ns"], 2_300_000);
        let b = j["batch_stats"].as_array().unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b[0]["batch_size"], 2);
        assert_eq!(b[0]["compute_infer"]["count"], 1);
        assert_eq!(b[1]["batch_size"], 4);
        assert!(j["last_inference"].as_u64().unwrap() > 0);
    }

    #[test]
    fn a_batch_over_the_largest_counts_in_the_last_slot() {
        let s = ModelStats::new(2);
        s.sample(Duration::ZERO, Duration::ZERO, 9);
        let j = s.json("m");
        assert_eq!(j["batch_stats"][0]["batch_size"], 2);
    }
}
