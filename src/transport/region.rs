//! A frontend's input region: one block of memory holding the inputs of the tasks
//! it has in flight, read one-sided by backends.
//!
//! Each input lives in a slot: a [`SlotHeader`] (the task id, the payload length and
//! a magic number) followed by the bytes. A backend reads the whole slot and checks
//! the header, so a read of a slot that was freed and reused (a task that ended
//! meanwhile) is detected instead of running on someone else's input.
//!
//! Slots are placed first-fit in a free list with coalescing; alignment 64 bytes.

use super::ReadError;
use std::collections::BTreeMap;
use std::sync::{Mutex, RwLock};

/// Bytes of the slot header.
pub const SLOT_HEADER: usize = 16;
const MAGIC: u32 = 0x4654_4d41; // "FTMA"
const ALIGN: u64 = 64;
/// Largest slot (header included) an [`InputRef`] can describe: 16 MiB - 1.
pub const MAX_SLOT: usize = (1 << 24) - 1;
/// Largest region an [`InputRef`] can address: 1 TiB.
pub const MAX_REGION: u64 = 1 << 40;

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

/// The header at the start of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotHeader {
    pub task: u64,
    pub payload_len: u32,
}

impl SlotHeader {
    pub fn encode(&self) -> [u8; SLOT_HEADER] {
        let mut b = [0u8; SLOT_HEADER];
        b[0..8].copy_from_slice(&self.task.to_le_bytes());
        b[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
        b[12..16].copy_from_slice(&MAGIC.to_le_bytes());
        b
    }

    /// Checks a slot read back for task `task`; returns the payload.
    pub fn check(slot: &[u8], task: u64) -> Result<&[u8], String> {
        if slot.len() < SLOT_HEADER {
            return Err(format!(
                "slot of {} bytes is shorter than its header",
                slot.len()
            ));
        }
        let t = u64::from_le_bytes(slot[0..8].try_into().expect("8 bytes"));
        let n = u32::from_le_bytes(slot[8..12].try_into().expect("4 bytes")) as usize;
        let m = u32::from_le_bytes(slot[12..16].try_into().expect("4 bytes"));
        if m != MAGIC {
            return Err("slot header has a bad magic number (freed or never written)".into());
        }
        if t != task {
            return Err(format!(
                "slot holds task {t}, expected {task} (reused slot)"
            ));
        }
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
pub struct Region {
    id: u32,
    len: u64,
    mem: RwLock<Box<[u8]>>,
    free: Mutex<FreeList>,
}

struct FreeList {
    /// offset -> length of each free range; ranges never touch (they are merged).
    ranges: BTreeMap<u64, u64>,
    used: u64,
}

impl Region {
    /// A zeroed region of `len` bytes (rounded down to the alignment).
    pub fn new(id: u32, len: u64) -> anyhow::Result<Region> {
        let len = len / ALIGN * ALIGN;
        if len == 0 || len > MAX_REGION {
            anyhow::bail!("region length must be between {ALIGN} bytes and 1 TiB, got {len}");
        }
        let mem = vec![0u8; len as usize].into_boxed_slice();
        let mut ranges = BTreeMap::new();
        ranges.insert(0, len);
        Ok(Region {
            id,
            len,
            mem: RwLock::new(mem),
            free: Mutex::new(FreeList { ranges, used: 0 }),
        })
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

    /// Stores `input` of `task` in a new slot; None when the region is full or the
    /// input is larger than a slot can be.
    pub fn put(&self, task: u64, input: &[u8]) -> Option<InputRef> {
        let slot_len = SLOT_HEADER + input.len();
        if slot_len > MAX_SLOT {
            return None;
        }
        let offset = self.alloc(slot_len as u64)?;
        let hdr = SlotHeader {
            task,
            payload_len: input.len() as u32,
        }
        .encode();
        {
            let mut mem = self.mem.write().expect("region lock");
            let o = offset as usize;
            mem[o..o + SLOT_HEADER].copy_from_slice(&hdr);
            mem[o + SLOT_HEADER..o + slot_len].copy_from_slice(input);
        }
        Some(InputRef {
            offset,
            len: slot_len as u32,
        })
    }

    /// Frees a slot made by [`Region::put`]; its header is wiped so a late read of it
    /// is detected.
    pub fn release(&self, r: InputRef) {
        {
            let mut mem = self.mem.write().expect("region lock");
            let o = r.offset as usize;
            if o + SLOT_HEADER <= mem.len() {
                mem[o..o + SLOT_HEADER].fill(0);
            }
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

    /// Runs `f` on the bytes at `offset..offset+len` without copying them out
    /// (a region server writes them straight to its socket buffer).
    pub fn with_slice<R>(
        &self,
        offset: u64,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, ReadError> {
        let end = offset
            .checked_add(len as u64)
            .ok_or(ReadError::OutOfBounds)?;
        if end > self.len {
            return Err(ReadError::OutOfBounds);
        }
        let mem = self.mem.read().expect("region lock");
        Ok(f(&mem[offset as usize..end as usize]))
    }

    /// The region's memory, for transports that register it with hardware (RDMA).
    /// The pointer stays valid for the region's life; the memory never moves.
    pub fn raw(&self) -> (*mut u8, usize) {
        let mut mem = self.mem.write().expect("region lock");
        (mem.as_mut_ptr(), mem.len())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trip() {
        let r = InputRef {
            offset: (1 << 40) - 64,
            len: MAX_SLOT as u32,
        };
        assert_eq!(InputRef::unpack(r.pack()), r);
    }

    #[test]
    fn put_read_release() {
        let reg = Region::new(7, 4096).unwrap();
        let a = reg.put(1, &[1, 2, 3]).unwrap();
        let b = reg.put(2, &[9; 100]).unwrap();
        assert_ne!(a.offset, b.offset);
        let mut out = Vec::new();
        reg.read_into(a.offset, a.len, &mut out).unwrap();
        assert_eq!(SlotHeader::check(&out, 1).unwrap(), &[1, 2, 3]);
        assert!(SlotHeader::check(&out, 2).is_err());
        reg.release(a);
        reg.read_into(a.offset, a.len, &mut out).unwrap();
        assert!(
            SlotHeader::check(&out, 1).is_err(),
            "freed slot must not check"
        );
        reg.release(b);
        assert_eq!(reg.used(), 0);
        // Everything merged back: one slot of the whole region fits again.
        assert!(reg.put(3, &vec![0u8; 4096 - SLOT_HEADER]).is_some());
        assert!(reg.put(4, &[0]).is_none(), "full");
        assert_eq!(
            reg.read_into(4090, 10, &mut out),
            Err(ReadError::OutOfBounds)
        );
    }
}
