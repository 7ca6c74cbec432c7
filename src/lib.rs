pub mod bench;
pub mod core;
pub mod plan;
pub mod runtime;
pub mod sim;
pub mod transport;
pub mod wire;
pub mod workload;
