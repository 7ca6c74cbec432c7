//! `fermata bench fig15`: the autoscaling loop in the simulator (Symphony
//! Fig. 15). 24 models of the paper's A100 profiles, each at its SLO, Zipf
//! popularity, Poisson arrivals; the aggregate rate follows a trace that rises
//! and falls; the loop starts with one GPU and may use up to `max_gpus`.
//! Reported per epoch: offered load, GPUs in the core, the fewest GPUs that load
//! needs, and the bad rate.

use crate::bench::{goodput_search, SearchOptions};
use crate::core::Dur;
use crate::plan::autoscale::{AdviceConfig, ControllerConfig};
use crate::sim::{simulate_autoscaled, AutoscaleSimOpts, EpochRecord, RunOptions};
use crate::workload::Workload;
use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The 24 models: every A100 profile of the paper's table but the largest
/// (by α) ones, in name order.
pub fn workload(gpus: u32) -> Result<Workload> {
    let rows = crate::workload::parse_profiles_csv(crate::workload::PAPER_PROFILES_CSV)?;
    let mut rows: Vec<_> = rows.into_iter().filter(|r| r.gpu == "a100").collect();
    rows.sort_by(|a, b| a.alpha_ms.total_cmp(&b.alpha_ms));
    rows.truncate(24);
    rows.sort_by(|a, b| a.model.cmp(&b.model));
    let mut text = format!(
        "name = \"fig15_24models\"\ngpus = {gpus}\narrival = \"poisson\"\npopularity = \"zipf:0.9\"\nrate_rps = 1000\nwarmup_s = 0\n"
    );
    for r in &rows {
        text.push_str(&format!("[[models]]\nprofile = \"a100/{}\"\n", r.model));
    }
    Workload::from_toml(&text, None)
}

/// A rate trace that rises and falls: `secs` seconds in steps of `step_s`, the
/// multiplier going from `low` up to 1 (at 40% of the run) and down to `low`
/// again along a raised cosine, each step times 1 ± `noise` (uniform), seeded.
pub fn generate_trace(secs: f64, step_s: f64, low: f64, noise: f64, seed: u64) -> Vec<(f64, f64)> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let n = (secs / step_s).ceil() as usize;
    (0..n)
        .map(|i| {
            let t = i as f64 * step_s;
            let x = t / secs;
            // Up over [0, 0.4], down over [0.4, 1].
            let phase = if x < 0.4 {
                x / 0.4
            } else {
                1.0 - (x - 0.4) / 0.6
            };
            let shape = 0.5 - 0.5 * (std::f64::consts::PI * phase).cos();
            let m = low + (1.0 - low) * shape;
            let m = m * (1.0 + rng.gen_range(-noise..=noise));
            (t, (m * 1000.0).round() / 1000.0)
        })
        .collect()
}

/// Reads a trace CSV (`t_s,multiplier` per line, a header allowed).
pub fn parse_trace(text: &str) -> Result<Vec<(f64, f64)>> {
    let mut v: Vec<(f64, f64)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || (i == 0 && line.starts_with('t')) {
            continue;
        }
        let (a, b) = line
            .split_once(',')
            .with_context(|| format!("trace line {}: want t_s,multiplier", i + 1))?;
        let t: f64 = a
            .trim()
            .parse()
            .with_context(|| format!("trace line {}: t_s", i + 1))?;
        let m: f64 = b
            .trim()
            .parse()
            .with_context(|| format!("trace line {}: multiplier", i + 1))?;
        if !(t.is_finite() && t >= 0.0 && m.is_finite() && (0.0..=100.0).contains(&m)) {
            bail!(
                "trace line {}: t_s >= 0 and a multiplier in [0, 100]",
                i + 1
            );
        }
        if v.last().is_some_and(|l| l.0 >= t) {
            bail!("trace line {}: times must increase", i + 1);
        }
        v.push((t, m));
    }
    if v.is_empty() {
        bail!("the trace is empty");
    }
    Ok(v)
}

/// The trace as CSV.
pub fn trace_csv(trace: &[(f64, f64)]) -> String {
    let mut s = String::from("t_s,multiplier\n");
    for (t, m) in trace {
        s.push_str(&format!("{t},{m}\n"));
    }
    s
}

#[derive(Debug, Clone)]
pub struct Fig15Opts {
    pub max_gpus: u32,
    /// GPUs at the start (the loop's lower bound stays 1).
    pub start_gpus: u32,
    /// The trace's peak as a fraction of the simulated capacity of `max_gpus`.
    pub peak_load: f64,
    pub trace: Vec<(f64, f64)>,
    pub epoch_s: f64,
    /// How often the loop decides (s).
    pub interval_s: f64,
    pub provisioning_s: f64,
    /// After a scaling step, the next release waits this long (s).
    pub down_cooldown_s: f64,
    pub seed: u64,
    pub advice: AdviceConfig,
}

