//! Re-planning a served application on what its inputs do (Scrooge §3.5).
//!
//! A frontend serves an application with one latency budget per step (the
//! deadline rule turns them into each task's deadline). Those budgets are a
//! plan, and a plan assumes each fan-out edge's mean item count and each
//! step's latency profile. [`Replanner`] is the pure state machine (no clock,
//! no I/O) that keeps the plan in line with what the inputs and the GPUs do:
//! once per epoch the frontend hands it its cumulative counters (the parent
//! outputs and items it counted on every fan-out edge; per step, the run
//! times of the batches its module requests ran in and what the model's
//! profile gives for those batches, [`LatencySeen`]; the application
//! requests it received) and the epoch's length; it feeds the epoch's share
//! to a [`DriftDetector`] and, when the detector confirms a drift, plans the
//! application again with the `fermata` planner ([`crate::plan::app::fermata`])
//! at the measured fan-outs, the steps' profiles scaled by their measured
//! observed/profiled ratios and the measured request rate
//! ([`App::remeasured`]), and answers the new plan ([`NewPlan`]): each step's
//! budget, each edge's planned fan-out, each step's planned latency ratio and
//! each module's planned rate. The driver installs the budgets for new
//! requests.

use super::{DriftConfig, DriftDetector, EdgeKind, Graph};
use crate::core::Dur;
use crate::plan::app::{fermata::fermata, App, Config, Edge as PlanEdge, Hardware, HwKind, Module};

/// One step's latency profile on the hardware it runs on: (batch size,
/// latency of one batch in seconds), batch sizes ascending.
pub type StepProfile = Vec<(u32, f64)>;

/// The request rate a plan assumes before any was measured (r/s).
pub const DEFAULT_INGRESS_RPS: f64 = 1.0;

/// The latency ratios a plan is made with are held to
/// [`MIN_LATENCY_RATIO`]..=[`MAX_LATENCY_RATIO`] (a profile off by more
/// than 100x either way is a wrong profile, not a drift).
pub const MIN_LATENCY_RATIO: f64 = 0.01;
pub const MAX_LATENCY_RATIO: f64 = 100.0;

/// What a frontend measured of one step's module: cumulative over its
/// answers that ran, the batches' run times on the GPU and the latencies
/// the model's profile gives for batches of those sizes (nanoseconds), and
/// how many answers those sums cover. The wire's own type: frontends send
/// it to the scheduler as it is, and hear the sums over every frontend.
pub type LatencySeen = crate::wire::StepLatency;

