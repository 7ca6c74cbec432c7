//! The routes ([`App::handle`]): `/metrics`, health, server and model metadata,
//! model readiness and inference. An inference request's body is read (bounded),
//! decoded against the model, handed to the frontend's loop in-process
//! ([`FrontendHandle::infer`]) and its answer mapped to a response. Every
//! response is counted by status code; a body left unread is drained so that a
//! keep-alive client can go on with its connection.

use super::admission::{Answer, Door, Refusal};
use super::body_budget::{BodyBudget, Held};
use super::errors::{bad, error, too_large_body, Fail};
use super::metrics::{infer_time_histograms, Codes, Waits};
use super::model::Models;
use super::options::HttpOpts;
use super::request::{decode_raw, decode_request};
use super::response::{answer, app_answer, json_resp, respond, Resp};
use super::server::Life;
use super::tensor::HEADER_LEN;
use super::triton::{app_config_json, config_json, stats_json, EXTENSIONS};
use crate::metrics::{self, Histogram, Registry};
use crate::node::frontend::FrontendHandle;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use hyper::{Method, Request, StatusCode};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the server's handlers share.
pub(super) struct App {
    fe: Option<FrontendHandle>,
    models: Models,
    regs: Vec<Arc<Registry>>,
    max_body: usize,
    /// The total of bodies buffered at once.
    bodies: Arc<BodyBudget>,
    max_tensor: usize,
    body_timeout: Duration,
    codes: Option<Codes>,
    /// Per model: from the request's receipt to the response (infer only).
    infer_time: Vec<Arc<Histogram>>,
    /// Admission at the door (None: metrics-only server).
    door: Option<Mutex<Door>>,
    /// Where requests wait, and the door's refusals.
    waits: Option<Waits>,
    /// The door's clock starts here.
    start: Instant,
    /// Extra read-only JSON documents: GET /PATH answers the function's JSON.
    json_gets: Vec<(String, JsonGet)>,
    /// Draining (readiness 503) and the requests being answered.
    pub(super) life: Arc<Life>,
}

/// Counts a request being answered while it lives.
struct InFlight<'a>(&'a Life);

