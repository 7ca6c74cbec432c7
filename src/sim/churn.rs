//! The churn scenario of the cluster simulator: members joining and leaving
//! thousands of times ([`ClusterSimOpts::churn`]: a frontend or backend
//! crashes every 20 ms on average and its supervisor restarts it 10 to 50 ms
//! later as a new node, which registers again). Besides the simulator's checks after every
//! event (every request ends exactly once, no GPU runs two batches at once,
//! ...), the scheduler's GPU slots must never exceed the most GPUs its
//! backends owned at once: a departed backend's GPU ids are given again
//! ([`crate::node::proto::bounds`]), so the per-member state is that of the
//! members present, however often they came and went.

use super::cluster::{ClusterSim, ClusterSimOpts, ClusterSimReport, Faults};
use crate::core::Dur;
use crate::workload::Workload;

/// The scenario's settings for `seed`: 2 frontends and 4 backends of 4 GPUs,
/// 400 r/s, `seconds` of simulated time with a member crashing every 20 ms on
/// average (50 per simulated second), no other fault.
pub fn opts(seed: u64, seconds: u32) -> ClusterSimOpts {
    ClusterSimOpts {
        seed,
        frontends: 2,
        backends: 4,
        gpus_per_backend: 4,
        rate_rps: 400.0,
        duration: Dur::from_ms(seconds as i64 * 1000),
        faults: Faults::None,
        loss: 0.0,
        churn: true,
        ..ClusterSimOpts::default()
    }
}

/// Runs the scenario on `w`; the report (its `violation` says what broke).
pub fn run(w: &Workload, seed: u64, seconds: u32) -> ClusterSimReport {
    ClusterSim::new(w, opts(seed, seconds)).run()
}
