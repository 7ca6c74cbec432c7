//! The routes ([`App::handle`]): `/metrics`, health, server and model metadata,
//! model readiness and inference. An inference request's body is read (bounded),
//! decoded against the model, handed to the frontend's loop in-process
//! ([`FrontendHandle::infer`]) and its answer mapped to a response. Every
//! response is counted by status code; a body left unread is drained so that a
//! keep-alive client can go on with its connection.

use super::errors::{bad, error, too_large_body, Fail};
use super::metrics::{infer_time_histograms, Codes};
use super::model::HttpModel;
use super::options::HttpOpts;
use super::request::decode_request;
use super::response::{answer, json_resp, respond, Resp};
use super::tensor::HEADER_LEN;
use crate::metrics::{self, Histogram, Registry};
use crate::node::frontend::FrontendHandle;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_LENGTH;
use hyper::{Method, Request, StatusCode};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the server's handlers share.
pub(super) struct App {
    fe: Option<FrontendHandle>,
    models: Vec<HttpModel>,
    by_name: HashMap<String, usize>,
    regs: Vec<Arc<Registry>>,
    max_body: usize,
    max_tensor: usize,
    body_timeout: Duration,
    codes: Option<Codes>,
    /// Per model: from the request's receipt to the response (infer only).
    infer_time: Vec<Arc<Histogram>>,
    /// Extra read-only JSON documents: GET /PATH answers the function's JSON.
    json_gets: Vec<(String, JsonGet)>,
}

/// A read-only JSON document an HTTP server serves (e.g. the scheduler's
/// `/v1/autoscale`).
pub type JsonGet = Arc<dyn Fn() -> String + Send + Sync>;

impl App {
    /// The KServe v2 API of `fe`, with `/metrics` (its registry and `o`'s extra
    /// ones).
    pub(super) fn frontend(fe: FrontendHandle, o: &HttpOpts) -> App {
        let reg = fe.metrics();
        let models: Vec<HttpModel> = fe.models().iter().map(HttpModel::new).collect();
        let infer_time = infer_time_histograms(&reg, models.iter().map(|m| m.info.name.as_str()));
        let mut regs = vec![reg.clone()];
        regs.extend(o.extra_metrics.iter().cloned());
        App {
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
            body_timeout: o.body_timeout,
            codes: Some(Codes::new(&reg)),
            infer_time,
            json_gets: Vec::new(),
        }
    }

    /// `/metrics` (and `/v2/health/live`) only.
    pub(super) fn metrics_only(regs: Vec<Arc<Registry>>) -> App {
        App {
            fe: None,
            models: Vec::new(),
            by_name: HashMap::new(),
            regs,
            max_body: 0,
            max_tensor: 0,
            body_timeout: Duration::from_secs(1),
            codes: None,
            infer_time: Vec::new(),
            json_gets: Vec::new(),
        }
    }

    /// With extra JSON documents (path without the leading slash, producer).
    pub(super) fn with_json(mut self, gets: Vec<(String, JsonGet)>) -> App {
        self.json_gets = gets;
        self
    }

