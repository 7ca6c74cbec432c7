//! [`BackendNode`], a running backend: start-up (the scheduler's connection, the
//! shared state and metrics, each GPU's executor, worker and puller, the network
//! loop's thread), readiness, and the ways it ends (stop, crash, join).

use super::channels::Queued;
use super::channels::{LoadJob, WorkerMsg, DISCARDS_MAX, LOADER_MAX, PLANS_MAX, WORKER_MAX};
use super::metrics::{
    register_copy_counters, register_counters, register_lanes, register_pull_counters,
    register_waits,
};
use super::net::NetLoop;
use super::options::BackendOpts;
use super::report::BackendReport;
use super::shared::Shared;
use super::{puller, worker};
use crate::core::{Dur, GpuId};
use crate::metrics::Registry;
use crate::node::clock::SchedClock;
use crate::node::exec::Prepared;
use crate::node::proto::backend::BackendProto;
use crate::runtime::clock::Clock;
use crate::transport::Transport;
use crate::wire::Msg;
use anyhow::{bail, Context, Result};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running backend.
pub struct BackendNode {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<Result<()>>>,
    ready: Receiver<Result<Vec<GpuId>, String>>,
    threads: Vec<JoinHandle<()>>,
}

/// Each GPU slot's channel to its puller and to its worker, and the threads.
struct GpuThreads {
    pullers: Vec<Sender<Queued>>,
    workers: Vec<Sender<WorkerMsg>>,
    /// Each slot's loader (`None`: its executor loads on the worker).
    loaders: Vec<Option<Sender<LoadJob>>>,
    threads: Vec<JoinHandle<()>>,
}

impl BackendNode {
    /// Connects to the scheduler, syncs the clock and registers; returns at once
    /// (see [`BackendNode::wait_ready`]).
    pub fn start(transport: Arc<dyn Transport>, opts: BackendOpts) -> Result<BackendNode> {
        if opts.gpus == 0 {
            bail!("a backend needs at least one GPU (--gpus)");
        }
        let lanes = opts.lane_map()?;
        let registry = Registry::new();
        let (tx, rx) = crate::node::event_channel(&registry, "backend");
        let (sched, addrs) =
            crate::node::connect_scheduler(&*transport, &opts.scheduler, tx.clone())
                .with_context(|| format!("cannot reach the scheduler at {}", opts.scheduler))?;
        let clock = SchedClock::exact(Clock::new());
        let reader = transport.reader()?;
        let shared = Arc::new(Shared::new(
            clock, sched, reader, registry, &opts.name, lanes,
        ));
        register_counters(&shared);
        register_lanes(&shared);
        register_waits(&shared);
        register_pull_counters(&shared);
        register_copy_counters(&shared);
        let gpus = spawn_gpus(&opts, &shared)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready) = bounded(1);
        let proto = BackendProto::new(
            shared.clock.local().now(),
            shared.sched().id(),
            addrs,
            opts.name.clone(),
            opts.gpu_infos(),
            Dur::from_std(opts.scheduler_timeout),
        );
        let lp = NetLoop {
            shared: shared.clone(),
            transport,
            events: tx,
            proto,
            pullers: gpus.pullers,
            workers: gpus.workers,
            loaders: gpus.loaders,
            load_seq: HashMap::new(),
            next_load: 0,
            fe_conns: HashMap::new(),
            ready_tx: Some(ready_tx),
        };
        let handle = lp.spawn(rx, stop.clone())?;
        Ok(BackendNode {
            stop,
            shared,
            handle: Some(handle),
            ready,
            threads: gpus.threads,
        })
    }

    /// Waits until the scheduler put the GPUs in service; returns their global
    /// ids. Fails at once when a model cannot be loaded (that is final: the
    /// backend has stopped), and when the process is asked to stop
    /// ([`crate::node::request_stop`]) meanwhile.
    pub fn wait_ready(&self, timeout: Duration) -> Result<Vec<GpuId>> {
        use crossbeam_channel::RecvTimeoutError;
        let end = std::time::Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.ready.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(Ok(ids)) => return Ok(ids),
                Ok(Err(e)) => bail!("backend registration failed: {e}"),
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("the backend stopped before it was in service")
                }
                Err(RecvTimeoutError::Timeout) => {
                    if crate::node::stop_requested() {
                        bail!("asked to stop before the backend was in service");
                    }
                    if left.is_zero() {
                        bail!("backend not registered within {timeout:?}");
                    }
                }
            }
        }
    }

    /// The backend's Prometheus metrics.
    pub fn metrics(&self) -> Arc<Registry> {
        self.shared.registry.clone()
    }

    /// Times the backend lost the scheduler and joined again.
    pub fn rejoins(&self) -> u64 {
        self.shared.rejoins.load(Ordering::Relaxed)
    }

    /// Plans received and not yet ended (pulling, waiting or running).
    pub fn plans_in_flight(&self) -> u64 {
        let s = &self.shared;
        s.plans_received
            .load(Ordering::Relaxed)
            .saturating_sub(s.plans_ended.load(Ordering::Relaxed))
    }

    /// Whether the network loop has ended (stopped; a lost scheduler is rejoined).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Stops: says goodbye to the scheduler, lets running batches finish.
    pub fn stop(mut self) -> BackendReport {
        self.shared.leaving.store(true, Ordering::Release);
        let _ = self.shared.sched().send(Msg::Unregister {
            reason: "backend stopping".into(),
        });
        self.finish()
    }

    /// Drains, then leaves: asks the scheduler to plan nothing more on this
    /// backend's GPUs (`Drain`; repeated every 500 ms until answered, so a
    /// scheduler that took over meanwhile hears it too), waits for `Drained`
    /// and for every plan received to end (its results pushed), then stops
    /// like [`Self::stop`]. No request fails for it. Gives up waiting after
    /// `timeout` and stops anyway; the second value says whether it drained.
    pub fn drain(self, reason: &str, timeout: Duration) -> (BackendReport, bool) {
        let t0 = Instant::now();
        let mut asked: Option<Instant> = None;
        let clean = loop {
            let drained = self.shared.drained.load(Ordering::Acquire);
            if drained && self.plans_in_flight() == 0 {
                break true;
            }
            // No scheduler to plan anything here (lost, rejoining): what it
            // had sent is void already; nothing to wait for.
            if !self.shared.in_service.load(Ordering::Acquire) {
                break self.plans_in_flight() == 0;
            }
            if t0.elapsed() >= timeout || self.is_finished() {
                break false;
            }
            if !drained && asked.is_none_or(|a| a.elapsed() >= Duration::from_millis(500)) {
                let _ = self.shared.sched().send(Msg::Drain {
                    reason: reason.to_string(),
                });
                asked = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if clean {
            tracing::info!(
                waited_ms = t0.elapsed().as_millis() as u64,
                "backend: drained; leaving"
            );
        } else {
            tracing::warn!(
                waited_ms = t0.elapsed().as_millis() as u64,
                in_flight = self.plans_in_flight(),
                "backend: not drained in time; leaving anyway"
            );
        }
        (self.stop(), clean)
    }

    /// Dies abruptly (for failure tests): every connection drops, nothing more is
    /// sent, no goodbye.
    pub fn crash(mut self) -> BackendReport {
        self.shared.dead.store(true, Ordering::Release);
        self.shared.sched().close("backend crashed");
        for c in self.shared.frontends.read().expect("lock").values() {
            c.close("backend crashed");
        }
        self.finish()
    }

    /// Runs until the network loop ends (its event channel closed; a lost
    /// scheduler does not end it: the backend rejoins).
    pub fn join(mut self) -> BackendReport {
        let mut r = match self.handle.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => Some(format!("{e:#}")),
            Some(Err(_)) => Some("the backend's network loop panicked".to_string()),
            _ => None,
        };
        let mut rep = self.finish();
        rep.error = r.take();
        rep
    }

    fn finish(&mut self) -> BackendReport {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.shared.dead.store(true, Ordering::Release);
        let rep = self.shared.report();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        rep
    }
}

