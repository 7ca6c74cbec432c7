//! A timer table: timers are data, not sleeping threads.
//!
//! In the style of quinn-proto's per-connection timers and tokio's timer wheel, a
//! thread keeps all of its timers in one [`TimerTable`], asks it for the
//! [`next_deadline`](TimerTable::next_deadline) to bound its wait (see
//! [`super::wait::Waiter`]), and after waking [`poll`](TimerTable::poll)s the expired
//! timers one at a time, earliest first. No thread sleeps per timer and nothing fires
//! asynchronously, so the owner decides exactly when timer work runs.
//!
//! Each key has at most one timer: setting a key's timer again moves it. The table is a
//! binary heap over dense slots ([`IndexedHeap`]) plus a key-to-slot map, so `set`,
//! `cancel` and `poll` cost O(log n) and `next_deadline` O(1). Slots are recycled, so
//! memory stays proportional to the most timers ever pending at once.

use crate::core::structs::IndexedHeap;
use crate::core::Time;
use std::collections::HashMap;
use std::hash::Hash;

/// One timer per key, ordered by deadline; equal deadlines fire in the order they were
/// set.
#[derive(Debug, Clone)]
pub struct TimerTable<K: Copy + Eq + Hash> {
    /// Slot of every pending key's timer.
    slots: HashMap<K, usize>,
    /// Key of every slot (`None`: free).
    keys: Vec<Option<K>>,
    /// Free slots, reused before new ones.
    free: Vec<usize>,
    /// Pending timers by slot, keyed by (deadline, set order).
    heap: IndexedHeap<(Time, u64)>,
    /// Set order of the next `set`, for first-in-first-out ties.
    seq: u64,
}

impl<K: Copy + Eq + Hash> TimerTable<K> {
    /// An empty table.
    pub fn new() -> Self {
        TimerTable {
            slots: HashMap::new(),
            keys: Vec::new(),
            free: Vec::new(),
            heap: IndexedHeap::new(),
            seq: 0,
        }
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Sets `key`'s timer to fire at `at`, replacing any earlier timer of that key.
    /// Returns the replaced timer's deadline, if there was one. `at` may lie in the past:
    /// the timer is then due at the next [`poll`](Self::poll).
    pub fn set(&mut self, key: K, at: Time) -> Option<Time> {
        let seq = self.seq;
        self.seq += 1;
        if let Some(&slot) = self.slots.get(&key) {
            let old = self.heap.get(slot).map(|(t, _)| t);
            self.heap.set(slot, (at, seq));
            return old;
        }
        let slot = match self.free.pop() {
            Some(s) => {
                self.keys[s] = Some(key);
                s
            }
            None => {
                self.keys.push(Some(key));
                self.keys.len() - 1
            }
        };
        self.slots.insert(key, slot);
        self.heap.set(slot, (at, seq));
        None
    }

    /// Cancels `key`'s timer. Returns its deadline, or `None` if it had none.
    pub fn cancel(&mut self, key: K) -> Option<Time> {
        let slot = self.slots.remove(&key)?;
        self.release(slot)
    }

    /// The deadline of `key`'s pending timer, if any.
    pub fn get(&self, key: K) -> Option<Time> {
        let &slot = self.slots.get(&key)?;
        self.heap.get(slot).map(|(t, _)| t)
    }

    /// Whether `key` has a pending timer.
    pub fn contains(&self, key: K) -> bool {
        self.slots.contains_key(&key)
    }

    /// The earliest pending deadline: how long the owner may wait before it must
    /// [`poll`](Self::poll) again. `None` when no timer is pending.
    #[inline]
    pub fn next_deadline(&self) -> Option<Time> {
        self.heap.peek().map(|(_, (t, _))| t)
    }

    /// Removes and returns the earliest timer that is due (deadline `<= now`), as
    /// `(key, deadline)`. Call repeatedly until `None` to drain all expired timers in
    /// deadline order; timers set while draining are seen if they are due.
    pub fn poll(&mut self, now: Time) -> Option<(K, Time)> {
        let (slot, (at, _)) = self.heap.peek()?;
        if at > now {
            return None;
        }
        let key = self.keys[slot].expect("a pending timer's slot has a key");
        self.slots.remove(&key);
        self.release(slot);
        Some((key, at))
    }

    /// Iterates over the pending timers as `(key, deadline)`, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (K, Time)> + '_ {
        self.heap
            .iter()
            .filter_map(|(slot, (t, _))| self.keys[slot].map(|k| (k, t)))
    }

    /// Cancels every timer.
    pub fn clear(&mut self) {
        *self = TimerTable::new();
    }

    /// Frees `slot` (already removed from `slots`); returns its deadline.
    fn release(&mut self, slot: usize) -> Option<Time> {
        self.keys[slot] = None;
        self.free.push(slot);
        self.heap.remove(slot).map(|(t, _)| t)
    }
}

