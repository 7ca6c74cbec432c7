//! The beam search behind the offline reference, over the arrivals of every
//! model in time order.
//!
//! A state holds, per model, its open batch (its head, its last request and
//! its size: requests gathered, not yet placed on a GPU), the GPUs' free times
//! (sorted) and the drops so far. At each arrival, of model m, it either
//!
//! - joins m's open batch and keeps it open, or joins it and closes it there
//!   (the batch starts once this, its last request, is there, plus the
//!   network's delay), or
//! - closes m's open batch without it (placed as if closed at its last
//!   request; a batch that no longer fits then is dropped whole), and then
//!   drops the request, opens a new batch with it, or runs it alone;
//! - with no open batch: drops it, opens a batch with it, or runs it alone.
//!
//! A batch is placed on the GPU that was free latest by the time it is ready
//! (the earliest-free one if none is): the same start, and the GPUs free
//! earlier stay free for batches closed after it that are ready sooner. It
//! must end by its head's deadline (less the response margin); an open batch
//! is kept only while that is still possible with the GPUs as they are. At the
//! end every open batch is closed, in the order of their last requests.
//!
//! The states after each arrival are ranked by their drops, each priced at
//! `price` times its model's least GPU time per request, plus the GPU time
//! already committed past that arrival, plus each open batch's requests at
//! their model's least GPU time per request (what they will cost at best);
//! the best `beam` distinct ones go on (many paths reach the same state:
//! copies are removed, as they would crowd the beam with one state). With one
//! model this reaches every schedule of batches of consecutive requests that
//! the single-model search of earlier versions reached, and some it did not
//! (a batch closed later than its last request).

use super::schedule::{Batch, Problem, Schedule};

/// The most models the search handles (its states keep every model's open
/// batch).
pub const MAX_MODELS: usize = 16;
/// The most GPUs the search handles (its states keep every GPU's free time).
pub const MAX_GPUS: usize = 16;

/// A model's open batch: size 0 = none.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
struct Open {
    /// Its first and last requests (indices into the arrivals).
    head: u32,
    last: u32,
    size: u16,
}

#[derive(Clone, Copy)]
struct State {
    /// Drops so far, and their price.
    drops: u32,
    drop_cost: i64,
    /// The state it came from (index into the arena).
    parent: u32,
    /// Its last decision (see the `A_*` codes).
    act: u8,
    free: [i64; MAX_GPUS],
    open: [Open; MAX_MODELS],
}

// What happens to the arriving request (the low 3 bits of a decision).
const A_DROP: u8 = 0;
/// Opens a batch and keeps it open.
const A_OPEN: u8 = 1;
/// Runs alone (opens a batch and closes it at once).
const A_ALONE: u8 = 2;
/// Joins its model's open batch and keeps it open.
const A_JOIN: u8 = 3;
/// Joins its model's open batch and closes it.
const A_JOIN_CLOSE: u8 = 4;
/// Before that, its model's open batch was closed and placed...
const F_CLOSED: u8 = 8;
/// ...or, no longer fitting, dropped whole.
const F_DROPPED: u8 = 16;

/// Places a batch ready at `ready`, running `lat`, due by `due`, on the GPUs
/// `free` (sorted): on the GPU free latest by `ready`, or the earliest-free
/// one. Returns its GPU's rank in `free` and its start, or None if it would
/// end late; `free` is updated (and stays sorted) only when it fits.
fn place(free: &mut [i64], ready: i64, lat: i64, due: i64) -> Option<(usize, i64)> {
    let k = free.partition_point(|&f| f <= ready).saturating_sub(1);
    let start = ready.max(free[k]);
    let end = start + lat;
    if end > due {
        return None;
    }
    let mut j = k;
    while j + 1 < free.len() && free[j + 1] < end {
        free[j] = free[j + 1];
        j += 1;
    }
    free[j] = end;
    Some((k, start))
}

