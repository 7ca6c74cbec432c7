//! `fermata bench failover`: a hot standby taking over, measured with real
//! processes on loopback. A scheduler, its standby, one backend and one
//! frontend (given both scheduler addresses) serve a light load; the primary
//! is killed (`SIGKILL`) and the time until both nodes are back in service
//! through the standby is the failover time. The killed scheduler is started
//! again on its address as the standby of the new primary, and the next kill
//! takes the new primary: `kills` times. Every request of the load must end
//! exactly once; the report counts those never answered.

use super::procs::{Proc, ProcCluster, ProcOpts};
use crate::workload::Workload;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::{Duration, Instant};

/// What a failover run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FailoverReport {
    pub kills: u32,
    /// Per kill: from the `SIGKILL` until both nodes were back in service (ms).
    pub failover_ms: Vec<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Requests the load generator sent over the whole run, and how they ended.
    pub sent: u64,
    pub good: u64,
    pub failed: u64,
    /// Requests never answered (lost): must be 0.
    pub unanswered: u64,
    pub duplicates: u64,
    /// Requests pending at a killed primary that the frontend held and
    /// submitted to the standby (from the frontend's report).
    pub retried: u64,
}

/// Nearest-rank quantile of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Waits for `p`'s line starting with `what`.
fn wait_line(p: &mut Proc, what: &str, t: Duration) -> Result<String> {
    p.wait_for(what, t, |l| l.starts_with(what).then(|| l.to_string()))
}

/// Runs `kills` failovers under `rate` requests per second with `exe` (the
/// `fermata` binary); `dir` holds the workload file.
pub fn run(exe: &Path, dir: &Path, kills: u32, rate: f64) -> Result<FailoverReport> {
    if kills == 0 {
        bail!("--kills must be at least 1");
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join("failover.toml");
    std::fs::write(&path, super::procs::small_workload("failover", 2))?;
    let w = Workload::from_file(&path)?;
    let o = ProcOpts {
        backend_gpus: vec![2],
        standby: true,
        ..ProcOpts::new(path)
    };
    let mut c = ProcCluster::start(exe, &o)?;
    let mut primary_addr = c.scheduler_addr.clone();
    let mut standby_addr = c.standby_addr.clone().context("no standby")?;
    let t = Duration::from_secs(10);
    let mut times = Vec::new();
    let (mut sent, mut good, mut failed, mut unanswered, mut duplicates) = (0, 0, 0, 0, 0);
    for k in 1..=kills {
        // A load run across the kill: 0.5 s before, 1.5 s after.
        let load = c.load_in_background(&w, rate, 2.0)?;
        std::thread::sleep(Duration::from_millis(500));
        let killed = Instant::now();
        c.scheduler.signal(libc::SIGKILL);
        let _ = c.scheduler.child.wait();
        let mut sb = c.standby.take().context("no standby")?;
        wait_line(&mut sb, "fermata scheduler took over", t)?;
        let rejoin = format!("back in service (rejoin {k})");
        for p in [&mut c.backends[0], &mut c.frontends[0]] {
            p.wait_for(&rejoin, t, |l| l.ends_with(&rejoin).then(|| l.to_string()))?;
        }
        times.push(killed.elapsed().as_secs_f64() * 1e3);
        let r = load
            .join()
            .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
        sent += r.sent;
        good += r.sim.good();
        failed += r.failed;
        unanswered += r.unanswered;
        duplicates += r.duplicates;
        // The standby is the primary now; the killed one comes back on its
        // address as the new standby.
        let (p, a) = c.spawn_standby_at(exe, &standby_addr, &primary_addr, false)?;
        std::mem::swap(&mut primary_addr, &mut standby_addr);
        debug_assert_eq!(a, standby_addr);
        c.scheduler = sb;
        c.scheduler_addr = primary_addr.clone();
        c.standby = Some(p);
        c.standby_addr = Some(a);
    }
    let reps = c.stop();
    let retried = reps
        .frontends
        .first()
        .and_then(|f| f.as_ref())
        .and_then(|f| f["retried"].as_u64())
        .unwrap_or(0);
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(FailoverReport {
        kills,
        p50_ms: quantile(&sorted, 0.5),
        p99_ms: quantile(&sorted, 0.99),
        max_ms: sorted.last().copied().unwrap_or(f64::NAN),
        failover_ms: times,
        sent,
        good,
        failed,
        unanswered,
        duplicates,
        retried,
    })
}
