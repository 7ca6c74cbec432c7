//! When to re-plan an application on what its inputs do (Scrooge §3.5).
//!
//! A plan assumes each fan-out edge's mean item count and each module's latency
//! profile. [`DriftDetector`] is the pure state machine (no clock, no I/O) that
//! watches both: the frontend records the item count of every output on a fan-out
//! edge ([`DriftDetector::record_fanout`]) and each batch's observed and
//! profiled latency as the backends report its start and end
//! ([`DriftDetector::record_latency`], or both in bulk); at the end of every
//! epoch ([`DriftDetector::end_epoch`]) it compares the measurements over its
//! window with the values the plan assumed and, when one has drifted past the
//! threshold for `confirm` epochs in a row, answers "re-plan with these values"
//! ([`Replan`]). The values it answers become the planned ones, so measurements
//! within the threshold of them do not trigger again (the dead band is the
//! hysteresis), and the window restarts so the next decision sees only what
//! happened under the new plan.

use crate::core::Dur;
use std::collections::VecDeque;

/// How the detector decides.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftConfig {
    /// A value has drifted when |measured / planned − 1| exceeds this (a planned
    /// fan-out of 0 drifts when the measured mean exceeds it).
    pub threshold: f64,
    /// Epochs the measurement window spans (the latest ones).
    pub window: usize,
    /// Fewest samples (parent outputs for a fan-out, batches for a latency
    /// ratio) a measurement needs in the window to count.
    pub min_samples: u64,
    /// Consecutive epochs with a drift before a re-plan.
    pub confirm: u32,
    /// Epochs after a re-plan in which nothing triggers.
    pub cooldown: u32,
}

impl Default for DriftConfig {
    fn default() -> DriftConfig {
        DriftConfig {
            threshold: 0.25,
            window: 1,
            min_samples: 50,
            confirm: 1,
            cooldown: 0,
        }
    }
}

impl DriftConfig {
    /// Checks the settings.
    pub fn check(&self) -> Result<(), String> {
        if !(self.threshold.is_finite() && self.threshold > 0.0 && self.threshold <= 100.0) {
            return Err(format!(
                "drift threshold {} must be in (0, 100]",
                self.threshold
            ));
        }
        if self.window == 0 || self.window > 1000 {
            return Err(format!(
                "drift window {} must be 1..=1000 epochs",
                self.window
            ));
        }
        if self.min_samples == 0 {
            return Err("drift min_samples must be at least 1".into());
        }
        if self.confirm == 0 || self.confirm > 1000 {
            return Err(format!("drift confirm {} must be 1..=1000", self.confirm));
        }
        if self.cooldown > 1000 {
            return Err(format!("drift cooldown {} must be 0..=1000", self.cooldown));
        }
        Ok(())
    }
}

/// What one epoch recorded.
#[derive(Debug, Clone, Default)]
struct Counts {
    /// Per edge: parent outputs seen and the items they carried.
    fan: Vec<(u64, u64)>,
    /// Per model: Σ observed (s), Σ profiled (s), batches.
    lat: Vec<(f64, f64, u64)>,
}

impl Counts {
    fn new(edges: usize, models: usize) -> Counts {
        Counts {
            fan: vec![(0, 0); edges],
            lat: vec![(0.0, 0.0, 0); models],
        }
    }
}

/// The values to re-plan with: every fan-out edge's mean (measured where it had
/// enough samples, the planned value otherwise; `None` for whole edges) and
/// every model's observed/profiled latency ratio (1 where never measured).
#[derive(Debug, Clone, PartialEq)]
pub struct Replan {
    pub fanout: Vec<Option<f64>>,
    pub latency_ratio: Vec<f64>,
    /// The edges and models whose drift triggered it.
    pub drifted_edges: Vec<usize>,
    pub drifted_models: Vec<usize>,
}

/// What the window measured: `None` where it had fewer than `min_samples`.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub fanout: Vec<Option<f64>>,
    pub latency_ratio: Vec<Option<f64>>,
}

/// The drift detector of one application (see the module's text).
#[derive(Debug, Clone)]
pub struct DriftDetector {
    cfg: DriftConfig,
    /// Per edge: the planned mean fan-out, `None` for whole edges.
    planned_fanout: Vec<Option<f64>>,
    planned_ratio: Vec<f64>,
    cur: Counts,
    ring: VecDeque<Counts>,
    streak: u32,
    hold: u32,
    epochs: u64,
    replans: u64,
}