impl<'a> InFlight<'a> {
    fn new(l: &'a Life) -> Self {
        l.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(l)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A read-only JSON document an HTTP server serves (e.g. the scheduler's
/// `/v1/autoscale`).
pub type JsonGet = Arc<dyn Fn() -> String + Send + Sync>;

impl App {
    /// The KServe v2 API of `fe`, with `/metrics` (its registry and `o`'s extra
    /// ones).
    pub(super) fn frontend(fe: FrontendHandle, o: &HttpOpts) -> App {
        let reg = fe.metrics();
        let models = Models::new(fe.models(), fe.apps());
        // The least time an answer of each model takes: its l(1) (an
        // application's: its longest path's).
        let need: Vec<Duration> = fe
            .models()
            .iter()
            .map(|m| Duration::from_nanos(crate::node::exec::least_latency(&m.profile).0 as u64))
            .chain(fe.apps().iter().map(|a| a.min_latency))
            .collect();
        let infer_time = infer_time_histograms(&reg, models.iter().map(|m| m.info.name.as_str()));
        let mut regs = vec![reg.clone()];
        regs.extend(o.extra_metrics.iter().cloned());
        App {
            models,
            fe: Some(fe),
            regs,
            max_body: o.max_body_bytes,
            bodies: o
                .bodies
                .clone()
                .unwrap_or_else(|| BodyBudget::with_metrics(o.max_buffered_bytes, &reg)),
            max_tensor: o.max_tensor_bytes,
            body_timeout: o.body_timeout,
            codes: Some(Codes::new(&reg)),
            door: Some(Mutex::new(Door::new(&need, o.max_pending))),
            waits: Some(Waits::new(&reg)),
            start: Instant::now(),
            infer_time,
            json_gets: Vec::new(),
            life: Arc::default(),
        }
    }

    /// `/metrics` (and `/v2/health/live`) only.
    pub(super) fn metrics_only(regs: Vec<Arc<Registry>>) -> App {
        App {
            fe: None,
            models: Models::new(&[], &[]),
            regs,
            max_body: 0,
            bodies: BodyBudget::new(0),
            max_tensor: 0,
            body_timeout: Duration::from_secs(1),
            codes: None,
            door: None,
            waits: None,
            start: Instant::now(),
            infer_time: Vec::new(),
            json_gets: Vec::new(),
            life: Arc::default(),
        }
    }

    /// With extra JSON documents (path without the leading slash, producer).
    pub(super) fn with_json(mut self, gets: Vec<(String, JsonGet)>) -> App {
        self.json_gets = gets;
        self
    }

    /// Answers `req`, whose first byte was read at `t0`.
    pub(super) async fn handle(self: Arc<Self>, req: Request<Incoming>, t0: Instant) -> Resp {
        let _in_flight = InFlight::new(&self.life);
        let path = req.uri().path().to_string();
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        // HEAD is answered as GET (hyper leaves the body out).
        let method = match req.method() {
            &Method::HEAD => Method::GET,
            m => m.clone(),
        };
        let mut model_idx = None;
        let mut req = Some(req);
        let resp = match (&method, parts.as_slice()) {
            (&Method::GET, ["metrics"]) => {
                let accept = req
                    .as_ref()
                    .and_then(|r| r.headers().get(hyper::header::ACCEPT))
                    .and_then(|v| v.to_str().ok());
                let format = metrics::Format::from_accept(accept);
                respond(
                    StatusCode::OK,
                    format.content_type(),
                    metrics::render(&self.regs, format),
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
            (&Method::GET, ["v2", "health", "ready"]) => match self.ready() {
                Ok(()) => json_resp(StatusCode::OK, &json!({"ready": true})),
                Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}")),
            },
            (&Method::GET, ["v2"]) => json_resp(
                StatusCode::OK,
                &json!({
                    "name": "fermata",
                    "version": env!("CARGO_PKG_VERSION"),
                    "extensions": EXTENSIONS,
                }),
            ),
            (&Method::GET, ["v2", "models", "stats"]) => self.stats(None),
            (_, ["v2", "models", "stats"]) => no_route(&method, &path),
            (&Method::POST, ["v2", "repository", "models", name, op @ ("load" | "unload")]) => {
                let body = match req.take() {
                    Some(r) => self.read_body(r).await.map(|(b, _held)| b),
                    None => Ok(Bytes::new()),
                };
                match body {
                    Ok(b) => self.control(name, *op == "load", &b).await,
                    Err((code, msg)) => error(code, msg),
                }
            }
            (&Method::POST, ["v2", "repository", "index"]) => {
                let body = match req.take() {
                    Some(r) => self.read_body(r).await.map(|(b, _held)| b),
                    None => Ok(Bytes::new()),
                };
                match body.and_then(|b| index_filter(&b)) {
                    Ok(ready_only) => self.repository_index(ready_only),
                    Err((code, msg)) => error(code, msg),
                }
            }
            (_, ["v2", "models", name, rest @ ..]) => match self.models.index(name) {
                Err(e) => error(StatusCode::NOT_FOUND, e),
                Ok(i) => {
                    let (r, infer) = self
                        .model_route((i, name, rest), (&method, &path), &mut req, t0)
                        .await;
                    model_idx = infer.then_some(i);
                    r
                }
            },
            _ => no_route(&method, &path),
        };
        let unread = self.done(req, &resp, model_idx, t0).await;
        let mut resp = resp;
        if unread || self.life.draining.load(Ordering::Acquire) {
            // From the start of a drain every answer says so: a keep-alive
            // client opens its next request elsewhere instead of on a
            // connection about to close.
            resp.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
        resp
    }

    /// After the response: drains a body not read, counts the status code and,
    /// for an inference of model `model_idx`, its time since `t0`. True when
    /// a body is left unread: the connection must close after the answer.
    async fn done(
        &self,
        req: Option<Request<Incoming>>,
        resp: &Resp,
        model_idx: Option<usize>,
        t0: Instant,
    ) -> bool {
        let mut unread = false;
        // A body not read (an error answered first, a refusal at the door) is
        // read and dropped frame by frame, never buffered, so that a
        // keep-alive client can go on with its connection: up to
        // DRAIN_MAX_BYTES for an inference (reading more would spend on a
        // refused request what refusing saves), up to the body limit for
        // any other route (a client of an unsupported route gets its answer,
        // not a broken pipe). Past that, or past the body timeout, it is left
        // unread and the connection closes.
        if let Some(r) = req {
            if !r.body().is_end_stream() {
                let cap = if model_idx.is_some() {
                    DRAIN_MAX_BYTES
                } else {
                    DRAIN_MAX_BYTES.max(self.max_body as u64)
                };
                let declared = r
                    .headers()
                    .get(CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|s| s.parse::<u64>().ok());
                if declared.is_some_and(|n| n > cap) {
                    unread = true;
                } else {
                    let mut body = r.into_body();
                    let drain = async move {
                        let mut seen = 0u64;
                        while let Some(f) = body.frame().await {
                            let Ok(f) = f else { return false };
                            if let Some(d) = f.data_ref() {
                                seen += d.len() as u64;
                                if seen > cap {
                                    return false;
                                }
                            }
                        }
                        true
                    };
                    unread = !matches!(
                        tokio::time::timeout(self.body_timeout, drain).await,
                        Ok(true)
                    );
                }
            }
        }
        if let Some(c) = &self.codes {
            c.count(resp.status());
        }
        if let Some(i) = model_idx {
            self.infer_time[i].observe_duration(t0.elapsed());
        }
        unread
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
        // `/versions/{v}/...`: the one version there is, "1".
        let rest = match rest {
            ["versions", v, rest @ ..] => match Models::version(name, v) {
                Ok(()) => rest,
                Err(e) => return (error(StatusCode::NOT_FOUND, e), false),
            },
            rest => rest,
        };
        let r = match (method, rest) {
            (&Method::GET, []) => self.metadata(i),
            (&Method::GET, ["config"]) => match self.models[i].meta() {
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
                Ok(_) if self.models[i].app.is_some() => json_resp(
                    StatusCode::OK,
                    &app_config_json(self.models[i].app.as_ref().expect("an application")),
                ),
                Ok(meta) => json_resp(
                    StatusCode::OK,
                    &config_json(
                        meta,
                        self.models[i].info.meta().is_none(),
                        self.fe().model_devices(i),
                    ),
                ),
            },
            (&Method::GET, ["stats"]) => self.stats(Some(i)),
            (&Method::GET, ["ready"]) => match self.model_ready(i) {
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
                if let Err(e) = self.model_loaded(i) {
                    return (error(StatusCode::BAD_REQUEST, e), true);
                }
                if let Err(fail) = self.admit(i, t0) {
                    // Refused before its body is read: `done` drains it.
                    return (error(fail.0, fail.1), true);
                }
                let r = match self.infer(i, req.take().expect("once"), t0).await {
                    Ok(r) => r,
                    Err((code, msg)) => error(code, msg),
                };
                return (r, true);
            }
            (_, [] | ["ready"] | ["infer"] | ["config"] | ["stats"]) => error(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} is not allowed on {path}"),
            ),
            _ => no_route(method, path),
        };
        (r, false)
    }

    /// The door's verdict on an inference of model `i` whose first byte came
    /// at `received`, before its body is read ([`Door::admit`]): 429 with
    /// `Retry-After` when refused.
    fn admit(&self, i: usize, received: Instant) -> Result<(), Fail> {
        let (Some(door), Some(w)) = (&self.door, &self.waits) else {
            return Ok(());
        };
        let waited = received.elapsed();
        w.head.observe_duration(waited);
        let slo = Duration::from_nanos(self.models[i].info.slo.0.max(0) as u64);
        let r = door
            .lock()
            .expect("door lock")
            .admit(i, waited, slo, self.start.elapsed());
        let Err(why) = r else {
            return Ok(());
        };
        w.refused(why);
        w.refusal.observe_duration(received.elapsed());
        let msg = match why {
            Refusal::Deadline => format!(
                "refused at the door: the request waited {} ms before it was read, too long to be answered within its model's SLO of {} ms; retry",
                waited.as_millis(),
                slo.as_millis()
            ),
            Refusal::Queue => "refused at the door: the model is overloaded (its requests ahead would take longer than this one's SLO); retry".to_string(),
            Refusal::Backlog => format!(
                "refused at the door: {} request bodies wait to be decoded (--http-max-pending); retry",
                door.lock().expect("door lock").max_pending()
            ),
        };
        Err((StatusCode::TOO_MANY_REQUESTS, msg))
    }

    /// Ready for requests: the frontend is, and this server is not draining.
    fn ready(&self) -> Result<(), String> {
        if self.life.draining.load(Ordering::Acquire) {
            return Err("the frontend is draining (shutting down)".into());
        }
        self.fe().ready()
    }

    /// Model `i` is loaded (model control), else why not.
    fn model_loaded(&self, i: usize) -> Result<(), String> {
        use crate::wire::ModelAvailability;
        let (st, reason) = self.fe().model_state(i);
        if st == ModelAvailability::Ready {
            return Ok(());
        }
        let name = &self.models[i].info.name;
        let why = if reason.is_empty() {
            String::new()
        } else {
            format!(": {reason}")
        };
        Err(format!(
            "model '{name}' is not loaded ({}{why}); load it with POST /v2/repository/models/{name}/load",
            st.triton_name()
        ))
    }

    /// Model `i` takes requests: the frontend is ready and the model loaded.
    fn model_ready(&self, i: usize) -> Result<(), String> {
        self.ready()?;
        self.model_loaded(i)
    }

    /// Loads (`load`) or unloads model `name` (Triton's model control),
    /// answered once it is ready or unloaded. The body: empty, or a JSON
    /// object with optional `parameters` (`unload_dependents` is accepted;
    /// a load's config or files are not).
    async fn control(&self, name: &str, load: bool, body: &[u8]) -> Resp {
        if let Err((code, msg)) = control_body(body, load) {
            return error(code, msg);
        }
        let i = match self.models.index(name) {
            Ok(i) => i,
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        };
        match self
            .fe()
            .control_model(i, load, crate::node::frontend::control::CONTROL_WAIT)
            .await
        {
            Ok(()) => json_resp(StatusCode::OK, &json!({})),
            Err(e) => error(
                StatusCode::BAD_REQUEST,
                format!(
                    "failed to {} '{name}': {e}",
                    if load { "load" } else { "unload" }
                ),
            ),
        }
    }

    fn fe(&self) -> &FrontendHandle {
        self.fe
            .as_ref()
            .expect("frontend routes only with a frontend")
    }

    /// Triton's statistics of model `i`, or of every model.
    fn stats(&self, i: Option<usize>) -> Resp {
        let all: Vec<usize> = match i {
            Some(i) => vec![i],
            None => (0..self.models.len()).collect(),
        };
        let v: Vec<Value> = all
            .into_iter()
            .filter_map(|i| {
                let mut v = stats_json(
                    &self.models[i].info.name,
                    self.models[i].stats(self.fe(), i)?,
                );
                // An application's measured fan-out per edge (a Fermata field).
                if let Some(a) = &self.models[i].app {
                    v["fermata_fanout"] = json!(a.fanout_seen());
                }
                Some(v)
            })
            .collect();
        json_resp(StatusCode::OK, &json!({ "model_stats": v }))
    }

    /// Triton's repository index: every model served, ready or not (only the
    /// ready ones for `{"ready": true}`).
    fn repository_index(&self, ready_only: bool) -> Resp {
        let ready = self.ready().is_ok();
        let v: Vec<Value> = (0..self.models.len())
            .filter_map(|i| {
                let (st, reason) = self.fe().model_state(i);
                let state = match st {
                    crate::wire::ModelAvailability::Ready if !ready => "UNAVAILABLE",
                    st => st.triton_name(),
                };
                if ready_only && state != "READY" {
                    return None;
                }
                let mut e =
                    json!({"name": self.models[i].info.name, "version": "1", "state": state});
                if !reason.is_empty() {
                    e["reason"] = json!(reason);
                }
                Some(e)
            })
            .collect();
        json_resp(StatusCode::OK, &Value::Array(v))
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
        let encoding = content_encoding(&req)?;
        // `_held` keeps the body's share of the budget until the answer.
        let t_read = Instant::now();
        let (mut body, _held) = match self.read_body(req).await {
            Ok(b) => b,
            Err((code, msg)) => {
                // Its body is left unread (too large, too slow, no room,
                // evicted): the connection closes after the answer rather
                // than wait for the rest.
                let mut r = error(code, msg);
                r.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
                return Ok(r);
            }
        };
        let t_decode = Instant::now();
        if let Some(w) = &self.waits {
            w.read.observe_duration(t_decode - t_read);
        }
        // Pending at the door from here until handed over (or dropped).
        let mut pending = Pending::new(self.door.as_ref(), self.start);
        if let Some(enc) = encoding {
            body = if body.len() <= DECODE_INLINE_BYTES {
                decompress(enc, &body, self.max_body)?
            } else {
                let max = self.max_body;
                tokio::task::spawn_blocking(move || decompress(enc, &body, max))
                    .await
                    .map_err(|e| {
                        (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("decompressing the request failed: {e}"),
                        )
                    })??
            };
        }
        let d = match header_len {
            // Triton's raw binary body: the only input's data, no JSON.
            Some(0) => decode_raw(meta, &body)?,
            Some(n) if n > body.len() => {
                return Err(bad(format!(
                    "`Inference-Header-Content-Length` is {n} but the body has only {} bytes",
                    body.len()
                )))
            }
            _ if body.len() <= DECODE_INLINE_BYTES => {
                let split = header_len.unwrap_or(body.len());
                decode_request(meta, &body[..split], &body.slice(split..), self.max_tensor)?
            }
            _ => {
                // A larger body is decoded on the blocking pool (at most twice
                // the workers at once), so that the workers go on reading heads.
                let (meta, body, max_tensor) = (meta.clone(), body.clone(), self.max_tensor);
                let split = header_len.unwrap_or(body.len());
                tokio::task::spawn_blocking(move || {
                    decode_request(&meta, &body[..split], &body.slice(split..), max_tensor)
                })
                .await
                .map_err(|e| {
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("decoding the request failed: {e}"),
                    )
                })??
            }
        };
        if let Some(w) = &self.waits {
            w.decode.observe_duration(t_decode.elapsed());
        }
        let t_sub = Instant::now();
        let mut flight = pending.handed_over(i, d.samples.len() as u64);
        if let Some(app) = &m.app {
            let done = crate::node::apps::run_samples(
                app.clone(),
                self.fe().clone(),
                d.slo,
                d.samples,
                received,
            )
            .await
            .map_err(|_| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the frontend is stopping".to_string(),
                )
            })?;
            if let Some(w) = &self.waits {
                w.answer.observe_duration(t_sub.elapsed());
            }
            flight.answered_apps(&done, self.start.elapsed());
            let resp = app_answer(meta, &d.id, &d.outputs, done);
            app.stats.request(resp.is_ok(), received.elapsed());
            return resp;
        }
        let done = self
            .fe()
            .infer_samples(i, d.slo, d.samples, received)
            .await
            .map_err(|_| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the frontend is stopping".to_string(),
                )
            })?;
        let took = t_sub.elapsed();
        if let Some(w) = &self.waits {
            w.answer.observe_duration(took);
        }
        flight.answered(&done, self.start.elapsed());
        let resp = answer(&m.info, meta, &d.id, &d.outputs, &done);
        self.fe().record_margins(i, &done);
        if let Some(s) = self.fe().stats(i) {
            s.request(resp.is_ok(), received.elapsed());
        }
        resp
    }

    /// The request's body, at most `max_body` bytes (413 beyond, whether its
    /// `Content-Length` says so or its bytes do), and its share of the body
    /// budget: its declared length taken before a byte is read (its bytes as
    /// they come without one); 503 when the budget has no room.
    async fn read_body(&self, req: Request<Incoming>) -> Result<(Bytes, Held), Fail> {
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
        let budget = self.bodies.clone();
        let mut held = budget.hold();
        if !held.take_or_wait(cap).await {
            return Err(no_room(&budget, cap));
        }
        let read = async move {
            let mut body = req.into_body();
            let mut buf: Vec<u8> = Vec::with_capacity(cap);
            loop {
                // A body that stopped arriving gives way when the budget needs
                // its room ([`BodyBudget`]): 503, and the connection closes
                // (its body is left unread).
                let f = tokio::select! {
                    f = body.frame() => f,
                    _ = held.evicted() => return Err(evicted(&budget)),
                };
                let Some(f) = f else { break };
                let f = f.map_err(|e| bad(format!("cannot read the request body: {e}")))?;
                if let Ok(d) = f.into_data() {
                    if buf.len() + d.len() > max {
                        return Err(too_large_body((buf.len() + d.len()) as u64, max));
                    }
                    let more = (buf.len() + d.len()).saturating_sub(held.bytes());
                    if more > 0 && !held.take_or_wait(more).await {
                        return Err(no_room(&budget, buf.len() + d.len()));
                    }
                    held.received(d.len() - more.min(d.len()));
                    buf.extend_from_slice(&d);
                }
            }
            held.complete();
            Ok((Bytes::from(buf), held))
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

/// A request pending at the door (its body read, not yet handed over):
/// abandoned when dropped before [`Pending::handed_over`].
struct Pending<'a> {
    door: Option<&'a Mutex<Door>>,
    /// The door's clock: its times are from here.
    start: Instant,
}

impl<'a> Pending<'a> {
    fn new(door: Option<&'a Mutex<Door>>, start: Instant) -> Pending<'a> {
        if let Some(d) = door {
            d.lock().expect("door lock").decoding();
        }
        Pending { door, start }
    }

    /// Handed over as `samples` tasks of model `m`: in flight until answered.
    fn handed_over(&mut self, m: usize, samples: u64) -> Flight<'a> {
        let door = self.door.take();
        if let Some(d) = door {
            d.lock()
                .expect("door lock")
                .handed_over(m, samples, self.start.elapsed());
        }
        Flight {
            door,
            model: m,
            left: samples,
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.door {
            d.lock().expect("door lock").abandoned(self.start.elapsed());
        }
    }
}

/// A request's tasks in flight as the door counts them: those not answered
/// when dropped (the client went away, the frontend stopped) count as
/// answered with nothing said of load.
struct Flight<'a> {
    door: Option<&'a Mutex<Door>>,
    model: usize,
    left: u64,
}

impl Flight<'_> {
    /// The answers, at the door's `now`.
    fn answered(&mut self, done: &[crate::node::frontend::InferDone], now: Duration) {
        use crate::node::frontend::Ended;
        use crate::wire::DropReason as R;
        let Some(d) = self.door else {
            return;
        };
        let mut door = d.lock().expect("door lock");
        for x in done.iter().take(self.left as usize) {
            let a = match x.ended {
                Ended::Good => Answer::Good,
                Ended::Late
                | Ended::TimedOut
                | Ended::RegionFull
                | Ended::Dropped(
                    R::Expired | R::EarlyDrop | R::TooLate | R::QueueFull | R::Overloaded,
                ) => Answer::Shed,
                _ => Answer::Other,
            };
            door.answered(self.model, a, now);
        }
        self.left = self.left.saturating_sub(done.len() as u64);
    }
}

