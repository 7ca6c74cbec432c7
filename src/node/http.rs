//! The KServe v2 (Open Inference Protocol) HTTP API of a frontend, and the
//! Prometheus `/metrics` endpoint of every node.
//!
//! The server is hyper 1 (HTTP/1.1 with keep-alive) on its own small tokio runtime,
//! with hand-written routing: tokio is already the TCP transport's runtime, hyper is
//! the HTTP implementation under axum and most of the ecosystem, and the handful of
//! fixed routes does not need a framework's router, extractors or tower layers.
//!
//! An inference request is parsed and checked here (tensor names, datatypes,
//! shapes, byte counts; errors name the field), turned into the model's request
//! bytes ([`crate::repo`]: each input tensor's raw little-endian sample bytes in the
//! model's input order) and handed to the frontend's event loop in-process
//! ([`FrontendHandle::infer`]); the answer comes back on a oneshot channel and is
//! mapped to a status code:
//!
//! | outcome | status |
//! |---|---|
//! | output by the deadline | 200 |
//! | malformed JSON, unknown/missing/duplicate input, wrong shape, datatype or byte count, bad parameter | 400 |
//! | unknown model or route | 404 |
//! | body or tensor over the limits | 413 |
//! | dropped because it could not meet its deadline (expired, early drop, too late on its backend), queue full, overloaded, input region full | 429 |
//! | the backend failed to run it or read its input | 500 |
//! | no GPU in service, no scheduler, its backend lost, scheduler shutting down | 503 |
//! | late (output after the deadline) or no answer by the deadline plus the frontend's grace | 504 |
//!
//! Models without metadata (emulated, profile-only) appear as one `UINT8` input
//! `input` of shape `[-1, input_bytes]` and one `UINT8` output `output` of shape
//! `[-1, 16]` (the emulated GPU's length and checksum).

use super::exec::profile_of;
use super::frontend::{Ended, FrontendHandle, InferDone};
use crate::metrics::{self, Counter, Histogram, Registry, LATENCY_BUCKETS};
use crate::repo::{DType, ModelMeta, TensorMeta};
use crate::wire::{DropReason, ModelInfo};
use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The binary tensor extension's header: the length of the JSON part of a body.
pub const HEADER_LEN: &str = "inference-header-content-length";

/// The largest `parameters.timeout` accepted (microseconds): one hour.
pub const MAX_TIMEOUT_US: u64 = 3_600_000_000;

/// HTTP settings of a frontend.
#[derive(Clone)]
pub struct HttpOpts {
    /// host:port to listen on (port 0: any free port).
    pub listen: String,
    /// Worker threads of the HTTP runtime.
    pub threads: usize,
    /// Largest request body (bytes); larger ones get 413.
    pub max_body_bytes: usize,
    /// Largest input tensor a request may declare (bytes); larger ones get 413.
    pub max_tensor_bytes: usize,
    /// More registries rendered on `/metrics` with the frontend's own (the other
    /// nodes of `fermata serve`).
    pub extra_metrics: Vec<Arc<Registry>>,
}

impl std::fmt::Debug for HttpOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOpts")
            .field("listen", &self.listen)
            .field("threads", &self.threads)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_tensor_bytes", &self.max_tensor_bytes)
            .field("extra_metrics", &self.extra_metrics.len())
            .finish()
    }
}

impl HttpOpts {
    pub fn new(listen: &str) -> HttpOpts {
        HttpOpts {
            listen: listen.to_string(),
            threads: 1,
            max_body_bytes: 64 << 20,
            max_tensor_bytes: crate::workload::MAX_INPUT_BYTES as usize,
            extra_metrics: Vec::new(),
        }
    }
}

/// A model as the HTTP API shows it.
struct HttpModel {
    info: ModelInfo,
    /// Its tensors (synthesized for emulated models), or why its metadata is bad.
    meta: Result<ModelMeta, String>,
}

