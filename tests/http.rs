//! The KServe v2 HTTP API of a frontend and the Prometheus endpoints, end to end:
//! an in-process cluster (in-process transport, emulated GPUs) whose frontend serves
//! HTTP on loopback, driven by a plain HTTP/1.1 client over a TcpStream (keep-alive).
//! Every status code of the API is produced and its message checked.

use fermata::node::backend::{BackendNode, BackendOpts};
use fermata::node::exec::{checksum64, emulated_output, EmulatedGpu, Executor};
use fermata::node::frontend::{FrontendNode, FrontendOpts};
use fermata::node::grpc::GrpcOpts;
use fermata::node::http::{HttpOpts, HttpServer};
use fermata::node::scheduler::{SchedulerNode, SchedulerOpts};
use fermata::repo::ModelMeta;
use fermata::transport::{inproc::InProc, Transport};
use fermata::wire::{ModelId, ModelInfo};
use fermata::workload::Workload;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One cluster at a time: outcomes depend on timing and the machine has few cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// `tiny`: FP32 x [4] and INT64 ids [2] in, INT64 out [2] (the emulated GPU's 16
/// bytes: input length and checksum). `raw`: no metadata (UINT8 bytes in and out).
/// `slow`: its executor takes 30 ms more than its profile says.
fn workload() -> Workload {
    let mut w = Workload::from_toml(
        r#"
name = "http"
gpus = 2
rate_rps = 100
# Slack for lone requests: deferred scheduling holds a batch of one until its
# frontrun moment, so without a response budget it ends at the deadline's edge.
[network]
ctrl_us = 1000
resp_us = 1000
# alpha (l(b+1) - l(b)) above the measured per-task pull budget's 500 us cap.
[[models]]
name = "tiny"
alpha_ms = 1.0
beta_ms = 1.0
slo_ms = 100
input_bytes = 32
[[models]]
name = "raw"
alpha_ms = 1.0
beta_ms = 1.0
slo_ms = 100
input_bytes = 8
[[models]]
name = "slow"
alpha_ms = 1.0
beta_ms = 1.0
slo_ms = 10
input_bytes = 4
[[models]]
name = "wide"
alpha_ms = 1.0
beta_ms = 1.0
slo_ms = 100
input_bytes = 24
"#,
        None,
    )
    .unwrap();
    w.models[0].meta = Some(
        ModelMeta::from_json(
            r#"{"name":"tiny","slo_ms":100,"max_batch":8,
                "inputs":[{"name":"x","datatype":"FP32","shape":[-1,4]},
                          {"name":"ids","datatype":"INT64","shape":[-1,2]}],
                "outputs":[{"name":"out","datatype":"INT64","shape":[-1,2]}]}"#,
        )
        .unwrap(),
    );
    w.models[2].meta = Some(
        ModelMeta::from_json(
            r#"{"name":"slow","slo_ms":10,"max_batch":8,
                "inputs":[{"name":"v","datatype":"FP32","shape":[-1,1]}],
                "outputs":[{"name":"o","datatype":"FP32","shape":[-1,4]}]}"#,
        )
        .unwrap(),
    );
    // The datatypes beyond FP32, one input each (24 bytes a sample).
    w.models[3].meta = Some(
        ModelMeta::from_json(
            r#"{"name":"wide","slo_ms":100,"max_batch":8,
                "inputs":[{"name":"u16","datatype":"UINT16","shape":[-1,2]},
                          {"name":"i16","datatype":"INT16","shape":[-1,2]},
                          {"name":"u32","datatype":"UINT32","shape":[-1,1]},
                          {"name":"u64","datatype":"UINT64","shape":[-1,1]},
                          {"name":"bf","datatype":"BF16","shape":[-1,2]}],
                "outputs":[{"name":"out","datatype":"INT64","shape":[-1,2]}]}"#,
        )
        .unwrap(),
    );
    w
}

/// The emulated GPU, 30 ms slower than the profile for the model named `slow`.
struct SlowFor {
    inner: EmulatedGpu,
    slow: HashSet<ModelId>,
}

impl Executor for SlowFor {
    fn name(&self) -> &'static str {
        "slow-for-test"
    }
    fn load(&mut self, m: &ModelInfo) -> anyhow::Result<()> {
        if m.name == "slow" {
            self.slow.insert(m.id);
        }
        self.inner.load(m)
    }
    fn unload(&mut self, m: ModelId) {
        self.inner.unload(m)
    }
    fn run(&mut self, m: ModelId, inputs: &[&[u8]]) -> anyhow::Result<Vec<Vec<u8>>> {
        let out = self.inner.run(m, inputs)?;
        if self.slow.contains(&m) {
            std::thread::sleep(Duration::from_millis(30));
        }
        Ok(out)
    }
}

fn backend(tr: &Arc<dyn Transport>, sched: &str, gpus: u32) -> BackendNode {
    let mut o = BackendOpts::emulated(sched, gpus);
    o.executor = Box::new(|_| {
        Ok(Box::new(SlowFor {
            inner: EmulatedGpu::new(),
            slow: HashSet::new(),
        }))
    });
    let b = BackendNode::start(tr.clone(), o).unwrap();
    b.wait_ready(Duration::from_secs(10)).unwrap();
    b
}

struct Cl {
    tr: Arc<dyn Transport>,
    sched: SchedulerNode,
    backends: Vec<BackendNode>,
    fe: FrontendNode,
    http: SocketAddr,
}

/// A scheduler, `gpus` emulated GPUs on one backend (none if 0) and a frontend
/// serving HTTP on loopback.
fn cluster(host: &str, gpus: u32, tweak: impl FnOnce(&mut HttpOpts)) -> Cl {
    cluster_with(host, gpus, tweak, false)
}

/// [`cluster`], with the frontend's gRPC API too when `grpc`.
fn cluster_with(host: &str, gpus: u32, tweak: impl FnOnce(&mut HttpOpts), grpc: bool) -> Cl {
    let tr: Arc<dyn Transport> = Arc::new(InProc::global());
    let w = workload();
    let sched = SchedulerNode::start(
        tr.clone(),
        &w,
        SchedulerOpts {
            listen: format!("{host}:0"),
            // A lone request is planned this long before its latest start: 3 ms
            // instead of 0.5, so a thread that wakes late on a busy 2-core CI
            // machine does not turn these functional tests' requests into 429s.
            min_slack: fermata::core::Dur::from_ms(3),
            ..SchedulerOpts::default()
        },
    )
    .unwrap();
    let backends = if gpus > 0 {
        vec![backend(&tr, sched.addr(), gpus)]
    } else {
        vec![]
    };
    let mut fo = FrontendOpts::new(sched.addr());
    fo.listen = format!("{host}:0");
    fo.data_listen = format!("{host}:0");
    fo.region_bytes = 16 << 20;
    let mut h = HttpOpts::new("127.0.0.1:0");
    tweak(&mut h);
    fo.http = Some(h);
    if grpc {
        fo.grpc = Some(GrpcOpts::new("127.0.0.1:0"));
    }
    let fe = FrontendNode::start(tr.clone(), fo).unwrap();
    let http = fe.http_addr().unwrap();
    Cl {
        tr,
        sched,
        backends,
        fe,
        http,
    }
}

impl Cl {
    fn stop(self) {
        let rep = self.fe.stop();
        assert_eq!(
            rep.good + rep.late + rep.dropped + rep.failed,
            rep.requests,
            "every request ended exactly once: {rep:?}"
        );
        for b in self.backends {
            b.stop();
        }
        self.sched.stop().unwrap();
    }
}

/// A minimal HTTP/1.1 client on one keep-alive connection.
struct Http {
    r: BufReader<TcpStream>,
}

