//! The scheduler process: the real-time scheduler
//! ([`RtScheduler`](crate::runtime::sched::RtScheduler)) behind a transport.
//! Nodes (backends and frontends) connect, register and heartbeat; tasks come in
//! `Submit` messages; batch plans go out to the backend owning the GPU, drop
//! notices to the frontend owning the task.
//!
//! Membership, health, the network budget and the checks on what nodes send are
//! the sans-IO machine [`super::proto::sched::SchedProto`]; this module is its
//! driver (threads, sockets, the OS clock) and the dispatch path of the core.
//!
//! # Registration
//! * A **backend** sends `Register` with its GPUs. The scheduler answers with a
//!   `LoadModel` per model and a `FrontendUp` per frontend; when each model id is
//!   confirmed by a `ModelLoaded`, it sends `RegisterAck` with the GPUs' global ids
//!   and only then puts the GPUs in service, so no plan reaches a backend before
//!   its models.
//! * A **frontend** sends `Register` with its input region; it gets `RegisterAck` with
//!   the models, then `Capacity` (the GPUs in service), and every backend gets
//!   `FrontendUp`. Every frontend gets a new `Capacity` whenever the number of GPUs
//!   in service changes; a task submitted while none is in service is dropped at
//!   once as `NoGpu`.
//!
//! # Failures
//! * A node whose connection ends, or that sends no `Ping` for `node_timeout`, is
//!   removed. A backend's GPUs leave service at once and every plan it had not
//!   reported done ends as `Dropped(BackendLost)` at the tasks' frontends.
//! * A frontend that is gone has its tasks dropped where they are next seen: plans
//!   leave its tasks out (a plan left empty frees its GPU at once) and drop notices for
//!   it are not sent. Backends get `FrontendDown` and stop reading its region.
//! * A malformed frame closes that connection (the transport logs why); a message a
//!   node's role should not send closes that node's connection with a logged reason.
//!
//! # Network budget (Appendix D)
//! d_ctrl and d_data are measured, not guessed: backends report the p99.9
//! ([`crate::wire::NET_QUANTILE`]) of their recent control delay (the larger of
//! the plans' one-way delay, measured from the plan's send time on the
//! scheduler's clock, and half the ping round trip) and of their input pull time
//! per task; every `net_update` (200 ms) the scheduler sets d_ctrl = max(floor,
//! that + 10%) and d_data = max(floor, that of the pull time per task), over its
//! backends, and hands it to every ModelThread. Results travel one hop back to the
//! frontend, so the response budget (`resp`) gets the same value as d_ctrl. A
//! backend's measurements from its pings before registering apply as soon as its
//! GPUs enter service. The floors are the workload's
//! `[network]` values;
//! the measured parts are capped (`max_ctrl`, `max_data`, default 2 ms and 500 us)
//! so that a burst of slow probes cannot make every request unschedulable.
//!
//! # Metrics
//! [`SchedulerNode::metrics`] has the scheduler's Prometheus series: tasks, plans
//! and batch sizes per model, drops per reason, the network budget, and per GPU its
//! busy seconds and busy fraction over the last [`BUSY_WINDOW`] (from the start and
//! finish times backends report in `PlanDone`), with the mean over the
//! sub-cluster. One scheduler is one sub-cluster: its GPUs carry
//! `subcluster="0"`.
//!
//! # Files
//! * `options.rs`: the settings ([`SchedulerOpts`]).
//! * `node.rs`: [`SchedulerNode`]: start-up (the real-time scheduler's and the
//!   protocol machine's configuration, the listener, the event loop's thread) and
//!   stop.
//! * `event_loop.rs`: the driver of the protocol machine: connections, timeouts,
//!   its actions carried out, tasks submitted to the core, the report at stop.
//! * `repo_poll.rs`: `--model-control-mode poll`'s looks at the model
//!   repository.
//! * `routes.rs`: where plans and drops go (each GPU's backend, each frontend);
//!   the core's dispatch path ([`Outlet`](crate::runtime::sched::Outlet)).
//! * `metrics.rs`: the Prometheus series, [`drop_reason_label`], the GPU busy
//!   time and [`BUSY_WINDOW`].

pub mod epoch;
mod event_loop;
mod metrics;
mod node;
mod options;
mod repo_poll;
mod routes;
pub mod standby;

pub use super::proto::sched::SchedReport;
pub use metrics::{drop_reason_label, BUSY_WINDOW};
pub use node::SchedulerNode;
pub use options::{ModelControlOpts, SchedulerOpts};
pub use standby::StandbyStatus;