impl HttpModel {
    fn new(info: &ModelInfo) -> HttpModel {
        let meta = match info.meta() {
            Some(m) => m,
            None => Ok(ModelMeta {
                name: info.name.clone(),
                inputs: vec![TensorMeta {
                    name: "input".into(),
                    datatype: DType::U8,
                    shape: vec![-1, info.input_bytes as i64],
                }],
                outputs: vec![TensorMeta {
                    name: "output".into(),
                    datatype: DType::U8,
                    shape: vec![-1, 16],
                }],
                slo_ms: info.slo_ns as f64 / 1e6,
                max_batch: profile_of(&info.profile).map_or(1, |p| p.max_batch()),
                description: "emulated (profile only)".into(),
                batch_buckets: None,
            }),
        };
        HttpModel {
            info: info.clone(),
            meta,
        }
    }
}

/// Responses by status code.
struct Codes {
    by_code: Vec<(u16, Arc<Counter>)>,
}

const CODES: [u16; 11] = [200, 400, 404, 405, 413, 429, 500, 503, 504, 411, 408];

impl Codes {
    fn new(reg: &Registry) -> Codes {
        Codes {
            by_code: CODES
                .iter()
                .map(|&c| {
                    (
                        c,
                        reg.counter(
                            "fermata_http_responses_total",
                            "HTTP responses of the frontend's API, by status code.",
                            &[("code", &c.to_string())],
                        ),
                    )
                })
                .collect(),
        }
    }
    fn count(&self, code: StatusCode) {
        if let Some((_, c)) = self.by_code.iter().find(|(x, _)| *x == code.as_u16()) {
            c.inc();
        }
    }
}

struct App {
    fe: Option<FrontendHandle>,
    models: Vec<HttpModel>,
    by_name: HashMap<String, usize>,
    regs: Vec<Arc<Registry>>,
    max_body: usize,
    max_tensor: usize,
    codes: Option<Codes>,
    /// Per model: from the request's receipt to the response (infer only).
    infer_time: Vec<Arc<Histogram>>,
}

type Resp = Response<Full<Bytes>>;

