//! The backend's Prometheus series, labelled with its name: plans and tasks by
//! outcome and the waits on its internal channels (read from [`Shared`]'s atomics
//! at scrape time), batch sizes per model, batch start delays, and each batch's
//! input pull against the budget predicted for it.

use super::lanes::LaneBook;
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

/// Each batch's run time over the latency its profile gives for the tasks it
/// ran (the scheduler's prediction), observed per mille.
pub(super) fn run_over_profile_histogram(reg: &Registry, backend: &str) -> Arc<Histogram> {
    reg.histogram(
        "fermata_backend_run_over_profile",
        "Batches' run time over the latency their model's profile predicts for their size (1 = as planned).",
        &[("backend", backend)],
        Histogram::new(&[0.5, 0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 5.0], 1000.0),
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
        "Tasks ended on this backend, by outcome (ran, too_late, input_missing, skipped: not pulled, already too late, failed).",
        |s| {
            vec![
                ("ran", s.tasks_run.load(Ordering::Relaxed)),
                ("too_late", s.tasks_too_late.load(Ordering::Relaxed)),
                ("input_missing", s.inputs_missing()),
                ("skipped", s.inputs_skipped.load(Ordering::Relaxed)),
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

/// Bounds of the pull histograms (seconds): 10 us to 50 ms.
const PULL_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
];

/// Batch-size buckets of the pull histograms: (upper bound, label).
const PULL_SIZE_BUCKETS: [(usize, &str); 5] = [
    (1, "1"),
    (4, "2-4"),
    (16, "5-16"),
    (64, "17-64"),
    (usize::MAX, "65+"),
];

/// The pull time of each batch and the budget predicted for it before it was
/// pulled, by batch-size bucket.
pub(super) struct PullHistograms {
    actual: Vec<Arc<Histogram>>,
    predicted: Vec<Arc<Histogram>>,
}

impl PullHistograms {
    pub(super) fn observe(
        &self,
        n: usize,
        took: crate::core::Dur,
        predicted: Option<crate::core::Dur>,
    ) {
        let i = PULL_SIZE_BUCKETS
            .iter()
            .position(|&(hi, _)| n <= hi)
            .unwrap_or(PULL_SIZE_BUCKETS.len() - 1);
        self.actual[i].observe(took.0.max(0) as u64);
        if let Some(p) = predicted {
            self.predicted[i].observe(p.0.max(0) as u64);
        }
    }
}

/// The pull histograms, by batch-size bucket.
pub(super) fn pull_histograms(reg: &Registry, backend: &str) -> PullHistograms {
    let h = |name: &str, help: &str| -> Vec<Arc<Histogram>> {
        PULL_SIZE_BUCKETS
            .iter()
            .map(|&(_, b)| {
                reg.histogram(
                    name,
                    help,
                    &[("backend", backend), ("batch", b)],
                    Histogram::seconds(PULL_BUCKETS),
                )
            })
            .collect()
    };
    PullHistograms {
        actual: h(
            "fermata_backend_pull_seconds",
            "Time to pull a whole batch's inputs, by batch size.",
        ),
        predicted: h(
            "fermata_backend_pull_predicted_seconds",
            "The pull budget the backend's estimator predicted for a batch before pulling it, by batch size.",
        ),
    }
}

/// The pull counts: batches pulled with a prediction in place, those whose
/// pull overran it, and those whose inputs were in only after `exec_at`.
pub(super) fn register_pull_counters(sh: &Arc<Shared>) {
    outcome_counter(
        sh,
        "fermata_backend_pulls_total",
        "Batches pulled, by outcome (predicted: with a budget predicted; over: took longer than predicted; late: inputs in only after the planned start; overlapped: pulled while the GPU ran the batch before; overlapped_late: of those, inputs in only after the planned start).",
        |s| {
            vec![
                ("predicted", s.pulls.load(Ordering::Relaxed)),
                ("over", s.pulls_over.load(Ordering::Relaxed)),
                ("late", s.pulls_late.load(Ordering::Relaxed)),
                ("overlapped", s.pulls_overlapped.load(Ordering::Relaxed)),
                (
                    "overlapped_late",
                    s.pulls_overlapped_late.load(Ordering::Relaxed),
                ),
            ]
        },
    );
}

/// Input bytes copied on the backend, by stage: pulled into its buffers, and
/// gathered by an executor into a buffer of its own.
pub(super) fn register_copy_counters(sh: &Arc<Shared>) {
    outcome_counter(
        sh,
        "fermata_backend_input_copy_bytes_total",
        "Input bytes copied on the backend, by stage (outcome=pulled: read from a frontend's region into the backend's buffers; gathered: copied again by the executor into its batch tensors). With fermata_frontend_input_bytes_stored_total, the copies of an input byte from the request to the executor's buffer.",
        |s| {
            vec![
                ("pulled", s.input_bytes_pulled.load(Ordering::Relaxed)),
                ("gathered", s.input_bytes_gathered.load(Ordering::Relaxed)),
            ]
        },
    );
}

/// Concurrent lanes: each GPU's batches running now and the most it ran at
/// once, and the times a busy lane was asked to start another batch.
pub(super) fn register_lanes(sh: &Arc<Shared>) {
    let per_gpu = |sh: &Arc<Shared>, metric: &str, help: &str, f: fn(&LaneBook) -> &[u32]| {
        let name = sh.name.clone();
        let w = Arc::downgrade(sh);
        sh.registry.collector(metric, help, Kind::Gauge, move || {
            w.upgrade().map_or_else(Vec::new, |s| {
                let book = s.lanes.lock().expect("lock");
                f(&book)
                    .iter()
                    .enumerate()
                    .map(|(g, &v)| {
                        (
                            vec![
                                ("backend".to_string(), name.clone()),
                                ("gpu".to_string(), g.to_string()),
                            ],
                            f64::from(v),
                        )
                    })
                    .collect()
            })
        });
    };
    per_gpu(
        sh,
        "fermata_backend_gpu_batches_running",
        "Batches running on each GPU now (at most its --lanes).",
        LaneBook::running,
    );
    per_gpu(
        sh,
        "fermata_backend_gpu_batches_at_once_max",
        "The most batches each GPU ran at once since the backend started.",
        LaneBook::peak,
    );
    let name = sh.name.clone();
    let w = Arc::downgrade(sh);
    sh.registry.collector(
        "fermata_backend_lane_overlaps_total",
        "Times a lane was asked to start a batch while it ran one (each lane runs one batch at a time: 0).",
        Kind::Counter,
        move || {
            w.upgrade().map_or_else(Vec::new, |s| {
                let v = s.lanes.lock().expect("lock").overlaps() as f64;
                vec![(vec![("backend".to_string(), name.clone())], v)]
            })
        },
    );
}
