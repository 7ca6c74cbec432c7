//! What a frontend counted ([`FrontendReport`]).

/// What a frontend counted.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FrontendReport {
    pub requests: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    pub failed: u64,
    /// Of `failed`: no answer by deadline + grace.
    pub timed_out: u64,
    /// Answers for tasks that had already ended (ignored).
    pub stray_answers: u64,
    /// Results refused because they did not carry their task's capability
    /// (their connection was closed).
    pub forged_results: u64,
    /// Requests held over a lost scheduler and submitted to the next one.
    pub retried: u64,
    pub bad_requests: u64,
    /// Times the frontend lost the scheduler and joined again.
    pub rejoins: u64,
    pub clock_offset_us: f64,
    pub clock_error_us: f64,
    /// The largest response margin last reported to the scheduler (us).
    pub margin_max_us: f64,
    /// Input bytes the frontend copied into its region (each request's input
    /// once, into its slot).
    pub input_bytes_stored: u64,
}
