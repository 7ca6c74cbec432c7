//! The scheduler's Prometheus series: tasks, plans and batch sizes per model,
//! drops per reason, the network budget in use, each model's device memory, and
//! per GPU its busy seconds and busy fraction over the last [`BUSY_WINDOW`] (from
//! the start and finish times backends report in `PlanDone`), with the mean over
//! the sub-cluster (`subcluster="0"`). A GPU's series go when its backend
//! does (its id may be given to another GPU later, which starts from 0).

use crate::core::{DropReason, Dur};
use crate::metrics::{Counter, Gauge, Histogram, Kind, Registry, Window, BATCH_BUCKETS};
use crate::wire::ModelInfo;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The window of the GPU busy fractions in the metrics.
pub const BUSY_WINDOW: Duration = Duration::from_secs(10);

/// The scheduler's hot-path metrics (per model by id, per drop code by tag).
pub(super) struct SchedMetrics {
    pub(super) tasks: Vec<Counter>,
    pub(super) plans: Vec<Counter>,
    pub(super) batch: Vec<Arc<Histogram>>,
    drops: Vec<Counter>,
    pub(super) d_ctrl: Gauge,
    /// Device memory each model takes on a GPU, as its backends report it.
    pub(super) device_bytes: Vec<Gauge>,
    pub(super) d_data: Gauge,
    pub(super) d_data_fixed: Gauge,
    /// What a batch's pull holds its GPU's puller: per task and per batch.
    pub(super) pull_hold: Gauge,
    pub(super) pull_hold_fixed: Gauge,
    /// Each model's latency scale, and its measured run time over its
    /// profile (the window's p90; 0 until measured).
    pub(super) latency_scale: Vec<Gauge>,
    pub(super) latency_ratio: Vec<Gauge>,
}

/// The label of a drop code.
pub fn drop_reason_label(c: DropReason) -> &'static str {
    match c {
        DropReason::Expired => "expired",
        DropReason::EarlyDrop => "early_drop",
        DropReason::QueueFull => "queue_full",
        DropReason::ModelRemoved => "model_removed",
        DropReason::Overloaded => "overloaded",
        DropReason::Shutdown => "shutdown",
        DropReason::TooLate => "too_late",
        DropReason::BackendLost => "backend_lost",
        DropReason::UnknownModel => "unknown_model",
        DropReason::NoGpu => "no_gpu",
    }
}

impl SchedMetrics {
    pub(super) fn new(reg: &Registry, models: &[ModelInfo]) -> SchedMetrics {
        SchedMetrics {
            tasks: per_model_counter(
                reg,
                models,
                "fermata_scheduler_tasks_total",
                "Tasks submitted to the scheduler by frontends.",
            ),
            plans: per_model_counter(
                reg,
                models,
                "fermata_scheduler_plans_total",
                "Batch plans sent to backends.",
            ),
            batch: batch_histograms(reg, models),
            drops: drop_counters(reg),
            device_bytes: device_bytes_gauges(reg, models),
            latency_scale: per_model_gauge(
                reg,
                models,
                "fermata_model_latency_scale",
                "The factor the scheduler plans a model's profile with (1: as given; its batches measured slower move it).",
                1.0,
            ),
            latency_ratio: per_model_gauge(
                reg,
                models,
                "fermata_model_latency_ratio",
                "A model's batches' run time over its profile as the scheduler measures it (p90 of the recent batches; 0 until enough).",
                0.0,
            ),
            d_ctrl: reg.gauge(
                "fermata_scheduler_d_ctrl_seconds",
                "The control-delay budget d_ctrl in use (measured, Appendix D).",
                &[],
            ),
            d_data: reg.gauge(
                "fermata_scheduler_d_data_seconds",
                "The input-transfer budget per task d_data in use.",
                &[],
            ),
            d_data_fixed: reg.gauge(
                "fermata_scheduler_d_data_fixed_seconds",
                "The part of a batch's input-transfer budget that does not grow with its size.",
                &[],
            ),
            pull_hold: reg.gauge(
                "fermata_scheduler_pull_hold_seconds",
                "What each task's pull typically holds its GPU's puller: a GPU's next batch starts no earlier than its batch's start plus the hold.",
                &[],
            ),
            pull_hold_fixed: reg.gauge(
                "fermata_scheduler_pull_hold_fixed_seconds",
                "The part of the pull hold that does not grow with a batch's size.",
                &[],
            ),
        }
    }

