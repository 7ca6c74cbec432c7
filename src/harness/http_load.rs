//! `fermata bench http`: the front door measured from outside. For each model of
//! a repository and each offered rate, a fresh `fermata serve --executor onnx
//! --http-port 0` process is started and driven open-loop over HTTP by the client
//! here: Poisson arrivals ([`crate::arrivals::ArrivalGen`]), one KServe v2 JSON
//! inference request (batch 1, the model's input shapes and datatypes) per
//! arrival, sent on a pool of keep-alive HTTP/1.1 connections (hyper's client).
//!
//! # Open loop
//! A pacing thread sends each request when it falls due and never waits for an
//! answer: every request is a task on the client's tokio runtime that takes an
//! idle connection (or opens one, up to [`CONNS_MAX`]; past it the request is
//! not sent and counts as `conn_limit`), sends, and reads the answer to its last
//! byte. Latency runs from the request's due time (its scheduled arrival), so a
//! late send counts against the server's figure too; the client's own lag (send
//! − due) is reported apart so that a saturated client is visible.
//!
//! # Outcomes
//! Requests due in the warm-up are sent but not counted. Each counted request
//! ends in one of: `ok` (200 within the model's SLO), `late_200` (200 after it),
//! 429, 503, 504, another status, a transport error, `conn_limit` or no answer
//! by the end of the drain ([`DRAIN`]); everything but `ok` is bad.

use crate::arrivals::ArrivalGen;
use crate::core::Time;
pub use crate::harness::door_figures::DoorFigures;
use crate::harness::procs::Proc;
use crate::harness::stall::{StallSpec, Staller};
use crate::node::http::decode_elems;
use crate::repo::ModelMeta;
use crate::workload::Arrival;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{header, Method, Request};
use hyper_util::rt::TokioIo;
use rand::SeedableRng;
use serde::Serialize;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// The most connections the client keeps open at once; a request due when all
/// are busy is not sent and counts as `conn_limit`.
pub const CONNS_MAX: usize = 2048;
/// Warm connections (`LoadSpec::warm_conns`) being opened at once.
const WARM_PARALLEL: usize = 64;
/// Worker threads of the client's runtime.
pub const CLIENT_THREADS: usize = 2;
/// After the last arrival, how long the client waits for the answers still
/// outstanding (the server answers every request by its deadline plus a grace).
pub const DRAIN: Duration = Duration::from_secs(5);
/// The bar below capacity: fewer than this percentage of a rate's
/// requests bad, in every repetition.
pub const BAD_PCT_MAX: f64 = 0.1;
/// A rate the server sustains: fewer than this percentage bad in every
/// repetition (the project's goodput criterion).
pub const SUSTAINED_BAD_PCT: f64 = 1.0;
/// The rates up to this share of the highest sustained one must stay under
/// [`BAD_PCT_MAX`].
pub const BELOW_CAPACITY: f64 = 0.8;
/// Distinct request bodies per model (sent round-robin).
const BODIES: usize = 8;

/// One open-loop run against a serving process.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub addr: SocketAddr,
    pub model: String,
    /// Request bodies, sent round-robin (see [`infer_bodies`]).
    pub bodies: Vec<Bytes>,
    /// A 200 answered after this is late (bad).
    pub slo: Duration,
    pub rate_rps: f64,
    /// How the arrivals are spaced (Poisson in the sweeps; constant gaps send
    /// lone requests at a low rate).
    pub arrival: Arrival,
    pub warmup: Duration,
    pub duration: Duration,
    pub seed: u64,
    /// Keep-alive connections opened before the first request and left in the
    /// pool (as wrk2's `-c`): a burst of slow answers then finds open
    /// connections instead of opening new ones (0: open them as needed).
    pub warm_conns: usize,
    /// The serving process, when it runs on this host: its CPU time is told
    /// apart from others' in the bursts' figures.
    pub server_pid: Option<u32>,
    /// Stalls injected into the measured window ([`super::stall`]), if any.
    pub stall: Option<StallSpec>,
}

/// Counted requests by outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadCounts {
    /// Requests due in the measured window.
    pub offered: u64,
    /// Of those, sent (a connection was had).
    pub sent: u64,
    pub ok: u64,
    pub late_200: u64,
    pub status_429: u64,
    /// Of the 429s, those refused at the door before the body was read (the
    /// rest are requests the scheduler dropped for their deadline).
    pub door_429: u64,
    pub status_503: u64,
    pub status_504: u64,
    pub other_status: u64,
    pub transport_errors: u64,
    /// Not sent: [`CONNS_MAX`] connections were all busy.
    pub conn_limit: u64,
    /// No answer by the end of the drain.
    pub unanswered: u64,
}

impl LoadCounts {
    pub fn bad(&self) -> u64 {
        self.offered - self.ok
    }
    /// Percentage of the offered requests that were bad (0 when none was offered).
    pub fn bad_pct(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            100.0 * self.bad() as f64 / self.offered as f64
        }
    }
}

/// Width of one slot of a run's timeline (by due time).
pub const SLOT: Duration = Duration::from_millis(100);
/// Slots without a bad request that a burst may span and stay one burst.
const BURST_GAP_SLOTS: usize = 2;

/// One [`SLOT`] of a run (warm-up included), by the requests' due times.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    requests: u64,
    bad: u64,
    /// The largest latency of an answer (any status), us.
    latency_max_us: u64,
    /// How late the pacing thread sent at most (it overslept or fell behind),
    /// us: the client process stalled, so likely the host.
    pace_late_max_us: u64,
    /// Connections the client opened in it (by when it began to connect), and
    /// the longest connect.
    conns_opened: u64,
    connect_max_us: u64,
    /// CPU time the host spent on anything but the client and the server
    /// (other processes, the kernel's own threads), ms; see [`CpuSampler`].
    others_cpu_ms: u64,
}

