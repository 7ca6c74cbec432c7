//! Concurrent lanes with real processes on loopback: one emulated backend with
//! one GPU and `--lanes 2` registers two GPU slots, and under a load one lane
//! cannot carry, the GPU runs two batches at once while no lane ever runs two;
//! every request is answered once and none fails; the scheduler's autoscaling
//! view counts the slots as lanes of one GPU. The same in one process
//! (`fermata serve --lanes 2`).

use fermata::harness::procs::{ProcCluster, ProcOpts};
use fermata::workload::Workload;
use std::path::PathBuf;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

/// One model that gains little from batching (l(b) = 10 ms * b + 5 ms, so one
/// lane serves under 100 r/s), its profile the lane profile d(b, 2).
const WORKLOAD: &str = r#"
name = "lanes"
gpus = 2
rate_rps = 150
[[models]]
name = "m"
alpha_ms = 10.0
beta_ms = 5.0
slo_ms = 250
input_bytes = 256
"#;

#[test]
fn one_gpu_with_two_lanes_runs_two_batches_at_once_and_a_lane_never_two() {
    let dir = std::env::temp_dir().join(format!("fermata-lanes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.toml");
    std::fs::write(&path, WORKLOAD).unwrap();
    let o = ProcOpts {
        backend_gpus: vec![1],
        backend_args: vec![(0, vec!["--lanes".into(), "2".into()])],
        scheduler_args: ["--metrics-listen", "127.0.0.1:0"]
            .map(String::from)
            .to_vec(),
        ..ProcOpts::new(path.clone())
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    let metrics = c.scheduler_metrics_addr().unwrap();
    let w = Workload::from_file(&path).unwrap();
    let load = c.load_in_background(&w, 150.0, 4.0).unwrap();
    let r = load.join().unwrap().unwrap();
    // The core plans two slots; the advice counts one GPU of two lanes.
    let view: serde_json::Value = serde_json::from_str(&get(&metrics, "/v1/autoscale")).unwrap();
    let cluster = &view["cluster"];
    assert_eq!(cluster["signals"]["gpus"], 2, "{view}");
    assert_eq!(cluster["advice"]["gpus_in_service"], 1, "{view}");
    assert_eq!(cluster["advice"]["lanes"], 2, "{view}");
    let reps = c.stop();
    let _ = std::fs::remove_dir_all(&dir);
    r.assert_served(300, 0.05);
    let b = reps.backends[0].as_ref().expect("the backend's report");
    assert_eq!(b["lanes"], 2, "{b}");
    assert_eq!(
        b["gpu_batches_at_once_max"],
        serde_json::json!([2]),
        "the one GPU ran two batches at once: {b}"
    );
    assert_eq!(
        b["lane_overlaps"], 0,
        "no lane ran two batches at once: {b}"
    );
    assert!(b["plans_run"].as_u64().unwrap() > 10, "{b}");
}

#[test]
fn lanes_out_of_range_are_refused() {
    let out = std::process::Command::new(exe())
        .args(["backend", "--lanes", "0", "--scheduler", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--lanes must be 1 to 64"), "{err}");
}

/// `fermata serve`'s cluster with lanes, in one process: the same load on one
/// GPU of two lanes.
#[test]
fn serve_in_process_with_two_lanes_runs_two_batches_at_once() {
    use fermata::harness::loadgen::LoadgenOpts;
    use fermata::node::serve::{serve, ClusterOpts};
    use fermata::transport::{inproc::InProc, Transport};
    let mut w = Workload::from_toml(WORKLOAD, None).unwrap();
    w.gpus = 1;
    let co = ClusterOpts {
        lanes: 2,
        host: "lanes-serve".into(),
        region_bytes: 64 << 20,
        ..ClusterOpts::default()
    };
    let mut lo = LoadgenOpts::new(Vec::new(), &w);
    lo.rate_rps = 150.0;
    lo.warmup = fermata::core::Dur::ZERO;
    lo.duration = fermata::core::Dur::from_secs_f64(3.0);
    let tr: std::sync::Arc<dyn Transport> = std::sync::Arc::new(InProc::global());
    let run = serve(tr, &w, &co, &lo).unwrap();
    assert_eq!(run.load.failed, 0);
    assert_eq!(run.load.unanswered, 0);
    assert!(
        run.load.sim.bad_rate() < 0.05,
        "{}",
        run.load.sim.bad_rate()
    );
    let b = &run.cluster.backends[0];
    assert_eq!(b.lanes, 2);
    assert_eq!(b.gpu_batches_at_once_max, vec![2]);
    assert_eq!(b.lane_overlaps, 0);
}

/// The body of `GET path` from the HTTP server at `addr`.
fn get(addr: &str, path: &str) -> String {
    fermata::harness::churn::http_get(addr, path).unwrap()
}
