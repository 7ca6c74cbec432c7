//! The closed autoscaling loop with real processes on loopback: `fermata
//! autoscale` reads the scheduler's advice (`/v1/autoscale`) and launches
//! `fermata backend` processes and drains them again: the lower bound first,
//! more GPUs when load exceeds what they serve, back to the lower bound when the
//! load is gone, never above the upper bound; the drains fail no request.

use fermata::harness::procs::{Proc, ProcCluster, ProcOpts};
use fermata::workload::Workload;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

/// The autoscaler's step records until `done` says stop (or `max` passes).
fn steps_until(
    p: &mut Proc,
    max: Duration,
    mut done: impl FnMut(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    loop {
        let left = max.saturating_sub(t0.elapsed());
        assert!(
            !left.is_zero(),
            "not reached within {max:?}; steps: {out:#?}"
        );
        let line = p
            .wait_for("a step", left, |l| {
                l.starts_with('{').then(|| l.to_string())
            })
            .unwrap_or_else(|e| panic!("{e:#}; steps: {out:#?}"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let stop = done(&v);
        out.push(v);
        if stop {
            return out;
        }
    }
}

#[test]
fn the_loop_scales_out_under_overload_and_back_in_when_idle_within_its_bounds() {
    let dir = std::env::temp_dir().join(format!("fermata-autoscale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.toml");
    // One emulated GPU serves about 800 r/s of this model (batches of up to 10
    // in about 12 ms).
    std::fs::write(
        &path,
        "name = \"autoscale\"\ngpus = 1\nrate_rps = 100\n[[models]]\nname = \"m\"\nalpha_ms = 1.0\nbeta_ms = 2.0\nslo_ms = 24\ninput_bytes = 256\n",
    )
    .unwrap();
    let w = Workload::from_file(&path).unwrap();
    let o = ProcOpts {
        backend_gpus: vec![],
        scheduler_args: vec!["--metrics-listen".into(), "127.0.0.1:0".into()],
        ..ProcOpts::new(path.clone())
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    let metrics = c.scheduler_metrics_addr().unwrap();
    let args: Vec<String> = [
        "--min-backends",
        "1",
        "--max-backends",
        "3",
        "--up-cooldown-s",
        "2",
        "--down-cooldown-s",
        "3",
        "--provisioning-s",
        "10",
        "--interval-s",
        "0.5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut a = c.spawn_autoscale(&exe(), &metrics, &args).unwrap();
    // The lower bound: one backend, launched at once, in service soon.
    let s = steps_until(&mut a, Duration::from_secs(20), |v| v["backends"] == 1);
    assert!(
        s[0]["decision"].as_str().unwrap().starts_with("launch 1"),
        "{s:#?}"
    );
    // 1,400 r/s for 8 s: more than one GPU serves; the loop adds GPUs.
    let load = c.load_in_background(&w, 1400.0, 8.0).unwrap();
    let s = steps_until(&mut a, Duration::from_secs(20), |v| {
        v["backends"].as_u64().unwrap() >= 2
    });
    let launches: Vec<&serde_json::Value> = s
        .iter()
        .filter(|v| v["decision"].as_str().unwrap().starts_with("launch"))
        .collect();
    assert!(!launches.is_empty(), "{s:#?}");
    let r = load.join().unwrap().unwrap();
    assert_eq!(r.unanswered, 0);
    // Idle again: drained back to the lower bound, one at a time, never above 3.
    let s = steps_until(&mut a, Duration::from_secs(60), |v| {
        v["backends"] == 1
            && v["starting"] == 0
            && v["decision"].as_str().unwrap().starts_with("hold")
    });
    assert!(
        s.iter()
            .all(|v| v["backends"].as_u64().unwrap() + v["starting"].as_u64().unwrap() <= 3),
        "{s:#?}"
    );
    let drains: Vec<&serde_json::Value> = s
        .iter()
        .filter(|v| v["decision"].as_str().unwrap().starts_with("drain"))
        .collect();
    assert!(!drains.is_empty(), "{s:#?}");
    // Drains are spaced by the cool-down.
    for w in drains.windows(2) {
        assert!(
            w[1]["t_s"].as_f64().unwrap() - w[0]["t_s"].as_f64().unwrap() >= 3.0,
            "{drains:#?}"
        );
    }
    // The load after the scale-in is served by the one left, none failed.
    let r = c
        .load_in_background(&w, 200.0, 2.0)
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(r.failed, 0);
    assert_eq!(r.unanswered, 0);
    assert!(r.sim.bad_rate() < 0.01, "{}", r.sim.bad_rate());
    // Its backends drain and leave with it. The grace covers the loop's own
    // wait for them (35 s): killed before, it would leave them running.
    let _ = a.stop(Duration::from_secs(40));
    let reps = c.stop();
    let s = reps.scheduler.expect("scheduler report");
    assert!(s["backends_drained"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["tasks_failed_backend_lost"], 0, "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}
