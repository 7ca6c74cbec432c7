//! A frontend's input region: one block of memory holding the inputs of the tasks
//! it has in flight, read one-sided by backends.
//!
//! Each input lives in a slot: a [`SlotHeader`] (the task id, the payload length,
//! a magic number and the task's read capability) followed by the bytes. A
//! backend reads the whole slot and checks the header, so a read of a slot that
//! was freed and reused (a task that ended meanwhile) is detected instead of
//! running on someone else's input. A region server hands out a slot only to a
//! reader that names its capability ([`Region::read_slot`]); when a request ends
//! its header, capability included, is wiped ([`Region::release`]), so its bytes
//! can no longer be read through a server.
//!
//! Slots are placed first-fit in a free list with coalescing; alignment 64 bytes.

use super::ReadError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Bytes of the slot header.
pub const SLOT_HEADER: usize = 32;
const MAGIC: u32 = 0x4654_4d41; // "FTMA"
const ALIGN: u64 = 64;
/// Largest slot (header included) an [`InputRef`] can describe: 16 MiB - 1.
pub const MAX_SLOT: usize = (1 << 24) - 1;
/// Largest region an [`InputRef`] can address: 1 TiB.
pub const MAX_REGION: u64 = 1 << 40;
/// The capability of a probe: a read that names it is answered with zeros of
/// the length asked, at most [`MAX_SLOT`] (a backend measuring its pull cost
/// reads no one's input). It opens no slot: a task's capability is never
/// this.
pub const PROBE_CAP: u64 = 0;

/// What probes read: zeros, never written (untouched pages of the program's
/// zeroed data, so they cost no memory of their own).
static ZEROS: [u8; MAX_SLOT] = [0u8; MAX_SLOT];

/// Makes tasks' capabilities: 64 unpredictable bits each (ChaCha seeded from
/// the OS), never [`PROBE_CAP`]. A reader that saw some capabilities (a
/// backend, its own tasks') cannot tell any other.
pub struct CapSource(rand::rngs::StdRng);

impl CapSource {
    /// Seeded from the OS's randomness.
    pub fn new() -> CapSource {
        use rand::SeedableRng;
        CapSource(rand::rngs::StdRng::from_entropy())
    }

    /// Seeded from `seed`: reproducible (the cluster simulator).
    pub fn seeded(seed: u64) -> CapSource {
        use rand::SeedableRng;
        CapSource(rand::rngs::StdRng::seed_from_u64(seed))
    }

    /// The next capability.
    pub fn next_cap(&mut self) -> u64 {
        use rand::RngCore;
        loop {
            let c = self.0.next_u64();
            if c != PROBE_CAP {
                return c;
            }
        }
    }
}

