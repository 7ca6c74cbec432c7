//! How much slower than profiled each model really runs, as a pure state
//! machine: the scheduler feeds it every finished batch (its model, the time
//! the backend ran it and what the model's given profile says for its size)
//! and it answers when a model's profile must be planned scaled, and by how
//! much. The scheduler then plans that model's batches with l(b) times the
//! scale ([`crate::core::ModelState::set_latency_scale`]): a model that runs
//! K times slower than its profile gets its batches started early enough.
//!
//! # The rule
//! * A sample is measured / profiled for one batch. Samples that cannot be
//!   measurements (a time <= 0, a ratio beyond [1/16, 16]: a stalled host, a
//!   hung GPU, a clock step) are untrusted and dropped (counted).
//! * Per model the last `window` samples are kept (bounded memory; their
//!   `quantile` is the estimate the metrics show).
//! * Decisions look at the last `min_samples` samples, taken since the last
//!   change: when both their median and their `quantile` (p90 by default)
//!   differ from the scale in force by more than `threshold` (relative), in
//!   the same direction, the scale becomes that quantile (clamped to
//!   `[min_scale, max_scale]`). The median makes the decision robust (a few
//!   slow outliers, such as a fresh backend's first batches or a host stall,
//!   do not move it: the batches must be slower as a rule); the quantile
//!   sizes it (a batch planned with it overruns about one time in ten).
//!   Small drifts and noise leave it alone, and a change needs a fresh run of
//!   samples before the next (no flapping).
//! * By default the scale is never below 1: a model faster than its profile
//!   is no risk to its deadlines (its batches end early), and planning it
//!   with shorter latencies would only trade that safety for larger batches.
//!   `min_scale` below 1 allows it.
//!
//! Samples are ratios to the given (unscaled) profile, so they stay valid
//! across changes of the scale.

use crate::core::{Dur, LatencyProfile, ModelId, Time};
use crate::wire::PlanStatus;
use std::collections::VecDeque;

/// A sample beyond [1/ABSURD_RATIO, ABSURD_RATIO] is not a measurement.
pub const ABSURD_RATIO: f64 = 16.0;

/// The rule's settings (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyScaleConfig {
    /// Off: samples are still measured (for the metrics), scales stay 1.
    pub enabled: bool,
    /// Samples kept per model.
    pub window: usize,
    /// Samples a decision looks at (the last ones), all taken since the last
    /// change.
    pub min_samples: usize,
    /// The quantile of those samples that sizes a new scale.
    pub quantile: f64,
    /// Relative change of the estimate against the scale in force that
    /// changes it.
    pub threshold: f64,
    pub min_scale: f64,
    pub max_scale: f64,
}

impl Default for LatencyScaleConfig {
    fn default() -> Self {
        LatencyScaleConfig {
            enabled: true,
            window: 64,
            min_samples: 20,
            quantile: 0.9,
            threshold: 0.15,
            min_scale: 1.0,
            max_scale: 4.0,
        }
    }
}

