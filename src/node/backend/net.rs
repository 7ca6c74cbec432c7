//! The backend's network loop (thread `backend-net`), the driver of the sans-IO
//! [`BackendProto`]: the scheduler's and the frontends' connections, the OS
//! clock, heartbeats and timeouts; it carries out the protocol's actions (sends,
//! closes, the clock offset, model loads on every worker, frontends' regions
//! attached and probed, plans queued to the GPUs' pullers, readiness).

use super::channels::{send_counted, LoadJob, LoadSeq, Loaded, Queued, WorkerMsg, LOADS_MAX};
use super::metrics::batch_size_histogram;
use super::shared::Shared;
use crate::core::{Dur, GpuId, LatencyProfile, ModelId};
use crate::node::proto::backend::{Action, BackendProto, PlanMsg};
use crate::transport::{Conn, ConnId, Event, EventTx, ReadReq, Transport, PROBE_CAP, SLOT_HEADER};
use crate::wire::{ModelInfo, NodeId, RegionInfo};
use anyhow::{bail, Result};
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Probe pulls of a new frontend's region to measure the pull cost at
/// start-up, each of up to [`PROBE_BATCH`] inputs, together at most
/// [`PROBE_BYTES`] (what they read stays in the pool of input buffers).
const PROBE_READS: usize = 8;
const PROBE_BATCH: usize = 8;
const PROBE_BYTES: u64 = 64 << 20;

/// Inputs of `len` bytes per probe pull.
fn probe_batch(len: u64) -> usize {
    (PROBE_BYTES / (PROBE_READS as u64 * len.max(1))).clamp(1, PROBE_BATCH as u64) as usize
}

/// Longest wait of the network loop between looks at the stop flag.
const LOOP_WAIT_MAX: Dur = Dur(50_000_000);

/// What a dial of a frontend gave ([`NetLoop::redial`]): the frontend, its
/// address and the connection or why there is none.
type Dialled = (NodeId, String, std::result::Result<Arc<dyn Conn>, String>);

/// The network loop: the driver of [`BackendProto`] (connections, the OS clock,
/// the pullers and workers).
pub(super) struct NetLoop {
    pub(super) shared: Arc<Shared>,
    pub(super) transport: Arc<dyn Transport>,
    pub(super) events: EventTx,
    pub(super) proto: BackendProto,
    pub(super) pullers: Vec<Sender<Queued>>,
    pub(super) workers: Vec<Sender<WorkerMsg>>,
    /// Each GPU slot's loader (`None`: its worker loads).
    pub(super) loaders: Vec<Option<Sender<LoadJob>>>,
    /// Each model's latest load (or confirmation): only its results count.
    pub(super) load_seq: HashMap<ModelId, LoadSeq>,
    pub(super) next_load: LoadSeq,
    /// Frontend connections by id.
    pub(super) fe_conns: HashMap<ConnId, Arc<dyn Conn>>,
    pub(super) ready_tx: Option<Sender<Result<Vec<GpuId>, String>>>,
}