    pub(super) fn dropped(&self, c: DropReason, n: u64) {
        self.drops[c.index()].inc_by(n);
    }
}

/// One counter per model (label `model`).
fn per_model_counter(reg: &Registry, models: &[ModelInfo], name: &str, help: &str) -> Vec<Counter> {
    models
        .iter()
        .map(|m| reg.counter(name, help, &[("model", &m.name)]))
        .collect()
}

/// One gauge per model (label `model`), set to `init`.
fn per_model_gauge(
    reg: &Registry,
    models: &[ModelInfo],
    name: &str,
    help: &str,
    init: f64,
) -> Vec<Gauge> {
    models
        .iter()
        .map(|m| {
            let g = reg.gauge(name, help, &[("model", &m.name)]);
            g.set(init);
            g
        })
        .collect()
}

/// Tasks per batch plan sent, per model.
fn batch_histograms(reg: &Registry, models: &[ModelInfo]) -> Vec<Arc<Histogram>> {
    models
        .iter()
        .map(|m| {
            reg.histogram(
                "fermata_scheduler_batch_size",
                "Tasks per batch plan sent (frontends gone are left out).",
                &[("model", &m.name)],
                Histogram::new(BATCH_BUCKETS, 1.0),
            )
        })
        .collect()
}

/// Drops per reason, indexed by [`DropReason::index`].
fn drop_counters(reg: &Registry) -> Vec<Counter> {
    DropReason::ALL
        .iter()
        .map(|&c| {
            reg.counter(
                "fermata_scheduler_dropped_total",
                "Tasks the scheduler dropped or failed, by reason.",
                &[("reason", drop_reason_label(c))],
            )
        })
        .collect()
}

/// Each model's device memory on one GPU.
fn device_bytes_gauges(reg: &Registry, models: &[ModelInfo]) -> Vec<Gauge> {
    models
        .iter()
        .map(|m| {
            reg.gauge(
                "fermata_model_device_bytes",
                "Device memory a model takes on one GPU (all its bucket sessions), as the last backend to load it measured; 0 when not measured.",
                &[("model", &m.name)],
            )
        })
        .collect()
}

/// A GPU's busy time as backends report it.
#[derive(Default)]
pub(super) struct GpuBusy {
    /// Owned by a backend (in service or draining): its series are shown.
    present: bool,
    in_service: bool,
    /// Its sub-cluster.
    sub: u32,
    /// Sum of (finish - start) of its batches, ns.
    total_ns: i64,
    /// total_ns over the last BUSY_WINDOW.
    window: Window<i64>,
}

impl GpuBusy {
    /// The GPU ran a batch for `busy`.
    pub(super) fn add(&mut self, busy: Dur) {
        self.total_ns = self.total_ns.saturating_add(busy.0);
    }

    /// The GPU enters service in sub-cluster `sub` at `now`: its busy
    /// fraction starts over.
    pub(super) fn enter_service(&mut self, now: Instant, sub: u32) {
        self.present = true;
        self.in_service = true;
        self.sub = sub;
        self.window.clear();
        self.window.push(now, self.total_ns, BUSY_WINDOW);
    }

    pub(super) fn leave_service(&mut self) {
        self.in_service = false;
    }

    /// Its backend is gone: its series go (the id may be given again, to a
    /// GPU that starts from nothing).
    pub(super) fn depart(&mut self) {
        self.present = false;
        self.in_service = false;
        self.total_ns = 0;
        self.window.clear();
    }

    /// What the metrics show of GPU `gpu` at `now`.
    fn snap(&mut self, gpu: u32, now: Instant) -> GpuSnap {
        let (t0, n0) = self.window.push(now, self.total_ns, BUSY_WINDOW);
        let span = now.duration_since(t0).as_nanos() as f64;
        let ratio = if span > 0.0 {
            ((self.total_ns - n0) as f64 / span).clamp(0.0, 1.0)
        } else {
            0.0
        };
        GpuSnap {
            gpu,
            sub: self.sub,
            present: self.present,
            in_service: self.in_service,
            busy_s: self.total_ns as f64 / 1e9,
            ratio,
        }
    }
}

