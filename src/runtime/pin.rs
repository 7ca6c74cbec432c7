//! CPU pinning: CPU-list parsing and thread affinity.
//!
//! Pinning a latency-critical thread (the scheduler, a backend's dispatch loop) to its
//! own CPU keeps it off the run queue of the other threads and keeps its caches warm.
//! It only helps when there are at least as many CPUs as pinned threads; on a small
//! machine, leave threads unpinned and let the OS balance them.

use anyhow::{bail, Context, Result};

/// The largest CPU count the affinity calls handle (glibc's `CPU_SETSIZE`).
pub const MAX_CPUS: usize = 1024;

/// Pins the calling thread to CPU `cpu` (`sched_setaffinity` on this thread only).
///
/// Fails with an error naming the CPU and the OS error when `cpu` is out of range,
/// offline, or outside the process's allowed set (for example a container's cpuset).
/// On platforms other than Linux it always fails.
pub fn pin_current_thread(cpu: usize) -> Result<()> {
    if cpu >= MAX_CPUS {
        bail!("cannot pin thread to CPU {cpu}: CPU ids must be below {MAX_CPUS}");
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu < MAX_CPUS == CPU_SETSIZE`, so the bit lies inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: pid 0 means the calling thread; `set` is a valid cpu_set_t of the size
        // we pass.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(err).with_context(|| {
                format!(
                    "cannot pin thread to CPU {cpu} (allowed CPUs: {})",
                    format_cpu_list(&allowed_cpus())
                )
            });
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        bail!("cannot pin thread to CPU {cpu}: CPU pinning is only supported on Linux")
    }
}

/// The affinity mask of exactly `cpus` (each below [`MAX_CPUS`]).
#[cfg(target_os = "linux")]
pub fn cpu_set(cpus: &[usize]) -> Result<libc::cpu_set_t> {
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= MAX_CPUS {
            bail!("CPU {cpu}: CPU ids must be below {MAX_CPUS}");
        }
        // SAFETY: `cpu < MAX_CPUS == CPU_SETSIZE`, so the bit lies inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    if cpus.is_empty() {
        bail!("an empty CPU list");
    }
    Ok(set)
}

/// Restricts the calling thread to the CPUs in `cpus`; threads it starts
/// afterwards inherit the mask (so called first, it pins a whole process).
///
/// Fails with an error naming the CPUs and the OS error when one is out of range,
/// offline, or outside the process's allowed set. On platforms other than Linux it
/// always fails.
pub fn pin_current_thread_to(cpus: &[usize]) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        let set = cpu_set(cpus)?;
        // SAFETY: pid 0 means the calling thread; `set` is a valid cpu_set_t of the size
        // we pass.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(err).with_context(|| {
                format!(
                    "cannot restrict this process to CPUs {} (allowed CPUs: {})",
                    format_cpu_list(cpus),
                    format_cpu_list(&allowed_cpus())
                )
            });
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        bail!(
            "cannot restrict this process to CPUs {}: CPU pinning is only supported on Linux",
            format_cpu_list(cpus)
        )
    }
}

/// The CPU the calling thread is running on right now, if the OS can tell.
pub fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `sched_getcpu` takes no arguments and only returns a value.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The ids of the CPUs the calling thread may run on (its affinity mask), ascending.
///
/// Falls back to `0..n` with `n` from [`std::thread::available_parallelism`] when the
/// mask cannot be read (or on platforms other than Linux).
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 means the calling thread; `set` is a valid, writable cpu_set_t of
        // the size we pass.
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        if rc == 0 {
            // SAFETY: every index is below CPU_SETSIZE, so inside `set`.
            let cpus: Vec<usize> = (0..MAX_CPUS)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect();
            if !cpus.is_empty() {
                return cpus;
            }
        }
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

/// How many CPUs the calling thread may run on (at least 1). Respects the affinity mask
/// (`taskset`, container cpusets), unlike the machine's total CPU count.
pub fn available_cpus() -> usize {
    allowed_cpus().len().max(1)
}

/// Parses a CPU list such as `"0,1,3-5"` (the `taskset -c` / `cpuset` syntax) into CPU
/// ids in the order given: `[0, 1, 3, 4, 5]`.
///
/// Items are separated by commas and are either a CPU id or an inclusive range `a-b`
/// with `a <= b`; spaces around items are allowed. Errors name the offending item: an
/// empty list or item, a non-number, a reversed range, an id of [`MAX_CPUS`] or more,
/// or a CPU listed twice.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>> {
    if s.trim().is_empty() {
        bail!("empty CPU list: expected CPU ids or ranges such as \"0,1,3-5\"");
    }
    let mut cpus = Vec::new();
    let mut seen = vec![false; MAX_CPUS];
    for (i, raw) in s.split(',').enumerate() {
        let item = raw.trim();
        if item.is_empty() {
            bail!(
                "bad CPU list {s:?}: item {} is empty (stray or doubled comma?)",
                i + 1
            );
        }
        let (lo, hi) = match item.split_once('-') {
            Some((a, b)) => {
                let lo = parse_cpu_id(a, item, s)?;
                let hi = parse_cpu_id(b, item, s)?;
                if lo > hi {
                    bail!("bad CPU list {s:?}: range {item:?} is reversed (write {hi}-{lo})");
                }
                (lo, hi)
            }
            None => {
                let c = parse_cpu_id(item, item, s)?;
                (c, c)
            }
        };
        for (c, seen) in (lo..=hi).zip(&mut seen[lo..=hi]) {
            if std::mem::replace(seen, true) {
                bail!("bad CPU list {s:?}: CPU {c} is listed more than once");
            }
            cpus.push(c);
        }
    }
    Ok(cpus)
}

/// Parses one CPU id `text` of `item` in list `list`, for [`parse_cpu_list`].
fn parse_cpu_id(text: &str, item: &str, list: &str) -> Result<usize> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        bail!("bad CPU list {list:?}: {item:?} is not a CPU id or a range like 3-5");
    }
    let c: usize = t
        .parse()
        .with_context(|| format!("bad CPU list {list:?}: CPU id {t:?} is too large"))?;
    if c >= MAX_CPUS {
        bail!("bad CPU list {list:?}: CPU {c} is out of range (ids must be below {MAX_CPUS})");
    }
    Ok(c)
}

/// Formats CPU ids compactly, merging runs: `[0, 1, 2, 5]` gives `"0-2,5"`.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j == i {
            out.push_str(&cpus[i].to_string());
        } else {
            out.push_str(&format!("{}-{}", cpus[i], cpus[j]));
        }
        i = j + 1;
    }
    out
}

/// Sets the calling thread's timer slack (Linux `PR_SET_TIMERSLACK`): how much the
/// kernel may delay its timed sleeps to batch wake-ups (50 us by default). Threads
/// that sleep until a planned moment (the RankThread, emulated GPUs) set 1 ns so a
/// sleep ends within microseconds and they need not spin long. Best effort: does
/// nothing elsewhere.
pub fn set_timer_slack_ns(ns: u64) {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = ns;
}

/// Raises (negative) or lowers the calling thread's nice value, best effort: threads
/// that must wake at a planned moment (the RankThread, GPU workers) get a larger
/// CPU share and preempt busier threads sooner when the machine is oversubscribed.
/// Returns whether it took effect (raising needs CAP_SYS_NICE, e.g. root).
pub fn set_thread_nice(nice: i32) -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take integers and touch no memory.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = nice;
        false
    }
}

/// Puts the calling thread in the real-time FIFO class at `priority` (1-99): it
/// then runs ahead of every ordinary thread on its CPU until it sleeps. Needs
/// CAP_SYS_NICE (root); fails with the OS error otherwise, and on platforms
/// other than Linux.
pub fn set_thread_fifo(priority: i32) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: pid 0 means the calling thread; `param` is a valid sched_param.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| {
                format!("cannot run a thread at real-time priority {priority} (SCHED_FIFO needs root or CAP_SYS_NICE)")
            });
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        bail!("cannot run a thread at real-time priority {priority}: only supported on Linux")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        format!("{:#}", parse_cpu_list(s).expect_err(s))
    }

    #[test]
    fn parses_ids_and_ranges() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0,1,3-5").unwrap(), vec![0, 1, 3, 4, 5]);
        assert_eq!(parse_cpu_list(" 2 , 7-7,0 ").unwrap(), vec![2, 7, 0]);
        assert_eq!(parse_cpu_list("4-6,1").unwrap(), vec![4, 5, 6, 1]);
        assert_eq!(parse_cpu_list("1023").unwrap(), vec![1023]);
    }

    #[test]
    fn rejects_bad_lists_with_clear_errors() {
        assert!(err("").contains("empty CPU list"), "{}", err(""));
        assert!(err("  ").contains("empty CPU list"));
        let e = err("0,,1");
        assert!(e.contains("item 2 is empty"), "{e}");
        assert!(err("0,").contains("item 2 is empty"));
        assert!(err(",0").contains("item 1 is empty"));
        let e = err("5-3");
        assert!(
            e.contains("\"5-3\" is reversed") && e.contains("3-5"),
            "{e}"
        );
        let e = err("0,x");
        assert!(e.contains("\"x\" is not a CPU id"), "{e}");
        for bad in ["-1", "1-", "-", "1-2-3", "+1", "1.5", "0x1", "a-3", "3-b"] {
            let e = err(bad);
            assert!(e.contains("is not a CPU id"), "{bad}: {e}");
        }
        let e = err("1024");
        assert!(e.contains("CPU 1024 is out of range"), "{e}");
        let e = err("0-99999999999999999999999");
        assert!(e.contains("too large"), "{e}");
        let e = err("0-2,1");
        assert!(e.contains("CPU 1 is listed more than once"), "{e}");
    }

    #[test]
    fn formats_compactly() {
        assert_eq!(format_cpu_list(&[]), "");
        assert_eq!(format_cpu_list(&[3]), "3");
        assert_eq!(format_cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        let cpus = parse_cpu_list("0-3,8,10-11").unwrap();
        assert_eq!(parse_cpu_list(&format_cpu_list(&cpus)).unwrap(), cpus);
    }

    #[test]
    fn available_cpus_is_consistent() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(available_cpus(), cpus.len());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn pins_to_cpu_0() {
        // Pin in a thread of our own so the test harness's threads keep their affinity.
        let target = allowed_cpus()[0]; // CPU 0 unless a cpuset excludes it
        let res = std::thread::spawn(move || {
            pin_current_thread(target)?;
            std::thread::yield_now();
            Ok::<_, anyhow::Error>((allowed_cpus(), current_cpu()))
        })
        .join()
        .expect("pinning thread panicked");
        let (allowed, running_on) = res.expect("pinning to an allowed CPU");
        assert_eq!(allowed, vec![target]);
        assert_eq!(running_on, Some(target));
    }

    #[test]
    fn pinning_to_a_bad_cpu_names_it() {
        let e = format!("{:#}", pin_current_thread(MAX_CPUS + 3).unwrap_err());
        assert!(e.contains("CPU 1027"), "{e}");
        #[cfg(target_os = "linux")]
        {
            // A CPU outside the allowed set (the machine has fewer than 1023 CPUs here).
            let res = std::thread::spawn(|| pin_current_thread(MAX_CPUS - 1))
                .join()
                .expect("pinning thread panicked");
            if !allowed_cpus().contains(&(MAX_CPUS - 1)) {
                let e = format!("{:#}", res.unwrap_err());
                assert!(e.contains("CPU 1023") && e.contains("allowed CPUs"), "{e}");
            }
        }
    }
}