impl NetLoop {
    /// Runs the loop on its own thread until `stop` (a lost scheduler is
    /// rejoined, see [`BackendProto`]).
    pub(super) fn spawn(
        mut self,
        rx: Receiver<Event>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<Result<()>>> {
        std::thread::Builder::new()
            .name("backend-net".into())
            .spawn(move || {
                let r = self.run(rx, &stop);
                // The plan delays measured by the protocol, for the report.
                *self.shared.plan_delay.lock().expect("lock") = self.proto.plan_delays().clone();
                r
            })
    }

    fn run(&mut self, rx: Receiver<Event>, stop: &AtomicBool) -> Result<()> {
        let (ltx, lrx) = bounded::<Loaded>(LOADS_MAX);
        // Dials of frontends made off this thread ([`Action::Redial`]).
        let (dtx, drx) = crossbeam_channel::unbounded::<Dialled>();
        let local = self.shared.clock.local();
        while !stop.load(Ordering::Acquire) {
            self.apply(&ltx, &dtx)?;
            let wait = (self.proto.poll_timeout() - local.now()).clamp(Dur::ZERO, LOOP_WAIT_MAX);
            crossbeam_channel::select! {
                recv(rx) -> ev => match ev {
                    Ok(ev) => self.event(ev),
                    Err(_) => bail!("event channel closed"),
                },
                recv(lrx) -> r => {
                    // A result of a load that an unload or a later load
                    // overtook does not count.
                    let current = |(m, seq, _): &Loaded| self.load_seq.get(m) == Some(seq);
                    if let Some((model, _, res)) = r.ok().filter(current) {
                        // A model that cannot be loaded before the backend is
                        // in service is final: no rejoin would load it.
                        let fatal = match (&res, &self.ready_tx) {
                            (Err(e), Some(_)) => Some(e.clone()),
                            _ => None,
                        };
                        self.proto.handle_loaded(model, res);
                        if let Some(e) = fatal {
                            self.apply(&ltx, &dtx)?;
                            let why = format!("model {model} cannot be loaded: {e}");
                            tracing::error!(reason = %why, "backend: stopping");
                            if let Some(t) = self.ready_tx.take() {
                                let _ = t.send(Err(why.clone()));
                            }
                            bail!(why);
                        }
                    }
                }
                recv(drx) -> d => {
                    if let Ok((node, addr, dialled)) = d {
                        self.dialled(node, &addr, dialled);
                    }
                }
                default(Duration::from_nanos(wait.0 as u64)) => {}
            }
            let now = local.now();
            if now >= self.proto.poll_timeout() {
                let (fit, hold) = {
                    let e = self.shared.pull_est.lock().expect("lock");
                    (e.fit(), e.hold())
                };
                if let Some(fit) = fit {
                    self.proto.set_pull(fit, hold.unwrap_or_default());
                }
                self.proto.handle_timeout(now);
            }
        }
        Ok(())
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Accepted(c) => c.close("backends accept no connections"),
            Event::Closed(c, reason) => {
                self.forget(c);
                if self.shared.leaving.load(Ordering::Acquire) && self.proto.sched_conn() == Some(c)
                {
                    // We said goodbye; the loop is about to stop.
                    return;
                }
                let now = self.shared.clock.local().now();
                self.proto.handle_closed(now, c, &reason);
            }
            Event::Msg(c, msg) => {
                let now = self.shared.clock.local().now();
                self.proto.handle_msg(now, c, msg);
            }
        }
    }

    /// Carries out what the protocol asked for.
    fn apply(&mut self, ltx: &Sender<Loaded>, dials: &Sender<Dialled>) -> Result<()> {
        let refused = self.proto.counts().plans_refused;
        self.shared.plans_refused.store(refused, Ordering::Relaxed);
        while let Some(a) = self.proto.poll_action() {
            match a {
                Action::Send(c, m) => {
                    let conn = self.conn(c);
                    if let Some(conn) = conn {
                        let _ = conn.send(m);
                    }
                }
                Action::Close(c, why) => {
                    if let Some(conn) = self.conn(c) {
                        conn.close(&why);
                    }
                    self.forget(c);
                }
                Action::SetClock { offset, error } => self.shared.clock.set(offset.0, error.0),
                Action::Load(model, prof) => self.load(model, prof, ltx),
                Action::Confirm(model) => {
                    let seq = self.new_load(model);
                    for w in &self.workers {
                        let m = WorkerMsg::Confirm(model, seq, ltx.clone());
                        send_counted(w, m, &self.shared.channel_waits);
                    }
                }
                Action::Unload(model) => self.unload(model),
                Action::Attach {
                    node,
                    ctrl_addr,
                    region,
                } => self.attach(node, &ctrl_addr, &region),
                Action::Detach { node, conn } => self.detach(node, conn),
                Action::Redial { node, ctrl_addr } => self.redial(node, ctrl_addr, dials),
                Action::Queue { gpu, plan } => self.queue(gpu, plan),
                Action::Ready { gpus, away } => {
                    self.shared.in_service.store(true, Ordering::Release);
                    if let Some(away) = away {
                        self.shared.rejoins.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(away_ms = away.as_ms_f64(), gpus = ?gpus, "backend: back in service");
                    }
                    if let Some(t) = self.ready_tx.take() {
                        let _ = t.send(Ok(gpus));
                    }
                }
                Action::Drained => {
                    self.shared.drained.store(true, Ordering::Release);
                    tracing::info!("backend: drained (no plan will follow)");
                }
                Action::Lost(why) => {
                    self.shared.in_service.store(false, Ordering::Release);
                    // Plans queued so far are void (see `worker::void`).
                    self.shared.session.fetch_add(1, Ordering::AcqRel);
                    tracing::warn!(reason = %why, "backend: lost the scheduler; its plans are void, rejoining");
                }
                Action::Connect(addr) => self.reconnect(&addr),
            }
        }
        Ok(())
    }