impl<K: Copy + Eq + Hash> Default for TimerTable<K> {
    fn default() -> Self {
        TimerTable::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;
    use std::collections::BTreeMap;

    #[test]
    fn fires_in_deadline_order_and_replaces() {
        let mut t = TimerTable::new();
        assert!(t.is_empty());
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.poll(Time::NEVER), None);
        assert_eq!(t.set("a", Time(30)), None);
        assert_eq!(t.set("b", Time(10)), None);
        assert_eq!(t.set("c", Time(20)), None);
        assert_eq!(t.len(), 3);
        assert_eq!(t.next_deadline(), Some(Time(10)));
        // Replacing moves the timer, never duplicates it.
        assert_eq!(t.set("b", Time(40)), Some(Time(10)));
        assert_eq!(t.len(), 3);
        assert_eq!(t.get("b"), Some(Time(40)));
        assert_eq!(t.next_deadline(), Some(Time(20)));
        assert_eq!(t.poll(Time(19)), None);
        assert_eq!(t.poll(Time(35)), Some(("c", Time(20))));
        assert_eq!(t.poll(Time(35)), Some(("a", Time(30))));
        assert_eq!(t.poll(Time(35)), None);
        assert_eq!(t.cancel("b"), Some(Time(40)));
        assert_eq!(t.cancel("b"), None);
        assert!(t.is_empty());
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn equal_deadlines_fire_in_set_order() {
        let mut t = TimerTable::new();
        for k in [5u32, 3, 9, 1] {
            t.set(k, Time(7));
        }
        t.set(3, Time(7)); // re-set: now last in line
        let order: Vec<u32> = std::iter::from_fn(|| t.poll(Time(7)).map(|(k, _)| k)).collect();
        assert_eq!(order, vec![5, 9, 1, 3]);
    }

    #[test]
    fn slots_are_recycled() {
        let mut t = TimerTable::new();
        for round in 0..100i64 {
            for k in 0..10u64 {
                t.set(round as u64 * 10 + k, Time(round * 100 + k as i64));
            }
            while t.poll(Time(i64::MAX)).is_some() {}
        }
        assert!(t.is_empty());
        assert_eq!(t.keys.len(), 10);
        assert_eq!(t.iter().count(), 0);
        t.set(1, Time(1));
        t.clear();
        assert!(t.is_empty() && t.next_deadline().is_none());
    }

    /// The model: timers by key, and the same timers ordered by (deadline, set order).
    #[derive(Default)]
    struct Model {
        by_key: BTreeMap<u32, (Time, u64)>,
        order: BTreeMap<(Time, u64), u32>,
        seq: u64,
    }

    impl Model {
        fn set(&mut self, k: u32, at: Time) -> Option<Time> {
            let old = self.cancel(k);
            self.by_key.insert(k, (at, self.seq));
            self.order.insert((at, self.seq), k);
            self.seq += 1;
            old
        }
        fn cancel(&mut self, k: u32) -> Option<Time> {
            let e = self.by_key.remove(&k)?;
            self.order.remove(&e);
            Some(e.0)
        }
        fn poll(&mut self, now: Time) -> Option<(u32, Time)> {
            let (&(at, seq), &k) = self.order.first_key_value()?;
            if at > now {
                return None;
            }
            self.order.remove(&(at, seq));
            self.by_key.remove(&k);
            Some((k, at))
        }
    }

    #[test]
    fn matches_btreemap_model_randomized() {
        for seed in 0..20u64 {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
            let mut t = TimerTable::new();
            let mut m = Model::default();
            let keys = rng.gen_range(1..60u32);
            let mut now = Time(0);
            for step in 0..3_000 {
                let k = rng.gen_range(0..keys);
                match rng.gen_range(0..10) {
                    0..=4 => {
                        // Deadlines cluster so that ties are common; some lie in the past.
                        let at = now + crate::core::Dur(rng.gen_range(-20..200) / 10 * 10);
                        assert_eq!(t.set(k, at), m.set(k, at), "seed {seed} step {step}");
                    }
                    5 => assert_eq!(t.cancel(k), m.cancel(k), "seed {seed} step {step}"),
                    _ => {
                        now += crate::core::Dur(rng.gen_range(0..40));
                        loop {
                            let got = t.poll(now);
                            assert_eq!(got, m.poll(now), "seed {seed} step {step}");
                            if got.is_none() || rng.gen_bool(0.3) {
                                break;
                            }
                        }
                    }
                }
                assert_eq!(t.len(), m.by_key.len());
                assert_eq!(t.is_empty(), m.by_key.is_empty());
                assert_eq!(t.next_deadline(), m.order.keys().next().map(|&(at, _)| at));
                assert_eq!(t.get(k), m.by_key.get(&k).map(|&(at, _)| at));
                assert_eq!(t.contains(k), m.by_key.contains_key(&k));
            }
            let mut all: Vec<(u32, Time)> = t.iter().collect();
            all.sort();
            let want: Vec<(u32, Time)> = m.by_key.iter().map(|(&k, &(at, _))| (k, at)).collect();
            assert_eq!(all, want, "seed {seed}");
        }
    }
}