/// Bad requests close together in time: where a run lost what it lost.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    /// Seconds from the start of the load (due times; the warm-up comes first)
    /// of the first and the end of the last slot with a bad request.
    pub from_s: f64,
    pub to_s: f64,
    pub requests: u64,
    pub bad: u64,
    /// The largest latency of an answer due in it.
    pub latency_max_ms: f64,
    /// How late the pacing thread sent at most in it and in the second before it:
    /// a host stall shows here as well as at the server.
    pub pace_late_max_ms: f64,
    /// Connections the client opened in it and in the second before it, and the
    /// longest connect (a full accept queue makes the kernel drop the handshake,
    /// and the client retries after a second).
    pub conns_opened: u64,
    pub connect_max_ms: f64,
    /// The most CPU time that neither the client nor the server used in one
    /// slot of it or of the second before it, ms (of 100 ms × the host's
    /// CPUs): another process or a kernel thread that took a core.
    pub others_cpu_max_ms: f64,
}

/// The bursts of a timeline: runs of slots with bad requests, at most
/// [`BURST_GAP_SLOTS`] clean slots apart.
fn bursts(slots: &[Slot]) -> Vec<Burst> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        if s.bad == 0 {
            continue;
        }
        match out.last_mut() {
            Some((_, end)) if i - *end <= BURST_GAP_SLOTS + 1 => *end = i,
            _ => out.push((i, i)),
        }
    }
    let per_s = (Duration::from_secs(1).as_nanos() / SLOT.as_nanos()) as usize;
    out.into_iter()
        .map(|(a, b)| {
            let span = &slots[a..=b];
            let before = &slots[a.saturating_sub(per_s)..=b];
            Burst {
                from_s: (a as f64) * SLOT.as_secs_f64(),
                to_s: ((b + 1) as f64) * SLOT.as_secs_f64(),
                requests: span.iter().map(|s| s.requests).sum(),
                bad: span.iter().map(|s| s.bad).sum(),
                latency_max_ms: span.iter().map(|s| s.latency_max_us).max().unwrap_or(0) as f64
                    / 1e3,
                pace_late_max_ms: before.iter().map(|s| s.pace_late_max_us).max().unwrap_or(0)
                    as f64
                    / 1e3,
                conns_opened: before.iter().map(|s| s.conns_opened).sum(),
                connect_max_ms: before.iter().map(|s| s.connect_max_us).max().unwrap_or(0) as f64
                    / 1e3,
                others_cpu_max_ms: before.iter().map(|s| s.others_cpu_ms).max().unwrap_or(0) as f64,
            }
        })
        .collect()
}

/// What the client saw in one run.
pub struct LoadResult {
    pub counts: LoadCounts,
    /// Latency of the counted 200 answers, due to last byte (us).
    pub latency_us: Histogram<u64>,
    /// Latency of the counted refusals (429 and 503), due to last byte (us).
    pub refusal_us: Histogram<u64>,
    /// Of those, the refusals at the door (us).
    pub door_refusal_us: Histogram<u64>,
    /// Send − due of the counted sent requests (us).
    pub lag_us: Histogram<u64>,
    pub conns_opened: u64,
    pub conns_peak: usize,
    /// Where the bad requests fell (see [`Burst`]).
    pub bursts: Vec<Burst>,
    /// How late the pacing thread sent at most over the run, ms.
    pub pace_late_max_ms: f64,
    /// The stalls injected ([`LoadSpec::stall`]; None without).
    pub stalls: Option<u64>,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1e3
    }
}

type Conn = SendRequest<Full<Bytes>>;

/// A new keep-alive connection to `addr` (its driver runs as a task).
async fn connect(addr: SocketAddr) -> std::result::Result<Conn, String> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    let (tx, conn) = http1::handshake(TokioIo::new(s))
        .await
        .map_err(|e| format!("handshake with {addr}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(tx)
}

/// `n` keep-alive connections to `addr`, opened [`WARM_PARALLEL`] at a time.
async fn open_conns(addr: SocketAddr, n: usize) -> Result<Vec<Conn>> {
    let mut out = Vec::with_capacity(n);
    let mut set = tokio::task::JoinSet::<std::result::Result<Conn, String>>::new();
    for i in 0..n + WARM_PARALLEL {
        if i >= WARM_PARALLEL {
            let Some(c) = set.join_next().await else {
                break;
            };
            out.push(
                c.context("opening a warm connection")?
                    .map_err(anyhow::Error::msg)?,
            );
        }
        if i < n {
            set.spawn(connect(addr));
        }
    }
    Ok(out)
}

/// One request on a fresh connection: (status, body).
async fn request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Bytes,
) -> std::result::Result<(u16, Bytes), String> {
    let mut c = connect(addr).await?;
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let r = c.send_request(req).await.map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let b = r.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok((status, b.to_bytes()))
}

/// One `POST path` with the JSON `body` on a fresh connection: (status, body).
pub fn post(addr: SocketAddr, path: &str, body: Bytes) -> Result<(u16, Bytes)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(request(addr, Method::POST, path, body))
        .map_err(anyhow::Error::msg)
}

/// Waits until `GET /v2/models/MODEL/ready` answers 200 (up to `timeout`).
pub fn wait_ready(addr: SocketAddr, model: &str, timeout: Duration) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let path = format!("/v2/models/{model}/ready");
    let end = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < end {
        match rt.block_on(request(addr, Method::GET, &path, Bytes::new())) {
            Ok((200, _)) => return Ok(()),
            Ok((404, b)) => bail!(
                "the server does not serve model `{model}`: {}",
                String::from_utf8_lossy(&b)
            ),
            Ok((s, b)) => last = format!("{s} {}", String::from_utf8_lossy(&b)),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("model `{model}` at {addr} was not ready within {timeout:?} (last answer: {last})")
}

/// A KServe v2 JSON inference request for `meta` with one sample
/// ([`ModelMeta::sample_input`]): every input tensor with shape `[1, ...]`, its
/// datatype and its `data`.
pub fn infer_body(meta: &ModelMeta, rng: &mut impl rand::RngCore) -> Bytes {
    let bytes = meta.sample_input(rng);
    let mut at = 0;
    let inputs: Vec<Value> = meta
        .inputs
        .iter()
        .map(|t| {
            let n = t.sample_bytes();
            let data = decode_elems(t.datatype, &bytes[at..at + n]);
            at += n;
            let mut shape = vec![1];
            shape.extend_from_slice(t.sample_shape());
            json!({
                "name": t.name,
                "shape": shape,
                "datatype": t.datatype.kserve_name(),
                "data": data,
            })
        })
        .collect();
    Bytes::from(json!({ "inputs": inputs }).to_string())
}

/// A few distinct request bodies for `meta`.
pub fn infer_bodies(meta: &ModelMeta, seed: u64) -> Vec<Bytes> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    (0..BODIES).map(|_| infer_body(meta, &mut rng)).collect()
}