/// What the metrics show of a GPU (refreshed every second).
#[derive(Clone, Copy)]
pub struct GpuSnap {
    gpu: u32,
    sub: u32,
    /// Owned by a backend (in service or draining).
    present: bool,
    in_service: bool,
    busy_s: f64,
    /// Busy fraction over the last BUSY_WINDOW (or since it entered service).
    ratio: f64,
}

impl GpuSnap {
    /// Busy fraction over the last window.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }
}

/// The GPUs' busy fractions at `now`, by global GPU id.
pub(super) fn busy_snapshot(busy: &mut [GpuBusy], now: Instant) -> Vec<GpuSnap> {
    busy.iter_mut()
        .enumerate()
        .map(|(i, b)| b.snap(i as u32, now))
        .collect()
}

/// The mean busy fraction of the GPUs in service (None when there is none).
fn mean_busy<'a>(v: impl Iterator<Item = &'a GpuSnap>) -> Option<f64> {
    let (n, sum) = v
        .filter(|g| g.in_service)
        .fold((0usize, 0.0), |(n, s), g| (n + 1, s + g.ratio));
    (n > 0).then(|| sum / n as f64)
}

/// The GPUs' snapshots, shared by the event loop (which refreshes them) and the
/// collectors (which read them at scrape time).
pub(super) type BusySnaps = Arc<Mutex<Vec<GpuSnap>>>;

/// The per-GPU and sub-cluster busy series, read from `snap` at scrape time.
pub(super) fn register_gpu_metrics(reg: &Registry, snap: BusySnaps) {
    per_gpu(
        reg,
        &snap,
        "fermata_gpu_busy_seconds_total",
        "Seconds a GPU ran batches (start to finish as its backend reports them).",
        Kind::Counter,
        |g| g.present,
        |g| g.busy_s,
    );
    per_gpu(
        reg,
        &snap,
        "fermata_gpu_busy_ratio",
        "Busy fraction of each GPU in service over the last 10 s (idle = 1 - busy).",
        Kind::Gauge,
        |g| g.in_service,
        |g| g.ratio,
    );
    subcluster(
        reg,
        &snap,
        "fermata_subcluster_busy_ratio",
        "Mean busy fraction of the sub-cluster's GPUs in service over the last 10 s.",
        |v| mean_busy(v).unwrap_or(0.0),
    );
    subcluster(
        reg,
        &snap,
        "fermata_subcluster_idle_ratio",
        "Mean idle fraction of the sub-cluster's GPUs in service over the last 10 s.",
        |v| mean_busy(v).map_or(0.0, |m| 1.0 - m),
    );
    subcluster(
        reg,
        &snap,
        "fermata_subcluster_gpus_in_service",
        "GPUs in service in the sub-cluster.",
        |v| v.filter(|g| g.in_service).count() as f64,
    );
}

/// The `subcluster` label.
fn sub(id: u32) -> (String, String) {
    ("subcluster".to_string(), id.to_string())
}

/// A series per GPU that `keep` keeps (labels `gpu`, `subcluster`).
fn per_gpu(
    reg: &Registry,
    snap: &BusySnaps,
    name: &str,
    help: &str,
    kind: Kind,
    keep: fn(&GpuSnap) -> bool,
    value: fn(&GpuSnap) -> f64,
) {
    let s = snap.clone();
    reg.collector(name, help, kind, move || {
        let v = s.lock().expect("busy lock");
        v.iter()
            .filter(|g| keep(g))
            .map(|g| {
                (
                    vec![("gpu".into(), g.gpu.to_string()), sub(g.sub)],
                    value(g),
                )
            })
            .collect()
    });
}

/// A gauge per sub-cluster (of those with a GPU; sub-cluster 0 always).
fn subcluster(
    reg: &Registry,
    snap: &BusySnaps,
    name: &str,
    help: &str,
    value: fn(&mut dyn Iterator<Item = &GpuSnap>) -> f64,
) {
    let s = snap.clone();
    reg.collector(name, help, Kind::Gauge, move || {
        let v = s.lock().expect("busy lock");
        let mut subs: Vec<u32> = v.iter().map(|g| g.sub).chain([0]).collect();
        subs.sort_unstable();
        subs.dedup();
        subs.into_iter()
            .map(|id| {
                let mut of = v.iter().filter(|g| g.sub == id);
                (vec![sub(id)], value(&mut of))
            })
            .collect()
    });
}

