//! The frontend's Prometheus series: per model the requests by outcome, their
//! latency and queuing delay and the bad rate over [`BAD_RATE_WINDOW`]; for the
//! frontend, requests refused before admission, requests pending, in-process
//! requests refused on a full queue, the GPUs in service, whether it has its
//! scheduler, and each application's measured fan-out per edge.

use super::handle::FrontendState;
use crate::core::{DropReason, Outcome};
use crate::metrics::{Counter, Gauge, Histogram, Kind, Registry, Window, LATENCY_BUCKETS};
use crate::node::proto::ledger::Ended;
use crate::node::scheduler::drop_reason_label;
use crate::wire::ModelInfo;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The window of the `fermata_bad_ratio` gauge.
pub const BAD_RATE_WINDOW: Duration = Duration::from_secs(10);

/// Per-model series of the frontend.
pub(super) struct ModelStats {
    pub(super) good: Counter,
    pub(super) late: Counter,
    pub(super) dropped: Counter,
    pub(super) failed: Counter,
    /// The dropped ones by reason, indexed by [`DropReason::index`].
    drops: Vec<Counter>,
    pub(super) latency: Arc<Histogram>,
    pub(super) queue: Arc<Histogram>,
    bad_ratio: Gauge,
    /// (ended, bad) over the last BAD_RATE_WINDOW.
    window: Window<(u64, u64)>,
}

impl ModelStats {
    fn new(reg: &Registry, model: &str) -> ModelStats {
        let outcome = |o: &str| {
            reg.counter(
                "fermata_requests_total",
                "Requests ended at the frontend, by outcome (good, late, dropped, failed).",
                &[("model", model), ("outcome", o)],
            )
        };
        let drops = DropReason::ALL
            .iter()
            .map(|&r| {
                reg.counter(
                    "fermata_requests_dropped_total",
                    "Requests dropped (not run: a scheduling outcome), by reason.",
                    &[("model", model), ("reason", drop_reason_label(r))],
                )
            })
            .collect();
        ModelStats {
            drops,
            good: outcome("good"),
            late: outcome("late"),
            dropped: outcome("dropped"),
            failed: outcome("failed"),
            latency: reg.histogram(
                "fermata_request_latency_seconds",
                "From the frontend's receipt of a request to its answer, every outcome.",
                &[("model", model)],
                Histogram::seconds(LATENCY_BUCKETS),
            ),
            queue: reg.histogram(
                "fermata_queuing_delay_seconds",
                "From a request's arrival to the start of its batch (requests that ran).",
                &[("model", model)],
                Histogram::seconds(LATENCY_BUCKETS),
            ),
            bad_ratio: reg.gauge(
                "fermata_bad_ratio",
                "Fraction of requests ended over the last 10 s that were not good (late, dropped or failed).",
                &[("model", model)],
            ),
            window: Default::default(),
        }
    }
    /// Counts a request that ended as `e`.
    pub(super) fn count_end(&self, e: Ended) {
        match e.outcome() {
            Outcome::Good => self.good.inc(),
            Outcome::Late => self.late.inc(),
            Outcome::Dropped => self.dropped.inc(),
            Outcome::Failed => self.failed.inc(),
        };
        if let Ended::Dropped(r) = e {
            self.drops[r.index()].inc();
        }
    }
    fn ended(&self) -> u64 {
        self.good.get() + self.late.get() + self.dropped.get() + self.failed.get()
    }
    pub(super) fn update_bad_ratio(&mut self, now: Instant) {
        let ended = self.ended();
        let bad = ended - self.good.get();
        let (_, (e0, b0)) = self.window.push(now, (ended, bad), BAD_RATE_WINDOW);
        let n = ended - e0;
        self.bad_ratio.set(if n == 0 {
            0.0
        } else {
            (bad - b0) as f64 / n as f64
        });
    }
}

