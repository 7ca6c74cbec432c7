pub mod app;
pub mod autoscale;
pub mod partition;
pub mod squishy;
