//! The scheduler plans a model with its measured latency: a model that
//! becomes 1.5x slower than its profile mid-run (the emulated executor's
//! `--emulated-slowdown`), served in process (src/bench/slowdown.rs). With
//! the latency scaling on, the scheduler measures the slower batches,
//! plans the model with its profile scaled and the requests after a
//! settling second stay good; with it off (`--latency-rescale off`) the
//! deferred batches, started at their latest moment for the profile's
//! latency, end past their deadlines.

use fermata::bench::slowdown::{run, SlowdownOpts};
use fermata::node::proto::latency_scale::LatencyScaleConfig;
use std::path::PathBuf;

#[test]
fn a_model_slowed_mid_run_is_planned_with_its_measured_latency() {
    let on = run(&SlowdownOpts {
        host: "rescale-on".into(),
        ..SlowdownOpts::new(LatencyScaleConfig::default()).unwrap()
    })
    .unwrap();
    eprintln!("on:  {on:?}");
    let off = run(&SlowdownOpts {
        host: "rescale-off".into(),
        ..SlowdownOpts::new(LatencyScaleConfig::off()).unwrap()
    })
    .unwrap();
    eprintln!("off: {off:?}");
    for r in [&on, &off] {
        assert!(r.offered > 700, "{r:?}");
        assert_eq!((r.failed, r.unanswered), (0, 0), "{r:?}");
        assert!(r.latency.samples > 100, "{r:?}");
    }
    // On: scaled to about the slowdown (the p90 of the measured ratios,
    // 1.5 and what the host adds), and the requests good.
    assert!((1.4..=2.2).contains(&on.scale), "{on:?}");
    assert!(on.latency.changes >= 1, "{on:?}");
    // (0-1% measured on 2 cores shared with builds; 3% leaves room.)
    assert!(on.bad < 0.03, "{on:?}");
    // Off: never scaled, and clearly worse (7.5-10% measured).
    assert_eq!(off.scale, 1.0, "{off:?}");
    assert_eq!(off.latency.changes, 0, "{off:?}");
    assert!(off.bad > 0.04, "{off:?}");
    assert!(off.bad > on.bad + 0.03, "on {on:?} off {off:?}");
}

#[test]
fn a_slowdown_of_an_unknown_model_or_a_bad_rule_is_refused() {
    let mut o = SlowdownOpts::new(LatencyScaleConfig::default()).unwrap();
    o.host = "rescale-unknown".into();
    o.workload.models[0].spec.name = "other".into();
    let e = fermata::node::serve::Cluster::start(
        std::sync::Arc::new(fermata::transport::inproc::InProc::global()),
        &o.workload,
        &fermata::node::serve::ClusterOpts {
            host: o.host.clone(),
            emulated_slowdown: vec!["m=1.5@1".parse().unwrap()],
            ..Default::default()
        },
    )
    .err()
    .expect("refused");
    assert!(format!("{e:#}").contains("does not serve"), "{e:#}");
    let out = std::process::Command::new(PathBuf::from(env!("CARGO_BIN_EXE_fermata")))
        .args([
            "backend",
            "--scheduler",
            "127.0.0.1:1",
            "--emulated-slowdown",
            "m=1.5",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MODEL=K@SECONDS"), "{err}");
}
