//! The frontend's event loop (thread `frontend`): one thread for the scheduler's
//! connection, the clients' connections, the backends' result pushes and the
//! in-process requests. It batches tasks into `Submit` messages, pings the
//! scheduler and notices when it is lost, sweeps requests past their deadline
//! plus grace, refreshes the per-model bad rates, and at stop ends every request
//! still pending and returns the [`FrontendReport`]. Admission and answers are in
//! `requests.rs`.

use super::handle::{FrontendState, LocalInfer};
use super::metrics::{LoopMetrics, ModelStats};
use super::options::FrontendOpts;
use super::register::{ping, Registered};
use super::report::FrontendReport;
use super::requests::Client;
use super::Ended;
use crate::core::Dur;
use crate::metrics::{Counter, Gauge};
use crate::node::clock::{moved, OffsetEstimator, SchedClock};
use crate::node::proto::ledger::{Answer, RequestLedger};
use crate::node::proto::sched::MARGIN_FLOOR;
use crate::transport::{Conn, ConnId, Event, Listener, Region, RegionServer};
use crate::wire::{ModelInfo, Msg, SubmitTask, MAX_ITEMS, NET_QUANTILE};
use crossbeam_channel::Receiver;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most events handled between two submits to the scheduler.
const DRAIN_MAX: usize = 64;
/// A model's response margin is reported once this many samples are kept.
pub const MARGIN_SAMPLES_MIN: usize = 32;

/// The frontend's connections and region, for its loop.
pub(super) struct Links {
    pub(super) sched: Arc<dyn Conn>,
    pub(super) clock: SchedClock,
    pub(super) region: Arc<Region>,
    pub(super) server: Box<dyn RegionServer>,
    pub(super) listener: Box<dyn Listener>,
}

pub(super) struct Loop {
    pub(super) models: Vec<ModelInfo>,
    /// Model name -> index in `models`.
    pub(super) by_name: HashMap<String, usize>,
    pub(super) state: Arc<FrontendState>,
    pub(super) stats: Vec<ModelStats>,
    pub(super) bad_requests: Arc<Counter>,
    pending_gauge: Arc<Gauge>,
    sched: Arc<dyn Conn>,
    sched_id: ConnId,
    pub(super) clock: SchedClock,
    est: OffsetEstimator,
    pub(super) region: Arc<Region>,
    pub(super) clients: HashMap<ConnId, Arc<dyn Conn>>,
    /// The pending requests (sans-IO): each ends exactly once.
    pub(super) ledger: RequestLedger<Client>,
    pub(super) submit: Vec<SubmitTask>,
    heartbeat: Duration,
    sched_timeout: Duration,
    last_pong: Instant,
    /// The response margins last reported to the scheduler, per model.
    margins_sent: Vec<Dur>,
    pub(super) report: FrontendReport,
    _server: Box<dyn RegionServer>,
    _listener: Box<dyn Listener>,
}

impl Loop {
    pub(super) fn new(
        state: Arc<FrontendState>,
        reg: Registered,
        metrics: LoopMetrics,
        links: Links,
        opts: &FrontendOpts,
    ) -> Loop {
        let nm = reg.models.len();
        Loop {
            by_name: reg
                .models
                .iter()
                .enumerate()
                .map(|(i, m)| (m.name.clone(), i))
                .collect(),
            models: reg.models,
            state,
            stats: metrics.stats,
            bad_requests: metrics.bad_requests,
            pending_gauge: metrics.pending,
            sched_id: links.sched.id(),
            sched: links.sched,
            clock: links.clock,
            est: reg.est,
            region: links.region,
            clients: HashMap::new(),
            ledger: RequestLedger::new(reg.node, Dur(opts.grace.as_nanos() as i64)),
            submit: Vec::new(),
            heartbeat: Duration::from_millis(reg.heartbeat_ms.max(1) as u64),
            sched_timeout: opts.scheduler_timeout,
            last_pong: Instant::now(),
            margins_sent: vec![Dur::ZERO; nm],
            report: FrontendReport::default(),
            _server: links.server,
            _listener: links.listener,
        }
    }

