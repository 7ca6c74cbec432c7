//! The scheduler's event loop (thread `sched-net`), the driver of the sans-IO
//! [`SchedProto`]: it feeds the machine connections, messages and timeouts on the
//! OS clock, carries out its actions (sends and closes, routes, GPUs into and out
//! of the real-time scheduler, the network budget), submits the checked tasks to
//! the core, refreshes the GPU busy metrics every second and, at stop, drains the
//! core into the [`SchedReport`].
//!
//! With several sub-clusters it runs one real-time scheduler (ModelThreads and
//! a RankThread) per sub-cluster: every one knows every model and every GPU id
//! (so ids need no translation on the dispatch path), but plans only on its own
//! GPUs, and gets only the tasks of the models whose home it is
//! ([`Routed`]). The epoch partitioner ([`super::epoch`]) moves models.

use super::epoch::EpochPlanner;
use super::metrics::{
    advice_by_type, busy_snapshot, AutoscaleView, BusySnaps, GpuBusy, ModelHome, ScopeView,
    BUSY_WINDOW,
};
use super::routes::Routes;
use super::standby::{spawn_fencer, Action as StandbyAction, Standby};
use crate::core::{DropReason, Dur, GpuId, ModelId, ModelSpec, NetBudget, PlanId, Task, Time};
use crate::node::clock::SchedClock;
use crate::node::proto::fence;
use crate::node::proto::repo_poll::{RepoPoll, Scan};
use crate::node::proto::sched::{Action, SchedProto, SchedReport};
use crate::node::proto::subclusters::Phase;
use crate::plan::autoscale::{
    advise, demand_gpus, AdviceConfig, DemandTrend, GpuOwner, Signals, TotalsWindow,
    DEMAND_WINDOW_S, TREND_SPAN_S,
};
use crate::plan::partition::PartModel;
use crate::runtime::sched::{GpuReporter, Routed, RtReport, RtScheduler};
use crate::transport::{Conn, ConnId, Event, Listener};
use crate::wire::{Msg, NodeId};
use anyhow::Result;
use crossbeam_channel::RecvTimeoutError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Tasks the core refused (its queues full), to drop as `Overloaded`.
type Refused = Vec<(ModelId, Task)>;

/// Autoscaling signals of one scope (the cluster or a sub-cluster): its task
/// totals over the window, and the GPUs and models they last covered (when
/// these change, the bad rate starts over: it describes the GPUs in service
/// and the models served now, not those before a scaling step or a move).
#[derive(Default)]
struct ScopeTotals {
    totals: TotalsWindow,
    /// The GPUs and models the totals last covered.
    key: (Vec<u32>, Vec<u32>),
    /// The load's demand (GPUs) over time, for its trend.
    trend: DemandTrend,
}

