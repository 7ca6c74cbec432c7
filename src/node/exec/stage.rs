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
//!
//! The buffers are heap memory unless the pool was made with an allocator
//! ([`StagePool::with_alloc`]): the `cuda` executor's allocates page-locked
//! host memory, so the device's copy of the batch reads the pulled bytes
//! where they landed. An allocation that fails leaves the batch unstaged (its
//! inputs then go through the executor's own buffer, as before).

use crate::core::ModelId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Most idle buffers a pool keeps per model (one running, one pulled and
/// waiting, one being pulled).
const FREE_MAX: usize = 3;

/// Memory a pool's allocator gives: `len()` bytes at `as_ptr()` (the same
/// address as `as_mut_ptr()`), 8-byte aligned, that stay where they are until
/// dropped.
pub trait StageMem: Send {
    fn as_ptr(&self) -> *const u8;
    fn as_mut_ptr(&mut self) -> *mut u8;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a pool allocates its buffers with: `bytes` bytes, or None when it
/// cannot (the batch is then not staged).
pub type StageAlloc = Box<dyn Fn(usize) -> Option<Box<dyn StageMem>> + Send + Sync>;

/// A buffer's memory: the heap's, or its pool's allocator's.
enum Mem {
    Heap(Vec<u64>),
    Alloc(Box<dyn StageMem>),
}

impl Mem {
    fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: any u64 memory is valid as bytes; the slice borrows it.
            Mem::Heap(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 8)
            },
            // SAFETY: the allocator's memory is `len()` bytes at `as_ptr()`
            // that do not move while `m` lives; the slice borrows `m`.
            Mem::Alloc(m) => unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) },
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: any u64 memory is valid as bytes; the slice borrows it.
            Mem::Heap(v) => unsafe {
                std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 8)
            },
            // SAFETY: the allocator's memory is `len()` bytes at `as_mut_ptr()`
            // that do not move while `m` lives; the slice borrows `m`.
            Mem::Alloc(m) => unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr(), m.len()) },
        }
    }
}

impl std::fmt::Debug for Mem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mem::Heap(v) => write!(f, "Heap({} bytes)", v.len() * 8),
            Mem::Alloc(m) => write!(f, "Alloc({} bytes)", m.len()),
        }
    }
}

#[derive(Debug)]
struct Spec {
    row_bytes: usize,
    rows: usize,
    free: Vec<Mem>,
}

/// The staged models of one executor and their idle buffers.
#[derive(Default)]
pub struct StagePool {
    models: Mutex<HashMap<ModelId, Spec>>,
    alloc: Option<StageAlloc>,
}

impl std::fmt::Debug for StagePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagePool")
            .field("models", &self.models)
            .field("alloc", &self.alloc.is_some())
            .finish()
    }
}

impl StagePool {
    pub fn new() -> Arc<StagePool> {
        Arc::new(StagePool::default())
    }

    /// A pool whose buffers `alloc` allocates (see the module's text).
    pub fn with_alloc(alloc: StageAlloc) -> Arc<StagePool> {
        Arc::new(StagePool {
            models: Mutex::default(),
            alloc: Some(alloc),
        })
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
        let bytes = rows * row_bytes;
        let mem = match (mem, &self.alloc) {
            (Some(m), _) => m,
            // 8-byte words: any element type can be viewed in place.
            (None, None) => Mem::Heap(vec![0u64; bytes.div_ceil(8).max(1)]),
            (None, Some(a)) => {
                let mut m = a(bytes.max(1))?;
                if m.len() < bytes || m.as_mut_ptr().align_offset(8) != 0 {
                    return None;
                }
                Mem::Alloc(m)
            }
        };
        Some(Staged {
            model,
            row_bytes,
            rows,
            mem: Some(mem),
            pool: Arc::downgrade(self),
        })
    }

    fn give(&self, model: ModelId, row_bytes: usize, mem: Mem) {
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
    /// None only while it goes back to its pool.
    mem: Option<Mem>,
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
        let len = self.rows * self.row_bytes;
        &self
            .mem
            .as_ref()
            .expect("a buffer lent has its memory")
            .bytes()[..len]
    }

    /// Every row's bytes, to write (or to hand to a runtime as a tensor).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.rows * self.row_bytes;
        &mut self
            .mem
            .as_mut()
            .expect("a buffer lent has its memory")
            .bytes_mut()[..len]
    }

    /// Whether the buffer is its pool allocator's memory (page-locked, on a
    /// GPU) rather than the heap's.
    pub fn is_allocated(&self) -> bool {
        matches!(self.mem, Some(Mem::Alloc(_)))
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
        if let (Some(p), Some(m)) = (self.pool.upgrade(), self.mem.take()) {
            p.give(self.model, self.row_bytes, m);
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

    /// Memory from a test allocator: 8-byte words on the heap.
    struct Words(Vec<u64>, usize);

    impl StageMem for Words {
        fn as_ptr(&self) -> *const u8 {
            self.0.as_ptr().cast()
        }
        fn as_mut_ptr(&mut self) -> *mut u8 {
            self.0.as_mut_ptr().cast()
        }
        fn len(&self) -> usize {
            self.1
        }
    }

    #[test]
    fn a_pool_with_an_allocator_lends_its_memory_and_keeps_it() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        // Gives what is asked, up to 4 buffers, then nothing (a pinned
        // allocation that fails).
        let pool = StagePool::with_alloc(Box::new(move |bytes| {
            (m.fetch_add(1, Ordering::Relaxed) < 4)
                .then(|| Box::new(Words(vec![0; bytes.div_ceil(8)], bytes)) as Box<dyn StageMem>)
        }));
        pool.enable(ModelId(1), 10, 3);
        let mut a = pool.take(ModelId(1), 2).unwrap();
        assert!(a.is_allocated());
        assert_eq!(a.bytes().len(), 30);
        a.row_mut(2).fill(7);
        assert_eq!(a.row(2), &[7u8; 10][..]);
        let p = a.bytes().as_ptr();
        drop(a);
        let b = pool.take(ModelId(1), 3).unwrap();
        assert_eq!(b.bytes().as_ptr(), p, "kept and lent again");
        assert_eq!(made.load(Ordering::Relaxed), 1, "no second allocation");
        let held: Vec<Staged> = (0..3).map(|_| pool.take(ModelId(1), 1).unwrap()).collect();
        assert_eq!(made.load(Ordering::Relaxed), 4);
        assert!(
            pool.take(ModelId(1), 1).is_none(),
            "an allocation that fails leaves the batch unstaged"
        );
        drop(held);
        // Memory shorter than the buffer needs is not lent.
        let short = StagePool::with_alloc(Box::new(|bytes| {
            Some(Box::new(Words(vec![0; bytes.div_ceil(8)], bytes - 1)) as Box<dyn StageMem>)
        }));
        short.enable(ModelId(2), 16, 2);
        assert!(short.take(ModelId(2), 1).is_none());
        drop(b);
    }
}
