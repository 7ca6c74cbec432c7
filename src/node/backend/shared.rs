//! What the backend's threads share ([`Shared`]): the scheduler's clock and
//! connection, the frontends' connections, the models' profiles, the region
//! reader, the counters and recent measurements, and the pool of input buffers
//! the pullers read into and the workers give back.

use super::lanes::{LaneBook, LaneMap};
use super::metrics::{
    pull_histograms, run_over_profile_histogram, start_delay_histogram, PullHistograms,
};
use super::pool::BufferPool;
use crate::core::{Dur, LatencyProfile, ModelId, PullEstimator};
use crate::metrics::{Histogram, Registry};
use crate::node::clock::{Recent, SchedClock};
use crate::node::proto::backend::{Input, Missing};
use crate::transport::{Conn, RegionReader};
use crate::wire::NodeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Recent batches the pull estimator fits.
const PULL_SAMPLES: usize = 512;

pub(super) struct Shared {
    pub(super) clock: SchedClock,
    /// The scheduler's connection (replaced when the backend rejoins).
    pub(super) sched: RwLock<Arc<dyn Conn>>,
    /// The scheduler session: counts the times the scheduler was lost, so
    /// plans of an earlier session are known void.
    pub(super) session: AtomicU64,
    /// Times the backend rejoined after losing the scheduler.
    pub(super) rejoins: AtomicU64,
    /// Plans void when they reached the worker (the scheduler was lost since).
    pub(super) plans_void: AtomicU64,
    pub(super) frontends: RwLock<HashMap<NodeId, Arc<dyn Conn>>>,
    pub(super) profiles: RwLock<HashMap<ModelId, LatencyProfile>>,
    pub(super) reader: Arc<dyn RegionReader>,
    /// Pull time per task (a batch's pull over its size), for the report.
    pub(super) pull: Mutex<Recent>,
    /// The pull cost per batch: fitted to every batch pulled (and the probes),
    /// reported to the scheduler in pings.
    pub(super) pull_est: Mutex<PullEstimator>,
    /// Recent batches' pull times, and the budgets predicted for them.
    pub(super) pull_batch: Mutex<Recent>,
    pub(super) pull_predicted: Mutex<Recent>,
    /// Batches pulled with a prediction in place, those whose pull took longer
    /// than predicted, and those whose inputs were in only after `exec_at`.
    pub(super) pulls: AtomicU64,
    pub(super) pulls_over: AtomicU64,
    pub(super) pulls_late: AtomicU64,
    /// Batches whose pull ran while their GPU slot ran the batch before (the
    /// pull ahead of the batch), and those of them whose inputs were in only
    /// after `exec_at`.
    pub(super) pulls_overlapped: AtomicU64,
    pub(super) pulls_overlapped_late: AtomicU64,
    /// Each GPU slot's batch edges: one more when a batch begins and when it
    /// ends (odd: the slot runs a batch now). A puller reads it before and
    /// after its pull to know whether the pull overlapped a batch.
    pub(super) slot_edges: Box<[AtomicU64]>,
    /// Input bytes copied on the backend: pulled into its buffers (payloads
    /// read), and copied again by an executor into a buffer of its own
    /// ([`Executor::copies_inputs`](crate::node::exec::Executor::copies_inputs)).
    pub(super) input_bytes_pulled: AtomicU64,
    pub(super) input_bytes_gathered: AtomicU64,
    pub(super) pull_hists: PullHistograms,
    /// One-way delay of plans (scheduler's send to our receipt, on the scheduler's
    /// clock; includes the clock offset's error).
    pub(super) plan_delay: Mutex<Recent>,
    pub(super) start_delay: Mutex<Recent>,
    /// Each batch's run (start to outputs) over its profile's latency for the
    /// tasks it ran, per mille.
    pub(super) run_over_profile: Mutex<Recent>,
    /// exec_at minus when the plan reached the backend, and minus when its inputs
    /// were in (negative: too late already).
    pub(super) lead_arrived: Mutex<Recent>,
    pub(super) lead_pulled: Mutex<Recent>,
    /// Set when the node stops or crashes: workers send nothing more.
    pub(super) dead: AtomicBool,
    /// Set when the backend said goodbye (`Unregister`): the scheduler's
    /// closing the connection then is no loss to rejoin from.
    pub(super) leaving: AtomicBool,
    /// Set when the scheduler answered our `Drain` with `Drained`.
    pub(super) drained: AtomicBool,
    /// Registered with a scheduler now (between `Ready` and `Lost`).
    pub(super) in_service: AtomicBool,
    /// Plans received, and plans done (run, too late or failed).
    pub(super) plans_received: AtomicU64,
    pub(super) plans_ended: AtomicU64,
    pub(super) plans_run: AtomicU64,
    pub(super) plans_too_late: AtomicU64,
    pub(super) tasks_too_late: AtomicU64,
    pub(super) plans_failed: AtomicU64,
    /// Plans refused by the protocol's checks or a full puller queue.
    pub(super) plans_refused: AtomicU64,
    /// Waits on a full internal channel (worker, load results).
    pub(super) channel_waits: AtomicU64,
    pub(super) tasks_run: AtomicU64,
    pub(super) tasks_failed: AtomicU64,
    /// Extra executor runs spent finding the requests that failed a batch.
    pub(super) isolate_reruns: AtomicU64,
    /// Missing inputs by reason: [timeout, stale slot, error] (counted when the
    /// pull ends).
    pub(super) missing_why: [AtomicU64; 3],
    /// Inputs a puller did not read: their tasks could no longer meet their
    /// deadlines when it came to the plan (dropped as too late).
    pub(super) inputs_skipped: AtomicU64,
    /// Input buffers of finished batches, reused by the pullers (see
    /// [`RegionReader::read_many_into`]).
    pool: BufferPool,
    pub(super) pool_misses: AtomicU64,
    pub(super) registry: Arc<Registry>,
    /// The backend's name (the metrics' `backend` label).
    pub(super) name: String,
    /// Batch sizes per model id (added when a model loads).
    pub(super) batch_sizes: RwLock<HashMap<ModelId, Arc<Histogram>>>,
    pub(super) start_delay_hist: Arc<Histogram>,
    pub(super) run_over_profile_hist: Arc<Histogram>,
    /// Which lanes run a batch now, and each GPU's most batches at once.
    pub(super) lanes: Mutex<LaneBook>,
}

