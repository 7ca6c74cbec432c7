//! Latency profiles: how long a batch of `b` requests runs on one GPU.
//!
//! Either linear, l(b) = alpha * b + beta (the Symphony paper's model), or a table of
//! measured latencies per batch size, which must be non-decreasing in `b`.

use super::time::Dur;
use std::fmt;

/// Largest batch size any profile may declare (a bound on every batch, TIGER style).
pub const MAX_BATCH_LIMIT: u32 = 4096;

#[derive(Clone, PartialEq, Eq)]
pub enum LatencyProfile {
    /// l(b) = alpha * b + beta for 1 <= b <= max_batch.
    Linear {
        alpha: Dur,
        beta: Dur,
        max_batch: u32,
    },
    /// `lat[b - 1]` = l(b) for 1 <= b <= lat.len(); non-decreasing.
    Table { lat: Vec<Dur> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileError {
    Empty,
    NonPositive { batch: u32 },
    Decreasing { batch: u32 },
    TooLarge { max_batch: u32 },
    NegativeAlpha,
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileError::Empty => write!(f, "latency profile is empty (max batch must be >= 1)"),
            ProfileError::NonPositive { batch } => {
                write!(f, "latency for batch size {batch} must be > 0")
            }
            ProfileError::Decreasing { batch } => write!(
                f,
                "latency table must be non-decreasing, but l({batch}) < l({})",
                batch - 1
            ),
            ProfileError::TooLarge { max_batch } => {
                write!(
                    f,
                    "max batch {max_batch} exceeds the limit {MAX_BATCH_LIMIT}"
                )
            }
            ProfileError::NegativeAlpha => write!(f, "alpha must be >= 0"),
        }
    }
}
impl std::error::Error for ProfileError {}

impl fmt::Debug for LatencyProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LatencyProfile::Linear {
                alpha,
                beta,
                max_batch,
            } => write!(f, "l(b)={alpha:?}*b+{beta:?} (b<={max_batch})"),
            LatencyProfile::Table { lat } => write!(f, "table{lat:?}"),
        }
    }
}

