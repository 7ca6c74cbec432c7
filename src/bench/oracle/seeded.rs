//! The reference seeded with an online policy's schedule: the simulator's run
//! of that policy on the same arrivals ([`from_plans`]), improved by a local
//! search that knows every arrival ([`improve`]).
//!
//! The seed is the run's plans as they ran, GPU by GPU in their order, each
//! batch started as soon as its last input (plus the network's delay) and its
//! GPU allow; a request its batch would serve past its deadline leaves the
//! batch and counts dropped (as it counted late). A batch then starts no later
//! than it did in the run and runs no longer, so every request the run served
//! in time is served in time here: the seed is at least as good as the online
//! policy for every model, on any number of models and GPUs.
//!
//! The local search then, in rounds until nothing changes (four at most),
//! merges pairs of batches of one model that fit one batch still in time
//! (freeing the GPU time of a batch's fixed cost), and places the dropped
//! requests, each where it costs the least GPU time: into a batch of its
//! model, else as a new batch of it and the next dropped requests of its
//! model in a gap of some GPU; every move keeps every batch after it on that
//! GPU in time. It only adds requests to batches, so it is never worse than
//! its seed, for any model.
//!
//! Written here rather than taken from a solver crate: the moves and the
//! slack bookkeeping are specific to batches with deadlines on GPUs.

use super::schedule::{Batch, Problem, Schedule};
use crate::run::PlanRecord;

/// The online run's plans (`plans`, as the simulator recorded them: task ids
/// are indices into the arrivals) as a schedule of problem `p`: each GPU's
/// batches in the order they ran, each as early as its inputs and its GPU
/// allow, a batch's requests it would serve late dropped. Errors name a plan
/// that does not belong to `p` (an unknown GPU, model or request, a request
/// in two plans, a batch larger than its model's largest).
pub fn from_plans(p: &Problem, plans: &[PlanRecord]) -> Result<Schedule, String> {
    let n = p.arr.len();
    let mut placed = vec![false; n];
    let mut per_gpu: Vec<Vec<&PlanRecord>> = vec![Vec::new(); p.gpus];
    for r in plans.iter().filter(|r| !r.preempted) {
        per_gpu
            .get_mut(r.gpu.idx())
            .ok_or_else(|| {
                format!(
                    "plan {} runs on GPU {}, past the cluster",
                    r.plan.0, r.gpu.0
                )
            })?
            .push(r);
    }
    let mut s = Schedule::default();
    for (g, v) in per_gpu.iter_mut().enumerate() {
        // The simulator runs a GPU's plans in the order they came (stable on
        // equal starts).
        v.sort_by_key(|r| r.exec_at);
        let mut free = i64::MIN / 4;
        for r in v.iter() {
            let m = r.model.idx();
            let t = p
                .models
                .get(m)
                .ok_or_else(|| format!("plan {} is of model {}, unknown", r.plan.0, m))?;
            let mut reqs = Vec::with_capacity(r.tasks.len());
            for id in &r.tasks {
                let q = id.0 as usize;
                if q >= n || p.arr[q].0 as usize != m || placed[q] {
                    return Err(format!(
                        "plan {} holds request {q}: past the trace, of another model or in two plans",
                        r.plan.0
                    ));
                }
                placed[q] = true;
                reqs.push(q as u32);
            }
            if reqs.is_empty() || reqs.len() > t.max_batch() {
                return Err(format!(
                    "plan {} holds {} requests (largest batch {})",
                    r.plan.0,
                    reqs.len(),
                    t.max_batch()
                ));
            }
            reqs.sort_unstable();
            // The earliest arrivals are due first: they leave until the rest
            // is in time.
            let mut lo = 0;
            let mut fit = None;
            while lo < reqs.len() {
                let k = &reqs[lo..];
                let ready = p.arr[k[k.len() - 1] as usize].1 + t.delay[k.len()];
                let start = ready.max(free);
                if start + t.lat[k.len()] <= t.due(p.arr[k[0] as usize].1) {
                    fit = Some(start);
                    break;
                }
                lo += 1;
            }
            s.dropped.extend_from_slice(&reqs[..lo]);
            if let Some(start) = fit {
                let reqs = reqs.split_off(lo);
                free = start + t.lat[reqs.len()];
                s.batches.push(Batch {
                    model: m as u16,
                    reqs,
                    gpu: g as u16,
                    start,
                });
            }
        }
    }
    s.dropped
        .extend((0..n as u32).filter(|&q| !placed[q as usize]));
    s.dropped.sort_unstable();
    Ok(s)
}