impl Shared {
    pub(super) fn new(
        clock: SchedClock,
        sched: Arc<dyn Conn>,
        reader: Arc<dyn RegionReader>,
        registry: Arc<Registry>,
        name: &str,
        lanes: LaneMap,
    ) -> Shared {
        Shared {
            clock,
            sched: RwLock::new(sched),
            session: AtomicU64::new(0),
            rejoins: AtomicU64::new(0),
            plans_void: AtomicU64::new(0),
            frontends: RwLock::new(HashMap::new()),
            profiles: RwLock::new(HashMap::new()),
            reader,
            pull: Mutex::new(Recent::new(512)),
            pull_est: Mutex::new(PullEstimator::new(PULL_SAMPLES)),
            pull_batch: Mutex::new(Recent::new(2048)),
            pull_predicted: Mutex::new(Recent::new(2048)),
            pulls: AtomicU64::new(0),
            pulls_over: AtomicU64::new(0),
            pulls_late: AtomicU64::new(0),
            pulls_overlapped: AtomicU64::new(0),
            pulls_overlapped_late: AtomicU64::new(0),
            slot_edges: (0..lanes.slots()).map(|_| AtomicU64::new(0)).collect(),
            input_bytes_pulled: AtomicU64::new(0),
            input_bytes_gathered: AtomicU64::new(0),
            pull_hists: pull_histograms(&registry, name),
            plan_delay: Mutex::new(Recent::new(1024)),
            start_delay: Mutex::new(Recent::new(2048)),
            run_over_profile: Mutex::new(Recent::new(2048)),
            lead_arrived: Mutex::new(Recent::new(2048)),
            lead_pulled: Mutex::new(Recent::new(2048)),
            dead: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            drained: AtomicBool::new(false),
            in_service: AtomicBool::new(false),
            plans_received: AtomicU64::new(0),
            plans_ended: AtomicU64::new(0),
            plans_run: AtomicU64::new(0),
            plans_too_late: AtomicU64::new(0),
            tasks_too_late: AtomicU64::new(0),
            plans_failed: AtomicU64::new(0),
            plans_refused: AtomicU64::new(0),
            channel_waits: AtomicU64::new(0),
            tasks_run: AtomicU64::new(0),
            tasks_failed: AtomicU64::new(0),
            isolate_reruns: AtomicU64::new(0),
            missing_why: Default::default(),
            inputs_skipped: AtomicU64::new(0),
            pool: BufferPool::new(),
            pool_misses: AtomicU64::new(0),
            start_delay_hist: start_delay_histogram(&registry, name),
            run_over_profile_hist: run_over_profile_histogram(&registry, name),
            registry,
            name: name.to_string(),
            batch_sizes: RwLock::new(HashMap::new()),
            lanes: Mutex::new(LaneBook::new(lanes)),
        }
    }

