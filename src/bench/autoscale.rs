//! `fermata bench autoscale`: flat-top with real processes on loopback. A
//! scheduler and a frontend start with `fermata autoscale` keeping `start`
//! emulated-GPU backends; then the load jumps to FACTOR × the capacity of those
//! GPUs (the simulator's goodput for the same workload and GPU count) and the
//! loop adds what the advice says. Reported per segment of the load: the bad
//! rate clients saw and the backends in service; and how long after the jump
//! the bad rate fell under 1% for good.

use crate::bench::{goodput_search, SearchOptions};
use crate::harness::procs::{ProcCluster, ProcOpts};
use crate::sim::RunOptions;
use crate::workload::Workload;
use anyhow::Result;
use serde::Serialize;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bench's workload: one model of 210 r/s per emulated GPU (batches of up
/// to 10 in about 48 ms; SLO 100 ms), light enough for the load generator and
/// the processes to share two cores.
pub const WORKLOAD: &str = "name = \"autoscale\"\ngpus = 1\nrate_rps = 100\n[[models]]\nname = \"m\"\nalpha_ms = 4.0\nbeta_ms = 8.0\nslo_ms = 100\ninput_bytes = 256\n";

#[derive(Debug, Clone)]
pub struct AutoscaleBenchOpts {
    /// Backends (of one GPU) at the start: the autoscaler's lower bound.
    pub start: u32,
    pub max: u32,
    /// The load after the jump, as a multiple of the start's capacity.
    pub factor: f64,
    /// Seconds of load after the jump, and the length of one segment.
    pub secs: f64,
    pub segment_s: f64,
    /// The scheduler's advice on the load's demand at this utilization (0:
    /// the paper's rule; `fermata scheduler --autoscale-target-utilization`).
    pub target_utilization: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Segment {
    pub t_s: f64,
    pub offered: u64,
    pub bad_rate: f64,
    pub unanswered: u64,
    /// Backends in service at the segment's end (the autoscaler's last step).
    pub backends: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct AutoscaleBenchReport {
    /// The simulator's goodput of `start` GPUs for the workload (r/s).
    pub capacity_rps: f64,
    pub offered_rps: f64,
    pub segments: Vec<Segment>,
    /// Seconds after the jump until the first segment from which on every
    /// segment's bad rate is < 1% (None: never).
    pub recovered_after_s: Option<f64>,
    /// The autoscaler's launches and drains: (t since the jump, decision).
    pub decisions: Vec<(f64, String)>,
    pub final_backends: u32,
    /// The simulator's goodput of the final backends' GPUs (r/s).
    pub final_capacity_rps: f64,
}

fn capacity(w: &Workload, gpus: u32) -> f64 {
    let mut w = w.clone();
    w.gpus = gpus;
    let o = RunOptions::from_workload(&w);
    goodput_search(&w, &o, &SearchOptions::default()).goodput_rps
}

pub fn run(exe: &Path, dir: &Path, o: &AutoscaleBenchOpts) -> Result<AutoscaleBenchReport> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("w.toml");
    std::fs::write(&path, WORKLOAD)?;
    let w = Workload::from_file(&path)?;
    let cap = capacity(&w, o.start);
    let offered = cap * o.factor;
    let po = ProcOpts {
        backend_gpus: vec![],
        scheduler_args: vec![
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
            "--autoscale-target-utilization".into(),
            o.target_utilization.to_string(),
        ],
        ..ProcOpts::new(path.clone())
    };
    let mut c = ProcCluster::start(exe, &po)?;
    let metrics = c.scheduler_metrics_addr()?;
    let args: Vec<String> = [
        "--min-backends",
        &o.start.to_string(),
        "--max-backends",
        &o.max.to_string(),
        "--up-cooldown-s",
        "3",
        "--down-cooldown-s",
        "60",
        "--provisioning-s",
        "10",
        "--interval-s",
        "0.5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut a = c.spawn_autoscale(exe, &metrics, &args)?;
    // The autoscaler's steps, read on a thread: the last one and the actions.
    let last = Arc::new(Mutex::new(None::<serde_json::Value>));
    let log = Arc::new(Mutex::new(Vec::<(Instant, String)>::new()));
    let t_wait = Instant::now();
    loop {
        let l = a.wait_for("a step", Duration::from_secs(20), |l| {
            l.starts_with('{').then(|| l.to_string())
        })?;
        let v: serde_json::Value = serde_json::from_str(&l)?;
        if v["backends"].as_u64() == Some(o.start as u64) {
            break;
        }
        anyhow::ensure!(
            t_wait.elapsed() < Duration::from_secs(30),
            "the first backends did not come up"
        );
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (last, log, stop) = (last.clone(), log.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                if let Ok(l) = a.wait_for("a step", Duration::from_millis(500), |l| {
                    l.starts_with('{').then(|| l.to_string())
                }) {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                        let d = v["decision"].as_str().unwrap_or("").to_string();
                        if d.starts_with("launch") || d.starts_with("drain") {
                            log.lock().unwrap().push((Instant::now(), d));
                        }
                        *last.lock().unwrap() = Some(v);
                    }
                }
            }
            a
        })
    };
    let t0 = Instant::now();
    let mut segments = Vec::new();
    let n = (o.secs / o.segment_s).ceil() as usize;
    for _ in 0..n {
        let r = c
            .load_in_background(&w, offered, o.segment_s)?
            .join()
            .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
        let backends = last
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|v| v["backends"].as_u64())
            .unwrap_or(0) as u32;
        segments.push(Segment {
            t_s: t0.elapsed().as_secs_f64(),
            offered: r.sim.offered(),
            bad_rate: r.sim.bad_rate(),
            unanswered: r.unanswered,
            backends,
        });
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let a = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the step reader panicked"))?;
    let _ = a.stop(Duration::from_secs(40));
    let _ = c.stop();
    let recovered_after_s = (0..segments.len())
        .find(|&i| segments[i..].iter().all(|s| s.bad_rate < 0.01))
        .map(|i| if i == 0 { 0.0 } else { segments[i - 1].t_s });
    let final_backends = segments.last().map_or(0, |s| s.backends);
    let decisions = log
        .lock()
        .unwrap()
        .iter()
        .map(|(t, d)| (t.saturating_duration_since(t0).as_secs_f64(), d.clone()))
        .collect();
    Ok(AutoscaleBenchReport {
        capacity_rps: cap,
        offered_rps: offered,
        segments,
        recovered_after_s,
        decisions,
        final_backends,
        final_capacity_rps: capacity(&w, final_backends.max(1)),
    })
}
