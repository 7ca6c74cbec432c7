//! Small data structures behind the O(log M + log G) rank state.
//!
//! * [`IndexedHeap`]: a binary min-heap over dense slot indices with a position table,
//!   so any slot's key can be changed or removed in O(log n). Used for model timers and
//!   for the ranking of schedulable candidates.
//! * [`MinTree`]: a segment tree of GPU free times by GPU id, answering "earliest-free
//!   GPU" and "lowest-id GPU free by time x" in O(log G).

use super::time::Time;

const NONE: u32 = u32::MAX;

/// Indexed binary min-heap. Ties are broken by slot index (lower first), so results are
/// deterministic.
#[derive(Debug, Clone, Default)]
pub struct IndexedHeap<K: Ord + Copy> {
    heap: Vec<(K, u32)>,
    pos: Vec<u32>,
}

impl<K: Ord + Copy> IndexedHeap<K> {
    pub fn new() -> Self {
        IndexedHeap {
            heap: Vec::new(),
            pos: Vec::new(),
        }
    }
    pub fn len(&self) -> usize {
        self.heap.len()
    }
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
    #[inline]
    pub fn peek(&self) -> Option<(usize, K)> {
        self.heap.first().map(|&(k, i)| (i as usize, k))
    }
    #[inline]
    pub fn contains(&self, slot: usize) -> bool {
        slot < self.pos.len() && self.pos[slot] != NONE
    }
    pub fn get(&self, slot: usize) -> Option<K> {
        if self.contains(slot) {
            Some(self.heap[self.pos[slot] as usize].0)
        } else {
            None
        }
    }
    /// Inserts `slot` with `key`, or changes its key.
    pub fn set(&mut self, slot: usize, key: K) {
        if slot >= self.pos.len() {
            self.pos.resize(slot + 1, NONE);
        }
        let p = self.pos[slot];
        if p == NONE {
            let i = self.heap.len();
            self.heap.push((key, slot as u32));
            self.pos[slot] = i as u32;
            self.sift_up(i);
        } else {
            let i = p as usize;
            let old = self.heap[i].0;
            self.heap[i].0 = key;
            if key < old {
                self.sift_up(i);
            } else {
                self.sift_down(i);
            }
        }
    }
    /// Removes `slot` if present; returns its key.
    pub fn remove(&mut self, slot: usize) -> Option<K> {
        if !self.contains(slot) {
            return None;
        }
        let i = self.pos[slot] as usize;
        let key = self.heap[i].0;
        let last = self.heap.len() - 1;
        self.swap(i, last);
        self.heap.pop();
        self.pos[slot] = NONE;
        if i < self.heap.len() {
            self.sift_down(i);
            self.sift_up(i);
        }
        Some(key)
    }
    pub fn pop(&mut self) -> Option<(usize, K)> {
        let (slot, k) = self.peek()?;
        self.remove(slot);
        Some((slot, k))
    }
    pub fn iter(&self) -> impl Iterator<Item = (usize, K)> + '_ {
        self.heap.iter().map(|&(k, i)| (i as usize, k))
    }

    #[inline]
    fn less(&self, a: usize, b: usize) -> bool {
        let (ka, ia) = self.heap[a];
        let (kb, ib) = self.heap[b];
        (ka, ia) < (kb, ib)
    }
    #[inline]
    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a].1 as usize] = a as u32;
        self.pos[self.heap[b].1 as usize] = b as u32;
    }
    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if self.less(i, p) {
                self.swap(i, p);
                i = p;
            } else {
                break;
            }
        }
    }
    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let c = if r < n && self.less(r, l) { r } else { l };
            if self.less(c, i) {
                self.swap(c, i);
                i = c;
            } else {
                break;
            }
        }
    }
}

/// Segment tree of GPU free times indexed by GPU id.
#[derive(Debug, Clone)]
pub struct MinTree {
    n: usize,
    size: usize,
    t: Vec<Time>,
}

impl MinTree {
    pub fn new(n: usize, init: Time) -> Self {
        let size = n.max(1).next_power_of_two();
        let mut t = vec![Time::NEVER; 2 * size];
        for i in 0..n {
            t[size + i] = init;
        }
        for i in (1..size).rev() {
            t[i] = t[2 * i].min(t[2 * i + 1]);
        }
        MinTree { n, size, t }
    }
    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    #[inline]
    pub fn get(&self, i: usize) -> Time {
        self.t[self.size + i]
    }
    /// Adds one slot at the end (grows the tree when needed).
    pub fn push(&mut self, v: Time) {
        if self.n == self.size {
            let vals: Vec<Time> = (0..self.n).map(|i| self.get(i)).collect();
            *self = MinTree::new(self.n + 1, Time::NEVER);
            for (i, x) in vals.into_iter().enumerate() {
                self.set(i, x);
            }
            self.set(self.n - 1, v);
        } else {
            self.n += 1;
            self.set(self.n - 1, v);
        }
    }
    #[inline]
    pub fn set(&mut self, i: usize, v: Time) {
        let mut p = self.size + i;
        self.t[p] = v;
        p /= 2;
        while p >= 1 {
            self.t[p] = self.t[2 * p].min(self.t[2 * p + 1]);
            p /= 2;
        }
    }
    /// (id, free_at) of the earliest-free slot; ties go to the lowest id.
    #[inline]
    pub fn argmin(&self) -> Option<(usize, Time)> {
        let m = self.t[1];
        if self.n == 0 || m == Time::NEVER {
            return None;
        }
        self.leftmost_le(m).map(|i| (i, m))
    }
    /// The lowest id whose free time is <= x.
    #[inline]
    pub fn leftmost_le(&self, x: Time) -> Option<usize> {
        if self.t[1] > x {
            return None;
        }
        let mut p = 1;
        while p < self.size {
            p = if self.t[2 * p] <= x { 2 * p } else { 2 * p + 1 };
        }
        let i = p - self.size;
        if i < self.n {
            Some(i)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_matches_sorted_model() {
        let mut h = IndexedHeap::new();
        let mut model: Vec<Option<i64>> = vec![None; 50];
        let mut x: u64 = 12345;
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let slot = (x >> 33) as usize % 50;
            let k = ((x >> 13) % 1000) as i64;
            if (x >> 7).is_multiple_of(3) {
                assert_eq!(h.remove(slot), model[slot]);
                model[slot] = None;
            } else {
                h.set(slot, k);
                model[slot] = Some(k);
            }
            let best = model
                .iter()
                .enumerate()
                .filter_map(|(i, k)| k.map(|k| (k, i)))
                .min()
                .map(|(k, i)| (i, k));
            assert_eq!(h.peek(), best);
        }
    }

    #[test]
    fn tree_queries() {
        let mut t = MinTree::new(5, Time(0));
        t.set(0, Time(10));
        t.set(1, Time(5));
        t.set(2, Time(5));
        t.set(3, Time(20));
        t.set(4, Time(1));
        assert_eq!(t.argmin(), Some((4, Time(1))));
        assert_eq!(t.leftmost_le(Time(5)), Some(1));
        assert_eq!(t.leftmost_le(Time(0)), None);
        assert_eq!(t.leftmost_le(Time(100)), Some(0));
        t.set(4, Time(30));
        assert_eq!(t.argmin(), Some((1, Time(5))));
        t.push(Time(2));
        t.push(Time(3));
        t.push(Time(4));
        t.push(Time(0));
        assert_eq!(t.len(), 9);
        assert_eq!(t.argmin(), Some((8, Time(0))));
        assert_eq!(t.leftmost_le(Time(3)), Some(5));
    }
}
