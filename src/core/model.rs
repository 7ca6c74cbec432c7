//! Per-model state: the deadline-ordered queue, batch gathering and the candidate
//! {batch, exec_at, latest} of Algorithm 1 (with the network-delay terms of
//! Appendix D). This is what a ModelThread owns; it never touches GPU state other
//! than the one free time it is granted.

use super::ids::{ModelId, TaskId};
use super::policy::{Gather, NetBudget, Policy};
use super::profile::LatencyProfile;
use super::time::{Dur, Time};
use std::collections::VecDeque;

/// One request as the scheduler sees it (the input bytes stay at the frontend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    pub id: TaskId,
    /// When the request reached the frontend.
    pub arrival: Time,
    /// When its result must be back at the frontend (arrival + SLO).
    pub deadline: Time,
    /// Opaque to the scheduler; rides into the plan. The distributed runtime keeps
    /// the input's location in its frontend's region here (0 elsewhere).
    pub tag: u64,
    /// Opaque too, and rides into the plan alongside `tag`: the distributed
    /// runtime's per-task read capability (0 elsewhere).
    pub cap: u64,
}

/// A model as configured.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub name: String,
    pub profile: LatencyProfile,
    pub slo: Dur,
}

/// The candidate batch of a model: the first `bs` tasks of its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub bs: u32,
    /// When the batch should start on the GPU.
    pub exec_at: Time,
    /// The last moment the batch can start and still meet the head's deadline.
    pub latest: Time,
    /// When the plan must leave the scheduler: exec_at - delay(bs).
    pub send_at: Time,
    /// How much earlier than `latest` the ranker ranks it: zero but under
    /// `deferred`, where it follows the model's recent losses
    /// ([`LOSS_RANK_PER_PERCENT`]).
    pub bias: Dur,
}

/// How `exec_at` is derived from the batch (Algorithm 1 line 5 and its variants).
#[derive(Debug, Clone, Copy, PartialEq)]
enum ExecRule {
    /// The frontrun moment; `pays`: only while waiting pays (see
    /// [`ModelState::waiting_pays`]).
    Frontrun {
        pays: bool,
    },
    Eager,
    Timeout(Dur),
}

/// Deferred: a batch expected to grow by fewer requests (clumps, under bursty
/// arrivals) than this before its frontrun moment starts at once: low-rate models
/// stop waiting for requests that will not come, and for the risk of finding the
/// GPUs busy then. With Poisson arrivals (of requests, or of clumps) the chance
/// that nothing at all comes while the batch waits is e^-3, about 5%. At 2 (14%)
/// deferred lost 0.4-3% of goodput to eager on the bursty workloads of
/// `configs/workloads/` (default seeds); at 3 it gained 0.1-1.7% on five of the
/// eight workloads and on the three-seed means it is within 0.7% of eager on
/// every bursty workload and ahead on the Poisson ones
/// (`fermata bench compare --workloads configs/workloads --seeds 3`).
pub const MIN_GROWTH: f64 = 3.0;

/// Deferred: arrivals more clumped than this (index of dispersion of the
/// requests per rate tick; 1 for Poisson) never make a batch wait. A clump's
/// requests come together, so the batch already holds what the clump brought,
/// and what waiting can add is a whole next clump, whose time is the least
/// predictable thing about the arrivals: holding batches for it left deferred
/// 0.7% of goodput behind eager on the bursty workloads of `configs/workloads/`
/// (ten-seed means, `fermata bench compare --seeds 10`; 2 and 3 of 10 seeds
/// won on two of them). With the rule it is at or above eager on every
/// workload there (lowest ratio 1.0001); Poisson workloads are unchanged (their
/// dispersion estimates stay near 1). At 2, a Poisson model's noisy estimate
/// sometimes crossed it (ResNet50's mean fell by 0.1%).
pub const DISPERSION_NO_WAIT: f64 = 4.0;

/// Deferred on one GPU: how many standard errors of the measured rate above
/// it the rate is taken when asking whether the GPU may be full
/// ([`ModelState::lone_gpu_full`]). With three, a model past capacity is judged
/// full on all but about 0.1% of its rate ticks.
pub const LONE_GPU_SIGMAS: f64 = 3.0;

/// Deferred: the ranker ranks a model's candidate this much ahead of its
/// latest start per 1% of the model's recent requests lost at the head of its
/// queue (dropped early or expired) past [`LOSS_RANK_FROM`], counted up to
/// [`LOSS_RANK_CAP`] percent ([`ModelState::loss_bias`]).
///
/// Goodput counts only while every model stays within 1% bad, but ranking by
/// latest start alone lets the losses near capacity fall on a few models:
/// with 30 models of a Zipf 0.9 mix on 48 GPUs at 38,972 r/s (seed 1) the
/// 6th to 11th most popular lost 0.5-1.0% of their requests while the two most
/// popular and two of the least lost none. A millisecond or two of rank for the
/// models that near 1% spreads the losses (there: the worst model 0.60%
/// against 0.98%, all models 0.260% as before), and the cluster carries more
/// before any model passes 1%.
///
/// The bias is a time, not a share of each model's SLO: the ranking compares
/// the latest starts of models whatever their SLOs, and at a share (5% of the
/// SLO per 1%) a100_mixed, whose 37 models' SLOs differ, gave up 0.27% of
/// goodput (ten seeds). The measurements behind the three settings are in
/// docs/results.md.
pub const LOSS_RANK_PER_PERCENT: Dur = Dur(2_000_000);

