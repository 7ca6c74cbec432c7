//! The real-time runtime: the pure core driven by the OS clock, threads and channels.

pub mod clock;
pub mod cpu;
pub mod pin;
pub mod sched;
pub mod wait;
