//! Arrival processes: constant, Poisson and Gamma gaps, with piecewise-constant
//! per-model rate traces. One seeded generator per model, so adding a model does not
//! change the others' arrivals.

use crate::core::{Dur, Time};
use crate::workload::Arrival;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp1, Gamma};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Generates one model's arrival times.
pub struct ArrivalGen {
    rng: Xoshiro256PlusPlus,
    process: Arrival,
    gamma: Option<Gamma<f64>>,
    base_rate: f64,
    /// (from, multiplier), sorted; empty = constant multiplier 1.
    trace: Vec<(Dur, f64)>,
    seg: usize,
    next: Time,
}

impl ArrivalGen {
    /// `rate_rps` is this model's mean rate; `phase` randomizes a constant process's
    /// first arrival (false: the first request arrives at time 0).
    pub fn new(
        process: Arrival,
        rate_rps: f64,
        trace: Vec<(Dur, f64)>,
        seed: u64,
        phase: bool,
    ) -> ArrivalGen {
        let gamma = match process {
            Arrival::Gamma(k) => Some(Gamma::new(k, 1.0 / k).expect("shape > 0")),
            _ => None,
        };
        let mut g = ArrivalGen {
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            process,
            gamma,
            base_rate: rate_rps,
            trace,
            seg: 0,
            next: Time::ZERO,
        };
        g.next = match process {
            Arrival::Constant if !phase => Time::ZERO,
            _ => {
                // Start "in steady state": the first gap from time 0 (a random phase
                // of one gap for a constant process).
                let u: f64 = g.rng.gen();
                let first = if g.trace.is_empty() {
                    g.gap_at(Time::ZERO)
                } else {
                    g.traced_gap(Time::ZERO)
                };
                match first {
                    Some(gap) if process == Arrival::Constant => Time(((gap.0 as f64) * u) as i64),
                    Some(gap) => Time::ZERO + gap,
                    None => Time::NEVER,
                }
            }
        };
        g
    }

    fn multiplier_at(&mut self, t: Time) -> (f64, Option<Time>) {
        if self.trace.is_empty() {
            return (1.0, None);
        }
        while self.seg + 1 < self.trace.len() && Time::ZERO + self.trace[self.seg + 1].0 <= t {
            self.seg += 1;
        }
        let (from, m) = self.trace[self.seg];
        let m = if Time::ZERO + from > t { 1.0 } else { m };
        let next_change = self
            .trace
            .iter()
            .map(|(f, _)| Time::ZERO + *f)
            .find(|&f| f > t);
        (m, next_change)
    }

    /// A gap drawn at rate(t), or None when the rate is zero.
    fn gap_at(&mut self, t: Time) -> Option<Dur> {
        let (m, _) = self.multiplier_at(t);
        let rate = self.base_rate * m;
        if rate <= 0.0 {
            return None;
        }
        let mean_ns = 1e9 / rate;
        let x: f64 = match self.process {
            Arrival::Constant => 1.0,
            Arrival::Poisson => Exp1.sample(&mut self.rng),
            Arrival::Gamma(_) => self.gamma.as_ref().expect("gamma").sample(&mut self.rng),
        };
        Some(Dur(((x * mean_ns) as i64).max(1)))
    }

    /// Time of the next arrival (`Time::NEVER` if none).
    #[inline]
    pub fn peek(&self) -> Time {
        self.next
    }

    /// Consumes the next arrival and draws the one after.
    pub fn advance(&mut self) -> Time {
        let t = self.next;
        let gap = if self.trace.is_empty() {
            self.gap_at(t)
        } else {
            self.traced_gap(t)
        };
        self.next = match gap {
            Some(g) => t + g,
            None => Time::NEVER,
        };
        t
    }

    fn traced_gap(&mut self, t: Time) -> Option<Dur> {
        let mut from = t;
        // At most one restart per trace segment.
        for _ in 0..=self.trace.len() {
            let (_, change) = self.multiplier_at(from);
            match self.gap_at(from) {
                Some(g) => {
                    let cand = from + g;
                    match change {
                        Some(c) if cand >= c => from = c,
                        _ => return Some(cand - t),
                    }
                }
                None => match change {
                    Some(c) => from = c,
                    None => return None,
                },
            }
        }
        None
    }
}

