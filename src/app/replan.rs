//! Re-planning a served application on what its inputs do (Scrooge §3.5).
//!
//! A frontend serves an application with one latency budget per step (the
//! deadline rule turns them into each task's deadline). Those budgets are a
//! plan, and a plan assumes each fan-out edge's mean item count. [`Replanner`]
//! is the pure state machine (no clock, no I/O) that keeps the plan in line
//! with what the inputs do: once per epoch the frontend hands it its
//! cumulative counters (the parent outputs and items it counted on every
//! fan-out edge, the application requests it received) and the epoch's
//! length; it feeds the epoch's share to a [`DriftDetector`] and, when the
//! detector confirms a drift, plans the application again with the `fermata`
//! planner ([`crate::plan::app::fermata`]) at the measured fan-outs and the
//! measured request rate ([`App::remeasured`]), and answers the new plan
//! ([`NewPlan`]): each step's budget, each edge's planned fan-out and each
//! module's planned rate. The driver installs the budgets for new requests.

use super::{DriftConfig, DriftDetector, EdgeKind, Graph};
use crate::core::Dur;
use crate::plan::app::{fermata::fermata, App, Config, Edge as PlanEdge, Hardware, HwKind, Module};

/// One step's latency profile on the hardware it runs on: (batch size,
/// latency of one batch in seconds), batch sizes ascending.
pub type StepProfile = Vec<(u32, f64)>;

/// The request rate a plan assumes before any was measured (r/s).
pub const DEFAULT_INGRESS_RPS: f64 = 1.0;

/// A plan to install.
#[derive(Debug, Clone, PartialEq)]
pub struct NewPlan {
    /// Per step: its latency budget.
    pub budgets: Vec<Dur>,
    /// Per graph edge: the mean fan-out planned with (`None`: a whole edge).
    pub fanout: Vec<Option<f64>>,
    /// The application's request rate planned with (r/s).
    pub ingress_rps: f64,
    /// Per step: the request rate its module is planned for (r/s).
    pub module_rates: Vec<f64>,
    /// The fan-out edges whose drift triggered it.
    pub drifted_edges: Vec<usize>,
    /// The plan's predicted worst case and cost (machines, fractional).
    pub worst: Dur,
    pub cost: f64,
}

/// The re-planner of one served application (see the module's text).
#[derive(Debug, Clone)]
pub struct Replanner {
    /// The application as the planner sees it, at the planned fan-outs and
    /// one request per second into each root.
    base: App,
    detector: DriftDetector,
    /// The cumulative counters the last epoch ended at.
    seen: Vec<(u64, u64)>,
    requests: u64,
    /// The last positive request rate measured (r/s).
    ingress_rps: f64,
    failures: u64,
}

impl Replanner {
    /// A re-planner for `graph` whose steps have the latency profiles
    /// `profiles` on one GPU type, under the SLO `slo`, with every fan-out
    /// edge planned at `planned_fanout` items per parent output.
    pub fn new(
        graph: &Graph,
        profiles: &[StepProfile],
        slo: Dur,
        planned_fanout: f64,
        cfg: DriftConfig,
    ) -> Result<Replanner, String> {
        let steps = graph.steps();
        if profiles.len() != steps.len() {
            return Err(format!(
                "{} profiles for {} steps",
                profiles.len(),
                steps.len()
            ));
        }
        if slo <= Dur::ZERO {
            return Err("the SLO must be positive".into());
        }
        if !(planned_fanout.is_finite() && planned_fanout >= 0.0) {
            return Err(format!(
                "planned fan-out {planned_fanout} is not a finite mean >= 0"
            ));
        }
        let mut modules = Vec::with_capacity(steps.len());
        for (s, p) in steps.iter().zip(profiles) {
            if p.is_empty() {
                return Err(format!("step {:?} has no latency profile", s.name));
            }
            let mut configs = Vec::with_capacity(p.len());
            for &(b, lat) in p {
                if b == 0 || !(lat.is_finite() && lat > 0.0) {
                    return Err(format!(
                        "step {:?}: batch {b} with latency {lat} s is not a profile point",
                        s.name
                    ));
                }
                configs.push(Config::new(0, b, 1, lat));
            }
            modules.push(Module {
                name: s.name.clone(),
                configs,
                prefix: None,
            });
        }
        let edges: Vec<PlanEdge> = graph
            .edges()
            .iter()
            .map(|e| PlanEdge {
                from: e.from,
                to: e.to,
                fanout: match e.kind {
                    EdgeKind::Whole => 1.0,
                    EdgeKind::Fanout => planned_fanout,
                },
            })
            .collect();
        let planned: Vec<Option<f64>> = graph
            .edges()
            .iter()
            .map(|e| (e.kind == EdgeKind::Fanout).then_some(planned_fanout))
            .collect();
        let mut rates = vec![0.0; steps.len()];
        for &v in graph.topo() {
            let ins = graph.ins(v);
            rates[v] = if ins.is_empty() {
                1.0
            } else {
                ins.iter()
                    .map(|&ei| edges[ei].fanout * rates[edges[ei].from])
                    .sum()
            };
        }
        let base = App {
            name: "app".into(),
            hardware: vec![Hardware {
                name: "gpu".into(),
                kind: HwKind::Gpu,
                price: 1.0,
                memory_mb: 0.0,
            }],
            modules,
            edges,
            slo: slo.as_secs_f64(),
            rates,
        };
        let n_edges = planned.len();
        Ok(Replanner {
            detector: DriftDetector::new(cfg, planned, steps.len())?,
            base,
            seen: vec![(0, 0); n_edges],
            requests: 0,
            ingress_rps: DEFAULT_INGRESS_RPS,
            failures: 0,
        })
    }

