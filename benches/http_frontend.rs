//! The KServe v2 HTTP frontend: admission rate and the latency the HTTP layer adds.
//!
//! An in-process cluster (in-process transport, 8 emulated GPUs, one model with
//! FP32 [-1, 16] in and INT64 [-1, 2] out, a cheap profile and the eager policy, so
//! the GPUs are not the bottleneck) serves HTTP on loopback. A closed-loop load
//! generator on its own tokio thread keeps N keep-alive HTTP/1.1 connections busy
//! (each sends its next request when the previous answer arrives) for a few seconds
//! per level and reports:
//!
//! * requests/s answered 200 (admitted and served);
//! * end-to-end latency p50/p99 as the client sees it;
//! * the frontend's internal latency (receipt to answer, `fermata_latency_us` in the
//!   response) p50/p99;
//! * the latency the HTTP layer adds: end-to-end minus internal, per request,
//!   p50/p99 (parsing and checking the request, the hand-over to the frontend's
//!   loop and back, building the response, the loopback socket both ways).
//!
//! `cargo bench --bench http_frontend` runs the full measurement (3 s per level);
//! under `cargo test --all-targets` (no `--bench`) it runs a short smoke pass.

use fermata::node::http::HttpOpts;
use fermata::node::serve::{Cluster, ClusterOpts};
use fermata::repo::ModelMeta;
use fermata::transport::{inproc::InProc, Transport};
use fermata::workload::Workload;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const WORKLOAD: &str = r#"
name = "http_bench"
gpus = 8
policy = "eager"
[[models]]
name = "m"
alpha_ms = 0.01
beta_ms = 0.1
slo_ms = 100
max_batch = 64
input_bytes = 64
"#;

/// One level's numbers.
#[derive(Default)]
struct Level {
    ok: u64,
    other: u64,
    e2e: Option<Histogram<u64>>,
    internal: Option<Histogram<u64>>,
    added: Option<Histogram<u64>>,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram")
}

/// One request on a keep-alive connection: returns (status, body).
async fn request(
    r: &mut BufReader<TcpStream>,
    head: &[u8],
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>, Option<usize>)> {
    r.get_mut().write_all(head).await?;
    r.get_mut().write_all(body).await?;
    let mut line = String::new();
    r.read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut len = 0usize;
    let mut json_len = None;
    loop {
        line.clear();
        r.read_line(&mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            if k == "content-length" {
                len = v.trim().parse().unwrap_or(0);
            } else if k == "inference-header-content-length" {
                json_len = v.trim().parse().ok();
            }
        }
    }
    let mut b = vec![0; len];
    r.read_exact(&mut b).await?;
    Ok((status, b, json_len))
}

async fn client(addr: SocketAddr, binary: bool, until: Instant) -> Level {
    let s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let mut r = BufReader::new(s);
    let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.5).collect();
    let (head_json, bin) = if binary {
        let v = json!({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 64}}],
                       "parameters": {"binary_data_output": true}});
        let bin: Vec<u8> = x.iter().flat_map(|f| f.to_le_bytes()).collect();
        (v.to_string(), bin)
    } else {
        let v = json!({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": x}]});
        (v.to_string(), Vec::new())
    };
    let mut body = head_json.clone().into_bytes();
    body.extend_from_slice(&bin);
    let mut head = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: bench\r\nContent-Length: {}\r\n",
        body.len()
    );
    if binary {
        head.push_str(&format!(
            "Inference-Header-Content-Length: {}\r\n",
            head_json.len()
        ));
    }
    head.push_str("\r\n");
    let mut lv = Level {
        e2e: Some(hist()),
        internal: Some(hist()),
        added: Some(hist()),
        ..Level::default()
    };
    while Instant::now() < until {
        let t0 = Instant::now();
        let Ok((status, b, jl)) = request(&mut r, head.as_bytes(), &body).await else {
            break;
        };
        let e2e = t0.elapsed().as_nanos() as u64;
        if status != 200 {
            lv.other += 1;
            continue;
        }
        lv.ok += 1;
        let v: Value = serde_json::from_slice(&b[..jl.unwrap_or(b.len())]).expect("json");
        let internal = (v["parameters"]["fermata_latency_us"]
            .as_f64()
            .unwrap_or(0.0)
            * 1e3) as u64;
        let _ = lv.e2e.as_mut().unwrap().record(e2e.max(1));
        let _ = lv.internal.as_mut().unwrap().record(internal.max(1));
        let _ = lv
            .added
            .as_mut()
            .unwrap()
            .record(e2e.saturating_sub(internal).max(1));
    }
    lv
}

