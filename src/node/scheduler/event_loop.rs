//! The scheduler's event loop (thread `sched-net`), the driver of the sans-IO
//! [`SchedProto`]: it feeds the machine connections, messages and timeouts on the
//! OS clock, carries out its actions (sends and closes, routes, GPUs into and out
//! of the real-time scheduler, the network budget), submits the checked tasks to
//! the core, refreshes the GPU busy metrics every second and, at stop, drains the
//! core into the [`SchedReport`].

use super::metrics::{busy_snapshot, AutoscaleView, BusySnaps, GpuBusy, ScopeView, BUSY_WINDOW};
use super::routes::Routes;
use super::standby::{Action as StandbyAction, Standby};
use crate::core::{DropReason, Dur, GpuId, ModelId, NetBudget, PlanId, Task, Time};
use crate::node::clock::SchedClock;
use crate::node::proto::sched::{Action, SchedProto, SchedReport};
use crate::plan::autoscale::{advise, AdviceConfig, GpuOwner, Signals, TotalsWindow};
use crate::runtime::sched::{GpuReporter, RtReport, RtScheduler, Submitter};
use crate::transport::{Conn, ConnId, Event, Listener};
use crate::wire::{Msg, NodeId};
use anyhow::Result;
use crossbeam_channel::RecvTimeoutError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tasks the core refused (its queues full), to drop as `Overloaded`.
type Refused = Vec<(ModelId, Task)>;

pub(super) struct EventLoop {
    rt: Option<RtScheduler>,
    routes: Arc<Routes>,
    clock: SchedClock,
    /// Membership, health, the network budget and the checks (sans-IO).
    proto: SchedProto,
    conns: HashMap<ConnId, Arc<dyn Conn>>,
    reporter: GpuReporter,
    /// Per global GPU id: busy time, for the metrics.
    busy: Vec<GpuBusy>,
    busy_snap: BusySnaps,
    /// While a hot standby follows its primary (None once it serves).
    standby: Option<Standby>,
    _listener: Box<dyn Listener>,
    /// The autoscaling view and its thresholds, and the task totals behind its
    /// bad rate (over the GPUs' busy window, [`BUSY_WINDOW`]).
    autoscale: (Arc<std::sync::Mutex<AutoscaleView>>, AdviceConfig),
    totals: TotalsWindow,
    /// The GPUs the signals last covered: when they change, the bad rate
    /// starts over (it describes the GPUs in service now, not those before a
    /// scaling step).
    signal_gpus: Vec<u32>,
    started: Instant,
}

impl EventLoop {
    #[allow(clippy::too_many_arguments)] // one each of what the loop owns
    pub(super) fn new(
        rt: RtScheduler,
        routes: Arc<Routes>,
        clock: SchedClock,
        proto: SchedProto,
        busy_snap: BusySnaps,
        listener: Box<dyn Listener>,
        standby: Option<Standby>,
        autoscale: (Arc<std::sync::Mutex<AutoscaleView>>, AdviceConfig),
    ) -> EventLoop {
        EventLoop {
            reporter: rt.gpu_reporter(),
            rt: Some(rt),
            routes,
            clock,
            proto,
            conns: HashMap::new(),
            busy: Vec::new(),
            busy_snap,
            standby,
            _listener: listener,
            autoscale,
            totals: TotalsWindow::default(),
            signal_gpus: Vec::new(),
            started: Instant::now(),
        }
    }

    fn rt(&self) -> &RtScheduler {
        self.rt.as_ref().expect("running")
    }

    /// Where the loop's thread submits tasks to the core.
    pub(super) fn submitter(&self) -> Submitter {
        self.rt().submitter()
    }

