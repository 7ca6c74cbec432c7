//! What a backend counted ([`BackendReport`]), read from its shared counters and
//! recent measurements when it stops.

use super::shared::Shared;
use crate::node::clock::Recent;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// Counts of what a backend did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct BackendReport {
    pub plans_run: u64,
    /// Plans not run at all: none of their tasks could still meet its deadline.
    pub plans_too_late: u64,
    /// Tasks left out of their batch because it started too late for them.
    pub tasks_too_late: u64,
    pub plans_failed: u64,
    /// Plans refused on arrival (for another's GPU, for a model not loaded
    /// here, out of range, or no room in the GPU's queue): their tasks fail.
    pub plans_refused: u64,
    /// Plans not run because their scheduler was lost before their start.
    pub plans_void: u64,
    /// Times the backend lost its scheduler and joined again.
    pub rejoins: u64,
    pub tasks_run: u64,
    /// Tasks that failed in the executor (alone, when the rest of their batch
    /// ran), and the extra runs spent finding them.
    pub tasks_failed: u64,
    pub isolate_reruns: u64,
    pub inputs_missing: u64,
    /// Why inputs went missing: no answer within the pull budget, a slot that no
    /// longer held the task (freed or reused at the frontend), an unreachable or
    /// out-of-bounds region.
    pub inputs_missing_timeout: u64,
    pub inputs_missing_stale: u64,
    pub inputs_missing_error: u64,
    /// Inputs not read because their tasks could no longer meet their
    /// deadlines when the puller came to their plan (dropped as too late).
    pub inputs_skipped: u64,
    /// How late batches started after exec_at, p50/p99 (us).
    pub start_delay_p50_us: f64,
    pub start_delay_p99_us: f64,
    /// Batches' run times over their profile's latency (the scheduler's
    /// prediction), median and p99 of the last 2,048 batches.
    pub run_over_profile_p50: f64,
    pub run_over_profile_p99: f64,
    pub pull_p99_us_per_task: f64,
    /// Pull time per input of a batch: median and largest (us).
    pub pull_p50_us_per_task: f64,
    pub pull_max_us_per_task: f64,
    /// Each batch's pull (us): the median and p99 of the whole batch's pull
    /// time, the median budget the estimator predicted for a batch before
    /// pulling it, batches pulled with a prediction, the share of them whose
    /// pull took longer, and batches whose inputs were in only after `exec_at`.
    pub pull_batch_p50_us: f64,
    pub pull_batch_p99_us: f64,
    pub pull_predicted_p50_us: f64,
    pub pulls_predicted: u64,
    pub pull_overrun_share: f64,
    pub pulls_late: u64,
    /// Batches pulled while their GPU slot ran the batch before (pulled
    /// ahead), and those of them whose inputs were in only after `exec_at`.
    pub pulls_overlapped: u64,
    pub pulls_overlapped_late: u64,
    /// Input bytes pulled into the backend's buffers, and those an executor
    /// then copied into a buffer of its own (its batch tensors).
    pub input_bytes_pulled: u64,
    pub input_bytes_gathered: u64,
    /// The estimator's fit at the end: fixed part per batch, and per MiB (us).
    pub pull_fixed_us: f64,
    pub pull_per_mib_us: f64,
    /// Inputs pulled into a fresh buffer because the pool had none.
    pub pull_buffers_allocated: u64,
    /// One-way plan delay from the scheduler, p50 / p99 (us).
    pub plan_delay_p50_us: f64,
    pub plan_delay_p99_us: f64,
    /// exec_at minus the plan's arrival at the backend, 1st percentile and median
    /// (us; negative: it came too late to start on time).
    pub lead_arrived_p1_us: f64,
    pub lead_arrived_p50_us: f64,
    /// exec_at minus the moment its inputs were pulled, 1st percentile (us).
    pub lead_pulled_p1_us: f64,
    pub clock_offset_us: f64,
    pub clock_error_us: f64,
    /// Batches each GPU may run at once (`--lanes`), the most each GPU ran at
    /// once, and the times a lane was asked to start a batch while it ran one.
    pub lanes: u32,
    pub gpu_batches_at_once_max: Vec<u32>,
    pub lane_overlaps: u64,
    pub error: Option<String>,
}