    /// Answers `req`, whose first byte was read at `t0`.
    pub(super) async fn handle(self: Arc<Self>, req: Request<Incoming>, t0: Instant) -> Resp {
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
            (&Method::GET, _)
                if self
                    .json_gets
                    .iter()
                    .any(|(p, _)| *p == path.trim_matches('/')) =>
            {
                let f = &self
                    .json_gets
                    .iter()
                    .find(|(p, _)| *p == path.trim_matches('/'))
                    .unwrap()
                    .1;
                respond(StatusCode::OK, "application/json", f())
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
                None => self.unknown_model(name),
                Some(&i) => {
                    let (r, infer) = self
                        .model_route((i, name, rest), (&method, &path), &mut req, t0)
                        .await;
                    model_idx = infer.then_some(i);
                    r
                }
            },
            _ => no_route(&method, &path),
        };
        self.done(req, &resp, model_idx, t0).await;
        resp
    }

    /// After the response: drains a body not read, counts the status code and,
    /// for an inference of model `model_idx`, its time since `t0`.
    async fn done(
        &self,
        req: Option<Request<Incoming>>,
        resp: &Resp,
        model_idx: Option<usize>,
        t0: Instant,
    ) {
        // A body not read (an error answered first) is read and dropped, so a
        // keep-alive client can go on with its connection.
        if let Some(r) = req {
            let limit = self.max_body.max(64 << 10);
            let drain = Limited::new(r.into_body(), limit).collect();
            let _ = tokio::time::timeout(self.body_timeout, drain).await;
        }
        if let Some(c) = &self.codes {
            c.count(resp.status());
        }
        if let Some(i) = model_idx {
            self.infer_time[i].observe_duration(t0.elapsed());
        }
    }

    fn unknown_model(&self, name: &str) -> Resp {
        error(
            StatusCode::NOT_FOUND,
            format!(
                "unknown model `{name}` (served: {})",
                self.models
                    .iter()
                    .map(|m| m.info.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    }

    /// `/v2/models/{name}/{rest}` of model `i` (`at`: the request's method and
    /// path); true with an inference (the request taken out of `req`).
    async fn model_route(
        &self,
        (i, name, rest): (usize, &str, &[&str]),
        at: (&Method, &str),
        req: &mut Option<Request<Incoming>>,
        t0: Instant,
    ) -> (Resp, bool) {
        let (method, path) = at;
        let r = match (method, rest) {
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
                let r = match self.infer(i, req.take().expect("once"), t0).await {
                    Ok(r) => r,
                    Err((code, msg)) => error(code, msg),
                };
                return (r, true);
            }
            (_, [] | ["ready"] | ["infer"]) => error(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} is not allowed on {path}"),
            ),
            _ => no_route(method, path),
        };
        (r, false)
    }

    fn fe(&self) -> &FrontendHandle {
        self.fe
            .as_ref()
            .expect("frontend routes only with a frontend")
    }

    fn metadata(&self, i: usize) -> Resp {
        let m = &self.models[i];
        match m.meta() {
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
            Ok(meta) => json_resp(StatusCode::OK, &m.metadata_json(meta)),
        }
    }

    /// An inference of model `i`, whose first byte was read at `received`: the
    /// model's SLO runs from there, so reading the body and writing the answer
    /// are inside it. The time from the batch's end to the answer built is the
    /// model's response margin, recorded for the scheduler to reserve.
    async fn infer(
        &self,
        i: usize,
        req: Request<Incoming>,
        received: Instant,
    ) -> Result<Resp, Fail> {
        let m = &self.models[i];
        let meta = m
            .meta()
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
        let header_len = header_len(&req)?;
        let body = self.read_body(req).await?;
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
        let d = if body.len() <= DECODE_INLINE_BYTES {
            decode_request(meta, head, bin, self.max_tensor)?
        } else {
            // A large body is decoded on the blocking pool (at most twice the
            // workers at once), so that the workers go on serving others.
            let (meta, body, max_tensor) = (meta.clone(), body.clone(), self.max_tensor);
            let split = head.len();
            tokio::task::spawn_blocking(move || {
                let (head, bin) = body.split_at(split);
                decode_request(&meta, head, bin, max_tensor)
            })
            .await
            .map_err(|e| {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("decoding the request failed: {e}"),
                )
            })??
        };
        let done = self
            .fe()
            .infer(&m.info.name, d.slo, d.input, received)
            .await
            .map_err(|_| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the frontend is stopping".to_string(),
                )
            })?;
        let finished_at = done.finished_at;
        let resp = answer(&m.info, meta, &d.id, &d.outputs, done);
        if let Some(f) = finished_at {
            self.fe().record_margin(i, f.elapsed());
        }
        resp
    }

    /// The request's body, at most `max_body` bytes (413 beyond, whether its
    /// `Content-Length` says so or its bytes do).
    async fn read_body(&self, req: Request<Incoming>) -> Result<Bytes, Fail> {
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(n) = declared {
            if n > self.max_body as u64 {
                return Err(too_large_body(n, self.max_body));
            }
        }
        // The body's bytes are gathered into one buffer of the declared size
        // (collecting the chunks and joining them held the body twice).
        let cap = declared.unwrap_or(0) as usize;
        let max = self.max_body;
        let read = async move {
            let mut body = req.into_body();
            let mut buf: Vec<u8> = Vec::with_capacity(cap);
            while let Some(f) = body.frame().await {
                let f = f.map_err(|e| bad(format!("cannot read the request body: {e}")))?;
                if let Ok(d) = f.into_data() {
                    if buf.len() + d.len() > max {
                        return Err(too_large_body((buf.len() + d.len()) as u64, max));
                    }
                    buf.extend_from_slice(&d);
                }
            }
            Ok(Bytes::from(buf))
        };
        match tokio::time::timeout(self.body_timeout, read).await {
            Ok(r) => r,
            Err(_) => Err((
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} ms of its head (--http-body-timeout-ms)",
                    self.body_timeout.as_millis()
                ),
            )),
        }
    }
}

/// Bodies up to this size are decoded on the HTTP worker that read them.
const DECODE_INLINE_BYTES: usize = 256 << 10;

/// The binary tensor extension's header: the length of the body's JSON part
/// (None: all of it).
fn header_len(req: &Request<Incoming>) -> Result<Option<usize>, Fail> {
    match req.headers().get(HEADER_LEN) {
        None => Ok(None),
        Some(v) => Ok(Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    bad(format!(
                        "header `Inference-Header-Content-Length` must be a byte count, got {v:?}"
                    ))
                })?,
        )),
    }
}

fn no_route(method: &Method, path: &str) -> Resp {
    error(
        StatusCode::NOT_FOUND,
        format!("no route for {method} {path}"),
    )
}
