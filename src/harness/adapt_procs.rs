//! A fan-out jump with real processes on loopback (`fermata bench adapt
//! --processes`, tests/adapt_procs.rs): a scheduler with two sub-clusters and
//! a one-second epoch, an emulated one-GPU backend in each, one frontend, and
//! the load generator.
//!
//! The load is what the frontend submits for an application `detect` →
//! `classify` with a fan-out edge, next to a third model `other`: the frontend
//! runs an application's DAG and submits each module request as a task of its
//! model, so to the scheduler a fan-out of k is `classify` tasks at k times
//! `detect`'s rate. The load generator offers those per-model rates directly
//! (the emulated executor's outputs carry no items to count, so an ensemble
//! cannot be driven to a given fan-out on emulated backends). The fan-out starts
//! at 1 (`detect` 1 unit, `classify` 1, `other` 2: the start partition is
//! {other} | {detect, classify}) and jumps `jump`× at `jump_at_s`: `classify`'s
//! sub-cluster is then overloaded while the other has spare GPU time. The
//! scheduler's epoch loop re-partitions on the measured rates and moves
//! `detect` over live; no GPU is added. The report gives, per window of one
//! epoch, the requests sent in it and the share not answered within the SLO.

use super::loadgen::{self, LoadReport, LoadgenOpts};
use super::procs::{ProcCluster, ProcOpts};
use crate::core::Dur;
use crate::workload::Workload;
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The bad share a window must stay under once recovered.
pub const BAD_LIMIT: f64 = 0.01;

#[derive(Debug, Clone, Serialize)]
pub struct Options {
    /// Requests/s of one unit (`detect`'s rate; `other` runs at 2 units,
    /// `classify` at the fan-out times one unit).
    pub unit_rps: f64,
    /// The factor the fan-out jumps by, and when (s from the start of the load).
    pub jump: f64,
    pub jump_at_s: f64,
    /// The length of the run (s) and of the scheduler's epoch (s; also the
    /// report's window).
    pub duration_s: f64,
    pub epoch_s: f64,
    /// The models' emulated profile l(b) = alpha·b + beta (ms) and SLO (ms).
    pub alpha_ms: f64,
    pub beta_ms: f64,
    pub slo_ms: f64,
    /// Whether the epoch loop may move models (`--max-moves 1`; `false` runs
    /// the same cluster with `--max-moves 0`, the baseline).
    pub moves: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            unit_rps: 60.0,
            jump: 3.0,
            jump_at_s: 3.0,
            duration_s: 12.0,
            epoch_s: 1.0,
            alpha_ms: 4.0,
            beta_ms: 2.0,
            slo_ms: 200.0,
            moves: true,
        }
    }
}

impl Options {
    pub fn check(&self) -> Result<()> {
        let pos = |v: f64, what: &str| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(anyhow!("{what} must be positive"))
            }
        };
        pos(self.unit_rps, "the unit rate")?;
        pos(self.jump, "the jump")?;
        pos(self.epoch_s, "the epoch")?;
        pos(self.alpha_ms, "alpha")?;
        pos(self.slo_ms, "the SLO")?;
        if !(self.beta_ms >= 0.0 && self.beta_ms.is_finite()) {
            bail!("beta must be at least 0");
        }
        if !(self.jump_at_s >= 0.0 && self.jump_at_s < self.duration_s) {
            bail!("the jump must come within the run");
        }
        if self.duration_s / self.epoch_s > 600.0 || self.epoch_s < 0.2 {
            bail!("at most 600 windows of at least 0.2 s");
        }
        if self.unit_rps * (3.0 + self.jump) > 20_000.0 {
            bail!("at most 20000 requests/s in all");
        }
        Ok(())
    }

    /// The workload file: the three models, each at its share of the rate
    /// with fan-out `fanout`.
    fn workload(&self, fanout: f64) -> String {
        let mut s = format!(
            "name = \"adapt\"\ngpus = 2\narrival = \"poisson\"\nrate_rps = {}\n",
            self.unit_rps * (3.0 + fanout)
        );
        for (name, w) in [("detect", 1.0), ("classify", fanout), ("other", 2.0)] {
            s += &format!(
                "[[models]]\nname = \"{name}\"\nalpha_ms = {}\nbeta_ms = {}\nslo_ms = {}\ninput_bytes = 256\nweight = {w}\n",
                self.alpha_ms, self.beta_ms, self.slo_ms
            );
        }
        s
    }
}