/// One generator per model of `w` at aggregate rate `rate_rps`, each seeded from `seed`
/// and the model's index (so adding a model does not change the others' arrivals).
/// `trace` replaces every model's own rate trace when given.
pub fn model_gens(
    w: &crate::workload::Workload,
    process: Arrival,
    rate_rps: f64,
    seed: u64,
    trace: Option<&[(Dur, f64)]>,
) -> Vec<ArrivalGen> {
    let nm = w.models.len();
    w.models
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let s = seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add((i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03) + 1);
            let tr = trace.map_or_else(|| m.rate_trace.clone(), <[_]>::to_vec);
            ArrivalGen::new(process, rate_rps * m.share, tr, s, nm > 1)
        })
        .collect()
}

/// Every model's arrivals merged in time order, up to `horizon` (exclusive): the
/// simulator, the fake frontends and the load generator all draw from one.
pub struct MergedArrivals {
    gens: Vec<ArrivalGen>,
    next: crate::core::structs::IndexedHeap<Time>,
    horizon: Time,
}

impl MergedArrivals {
    pub fn new(gens: Vec<ArrivalGen>, horizon: Time) -> MergedArrivals {
        let mut next = crate::core::structs::IndexedHeap::new();
        for (i, g) in gens.iter().enumerate() {
            if g.peek() < horizon {
                next.set(i, g.peek());
            }
        }
        MergedArrivals {
            gens,
            next,
            horizon,
        }
    }

    /// The next arrival: (model, time); None when none is left before the horizon.
    #[inline]
    pub fn peek(&self) -> Option<(usize, Time)> {
        self.next.peek()
    }

    /// Takes the next arrival.
    #[inline]
    pub fn pop(&mut self) -> Option<(usize, Time)> {
        let (m, _) = self.next.peek()?;
        let g = &mut self.gens[m];
        let t = g.advance();
        if g.peek() < self.horizon {
            self.next.set(m, g.peek());
        } else {
            self.next.remove(m);
        }
        Some((m, t))
    }

    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_rate(g: &mut ArrivalGen, until: Time) -> f64 {
        let mut n = 0;
        while g.peek() < until {
            g.advance();
            n += 1;
        }
        n as f64 / until.as_secs_f64()
    }

    #[test]
    fn processes_hit_their_mean_rate() {
        for p in [Arrival::Constant, Arrival::Poisson, Arrival::Gamma(0.3)] {
            let mut g = ArrivalGen::new(p, 1000.0, vec![], 7, true);
            let r = mean_rate(&mut g, Time::from_secs_f64(100.0));
            assert!((r - 1000.0).abs() < 30.0, "{p:?}: {r}");
        }
    }

    #[test]
    fn constant_starts_at_zero_without_phase() {
        let mut g = ArrivalGen::new(Arrival::Constant, 4.0, vec![], 1, false);
        assert_eq!(g.advance(), Time::ZERO);
        assert_eq!(g.advance(), Time::from_secs_f64(0.25));
    }

    #[test]
    fn trace_changes_the_rate() {
        let trace = vec![
            (Dur::ZERO, 1.0),
            (Dur::from_secs_f64(10.0), 0.0),
            (Dur::from_secs_f64(20.0), 3.0),
        ];
        let mut g = ArrivalGen::new(Arrival::Poisson, 100.0, trace, 3, true);
        let mut counts = [0u32; 3];
        while g.peek() < Time::from_secs_f64(30.0) {
            let t = g.advance();
            counts[(t.as_secs_f64() / 10.0) as usize] += 1;
        }
        assert!((900..1100).contains(&counts[0]), "{counts:?}");
        assert_eq!(counts[1], 0, "{counts:?}");
        assert!((2700..3300).contains(&counts[2]), "{counts:?}");
    }
}
