//! The distributed runtime's processes (Section 4 of the Symphony paper): the
//! scheduler, backends, frontends and the load generator, each an object that runs
//! its own threads over a [`crate::transport::Transport`]. The `fermata` binary
//! runs one per process (`fermata scheduler|backend|frontend|loadgen`);
//! `fermata serve` runs them all in one process over the in-process transport.

pub mod backend;
pub mod clock;
pub mod exec;
pub mod frontend;
pub mod http;
pub mod loadgen;
pub mod onnx;
pub mod procs;
pub mod proto;
pub mod scheduler;
pub mod serve;
