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

use super::clock::{OffsetEstimator, SchedClock};
use super::scheduler::TASK_SEQ_BITS;
use crate::core::{Dur, Time};
use crate::runtime::clock::Clock;
use crate::transport::{Conn, ConnId, Event, InputRef, Listener, Region, RegionServer, Transport};
use crate::wire::{
    DropCode, ModelInfo, Msg, NodeId, ReplyStatus, Role, SubmitTask, TaskStatus, MAX_ITEMS,
};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most events handled between two submits to the scheduler.
const DRAIN_MAX: usize = 64;

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

struct Pending {
    client: ConnId,
    req: u64,
    received: Instant,
    arrival: Time,
    deadline: Time,
    input: InputRef,
}

/// A running frontend.
pub struct FrontendNode {
    addr: String,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<FrontendReport>>,
}

impl FrontendNode {
    /// Starts and registers; returns once the scheduler acknowledged (or fails).
    pub fn start(transport: Arc<dyn Transport>, opts: FrontendOpts) -> Result<FrontendNode> {
        let region = Arc::new(Region::new(1, opts.region_bytes)?);
        let server = transport
            .serve_region(region.clone(), &opts.data_listen)
            .with_context(|| format!("cannot serve the input region at {}", opts.data_listen))?;
        let (tx, rx) = unbounded();
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
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let mut lp = Loop {
            node,
            by_name: models.iter().map(|m| (m.name.clone(), m.clone())).collect(),
            models,
            sched,
            sched_id,
            clock,
            est,
            region,
            clients: HashMap::new(),
            pending: HashMap::new(),
            timeouts: BinaryHeap::new(),
            submit: Vec::new(),
            next_seq: 0,
            grace: opts.grace,
            heartbeat: Duration::from_millis(hb.max(1) as u64),
            sched_timeout: opts.scheduler_timeout,
            sched_ok: true,
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
                lp.run(rx, &stop2)
            })?;
        Ok(FrontendNode {
            addr,
            stop,
            handle: Some(handle),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn stop(mut self) -> FrontendReport {
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
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

struct Loop {
    node: NodeId,
    models: Vec<ModelInfo>,
    by_name: HashMap<String, ModelInfo>,
    sched: Arc<dyn Conn>,
    sched_id: ConnId,
    clock: SchedClock,
    est: OffsetEstimator,
    region: Arc<Region>,
    clients: HashMap<ConnId, Arc<dyn Conn>>,
    pending: HashMap<u64, Pending>,
    /// (deadline + grace, task) for the last-resort sweep.
    timeouts: BinaryHeap<Reverse<(i64, u64)>>,
    submit: Vec<SubmitTask>,
    next_seq: u64,
    grace: Duration,
    heartbeat: Duration,
    sched_timeout: Duration,
    sched_ok: bool,
    last_pong: Instant,
    report: FrontendReport,
    _server: Box<dyn RegionServer>,
    _listener: Box<dyn Listener>,
}

impl Loop {
    fn run(mut self, rx: Receiver<Event>, stop: &AtomicBool) -> FrontendReport {
        let mut next_ping = Instant::now();
        self.last_pong = Instant::now();
        let mut seq = 100u64;
        while !stop.load(Ordering::Acquire) {
            let wait = next_ping
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(20));
            match rx.recv_timeout(wait) {
                Ok(ev) => {
                    // A bounded batch, so submits, pings and sweeps keep their pace
                    // under any load.
                    self.event(ev);
                    for _ in 0..DRAIN_MAX {
                        match rx.try_recv() {
                            Ok(ev) => self.event(ev),
                            Err(_) => break,
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.flush_submit();
            let now = Instant::now();
            if self.sched_ok && now >= next_ping {
                next_ping = now + self.heartbeat;
                seq += 1;
                let _ = self.sched.send(Msg::Ping {
                    seq,
                    sent_ns: self.clock.local().now().0,
                    ctrl_delay_ns: 0,
                    pull_ns: 0,
                });
            }
            if self.sched_ok && now.duration_since(self.last_pong) > self.sched_timeout {
                self.sched.close("scheduler silent");
                self.scheduler_lost(format!("no pong for {:?}", self.sched_timeout));
            }
            self.sweep();
        }
        // Stop: every request still pending ends now.
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            self.finish(id, Outcome::Failed("frontend stopping".into()));
        }
        let _ = self.sched.send(Msg::Unregister {
            reason: "frontend stopping".into(),
        });
        self.sched.close("frontend stopping");
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
                    self.finish(
                        t.id,
                        Outcome::Failed(format!("cannot reach the scheduler: {e}")),
                    );
                }
            }
        }
    }

    fn scheduler_lost(&mut self, why: String) {
        if !self.sched_ok {
            return;
        }
        self.sched_ok = false;
        eprintln!("fermata frontend: lost the scheduler ({why}); failing every pending request");
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            self.finish(id, Outcome::Failed(format!("scheduler lost: {why}")));
        }
    }

    fn sweep(&mut self) {
        let now = self.clock.now().0;
        while let Some(&Reverse((t, id))) = self.timeouts.peek() {
            if t > now {
                break;
            }
            self.timeouts.pop();
            if self.pending.contains_key(&id) {
                self.report.timed_out += 1;
                self.finish(
                    id,
                    Outcome::Failed("no result by the deadline plus grace".into()),
                );
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reply(
        &mut self,
        client: ConnId,
        req: u64,
        status: ReplyStatus,
        latency: Duration,
        ran: Ran,
        output: Vec<u8>,
        message: String,
    ) {
        if let Some(c) = self.clients.get(&client) {
            let _ = c.send(Msg::InferReply {
                req,
                status,
                latency_ns: latency.as_nanos() as i64,
                queue_ns: ran.queue_ns,
                batch_size: ran.batch_size,
                output,
                message,
            });
        }
    }

    fn finish(&mut self, id: u64, out: Outcome) {
        let Some(p) = self.pending.remove(&id) else {
            self.report.stray_answers += 1;
            return;
        };
        self.region.release(p.input);
        let lat = p.received.elapsed();
        let mut ran = Ran::default();
        let (status, output, msg) = match out {
            Outcome::Output(o, r) => {
                ran = r;
                ran.queue_ns = (ran.queue_ns - p.arrival.0).max(0);
                if self.clock.now() <= p.deadline {
                    self.report.good += 1;
                    (ReplyStatus::Good, o, String::new())
                } else {
                    self.report.late += 1;
                    (
                        ReplyStatus::Late,
                        o,
                        "result arrived after the deadline".into(),
                    )
                }
            }
            Outcome::Dropped(code) => {
                self.report.dropped += 1;
                (
                    ReplyStatus::Dropped,
                    Vec::new(),
                    format!("dropped by the scheduler: {code:?}"),
                )
            }
            Outcome::Failed(why) => {
                self.report.failed += 1;
                (ReplyStatus::Failed, Vec::new(), why)
            }
        };
        self.reply(p.client, p.req, status, lat, ran, output, msg);
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
                        let out = match code {
                            // Lost with its backend: an explicit failure, not a
                            // scheduling decision.
                            DropCode::BackendLost => {
                                Outcome::Failed("the backend running it was lost".into())
                            }
                            c => Outcome::Dropped(c),
                        };
                        self.finish(id, out);
                    }
                }
                Msg::Error { message } => self.scheduler_lost(message),
                other => eprintln!(
                    "fermata frontend: ignoring unexpected {} from the scheduler",
                    other.kind()
                ),
            },
            Event::Msg(c, msg) => match msg {
                Msg::Infer {
                    req,
                    model,
                    slo_ns,
                    input,
                } => self.infer(c, req, &model, slo_ns, input),
                Msg::ListModels => {
                    if let Some(conn) = self.clients.get(&c) {
                        let _ = conn.send(Msg::Models {
                            models: self.models.clone(),
                        });
                    }
                }
                Msg::Results { items } => {
                    for r in items {
                        let out = match r.status {
                            TaskStatus::Ok => Outcome::Output(
                                r.output,
                                Ran {
                                    queue_ns: r.started_ns,
                                    batch_size: r.batch_size,
                                },
                            ),
                            TaskStatus::Dropped(code) => Outcome::Dropped(code),
                            TaskStatus::InputMissing => {
                                Outcome::Failed("the backend could not read the input".into())
                            }
                            TaskStatus::Failed => {
                                Outcome::Failed("the backend failed to run the batch".into())
                            }
                        };
                        self.finish(r.id, out);
                    }
                }
                other => {
                    let why = format!("unexpected {} at a frontend", other.kind());
                    eprintln!("fermata frontend: closing connection {c}: {why}");
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

    fn infer(&mut self, c: ConnId, req: u64, model: &str, slo_ns: i64, input: Vec<u8>) {
        self.report.requests += 1;
        let received = Instant::now();
        let bad = |s: &mut Self, why: String| {
            s.report.bad_requests += 1;
            s.report.failed += 1;
            s.reply(
                c,
                req,
                ReplyStatus::Failed,
                received.elapsed(),
                Ran::default(),
                Vec::new(),
                why,
            );
        };
        if !self.sched_ok {
            return bad(self, "no scheduler: the frontend lost it".into());
        }
        let Some(m) = self.by_name.get(model) else {
            let known: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
            return bad(
                self,
                format!("unknown model `{model}` (served: {})", known.join(", ")),
            );
        };
        if slo_ns < 0 {
            return bad(
                self,
                format!("slo_ns must be >= 0 (0 = the model's default), got {slo_ns}"),
            );
        }
        let slo = if slo_ns == 0 { m.slo_ns } else { slo_ns };
        let mid = m.id;
        self.next_seq += 1;
        let id =
            ((self.node as u64) << TASK_SEQ_BITS) | (self.next_seq & ((1 << TASK_SEQ_BITS) - 1));
        let Some(r) = self.region.put(id, &input) else {
            return bad(
                self,
                format!(
                    "input region full or input too large ({} bytes)",
                    input.len()
                ),
            );
        };
        let arrival = self.clock.now();
        let deadline = arrival + Dur(slo);
        self.pending.insert(
            id,
            Pending {
                client: c,
                req,
                received,
                arrival,
                deadline,
                input: r,
            },
        );
        self.timeouts.push(Reverse((
            (deadline + Dur(self.grace.as_nanos() as i64)).0,
            id,
        )));
        self.submit.push(SubmitTask {
            id,
            model: mid,
            arrival_ns: arrival.0,
            deadline_ns: deadline.0,
            input: r.pack(),
        });
    }
}

/// How a task ran: its batch's size, and (first the batch's start time, then) its
/// queuing delay.
#[derive(Default, Clone, Copy)]
struct Ran {
    queue_ns: i64,
    batch_size: u32,
}

enum Outcome {
    Output(Vec<u8>, Ran),
    Dropped(DropCode),
    Failed(String),
}
