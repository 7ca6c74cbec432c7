//! The core's own time types: integer nanoseconds.
//!
//! The scheduling core never reads a clock. Every input carries `now: Time`; the
//! simulator passes virtual time, the real-time runtime converts the OS clock at the
//! edge. `Time` is an instant (nanoseconds since an arbitrary epoch of the run),
//! `Dur` a signed span. Both are plain `i64` so that `deadline - l(b)` never wraps.
//!
//! Their arithmetic **saturates** at the ends of `i64`: times come from the wire
//! too, and no value a peer sends may overflow a node's arithmetic (a panic in a
//! debug build, a deadline wrapped into the past in release). Saturating add and
//! subtract cost one compare-and-move more than the plain ones.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Mul, Sub, SubAssign};

/// An instant in nanoseconds since the run's epoch.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Time(pub i64);

/// A signed span of time in nanoseconds.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Dur(pub i64);

impl Time {
    pub const ZERO: Time = Time(0);
    /// Later than any real instant (a GPU that is never free, a timer that is unset).
    pub const NEVER: Time = Time(i64::MAX / 4);
    /// Earlier than any real instant (a GPU that has always been free).
    pub const EPOCH_MIN: Time = Time(i64::MIN / 4);

    pub fn from_secs_f64(s: f64) -> Time {
        Time((s * 1e9).round() as i64)
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    pub fn as_ms_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
    pub fn ns(self) -> i64 {
        self.0
    }
}

impl Dur {
    pub const ZERO: Dur = Dur(0);
    pub fn from_ns(ns: i64) -> Dur {
        Dur(ns)
    }
    pub fn from_us(us: i64) -> Dur {
        Dur(us * 1_000)
    }
    pub fn from_ms(ms: i64) -> Dur {
        Dur(ms * 1_000_000)
    }
    /// A standard duration (saturating at `i64::MAX` nanoseconds).
    pub fn from_std(d: std::time::Duration) -> Dur {
        Dur(d.as_nanos().min(i64::MAX as u128) as i64)
    }
    pub fn from_ms_f64(ms: f64) -> Dur {
        Dur((ms * 1e6).round() as i64)
    }
    pub fn from_us_f64(us: f64) -> Dur {
        Dur((us * 1e3).round() as i64)
    }
    pub fn from_secs_f64(s: f64) -> Dur {
        Dur((s * 1e9).round() as i64)
    }
    pub fn as_ms_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
    pub fn as_us_f64(self) -> f64 {
        self.0 as f64 / 1e3
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    pub fn ns(self) -> i64 {
        self.0
    }
}

impl Add<Dur> for Time {
    type Output = Time;
    #[inline]
    fn add(self, d: Dur) -> Time {
        Time(self.0.saturating_add(d.0))
    }
}
impl AddAssign<Dur> for Time {
    #[inline]
    fn add_assign(&mut self, d: Dur) {
        self.0 = self.0.saturating_add(d.0);
    }
}
impl Sub<Dur> for Time {
    type Output = Time;
    #[inline]
    fn sub(self, d: Dur) -> Time {
        Time(self.0.saturating_sub(d.0))
    }
}
impl SubAssign<Dur> for Time {
    #[inline]
    fn sub_assign(&mut self, d: Dur) {
        self.0 = self.0.saturating_sub(d.0);
    }
}
impl Sub<Time> for Time {
    type Output = Dur;
    #[inline]
    fn sub(self, t: Time) -> Dur {
        Dur(self.0.saturating_sub(t.0))
    }
}
impl Add for Dur {
    type Output = Dur;
    #[inline]
    fn add(self, d: Dur) -> Dur {
        Dur(self.0.saturating_add(d.0))
    }
}
impl AddAssign for Dur {
    #[inline]
    fn add_assign(&mut self, d: Dur) {
        self.0 = self.0.saturating_add(d.0);
    }
}
impl Sub for Dur {
    type Output = Dur;
    #[inline]
    fn sub(self, d: Dur) -> Dur {
        Dur(self.0.saturating_sub(d.0))
    }
}
impl Mul<i64> for Dur {
    type Output = Dur;
    #[inline]
    fn mul(self, k: i64) -> Dur {
        Dur(self.0.saturating_mul(k))
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={:.6}ms", self.as_ms_f64())
    }
}
impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}ms", self.as_ms_f64())
    }
}
impl fmt::Debug for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}ms", self.as_ms_f64())
    }
}
impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}ms", self.as_ms_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        assert_eq!(Time(i64::MAX - 5) + Dur(10), Time(i64::MAX));
        assert_eq!(Time(i64::MIN + 5) - Dur(10), Time(i64::MIN));
        assert_eq!(Time(i64::MAX) - Time(i64::MIN), Dur(i64::MAX));
        assert_eq!(Time(i64::MIN) - Time(i64::MAX), Dur(i64::MIN));
        assert_eq!(Dur(i64::MAX) + Dur(1), Dur(i64::MAX));
        assert_eq!(Dur(i64::MIN) - Dur(1), Dur(i64::MIN));
        assert_eq!(Dur(i64::MAX / 2) * 3, Dur(i64::MAX));
        let mut t = Time(i64::MAX);
        t += Dur(1);
        assert_eq!(t, Time(i64::MAX));
        t -= Dur(i64::MAX);
        assert_eq!(t, Time(0));
        let mut d = Dur(i64::MAX);
        d += Dur(7);
        assert_eq!(d, Dur(i64::MAX));
        // Ordinary values are unchanged.
        assert_eq!(Time(10) + Dur(5) - Dur(3), Time(12));
        assert_eq!(Time(10) - Time(15), Dur(-5));
    }
}
