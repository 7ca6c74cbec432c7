pub mod bench;
pub mod core;
pub mod plan;
pub mod sim;
pub mod workload;