/// The autoscaling signals and advice the event loop computes every second
/// (what `GET /v1/autoscale` shows and the gauges read).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct AutoscaleView {
    /// The signal window (s).
    pub window_s: f64,
    /// The whole cluster.
    pub cluster: Option<ScopeView>,
    /// Each sub-cluster.
    pub subclusters: Vec<ScopeView>,
    /// The backends in service.
    pub backends: Vec<crate::node::proto::sched::BackendView>,
    pub thresholds: Option<crate::plan::autoscale::AdviceConfig>,
    /// Each model's sub-cluster, and where it is moving.
    pub models: Vec<ModelHome>,
    /// The models' moves between sub-clusters so far.
    pub moves: crate::node::proto::subclusters::MoveStats,
    /// With typed sub-clusters: the advice summed per GPU type (empty
    /// untyped), so that the GPUs to add or release are named by type.
    pub types: Vec<TypeAdvice>,
}

/// The advice of a GPU type's sub-clusters together.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TypeAdvice {
    pub gpu_type: String,
    pub subclusters: Vec<u32>,
    pub gpus_in_service: u32,
    /// GPUs of this type to add, and to release, summed over its sub-clusters.
    pub add_gpus: u32,
    pub release_gpus: u32,
}

/// Sums each type's sub-cluster advice (`types[s]`: sub-cluster s's type;
/// empty: untyped, no summary).
pub fn advice_by_type(types: &[String], scopes: &[ScopeView]) -> Vec<TypeAdvice> {
    use crate::node::proto::subclusters::same_gpu_type;
    let mut out: Vec<TypeAdvice> = Vec::new();
    for (s, t) in types.iter().enumerate() {
        let i = match out.iter().position(|a| same_gpu_type(&a.gpu_type, t)) {
            Some(i) => i,
            None => {
                out.push(TypeAdvice {
                    gpu_type: t.clone(),
                    subclusters: Vec::new(),
                    gpus_in_service: 0,
                    add_gpus: 0,
                    release_gpus: 0,
                });
                out.len() - 1
            }
        };
        out[i].subclusters.push(s as u32);
        if let Some(v) = scopes.iter().find(|v| v.subcluster == Some(s as u32)) {
            out[i].gpus_in_service += v.advice.gpus_in_service;
            out[i].add_gpus += v.advice.add_gpus;
            out[i].release_gpus += v.advice.release_count;
        }
    }
    out
}

/// A model's sub-cluster (where its new tasks go) and its move, if one is
/// under way: the target loading it (before the switch), or the source still
/// serving what it had queued (after).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelHome {
    pub model: String,
    pub subcluster: u32,
    pub loading_at: Option<u32>,
    pub draining_from: Option<u32>,
}

/// The signals and advice of the cluster or one sub-cluster.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScopeView {
    /// The sub-cluster's id (None: the whole cluster).
    pub subcluster: Option<u32>,
    /// Its GPU type (None: untyped, or the whole cluster).
    pub gpu_type: Option<String>,
    pub signals: crate::plan::autoscale::Signals,
    pub advice: crate::plan::autoscale::Advice,
}

