//! The backend process: registers its GPUs, loads models when told, pulls each
//! plan's inputs one-sided from the frontends that hold them, runs the batch at the
//! planned time and pushes the outputs to the frontends and the actual finish time
//! to the scheduler.
//!
//! The protocol (clock sync, registration, models, checks on plans, the plan
//! queue and how a batch ends) is the sans-IO [`super::proto::backend`]; this
//! module is its driver. Threads: one network loop (scheduler and frontend
//! connections, heartbeats, driving
//! [`BackendProto`](super::proto::backend::BackendProto)), and per GPU slot (a
//! GPU, or with `--lanes E` each of its E lanes: see [`lanes`]) a
//! **puller** (reads a plan's inputs as soon as the plan arrives, so the
//! pull overlaps the previous batch) and a **worker** (takes the pulled plans in
//! `exec_at` order, waits for `exec_at`, runs the executor, reports). When a batch
//! starts later than planned, the tasks that can no longer meet their deadline
//! are left out, earliest deadline first (each one
//! left out shortens the batch and may save the rest); they end as
//! `Dropped(TooLate)`. A plan with none left is not run and the scheduler hears
//! `PlanDone{TooLate}`. Inputs that cannot be read (frontend gone,
//! slot reused, timeout) are left out of the batch and their tasks end as
//! `InputMissing`; the rest of the batch runs.
//!
//! [`BackendNode::metrics`] has its Prometheus series (labelled with the backend's
//! name): plans and tasks by outcome, batch sizes per model, batch start delays.
//!
//! # Files
//! * `options.rs`: the settings ([`BackendOpts`]).
//! * `node.rs`: [`BackendNode`]: start-up (shared state, each GPU's threads, the
//!   network loop), readiness, stop, crash and join.
//! * `net.rs`: the network loop, the driver of the protocol machine.
//! * `puller.rs`: a GPU's puller (one-sided input reads).
//! * `worker.rs`: a GPU's worker (waits for `exec_at`, runs the batch, reports).
//! * `lanes.rs`: concurrent lanes (`--lanes`): each GPU as several slots, and
//!   the book of which lanes run a batch.
//! * `channels.rs`: what goes between the threads, and how much of it may wait.
//! * `shared.rs`: the state the threads share.
//! * `pool.rs`: the pool of input buffers (kept for the next backend of the
//!   process when one stops).
//! * `metrics.rs`: the Prometheus series.
//! * `report.rs`: what the backend counted ([`BackendReport`]).

mod channels;
pub mod lanes;
mod metrics;
mod net;
mod node;
mod options;
mod pool;
mod puller;
mod report;
mod shared;
mod worker;

pub use node::BackendNode;
pub use options::BackendOpts;
pub use report::BackendReport;