pub(super) struct EventLoop {
    /// One real-time scheduler per sub-cluster (empty once stopped).
    rts: Vec<RtScheduler>,
    routes: Arc<Routes>,
    clock: SchedClock,
    /// Membership, health, the network budget and the checks (sans-IO).
    proto: SchedProto,
    conns: HashMap<ConnId, Arc<dyn Conn>>,
    /// Each sub-cluster's RankThread, and each GPU's sub-cluster.
    reporters: Vec<GpuReporter>,
    gpu_sub: Vec<u32>,
    /// Per global GPU id: busy time, for the metrics.
    busy: Vec<GpuBusy>,
    busy_snap: BusySnaps,
    /// While a hot standby follows its primary (None once it serves).
    standby: Option<Standby>,
    _listener: Box<dyn Listener>,
    /// The autoscaling view and its thresholds, and the task totals behind its
    /// bad rate (over the GPUs' busy window, [`BUSY_WINDOW`]): the cluster's,
    /// then each sub-cluster's.
    autoscale: (Arc<std::sync::Mutex<AutoscaleView>>, AdviceConfig),
    scopes: Vec<ScopeTotals>,
    started: Instant,
    /// The epoch partitioner, and the models as it sees them (memory from the
    /// workload, or as backends measured it).
    epoch: EpochPlanner,
    part_models: Vec<PartModel>,
    /// The models' specs, and their task counts over the demand's window
    /// ([`DEMAND_WINDOW_S`]), for the load's demand in GPUs.
    specs: Vec<ModelSpec>,
    model_counts: crate::metrics::Window<Vec<u64>>,
    /// The models' profiles as given (`specs` has them times their latency
    /// scales).
    base_profiles: Vec<crate::core::LatencyProfile>,
    /// Once it took over: the fencing thread's answer (a newer term, 0: none)
    /// and its stop flag.
    fencer: Option<(Arc<AtomicU64>, Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    /// Why it stepped down, for the process (the loop then ends).
    stepped_down: Arc<Mutex<Option<String>>>,
    /// With `--model-control-mode poll`: the looks at the model repository
    /// and what the earlier ones saw.
    repo_poll: Option<(crossbeam_channel::Receiver<Scan>, RepoPoll)>,
}

impl EventLoop {
    #[allow(clippy::too_many_arguments)] // one each of what the loop owns
    pub(super) fn new(
        rts: Vec<RtScheduler>,
        routes: Arc<Routes>,
        clock: SchedClock,
        proto: SchedProto,
        busy_snap: BusySnaps,
        listener: Box<dyn Listener>,
        standby: Option<Standby>,
        autoscale: (Arc<std::sync::Mutex<AutoscaleView>>, AdviceConfig),
        epoch: (EpochPlanner, Vec<PartModel>),
        specs: Vec<ModelSpec>,
        stepped_down: Arc<Mutex<Option<String>>>,
    ) -> EventLoop {
        let subs = rts.len();
        EventLoop {
            reporters: rts.iter().map(|rt| rt.gpu_reporter()).collect(),
            gpu_sub: Vec::new(),
            rts,
            routes,
            clock,
            proto,
            conns: HashMap::new(),
            busy: Vec::new(),
            busy_snap,
            standby,
            _listener: listener,
            autoscale,
            scopes: (0..=subs).map(|_| ScopeTotals::default()).collect(),
            started: Instant::now(),
            epoch: epoch.0,
            part_models: epoch.1,
            base_profiles: specs.iter().map(|s| s.profile.clone()).collect(),
            specs,
            model_counts: crate::metrics::Window::default(),
            fencer: None,
            stepped_down,
            repo_poll: None,
        }
    }

    /// Follows the model repository's looks from `looks` (`poll`).
    pub(super) fn poll_repository(&mut self, looks: crossbeam_channel::Receiver<Scan>) {
        self.repo_poll = Some((looks, RepoPoll::new()));
    }

    /// A look at the model repository, when one came, becomes loads and
    /// unloads (not while following a primary: it decides them).
    fn repo_step(&mut self, sub: &mut Routed, refused: &mut Refused) {
        let Some((looks, poll)) = &mut self.repo_poll else {
            return;
        };
        let Ok(scan) = looks.try_recv() else {
            return;
        };
        if self.standby.is_some() {
            return;
        }
        let proto = &self.proto;
        let ch = poll.step(&scan, |m| proto.model_availability(m));
        for name in ch.new_unknown {
            tracing::warn!(
                model = %name,
                "scheduler: a model appeared in the model repository; it is not served (the \
                 served models are fixed at start: restart the scheduler to serve it)"
            );
        }
        if ch.models.is_empty() {
            return;
        }
        let now = self.clock.now();
        for (m, load) in ch.models {
            self.proto.repo_change(now, m, load);
        }
        self.apply(sub, refused);
    }

    /// Where the loop's thread submits tasks to the cores.
    pub(super) fn submitters(&self) -> Routed {
        Routed::new(
            self.proto.subclusters().homes().to_vec(),
            self.rts.iter().map(|rt| rt.submitter()).collect(),
        )
    }

    /// GPU `id`'s sub-cluster's scheduler.
    fn rt_of(&self, id: GpuId) -> Option<&RtScheduler> {
        let s = self.gpu_sub.get(id.idx()).copied()?;
        self.rts.get(s as usize)
    }