/// The share of its requests, in percent, a model loses before its losses
/// move its rank: half the 1% goal. Every departure from ranking by latest
/// start costs some expiries of its own, and below this the losses are the
/// noise of a model well within its goal. Counted from zero, the 37 models of
/// a100_mixed (equal popularity, losses near capacity 0.0-0.5% each) gave up
/// 0.25% of goodput, and near capacity the feedback (a model that loses is
/// ranked ahead, the others then lose more) left 0.87% bad where ranking by
/// latest start alone left 0.30%.
pub const LOSS_RANK_FROM: f64 = 0.5;

/// The most percent of lost requests [`LOSS_RANK_PER_PERCENT`] counts: a
/// model past it ranks no further ahead, so a model flooded past its share
/// takes no more rank than one that loses 2%, and where every model loses
/// that much the ranking is by latest start again.
pub const LOSS_RANK_CAP: f64 = 2.0;

/// The requests of a model over which its losses are counted: both counts
/// halve when it has queued this many. Measured with the bias at 5% of the
/// SLO per 1%, three seeds: a quarter of it followed the noise of the
/// arrivals (1080ti_mixed10 fell below eager); four times it gained on some
/// files and lost on others.
pub const LOSS_WINDOW: u32 = 4000;

/// Requests a model has queued before its losses move its rank.
pub const LOSS_MIN_SEEN: u32 = 100;

/// Per-model scheduling state.
#[derive(Debug, Clone)]
pub struct ModelState {
    pub id: ModelId,
    pub spec: ModelSpec,
    queue: VecDeque<Task>,
    queue_max: usize,
    max_batch: u32,
    rule: ExecRule,
    gather: Gather,
    window: u32,
    pow2: bool,
    net: NetBudget,
    pub cand: Option<Candidate>,
    /// Measured arrival rate (r/s), set by the dispatcher's rate estimator.
    rate_rps: f64,
    /// The model's share of the GPUs in service (GPUs), set with the rate.
    share: f64,
    /// GPUs in service in the model's sub-cluster (see
    /// [`ModelState::lone_gpu_full`]).
    gpus: f64,
    /// The standard error of the measured rate (r/s).
    rate_se: f64,
    /// The measured response margin (from a batch's end on its GPU to its
    /// results handed to the clients); the budget for results is the larger of
    /// it and `net.resp`.
    margin: Dur,
    /// Index of dispersion of the arrivals (variance over mean of the requests per
    /// rate tick): 1 for Poisson arrivals, the mean clump size of bursty ones.
    dispersion: f64,
    /// Deferred: a batch runs at once when running it now rather than at its
    /// frontrun moment costs at most this fraction of the model's spare GPU time
    /// ([`DispatcherConfig::eager_cost_max`](super::DispatcherConfig::eager_cost_max)).
    pub eager_cost_max: f64,
    /// The profile the model was given, and the factor `spec.profile` is it
    /// times ([`ModelState::set_latency_scale`]; 1 until measured otherwise).
    base_profile: LatencyProfile,
    latency_scale: f64,
    /// Requests queued and requests lost at the head (dropped or expired)
    /// over about the last [`LOSS_WINDOW`] queued: both halve together.
    recent_seen: u32,
    recent_lost: u32,
}

/// How a request ended, as its client sees it: every request ends exactly once,
/// in one of these four. The one end-of-request type of the whole system: the
/// wire's `InferReply` carries it, the frontend's finer [`Ended`] maps onto it
/// ([`Ended::outcome`]), and the harness and the reports count by it.
///
/// [`Ended`]: crate::node::proto::ledger::Ended
/// [`Ended::outcome`]: crate::node::proto::ledger::Ended::outcome
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Output within the deadline.
    Good,
    /// Output, but after the deadline.
    Late,
    /// Dropped by the scheduler or a backend (could not meet its deadline,
    /// overload...).
    Dropped,
    /// Failed (backend lost, input missing, executor error, bad request).
    Failed,
}

/// Why a request was dropped: the one drop reason of the whole
/// system. The core produces the first six; the nodes add those only they can
/// see (a batch too late on its backend, a backend lost, an unknown model, no
/// GPU in service). The wire carries it as is (its tag is [`DropReason::index`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// It could no longer finish by its deadline (lazy drop).
    Expired,
    /// Skipped so that a full window could run (early drop).
    EarlyDrop,
    /// The model's queue was at `queue_max`.
    QueueFull,
    /// Its model was removed.
    ModelRemoved,
    /// The scheduler's input channel was full (overload): refused at the door.
    Overloaded,
    /// The scheduler shut down before the request could be scheduled.
    Shutdown,
    /// The plan could not start in time on its backend.
    TooLate,
    /// The backend running it was lost.
    BackendLost,
    /// The model is unknown to the scheduler.
    UnknownModel,
    /// No GPU was in service when the task arrived: nothing could run it.
    NoGpu,
}

impl DropReason {
    /// Every reason, in declaration (and wire-tag) order: `ALL[r.index()] == r`.
    pub const ALL: [DropReason; 10] = [
        DropReason::Expired,
        DropReason::EarlyDrop,
        DropReason::QueueFull,
        DropReason::ModelRemoved,
        DropReason::Overloaded,
        DropReason::Shutdown,
        DropReason::TooLate,
        DropReason::BackendLost,
        DropReason::UnknownModel,
        DropReason::NoGpu,
    ];
    /// Its position in [`DropReason::ALL`].
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }
}