    fn conn(&self, c: ConnId) -> Option<Arc<dyn Conn>> {
        let sched = self.shared.sched();
        if c == sched.id() {
            return Some(sched);
        }
        self.fe_conns.get(&c).cloned()
    }

    /// Opens a new connection to the scheduler at `addr` (the protocol lost the
    /// last one).
    fn reconnect(&mut self, addr: &str) {
        let now = self.shared.clock.local().now();
        match self.transport.connect(addr, self.events.clone()) {
            Ok(conn) => {
                let id = conn.id();
                *self.shared.sched.write().expect("lock") = conn;
                self.proto.handle_sched_connected(now, id);
            }
            Err(e) => self
                .proto
                .handle_sched_connect_failed(now, &format!("{e:#}")),
        }
    }

    /// Drops a frontend connection from the maps (the workers stop using it).
    fn forget(&mut self, c: ConnId) {
        if self.fe_conns.remove(&c).is_some() {
            self.shared
                .frontends
                .write()
                .expect("lock")
                .retain(|_, conn| conn.id() != c);
        }
    }

    fn load(&mut self, model: ModelInfo, prof: LatencyProfile, ltx: &Sender<Loaded>) {
        let sh = &self.shared;
        sh.profiles.write().expect("lock").insert(model.id, prof);
        let h = batch_size_histogram(sh, &model);
        sh.batch_sizes.write().expect("lock").insert(model.id, h);
        let seq = self.new_load(model.id);
        let sh = &self.shared;
        for (w, l) in self.workers.iter().zip(&self.loaders) {
            match l {
                None => {
                    let m = WorkerMsg::Load(model.clone(), seq, ltx.clone());
                    send_counted(w, m, &sh.channel_waits);
                }
                Some(l) => {
                    // The worker hears of the load first, so that an unload
                    // sent after it reaches the worker before its install.
                    send_counted(w, WorkerMsg::Loading(model.id, seq), &sh.channel_waits);
                    send_counted(l, (model.clone(), seq, ltx.clone()), &sh.channel_waits);
                }
            }
        }
    }

    /// Numbers a new load (or confirmation) of `model`: the results of the
    /// ones before it no longer count.
    fn new_load(&mut self, model: ModelId) -> LoadSeq {
        self.next_load += 1;
        self.load_seq.insert(model, self.next_load);
        self.next_load
    }

    fn unload(&mut self, model: ModelId) {
        self.load_seq.remove(&model);
        for w in &self.workers {
            send_counted(w, WorkerMsg::Unload(model), &self.shared.channel_waits);
        }
    }