    /// Runs until `stop` (or the event channel closes), then stops the core.
    pub(super) fn run(
        mut self,
        rx: crossbeam_channel::Receiver<Event>,
        mut sub: Routed,
        stop: &AtomicBool,
    ) -> Result<SchedReport> {
        let mut next_busy = Instant::now();
        let mut refused = Vec::new();
        while !stop.load(Ordering::Acquire) && self.proto.stepped_down().is_none() {
            if let Some((newer, _, _)) = &self.fencer {
                let t = newer.load(Ordering::Acquire);
                if t > 0 {
                    self.proto.handle_fenced(t);
                    self.apply(&mut sub, &mut refused);
                    continue;
                }
            }
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
            self.epoch_step(now, &mut sub, &mut refused);
            self.repo_step(&mut sub, &mut refused);
        }
        Ok(self.finish(sub))
    }

    /// The epoch partitioner's turn: its answer becomes model moves.
    fn epoch_step(&mut self, now: Instant, sub: &mut Routed, refused: &mut Refused) {
        if self.standby.is_some() || !self.epoch.wants(now) {
            return;
        }
        let counts: Vec<u64> = self.routes.metrics.tasks.iter().map(|c| c.get()).collect();
        let models = &self.part_models;
        let homes = self.proto.subclusters().homes().to_vec();
        let Some(r) = self.epoch.poll(now, &counts, || models.clone(), &homes) else {
            return;
        };
        let started = self.proto.repartition(self.clock.now(), &r.assignment);
        tracing::info!(
            before = r.before,
            after = r.after,
            moves = started,
            rates = ?r.rates,
            "scheduler: re-partition"
        );
        self.apply(sub, refused);
    }

