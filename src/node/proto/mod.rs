//! The node protocols as pure state machines (sans-IO), in the style of the
//! scheduling core: every input is a `handle_*(now, ..)` call with the time as an
//! argument, every output is data the caller takes (`poll_action()`,
//! `poll_timeout()`); timers are data. No module here reads a clock, opens a
//! socket or starts a thread (`tests/core_purity.rs` checks it), so the same code
//! runs under the real drivers in [`super::scheduler`], [`super::frontend`] and
//! [`super::backend`] and under the deterministic cluster simulator
//! (`fermata sim cluster`, in `src/sim/cluster.rs`).
//!
//! - [`check`]: a wire message becomes a typed value only after range checks
//!   (deadlines and SLOs within bounds, measured delays clamped, ids owned by the
//!   sender, models matched by id).
//! - [`sched`]: the scheduler's membership (registration, model loading matched
//!   by id, removal), health (heartbeat timeouts), the network budget
//!   (Appendix D) and the checks on what backends report.
//! - [`bounds`]: what bounds the scheduler's per-member state: GPU ids given
//!   back and given again, the limits on members and GPUs per member, the rate
//!   limit on warnings about refused members.
//! - [`control`]: model control (which models are loaded, clients' loads and
//!   unloads); [`devices`]: what runs each model's GPUs (real GPUs, the CPU,
//!   emulated), as frontends report it.
//! - [`latency_scale`]: how much slower than profiled each model runs, from
//!   the batches backends report, and when its profile must be planned scaled.
//! - [`app_totals`]: applications' counters (fan-outs, step latencies,
//!   requests) summed over the frontends that serve them, for their re-planners.
//! - [`plans`]: the scheduler's in-flight plans, each owned by one backend and GPU.
//! - [`ledger`]: a frontend's pending requests, each ended exactly once, with the
//!   deadline-plus-grace sweep.
//! - [`standby`]: a hot-standby scheduler following its primary: when it is
//!   gone, and what nodes sent meanwhile.
//! - [`fence`]: a standby that took over telling its old primary's address
//!   its new term, so that a primary that resumes there steps down.
//! - [`backend`]: the backend's clock sync, registration, model loading and
//!   checks on plans; its per-GPU plan queue, input-pull tracking and how a
//!   batch ends.

pub mod app_totals;
pub mod backend;
pub mod bounds;
pub mod check;
pub mod control;
pub mod devices;
pub mod fence;
pub mod latency_scale;
pub mod ledger;
pub mod member;
pub mod plans;
pub mod redial;
pub mod repo_poll;
pub mod sched;
pub mod standby;
pub mod subclusters;
