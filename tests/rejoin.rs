//! Nodes that lose the scheduler come back on their own, as real processes on
//! loopback: a backend stopped (`SIGSTOP`) past every heartbeat timeout rejoins
//! when it resumes; after the scheduler is killed (`SIGKILL`) and started again
//! on its address, the backend and the frontend register again and serve,
//! and a request sent while there was none, its SLO long enough, is held and
//! served by the new one.
//! Meanwhile every request the load generator sent gets an answer. A backend
//! whose GPU hangs while it still answers pings is taken out by the plan
//! watchdog and comes back when the GPU is free; a frontend killed under load
//! is accounted for by the load generator. A standby that takes over plans
//! with the latency scales its primary measured.

use fermata::core::Dur;
use fermata::harness::loadgen::{self, LoadReport, LoadgenOpts};
use fermata::harness::procs::{small_workload, Proc, ProcCluster, ProcOpts};
use fermata::transport::Event;
use fermata::wire::{Msg, Outcome};
use fermata::workload::Workload;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

/// A cluster serving the test workload from `dir`, as `tweak` sets it up (by
/// default: one backend with 2 GPUs, one frontend).
fn cluster_with(dir: &Path, tweak: impl FnOnce(&mut ProcOpts)) -> (ProcCluster, Workload, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("w.toml");
    std::fs::write(&path, small_workload("rejoin", 2)).unwrap();
    let w = Workload::from_file(&path).unwrap();
    let mut o = ProcOpts {
        backend_gpus: vec![2],
        ..ProcOpts::new(path.clone())
    };
    tweak(&mut o);
    let c = ProcCluster::start(&exe(), &o).unwrap();
    (c, w, path)
}

fn cluster(dir: &Path) -> (ProcCluster, Workload, PathBuf) {
    cluster_with(dir, |_| {})
}

fn load(c: &ProcCluster, w: &Workload, secs: f64) -> LoadReport {
    let mut lo = LoadgenOpts::new(c.frontend_addrs.clone(), w);
    lo.rate_rps = 100.0;
    lo.warmup = Dur::ZERO;
    lo.duration = Dur::from_secs_f64(secs);
    loadgen::run(c.secret.transport().unwrap(), w, &lo).unwrap()
}

/// Stops the cluster and checks its frontend's report: it rejoined once and
/// every request it took ended once.
fn stop_after_one_rejoin(c: ProcCluster) -> fermata::harness::procs::ProcReports {
    let reps = c.stop();
    let f = reps.frontends[0].as_ref().expect("frontend report");
    assert_eq!(f["rejoins"], 1, "{f}");
    let n = |k: &str| f[k].as_u64().unwrap();
    assert_eq!(
        n("good") + n("late") + n("dropped") + n("failed"),
        n("requests"),
        "every request the frontend took ended once"
    );
    reps
}

/// Load until a run of it is served well (the cluster is back), at most `max`.
fn served_again(c: &ProcCluster, w: &Workload, max: Duration) -> LoadReport {
    let t0 = Instant::now();
    loop {
        let r = load(c, w, 0.5);
        assert_eq!(r.unanswered, 0, "every request is answered");
        if r.sim.offered() > 20 && r.sim.bad_rate() < 0.05 {
            return r;
        }
        assert!(
            t0.elapsed() < max,
            "not served again within {max:?}: bad rate {}",
            r.sim.bad_rate()
        );
    }
}

