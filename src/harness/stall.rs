//! Injected host stalls (`fermata bench http --stall MS@S`): every S seconds,
//! one real-time thread per CPU spins for MS milliseconds, so that for that
//! long neither the server nor the load generator runs, as when a hypervisor
//! deschedules a VM's vCPUs or a higher-priority process takes every core.
//!
//! What it is for: on a shared machine the front door's rare bursts of bad
//! requests start with such stalls of 10-20 ms (docs/results.md, "Front
//! door"); injecting them at a known rhythm turns a rare event into a
//! measurable one, so that what a stall costs (the bad requests per stall) can
//! be compared between builds, policies and settings.
//!
//! Written here rather than taken from a crate: it is a few threads and two
//! system calls, and what matters (FIFO class, one thread pinned per CPU, an
//! absolute schedule) is specific to the measurement.

use anyhow::{bail, Context, Result};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest stall accepted.
pub const STALL_MAX: Duration = Duration::from_millis(500);
/// The stalls may take at most this share of the time (the machine must run
/// between them; Linux's real-time throttling would cut in at 95%).
pub const STALL_SHARE_MAX: f64 = 0.5;
/// The real-time priority of the stalling threads (above any thread of ours;
/// kernel threads that matter, such as the migration threads, are at 99).
const PRIORITY: i32 = 90;

/// `MS@S`: a stall of `len` every `every`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StallSpec {
    pub len: Duration,
    pub every: Duration,
}

impl FromStr for StallSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("`{s}`: expected MS@S, e.g. 20@1.5 (a 20-ms stall every 1.5 s)");
        let (ms, secs) = s.split_once('@').ok_or_else(usage)?;
        let ms: f64 = ms.trim().parse().map_err(|_| usage())?;
        let secs: f64 = secs.trim().parse().map_err(|_| usage())?;
        if !(ms > 0.0 && ms <= STALL_MAX.as_secs_f64() * 1e3) {
            return Err(format!(
                "`{s}`: the stall must be more than 0 and at most {} ms",
                STALL_MAX.as_millis()
            ));
        }
        if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
            return Err(format!(
                "`{s}`: the period must be more than 0 and at most 3600 s"
            ));
        }
        if ms / 1e3 > STALL_SHARE_MAX * secs {
            return Err(format!(
                "`{s}`: stalls may take at most {:.0}% of the time",
                STALL_SHARE_MAX * 100.0
            ));
        }
        Ok(StallSpec {
            len: Duration::from_secs_f64(ms / 1e3),
            every: Duration::from_secs_f64(secs),
        })
    }
}

/// The running stalls; they end when it is stopped or dropped.
pub struct Staller {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Staller {
    /// Starts one stalling thread on each CPU this process may use. The stalls
    /// start at `from + k * spec.every` (k = 1, 2, ...) as long as that is
    /// before `until` (none when `until` comes first: a check that the threads
    /// can be made). Fails, with nothing left running, when a thread cannot be
    /// pinned or made real-time.
    pub fn start(spec: StallSpec, from: Instant, until: Instant) -> Result<Staller> {
        let cpus = crate::runtime::pin::allowed_cpus();
        if cpus.is_empty() {
            bail!("--stall: cannot tell which CPUs this process may use");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let mut s = Staller {
            stop: stop.clone(),
            done: done.clone(),
            threads: Vec::new(),
        };
        for (i, &cpu) in cpus.iter().enumerate() {
            let (stop, done, ready) = (stop.clone(), done.clone(), ready_tx.clone());
            let h = std::thread::Builder::new()
                .name(format!("stall-{cpu}"))
                .spawn(move || {
                    let set = crate::runtime::pin::pin_current_thread(cpu)
                        .and_then(|()| crate::runtime::pin::set_thread_fifo(PRIORITY));
                    let ok = set.is_ok();
                    let _ = ready.send(set);
                    if ok {
                        let times = (1u32..)
                            .map(|k| from + spec.every * k)
                            .take_while(|&t| t < until);
                        stall_loop(times, spec.len, &stop, (i == 0).then_some(&*done));
                    }
                })
                .context("starting a stall thread")?;
            s.threads.push(h);
        }
        drop(ready_tx);
        for _ in 0..cpus.len() {
            let r = ready_rx
                .recv()
                .context("a stall thread ended before it started")?;
            r.context("--stall")?;
        }
        Ok(s)
    }

    /// Stops the stalls (one in progress ends first) and returns how many
    /// were injected.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.done.load(Ordering::Relaxed)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Staller {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Sleeps until each stall's start (`times`: one absolute schedule, so every
/// CPU stalls at the same moments) and spins through it; `count` (one
/// thread's) counts the stalls.
fn stall_loop(
    times: impl Iterator<Item = Instant>,
    len: Duration,
    stop: &AtomicBool,
    count: Option<&AtomicU64>,
) {
    // Checked at least this often while waiting, so stopping is prompt.
    const NAP: Duration = Duration::from_millis(50);
    for at in times {
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            if now >= at {
                break;
            }
            std::thread::sleep((at - now).min(NAP));
        }
        let end = at + len;
        // A stall woken after its end (it cannot be on a real-time thread
        // unless the machine itself stopped) is not counted.
        let due = Instant::now() < end;
        while Instant::now() < end {
            std::hint::spin_loop();
        }
        if let (true, Some(c)) = (due, count) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(
            "20@1.5".parse::<StallSpec>(),
            Ok(StallSpec {
                len: Duration::from_millis(20),
                every: Duration::from_millis(1500)
            })
        );
        for (bad, why) in [
            ("20", "expected MS@S"),
            ("x@1", "expected MS@S"),
            ("0@1", "more than 0"),
            ("600@10", "at most 500 ms"),
            ("20@0", "period"),
            ("20@inf", "period"),
            ("300@0.5", "at most 50%"),
        ] {
            let e = bad.parse::<StallSpec>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// Where the process may run real-time threads (root), stalls happen on
    /// schedule and stop when asked; elsewhere starting fails with the reason.
    #[test]
    fn stalls_run_on_schedule_or_fail_clearly() {
        let spec = StallSpec {
            len: Duration::from_millis(2),
            every: Duration::from_millis(40),
        };
        let t0 = Instant::now();
        // Stalls at 40, 80, 120 and 160 ms: none at or after `until` = 200 ms,
        // however late the sleep ends.
        match Staller::start(spec, t0, t0 + Duration::from_millis(200)) {
            Ok(s) => {
                std::thread::sleep(Duration::from_millis(300));
                assert!(t0.elapsed() >= Duration::from_millis(300));
                assert_eq!(s.stop(), 4);
            }
            Err(e) => {
                let e = format!("{e:#}");
                assert!(e.contains("SCHED_FIFO") || e.contains("pin"), "{e}");
            }
        }
    }
}
