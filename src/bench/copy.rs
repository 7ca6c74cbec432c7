//! What this machine's memory copies: the bandwidth of copying inputs of one
//! size out of a pool larger than the caches into another, on one thread, as
//! a frontend storing inputs into its region and a backend pulling them out
//! do. It bounds the rate at which inputs of that size can be served: each
//! input is copied twice on the server's path in process (into the region,
//! out of it), so no run serves more than `bandwidth / (2 × size)` a second
//! on one core's copies.
//!
//! [`first_touch_bandwidth`] measures the other cost of memory: writing pages
//! the process has not touched yet (a page fault and the kernel's zeroing of
//! each page, and on a virtual machine the host's own fault). On the 2-core
//! development VM it is about 150 MB/s against 9 GB/s for writing mapped
//! pages, so an input stored into fresh pages costs milliseconds: what the
//! input paths reuse (region memory, pull buffers) avoids it.

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

/// Bytes per second the emulated GPU's checksum ([`checksum64`]) reads
/// inputs of `size` bytes at, out of a pool larger than the caches, on one
/// thread, for about `dur`: the CPU the emulated GPU spends per input byte.
///
/// [`checksum64`]: crate::node::exec::checksum64
pub fn checksum_bandwidth(size: usize, dur: Duration) -> f64 {
    let size = size.max(64);
    let n = POOL_BYTES.div_ceil(size).max(2);
    let src: Vec<Vec<u8>> = (0..n).map(|i| vec![(i % 251) as u8; size]).collect();
    let t0 = Instant::now();
    let (mut read, mut acc, mut i) = (0u64, 0u64, 0usize);
    while t0.elapsed() < dur || read == 0 {
        for _ in 0..16 {
            acc ^= crate::node::exec::checksum64(&src[i % n]);
            i += 1;
            read += size as u64;
        }
    }
    std::hint::black_box(acc);
    read as f64 / t0.elapsed().as_secs_f64()
}

/// Bytes per second of writing `bytes` of fresh anonymous memory once (each
/// page's first touch), and of writing the same pages again (mapped): the
/// first a process pays once per page it ever uses, the second at every
/// store. The memory is mapped for the measurement alone and unmapped after.
pub fn first_touch_bandwidth(bytes: usize) -> anyhow::Result<(f64, f64)> {
    let bytes = bytes.max(1 << 20);
    // SAFETY: a private anonymous mapping of `bytes`, checked below, written
    // only within its length and unmapped once.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        anyhow::bail!(
            "mmap of {bytes} bytes failed: {}",
            std::io::Error::last_os_error()
        );
    }
    let write = |v: u8| {
        let t0 = Instant::now();
        // SAFETY: within the mapping made above.
        unsafe { std::ptr::write_bytes(p as *mut u8, v, bytes) };
        std::hint::black_box(p);
        bytes as f64 / t0.elapsed().as_secs_f64()
    };
    let fresh = write(1);
    let mapped = write(2);
    // SAFETY: the mapping made above, not used after.
    unsafe { libc::munmap(p, bytes) };
    Ok((fresh, mapped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_something_at_a_finite_rate() {
        let bw = copy_bandwidth(602_112, Duration::from_millis(20));
        assert!(bw.is_finite() && bw > 0.0, "{bw}");
        let ck = checksum_bandwidth(602_112, Duration::from_millis(20));
        assert!(ck.is_finite() && ck > 0.0, "{ck}");
        let (fresh, mapped) = first_touch_bandwidth(4 << 20).unwrap();
        assert!(fresh.is_finite() && fresh > 0.0, "{fresh}");
        assert!(mapped.is_finite() && mapped > 0.0, "{mapped}");
    }
}