/// A batch in a GPU's sequence, with its times as the sequence gives them.
#[derive(Clone)]
struct Run {
    /// Its name while the search moves it.
    id: u32,
    model: u16,
    /// Sorted (arrival order).
    reqs: Vec<u32>,
    start: i64,
    end: i64,
    /// How much later it may start with it and every batch after it on its
    /// GPU still ending by its head's deadline.
    slack: i64,
}

/// Times the batches of one GPU in their order, each as early as its inputs
/// and the GPU allow, and their slack.
fn retime(p: &Problem, runs: &mut [Run]) {
    let mut free = i64::MIN / 4;
    for r in runs.iter_mut() {
        let t = &p.models[r.model as usize];
        let b = r.reqs.len();
        let ready = p.arr[r.reqs[b - 1] as usize].1 + t.delay[b];
        r.start = ready.max(free);
        r.end = r.start + t.lat[b];
        free = r.end;
    }
    let mut after: Option<(i64, i64)> = None;
    for r in runs.iter_mut().rev() {
        let t = &p.models[r.model as usize];
        let mut s = t.due(p.arr[r.reqs[0] as usize].1) - r.end;
        if let Some((start, slack)) = after {
            // Starting d later pushes the next one by d less the idle gap.
            s = s.min(start - r.end + slack);
        }
        r.slack = s;
        after = Some((r.start, s));
    }
}

/// Whether a batch ending at `end` just before `runs[k]` keeps `runs[k..]` in
/// time.
fn fits_before(runs: &[Run], k: usize, end: i64) -> bool {
    runs.get(k)
        .is_none_or(|r| (end - r.start).max(0) <= r.slack)
}

/// The end of the batch before position `k`.
fn free_at(runs: &[Run], k: usize) -> i64 {
    if k == 0 {
        i64::MIN / 4
    } else {
        runs[k - 1].end
    }
}

/// Schedule `s` of problem `p` improved: its dropped requests placed where
/// they fit (see the module's notes). Every batch of `s` keeps its requests,
/// so no model has more bad requests than in `s`. `s` must be feasible.
pub fn improve(p: &Problem, s: &Schedule) -> Schedule {
    let mut gpus: Vec<Vec<Run>> = (0..p.gpus).map(|_| Vec::new()).collect();
    let mut order: Vec<&Batch> = s.batches.iter().collect();
    order.sort_by_key(|b| (b.gpu, b.start));
    for (id, b) in order.into_iter().enumerate() {
        let mut reqs = b.reqs.clone();
        reqs.sort_unstable();
        gpus[b.gpu as usize].push(Run {
            id: id as u32,
            model: b.model,
            reqs,
            start: 0,
            end: 0,
            slack: 0,
        });
    }
    for runs in &mut gpus {
        retime(p, runs);
    }
    let mut dropped = s.dropped.clone();
    dropped.sort_unstable();
    let mut next_id = s.batches.len() as u32;
    for _round in 0..4 {
        let before = dropped.len();
        let merged = merge_batches(p, &mut gpus);
        dropped.retain(|&q| !join_a_batch(p, &mut gpus, q));
        dropped = new_batches(p, &mut gpus, dropped, &mut next_id);
        if dropped.len() == before && merged == 0 {
            break;
        }
    }
    let mut out = Schedule {
        batches: Vec::with_capacity(s.batches.len()),
        dropped,
    };
    for (g, runs) in gpus.into_iter().enumerate() {
        out.batches.extend(runs.into_iter().map(|r| Batch {
            model: r.model,
            reqs: r.reqs,
            gpu: g as u16,
            start: r.start,
        }));
    }
    out
}

/// Whether every batch of a GPU's sequence, as timed, ends in time.
fn in_time(runs: &[Run]) -> bool {
    runs.iter().all(|r| r.slack >= 0)
}

