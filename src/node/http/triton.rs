//! Triton's documents beside KServe v2: a model's configuration
//! (`GET /v2/models/{m}/config`, Triton's model-config JSON) and its
//! statistics (`GET /v2/models[/{m}]/stats`, Triton's statistics extension),
//! which Triton's clients and `perf_analyzer` read before they send a request.
//!
//! The statistics are the frontend's ([`ModelStats`], shared with the gRPC
//! API; what they count is said there).

use crate::node::frontend::stats::{ModelStats, Stat};
use crate::repo::{DType, ModelMeta};
use crate::wire::DeviceCounts;
use serde_json::{json, Value};

/// The protocol extensions Fermata serves (server metadata, HTTP and gRPC):
/// Triton's clients and perf_analyzer look here before they ask for them.
pub(in crate::node) const EXTENSIONS: [&str; 5] = [
    "binary_tensor_data",
    "classification",
    "model_configuration",
    "statistics",
    "parameters",
];

/// A model's platform and backend names in its configuration (`emulated`: a
/// profile-only model).
pub(in crate::node) fn platform(emulated: bool) -> (&'static str, &'static str) {
    if emulated {
        ("fermata_emulated", "fermata")
    } else {
        ("onnxruntime_onnx", "onnxruntime")
    }
}

/// Triton's instance-group kinds (`ModelInstanceGroup.Kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::node) enum GroupKind {
    Auto = 0,
    Gpu = 1,
    Cpu = 2,
}

impl GroupKind {
    pub(in crate::node) fn name(self) -> &'static str {
        match self {
            GroupKind::Auto => "KIND_AUTO",
            GroupKind::Gpu => "KIND_GPU",
            GroupKind::Cpu => "KIND_CPU",
        }
    }
}

/// A model's instance groups (kind, count) from what runs its GPUs: one
/// instance on each real GPU (`KIND_GPU`, count 1: Triton's count is per
/// GPU), and one per CPU executor or emulated GPU (`KIND_CPU`, counted: each
/// runs one batch at a time on the CPU). With no GPU in service, `KIND_AUTO`:
/// the backends that join decide.
pub(in crate::node) fn instance_groups(d: DeviceCounts) -> Vec<(GroupKind, u32)> {
    let mut g = Vec::new();
    if d.gpu > 0 {
        g.push((GroupKind::Gpu, 1));
    }
    let cpu = d.cpu.saturating_add(d.emulated);
    if cpu > 0 {
        g.push((GroupKind::Cpu, cpu));
    }
    if g.is_empty() {
        g.push((GroupKind::Auto, 1));
    }
    g
}

/// The queue policy's default timeout (µs) in a model's configuration: its
/// SLO, which a request's `timeout` parameter overrides.
pub(in crate::node) fn queue_timeout_us(meta: &ModelMeta) -> u64 {
    (meta.slo_ms * 1e3).round().max(0.0) as u64
}

/// Triton's model-config name of a datatype.
pub(in crate::node) fn config_type(d: DType) -> &'static str {
    match d {
        DType::Bool => "TYPE_BOOL",
        DType::U8 => "TYPE_UINT8",
        DType::U16 => "TYPE_UINT16",
        DType::U32 => "TYPE_UINT32",
        DType::U64 => "TYPE_UINT64",
        DType::I8 => "TYPE_INT8",
        DType::I16 => "TYPE_INT16",
        DType::I32 => "TYPE_INT32",
        DType::I64 => "TYPE_INT64",
        DType::F16 => "TYPE_FP16",
        DType::BF16 => "TYPE_BF16",
        DType::F32 => "TYPE_FP32",
        DType::F64 => "TYPE_FP64",
        DType::Bytes => "TYPE_STRING",
    }
}

/// The model's configuration in Triton's model-config JSON: a batching model
/// (`max_batch_size` its largest batch, `dims` without the batch dimension)
/// with a dynamic batcher whose queue policy rejects a request at its
/// deadline (the model's SLO by default; a request's `timeout` parameter
/// overrides it). `emulated`: a profile-only model; `devices`: what runs its
/// GPUs ([`instance_groups`]).
pub(super) fn config_json(meta: &ModelMeta, emulated: bool, devices: DeviceCounts) -> Value {
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
    let slo_us = queue_timeout_us(meta);
    let (platform, backend) = platform(emulated);
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
        "instance_group": instance_groups(devices)
            .into_iter()
            .enumerate()
            .map(|(i, (kind, count))| json!({
                "name": format!("{}_{i}", meta.name),
                "kind": kind.name(),
                "count": count,
            }))
            .collect::<Vec<_>>(),
        "parameters": {
            "fermata_slo_ms": {"string_value": meta.slo_ms.to_string()},
            "fermata_scheduling": {"string_value": "deferred batching (Symphony)"},
        },
    })
}

