//! Triton's perf_analyzer against `fermata serve --executor onnx` over HTTP and
//! gRPC, in open-loop request-rate mode: for each rate a fresh server, then
//! perf_analyzer's client-side latency percentiles and throughput; then closed
//! loop at 1 and 64 connections (`--concurrency`), where the two protocols'
//! latencies on the same server show what each adds. Prints a JSON line per
//! run and, per model and protocol, the highest rate whose p99 is under the
//! model's SLO (a rate where perf_analyzer stopped on an error response, a
//! request dropped or late, does not count, nor one the client could not keep:
//! more than 1% of its requests sent late or a throughput 2% short) and
//! p50/p99 at 100 r/s. perf_analyzer runs on the same machine: on few cores
//! the client is what limits the highest rate.
//!
//!     cargo bench --bench perf_analyzer                 # mlp, HTTP and gRPC, the default rates
//!     cargo bench --bench perf_analyzer -- --models mlp,cnn --rates 100,1000,4000 \
//!         --protocols grpc --concurrency 1,64
//!
//! Needs scripts/setup.sh (ONNX Runtime, perf_analyzer). Run without `--bench`
//! (as `cargo test --all-targets` does) it makes one short run per protocol at
//! 100 r/s and one at 1 connection.

use fermata::harness::procs::{self, Proc};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh `serve --executor onnx` with HTTP and gRPC on ephemeral ports:
/// the process and the address of `protocol`'s API.
fn serve(protocol: &str) -> (Proc, String) {
    let exe = Path::new(env!("CARGO_BIN_EXE_fermata"));
    let (p, http, grpc) = procs::serve_apis(exe, &root().join("models"), &[]).expect("serve");
    (p, if protocol == "grpc" { grpc } else { http })
}

/// A number after `key` on a line of perf_analyzer's client section.
fn field(text: &str, key: &str) -> Option<f64> {
    let client = text.split("Client:").nth(1)?;
    client.lines().find_map(|l| {
        let v = l.trim().strip_prefix(key)?;
        v.split_whitespace().next()?.parse().ok()
    })
}

/// How perf_analyzer loads the server.
#[derive(Clone, Copy)]
enum Load {
    /// Open loop at this many requests/s.
    Rate(u32),
    /// Closed loop with this many requests outstanding (connections).
    Concurrency(u32),
}

/// One load: perf_analyzer's numbers, or the error it stopped on.
fn measure(model: &str, protocol: &str, load: Load, requests: u32) -> Value {
    let (p, addr) = serve(protocol);
    let mut cmd = Command::new(root().join("scripts/perf_analyzer"));
    cmd.args(["-m", model, "-u", &addr, "-i", protocol]);
    let (mode, n) = match load {
        Load::Rate(r) => {
            cmd.args([
                "--request-rate-range",
                &r.to_string(),
                "--max-threads",
                "64",
            ]);
            ("rate", r)
        }
        Load::Concurrency(c) => {
            cmd.args(["--concurrency-range", &c.to_string()]);
            ("concurrency", c)
        }
    };
    let out = cmd
        .args(["--measurement-mode", "count_windows"])
        .args(["--measurement-request-count", &requests.to_string()])
        .args(["--stability-percentage", "1000", "--max-trials", "5"])
        .output()
        .expect("scripts/perf_analyzer");
    let _ = p.stop(Duration::from_secs(10));
    let text = procs::output_text(&out);
    if !out.status.success() {
        // The first error it printed (a request answered with an error).
        let why = text
            .lines()
            .find(|l| l.contains("error:") || l.contains("Error"))
            .or_else(|| text.lines().rev().find(|l| !l.trim().is_empty()))
            .unwrap_or("perf_analyzer failed")
            .trim()
            .to_string();
        return json!({"model": model, "protocol": protocol, mode: n, "ok": false, "error": why});
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
        "model": model,
        "protocol": protocol,
        mode: n,
        "ok": true,
        "delayed_pct": delayed,
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
    // A comma-separated option's items, else the default.
    let list = |k: &str, default: &str| -> Vec<String> {
        opt(k)
            .unwrap_or_else(|| default.into())
            .split(',')
            .map(str::to_string)
            .collect()
    };
    let numbers = |k: &str, full_default: &str, smoke_default: &str| -> Vec<u32> {
        list(k, if full { full_default } else { smoke_default })
            .iter()
            .map(|x| {
                x.parse()
                    .unwrap_or_else(|_| panic!("{k}: `{x}` is not a number"))
            })
            .collect()
    };
    let models = list("--models", "mlp");
    let rates = numbers(
        "--rates",
        "100,500,1000,2000,4000,6000,8000,12000,16000",
        "100",
    );
    let requests = if full { 2000 } else { 100 };
    let protocols = list("--protocols", "http,grpc");
    let conns = numbers("--concurrency", "1,64", "1");
    if !root().join(".deps/pa/bin/perf_analyzer").exists() {
        eprintln!("perf_analyzer is not installed in .deps/pa: run scripts/setup.sh");
        std::process::exit(2);
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    for m in &models {
        let slo = slo_ms(m);
        for proto in &protocols {
            let mut best: Option<u32> = None;
            let mut light = Value::Null;
            for &r in &rates {
                let v = measure(m, proto, Load::Rate(r), requests);
                println!("{v}");
                if r == 100 {
                    light = v.clone();
                }
                // The rate counts when the client kept it (at most 1% of the
                // requests sent late, the throughput within 2% of it) and p99
                // is under the SLO.
                let kept = v["delayed_pct"].as_f64().is_some_and(|d| d <= 1.0)
                    && v["throughput"]
                        .as_f64()
                        .is_some_and(|t| t >= 0.98 * r as f64);
                let met = v["ok"] == true && kept && v["p99_ms"].as_f64().is_some_and(|p| p < slo);
                if met {
                    best = Some(best.map_or(r, |b| b.max(r)));
                }
            }
            // Closed loop at 1 and 64 connections: the latency each protocol
            // adds on the same server and model.
            let closed: Vec<Value> = conns
                .iter()
                .map(|&c| {
                    let v = measure(m, proto, Load::Concurrency(c), requests);
                    println!("{v}");
                    json!({"connections": c, "p50_ms": v["p50_ms"], "p99_ms": v["p99_ms"], "throughput": v["throughput"]})
                })
                .collect();
            println!(
                "{}",
                json!({
                    "model": m,
                    "protocol": proto,
                    "slo_ms": slo,
                    "cores": cores,
                    "highest_rate_p99_under_slo": best,
                    "at_100_rps": {"p50_ms": light["p50_ms"], "p99_ms": light["p99_ms"]},
                    "closed_loop": closed,
                })
            );
        }
    }
}
