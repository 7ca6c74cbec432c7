//! Applications (ensembles) served over HTTP and gRPC, tested with Triton's own
//! clients (tests/clients/triton_apps.py) against `fermata serve --executor
//! onnx --models models/apps`: the ensemble `detect_classify` (a detector
//! whose items fan out to `mlp`) with fan-out 0, 1 and many, outputs equal to
//! the two models run in sequence with ONNX Runtime, an expired module request
//! and a failed one each ending their application request once.
//!
//! Needs python3 with the packages `scripts/setup.sh` installs into .deps/py
//! (tritonclient, onnxruntime, onnx, numpy); without them it fails with the
//! setup hint, it does not skip.

use fermata::harness::procs::{self, Proc};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_fermata"))
}

/// Runs tests/clients/triton_apps.py against the serve's two APIs with the
/// repository `models` and `extra` arguments; panics with its output when it
/// fails.
fn run_client(http: &str, grpc: &str, models: &Path, extra: &[&str]) {
    let py = root().join(".deps/py");
    assert!(
        py.join("tritonclient").exists(),
        "tritonclient is not installed in {}: run scripts/setup.sh",
        py.display()
    );
    let out = Command::new("python3")
        .arg(root().join("tests/clients/triton_apps.py"))
        .args(["--http", http, "--grpc", grpc, "--models"])
        .arg(models)
        .args(extra)
        .env("PYTHONPATH", &py)
        .output()
        .expect("python3");
    let text = procs::output_text(&out);
    eprintln!("{text}");
    assert!(out.status.success(), "triton_apps.py failed:\n{text}");
    assert!(text.contains("all checks passed"), "{text}");
}

/// The serve's report (its last line): its first frontend's counts, each
/// module request ended exactly once.
fn report(p: Proc) -> Value {
    let last = p.stop(Duration::from_secs(20)).expect("a report");
    let rep: Value = serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last}"));
    let f = rep["frontends"][0].clone();
    let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k} in {f}"));
    assert!(n("requests") > 0, "{f}");
    assert_eq!(
        n("good") + n("late") + n("dropped") + n("failed"),
        n("requests"),
        "{f}"
    );
    f
}

#[test]
fn an_ensemble_over_http_and_grpc_with_tritonclient() {
    let models = root().join("models/apps");
    let (p, http, grpc) = procs::serve_apis(exe(), &models, &[]).unwrap();
    run_client(&http, &grpc, &models, &[]);
    // The frontend measured the fan-out of detector -> mlp: the client sent
    // fan-outs of 0, 1 and many, at most 8 items per detector output.
    let stats: Value =
        serde_json::from_str(&get(&http, "/v2/models/detect_classify/stats")).unwrap();
    let fan = &stats["model_stats"][0]["fermata_fanout"];
    assert_eq!(fan.as_array().map(|a| a.len()), Some(1), "{stats}");
    assert_eq!(fan[0]["from"], "detector", "{fan}");
    assert_eq!(fan[0]["to"], "mlp", "{fan}");
    let (outputs, items) = (
        fan[0]["outputs"].as_u64().unwrap(),
        fan[0]["items"].as_u64().unwrap(),
    );
    assert!(outputs > 0 && items > 0 && items <= 8 * outputs, "{fan}");
    // The same counts on /metrics.
    let text = get(&http, "/metrics");
    let edge = "{app=\"detect_classify\",from=\"detector\",to=\"mlp\"}";
    for (name, v) in [
        ("fermata_app_fanout_outputs_total", outputs),
        ("fermata_app_fanout_items_total", items),
    ] {
        let series = format!("{name}{edge} ");
        let got = text
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|x| x.parse::<f64>().ok());
        assert_eq!(got, Some(v as f64), "`{series}` in\n{text}");
    }
    let f = report(p);
    assert_eq!(f["failed"].as_u64(), Some(0), "{f}");
}

/// The body of `GET path` from the HTTP server at `addr`.
fn get(addr: &str, path: &str) -> String {
    fermata::harness::churn::http_get(addr, path).unwrap()
}

/// A copy of models/apps in a fresh temporary folder with the application
/// `detect_lookup`, whose second step fails in ONNX Runtime when the
/// detector counts two items or more (tests/clients/apps_models.py).
/// Removed when dropped.
struct FailingRepo(PathBuf);

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

impl FailingRepo {
    fn new() -> FailingRepo {
        let dir = std::env::temp_dir().join(format!("fermata-apps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        copy_dir(&root().join("models/apps"), &dir);
        let out = Command::new("python3")
            .arg(root().join("tests/clients/apps_models.py"))
            .arg(&dir)
            .env("PYTHONPATH", root().join(".deps/py"))
            .output()
            .expect("python3");
        assert!(out.status.success(), "{}", procs::output_text(&out));
        FailingRepo(dir)
    }
}

impl Drop for FailingRepo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_failed_module_request_fails_its_application_request_once() {
    let repo = FailingRepo::new();
    let (p, http, grpc) = procs::serve_apis(exe(), &repo.0, &[]).unwrap();
    run_client(&http, &grpc, &repo.0, &["--failing"]);
    let f = report(p);
    // One lookup failed per API (HTTP, gRPC); every other module request
    // was good.
    assert_eq!(f["failed"].as_u64(), Some(2), "{f}");
    assert_eq!(f["dropped"].as_u64(), Some(0), "{f}");
}
