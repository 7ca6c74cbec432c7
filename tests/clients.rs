//! The ecosystem's own clients against `fermata serve --executor onnx` (the
//! shipped models): Triton's `tritonclient.http` (sync and aio,
//! tests/clients/triton_http.py) and `tritonclient.grpc` (sync, stream and
//! aio, tests/clients/triton_grpc.py), each call that failed once
//! and the error cases with their status and message; KServe's REST and gRPC
//! clients (tests/clients/kserve_clients.py); Triton's perf_analyzer
//! over HTTP and gRPC; then the serve's report: every request ended exactly
//! once, none failed.
//!
//! Needs python3 with the packages `scripts/setup.sh` installs into .deps/py
//! (tritonclient, onnxruntime, numpy) and perf_analyzer in .deps/pa; without
//! them it fails with the setup hint, it does not skip.

use fermata::harness::procs::{self, Proc};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `fermata serve --executor onnx` with HTTP and gRPC on ephemeral ports: the
/// process and the two addresses (host:port).
fn serve(extra: &[&str]) -> (Proc, String, String) {
    let exe = Path::new(env!("CARGO_BIN_EXE_fermata"));
    procs::serve_apis(exe, &root().join("models"), extra).unwrap()
}

/// Runs a client script of tests/clients with `--models` and `args`, the
/// folders `deps` (under .deps, the first one holding `package`) on its
/// PYTHONPATH; panics with its output when it fails.
fn run_client(script: &str, args: &[&str], deps: &[&str], package: &str) {
    let dirs: Vec<PathBuf> = deps.iter().map(|d| root().join(".deps").join(d)).collect();
    assert!(
        dirs[0].join(package).exists(),
        "{package} is not installed in {}: run scripts/setup.sh",
        dirs[0].display()
    );
    let out = Command::new("python3")
        .arg(root().join("tests/clients").join(script))
        .args(args)
        .arg("--models")
        .arg(root().join("models"))
        .env("PYTHONPATH", std::env::join_paths(&dirs).unwrap())
        .output()
        .expect("python3");
    let text = procs::output_text(&out);
    eprintln!("{text}");
    assert!(out.status.success(), "{script} failed:\n{text}");
    assert!(text.contains("checks passed"), "{text}");
}

/// The serve's report (its last line): every request ended once, none failed.
fn check_report(p: Proc) {
    let last = p.stop(Duration::from_secs(20)).expect("a report");
    let rep: Value = serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last}"));
    let f = &rep["frontends"][0];
    let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k} in {f}"));
    assert!(n("requests") > 0, "{f}");
    assert_eq!(
        n("good") + n("late") + n("dropped") + n("failed"),
        n("requests"),
        "{f}"
    );
    assert_eq!(n("failed"), 0, "{f}");
}

#[test]
fn tritonclient_http_works_unchanged() {
    // A body limit of 8 MiB, so that the script's compressed body that inflates
    // to 9 MiB is refused (413).
    let (p, addr, _) = serve(&["--http-max-body-bytes", "8388608"]);
    run_client("triton_http.py", &["--url", &addr], &["py"], "tritonclient");
    check_report(p);
}

/// A model repository in a fresh temporary folder, the shipped models' files
/// copied into it. Removed when dropped.
struct Repo(PathBuf);

