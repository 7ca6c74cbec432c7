//! Applications' counters summed over the frontends that serve them (pure).
//!
//! Every frontend counts what its own requests of an application do (the
//! items on each fan-out edge, each step's batch run times against its
//! model's profile, the requests received) and sends the cumulative counters
//! to the scheduler ([`Msg::AppCounts`](crate::wire::Msg::AppCounts)). The
//! scheduler keeps each frontend's latest report per application and answers
//! with the sums over all of them ([`Msg::AppTotals`](crate::wire::Msg::AppTotals)):
//! each frontend's re-planner then measures the application's whole rate,
//! fan-outs and latencies, not its own share, and all of them plan on the
//! same numbers. A frontend that leaves keeps its last report in the sums,
//! so they never go back while this scheduler serves (a scheduler that takes
//! over starts from the frontends that report to it; the re-planners take a
//! drop in the sums as a new starting point).
//!
//! Frontends are not trusted: an application's first report fixes its shape
//! (edges and steps), a report of another shape is refused, and what is kept
//! is bounded: at most [`MAX_APPS`] applications of at most [`MAX_PARTS`]
//! edges and steps each, and [`MAX_REPORTS`] reports kept at once (each
//! frontend's latest per application; about 40 MiB at most).

use crate::wire::{AppCounters, NodeId, StepLatency};
use std::collections::BTreeMap;

/// Applications the scheduler sums at most (a report naming one more is
/// refused).
pub const MAX_APPS: usize = 1024;

/// Edges, and steps, of one application at most (an ensemble of more is not
/// one a frontend serves).
pub const MAX_PARTS: usize = 256;

/// Reports kept at once at most, over every application and frontend (one
/// that would be one more is refused; a frontend's later report of an
/// application it reported replaces its earlier one).
pub const MAX_REPORTS: usize = 4096;

/// One application's reports.
#[derive(Debug, Clone)]
struct App {
    /// Each reporting frontend's latest counters.
    live: BTreeMap<NodeId, AppCounters>,
    /// The sums of the frontends gone, at their last reports; its shape
    /// (graph edges and steps) is the application's.
    gone: AppCounters,
    /// Frontends that ever reported it.
    frontends: u32,
}

/// The applications' reports (see the module's text).
#[derive(Debug, Clone, Default)]
pub struct AppTotals {
    apps: BTreeMap<String, App>,
    /// Reports kept (the `live` entries of every application).
    reports: usize,
}

impl AppTotals {
    pub fn new() -> AppTotals {
        AppTotals::default()
    }

    /// Frontend `node`'s counters `c`: the application's sums over every
    /// frontend that reported it, and how many did; an error (nothing kept)
    /// for an empty name, more than [`MAX_PARTS`] edges or steps, a shape
    /// unlike the application's first report, one application more than
    /// [`MAX_APPS`] or one report more than [`MAX_REPORTS`].
    pub fn report(&mut self, node: NodeId, c: AppCounters) -> Result<(AppCounters, u32), String> {
        if c.app.is_empty() {
            return Err("counters of an application with no name".into());
        }
        if c.fanout.len() > MAX_PARTS || c.latency.len() > MAX_PARTS {
            return Err(format!(
                "counters of application {:?} for {} edges and {} steps: at most {MAX_PARTS} each",
                c.app,
                c.fanout.len(),
                c.latency.len()
            ));
        }
        let new_report = self
            .apps
            .get(&c.app)
            .is_none_or(|a| !a.live.contains_key(&node));
        if new_report && self.reports >= MAX_REPORTS {
            return Err(format!(
                "counters of application {:?}: {MAX_REPORTS} reports are kept already",
                c.app
            ));
        }
        let full = self.apps.len() >= MAX_APPS;
        let a = match self.apps.get_mut(&c.app) {
            Some(a) => a,
            None if full => {
                return Err(format!(
                    "counters of application {:?}: {MAX_APPS} applications are summed already",
                    c.app
                ))
            }
            None => self.apps.entry(c.app.clone()).or_insert_with(|| App {
                live: BTreeMap::new(),
                gone: AppCounters {
                    app: c.app.clone(),
                    fanout: vec![(0, 0); c.fanout.len()],
                    latency: vec![StepLatency::default(); c.latency.len()],
                    requests: 0,
                },
                frontends: 0,
            }),
        };
        let (edges, steps) = (a.gone.fanout.len(), a.gone.latency.len());
        if (c.fanout.len(), c.latency.len()) != (edges, steps) {
            return Err(format!(
                "counters of application {:?} for {} edges and {} steps; other frontends serve it with {edges} and {steps}",
                c.app,
                c.fanout.len(),
                c.latency.len()
            ));
        }
        if a.live.insert(node, c).is_none() {
            a.frontends = a.frontends.saturating_add(1);
            self.reports += 1;
        }
        Ok((sum(a), a.frontends))
    }

    /// Frontend `node` is gone: its last reports stay in the sums.
    pub fn frontend_gone(&mut self, node: NodeId) {
        for a in self.apps.values_mut() {
            if let Some(c) = a.live.remove(&node) {
                add(&mut a.gone, &c);
                self.reports -= 1;
            }
        }
    }

    /// Applications summed.
    pub fn len(&self) -> usize {
        self.apps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.apps.is_empty()
    }
}