impl Shared {
    /// The report of what the backend did so far.
    pub(super) fn report(&self) -> BackendReport {
        let s = self;
        let q = |r: &Mutex<Recent>, p: f64| r.lock().expect("lock").quantile(p) as f64 / 1e3;
        let fit = s.pull_est.lock().expect("lock").fit().unwrap_or_default();
        let lanes = s.lanes.lock().expect("lock").clone();
        BackendReport {
            plans_run: s.plans_run.load(Ordering::Relaxed),
            plans_too_late: s.plans_too_late.load(Ordering::Relaxed),
            tasks_too_late: s.tasks_too_late.load(Ordering::Relaxed),
            plans_failed: s.plans_failed.load(Ordering::Relaxed),
            plans_refused: s.plans_refused.load(Ordering::Relaxed),
            plans_void: s.plans_void.load(Ordering::Relaxed),
            rejoins: s.rejoins.load(Ordering::Relaxed),
            tasks_run: s.tasks_run.load(Ordering::Relaxed),
            tasks_failed: s.tasks_failed.load(Ordering::Relaxed),
            isolate_reruns: s.isolate_reruns.load(Ordering::Relaxed),
            inputs_missing: s.inputs_missing(),
            inputs_missing_timeout: s.missing_why[0].load(Ordering::Relaxed),
            inputs_missing_stale: s.missing_why[1].load(Ordering::Relaxed),
            inputs_missing_error: s.missing_why[2].load(Ordering::Relaxed),
            inputs_skipped: s.inputs_skipped.load(Ordering::Relaxed),
            start_delay_p50_us: q(&s.start_delay, 0.5),
            start_delay_p99_us: q(&s.start_delay, 0.99),
            run_over_profile_p50: q(&s.run_over_profile, 0.5),
            run_over_profile_p99: q(&s.run_over_profile, 0.99),
            pull_p99_us_per_task: q(&s.pull, 0.99),
            pull_p50_us_per_task: q(&s.pull, 0.5),
            pull_max_us_per_task: q(&s.pull, 1.0),
            pull_batch_p50_us: q(&s.pull_batch, 0.5),
            pull_batch_p99_us: q(&s.pull_batch, 0.99),
            pull_predicted_p50_us: q(&s.pull_predicted, 0.5),
            pulls_predicted: s.pulls.load(Ordering::Relaxed),
            pull_overrun_share: s.pulls_over.load(Ordering::Relaxed) as f64
                / s.pulls.load(Ordering::Relaxed).max(1) as f64,
            pulls_late: s.pulls_late.load(Ordering::Relaxed),
            pulls_overlapped: s.pulls_overlapped.load(Ordering::Relaxed),
            pulls_overlapped_late: s.pulls_overlapped_late.load(Ordering::Relaxed),
            input_bytes_pulled: s.input_bytes_pulled.load(Ordering::Relaxed),
            input_bytes_gathered: s.input_bytes_gathered.load(Ordering::Relaxed),
            pull_fixed_us: fit.fixed.as_us_f64(),
            pull_per_mib_us: fit.per_mib.as_us_f64(),
            pull_buffers_allocated: s.pool_misses.load(Ordering::Relaxed),
            plan_delay_p50_us: q(&s.plan_delay, 0.5),
            plan_delay_p99_us: q(&s.plan_delay, 0.99),
            lead_arrived_p1_us: q(&s.lead_arrived, 0.01),
            lead_arrived_p50_us: q(&s.lead_arrived, 0.5),
            lead_pulled_p1_us: q(&s.lead_pulled, 0.01),
            clock_offset_us: s.clock.offset().as_us_f64(),
            clock_error_us: s.clock.error_bound().as_us_f64(),
            lanes: lanes.map().lanes,
            gpu_batches_at_once_max: lanes.peak().to_vec(),
            lane_overlaps: lanes.overlaps(),
            error: None,
        }
    }
}