impl Repo {
    fn shipped(tag: &str) -> Repo {
        let dir = std::env::temp_dir().join(format!("fermata-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(root().join("models")).unwrap() {
            let f = e.unwrap().path();
            if f.is_file() {
                std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
            }
        }
        Repo(dir)
    }

    /// The shipped models and the two models of a BYTES input that
    /// tests/clients/strings_models.py writes (`tagger`, `pair_tagger`),
    /// profiled with `fermata profile` as a user would.
    fn with_strings(tag: &str) -> Repo {
        let repo = Repo::shipped(tag);
        let dir = &repo.0;
        let out = Command::new("python3")
            .arg(root().join("tests/clients/strings_models.py"))
            .arg(dir)
            .env("PYTHONPATH", root().join(".deps/py"))
            .output()
            .expect("python3");
        assert!(out.status.success(), "{}", procs::output_text(&out));
        for m in ["tagger", "pair_tagger"] {
            let out = Command::new(env!("CARGO_BIN_EXE_fermata"))
                .args(["profile", "--repeats", "5", "--warmup", "1", "--model"])
                .arg(dir.join(format!("{m}.onnx")))
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", procs::output_text(&out));
        }
        repo
    }

    /// Sets `model`'s `slo_ms` in its JSON file.
    fn set_slo_ms(&self, model: &str, slo_ms: f64) {
        let path = self.0.join(format!("{model}.json"));
        let mut meta: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        meta["slo_ms"] = slo_ms.into();
        std::fs::write(&path, serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
    }
}

impl Drop for Repo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Triton's own HTTP protocol tests (qa/L0_http), adapted to Fermata
/// (tests/clients/l0_http.py: each keeps the name of the test it adapts; the
/// Triton-only ones are skipped with the reason), on the shipped models and
/// the two of a BYTES input. The body limit is small (2 MiB) so that the
/// size-limit tests stay quick.
#[test]
fn triton_l0_http_adapted() {
    const MAX_BODY: &str = "2097152";
    let repo = Repo::with_strings("l0-http");
    let exe = Path::new(env!("CARGO_BIN_EXE_fermata"));
    let (p, addr, _) =
        procs::serve_apis(exe, &repo.0, &["--http-max-body-bytes", MAX_BODY]).unwrap();
    run_client(
        "l0_http.py",
        &["--url", &addr, "--max-body", MAX_BODY],
        &["py", "kserve"],
        "tritonclient",
    );
    check_report(p);
}

/// BYTES (string) inputs through tritonclient.http (JSON and binary),
/// tritonclient.grpc (typed and raw contents) and a raw HTTP body, run by ONNX
/// Runtime's string tensors; the error cases with their status and message
/// (tests/clients/strings_clients.py).
#[test]
fn bytes_inputs_through_the_clients() {
    let repo = Repo::with_strings("bytes");
    let exe = Path::new(env!("CARGO_BIN_EXE_fermata"));
    let (p, addr, grpc) = procs::serve_apis(exe, &repo.0, &[]).unwrap();
    run_client(
        "strings_clients.py",
        &["--url", &addr, "--grpc", &grpc],
        &["py", "kserve"],
        "tritonclient",
    );
    check_report(p);
}

/// KServe's InferenceRESTClient and InferenceGRPCClient (the `kserve`
/// package, in .deps/kserve, with onnxruntime from .deps/py for the
/// reference outputs).
#[test]
fn kserve_clients_work_unchanged() {
    let (p, http, grpc) = serve(&[]);
    let args = ["--url", &http, "--grpc-url", &grpc];
    run_client("kserve_clients.py", &args, &["kserve", "py"], "kserve");
    check_report(p);
}

#[test]
fn tritonclient_grpc_works_unchanged() {
    let (p, _, addr) = serve(&[]);
    run_client("triton_grpc.py", &["--url", &addr], &["py"], "tritonclient");
    check_report(p);
}

/// Model control with Triton's clients over HTTP and gRPC: only the
/// `--load-model` model is loaded at start, the others load and unload on
/// request, an unload under load ends every request once; the serve's report
/// then has no failed request.
#[test]
fn tritonclient_model_control_over_http_and_grpc() {
    let (p, http, grpc) = serve(&["--model-control-mode", "explicit", "--load-model", "cnn"]);
    run_client(
        "model_control.py",
        &["--url", &http, "--grpc", &grpc],
        &["py"],
        "tritonclient",
    );
    check_report(p);
}

/// Triton's perf_analyzer (scripts/setup.sh installs it into .deps/pa) in
/// open-loop request-rate mode over HTTP and over gRPC: it reads the model's
/// config, sends at the rate, reads the server-side statistics, and ends
/// without an error.
#[test]
fn perf_analyzer_runs_open_loop_over_http_and_grpc() {
    let pa = root().join("scripts/perf_analyzer");
    assert!(
        root().join(".deps/pa/bin/perf_analyzer").exists(),
        "perf_analyzer is not installed in .deps/pa: run scripts/setup.sh"
    );
    // perf_analyzer stops at the first error response, and a request that
    // ends late, dropped or refused at the door is one: what this test is
    // about is the protocol, not the deadlines, so `mlp` gets an SLO of a
    // second here (the shipped 20 ms is tight for a debug build on 2 cores
    // shared with the other tests).
    let repo = Repo::shipped("perf-analyzer");
    repo.set_slo_ms("mlp", 1000.0);
    let exe = Path::new(env!("CARGO_BIN_EXE_fermata"));
    let (p, http, grpc) = procs::serve_apis(exe, &repo.0, &[]).unwrap();
    for (protocol, addr) in [("http", &http), ("grpc", &grpc)] {
        let run = || {
            let out = Command::new(&pa)
                .args(["-m", "mlp", "-u", addr, "-i", protocol])
                .args(["--request-rate-range", "100"])
                .args(["--measurement-mode", "count_windows"])
                .args(["--measurement-request-count", "200"])
                // Stability is not what this test is about (2 shared cores).
                .args(["--stability-percentage", "1000", "--max-trials", "20"])
                .output()
                .expect("perf_analyzer");
            let text = procs::output_text(&out);
            eprintln!("{protocol}:\n{text}");
            (out, text)
        };
        // A stall of a second on a loaded runner can still end a request
        // late: run it again, at most four times more.
        let transient = |t: &str| {
            t.contains("dropped (")
                || t.contains("deadline exceeded")
                || t.contains("refused at the door")
        };
        let (mut out, mut text) = run();
        for _ in 0..4 {
            if out.status.success() || !transient(&text) {
                break;
            }
            (out, text) = run();
        }
        assert!(
            out.status.success(),
            "perf_analyzer -i {protocol} failed:\n{text}"
        );
        assert!(text.contains("Request Rate: 100"), "{text}");
        // Its server-side section comes from the model's statistics.
        let server = text.split("Server:").nth(1).expect("a Server: section");
        let count: u64 = server
            .lines()
            .find_map(|l| l.trim().strip_prefix("Inference count: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no inference count in {server}"));
        assert!(count >= 200, "{protocol}: {server}");
    }
    check_report(p);
}
