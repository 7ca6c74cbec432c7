//! Scheduling policies that run on the same core, and batch-gathering rules.

use super::time::Dur;
use std::fmt;
use std::str::FromStr;

/// When a candidate batch may start, and how candidates are matched to GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// Fermata's deferred batching: Symphony's frontrun moment, but a batch waits
    /// for it only while waiting pays: when running the batch now instead would
    /// cost more than a small part of the model's spare GPU time
    /// ([`DispatcherConfig::eager_cost_max`](super::DispatcherConfig::eager_cost_max)).
    /// Light load gets eager latency, heavy load deferred batching.
    Deferred,
    /// The paper's pure rule: exec = max(earliest, d - l(|B| + 1)) (the frontrun
    /// moment) for every batch that can still grow, whatever the load. Kept so the
    /// Section 3.3 trace and the paper's comparisons stay reproducible.
    Symphony,
    /// exec = earliest: dispatch whenever a GPU is free.
    Eager,
    /// Section 3.4: exec = max(earliest, a + k) with k = `frac` * SLO, a = the head's arrival.
    Timeout { frac: f64 },
    /// Clockwork-style: eager; a GPU is offered to the candidate whose latest executable
    /// moment is earliest `lookahead` before it becomes free (work is queued ahead on
    /// the GPU), and batch sizes are powers of two.
    Clockwork { lookahead: Dur },
    /// Shepherd's Flex: eager; a free GPU takes the candidate with the largest batch,
    /// and a candidate at least `factor` times the size of a running batch preempts it.
    Shepherd { factor: u32 },
    /// Nexus: epoch squishy bin packing, per-frontend round-robin routing, backends
    /// cycling through their duty cycle with early drop. Runs on [`super::nexus`].
    Nexus,
}

impl Policy {
    pub fn name(&self) -> String {
        match self {
            Policy::Deferred => "deferred".into(),
            Policy::Symphony => "symphony".into(),
            Policy::Eager => "eager".into(),
            Policy::Timeout { frac } => format!("timeout:{frac}"),
            Policy::Clockwork { lookahead } => {
                if *lookahead == Policy::CLOCKWORK_DEFAULT_LOOKAHEAD {
                    "clockwork".into()
                } else {
                    format!("clockwork:{}", lookahead.as_ms_f64())
                }
            }
            Policy::Shepherd { factor } => {
                if *factor == 3 {
                    "shepherd".into()
                } else {
                    format!("shepherd:{factor}")
                }
            }
            Policy::Nexus => "nexus".into(),
        }
    }
    /// Clockwork schedules this far ahead of a GPU's free time by default (its
    /// controller keeps about 10 ms of work queued on each worker).
    pub const CLOCKWORK_DEFAULT_LOOKAHEAD: Dur = Dur(10_000_000);

    /// The batch gathering a policy uses unless a workload sets one: the systems
    /// Clockwork and Shepherd drop lazily; deferred, symphony, eager and timeout use Fermata's
    /// adaptive early drop (Nexus has its own early drop).
    pub fn default_gather(&self) -> Gather {
        match self {
            Policy::Clockwork { .. } | Policy::Shepherd { .. } => Gather::Lazy,
            Policy::Nexus => Gather::EarlyDrop { window: None },
            _ => Gather::Adaptive,
        }
    }