impl Flight<'_> {
    /// An application's answers (one per sample), at the door's `now`: a
    /// request that could not be on time is shed load.
    fn answered_apps<T>(&mut self, done: &[Result<T, Fail>], now: Duration) {
        let Some(d) = self.door else {
            return;
        };
        let mut door = d.lock().expect("door lock");
        for x in done.iter().take(self.left as usize) {
            let a = match x {
                Ok(_) => Answer::Good,
                Err((StatusCode::TOO_MANY_REQUESTS | StatusCode::GATEWAY_TIMEOUT, _)) => {
                    Answer::Shed
                }
                Err(_) => Answer::Other,
            };
            door.answered(self.model, a, now);
        }
        self.left = self.left.saturating_sub(done.len() as u64);
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.door {
            if self.left > 0 {
                let mut door = d.lock().expect("door lock");
                for _ in 0..self.left {
                    door.answered(self.model, Answer::Other, Duration::ZERO);
                }
            }
        }
    }
}

/// 503: the body budget has no room for `n` more bytes.
fn no_room(b: &BodyBudget, n: usize) -> Fail {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the server buffers {} of its {} bytes of request bodies (--http-max-buffered-bytes); a body of {n} bytes does not fit now, retry",
            b.held(),
            b.limit()
        ),
    )
}

