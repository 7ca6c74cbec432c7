//! `fermata bench adapt`: re-planning when the fan-out of an edge or a
//! module's speed changes (Scrooge §3.5), in the simulator.
//!
//! The application is `detect` → `classify` with a fan-out edge (Poisson, mean
//! `fanout`) on one emulated GPU type, planned by the `fermata` planner and
//! served by the production dispatcher (deferred, slack forwarding) on the
//! plan's machines rounded up. Mid-run (`jump_at_s`) the edge's mean fan-out
//! jumps by `jump` and `classify`'s batches become `slowdown` times slower
//! than its profile. The same run is simulated twice, with the same seed:
//! with the plan fixed, and with a [`DriftDetector`] that sees every fan-out
//! count and every batch's run time against its profile and, at the end of
//! an epoch where the measured mean or latency ratio has drifted past the
//! threshold, has the application re-planned by `fermata` with the measured
//! values (profiles scaled by the measured ratios) and moved onto the new
//! plan's machines live. It reports, per epoch, the
//! share of requests arriving in it that did not end within the SLO ("bad")
//! under each, and how many epochs after the one holding the jump the re-planned
//! run took to stay under 1% bad for good.

use super::apps::{app_sim, lines};
use crate::app::{DeadlineRule, DriftConfig, DriftDetector, Replan};
use crate::core::{Dur, Policy, Time};
use crate::plan::app::{fermata::fermata, App};
use crate::sim::apps::{
    fanout_mean, simulate_app_adaptive, Adapt, AppSim, AppSimOptions, AppSimResult, Replanned,
    Runtime,
};
use serde::Serialize;

/// The bad share an epoch must stay under once recovered.
pub const BAD_LIMIT: f64 = 0.01;

#[derive(Debug, Clone, Serialize)]
pub struct Options {
    /// Requests/s into `detect`.
    pub rate_rps: f64,
    /// The planned mean fan-out detect → classify.
    pub fanout: f64,
    /// The factor the mean jumps by, and when (s).
    pub jump: f64,
    pub jump_at_s: f64,
    /// The factor `classify`'s batches take over its profile from
    /// `jump_at_s` on (1: as profiled).
    pub slowdown: f64,
    pub epoch_s: f64,
    pub epochs: usize,
    /// The detector's threshold (relative drift that triggers a re-plan).
    pub threshold: f64,
    pub seed: u64,
    /// The simulator's own checks (every request ends once, placements).
    pub check: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            rate_rps: 2000.0,
            fanout: 2.0,
            jump: 3.0,
            jump_at_s: 7.0,
            slowdown: 1.0,
            epoch_s: 2.0,
            epochs: 10,
            threshold: 0.25,
            seed: 1,
            check: false,
        }
    }
}

impl Options {
    pub fn check(&self) -> Result<(), String> {
        let pos = |x: f64, hi: f64| x.is_finite() && x > 0.0 && x <= hi;
        if !pos(self.rate_rps, 100_000.0) {
            return Err("the rate must be in (0, 100000] r/s".into());
        }
        if !pos(self.fanout, 100.0) || self.fanout == 1.0 {
            return Err("the fan-out must be in (0, 100] and not exactly 1".into());
        }
        if !pos(self.jump, 100.0) {
            return Err("the jump must be in (0, 100]".into());
        }
        if !(self.slowdown.is_finite() && (0.01..=100.0).contains(&self.slowdown)) {
            return Err("the slowdown must be in [0.01, 100]".into());
        }
        if !pos(self.epoch_s, 3600.0) {
            return Err("the epoch must be in (0, 3600] s".into());
        }
        if self.epochs < 2 || self.epochs > 1000 {
            return Err("the epochs must be 2..=1000".into());
        }
        let end = self.epoch_s * self.epochs as f64;
        if !(self.jump_at_s.is_finite() && self.jump_at_s > 0.0 && self.jump_at_s < end) {
            return Err(format!("the jump must come within the run (0, {end}) s"));
        }
        if !pos(self.threshold, 100.0) {
            return Err("the threshold must be in (0, 100]".into());
        }
        Ok(())
    }
}

/// The application: `detect` → `classify` (fan-out `fanout`), SLO 200 ms, on
/// one emulated GPU type (price 1.0), one batch at a time per machine.
pub fn app(rate_rps: f64, fanout: f64) -> Result<App, String> {
    super::lanes::detect_classify("adapt", rate_rps, fanout, None)
}

/// The simulated application of `app`'s `fermata` plan on its machines
/// rounded up.
pub fn planned(app: &App, rule: DeadlineRule) -> Result<AppSim, String> {
    let plan = fermata(app)?;
    let ls = lines(&plan);
    let m: Vec<u32> = ls.iter().map(|l| l.machines).collect();
    app_sim(app, &plan, &ls, &m, rule)
}

/// A re-planner for `base`: the `fermata` plan of `base` remeasured with the
/// detector's values, as sub-clusters, budgets and rates.
pub fn replanner(
    base: &App,
    rule: DeadlineRule,
) -> impl FnMut(&Replan) -> Result<Replanned, String> + '_ {
    move |r: &Replan| {
        let fan: Vec<f64> = base
            .edges
            .iter()
            .zip(&r.fanout)
            .map(|(e, m)| m.unwrap_or(e.fanout))
            .collect();
        let app = base.remeasured(&fan, &r.latency_ratio)?;
        let sim = planned(&app, rule)?;
        Ok(Replanned {
            subclusters: sim.subclusters,
            budgets: sim.budgets,
            module_rates: sim.module_rates,
        })
    }
}

