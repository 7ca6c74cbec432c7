//! The offline reference: a schedule of a run's arrivals made with the whole
//! trace known in advance (`fermata bench oracle`).
//!
//! An online policy decides a batch without knowing when the next requests come;
//! this search sees every arrival of the run, of every model, before it decides
//! anything, so what it reaches tells how much of a policy's loss is the
//! future's fault. Three searches run and the best schedule is kept:
//!
//! - a beam search over the arrivals in time order ([`search`]): each request
//!   joins its model's open batch, closes it, opens a new one, runs alone or
//!   is dropped;
//! - with one model, a beam search over batches of consecutive requests
//!   ([`runs`]);
//! - the online policy's own schedule on the same arrivals, improved by a local
//!   search that places its dropped requests ([`seeded`]): never worse than
//!   the policy, for every model, so the reference is at least as good as the
//!   policy by construction, on any number of models and GPUs.
//!
//! In every schedule a batch starts on a GPU once its last request has arrived
//! (plus the network's delay) and must end by its head's deadline (less the
//! response margin), the simulator's rule for a request served in time.
//!
//! In the beam searches a drop frees GPU time, so its price in the ranking of
//! states is what a request is worth in GPU time: a few multiples of the least GPU time a
//! request of its model can cost (l(b)/b at the largest batch the SLO allows)
//! are tried and the best schedule is kept (fewest requests of the worst model
//! bad, then fewest bad). Every schedule is checked before it is reported
//! ([`Problem::verify`]: every request once, every batch in time, no two at
//! once on a GPU), so its bad rate is one a clairvoyant scheduler reaches; a
//! better search could do better still. It is no bound on what online policies
//! can reach, only a reference for them.
//!
//! Written here rather than taken from a solver crate: the state (open batches
//! and GPU free times), the pruning and the local search's moves are specific
//! to this problem, and the searches run over a hundred thousand requests at
//! a time.

mod runs;
mod schedule;
mod search;
mod seeded;

pub use schedule::{Batch, Infeasible, ModelTiming, Problem, Schedule};
pub use search::{MAX_GPUS, MAX_MODELS};

use crate::core::Policy;
use crate::core::Time;
use crate::sim::{ModelResult, RunOptions, RunResult};
use crate::workload::Workload;
use anyhow::{bail, Result};

/// The widest beam accepted.
pub const MAX_BEAM: usize = 4096;
/// Bound on the search's memory: requests x beam kept states (8 bytes each, for
/// each of the [`PRICES`] searched at once: 1.6 GB at the bound).
const MAX_STATES: u64 = 50_000_000;
/// The online policies whose schedules seed the local search, beside the one
/// the reference is set against.
pub const SEED_POLICIES: [Policy; 3] = [Policy::Deferred, Policy::Symphony, Policy::Eager];
/// Multiples of the least GPU time per request tried as the price of a drop.
pub const PRICES: [f64; 4] = [1.1, 1.2, 1.3, 1.4];

/// One schedule found.
#[derive(Debug, Clone)]
pub struct OracleRun {
    /// The run's results over the measured window, as the simulator reports them
    /// (`policy` is the base options', unused).
    pub result: RunResult,
    /// The drop price that gave this schedule (a multiple of each model's least
    /// GPU time per request; 0 for the seeded search, which prices nothing).
    pub price: f64,
    /// The search that found it.
    pub search: Search,
    /// The schedule itself (checked feasible).
    pub schedule: Schedule,
}

/// The searches the reference runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Search {
    /// Over every model's arrivals, each model's open batch in the state
    /// (any workload).
    OpenBatches,
    /// Batches of consecutive requests, ranked once whole (one model only).
    ConsecutiveRuns,
    /// An online policy's own schedule on the same arrivals, improved by a
    /// local search (any workload; never worse than that policy).
    Seeded(Policy),
}

impl Search {
    pub fn name(self) -> String {
        match self {
            Search::OpenBatches => "open batches".into(),
            Search::ConsecutiveRuns => "consecutive runs".into(),
            Search::Seeded(p) => format!("{}'s schedule improved", p.name()),
        }
    }
}

