//! `fermata bench lanes`: what concurrent lanes save, predicted and measured.
//!
//! An application of two modules in a chain (`detect` → `classify`, fan-out 1)
//! on one emulated GPU type whose profile gains from running batches at once:
//! d(b, e) = f(e) · (alpha · b + beta) with f = [1, 1.3, 1.6, 2.0] for e = 1..4,
//! so one machine's throughput at a batch size grows by e / f(e): 1.54x at
//! e = 2, 1.88x at e = 3, 2x at e = 4. For each rate and each lane count e, the
//! `fermata` planner plans with the profiles of e lanes only; the predicted
//! cost is its machines rounded up per allocation line, and the measured cost
//! is the cheapest machine counts at which the simulator (the production
//! dispatcher, deferred, slack forwarding; each machine seen as e lanes of
//! d(b, e)) keeps 99% of the requests within the SLO, searched from the plan
//! (see [`super::apps::search`]). The planner free to pick e per module is
//! shown too, and the saving of the best e over e = 1.

use super::apps::{search, setups, Found, Options};
use crate::plan::app::{file, planners, App};
use serde::Serialize;

/// The latency factors f(e) of the emulated GPU, e = 1, 2, 3, 4.
pub const FACTORS: [f64; 4] = [1.0, 1.3, 1.6, 2.0];

/// The application at `rate_rps` (requests/s into `detect`).
pub fn app(rate_rps: f64) -> Result<App, String> {
    detect_classify("lanes", rate_rps, 1.0, Some(&FACTORS))
}

/// `detect` (l(b) = 1 ms·b + 8 ms) → `classify` (0.5 ms·b + 4 ms), batches up
/// to 32, fan-out `fanout`, SLO 200 ms, at `rate_rps` into `detect`, on one
/// emulated GPU type (price 1.0); `factors`: its concurrency factors f(e)
/// (`None`: one batch at a time per machine).
pub fn detect_classify(
    name: &str,
    rate_rps: f64,
    fanout: f64,
    factors: Option<&[f64]>,
) -> Result<App, String> {
    let conc = factors.map_or(String::new(), |f| {
        let f: Vec<String> = f.iter().map(|x| x.to_string()).collect();
        format!("concurrency_factors = [{}]\n", f.join(", "))
    });
    file::parse(&format!(
        r#"
name = "{name}"
slo_ms = 200
ingress_rps = {rate_rps}

[[hardware]]
name = "emu"
kind = "gpu"
price = 1.0

[[modules]]
name = "detect"
[[modules.profiles]]
hardware = "emu"
alpha_ms = 1.0
beta_ms = 8.0
max_batch = 32
{conc}
[[modules]]
name = "classify"
[[modules.profiles]]
hardware = "emu"
alpha_ms = 0.5
beta_ms = 4.0
max_batch = 32
{conc}
[[edges]]
from = "detect"
to = "classify"
fanout = {fanout}
"#
    ))
}

/// `app` with only the configurations of `e` lanes (`None`: all).
fn with_lanes(app: &App, e: Option<u32>) -> App {
    let mut a = app.clone();
    if let Some(e) = e {
        for m in &mut a.modules {
            m.configs.retain(|c| c.concurrency == e);
        }
    }
    a
}

/// One rate and lane choice.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub rate_rps: f64,
    /// The lanes the planner was given (`None`: free to choose per module).
    pub lanes: Option<u32>,
    /// The lanes its plan uses, per module.
    pub planned_lanes: Vec<u32>,
    /// The plan's cost with partial machines (price x fraction) and with its
    /// lines rounded up.
    pub predicted_cost: f64,
    pub predicted_whole: f64,
    /// The cheapest cost the simulator serves it at (`None`: not found within
    /// the simulation budget).
    pub measured_cost: Option<f64>,
    pub predicted_worst_s: f64,
    /// The simulated p99 at the plan's machines (s).
    pub p99_at_plan_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub factors: Vec<f64>,
    pub rows: Vec<Row>,
}

fn row(app: &App, rate: f64, lanes: Option<u32>, o: &Options) -> Result<Row, String> {
    let a = with_lanes(app, lanes);
    let mut never = || false;
    let plan = planners::run(&a, "fermata", &mut never)?;
    plan.verify(&a)?;
    let setup = setups()[0];
    let f: Found = search(&a, &plan, &setup, o, o.seed)?;
    Ok(Row {
        rate_rps: rate,
        lanes,
        planned_lanes: plan
            .modules
            .iter()
            .map(|m| {
                m.allocs
                    .iter()
                    .map(|x| x.config.concurrency)
                    .max()
                    .unwrap_or(0)
            })
            .collect(),
        predicted_cost: plan.cost,
        predicted_whole: f.plan_cost,
        measured_cost: f.cost,
        predicted_worst_s: f.predicted_worst_s,
        p99_at_plan_s: f.at_plan.p99_s,
    })
}

/// Every rate with e = 1..4 and with the planner free to choose.
pub fn run(rates: &[f64], o: &Options) -> Result<Report, String> {
    let mut rows = Vec::new();
    for &r in rates {
        let a = app(r)?;
        for lanes in (1..=FACTORS.len() as u32).map(Some).chain([None]) {
            rows.push(row(&a, r, lanes, o)?);
        }
    }
    Ok(Report {
        factors: FACTORS.to_vec(),
        rows,
    })
}

/// Per rate: the measured cost at e = 1, the best fixed e and its measured
/// cost, and best / (e = 1).
pub fn best_over_one(r: &Report) -> Vec<(f64, f64, u32, f64)> {
    let mut out = Vec::new();
    let mut rates: Vec<f64> = r.rows.iter().map(|x| x.rate_rps).collect();
    rates.dedup();
    for rate in rates {
        let fixed: Vec<&Row> = r
            .rows
            .iter()
            .filter(|x| x.rate_rps == rate && x.lanes.is_some())
            .collect();
        let one = fixed
            .iter()
            .find(|x| x.lanes == Some(1))
            .and_then(|x| x.measured_cost);
        let best = fixed
            .iter()
            .filter_map(|x| Some((x.lanes?, x.measured_cost?)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        if let (Some(one), Some((e, c))) = (one, best) {
            out.push((rate, one, e, c));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_app_has_every_lane_count_and_the_planner_uses_them() {
        let a = app(400.0).unwrap();
        for m in &a.modules {
            for e in 1..=4 {
                assert!(m.configs.iter().any(|c| c.concurrency == e), "{e}");
            }
        }
        // Restricted to e lanes, every plan runs e lanes.
        for e in 1..=4 {
            let r = with_lanes(&a, Some(e));
            let p = planners::run(&r, "fermata", &mut || false).unwrap();
            p.verify(&r).unwrap();
            assert!(p
                .modules
                .iter()
                .all(|m| m.allocs.iter().all(|x| x.config.concurrency == e)));
        }
        // A profile that gains from lanes makes e = 4 cheaper than e = 1 to
        // plan at a rate of many machines.
        let big = app(4000.0).unwrap();
        let cost = |e| {
            let r = with_lanes(&big, Some(e));
            planners::run(&r, "fermata", &mut || false).unwrap().cost
        };
        assert!(cost(4) < 0.8 * cost(1), "{} vs {}", cost(4), cost(1));
    }
}
