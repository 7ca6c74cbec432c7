//! What pulling a batch's inputs costs: a pure estimator of the time a backend
//! takes to read a whole batch's inputs from the frontends' regions.
//!
//! A batch's pull is modelled as a fixed part plus a per-byte part,
//! `fixed + per_mib × bytes / MiB`, fitted to the batches a backend actually
//! pulled (their total bytes and how long the whole pull took) by quantile
//! regression at [`PULL_QUANTILE`]: the line is the one that leaves about 1% of
//! the recorded batches above it. The fixed part takes what a batch pays
//! whatever its size (a stalled thread, a lock, a page-table walk of a fresh
//! buffer, a round trip), so a rare stall costs a batch once, not once per
//! input; the per-byte part takes the copy or the link. A budget built as a
//! per-input quantile times the batch size would charge a batch of 64 its
//! slowest input 64 times.
//!
//! Each backend keeps one estimator (one transport: in-process, TCP or RDMA);
//! the scheduler takes the largest fixed part and the largest per-byte part
//! over its backends.
//!
//! A late pull feeds back twice: it is a sample like any other (the next fit
//! sees it), and the estimator counts the batches whose pull took longer than
//! the budget it predicted for them. While more than [`OVERRUN_TARGET`] of the
//! recent batches overran, the budget gets a headroom factor (×1.1 a step, up
//! to [`HEADROOM_MAX`]; each step needs a fresh half-window of batches) that
//! falls back to 1 once they no longer do.
//!
//! Before the first batches, a backend probes a new frontend with a few reads
//! of one input ([`PullEstimator::probe`]). Probes give a provisional fit at
//! their median: they run while the process is starting (models loading,
//! buffers first touched, a connection opened), so their slowest read says
//! what starting costs, not what a pull costs, and a p99 of eight reads is
//! their maximum. Once [`MIN_SAMPLES`] batches were pulled, probes no longer
//! count: the fit comes from measured pulls alone.
//!
//! No clock and no I/O: the driver passes the measurements in.

use super::time::Dur;
use std::collections::VecDeque;

/// The quantile of a batch's pull time the budget holds. (p99.5 was tried:
/// read off 512 batches it is the third largest, so two stalls in a window
/// made it a stall, and the budget of small batches rose past twice their
/// p99.)
pub const PULL_QUANTILE: f64 = 0.99;

/// The quantile of a batch's pull time that its GPU's puller is held for
/// ([`PullEstimator::hold`]). A backend pulls one batch at a time per GPU, so
/// when pulls take longer than the batches run, the puller sets the pace: the
/// scheduler keeps a GPU's next batch at least this long after the one before
/// it starts. Under the mean, the scheduler plans a little more than the
/// puller carries, so the puller never idles, and the puller skips what it
/// cannot serve in time ([`crate::node::proto::backend::hopeless`]). In the
/// cluster simulator with pulls that outlast batches, p25 served 0.95–0.98
/// of the pullers' rate past it, against 0.89–0.95 at p75 (above the mean);
/// with no hold, four GPUs offered 0.8 of their pullers' rate served 86% of
/// it (a GPU whose batch had ended looked free while its puller was busy).
pub const HOLD_QUANTILE: f64 = 0.25;

/// The share of recent batches that may overrun their predicted budget before
/// the estimator adds headroom.
pub const OVERRUN_TARGET: f64 = 0.01;

/// Largest headroom factor the feedback applies.
pub const HEADROOM_MAX: f64 = 1.5;

/// Fewest samples for a fit (fewer: no estimate yet).
pub const MIN_SAMPLES: usize = 8;

/// Batches whose overrun share drives the headroom.
const OVERRUN_WINDOW: usize = 256;

/// Most probe reads kept.
const PROBES_MAX: usize = 32;

/// The fit is recomputed every this many samples (and when asked).
const REFIT_EVERY: usize = 16;