/// The beam search at one price (a multiple of each model's least GPU time
/// per request): one decision per arrival, for [`replay`].
pub fn search(p: &Problem, beam: usize, price: f64) -> Vec<u8> {
    let n = p.arr.len();
    let g = p.gpus;
    let nm = p.models.len();
    assert!((1..=MAX_GPUS).contains(&g) && (1..=MAX_MODELS).contains(&nm));
    let unit: Vec<i64> = p
        .models
        .iter()
        .map(|m| m.least_per_request().round() as i64)
        .collect();
    let drop_price: Vec<i64> = unit
        .iter()
        .map(|&u| (u as f64 * price).round() as i64)
        .collect();
    let key = |s: &State, now: i64| -> i64 {
        let committed: i64 = s.free[..g].iter().map(|&f| (f - now).max(0)).sum();
        let open: i64 = (0..nm).map(|m| s.open[m].size as i64 * unit[m]).sum();
        s.drop_cost + committed + open
    };
    // The best `beam` distinct states of `v` at time `now`.
    let prune = |v: &mut Vec<State>, now: i64| {
        let mut keyed: Vec<(i64, State)> = v.drain(..).map(|s| (key(&s, now), s)).collect();
        if keyed.len() > 2 * beam {
            keyed.select_nth_unstable_by_key(2 * beam - 1, |x| x.0);
            keyed.truncate(2 * beam);
        }
        // Equal states have equal keys; ordering ties by the state itself
        // puts copies side by side.
        keyed.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| a.1.free[..g].cmp(&b.1.free[..g]))
                .then_with(|| a.1.drops.cmp(&b.1.drops))
                .then_with(|| {
                    let o = |s: &State| -> Vec<(u32, u32, u16)> {
                        s.open[..nm]
                            .iter()
                            .map(|o| (o.head, o.last, o.size))
                            .collect()
                    };
                    o(&a.1).cmp(&o(&b.1))
                })
        });
        keyed.dedup_by(|a, b| {
            a.0 == b.0
                && a.1.drops == b.1.drops
                && a.1.free[..g] == b.1.free[..g]
                && a.1.open[..nm] == b.1.open[..nm]
        });
        keyed.truncate(beam);
        v.extend(keyed.into_iter().map(|x| x.1));
    };
    let mut arena: Vec<(u32, u8)> = Vec::with_capacity(n.saturating_mul(beam.min(64)));
    let mut cur = vec![State {
        drops: 0,
        drop_cost: 0,
        parent: u32::MAX,
        act: 0,
        free: [i64::MIN / 4; MAX_GPUS],
        open: [Open::default(); MAX_MODELS],
    }];
    let mut next: Vec<State> = Vec::new();
    for (i, &(m, now)) in p.arr.iter().enumerate() {
        let m = m as usize;
        let t = &p.models[m];
        let bmax = t.max_batch();
        for s in cur.drain(..) {
            let id = arena.len() as u32;
            arena.push((s.parent, s.act));
            let base = State { parent: id, ..s };
            let o = s.open[m];
            // Whether a batch of `size` ready at `ready`, head at `head`, can
            // still end in time on the GPUs of `free`.
            let can = |free: &[i64], head: u32, size: usize, ready: i64| {
                size <= bmax && ready.max(free[0]) + t.lat[size] <= t.due(p.arr[head as usize].1)
            };
            // The request on its own, after its model's open batch (if any)
            // was settled into `st` with flag `flag`.
            let fresh = |st: State, flag: u8, next: &mut Vec<State>| {
                next.push(State {
                    drops: st.drops + 1,
                    drop_cost: st.drop_cost + drop_price[m],
                    act: flag | A_DROP,
                    ..st
                });
                let ready = now + t.delay[1];
                if can(&st.free[..g], i as u32, 1, ready) {
                    let mut open = st.open;
                    open[m] = Open {
                        head: i as u32,
                        last: i as u32,
                        size: 1,
                    };
                    next.push(State {
                        act: flag | A_OPEN,
                        open,
                        ..st
                    });
                    let mut free = st.free;
                    if place(&mut free[..g], ready, t.lat[1], t.due(now)).is_some() {
                        next.push(State {
                            act: flag | A_ALONE,
                            free,
                            ..st
                        });
                    }
                }
            };
            if o.size == 0 {
                fresh(base, 0, &mut next);
                continue;
            }
            let size = o.size as usize + 1;
            let ready = now + t.delay.get(size).copied().unwrap_or(0);
            if can(&s.free[..g], o.head, size, ready) {
                let mut open = s.open;
                open[m] = Open {
                    last: i as u32,
                    size: size as u16,
                    ..o
                };
                next.push(State {
                    act: A_JOIN,
                    open,
                    ..base
                });
                let mut free = s.free;
                let due = t.due(p.arr[o.head as usize].1);
                if place(&mut free[..g], ready, t.lat[size], due).is_some() {
                    let mut open = s.open;
                    open[m] = Open::default();
                    next.push(State {
                        act: A_JOIN_CLOSE,
                        free,
                        open,
                        ..base
                    });
                }
            }
            let (settled, flag) = close(p, m, drop_price[m], base);
            fresh(settled, flag, &mut next);
        }
        prune(&mut next, now);
        std::mem::swap(&mut cur, &mut next);
    }
    // Every open batch closed; the fewest drops.
    let best = cur
        .into_iter()
        .map(|mut s| {
            for m in close_order(&s.open[..nm]) {
                s = close(p, m, drop_price[m], s).0;
            }
            s
        })
        .min_by_key(|s| s.drops)
        .expect("dropping is always possible, so the end is reached");
    let mut out = Vec::with_capacity(n);
    let (mut parent, mut act) = (best.parent, best.act);
    while parent != u32::MAX {
        out.push(act);
        (parent, act) = arena[parent as usize];
    }
    out.reverse();
    debug_assert_eq!(out.len(), n);
    out
}