impl LatencyProfile {
    pub fn linear(alpha: Dur, beta: Dur, max_batch: u32) -> Result<Self, ProfileError> {
        let p = LatencyProfile::Linear {
            alpha,
            beta,
            max_batch,
        };
        p.validate()?;
        Ok(p)
    }
    pub fn linear_ms(alpha_ms: f64, beta_ms: f64, max_batch: u32) -> Result<Self, ProfileError> {
        Self::linear(
            Dur::from_ms_f64(alpha_ms),
            Dur::from_ms_f64(beta_ms),
            max_batch,
        )
    }
    pub fn table(lat: Vec<Dur>) -> Result<Self, ProfileError> {
        let p = LatencyProfile::Table { lat };
        p.validate()?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<(), ProfileError> {
        let mb = self.max_batch();
        if mb == 0 {
            return Err(ProfileError::Empty);
        }
        if mb > MAX_BATCH_LIMIT {
            return Err(ProfileError::TooLarge { max_batch: mb });
        }
        match self {
            LatencyProfile::Linear { alpha, .. } => {
                if alpha.0 < 0 {
                    return Err(ProfileError::NegativeAlpha);
                }
                if self.latency(1).0 <= 0 {
                    return Err(ProfileError::NonPositive { batch: 1 });
                }
            }
            LatencyProfile::Table { lat } => {
                for (i, l) in lat.iter().enumerate() {
                    if l.0 <= 0 {
                        return Err(ProfileError::NonPositive {
                            batch: i as u32 + 1,
                        });
                    }
                    if i > 0 && *l < lat[i - 1] {
                        return Err(ProfileError::Decreasing {
                            batch: i as u32 + 1,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The largest batch size this profile allows.
    #[inline]
    pub fn max_batch(&self) -> u32 {
        match self {
            LatencyProfile::Linear { max_batch, .. } => *max_batch,
            LatencyProfile::Table { lat } => lat.len() as u32,
        }
    }

    /// l(b). `b` must be in 1..=max_batch (b = 0 gives 0; b above max is extrapolated
    /// linearly from the last two points so that frontrun l(max+1) is defined).
    #[inline]
    pub fn latency(&self, b: u32) -> Dur {
        match self {
            LatencyProfile::Linear { alpha, beta, .. } => {
                if b == 0 {
                    Dur::ZERO
                } else {
                    Dur(alpha.0 * b as i64 + beta.0)
                }
            }
            LatencyProfile::Table { lat } => {
                if b == 0 {
                    return Dur::ZERO;
                }
                let n = lat.len() as u32;
                if b <= n {
                    lat[(b - 1) as usize]
                } else {
                    let last = lat[(n - 1) as usize];
                    let step = if n >= 2 {
                        last - lat[(n - 2) as usize]
                    } else {
                        Dur::ZERO
                    };
                    Dur(last.0 + step.0 * (b - n) as i64)
                }
            }
        }
    }

    /// Largest b in 0..=cap with l(b) + per_item * b <= budget (0 if not even b = 1).
    /// `per_item` is the per-request data transfer delay (Appendix D's d_data).
    #[inline]
    pub fn max_batch_within(&self, budget: Dur, per_item: Dur, cap: u32) -> u32 {
        let cap = cap.min(self.max_batch());
        if cap == 0 {
            return 0;
        }
        match self {
            LatencyProfile::Linear { alpha, beta, .. } => {
                let rem = budget.0 - beta.0;
                if rem < 0 {
                    return 0;
                }
                let slope = alpha.0 + per_item.0;
                if slope <= 0 {
                    return cap;
                }
                let b = rem / slope;
                if b >= cap as i64 {
                    cap
                } else {
                    b as u32
                }
            }
            LatencyProfile::Table { .. } => largest_fitting(cap, |b| {
                self.latency(b).0 + per_item.0 * b as i64 <= budget.0
            }),
        }
    }

    /// This profile with every latency times `k` (rounded to the nanosecond,
    /// at least 1 ns per batch size): what a model that runs `k` times slower
    /// than profiled takes. `k` must be finite and > 0 (otherwise the profile
    /// is returned unchanged).
    pub fn scaled(&self, k: f64) -> LatencyProfile {
        if !(k.is_finite() && k > 0.0) {
            return self.clone();
        }
        let s = |d: Dur| Dur((d.0 as f64 * k).round() as i64);
        match self {
            LatencyProfile::Linear {
                alpha,
                beta,
                max_batch,
            } => {
                let (alpha, beta) = (s(*alpha), s(*beta));
                // l(1) stays > 0 whatever the rounding.
                let beta = if alpha.0 + beta.0 <= 0 { Dur(1) } else { beta };
                LatencyProfile::Linear {
                    alpha,
                    beta,
                    max_batch: *max_batch,
                }
            }
            LatencyProfile::Table { lat } => LatencyProfile::Table {
                lat: lat.iter().map(|&l| s(l).max(Dur(1))).collect(),
            },
        }
    }

    /// Peak throughput (requests per second) of one GPU running batch `b` back to back.
    pub fn throughput_rps(&self, b: u32) -> f64 {
        b as f64 / self.latency(b).as_secs_f64()
    }
}

/// The largest b in 1..=cap with `fits(b)`, for a `fits` that holds up to some
/// b and not beyond (0 when not even b = 1 fits), by bisection.
pub fn largest_fitting(cap: u32, fits: impl Fn(u32) -> bool) -> u32 {
    if cap == 0 || !fits(1) {
        return 0;
    }
    if fits(cap) {
        return cap;
    }
    // invariant: fits(lo), !fits(hi)
    let (mut lo, mut hi) = (1u32, cap);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_and_table_agree_on_max_batch() {
        let lin = LatencyProfile::linear_ms(1.053, 5.072, 64).unwrap();
        let tab = LatencyProfile::table((1..=64).map(|b| lin.latency(b)).collect()).unwrap();
        for budget_us in (0..80_000).step_by(137) {
            let budget = Dur::from_us(budget_us);
            for per in [Dur::ZERO, Dur::from_us(20)] {
                for cap in [1, 7, 64] {
                    assert_eq!(
                        lin.max_batch_within(budget, per, cap),
                        tab.max_batch_within(budget, per, cap),
                        "budget {budget:?} per {per:?} cap {cap}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_scaled_profile_is_k_times_as_long_and_stays_valid() {
        let lin = LatencyProfile::linear_ms(1.0, 5.0, 16).unwrap();
        let tab = LatencyProfile::table((1..=16).map(|b| lin.latency(b)).collect()).unwrap();
        for p in [&lin, &tab] {
            let s = p.scaled(1.5);
            s.validate().unwrap();
            assert_eq!(s.max_batch(), 16);
            for b in 1..=16 {
                assert_eq!(s.latency(b).0, (p.latency(b).0 as f64 * 1.5).round() as i64);
            }
            assert_eq!(&p.scaled(f64::NAN), p);
            assert_eq!(&p.scaled(0.0), p);
            assert!(p.scaled(1e-12).validate().is_ok());
        }
    }

    #[test]
    fn table_must_be_non_decreasing() {
        let e = LatencyProfile::table(vec![Dur::from_ms(2), Dur::from_ms(1)]).unwrap_err();
        assert_eq!(e, ProfileError::Decreasing { batch: 2 });
        assert!(LatencyProfile::table(vec![]).is_err());
        assert!(LatencyProfile::linear_ms(1.0, 1.0, 0).is_err());
        assert!(LatencyProfile::linear_ms(-1.0, 1.0, 4).is_err());
    }

    #[test]
    fn table_extrapolates_past_max() {
        let t = LatencyProfile::table(vec![Dur::from_ms(2), Dur::from_ms(3)]).unwrap();
        assert_eq!(t.latency(3), Dur::from_ms(4));
    }
}
