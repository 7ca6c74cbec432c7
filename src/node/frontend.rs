//! The frontend process: accepts client requests, keeps their input bytes in its
//! region, hands tasks {id, model, deadline, input location} to the scheduler and
//! answers each client exactly once: `Good` (output by the deadline), `Late`
//! (output after it), `Dropped` (the scheduler gave up on it) or `Failed` (backend
//! lost, input missing, executor error, bad request, or no answer by the deadline
//! plus `grace`).
//!
//! One thread runs everything: the scheduler connection, client connections and the
//! connections on which backends push results all deliver to one event loop. The
//! region is read by backends without this thread (see [`crate::transport`]).
//!
//! In-process clients (the HTTP server of [`super::http`]) hand requests to the same
//! loop through a [`FrontendHandle`]: a channel in, a oneshot answer out, with the
//! same exactly-once accounting as wire clients and a finer cause ([`Ended`]).
//!
//! The scheduler tells the frontend how many GPUs are in service (`Capacity`); a
//! request that arrives while there is none ends at once as dropped with
//! [`DropReason::NoGpu`].

use super::clock::{OffsetEstimator, SchedClock};
use super::proto::check;
use super::proto::ledger::{Answer, Finished, RequestLedger};
use crate::core::{Dur, Time};
use crate::metrics::{Counter, Gauge, Histogram, Registry, LATENCY_BUCKETS};
use crate::runtime::clock::Clock;
use crate::transport::{Conn, ConnId, Event, Listener, Region, RegionServer, Transport};
use crate::wire::{DropReason, ModelInfo, Msg, ReplyStatus, Role, SubmitTask, MAX_ITEMS};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most events handled between two submits to the scheduler.
const DRAIN_MAX: usize = 64;

/// Most in-process requests (HTTP, gRPC) waiting for the frontend's loop; beyond,
/// a request is refused at once as dropped (overloaded) and counted in
/// `fermata_frontend_queue_full_total`.
pub const LOCAL_MAX: usize = 16_384;

/// The window of the `fermata_bad_rate` gauge.
pub const BAD_RATE_WINDOW: Duration = Duration::from_secs(10);

/// Frontend settings.
#[derive(Debug, Clone)]
pub struct FrontendOpts {
    pub scheduler: String,
    /// Where clients connect and backends push results.
    pub listen: String,
    /// Where the region is served (TCP: host:port).
    pub data_listen: String,
    pub region_bytes: u64,
    pub name: String,
    /// A task with no answer by its deadline plus this ends as Failed.
    pub grace: Duration,
    pub scheduler_timeout: Duration,
    /// Serve the KServe v2 HTTP API (and `/metrics`) too.
    pub http: Option<super::http::HttpOpts>,
}

impl FrontendOpts {
    pub fn new(scheduler: &str) -> FrontendOpts {
        FrontendOpts {
            scheduler: scheduler.to_string(),
            listen: "127.0.0.1:0".into(),
            data_listen: "127.0.0.1:0".into(),
            region_bytes: 1 << 30,
            name: "frontend".into(),
            grace: Duration::from_millis(3000),
            scheduler_timeout: Duration::from_millis(2000),
            http: None,
        }
    }
}

/// What a frontend counted.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FrontendReport {
    pub requests: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    pub failed: u64,
    /// Of `failed`: no answer by deadline + grace.
    pub timed_out: u64,
    /// Answers for tasks that had already ended (ignored).
    pub stray_answers: u64,
    pub bad_requests: u64,
    pub clock_offset_us: f64,
    pub clock_error_us: f64,
}

/// Who waits for a request's answer.
enum Client {
    /// A wire client: its connection and request id.
    Conn(ConnId, u64),
    /// An in-process client (HTTP).
    Local(tokio::sync::oneshot::Sender<InferDone>),
}

pub use super::proto::ledger::Ended;

/// The answer to an in-process request.
#[derive(Debug, Clone)]
pub struct InferDone {
    pub ended: Ended,
    pub status: ReplyStatus,
    pub output: Vec<u8>,
    /// Why it was not good (empty when it was).
    pub message: String,
    /// From the frontend's receipt to its answer.
    pub latency: Duration,
    /// From arrival to the batch's start (zero when it did not run).
    pub queue: Duration,
    /// Size of the batch it ran in (0 when it did not run).
    pub batch_size: u32,
}