struct Acc {
    c: LoadCounts,
    lat: Histogram<u64>,
    /// Latency of the counted refusals (429, 503), due to last byte.
    refusal: Histogram<u64>,
    /// Of those, the door's.
    door_refusal: Histogram<u64>,
    lag: Histogram<u64>,
    /// The run's timeline, warm-up included.
    slots: Vec<Slot>,
}

/// What the request tasks share.
struct Shared {
    addr: SocketAddr,
    host: String,
    path: String,
    slo: Duration,
    /// When the load starts (slot 0 of the timeline).
    t0: Instant,
    conns_max: usize,
    idle: Mutex<Vec<Conn>>,
    open: AtomicUsize,
    peak: AtomicUsize,
    opened: AtomicU64,
    in_flight: AtomicUsize,
    acc: Mutex<Acc>,
}

enum Fail {
    Transport,
    ConnLimit,
}

impl Shared {
    fn acc(&self) -> std::sync::MutexGuard<'_, Acc> {
        self.acc.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// An idle connection that is still usable, or a new one.
    async fn conn(&self) -> std::result::Result<Conn, Fail> {
        loop {
            let c = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let Some(mut c) = c else { break };
            if c.ready().await.is_ok() {
                return Ok(c);
            }
            self.closed();
        }
        let n = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        if n > self.conns_max {
            self.closed();
            return Err(Fail::ConnLimit);
        }
        self.peak.fetch_max(n, Ordering::Relaxed);
        self.opened.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let c = connect(self.addr).await;
        let took = began.elapsed().as_micros() as u64;
        if let Some(s) = self
            .acc()
            .slots
            .get_mut(slot_of(began.saturating_duration_since(self.t0)))
        {
            s.conns_opened += 1;
            s.connect_max_us = s.connect_max_us.max(took);
        }
        c.map_err(|_| {
            self.closed();
            Fail::Transport
        })
    }

    /// Sends one request due at `due`, reads its answer, counts its outcome
    /// when `counted` and puts it on the timeline either way.
    async fn one(self: Arc<Self>, due: Instant, counted: bool, body: Bytes) {
        let r = self.exchange(due, counted, body).await;
        let lat = Instant::now().saturating_duration_since(due);
        let door = matches!(r, Ok((429, true)));
        let r = r.map(|(status, _)| status);
        let good = matches!(r, Ok(200)) && lat <= self.slo;
        let mut a = self.acc();
        if counted {
            let c = &mut a.c;
            match r {
                Err(Fail::ConnLimit) => c.conn_limit += 1,
                Err(Fail::Transport) => c.transport_errors += 1,
                Ok(200) if good => c.ok += 1,
                Ok(200) => c.late_200 += 1,
                Ok(429) => c.status_429 += 1,
                Ok(503) => c.status_503 += 1,
                Ok(504) => c.status_504 += 1,
                Ok(_) => c.other_status += 1,
            }
            if matches!(r, Ok(200)) {
                a.lat.saturating_record((lat.as_micros() as u64).max(1));
            }
            if matches!(r, Ok(429 | 503)) {
                a.refusal.saturating_record((lat.as_micros() as u64).max(1));
            }
            if door {
                a.c.door_429 += 1;
                a.door_refusal
                    .saturating_record((lat.as_micros() as u64).max(1));
            }
        }
        let i = slot_of(due.saturating_duration_since(self.t0));
        if let Some(s) = a.slots.get_mut(i) {
            s.requests += 1;
            s.bad += u64::from(!good);
            s.latency_max_us = s.latency_max_us.max(lat.as_micros() as u64);
        }
        drop(a);
        self.in_flight.fetch_sub(1, Ordering::Release);
    }

    /// The request's status once its answer is read to the last byte.
    /// The answer's status, and whether it is a refusal at the door (a 429
    /// whose message says so).
    async fn exchange(
        &self,
        due: Instant,
        counted: bool,
        body: Bytes,
    ) -> Result<(u16, bool), Fail> {
        let mut c = self.conn().await?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(&self.path)
            .header(header::HOST, &self.host)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("a valid request");
        if counted {
            let lag = Instant::now().saturating_duration_since(due);
            let mut a = self.acc();
            a.c.sent += 1;
            a.lag.saturating_record((lag.as_micros() as u64).max(1));
        }
        let answer = async {
            let r = c.send_request(req).await?;
            let status = r.status().as_u16();
            let body = r.into_body().collect().await?;
            // Only a 429's body is looked at (merged into one buffer).
            let door = status == 429 && contains(&body.to_bytes(), DOOR_MESSAGE);
            Ok::<(u16, bool), hyper::Error>((status, door))
        };
        match answer.await {
            Ok(status) => {
                if c.is_closed() {
                    self.closed();
                } else {
                    self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                }
                Ok(status)
            }
            Err(_) => {
                self.closed();
                Err(Fail::Transport)
            }
        }
    }
}

/// How the server's refusals at the door begin their message
/// (`node::http::routes`).
const DOOR_MESSAGE: &[u8] = b"refused at the door";

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The timeline slot of a moment `since` after the load started.
fn slot_of(since: Duration) -> usize {
    (since.as_nanos() / SLOT.as_nanos()) as usize
}