/// In-process requests refused because the loop's queue was full.
pub(super) fn queue_full_counter(reg: &Registry) -> Counter {
    reg.counter(
        "fermata_frontend_queue_full_total",
        "Requests refused (dropped, overloaded) because LOCAL_MAX requests were already waiting for the frontend's loop.",
        &[],
    )
}

/// The series the frontend's loop updates.
pub(super) struct LoopMetrics {
    pub(super) stats: Vec<ModelStats>,
    pub(super) bad_requests: Counter,
    pub(super) pending: Gauge,
    pub(super) held: Gauge,
    pub(super) loop_wait: Arc<Histogram>,
}

impl LoopMetrics {
    /// The loop's series, and the gauges read from `state` at scrape time.
    pub(super) fn new(reg: &Registry, models: &[ModelInfo], state: &Arc<FrontendState>) -> Self {
        let stats = models
            .iter()
            .map(|m| ModelStats::new(reg, &m.name))
            .collect();
        let bad_requests = reg.counter(
            "fermata_frontend_bad_requests_total",
            "Requests the frontend refused before admission (unknown model, bad SLO).",
            &[],
        );
        let pending = reg.gauge(
            "fermata_frontend_pending_requests",
            "Requests admitted and not yet answered.",
            &[],
        );
        let held = reg.gauge(
            "fermata_frontend_held_requests",
            "Of the pending requests, those held for the next scheduler: pending when the scheduler was lost, or taken while no scheduler had GPUs in service for this frontend.",
            &[],
        );
        let loop_wait = reg.histogram(
            "fermata_frontend_loop_wait_seconds",
            "How long a request waited for the frontend's loop before its admission or refusal: from its hand-over (HTTP, gRPC, applications) or from when the loop read it off its event channel (wire clients).",
            &[],
            Histogram::seconds(LATENCY_BUCKETS),
        );
        register_state_gauges(reg, state);
        LoopMetrics {
            stats,
            bad_requests,
            pending,
            held,
            loop_wait,
        }
    }
}