/// Fewest batches of one size class whose own quantile the fit must cover
/// (enough that the class's p99 is not its largest pull, a stall).
const CLASS_MIN: usize = 300;

const MIB: f64 = (1u64 << 20) as f64;

/// A fitted pull cost: `fixed + per_mib × bytes / MiB`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullFit {
    /// What every batch pays, at the fitted quantile.
    pub fixed: Dur,
    /// What a mebibyte of input adds.
    pub per_mib: Dur,
}

impl PullFit {
    /// The pull budget of a batch of `bytes` input bytes.
    pub fn budget(&self, bytes: u64) -> Dur {
        Dur(self.fixed.0 + (self.per_mib.0 as f64 * bytes as f64 / MIB).round() as i64)
    }

    /// The per-request part for requests of `input_bytes` each.
    pub fn per_request(&self, input_bytes: u64) -> Dur {
        Dur((self.per_mib.0 as f64 * input_bytes as f64 / MIB).ceil() as i64)
    }

    /// The larger of two fits, part by part (what a scheduler with several
    /// backends budgets).
    pub fn max(self, o: PullFit) -> PullFit {
        PullFit {
            fixed: self.fixed.max(o.fixed),
            per_mib: self.per_mib.max(o.per_mib),
        }
    }

    pub fn is_zero(&self) -> bool {
        self.fixed == Dur::ZERO && self.per_mib == Dur::ZERO
    }
}

/// The estimator: recent batches' (bytes, pull time), the current fit, and the
/// overrun feedback.
#[derive(Debug, Clone)]
pub struct PullEstimator {
    cap: usize,
    samples: VecDeque<(u64, i64)>,
    /// Probe reads (one input each), used only until [`MIN_SAMPLES`]
    /// batches were measured.
    probes: VecDeque<(u64, i64)>,
    since_fit: usize,
    fit: Option<PullFit>,
    /// The fit at [`HOLD_QUANTILE`] (no headroom).
    hold: Option<PullFit>,
    /// Recent batches: did each overrun the budget predicted for it?
    recent: VecDeque<bool>,
    headroom: f64,
    batches: u64,
    overruns: u64,
}

impl PullEstimator {
    /// An estimator over the last `cap` batches.
    pub fn new(cap: usize) -> PullEstimator {
        PullEstimator {
            cap: cap.max(MIN_SAMPLES),
            samples: VecDeque::new(),
            probes: VecDeque::new(),
            since_fit: 0,
            fit: None,
            hold: None,
            recent: VecDeque::new(),
            headroom: 1.0,
            batches: 0,
            overruns: 0,
        }
    }

    /// A batch of `bytes` input bytes took `took` to pull. Returns whether it
    /// overran the budget predicted for it (false while there is no fit).
    pub fn observe(&mut self, bytes: u64, took: Dur) -> bool {
        let over = match self.budget(bytes) {
            Some(b) => took > b,
            None => false,
        };
        if self.fit.is_some() {
            self.batches += 1;
            self.overruns += over as u64;
            self.recent.push_back(over);
            if self.recent.len() > OVERRUN_WINDOW {
                self.recent.pop_front();
            }
        }
        self.samples.push_back((bytes, took.0.max(0)));
        if self.samples.len() > self.cap {
            self.samples.pop_front();
        }
        self.since_fit += 1;
        if self.samples.len() <= MIN_SAMPLES || self.since_fit >= REFIT_EVERY {
            self.refit();
        }
        over
    }

    /// A probe read of `bytes` bytes took `took`: a provisional fit (at the
    /// probes' median) while fewer than [`MIN_SAMPLES`] batches were measured.
    pub fn probe(&mut self, bytes: u64, took: Dur) {
        self.probes.push_back((bytes, took.0.max(0)));
        if self.probes.len() > PROBES_MAX {
            self.probes.pop_front();
        }
        if self.samples.len() < MIN_SAMPLES {
            self.refit();
        }
    }

