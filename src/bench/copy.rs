//! What this machine's memory copies: the bandwidth of copying inputs of one
//! size out of a pool larger than the caches into another, on one thread, as
//! a frontend storing inputs into its region and a backend pulling them out
//! do. It bounds the rate at which inputs of that size can be served: each
//! input is copied twice on the server's path in process (into the region,
//! out of it), so no run serves more than `bandwidth / (2 × size)` a second
//! on one core's copies.

use std::time::{Duration, Instant};

/// Bytes the source and destination pools each hold at least (past the last
/// level cache of the machines this runs on).
pub const POOL_BYTES: usize = 128 << 20;

/// Copies of inputs of `size` bytes for about `dur` (after one untimed pass
/// that maps the pools' pages): bytes copied per second.
pub fn copy_bandwidth(size: usize, dur: Duration) -> f64 {
    let size = size.max(64);
    let n = POOL_BYTES.div_ceil(size).max(2);
    let src: Vec<Vec<u8>> = (0..n).map(|i| vec![(i % 251) as u8; size]).collect();
    let mut dst: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; size]).collect();
    for (d, s) in dst.iter_mut().zip(&src) {
        d.copy_from_slice(s);
    }
    let t0 = Instant::now();
    let mut copied = 0u64;
    let mut i = 0usize;
    while t0.elapsed() < dur || copied == 0 {
        for _ in 0..16 {
            // Source and destination a pool apart: neither is in a cache.
            let (s, d) = (i % n, (i + n / 2) % n);
            dst[d].copy_from_slice(&src[s]);
            i += 1;
            copied += size as u64;
        }
    }
    std::hint::black_box(&dst);
    copied as f64 / t0.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_something_at_a_finite_rate() {
        let bw = copy_bandwidth(602_112, Duration::from_millis(20));
        assert!(bw.is_finite() && bw > 0.0, "{bw}");
    }
}