/// The largest body of an answered request (an error, a refusal) read and
/// dropped to keep its connection; a larger one closes it.
const DRAIN_MAX_BYTES: u64 = 256 << 10;

/// 503: the body stopped arriving and was evicted to make room for others.
fn evicted(b: &BodyBudget) -> Fail {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the request body stopped arriving while the server's {} bytes of buffered bodies (--http-max-buffered-bytes) were needed by others; it was dropped, retry",
            b.limit()
        ),
    )
}

/// Bodies up to this size are decoded on the HTTP worker that read them (a
/// JSON body of 8 KiB decodes in about 0.1 ms); larger ones on the blocking
/// pool. The workers read every connection's head, where the door refuses
/// requests under overload: a worker decoding a body holds up the heads queued
/// behind it, so under overload the door would decide tens of milliseconds late
/// (a 30 KiB JSON image takes 0.35 ms; at 9,000 requests/s the decoding alone
/// takes three of four workers).
const DECODE_INLINE_BYTES: usize = 8 << 10;

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

/// A request body's compression (`Content-Encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Gzip,
    /// HTTP's `deflate`: zlib-wrapped (RFC 1950), or raw (RFC 1951) as some
    /// clients send it.
    Deflate,
}

/// The body's `Content-Encoding` (None: identity); another one is 415.
fn content_encoding(req: &Request<Incoming>) -> Result<Option<Encoding>, Fail> {
    let Some(v) = req.headers().get(CONTENT_ENCODING) else {
        return Ok(None);
    };
    match v.to_str().map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        Ok("" | "identity") => Ok(None),
        Ok("gzip" | "x-gzip") => Ok(Some(Encoding::Gzip)),
        Ok("deflate") => Ok(Some(Encoding::Deflate)),
        _ => Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("unsupported Content-Encoding {v:?}: send gzip, deflate or identity"),
        )),
    }
}