/// The detector for `sim`'s fan-out edges, planned at their means.
pub fn detector(sim: &AppSim, threshold: f64) -> Result<DriftDetector, String> {
    DriftDetector::new(
        DriftConfig {
            threshold,
            ..DriftConfig::default()
        },
        sim.fanout
            .iter()
            .map(|f| f.as_ref().map(fanout_mean))
            .collect(),
        sim.graph.steps().len(),
    )
}

/// Runs the application with the jump, re-planning or not.
pub fn simulate(o: &Options, replan: bool) -> Result<AppSimResult, String> {
    o.check()?;
    let rule = DeadlineRule::SlackForwarding;
    let base = app(o.rate_rps, o.fanout)?;
    let sim = planned(&base, rule)?;
    let epoch = Dur::from_secs_f64(o.epoch_s);
    let at = Time::ZERO + Dur::from_secs_f64(o.jump_at_s);
    let opt = AppSimOptions {
        runtime: Runtime::Core(Policy::Deferred),
        seed: o.seed,
        warmup: Dur::ZERO,
        duration: Dur::from_secs_f64(o.epoch_s * o.epochs as f64),
        check: o.check,
        fanout_jump: (o.jump != 1.0).then_some((at, 0, o.jump)),
        slowdown: (o.slowdown != 1.0).then_some((at, 1, o.slowdown)),
    };
    let mut f = replanner(&base, rule);
    let mut adapt = Adapt {
        epoch,
        detector: if replan {
            Some(detector(&sim, o.threshold)?)
        } else {
            None
        },
        replan: &mut f,
    };
    simulate_app_adaptive(&sim, &opt, &mut adapt)
}

#[derive(Debug, Clone, Serialize)]
pub struct EpochRow {
    pub start_s: f64,
    pub offered: u64,
    /// Bad share with the plan fixed, and with re-planning.
    pub bad_fixed: f64,
    pub bad_replan: f64,
    /// Machines per module at the end of the epoch with re-planning.
    pub machines_replan: Vec<u32>,
    pub replanned: bool,
    /// The detector's measured mean fan-out at the end of the epoch.
    pub measured_fanout: Option<f64>,
    /// The detector's measured observed/profiled latency ratio of
    /// `classify` at the end of the epoch.
    pub measured_ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub options: Options,
    /// Machines per module of the first plan.
    pub machines_fixed: Vec<u32>,
    pub rows: Vec<EpochRow>,
    /// The epoch holding the jump.
    pub jump_epoch: usize,
    /// Epochs after the jump's until bad stays under 1% to the end (`None`:
    /// never), with the plan fixed and with re-planning.
    pub recovered_fixed: Option<usize>,
    pub recovered_replan: Option<usize>,
}

/// Epochs after `jump_epoch` from which every epoch stays under [`BAD_LIMIT`].
pub fn recovered(bad: &[f64], jump_epoch: usize) -> Option<usize> {
    let last_bad = bad.iter().rposition(|&b| b >= BAD_LIMIT);
    match last_bad {
        None => Some(0),
        Some(i) if i + 1 < bad.len() => Some((i + 1).saturating_sub(jump_epoch)),
        Some(_) => None,
    }
}

pub fn run(o: &Options) -> Result<Report, String> {
    let fixed = simulate(o, false)?;
    let adapt = simulate(o, true)?;
    let jump_epoch = (o.jump_at_s / o.epoch_s).floor() as usize;
    let rows: Vec<EpochRow> = fixed
        .epochs
        .iter()
        .zip(&adapt.epochs)
        .map(|(f, a)| EpochRow {
            start_s: (a.start - Time::ZERO).as_secs_f64(),
            offered: a.offered,
            bad_fixed: f.bad_fraction(),
            bad_replan: a.bad_fraction(),
            machines_replan: a.machines.clone(),
            replanned: a.replanned,
            measured_fanout: a.measured_fanout.first().copied().flatten(),
            measured_ratio: a.measured_latency_ratio.get(1).copied().flatten(),
        })
        .collect();
    let bf: Vec<f64> = rows.iter().map(|r| r.bad_fixed).collect();
    let ba: Vec<f64> = rows.iter().map(|r| r.bad_replan).collect();
    Ok(Report {
        options: o.clone(),
        machines_fixed: fixed
            .epochs
            .first()
            .map(|e| e.machines.clone())
            .unwrap_or_default(),
        rows,
        jump_epoch,
        recovered_fixed: recovered(&bf, jump_epoch),
        recovered_replan: recovered(&ba, jump_epoch),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_counts_epochs_after_the_jump_until_bad_stays_low() {
        assert_eq!(recovered(&[0.0, 0.0, 0.5, 0.2, 0.0, 0.0], 2), Some(2));
        assert_eq!(recovered(&[0.0, 0.0, 0.5, 0.0, 0.0], 2), Some(1));
        assert_eq!(recovered(&[0.0, 0.0, 0.0], 1), Some(0));
        assert_eq!(recovered(&[0.0, 0.5, 0.0, 0.5], 1), None);
    }
}
