//! The total of request bodies an HTTP server buffers at once
//! (`--http-max-buffered-bytes`, by default a quarter of the machine's
//! memory): each body takes its declared length (or its bytes as they come,
//! without one) before it is read, and gives it back when its request is
//! answered; a body that would pass the total is answered 503 with
//! `Retry-After` before a byte of it is buffered. So many clients holding
//! large bodies open cannot take the process's memory, only their share of
//! the budget, and only until the body timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The budget shared by a server's requests.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    held: AtomicUsize,
}

/// Bytes one request holds of the budget, given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl BodyBudget {
    pub fn new(limit: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            limit,
            held: AtomicUsize::new(0),
        })
    }

    /// Nothing held yet, for one request.
    pub fn hold(self: &Arc<Self>) -> Held {
        Held {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// The bytes held by all requests now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl Held {
    /// Takes `n` more bytes; false (nothing taken) when the total would pass
    /// the limit.
    pub fn take(&mut self, n: usize) -> bool {
        let b = &self.budget;
        let mut cur = b.held.load(Ordering::Acquire);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&t| t <= b.limit) else {
                return false;
            };
            match b
                .held
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.bytes += n;
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// The bytes this request holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The budget by default: a quarter of the machine's memory (`MemTotal`),
/// at least 256 MiB (1 GiB when it cannot be read).
pub fn default_buffered_bytes() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb.saturating_mul(1024));
    match total {
        Some(b) => ((b / 4) as usize).max(256 << 20),
        None => 1 << 30,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_up_to_the_limit_and_gives_back_on_drop() {
        let b = BodyBudget::new(100);
        let mut a = b.hold();
        assert!(a.take(60));
        let mut c = b.hold();
        assert!(!c.take(41), "over the limit: nothing taken");
        assert_eq!(b.held(), 60);
        assert!(c.take(40));
        assert!(!a.take(1));
        drop(a);
        assert_eq!(b.held(), 40);
        assert!(c.take(60));
        drop(c);
        assert_eq!(b.held(), 0);
        assert!(!b.hold().take(usize::MAX));
        assert!(default_buffered_bytes() >= 256 << 20);
    }
}
