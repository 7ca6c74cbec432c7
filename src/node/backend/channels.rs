//! The bounded channels between the backend's threads: what goes on them, how
//! deep they are, and [`send_counted`], which waits on a full one and counts the
//! wait.

use crate::node::exec::stage::Staged;
use crate::node::exec::Prepared;
use crate::node::proto::backend::{Input, Missing, PlanMsg};
use crate::wire::{ModelId, ModelInfo};
use crossbeam_channel::{Sender, TrySendError};
use std::sync::atomic::{AtomicU64, Ordering};

/// Most plans waiting for a GPU's puller; beyond, a plan is refused (its tasks
/// fail, the scheduler hears `PlanDone{Failed}`), counted as `refused`.
pub(super) const PLANS_MAX: usize = 1024;
/// Most messages waiting for a GPU's worker (pulled plans, loads); beyond, the
/// sender waits, counted in `fermata_backend_channel_waits_total`.
pub(super) const WORKER_MAX: usize = 1024;
/// Most loads waiting for a GPU's loader; beyond, the sender waits (counted as
/// above).
pub(super) const LOADER_MAX: usize = 64;
/// Most unloaded models waiting for a GPU's loader to free them; beyond, the
/// worker frees one itself.
pub(super) const DISCARDS_MAX: usize = 16;
/// Most load results waiting for the network loop; beyond, the worker waits
/// (counted as above).
pub(super) const LOADS_MAX: usize = 256;

/// What a GPU's worker is asked to do.
pub(super) enum WorkerMsg {
    /// Load on the worker (an executor without a [`Loader`](crate::node::exec::Loader)).
    Load(ModelInfo, LoadSeq, Sender<Loaded>),
    /// The GPU's loader began this load: its [`WorkerMsg::Install`] is
    /// installed unless an unload or a later load of the model comes first.
    Loading(ModelId, LoadSeq),
    /// What the GPU's loader made of a load.
    Install(ModelInfo, LoadSeq, Result<Prepared, String>, Sender<Loaded>),
    /// Answer that the model is loaded once the worker is free (a rejoin).
    Confirm(ModelId, LoadSeq, Sender<Loaded>),
    Unload(ModelId),
    /// A pulled plan: its inputs (an error: why it could not be read), and the staged
    /// buffer they were pulled into, if any (their `Input`s then hold only
    /// their lengths: the bytes are the buffer's rows, one per task).
    Run(
        Session,
        PlanMsg,
        Vec<Result<Input, Missing>>,
        Option<Staged>,
    ),
}

/// Numbers the backend's loads: a result that is not of a model's latest
/// load (an unload or a new load came since) is not counted.
pub(super) type LoadSeq = u64;

/// A load for a GPU's loader thread.
pub(super) type LoadJob = (ModelInfo, LoadSeq, Sender<Loaded>);

/// The scheduler session a plan came in: a plan of an earlier session (the
/// scheduler was lost since) is void and not run.
pub(super) type Session = u64;

/// A plan of `Session` for a puller.
pub(super) type Queued = (Session, PlanMsg);

/// A plan with its inputs pulled (an error: why it could not be read), as in
/// [`WorkerMsg::Run`].
pub(super) type Pulled = (
    Session,
    PlanMsg,
    Vec<Result<Input, Missing>>,
    Option<Staged>,
);

/// A GPU's load result: (model, which load, its device footprint or the error).
pub(super) type Loaded = (ModelId, LoadSeq, Result<Option<u64>, String>);

/// Sends on a bounded channel, waiting when it is full (the wait counted in
/// `waits`); false when the receiver is gone.
pub(super) fn send_counted<T>(tx: &Sender<T>, v: T, waits: &AtomicU64) -> bool {
    match tx.try_send(v) {
        Ok(()) => true,
        Err(TrySendError::Disconnected(_)) => false,
        Err(TrySendError::Full(v)) => {
            waits.fetch_add(1, Ordering::Relaxed);
            tx.send(v).is_ok()
        }
    }
}
