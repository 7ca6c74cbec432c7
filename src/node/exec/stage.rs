//! Input buffers an executor lends to its GPU's puller ([`StagePool`]), so a
//! batch's inputs land where the executor runs them: the pull copies each
//! input from the frontend's region straight into its row of the batch's
//! buffer, and the executor hands that buffer to its runtime as the batch's
//! input tensor, with no gather in between.
//!
//! A model is staged when a request's bytes are one input tensor's sample
//! (a request is then one row); each batch in flight has a buffer of its
//! own (the puller fills the next batch's while the worker runs the one
//! before), taken from the pool and given back when the batch is done.

use crate::core::ModelId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Most idle buffers a pool keeps per model (one running, one pulled and
/// waiting, one being pulled).
const FREE_MAX: usize = 3;

#[derive(Debug)]
struct Spec {
    row_bytes: usize,
    rows: usize,
    free: Vec<Vec<u64>>,
}

/// The staged models of one executor and their idle buffers.
#[derive(Debug, Default)]
pub struct StagePool {
    models: Mutex<HashMap<ModelId, Spec>>,
}

impl StagePool {
    pub fn new() -> Arc<StagePool> {
        Arc::new(StagePool::default())
    }

    /// Stages `model`: batches of up to `rows` requests of `row_bytes` bytes.
    pub fn enable(&self, model: ModelId, row_bytes: usize, rows: usize) {
        self.models.lock().expect("lock").insert(
            model,
            Spec {
                row_bytes,
                rows,
                free: Vec::new(),
            },
        );
    }

    /// `model` is no longer staged (unloaded); its idle buffers are freed.
    pub fn disable(&self, model: ModelId) {
        self.models.lock().expect("lock").remove(&model);
    }

    /// The request size of a staged model (None: not staged).
    pub fn row_bytes(&self, model: ModelId) -> Option<usize> {
        self.models
            .lock()
            .expect("lock")
            .get(&model)
            .map(|s| s.row_bytes)
    }

    /// A buffer for a batch of `n` requests of `model` (None: the model is not
    /// staged, or `n` is more rows than its buffers have).
    pub fn take(self: &Arc<Self>, model: ModelId, n: usize) -> Option<Staged> {
        let (row_bytes, rows, mem) = {
            let mut m = self.models.lock().expect("lock");
            let s = m.get_mut(&model).filter(|s| n <= s.rows)?;
            (s.row_bytes, s.rows, s.free.pop())
        };
        // 8-byte words: any element type can be viewed in place.
        let mem = mem.unwrap_or_else(|| vec![0u64; (rows * row_bytes).div_ceil(8).max(1)]);
        Some(Staged {
            model,
            row_bytes,
            rows,
            mem,
            pool: Arc::downgrade(self),
        })
    }

    fn give(&self, model: ModelId, row_bytes: usize, mem: Vec<u64>) {
        let mut m = self.models.lock().expect("lock");
        if let Some(s) = m.get_mut(&model) {
            if s.row_bytes == row_bytes && s.free.len() < FREE_MAX {
                s.free.push(mem);
            }
        }
    }
}

/// One batch's input buffer: `rows` rows of `row_bytes` bytes, 8-byte aligned.
/// Goes back to its pool when dropped.
#[derive(Debug)]
pub struct Staged {
    model: ModelId,
    row_bytes: usize,
    rows: usize,
    mem: Vec<u64>,
    pool: Weak<StagePool>,
}

impl Staged {
    pub fn model(&self) -> ModelId {
        self.model
    }
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Every row's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: any u64 memory is valid as bytes; the slice borrows `mem`.
        let all = unsafe {
            std::slice::from_raw_parts(self.mem.as_ptr().cast::<u8>(), self.mem.len() * 8)
        };
        &all[..self.rows * self.row_bytes]
    }

    /// Every row's bytes, to write (or to hand to a runtime as a tensor).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.rows * self.row_bytes;
        // SAFETY: as in `bytes`; the slice borrows `mem` mutably.
        let all = unsafe {
            std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<u8>(), self.mem.len() * 8)
        };
        &mut all[..len]
    }

    pub fn row(&self, k: usize) -> &[u8] {
        &self.bytes()[k * self.row_bytes..(k + 1) * self.row_bytes]
    }

    pub fn row_mut(&mut self, k: usize) -> &mut [u8] {
        let rb = self.row_bytes;
        &mut self.bytes_mut()[k * rb..(k + 1) * rb]
    }

    /// Moves rows `keep` (ascending) to the front, row `keep[j]` to row j (the
    /// tasks a batch runs, when some were left out); returns the bytes moved.
    pub fn compact(&mut self, keep: &[usize]) -> usize {
        let rb = self.row_bytes;
        let mut moved = 0;
        for (j, &k) in keep.iter().enumerate() {
            debug_assert!(k >= j, "rows kept in order");
            if k != j {
                self.bytes_mut().copy_within(k * rb..(k + 1) * rb, j * rb);
                moved += rb;
            }
        }
        moved
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(p) = self.pool.upgrade() {
            p.give(self.model, self.row_bytes, std::mem::take(&mut self.mem));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_lent_per_batch_and_come_back_when_dropped() {
        let pool = StagePool::new();
        assert!(pool.take(ModelId(0), 1).is_none(), "not staged");
        pool.enable(ModelId(0), 12, 4);
        assert!(
            pool.take(ModelId(0), 5).is_none(),
            "more rows than a buffer has"
        );
        let mut a = pool.take(ModelId(0), 3).unwrap();
        let b = pool.take(ModelId(0), 3).unwrap();
        assert_ne!(a.bytes().as_ptr(), b.bytes().as_ptr(), "one per batch");
        assert_eq!(a.bytes().as_ptr() as usize % 8, 0);
        for k in 0..4 {
            a.row_mut(k).fill(k as u8);
        }
        assert_eq!(a.compact(&[0, 2, 3]), 24);
        assert_eq!(a.row(1), &[2u8; 12][..]);
        assert_eq!(a.row(2), &[3u8; 12][..]);
        let p = a.bytes().as_ptr();
        drop(a);
        let c = pool.take(ModelId(0), 1).unwrap();
        assert_eq!(c.bytes().as_ptr(), p, "a dropped buffer is lent again");
        pool.disable(ModelId(0));
        drop(b);
        assert!(pool.take(ModelId(0), 1).is_none());
    }
}