/// A request from an in-process client.
struct LocalInfer {
    model: String,
    slo_ns: i64,
    input: Vec<u8>,
    reply: tokio::sync::oneshot::Sender<InferDone>,
}

/// What a frontend shares with its in-process clients.
struct FrontendState {
    models: Vec<ModelInfo>,
    sched_ok: AtomicBool,
    gpus: AtomicU32,
    registry: Arc<Registry>,
    tx: Sender<LocalInfer>,
    /// Requests refused because `tx` was full.
    local_full: Arc<Counter>,
    /// The loop ended: requests are refused.
    stopped: AtomicBool,
}

impl FrontendState {
    fn scheduler_connected(&self) -> bool {
        self.sched_ok.load(Ordering::Relaxed) && !self.stopped.load(Ordering::Relaxed)
    }
}

/// A handle on a running frontend for in-process clients (the HTTP server):
/// cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct FrontendHandle {
    state: Arc<FrontendState>,
}

impl FrontendHandle {
    /// The models served (as the scheduler announced them).
    pub fn models(&self) -> &[ModelInfo] {
        &self.state.models
    }
    pub fn scheduler_connected(&self) -> bool {
        self.state.scheduler_connected()
    }
    /// GPUs in service, as the scheduler last said.
    pub fn gpus_in_service(&self) -> u32 {
        self.state.gpus.load(Ordering::Relaxed)
    }
    /// Ready for requests: the scheduler is connected and some GPU is in service
    /// (every backend loads every model, so this holds for each model too).
    pub fn ready(&self) -> Result<(), String> {
        if !self.scheduler_connected() {
            return Err("the frontend has no scheduler".into());
        }
        if self.gpus_in_service() == 0 {
            return Err("no GPU in service".into());
        }
        Ok(())
    }
    /// The frontend's metrics.
    pub fn metrics(&self) -> Arc<Registry> {
        self.state.registry.clone()
    }
    /// Hands one request to the frontend's loop; the answer comes on the returned
    /// receiver, exactly once (or the receiver errs if the frontend stopped first).
    /// `slo_ns` 0 means the model's default SLO.
    pub fn infer(
        &self,
        model: &str,
        slo_ns: i64,
        input: Vec<u8>,
    ) -> tokio::sync::oneshot::Receiver<InferDone> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        if self.state.stopped.load(Ordering::Acquire) {
            return rx;
        }
        let l = LocalInfer {
            model: model.to_string(),
            slo_ns,
            input,
            reply,
        };
        if let Err(TrySendError::Full(l)) = self.state.tx.try_send(l) {
            // The loop is LOCAL_MAX requests behind: refuse at once, counted.
            self.state.local_full.inc();
            let _ = l.reply.send(InferDone {
                ended: Ended::Dropped(DropReason::Overloaded),
                status: ReplyStatus::Dropped,
                output: Vec::new(),
                message: format!(
                    "the frontend is overloaded ({LOCAL_MAX} requests waiting for its loop)"
                ),
                latency: Duration::ZERO,
                queue: Duration::ZERO,
                batch_size: 0,
            });
        }
        rx
    }
}

/// Per-model series of the frontend.
struct ModelStats {
    good: Arc<Counter>,
    late: Arc<Counter>,
    dropped: Arc<Counter>,
    failed: Arc<Counter>,
    latency: Arc<Histogram>,
    queue: Arc<Histogram>,
    bad_rate: Arc<Gauge>,
    /// (ended, bad) over the last BAD_RATE_WINDOW.
    window: crate::metrics::Window<(u64, u64)>,
}