/// The models' timings of workload `w` (one model at least, one GPU at
/// least).
fn timings(w: &Workload) -> Result<Vec<ModelTiming>> {
    if w.models.is_empty() || w.gpus == 0 {
        bail!("workload {} has no model or no GPU", w.name);
    }
    Ok(w.models
        .iter()
        .map(|m| {
            let spec = &m.spec;
            let bmax = spec.profile.max_batch().min(u16::MAX as u32);
            ModelTiming {
                lat: (0..=bmax)
                    .map(|b| spec.profile.latency(b.max(1)).0)
                    .collect(),
                delay: (0..=bmax).map(|b| w.net.delay(b).0).collect(),
                slo: spec.slo.0,
                resp: w.net.resp.0,
            }
        })
        .collect())
}

/// Checks that the beam searches take workload `w` (1 to [`MAX_MODELS`]
/// models, 1 to [`MAX_GPUS`] GPUs).
fn beam_limits(w: &Workload) -> Result<()> {
    let nm = w.models.len();
    if nm == 0 || nm > MAX_MODELS {
        bail!(
            "the offline reference's beam searches schedule 1 to {MAX_MODELS} models; workload {} has {nm} \
             (--seeded-only takes any number)",
            w.name
        );
    }
    let gpus = w.gpus as usize;
    if gpus == 0 || gpus > MAX_GPUS {
        bail!(
            "the offline reference's beam searches handle 1 to {MAX_GPUS} GPUs; workload {} has {gpus} \
             (--seeded-only takes any number)",
            w.name
        );
    }
    Ok(())
}

/// The problem of the run `o` of workload `w`: the simulator's arrivals (its
/// generator, seed and horizon) and the models' timings.
pub fn problem(w: &Workload, o: &RunOptions) -> Result<Problem> {
    let models = timings(w)?;
    let end = Time::ZERO + o.warmup + o.duration;
    let mut a = crate::arrivals::MergedArrivals::new(
        crate::arrivals::model_gens(w, o.arrival, o.rate_rps, o.seed, None),
        end,
    );
    let mut arr = Vec::new();
    while let Some((m, t)) = a.pop() {
        arr.push((m as u16, t.0));
    }
    Ok(Problem {
        models,
        gpus: w.gpus as usize,
        arr,
    })
}

/// The run's results over the measured window of `o`, as the simulator reports
/// them, from a feasible schedule.
fn report(w: &Workload, o: &RunOptions, p: &Problem, s: &Schedule) -> RunResult {
    let win_start = (Time::ZERO + o.warmup).0;
    let win_end = win_start + o.duration.0;
    let in_window = |a: i64| a >= win_start && a < win_end;
    let mut models: Vec<ModelResult> = w
        .models
        .iter()
        .zip(&p.models)
        .map(|(m, t)| {
            let mut r = ModelResult::new(&m.spec.name);
            r.batch_requests = vec![0; t.max_batch() + 1];
            r
        })
        .collect();
    for &r in &s.dropped {
        let (m, a) = p.arr[r as usize];
        if in_window(a) {
            let m = &mut models[m as usize];
            m.offered += 1;
            m.dropped += 1;
        }
    }
    let mut busy = vec![0i64; p.gpus];
    for b in &s.batches {
        let end = p.end(b);
        busy[b.gpu as usize] += (end.min(win_end) - b.start.max(win_start)).max(0);
        let m = &mut models[b.model as usize];
        for &r in &b.reqs {
            let a = p.arr[r as usize].1;
            if in_window(a) {
                m.offered += 1;
                m.good += 1;
                m.batch_requests[b.reqs.len()] += 1;
                let _ = m.queuing_us.record(((b.start - a) / 1_000).max(1) as u64);
            }
        }
    }
    RunResult {
        policy: o.policy,
        rate_rps: o.rate_rps,
        models,
        gpu_busy: busy
            .iter()
            .map(|&x| x as f64 / o.duration.0.max(1) as f64)
            .collect(),
        sim_requests: p.arr.len() as u64,
        wall_secs: 0.0,
        plans: Vec::new(),
        preemptions: 0,
        window: o.duration,
    }
}

/// Whether the reference can take workload `w` with `beam` (1 to
/// [`MAX_BEAM`]): the beam searches take 1 to [`MAX_MODELS`] models and at
/// most [`MAX_GPUS`] GPUs, the seeded search alone (`seeded_only`) any
/// number; the run's own length is checked when it starts.
pub fn check(w: &Workload, beam: usize, seeded_only: bool) -> Result<()> {
    timings(w)?;
    if seeded_only {
        return Ok(());
    }
    check_beam(beam)?;
    beam_limits(w)
}

fn check_beam(beam: usize) -> Result<()> {
    if !(1..=MAX_BEAM).contains(&beam) {
        bail!("the beam must be 1 to {MAX_BEAM} states, got {beam}");
    }
    Ok(())
}