    /// Runs the loop on its own thread: the `early` events first, then until
    /// `stop`.
    pub(super) fn spawn(
        mut self,
        early: Vec<Event>,
        rx: Receiver<Event>,
        lrx: Receiver<LocalInfer>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<FrontendReport>> {
        std::thread::Builder::new()
            .name("frontend".into())
            .spawn(move || {
                for ev in early {
                    self.event(ev);
                }
                self.run(rx, lrx, &stop)
            })
    }

    /// The scheduler connection is up (only this loop clears it).
    pub(super) fn sched_ok(&self) -> bool {
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
            if !self.receive(&rx, &lrx, wait) {
                break;
            }
            self.drain(&rx, &lrx);
            self.flush_submit();
            let now = Instant::now();
            self.heartbeat(now, &mut next_ping, &mut seq);
            self.sweep();
            if now >= next_stats {
                next_stats = now + Duration::from_secs(1);
                for m in &mut self.stats {
                    m.update_bad_rate(now);
                }
                self.report_margins();
            }
            self.pending_gauge.set(self.ledger.len() as f64);
        }
        self.shutdown(&lrx)
    }

    /// Waits up to `wait` for an event or an in-process request and handles it;
    /// false when the event channel is closed.
    fn receive(
        &mut self,
        rx: &Receiver<Event>,
        lrx: &Receiver<LocalInfer>,
        wait: Duration,
    ) -> bool {
        // `lrx` never disconnects: the shared state keeps a sender.
        crossbeam_channel::select! {
            recv(rx) -> ev => match ev {
                Ok(ev) => self.event(ev),
                Err(_) => return false,
            },
            recv(lrx) -> l => {
                if let Ok(l) = l {
                    self.local(l);
                }
            },
            default(wait) => {}
        }
        true
    }

    /// A bounded batch, so submits, pings and sweeps keep their pace under any
    /// load.
    fn drain(&mut self, rx: &Receiver<Event>, lrx: &Receiver<LocalInfer>) {
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
    }

    /// Pings the scheduler when due; gives it up when it has been silent too long.
    fn heartbeat(&mut self, now: Instant, next_ping: &mut Instant, seq: &mut u64) {
        if self.sched_ok() && now >= *next_ping {
            *next_ping = now + self.heartbeat;
            *seq += 1;
            let _ = self.sched.send(ping(&self.clock, *seq));
        }
        if self.sched_ok() && now.duration_since(self.last_pong) > self.sched_timeout {
            self.sched.close("scheduler silent");
            self.scheduler_lost(format!("no pong for {:?}", self.sched_timeout));
        }
    }

    /// Tells the scheduler the models' response margins (the tail of what the
    /// clients recorded, stall-robust) that moved by more than 10% (or 20 us)
    /// since they were last told.
    fn report_margins(&mut self) {
        let mut items = Vec::new();
        for (i, m) in self.state.margins.iter().enumerate() {
            let tail = {
                let d = m.lock().expect("margins lock");
                if d.len() < MARGIN_SAMPLES_MIN {
                    continue;
                }
                Dur(d.tail(NET_QUANTILE))
            };
            let last = self.margins_sent[i];
            if moved(tail, last, MARGIN_FLOOR) {
                self.margins_sent[i] = tail;
                items.push((self.models[i].id, tail));
            }
        }
        self.report.margin_max_us = self
            .margins_sent
            .iter()
            .map(|d| d.as_us_f64())
            .fold(0.0, f64::max);
        if !items.is_empty() && self.sched_ok() {
            let _ = self.sched.send(Msg::Margins { items });
        }
    }

    /// Stop: refuse new local requests, then end every request still pending
    /// (and any local one still queued) now.
    fn shutdown(mut self, lrx: &Receiver<LocalInfer>) -> FrontendReport {
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

    pub(super) fn flush_submit(&mut self) {
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

    pub(super) fn event(&mut self, ev: Event) {
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
            Event::Msg(c, msg) if c == self.sched_id => self.sched_msg(msg),
            Event::Msg(c, msg) => self.client_msg(c, msg),
        }
    }

    /// A message from the scheduler.
    fn sched_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Pong { echo, sched, .. } => {
                self.last_pong = Instant::now();
                let t2 = self.clock.local().now();
                self.est.add(echo, sched, t2, &self.clock);
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
        }
    }

    /// A message from a client or a backend on connection `c`.
    fn client_msg(&mut self, c: ConnId, msg: Msg) {
        match msg {
            Msg::Infer {
                req,
                model,
                slo,
                input,
            } => self.infer(Client::Conn(c, req), &model, slo, input, Instant::now()),
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
        }
    }
}