/// Gauges of the autoscaling signals and advice, per sub-cluster and for the
/// cluster, read from `view` at scrape time.
pub(super) fn register_autoscale_metrics(reg: &Registry, view: Arc<Mutex<AutoscaleView>>) {
    let v = view.clone();
    reg.collector(
        "fermata_model_subcluster",
        "The sub-cluster whose GPUs serve each model's new tasks.",
        Kind::Gauge,
        move || {
            let v = v.lock().expect("autoscale lock");
            v.models
                .iter()
                .map(|m| (vec![("model".into(), m.model.clone())], m.subcluster as f64))
                .collect()
        },
    );
    let v = view.clone();
    reg.collector(
        "fermata_scheduler_model_moves_total",
        "Models moved between sub-clusters: moves started, switched (new tasks go to the target), done (unloaded from the source), aborted (the target could not load it).",
        Kind::Counter,
        move || {
            let m = v.lock().expect("autoscale lock").moves;
            [
                ("started", m.started),
                ("switched", m.switched),
                ("done", m.done),
                ("aborted", m.aborted),
            ]
            .into_iter()
            .map(|(o, n)| (vec![("outcome".into(), o.to_string())], n as f64))
            .collect()
        },
    );
    let v = view.clone();
    reg.collector(
        "fermata_gpu_type_advice_gpus",
        "With typed sub-clusters (--subcluster-types): per GPU type, the GPUs in service and the GPUs its sub-clusters' advice adds and releases.",
        Kind::Gauge,
        move || {
            let v = v.lock().expect("autoscale lock");
            v.types
                .iter()
                .flat_map(|t| {
                    [
                        ("in_service", t.gpus_in_service),
                        ("add", t.add_gpus),
                        ("release", t.release_gpus),
                    ]
                    .into_iter()
                    .map(|(what, n)| {
                        (
                            vec![
                                ("gpu_type".into(), t.gpu_type.clone()),
                                ("what".into(), what.to_string()),
                            ],
                            f64::from(n),
                        )
                    })
                })
                .collect()
        },
    );
    type Pick = fn(&ScopeView) -> f64;
    // (name, help, pick, also per sub-cluster: the idle fraction and GPU count
    // per sub-cluster are fermata_subcluster_idle_ratio and _gpus_in_service).
    let series: [(&str, &str, Pick, bool); 7] = [
        (
            "demand_gpus",
            "GPUs' worth of work the load brings over the last 10 s: the sum over models of rate · l(b)/b, b the largest batch the model's rate fills within its SLO.",
            |v| v.signals.demand_gpus.unwrap_or(0.0),
            true,
        ),
        (
            "advice_target_gpus",
            "GPUs the advice says the load needs: in service + to add - to release, in whole GPUs (lanes counted as their GPU; divide by GPUs per backend for a replica count, e.g. in a KEDA ScaledObject).",
            |v| {
                v.advice.gpus_in_service as f64 + v.advice.add_gpus as f64
                    - v.advice.release_count as f64
            },
            true,
        ),
        (
            "bad_ratio",
            "Share of tasks over the last 10 s that were dropped, failed or finished past their deadline (the autoscaling signal r).",
            |v| v.signals.bad_rate,
            true,
        ),
        (
            "advice_add_gpus",
            "GPUs the autoscaling advice says to add (N·r/(1−r) when the bad rate is above its threshold; whole GPUs when they have lanes).",
            |v| v.advice.add_gpus as f64,
            true,
        ),
        (
            "advice_release_gpus",
            "GPUs the autoscaling advice says to release (N·f, the highest ids, when the idle fraction is above its threshold; whole GPUs when they have lanes).",
            |v| v.advice.release_count as f64,
            true,
        ),
        (
            "idle_ratio",
            "Mean idle fraction of the GPUs in service over the last 10 s (the autoscaling signal f).",
            |v| v.signals.idle_fraction,
            false,
        ),
        (
            "gpus_in_service",
            "GPU slots in service (draining ones left out): GPUs, or their lanes for backends with --lanes.",
            |v| v.signals.gpus as f64,
            false,
        ),
    ];
    for (name, help, pick, per_sub) in series {
        for sub in [true, false] {
            if sub && !per_sub {
                continue;
            }
            let v = view.clone();
            let scope = if sub { "subcluster" } else { "cluster" };
            reg.collector(
                &format!("fermata_{scope}_{name}"),
                help,
                Kind::Gauge,
                move || {
                    let v = v.lock().expect("autoscale lock");
                    // Per sub-cluster (label `subcluster`), or the cluster's one series.
                    let scopes: Vec<&ScopeView> = if sub {
                        v.subclusters.iter().collect()
                    } else {
                        v.cluster.iter().collect()
                    };
                    scopes
                        .into_iter()
                        .map(|s| {
                            let labels = match s.subcluster {
                                Some(id) if sub => vec![("subcluster".to_string(), id.to_string())],
                                _ => Vec::new(),
                            };
                            (labels, pick(s))
                        })
                        .collect()
                },
            );
        }
    }
}
