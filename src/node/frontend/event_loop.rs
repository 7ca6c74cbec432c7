//! The frontend's event loop (thread `frontend`): one thread for the scheduler's
//! connection, the clients' connections, the backends' result pushes and the
//! in-process requests. It batches tasks into `Submit` messages, drives the
//! membership ([`Member`]: heartbeats, and rejoining when the scheduler is
//! lost), sweeps requests past their deadline
//! plus grace, refreshes the per-model bad rates, and at stop ends every request
//! still pending and returns the [`FrontendReport`]. Admission and answers are in
//! `requests.rs`.

use super::handle::{FrontendState, LocalInfer};
use super::metrics::{LoopMetrics, ModelStats};
use super::options::FrontendOpts;
use super::register::{carry, Registered};
use super::report::FrontendReport;
use super::requests::Client;
use super::Ended;
use crate::core::Dur;
use crate::metrics::{Counter, Gauge};
use crate::node::clock::{moved, RiseFilter, SchedClock};
use crate::node::proto::ledger::{Answer, Orphan, RequestLedger};
use crate::node::proto::member::{self, Member};
use crate::node::proto::sched::MARGIN_FLOOR;
use crate::transport::{
    CapSource, Conn, ConnId, Event, EventTx, Listener, Region, RegionServer, Transport,
};
use crate::wire::{AppCounters, ModelInfo, Msg, SubmitTask, MAX_ITEMS, NET_QUANTILE};
use crossbeam_channel::Receiver;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most requests admitted between two submits to the scheduler.
const DRAIN_MAX: usize = 64;

/// Most wire clients' requests read off the event channel and waiting for
/// admission ([`Loop::waiting`]); past it the channel is left to fill, and
/// its senders wait (a connection's reader stops reading). In-process
/// requests wait in their own channel (`LOCAL_MAX`).
const WAITING_MAX: usize = crate::transport::EVENTS_MAX / 4;

/// At stop, at most this many events still queued are handled (their
/// requests answered) before the connections close.
const STOP_DRAIN_MAX: usize = 65_536;
/// A model's response margin is reported once this many samples are kept.
pub const MARGIN_SAMPLES_MIN: usize = 32;

/// How often a frontend sends its applications' counters to the scheduler:
/// twice per re-planning epoch (at most once a second), so the sums a
/// re-plan reads are at most half an epoch old; once a second without
/// re-planning (the others' re-planners count this frontend's requests too).
fn apps_report_every(opts: &FrontendOpts) -> Duration {
    let second = Duration::from_secs(1);
    opts.replan
        .as_ref()
        .map_or(second, |r| (r.every / 2).min(second))
        .max(Duration::from_millis(50))
}

