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
//!
//! Page-locked memory is slow to allocate (tens to hundreds of milliseconds for
//! a batch of images while the GPU runs other batches), so a pool with an
//! allocator fills a model's idle buffers before the model is served: on the
//! loading thread ([`StagePool::reserve`]), or when it is enabled. A batch
//! then allocates only when more of the model's batches are in flight than it
//! keeps idle.

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
    /// Buffers filled ahead for models being loaded, handed over when each is
    /// enabled with the same layout (at most one set per model).
    reserved: Mutex<HashMap<ModelId, Spec>>,
    alloc: Option<StageAlloc>,
}

impl std::fmt::Debug for StagePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagePool")
            .field("models", &self.models)
            .field("reserved", &self.reserved)
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
            reserved: Mutex::default(),
            alloc: Some(alloc),
        })
    }

    /// Stages `model`: batches of up to `rows` requests of `row_bytes` bytes.
    /// Its idle buffers are those [`StagePool::reserve`] filled for the same
    /// layout, else (with an allocator) filled now.
    pub fn enable(&self, model: ModelId, row_bytes: usize, rows: usize) {
        let ahead = self
            .reserved
            .lock()
            .expect("lock")
            .remove(&model)
            .filter(|s| s.row_bytes == row_bytes && s.rows == rows);
        let free = match ahead {
            Some(s) => s.free,
            None => self.fill(row_bytes, rows),
        };
        self.models.lock().expect("lock").insert(
            model,
            Spec {
                row_bytes,
                rows,
                free,
            },
        );
    }

    /// Fills idle buffers for `model` ahead of [`StagePool::enable`] (from the
    /// thread that loads it, off the batches' path). Does nothing without an
    /// allocator: heap buffers are cheap to make when a batch needs one.
    pub fn reserve(&self, model: ModelId, row_bytes: usize, rows: usize) {
        if self.alloc.is_none() {
            return;
        }
        let free = self.fill(row_bytes, rows);
        self.reserved.lock().expect("lock").insert(
            model,
            Spec {
                row_bytes,
                rows,
                free,
            },
        );
    }

    /// `model` is no longer staged (unloaded); its idle and reserved buffers
    /// are freed.
    pub fn disable(&self, model: ModelId) {
        self.models.lock().expect("lock").remove(&model);
        self.reserved.lock().expect("lock").remove(&model);
    }

    /// Up to [`FREE_MAX`] buffers from the allocator (none without one), to
    /// the first that fails.
    fn fill(&self, row_bytes: usize, rows: usize) -> Vec<Mem> {
        if self.alloc.is_none() {
            return Vec::new();
        }
        (0..FREE_MAX)
            .map_while(|_| self.allocate(rows * row_bytes))
            .collect()
    }

    /// A new buffer of `bytes` bytes: the allocator's (None when it fails or
    /// gives memory too short or misaligned), else the heap's.
    fn allocate(&self, bytes: usize) -> Option<Mem> {
        match &self.alloc {
            // 8-byte words: any element type can be viewed in place.
            None => Some(Mem::Heap(vec![0u64; bytes.div_ceil(8).max(1)])),
            Some(a) => {
                let mut m = a(bytes.max(1))?;
                if m.len() < bytes || m.as_mut_ptr().align_offset(8) != 0 {
                    return None;
                }
                Some(Mem::Alloc(m))
            }
        }
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
        let mem = match mem {
            Some(m) => m,
            None => self.allocate(rows * row_bytes)?,
        };
        Some(Staged {
            model,
            row_bytes,
            rows,
            mem: Some(mem),
            pool: Arc::downgrade(self),
        })
    }

    fn give(&self, model: ModelId, row_bytes: usize, rows: usize, mem: Mem) {
        let mut m = self.models.lock().expect("lock");
        if let Some(s) = m.get_mut(&model) {
            // A buffer of another layout (the model was reloaded meanwhile) is
            // freed: it may be too short for the new one's batches.
            if s.row_bytes == row_bytes && s.rows == rows && s.free.len() < FREE_MAX {
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

    /// Every row, each to write apart.
    pub fn rows_mut(&mut self) -> Vec<&mut [u8]> {
        let rb = self.row_bytes;
        self.bytes_mut().chunks_exact_mut(rb.max(1)).collect()
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
            p.give(self.model, self.row_bytes, self.rows, m);
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
        assert_eq!(
            made.load(Ordering::Relaxed),
            FREE_MAX,
            "filled when enabled"
        );
        let mut a = pool.take(ModelId(1), 2).unwrap();
        assert!(a.is_allocated());
        assert_eq!(a.bytes().len(), 30);
        a.row_mut(2).fill(7);
        assert_eq!(a.row(2), &[7u8; 10][..]);
        let p = a.bytes().as_ptr();
        drop(a);
        let b = pool.take(ModelId(1), 3).unwrap();
        assert_eq!(b.bytes().as_ptr(), p, "kept and lent again");
        let mut held: Vec<Staged> = (1..FREE_MAX)
            .map(|_| pool.take(ModelId(1), 1).unwrap())
            .collect();
        assert_eq!(
            made.load(Ordering::Relaxed),
            FREE_MAX,
            "nothing allocated while idle buffers last"
        );
        held.push(pool.take(ModelId(1), 1).unwrap());
        assert_eq!(made.load(Ordering::Relaxed), 4, "one more batch in flight");
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
    #[test]
    fn buffers_reserved_while_loading_are_the_ones_enabled() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        let pool = StagePool::with_alloc(Box::new(move |bytes| {
            m.fetch_add(1, Ordering::Relaxed);
            Some(Box::new(Words(vec![0; bytes.div_ceil(8)], bytes)) as Box<dyn StageMem>)
        }));
        pool.reserve(ModelId(5), 8, 2);
        assert_eq!(made.load(Ordering::Relaxed), FREE_MAX);
        assert!(
            pool.take(ModelId(5), 1).is_none(),
            "reserved, not yet staged"
        );
        pool.enable(ModelId(5), 8, 2);
        assert_eq!(made.load(Ordering::Relaxed), FREE_MAX, "the reserved ones");
        let held: Vec<Staged> = (0..FREE_MAX)
            .map(|_| pool.take(ModelId(5), 2).unwrap())
            .collect();
        assert_eq!(made.load(Ordering::Relaxed), FREE_MAX);
        drop(held);
        // Reserved for one layout, enabled with another: filled anew.
        pool.reserve(ModelId(6), 8, 2);
        pool.enable(ModelId(6), 8, 4);
        assert_eq!(made.load(Ordering::Relaxed), 3 * FREE_MAX);
        assert_eq!(pool.take(ModelId(6), 4).unwrap().bytes().len(), 32);
        // Unloaded: its reservation goes too.
        pool.reserve(ModelId(7), 8, 2);
        pool.disable(ModelId(7));
        pool.enable(ModelId(7), 8, 2);
        assert_eq!(made.load(Ordering::Relaxed), 5 * FREE_MAX);
        // A heap pool reserves nothing: its buffers are made when needed.
        let heap = StagePool::new();
        heap.reserve(ModelId(1), 8, 2);
        assert!(heap.reserved.lock().unwrap().is_empty());
    }

    #[test]
    fn a_buffer_of_a_reloaded_models_old_layout_is_not_lent_again() {
        let pool = StagePool::new();
        pool.enable(ModelId(3), 8, 2);
        let old = pool.take(ModelId(3), 2).unwrap();
        pool.enable(ModelId(3), 8, 4);
        drop(old);
        let b = pool.take(ModelId(3), 4).unwrap();
        assert_eq!(
            b.bytes().len(),
            32,
            "a buffer long enough for the new layout"
        );
    }
}
