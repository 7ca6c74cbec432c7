//! Fencing, as real processes on loopback: a primary scheduler stopped
//! (`SIGSTOP`) until its hot standby took over under a new term, then resumed
//! (`SIGCONT`), steps down — the new primary's fence reaches it, it ends with
//! the reason — and a frontend started afterwards with `--scheduler
//! PRIMARY,STANDBY` (the old primary first) ends up with the new primary and
//! serves: no request is lost to a second primary with no GPUs.

use fermata::core::Dur;
use fermata::harness::loadgen::{self, LoadReport, LoadgenOpts};
use fermata::harness::procs::{small_workload, ProcCluster, ProcOpts};
use fermata::workload::Workload;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

/// `secs` of load at 100 r/s through `frontends` only.
fn load(c: &ProcCluster, w: &Workload, frontends: &[String], secs: f64) -> LoadReport {
    let mut lo = LoadgenOpts::new(frontends.to_vec(), w);
    lo.rate_rps = 100.0;
    lo.warmup = Dur::ZERO;
    lo.duration = Dur::from_secs_f64(secs);
    loadgen::run(c.secret.transport().unwrap(), w, &lo).unwrap()
}

/// Load through `frontends` until a run of it is served well, at most `max`.
fn served(c: &ProcCluster, w: &Workload, frontends: &[String], max: Duration) -> LoadReport {
    let t0 = Instant::now();
    loop {
        let r = load(c, w, frontends, 0.5);
        assert_eq!(r.unanswered, 0, "every request is answered");
        if r.sim.offered() > 20 && r.sim.bad_rate() < 0.05 {
            return r;
        }
        assert!(
            t0.elapsed() < max,
            "not served within {max:?}: bad rate {} (a frontend stuck with a replaced primary fails every request)",
            r.sim.bad_rate()
        );
    }
}

#[test]
fn a_primary_paused_past_the_takeover_steps_down_and_a_frontend_started_after_it_loses_nothing() {
    let dir = std::env::temp_dir().join(format!("fermata-fencing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.toml");
    std::fs::write(&path, small_workload("fencing", 2)).unwrap();
    let w = Workload::from_file(&path).unwrap();
    let o = ProcOpts {
        backend_gpus: vec![2],
        standby: true,
        ..ProcOpts::new(path)
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    let first = c.frontend_addrs.clone();
    served(&c, &w, &first, Duration::from_secs(15));

    // The primary stops; the standby takes over under term 2 and the nodes
    // (scheduler timeout 2 s) follow it.
    c.scheduler.signal(libc::SIGSTOP);
    let took = c.standby_took_over(Duration::from_secs(15)).unwrap();
    assert!(took.contains("term 2"), "{took}");
    for (p, what) in [
        (&mut c.backends[0], "fermata backend back in service"),
        (&mut c.frontends[0], "fermata frontend back in service"),
    ] {
        p.wait_for(what, Duration::from_secs(20), |l| {
            l.starts_with(what).then(|| l.to_string())
        })
        .unwrap();
    }

    // The primary resumes, and a frontend starts that tries it first.
    c.scheduler.signal(libc::SIGCONT);
    let both = format!(
        "{},{}",
        c.scheduler_addr,
        c.standby_addr.clone().expect("the standby's address")
    );
    let late = c.spawn_frontend(&exe(), &both, false).unwrap();

    // The resumed primary hears of term 2 and steps down: it says so and ends
    // with an error status.
    let down = c
        .scheduler
        .wait_for("stepped down", Duration::from_secs(20), |l| {
            l.starts_with("fermata scheduler stepped down")
                .then(|| l.to_string())
        })
        .unwrap();
    assert!(down.contains("term 2"), "{down}");
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = c.scheduler.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the replaced primary's process does not end"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "a replaced primary exits with an error");

    // The late frontend serves through the new primary; then a fixed run
    // through it alone: every request answered, none lost.
    served(&c, &w, std::slice::from_ref(&late), Duration::from_secs(20));
    let r = load(&c, &w, std::slice::from_ref(&late), 3.0);
    let good: u64 = r.sim.models.iter().map(|x| x.good).sum();
    let late_n: u64 = r.sim.models.iter().map(|x| x.late).sum();
    let dropped: u64 = r.sim.models.iter().map(|x| x.dropped).sum();
    println!(
        "split brain: {} requests through the frontend started after the resumed primary: {good} good, {late_n} late, {dropped} dropped or failed, {} unanswered; lost 0",
        r.sim.offered(),
        r.unanswered
    );
    assert_eq!(r.unanswered, 0, "every request answered");
    assert_eq!((r.duplicates, r.wrong_outputs), (0, 0));
    assert!(r.sim.offered() > 200, "the run was sent");
    assert!(
        r.sim.bad_rate() < 0.05,
        "served by the new primary: bad rate {}",
        r.sim.bad_rate()
    );
    // Both frontends are with the new primary.
    served(&c, &w, &c.frontend_addrs.clone(), Duration::from_secs(10));
    let reps = c.stop();
    for f in reps.frontends.iter().flatten() {
        let n = |k: &str| f[k].as_u64().unwrap();
        assert_eq!(
            n("good") + n("late") + n("dropped") + n("failed"),
            n("requests"),
            "every request the frontend took ended once: {f}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