/// Merges pairs of batches of one model whose requests fit one batch that
/// still ends in time (with every batch after it on its GPU), in the earlier
/// one's place or the later one's (the other leaves its GPU): the GPU time of
/// a batch's fixed cost is freed for the dropped requests. Returns how many
/// pairs it merged.
fn merge_batches(p: &Problem, gpus: &mut [Vec<Run>]) -> usize {
    let mut merged = 0;
    // The later batch of each pair, in order of start over every GPU.
    let mut order: Vec<(i64, u32, usize)> = Vec::new();
    for (g, runs) in gpus.iter().enumerate() {
        order.extend(runs.iter().map(|r| (r.start, r.id, g)));
    }
    order.sort_unstable();
    for (_, id, g2) in order {
        // Where it is now (earlier merges moved batches), if not merged away.
        let Some(k2) = gpus[g2].iter().position(|r| r.id == id) else {
            continue;
        };
        let r2 = &gpus[g2][k2];
        let m = r2.model;
        let t = &p.models[m as usize];
        let bmax = t.max_batch();
        // (GPU time freed, end, the batch merged away, the one kept), each
        // batch as (GPU, index).
        type Slot = (usize, usize);
        let mut best: Option<(i64, i64, Slot, Slot)> = None;
        for (g1, runs) in gpus.iter().enumerate() {
            let from = runs.partition_point(|r| r.start < r2.start - t.slo);
            for (k1, r1) in runs.iter().enumerate().skip(from) {
                if r1.start > r2.start {
                    break;
                }
                if (g1, k1) == (g2, k2) || r1.model != m || r1.reqs.len() + r2.reqs.len() > bmax {
                    continue;
                }
                let size = r1.reqs.len() + r2.reqs.len();
                let last = r1.reqs[r1.reqs.len() - 1].max(r2.reqs[r2.reqs.len() - 1]);
                let head = r1.reqs[0].min(r2.reqs[0]);
                let ready = p.arr[last as usize].1 + t.delay[size];
                let due = t.due(p.arr[head as usize].1);
                let freed = t.lat[r1.reqs.len()] + t.lat[r2.reqs.len()] - t.lat[size];
                // In `keep`'s place on its GPU, `gone` leaving: the batches
                // after `keep` must stay in time (a batch's slack does not
                // depend on those before it, so `gone` is skipped when it
                // is next, and counted as still there otherwise, which only
                // errs on the safe side).
                for (keep, gone) in [((g2, k2), (g1, k1)), ((g1, k1), (g2, k2))] {
                    let runs = &gpus[keep.0];
                    let same = keep.0 == gone.0;
                    let before = if same && gone.1 + 1 == keep.1 {
                        free_at(runs, gone.1)
                    } else {
                        free_at(runs, keep.1)
                    };
                    let end = ready.max(before) + t.lat[size];
                    let next = if same && gone.1 == keep.1 + 1 {
                        keep.1 + 2
                    } else {
                        keep.1 + 1
                    };
                    if end > due || !fits_before(runs, next, end) {
                        continue;
                    }
                    if best.is_none_or(|b| (freed, -end) > (b.0, -b.1)) {
                        best = Some((freed, end, gone, keep));
                    }
                }
            }
        }
        let Some((_, _, gone, keep)) = best else {
            continue;
        };
        let saved = (gpus[gone.0].clone(), gpus[keep.0].clone());
        let r1 = gpus[gone.0].remove(gone.1);
        let k = if gone.0 == keep.0 && gone.1 < keep.1 {
            keep.1 - 1
        } else {
            keep.1
        };
        let reqs = &mut gpus[keep.0][k].reqs;
        reqs.extend(r1.reqs);
        reqs.sort_unstable();
        retime(p, &mut gpus[gone.0]);
        retime(p, &mut gpus[keep.0]);
        if in_time(&gpus[gone.0]) && in_time(&gpus[keep.0]) {
            merged += 1;
        } else {
            // Not reached when the checks above hold; a guard all the same.
            (gpus[gone.0], gpus[keep.0]) = saved;
        }
    }
    merged
}

