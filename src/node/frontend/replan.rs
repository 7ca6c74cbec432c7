//! The thin thread that re-plans a frontend's applications on what their
//! inputs and GPUs do: every epoch it reads each application's counters (the
//! items counted on its fan-out edges, each step's batch run times against
//! its model's profile, the requests received) summed over every frontend
//! that serves the application (the frontend's loop sends its own to the
//! scheduler, which answers with the sums: [`ServedApp::totals`]), hands
//! them to the application's [`Replanner`] (the pure state machine that
//! decides and plans) and installs the plan it answers
//! ([`ServedApp::install`]) for the requests that start from then on. Every
//! frontend thus plans at the application's whole rate and measured values.
//! The scheduler sees the new per-module rates as the tasks' rates and its
//! epoch loop re-partitions on them.

use crate::app::{DriftConfig, Replanner};
use crate::node::apps::ServedApp;
use anyhow::{bail, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a frontend re-plans its applications.
#[derive(Debug, Clone)]
pub struct ReplanOpts {
    /// The epoch: how often the counters are read and a drift decided.
    pub every: Duration,
    /// When a drift counts (threshold, window, samples, confirmation,
    /// cool-down; see [`DriftConfig`]).
    pub drift: DriftConfig,
}

impl ReplanOpts {
    pub fn check(&self) -> Result<()> {
        if self.every < Duration::from_millis(100) || self.every > Duration::from_secs(3600) {
            bail!(
                "the re-planning epoch {:?} must be 0.1 s to 1 h",
                self.every
            );
        }
        self.drift.check().map_err(anyhow::Error::msg)
    }
}

/// Starts the thread for `apps` (None when there is no application); it ends
/// when `stop` is set.
pub(super) fn spawn(
    apps: &[Arc<ServedApp>],
    opts: &ReplanOpts,
    stop: Arc<AtomicBool>,
) -> Result<Option<JoinHandle<()>>> {
    opts.check()?;
    let mut planned: Vec<(Arc<ServedApp>, Replanner)> = Vec::new();
    for a in apps {
        match a.replanner(opts.drift.clone()) {
            Ok(r) => planned.push((a.clone(), r)),
            Err(e) => tracing::warn!(
                app = %a.meta.name,
                error = %e,
                "frontend: the application cannot be re-planned (its budgets stay)"
            ),
        }
    }
    if planned.is_empty() {
        return Ok(None);
    }
    let every = opts.every;
    let h = std::thread::Builder::new()
        .name("app-replan".into())
        .spawn(move || run(planned, every, &stop))?;
    Ok(Some(h))
}

/// The totals an application's re-planner last took: their number and when
/// they came; and the epochs since new ones came.
#[derive(Default)]
struct Fed {
    last: Option<(u64, Instant)>,
    waited: u32,
}

/// Epochs without new sums from the scheduler after which the frontend
/// warns (once until they come again).
const WAIT_WARN_EPOCHS: u32 = 5;

fn run(mut apps: Vec<(Arc<ServedApp>, Replanner)>, every: Duration, stop: &AtomicBool) {
    let mut fed: Vec<Fed> = apps.iter().map(|_| Fed::default()).collect();
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let due = last + every;
        let now = Instant::now();
        if now < due {
            std::thread::sleep((due - now).min(Duration::from_millis(50)));
            continue;
        }
        last = now;
        for ((app, r), f) in apps.iter_mut().zip(&mut fed) {
            epoch(app, r, f);
        }
    }
}

/// One epoch of one application: the sums over every frontend that serves
/// it (the scheduler's answer to this frontend's counters) decide, and a
/// new plan is installed. The first sums are where the counting starts;
/// an epoch with no new sums decides nothing (the next one measures over
/// both).
fn epoch(app: &ServedApp, r: &mut Replanner, f: &mut Fed) {
    let name = &app.meta.name;
    let t = app.totals();
    let fresh = t
        .as_ref()
        .filter(|t| f.last.is_none_or(|(seq, _)| t.seq != seq));
    let Some(t) = fresh else {
        f.waited = f.waited.saturating_add(1);
        if f.waited == WAIT_WARN_EPOCHS {
            tracing::warn!(
                app = %name,
                epochs = f.waited,
                "frontend: no sums of the application's counters from the scheduler; it is not re-planned meanwhile"
            );
        }
        return;
    };
    f.waited = 0;
    let Some((_, at)) = f.last.replace((t.seq, t.at)) else {
        if let Err(e) = r.rebase(&t.counters.fanout, &t.counters.latency, t.counters.requests) {
            tracing::warn!(app = %name, error = %e, "frontend: the application's sums refused");
        }
        return;
    };
    let secs = t.at.duration_since(at).as_secs_f64();
    let c = &t.counters;
    match r.epoch(&c.fanout, &c.latency, c.requests, secs) {
        Ok(None) => {}
        Ok(Some(p)) => match app.install(&p) {
            Ok(()) => {
                tracing::info!(
                    app = %name,
                    frontends = t.frontends,
                    fanout = ?app.planned_fanout(),
                    latency_ratio = ?app.planned_latency_ratio(),
                    drifted_edges = ?p.drifted_edges,
                    drifted_steps = ?p.drifted_steps,
                    budgets = ?app.budgets_in_force(),
                    rate_rps = p.ingress_rps,
                    module_rates = ?p.module_rates,
                    "frontend: re-planned the application on its measured fan-out and latencies"
                );
            }
            Err(e) => tracing::warn!(app = %name, error = %e, "frontend: the new plan was refused"),
        },
        Err(e) => tracing::warn!(
            app = %name,
            error = %e,
            "frontend: cannot re-plan at the measured values; the budgets in force stay"
        ),
    }
}