#[derive(Debug, Clone, Serialize)]
pub struct Fig15Row {
    #[serde(flatten)]
    pub epoch: EpochRecord,
    /// The fewest GPUs the epoch's offered load needs (the simulated capacity
    /// curve, interpolated).
    pub min_gpus: u32,
    pub bad_rate: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Fig15Report {
    pub max_gpus: u32,
    /// Goodput of one GPU for the mix, as measured at `max_gpus` GPUs.
    pub per_gpu_rps: f64,
    /// The simulated goodput of the mix on n GPUs: (n, r/s).
    pub capacity: Vec<(u32, f64)>,
    pub peak_rps: f64,
    pub rows: Vec<Fig15Row>,
    /// After the cold start (the first minute: the loop starts on
    /// `start_gpus`), the epochs whose offered load the cluster could carry
    /// (under the capacity of `max_gpus`), and of those the ones with a bad
    /// rate under 1%.
    pub under_capacity_epochs: usize,
    pub under_capacity_good_epochs: usize,
    /// After the first minute, the epochs whose GPUs in use (time-averaged
    /// over the epoch) were at most 1.15 × the fewest needed.
    pub within_15pct_epochs: usize,
    /// The same for the most GPUs in use at any moment of the epoch.
    pub within_15pct_max_epochs: usize,
    pub counted_epochs: usize,
    pub gpu_seconds: f64,
    pub min_gpu_seconds: f64,
}

/// The simulated goodput of the mix on n GPUs, for n = 1, 2, 4, ... up to
/// `max` (and `max` itself): (n, r/s).
pub fn capacity_curve(max: u32) -> Result<Vec<(u32, f64)>> {
    let mut ns: Vec<u32> = std::iter::successors(Some(1u32), |n| n.checked_mul(2))
        .take_while(|&n| n < max)
        .collect();
    ns.push(max);
    ns.iter()
        .map(|&n| {
            let w = workload(n)?;
            let mut so = RunOptions::from_workload(&w);
            so.duration = Dur::from_secs_f64(10.0);
            so.warmup = Dur::from_secs_f64(2.0);
            let search = SearchOptions {
                rel_tolerance: 0.01,
                ..SearchOptions::default()
            };
            Ok((n, goodput_search(&w, &so, &search).goodput_rps))
        })
        .collect()
}

/// The fewest GPUs whose (interpolated) capacity carries `rate`.
pub fn fewest_gpus(curve: &[(u32, f64)], rate: f64) -> u32 {
    let mut prev = (0u32, 0.0f64);
    for &(n, c) in curve {
        if c >= rate {
            // Linear between the two sizes around it.
            let f = if c > prev.1 {
                (rate - prev.1) / (c - prev.1)
            } else {
                1.0
            };
            return ((prev.0 as f64 + f * (n - prev.0) as f64).ceil() as u32).max(1);
        }
        prev = (n, c);
    }
    let (n, c) = *curve.last().expect("a curve");
    ((rate / (c / n as f64)).ceil() as u32).max(1)
}

/// The figures leave out the epochs that end in the first minute: the loop
/// starts on `start_gpus` (one by default) whatever the load.
pub const COLD_START_S: f64 = 60.0;

pub fn run(o: &Fig15Opts) -> Result<Fig15Report> {
    let curve = capacity_curve(o.max_gpus)?;
    let (_, cmax) = *curve.last().expect("a curve");
    let w = workload(o.max_gpus)?;
    if cmax <= 0.0 {
        bail!("no goodput for the mix at {} GPUs", o.max_gpus);
    }
    let per_gpu = cmax / o.max_gpus as f64;
    let peak = cmax * o.peak_load;
    let secs = o.trace.last().map_or(0.0, |t| t.0) + o.epoch_s;
    let mut opt = RunOptions::from_workload(&w);
    opt.rate_rps = peak;
    opt.seed = o.seed;
    opt.warmup = Dur::ZERO;
    opt.duration = Dur::from_secs_f64(secs);
    // Checking every event at this scale costs more than it tells.
    opt.check = false;
    let a = AutoscaleSimOpts {
        start_gpus: o.start_gpus.clamp(1, o.max_gpus),
        controller: ControllerConfig {
            gpus_per_backend: 1,
            min_backends: 1,
            max_backends: o.max_gpus,
            up_cooldown_s: o.interval_s,
            down_cooldown_s: o.down_cooldown_s,
            provisioning_s: o.provisioning_s + o.interval_s,
        },
        advice: o.advice,
        epoch: Dur::from_secs_f64(o.epoch_s),
        interval: Dur::from_secs_f64(o.interval_s),
        provisioning: Dur::from_secs_f64(o.provisioning_s),
        trace: o
            .trace
            .iter()
            .map(|&(t, m)| (Dur::from_secs_f64(t), m))
            .collect(),
    };
    let epochs = simulate_autoscaled(&w, &opt, &a);
    let rows: Vec<Fig15Row> = epochs
        .into_iter()
        .map(|e| Fig15Row {
            min_gpus: fewest_gpus(&curve, e.offered_rps),
            bad_rate: if e.ended == 0 {
                0.0
            } else {
                e.bad as f64 / e.ended as f64
            },
            epoch: e,
        })
        .collect();
    let counted: Vec<&Fig15Row> = rows.iter().filter(|r| r.epoch.t_s > COLD_START_S).collect();
    let under: Vec<&&Fig15Row> = counted
        .iter()
        .filter(|r| r.epoch.offered_rps <= cmax)
        .collect();
    Ok(Fig15Report {
        max_gpus: o.max_gpus,
        per_gpu_rps: per_gpu,
        capacity: curve.clone(),
        peak_rps: peak,
        under_capacity_epochs: under.len(),
        under_capacity_good_epochs: under.iter().filter(|r| r.bad_rate < 0.01).count(),
        within_15pct_epochs: counted
            .iter()
            .filter(|r| r.epoch.gpus_mean <= 1.15 * r.min_gpus as f64)
            .count(),
        within_15pct_max_epochs: counted
            .iter()
            .filter(|r| r.epoch.gpus_max as f64 <= 1.15 * r.min_gpus as f64)
            .count(),
        counted_epochs: counted.len(),
        gpu_seconds: rows.iter().map(|r| r.epoch.gpus_mean * o.epoch_s).sum(),
        min_gpu_seconds: rows.iter().map(|r| r.min_gpus as f64 * o.epoch_s).sum(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_rises_and_falls_and_round_trips() {
        let t = generate_trace(600.0, 10.0, 0.2, 0.0, 1);
        assert_eq!(t.len(), 60);
        assert!((t[0].1 - 0.2).abs() < 1e-9);
        let peak = t
            .iter()
            .cloned()
            .fold((0.0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
        assert!(
            (peak.1 - 1.0).abs() < 1e-9 && (peak.0 - 240.0).abs() < 1e-9,
            "{peak:?}"
        );
        assert_eq!(parse_trace(&trace_csv(&t)).unwrap(), t);
        assert!(parse_trace("t_s,multiplier\n5,1\n4,1\n").is_err());
        assert!(parse_trace("0,-1\n").is_err());
        assert_eq!(workload(4).unwrap().models.len(), 24);
    }

    /// The demand rule with the loop deciding every second (as `fermata
    /// autoscale` does): GPUs track the load closely on the way up and down.
    #[test]
    fn the_demand_rule_tracks_the_load() {
        let r = run(&Fig15Opts {
            max_gpus: 16,
            start_gpus: 1,
            peak_load: 0.8,
            trace: generate_trace(240.0, 10.0, 0.2, 0.05, 1),
            epoch_s: 10.0,
            interval_s: 1.0,
            provisioning_s: 5.0,
            down_cooldown_s: 5.0,
            seed: 1,
            advice: AdviceConfig {
                target_utilization: 0.9,
                lookahead_s: 8.5,
                ..AdviceConfig::default()
            },
        })
        .unwrap();
        let rows: Vec<&Fig15Row> = r
            .rows
            .iter()
            .filter(|x| x.epoch.t_s > COLD_START_S)
            .collect();
        for x in &rows {
            let (gpus, min) = (x.epoch.gpus_mean, x.min_gpus as f64);
            assert!(x.bad_rate < 0.01, "{x:?}");
            assert!(gpus <= 1.35 * min, "{gpus} GPUs for {min}: {x:?}");
        }
        let peak = rows.iter().map(|x| x.epoch.gpus_mean).fold(0.0, f64::max);
        assert!(
            rows.last().unwrap().epoch.gpus_mean < 0.7 * peak,
            "{rows:?}"
        );
    }

    /// The loop in virtual time: GPUs follow the load up and down within the
    /// bounds (every request ending exactly once is asserted by the run).
    #[test]
    fn the_loop_follows_the_load_within_its_bounds() {
        let r = run(&Fig15Opts {
            max_gpus: 8,
            start_gpus: 1,
            peak_load: 0.8,
            trace: generate_trace(200.0, 10.0, 0.1, 0.05, 1),
            epoch_s: 10.0,
            interval_s: 10.0,
            provisioning_s: 5.0,
            down_cooldown_s: 20.0,
            seed: 1,
            advice: AdviceConfig {
                idle_threshold: 0.15,
                ..AdviceConfig::default()
            },
        })
        .unwrap();
        let gpus: Vec<u32> = r.rows.iter().map(|x| x.epoch.gpus).collect();
        let peak = *gpus.iter().max().unwrap();
        assert!(peak <= 8, "{gpus:?}");
        assert!(peak >= 4, "scaled out with the load: {gpus:?}");
        assert!(
            *gpus.last().unwrap() < peak,
            "scaled in when it fell: {gpus:?}"
        );
        assert!(r
            .rows
            .iter()
            .any(|x| x.epoch.decision.starts_with("release")));
    }
}