/// Puts request `q` into the batch of its model where it adds the least GPU
/// time, if one can take it in time; whether it did.
fn join_a_batch(p: &Problem, gpus: &mut [Vec<Run>], q: u32) -> bool {
    let (m, a) = p.arr[q as usize];
    let t = &p.models[m as usize];
    let bmax = t.max_batch();
    let mut best: Option<(i64, usize, usize)> = None;
    for (g, runs) in gpus.iter().enumerate() {
        // A batch that can take it starts within an SLO of its arrival.
        let from = runs.partition_point(|r| r.start < a - t.slo);
        for k in from..runs.len() {
            let r = &runs[k];
            if r.start > a + t.slo {
                break;
            }
            if r.model != m || r.reqs.len() >= bmax {
                continue;
            }
            let size = r.reqs.len() + 1;
            let last = r.reqs[r.reqs.len() - 1].max(q);
            let head = r.reqs[0].min(q);
            let ready = p.arr[last as usize].1 + t.delay[size];
            let end = ready.max(free_at(runs, k)) + t.lat[size];
            if end > t.due(p.arr[head as usize].1) || !fits_before(runs, k + 1, end) {
                continue;
            }
            let cost = end - r.end;
            if best.is_none_or(|b| cost < b.0) {
                best = Some((cost, g, k));
            }
        }
    }
    let Some((_, g, k)) = best else {
        return false;
    };
    let reqs = &mut gpus[g][k].reqs;
    let at = reqs.partition_point(|&x| x < q);
    reqs.insert(at, q);
    retime(p, &mut gpus[g]);
    true
}

/// Places new batches of the dropped requests `dropped` (sorted): for each
/// model, the first still dropped with as many of the next dropped of its
/// model as fit in a gap of some GPU (the earliest end of any GPU), else it
/// stays dropped. Returns those still dropped, sorted.
fn new_batches(
    p: &Problem,
    gpus: &mut [Vec<Run>],
    dropped: Vec<u32>,
    next_id: &mut u32,
) -> Vec<u32> {
    let mut per_model: Vec<Vec<u32>> = vec![Vec::new(); p.models.len()];
    for &q in &dropped {
        per_model[p.arr[q as usize].0 as usize].push(q);
    }
    let mut left = Vec::new();
    for (m, qs) in per_model.iter().enumerate() {
        let t = &p.models[m];
        let mut i = 0;
        while i < qs.len() {
            let due = t.due(p.arr[qs[i] as usize].1);
            // The most of the next dropped that could end in time at all.
            let mut most = 0;
            while most < t.max_batch()
                && i + most < qs.len()
                && p.arr[qs[i + most] as usize].1 + t.delay[most + 1] + t.lat[most + 1] <= due
            {
                most += 1;
            }
            let mut placed = 0;
            for size in (1..=most).rev() {
                let ready = p.arr[qs[i + size - 1] as usize].1 + t.delay[size];
                let lat = t.lat[size];
                let mut best: Option<(i64, usize, usize)> = None;
                for (g, runs) in gpus.iter().enumerate() {
                    let mut k = runs.partition_point(|r| r.end <= ready);
                    while k <= runs.len() {
                        let end = ready.max(free_at(runs, k)) + lat;
                        if end > due {
                            break;
                        }
                        if fits_before(runs, k, end) {
                            if best.is_none_or(|b| end < b.0) {
                                best = Some((end, g, k));
                            }
                            break;
                        }
                        k += 1;
                    }
                }
                if let Some((_, g, k)) = best {
                    gpus[g].insert(
                        k,
                        Run {
                            id: *next_id,
                            model: m as u16,
                            reqs: qs[i..i + size].to_vec(),
                            start: 0,
                            end: 0,
                            slack: 0,
                        },
                    );
                    *next_id += 1;
                    retime(p, &mut gpus[g]);
                    placed = size;
                    break;
                }
            }
            if placed == 0 {
                left.push(qs[i]);
                i += 1;
            } else {
                i += placed;
            }
        }
    }
    left.sort_unstable();
    left
}

#[cfg(test)]
mod tests {
    use super::super::schedule::tests::tiny;
    use super::*;
    use crate::core::{GpuId, ModelId, PlanId, TaskId, Time};