/// The frontend's connections and region, for its loop.
pub(super) struct Links {
    /// To reconnect to the scheduler when it is lost.
    pub(super) transport: Arc<dyn Transport>,
    pub(super) events: EventTx,
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
    pub(super) bad_requests: Counter,
    pending_gauge: Gauge,
    held_gauge: Gauge,
    /// From a request's hand-over (or read) to its admission.
    pub(super) loop_wait: Arc<crate::metrics::Histogram>,
    /// The membership (heartbeats, rejoining) and the scheduler's connection
    /// (the last one opened).
    member: Member,
    pub(super) sched: Arc<dyn Conn>,
    sched_id: ConnId,
    transport: Arc<dyn Transport>,
    events: EventTx,
    pub(super) clock: SchedClock,
    pub(super) region: Arc<Region>,
    /// Each task's read capability (docs/security.md).
    pub(super) caps: CapSource,
    pub(super) clients: HashMap<ConnId, Arc<dyn Conn>>,
    /// The pending requests (sans-IO): each ends exactly once.
    pub(super) ledger: RequestLedger<Client>,
    /// Requests pending when the scheduler was lost or taken while it was,
    /// held for the next one (with their arrival and deadline on this host's
    /// clock).
    orphans: Vec<(Orphan<Client>, Instant, Instant)>,
    /// The scheduler was lost and no scheduler has had GPUs in service for
    /// this frontend since: new requests are held with the orphans.
    pub(super) away: bool,
    pub(super) submit: Vec<SubmitTask>,
    /// The response margins last reported to the scheduler, per model.
    margins_sent: Vec<Dur>,
    /// Per model: its margin rises on two readings in a row only.
    margins_filter: Vec<RiseFilter>,
    /// Wire clients' requests (`Msg::Infer`) read off the event channel, not
    /// yet admitted, in their order of arrival, each with when it was read
    /// (see [`Loop::drain`]).
    waiting: VecDeque<(ConnId, Msg, Instant)>,
    /// Per model: its latency at batch 1 (its profile's l(1)), the least
    /// time any answer takes.
    pub(super) need: Vec<Dur>,
    pub(super) report: FrontendReport,
    /// How often the applications' counters go to the scheduler, and when
    /// next.
    apps_every: Duration,
    next_apps: Instant,
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
        let need = reg
            .models
            .iter()
            .map(|m| crate::node::exec::least_latency(&m.profile))
            .collect();
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
            held_gauge: metrics.held,
            loop_wait: metrics.loop_wait,
            sched_id: reg.sched.id(),
            sched: reg.sched,
            member: reg.member,
            transport: links.transport,
            events: links.events,
            clock: links.clock,
            region: links.region,
            caps: CapSource::new(),
            clients: HashMap::new(),
            ledger: RequestLedger::new(reg.node, Dur(opts.grace.as_nanos() as i64)),
            orphans: Vec::new(),
            away: false,
            submit: Vec::new(),
            margins_sent: vec![Dur::ZERO; nm],
            margins_filter: vec![RiseFilter::default(); nm],
            waiting: VecDeque::new(),
            need,
            report: FrontendReport::default(),
            apps_every: apps_report_every(opts),
            next_apps: Instant::now(),
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
        let mut next_stats = Instant::now();
        let local = self.clock.local();
        while !stop.load(Ordering::Acquire) {
            let wait = if self.waiting.is_empty() && lrx.is_empty() {
                (self.member.poll_timeout() - local.now()).clamp(Dur::ZERO, Dur::from_ms(20))
            } else {
                Dur::ZERO
            };
            if !self.receive(&rx, &lrx, Duration::from_nanos(wait.0 as u64)) {
                break;
            }
            self.drain(&rx);
            self.admit_waiting(&lrx, DRAIN_MAX);
            self.flush_submit();
            let now = Instant::now();
            let t = local.now();
            if t >= self.member.poll_timeout() {
                self.member.handle_timeout(t);
            }
            self.apply_member();
            self.sweep();
            self.control_requests();
            if now >= next_stats {
                next_stats = now + Duration::from_secs(1);
                for m in &mut self.stats {
                    m.update_bad_ratio(now);
                }
                self.report_margins();
            }
            if now >= self.next_apps {
                self.next_apps = now + self.apps_every;
                self.report_apps();
            }
            self.pending_gauge
                .set((self.ledger.len() + self.orphans.len()) as f64);
            self.held_gauge.set(self.orphans.len() as f64);
        }
        self.shutdown(&rx, &lrx)
    }

    /// Waits up to `wait` for an event (taken, [`Loop::take`]) or an
    /// in-process request (admitted); false when the event channel is closed.
    fn receive(
        &mut self,
        rx: &Receiver<Event>,
        lrx: &Receiver<LocalInfer>,
        wait: Duration,
    ) -> bool {
        if self.waiting.len() >= WAITING_MAX {
            return true;
        }
        // `lrx` never disconnects: the shared state keeps a sender.
        crossbeam_channel::select! {
            recv(rx) -> ev => match ev {
                Ok(ev) => self.take(ev),
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

    /// Takes everything queued on the event channel, as long as fewer than
    /// [`WAITING_MAX`] requests wait: the scheduler's messages and the
    /// backends' results are handled now, wire clients' requests join
    /// [`Loop::waiting`] (in-process ones stay in their channel).
    ///
    /// Answers never wait behind requests. Admitting a request copies its
    /// input into the region; a loop that fell behind on those copies (588 KiB
    /// images at thousands a second, on a starved or memory-starved host)
    /// would also answer late, so every request would hold its slot longer,
    /// the region's use would grow into pages never touched before (a first
    /// touch costs a fault and the page's zeroing, far more than the copy),
    /// the loop would fall further behind, and the region would fill.
    fn drain(&mut self, rx: &Receiver<Event>) {
        while self.waiting.len() < WAITING_MAX {
            match rx.try_recv() {
                Ok(ev) => self.take(ev),
                Err(_) => break,
            }
        }
    }

    /// A client's request waits for admission, read now; any other event is
    /// handled.
    fn take(&mut self, ev: Event) {
        match ev {
            Event::Msg(c, msg @ Msg::Infer { .. }) if c != self.sched_id => {
                self.waiting.push_back((c, msg, Instant::now()));
            }
            ev => self.event(ev),
        }
    }

    /// Admits (or refuses) up to `n` waiting requests, wire and in-process
    /// in turn, each source oldest first.
    fn admit_waiting(&mut self, lrx: &Receiver<LocalInfer>, n: usize) {
        let mut done = 0;
        while done < n {
            let before = done;
            if let Some((c, msg, read)) = self.waiting.pop_front() {
                self.client_infer(c, msg, read);
                done += 1;
            }
            if let Ok(l) = lrx.try_recv() {
                self.local(l);
                done += 1;
            }
            if done == before {
                break;
            }
        }
    }

    /// Carries out what the membership asked for: pings and the register on
    /// the scheduler's connection, the clock, a new connection after a loss,
    /// and the frontend's service state as it leaves and rejoins.
    fn apply_member(&mut self) {
        while let Some(a) = self.member.poll_action() {
            let Some(a) = carry(a, &*self.sched, &self.clock) else {
                continue;
            };
            match a {
                member::Action::Connect(addr) => {
                    let now = self.clock.local().now();
                    match self.transport.connect(&addr, self.events.clone()) {
                        Ok(c) => {
                            self.sched_id = c.id();
                            self.sched = c;
                            self.member.handle_connected(now, self.sched_id);
                        }
                        Err(e) => self.member.handle_connect_failed(now, &format!("{e:#}")),
                    }
                }
                member::Action::Joined {
                    node, models, away, ..
                } => self.rejoined(node, &models, away),
                member::Action::Lost(why) => self.scheduler_lost(why),
                // Carried out above.
                member::Action::Send(..)
                | member::Action::Close(..)
                | member::Action::SetClock { .. } => {}
            }
        }
    }

    /// In service again after `away` (None: the first join, handled at start).
    fn rejoined(&mut self, node: crate::wire::NodeId, models: &[ModelInfo], away: Option<Dur>) {
        let Some(away) = away else {
            return;
        };
        let same = models.len() == self.models.len()
            && models
                .iter()
                .zip(&self.models)
                .all(|(a, b)| a.id == b.id && a.name == b.name);
        if !same {
            // Requests are admitted by this frontend's model list: a scheduler
            // serving others cannot be served through it.
            let now = self.clock.local().now();
            self.member.leave(
                now,
                "the scheduler serves other models than when this frontend started (restart it)",
            );
            return;
        }
        self.ledger.set_node(node);
        self.state.rejoins.fetch_add(1, Ordering::Relaxed);
        self.state.sched_ok.store(true, Ordering::Release);
        self.ask_open_again();
        // The held requests go to it once it has GPUs in service (`Capacity`).
        tracing::info!(
            node,
            away_ms = away.as_ms_f64(),
            "frontend: back in service with the scheduler"
        );
    }

    /// Tells the scheduler the models' response margins (the tail of what the
    /// clients recorded, stall-robust, rising only on two readings in a row:
    /// [`RiseFilter`]) that moved by more than 10% (or 20 us) since they were
    /// last told.
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
            let Some(tail) = self.margins_filter[i].next(tail) else {
                continue;
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

    /// Sends the scheduler each application's counters; it answers with the
    /// sums over every frontend that serves the application
    /// ([`Msg::AppTotals`]), which the re-planner plans on.
    fn report_apps(&mut self) {
        if !self.sched_ok() {
            return;
        }
        for a in &self.state.apps {
            let _ = self.sched.send(Msg::AppCounts {
                counters: a.counters(),
            });
        }
    }

    /// The scheduler's sums of an application's counters.
    fn app_totals(&mut self, counters: AppCounters, frontends: u32) {
        let Some(a) = self.state.apps.iter().find(|a| a.meta.name == counters.app) else {
            return tracing::warn!(
                app = %counters.app,
                "frontend: the scheduler sent the sums of an application this frontend does not serve"
            );
        };
        if let Err(e) = a.take_totals(counters, frontends, Instant::now()) {
            tracing::warn!(error = %e, "frontend: the scheduler's sums of an application refused");
        }
    }

    /// Stop: refuse new local requests, then end every request still pending
    /// (and any local one still queued, and what clients sent before the stop
    /// that the loop had not read yet) now: every request that reached this
    /// frontend gets its answer before its connection closes.
    fn shutdown(mut self, rx: &Receiver<Event>, lrx: &Receiver<LocalInfer>) -> FrontendReport {
        self.state.stopped.store(true, Ordering::Release);
        self.admit_waiting(lrx, usize::MAX);
        while let Ok(l) = lrx.try_recv() {
            self.local(l);
        }
        // Bounded: a client that floods does not hold the stop.
        for _ in 0..STOP_DRAIN_MAX {
            match rx.try_recv() {
                Ok(ev) => self.event(ev),
                Err(_) => break,
            }
        }
        let now = self.clock.now();
        for f in self
            .ledger
            .fail_all(now, Ended::NoScheduler, "frontend stopping")
        {
            self.answer(f);
        }
        for (o, arrival, _) in std::mem::take(&mut self.orphans) {
            let lat = Dur::from_std(arrival.elapsed());
            let f = self
                .ledger
                .end_orphan(o, Ended::NoScheduler, "frontend stopping", lat);
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
        self.report.rejoins = self.state.rejoins.load(Ordering::Relaxed);
        self.report.stray_answers += c.stray_answers;
        self.report.forged_results += c.forged_results;
        self.report.retried += c.retried;
        self.report.clock_offset_us = self.clock.offset().as_us_f64();
        self.report.clock_error_us = self.clock.error_bound().as_us_f64();
        self.report.input_bytes_stored = self.region.bytes_stored();
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

    /// The scheduler is lost: the pending requests (those not yet submitted
    /// too), and those that come until a scheduler has GPUs in service again,
    /// are held for the next scheduler, on this host's clock, and end as
    /// failed if their deadline passes first ([`Loop::sweep`]).
    fn scheduler_lost(&mut self, why: String) {
        self.state.sched_ok.store(false, Ordering::Release);
        self.state.gpus.store(0, Ordering::Release);
        self.away = true;
        self.submit.clear();
        tracing::warn!(reason = %why, pending = self.ledger.len(), "frontend: lost the scheduler; holding the pending requests for the next one and rejoining");
        for o in self.ledger.orphan_all() {
            let (a, d) = (
                self.clock.instant_of(o.arrival),
                self.clock.instant_of(o.deadline),
            );
            self.orphans.push((o, a, d));
        }
    }

    /// Holds request `o` (its arrival and deadline on this host's clock)
    /// for the next scheduler with GPUs in service.
    pub(super) fn hold(&mut self, o: Orphan<Client>, arrival: Instant, deadline: Instant) {
        self.orphans.push((o, arrival, deadline));
    }

    /// Back with a scheduler that has GPUs in service: the frontend is no
    /// longer away, and each held request whose deadline has not passed is
    /// submitted again under a new task id (its slot retagged), with its
    /// arrival and deadline on the new scheduler's clock.
    fn readmit_orphans(&mut self) {
        if !self.sched_ok() {
            return;
        }
        self.away = false;
        if self.orphans.is_empty() {
            return;
        }
        let (now_t, now_i) = (self.clock.now(), Instant::now());
        let n = self.orphans.len();
        for (o, arrival, deadline) in std::mem::take(&mut self.orphans) {
            if deadline <= now_i {
                let f = self.ledger.end_orphan(
                    o,
                    Ended::NoScheduler,
                    "no scheduler until its deadline",
                    Dur::from_std(arrival.elapsed()),
                );
                self.answer(f);
                continue;
            }
            let model_id = self.models[o.model].id;
            let arrival = now_t - Dur::from_std(arrival.elapsed());
            let deadline = now_t + Dur::from_std(deadline - now_i);
            self.region.retag(o.input, self.ledger.next_id().0);
            let task = self.ledger.readmit(o, model_id, arrival, deadline);
            self.submit.push(task);
        }
        tracing::info!(
            held = n,
            resubmitted = self.submit.len(),
            "frontend: requests held over the lost scheduler handed to the new one"
        );
        self.flush_submit();
    }

    fn sweep(&mut self) {
        let now = self.clock.now();
        if self.ledger.poll_timeout().is_some_and(|t| t <= now) {
            for f in self.ledger.handle_timeout(now) {
                self.answer(f);
            }
        }
        // Held requests whose deadline passed with no scheduler.
        if !self.orphans.is_empty() {
            let now_i = Instant::now();
            let (late, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.orphans)
                .into_iter()
                .partition(|(_, _, d)| *d <= now_i);
            self.orphans = keep;
            for (o, arrival, _) in late {
                let f = self.ledger.end_orphan(
                    o,
                    Ended::NoScheduler,
                    "no scheduler until its deadline",
                    Dur::from_std(arrival.elapsed()),
                );
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
                    let now = self.clock.local().now();
                    self.member.handle_closed(now, c, &reason);
                    self.apply_member();
                } else {
                    // A client or a backend left; pending answers for a client that
                    // left are dropped when they come.
                    self.clients.remove(&c);
                }
            }
            Event::Msg(c, msg) if c == self.sched_id => {
                let now = self.clock.local().now();
                let msg = self.member.handle_msg(now, msg);
                self.apply_member();
                if let Some(m) = msg {
                    self.sched_msg(m);
                }
            }
            Event::Msg(c, msg) => self.client_msg(c, msg),
        }
    }

    /// A message from the scheduler.
    fn sched_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Dropped { items } => {
                for (id, code) in items {
                    self.finish(id, Answer::of_drop(code));
                }
            }
            Msg::ModelStates { items } => self.model_states(items),
            Msg::AppTotals {
                counters,
                frontends,
            } => self.app_totals(counters, frontends),
            Msg::Capacity { gpus } => {
                tracing::info!(gpus, "frontend: GPUs in service changed");
                self.state.gpus.store(gpus, Ordering::Release);
                if gpus > 0 {
                    self.readmit_orphans();
                }
            }
            other => tracing::warn!(
                kind = other.kind(),
                "frontend: ignoring an unexpected message from the scheduler"
            ),
        }
    }

    /// Connection `c` sent `n` results whose capability is not their task's:
    /// it is not the backend those tasks were planned on. They were refused
    /// (the requests wait for their real answers); the connection is logged
    /// and closed.
    fn forged(&mut self, c: ConnId, n: u64) {
        let why = format!(
            "{n} result(s) without their task's capability: not the backend the tasks were planned on"
        );
        tracing::warn!(conn = c, reason = %why, "frontend: refused results; closing the connection");
        if let Some(conn) = self.clients.remove(&c) {
            conn.close(&why);
        }
    }

    /// A client's request (`Msg::Infer`) on connection `c`, read off the
    /// event channel at `read` (its SLO runs from there: the wire carries no
    /// time a frontend could trust).
    fn client_infer(&mut self, c: ConnId, msg: Msg, read: Instant) {
        if let Msg::Infer {
            req,
            model,
            slo,
            input,
        } = msg
        {
            self.loop_wait.observe_duration(read.elapsed());
            self.infer(Client::Conn(c, req), &model, slo, &input, read);
        }
    }

    /// A message from a client or a backend on connection `c`.
    fn client_msg(&mut self, c: ConnId, msg: Msg) {
        match msg {
            msg @ Msg::Infer { .. } => self.client_infer(c, msg, Instant::now()),
            Msg::ListModels => {
                if let Some(conn) = self.clients.get(&c) {
                    let _ = conn.send(Msg::Models {
                        models: self.models.clone(),
                    });
                }
            }
            Msg::Results { items } => {
                let now = self.clock.now();
                let forged = self.ledger.counts().forged_results;
                for r in items {
                    if let Some(f) = self.ledger.result(now, r) {
                        self.answer(f);
                    }
                }
                let n = self.ledger.counts().forged_results - forged;
                if n > 0 {
                    self.forged(c, n);
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
