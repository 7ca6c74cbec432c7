//! The KServe v2 / Triton gRPC API of a frontend (`fermata frontend
//! --grpc-listen ADDR`, `fermata serve --grpc-port P`): the service
//! `inference.GRPCInferenceService` of proto/inference.proto, which Triton's
//! `tritonclient.grpc`, `perf_analyzer -i grpc` and KServe's
//! `InferenceGRPCClient` speak. tonic serves it on its own tokio runtime,
//! beside the HTTP API.
//!
//! It is the HTTP API's twin: a `ModelInfer` request is turned into the same
//! parsed request the JSON body gives (each input's raw or typed contents as
//! little-endian bytes of the binary part, its parameters as JSON values) and
//! checked by the same code ([`decode_parsed`]): the same batch dimension (a
//! task per sample), parameters, classification and errors. Outputs come back
//! as `raw_output_contents`, as Triton answers. The HTTP status of an error
//! maps to a gRPC code ([`code_of`]): 400 INVALID_ARGUMENT, 404 NOT_FOUND,
//! 413 RESOURCE_EXHAUSTED, 429 and 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED,
//! 500 INTERNAL. RPCs the service does not have (shared memory, repository
//! load/unload, trace and log settings) answer UNIMPLEMENTED.
//!
//! `ModelStreamInfer` takes a stream of requests and answers each on the
//! response stream as it finishes (an error as `error_message`), a few at
//! once per stream ([`STREAM_IN_FLIGHT`]).

/// The KServe v2 / Triton gRPC messages and service, generated from
/// proto/inference.proto (a Rust client can build its requests with them).
pub mod pb {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

mod budget;

/// Triton's model configuration (the `ModelConfig` call's answer).
use crate::triton_repo::pb as tc;

use crate::node::frontend::FrontendHandle;
use crate::node::http::errors::Fail;
use crate::node::http::model::Models;
use crate::node::http::request::{decode_parsed, InferRequest, InputTensor, OutputRequest};
use crate::node::http::response::{app_output_raw, check_done, output_raw, Summary};
use crate::node::http::server::{AcceptErrors, NoteRead, Stamped};
use crate::node::http::triton::{config_type, queue_timeout_us};
use crate::repo::{DType, ModelMeta};
use anyhow::{Context, Result};
use bytes::Bytes;
use hyper::StatusCode;
use pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use pb::infer_parameter::ParameterChoice;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio_stream::Stream;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status, Streaming};

/// Requests of one `ModelStreamInfer` stream being answered at once.
pub const STREAM_IN_FLIGHT: usize = 64;

/// gRPC settings of a frontend.
#[derive(Debug, Clone)]
pub struct GrpcOpts {
    /// host:port to listen on (port 0: any free port).
    pub listen: String,
    /// Worker threads of its runtime.
    pub threads: usize,
    /// Largest request message (bytes, after decompression); larger ones are
    /// refused with RESOURCE_EXHAUSTED.
    pub max_message_bytes: usize,
    /// Largest input tensor a request may declare (bytes).
    pub max_tensor_bytes: usize,
    /// Most bytes of request messages being received at once, all requests
    /// together ([`crate::node::http::default_buffered_bytes`]); a message
    /// beyond gets UNAVAILABLE.
    pub max_buffered_bytes: usize,
    /// The budget shared with the frontend's HTTP server (None: the gRPC
    /// server makes its own of `max_buffered_bytes`).
    pub bodies: Option<Arc<crate::node::http::BodyBudget>>,
}

impl GrpcOpts {
    pub fn new(listen: &str) -> GrpcOpts {
        GrpcOpts {
            listen: listen.to_string(),
            threads: crate::node::http::default_threads(),
            max_message_bytes: 64 << 20,
            max_tensor_bytes: crate::workload::MAX_INPUT_BYTES as usize,
            max_buffered_bytes: crate::node::http::default_buffered_bytes(),
            bodies: None,
        }
    }
}

/// When the latest read of a connection that brought bytes received them (the
/// kernel's receive time, see [`Stamped`]).
#[derive(Default)]
struct LastRead(Mutex<Option<Instant>>);

impl NoteRead for LastRead {
    fn note(&self, received: Instant) {
        *self.0.lock().expect("last read lock") = Some(received);
    }
}

impl LastRead {
    fn latest(&self) -> Option<Instant> {
        *self.0.lock().expect("last read lock")
    }
}

/// A connection's [`LastRead`] is in the extensions of every request on it
/// (tonic's connect info).
impl Connected for Stamped<LastRead> {
    type ConnectInfo = Arc<LastRead>;
    fn connect_info(&self) -> Arc<LastRead> {
        self.note().clone()
    }
}

