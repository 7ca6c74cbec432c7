//! What a run is asked and what it reports, whichever runs it: the simulator
//! (`fermata sim`), the real-time runtime with fakes
//! ([`crate::harness::fake`]), or a distributed cluster driven by the load
//! generator ([`crate::harness::loadgen`]). The options ([`RunOptions`]), the
//! results per model and in total ([`ModelResult`], [`RunResult`]) and their
//! JSON ([`run_json`]).

use crate::core::{Dur, GpuId, ModelId, PlanId, Policy, TaskId, Time};
use crate::workload::{Arrival, Workload};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

pub fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

/// Options of one run (the workload gives the rest): the simulator, the
/// real-time runtime and the distributed load generator take the same.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub policy: Policy,
    pub rate_rps: f64,
    pub arrival: Arrival,
    pub seed: u64,
    pub warmup: Dur,
    pub duration: Dur,
    /// Check the core's and the simulator's invariants after every event.
    pub check: bool,
    /// Keep every dispatched plan (for traces and tests).
    pub record_plans: bool,
}

impl RunOptions {
    pub fn from_workload(w: &Workload) -> RunOptions {
        RunOptions {
            policy: w.policy,
            rate_rps: w.rate_rps,
            arrival: w.arrival,
            seed: w.seed,
            warmup: w.warmup,
            duration: w.duration,
            check: true,
            record_plans: false,
        }
    }
}

/// One dispatched plan as the simulator saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRecord {
    pub plan: PlanId,
    pub model: ModelId,
    pub gpu: GpuId,
    /// When the scheduler sent it.
    pub sent_at: Time,
    pub exec_at: Time,
    pub tasks: Vec<TaskId>,
    /// Set when Shepherd preempted it.
    pub preempted: bool,
}

/// Per-model results over the measured window.
#[derive(Debug, Clone)]
pub struct ModelResult {
    pub name: String,
    /// Requests that arrived in the measured window.
    pub offered: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    /// `batch_requests[b]`: requests that ran in a batch of size b (b >= 1).
    pub batch_requests: Vec<u64>,
    /// Arrival to batch start, in microseconds.
    pub queuing_us: Histogram<u64>,
}

impl ModelResult {
    /// No requests yet.
    pub fn new(name: &str) -> ModelResult {
        ModelResult {
            name: name.to_string(),
            offered: 0,
            good: 0,
            late: 0,
            dropped: 0,
            batch_requests: Vec::new(),
            queuing_us: new_hist(),
        }
    }

    pub fn bad(&self) -> u64 {
        self.late + self.dropped
    }
    pub fn bad_rate(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            self.bad() as f64 / self.offered as f64
        }
    }
    /// The batch size at quantile `q` over requests.
    pub fn batch_quantile(&self, q: f64) -> u32 {
        quantile_of_counts(&self.batch_requests, q)
    }
}

/// The `q` quantile of a histogram given as counts per value.
pub fn quantile_of_counts(counts: &[u64], q: f64) -> u32 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    let target = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut acc = 0;
    for (b, c) in counts.iter().enumerate() {
        acc += c;
        if acc >= target {
            return b as u32;
        }
    }
    (counts.len() - 1) as u32
}

/// Results of one run.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub policy: Policy,
    pub rate_rps: f64,
    pub models: Vec<ModelResult>,
    /// Busy fraction of each GPU over the measured window.
    pub gpu_busy: Vec<f64>,
    /// All requests simulated (warm-up and drain included).
    pub sim_requests: u64,
    pub wall_secs: f64,
    pub plans: Vec<PlanRecord>,
    pub preemptions: u64,
    pub window: Dur,
}

impl RunResult {
    pub fn offered(&self) -> u64 {
        self.models.iter().map(|m| m.offered).sum()
    }
    pub fn good(&self) -> u64 {
        self.models.iter().map(|m| m.good).sum()
    }
    pub fn bad_rate(&self) -> f64 {
        let o = self.offered();
        if o == 0 {
            0.0
        } else {
            (o - self.good()) as f64 / o as f64
        }
    }
    /// The worst model's bad rate (goodput requires every model <= 1%).
    pub fn max_model_bad_rate(&self) -> f64 {
        self.models.iter().map(|m| m.bad_rate()).fold(0.0, f64::max)
    }
    pub fn goodput_rps(&self) -> f64 {
        self.good() as f64 / self.window.as_secs_f64()
    }
    pub fn gpu_busy_fraction(&self) -> f64 {
        if self.gpu_busy.is_empty() {
            0.0
        } else {
            self.gpu_busy.iter().sum::<f64>() / self.gpu_busy.len() as f64
        }
    }
    pub fn batch_requests(&self) -> Vec<u64> {
        let n = self
            .models
            .iter()
            .map(|m| m.batch_requests.len())
            .max()
            .unwrap_or(0);
        let mut v = vec![0; n];
        for m in &self.models {
            for (b, c) in m.batch_requests.iter().enumerate() {
                v[b] += c;
            }
        }
        v
    }
    pub fn queuing_us(&self) -> Histogram<u64> {
        let mut h = new_hist();
        for m in &self.models {
            h.add(&m.queuing_us).expect("same bounds");
        }
        h
    }
    pub fn sim_requests_per_sec(&self) -> f64 {
        self.sim_requests as f64 / self.wall_secs.max(1e-9)
    }
}

pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// JSON for one run (simulated, real-time or distributed).
pub fn run_json(w: &Workload, r: &RunResult) -> Value {
    let per_model: Vec<Value> = r
        .models
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "offered": m.offered,
                "good": m.good,
                "late": m.late,
                "dropped": m.dropped,
                "bad_rate": round(m.bad_rate(), 6),
                "goodput_rps": round(m.good as f64 / r.window.as_secs_f64(), 2),
                "batch_size_p50": m.batch_quantile(0.5),
                "batch_size_p99": m.batch_quantile(0.99),
                "batch_size_requests": m.batch_requests,
                "queuing_delay_ms_p50": round(m.queuing_us.value_at_quantile(0.5) as f64 / 1e3, 4),
                "queuing_delay_ms_p99": round(m.queuing_us.value_at_quantile(0.99) as f64 / 1e3, 4),
            })
        })
        .collect();
    let q = r.queuing_us();
    let batches = r.batch_requests();
    json!({
        "workload": w.name,
        "policy": r.policy.name(),
        "rate_rps": round(r.rate_rps, 3),
        "offered": r.offered(),
        "good": r.good(),
        "goodput_rps": round(r.goodput_rps(), 2),
        "bad_rate": round(r.bad_rate(), 6),
        "max_model_bad_rate": round(r.max_model_bad_rate(), 6),
        "batch_size_p50": quantile_of_counts(&batches, 0.5),
        "batch_size_p99": quantile_of_counts(&batches, 0.99),
        "gpu_busy_fraction": round(r.gpu_busy_fraction(), 4),
        "gpu_busy_per_gpu": r.gpu_busy.iter().map(|b| round(*b, 4)).collect::<Vec<_>>(),
        "queuing_delay_ms_p50": round(q.value_at_quantile(0.5) as f64 / 1e3, 4),
        "queuing_delay_ms_p99": round(q.value_at_quantile(0.99) as f64 / 1e3, 4),
        "preemptions": r.preemptions,
        "sim_requests": r.sim_requests,
        "sim_requests_per_sec": round(r.sim_requests_per_sec(), 0),
        "per_model": per_model,
    })
}