    /// A plan for GPU `gpu` goes to its puller (or back to the protocol when the
    /// puller's queue is full).
    fn queue(&mut self, gpu: usize, plan: PlanMsg) {
        let session = self.shared.session.load(Ordering::Acquire);
        match self.pullers[gpu].try_send((session, plan)) {
            Ok(()) => {
                self.shared.plans_received.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full((_, plan))) => {
                let now = self.shared.clock.local().now();
                self.proto.handle_queue_full(now, plan);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    fn attach(&mut self, node: NodeId, ctrl_addr: &str, region: &RegionInfo) {
        match self.shared.reader.attach(node, region) {
            Err(e) => tracing::warn!(
                frontend = node,
                error = %format!("{e:#}"),
                "backend: cannot attach a frontend's region"
            ),
            Ok(()) => self.probe_pull(node, region.len),
        }
        match self.transport.connect(ctrl_addr, self.events.clone()) {
            Ok(conn) => self.adopt_frontend(node, conn),
            Err(e) => {
                tracing::warn!(frontend = node, addr = %ctrl_addr, error = %format!("{e:#}"), "backend: cannot reach a frontend")
            }
        }
    }

    /// `conn` is frontend `node`'s connection (the one before it, if any,
    /// closes): the workers send that frontend's outputs on it.
    fn adopt_frontend(&mut self, node: NodeId, conn: Arc<dyn Conn>) {
        let id = conn.id();
        self.fe_conns.insert(id, conn.clone());
        let old = self
            .shared
            .frontends
            .write()
            .expect("lock")
            .insert(node, conn);
        if let Some(old) = old {
            self.fe_conns.remove(&old.id());
            old.close("frontend reconnected");
        }
        self.proto.handle_connected(node, id);
    }

    /// Dials frontend `node` at `ctrl_addr` again on a thread of its own (a
    /// connect to a host that is gone takes its whole timeout, which this
    /// loop must not wait); the result comes back on `dials`.
    fn redial(&self, node: NodeId, ctrl_addr: String, dials: &Sender<Dialled>) {
        tracing::debug!(frontend = node, addr = %ctrl_addr, "backend: dialling a frontend again (its connection closed)");
        let (transport, events, tx) = (self.transport.clone(), self.events.clone(), dials.clone());
        let spawned = std::thread::Builder::new()
            .name("backend-dial".into())
            .spawn(move || {
                let r = transport
                    .connect(&ctrl_addr, events)
                    .map_err(|e| format!("{e:#}"));
                let _ = tx.send((node, ctrl_addr, r));
            });
        if let Err(e) = spawned {
            let _ = dials.send((node, String::new(), Err(format!("no thread to dial: {e}"))));
        }
    }

    /// A dial of frontend `node` ended: its connection is the frontend's
    /// while the protocol still wants it, else it is closed.
    fn dialled(&mut self, node: NodeId, addr: &str, r: std::result::Result<Arc<dyn Conn>, String>) {
        let now = self.shared.clock.local().now();
        match r {
            Ok(conn) if self.proto.wants_frontend(node) => {
                tracing::info!(frontend = node, addr = %addr, "backend: connected to the frontend again");
                self.adopt_frontend(node, conn);
            }
            Ok(conn) => conn.close("the frontend is down or was connected meanwhile"),
            Err(e) => {
                tracing::warn!(frontend = node, addr = %addr, error = %e, "backend: dialling a frontend again failed");
                self.proto.handle_frontend_dial_failed(now, node);
            }
        }
    }

    /// A frontend is down: its region is no longer read, its connection closes.
    fn detach(&mut self, node: NodeId, conn: Option<ConnId>) {
        self.shared.reader.detach(node);
        if let Some(c) = self.shared.frontends.write().expect("lock").remove(&node) {
            c.close("frontend down");
        }
        if let Some(c) = conn {
            self.fe_conns.remove(&c);
        }
    }

    /// Measures the pull cost from a new frontend at once (off this thread), so
    /// d_data is known before the first plans rather than learned from late
    /// ones. Each probe is a batch of reads of the largest input's size into
    /// the buffers the first pulls will have: the pool's (a stopped backend's
    /// in this process, see `pool.rs`), else fresh ones, so the provisional
    /// fit includes what a first touch of fresh pages costs where the first
    /// pulls pay it (a single read of the probes' zeros into a warm buffer
    /// ran from the caches, several times faster than a batch's pull, and the
    /// first batches overran it). The buffers then go to the pool, so the
    /// first batches pull into touched pages.
    fn probe_pull(&self, peer: NodeId, region_len: u64) {
        let len = (self.proto.max_input() as u64 + SLOT_HEADER as u64).min(region_len) as u32;
        let n = probe_batch(len as u64);
        let sh = self.shared.clone();
        let _ = std::thread::Builder::new()
            .name("pull-probe".into())
            .spawn(move || {
                let reqs = vec![
                    ReadReq {
                        peer,
                        offset: 0,
                        len,
                        // Zeros of the input's size: moves what a pull
                        // moves, reads no one's input.
                        cap: PROBE_CAP,
                    };
                    n
                ];
                for _ in 0..PROBE_READS {
                    let t0 = Instant::now();
                    let bufs = sh.spare_buffers(n);
                    let r = sh
                        .reader
                        .read_many_into(&reqs, Duration::from_secs(1), bufs);
                    let took = Dur::from_std(t0.elapsed());
                    let ok = r.iter().all(|r| r.is_ok());
                    sh.give_buffers(r.into_iter().flatten());
                    if !ok {
                        break;
                    }
                    sh.pull_est
                        .lock()
                        .expect("lock")
                        .probe(n as u64 * len as u64, took);
                }
            });
    }
}
