//! In-process clients (the HTTP server of [`crate::node::http`]): a
//! [`FrontendHandle`] hands each request to the frontend's loop on a bounded
//! channel ([`LOCAL_MAX`]) and gets its [`InferDone`] back on a oneshot channel;
//! [`FrontendState`] is what the loop shares with the handles.

use super::metrics::queue_full_counter;
use super::Ended;
use crate::core::Dur;
use crate::metrics::{Counter, Registry};
use crate::wire::{DropReason, ModelInfo};
use crossbeam_channel::{Sender, TrySendError};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
        }
    }
}

/// A request from an in-process client.
pub(super) struct LocalInfer {
    pub(super) model: String,
    pub(super) slo: Dur,
    pub(super) input: Vec<u8>,
    pub(super) reply: tokio::sync::oneshot::Sender<InferDone>,
}

/// What a frontend shares with its in-process clients.
pub(super) struct FrontendState {
    models: Vec<ModelInfo>,
    pub(super) sched_ok: AtomicBool,
    pub(super) gpus: AtomicU32,
    registry: Arc<Registry>,
    tx: Sender<LocalInfer>,
    /// Requests refused because `tx` was full.
    local_full: Arc<Counter>,
    /// The loop ended: requests are refused.
    pub(super) stopped: AtomicBool,
}

impl FrontendState {
    /// The state of a frontend just registered: `models` served, `gpus` in
    /// service; in-process requests go to `tx`.
    pub(super) fn new(
        models: Vec<ModelInfo>,
        gpus: u32,
        registry: Arc<Registry>,
        tx: Sender<LocalInfer>,
    ) -> FrontendState {
        FrontendState {
            models,
            sched_ok: AtomicBool::new(true),
            gpus: AtomicU32::new(gpus),
            local_full: queue_full_counter(&registry),
            registry,
            tx,
            stopped: AtomicBool::new(false),
        }
    }

    pub(super) fn scheduler_connected(&self) -> bool {
        self.sched_ok.load(Ordering::Relaxed) && !self.stopped.load(Ordering::Relaxed)
    }
}

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
    /// An `slo` of zero means the model's default SLO.
    pub fn infer(
        &self,
        model: &str,
        slo: Dur,
        input: Vec<u8>,
    ) -> tokio::sync::oneshot::Receiver<InferDone> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        if self.state.stopped.load(Ordering::Acquire) {
            return rx;
        }
        let l = LocalInfer {
            model: model.to_string(),
            slo,
            input,
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