fn respond(code: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

fn json_resp(code: StatusCode, v: &Value) -> Resp {
    respond(code, "application/json", v.to_string())
}

fn error(code: StatusCode, msg: impl Into<String>) -> Resp {
    json_resp(code, &json!({ "error": msg.into() }))
}

/// An error answer: status and message.
type Fail = (StatusCode, String);

fn bad(msg: impl Into<String>) -> Fail {
    (StatusCode::BAD_REQUEST, msg.into())
}

impl App {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Resp {
        let t0 = Instant::now();
        let path = req.uri().path().to_string();
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        let method = req.method().clone();
        let mut model_idx = None;
        let mut req = Some(req);
        let resp = match (&method, parts.as_slice()) {
            (&Method::GET, ["metrics"]) => {
                let regs: Vec<&Registry> = self.regs.iter().map(|r| r.as_ref()).collect();
                respond(
                    StatusCode::OK,
                    metrics::CONTENT_TYPE,
                    metrics::render(&regs),
                )
            }
            (&Method::GET, ["v2", "health", "live"]) => {
                json_resp(StatusCode::OK, &json!({"live": true}))
            }
            _ if self.fe.is_none() => error(
                StatusCode::NOT_FOUND,
                format!(
                    "no route for {method} {path}: this node serves /metrics and /v2/health/live"
                ),
            ),
            (&Method::GET, ["v2", "health", "ready"]) => match self.fe().ready() {
                Ok(()) => json_resp(StatusCode::OK, &json!({"ready": true})),
                Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}")),
            },
            (&Method::GET, ["v2"]) => json_resp(
                StatusCode::OK,
                &json!({
                    "name": "fermata",
                    "version": env!("CARGO_PKG_VERSION"),
                    "extensions": ["binary_tensor_data"],
                }),
            ),
            (_, ["v2", "models", name, rest @ ..]) => match self.by_name.get(*name) {
                None => error(
                    StatusCode::NOT_FOUND,
                    format!(
                        "unknown model `{name}` (served: {})",
                        self.models
                            .iter()
                            .map(|m| m.info.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
                Some(&i) => match (&method, rest) {
                    (&Method::GET, []) => self.metadata(i),
                    (&Method::GET, ["ready"]) => match self.fe().ready() {
                        Ok(()) => json_resp(
                            StatusCode::OK,
                            &json!({"name": self.models[i].info.name, "ready": true}),
                        ),
                        Err(e) => error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("model `{name}` is not ready: {e}"),
                        ),
                    },
                    (&Method::POST, ["infer"]) => {
                        model_idx = Some(i);
                        match self.infer(i, req.take().expect("once")).await {
                            Ok(r) => r,
                            Err((code, msg)) => error(code, msg),
                        }
                    }
                    (_, [] | ["ready"] | ["infer"]) => error(
                        StatusCode::METHOD_NOT_ALLOWED,
                        format!("{method} is not allowed on {path}"),
                    ),
                    _ => error(
                        StatusCode::NOT_FOUND,
                        format!("no route for {method} {path}"),
                    ),
                },
            },
            _ => error(
                StatusCode::NOT_FOUND,
                format!("no route for {method} {path}"),
            ),
        };
        // A body not read (an error answered first) is read and dropped, so a
        // keep-alive client can go on with its connection.
        if let Some(r) = req {
            let limit = self.max_body.max(64 << 10);
            let _ = Limited::new(r.into_body(), limit).collect().await;
        }
        if let Some(c) = &self.codes {
            c.count(resp.status());
        }
        if let Some(i) = model_idx {
            self.infer_time[i].observe_duration(t0.elapsed());
        }
        resp
    }

    fn fe(&self) -> &FrontendHandle {
        self.fe
            .as_ref()
            .expect("frontend routes only with a frontend")
    }

    fn metadata(&self, i: usize) -> Resp {
        let m = &self.models[i];
        match &m.meta {
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("model `{}` has bad metadata: {e}", m.info.name),
            ),
            Ok(meta) => {
                let t = |ts: &[TensorMeta]| -> Vec<Value> {
                    ts.iter()
                        .map(|t| {
                            json!({"name": t.name, "datatype": t.datatype.kserve_name(), "shape": t.shape})
                        })
                        .collect()
                };
                json_resp(
                    StatusCode::OK,
                    &json!({
                        "name": m.info.name,
                        "versions": ["1"],
                        "platform": "fermata",
                        "inputs": t(&meta.inputs),
                        "outputs": t(&meta.outputs),
                    }),
                )
            }
        }
    }

    async fn infer(&self, i: usize, req: Request<Incoming>) -> Result<Resp, Fail> {
        let m = &self.models[i];
        let meta = m.meta.as_ref().map_err(|e| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("model `{}` has bad metadata: {e}", m.info.name),
            )
        })?;
        let header_len = match req.headers().get(HEADER_LEN) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|s| s.trim().parse::<usize>().ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "header `Inference-Header-Content-Length` must be a byte count, got {v:?}"
                        ))
                    })?,
            ),
        };
        if let Some(n) = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok())
        {
            if n > self.max_body as u64 {
                return Err(too_large_body(n, self.max_body));
            }
        }
        let body = match Limited::new(req.into_body(), self.max_body).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    return Err(too_large_body(self.max_body as u64 + 1, self.max_body));
                }
                return Err(bad(format!("cannot read the request body: {e}")));
            }
        };
        let (head, bin) = match header_len {
            None => (&body[..], &body[..0]),
            Some(n) if n <= body.len() => (&body[..n], &body[n..]),
            Some(n) => {
                return Err(bad(format!(
                    "`Inference-Header-Content-Length` is {n} but the body has only {} bytes",
                    body.len()
                )))
            }
        };
        let d = decode_request(meta, head, bin, self.max_tensor)?;
        let done = self
            .fe()
            .infer(&m.info.name, d.slo_ns, d.input)
            .await
            .map_err(|_| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the frontend is stopping".to_string(),
                )
            })?;
        answer(&m.info, meta, &d.id, &d.outputs, done)
    }
}

