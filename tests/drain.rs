//! Drain and leave, with real processes on loopback: a backend told to leave
//! (SIGTERM) under load stops getting plans, finishes the ones it has and
//! unregisters; no request fails for it, and the other backend serves on.
//!
//! On a starved machine (2 shared cores under other builds) some inputs can
//! miss their pull deadline, the latest start of their batch: those tasks end
//! as failed (`InputMissing`, counted by the backend as a pull timeout) on
//! either backend, drain or not, and requests end late or dropped. So what
//! the test holds the drain to is that no request fails for any other reason:
//! none lost with its backend, none of the draining backend's plans void or
//! failed, every request answered once, and the other backend serving after.

use fermata::harness::loadgen::{self, LoadReport, LoadgenOpts};
use fermata::harness::procs::{small_workload, ProcCluster, ProcOpts};
use fermata::workload::Workload;
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

fn count(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing from {v}"))
}

/// `w` at `rate` for `secs` through the cluster's frontends.
fn load(c: &ProcCluster, w: &Workload, rate: f64, secs: f64) -> LoadReport {
    let mut lo = LoadgenOpts::new(c.frontend_addrs.clone(), w);
    lo.rate_rps = rate;
    lo.warmup = fermata::core::Dur::ZERO;
    lo.duration = fermata::core::Dur::from_secs_f64(secs);
    loadgen::run(c.secret.transport().unwrap(), w, &lo).unwrap()
}

/// One run: a cluster of two one-GPU backends under 400 r/s, backend0
/// (the lowest GPU id, which deferred scheduling fills first) told to leave
/// 1.5 s in. None when backend0 ran no plan before it left (a pull cost
/// measured on a starved machine can keep the scheduler off it): the run
/// tested nothing, and is made again.
fn drain_once(dir: &std::path::Path) -> Option<()> {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("w.toml");
    std::fs::write(&path, small_workload("drain", 2)).unwrap();
    let w = Workload::from_file(&path).unwrap();
    let o = ProcOpts {
        backend_gpus: vec![1, 1],
        ..ProcOpts::new(path.clone())
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    let load_bg = c.load_in_background(&w, 400.0, 4.0).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut b0 = c.backends.remove(0);
    let t_term = Instant::now();
    b0.signal(libc::SIGTERM);
    b0.wait_for("drained", Duration::from_secs(10), |l| {
        (l == "fermata backend drained").then(|| l.to_string())
    })
    .expect("backend0 drains");
    let report = b0
        .wait_for("its report", Duration::from_secs(10), |l| {
            l.starts_with('{').then(|| l.to_string())
        })
        .unwrap();
    let drain_s = t_term.elapsed().as_secs_f64();
    let rep0: Value = serde_json::from_str(&report).unwrap();
    for k in [
        "tasks_failed",
        "plans_failed",
        "plans_void",
        "plans_refused",
    ] {
        assert_eq!(count(&rep0, k), 0, "{k}: {rep0}");
    }
    let r = load_bg.join().unwrap().unwrap();
    assert_eq!(r.unanswered, 0, "every request answered");
    assert_eq!(r.duplicates, 0);
    assert_eq!(r.answered, r.sent);
    if count(&rep0, "plans_run") == 0 {
        eprintln!("backend0 ran no plan before it left; again: {rep0}");
        c.stop();
        return None;
    }

    // The other backend serves on (a run after the drain; on a starved
    // machine a short one may end all late, so up to three).
    let mut after = None;
    for _ in 0..3 {
        let a = load(&c, &w, 100.0, 1.5);
        assert_eq!(a.unanswered, 0);
        assert_eq!(a.duplicates, 0);
        let served = a.sim.good() > 0;
        after = Some(a);
        if served {
            break;
        }
    }
    let after = after.unwrap();
    assert!(after.sim.good() > 0, "backend1 serves after backend0 left");

    let reps = c.stop();
    let s = reps.scheduler.expect("scheduler report");
    // backend1 drained too when the cluster stopped (SIGTERM).
    assert_eq!(s["backends_drained"], 2, "{s}");
    assert_eq!(s["backends_left"], 2, "{s}");
    assert_eq!(s["backends_lost"], 0, "{s}");
    assert_eq!(s["tasks_failed_backend_lost"], 0, "{s}");
    let rep1 = reps.backends[0].as_ref().expect("backend1's report");
    assert_eq!(count(rep1, "tasks_failed"), 0, "{rep1}");
    // No request failed: an input not read in error or found gone, and one that
    // missed its pull deadline (a starved machine) is dropped too late, not
    // failed.
    let mut timeouts = 0;
    for b in [&rep0, rep1] {
        assert_eq!(count(b, "inputs_missing_stale"), 0, "{b}");
        assert_eq!(count(b, "inputs_missing_error"), 0, "{b}");
        timeouts += count(b, "inputs_missing_timeout");
    }
    let f = reps.frontends[0].as_ref().expect("frontend report");
    let failed = r.failed + after.failed;
    assert_eq!(
        count(f, "failed"),
        failed,
        "the load's failed requests: {f}"
    );
    assert_eq!(
        failed,
        0,
        "failed requests (drain took {drain_s:.1} s; bad rate {:.3} during it, {:.3} after; {timeouts} inputs missed their pull deadline)",
        r.sim.bad_rate(),
        after.sim.bad_rate()
    );
    eprintln!(
        "bad rate {:.3} during the drain, {:.3} after; {timeouts} inputs dropped (pull deadline missed); drain {drain_s:.1} s",
        r.sim.bad_rate(),
        after.sim.bad_rate(),
    );
    Some(())
}

#[test]
fn a_backend_drains_and_leaves_under_load_without_a_failed_request() {
    let dir = std::env::temp_dir().join(format!("fermata-drain-{}", std::process::id()));
    let ran = (0..3).any(|_| drain_once(&dir).is_some());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ran, "backend0 ran no plan before it left, three times");
}
