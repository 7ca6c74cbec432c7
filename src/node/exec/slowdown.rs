//! Slowing a model down mid-run on the emulated executor
//! (`--emulated-slowdown MODEL=K@SECONDS`): from SECONDS after the backend
//! started, each batch of MODEL takes K times what its profile says. For
//! runs with real processes where a model becomes slower than its profile
//! (another tenant on the GPU, thermal throttling, a driver change): what
//! the scheduler's latency scaling is for
//! ([`crate::node::proto::latency_scale`]).
//!
//! Several rules may name one model: the one that started last is in force
//! (`m=1.5@2 m=1@8`: slower from 2 s, back to its profile from 8 s).

use std::time::{Duration, Instant};

/// The largest slowdown factor (and 1 over the smallest).
pub const MAX_FACTOR: f64 = 20.0;
/// The latest start of a slowdown (a day).
pub const MAX_AFTER_S: f64 = 86_400.0;

/// One rule: `model`'s batches take `factor` times their profile from `after`
/// on.
#[derive(Debug, Clone, PartialEq)]
pub struct Slowdown {
    pub model: String,
    pub factor: f64,
    pub after: Duration,
}

impl std::str::FromStr for Slowdown {
    type Err = String;
    fn from_str(s: &str) -> Result<Slowdown, String> {
        let bad = |why: &str| {
            format!(
                "--emulated-slowdown {s:?}: {why} (expected MODEL=K@SECONDS, e.g. resnet50=1.5@3)"
            )
        };
        let (model, rest) = s.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let (k, at) = rest.split_once('@').ok_or_else(|| bad("no `@`"))?;
        let model = model.trim();
        if model.is_empty() || model.chars().count() > 128 {
            return Err(bad("the model name must be 1 to 128 characters"));
        }
        let factor: f64 = k.trim().parse().map_err(|_| bad("K is not a number"))?;
        if !(factor.is_finite() && (1.0 / MAX_FACTOR..=MAX_FACTOR).contains(&factor)) {
            return Err(bad(&format!(
                "K must be between {} and {MAX_FACTOR}",
                1.0 / MAX_FACTOR
            )));
        }
        let after: f64 = at
            .trim()
            .parse()
            .map_err(|_| bad("SECONDS is not a number"))?;
        if !(after.is_finite() && (0.0..=MAX_AFTER_S).contains(&after)) {
            return Err(bad(&format!("SECONDS must be between 0 and {MAX_AFTER_S}")));
        }
        Ok(Slowdown {
            model: model.to_string(),
            factor,
            after: Duration::from_secs_f64(after),
        })
    }
}

/// The rules of one backend, timed from its start (`origin`).
#[derive(Debug, Clone)]
pub struct Slowdowns {
    rules: Vec<Slowdown>,
    origin: Instant,
}

impl Slowdowns {
    /// At most this many rules.
    pub const MAX_RULES: usize = 64;

    pub fn new(rules: Vec<Slowdown>, origin: Instant) -> Result<Slowdowns, String> {
        if rules.len() > Self::MAX_RULES {
            return Err(format!(
                "--emulated-slowdown: at most {} rules, got {}",
                Self::MAX_RULES,
                rules.len()
            ));
        }
        Ok(Slowdowns { rules, origin })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn rules(&self) -> &[Slowdown] {
        &self.rules
    }

    /// The factor in force for `model` at `now` (1: none).
    pub fn factor(&self, model: &str, now: Instant) -> f64 {
        factor_at(
            &self.rules,
            model,
            now.saturating_duration_since(self.origin),
        )
    }
}

/// The factor in force for `model` `elapsed` after the start: that of the
/// rule for it that started last (1: none started).
pub fn factor_at(rules: &[Slowdown], model: &str, elapsed: Duration) -> f64 {
    rules
        .iter()
        .filter(|r| r.model == model && r.after <= elapsed)
        .max_by_key(|r| r.after)
        .map_or(1.0, |r| r.factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_or_say_what_is_expected() {
        assert_eq!(
            "resnet50=1.5@3".parse::<Slowdown>(),
            Ok(Slowdown {
                model: "resnet50".into(),
                factor: 1.5,
                after: Duration::from_secs(3)
            })
        );
        assert_eq!(
            " m = 2 @ 0.25".parse::<Slowdown>().map(|s| s.after),
            Ok(Duration::from_millis(250))
        );
        for bad in [
            "",
            "m",
            "m=1.5",
            "=1.5@3",
            "m=x@3",
            "m=1.5@x",
            "m=0@3",
            "m=21@3",
            "m=NaN@3",
            "m=1.5@-1",
            "m=1.5@inf",
            "m=1.5@100000",
        ] {
            let e = bad.parse::<Slowdown>().unwrap_err();
            assert!(e.contains("MODEL=K@SECONDS"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_last_rule_started_is_in_force() {
        let r: Vec<Slowdown> = ["a=1.5@2", "a=1@8", "b=3@0"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let s = |v: f64| Duration::from_secs_f64(v);
        assert_eq!(factor_at(&r, "a", s(1.9)), 1.0);
        assert_eq!(factor_at(&r, "a", s(2.0)), 1.5);
        assert_eq!(factor_at(&r, "a", s(9.0)), 1.0);
        assert_eq!(factor_at(&r, "b", s(0.0)), 3.0);
        assert_eq!(factor_at(&r, "c", s(5.0)), 1.0);
        assert!(Slowdowns::new(vec![r[0].clone(); 65], Instant::now()).is_err());
    }
}