/// When a request's headers were parsed, as the host received them: the
/// kernel's receive time of its connection's latest read at that moment.
///
/// HTTP/2 multiplexes a connection's requests, so the bytes of one request
/// cannot be told from a read; but the request's headers came in the latest
/// read or before it, so this is no earlier than they arrived, and it counts
/// the time they waited in the socket buffer while the server was busy (the
/// read after a stall returns bytes received during it, with their time). The
/// headers come before the message: a client that writes its message slowly
/// spends its own deadline, as over HTTP/1.1.
#[derive(Clone, Copy)]
struct Received(Instant);

/// The interceptor that stamps every request with [`Received`] when its
/// headers are parsed (before its message is read).
fn stamp_headers(mut r: Request<()>) -> Result<Request<()>, Status> {
    let at = r
        .extensions()
        .get::<Arc<LastRead>>()
        .and_then(|r| r.latest())
        .unwrap_or_else(Instant::now);
    r.extensions_mut().insert(Received(at));
    Ok(r)
}

/// The gRPC listener's connections, each [`Stamped`] (tonic's `TcpIncoming`
/// reads with plain `read`, which does not give receive times). An accept
/// error (EMFILE) pauses accepting as the HTTP server's does.
struct Accept {
    listener: tokio::net::TcpListener,
    errors: AcceptErrors,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stream for Accept {
    type Item = std::io::Result<Stamped<LastRead>>;
    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(p) = &mut this.pause {
            std::task::ready!(std::future::Future::poll(p.as_mut(), cx));
            this.pause = None;
        }
        match std::task::ready!(this.listener.poll_accept(cx)) {
            Ok((s, _)) => {
                this.errors.accepted();
                let _ = s.set_nodelay(true);
                Poll::Ready(Some(Ok(Stamped::new(s, Arc::new(LastRead::default())))))
            }
            Err(e) => {
                let wait = this.errors.note("grpc", &e, Instant::now());
                this.pause = Some(Box::pin(tokio::time::sleep(wait)));
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}

/// A running gRPC server (its own tokio runtime).
pub struct GrpcServer {
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl GrpcServer {
    /// Serves `fe`'s models at `o.listen`.
    pub fn start(fe: FrontendHandle, o: &GrpcOpts) -> Result<GrpcServer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(o.threads.max(1))
            .thread_name("grpc")
            .enable_all()
            .build()
            .context("cannot start the gRPC runtime")?;
        let std_listener = crate::node::http::server::listen_std(&o.listen)
            .with_context(|| format!("cannot listen for gRPC at {}", o.listen))?;
        let addr = std_listener.local_addr()?;
        let metrics = fe.metrics();
        let svc = Svc {
            models: Models::new(fe.models(), fe.apps()),
            fe,
            max_tensor: o.max_tensor_bytes,
        };
        let service = GrpcInferenceServiceServer::new(Arc::new(svc))
            .max_decoding_message_size(o.max_message_bytes)
            .max_encoding_message_size(usize::MAX)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Deflate)
            .send_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Deflate);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let listener = {
            let _g = rt.enter();
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let service = tonic::service::interceptor::InterceptedService::new(service, stamp_headers);
        let service = budget::Budgeted {
            inner: service,
            budget: o.bodies.clone().unwrap_or_else(|| {
                crate::node::http::BodyBudget::with_metrics(o.max_buffered_bytes, &metrics)
            }),
        };
        rt.spawn(async move {
            let incoming = Accept {
                listener,
                errors: AcceptErrors::default(),
                pause: None,
            };
            let r = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stop_rx.await;
                })
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "grpc: the server failed");
            }
            let _ = done_tx.send(());
        });
        Ok(GrpcServer {
            addr,
            rt: Some(rt),
            stop: Some(stop_tx),
            done: Some(done_rx),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets the calls in flight finish (at most `grace`),
    /// then closes every connection.
    pub fn stop(mut self, grace: Duration) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let (Some(rt), Some(done)) = (self.rt.take(), self.done.take()) {
            let _ = rt.block_on(async { tokio::time::timeout(grace, done).await });
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The gRPC code of an HTTP status (see the module docs).
pub fn code_of(s: StatusCode) -> tonic::Code {
    use tonic::Code;
    match s.as_u16() {
        400 | 405 | 411 | 415 => Code::InvalidArgument,
        404 => Code::NotFound,
        408 | 504 => Code::DeadlineExceeded,
        413 => Code::ResourceExhausted,
        429 | 503 => Code::Unavailable,
        _ => Code::Internal,
    }
}

fn status((code, msg): Fail) -> Status {
    Status::new(code_of(code), msg)
}

/// A parameter's value as JSON, as the HTTP API's parameters are.
fn param_json(p: &pb::InferParameter) -> Value {
    match &p.parameter_choice {
        None => Value::Null,
        Some(ParameterChoice::BoolParam(b)) => Value::Bool(*b),
        Some(ParameterChoice::Int64Param(i)) => Value::from(*i),
        Some(ParameterChoice::StringParam(s)) => Value::String(s.clone()),
        Some(ParameterChoice::DoubleParam(d)) => Value::from(*d),
        Some(ParameterChoice::Uint64Param(u)) => Value::from(*u),
    }
}

fn params_json(m: &HashMap<String, pb::InferParameter>) -> Option<Map<String, Value>> {
    if m.is_empty() {
        return None;
    }
    Some(m.iter().map(|(k, v)| (k.clone(), param_json(v))).collect())
}

/// An input's typed contents as little-endian bytes of its datatype (only
/// the field its datatype reads may be set).
fn contents_bytes(
    name: &str,
    datatype: &str,
    c: &pb::InferTensorContents,
) -> Result<Vec<u8>, Fail> {
    let bad = |m: String| (StatusCode::BAD_REQUEST, m);
    let Some(dt) = DType::from_kserve(datatype) else {
        return Err(bad(format!(
            "input `{name}`: unknown datatype `{datatype}`"
        )));
    };
    let set = [
        ("bool_contents", c.bool_contents.len()),
        ("int_contents", c.int_contents.len()),
        ("int64_contents", c.int64_contents.len()),
        ("uint_contents", c.uint_contents.len()),
        ("uint64_contents", c.uint64_contents.len()),
        ("fp32_contents", c.fp32_contents.len()),
        ("fp64_contents", c.fp64_contents.len()),
        ("bytes_contents", c.bytes_contents.len()),
    ];
    let want = match dt {
        DType::Bool => "bool_contents",
        DType::U8 | DType::U16 | DType::U32 => "uint_contents",
        DType::U64 => "uint64_contents",
        DType::I8 | DType::I16 | DType::I32 => "int_contents",
        DType::I64 => "int64_contents",
        DType::F32 => "fp32_contents",
        DType::F64 => "fp64_contents",
        DType::Bytes => "bytes_contents",
        DType::F16 | DType::BF16 => {
            return Err(bad(format!(
                "input `{name}`: {datatype} data goes in raw_input_contents (there is no typed field for it)"
            )))
        }
    };
    if let Some((other, _)) = set.iter().find(|(f, n)| *n > 0 && *f != want) {
        return Err(bad(format!(
            "input `{name}`: contents.{other} given for datatype {datatype}, which reads contents.{want}"
        )));
    }
    let mut out = Vec::new();
    let small = |v: i64, lo: i64, hi: i64| {
        (lo..=hi).contains(&v).then_some(v).ok_or_else(|| {
            bad(format!(
                "input `{name}`: element {v} is not a valid {datatype}"
            ))
        })
    };
    match dt {
        DType::Bool => out.extend(c.bool_contents.iter().map(|&b| u8::from(b))),
        DType::U8 => {
            for &v in &c.uint_contents {
                out.push(small(v as i64, 0, 255)? as u8);
            }
        }
        DType::U16 => {
            for &v in &c.uint_contents {
                out.extend((small(v as i64, 0, 65_535)? as u16).to_le_bytes());
            }
        }
        DType::U32 => c
            .uint_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DType::U64 => c
            .uint64_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DType::I8 => {
            for &v in &c.int_contents {
                out.push(small(v as i64, -128, 127)? as i8 as u8);
            }
        }
        DType::I16 => {
            for &v in &c.int_contents {
                out.extend((small(v as i64, -32_768, 32_767)? as i16).to_le_bytes());
            }
        }
        DType::I32 => c
            .int_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DType::I64 => c
            .int64_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DType::F32 => c
            .fp32_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DType::F64 => c
            .fp64_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        // As the binary tensor extension has them (each element's u32 length,
        // then its bytes), which the request decoder reads for BYTES.
        DType::Bytes => {
            for v in &c.bytes_contents {
                let n = u32::try_from(v.len())
                    .map_err(|_| bad(format!("input `{name}`: an element over 4 GiB")))?;
                out.extend(n.to_le_bytes());
                out.extend_from_slice(v);
            }
        }
        DType::F16 | DType::BF16 => unreachable!("refused above"),
    }
    Ok(out)
}

/// The service (see the module docs).
struct Svc {
    fe: FrontendHandle,
    models: Models,
    max_tensor: usize,
}

impl Svc {
    /// Model `name` at `version` ("" or "1"): its index and metadata.
    fn model(&self, name: &str, version: &str) -> Result<(usize, &ModelMeta), Status> {
        let i = self.models.index(name).map_err(Status::not_found)?;
        Models::version(name, version).map_err(Status::not_found)?;
        let meta = self.models[i].meta().map_err(Status::internal)?;
        Ok((i, meta))
    }

    /// One inference (the unary call's and each stream message's).
    /// `received`: when the host received the request ([`Received`]).
    /// Loads or unloads model `name` through the scheduler (model control).
    async fn control(&self, name: &str, load: bool) -> Result<(), Status> {
        let i = self.models.index(name).map_err(Status::invalid_argument)?;
        self.fe
            .control_model(i, load, crate::node::frontend::control::CONTROL_WAIT)
            .await
            .map_err(|e| {
                Status::invalid_argument(format!(
                    "failed to {} '{name}': {e}",
                    if load { "load" } else { "unload" }
                ))
            })
    }

    async fn infer(
        &self,
        mut r: pb::ModelInferRequest,
        received: Instant,
    ) -> Result<pb::ModelInferResponse, Status> {
        let (i, meta) = self.model(&r.model_name, &r.model_version)?;
        let (st, _) = self.fe.model_state(i);
        if st != crate::wire::ModelAvailability::Ready {
            // As Triton answers a model it has not loaded: not a transient
            // refusal to retry.
            return Err(Status::invalid_argument(format!(
                "model '{}' is not loaded ({}); load it with RepositoryModelLoad",
                r.model_name,
                st.triton_name()
            )));
        }
        // Triton's flag for decoupled models (perf_analyzer sends it): each
        // answer here is the request's only one, so it is marked final.
        let final_flag = r
            .parameters
            .remove("triton_enable_empty_final_response")
            .is_some_and(|p| matches!(p.parameter_choice, Some(ParameterChoice::BoolParam(true))));
        let raw = !r.raw_input_contents.is_empty();
        if raw && r.raw_input_contents.len() != r.inputs.len() {
            return Err(Status::invalid_argument(format!(
                "raw_input_contents has {} entries for {} inputs: one per input, in their order",
                r.raw_input_contents.len(),
                r.inputs.len()
            )));
        }
        let mut raws = std::mem::take(&mut r.raw_input_contents);
        // The inputs' bytes one after another; one input's are its raw
        // contents themselves (a view of the message's buffer).
        let mut bins: Vec<Bytes> = Vec::with_capacity(r.inputs.len());
        let mut inputs = Vec::with_capacity(r.inputs.len());
        for (k, t) in std::mem::take(&mut r.inputs).into_iter().enumerate() {
            let bytes = match (&t.contents, raw) {
                (Some(_), true) => {
                    return Err(Status::invalid_argument(format!(
                        "input `{}`: both contents and raw_input_contents are given",
                        t.name
                    )))
                }
                (Some(c), false) => contents_bytes(&t.name, &t.datatype, c)
                    .map_err(status)?
                    .into(),
                (None, true) => std::mem::take(&mut raws[k]),
                (None, false) => {
                    return Err(Status::invalid_argument(format!(
                        "input `{}`: no contents and no raw_input_contents",
                        t.name
                    )))
                }
            };
            let params = params_json(&t.parameters).unwrap_or_default();
            inputs.push(InputTensor::binary(
                t.name,
                t.datatype,
                t.shape,
                params,
                bytes.len(),
            ));
            bins.push(bytes);
        }
        let bin = match bins.len() {
            1 => bins.pop().expect("one input"),
            _ => Bytes::from(bins.concat()),
        };
        let outputs = (!r.outputs.is_empty()).then(|| {
            r.outputs
                .iter()
                .map(|o| OutputRequest {
                    name: o.name.clone(),
                    parameters: params_json(&o.parameters),
                })
                .collect()
        });
        let req = InferRequest {
            id: (!r.id.is_empty()).then(|| Value::String(r.id.clone())),
            parameters: params_json(&r.parameters),
            inputs,
            outputs,
        };
        let d = decode_parsed(meta, req, &bin, self.max_tensor).map_err(status)?;
        drop(bin);
        if let Some(app) = &self.models[i].app {
            return self
                .infer_app(app, meta, d, r.id, final_flag, received)
                .await;
        }
        let done = self
            .fe
            .infer_samples(i, d.slo, d.samples, received)
            .await
            .map_err(|_| Status::unavailable("the frontend is stopping"))?;
        let info = &self.models[i].info;
        let checked = check_done(info, meta, &done);
        if let Some(s) = self.fe.stats(i) {
            s.request(checked.is_ok(), received.elapsed());
        }
        if let Err(e) = checked {
            self.fe.record_margins(i, &done);
            return Err(status(e));
        }
        let mut resp = pb::ModelInferResponse {
            model_name: info.name.clone(),
            model_version: "1".into(),
            id: r.id,
            ..Default::default()
        };
        for o in &d.outputs {
            push_output(&mut resp, meta, o, output_raw(meta, o, &done));
        }
        let sum = Summary::of(&done);
        let param = |p| pb::InferParameter {
            parameter_choice: Some(p),
        };
        let params = [
            (
                "fermata_latency_us",
                ParameterChoice::DoubleParam(sum.latency_us),
            ),
            (
                "fermata_queue_us",
                ParameterChoice::DoubleParam(sum.queue_us),
            ),
            (
                "fermata_batch_size",
                ParameterChoice::Int64Param(sum.batch_size as i64),
            ),
        ];
        resp.parameters
            .extend(params.into_iter().map(|(k, v)| (k.to_string(), param(v))));
        if final_flag {
            resp.parameters.insert(
                "triton_final_response".into(),
                param(ParameterChoice::BoolParam(true)),
            );
        }
        self.fe.record_margins(i, &done);
        Ok(resp)
    }
}

impl Svc {
    /// One inference of an application: each sample its own application
    /// request; the outputs of every sample in order (a fanned-out output
    /// has a row per item).
    async fn infer_app(
        &self,
        app: &Arc<crate::node::apps::ServedApp>,
        meta: &ModelMeta,
        d: crate::node::http::request::Decoded,
        id: String,
        final_flag: bool,
        received: Instant,
    ) -> Result<pb::ModelInferResponse, Status> {
        let n = d.samples.len();
        let done = crate::node::apps::run_samples(
            app.clone(),
            self.fe.clone(),
            d.slo,
            d.samples,
            received,
        )
        .await
        .map_err(|_| Status::unavailable("the frontend is stopping"))?;
        let mut ok = Vec::with_capacity(n);
        let mut failed = None;
        for (j, x) in done.into_iter().enumerate() {
            match x {
                Ok(x) => ok.push(x),
                Err((code, msg)) => {
                    let msg = if n > 1 {
                        format!("sample {j} of the request's {n}: {msg}")
                    } else {
                        msg
                    };
                    failed = Some((code, msg));
                    break;
                }
            }
        }
        app.stats.request(failed.is_none(), received.elapsed());
        if let Some(f) = failed {
            return Err(status(f));
        }
        let mut resp = pb::ModelInferResponse {
            model_name: meta.name.clone(),
            model_version: "1".into(),
            id,
            ..Default::default()
        };
        for o in &d.outputs {
            push_output(&mut resp, meta, o, app_output_raw(meta, o, &ok));
        }
        let param = |p| pb::InferParameter {
            parameter_choice: Some(p),
        };
        let most = |f: fn(&crate::node::apps::AppDone) -> f64| ok.iter().map(f).fold(0.0, f64::max);
        let params = [
            (
                "fermata_latency_us",
                ParameterChoice::DoubleParam(most(|x| x.latency.as_secs_f64() * 1e6)),
            ),
            (
                "fermata_queue_us",
                ParameterChoice::DoubleParam(most(|x| x.queue.as_secs_f64() * 1e6)),
            ),
            (
                "fermata_batch_size",
                ParameterChoice::Int64Param(
                    ok.iter().map(|x| x.batch_size).max().unwrap_or(0) as i64
                ),
            ),
        ];
        resp.parameters
            .extend(params.into_iter().map(|(k, v)| (k.to_string(), param(v))));
        if final_flag {
            resp.parameters.insert(
                "triton_final_response".into(),
                param(ParameterChoice::BoolParam(true)),
            );
        }
        Ok(resp)
    }
}

fn tensors(ts: &[crate::repo::TensorMeta]) -> Vec<pb::model_metadata_response::TensorMetadata> {
    ts.iter()
        .map(|t| pb::model_metadata_response::TensorMetadata {
            name: t.name.clone(),
            datatype: t.datatype.kserve_name().into(),
            shape: t.shape.clone(),
        })
        .collect()
}

/// An application's configuration as Triton gives an ensemble's.
fn app_config(
    app: &crate::node::apps::ServedApp,
    input: Vec<tc::ModelInput>,
    output: Vec<tc::ModelOutput>,
) -> tc::ModelConfig {
    let meta = &app.meta;
    let step = app
        .steps()
        .iter()
        .map(|s| tc::model_ensembling::Step {
            model_name: s.model.clone(),
            model_version: -1,
            input_map: s.input_map.clone().into_iter().collect(),
            output_map: s.output_map.clone().into_iter().collect(),
            ..Default::default()
        })
        .collect();
    let mut parameters = HashMap::new();
    parameters.insert(
        "slo_ms".to_string(),
        tc::ModelParameter {
            string_value: meta.slo_ms.to_string(),
        },
    );
    tc::ModelConfig {
        name: meta.name.clone(),
        platform: "ensemble".into(),
        max_batch_size: meta.max_batch as i32,
        input,
        output,
        scheduling_choice: Some(tc::model_config::SchedulingChoice::EnsembleScheduling(
            tc::ModelEnsembling {
                step,
                ..Default::default()
            },
        )),
        parameters,
        ..Default::default()
    }
}

fn data_type(d: DType) -> i32 {
    tc::DataType::from_str_name(config_type(d)).map_or(0, |t| t as i32)
}

fn duration(s: crate::node::frontend::stats::Stat) -> Option<pb::StatisticDuration> {
    Some(pb::StatisticDuration {
        count: s.count,
        ns: s.ns,
    })
}

type InferStream = Pin<Box<dyn Stream<Item = Result<pb::ModelStreamInferResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GrpcInferenceService for Arc<Svc> {
    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        Ok(Response::new(pb::ServerReadyResponse {
            ready: self.fe.ready().is_ok(),
        }))
    }

    async fn model_ready(
        &self,
        r: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let r = r.into_inner();
        // Triton answers false for a model or a version it does not have
        // (clients' `is_model_ready` expects an answer, not an error).
        let ready = self
            .models
            .index(&r.name)
            .is_ok_and(|i| self.fe.model_state(i).0 == crate::wire::ModelAvailability::Ready)
            && Models::version(&r.name, &r.version).is_ok()
            && self.fe.ready().is_ok();
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: "fermata".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: crate::node::http::triton::EXTENSIONS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }))
    }

    async fn model_metadata(
        &self,
        r: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let r = r.into_inner();
        let (i, meta) = self.model(&r.name, &r.version)?;
        Ok(Response::new(pb::ModelMetadataResponse {
            name: self.models[i].info.name.clone(),
            versions: vec!["1".into()],
            // The same name as the model's configuration gives.
            platform: match self.models[i].app {
                Some(_) => "ensemble".into(),
                None => crate::node::http::triton::platform(self.models[i].info.meta().is_none())
                    .0
                    .into(),
            },
            inputs: tensors(&meta.inputs),
            outputs: tensors(&meta.outputs),
        }))
    }

    async fn model_infer(
        &self,
        r: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let received = r
            .extensions()
            .get::<Received>()
            .map_or_else(Instant::now, |x| x.0);
        self.infer(r.into_inner(), received)
            .await
            .map(Response::new)
    }

    type ModelStreamInferStream = InferStream;

    async fn model_stream_infer(
        &self,
        r: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<InferStream>, Status> {
        // Each message is stamped with its connection's latest read when it
        // is decoded (it came in that read or an earlier one).
        let reads = r.extensions().get::<Arc<LastRead>>().cloned();
        let mut inbound = r.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_IN_FLIGHT);
        let svc = self.clone();
        let slots = Arc::new(tokio::sync::Semaphore::new(STREAM_IN_FLIGHT));
        tokio::spawn(async move {
            loop {
                let msg = match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        break;
                    }
                };
                let received = reads
                    .as_ref()
                    .and_then(|r| r.latest())
                    .unwrap_or_else(Instant::now);
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    break;
                };
                let (svc, tx) = (svc.clone(), tx.clone());
                tokio::spawn(async move {
                    let id = msg.id.clone();
                    let out = match svc.infer(msg, received).await {
                        Ok(resp) => pb::ModelStreamInferResponse {
                            error_message: String::new(),
                            infer_response: Some(resp),
                        },
                        Err(e) => pb::ModelStreamInferResponse {
                            error_message: e.message().to_string(),
                            infer_response: Some(pb::ModelInferResponse {
                                id,
                                ..Default::default()
                            }),
                        },
                    };
                    let _ = tx.send(Ok(out)).await;
                    drop(permit);
                });
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn model_config(
        &self,
        r: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let r = r.into_inner();
        let (i, meta) = self.model(&r.name, &r.version)?;
        let emulated = self.models[i].info.meta().is_none();
        let input = meta
            .inputs
            .iter()
            .map(|t| tc::ModelInput {
                name: t.name.clone(),
                data_type: data_type(t.datatype),
                dims: t.sample_shape().to_vec(),
                ..Default::default()
            })
            .collect();
        let output = meta
            .outputs
            .iter()
            .map(|t| tc::ModelOutput {
                name: t.name.clone(),
                data_type: data_type(t.datatype),
                dims: t.sample_shape().to_vec(),
                ..Default::default()
            })
            .collect();
        let (platform, backend) = crate::node::http::triton::platform(emulated);
        let mut parameters = HashMap::new();
        parameters.insert(
            "fermata_slo_ms".to_string(),
            tc::ModelParameter {
                string_value: meta.slo_ms.to_string(),
            },
        );
        if let Some(app) = &self.models[i].app {
            return Ok(Response::new(pb::ModelConfigResponse {
                config: Some(app_config(app, input, output)),
            }));
        }
        let config = tc::ModelConfig {
            name: meta.name.clone(),
            platform: platform.into(),
            backend: backend.into(),
            version_policy: Some(tc::ModelVersionPolicy {
                policy_choice: Some(tc::model_version_policy::PolicyChoice::Latest(
                    tc::model_version_policy::Latest { num_versions: 1 },
                )),
            }),
            max_batch_size: meta.max_batch as i32,
            input,
            output,
            instance_group: crate::node::http::triton::instance_groups(self.fe.model_devices(i))
                .into_iter()
                .enumerate()
                .map(|(g, (kind, count))| tc::ModelInstanceGroup {
                    name: format!("{}_{g}", meta.name),
                    count: count.min(i32::MAX as u32) as i32,
                    kind: kind as i32,
                    ..Default::default()
                })
                .collect(),
            scheduling_choice: Some(tc::model_config::SchedulingChoice::DynamicBatching(
                tc::ModelDynamicBatching {
                    preserve_ordering: true,
                    default_queue_policy: Some(tc::ModelQueuePolicy {
                        timeout_action: 0,
                        default_timeout_microseconds: queue_timeout_us(meta),
                        allow_timeout_override: true,
                        max_queue_size: 0,
                    }),
                    ..Default::default()
                },
            )),
            parameters,
            ..Default::default()
        };
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(config),
        }))
    }

    async fn model_statistics(
        &self,
        r: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let r = r.into_inner();
        let which: Vec<usize> = if r.name.is_empty() {
            (0..self.models.len()).collect()
        } else {
            vec![self.model(&r.name, &r.version)?.0]
        };
        let mut model_stats = Vec::new();
        for i in which {
            let Some(s) = self.models[i].stats(&self.fe, i) else {
                continue;
            };
            let v = s.snapshot();
            let n = v.compute_infer.count;
            let zero = |count| duration(crate::node::frontend::stats::Stat { count, ns: 0 });
            model_stats.push(pb::ModelStatistics {
                name: self.models[i].info.name.clone(),
                version: "1".into(),
                last_inference: v.last_inference_ms,
                inference_count: v.inference_count,
                execution_count: v.execution_count,
                inference_stats: Some(pb::InferStatistics {
                    success: duration(v.success),
                    fail: duration(v.fail),
                    queue: duration(v.queue),
                    compute_input: zero(n),
                    compute_infer: duration(v.compute_infer),
                    compute_output: zero(n),
                    cache_hit: zero(0),
                    cache_miss: zero(0),
                }),
                batch_stats: v
                    .batches
                    .iter()
                    .map(|b| pb::InferBatchStatistics {
                        batch_size: b.size,
                        compute_input: zero(b.count),
                        compute_infer: duration(crate::node::frontend::stats::Stat {
                            count: b.count,
                            ns: b.ns,
                        }),
                        compute_output: zero(b.count),
                    })
                    .collect(),
            });
        }
        Ok(Response::new(pb::ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        r: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        let ready_only = r.into_inner().ready;
        let up = self.fe.ready().is_ok();
        Ok(Response::new(pb::RepositoryIndexResponse {
            models: self
                .models
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let (st, reason) = self.fe.model_state(i);
                    let state = match st {
                        crate::wire::ModelAvailability::Ready if !up => "UNAVAILABLE",
                        st => st.triton_name(),
                    };
                    (!ready_only || state == "READY").then(|| {
                        pb::repository_index_response::ModelIndex {
                            name: m.info.name.clone(),
                            version: "1".into(),
                            state: state.into(),
                            reason,
                        }
                    })
                })
                .collect(),
        }))
    }

    async fn repository_model_load(
        &self,
        r: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let r = r.into_inner();
        self.control(&r.model_name, true).await?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        r: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let r = r.into_inner();
        self.control(&r.model_name, false).await?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        _: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
        Err(not_served("SystemSharedMemoryStatus", ""))
    }

    async fn system_shared_memory_register(
        &self,
        _: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
        Err(not_served("SystemSharedMemoryRegister", ""))
    }

    async fn system_shared_memory_unregister(
        &self,
        _: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
        Err(not_served("SystemSharedMemoryUnregister", ""))
    }

    async fn cuda_shared_memory_status(
        &self,
        _: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
        Err(not_served("CudaSharedMemoryStatus", ""))
    }

    async fn cuda_shared_memory_register(
        &self,
        _: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
        Err(not_served("CudaSharedMemoryRegister", ""))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
        Err(not_served("CudaSharedMemoryUnregister", ""))
    }

    async fn trace_setting(
        &self,
        _: Request<pb::TraceSettingRequest>,
    ) -> Result<Response<pb::TraceSettingResponse>, Status> {
        Err(not_served("TraceSetting", ""))
    }

    async fn log_settings(
        &self,
        _: Request<pb::LogSettingsRequest>,
    ) -> Result<Response<pb::LogSettingsResponse>, Status> {
        Err(not_served("LogSettings", ""))
    }
}