impl ModelStats {
    fn new(reg: &Registry, model: &str) -> ModelStats {
        let outcome = |o: &str| {
            reg.counter(
                "fermata_requests_total",
                "Requests ended at the frontend, by outcome (good, late, dropped, failed).",
                &[("model", model), ("outcome", o)],
            )
        };
        ModelStats {
            good: outcome("good"),
            late: outcome("late"),
            dropped: outcome("dropped"),
            failed: outcome("failed"),
            latency: reg.histogram(
                "fermata_request_latency_seconds",
                "From the frontend's receipt of a request to its answer, every outcome.",
                &[("model", model)],
                Histogram::seconds(LATENCY_BUCKETS),
            ),
            queue: reg.histogram(
                "fermata_queuing_delay_seconds",
                "From a request's arrival to the start of its batch (requests that ran).",
                &[("model", model)],
                Histogram::seconds(LATENCY_BUCKETS),
            ),
            bad_rate: reg.gauge(
                "fermata_bad_rate",
                "Fraction of requests ended over the last 10 s that were not good (late, dropped or failed).",
                &[("model", model)],
            ),
            window: Default::default(),
        }
    }
    fn ended(&self) -> u64 {
        self.good.get() + self.late.get() + self.dropped.get() + self.failed.get()
    }
    fn update_bad_rate(&mut self, now: Instant) {
        let ended = self.ended();
        let bad = ended - self.good.get();
        let (_, (e0, b0)) = self.window.push(now, (ended, bad), BAD_RATE_WINDOW);
        let n = ended - e0;
        self.bad_rate.set(if n == 0 {
            0.0
        } else {
            (bad - b0) as f64 / n as f64
        });
    }
}

/// A running frontend.
pub struct FrontendNode {
    addr: String,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<FrontendReport>>,
    shared: FrontendHandle,
    http: Option<super::http::HttpServer>,
}

