pub mod squishy;