impl DriftDetector {
    /// A detector for an application whose edges have the planned fan-outs
    /// `planned_fanout` (`None`: a whole edge, never measured) and `models`
    /// modules planned at their profiles (ratio 1).
    pub fn new(
        cfg: DriftConfig,
        planned_fanout: Vec<Option<f64>>,
        models: usize,
    ) -> Result<DriftDetector, String> {
        cfg.check()?;
        for (e, f) in planned_fanout.iter().enumerate() {
            if let Some(f) = f {
                if !(f.is_finite() && *f >= 0.0) {
                    return Err(format!(
                        "edge {e}: planned fan-out {f} is not a finite mean >= 0"
                    ));
                }
            }
        }
        let edges = planned_fanout.len();
        Ok(DriftDetector {
            cfg,
            planned_fanout,
            planned_ratio: vec![1.0; models],
            cur: Counts::new(edges, models),
            ring: VecDeque::new(),
            streak: 0,
            hold: 0,
            epochs: 0,
            replans: 0,
        })
    }

    pub fn config(&self) -> &DriftConfig {
        &self.cfg
    }

    /// The values the current plan assumes.
    pub fn planned_fanout(&self) -> &[Option<f64>] {
        &self.planned_fanout
    }
    pub fn planned_latency_ratio(&self) -> &[f64] {
        &self.planned_ratio
    }

    /// Epochs ended and re-plans answered so far.
    pub fn epochs(&self) -> u64 {
        self.epochs
    }
    pub fn replans(&self) -> u64 {
        self.replans
    }

    /// One output of edge `edge`'s parent carried `items` items. Refused for an
    /// unknown or whole edge.
    pub fn record_fanout(&mut self, edge: usize, items: u32) -> Result<(), String> {
        match self.planned_fanout.get(edge) {
            Some(Some(_)) => {
                let c = &mut self.cur.fan[edge];
                c.0 += 1;
                c.1 += u64::from(items);
                Ok(())
            }
            Some(None) => Err(format!("edge {edge} is not a fan-out edge")),
            None => Err(format!(
                "edge {edge} is unknown (the application has {})",
                self.planned_fanout.len()
            )),
        }
    }

    /// `outputs` outputs of edge `edge`'s parent carried `items` items in all
    /// (what a driver that counts in bulk has: the same as `outputs` calls of
    /// [`DriftDetector::record_fanout`]). Refused for an unknown or whole edge.
    pub fn record_fanout_counts(
        &mut self,
        edge: usize,
        outputs: u64,
        items: u64,
    ) -> Result<(), String> {
        match self.planned_fanout.get(edge) {
            Some(Some(_)) => {
                let c = &mut self.cur.fan[edge];
                c.0 = c.0.saturating_add(outputs);
                c.1 = c.1.saturating_add(items);
                Ok(())
            }
            Some(None) => Err(format!("edge {edge} is not a fan-out edge")),
            None => Err(format!(
                "edge {edge} is unknown (the application has {})",
                self.planned_fanout.len()
            )),
        }
    }

    /// The current epoch's latency sums of `model` (observed s, profiled s,
    /// batches); refused for an unknown model.
    fn latency_sums(&mut self, model: usize) -> Result<&mut (f64, f64, u64), String> {
        let n = self.planned_ratio.len();
        self.cur
            .lat
            .get_mut(model)
            .ok_or_else(|| format!("model {model} is unknown (the application has {n})"))
    }

    /// One batch of `model` took `observed` where its profile says `profiled`.
    /// Refused for an unknown model or a non-positive profiled latency.
    pub fn record_latency(
        &mut self,
        model: usize,
        observed: Dur,
        profiled: Dur,
    ) -> Result<(), String> {
        let c = self.latency_sums(model)?;
        if profiled <= Dur::ZERO || observed < Dur::ZERO {
            return Err(format!(
                "model {model}: latencies must be positive (observed {observed:?}, profiled {profiled:?})"
            ));
        }
        c.0 += observed.as_secs_f64();
        c.1 += profiled.as_secs_f64();
        c.2 += 1;
        Ok(())
    }