    /// Recomputes the fit from the samples (and the headroom from the recent
    /// overruns).
    pub fn refit(&mut self) {
        self.since_fit = 0;
        // Each step needs fresh evidence: the window starts over after one.
        if self.recent.len() >= OVERRUN_WINDOW / 2 {
            let share =
                self.recent.iter().filter(|&&o| o).count() as f64 / self.recent.len() as f64;
            if share > OVERRUN_TARGET {
                self.headroom = (self.headroom * 1.1).min(HEADROOM_MAX);
                self.recent.clear();
            } else if share < OVERRUN_TARGET / 2.0 && self.headroom > 1.0 {
                self.headroom = (self.headroom / 1.05).max(1.0);
                self.recent.clear();
            }
        }
        let measured = fit_quantile(&self.samples, PULL_QUANTILE);
        let probed = || fit_quantile(&self.probes, 0.5);
        let Some(f) = measured.or_else(probed) else {
            self.fit = None;
            self.hold = None;
            return;
        };
        self.hold = match measured {
            Some(f) => Some(hold_under(&self.samples, f, HOLD_QUANTILE)),
            None => probed(),
        };
        let h = self.headroom;
        self.fit = Some(PullFit {
            fixed: Dur((f.fixed.0 as f64 * h).round() as i64),
            per_mib: Dur((f.per_mib.0 as f64 * h).round() as i64),
        });
    }

    /// The current fit (None until [`MIN_SAMPLES`] batches or probes were
    /// seen).
    pub fn fit(&self) -> Option<PullFit> {
        self.fit
    }

    /// What a batch's pull holds its GPU's puller: the quantile regression at
    /// [`HOLD_QUANTILE`], each part at most the budget's (None while
    /// [`PullEstimator::fit`] is None).
    pub fn hold(&self) -> Option<PullFit> {
        self.hold
    }

    /// The predicted budget of a batch of `bytes` bytes.
    pub fn budget(&self, bytes: u64) -> Option<Dur> {
        self.fit.map(|f| f.budget(bytes))
    }

    /// The headroom factor the feedback applies now (1: none).
    pub fn headroom(&self) -> f64 {
        self.headroom
    }