/// The body decompressed, at most `max` bytes (413 beyond: a small body that
/// inflates past the limit is refused before it is all held).
fn decompress(enc: Encoding, body: &[u8], max: usize) -> Result<Bytes, Fail> {
    use flate2::read::{DeflateDecoder, GzDecoder, ZlibDecoder};
    use std::io::Read;
    fn inflate(r: impl Read, max: usize) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        r.take(max as u64 + 1).read_to_end(&mut out)?;
        Ok(out)
    }
    let zlib_header = body.len() >= 2 && (u16::from(body[0]) << 8 | u16::from(body[1])) % 31 == 0;
    let out = match enc {
        Encoding::Gzip => inflate(GzDecoder::new(body), max),
        Encoding::Deflate if zlib_header && body[0] & 0x0f == 8 => {
            inflate(ZlibDecoder::new(body), max)
        }
        Encoding::Deflate => inflate(DeflateDecoder::new(body), max),
    }
    .map_err(|e| bad(format!("the request body is not valid {enc:?} data: {e}")))?;
    if out.len() > max {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body decompresses to over the limit of {max} bytes (--http-max-body-bytes)"
            ),
        ));
    }
    Ok(Bytes::from(out))
}

/// The body of a load or unload request: empty, or a JSON object whose only
/// key is `parameters`; an unload's may hold `unload_dependents` (a bool:
/// Fermata's models have no dependents), a load's none (a config or files
/// sent with the load are not supported).
fn control_body(body: &[u8], load: bool) -> Result<(), (StatusCode, String)> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let what = if load { "load" } else { "unload" };
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("malformed JSON {what} request: {e}")))?;
    let Some(o) = v.as_object() else {
        return Err(bad(format!("a {what} request is a JSON object")));
    };
    for (k, p) in o {
        if k != "parameters" {
            return Err(bad(format!(
                "unknown key `{k}` in a {what} request (it takes `parameters`)"
            )));
        }
        let Some(p) = p.as_object() else {
            return Err(bad(format!(
                "`parameters` of a {what} request is an object"
            )));
        };
        for (name, value) in p {
            match (load, name.as_str()) {
                (false, "unload_dependents") if value.is_boolean() => {}
                (false, "unload_dependents") => {
                    return Err(bad("`unload_dependents` is a bool"));
                }
                _ => {
                    return Err(bad(format!(
                        "parameter `{name}` of a {what} request is not supported (models load from the repository Fermata started with)"
                    )))
                }
            }
        }
    }
    Ok(())
}

