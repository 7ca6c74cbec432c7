//! CPU time of the process and of the calling thread, for benchmark reports (how much
//! CPU a run burned, how much an idle thread costs).
//!
//! These read CPU-time accounting, not the wall clock; they never feed the scheduler.

use std::time::Duration;

/// CPU time (user + system) consumed so far by the whole process, all threads included,
/// from `getrusage(RUSAGE_SELF)`. Microsecond resolution. Returns [`Duration::ZERO`]
/// if the OS call fails (it cannot with these arguments) or on non-Unix platforms.
pub fn process_cpu_time() -> Duration {
    #[cfg(unix)]
    {
        // SAFETY: `rusage` is plain old data, so all-zero is a valid value, and
        // `getrusage` only writes into the struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF is a valid `who`, `ru` is a valid, writable rusage.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        if rc != 0 {
            return Duration::ZERO;
        }
        timeval(ru.ru_utime) + timeval(ru.ru_stime)
    }
    #[cfg(not(unix))]
    {
        Duration::ZERO
    }
}

/// CPU time (user + system) consumed so far by the calling thread, from
/// `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`. Nanosecond resolution. Returns
/// [`Duration::ZERO`] if the OS call fails (it cannot with these arguments) or on
/// non-Unix platforms.
pub fn thread_cpu_time() -> Duration {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: CLOCK_THREAD_CPUTIME_ID is a valid clock id, `ts` is a valid, writable
        // timespec.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc != 0 {
            return Duration::ZERO;
        }
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(ts.tv_nsec).unwrap_or(0);
        Duration::new(secs, nanos)
    }
    #[cfg(not(unix))]
    {
        Duration::ZERO
    }
}

#[cfg(unix)]
fn timeval(tv: libc::timeval) -> Duration {
    let secs = u64::try_from(tv.tv_sec).unwrap_or(0);
    let micros = u64::try_from(tv.tv_usec).unwrap_or(0);
    Duration::from_secs(secs) + Duration::from_micros(micros)
}

/// The process's peak resident set size in bytes (getrusage `ru_maxrss`; 0 if the
/// call fails).
pub fn max_rss_bytes() -> u64 {
    // SAFETY: getrusage only writes into the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) == 0 {
            (ru.ru_maxrss as u64) * 1024
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Burns CPU on the calling thread for about `d` of wall time.
    fn busy(d: Duration) -> u64 {
        let start = Instant::now();
        let mut x: u64 = 1;
        while start.elapsed() < d {
            for _ in 0..1_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        x
    }

    #[test]
    fn thread_cpu_time_increases_after_busy_loop() {
        let before = thread_cpu_time();
        busy(Duration::from_millis(30));
        let after = thread_cpu_time();
        assert!(after > before, "{before:?} -> {after:?}");
        // Even on a loaded machine the thread got some of those 30 ms.
        assert!(
            after - before >= Duration::from_millis(1),
            "{before:?} -> {after:?}"
        );
    }

    #[test]
    fn process_cpu_time_increases_after_busy_loop() {
        let before = process_cpu_time();
        busy(Duration::from_millis(30));
        let after = process_cpu_time();
        assert!(after > before, "{before:?} -> {after:?}");
        // The process total includes this thread's share (read the thread first: the
        // process figure is truncated to microseconds).
        let thread = thread_cpu_time();
        let process = process_cpu_time();
        assert!(
            process + Duration::from_millis(1) >= thread,
            "{process:?} < {thread:?}"
        );
    }

    #[test]
    fn sleeping_thread_uses_little_cpu() {
        let before = thread_cpu_time();
        std::thread::sleep(Duration::from_millis(50));
        let used = thread_cpu_time() - before;
        assert!(used < Duration::from_millis(10), "{used:?}");
    }
}