fn too_large_body(n: u64, max: usize) -> Fail {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body of {n} bytes is over the limit of {max} bytes (--http-max-body-bytes)"
        ),
    )
}

#[derive(Deserialize)]
struct InferRequest {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    inputs: Vec<InputTensor>,
    #[serde(default)]
    outputs: Option<Vec<OutputRequest>>,
}

#[derive(Deserialize)]
struct InputTensor {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputRequest {
    name: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
}

/// A checked request.
struct Decoded {
    input: Vec<u8>,
    slo_ns: i64,
    id: Option<Value>,
    /// Outputs to return: index in the model's outputs, and whether as binary.
    outputs: Vec<(usize, bool)>,
}

fn param_bool(p: &Option<Map<String, Value>>, key: &str, what: &str) -> Result<Option<bool>, Fail> {
    match p.as_ref().and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(format!(
            "{what}.parameters.{key} must be true or false, got {v}"
        ))),
    }
}

fn shape_text(s: &[i64]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Checks an inference request against the model and builds its request bytes.
fn decode_request(
    meta: &ModelMeta,
    head: &[u8],
    bin: &[u8],
    max_tensor: usize,
) -> Result<Decoded, Fail> {
    let req: InferRequest =
        serde_json::from_slice(head).map_err(|e| bad(format!("malformed JSON request: {e}")))?;
    // The SLO: parameters.timeout in microseconds (Triton's unit); 0 or absent:
    // the model's default.
    let slo_ns = match req.parameters.as_ref().and_then(|p| p.get("timeout")) {
        None => 0,
        Some(v) => match v.as_u64() {
            Some(us) if us <= MAX_TIMEOUT_US => us as i64 * 1000,
            _ => {
                return Err(bad(format!(
                    "parameters.timeout must be an integer number of microseconds from 0 to {MAX_TIMEOUT_US}, got {v}"
                )))
            }
        },
    };
    let all_binary = param_bool(&req.parameters, "binary_data_output", "request")?.unwrap_or(false);
    let names = |ts: &[TensorMeta]| {
        ts.iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Each model input's bytes, found by name.
    let mut parts: Vec<Option<Vec<u8>>> = vec![None; meta.inputs.len()];
    let mut bin_at = 0usize;
    for (k, t) in req.inputs.iter().enumerate() {
        let Some(mi) = meta.inputs.iter().position(|x| x.name == t.name) else {
            return Err(bad(format!(
                "unknown input `{}` (inputs[{k}].name); the model's inputs are: {}",
                t.name,
                names(&meta.inputs)
            )));
        };
        if parts[mi].is_some() {
            return Err(bad(format!(
                "input `{}` is given twice (inputs[{k}])",
                t.name
            )));
        }
        let want = &meta.inputs[mi];
        let dt = DType::from_kserve(&t.datatype).ok_or_else(|| {
            bad(format!(
                "input `{}`: unknown datatype `{}` (inputs[{k}].datatype)",
                t.name, t.datatype
            ))
        })?;
        if dt != want.datatype {
            return Err(bad(format!(
                "input `{}`: datatype {} (inputs[{k}].datatype), the model expects {}",
                t.name,
                t.datatype,
                want.datatype.kserve_name()
            )));
        }
        // The declared size first (bounded before anything is allocated).
        let mut elems: u64 = 1;
        for &d in &t.shape {
            if d < 0 {
                return Err(bad(format!(
                    "input `{}`: negative dimension in shape {} (inputs[{k}].shape)",
                    t.name,
                    shape_text(&t.shape)
                )));
            }
            elems = elems.saturating_mul(d as u64);
        }
        let bytes = elems.saturating_mul(dt.size() as u64);
        if bytes > max_tensor as u64 {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "input `{}`: shape {} is {bytes} bytes, over the limit of {max_tensor} bytes per tensor (--http-max-tensor-bytes)",
                    t.name,
                    shape_text(&t.shape)
                ),
            ));
        }
        let mut expect = vec![1i64];
        expect.extend_from_slice(want.sample_shape());
        if t.shape != expect {
            return Err(bad(format!(
                "input `{}`: shape {} (inputs[{k}].shape), expected {} (one sample per request)",
                t.name,
                shape_text(&t.shape),
                shape_text(&expect)
            )));
        }
        let need = want.sample_bytes();
        let bin_size = match t
            .parameters
            .as_ref()
            .and_then(|p| p.get("binary_data_size"))
        {
            None => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                bad(format!(
                    "input `{}`: parameters.binary_data_size must be a byte count, got {v}",
                    t.name
                ))
            })?),
        };
        let data = match (bin_size, &t.data) {
            (Some(_), Some(_)) => {
                return Err(bad(format!(
                    "input `{}`: both `data` and parameters.binary_data_size are given",
                    t.name
                )))
            }
            (None, None) => {
                return Err(bad(format!(
                    "input `{}`: no `data` and no parameters.binary_data_size (inputs[{k}])",
                    t.name
                )))
            }
            (Some(n), None) => {
                if n != need as u64 {
                    return Err(bad(format!(
                        "input `{}`: parameters.binary_data_size is {n} bytes, the tensor {} {} needs {need}",
                        t.name,
                        shape_text(&expect),
                        want.datatype.kserve_name()
                    )));
                }
                if bin.len() - bin_at < need {
                    return Err(bad(format!(
                        "input `{}`: parameters.binary_data_size is {n} but only {} bytes of binary data are left after the JSON header",
                        t.name,
                        bin.len() - bin_at
                    )));
                }
                let b = bin[bin_at..bin_at + need].to_vec();
                bin_at += need;
                b
            }
            (None, Some(v)) => {
                let mut flat = Vec::with_capacity(want.sample_elems());
                flatten(v, &mut flat);
                if flat.len() != want.sample_elems() {
                    return Err(bad(format!(
                        "input `{}`: `data` has {} elements (inputs[{k}].data), the shape {} needs {}",
                        t.name,
                        flat.len(),
                        shape_text(&expect),
                        want.sample_elems()
                    )));
                }
                let mut out = Vec::with_capacity(need);
                for (j, e) in flat.iter().enumerate() {
                    encode_elem(dt, e, &mut out).ok_or_else(|| {
                        bad(format!(
                            "input `{}`: element {j} of `data` is {e}, not a valid {}",
                            t.name,
                            dt.kserve_name()
                        ))
                    })?;
                }
                out
            }
        };
        parts[mi] = Some(data);
    }
    if bin_at != bin.len() {
        return Err(bad(format!(
            "{} bytes of binary data after the JSON header, but the inputs' parameters.binary_data_size add up to {bin_at}",
            bin.len()
        )));
    }
    let mut input = Vec::with_capacity(meta.input_bytes());
    for (t, p) in meta.inputs.iter().zip(parts) {
        match p {
            Some(b) => input.extend_from_slice(&b),
            None => {
                return Err(bad(format!(
                    "missing input `{}`; the model's inputs are: {}",
                    t.name,
                    names(&meta.inputs)
                )))
            }
        }
    }
    let outputs = match &req.outputs {
        None => (0..meta.outputs.len()).map(|i| (i, all_binary)).collect(),
        Some(os) => {
            let mut v = Vec::new();
            for (k, o) in os.iter().enumerate() {
                let Some(i) = meta.outputs.iter().position(|x| x.name == o.name) else {
                    return Err(bad(format!(
                        "unknown output `{}` (outputs[{k}].name); the model's outputs are: {}",
                        o.name,
                        names(&meta.outputs)
                    )));
                };
                let b = param_bool(&o.parameters, "binary_data", &format!("outputs[{k}]"))?
                    .unwrap_or(all_binary);
                v.push((i, b));
            }
            v
        }
    };
    Ok(Decoded {
        input,
        slo_ns,
        id: req.id,
        outputs,
    })
}