/// The body of a repository index request: empty, or a JSON object whose only
/// key may be `ready` (a bool); whether only ready models are asked for.
fn index_filter(body: &[u8]) -> Result<bool, Fail> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(false);
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("malformed JSON repository index request: {e}")))?;
    let Some(o) = v.as_object() else {
        return Err(bad("a repository index request is a JSON object"));
    };
    if let Some(k) = o.keys().find(|k| *k != "ready") {
        return Err(bad(format!(
            "unknown key `{k}` in a repository index request (it takes `ready`)"
        )));
    }
    match o.get("ready") {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad("`ready` in a repository index request is a bool")),
    }
}

/// A route Fermata does not have: 400 naming the Triton extension for the
/// routes of one it does not implement (a client learns why, not just "404"),
/// else 404.
fn no_route(method: &Method, path: &str) -> Resp {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let extension = match parts.as_slice() {
        ["v2", "systemsharedmemory" | "cudasharedmemory", ..] => Some((
            "shared-memory",
            "inputs and outputs travel in the request and response",
        )),
        ["v2", "trace", ..] | ["v2", "models", _, "trace", ..] => Some((
            "trace",
            "per-request timings are in each response's parameters",
        )),
        ["v2", "logging"] => Some(("logging", "fermata logs with RUST_LOG")),
        ["v2", "models", _, "generate" | "generate_stream", ..]
        | ["v2", "models", _, "versions", _, "generate" | "generate_stream", ..] => Some((
            "generate",
            "send an inference request to /v2/models/{model}/infer",
        )),
        _ => None,
    };
    // A known route asked with another method (a model's own routes answer
    // this in `model_route`).
    let known = matches!(
        parts.as_slice(),
        ["metrics"]
            | ["v2"]
            | ["v2", "health", "live" | "ready"]
            | ["v2", "models", "stats"]
            | ["v2", "repository", "index"]
    );
    if extension.is_none() && known {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}"),
        );
    }
    match extension {
        Some((ext, why)) => error(
            StatusCode::BAD_REQUEST,
            format!(
                "{method} {path}: Triton's {ext} extension is not supported by fermata ({why}); GET /v2 lists the extensions it has"
            ),
        ),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no route for {method} {path}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::{DeflateEncoder, GzEncoder, ZlibEncoder};
    use flate2::Compression;
    use std::io::Write;

    fn packed<W: Write>(mut w: W, data: &[u8]) -> W {
        w.write_all(data).unwrap();
        w
    }

    /// A response's whole body, as text.
    fn body_text(r: Resp) -> String {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let b = rt.block_on(r.into_body().collect()).unwrap().to_bytes();
        String::from_utf8_lossy(&b).into_owned()
    }

    #[test]
    fn a_repository_index_body_is_empty_or_asks_for_ready_models() {
        assert!(!index_filter(b"").unwrap());
        assert!(!index_filter(b" \n").unwrap());
        assert!(!index_filter(br#"{}"#).unwrap());
        assert!(index_filter(br#"{"ready": true}"#).unwrap());
        for (body, msg) in [
            (&b"AAAA"[..], "malformed JSON repository index request"),
            (b"[1]", "is a JSON object"),
            (
                br#"{"ready": 1}"#,
                "`ready` in a repository index request is a bool",
            ),
            (br#"{"x": 1}"#, "unknown key `x`"),
        ] {
            let (code, e) = index_filter(body).unwrap_err();
            assert_eq!(code, StatusCode::BAD_REQUEST);
            assert!(e.contains(msg), "{e}");
        }
    }

    #[test]
    fn load_and_unload_bodies_are_checked() {
        assert!(control_body(b"", true).is_ok());
        assert!(control_body(br#"{"parameters": {}}"#, true).is_ok());
        assert!(control_body(br#"{"parameters": {"unload_dependents": true}}"#, false).is_ok());
        for (body, load, msg) in [
            (&b"[1]"[..], true, "is a JSON object"),
            (&b"{"[..], true, "malformed JSON load request"),
            (&br#"{"x": 1}"#[..], false, "unknown key `x`"),
            (
                &br#"{"parameters": {"config": "{}"}}"#[..],
                true,
                "`config` of a load request is not supported",
            ),
            (
                &br#"{"parameters": {"unload_dependents": 1}}"#[..],
                false,
                "is a bool",
            ),
            (&br#"{"parameters": 3}"#[..], false, "is an object"),
        ] {
            let (code, e) = control_body(body, load).unwrap_err();
            assert_eq!(code, StatusCode::BAD_REQUEST);
            assert!(e.contains(msg), "{e}");
        }
    }

    #[test]
    fn triton_only_routes_are_refused_by_name() {
        for (m, p, ext) in [
            (
                Method::GET,
                "/v2/systemsharedmemory/status",
                "shared-memory",
            ),
            (
                Method::POST,
                "/v2/cudasharedmemory/region/r/register",
                "shared-memory",
            ),
            (Method::GET, "/v2/models/mlp/trace/setting", "trace"),
            (Method::POST, "/v2/logging", "logging"),
            (Method::POST, "/v2/models/mlp/generate", "generate"),
        ] {
            let r = no_route(&m, p);
            assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{p}");
            let body = body_text(r);
            assert!(
                body.contains(&format!("Triton's {ext} extension is not supported")),
                "{body}"
            );
        }
        assert_eq!(
            no_route(&Method::GET, "/v3/x").status(),
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn bodies_decompress_within_the_limit() {
        let data = br#"{"inputs":[]}"#.repeat(100);
        let gz = packed(GzEncoder::new(Vec::new(), Compression::default()), &data)
            .finish()
            .unwrap();
        let zl = packed(ZlibEncoder::new(Vec::new(), Compression::default()), &data)
            .finish()
            .unwrap();
        let raw = packed(
            DeflateEncoder::new(Vec::new(), Compression::default()),
            &data,
        )
        .finish()
        .unwrap();
        assert_eq!(decompress(Encoding::Gzip, &gz, 1 << 20).unwrap(), data);
        assert_eq!(decompress(Encoding::Deflate, &zl, 1 << 20).unwrap(), data);
        assert_eq!(decompress(Encoding::Deflate, &raw, 1 << 20).unwrap(), data);
        // A bomb: 64 MB of zeros in a few tens of KB, refused at the limit.
        let bomb = packed(
            GzEncoder::new(Vec::new(), Compression::best()),
            &vec![0u8; 64 << 20],
        )
        .finish()
        .unwrap();
        assert!(bomb.len() < 1 << 20);
        let e = decompress(Encoding::Gzip, &bomb, 1 << 20).unwrap_err();
        assert_eq!(e.0, StatusCode::PAYLOAD_TOO_LARGE, "{e:?}");
        let e = decompress(Encoding::Gzip, b"not gzip at all", 1 << 20).unwrap_err();
        assert_eq!(e.0, StatusCode::BAD_REQUEST);
        assert!(e.1.contains("not valid Gzip data"), "{e:?}");
    }
}