/// An application's configuration in Triton's model-config JSON: platform
/// `ensemble`, its tensors, its steps with their maps, and Fermata's
/// parameters (fan-out, deadline rule, SLO).
pub(super) fn app_config_json(app: &crate::node::apps::ServedApp) -> Value {
    let meta = &app.meta;
    let mut v = config_json(meta, false, DeviceCounts::default());
    v["platform"] = json!("ensemble");
    v["backend"] = json!("");
    if let Some(o) = v.as_object_mut() {
        o.remove("dynamic_batching");
        o.remove("instance_group");
    }
    v["ensemble_scheduling"] = json!({
        "step": app.steps().iter().map(|s| json!({
            "model_name": s.model,
            "model_version": -1,
            "input_map": s.input_map,
            "output_map": s.output_map,
        })).collect::<Vec<_>>(),
    });
    let c = &app.config;
    let fanout: Vec<String> = c
        .fanout
        .iter()
        .map(|f| match &f.count {
            Some(n) => format!("{}:{n}", f.tensor),
            None => f.tensor.clone(),
        })
        .collect();
    v["parameters"] = json!({
        "slo_ms": {"string_value": meta.slo_ms.to_string()},
        crate::triton_ensemble::FANOUT_PARAMETER: {"string_value": fanout.join(",")},
        crate::triton_ensemble::DEADLINE_PARAMETER: {"string_value": match c.rule {
            crate::triton_ensemble::Rule::Static => "static",
            crate::triton_ensemble::Rule::SlackForwarding => "slack-forwarding",
            crate::triton_ensemble::Rule::LatestUseful => "latest-useful",
        }},
    });
    v
}

/// A model's entry of Triton's `model_stats` (JSON), from its statistics.
pub(super) fn stats_json(name: &str, s: &ModelStats) -> Value {
    let d = |x: Stat| json!({"count": x.count, "ns": x.ns});
    let zero = json!({"count": 0, "ns": 0});
    let v = s.snapshot();
    let batch_stats: Vec<Value> = v
        .batches
        .iter()
        .map(|b| {
            json!({
                "batch_size": b.size,
                "compute_input": {"count": b.count, "ns": 0},
                "compute_infer": {"count": b.count, "ns": b.ns},
                "compute_output": {"count": b.count, "ns": 0},
            })
        })
        .collect();
    let n = v.compute_infer.count;
    json!({
        "name": name,
        "version": "1",
        "last_inference": v.last_inference_ms,
        "inference_count": v.inference_count,
        "execution_count": v.execution_count,
        "inference_stats": {
            "success": d(v.success),
            "fail": d(v.fail),
            "queue": d(v.queue),
            "compute_input": {"count": n, "ns": 0},
            "compute_infer": d(v.compute_infer),
            "compute_output": {"count": n, "ns": 0},
            "cache_hit": zero,
            "cache_miss": zero,
        },
        "batch_stats": batch_stats,
        "memory_usage": [],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stats_json_has_triton_s_shape() {
        let s = ModelStats::new(8);
        s.sample(Duration::from_micros(100), Duration::from_micros(900), 2);
        s.sample(Duration::from_micros(100), Duration::from_micros(900), 2);
        s.request(true, Duration::from_millis(1));
        let j = stats_json("m", &s);
        assert_eq!(j["name"], "m");
        assert_eq!(j["version"], "1");
        assert_eq!(j["inference_count"], 2);
        assert_eq!(j["execution_count"], 1);
        assert_eq!(j["inference_stats"]["success"]["count"], 1);
        assert_eq!(j["inference_stats"]["compute_input"]["count"], 2);
        assert_eq!(j["batch_stats"][0]["batch_size"], 2);
        assert_eq!(j["batch_stats"][0]["compute_infer"]["ns"], 1_800_000);
    }
}
