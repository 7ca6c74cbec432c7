//! The offline reference: a schedule of one model's arrivals made with the whole
//! trace known in advance (`fermata bench oracle`).
//!
//! An online policy decides a batch without knowing when the next requests come;
//! this search sees every arrival of the run before it decides anything, so what
//! it reaches tells how much of a policy's loss is the future's fault. It is a
//! beam search over the trace in arrival order: at each request it either drops
//! it or starts a batch of it and the next `b - 1` requests on the earliest-free
//! GPU, as soon as the last of them has arrived (plus the network's delay), if
//! the batch ends by its head's deadline (less the response margin). Batches are
//! runs of consecutive requests, as with every deferred policy of one model (one
//! SLO: arrival order is deadline order).
//!
//! States that reached the same request are ranked by their drops, each priced
//! at `price` GPU-time, plus the GPU time already committed past that request's
//! arrival; the best `beam` distinct ones go on (many paths reach the same
//! drops and GPU free times: copies are removed, as they would crowd the beam
//! with one state). A drop frees GPU time, so the price is what a
//! request is worth in GPU time: a few multiples of the least GPU time a request
//! can cost (l(b)/b at the largest batch the SLO allows) are tried and the best
//! schedule is kept. The result is a feasible schedule, so its bad rate is one a
//! clairvoyant scheduler can reach; a better search could do better still. It is
//! no bound on what online policies can reach, only a reference for them.
//!
//! Written here rather than taken from a solver crate: the state (GPU free
//! times) and the pruning are specific to this problem, and the search runs
//! over a hundred thousand requests at a time.

use crate::core::Time;
use crate::sim::{ModelResult, RunOptions, RunResult};
use crate::workload::Workload;
use anyhow::{bail, Result};

/// The most GPUs the search handles (its states keep every GPU's free time).
pub const MAX_GPUS: usize = 16;
/// The widest beam accepted.
pub const MAX_BEAM: usize = 4096;
/// Bound on the search's memory: requests x beam kept states (8 bytes each, for
/// each of the [`PRICES`] searched at once: 1.6 GB at the bound).
const MAX_STATES: u64 = 50_000_000;
/// A slot of states waiting for their request is cut back to the beam when it
/// holds this many beams (memory stays bounded by the beam whatever the
/// largest batch).
const SLOT_STATES: usize = 8;
/// Multiples of the least GPU time per request tried as the price of a drop.
pub const PRICES: [f64; 4] = [1.1, 1.2, 1.3, 1.4];

/// One schedule found.
#[derive(Debug, Clone)]
pub struct OracleRun {
    /// The run's results over the measured window, as the simulator reports them
    /// (`policy` is the base options', unused).
    pub result: RunResult,
    /// The drop price that gave this schedule (ms of GPU time).
    pub price_ms: f64,
}

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

/// The model's timings in nanoseconds.
struct Timing {
    /// `lat[b]`: l(b).
    lat: Vec<i64>,
    /// `delay[b]`: the network's delay before a batch of b can start.
    delay: Vec<i64>,
    slo: i64,
    resp: i64,
    gpus: usize,
}

impl Timing {
    fn new(w: &Workload) -> Result<Timing> {
        if w.models.len() != 1 {
            bail!(
                "the offline reference schedules one model; workload {} has {}",
                w.name,
                w.models.len()
            );
        }
        let gpus = w.gpus as usize;
        if gpus == 0 || gpus > MAX_GPUS {
            bail!(
                "the offline reference handles 1 to {MAX_GPUS} GPUs; workload {} has {gpus}",
                w.name
            );
        }
        let spec = &w.models[0].spec;
        let bmax = spec.profile.max_batch().min(u16::MAX as u32);
        let lat = (0..=bmax)
            .map(|b| spec.profile.latency(b.max(1)).0)
            .collect();
        let delay = (0..=bmax).map(|b| w.net.delay(b).0).collect();
        Ok(Timing {
            lat,
            delay,
            slo: spec.slo.0,
            resp: w.net.resp.0,
            gpus,
        })
    }

    fn max_batch(&self) -> usize {
        self.lat.len() - 1
    }