    /// The scheduler's connection now.
    pub(super) fn sched(&self) -> Arc<dyn Conn> {
        self.sched.read().expect("lock").clone()
    }

    /// Whether a plan of `session` is still valid (the scheduler it came from
    /// was not lost since).
    pub(super) fn current(&self, session: u64) -> bool {
        self.session.load(Ordering::Acquire) == session
    }

    /// A batch of `n` inputs, `bytes` in all, took `took` to pull; `late`: its
    /// inputs were in only after its `exec_at`; `overlapped`: its GPU slot ran
    /// the batch before while it was pulled. Feeds the estimator, the
    /// histograms and the overrun and overlap counts.
    pub(super) fn observe_pull(
        &self,
        n: usize,
        bytes: u64,
        took: Dur,
        late: bool,
        overlapped: bool,
    ) {
        let (predicted, over) = {
            let mut e = self.pull_est.lock().expect("lock");
            let p = e.budget(bytes);
            (p, e.observe(bytes, took))
        };
        self.pull_batch.lock().expect("lock").push(took.0);
        self.pull_hists.observe(n, took, predicted);
        self.pulls_late.fetch_add(late as u64, Ordering::Relaxed);
        if overlapped {
            self.pulls_overlapped.fetch_add(1, Ordering::Relaxed);
            self.pulls_overlapped_late
                .fetch_add(late as u64, Ordering::Relaxed);
        }
        if let Some(p) = predicted {
            self.pull_predicted.lock().expect("lock").push(p.0);
            self.pulls.fetch_add(1, Ordering::Relaxed);
            self.pulls_over.fetch_add(over as u64, Ordering::Relaxed);
        }
    }

    /// Inputs that could not be pulled, whatever the reason.
    pub(super) fn inputs_missing(&self) -> u64 {
        self.missing_why
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }

    /// Up to `n` buffers from the pool to read inputs into (those it lacks are
    /// counted in `pool_misses`).
    pub(super) fn take_buffers(&self, n: usize) -> Vec<Vec<u8>> {
        let bufs = self.pool.take(n);
        self.pool_misses
            .fetch_add((n - bufs.len()) as u64, Ordering::Relaxed);
        bufs
    }

    /// Up to `n` buffers from the pool, not counted (the pull probes).
    pub(super) fn spare_buffers(&self, n: usize) -> Vec<Vec<u8>> {
        self.pool.take(n)
    }

    /// The inputs' buffers go back to the pullers (bounded in count and bytes).
    pub(super) fn recycle(&self, inputs: Vec<Result<Input, Missing>>) {
        self.give_buffers(
            inputs
                .into_iter()
                .flatten()
                .map(|i| i.slot)
                .filter(|b| b.capacity() > 0),
        );
    }

    /// Buffers for the pullers to read into (kept within the pool's bounds).
    pub(super) fn give_buffers(&self, bufs: impl IntoIterator<Item = Vec<u8>>) {
        self.pool.give(bufs);
    }
}
