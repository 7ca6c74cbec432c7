//! The test and benchmark harness, apart from the runtime: the load generator
//! (a client of the frontends, `fermata loadgen`) and the in-process fakes that
//! drive the real-time scheduler (fake frontends replaying the simulator's
//! arrivals, fake backends that check every plan), and the orchestration of a
//! cluster of processes (`procs`, for `bench goodput --runtime tcp` and the
//! process tests), and the open-loop HTTP client of `fermata bench http`
//! (`http_load`, driving `fermata serve` processes from outside). Production
//! modules do not depend on it, except `fermata serve`'s all-in-one demo, which runs the load
//! generator against its own cluster.

pub mod adapt_apps;
pub mod adapt_procs;
pub mod attacks;
pub mod churn;
pub mod door_figures;
pub mod failover;
pub mod fake;
pub mod http_load;
pub mod loadgen;
pub mod procs;
pub mod stall;
