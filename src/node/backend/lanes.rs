//! Concurrent lanes: a GPU that runs up to `lanes` batches at once is
//! registered with the scheduler as `lanes` GPU slots, each a lane with its own
//! puller, worker and executor (for `cuda`: its own sessions, each computing on
//! a stream of its own, on the lane's device). The scheduler's core matches
//! each slot's free time like any GPU's and plans it with the models' profiles,
//! which are then d(b, e): the latency of a batch on one lane while the GPU's
//! `lanes` lanes are busy (`fermata profile --lanes E` measures them).
//!
//! Pure: [`LaneMap`] numbers the slots (slot `g * lanes + l` is lane `l` of GPU
//! `g`); [`LaneBook`] keeps which lanes run a batch, and counts, per GPU, the
//! most batches it ran at once and, for the whole backend, the times a lane was
//! asked to start a batch while it ran one (never, when each lane's worker runs
//! its batches one after another).

/// Most lanes one GPU may have (`--lanes`).
pub const MAX_LANES: u32 = 64;

/// The slots of `gpus` GPUs with `lanes` lanes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneMap {
    pub gpus: u32,
    pub lanes: u32,
}

impl LaneMap {
    /// `lanes` must be 1 to [`MAX_LANES`].
    pub fn new(gpus: u32, lanes: u32) -> Result<LaneMap, String> {
        if lanes == 0 || lanes > MAX_LANES {
            return Err(format!("--lanes must be 1 to {MAX_LANES}, got {lanes}"));
        }
        gpus.checked_mul(lanes)
            .ok_or_else(|| format!("{gpus} GPUs x {lanes} lanes is too many slots"))?;
        Ok(LaneMap { gpus, lanes })
    }
    /// Slots the scheduler sees.
    pub fn slots(&self) -> u32 {
        self.gpus * self.lanes
    }
    /// The GPU and lane of `slot`.
    pub fn of(&self, slot: u32) -> (u32, u32) {
        (slot / self.lanes, slot % self.lanes)
    }
}

/// A lane was asked to start a batch while it ran one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneBusy {
    pub gpu: u32,
    pub lane: u32,
}

/// Which lanes run a batch now, and what was seen.
#[derive(Debug, Clone)]
pub struct LaneBook {
    map: LaneMap,
    busy: Vec<bool>,
    running: Vec<u32>,
    peak: Vec<u32>,
    overlaps: u64,
}

impl LaneBook {
    pub fn new(map: LaneMap) -> LaneBook {
        LaneBook {
            map,
            busy: vec![false; map.slots() as usize],
            running: vec![0; map.gpus as usize],
            peak: vec![0; map.gpus as usize],
            overlaps: 0,
        }
    }
    /// `slot` starts a batch. A lane already running one is an error (counted;
    /// the lane stays busy until its first batch ends).
    pub fn begin(&mut self, slot: u32) -> Result<(), LaneBusy> {
        let (gpu, lane) = self.map.of(slot);
        if std::mem::replace(&mut self.busy[slot as usize], true) {
            self.overlaps += 1;
            return Err(LaneBusy { gpu, lane });
        }
        let g = gpu as usize;
        self.running[g] += 1;
        self.peak[g] = self.peak[g].max(self.running[g]);
        Ok(())
    }
    /// `slot`'s batch ended.
    pub fn end(&mut self, slot: u32) {
        let (gpu, _) = self.map.of(slot);
        if std::mem::replace(&mut self.busy[slot as usize], false) {
            self.running[gpu as usize] -= 1;
        }
    }
    pub fn map(&self) -> LaneMap {
        self.map
    }
    /// Batches running on each GPU now.
    pub fn running(&self) -> &[u32] {
        &self.running
    }
    /// The most batches each GPU ran at once.
    pub fn peak(&self) -> &[u32] {
        &self.peak
    }
    /// Times a busy lane was asked to start another batch.
    pub fn overlaps(&self) -> u64 {
        self.overlaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_number_lanes_within_their_gpu() {
        let m = LaneMap::new(2, 3).unwrap();
        assert_eq!(m.slots(), 6);
        let of: Vec<(u32, u32)> = (0..6).map(|s| m.of(s)).collect();
        assert_eq!(of, [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]);
        assert!(LaneMap::new(1, 0).is_err());
        assert!(LaneMap::new(1, MAX_LANES + 1).is_err());
        assert!(LaneMap::new(u32::MAX, 2).is_err());
    }

    #[test]
    fn a_lane_never_runs_two_batches_at_once_and_a_gpu_runs_one_per_lane() {
        let mut b = LaneBook::new(LaneMap::new(2, 2).unwrap());
        // Both lanes of GPU 0 busy: two batches at once on one GPU.
        b.begin(0).unwrap();
        b.begin(1).unwrap();
        assert_eq!(b.running(), [2, 0]);
        // A second batch on a busy lane is refused and counted; the GPU's
        // count does not grow past its lanes.
        assert_eq!(b.begin(1), Err(LaneBusy { gpu: 0, lane: 1 }));
        assert_eq!(b.overlaps(), 1);
        assert_eq!(b.running(), [2, 0]);
        b.end(1);
        b.begin(1).unwrap();
        b.end(0);
        b.end(1);
        // Ending an idle lane changes nothing.
        b.end(1);
        assert_eq!(b.running(), [0, 0]);
        b.begin(3).unwrap();
        b.end(3);
        assert_eq!(b.peak(), [2, 1]);
        assert_eq!(b.overlaps(), 1);
    }

    #[test]
    fn lanes_run_in_turn_never_overlap() {
        // Any interleaving of begin/end where each lane ends its batch before
        // starting the next (what each lane's worker does) counts no overlap
        // and never more batches on a GPU than it has lanes.
        use rand::{Rng, SeedableRng};
        let map = LaneMap::new(3, 4).unwrap();
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
        let mut b = LaneBook::new(map);
        let mut busy = vec![false; map.slots() as usize];
        for _ in 0..10_000 {
            let s = rng.gen_range(0..map.slots());
            if busy[s as usize] {
                b.end(s);
            } else {
                b.begin(s).unwrap();
            }
            busy[s as usize] ^= true;
            assert!(b.running().iter().all(|&r| r <= map.lanes));
        }
        assert_eq!(b.overlaps(), 0);
        assert_eq!(b.peak(), [4, 4, 4]);
    }
}