/// Drives `spec.addr` open-loop for warm-up + duration, then waits up to
/// [`DRAIN`] for the answers outstanding.
pub fn run_load(spec: &LoadSpec) -> Result<LoadResult> {
    if spec.bodies.is_empty() {
        bail!("no request bodies");
    }
    // The client's connections: up to the hard open-file limit.
    let fds = crate::node::http::raise_open_file_limit() as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(CLIENT_THREADS)
        .thread_name("http-load")
        .enable_all()
        .build()
        .context("the HTTP client's runtime")?;
    let conns_max = CONNS_MAX.min(fds.saturating_sub(64)).max(1);
    if spec.warm_conns > conns_max {
        bail!(
            "{} warm connections asked for, but the client may keep {conns_max} open ({CONNS_MAX}, or the open-file limit less 64)",
            spec.warm_conns
        );
    }
    let warm = rt.block_on(open_conns(spec.addr, spec.warm_conns))?;
    let n_warm = warm.len();
    let t0 = Instant::now() + Duration::from_millis(10);
    // The timeline covers the warm-up and the measured window (at most an hour of
    // 100-ms slots, 36,000 entries).
    let n_slots = slot_of((spec.warmup + spec.duration).min(Duration::from_secs(3600))) + 1;
    let sh = Arc::new(Shared {
        addr: spec.addr,
        host: spec.addr.to_string(),
        path: format!("/v2/models/{}/infer", spec.model),
        slo: spec.slo,
        t0,
        conns_max,
        idle: Mutex::new(warm),
        open: AtomicUsize::new(n_warm),
        peak: AtomicUsize::new(n_warm),
        opened: AtomicU64::new(n_warm as u64),
        in_flight: AtomicUsize::new(0),
        acc: Mutex::new(Acc {
            c: LoadCounts::default(),
            lat: hist(),
            refusal: hist(),
            door_refusal: hist(),
            lag: hist(),
            slots: vec![Slot::default(); n_slots],
        }),
    });
    let sampler = CpuSampler::start(t0, spec.server_pid);
    let staller = spec
        .stall
        .map(|st| Staller::start(st, t0 + spec.warmup, t0 + spec.warmup + spec.duration))
        .transpose()?;
    let mut gen = ArrivalGen::new(spec.arrival, spec.rate_rps, vec![], spec.seed, false);
    let win = Time::ZERO + crate::core::Dur::from_secs_f64(spec.warmup.as_secs_f64());
    let horizon = win + crate::core::Dur::from_secs_f64(spec.duration.as_secs_f64());
    let mut offered = 0u64;
    let mut i = 0usize;
    let mut pace_late = vec![0u64; n_slots];
    while gen.peek() < horizon {
        let t = gen.advance();
        let due = t0 + Duration::from_nanos(t.0.max(0) as u64);
        let now = Instant::now();
        if due > now + Duration::from_micros(20) {
            std::thread::sleep(due - now);
        }
        // Late from oversleeping, or from falling behind.
        let late = Instant::now().saturating_duration_since(due).as_micros() as u64;
        if let Some(m) = pace_late.get_mut(slot_of(due.saturating_duration_since(t0))) {
            *m = (*m).max(late);
        }
        let counted = t >= win;
        offered += counted as u64;
        sh.in_flight.fetch_add(1, Ordering::Relaxed);
        let body = spec.bodies[i % spec.bodies.len()].clone();
        i += 1;
        rt.spawn(sh.clone().one(due, counted, body));
    }
    let stalls = staller.map(Staller::stop);
    let end = Instant::now() + DRAIN;
    while sh.in_flight.load(Ordering::Acquire) > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (mut counts, lat, (refusal, door_refusal), lag, mut slots) = {
        let a = sh.acc();
        (
            a.c.clone(),
            a.lat.clone(),
            (a.refusal.clone(), a.door_refusal.clone()),
            a.lag.clone(),
            a.slots.clone(),
        )
    };
    for (s, &p) in slots.iter_mut().zip(&pace_late) {
        s.pace_late_max_us = p;
    }
    for (s, o) in slots.iter_mut().zip(sampler.finish()) {
        s.others_cpu_ms = o;
    }
    rt.shutdown_background();
    counts.offered = offered;
    let ended = counts.ok
        + counts.late_200
        + counts.status_429
        + counts.status_503
        + counts.status_504
        + counts.other_status
        + counts.transport_errors
        + counts.conn_limit;
    counts.unanswered = offered.saturating_sub(ended);
    Ok(LoadResult {
        counts,
        latency_us: lat,
        refusal_us: refusal,
        door_refusal_us: door_refusal,
        lag_us: lag,
        conns_opened: sh.opened.load(Ordering::Relaxed),
        conns_peak: sh.peak.load(Ordering::Relaxed),
        bursts: bursts(&slots),
        pace_late_max_ms: pace_late.iter().copied().max().unwrap_or(0) as f64 / 1e3,
        stalls,
    })
}

/// The serving process's own figures, from the JSON report it prints when
/// stopped (warm-up included).
#[derive(Debug, Clone, Serialize)]
pub struct ServerFigures {
    pub requests: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    pub failed: u64,
    /// Requests per batch run by the backends.
    pub batch_mean: f64,
    /// The backends' largest p99 of a plan's start after its planned start, us
    /// (a stalled worker thread shows here).
    pub start_delay_p99_us: f64,
    /// Requests the backends found past their deadline before running them.
    pub tasks_too_late: u64,
}

impl ServerFigures {
    /// From `fermata serve`'s report (a `ClusterReport`); None when it lacks the fields.
    pub fn of_report(v: &Value) -> Option<ServerFigures> {
        let sum = |list: &str, key: &str| -> Option<u64> {
            v.get(list)?
                .as_array()?
                .iter()
                .map(|e| e.get(key).and_then(Value::as_u64))
                .sum()
        };
        let tasks = sum("backends", "tasks_run")?;
        let start_delay_p99_us = v
            .get("backends")?
            .as_array()?
            .iter()
            .filter_map(|e| e.get("start_delay_p99_us").and_then(Value::as_f64))
            .fold(0.0, f64::max);
        let plans = sum("backends", "plans_run")?;
        Some(ServerFigures {
            requests: sum("frontends", "requests")?,
            good: sum("frontends", "good")?,
            late: sum("frontends", "late")?,
            dropped: sum("frontends", "dropped")?,
            failed: sum("frontends", "failed")?,
            batch_mean: if plans == 0 {
                0.0
            } else {
                tasks as f64 / plans as f64
            },
            start_delay_p99_us,
            tasks_too_late: sum("backends", "tasks_too_late")?,
        })
    }
}