impl FrontendNode {
    /// Starts and registers; returns once the scheduler acknowledged (or fails).
    pub fn start(transport: Arc<dyn Transport>, opts: FrontendOpts) -> Result<FrontendNode> {
        let region = Arc::new(Region::new(1, opts.region_bytes)?);
        let server = transport
            .serve_region(region.clone(), &opts.data_listen)
            .with_context(|| format!("cannot serve the input region at {}", opts.data_listen))?;
        let registry = Registry::new();
        let (tx, rx) = super::event_channel(&registry, "frontend");
        let listener = transport
            .listen(&opts.listen, tx.clone())
            .with_context(|| format!("cannot listen at {}", opts.listen))?;
        let sched = transport
            .connect(&opts.scheduler, tx)
            .with_context(|| format!("cannot reach the scheduler at {}", opts.scheduler))?;
        let clock = SchedClock::exact(Clock::new());
        let mut est = OffsetEstimator::new();
        // Clock sync, then register and wait for the ack.
        let sched_id = sched.id();
        let mut early = Vec::new();
        let t0 = Instant::now();
        let mut seq = 0;
        while est.samples() < 8 && t0.elapsed() < Duration::from_secs(2) {
            seq += 1;
            let _ = sched.send(Msg::Ping {
                seq,
                sent_ns: clock.local().now().0,
                ctrl_delay_ns: 0,
                pull_ns: 0,
            });
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Event::Msg(
                    c,
                    Msg::Pong {
                        echo_ns, sched_ns, ..
                    },
                )) if c == sched_id => {
                    est.add(Time(echo_ns), Time(sched_ns), clock.local().now(), &clock);
                }
                Ok(Event::Closed(c, r)) if c == sched_id => {
                    bail!("the scheduler closed the connection: {r}")
                }
                Ok(ev) => early.push(ev),
                Err(_) => {}
            }
        }
        if est.samples() == 0 {
            bail!("the scheduler at {} does not answer pings", opts.scheduler);
        }
        sched
            .send(Msg::Register {
                role: Role::Frontend,
                name: opts.name.clone(),
                gpus: Vec::new(),
                ctrl_addr: listener.local_addr(),
                region: Some(server.info()),
            })
            .map_err(|e| anyhow::anyhow!("cannot register: {e}"))?;
        let (node, models, hb) = loop {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(Event::Msg(
                    c,
                    Msg::RegisterAck {
                        node,
                        models,
                        heartbeat_ms,
                        ..
                    },
                )) if c == sched_id => break (node, models, heartbeat_ms),
                Ok(Event::Msg(c, Msg::Error { message })) if c == sched_id => {
                    bail!("the scheduler refused the frontend: {message}")
                }
                Ok(Event::Closed(c, r)) if c == sched_id => {
                    bail!("the scheduler closed the connection: {r}")
                }
                Ok(ev) => early.push(ev),
                Err(RecvTimeoutError::Timeout) => {
                    bail!("no registration answer from the scheduler in 5 s")
                }
                Err(RecvTimeoutError::Disconnected) => bail!("event channel closed"),
            }
        };
        // The GPUs in service follow the ack at once.
        let gpus = loop {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(Event::Msg(c, Msg::Capacity { gpus })) if c == sched_id => break gpus,
                Ok(Event::Closed(c, r)) if c == sched_id => {
                    bail!("the scheduler closed the connection: {r}")
                }
                Ok(ev) => early.push(ev),
                Err(_) => bail!("no capacity message from the scheduler in 5 s"),
            }
        };
        let (ltx, lrx) = bounded(LOCAL_MAX);
        let state = Arc::new(FrontendState {
            models: models.clone(),
            sched_ok: AtomicBool::new(true),
            gpus: AtomicU32::new(gpus),
            registry: registry.clone(),
            tx: ltx,
            local_full: registry.counter(
                "fermata_frontend_queue_full_total",
                "Requests refused (dropped, overloaded) because LOCAL_MAX requests were already waiting for the frontend's loop.",
                &[],
            ),
            stopped: AtomicBool::new(false),
        });
        let shared = FrontendHandle {
            state: state.clone(),
        };
        let stats = models
            .iter()
            .map(|m| ModelStats::new(&registry, &m.name))
            .collect();
        let bad_requests = registry.counter(
            "fermata_frontend_bad_requests_total",
            "Requests the frontend refused before admission (unknown model, bad SLO).",
            &[],
        );
        let pending_gauge = registry.gauge(
            "fermata_frontend_pending_requests",
            "Requests admitted and not yet answered.",
            &[],
        );
        let st = state.clone();
        registry.collector(
            "fermata_frontend_gpus_in_service",
            "GPUs in service as the scheduler last told this frontend.",
            crate::metrics::Kind::Gauge,
            move || vec![(vec![], st.gpus.load(Ordering::Relaxed) as f64)],
        );
        let st = state.clone();
        registry.collector(
            "fermata_frontend_scheduler_connected",
            "1 while the frontend has its scheduler.",
            crate::metrics::Kind::Gauge,
            move || vec![(vec![], if st.scheduler_connected() { 1.0 } else { 0.0 })],
        );
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let mut lp = Loop {
            by_name: models
                .iter()
                .enumerate()
                .map(|(i, m)| (m.name.clone(), i))
                .collect(),
            models,
            state,
            stats,
            bad_requests,
            pending_gauge,
            sched,
            sched_id,
            clock,
            est,
            region,
            clients: HashMap::new(),
            ledger: RequestLedger::new(node, Dur(opts.grace.as_nanos() as i64)),
            submit: Vec::new(),
            heartbeat: Duration::from_millis(hb.max(1) as u64),
            sched_timeout: opts.scheduler_timeout,
            last_pong: Instant::now(),
            report: FrontendReport::default(),
            _server: server,
            _listener: listener,
        };
        let handle = std::thread::Builder::new()
            .name("frontend".into())
            .spawn(move || {
                for ev in early {
                    lp.event(ev);
                }
                lp.run(rx, lrx, &stop2)
            })?;
        let mut node = FrontendNode {
            addr,
            stop,
            handle: Some(handle),
            shared,
            http: None,
        };
        if let Some(h) = &opts.http {
            node.http = Some(super::http::HttpServer::start_frontend(
                node.shared.clone(),
                h,
            )?);
        }
        Ok(node)
    }

    /// Where clients connect.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Where the HTTP API listens, when it was asked for.
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.http.as_ref().map(|h| h.addr())
    }

    /// A handle for in-process clients.
    pub fn handle(&self) -> FrontendHandle {
        self.shared.clone()
    }

    /// The frontend's metrics.
    pub fn metrics(&self) -> Arc<Registry> {
        self.shared.metrics()
    }

    pub fn stop(mut self) -> FrontendReport {
        // The HTTP server first: its requests in flight end through the loop.
        if let Some(h) = self.http.take() {
            h.stop();
        }
        self.stop.store(true, Ordering::Release);
        self.handle
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }

    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }
}

