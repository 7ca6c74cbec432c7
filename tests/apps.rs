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

/// A copy of models/apps in a fresh temporary folder whose application takes
/// its deadlines by `rule` (`fermata.deadline`). Removed when dropped.
struct RuleRepo(PathBuf);

impl RuleRepo {
    fn new(rule: &str) -> RuleRepo {
        let dir = std::env::temp_dir().join(format!("fermata-apps-{rule}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        copy_dir(&root().join("models/apps"), &dir);
        let cfg = dir.join("detect_classify/config.pbtxt");
        let text = std::fs::read_to_string(&cfg).unwrap();
        let from = r#"string_value: "slack-forwarding""#;
        assert!(text.contains(from), "{text}");
        std::fs::write(
            &cfg,
            text.replace(from, &format!(r#"string_value: "{rule}""#)),
        )
        .unwrap();
        RuleRepo(dir)
    }
}

impl Drop for RuleRepo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The value of the series `series` (name and labels) on `/metrics`.
fn metric(http: &str, series: &str) -> Option<f64> {
    let text = get(http, "/metrics");
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|x| x.parse().ok())
}

/// Under `latest-useful` a module request whose deadline passed is sent again
/// once, with its step's last deadline (the SLO less the least latency of the
/// steps after it), and the application request still ends once. A timeout of
/// 100 µs is shorter than a task's way from the frontend to a backend and its
/// run at batch 1: neither deadline can be met, so every request's detector
/// step is sent twice and the request ends expired. (At 400 µs a detector
/// step planned at once on an idle GPU sometimes finished in time and its
/// `mlp` step expired instead.) Under `slack-forwarding` nothing is sent
/// again.
#[test]
fn under_latest_useful_an_expired_module_request_is_sent_again_once() {
    const N: u64 = 4;
    let series = r#"fermata_app_module_resends_total{app="detect_classify"}"#;
    for (rule, resends) in [("latest-useful", Some(2 * N)), ("slack-forwarding", None)] {
        let repo = RuleRepo::new(rule);
        let (p, http, grpc) = procs::serve_apis(exe(), &repo.0, &[]).unwrap();
        run_client(
            &http,
            &grpc,
            &repo.0,
            &["--short-timeouts", &N.to_string(), "--timeout-us", "100"],
        );
        let got = metric(&http, series);
        let f = report(p);
        match resends {
            // Two clients (HTTP, gRPC), N requests each, one resend each.
            Some(n) => assert_eq!(got, Some(n as f64), "{rule}: {f}"),
            None => assert_eq!(got.unwrap_or(0.0), 0.0, "{rule}: {f}"),
        }
        assert_eq!(f["good"].as_u64(), Some(0), "{rule}: {f}");
        assert_eq!(f["failed"].as_u64(), Some(0), "{rule}: {f}");
        // Every module request, the resends included, ended once.
        let module_requests = 2 * N + resends.unwrap_or(0);
        assert_eq!(f["requests"].as_u64(), Some(module_requests), "{rule}: {f}");
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