/// One window of one epoch's length.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    pub start_s: f64,
    /// The fan-out offered in it.
    pub fanout: f64,
    pub offered: u64,
    /// Share of its requests not answered within the SLO (late, dropped,
    /// failed or unanswered).
    pub bad: f64,
    /// The same for `classify` alone.
    pub bad_classify: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub options: Options,
    pub windows: Vec<Window>,
    /// The scheduler's moves (`GET /v1/autoscale`, `moves`) at the end.
    pub moves: serde_json::Value,
    /// Each model's sub-cluster at the end.
    pub placement: Vec<(String, u64)>,
    /// Requests failed, unanswered or answered twice, over all windows.
    pub failed: u64,
    pub unanswered: u64,
    pub duplicates: u64,
    /// The first window starting at or after the jump from which every
    /// window stays under [`BAD_LIMIT`] (windows after the jump's), if any.
    pub recovered_after: Option<usize>,
    /// The scheduler's and backends' final reports.
    pub scheduler: Option<serde_json::Value>,
    pub backends: Vec<Option<serde_json::Value>>,
}

/// Runs the cluster of `exe` (the `fermata` binary) in a fresh folder under
/// the system's temporary folder.
pub fn run(exe: &Path, o: &Options) -> Result<Report> {
    o.check()?;
    let dir = std::env::temp_dir().join(format!(
        "fermata-adapt-{}-{}",
        std::process::id(),
        run_tag()
    ));
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let r = run_in(exe, o, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// A tag that tells apart two runs in one process.
fn run_tag() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| p.display().to_string())?;
    Ok(p)
}

fn run_in(exe: &Path, o: &Options, dir: &Path) -> Result<Report> {
    let start = write(dir, "start.toml", &o.workload(1.0))?;
    let w_before = Workload::from_file(&start)?;
    let w_after = Workload::from_file(&write(dir, "after.toml", &o.workload(o.jump))?)?;
    let epoch = format!("{}", o.epoch_s);
    let max_moves = if o.moves { "1" } else { "0" };
    let po = ProcOpts {
        backend_gpus: vec![1, 1],
        scheduler_args: [
            "--subclusters",
            "2",
            "--epoch-s",
            &epoch,
            "--max-moves",
            max_moves,
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec(),
        ..ProcOpts::new(start.clone())
    };
    let mut c = ProcCluster::start(exe, &po)?;
    let metrics = c.scheduler_metrics_addr()?;
    // One load generator per window, each started when its window begins
    // (they overlap only in their tails), so that a window's requests are
    // its own and no gap opens between windows.
    let n = (o.duration_s / o.epoch_s).round().max(1.0) as usize;
    let t0 = Instant::now();
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        let at = Duration::from_secs_f64(i as f64 * o.epoch_s);
        if let Some(wait) = at.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
        let start_s = i as f64 * o.epoch_s;
        let jumped = start_s >= o.jump_at_s;
        let w = if jumped { &w_after } else { &w_before };
        let fanout = if jumped { o.jump } else { 1.0 };
        let (tr, w) = (c.secret.transport()?, w.clone());
        let mut lo = LoadgenOpts::new(c.frontend_addrs.clone(), &w);
        lo.rate_rps = w.rate_rps;
        lo.warmup = Dur::ZERO;
        lo.duration = Dur::from_secs_f64(o.epoch_s);
        lo.seed = i as u64 + 1;
        let h = std::thread::spawn(move || loadgen::run(tr, &w, &lo));
        runs.push((start_s, fanout, h));
    }
    let mut windows = Vec::with_capacity(n);
    let (mut failed, mut unanswered, mut duplicates) = (0, 0, 0);
    for (start_s, fanout, h) in runs {
        let r: LoadReport = h
            .join()
            .map_err(|_| anyhow!("a load generator panicked"))??;
        failed += r.failed;
        unanswered += r.unanswered;
        duplicates += r.duplicates;
        let cls = r.sim.models.iter().find(|m| m.name == "classify");
        windows.push(Window {
            start_s,
            fanout,
            offered: r.sim.offered(),
            bad: r.sim.bad_rate(),
            bad_classify: cls.map(|m| m.bad_rate()).unwrap_or(0.0),
        });
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let view: serde_json::Value = serde_json::from_str(&crate::node::autoscaler::http_get(
        &rt,
        &metrics,
        "/v1/autoscale",
        Duration::from_secs(10),
    )?)?;
    let placement = view["models"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    (
                        m["model"].as_str().unwrap_or_default().to_string(),
                        m["subcluster"].as_u64().unwrap_or(u64::MAX),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let reps = c.stop();
    let first_after = windows
        .iter()
        .position(|w| w.start_s >= o.jump_at_s)
        .unwrap_or(windows.len());
    let recovered_after = (first_after..windows.len())
        .find(|&i| windows[i..].iter().all(|w| w.bad < BAD_LIMIT))
        .map(|i| i - first_after);
    Ok(Report {
        options: o.clone(),
        windows,
        moves: view["moves"].clone(),
        placement,
        failed,
        unanswered,
        duplicates,
        recovered_after,
        scheduler: reps.scheduler,
        backends: reps.backends,
    })
}