/// Nested arrays flattened in row-major order.
fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| flatten(x, out)),
        x => out.push(x),
    }
}

/// Appends one element's little-endian bytes; None when it is not a `dt`.
fn encode_elem(dt: DType, v: &Value, out: &mut Vec<u8>) -> Option<()> {
    match dt {
        DType::Bool => out.push(v.as_bool()? as u8),
        DType::U8 => out.push(u8::try_from(v.as_u64()?).ok()?),
        DType::I8 => out.extend_from_slice(&i8::try_from(v.as_i64()?).ok()?.to_le_bytes()),
        DType::I32 => out.extend_from_slice(&i32::try_from(v.as_i64()?).ok()?.to_le_bytes()),
        DType::I64 => out.extend_from_slice(&v.as_i64()?.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f32_to_f16(v.as_f64()? as f32).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(v.as_f64()? as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&v.as_f64()?.to_le_bytes()),
    }
    Some(())
}

/// One output tensor's elements as JSON values.
fn decode_elems(dt: DType, b: &[u8]) -> Vec<Value> {
    let n = dt.size();
    b.chunks_exact(n)
        .map(|c| match dt {
            DType::Bool => Value::Bool(c[0] != 0),
            DType::U8 => json!(c[0]),
            DType::I8 => json!(c[0] as i8),
            DType::I32 => json!(i32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::I64 => json!(i64::from_le_bytes(c.try_into().expect("8 bytes"))),
            DType::F16 => json!(f16_to_f32(u16::from_le_bytes(
                c.try_into().expect("2 bytes")
            ))),
            DType::F32 => json!(f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::F64 => json!(f64::from_le_bytes(c.try_into().expect("8 bytes"))),
        })
        .collect()
}

/// IEEE 754 binary32 to binary16 bits, rounding to nearest even (the `half` crate,
/// which ONNX Runtime's FP16 tensors use too).
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// IEEE 754 binary16 bits to binary32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

fn drop_text(c: DropReason) -> &'static str {
    match c {
        DropReason::Expired => "it could not finish by its deadline even in a batch of one",
        DropReason::EarlyDrop => {
            "it could not meet its deadline in a batch the load needs (early drop)"
        }
        DropReason::TooLate => "its batch could not start in time for its deadline",
        DropReason::QueueFull => "the model's queue is full",
        DropReason::Overloaded => "the scheduler is overloaded",
        DropReason::ModelRemoved => "the model was removed",
        DropReason::Shutdown => "the scheduler is shutting down",
        DropReason::BackendLost => "the backend running it was lost",
        DropReason::UnknownModel => "the scheduler does not know the model",
        DropReason::NoGpu => "no GPU is in service: no backend can serve the model",
    }
}

/// The HTTP answer for a finished request.
fn answer(
    info: &ModelInfo,
    meta: &ModelMeta,
    id: &Option<Value>,
    outputs: &[(usize, bool)],
    d: InferDone,
) -> Result<Resp, Fail> {
    let ms = |x: Duration| x.as_secs_f64() * 1e3;
    let code = match d.ended {
        Ended::Good => StatusCode::OK,
        Ended::Late | Ended::TimedOut => StatusCode::GATEWAY_TIMEOUT,
        Ended::Dropped(
            DropReason::NoGpu
            | DropReason::Shutdown
            | DropReason::ModelRemoved
            | DropReason::UnknownModel,
        )
        | Ended::NoScheduler
        | Ended::BackendLost => StatusCode::SERVICE_UNAVAILABLE,
        Ended::Dropped(DropReason::BackendLost) => StatusCode::SERVICE_UNAVAILABLE,
        Ended::Dropped(_) | Ended::RegionFull => StatusCode::TOO_MANY_REQUESTS,
        Ended::BadRequest => StatusCode::BAD_REQUEST,
        Ended::Failed => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if code != StatusCode::OK {
        let msg = match d.ended {
            Ended::Late => format!(
                "deadline exceeded: the result came after the deadline ({:.2} ms after receipt, SLO {:.2} ms by default)",
                ms(d.latency),
                info.slo_ns as f64 / 1e6
            ),
            Ended::TimedOut => format!(
                "deadline exceeded: no result by the deadline plus the frontend's grace ({:.2} ms)",
                ms(d.latency)
            ),
            Ended::Dropped(c) => format!(
                "dropped ({}): {}",
                super::scheduler::drop_reason_label(c),
                drop_text(c)
            ),
            _ => d.message,
        };
        return Err((code, msg));
    }
    if d.output.len() != meta.output_bytes() {
        return Err((
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the backend returned {} output bytes; the model's outputs are {} bytes",
                d.output.len(),
                meta.output_bytes()
            ),
        ));
    }
    let mut offs = Vec::with_capacity(meta.outputs.len());
    let mut at = 0;
    for t in &meta.outputs {
        offs.push(at);
        at += t.sample_bytes();
    }
    let mut bin = Vec::new();
    let mut outs = Vec::with_capacity(outputs.len());
    for &(i, binary) in outputs {
        let t = &meta.outputs[i];
        let bytes = &d.output[offs[i]..offs[i] + t.sample_bytes()];
        let mut shape = vec![1i64];
        shape.extend_from_slice(t.sample_shape());
        let mut o = json!({"name": t.name, "datatype": t.datatype.kserve_name(), "shape": shape});
        if binary {
            o["parameters"] = json!({"binary_data_size": bytes.len()});
            bin.extend_from_slice(bytes);
        } else {
            o["data"] = Value::Array(decode_elems(t.datatype, bytes));
        }
        outs.push(o);
    }
    let mut body = json!({
        "model_name": info.name,
        "model_version": "1",
        "outputs": outs,
        "parameters": {
            "fermata_latency_us": d.latency.as_secs_f64() * 1e6,
            "fermata_queue_us": d.queue.as_secs_f64() * 1e6,
            "fermata_batch_size": d.batch_size,
        },
    });
    if let Some(id) = id {
        body["id"] = id.clone();
    }
    let head = body.to_string();
    if bin.is_empty() && !outputs.iter().any(|o| o.1) {
        return Ok(respond(StatusCode::OK, "application/json", head));
    }
    let hl = head.len();
    let mut all = head.into_bytes();
    all.extend_from_slice(&bin);
    let mut r = respond(StatusCode::OK, "application/octet-stream", all);
    r.headers_mut().insert(
        HEADER_LEN,
        HeaderValue::from_str(&hl.to_string()).expect("a number is a header value"),
    );
    Ok(r)
}

/// A running HTTP server (its own tokio runtime).
pub struct HttpServer {
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

impl HttpServer {
    /// The KServe v2 API of `fe`, with `/metrics`.
    pub fn start_frontend(fe: FrontendHandle, o: &HttpOpts) -> Result<HttpServer> {
        let reg = fe.metrics();
        let models: Vec<HttpModel> = fe.models().iter().map(HttpModel::new).collect();
        let infer_time = models
            .iter()
            .map(|m| {
                reg.histogram(
                    "fermata_http_request_duration_seconds",
                    "Infer requests over HTTP: from the request's headers to its response.",
                    &[("model", &m.info.name)],
                    Histogram::seconds(LATENCY_BUCKETS),
                )
            })
            .collect();
        let mut regs = vec![reg.clone()];
        regs.extend(o.extra_metrics.iter().cloned());
        let app = App {
            by_name: models
                .iter()
                .enumerate()
                .map(|(i, m)| (m.info.name.clone(), i))
                .collect(),
            models,
            fe: Some(fe),
            regs,
            max_body: o.max_body_bytes,
            max_tensor: o.max_tensor_bytes,
            codes: Some(Codes::new(&reg)),
            infer_time,
        };
        Self::start(app, &o.listen, o.threads)
    }

    /// `/metrics` (and `/v2/health/live`) only: the scheduler's and backends'.
    pub fn start_metrics(listen: &str, regs: Vec<Arc<Registry>>) -> Result<HttpServer> {
        let app = App {
            fe: None,
            models: Vec::new(),
            by_name: HashMap::new(),
            regs,
            max_body: 0,
            max_tensor: 0,
            codes: None,
            infer_time: Vec::new(),
        };
        Self::start(app, listen, 1)
    }

    fn start(app: App, listen: &str, threads: usize) -> Result<HttpServer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("http")
            .enable_all()
            .build()
            .context("cannot start the HTTP runtime")?;
        let std_listener = std::net::TcpListener::bind(listen)
            .with_context(|| format!("cannot listen for HTTP at {listen}"))?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let app = Arc::new(app);
        rt.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(std_listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "http: cannot use the listening socket");
                    return;
                }
            };
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "http: accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let app = app.clone();
                        async move { Ok::<_, std::convert::Infallible>(app.handle(req).await) }
                    });
                    if let Err(e) = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await
                    {
                        tracing::debug!(%peer, error = %e, "http: connection ended with an error");
                    }
                });
            }
        });
        Ok(HttpServer { addr, rt: Some(rt) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes every connection (requests in flight still end
    /// at the frontend; their answers go nowhere).
    pub fn stop(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ModelMeta {
        ModelMeta::from_json(
            r#"{"name":"m","inputs":[{"name":"x","datatype":"FP32","shape":[-1,2,2]},{"name":"ids","datatype":"INT64","shape":[-1,1]}],
               "outputs":[{"name":"y","datatype":"INT64","shape":[-1,2]}],"slo_ms":20,"max_batch":8}"#,
        )
        .unwrap()
    }

    #[test]
    fn json_inputs_become_request_bytes_in_model_order() {
        let m = meta();
        let body = br#"{"id":"a","parameters":{"timeout":1500},"inputs":[
            {"name":"ids","shape":[1,1],"datatype":"INT64","data":[-7]},
            {"name":"x","shape":[1,2,2],"datatype":"FP32","data":[[1,2],[3.5,4]]}]}"#;
        let d = decode_request(&m, body, &[], 1 << 20).unwrap_or_else(|e| panic!("{e:?}"));
        let mut want = Vec::new();
        for f in [1.0f32, 2.0, 3.5, 4.0] {
            want.extend_from_slice(&f.to_le_bytes());
        }
        want.extend_from_slice(&(-7i64).to_le_bytes());
        assert_eq!(d.input, want);
        assert_eq!(d.slo_ns, 1_500_000);
        assert_eq!(d.outputs, vec![(0, false)]);
    }

    #[test]
    fn bad_requests_name_the_field() {
        let m = meta();
        let err = |b: &str| {
            decode_request(&m, b.as_bytes(), &[], 1 << 20)
                .err()
                .unwrap()
        };
        let ok_ids = r#"{"name":"ids","shape":[1,1],"datatype":"INT64","data":[1]}"#;
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,"a"]}}]}}"#
        ));
        assert!(e.1.contains("element 3 of `data`"), "{e:?}");
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3]}}]}}"#
        ));
        assert!(e.1.contains("`data` has 3 elements"), "{e:?}");
        let e = err(&format!(r#"{{"inputs":[{ok_ids}]}}"#));
        assert!(e.1.contains("missing input `x`"), "{e:?}");
        let e = err(&format!(r#"{{"inputs":[{ok_ids},{ok_ids}]}}"#));
        assert!(e.1.contains("given twice"), "{e:?}");
        let e = err(r#"{"inputs":[],"parameters":{"timeout":-1}}"#);
        assert!(e.1.contains("parameters.timeout"), "{e:?}");
        let e = err(
            r#"{"inputs":[{"name":"ids","shape":[1,100000000],"datatype":"INT64","data":[1]}]}"#,
        );
        assert_eq!(e.0, StatusCode::PAYLOAD_TOO_LARGE, "{e:?}");
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}}],"outputs":[{{"name":"z"}}]}}"#
        ));
        assert!(e.1.contains("unknown output `z`"), "{e:?}");
    }

    #[test]
    fn half_floats_round_trip() {
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            6.1035156e-5,
            5.9604645e-8,
            0.333333,
        ] {
            let h = f32_to_f16(x);
            let y = f16_to_f32(h);
            assert!((x - y).abs() <= x.abs() * 1e-3, "{x} -> {h:#x} -> {y}");
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert_eq!(f32_to_f16(1e-9), 0);
    }
}