struct Resp {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error field: {}", String::from_utf8_lossy(&self.body)))
            .to_string()
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Http {
    fn connect(a: SocketAddr) -> Http {
        let s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Http {
            r: BufReader::new(s),
        }
    }

    fn req(&mut self, method: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> Resp {
        let mut h = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            h.push_str(&format!("{k}: {v}\r\n"));
        }
        h.push_str("\r\n");
        let s = self.r.get_mut();
        s.write_all(h.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        self.read_resp()
    }

    /// A POST of `body` to `path` written in two parts, `pause` apart: the
    /// first `split` bytes of the whole request (head and body), then the rest.
    fn post_slowly(&mut self, path: &str, body: &[u8], split: usize, pause: Duration) -> Resp {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        let s = self.r.get_mut();
        s.write_all(&req[..split]).unwrap();
        s.flush().unwrap();
        std::thread::sleep(pause);
        s.write_all(&req[split..]).unwrap();
        self.read_resp()
    }

    fn read_resp(&mut self) -> Resp {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("bad status line {line:?}"))
            .parse()
            .unwrap();
        let mut headers = HashMap::new();
        loop {
            let mut l = String::new();
            self.r.read_line(&mut l).unwrap();
            let l = l.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
        let n: usize = headers["content-length"].parse().unwrap();
        let mut body = vec![0; n];
        self.r.read_exact(&mut body).unwrap();
        Resp {
            status,
            headers,
            body,
        }
    }

    fn get(&mut self, path: &str) -> Resp {
        self.req("GET", path, &[], &[])
    }

    fn post_json(&mut self, path: &str, v: &Value) -> Resp {
        self.req(
            "POST",
            path,
            &[("Content-Type", "application/json".into())],
            v.to_string().as_bytes(),
        )
    }

    /// A binary-extension request: JSON header, then `bin`.
    fn post_binary(&mut self, path: &str, v: &Value, bin: &[u8]) -> Resp {
        let head = v.to_string();
        let mut body = head.clone().into_bytes();
        body.extend_from_slice(bin);
        self.req(
            "POST",
            path,
            &[
                ("Content-Type", "application/octet-stream".into()),
                ("Inference-Header-Content-Length", head.len().to_string()),
            ],
            &body,
        )
    }
}

/// tiny's request bytes for x and ids: FP32 LE then INT64 LE.
fn tiny_bytes(x: [f32; 4], ids: [i64; 2]) -> Vec<u8> {
    let mut b = Vec::new();
    for v in x {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for v in ids {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

fn tiny_json(x: [f32; 4], ids: [i64; 2]) -> Value {
    json!({
        "id": "req-1",
        "inputs": [
            {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [[x[0], x[1]], [x[2], x[3]]]},
            {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": ids},
        ]
    })
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn health_ready_and_metadata() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster("http-meta", 2, |_| {});
    let mut h = Http::connect(c.http);
    let r = h.get("/v2/health/live");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["live"], true);
    assert_eq!(h.get("/v2/health/ready").status, 200);
    let r = h.get("/v2/models/tiny/ready");
    assert_eq!((r.status, r.json()["ready"].clone()), (200, json!(true)));
    let r = h.get("/v2");
    // The extensions Triton's perf_analyzer looks for before it reads /stats.
    assert_eq!(
        r.json()["extensions"],
        json!([
            "binary_tensor_data",
            "classification",
            "model_configuration",
            "statistics",
            "parameters"
        ])
    );

    let m = h.get("/v2/models/tiny").json();
    assert_eq!(m["name"], "tiny");
    // The platform its configuration names (an ONNX model: Triton's name for it).
    assert_eq!(m["platform"], "onnxruntime_onnx");
    let cfg = h.get("/v2/models/tiny/config").json();
    assert_eq!(cfg["platform"], m["platform"]);
    // Emulated GPUs run on the CPU: one instance each, none on a GPU.
    assert_eq!(
        cfg["instance_group"],
        json!([{"name": "tiny_0", "kind": "KIND_CPU", "count": 2}])
    );
    assert_eq!(
        m["inputs"],
        json!([
            {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "ids", "datatype": "INT64", "shape": [-1, 2]},
        ])
    );
    assert_eq!(
        m["outputs"],
        json!([{"name": "out", "datatype": "INT64", "shape": [-1, 2]}])
    );
    // A model without metadata: raw bytes in, the emulated GPU's 16 bytes out.
    let m = h.get("/v2/models/raw").json();
    assert_eq!(
        m["inputs"],
        json!([{"name": "input", "datatype": "UINT8", "shape": [-1, 8]}])
    );
    assert_eq!(
        m["outputs"],
        json!([{"name": "output", "datatype": "UINT8", "shape": [-1, 16]}])
    );

    for path in ["/v2/models/nope", "/v2/models/nope/ready"] {
        let r = h.get(path);
        assert_eq!(r.status, 404, "{path}");
        assert!(
            r.error()
                .contains("unknown model `nope` (served: tiny, raw, slow, wide)"),
            "{}",
            r.error()
        );
    }
    let r = h.post_json("/v2/models/nope/infer", &tiny_json([0.0; 4], [0; 2]));
    assert_eq!(r.status, 404);
    let r = h.get("/v3/whatever");
    assert_eq!(r.status, 404);
    assert!(
        r.error().contains("no route for GET /v3/whatever"),
        "{}",
        r.error()
    );
    let r = h.get("/v2/models/tiny/infer");
    assert_eq!(r.status, 405);
    // Every known route answers 405 to another method, as docs/operations.md says.
    for path in [
        "/v2/health/ready",
        "/v2/health/live",
        "/v2",
        "/metrics",
        "/v2/models/stats",
    ] {
        let r = h.post_json(path, &json!({}));
        assert_eq!(r.status, 405, "POST {path}: {}", r.error());
        assert!(r.error().contains("is not allowed on"), "{}", r.error());
    }
    assert_eq!(h.get("/v2/repository/index").status, 405);
    c.stop();
}

#[test]
fn json_and_binary_requests_get_the_right_outputs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster("http-ok", 2, |_| {});
    let mut h = Http::connect(c.http);
    let (x, ids) = ([1.5f32, -2.0, 3.25, 1e-3], [7i64, -9]);
    let bytes = tiny_bytes(x, ids);

    // JSON in, JSON out (nested data accepted).
    let r = h.post_json("/v2/models/tiny/infer", &tiny_json(x, ids));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["model_name"], "tiny");
    assert_eq!(v["id"], "req-1");
    let out = &v["outputs"][0];
    assert_eq!(out["name"], "out");
    assert_eq!(out["datatype"], "INT64");
    assert_eq!(out["shape"], json!([1, 2]));
    assert_eq!(
        out["data"],
        json!([bytes.len() as i64, checksum64(&bytes) as i64]),
        "the emulated GPU's output for exactly these request bytes"
    );
    assert!(v["parameters"]["fermata_batch_size"].as_u64().unwrap() >= 1);
    assert!(v["parameters"]["fermata_latency_us"].as_f64().unwrap() > 0.0);

    // Binary in, binary out, on the same keep-alive connection.
    let req = json!({
        "inputs": [
            {"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
            {"name": "ids", "shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}},
        ],
        "outputs": [{"name": "out", "parameters": {"binary_data": true}}]
    });
    let r = h.post_binary("/v2/models/tiny/infer", &req, &bytes);
    assert_eq!(r.status, 200, "{}", r.text());
    let hl: usize = r.headers["inference-header-content-length"]
        .parse()
        .unwrap();
    let head: Value = serde_json::from_slice(&r.body[..hl]).unwrap();
    assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], 16);
    assert!(head["outputs"][0].get("data").is_none());
    assert_eq!(&r.body[hl..], &emulated_output(&bytes)[..]);

    // Mixed: x as JSON, ids binary; every output binary by the request parameter.
    let req = json!({
        "parameters": {"binary_data_output": true},
        "inputs": [
            {"name": "ids", "shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}},
            {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x},
        ]
    });
    let r = h.post_binary("/v2/models/tiny/infer", &req, &bytes[16..]);
    assert_eq!(r.status, 200, "{}", r.text());
    let hl: usize = r.headers["inference-header-content-length"]
        .parse()
        .unwrap();
    assert_eq!(&r.body[hl..], &emulated_output(&bytes)[..]);

    // A model without metadata: UINT8 bytes.
    let raw = [1u8, 2, 3, 4, 5, 6, 7, 200];
    let r = h.post_json(
        "/v2/models/raw/infer",
        &json!({"inputs": [{"name": "input", "shape": [1, 8], "datatype": "UINT8", "data": raw}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let want: Vec<Value> = emulated_output(&raw)
        .into_iter()
        .map(|b| json!(b))
        .collect();
    assert_eq!(r.json()["outputs"][0]["data"], Value::Array(want));

    // A batch of 3 samples: one task each, the outputs back in the samples' order.
    let rows = [
        [1.0f32, 2.0, 3.0, 4.0],
        [5.0, 6.0, 7.0, 8.0],
        [9.0, 10.0, 11.0, 12.0],
    ];
    let idss = [[1i64, 2], [3, 4], [5, 6]];
    let req = json!({"inputs": [
        {"name": "x", "shape": [3, 4], "datatype": "FP32", "data": rows},
        {"name": "ids", "shape": [3, 2], "datatype": "INT64", "data": idss},
    ]});
    let r = h.post_json("/v2/models/tiny/infer", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let out = &r.json()["outputs"][0];
    assert_eq!(out["shape"], json!([3, 2]));
    let want: Vec<i64> = (0..3)
        .flat_map(|j| {
            let b = tiny_bytes(rows[j], idss[j]);
            [b.len() as i64, checksum64(&b) as i64]
        })
        .collect();
    assert_eq!(out["data"], json!(want));

    // UINT16, INT16, UINT32, UINT64 and BF16 inputs: their little-endian
    // bytes, in the model's input order, are what the GPU gets.
    let req = json!({"inputs": [
        {"name": "u16", "shape": [1, 2], "datatype": "UINT16", "data": [1, 65535]},
        {"name": "i16", "shape": [1, 2], "datatype": "INT16", "data": [-2, 300]},
        {"name": "u32", "shape": [1, 1], "datatype": "UINT32", "data": [4000000000u64]},
        {"name": "u64", "shape": [1, 1], "datatype": "UINT64", "data": [18446744073709551615u64]},
        {"name": "bf", "shape": [1, 2], "datatype": "BF16", "data": [1.5, -2.0]},
    ]});
    let mut bytes = Vec::new();
    bytes.extend([1u16.to_le_bytes(), 65535u16.to_le_bytes()].concat());
    bytes.extend([(-2i16).to_le_bytes(), 300i16.to_le_bytes()].concat());
    bytes.extend(4_000_000_000u32.to_le_bytes());
    bytes.extend(u64::MAX.to_le_bytes());
    bytes.extend([0x3fc0u16.to_le_bytes(), 0xc000u16.to_le_bytes()].concat());
    let r = h.post_json("/v2/models/wide/infer", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["outputs"][0]["data"],
        json!([bytes.len() as i64, checksum64(&bytes) as i64])
    );
    let mut bad = req.clone();
    bad["inputs"][0]["data"] = json!([1, 65536]);
    let r = h.post_json("/v2/models/wide/infer", &bad);
    assert_eq!(r.status, 400);
    assert!(r.error().contains("not a valid UINT16"), "{}", r.error());

    // A request-level timeout (microseconds) that is ample still gives 200.
    let mut v = tiny_json(x, ids);
    v["parameters"] = json!({"timeout": 200_000});
    assert_eq!(h.post_json("/v2/models/tiny/infer", &v).status, 200);
    c.stop();
}

#[test]
fn bad_requests_get_400_naming_the_field() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster("http-400", 1, |_| {});
    let mut h = Http::connect(c.http);
    let infer = "/v2/models/tiny/infer";
    let ok = tiny_json([1.0; 4], [1, 2]);
    let check = |r: Resp, want: &str| {
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.error();
        assert!(e.contains(want), "`{e}` should contain `{want}`");
    };
    // Malformed JSON.
    let r = h.req("POST", infer, &[], b"{\"inputs\": [");
    check(r, "malformed JSON request");
    let r = h.post_json(infer, &json!({"inputs": 3}));
    check(r, "malformed JSON request: invalid type");
    // Unknown input name.
    let mut v = ok.clone();
    v["inputs"][0]["name"] = json!("y");
    check(
        h.post_json(infer, &v),
        "unknown input `y` (inputs[0].name); the model's inputs are: x, ids",
    );
    // Missing input.
    let mut v = ok.clone();
    v["inputs"].as_array_mut().unwrap().pop();
    check(h.post_json(infer, &v), "missing input `ids`");
    // Wrong shape (and a batch of two).
    let mut v = ok.clone();
    v["inputs"][0]["shape"] = json!([1, 5]);
    check(
        h.post_json(infer, &v),
        "input `x`: shape [1, 5] (inputs[0].shape), expected [1, 4]",
    );
    let mut v = ok.clone();
    v["inputs"][1]["shape"] = json!([2, 2]);
    check(
        h.post_json(infer, &v),
        "input `ids`: batch dimension 2 (inputs[1].shape[0]), but input `x` has 1",
    );
    // Wrong datatype.
    let mut v = ok.clone();
    v["inputs"][0]["datatype"] = json!("FP64");
    check(
        h.post_json(infer, &v),
        "input `x`: datatype FP64 (inputs[0].datatype), the model expects FP32",
    );
    // Wrong element count and element type.
    let mut v = ok.clone();
    v["inputs"][1]["data"] = json!([1, 2, 3]);
    check(h.post_json(infer, &v), "input `ids`: `data` has 3 elements");
    let mut v = ok.clone();
    v["inputs"][1]["data"] = json!([1, 2.5]);
    check(
        h.post_json(infer, &v),
        "input `ids`: element 1 of `data` is 2.5, not a valid INT64",
    );
    // Wrong binary sizes.
    let req = json!({"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 12}},
        {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
    ]});
    check(
        h.post_binary(infer, &req, &[0; 12]),
        "input `x`: parameters.binary_data_size is 12 bytes, the tensor [1, 4] FP32 needs 16",
    );
    let req = json!({"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
        {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
    ]});
    check(
        h.post_binary(infer, &req, &[0; 20]),
        "20 bytes of binary data after the JSON header, but the inputs' parameters.binary_data_size add up to 16",
    );
    check(
        h.post_binary(infer, &req, &[0; 10]),
        "only 10 bytes of binary data are left",
    );
    // Bad parameters.
    let mut v = ok.clone();
    v["parameters"] = json!({"timeout": "soon"});
    check(
        h.post_json(infer, &v),
        "parameters.timeout must be an integer number of microseconds",
    );
    let mut v = ok.clone();
    v["outputs"] = json!([{"name": "nope"}]);
    check(
        h.post_json(infer, &v),
        "unknown output `nope` (outputs[0].name)",
    );
    // The connection is still good after all that, and nothing was lost.
    assert_eq!(h.post_json(infer, &ok).status, 200);
    c.stop();
}

#[test]
fn oversized_bodies_and_tensors_get_413() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster("http-413", 1, |h| {
        h.max_body_bytes = 4096;
        h.max_tensor_bytes = 1024;
    });
    let mut h = Http::connect(c.http);
    let r = h.req("POST", "/v2/models/tiny/infer", &[], &vec![b' '; 5000]);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.error()
            .contains("request body of 5000 bytes is over the limit of 4096 bytes"),
        "{}",
        r.error()
    );
    let mut h = Http::connect(c.http);
    let v = json!({"inputs": [{"name": "x", "shape": [1, 300], "datatype": "FP32", "data": []}]});
    let r = h.post_json("/v2/models/tiny/infer", &v);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.error().contains(
            "input `x`: shape [1, 300] is 1200 bytes, over the limit of 1024 bytes per tensor"
        ),
        "{}",
        r.error()
    );
    c.stop();
}

#[test]
fn deadlines_that_cannot_be_met_get_429_and_late_results_504() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster("http-429", 1, |_| {});
    let mut h = Http::connect(c.http);
    // 100 us is below l(1) = 2 ms: the frontend drops it before admission.
    let mut v = tiny_json([1.0; 4], [1, 2]);
    v["parameters"] = json!({"timeout": 100});
    let r = h.post_json("/v2/models/tiny/infer", &v);
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(
        r.error()
            .starts_with("dropped (expired): it could not finish by its deadline"),
        "{}",
        r.error()
    );
    // `slow` runs 30 ms over its 10 ms SLO: the result comes late. (A lone
    // request on a busy machine can also be dropped before it runs, a 429: a
    // timing outcome, so it is sent again, a bounded number of times.)
    let mut r = None;
    for _ in 0..10 {
        let x = h.post_json(
            "/v2/models/slow/infer",
            &json!({"inputs": [{"name": "v", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}),
        );
        if x.status == 429 && x.error().starts_with("dropped") {
            continue;
        }
        r = Some(x);
        break;
    }
    let r = r.expect("10 requests to `slow` in a row were dropped");
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(
        r.error()
            .starts_with("deadline exceeded: the result came after the deadline"),
        "{}",
        r.error()
    );
    // A request of 3 samples: each is its own task, all of them late here, and
    // the request fails with the first one's status, naming it.
    let r = h.post_json(
        "/v2/models/slow/infer",
        &json!({"inputs": [{"name": "v", "shape": [3, 1], "datatype": "FP32", "data": [0.5, 1.5, 2.5]}]}),
    );
    assert!(r.status == 504 || r.status == 429, "{}", r.text());
    assert!(
        r.error().starts_with("sample 0 of the request's 3: "),
        "{}",
        r.error()
    );
    c.stop();
}

/// The SLO is the client's: it runs from the request's first byte, so a client
/// that writes its request slowly spends its own deadline, and the frontend
/// does not answer 200 to a request whose deadline passed while it was read.
#[test]
fn a_slow_client_spends_its_own_deadline() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster("http-slow", 1, |_| {});
    let mut h = Http::connect(c.http);
    let mut v = tiny_json([1.0; 4], [1, 2]);
    // 60 ms of SLO.
    v["parameters"] = json!({"timeout": 60_000});
    let body = v.to_string().into_bytes();
    // The head written at once, the body 100 ms later: the deadline passed
    // while the body was read.
    let head_len = {
        let r = format!(
            "POST /v2/models/tiny/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        );
        r.len()
    };
    let pause = Duration::from_millis(100);
    let r = h.post_slowly("/v2/models/tiny/infer", &body, head_len, pause);
    assert_eq!(r.status, 429, "body 100 ms late: {}", r.text());
    assert!(r.error().contains("expired"), "{}", r.error());
    // Half of the head, then the rest 100 ms later: the SLO runs from the
    // first byte, not from the parsed head.
    let r = h.post_slowly("/v2/models/tiny/infer", &body, 20, pause);
    assert_eq!(r.status, 429, "head 100 ms late: {}", r.text());
    // With the time to spare the same slow client is served, on the same
    // connection (the next request's first byte starts a new stamp).
    v["parameters"] = json!({"timeout": 90_000});
    let body = v.to_string().into_bytes();
    let mut ok = false;
    for _ in 0..5 {
        let r = h.post_slowly(
            "/v2/models/tiny/infer",
            &body,
            20,
            Duration::from_millis(20),
        );
        if r.status == 200 {
            ok = true;
            break;
        }
        // A lone request on a busy 2-core machine can miss its start: 429.
        assert_eq!(r.status, 429, "{}", r.text());
    }
    assert!(ok, "5 slow requests with 70 ms to spare were all dropped");
    let r = h.post_json("/v2/models/tiny/infer", &tiny_json([1.0; 4], [1, 2]));
    assert_eq!(r.status, 200, "{}", r.text());
    c.stop();
}

/// One gRPC `ModelInfer` of the tiny model with `timeout_us` of SLO over a
/// fresh HTTP/2 connection to `addr`: the headers at once, the message
/// `pause` later. The answer's grpc-status and grpc-message.
fn grpc_infer_slowly(addr: SocketAddr, timeout_us: i64, pause: Duration) -> (String, String) {
    grpc_infer_padded(addr, timeout_us, pause, 0)
}

/// [`grpc_infer_slowly`] with a custom string parameter of `pad` bytes (a
/// larger message of the same request).
fn grpc_infer_padded(
    addr: SocketAddr,
    timeout_us: i64,
    pause: Duration,
    pad: usize,
) -> (String, String) {
    use fermata::node::grpc::pb;
    use prost::Message;
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let i64s = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let input =
        |name: &str, datatype: &str, shape: Vec<i64>| pb::model_infer_request::InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape,
            ..Default::default()
        };
    let mut parameters = HashMap::from([(
        "timeout".to_string(),
        pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(timeout_us)),
        },
    )]);
    if pad > 0 {
        parameters.insert(
            "pad".to_string(),
            pb::InferParameter {
                parameter_choice: Some(pb::infer_parameter::ParameterChoice::StringParam(
                    "p".repeat(pad),
                )),
            },
        );
    }
    let req = pb::ModelInferRequest {
        model_name: "tiny".into(),
        parameters,
        inputs: vec![
            input("x", "FP32", vec![1, 4]),
            input("ids", "INT64", vec![1, 2]),
        ],
        raw_input_contents: vec![f32s(&[1.0; 4]).into(), i64s(&[1, 2]).into()],
        ..Default::default()
    };
    // gRPC's framing: no compression, the length, the message.
    let msg = req.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    framed.extend_from_slice(&msg);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let head = hyper::Request::post(format!(
            "http://{addr}/inference.GRPCInferenceService/ModelInfer"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (answer, mut body) = client.send_request(head, false).unwrap();
        tokio::time::sleep(pause).await;
        body.send_data(hyper::body::Bytes::from(framed), true)
            .unwrap();
        let answer = answer.await.unwrap();
        let (parts, mut data) = answer.into_parts();
        // Trailers-only (an error) carries the status in the headers.
        let mut fields = parts.headers;
        while let Some(chunk) = data.data().await {
            let chunk = chunk.unwrap();
            let _ = data.flow_control().release_capacity(chunk.len());
        }
        if let Some(t) = data.trailers().await.unwrap() {
            fields.extend(t);
        }
        let get = |k: &str| {
            fields
                .get(k)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        (get("grpc-status"), get("grpc-message"))
    })
}

/// One unary gRPC call over a fresh HTTP/2 connection: the grpc-status and
/// the answer's message bytes (unframed).
fn grpc_unary(addr: SocketAddr, method: &str, msg: Vec<u8>) -> (String, Vec<u8>) {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    framed.extend_from_slice(&msg);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let head = hyper::Request::post(format!(
            "http://{addr}/inference.GRPCInferenceService/{method}"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (answer, mut body) = client.send_request(head, false).unwrap();
        body.send_data(hyper::body::Bytes::from(framed), true)
            .unwrap();
        let answer = answer.await.unwrap();
        let (parts, mut data) = answer.into_parts();
        let mut fields = parts.headers;
        let mut got = Vec::new();
        while let Some(chunk) = data.data().await {
            let chunk = chunk.unwrap();
            let _ = data.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        if let Some(t) = data.trailers().await.unwrap() {
            fields.extend(t);
        }
        let status = fields
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, got.get(5..).unwrap_or_default().to_vec())
    })
}

/// `ModelReady` for a model the server does not have answers ready=false, as
/// Triton does (its clients' `is_model_ready` expects an answer, not
/// NOT_FOUND); a served model is ready.
#[test]
fn grpc_model_ready_is_false_for_an_unknown_model() {
    use fermata::node::grpc::pb;
    use prost::Message;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster_with("grpc-ready", 1, |_| {}, true);
    let addr = c.fe.grpc_addr().unwrap();
    for (name, want) in [("tiny", true), ("no-such-model", false)] {
        let req = pb::ModelReadyRequest {
            name: name.into(),
            version: String::new(),
        };
        let (status, body) = grpc_unary(addr, "ModelReady", req.encode_to_vec());
        assert_eq!(status, "0", "{name}: an answer, not an error");
        let r = pb::ModelReadyResponse::decode(&body[..]).unwrap();
        assert_eq!(r.ready, want, "{name}");
    }
    c.stop();
}

/// The SLO is the client's over gRPC too: it runs from when the host received
/// the request's headers, so a client that sends its message late spends its
/// own deadline (before, requests were stamped when their decoded message
/// reached the handler, and this one was served).
#[test]
fn a_slow_grpc_client_spends_its_own_deadline() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster_with("grpc-slow", 1, |_| {}, true);
    let addr = c.fe.grpc_addr().unwrap();
    // 60 ms of SLO, the message 100 ms after the headers: UNAVAILABLE (429's
    // code), expired.
    let (code, msg) = grpc_infer_slowly(addr, 60_000, Duration::from_millis(100));
    assert_eq!(code, "14", "message 100 ms late: {msg}");
    assert!(msg.contains("expired"), "{msg}");
    // With the time to spare, the same slow client is served.
    let mut ok = false;
    for _ in 0..5 {
        let (code, msg) = grpc_infer_slowly(addr, 150_000, Duration::from_millis(20));
        if code == "0" {
            ok = true;
            break;
        }
        // A lone request on a busy 2-core machine can miss its start.
        assert_eq!(code, "14", "{msg}");
    }
    assert!(ok, "5 slow requests with 130 ms to spare were all dropped");
    c.stop();
}

#[test]
fn no_gpu_in_service_gets_503_until_a_backend_registers() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = cluster("http-503", 0, |_| {});
    let mut h = Http::connect(c.http);
    let ok = tiny_json([1.0; 4], [1, 2]);
    let r = h.get("/v2/health/ready");
    assert_eq!(r.status, 503);
    assert_eq!(r.error(), "not ready: no GPU in service");
    assert_eq!(h.get("/v2/models/tiny/ready").status, 503);
    assert_eq!(h.get("/v2/health/live").status, 200);
    let r = h.post_json("/v2/models/tiny/infer", &ok);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.error()
            .contains("dropped (no_gpu): no GPU is in service: no backend can serve the model"),
        "{}",
        r.error()
    );
    // A backend registers: ready, and requests are served.
    c.backends.push(backend(&c.tr, c.sched.addr(), 1));
    wait_for("ready", 5, || h.get("/v2/health/ready").status == 200);
    // Right after the backend joined, the network budget is still being measured
    // and a lone request may miss its deadline (429): a few tries.
    let mut last = 0;
    for _ in 0..5 {
        last = h.post_json("/v2/models/tiny/infer", &ok).status;
        if last == 200 {
            break;
        }
        assert!([429, 504].contains(&last), "{last}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(last, 200);
    // It leaves: 503 again.
    c.backends.pop().unwrap().stop();
    wait_for("not ready", 5, || h.get("/v2/health/ready").status == 503);
    let r = h.post_json("/v2/models/tiny/infer", &ok);
    assert_eq!(r.status, 503, "{}", r.text());
    c.stop();
}

/// The value of the sample `series` (name and labels exactly) in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_count_requests_by_outcome() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster("http-metrics", 2, |_| {});
    let mut h = Http::connect(c.http);
    let ok = tiny_json([1.0; 4], [1, 2]);
    for _ in 0..3 {
        assert_eq!(h.post_json("/v2/models/tiny/infer", &ok).status, 200);
    }
    let mut v = ok.clone();
    v["parameters"] = json!({"timeout": 100});
    assert_eq!(h.post_json("/v2/models/tiny/infer", &v).status, 429);
    v["inputs"][0]["name"] = json!("zz");
    assert_eq!(h.post_json("/v2/models/tiny/infer", &v).status, 400);

    let r = h.get("/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let t = r.text();
    let n = |s: &str| sample(&t, s).unwrap_or_else(|| panic!("no sample {s} in\n{t}"));
    assert_eq!(
        n(r#"fermata_requests_total{model="tiny",outcome="good"}"#),
        3.0
    );
    assert_eq!(
        n(r#"fermata_requests_total{model="tiny",outcome="dropped"}"#),
        1.0
    );
    assert_eq!(
        n(r#"fermata_requests_total{model="tiny",outcome="late"}"#),
        0.0
    );
    assert_eq!(
        n(r#"fermata_requests_total{model="raw",outcome="good"}"#),
        0.0
    );
    assert_eq!(
        n(r#"fermata_request_latency_seconds_count{model="tiny"}"#),
        4.0
    );
    assert_eq!(
        n(r#"fermata_request_latency_seconds_bucket{model="tiny",le="+Inf"}"#),
        4.0
    );
    assert!(n(r#"fermata_request_latency_seconds_sum{model="tiny"}"#) > 0.0);
    assert_eq!(
        n(r#"fermata_queuing_delay_seconds_count{model="tiny"}"#),
        3.0
    );
    assert_eq!(n(r#"fermata_http_responses_total{code="200"}"#), 3.0);
    assert_eq!(n(r#"fermata_http_responses_total{code="429"}"#), 1.0);
    assert_eq!(n(r#"fermata_http_responses_total{code="400"}"#), 1.0);
    assert_eq!(n("fermata_frontend_gpus_in_service"), 2.0);
    assert_eq!(n("fermata_frontend_scheduler_connected"), 1.0);
    assert!(t.contains("# TYPE fermata_request_latency_seconds histogram\n"));
    assert!(t.contains("# TYPE fermata_requests_total counter\n"));
    // The dropped one, by model and reason; the process's series.
    assert_eq!(
        n(r#"fermata_requests_dropped_total{model="tiny",reason="expired"}"#),
        1.0
    );
    assert_eq!(
        n(r#"fermata_requests_dropped_total{model="tiny",reason="no_gpu"}"#),
        0.0
    );
    assert!(n("process_resident_memory_bytes") > 0.0);
    assert!(n("process_open_fds") > 0.0);
    // The bad ratio over the window: 1 of 4 (refreshed every second).
    wait_for("the bad ratio", 5, || {
        sample(
            &h.get("/metrics").text(),
            r#"fermata_bad_ratio{model="tiny"}"#,
        ) == Some(0.25)
    });
    // OpenMetrics when the scrape asks for it, as Prometheus does.
    let r = h.req(
        "GET",
        "/metrics",
        &[(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5".into(),
        )],
        &[],
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let t = r.text();
    assert!(t.contains("# TYPE fermata_requests counter\n"), "{t}");
    assert_eq!(
        sample(&t, r#"fermata_requests_total{model="tiny",outcome="good"}"#),
        Some(3.0)
    );
    assert!(t.ends_with("# EOF\n"), "{t}");

    // The scheduler's and the backend's, as `--metrics-listen` serves them.
    let m = HttpServer::start_metrics(
        "127.0.0.1:0",
        vec![c.sched.metrics(), c.backends[0].metrics()],
    )
    .unwrap();
    let mut hm = Http::connect(m.addr());
    assert_eq!(hm.get("/v2/health/live").status, 200);
    assert_eq!(hm.get("/v2/models/tiny").status, 404);
    let mut t = String::new();
    wait_for("the GPU series", 5, || {
        t = hm.get("/metrics").text();
        t.contains(r#"fermata_gpu_busy_ratio{gpu="1",subcluster="0"}"#)
    });
    let n = |s: &str| sample(&t, s).unwrap_or_else(|| panic!("no sample {s} in\n{t}"));
    // The one with a 100 us timeout never reached the scheduler: its model's
    // l(1) alone is longer, so the frontend dropped it before admission.
    assert_eq!(n(r#"fermata_scheduler_tasks_total{model="tiny"}"#), 3.0);
    assert_eq!(
        n(r#"fermata_scheduler_dropped_total{reason="expired"}"#),
        0.0
    );
    let plans = n(r#"fermata_scheduler_plans_total{model="tiny"}"#);
    assert!(plans >= 1.0);
    assert_eq!(
        n(r#"fermata_scheduler_batch_size_count{model="tiny"}"#),
        plans
    );
    assert_eq!(n(r#"fermata_scheduler_batch_size_sum{model="tiny"}"#), 3.0);
    assert_eq!(
        n(r#"fermata_subcluster_gpus_in_service{subcluster="0"}"#),
        2.0
    );
    let busy = n(r#"fermata_subcluster_busy_ratio{subcluster="0"}"#);
    let idle = n(r#"fermata_subcluster_idle_ratio{subcluster="0"}"#);
    assert!((0.0..=1.0).contains(&busy) && (busy + idle - 1.0).abs() < 1e-9);
    assert!(n(r#"fermata_gpu_busy_seconds_total{gpu="0",subcluster="0"}"#) > 0.0);
    // The load's demand in GPUs: 4 tasks of a tiny model over the window.
    wait_for("the demand", 5, || {
        let t = hm.get("/metrics").text();
        sample(&t, "fermata_cluster_demand_gpus").is_some_and(|d| d > 0.0 && d < 0.1)
            && sample(&t, r#"fermata_subcluster_demand_gpus{subcluster="0"}"#).is_some()
    });
    assert_eq!(
        n(r#"fermata_backend_plans_total{backend="backend",outcome="ran"}"#),
        plans
    );
    assert_eq!(
        n(r#"fermata_backend_tasks_total{backend="backend",outcome="ran"}"#),
        3.0
    );
    assert_eq!(
        n(r#"fermata_backend_batch_size_sum{backend="backend",model="tiny"}"#),
        3.0
    );
    m.stop();
    c.stop();
}

/// Kills a child process when dropped (a test that fails before its SIGTERM).
struct Kill(u32);

impl Drop for Kill {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child (already gone: no effect).
        unsafe {
            libc::kill(self.0 as libc::pid_t, libc::SIGKILL);
        }
    }
}

/// `fermata serve` started by `cmd` (stdout piped): the child, its stdout, its
/// killer and the HTTP address it announced.
fn spawn_serve(
    mut cmd: std::process::Command,
) -> (
    std::process::Child,
    BufReader<std::process::ChildStdout>,
    Kill,
    SocketAddr,
) {
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let kill = Kill(child.id());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .parse()
        .unwrap();
    (child, out, kill, addr)
}

#[test]
fn serve_with_an_http_port_serves_until_sigterm() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fermata"));
    cmd.args(["serve", "--http-port", "0", "--input-bytes", "64"]);
    let (mut child, mut out, _kill, addr) = spawn_serve(cmd);
    let mut h = Http::connect(addr);
    wait_for("ready", 5, || h.get("/v2/health/ready").status == 200);
    let m = h.get("/v2/models/resnet50").json();
    assert_eq!(m["inputs"][0]["shape"], json!([-1, 64]));
    let req = json!({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "UINT8",
                                 "parameters": {"binary_data_size": 64}}],
                     "parameters": {"binary_data_output": true}});
    // A lone request right after start-up runs at once (light load: the batch
    // does not wait for requests that will not come) and is good. On a host
    // starved by other work it may miss its 25 ms deadline and be refused
    // ([`missed_its_deadline`]): it is tried again, at most twice, and every
    // try must be in the report.
    let mut tries = 0;
    let r = loop {
        tries += 1;
        let r = h.post_binary("/v2/models/resnet50/infer", &req, &[9u8; 64]);
        if r.status == 200 || tries == 3 {
            break r;
        }
        assert!(missed_its_deadline(&r), "{} {}", r.status, r.text());
    };
    assert_eq!(r.status, 200, "{}", r.text());
    let hl: usize = r.headers["inference-header-content-length"]
        .parse()
        .unwrap();
    assert_eq!(&r.body[hl..], &emulated_output(&[9u8; 64])[..]);
    // The metrics of every node on the same port.
    let t = h.get("/metrics").text();
    assert!(t.contains("fermata_scheduler_plans_total{model=\"resnet50\"}"));
    assert!(t.contains("fermata_backend_batch_size_count{backend=\"backend0\",model=\"resnet50\"}"));
    // SIGTERM: it stops and prints the cluster's report.
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    let rep: Value = serde_json::from_str(rest.lines().last().unwrap()).unwrap();
    let f = &rep["frontends"][0];
    assert_eq!(f["requests"], tries);
    assert_eq!(f["good"], 1);
    assert_eq!(
        f["good"].as_u64().unwrap()
            + f["late"].as_u64().unwrap()
            + f["dropped"].as_u64().unwrap()
            + f["failed"].as_u64().unwrap(),
        tries
    );
}

/// SIGTERM drains: readiness answers 503 ("draining") at once while requests
/// are still served for --http-drain-ready-ms, then the process closes and
/// reports every request ended. From the drain's start every answer carries
/// `Connection: close`, so no client sends its next request on a connection
/// that is about to close.
#[test]
fn sigterm_turns_readiness_503_first_and_keeps_serving_for_the_grace() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fermata"));
    cmd.args([
        "serve",
        "--http-port",
        "0",
        "--input-bytes",
        "64",
        "--http-drain-ready-ms",
        "1500",
    ]);
    let (mut child, mut out, _kill, addr) = spawn_serve(cmd);
    let mut h = Http::connect(addr);
    wait_for("ready", 5, || h.get("/v2/health/ready").status == 200);
    let t0 = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let mut r = h.get("/v2/health/ready");
    wait_for("readiness 503", 1, || {
        r = Http::connect(addr).get("/v2/health/ready");
        r.status == 503 && r.error().contains("draining")
    });
    let close = |r: &Resp| r.headers.get("connection").map(String::as_str) == Some("close");
    assert!(close(&r), "{:?}", r.headers);
    let r = Http::connect(addr).get("/v2/models/resnet50/ready");
    assert!(r.status == 503 && close(&r));
    let r = Http::connect(addr).get("/v2/health/live");
    assert!(r.status == 200 && close(&r));
    // Still served while the load balancer catches up, on a new connection
    // too. A lone request may miss its deadline on a starved host (as
    // above): a new connection and another try, at most twice.
    let req = json!({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "UINT8",
                                 "parameters": {"binary_data_size": 64}}]});
    let mut tries = 0;
    let r = loop {
        tries += 1;
        let r = Http::connect(addr).post_binary("/v2/models/resnet50/infer", &req, &[3u8; 64]);
        assert!(close(&r), "{:?}", r.headers);
        if r.status == 200 || tries == 3 {
            break r;
        }
        assert!(missed_its_deadline(&r), "{} {}", r.status, r.text());
    };
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "within the grace"
    );
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(
        t0.elapsed() >= Duration::from_millis(1500),
        "not before the grace"
    );
    let rep: Value = serde_json::from_str(rest.lines().last().unwrap()).unwrap();
    let f = &rep["frontends"][0];
    assert_eq!(f["requests"], tries);
    assert_eq!(f["good"], 1);
}

/// Whether `r` is a lone request that missed its deadline: refused as
/// expired at the door, or dropped as too late by the scheduler (a host
/// starved by other work, seen under the full suite on 2 cores).
fn missed_its_deadline(r: &Resp) -> bool {
    let t = r.text();
    r.status == 429 && (t.contains("expired") || t.contains("too_late"))
}

#[test]
fn bad_log_filters_are_refused() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_fermata"))
        .args(["--log-level", "[[[", "serve", "--duration-s", "0.1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("bad log filter `[[[` (--log-level)"), "{e}");
}

/// Every shipped ONNX model served over HTTP with ONNX Runtime returns the outputs
/// that Python's onnxruntime computed for the same inputs (`models/STEM.ref.json`,
/// written by scripts/gen_models.py): each reference sample as its own request,
/// as JSON and as binary tensors.
#[test]
fn shipped_models_over_http_return_the_reference_outputs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let (c, models) = onnx_cluster(&dir, "http-onnx");
    assert!(models.len() >= 2, "the shipped models");
    let mut h = Http::connect(c.frontends[0].http_addr().unwrap());
    wait_for("ready", 10, || h.get("/v2/health/ready").status == 200);
    // A lone request at low load runs near its deadline, and the first ones
    // after start-up meet a network budget still being measured: retry those
    // (and only those) a few times.
    let mut send = |path: &str, req: &Value, bin: Option<&[u8]>| -> Value {
        for _ in 0..10 {
            let r = match bin {
                None => h.post_json(path, req),
                Some(b) => h.post_binary(path, req, b),
            };
            match r.status {
                200 => return r.json(),
                429 | 504 => continue,
                s => panic!("{path}: HTTP {s}: {}", r.text()),
            }
        }
        panic!("{path}: no answer by the deadline in 10 tries");
    };
    for m in &models {
        let name = &m.meta.name;
        let text = std::fs::read_to_string(dir.join(format!("{name}.ref.json"))).unwrap();
        let rf: Value = serde_json::from_str(&text).unwrap();
        let batch = rf["batch"].as_u64().unwrap() as usize;
        // One sample's slice of a reference tensor.
        let row = |t: &Value, i: usize| -> Vec<Value> {
            let data = t["data"].as_array().unwrap();
            let n = data.len() / batch;
            data[i * n..(i + 1) * n].to_vec()
        };
        for i in 0..batch {
            let mut inputs = Vec::new();
            let mut bin_inputs = Vec::new();
            let mut bin = Vec::new();
            for t in rf["inputs"].as_array().unwrap() {
                let mut shape = t["shape"].as_array().unwrap().clone();
                shape[0] = json!(1);
                let data = row(t, i);
                let before = bin.len();
                for v in &data {
                    match t["datatype"].as_str().unwrap() {
                        "FP32" => {
                            bin.extend_from_slice(&(v.as_f64().unwrap() as f32).to_le_bytes())
                        }
                        "INT64" => bin.extend_from_slice(&v.as_i64().unwrap().to_le_bytes()),
                        d => panic!("reference datatype {d} not handled by this test"),
                    }
                }
                inputs.push(json!({"name": t["name"], "datatype": t["datatype"], "shape": shape, "data": data}));
                bin_inputs.push(
                    json!({"name": t["name"], "datatype": t["datatype"], "shape": shape,
                    "parameters": {"binary_data_size": bin.len() - before}}),
                );
            }
            let path = format!("/v2/models/{name}/infer");
            let answers = [
                send(&path, &json!({ "inputs": inputs }), None),
                send(&path, &json!({ "inputs": bin_inputs }), Some(&bin)),
            ];
            for v in &answers {
                for want in rf["outputs"].as_array().unwrap() {
                    let got = v["outputs"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|o| o["name"] == want["name"])
                        .unwrap_or_else(|| panic!("{name}: no output {}: {v}", want["name"]));
                    let mut shape = want["shape"].as_array().unwrap().clone();
                    shape[0] = json!(1);
                    assert_eq!(got["shape"], json!(shape), "{name} {}", want["name"]);
                    assert_eq!(got["datatype"], want["datatype"]);
                    let g = got["data"].as_array().unwrap();
                    let r = row(want, i);
                    assert_eq!(g.len(), r.len());
                    for (a, b) in g.iter().zip(&r) {
                        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
                        assert!(
                            (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                            "{name} sample {i} {}: {a} vs Python's {b}",
                            want["name"]
                        );
                    }
                }
            }
        }
    }
    let rep = c.stop().unwrap();
    let fe = &rep.frontends[0];
    assert_eq!(fe.good + fe.late + fe.dropped + fe.failed, fe.requests);
    assert_eq!(fe.failed, 0);
}

/// The shipped `ranker` with its ids' range [0, 31] dropped from the metadata
/// (so a bad id reaches ONNX Runtime), in a temporary repository.
fn ranker_without_range() -> std::path::PathBuf {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let dir = std::env::temp_dir().join(format!("fermata-norange-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["ranker.onnx", "ranker.profile-cpu.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut meta: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("ranker.json")).unwrap()).unwrap();
    meta["inputs"][1]
        .as_object_mut()
        .unwrap()
        .remove("range")
        .expect("the shipped ranker declares its ids' range");
    std::fs::write(dir.join("ranker.json"), meta.to_string()).unwrap();
    dir
}

/// An in-process cluster serving every model of the repository `dir` with
/// ONNX Runtime (one GPU), its frontend on HTTP; and the models.
fn onnx_cluster(
    dir: &std::path::Path,
    host: &str,
) -> (fermata::node::serve::Cluster, Vec<fermata::repo::RepoModel>) {
    let models = fermata::repo::load_repository(dir, "onnx").unwrap();
    let w = Workload::from_repository(host, &models, 1, 100.0).unwrap();
    let co = fermata::node::serve::ClusterOpts {
        host: host.into(),
        region_bytes: 16 << 20,
        executor: "onnx".into(),
        models_dir: dir.to_path_buf(),
        http: Some(HttpOpts::new("127.0.0.1:0")),
        // As in `cluster`: room for a late wake-up on a busy CI machine.
        min_slack: fermata::core::Dur::from_ms(3),
        ..Default::default()
    };
    let tr: Arc<dyn Transport> = Arc::new(InProc::global());
    let c = fermata::node::serve::Cluster::start(tr, &w, &co).unwrap();
    (c, models)
}

fn ranker_req(ids: [i64; 8]) -> Value {
    let dense = vec![0.5f32; 16];
    json!({"inputs": [
        {"name": "dense", "shape": [1, 16], "datatype": "FP32", "data": dense},
        {"name": "ids", "shape": [1, 8], "datatype": "INT64", "data": ids},
    ]})
}

/// A request whose ids lie outside the embedding table: with the range in the
/// metadata the frontend answers 400 naming it; without, ONNX Runtime fails the
/// batch, the backend finds the culprit by halving, and it alone fails — every
/// other request of the batch gets its output.
#[test]
fn one_bad_request_fails_alone() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let (c, _) = onnx_cluster(&shipped, "http-ranker-range");
    let addr = c.frontends[0].http_addr().unwrap();
    let mut h = Http::connect(addr);
    wait_for("ready", 10, || h.get("/v2/health/ready").status == 200);
    let r = h.post_json(
        "/v2/models/ranker/infer",
        &ranker_req([1, 2, 3, 900, 4, 5, 6, 7]),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error()
            .contains("input `ids`: element 3 is 900, outside the model's range [0, 31]"),
        "{}",
        r.error()
    );
    c.stop().unwrap();

    let dir = ranker_without_range();
    let (c, _) = onnx_cluster(&dir, "http-ranker-norange");
    let addr = c.frontends[0].http_addr().unwrap();
    wait_for("ready", 10, || {
        Http::connect(addr).get("/v2/health/ready").status == 200
    });
    let n = 12;
    let (mut good_ok, mut bad_500) = (0, 0);
    for round in 0..4 {
        let bar = Arc::new(std::sync::Barrier::new(n));
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let bar = bar.clone();
                std::thread::spawn(move || {
                    let mut h = Http::connect(addr);
                    let bad = i == round % n;
                    let ids = if bad {
                        [0, 1, 2, 3, 4, 5, 6, 1000]
                    } else {
                        [i as i64; 8]
                    };
                    bar.wait();
                    let r = h.post_json("/v2/models/ranker/infer", &ranker_req(ids));
                    (bad, r.status, r.text())
                })
            })
            .collect();
        for t in threads {
            let (bad, status, text) = t.join().unwrap();
            if bad {
                // 500 (the executor refused it) or, if it missed its
                // deadline first, 429/504; never 200.
                assert!(
                    [500, 429, 504].contains(&status),
                    "bad request: {status} {text}"
                );
                bad_500 += (status == 500) as u32;
            } else {
                assert_ne!(
                    status, 500,
                    "a good request failed with the bad one: {text}"
                );
                good_ok += (status == 200) as u32;
            }
        }
    }
    assert!(bad_500 >= 1, "the bad request reached the executor");
    assert!(
        good_ok >= 4 * (n as u32 - 1) / 2,
        "{good_ok} good requests answered 200"
    );
    let rep = c.stop().unwrap();
    let b = &rep.backends[0];
    assert_eq!(
        b.tasks_failed, bad_500 as u64,
        "only the bad requests failed: {b:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection that has sent nothing, or `part` of a request head.
fn idle_conn(a: SocketAddr, part: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(a).unwrap();
    if !part.is_empty() {
        s.write_all(part).unwrap();
    }
    s
}

/// Whether the server closed `s` within `within` (EOF or reset on read).
fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // an answer (e.g. 408) before the close
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Connections that wait (idle, or sending a head slowly) cannot lock clients
/// out: at the cap the longest-waiting one is closed to admit a new one, so
/// every legitimate request is served while a flood of 150 connections sits on
/// a cap of 32.
#[test]
fn a_connection_flood_closes_the_longest_waiting_not_the_service() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cl = cluster("127.0.0.1", 1, |h| h.max_connections = 32);
    let mut flood: Vec<TcpStream> = (0..150)
        .map(|i| {
            let part: &[u8] = if i % 3 == 0 {
                b"GET /v2/health/live HTTP/1.1\r\nHo"
            } else {
                b""
            };
            idle_conn(cl.http, part)
        })
        .collect();
    for k in 0..10 {
        let mut h = Http::connect(cl.http);
        let r = h.post_json(
            "/v2/models/tiny/infer",
            &tiny_json([1.0, 2.0, 3.0, 4.0], [k, 5]),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The first of the flood (idle, and half a head) were closed to make room.
    assert!(closed_by_server(&mut flood[0], Duration::from_secs(2)));
    assert!(closed_by_server(&mut flood[1], Duration::from_secs(2)));
    let mut h = Http::connect(cl.http);
    let t = h.get("/metrics").text();
    let evicted = sample(
        &t,
        "fermata_http_connections_closed_total{reason=\"evicted\"}",
    )
    .unwrap();
    // The flood's 150 over a cap of 32 (a legitimate client that leaves
    // makes room for the next).
    assert!(evicted >= 118.0, "{evicted} evicted\n{t}");
    let open = sample(&t, "fermata_http_connections").unwrap();
    assert!(open <= 33.0, "{open} open");
    drop(flood);
    cl.stop();
}

/// A head sent slowly and an idle keep-alive connection are closed after the
/// header timeout; a body that does not arrive gets 408 after the body timeout.
#[test]
fn slow_heads_idle_connections_and_slow_bodies_time_out() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cl = cluster("127.0.0.1", 1, |h| {
        h.header_timeout = Duration::from_millis(300);
        h.body_timeout = Duration::from_millis(300);
    });
    let mut slow = idle_conn(cl.http, b"GET /v2/health/live HTTP/1.1\r\n");
    let mut idle = Http::connect(cl.http);
    assert_eq!(idle.get("/v2/health/live").status, 200);
    let t0 = Instant::now();
    assert!(
        closed_by_server(&mut slow, Duration::from_secs(3)),
        "slow head still open"
    );
    assert!(
        closed_by_server(idle.r.get_mut(), Duration::from_secs(3)),
        "idle connection still open"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(150),
        "closed before the timeout"
    );
    let mut h = Http::connect(cl.http);
    let s = h.r.get_mut();
    s.write_all(
        b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n{\"inputs\":",
    )
    .unwrap();
    let r = h.read_resp();
    assert_eq!(r.status, 408, "{}", r.text());
    assert!(r.error().contains("--http-body-timeout-ms"), "{}", r.text());
    // Others are served meanwhile and after.
    let mut ok = Http::connect(cl.http);
    let r = ok.post_json(
        "/v2/models/tiny/infer",
        &tiny_json([1.0, 2.0, 3.0, 4.0], [1, 2]),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    cl.stop();
}

/// The issue's case: 1,100 idle connections to `fermata serve` under
/// `ulimit -n 1024`. The cap (the limit less 128) keeps the process out of
/// EMFILE, legitimate requests are served, and nothing floods the log.
///
/// The model (the default's profile and GPUs) has a generous SLO: the flood's
/// accepts and evictions run on the same cores as the server, and a request that
/// waits behind them in the accept queue spends its own deadline (its clock
/// starts when its bytes arrive), which is right but not what this test is
/// about. (With the default's 25 ms, one CI run of a debug build got 429
/// "expired".)
#[test]
fn a_thousand_idle_connections_under_a_1024_file_limit_stop_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = env!("CARGO_BIN_EXE_fermata");
    let dir = std::env::temp_dir().join(format!("fermata-flood-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wl = dir.join("w.toml");
    std::fs::write(
        &wl,
        "name = \"flood\"\ngpus = 8\nrate_rps = 100\n[[models]]\nname = \"resnet50\"\n\
         alpha_ms = 1.053\nbeta_ms = 5.072\nslo_ms = 400\ninput_bytes = 64\n",
    )
    .unwrap();
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        &format!(
            "ulimit -n 1024 && exec {bin} serve --http-port 0 --workload {}",
            wl.display()
        ),
    ])
    .stderr(std::process::Stdio::piped());
    let (mut child, mut out, _kill, addr) = spawn_serve(cmd);
    let mut h = Http::connect(addr);
    wait_for("ready", 10, || h.get("/v2/health/ready").status == 200);
    drop(h);
    let flood: Vec<TcpStream> = (0..1100).map(|_| idle_conn(addr, b"")).collect();
    let req = json!({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "UINT8",
                                 "parameters": {"binary_data_size": 64}}]});
    for _ in 0..20 {
        let mut h = Http::connect(addr);
        let r = h.post_binary("/v2/models/resnet50/infer", &req, &[3u8; 64]);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let mut h = Http::connect(addr);
    let t = h.get("/metrics").text();
    let evicted = sample(
        &t,
        "fermata_http_connections_closed_total{reason=\"evicted\"}",
    )
    .unwrap();
    assert!(evicted >= 1100.0 - 896.0, "{evicted} evicted");
    drop(flood);
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    let warnings = err.lines().filter(|l| l.contains("WARN")).count();
    assert!(warnings <= 2, "{warnings} warnings:\n{err}");
    assert!(!err.contains("accepting connections fails"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server started under a low soft open-file limit raises it to the hard
/// limit before it sets its connection cap (a soft limit of 1,024 would cap
/// it at 896 connections, below what one open-loop client opens under
/// overload).
#[test]
fn serve_raises_its_soft_open_file_limit_to_the_hard_one() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = env!("CARGO_BIN_EXE_fermata");
    let limits = |pid: u32| -> (u64, u64) {
        let t = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let l = t
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap()
            .to_string();
        let v: Vec<u64> = l
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        (v[0], v[1])
    };
    let hard = limits(std::process::id()).1;
    if hard <= 256 {
        eprintln!("hard open-file limit {hard}: nothing to raise");
        return;
    }
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        &format!("ulimit -Sn 256 && exec {bin} serve --http-port 0"),
    ])
    .stderr(std::process::Stdio::piped());
    let (child, _out, _kill, addr) = spawn_serve(cmd);
    let mut h = Http::connect(addr);
    wait_for("ready", 10, || h.get("/v2/health/ready").status == 200);
    let (soft, hard_child) = limits(child.id());
    assert_eq!(hard_child, hard, "the hard limit is the operator's");
    assert_eq!(soft, hard, "the soft limit was raised from 256");
}

/// The bodies buffered at once have a total budget: with room for two bodies
/// of 512 KiB, two clients that announce one each and send half of it hold
/// the room; a third body gets 503 with `Retry-After` before a byte of it is
/// read, a small one too; once the two are gone their room is back and the
/// same requests are served.
/// Bodies being received hold the buffered-bytes budget, HTTP bodies and
/// gRPC messages together: while two clients' bodies arrive and fill it, a new
/// HTTP body gets 503 with Retry-After and a gRPC call UNAVAILABLE. Once the
/// two stop sending (stuck mid-body), the fewest of them that make room give
/// way to new bodies (answered 503, the connection closed) instead of holding
/// it until the body timeout.
#[test]
fn buffered_bodies_have_a_total_budget() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster_with("bodies", 1, |o| o.max_buffered_bytes = 4 << 20, true);
    let grpc = c.fe.grpc_addr().unwrap();
    let flow = Arc::new(AtomicBool::new(true));
    // Each declares 2 MiB (taken at its head) and sends 16 KiB every 50 ms
    // (64 KiB, progress, every 200 ms) while `flow`: 6 s at most.
    let writers: Vec<_> = (0..2)
        .map(|_| {
            let (flow, addr) = (flow.clone(), c.http);
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                write!(
                    s,
                    "POST /v2/models/tiny/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    2 << 20
                )
                .unwrap();
                let mut sent = 0;
                while flow.load(Ordering::Acquire) && sent + (16 << 10) < (2 << 20) {
                    if s.write_all(&[b' '; 16 << 10]).is_err() {
                        break;
                    }
                    sent += 16 << 10;
                    std::thread::sleep(Duration::from_millis(50));
                }
                s
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let end = Instant::now() + Duration::from_secs(4);
    let r = loop {
        let r =
            Http::connect(c.http).post_json("/v2/models/tiny/infer", &tiny_json([1.0; 4], [1, 2]));
        if r.status == 503 || Instant::now() > end {
            break r;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.error().contains("--http-max-buffered-bytes"),
        "{}",
        r.text()
    );
    assert_eq!(r.headers.get("retry-after").map(String::as_str), Some("1"));
    // gRPC messages are in the same budget.
    let (status, msg) = grpc_infer_slowly(grpc, 1_000_000, Duration::ZERO);
    assert_eq!(status, "14", "UNAVAILABLE expected: {msg}");
    assert!(msg.contains("--http-max-buffered-bytes"), "{msg}");
    // The two stop sending, their bodies half read: new bodies get room.
    flow.store(false, Ordering::Release);
    let mut stuck: Vec<TcpStream> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    wait_for("stalled bodies to give way", 15, || {
        Http::connect(c.http)
            .post_json("/v2/models/tiny/infer", &tiny_json([1.0; 4], [1, 2]))
            .status
            == 200
    });
    let (status, msg) = grpc_infer_slowly(grpc, 1_000_000, Duration::ZERO);
    assert_eq!(status, "0", "{msg}");
    // The fewest that make room were evicted (one here: a small body needs
    // less than one holds), each connection closed by the server: with its
    // 503, or reset (the kernel resets a connection closed with unread bytes,
    // the body's, and the client may lose the answer to it). The other one
    // still holds its room.
    let mut closed = 0;
    for s in &mut stuck {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut got = Vec::new();
        let r = s.read_to_end(&mut got);
        let text = String::from_utf8_lossy(&got);
        if r.is_ok()
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset)
        {
            closed += 1;
            assert!(
                got.is_empty()
                    || (text.starts_with("HTTP/1.1 503") && text.contains("stopped arriving")),
                "{text}"
            );
        } else {
            assert!(got.is_empty(), "an answer to a body still held: {text}");
        }
    }
    let t = Http::connect(c.http).get("/metrics").text();
    assert_eq!(closed, 1);
    assert_eq!(sample(&t, "fermata_http_bodies_evicted_total"), Some(1.0));
    drop(stuck);
    c.stop();
}

/// Many gRPC streams stuck mid-message (each announced a 1 MiB message and
/// sent 48 KiB of it, then nothing) fill the budget the HTTP and gRPC
/// servers share; good gRPC and HTTP clients are still served: the stuck
/// messages give way (UNAVAILABLE, their streams end), or were refused
/// UNAVAILABLE at their first bytes when the budget was full.
#[test]
fn grpc_streams_stuck_mid_message_do_not_push_good_clients_out() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster_with("grpc-stuck", 1, |o| o.max_buffered_bytes = 1 << 20, true);
    let grpc = c.fe.grpc_addr().unwrap();
    const CONNS: usize = 4;
    const STREAMS: usize = 16;
    let hold = Arc::new(AtomicBool::new(true));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stuck = {
        let hold = hold.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut open = Vec::new();
                for _ in 0..CONNS {
                    let tcp = tokio::net::TcpStream::connect(grpc).await.unwrap();
                    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
                    tokio::spawn(conn);
                    let mut client = client.ready().await.unwrap();
                    for _ in 0..STREAMS {
                        let head = hyper::Request::post(format!(
                            "http://{grpc}/inference.GRPCInferenceService/ModelInfer"
                        ))
                        .header("content-type", "application/grpc")
                        .header("te", "trailers")
                        .body(())
                        .unwrap();
                        let Ok((answer, mut body)) = client.send_request(head, false) else {
                            break;
                        };
                        // The prefix of a 1 MiB message, then 48 KiB of it.
                        let mut part = vec![0u8];
                        part.extend_from_slice(&(1u32 << 20).to_be_bytes());
                        part.extend_from_slice(&[7u8; 48 << 10]);
                        let _ = body.send_data(hyper::body::Bytes::from(part), false);
                        open.push((answer, body));
                        client = client.ready().await.unwrap();
                    }
                }
                ready_tx.send(open.len()).unwrap();
                while hold.load(Ordering::Acquire) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // How the stuck streams ended: answered (UNAVAILABLE) or
                // still waiting.
                let mut answered = 0;
                for (answer, _body) in open {
                    if let Ok(Ok(_)) =
                        tokio::time::timeout(Duration::from_millis(100), answer).await
                    {
                        answered += 1;
                    }
                }
                answered
            })
        })
    };
    let opened = ready_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(opened, CONNS * STREAMS);
    // 64 streams x 48 KiB: three times the 1 MiB budget, announced.
    std::thread::sleep(Duration::from_millis(300));
    // Good clients, each with a message or body of 64 KiB (more than the
    // room the stuck ones left), get in: the stuck messages give way once
    // they stalled.
    let post_padded = || {
        let mut b = serde_json::to_vec(&tiny_json([1.0; 4], [1, 2])).unwrap();
        b.extend_from_slice(&[b' '; 64 << 10]);
        Http::connect(c.http).req(
            "POST",
            "/v2/models/tiny/infer",
            &[("content-type", "application/json".to_string())],
            &b,
        )
    };
    wait_for("a good gRPC call to be served", 20, || {
        grpc_infer_padded(grpc, 1_000_000, Duration::ZERO, 64 << 10).0 == "0"
    });
    wait_for("a good HTTP request to be served", 20, || {
        post_padded().status == 200
    });
    // And again, each at once now that the stuck ones have given way.
    for _ in 0..5 {
        let (status, msg) = grpc_infer_padded(grpc, 1_000_000, Duration::ZERO, 64 << 10);
        assert_eq!(status, "0", "{msg}");
        let r = post_padded();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let t = Http::connect(c.http).get("/metrics").text();
    hold.store(false, Ordering::Release);
    let answered = stuck.join().unwrap();
    assert!(
        sample(&t, "fermata_http_bodies_evicted_total").unwrap_or(0.0) >= 1.0,
        "stuck messages gave way: {t}"
    );
    assert!(
        answered >= 1,
        "the stuck streams were ended, {answered} answered"
    );
    c.stop();
}

#[test]
fn a_request_that_waited_past_its_deadline_is_refused_before_its_body_is_read() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster("http-door", 1, |_| {});
    let mut h = Http::connect(c.http);
    // Not JSON: a request whose body were decoded would get 400.
    let garbage = b"{not json at all".to_vec();
    // 20 bytes of the head, the rest 150 ms later: past `tiny`'s 100 ms SLO
    // before the head is parsed.
    let r = h.post_slowly(
        "/v2/models/tiny/infer",
        &garbage,
        20,
        Duration::from_millis(150),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.error().contains("refused at the door"), "{}", r.error());
    assert_eq!(r.headers.get("retry-after").map(String::as_str), Some("1"));
    // The same body sent at once is read and decoded: 400, on the same
    // connection (the refused request's body was drained).
    let r = h.req("POST", "/v2/models/tiny/infer", &[], &garbage);
    assert_eq!(r.status, 400, "{}", r.text());
    let mut ok = false;
    for _ in 0..5 {
        let r = h.post_json("/v2/models/tiny/infer", &tiny_json([1.0; 4], [1, 2]));
        if r.status == 200 {
            ok = true;
            break;
        }
        assert_eq!(r.status, 429, "{}", r.text());
    }
    assert!(ok, "5 requests in a row were dropped");
    let t = h.get("/metrics").text();
    assert_eq!(
        sample(&t, "fermata_http_refused_total{reason=\"deadline\"}"),
        Some(1.0),
        "{t}"
    );
    assert_eq!(
        sample(&t, "fermata_http_refused_total{reason=\"queue\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(&t, "fermata_http_refusal_seconds_count"),
        Some(1.0),
        "{t}"
    );
    for stage in ["head", "read", "decode", "answer"] {
        let n = sample(
            &t,
            &format!("fermata_http_wait_seconds_count{{stage=\"{stage}\"}}"),
        )
        .unwrap_or_else(|| panic!("no {stage} histogram: {t}"));
        assert!(n >= 1.0, "{stage}: {n}");
    }
    c.stop();
}
