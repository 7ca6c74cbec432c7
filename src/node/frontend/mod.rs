//! The frontend process: accepts client requests, keeps their input bytes in its
//! region, hands tasks {id, model, deadline, input location} to the scheduler and
//! answers each client exactly once: `Good` (output by the deadline), `Late`
//! (output after it), `Dropped` (the scheduler gave up on it) or `Failed` (backend
//! lost, input missing, executor error, bad request, or no answer by the deadline
//! plus `grace`).
//!
//! One thread runs everything: the scheduler connection, client connections and the
//! connections on which backends push results all deliver to one event loop. The
//! region is read by backends without this thread (see [`crate::transport`]).
//!
//! In-process clients (the HTTP server of [`super::http`]) hand requests to the same
//! loop through a [`FrontendHandle`]: a channel in, a oneshot answer out, with the
//! same exactly-once accounting as wire clients and a finer cause ([`Ended`]).
//!
//! The scheduler tells the frontend how many GPUs are in service (`Capacity`); a
//! request that arrives while there is none ends at once as dropped with
//! [`DropReason::NoGpu`](crate::wire::DropReason::NoGpu).
//!
//! # Files
//! * `options.rs`: the settings ([`FrontendOpts`]).
//! * `node.rs`: [`FrontendNode`]: start-up and stop.
//! * `register.rs`: joining the scheduler (clock sync, `Register`, the ack).
//! * `event_loop.rs`: the event loop: events, submits, heartbeats, sweeps, stop.
//! * `requests.rs`: admission and the one answer of each request.
//! * `handle.rs`: in-process clients ([`FrontendHandle`], [`InferDone`]).
//! * `stats.rs`: their per-model statistics ([`stats::ModelStats`]).
//! * `replan.rs`: the thread that re-plans applications on their measured
//!   fan-out ([`ReplanOpts`]).
//! * `metrics.rs`: the Prometheus series.
//! * `report.rs`: what the frontend counted ([`FrontendReport`]).

pub mod control;
mod event_loop;
mod handle;
mod metrics;
mod node;
mod options;
mod register;
mod replan;
mod report;
mod requests;
pub mod stats;

pub use super::proto::ledger::Ended;
pub use handle::{FrontendHandle, InferDone, Stopped, LOCAL_MAX};
pub use metrics::BAD_RATE_WINDOW;
pub use node::FrontendNode;
pub use options::FrontendOpts;
pub use replan::ReplanOpts;
pub use report::FrontendReport;
