//! The ecosystem's own clients against `fermata serve --executor onnx` (the
//! shipped models): Triton's `tritonclient.http` (sync and aio) through
//! tests/clients/triton_http.py, each call that failed before issue 16 and the
//! error cases with their status and message; then the serve's report: every
//! request ended exactly once, none failed.
//!
//! Needs python3 with the packages `scripts/setup.sh` installs into .deps/py
//! (tritonclient, onnxruntime, numpy); without them it fails with the setup
//! hint, it does not skip.

use fermata::harness::procs::Proc;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `fermata serve --executor onnx` on an ephemeral port: the process and its
/// HTTP address (host:port).
fn serve(extra: &[&str]) -> (Proc, String) {
    let mut args: Vec<String> = [
        "serve",
        "--executor",
        "onnx",
        "--http-port",
        "0",
        "--models",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(root().join("models").display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    let exe = Path::new(env!("CARGO_BIN_EXE_fermata"));
    let mut p = Proc::spawn(exe, "serve", &args, false).unwrap();
    let addr = p
        .wait_for("the HTTP address", Duration::from_secs(60), |l| {
            l.split("http://")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .map(str::to_string)
        })
        .unwrap();
    (p, addr)
}

/// Runs a client script of tests/clients with .deps/py on the path; panics
/// with its output when it fails.
fn run_client(script: &str, url: &str) {
    let py = root().join(".deps/py");
    assert!(
        py.join("tritonclient").exists(),
        "tritonclient is not installed in {}: run scripts/setup.sh",
        py.display()
    );
    let out = Command::new("python3")
        .arg(root().join("tests/clients").join(script))
        .args(["--url", url, "--models"])
        .arg(root().join("models"))
        .env("PYTHONPATH", &py)
        .output()
        .expect("python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
    let (p, addr) = serve(&["--http-max-body-bytes", "8388608"]);
    run_client("triton_http.py", &addr);
    check_report(p);
}