/// The best schedule search `how` finds for problem `p` at the drop price
/// `price` (checked feasible: a failed check is a fault of the search). The
/// seeded search needs the online run: see [`seeded_schedules`].
pub fn schedule(p: &Problem, how: Search, beam: usize, price: f64) -> Result<Schedule> {
    let s = match how {
        Search::OpenBatches => search::replay(p, &search::search(p, beam, price)),
        Search::ConsecutiveRuns => {
            if p.models.len() != 1 {
                bail!("the consecutive-runs search schedules one model");
            }
            runs::replay(p, &runs::search(p, beam, price))
        }
        Search::Seeded(_) => bail!("the seeded search starts from the online run's plans"),
    };
    if let Err(e) = p.verify(&s) {
        bail!("the offline reference made an infeasible schedule: {e}");
    }
    Ok(s)
}

/// The online policy's schedule of problem `p` (the run `o` of workload `w`,
/// its policy's plans in the simulator) and that schedule improved by the
/// local search, both checked feasible: (seed, improved).
pub fn seeded_schedules(w: &Workload, o: &RunOptions, p: &Problem) -> Result<(Schedule, Schedule)> {
    let mut oo = o.clone();
    oo.record_plans = true;
    let run = crate::sim::simulate(w, &oo);
    let seed = seeded::from_plans(p, &run.plans)
        .map_err(|e| anyhow::anyhow!("the online run's plans do not fit its arrivals: {e}"))?;
    if let Err(e) = p.verify(&seed) {
        bail!("the online run's schedule, retimed, is infeasible: {e}");
    }
    let better = seeded::improve(p, &seed);
    if let Err(e) = p.verify(&better) {
        bail!("the seeded search made an infeasible schedule: {e}");
    }
    Ok((seed, better))
}

/// The best schedule the reference finds for the run `o` of workload `w`
/// (its rate, arrivals, seed, warm-up and window): each of [`PRICES`] with
/// each beam search that takes the workload, and the seeded search from the
/// schedule of the online policy `o.policy` and of each of
/// [`SEED_POLICIES`], each on its own thread, keeping the best (the fewest
/// bad of the worst model, then of all). Since the seeded search is never
/// worse than its policy, neither is the reference. Execution times are the profile's, exactly (any `exec_jitter`
/// of the workload is not modelled: the seed is then the online run's batches
/// retimed on exact times, and no longer bound to be as good as the run).
pub fn oracle(w: &Workload, o: &RunOptions, beam: usize) -> Result<OracleRun> {
    oracle_with(w, o, beam, false)
}