/// A plan to install.
#[derive(Debug, Clone, PartialEq)]
pub struct NewPlan {
    /// Per step: its latency budget.
    pub budgets: Vec<Dur>,
    /// Per graph edge: the mean fan-out planned with (`None`: a whole edge).
    pub fanout: Vec<Option<f64>>,
    /// Per step: the observed/profiled latency ratio its profile was scaled
    /// by (1: the profile as it is).
    pub latency_ratio: Vec<f64>,
    /// The application's request rate planned with (r/s).
    pub ingress_rps: f64,
    /// Per step: the request rate its module is planned for (r/s).
    pub module_rates: Vec<f64>,
    /// The fan-out edges and the steps whose drift triggered it.
    pub drifted_edges: Vec<usize>,
    pub drifted_steps: Vec<usize>,
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
    lat_seen: Vec<LatencySeen>,
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
            lat_seen: vec![LatencySeen::default(); steps.len()],
            requests: 0,
            ingress_rps: DEFAULT_INGRESS_RPS,
            failures: 0,
        })
    }

    /// The fan-out per graph edge the current plan assumes (`None`: whole).
    pub fn planned_fanout(&self) -> &[Option<f64>] {
        self.detector.planned_fanout()
    }

    /// The observed/profiled latency ratio per step the current plan assumes.
    pub fn planned_latency_ratio(&self) -> &[f64] {
        self.detector.planned_latency_ratio()
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
    /// graph edge; `None` keeps the planned value), each step's profile
    /// scaled by `latency_ratio` (held to [`MIN_LATENCY_RATIO`]..=
    /// [`MAX_LATENCY_RATIO`]) and `ingress_rps` requests per second.
    pub fn plan(
        &self,
        fanout: &[Option<f64>],
        latency_ratio: &[f64],
        ingress_rps: f64,
    ) -> Result<NewPlan, String> {
        if fanout.len() != self.base.edges.len() {
            return Err(format!(
                "{} fan-outs for {} edges",
                fanout.len(),
                self.base.edges.len()
            ));
        }
        if latency_ratio.len() != self.base.modules.len() {
            return Err(format!(
                "{} latency ratios for {} steps",
                latency_ratio.len(),
                self.base.modules.len()
            ));
        }
        if let Some(k) = latency_ratio.iter().find(|k| !k.is_finite()) {
            return Err(format!("latency ratio {k} is not finite"));
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
        let ratio: Vec<f64> = latency_ratio
            .iter()
            .map(|k| k.clamp(MIN_LATENCY_RATIO, MAX_LATENCY_RATIO))
            .collect();
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
            latency_ratio: ratio,
            ingress_rps,
            module_rates: app.rates.clone(),
            drifted_edges: Vec::new(),
            drifted_steps: Vec::new(),
            worst: Dur::from_secs_f64(plan.worst),
            cost: plan.cost,
        })
    }

    /// Takes the cumulative counters `seen`, `latency` and `requests` (as
    /// [`Replanner::epoch`]'s) as the point the next epoch counts from,
    /// recording nothing: counters that already hold a history (sums over
    /// frontends that served the application before this one started) are
    /// not one epoch's worth.
    pub fn rebase(
        &mut self,
        seen: &[(u64, u64)],
        latency: &[LatencySeen],
        requests: u64,
    ) -> Result<(), String> {
        self.check_shape(seen, latency)?;
        self.seen = seen.to_vec();
        self.lat_seen = latency.to_vec();
        self.requests = requests;
        Ok(())
    }

    fn check_shape(&self, seen: &[(u64, u64)], latency: &[LatencySeen]) -> Result<(), String> {
        if seen.len() != self.seen.len() {
            return Err(format!(
                "counters for {} edges, the application has {}",
                seen.len(),
                self.seen.len()
            ));
        }
        if latency.len() != self.lat_seen.len() {
            return Err(format!(
                "latencies for {} steps, the application has {}",
                latency.len(),
                self.lat_seen.len()
            ));
        }
        Ok(())
    }

    /// Ends an epoch of `secs` seconds at the cumulative counters `seen`
    /// (per graph edge: parent outputs counted and the items they carried;
    /// whole edges' are ignored), `latency` (per step, [`LatencySeen`]) and
    /// `requests` (application requests received): the new plan when a
    /// fan-out or a step's latency ratio drifted, an error when the planner
    /// could not plan at the measured values (the budgets in force then
    /// stay). Counters of which any went backwards (sums over frontends
    /// that a new scheduler started again) end no epoch: they are the
    /// point the next one counts from ([`Replanner::rebase`]).
    pub fn epoch(
        &mut self,
        seen: &[(u64, u64)],
        latency: &[LatencySeen],
        requests: u64,
        secs: f64,
    ) -> Result<Option<NewPlan>, String> {
        self.check_shape(seen, latency)?;
        let back = requests < self.requests
            || seen
                .iter()
                .zip(&self.seen)
                .any(|(&(o, i), &(o0, i0))| o < o0 || i < i0)
            || latency.iter().zip(&self.lat_seen).any(|(l, l0)| {
                l.samples < l0.samples
                    || l.observed_ns < l0.observed_ns
                    || l.profiled_ns < l0.profiled_ns
            });
        if back {
            self.rebase(seen, latency, requests)?;
            return Ok(None);
        }
        for (v, (now, was)) in latency.iter().zip(&self.lat_seen).enumerate() {
            let n = now.samples.saturating_sub(was.samples);
            if n == 0 {
                continue;
            }
            let o = now.observed_ns.saturating_sub(was.observed_ns) as f64 / 1e9;
            let p = now.profiled_ns.saturating_sub(was.profiled_ns) as f64 / 1e9;
            if p > 0.0 {
                self.detector.record_latency_sums(v, o, p, n)?;
            }
        }
        self.lat_seen = latency.to_vec();
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
        match self.plan(&r.fanout, &r.latency_ratio, self.ingress_rps) {
            Ok(mut p) => {
                p.drifted_edges = r.drifted_edges;
                p.drifted_steps = r.drifted_models;
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

    /// Nothing measured of either step's latency.
    const LAT0: [LatencySeen; 2] = [LatencySeen {
        observed_ns: 0,
        profiled_ns: 0,
        samples: 0,
    }; 2];

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
            assert_eq!(r.epoch(&[(o, i)], &LAT0, q, 1.0), Ok(None));
        }
        assert_eq!((r.epochs(), r.replans()), (10, 0));
        assert_eq!(r.planned_fanout(), &[Some(1.0)]);
        assert!((r.ingress_rps() - 500.0).abs() < 1e-9);
    }

    #[test]
    fn a_tripled_fanout_replans_at_the_measured_mean_and_rate() {
        let mut r = replanner(DriftConfig::default());
        assert_eq!(r.epoch(&[(400, 400)], &LAT0, 400, 1.0), Ok(None));
        // The next epoch: 400 requests, 1,200 items.
        let p = r
            .epoch(&[(800, 1600)], &LAT0, 800, 1.0)
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
        assert_eq!(
            r.plan(&[Some(3.0)], &[1.0, 1.0], 400.0).unwrap().budgets,
            p.budgets
        );
        assert_eq!(r.planned_fanout(), &[Some(3.0)]);
        assert_eq!(r.replans(), 1);
        // The same fan-out again is the plan: no second re-plan.
        assert_eq!(r.epoch(&[(1200, 2800)], &LAT0, 1200, 1.0), Ok(None));
    }

    #[test]
    fn sums_with_a_history_are_a_base_and_sums_that_go_back_start_a_new_one() {
        let mut r = replanner(DriftConfig::default());
        // Sums over frontends that served for a while: a base, not an
        // epoch (as one epoch they would be a rate of 100,000 r/s).
        r.rebase(&[(100_000, 100_000)], &LAT0, 100_000).unwrap();
        assert_eq!(r.epochs(), 0);
        assert_eq!(
            r.epoch(&[(100_400, 100_400)], &LAT0, 100_400, 1.0),
            Ok(None)
        );
        assert!((r.ingress_rps() - 400.0).abs() < 1e-9);
        assert_eq!(r.epochs(), 1);
        // A new scheduler sums fewer frontends: the sums go back. No epoch
        // ends on them (not a fan-out of 0 nor a rate of 0), the next counts
        // from them.
        assert_eq!(r.epoch(&[(50_000, 50_000)], &LAT0, 50_000, 1.0), Ok(None));
        assert_eq!(r.epochs(), 1);
        let p = r
            .epoch(&[(50_400, 51_200)], &LAT0, 50_400, 1.0)
            .unwrap()
            .expect("a 3x fan-out over the new base re-plans");
        assert_eq!(p.fanout, vec![Some(3.0)]);
        assert!((p.ingress_rps - 400.0).abs() < 1e-9);
        // A latency sum that goes back alone is a new base too.
        let lat = [
            LatencySeen {
                observed_ns: 10,
                profiled_ns: 10,
                samples: 1,
            },
            LAT0[1],
        ];
        assert_eq!(r.epoch(&[(50_800, 52_400)], &lat, 50_800, 1.0), Ok(None));
        let epochs = r.epochs();
        assert_eq!(r.epoch(&[(51_200, 53_600)], &LAT0, 51_200, 1.0), Ok(None));
        assert_eq!(r.epochs(), epochs, "a latency sum that went back");
        assert!(r.rebase(&[], &LAT0, 0).is_err());
    }

    #[test]
    fn more_items_per_request_buy_the_classifier_a_larger_share_of_the_slo() {
        let r = replanner(DriftConfig::default());
        // At a rate where classify's batches must grow with its rate, the
        // planner moves budget to it as the fan-out grows.
        let one = r.plan(&[Some(1.0)], &[1.0, 1.0], 600.0).unwrap();
        let three = r.plan(&[Some(3.0)], &[1.0, 1.0], 600.0).unwrap();
        let share = |p: &NewPlan| p.budgets[1].as_secs_f64() / p.budgets[0].as_secs_f64();
        assert!(share(&three) >= share(&one), "{one:?}\n{three:?}");
        assert!(three.cost > one.cost, "{one:?}\n{three:?}");
    }

    #[test]
    fn an_idle_epoch_keeps_the_last_rate_and_bad_inputs_are_refused() {
        let mut r = replanner(DriftConfig::default());
        assert_eq!(r.epoch(&[(100, 100)], &LAT0, 100, 2.0), Ok(None));
        assert_eq!(r.epoch(&[(100, 100)], &LAT0, 100, 2.0), Ok(None));
        assert!((r.ingress_rps() - 50.0).abs() < 1e-9);
        assert!(r.epoch(&[(1, 1), (2, 2)], &LAT0, 100, 1.0).is_err());
        assert!(r.plan(&[Some(1.0)], &[1.0, 1.0], 0.0).is_err());
        assert!(r.plan(&[], &[1.0, 1.0], 1.0).is_err());
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

    /// Adds an epoch's `n` answers of each step to the cumulative counters
    /// `acc`: detect's at its profile, classify's at `k` times its profile
    /// (10 ms each).
    fn add(acc: &mut [LatencySeen; 2], n: u64, k: f64) -> [LatencySeen; 2] {
        let prof = 10_000_000 * n;
        for (v, a) in acc.iter_mut().enumerate() {
            let k = if v == 1 { k } else { 1.0 };
            a.observed_ns += (prof as f64 * k) as u64;
            a.profiled_ns += prof;
            a.samples += n;
        }
        *acc
    }

    #[test]
    fn a_slower_module_replans_with_its_profile_scaled_and_more_budget() {
        let mut r = replanner(DriftConfig::default());
        let mut acc = LAT0;
        let fan = |e: u64| [(600 * e, 600 * e)];
        // At the profiles: no re-plan.
        assert_eq!(
            r.epoch(&fan(1), &add(&mut acc, 200, 1.0), 600, 1.0),
            Ok(None)
        );
        let before = r.plan(&[Some(1.0)], &[1.0, 1.0], 600.0).unwrap();
        // classify's batches now take 1.5x what its profile says.
        let p = r
            .epoch(&fan(2), &add(&mut acc, 200, 1.5), 1200, 1.0)
            .unwrap()
            .expect("a 1.5x slower classify re-plans");
        assert_eq!(p.drifted_steps, vec![1]);
        assert!(p.drifted_edges.is_empty());
        assert!((p.latency_ratio[1] - 1.5).abs() < 1e-6, "{p:?}");
        assert!((p.latency_ratio[0] - 1.0).abs() < 1e-9, "{p:?}");
        assert_eq!(p.fanout, vec![Some(1.0)]);
        assert!((r.planned_latency_ratio()[1] - 1.5).abs() < 1e-6);
        // The plan is the planner's at the scaled profile: the slower module
        // gets a larger share of the SLO and the plan costs more.
        assert_eq!(
            r.plan(&[Some(1.0)], &p.latency_ratio, 600.0)
                .unwrap()
                .budgets,
            p.budgets
        );
        let share = |p: &NewPlan| p.budgets[1].as_secs_f64() / p.budgets[0].as_secs_f64();
        assert!(share(&p) > share(&before), "{before:?}\n{p:?}");
        assert!(p.cost > before.cost, "{before:?}\n{p:?}");
        // Still 1.5x (1.6x is inside the dead band): no second re-plan.
        for _ in 0..3 {
            assert_eq!(
                r.epoch(&fan(3), &add(&mut acc, 200, 1.6), 1800, 1.0),
                Ok(None)
            );
        }
        assert_eq!(r.replans(), 1);
    }

    #[test]
    fn latency_counters_that_go_back_or_do_not_fit_are_nothing_or_refused() {
        let mut r = replanner(DriftConfig::default());
        let mut acc = LAT0;
        let p = r.epoch(&[(600, 600)], &add(&mut acc, 200, 3.0), 600, 1.0);
        assert!(matches!(p, Ok(Some(_))), "{p:?}");
        // Counters reset (a restart): nothing new, no drift from it.
        assert_eq!(r.epoch(&[(1200, 1200)], &LAT0, 1200, 1.0), Ok(None));
        assert!(r.epoch(&[(1800, 1800)], &LAT0[..1], 1800, 1.0).is_err());
        assert!(r.plan(&[Some(1.0)], &[1.0], 10.0).is_err());
        assert!(r.plan(&[Some(1.0)], &[1.0, f64::NAN], 10.0).is_err());
        // A ratio past the bounds is planned at the bound (under an SLO
        // that a 100x slower detect still meets).
        let r = Replanner::new(
            &graph(),
            &[linear(1.0, 8.0, 32), linear(0.5, 4.0, 32)],
            Dur::from_ms(100_000),
            1.0,
            DriftConfig::default(),
        )
        .unwrap();
        let p = r.plan(&[Some(1.0)], &[1e6, 0.0], 10.0).unwrap();
        assert_eq!(p.latency_ratio, vec![MAX_LATENCY_RATIO, MIN_LATENCY_RATIO]);
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
        assert!(r.epoch(&[(100, 300)], &LAT0, 100, 1.0).is_err());
        assert_eq!((r.replans(), r.failures()), (0, 1));
    }
}
