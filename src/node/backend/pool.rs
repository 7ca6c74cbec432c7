//! The pullers' input buffers: a batch's inputs are read into buffers of the
//! pool and go back to it when the batch ends, so a pull writes into pages
//! already mapped rather than into fresh allocations.
//!
//! The pool is bounded ([`POOL_MAX`] buffers, [`POOL_MAX_BYTES`]). When a
//! backend stops, its buffers go to the process's spares (the same bounds),
//! and the next backend made in the process starts with them: a first touch
//! of fresh pages costs a fault and the zeroing of each page (on the 2-core
//! development VM about 150 MB/s against 9 GB/s for writing mapped pages, see
//! `transport::region`'s spares), and in-process clusters made one after the
//! other (the probes of `bench serve`, tests) each paid it again.

use std::sync::Mutex;

/// Most buffers, and most bytes of buffer capacity, one pool (and the spares)
/// keeps.
pub(super) const POOL_MAX: usize = 512;
pub(super) const POOL_MAX_BYTES: usize = 256 << 20;

/// Buffers of stopped backends, for the next backend of this process.
static SPARES: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A backend's pool of input buffers.
pub(super) struct BufferPool {
    bufs: Mutex<Vec<Vec<u8>>>,
    /// Where the buffers go when the pool is dropped (and come from when it
    /// is made).
    spares: &'static Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A pool that starts with the process's spare buffers.
    pub(super) fn new() -> BufferPool {
        BufferPool::with_spares(&SPARES)
    }

    fn with_spares(spares: &'static Mutex<Vec<Vec<u8>>>) -> BufferPool {
        let bufs = std::mem::take(&mut *spares.lock().expect("spares lock"));
        BufferPool {
            bufs: Mutex::new(bufs),
            spares,
        }
    }

    /// Up to `n` buffers (fewer when the pool has fewer).
    pub(super) fn take(&self, n: usize) -> Vec<Vec<u8>> {
        let mut p = self.bufs.lock().expect("pool lock");
        let k = p.len().saturating_sub(n);
        p.split_off(k)
    }

    /// Buffers back into the pool, as many as its bounds allow (the rest are
    /// freed).
    pub(super) fn give(&self, bufs: impl IntoIterator<Item = Vec<u8>>) {
        keep(&mut self.bufs.lock().expect("pool lock"), bufs);
    }

    /// Buffers in the pool now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.bufs.lock().expect("pool lock").len()
    }
}

/// Adds `bufs` to `p` while it holds under [`POOL_MAX`] buffers and
/// [`POOL_MAX_BYTES`]; the rest are dropped.
fn keep(p: &mut Vec<Vec<u8>>, bufs: impl IntoIterator<Item = Vec<u8>>) {
    let mut bytes: usize = p.iter().map(Vec::capacity).sum();
    for b in bufs {
        if b.capacity() == 0 {
            continue;
        }
        if p.len() >= POOL_MAX || bytes + b.capacity() > POOL_MAX_BYTES {
            break;
        }
        bytes += b.capacity();
        p.push(b);
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        let bufs = std::mem::take(&mut *self.bufs.lock().expect("pool lock"));
        keep(&mut self.spares.lock().expect("spares lock"), bufs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dropped pool's buffers (bounded) go to the next pool; buffers given
    /// past the bounds are freed.
    #[test]
    fn a_stopped_backends_buffers_go_to_the_next() {
        static SP: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
        let a = BufferPool::with_spares(&SP);
        assert!(a.take(4).is_empty());
        a.give((0..3).map(|_| Vec::with_capacity(1000)));
        a.give([Vec::new()]);
        assert_eq!(a.len(), 3, "empty buffers are not kept");
        // Past POOL_MAX_BYTES: only what fits is kept.
        let big = POOL_MAX_BYTES / 4;
        a.give((0..6).map(|_| Vec::with_capacity(big)));
        assert_eq!(a.len(), 3 + 3);
        let got = a.take(2);
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|b| b.capacity() >= big));
        drop(a);
        assert_eq!(SP.lock().unwrap().len(), 4);
        let b = BufferPool::with_spares(&SP);
        assert_eq!(b.len(), 4, "the next pool starts with them");
        assert!(SP.lock().unwrap().is_empty());
        let caps: Vec<usize> = b.take(10).iter().map(Vec::capacity).collect();
        assert_eq!(caps.len(), 4);
        assert_eq!(caps.iter().filter(|&&c| c >= big).count(), 1);
    }
}
