//! In-process clients (the HTTP server of [`crate::node::http`]): a
//! [`FrontendHandle`] hands each request to the frontend's loop on a bounded
//! channel ([`LOCAL_MAX`]) and gets its [`InferDone`] back on a oneshot channel;
//! [`FrontendState`] is what the loop shares with the handles.

use super::metrics::queue_full_counter;
use super::stats::ModelStats;
use super::Ended;
use crate::core::Dur;
use crate::metrics::{Counter, Registry};
use crate::node::apps::ServedApp;
use crate::node::clock::Delays;
use crate::runtime::clock::Clock;
use crate::wire::{DropReason, ModelInfo};
use crossbeam_channel::{Sender, TrySendError};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Response-margin samples kept per model (bursts count once).
pub const MARGIN_SAMPLES_MAX: usize = 2048;

/// Most in-process requests (HTTP, gRPC) waiting for the frontend's loop; beyond,
/// a request is refused at once as dropped (overloaded) and counted in
/// `fermata_frontend_queue_full_total`.
pub const LOCAL_MAX: usize = 16_384;

/// The answer to an in-process request.
#[derive(Debug, Clone)]
pub struct InferDone {
    /// How it ended (its [`crate::core::Outcome`]: `ended.outcome()`).
    pub ended: Ended,
    pub output: Vec<u8>,
    /// Why it was not good (empty when it was).
    pub message: String,
    /// From the frontend's receipt to its answer.
    pub latency: Duration,
    /// From arrival to the batch's start (zero when it did not run).
    pub queue: Duration,
    /// Size of the batch it ran in (0 when it did not run).
    pub batch_size: u32,
    /// When its batch ended on the GPU, on this host's clock (None when it did
    /// not run): the client records its response margin from there
    /// ([`FrontendHandle::record_margin`]).
    pub finished_at: Option<Instant>,
    /// Its batch's run time on the GPU as the backend reported it (zero when
    /// it did not run): what the application re-planner compares with the
    /// model's profile.
    pub run: Duration,
}

impl InferDone {
    /// The answer to a request that never ran.
    pub(super) fn unserved(ended: Ended, message: String, latency: Duration) -> InferDone {
        InferDone {
            ended,
            output: Vec::new(),
            message,
            latency,
            queue: Duration::ZERO,
            batch_size: 0,
            finished_at: None,
            run: Duration::ZERO,
        }
    }
}

/// A request from an in-process client.
pub(super) struct LocalInfer {
    pub(super) model: String,
    pub(super) slo: Dur,
    /// The request's bytes (a view of the client's body where it could be).
    pub(super) input: bytes::Bytes,
    /// When the client's request began to arrive (its SLO runs from there).
    pub(super) received: Instant,
    /// When it was handed to the loop.
    pub(super) handed: Instant,
    pub(super) reply: tokio::sync::oneshot::Sender<InferDone>,
}

/// What a frontend shares with its in-process clients.
pub(super) struct FrontendState {
    models: Vec<ModelInfo>,
    /// The applications served over the models (ensembles).
    pub(super) apps: Vec<Arc<ServedApp>>,
    pub(super) sched_ok: AtomicBool,
    pub(super) gpus: AtomicU32,
    /// Times the frontend lost the scheduler and joined again.
    pub(super) rejoins: AtomicU64,
    registry: Arc<Registry>,
    tx: Sender<LocalInfer>,
    /// Requests refused because `tx` was full.
    local_full: Counter,
    /// The loop ended: requests are refused.
    pub(super) stopped: AtomicBool,
    /// Shutting down: readiness says no (requests are still served).
    pub(super) draining: AtomicBool,
    /// Per model (index): the measured response margins, from a batch's end on
    /// its GPU to the response handed to the client. Clients record them
    /// ([`FrontendHandle::record_margin`]), the loop reports their tail to the
    /// scheduler.
    pub(super) margins: Vec<Mutex<Delays>>,
    /// This host's clock, for the margins' burst grouping.
    clock: Clock,
    /// Per model (index): the in-process clients' statistics.
    stats: Vec<ModelStats>,
    /// The models' states under model control, and loads and unloads asked.
    pub(super) control: super::control::ControlShared,
}

impl FrontendState {
    /// The state of a frontend just registered: `models` served, `gpus` in
    /// service; in-process requests go to `tx`.
    pub(super) fn new(
        models: Vec<ModelInfo>,
        apps: Vec<Arc<ServedApp>>,
        gpus: u32,
        registry: Arc<Registry>,
        tx: Sender<LocalInfer>,
    ) -> FrontendState {
        FrontendState {
            control: super::control::ControlShared::new(models.len()),
            margins: (0..models.len())
                .map(|_| Mutex::new(Delays::new(MARGIN_SAMPLES_MAX)))
                .collect(),
            clock: Clock::new(),
            stats: models
                .iter()
                .map(|m| ModelStats::new(crate::node::exec::max_batch_of(m)))
                .collect(),
            models,
            apps,
            sched_ok: AtomicBool::new(true),
            gpus: AtomicU32::new(gpus),
            rejoins: AtomicU64::new(0),
            local_full: queue_full_counter(&registry),
            registry,
            tx,
            stopped: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        }
    }

