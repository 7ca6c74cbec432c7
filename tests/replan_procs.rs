//! Re-planning an application on its measured fan-out, with real processes on
//! loopback (src/harness/adapt_apps.rs): a scheduler serving models/apps,
//! one backend running ONNX Runtime on the CPU, a frontend serving the
//! ensemble `detect_classify` over HTTP with `--replan-every-s 1`, and an
//! open-loop HTTP client. The client's inputs first carry one patch the
//! detector passes, then, from 4 s on, three: the fan-out detector -> mlp
//! triples. The frontend re-plans the application with the fermata planner
//! at the measured fan-out and installs its budgets for new requests; every
//! request ends exactly once, and the requests sent from two epochs after
//! the jump on are answered within the SLO. A second frontend serves the
//! application too but gets no request: it re-plans on the scheduler's sums
//! of both frontends' counters, so it plans the same fan-out. The frontend also measures each
//! step's run time over its model's profile from the results (a debug build
//! runs the models several times slower than their profiles say, so a
//! latency re-plan may come before the jump; the planned fan-out stays 1
//! until the jump).

use fermata::harness::adapt_apps::{run, Options};
use std::path::{Path, PathBuf};

#[test]
fn a_tripled_fanout_through_the_ensemble_is_replanned_live() {
    let o = Options {
        models: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/apps"),
        frontends: 2,
        ..Options::default()
    };
    assert_eq!((o.items_before, o.items_after, o.epoch_s), (1, 3, 1.0));
    let r = run(Path::new(env!("CARGO_BIN_EXE_fermata")), &o).unwrap();
    for w in &r.windows {
        eprintln!(
            "{:5.1} s items {} offered {:4} ok {:4} bad {:6.2}% unanswered {}",
            w.start_s,
            w.items,
            w.offered,
            w.ok,
            w.bad * 100.0,
            w.unanswered
        );
    }
    eprintln!(
        "replans {} (before the jump {}, planned fan-out then {:?}), planned fan-out {:?}, budgets {:?}, measured {} items / {} outputs, latency ratio measured {:?} planned {:?}",
        r.replans,
        r.replans_before_jump,
        r.planned_fanout_before_jump,
        r.planned_fanout,
        r.budgets_ms,
        r.fanout_items,
        r.fanout_outputs,
        r.latency_ratio,
        r.planned_latency_ratio
    );
    // Every request ended exactly once: each got one answer at the client;
    // the frontend counted each good one once (as many as the client's 200s)
    // and no more than were sent in all (one the door refuses is answered
    // without counting); and each module request ended once.
    assert!(r.offered > 200, "offered {}", r.offered);
    assert_eq!(r.unanswered, 0, "{:?}", r.windows);
    assert_eq!(r.server_success, r.answered_200, "{r:?}");
    assert!(r.server_success + r.server_fail <= r.offered, "{r:?}");
    let f = r.frontends[0].as_ref().expect("frontend report");
    let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k} in {f}"));
    assert_eq!(
        n("good") + n("late") + n("dropped") + n("failed"),
        n("requests"),
        "{f}"
    );
    assert_eq!(n("failed"), 0, "{f}");
    // No fan-out re-plan while the inputs carried the planned one item
    // each; at least one re-plan after the jump, which planned the
    // measured three.
    assert_eq!(r.planned_fanout_before_jump, Some(1.0), "{r:?}");
    assert!(r.replans > r.replans_before_jump, "no re-plan: {r:?}");
    let f = r.planned_fanout.expect("the planned fan-out on /metrics");
    assert!((f - 3.0).abs() < 0.75, "planned fan-out {f}");
    // The new plan's budgets fit the application's SLO along its path.
    assert_eq!(r.budgets_ms.len(), 2, "{:?}", r.budgets_ms);
    let sum: f64 = r.budgets_ms.iter().map(|b| b.1).sum();
    assert!(sum > 0.0 && sum <= o.slo_ms + 1e-3, "{:?}", r.budgets_ms);
    // The frontend the client never called heard the sums over both and
    // re-planned on them: the measured three items, within the SLO.
    assert_eq!(r.idle_frontends.len(), 1, "{r:?}");
    let idle = &r.idle_frontends[0];
    eprintln!("idle frontend: {idle:?}");
    assert_eq!(idle.requests, 0, "{idle:?}");
    assert_eq!(idle.frontends_summed, 2, "{idle:?}");
    assert!(
        idle.requests_summed * 10 >= r.server_success * 9 && idle.requests_summed <= r.offered,
        "sums of {} requests against {} served: {idle:?}",
        idle.requests_summed,
        r.server_success
    );
    assert!(idle.replans >= 1, "{idle:?}");
    let f = idle
        .planned_fanout
        .expect("the idle frontend's planned fan-out");
    assert!((f - 3.0).abs() < 0.75, "idle frontend planned fan-out {f}");
    let sum: f64 = idle.budgets_ms.iter().map(|b| b.1).sum();
    assert!(sum > 0.0 && sum <= o.slo_ms + 1e-3, "{idle:?}");
    // The requests sent from two epochs after the jump on: under a generous
    // bar (the SLO is 500 ms; on a loaded 2-core machine a stall of the host
    // can still cost some).
    let (offered, bad) = r.bad_from(o.jump_at_s + 2.0 * o.epoch_s);
    assert!(offered > 100, "offered {offered} after the jump");
    assert!(
        bad < 0.05,
        "bad {:.2}% after the jump: {:?}",
        bad * 100.0,
        r.windows
    );
    // No module request failed at the backend.
    for b in &r.backends {
        let b = b.as_ref().expect("backend report");
        assert_eq!(b["tasks_failed"], 0, "{b}");
    }
    // Each step's run time over its profile as the frontend measured it from
    // the results is the backend's own measure of its batches (its median
    // over the last batches; the frontend's is a mean over every answer:
    // within a factor 2 of each other), and a step whose ratio is past the
    // threshold runs under a plan that scaled its profile near it.
    let b = r.backends[0].as_ref().expect("backend report");
    let p50 = b["run_over_profile_p50"]
        .as_f64()
        .expect("run_over_profile_p50");
    assert_eq!(r.latency_ratio.len(), 2, "{r:?}");
    assert_eq!(r.planned_latency_ratio.len(), 2, "{r:?}");
    for ((s, k), (_, planned)) in r.latency_ratio.iter().zip(&r.planned_latency_ratio) {
        assert!(
            *k > 0.0 && (0.5..2.0).contains(&(k / p50)),
            "{s}: {k} against {p50}"
        );
        if (k - 1.0).abs() > 0.5 {
            assert!(
                (planned / k - 1.0).abs() < 0.5,
                "{s}: planned {planned}, measured {k}"
            );
        }
    }
}