/// The GPUs in service and the scheduler's connection, as `state` has them.
/// The collectors hold the state weakly: the state holds the registry, and a
/// strong reference back kept both (and the region the registry's collectors
/// read) alive after the frontend stopped.
fn register_state_gauges(reg: &Registry, state: &Arc<FrontendState>) {
    let st = Arc::downgrade(state);
    reg.collector(
        "fermata_frontend_gpus_in_service",
        "GPUs in service as the scheduler last told this frontend.",
        Kind::Gauge,
        move || {
            st.upgrade().map_or_else(Vec::new, |st| {
                vec![(vec![], st.gpus.load(Ordering::Relaxed) as f64)]
            })
        },
    );
    let st = Arc::downgrade(state);
    reg.collector(
        "fermata_frontend_scheduler_connected",
        "1 while the frontend has its scheduler.",
        Kind::Gauge,
        move || {
            st.upgrade().map_or_else(Vec::new, |st| {
                vec![(vec![], if st.scheduler_connected() { 1.0 } else { 0.0 })]
            })
        },
    );
    // Each application's fan-out edges as the frontend measured them
    // (`ServedApp::fanout_seen`); items / outputs is the mean fan-out.
    for (name, help, items) in [
        (
            "fermata_app_fanout_outputs_total",
            "Parent outputs whose item count the frontend read, per application and fan-out edge (from, to steps).",
            false,
        ),
        (
            "fermata_app_fanout_items_total",
            "Items those parent outputs carried (each one request to the child step), per application and fan-out edge.",
            true,
        ),
    ] {
        let st = Arc::downgrade(state);
        reg.collector(name, help, Kind::Counter, move || {
            let Some(st) = st.upgrade() else {
                return Vec::new();
            };
            st.apps
                .iter()
                .flat_map(|a| {
                    let app = a.meta.name.clone();
                    a.fanout_seen().into_iter().map(move |f| {
                        let labels = vec![
                            ("app".to_string(), app.clone()),
                            ("from".to_string(), f.from),
                            ("to".to_string(), f.to),
                        ];
                        (labels, if items { f.items } else { f.outputs } as f64)
                    })
                })
                .collect()
        });
    }
    // The plan in force of each application (re-planned on the measured
    // fan-outs and latency ratios with `FrontendOpts::replan`).
    app_gauge(
        reg,
        state,
        "fermata_app_replans_total",
        "Re-plans installed per application: a drift of a fan-out edge's measured mean or a step's measured latency ratio past the threshold, planned again by fermata at the measured values.",
        Kind::Counter,
        |a| vec![(vec![], a.replans() as f64)],
    );
    app_gauge(
        reg,
        state,
        "fermata_app_module_resends_total",
        "Module requests sent again with their step's last deadline after their first passed, per application (deadline rule latest-useful).",
        Kind::Counter,
        |a| vec![(vec![], a.resends() as f64)],
    );
    app_gauge(
        reg,
        state,
        "fermata_app_planned_fanout",
        "The mean fan-out the plan in force assumes, per application and fan-out edge (from, to steps).",
        Kind::Gauge,
        |a| {
            a.planned_fanout()
                .into_iter()
                .map(|(from, to, f)| (vec![("from".to_string(), from), ("to".to_string(), to)], f))
                .collect()
        },
    );
    app_gauge(
        reg,
        state,
        "fermata_app_latency_ratio",
        "Each step's batches' run time on the GPU over the latency its model's profile gives for them, as the frontend measured it from its answers since it started, per application and step.",
        Kind::Gauge,
        |a| {
            a.latency_measured()
                .into_iter()
                .filter_map(|(step, r)| r.map(|r| (vec![("step".to_string(), step)], r)))
                .collect()
        },
    );
    app_gauge(
        reg,
        state,
        "fermata_app_planned_latency_ratio",
        "The observed/profiled latency ratio the plan in force scales each step's profile by, per application and step (1: the profile as it is).",
        Kind::Gauge,
        |a| {
            a.planned_latency_ratio()
                .into_iter()
                .map(|(step, k)| (vec![("step".to_string(), step)], k))
                .collect()
        },
    );
    app_gauge(
        reg,
        state,
        "fermata_app_frontends_summed",
        "The frontends whose counters of the application the scheduler last summed for this frontend's re-planner (0: no sums yet), per application.",
        Kind::Gauge,
        |a| vec![(vec![], a.totals().map_or(0.0, |t| f64::from(t.frontends)))],
    );
    app_gauge(
        reg,
        state,
        "fermata_app_requests_summed_total",
        "The application requests received over every frontend that serves it, as the scheduler last summed them for this frontend's re-planner, per application.",
        Kind::Counter,
        |a| vec![(vec![], a.totals().map_or(0.0, |t| t.counters.requests as f64))],
    );
    app_gauge(
        reg,
        state,
        "fermata_app_budget_ms",
        "The latency budget of each step in the plan in force (ms), per application and step: new application requests get their deadlines from these.",
        Kind::Gauge,
        |a| {
            a.budgets_in_force()
                .into_iter()
                .map(|(step, d)| (vec![("step".to_string(), step)], d.as_secs_f64() * 1e3))
                .collect()
        },
    );
}

/// A collector of one series per application and `series` of it (labels after
/// `app`), holding the state weakly as the others do.
fn app_gauge(
    reg: &Registry,
    state: &Arc<FrontendState>,
    name: &str,
    help: &str,
    kind: Kind,
    series: fn(&crate::node::apps::ServedApp) -> crate::metrics::Collected,
) {
    let st = Arc::downgrade(state);
    reg.collector(name, help, kind, move || {
        let Some(st) = st.upgrade() else {
            return Vec::new();
        };
        st.apps
            .iter()
            .flat_map(|a| {
                series(a).into_iter().map(|(rest, v)| {
                    let mut labels = vec![("app".to_string(), a.meta.name.clone())];
                    labels.extend(rest);
                    (labels, v)
                })
            })
            .collect()
    });
}