/// `into += c` (same shape; saturating).
fn add(into: &mut AppCounters, c: &AppCounters) {
    for (s, &(o, i)) in into.fanout.iter_mut().zip(&c.fanout) {
        s.0 = s.0.saturating_add(o);
        s.1 = s.1.saturating_add(i);
    }
    for (s, l) in into.latency.iter_mut().zip(&c.latency) {
        s.observed_ns = s.observed_ns.saturating_add(l.observed_ns);
        s.profiled_ns = s.profiled_ns.saturating_add(l.profiled_ns);
        s.samples = s.samples.saturating_add(l.samples);
    }
    into.requests = into.requests.saturating_add(c.requests);
}

fn sum(a: &App) -> AppCounters {
    let mut s = a.gone.clone();
    for c in a.live.values() {
        add(&mut s, c);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(app: &str, outputs: u64, items: u64, observed: u64, requests: u64) -> AppCounters {
        AppCounters {
            app: app.into(),
            fanout: vec![(outputs, items)],
            latency: vec![
                StepLatency {
                    observed_ns: observed,
                    profiled_ns: 1_000,
                    samples: 1,
                },
                StepLatency::default(),
            ],
            requests,
        }
    }

    #[test]
    fn two_frontends_are_summed_and_a_gone_one_stays_in_the_sums() {
        let mut t = AppTotals::new();
        let (s, n) = t.report(1, counts("a", 10, 30, 2_000, 10)).unwrap();
        assert_eq!((s.fanout[0], s.requests, n), ((10, 30), 10, 1));
        let (s, n) = t.report(2, counts("a", 4, 4, 500, 5)).unwrap();
        assert_eq!((s.fanout[0], s.requests, n), ((14, 34), 15, 2));
        assert_eq!(
            (s.latency[0].observed_ns, s.latency[0].profiled_ns),
            (2_500, 2_000)
        );
        // A later report replaces the frontend's earlier one.
        let (s, _) = t.report(1, counts("a", 20, 60, 4_000, 20)).unwrap();
        assert_eq!((s.fanout[0], s.requests), ((24, 64), 25));
        // Frontend 2 leaves: its counters stay; a new one adds to them.
        t.frontend_gone(2);
        let (s, n) = t.report(3, counts("a", 1, 2, 0, 1)).unwrap();
        assert_eq!((s.fanout[0], s.requests, n), ((25, 66), 26, 3));
        // Another application is summed apart.
        let (s, n) = t.report(2, counts("b", 1, 1, 0, 1)).unwrap();
        assert_eq!((s.fanout[0], s.requests, n), ((1, 1), 1, 1));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_report_of_another_shape_or_past_the_bound_is_refused_and_changes_nothing() {
        let mut t = AppTotals::new();
        t.report(1, counts("a", 10, 30, 0, 10)).unwrap();
        let mut odd = counts("a", 99, 99, 0, 99);
        odd.fanout.push((1, 1));
        let e = t.report(2, odd).unwrap_err();
        assert!(
            e.contains("2 edges") && e.contains("serve it with 1"),
            "{e}"
        );
        assert!(t.report(2, counts("", 1, 1, 0, 1)).is_err());
        let (s, n) = t.report(1, counts("a", 10, 30, 0, 10)).unwrap();
        assert_eq!((s.fanout[0], s.requests, n), ((10, 30), 10, 1));
        for i in 1..MAX_APPS {
            t.report(1, counts(&format!("x{i}"), 0, 0, 0, 0)).unwrap();
        }
        assert_eq!(t.len(), MAX_APPS);
        let e = t.report(1, counts("one-more", 0, 0, 0, 0)).unwrap_err();
        assert!(e.contains("summed already"), "{e}");
        // One already summed still is.
        assert!(t.report(4, counts("x7", 1, 1, 0, 1)).is_ok());
        // Too many edges.
        let mut wide = counts("w", 0, 0, 0, 0);
        wide.fanout = vec![(0, 0); MAX_PARTS + 1];
        assert!(t.report(1, wide).unwrap_err().contains("at most"));
    }

    #[test]
    fn the_reports_kept_are_bounded_and_a_gone_frontend_frees_its_own() {
        let mut t = AppTotals::new();
        let per = (MAX_REPORTS / MAX_APPS) as u32;
        for node in 0..per {
            for i in 0..MAX_APPS {
                t.report(node, counts(&format!("a{i}"), 1, 1, 0, 1))
                    .unwrap();
            }
        }
        let e = t.report(per, counts("a0", 1, 1, 0, 1)).unwrap_err();
        assert!(e.contains("reports are kept already"), "{e}");
        // A frontend's later report replaces its own.
        assert!(t.report(0, counts("a0", 2, 2, 0, 2)).is_ok());
        t.frontend_gone(0);
        let (s, n) = t.report(per, counts("a0", 1, 1, 0, 1)).unwrap();
        assert_eq!((s.requests, n), (2 + u64::from(per - 1) + 1, per + 1));
    }

    #[test]
    fn sums_saturate() {
        let mut t = AppTotals::new();
        t.report(1, counts("a", u64::MAX, 1, u64::MAX, u64::MAX))
            .unwrap();
        let (s, _) = t.report(2, counts("a", 5, 1, 5, 5)).unwrap();
        assert_eq!(
            (s.fanout[0].0, s.latency[0].observed_ns, s.requests),
            (u64::MAX, u64::MAX, u64::MAX)
        );
    }
}