impl LatencyScaleConfig {
    /// The settings with rescaling off.
    pub fn off() -> Self {
        LatencyScaleConfig {
            enabled: false,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(1..=4096).contains(&self.window) {
            return Err(format!(
                "latency window must be 1 to 4096, got {}",
                self.window
            ));
        }
        if self.min_samples == 0 || self.min_samples > self.window {
            return Err(format!(
                "latency min samples must be 1 to the window ({}), got {}",
                self.window, self.min_samples
            ));
        }
        if !(self.quantile > 0.0 && self.quantile <= 1.0) {
            return Err(format!(
                "latency quantile must be in (0, 1], got {}",
                self.quantile
            ));
        }
        if !(self.threshold > 0.0 && self.threshold < 1.0) {
            return Err(format!(
                "latency threshold must be in (0, 1), got {}",
                self.threshold
            ));
        }
        let lo = 1.0 / ABSURD_RATIO;
        let ok =
            (lo..=1.0).contains(&self.min_scale) && (1.0..=ABSURD_RATIO).contains(&self.max_scale);
        if !ok {
            return Err(format!(
                "latency scales must satisfy {lo} <= min <= 1 <= max <= {ABSURD_RATIO}, got {} and {}",
                self.min_scale, self.max_scale
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct PerModel {
    samples: VecDeque<f64>,
    /// Samples taken since the scale last changed (or since the start).
    since_change: usize,
    scale: f64,
}

/// What the machine counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LatencyScaleStats {
    pub samples: u64,
    /// Samples dropped as untrusted.
    pub absurd: u64,
    /// Changes of a model's scale.
    pub changes: u64,
}

/// Each model's measured latency ratio and the scale it is planned with.
#[derive(Debug, Clone)]
pub struct LatencyScaler {
    cfg: LatencyScaleConfig,
    models: Vec<PerModel>,
    stats: LatencyScaleStats,
}

impl LatencyScaler {
    /// `models` models (ids 0..models), every scale 1. `cfg` must be valid
    /// ([`LatencyScaleConfig::validate`]; an invalid one is replaced by the
    /// default with `enabled` kept).
    pub fn new(models: usize, cfg: LatencyScaleConfig) -> LatencyScaler {
        let cfg = if cfg.validate().is_ok() {
            cfg
        } else {
            LatencyScaleConfig {
                enabled: cfg.enabled,
                ..LatencyScaleConfig::default()
            }
        };
        LatencyScaler {
            cfg,
            models: (0..models)
                .map(|_| PerModel {
                    samples: VecDeque::with_capacity(cfg.window),
                    since_change: 0,
                    scale: 1.0,
                })
                .collect(),
            stats: LatencyScaleStats::default(),
        }
    }

    pub fn config(&self) -> &LatencyScaleConfig {
        &self.cfg
    }

    pub fn stats(&self) -> LatencyScaleStats {
        self.stats
    }

    /// Each model's scale, by model id.
    pub fn scales(&self) -> Vec<f64> {
        self.models.iter().map(|m| m.scale).collect()
    }

    pub fn scale(&self, model: ModelId) -> f64 {
        self.models.get(model.idx()).map_or(1.0, |m| m.scale)
    }

    /// Changes of any model's scale so far (a version of [`Self::scales`]).
    pub fn changes(&self) -> u64 {
        self.stats.changes
    }

    /// Takes `scales` (by model id: another scheduler's, a standby taking
    /// over from its primary) as the scales in force, each held to the
    /// settings' bounds; their samples start afresh. With rescaling off
    /// every scale stays 1. An error (nothing changes) when they are not one
    /// per model or one is not finite.
    pub fn adopt(&mut self, scales: &[f64]) -> Result<(), String> {
        if scales.len() != self.models.len() {
            return Err(format!(
                "{} latency scales for {} models",
                scales.len(),
                self.models.len()
            ));
        }
        if let Some(k) = scales.iter().find(|k| !k.is_finite()) {
            return Err(format!("latency scale {k} is not finite"));
        }
        if !self.cfg.enabled {
            return Ok(());
        }
        for (m, &k) in self.models.iter_mut().zip(scales) {
            let k = k.clamp(self.cfg.min_scale, self.cfg.max_scale);
            if k != m.scale {
                m.scale = k;
                self.stats.changes += 1;
            }
            m.samples.clear();
            m.since_change = 0;
        }
        Ok(())
    }

    /// The model's current estimate (the window's quantile), with at least
    /// `min_samples` samples.
    pub fn estimate(&self, model: ModelId) -> Option<f64> {
        let m = self.models.get(model.idx())?;
        (m.samples.len() >= self.cfg.min_samples).then(|| quantile(&m.samples, self.cfg.quantile))
    }

    /// Samples held for `model` (at most the window).
    pub fn held(&self, model: ModelId) -> usize {
        self.models.get(model.idx()).map_or(0, |m| m.samples.len())
    }

    /// One batch of `model` ran for `measured` where its given profile says
    /// `profiled`. Returns the model's new scale when this changes it.
    pub fn observe(&mut self, model: ModelId, measured: Dur, profiled: Dur) -> Option<f64> {
        let cfg = self.cfg;
        let m = self.models.get_mut(model.idx())?;
        if measured.0 <= 0 || profiled.0 <= 0 {
            self.stats.absurd += 1;
            return None;
        }
        let r = measured.0 as f64 / profiled.0 as f64;
        if !(r.is_finite() && (1.0 / ABSURD_RATIO..=ABSURD_RATIO).contains(&r)) {
            self.stats.absurd += 1;
            return None;
        }
        self.stats.samples += 1;
        if m.samples.len() == cfg.window {
            m.samples.pop_front();
        }
        m.samples.push_back(r);
        m.since_change = m.since_change.saturating_add(1);
        if !cfg.enabled || m.samples.len() < cfg.min_samples || m.since_change < cfg.min_samples {
            return None;
        }
        let mut recent: Vec<f64> = m
            .samples
            .range(m.samples.len() - cfg.min_samples..)
            .copied()
            .collect();
        recent.sort_unstable_by(f64::total_cmp);
        let off = |v: f64| {
            let d = v.clamp(cfg.min_scale, cfg.max_scale) / m.scale - 1.0;
            if d.abs() <= cfg.threshold {
                0
            } else if d > 0.0 {
                1
            } else {
                -1
            }
        };
        let (median, target) = (
            quantile_sorted(&recent, 0.5),
            quantile_sorted(&recent, cfg.quantile),
        );
        let dir = off(target);
        if dir == 0 || off(median) != dir {
            return None;
        }
        let target = target.clamp(cfg.min_scale, cfg.max_scale);
        m.scale = target;
        m.since_change = 0;
        self.stats.changes += 1;
        Some(target)
    }
}

/// The `q` quantile of `v` (nearest rank; `v` not empty).
fn quantile(v: &VecDeque<f64>, q: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().collect();
    let k = rank(s.len(), q);
    let (_, x, _) = s.select_nth_unstable_by(k, f64::total_cmp);
    *x
}

/// The `q` quantile of `s`, sorted (nearest rank; `s` not empty).
fn quantile_sorted(s: &[f64], q: f64) -> f64 {
    s[rank(s.len(), q)]
}

/// The index of the `q` quantile among `n` values in order (nearest rank).
fn rank(n: usize, q: f64) -> usize {
    ((q * n as f64).ceil() as usize).clamp(1, n) - 1
}

/// The sample a finished plan gives: the batch the backend ran and its run
/// time, when it is a measurement. `deadlines` are the plan's tasks'
/// deadlines (sorted here, in place); the backend ran those it did not leave
/// out as too late at `started` ([`super::backend::cut_batch`], recomputed
/// here with the same profile and start), so only a plan that `Ran` with
/// every input present is a sample. Returns (batch size, run time, what
/// `profile` says for it).
pub fn sample_of(
    status: PlanStatus,
    missing: u32,
    deadlines: &mut [Time],
    (started, finished): (Time, Time),
    profile: &LatencyProfile,
    span: Dur,
) -> Option<(u32, Dur, Dur)> {
    if status != PlanStatus::Ran || missing > 0 || deadlines.is_empty() {
        return None;
    }
    deadlines.sort_unstable();
    let planned = super::backend::planned_profile(profile, deadlines.len(), span);
    let cut = super::backend::too_late_prefix(deadlines, started, &planned);
    let b = u32::try_from(deadlines.len() - cut)
        .ok()
        .filter(|&b| b >= 1)?;
    if b > profile.max_batch() {
        return None;
    }
    let ran = super::check::batch_span(started, finished);
    Some((b, ran, profile.latency(b)))
}

/// The scheduler's side: each model's given profile, and the scaler fed
/// with the plans backends report done.
#[derive(Debug, Clone)]
pub struct LatencyWatch {
    scaler: LatencyScaler,
    /// Each model's given profile (None: its wire form does not parse; its
    /// plans are no samples).
    profiles: Vec<Option<LatencyProfile>>,
}

impl LatencyWatch {
    pub fn new(models: &[crate::wire::ModelInfo], cfg: LatencyScaleConfig) -> LatencyWatch {
        LatencyWatch {
            scaler: LatencyScaler::new(models.len(), cfg),
            profiles: models
                .iter()
                .map(|m| crate::node::exec::profile_of(&m.profile).ok())
                .collect(),
        }
    }

    pub fn scaler(&self) -> &LatencyScaler {
        &self.scaler
    }

    /// Every model's scale in millionths, by model id (as the wire carries
    /// them to a standby).
    pub fn scales_ppm(&self) -> Vec<u32> {
        self.scaler
            .scales()
            .iter()
            .map(|k| (k * 1e6).round().clamp(0.0, f64::from(u32::MAX)) as u32)
            .collect()
    }

    /// [`LatencyScaler::adopt`] of scales in millionths (a primary's, as
    /// [`Self::scales_ppm`] gives them).
    pub fn adopt_ppm(&mut self, ppm: &[u32]) -> Result<(), String> {
        let k: Vec<f64> = ppm.iter().map(|&p| f64::from(p) / 1e6).collect();
        self.scaler.adopt(&k)
    }

    /// A plan ended (see [`sample_of`]; `done` is the ledger's record of it):
    /// every model's scale when this changed one.
    pub fn on_done(
        &mut self,
        done: &mut super::plans::Done,
        (status, missing): (PlanStatus, u32),
        (started, finished): (Time, Time),
    ) -> Option<Vec<f64>> {
        let model = done.model;
        let p = self.profiles.get(model.idx())?.as_ref()?;
        let (_, ran, profiled) = sample_of(
            status,
            missing,
            &mut done.deadlines,
            (started, finished),
            p,
            done.span,
        )?;
        self.scaler.observe(model, ran, profiled)?;
        Some(self.scaler.scales())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: ModelId = ModelId(0);

    fn feed(s: &mut LatencyScaler, ratio: f64, n: usize) -> Vec<f64> {
        (0..n)
            .filter_map(|_| s.observe(M, Dur((ratio * 1e6) as i64), Dur(1_000_000)))
            .collect()
    }

    #[test]
    fn no_rescale_below_the_threshold_or_below_min_samples() {
        let mut s = LatencyScaler::new(1, LatencyScaleConfig::default());
        assert!(feed(&mut s, 1.1, 200).is_empty());
        assert_eq!(s.scale(M), 1.0);
        let mut s = LatencyScaler::new(1, LatencyScaleConfig::default());
        assert!(feed(&mut s, 2.0, 19).is_empty());
        assert_eq!(s.scale(M), 1.0);
        assert_eq!(s.estimate(M), None);
        assert_eq!(feed(&mut s, 2.0, 1), vec![2.0]);
    }

    #[test]
    fn a_slower_model_is_rescaled_to_its_p90() {
        let mut s = LatencyScaler::new(2, LatencyScaleConfig::default());
        assert!(feed(&mut s, 1.0, 64).is_empty());
        // Once most of the last 20 batches are slower (the 11th), the scale
        // moves to their p90.
        assert!(feed(&mut s, 1.5, 10).is_empty());
        let ch = feed(&mut s, 1.5, 1);
        assert_eq!(ch, vec![1.5]);
        assert_eq!(s.scales(), vec![1.5, 1.0]);
        assert_eq!(s.stats().changes, 1);
    }

    #[test]
    fn the_scale_is_bounded_and_never_below_one_by_default() {
        let mut s = LatencyScaler::new(1, LatencyScaleConfig::default());
        assert!(feed(&mut s, 0.5, 100).is_empty());
        assert_eq!(s.scale(M), 1.0);
        assert_eq!(feed(&mut s, 10.0, 100), vec![4.0]);
        let mut s = LatencyScaler::new(
            1,
            LatencyScaleConfig {
                min_scale: 0.5,
                ..LatencyScaleConfig::default()
            },
        );
        assert_eq!(feed(&mut s, 0.5, 20), vec![0.5]);
    }

    #[test]
    fn hysteresis_no_flapping_on_noise_around_a_scale() {
        let mut s = LatencyScaler::new(1, LatencyScaleConfig::default());
        assert_eq!(feed(&mut s, 1.5, 20), vec![1.5]);
        // Noise within the threshold around 1.5 never moves it.
        let mut changes = 0;
        for i in 0..2000 {
            let r = 1.5 * (1.0 + 0.12 * ((i * 7919 % 101) as f64 / 100.0 - 0.5));
            changes += usize::from(
                s.observe(M, Dur((r * 1e6) as i64), Dur(1_000_000))
                    .is_some(),
            );
        }
        assert_eq!(changes, 0);
        // A change needs min_samples since the last one, even when the
        // window's quantile jumps at once.
        let mut s = LatencyScaler::new(1, LatencyScaleConfig::default());
        assert_eq!(feed(&mut s, 2.0, 20), vec![2.0]);
        assert!(feed(&mut s, 3.0, 19).is_empty());
        assert_eq!(feed(&mut s, 3.0, 1), vec![3.0]);
        // Back to its profile: the scale returns to 1 once most of the
        // window says so.
        let back = feed(&mut s, 1.0, 64);
        assert_eq!(back.last(), Some(&1.0), "{back:?}");
    }

    #[test]
    fn absurd_samples_are_dropped() {
        let mut s = LatencyScaler::new(1, LatencyScaleConfig::default());
        for (m, p) in [(0, 1), (-5, 1), (1, 0), (100, 1), (1, 100), (i64::MAX, 1)] {
            assert_eq!(s.observe(M, Dur(m), Dur(p)), None);
        }
        assert_eq!(s.stats().absurd, 6);
        assert_eq!(s.held(M), 0);
        // An unknown model is ignored.
        assert_eq!(s.observe(ModelId(7), Dur(2), Dur(1)), None);
        assert_eq!(s.stats().samples, 0);
        // Hung batches among normal ones do not rescale.
        for i in 0..500 {
            let m = if i % 10 == 0 {
                1_000_000_000
            } else {
                1_000_000
            };
            assert_eq!(s.observe(M, Dur(m), Dur(1_000_000)), None);
        }
        assert_eq!(s.scale(M), 1.0);
        // Nor do slow outliers that are measurements (a fresh backend's first
        // batches, a host stall): up to 9 in 20, the median stays.
        let mut s = LatencyScaler::new(1, LatencyScaleConfig::default());
        for i in 0..1000 {
            let m = if i % 20 < 9 { 3_000_000 } else { 1_000_000 };
            assert_eq!(s.observe(M, Dur(m), Dur(1_000_000)), None);
        }
        assert_eq!(s.scale(M), 1.0);
    }

    #[test]
    fn memory_is_bounded_by_the_window() {
        let mut s = LatencyScaler::new(3, LatencyScaleConfig::default());
        for m in 0..3 {
            for _ in 0..10_000 {
                s.observe(ModelId(m), Dur(1_100_000), Dur(1_000_000));
            }
            assert_eq!(s.held(ModelId(m)), 64);
        }
    }

    #[test]
    fn off_measures_but_never_rescales() {
        let mut s = LatencyScaler::new(1, LatencyScaleConfig::off());
        assert!(feed(&mut s, 2.0, 100).is_empty());
        assert_eq!(s.scale(M), 1.0);
        assert_eq!(s.estimate(M), Some(2.0));
    }

    #[test]
    fn bad_settings_are_refused_and_replaced() {
        for bad in [
            LatencyScaleConfig {
                window: 0,
                ..Default::default()
            },
            LatencyScaleConfig {
                min_samples: 65,
                ..Default::default()
            },
            LatencyScaleConfig {
                quantile: 0.0,
                ..Default::default()
            },
            LatencyScaleConfig {
                threshold: f64::NAN,
                ..Default::default()
            },
            LatencyScaleConfig {
                min_scale: 2.0,
                ..Default::default()
            },
            LatencyScaleConfig {
                max_scale: 100.0,
                ..Default::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
            let s = LatencyScaler::new(1, bad);
            assert_eq!(s.config(), &LatencyScaleConfig::default());
        }
    }

    #[test]
    fn a_sample_is_the_batch_the_backend_ran() {
        let p = LatencyProfile::linear_ms(1.0, 4.0, 8).unwrap();
        let ms = |v: i64| Time(v * 1_000_000);
        // Three tasks, all in time at 0: batch 3, l(3) = 7 ms (the plan's
        // span, unscaled).
        let l3 = Dur::from_ms(7);
        let mut d = [ms(100), ms(50), ms(60)];
        assert_eq!(
            sample_of(PlanStatus::Ran, 0, &mut d, (ms(0), ms(9)), &p, l3),
            Some((3, Dur::from_ms(9), Dur::from_ms(7)))
        );
        // Started at 45 ms: the 50 ms task is left out (45 + l(3) > 50), then
        // 45 + l(2) = 51 <= 60: batch 2.
        assert_eq!(
            sample_of(PlanStatus::Ran, 0, &mut d, (ms(45), ms(51)), &p, l3),
            Some((2, Dur::from_ms(6), Dur::from_ms(6)))
        );
        assert_eq!(
            sample_of(PlanStatus::Ran, 1, &mut d, (ms(0), ms(9)), &p, l3),
            None
        );
        assert_eq!(
            sample_of(PlanStatus::TooLate, 0, &mut d, (ms(0), ms(9)), &p, l3),
            None
        );
        assert_eq!(
            sample_of(PlanStatus::Failed, 0, &mut d, (ms(0), ms(9)), &p, l3),
            None
        );
        assert_eq!(
            sample_of(PlanStatus::Ran, 0, &mut [], (ms(0), ms(9)), &p, l3),
            None
        );
        // Planned at 2x (span 14 ms), as the backend judged it: started at
        // 40 ms, 40 + l'(3) = 54 > 50 leaves the 50 ms task out and 40 +
        // l'(2) = 52 <= 60 keeps two; the sample is against the given l(2).
        let mut d = [ms(100), ms(50), ms(60)];
        assert_eq!(
            sample_of(
                PlanStatus::Ran,
                0,
                &mut d,
                (ms(40), ms(52)),
                &p,
                Dur::from_ms(14)
            ),
            Some((2, Dur::from_ms(12), Dur::from_ms(6)))
        );
        // The given profile would have kept all three (40 + 7 <= 50).
        assert_eq!(
            sample_of(PlanStatus::Ran, 0, &mut d, (ms(40), ms(52)), &p, l3),
            Some((3, Dur::from_ms(12), Dur::from_ms(7)))
        );
    }
}