    /// The least GPU time a request can cost: l(b)/b at the largest batch that
    /// fits the SLO (the smallest batch's if none does).
    fn least_per_request(&self) -> f64 {
        (1..=self.max_batch())
            .filter(|&b| self.delay[b] + self.lat[b] + self.resp <= self.slo)
            .map(|b| self.lat[b] as f64 / b as f64)
            .fold(self.lat[1] as f64, f64::min)
    }
}

/// The arrivals of the run (the simulator's generator, seed and horizon).
fn arrivals(w: &Workload, o: &RunOptions) -> Vec<i64> {
    let end = Time::ZERO + o.warmup + o.duration;
    let mut a = crate::arrivals::MergedArrivals::new(
        crate::arrivals::model_gens(w, o.arrival, o.rate_rps, o.seed, None),
        end,
    );
    let mut out = Vec::new();
    while let Some((_, t)) = a.pop() {
        out.push(t.0);
    }
    out
}

/// The beam search at one price: the decisions of the best schedule (0 = drop,
/// else a batch size), one per decision, in order.
fn search(t: &Timing, arr: &[i64], beam: usize, price: f64) -> Vec<u16> {
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
    let g = t.gpus;
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
            let due = now + t.slo - t.resp;
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

/// Replays decisions on numbered GPUs (the earliest free, the lowest id on a tie)
/// and reports the measured window as the simulator does. Panics if a batch would
/// end after its head's deadline: the search only makes feasible ones.
fn replay(t: &Timing, w: &Workload, o: &RunOptions, arr: &[i64], plan: &[u16]) -> RunResult {
    let win_start = (Time::ZERO + o.warmup).0;
    let win_end = win_start + o.duration.0;
    let mut m = ModelResult::new(&w.models[0].spec.name);
    m.batch_requests = vec![0; t.max_batch() + 1];
    let mut free = vec![i64::MIN / 4; t.gpus];
    let mut busy = vec![0i64; t.gpus];
    let in_window = |a: i64| a >= win_start && a < win_end;
    let mut i = 0;
    for &b in plan {
        if b == 0 {
            if in_window(arr[i]) {
                m.offered += 1;
                m.dropped += 1;
            }
            i += 1;
            continue;
        }
        let b = b as usize;
        let gpu = (0..t.gpus)
            .min_by_key(|&k| (free[k], k))
            .expect("at least one GPU");
        let start = (arr[i + b - 1] + t.delay[b]).max(free[gpu]);
        let end = start + t.lat[b];
        assert!(
            end + t.resp <= arr[i] + t.slo,
            "the search made a late batch"
        );
        free[gpu] = end;
        busy[gpu] += (end.min(win_end) - start.max(win_start)).max(0);
        for &a in &arr[i..i + b] {
            if in_window(a) {
                m.offered += 1;
                m.good += 1;
                m.batch_requests[b] += 1;
                let _ = m.queuing_us.record(((start - a) / 1_000).max(1) as u64);
            }
        }
        i += b;
    }
    assert_eq!(i, arr.len(), "the plan covers every request once");
    RunResult {
        policy: o.policy,
        rate_rps: o.rate_rps,
        models: vec![m],
        gpu_busy: busy
            .iter()
            .map(|&x| x as f64 / o.duration.0.max(1) as f64)
            .collect(),
        sim_requests: arr.len() as u64,
        wall_secs: 0.0,
        plans: Vec::new(),
        preemptions: 0,
        window: o.duration,
    }
}

/// Whether the search can take workload `w` with `beam` (one model, at most
/// [`MAX_GPUS`] GPUs, a beam of 1 to [`MAX_BEAM`]); the run's own length is
/// checked when it starts.
pub fn check(w: &Workload, beam: usize) -> Result<()> {
    check_beam(beam)?;
    Timing::new(w).map(|_| ())
}

fn check_beam(beam: usize) -> Result<()> {
    if !(1..=MAX_BEAM).contains(&beam) {
        bail!("the beam must be 1 to {MAX_BEAM} states, got {beam}");
    }
    Ok(())
}

/// The best schedule the search finds for the run `o` of the one-model workload
/// `w` (its rate, arrivals, seed, warm-up and window), trying each of [`PRICES`]
/// on its own thread. Execution times are the profile's, exactly (any
/// `exec_jitter` of the workload is not modelled).
pub fn oracle(w: &Workload, o: &RunOptions, beam: usize) -> Result<OracleRun> {
    check_beam(beam)?;
    let t = Timing::new(w)?;
    let wall = std::time::Instant::now();
    let arr = arrivals(w, o);
    if arr.len() as u64 * beam as u64 > MAX_STATES {
        bail!(
            "{} requests with a beam of {beam} would keep more than {MAX_STATES} states; \
             shorten the run or narrow the beam",
            arr.len()
        );
    }
    let unit = t.least_per_request();
    let runs: Vec<(f64, RunResult)> = std::thread::scope(|s| {
        let handles: Vec<_> = PRICES
            .iter()
            .map(|&k| {
                let (t, arr) = (&t, &arr);
                s.spawn(move || {
                    let plan = search(t, arr, beam, k * unit);
                    (k * unit, replay(t, w, o, arr, &plan))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("the search does not panic"))
            .collect()
    });
    let (price, mut result) = runs
        .into_iter()
        .min_by(|a, b| a.1.bad_rate().total_cmp(&b.1.bad_rate()))
        .expect("PRICES is not empty");
    result.wall_secs = wall.elapsed().as_secs_f64();
    Ok(OracleRun {
        result,
        price_ms: price / 1e6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(gpus: u32) -> Workload {
        Workload::from_toml(
            &format!(
                r#"
name = "t"
gpus = {gpus}
arrival = "poisson"
rate_rps = 1000
warmup_s = 1
duration_s = 4
[[models]]
name = "m"
alpha_ms = 1.0
beta_ms = 5.0
slo_ms = 25
"#
            ),
            None,
        )
        .unwrap()
    }

    /// Well below capacity nothing is dropped, batches stay small, and every
    /// batch ends by its head's deadline (the replay asserts it).
    #[test]
    fn light_load_drops_nothing() {
        let w = workload(2);
        let mut o = RunOptions::from_workload(&w);
        o.rate_rps = 200.0;
        let r = oracle(&w, &o, 16).unwrap().result;
        assert!(r.models[0].offered > 600);
        assert_eq!(r.models[0].dropped, 0);
        assert_eq!(r.models[0].good, r.models[0].offered);
    }

    /// Past capacity the drops are at least what no schedule can serve: 2 GPUs
    /// serve at most 2 b / l(b) requests per second at the largest batch the
    /// 25 ms SLO allows (b = 20: 1,600 r/s), so at 3,200 r/s half must go.
    #[test]
    fn overload_drops_what_cannot_be_served() {
        let w = workload(2);
        let mut o = RunOptions::from_workload(&w);
        o.rate_rps = 3200.0;
        let run = oracle(&w, &o, 16).unwrap();
        let m = &run.result.models[0];
        let served = m.good as f64 / o.duration.as_secs_f64();
        assert!(served <= 1600.0 * 1.02, "served {served} r/s");
        // And it serves most of what it can: the GPUs stay busy.
        assert!(served >= 1300.0, "served {served} r/s");
        assert!(run.result.gpu_busy_fraction() > 0.9);
    }

    /// The search sees the future, so on one trace it drops no more than the
    /// deferred policy does near capacity (where deferred drops some).
    #[test]
    fn it_is_a_reference_for_deferred() {
        let w = workload(4);
        let mut o = RunOptions::from_workload(&w);
        o.rate_rps = 2700.0;
        let deferred = crate::sim::simulate(&w, &o);
        assert!(
            deferred.bad_rate() > 0.0,
            "deferred drops some at this rate"
        );
        let r = oracle(&w, &o, 32).unwrap().result;
        assert!(
            r.bad_rate() <= deferred.bad_rate(),
            "oracle {} against deferred {}",
            r.bad_rate(),
            deferred.bad_rate()
        );
    }

    #[test]
    fn clear_errors() {
        let w = workload(2);
        let o = RunOptions::from_workload(&w);
        assert!(oracle(&w, &o, 0).unwrap_err().to_string().contains("beam"));
        let w17 = workload(17);
        assert!(oracle(&w17, &o, 8)
            .unwrap_err()
            .to_string()
            .contains("1 to 16 GPUs"));
    }
}