#[test]
fn a_backend_stopped_past_the_timeouts_rejoins_when_it_resumes() {
    let dir = std::env::temp_dir().join(format!("fermata-rejoin-be-{}", std::process::id()));
    let (mut c, w, _) = cluster(&dir);
    served_again(&c, &w, Duration::from_secs(10));
    // Stopped for longer than the scheduler's node timeout (1 s) and the
    // backend's own scheduler timeout (2 s): both give the other up.
    c.backends[0].signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    c.backends[0].signal(libc::SIGCONT);
    c.backends[0]
        .wait_for("the backend's rejoin", Duration::from_secs(15), |l| {
            l.starts_with("fermata backend back in service")
                .then(|| l.to_string())
        })
        .unwrap();
    let r = served_again(&c, &w, Duration::from_secs(10));
    assert_eq!(r.duplicates, 0);
    let reps = c.stop();
    let b = reps.backends[0].as_ref().expect("backend report");
    assert_eq!(b["rejoins"], 1, "{b}");
    assert!(b["error"].is_null(), "{b}");
    let s = reps.scheduler.expect("scheduler report");
    assert_eq!(s["backends_registered"], 2, "registered, then again");
    assert_eq!(s["backends_lost"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn after_the_scheduler_is_killed_and_restarted_every_node_registers_again() {
    let dir = std::env::temp_dir().join(format!("fermata-rejoin-sc-{}", std::process::id()));
    let (mut c, w, path) = cluster(&dir);
    served_again(&c, &w, Duration::from_secs(10));
    c.scheduler.signal(libc::SIGKILL);
    let _ = c.scheduler.child.wait();
    // No scheduler: requests are held and fail at their deadline, each
    // answered.
    std::thread::sleep(Duration::from_millis(200));
    let r = load(&c, &w, 0.3);
    assert_eq!(r.unanswered, 0);
    assert!(r.sim.bad_rate() > 0.99, "no scheduler, no service");
    // A request whose SLO outlasts the restart is held, and the new
    // scheduler serves it.
    let (etx, erx) = fermata::transport::event_channel();
    let tr = c.secret.transport().unwrap();
    let conn = tr.connect(&c.frontend_addrs[0], etx).unwrap();
    conn.send(Msg::Infer {
        req: 1,
        model: "mlp".into(),
        slo: Dur::from_ms(60_000),
        input: vec![7u8; 256].into(),
    })
    .unwrap();
    // A new scheduler on the same address.
    let mut args: Vec<String> = [
        "scheduler",
        "--workload",
        &path.to_string_lossy(),
        "--listen",
        &c.scheduler_addr,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(c.secret.args());
    let mut s2 = Proc::spawn(&exe(), "scheduler2", &args, false).unwrap();
    s2.wait_for("listening", Duration::from_secs(20), |l| {
        l.starts_with("fermata scheduler listening on")
            .then(|| l.to_string())
    })
    .unwrap();
    c.scheduler = s2;
    for (p, what) in [
        (&mut c.backends[0], "fermata backend back in service"),
        (&mut c.frontends[0], "fermata frontend back in service"),
    ] {
        p.wait_for(what, Duration::from_secs(15), |l| {
            l.starts_with(what).then(|| l.to_string())
        })
        .unwrap();
    }
    let (status, message) = loop {
        match erx
            .recv_timeout(Duration::from_secs(20))
            .expect("the held request's answer")
        {
            Event::Msg(
                _,
                Msg::InferReply {
                    req: 1,
                    status,
                    message,
                    ..
                },
            ) => break (status, message),
            _ => continue,
        }
    };
    assert_eq!(status, Outcome::Good, "held over the restart: {message}");
    drop(conn);
    served_again(&c, &w, Duration::from_secs(10));
    let reps = stop_after_one_rejoin(c);
    let s = reps.scheduler.expect("the new scheduler's report");
    assert_eq!(s["backends_registered"], 1);
    assert_eq!(s["frontends_registered"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_load_generator_accounts_for_a_frontend_killed_under_it() {
    let dir = std::env::temp_dir().join(format!("fermata-rejoin-fe-{}", std::process::id()));
    let (c, w, _) = cluster_with(&dir, |o| o.frontends = 2);
    served_again(&c, &w, Duration::from_secs(10));
    let (c2, w2) = (c.frontend_addrs.clone(), w.clone());
    let tr = c.secret.transport().unwrap();
    let run = std::thread::spawn(move || {
        let mut lo = LoadgenOpts::new(c2, &w2);
        lo.rate_rps = 200.0;
        lo.warmup = Dur::ZERO;
        lo.duration = Dur::from_secs_f64(2.0);
        loadgen::run(tr, &w2, &lo)
    });
    std::thread::sleep(Duration::from_millis(700));
    c.frontends[1].signal(libc::SIGKILL);
    let r = run
        .join()
        .unwrap()
        .expect("the run ends with its accounting");
    assert_eq!(r.lost.len(), 1, "one frontend lost");
    let l = &r.lost[0];
    assert_eq!(l.addr, c.frontend_addrs[1]);
    assert!(l.at_secs > 0.5 && l.at_secs < 2.0, "{l:?}");
    assert!(l.examples.len() as u64 == l.open.min(5), "{l:?}");
    let s = &r.sim;
    let ended: u64 = s.models.iter().map(|m| m.good + m.late + m.dropped).sum();
    assert_eq!(
        ended,
        s.offered(),
        "every offered request is counted once (good, late, dropped/failed or unanswered)"
    );
    assert_eq!(r.unanswered, l.open, "only what the dead frontend held");
    assert_eq!(r.duplicates, 0);
    // The rest went to the live frontend and was served.
    assert!(s.offered() > 300, "the run went on after the kill");
    assert!(
        s.bad_rate() < 0.2,
        "after the kill the live frontend serves: bad {}",
        s.bad_rate()
    );
    let _ = c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_backend_whose_gpu_hangs_is_taken_out_by_the_watchdog_and_comes_back() {
    let dir = std::env::temp_dir().join(format!("fermata-rejoin-wd-{}", std::process::id()));
    // Backend 0's GPU hangs for 2.5 s in its 6th batch, and goes on pinging.
    let (mut c, w, _) = cluster_with(&dir, |o| {
        o.backend_gpus = vec![1, 1];
        o.backend_env = vec![(0, "FERMATA_FAULT".into(), "gpu-hang:5:2500".into())];
    });
    let r = load(&c, &w, 3.5);
    assert_eq!(r.unanswered, 0, "every request answered");
    assert_eq!(r.duplicates, 0);
    // Failed: what backend 0 held when it hung and until the watchdog (500 ms
    // after the plan's end) took it out; the other GPU served the rest.
    assert!(
        r.sim.bad_rate() < 0.3,
        "bad rate {} (the frontend fallback alone would fail every request planned on the hung GPU for 3 s)",
        r.sim.bad_rate()
    );
    c.backends[0]
        .wait_for("the backend's return", Duration::from_secs(15), |l| {
            l.starts_with("fermata backend back in service")
                .then(|| l.to_string())
        })
        .unwrap();
    served_again(&c, &w, Duration::from_secs(10));
    let reps = c.stop();
    let s = reps.scheduler.expect("scheduler report");
    assert_eq!(s["backends_overdue"], 1, "{s}");
    assert_eq!(s["backends_lost"], 1, "{s}");
    // One rejoin, one removal: had it come back while its GPU still hung, the
    // watchdog would have taken it out again.
    let b = reps.backends[0].as_ref().expect("backend report");
    assert_eq!(b["rejoins"], 1, "back only once its GPU was free: {b}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hot standby (`scheduler --standby-of`) takes over when the primary is
/// killed under load: the nodes, given both addresses, move to it and are
/// back in service in well under a second; every request ends exactly once
/// (those pending at the primary are held and submitted to the standby), and
/// the cluster serves again through the standby.
#[test]
fn a_standby_takes_over_when_the_primary_is_killed_under_load() {
    let dir = std::env::temp_dir().join(format!("fermata-standby-{}", std::process::id()));
    let (mut c, w, _) = cluster_with(&dir, |o| o.standby = true);
    served_again(&c, &w, Duration::from_secs(10));
    let load_run = c.load_in_background(&w, 200.0, 3.0).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let killed = Instant::now();
    c.scheduler.signal(libc::SIGKILL);
    let _ = c.scheduler.child.wait();
    let took = c.standby_took_over(Duration::from_secs(5)).unwrap();
    assert!(took.contains("primary"), "{took}");
    for (p, what) in [
        (&mut c.backends[0], "fermata backend back in service"),
        (&mut c.frontends[0], "fermata frontend back in service"),
    ] {
        p.wait_for(what, Duration::from_secs(5), |l| {
            l.starts_with(what).then(|| l.to_string())
        })
        .unwrap();
    }
    let back = killed.elapsed();
    assert!(
        back < Duration::from_secs(2),
        "back in service after {back:?}"
    );
    let r = load_run.join().unwrap().unwrap();
    assert_eq!(r.unanswered, 0, "every request ended");
    assert_eq!((r.duplicates, r.wrong_outputs), (0, 0));
    // Of 600 requests, those pending at the kill and those sent in the gap
    // are held for the standby: nearly all are served (1.7% bad at most in
    // three runs beside two busy loops on 2 cores).
    assert!(r.sim.bad_rate() < 0.1, "bad rate {}", r.sim.bad_rate());
    served_again(&c, &w, Duration::from_secs(10));
    stop_after_one_rejoin(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Requests pending at a primary that is killed are not failed: the frontend
/// holds them, and those that come before the standby serves, and submits
/// them to the standby once it serves (new task ids, same inputs), so with a
/// model whose batches take 40 ms, where a dozen requests are always
/// pending, nearly every request of the run is good.
#[test]
fn requests_pending_at_a_killed_primary_are_served_through_the_standby() {
    let dir = std::env::temp_dir().join(format!("fermata-held-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("slow.toml");
    std::fs::write(
        &path,
        "name = \"slow\"\ngpus = 2\nrate_rps = 100\n[[models]]\nname = \"m\"\nalpha_ms = 0.5\nbeta_ms = 40.0\nslo_ms = 400\ninput_bytes = 256\n",
    )
    .unwrap();
    let w = Workload::from_file(&path).unwrap();
    let o = ProcOpts {
        backend_gpus: vec![2],
        standby: true,
        ..ProcOpts::new(path)
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    let load_run = c.load_in_background(&w, 100.0, 3.0).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    c.scheduler.signal(libc::SIGKILL);
    let _ = c.scheduler.child.wait();
    let r = load_run.join().unwrap().unwrap();
    assert_eq!(r.unanswered, 0, "every request ended");
    assert_eq!((r.duplicates, r.wrong_outputs), (0, 0));
    // Held ones fail only if their deadline passes before the standby serves.
    assert!(r.sim.bad_rate() < 0.05, "bad rate {}", r.sim.bad_rate());
    let reps = c.stop();
    let f = reps.frontends[0].as_ref().expect("frontend report");
    let n = |k: &str| f[k].as_u64().unwrap();
    assert!(
        n("retried") >= 3,
        "pending requests held and resubmitted: {f}"
    );
    assert_eq!(
        n("good") + n("late") + n("dropped") + n("failed"),
        n("requests"),
        "every request the frontend took ended once"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The value of `fermata_model_latency_scale{model="mlp"}` on the metrics
/// listener at `addr`.
fn mlp_scale(addr: &str) -> f64 {
    let text = fermata::harness::churn::get_metrics(addr).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("fermata_model_latency_scale{model=\"mlp\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no latency scale of mlp in:\n{text}"))
}

/// A standby that takes over plans each model with the latency scale its
/// primary measured (sent to it while it followed), from its first plan:
/// with no load during the takeover, nothing but the primary's scale can
/// have moved the standby's off 1.
#[test]
fn a_standby_takes_over_the_latency_scales_its_primary_measured() {
    let dir = std::env::temp_dir().join(format!("fermata-scales-{}", std::process::id()));
    let (mut c, w, _) = cluster_with(&dir, |o| {
        o.standby = true;
        o.scheduler_args
            .extend(["--metrics-listen".to_string(), "127.0.0.1:0".to_string()]);
        // The backend's batches of mlp take twice their profile.
        o.backend_args = vec![(
            0,
            vec!["--emulated-slowdown".to_string(), "mlp=2@0".to_string()],
        )];
    });
    let primary = c.scheduler_metrics_addr().unwrap();
    let standby = c
        .standby
        .as_mut()
        .expect("a standby")
        .scheduler_metrics_addr()
        .unwrap();
    let t0 = Instant::now();
    let scale = loop {
        let r = load(&c, &w, 0.5);
        assert_eq!(r.unanswered, 0, "every request is answered");
        let k = mlp_scale(&primary);
        if k >= 1.5 {
            break k;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the primary never scaled mlp: {k}"
        );
    };
    // The standby's next ping carries it (every heartbeat, 100 ms).
    std::thread::sleep(Duration::from_millis(500));
    c.scheduler.signal(libc::SIGKILL);
    let _ = c.scheduler.child.wait();
    c.standby_took_over(Duration::from_secs(5)).unwrap();
    let k = mlp_scale(&standby);
    assert!(
        (k - scale).abs() < 1e-5,
        "the standby plans mlp at {k}, its primary measured {scale}"
    );
    served_again(&c, &w, Duration::from_secs(10));
    let _ = c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