impl Default for CapSource {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a task's input is in its frontend's region; packs into a u64 (40 bits of
/// offset, 24 of length) that rides through the scheduler as the task's tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputRef {
    pub offset: u64,
    /// Slot length, header included.
    pub len: u32,
}

impl InputRef {
    pub fn pack(self) -> u64 {
        debug_assert!(self.offset < MAX_REGION && (self.len as usize) <= MAX_SLOT);
        (self.offset << 24) | self.len as u64
    }
    pub fn unpack(v: u64) -> InputRef {
        InputRef {
            offset: v >> 24,
            len: (v & 0xff_ffff) as u32,
        }
    }
}

/// The header at the start of a slot: u64 task, u32 payload length, u32 magic,
/// u64 capability, 8 bytes reserved (zero; the payload starts 32-byte aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotHeader {
    pub task: u64,
    pub payload_len: u32,
    pub cap: u64,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl SlotHeader {
    pub fn encode(&self) -> [u8; SLOT_HEADER] {
        let mut b = [0u8; SLOT_HEADER];
        b[0..8].copy_from_slice(&self.task.to_le_bytes());
        b[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
        b[12..16].copy_from_slice(&MAGIC.to_le_bytes());
        b[16..24].copy_from_slice(&self.cap.to_le_bytes());
        b
    }

    /// The header at the start of `slot`, when it has a whole one with the magic.
    fn decode(slot: &[u8]) -> Option<SlotHeader> {
        if slot.len() < SLOT_HEADER || u32_at(slot, 12) != MAGIC {
            return None;
        }
        Some(SlotHeader {
            task: u64_at(slot, 0),
            payload_len: u32_at(slot, 8),
            cap: u64_at(slot, 16),
        })
    }

    /// Checks the header of a slot read back (its first bytes) for task
    /// `task` with capability `cap`; returns the payload's length it says.
    /// Alone for a slot whose payload was read apart (into the row of a
    /// batch's buffer).
    pub fn check_head(head: &[u8], task: u64, cap: u64) -> Result<usize, String> {
        let Some(h) = SlotHeader::decode(head) else {
            return Err("slot header has a bad magic number (freed or never written)".into());
        };
        if h.task != task {
            return Err(format!(
                "slot holds task {}, expected {task} (reused slot)",
                h.task
            ));
        }
        if h.cap != cap {
            return Err(format!("slot of task {task} has another capability"));
        }
        Ok(h.payload_len as usize)
    }

    /// Checks a slot read back for task `task` with capability `cap`; returns
    /// the payload.
    pub fn check(slot: &[u8], task: u64, cap: u64) -> Result<&[u8], String> {
        if slot.len() < SLOT_HEADER {
            return Err(format!(
                "slot of {} bytes is shorter than its header",
                slot.len()
            ));
        }
        let n = SlotHeader::check_head(slot, task, cap)?;
        if SLOT_HEADER + n > slot.len() {
            return Err(format!(
                "slot says {n} payload bytes but only {} were read",
                slot.len() - SLOT_HEADER
            ));
        }
        Ok(&slot[SLOT_HEADER..SLOT_HEADER + n])
    }
}

/// A region of input memory.
///
/// Slots are disjoint, so a frontend storing one input and a backend reading
/// another need not wait for each other; with one lock over the whole region
/// they did (a 588 KiB image held it for tens of microseconds, and a batch pull
/// of 40 waited behind every store in between). The memory is therefore guarded
/// by stripes of [`STRIPE`] bytes: an access locks the stripes its byte range
/// overlaps, in ascending order (so two accesses never deadlock), shared for a
/// read and exclusive for a write. Every byte is only touched under its stripe's
/// lock, which is what makes the `UnsafeCell` sound.
pub struct Region {
    id: u32,
    len: u64,
    /// The memory's first byte: every access goes through this pointer (taken
    /// once, when `mem` was made; the allocation never moves).
    base: *mut u8,
    mem: Box<[std::cell::UnsafeCell<u8>]>,
    /// Whether `mem` is the memory of a dropped region ([`SPARES`]).
    reused: bool,
    stripes: Box<[RwLock<()>]>,
    free: Mutex<FreeList>,
    /// The end of the highest slot ever placed, and the thread that maps the
    /// pages ahead of it ([`Warm`]).
    high: Arc<AtomicU64>,
    warm: Option<Warm>,
    /// Input bytes copied into slots by [`Region::put`] (payloads only).
    stored: AtomicU64,
}

// SAFETY: the memory behind `base` is only read or written under the stripe
// locks that cover the bytes touched (see `Region`), and `raw` hands out the
// pointer for a transport's hardware to use, as before.
unsafe impl Sync for Region {}
unsafe impl Send for Region {}

/// Bytes of region memory one lock stripe covers.
pub const STRIPE: u64 = 1 << 20;

struct FreeList {
    /// offset -> length of each free range; ranges never touch (they are merged).
    ranges: BTreeMap<u64, u64>,
    used: u64,
}

impl Region {
    /// A zeroed region of `len` bytes (rounded down to the alignment): the
    /// memory of a dropped region of that length when this process kept one
    /// ([`SPARES`], its pages still mapped), else a fresh allocation.
    pub fn new(id: u32, len: u64) -> anyhow::Result<Region> {
        let len = len / ALIGN * ALIGN;
        if len == 0 || len > MAX_REGION {
            anyhow::bail!("region length must be between {ALIGN} bytes and 1 TiB, got {len}");
        }
        let (mem, mapped, reused) = match take_spare(&SPARES, len) {
            Some(s) => (s.mem, s.mapped, true),
            None => {
                // Zeroed by the allocator (pages are mapped lazily), then viewed
                // as cells: UnsafeCell<u8> has u8's layout.
                let zeroed = Box::into_raw(vec![0u8; len as usize].into_boxed_slice());
                // SAFETY: same layout, same allocation, ownership moves to the new box.
                let mem: Box<[std::cell::UnsafeCell<u8>]> =
                    unsafe { Box::from_raw(zeroed as *mut [std::cell::UnsafeCell<u8>]) };
                (mem, 0, false)
            }
        };
        let base = std::cell::UnsafeCell::raw_get(mem.as_ptr());
        let mut ranges = BTreeMap::new();
        ranges.insert(0, len);
        let high = Arc::new(AtomicU64::new(0));
        let warm = Warm::spawn(base, len, high.clone(), mapped);
        Ok(Region {
            id,
            len,
            base,
            mem,
            reused,
            stripes: (0..len.div_ceil(STRIPE)).map(|_| RwLock::new(())).collect(),
            free: Mutex::new(FreeList { ranges, used: 0 }),
            high,
            warm,
            stored: AtomicU64::new(0),
        })
    }

    /// Input bytes copied into the region's slots so far (payloads, not
    /// headers): the frontend's copy of each request's input.
    pub fn bytes_stored(&self) -> u64 {
        self.stored.load(Ordering::Relaxed)
    }

    /// Whether this region's memory is that of a dropped region (zeroed, its
    /// pages mapped), not a fresh allocation.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Bytes of the region whose pages are mapped ahead of use so far (0
    /// where the kernel cannot, see [`Warm`]).
    pub fn mapped(&self) -> u64 {
        self.warm
            .as_ref()
            .map_or(0, |w| w.mapped.load(Ordering::Acquire))
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes in slots now.
    pub fn used(&self) -> u64 {
        self.free.lock().expect("region lock").used
    }

    /// Stores `input` of `task`, readable with capability `cap`, in a new slot;
    /// None when the region is full or the input is larger than a slot can be.
    pub fn put(&self, task: u64, cap: u64, input: &[u8]) -> Option<InputRef> {
        let slot_len = SLOT_HEADER + input.len();
        if slot_len > MAX_SLOT {
            return None;
        }
        let offset = self.alloc(slot_len as u64)?;
        let hdr = SlotHeader {
            task,
            payload_len: input.len() as u32,
            cap,
        }
        .encode();
        self.write_at(offset, slot_len, |mem| {
            mem[..SLOT_HEADER].copy_from_slice(&hdr);
            mem[SLOT_HEADER..].copy_from_slice(input);
        });
        self.stored.fetch_add(input.len() as u64, Ordering::Relaxed);
        Some(InputRef {
            offset,
            len: slot_len as u32,
        })
    }

    /// Gives the slot at `r` to task `task` (its capability and bytes stay):
    /// a request handed to a new scheduler under a new task id. A read for
    /// the old id then finds the slot taken (a stale slot).
    pub fn retag(&self, r: InputRef, task: u64) {
        if r.offset + SLOT_HEADER as u64 <= self.len {
            self.write_at(r.offset, 8, |mem| mem.copy_from_slice(&task.to_le_bytes()));
        }
    }

    /// Frees a slot made by [`Region::put`]; its header is wiped, capability
    /// included, so a late read of it is detected and no server hands its bytes
    /// out again.
    pub fn release(&self, r: InputRef) {
        if r.offset + SLOT_HEADER as u64 <= self.len {
            self.write_at(r.offset, SLOT_HEADER, |mem| mem.fill(0));
        }
        self.dealloc(r.offset, r.len as u64);
    }

    /// Copies `len` bytes at `offset` into `out` (cleared first).
    pub fn read_into(&self, offset: u64, len: u32, out: &mut Vec<u8>) -> Result<(), ReadError> {
        self.with_slice(offset, len, |b| {
            out.clear();
            out.extend_from_slice(b);
        })
    }

    /// A reader's read of a slot: runs `f` on the `len` bytes at `offset` when
    /// they lie within one live slot that starts there and whose capability is
    /// `cap`, its header included; else [`ReadError::Denied`] (a freed slot,
    /// another capability, a read shorter than the header or past the slot's
    /// end, or not a slot's start). A read with
    /// [`PROBE_CAP`] sees `len` zero bytes instead (the region is not touched).
    /// What region servers and in-process readers serve: the check and the read
    /// are under the same stripe locks, so a slot cannot be freed in between.
    /// Nothing is allocated, nor `f` called, before the read is found good: a
    /// read longer than the largest slot ([`MAX_SLOT`]), a probe's included, is
    /// denied at once.
    pub fn read_slot<R>(
        &self,
        offset: u64,
        len: u32,
        cap: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, ReadError> {
        self.in_bounds(offset, len)?;
        if len as usize > MAX_SLOT {
            return Err(ReadError::Denied);
        }
        if cap == PROBE_CAP {
            return Ok(f(&ZEROS[..len as usize]));
        }
        self.with_slice(offset, len, |b| match SlotHeader::decode(b) {
            Some(h) if h.cap == cap && len as usize <= SLOT_HEADER + h.payload_len as usize => {
                Ok(f(b))
            }
            _ => Err(ReadError::Denied),
        })?
    }

    /// Runs `f` on the bytes at `offset..offset+len` without copying them out,
    /// unchecked: the frontend's own view (tests, fuzzers); readers go through
    /// [`Region::read_slot`].
    pub fn with_slice<R>(
        &self,
        offset: u64,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, ReadError> {
        self.in_bounds(offset, len)?;
        let _guards: Vec<_> = self
            .stripe_range(offset, len as u64)
            .map(|i| self.stripes[i].read().expect("region lock"))
            .collect();
        // SAFETY: in bounds (checked above); the bytes are covered by the stripes
        // read-locked above, so no writer touches them meanwhile.
        let b = unsafe { std::slice::from_raw_parts(self.base.add(offset as usize), len as usize) };
        Ok(f(b))
    }

    /// Whether bytes `offset..offset+len` lie in the region.
    fn in_bounds(&self, offset: u64, len: u32) -> Result<(), ReadError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(ReadError::OutOfBounds),
        }
    }

    /// The stripes that bytes `offset..offset+len` overlap.
    fn stripe_range(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        let first = (offset / STRIPE) as usize;
        let last = ((offset + len.max(1) - 1) / STRIPE) as usize;
        first..(last + 1).min(self.stripes.len())
    }

    /// Runs `f` on the `len` bytes at `offset` (in bounds), exclusively.
    fn write_at<R>(&self, offset: u64, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        assert!(offset + len as u64 <= self.len, "slot out of the region");
        let _guards: Vec<_> = self
            .stripe_range(offset, len as u64)
            .map(|i| self.stripes[i].write().expect("region lock"))
            .collect();
        // SAFETY: in bounds (asserted); the bytes are covered by the stripes
        // write-locked above, so nobody else reads or writes them meanwhile.
        let b = unsafe { std::slice::from_raw_parts_mut(self.base.add(offset as usize), len) };
        f(b)
    }

    /// The region's memory, for transports that register it with hardware (RDMA).
    /// The pointer stays valid for the region's life; the memory never moves.
    pub fn raw(&self) -> (*mut u8, usize) {
        (self.base, self.len as usize)
    }

    fn alloc(&self, n: u64) -> Option<u64> {
        let n = n.div_ceil(ALIGN) * ALIGN;
        let mut fl = self.free.lock().expect("region lock");
        let (&off, &len) = fl.ranges.iter().find(|(_, &l)| l >= n)?;
        fl.ranges.remove(&off);
        if len > n {
            fl.ranges.insert(off + n, len - n);
        }
        fl.used += n;
        drop(fl);
        let end = off + n;
        if end > self.high.fetch_max(end, Ordering::AcqRel) {
            if let Some(w) = &self.warm {
                w.wake(end);
            }
        }
        Some(off)
    }

    fn dealloc(&self, off: u64, n: u64) {
        let n = n.div_ceil(ALIGN) * ALIGN;
        let mut fl = self.free.lock().expect("region lock");
        fl.used = fl.used.saturating_sub(n);
        let mut start = off;
        let mut len = n;
        // Merge with the range just before and the one just after.
        if let Some((&po, &pl)) = fl.ranges.range(..off).next_back() {
            if po + pl == off {
                fl.ranges.remove(&po);
                start = po;
                len += pl;
            }
        }
        if let Some(&nl) = fl.ranges.get(&(off + n)) {
            fl.ranges.remove(&(off + n));
            len += nl;
        }
        fl.ranges.insert(start, len);
    }
}

impl Drop for Region {
    /// Stops the warm thread, zeroes every byte a slot ever held and keeps
    /// the memory for the next region of this length ([`SPARES`]).
    fn drop(&mut self) {
        let mapped = self.mapped();
        if let Some(w) = self.warm.take() {
            w.stop();
        }
        let high = self.high.load(Ordering::Acquire).min(self.len);
        // SAFETY: `&mut self`: no reader, writer or warm thread (joined above)
        // touches the memory now; `base..base + high` lies within it.
        unsafe { std::ptr::write_bytes(self.base, 0, high as usize) };
        let mem = std::mem::replace(&mut self.mem, Box::new([]));
        keep_spare(
            &SPARES,
            Spare {
                mem,
                mapped: mapped.max(high),
            },
        );
    }
}

/// The memories of dropped regions, zeroed, kept for the next region of the
/// same length in this process: at most [`SPARES_MAX`] of them and
/// [`SPARES_MAX_MAPPED`] mapped bytes in all (the oldest go first).
///
/// A region's pages cost their first touch once (the warm thread's or a
/// store's): a fault and the zeroing of the page, and on a virtual machine the
/// host's own fault, about 150 MB/s measured on the 2-core development VM
/// against 9 GB/s for writing mapped pages. A frontend that lives long pays it
/// once; one that stops and is made again in the same process (every probe of
/// `bench serve`, tests) paid it again for every new region, and with
/// 588 KiB inputs a store into fresh pages took milliseconds.
static SPARES: Mutex<Vec<Spare>> = Mutex::new(Vec::new());
const SPARES_MAX: usize = 4;
const SPARES_MAX_MAPPED: u64 = 1 << 30;

/// A dropped region's memory: zeroed, mapped up to `mapped`.
struct Spare {
    mem: Box<[std::cell::UnsafeCell<u8>]>,
    mapped: u64,
}

/// The spare of length `len` with the most mapped bytes, taken out of `spares`.
fn take_spare(spares: &Mutex<Vec<Spare>>, len: u64) -> Option<Spare> {
    let mut v = spares.lock().expect("spares lock");
    let i = (0..v.len())
        .filter(|&i| v[i].mem.len() as u64 == len)
        .max_by_key(|&i| v[i].mapped)?;
    Some(v.remove(i))
}

/// Keeps `s` in `spares` (newest last), then drops the oldest past the bounds;
/// a spare mapped past them alone is not kept. The memory is freed outside
/// the lock.
fn keep_spare(spares: &Mutex<Vec<Spare>>, s: Spare) {
    if s.mem.is_empty() || s.mapped > SPARES_MAX_MAPPED {
        return;
    }
    let freed: Vec<Spare> = {
        let mut v = spares.lock().expect("spares lock");
        v.push(s);
        let mut n = 0;
        while v.len() - n > SPARES_MAX
            || v[n..].iter().map(|s| s.mapped).sum::<u64>() > SPARES_MAX_MAPPED
        {
            n += 1;
        }
        v.drain(..n).collect()
    };
    drop(freed);
}

/// Bytes mapped ahead of the highest slot, and the step of one mapping.
const WARM_AHEAD: u64 = 64 << 20;
const WARM_STEP: u64 = 8 << 20;

/// Maps a region's pages ahead of use, on a thread of its own
/// (`MADV_POPULATE_WRITE`, Linux 5.14+; elsewhere nothing is mapped ahead).
///
/// A region is allocated zeroed and its pages are mapped on first touch. A
/// first touch costs a page fault and the zeroing of the page (in a virtual
/// machine also the host's own fault): with 588 KiB images at thousands a
/// second, a frontend storing inputs into fresh pages spent most of its time
/// in the kernel, fell behind, and its backlog reached fresher pages still.
/// The thread keeps the pages up to [`WARM_AHEAD`] past the highest slot
/// placed so far mapped, so stores land on mapped pages; a region used only
/// for small inputs maps no more than that.
struct Warm {
    mapped: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Warm {
    /// `mapped`: bytes from the region's start already mapped (a reused
    /// memory's).
    fn spawn(base: *mut u8, len: u64, high: Arc<AtomicU64>, mapped: u64) -> Option<Warm> {
        let mapped = Arc::new(AtomicU64::new(mapped.min(len)));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s, b) = (mapped.clone(), stop.clone(), base as usize);
        let thread = std::thread::Builder::new()
            .name("region-warm".into())
            .spawn(move || warm_loop(b, len, &high, &m, &s))
            .ok()?;
        Some(Warm {
            mapped,
            stop,
            thread,
        })
    }

    /// A slot now ends at `end`: maps further when that nears the mapped end.
    fn wake(&self, end: u64) {
        if end + WARM_AHEAD / 2 > self.mapped.load(Ordering::Acquire) {
            self.thread.thread().unpark();
        }
    }

    /// Stops the thread and waits for it (the memory must outlive its last
    /// mapping).
    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

/// The warm thread: maps [`WARM_STEP`] at a time up to [`WARM_AHEAD`] past
/// `high`, parks in between.
fn warm_loop(base: usize, len: u64, high: &AtomicU64, mapped: &AtomicU64, stop: &AtomicBool) {
    // The lowest priority (nice 19, this thread only): a first touch costs
    // CPU, and mapping ahead must never take the cores from the threads that
    // serve (at start-up it maps a whole WARM_AHEAD at once). Raising one's
    // own nice value is always allowed; a failure leaves the default.
    // SAFETY: gettid and setpriority take no pointers.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
    let page = 4096u64;
    // Whole pages inside the allocation only, from where a reused memory's
    // mapping ends.
    let first = (base as u64).div_ceil(page) * page - base as u64;
    let ahead = mapped.load(Ordering::Acquire);
    let mut done = if ahead > first {
        first + (ahead - first) / page * page
    } else {
        first
    }
    .min(len);
    while !stop.load(Ordering::Acquire) {
        let target = (high.load(Ordering::Acquire) + WARM_AHEAD).min(len);
        if done + page > target {
            std::thread::park_timeout(std::time::Duration::from_millis(50));
            continue;
        }
        // `base + done` stays page-aligned: whole pages from there.
        let end = done + ((done + WARM_STEP).min(target) - done) / page * page;
        if end == done {
            std::thread::park_timeout(std::time::Duration::from_millis(50));
            continue;
        }
        // SAFETY: `base + done .. base + end` lies within the region's
        // allocation, which outlives this thread (`Region`'s drop joins it);
        // populating writes no byte (pages are mapped with the zeros the
        // allocation already reads as), so it races with no access.
        let r = unsafe {
            libc::madvise(
                (base as u64 + done) as *mut libc::c_void,
                (end - done) as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            // An older kernel: pages are mapped on first touch.
            return;
        }
        done = end;
        mapped.store(done, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    /// A read must name a live slot it holds the capability for and fit in
    /// it; a probe (capability 0) opens no slot and reads at most the largest
    /// slot's length of zeros; neither allocates before the check. Three
    /// readers' worth of whole-region reads answer headers only.
    #[test]
    fn reads_are_checked_before_anything_is_allocated() {
        let reg = Region::new(1, 64 << 20).unwrap();
        let cap = 0x1234;
        let s = reg.put(1, cap, b"input").unwrap();
        let whole = (64 << 20) as u32;
        let called = std::cell::Cell::new(0);
        let read = |off, len, c| {
            reg.read_slot(off, len, c, |b| {
                called.set(called.get() + 1);
                b.len()
            })
        };
        assert_eq!(read(0, whole, PROBE_CAP), Err(ReadError::Denied));
        assert_eq!(read(0, whole, cap), Err(ReadError::Denied));
        assert_eq!(read(s.offset, s.len + 1, cap), Err(ReadError::Denied));
        assert_eq!(read(s.offset, s.len, PROBE_CAP + 1), Err(ReadError::Denied));
        assert_eq!(read(s.offset + 64, 8, cap), Err(ReadError::Denied));
        assert_eq!(called.get(), 0, "nothing was read for a refused read");
        assert_eq!(read(s.offset, s.len, cap), Ok(s.len as usize));
        assert_eq!(read(0, MAX_SLOT as u32, PROBE_CAP), Ok(MAX_SLOT));
        // Over the TCP region protocol: 3 x 4 whole-region probes and reads
        // are answered with their 16-byte headers, nothing else.
        let mut inb = Vec::new();
        for i in 0..12u64 {
            let r = super::super::region_wire::Request {
                id: i,
                offset: 0,
                len: whole,
                cap: if i % 2 == 0 { PROBE_CAP } else { cap },
            };
            inb.extend_from_slice(&r.encode());
        }
        let mut out = Vec::new();
        super::super::region_wire::serve_requests(&inb, &reg, &mut out, 1 << 30);
        assert_eq!(out.len(), 12 * super::super::region_wire::ANS_LEN);
    }

    use super::*;

    #[test]
    fn pack_round_trip() {
        let r = InputRef {
            offset: (1 << 40) - 64,
            len: MAX_SLOT as u32,
        };
        assert_eq!(InputRef::unpack(r.pack()), r);
    }

    /// The pages past the highest slot are mapped ahead of use, as far as
    /// [`WARM_AHEAD`] past it, no further; a dropped region stops its thread.
    #[test]
    fn pages_are_mapped_ahead_of_the_highest_slot() {
        let reg = Region::new(1, 256 << 20).unwrap();
        let wait_for = |want: u64| {
            let t0 = std::time::Instant::now();
            while reg.mapped() < want && t0.elapsed() < std::time::Duration::from_secs(20) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            reg.mapped()
        };
        // Nothing placed yet: the first WARM_AHEAD bytes (whole pages).
        let m = wait_for(WARM_AHEAD - 4096);
        assert!((WARM_AHEAD - 4096..=WARM_AHEAD).contains(&m), "mapped {m}");
        // Slots up to 100 MiB: mapped to WARM_AHEAD past them.
        let big = vec![7u8; 10 << 20];
        let mut refs = Vec::new();
        for _ in 0..10 {
            refs.push(reg.put(1, 2, &big).unwrap());
        }
        let high = refs.iter().map(|r| r.offset + r.len as u64).max().unwrap();
        let m = wait_for(high + WARM_AHEAD - 4096);
        assert!(
            m >= high + WARM_AHEAD - 4096,
            "mapped {m}, highest slot ends at {high}"
        );
        assert!(m <= high + WARM_AHEAD, "mapped {m}");
        // Mapping ahead changed no byte.
        let r = refs[9];
        let payload = reg
            .with_slice(r.offset + SLOT_HEADER as u64, big.len() as u32, |b| {
                b.to_vec()
            })
            .unwrap();
        assert_eq!(payload, big);
        drop(reg);
        // A small region is mapped whole.
        let small = Region::new(2, 1 << 20).unwrap();
        let t0 = std::time::Instant::now();
        while small.mapped() < (1 << 20) - 4096 && t0.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(small.mapped() >= (1 << 20) - 4096, "{}", small.mapped());
    }

    /// A dropped region's memory goes to the next region of its length,
    /// zeroed (every byte, slots live at the drop included) and with its pages
    /// still mapped; a region of another length gets fresh memory.
    #[test]
    fn a_dropped_regions_memory_is_reused_zeroed() {
        // A length no other test uses (tests run in parallel in one process
        // and share the spares).
        let len = (3 << 20) + 4 * ALIGN;
        let mut tries = 0;
        loop {
            tries += 1;
            let a = Region::new(1, len).unwrap();
            let live = a.put(1, 11, &[0xAB; 100_000]).unwrap();
            let freed = a.put(2, 22, &[0xCD; 200_000]).unwrap();
            a.release(freed);
            let top = live.offset.max(freed.offset) + 200_000;
            drop(a);
            let b = Region::new(2, len).unwrap();
            let zeros = b.with_slice(0, len as u32, |m| m.iter().all(|&x| x == 0));
            assert_eq!(zeros, Ok(true), "a reused region reads as zeros");
            if b.reused() {
                assert!(b.mapped() >= top, "mapped {} < {top}", b.mapped());
                break;
            }
            // Another test's regions pushed it out meanwhile: again.
            assert!(tries < 20, "never reused");
        }
        // No region of this length was dropped before: fresh memory.
        assert!(!Region::new(3, len + ALIGN).unwrap().reused());
    }

    /// The spares are bounded in number and mapped bytes (the oldest go
    /// first), and a spare is taken only by a region of its length.
    #[test]
    fn spares_are_bounded() {
        let spares = Mutex::new(Vec::new());
        let spare = |len: usize, mapped: u64| Spare {
            mem: (0..len).map(|_| std::cell::UnsafeCell::new(0u8)).collect(),
            mapped,
        };
        for i in 0..SPARES_MAX + 2 {
            keep_spare(&spares, spare(64 * (i + 1), 4096));
        }
        assert_eq!(spares.lock().unwrap().len(), SPARES_MAX);
        // The two oldest (64 and 128 bytes) went.
        assert!(take_spare(&spares, 64).is_none());
        assert!(take_spare(&spares, 128).is_none());
        let s = take_spare(&spares, 192).expect("the third is kept");
        assert_eq!(s.mem.len(), 192);
        assert!(take_spare(&spares, 192).is_none(), "taken once");
        // Mapped bytes: the newest that fit stay.
        keep_spare(&spares, spare(64, SPARES_MAX_MAPPED / 2));
        keep_spare(&spares, spare(64, SPARES_MAX_MAPPED / 2 + 1));
        let left: u64 = spares.lock().unwrap().iter().map(|s| s.mapped).sum();
        assert!(left <= SPARES_MAX_MAPPED, "{left}");
        assert_eq!(
            take_spare(&spares, 64).map(|s| s.mapped),
            Some(SPARES_MAX_MAPPED / 2 + 1)
        );
        // Past the bound alone: not kept.
        keep_spare(&spares, spare(64, SPARES_MAX_MAPPED + 1));
        assert!(take_spare(&spares, 64).is_none());
    }

    #[test]
    fn put_read_release() {
        let reg = Region::new(7, 4096).unwrap();
        let a = reg.put(1, 11, &[1, 2, 3]).unwrap();
        let b = reg.put(2, 22, &[9; 100]).unwrap();
        assert_ne!(a.offset, b.offset);
        let mut out = Vec::new();
        reg.read_into(a.offset, a.len, &mut out).unwrap();
        assert_eq!(SlotHeader::check(&out, 1, 11).unwrap(), &[1, 2, 3]);
        assert!(SlotHeader::check(&out, 2, 11).is_err());
        assert!(
            SlotHeader::check(&out, 1, 12).is_err(),
            "another capability"
        );
        reg.release(a);
        reg.read_into(a.offset, a.len, &mut out).unwrap();
        assert!(
            SlotHeader::check(&out, 1, 11).is_err(),
            "freed slot must not check"
        );
        reg.release(b);
        assert_eq!(reg.used(), 0);
        // Everything merged back: one slot of the whole region fits again.
        assert!(reg.put(3, 33, &vec![0u8; 4096 - SLOT_HEADER]).is_some());
        assert!(reg.put(4, 44, &[0]).is_none(), "full");
        assert_eq!(
            reg.read_into(4090, 10, &mut out),
            Err(ReadError::OutOfBounds)
        );
    }

    /// A reader gets a slot's bytes only with its capability, from its start
    /// and within it, and only while its request lives; a probe gets zeros.
    #[test]
    fn reads_need_the_slots_capability() {
        let reg = Region::new(7, 4096).unwrap();
        let a = reg.put(1, 11, b"secret input").unwrap();
        let b = reg.put(2, 22, b"another").unwrap();
        let read = |off, len, cap| reg.read_slot(off, len, cap, |x| x.to_vec());
        let got = read(a.offset, a.len, 11).unwrap();
        assert_eq!(SlotHeader::check(&got, 1, 11).unwrap(), b"secret input");
        // Shorter reads from the start are fine down to the header, longer
        // ones are not.
        assert!(read(a.offset, SLOT_HEADER as u32, 11).is_ok());
        assert_eq!(read(a.offset, 8, 11), Err(ReadError::Denied));
        assert_eq!(read(a.offset, a.len + 1, 11), Err(ReadError::Denied));
        // b's capability does not open a, nor a read from inside a slot.
        assert_eq!(read(a.offset, a.len, 22), Err(ReadError::Denied));
        assert_eq!(read(a.offset + 16, 8, 11), Err(ReadError::Denied));
        assert!(read(b.offset, b.len, 22).is_ok());
        // Free space is no slot.
        assert_eq!(read(1024, 64, 0x1234), Err(ReadError::Denied));
        assert_eq!(read(4090, 10, 11), Err(ReadError::OutOfBounds));
        // A probe sees zeros, not the bytes.
        assert_eq!(
            read(a.offset, a.len, PROBE_CAP).unwrap(),
            vec![0; a.len as usize]
        );
        // A slot given to a new task id: the old id's read sees it taken.
        reg.retag(b, 9);
        let got = read(b.offset, b.len, 22).unwrap();
        assert_eq!(SlotHeader::check(&got, 9, 22).unwrap(), b"another");
        assert!(SlotHeader::check(&got, 2, 22).is_err());
        // Once the request ended, its capability opens nothing.
        reg.release(a);
        assert_eq!(read(a.offset, a.len, 11), Err(ReadError::Denied));
    }

    #[test]
    fn capabilities_are_never_the_probes_and_do_not_repeat() {
        let mut c = CapSource::new();
        let caps: std::collections::HashSet<u64> = (0..10_000).map(|_| c.next_cap()).collect();
        assert_eq!(caps.len(), 10_000);
        assert!(!caps.contains(&PROBE_CAP));
        let (mut x, mut y) = (CapSource::seeded(5), CapSource::seeded(5));
        assert_eq!(x.next_cap(), y.next_cap());
    }
}
