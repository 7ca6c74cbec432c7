//! Re-partitioning on a fan-out change with real processes on loopback
//! (src/harness/adapt_procs.rs): a scheduler with two sub-clusters and a
//! one-second epoch, an emulated backend in each, and the per-model load a
//! frontend submits for `detect` -> `classify` next to a model `other`. The
//! fan-out jumps 3x mid-run, which overloads `classify`'s sub-cluster; the
//! epoch loop moves `detect` to the other sub-cluster (no GPU added) and the
//! bad share falls back under 1%.

use fermata::harness::adapt_procs::{run, Options, BAD_LIMIT};
use std::path::Path;

#[test]
fn a_fanout_jump_is_absorbed_by_moving_a_model_to_the_subcluster_with_spare_gpu_time() {
    let o = Options::default();
    assert_eq!((o.jump, o.jump_at_s, o.duration_s), (3.0, 3.0, 12.0));
    let r = run(Path::new(env!("CARGO_BIN_EXE_fermata")), &o).unwrap();
    for w in &r.windows {
        eprintln!(
            "{:5.1} s fanout {} offered {:5} bad {:6.2}% classify {:6.2}%",
            w.start_s,
            w.fanout,
            w.offered,
            w.bad * 100.0,
            w.bad_classify * 100.0
        );
    }
    eprintln!("moves {}; placement {:?}", r.moves, r.placement);
    assert_eq!((r.failed, r.unanswered, r.duplicates), (0, 0, 0));
    // The move happened and finished: detect left classify's sub-cluster.
    assert!(r.moves["done"].as_u64().unwrap_or(0) >= 1, "{}", r.moves);
    assert_eq!(r.moves["aborted"], 0, "{}", r.moves);
    let sub = |m: &str| r.placement.iter().find(|(n, _)| n == m).map(|x| x.1);
    assert_ne!(sub("detect"), sub("classify"), "{:?}", r.placement);
    assert_eq!(sub("detect"), sub("other"), "{:?}", r.placement);
    // Recovered: over the windows from 7 s on (the jump at 3 s, so from
    // the fifth epoch after it; the move is asked for at the end of the first
    // epoch that measured the new rates), the share of requests not answered
    // within the SLO is under the bound. Summed over those windows, so that
    // one window stalled by a loaded machine does not decide.
    let last: Vec<_> = r.windows.iter().filter(|w| w.start_s >= 7.0).collect();
    assert!(last.len() >= 4, "{:?}", r.windows);
    let offered: u64 = last.iter().map(|w| w.offered).sum();
    let bad: f64 = last.iter().map(|w| w.bad * w.offered as f64).sum();
    assert!(offered > 1000, "offered {offered}");
    assert!(
        bad / (offered as f64) < BAD_LIMIT,
        "bad {bad} of {offered} from 7 s: {:?}",
        r.windows
    );
    let s = r.scheduler.expect("scheduler report");
    assert_eq!(s["tasks_failed_backend_lost"], 0, "{s}");
    for b in &r.backends {
        let b = b.as_ref().expect("backend report");
        assert_eq!(b["plans_refused"], 0, "{b}");
        assert_eq!(b["tasks_failed"], 0, "{b}");
    }
}