    /// `batches` batches of `model` took `observed_s` seconds in all where
    /// their profile says `profiled_s` (what a driver that sums in bulk has:
    /// the same as `batches` calls of [`DriftDetector::record_latency`] with
    /// those sums). Refused for an unknown model, a non-finite or negative sum,
    /// or batches without a positive profiled sum.
    pub fn record_latency_sums(
        &mut self,
        model: usize,
        observed_s: f64,
        profiled_s: f64,
        batches: u64,
    ) -> Result<(), String> {
        let c = self.latency_sums(model)?;
        if !(observed_s.is_finite() && observed_s >= 0.0 && profiled_s.is_finite()) {
            return Err(format!(
                "model {model}: latency sums must be finite and >= 0 (observed {observed_s}, profiled {profiled_s})"
            ));
        }
        if batches == 0 {
            return Ok(());
        }
        if profiled_s <= 0.0 {
            return Err(format!(
                "model {model}: {batches} batches with a profiled sum of {profiled_s} s"
            ));
        }
        c.0 += observed_s;
        c.1 += profiled_s;
        c.2 = c.2.saturating_add(batches);
        Ok(())
    }

    /// What the window holds now (the epochs ended since the last re-plan, at
    /// most `window` of them, and the current one).
    pub fn measured(&self) -> Measured {
        let mut fan = self.cur.fan.clone();
        let mut lat = self.cur.lat.clone();
        for c in &self.ring {
            for (a, b) in fan.iter_mut().zip(&c.fan) {
                a.0 += b.0;
                a.1 += b.1;
            }
            for (a, b) in lat.iter_mut().zip(&c.lat) {
                a.0 += b.0;
                a.1 += b.1;
                a.2 += b.2;
            }
        }
        let min = self.cfg.min_samples;
        Measured {
            fanout: fan
                .iter()
                .zip(&self.planned_fanout)
                .map(|(&(n, items), p)| (p.is_some() && n >= min).then(|| items as f64 / n as f64))
                .collect(),
            latency_ratio: lat
                .iter()
                .map(|&(o, p, n)| (n >= min && p > 0.0).then(|| o / p))
                .collect(),
        }
    }

    fn drifted(&self, measured: f64, planned: f64) -> bool {
        if planned <= 0.0 {
            measured > self.cfg.threshold
        } else {
            (measured / planned - 1.0).abs() > self.cfg.threshold
        }
    }