impl Drop for BackendNode {
    fn drop(&mut self) {
        if self.handle.is_some() {
            self.finish();
        }
    }
}

/// Starts each GPU slot's executor, worker, loader and puller: one slot per GPU, or
/// with lanes one per lane, each with an executor of its own on its GPU (for
/// `cuda`: sessions of its own, each computing on a stream of its own).
fn spawn_gpus(opts: &BackendOpts, shared: &Arc<Shared>) -> Result<GpuThreads> {
    let mut t = GpuThreads {
        pullers: Vec::new(),
        workers: Vec::new(),
        loaders: Vec::new(),
        threads: Vec::new(),
    };
    let map = opts.lane_map()?;
    for slot in 0..map.slots() {
        let (g, l) = map.of(slot);
        let exec = (opts.executor)(g).with_context(|| {
            if map.lanes > 1 {
                format!("cannot start the executor of GPU {g} lane {l}")
            } else {
                format!("cannot start the executor of GPU {g}")
            }
        })?;
        let name = if map.lanes > 1 {
            format!("gpu{g}l{l}")
        } else {
            format!("gpu{g}")
        };
        let (wtx, wrx) = bounded::<WorkerMsg>(WORKER_MAX);
        let (ptx, prx) = bounded::<Queued>(PLANS_MAX);
        let (loader, discard) = match exec.loader() {
            None => (None, None),
            Some(loader) => {
                let (ltx, lrx) = bounded::<LoadJob>(LOADER_MAX);
                let (dtx, drx) = bounded::<Prepared>(DISCARDS_MAX);
                t.threads.push(worker::spawn_loader(
                    &name,
                    shared.clone(),
                    loader,
                    lrx,
                    drx,
                    wtx.clone(),
                )?);
                (Some(ltx), Some(dtx))
            }
        };
        t.loaders.push(loader);
        let stage = exec.stage_pool();
        t.threads.push(worker::spawn(
            &name,
            slot,
            shared.clone(),
            exec,
            wrx,
            discard,
        )?);
        t.threads.push(puller::spawn(
            &name,
            slot,
            shared.clone(),
            stage,
            prx,
            wtx.clone(),
        )?);
        t.pullers.push(ptx);
        t.workers.push(wtx);
    }
    Ok(t)
}