    /// The policies of the paper's Table 2 comparison, in a fixed order.
    pub fn all_baselines() -> Vec<Policy> {
        vec![
            Policy::Deferred,
            Policy::Symphony,
            Policy::Eager,
            Policy::Timeout { frac: 0.2 },
            Policy::Clockwork {
                lookahead: Policy::CLOCKWORK_DEFAULT_LOOKAHEAD,
            },
            Policy::Shepherd { factor: 3 },
            Policy::Nexus,
        ]
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |what: &str| -> Result<f64, String> {
            let a = arg.ok_or_else(|| format!("policy `{name}` needs an argument: {what}"))?;
            a.parse::<f64>()
                .map_err(|_| format!("policy `{name}`: `{a}` is not a number ({what})"))
        };
        let no_arg = |p: Policy| -> Result<Policy, String> {
            match arg {
                None => Ok(p),
                Some(a) => Err(format!("policy `{name}` takes no argument, got `{a}`")),
            }
        };
        match name {
            "deferred" => no_arg(Policy::Deferred),
            "symphony" => no_arg(Policy::Symphony),
            "eager" => no_arg(Policy::Eager),
            "timeout" => {
                let frac = num("timeout as a fraction of the SLO, e.g. timeout:0.2")?;
                if !(0.0..=1.0).contains(&frac) {
                    return Err(format!("timeout fraction must be in [0, 1], got {frac}"));
                }
                Ok(Policy::Timeout { frac })
            }
            "clockwork" => {
                let lookahead = match arg {
                    None => Policy::CLOCKWORK_DEFAULT_LOOKAHEAD,
                    Some(_) => {
                        let ms = num("lookahead in ms")?;
                        if !(0.0..=1000.0).contains(&ms) {
                            return Err(format!("clockwork lookahead must be 0..1000 ms, got {ms}"));
                        }
                        Dur::from_ms_f64(ms)
                    }
                };
                Ok(Policy::Clockwork { lookahead })
            }
            "shepherd" => {
                let factor = match arg {
                    None => 3,
                    Some(_) => {
                        let f = num("preemption factor")?;
                        if !((1.0..=1e6).contains(&f) && f.fract() == 0.0) {
                            return Err(format!("shepherd factor must be an integer >= 1, got {f}"));
                        }
                        f as u32
                    }
                };
                Ok(Policy::Shepherd { factor })
            }
            "nexus" => no_arg(Policy::Nexus),
            _ => Err(format!(
                "unknown policy `{s}` (expected deferred, symphony, eager, timeout:FRAC, clockwork[:MS], shepherd[:K] or nexus)"
            )),
        }
    }
}

/// How a model's batch is gathered from its deadline-ordered queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// Drop the head only when it cannot finish even alone; batch from the head.
    Lazy,
    /// Nexus Section 6.3: slide a window of `window` requests from the head and drop
    /// every request before the first one whose window fits its deadline. `None` uses
    /// the Nexus rule: the largest b with 2 * l(b) <= SLO.
    EarlyDrop { window: Option<u32> },
    /// Load-adaptive early drop (Fermata's rule): the window is the smallest batch
    /// whose throughput sustains the model's measured rate on its share of the GPUs,
    /// b / l(b) >= rate / gpus_share. A request is skipped only when serving it would
    /// force a batch smaller than the load needs and the requests behind it can fill
    /// a window (with a window or fewer queued, dropping the head could not make the
    /// batch larger, so the queue is gathered lazily); at low load this is lazy drop,
    /// in overload it keeps batches at their most efficient size.
    Adaptive,
}

impl fmt::Display for Gather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gather::Lazy => write!(f, "lazy"),
            Gather::EarlyDrop { window: None } => write!(f, "early"),
            Gather::EarlyDrop { window: Some(w) } => write!(f, "early:{w}"),
            Gather::Adaptive => write!(f, "adaptive"),
        }
    }
}

impl FromStr for Gather {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "lazy" => Ok(Gather::Lazy),
            None if s == "early" || s == "window" => Ok(Gather::EarlyDrop { window: None }),
            None if s == "adaptive" => Ok(Gather::Adaptive),
            Some(("early" | "window", w)) => match w.parse::<u32>() {
                Ok(w) if w >= 1 => Ok(Gather::EarlyDrop { window: Some(w) }),
                _ => Err(format!(
                    "early-drop window must be an integer >= 1, got `{w}`"
                )),
            },
            _ => Err(format!(
                "unknown batch gathering `{s}` (expected lazy, early, early:WINDOW or adaptive)"
            )),
        }
    }
}