/// One row of the sweep: a model at a rate, one repetition.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub model: String,
    pub rate_rps: f64,
    /// The repetition, from 1.
    pub rep: u32,
    pub slo_ms: f64,
    #[serde(flatten)]
    pub counts: LoadCounts,
    pub bad: u64,
    pub bad_pct: f64,
    /// Of the 200 answers (on time or late), due to last byte.
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// Good answers (200 within the SLO) per second of the measured window.
    pub good_rps: f64,
    /// Of the refusals (429 and 503), due to last byte.
    pub refusal_p50_ms: f64,
    pub refusal_p99_ms: f64,
    /// Of the refusals at the door, due to last byte.
    pub door_refusal_p50_ms: f64,
    pub door_refusal_p99_ms: f64,
    pub client_lag_p99_ms: f64,
    pub conns_opened: u64,
    pub conns_peak: usize,
    /// Where the bad requests fell.
    pub bursts: Vec<Burst>,
    /// How late the client's pacing thread sent at most, ms.
    pub pace_late_max_ms: f64,
    /// The share of the host's CPU time stolen by the hypervisor during the run
    /// (`steal` of /proc/stat; None where it cannot be read).
    pub host_steal_pct: Option<f64>,
    /// The stalls injected during the load (`--stall`; None without it).
    pub stalls: Option<u64>,
    /// The server's report; None when it printed none.
    pub server: Option<ServerFigures>,
    /// The door's own figures, from the server's `/metrics` after the load
    /// (warm-up included); None when it could not be read.
    pub door: Option<DoorFigures>,
}

/// The first line of /proc/stat: the host's CPU time by kind (user nice
/// system idle iowait irq softirq steal guest guest_nice), in ticks.
fn host_ticks() -> Option<Vec<u64>> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    line.split_whitespace().map(|x| x.parse().ok()).collect()
}

/// The host's CPU time: (all, steal), in ticks (guest and guest_nice are
/// already counted in user and nice).
fn cpu_ticks() -> Option<(u64, u64)> {
    let v = host_ticks()?;
    Some((v.iter().take(8).sum(), *v.get(7)?))
}

/// Steal as a percentage of the CPU time between two [`cpu_ticks`] readings.
fn steal_pct(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((a0, s0), (a1, s1)) = (before?, after?);
    let all = a1.checked_sub(a0).filter(|&d| d > 0)?;
    Some(100.0 * s1.saturating_sub(s0) as f64 / all as f64)
}

/// The host's CPU time in processes and kernel threads (user, nice, system;
/// not interrupts, whose softirq time is mostly the client's and the server's
/// loopback traffic, nor idle, iowait or steal), in ticks.
fn busy_ticks() -> Option<u64> {
    Some(host_ticks()?.iter().take(3).sum())
}

/// A process's CPU time (user + system, all its threads), in ticks.
fn proc_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces), from `state`.
    let rest = &s[s.rfind(')')? + 2..];
    let v: Vec<&str> = rest.split_whitespace().collect();
    Some(v.get(11)?.parse::<u64>().ok()? + v.get(12)?.parse::<u64>().ok()?)
}

/// Reads, once a [`SLOT`] on its own thread, how much CPU time the host spent
/// beside the client (this process) and the server: a burst that follows
/// another process's or a kernel thread's CPU use is the host's, not the
/// server's. Tick-grained (10 ms on Linux), so a slot's figure is a multiple of
/// that; 0 where /proc cannot be read.
struct CpuSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<u64>>>,
}