    /// Batches observed with a fit in place, and those that overran it.
    pub fn overruns(&self) -> (u64, u64) {
        (self.batches, self.overruns)
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// The `q`-quantile of `v` (sorted in place; nearest rank).
fn quantile(v: &mut [i64], q: f64) -> i64 {
    v.sort_unstable();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The largest `q`-quantile of `t - rate × bytes` within a size class (bytes
/// within a factor of two) of at least [`CLASS_MIN`] batches (`i64::MIN`:
/// no such class).
fn class_quantile(samples: &VecDeque<(u64, i64)>, rate: f64, q: f64) -> i64 {
    let mut classes: std::collections::BTreeMap<u32, Vec<i64>> = Default::default();
    for &(b, t) in samples {
        classes
            .entry(64 - b.max(1).leading_zeros())
            .or_default()
            .push(t - (rate * b as f64).round() as i64);
    }
    classes
        .values_mut()
        .filter(|r| r.len() >= CLASS_MIN)
        .map(|r| quantile(r, q))
        .max()
        .unwrap_or(i64::MIN)
}

/// The line of least pinball loss at the lower quantile `q` (not raised per
/// size class as the budget's is: the hold is a pace, not a bound), each
/// part kept at or under `f`'s, so that it lies under the budget at every
/// size.
fn hold_under(samples: &VecDeque<(u64, i64)>, f: PullFit, q: f64) -> PullFit {
    let Some((rate, fixed)) = pinball_line(samples, q) else {
        return f;
    };
    PullFit {
        fixed: Dur(fixed).min(f.fixed),
        per_mib: Dur((rate * MIB).ceil() as i64).min(f.per_mib),
    }
}

/// Quantile regression of time on bytes at `q`: the line of least pinball
/// loss ([`pinball_line`]); then `fixed` is raised to cover the `q`-quantile
/// of every size class with [`CLASS_MIN`] batches, and, with too few samples
/// to read the quantile, to an extension of their tail. None with fewer than
/// [`MIN_SAMPLES`] samples.
pub fn fit_quantile(samples: &VecDeque<(u64, i64)>, q: f64) -> Option<PullFit> {
    let (rate, mut fixed) = pinball_line(samples, q)?;
    let n = samples.len();
    // By input size: the line covers the quantile within each size class
    // (bytes within a factor of two) that has enough batches, not only over
    // all of them (a pull's spread grows with its size).
    fixed = fixed.max(class_quantile(samples, rate, q));
    // Too few samples to read the quantile (n < 1 / (1 - q): the nearest
    // rank is the largest, which the next batch exceeds with chance
    // 1 / (n + 1), 11% with 8 samples): the tail above the median is taken
    // as exponential and extended from what the samples show, to
    // `med + (max - med) × ln(0.5 / (1 - q)) / ln(n / 2)` (the largest of n
    // such samples lies ln(n / 2) scales above the median).
    if (n as f64) < 1.0 / (1.0 - q) && n > 2 {
        let mut resid: Vec<i64> = samples
            .iter()
            .map(|&(b, t)| t - (rate * b as f64).round() as i64)
            .collect();
        let med = quantile(&mut resid, 0.5);
        let max = *resid.last().expect("n > 2");
        let k = (0.5 / (1.0 - q)).ln() / (n as f64 / 2.0).ln();
        if k > 1.0 && max > med {
            fixed = fixed.max(med + ((max - med) as f64 * k).round() as i64);
        }
    }
    Some(PullFit {
        fixed: Dur(fixed),
        per_mib: Dur((rate * MIB).ceil() as i64),
    })
}

/// The line `fixed + rate × bytes` (rate in ns a byte, fixed in ns) of least
/// pinball loss at `q`: among candidate slopes around the medians' slope,
/// with `fixed` the `q`-quantile of `t - rate × bytes` (never below zero).
/// None with fewer than [`MIN_SAMPLES`] samples.
fn pinball_line(samples: &VecDeque<(u64, i64)>, q: f64) -> Option<(f64, i64)> {
    let n = samples.len();
    if n < MIN_SAMPLES {
        return None;
    }
    // The median per-byte cost bounds the slope (a non-negative fixed part
    // means t/B >= rate for every batch).
    let mut ratio: Vec<f64> = samples
        .iter()
        .filter(|s| s.0 > 0)
        .map(|&(b, t)| t as f64 / b as f64)
        .collect();
    ratio.sort_by(|a, b| a.total_cmp(b));
    let ratio_med = ratio.get(ratio.len() / 2).copied().unwrap_or(0.0);
    // The medians' slope: the upper and lower halves by bytes.
    let mut by_bytes: Vec<(u64, i64)> = samples.iter().copied().collect();
    by_bytes.sort_unstable();
    let (lo, hi) = by_bytes.split_at(n / 2);
    let med = |h: &[(u64, i64)]| {
        let mut b: Vec<i64> = h.iter().map(|s| s.0 as i64).collect();
        let mut t: Vec<i64> = h.iter().map(|s| s.1).collect();
        (quantile(&mut b, 0.5) as f64, quantile(&mut t, 0.5) as f64)
    };
    let ((b_lo, t_lo), (b_hi, t_hi)) = (med(lo), med(hi));
    let slope = if b_hi >= 1.5 * b_lo.max(1.0) {
        ((t_hi - t_lo) / (b_hi - b_lo)).clamp(0.0, ratio_med)
    } else {
        ratio_med
    };
    let loss_of = |rate: f64| {
        let mut resid: Vec<i64> = samples
            .iter()
            .map(|&(b, t)| t - (rate * b as f64).round() as i64)
            .collect();
        let fixed = quantile(&mut resid, q).max(0);
        let loss: f64 = resid
            .iter()
            .map(|&r| {
                let e = (r - fixed) as f64;
                if e > 0.0 {
                    q * e
                } else {
                    (q - 1.0) * e
                }
            })
            .sum();
        (loss, fixed)
    };
    // Slopes near the medians' one: a line through the p99 of the largest
    // batches alone (slope 0) would charge the smallest batch the largest's
    // pull.
    let mut best: Option<(f64, f64, i64)> = None;
    for k in [1.0, 0.9, 1.1, 0.75, 1.25, 1.5, 2.0, 3.0] {
        let rate = slope * k;
        let (loss, fixed) = loss_of(rate);
        if best.is_none_or(|(l, _, _)| loss < l * (1.0 - 1e-9)) {
            best = Some((loss, rate, fixed));
        }
    }
    let (_, rate, fixed) = best.expect("candidates");
    Some((rate, fixed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    const INPUT: u64 = 602_112;

    /// One input's pull, as measured on an H100 host: 35-55 us at the median,
    /// a tail to 10x the median.
    fn one_input(rng: &mut Xoshiro256PlusPlus) -> i64 {
        let u: f64 = rng.gen();
        let us = if u < 0.95 {
            rng.gen_range(35.0..55.0)
        } else if u < 0.99 {
            rng.gen_range(100.0..170.0)
        } else {
            rng.gen_range(300.0..450.0)
        };
        (us * 1e3) as i64
    }

    fn batch(rng: &mut Xoshiro256PlusPlus, b: u32) -> i64 {
        (0..b).map(|_| one_input(rng)).sum::<i64>() + 20_000
    }

    fn p(v: &mut [i64], q: f64) -> i64 {
        quantile(v, q)
    }

    /// An estimator fed 2,000 batches of every size, mostly of 64 (as under
    /// load).
    fn fed_mostly_large(rng: &mut Xoshiro256PlusPlus) -> PullEstimator {
        let mut est = PullEstimator::new(512);
        for i in 0..2000u32 {
            let b = if i % 4 == 0 {
                rng.gen_range(1..=64)
            } else {
                64
            };
            est.observe(b as u64 * INPUT, Dur(batch(rng, b)));
        }
        est.refit();
        est
    }

    #[test]
    fn a_batch_of_64_large_inputs_is_budgeted_near_its_p99_not_64_times_the_max() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        // The per-input times: the maximum is about 10x the median.
        let mut per: Vec<i64> = (0..100_000).map(|_| one_input(&mut rng)).collect();
        let (med, max) = (p(&mut per, 0.5), *per.iter().max().unwrap());
        assert!(max as f64 >= 8.0 * med as f64, "max {max} median {med}");
        let est = fed_mostly_large(&mut rng);
        let got = est.budget(64 * INPUT).unwrap().0;
        let mut b64: Vec<i64> = (0..20_000).map(|_| batch(&mut rng, 64)).collect();
        let p99 = p(&mut b64, 0.99);
        let old = 64 * max;
        assert!(
            got as f64 >= 0.97 * p99 as f64 && (got as f64) <= 1.3 * p99 as f64,
            "budget {got} ns against the batch's p99 {p99} ns"
        );
        assert!(got * 5 < old, "budget {got} ns, 64 x max {old} ns");
        let covered = b64.iter().filter(|&&t| t <= got).count() as f64 / b64.len() as f64;
        // Out of sample, from one window of 512 batches (the cluster
        // simulator checks the 99% over whole runs, with the feedback).
        assert!(covered >= 0.975, "covers {covered}");
        // Smaller batches are budgeted for their size, not the largest.
        let got8 = est.budget(8 * INPUT).unwrap().0;
        let mut b8: Vec<i64> = (0..20_000).map(|_| batch(&mut rng, 8)).collect();
        let p99_8 = p(&mut b8, 0.99);
        assert!(got8 < got / 3, "b=8 budget {got8} vs b=64 {got}");
        assert!(
            got8 as f64 <= 2.0 * p99_8 as f64,
            "b=8 {got8} vs p99 {p99_8}"
        );
    }

    /// The hold lies near a batch's mean pull, for large batches and small
    /// ones (one line for every size, fitted mostly on large batches, takes
    /// small ones a little above their mean): above its p10, at most a tenth
    /// above its mean, and under its budget.
    #[test]
    fn the_hold_lies_near_the_mean_pull_under_the_budget() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        assert_eq!(PullEstimator::new(512).hold(), None);
        let est = fed_mostly_large(&mut rng);
        let hold = est.hold().expect("a hold once the budget is fitted");
        for b in [8u64, 64] {
            let mut v: Vec<i64> = (0..20_000).map(|_| batch(&mut rng, b as u32)).collect();
            let mean = v.iter().sum::<i64>() as f64 / v.len() as f64;
            let p10 = p(&mut v, 0.10);
            let (h, budget) = (hold.budget(b * INPUT).0, est.budget(b * INPUT).unwrap().0);
            assert!(
                h >= p10 && h as f64 <= 1.1 * mean && h < budget,
                "b={b}: hold {h} ns, p10 {p10} ns, mean {mean:.0} ns, budget {budget} ns"
            );
        }
    }

    #[test]
    fn few_samples_extend_their_tail_rather_than_stop_at_their_largest() {
        // Fits from 8 to 99 batches of 32 inputs, each judged on fresh
        // batches: the nearest-rank p99 of fewer than 100 samples is their
        // largest, which the next batch exceeds with chance 1 / (n + 1).
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        let mut fresh: Vec<i64> = (0..20_000).map(|_| batch(&mut rng, 32)).collect();
        let p99 = p(&mut fresh, 0.99);
        let (mut over, mut judged, mut worst) = (0usize, 0usize, 0i64);
        for trial in 0..200 {
            let n = MIN_SAMPLES + trial % (100 - MIN_SAMPLES);
            let samples: VecDeque<(u64, i64)> =
                (0..n).map(|_| (32 * INPUT, batch(&mut rng, 32))).collect();
            let f = fit_quantile(&samples, PULL_QUANTILE).unwrap();
            let got = f.budget(32 * INPUT).0;
            worst = worst.max(got);
            for _ in 0..100 {
                over += (batch(&mut rng, 32) > got) as usize;
                judged += 1;
            }
        }
        let share = over as f64 / judged as f64;
        assert!(share <= 0.015, "{share} of fresh batches over the budget");
        assert!(worst <= 2 * p99, "budget up to {worst} ns, p99 {p99} ns");
        // From 100 samples on, the quantile is read off as it is (the 99th
        // of 100); below, the tail is extended past the largest.
        let fixed = |n: i64| {
            let s: VecDeque<(u64, i64)> = (0..n).map(|i| (0, 1_000 + i)).collect();
            fit_quantile(&s, PULL_QUANTILE).unwrap().fixed
        };
        assert_eq!(fixed(100), Dur(1_098));
        assert!(
            fixed(50) > Dur(1_049) && fixed(20) > Dur(1_019),
            "{:?}",
            fixed(20)
        );
    }

    #[test]
    fn rare_stalls_are_paid_once_per_batch_and_frequent_ones_are_budgeted() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        let pull = |rng: &mut Xoshiro256PlusPlus, b: u32, stall_p: f64| {
            let base = 30_000 + b as i64 * 40_000 + rng.gen_range(0..20_000);
            if rng.gen::<f64>() < stall_p {
                base + 4_000_000
            } else {
                base
            }
        };
        // Stalls in 0.3% of batches: the p99 is the stall-free tail.
        let mut est = PullEstimator::new(1024);
        for _ in 0..3000 {
            let b = rng.gen_range(1..=64);
            est.observe(b as u64 * INPUT, Dur(pull(&mut rng, b, 0.003)));
        }
        let got = est.budget(64 * INPUT).unwrap().0;
        assert!(got < 3_500_000, "stall-free budget {got}");
        // Stalls in 5% of batches: every budget holds one.
        let mut est = PullEstimator::new(1024);
        for _ in 0..3000 {
            let b = rng.gen_range(1..=64);
            est.observe(b as u64 * INPUT, Dur(pull(&mut rng, b, 0.05)));
        }
        let got = est.budget(INPUT).unwrap().0;
        assert!(got > 3_500_000, "stalls budgeted: {got}");
        assert!(got < 2 * 4_100_000, "at most twice the p99: {got}");
    }

    #[test]
    fn overruns_are_counted_and_add_headroom_until_they_stop() {
        let mut est = PullEstimator::new(256);
        for _ in 0..300 {
            est.observe(INPUT, Dur(100_000));
        }
        assert_eq!(est.headroom(), 1.0);
        let before = est.budget(INPUT).unwrap();
        assert_eq!(before, Dur(100_000));
        // Pulls get slower: overruns are counted, the budget follows.
        let mut over = 0;
        for _ in 0..300 {
            over += est.observe(INPUT, Dur(150_000)) as u32;
        }
        assert!(over > 0);
        assert_eq!(est.overruns().1, over as u64);
        assert!(est.budget(INPUT).unwrap() >= Dur(150_000));
        // Back to steady: the headroom returns to 1.
        for _ in 0..3000 {
            est.observe(INPUT, Dur(150_000));
        }
        assert_eq!(est.headroom(), 1.0);
        assert_eq!(est.budget(INPUT).unwrap(), Dur(150_000));
    }

    #[test]
    fn no_fit_before_enough_samples_and_a_fit_reads_in_parts() {
        let mut est = PullEstimator::new(64);
        for _ in 0..MIN_SAMPLES - 1 {
            assert!(!est.observe(1000, Dur(5)));
        }
        assert!(est.fit().is_none());
        est.observe(1000, Dur(5));
        assert!(est.fit().is_some());
        let f = PullFit {
            fixed: Dur(1000),
            per_mib: Dur(2000),
        };
        assert_eq!(f.budget(1 << 20), Dur(3000));
        assert_eq!(f.per_request(1 << 19), Dur(1000));
        let g = PullFit {
            fixed: Dur(10),
            per_mib: Dur(5000),
        };
        assert_eq!(
            f.max(g),
            PullFit {
                fixed: Dur(1000),
                per_mib: Dur(5000)
            }
        );
    }

    #[test]
    fn stalled_probes_give_way_to_measured_pulls() {
        // Eight probes of a small input while the process starts: three
        // stalled for 10 ms, the others 20 us.
        let mut est = PullEstimator::new(512);
        for i in 0..8 {
            let took = if i % 3 == 0 { 10_000_000 } else { 20_000 };
            est.probe(3_136, Dur(took));
        }
        // The provisional fit is the probes' median, not their slowest read.
        let first = est.budget(3_136).expect("a fit from the probes");
        assert!(first <= Dur(40_000), "probe budget {first:?}");
        // Measured batches of 8 inputs: 10 us each. After MIN_SAMPLES of
        // them the probes no longer count.
        for _ in 0..MIN_SAMPLES {
            est.observe(8 * 3_136, Dur(10_000));
        }
        let f = est.fit().unwrap();
        assert!(f.fixed <= Dur(10_000), "fixed {f:?}");
        assert!(est.budget(8 * 3_136).unwrap() <= Dur(20_000));
        // A measured stall is what pulls cost: it counts (p99 of few
        // batches is their maximum), and a fresh estimator without probes
        // has no fit at all.
        est.observe(8 * 3_136, Dur(3_000_000));
        est.refit();
        assert!(est.budget(8 * 3_136).unwrap() >= Dur(3_000_000));
        assert!(PullEstimator::new(64).fit().is_none());
    }
}