    fn plan(id: u64, model: u32, gpu: u32, exec_ms: i64, tasks: &[u64]) -> PlanRecord {
        PlanRecord {
            plan: PlanId(id),
            model: ModelId(model),
            gpu: GpuId(gpu),
            sent_at: Time(exec_ms * 1_000_000),
            exec_at: Time(exec_ms * 1_000_000),
            tasks: tasks.iter().map(|&t| TaskId(t)).collect(),
            preempted: false,
        }
    }

    /// The seed keeps the run's batches and order, starts each as early as
    /// it can, and drops what its batch would serve late; the improvement
    /// then places the dropped requests.
    #[test]
    fn the_seed_is_the_run_retimed_and_the_search_places_drops() {
        // l(b) = 2 + b ms, SLO 10 ms, one GPU. Model 0 at 0, 1, 2 ms; model 1
        // at 3 ms.
        let p = tiny(&[(0, 0), (0, 1), (0, 2), (1, 3)], 1);
        // The run: requests 0 and 1 together at 4 ms ([4, 8)), request 2
        // dropped, request 3 at 9 ms ([9, 12): in time, due 13).
        let plans = [plan(1, 0, 0, 4, &[0, 1]), plan(2, 1, 0, 9, &[3])];
        let seed = from_plans(&p, &plans).unwrap();
        assert_eq!(p.verify(&seed), Ok(()));
        // Retimed: [1, 5) and [5, 8).
        assert_eq!(seed.batches[0].start, 1_000_000);
        assert_eq!(seed.batches[1].start, 5_000_000);
        assert_eq!(seed.dropped, vec![2]);
        // Request 2 joins the first batch: [2, 7), then [7, 10).
        let better = improve(&p, &seed);
        assert_eq!(p.verify(&better), Ok(()));
        assert!(better.dropped.is_empty());
        assert_eq!(better.batches[0].reqs, vec![0, 1, 2]);
        // A request its batch would serve late leaves it: the run put request
        // 3 after a batch that ends past its deadline.
        let p = tiny(&[(0, 0), (1, 0), (1, 9)], 1);
        let plans = [
            plan(1, 0, 0, 0, &[0]),    // [0, 3)
            plan(2, 1, 0, 9, &[1, 2]), // [9, 13): due 10 for request 1
        ];
        let seed = from_plans(&p, &plans).unwrap();
        assert_eq!(p.verify(&seed), Ok(()));
        assert_eq!(seed.dropped, vec![1]);
        assert_eq!(seed.batches[1].reqs, vec![2]);
        // Foreign plans are refused.
        assert!(from_plans(&p, &[plan(1, 0, 3, 0, &[0])]).is_err());
        assert!(from_plans(&p, &[plan(1, 1, 0, 0, &[0])]).is_err());
        assert!(from_plans(&p, &[plan(1, 0, 0, 0, &[0]), plan(2, 0, 0, 5, &[0])]).is_err());
        assert!(from_plans(&p, &[plan(1, 0, 0, 0, &[7])]).is_err());
    }

    /// Merging a model's batches frees the GPU time a dropped request of
    /// another model needs.
    #[test]
    fn merging_batches_makes_room() {
        // Model 0 at 0, 1, 2 and 2 ms; model 1 at 0 ms (request 1).
        let p = tiny(&[(0, 0), (1, 0), (0, 1), (0, 2), (0, 2)], 1);
        // The run: model 0's requests one by one, [0, 3) to [9, 12); request
        // 1 dropped. Retimed, nothing fits request 1 (due 10) without a
        // batch of model 0 ending late.
        let plans = [
            plan(1, 0, 0, 0, &[0]),
            plan(2, 0, 0, 3, &[2]),
            plan(3, 0, 0, 6, &[3]),
            plan(4, 0, 0, 9, &[4]),
        ];
        let seed = from_plans(&p, &plans).unwrap();
        assert_eq!(p.verify(&seed), Ok(()));
        assert_eq!(seed.dropped, vec![1]);
        // Model 0 in one batch of 4 ([3, 9), due 10) leaves [0, 3) for it.
        let better = improve(&p, &seed);
        assert_eq!(p.verify(&better), Ok(()));
        assert!(better.dropped.is_empty());
        assert_eq!(better.batches.len(), 2);
    }
}