impl CpuSampler {
    fn start(t0: Instant, server: Option<u32>) -> CpuSampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        // SAFETY: sysconf has no preconditions.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let me = std::process::id();
        let thread = std::thread::spawn(move || {
            let read = || {
                let server = server.map_or(Some(0), proc_ticks);
                Some((busy_ticks()?, proc_ticks(me)?, server?))
            };
            let mut out = Vec::new();
            let mut last = read();
            let mut next = t0 + SLOT;
            while !halt.load(Ordering::Relaxed) {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                next += SLOT;
                let now = read();
                let others = match (last, now) {
                    (Some((b0, c0, s0)), Some((b1, c1, s1))) => b1
                        .saturating_sub(b0)
                        .saturating_sub(c1.saturating_sub(c0))
                        .saturating_sub(s1.saturating_sub(s0)),
                    _ => 0,
                };
                out.push(others * 1000 / tck);
                last = now;
            }
            out
        });
        CpuSampler {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread; the others' CPU time per slot, ms.
    fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for CpuSampler {
    /// A run that ends early (a panic) does not leave the thread reading /proc.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The sweep: every model × rate × repetition, each on a fresh server.
#[derive(Debug, Clone)]
pub struct SweepOpts {
    /// The model repository the servers serve.
    pub models_dir: PathBuf,
    /// The models to drive, one at a time.
    pub models: Vec<ModelMeta>,
    pub rates: Vec<f64>,
    /// The arrivals' spacing.
    pub arrival: Arrival,
    pub warmup: Duration,
    pub duration: Duration,
    pub reps: u32,
    /// `fermata serve --policy`.
    pub policy: Option<String>,
    /// More arguments for every `fermata serve`.
    pub serve_args: Vec<String>,
    pub seed: u64,
    /// [`LoadSpec::warm_conns`] of every run.
    pub warm_conns: usize,
    /// Stalls injected into every run's load ([`super::stall`]), if any.
    pub stall: Option<StallSpec>,
    /// The CPUs every server is restricted to (all when `None`).
    pub server_cpus: Option<Vec<usize>>,
}

/// How long a server may take to print its address and to be ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server has to print its report after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The address in serve's `... HTTP API listening on http://ADDR ...` line.
pub fn listening_addr(line: &str) -> Option<String> {
    let rest = line.split("HTTP API listening on http://").nth(1)?;
    rest.split_whitespace().next().map(str::to_string)
}

/// Starts `exe serve --executor onnx --models DIR --http-port 0 [--policy P]`
/// and waits for its address.
pub fn start_server(exe: &Path, o: &SweepOpts) -> Result<(Proc, SocketAddr)> {
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--executor".into(),
        "onnx".into(),
        "--models".into(),
        o.models_dir.to_string_lossy().into_owned(),
        "--http-port".into(),
        "0".into(),
    ];
    if let Some(p) = &o.policy {
        args.push("--policy".into());
        args.push(p.clone());
    }
    args.extend(o.serve_args.iter().cloned());
    let mut p = Proc::spawn_on(exe, "serve", &args, &[], o.server_cpus.as_deref(), false)?;
    let a = p.wait_for(
        "HTTP API listening on http://ADDR",
        START_TIMEOUT,
        listening_addr,
    );
    let a = match a {
        Ok(a) => a,
        Err(e) => {
            let _ = p.stop(Duration::from_secs(1));
            return Err(e.context(format!("starting {} {}", exe.display(), args.join(" "))));
        }
    };
    let addr: SocketAddr = a
        .parse()
        .with_context(|| format!("serve printed an address that does not parse: {a}"))?;
    Ok((p, addr))
}

/// One model at one rate on a fresh server.
fn run_one(
    exe: &Path,
    o: &SweepOpts,
    m: &ModelMeta,
    rate: f64,
    rep: u32,
    seed: u64,
) -> Result<Row> {
    let (p, addr) = start_server(exe, o)?;
    let ticks = cpu_ticks();
    let load = wait_ready(addr, &m.name, START_TIMEOUT).and_then(|_| {
        run_load(&LoadSpec {
            addr,
            model: m.name.clone(),
            bodies: infer_bodies(m, seed),
            slo: Duration::from_secs_f64(m.slo_ms / 1e3),
            rate_rps: rate,
            arrival: o.arrival,
            warmup: o.warmup,
            duration: o.duration,
            seed,
            warm_conns: o.warm_conns,
            server_pid: Some(p.child.id()),
            stall: o.stall,
        })
    });
    let host_steal_pct = steal_pct(ticks, cpu_ticks());
    let door = crate::harness::churn::get_metrics(&addr.to_string())
        .ok()
        .and_then(|t| DoorFigures::of_metrics(&t));
    let report = p.stop(STOP_GRACE);
    let r = load?;
    let server = report
        .and_then(|l| serde_json::from_str::<Value>(&l).ok())
        .and_then(|v| ServerFigures::of_report(&v));
    Ok(Row {
        model: m.name.clone(),
        rate_rps: rate,
        rep,
        slo_ms: m.slo_ms,
        bad: r.counts.bad(),
        bad_pct: r.counts.bad_pct(),
        good_rps: r.counts.ok as f64 / o.duration.as_secs_f64().max(1e-9),
        counts: r.counts,
        latency_p50_ms: ms(&r.latency_us, 0.5),
        latency_p99_ms: ms(&r.latency_us, 0.99),
        refusal_p50_ms: ms(&r.refusal_us, 0.5),
        refusal_p99_ms: ms(&r.refusal_us, 0.99),
        door_refusal_p50_ms: ms(&r.door_refusal_us, 0.5),
        door_refusal_p99_ms: ms(&r.door_refusal_us, 0.99),
        client_lag_p99_ms: ms(&r.lag_us, 0.99),
        conns_opened: r.conns_opened,
        conns_peak: r.conns_peak,
        bursts: r.bursts,
        pace_late_max_ms: r.pace_late_max_ms,
        host_steal_pct,
        stalls: r.stalls,
        server,
        door,
    })
}

/// Runs the sweep with servers started from `exe` (the `fermata` binary);
/// `progress` sees each row as it is measured.
pub fn sweep(exe: &Path, o: &SweepOpts, mut progress: impl FnMut(&Row)) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (mi, m) in o.models.iter().enumerate() {
        for (ri, &rate) in o.rates.iter().enumerate() {
            for rep in 0..o.reps {
                let seed = o
                    .seed
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(((mi * 1000 + ri) as u64) << 16 | rep as u64);
                let row = run_one(exe, o, m, rate, rep + 1, seed).with_context(|| {
                    format!("model {} at {rate} r/s (repetition {})", m.name, rep + 1)
                })?;
                progress(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// What a sweep says of one model against the bar below capacity.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub model: String,
    /// The highest rate with fewer than [`SUSTAINED_BAD_PCT`] bad in every
    /// repetition (None: no rate).
    pub sustained_rps: Option<f64>,
    /// The rates at most [`BELOW_CAPACITY`] of that, and of those the ones
    /// with a repetition at [`BAD_PCT_MAX`] or more bad: (rate, worst bad %).
    pub below: Vec<f64>,
    pub below_failed: Vec<(f64, f64)>,
    /// The rates above the sustained one: (rate, the fewest good answers per
    /// second of a repetition as a share of the sustained rate, the largest
    /// refusal p99 of a repetition in ms).
    pub over: Vec<(f64, f64, f64)>,
}

/// For each model (in order of appearance), its [`Verdict`].
pub fn verdicts(rows: &[Row]) -> Vec<Verdict> {
    let mut models: Vec<String> = Vec::new();
    for r in rows {
        if !models.contains(&r.model) {
            models.push(r.model.clone());
        }
    }
    models
        .into_iter()
        .map(|m| {
            let mut rates: Vec<f64> = rows
                .iter()
                .filter(|r| r.model == m)
                .map(|r| r.rate_rps)
                .collect();
            rates.sort_by(f64::total_cmp);
            rates.dedup();
            let worst = |rate: f64| {
                rows.iter()
                    .filter(|r| r.model == m && r.rate_rps == rate)
                    .map(|r| r.bad_pct)
                    .fold(0.0, f64::max)
            };
            let sustained_rps = rates
                .iter()
                .copied()
                .filter(|&r| worst(r) < SUSTAINED_BAD_PCT)
                .fold(None, |b: Option<f64>, r| Some(b.map_or(r, |b| b.max(r))));
            let below: Vec<f64> = match sustained_rps {
                Some(top) => rates
                    .iter()
                    .copied()
                    .filter(|&r| r <= BELOW_CAPACITY * top)
                    .collect(),
                None => Vec::new(),
            };
            let below_failed = below
                .iter()
                .map(|&r| (r, worst(r)))
                .filter(|&(_, w)| w >= BAD_PCT_MAX)
                .collect();
            let over = match sustained_rps {
                Some(top) => rates
                    .iter()
                    .copied()
                    .filter(|&r| r > top)
                    .map(|rate| {
                        let reps = rows.iter().filter(|r| r.model == m && r.rate_rps == rate);
                        let good = reps.clone().map(|r| r.good_rps).fold(f64::MAX, f64::min);
                        let refusal = reps.map(|r| r.refusal_p99_ms).fold(0.0, f64::max);
                        (rate, good / top, refusal)
                    })
                    .collect(),
                None => Vec::new(),
            };
            Verdict {
                model: m,
                sustained_rps,
                below,
                below_failed,
                over,
            }
        })
        .collect()
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(top) = self.sustained_rps else {
            return write!(
                f,
                "{}: no rate had bad < {SUSTAINED_BAD_PCT}% in every repetition",
                self.model
            );
        };
        let share = BELOW_CAPACITY * 100.0;
        write!(
            f,
            "{}: sustains {top:.0} r/s (bad < {SUSTAINED_BAD_PCT}% in every repetition); ",
            self.model
        )?;
        for (rate, good, refusal) in &self.over {
            write!(
                f,
                "at {rate:.0} r/s ({:.2}x) good answers {good:.2} of it, refusal p99 {refusal:.1} ms; ",
                rate / top
            )?;
        }
        if self.below.is_empty() {
            return write!(f, "no rate swept at or under {share:.0}% of it");
        }
        write!(
            f,
            "at the {} rate(s) up to {share:.0}% of it, bad < {BAD_PCT_MAX}% in every repetition: ",
            self.below.len()
        )?;
        if self.below_failed.is_empty() {
            return write!(f, "yes");
        }
        write!(f, "no (")?;
        for (i, (r, w)) in self.below_failed.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{r:.0} r/s: {w:.3}%")?;
        }
        write!(f, ")")
    }
}

/// Where a run's bad requests fell and what the host and the server said of
/// that time (lines for the progress output).
pub fn why_bad(r: &Row) -> String {
    const SHOWN: usize = 5;
    let c = &r.counts;
    let mut s = format!(
        "    bad: {} late 200, {} 429, {} 504, {} other; {} burst(s) (seconds from the start of the load, warm-up included)",
        c.late_200,
        c.status_429,
        c.status_504,
        c.status_503 + c.other_status + c.transport_errors + c.conn_limit + c.unanswered,
        r.bursts.len()
    );
    for b in r.bursts.iter().take(SHOWN) {
        s += &format!(
            "\n    {:6.1}-{:<6.1} s: {} bad of {}, latency max {:.1} ms, client pacing late max {:.1} ms, {} connection(s) opened (longest connect {:.1} ms), others' CPU max {:.0} ms per 100 ms",
            b.from_s, b.to_s, b.bad, b.requests, b.latency_max_ms, b.pace_late_max_ms, b.conns_opened, b.connect_max_ms, b.others_cpu_max_ms
        );
    }
    if r.bursts.len() > SHOWN {
        s += &format!("\n    ... {} more", r.bursts.len() - SHOWN);
    }
    s += &format!(
        "\n    client pacing late max {:.1} ms over the run; host steal {}",
        r.pace_late_max_ms,
        r.host_steal_pct
            .map_or("unknown".to_string(), |p| format!("{p:.2}%"))
    );
    if let Some(f) = &r.server {
        s += &format!(
            "; server: {} late, {} dropped, {} failed, {} found too late at a backend, plan start delay p99 {:.0} us",
            f.late, f.dropped, f.failed, f.tasks_too_late, f.start_delay_p99_us
        );
    }
    let c = &r.counts;
    if c.status_429 > 0 {
        s += &format!(
            "\n    429s: {} at the door (p50 {:.1} ms, p99 {:.1} ms), {} dropped by the scheduler",
            c.door_429,
            r.door_refusal_p50_ms,
            r.door_refusal_p99_ms,
            c.status_429 - c.door_429
        );
    }
    if let Some(d) = &r.door {
        s += &format!(
            "\n    door (server, warm-up included): refused {} deadline, {} queue, {} backlog, {:.1}% decided within 5 ms; waits mean head {:.2} ms ({:.2}% over 5 ms), read {:.2}, decode {:.2}, answer {:.2}; connections closed by the cap {} evicted, {} refused",
            d.refused_deadline,
            d.refused_queue,
            d.refused_backlog,
            100.0 * d.refused_within_5ms,
            d.head_mean_ms,
            100.0 * d.head_over_5ms,
            d.read_mean_ms,
            d.decode_mean_ms,
            d.answer_mean_ms,
            d.conns_evicted,
            d.conns_refused
        );
    }
    s
}

/// The rows as a table (one line each, with a header).
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<10} {:>7} {:>3} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8}\n",
        "model", "rate", "rep", "offered", "sent", "ok", "bad%", "late", "429", "503", "504",
        "other", "xport", "nconn", "p50 ms", "p99 ms", "lag99 ms", "batch", "good/s", "ref99 ms"
    );
    for r in rows {
        let c = &r.counts;
        let batch = r
            .server
            .as_ref()
            .map_or("-".to_string(), |s| format!("{:.1}", s.batch_mean));
        s += &format!(
            "{:<10} {:>7.0} {:>3} {:>7} {:>7} {:>7} {:>7.3} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5} {:>8.2} {:>8.2} {:>8.2} {:>6} {:>8.0} {:>8.2}\n",
            r.model,
            r.rate_rps,
            r.rep,
            c.offered,
            c.sent,
            c.ok,
            r.bad_pct,
            c.late_200,
            c.status_429,
            c.status_503,
            c.status_504,
            c.other_status,
            c.transport_errors + c.unanswered,
            c.conn_limit,
            r.latency_p50_ms,
            r.latency_p99_ms,
            r.client_lag_p99_ms,
            batch,
            r.good_rps,
            r.refusal_p99_ms
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_read_from_serves_line() {
        let l = "fermata serve: models (onnx) (1 GPUs, onnx executor) | HTTP API listening on http://127.0.0.1:4321 (Ctrl-C to stop)";
        assert_eq!(listening_addr(l).as_deref(), Some("127.0.0.1:4321"));
        assert_eq!(listening_addr("fermata serve: starting"), None);
    }

    #[test]
    fn bodies_have_the_models_inputs() {
        let meta = ModelMeta::from_json(
            r#"{"name": "r", "inputs": [
                {"name": "dense", "datatype": "FP32", "shape": [-1, 4]},
                {"name": "ids", "datatype": "INT64", "shape": [-1, 2, 3]}],
               "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
               "slo_ms": 10, "max_batch": 8}"#,
        )
        .unwrap();
        let b = infer_bodies(&meta, 1);
        assert_eq!(b.len(), BODIES);
        let v: Value = serde_json::from_slice(&b[0]).unwrap();
        let ins = v["inputs"].as_array().unwrap();
        assert_eq!(ins[0]["shape"], json!([1, 4]));
        assert_eq!(ins[0]["datatype"], "FP32");
        assert_eq!(ins[0]["data"].as_array().unwrap().len(), 4);
        assert_eq!(ins[1]["shape"], json!([1, 2, 3]));
        let ids = ins[1]["data"].as_array().unwrap();
        assert_eq!(ids.len(), 6);
        assert!(ids.iter().all(|x| (0..8).contains(&x.as_i64().unwrap())));
    }

    fn row(model: &str, rate: f64, bad_pct: f64) -> Row {
        Row {
            model: model.into(),
            rate_rps: rate,
            rep: 1,
            slo_ms: 10.0,
            counts: LoadCounts::default(),
            bad: 0,
            bad_pct,
            latency_p50_ms: 0.0,
            latency_p99_ms: 0.0,
            good_rps: 0.0,
            refusal_p50_ms: 0.0,
            refusal_p99_ms: 0.0,
            door_refusal_p50_ms: 0.0,
            door_refusal_p99_ms: 0.0,
            client_lag_p99_ms: 0.0,
            conns_opened: 0,
            conns_peak: 0,
            bursts: vec![],
            pace_late_max_ms: 0.0,
            host_steal_pct: None,
            stalls: None,
            server: None,
            door: None,
        }
    }

    /// Bad slots a clean slot or two apart are one burst; further apart, two;
    /// the pacing lag is taken over the burst and the second before it.
    #[test]
    fn bad_requests_group_into_bursts() {
        let mut slots = vec![
            Slot {
                requests: 10,
                ..Slot::default()
            };
            40
        ];
        slots[3].pace_late_max_us = 7_000;
        slots[5].others_cpu_ms = 40;
        slots[11].conns_opened = 4;
        slots[11].connect_max_us = 1_020_000;
        slots[12].bad = 2;
        slots[12].latency_max_us = 30_000;
        slots[15].bad = 1;
        slots[30].bad = 5;
        slots[30].latency_max_us = 90_000;
        let b = bursts(&slots);
        assert_eq!(b.len(), 2, "{b:?}");
        assert!((b[0].from_s - 1.2).abs() < 1e-9 && (b[0].to_s - 1.6).abs() < 1e-9);
        assert_eq!((b[0].requests, b[0].bad), (40, 3));
        assert_eq!(b[0].latency_max_ms, 30.0);
        assert_eq!(b[0].pace_late_max_ms, 7.0);
        assert_eq!((b[0].conns_opened, b[0].connect_max_ms), (4, 1020.0));
        assert_eq!((b[1].conns_opened, b[1].connect_max_ms), (0, 0.0));
        assert_eq!((b[1].requests, b[1].bad), (10, 5));
        assert_eq!(b[1].pace_late_max_ms, 0.0);
        assert_eq!(
            (b[0].others_cpu_max_ms, b[1].others_cpu_max_ms),
            (40.0, 0.0)
        );
        assert!(bursts(&[Slot::default(); 5]).is_empty());
    }

    /// The sampler's readings: this process's CPU time grows as it spins, and a
    /// process that does not exist reads as None.
    #[test]
    fn cpu_time_is_read_per_process() {
        let me = std::process::id();
        let a = proc_ticks(me).expect("this process's /proc/PID/stat");
        // Spin until a tick is charged (tests share the cores), 5 s at most.
        let t = Instant::now();
        while proc_ticks(me).unwrap() == a && t.elapsed() < Duration::from_secs(5) {
            for i in 0..100_000u64 {
                std::hint::black_box(i);
            }
        }
        assert!(proc_ticks(me).unwrap() > a);
        assert!(busy_ticks().unwrap() > 0);
        assert_eq!(proc_ticks(u32::MAX), None);
        let s = CpuSampler::start(Instant::now(), None);
        std::thread::sleep(Duration::from_millis(350));
        assert!(s.finish().len() >= 3);
    }

    #[test]
    fn steal_is_a_share_of_the_time_between_readings() {
        assert_eq!(steal_pct(Some((100, 5)), Some((300, 25))), Some(10.0));
        assert_eq!(steal_pct(Some((100, 5)), Some((100, 5))), None);
        assert_eq!(steal_pct(None, Some((100, 5))), None);
        assert!(cpu_ticks().is_some(), "/proc/stat on Linux");
    }

    /// The sustained rate holds in every repetition, and every rate up to
    /// 80% of it is checked against the 0.1% bar.
    #[test]
    fn the_verdict_holds_in_every_repetition() {
        let rows = vec![
            row("a", 100.0, 0.0),
            row("a", 200.0, 0.05),
            row("a", 200.0, 0.2),
            row("a", 400.0, 0.5),
            row("a", 400.0, 0.0),
            row("a", 500.0, 0.9),
            row("a", 500.0, 1.5),
            row("b", 100.0, 1.0),
        ];
        let mut rows = rows;
        for (i, (good, refusal)) in [(5, (390.0, 2.0)), (6, (370.0, 4.5))] {
            rows[i].good_rps = good;
            rows[i].refusal_p99_ms = refusal;
        }
        let v = verdicts(&rows);
        // Past the sustained rate: the worst repetition's good answers and
        // refusal p99.
        assert_eq!(v[0].over, vec![(500.0, 370.0 / 400.0, 4.5)]);
        assert!(
            v[0].to_string()
                .contains("at 500 r/s (1.25x) good answers 0.93 of it, refusal p99 4.5 ms"),
            "{}",
            v[0]
        );
        assert_eq!(v[0].sustained_rps, Some(400.0));
        assert_eq!(v[0].below, vec![100.0, 200.0]);
        assert_eq!(v[0].below_failed, vec![(200.0, 0.2)]);
        assert!(
            v[0].to_string().contains("no (200 r/s: 0.200%)"),
            "{}",
            v[0]
        );
        assert_eq!(v[1].sustained_rps, None);
        let alone = verdicts(&[row("d", 100.0, 0.0)]);
        assert!(
            alone[0]
                .to_string()
                .ends_with("no rate swept at or under 80% of it"),
            "{}",
            alone[0]
        );
        assert!(v[1].below.is_empty());
        let ok = verdicts(&[row("c", 100.0, 0.0), row("c", 200.0, 0.5)]);
        assert!(ok[0].to_string().ends_with("yes"), "{}", ok[0]);
    }
}
