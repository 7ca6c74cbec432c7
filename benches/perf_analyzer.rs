//! Triton's perf_analyzer against `fermata serve --executor onnx` over HTTP, in
//! open-loop request-rate mode: for each rate a fresh server, then
//! perf_analyzer's client-side latency percentiles and throughput. Prints a
//! JSON line per rate and, per model, the highest rate whose p99 is under the
//! model's SLO (a rate where perf_analyzer stopped on an error response, a
//! request dropped or late, does not count, nor one the client could not keep:
//! more than 1% of its requests sent late or a throughput 2% short) and
//! p50/p99 at 100 r/s. perf_analyzer runs on the same machine: on few cores
//! the client is what limits the highest rate.
//!
//!     cargo bench --bench perf_analyzer                       # mlp, the default rates
//!     cargo bench --bench perf_analyzer -- --models mlp,cnn --rates 100,1000,4000
//!
//! Needs scripts/setup.sh (ONNX Runtime, perf_analyzer). Run without `--bench`
//! (as `cargo test --all-targets` does) it makes one short run at 100 r/s.

use fermata::harness::procs::Proc;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh `serve --executor onnx` on an ephemeral port.
fn serve() -> (Proc, String) {
    let models = root().join("models").display().to_string();
    let args: Vec<String> = [
        "serve",
        "--executor",
        "onnx",
        "--http-port",
        "0",
        "--http-drain-ready-ms",
        "0",
        "--models",
        &models,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let exe = Path::new(env!("CARGO_BIN_EXE_fermata"));
    let mut p = Proc::spawn(exe, "serve", &args, false).expect("serve");
    let addr = p
        .wait_for("the HTTP address", Duration::from_secs(60), |l| {
            l.split("http://")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .map(str::to_string)
        })
        .expect("serve's address");
    (p, addr)
}

/// A number after `key` on a line of perf_analyzer's client section.
fn field(text: &str, key: &str) -> Option<f64> {
    let client = text.split("Client:").nth(1)?;
    client.lines().find_map(|l| {
        let v = l.trim().strip_prefix(key)?;
        v.split_whitespace().next()?.parse().ok()
    })
}

/// One rate: perf_analyzer's numbers, or the error it stopped on.
fn measure(model: &str, rate: u32, requests: u32) -> Value {
    let (p, addr) = serve();
    let out = Command::new(root().join("scripts/perf_analyzer"))
        .args(["-m", model, "-u", &addr])
        .args(["--request-rate-range", &rate.to_string()])
        .args(["--measurement-mode", "count_windows"])
        .args(["--measurement-request-count", &requests.to_string()])
        .args(["--stability-percentage", "1000", "--max-trials", "5"])
        .args(["--max-threads", "64"])
        .output()
        .expect("scripts/perf_analyzer");
    let _ = p.stop(Duration::from_secs(10));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        // The first error it printed (a request answered with an error).
        let why = text
            .lines()
            .find(|l| l.contains("error:") || l.contains("Error"))
            .or_else(|| text.lines().rev().find(|l| !l.trim().is_empty()))
            .unwrap_or("perf_analyzer failed")
            .trim()
            .to_string();
        return json!({"model": model, "rate": rate, "ok": false, "error": why});
    }
    let us = |k: &str| field(&text, k).map(|v| v / 1e3);
    // "[WARNING] Perf Analyzer was not able to keep up with the desired request
    // rate. X% of the requests were delayed."
    let delayed = text
        .lines()
        .find(|l| l.contains("requests were delayed"))
        .and_then(|l| l.split('%').next())
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|x| x.parse::<f64>().ok())
        .unwrap_or(0.0);
    json!({
        "delayed_pct": delayed,
        "model": model,
        "rate": rate,
        "ok": true,
        "throughput": field(&text, "Throughput:"),
        "p50_ms": us("p50 latency:"),
        "p99_ms": us("p99 latency:"),
        "avg_ms": us("Avg latency:"),
    })
}

fn slo_ms(model: &str) -> f64 {
    let text = std::fs::read_to_string(root().join("models").join(format!("{model}.json")))
        .expect("the model's metadata");
    let v: Value = serde_json::from_str(&text).expect("metadata JSON");
    v["slo_ms"].as_f64().expect("slo_ms")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let full = args.iter().any(|a| a == "--bench");
    let opt = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let models: Vec<String> = opt("--models")
        .unwrap_or_else(|| "mlp".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let rates: Vec<u32> = match opt("--rates") {
        Some(r) => r.split(',').map(|x| x.parse().expect("a rate")).collect(),
        None if full => vec![100, 500, 1000, 2000, 4000, 6000, 8000, 12000, 16000],
        None => vec![100],
    };
    let requests = if full { 2000 } else { 100 };
    if !root().join(".deps/pa/bin/perf_analyzer").exists() {
        eprintln!("perf_analyzer is not installed in .deps/pa: run scripts/setup.sh");
        std::process::exit(2);
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    for m in &models {
        let slo = slo_ms(m);
        let mut best: Option<u32> = None;
        let mut light = Value::Null;
        for &r in &rates {
            let v = measure(m, r, requests);
            println!("{v}");
            if r == 100 {
                light = v.clone();
            }
            // The rate counts when the client kept it (at most 1% of the
            // requests sent late, the throughput within 2% of it) and p99 is
            // under the SLO.
            let kept = v["delayed_pct"].as_f64().is_some_and(|d| d <= 1.0)
                && v["throughput"]
                    .as_f64()
                    .is_some_and(|t| t >= 0.98 * r as f64);
            let met = v["ok"] == true && kept && v["p99_ms"].as_f64().is_some_and(|p| p < slo);
            if met {
                best = Some(best.map_or(r, |b| b.max(r)));
            }
        }
        println!(
            "{}",
            json!({
                "model": m,
                "slo_ms": slo,
                "cores": cores,
                "highest_rate_p99_under_slo": best,
                "at_100_rps": {"p50_ms": light["p50_ms"], "p99_ms": light["p99_ms"]},
            })
        );
    }
}