impl ModelState {
    pub fn new(
        id: ModelId,
        spec: ModelSpec,
        policy: Policy,
        gather: Gather,
        net: NetBudget,
        queue_max: usize,
    ) -> ModelState {
        let rule = match policy {
            Policy::Deferred => ExecRule::Frontrun { pays: true },
            Policy::Symphony => ExecRule::Frontrun { pays: false },
            Policy::Timeout { frac } => ExecRule::Timeout(Dur((spec.slo.0 as f64 * frac) as i64)),
            _ => ExecRule::Eager,
        };
        let max_batch = spec.profile.max_batch();
        let base_profile = spec.profile.clone();
        let window = Self::window_of(&spec, gather, max_batch);
        ModelState {
            id,
            spec,
            queue: VecDeque::new(),
            queue_max: queue_max.max(1),
            max_batch,
            rule,
            gather,
            window,
            pow2: matches!(policy, Policy::Clockwork { .. }),
            net,
            cand: None,
            rate_rps: 0.0,
            share: 0.0,
            gpus: 0.0,
            rate_se: 0.0,
            margin: Dur::ZERO,
            dispersion: 1.0,
            eager_cost_max: 0.0,
            base_profile,
            latency_scale: 1.0,
            recent_seen: 0,
            recent_lost: 0,
        }
    }

    /// The early-drop window before any rate is measured.
    fn window_of(spec: &ModelSpec, gather: Gather, max_batch: u32) -> u32 {
        match gather {
            Gather::Lazy | Gather::Adaptive => 1,
            Gather::EarlyDrop { window: Some(w) } => w.min(max_batch),
            Gather::EarlyDrop { window: None } => spec
                .profile
                .max_batch_within(Dur(spec.slo.0 / 2), Dur::ZERO, max_batch)
                .max(1),
        }
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }
    pub fn queue(&self) -> &VecDeque<Task> {
        &self.queue
    }
    pub fn max_batch(&self) -> u32 {
        self.max_batch
    }
    pub fn delay(&self, bs: u32) -> Dur {
        self.net.delay(bs)
    }
    /// What the pull of a batch of `bs` holds its GPU's puller.
    pub fn hold(&self, bs: u32) -> Dur {
        self.net.hold(bs)
    }
    pub fn window(&self) -> u32 {
        self.window
    }
    pub fn gather(&self) -> Gather {
        self.gather
    }

    /// Changes the network budget (measured delays); the candidate follows at the
    /// model's next event.
    pub fn set_net(&mut self, net: NetBudget) {
        self.net = net;
    }

    /// Sets the model's measured response margin: the time from a batch's end on
    /// its GPU to its results in the clients' hands (the frontends measure it,
    /// per model: it grows with the output's size). Every plan reserves the
    /// larger of it and the network's `resp`, so a request the core counts good
    /// is good at the client. The candidate follows at the model's next event.
    pub fn set_margin(&mut self, margin: Dur) {
        self.margin = margin.max(Dur::ZERO);
    }

    /// Plans the model with its given profile times `k` from now on (the
    /// scheduler measures how much slower than profiled its batches really
    /// run; see [`crate::node::proto::latency_scale`]): every l(b) the model's
    /// candidates, windows and GPU bookings use is the scaled one. `k` is
    /// clamped to [1/16, 16]; one that is not finite leaves the scale as it is.
    /// The candidate follows at the model's next event.
    pub fn set_latency_scale(&mut self, k: f64) {
        if !k.is_finite() {
            return;
        }
        let k = k.clamp(1.0 / 16.0, 16.0);
        if k == self.latency_scale {
            return;
        }
        self.latency_scale = k;
        self.spec.profile = if k == 1.0 {
            self.base_profile.clone()
        } else {
            self.base_profile.scaled(k)
        };
        if let Gather::EarlyDrop { window: None } = self.gather {
            self.window = Self::window_of(&self.spec, self.gather, self.max_batch);
        }
    }

    /// The factor the model's profile is planned with (1: as given).
    pub fn latency_scale(&self) -> f64 {
        self.latency_scale
    }

    /// The time reserved between a batch's end and its head's deadline.
    #[inline]
    pub fn resp(&self) -> Dur {
        self.net.resp.max(self.margin)
    }

    /// Takes the arrivals' index of dispersion (see [`ModelState::waiting_pays`]).
    pub fn observe_dispersion(&mut self, dispersion: f64) {
        self.dispersion = if dispersion.is_finite() {
            dispersion.max(1.0)
        } else {
            1.0
        };
    }