/// Appends output `o` of `meta` (its datatype, shape and raw bytes) to a
/// `ModelInfer` response: the same for a model's answer and an
/// application's.
fn push_output(
    resp: &mut pb::ModelInferResponse,
    meta: &ModelMeta,
    o: &crate::node::http::request::OutSpec,
    (datatype, shape, bytes): (&'static str, Vec<i64>, Vec<u8>),
) {
    resp.outputs
        .push(pb::model_infer_response::InferOutputTensor {
            name: meta.outputs[o.index].name.clone(),
            datatype: datatype.to_string(),
            shape,
            ..Default::default()
        });
    resp.raw_output_contents.push(bytes);
}

/// UNIMPLEMENTED for an RPC of Triton's service that Fermata does not serve,
/// saying why (the HTTP API's answers for the same extensions say the same).
fn not_served(rpc: &str, model: &str) -> Status {
    let why = match rpc {
        "RepositoryModelLoad" | "RepositoryModelUnload" => {
            "models are placed on GPUs by the scheduler from the repository fermata started with"
        }
        "TraceSetting" => "per-request timings are in each response's parameters",
        "LogSettings" => "fermata logs with RUST_LOG",
        _ => "inputs and outputs travel in the request and response",
    };
    let on = if model.is_empty() {
        String::new()
    } else {
        format!(" (model `{model}`)")
    };
    Status::unimplemented(format!(
        "{rpc}{on} is not supported by fermata ({why}); ServerMetadata lists the extensions it has"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_contents_become_little_endian_bytes_of_their_datatype() {
        let c = pb::InferTensorContents {
            fp32_contents: vec![1.5, -2.0],
            ..Default::default()
        };
        let b = contents_bytes("x", "FP32", &c).unwrap();
        assert_eq!(b, [1.5f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat());
        let c = pb::InferTensorContents {
            uint_contents: vec![7, 300],
            ..Default::default()
        };
        let e = contents_bytes("u", "UINT8", &c).unwrap_err();
        assert!(e.1.contains("300 is not a valid UINT8"), "{e:?}");
        let e = contents_bytes(
            "x",
            "INT64",
            &pb::InferTensorContents {
                fp32_contents: vec![1.0],
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(
            e.1.contains("contents.fp32_contents given for datatype INT64"),
            "{e:?}"
        );
        assert!(contents_bytes("h", "FP16", &c)
            .unwrap_err()
            .1
            .contains("raw_input_contents"));
    }

    #[test]
    fn http_statuses_map_to_grpc_codes() {
        for (http, grpc) in [
            (StatusCode::BAD_REQUEST, tonic::Code::InvalidArgument),
            (StatusCode::TOO_MANY_REQUESTS, tonic::Code::Unavailable),
            (StatusCode::GATEWAY_TIMEOUT, tonic::Code::DeadlineExceeded),
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                tonic::Code::ResourceExhausted,
            ),
            (StatusCode::INTERNAL_SERVER_ERROR, tonic::Code::Internal),
        ] {
            assert_eq!(code_of(http), grpc, "{http}");
        }
    }
}