impl Drop for FrontendNode {
    fn drop(&mut self) {
        if let Some(h) = self.http.take() {
            h.stop();
        }
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

struct Loop {
    models: Vec<ModelInfo>,
    /// Model name -> index in `models`.
    by_name: HashMap<String, usize>,
    state: Arc<FrontendState>,
    stats: Vec<ModelStats>,
    bad_requests: Arc<Counter>,
    pending_gauge: Arc<Gauge>,
    sched: Arc<dyn Conn>,
    sched_id: ConnId,
    clock: SchedClock,
    est: OffsetEstimator,
    region: Arc<Region>,
    clients: HashMap<ConnId, Arc<dyn Conn>>,
    /// The pending requests (sans-IO): each ends exactly once.
    ledger: RequestLedger<Client>,
    submit: Vec<SubmitTask>,
    heartbeat: Duration,
    sched_timeout: Duration,
    last_pong: Instant,
    report: FrontendReport,
    _server: Box<dyn RegionServer>,
    _listener: Box<dyn Listener>,
}

impl Loop {
    /// The scheduler connection is up (only this loop clears it).
    fn sched_ok(&self) -> bool {
        self.state.sched_ok.load(Ordering::Relaxed)
    }

    fn run(
        mut self,
        rx: Receiver<Event>,
        lrx: Receiver<LocalInfer>,
        stop: &AtomicBool,
    ) -> FrontendReport {
        let mut next_ping = Instant::now();
        let mut next_stats = Instant::now();
        self.last_pong = Instant::now();
        let mut seq = 100u64;
        while !stop.load(Ordering::Acquire) {
            let wait = next_ping
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(20));
            // `lrx` never disconnects: the shared state keeps a sender.
            crossbeam_channel::select! {
                recv(rx) -> ev => match ev {
                    Ok(ev) => self.event(ev),
                    Err(_) => break,
                },
                recv(lrx) -> l => {
                    if let Ok(l) = l {
                        self.local(l);
                    }
                },
                default(wait) => {}
            }
            // A bounded batch, so submits, pings and sweeps keep their pace under
            // any load.
            for _ in 0..DRAIN_MAX {
                let mut got = false;
                if let Ok(ev) = rx.try_recv() {
                    self.event(ev);
                    got = true;
                }
                if let Ok(l) = lrx.try_recv() {
                    self.local(l);
                    got = true;
                }
                if !got {
                    break;
                }
            }
            self.flush_submit();
            let now = Instant::now();
            if self.sched_ok() && now >= next_ping {
                next_ping = now + self.heartbeat;
                seq += 1;
                let _ = self.sched.send(Msg::Ping {
                    seq,
                    sent_ns: self.clock.local().now().0,
                    ctrl_delay_ns: 0,
                    pull_ns: 0,
                });
            }
            if self.sched_ok() && now.duration_since(self.last_pong) > self.sched_timeout {
                self.sched.close("scheduler silent");
                self.scheduler_lost(format!("no pong for {:?}", self.sched_timeout));
            }
            self.sweep();
            if now >= next_stats {
                next_stats = now + Duration::from_secs(1);
                for m in &mut self.stats {
                    m.update_bad_rate(now);
                }
            }
            self.pending_gauge.set(self.ledger.len() as f64);
        }
        // Stop: refuse new local requests, then end every request still pending
        // (and any local one still queued) now.
        self.state.stopped.store(true, Ordering::Release);
        while let Ok(l) = lrx.try_recv() {
            self.local(l);
        }
        let now = self.clock.now();
        for f in self
            .ledger
            .fail_all(now, Ended::NoScheduler, "frontend stopping")
        {
            self.answer(f);
        }
        let _ = self.sched.send(Msg::Unregister {
            reason: "frontend stopping".into(),
        });
        self.sched.close("frontend stopping");
        let c = self.ledger.counts();
        self.report.good += c.good;
        self.report.late += c.late;
        self.report.dropped += c.dropped;
        self.report.failed += c.failed;
        self.report.timed_out += c.timed_out;
        self.report.stray_answers += c.stray_answers;
        self.report.clock_offset_us = self.clock.offset().as_us_f64();
        self.report.clock_error_us = self.clock.error_bound().as_us_f64();
        self.report
    }

    fn flush_submit(&mut self) {
        if self.submit.is_empty() {
            return;
        }
        let tasks = std::mem::take(&mut self.submit);
        for chunk in tasks.chunks(MAX_ITEMS) {
            if let Err(e) = self.sched.send(Msg::Submit {
                tasks: chunk.to_vec(),
            }) {
                for t in chunk {
                    let why = format!("cannot reach the scheduler: {e}");
                    self.finish(t.id, Answer::Failed(Ended::NoScheduler, why));
                }
            }
        }
    }

    fn scheduler_lost(&mut self, why: String) {
        if !self.sched_ok() {
            return;
        }
        self.state.sched_ok.store(false, Ordering::Release);
        tracing::error!(reason = %why, pending = self.ledger.len(), "frontend: lost the scheduler; failing every pending request");
        let now = self.clock.now();
        let why = format!("scheduler lost: {why}");
        for f in self.ledger.fail_all(now, Ended::NoScheduler, &why) {
            self.answer(f);
        }
    }

    fn sweep(&mut self) {
        let now = self.clock.now();
        if self.ledger.poll_timeout().is_some_and(|t| t <= now) {
            for f in self.ledger.handle_timeout(now) {
                self.answer(f);
            }
        }
    }

    /// Answers `client`.
    fn reply(&mut self, client: Client, done: InferDone) {
        match client {
            Client::Conn(c, req) => {
                if let Some(conn) = self.clients.get(&c) {
                    let _ = conn.send(Msg::InferReply {
                        req,
                        status: done.status,
                        latency_ns: done.latency.as_nanos() as i64,
                        queue_ns: done.queue.as_nanos() as i64,
                        batch_size: done.batch_size,
                        output: done.output,
                        message: done.message,
                    });
                }
            }
            // A client that went away (HTTP connection closed) is not waiting.
            Client::Local(tx) => {
                let _ = tx.send(done);
            }
        }
    }

    /// A request refused before admission (`model`: its index when it is known).
    fn refuse(
        &mut self,
        client: Client,
        received: Instant,
        model: Option<usize>,
        ended: Ended,
        why: String,
    ) {
        let st = model.map(|i| &self.stats[i]);
        let status = match ended {
            // Counted as dropped, not failed: a scheduling outcome.
            Ended::Dropped(_) => {
                self.report.dropped += 1;
                st.inspect(|s| s.dropped.inc());
                ReplyStatus::Dropped
            }
            _ => {
                self.report.failed += 1;
                st.inspect(|s| s.failed.inc());
                ReplyStatus::Failed
            }
        };
        if let Some(s) = st {
            s.latency.observe_duration(received.elapsed());
        }
        if ended == Ended::BadRequest {
            self.report.bad_requests += 1;
            self.bad_requests.inc();
        }
        let done = InferDone {
            ended,
            status,
            output: Vec::new(),
            message: why,
            latency: received.elapsed(),
            queue: Duration::ZERO,
            batch_size: 0,
        };
        self.reply(client, done);
    }

    /// Request `id` got its answer.
    fn finish(&mut self, id: u64, answer: Answer) {
        let now = self.clock.now();
        if let Some(f) = self.ledger.finish(now, id, answer) {
            self.answer(f);
        }
    }

    /// A request ended: its slot is free, its client answered, its stats counted.
    fn answer(&mut self, f: Finished<Client>) {
        self.region.release(f.input);
        let st = &self.stats[f.model];
        match f.ended {
            Ended::Good => st.good.inc(),
            Ended::Late => st.late.inc(),
            Ended::Dropped(_) => st.dropped.inc(),
            _ => st.failed.inc(),
        }
        if matches!(f.ended, Ended::Good | Ended::Late) {
            st.queue.observe(f.queue.0.max(0) as u64);
        }
        let latency = Duration::from_nanos(f.latency.0.max(0) as u64);
        st.latency.observe_duration(latency);
        let done = InferDone {
            ended: f.ended,
            status: f.ended.status(),
            output: f.output,
            message: f.message,
            latency,
            queue: Duration::from_nanos(f.queue.0.max(0) as u64),
            batch_size: f.batch_size,
        };
        self.reply(f.client, done);
    }

    fn local(&mut self, l: LocalInfer) {
        self.infer(Client::Local(l.reply), &l.model, l.slo_ns, l.input);
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Accepted(c) => {
                self.clients.insert(c.id(), c);
            }
            Event::Closed(c, reason) => {
                if c == self.sched_id {
                    self.scheduler_lost(reason);
                } else {
                    // A client or a backend left; pending answers for a client that
                    // left are dropped when they come.
                    self.clients.remove(&c);
                }
            }
            Event::Msg(c, msg) if c == self.sched_id => match msg {
                Msg::Pong {
                    echo_ns, sched_ns, ..
                } => {
                    self.last_pong = Instant::now();
                    let t2 = self.clock.local().now();
                    self.est.add(Time(echo_ns), Time(sched_ns), t2, &self.clock);
                }
                Msg::Dropped { items } => {
                    for (id, code) in items {
                        self.finish(id, Answer::of_drop(code));
                    }
                }
                Msg::Capacity { gpus } => {
                    tracing::info!(gpus, "frontend: GPUs in service changed");
                    self.state.gpus.store(gpus, Ordering::Release);
                }
                Msg::Error { message } => self.scheduler_lost(message),
                other => tracing::warn!(
                    kind = other.kind(),
                    "frontend: ignoring an unexpected message from the scheduler"
                ),
            },
            Event::Msg(c, msg) => match msg {
                Msg::Infer {
                    req,
                    model,
                    slo_ns,
                    input,
                } => self.infer(Client::Conn(c, req), &model, slo_ns, input),
                Msg::ListModels => {
                    if let Some(conn) = self.clients.get(&c) {
                        let _ = conn.send(Msg::Models {
                            models: self.models.clone(),
                        });
                    }
                }
                Msg::Results { items } => {
                    for r in items {
                        let id = r.id;
                        self.finish(id, Answer::of_result(r));
                    }
                }
                other => {
                    let why = format!("unexpected {} at a frontend", other.kind());
                    tracing::warn!(conn = c, reason = %why, "frontend: closing connection");
                    if let Some(conn) = self.clients.remove(&c) {
                        let _ = conn.send(Msg::Error {
                            message: why.clone(),
                        });
                        conn.close(&why);
                    }
                }
            },
        }
    }

