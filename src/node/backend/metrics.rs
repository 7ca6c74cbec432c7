//! The backend's Prometheus series, labelled with its name: plans and tasks by
//! outcome and the waits on its internal channels (read from [`Shared`]'s atomics
//! at scrape time), batch sizes per model and batch start delays.

use super::shared::Shared;
use crate::metrics::{Histogram, Kind, Registry, BATCH_BUCKETS, LATENCY_BUCKETS};
use crate::wire::ModelInfo;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How late batches started after their planned `exec_at`.
pub(super) fn start_delay_histogram(reg: &Registry, backend: &str) -> Arc<Histogram> {
    reg.histogram(
        "fermata_backend_start_delay_seconds",
        "How late batches started after their planned exec_at.",
        &[("backend", backend)],
        Histogram::seconds(LATENCY_BUCKETS),
    )
}

/// Tasks per batch of `model` (registered when the model loads).
pub(super) fn batch_size_histogram(sh: &Shared, model: &ModelInfo) -> Arc<Histogram> {
    sh.registry.histogram(
        "fermata_backend_batch_size",
        "Tasks per batch run on this backend.",
        &[("backend", &sh.name), ("model", &model.name)],
        Histogram::new(BATCH_BUCKETS, 1.0),
    )
}

/// The plan and task counters (read from the backend's atomics at scrape time).
pub(super) fn register_counters(sh: &Arc<Shared>) {
    outcome_counter(
        sh,
        "fermata_backend_plans_total",
        "Batch plans ended on this backend, by outcome (ran, too_late: not started in time, failed, refused: failed a check or found the GPU's queue full, void: its scheduler was lost before it ran).",
        |s| {
            vec![
                ("ran", s.plans_run.load(Ordering::Relaxed)),
                ("too_late", s.plans_too_late.load(Ordering::Relaxed)),
                ("failed", s.plans_failed.load(Ordering::Relaxed)),
                ("refused", s.plans_refused.load(Ordering::Relaxed)),
                ("void", s.plans_void.load(Ordering::Relaxed)),
            ]
        },
    );
    outcome_counter(
        sh,
        "fermata_backend_tasks_total",
        "Tasks ended on this backend, by outcome (ran, too_late, input_missing, failed).",
        |s| {
            vec![
                ("ran", s.tasks_run.load(Ordering::Relaxed)),
                ("too_late", s.tasks_too_late.load(Ordering::Relaxed)),
                ("input_missing", s.inputs_missing()),
                ("failed", s.tasks_failed.load(Ordering::Relaxed)),
            ]
        },
    );
}

/// Waits on a full internal channel (see
/// [`WORKER_MAX`](super::channels::WORKER_MAX),
/// [`LOADS_MAX`](super::channels::LOADS_MAX)).
pub(super) fn register_waits(sh: &Arc<Shared>) {
    let name = sh.name.clone();
    let w = Arc::downgrade(sh);
    sh.registry.collector(
        "fermata_backend_channel_waits_total",
        "Times a backend thread found an internal channel full (WORKER_MAX, LOADS_MAX) and waited.",
        Kind::Counter,
        move || {
            w.upgrade().map_or_else(Vec::new, |s| {
                let v = s.channel_waits.load(Ordering::Relaxed) as f64;
                vec![(vec![("backend".to_string(), name.clone())], v)]
            })
        },
    );
}

/// A counter labelled by backend and outcome, read by `values` at scrape time.
fn outcome_counter(
    sh: &Arc<Shared>,
    metric: &str,
    help: &str,
    values: fn(&Shared) -> Vec<(&'static str, u64)>,
) {
    let name = sh.name.clone();
    let w = Arc::downgrade(sh);
    sh.registry.collector(metric, help, Kind::Counter, move || {
        let Some(s) = w.upgrade() else {
            return Vec::new();
        };
        values(&s)
            .into_iter()
            .map(|(o, v)| {
                (
                    vec![
                        ("backend".to_string(), name.clone()),
                        ("outcome".to_string(), o.to_string()),
                    ],
                    v as f64,
                )
            })
            .collect()
    });
}