    /// Runs until `stop` (or the event channel closes), then stops the core.
    pub(super) fn run(
        mut self,
        rx: crossbeam_channel::Receiver<Event>,
        mut sub: Submitter,
        stop: &AtomicBool,
    ) -> Result<SchedReport> {
        let mut next_busy = Instant::now();
        let mut refused = Vec::new();
        while !stop.load(Ordering::Acquire) {
            let due = self.proto.poll_timeout();
            let mut wait = Duration::from_nanos((due - self.clock.now()).0.max(0) as u64);
            if let Some(sb) = &mut self.standby {
                let now = self.clock.now();
                if now >= sb.proto.poll_timeout() {
                    sb.proto.handle_timeout(now);
                }
                self.standby_step(&mut sub, &mut refused);
                if let Some(sb) = &self.standby {
                    let due = sb.proto.poll_timeout();
                    wait = wait.min(Duration::from_nanos(
                        (due - self.clock.now()).0.max(0) as u64
                    ));
                }
            }
            match rx.recv_timeout(wait.min(Duration::from_millis(50))) {
                Ok(ev) => self.handle_batch(ev, &rx, &mut sub, &mut refused),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let now = self.clock.now();
            if now >= self.proto.poll_timeout() {
                self.proto.handle_timeout(now);
                self.apply(&mut sub, &mut refused);
            }
            let now = Instant::now();
            if now >= next_busy {
                next_busy = now + Duration::from_secs(1);
                self.update_busy(now);
            }
        }
        Ok(self.finish(sub))
    }

    /// `ev` and the events behind it, then the submitter's flush.
    fn handle_batch(
        &mut self,
        ev: Event,
        rx: &crossbeam_channel::Receiver<Event>,
        sub: &mut Submitter,
        refused: &mut Refused,
    ) {
        self.handle(ev, sub, refused);
        // A bounded batch before flushing the submitter, so heartbeats
        // and timeouts keep their pace under any load.
        for _ in 0..256 {
            match rx.try_recv() {
                Ok(ev) => self.handle(ev, sub, refused),
                Err(_) => break,
            }
        }
        sub.flush(refused);
        self.refuse(refused);
    }

    /// Stop: close every connection, then drain the scheduler (its drops go to
    /// frontends that are already closed: they fail their own pending tasks).
    fn finish(mut self, sub: Submitter) -> SchedReport {
        for c in self.conns.values() {
            c.close("scheduler stopping");
        }
        let rt = self.rt.take().expect("running");
        drop(sub);
        let rep: RtReport = rt.shutdown();
        let mut report = self.proto.report().clone();
        report.tasks_received = rep.counters.received;
        report.plans_sent = self.routes.plans_sent.load(Ordering::Relaxed);
        report.tasks_failed_backend_lost += self.routes.lost.load(Ordering::Relaxed);
        report.tasks_dropped += self.routes.dropped.load(Ordering::Relaxed);
        report
    }

    fn refuse(&self, refused: &mut Refused) {
        if !refused.is_empty() {
            self.routes
                .dropped
                .fetch_add(refused.len() as u64, Ordering::Relaxed);
            self.routes
                .notify(refused.drain(..).map(|(_, t)| t.id), DropReason::Overloaded);
        }
    }

    /// Refreshes the GPUs' busy fractions for the metrics.
    fn update_busy(&mut self, now: Instant) {
        let snap = busy_snapshot(&mut self.busy, now);
        self.update_autoscale(now, &snap);
        *self.busy_snap.lock().expect("busy lock") = snap;
    }

    /// The autoscaling signals over the window and the advice they give.
    fn update_autoscale(&mut self, now: Instant, snap: &[super::metrics::GpuSnap]) {
        let (view, cfg) = &self.autoscale;
        let window = BUSY_WINDOW;
        let tasks: u64 = self.routes.metrics.tasks.iter().map(|c| c.get()).sum();
        let rep = self.proto.report();
        let bad = self.routes.dropped.load(Ordering::Relaxed)
            + self.routes.lost.load(Ordering::Relaxed)
            + rep.tasks_dropped
            + rep.tasks_failed_backend_lost
            + rep.tasks_late;
        let t = now.duration_since(self.started).as_secs_f64();
        let backends: Vec<_> = self.proto.backends();
        let owners: Vec<GpuOwner> = backends
            .iter()
            .filter(|b| !b.draining)
            .flat_map(|b| {
                b.gpus.iter().map(|&g| GpuOwner {
                    gpu: g,
                    node: u64::from(b.node),
                    name: b.name.clone(),
                })
            })
            .collect();
        let mut gpus: Vec<u32> = owners.iter().map(|o| o.gpu).collect();
        gpus.sort_unstable();
        if gpus != self.signal_gpus {
            self.totals = TotalsWindow::default();
            self.signal_gpus = gpus;
        }
        let (span, tasks, bad) = self.totals.push(t, tasks, bad, window.as_secs_f64());
        let idle: Vec<f64> = owners
            .iter()
            .filter_map(|o| snap.get(o.gpu as usize).map(|g| 1.0 - g.ratio()))
            .collect();
        let signals = Signals {
            window_s: span,
            gpus: owners.len() as u32,
            idle_fraction: if idle.is_empty() {
                0.0
            } else {
                idle.iter().sum::<f64>() / idle.len() as f64
            },
            tasks,
            bad,
            bad_rate: if tasks == 0 {
                0.0
            } else {
                (bad as f64 / tasks as f64).min(1.0)
            },
        };
        let advice = advise(&signals, &owners, cfg);
        let scope = |sub| ScopeView {
            subcluster: sub,
            signals: signals.clone(),
            advice: advice.clone(),
        };
        // One scheduler is one sub-cluster (id 0) today: the cluster's figures
        // are its figures.
        let v = AutoscaleView {
            window_s: window.as_secs_f64(),
            cluster: Some(scope(None)),
            subclusters: vec![scope(Some(0))],
            backends,
            thresholds: Some(*cfg),
        };
        *view.lock().expect("autoscale lock") = v;
    }

    /// Carries out what the standby's machine decided: refusals of nodes
    /// that wait too long, and the takeover (from then on it serves, starting
    /// with the messages it held).
    fn standby_step(&mut self, sub: &mut Submitter, refused: &mut Refused) {
        let Some(sb) = &mut self.standby else {
            return;
        };
        let now = self.clock.now();
        for a in sb.step(now) {
            match a {
                StandbyAction::Refuse(c, why) => {
                    if let Some(conn) = self.conns.remove(&c) {
                        let _ = conn.send(Msg::Error {
                            message: why.clone(),
                        });
                        conn.close(&why);
                    }
                }
                StandbyAction::TakeOver { why, held } => {
                    let Some(sb) = self.standby.take() else {
                        return;
                    };
                    tracing::warn!(reason = %why, "standby: the primary is gone; taking over");
                    let since = (self.clock.now() - sb.proto.last_pong()).max(Dur::ZERO);
                    let after = Duration::from_nanos(since.0 as u64);
                    *sb.status.took_over.lock().expect("status lock") = Some((why, after));
                    sb.status.promoted.store(true, Ordering::Release);
                    for (c, msg) in held {
                        let now = self.clock.now();
                        self.proto.handle_msg(now, c, msg);
                        self.apply(sub, refused);
                    }
                    return;
                }
                _ => {}
            }
        }
    }

    fn handle(&mut self, ev: Event, sub: &mut Submitter, refused: &mut Refused) {
        if let Some(sb) = &mut self.standby {
            let now = self.clock.now();
            match ev {
                Event::Msg(c, msg) => sb.proto.handle_msg(now, c, msg),
                Event::Closed(c, reason) => {
                    let mine = sb.is_primary_conn(c);
                    sb.proto.handle_closed(now, c, &reason);
                    if !mine {
                        // A node's connection: the scheduler's machine knows it.
                        self.handle_now(Event::Closed(c, reason), sub, refused);
                    }
                }
                accepted => self.handle_now(accepted, sub, refused),
            }
            return self.standby_step(sub, refused);
        }
        self.handle_now(ev, sub, refused)
    }

    fn handle_now(&mut self, ev: Event, sub: &mut Submitter, refused: &mut Refused) {
        let now = self.clock.now();
        match ev {
            Event::Accepted(conn) => {
                let c = conn.id();
                self.conns.insert(c, conn);
                self.proto.handle_accept(now, c);
            }
            Event::Closed(c, reason) => self.proto.handle_closed(now, c, reason),
            Event::Msg(c, msg) => self.proto.handle_msg(now, c, msg),
        }
        self.apply(sub, refused);
    }

    /// Carries out what the protocol machine decided.
    fn apply(&mut self, sub: &mut Submitter, refused: &mut Refused) {
        let mut up = Vec::new();
        while let Some(a) = self.proto.poll_action() {
            match a {
                Action::Send(c, m) => self.send(c, m),
                Action::Close(c, why) => {
                    if let Some(conn) = self.conns.remove(&c) {
                        conn.close(&why);
                    }
                }
                Action::GpusUp {
                    conn,
                    backend,
                    gpus,
                } => {
                    // Routes first; the ack follows as the next action; the GPUs
                    // enter the core after it, so a plan can only follow the ack.
                    let Some(conn) = self.conns.get(&conn) else {
                        continue;
                    };
                    self.routes.gpus_up(conn, backend, &gpus);
                    up.extend(gpus);
                }
                Action::GpusDown { backend, gpus } => self.gpus_down(backend, &gpus),
                Action::GpusDraining { gpus, .. } => {
                    // Out of the core; the routes stay for the plans in flight.
                    for &id in &gpus {
                        self.rt().remove_gpu(id);
                        if let Some(b) = self.busy.get_mut(id.idx()) {
                            b.leave_service();
                        }
                    }
                }
                Action::FrontendUp { conn, node } => {
                    if let Some(conn) = self.conns.get(&conn).cloned() {
                        self.routes.frontend_up(node, conn);
                    }
                }
                Action::FrontendDown { node } => self.routes.frontend_down(node),
                Action::Submit(tasks) => self.submit(tasks, sub, refused),
                Action::PlanDone {
                    gpu,
                    plan,
                    finished,
                    busy,
                } => self.plan_done(gpu, plan, finished, busy),
                Action::SetNet(net) => self.set_net(net),
                Action::SetMargins(m) => self.rt().set_margins(&m),
                Action::DeviceBytes { model, bytes } => self.device_bytes(model, bytes),
            }
        }
        if !up.is_empty() {
            self.enter_service(up);
        }
    }

    fn send(&self, c: ConnId, m: Msg) {
        if let Msg::Dropped { items } = &m {
            for &(_, code) in items {
                self.routes.metrics.dropped(code, 1);
            }
        }
        if let Some(conn) = self.conns.get(&c) {
            let _ = conn.send(m);
        }
    }

    fn submit(&self, tasks: Vec<(ModelId, Task)>, sub: &mut Submitter, refused: &mut Refused) {
        for (m, t) in tasks {
            if let Some(c) = self.routes.metrics.tasks.get(m.idx()) {
                c.inc();
            }
            sub.push(m, t, refused);
        }
    }

    fn plan_done(&mut self, gpu: GpuId, plan: PlanId, finished: Time, busy: Dur) {
        if let Some(b) = self.busy.get_mut(gpu.idx()) {
            b.add(busy);
        }
        self.reporter.report(gpu, plan, finished);
    }

    fn set_net(&self, net: NetBudget) {
        self.rt().set_net(net);
        self.routes.metrics.d_ctrl.set(net.ctrl.as_secs_f64());
        self.routes
            .metrics
            .d_data
            .set(net.data_per_req.as_secs_f64());
    }

    fn device_bytes(&self, model: ModelId, bytes: u64) {
        if let Some(g) = self.routes.metrics.device_bytes.get(model.idx()) {
            g.set(bytes as f64);
        }
        tracing::info!(
            model = model.0,
            bytes,
            "scheduler: model's device footprint"
        );
    }

    /// GPUs enter the core (their routes and acks are out).
    fn enter_service(&mut self, up: Vec<GpuId>) {
        let now = Instant::now();
        for id in up {
            let got = self.rt().add_gpu();
            debug_assert_eq!(got, id);
            if self.busy.len() <= id.idx() {
                self.busy.resize_with(id.idx() + 1, GpuBusy::default);
            }
            self.busy[id.idx()].enter_service(now);
        }
    }

    /// A backend's GPUs leave service.
    fn gpus_down(&mut self, backend: NodeId, gpus: &[GpuId]) {
        self.routes.gpus_down(gpus);
        for &id in gpus {
            self.rt().remove_gpu(id);
            if let Some(b) = self.busy.get_mut(id.idx()) {
                b.leave_service();
            }
        }
        // Plans dispatched while the protocol removed the backend (a RankThread
        // holds the routes' read lock from route lookup to recording the plan):
        // with the routes gone none can follow, so these are the last ones.
        self.routes.lose_backend(backend);
    }
}
