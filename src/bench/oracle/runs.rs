//! The single-model search: batches are runs of consecutive requests (one SLO:
//! arrival order is deadline order). At each request it either drops it or
//! starts a batch of it and the next `b - 1` requests on the earliest-free
//! GPU, as soon as the last of them has arrived (plus the network's delay), if
//! the batch ends by its head's deadline (less the response margin). States
//! that reached the same request are ranked by their drops at the price plus
//! the GPU time already committed past that request's arrival; the best `beam`
//! distinct ones go on. With one model it ranks whole batches where the search
//! over open batches ([`super::search`]) must guess what an open batch will
//! cost, so the two find different schedules; the reference keeps the better.

use super::schedule::{Batch, Problem, Schedule};
use super::search::MAX_GPUS;

/// A slot of states waiting for their request is cut back to the beam when it
/// holds this many beams (memory stays bounded by the beam whatever the
/// largest batch).
const SLOT_STATES: usize = 8;

/// A state of the search: how it got here and the GPUs' free times, sorted.
#[derive(Clone, Copy)]
struct State {
    drops: u32,
    /// The pruned state it came from (index into the arena).
    parent: u32,
    /// Its last decision: 0 = dropped the request, else the batch size.
    b: u16,
    free: [i64; MAX_GPUS],
}

/// The beam search at one price: the decisions of the best schedule (0 = drop,
/// else a batch size), one per decision, in order.
pub fn search(p: &Problem, beam: usize, price: f64) -> Vec<u16> {
    assert_eq!(p.models.len(), 1, "one model");
    let t = &p.models[0];
    let arr: Vec<i64> = p.arr.iter().map(|a| a.1).collect();
    let arr = &arr[..];
    let price = price * t.least_per_request();
    let n = arr.len();
    let bmax = t.max_batch();
    let ring = bmax + 1;
    let mut slots: Vec<Vec<State>> = vec![Vec::new(); ring];
    // The arena of kept states: (parent, decision); the root's parent is
    // u32::MAX (and its decision none).
    let mut arena: Vec<(u32, u16)> = Vec::with_capacity(n.saturating_mul(beam.min(64)));
    slots[0].push(State {
        drops: 0,
        parent: u32::MAX,
        b: 0,
        free: [i64::MIN / 4; MAX_GPUS],
    });
    let g = p.gpus;
    let price = price.round() as i64;
    // Keeps the best `keep` distinct states of `v` at request `i`, ranked by
    // their drops at `price` plus the GPU time they have committed past that
    // request's arrival (past the end: by drops alone). Many paths reach the
    // same state (the same drops and free times); one of each is kept, so the
    // beam holds `keep` different ones.
    let prune = |v: &mut Vec<State>, i: usize, keep: usize| {
        let now = arr.get(i).copied().unwrap_or(i64::MAX / 4);
        let key = |s: &State| {
            let committed: i64 = s.free[..g].iter().map(|&f| (f - now).max(0)).sum();
            s.drops as i64 * price + committed
        };
        // The best twice `keep` first (linear), then those sorted and the
        // copies removed.
        if v.len() > 2 * keep {
            v.select_nth_unstable_by_key(2 * keep - 1, key);
            v.truncate(2 * keep);
        }
        v.sort_unstable_by_key(key);
        v.dedup_by(|a, b| a.drops == b.drops && a.free[..g] == b.free[..g]);
        v.truncate(keep);
    };
    // Pushes `s` as a state at request `j` (see [`SLOT_STATES`]).
    let push = |slots: &mut Vec<Vec<State>>, j: usize, s: State| {
        let v = &mut slots[j % ring];
        v.push(s);
        if v.len() >= SLOT_STATES * beam {
            prune(v, j, beam);
        }
    };
    for i in 0..n {
        let mut cur = std::mem::take(&mut slots[i % ring]);
        let now = arr[i];
        prune(&mut cur, i, beam);
        for s in cur {
            let id = arena.len() as u32;
            arena.push((s.parent, s.b));
            push(
                &mut slots,
                i + 1,
                State {
                    drops: s.drops + 1,
                    parent: id,
                    b: 0,
                    ..s
                },
            );
            let due = t.due(now);
            for b in 1..=bmax.min(n - i) {
                let ready = arr[i + b - 1] + t.delay[b];
                if ready + t.lat[b] > due {
                    // Larger batches start no earlier and run no shorter.
                    break;
                }
                let end = ready.max(s.free[0]) + t.lat[b];
                if end > due {
                    continue;
                }
                let mut free = s.free;
                // free[0] is the earliest; put `end` where it belongs.
                let mut k = 0;
                while k + 1 < g && free[k + 1] < end {
                    free[k] = free[k + 1];
                    k += 1;
                }
                free[k] = end;
                push(
                    &mut slots,
                    i + b,
                    State {
                        drops: s.drops,
                        parent: id,
                        b: b as u16,
                        free,
                    },
                );
            }
        }
    }
    // The fewest drops past the last request; its decisions, back to the root.
    let best = slots[n % ring]
        .iter()
        .min_by_key(|s| s.drops)
        .expect("dropping is always possible, so the end is reached");
    let mut out = Vec::new();
    let (mut parent, mut b) = (best.parent, best.b);
    while parent != u32::MAX {
        out.push(b);
        (parent, b) = arena[parent as usize];
    }
    out.reverse();
    out
}

/// The schedule of decisions `plan` (0 = drop, else a batch of the next b
/// requests) on numbered GPUs: the earliest free, the lowest id on a tie.
pub fn replay(p: &Problem, plan: &[u16]) -> Schedule {
    let t = &p.models[0];
    let mut free = vec![i64::MIN / 4; p.gpus];
    let mut s = Schedule::default();
    let mut i = 0;
    for &b in plan {
        if b == 0 {
            s.dropped.push(i as u32);
            i += 1;
            continue;
        }
        let b = b as usize;
        let gpu = (0..p.gpus)
            .min_by_key(|&k| (free[k], k))
            .expect("at least one GPU");
        let start = (p.arr[i + b - 1].1 + t.delay[b]).max(free[gpu]);
        free[gpu] = start + t.lat[b];
        s.batches.push(Batch {
            model: 0,
            reqs: (i as u32..(i + b) as u32).collect(),
            gpu: gpu as u16,
            start,
        });
        i += b;
    }
    assert_eq!(i, p.arr.len(), "the plan covers every request once");
    s
}