    /// Takes the model's measured rate and GPU share. The rate drives deferred's
    /// "defer only when it pays" rule; under adaptive gathering it also sets the
    /// early-drop window: the smallest batch b with b / l(b) >= rate / gpus,
    /// capped by the staggered batch of Symphony's equation (1):
    /// (1 + 1/N) l(b) <= SLO.
    pub fn observe_rate(&mut self, rate_rps: f64, gpus: f64) {
        self.rate_rps = rate_rps;
        self.share = gpus;
        if self.gather != Gather::Adaptive {
            return;
        }
        let cap = self.staggered_cap(gpus);
        let need = if gpus > 0.0 {
            rate_rps / gpus
        } else {
            f64::INFINITY
        };
        let thr = |b: u32| self.carried_rps(b);
        // Throughput b / l(b) is non-decreasing in b for linear and sane tables,
        // and so is b / pace(b) for a pace with a fixed part.
        let (mut lo, mut hi) = (1u32, cap);
        if thr(cap) < need {
            self.window = cap;
            return;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if thr(mid) >= need {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        self.window = lo;
    }

    /// What one GPU carries in batches of `b` (requests per second): a batch
    /// every l(b), or at its puller's pace where the puller takes longer to
    /// pull one ([`NetBudget::pace`]).
    fn carried_rps(&self, b: u32) -> f64 {
        let l = self.spec.profile.latency(b).max(self.net.pace(b));
        b as f64 / l.as_secs_f64()
    }

    /// Takes the GPUs in service in the model's sub-cluster and the standard
    /// error of the measured rate (the shard's estimator; see
    /// [`ModelState::lone_gpu_full`]).
    pub fn observe_cluster(&mut self, gpus_in_service: f64, rate_se: f64) {
        self.gpus = gpus_in_service;
        self.rate_se = if rate_se.is_finite() {
            rate_se.max(0.0)
        } else {
            0.0
        };
    }

    /// The largest batch of the staggered schedule on `n` GPUs (Symphony's
    /// equation (1)): l(b) + data_us * b <= (SLO - resp - ctrl) * n / (n + 1).
    fn staggered_cap(&self, n: f64) -> u32 {
        let n = n.max(1.0);
        let budget = Dur(
            ((self.spec.slo - self.resp() - self.net.ctrl - self.net.data_fixed).0 as f64 * n
                / (n + 1.0)) as i64,
        );
        self.spec
            .profile
            .max_batch_within(budget, self.net.data_per_req, self.max_batch)
            .max(1)
    }

    /// Adds a task in deadline order. Returns false (and keeps nothing) when the queue
    /// is at its limit.
    pub fn enqueue(&mut self, t: Task) -> bool {
        if self.queue.len() >= self.queue_max {
            return false;
        }
        match self.queue.back() {
            Some(b) if b.deadline > t.deadline => {
                let pos = self.queue.partition_point(|q| q.deadline <= t.deadline);
                self.queue.insert(pos, t);
            }
            _ => self.queue.push_back(t),
        }
        self.recent_seen += 1;
        if self.recent_seen >= LOSS_WINDOW {
            self.recent_seen /= 2;
            self.recent_lost /= 2;
        }
        true
    }

    /// Deferred: how much earlier than its latest start the ranker ranks this
    /// model's candidate, [`LOSS_RANK_PER_PERCENT`] per 1% of its recent
    /// requests lost at the head past [`LOSS_RANK_FROM`], counted up to
    /// [`LOSS_RANK_CAP`] percent (zero before [`LOSS_MIN_SEEN`] requests, and
    /// under every other policy).
    pub fn loss_bias(&self) -> Dur {
        if !matches!(self.rule, ExecRule::Frontrun { pays: true })
            || self.recent_seen < LOSS_MIN_SEEN
        {
            return Dur::ZERO;
        }
        let percent = 100.0 * self.recent_lost as f64 / self.recent_seen as f64;
        let above = (percent.min(LOSS_RANK_CAP) - LOSS_RANK_FROM).max(0.0);
        Dur((LOSS_RANK_PER_PERCENT.0 as f64 * above) as i64)
    }

    /// Puts preempted tasks back (ignores the queue limit: they were admitted before).
    pub fn requeue(&mut self, tasks: &[Task]) {
        for &t in tasks {
            let pos = self.queue.partition_point(|q| q.deadline <= t.deadline);
            self.queue.insert(pos, t);
        }
    }

    /// Removes every queued task (model removal).
    pub fn drain(&mut self) -> Vec<Task> {
        self.cand = None;
        self.queue.drain(..).collect()
    }

    /// Removes and returns the first `bs` tasks.
    pub fn take(&mut self, bs: u32) -> Vec<Task> {
        let bs = (bs as usize).min(self.queue.len());
        self.queue.drain(..bs).collect()
    }

    /// The deadline by which the batch must finish on the GPU.
    #[inline]
    fn finish_by(&self, t: &Task) -> Time {
        t.deadline - self.resp()
    }

    /// GetBatch + UpdateCandidate. `gpu_free` is the free time of a GPU that has been
    /// granted (None: any GPU, as early as the network allows). Tasks that cannot be
    /// served are removed and handed to `on_drop`. Sets and returns `self.cand`.
    pub fn update(
        &mut self,
        now: Time,
        gpu_free: Option<Time>,
        on_drop: &mut impl FnMut(Task, DropReason),
    ) -> Option<Candidate> {
        self.update_for(now, gpu_free, false, on_drop)
    }

    /// [`ModelState::update`]; `at_once`: the batch starts at its earliest
    /// moment whatever the rule (a GPU granted while the candidate waited, which
    /// would idle otherwise).
    pub fn update_for(
        &mut self,
        now: Time,
        gpu_free: Option<Time>,
        at_once: bool,
        on_drop: &mut impl FnMut(Task, DropReason),
    ) -> Option<Candidate> {
        let floor = gpu_free.unwrap_or(Time::EPOCH_MIN);
        let start = |s: &Self, b: u32| (now + s.net.delay(b)).max(floor);
        let prof = &self.spec.profile;
        // 1. Drop from the head.
        loop {
            let Some(head) = self.queue.front() else {
                self.cand = None;
                return None;
            };
            let d = self.finish_by(head);
            let (w, reason) = match self.gather {
                Gather::Lazy => (1, DropReason::Expired),
                // Adaptive early drop skips the head only when the requests behind it
                // can still fill a whole window. With a window or fewer queued,
                // dropping the head cannot make the next batch any larger: it only
                // loses the head (the batch that keeps it is as large as the one
                // without it). Such a queue is gathered lazily. This matters most for
                // the low-rate models of a bursty mix: without it, every alpha a
                // waiting candidate spent in a saturated cluster cost its model a
                // request, while a busy model merely shrank its batch.
                Gather::Adaptive if self.queue.len() <= self.window as usize => {
                    (1, DropReason::Expired)
                }
                Gather::EarlyDrop { .. } | Gather::Adaptive => (
                    (self.window as usize).min(self.queue.len()) as u32,
                    DropReason::EarlyDrop,
                ),
            };
            if start(self, w) + prof.latency(w) <= d {
                break;
            }
            // A request that could not run even alone is expired, whatever the rule.
            let reason = if start(self, 1) + prof.latency(1) > d {
                DropReason::Expired
            } else {
                reason
            };
            let t = self.queue.pop_front().expect("head exists");
            self.recent_lost = self.recent_lost.saturating_add(1);
            on_drop(t, reason);
        }
        let head = *self.queue.front().expect("non-empty");
        let d = self.finish_by(&head);
        // 2. The largest batch that fits the head's deadline.
        // `room`: how many the deadline allows from now, however many are queued
        // (latencies are non-decreasing, so the batch is `room` capped by the queue).
        let room = prof.max_batch_within(
            d - now - self.net.ctrl - self.net.data_fixed,
            self.net.data_per_req,
            self.max_batch,
        );
        let cap = (self.queue.len() as u32).min(self.max_batch);
        let mut bs = room.min(cap);
        if gpu_free.is_some() {
            bs = bs.min(prof.max_batch_within(d - floor, Dur::ZERO, cap));
        }
        debug_assert!(bs >= 1, "head fits alone, so bs >= 1");
        let bs = bs.max(1);
        let bs = if self.pow2 {
            1 << (31 - bs.leading_zeros())
        } else {
            bs
        };
        // 3. The schedulable window [exec_at, latest].
        let earliest = start(self, bs);
        let latest = d - prof.latency(bs);
        let exec = match self.rule {
            _ if at_once => earliest,
            ExecRule::Eager => earliest,
            ExecRule::Frontrun { pays } => {
                let defer_to = (d - prof.latency(bs + 1)).min(latest - self.net.slack);
                if bs >= self.max_batch || (pays && !self.waiting_pays(now, bs, defer_to, room)) {
                    // The batch cannot grow, or its growth would not matter for
                    // capacity: waiting would only add latency.
                    earliest
                } else {
                    earliest.max(defer_to)
                }
            }
            ExecRule::Timeout(k) => earliest.max(head.arrival + k),
        };
        let exec_at = exec.min(latest).max(earliest);
        let c = Candidate {
            bs,
            exec_at,
            latest,
            send_at: exec_at - self.net.delay(bs),
            bias: self.loss_bias(),
        };
        self.cand = Some(c);
        Some(c)
    }
}

impl ModelState {
    /// Deferred on one GPU: whether the sub-cluster has a single GPU in service
    /// and the model's rate may reach what its share of it carries at the
    /// largest batch of back-to-back batches (the staggered batch of one GPU:
    /// 2 l(b) within the SLO), the measured rate taken [`LONE_GPU_SIGMAS`]
    /// standard errors high. Then no batch waits.
    ///
    /// On one GPU eager's batches need no coordination: each batch holds what
    /// arrived while the one before it ran, so they settle at the smallest
    /// batch that carries the rate (the adaptive window), the staggered
    /// schedule of one GPU. Waiting there buys GPU time, not capacity, and
    /// costs idle time on the only GPU: below capacity that time is spare
    /// (deferred keeps its larger batches and the idle time), near capacity
    /// the queue is short only for a moment and every millisecond the GPU
    /// waits for it to refill is lost goodput (ResNet-50 on one H100 at 4,094
    /// r/s: deferred's GPU idled 0.2% of the time and dropped 1.10% against
    /// eager's 1.06%). The rate's standard error keeps the estimate's noise
    /// from letting a model past capacity wait.
    fn lone_gpu_full(&self) -> bool {
        if !(0.5..1.5).contains(&self.gpus) || self.share <= 0.0 {
            return false;
        }
        let b = self.staggered_cap(1.0);
        let high = self.rate_rps + LONE_GPU_SIGMAS * self.rate_se;
        high >= self.share * self.spec.profile.throughput_rps(b)
    }

    /// Deferred's "defer only when it pays": whether holding the batch of `bs` until
    /// `defer_to` saves enough GPU time to matter for capacity.
    ///
    /// The batch is expected to grow to `B = bs + rate * (defer_to - now)` (no more
    /// than `room`, the batch the head's deadline allows from now); if fewer than [`MIN_GROWTH`] more requests
    /// (clumps, below) are expected by then, however many fit, waiting does not
    /// pay. Otherwise running every batch at `bs` rather than at `B` would cost
    /// the model `rate * (l(bs)/bs - l(B)/B)` GPU-seconds per second;
    /// its spare GPU time is `share - rate * l(B)/B`. Waiting pays when that cost
    /// exceeds `eager_cost_max` of the spare time. At light load (or for models
    /// whose batches barely amortise) it does not, and the batch starts at once on
    /// the lowest-numbered free GPU; near capacity the spare time vanishes and every
    /// batch that can grow waits for its frontrun moment, as in the paper.
    ///
    /// Under bursty arrivals the requests come in clumps, and what the batch can
    /// count on is the clumps expected by then, not the requests (and past
    /// [`DISPERSION_NO_WAIT`], nothing: the batch starts at once): the expected
    /// growth is divided by the arrivals' index of dispersion (variance over mean of
    /// the requests per rate tick; 1 for Poisson, about the mean clump size for
    /// clumps) before the [`MIN_GROWTH`] test. Holding a batch for a clump that
    /// mostly does not come leaves GPUs idle between bursts and spends the slack
    /// the next burst needs (on the Gamma(0.05) workloads deferred lost 5-15% of
    /// goodput to eager that way; Poisson arrivals are unchanged).
    ///
    /// The rate is the measured one (the shard's estimator). Before any rate is
    /// measured, a batch starts at once. (The queue's own rate, the requests
    /// behind the head over the time since it arrived, was tried as a faster
    /// signal: from two or three requests it overestimates low-rate models and
    /// cost about 12% of goodput on the 1080Ti 35-model mix.)
    fn waiting_pays(&self, now: Time, bs: u32, defer_to: Time, room: u32) -> bool {
        let rate = self.rate_rps;
        if rate <= 0.0 || self.dispersion > DISPERSION_NO_WAIT {
            return false;
        }
        let prof = &self.spec.profile;
        if self.lone_gpu_full() {
            // One GPU near or past what it can carry: eager's batches are as
            // large as the load needs, and a wait only idles the GPU.
            return false;
        }
        let wait = (defer_to - now).as_secs_f64().max(0.0);
        let expected = rate * wait;
        if expected / self.dispersion < MIN_GROWTH {
            // Requests that will not come: waiting for them only risks finding
            // every GPU busy at the frontrun moment.
            return false;
        }
        let grown = bs + expected.min(room.saturating_sub(bs) as f64) as u32;
        if grown <= bs {
            // The deadline leaves no room to grow, yet requests are coming: the
            // frontrun moment is already the latest start of this batch.
            return true;
        }
        let per_req = |b: u32| prof.latency(b).as_secs_f64() / b as f64;
        let cost = rate * (per_req(bs) - per_req(grown)).max(0.0);
        let spare = (self.share - rate * per_req(grown)).max(0.0);
        cost > self.eager_cost_max * spare
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model with l(b) = 1 ms * b + 5 ms (up to 64) and an SLO of 50 ms.
    fn spec_1ms_5ms() -> ModelSpec {
        ModelSpec {
            name: "m".into(),
            profile: LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(5), 64).unwrap(),
            slo: Dur::from_ms(50),
        }
    }

    /// Model 0 of `spec` under `policy`, gathered lazily, 100 tasks at most.
    fn state(spec: &ModelSpec, policy: Policy, net: NetBudget) -> ModelState {
        ModelState::new(ModelId(0), spec.clone(), policy, Gather::Lazy, net, 100)
    }

    /// Model 0 of `spec` under `deferred`, gathered adaptively, 100 tasks at
    /// most.
    fn adaptive_state(spec: &ModelSpec, net: NetBudget) -> ModelState {
        ModelState::new(
            ModelId(0),
            spec.clone(),
            Policy::Deferred,
            Gather::Adaptive,
            net,
            100,
        )
    }

    /// `m`'s candidate for one task arriving at `now` with `slo` to go (none
    /// may be dropped).
    fn lone_task_candidate(m: &mut ModelState, now: Time, slo: Dur) -> Candidate {
        assert!(m.enqueue(task_due(1, now, slo)));
        m.update(now, None, &mut |_, _| panic!("nothing to drop"))
            .unwrap()
    }

    /// Task `id`, arrived at `arrival`, due `slo` later.
    fn task_due(id: u64, arrival: Time, slo: Dur) -> Task {
        Task {
            id: TaskId(id),
            arrival,
            deadline: arrival + slo,
            tag: 0,
            cap: 0,
        }
    }

    /// Deferred's loss bias: zero until the model has queued
    /// [`LOSS_MIN_SEEN`] requests, then [`LOSS_RANK_PER_PERCENT`] per 1% of
    /// them lost at the head past [`LOSS_RANK_FROM`], counted up to
    /// [`LOSS_RANK_CAP`] percent; zero under eager whatever it loses.
    #[test]
    fn the_loss_bias_follows_the_requests_lost_at_the_head() {
        let spec = spec_1ms_5ms();
        let t0 = Time(1_000_000_000);
        let bias_after = |policy: Policy, queued: u64, lost: u64| {
            let mut m = ModelState::new(
                ModelId(0),
                spec.clone(),
                policy,
                Gather::Lazy,
                NetBudget::default(),
                10_000,
            );
            // `lost` requests whose deadlines have passed, then fresh ones.
            for i in 0..queued {
                let arrival = if i < lost { t0 - Dur::from_ms(100) } else { t0 };
                assert!(m.enqueue(task_due(i, arrival, spec.slo)));
            }
            let mut dropped = 0;
            let c = m.update(t0, None, &mut |_, _| dropped += 1).unwrap();
            assert_eq!(dropped, lost);
            assert_eq!(c.bias, m.loss_bias());
            c.bias
        };
        let per = LOSS_RANK_PER_PERCENT.0 as f64;
        let near = |d: Dur, want: f64| (d.0 as f64 - want).abs() <= 1.0;
        assert_eq!(bias_after(Policy::Deferred, 99, 5), Dur::ZERO, "too few");
        assert_eq!(bias_after(Policy::Deferred, 200, 0), Dur::ZERO);
        // 0.5% lost: not past LOSS_RANK_FROM.
        assert_eq!(bias_after(Policy::Deferred, 200, 1), Dur::ZERO);
        let b = bias_after(Policy::Deferred, 200, 3);
        assert!(near(b, per * (1.5 - LOSS_RANK_FROM)), "{b:?}");
        let b = bias_after(Policy::Deferred, 200, 50);
        assert!(
            near(b, per * (LOSS_RANK_CAP - LOSS_RANK_FROM)),
            "capped: {b:?}"
        );
        assert_eq!(bias_after(Policy::Eager, 200, 50), Dur::ZERO);
        assert_eq!(bias_after(Policy::Symphony, 200, 50), Dur::ZERO);
    }

    /// The losses are counted over about the last [`LOSS_WINDOW`] requests:
    /// a model that lost early and then none sees its bias fade.
    #[test]
    fn the_loss_bias_fades_when_the_losses_stop() {
        let spec = spec_1ms_5ms();
        let mut m = ModelState::new(
            ModelId(0),
            spec.clone(),
            Policy::Deferred,
            Gather::Lazy,
            NetBudget::default(),
            usize::MAX,
        );
        let mut now = Time(1_000_000_000);
        let mut id = 0;
        let mut push = |m: &mut ModelState, arrival: Time| {
            id += 1;
            assert!(m.enqueue(task_due(id, arrival, spec.slo)));
        };
        // 100 lost of 200.
        for i in 0..200 {
            push(
                &mut m,
                if i % 2 == 0 {
                    now - Dur::from_ms(100)
                } else {
                    now
                },
            );
        }
        m.update(now, None, &mut |_, _| {}).unwrap();
        let start = m.loss_bias();
        assert!(start > Dur::ZERO);
        // Then only requests served: the bias falls, and after several
        // windows it is gone.
        let mut last = start;
        for _ in 0..4 {
            for _ in 0..LOSS_WINDOW {
                now += Dur(10_000);
                push(&mut m, now);
                let bs = m.queue_len() as u32;
                m.take(bs);
            }
            let b = m.loss_bias();
            assert!(b <= last, "{b:?} after {last:?}");
            last = b;
        }
        assert!(last < Dur(start.0 / 10), "{last:?} from {start:?}");
    }

    /// Adaptive early drop skips the head only when more than a window is queued:
    /// with a window or fewer, dropping the head could not make the batch larger
    /// (it only loses the head), so the queue is gathered lazily.
    #[test]
    fn adaptive_drops_the_head_only_for_a_fuller_window() {
        // l(b) = 1 ms * b + 5 ms; SLO 50 ms.
        let spec = spec_1ms_5ms();
        let t0 = Time(1_000_000_000);
        let task = |id: u64, at_ms: i64| task_due(id, t0 + Dur::from_ms(at_ms), Dur::from_ms(50));
        let run = |queued_behind: u64| {
            let mut m = adaptive_state(&spec, NetBudget::default());
            // 1 GPU at 2000/3 r/s needs b / l(b) >= 666.7 r/s: a window of 10.
            m.observe_rate(2000.0 / 3.0, 1.0);
            assert_eq!(m.window(), 10);
            assert!(m.enqueue(task(0, 0)));
            for i in 0..queued_behind {
                assert!(m.enqueue(task(1 + i, 30)));
            }
            // 9 ms left for the head: a batch of 4 fits it, a window of 10 does not.
            let mut drops = Vec::new();
            let c = m
                .update(t0 + Dur::from_ms(41), None, &mut |t, r| {
                    drops.push((t.id, r))
                })
                .unwrap();
            (c.bs, drops)
        };
        // 5 queued (fewer than a window): the head is kept in a batch of 4.
        assert_eq!(run(4), (4, vec![]));
        // 12 queued: the 11 behind the head fill a window, so the head is skipped.
        assert_eq!(run(11), (11, vec![(TaskId(0), DropReason::EarlyDrop)]));
    }

    /// Where a batch's pull holds its GPU's puller longer than the batch runs,
    /// the adaptive window is the batch that carries the rate at the puller's
    /// pace (halfway between the hold and the budget), not the GPU's.
    #[test]
    fn the_window_carries_the_rate_at_the_pullers_pace() {
        // l(b) = 1 ms * b + 5 ms; SLO 200 ms; 600 r/s on one GPU.
        let spec = ModelSpec {
            slo: Dur::from_ms(200),
            ..spec_1ms_5ms()
        };
        let window = |net: NetBudget| {
            let mut m = adaptive_state(&spec, net);
            m.observe_rate(600.0, 1.0);
            m.window()
        };
        let net = |hold_ms: i64, data_ms: i64| NetBudget {
            hold_fixed: Dur::from_ms(hold_ms),
            hold_per_req: Dur::from_ms(1),
            data_fixed: Dur::from_ms(data_ms),
            data_per_req: Dur::from_ms(1),
            ..NetBudget::default()
        };
        // b / l(b) >= 600 r/s from b = 8 (8 / 13 ms).
        assert_eq!(window(NetBudget::default()), 8);
        // A pace under l(b) changes nothing: hold(b) = 2 ms + 1 ms * b,
        // budget 6 ms + 1 ms * b.
        assert_eq!(window(net(2, 6)), 8);
        // A budget with no hold (nothing measured by a puller) neither.
        let no_hold = NetBudget {
            data_fixed: Dur::from_ms(14),
            data_per_req: Dur::from_ms(1),
            ..NetBudget::default()
        };
        assert_eq!(window(no_hold), 8);
        // hold(b) = 10 ms + 1 ms * b, budget 14 ms + 1 ms * b: the pace is
        // 12 ms + 1 ms * b, which carries 600 r/s from b = 18.
        assert_eq!(window(net(10, 14)), 18);
        // A budget under the hold (its caps) counts as the hold.
        assert_eq!(window(net(10, 0)), 15);
    }

    /// Bursty arrivals: the expected growth counts clumps, not requests, so a batch
    /// that would wait for requests under Poisson arrivals starts at once when they
    /// come in clumps of about 20.
    #[test]
    fn bursty_arrivals_count_clumps() {
        // l(b) = 1 ms * b + 5 ms; SLO 50 ms; 200 r/s on one GPU: about 8.6 requests
        // are expected before the frontrun moment (43 ms away).
        let spec = spec_1ms_5ms();
        let now = Time(1_000_000_000);
        let exec_in_at = |rate: f64, dispersion: f64| {
            let mut m = state(&spec, Policy::Deferred, NetBudget::default());
            m.eager_cost_max = 0.05;
            m.observe_rate(rate, 1.0);
            m.observe_dispersion(dispersion);
            lone_task_candidate(&mut m, now, Dur::from_ms(50)).exec_at - now
        };
        let exec_in = |dispersion: f64| exec_in_at(200.0, dispersion);
        // Poisson (and a noisy estimate below 1): waits for its frontrun moment.
        assert_eq!(exec_in(1.0), Dur::from_ms(43));
        assert_eq!(exec_in(0.5), Dur::from_ms(43));
        // Clumps of 20: fewer than MIN_GROWTH clumps expected, starts at once.
        assert_eq!(exec_in(20.0), Dur::ZERO);
        // Clumps of 2: 4.3 clumps expected, so it still waits.
        assert_eq!(exec_in(2.0), Dur::from_ms(43));
        // At 5,000 r/s 215 requests are expected before the frontrun moment:
        // under Poisson arrivals the batch waits, clumped past
        // DISPERSION_NO_WAIT it starts at once (43 clumps of 5 expected).
        assert_eq!(exec_in_at(5000.0, 1.0), Dur::from_ms(43));
        assert_eq!(exec_in_at(5000.0, DISPERSION_NO_WAIT + 1.0), Dur::ZERO);
    }

    /// Deferred on one GPU: a model whose rate, taken three standard errors
    /// high, reaches what the GPU carries at its staggered batch starts at
    /// once; below that, or with two GPUs, it waits for its frontrun moment.
    #[test]
    fn a_full_lone_gpu_does_not_wait() {
        // l(b) = 1 ms * b + 5 ms; SLO 50 ms: on one GPU the staggered batch is
        // 20 (2 l(20) = 50 ms), which carries 800 r/s.
        let spec = spec_1ms_5ms();
        let now = Time(1_000_000_000);
        let exec_in = |rate: f64, se: f64, gpus: Option<f64>| {
            let mut m = state(&spec, Policy::Deferred, NetBudget::default());
            m.eager_cost_max = 0.02;
            m.observe_rate(rate, 1.0);
            if let Some(g) = gpus {
                m.observe_cluster(g, se);
            }
            lone_task_candidate(&mut m, now, Dur::from_ms(50)).exec_at - now
        };
        let frontrun = Dur::from_ms(43);
        // Below capacity on one GPU: it waits.
        assert_eq!(exec_in(600.0, 0.0, Some(1.0)), frontrun);
        assert_eq!(exec_in(600.0, 60.0, Some(1.0)), frontrun);
        // At capacity, or within three standard errors of it: at once.
        assert_eq!(exec_in(800.0, 0.0, Some(1.0)), Dur::ZERO);
        assert_eq!(exec_in(600.0, 70.0, Some(1.0)), Dur::ZERO);
        // Two GPUs (or none known yet): the paper's frontrun moment.
        assert_eq!(exec_in(800.0, 0.0, Some(2.0)), frontrun);
        assert_eq!(exec_in(800.0, 0.0, None), frontrun);
    }

    /// Frontrun keeps `slack` before the latest start, so a model whose batches
    /// cost microseconds more per request is not held to the last microsecond.
    #[test]
    fn frontrun_keeps_the_slack() {
        // l(b) = 1 us * b + 5 us; SLO 10 ms.
        let spec = ModelSpec {
            name: "tiny".into(),
            profile: LatencyProfile::linear(Dur::from_us(1), Dur::from_us(5), 64).unwrap(),
            slo: Dur::from_ms(10),
        };
        let cand = |slack_us: i64| {
            let net = NetBudget {
                ctrl: Dur::from_us(100),
                data_fixed: Dur::ZERO,
                data_per_req: Dur::from_us(10),
                resp: Dur::from_us(100),
                slack: Dur::from_us(slack_us),
                hold_fixed: Dur::ZERO,
                hold_per_req: Dur::ZERO,
            };
            let mut m = state(&spec, Policy::Symphony, net);
            lone_task_candidate(&mut m, Time(1_000_000_000), Dur::from_ms(10))
        };
        // No slack: the paper's frontrun, l(2) - l(1) = 1 us before the latest start.
        let c = cand(0);
        assert_eq!(c.bs, 1);
        assert_eq!(c.latest - c.exec_at, Dur::from_us(1));
        // 500 us of slack: planned 500 us before the latest start.
        let c = cand(500);
        assert_eq!(c.latest - c.exec_at, Dur::from_us(500));
        assert_eq!(c.send_at, c.exec_at - Dur::from_us(110));
        // Slack never plans a batch before it could start.
        let c = cand(20_000);
        assert_eq!(c.exec_at, Time(1_000_000_000) + Dur::from_us(110));
    }

    /// A measured response margin larger than the network's `resp` moves every
    /// batch's latest start earlier by the difference; a smaller one changes
    /// nothing.
    #[test]
    fn the_response_margin_is_reserved() {
        let spec = ModelSpec {
            name: "m".into(),
            profile: LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(2), 8).unwrap(),
            slo: Dur::from_ms(20),
        };
        let net = NetBudget {
            resp: Dur::from_us(300),
            ..NetBudget::default()
        };
        let latest = |margin_us: i64| {
            let mut m = ModelState::new(
                ModelId(0),
                spec.clone(),
                Policy::Eager,
                Gather::Lazy,
                net,
                10,
            );
            m.set_margin(Dur::from_us(margin_us));
            let now = Time(1_000_000_000);
            assert!(m.enqueue(task_due(1, now, Dur::from_ms(20))));
            let c = m
                .update(now, None, &mut |_, _| panic!("nothing to drop"))
                .unwrap();
            c.latest - now
        };
        // l(1) = 3 ms.
        assert_eq!(latest(0), Dur::from_us(20_000 - 300 - 3_000));
        assert_eq!(latest(100), latest(0));
        assert_eq!(latest(2_000), Dur::from_us(20_000 - 2_000 - 3_000));
    }
}
