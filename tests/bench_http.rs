//! `fermata bench http` as a process: a short sweep of one shipped model gives a
//! JSON row with answered requests and every field; bad flags fail clearly
//! before any server starts; injected stalls are counted. Needs ONNX Runtime (`scripts/setup.sh`), as the
//! `serve --executor onnx` it starts does.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fermata(args: &[&str]) -> Output {
    Command::new(PathBuf::from(env!("CARGO_BIN_EXE_fermata")))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args(["bench", "http"])
        .args(args)
        .output()
        .expect("run fermata")
}

/// One run of mlp at 50 r/s, 0.5 s of warm-up and 1 s measured, JSON out,
/// with `extra` flags.
fn short_sweep(extra: &[&str]) -> Output {
    let mut args = vec![
        "--models",
        "models",
        "--model",
        "mlp",
        "--rates",
        "50",
        "--duration-s",
        "1",
        "--warmup-s",
        "0.5",
        "--json",
    ];
    args.extend_from_slice(extra);
    fermata(&args)
}

#[test]
fn a_short_sweep_gives_a_row_with_answers_and_every_field() {
    // Server and client on CPU 0 (a 1-CPU host has only that one).
    let out = short_sweep(&[
        "--warm-conns",
        "8",
        "--server-cpus",
        "0",
        "--client-cpus",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document: {e}\n{stderr}"));
    let rows = v.as_array().expect("an array of rows");
    assert_eq!(rows.len(), 1, "{v}");
    let r = &rows[0];
    assert_eq!(r["model"], "mlp");
    assert_eq!(r["rate_rps"], 50.0);
    assert_eq!(r["slo_ms"], 20.0);
    assert_eq!(r["rep"], 1);
    // The outcomes an offered request can end in, one each.
    let outcomes = [
        "ok",
        "late_200",
        "status_429",
        "status_503",
        "status_504",
        "other_status",
        "transport_errors",
        "conn_limit",
        "unanswered",
    ];
    for f in outcomes.into_iter().chain([
        "offered",
        "sent",
        "bad",
        "bad_pct",
        "latency_p50_ms",
        "latency_p99_ms",
        "client_lag_p99_ms",
        "conns_opened",
        "server",
    ]) {
        assert!(r.get(f).is_some(), "no `{f}` in {r}");
    }
    let n = |f: &str| r[f].as_u64().unwrap_or_else(|| panic!("{f} in {r}"));
    assert!(n("ok") > 0, "{r}");
    assert!(n("offered") >= n("sent") && n("sent") >= n("ok"), "{r}");
    // Every offered request ends in exactly one outcome.
    let ended: u64 = outcomes.iter().map(|f| n(f)).sum();
    assert_eq!(ended, n("offered"), "{r}");
    assert_eq!(n("bad"), n("offered") - n("ok"), "{r}");
    assert!(r["latency_p50_ms"].as_f64().unwrap() > 0.0, "{r}");
    // The warm connections were open before the first request, and count.
    assert!(n("conns_opened") >= 8 && n("conns_peak") >= 8, "{r}");
    // The server's own report, warm-up included, saw at least what was counted.
    assert!(
        r["server"]["requests"].as_u64().unwrap() >= n("sent"),
        "{r}"
    );
    // The door's own figures, read from the server's /metrics: the series
    // are there (refusals of each reason, the head's wait), and the door's
    // 429s are a part of the 429s.
    let door = &r["door"];
    for f in ["refused_deadline", "refused_queue", "refused_backlog"] {
        assert!(door[f].as_u64().is_some(), "no door.{f} in {r}");
    }
    assert!(door["head_mean_ms"].as_f64().unwrap() > 0.0, "{r}");
    assert!(n("door_429") <= n("status_429"), "{r}");
    // The verdict line against the front door's bar.
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("mlp: sustains 50 r/s") || l.starts_with("mlp: no rate had")),
        "{stderr}"
    );
}

/// An application (the ensemble `detect_classify` of models/apps) is driven like
/// a model: its own inputs, at `/v2/models/detect_classify/infer`, bad against
/// its own SLO.
#[test]
fn an_application_is_swept_like_a_model() {
    let out = fermata(&[
        "--models",
        "models/apps",
        "--model",
        "detect_classify",
        "--rates",
        "30",
        "--duration-s",
        "1",
        "--warmup-s",
        "0.5",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document: {e}\n{stderr}"));
    let r = &v[0];
    assert_eq!(r["model"], "detect_classify", "{v}");
    let slo = fermata::triton_ensemble::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("models/apps/detect_classify"),
    )
    .expect("the shipped ensemble")
    .slo_ms;
    assert_eq!(r["slo_ms"].as_f64(), Some(slo), "{r}");
    let n = |f: &str| r[f].as_u64().unwrap_or_else(|| panic!("{f} in {r}"));
    assert!(n("ok") > 0, "{r}");
    assert_eq!(n("other_status") + n("transport_errors"), 0, "{r}");
}

#[test]
fn bad_flags_fail_before_any_server_starts() {
    for (args, says) in [
        (&["--rates", ""][..], "--rates"),
        (&["--rates", "0"][..], "--rates"),
        (&["--rates", "-100"][..], "must be positive"),
        (&["--rates", "100,x"][..], "not a number"),
        (&["--duration-s", "0"][..], "--duration-s"),
        (&["--warmup-s", "-1"][..], "--warmup-s"),
        (&["--reps", "0"][..], "--reps"),
        (
            &["--warm-conns", "5000"][..],
            "--warm-conns must be at most 2048",
        ),
        (
            &["--model", "nope"][..],
            "no such model or application in models (it has cnn, mlp, ranker)",
        ),
        (&["--policy", "bogus"][..], "--policy"),
        (&["--stall", "20"][..], "expected MS@S"),
        (&["--stall", "300@0.5"][..], "at most 50% of the time"),
        (&["--models", "no/such/dir"][..], "no/such/dir"),
        (
            &["--server-cpus", "1023"][..],
            "--server-cpus: CPU 1023 is not one this process may use",
        ),
        (&["--client-cpus", "0-x"][..], "--client-cpus"),
    ] {
        let out = fermata(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// `--stall`: where this process may run real-time threads (root), each run
/// reports the stalls injected into its measured window (warm-up 0.5 s, window
/// 1 s, one per 0.3 s: at 0.8, 1.1 and 1.4 s); elsewhere the sweep stops
/// before any server starts and says why. The stalls last 20 ms: a stall
/// thread woken after its stall's end injects none (and counts none), and
/// with 2 ms stalls a run under a full test suite's load on 2 cores once
/// counted 2 of 3.
#[test]
fn injected_stalls_are_counted_or_refused_clearly() {
    let out = short_sweep(&["--stall", "20@0.3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(v[0]["stalls"], 3, "{v}");
        assert!(stderr.contains("3 stall(s) injected"), "{stderr}");
    } else {
        assert!(stderr.contains("SCHED_FIFO"), "{stderr}");
        assert!(!stderr.contains("rep 1"), "a run started: {stderr}");
    }
}
