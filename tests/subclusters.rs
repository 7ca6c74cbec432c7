//! Sub-clusters and live re-partitioning with real processes on loopback: a
//! scheduler with two sub-clusters (a dispatcher each), one emulated backend
//! in each, and a load whose mix changes twice, so that the epoch partitioner
//! moves models between the sub-clusters while requests keep coming. Every
//! request is answered exactly once, none fails, and no backend is sent a plan
//! for a model it has not loaded (it would refuse it and fail its tasks).

use fermata::harness::procs::{ProcCluster, ProcOpts};
use fermata::workload::Workload;
use std::path::PathBuf;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

/// Four small emulated models with these weights (shares of the rate).
fn workload(weights: [f64; 4]) -> String {
    let mut s = String::from("name = \"subclusters\"\ngpus = 2\nrate_rps = 100\n");
    for (i, w) in weights.iter().enumerate() {
        s += &format!(
            "[[models]]\nname = \"m{i}\"\nalpha_ms = 0.2\nbeta_ms = 1.0\nslo_ms = 300\ninput_bytes = 256\nweight = {w}\n"
        );
    }
    s
}

#[test]
fn models_move_between_subclusters_under_load_without_a_lost_request() {
    let dir = std::env::temp_dir().join(format!("fermata-subclusters-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.toml");
    std::fs::write(&path, workload([1.0; 4])).unwrap();
    let o = ProcOpts {
        backend_gpus: vec![1, 1],
        scheduler_args: [
            "--subclusters",
            "2",
            "--epoch-s",
            "1",
            "--max-moves",
            "1",
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec(),
        ..ProcOpts::new(path.clone())
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    let metrics = c.scheduler_metrics_addr().unwrap();
    // The scheduler split the equal-rate models 2 / 2. A load with 70% on m0
    // makes its sub-cluster take 80%: an epoch moves m0's partner over. Then
    // 70% on m3: m3's sub-cluster is the loaded one, and models move again.
    let mut reports = Vec::new();
    for weights in [[7.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 7.0]] {
        let p = dir.join("load.toml");
        std::fs::write(&p, workload(weights)).unwrap();
        let w = Workload::from_file(&p).unwrap();
        let load = c.load_in_background(&w, 300.0, 4.0).unwrap();
        reports.push(load.join().unwrap().unwrap());
    }
    for r in &reports {
        r.assert_served(500, 0.05);
    }
    // What operators see: each model's sub-cluster, the moves, each backend's
    // sub-cluster.
    let view: serde_json::Value = serde_json::from_str(&get(&metrics, "/v1/autoscale")).unwrap();
    assert_eq!(view["models"].as_array().unwrap().len(), 4, "{view}");
    assert!(view["moves"]["done"].as_u64().unwrap() >= 1, "{view}");
    let mut subs: Vec<u64> = view["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["subcluster"].as_u64().unwrap())
        .collect();
    subs.sort_unstable();
    assert_eq!(subs, vec![0, 1], "a backend in each sub-cluster: {view}");
    let text = get(&metrics, "/metrics");
    assert!(
        text.contains("fermata_model_subcluster{model=\"m0\"}")
            && text.contains("fermata_scheduler_model_moves_total{outcome=\"done\"}")
            && text.contains("fermata_subcluster_demand_gpus{subcluster=\"1\"}"),
        "{text}"
    );
    let reps = c.stop();
    let s = reps.scheduler.expect("scheduler report");
    assert_eq!(s["subclusters"], 2, "{s}");
    let moves = &s["moves"];
    eprintln!(
        "moves {moves}; bad rates {:?}",
        reports.iter().map(|r| r.sim.bad_rate()).collect::<Vec<_>>()
    );
    assert!(
        moves["done"].as_u64().unwrap() >= 2,
        "models moved in both phases: {s}"
    );
    assert_eq!(moves["aborted"], 0, "{s}");
    assert_eq!(s["tasks_failed_backend_lost"], 0, "{s}");
    for b in &reps.backends {
        let b = b.as_ref().expect("backend report");
        assert_eq!(b["plans_refused"], 0, "no plan for a model not loaded: {b}");
        assert_eq!(b["tasks_failed"], 0, "{b}");
        assert!(b["plans_run"].as_u64().unwrap() > 0, "both serve: {b}");
    }
    let f = reps.frontends[0].as_ref().expect("frontend report");
    assert_eq!(f["failed"], 0, "{f}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Typed sub-clusters with real processes: an A100 and a T4 sub-cluster, a
/// backend of each type (`--gpu-type`), two models of each type. Under a load
/// whose skew would have the untyped partitioner move models across, every
/// model stays on its type's sub-cluster, every backend serves only its
/// type's models, and the autoscaler's view sums its advice per type.
#[test]
fn typed_subclusters_keep_each_model_on_its_gpu_type() {
    let dir = std::env::temp_dir().join(format!("fermata-typed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let typed = |weights: [f64; 4]| {
        let mut s = String::from("name = \"typed\"\ngpus = 2\nrate_rps = 100\n");
        for (i, w) in weights.iter().enumerate() {
            let t = if i < 2 { "A100" } else { "T4" };
            s += &format!(
                "[[models]]\nname = \"m{i}\"\ngpu_type = \"{t}\"\nalpha_ms = 0.2\nbeta_ms = 1.0\nslo_ms = 300\ninput_bytes = 256\nweight = {w}\n"
            );
        }
        s
    };
    let path = dir.join("w.toml");
    std::fs::write(&path, typed([1.0; 4])).unwrap();
    let o = ProcOpts {
        backend_gpus: vec![1, 1],
        backend_args: vec![
            (0, vec!["--gpu-type".into(), "T4".into()]),
            (1, vec!["--gpu-type".into(), "a100".into()]),
        ],
        scheduler_args: [
            "--subclusters",
            "2",
            "--subcluster-types",
            "A100,T4",
            "--epoch-s",
            "1",
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec(),
        ..ProcOpts::new(path.clone())
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    let metrics = c.scheduler_metrics_addr().unwrap();
    let p = dir.join("load.toml");
    std::fs::write(&p, typed([8.0, 1.0, 0.5, 0.5])).unwrap();
    let w = Workload::from_file(&p).unwrap();
    let r = c
        .load_in_background(&w, 300.0, 3.0)
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    assert!(r.sim.offered() > 500, "offered {}", r.sim.offered());
    assert_eq!((r.failed, r.unanswered, r.duplicates), (0, 0, 0));
    let view: serde_json::Value = serde_json::from_str(&get(&metrics, "/v1/autoscale")).unwrap();
    for m in view["models"].as_array().unwrap() {
        let want = if ["m0", "m1"].contains(&m["model"].as_str().unwrap()) {
            0
        } else {
            1
        };
        assert_eq!(m["subcluster"], want, "{view}");
        assert!(
            m["loading_at"].is_null() || m["loading_at"] == want,
            "{view}"
        );
    }
    let types = view["types"].as_array().unwrap();
    assert_eq!(types.len(), 2, "{view}");
    assert_eq!(types[0]["gpu_type"], "A100");
    assert_eq!(types[1]["gpus_in_service"], 1, "{view}");
    let text = get(&metrics, "/metrics");
    assert!(
        text.contains("fermata_gpu_type_advice_gpus{gpu_type=\"T4\",what=\"in_service\"} 1"),
        "{text}"
    );
    let reps = c.stop();
    let s = reps.scheduler.expect("scheduler report");
    assert_eq!(s["moves"]["started"], 0, "no model changes type: {s}");
    for b in &reps.backends {
        let b = b.as_ref().expect("backend report");
        assert_eq!(b["plans_refused"], 0, "{b}");
        assert_eq!(b["tasks_failed"], 0, "{b}");
        assert!(
            b["plans_run"].as_u64().unwrap() > 0,
            "both types serve: {b}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The body of `GET path` from the HTTP server at `addr`.
fn get(addr: &str, path: &str) -> String {
    fermata::harness::churn::http_get(addr, path).unwrap()
}
