//! Drain and leave, with real processes on loopback: a backend told to leave
//! (SIGTERM) under load stops getting plans, finishes the ones it has and
//! unregisters; no request fails for it, and the other backend serves on.

use fermata::harness::procs::{small_workload, ProcCluster, ProcOpts};
use fermata::workload::Workload;
use std::path::PathBuf;
use std::time::Duration;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

#[test]
fn a_backend_drains_and_leaves_under_load_without_a_failed_request() {
    let dir = std::env::temp_dir().join(format!("fermata-drain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.toml");
    std::fs::write(&path, small_workload("drain", 2)).unwrap();
    let w = Workload::from_file(&path).unwrap();
    let o = ProcOpts {
        backend_gpus: vec![1, 1],
        ..ProcOpts::new(path.clone())
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    // 400 r/s for 4 s: GPU 0 (backend0, the lowest id, which deferred
    // scheduling fills first) is busy when it is told to leave.
    let load = c.load_in_background(&w, 400.0, 4.0).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut b0 = c.backends.remove(0);
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
    let rep: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert!(
        rep["plans_run"].as_u64().unwrap() > 0,
        "it served before: {rep}"
    );
    assert_eq!(rep["tasks_failed"], 0, "{rep}");
    let r = load.join().unwrap().unwrap();
    assert_eq!(r.failed, 0, "no request failed");
    assert_eq!(r.unanswered, 0, "every request answered");
    assert_eq!(r.duplicates, 0);
    assert!(
        r.sim.bad_rate() < 0.01,
        "bad rate {} (offered {})",
        r.sim.bad_rate(),
        r.sim.offered()
    );
    let reps = c.stop();
    let s = reps.scheduler.expect("scheduler report");
    // backend1 drained too when the cluster stopped (SIGTERM).
    assert_eq!(s["backends_drained"], 2, "{s}");
    assert_eq!(s["backends_left"], 2, "{s}");
    assert_eq!(s["tasks_failed_backend_lost"], 0, "{s}");
    let f = reps.frontends[0].as_ref().expect("frontend report");
    assert_eq!(f["failed"], 0, "{f}");
    let _ = std::fs::remove_dir_all(&dir);
}