fn run_level(addr: SocketAddr, conns: usize, binary: bool, secs: f64) -> (Level, f64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(secs);
    let parts: Vec<Level> = rt.block_on(async {
        let hs: Vec<_> = (0..conns)
            .map(|_| tokio::spawn(client(addr, binary, until)))
            .collect();
        let mut v = Vec::new();
        for h in hs {
            v.push(h.await.expect("client task"));
        }
        v
    });
    let wall = t0.elapsed().as_secs_f64();
    let mut all = Level {
        e2e: Some(hist()),
        internal: Some(hist()),
        added: Some(hist()),
        ..Level::default()
    };
    for p in parts {
        all.ok += p.ok;
        all.other += p.other;
        for (a, b) in [
            (&mut all.e2e, p.e2e),
            (&mut all.internal, p.internal),
            (&mut all.added, p.added),
        ] {
            a.as_mut().unwrap().add(b.unwrap()).expect("same bounds");
        }
    }
    (all, wall)
}

fn main() {
    let full = std::env::args().skip(1).any(|a| a == "--bench");
    let secs = if full { 3.0 } else { 0.3 };
    let mut w = Workload::from_toml(WORKLOAD, None).expect("workload");
    w.models[0].meta = Some(
        ModelMeta::from_json(
            r#"{"name":"m","slo_ms":100,"max_batch":64,
                "inputs":[{"name":"x","datatype":"FP32","shape":[-1,16]}],
                "outputs":[{"name":"y","datatype":"INT64","shape":[-1,2]}]}"#,
        )
        .expect("meta"),
    );
    let tr: Arc<dyn Transport> = Arc::new(InProc::global());
    let co = ClusterOpts {
        host: "http-bench".into(),
        region_bytes: 256 << 20,
        http: Some(HttpOpts::new("127.0.0.1:0")),
        ..ClusterOpts::default()
    };
    let c = Cluster::start(tr, &w, &co).expect("cluster");
    let addr = c.frontends[0].http_addr().expect("http");
    // Warm-up: the network budget gets measured, connections and caches warm.
    let _ = run_level(addr, 4, false, if full { 1.0 } else { 0.1 });
    println!(
        "http_frontend ({}): closed loop, keep-alive, {secs} s per level; latencies in us",
        if full { "bench" } else { "smoke (no --bench)" }
    );
    println!(
        "{:<7} {:>5} {:>10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "body",
        "conns",
        "req/s ok",
        "non200",
        "e2e p50",
        "e2e p99",
        "fe p50",
        "fe p99",
        "add p50",
        "add p99"
    );
    let levels: &[(usize, bool)] = if full {
        // Rising load, both encodings at each level: a level inherits the network
        // budget the previous one left (its p99.9 control delay), so a light level
        // must not follow a flood.
        &[
            (1, false),
            (1, true),
            (4, false),
            (16, false),
            (16, true),
            (64, false),
            (64, true),
        ]
    } else {
        &[(2, false), (2, true)]
    };
    for &(conns, binary) in levels {
        let (lv, wall) = run_level(addr, conns, binary, secs);
        let q = |h: &Option<Histogram<u64>>, p: f64| {
            h.as_ref().unwrap().value_at_quantile(p) as f64 / 1e3
        };
        println!(
            "{:<7} {:>5} {:>10.0} {:>6} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
            if binary { "binary" } else { "json" },
            conns,
            lv.ok as f64 / wall,
            lv.other,
            q(&lv.e2e, 0.5),
            q(&lv.e2e, 0.99),
            q(&lv.internal, 0.5),
            q(&lv.internal, 0.99),
            q(&lv.added, 0.5),
            q(&lv.added, 0.99),
        );
        assert!(lv.ok > 0, "no request served at {conns} connections");
    }
    let rep = c.stop().expect("stop");
    let f = &rep.frontends[0];
    assert_eq!(f.good + f.late + f.dropped + f.failed, f.requests);
}
