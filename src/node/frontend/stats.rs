//! Per-model statistics of a frontend's in-process clients (the HTTP and gRPC
//! APIs), in the terms of Triton's statistics extension, kept from what each
//! answer says (its latency, its time in the queue, its batch's size) with a
//! few relaxed atomic adds per sample. What they count:
//!
//! * `inference_count`: samples answered good; `success` / `fail`: requests
//!   (a request of N samples counts once) and their time from receipt to answer.
//! * `queue`: per good sample, from its receipt to its batch's start.
//! * `compute_infer`: per good sample, from its batch's start to its answer
//!   (the batch's input pull, run and result push together); Triton's
//!   `compute_input` and `compute_output` are not measured apart.
//! * `execution_count`, per-batch-size counts: batches as this frontend saw
//!   them (a sample in a batch of b counts 1/b of an execution), so with
//!   several frontends each reports its share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A count and its total time (Triton's `StatisticDuration`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub count: u64,
    pub ns: u64,
}

#[derive(Default)]
struct AtomicStat {
    count: AtomicU64,
    ns: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

impl AtomicStat {
    fn add(&self, n: u64, d: Duration) {
        self.count.fetch_add(n, Ordering::Relaxed);
        self.ns.fetch_add(nanos(d), Ordering::Relaxed);
    }
    fn get(&self) -> Stat {
        Stat {
            count: self.count.load(Ordering::Relaxed),
            ns: self.ns.load(Ordering::Relaxed),
        }
    }
}

/// Executions are counted in millionths (a sample of a batch of b adds 1/b).
const EXEC_UNIT: u64 = 1_000_000;

/// One batch size's executions and the compute time of their good samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchStat {
    pub size: u64,
    pub count: u64,
    pub ns: u64,
}

/// The statistics at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub success: Stat,
    pub fail: Stat,
    pub queue: Stat,
    pub compute_infer: Stat,
    pub inference_count: u64,
    pub execution_count: u64,
    /// Milliseconds since the Unix epoch of the last answer (0: none yet).
    pub last_inference_ms: u64,
    /// The batch sizes seen, smallest first.
    pub batches: Vec<BatchStat>,
}

/// One model's statistics (see the module docs).
pub struct ModelStats {
    success: AtomicStat,
    fail: AtomicStat,
    queue: AtomicStat,
    compute_infer: AtomicStat,
    last_ms: AtomicU64,
    /// Per batch size b (index b − 1): executions × [`EXEC_UNIT`] and the
    /// good samples' compute time. (The inference count is the queue's
    /// count, the execution count the sum over batch sizes.)
    batches: Vec<(AtomicU64, AtomicU64)>,
}

impl ModelStats {
    /// A model run in batches of at most `max_batch`.
    pub fn new(max_batch: u32) -> ModelStats {
        ModelStats {
            success: AtomicStat::default(),
            fail: AtomicStat::default(),
            queue: AtomicStat::default(),
            compute_infer: AtomicStat::default(),
            last_ms: AtomicU64::new(0),
            batches: (0..max_batch.clamp(1, 4096))
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
        }
    }

    /// A good sample: its time in the queue, from its batch's start to its
    /// answer, and its batch's size.
    pub fn sample(&self, queue: Duration, compute: Duration, batch: u32) {
        self.queue.add(1, queue);
        self.compute_infer.add(1, compute);
        let b = batch.max(1) as u64;
        let i = (b as usize - 1).min(self.batches.len() - 1);
        let (n, ns) = &self.batches[i];
        n.fetch_add(EXEC_UNIT / b, Ordering::Relaxed);
        ns.fetch_add(nanos(compute), Ordering::Relaxed);
    }

    /// A request answered, good or not, `latency` after its receipt.
    pub fn request(&self, good: bool, latency: Duration) {
        if good {
            self.success.add(1, latency);
        } else {
            self.fail.add(1, latency);
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let execs = |units: u64| (units + EXEC_UNIT / 2) / EXEC_UNIT;
        let queue = self.queue.get();
        let units: u64 = self
            .batches
            .iter()
            .map(|(n, _)| n.load(Ordering::Relaxed))
            .sum();
        StatsSnapshot {
            success: self.success.get(),
            fail: self.fail.get(),
            queue,
            compute_infer: self.compute_infer.get(),
            inference_count: queue.count,
            execution_count: execs(units),
            last_inference_ms: self.last_ms.load(Ordering::Relaxed),
            batches: self
                .batches
                .iter()
                .enumerate()
                .filter(|(_, (n, _))| n.load(Ordering::Relaxed) > 0)
                .map(|(i, (n, ns))| BatchStat {
                    size: i as u64 + 1,
                    count: execs(n.load(Ordering::Relaxed)),
                    ns: ns.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_samples_requests_and_batches() {
        let s = ModelStats::new(8);
        // A request of 2 samples that ran in one batch of 2, and one of 1
        // sample in a batch of 4 (3 of that batch came from elsewhere).
        s.sample(Duration::from_micros(100), Duration::from_micros(900), 2);
        s.sample(Duration::from_micros(100), Duration::from_micros(900), 2);
        s.request(true, Duration::from_millis(1));
        s.sample(Duration::from_micros(50), Duration::from_micros(500), 4);
        s.request(true, Duration::from_millis(1));
        s.request(false, Duration::from_millis(3));
        let v = s.snapshot();
        assert_eq!(v.inference_count, 3);
        assert_eq!(
            v.execution_count, 1,
            "1 batch of 2 and a quarter of one of 4"
        );
        assert_eq!(
            v.success,
            Stat {
                count: 2,
                ns: 2_000_000
            }
        );
        assert_eq!(v.fail.count, 1);
        assert_eq!(v.queue.ns, 250_000);
        assert_eq!(v.compute_infer.ns, 2_300_000);
        assert_eq!(v.batches.len(), 2);
        assert_eq!((v.batches[0].size, v.batches[0].count), (2, 1));
        assert_eq!(v.batches[1].size, 4);
        assert!(v.last_inference_ms > 0);
    }

    #[test]
    fn a_batch_over_the_largest_counts_in_the_last_slot() {
        let s = ModelStats::new(2);
        s.sample(Duration::ZERO, Duration::ZERO, 9);
        assert_eq!(s.snapshot().batches[0].size, 2);
    }
}