/// [`oracle`], or with `seeded_only` the seeded searches alone (any number of
/// models and GPUs; `beam` unused).
pub fn oracle_with(
    w: &Workload,
    o: &RunOptions,
    beam: usize,
    seeded_only: bool,
) -> Result<OracleRun> {
    check(w, beam, seeded_only)?;
    let wall = std::time::Instant::now();
    let p = problem(w, o)?;
    let mut hows = Vec::new();
    if !seeded_only {
        if p.arr.len() as u64 * beam as u64 > MAX_STATES {
            bail!(
                "{} requests with a beam of {beam} would keep more than {MAX_STATES} states; \
                 shorten the run or narrow the beam",
                p.arr.len()
            );
        }
        hows.push(Search::OpenBatches);
        if p.models.len() == 1 {
            hows.push(Search::ConsecutiveRuns);
        }
    }
    let runs: Vec<Result<(f64, Search, Schedule, RunResult)>> = std::thread::scope(|s| {
        let mut handles: Vec<_> = hows
            .iter()
            .flat_map(|&how| PRICES.iter().map(move |&k| (how, k)))
            .map(|(how, k)| {
                let p = &p;
                s.spawn(move || {
                    let sched = schedule(p, how, beam, k)?;
                    let r = report(w, o, p, &sched);
                    Ok((k, how, sched, r))
                })
            })
            .collect();
        let mut seeds = vec![o.policy];
        for q in SEED_POLICIES {
            if !seeds.iter().any(|x| x.name() == q.name()) {
                seeds.push(q);
            }
        }
        for policy in seeds {
            let p = &p;
            handles.push(s.spawn(move || {
                let mut oo = o.clone();
                oo.policy = policy;
                let sched = seeded_schedules(w, &oo, p)?.1;
                let r = report(w, o, p, &sched);
                Ok((0.0, Search::Seeded(policy), sched, r))
            }));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("the search does not panic"))
            .collect()
    });
    let mut best: Option<(f64, Search, Schedule, RunResult)> = None;
    for r in runs {
        let r = r?;
        let rank = |x: &RunResult| (x.max_model_bad_rate(), x.bad_rate());
        if best
            .as_ref()
            .is_none_or(|b| rank(&r.3).partial_cmp(&rank(&b.3)) == Some(std::cmp::Ordering::Less))
        {
            best = Some(r);
        }
    }
    let (price, search, schedule, mut result) = best.expect("the seeded search always runs");
    result.wall_secs = wall.elapsed().as_secs_f64();
    Ok(OracleRun {
        result,
        price,
        search,
        schedule,
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

    /// A tiny random problem: `n` arrivals of two models within 5 ms, on
    /// `gpus` GPUs, l(b) = 2 + b ms up to b = 4, SLO 10 ms.
    fn tiny(seed: u64, n: usize, gpus: usize) -> Problem {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        let mut arr: Vec<(u16, i64)> = (0..n)
            .map(|_| ((next() % 2) as u16, (next() % 6) as i64))
            .collect();
        arr.sort_by_key(|a| a.1);
        super::schedule::tests::tiny(&arr, gpus)
    }

    /// On tiny problems the search with a beam wide enough to keep every state
    /// drops what the exhaustive search over every schedule drops (any batches,
    /// any order, any GPUs), and never fewer; its schedules check feasible.
    #[test]
    fn the_search_matches_brute_force_on_tiny_problems() {
        let mut hard = 0;
        for seed in 0..60 {
            let p = tiny(seed, 7, 1 + (seed % 3 == 0) as usize);
            let opt = p.brute_force_min_drops();
            hard += (opt > 0) as u32;
            let best = PRICES
                .iter()
                .map(|&k| {
                    schedule(&p, Search::OpenBatches, MAX_BEAM, k)
                        .unwrap()
                        .dropped
                        .len() as u32
                })
                .min()
                .unwrap();
            assert_eq!(best, opt, "seed {seed}: {:?}", p.arr);
        }
        assert!(hard >= 10, "only {hard} problems need a drop");
    }

    /// On one model both searches make feasible schedules (each is checked),
    /// and the reference reports the best of every search and price.
    #[test]
    fn one_model_keeps_the_better_search() {
        let w = workload(4);
        let mut o = RunOptions::from_workload(&w);
        o.rate_rps = 2700.0;
        let p = problem(&w, &o).unwrap();
        let bad = |how| {
            PRICES
                .iter()
                .map(|&k| report(&w, &o, &p, &schedule(&p, how, 16, k).unwrap()).bad_rate())
                .fold(f64::INFINITY, f64::min)
        };
        let (open, runs) = (bad(Search::OpenBatches), bad(Search::ConsecutiveRuns));
        let run = oracle(&w, &o, 16).unwrap();
        assert_eq!(run.result.bad_rate(), open.min(runs));
        assert_eq!(p.verify(&run.schedule), Ok(()));
    }

    /// Several models share the GPUs: below capacity nothing is dropped, on
    /// the same arrivals as the simulator's, every model's requests in batches
    /// of that model only (the check); the search of consecutive runs, which
    /// takes one model, is not tried.
    #[test]
    fn several_models_share_the_gpus() {
        let w = Workload::from_toml(
            r#"
name = "t2"
gpus = 3
arrival = "poisson"
rate_rps = 1000
warmup_s = 1
duration_s = 3
[[models]]
name = "a"
alpha_ms = 1.0
beta_ms = 5.0
slo_ms = 25
[[models]]
name = "b"
alpha_ms = 2.0
beta_ms = 4.0
slo_ms = 40
"#,
            None,
        )
        .unwrap();
        let mut o = RunOptions::from_workload(&w);
        o.rate_rps = 600.0;
        let deferred = crate::sim::simulate(&w, &o);
        let run = oracle(&w, &o, 32).unwrap();
        assert_eq!(run.search, Search::OpenBatches);
        assert_eq!(run.result.models.len(), 2);
        for (a, b) in run.result.models.iter().zip(&deferred.models) {
            assert_eq!(a.offered, b.offered, "the same arrivals");
            assert!(a.offered > 300);
            assert_eq!(a.dropped, 0);
            assert_eq!(a.good, a.offered);
        }
        let p = problem(&w, &o).unwrap();
        assert_eq!(p.verify(&run.schedule), Ok(()));
        assert!(schedule(&p, Search::ConsecutiveRuns, 8, 1.2).is_err());
    }

    /// Three models of different SLOs on 3 GPUs, bursty, past capacity.
    fn bursty_three() -> Workload {
        Workload::from_toml(
            r#"
name = "t3"
gpus = 3
arrival = "gamma:0.1"
rate_rps = 1500
warmup_s = 1
duration_s = 3
[[models]]
name = "a"
alpha_ms = 1.0
beta_ms = 5.0
slo_ms = 25
[[models]]
name = "b"
alpha_ms = 2.0
beta_ms = 4.0
slo_ms = 40
[[models]]
name = "c"
alpha_ms = 0.5
beta_ms = 6.0
slo_ms = 30
"#,
            None,
        )
        .unwrap()
    }

    /// The seeded search on several models: the online run's schedule and its
    /// improvement both pass the check (every request once, in time, no two
    /// batches at once on a GPU), the seed serves in time every request the
    /// run did, model by model, the improvement no fewer than the seed, and
    /// the reference no fewer bad than the policy, at several rates and seeds.
    #[test]
    fn the_seeded_search_is_valid_and_never_worse_than_the_policy() {
        let w = bursty_three();
        let mut improved_some = false;
        for (rate, seed) in [(900.0, 1), (1500.0, 2), (2200.0, 3)] {
            let mut o = RunOptions::from_workload(&w);
            o.rate_rps = rate;
            o.seed = seed;
            let p = problem(&w, &o).unwrap();
            let (seed_s, better) = seeded_schedules(&w, &o, &p).unwrap();
            assert_eq!(p.verify(&seed_s), Ok(()));
            assert_eq!(p.verify(&better), Ok(()));
            let policy = crate::sim::simulate(&w, &o);
            let (rs, rb) = (report(&w, &o, &p, &seed_s), report(&w, &o, &p, &better));
            for ((s, b), d) in rs.models.iter().zip(&rb.models).zip(&policy.models) {
                assert_eq!((s.offered, b.offered), (d.offered, d.offered));
                assert!(
                    s.good >= d.good,
                    "{rate}: seed {} policy {}",
                    s.good,
                    d.good
                );
                assert!(
                    b.good >= s.good,
                    "{rate}: improved {} seed {}",
                    b.good,
                    s.good
                );
                improved_some |= b.good > d.good;
            }
            let run = oracle_with(&w, &o, 8, false).unwrap();
            assert!(run.result.max_model_bad_rate() <= policy.max_model_bad_rate());
            assert_eq!(p.verify(&run.schedule), Ok(()));
            let only = oracle_with(&w, &o, 8, true).unwrap();
            assert!(matches!(only.search, Search::Seeded(_)));
            let r_only = &only.result;
            assert!(r_only.max_model_bad_rate() <= rb.max_model_bad_rate());
        }
        assert!(
            improved_some,
            "the search serves some request the policy did not"
        );
    }

    /// The goodput search of the reference never ends below the policy's:
    /// both probe the same rates until the reference passes one the policy
    /// fails.
    #[test]
    fn the_reference_goodput_is_never_below_the_policy() {
        let w = bursty_three();
        let o = RunOptions::from_workload(&w);
        let so = crate::bench::SearchOptions {
            rel_tolerance: 0.01,
            max_trials: 12,
        };
        let g = crate::bench::goodput_search_with(&w, &o, &so, |oo| {
            Ok(oracle_with(&w, oo, 8, true)?.result)
        })
        .unwrap();
        let p = crate::bench::goodput_search(&w, &o, &so);
        assert!(p.goodput_rps > 0.0);
        assert!(
            g.goodput_rps >= p.goodput_rps,
            "oracle {} policy {}",
            g.goodput_rps,
            p.goodput_rps
        );
    }

    /// The seeded search alone takes workloads past the beam searches' limits.
    #[test]
    fn seeded_only_takes_any_cluster() {
        let w = workload(20);
        let mut o = RunOptions::from_workload(&w);
        o.rate_rps = 2000.0;
        o.duration = crate::core::Dur::from_secs_f64(1.0);
        assert!(check(&w, 8, false).is_err());
        check(&w, 8, true).unwrap();
        let run = oracle_with(&w, &o, 8, true).unwrap();
        assert_eq!(run.result.models[0].dropped, 0);
        assert_eq!(run.result.gpu_busy.len(), 20);
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