    /// Records a response margin of model `model` (index).
    pub(super) fn record_margin(&self, model: usize, d: Duration) {
        if let Some(m) = self.margins.get(model) {
            let at = self.clock.now();
            m.lock()
                .expect("margins lock")
                .push(at, d.as_nanos().min(i64::MAX as u128) as i64);
        }
    }

    pub(super) fn scheduler_connected(&self) -> bool {
        self.sched_ok.load(Ordering::Relaxed) && !self.stopped.load(Ordering::Relaxed)
    }
}

/// The frontend stopped before it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

/// A handle on a running frontend for in-process clients (the HTTP server):
/// cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct FrontendHandle {
    pub(super) state: Arc<FrontendState>,
}

impl FrontendHandle {
    /// The models served (as the scheduler announced them).
    pub fn models(&self) -> &[ModelInfo] {
        &self.state.models
    }
    /// The applications served (ensembles over the models).
    pub fn apps(&self) -> &[Arc<ServedApp>] {
        &self.state.apps
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
        if self.state.draining.load(Ordering::Acquire) {
            return Err("the frontend is draining (shutting down)".into());
        }
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
    /// The response margin of model `model` (index in [`FrontendHandle::models`]):
    /// the time from its batch's end on the GPU (`done.finished_at`) to the
    /// response handed to the client. The scheduler reserves its tail in every
    /// plan of the model.
    pub fn record_margin(&self, model: usize, d: Duration) {
        self.state.record_margin(model, d);
    }

    /// Model `model`'s statistics (index in [`FrontendHandle::models`]).
    pub fn stats(&self, model: usize) -> Option<&ModelStats> {
        self.state.stats.get(model)
    }

    /// One request of model `model` (index) with these samples, each its own
    /// task, all handed over before any answer is awaited (so they wait
    /// together and may share batches); their answers in order. Each good
    /// sample is counted in the model's statistics; the caller records the
    /// response margins once its response is built
    /// ([`FrontendHandle::record_margins`]) and counts the request
    /// ([`ModelStats::request`]).
    pub async fn infer_samples(
        &self,
        model: usize,
        slo: Dur,
        samples: Vec<bytes::Bytes>,
        received: Instant,
    ) -> Result<Vec<InferDone>, Stopped> {
        let name = &self.state.models[model].name;
        let rxs: Vec<_> = samples
            .into_iter()
            .map(|s| self.infer(name, slo, s, received))
            .collect();
        let mut done = Vec::with_capacity(rxs.len());
        for rx in rxs {
            done.push(rx.await.map_err(|_| Stopped)?);
        }
        if let Some(stats) = self.stats(model) {
            for s in done.iter().filter(|s| s.ended == Ended::Good) {
                stats.sample(s.queue, s.latency.saturating_sub(s.queue), s.batch_size);
            }
        }
        Ok(done)
    }

    /// The response margin of every sample of `done` that ran (good or
    /// late), measured now: call it once the response is built.
    pub fn record_margins(&self, model: usize, done: &[InferDone]) {
        for f in done.iter().filter_map(|d| d.finished_at) {
            self.record_margin(model, f.elapsed());
        }
    }

    /// Hands one request to the frontend's loop; the answer comes on the returned
    /// receiver, exactly once (or the receiver errs if the frontend stopped first).
    /// An `slo` of zero means the model's default SLO; it runs from `received`,
    /// when the request's first byte was read.
    pub fn infer(
        &self,
        model: &str,
        slo: Dur,
        input: impl Into<bytes::Bytes>,
        received: Instant,
    ) -> tokio::sync::oneshot::Receiver<InferDone> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        if self.state.stopped.load(Ordering::Acquire) {
            return rx;
        }
        let l = LocalInfer {
            model: model.to_string(),
            slo,
            input: input.into(),
            received,
            handed: Instant::now(),
            reply,
        };
        if let Err(TrySendError::Full(l)) = self.state.tx.try_send(l) {
            // The loop is LOCAL_MAX requests behind: refuse at once, counted.
            self.state.local_full.inc();
            let _ = l.reply.send(InferDone::unserved(
                Ended::Dropped(DropReason::Overloaded),
                format!("the frontend is overloaded ({LOCAL_MAX} requests waiting for its loop)"),
                Duration::ZERO,
            ));
        }
        rx
    }
}