    /// The fan-out per graph edge the current plan assumes (`None`: whole).
    pub fn planned_fanout(&self) -> &[Option<f64>] {
        self.detector.planned_fanout()
    }

    /// Epochs ended, re-plans answered, and re-plans the planner refused.
    pub fn epochs(&self) -> u64 {
        self.detector.epochs()
    }
    pub fn replans(&self) -> u64 {
        self.detector.replans() - self.failures
    }
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// The request rate the next plan assumes (the last one measured).
    pub fn ingress_rps(&self) -> f64 {
        self.ingress_rps
    }

    /// The `fermata` plan of the application at mean fan-outs `fanout` (per
    /// graph edge; `None` keeps the planned value) and `ingress_rps` requests
    /// per second.
    pub fn plan(&self, fanout: &[Option<f64>], ingress_rps: f64) -> Result<NewPlan, String> {
        if fanout.len() != self.base.edges.len() {
            return Err(format!(
                "{} fan-outs for {} edges",
                fanout.len(),
                self.base.edges.len()
            ));
        }
        if !(ingress_rps.is_finite() && ingress_rps > 0.0) {
            return Err(format!("request rate {ingress_rps} must be positive"));
        }
        let fan: Vec<f64> = self
            .base
            .edges
            .iter()
            .zip(fanout)
            .map(|(e, m)| m.unwrap_or(e.fanout))
            .collect();
        let ratio = vec![1.0; self.base.modules.len()];
        let mut app = self.base.remeasured(&fan, &ratio)?;
        for r in &mut app.rates {
            *r *= ingress_rps;
        }
        let plan = fermata(&app)?;
        Ok(NewPlan {
            budgets: plan
                .modules
                .iter()
                .map(|m| Dur::from_secs_f64(m.budget))
                .collect(),
            fanout: self
                .base
                .edges
                .iter()
                .zip(&fan)
                .zip(self.detector.planned_fanout())
                .map(|((_, &f), p)| p.map(|_| f))
                .collect(),
            ingress_rps,
            module_rates: app.rates.clone(),
            drifted_edges: Vec::new(),
            worst: Dur::from_secs_f64(plan.worst),
            cost: plan.cost,
        })
    }