    fn infer(&mut self, client: Client, model: &str, slo_ns: i64, input: Vec<u8>) {
        self.report.requests += 1;
        let received = Instant::now();
        if !self.sched_ok() {
            return self.refuse(
                client,
                received,
                self.by_name.get(model).copied(),
                Ended::NoScheduler,
                "no scheduler: the frontend lost it".into(),
            );
        }
        let Some(&mi) = self.by_name.get(model) else {
            let known: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
            let why = format!("unknown model `{model}` (served: {})", known.join(", "));
            return self.refuse(client, received, None, Ended::BadRequest, why);
        };
        let m = &self.models[mi];
        let slo = match check::slo(slo_ns, Dur(m.slo_ns)) {
            Ok(slo) => slo,
            Err(why) => return self.refuse(client, received, Some(mi), Ended::BadRequest, why),
        };
        if self.state.gpus.load(Ordering::Acquire) == 0 {
            let why = format!("no GPU in service: no backend can serve model `{model}` now");
            return self.refuse(
                client,
                received,
                Some(mi),
                Ended::Dropped(DropReason::NoGpu),
                why,
            );
        }
        let mid = m.id;
        let Some(r) = self.region.put(self.ledger.next_id(), &input) else {
            let why = format!(
                "input region full or input too large ({} bytes)",
                input.len()
            );
            return self.refuse(client, received, Some(mi), Ended::RegionFull, why);
        };
        let now = self.clock.now();
        let task = self.ledger.admit(now, mi, mid, slo, client, r);
        self.submit.push(task);
    }
}