/// Network delays budgeted by the scheduler (Symphony Appendix D): a batch of `b`
/// needs `ctrl + data_fixed + data_per_req * b` between the plan leaving the
/// scheduler and the batch starting on the GPU (the input pull of the whole
/// batch is `data_fixed + data_per_req * b`, see [`super::pull`]); results need
/// `resp` to get back to the frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetBudget {
    pub ctrl: Dur,
    /// The part of a batch's input pull that does not grow with its size.
    pub data_fixed: Dur,
    /// What each request adds to the batch's input pull.
    pub data_per_req: Dur,
    pub resp: Dur,
    /// The least time a deferred batch keeps between its planned start and its
    /// latest start. Frontrun holds a batch until l(b+1) before its head's
    /// deadline, which leaves l(b+1) - l(b) for timing error; for a model whose
    /// batches cost microseconds more per request, a late wake-up anywhere (a
    /// timer, a thread, the network) would then spoil the batch. 0 in the
    /// simulator, whose timing is exact (workload key `network.slack_us`); the
    /// real-time scheduler sets a floor (`fermata scheduler --slack-us`).
    pub slack: Dur,
    /// What a batch's pull typically holds its GPU's puller, a fixed part and
    /// a part per request ([`super::pull::HOLD_QUANTILE`]). A backend pulls one
    /// batch at a time per GPU, so a GPU's next batch can start no earlier
    /// than this after the one before it starts: where pulls take longer than
    /// batches run, the puller, not the GPU, sets the pace. Zero (the
    /// simulator, which pulls nothing): the GPU alone does.
    pub hold_fixed: Dur,
    pub hold_per_req: Dur,
}

impl NetBudget {
    #[inline]
    pub fn delay(&self, bs: u32) -> Dur {
        Dur(self.ctrl.0 + self.data(bs).0)
    }

    /// The input pull budget of a batch of `bs`.
    #[inline]
    pub fn data(&self, bs: u32) -> Dur {
        Dur(self.data_fixed.0 + self.data_per_req.0 * bs as i64)
    }

    /// What the pull of a batch of `bs` holds its GPU's puller (see
    /// [`NetBudget::hold_fixed`]).
    #[inline]
    pub fn hold(&self, bs: u32) -> Dur {
        Dur(self.hold_fixed.0 + self.hold_per_req.0 * bs as i64)
    }

    /// The pull of a batch of `bs` as its GPU's puller's pace over many
    /// batches: halfway between the hold (a low quantile) and the budget (a
    /// high one), about the mean pull. Zero without a hold (nothing is
    /// pulled, or no backend measured it yet).
    #[inline]
    pub fn pace(&self, bs: u32) -> Dur {
        let hold = self.hold(bs);
        if hold == Dur::ZERO {
            return Dur::ZERO;
        }
        Dur((hold.0 + self.data(bs).0.max(hold.0)) / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_policies() {
        assert_eq!("deferred".parse::<Policy>(), Ok(Policy::Deferred));
        assert_eq!(
            "timeout:0.25".parse::<Policy>(),
            Ok(Policy::Timeout { frac: 0.25 })
        );
        assert_eq!(
            "shepherd".parse::<Policy>(),
            Ok(Policy::Shepherd { factor: 3 })
        );
        assert!("timeout"
            .parse::<Policy>()
            .unwrap_err()
            .contains("argument"));
        assert!("timeout:2".parse::<Policy>().is_err());
        assert!("bogus"
            .parse::<Policy>()
            .unwrap_err()
            .contains("unknown policy"));
        for p in Policy::all_baselines() {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
        }
        assert_eq!("symphony".parse::<Policy>(), Ok(Policy::Symphony));
        assert_eq!(Policy::Symphony.name(), "symphony");
        assert_eq!(
            "early:8".parse::<Gather>(),
            Ok(Gather::EarlyDrop { window: Some(8) })
        );
        assert!("early:0".parse::<Gather>().is_err());
    }
}