    /// Ends an epoch of `secs` seconds at the cumulative counters `seen`
    /// (per graph edge: parent outputs counted and the items they carried;
    /// whole edges' are ignored) and `requests` (application requests
    /// received): the new plan when the fan-out drifted, an error when the
    /// planner could not plan at the measured values (the budgets in force
    /// then stay).
    pub fn epoch(
        &mut self,
        seen: &[(u64, u64)],
        requests: u64,
        secs: f64,
    ) -> Result<Option<NewPlan>, String> {
        if seen.len() != self.seen.len() {
            return Err(format!(
                "counters for {} edges, the application has {}",
                seen.len(),
                self.seen.len()
            ));
        }
        for (e, (&(o, i), &(o0, i0))) in seen.iter().zip(&self.seen).enumerate() {
            if self.detector.planned_fanout()[e].is_some() {
                self.detector.record_fanout_counts(
                    e,
                    o.saturating_sub(o0),
                    i.saturating_sub(i0),
                )?;
            }
        }
        self.seen = seen.to_vec();
        let n = requests.saturating_sub(self.requests);
        self.requests = requests;
        if n > 0 && secs.is_finite() && secs > 0.0 {
            self.ingress_rps = n as f64 / secs;
        }
        let Some(r) = self.detector.end_epoch() else {
            return Ok(None);
        };
        match self.plan(&r.fanout, self.ingress_rps) {
            Ok(mut p) => {
                p.drifted_edges = r.drifted_edges;
                Ok(Some(p))
            }
            Err(e) => {
                self.failures += 1;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{EdgeSpec, Step};

    /// detect -> classify (fan-out), classify's batches cheap per item.
    fn graph() -> Graph {
        Graph::new(
            vec![Step::new("detect", "d"), Step::new("classify", "c")],
            &[EdgeSpec::fanout("detect", "classify")],
            &["classify"],
        )
        .unwrap()
    }

    fn linear(alpha_ms: f64, beta_ms: f64, max: u32) -> StepProfile {
        let mut b = 1;
        let mut out = Vec::new();
        while b <= max {
            out.push((b, (alpha_ms * f64::from(b) + beta_ms) / 1e3));
            b *= 2;
        }
        out
    }

    fn replanner(cfg: DriftConfig) -> Replanner {
        Replanner::new(
            &graph(),
            &[linear(1.0, 8.0, 32), linear(0.5, 4.0, 32)],
            Dur::from_ms(200),
            1.0,
            cfg,
        )
        .unwrap()
    }

    #[test]
    fn a_steady_fanout_never_replans() {
        let mut r = replanner(DriftConfig::default());
        let (mut o, mut i, mut q) = (0, 0, 0);
        for _ in 0..10 {
            o += 500;
            i += 500;
            q += 500;
            assert_eq!(r.epoch(&[(o, i)], q, 1.0), Ok(None));
        }
        assert_eq!((r.epochs(), r.replans()), (10, 0));
        assert_eq!(r.planned_fanout(), &[Some(1.0)]);
        assert!((r.ingress_rps() - 500.0).abs() < 1e-9);
    }

    #[test]
    fn a_tripled_fanout_replans_at_the_measured_mean_and_rate() {
        let mut r = replanner(DriftConfig::default());
        assert_eq!(r.epoch(&[(400, 400)], 400, 1.0), Ok(None));
        // The next epoch: 400 requests, 1,200 items.
        let p = r
            .epoch(&[(800, 1600)], 800, 1.0)
            .unwrap()
            .expect("a 3x fan-out re-plans");
        assert_eq!(p.fanout, vec![Some(3.0)]);
        assert_eq!(p.drifted_edges, vec![0]);
        assert!((p.ingress_rps - 400.0).abs() < 1e-9);
        assert!((p.module_rates[0] - 400.0).abs() < 1e-6, "{p:?}");
        assert!((p.module_rates[1] - 1200.0).abs() < 1e-6, "{p:?}");
        // The budgets are the planner's: within the SLO along the path, each
        // positive, and what a plan at the same values gives.
        assert_eq!(p.budgets.len(), 2);
        assert!(p.budgets.iter().all(|b| *b > Dur::ZERO), "{p:?}");
        assert!(p.budgets[0] + p.budgets[1] <= Dur::from_ms(200) + Dur(1000));
        assert_eq!(r.plan(&[Some(3.0)], 400.0).unwrap().budgets, p.budgets);
        assert_eq!(r.planned_fanout(), &[Some(3.0)]);
        assert_eq!(r.replans(), 1);
        // The same fan-out again is the plan: no second re-plan.
        assert_eq!(r.epoch(&[(1200, 2800)], 1200, 1.0), Ok(None));
    }

    #[test]
    fn more_items_per_request_buy_the_classifier_a_larger_share_of_the_slo() {
        let r = replanner(DriftConfig::default());
        // At a rate where classify's batches must grow with its rate, the
        // planner moves budget to it as the fan-out grows.
        let one = r.plan(&[Some(1.0)], 600.0).unwrap();
        let three = r.plan(&[Some(3.0)], 600.0).unwrap();
        let share = |p: &NewPlan| p.budgets[1].as_secs_f64() / p.budgets[0].as_secs_f64();
        assert!(share(&three) >= share(&one), "{one:?}\n{three:?}");
        assert!(three.cost > one.cost, "{one:?}\n{three:?}");
    }

    #[test]
    fn an_idle_epoch_keeps_the_last_rate_and_bad_inputs_are_refused() {
        let mut r = replanner(DriftConfig::default());
        assert_eq!(r.epoch(&[(100, 100)], 100, 2.0), Ok(None));
        assert_eq!(r.epoch(&[(100, 100)], 100, 2.0), Ok(None));
        assert!((r.ingress_rps() - 50.0).abs() < 1e-9);
        assert!(r.epoch(&[(1, 1), (2, 2)], 100, 1.0).is_err());
        assert!(r.plan(&[Some(1.0)], 0.0).is_err());
        assert!(r.plan(&[], 1.0).is_err());
        let g = graph();
        let p = linear(1.0, 1.0, 4);
        let cfg = DriftConfig::default;
        assert!(
            Replanner::new(&g, std::slice::from_ref(&p), Dur::from_ms(100), 1.0, cfg()).is_err()
        );
        assert!(Replanner::new(&g, &[p.clone(), vec![]], Dur::from_ms(100), 1.0, cfg()).is_err());
        assert!(Replanner::new(
            &g,
            &[p.clone(), vec![(1, 0.0)]],
            Dur::from_ms(100),
            1.0,
            cfg()
        )
        .is_err());
        assert!(Replanner::new(&g, &[p.clone(), p.clone()], Dur::ZERO, 1.0, cfg()).is_err());
        assert!(Replanner::new(&g, &[p.clone(), p], Dur::from_ms(100), f64::NAN, cfg()).is_err());
    }

    #[test]
    fn a_plan_the_planner_cannot_make_is_an_error_and_counted() {
        // A 2 ms SLO that a 4 ms batch cannot meet at any rate.
        let mut r = Replanner::new(
            &graph(),
            &[linear(1.0, 1.0, 4), linear(1.0, 4.0, 4)],
            Dur::from_ms(2),
            1.0,
            DriftConfig::default(),
        )
        .unwrap();
        assert!(r.epoch(&[(100, 300)], 100, 1.0).is_err());
        assert_eq!((r.replans(), r.failures()), (0, 1));
    }
}