/// Closes model `m`'s open batch of `s`: placed as if closed at its last
/// request, or dropped whole if it no longer fits. Returns the state and the
/// decision's flag.
fn close(p: &Problem, m: usize, drop_price: i64, mut s: State) -> (State, u8) {
    let o = s.open[m];
    let t = &p.models[m];
    s.open[m] = Open::default();
    let ready = p.arr[o.last as usize].1 + t.delay[o.size as usize];
    let due = t.due(p.arr[o.head as usize].1);
    let g = p.gpus;
    if place(&mut s.free[..g], ready, t.lat[o.size as usize], due).is_some() {
        (s, F_CLOSED)
    } else {
        s.drops += o.size as u32;
        s.drop_cost += o.size as i64 * drop_price;
        (s, F_DROPPED)
    }
}

/// The models with an open batch, in the order of their last requests.
fn close_order(open: &[Open]) -> Vec<usize> {
    let mut ms: Vec<usize> = (0..open.len()).filter(|&m| open[m].size > 0).collect();
    ms.sort_by_key(|&m| open[m].last);
    ms
}

/// The schedule of decisions `acts` (one per arrival), on numbered GPUs (of
/// those that fit a batch, the lowest). Follows the search's rules exactly, so
/// the batches the search placed are placed alike.
pub fn replay(p: &Problem, acts: &[u8]) -> Schedule {
    assert_eq!(acts.len(), p.arr.len(), "one decision per arrival");
    let nm = p.models.len();
    let mut free = vec![i64::MIN / 4; p.gpus];
    // Per model: the open batch's requests.
    let mut open: Vec<Vec<u32>> = vec![Vec::new(); nm];
    let mut s = Schedule::default();
    // Places `reqs` of model `m` ready at `ready`, or drops them if they no
    // longer fit.
    let run = |s: &mut Schedule, free: &mut [i64], m: usize, reqs: Vec<u32>, ready: i64| {
        let t = &p.models[m];
        let lat = t.lat[reqs.len()];
        let due = t.due(p.arr[reqs[0] as usize].1);
        // The GPU free latest by `ready` (the lowest of equals), else the
        // earliest-free one: the search's choice, on numbered GPUs.
        let gpu = (0..free.len())
            .filter(|&k| free[k] <= ready)
            .max_by_key(|&k| (free[k], std::cmp::Reverse(k)))
            .or_else(|| (0..free.len()).min_by_key(|&k| (free[k], k)))
            .expect("at least one GPU");
        let start = ready.max(free[gpu]);
        if start + lat > due {
            s.dropped.extend(reqs);
            return;
        }
        free[gpu] = start + lat;
        s.batches.push(Batch {
            model: m as u16,
            reqs,
            gpu: gpu as u16,
            start,
        });
    };
    let ready_of = |m: usize, reqs: &[u32]| {
        p.arr[*reqs.last().expect("not empty") as usize].1 + p.models[m].delay[reqs.len()]
    };
    for (i, (&a, &(m, _))) in acts.iter().zip(&p.arr).enumerate() {
        let m = m as usize;
        let i = i as u32;
        if a & (F_CLOSED | F_DROPPED) != 0 {
            let reqs = std::mem::take(&mut open[m]);
            let ready = ready_of(m, &reqs);
            run(&mut s, &mut free, m, reqs, ready);
        }
        match a & 7 {
            A_DROP => s.dropped.push(i),
            A_OPEN | A_JOIN => open[m].push(i),
            A_ALONE | A_JOIN_CLOSE => {
                let mut reqs = std::mem::take(&mut open[m]);
                reqs.push(i);
                let ready = ready_of(m, &reqs);
                run(&mut s, &mut free, m, reqs, ready);
            }
            _ => unreachable!("no such decision {a}"),
        }
    }
    let mut ms: Vec<usize> = (0..nm).filter(|&m| !open[m].is_empty()).collect();
    ms.sort_by_key(|&m| *open[m].last().expect("open"));
    for m in ms {
        let reqs = std::mem::take(&mut open[m]);
        let ready = ready_of(m, &reqs);
        run(&mut s, &mut free, m, reqs, ready);
    }
    s.dropped.sort_unstable();
    s
}
