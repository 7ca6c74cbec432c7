//! The scheduling core: a pure state machine. No threads, sockets, async or OS
//! clock: time comes in as an argument (see `tests/core_purity.rs`).

pub mod dispatcher;
pub mod ids;
pub mod model;
pub mod nexus;
pub mod policy;
pub mod profile;
pub mod pull;
pub mod rank;
pub mod shard;
pub mod structs;
pub mod time;

pub use dispatcher::{Counters, Dispatcher, DispatcherConfig, Output, Plan};
pub use ids::{GpuId, ModelId, PlanId, TaskId};
pub use model::{Candidate, DropReason, ModelSpec, Outcome, Task};
pub use policy::{Gather, NetBudget, Policy};
pub use profile::LatencyProfile;
pub use pull::{PullEstimator, PullFit};
pub use time::{Dur, Time};

/// The interface every scheduling core offers to its driver (simulator or runtime).
/// See [`Dispatcher`] for the call order.
pub trait Scheduler {
    /// A request for `model` reached the scheduler from frontend `frontend`.
    fn handle_request(&mut self, now: Time, model: ModelId, task: Task, frontend: u32);
    /// Runs the timers due at or before `now`.
    fn handle_timeout(&mut self, now: Time);
    /// A backend reports when `gpu` is free after `plan`.
    fn handle_gpu_report(&mut self, now: Time, gpu: GpuId, plan: PlanId, free_at: Time);
    /// When `handle_timeout` must next be called.
    fn next_timeout(&self) -> Option<Time>;
    /// The next output, if any; drain after every input.
    fn poll_output(&mut self) -> Option<Output>;
    /// Request accounting.
    fn counters(&self) -> Counters;
    /// The production dispatcher behind this core, for a driver that resizes it
    /// (`add_gpu_at`, `remove_gpu`); `None` for the other cores.
    fn dispatcher_mut(&mut self) -> Option<&mut Dispatcher> {
        None
    }
}

impl Scheduler for Dispatcher {
    #[inline]
    fn handle_request(&mut self, now: Time, model: ModelId, task: Task, _frontend: u32) {
        Dispatcher::handle_request(self, now, model, task)
    }
    #[inline]
    fn handle_timeout(&mut self, now: Time) {
        Dispatcher::handle_timeout(self, now)
    }
    fn handle_gpu_report(&mut self, now: Time, gpu: GpuId, plan: PlanId, free_at: Time) {
        Dispatcher::handle_gpu_report(self, now, gpu, plan, free_at)
    }
    #[inline]
    fn next_timeout(&self) -> Option<Time> {
        Dispatcher::next_timeout(self)
    }
    #[inline]
    fn poll_output(&mut self) -> Option<Output> {
        Dispatcher::poll_output(self)
    }
    fn counters(&self) -> Counters {
        Dispatcher::counters(self).clone()
    }
    fn dispatcher_mut(&mut self) -> Option<&mut Dispatcher> {
        Some(self)
    }
}