    /// `ev` and the events behind it, then the submitter's flush.
    fn handle_batch(
        &mut self,
        ev: Event,
        rx: &crossbeam_channel::Receiver<Event>,
        sub: &mut Routed,
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
    fn finish(mut self, sub: Routed) -> SchedReport {
        if let Some((_, stop, h)) = self.fencer.take() {
            stop.store(true, Ordering::Release);
            let _ = h.join();
        }
        for c in self.conns.values() {
            c.close("scheduler stopping");
        }
        drop(sub);
        let received: u64 = std::mem::take(&mut self.rts)
            .into_iter()
            .map(|rt| {
                let rep: RtReport = rt.shutdown();
                rep.counters.received
            })
            .sum();
        let mut report = self.proto.report().clone();
        report.tasks_received = received;
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
        let lat = self.proto.latency().scaler();
        for (m, g) in self.routes.metrics.latency_ratio.iter().enumerate() {
            g.set(lat.estimate(ModelId(m as u32)).unwrap_or(0.0));
        }
        self.update_autoscale(now, &snap);
        *self.busy_snap.lock().expect("busy lock") = snap;
    }

    /// The autoscaling signals over the window and the advice they give, for
    /// the cluster and each sub-cluster.
    fn update_autoscale(&mut self, now: Instant, snap: &[super::metrics::GpuSnap]) {
        let (view, cfg) = (self.autoscale.0.clone(), self.autoscale.1);
        let window = BUSY_WINDOW.as_secs_f64();
        let t = now.duration_since(self.started).as_secs_f64();
        let tasks: Vec<u64> = self.routes.metrics.tasks.iter().map(|c| c.get()).collect();
        let rep = self.proto.report();
        let cluster_bad = self.routes.dropped.load(Ordering::Relaxed)
            + self.routes.lost.load(Ordering::Relaxed)
            + rep.tasks_dropped
            + rep.tasks_failed_backend_lost
            + rep.tasks_late;
        let homes = self.proto.subclusters().homes().to_vec();
        let late = self.proto.late_by_model();
        // Each model's rate over the demand's window.
        let (t0, first) =
            self.model_counts
                .push(now, tasks.clone(), Duration::from_secs_f64(DEMAND_WINDOW_S));
        let demand_span = now.duration_since(t0).as_secs_f64();
        let span = demand_span.max(1e-3);
        let rates: Vec<f64> = tasks
            .iter()
            .zip(&first)
            .map(|(&n, &n0)| n.saturating_sub(n0) as f64 / span)
            .collect();
        let backends: Vec<_> = self.proto.backends();
        let mut scopes = Vec::with_capacity(self.scopes.len());
        for (i, st) in self.scopes.iter_mut().enumerate() {
            // Scope 0 is the cluster; scope i the sub-cluster i - 1.
            let sub = i.checked_sub(1).map(|s| s as u32);
            let owners: Vec<GpuOwner> = backends
                .iter()
                .filter(|b| !b.draining && sub.is_none_or(|s| b.subcluster == s))
                .flat_map(|b| {
                    let lanes = b.lanes.max(1);
                    b.gpus.iter().enumerate().map(move |(i, &g)| GpuOwner {
                        gpu: g,
                        node: u64::from(b.node),
                        name: b.name.clone(),
                        device: i as u32 / lanes,
                        lanes,
                    })
                })
                .collect();
            let models: Vec<usize> = (0..homes.len())
                .filter(|&m| sub.is_none_or(|s| homes[m] == s))
                .collect();
            let (n, bad) = match sub {
                None => (tasks.iter().sum(), cluster_bad),
                // A sub-cluster's bad tasks: its models' drops in the core and
                // late finishes (a lost backend's tasks and drops before the
                // core count for the cluster only).
                Some(_) => models.iter().fold((0, 0), |(n, b), &m| {
                    let dropped = self.routes.dropped_by_model[m].load(Ordering::Relaxed);
                    (n + tasks[m], b + dropped + late[m])
                }),
            };
            let mut gpus: Vec<u32> = owners.iter().map(|o| o.gpu).collect();
            gpus.sort_unstable();
            let key = (gpus, models.iter().map(|&m| m as u32).collect::<Vec<_>>());
            if key != st.key {
                // The GPUs (a scaling step) or the models (a move) changed.
                st.totals = TotalsWindow::default();
                if key.1 != st.key.1 {
                    // A move steps the scope's demand: no trend in that.
                    st.trend = DemandTrend::default();
                }
                st.key = key;
            }
            let (span, n, bad) = st.totals.push(t, n, bad, window);
            let idle: Vec<f64> = owners
                .iter()
                .filter_map(|o| snap.get(o.gpu as usize).map(|g| 1.0 - g.ratio()))
                .collect();
            let specs = &self.specs;
            let demand = demand_gpus(
                models
                    .iter()
                    .filter_map(|&m| Some((rates[m], &specs.get(m)?.profile, specs[m].slo))),
            );
            let rise = st.trend.push(t, demand, TREND_SPAN_S);
            let signals = Signals {
                demand_gpus: Some(demand),
                demand_rise_per_s: rise,
                demand_window_s: demand_span,
                ..Signals::new(
                    span,
                    owners.len() as u32,
                    if idle.is_empty() {
                        0.0
                    } else {
                        idle.iter().sum::<f64>() / idle.len() as f64
                    },
                    n,
                    bad,
                )
            };
            let advice = advise(&signals, &owners, &cfg);
            let gpu_type = sub
                .and_then(|s| self.proto.subclusters().gpu_type(s))
                .map(String::from);
            scopes.push(ScopeView {
                subcluster: sub,
                gpu_type,
                signals,
                advice,
            });
        }
        let cluster = (!scopes.is_empty()).then(|| scopes.remove(0));
        let subs = self.proto.subclusters();
        let models = self
            .specs
            .iter()
            .enumerate()
            .map(|(m, spec)| {
                let id = ModelId(m as u32);
                let mv = subs.moving(id);
                let switched = mv.is_some_and(|mv| mv.phase != Phase::Loading);
                ModelHome {
                    model: spec.name.clone(),
                    subcluster: subs.home(id),
                    loading_at: mv.filter(|_| !switched).map(|mv| mv.to),
                    draining_from: mv.filter(|_| switched).map(|mv| mv.from),
                }
            })
            .collect();
        let types = advice_by_type(subs.types(), &scopes);
        let v = AutoscaleView {
            window_s: window,
            cluster,
            subclusters: scopes,
            models,
            moves: subs.stats,
            types,
            backends,
            thresholds: Some(cfg),
        };
        *view.lock().expect("autoscale lock") = v;
    }

    /// Carries out what the standby's machine decided: refusals of nodes
    /// that wait too long, and the takeover (from then on it serves, starting
    /// with the messages it held).
    fn standby_step(&mut self, sub: &mut Routed, refused: &mut Refused) {
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
                StandbyAction::TakeOver {
                    why,
                    held,
                    assignment,
                    states,
                    scales,
                    term,
                } => {
                    let Some(sb) = self.standby.take() else {
                        return;
                    };
                    tracing::warn!(reason = %why, term, "standby: the primary is gone; taking over");
                    self.proto.set_term(term);
                    let newer = Arc::new(AtomicU64::new(0));
                    let stop = Arc::new(AtomicBool::new(false));
                    let every = sb.heartbeat * fence::FENCE_EVERY_HEARTBEATS as u32;
                    match spawn_fencer(
                        sb.transport(),
                        sb.proto.primary().to_string(),
                        term,
                        every,
                        newer.clone(),
                        stop.clone(),
                    ) {
                        Ok(h) => self.fencer = Some((newer, stop, h)),
                        Err(e) => {
                            tracing::error!(error = %e, "standby: cannot start fencing the old primary")
                        }
                    }
                    let why = format!("{why}; term {term}");
                    match assignment.map(|h| self.proto.adopt_assignment(&h)) {
                        None => tracing::warn!(
                            "standby: the primary sent no assignment; the start-up one stays"
                        ),
                        Some(Ok(n)) => tracing::info!(
                            changed = n,
                            "standby: took the primary's assignment of models to sub-clusters"
                        ),
                        Some(Err(e)) => tracing::warn!(
                            error = %e,
                            "standby: the primary's assignment does not fit; the start-up one stays"
                        ),
                    }
                    match scales.map(|k| self.proto.adopt_latency_scales(&k)) {
                        None => tracing::warn!(
                            "standby: the primary sent no latency scales; every model is planned with its profile until measured"
                        ),
                        Some(Ok(())) => tracing::info!(
                            scales = ?self.proto.latency().scaler().scales(),
                            "standby: took the primary's latency scales"
                        ),
                        Some(Err(e)) => tracing::warn!(
                            error = %e,
                            "standby: the primary's latency scales do not fit; every model is planned with its profile until measured"
                        ),
                    }
                    if states.is_empty() {
                        tracing::warn!(
                            "standby: the primary sent no model states; the start-up ones stay"
                        );
                    } else {
                        match self.proto.adopt_model_states(&states) {
                            Ok(n) => tracing::info!(
                                changed = n,
                                "standby: took the primary's model states (loads and unloads done there)"
                            ),
                            Err(e) => tracing::warn!(
                                error = %e,
                                "standby: the primary's model states do not fit; the start-up ones stay"
                            ),
                        }
                    }
                    self.apply(sub, refused);
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

    fn handle(&mut self, ev: Event, sub: &mut Routed, refused: &mut Refused) {
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

    fn handle_now(&mut self, ev: Event, sub: &mut Routed, refused: &mut Refused) {
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
    fn apply(&mut self, sub: &mut Routed, refused: &mut Refused) {
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
                    subcluster,
                } => {
                    // Routes first; the ack follows as the next action; the GPUs
                    // enter the core after it, so a plan can only follow the ack.
                    let Some(conn) = self.conns.get(&conn) else {
                        continue;
                    };
                    self.routes.gpus_up(conn, backend, subcluster, &gpus);
                    up.extend(gpus.into_iter().map(|g| (g, subcluster)));
                }
                Action::Route { model, subcluster } => sub.route(model, subcluster),
                Action::GpusDown { backend, gpus } => self.gpus_down(backend, &gpus),
                Action::GpusDraining { gpus, .. } => {
                    // Out of the core; the routes stay for the plans in flight.
                    for &id in &gpus {
                        if let Some(rt) = self.rt_of(id) {
                            rt.remove_gpu(id);
                        }
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
                Action::SetMargins(m) => {
                    for rt in &self.rts {
                        rt.set_margins(&m);
                    }
                }
                Action::SetLatencyScales(k) => self.set_latency_scales(k),
                Action::DeviceBytes { model, bytes } => self.device_bytes(model, bytes),
                Action::StepDown { term, why } => {
                    let line = format!("replaced by a scheduler of term {term} ({why})");
                    *self.stepped_down.lock().expect("step-down lock") = Some(line);
                }
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

    fn submit(&self, tasks: Vec<(ModelId, Task)>, sub: &mut Routed, refused: &mut Refused) {
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
        if let Some(r) = self
            .gpu_sub
            .get(gpu.idx())
            .and_then(|&s| self.reporters.get(s as usize))
        {
            r.report(gpu, plan, finished);
        }
    }

    /// Each model is planned with its profile times its scale from now on:
    /// the cores, the load's demand and the metrics follow.
    fn set_latency_scales(&mut self, k: Vec<f64>) {
        for rt in &self.rts {
            rt.set_latency_scales(&k);
        }
        for (m, (&k, base)) in k.iter().zip(&self.base_profiles).enumerate() {
            if let Some(s) = self.specs.get_mut(m) {
                s.profile = base.scaled(k);
            }
            if let Some(g) = self.routes.metrics.latency_scale.get(m) {
                g.set(k);
            }
        }
        tracing::info!(scales = ?k, "scheduler: models' latency scales");
    }

    fn set_net(&self, net: NetBudget) {
        for rt in &self.rts {
            rt.set_net(net);
        }
        self.routes.metrics.d_ctrl.set(net.ctrl.as_secs_f64());
        self.routes
            .metrics
            .d_data
            .set(net.data_per_req.as_secs_f64());
        self.routes
            .metrics
            .d_data_fixed
            .set(net.data_fixed.as_secs_f64());
        let m = &self.routes.metrics;
        m.pull_hold.set(net.hold_per_req.as_secs_f64());
        m.pull_hold_fixed.set(net.hold_fixed.as_secs_f64());
    }

    fn device_bytes(&mut self, model: ModelId, bytes: u64) {
        // The partitioner balances measured memory from now on.
        if let Some(m) = self.part_models.get_mut(model.idx()) {
            m.memory_mb = bytes as f64 / 1e6;
        }
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
    /// Every sub-cluster's scheduler takes the GPU id (ids stay the same
    /// everywhere), and only its own sub-cluster's plans on it. An id given
    /// again starts over everywhere: nothing of its last holder stays (the
    /// protocol gives an id again only after its quarantine).
    fn enter_service(&mut self, up: Vec<(GpuId, u32)>) {
        let now = Instant::now();
        for (id, sub) in up {
            for (s, rt) in self.rts.iter().enumerate() {
                rt.add_gpu_at(id, s == sub as usize);
            }
            if self.gpu_sub.len() <= id.idx() {
                self.gpu_sub.resize(id.idx() + 1, 0);
            }
            self.gpu_sub[id.idx()] = sub;
            if self.busy.len() <= id.idx() {
                self.busy.resize_with(id.idx() + 1, GpuBusy::default);
            }
            self.busy[id.idx()] = GpuBusy::default();
            self.busy[id.idx()].enter_service(now, sub);
        }
    }

    /// A backend's GPUs leave service.
    fn gpus_down(&mut self, backend: NodeId, gpus: &[GpuId]) {
        self.routes.gpus_down(gpus);
        for &id in gpus {
            if let Some(rt) = self.rt_of(id) {
                rt.remove_gpu(id);
            }
            if let Some(b) = self.busy.get_mut(id.idx()) {
                b.depart();
            }
        }
        // Plans dispatched while the protocol removed the backend (a RankThread
        // holds the routes' read lock from route lookup to recording the plan):
        // with the routes gone none can follow, so these are the last ones.
        self.routes.lose_backend(backend);
    }
}