    /// Ends an epoch: its counts join the window; answers the values to re-plan
    /// with when a drift has lasted `confirm` epochs (and no cooldown holds).
    pub fn end_epoch(&mut self) -> Option<Replan> {
        self.epochs += 1;
        let done = std::mem::replace(
            &mut self.cur,
            Counts::new(self.planned_fanout.len(), self.planned_ratio.len()),
        );
        self.ring.push_back(done);
        while self.ring.len() > self.cfg.window {
            self.ring.pop_front();
        }
        if self.hold > 0 {
            self.hold -= 1;
            self.streak = 0;
            return None;
        }
        let m = self.measured();
        let drifted_edges: Vec<usize> = m
            .fanout
            .iter()
            .zip(&self.planned_fanout)
            .enumerate()
            .filter_map(|(e, (m, p))| match (m, p) {
                (Some(m), Some(p)) if self.drifted(*m, *p) => Some(e),
                _ => None,
            })
            .collect();
        let drifted_models: Vec<usize> = m
            .latency_ratio
            .iter()
            .zip(&self.planned_ratio)
            .enumerate()
            .filter_map(|(v, (m, p))| match m {
                Some(m) if self.drifted(*m, *p) => Some(v),
                _ => None,
            })
            .collect();
        if drifted_edges.is_empty() && drifted_models.is_empty() {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak < self.cfg.confirm {
            return None;
        }
        let fanout: Vec<Option<f64>> = m
            .fanout
            .iter()
            .zip(&self.planned_fanout)
            .map(|(m, p)| p.map(|p| m.unwrap_or(p)))
            .collect();
        let latency_ratio: Vec<f64> = m
            .latency_ratio
            .iter()
            .zip(&self.planned_ratio)
            .map(|(m, p)| m.unwrap_or(*p))
            .collect();
        self.planned_fanout = fanout.clone();
        self.planned_ratio = latency_ratio.clone();
        self.ring.clear();
        self.streak = 0;
        self.hold = self.cfg.cooldown;
        self.replans += 1;
        Some(Replan {
            fanout,
            latency_ratio,
            drifted_edges,
            drifted_models,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(cfg: DriftConfig) -> DriftDetector {
        DriftDetector::new(cfg, vec![Some(2.0), None], 2).unwrap()
    }

    fn feed(d: &mut DriftDetector, n: u32, items: u32) {
        for _ in 0..n {
            d.record_fanout(0, items).unwrap();
        }
    }

    #[test]
    fn a_fanout_within_the_threshold_never_triggers() {
        let mut d = det(DriftConfig::default());
        for _ in 0..10 {
            // Mean 2.2 against 2.0: 10% off, under the 25% threshold.
            feed(&mut d, 80, 2);
            feed(&mut d, 20, 3);
            assert_eq!(d.end_epoch(), None);
        }
        assert_eq!(d.replans(), 0);
        assert_eq!(d.epochs(), 10);
    }

    #[test]
    fn a_fanout_past_the_threshold_replans_with_the_measured_mean_once() {
        let mut d = det(DriftConfig::default());
        feed(&mut d, 100, 6);
        let r = d.end_epoch().expect("a 3x fan-out re-plans");
        assert_eq!(r.fanout, vec![Some(6.0), None]);
        assert_eq!(r.latency_ratio, vec![1.0, 1.0]);
        assert_eq!(r.drifted_edges, vec![0]);
        assert!(r.drifted_models.is_empty());
        assert_eq!(d.planned_fanout(), &[Some(6.0), None]);
        // The same fan-out after the re-plan is the plan: no second trigger.
        for _ in 0..5 {
            feed(&mut d, 100, 6);
            assert_eq!(d.end_epoch(), None);
        }
        assert_eq!(d.replans(), 1);
    }

    #[test]
    fn counts_in_bulk_are_the_same_as_one_by_one() {
        let mut a = det(DriftConfig::default());
        let mut b = det(DriftConfig::default());
        feed(&mut a, 100, 6);
        b.record_fanout_counts(0, 100, 600).unwrap();
        assert_eq!(a.measured(), b.measured());
        assert_eq!(a.end_epoch(), b.end_epoch());
        assert!(b.record_fanout_counts(1, 1, 1).is_err());
        assert!(b.record_fanout_counts(7, 1, 1).is_err());
    }

    #[test]
    fn too_few_samples_do_not_count() {
        let mut d = det(DriftConfig::default());
        feed(&mut d, 49, 10);
        assert_eq!(d.measured().fanout, vec![None, None]);
        assert_eq!(d.end_epoch(), None);
        // With the window at one epoch the next one starts from nothing.
        feed(&mut d, 49, 10);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 50, 10);
        assert!(d.end_epoch().is_some());
    }

    #[test]
    fn the_window_sums_epochs_so_a_slow_edge_is_measured() {
        let cfg = DriftConfig {
            window: 3,
            ..DriftConfig::default()
        };
        let mut d = det(cfg);
        feed(&mut d, 20, 8);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 20, 8);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 20, 8);
        let r = d.end_epoch().expect("60 samples over three epochs");
        assert_eq!(r.fanout[0], Some(8.0));
    }

    #[test]
    fn confirm_needs_consecutive_epochs_and_a_quiet_epoch_resets_it() {
        let cfg = DriftConfig {
            confirm: 2,
            ..DriftConfig::default()
        };
        let mut d = det(cfg);
        feed(&mut d, 100, 6);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 100, 2);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 100, 6);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 100, 6);
        assert!(d.end_epoch().is_some());
    }

    #[test]
    fn cooldown_holds_after_a_replan() {
        let cfg = DriftConfig {
            cooldown: 2,
            ..DriftConfig::default()
        };
        let mut d = det(cfg);
        feed(&mut d, 100, 6);
        assert!(d.end_epoch().is_some());
        feed(&mut d, 100, 1);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 100, 1);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 100, 1);
        let r = d.end_epoch().expect("after the cooldown");
        assert_eq!(r.fanout[0], Some(1.0));
    }

    #[test]
    fn a_slower_model_replans_with_its_latency_ratio() {
        let mut d = det(DriftConfig::default());
        for _ in 0..60 {
            d.record_latency(1, Dur::from_ms(15), Dur::from_ms(10))
                .unwrap();
            d.record_latency(0, Dur::from_ms(10), Dur::from_ms(10))
                .unwrap();
        }
        let r = d.end_epoch().expect("1.5x slower");
        assert_eq!(r.drifted_models, vec![1]);
        assert!(r.drifted_edges.is_empty());
        assert!((r.latency_ratio[1] - 1.5).abs() < 1e-9);
        assert!((r.latency_ratio[0] - 1.0).abs() < 1e-9);
        assert_eq!(r.fanout, vec![Some(2.0), None]);
    }

    #[test]
    fn latency_sums_in_bulk_are_the_same_as_one_by_one() {
        let mut a = det(DriftConfig::default());
        let mut b = det(DriftConfig::default());
        for _ in 0..60 {
            a.record_latency(0, Dur::from_ms(15), Dur::from_ms(10))
                .unwrap();
        }
        b.record_latency_sums(0, 0.9, 0.6, 60).unwrap();
        let (ma, mb) = (a.measured(), b.measured());
        assert!((ma.latency_ratio[0].unwrap() - 1.5).abs() < 1e-9);
        assert!((mb.latency_ratio[0].unwrap() - 1.5).abs() < 1e-9);
        assert_eq!(ma.latency_ratio[1], None);
        assert_eq!(mb.latency_ratio[1], None);
        let (ra, rb) = (a.end_epoch().unwrap(), b.end_epoch().unwrap());
        assert_eq!(ra.drifted_models, rb.drifted_models);
        assert!((ra.latency_ratio[0] - rb.latency_ratio[0]).abs() < 1e-9);
        // Nothing counted is no sample; bad sums are refused.
        b.record_latency_sums(1, 0.0, 0.0, 0).unwrap();
        assert!(b.record_latency_sums(1, 1.0, 0.0, 3).is_err());
        assert!(b.record_latency_sums(1, f64::NAN, 1.0, 3).is_err());
        assert!(b.record_latency_sums(1, -1.0, 1.0, 3).is_err());
        assert!(b.record_latency_sums(2, 1.0, 1.0, 3).is_err());
        assert_eq!(b.measured().latency_ratio, vec![None, None]);
    }

    #[test]
    fn a_latency_ratio_within_the_threshold_of_the_plan_does_not_trigger_again() {
        let mut d = det(DriftConfig::default());
        d.record_latency_sums(1, 90.0, 60.0, 100).unwrap();
        let r = d.end_epoch().expect("1.5x re-plans");
        assert_eq!(r.drifted_models, vec![1]);
        assert!((d.planned_latency_ratio()[1] - 1.5).abs() < 1e-9);
        // 1.7x against the planned 1.5x is 13% off: inside the dead band.
        for _ in 0..5 {
            d.record_latency_sums(1, 102.0, 60.0, 100).unwrap();
            assert_eq!(d.end_epoch(), None);
        }
        // Back at the profile (1.0x against 1.5x, 33% off): re-planned down.
        d.record_latency_sums(1, 60.0, 60.0, 100).unwrap();
        let r = d.end_epoch().expect("back to the profile");
        assert!((r.latency_ratio[1] - 1.0).abs() < 1e-9);
        assert_eq!(d.replans(), 2);
    }

    #[test]
    fn a_planned_zero_fanout_drifts_when_items_appear() {
        let mut d = DriftDetector::new(DriftConfig::default(), vec![Some(0.0)], 1).unwrap();
        feed(&mut d, 100, 0);
        assert_eq!(d.end_epoch(), None);
        feed(&mut d, 100, 1);
        assert_eq!(d.end_epoch().unwrap().fanout, vec![Some(1.0)]);
    }

    #[test]
    fn bad_inputs_are_refused_and_change_nothing() {
        let mut d = det(DriftConfig::default());
        assert!(d.record_fanout(1, 3).unwrap_err().contains("not a fan-out"));
        assert!(d.record_fanout(9, 3).unwrap_err().contains("unknown"));
        assert!(d
            .record_latency(2, Dur::from_ms(1), Dur::from_ms(1))
            .unwrap_err()
            .contains("unknown"));
        assert!(d
            .record_latency(0, Dur::from_ms(1), Dur::ZERO)
            .unwrap_err()
            .contains("positive"));
        assert_eq!(
            d.measured(),
            Measured {
                fanout: vec![None, None],
                latency_ratio: vec![None, None]
            }
        );
        for bad in [
            DriftConfig {
                threshold: 0.0,
                ..DriftConfig::default()
            },
            DriftConfig {
                threshold: f64::NAN,
                ..DriftConfig::default()
            },
            DriftConfig {
                window: 0,
                ..DriftConfig::default()
            },
            DriftConfig {
                min_samples: 0,
                ..DriftConfig::default()
            },
            DriftConfig {
                confirm: 0,
                ..DriftConfig::default()
            },
        ] {
            assert!(DriftDetector::new(bad, vec![], 0).is_err());
        }
        assert!(DriftDetector::new(DriftConfig::default(), vec![Some(-1.0)], 0).is_err());
    }
}
